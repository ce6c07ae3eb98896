"""The `algorithm` pass's GPU branch: which GPU kernel computes the plan, by rules over a table.

RULES lists the GPU algorithms in order of preference, each with a test of whether it takes the
plan (None: it does; else why not) and why it is chosen. The first that takes the plan is the
default; every one that takes it is a candidate. The direct kernel (codegen/gpu_direct.py) takes
every problem, so it is always last and always a candidate; igemm (codegen/gpu_igemm.py) takes
every dtype: bf16/f16 on the matrix instructions, on CUDA f32 problems whose `tf32` is set too (torch
allows tf32: the runtime sets it from torch.backends.cudnn.allow_tf32 for GPU targets), f64 on
matrix instructions (CUDA's f64 tensor cores, DMMA; HIP's v_mfma_f64_16x16x4f64), CUDA f32 without
tf32 on the vector units (a register tile of FMAs per thread); before it, depthwise problems
(every dtype, codegen/gpu_depthwise.py) and few-channel weight gradients (codegen/gpu_stem.py). A new GPU algorithm is a rule here
and an entry in codegen/emit_gpu.py's ALGORITHMS table (its template and context function).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..errors import ConvgenError
from ..plan import KOp, Plan


@dataclasses.dataclass(frozen=True)
class GpuRule:
    algorithm: str
    refuses: Callable[[Plan], str | None]   # why it does not take the plan, or None when it does
    why: str


def _direct_refuses(plan: Plan) -> str | None:
    return None


def _igemm_refuses(plan: Plan) -> str | None:
    from ..gpu_igemm import refusal   # the kernel's own limits, one place

    return refusal(plan.problem, plan.target)


def _refusal_of(context, plan: Plan) -> str | None:
    """A kernel's own ConvSpecError for the plan's problem (the context function checks every limit)."""
    from ..errors import ConvSpecError

    try:
        context(plan.problem, plan.target, "p")
    except ConvSpecError as e:
        return str(e)
    return None


def _depthwise_refuses(plan: Plan) -> str | None:
    from ..gpu_depthwise import depthwise_context

    return _refusal_of(depthwise_context, plan)


def _stem_refuses(plan: Plan) -> str | None:
    from ..gpu_stem import stem_context

    if plan.kop is not KOp.WGRAD:
        return f"a {plan.kop.value} kernel: the stem kernel computes weight gradients (and their fused bias gradient)"
    return _refusal_of(stem_context, plan)


RULES: tuple[GpuRule, ...] = (
    GpuRule("depthwise", _depthwise_refuses,
            "depthwise (groups == channels): a block stages shared-memory windows of its channels' pixels, the "
            "data gradient by stride phases, the weight gradient split over blocks with partials summed in order; "
            "every dtype"),
    GpuRule("stem", _stem_refuses,
            "few-channel weight gradient (at most 4 input channels per group): a thread keeps its (filter, channel, "
            "tap) sums in registers over staged tiles, the batch x pixels reduction split over blocks, partials "
            "summed in order"),
    GpuRule("igemm", _igemm_refuses,
            "an implicit GEMM, 64-128 x 64-128 x 32 block tiles, 4 warps of a quarter each, the accumulators "
            "rounded once; data gradients by stride phases, weight gradients split-K with partials summed in "
            "order (a transposed problem through the normal convolution's equivalent pass)"),
    GpuRule("direct", _direct_refuses,
            "one GPU thread per result element, every sum in double and rounded once: the reference GPU kernel, "
            "any shape, layout and dtype"),
)

TF32_WHY = ("; f32 as tf32 because torch allows it (torch.backends.cudnn.allow_tf32, torch's default for "
            "convolutions): operands rounded to tf32 (10-bit mantissa, cvt.rna: round to nearest, ties away) as "
            "fragments load, mma.sync m16n8k8 .tf32 with f32 accumulation, 4-byte shared elements, k-step 8; "
            "set allow_tf32 False for f32 on the CUDA cores")
MATRIX_WHY = "; {dtype} on the {units} (the target's matrix instruction), f32 accumulation"
F64_MATRIX_WHY = {"cuda": "; f64 on the f64 tensor cores (mma.sync m8n8k4 .f64, DMMA), f64 accumulation",
                  "hip": "; f64 on the matrix cores (v_mfma_f64_16x16x4f64), f64 accumulation"}
FMA_WHY = ("; {dtype} on the {units} (no {dtype} matrix instruction in convgen yet): each thread keeps a tile of "
           "results in registers, fused multiply-adds accumulated in {dtype}")

_WHAT = {KOp.FWD: "forward", KOp.DGRAD: "data gradient", KOp.WGRAD: "weight gradient",
         KOp.BIAS: "bias gradient (per-channel sum)"}


def run_gpu(plan: Plan) -> Plan:
    """The algorithm decision for a plan on a CUDA or HIP target (a non-empty one)."""
    taken = [(rule, rule.refuses(plan)) for rule in RULES]
    candidates = tuple(rule.algorithm for rule, why_not in taken if why_not is None)
    refused = "; ".join(f"not {rule.algorithm}: {why_not}" for rule, why_not in taken if why_not is not None)
    rule = next(rule for rule, why_not in taken if why_not is None)
    choice, why = rule.algorithm, rule.why
    if choice == "igemm":
        from ..gpu_igemm import on_f64_matrix, on_fma

        cuda = plan.target.kind.value == "cuda"
        why += TF32_WHY if plan.problem.tf32 else F64_MATRIX_WHY[plan.target.kind.value] \
            if on_f64_matrix(plan.problem, plan.target) else \
            FMA_WHY.format(dtype=plan.problem.dtype.value, units="CUDA cores" if cuda else "SIMDs") \
            if on_fma(plan.problem, plan.target) else \
            MATRIX_WHY.format(dtype=plan.problem.dtype.value, units="tensor cores" if cuda else "matrix cores")
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
