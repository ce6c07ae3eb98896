"""The eager launcher: one compiled module that runs forward kernels on torch tensors and records
their autograd nodes in C++ (templates/eager/launcher.cpp.j2).

A tiny convolution takes torch about 15 µs here; a Python `torch.autograd.Function` alone costs
about as much, and ctypes a few µs more. The launcher does a whole forward call (conversions,
the output, the kernel, the autograd node) in one C call of a few µs. Its node's backward calls
back into Python for the gradients (the same formulas and kernels as the Function's), so only
the forward call gets faster, and results are bit for bit the same on either path.

It includes torch's headers, which take about 20-30 s to compile, so it is never built during a
call: `convgen setup` (or `setup()`) builds it once per machine, compiler, Python and torch into
the kernel cache. A call loads it from there when it is present; otherwise, or with
CONVGEN_LAUNCHER=0, eager calls take the Python path (ctypes and an autograd.Function), which
computes the same results. `status()` says which.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
import warnings
from pathlib import Path

import torch

from ..building import build as builder, cache
from ..devices import cpu
from .. import knobs
from ..codegen.emit import emit_launcher
from ..codegen.errors import BuildError, ConvgenError
from ..stats import bump

MODULE = "convgen_eager"

_lock = threading.Lock()
_loaded: dict[str, object] = {}     # cache directory -> the loaded module, or None where it is absent


def _torch_paths() -> tuple[Path, Path]:
    root = Path(torch.__file__).resolve().parent
    return root / "include", root / "lib"


def source() -> str:
    return emit_launcher(MODULE, torch.__version__, cpu.HUGE_OUTPUT_BYTES)


def compile_command(src: str, out: str, cxx_argv: list[str] | None = None) -> list[str]:
    """The command that builds the launcher from `src` into the Python extension `out`, against
    the torch and Python of this process."""
    include, lib = _torch_paths()
    argv = list(cxx_argv) if cxx_argv is not None else knobs.cxx()
    return [
        *argv, "-O2", "-std=c++20", "-fPIC", "-shared",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        "-isystem", str(include), "-isystem", str(include / "torch" / "csrc" / "api" / "include"),
        "-isystem", sysconfig.get_paths()["include"],
        str(src), "-o", str(out),
        "-L", str(lib), "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
    ]


def key(cxx_argv: list[str] | None = None) -> str:
    """The launcher's cache key: its source, compile command and compiler, and the Python ABI it
    is built for (torch's version and paths are in the source and the command)."""
    argv = list(cxx_argv) if cxx_argv is not None else knobs.cxx()
    abi = f"python {sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}"
    return cache.artifact_key(source(), compile_command("{src}", "{out}", argv), builder.compiler_identity(argv), abi,
                              knobs.convgen_version())


def setup(force: bool = False) -> Path:
    """Build the launcher into the cache (unless a valid one is there) and return its path.
    A compile failure raises BuildError with the command, the compiler's output and a repro;
    nothing is cached for it."""
    argv = knobs.cxx()
    k = key(argv)
    with _lock:
        _loaded.pop(str(cache.root()), None)   # whatever this process found before, the next call looks again
    with cache.key_lock(k):
        artifact = None if force else cache.lookup(k)
        if artifact is not None:
            return artifact
        workdir = cache.private_dir("launcher")
        try:
            src, out = workdir / f"{MODULE}.cpp", workdir / f"{MODULE}.so"
            src.write_text(source(), encoding="utf-8")
            command = compile_command(str(src), str(out), argv)
            if knobs.verbose():
                print(f"convgen: {shlex.join(command)}", file=sys.stderr)
            try:
                proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            except OSError as e:
                raise BuildError(f"the eager launcher: could not run the compiler ({shlex.join(command)}): {e}") from e
            if proc.returncode != 0 or not out.exists():
                raise _failure(proc, src, argv)
            meta = {"entry": f"PyInit_{MODULE}", "language": "c++", "command": compile_command("{src}", "{out}", argv),
                    "compiler_identity": builder.compiler_identity(argv), "target": "python extension",
                    "target_key": f"torch {torch.__version__}", "version": knobs.convgen_version()}
            artifact = cache.publish(k, MODULE, out, src, meta)
            bump("builds")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return artifact


def _failure(proc: subprocess.CompletedProcess, src: Path, argv: list[str]) -> BuildError:
    failed = cache.root() / "failed"
    kept, log = failed / f"{MODULE}.cpp", failed / f"{MODULE}.log"
    output = (proc.stdout + proc.stderr).strip().replace(str(src), str(kept))
    shutil.copyfile(src, kept)
    log.write_text(output + "\n", encoding="utf-8")
    lines, shown = output.splitlines(), builder.OUTPUT_LINES
    quoted = "\n".join("    " + line for line in lines[:shown])
    more = f"\n    ... ({len(lines) - shown} more lines in {log})" if len(lines) > shown else ""
    repro = shlex.join(compile_command(str(kept), str(failed / f"{MODULE}.so"), argv))
    bump("build_failures")
    return BuildError(f"the eager launcher failed to build (exit status {proc.returncode}; nothing was cached; "
                      f"eager calls keep the Python path)\n  source: {kept}\n  compiler output:\n{quoted}{more}\n"
                      f"  command (repro): {repro}")


def module():
    """The loaded launcher, or None: when it is not built (never built here during a call),
    when CONVGEN_LAUNCHER=0, or when it does not load (reported once, with a warning)."""
    if not knobs.launcher():
        return None
    try:
        base = str(knobs.cache_dir())
    except ConvgenError:   # an unusable CONVGEN_CACHE_DIR: the kernels' own lookup reports it
        return None
    with _lock:
        if base in _loaded:
            return _loaded[base]
    loaded = _load()
    with _lock:
        _loaded[base] = loaded
    return loaded


def _load():
    try:
        directory = cache.entry_dir(key())
        artifact, problem = cache.check_entry(directory)
    except ConvgenError:   # no compiler here (say, a bundle-only machine), or no usable cache: no launcher
        return None
    if problem is not None:
        warnings.warn(f"convgen: the eager launcher's cache entry {directory} is corrupt ({problem}); eager calls "
                      f"take the Python path until `convgen setup` rebuilds it", RuntimeWarning, stacklevel=3)
        return None
    if artifact is None:
        return None
    spec = importlib.util.spec_from_file_location(MODULE, artifact,
                                                  loader=importlib.machinery.ExtensionFileLoader(MODULE, str(artifact)))
    try:
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        loaded.set_grads(_grads)
    except (ImportError, OSError) as e:
        warnings.warn(f"convgen's eager launcher {artifact} does not load ({e}); eager calls take the Python path. "
                      f"Rebuild it with `convgen setup --force`.", RuntimeWarning, stacklevel=3)
        return None
    return loaded


# A launcher node's backward calls gradients(forward, grad_output, input, weight, needs): the formula
# of the Python autograd Function's backward (api/functional.py `forward_grads`). That module sits
# above this one (it calls ops, which binds here), so it hands the formula down with
# set_gradients() when it is imported; nodes are recorded only for its calls.
_gradients = None


def set_gradients(fn) -> None:
    global _gradients
    _gradients = fn


def _grads(forward, grad_output, input, weight, needs):
    """A launcher node's gradients: what the Python autograd Function's backward computes."""
    return tuple(_gradients(forward, grad_output, input, weight, needs))


def bind(forward, kernel, roles: tuple[str, ...], live: list[str], sizes, dtype, output_format, formats):
    """A launcher call for one ops.Forward (None without the launcher, or for a kernel whose entry
    point is not the forward's input, weight, bias, output, batch size, thread count)."""
    launcher = module()
    if launcher is None:
        return None
    signature = kernel.source.signature
    if [kind for kind, _ in signature] != ["ptr"] * 4 + ["i64", "i32"] or \
            [role for _, role in signature[4:]] != ["n", "nthreads"]:
        return None
    slots = tuple(roles.index(role) if role in live else -1 for _, role in signature[:4])
    return launcher, launcher.bind(kernel.address, slots, forward.problem.n, forward._threads, tuple(sizes), dtype,
                                   _FORMATS[output_format], tuple(-1 if f is None else _FORMATS[f] for f in formats),
                                   forward)


# c10::MemoryFormat's values
_FORMATS = {torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2, torch.channels_last_3d: 3}


def status() -> str:
    """Which path eager calls take, in one line."""
    if not knobs.launcher():
        return "the Python path: CONVGEN_LAUNCHER=0"
    if module() is None:
        return "the Python path: the eager launcher is not built for this torch and Python (run `convgen setup`)"
    return f"the eager launcher, built for torch {torch.__version__}"
