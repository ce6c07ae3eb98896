"""A WaveNet-like 1-D model after `convgen.convert`, forward and backward beside torch.

    python examples/audio_1d.py [--batch 4] [--samples 4096] [--layers 6] [--channels 32]

The model: a stack of causal dilated convolutions (kernel 2, dilation 1, 2, 4, ...) with gated
activations, residual and skip 1x1 convolutions, conditioned on a coarse feature sequence (think
mel frames, one per HOP samples) that a ConvTranspose1d upsamples to the audio rate. The model
is copied and the copy converted, so both start from the same weights; both run forward and
backward on the same waveform and features. The output shows the relative difference
‖convgen − torch‖ / ‖torch‖ of the output, of both input gradients and (the largest) of the
parameter gradients, and the time of forward and backward: the first convgen call, which runs
the shape-generic kernels (no compiler on its path), then, once the second call has had each
problem's own kernel built in the background (`convgen.wait_builds()`), the median of a few more.
Exits 1 if a result is off by more than float32 tolerance.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
from torch import nn

import convgen

TOLERANCE = 1e-4   # relative, float32
HOP = 4            # audio samples per conditioning frame
FEATURES = 16      # conditioning features per frame


class GatedLayer(nn.Module):
    """One causal dilated conv with a gated activation; returns (residual output, skip output).
    The last layer has no residual conv: only its skip output is used."""

    def __init__(self, channels: int, dilation: int, last: bool = False):
        super().__init__()
        self.dilation = dilation
        self.dilated = nn.Conv1d(channels, 2 * channels, 2, dilation=dilation)
        self.condition = nn.Conv1d(channels, 2 * channels, 1, bias=False)
        self.residual = None if last else nn.Conv1d(channels, channels, 1)
        self.skip = nn.Conv1d(channels, channels, 1)

    def forward(self, x, c):
        past = nn.functional.pad(x, (self.dilation, 0))   # causal: output t sees inputs t and t - dilation
        filter_, gate = (self.dilated(past) + self.condition(c)).chunk(2, dim=1)
        z = torch.tanh(filter_) * torch.sigmoid(gate)
        return (None if self.residual is None else x + self.residual(z)), self.skip(z)


class WaveNetish(nn.Module):
    def __init__(self, channels: int = 32, layers: int = 6):
        super().__init__()
        self.input = nn.Conv1d(1, channels, 1)
        # frames -> samples: output length (frames - 1) * HOP - 2 * (HOP // 2) + 2 * HOP = frames * HOP
        self.upsample = nn.ConvTranspose1d(FEATURES, channels, 2 * HOP, stride=HOP, padding=HOP // 2)
        self.layers = nn.ModuleList(GatedLayer(channels, 2 ** i, last=i == layers - 1) for i in range(layers))
        self.head = nn.Sequential(nn.ReLU(), nn.Conv1d(channels, channels, 1), nn.ReLU(), nn.Conv1d(channels, 1, 1))

    def forward(self, audio, features):
        x, c = self.input(audio), self.upsample(features)
        skips = 0
        for layer in self.layers:
            x, skip = layer(x, c)
            skips = skips + skip
        return self.head(skips)


def forward_backward(model, audio, features, grad_out):
    """(output, input and parameter gradients, forward seconds, backward seconds)."""
    audio, features = audio.detach().requires_grad_(), features.detach().requires_grad_()
    model.zero_grad()
    start = time.perf_counter()
    out = model(audio, features)
    middle = time.perf_counter()
    out.backward(grad_out)
    end = time.perf_counter()
    grads = {"audio": audio.grad, "features": features.grad}
    grads.update((name, p.grad) for name, p in model.named_parameters())
    return out.detach(), grads, middle - start, end - middle


def rel_diff(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-300))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="batch size (default 4)")
    parser.add_argument("--samples", type=int, default=4096, help=f"audio samples, a multiple of {HOP} (default 4096)")
    parser.add_argument("--layers", type=int, default=6, help="dilated layers, dilation 1, 2, 4, ... (default 6)")
    parser.add_argument("--channels", type=int, default=32, help="residual channels (default 32)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs after the first (default 5)")
    args = parser.parse_args()
    if args.samples % HOP:
        parser.error(f"--samples must be a multiple of {HOP}")

    torch.manual_seed(0)
    reference = WaveNetish(args.channels, args.layers)
    model = convgen.convert(copy.deepcopy(reference))
    audio = torch.randn(args.batch, 1, args.samples)
    features = torch.randn(args.batch, FEATURES, args.samples // HOP)
    grad_out = torch.randn(args.batch, 1, args.samples)

    print(f"convgen {convgen.__version__}, torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"{args.layers} dilated layers (dilation 1..{2 ** (args.layers - 1)}), {args.channels} channels, "
          f"batch {args.batch} x {args.samples} samples, {FEATURES} x {args.samples // HOP} features upsampled x{HOP}")

    first = forward_backward(model, audio, features, grad_out)
    counters = convgen.stats()
    print(f"first convgen forward + backward: {(first[2] + first[3]) * 1e3:.0f} ms "
          f"({counters['generic_calls']} calls of the shape-generic kernels, {counters['builds']} kernels built)")
    forward_backward(model, audio, features, grad_out)   # called again, each problem's own kernel builds in the background
    start = time.perf_counter()
    convgen.wait_builds()   # the timings below are the specialised kernels'
    counters = convgen.stats()
    print(f"second call: {counters['background_builds']} specialised kernels built or loaded in the background "
          f"(waited {time.perf_counter() - start:.1f} s more for them)")

    times = {"torch": ([], []), "convgen": ([], [])}
    for _ in range(args.repeat):   # alternate, so both see the same machine load
        for name, m in (("torch", reference), ("convgen", model)):
            *_, fwd_s, bwd_s = forward_backward(m, audio, features, grad_out)
            times[name][0].append(fwd_s)
            times[name][1].append(bwd_s)
    print(f"\n{'median ms':<10} {'torch':>8} {'convgen':>8}")
    for i, pass_name in enumerate(("forward", "backward")):
        print(f"{pass_name:<10} {statistics.median(times['torch'][i]) * 1e3:>8.1f} "
              f"{statistics.median(times['convgen'][i]) * 1e3:>8.1f}")

    out_ref, grads_ref, *_ = forward_backward(reference, audio, features, grad_out)
    out, grads, *_ = forward_backward(model, audio, features, grad_out)
    diffs = {"output": rel_diff(out, out_ref)}
    diffs.update((f"grad of {name}", rel_diff(grads[name], grads_ref[name])) for name in grads)
    params = [name for name in diffs if name.startswith("grad of") and name not in ("grad of audio", "grad of features")]
    worst = max(params, key=diffs.get)
    rows = [(name, diffs[name]) for name in ("output", "grad of audio", "grad of features")]
    rows.append((f"{worst} (the worst of {len(params)} parameters)", diffs[worst]))
    width = max(len(label) for label, _ in rows)
    print("\nrelative difference, convgen against torch")
    for label, d in rows:
        print(f"  {label:<{width}}  {d:.1e}")

    if max(diffs.values()) > TOLERANCE:
        bad = ", ".join(f"{name} {d:.1e}" for name, d in diffs.items() if d > TOLERANCE)
        print(f"FAIL: beyond the tolerance {TOLERANCE:.0e}: {bad}", file=sys.stderr)
        return 1
    print(f"OK: every result within {max(diffs.values()):.1e} of torch's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
