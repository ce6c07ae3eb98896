"""The table of CPU kernel families: which module computes which (kernel op, algorithm), for the
`tiling` pass (a family's tile choice), the `algorithm` pass (a family's `why`) and the emitter (its
template and context). A new family is a module beside the others exporting `FAMILY` (family.py),
listed here; its `join` and `rule` take their places in passes/algorithm.py's JOINS and RULES.
"""

from __future__ import annotations

from ..plan import KOp
from . import (amx, blocked, depthwise, direct, flat, gemm, grouplanes, lanes, lanes_wgrad, planes, pointwise,
               pointwise_wgrad, reduce)
from .family import Family

FAMILIES: tuple[Family, ...] = (
    blocked.FAMILY, lanes.FAMILY, lanes_wgrad.FAMILY, direct.FAMILY, gemm.FAMILY, pointwise.FAMILY,
    pointwise_wgrad.FAMILY, grouplanes.FAMILY, depthwise.FAMILY, planes.FAMILY, amx.FAMILY, reduce.FAMILY,
    flat.FAMILY,
)

# algorithm -> how it computes, in one line of the plan's reason
WHY: dict[str, str] = {f.name: f.why for f in FAMILIES}
# (kernel op, algorithm) -> template under templates/
TEMPLATES: dict[tuple[KOp, str], str] = {(kop, f.name): t for f in FAMILIES for kop, t in f.templates.items()}


def find(kop: KOp, algorithm: str) -> Family | None:
    """The family computing `kop` with `algorithm`, or None where no CPU family does."""
    for f in FAMILIES:
        if f.name == algorithm and kop in f.templates:
            return f
    return None
