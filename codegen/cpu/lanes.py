"""Family `lanes`: channels in the vector lanes, pixels broadcast (no lanes wasted on narrow rows).
A candidate for every forward and data gradient (its weight gradient: lanes_wgrad.py), chosen over
blocked, the default, by `over_blocked`; its tiles within rows are in lanes_rows.py.

Tiling: a register tile of NV vectors of channels x PB pixels (`lanes_tile`; on targets that step
tiles in assembly it may take every register); work items of QB pixels, the reduction in chunks of
channels whose weights stay in L1; where the tiles split rows, items of whole rows.
"""

from __future__ import annotations

import dataclasses
import math

from ..ir import Layout
from ..plan import Geometry, KOp, Plan, Tiling
from . import blocked
from .context import KernelContext, build
from .family import Family
from . import lanes_operands as operands
from .lanes_rows import ROW_TILES_MIN_REGISTERS, row_classes, row_split
from .work import ASM_FMA_PER_LOAD, FMA_PER_LOAD, asm_tile_registers, bf16_pairs, vector_lanes, windows_inside

NAME = "lanes"
WHY = ("channels in the vector lanes, pixels broadcast (weight gradient: input values broadcast, no "
       "im2col): no lanes wasted on narrow rows")
TEMPLATES = {KOp.FWD: "cpu/lanes_fwd.cpp.j2", KOp.DGRAD: "cpu/lanes_dgrad.cpp.j2"}

# Lanes tiles (accumulators, weight vectors, a broadcast) leave this many registers free: GCC
# shuffles and spills fuller tiles. (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules",
# LANES_SPARE_REGISTERS)
LANES_SPARE_REGISTERS = 5
# Tiles of 32 registers (forward, data gradient, weight gradient) may take up to this many vectors
# of channels (5 x 5, 6 x 4), but only where that fills more of the lanes than any tile of 4
# vectors: 80 and 160 channels (5 vectors a block) against 4-vector blocks that leave lanes idle;
# where both fill the lanes (96 channels: 3 x 9 or 6 x 4; 240: five blocks of 3) the 4-vector tile
# stays.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", LANES_WIDEST)
LANES_WIDEST = 6
CHUNK_WHOLE_L1_FROM = 48 * 1024   # lanes chunks take the whole L1 from this size (AVX-512: any size)
# 1x1 kernels reading channels last on AVX-512: chunks of up to two L1s of weights and input run. A
# last chunk of a few channels (ShuffleNet's 80 a group as 76 + 4) or several chunks each adding
# their partial sums into the totals cost more than the chunk's lines overflowing into the L2
# (Xeon class, kernel alone, 2 threads: ShuffleNet's grouped 1x1 forward 1.33 -> 1.19 ms, ResNet-18's
# 1x1 stride-2 shortcut 0.50 -> 0.44, ResNet-50's 512 -> 128 data gradient 3.41 -> 2.80; 3x3
# kernels and NCHW measured no gain).
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", CHUNK_L1S_1X1_CL)
CHUNK_L1S_1X1_CL = 2

# --- lanes over blocked (over_blocked), by the two families' tile scores
# lanes is chosen over blocked when blocked's register tile scores below this fraction of lanes'.
# Strided data gradients whose phases all take the same taps follow the scores too.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", LANES_OVER_BLOCKED)
LANES_OVER_BLOCKED = 0.85
# A strided NCHW forward takes lanes from this many input channels (lanes' tile steps in assembly;
# fewer channels, and transposed convolutions' data gradients, stay on blocked's phases).
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", STRIDED_LANES_MIN_IN)
STRIDED_LANES_MIN_IN = 16
# On AVX-512, NCHW, a transposed convolution's data gradient (a strided forward kernel) takes lanes
# from this many input channels (its grad_output's) per rank; 1-D stays on blocked.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", WIDE_TRANSPOSED_LANES_MIN_IN)
WIDE_TRANSPOSED_LANES_MIN_IN = {2: 32, 3: 16}
# On AVX-512 blocked's rows of up to two vectors (32 f32 columns) score as well as any, but from
# this many channels lanes ran faster there.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", WIDE_LANES_MIN_CHANNELS)
WIDE_LANES_MIN_CHANNELS = 128
# With unit strides, rows of up to four vectors take lanes from this many channels on AVX-512, since
# its shape stores whole vectors (vstore_t); not from 32 channels nor on wider rows.
# (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", WIDE_LANES_FOUR_VECTORS_MIN_CHANNELS)
WIDE_LANES_FOUR_VECTORS_MIN_CHANNELS = 64


