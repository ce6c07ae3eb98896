"""The passes: one module per pass, each exporting `PASS`, a `Pass` descriptor; codegen/pipeline.py
orders them by what they require and provide."""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..plan import Plan


@dataclasses.dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Plan], Plan]
    requires: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    doc: str = ""
