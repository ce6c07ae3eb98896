"""Loadable GPU libraries: generated CUDA/HIP sources built by the vendor's compiler into a shared
library that ctypes loads (the device modules, devices/cuda.py and devices/hip.py, call its
`extern "C"` plan entries on torch's tensors).

    cuda   nvcc -shared -Xcompiler -fPIC -O3 -gencode arch=compute_XY,code=sm_XY ...  (cudart
           linked statically, nvcc's default: the library needs the driver, not a toolkit)
    hip    hipcc -x hip -shared -fPIC -O3 --offload-arch=gfxNNN ...  (always HIP_PLATFORM=amd)

One arch per kernel for the JIT (`build_library`, through the cache like every artifact: key
over source, command, the compiler's identity, target and convgen's version); several archs and
several sources in one fat library for an ahead-of-time bundle (`library_command`, run by
runtime/aot/gpu.py). The cubins and objects with the resource report are building/gpu_build.py's.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from . import cache
from .. import knobs
from .build import compiler_identity
from .gpu_build import _environment, compiler
from ..codegen.errors import BuildError
from ..codegen.source import KernelSource
from ..codegen.target import TargetKind
from ..stats import bump


def arch_flags(kind: TargetKind, archs: Sequence[str]) -> list[str]:
    """The flags that put machine code for each of `archs` into one library (a fat binary)."""
    if kind is TargetKind.CUDA:
        flags = []
        for arch in archs:
            number = arch.removeprefix("sm_")
            flags += ["-gencode", f"arch=compute_{number},code=sm_{number}"]
        return flags
    return [f"--offload-arch={arch}" for arch in archs]


def library_command(kind: TargetKind, archs: Sequence[str], sources: Sequence[str], out: str, exe: str) -> list[str]:
    """The vendor command that builds `sources` for `archs` into the shared library `out`."""
    if kind is TargetKind.CUDA:
        return [exe, "-shared", "-Xcompiler", "-fPIC", "-O3", *arch_flags(kind, archs), *sources, "-o", out]
    if kind is TargetKind.HIP:
        return [exe, "-x", "hip", "-shared", "-fPIC", "-O3", *arch_flags(kind, archs), *sources, "-o", out]
    raise BuildError(f"a {kind.value} target has no GPU library build")


def run(kind: TargetKind, argv: Sequence[str], cwd: Path | None, what: str) -> str:
    """Run a vendor compile; BuildError with its output and a one-line repro when it fails."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, env=_environment(kind), cwd=cwd,
                              stdin=subprocess.DEVNULL, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"could not run {argv[0]!r} for {what}: {e}") from e
    report = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        bump("build_failures")
        repro = ("HIP_PLATFORM=amd " if kind is TargetKind.HIP else "") + shlex.join(argv)
        raise BuildError(f"{what} failed to build (exit {done.returncode})\n  compiler output:\n"
                         + "\n".join("    " + line for line in report.splitlines()[:60])
                         + f"\n  command (repro): {f'cd {shlex.quote(str(cwd))} && ' if cwd else ''}{repro}")
    return report


def build_library(source: KernelSource, *, force: bool = False) -> Path:
    """The loadable library of one GPU KernelSource for its target's arch, from the cache or built now."""
    kind = source.target.kind
    if kind is TargetKind.CPU:
        raise BuildError(f"kernel {source.name}: a CPU source; build it with runtime/building/build.py")
    exe = compiler(kind)
    identity = compiler_identity([exe])
    template = library_command(kind, [source.target.isa], ["{src}"], "{out}", exe)
    key = cache.artifact_key(source.text, template, identity, source.target.key(), knobs.convgen_version())
    if not force:
        artifact = cache.lookup(key)
        if artifact is not None:
            bump("disk_hits")
            return artifact
    with cache.key_lock(key):
        if not force:
            artifact = cache.lookup(key)
            if artifact is not None:
                bump("disk_hits")
                return artifact
        workdir = cache.private_dir("gpu-library")
        try:
            src, out = workdir / f"{source.name}.cu", workdir / f"{source.name}.so"
            src.write_text(source.text, encoding="utf-8")
            argv = library_command(kind, [source.target.isa], [str(src)], str(out), exe)
            report = run(kind, argv, None, f"kernel {source.name} for {source.target.name()}")
            meta = {"entry": source.entry, "language": source.language, "compiler_identity": identity,
                    "target": source.target.name(), "target_key": source.target.key(),
                    "version": knobs.convgen_version(), "report": report, "command": template}
            artifact = cache.publish(key, source.name, out, src, meta)
            bump("builds")
            return artifact
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
