"""Dispatch: a table from problem key to a lowered plan and its loaded kernel, with counters.

A miss lowers the problem (codegen), emits the source and asks the builder for the artifact
(which may come from the in-process memo, the disk cache or a ninja build), then loads it with
ctypes. The batch size is a run-time argument, so a new batch size finds the same artifact.

With CONVGEN_SIM=cuda|hip the target is that vendor's default GPU arch (sm_90, gfx90a), or the
arch CONVGEN_SIM names (cuda-sm_80): the generated GPU kernels are built for the SIMT simulator
(devices/sim.py) and run on the CPU tensors' memory, through the same table (keyed by
CONVGEN_SIM's value too), cache and counters; each simulated launch counts in
stats()["sim_launches"]. Ahead-of-time bundles serve it when they carry simulator builds of
GPU kernels for that target (runtime/aot/gpu.py).

Tensors on a torch CUDA device (NVIDIA, or ROCm where the device is 'cuda' too) are served by
the target of that device's arch (devices/cuda.py `target_of`): the plan is lowered for it, its
source built by the vendor's compiler into a loadable library (building/gpu_library.py) or
served by a loaded GPU bundle, and called through devices/cuda.py's GpuKernel on torch's current
stream. Such entries are keyed by the target too (two devices of different archs in one process).
An f32 problem for a GPU target (simulated or a device) takes torch's tf32 switch
(dispatch/problem.py's gpu_problem) before it is keyed.

Where things are: the plan's choice among candidates comes from the tuning database
(dispatch/tuning.py), kernels of loaded ahead-of-time bundles from dispatch/bundle.py, the
loading and calling of an artifact from its device's module (devices/cpu.py, devices/sim.py).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from pathlib import Path
from typing import Sequence

from .. import knobs
from ..building import build
from ..building import gpu_library
from ..devices import cuda
from ..devices.cpu import Kernel
from ..devices.sim import SimKernel
from . import bundle, tiers, tuning
from .problem import gpu_problem
from ..stats import bump
from ..codegen.emit import emit
from ..codegen.errors import BuildError
from ..codegen.ir import ConvProblem
from ..codegen.pipeline import lower
from ..codegen.plan import Plan
from ..codegen.source import KernelSource
from ..codegen.target import Target, TargetKind, host_cpu, parse_target


def _kernel(source: KernelSource, path: Path, on_device: bool = False) -> Kernel:
    if source.target.kind is TargetKind.CPU:
        return Kernel(source, path)
    return cuda.GpuKernel(source, path) if on_device else SimKernel(source, path)


@dataclasses.dataclass
class Entry:
    plan: Plan
    source: KernelSource | None
    kernel: Kernel | None = None
    on_device: bool = False   # a GPU device's kernel (else the CPU's, or the simulator's)
    tier: str = ""            # what serves it: specialised, bundle, generic, generic-dynamic, layer ("": no kernel)


_lock = threading.RLock()
_table: dict[str, Entry] = {}
_loaded: dict[Path, Kernel] = {}


def _target_for(problem: ConvProblem) -> Target:
    vendor = knobs.sim()
    return parse_target(vendor) if vendor else host_cpu()


def plan_for(problem: ConvProblem, target: Target | None = None) -> tuple[Plan, KernelSource | None]:
    """The plan and source for `problem`: the tuning database's pick when it has one, else the
    heuristic's (or, with CONVGEN_TUNE=1, the winner of timing every candidate now)."""
    plan = _plan(problem, target)
    return plan, emit(plan)


def _plan(problem: ConvProblem, target: Target | None = None) -> Plan:
    """plan_for's plan, without its source."""
    target = target or _target_for(problem)
    plan = lower(problem, target)
    if plan.algorithm != "empty" and len(plan.candidates) > 1:
        entry = tuning.recorded(problem, target)
        if entry is None and knobs.tune():
            tuning.tune(problem, target, load_plans)
            entry = tuning.recorded(problem, target)
        if entry is not None and entry["algorithm"] in plan.candidates:
            plan = lower(problem, target, algorithm=entry["algorithm"])
            times = ", ".join(f"{a} {t:g} ms" for a, t in sorted(entry["times_ms"].items(), key=lambda kv: kv[1]))
            plan = plan.decide("algorithm", f"tuned on this machine at batch {entry['batch']}: {times}")
    return plan


def load_plans(plans: Sequence[Plan]) -> list[Kernel]:
    """Build (one ninja run) and load the kernels of `plans`, outside the dispatch table."""
    sources = [emit(p) for p in plans]
    paths = build.build_many(sources)
    with _lock:
        return [_load(s, path) for s, path in zip(sources, paths)]


