"""Family `direct`: per-thread accumulation planes and scalar taps, the candidate every problem has
(no fit test, no rule that chooses it: the reference the others are measured against).

Tiling: each thread accumulates a block of rows of one plane, as many rows as fit in half the L2;
the weight gradient gives each thread its own weight gradients.
"""

from __future__ import annotations

import math

from ..plan import KOp, Plan, Tiling
from .family import Family
from .work import vector_lanes

NAME = "direct"
WHY = "per-thread accumulation planes, scalar taps"
TEMPLATES = {KOp.FWD: "cpu/direct_fwd.cpp.j2", KOp.DGRAD: "cpu/direct_dgrad.cpp.j2",
             KOp.WGRAD: "cpu/direct_wgrad.cpp.j2"}


def tile(plan: Plan) -> Plan:
    g, t = plan.geometry, plan.target
    lanes = vector_lanes(plan)
    acc_bytes = plan.problem.dtype.accumulator.itemsize
    if plan.kop is KOp.WGRAD:
        tiling = Tiling(vector_lanes=lanes, threads_hint="parallel over (group, out channel, in channel); each thread "
                                                         "owns its weight gradients, so the reduction order is fixed")
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


FAMILY = Family(NAME, WHY, TEMPLATES, tile)
