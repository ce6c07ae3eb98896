"""Kernel tiers: no CPU call waits for a compiler (DESIGN.md "Kernel tiers").

A CPU problem whose specialised kernel is not ready in this process is served by the shape-generic
tier (codegen/cpu/generic.py: one library per kernel op, dtype and target, sizes at run time, built
by `convgen setup` or once at first use, and kept apart from the kernel cache, in
knobs.generic_dir(): part of the machine's installation, not rebuilt for a new or cleared cache).
What happens next is CONVGEN_JIT's policy:

- background (default): a problem that is called again (HOT_CALLS) is hot: its specialised kernel
  is built on a background thread (ninja with `workers()` compiles, fewer than the cores, at the
  lowest CPU priority, so that they take what the caller's threads leave idle) and
  replaces the generic one for later calls once loaded (a problem whose kernel is already on disk
  is found there by that thread in milliseconds). A problem called once never costs a build: a
  forward whose inputs need gradients no longer builds the backward's kernels, and a sweep of
  one-off shapes (a test suite) builds nothing.
- Dynamic shapes, torch.compile's rule: a layer (a problem but for its spatial sizes and batch) seen
  with more than DYNAMIC_AFTER spatial sizes is dynamic; instead of a specialised build per size,
  the layer gets one kernel per kernel op (generic.source(..., layer=plan): the generic kernel with
  the layer's groups, channels, taps, strides, padding and dilation compiled in, spatial sizes at run
  time), built in the background when the layer turns dynamic; until it loads, the generic tier
  serves the layer's new sizes, then it serves them all (tier "layer", `layer_calls`). On a GPU the
  same, for the layers whose kernel op the implicit GEMM with run-time sizes computes with groups it
  takes (codegen/gpu/generic.py layer_serves): their layer's kernel is that implicit GEMM with the
  layer's constants compiled in; the others (depthwise, narrow groups) keep a specialised build per hot
  size, in the background.
- eager: today's behaviour, the specialised kernel built on the call (benchmarks, `convgen bench`).
- generic: the generic tier for every problem it serves, nothing specialised (tests of the tier).

A swap tells the listeners (api/ops.py forgets its remembered calls, which hold bound kernels).
Background builds are dropped at exit (the one under way finishes); nothing is lost but time.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import os
import threading
import warnings
from typing import Callable, Sequence

from .. import knobs
from ..building import build, cache, gpu_library
from ..codegen.cpu import generic
from ..codegen.gpu import generic as gpu_generic
from ..codegen.emit import emit
from ..codegen.errors import CacheError, ConvgenError
from ..codegen.ir import ConvProblem, DType
from ..codegen.plan import Plan
from ..codegen.target import Target, TargetKind, host_cpu
from ..devices.cpu import GenericKernel, Kernel
from ..stats import bump

HOT_CALLS = 2          # the call of a problem that queues its specialised build
DYNAMIC_AFTER = 2      # spatial sizes of a layer that get specialised kernels; from the next on, generic

_lock = threading.RLock()
_libraries: dict[tuple, Kernel] = {}                       # (kernel op, dtype, target key, device) -> generic entry
_sizes_seen: dict[tuple, set] = collections.defaultdict(set)  # (layer key, target key, device) -> spatial sizes seen
_layer_kernels: dict[tuple, Kernel] = {}                     # (those, kernel op) -> the layer's kernel
_layer_waiting: dict[tuple, list] = {}                     # (layer key, kernel op) -> entries until it loads
_listeners: list[Callable[[], None]] = []


def workers() -> int:
    """Compiles a background build runs at once: fewer than the cores (at least one)."""
    return max(1, min(knobs.build_jobs(), (os.cpu_count() or 2) - 1))


def on_swap(listener: Callable[[], None]) -> None:
    """Call `listener` after every swap of a generic kernel for a specialised one."""
    _listeners.append(listener)


def _in_generic_dir():
    """Builds and lookups in the generic kernels' own directory (knobs.generic_dir), apart from the
    kernel cache: once per machine, whichever cache a process uses."""
    return cache.rooted(knobs.generic_dir(), "CONVGEN_GENERIC_DIR")


def _tier(target: Target):
    """The generic tier's module for `target`: codegen/cpu/generic.py, or codegen/gpu/generic.py for a
    GPU target (the simulator's or a device's)."""
    return generic if target.kind is TargetKind.CPU else gpu_generic


def _build(sources: list, device: bool = False, parallel: int | None = None) -> list:
    """Artifacts of `sources`: one ninja run (the CPU's and the simulator's), or a device's libraries
    by its vendor's compiler (building/gpu_library.py), `parallel` (default CONVGEN_BUILD_JOBS)
    compiles at a time; every build ends before the first failure is raised (the others are cached)."""
    if not device:
        return build.build_many(sources, parallel=parallel)
    if len(sources) <= 1:
        return [gpu_library.build_library(source) for source in sources]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(sources), parallel or knobs.build_jobs())) as pool:
        futures = [pool.submit(gpu_library.build_library, source) for source in sources]
    return [future.result() for future in futures]


def _generic_build(sources: list, device: bool = False) -> list:
    """The generic tier's libraries of `sources`, built (or found) in their own directory."""
    with _in_generic_dir():
        return _build(sources, device)


