"""The pass pipeline: passes declare what they require and provide; networkx orders them.

`lower(problem, target)` runs every registered pass in dependency order and returns the plan.
A pass whose requirement nobody provides fails here, before anything runs.
"""

from __future__ import annotations

import functools

import networkx as nx

from .errors import ConvgenError
from .ir import ConvProblem, Layout
from .plan import Plan
from .passes import Pass, algorithm, canonicalise, group_split, layout, tiling, validate
from .target import Target

# The passes of the first set, in no particular order: the graph decides the order.
PASS_MODULES = (validate, canonicalise, algorithm, layout, group_split, tiling)


def load_passes() -> list[Pass]:
    return [m.PASS for m in PASS_MODULES]


def order_passes(passes: list[Pass]) -> list[Pass]:
    providers: dict[str, str] = {}
    for p in passes:
        for fact in p.provides:
            if fact in providers:
                raise ConvgenError(f"pipeline: '{fact}' is provided by both {providers[fact]} and {p.name}")
            providers[fact] = p.name
    graph = nx.DiGraph()
    graph.add_nodes_from(p.name for p in passes)
    for p in passes:
        for need in p.requires:
            if need not in providers:
                raise ConvgenError(f"pipeline: pass {p.name} requires '{need}', which no pass provides "
                                   f"(provided: {sorted(providers)})")
            graph.add_edge(providers[need], p.name)
    if not nx.is_directed_acyclic_graph(graph):
        raise ConvgenError(f"pipeline: pass dependencies form a cycle: {nx.find_cycle(graph)}")
    by_name = {p.name: p for p in passes}
    # lexicographic tie-break keeps the order stable from run to run
    return [by_name[n] for n in nx.lexicographical_topological_sort(graph)]


@functools.lru_cache(maxsize=1)
def pipeline() -> tuple[Pass, ...]:
    return tuple(order_passes(load_passes()))


def lower(problem: ConvProblem, target: Target, algorithm: str | None = None, layout: Layout | None = None) -> Plan:
    """The plan for `problem` on `target`; `algorithm` picks one of the candidates instead of the heuristic,
    `layout` (CPU) the activations' internal layout instead of the layout pass's cost model (the kernel
    converts the caller's operands where they differ)."""
    plan = Plan(problem=problem, target=target, requested_algorithm=algorithm, requested_layout=layout)
    for p in pipeline():
        plan = p.run(plan).mark(p.name)
    return plan
