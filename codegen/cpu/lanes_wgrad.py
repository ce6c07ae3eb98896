"""Family `lanes`, its weight gradient: output channels in the vector lanes, input values broadcast
(no im2col). The weight gradient's default candidate; gemm, pointwise and planes take over by their
own rules (gemm.py, pointwise_wgrad.py, planes.py). The forward and data gradient: lanes.py.

Tiling: a register tile of NV vectors of output channels x PB (input channel, tap) rows, taking all
32 registers where the target allows; work items of RB rows (whole input channels' taps), the
reduction over pixels in chunks of PC and, where items are few, in fixed parts added in order.
"""

from __future__ import annotations

import dataclasses
import math

from ..ir import DType, Layout
from ..plan import Geometry, KOp, Plan, Tiling
from .family import Family
from .lanes import NAME, WHY, context, lanes_tile
from .work import (ASM_FMA_PER_LOAD, FMA_PER_LOAD, asm_tile_registers, bf16_pairs, reduction_splits, vector_lanes,
                   windows_inside)

TEMPLATES = {KOp.WGRAD: "cpu/lanes_wgrad.cpp.j2"}

# Rows (input channel, tap) per work item, at most: larger blocks with larger chunks ran faster.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", WGRAD_ROWS)
WGRAD_ROWS = 144
# With 32 registers: every row block reads the whole reduction's grad_output again, its chunk (half
# the L1) amortized over the block's row tiles, so fewer, larger blocks win (the sums, RB x NV
# vectors, stay in the L2), as long as the parts of the reduction that fewer items then take
# (MIN_ITEMS) keep their partial sums within PARTS_L2_SHARE of the L2: a call allocates them afresh
# and adds them in a last pass. (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules",
# WGRAD_ROWS_EVEX)
WGRAD_ROWS_EVEX = 576
PARTS_L2_SHARE = 0.75
# Tap-aligned tiles (Tiling.tap_rows) where they hold at least this many accumulators.
TAP_ROWS_MIN_ACC = 16
# f32 on AVX-512: a weight gradient whose zmm tile fills at most this share of its lanes takes ymm
# vectors where they fill all of theirs (narrow_lanes: 24 output channels a group).
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_wgrad.narrow_lanes)
NARROW_MAX_FILL = 0.75
NARROW_FILL_LANES = 8
# A tile of fewer rows where the rows' tiles then cost at least this share less (_row_tile).
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_wgrad._row_tile)
ROW_TILE_MIN_SAVING = 0.25
# Chunks are staged per thread for 1-D images of at least this many pixels (see _staged).
STAGE_MIN_PIXELS = 2048
# bf16 pairs from a channels-last grad_output in place (_pairs_tile): vectors of the tile, and the
# registers its step needs besides the accumulators, the pairs and the streamed input value (the
# two pixels' words before they are interleaved).
PAIRS_IN_PLACE_NV = 2
PAIRS_IN_PLACE_TEMPS = 2
# ... only for at most this many rows: the pack's cost, against the tiles', falls with the rows that
# read each packed pixel, and the narrower tile (2 vectors, where lanes_tile takes up to 6) broadcasts
# each input value for fewer channels.
PAIRS_IN_PLACE_MAX_ROWS = 64