def lanes_tile(channels: int, lanes: int, registers: int, asm: bool = False,
               pairs: bool = False, capped: bool = False, nv_step: int = 1) -> tuple[int, int, float]:
    """Best (NV, PB, score) for a tile of NV vectors of channels x PB pixels: NV x PB accumulators,
    NV weight vectors and one broadcast in registers, LANES_SPARE_REGISTERS left free. Per tap it
    does NV x PB FMAs for NV aligned loads and PB broadcasts; the score is the fraction of useful
    lanes times that intensity.

    `asm`: the tile steps in assembly (templates/cpu/fma_tile.j2), which holds the smaller side and
    one register for the other, and spills nothing at all 16 registers, so tiles count as FMA-bound
    only from 12 FMAs per 7 loads (ASM_FMA_PER_LOAD).

    `pairs` (bf16 on vdpbf16ps), and any assembly tile with 32 registers (EVEX, `Target.evex_tiles`):
    the intensity is not capped, so the tile with the most products per load wins.

    `capped`: the intensity counts at most 1 (FMA-bound) whatever the tile, for a score to compare
    with blocked's (over_blocked).

    `nv_step`: only NV that are multiples of it (whole-line channel blocks: line_tile).

    With 32 registers (and not `capped`, whose score over_blocked compares with blocked's as before)
    tiles of 5 to LANES_WIDEST vectors are taken where they fill more lanes than the best of at most 4.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes.lanes_tile)"""
    def filled(nv: int) -> float:
        return channels / (math.ceil(channels / (nv * lanes)) * nv * lanes)

    widest = LANES_WIDEST if registers >= 32 and not capped else 4
    best = (1, 1, -1.0)
    for nv in range(nv_step, widest + 1, nv_step):
        if nv > 4 and filled(nv) <= filled(best[0]):
            continue
        for pb in range(1, 15):
            used = asm_tile_registers(nv, pb) if asm else nv * pb + nv + 1 + LANES_SPARE_REGISTERS
            if used > registers:
                continue
            ch_eff = filled(nv)
            intensity = nv * pb / (nv + pb) / (ASM_FMA_PER_LOAD if asm else FMA_PER_LOAD)
            intensity = intensity if (pairs or (asm and registers > 16)) and not capped else min(1.0, intensity)
            score = ch_eff * intensity + 1e-3 * nv * pb * ch_eff   # (ties: the larger tile, not wider waste)
            if score > best[2]:
                best = (nv, pb, score)
    return best


# ---------------------------------------------------------------------------- lanes over blocked

@dataclasses.dataclass(frozen=True)
class _Scores:
    """The two families' tiles for one forward or data gradient, as over_blocked weighs them."""

    channels: int       # in the lanes' vectors (the result's channels per group)
    columns: int        # in blocked's vectors (the data gradient's: of one stride phase)
    lanes: int
    blocked: float      # blocked's tile score
    by_channels: float  # lanes' tile score, capped at FMA-bound as blocked's is
    text: str


# Strided problems into channels last: blocked where its tile scores at least this share of lanes'.
# On the AVX-512 shape, with tile scores within 1% (blocked 1.02, lanes 1.03), lanes measured 1.2-1.9x
# faster (Xeon, f32, kernel alone, ms, blocked / lanes: a transposed 3x3 stride 2's forward 1.29 / 1.07
# and data gradient 1.44 / 0.75; a transposed 4x4 stride 2 to 3 channels' data gradient 1.07 / 0.63).
CL_STRIDED_MARGIN = 0.95
CL_STRIDED_MARGIN_AVX512 = 1.0


def _scores(plan: Plan) -> _Scores:
    g, t = plan.geometry, plan.target
    lanes = vector_lanes(plan)
    if plan.kop is KOp.FWD:
        channels, columns = g.cout_g, g.y_size[2]
    else:
        channels, columns = g.cin_g, math.ceil(g.x_size[2] / g.stride[2])
    *_, blocked_score = blocked.register_tile(channels, columns, lanes, t.vector_registers, wide=plan.kop is KOp.DGRAD)
    # scored FMA-bound at best, as blocked's tile is: an uncapped AVX-512 tile outscored blocked where
    # blocked ran faster (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes.over_blocked: scores)
    *_, by_channels = lanes_tile(channels, lanes, t.vector_registers, asm=t.fma_asm, capped=True)
    return _Scores(channels, columns, lanes, blocked_score, by_channels,
                   f"tile scores blocked {blocked_score:.2f}, lanes {by_channels:.2f}")


