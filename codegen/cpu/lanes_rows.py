"""Family `lanes`, its register tiles within rows (Tiling.row_split): where the lanes forward or
stride-1 data gradient splits each row into tiles, each tile stepping only its pixels that read
inside at each kw tap (a tap's zero padding falls on a row's first or last pixels, known when the
kernel is generated). The tiling decides by an estimate (`row_split`); the templates get the
tiles grouped by their pixels per tap (`row_classes`). Part of lanes.py's story.
"""

from __future__ import annotations

import math

from ..plan import Geometry, KOp, Plan, Tiling

ROW_TILES_MAX_WIDTH = 256   # rows wider than this keep tiles across rows (the kernel maps each column to its tile)
ROW_TILES_MIN_REGISTERS = 32   # tiles within rows on targets whose tiles have this many vector registers
ROW_TILES_GAIN = 0.99     # tiles within rows where they are estimated to take at most this much of the time
# ... or at most this much, where tiles across rows would read a zero-padded copy of the whole operand
# made per call, which tiles within rows leave out (padding only across planes or rows: R(2+1)D's
# temporal 3x1x1, estimate 1.00, 8.9 -> 7.2 ms). (figures: BENCHMARKS.md, "Figures behind codegen's CPU
# rules", lanes_rows.row_split)
ROW_TILES_COPY_GAIN = 1.02
FMA_LATENCY_CYCLES = 4   # a tile step's floor: each accumulator takes one FMA, 4 cycles after its last

Span = tuple[tuple[int, int], tuple[int, int]]   # a row's kd and kh taps [lo, hi) that read inside


def row_tile_taps(g: Geometry, fwd: bool, split: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """For a lanes kernel whose register tiles lie within one row (`split`: the row's tile sizes, in
    order), per tile of the row and kw tap, the tile's pixels that read inside the input at that tap
    (forward: output pixel w reads input column w * SW + kw * DW - PW; stride-1 data gradient: input
    pixel w reads grad_output column w + PW - kw * DW); the others would read zero padding."""
    out, start = [], 0
    for size in split:
        per_kw = []
        for kw in range(g.kernel[2]):
            cols = []
            for j in range(size):
                w = start + j
                at = w * g.stride[2] + kw * g.dilation[2] - g.pad_lo[2] if fwd else w + g.pad_lo[2] - kw * g.dilation[2]
                if 0 <= at < (g.x_size[2] if fwd else g.y_size[2]):
                    cols.append(j)
            per_kw.append(tuple(cols))
        out.append(tuple(per_kw))
        start += size
    return tuple(out)


def _inside(g: Geometry, fwd: bool, o: int, axis: int, k: int) -> bool:
    """Whether row o (or plane) of the result reads inside at tap k of `axis`."""
    if fwd:
        at = o * g.stride[axis] + k * g.dilation[axis] - g.pad_lo[axis]
        return 0 <= at < g.x_size[axis]
    at = o + g.pad_lo[axis] - k * g.dilation[axis]
    return 0 <= at < g.y_size[axis]


def _taps_inside(g: Geometry, fwd: bool, o: int, axis: int) -> tuple[int, int]:
    """The taps [lo, hi) of `axis` at which row o (or plane) of the result reads inside."""
    ks = [k for k in range(g.kernel[axis]) if _inside(g, fwd, o, axis, k)]
    return (ks[0], ks[-1] + 1) if ks else (0, 0)


def _count(kd: tuple[int, int], kh: tuple[int, int]) -> int:
    return (kd[1] - kd[0]) * (kh[1] - kh[0])


def _across_rows(spans: list[Span], tw: int, kw: int, pb: int, step: float) -> float:
    """The estimate for tiles of pb pixels across rows (an image's first at its first pixel): each
    takes the kd and kh taps that any of its rows reads inside (SKIP_TAPS), every kw tap for all pb
    pixels, at `step` cycles a step."""
    flat = 0.0
    for t in range(math.ceil(len(spans) * tw / pb)):
        live = [spans[r] for r in range(t * pb // tw, (min(len(spans) * tw, (t + 1) * pb) - 1) // tw + 1)
                if _count(*spans[r])]
        if live:
            kd = (min(s[0][0] for s in live), max(s[0][1] for s in live))
            kh = (min(s[1][0] for s in live), max(s[1][1] for s in live))
            flat += _count(kd, kh) * kw * step
    return flat


def row_split(g: Geometry, fwd: bool, nv: int, pb: int, whole_copy: bool = False) -> tuple[int, ...]:
    """Register tiles within rows for a lanes forward or stride-1 data gradient, where that saves time:
    the sizes of the ceil(width / pb) tiles that split a row evenly, or () to keep tiles of pb pixels
    across rows.

    Within one row a tile's pixels share their kd and kh taps, and each tile steps only its pixels
    that read inside at a kw tap (oneDNN leaves out the same products). Estimated per tile, tap and
    reduction step as max(nv * pixels / 2, FMA_LATENCY_CYCLES) cycles (two FMA pipes; a tile of few
    accumulators waits on their latency), against tiles of pb pixels across rows, which skip the kd
    and kh taps that none of their rows reads inside (SKIP_TAPS) and step every kw tap for all their
    pixels; kept where the estimate is ROW_TILES_GAIN of that or less (ROW_TILES_COPY_GAIN where tiles
    across rows would read a copy of the whole operand, `whole_copy`). Work items then take a whole
    number of rows nearest the pixels of an item across rows (not fewer: items of one row read more
    input rows per output row).
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", lanes_rows.row_split)"""
    tw = g.y_size[2] if fwd else g.x_size[2]
    if tw > ROW_TILES_MAX_WIDTH:
        return ()
    nt = math.ceil(tw / pb)
    base, extra = divmod(tw, nt)
    split = tuple([base + 1] * extra + [base] * (nt - extra))

    def cost(p: int) -> float:
        return max(nv * p / 2, FMA_LATENCY_CYCLES) if p else 0.0

    size = g.y_size if fwd else g.x_size
    # per row (d, h) of an image: its kd and kh taps that read inside
    spans = [(_taps_inside(g, fwd, d, 0), _taps_inside(g, fwd, h, 1)) for d in range(size[0]) for h in range(size[1])]
    per_row = sum(cost(len(cols)) for tile in row_tile_taps(g, fwd, split) for cols in tile)
    rows = sum(_count(*span) for span in spans) * per_row
    gain = ROW_TILES_COPY_GAIN if whole_copy else ROW_TILES_GAIN
    return split if rows <= gain * _across_rows(spans, tw, g.kernel[2], pb, cost(pb)) else ()


def row_classes(plan: Plan) -> tuple[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]], ...]:
    """The tiles of a row grouped by their pixels that read inside per kw tap: (tiles, pixels per kw)
    for each group, in order of first tile (one case of the kernel's code each)."""
    if not isinstance(plan.tiling, Tiling) or not plan.tiling.row_split:
        return ()
    groups: dict = {}
    for k, per_kw in enumerate(row_tile_taps(plan.geometry, plan.kop is KOp.FWD, plan.tiling.row_split)):
        groups.setdefault(per_kw, []).append(k)
    return tuple((tuple(ks), per_kw) for per_kw, ks in groups.items())
