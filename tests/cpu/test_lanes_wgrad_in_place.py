"""The lanes weight gradient reading a channels-last grad_output in place (no packed copy).

Where each pixel's block of output channels is already one run (channels last, whole blocks, the
accumulator's own type) and packing would not pay (one block per pixel, or an item takes every
row), the kernel reads grad_output where it lies; the bias sums still come from it in the same
order. Each case is checked against ATen in float64 on every x86 code shape this CPU runs, with
and without the bias gradient, and the plan is checked to have taken that path.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import pytest
import torch

from convgen.codegen.emit import emit
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import host_cpu
from convgen.dispatch.problem import TORCH_DTYPES

from support.builds import load_keyed
from support.code_shapes import host_and_second
from support.problems import conv_problem
from support.reference import in_channels_last, rel_err, tolerance

# weight gradients (and the bias's, unless a test says otherwise), every operand channels last
_problem = functools.partial(conv_problem, op=Op.BWD_WEIGHT, layout=Layout.CHANNELS_LAST)


# (name, problem arguments): 64 output channels per group (whole blocks for every vector width)
# and few (input channel, tap) rows, so one item takes them all on every code shape
CASES = [
    ("3x3_pad", dict(n=2, c=5, k=64, size=(7, 9), kernel=(3, 3))),
    ("1x1", dict(n=3, c=16, k=64, size=(5, 6), kernel=(1, 1), pad=0)),            # input in place too
    ("stride2_grouped", dict(n=2, c=4, k=128, size=(9, 11), kernel=(3, 3), stride=2, groups=2)),
    ("3d", dict(n=1, c=2, k=64, size=(3, 5, 6), kernel=(3, 3, 3))),
    ("f64", dict(n=2, c=3, k=64, size=(6, 7), kernel=(3, 3), dtype=DType.F64)),
    ("one_pixel", dict(n=3, c=4, k=64, size=(3, 3), kernel=(3, 3), pad=0)),       # its planes are runs too
]


def _plans():
    for name, kw in CASES:
        for bias in (True, False):
            for which, target in host_and_second(bf16_dot=False):
                yield (name, bias, which), lower(_problem(**kw, bias=bias), target, algorithm="lanes")


@pytest.fixture(scope="module")
def kernels():
    return load_keyed(_plans())


def _why(plan) -> str:
    return "; ".join(reason for _, reason in plan.reasons)


@pytest.mark.parametrize("which", ["host", "second"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("name, kw", CASES, ids=[c[0] for c in CASES])
def test_weight_gradient_from_grad_output_in_place_matches_aten(kernels, name, kw, bias, which):
    if (name, bias, which) not in kernels:
        pytest.skip("this CPU runs one x86 code shape only (AVX2 without AVX-512): the host's runs instead")
    plan, kernel = kernels[(name, bias, which)]
    assert "Y" in plan.tiling.in_place, _why(plan)
    assert "GY_IN_PLACE = true" in emit(plan).text
    problem = plan.problem
    tdt = TORCH_DTYPES[problem.dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}-{bias}".encode()))
    x = in_channels_last(torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).to(tdt))
    gy = in_channels_last(torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).to(tdt))
    gw = in_channels_last(torch.full(problem.weight_shape, float("nan"), dtype=tdt))
    gb = torch.full((problem.k,), float("nan"), dtype=tdt)
    kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb if bias else None}, problem.n, 2)
    w = torch.empty(problem.weight_shape, dtype=torch.float64)
    _, ref_w, ref_b = torch.ops.aten.convolution_backward(
        gy.double(), x.double(), w, [problem.k], list(problem.stride), [lo for lo, _ in problem.padding],
        list(problem.dilation), False, list(problem.output_padding), problem.groups, [False, True, bias])
    terms = problem.n * torch.Size(problem.output_shape[2:]).numel()
    assert rel_err(gw, ref_w) <= tolerance(tdt, terms), f"grad_weight rel err {rel_err(gw, ref_w):.2e}"
    if bias:
        assert rel_err(gb, ref_b) <= tolerance(tdt, terms), f"grad_bias rel err {rel_err(gb, ref_b):.2e}"


@pytest.mark.parametrize("kw, why", [
    (dict(n=2, c=5, k=64, size=(7, 9), kernel=(3, 3), dtype=DType.BF16), "bf16 is widened: the pack converts it"),
    (dict(n=2, c=5, k=40, size=(7, 9), kernel=(3, 3)), "40 channels: the last block is partial"),
    (dict(n=2, c=64, k=256, size=(8, 8), kernel=(3, 3)),
     "four blocks a pixel and more rows than an item takes: the chunk's blocks would share a few L1 sets"),
])
def test_grad_output_packed_where_in_place_does_not_pay(kw, why):
    plan = lower(_problem(**kw), host_cpu(), algorithm="lanes")
    assert "Y" not in plan.tiling.in_place, why
    assert "grad_output packed pixel-major" in _why(plan), why


def test_contiguous_grad_output_is_packed():
    nchw = dataclasses.replace(_problem(n=2, c=5, k=64, size=(7, 9), kernel=(3, 3)), output_layout=Layout.CONTIGUOUS)
    assert "Y" not in lower(nchw, host_cpu(), algorithm="lanes").tiling.in_place
