"""Building a test module's kernels up front, in one parallel ninja run, instead of one at a time.

Through the API: `prebuild` prepares a list of problems (for the CPU, or the simulator of one
vendor); `problems_of_runs` lists those of CASES.md-style runs (support/cases.py), and
`prebuild_dry_run` finds and prepares those of any calls by running them once with nothing built.
Directly: `load_keyed` and `kernels_by_key` build and load lowered plans, each under a key a test
names.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import pytest
import torch

import convgen
from convgen.api.ops import call_problems
from convgen.dispatch import dispatch

from support import cases


def problems_of_runs(runs: Iterable[tuple]) -> list:
    """The distinct problems (in first-seen order) of the calls `cases.check_case` makes for each
    (case, torch dtype, operand variant) of `runs`: the forward and the backward under every mask."""
    problems = {}
    for case, dtype, variant in runs:
        ops = cases.operands(case, dtype, variant)
        for mask in cases.MASKS:
            for p in call_problems(ops.x, ops.w, ops.b, *case.args(), output_mask=mask, grad_output=ops.gy):
                problems[p.key()] = p
    return list(problems.values())


def prebuild(problems: list, sim: str | None = None, tf32: bool = False) -> int:
    """Build the kernels of `problems` in one ninja run, for the simulator of vendor `sim` ("cuda",
    "hip") where given, with torch's tf32 switch on where `tf32`; the session's build count after."""
    with pytest.MonkeyPatch.context() as mp:
        if sim is not None:
            mp.setenv("CONVGEN_SIM", sim)
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = tf32 or saved
        try:
            dispatch.prepare(problems)
        finally:
            torch.backends.cudnn.allow_tf32 = saved
    return convgen.stats()["builds"]


def prebuild_dry_run(workloads: Iterable[Callable[[], object]]) -> None:
    """Build the kernels of every workload (a call of the API, as a thunk) in one ninja run.

    The workloads first run with dispatch.prepare replaced by a recorder that notes each problem
    and hands out a placeholder entry without a kernel (for which the runtime fills the results
    with zeros), so nothing is built or run. Then every recorded problem is prepared for real, and
    each placeholder takes on its real entry's fields: a call that the runtime memoized during the
    dry run finds the real kernel there.
    """
    problems, placeholders = {}, {}

    def recorder(ps):
        entries = []
        for p in ps:
            problems[p.key()] = p
            entries.append(dispatch.Entry(plan=None, source=None))
            placeholders.setdefault(p.key(), []).append(entries[-1])
        return entries

    with pytest.MonkeyPatch.context() as m:
        m.setattr(dispatch, "prepare", recorder)
        for work in workloads:
            work()
    assert problems, "the dry run recorded no problem: did dispatch.prepare change its name?"
    for key, entry in zip(problems, dispatch.prepare(list(problems.values()))):
        for placeholder in placeholders[key]:
            for field in dataclasses.fields(entry):
                setattr(placeholder, field.name, getattr(entry, field.name))


def load_keyed(keyed: Iterable[tuple]) -> dict:
    """{key: (plan, loaded kernel)} for (key, plan) pairs, the plans built in one batch."""
    keyed = list(keyed)
    plans = [plan for _, plan in keyed]
    return dict(zip([key for key, _ in keyed], zip(plans, dispatch.load_plans(plans))))


def kernels_by_key(keys, plan_for) -> dict:
    """{key: (plan, loaded kernel)} for the plan `plan_for(*key)` of every key, built in one batch."""
    return load_keyed((key, plan_for(*key)) for key in keys)
