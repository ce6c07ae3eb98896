"""The examples run and agree with torch: each is started as a subprocess with small arguments
and must exit 0 (each exits 1 when convgen's results are off beyond float32 tolerance).

The subprocesses inherit this session's CONVGEN_CACHE_DIR (tests/conftest.py), so kernels that
other tests built already are disk hits.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TIMEOUT_S = 300

# (script, small arguments, a line its output must contain)
CASES = [
    ("train_small_cnn.py", ["--steps", "2", "--batch", "4", "--size", "16"], "OK: losses within"),
    ("audio_1d.py", ["--batch", "2", "--samples", "256", "--layers", "3", "--channels", "8", "--repeat", "1"],
     "OK: every result within"),
    ("volume_3d.py", ["--batch", "1", "--size", "8", "--width", "4", "--repeat", "1"], "OK: every result within"),
    # a bundle in a temporary directory ({tmp}); its first steps run in fresh processes with empty caches
    ("resnet18_aot.py", ["--batch", "2", "--size", "32", "--out", "{tmp}/resnet18"], "bundle == JIT bit for bit: True"),
    ("quickstart.py", [], "counters:"),
    ("enabled_overhead.py", ["--rounds", "1", "--calls", "2"], "torch alone"),
    # its own empty kernel cache (the generic tier's libraries live apart: convgen setup built them)
    ("variable_sizes.py", ["--steps", "3", "--batch", "2", "--min", "12", "--max", "20"], "OK: losses within"),
]


@pytest.mark.parametrize("script, args, expected", CASES, ids=[case[0] for case in CASES])
def test_example_runs_and_agrees_with_torch(script, args, expected, tmp_path):
    command = [sys.executable, str(EXAMPLES / script), *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:  # run() has killed it; its partial output may be bytes
        partial = "\n".join(o.decode(errors="replace") if isinstance(o, bytes) else o for o in (e.stdout, e.stderr) if o)
        pytest.fail(f"{' '.join(command)} did not finish within {TIMEOUT_S} s; its output:\n{partial}")
    output = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, f"{' '.join(command)} exited with status {proc.returncode}:\n{output}"
    assert expected in proc.stdout, f"{' '.join(command)} did not print {expected!r}:\n{output}"