def _layout_and_pairs(plan: Plan, s: _Scores) -> tuple[str, str] | None:
    """A channels-last result, or bf16 in pairs on vdpbf16ps: the choice, or None to look further."""
    g = plan.geometry
    written = next(op for op in plan.operands if op.writes)
    margin = CL_STRIDED_MARGIN_AVX512 if plan.target.isa == "avx512" else CL_STRIDED_MARGIN
    if plan.layout_of(written.kind) is Layout.CHANNELS_LAST and s.by_channels >= 0.5 and (
            g.stride == (1, 1, 1) or s.blocked < margin * s.by_channels):
        # channels are the contiguous axis: lanes stores whole vectors where blocked would gather and
        # scatter one element per channel stride; with strides too, unless blocked's tile scores within
        # 5% of lanes' or above (on AVX-512: above) (figures: BENCHMARKS.md, "Figures behind codegen's
        # CPU rules", lanes.over_blocked: channels last; "2026-12-03", lanes.over_blocked on AVX-512)
        return NAME, f"{WHY}; channels-last {written.role} ({s.text})"
    blocked_pairs = (g.cin_g if plan.kop is KOp.FWD else g.cout_g) > 1
    if bf16_pairs(plan) and s.by_channels >= 0.5 and (s.by_channels >= s.blocked or not blocked_pairs):
        # lanes reduces bf16 in pairs on vdpbf16ps, blocked (one channel per group) on f32 FMAs; with
        # blocked in pairs as well, lanes where its tile scores at least blocked's
        # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes.over_blocked: bf16 pairs)
        return NAME, f"{WHY}; bf16 in pairs on vdpbf16ps ({s.text})"
    if bf16_pairs(plan) and s.by_channels >= 0.5:
        # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes.over_blocked: bf16 pairs, blocked)
        return blocked.NAME, (f"{blocked.WHY}; bf16 in pairs on vdpbf16ps in both, blocked's tile scores higher "
                              f"({s.text})")
    return None


def _strided(plan: Plan, s: _Scores, wide: bool) -> tuple[str, str] | None:
    """Strided rows: the choice, or None to look further."""
    g = plan.geometry
    written = next(op for op in plan.operands if op.writes)
    if plan.kop is KOp.DGRAD and g.stride != (1, 1, 1) and s.columns > s.lanes:
        # blocked specialises its tap loop per stride phase at compile time, where lanes tests every
        # tap; phases of one vector or less follow the scores
        # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes.over_blocked: strided data gradients)
        return blocked.NAME, f"{blocked.WHY}; strided data gradient, {s.columns}-wide phases ({s.text})"
    if plan.kop is KOp.FWD and g.stride[2] > 1:
        # lanes broadcasts from every SW-th input column of a padded copy, blocked splits the columns
        # into phases: lanes from STRIDED_LANES_MIN_IN input channels in NCHW, from any in channels last
        # (not where lanes' own tile wastes most of its lanes: few channels a group, as the channels-last
        # rule above asks; figures: BENCHMARKS.md, 2026-12-02 (fourth session), "lanes leaves strided
        # forwards of few channels")
        if not plan.problem.transposed and (plan.layout_of(written.kind) is Layout.CHANNELS_LAST and s.by_channels >= 0.5 or
                                            g.cin_g >= STRIDED_LANES_MIN_IN):
            what = (f"channels-last {written.role}" if plan.layout_of(written.kind) is Layout.CHANNELS_LAST
                    else f"{g.cin_g} input channels")
            return NAME, f"{WHY}; strided rows, {what} ({s.text})"
        # On AVX-512 (NCHW) the data gradients of 2-D and 3-D transposed convolutions take lanes too,
        # from more input channels (WIDE_TRANSPOSED_LANES_MIN_IN).
        transposed_min = WIDE_TRANSPOSED_LANES_MIN_IN.get(plan.problem.rank) if wide else None
        if plan.problem.transposed and transposed_min is not None and g.cin_g >= transposed_min:
            return NAME, (f"{WHY}; strided rows of a transposed convolution's data gradient, "
                          f"{g.cin_g} input channels ({s.text})")
        return blocked.NAME, f"{blocked.WHY}; strided rows ({s.text})"
    return None


