"""What a kernel is generated for: the `Target` descriptor and host detection.

A target is data (kind, ISA, vector width, cache sizes) that the passes consult; it never
reads the machine by itself except in `host_cpu()`, which is the one place that does.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import platform

from .keys import canonical_key


class TargetKind(str, enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"
    HIP = "hip"


@dataclasses.dataclass(frozen=True)
class Target:
    """A code-generation target.

    isa: for CPUs one of "avx512", "avx2", "generic"; for GPUs the arch (e.g. "sm_90", "gfx90a").
    vector_bytes: SIMD register width in bytes (64 for AVX-512, 32 for AVX2, 16 otherwise).
    vector_registers: architectural SIMD registers (32 with AVX-512, 16 otherwise).
    """

    kind: TargetKind = TargetKind.CPU
    isa: str = "generic"
    vector_bytes: int = 16
    vector_registers: int = 16
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024

    def key(self) -> str:
        return canonical_key(self)

    @property
    def fma_asm(self) -> bool:
        """Whether register tiles step in x86 FMA3 assembly, which holds a 16-register tile exactly
        where GCC's vector code spills (AVX2 only: the AVX-512 path is not measured)."""
        return self.kind is TargetKind.CPU and self.isa == "avx2"

    def name(self) -> str:
        return f"{self.kind.value}-{self.isa}"

    @property
    def march_flags(self) -> tuple[str, ...]:
        """Compiler flags that select the ISA; fixed per ISA so the cache key is portable."""
        if self.kind is not TargetKind.CPU:
            return ()
        return {
            "avx512": ("-march=x86-64-v4", "-mtune=generic"),
            "avx2": ("-march=x86-64-v3", "-mtune=generic"),
        }.get(self.isa, ())


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cache_bytes(level: int, default: int) -> int:
    """The size of the level-`level` data (or unified) cache of CPU 0, from sysfs."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            path = os.path.join(base, entry)
            with open(os.path.join(path, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(path, "type")) as f:
                if f.read().strip() not in ("Data", "Unified"):
                    continue
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
            return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return default


@functools.lru_cache(maxsize=1)
def host_cpu() -> Target:
    """The CPU this process runs on: one of the ISA levels convgen generates for, and its caches."""
    caches = dict(l1_bytes=_cache_bytes(1, 32 * 1024), l2_bytes=_cache_bytes(2, 1024 * 1024))
    if platform.machine() not in ("x86_64", "AMD64"):
        return Target(TargetKind.CPU, "generic", 16, **caches)
    flags = _cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return Target(TargetKind.CPU, "avx512", 64, 32, **caches)
    if {"avx2", "fma", "bmi2"} <= flags:
        return Target(TargetKind.CPU, "avx2", 32, **caches)
    return Target(TargetKind.CPU, "generic", 16, **caches)


def parse_target(text: str) -> Target:
    """A target from its command-line spelling: cpu, cpu-avx2, cuda, hip, ..."""
    from .errors import ConvSpecError

    kind_text, _, isa = text.partition("-")
    try:
        kind = TargetKind(kind_text)
    except ValueError:
        raise ConvSpecError(f"target: unknown target {text!r}; expected cpu, cpu-avx512, cpu-avx2, cpu-generic, cuda or hip") from None
    if kind is TargetKind.CPU:
        if not isa:
            return host_cpu()
        widths = {"avx512": 64, "avx2": 32, "generic": 16}
        if isa not in widths:
            raise ConvSpecError(f"target: unknown CPU ISA {isa!r}; expected one of {sorted(widths)}")
        return Target(kind, isa, widths[isa], 32 if isa == "avx512" else 16)
    return Target(kind, isa or ("sm_90" if kind is TargetKind.CUDA else "gfx90a"), 16)
