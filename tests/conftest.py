"""Session setup shared by every test file: one fresh kernel cache directory per test session.

DESIGN.md "Testing": one cache directory per session, so a run never reads (or trusts) kernels
left by an earlier run, and parametrised kernels are built once and shared by every test of the
session. Tests that need a cache of their own (tests/test_cache.py) override CONVGEN_CACHE_DIR
per test with monkeypatch, which restores this session value afterwards.

CONVGEN_TEST_CACHE_DIR, when set, names the directory to use instead of a fresh one: for
iterating on the tests without rebuilding every kernel each run (CI leaves it unset).
The comparison helpers live in tests/reference.py.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def session_cache_dir(tmp_path_factory):
    directory = os.environ.get("CONVGEN_TEST_CACHE_DIR") or tmp_path_factory.mktemp("convgen-cache")
    saved = os.environ.get("CONVGEN_CACHE_DIR")
    os.environ["CONVGEN_CACHE_DIR"] = str(directory)
    try:
        yield directory
    finally:
        if saved is None:
            os.environ.pop("CONVGEN_CACHE_DIR", None)
        else:
            os.environ["CONVGEN_CACHE_DIR"] = saved
