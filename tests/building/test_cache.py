"""The build cache, as DESIGN.md "Build and cache" specifies it.

Each test gets its own cache directory (CONVGEN_CACHE_DIR under tmp_path), fresh counters and
an empty in-process table, and builds trivial `extern "C"` kernels that it loads with ctypes to
prove they run. Tests that need a second process start `python -c` with the same environment.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from convgen.building import build as build_mod
from convgen.building import cache
from convgen import knobs
from convgen.building.build import build, build_many, compile_command, find_ninja, source_key, write_if_changed
from convgen.codegen.errors import BuildError, CacheError
from convgen.codegen.source import KernelSource
from convgen.codegen.target import Target, TargetKind, host_cpu
from convgen.stats import stats


def add_kernel(name: str = "add1", amount: int = 1) -> KernelSource:
    text = f'extern "C" int {name}(int x) {{ return x + {amount}; }}\n'
    return KernelSource(name, text, name, (("i32", "x"),), host_cpu())


def call(path: Path, entry: str, x: int = 41) -> int:
    return getattr(ctypes.CDLL(str(path)), entry)(x)


@pytest.fixture(autouse=True)
def private_cache(private_cache, monkeypatch):
    """conftest.py's cache of the test's own, for every test here, without the lock timeout and the
    verbosity a developer may have set."""
    monkeypatch.delenv("CONVGEN_LOCK_TIMEOUT", raising=False)
    monkeypatch.delenv("CONVGEN_VERBOSE", raising=False)
    return private_cache


# A child process that builds add_kernel(name, amount), optionally after waiting for a go-file,
# loads it and prints its counters, the value it computed and the artifact's path.
CHILD = r"""
import ctypes, json, os, sys, time
from convgen.codegen.source import KernelSource
from convgen.codegen.target import host_cpu
from convgen.building import build as b
from convgen.stats import stats
name, amount, go, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
text = 'extern "C" int %s(int x) { return x + %d; }\n' % (name, amount)
src = KernelSource(name, text, name, (("i32", "x"),), host_cpu())
if mode == "hang":  # take the locks, start building, never finish
    def hang(*args, **kwargs):
        print("building", flush=True)
        time.sleep(300)
    b._run_ninja = hang
if mode == "hold":  # hold the key's lock and wait
    from convgen.building import cache
    with cache.key_lock(b.source_key(src)):
        print("locked", flush=True)
        time.sleep(300)
while go != "-" and not os.path.exists(go):
    time.sleep(0.005)