def over_blocked(plan: Plan) -> tuple[str, str]:
    """blocked (columns in the lanes) or lanes (channels in the lanes), by their tile scores, for a
    forward or data gradient: the choice and why. A rule of this family, since it says where lanes
    takes over from blocked, the default, and needs lanes' tile score."""
    s = _scores(plan)
    decided = _layout_and_pairs(plan, s)
    if decided:
        return decided
    g = plan.geometry
    written = next(op for op in plan.operands if op.writes)
    # the AVX-512 boundaries (NCHW), measured on the Xeon (f32, 2 threads, kernel alone)
    wide = plan.target.isa == "avx512" and plan.layout_of(written.kind) is not Layout.CHANNELS_LAST
    decided = _strided(plan, s, wide)
    if decided:
        return decided
    if wide and s.columns <= 2 * s.lanes and s.channels >= WIDE_LANES_MIN_CHANNELS:
        return NAME, f"{WHY}; rows of at most two vectors, {s.channels} channels ({s.text})"
    if (wide and g.stride == (1, 1, 1) and s.columns <= 4 * s.lanes
            and s.channels >= WIDE_LANES_FOUR_VECTORS_MIN_CHANNELS):
        return NAME, f"{WHY}; unit strides, rows of at most four vectors, {s.channels} channels ({s.text})"
    if s.blocked < LANES_OVER_BLOCKED * s.by_channels:
        return NAME, f"{WHY}; {s.text}"
    return blocked.NAME, f"{blocked.WHY}; {s.text}"


# ---------------------------------------------------------------------------------- tiling

def _reach(g: Geometry) -> list[int]:
    """Per axis, the input extent of one tap window."""
    return [(k - 1) * d + 1 for k, d in zip(g.kernel, g.dilation)]


def _row_width(g: Geometry, fwd: bool) -> tuple[int, int]:
    """(pixels of a result row, the input columns a result pixel steps): a data gradient's row is
    one stride phase's."""
    return (g.y_size[2], g.stride[2]) if fwd else (math.ceil(g.x_size[2] / g.stride[2]), 1)


def _window(g: Geometry, fwd: bool, q: int) -> int:
    """Pixels that a run of q result pixels reads. Taps of one row (1x1, 1-D): the run reads its
    pixels' reach, in two pieces where it crosses a row's end; counted as two rows it halved the
    chunk (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes._window)."""
    read_w = g.x_size[2] if fwd else g.y_size[2]
    out_w, sw = _row_width(g, fwd)
    reach = _reach(g)
    if q < out_w and reach[0] == reach[1] == 1:
        return min(read_w + 2 * g.pad_lo[2], q * sw + 2 * (reach[2] - 1))
    width = min(read_w + 2 * g.pad_lo[2], q * sw + reach[2]) if q < out_w else read_w + 2 * g.pad_lo[2]
    return reach[0] * (math.ceil(q / out_w) + reach[1]) * width


