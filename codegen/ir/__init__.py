"""The problem IR: `ConvProblem` (problem.py), its vocabulary (types.py: Op, DType, Layout) and the
shape and parameter rules every problem passes (rules.py). The names below are the IR's public
face: the runtime and the passes import them from here."""

from .problem import ConvProblem
from .types import DTYPE_NAMES, DType, Layout, Op, dtype_names

__all__ = ["ConvProblem", "DType", "DTYPE_NAMES", "Layout", "Op", "dtype_names"]
