"""Family `reduce`: the bias gradient alone, a per-channel sum over batch and pixels (KOp.BIAS; the
only candidate for it). No tiling: the template walks the tensor in its own order.
"""

from __future__ import annotations

from ..plan import KOp, Plan
from .family import Family

NAME = "reduce"
WHY = "per-channel reduction"
TEMPLATES = {KOp.BIAS: "cpu/reduce_bias.cpp.j2"}


def tile(plan: Plan) -> Plan:
    return plan.decide("tiling", "no tiling", tiling=None)


FAMILY = Family(NAME, WHY, TEMPLATES, tile)