path = b.build(src)
value = getattr(ctypes.CDLL(str(path)), name)(41)
print(json.dumps({"stats": stats(), "value": value, "path": str(path)}))
"""


def child(name="add1", amount=1, go="-", mode="run", **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, name, str(amount), str(go), mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs,
    )


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------- keys

BASE_KEY = dict(
    source_text='extern "C" int f(int x) { return x; }',
    command=["c++", "-O3", "-std=c++17", "{src}", "-o", "{out}"],
    compiler_identity="/usr/bin/g++-12\nc++\ng++ 12.2.0",
    target_key=Target(TargetKind.CPU, "avx2", 32).key(),
    version="0.1.0",
)
# One change per ingredient of the key; each must change it.
KEY_CHANGES = {
    "source_text": 'extern "C" int f(int x) { return x + 0; }',
    "command": ["c++", "-O2", "-std=c++17", "{src}", "-o", "{out}"],
    "compiler_identity": "/usr/bin/g++-13\nc++\ng++ 13.1.0",
    "target_key": Target(TargetKind.CPU, "avx512", 64).key(),
    "version": "0.1.1",
}


def test_key_lists_exactly_these_ingredients():
    assert list(inspect.signature(cache.artifact_key).parameters) == list(BASE_KEY)
    assert cache.artifact_key(**BASE_KEY) == cache.artifact_key(**BASE_KEY)
    assert cache.is_key(cache.artifact_key(**BASE_KEY))


@pytest.mark.parametrize("ingredient", sorted(KEY_CHANGES))
def test_each_ingredient_changes_the_key(ingredient):
    changed = dict(BASE_KEY, **{ingredient: KEY_CHANGES[ingredient]})
    assert cache.artifact_key(**changed) != cache.artifact_key(**BASE_KEY)


def test_source_key_follows_target_compiler_and_version(monkeypatch):
    src = add_kernel()
    base = source_key(src)
    generic = KernelSource(src.name, src.text, src.entry, src.signature, Target(TargetKind.CPU, "generic", 16))
    avx512 = KernelSource(src.name, src.text, src.entry, src.signature, Target(TargetKind.CPU, "avx512", 64))
    assert len({base, source_key(generic), source_key(avx512)}) == 3
    assert source_key(src, ["g++"]) != source_key(src, ["c++"])  # same binary, other command
    monkeypatch.setattr(knobs, "convgen_version", lambda: "999.0")
    assert source_key(src) != base


def test_compile_command_is_exact_ieee_and_keyed_without_temp_paths():
    command = compile_command("{src}", "{out}", Target(TargetKind.CPU, "avx2", 32), ["c++"])
    assert command[:6] == ["c++", "-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp"]
    assert "-march=x86-64-v3" in command and "-ffast-math" not in command
    path = build(add_kernel())
    meta = json.loads((path.parent / "meta.json").read_text())
    assert meta["command"][-3:] == ["{src}", "-o", "{out}"]
    assert meta["sha256"] == cache.file_sha256(path)
    assert (path.parent / "add1.cpp").read_text() == add_kernel().text


# ---------------------------------------------------------------------------------- counters


def test_cold_build_then_memory_then_disk_in_a_new_process(tmp_path):
    src = add_kernel()
    path = build(src)
    assert call(path, "add1") == 42
    assert stats()["builds"] == 1 and stats()["ninja_runs"] == 1 and stats()["disk_hits"] == 0
    assert build(src) == path
    assert stats()["memory_hits"] == 1 and stats()["builds"] == 1
    # a new process, started elsewhere: the cache does not depend on the working directory
    other = result(child(cwd=tmp_path))
    assert other["stats"]["disk_hits"] == 1 and other["stats"]["builds"] == 0
    assert other["value"] == 42 and other["path"] == str(path)


def test_many_kernels_build_in_one_ninja_run():
    sources = [add_kernel(f"add{i}", i) for i in range(1, 5)]
    paths = build_many(sources + sources[:1])  # a duplicate is built once
    assert stats()["ninja_runs"] == 1 and stats()["builds"] == 4
    assert [call(p, s.name, 10) for p, s in zip(paths, sources)] == [11, 12, 13, 14]
    assert paths[4] == paths[0]
    assert cache.info()["entries"] == 4


def test_write_if_changed_keeps_an_unchanged_file(tmp_path):
    path = tmp_path / "build.ninja"
    assert write_if_changed(path, "rule a\n") is True
    before = path.stat().st_mtime_ns
    time.sleep(0.01)
    assert write_if_changed(path, "rule a\n") is False
    assert path.stat().st_mtime_ns == before
    assert write_if_changed(path, "rule b\n") is True and path.read_text() == "rule b\n"


# ---------------------------------------------------------------------------------- concurrency


def test_four_processes_build_one_kernel_once(tmp_path):
    go = tmp_path / "go"
    procs = [child(go=go) for _ in range(4)]
    time.sleep(0.2)
    go.touch()
    results = [result(p) for p in procs]
    assert sum(r["stats"]["builds"] for r in results) == 1
    assert sum(r["stats"]["disk_hits"] for r in results) == 3
    assert {r["value"] for r in results} == {42}
    assert len({r["path"] for r in results}) == 1
    assert cache.info()["entries"] == 1


def test_killed_builder_does_not_block_others(monkeypatch):
    monkeypatch.setenv("CONVGEN_LOCK_TIMEOUT", "60")
    proc = child(mode="hang")
    assert proc.stdout.readline().strip() == "building"  # it holds the lock, mid-build
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)   # (also closes its pipes: left to the collector, they warn inside a later test)
    start = time.monotonic()
    path = build(add_kernel())
    assert time.monotonic() - start < 20  # far below the lock timeout
    assert call(path, "add1") == 42 and stats()["builds"] == 1
    leftovers = list((cache.root() / "tmp").iterdir())
    assert leftovers  # the dead builder's private directory
    cache.clear()
    assert not list((cache.root() / "tmp").iterdir())


def test_lock_timeout_names_the_lock(monkeypatch):
    proc = child(mode="hold")
    try:
        assert proc.stdout.readline().strip() == "locked"
        monkeypatch.setenv("CONVGEN_LOCK_TIMEOUT", "0.3")
        with pytest.raises(CacheError, match=r"CONVGEN_LOCK_TIMEOUT") as info:
            build(add_kernel())
        assert str(cache.root() / "locks") in str(info.value)
        assert stats()["lock_waits"] == 1
    finally:
        proc.kill()
        proc.communicate()


# ---------------------------------------------------------------------------------- failures


def test_truncated_artifact_is_reported_and_rebuilt():
    src = add_kernel()
    path = build(src)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    build_mod.clear_memory()
    with pytest.warns(RuntimeWarning, match="corrupt") as record:
        again = build(src)
    assert str(path.parent) in str(record[0].message)
    assert stats()["corrupt_rebuilt"] == 1 and stats()["builds"] == 2
    assert call(again, "add1") == 42
    assert cache.verify() == []


def test_compile_error_raises_with_command_output_source_and_repro():
    bad = KernelSource("broken", 'extern "C" int broken(int x) { return y; }\n', "broken", (), host_cpu())
    with pytest.raises(BuildError) as info:
        build(bad)
    error = info.value
    message = str(error)
    assert "was not declared" in message or "undeclared" in message  # the compiler's words
    assert "-O3" in message and "repro" in message
    assert error.source_path.read_text() == bad.text
    assert str(error.source_path) in error.repro and error.command[-3:-1] == [str(error.source_path), "-o"]
    assert cache.info()["entries"] == 0  # never cached
    with pytest.raises(BuildError):
        build(bad)  # tried again, failed again
    assert stats()["build_failures"] == 2 and stats()["ninja_runs"] == 2 and stats()["builds"] == 0


def test_good_kernels_of_a_failing_batch_are_kept():
    bad = KernelSource("broken", "this is not C++\n", "broken", (), host_cpu())
    with pytest.raises(BuildError, match="broken"):
        build_many([add_kernel(), bad])
    assert stats()["builds"] == 1 and cache.info()["entries"] == 1


def test_missing_compiler_names_cxx(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/cc")
    with pytest.raises(BuildError, match=r"/nonexistent/cc.*\$CXX"):
        build(add_kernel())


def test_missing_ninja_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "ninja", None)  # the PyPI package is not there either
    with pytest.raises(BuildError, match="ninja"):
        find_ninja()


# ---------------------------------------------------------------------------------- location


def test_cache_dir_that_is_a_file_names_the_variable(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(not_a_dir))
    with pytest.raises(CacheError, match="CONVGEN_CACHE_DIR") as info:
        build(add_kernel())
    assert str(not_a_dir) in str(info.value)


def test_relative_cache_dir_is_refused(monkeypatch):
    monkeypatch.setenv("CONVGEN_CACHE_DIR", "relative/cache")
    with pytest.raises(CacheError, match="CONVGEN_CACHE_DIR"):
        cache.root()


def test_cache_dir_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("CONVGEN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert knobs.cache_dir() == tmp_path / "xdg" / "convgen"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert knobs.cache_dir() == tmp_path / "home" / ".cache" / "convgen"


def test_cache_dir_is_created_user_only(tmp_path, monkeypatch):
    nested = tmp_path / "not" / "yet" / "there"
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(nested))
    cache.root()
    assert stat.S_IMODE(nested.stat().st_mode) == 0o700


# ---------------------------------------------------------------------------------- maintenance


def test_info_verify_and_clear():
    paths = build_many([add_kernel("add1", 1), add_kernel("add2", 2)])
    info = cache.info()
    assert info["entries"] == 2 and info["bytes"] > sum(p.stat().st_size for p in paths) - 1
    assert info["dir"] == str(cache.root())
    paths[1].write_bytes(b"not a library")
    problems = cache.verify()
    assert [p for p, _ in problems] == [paths[1].parent] and "sha256" in problems[0][1]
    assert cache.verify(remove=True) == problems
    assert cache.verify() == [] and cache.info()["entries"] == 1
    pch = cache.root() / "sim-pch" / ("0" * 64) / "sim"   # the simulator's precompiled headers go too
    pch.mkdir(parents=True, mode=0o700)
    (pch / "simt.h.gch").write_bytes(b"a precompiled header")
    assert cache.clear() == 1 and cache.info()["entries"] == 0
    assert not (cache.root() / "sim-pch").exists()
    build_mod.clear_memory()
    assert call(build(add_kernel("add1", 1)), "add1") == 42 and stats()["builds"] == 3
