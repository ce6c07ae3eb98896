"""Channels-last inputs copied per work item instead of whole up front (`Tiling.copy_per_item`).

The lanes forward (no depth window) copies each item's zero-padded rows, and so does the stride-1
lanes data gradient of its grad_output; the lanes weight gradient turns each item's channels, one
image at a time, into zero-padded planes through register transposes (an item then takes every
block of output channels). Plans take these paths where the whole copy would exceed the L2; real
inputs that large take seconds in a test, so these plans lower the threshold to one byte (the weight
gradient's planes of an image still fit a quarter of the L2, as the kernel also requires). Every case is
checked against ATen in float64 on every x86 code shape this CPU runs. Forward: items that cross
images, rows wider than an item, strides, dilations, uneven padding, groups, one-row images, other
dtypes, channel-major items (which revisit rows the thread's buffer no longer holds), and 3-D (an
item's rows span its planes; strides, dilation, uneven padding, bf16); the data gradient's alike. Weight
gradient: parts of the reduction that split images, several blocks of output channels, strides
with dilation, 3-D, groups, uneven padding, other dtypes, with and without the bias gradient, and
its item layout with the whole copy (below the threshold: chunks still stop at each image's end).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib

import pytest
import torch

from convgen.codegen.emit import emit
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target
from convgen.dispatch.problem import TORCH_DTYPES

from support.builds import load_keyed
from support.code_shapes import host_and_second
from support.problems import conv_problem
from support.reference import check_weight_gradient, in_channels_last, rel_err, tolerance

_problem = functools.partial(conv_problem, layout=Layout.CHANNELS_LAST)   # every operand channels last


CASES = [
    ("3x3_images", dict(n=3, c=5, k=20, size=(7, 9), kernel=(3, 3))),              # items cross images
    ("wide_rows", dict(n=2, c=6, k=16, size=(4, 150), kernel=(3, 3))),              # items inside one row
    ("stride2_grouped", dict(n=2, c=6, k=10, size=(9, 11), kernel=(3, 3), stride=2, groups=2)),
    ("dilated_uneven", dict(n=2, c=7, k=9, size=(10, 12), kernel=(3, 2), stride=(1, 2), pad=((2, 1), (0, 3)),
                            dil=(2, 3))),
    ("one_row", dict(n=3, c=8, k=12, size=(1, 37), kernel=(1, 5), pad=((0, 0), (2, 2)))),
    ("bf16", dict(n=2, c=5, k=20, size=(7, 9), kernel=(3, 3), dtype=DType.BF16)),
    ("f64", dict(n=2, c=5, k=20, size=(7, 9), kernel=(3, 3), dtype=DType.F64)),
    ("channel_major", dict(n=2, c=9, k=48, size=(6, 40), kernel=(3, 3))),         # forced below
    # a depth window (forward only): an item's rows run from its first plane to its last
    ("3d", dict(n=2, c=16, k=20, size=(5, 6, 7), kernel=(3, 3, 3))),               # items cross planes, images
    ("3d_strided_dilated", dict(n=2, c=17, k=18, size=(7, 8, 9), kernel=(3, 2, 3), stride=(2, 1, 2), dil=(2, 1, 1),
                                pad=((2, 1), (0, 1), (1, 1)))),
    ("3d_bf16", dict(n=2, c=32, k=32, size=(4, 5, 6), kernel=(3, 3, 3), dtype=DType.BF16)),   # 64-byte pixels in pairs
]


def _plans():
    for name, kw in CASES:
        for which, target in host_and_second(bf16_dot=False):
            plan = lower(_problem(**kw), target, algorithm="lanes")
            # tiles within rows read the input in place (they read no padding); the copy is forced here
            in_place = bool(plan.tiling.row_split) and "X" in plan.tiling.in_place
            assert plan.tiling.copy_per_item > 0 or in_place, f"{name}: the plan should copy rows per item"
            tiling = dataclasses.replace(plan.tiling, copy_per_item=1, in_place=(),
                                         channel_major=plan.tiling.channel_major or name == "channel_major")
            yield (name, which), dataclasses.replace(plan, tiling=tiling)


@pytest.fixture(scope="module")
def kernels():
    return load_keyed(_plans())


@pytest.mark.parametrize("which", ["host", "second"])
@pytest.mark.parametrize("name, kw", CASES, ids=[c[0] for c in CASES])
def test_rows_copied_per_item_match_aten(kernels, name, kw, which):
    if (name, which) not in kernels:
        pytest.skip("this CPU runs one x86 code shape only (AVX2 without AVX-512): the host's runs instead")
    plan, kernel = kernels[(name, which)]
    text = emit(plan).text
    assert "ROW_WINDOW = true" in text and "pad_row(x, win" in text
    problem = plan.problem
    tdt = TORCH_DTYPES[problem.dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    x = in_channels_last(torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).to(tdt))
    w = in_channels_last(torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64).to(tdt))
    b = torch.randn(problem.k, generator=gen, dtype=torch.float64).to(tdt)
    out = in_channels_last(torch.full(problem.output_shape, float("nan"), dtype=tdt))
    kernel({"input": x, "weight": w, "bias": b, "output": out}, problem.n, 2)
    ref = torch.ops.aten.convolution(x.double(), w.double(), b.double(), list(problem.stride),
                                     [lo for lo, _ in problem.padding], list(problem.dilation), False,
                                     list(problem.output_padding), problem.groups) \
        if all(lo == hi for lo, hi in problem.padding) else _uneven_reference(problem, x, w, b)
    terms = problem.c // problem.groups * torch.Size(problem.kernel).numel()
    assert not torch.isnan(out).any(), "outputs left unwritten"
    assert rel_err(out, ref) <= tolerance(tdt, terms), f"rel err {rel_err(out, ref):.2e}"


def _uneven_reference(problem, x, w, b):
    """ATen's convolution of an input padded unevenly (explicit zero padding, then none)."""
    flat = [side for lo, hi in reversed(problem.padding) for side in (lo, hi)]
    xp = torch.nn.functional.pad(x.double(), flat)
    return torch.ops.aten.convolution(xp, w.double(), b.double(), list(problem.stride), [0] * len(problem.kernel),
                                      list(problem.dilation), False, list(problem.output_padding), problem.groups)


