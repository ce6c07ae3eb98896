"""`KernelSource`: what the emitter hands to the builder — one C++ translation unit."""

from __future__ import annotations

import dataclasses

from .target import Target


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """One generated translation unit.

    name: readable and symbol-safe; the file stem of the source and of the artifact.
    text: the complete source text (its header comment names problem, key and reasons).
    entry: the `extern "C"` symbol that the runtime calls.
    signature: the entry's parameters as ("ptr" | "i64" | "i32", name) pairs, in order.
    target: the target it was generated for (its ISA becomes compiler flags and key).
    language: "c++" for CPU sources; "cuda" / "hip" for GPU sources.
    """

    name: str
    text: str
    entry: str
    signature: tuple[tuple[str, str], ...]
    target: Target
    language: str = "c++"
