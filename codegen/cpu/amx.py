"""Family `amx`: AMX tiles (bf16 products, f32 sums) on targets with AMX-BF16, for the forward, data
gradient (a forward of grad_output per stride phase) and weight gradient of any sizes (channels
are zero-padded to the tiles). Where it fits it is a candidate; it is the default from
AMX_MIN_CHANNELS channels per group on both sides.

Tiling: 2 x 2 accumulator tiles per step; the forward's work items are two 16-pixel tiles, the
weight gradient walks its reduction in blocks of grid positions sized for the L1 and L2.
"""

from __future__ import annotations

import math

from ..ir import DType, Layout
from ..plan import KOp, Plan, Tiling
from .family import Family

NAME = "amx"
WHY = ("AMX tiles (bf16 products, f32 sums), 2 x 2 accumulator tiles per step: forward and data gradient (per "
       "stride phase) 16 pixels x 32 channels of a zero-padded channels-last copy by 32 x 16 weights, weight "
       "gradient 16 input channels x 32 pixels of a planar copy by 32 pixels x 16 output channels")
TEMPLATES = {KOp.FWD: "cpu/amx_fwd.cpp.j2", KOp.DGRAD: "cpu/amx_fwd.cpp.j2", KOp.WGRAD: "cpu/amx_wgrad.cpp.j2"}

# AMX is the default from this many channels per group on both sides (a tile row reduces 32 input
# channels and a tile holds 16 output channels; fewer are zero-padded to them).
AMX_MIN_CHANNELS = 16
# Grid positions per block of the weight gradient's reduction, at least and at most.
AMX_WGRAD_MIN_BLOCK, AMX_WGRAD_MAX_BLOCK = 64, 8192


def fits(plan: Plan) -> bool:
    """Whether an AMX kernel computes this kernel op: a bf16 forward, data gradient (a forward of
    grad_output per stride phase) or weight gradient, on a target with AMX-BF16 tiles (any sizes:
    channels are zero-padded to the tiles)."""
    return (plan.problem.dtype is DType.BF16 and plan.target.amx_bf16 and
            plan.kop in (KOp.FWD, KOp.DGRAD, KOp.WGRAD))


def preferred(plan: Plan) -> bool:
    """Whether AMX is the default where it fits: AMX_MIN_CHANNELS per group on both sides."""
    g = plan.geometry
    return g.cin_g >= AMX_MIN_CHANNELS and g.cout_g >= AMX_MIN_CHANNELS


def _wgrad(plan: Plan) -> Plan:
    """The AMX weight gradient's blocks of the reduction: as many grid positions as keep one work
    item's part of a block (32 input channels' rows, 32 output channels' pairs: 128 bytes a position)
    within about the L1 and a half, so that the next item, which shares its rows (the same tap and
    input channels), reads them there; and every item's part within half the L2. In whole tiles of 32.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", amx._wgrad)"""
    g = plan.geometry
    phases = math.prod(g.stride)
    per_position = 2 * g.groups * (phases * math.ceil(g.cin_g / 16) * 16 + math.ceil(g.cout_g / 16) * 16)
    qb = min(plan.target.l1_bytes * 3 // 2 // 128, plan.target.l2_bytes // 2 // per_position) // 32 * 32
    qb = max(AMX_WGRAD_MIN_BLOCK, min(AMX_WGRAD_MAX_BLOCK, qb))
    return plan.decide("tiling", f"AMX tiles: 2 x 2 accumulator tiles (32 input x 32 output channels at one tap) per "
                                 f"step; the reduction in blocks of {qb} grid positions, each block walked by every "
                                 f"work item",
                       tiling=Tiling(vector_lanes=16, threads_hint="(group, tap, two tiles of input channels, two "
                                                                   "tiles of output channels)", pc=qb))


def _in_place(plan: Plan) -> tuple[str, ...]:
    """The operand the forward (input) or data gradient (grad_output) reads in place: where its
    zero-padded channels-last copy would be the operand itself -- a 1x1 kernel of unit strides without
    padding, the operand channels-last, a group's channels whole tiles of 32. The copy of a large
    operand (a 1x1 data gradient's 256-channel grad_output at 56x56: 12.8 MB read and written) cost
    about as much as the products (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", amx:
    1x1 operands in place)."""
    g = plan.geometry
    kind, channels = ("X", g.cin_g) if plan.kop is KOp.FWD else ("Y", g.cout_g)
    plain = (all(k == 1 for k in g.kernel) and all(s == 1 for s in g.stride) and not any(g.pad_lo) and
             g.x_size == g.y_size)
    return (kind,) if plain and channels % 32 == 0 and plan.layout_of(kind) is Layout.CHANNELS_LAST else ()


def tile(plan: Plan) -> Plan:
    if plan.kop is KOp.WGRAD:
        return _wgrad(plan)
    in_place = _in_place(plan)
    read = ({"X": "the input read in place", "Y": "grad_output read in place"}[in_place[0]] if in_place else
            f"{'the input' if plan.kop is KOp.FWD else 'grad_output'} copied zero-padded, channels last")
    return plan.decide("tiling", f"AMX tiles: 2 x 2 accumulator tiles (32 pixels x 32 output channels) per step; "
                                 f"work items of two 16-pixel tiles, each over every output channel; {read}",
                       tiling=Tiling(vector_lanes=16, threads_hint="(image, group, two tiles of 16 pixels)",
                                     in_place=in_place))


def join(plan: Plan, candidates: tuple[str, ...]) -> tuple[str, ...]:
    return candidates + (NAME,) if fits(plan) else candidates


def rule(plan: Plan, candidates: tuple[str, ...], choice: str, why: str) -> tuple[str, str]:
    return (NAME, WHY) if NAME in candidates and preferred(plan) else (choice, why)


FAMILY = Family(NAME, WHY, TEMPLATES, tile, join=join, rule=rule)
