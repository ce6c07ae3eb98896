"""The opt-in tuning mode and its database: candidates timed once, the winner recorded per
machine and used by later processes (tuning on or off), shown by `explain`."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

import convgen
from convgen.dispatch import dispatch, tuning
from convgen.codegen.target import host_cpu
from convgen.api.ops import call_problems


def _operands_and_problem(c: int):
    """Operands of a 3x3 forward of `c` channels to 6 (9x11, padding 1) and its problem."""
    x, w = torch.randn(2, c, 9, 11), torch.randn(6, c, 3, 3)
    return x, w, call_problems(x, w, None, 1, 1, 1, False, 0, 1)[0]


def test_tuning_records_the_fastest_candidate_and_later_runs_use_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CONVGEN_TUNE", "1")
    x, w, problem = _operands_and_problem(5)
    y = convgen.conv2d(x, w, padding=1)
    torch.testing.assert_close(y, torch.nn.functional.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-5)
    entry = tuning.recorded(problem, host_cpu())
    assert entry is not None, "CONVGEN_TUNE=1 recorded nothing"
    assert set(entry["times_ms"]) == {"blocked", "lanes", "direct"}
    assert entry["algorithm"] == min(entry["times_ms"], key=entry["times_ms"].get)
    assert tuning.db_path(host_cpu()).is_file()

    # a fresh process, tuning off: the recorded winner is used and explained
    monkeypatch.delenv("CONVGEN_TUNE")
    code = f"""
import json, torch, convgen
from convgen.dispatch import dispatch
from convgen.api.ops import call_problems
x, w = torch.randn(2, 5, 9, 11), torch.randn(6, 5, 3, 3)
plan, _ = dispatch.plan_for(call_problems(x, w, None, 1, 1, 1, False, 0, 1)[0])
print(json.dumps([plan.algorithm, [r for p, r in plan.reasons if p == "algorithm"]]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    algorithm, reasons = json.loads(out.strip().splitlines()[-1])
    assert algorithm == entry["algorithm"]
    assert any("tuned on this machine" in r for r in reasons)


def test_without_tuning_nothing_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CONVGEN_TUNE", raising=False)
    x, w, problem = _operands_and_problem(7)
    convgen.conv2d(x, w, padding=1)
    assert tuning.recorded(problem, host_cpu()) is None
    assert not tuning.db_path(host_cpu()).exists()


def test_an_unreadable_database_is_ignored_and_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path))
    path = tuning.db_path(host_cpu())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{ not json")
    tuning._loaded.clear()
    x, w, problem = _operands_and_problem(9)
    assert tuning.recorded(problem, host_cpu()) is None
    monkeypatch.setenv("CONVGEN_TUNE", "1")
    plan, _ = dispatch.plan_for(problem)
    assert json.loads(path.read_text())[problem.kernel_key()]["algorithm"] == plan.algorithm
