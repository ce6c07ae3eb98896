"""`Family`: what one CPU kernel family module gives the passes and the emitter. Each module under
codegen/cpu/ (lanes.py, blocked.py, ...) holds one family's whole story: its algorithm name, how it
computes (`why`), where it joins the candidates (`join`: its fit test) and its rule for taking over the choice
made so far (`rule`), its tile choice, and its template per kernel op. Its `FAMILY` (this
descriptor) goes into the table in families.py; passes/algorithm.py asks the families' `join` and
`rule` in its order, which is the heuristic."""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..plan import KOp, Plan
from .context import KernelContext, build


def joins_nowhere(plan: Plan, candidates: tuple[str, ...]) -> tuple[str, ...]:
    """A family that is one of the defaults (algorithm.py's CANDIDATES) adds nothing."""
    return candidates


def takes_nothing(plan: Plan, candidates: tuple[str, ...], choice: str, why: str) -> tuple[str, str]:
    """A family without a rule of its own leaves the choice as it is."""
    return choice, why


@dataclasses.dataclass(frozen=True)
class Family:
    name: str                                 # the algorithm name plans carry ("lanes", "blocked", ...)
    why: str                                  # how it computes, in one line of the plan's reason
    templates: dict[KOp, str]                 # kernel op -> template under templates/
    tile: Callable[[Plan], Plan]              # the `tiling` pass's decision for its plans
    context: Callable[[Plan, str], KernelContext] = build   # its templates' context (plan, entry symbol)
    # (plan, candidates so far) -> the candidates with this family where it fits
    join: Callable[[Plan, tuple[str, ...]], tuple[str, ...]] = joins_nowhere
    # (plan, candidates, choice so far, why) -> the choice and why, this family's where its rule says so
    rule: Callable[[Plan, tuple[str, ...], str, str], tuple[str, str]] = takes_nothing
