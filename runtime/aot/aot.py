"""Ahead-of-time generation: problems -> readable sources and a manifest -> one importable bundle.

A bundle is a directory, conventionally generated/NAME/:

    manifest.json    what was generated and how: problems, keys, chosen variants and their
                     reasons, compile commands, target (ISA and caches), toolchain
    kernels/*.cpp    one generated source per kernel, each with the usual header
    bundle.cpp       the pybind11 module that links every kernel (generated too)
    build/           build.ninja, objects, the module and build.json (machine-specific; not
                     meant for version control)

`generate` writes the first three and rewrites only files whose content changes; `build` runs
ONE parallel ninja build (kernels compiled exactly as the JIT compiles them, as objects, then
linked with the module into one shared library that Python imports) and records the toolchain
in build/build.json. Re-running both with nothing changed writes nothing and compiles nothing.
runtime/dispatch/bundle.py loads the result; the format (manifest, build record) is defined there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sysconfig
import time
from pathlib import Path
from typing import Callable, Sequence, TextIO

from ..codegen.emit import emit, emit_bundle_module
from ..codegen.errors import BuildError, ConvgenError
from ..codegen.ir import ConvProblem
from ..codegen.pipeline import lower
from ..codegen.plan import Plan
from ..codegen.source import KernelSource
from ..codegen.target import Target, TargetKind, host_cpu
from ..building import build as builder
from ..dispatch import dispatch
from ..dispatch.bundle import (BUILD_RECORD, FORMAT, MANIFEST, python_tag, read_manifest, sha256, target_from_dict,
                               target_to_dict, toolchain)
from .. import knobs
from ..stats import bump

_PYBIND_INCLUDES = "$(python3 -m pybind11 --includes)"  # how the manifest spells the include flags


def module_name(name: str) -> str:
    """The Python module name of bundle `name`: convgen_bundle_ plus the name, symbol-safe."""
    return "convgen_bundle_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def kernel_set(manifest_kernels: Sequence[dict]) -> str:
    """One digest of a bundle's kernels (entries and source digests), shared by manifest and module."""
    return sha256("\n".join(f"{k['entry']} {k['sha256']}" for k in manifest_kernels))


# ---------------------------------------------------------------------------------- generating


@dataclasses.dataclass(frozen=True)
class Generated:
    out: Path
    manifest: dict
    written: int    # files (re)written
    unchanged: int  # files whose content was already right
    removed: int    # stale kernel sources deleted


def plan_kernels(problems: Sequence[ConvProblem], target: Target) -> list[tuple[ConvProblem, Plan, KernelSource | None]]:
    """Each problem with its plan and source; the host's tuning database is used for the host target."""
    result = []
    for p in problems:
        p.validate()
        if target == host_cpu():
            plan, source = dispatch.plan_for(p, target)
        else:
            plan = lower(p, target)
            source = emit(plan)
        result.append((p, plan, source))
    return result