# Data gradient (stride 1): the forward's row cases where they apply
DGRAD_CASES = [(name, kw) for name, kw in CASES if kw.get("stride", 1) == 1]


def _dgrad_plans():
    for name, kw in DGRAD_CASES:
        for which, target in host_and_second(bf16_dot=False):
            plan = lower(_problem(**kw, op=Op.BWD_DATA, bias=False), target, algorithm="lanes")
            in_place = bool(plan.tiling.row_split) and "Y" in plan.tiling.in_place   # (as the forward's)
            assert plan.tiling.copy_per_item > 0 or in_place, f"{name}: the plan should copy rows per item"
            tiling = dataclasses.replace(plan.tiling, copy_per_item=1, in_place=(),
                                         channel_major=plan.tiling.channel_major or name == "channel_major")
            yield (name, which), dataclasses.replace(plan, tiling=tiling)


@pytest.fixture(scope="module")
def dgrad_kernels():
    return load_keyed(_dgrad_plans())


@pytest.mark.parametrize("which", ["host", "second"])
@pytest.mark.parametrize("name, kw", DGRAD_CASES, ids=[c[0] for c in DGRAD_CASES])
def test_data_gradient_rows_copied_per_item_match_aten(dgrad_kernels, name, kw, which):
    if (name, which) not in dgrad_kernels:
        pytest.skip("this CPU runs one x86 code shape only (AVX2 without AVX-512): the host's runs instead")
    plan, kernel = dgrad_kernels[(name, which)]
    text = emit(plan).text
    assert "ROW_WINDOW = true" in text and "pad_row(gy, win" in text
    problem = plan.problem
    tdt = TORCH_DTYPES[problem.dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(f"dgrad-{name}".encode()))
    gy = in_channels_last(torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).to(tdt))
    w = in_channels_last(torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64).to(tdt))
    gx = in_channels_last(torch.full(problem.input_shape, float("nan"), dtype=tdt))
    kernel({"grad_output": gy, "weight": w, "grad_input": gx}, problem.n, 2)
    flat = [side for lo, hi in reversed(problem.padding) for side in (lo, hi)]
    x = torch.nn.functional.pad(torch.empty(problem.input_shape, dtype=torch.float64), flat)
    ref = torch.ops.aten.convolution_backward(
        gy.double(), x, w.double(), None, list(problem.stride), [0] * len(problem.kernel), list(problem.dilation),
        False, list(problem.output_padding), problem.groups, [True, False, False])[0]
    crop = tuple(slice(lo, lo + size) for (lo, _), size in zip(problem.padding, problem.in_size))
    ref = ref[(slice(None), slice(None)) + crop]
    terms = problem.k // problem.groups * math.prod(problem.kernel)
    assert not torch.isnan(gx).any(), "elements left unwritten"
    assert rel_err(gx, ref) <= tolerance(tdt, terms), f"rel err {rel_err(gx, ref):.2e}"


