"""Every setting convgen reads from the environment, in one place.

Each setting is a function that reads its variable when called, never at import time, so a
test (or a user) can change the environment between calls. A bad value raises an error that
names the variable, the value and what would be accepted.

| variable               | function           | default                                   |
|------------------------|--------------------|-------------------------------------------|
| CONVGEN_CACHE_DIR      | cache_dir()        | $XDG_CACHE_HOME/convgen, ~/.cache/convgen |
| CONVGEN_GENERIC_DIR    | generic_dir()      | $XDG_DATA_HOME/convgen/generic, ~/.local/share/convgen/generic |
| CXX                    | cxx()              | c++                                       |
| CONVGEN_LOCK_TIMEOUT   | lock_timeout_s()   | 600 seconds                               |
| CONVGEN_BUILD_JOBS     | build_jobs()       | os.cpu_count()                            |
| CONVGEN_SCRATCH_MB     | scratch_mb()       | 256 (0: no pool of CPU buffers)           |
| CONVGEN_VERBOSE        | verbose()          | off                                       |
| CONVGEN_TUNE           | tune()             | off                                       |
| CONVGEN_JIT            | jit()              | background (eager, generic)               |
| CONVGEN_BUNDLES        | bundles()          | none                                      |
| CONVGEN_LAUNCHER       | launcher()         | on                                        |
| CONVGEN_ISA            | isa()              | avx512, avx2, generic (widest it runs)    |
| CONVGEN_BF16_DOT       | bf16_dot()         | AMD CPUs with AVX512-BF16 (not Intel's)   |
| CONVGEN_AMX            | amx()              | on where the CPU has AMX-BF16 (AVX-512)   |
| CONVGEN_SIM            | sim()              | unset: CPU kernels (cuda, hip: simulated) |
| CONVGEN_SIM_ORDER      | sim_order()        | forward (reverse, shuffle)                |
| CONVGEN_SIM_SEED       | sim_seed()         | 0 (the shuffle's seed)                    |
| CONVGEN_GPU_ARCH       | gpu_arch()         | the device's own arch (sm_90a on 9.0)     |
| CUDA_HOME, CUDA_PATH   | cuda_home()        | from nvcc on PATH (NVIDIA's fp16 headers) |
| CONVGEN_NVCC           | nvcc()             | nvcc on PATH, else $CUDA_HOME/bin/nvcc    |
| CONVGEN_HIPCC          | hipcc()            | hipcc on PATH, else $ROCM_PATH/bin/hipcc  |
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from convgen.codegen.version import generator_version
from convgen.codegen.errors import CacheError, ConvgenError
from convgen.codegen.arch.cpu import ISA_WIDTHS

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def _user_dir(variable: str, xdg: str, under_xdg: tuple[str, ...], under_home: tuple[str, ...], what: str,
              place: str) -> Path:
    """An absolute directory of the user's: $variable wins (a relative value is an error); otherwise
    $xdg / under_xdg, where a relative $xdg is ignored as the XDG spec says; otherwise ~ / under_home.
    Errors name it as `what` ("<what> location must not depend on ...") and `place` ("cannot place <place>")."""
    explicit = os.environ.get(variable, "")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_absolute():
            raise CacheError(
                f"{variable}={explicit!r} is a relative path; {what} location must not "
                f"depend on the working directory. Set {variable} to an absolute path."
            )
        return path
    base = os.environ.get(xdg, "")
    if base and Path(base).is_absolute():
        return Path(base).joinpath(*under_xdg)
    home = Path.home()
    if not home.is_absolute():
        raise CacheError(
            f"cannot place {place}: the home directory {str(home)!r} is not absolute. "
            f"Set {variable} to an absolute path."
        )
    return home.joinpath(*under_home)


def cache_dir() -> Path:
    """The kernel cache directory, always absolute (never relative to the working directory).

    CONVGEN_CACHE_DIR wins; a relative value is an error. Otherwise $XDG_CACHE_HOME/convgen,
    where a relative XDG_CACHE_HOME is ignored as the XDG spec says; otherwise ~/.cache/convgen.
    """
    return _user_dir("CONVGEN_CACHE_DIR", "XDG_CACHE_HOME", ("convgen",), (".cache", "convgen"), "the cache",
                     "the kernel cache")


def generic_dir() -> Path:
    """Where the shape-generic tier's libraries live (built by `convgen setup`, or once at first use),
    always absolute: a directory of the machine's, apart from the kernel cache, as a compiled
    extension is part of its installation, so that a new or cleared kernel cache does not rebuild
    them on a call's path. CONVGEN_GENERIC_DIR wins (a relative value is an error); otherwise
    $XDG_DATA_HOME/convgen/generic, where a relative XDG_DATA_HOME is ignored as the XDG spec says;
    otherwise ~/.local/share/convgen/generic.
    """
    return _user_dir("CONVGEN_GENERIC_DIR", "XDG_DATA_HOME", ("convgen", "generic"),
                     (".local", "share", "convgen", "generic"), "the generic kernels'", "the generic kernels")


def cxx() -> list[str]:
    """The host C++ compiler as an argument vector: $CXX split like a shell would, else c++."""
    value = os.environ.get("CXX", "").strip()
    argv = shlex.split(value) if value else []
    return argv or ["c++"]


def lock_timeout_s() -> float:
    """How long to wait for another process's build of the same kernel (CONVGEN_LOCK_TIMEOUT)."""
    return _number("CONVGEN_LOCK_TIMEOUT", 600.0, float, minimum=0.0)


