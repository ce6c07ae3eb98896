"""Pass `tiling`: tile and block sizes from the target description, by target family.

- CPU targets (tiling_cpu.py, with the GEMM-shaped kernels in tiling_gemm.py): register tiles,
  cache blocking and the OpenMP loop's work items.
- GPU targets (tiling_gpu.py): threads per block and what each thread computes.
A function of problem and target only.
"""

from __future__ import annotations

from ..pipeline import Pass
from ..plan import Plan
from ..target import TargetKind
from .tiling_cpu import (lanes_tile, planes_wgrad_bytes, planes_wgrad_tile, register_tile,  # noqa: F401 (algorithm.py
                         run_cpu)                                                    # scores tiles with these)
from .tiling_gpu import run_gpu


def run(plan: Plan) -> Plan:
    return run_cpu(plan) if plan.target.kind is TargetKind.CPU else run_gpu(plan)


PASS = Pass("tiling", run, requires=("layout", "groups"), provides=("tiling",), doc=__doc__)
