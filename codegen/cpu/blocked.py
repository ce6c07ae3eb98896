"""Family `blocked`: a register-blocked micro-kernel over zero-padded rows, the columns in the vector
lanes, strides split into phases. The forward and data gradient's default candidate; lanes takes
over by the rule in lanes.py (`over_blocked`), which compares the two families' tile scores.

Tiling: a register tile of KB channels x NV vectors of columns. The choice scores every (KB, NV)
that fits the register file by the fraction of lanes and channels doing useful work and by the
FMA-to-load ratio of the micro-kernel; a work item covers RB rows, which share one copy of the rows
they read, and as many columns as keep its input buffer within half the L2 cache.
"""

from __future__ import annotations

import math
from typing import Callable

from ..ir import DType
from ..plan import KOp, Plan, Tiling
from .family import Family
from .work import FMA_PER_LOAD, SPARE_REGISTERS, VECTOR_LOAD_COST, vector_lanes

NAME = "blocked"
WHY = "register-blocked micro-kernel over zero-padded rows, strides split into phases"
TEMPLATES = {KOp.FWD: "cpu/blocked_fwd.cpp.j2", KOp.DGRAD: "cpu/blocked_dgrad.cpp.j2"}

# Rows per work item of the blocked kernels, at most: they share one copy of the rows they read
# (the data gradient of a 7x7 stride-2 kernel reaches 3-4 grad_output rows per input row, 8 rows
# copy 7; a 3x3 forward reads 3 input rows per output row, 8 rows copy 10).
BLOCKED_ROWS = 8


def register_tile(channels: int, columns: int, lanes: int, registers: int,
                  wide: bool = False) -> tuple[int, int, float]:
    """Best (KB, NV, score) for a KB x NV-vector accumulator tile, one broadcast and NV loads in flight.

    Tiles of several vectors leave SPARE_REGISTERS free (fuller ones are spilled around by the
    compiler), and a tile is FMA-bound only when its FMAs outnumber its loads (KB broadcasts and NV
    unaligned vector loads, which cost more, per tap) by about FMA_PER_LOAD. Tiles of three vectors
    and several channels are left out: they ran slower than two-vector tiles wasting as many lanes.

    `wide` admits the three-vector tiles, for kernels that keep their totals in memory and only
    the partial sums in registers (the blocked data gradient), where they ran faster. It also lets
    a one-vector tile take more than 16 channels where 32 registers allow; the forward keeps 16.
    (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", blocked.register_tile)
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


def in_pairs(plan: Plan) -> bool:
    """bf16 on vdpbf16ps: the reduced channels (the forward's input channels, the data gradient's
    output channels) in pairs, one 32-bit word per pair, half the steps; with one channel a group
    there is no pair. (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", blocked.in_pairs)"""
    g, t = plan.geometry, plan.target
    return plan.problem.dtype is DType.BF16 and t.bf16_dot and (g.cin_g if plan.kop is KOp.FWD else g.cout_g) > 1


def _row_buffer(plan: Plan, pairs: bool) -> tuple[int, int, int, int, Callable[[int], int], int, int, str]:
    """What a work item's buffer of rows holds: (channels, columns, height, halo, span_of(rows),
    bytes per column and buffered row, the limit of the row blocks' buffer, what is written)."""
    g, t = plan.geometry, plan.target
    acc_bytes = plan.problem.dtype.accumulator.itemsize
    kw, dw, sw, pw = g.kernel[2], g.dilation[2], g.stride[2], g.pad_lo[2]
    kh, dh, sh = g.kernel[1], g.dilation[1], g.stride[1]
    budget = t.l2_bytes // 2
    if plan.kop is KOp.FWD:
        halo = ((kw - 1) * dw) // sw + 1

        def span_of(r: int) -> int:            # input rows that r consecutive output rows read
            return (r - 1) * sh + (kh - 1) * dh + 1
        # buffer bytes per output column and input row
        per_row = (math.ceil(g.cin_g / 2) if pairs else g.cin_g) * g.kernel[0] * sw * acc_bytes
        # the row blocks' buffer within a quarter of the L2: the weights stream through it as well
        # (figures: BENCHMARKS.md, "Figures behind codegen's CPU rules", blocked._row_buffer)
        return g.cout_g, g.y_size[2], g.y_size[1], halo, span_of, per_row, budget // 2, "output"
    halo = (sw - 1 + pw) // sw - (pw - (kw - 1) * dw) // sw

    def span_of(r: int) -> int:            # grad_output rows that r consecutive rows reach
        return (r - 1 + (kh - 1) * dh) // sh + 1
    # buffer bytes per grad_output column and row
    per_row = (math.ceil(g.cout_g / 2) if pairs else g.cout_g) * g.kernel[0] * acc_bytes
    return (g.cin_g, math.ceil(g.x_size[2] / sw), g.x_size[1], halo, span_of, per_row, budget,
            "input-gradient (per stride phase)")


def tile(plan: Plan) -> Plan:
    """Forward: KB output channels x NV vectors of output columns. Data gradient: KB input channels
    x NV vectors of input-gradient columns of one stride phase. Either way for RB rows per work
    item, which share one copy of the rows they read."""
    t = plan.target
    lanes = vector_lanes(plan)
    budget = t.l2_bytes // 2
    pairs = in_pairs(plan)
    channels, columns, height, halo, span_of, per_row, limit, what = _row_buffer(plan, pairs)
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
                                 f"{pairs_note}{rows_note}{cols} columns per work item so its buffer "
                                 f"({(cols + halo) * per_col} B) stays within half the L2; {tiling.threads_hint}",
                       tiling=tiling)


FAMILY = Family(NAME, WHY, TEMPLATES, tile)
