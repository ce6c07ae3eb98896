"""The kernel tiers' in-process state, forgotten between tests: what a test of the generic tier or the
background policy starts from, and leaves behind for the tests that follow in its process."""

from __future__ import annotations

from convgen.api import ops
from convgen.dispatch import dispatch, tiers


def forget_tables(timeout: float) -> bool:
    """Wait (up to `timeout` seconds) for the background builds, then forget every dispatch entry, the
    calls ops.py remembers (they hold bound kernels) and the spatial sizes seen per layer. Returns
    whether the builds finished in time."""
    finished = tiers.wait(timeout)
    dispatch.clear()
    ops.forget_calls()
    tiers.forget_layers()
    return finished