def generate(problems: Sequence[ConvProblem], out: str | Path, *, name: str | None = None,
             target: Target | None = None, origin: dict | None = None) -> Generated:
    """Write the sources, the module source and the manifest of a bundle for `problems` into `out`."""
    out = Path(out)
    name = name or out.name
    target = target or host_cpu()
    if target.kind is not TargetKind.CPU:
        raise ConvgenError(f"target {target.name()}: ahead-of-time bundles are built for CPU targets only "
                           f"(GPU kernels are planned but not emitted yet)")
    planned = plan_kernels(problems, target)

    kernels: dict[str, dict] = {}   # by source digest
    entries: dict[str, str] = {}    # entry -> source digest
    sources: dict[str, KernelSource] = {}
    listed = []
    argv = knobs.cxx()
    for p, plan, source in planned:
        kernel = None
        if source is not None:
            digest = sha256(source.text)
            if entries.setdefault(source.entry, digest) != digest:
                raise ConvgenError(f"bundle {name}: two different kernels share the entry {source.entry}; "
                                   f"generate them into separate bundles")
            if digest not in kernels:
                obj = f"build/obj/{source.name}.o"
                command = builder.compile_command(f"kernels/{source.name}.cpp", obj, target, argv, shared=False)
                kernels[digest] = {
                    "name": source.name, "file": f"kernels/{source.name}.cpp", "sha256": digest,
                    "entry": source.entry, "signature": [list(s) for s in source.signature],
                    "kernel_key": p.kernel_key(), "op": p.op.value, "algorithm": plan.algorithm,
                    "candidates": list(plan.candidates), "decisions": [list(r) for r in plan.reasons],
                    "object": obj, "command": shlex.join(command),
                }
                sources[digest] = source
            kernel = source.name
        listed.append({"problem": json.loads(p.to_json()), "name": p.name(), "key": p.key(), "kernel": kernel})

    kernel_list = sorted(kernels.values(), key=lambda k: k["name"])
    module = module_name(name)
    digest = kernel_set(kernel_list)
    module_text = emit_bundle_module(name, module, [sources[k["sha256"]] for k in kernel_list], digest)
    manifest = {
        "format": FORMAT,
        "name": name,
        "module": module,
        "generator_version": knobs.convgen_version(),
        "target": target_to_dict(target),
        "toolchain": _named_toolchain(argv),
        "origin": origin or {},
        "kernel_set": digest,
        "commands": {
            "kernels": "each kernel's 'command', run in this directory",
            "module": shlex.join(_module_command(argv, _PYBIND_INCLUDES.split(" "))),
            "link": shlex.join(_link_command(argv, [k["object"] for k in kernel_list], module)),
        },
        "kernels": kernel_list,
        "problems": listed,
    }

    files = {f"kernels/{sources[k['sha256']].name}.cpp": sources[k["sha256"]].text for k in kernel_list}
    files["bundle.cpp"] = module_text
    files[MANIFEST] = json.dumps(manifest, indent=1) + "\n"
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    written = sum(builder.write_if_changed(out / rel, text) for rel, text in files.items())
    removed = 0
    for stale in sorted((out / "kernels").glob("*.cpp")):
        if f"kernels/{stale.name}" not in files:
            stale.unlink()
            removed += 1
    return Generated(out, manifest, written, len(files) - written, removed)


def _named_toolchain(argv: Sequence[str]) -> dict:
    """The manifest's toolchain entry; sources can be generated where no compiler is installed."""
    try:
        return {k: v for k, v in toolchain(argv).items() if k != "identity_sha256"}
    except BuildError:
        return {"cxx": list(argv), "version": None}


def _module_command(argv: Sequence[str], includes: Sequence[str]) -> list[str]:
    # -O0: the module only hands out addresses; optimising pybind11's headers would double the
    # build's critical path (about 6 s of the bundle's build is this one file).
    return [*argv, "-O0", "-std=c++17", "-fPIC", "-fvisibility=hidden", *includes, "-c", "bundle.cpp",
            "-o", "build/bundle.o"]


def _link_command(argv: Sequence[str], objects: Sequence[str], module: str) -> list[str]:
    suffix = python_tag()["ext_suffix"]
    return [*argv, "-shared", "-fopenmp", *objects, "build/bundle.o", "-o", f"build/{module}{suffix}"]


# ---------------------------------------------------------------------------------- building


@dataclasses.dataclass(frozen=True)
class Built:
    module_path: Path
    compiled: int   # ninja steps that ran (0: everything was up to date)
    seconds: float


def _includes() -> list[str]:
    import pybind11

    paths = [pybind11.get_include(), sysconfig.get_paths()["include"]]
    return [f"-I{p}" for p in dict.fromkeys(paths)]


