"""In-process counters that let tests (and users) prove what happened.

Known counters (always present in `stats()`, starting at 0):

- builds: kernels compiled successfully by this process
- build_failures: kernels whose compile failed
- ninja_runs: ninja invocations (one per batch of missing kernels)
- disk_hits: kernels found valid in the on-disk cache
- memory_hits: kernels found in this process's memory (no disk access)
- corrupt_rebuilt: cache entries found corrupt (bad checksum or metadata), reported and rebuilt
- lock_waits: times a build lock was held by someone else and had to be waited for
- bundle_hits: problems served by a loaded ahead-of-time bundle (no lowering to a build)
- aten_forward, aten_backward: calls of torch's aten.convolution / aten.convolution_backward
  that convgen served (inside `convgen.enabled()`, runtime/api/serve_aten.py)
- sim_launches: GPU kernel launches run in the SIMT simulator (CONVGEN_SIM=cuda|hip)
- generic_calls: CPU kernel calls served by the shape-generic tier (runtime/dispatch/tiers.py)
- background_builds: specialised kernels built (or found on disk) by the background builder
- swaps: generic kernels replaced by specialised ones (or a dynamic layer's by its layer kernel) for later calls
- layer_calls: CPU kernel calls served by a dynamic layer's own kernel (its channels and taps compiled in,
  spatial sizes at run time; runtime/dispatch/tiers.py)
- aten_fallbacks: such calls inside `enabled()` that convgen left to ATen (a dtype it has no
  kernels for, or arguments its rules refuse)

Other modules may bump counters of their own; they appear once bumped.
"""

from __future__ import annotations

import threading

KNOWN = (
    "builds",
    "build_failures",
    "ninja_runs",
    "disk_hits",
    "memory_hits",
    "corrupt_rebuilt",
    "lock_waits",
    "bundle_hits",
    "aten_forward",
    "aten_backward",
    "aten_fallbacks",
    "sim_launches",
    "generic_calls",
    "background_builds",
    "swaps",
    "layer_calls",
)

_lock = threading.Lock()
_counts: dict[str, int] = {}


def bump(name: str, n: int = 1) -> None:
    """Add n to counter `name`."""
    with _lock:
        _counts[name] = _counts.get(name, 0) + n


def stats() -> dict[str, int]:
    """A copy of every counter; the known ones are present even when 0."""
    with _lock:
        result = dict.fromkeys(KNOWN, 0)
        result.update(_counts)
        return result


def reset() -> None:
    """Set every counter back to 0 (for tests)."""
    with _lock:
        _counts.clear()
