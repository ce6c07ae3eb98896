"""An x86 code shape as a test target: natively where this CPU runs its ISA, else compiled for this host;
and the code shapes this CPU runs natively (the host's and, on an AVX-512 host, AVX2's too).

A shape whose ISA the CPU lacks (AVX-512 on an AVX2-only CPU) is built with the host's -march:
GCC splits each wide vector into what the host has, so the same generated code runs and its
results are checked. Its tiles step in GCC vector code there: the assembly step (zmm registers)
cannot run on such a CPU. It is built at -O1: what is checked is the generated code's arithmetic
and indexing, not GCC's -O3 on a width the CPU cannot run (which CPUs with the ISA check natively).
Splitting 64-byte vectors costs GCC much time at -O3: measured on an AVX2-only AMD EPYC (family
23), -O1 builds these kernels 1.7-6x faster (a 3-D forward 30.5 s -> 5.0 s, the lanes weight
gradients of cpu/test_variants.py up to 68 s at -O3).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

from convgen.codegen.target import ISA_WIDTHS, Target, TargetKind, cpu_target, host_cpu, host_isas


@dataclasses.dataclass(frozen=True)
class ShapeForThisHost(Target):
    """A code shape (vector width, registers, caches) compiled for this host's ISA, in C vector code."""

    @property
    def march_flags(self) -> tuple[str, ...]:
        return (*host_cpu().march_flags, "-O1")   # after the build's -O3: the last -O wins

    @property
    def fma_asm(self) -> bool:
        return False


def x86_shape(isa: str, l1_bytes: int = 32 * 1024, l2_bytes: int = 1024 * 1024) -> Target:
    """The target of code shape `isa` ("avx512", "avx2"), native where this CPU runs it."""
    if isa in host_isas():
        return cpu_target(isa, l1_bytes, l2_bytes)
    return ShapeForThisHost(TargetKind.CPU, isa, ISA_WIDTHS[isa], 32 if isa == "avx512" else 16,
                            l1_bytes=l1_bytes, l2_bytes=l2_bytes)


def second_isa() -> str | None:
    """The x86 code shape this CPU runs besides the host's own ("avx2" on an AVX-512 host), if any."""
    other = [isa for isa in ("avx2", "avx512") if isa in host_isas() and isa != host_cpu().isa]
    return other[0] if other else None


def host_and_second(**second_options) -> Iterator[tuple[str, Target]]:
    """("host", the host's target) and, where this CPU runs a second x86 code shape, ("second", its
    target made with `second_options`)."""
    yield "host", host_cpu()
    isa = second_isa()
    if isa:
        yield "second", cpu_target(isa, **second_options)