def setup(target: Target | None = None, *, device: bool = False) -> list:
    """Build the generic tier's libraries for every dtype on `target` (the host's CPU; a GPU target's
    for the simulator, or with `device` for a device of its arch): once per machine."""
    target = target or host_cpu()
    tier = _tier(target)
    return _generic_build([tier.source(kop, dtype, target) for dtype in DType for kop in tier.KOPS], device)


def generic_built(plan: Plan) -> bool:
    """Whether the generic tier's library for `plan`'s kernel op is built (nothing is built; an
    unusable directory counts as not built: the call that needs it reports it)."""
    try:
        with _in_generic_dir():
            return build.cached(_tier(plan.target).source(plan.kop, plan.problem.dtype, plan.target)) is not None
    except CacheError:
        return False


def describe(plan: Plan, source) -> str:
    """Which tier a call of `plan`'s problem is served by under the current policy, in words."""
    policy, cached = knobs.jit(), build.cached(source) is not None
    tier, gpu = _tier(plan.target), plan.target.kind is not TargetKind.CPU
    where = "in the cache" if cached else "not built yet"
    if policy == "eager" or not tier.serves(plan):
        return f"specialised ({where}{'' if cached else '; the call builds it'}; CONVGEN_JIT={policy})"
    name = tier.source(plan.kop, plan.problem.dtype, plan.target).name
    if not generic_built(plan):
        name += f", not built yet in {knobs.generic_dir()}: `convgen setup` builds it, else the first call, once"
    if policy == "generic":
        return f"shape-generic ({name}; CONVGEN_JIT=generic)"
    if gpu:
        how = ("the implicit GEMM with run-time sizes on the matrix instructions, or the direct kernel where a group "
               f"has fewer than {gpu_generic.MIN_CHANNELS} channels or filters"
               if plan.kop in gpu_generic.IGEMM_KOPS else "the direct kernel with run-time sizes")
        layer = tier.source(plan.kop, plan.problem.dtype, plan.target, layer=plan).name if tier.layer_serves(plan) else ""
        dynamic = (f"; a layer seen with more than {DYNAMIC_AFTER} spatial sizes is dynamic: its kernel ({layer}: the "
                   f"implicit GEMM with channels and taps compiled in, spatial sizes at run time) serves all its sizes"
                   if layer else "")
        return (f"on a device: shape-generic ({name}: {how}) at once, then "
                f"specialised (its kernel {where}): call {HOT_CALLS} of the problem in a process queues its vendor "
                f"compile on the background builder (CONVGEN_JIT={policy}){dynamic}; in the simulator the "
                f"specialised kernel unless CONVGEN_JIT is set")
    layer = generic.source(plan.kop, plan.problem.dtype, plan.target, layer=plan).name
    return (f"shape-generic ({name}) at once, then specialised (its kernel {where}): call {HOT_CALLS} of the "
            f"problem in a process queues it on the background builder; a layer seen with more than "
            f"{DYNAMIC_AFTER} spatial sizes is dynamic: its kernel ({layer}: channels and taps compiled in, spatial "
            f"sizes at run time) is built in the background and serves all its sizes (CONVGEN_JIT=background)")


def _library(plan: Plan, load, device: bool = False) -> Kernel:
    """The generic tier's entry for `plan`'s kernel op (its dtype's four libraries built once; on a
    GPU device, loaded onto it)."""
    dtype, target, tier = plan.problem.dtype, plan.target, _tier(plan.target)
    key = (plan.kop, dtype, target.key(), device)
    with _lock:
        known = _libraries.get(key)
        if known is None:
            sources = [tier.source(kop, dtype, target) for kop in tier.KOPS]
            for kop, source, path in zip(tier.KOPS, sources, _generic_build(sources, device)):
                _libraries[(kop, dtype, target.key(), device)] = load(source, path)
            known = _libraries[key]
        return known