def test_rows_per_item_only_where_they_apply():
    target = cpu_target("avx512")
    wide = _problem(n=8, c=64, k=64, size=(112, 112), kernel=(3, 3))   # tiles across rows: the padded copy
    assert lower(wide, target, algorithm="lanes").tiling.copy_per_item
    r50 = lower(_problem(n=8, c=64, k=64, size=(56, 56), kernel=(3, 3)), target, algorithm="lanes").tiling
    assert r50.row_split and r50.in_place == ("X",) and not r50.copy_per_item, "tiles within rows: read in place"
    bf16 = _problem(n=8, c=64, k=64, size=(56, 56), kernel=(3, 3), dtype=DType.BF16)   # widened: copied
    assert lower(bf16, target, algorithm="lanes").tiling.copy_per_item
    three_d = _problem(n=1, c=8, k=16, size=(4, 6, 6), kernel=(3, 3, 3))
    assert lower(three_d, target, algorithm="lanes").tiling.copy_per_item == 0, "a depth window keeps the whole copy"
    nchw = dataclasses.replace(_problem(n=2, c=8, k=16, size=(8, 8), kernel=(3, 3)), input_layout=Layout.CONTIGUOUS,
                               weight_layout=Layout.CONTIGUOUS, output_layout=Layout.CONTIGUOUS)
    assert lower(nchw, target, algorithm="lanes").tiling.copy_per_item == 0, "channel planes keep the whole copy"
    in_place = _problem(n=2, c=8, k=16, size=(8, 8), kernel=(1, 1), pad=0)
    assert lower(in_place, target, algorithm="lanes").tiling.copy_per_item == 0, "read in place, no copy at all"
    big_weights = _problem(n=8, c=512, k=512, size=(7, 7), kernel=(3, 3))
    plan = lower(big_weights, target, algorithm="lanes")
    assert plan.tiling.channel_major and plan.tiling.copy_per_item == 0, "channel-major items keep the whole copy"
    dgrad = lambda **kw: lower(_problem(op=Op.BWD_DATA, bias=False, **kw), target, algorithm="lanes").tiling
    assert dgrad(n=8, c=64, k=64, size=(112, 112), kernel=(3, 3)).copy_per_item, "a data gradient across rows"
    assert dgrad(n=8, c=64, k=64, size=(56, 56), kernel=(3, 3)).in_place == ("Y",), "r50_3x3_64's: in place"
    assert not dgrad(n=8, c=64, k=64, size=(56, 56), kernel=(3, 3), stride=2).copy_per_item, "stride phases"


# Weight gradient: 4 parts of the reduction (of 3 images: parts that split them), whole vectors of
# whole vectors of input channels per item
WGRAD_CASES = [
    ("3x3", dict(n=4, c=32, k=16, size=(9, 11), kernel=(3, 3))),
    ("blocks", dict(n=3, c=32, k=144, size=(9, 11), kernel=(3, 3))),      # several blocks, the last one partial
    ("blocks_stride2", dict(n=2, c=64, k=96, size=(13, 10), kernel=(3, 3), stride=2)),
    ("wide_rows", dict(n=4, c=32, k=16, size=(4, 45), kernel=(3, 3))),    # rows of several vectors of pixels
    ("split_images", dict(n=3, c=64, k=16, size=(7, 9), kernel=(3, 3))),
    ("stride2_dilated", dict(n=4, c=32, k=8, size=(10, 13), kernel=(3, 3), stride=2, pad=2, dil=2)),
    ("3d", dict(n=4, c=32, k=16, size=(3, 5, 6), kernel=(3, 3, 3))),
    ("grouped", dict(n=4, c=64, k=32, size=(7, 8), kernel=(3, 3), groups=2)),
    ("uneven", dict(n=4, c=32, k=16, size=(8, 9), kernel=(3, 2), pad=((2, 0), (1, 0)))),
    ("bf16", dict(n=4, c=32, k=16, size=(9, 11), kernel=(3, 3), dtype=DType.BF16)),
    ("f64", dict(n=4, c=32, k=16, size=(9, 11), kernel=(3, 3), dtype=DType.F64)),
]
WGRAD_SPLITS = 4
# cases also run with the whole copy in the per-item layout (chunks stopping at image ends)
WGRAD_WHOLE_COPY = ("blocks", "split_images", "stride2_dilated", "3d")


