"""Family `planes`: the weight gradient of groups of more than one input channel, over zero-padded
planes of one row pitch (plane_layout, shared with depthwise.py): each (output channel, input
channel, tap) a flat dot product over pixels in the vector lanes. A candidate where it fits; chosen
over lanes by `over` where a group's output channels would fill less than a vector.

Tiling: a register tile of a group's KR output channels x TB (input channel, tap) rows
(`planes_wgrad_tile`); chunks of pixels within PLANES_CHUNK_L1_SHARE of the L1; work items of
blocks of output channels, the batch in fixed parts where they are few.
"""

from __future__ import annotations

import math

from ..ir import Layout
from ..plan import Geometry, KOp, Plan, Tiling
from .depthwise import PLANES_MAX_TAPS_PER_PASS, plane_layout
from .family import Family
from .work import SPARE_REGISTERS, reduction_splits, vector_lanes

NAME = "planes"
WHY = ("weight gradient over zero-padded planes of one row pitch: each (output channel, input channel, tap) "
       "a flat dot product over pixels in the vector lanes, a register tile of a group's output channels x "
       "(input channel, tap) rows")
TEMPLATES = {KOp.WGRAD: "cpu/planes_wgrad.cpp.j2"}

# Over lanes (whose vectors hold a group's output channels, a vector narrower than the target's where
# there are fewer) for fewer output channels per group than a vector of the target's, in NCHW. Images
# of fewer than PLANES_WGRAD_MIN_PIXELS output pixels stay with lanes (the per-image copies and sums
# are not amortized), as do buffers of more than PLANES_WGRAD_MAX_L2S L2s.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", PLANES_WGRAD_MIN_PIXELS)
PLANES_WGRAD_MIN_PIXELS = 64
PLANES_WGRAD_MAX_L2S = 4
# Chunks of the planes whose part of the buffers (grad_output and input planes) fits this share of the L1.
PLANES_CHUNK_L1_SHARE = 0.5


def fits(plan: Plan) -> bool:
    """The planes weight gradient: groups of more than one input channel (one is the depthwise
    kernel's, which takes the same planes at unit strides where they pay)."""
    g = plan.geometry
    return plan.kop is KOp.WGRAD and g.groups > 1 and g.cin_g > 1


def over(plan: Plan, choice: str, why: str) -> tuple[str, str]:
    """planes for a weight gradient of few output channels per group, where it measured faster than `choice`."""
    g, t = plan.geometry, plan.target
    acc = plan.problem.dtype.accumulator.itemsize
    lanes = t.vector_bytes // acc
    pixels = g.y_size[0] * g.y_size[1] * g.y_size[2]
    if any(plan.layout_of(kind) is not Layout.CONTIGUOUS for kind in ("X", "Y")):
        return choice, why
    if g.cout_g >= lanes or pixels < PLANES_WGRAD_MIN_PIXELS:
        return choice, why
    kr, _ = planes_wgrad_tile(g.cout_g, g.cin_g * g.kernel[0] * g.kernel[1] * g.kernel[2], t.vector_registers)
    if planes_wgrad_bytes(g, kr, lanes, acc) > PLANES_WGRAD_MAX_L2S * t.l2_bytes:
        return choice, why
    return NAME, (f"{g.cout_g} output channels per group fill less than a vector of {lanes} (lanes' tile), "
                  f"while over planes the pixels fill every lane")


