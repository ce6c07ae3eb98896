"""The SIMT simulator's build side: compile CUDA/HIP source for the CPU.

`templates/gpu/sim/simt.h` makes g++ compile the exact kernel source with CUDA's execution model
(one fiber per GPU thread; see that header). This module owns the compile flags (warp size per
vendor, the vendor wrapper headers, NVIDIA's half/bfloat16 headers), the digest of the
simulator's headers (part of every simulator build's cache key) and the precompiled header.
Loading such a library and calling it safely is the simulator device's (devices/sim.py).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from .. import knobs
from . import cache
from ..codegen.errors import ConvgenError
from ..codegen.keys import sha256_text

WARP = {"cuda": 32, "hip": 64}
SANITIZE = ("-fsanitize=address,undefined", "-fsanitize=bounds-strict", "-fno-omit-frame-pointer")
# The simulator's checks (sim/checks.h): every load and store of the kernel calls the library's own
# hooks (g++'s kernel-address instrumentation in call mode; no sanitizer runtime), -g1 gives the line
# tables that name an access's source line, -mtls-dialect=gnu2 makes the hooks' thread-local lookup a
# short call. Not with SANITIZE (ASan owns the same instrumentation).
INSTRUMENT = ("-fsanitize=kernel-address", "-fsanitize-recover=kernel-address",
              "--param=asan-instrumentation-with-call-threshold=0", "--param=asan-stack=0",
              "--param=asan-globals=0", "--param=asan-use-after-return=0")
RUNTIME_OBJECT = "runtime.o"


def gpu_templates_dir() -> Path:
    """The directory holding cuda.h, hip.h and sim/simt.h."""
    return Path(str(resources.files("convgen.templates"))) / "gpu"


@functools.lru_cache(maxsize=4)
def _nvcc_include(cuda_home: str | None, nvcc: str | None) -> Path | None:
    candidates = []
    if cuda_home:
        candidates.append(Path(cuda_home) / "include")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent / "include")
        try:   # nvcc on PATH may be a wrapper script: ask it where its toolkit is (no compile)
            text = subprocess.run([nvcc, "-dryrun", "-E", "-x", "cu", "/dev/null"], capture_output=True,
                                  text=True, timeout=30).stderr
            top = re.search(r"^#\$ TOP=(.*)$", text, re.M)
            if top:
                candidates.append(Path(top.group(1).strip()) / "include")
        except (OSError, subprocess.SubprocessError):
            pass
    for path in candidates:
        if (path / "cuda_fp16.h").is_file() and (path / "cuda_bf16.h").is_file():
            return path.resolve()
    return None


def fp16_include_dir() -> Path | None:
    """Where NVIDIA's cuda_fp16.h and cuda_bf16.h are (CUDA_HOME/CUDA_PATH, else nvcc's toolkit),
    or None: the simulator then has no __half/__nv_bfloat16 (f32/f64 kernels still build)."""
    home = knobs.cuda_home()
    return _nvcc_include(str(home) if home else None, shutil.which("nvcc"))


def check_flags() -> tuple[str, ...]:
    """The flags that build a library with the simulator's checks (sim/checks.h)."""
    return ("-DCONVGEN_SIM_CHECKS", *INSTRUMENT, "-mtls-dialect=gnu2",
            f"-Wl,--version-script={gpu_templates_dir() / 'sim' / 'hooks.map'}")


def compile_command(src: str, out: str, vendor: str, *, sanitize: bool = False,
                    cxx_argv: list[str] | None = None, debug: bool = True, pch: Path | None = None,
                    split: bool = False, checks: bool = True) -> list[str]:
    """The g++ command that builds `src` (CUDA or HIP source with cuda.h/hip.h, included or
    inline) into a shared library run by the simulator with `vendor`'s warp size; debug=False
    leaves out -g (a third of the compile time; the runtime's builds, whose simulator messages
    name sites by themselves). split=True compiles the kernel file against the simulator's
    declarations only (CONVGEN_SIM_SPLIT; see sim/simt.h). `pch`: a directory made by
    precompiled_header, with the same flags and split=True: its sim/simt.h.gch is searched before
    the headers themselves and its sim/runtime.o (the simulator's own functions) is linked in.
    checks=True (unless sanitize): the simulator's checks instrument every load and store
    (check_flags; sim/checks.h); False only to measure what they cost."""
    if vendor not in WARP:
        raise ConvgenError(f"simulator vendor {vendor!r}: expected one of {', '.join(WARP)}")
    include = fp16_include_dir()
    argv = list(cxx_argv) if cxx_argv is not None else knobs.cxx()
    if pch is not None and not split:
        raise ConvgenError("the simulator's precompiled directory holds the split build's header and object: "
                           "compile_command(pch=...) needs split=True")
    return [*argv, "-std=c++17", "-O1", *(["-g"] if debug or sanitize else []), "-fPIC", "-shared", "-pthread", "-x", "c++",
            "-DCONVGEN_SIM", f"-DCONVGEN_SIM_WARP={WARP[vendor]}", *(["-DCONVGEN_SIM_SPLIT"] if split else []),
            *(["-I", str(pch)] if pch else []), "-I", str(gpu_templates_dir()),
            *(["-isystem", str(include)] if include else []), *(SANITIZE if sanitize else ()),
            *(check_flags() if checks and not sanitize else ()),
            *(["-g1"] if checks and not (sanitize or debug) else []),
            src, *(["-x", "none", str(pch / "sim" / RUNTIME_OBJECT)] if pch else []), "-o", out]