def _channel_major(plan: Plan) -> tuple[int, bool]:
    """(the weights' bytes per group, whether items walk all pixels of one channel block first).
    Pixel-major (consecutive items take the channel blocks of one run of pixels) while the weights
    fit the L2; a data gradient of several stride phases keeps half the L2 as the bound.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes._channel_major)"""
    g, t = plan.geometry, plan.target
    fwd = plan.kop is KOp.FWD
    weight_bytes = g.cout_g * g.cin_g * math.prod(g.kernel) * plan.problem.dtype.accumulator.itemsize
    phased = not fwd and any(s > 1 for s in g.stride)
    return weight_bytes, weight_bytes > (t.l2_bytes // 2 if phased else t.l2_bytes)


def _pixel_bytes(plan: Plan, channels: int, pairs: bool) -> int:
    """Bytes of one pixel of the operand read (all groups' `channels`; in pairs, a word per pair)."""
    acc_bytes = plan.problem.dtype.accumulator.itemsize
    return plan.geometry.groups * (math.ceil(channels / 2) if pairs else channels) * acc_bytes


def _shortened_run(plan: Plan, pb: int, qb: int, pairs: bool) -> int:
    """Pixels per work item: a channels-last input with a depth window is read channels innermost,
    each chunk touching a line of every pixel the run reads, so runs are shortened until those lines
    take at most half the L1 (not for 2-D windows, which measured no better).
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes._shortened_run)"""
    g, fwd = plan.geometry, plan.kop is KOp.FWD
    if (fwd and _reach(g)[0] > 1 and _pixel_bytes(plan, g.cin_g, pairs) >= 64
            and plan.layout_of("X") is Layout.CHANNELS_LAST):
        while qb > pb and _window(g, fwd, qb) * 64 > plan.target.l1_bytes // 2:
            qb -= pb
    return qb


def _border(g: Geometry, fwd: bool) -> bool:
    """Whether the operand read needs zero padding: the input unless every window lies inside it,
    grad_output unless every tap's row lies inside it."""
    if fwd:
        return not windows_inside(g)
    return any((pl - (k - 1) * d) // s < 0 or (x - 1 + pl) // s > y - 1 for x, y, k, s, pl, d in
               zip(g.x_size, g.y_size, g.kernel, g.stride, g.pad_lo, g.dilation))


def _wide_chunks(plan: Plan) -> bool:
    """Whether the chunks may take CHUNK_L1S_1X1_CL L1s: 1x1 kernels reading channels last on AVX-512."""
    return (plan.target.isa == "avx512" and math.prod(plan.geometry.kernel) == 1
            and plan.layout_of("X" if plan.kop is KOp.FWD else "Y") is Layout.CHANNELS_LAST)


def _chunk(plan: Plan, nv: int, lanes: int, qb: int, pairs: bool) -> int:
    """Reduced channels (pairs) per chunk: the chunk's weights and the part of its input that a run of
    QB pixels reads take at most half the L1 (an L1 of CHUNK_WHOLE_L1_FROM or more, and the AVX-512
    shape: the whole L1, fewer partial sums to add), so every tile of the run finds them there; and at
    most 256 products per partial sum, for accuracy.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", CHUNK_WHOLE_L1_FROM)"""
    g, t = plan.geometry, plan.target
    acc_bytes = plan.problem.dtype.accumulator.itemsize
    taps = math.prod(g.kernel)
    reduced = g.cin_g if plan.kop is KOp.FWD else g.cout_g
    run_bytes = _window(g, plan.kop is KOp.FWD, qb) * acc_bytes
    steps = math.ceil(reduced / 2) if pairs else reduced
    chunk_bytes = t.l1_bytes if t.l1_bytes >= CHUNK_WHOLE_L1_FROM or t.isa == "avx512" else t.l1_bytes // 2
    if _wide_chunks(plan):
        chunk_bytes *= CHUNK_L1S_1X1_CL
    return max(1, min(steps, chunk_bytes // (taps * nv * lanes * acc_bytes + run_bytes),
                      max(1, (128 if pairs else 256) // taps)))


def _copy_per_item(plan: Plan, qb: int, pairs: bool, in_place: tuple[str, ...], channel_major: bool) -> int:
    """The copy size (the L2) from which a channels-last operand read (the input; the stride-1 data
    gradient's grad_output) is copied a work item's padded rows at a time, by its thread, instead of
    whole (0: never). Only copies larger than the L2 gain; pixel-major items; with a depth window,
    where three of an item's windows take at most half the L2 and a pixel at least a line.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes._copy_per_item)"""
    g, t = plan.geometry, plan.target
    fwd = plan.kop is KOp.FWD
    reach = _reach(g)
    # the read buffer's padded rows and columns, and bytes a pixel (input; data gradient: grad_output)
    if fwd:
        rows_cols = [(y - 1) * st + r for y, st, r in zip(g.y_size, g.stride, reach)][1:]
        read_bytes = _pixel_bytes(plan, g.cin_g, pairs)
    else:
        rows_cols = [x + r - 1 for x, r in zip(g.x_size, reach)][1:]
        read_bytes = _pixel_bytes(plan, g.cout_g, pairs)
    window_rows = (reach[0] - 1) * rows_cols[0] + math.ceil(qb / _row_width(g, fwd)[0]) + reach[1]
    windows_fit = ((g.y_size if fwd else g.x_size)[0] == 1 and reach[0] == 1
                   or read_bytes >= 64 and 3 * window_rows * rows_cols[1] * read_bytes <= t.l2_bytes // 2)
    if fwd:
        return t.l2_bytes if (not in_place and not channel_major and windows_fit
                              and plan.layout_of("X") is Layout.CHANNELS_LAST and g.groups * g.cin_g > 1) else 0
    return t.l2_bytes if (not in_place and not channel_major and windows_fit
                          and all(s == 1 for s in g.stride) and plan.layout_of("Y") is Layout.CHANNELS_LAST
                          and g.groups * g.cout_g > 1) else 0








def _reason(plan: Plan, tiling: Tiling, score: float, registers: int, weight_bytes: int, border: bool) -> str:
    """The tiling's reason line."""
    fwd = plan.kop is KOp.FWD
    nv, pb, lanes, split = tiling.nv, tiling.kb, tiling.vector_lanes, tiling.row_split
    in_place, row_window, channel_major = tiling.in_place, tiling.copy_per_item, tiling.channel_major
    what = "output" if fwd else "input"
    copied = (f"zero-padded rows copied per work item by its thread (they stay in its L2) where the copy would "
              f"take {row_window >> 20} MB or more, else copied once, zero-padded" if row_window else
              "copied once, zero-padded")
    if tiling.x_inner:
        copied += (", channels innermost from its channel planes (a pixel's channels together, as a "
                   "channels-last input's)")
    read = ("read in place, its padding never read" if border else "read in place") if in_place else copied
    held = ("whose weights and input run take up to two L1s (1x1, channels last: fewer partial sums to add)"
            if _wide_chunks(plan) else "whose weights stay in L1")
    parts = [
        f"register tile {nv} vectors of {lanes} {what} channels x {pb} pixels "
        f"({nv * pb} of {registers} registers accumulate; {score:.2f} useful); ",
        "bf16 reduced in pairs of channels on vdpbf16ps (two products per f32 lane and step, half the steps of "
        "f32 FMAs; its arithmetic emulated in C where the tile is not stepped in assembly); " if tiling.pairs else "",
        f"tiles within rows of {sum(split)} pixels ({', '.join(map(str, split))}), work items of whole rows, each "
        f"tap stepping only the pixels that read inside {'the input' if fwd else 'grad_output'} (no products of "
        f"its zero padding); " if split else "",
        f"{tiling.cols} pixels per work item, reduced in chunks of {tiling.rb} "
        f"{'channel pairs' if tiling.pairs else 'channels'} {held}, "
        f"{'channel block' if channel_major else 'pixel run'} outermost (the weights, {weight_bytes} B per group, "
        f"{'do not fit' if channel_major else 'fit'} the L2); {'input' if fwd else 'grad_output'} {read}; ",
        # channel planes: V neighbouring pixels stored at once per vector of channels, transposed in
        # registers (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes._reason: channel-plane stores)
        f"{'output' if fwd else 'input-gradient'} channel planes stored {lanes} pixels x {lanes} channels at a "
        f"time, transposed in registers; " if plan.layout_of("Y" if fwd else "X") is Layout.CONTIGUOUS else "",
        f"outputs of {tiling.stream_bytes >> 20} MB or more per call (they cannot stay in the L2) written with "
        f"non-temporal stores (a cached store first reads each line); " if tiling.stream_bytes else "",
        tiling.threads_hint,
    ]
    return "".join(parts)


def result_tile(plan: Plan) -> tuple[int, int, float]:
    """The forward's or data gradient's register tile (NV, PB, score): NV vectors of the result's
    channels x PB pixels, on 32 registers up to LANES_WIDEST vectors."""
    g, t = plan.geometry, plan.target
    pairs = bf16_pairs(plan)
    registers = t.tile_registers if pairs else t.vector_registers
    channels, lanes = (g.cout_g if plan.kop is KOp.FWD else g.cin_g), vector_lanes(plan)
    best = lanes_tile(channels, lanes, registers, asm=t.fma_asm, pairs=pairs)
    step = operands.line_step(plan, lanes)
    if step > 1 and best[0] % step:
        lined = lanes_tile(channels, lanes, registers, asm=t.fma_asm, pairs=pairs, nv_step=step)
        if channels % (lined[0] * lanes) == 0:
            return lined
    return best




def fills_lanes(plan: Plan) -> bool:
    """Whether the forward's or data gradient's tile blocks fill every lane with a channel."""
    nv = result_tile(plan)[0]
    channels = plan.geometry.cout_g if plan.kop is KOp.FWD else plan.geometry.cin_g
    return channels % (nv * vector_lanes(plan)) == 0


def tile(plan: Plan) -> Plan:
    """Forward: NV vectors of output channels x PB output pixels per register tile. Data gradient:
    NV vectors of input channels x PB input-gradient pixels of one stride phase."""
    g, t, p = plan.geometry, plan.target, plan.problem
    lanes = vector_lanes(plan)
    fwd = plan.kop is KOp.FWD
    # bf16 on vdpbf16ps: each step takes a pair of reduced channels (two bf16 in one 32-bit lane),
    # read from copies that interleave them; the EVEX-encoded instruction lets the tile use all 32
    # registers. The other dtypes keep AVX2's 16 here (32 gained nothing in the forward and data
    # gradient; the weight gradient takes them: lanes_wgrad).
    # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes.tile: registers)
    pairs = bf16_pairs(plan)
    registers = t.tile_registers if pairs else t.vector_registers
    nv, pb, score = result_tile(plan)
    weight_bytes, channel_major = _channel_major(plan)
    qb = _shortened_run(plan, pb, pb * 16, pairs)
    border = _border(g, fwd)
    # tiles within rows only where tiles have 32 registers (the AVX2 shape's ran mixed)
    # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", ROW_TILES_MIN_REGISTERS)
    # Tiles across rows read a zero-padded copy; made whole per call from channels last (not a work
    # item's rows at a time, and not where bf16 is copied to f32 anyway), it costs what tiles within
    # rows, which read in place, save (ROW_TILES_COPY_GAIN)
    whole_copy = (p.dtype.accumulator is p.dtype and plan.layout_of("X" if fwd else "Y") is Layout.CHANNELS_LAST
                  and not _copy_per_item(plan, qb, pairs, (), channel_major))
    split = (row_split(g, fwd, nv, pb, whole_copy)
             if border and registers >= ROW_TILES_MIN_REGISTERS and (fwd or all(s == 1 for s in g.stride)) else ())
    if split:   # work items of whole rows, as many as nearest the pixels of an item across rows
        pb = max(split)
        qb = max(1, (qb + sum(split) // 2) // sum(split)) * sum(split)
    cc = _chunk(plan, nv, lanes, qb, pairs)
    # Tiles within rows read no padding: the operand is then read in place too, its copy left out
    # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes.tile: read in place)
    in_place = ("X" if fwd else "Y",) if (not border or split) and (p.dtype.accumulator is p.dtype
                                                                   or operands.pairs_in_place(plan, pairs)) else ()
    x_inner = fwd and not in_place and operands.x_inner(plan)
    tiling = Tiling(vector_lanes=lanes, kb=pb, nv=nv, cols=qb, rb=cc, in_place=in_place, channel_major=channel_major,
                    x_inner=x_inner,
                    pairs=pairs, stream_bytes=operands.stream_bytes(plan, nv * lanes),
                    copy_per_item=_copy_per_item(plan, qb, pairs, in_place, channel_major), row_split=split,
                    threads_hint=f"parallel over (group, {'output' if fwd else 'input'}-channel block, "
                                 f"{'' if fwd else 'stride phase, '}run of pixels)")
    return plan.decide("tiling", _reason(plan, tiling, score, registers, weight_bytes, border), tiling=tiling)


def context(plan: Plan, entry: str) -> KernelContext:
    """The shared context, with lanes' own: its tiles within rows, and all 32 vector registers only
    where its tile needs more than 16 (a tile within 16 keeps the "x" constraint: given all 32, GCC
    moved accumulators between registers from one asm statement to the next).
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes.context)"""
    t = plan.tiling
    evex = plan.target.evex_tiles and asm_tile_registers(t.nv, t.kb) > 16
    return build(plan, entry, evex=evex, row_classes=row_classes(plan))


def rule(plan: Plan, candidates: tuple[str, ...], choice: str, why: str) -> tuple[str, str]:
    """A forward or data gradient: lanes or blocked (the default), by `over_blocked`."""
    return over_blocked(plan) if plan.kop in (KOp.FWD, KOp.DGRAD) else (choice, why)


FAMILY = Family(NAME, WHY, TEMPLATES, tile, context, rule=rule)
