"""Building generated sources into shared libraries, through the on-disk cache.

Owns: the host compiler's identity, the compile command, each source's content key, and
`build_many`, which finds what is already built (in memory, then on disk) and compiles all the
rest in ONE parallel ninja run in a private directory, each key under its own lock, publishing
every success atomically. A compile error raises BuildError with the command, the compiler's
output, the kept source and a one-line repro; failures are never cached.

The artifacts are plain shared libraries with `extern "C"` entry points: load them with
`ctypes.CDLL(str(path))`. A CUDA or HIP source (a GPU target's) is built the same way for the
SIMT simulator (building/sim_build.py's command: the host compiler with -DCONVGEN_SIM and the vendor's
warp size); its key also covers the simulator's headers. Builds for the vendors' own compilers
are building/gpu_build.py's.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator, Sequence

from convgen.codegen.errors import BuildError
from convgen.codegen.source import KernelSource
from convgen.codegen.target import Target, TargetKind

from .. import knobs
from . import cache, sim_build as sim
from ..stats import bump

_LANGUAGE = {TargetKind.CPU: "c++", TargetKind.CUDA: "cuda", TargetKind.HIP: "hip"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,199}")
OUTPUT_LINES = 60  # compiler output lines quoted in an error (the full log is kept on disk)

_memo_lock = threading.Lock()
_memory: dict[tuple[str, str], Path] = {}  # (cache dir, key) -> artifact
_identities: dict[tuple[str, tuple[str, ...]], str] = {}


# ---------------------------------------------------------------------------------- compiler


def compiler_identity(cxx_argv: Sequence[str]) -> str:
    """The compiler's resolved path, its argument vector and its `--version` output.

    Memoized per process. A missing or broken compiler raises BuildError naming $CXX.
    """
    argv = list(cxx_argv)
    exe = shutil.which(argv[0])
    if exe is None:
        raise BuildError(
            f"compiler {argv[0]!r} ({_cxx_origin()}) not found; "
            f"set CXX to a C++17 compiler with OpenMP support"
        )
    memo_key = (os.path.realpath(exe), tuple(argv))
    with _memo_lock:
        known = _identities.get(memo_key)
    if known is not None:
        return known
    try:
        proc = subprocess.run(
            [*argv, "--version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(
            f"compiler {shlex.join(argv)!r} ({_cxx_origin()}) could not run `--version`: {e}; "
            f"set CXX to a working C++17 compiler with OpenMP support"
        ) from e
    if proc.returncode != 0:
        raise BuildError(
            f"compiler {shlex.join(argv)!r} ({_cxx_origin()}) failed on `--version` with exit "
            f"status {proc.returncode}:\n{(proc.stdout + proc.stderr).strip()}\n"
            f"set CXX to a working C++17 compiler with OpenMP support"
        )
    identity = "\n".join([memo_key[0], shlex.join(argv), proc.stdout.strip()])
    with _memo_lock:
        _identities[memo_key] = identity
    return identity


def _cxx_origin() -> str:
    return "from $CXX" if os.environ.get("CXX", "").strip() else "the default; $CXX is not set"


def compile_command(src: str, out: str, target: Target, cxx_argv: Sequence[str] | None = None, *,
                    shared: bool = True) -> list[str]:
    """The command that builds shared library `out` from C++ file `src` for `target` (with
    shared=False, object file `out`, for an ahead-of-time bundle: the same code generation).

    No -ffast-math: results follow IEEE arithmetic as written, except that a multiply feeding an
    add may fuse into one FMA (-ffp-contract=fast), which is as deterministic and more accurate.
    """
    argv = list(cxx_argv) if cxx_argv is not None else knobs.cxx()
    if target.kind is not TargetKind.CPU:   # GPU source, built to run in the SIMT simulator
        pch = sim.precompiled_header(target.kind.value, tuple(argv), str(cache.root()), compiler_identity(argv))
        return sim.compile_command(str(src), str(out), target.kind.value, cxx_argv=argv, debug=False, pch=pch,
                                   split=pch is not None)
    return [
        *argv,
        "-O3",
        "-std=c++17",
        "-fPIC",
        "-shared" if shared else "-c",
        "-fopenmp",
        *target.march_flags,
        "-fno-math-errno",
        "-ffp-contract=fast",
        str(src),
        "-o",
        str(out),
    ]


def source_key(source: KernelSource, cxx_argv: Sequence[str] | None = None) -> str:
    """The cache key of `source` built with the current (or the given) compiler."""
    argv = list(cxx_argv) if cxx_argv is not None else knobs.cxx()
    return _key(source, argv, compiler_identity(argv), knobs.convgen_version())


def _key(source: KernelSource, argv: list[str], identity: str, version: str) -> str:
    command = compile_command("{src}", "{out}", source.target, argv)  # no temp paths in keys
    if source.target.kind is not TargetKind.CPU:
        identity = f"{identity}\nsimulator headers {sim.headers_digest()}"
    return cache.artifact_key(source.text, command, identity, source.target.key(), version)


def _suffix(source: KernelSource) -> str:
    return ".cpp" if source.language == "c++" else ".cu"


def _check_source(source: KernelSource) -> None:
    if not _NAME.fullmatch(source.name):
        raise BuildError(
            f"kernel name {source.name!r} is not usable as a file name; names must match "
            f"{_NAME.pattern} (letters, digits, '_', '.', '-')"
        )
    if source.language != _LANGUAGE[source.target.kind]:
        raise BuildError(
            f"kernel {source.name}: language {source.language!r} does not match its target "
            f"{source.target.name()} (expected {_LANGUAGE[source.target.kind]!r})"
        )


# ---------------------------------------------------------------------------------- ninja


def find_ninja() -> str:
    """ninja on PATH, else the one shipped by the `ninja` Python package; BuildError if neither."""
    found = shutil.which("ninja")
    if found:
        return found
    with contextlib.suppress(Exception):
        import ninja  # the PyPI package

        candidate = os.path.join(ninja.BIN_DIR, "ninja")
        if os.access(candidate, os.X_OK):
            return candidate
    raise BuildError(
        "ninja not found: it is neither on PATH nor provided by the `ninja` Python package; "
        "install it with `pip install ninja` or your system's package manager"
    )


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` only if its content differs (so ninja sees no needless change).

    Returns True when the file was (re)written.
    """
    path = Path(path)
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8") == text:
            return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return True


