"""CPU tiling (the `tiling` pass's CPU branch): register and cache blocking from the target description.

- direct: each thread accumulates a block of rows of one plane; the block is as many rows as
  fit in half the L2 cache.
- lanes: a register tile of NV vectors of channels x PB pixels (see lanes_tile; on targets that
  step tiles in assembly it may take every register); the reduction runs in chunks of channels
  whose weights stay in L1.
- pointwise and the gemm weight gradient: see tiling_gemm.py.
- blocked: a register tile of KB channels x NV vectors of columns. The choice scores every
  (KB, NV) that fits the register file by the fraction of lanes and channels doing useful work
  and by the FMA-to-load ratio of the micro-kernel; a work item covers as many columns as keep its
  input buffer within half the L2 cache.
- grouplanes (depthwise or small groups in channels last): a register tile of NB vectors of channels (the groups)
  x PB pixels for the forward and data gradient; the weight gradient cut into MIN_ITEMS fixed
  parts of the output rows.
A function of problem and target only.
"""

from __future__ import annotations

import math

from ..ir import DType, Layout
from ..pipeline import Pass
from ..plan import KOp, Plan, Tiling, asm_tile_registers, row_tile_taps
from ..target import TargetKind


# Work items a parallel loop should offer at least, when the problem allows (a few per thread).
MIN_ITEMS = 16
# The weight-gradient reduction may be cut into at most this many parts, whose partial sums (at
# most PARTIAL_BYTES) are added in a fixed order.
MAX_SPLITS = 8
PARTIAL_BYTES = 16 << 20
# Register tiles leave this many vector registers free (addresses, broadcasts: no spills), and
# count as FMA-bound from this ratio of FMAs to loads on (see register_tile).
SPARE_REGISTERS = 3
FMA_PER_LOAD = 1.4
VECTOR_LOAD_COST = 1.5   # an unaligned vector load, in broadcasts
# Lanes tiles (accumulators, weight vectors, a broadcast) leave this many registers free: on Zen 3
# a 2 x 4 tile ran r50_3x3_64 in 14.0 ms, 2 x 5 in 16.6 and 2 x 6 in 20.3 (GCC shuffles and
# spills the fuller tiles), and 2 x 4 beat 3 x 3 and 1 x 8 by 15-30% on 7-, 33- and 4096-wide rows.
LANES_SPARE_REGISTERS = 5
# FMAs per load from which a tile stepped in assembly counts as FMA-bound (see lanes_tile).
ASM_FMA_PER_LOAD = 12 / 7
# Rows per work item of the blocked kernels, at most: they share one copy of the rows they read
# (the data gradient of a 7x7 stride-2 kernel reaches 3-4 grad_output rows per input row, 8 rows
# copy 7; a 3x3 forward reads 3 input rows per output row, 8 rows copy 10).
BLOCKED_ROWS = 8
# Rows (input channel, tap) per work item of the lanes weight gradient, at most: on Zen 3, 144 rows
# with 256-pixel chunks ran r50_3x3_512 in 16.3 ms against 21.6 with 36 rows and 128-pixel chunks
# (r50_3x3_64 15.9 against 19.0; deeplab_dil2 within noise).
WGRAD_ROWS = 144
# With 32 registers (AVX-512): every row block reads the whole reduction's grad_output again, its
# chunk (half the L1) amortized over the block's row tiles, so fewer, larger blocks win (the sums,
# RB x NV vectors, stay in the L2), as long as the parts of the reduction that fewer items then
# take (MIN_ITEMS) keep their partial sums within PARTS_L2_SHARE of the L2: a call allocates them
# afresh and adds them in a last pass. Xeon, f32, 2 threads, kernel alone, ms, 144 rows / these:
# NCHW r50_stem 7.21 / 5.31 (147 rows: 102 + 45 rows before, one thread with twice the other's
# work), c3d_stem 16.5 / 12.4, c1d_64_k5 3.39 / 2.64, unet3d 10.4 / 9.05, odd_asym 0.36 / 0.30,
# vgg_64_64 32.6 / 28.9, r50_3x3_64 9.19 / 8.58, wavenet_1d 16.0 / 15.3; channels last r50_stem
# 5.31 / 3.93, unet3d 8.08 / 7.02; but in four parts (partial sums of 2-9 MB) channels-last
# dcgan_tconv 2.76 / 4.04 and r50_3x3_256 6.55 / 8.36, which keep 144.
WGRAD_ROWS_EVEX = 576
# Tap-aligned weight-gradient tiles (Tiling.tap_rows) where they hold at least this many accumulators.
TAP_ROWS_MIN_ACC = 16
PARTS_L2_SHARE = 0.75


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
# Pointwise (1x1) GEMM: a register tile of MR channels x this many vectors of pixels, and at most
# this many pixels per work item (the kernel takes fewer when the batch gives too few items).
POINTWISE_VECTORS = 2
POINTWISE_MAX_COLS = 128
# Pixels per chunk of the pointwise weight gradient, at most.
DOTS_MAX_CHUNK = 512
# Grouplanes (depthwise, channels last) register tile: at most this many vectors of channels x
# this many pixels.
GROUPLANES_VECTORS = 2
GROUPLANES_PIXELS = 4