def _load(source: KernelSource, path: Path, on_device: bool = False) -> Kernel:
    """Load an artifact; one that does not load (corrupt, truncated, wrong file) is reported and rebuilt."""
    kernel = _loaded.get(path)
    if kernel is not None and kernel.source.entry == source.entry:
        return kernel
    try:
        kernel = _kernel(source, path, on_device)
    except BuildError as e:
        warnings.warn(f"{e}; rebuilding it", RuntimeWarning, stacklevel=3)
        bump("corrupt_rebuilt")
        path = gpu_library.build_library(source, force=True) if on_device else build.build(source, force=True)
        kernel = _kernel(source, path, on_device)
    _loaded[path] = kernel
    return kernel


def device_target(device) -> Target | None:
    """The target of a torch device that is not the CPU (a GPU's arch), None for the CPU."""
    return None if device is None or device.type == "cpu" else cuda.target_of(device)


def _loaded_locked(source: KernelSource, path: Path) -> Kernel:
    with _lock:
        return _load(source, path)


def _loaded_on_device(source: KernelSource, path: Path) -> Kernel:
    with _lock:
        return _load(source, path, on_device=True)


def prepare(problems: Sequence[ConvProblem], device=None, *, policy: str | None = None) -> list[Entry]:
    """Entries for all `problems` on `device` (a torch.device; None or the CPU: the CPU, or the
    simulator under CONVGEN_SIM); every kernel still missing is built in one parallel ninja run
    (a GPU device's: one vendor compile each). `policy` (default CONVGEN_JIT; in the simulator,
    eager unless CONVGEN_JIT is set: the simulator is there to check the specialised kernels) may
    serve them from the generic tier instead (tiers.py); "eager" also builds the specialised
    kernels of entries the generic tier serves so far."""
    gpu = device_target(device)
    vendor = gpu.name() if gpu is not None else knobs.sim()
    kind = gpu.kind if gpu is not None else parse_target(vendor).kind if vendor else TargetKind.CPU
    policy = policy or (knobs.jit() if gpu is not None or not vendor or knobs.jit_set() else "eager")
    load = _loaded_on_device if gpu is not None else _loaded_locked
    with _lock:
        entries: list[Entry | None] = []
        new: dict[str, Entry] = {}
        for p in problems:
            p = gpu_problem(p, kind) if vendor else p
            key = f"{vendor}:{p.key()}" if vendor else p.key()
            entry = _table.get(key) or new.get(key)
            if entry is not None and key in _table:
                bump("memory_hits")
            if entry is None:
                entry = new[key] = _served(p, gpu, vendor, policy)
            entries.append(entry)
        pending = [e for e in new.values() if e.plan.algorithm != "empty" and e.kernel is None]
        if pending or policy == "eager":
            upgrade = [e for e in entries if policy == "eager" and e.tier in ("generic", "generic-dynamic", "layer")]
            kept = [(e, e.kernel, e.tier) for e in upgrade]
            for e in upgrade:
                e.kernel = None
            try:
                tiers.serve(pending + upgrade, policy, load, gpu is not None)   # (disjoint: new entries have no tier)
            except BaseException:   # a failed build leaves the generic kernels serving, never none
                for e, kernel, tier in kept:
                    e.kernel, e.tier = kernel, tier
                raise
            if upgrade:
                tiers.notify()
        _table.update(new)
        return entries


def _served(p: ConvProblem, gpu: Target | None, vendor: str, policy: str) -> Entry:
    """A new entry: a loaded bundle's kernel when one has it (no build), else a plan to build
    (on the CPU outside the eager policy, its source is emitted only if it is built)."""
    target = gpu or (_target_for(p) if vendor else None)
    served = bundle.serve(p, target, on_device=gpu is not None) if policy != "generic" else None
    if served is not None:
        bump("bundle_hits")
        return Entry(served.plan, served.source, served.kernel(), on_device=gpu is not None, tier="bundle")
    if policy != "eager":
        return Entry(_plan(p, target), None, on_device=gpu is not None)
    plan, source = plan_for(p, target)
    return Entry(plan, source, on_device=gpu is not None)


def kernel_for(problem: ConvProblem, device=None) -> Entry:
    return (prepare([problem]) if device is None else prepare([problem], device))[0]


def clear() -> None:
    """Forget the in-memory table (artifacts stay loaded and on disk)."""
    with _lock:
        _table.clear()
