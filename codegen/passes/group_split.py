"""Pass `group_split`: one kernel with a group loop, or per-group sub-problems.

On the CPU one kernel whose parallel loop runs over (batch, group, channel) keeps both cores
busy for any group count and avoids launching a kernel per group; depthwise problems keep their
own shape of that loop (one input channel per group).
"""

from __future__ import annotations

from . import Pass
from ..plan import Plan


def run(plan: Plan) -> Plan:
    g = plan.geometry
    if plan.algorithm in ("empty", "reduce"):
        return plan.decide("group_split", "no group structure to split", group_strategy="none")
    if plan.target.gpu is not None:
        if g.groups == 1:
            return plan.decide("group_split", "groups=1: no groups", group_strategy="single")
        return plan.decide("group_split", f"{g.groups} groups in one launch: each GPU thread finds its group from "
                                          f"its channel ({g.cin_g} in / {g.cout_g} out channels per group)",
                           group_strategy="depthwise" if g.cin_g == 1 else "loop")
    if g.groups == 1:
        return plan.decide("group_split", "groups=1: no group loop", group_strategy="single")
    if g.cin_g == 1:
        return plan.decide("group_split", f"depthwise: {g.groups} groups of one input channel "
                                          f"folded into the parallel channel loop", group_strategy="depthwise")
    return plan.decide("group_split", f"{g.groups} groups folded into the parallel loop of one kernel "
                                      f"({g.cin_g} in / {g.cout_g} out channels per group)", group_strategy="loop")


PASS = Pass("group_split", run, requires=("algorithm",), provides=("groups",), doc=__doc__)
