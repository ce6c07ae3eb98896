"""Pass `algorithm`: which algorithm computes the kernel op (like ATen's backend choice).

GPU targets take their own branch (gpu_algorithms.py); what follows here is the CPU's: the order in
which the CPU kernel families (codegen/cpu/) are asked. Each family holds where it joins the
candidates (its fit test) and its rule for taking over an earlier choice; this module holds the two
sequences, JOINS and RULES, which are the heuristic.

Candidates are listed for every problem so the runtime can tune among them; the heuristic
choice is recorded with its reason.
"""

from __future__ import annotations

import dataclasses
import math

from ..cpu import amx, depthwise, flat, gemm, grouplanes, lanes, planes, pointwise, pointwise_wgrad, reduce
from ..cpu.families import WHY
from ..cpu.layout_cost import internal_layouts
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


# The order in which families join the candidates (after CANDIDATES), and the order in which their
# rules may take over the choice made so far (a later rule sees the earlier one's choice): together,
# the heuristic.
JOINS = (depthwise.FAMILY, planes.FAMILY, pointwise.FAMILY, grouplanes.FAMILY, amx.FAMILY, flat.FAMILY)
RULES = (lanes.FAMILY, pointwise.FAMILY, gemm.FAMILY, pointwise_wgrad.FAMILY, planes.FAMILY, depthwise.FAMILY,
         grouplanes.FAMILY, amx.FAMILY, flat.FAMILY)


def _candidates(plan: Plan) -> tuple[str, ...]:
    """Every family that computes this kernel op, the heuristic's default first."""
    candidates = CANDIDATES[plan.kop]
    for family in JOINS:
        candidates = family.join(plan, candidates)
    return candidates


def _choose(plan: Plan, candidates: tuple[str, ...]) -> tuple[str, str]:
    """The heuristic's choice among `candidates` and why: the default, then each family's rule."""
    choice, why = candidates[0], WHY[candidates[0]]
    for family in RULES:
        choice, why = family.rule(plan, candidates, choice, why)
    return choice, why


def _elsewhere(plan: Plan, algorithm: str) -> bool:
    """Whether `algorithm` is a candidate in another internal layout of the activations, which the
    layout pass may then take (a requested algorithm of a converting plan: the tuner's, a bundle's)."""
    caller = plan.caller_layouts()
    return any(algorithm in _candidates(dataclasses.replace(plan, layouts=tuple(sorted(layouts.items()))))
               for layouts in internal_layouts(plan) if layouts != caller)


def choose_for(plan: Plan) -> tuple[str, str, tuple[str, ...]]:
    """The heuristic's algorithm for `plan` as its operands' layouts say (plan.layout_of), why, and the
    candidates: what the layout pass asks for each internal layout it weighs."""
    candidates = _candidates(plan)
    choice, why = _choose(plan, candidates)
    return choice, why, candidates


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
    if requested is not None and requested not in candidates and not _elsewhere(plan, requested):
        raise ConvgenError(f"algorithm {requested!r} is not a candidate for a {plan.kop.value} "
                           f"kernel; candidates: {list(candidates)}")
    choice, why = _choose(plan, candidates) if requested is None else (requested, "requested")
    return plan.decide("algorithm", f"{_kind(plan)}: {choice} ({why}); candidates {list(candidates)}; every size "
                                    f"a compile-time constant except the batch",
                       algorithm=choice, candidates=candidates)


PASS = Pass("algorithm", run, requires=("canonical",), provides=("algorithm",), doc=__doc__)