def _ninja_file(manifest: dict, argv: Sequence[str]) -> str:
    def edge(rule: str, out: str, inputs: Sequence[str], command: Sequence[str]) -> list[str]:
        return [f"build {out}: {rule} {' '.join(inputs)}", f"  cmd = {shlex.join(command).replace('$', '$$')}", ""]

    lines = [f"# written by convgen {knobs.convgen_version()} for bundle {manifest['name']}",
             "ninja_required_version = 1.3", "builddir = build", "",
             "rule compile", "  command = $cmd", "  description = compile $out", "",
             "rule link", "  command = $cmd", "  description = link $out", ""]
    target = target_from_dict(manifest["target"])
    # the module first: it is the longest compile, so ninja starts it while the kernels build
    lines += edge("compile", "build/bundle.o", ["bundle.cpp"], _module_command(argv, _includes()))
    objects = []
    for k in manifest["kernels"]:
        command = builder.compile_command(k["file"], k["object"], target, argv, shared=False)
        lines += edge("compile", k["object"], [k["file"]], command)
        objects.append(k["object"])
    link = _link_command(argv, objects, manifest["module"])
    lines += edge("link", link[-1], [*objects, "build/bundle.o"], link)
    lines.append(f"default {link[-1]}")
    return "\n".join(lines) + "\n"


def build(out: str | Path, *, progress: TextIO | None = None, jobs: int | None = None) -> Built:
    """Build bundle `out` (already generated) in one parallel ninja run; a progress bar goes to
    `progress`. Records the toolchain in build/build.json once the module is linked."""
    out = Path(out).resolve()
    manifest = read_manifest(out)
    argv = knobs.cxx()
    chain = toolchain(argv)  # a missing compiler is reported here, naming $CXX
    (out / "build" / "obj").mkdir(parents=True, exist_ok=True)
    builder.write_if_changed(out / "build" / "build.ninja", _ninja_file(manifest, argv))
    record = {"module": f"{manifest['module']}{python_tag()['ext_suffix']}", "kernel_set": manifest["kernel_set"],
              "generator_version": manifest["generator_version"], "target": manifest["target"]["name"],
              "toolchain": chain, "python": python_tag()}
    record_text = json.dumps(record, indent=1) + "\n"
    record_path = out / "build" / BUILD_RECORD
    started = time.perf_counter()
    compiled = _run_ninja(out, jobs or knobs.build_jobs(), progress)
    module_path = out / "build" / record["module"]
    if not module_path.exists():
        raise BuildError(f"bundle {manifest['name']}: ninja finished but {module_path} is missing")
    builder.write_if_changed(record_path, record_text)
    if compiled:
        bump("bundle_builds")
    return Built(module_path, compiled, time.perf_counter() - started)


_STATUS = re.compile(r"^\[(\d+)/(\d+)\] ")


def _run_ninja(out: Path, jobs: int, progress: TextIO | None) -> int:
    ninja = builder.find_ninja()
    argv = [ninja, "-f", "build/build.ninja", "-k", "0", "-j", str(jobs)]
    env = {**os.environ, "NINJA_STATUS": "[%f/%t] "}
    bump("ninja_runs")
    try:
        proc = subprocess.Popen(argv, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL, env=env)
    except OSError as e:
        raise BuildError(f"could not run ninja ({shlex.join(argv)}): {e}") from e
    bar = _Progress(progress)
    lines, steps = [], 0
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        match = _STATUS.match(line)
        if match:
            steps = int(match.group(1))
            bar.update(steps, int(match.group(2)), line[match.end():].strip())
    status = proc.wait()
    bar.close()
    if status != 0:
        text = "\n".join(lines[-80:])
        raise BuildError(f"bundle build failed in {out} (ninja exit status {status}); nothing was published.\n"
                         f"{text}\nrepro: cd {shlex.quote(str(out))} && {shlex.join(argv)}")
    return steps


class _Progress:
    """A one-line progress bar on a terminal; a few plain lines elsewhere (logs, CI)."""

    def __init__(self, stream: TextIO | None):
        self.stream = stream
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.shown = -1

    def update(self, done: int, total: int, what: str) -> None:
        if self.stream is None or total <= 0:
            return
        width = 30
        filled = width * done // total
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        if self.tty:
            self.shown = done
            self.stream.write(f"\r{bar} {what[-40:]:<40}")
            self.stream.flush()
        elif done * 4 // total > self.shown or done == total:
            self.shown = done * 4 // total
            self.stream.write(f"{bar} {what}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty and self.shown >= 0:
            self.stream.write("\n")
            self.stream.flush()
