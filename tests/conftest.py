"""Session setup shared by every test file: one fresh kernel cache directory per test session.

DESIGN.md "Testing": one cache directory per session, so a run never reads (or trusts) kernels
left by an earlier run, and parametrised kernels are built once and shared by every test of the
session. The tests run on every core by default (pyproject.toml: pytest-xdist's `-n auto`); the
workers of one run share its directory (the cache's per-kernel locks let one build a kernel while
another waits for it), so no kernel is built twice. Tests that need a cache of their own
(tests/building/test_cache.py, the `private_cache` fixture below) override CONVGEN_CACHE_DIR per
test with monkeypatch, which restores this session value afterwards.

The tests of specialised kernels run under CONVGEN_JIT=eager (set for the session unless the
environment sets it): a call builds its problem's kernel, as they count and inspect; the tiers'
tests (tests/api/test_tiers.py) set the policy they test.

CONVGEN_TEST_CACHE_DIR, when set, names the directory to use instead of a fresh one: for
iterating on the tests without rebuilding every kernel each run (CI leaves it unset).
What the tests share besides fixtures (the comparison helpers, problem builders, CASES.md's
cases, ...) lives in tests/support/.

torch's tf32 switch for convolutions (torch.backends.cudnn.allow_tf32, True by default) decides
whether f32 problems on GPU targets (CONVGEN_SIM, `--target cuda-...`) run on tf32 matrix
instructions. Every test runs with it False unless it says otherwise, so the tests written for
f32 on the CUDA cores (the direct kernel, f32's 1e-6 tolerance) keep testing that;
tests/gpu/test_tf32.py turns it on where it tests tf32 (and tests torch's default there).

Fixtures a test asks for by name: `private_cache` (a kernel cache of the test's own, with fresh
counters and an empty in-process table) and `one_thread`.
"""

from __future__ import annotations

import os

import pytest
import torch

from convgen.building import build
from convgen.stats import reset


@pytest.fixture(scope="session", autouse=True)
def session_cache_dir(tmp_path_factory):
    directory = os.environ.get("CONVGEN_TEST_CACHE_DIR")
    if not directory and os.environ.get("PYTEST_XDIST_WORKER"):
        # a worker's base temp is <the run's>/popen-gwN: the run's is common to its workers, and new each run
        directory = tmp_path_factory.getbasetemp().parent / "convgen-cache"
        directory.mkdir(exist_ok=True)
    elif not directory:
        directory = tmp_path_factory.mktemp("convgen-cache")
    saved = os.environ.get("CONVGEN_CACHE_DIR")
    os.environ["CONVGEN_CACHE_DIR"] = str(directory)
    saved_jit = os.environ.get("CONVGEN_JIT")
    os.environ.setdefault("CONVGEN_JIT", "eager")
    try:
        yield directory
    finally:
        if saved_jit is None:
            os.environ.pop("CONVGEN_JIT", None)
        if saved is None:
            os.environ.pop("CONVGEN_CACHE_DIR", None)
        else:
            os.environ["CONVGEN_CACHE_DIR"] = saved


def _tf32_off():
    """torch's tf32 switch off for the fixture's scope, then as it was."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved


# off for module- and session-scoped fixtures too (they are set up before any function's), and
# again for each test (a test that turns it on is undone after it)
f32_on_cuda_cores_in_session_fixtures_too = pytest.fixture(autouse=True, scope="session")(_tf32_off)
f32_on_cuda_cores_unless_a_test_allows_tf32 = pytest.fixture(autouse=True)(_tf32_off)


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A kernel cache of the test's own (tmp_path/cache), fresh counters and an empty in-process
    table of loaded kernels; the directory."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(directory))
    reset()
    build.clear_memory()
    yield directory
    build.clear_memory()


@pytest.fixture
def one_thread():
    """gradcheck makes hundreds of calls on tiny problems; on a busy machine each multi-threaded
    call waits for a free core (tests/api/test_cases.py checks the threaded kernels). The thread
    count is a run-time argument of the kernels, so this builds nothing new."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
