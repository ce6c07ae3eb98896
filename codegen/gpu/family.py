"""`Family`: what the passes and the emitter ask of a GPU kernel family, as one record. Each family
module (direct.py, igemm.py, depthwise.py, stem.py) ends with its `FAMILY`; families.py lists them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..plan import GpuTiling, Plan


@dataclasses.dataclass(frozen=True)
class Family:
    """A GPU kernel family.

    name: the algorithm's name in plans. refusal(plan): why the family does not take the plan (the
    parameter, its value, the rule), None when it does. why(plan): why it computes the plan, in the
    algorithm pass's words. tiling(plan): its block and what each thread computes, with the tiling
    pass's reason. context(problem, target, prefix, *, threads, entries, staged): the template's
    context `c` (ConvSpecError for what the family does not take). template: under templates/.
    workspace(context): the entries that take scratch memory: `<prefix>_<entry>(pointers...,
    workspace, batch, stream)` with `<prefix>_<entry>_workspace_bytes(batch)`.
    """

    name: str
    refusal: Callable[[Plan], str | None]
    why: Callable[[Plan], str]
    tiling: Callable[[Plan], tuple[GpuTiling, str]]
    context: Callable[..., object]
    template: str
    workspace: Callable[[object], tuple[str, ...]]
