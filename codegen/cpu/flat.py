"""Family `flat`: the forward and data gradient of depthwise problems (one channel per group on both
sides) of few channels in channels last, at unit stride along the rows: a row's (column, channel)
values are one flat run, taken a vector at a time, so every lane is useful however few the
channels (an RGB image's 3), where channels in the lanes (grouplanes) would leave most of them idle
and pixels in the lanes (the planes and blocked kernels) would gather each channel's values from
every C-th place. A lane's channel is its flat index modulo C: each tap's weights are a few vector
patterns (templates/cpu/flat.j2). Where it fits it is the choice.
"""

from __future__ import annotations

import math

from ..ir import Layout
from ..plan import KOp, Plan, Tiling
from .family import Family
from .grouplanes import few_channels
from .work import MIN_ITEMS, SPARE_REGISTERS, vector_lanes

NAME = "flat"
WHY = ("depthwise rows of few channels in channels last as flat runs of (column, channel) values in the "
       "vector lanes, each tap's weights a few lane patterns")
TEMPLATES = {KOp.FWD: "cpu/flat_fwd.cpp.j2", KOp.DGRAD: "cpu/flat_dgrad.cpp.j2"}

# Vectors of a register tile, at most (whole periods of the weight patterns).
FLAT_VECTORS = 16


def fits(plan: Plan) -> bool:
    """A forward or data gradient of one channel per group on both sides, input and output channels
    last, unit stride along the rows (so consecutive results read consecutive values), channels
    fewer than half a vector (grouplanes.few_channels)."""
    g = plan.geometry
    return (plan.kop in (KOp.FWD, KOp.DGRAD) and g.cin_g == 1 and g.cout_g == 1 and g.stride[2] == 1 and
            all(plan.layout_of(kind) is Layout.CHANNELS_LAST for kind in ("X", "Y")) and
            few_channels(plan) is not None)


def patterns(channels: int, lanes: int) -> int:
    """Weight patterns per tap: the lanes' channels repeat every `channels` flat values, a vector's
    start every `lanes`, so vector j takes pattern j % (channels / gcd(channels, lanes))."""
    return channels // math.gcd(channels, lanes)


def tile(plan: Plan) -> Plan:
    g, t = plan.geometry, plan.target
    lanes = vector_lanes(plan)
    nph = patterns(g.groups, lanes)
    # the accumulators, a tap's patterns and one loaded vector, SPARE_REGISTERS left free
    periods = max(1, min(FLAT_VECTORS // nph, (t.vector_registers - SPARE_REGISTERS - nph - 1) // nph))
    rt = periods * nph
    written = g.y_size if plan.kop is KOp.FWD else g.x_size
    vectors = math.ceil(written[2] * g.groups / lanes)
    rows = written[0] * written[1]
    # a row per work item, or parts of rows (whole tiles) where an image has fewer than MIN_ITEMS rows
    parts = max(1, min(math.ceil(MIN_ITEMS / rows), math.ceil(vectors / rt)))
    chunk = vectors if parts == 1 else math.ceil(math.ceil(vectors / parts) / rt) * rt
    chunk = math.ceil(chunk / nph) * nph
    what = "output" if plan.kop is KOp.FWD else "input-gradient"
    tiling = Tiling(vector_lanes=lanes, nv=rt, ksb=chunk,
                    threads_hint=f"parallel over (batch, {what} row, part of {chunk} vectors of the row)")
    return plan.decide("tiling", f"each {what} row's {written[2]} x {g.groups} (column, channel) values one flat "
                                 f"run of {vectors} vectors of {lanes}; register tile {rt} vectors ({nph} weight "
                                 f"pattern{'s' if nph > 1 else ''} a tap in registers), the row's ends lane by lane "
                                 f"where taps reach its padding; {tiling.threads_hint}", tiling=tiling)


def join(plan: Plan, candidates: tuple[str, ...]) -> tuple[str, ...]:
    """First, where it fits."""
    return (NAME,) + candidates if fits(plan) else candidates


def rule(plan: Plan, candidates: tuple[str, ...], choice: str, why: str) -> tuple[str, str]:
    """Its kernel ops wherever it fits: on the RGB filter it ran faster than every other candidate
    (figures: BENCHMARKS.md, 2026-12-02 (fourth session), "flat rows of few channels")."""
    return (NAME, WHY) if NAME in candidates else (choice, why)


FAMILY = Family(NAME, WHY, TEMPLATES, tile, join=join, rule=rule)