def layer_key(problem: ConvProblem) -> str:
    """The problem but for its batch and spatial sizes (and the output padding that picks a size)."""
    return dataclasses.replace(problem, n=-1, in_size=(0,) * len(problem.in_size),
                               output_padding=(0,) * len(problem.output_padding)).key()


def forget_layers() -> None:
    """Forget the spatial sizes seen per layer and the layers' kernels (no layer is dynamic after this)."""
    with _lock:
        _sizes_seen.clear()
        _layer_kernels.clear()
        _layer_waiting.clear()


def _layer_of(plan: Plan, device: bool) -> tuple:
    """A layer as the tiers count its sizes: the problem but for its sizes, on one target (a CPU layer
    and a GPU layer of the same problem are two layers, with two kernels)."""
    return layer_key(plan.problem), plan.target.key(), device


def _dynamic(plan: Plan, device: bool = False) -> bool:
    """Record the plan's spatial size for its layer; whether the layer is dynamic now."""
    with _lock:
        seen = _sizes_seen[_layer_of(plan, device)]
        seen.add(plan.problem.in_size)
        return len(seen) > DYNAMIC_AFTER


def serve(entries: Sequence, policy: str, load: Callable, device: bool = False) -> None:
    """Give each dispatch entry (its plan lowered, no kernel yet) a kernel under `policy`: the
    specialised one built now (eager, or a problem the generic tier does not serve), else the
    generic tier's, with a background build queued when the problem turns hot (background).
    `device`: the entries are a GPU device's (`load` loads onto it). On a GPU target a layer turns
    dynamic where its kernel op is the implicit GEMM's with groups it takes (gpu generic.layer_serves);
    the other layers' hot sizes each get their specialised build (a vendor compile of seconds)."""
    now = [e for e in entries if policy == "eager" or not _tier(e.plan.target).serves(e.plan)]
    if now:
        build_now(now, load, device)
    for e in entries:
        if e.kernel is not None:
            continue
        tier = _tier(e.plan.target)
        if tier.layer_serves(e.plan) and _dynamic(e.plan, device) and policy == "background":
            _serve_dynamic(e, load, device)
            continue
        hot = None if policy != "background" else (lambda e=e: submit(e, load, device))
        e.kernel = GenericKernel(_library(e.plan, load, device), generic.kinds(e.plan), generic.sizes(e.plan),
                                 hot_after=HOT_CALLS, on_hot=hot)   # (one size array for the CPU's and GPU's)
        e.tier = "generic"


def _serve_dynamic(e, load, device: bool = False) -> None:
    """A problem of a dynamic layer: the layer's kernel where loaded; else the generic kernel, until
    the layer's kernel, queued on the background builder by the layer's first such problem, loads
    and takes over every problem of the layer waiting for it."""
    lk = (*_layer_of(e.plan, device), e.plan.kop)
    with _lock:   # the builder's swap takes the same lock: no entry is left on the generic kernel
        layer = _layer_kernels.get(lk)
        if layer is not None:
            _on_layer(e, layer)
            return
        first = lk not in _layer_waiting
        _layer_waiting.setdefault(lk, []).append(e)
        e.kernel = GenericKernel(_library(e.plan, load, device), generic.kinds(e.plan), generic.sizes(e.plan))
        e.tier = "generic-dynamic"
    if first:
        tier = _tier(e.plan.target)
        _enqueue(_Job(lambda plan=e.plan: tier.source(plan.kop, plan.problem.dtype, plan.target, layer=plan),
                      lambda source, path: _swap_layer(lk, load(source, path)), device))


def _swap_layer(lk: tuple, kernel: Kernel) -> None:
    """The layer's kernel loaded: it serves the layer's problems from now on."""
    with _lock:
        _layer_kernels[lk] = kernel
        for e in _layer_waiting.pop(lk, []):
            if e.tier == "generic-dynamic":   # (not one an eager prepare has upgraded meanwhile)
                _on_layer(e, kernel)


def _on_layer(e, kernel: Kernel) -> None:
    """Entry `e` served by its layer's kernel (called under the lock)."""
    e.kernel = GenericKernel(kernel, generic.kinds(e.plan), generic.sizes(e.plan), counter="layer_calls")
    e.tier = "layer"


