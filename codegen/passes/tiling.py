"""Pass `tiling`: how the accumulation plane of the direct kernels is blocked, from the target.

Each thread accumulates a block of rows of one output plane (FWD), input plane (DGRAD) or the
whole kernel window (WGRAD) in registers/L1-L2. The block is as many rows as fit in half the
target's L2 cache, so the plane being accumulated stays cached while the reduction sweeps it.
A function of problem and target only.
"""

from __future__ import annotations

import math

from ..pipeline import Pass
from ..plan import KOp, Plan, Tiling


def run(plan: Plan) -> Plan:
    if plan.algorithm in ("empty", "reduce"):
        return plan.decide("tiling", "no tiling", tiling=None)
    g, t = plan.geometry, plan.target
    acc_bytes = plan.problem.dtype.accumulator.itemsize
    lanes = max(1, t.vector_bytes // acc_bytes)
    if plan.kop is KOp.WGRAD:
        tiling = Tiling(rows_per_tile=0, row_tiles=1, vector_lanes=lanes,
                        threads_hint="parallel over (group, out channel, in channel); each thread owns its "
                                     "weight gradients, so the reduction order is fixed")
        return plan.decide("tiling", tiling.threads_hint, tiling=tiling)
    size = g.y_size if plan.kop is KOp.FWD else g.x_size
    rows = size[0] * size[1]
    row_bytes = size[2] * acc_bytes
    budget = t.l2_bytes // 2
    rows_per_tile = max(1, min(rows, budget // max(row_bytes, 1)))
    tiles = math.ceil(rows / rows_per_tile)
    what = "output" if plan.kop is KOp.FWD else "input-gradient"
    tiling = Tiling(rows_per_tile=rows_per_tile, row_tiles=tiles, vector_lanes=lanes,
                    threads_hint=f"parallel over (batch, channel, {what} row tile)")
    return plan.decide("tiling", f"{what} plane of {rows} rows x {size[2]} in tiles of {rows_per_tile} rows "
                                 f"({rows_per_tile * row_bytes} B accumulator, half of the {t.l2_bytes} B L2); "
                                 f"{tiling.threads_hint}; {lanes} SIMD lanes", tiling=tiling)


PASS = Pass("tiling", run, requires=("layout", "groups"), provides=("tiling",), doc=__doc__)