@dataclasses.dataclass(frozen=True)
class _Job:
    key: str
    source: KernelSource
    src: str  # paths relative to the build directory
    out: str
    log: str
    stamp: str
    command: list[str]


def _ninja_file(jobs: list[_Job]) -> str:
    lines = [
        f"# written by convgen {knobs.convgen_version()}: {len(jobs)} kernel(s)",
        "ninja_required_version = 1.3",
        "",
        "rule compile",
        "  command = $cmd > $log 2>&1 && : > $stamp",
        "  description = compile $out",
        "",
    ]
    for job in jobs:
        lines += [
            f"build {job.out}: compile {job.src}",
            f"  cmd = {shlex.join(job.command).replace('$', '$$')}",
            f"  log = {job.log}",
            f"  stamp = {job.stamp}",
            "",
        ]
    return "\n".join(lines)


# Builds in this thread run at the lowest CPU priority (the background builder's: runtime/dispatch/
# tiers.py): its compiles take what the caller's threads leave idle, instead of a core they need.
_low_priority: contextvars.ContextVar[bool] = contextvars.ContextVar("convgen_low_priority", default=False)


@contextlib.contextmanager
def low_priority() -> Iterator[None]:
    """Within the block, this thread's builds run their compilers at the lowest priority (nice 19)."""
    token = _low_priority.set(True)
    try:
        yield
    finally:
        _low_priority.reset(token)


def _run_ninja(ninja: str, workdir: Path, jobs: int) -> subprocess.CompletedProcess:
    argv = [ninja, "-C", str(workdir), "-k", "0", "-j", str(jobs)]
    nice = shutil.which("nice") if _low_priority.get() else None
    if nice:   # ninja and every compiler it starts inherit the priority
        argv = [nice, "-n", "19", *argv]
    bump("ninja_runs")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise BuildError(f"could not run ninja ({shlex.join(argv)}): {e}") from e
    if knobs.verbose():
        print(f"convgen: {shlex.join(argv)}\n{proc.stdout}{proc.stderr}", file=sys.stderr)
    return proc


# ---------------------------------------------------------------------------------- building


def build(source: KernelSource, *, force: bool = False) -> Path:
    """The artifact of one source (see build_many)."""
    return build_many([source], force=force)[0]


def cached(source: KernelSource) -> Path | None:
    """The artifact of `source` if this process or the disk cache has it (nothing is built)."""
    _check_source(source)
    argv = knobs.cxx()
    return _lookup(str(cache.root()), _key(source, argv, compiler_identity(argv), knobs.convgen_version()))[0]


def _lookup(base: str, key: str) -> tuple[Path | None, str]:
    """(artifact, where: "memory_hits" or "disk_hits") for `key` in this process's memory, else on
    disk (a corrupt entry is warned about and skipped); (None, "") where neither has it."""
    with _memo_lock:
        known = _memory.get((base, key))
    if known is not None and known.exists():
        return known, "memory_hits"
    artifact = cache.lookup(key)
    return (_remember(base, key, artifact), "disk_hits") if artifact is not None else (None, "")


def build_many(sources: Sequence[KernelSource], *, force: bool = False, parallel: int | None = None) -> list[Path]:
    """Artifact paths for `sources`, in order, building whatever is not cached.

    Looks in this process's memory, then on disk; everything missing is compiled in one
    parallel ninja run (`parallel` compiles at once, default CONVGEN_BUILD_JOBS). force=True
    rebuilds even valid entries (e.g. one that would not load).
    """
    sources = list(sources)
    for source in sources:
        _check_source(source)
    argv = knobs.cxx()
    identity = compiler_identity(argv)
    version = knobs.convgen_version()
    base = str(cache.root())
    keys = [_key(s, argv, identity, version) for s in sources]

    found: dict[str, Path] = {}
    missing: dict[str, KernelSource] = {}
    for source, key in zip(sources, keys):
        if key in found or key in missing:
            continue
        if not force:
            artifact, where = _lookup(base, key)
            if artifact is not None:
                bump(where)
                found[key] = artifact
                continue
        missing[key] = source
    if missing:
        found.update(_build_locked(base, missing, argv, identity, version, force, parallel))
    return [found[k] for k in keys]


