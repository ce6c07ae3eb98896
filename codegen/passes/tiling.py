"""Pass `tiling`: register and cache blocking from the target description.

- direct: each thread accumulates a block of rows of one plane; the block is as many rows as
  fit in half the L2 cache.
- blocked: a register tile of KB channels x NV vectors of columns. The choice scores every
  (KB, NV) that fits the register file by the fraction of lanes and channels doing useful work
  and by the FMA-to-load ratio of the micro-kernel; a work item covers as many columns as keep its
  input buffer within half the L2 cache.
A function of problem and target only.
"""

from __future__ import annotations

import math

from ..pipeline import Pass
from ..plan import KOp, Plan, Tiling


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


def register_tile(channels: int, columns: int, lanes: int, registers: int) -> tuple[int, int, float]:
    """Best (KB, NV, score) for a KB x NV-vector accumulator tile, one broadcast and NV loads in flight."""
    best = (1, 1, -1.0)
    for nv in range(1, 5):
        for kb in range(1, 17):
            if kb * nv + nv + 1 > registers:
                continue
            col_eff = columns / (math.ceil(columns / (nv * lanes)) * nv * lanes)
            ch_eff = channels / (math.ceil(channels / kb) * kb)
            fma_per_load = kb * nv / (kb + nv)          # loads: nv vectors + kb broadcasts per tap
            intensity = min(1.0, fma_per_load)          # FMA-bound once FMAs outnumber loads
            score = col_eff * ch_eff * intensity + 1e-3 * kb * nv
            if score > best[2]:
                best = (kb, nv, score)
    return best


def _blocked(plan: Plan, lanes: int) -> Plan:
    g, t = plan.geometry, plan.target
    acc_bytes = plan.problem.dtype.accumulator.itemsize
    kb, nv, score = register_tile(g.cout_g, g.y_size[2], lanes, t.vector_registers)
    owb = nv * lanes
    taps_rows = g.kernel[0] * g.kernel[1]
    halo = ((g.kernel[2] - 1) * g.dilation[2]) // g.stride[2] + 1
    per_col = g.cin_g * taps_rows * g.stride[2] * acc_bytes
    budget = t.l2_bytes // 2
    fit = max(owb, ((budget // max(per_col, 1)) - halo) // owb * owb)
    cols = min(math.ceil(g.y_size[2] / owb) * owb, fit)
    tiling = Tiling(vector_lanes=lanes, threads_hint="parallel over (batch, group, output row, column tile)",
                    kb=kb, nv=nv, cols=cols)
    return plan.decide("tiling", f"register tile {kb} channels x {nv} vectors of {lanes} columns "
                                 f"({kb * nv} of {t.vector_registers} registers accumulate; {score:.2f} useful); "
                                 f"{cols} columns per work item so its input buffer "
                                 f"({(cols + halo) * per_col} B) stays within half the L2; {tiling.threads_hint}",
                       tiling=tiling)


def run(plan: Plan) -> Plan:
    if plan.algorithm in ("empty", "reduce"):
        return plan.decide("tiling", "no tiling", tiling=None)
    lanes = max(1, plan.target.vector_bytes // plan.problem.dtype.accumulator.itemsize)
    if plan.algorithm == "blocked":
        return _blocked(plan, lanes)
    return _direct(plan, lanes)


PASS = Pass("tiling", run, requires=("layout", "groups"), provides=("tiling",), doc=__doc__)