def _direct(plan: Plan, lanes: int) -> Plan:
    g, t = plan.geometry, plan.target
    acc_bytes = plan.problem.dtype.accumulator.itemsize
    if plan.kop is KOp.WGRAD:
        tiling = Tiling(vector_lanes=lanes, threads_hint="parallel over (group, out channel, in channel); each "
                                                         "thread owns its weight gradients, so the reduction order is fixed")
        return plan.decide("tiling", tiling.threads_hint, tiling=tiling)
    size = g.y_size if plan.kop is KOp.FWD else g.x_size
    rows = size[0] * size[1]
    row_bytes = size[2] * acc_bytes
    rows_per_tile = max(1, min(rows, (t.l2_bytes // 2) // max(row_bytes, 1)))
    tiles = math.ceil(rows / rows_per_tile)
    what = "output" if plan.kop is KOp.FWD else "input-gradient"
    tiling = Tiling(vector_lanes=lanes, threads_hint=f"parallel over (batch, channel, {what} row tile)",
                    rows_per_tile=rows_per_tile, row_tiles=tiles)
    return plan.decide("tiling", f"{what} plane of {rows} rows x {size[2]} in tiles of {rows_per_tile} rows "
                                 f"({rows_per_tile * row_bytes} B accumulator, half of the {t.l2_bytes} B L2); "
                                 f"{tiling.threads_hint}", tiling=tiling)


def register_tile(channels: int, columns: int, lanes: int, registers: int,
                  wide: bool = False) -> tuple[int, int, float]:
    """Best (KB, NV, score) for a KB x NV-vector accumulator tile, one broadcast and NV loads in flight.

    Measured on Zen 3 (AVX2, 16 registers; 2 loads and 2 FMAs per cycle): tiles of several
    vectors that leave three registers free run faster than fuller ones, which the compiler spills
    around (5 x 2 beat 6 x 2 and 13 x 1 on wide images; on 7-wide rows 14 x 1 beat 13 x 1 and
    11 x 1), and a tile is FMA-bound only when its FMAs outnumber its loads (KB broadcasts and NV
    unaligned vector loads, which cost more, per tap) by about FMA_PER_LOAD. Tiles of three
    vectors and several channels are left out: 3 x 3 ran 1.5x slower than 5 x 2 on 33-wide rows,
    where both waste as many lanes, and 1.3x slower than 3 x 2 on the stem's data gradient
    (30 against 23 ms; 0.67 against 0.74 ms the other way on odd_asym's). One channel of four
    vectors (depthwise) beat two and three vectors by 10-30%.

    `wide` admits the three-vector tiles, for kernels that keep their totals in memory and only
    the partial sums in registers (the blocked data gradient): there 3 x 3 ran the stem's data
    gradient in 11.5 ms against 15.1 for 3 x 2. It also lets a one-vector tile take more than 16
    channels where 32 registers allow: dcgan_tconv's transposed forward (a data gradient of 64
    channels, 16-wide phases) ran 22 x 1 in 2.23 ms against 16 x 1's 2.87 (Xeon, AVX-512, NCHW, 2
    threads, kernel alone); the forward keeps 16 (26 x 1 ran dcgan_tconv's data gradient, a stride-2
    forward of 128 channels, in 2.43 ms against 2.01).
    """
    best = (1, 1, -1.0)
    for nv in range(1, 5):
        for kb in range(1, (registers if wide else 16) + 1):
            if nv == 3 and kb > 1 and not wide:
                continue
            # a one-vector tile keeps its single vector load in a register: no spare needed
            if kb * nv + nv + 1 > registers - (0 if nv == 1 else SPARE_REGISTERS):
                continue
            col_eff = columns / (math.ceil(columns / (nv * lanes)) * nv * lanes)
            ch_eff = channels / (math.ceil(channels / kb) * kb)
            intensity = min(1.0, kb * nv / (kb + VECTOR_LOAD_COST * nv) / FMA_PER_LOAD)
            score = col_eff * ch_eff * intensity + 1e-3 * kb * nv
            if score > best[2]:
                best = (kb, nv, score)
    return best


def _blocked(plan: Plan, lanes: int) -> Plan:
    """Forward: KB output channels x NV vectors of output columns. Data gradient: KB input channels
    x NV vectors of input-gradient columns of one stride phase. Either way for RB rows per work
    item, which share one copy of the rows they read."""
    g, t = plan.geometry, plan.target
    acc_bytes = plan.problem.dtype.accumulator.itemsize
    # bf16 on vdpbf16ps: the reduced channels (the forward's input channels, the data gradient's
    # output channels) in pairs, one 32-bit word per pair, half the steps. Zen 4, NCHW, 2 threads,
    # kernel alone, ms, f32 FMAs / pairs: rnx_grouped (groups of 4 channels, where lanes' tile is a
    # quarter useful) forward 1.60 / 0.95, data gradient 1.61 / 0.95. Against lanes in pairs (lanes
    # / blocked): r50_stem 3.48 / 3.44, wavenet_1d 8.24 / 7.72, r50_3x3_64 4.64 / 4.91,
    # r50_3x3_128_s2 4.52 / 4.94, deeplab_dil2 11.9 / 22.2, odd_asym 0.134 / 0.164 (the choice
    # between them: algorithm.py).
    pairs = plan.problem.dtype is DType.BF16 and t.bf16_dot and (g.cin_g if plan.kop is KOp.FWD else g.cout_g) > 1
    kw, dw, sw, pw = g.kernel[2], g.dilation[2], g.stride[2], g.pad_lo[2]
    kh, dh, sh = g.kernel[1], g.dilation[1], g.stride[1]
    budget = t.l2_bytes // 2
    if plan.kop is KOp.FWD:
        channels, columns, height = g.cout_g, g.y_size[2], g.y_size[1]
        halo = ((kw - 1) * dw) // sw + 1
        def span_of(r: int) -> int:            # input rows that r consecutive output rows read
            return (r - 1) * sh + (kh - 1) * dh + 1
        per_row = (math.ceil(g.cin_g / 2) if pairs else g.cin_g) * g.kernel[0] * sw * acc_bytes   # buffer bytes per output column and input row
        # the row blocks' buffer within a quarter of the L2: the weights stream through it as well
        # (r50_3x3_128_s2 ran 19.5 ms with 3 rows in half the L2, 17.0 with one row)
        limit = budget // 2
        what = "output"
    else:
        channels, columns, height = g.cin_g, math.ceil(g.x_size[2] / sw), g.x_size[1]
        halo = (sw - 1 + pw) // sw - (pw - (kw - 1) * dw) // sw
        def span_of(r: int) -> int:            # grad_output rows that r consecutive rows reach
            return (r - 1 + (kh - 1) * dh) // sh + 1
        per_row = (math.ceil(g.cout_g / 2) if pairs else g.cout_g) * g.kernel[0] * acc_bytes   # buffer bytes per grad_output column and row
        limit = budget
        what = "input-gradient (per stride phase)"
    # rows per item: as many as keep the buffer within `limit` at full width, up to BLOCKED_ROWS,
    # with at least four row blocks per plane for the threads to share
    full = math.ceil(columns / lanes) * lanes + halo
    rb = max([r for r in range(1, BLOCKED_ROWS + 1)
              if r <= max(1, height // 4) and full * per_row * span_of(r) <= limit] or [1])
    span = span_of(rb)
    per_col = per_row * span                               # buffer bytes per column
    kb, nv, score = register_tile(channels, columns, lanes, t.vector_registers, wide=plan.kop is not KOp.FWD)
    owb = nv * lanes
    fit = max(owb, (budget // max(per_col, 1) - halo) // owb * owb)
    cols = min(math.ceil(columns / owb) * owb, fit)
    tiling = Tiling(vector_lanes=lanes, threads_hint=f"parallel over (batch, group, {what.split()[0]} row"
                                                     f"{' block' if rb > 1 else ''}, column tile)",
                    kb=kb, nv=nv, cols=cols, rows_per_tile=rb, pairs=pairs)
    rows_note = (f"{rb} output rows per work item share one copy of the {span} input rows they read; "
                 if plan.kop is KOp.FWD else
                 f"{rb} input-gradient rows per work item share one copy of the {span} grad_output rows "
                 f"they reach; ")
    pairs_note = (f"bf16 reduced in pairs of {'input' if plan.kop is KOp.FWD else 'output'} channels on vdpbf16ps "
                  f"(two products per f32 lane and step); " if pairs else "")
    return plan.decide("tiling", f"register tile {kb} channels x {nv} vectors of {lanes} {what} columns "
                                 f"({kb * nv} of {t.vector_registers} registers accumulate; {score:.2f} useful); "
                                 f"{pairs_note}{rows_note}{cols} columns per work item so its buffer ({(cols + halo) * per_col} B) "
                                 f"stays within half the L2; {tiling.threads_hint}", tiling=tiling)


def lanes_tile(channels: int, lanes: int, registers: int, asm: bool = False,
               pairs: bool = False, capped: bool = False) -> tuple[int, int, float]:
    """Best (NV, PB, score) for a tile of NV vectors of channels x PB pixels: NV x PB accumulators,
    NV weight vectors and one broadcast in registers, LANES_SPARE_REGISTERS left free. Per tap it
    does NV x PB FMAs for NV aligned loads and PB broadcasts; the score is the fraction of useful
    lanes times that intensity.

    `asm`: the tile steps in assembly (templates/cpu/fma_tile.j2), which holds the smaller side and
    one register for the other, and spills nothing at all 16 registers: there 4 x 3 ran unet3d's
    forward in 13.0-13.5 ms against 2 x 4's 14.4-15.7 and 2 x 6's 15.1 (r50_3x3_64 13.0 against
    14.4 and 14.9; r50_3x3_256 12.4 against 14.5 and 18.1; deeplab_dil2 34.8 against 45.0 and
    46.0), so tiles count as FMA-bound only from 12 FMAs per 7 loads.

    `pairs` (bf16 on vdpbf16ps), and any assembly tile with 32 registers (EVEX, `Target.evex_tiles`):
    the intensity is not capped, so the tile with the most products per load wins: on Zen 4 (1 thread, ms, bf16 forward) 4 x 6 ran r50_3x3_64 in
    10.2 against 4 x 3's 10.5, 3 x 8's 11.5 and 2 x 14's 12.1; r50_3x3_256 9.1 against 9.3, 9.6
    and 10.0; unet3d 11.9 against 12.3, 15.9 and 12.9; the weight gradient of r50_3x3_64 10.8
    against 11.2, 11.8 and 13.1.

    `capped`: the intensity counts at most 1 (FMA-bound) whatever the tile, for a score to compare
    with blocked's (algorithm._lanes_or_blocked)."""
    best = (1, 1, -1.0)
    for nv in range(1, 5):
        for pb in range(1, 15):
            used = asm_tile_registers(nv, pb) if asm else nv * pb + nv + 1 + LANES_SPARE_REGISTERS
            if used > registers:
                continue
            ch_eff = channels / (math.ceil(channels / (nv * lanes)) * nv * lanes)
            intensity = nv * pb / (nv + pb) / (ASM_FMA_PER_LOAD if asm else FMA_PER_LOAD)
            intensity = intensity if (pairs or (asm and registers > 16)) and not capped else min(1.0, intensity)
            score = ch_eff * intensity + 1e-3 * nv * pb * ch_eff   # (ties: the larger tile, not wider waste)
            if score > best[2]:
                best = (nv, pb, score)
    return best


def _one_dimensional(g) -> bool:
    """Whether the problem is one-dimensional: depth and height of one (input, output and kernel)."""
    return g.x_size[:2] == (1, 1) and g.y_size[:2] == (1, 1) and tuple(g.kernel[:2]) == (1, 1)


def _windows_inside(g) -> bool:
    """Whether every output pixel's window lies inside the input (no padding to read): then the
    lanes kernels read the input in place instead of a zero-padded copy."""
    return not any(g.pad_lo) and all((y - 1) * s + (k - 1) * d + 1 <= x for x, y, k, s, d in
                                     zip(g.x_size, g.y_size, g.kernel, g.stride, g.dilation))


STAGE_MIN_PIXELS = 2048   # the lanes weight gradient stages its chunks for 1-D images of at least this many pixels
ROW_TILES_MAX_WIDTH = 256   # rows wider than this keep tiles across rows (the kernel maps each column to its tile)


def _row_split(g, fwd: bool, nv: int, pb: int) -> tuple[int, ...]:
    """Register tiles within rows for a lanes forward or stride-1 data gradient, where that saves time:
    the sizes of the ceil(width / pb) tiles that split a row evenly, or () to keep tiles of pb pixels
    across rows.

    Within one row a tile's pixels share their kd and kh taps, and a kw tap's zero padding falls on
    the first or last pixels of a row, known when the kernel is generated: each tile steps only its
    pixels that read inside (oneDNN leaves out the same products; torch's forward ran unet3d at 172
    GFLOP/s counting every product, padded or not, against 156 with the same output and no padding:
    Xeon, 1 thread). Estimated per tile, tap and reduction step as max(nv * pixels / 2,
    FMA_LATENCY_CYCLES) cycles (two FMA pipes; a tile of few accumulators waits on their latency),
    against tiles of pb pixels across rows, which skip the kd and kh taps that none of their rows
    reads inside (SKIP_TAPS) and step every kw tap for all their pixels; kept where the estimate is
    ROW_TILES_GAIN of that or less. Xeon, AVX-512, 2 threads, kernel alone, across rows / within:
    channels last, forward and data gradient, r50_3x3_256 (estimate 0.94) 1.05x / 1.04x, r50_3x3_512
    (0.84) 1.13x / 1.04x, unet3d (0.97) 1.03x / 1.03x, deeplab_dil2 (0.96) 1.02x / 1.03x, incep_1x7
    (0.88) 1.10x / 1.11x, r50_3x3_128_s2 (forward, 0.984) 1.02x, r50_3x3_64 (0.987) 1.02-1.04x /
    1.01-1.02x, c3d_s2 (forward, 0.986) 1.01-1.02x, odd_asym (forward, 0.97) 0.96-1.01x, NCHW
    r50_3x3_512 1.08x / 1.07x. Work items of a whole number of rows nearest the pixels of an item
    across rows (not fewer: vgg_256_256, 56 x 56, items of one row read 3 input rows per output row
    where 96 pixels read 2.2, and ran 0.98x / 0.99x; of two rows 1.00x / 1.00x)."""
    tw = g.y_size[2] if fwd else g.x_size[2]
    if tw > ROW_TILES_MAX_WIDTH:
        return ()
    nt = math.ceil(tw / pb)
    base, extra = divmod(tw, nt)
    split = tuple([base + 1] * extra + [base] * (nt - extra))

    def cost(p: int) -> float:
        return max(nv * p / 2, FMA_LATENCY_CYCLES) if p else 0.0

    def inside(o: int, axis: int, k: int) -> bool:   # row o (or plane) of the result reads inside at tap k
        if fwd:
            at = o * g.stride[axis] + k * g.dilation[axis] - g.pad_lo[axis]
            return 0 <= at < g.x_size[axis]
        at = o + g.pad_lo[axis] - k * g.dilation[axis]
        return 0 <= at < g.y_size[axis]

    size = g.y_size if fwd else g.x_size

    def taps_inside(o: int, axis: int) -> tuple[int, int]:   # the taps [lo, hi) that read inside
        ks = [k for k in range(g.kernel[axis]) if inside(o, axis, k)]
        return (ks[0], ks[-1] + 1) if ks else (0, 0)

    # per row (d, h) of an image: its kd and kh taps that read inside
    spans = [(taps_inside(d, 0), taps_inside(h, 1)) for d in range(size[0]) for h in range(size[1])]
    count = lambda kd, kh: (kd[1] - kd[0]) * (kh[1] - kh[0])
    per_row = sum(cost(len(cols)) for tile in row_tile_taps(g, fwd, split) for cols in tile)
    rows = sum(count(*span) for span in spans) * per_row
    # tiles of pb pixels across rows (an image's first at its first pixel) take the kd and kh taps
    # that any of their rows reads inside (SKIP_TAPS), every kw tap for all pb pixels
    flat = 0.0
    for t in range(math.ceil(len(spans) * tw / pb)):
        live = [spans[r] for r in range(t * pb // tw, (min(len(spans) * tw, (t + 1) * pb) - 1) // tw + 1)
                if count(*spans[r])]
        if live:
            kd = (min(s[0][0] for s in live), max(s[0][1] for s in live))
            kh = (min(s[1][0] for s in live), max(s[1][1] for s in live))
            flat += count(kd, kh) * g.kernel[2] * cost(pb)
    return split if rows <= ROW_TILES_GAIN * flat else ()


ROW_TILES_MIN_REGISTERS = 32   # tiles within rows on targets whose tiles have this many vector registers
ROW_TILES_GAIN = 0.99     # tiles within rows where they are estimated to take at most this much of the time
FMA_LATENCY_CYCLES = 4   # a tile step's floor: each accumulator takes one FMA, 4 cycles after its last


CHUNK_WHOLE_L1_FROM = 48 * 1024   # lanes chunks take the whole L1 from this size (AVX-512: any size)


def _lanes(plan: Plan, lanes: int) -> Plan:
    """Forward: NV vectors of output channels x PB output pixels per register tile. Data gradient:
    NV vectors of input channels x PB input-gradient pixels of one stride phase."""
    g, t, p = plan.geometry, plan.target, plan.problem
    acc_bytes = p.dtype.accumulator.itemsize
    taps = g.kernel[0] * g.kernel[1] * g.kernel[2]
    fwd = plan.kop is KOp.FWD
    channels, reduced = (g.cout_g, g.cin_g) if fwd else (g.cin_g, g.cout_g)
    # bf16 on vdpbf16ps: each step takes a pair of reduced channels (two bf16 in one 32-bit lane),
    # so the reduction counts pairs, read from copies that interleave them; the EVEX-encoded
    # instruction lets the tile use all 32 registers
    pairs = p.dtype is DType.BF16 and t.bf16_dot
    # the other dtypes keep AVX2's 16: with 32 (4 x 6 for f32) the forward and data gradient ran
    # within -3%..+3% of 4 x 3 on Zen 4 (kernel alone, 2 threads, r50_3x3_64/256/512, unet3d,
    # deeplab_dil2), where the weight gradient gains (_lanes_wgrad)
    registers = t.tile_registers if pairs else t.vector_registers
    nv, pb, score = lanes_tile(channels, lanes, registers, asm=t.fma_asm, pairs=pairs)
    # Items of a few tiles. When all the weights fit the L2, consecutive items take the channel
    # blocks of one run of pixels (whose input stays cached); otherwise they take all the pixels of
    # one channel block (whose weights stay cached), and the input is read once per block. The
    # bound was half the L2: weights between the two (128 x 128 x 3 x 3, 590 KB) measured equal or
    # faster pixel-major, and much faster while other tenants held the shared L3 (kernel alone, Zen
    # 4, 2 threads, ms, pixel- / channel-major): r50_3x3_128_s2's forward 11.0 / 13.2 and 11.3 / 14.6
    # in such minutes, 9.6 / 9.7 and 10.0 / 10.2 in quiet ones, channels last 10.5 / 11.4; bf16
    # r50_1x1_256_1024 forward 2.76 / 2.96, data gradient 2.78 / 3.01; channels-last
    # mb_pw_960_160 data gradient 0.81 / 0.91; alexnet_g2 18.2 / 19.0, 17.6 / 18.4 and 20.1 / 18.6.
    # Above the L2 (r50_3x3_512, 9.4 MB) pixel-major ran 13.4 against 10.9. A data gradient of
    # several stride phases keeps the half: bf16 r50_3x3_128_s2's ran 11.6 / 9.5 and 11.1 / 9.4.
    weight_bytes = g.cout_g * g.cin_g * taps * acc_bytes
    phased = not fwd and any(s > 1 for s in g.stride)
    channel_major = weight_bytes > (t.l2_bytes // 2 if phased else t.l2_bytes)
    qb = pb * 16
    # Reduced channels per chunk: the chunk's weights and the part of its input that a run of QB
    # pixels reads take at most half the L1, so every tile of the run finds them there (and at
    # most 256 products per partial sum, for accuracy). Measured on r50_1x1_2048_512's forward
    # (Zen 3, 32 KB L1): 32 channels (17 KB) ran 7.5-8.4 ms against 9.2-14.8 with 128 (40 KB).
    # An L1 of 48 KB or more takes chunks up to its whole size: fewer partial sums to add into the
    # totals (Xeon, 48 KB, AVX-512, f32, 2 threads, kernel alone, ms, half / whole, alternating):
    # channels last r50_1x1_256_64 forward 3.20 / 3.10, data gradient 4.52 / 4.36, unet3d 6.21 /
    # 6.08, r50_3x3_64 6.24 / 6.16; NCHW deeplab_dil2 18.1 / 17.3, r50_1x1_2048_512 data gradient
    # 3.13 / 3.05; none slower. So does the AVX-512 shape with Zen 4's 32 KB L1 (f32 unless named,
    # 2 threads, kernel alone, ms, half / whole): r50_3x3_64 forward 10.06 / 9.50, data gradient
    # 9.11 / 8.68, channels last 9.17 / 9.03 and 9.56 / 9.09, bf16 forward 5.82 / 5.28;
    # r50_3x3_256 8.78 / 8.34; deeplab_dil2 23.6 / 22.7, bf16 12.8 / 12.2; r50_1x1_2048_512 4.84 /
    # 4.55, bf16 2.43 / 2.32; channels-last r50_3x3_512 7.50 / 7.40, unet3d 7.83 / 7.76 (data
    # gradient 8.92 / 8.51), r50_1x1_64_256 4.46 / 4.29; r50_3x3_128_s2 8.71 / 8.40, dcgan_tconv
    # 2.79 / 2.75; bf16 r50_3x3_512 4.24 / 4.18. The AVX2 shape on the same host ran within -1%..+6%
    # (unmeasured on AVX2-only hosts, which keep half their L1).
    read_w = g.x_size[2] if fwd else g.y_size[2]
    out_w, sw = (g.y_size[2], g.stride[2]) if fwd else (math.ceil(g.x_size[2] / g.stride[2]), 1)
    reach = [(k - 1) * d + 1 for k, d in zip(g.kernel, g.dilation)]

    # Taps of one row (1x1, 1-D): a run within a row reads its pixels' reach, in two pieces where it
    # crosses a row's end; counted as two rows it halved the chunk (r50_1x1_64_256's 64 channels in
    # chunks of 47 and 17: channels last, AVX-512, Xeon, 2 threads, kernel alone, ms, before / after:
    # forward 3.99 / 3.90, r50_1x1_512_128 data gradient 4.44 / 4.24, c3d_1x1 1.45 / 1.40; the other
    # pointwise ResNet layers 0.99-1.02x)
    def window(q: int) -> int:   # pixels that a run of q pixels reads
        if q < out_w and reach[0] == reach[1] == 1:
            return min(read_w + 2 * g.pad_lo[2], q * sw + 2 * (reach[2] - 1))
        width = min(read_w + 2 * g.pad_lo[2], q * sw + reach[2]) if q < out_w else read_w + 2 * g.pad_lo[2]
        return reach[0] * (math.ceil(q / out_w) + reach[1]) * width

    # A channels-last input is read channels innermost: each chunk of the reduction touches a line
    # of every pixel the run reads, whatever its channel count. Runs are shortened until those
    # lines take at most half the L1. Kernel alone, Zen 4, 2 threads, f32: unet3d's forward (3 x 5
    # rows x 34 pixels, 33 KB of lines at 48 pixels) ran 11.7 ms with the 18 pixels this gives
    # against 13.1-13.2 with 48 (runs of 24: 11.9-12.3 against 13.1-14.0 in three more runs);
    # c3d_s2 16.1 against 17.0, c3d_64 17.6 against 17.5; bf16 unet3d 6.0 against 6.0, c3d_s2
    # 5.2 against 6.7 (its chunk grows with the shorter run). Only where the window has depth:
    # 2-D layers measured no better with shorter runs (r50_3x3_128_s2 13.5 ms at 24 pixels
    # against 11.9 at 48). Pixels of fewer channels than a line share lines (c3d_stem: 5-11%
    # slower with shorter runs), and the count per channel below holds for them.
    pixel_bytes = g.groups * (math.ceil(g.cin_g / 2) if pairs else g.cin_g) * acc_bytes
    if fwd and reach[0] > 1 and pixel_bytes >= 64 and plan.layout_of("X") is Layout.CHANNELS_LAST:
        while qb > pb and window(qb) * 64 > t.l1_bytes // 2:
            qb -= pb
    if fwd:   # the input needs a padded copy unless every window lies inside it
        border = not _windows_inside(g)
    else:     # grad_output does unless every tap's row lies inside it
        border = any((pl - (k - 1) * d) // s < 0 or (x - 1 + pl) // s > y - 1 for x, y, k, s, pl, d in
                     zip(g.x_size, g.y_size, g.kernel, g.stride, g.pad_lo, g.dilation))
    # (tiles of 32 registers: the 16-register AVX2 shape, its tiles of 3 pixels even smaller, ran mixed
    # with tiles within rows on the Xeon, channels last, forward / data gradient: deeplab_dil2 0.93x /
    # 0.94x, r50_3x3_256 0.98x / 0.97x, r50_3x3_512 1.03x / 1.00x, r18_3x3_512_n1 1.05x / 1.01x,
    # incep_1x7 1.00x / 1.04x, an 8 x 64 x 112 x 3 image 1.27x / 1.25x; unmeasured on an AVX2 host)
    split = (_row_split(g, fwd, nv, pb)
             if border and registers >= ROW_TILES_MIN_REGISTERS and (fwd or all(s == 1 for s in g.stride)) else ())
    if split:   # work items of whole rows, as many as nearest the pixels of an item across rows
        pb = max(split)
        qb = max(1, (qb + sum(split) // 2) // sum(split)) * sum(split)
    run_bytes = window(qb) * acc_bytes
    steps = math.ceil(reduced / 2) if pairs else reduced
    chunk_bytes = t.l1_bytes if t.l1_bytes >= CHUNK_WHOLE_L1_FROM or t.isa == "avx512" else t.l1_bytes // 2
    cc = max(1, min(steps, chunk_bytes // (taps * nv * lanes * acc_bytes + run_bytes),
                    max(1, (128 if pairs else 256) // taps)))
    unit = p.dtype.accumulator is p.dtype
    read = "X" if fwd else "Y"
    # Tiles within rows step only the taps and pixels that read inside, so they read no padding: the
    # input (data gradient: grad_output) is then read in place too, its copy left out. Xeon, f32, 2
    # threads, kernel alone, copy / in place (bit-identical results): forward channels last unet3d
    # 1.03-1.09x, r50_3x3_64 1.03-1.05x, r50_3x3_512 1.13x, deeplab_dil2 1.00-1.03x, odd_asym 1.03x;
    # NCHW r50_3x3_64 1.09x, r50_3x3_256 1.05x, r50_3x3_512 1.04x, deeplab_dil2 1.02x; data gradient
    # channels last unet3d 1.05x, r50_3x3_64 1.03x, deeplab_dil2 1.10x, r50_3x3_512 1.02x.
    in_place = (read,) if (not border or split) and unit else ()
    # A channels-last input with no depth window is copied a work item's rows at a time, by its thread,
    # where consecutive items take the channel blocks of one run of pixels (channel-major items copy
    # each run's rows once per channel block). Xeon, AVX-512, 2 threads, kernel alone, ms, whole copy /
    # per item: r50_3x3_64 6.34 / 6.24, r50_3x3_128_s2 7.56 / 7.40, r50_stem 3.53 / 3.52; channel-major
    # r50_3x3_256 5.95 / 6.21 and r50_3x3_512 7.97 / 8.47 (7x7 images: an item's rows span three).
    # Only copies larger than the L2 (which go out to memory): a smaller one stays cached, and odd_asym's
    # (1 MB) ran 0.17 ms whole against 0.23 per item (each thread's row buffer newly mapped per call).
    # The stride-1 data gradient reads its channels-last grad_output the same way.
    # With a depth window an item's rows run from its first plane's first row to its last plane's last
    # (the planes between whole): per item where three such windows (the thread's buffer) take at most
    # half the L2, and pixels at least a line. unet3d's forward (a 5.3 MB copy, windows of 310 KB; Xeon,
    # 2 MB L2, kernel alone, whole copy / per item) 1.01-1.02x at 2 threads, 1.03x at 1, bf16 1.00x;
    # c3d_stem's 3 channels 0.99x. The stride-1 data gradient's grad_output alike: unet3d 1.00-1.01x at
    # 2 threads, 1.03-1.04x at 1.
    # the read buffer's padded rows and columns, and bytes a pixel (input; data gradient: grad_output)
    if fwd:
        rows_cols, read_bytes = [(y - 1) * st + r for y, st, r in zip(g.y_size, g.stride, reach)][1:], pixel_bytes
    else:
        rows_cols = [x + r - 1 for x, r in zip(g.x_size, reach)][1:]
        read_bytes = g.groups * (math.ceil(g.cout_g / 2) if pairs else g.cout_g) * acc_bytes
    window_rows = (reach[0] - 1) * rows_cols[0] + math.ceil(qb / out_w) + reach[1]
    windows_fit = ((g.y_size if fwd else g.x_size)[0] == 1 and reach[0] == 1
                   or read_bytes >= 64 and 3 * window_rows * rows_cols[1] * read_bytes <= t.l2_bytes // 2)
    if fwd:
        row_window = t.l2_bytes if (not in_place and not channel_major and windows_fit
                                    and plan.layout_of("X") is Layout.CHANNELS_LAST and g.groups * g.cin_g > 1) else 0
    else:
        row_window = t.l2_bytes if (not in_place and not channel_major and windows_fit
                                    and all(s == 1 for s in g.stride) and plan.layout_of("Y") is Layout.CHANNELS_LAST
                                    and g.groups * g.cout_g > 1) else 0
    stream = _stream_bytes(plan, nv * lanes) if fwd else 0
    planes = plan.layout_of("Y" if fwd else "X") is Layout.CONTIGUOUS
    tiling = Tiling(vector_lanes=lanes, kb=pb, nv=nv, cols=qb, rb=cc, in_place=in_place, channel_major=channel_major,
                    pairs=pairs, stream_bytes=stream, copy_per_item=row_window, row_split=split, threads_hint=f"parallel over (group, {'output' if fwd else 'input'}-channel block, "
                                 f"{'' if fwd else 'stride phase, '}run of pixels)")
    what = "output" if fwd else "input"
    return plan.decide("tiling", f"register tile {nv} vectors of {lanes} {what} channels x {pb} pixels "
                                 f"({nv * pb} of {registers} registers accumulate; {score:.2f} useful); "
                                 + (f"bf16 reduced in pairs of channels on vdpbf16ps (two products per f32 lane "
                                    f"and step, half the steps of f32 FMAs; its arithmetic emulated in C where the "
                                    f"tile is not stepped in assembly); " if pairs else "")
                                 + (f"tiles within rows of {sum(split)} pixels ({', '.join(map(str, split))}), "
                                    f"work items of whole rows, each tap stepping only the pixels that read inside "
                                    f"{'the input' if fwd else 'grad_output'} (no products of its zero padding); "
                                    if split else "") +
                                 f"{qb} pixels per work item, reduced in chunks of {cc} "
                                 f"{'channel pairs' if pairs else 'channels'} whose weights stay "
                                 f"in L1, {'channel block' if channel_major else 'pixel run'} outermost (the "
                                 f"weights, {weight_bytes} B per group, {'do not fit' if channel_major else 'fit'} "
                                 f"the L2); {'input' if fwd else 'grad_output'} "
                                 f"{('read in place, its padding never read' if border else 'read in place') if in_place else f'zero-padded rows copied per work item by its thread (they stay in its L2) where the copy would take {row_window >> 20} MB or more, else copied once, zero-padded' if row_window else 'copied once, zero-padded'}; "
                                 + (f"{'output' if fwd else 'input-gradient'} channel planes stored {lanes} pixels x {lanes} channels at a "
                                    f"time, transposed in registers; " if planes else "")
                                 + (f"outputs of {stream >> 20} MB or more per call (they cannot stay in the L2) "
                                    "written with non-temporal stores (a cached store first reads each line); "
                                    if stream else "") +
                                 f"{tiling.threads_hint}", tiling=tiling)


# Non-temporal stores of the lanes forward's channels-last output. A cached store first reads the
# line it writes (write-allocate), so an output far larger than the L2 costs its size twice in
# memory traffic; vmovntps writes whole lines without reading them. Measured on Zen 4 (f32,
# channels last, 2 threads, kernel alone, ms, cached / non-temporal): r50_1x1_64_256 (25.7 MB out)
# 6.60 / 4.68, r50_stem (25.7 MB) 11.4 / 10.6, r50_3x3_64 (6.4 MB) 9.92 / 9.37, deeplab_dil2
# (4.5 MB) 28.7 / 27.6, unet3d (4.2 MB) 10.3 / 10.0; below the L2 no gain (r50_3x3_256, 1.6 MB,
# 10.9 / 11.1; r50_3x3_512, 0.8 MB, 10.6 / 10.6). The data gradient measured mixed (deeplab_dil2
# 28.0 / 31.6, r50_3x3_64 19.3 / 18.5), so it keeps cached stores. Contiguous (channel-plane)
# outputs streamed a line of each channel's pixels at a time did not gain (r50_3x3_64 9.79 / 10.01,
# r50_1x1_64_256 7.86 / 7.99; bf16 6.63 / 12.25, its values rounded one by one; unet3d alone 10.2 /
# 9.2), so they keep cached stores too.
STREAM_L2S = 4   # outputs of at least this many L2s per call
# On the Xeon (AVX-512, 2 threads, channels last, kernel alone, ms, lines owned a tile ahead with
# prefetchw and stored cached / non-temporal): r50_1x1_64_256 3.30-3.38 / 3.03-3.10, r50_stem
# 3.35-3.37 / 3.26-3.32, with every store a vector store. (Owning ahead had measured better, 4.07
# against 4.87, while the AVX-512 shape stored each vector as 16 scalar moves; it was dropped.)

# Channel-plane (contiguous) outputs of the lanes forward and data gradient: the tile holds a
# pixel's channels in a vector, a plane wants a channel's pixels together. V pixels that are
# neighbours in the plane are stored at once for each vector of channels, their V vectors transposed
# in registers (templates/cpu/lanes_body.j2); pixel by pixel each value was a scalar store to a line
# of another plane, and with planes of a multiple of 2 KB a pixel's channels fell into one or two
# L1 sets. Measured on Zen 4 (NCHW, 2 threads, kernel alone, ms, the former stores / transposed):
# bf16 forward unet3d 5.96 / 4.81, wavenet_1d (lanes) 12.03 / 9.14, r50_1x1_64_256 4.56 / 4.16;
# data gradient unet3d 5.76 / 5.14, wavenet_1d 12.19 / 9.46; f32 wavenet_1d (lanes) forward 19.1
# / 17.6, data gradient 19.2 / 17.6; the f32 3x3 ResNet layers within noise (r50_3x3_64 9.35 / 9.28).


def _stream_bytes(plan: Plan, nvv: int) -> int:
    """The output bytes per call from which the lanes forward stores past the caches (0: never):
    x86 targets, a channels-last output whose every tile store covers whole 64-byte lines (channel
    blocks of whole vectors, a line-multiple block and pixel stride)."""
    g, t, p = plan.geometry, plan.target, plan.problem
    item = p.dtype.itemsize
    if t.kind is not TargetKind.CPU or t.isa not in ("avx2", "avx512") or plan.layout_of("Y") is not Layout.CHANNELS_LAST:
        return 0
    if g.cout_g % nvv or (nvv * item) % 64 or (g.cout_g * g.groups * item) % 64:
        return 0
    return STREAM_L2S * t.l2_bytes





def _lanes_wgrad(plan: Plan, lanes: int) -> Plan:
    """Weight gradient with NV vectors of output channels x PB (input channel, tap) rows per tile."""
    g, t, p = plan.geometry, plan.target, plan.problem
    acc_bytes = p.dtype.accumulator.itemsize
    taps = g.kernel[0] * g.kernel[1] * g.kernel[2]
    rows = g.cin_g * taps
    pairs = p.dtype is DType.BF16 and t.bf16_dot    # (see _lanes: pairs, and 32 registers for their tile)
    while t.isa == "avx512" and 2 * g.cout_g <= lanes and lanes > 4:
        # few output channels per group take narrower vectors (ymm or xmm, 32 registers with
        # AVX512-VL): a zmm tile would waste most of its lanes, and grad_output is packed a vector
        # of channels per pixel. Xeon, f32 NCHW, 2 threads, kernel alone, ms: rnx_grouped (4
        # channels per group) 22.5 on zmm, 7.2 on ymm, 6.3 on xmm (the AVX2 shape's: 6.7-7.4)
        lanes //= 2
    # every dtype's assembly tile takes all 32 registers where it may (Target.evex_tiles): f32 4 x 6
    # against AVX2's 4 x 3 on Zen 4, kernel alone, 2 threads, ms: r50_3x3_64 11.91 / 12.81,
    # r50_3x3_512 10.41 / 10.65, r50_3x3_256 8.91 / 9.04, unet3d 10.93 / 11.12
    nv, pb, score = lanes_tile(g.cout_g, lanes, t.tile_registers, asm=t.fma_asm,
                               pairs=pairs)
    # Tap-aligned tiles (Tiling.tap_rows): where a tile of the kh x kw taps of one (input channel, kd)
    # holds at least TAP_ROWS_MIN_ACC accumulators and fits the registers (windows of more than one
    # row, at most half again lanes_tile's rows), each tile reads its rows at compile-time offsets
    # from one pointer. A pointer per row (plus the pixel's offsets) took every spare general register,
    # and the rest came from the stack each pixel: unet3d (2 vectors x 14 rows, 8 reloads a pixel).
    # Xeon, f32, channels last, 2 threads, kernel alone, unet3d 2 x 14 rows / 2 x 9 tap-aligned:
    # 1.04x, 1.01x, 1.06x, 1.05x, 1.04x, 1.27x in six runs, NCHW 1.04x (bit-identical); where the tile keeps
    # its size (3 vectors x 9 rows: odd_k3_s3, odd_nobias) 1.00-1.01x; 1-D c1d_64_k5 (4 x 5 rows against
    # 4 x 6) 0.98x, so windows of one row keep their tiles.
    kk = g.kernel[1] * g.kernel[2]
    tap_rows = (not pairs and g.kernel[1] > 1 and kk * nv >= TAP_ROWS_MIN_ACC and kk <= pb * 3 // 2
                and asm_tile_registers(nv, kk) <= t.tile_registers)
    # A chunk's packed grad_output (PC pixels x NV vectors) takes half the L1; an item's rows are
    # whole input channels' taps, about WGRAD_ROWS of them, so the rows of a chunk share their
    # input lines.
    pc = max(lanes, (t.l1_bytes // 2) // (nv * lanes * acc_bytes))
    unit = p.dtype.accumulator is p.dtype
    in_place = ("X",) if _windows_inside(g) and unit else ()
    partial_bytes = g.groups * g.cout_g * rows * acc_bytes
    # chunks of the reduction in one image (with pairs, a step takes two pixels)
    chunks = max(1, math.prod(g.y_size) // (2 if pairs else 1) // pc)

    # A channels-last input is turned into planes by each item's thread, its channels one image at a
    # time, V pixels x V channels through register transposes, where the whole copy would exceed the
    # L2 (and an item's planes of an image fit half of it): the whole copy went out to memory and
    # came back, its value-by-value gather a value per cycle. Only where every item takes whole
    # vectors of channels (all their taps); an item then takes every block of output channels, so each
    # channel and image is turned once (turned again per block, the transposes sat idle or were
    # repeated: Xeon, AVX-512, 2 threads, kernel alone, ms, whole / per item: r50_3x3_64 7.26 / 6.93;
    # without those conditions unet3d 7.52 / 9.53, r50_3x3_256 6.64 / 9.90, r50_3x3_128_s2 10.8 /
    # 11.6). Half the L2, not a quarter: r50_3x3_64's 844 KB of planes per item then take this copy,
    # 1.09-1.11x in two runs (tconv_3x3_s2_op's 530 KB 1.00-1.19x, odd_dil3's 652 KB 0.96-1.00x).
    def per_item_for(rb: int) -> int:
        return (t.l2_bytes if "X" not in in_place and not pairs and plan.layout_of("X") is Layout.CHANNELS_LAST
                and g.groups * g.cin_g > 1 and rb % taps == 0 and (rb // taps) % lanes == 0
                and g.cin_g % lanes == 0 else 0)

    def items_for(rb: int) -> int:
        """Work items for blocks of rb rows (with per-item planes, each item takes every block of
        output channels)."""
        blocks = 1 if per_item_for(rb) else math.ceil(g.cout_g / (nv * lanes))
        return g.groups * blocks * math.ceil(rows / rb)

    def rows_for(pb: int) -> int:
        rb = wgrad_row_block(rows, taps, pb, WGRAD_ROWS)
        if t.evex_tiles:
            # larger blocks where the parts of the reduction that fewer items then take keep all their
            # partial sums within PARTS_L2_SHARE of the L2
            big = wgrad_row_block(rows, taps, pb, WGRAD_ROWS_EVEX)
            if _splits(items_for(big), partial_bytes) * partial_bytes <= PARTS_L2_SHARE * t.l2_bytes:
                rb = big
        return rb

    rb = rows_for(kk if tap_rows else pb)
    if tap_rows and rb % taps == 0:   # every item's rows whole channels: every tile one channel's kh x kw taps
        pb = kk
    else:
        tap_rows = False
        rb = rows_for(pb)
    per_item, items = per_item_for(rb), items_for(rb)
    splits = _splits(items, partial_bytes, chunks)
    # A channels-last grad_output is read in place (GY_IN_PLACE in templates/cpu/lanes_wgrad.cpp.j2)
    # where each pixel's channel block is already one run and either the pixels hold one block
    # (their lines then fill every L1 set) or an item's rows are all the rows (grad_output is read
    # once per channel block: the pack, a pass that reads and writes all of it, would cost more
    # than the reads it saves). Blocks a power-of-two stride apart fill a fraction of the L1's
    # sets, which the chunk's lines, read again for every row tile, then overflow. Xeon, f32,
    # 2 threads, kernel alone, ms, packed / in place: r50_1x1_64_256 (64 rows, 4 blocks per
    # pixel) 6.18 / 4.86, r50_3x3_64 (one block) 8.15 / 7.50, unet3d 7.97 / 7.86; but
    # deeplab_dil2 (4 blocks, 2304 rows) 18.6 / 21.1, r50_3x3_128_s2 (2 blocks) 8.92 / 9.38.
    gy_in_place = (unit and not pairs and plan.layout_of("Y") is Layout.CHANNELS_LAST
                   and g.cout_g % (nv * lanes) == 0 and (g.groups * g.cout_g == nv * lanes or rb >= rows))
    in_place += ("Y",) if gy_in_place else ()
    # One-dimensional problems (1x1 problems flattened to one too) with a contiguous input and
    # grad_output and long images: each chunk of the reduction stages its input window (zero-padded)
    # and its grad_output, pixel-major, in buffers of its thread (templates/cpu/lanes_wgrad.cpp.j2),
    # instead of a whole padded copy and a whole pack per call, which each read and wrote their
    # operand in memory before the tiles read it back. Xeon, f32, 2 threads, kernel alone, whole /
    # staged, 3-4 alternating runs each: wavenet_1d (4096 pixels an image) 1.09-1.23x, c1d_small_c
    # (3981) 1.10-1.23x, mb_pw_144_24 (3136) 1.05-1.11x, c3d_1x1 (6272) 0.98-1.12x; but c1d_64_k5
    # (1024) 0.86-0.99x, r50_1x1_128_512 (784) 0.98-1.00x, shuffle_g3 (784) 0.87-1.01x. One thread:
    # c1d_64_k5 1.12x, wavenet_1d 1.23x. Hence images of STAGE_MIN_PIXELS or more.
    stage = (not pairs and not per_item and not gy_in_place and _one_dimensional(g)
             and math.prod(g.y_size) >= STAGE_MIN_PIXELS
             and plan.layout_of("X") is Layout.CONTIGUOUS and plan.layout_of("Y") is Layout.CONTIGUOUS)
    assert not (tap_rows and stage), "tap-aligned tiles have windows of several rows; staged chunks one"
    tiling = Tiling(vector_lanes=lanes, kb=pb, nv=nv, rb=rb, pc=pc, splits=splits, in_place=in_place, pairs=pairs,
                    copy_per_item=per_item, stage=stage, tap_rows=tap_rows,
                    threads_hint="parallel over (group, out-channel block, row block, part of the reduction); "
                                 "each item owns its weight gradients and reduces in a fixed order, so results "
                                 "do not depend on the thread count")
    gy_text = ("read in place (channels last, whole channel blocks)" if gy_in_place else
               "staged pixel-major per chunk in its thread's buffers" if stage else
               "packed pixel-major once per call")
    x_text = "staged per chunk: its window of the item's channels, zero-padded"
    registers = asm_tile_registers(nv, pb)
    evex = (f", {registers} of 32 registers" + ("" if t.isa == "avx512" and lanes == t.vector_bytes // acc_bytes
                                                  else ": AVX512-VL's EVEX encoding reaches ymm16-31 / xmm16-31")
            if t.evex_tiles and registers > 16 else "")
    return plan.decide("tiling", f"register tile {nv} vectors of {lanes} output channels x {pb} (input channel, "
                                 f"tap) rows ({score:.2f} useful{evex}"
                                 f"{'; each tile the kh x kw taps of one input channel, at fixed offsets from one pointer' if tap_rows else ''}"
                                 f"); {rb} of the {rows} rows per work item, {items} "
                                 f"items x {splits} parts of the reduction, chunks of {pc} "
                                 f"{'pairs of pixels' if pairs else 'pixels'}; grad_output "
                                 f"{gy_text}; input "
                                 f"{x_text if stage else 'read in place' if 'X' in in_place else f'turned into zero-padded planes per work item, its channels an image at a time, by its thread where the whole copy would take {per_item >> 20} MB or more and an image of them fits half the L2 (each item then takes every block of output channels), else copied once' if per_item else 'copied once, zero-padded'}; "
                                 + ("bf16 reduced in pairs of horizontally adjacent pixels on vdpbf16ps (odd rows "
                                    "end with a virtual pixel of zero gradient; the input copy holds each value "
                                    "with its neighbour a stride along); " if pairs else "")
                                 + tiling.threads_hint, tiling=tiling)


# The depthwise weight gradient takes whole planes as one flat run (unit strides) when its output
# rows are narrower than this: per-row work and each row's vector padding then cost more than
# copying the planes. On Zen 3 (f32, ms, planes against rows): 960 channels at 7x7 0.52 against
# 4.07, 576 at 14x14 3.8 against 6.2, 240 at 28x28 (5x5) 5.6 against 7.7; but 144 at 56x56 6.9
# against 5.1, 32 at 112x112 8.1 against 5.4.
PLANES_BELOW_WIDTH = 32
# Wider rows take the planes too where both plane buffers fit in PLANES_L1_SHARE of the L1 and a
# row is at most PLANES_ROW_VECTORS vectors (or the problem is 1-D: a plane is one row): the rows
# kernel pays per row (each row's edge vectors read back from the copy just written, a
# store-forwarding stall per load; the taps' sums added in memory), which few vectors per row do not
# amortize. On the Intel AVX-512 host (L1 48 KB; f32, ms, rows against planes): 144 at 56x56 3.07
# against 1.34, 128 at 40x40 1.79 against 0.55, 128 at 64x64 2.00 against 1.54, 64 at 80x80 1.46
# against 1.37, 256 x 512 (1-D, 31 taps) 1.77 against 1.13; 32 at 112x112 stays on rows (1.16 against
# 1.40). In the AVX2 shape (8 lanes) on that host: 40x40 1.34 against 1.09, the 1-D layer 3.63
# against 1.89, but 56x56 (7 vectors a row) 2.28 against 2.73 and 64x64 2.74 against 3.17.
# On Zen 4 (L1 32 KB; ms, rows against planes): 144 at 56x56 (26 KB of planes, 82% of the L1) f32
# 2.75 against 1.59, bf16 2.82 against 1.50; so the share is 0.85, which leaves the Intel host's
# choices as they were (64x64's 34 KB in, 80x80's 53 KB out). There, f32 64x64 (34 KB, past the L1)
# 1.69 against 1.59, 80x80 1.36 against 1.66, 112x112 1.02 against 1.19: rows.
PLANES_L1_SHARE = 0.85
PLANES_ROW_VECTORS = 5
# Types stored narrower than their accumulator (bf16) cannot read grad_output rows in place: the
# rows kernel copies every row and reads it back at once (a store-forwarding stall per vector), so
# they take the planes wherever both buffers fit half the L2. Zen 4, bf16, ms, rows against planes:
# 128 at 64x64 2.03 against 1.30, 64 at 80x80 1.42 against 0.76, 32 at 112x112 1.33 against 0.85.
PLANES_NARROW_L2_SHARE = 0.5
# Taps per pass over the planes: at most the template's `#pragma GCC unroll` of its tap loop (past
# it the partial sums went to memory: Zen 4, f32, 240 at 28x28 (5x5 taps, 25 per pass) 1.18 ms
# against 0.85 in 2 passes of 13; 96 at 28x28 (7x7, 2 passes of 25) 1.36 against 0.71-0.80 in
# passes of 9-16).
PLANES_MAX_TAPS_PER_PASS = 16


def plane_layout(g, lanes: int) -> tuple[int, int, int]:
    """(vectors of a grad_output plane, values of an input plane (of one stride phase), the taps'
    reach) in the zero-padded planes of one row pitch of the weight gradients over planes
    (templates/cpu/planes.j2)."""
    (kd, kh, kw), (dd, dh, dw), (pd, ph, pw) = g.kernel, g.dilation, g.pad_lo
    (xd, xh, xw), (yd, yh, yw), (sd, sh, sw) = g.x_size, g.y_size, g.stride
    qd, qh, qw = (kd - 1) * dd // sd, (kh - 1) * dh // sh, (kw - 1) * dw // sw
    pitch, rh = max(yw + qw, -(-(pw + xw) // sw)), max(yh + qh, -(-(ph + xh) // sh))
    rd = max(yd + qd, -(-(pd + xd) // sd))
    nvec = -(-((yd - 1) * rh * pitch + (yh - 1) * pitch + yw) // lanes)
    reach = qd * rh * pitch + qh * pitch + qw
    return nvec, max(rd * rh * pitch, reach + nvec * lanes), reach


def depthwise_plane_bytes(g, lanes: int, acc_bytes: int) -> int:
    """Bytes of the depthwise weight gradient's two plane buffers (as depthwise_wgrad.cpp.j2 sizes them)."""
    nvec, x_plane, _ = plane_layout(g, lanes)
    return (x_plane + nvec * lanes) * acc_bytes


def _depthwise_wgrad(plan: Plan, lanes: int) -> Plan:
    g, p, t = plan.geometry, plan.problem, plan.target
    acc_bytes = p.dtype.accumulator.itemsize
    plane_bytes = depthwise_plane_bytes(g, lanes, acc_bytes)
    narrow = p.dtype.accumulator is not p.dtype
    if g.stride == (1, 1, 1) and g.groups > 1 and (
            g.y_size[2] < PLANES_BELOW_WIDTH
            or (narrow and plane_bytes <= PLANES_NARROW_L2_SHARE * t.l2_bytes)
            or (plane_bytes <= PLANES_L1_SHARE * t.l1_bytes
                and (math.ceil(g.y_size[2] / lanes) <= PLANES_ROW_VECTORS or g.y_size[:2] == (1, 1)))):
        taps = g.kernel[0] * g.kernel[1] * g.kernel[2]
        # taps per pass over the plane: their sums, the grad_output vector and one input vector
        # in registers, SPARE_REGISTERS left free, and no more than the tap loop unrolls
        tb = max(1, min(taps, t.vector_registers - 2 - SPARE_REGISTERS, PLANES_MAX_TAPS_PER_PASS))
        passes = math.ceil(taps / tb)
        tb = math.ceil(taps / passes)
        tiling = Tiling(vector_lanes=lanes, kb=tb, planes=True,
                        threads_hint="parallel over output channels; each item owns its channel's taps and "
                                     "reduces in a fixed order, so results do not depend on the thread count")
        why = (f"output rows narrower than {PLANES_BELOW_WIDTH}" if g.y_size[2] < PLANES_BELOW_WIDTH else
               f"{p.dtype.value} rows cannot be read in place and both planes ({plane_bytes >> 10} KB) fit in "
               f"{PLANES_NARROW_L2_SHARE:.0%} of the L2"
               if narrow and plane_bytes <= PLANES_NARROW_L2_SHARE * t.l2_bytes else
               f"both planes ({plane_bytes >> 10} KB) fit in {PLANES_L1_SHARE:.0%} of the "
               f"L1 and " + ("the problem is 1-D" if g.y_size[:2] == (1, 1) else
                             f"a row is at most {PLANES_ROW_VECTORS} vectors"))
        return plan.decide("tiling", f"unit strides, {why}: per image, input and grad_output planes copied into "
                                     f"zero-padded buffers of one row pitch, each tap a flat dot product of "
                                     f"vectors of {lanes}; {tb} taps per pass over the plane ({passes} "
                                     f"pass{'es' if passes > 1 else ''}); {tiling.threads_hint}", tiling=tiling)
    unit = p.dtype.accumulator is p.dtype
    layouts = dict(plan.layouts)
    in_place = []
    if unit and layouts["Y"] is Layout.CONTIGUOUS and g.y_size[2] % lanes == 0:
        in_place.append("Y")
    if unit and layouts["X"] is Layout.CONTIGUOUS and g.stride[2] == 1:
        in_place.append("X-row")   # the interior of each input row is copied with one memcpy
    tiling = Tiling(vector_lanes=lanes, in_place=tuple(in_place),
                    threads_hint="parallel over output channels; each item owns its channel's taps and reduces "
                                 "in a fixed order, so results do not depend on the thread count")
    return plan.decide("tiling", f"rows of {g.y_size[2]} in {math.ceil(g.y_size[2] / lanes)} vectors of {lanes}, "
                                 f"one vector of partial sums per tap; grad_output rows "
                                 f"{'read in place' if 'Y' in in_place else 'copied'}, input rows copied "
                                 f"{'with one memcpy each' if 'X-row' in in_place else 'element by element'}; "
                                 f"{tiling.threads_hint}", tiling=tiling)


# The planes weight gradient (groups of few channels; planes_wgrad.cpp.j2) walks its
# planes in chunks whose part of the buffers (grad_output and input planes) fits this share of the L1.
PLANES_CHUNK_L1_SHARE = 0.5


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


def planes_wgrad_chunk(g, kr: int, lanes: int, acc_bytes: int, l1_bytes: int) -> int:
    """Pixels per chunk (a multiple of `lanes`) of the planes weight gradient: the chunk's kr
    grad_output runs and the input runs of the (at most) two channels whose rows one tile reads
    (each run with the taps' reach) within PLANES_CHUNK_L1_SHARE of the L1; at least one vector.
    (The chunk's tiles walk the channels in order, so the input runs reused are those.)"""
    _, _, reach = plane_layout(g, lanes)
    values = PLANES_CHUNK_L1_SHARE * l1_bytes / acc_bytes
    runs = min(g.cin_g, 2) * g.stride[0] * g.stride[1] * g.stride[2]   # (each of the channels' stride phases)
    vectors = int((values - runs * reach) / ((kr + runs) * lanes))
    return max(1, vectors) * lanes


def planes_wgrad_bytes(g, kr: int, lanes: int, acc_bytes: int) -> int:
    """Bytes of a thread's plane buffers in the planes weight gradient (kr grad_output planes, cin_g
    input planes of as many phases as the strides make), as planes_wgrad.cpp.j2 sizes them (each
    plane a whole number of lines, odd)."""
    nvec, x_plane, _ = plane_layout(g, lanes)
    line = 64 // acc_bytes

    def lines(values: int) -> int:
        return (-(-values // line) | 1) * line

    phases = g.stride[0] * g.stride[1] * g.stride[2]
    return (kr * lines(nvec * lanes) + g.cin_g * phases * lines(x_plane)) * acc_bytes


def _planes_wgrad(plan: Plan, lanes: int, why: str) -> Plan:
    """The planes weight gradient's tiling, `why` it takes the planes."""
    g, p, t = plan.geometry, plan.problem, plan.target
    taps = g.kernel[0] * g.kernel[1] * g.kernel[2]
    kr, tb = planes_wgrad_tile(g.cout_g, g.cin_g * taps, t.vector_registers)
    pc = planes_wgrad_chunk(g, kr, lanes, p.dtype.accumulator.itemsize, t.l1_bytes)
    rows = g.cin_g * taps
    blocks = g.groups * math.ceil(g.cout_g / kr)
    splits = _splits(blocks, blocks * (kr * rows + kr) * 8)
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


def _grouplanes_stream(plan: Plan) -> int:
    """The result bytes per call from which the grouplanes forward and data gradient store past the
    caches (0: never): x86 targets, pixels of whole 64-byte lines (every store of a channel vector
    then fills whole lines with the tile's others). Unlike the lanes data gradient's, both gain:
    these kernels do little arithmetic per value, and a cached store first reads the line. Measured
    on Zen 4 (f32, channels last, 2 threads, kernel alone, one process alternating, ms, cached /
    non-temporal): forward mbv2_dw (14.5 MB out) 0.86-0.89 / 0.57-0.58, mbv2_dw_s2 (9.6 MB) 1.48 /
    1.38, rnx_grouped (12.8 MB) 1.34 / 1.23; data gradient mbv2_dw 0.92 / 0.58, mbv2_dw_s2 (38.5 MB)
    2.15 / 1.39, rnx_grouped 1.60 / 1.53."""
    g, t, p = plan.geometry, plan.target, plan.problem
    if t.kind is not TargetKind.CPU or t.isa not in ("avx2", "avx512"):
        return 0
    if (g.groups * g.cin_g * p.dtype.itemsize) % 64:
        return 0
    return STREAM_L2S * t.l2_bytes


def grouplanes_tile(vectors: int, registers: int) -> tuple[int, int]:
    """(NB, PB) of the grouplanes forward and data gradient: NB vectors of channels x PB pixels,
    with NB weight vectors and one input vector in registers, SPARE_REGISTERS left free."""
    nb = max(1, min(GROUPLANES_VECTORS, vectors))
    pb = max(1, min(GROUPLANES_PIXELS, (registers - SPARE_REGISTERS - nb - 1) // nb))
    return nb, pb


def _grouplanes(plan: Plan, lanes: int) -> Plan:
    """Depthwise in channels last: the groups in the vector lanes."""
    g, t = plan.geometry, plan.target
    vectors = math.ceil(g.groups / lanes)
    if plan.kop is KOp.WGRAD:
        splits, m = MIN_ITEMS, g.cin_g
        per = (f"{g.kernel[2]} vectors of partial sums (one per kernel column)" if m == 1 else
               f"{m} x {g.kernel[2]} vectors of partial sums (one per group channel of grad_output, spread across "
               f"the group's lanes once per pixel, and kernel column)")
        tiling = Tiling(vector_lanes=lanes, splits=splits,
                        threads_hint=f"parallel over {splits} fixed parts of the output rows; each part keeps its "
                                     f"own sums, added in order at the end, so results do not depend on the thread "
                                     f"count")
        return plan.decide("tiling", f"{math.ceil(g.groups * m / lanes)} vectors of {lanes} channels; per output "
                                     f"row, channel vector and input row, {per} in registers, added to the part's "
                                     f"sums in double; {tiling.threads_hint}",
                           tiling=tiling)
    nb, pb = grouplanes_tile(vectors, t.vector_registers)
    rows = math.prod(g.y_size[:2]) if plan.kop is KOp.FWD else math.prod(g.x_size[:2])
    # rows of one image x channel chunks: at least MIN_ITEMS items per image when the channels allow
    chunks = max(1, min(math.ceil(vectors / nb), math.ceil(MIN_ITEMS / rows)))
    cch = math.ceil(math.ceil(vectors / chunks) / nb) * nb
    what = "output" if plan.kop is KOp.FWD else "input-gradient"
    stream = _grouplanes_stream(plan)
    tiling = Tiling(vector_lanes=lanes, kb=pb, nv=nb, ksb=cch, stream_bytes=stream,
                    threads_hint=f"parallel over (batch, {what} row, chunk of {cch} channel vectors)")
    slide = ("; one channel per group: the tile slides along the row, each column it reads loaded once for "
             "every pixel and tap it serves" if g.cin_g == 1 else "")
    streamed = (f"; results of {stream >> 20} MB or more per call written with non-temporal stores (a cached "
                f"store first reads each line)" if stream else "")
    return plan.decide("tiling", f"register tile {nb} vectors of {lanes} channels x {pb} "
                                 f"{'output pixels' if plan.kop is KOp.FWD else 'input-gradient columns of one stride phase'} "
                                 f"({nb * pb} of {t.vector_registers} registers accumulate){slide}; input and output "
                                 f"read and written in place{streamed}; {tiling.threads_hint}", tiling=tiling)


# Output vectors the depthwise planes kernel accumulates at once (each tap's weight broadcast once
# for all of them).
PLANES_VECTORS = 8
# The planes kernel steps its taps in assembly (fma_tile) for 2-D kernels of more than 9 taps on
# planes of at least this many vectors, where GCC's vector code spills; elsewhere the C step ran
# faster on Zen 3 (ms, C against assembly: 3x3 at 7x7, 960 channels, 0.18 against 0.33; 5x5 at
# 7x7 0.59 against 1.01; 1-D k31 at 4096 2.2 against 3.3; but 5x5 at 28x28, 112 vectors, 2.0
# against 1.28, and at 14x14, 32 vectors, 1.47 against 1.41).
PLANES_ASM_VECTORS = 64
# On AVX-512 (32 vector registers) the planes kernel takes column tiles instead of flat runs where
# the kernel has more than one row: PLANES_COLUMN_ROWS output rows x one vector of columns, the row
# pitch rounded up to whole vectors, so that each input row the tile reaches is loaded once per tap
# column for every output row it serves (a 3x3 kernel's load serves 3 FMAs, where a flat run loads
# for every FMA, 8 of 9 loads split across cache lines: the flat forward was bound by its loads).
# Zen 4, 2 threads, batch 8, kernel alone, ms, flat / 4 rows / 8 rows, f32 then bf16 (results
# bit-identical: each output adds its taps in the same order): mbv2_dw (144 at 56x56) 1.15 / 1.04 /
# 1.06 (29 MB a call: near the memory's pace) and 0.89 / 0.78 / 0.74, its data gradient 1.15 / 1.09
# / 1.12 and 1.12 / 0.93 / 0.85; 192 at 28x28 0.240 / 0.183 / 0.190 and 0.301 / 0.242 / 0.246; 384
# at 14x14 0.143 / 0.110 / 0.110 and 0.172 / 0.154 / 0.144; 960 at 7x7 0.187 / 0.186 / 0.191 and
# 0.218 / 0.200 / 0.198; 32 at 112x112 0.99 / 0.78 / 0.77 and 0.77 / 0.54 / 0.55; 5x5, 240 at 28x28
# 0.72 / 0.53 / 0.51 and 0.81 / 0.61 / 0.61; 7x7, 96 at 56x56 (flat stepped in assembly) 2.29 /
# 1.66 / 1.58 and 2.32 / 1.73 / 1.56. The AVX2 shape keeps the flat runs: a tile's accumulators and
# 9 weights outgrow its 16 registers (as AVX2 code on Zen 4, 8 rows: 0.99-1.21x; unmeasured on an
# AVX2-only host).
PLANES_COLUMN_ROWS = 8


def _depthwise_planes(plan: Plan, lanes: int) -> Plan:
    """Depthwise forward or data gradient (multiplier 1, unit strides) over whole zero-padded planes."""
    g = plan.geometry
    _, out_h, out_w = g.y_size if plan.kop is KOp.FWD else g.x_size      # the plane each item writes
    pitch = out_w + (g.kernel[2] - 1) * g.dilation[2]
    vectors = math.ceil(out_h * pitch / lanes)
    u = max(1, min(PLANES_VECTORS, vectors))
    taps = g.kernel[1] * g.kernel[2]
    if plan.target.isa == "avx512" and g.kernel[1] > 1 and out_h > 1:
        rows = min(PLANES_COLUMN_ROWS, out_h)
        pitch = math.ceil(pitch / lanes) * lanes
        tiling = Tiling(vector_lanes=lanes, kb=1, rb=rows, planes=True,
                        threads_hint="parallel over (image, channel) planes")
        return plan.decide("tiling", f"each plane copied into a zero-padded buffer of row pitch {pitch} (whole "
                                     f"vectors): tiles of {rows} output rows x one vector of columns, "
                                     f"{math.ceil(out_w / lanes)} across a row, each input row loaded once per tap "
                                     f"column for every output row it serves; {tiling.threads_hint}", tiling=tiling)
    asm = plan.target.fma_asm and out_h > 1 and taps > 9 and vectors >= PLANES_ASM_VECTORS
    tiling = Tiling(vector_lanes=lanes, kb=u, nv=int(asm), planes=True,
                    threads_hint="parallel over (image, channel) planes")
    return plan.decide("tiling", f"each plane copied into a zero-padded buffer of row pitch {pitch}: {vectors} "
                                 f"flat vectors of outputs per plane, {u} at a time in registers over the "
                                 f"{taps} taps{', stepped in assembly' if asm else ''}; {tiling.threads_hint}",
                       tiling=tiling)


def _splits(items: int, partial_bytes: int, chunks: int | None = None) -> int:
    """Fixed parts a weight-gradient reduction is cut into (their partial sums added in order):
    doubled while the work items are too few for the threads, up to MAX_SPLITS and PARTIAL_BYTES
    of partial sums, and (given `chunks`, the chunks of the reduction in one image) past four items
    only while every part keeps a whole chunk for a batch of one: parts of a few hundred pixels spent
    more on their own sums than they shared out (odd_asym, 741 pixels an image, 3 images, one item,
    8 parts / 4: Xeon, 2 threads, kernel alone, ms, NCHW 0.194 / 0.181 and 0.192 / 0.178, channels
    last 0.241 / 0.225 and 0.242 / 0.225; small_all 1.05-1.09x), but fewer than four items left a
    thread idle (small_all in one part: 0.81-0.84x)."""
    splits = 1
    while (items * splits < MIN_ITEMS and splits < MAX_SPLITS and (splits * 2) * partial_bytes <= PARTIAL_BYTES
           and (chunks is None or items * splits < 4 or splits * 2 <= chunks)):
        splits *= 2
    return splits



def _amx_wgrad(plan: Plan) -> Plan:
    """The AMX weight gradient's blocks of the reduction: as many grid positions as keep one work
    item's part of a block (32 input channels' rows, 32 output channels' pairs: 128 bytes a position)
    within about the L1 and a half, so that the next item, which shares its rows (the same tap and
    input channels), reads them there; and every item's part within half the L2. In whole tiles of 32.
    (r50_3x3_64 channels last, Xeon, 2 threads, kernel alone, ms: blocks of 128 positions 2.55, 256
    2.49, 512 2.33, 1024 2.58, 4096 (half the L2) 3.40.)"""
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


AMX_WGRAD_MIN_BLOCK, AMX_WGRAD_MAX_BLOCK = 64, 8192


def run_cpu(plan: Plan) -> Plan:
    """The tiling of `plan` for a CPU target."""
    from .tiling_gemm import _gemm_wgrad, _pointwise, _pointwise_wgrad   # (they import this module)

    if plan.algorithm in ("empty", "reduce"):
        return plan.decide("tiling", "no tiling", tiling=None)
    lanes = max(1, plan.target.vector_bytes // plan.problem.dtype.accumulator.itemsize)
    if plan.algorithm == "blocked":
        return _blocked(plan, lanes)
    if plan.algorithm == "lanes":
        return _lanes_wgrad(plan, lanes) if plan.kop is KOp.WGRAD else _lanes(plan, lanes)
    if plan.algorithm == "gemm":
        return _gemm_wgrad(plan, lanes)
    if plan.algorithm == "pointwise":
        return _pointwise_wgrad(plan, lanes) if plan.kop is KOp.WGRAD else _pointwise(plan, lanes)
    if plan.algorithm == "planes":
        return _planes_wgrad(plan, lanes, f"{plan.geometry.cout_g} output channels per group")
    if plan.algorithm == "depthwise":
        return _depthwise_wgrad(plan, lanes) if plan.kop is KOp.WGRAD else _depthwise_planes(plan, lanes)
    if plan.algorithm == "grouplanes":
        return _grouplanes(plan, lanes)
    if plan.algorithm == "amx" and plan.kop is KOp.WGRAD:
        return _amx_wgrad(plan)
    if plan.algorithm == "amx":
        return plan.decide("tiling", "AMX tiles: 2 x 2 accumulator tiles (32 pixels x 32 output channels) per step; "
                                     "work items of two 16-pixel tiles, each over every output channel",
                           tiling=Tiling(vector_lanes=16, threads_hint="(image, group, two tiles of 16 pixels)"))
    return _direct(plan, lanes)


