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

from .arch.gpu import GpuArch, parse_gpu_arch
from .. import knobs   # the environment is read in one place (runtime/knobs.py)
from .arch.cpu import ISA_WIDTHS
from .errors import ConvgenError, ConvSpecError
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
    amx_bf16: bf16 kernels (forward, data and weight gradients) may multiply on AMX tiles (TDPBF16PS:
      16 x 32 bf16 by 32 x 16, f32 sums): natively in AVX-512 code (the CPU must have AMX-BF16), through a C emulation of the tile
      instructions in other code (portable, for the tests).
    gpu: for CUDA/HIP targets the GpuArch (warp size, shared memory, registers, SMs, matrix
    instruction, async copy; see arch/gpu.py); None for CPUs.
    """

    kind: TargetKind = TargetKind.CPU
    isa: str = "generic"
    vector_bytes: int = 16
    vector_registers: int = 16
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    bf16_dot: bool = False
    gpu: GpuArch | None = None
    amx_bf16: bool = False

    def key(self) -> str:
        """sha256 of the canonical JSON form, leaving out what a target does not use: a CPU
        target's `gpu` and a target's bf16_dot and amx_bf16 when they are off. Targets from before
        these fields existed keep their keys (and committed bundles' manifests theirs)."""
        fields = to_jsonable(self)
        if self.gpu is None:
            del fields["gpu"]
        if not self.bf16_dot:
            del fields["bf16_dot"]
        if not self.amx_bf16:
            del fields["amx_bf16"]
        return sha256_text(canonical_json(fields))

    @property
    def warp_size(self) -> int:
        """Lanes per warp (wave) of a GPU target; 1 for a CPU."""
        return self.gpu.warp_size if self.gpu else 1

    @property
    def fma_asm(self) -> bool:
        """Whether register tiles step in x86 assembly (FMA3, or vdpbf16ps for bf16 pairs), which holds
        a register tile exactly where GCC's vector code spills: on ymm registers for AVX2, on zmm for
        AVX-512 (the same mnemonics; the operands' width comes from the vector type)."""
        return self.kind is TargetKind.CPU and self.isa in ("avx2", "avx512")

    def name(self) -> str:
        return f"{self.kind.value}-{self.isa}" + ("+bf16" if self.bf16_dot else "") + ("+amx" if self.amx_bf16 else "")

    @property
    def march_flags(self) -> tuple[str, ...]:
        """Compiler flags that select the ISA; fixed per ISA so the cache key is portable."""
        if self.kind is not TargetKind.CPU:
            return ()
        flags = {
            # GCC 12's straight-line (SLP) vectorizer miscompiles some AVX-512 permutations: the
            # depthwise data gradient of a 2x2 f64 plane stored [out0, out1, out3, out4] with an in-lane
            # vpermilpd that cannot reach out4 (wrong results; -O1 and AVX2 right). The kernels' hot
            # loops are explicit vector code: without it the standard suite's kernels timed within
            # noise (Xeon, 27 kernels, 0.93-1.15x, median 1.00)
            "avx512": ("-march=x86-64-v4", "-mtune=generic", "-fno-tree-slp-vectorize"),
            "avx2": ("-march=x86-64-v3", "-mtune=generic"),
        }.get(self.isa, ())
        if self.bf16_dot and self.isa == "avx2":
            # vdpbf16ps is EVEX-encoded, so its register tiles may use all 32 vector registers:
            # AVX512-VL lets GCC allocate ymm16-31 (every CPU with AVX512-BF16 has it)
            flags += ("-mavx512vl",)
        if self.amx_native:
            flags += ("-mamx-tile", "-mamx-bf16", "-mavx512bf16")
        return flags

    @property
    def amx_native(self) -> bool:
        """Whether AMX kernels use the tile instructions themselves (AVX-512 code with amx_bf16); an
        amx_bf16 target of another ISA level runs the same kernels on a C emulation of them."""
        return self.kind is TargetKind.CPU and self.amx_bf16 and self.isa == "avx512"

    @property
    def evex_tiles(self) -> bool:
        """Whether register tiles stepped in assembly may use all 32 vector registers: AVX-512 code, and
        AVX2 code built with AVX512-VL (bf16_dot: every CPU with AVX512-BF16 has it), whose EVEX
        encoding of the same 256-bit instructions reaches ymm16-31."""
        return self.fma_asm and (self.isa == "avx512" or self.bf16_dot)

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


_ISA_FLAGS = {"avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}, "avx2": {"avx2", "fma", "bmi2"}}


def cpu_target(isa: str, l1_bytes: int = 32 * 1024, l2_bytes: int = 1024 * 1024,
               bf16_dot: bool = False, amx_bf16: bool = False) -> Target:
    """The CPU target of ISA level `isa` (one of ISA_WIDTHS) with the given cache sizes."""
    return Target(TargetKind.CPU, isa, ISA_WIDTHS[isa], 32 if isa == "avx512" else 16,
                  l1_bytes=l1_bytes, l2_bytes=l2_bytes, bf16_dot=bf16_dot, amx_bf16=amx_bf16)


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
    AVX512-BF16 (native bf16 dot products, `vdpbf16ps`), AVX512-FP16 and AMX-BF16 (tile matrix
    multiplies, which torch's oneDNN takes for bf16 convolutions: on such a host torch's bf16 runs
    past the f32 FMA peak; convgen's `amx` kernels use them too, see Target.amx_bf16), a short label
    such as "avx512+bf16", "avx512+bf16+amx" or "avx2" by which BENCHMARKS.md groups its tables, the
    CPU's vendor and family (which set the defaults: AVX-512 or AVX2, bf16 pairs or not) and the ISA
    level it defaults to."""
    runs = host_isas()
    flags = _cpu_flags()
    bf16, fp16 = "avx512_bf16" in flags, "avx512_fp16" in flags
    amx = {"amx_tile", "amx_bf16"} <= flags
    label = runs[0] + ("+bf16" if bf16 and runs[0] == "avx512" else "") + ("+amx" if amx and runs[0] == "avx512" else "")
    vendor, family = cpu_identity()
    return {"label": label, "isa_levels": list(runs), "avx512_bf16": bf16, "avx512_fp16": fp16, "amx_bf16": amx,
            "vendor": vendor, "family": family, "default_isa": default_isa(runs)}


def host_isas() -> tuple[str, ...]:
    """The CPU ISA levels this machine runs, widest first (always ending with "generic")."""
    return _host_facts()[0]


@functools.lru_cache(maxsize=1)
def cpu_identity() -> tuple[str, int]:
    """(vendor_id, cpu family) of this CPU from /proc/cpuinfo, e.g. ("AuthenticAMD", 25); ("", 0)
    where it cannot be read."""
    vendor, family = "", 0
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "vendor_id" and not vendor:
                    vendor = value
                elif key == "cpu family" and not family:
                    family = int(value) if value.isdigit() else 0
                if vendor and family:
                    break
    except OSError:
        pass
    return vendor, family


# AVX-512 is the default wherever it runs. Intel's AVX-512 server cores issue two 512-bit FMAs per
# cycle: on a Xeon (family 6 model 207) vfmadd231ps ran 5.9 per ns on zmm and 6.0 on ymm, twice the
# FLOPs, and the AVX-512 shape ran the standard suite at 0.94 / 1.02 of torch against AVX2's 0.59 /
# 0.60 (2 threads). AMD Zen 4 (family 0x19) runs a 512-bit FMA as two 256-bit halves, the same FLOPs
# as ymm, and the AVX2 shape was its default until the AVX-512 shape's 32-register tiles, in-place
# reads and tap-aligned tiles overtook it there: every suite, three runs each alternating the two,
# forward geomeans AVX2 / AVX-512: f32 standard 1.00-1.08 / 1.08-1.13, channels last 0.94-0.96 /
# 1.02-1.04, bf16 0.89-0.92 / 0.98-0.99; backward 0.99-1.01 / 1.03-1.07, 0.91-0.96 / 0.99-1.01,
# 0.96-0.97 / 1.03-1.05 (BENCHMARKS.md, 2026-11-29, Zen 4).

# Where vdpbf16ps (two bf16 products per f32 lane) beats bf16 widened to f32 FMAs: on Zen 4 it
# issues as often as an FMA, twice the products (BENCHMARKS.md, Zen 4); on the Xeon above it ran
# 1.4 per ns against the FMA's 5.9, half the products per cycle, and bf16 kernels ran 1.5-1.9x
# faster on f32 FMAs (r50_3x3_64 forward 6.8 ms against 11.2). AMD only, by that measure; Zen 4's
# AVX-512 shape, standard bf16 suite, pairs / f32 FMAs: 0.97 / 0.52 forward, 0.99-1.03 / 0.57 backward.
BF16_DOT_VENDORS = {"AuthenticAMD"}


def default_isa(runs: tuple[str, ...]) -> str:
    """The ISA level generated for by default on a CPU that runs `runs`: AVX-512 where it runs (Zen
    4's half-width 512-bit units included, see above), else AVX2 where it runs, else the widest it
    runs."""
    if "avx512" in runs:
        return "avx512"
    return "avx2" if "avx2" in runs else runs[0]


def host_cpu() -> Target:
    """The CPU target this process generates for: CONVGEN_ISA's level when set (it must be one
    this CPU runs), else `default_isa` of the CPU's levels; with this CPU's cache sizes, bf16
    reduced in pairs on vdpbf16ps where the CPU has it and it pays (BF16_DOT_VENDORS; CONVGEN_BF16_DOT
    overrides the choice), and bf16 kernels on AMX tiles in AVX-512 code where the CPU has AMX-BF16
    (CONVGEN_AMX=0 turns them off)."""
    runs, l1, l2 = _host_facts()
    asked = knobs.isa()
    if asked and asked not in runs:
        raise ConvgenError(f"CONVGEN_ISA={asked!r}: this CPU does not run {asked} code (it runs "
                           f"{', '.join(runs)}); unset CONVGEN_ISA or pick one of those")
    isa = asked or default_isa(runs)
    dot = knobs.bf16_dot()
    if dot is None:
        dot = cpu_identity()[0] in BF16_DOT_VENDORS
    amx = knobs.amx()
    return cpu_target(isa, l1, l2, bf16_dot=isa in ("avx2", "avx512") and host_bf16_dot() and dot,
                      amx_bf16=isa == "avx512" and host_amx() and (amx is None or amx))


@functools.lru_cache(maxsize=1)
def host_amx() -> bool:
    """Whether this CPU has AMX-BF16 tiles (TDPBF16PS) and AVX512-BF16 (the kernels' stores)."""
    return {"amx_tile", "amx_bf16", "avx512_bf16"} <= _cpu_flags()


@functools.lru_cache(maxsize=1)
def host_bf16_dot() -> bool:
    """Whether this CPU runs vdpbf16ps on 256- and 512-bit registers (AVX512-BF16 with AVX512-VL)."""
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
        return "this CPU's default: the widest level it runs"
    return f"chosen over this CPU's default ({default_isa(runs)})"


def parse_target(text: str) -> Target:
    """A target from its command-line spelling: cpu, cpu-avx2, cuda, cuda-sm_80, hip-gfx940, ...
    A GPU target without an arch takes sm_90 / gfx90a (present-device detection is the runtime's)."""
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
