"""Family `pointwise`, its weight gradient: dot products over pixels (1x1 kernels), both operands
copied a chunk at a time. A candidate where pointwise fits (pointwise.fits), chosen over lanes or
gemm by `over`. The forward and data gradient: pointwise.py.

Tiling: a tile of KR grad_output rows x CR input rows of dot products (`dots_tile`); per work item
a block of rows whose vector totals take a quarter of the L2; chunks of pixels whose rows take
another quarter; the reduction in fixed parts where items are few.
"""

from __future__ import annotations

import math

from ..ir import DType, Layout
from ..plan import KOp, Plan, Tiling
from .family import Family
from .pointwise import EXPAND_RATIO, NAME, WHY
from .work import ASM_FMA_PER_LOAD, bf16_pairs, reduction_splits, vector_lanes

TEMPLATES = {KOp.WGRAD: "cpu/pointwise_wgrad.cpp.j2"}

# Pixels per chunk, at most.
DOTS_MAX_CHUNK = 512
# --- pointwise over lanes or gemm (over)
# The dot products stream more operand bytes per FMA than gemm's tile (KR + CR vectors per KR x CR
# FMAs, against gemm's two vectors and MR broadcasts), so they win where the reduction over pixels
# is long and the input channels few (at most this many, and no more than the output channels):
# there gemm and lanes spend their time packing the whole of grad_output into a fresh buffer per
# call. In channels last lanes won.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", DOTS_WGRAD_MAX_IN)
DOTS_WGRAD_MAX_IN = 48
# On AVX512-BF16 hosts (Target.evex_tiles), f32: up to this many input channels, with unit strides
# and at least EXPAND_RATIO times as many output channels.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", DOTS_WGRAD_EVEX_MAX_IN)
DOTS_WGRAD_EVEX_MAX_IN = 64
# bf16 where the target multiplies it on vdpbf16ps (Target.bf16_dot): the chunks copied as they are,
# pairs of pixels per lane and step, twice the products of the f32 path per instruction: wherever an
# image has this many output pixels or more.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", DOTS_WGRAD_PAIRS_MIN_PLANE)
DOTS_WGRAD_PAIRS_MIN_PLANE = 512


def over(plan: Plan, choice: str, why: str) -> tuple[str, str]:
    """pointwise for a 1x1 weight gradient, where it measured faster than `choice`."""
    g = plan.geometry
    if any(plan.layout_of(kind) is Layout.CHANNELS_LAST for kind in ("X", "Y")):
        return choice, why
    wide = (plan.target.evex_tiles and plan.problem.dtype is DType.F32 and g.stride == (1, 1, 1)
            and g.cin_g <= DOTS_WGRAD_EVEX_MAX_IN and g.cout_g >= EXPAND_RATIO * g.cin_g)
    if (g.cin_g <= DOTS_WGRAD_MAX_IN and g.cout_g >= g.cin_g) or wide:
        return NAME, (f"dot products over pixels, a chunk of both operands copied at a time; "
                      f"{g.cin_g} input channels, {g.cout_g} output channels")
    plane = g.y_size[0] * g.y_size[1] * g.y_size[2]
    if plan.problem.dtype is DType.BF16 and plan.target.bf16_dot and plane >= DOTS_WGRAD_PAIRS_MIN_PLANE:
        return NAME, (f"dot products over pixels, bf16 in pairs of pixels on vdpbf16ps; {plane} output "
                      f"pixels per image")
    return choice, why


def dots_tile(rows: int, cols: int, registers: int) -> tuple[int, int, float]:
    """(KR, CR, score) of a tile of dot products: KR grad_output rows x CR input rows accumulate
    in KR * CR registers, the smaller set is held and the other streamed through one more (see
    fma_tile's dots). The score is the fraction of FMAs on real rows (rows are padded to the tile)
    times the FMA-to-load ratio up to ASM_FMA_PER_LOAD; ties go to the larger tile."""
    best = (1, 1, -1.0)
    for kr in range(1, registers):
        for cr in range(1, registers):
            if kr * cr + min(kr, cr) + 1 > registers:
                continue
            useful = rows / (math.ceil(rows / kr) * kr) * cols / (math.ceil(cols / cr) * cr)
            score = useful * min(1.0, kr * cr / (kr + cr) / ASM_FMA_PER_LOAD)
            if (score, kr * cr) > (best[2], best[0] * best[1]):
                best = (kr, cr, score)
    return best


