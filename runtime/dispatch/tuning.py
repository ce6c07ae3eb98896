"""Per-shape variant choice: the opt-in tuning mode and its persistent database.

By default the algorithm pass picks a variant by heuristic. With CONVGEN_TUNE=1 (or
`tune(problem)`), a problem met for the first time has every candidate built in one ninja run
and timed on random tensors of its shapes (median of a few runs after a warm-up); the fastest
is recorded in the tuning database beside the kernel cache, `<cache>/tuning/<machine>.json`,
keyed by the problem's batch-independent key. Every later lowering of that problem on that
machine (tuning on or off) uses the record, and `convgen explain` shows it with its timings.

The machine is the target's ISA, the CPU model and the thread count, since any of them can
change the winner. Writers merge under a file lock and publish with os.replace.

Dispatch (dispatch/dispatch.py) reads the records when it plans a problem and, with
CONVGEN_TUNE=1, calls `tune` with its own loader of kernels (this module sits below it).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import platform
import re
import statistics
import threading
import time
from pathlib import Path

import torch

from ..building import cache
from ..codegen.ir import ConvProblem
from ..codegen.pipeline import lower
from ..codegen.target import Target
from .problem import TORCH_DTYPES, memory_format

_lock = threading.Lock()
_loaded: dict[Path, dict] = {}


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_id(target: Target, threads: int | None = None) -> str:
    threads = threads or torch.get_num_threads()
    model = re.sub(r"[^A-Za-z0-9]+", "-", _cpu_model()).strip("-").lower()
    return f"{target.name()}_{model}_{threads}t"


def db_path(target: Target) -> Path:
    return cache.root() / "tuning" / f"{machine_id(target)}.json"


def _read(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}   # an unreadable database is as good as an empty one; the next record rewrites it


def recorded(problem: ConvProblem, target: Target) -> dict | None:
    """The record for `problem` on this machine: {"algorithm", "times_ms", ...}, or None."""
    path = db_path(target)
    with _lock:
        if path not in _loaded:
            _loaded[path] = _read(path)
        return _loaded[path].get(problem.kernel_key())


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record(problem: ConvProblem, target: Target, algorithm: str, times_ms: dict[str, float]) -> None:
    path = db_path(target)
    entry = {"algorithm": algorithm, "times_ms": times_ms, "problem": problem.name(),
             "batch": problem.n, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    with _file_lock(path):
        data = _read(path)
        data[problem.kernel_key()] = entry
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    with _lock:
        _loaded[path] = data


def _operands(plan, problem: ConvProblem) -> dict[str, torch.Tensor | None]:
    """Random tensors for every operand of `plan`, in the layouts its kernel expects."""
    shapes = {"input": problem.input_shape, "grad_input": problem.input_shape, "output": problem.output_shape,
              "grad_output": problem.output_shape, "weight": problem.weight_shape,
              "grad_weight": problem.weight_shape, "bias": (problem.k,), "grad_bias": (problem.k,)}
    dtype = TORCH_DTYPES[problem.dtype]
    tensors = {}
    for op in plan.operands:
        if op.role not in shapes:
            tensors[op.role] = None
            continue
        shape = shapes[op.role]
        t = torch.randn(shape, dtype=torch.float32).to(dtype)
        tensors[op.role] = t.contiguous(memory_format=memory_format(op.layout, len(shape)))
    return tensors


def tune(problem: ConvProblem, target: Target, load_plans, repeat: int = 5) -> str:
    """Time every candidate of `problem`, record the fastest and return its name. `load_plans`
    builds (one ninja run) and loads the kernels of a list of plans (dispatch.load_plans)."""
    first = lower(problem, target)
    if len(first.candidates) < 2:
        return first.algorithm
    plans = [lower(problem, target, algorithm=a) for a in first.candidates]
    kernels = load_plans(plans)
    tensors = _operands(first, problem)
    threads = torch.get_num_threads()
    times = {}
    for plan, kernel in zip(plans, kernels):
        kernel(tensors, problem.n, threads)     # warm-up (first touch, page faults)
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            kernel(tensors, problem.n, threads)
            samples.append(time.perf_counter() - start)
        times[plan.algorithm] = round(statistics.median(samples) * 1e3, 4)
    best = min(times, key=times.get)
    record(problem, target, best, times)
    return best
