"""`Family`: what one CPU kernel family module gives the passes and the emitter. Each module under
codegen/cpu/ (lanes.py, blocked.py, ...) holds one family's whole story: its algorithm name, how it
computes (`why`), its fit test and its rules for taking over another family's choice (called by
name from passes/algorithm.py, which keeps their order), its tile choice, and its template per
kernel op. Its `FAMILY` (this descriptor) goes into the table in families.py."""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..plan import KOp, Plan
from .context import KernelContext, build


@dataclasses.dataclass(frozen=True)
class Family:
    name: str                                 # the algorithm name plans carry ("lanes", "blocked", ...)
    why: str                                  # how it computes, in one line of the plan's reason
    templates: dict[KOp, str]                 # kernel op -> template under templates/
    tile: Callable[[Plan], Plan]              # the `tiling` pass's decision for its plans
    context: Callable[[Plan, str], KernelContext] = build   # its templates' context (plan, entry symbol)