def planes_wgrad_tile(cout_g: int, rows: int, registers: int) -> tuple[int, int]:
    """(KR, TB) of the planes weight gradient: KR output channels x TB (input channel, tap) rows.

    Each tile step loads KR grad_output vectors and TB input vectors for KR x TB FMAs, which with
    the KR vectors and one input vector must fit the registers (SPARE_REGISTERS left free); TB is
    at most the template's unroll of its row loop (PLANES_MAX_TAPS_PER_PASS). Over a group's
    cout_g x rows sums, per vector of pixels, the loads are ceil(cout_g / KR) x (passes x KR +
    rows): the fewest wins (the larger KR on a tie), TB then evened out over the passes.
    """
    best = None
    for kr in range(1, min(cout_g, 8) + 1):
        tb = min(rows, (registers - SPARE_REGISTERS - 1 - kr) // kr, PLANES_MAX_TAPS_PER_PASS)
        if tb < 1:
            break
        passes = math.ceil(rows / tb)
        loads = math.ceil(cout_g / kr) * (passes * kr + rows)
        if best is None or loads <= best[0]:
            best = (loads, kr, math.ceil(rows / passes))
    return best[1], best[2]


def planes_wgrad_chunk(g: Geometry, kr: int, lanes: int, acc_bytes: int, l1_bytes: int) -> int:
    """Pixels per chunk (a multiple of `lanes`) of the planes weight gradient: the chunk's kr
    grad_output runs and the input runs of the (at most) two channels whose rows one tile reads
    (each run with the taps' reach) within PLANES_CHUNK_L1_SHARE of the L1; at least one vector.
    (The chunk's tiles walk the channels in order, so the input runs reused are those.)"""
    _, _, reach = plane_layout(g, lanes)
    values = PLANES_CHUNK_L1_SHARE * l1_bytes / acc_bytes
    runs = min(g.cin_g, 2) * g.stride[0] * g.stride[1] * g.stride[2]   # (each of the channels' stride phases)
    vectors = int((values - runs * reach) / ((kr + runs) * lanes))
    return max(1, vectors) * lanes


def planes_wgrad_bytes(g: Geometry, kr: int, lanes: int, acc_bytes: int) -> int:
    """Bytes of a thread's plane buffers in the planes weight gradient (kr grad_output planes, cin_g
    input planes of as many phases as the strides make), as planes_wgrad.cpp.j2 sizes them (each
    plane a whole number of lines, odd)."""
    nvec, x_plane, _ = plane_layout(g, lanes)
    line = 64 // acc_bytes

    def lines(values: int) -> int:
        return (-(-values // line) | 1) * line

    phases = g.stride[0] * g.stride[1] * g.stride[2]
    return (kr * lines(nvec * lanes) + g.cin_g * phases * lines(x_plane)) * acc_bytes


def tile(plan: Plan) -> Plan:
    """The planes weight gradient's tiling."""
    g, p, t = plan.geometry, plan.problem, plan.target
    lanes = vector_lanes(plan)
    why = f"{g.cout_g} output channels per group"
    taps = g.kernel[0] * g.kernel[1] * g.kernel[2]
    kr, tb = planes_wgrad_tile(g.cout_g, g.cin_g * taps, t.vector_registers)
    pc = planes_wgrad_chunk(g, kr, lanes, p.dtype.accumulator.itemsize, t.l1_bytes)
    rows = g.cin_g * taps
    blocks = g.groups * math.ceil(g.cout_g / kr)
    splits = reduction_splits(blocks, blocks * (kr * rows + kr) * 8)
    parts = f" x {splits} fixed parts of the batch (their sums added in order)" if splits > 1 else ""
    tiling = Tiling(vector_lanes=lanes, kb=tb, nv=kr, pc=pc, planes=True, splits=splits,
                    threads_hint=f"parallel over {blocks} blocks of output channels (a group's {kr} or fewer)"
                                 f"{parts}; each item owns its channels' taps and reduces in a fixed order, so "
                                 f"results do not depend on the thread count")
    strided = g.stride != (1, 1, 1)
    phases = (f" (each split into its {g.stride[0] * g.stride[1] * g.stride[2]} stride phases, each tap "
              f"reading one)") if strided else ""
    return plan.decide("tiling", f"{why}: per image, the input planes{phases} and grad_output planes copied "
                                 f"into zero-padded buffers of one row pitch, each (output channel, input channel, "
                                 f"tap) a flat dot product of vectors of {lanes}; register tile of {kr} output "
                                 f"channels x {tb} of {rows} (input channel, tap) rows; chunks of {pc} pixels "
                                 f"(within {PLANES_CHUNK_L1_SHARE:.0%} of the L1); {tiling.threads_hint}",
                       tiling=tiling)


def join(plan: Plan, candidates: tuple[str, ...]) -> tuple[str, ...]:
    return candidates + (NAME,) if fits(plan) else candidates


def rule(plan: Plan, candidates: tuple[str, ...], choice: str, why: str) -> tuple[str, str]:
    return over(plan, choice, why) if NAME in candidates else (choice, why)


FAMILY = Family(NAME, WHY, TEMPLATES, tile, join=join, rule=rule)
