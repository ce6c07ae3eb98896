"""Builds of generated GPU sources by the vendors' own compilers, for `convgen build --target
cuda-...|hip-...`: nvcc to a cubin, hipcc (always with HIP_PLATFORM=amd, without which hipcc
hands the file to nvcc) to an object with the AMD GPU code. The compiler's resource report
(registers, shared memory, spills: `-Xptxas -v`; hipcc's `-Rpass-analysis=kernel-resource-usage`)
is kept with the artifact; ptxas treats spills as errors (`-warn-spills` with `-Werror`).

Artifacts go through the same cache as every kernel (key: source, command, the compiler's
identity, target, version; published atomically). The SIMT simulator's builds are runtime/building/build.py's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from . import cache
from .. import knobs
from .build import compiler_identity
from ..codegen.errors import BuildError
from ..codegen.source import KernelSource
from ..codegen.target import TargetKind
from ..stats import bump


@dataclasses.dataclass(frozen=True)
class GpuArtifact:
    path: Path
    report: str      # the compiler's resource report (its output)
    command: str     # the compile command, a one-line repro


_HOW = {TargetKind.CUDA: ("nvcc", "CONVGEN_NVCC", "put nvcc on PATH or set CUDA_HOME (the CUDA toolkit) to build "
                                                   "cuda targets"),
        TargetKind.HIP: ("hipcc", "CONVGEN_HIPCC", "put hipcc on PATH or set ROCM_PATH to build hip targets "
                                                   "(Debian/Ubuntu: apt-get install -y --no-install-recommends hipcc "
                                                   "libamdhip64-dev)")}


def compiler(kind: TargetKind) -> str:
    """The vendor compiler's path; BuildError naming it (and how to provide it) when missing."""
    name, variable, how = _HOW[kind]
    found = knobs.nvcc() if kind is TargetKind.CUDA else knobs.hipcc()
    if not found:
        raise BuildError(f"{name} not found: set {variable}, or {how}")
    if shutil.which(found) is None:
        origin = f"from {variable}" if os.environ.get(variable, "").strip() else "found on this machine"
        raise BuildError(f"{name} {found!r} ({origin}) does not exist or is not executable: set {variable} to "
                         f"{name}'s path, or {how}")
    return found


def command(source: KernelSource, src: str, out: str, exe: str) -> list[str]:
    """The vendor compile command for `source` (its target's arch)."""
    arch = source.target.isa
    if source.target.kind is TargetKind.CUDA:
        return [exe, "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-Xptxas", "-warn-spills", "-Xptxas", "-Werror",
                src, "-o", out]
    return [exe, "-x", "hip", f"--offload-arch={arch}", "-c", "-O3", "-Rpass-analysis=kernel-resource-usage",
            src, "-o", out]


def _environment(kind: TargetKind) -> dict[str, str]:
    env = dict(os.environ)
    if kind is TargetKind.HIP:
        env["HIP_PLATFORM"] = "amd"
    return env


def build_gpu(source: KernelSource, *, force: bool = False) -> GpuArtifact:
    """Compile `source` (a CUDA or HIP KernelSource) with its vendor's compiler, through the cache."""
    kind = source.target.kind
    if kind is TargetKind.CPU:
        raise BuildError(f"kernel {source.name}: a CPU source; build it with runtime/building/build.py")
    exe = compiler(kind)
    identity = compiler_identity([exe])
    suffix = ".cubin" if kind is TargetKind.CUDA else ".o"
    key = cache.artifact_key(source.text, command(source, "{src}", "{out}", exe), identity, source.target.key(),
                             knobs.convgen_version())
    if not force:
        artifact = cache.lookup(key)
        if artifact is not None:
            bump("disk_hits")
            meta = json.loads((artifact.parent / "meta.json").read_text(encoding="utf-8"))
            return GpuArtifact(artifact, meta.get("report", ""), meta.get("repro", ""))
    with cache.key_lock(key):
        workdir = cache.private_dir("gpu-build")
        try:
            src, out = workdir / f"{source.name}.cu", workdir / f"{source.name}{suffix}"
            src.write_text(source.text, encoding="utf-8")
            argv = command(source, str(src), str(out), exe)
            try:
                done = subprocess.run(argv, capture_output=True, text=True, env=_environment(kind),
                                      stdin=subprocess.DEVNULL, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise BuildError(f"could not run {exe!r} for kernel {source.name}: {e}") from e
            report = (done.stdout + done.stderr).strip()
            repro = ("HIP_PLATFORM=amd " if kind is TargetKind.HIP else "") + shlex.join(argv)
            if done.returncode != 0 or not out.is_file():
                bump("build_failures")
                failed = cache.root() / "failed"
                kept = failed / src.name
                kept.write_text(source.text, encoding="utf-8")
                raise BuildError(f"kernel {source.name} failed to build for {source.target.name()} (exit "
                                 f"{done.returncode})\n  source: {kept}\n  compiler output:\n"
                                 + "\n".join("    " + line for line in report.splitlines()[:60])
                                 + f"\n  command (repro): {repro.replace(str(src), str(kept))}")
            meta = {"entry": source.entry, "language": source.language, "compiler_identity": identity,
                    "target": source.target.name(), "target_key": source.target.key(),
                    "version": knobs.convgen_version(), "report": report, "repro": repro,
                    "command": command(source, "{src}", "{out}", exe)}
            artifact = cache.publish(key, source.name, out, src, meta)
            bump("builds")
            return GpuArtifact(artifact, report, repro)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def resource_summary(report: str) -> list[str]:
    """The report's lines about registers, shared memory (LDS), spills and stack, per kernel
    (hipcc's remarks without their file position and flag)."""
    keys = ("registers", "spill", "smem", "shared", "lds", "sgpr", "vgpr", "scratch", "occupancy", "function properties",
            "compiling entry", "function name")
    lines = []
    for line in report.splitlines():
        if not any(k in line.lower() for k in keys):
            continue
        if "remark:" in line:
            line = line.split("remark:", 1)[1].replace("[-Rpass-analysis=kernel-resource-usage]", "")
        lines.append(line.strip())
    return lines
