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

from .gpu_target import GpuArch, parse_gpu_arch
from .keys import canonical_json, sha256_text, to_jsonable


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
    bf16_dot: bf16 register tiles reduce in pairs with vdpbf16ps's arithmetic (two bf16 products
      added to an f32 lane): the instruction itself where tiles step in assembly (the CPU must
      have AVX512-BF16), an exact C emulation of it elsewhere (portable, for the tests).
    gpu: for CUDA/HIP targets the GpuArch (warp size, shared memory, registers, SMs, matrix
    instruction, async copy; see gpu_target.py); None for CPUs.
    """

    kind: TargetKind = TargetKind.CPU
    isa: str = "generic"
    vector_bytes: int = 16
    vector_registers: int = 16
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    bf16_dot: bool = False
    gpu: GpuArch | None = None

    def key(self) -> str:
        """sha256 of the canonical JSON form, leaving out what a target does not use: a CPU
        target's `gpu` and a target's bf16_dot when it is off. Targets from before either field
        existed keep their keys (and committed bundles' manifests theirs)."""
        fields = to_jsonable(self)
        if self.gpu is None:
            del fields["gpu"]
        if not self.bf16_dot:
            del fields["bf16_dot"]
        return sha256_text(canonical_json(fields))

    @property
    def warp_size(self) -> int:
        """Lanes per warp (wave) of a GPU target; 1 for a CPU."""
        return self.gpu.warp_size if self.gpu else 1

    @property
    def fma_asm(self) -> bool:
        """Whether register tiles step in x86 FMA3 assembly, which holds a 16-register tile exactly
        where GCC's vector code spills (AVX2 only: the AVX-512 shape is not measured)."""
        return self.kind is TargetKind.CPU and self.isa == "avx2"

    def name(self) -> str:
        return f"{self.kind.value}-{self.isa}" + ("+bf16" if self.bf16_dot else "")

    @property
    def march_flags(self) -> tuple[str, ...]:
        """Compiler flags that select the ISA; fixed per ISA so the cache key is portable."""
        if self.kind is not TargetKind.CPU:
            return ()
        flags = {
            "avx512": ("-march=x86-64-v4", "-mtune=generic"),
            "avx2": ("-march=x86-64-v3", "-mtune=generic"),
        }.get(self.isa, ())
        if self.bf16_dot and self.isa == "avx2":
            # vdpbf16ps is EVEX-encoded, so its register tiles may use all 32 vector registers:
            # AVX512-VL lets GCC allocate ymm16-31 (every CPU with AVX512-BF16 has it)
            flags += ("-mavx512vl",)
        return flags

    @property
    def evex_tiles(self) -> bool:
        """Whether register tiles stepped in assembly may use all 32 vector registers: AVX2 code built
        with AVX512-VL (bf16_dot: every CPU with AVX512-BF16 has it), whose EVEX encoding of the same
        256-bit instructions reaches ymm16-31."""
        return self.bf16_dot and self.fma_asm

    @property
    def tile_registers(self) -> int:
        """Vector registers a lanes register tile stepped in assembly may use: 32 with evex_tiles."""
        return 32 if self.evex_tiles else self.vector_registers


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


ISA_WIDTHS = {"avx512": 64, "avx2": 32, "generic": 16}   # vector bytes per CPU ISA level
_ISA_FLAGS = {"avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}, "avx2": {"avx2", "fma", "bmi2"}}


def cpu_target(isa: str, l1_bytes: int = 32 * 1024, l2_bytes: int = 1024 * 1024,
               bf16_dot: bool = False) -> Target:
    """The CPU target of ISA level `isa` (one of ISA_WIDTHS) with the given cache sizes."""
    return Target(TargetKind.CPU, isa, ISA_WIDTHS[isa], 32 if isa == "avx512" else 16,
                  l1_bytes=l1_bytes, l2_bytes=l2_bytes, bf16_dot=bf16_dot)


@functools.lru_cache(maxsize=1)
def _host_facts() -> tuple[tuple[str, ...], int, int]:
    """(the ISA levels this CPU runs, widest first; its L1 and L2 data cache bytes)."""
    caches = (_cache_bytes(1, 32 * 1024), _cache_bytes(2, 1024 * 1024))
    if platform.machine() not in ("x86_64", "AMD64"):
        return ("generic",), *caches
    flags = _cpu_flags()
    runs = tuple(isa for isa, needed in _ISA_FLAGS.items() if needed <= flags)
    if "avx2" not in runs:      # AVX-512 code is built for x86-64-v4, which includes AVX2
        runs = ()
    return (*runs, "generic"), *caches


def host_class() -> dict:
    """What kind of x86 host this is, for benchmark reports: the ISA levels it runs, whether it has
    AVX512-BF16 (native bf16 dot products, `vdpbf16ps`) and AVX512-FP16, and a short label such as
    "avx512+bf16" or "avx2" by which BENCHMARKS.md groups its tables."""
    runs = host_isas()
    flags = _cpu_flags()
    bf16, fp16 = "avx512_bf16" in flags, "avx512_fp16" in flags
    label = runs[0] + ("+bf16" if bf16 and runs[0] == "avx512" else "")
    return {"label": label, "isa_levels": list(runs), "avx512_bf16": bf16, "avx512_fp16": fp16}


def host_isas() -> tuple[str, ...]:
    """The CPU ISA levels this machine runs, widest first (always ending with "generic")."""
    return _host_facts()[0]


def default_isa(runs: tuple[str, ...]) -> str:
    """The ISA level generated for by default on a CPU that runs `runs`: AVX2 where it runs.

    On AVX-512 CPUs too: AVX2's code shape (16 registers, register tiles stepped in FMA3
    assembly) is the one whose tiles and algorithm choices were measured, and its VEX-encoded
    instructions run on every AVX-512 CPU. The AVX-512 shape (32 registers, tiles in GCC vector
    code) is correct (tests/test_variants.py runs it); on AMD Zen 4, which splits 512-bit FMAs
    into two 256-bit halves, it timed no faster overall (faster on unet3d, slower on dcgan_tconv
    and r50_stem's backward: BENCHMARKS.md, host class avx512+bf16), and its tiles spill where
    AVX2's do not. CONVGEN_ISA=avx512 opts in.
    """
    return "avx2" if "avx2" in runs else runs[0]


def host_cpu() -> Target:
    """The CPU target this process generates for: CONVGEN_ISA's level when set (it must be one
    this CPU runs), else `default_isa` of the CPU's levels; with this CPU's cache sizes."""
    from .. import knobs   # the environment is read in one place (runtime/knobs.py)
    from .errors import ConvgenError

    runs, l1, l2 = _host_facts()
    asked = knobs.isa()
    if asked and asked not in runs:
        raise ConvgenError(f"CONVGEN_ISA={asked!r}: this CPU does not run {asked} code (it runs "
                           f"{', '.join(runs)}); unset CONVGEN_ISA or pick one of those")
    isa = asked or default_isa(runs)
    return cpu_target(isa, l1, l2, bf16_dot=isa == "avx2" and host_bf16_dot() and knobs.bf16_dot())


@functools.lru_cache(maxsize=1)
def host_bf16_dot() -> bool:
    """Whether this CPU runs vdpbf16ps on 256-bit registers (AVX512-BF16 with AVX512-VL)."""
    flags = _cpu_flags()
    return {"avx512_bf16", "avx512vl"} <= flags


def isa_note(target: Target) -> str:
    """How `target`'s ISA level relates to this CPU's, for `convgen explain`."""
    if target.kind is not TargetKind.CPU:
        return "a GPU target"
    runs = host_isas()
    if target.isa not in runs:
        return f"this CPU does not run it (it runs {', '.join(runs)}): generated here, to be run elsewhere"
    if target.isa == default_isa(runs):
        wider = [isa for isa in runs if ISA_WIDTHS[isa] > ISA_WIDTHS[target.isa]]
        return ("this CPU's default" + (f"; {wider[0]} is opt-in (CONVGEN_ISA={wider[0]}): its code shape "
                                         f"is tested, and timed no faster overall on AMD Zen 4" if wider else ""))
    return f"chosen over this CPU's default ({default_isa(runs)})"


def parse_target(text: str) -> Target:
    """A target from its command-line spelling: cpu, cpu-avx2, cuda, cuda-sm_80, hip-gfx940, ...
    A GPU target without an arch takes sm_90 / gfx90a (present-device detection is the runtime's)."""
    from .errors import ConvSpecError

    kind_text, _, isa = text.partition("-")
    try:
        kind = TargetKind(kind_text)
    except ValueError:
        raise ConvSpecError(f"target: unknown target {text!r}; expected cpu, cpu-avx512, cpu-avx2, cpu-generic, "
                            f"cuda[-sm_80|-sm_86|-sm_89|-sm_90|-sm_90a] or hip[-gfx90a|-gfx940]") from None
    if kind is TargetKind.CPU:
        if not isa:
            return host_cpu()
        if isa not in ISA_WIDTHS:
            raise ConvSpecError(f"target: unknown CPU ISA {isa!r}; expected one of {sorted(ISA_WIDTHS)}")
        return cpu_target(isa)
    return gpu_target(parse_gpu_arch(text, kind.value, isa))


def gpu_target(arch: GpuArch) -> Target:
    """The Target of GPU arch `arch`; the CPU fields keep their defaults (vector_bytes 16: one
    128-bit load per thread) until the passes read GPU facts from `gpu`."""
    return Target(TargetKind(arch.vendor), arch.arch, 16, gpu=arch)