def build_now(entries: Sequence, load, device: bool = False) -> None:
    """Build (one ninja run; a device's: one vendor compile each) and load the specialised kernels of `entries`."""
    for e in entries:
        if e.source is None:
            e.source = emit(e.plan)
    paths = _build([e.source for e in entries], device)
    for e, path in zip(entries, paths):
        e.kernel = load(e.source, path)
        e.tier = "specialised"


# ---------------------------------------------------------------------------------- background

_queue: collections.deque = collections.deque()
_wake = threading.Condition(_lock)
_busy = 0                     # batches being built
_thread: threading.Thread | None = None
_closing = False


@dataclasses.dataclass
class _Job:
    """A background build: the source to build (made on the builder's thread) and what to do with
    the loaded artifact (a swap, under the lock)."""
    source: Callable[[], object]
    done: Callable[[object, object], None]
    device: bool = False   # a GPU device's kernel (its vendor's compiler), else a ninja build


def submit(entry, load, device: bool = False) -> None:
    """Queue `entry`'s specialised build on the background thread (started on first use)."""
    def done(source, path) -> None:
        kernel = load(source, path)
        with _lock:
            entry.source, entry.kernel, entry.tier = source, kernel, "specialised"
    _enqueue(_Job(lambda: entry.source or emit(entry.plan), done, device))


def _enqueue(job: _Job) -> None:
    global _thread
    with _wake:
        if _closing:
            return
        _queue.append(job)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_work, name="convgen-builder", daemon=True)
            _thread.start()
        _wake.notify_all()


def pending() -> int:
    """Background builds queued or under way."""
    with _lock:
        return len(_queue) + _busy


def wait(timeout: float | None = None, *, drop_queued: bool = False) -> bool:
    """Block until no background build is queued or under way (True), or `timeout` seconds pass.
    `drop_queued`: first drop the builds not yet started (nothing is lost but their speed), so that
    only the one under way is waited for, as before a process removes the cache it builds into."""
    with _wake:
        if drop_queued:
            _queue.clear()
        return _wake.wait_for(lambda: not _queue and not _busy, timeout)


def _work() -> None:
    global _busy
    while True:
        with _wake:
            _wake.wait_for(lambda: _queue or _closing)
            if _closing:
                return
            batch = [_queue.popleft() for _ in range(min(len(_queue), 4 * workers()))]
            _busy += 1
        try:
            _build_batch(batch)
        finally:
            with _wake:
                _busy -= 1
                _wake.notify_all()


def _build_batch(batch: list) -> None:
    """Emit, build and load a batch of kernels (specialised, or layers') and swap each in for the
    generic one."""
    try:
        sources = [job.source() for job in batch]
        with build.low_priority():   # compiles on what the caller's threads leave idle
            built = {device: iter(_build([s for s, job in zip(sources, batch) if job.device == device], device,
                                         parallel=workers()))
                     for device in {job.device for job in batch}}
            paths = [next(built[job.device]) for job in batch]
    except Exception as err:   # the generic kernels stay: correct, only slower
        _failed(len(batch), "a background build failed", err)
        return
    for job, source, path in zip(batch, sources, paths):
        try:
            job.done(source, path)
        except Exception as err:
            _failed(1, "a background build's kernel did not load", err)
            continue
        bump("background_builds")
        bump("swaps")
    notify()


def _failed(count: int, what: str, err: Exception) -> None:
    """Count and report `count` background builds that failed with `err`: the generic kernels keep
    serving them. An error that is neither convgen's nor the system's (a defect of convgen's own, such
    as a template that does not render) is named as such, with its type; the builder thread goes on."""
    bump("background_failures", count)
    own = isinstance(err, (ConvgenError, OSError))
    detail = str(err) if own else f"an internal error of convgen ({type(err).__name__}: {err}); please report it"
    warnings.warn(f"convgen: {what}, the generic kernels keep serving: {detail}", RuntimeWarning, stacklevel=1)


def notify() -> None:
    """Tell the listeners that kernels were swapped."""
    for listener in list(_listeners):
        listener()


def _close() -> None:
    """At exit: drop queued builds, let the one under way finish."""
    global _closing
    with _wake:
        _closing = True
        _queue.clear()
        _wake.notify_all()
    thread = _thread
    if thread is not None and thread.is_alive():
        thread.join()


atexit.register(_close)
