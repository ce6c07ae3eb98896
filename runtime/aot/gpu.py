"""Ahead-of-time GPU kernels: problems -> `.cu` sources and a GPU manifest beside a bundle's CPU
ones -> the libraries dispatch/gpu_bundle.py serves with zero builds.

For each GPU target (cuda-sm_80, cuda-sm_90, hip-gfx90a, ...) `generate_gpu` lowers every problem
as that target computes it (on CUDA an f32 problem both with tf32 and without, as torch's switch
may be either way where the bundle is loaded) for that arch and writes kernels/TARGET/NAME.cu and gpu-manifest.json (rewriting only files whose
content changes). `build_gpu` then runs ONE ninja build (build/gpu.ninja) that makes

    build/gpu/VENDOR.so          a fat library per vendor: each target's kernels compiled by the
                                 vendor's compiler for its arch (objects under build/gpu/obj/),
                                 linked into one library (building/gpu_library.py's flags)
    build/sim/TARGET/NAME.so     each kernel for the SIMT simulator (building/sim_build.py)

and records what it built in build/gpu-build.json (written last: the bundle's commit marker).
A vendor compiler that is missing is a BuildError naming it, unless `device=False` (simulator
builds only: the bundle then serves CONVGEN_SIM but no device; the record says so).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Sequence

from ..building import build as builder
from ..building import gpu_library, sim_build
from ..building.gpu_build import compiler
from ..codegen.emit import emit
from ..codegen.errors import BuildError, ConvgenError
from ..codegen.ir import ConvProblem, DType
from ..codegen.pipeline import lower
from ..codegen.target import Target, TargetKind
from ..dispatch import gpu_bundle
from ..dispatch.problem import gpu_problem
from .. import knobs
from ..stats import bump


def generate_gpu(problems: Sequence[ConvProblem], out: str | Path, targets: Sequence[Target], *,
                 name: str | None = None, origin: dict | None = None) -> dict:
    """Write each GPU target's sources and the GPU manifest of bundle `out`; returns the manifest."""
    out = Path(out)
    name = name or out.name
    parts, files = {}, {}
    for target in targets:
        if target.kind is TargetKind.CPU:
            raise ConvgenError(f"target {target.name()}: generate_gpu takes GPU targets (cuda-..., hip-...)")
        tname = target.name()
        kernels: dict[str, dict] = {}
        listed = []
        for p in _as_computed(problems, target):
            plan = lower(p, target)
            source = emit(plan)
            kernel = None
            if source is not None:
                text = gpu_bundle.arch_entries(source.text, source.name, target.isa)
                entry = gpu_bundle.arch_entries(source.entry, source.name, target.isa)
                digest = gpu_bundle.sha256(text)
                file = f"kernels/{tname}/{source.name}.cu"
                known = kernels.get(source.name)
                if known is not None and known["sha256"] != digest:
                    raise ConvgenError(f"bundle {name}: two different {tname} kernels share the name {source.name}")
                kernels[source.name] = {
                    "name": source.name, "file": file, "sha256": digest, "entry": entry,
                    "signature": [list(s) for s in source.signature], "kernel_key": p.kernel_key(),
                    "op": p.op.value, "algorithm": plan.algorithm, "decisions": [list(r) for r in plan.reasons]}
                files[file] = text
                kernel = source.name
            listed.append({"problem": json.loads(p.to_json()), "name": p.name(), "key": p.key(), "kernel": kernel})
        kernel_list = sorted(kernels.values(), key=lambda k: k["name"])
        parts[tname] = {"target": gpu_bundle.target_to_dict(target), "kernels": kernel_list, "problems": listed,
                        "kernel_set": gpu_bundle.kernel_set(kernel_list),
                        "library": gpu_bundle.library_file(tname),
                        "object_command": shlex.join(_object_command(target, "{file}", "{object}", "{exe}"))}
    manifest = {"format": gpu_bundle.FORMAT, "name": name, "generator_version": knobs.convgen_version(),
                "origin": origin or {}, "targets": parts}
    files[gpu_bundle.MANIFEST] = json.dumps(manifest, indent=1) + "\n"
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        builder.write_if_changed(out / rel, text)
    for tname in parts:   # stale sources of a target
        for stale in (out / "kernels" / tname).glob("*.cu"):
            if f"kernels/{tname}/{stale.name}" not in files:
                stale.unlink()
    return manifest


def _as_computed(problems: Sequence[ConvProblem], target: Target) -> list[ConvProblem]:
    """The problems as `target` computes them (dispatch/problem.py's gpu_problem): on CUDA an f32
    problem twice, with tf32 allowed and not, so that the bundle serves it whichever way
    torch.backends.cudnn.allow_tf32 is set where it is loaded (its problems are keyed by it)."""
    computed: dict[str, ConvProblem] = {}
    for p in problems:
        p.validate()
        variants = [dataclasses.replace(p, tf32=allowed) for allowed in (True, False)] \
            if target.kind is TargetKind.CUDA and p.dtype is DType.F32 else [gpu_problem(p, target.kind)]
        for v in variants:
            computed.setdefault(v.key(), v)
    return list(computed.values())