def wgrad_row_block(rows: int, taps: int, pb: int, most: int) -> int:
    """Rows per work item of the lanes weight gradient (a multiple of the tile's PB): the fewest
    blocks of at most about `most` rows, of whole input channels (all their taps, so the rows of a
    chunk share their input lines) where a channel's taps fit and the last block is then at least
    3/4 of the others, else of equal shares of the rows. Items run in a static schedule: a short
    last block left one thread a block's work behind (r50_stem's 147 rows as 102 + 45 on two
    threads: 816 rows of work against 384)."""
    unit = taps if taps <= most else pb          # rows per block step: a channel's taps, or a tile
    units = math.ceil(rows / unit)
    blocks = math.ceil(units / max(1, most // unit))
    whole = min(math.ceil(rows / pb) * pb, math.ceil(math.ceil(units / blocks) * unit / pb) * pb)
    if 4 * (rows - (math.ceil(rows / whole) - 1) * whole) >= 3 * whole:
        return whole
    return min(math.ceil(rows / pb) * pb, math.ceil(math.ceil(rows / blocks) / pb) * pb)


def narrow_lanes(plan: Plan) -> int:
    """Lanes of the kernel's vectors: on AVX-512, few output channels per group take narrower
    vectors (ymm or xmm, 32 registers with AVX512-VL): a zmm tile would waste most of its lanes, and
    grad_output is packed a vector of channels per pixel.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_wgrad.narrow_lanes)"""
    lanes = vector_lanes(plan)
    while plan.target.isa == "avx512" and 2 * plan.geometry.cout_g <= lanes and lanes > 4:
        lanes //= 2
    # f32 groups of 24 output channels: two zmm vectors leave a quarter of their lanes idle and
    # grad_output, 24 channels a pixel, is packed 32 wide per call; three ymm vectors fill theirs and
    # read it in place (MobileNetV2's 144 -> 24 projection: 1.63 -> 1.40 ms). 40 channels tied,
    # 56 and 72 ran faster on zmm.
    cout = plan.geometry.cout_g
    fill = cout / (math.ceil(cout / lanes) * lanes)
    if (plan.target.isa == "avx512" and lanes == 16 and plan.problem.dtype is DType.F32
            and cout % NARROW_FILL_LANES == 0 and fill <= NARROW_MAX_FILL):
        lanes = NARROW_FILL_LANES
    return lanes


def _one_dimensional(g: Geometry) -> bool:
    """Whether the problem is one-dimensional: depth and height of one (input, output and kernel)."""
    return g.x_size[:2] == (1, 1) and g.y_size[:2] == (1, 1) and tuple(g.kernel[:2]) == (1, 1)


def _tap_rows(plan: Plan, nv: int, pb: int, pairs: bool) -> bool:
    """Whether tiles are tap-aligned (Tiling.tap_rows): where a tile of the kh x kw taps of one (input
    channel, kd) holds at least TAP_ROWS_MIN_ACC accumulators and fits the registers (windows of more
    than one row, at most half again lanes_tile's rows), each tile reads its rows at compile-time
    offsets from one pointer, where a pointer per row took every spare general register.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", TAP_ROWS_MIN_ACC)"""
    g = plan.geometry
    kk = g.kernel[1] * g.kernel[2]
    return (not pairs and g.kernel[1] > 1 and kk * nv >= TAP_ROWS_MIN_ACC and kk <= pb * 3 // 2
            and asm_tile_registers(nv, kk) <= plan.target.tile_registers)


@dataclasses.dataclass(frozen=True)
class _Blocks:
    """How the rows are cut into work items, for one tile (NV vectors of `lanes`)."""

    plan: Plan
    lanes: int
    nv: int
    pairs: bool
    in_place: tuple[str, ...]

    @property
    def taps(self) -> int:
        return math.prod(self.plan.geometry.kernel)

    @property
    def rows(self) -> int:
        return self.plan.geometry.cin_g * self.taps

    @property
    def partial_bytes(self) -> int:
        g = self.plan.geometry
        return g.groups * g.cout_g * self.rows * self.plan.problem.dtype.accumulator.itemsize

    def per_item(self, rb: int) -> int:
        """The copy size (the L2) from which a channels-last input is turned into planes by each item's
        thread, its channels one image at a time, through register transposes (0: never): only where
        every item takes whole vectors of channels (all their taps), and an item then takes every
        block of output channels, so each channel and image is turned once. Half the L2, not a quarter.
        (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_wgrad._Blocks.per_item)"""
        g, t, lanes, taps = self.plan.geometry, self.plan.target, self.lanes, self.taps
        return (t.l2_bytes if "X" not in self.in_place and not self.pairs
                and self.plan.layout_of("X") is Layout.CHANNELS_LAST
                and g.groups * g.cin_g > 1 and rb % taps == 0 and (rb // taps) % lanes == 0
                and g.cin_g % lanes == 0 else 0)

    def items(self, rb: int) -> int:
        """Work items for blocks of rb rows (with per-item planes, each item takes every block of
        output channels)."""
        g = self.plan.geometry
        blocks = 1 if self.per_item(rb) else math.ceil(g.cout_g / (self.nv * self.lanes))
        return g.groups * blocks * math.ceil(self.rows / rb)

    def rows_for(self, pb: int) -> int:
        """Rows per item for tiles of pb rows: WGRAD_ROWS, or WGRAD_ROWS_EVEX with 32 registers where
        the parts of the reduction that fewer items then take keep their partial sums within
        PARTS_L2_SHARE of the L2."""
        t = self.plan.target
        rb = wgrad_row_block(self.rows, self.taps, pb, WGRAD_ROWS)
        if t.evex_tiles:
            big = wgrad_row_block(self.rows, self.taps, pb, WGRAD_ROWS_EVEX)
            parts = reduction_splits(self.items(big), self.partial_bytes)
            if parts * self.partial_bytes <= PARTS_L2_SHARE * t.l2_bytes:
                rb = big
        return rb


def _gy_in_place(plan: Plan, nv: int, lanes: int, rb: int, rows: int, pairs: bool) -> bool:
    """Whether a channels-last grad_output is read in place (GY_IN_PLACE in lanes_wgrad.cpp.j2): where
    each pixel's channel block is already one run and either the pixels hold one block (their lines
    then fill every L1 set) or an item's rows are all the rows (grad_output read once per channel
    block: the pack would cost more than the reads it saves). Blocks a power-of-two stride apart fill
    a fraction of the L1's sets, which the chunk's lines, read again for every row tile, overflow.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_wgrad._gy_in_place)"""
    g, p = plan.geometry, plan.problem
    return (p.dtype.accumulator is p.dtype and not pairs and plan.layout_of("Y") is Layout.CHANNELS_LAST
            and g.cout_g % (nv * lanes) == 0 and (g.groups * g.cout_g == nv * lanes or rb >= rows))


def _row_tile(nv: int, pb: int, rows: int, asm: bool) -> int:
    """PB for a group's `rows` rows, at most lanes_tile's `pb`: a tile's rows past the group's end
    repeat its last row, computed in vain (the 3 rows of a 1x1 weight gradient from an RGB image
    took a tile of 14, 11 in vain). A tile's step costs its NV x PB FMAs or its NV + PB loads (at
    ASM_FMA_PER_LOAD, or FMA_PER_LOAD, FMAs each), whichever is more: the PB whose tiles of all the
    rows cost least, where they cost ROW_TILE_MIN_SAVING less than lanes_tile's.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_wgrad._row_tile)"""
    per_load = ASM_FMA_PER_LOAD if asm else FMA_PER_LOAD

    def cost(b: int) -> float:
        return math.ceil(rows / b) * max(nv * b, (nv + b) * per_load)

    best = min(range(1, pb + 1), key=lambda b: (cost(b), -b))
    return best if cost(best) <= (1 - ROW_TILE_MIN_SAVING) * cost(pb) else pb


def _pairs_tile(plan: Plan, lanes: int, rows: int) -> tuple[int, int] | None:
    """The tile (NV, PB) of bf16 pairs that read a channels-last grad_output in place (GY_PAIRS in
    lanes_wgrad.cpp.j2), or None where it is packed: each step loads a block of 2 x lanes channels at
    its two pixels where they lie and interleaves them in registers, the block's even channels in one
    vector and its odd ones in the next (NV = 2; groups of whole blocks of lanes take NV = 1, a
    vector's channels at the two pixels shuffled into pairs in order), where the pack wrote a
    pixel-pair-major copy as large as grad_output and the tiles read it back. Rows of an even width (a
    step's pixels never cross a row), at most PAIRS_IN_PLACE_MAX_ROWS rows; PB of the fewest rows
    computed in vain (rows past the group's end repeat its last), then the most. The caller checks
    that an item takes every row (grad_output then read once per block, as the pack reads it).
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_wgrad._pairs_tile)"""
    g = plan.geometry
    nv = PAIRS_IN_PLACE_NV if g.cout_g % (PAIRS_IN_PLACE_NV * lanes) == 0 else 1
    if not (bf16_pairs(plan) and plan.layout_of("Y") is Layout.CHANNELS_LAST and g.y_size[-1] % 2 == 0
            and g.cout_g % (nv * lanes) == 0 and rows <= PAIRS_IN_PLACE_MAX_ROWS):
        return None
    most = (plan.target.tile_registers - nv - 1 - PAIRS_IN_PLACE_TEMPS) // nv
    if most < nv:
        return None
    pb = min(range(nv, most + 1), key=lambda b: (math.ceil(rows / b) * b, -b))
    return nv, pb


def _staged(plan: Plan, pairs: bool, per_item: int, gy_in_place: bool) -> bool:
    """Whether each chunk stages its zero-padded input window and its grad_output, pixel-major, in its
    thread's buffers, instead of a whole padded copy and pack per call (each read and wrote its
    operand in memory before the tiles read it back): 1-D problems (1x1 ones flattened to one too)
    with contiguous operands and images of STAGE_MIN_PIXELS or more.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", STAGE_MIN_PIXELS)"""
    g = plan.geometry
    return (not pairs and not per_item and not gy_in_place and _one_dimensional(g)
            and math.prod(g.y_size) >= STAGE_MIN_PIXELS
            and plan.layout_of("X") is Layout.CONTIGUOUS and plan.layout_of("Y") is Layout.CONTIGUOUS)


def _reason(plan: Plan, tiling: Tiling, score: float, rows: int, items: int) -> str:
    t, lanes, pb, nv = plan.target, tiling.vector_lanes, tiling.kb, tiling.nv
    acc_bytes = plan.problem.dtype.accumulator.itemsize
    pairs, per_item, in_place = tiling.pairs, tiling.copy_per_item, tiling.in_place
    gy_text = (("read in place (channels last, whole blocks of twice the lanes' channels), a step's two pixels "
                "interleaved in registers (each block's even channels in one vector, its odd ones in the next)"
                if nv % 2 == 0 else
                "read in place (channels last, whole vectors of channels), a step's two pixels shuffled into "
                "pairs in registers")
               + (", the bias sums from the tiles (a row of ones in each part's first row tile)"
                  if plan.bias_from == "Y" else "")
               if "Y" in in_place and pairs else
               "read in place (channels last, whole channel blocks)" if "Y" in in_place else
               "staged pixel-major per chunk in its thread's buffers" if tiling.stage else
               "packed pixel-major once per call")
    x_text = ("staged per chunk: its window of the item's channels, zero-padded" if tiling.stage else
              "read in place" if "X" in in_place else
              f"turned into zero-padded planes per work item, its channels an image at a time, by its thread where "
              f"the whole copy would take {per_item >> 20} MB or more and an image of them fits half the L2 (each "
              f"item then takes every block of output channels), else copied once" if per_item else
              "copied once, zero-padded")
    registers = asm_tile_registers(nv, pb)
    evex = (f", {registers} of 32 registers" + ("" if t.isa == "avx512" and lanes == t.vector_bytes // acc_bytes
                                                  else ": AVX512-VL's EVEX encoding reaches ymm16-31 / xmm16-31")
            if t.evex_tiles and registers > 16 else "")
    taps = ("; each tile the kh x kw taps of one input channel, at fixed offsets from one pointer"
            if tiling.tap_rows else "")
    return (f"register tile {nv} vectors of {lanes} output channels x {pb} (input channel, tap) rows ({score:.2f} "
            f"useful{evex}{taps}); {tiling.rb} of the {rows} rows per work item, {items} items x {tiling.splits} "
            f"parts of the reduction, chunks of {tiling.pc} {'pairs of pixels' if pairs else 'pixels'}; grad_output "
            f"{gy_text}; input {x_text}; "
            + ("bf16 reduced in pairs of horizontally adjacent pixels on vdpbf16ps (odd rows end with a virtual "
               "pixel of zero gradient; the input copy holds each value with its neighbour a stride along); "
               if pairs else "")
            + tiling.threads_hint)


def tile(plan: Plan) -> Plan:
    """Weight gradient with NV vectors of output channels x PB (input channel, tap) rows per tile."""
    g, t, p = plan.geometry, plan.target, plan.problem
    lanes = narrow_lanes(plan)
    pairs = bf16_pairs(plan)    # (see lanes.tile: pairs, and 32 registers for their tile)
    # every dtype's assembly tile takes all 32 registers where it may (Target.evex_tiles)
    # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_wgrad.tile: registers)
    # (with 32 registers, tiles of 5 or 6 vectors where they fill more lanes: LANES_WIDEST)
    nv, pb, score = lanes_tile(g.cout_g, lanes, t.tile_registers, asm=t.fma_asm, pairs=pairs)
    rows = g.cin_g * math.prod(g.kernel)   # (input channel, tap) rows of a group (_Blocks.rows)
    pb = _row_tile(nv, pb, rows, t.fma_asm)
    in_place = ("X",) if windows_inside(g) and p.dtype.accumulator is p.dtype else ()
    paired = _pairs_tile(plan, lanes, rows) if pairs else None
    if paired:
        if _Blocks(plan, lanes, paired[0], pairs, in_place).rows_for(paired[1]) >= rows:
            nv, pb = paired   # (every lane useful: whole blocks)
            score = nv * pb / (nv + pb) / (ASM_FMA_PER_LOAD if t.fma_asm else FMA_PER_LOAD)
        else:
            paired = None
    tap_rows = _tap_rows(plan, nv, pb, pairs)
    # A chunk's packed grad_output (PC pixels x NV vectors) takes half the L1; an item's rows are
    # whole input channels' taps, about WGRAD_ROWS of them, so the rows of a chunk share their
    # input lines.
    pc = max(lanes, (t.l1_bytes // 2) // (nv * lanes * p.dtype.accumulator.itemsize))
    # chunks of the reduction in one image (with pairs, a step takes two pixels)
    chunks = max(1, math.prod(g.y_size) // (2 if pairs else 1) // pc)
    blocks = _Blocks(plan, lanes, nv, pairs, in_place)
    kk = g.kernel[1] * g.kernel[2]
    rb = blocks.rows_for(kk if tap_rows else pb)
    if tap_rows and rb % blocks.taps == 0:   # every item's rows whole channels: every tile one channel's kh x kw taps
        pb = kk
    else:
        tap_rows = False
        rb = blocks.rows_for(pb)
    per_item, items = blocks.per_item(rb), blocks.items(rb)
    splits = reduction_splits(items, blocks.partial_bytes, chunks)
    gy_in_place = bool(paired) or _gy_in_place(plan, nv, lanes, rb, blocks.rows, pairs)
    in_place += ("Y",) if gy_in_place else ()
    stage = _staged(plan, pairs, per_item, gy_in_place)
    assert not (tap_rows and stage), "tap-aligned tiles have windows of several rows; staged chunks one"
    tiling = Tiling(vector_lanes=lanes, kb=pb, nv=nv, rb=rb, pc=pc, splits=splits, in_place=in_place, pairs=pairs,
                    copy_per_item=per_item, stage=stage, tap_rows=tap_rows,
                    threads_hint="parallel over (group, out-channel block, row block, part of the reduction); "
                                 "each item owns its weight gradients and reduces in a fixed order, so results "
                                 "do not depend on the thread count")
    return plan.decide("tiling", _reason(plan, tiling, score, blocks.rows, items), tiling=tiling)


FAMILY = Family(NAME, WHY, TEMPLATES, tile, context)
