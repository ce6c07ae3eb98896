"""The flags several commands share and parse the same way: --dtype (torch's names or convgen's
short ones, to a DType), --target (a GPU vendor alone takes the present device's arch). The problem flags themselves are the main command line's (cli/__init__.py)."""

from __future__ import annotations

import argparse

import torch

from ..codegen.errors import ConvSpecError
from ..codegen.arch.gpu import GPU_ARCHS, device_default
from ..codegen.ir import DType, dtype_names
from ..codegen.target import Target, parse_target
from ..devices import cuda as cuda_device


def _dtype(text: str) -> DType:
    try:
        return DType.parse(text)
    except ConvSpecError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1]) from None


def add_dtype_flag(group, what: str) -> None:
    """--dtype, as every command takes it: torch's names or convgen's short ones (DType.parse),
    parsed to a DType; f32 by default."""
    group.add_argument("--dtype", type=_dtype, default="f32", metavar="DTYPE",
                       help=f"{what}: {dtype_names()} (torch's names or short ones; default float32)")


def target_flag(text: str) -> Target:
    """--target's Target: a GPU vendor without an arch ('cuda', 'hip') takes the present device's
    arch where torch has a device of that vendor (the arch whose kernels serve it: sm_90a on compute
    capability 9.0), else the vendor's default (sm_90, gfx90a)."""
    target = parse_target(text)
    vendor = text.strip().lower()
    if vendor in ("cuda", "hip") and torch.cuda.is_available():
        device_vendor, arch = cuda_device.arch_of(torch.device("cuda"))
        arch = device_default(arch)   # the arch whose kernels serve the device unless one is chosen
        if device_vendor == vendor and arch in GPU_ARCHS:
            return parse_target(f"{vendor}-{arch}")
    return target