def build_jobs() -> int:
    """How many compiles ninja runs in parallel (CONVGEN_BUILD_JOBS, default all CPUs)."""
    return _number("CONVGEN_BUILD_JOBS", os.cpu_count() or 1, int, minimum=1)


def scratch_mb() -> int:
    """How many MB of freed CPU kernel buffers (copies, packs, partial sums) the process keeps for
    the next call (CONVGEN_SCRATCH_MB, default 256; 0: every call allocates and frees its own)."""
    return _number("CONVGEN_SCRATCH_MB", 256, int, minimum=0)


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConvgenError(f"{name}={value!r} is not a boolean; use 1/true/yes/on or 0/false/no/off.")


def _flag_or_none(name: str) -> bool | None:
    """A boolean variable that may be left unset: None then (the caller's default), else _flag's."""
    if os.environ.get(name, "").strip() == "":
        return None
    return _flag(name)


def verbose() -> bool:
    """Whether to print build commands and compiler output to stderr (CONVGEN_VERBOSE)."""
    return _flag("CONVGEN_VERBOSE")


def tune() -> bool:
    """Whether a new problem times its candidate kernels and records the fastest (CONVGEN_TUNE)."""
    return _flag("CONVGEN_TUNE")


JIT_POLICIES = ("background", "eager", "generic")


def jit_set() -> bool:
    """Whether CONVGEN_JIT is set (the simulator follows it only then; unset, it builds the specialised
    kernels it is there to check)."""
    return bool(os.environ.get("CONVGEN_JIT", "").strip())


def jit() -> str:
    """How a CPU problem without a ready specialised kernel is served (CONVGEN_JIT): "background" (the
    default) runs the shape-generic kernel at once and builds the specialised one in the background;
    "eager" builds it on the call (benchmarks); "generic" runs the generic kernel only (tests)."""
    value = os.environ.get("CONVGEN_JIT", "").strip().lower() or "background"
    if value not in JIT_POLICIES:
        raise ConvgenError(f"CONVGEN_JIT={value!r} is not a policy; use one of {', '.join(JIT_POLICIES)} "
                           f"(or leave it unset for background).")
    return value


def launcher() -> bool:
    """Whether eager calls may use the compiled eager launcher (runtime/api/eager.py) when it is
    built (CONVGEN_LAUNCHER, default on; 0 keeps them on the Python path)."""
    return os.environ.get("CONVGEN_LAUNCHER", "").strip() == "" or _flag("CONVGEN_LAUNCHER")


def isa() -> str:
    """The CPU ISA level to generate for (CONVGEN_ISA: avx512, avx2 or generic), or "" for the
    default of codegen.target.default_isa. Whether this CPU runs it is checked by host_cpu()."""
    value = os.environ.get("CONVGEN_ISA", "").strip().lower()
    if value and value not in ISA_WIDTHS:
        raise ConvgenError(f"CONVGEN_ISA={value!r} is not an ISA level convgen generates for; use one of "
                           f"{', '.join(ISA_WIDTHS)}, or leave it unset for the default.")
    return value


def bf16_dot() -> bool | None:
    """Whether bf16 kernels reduce in pairs on the CPU's bf16 dot-product instruction (vdpbf16ps)
    where it has one (CONVGEN_BF16_DOT: 1 yes, 0 no: bf16 on f32 FMAs), or None when unset: the
    CPU's default (codegen.target.host_cpu: where vdpbf16ps outruns f32 FMAs)."""
    return _flag_or_none("CONVGEN_BF16_DOT")


def amx() -> bool | None:
    """Whether bf16 kernels may multiply on AMX tiles where the CPU has AMX-BF16 and AVX-512 code is
    generated (CONVGEN_AMX: 1 yes, 0 no), or None when unset (yes)."""
    return _flag_or_none("CONVGEN_AMX")


SIM_VENDORS = ("cuda", "hip")
_SIM_KEY = os.environ.encodekey("CONVGEN_SIM") if hasattr(os.environ, "encodekey") else "CONVGEN_SIM"


