"""GPU tiling (the `tiling` pass's branch for CUDA and HIP targets): threads per block and what
each thread computes, by the plan's kernel family (codegen/gpu/families.py), from the target's
warp size, thread limit and the arch's tile configuration. A function of problem and target only.

- direct: one thread per result element, whole warps per block (codegen/gpu/direct.py).
- igemm: 4 warps (waves) per block, each a quarter of the block's GEMM tile, pipeline stages and
  16-byte copies (codegen/gpu/igemm_tiles.py); the data gradient's stride phases and the weight
  gradient's split-K count are named in the reason (codegen/gpu/igemm.py).
- depthwise, stem: their fixed block, tiles and split in their own words (codegen/gpu/windows.py).
"""

from __future__ import annotations

from ..errors import ConvgenError
from ..gpu.families import BY_NAME
from ..plan import Plan


def run_gpu(plan: Plan) -> Plan:
    """The tiling of `plan` for a CUDA or HIP target, by its algorithm's family."""
    if plan.algorithm == "empty":
        return plan.decide("tiling", "no kernel: nothing to launch", tiling=None)
    family = BY_NAME.get(plan.algorithm)
    if family is None:
        raise ConvgenError(f"tiling: no GPU tiling for algorithm {plan.algorithm!r}; GPU tilings: {sorted(BY_NAME)}")
    tiling, why = family.tiling(plan)
    return plan.decide("tiling", why, tiling=tiling)
