"""The GPU's shape-generic tier (codegen/gpu/generic.py) in the SIMT simulator: its kernels with every
size at run time (the implicit GEMM where a case's groups have 8+ channels and filters, the direct
kernels elsewhere; tests/sim/test_generic_igemm.py takes the implicit GEMM through its paths), against
ATen in float64 on every CASES.md case (each in one dtype and
layout, the four dtypes and three layouts in turn), every pass and output mask, forced with
CONVGEN_JIT=generic and built once for the module; and the background policy on a GPU target: a new
shape served by the generic kernel with no compiler on its path, its specialised kernel built in the
background once the problem is called again, then serving it.
"""

from __future__ import annotations

import pytest
import torch

import convgen
from convgen.codegen.target import parse_target
from convgen.dispatch import dispatch, tiers
from convgen.stats import reset

from support.cases import CASES, DTYPES, LOW_PRECISION_CASES, check_case, operands, variants_of
from support.tables import forget_tables



def _runs() -> list:
    """Each case once, its dtypes (bf16 and f16 where CASES.md runs them) and layouts in turn; every
    seventh on the HIP simulator (64-lane waves)."""
    params = []
    for i, case in enumerate(CASES):
        dtypes = ["f32", "f64"] + (["bf16", "f16"] if case.id in LOW_PRECISION_CASES else [])
        variants = variants_of(case)
        vendor, dtype, variant = "hip" if i % 7 == 3 else "cuda", dtypes[i % len(dtypes)], variants[i % len(variants)]
        params.append(pytest.param(vendor, case, dtype, variant, id=f"{vendor}-{case.id}-{dtype}-{variant}"))
    return params


def _fresh(monkeypatch, vendor: str, policy: str) -> None:
    monkeypatch.setenv("CONVGEN_SIM", vendor)
    monkeypatch.setenv("CONVGEN_JIT", policy)
    assert forget_tables(300), "a background build of an earlier test did not finish"
    reset()


@pytest.fixture(autouse=True)
def clean_tables():
    """After each test: no generic entry or remembered call left for the tests that follow."""
    yield
    forget_tables(300)


@pytest.fixture(scope="module")
def generic_built():
    """The simulator's generic libraries, every dtype, both vendors' default archs: built once."""
    return [tiers.setup(parse_target(t)) for t in ("cuda-sm_90", "hip-gfx90a")]


@pytest.mark.parametrize("vendor, case, dtype, variant", _runs())
def test_generic_tier_in_the_simulator(vendor, case, dtype, variant, generic_built, monkeypatch):
    _fresh(monkeypatch, vendor, "generic")
    check_case(case, DTYPES[dtype], operands(case, DTYPES[dtype], variant))
    counts = convgen.stats()
    assert counts["builds"] == 0, "the generic tier must not build anything once its libraries exist"
    empty = 0 in case.input or 0 in case.weight
    if empty:
        assert counts["generic_calls"] == 0, counts
    else:   # every call a generic kernel's launches (the implicit GEMM's weight gradient: two or three), in the simulator
        assert counts["generic_calls"] >= 8 and counts["sim_launches"] >= counts["generic_calls"], counts


def test_background_policy_in_the_simulator(generic_built, monkeypatch):
    """Call 1 runs the generic kernel, call 2 queues the specialised build (not on the call's path),
    which then serves call 3 -- each call's result matching ATen in float64."""
    _fresh(monkeypatch, "cuda", "background")
    x, w, b = torch.randn(2, 16, 9, 9), torch.randn(24, 16, 3, 3), torch.randn(24)
    ref = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1).float()
    key = None
    for call in range(3):
        y = convgen.conv2d(x, w, b, padding=1)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
        served = [e for e in dispatch._table.values()]
        assert len(served) == 1
        key = served[0]
        if call == 0:
            assert key.tier == "generic" and convgen.stats()["builds"] == 0
        if call == 1:
            assert tiers.wait(300)
    counts = convgen.stats()
    assert key.tier == "specialised" and key.plan.algorithm == "igemm", key.tier
    assert counts["generic_calls"] == 2 and counts["background_builds"] == 1 and counts["swaps"] == 1, counts


def test_explain_names_the_gpu_tier(monkeypatch):
    from convgen.codegen.emit import emit
    from convgen.codegen.pipeline import lower
    from convgen.dispatch.problem import base_problem

    problem = base_problem(torch.randn(2, 8, 8, 8), torch.randn(16, 8, 3, 3), None, 1, 1, 1, False, 0, 1)
    plan = lower(problem, parse_target("cuda-sm_90"))
    monkeypatch.setenv("CONVGEN_JIT", "generic")
    assert tiers.describe(plan, emit(plan)).startswith("shape-generic (generic_fwd_f32_cuda_sm_90")
    monkeypatch.setenv("CONVGEN_JIT", "background")
    assert "then specialised" in tiers.describe(plan, emit(plan))
    monkeypatch.setenv("CONVGEN_JIT", "eager")
    assert tiers.describe(plan, emit(plan)).startswith("specialised")