def clear_memory() -> None:
    """Forget the in-process key -> artifact table (the disk cache is untouched)."""
    with _memo_lock:
        _memory.clear()


def _remember(base: str, key: str, artifact: Path) -> Path:
    with _memo_lock:
        _memory[(base, key)] = artifact
    return artifact


def _build_locked(base, missing, argv, identity, version, force, parallel=None) -> dict[str, Path]:
    ninja = find_ninja()
    found: dict[str, Path] = {}
    with contextlib.ExitStack() as locks:
        for key in sorted(missing):  # one global order: no deadlock between batches
            locks.enter_context(cache.key_lock(key))
        pending = {}
        for key in sorted(missing):
            if not force:  # re-check: another process may have built it while we waited
                artifact, _ = cache.check_entry(cache.entry_dir(key))
                if artifact is not None:
                    bump("disk_hits")
                    found[key] = _remember(base, key, artifact)
                    continue
            pending[key] = missing[key]
        if pending:
            found.update(_compile_and_publish(base, pending, ninja, argv, identity, version, parallel))
    return found


def _compile_and_publish(base, pending, ninja, argv, identity, version, parallel=None) -> dict[str, Path]:
    workdir = cache.private_dir("build")
    try:
        jobs = []
        for key, source in pending.items():
            sub = key[:16]
            (workdir / sub).mkdir()
            src, out = f"{sub}/{source.name}{_suffix(source)}", f"{sub}/{source.name}.so"
            (workdir / src).write_text(source.text, encoding="utf-8")
            command = compile_command(src, out, source.target, argv)
            jobs.append(_Job(key, source, src, out, f"{sub}/build.log", f"{sub}/ok", command))
        write_if_changed(workdir / "build.ninja", _ninja_file(jobs))
        if knobs.verbose():
            print(f"convgen: building {len(jobs)} kernel(s) in {workdir}", file=sys.stderr)
        proc = _run_ninja(ninja, workdir, parallel or knobs.build_jobs())

        found, failures = {}, []
        for job in jobs:
            if (workdir / job.stamp).exists() and (workdir / job.out).exists():
                meta = {
                    "entry": job.source.entry,
                    "language": job.source.language,
                    "command": compile_command("{src}", "{out}", job.source.target, argv),
                    "compiler_identity": identity,
                    "target": job.source.target.name(),
                    "target_key": job.source.target.key(),
                    "version": version,
                }
                artifact = cache.publish(job.key, job.source.name, workdir / job.out, workdir / job.src, meta)
                bump("builds")
                found[job.key] = _remember(base, job.key, artifact)
            else:
                failures.append(_keep_failure(job, workdir, proc, argv))
        if failures:
            bump("build_failures", len(failures))
            raise _build_error(failures)
        return found
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _keep_failure(job: _Job, workdir: Path, proc: subprocess.CompletedProcess, argv) -> dict:
    """Copy a failed source and its log to <cache>/failed/ and describe the failure."""
    try:
        output = (workdir / job.log).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        output = ""
    if not output:  # the compiler never ran (or said nothing): ninja's own account
        output = (proc.stdout + proc.stderr).strip() or f"ninja exited with status {proc.returncode}"
    failed = cache.root() / "failed"
    kept = failed / f"{job.source.name}{_suffix(job.source)}"
    log = failed / f"{job.source.name}.log"
    # the same command and output, with the kept copy in place of the deleted build directory
    command = compile_command(str(kept), str(failed / f"{job.source.name}.so"), job.source.target, argv)
    output = output.replace(job.src, str(kept))
    shutil.copyfile(workdir / job.src, kept)
    log.write_text(output + "\n", encoding="utf-8")
    return {
        "name": job.source.name,
        "key": job.key,
        "command": command,
        "output": output,
        "source_path": kept,
        "log_path": log,
        "repro": shlex.join(command),
    }


def _build_error(failures: list[dict]) -> BuildError:
    parts = [f"{len(failures)} kernel(s) failed to build (nothing was cached for them):"]
    for f in failures:
        lines = f["output"].splitlines()
        quoted = lines[:OUTPUT_LINES]
        if len(lines) > OUTPUT_LINES:
            quoted.append(f"... ({len(lines) - OUTPUT_LINES} more lines in {f['log_path']})")
        parts += [
            "",
            f"kernel {f['name']} (key {f['key'][:16]})",
            f"  source: {f['source_path']}",
            "  compiler output:",
            *("    " + line for line in quoted),
            f"  command (repro): {f['repro']}",
        ]
    error = BuildError("\n".join(parts))
    first = failures[0]
    error.name, error.command, error.output = first["name"], first["command"], first["output"]
    error.source_path, error.repro, error.failures = first["source_path"], first["repro"], failures
    return error
