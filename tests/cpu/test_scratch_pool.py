"""The process-wide pool of large CPU kernel buffers (templates/cpu/common.h.j2, devices/cpu.py).

Each call's padded copies, packs and partial sums are blocks that the runtime's pool keeps for the
next call (up to CONVGEN_SCRATCH_MB), instead of glibc returning them to the system and the next
call faulting their pages in again. Checked: kernels share one pool, a reused block (holding the
previous call's data) gives results as right as a fresh one, across problems that take each
other's blocks, a second call of a kernel with a 36 MB copy (which glibc always maps anew) faults
none of its pages back in, and with the budget at 0 every call allocates its own, still right.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

import torch

import convgen
from convgen.devices import cpu

from support.reference import rel_err, tolerance


def _wgrad(x, gy, w, padding, dilation=1):
    """convgen's weight and bias gradients of a 1-D convolution, and ATen's in float64."""
    args = ([1], [padding], [dilation], False, [0], 1)
    mask = (False, True, True)
    ours = convgen.convolution_backward(gy, x, w, [w.shape[0]], *args, mask)
    ref = torch.ops.aten.convolution_backward(gy.double(), x.double(), w.double(), [w.shape[0]], *args, mask)
    return ours[1:], ref[1:]


def test_reused_blocks_give_the_same_results_as_fresh_ones():
    gen = torch.Generator().manual_seed(7)
    shapes = [(2, 48, 9000, 3, 1, 1), (3, 32, 11000, 5, 2, 2), (2, 48, 9000, 3, 1, 1), (1, 64, 7000, 3, 4, 4)]
    for rep in range(2):
        for n, c, length, k, pad, dil in shapes:
            x = torch.randn(n, c, length, generator=gen)
            w = torch.randn(c, c, k, generator=gen)
            out_len = length + 2 * pad - dil * (k - 1)
            gy = torch.randn(n, c, out_len, generator=gen)
            ours, ref = _wgrad(x, gy, w, pad, dil)
            for what, o, r in zip(("grad_weight", "grad_bias"), ours, ref):
                assert rel_err(o, r) <= tolerance(torch.float32, n * out_len), (rep, n, c, length, what)
    assert cpu._pool is not None, "no kernel library shared its pool"


def test_a_second_call_does_not_fault_its_copies_in_again():
    # 2 x 64 x 70000 f32: the grad_output pack and the padded input copy take 36 MB each, above the
    # largest size glibc ever keeps in its heap (32 MB): without the pool, 17000+ faults per call
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(2, 64, 70000, generator=gen)
    w = torch.randn(64, 64, 3, generator=gen)
    gy = torch.randn(2, 64, 70000, generator=gen)
    args = ([1], [1], [1], False, [0], 1)
    ref = torch.ops.aten.convolution_backward(gy.double(), x.double(), w.double(), [64], *args, (False, True, False))[1]
    faults = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ours = convgen.convolution_backward(gy, x, w, [64], *args, (False, True, False))[1]
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        assert rel_err(ours, ref) <= tolerance(torch.float32, 2 * 70000)
    # the first call maps its blocks; the later ones find them in the pool
    assert faults[2] < 1000, faults


def test_budget_zero_allocates_every_call():
    code = textwrap.dedent("""
        import torch, convgen
        from convgen.devices import cpu
        gen = torch.Generator().manual_seed(9)
        x = torch.randn(2, 32, 5000, generator=gen); w = torch.randn(32, 32, 3, generator=gen)
        gy = torch.randn(2, 32, 5000, generator=gen)
        args = ([1], [1], [1], False, [0], 1)
        for _ in range(2):
            ours = convgen.convolution_backward(gy, x, w, [32], *args, (False, True, True))
            ref = torch.ops.aten.convolution_backward(gy.double(), x.double(), w.double(), [32], *args, (False, True, True))
            err = (ours[1].double() - ref[1]).norm() / ref[1].norm()
            assert err < 1e-5, err
        assert cpu._pool is None
        print("ok")
    """)
    env = dict(os.environ, CONVGEN_SCRATCH_MB="0")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
