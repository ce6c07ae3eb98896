"""Large CPU results on transparent huge pages (runtime/devices/cpu.py `advise_huge_pages`, and the
eager launcher's `huge_pages` in templates/eager/launcher.cpp.j2).

A result of HUGE_OUTPUT_BYTES or more comes from a fresh mmap on every call (glibc's largest mmap
threshold is 32 MiB), so its first write faults once per 4 KB page; convgen asks for 2 MB pages
under it (madvise MADV_HUGEPAGE) before its kernel writes it. These tests check that the advice is
given where it should be (the result's mapping carries the `hg` flag in /proc/self/smaps) and not
below the threshold, on both the Python path (gradients) and the launcher's forward, and that the
results are still right against ATen in float64.

Each test runs in a fresh interpreter (`_in_a_fresh_process`): a mapping keeps the advice after the
tensor that got it is freed, and glibc serves even a 32 MiB request from a free heap chunk when one
is large enough, so in a long-lived test worker a small result can land in heap memory that an
earlier test's large result had advised (CI saw a small forward's mapping flagged that way). In a
fresh process the only advice given is the test's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import convgen
from convgen.api import eager, ops
from convgen.devices import cpu

from support.reference import generator_for, rel_err, tolerance

SMAPS = Path("/proc/self/smaps")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not SMAPS.exists(),
                                reason="huge-page advice is a Linux call, checked through /proc/self/smaps")

_CHILD = "CONVGEN_HUGE_PAGES_TEST_CHILD"


def _in_a_fresh_process(request) -> bool:
    """In the test's own process: run this test again in a fresh interpreter (same kernel cache),
    check that it passed there, and return True (the caller returns). In that fresh process: False,
    and the test runs."""
    if os.environ.get(_CHILD):
        return False
    env = dict(os.environ, **{_CHILD: "1"})
    env["CONVGEN_TEST_CACHE_DIR"] = os.environ["CONVGEN_CACHE_DIR"]   # the session's kernels
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                           request.node.nodeid], cwd=request.config.rootpath, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"in a fresh process:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    return True


# A depthwise 3x3 (padding 1) whose input and output take 2 x 64 x 256 x 256 f32: 32 MiB each.
N, C, H, W = 2, 64, 256, 256


def _flags(t: torch.Tensor) -> set[str]:
    """The VmFlags of the mapping that holds the middle of `t`'s memory."""
    addr = t.data_ptr() + t.numel() * t.element_size() // 2
    inside = False
    for line in SMAPS.read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise AssertionError(f"no mapping of /proc/self/smaps holds address {addr:#x}")


def _operands(test_id: str, size=(N, C, H, W)):
    gen = generator_for(test_id)
    x = torch.randn(size, generator=gen)
    w = torch.randn(size[1], 1, 3, 3, generator=gen)
    b = torch.randn(size[1], generator=gen)
    return x, w, b


ARGS = ([1, 1], [1, 1], [1, 1], False, [0, 0])   # stride, padding, dilation, transposed, output_padding


def _forward_reference(x, w, b):
    return torch.ops.aten.convolution(x.double(), w.double(), b.double(), *ARGS, C)


def _backward_reference(x, w, gy):
    return torch.ops.aten.convolution_backward(gy.double(), x.double(), w.double(), [C], *ARGS, C,
                                               [True, True, True])


def test_the_advice_marks_large_tensors_and_leaves_small_ones_alone(request):
    if _in_a_fresh_process(request):
        return
    big = cpu.advise_huge_pages(torch.empty(cpu.HUGE_OUTPUT_BYTES // 4 + 1024))
    assert "hg" in _flags(big)
    small = cpu.advise_huge_pages(torch.empty(cpu.HUGE_OUTPUT_BYTES // 4 - 1024))
    assert "hg" not in _flags(small)


def test_gradients_on_the_python_path(request):
    if _in_a_fresh_process(request):
        return
    ops.forget_calls()
    x, w, b = _operands("huge-pages-grads")
    gy = torch.randn(N, C, H, W, generator=generator_for("huge-pages-grads-gy"))
    gx, gw, gb = convgen.convolution_backward(gy, x, w, [C], *ARGS, C, [True, True, True])
    assert gx.numel() * gx.element_size() >= cpu.HUGE_OUTPUT_BYTES
    assert "hg" in _flags(gx)
    assert "hg" not in _flags(gw)   # 2 KB: from the heap, no advice
    ref = _backward_reference(x, w, gy)
    for got, want, terms in ((gx, ref[0], 9), (gw, ref[1], N * H * W), (gb, ref[2], N * H * W)):
        assert rel_err(got, want) <= tolerance(torch.float32, terms)


@pytest.mark.parametrize("path", ["launcher", "python"])
def test_forward_output(path, monkeypatch, request):
    if _in_a_fresh_process(request):
        return
    ops.forget_calls()
    if path == "launcher":
        eager.setup()
        assert eager.module() is not None, eager.status()
        # the Python path's advice off: only the launcher's own can mark the output
        monkeypatch.setattr(cpu, "advise_huge_pages", lambda t: t)
    else:
        monkeypatch.setenv("CONVGEN_LAUNCHER", "0")
    try:
        x, w, b = _operands(f"huge-pages-forward-{path}")
        y = convgen.conv2d(x, w, b, padding=1, groups=C)
        assert "hg" in _flags(y)
        ref = _forward_reference(x, w, b)
        assert rel_err(y, ref) <= tolerance(torch.float32, 9)
        # the same call below the threshold (one image less than half): no advice
        small = convgen.conv2d(x[:1, : C // 2], w[: C // 2], b[: C // 2], padding=1, groups=C // 2)
        assert small.numel() * small.element_size() < cpu.HUGE_OUTPUT_BYTES
        assert "hg" not in _flags(small)
    finally:
        ops.forget_calls()
