"""Pass `algorithm`: which algorithm computes the kernel op (like ATen's backend choice).

GPU targets take their own branch (gpu_algorithms.py); what follows here is the CPU's: the order in
which the CPU kernel families (codegen/cpu/) are asked. Each family holds its fit test and its rules
for taking over an earlier choice; this module holds the sequence, which is the heuristic.

Candidates are listed for every problem so the runtime can tune among them; the heuristic
choice is recorded with its reason.
"""

from __future__ import annotations

import math

from ..cpu import amx, depthwise, gemm, grouplanes, lanes, planes, pointwise, pointwise_wgrad, reduce
from ..cpu.families import WHY
from ..errors import ConvgenError
from ..plan import KOp, Plan
from ..target import TargetKind
from . import Pass
from .gpu_algorithms import run_gpu

# Candidate algorithms per kernel op, the heuristic's default first; families that fit add theirs.
CANDIDATES = {
    KOp.FWD: ("blocked", "lanes", "direct"),
    KOp.DGRAD: ("blocked", "lanes", "direct"),
    KOp.WGRAD: ("lanes", "gemm", "direct"),
}


def _empty_reason(plan: Plan) -> str | None:
    """Why the result is all zeros (or a bias broadcast) with no kernel at all, or None."""
    p, g = plan.problem, plan.geometry
    if p.n == 0:
        return "batch is 0: outputs are empty and weight/bias gradients are zero"
    if plan.kop is KOp.BIAS:
        # the sum runs over grad_output, which ATen gives zero channels when the input has none
        return None if math.prod(p.output_shape) else "grad_output is empty: the bias gradient is zero"
    if g.cin_g == 0 or g.cout_g == 0:
        # ATen: a normal convolution of an input without channels has an output without channels
        # (so its bias gradient is zero), and a transposed one needs input channels; either way
        # every product is empty.
        return "zero channels per group: every result is empty or zero (plus the bias in a forward pass)"
    return None


def _kind(plan: Plan) -> str:
    """What kind of convolution the reason line names."""
    g = plan.geometry
    if g.cin_g == 1 and g.groups > 1:
        return f"depthwise (1 input channel per group, multiplier {g.cout_g})"
    if g.kernel == (1, 1, 1) and g.stride == (1, 1, 1) and g.pad_lo == (0, 0, 0):
        return "pointwise (1x1, a GEMM over channels)"
    return "general"


def _candidates(plan: Plan) -> tuple[str, ...]:
    """Every family that computes this kernel op, the heuristic's default first (amx is added later)."""
    candidates = CANDIDATES[plan.kop]
    if depthwise.wgrad_fits(plan):
        candidates = ((depthwise.NAME,) + candidates if depthwise.wgrad_first(plan)
                      else candidates + (depthwise.NAME,))
    if depthwise.fits(plan):
        candidates = candidates + (depthwise.NAME,)
    if planes.fits(plan):
        candidates = candidates + (planes.NAME,)
    if pointwise.fits(plan):
        candidates = candidates + (pointwise.NAME,)
    if grouplanes.fits(plan):
        candidates = (grouplanes.NAME,) + candidates
    return candidates


def _choose(plan: Plan, candidates: tuple[str, ...]) -> tuple[str, str]:
    """The heuristic's choice among `candidates` and why: the default, then each family's rule for
    taking over, in this order (a later rule sees the earlier one's choice)."""
    choice, why = candidates[0], WHY[candidates[0]]
    if plan.kop in (KOp.FWD, KOp.DGRAD):
        choice, why = lanes.over_blocked(plan)
    if pointwise.NAME in candidates and plan.kop is not KOp.WGRAD:
        choice, why = pointwise.over(plan, choice, why)
    if plan.kop is KOp.WGRAD and choice == lanes.NAME:
        choice, why = gemm.over(plan, choice, why)
    if pointwise.NAME in candidates and plan.kop is KOp.WGRAD:
        choice, why = pointwise_wgrad.over(plan, choice, why)
    if planes.NAME in candidates:
        choice, why = planes.over(plan, choice, why)
    if depthwise.NAME in candidates and plan.kop is not KOp.WGRAD:
        choice, why = depthwise.NAME, depthwise.PLANES_WHY
    if grouplanes.NAME in candidates:
        choice, why = grouplanes.NAME, grouplanes.WHY
    return choice, why


def run(plan: Plan) -> Plan:
    why_empty = _empty_reason(plan)
    if why_empty:
        return plan.decide("algorithm", why_empty, algorithm="empty", candidates=("empty",))
    if plan.target.kind is not TargetKind.CPU:
        return run_gpu(plan)
    if plan.kop is KOp.BIAS:
        return plan.decide("algorithm", reduce.WHY, algorithm=reduce.NAME, candidates=(reduce.NAME,))
    requested = plan.requested_algorithm
    candidates = _candidates(plan)
    choice, why = _choose(plan, candidates) if requested is None else (requested, "requested")
    if amx.fits(plan):
        candidates = candidates + (amx.NAME,)
        if requested is None and amx.preferred(plan):
            choice, why = amx.NAME, amx.WHY
    if requested is not None and requested not in candidates:
        raise ConvgenError(f"algorithm {requested!r} is not a candidate for a {plan.kop.value} "
                           f"kernel; candidates: {list(candidates)}")
    return plan.decide("algorithm", f"{_kind(plan)}: {choice} ({why}); candidates {list(candidates)}; every size "
                                    f"a compile-time constant except the batch",
                       algorithm=choice, candidates=candidates)


PASS = Pass("algorithm", run, requires=("canonical",), provides=("algorithm",), doc=__doc__)
