"""Small models for the ahead-of-time tests (tests/aot/test_aot.py), importable by path from a subprocess.

Between them they have what a bundle must cover: conv modules with and without bias, a strided
depthwise conv, a functional convgen call inside forward, transposed convolutions, and 1-D and
3-D convolutions. `step` runs one training step of a converted model and returns its gradients.
"""

from __future__ import annotations

import torch
from torch import nn

import convgen


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8, bias=False)
        self.w = nn.Parameter(torch.randn(8, 8, 3, 3) * 0.2)   # used by a functional call
        self.up = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
        self.audio = nn.Conv1d(4, 6, 5, padding=4, dilation=2)
        self.audio_up = nn.ConvTranspose1d(6, 2, 4, stride=2, padding=1, bias=False)
        self.volume = nn.Conv3d(2, 3, 3, stride=(1, 2, 2), padding=1)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = self.dw(y)
        y = convgen.conv2d(y, self.w, padding="same")
        y = self.up(y)                                         # 4 x 10 x 10
        a = self.audio_up(torch.relu(self.audio(y.flatten(2))))  # 1-D over the 100 pixels
        v = self.volume(a.view(a.shape[0], 2, 2, 10, 10))       # 3-D: 2 x 2 x 10 x 10
        return v


class ChannelsLast(nn.Module):
    """A channels-last model: its gradients reach some convolutions in the other memory format."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False)
        self.c = nn.ConvTranspose2d(8, 4, 2, stride=2)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        return self.c(y).flatten(1).sum(1, keepdim=True) + y.mean()


def channels_last() -> ChannelsLast:
    torch.manual_seed(0)
    return ChannelsLast().to(memory_format=torch.channels_last)


def mixed() -> Mixed:
    torch.manual_seed(0)
    return Mixed()


def example_input(batch: int = 2, channels_last: bool = False) -> torch.Tensor:
    x = torch.randn(batch, 3, 10, 10, generator=torch.Generator().manual_seed(1))
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def step(model: nn.Module, batch: int = 2, channels_last: bool = False) -> dict:
    """Forward and backward of one training step; the output and every parameter's gradient."""
    out = model(example_input(batch, channels_last))
    (out * out).sum().backward()
    return {"out": out.detach(), **{n: p.grad for n, p in model.named_parameters()}}
