"""The `algorithm` pass's GPU branch: which GPU kernel family computes the plan.

The families (codegen/gpu/families.py) are in order of preference, each with a test of whether it
takes the plan (None: it does; else why not) and why it is chosen. The first that takes the plan is
the default; every one that takes it is a candidate. The direct kernel takes every problem, so it is
always last and always a candidate; igemm takes every dtype: bf16/f16 on the matrix instructions,
on CUDA f32 problems whose `tf32` is set too (torch allows tf32: the runtime sets it from
torch.backends.cudnn.allow_tf32 for GPU targets), f64 on matrix instructions (CUDA's f64 tensor
cores, DMMA; HIP's v_mfma_f64_16x16x4f64), CUDA f32 without tf32 on the vector units (a register
tile of FMAs per thread); before it, depthwise problems (every dtype) and few-channel weight
gradients (stem). A new GPU algorithm is a family module and its place in that list.
"""

from __future__ import annotations

from ..errors import ConvgenError
from ..gpu.families import FAMILIES
from ..plan import KOp, Plan

_WHAT = {KOp.FWD: "forward", KOp.DGRAD: "data gradient", KOp.WGRAD: "weight gradient",
         KOp.BIAS: "bias gradient (per-channel sum)"}


def run_gpu(plan: Plan) -> Plan:
    """The algorithm decision for a plan on a CUDA or HIP target (a non-empty one)."""
    taken = [(family, family.refusal(plan)) for family in FAMILIES]
    candidates = tuple(family.name for family, why_not in taken if why_not is None)
    refused = "; ".join(f"not {family.name}: {why_not}" for family, why_not in taken if why_not is not None)
    family = next(family for family, why_not in taken if why_not is None)
    choice, why = family.name, family.why(plan)
    if plan.requested_algorithm is not None:
        if plan.requested_algorithm not in candidates:
            raise ConvgenError(f"algorithm {plan.requested_algorithm!r} is not a candidate for a {plan.kop.value} "
                               f"kernel on {plan.target.name()}; candidates: {list(candidates)}")
        choice, why = plan.requested_algorithm, "requested"
    warp = plan.target.gpu.warp_size
    return plan.decide("algorithm", f"GPU {_WHAT[plan.kop]} on {plan.target.name()} (warp {warp}): {choice} ({why})"
                                    f"{'; ' + refused if refused else ''}; candidates {list(candidates)}; every size "
                                    f"a compile-time constant except the batch",
                       algorithm=choice, candidates=candidates)
