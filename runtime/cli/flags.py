"""The flags several commands share and parse the same way: --dtype (torch's names or convgen's
short ones, to a DType). The problem flags themselves are the main command line's (cli/__init__.py)."""

from __future__ import annotations

import argparse

from ..codegen.errors import ConvSpecError
from ..codegen.ir import DType, dtype_names


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