def _padded_plane(problem: ConvProblem) -> int:
    """Words of one zero-padded plane, as the kernel's copy holds it."""
    size = 1
    for x, k, s, d, (lo, hi) in zip(problem.in_size, problem.kernel, problem.stride, problem.dilation,
                                    problem.padding):
        y = (x + lo + hi - (k - 1) * d - 1) // s + 1
        size *= (y - 1) * s + (k - 1) * d + 1
    return size


def _largest_part(problem: ConvProblem, tiling) -> int:
    """Bytes of an item's planes of one image (the kernel's formula: its channels x an odd-line stride)."""
    acc = problem.dtype.accumulator.itemsize
    taps, line = math.prod(problem.kernel), 64 // acc
    return tiling.rb // taps * (-(-_padded_plane(problem) // line) | 1) * line * acc


def _wgrad_plans():
    for name, kw in WGRAD_CASES:
        for bias in (True, False):
            problem = _problem(**kw, op=Op.BWD_WEIGHT, bias=bias)
            for which, target in host_and_second(bf16_dot=False):
                # bf16 reduced in pairs (the host's default on AMD) takes its own paired copy of the input
                target = dataclasses.replace(target, bf16_dot=False)
                plan = lower(problem, target, algorithm="lanes")
                lanes, taps = plan.tiling.vector_lanes, math.prod(problem.kernel)
                rb = math.lcm(taps * lanes, plan.tiling.kb)   # whole vectors of channels, whole tiles of rows
                tiling = dataclasses.replace(plan.tiling, rb=rb, splits=WGRAD_SPLITS)
                assert _largest_part(problem, tiling) * 4 <= target.l2_bytes, f"{name}: a part within a quarter L2"
                # one byte: each item's planes; 2**40: the whole copy, in the same item layout
                for threshold in (1, 1 << 40) if name in WGRAD_WHOLE_COPY else (1,):
                    yield (name, bias, which, threshold), dataclasses.replace(
                        plan, tiling=dataclasses.replace(tiling, copy_per_item=threshold))


@pytest.fixture(scope="module")
def wgrad_kernels():
    return load_keyed(_wgrad_plans())


WGRAD_RUNS = [(name, kw, threshold) for name, kw in WGRAD_CASES
              for threshold in ((1, 1 << 40) if name in WGRAD_WHOLE_COPY else (1,))]


@pytest.mark.parametrize("which", ["host", "second"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("name, kw, threshold", WGRAD_RUNS,
                         ids=[f"{n}-{'planes' if t == 1 else 'whole_copy'}" for n, _, t in WGRAD_RUNS])
def test_planes_per_item_match_aten(wgrad_kernels, name, kw, bias, which, threshold):
    if (name, bias, which, threshold) not in wgrad_kernels:
        pytest.skip("this CPU runs one x86 code shape only (AVX2 without AVX-512): the host's runs instead")
    plan, kernel = wgrad_kernels[(name, bias, which, threshold)]
    assert "fill_planes(x, lp, g" in emit(plan).text
    gen = torch.Generator().manual_seed(zlib.crc32(f"wgrad-{name}-{bias}".encode()))
    check_weight_gradient(kernel, plan.problem, gen)


def test_planes_per_item_only_where_each_channel_is_turned_once():
    target = cpu_target("avx512")
    wgrad = lambda **kw: lower(_problem(op=Op.BWD_WEIGHT, **kw), target, algorithm="lanes").tiling.copy_per_item
    assert wgrad(n=8, c=64, k=64, size=(56, 56), kernel=(3, 3)), "r50_3x3_64's weight gradient turns its planes per item"
    assert wgrad(n=8, c=128, k=128, size=(56, 56), kernel=(3, 3), stride=2), "r50_3x3_128_s2: two blocks in each item"
    assert not wgrad(n=2, c=32, k=32, size=(16, 32, 32), kernel=(3, 3, 3)), "items of 140 rows: parts of channels"
    assert not wgrad(n=8, c=64, k=64, size=(56, 56), kernel=(1, 1), pad=0), "read in place"
