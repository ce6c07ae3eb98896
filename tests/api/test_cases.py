"""The correctness cases of CASES.md, items 1-22, against ATen in float64.

Every case runs the forward pass and `convolution_backward` with each of the 8 output masks,
in float32 and float64, for these operand layouts:

    contiguous            every tensor contiguous
    channels_last         input channels-last (4-D: channels_last, 5-D: channels_last_3d)
    channels_last_weight  weight channels-last
    noncontig_input       input a strided view: repeat_interleave(x, 2, -1)[..., ::2]
    noncontig_grad        grad_output the same kind of view

(3-D tensors have no channels-last format, so the two channels-last variants do not exist for
the 1-D cases.) grad_output otherwise has the memory format of torch's forward output, as it
would coming back through autograd. Values are compared with the float64 reference, and
shapes and memory formats with torch's own call on the same tensors (support/reference.py).
The cases, their operands and the check are support/cases.py's (the GPU tests take them too).

The public API allocates its outputs itself, so they cannot be poisoned before a kernel runs;
instead every result must be free of NaN/inf where the reference is finite, and an unwritten
element would show as a large relative error (torch.empty rarely holds the right values).

Every kernel these tests need is built up front in one parallel ninja run (the `prebuilt`
fixture); each test then asserts that it built nothing, which proves the prebuild covered it
and that the batch size is not part of a kernel (cases 21 run at batch 1 and 2).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import convgen

from support.builds import prebuild, problems_of_runs
from support.cases import CASES, CHAIN_LAYERS, check_case, operands, runs
from support.reference import assert_close, generator_for, randn


PARAMS = runs()


@pytest.fixture(scope="module")
def prebuilt():
    """Build every kernel of this module's tests in one ninja run; the number of builds after it."""
    return prebuild(problems_of_runs(p.values for p in PARAMS))


@pytest.mark.parametrize("case, dtype, variant", PARAMS)
def test_case(case, dtype, variant, prebuilt):
    ops = operands(case, dtype, variant)
    builds = convgen.stats()["builds"]
    check_case(case, dtype, ops)
    assert convgen.stats()["builds"] == builds, "the prebuild missed a kernel of this test (or the batch size " \
                                                "made a new one)"


@pytest.mark.parametrize("case", [c for c in CASES if c.id.startswith("15")], ids=lambda c: c.id)
def test_empty_gradients_are_zero(case, prebuilt):
    """Case 15: the weight and bias gradients of an empty problem are zeros of the full size."""
    ops = operands(case, torch.float64, "contiguous")
    gx, gw, gb = convgen.convolution_backward(ops.gy, ops.x, ops.w, [case.k], *case.args(), [True, True, True])
    assert gx.shape == ops.x.shape and gw.shape == ops.w.shape and gb.shape == (case.k,)
    assert not gw.any() and not gb.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_transposed_chain_through_autograd(dtype, prebuilt):
    """Case 18 as a chain: 1x128x6x6 → 64 → 32 → 3 channels (48x48), gradients of every operand."""
    gen = generator_for(f"chain-{dtype}")
    x = randn(CHAIN_LAYERS[0].input, dtype, gen).requires_grad_()
    params = [(randn(c.weight, dtype, gen).requires_grad_(), randn((c.k,), dtype, gen).requires_grad_())
              for c in CHAIN_LAYERS]
    builds = convgen.stats()["builds"]

    def run(fn, x, params):
        for w, b in params:
            x = fn(x, w, b, stride=2, padding=1, output_padding=1)
        return x

    y = run(convgen.conv_transpose2d, x, params)
    x64 = x.detach().double().requires_grad_()
    params64 = [(w.detach().double().requires_grad_(), b.detach().double().requires_grad_()) for w, b in params]
    y64 = run(torch.nn.functional.conv_transpose2d, x64, params64)
    assert y.shape == (1, 3, 48, 48)
    assert_close(y, y64, dtype, "chain output")

    gy = randn(y.shape, dtype, gen)
    leaves = [x, *itertools.chain.from_iterable(params)]
    leaves64 = [x64, *itertools.chain.from_iterable(params64)]
    grads = torch.autograd.grad(y, leaves, gy)
    grads64 = torch.autograd.grad(y64, leaves64, gy.double())
    names = ["x"] + [f"layer{i + 1}.{n}" for i in range(len(params)) for n in ("weight", "bias")]
    for name, g, r in zip(names, grads, grads64):
        assert_close(g, r, dtype, f"gradient of {name}")
    assert convgen.stats()["builds"] == builds


def test_prebuild_covered_every_case(prebuilt):
    """Runs after the parametrised tests: all of them together built nothing after the prebuild."""
    assert convgen.stats()["builds"] == prebuilt