def _object_command(target: Target, file: str, obj: str, exe: str) -> list[str]:
    """One kernel's object for its target's arch (-c: linked into the vendor's library later)."""
    argv = gpu_library.library_command(target.kind, [target.isa], [file], obj, exe)
    return [a if a != "-shared" else "-c" for a in argv]


def _object_file(target_name: str, kernel: dict) -> str:
    return f"build/gpu/obj/{target_name}/{kernel['name']}.o"


def _ninja_file(manifest: dict, device: bool) -> tuple[str, dict]:
    """build/gpu.ninja and the build record it makes."""
    def edge(out: str, inputs: Sequence[str], command: Sequence[str], env: str = "") -> list[str]:
        return [f"build {out}: run {' '.join(inputs)}", f"  cmd = {env}{shlex.join(command).replace('$', '$$')}", ""]

    lines = [f"# written by convgen {knobs.convgen_version()} for the GPU kernels of bundle {manifest['name']}",
             "ninja_required_version = 1.3", "", "rule run", "  command = $cmd", "  description = $out", ""]
    record, outputs, objects = {}, [], {}
    for tname, part in manifest["targets"].items():
        target = gpu_bundle.target_from_dict(part["target"])
        vendor = target.kind.value
        env = "HIP_PLATFORM=amd " if target.kind is TargetKind.HIP else ""
        if part["kernels"] and device:
            exe = compiler(target.kind)   # BuildError naming nvcc/hipcc when missing
            lib = gpu_bundle.library_file(tname)
            for k in part["kernels"]:
                obj = _object_file(tname, k)
                lines += edge(obj, [k["file"]], _object_command(target, k["file"], obj, exe), env)
                objects.setdefault(lib, (target.kind, exe, env, []))[3].append(obj)
        for k in part["kernels"]:
            sim = gpu_bundle.sim_file(tname, k["name"])
            lines += edge(sim, [k["file"]], sim_build.compile_command(k["file"], sim, vendor, debug=False))
            outputs.append(sim)
        record[tname] = {"kernel_set": part["kernel_set"], "library": bool(part["kernels"]) and device,
                         "sim": bool(part["kernels"])}
    for lib, (kind, exe, env, objs) in objects.items():   # one fat library per vendor
        link = [exe, "-shared", *(["-fPIC"] if kind is TargetKind.HIP else ["-Xcompiler", "-fPIC"]), *objs, "-o", lib]
        lines += edge(lib, objs, link, env)
        outputs.append(lib)
    lines.append(f"default {' '.join(outputs) if outputs else 'build/gpu.ninja'}")
    return "\n".join(lines) + "\n", record


def build_gpu(out: str | Path, *, device: bool = True, jobs: int | None = None) -> int:
    """Build the GPU kernels of bundle `out` (already generated) in one ninja run; returns the
    number of steps that ran (0: up to date). Writes build/gpu-build.json last."""
    out = Path(out).resolve()
    manifest = gpu_bundle.read(out)
    if manifest is None:
        raise ConvgenError(f"{out}: no {gpu_bundle.MANIFEST} here; generate it with `convgen aot --target cuda-...`")
    text, record = _ninja_file(manifest, device)
    for tname in manifest["targets"]:
        (out / "build" / "gpu" / "obj" / tname).mkdir(parents=True, exist_ok=True)
        (out / "build" / "sim" / tname).mkdir(parents=True, exist_ok=True)
    builder.write_if_changed(out / "build" / "gpu.ninja", text)
    argv = [builder.find_ninja(), "-f", "build/gpu.ninja", "-k", "0", "-j", str(jobs or knobs.build_jobs())]
    bump("ninja_runs")
    try:
        done = subprocess.run(argv, cwd=out, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              env={**os.environ, "NINJA_STATUS": "[%f/%t] "})
    except OSError as e:
        raise BuildError(f"could not run ninja ({shlex.join(argv)}): {e}") from e
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-80:])
        raise BuildError(f"GPU bundle build failed in {out} (ninja exit status {done.returncode}); nothing was "
                         f"recorded.\n{tail}\nrepro: cd {shlex.quote(str(out))} && {shlex.join(argv)}")
    steps = sum(1 for line in done.stdout.splitlines() if line.startswith("["))
    builder.write_if_changed(out / "build" / gpu_bundle.BUILD_RECORD, json.dumps(record, indent=1) + "\n")
    if steps:
        bump("bundle_builds")
    return steps
