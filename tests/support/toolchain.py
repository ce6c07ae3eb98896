"""The tools of the host and of the GPU vendors that some tests need: CUDA binary tools found on
PATH or in pip packages, NVIDIA's 16-bit type headers for the simulator (and its libraries built
per vendor), and the host compiler's AddressSanitizer and UndefinedBehaviorSanitizer runtimes,
under which a test runs a script in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from convgen import knobs
from convgen.building import sim_build
from convgen.building.machine_code import cuda_tool   # noqa: F401 (the tests' way to find nvdisasm)
from convgen.devices import sim

from support.paths import TESTS


def require_fp16() -> None:
    """Skip the calling test where the simulator has no 16-bit types (no CUDA toolkit headers)."""
    if sim_build.fp16_include_dir() is None:
        pytest.skip("NVIDIA's cuda_fp16.h/cuda_bf16.h (CUDA toolkit) not found: no 16-bit types in the simulator")


def sim_libraries(tmp_path_factory, directory: str, source_of, name_of) -> dict:
    """Each simulated vendor's library (`sim.build`) of `source_of(vendor)`, named `name_of(vendor)`,
    in a fresh temporary `directory`; skips where the simulator has no 16-bit types."""
    require_fp16()
    d = tmp_path_factory.mktemp(directory)
    return {vendor: sim.build(source_of(vendor), d, name_of(vendor), vendor) for vendor in sim_build.WARP}


def sanitizer_runtimes() -> list[str] | None:
    """The host compiler's libasan and libubsan, or None where it has either not."""
    found = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run([*knobs.cxx(), f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if not os.path.isabs(path):
            return None
        found.append(path)
    return found


def run_sanitized(script: str, tmp_path: Path, test_file: str) -> subprocess.CompletedProcess:
    """Run `script` (Python source) in a fresh process with ASan and UBSan preloaded (leaks not
    reported), with tmp_path as its first argument; it can import `support` and the test modules
    beside `test_file`. Skips the calling test where the host compiler has no such runtimes."""
    runtimes = sanitizer_runtimes()
    if runtimes is None:
        pytest.skip(f"the host compiler {knobs.cxx()[0]} has no libasan/libubsan")
    path = tmp_path / "asan_run.py"
    path.write_text(script)
    paths = [os.path.dirname(os.path.abspath(test_file)), str(TESTS), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "LD_PRELOAD": ":".join(runtimes), "ASAN_OPTIONS": "detect_leaks=0",
           "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.run([sys.executable, str(path), str(tmp_path)], capture_output=True, text=True, env=env)