@functools.lru_cache(maxsize=1)
def headers_digest() -> str:
    """sha256 over the simulator's headers (every sim/*.h, by name and text) and its hooks.map: part
    of a simulator build's cache key, since they are compiled into every such artifact (those cuda.h
    includes only under CONVGEN_SIM, wgmma.h and mbarrier.h, too: the kernel text inlines cuda.h, not
    them)."""
    import hashlib

    h = hashlib.sha256()
    sim = gpu_templates_dir() / "sim"
    for path in [*sorted(sim.glob("*.h")), sim / "hooks.map"]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _pch_key(vendor: str, cxx_argv: tuple[str, ...], identity: str) -> tuple[str, tuple[str, ...]]:
    """The precompiled header's cache key and its compile command (computed once per process)."""
    header = gpu_templates_dir() / "sim" / "simt.h"
    base = compile_command(str(header), "{out}", vendor, cxx_argv=list(cxx_argv), debug=False, split=True)
    return sha256_text(identity, shlex.join(base), headers_digest()), tuple(base)


def precompiled_header(vendor: str, cxx_argv: tuple[str, ...], root: str, identity: str) -> Path | None:
    """A directory under the cache `root` holding what every runtime build for the simulator
    shares, made with the runtime's flags for `vendor` (compile_command with debug=False,
    split=True): sim/simt.h.gch, the simulator header precompiled, and sim/runtime.o, the
    simulator's own functions (scheduler, collectives, launch) compiled once, to be linked into
    each kernel library (where they stay hidden: each library keeps its own copy). Built once per
    cache, compiler (`identity`: building/build.py's compiler_identity of `cxx_argv`) and header
    version (under a lock, published atomically). A kernel file then compiles only itself:
    measured on a 2-core AMD EPYC (family 23), 0.56 s instead of 2.0-2.3 s with the header alone
    precompiled (a gfx90a bf16 implicit-GEMM forward; 2.4-2.9 s with neither). None when either
    cannot be built: the builds then compile the whole simulator into each library, as g++ also
    does with a precompiled header that does not fit."""
    key, base = _pch_key(vendor, cxx_argv, identity)
    base = list(base)
    directory = Path(root) / "sim-pch" / key
    target, runtime = directory / "sim" / "simt.h.gch", directory / "sim" / RUNTIME_OBJECT
    if target.is_file() and runtime.is_file():
        return directory
    with cache.key_lock(key):
        if target.is_file() and runtime.is_file():
            return directory
        work = cache.private_dir("sim-pch")
        try:
            header = [a for a in base if a not in ("-shared", "{out}", "-o") and not a.startswith("-Wl,")]
            command = list(header)
            command[command.index("-x") + 1] = "c++-header"
            command += ["-o", str(work / "simt.h.gch")]
            source = work / "runtime.cpp"
            source.write_text('#include "sim/simt.h"\n')
            objects = [a if a != header[-1] else str(source) for a in header]
            objects = [a for a in objects if a not in INSTRUMENT]   # the simulator's own code: no hooks
            objects += ["-DCONVGEN_SIM_RUNTIME", "-c", "-o", str(work / RUNTIME_OBJECT)]
            for step in (command, objects):
                done = subprocess.run(step, capture_output=True, text=True, stdin=subprocess.DEVNULL)
                if done.returncode != 0:
                    if knobs.verbose():
                        print(f"convgen: the simulator's shared build did not compile:\n{shlex.join(step)}\n"
                              f"{done.stderr}")
                    return None
            for level in (directory.parent, directory, directory / "sim"):   # user-only, as the cache
                level.mkdir(exist_ok=True, mode=0o700)
            os.replace(work / RUNTIME_OBJECT, runtime)   # the object first: the header's presence is not enough
            os.replace(work / "simt.h.gch", target)
        except OSError:
            return None
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return directory