def sim() -> str:
    """The GPU vendor whose generated kernels convgen calls on CPU tensors run in the SIMT
    simulator (CONVGEN_SIM: cuda or hip, for that vendor's default arch, sm_90 or gfx90a), or ""
    when unset or empty: the CPU kernels. An arch may follow the vendor (cuda-sm_80, hip-gfx940:
    checked by parse_target). Read on every call (one environment lookup)."""
    try:   # os.environ's own table: a missing key costs no KeyError (os.environ.get costs ~1 µs then)
        if not os.environ._data.get(_SIM_KEY):
            return ""
    except AttributeError:
        pass
    value = os.environ.get("CONVGEN_SIM")
    if not value:
        return ""
    vendor = value.strip().lower()
    if vendor.partition("-")[0] not in SIM_VENDORS:
        raise ConvgenError(f"CONVGEN_SIM={value!r} is not a simulator vendor; use one of {', '.join(SIM_VENDORS)} "
                           f"(the generated CUDA or HIP kernels run in the SIMT simulator; an arch may follow, "
                           f"e.g. cuda-sm_80), or leave it unset for the CPU kernels.")
    return vendor


SIM_ORDERS = ("forward", "reverse", "shuffle")   # index = the code convgen_sim_configure takes


def sim_order() -> str:
    """The order in which the simulator runs threads and blocks (CONVGEN_SIM_ORDER): forward,
    reverse, or shuffle (seeded by CONVGEN_SIM_SEED); reverse and shuffle expose races."""
    value = os.environ.get("CONVGEN_SIM_ORDER", "").strip().lower() or "forward"
    if value not in SIM_ORDERS:
        raise ConvgenError(f"CONVGEN_SIM_ORDER={value!r} is not an order; use one of {', '.join(SIM_ORDERS)}.")
    return value


def sim_seed() -> int:
    """The seed of the simulator's shuffled order (CONVGEN_SIM_SEED, an integer >= 0)."""
    return _number("CONVGEN_SIM_SEED", 0, int, minimum=0)


def gpu_arch() -> str:
    """The arch whose kernels serve torch's CUDA (or ROCm) devices (CONVGEN_GPU_ARCH, e.g. sm_90 on a
    Hopper part, served by sm_90a otherwise), or "" when unset: the device's own arch (devices/cuda.py).
    devices/cuda.py checks that the device runs that arch's machine code."""
    return os.environ.get("CONVGEN_GPU_ARCH", "").strip().lower()


def cuda_home() -> Path | None:
    """The CUDA toolkit directory: CUDA_HOME, else CUDA_PATH, else None (callers then look for
    nvcc on PATH). The simulator takes NVIDIA's cuda_fp16.h/cuda_bf16.h from its include/."""
    for name in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(name, "").strip()
        if value:
            return Path(value).expanduser()
    return None


def nvcc() -> str | None:
    """NVIDIA's compiler for `convgen build --target cuda-...`: CONVGEN_NVCC, else nvcc on PATH,
    else $CUDA_HOME/bin/nvcc (or CUDA_PATH's); None when none exists."""
    import shutil

    explicit = os.environ.get("CONVGEN_NVCC", "").strip()
    if explicit:
        return explicit
    found = shutil.which("nvcc")
    home = cuda_home()
    if found is None and home is not None and (home / "bin" / "nvcc").is_file():
        found = str(home / "bin" / "nvcc")
    return found


def hipcc() -> str | None:
    """AMD's compiler for `convgen build --target hip-...`: CONVGEN_HIPCC, else hipcc on PATH,
    else $ROCM_PATH/bin/hipcc; None when none exists. It always runs with HIP_PLATFORM=amd."""
    import shutil

    explicit = os.environ.get("CONVGEN_HIPCC", "").strip()
    if explicit:
        return explicit
    found = shutil.which("hipcc")
    rocm = os.environ.get("ROCM_PATH", "").strip()
    if found is None and rocm and (Path(rocm) / "bin" / "hipcc").is_file():
        found = str(Path(rocm) / "bin" / "hipcc")
    return found


def bundles_env() -> str:
    return os.environ.get("CONVGEN_BUNDLES", "")


def bundles() -> list[Path]:
    """Ahead-of-time bundle directories to load on first dispatch (CONVGEN_BUNDLES, separated by
    os.pathsep, e.g. generated/resnet18:generated/unet). A relative path is taken from the
    working directory when it is read."""
    return [Path(part).expanduser() for part in bundles_env().split(os.pathsep) if part.strip()]


def convgen_version() -> str:
    """convgen's installed version (part of every cache key and generated header)."""
    return generator_version()


def _number(name: str, default, kind, *, minimum):
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or value < minimum or value != value:  # value != value: NaN
        kind_name = "an integer" if kind is int else "a number"
        raise ConvgenError(
            f"{name}={text!r} is not valid; it must be {kind_name} >= {minimum} (default {default})."
        )
    return value
