"""Modules: subclasses of torch's conv modules whose forward runs convgen; `convert` swaps them in.

They add no parameters or buffers, so their state_dict is exactly torch's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .api import functional


class _ConvMixin:
    _convgen_fn = None

    def _conv_forward(self, input, weight, bias):
        fn = type(self)._convgen_fn
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return fn(input, weight, bias, self.stride, 0, self.dilation, self.groups)
        return fn(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)


class Conv1d(_ConvMixin, nn.Conv1d):
    _convgen_fn = staticmethod(functional.conv1d)


class Conv2d(_ConvMixin, nn.Conv2d):
    _convgen_fn = staticmethod(functional.conv2d)


class Conv3d(_ConvMixin, nn.Conv3d):
    _convgen_fn = staticmethod(functional.conv3d)


class _ConvTransposeMixin:
    _convgen_fn = None
    _rank = 0

    def forward(self, input, output_size=None):
        if self.padding_mode != "zeros":
            raise ValueError(f"Only 'zeros' padding mode is supported for {type(self).__name__}")
        num_spatial = self._rank
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size,
                                              num_spatial, self.dilation)
        return type(self)._convgen_fn(input, self.weight, self.bias, self.stride, self.padding, output_padding,
                                      self.groups, self.dilation)


class ConvTranspose1d(_ConvTransposeMixin, nn.ConvTranspose1d):
    _convgen_fn = staticmethod(functional.conv_transpose1d)
    _rank = 1


class ConvTranspose2d(_ConvTransposeMixin, nn.ConvTranspose2d):
    _convgen_fn = staticmethod(functional.conv_transpose2d)
    _rank = 2


class ConvTranspose3d(_ConvTransposeMixin, nn.ConvTranspose3d):
    _convgen_fn = staticmethod(functional.conv_transpose3d)
    _rank = 3


SWAPS = {nn.Conv1d: Conv1d, nn.Conv2d: Conv2d, nn.Conv3d: Conv3d, nn.ConvTranspose1d: ConvTranspose1d,
         nn.ConvTranspose2d: ConvTranspose2d, nn.ConvTranspose3d: ConvTranspose3d}


def convert(module: nn.Module) -> nn.Module:
    """Make every torch conv module in `module` (itself included) a convgen one, in place.

    Only the class changes: parameters, buffers, hooks and the state_dict stay as they are.
    Subclasses of torch's modules are left alone, since their forward may do more.
    """
    for m in module.modules():
        swap = SWAPS.get(type(m))
        if swap is not None:
            m.__class__ = swap
    return module