def _equal_blocks(total: int, most: int, multiple: int) -> int:
    """Rows per block (a multiple of `multiple`, at most about `most`) cutting `total` rows into
    blocks of equal size."""
    most = max(multiple, most // multiple * multiple)
    blocks = math.ceil(total / most)
    return math.ceil(math.ceil(total / blocks) / multiple) * multiple


def _item_blocks(rows: int, cols: int, kr: int, cr: int, pairs: int) -> tuple[int, int]:
    """(KC, CC) rows of each operand per work item. Each item reads its rows of both operands over
    all pixels: the block shape that reads the least, rows x (column blocks) + columns x (row
    blocks), among the shapes of at most `pairs` (k, c) totals."""
    best = None
    for cblocks in range(1, math.ceil(cols / cr) + 1):
        cc = math.ceil(math.ceil(cols / cblocks) / cr) * cr
        if cc * kr > pairs:
            continue
        kc = _equal_blocks(rows, pairs // cc, kr)
        cost = rows * math.ceil(cols / cc) + cols * math.ceil(rows / kc)
        if best is None or cost < best[0]:
            best = (cost, kc, cc)
    _, kc, cc = best or (0, kr, cr)
    return kc, cc


def tile(plan: Plan) -> Plan:
    """1x1 weight gradient as dot products over pixels: a KR x CR tile of grad_output rows x input
    rows, per work item KC x CC rows whose vector totals take a quarter of the L2, chunks of PC
    pixels whose rows take another quarter."""
    g, t, p = plan.geometry, plan.target, plan.problem
    lanes = vector_lanes(plan)
    acc_bytes = p.dtype.accumulator.itemsize
    rows, cols = g.cout_g, g.cin_g
    kr, cr, score = dots_tile(rows, cols, t.vector_registers)
    totals = max(kr * cr, (t.l2_bytes // 4) // (lanes * acc_bytes))    # (k, c) totals per item, at most
    kc, cc = _item_blocks(rows, cols, kr, cr, totals)
    # bf16 on vdpbf16ps: each lane takes a pair of pixels per step, the chunks copied as they are
    # (two bf16 to a 32-bit word), so a chunk is a whole number of word vectors
    pairs = bf16_pairs(plan)
    step = 2 * lanes if pairs else lanes
    pc = max(step, min(DOTS_MAX_CHUNK, (t.l2_bytes // 4) // ((kc + cc) * acc_bytes)) // step * step)
    items = g.groups * math.ceil(rows / kc) * math.ceil(cols / cc)
    splits = reduction_splits(items, g.groups * rows * cols * acc_bytes)
    tiling = Tiling(vector_lanes=lanes, kb=kr, nv=cr, ksb=kc, cols=cc, pc=pc, splits=splits, pairs=pairs,
                    threads_hint="parallel over (group, out-channel block, in-channel block, part of the "
                                 "reduction); each item owns its sums and reduces in a fixed order, so results do "
                                 "not depend on the thread count")
    return plan.decide("tiling", f"register tile {kr} grad_output rows x {cr} input rows of {lanes} pixels "
                                 f"({score:.2f} useful); per item {kc} x {cc} rows, {items} items x {splits} parts "
                                 f"of the reduction, both operands copied in chunks of {pc} pixels (a quarter of "
                                 f"the L2); "
                                 + ("bf16 copied as it is and multiplied in pairs of pixels on vdpbf16ps (two "
                                    "products per f32 lane and step, f32 sums); " if pairs else "")
                                 + tiling.threads_hint, tiling=tiling)


def rule(plan: Plan, candidates: tuple[str, ...], choice: str, why: str) -> tuple[str, str]:
    return over(plan, choice, why) if NAME in candidates and plan.kop is KOp.WGRAD else (choice, why)


FAMILY = Family(NAME, WHY, TEMPLATES, tile, rule=rule)
