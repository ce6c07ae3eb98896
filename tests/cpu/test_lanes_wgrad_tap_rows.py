"""Tap-aligned register tiles of the lanes weight gradient (`Tiling.tap_rows`).

Each register tile is the kh x kw taps of one (input channel, kd), read at compile-time offsets
from one row pointer (templates/cpu/lanes_wgrad.cpp.j2). Checked against ATen in float64 with the
tiles forced on: 2-D and 3-D windows, kernels that are not square, dilation, strides, uneven
padding, groups, a partial block of output channels, items of several channels with a short last
item, several fixed parts of the reduction, channels-last inputs turned into planes per work item,
both layouts, with and without the bias gradient; and where the planner takes them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib

import pytest
import torch

from convgen.codegen.emit import emit
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target, host_cpu

from support.builds import kernels_by_key
from support.problems import conv_problem
from support.reference import check_weight_gradient

_problem = functools.partial(conv_problem, op=Op.BWD_WEIGHT)   # weight gradients (with the bias's by default)


# name, problem, input channels per work item, fixed parts of the reduction, planes per item (channels last)
CASES = [
    ("3x3", dict(n=2, c=5, k=32, size=(7, 9), kernel=(3, 3)), 2, 1, False),              # last item one channel
    ("3d", dict(n=2, c=3, k=20, size=(4, 5, 6), kernel=(3, 3, 3)), 2, 1, False),          # partial channel block
    ("dilated_strided_grouped", dict(n=3, c=6, k=36, size=(11, 10), kernel=(3, 3), stride=2, dil=2, pad=2,
                                     groups=2), 1, 3, False),
    ("3x2_uneven", dict(n=2, c=4, k=16, size=(8, 9), kernel=(3, 2), pad=((2, 0), (1, 0))), 3, 2, False),
    ("2x5_wide", dict(n=2, c=3, k=48, size=(5, 40), kernel=(2, 5), pad=((1, 0), (2, 2))), 1, 1, False),
    ("3d_strided", dict(n=2, c=4, k=32, size=(5, 6, 7), kernel=(3, 3, 3), stride=(2, 1, 2)), 4, 2, False),
    ("planes_per_item", dict(n=3, c=32, k=32, size=(6, 7), kernel=(3, 3)), 16, 2, True),
]
LAYOUTS = [Layout.CONTIGUOUS, Layout.CHANNELS_LAST]


def _plan(name, layout, bias):
    _, kw, channels, splits, planes = next(c for c in CASES if c[0] == name)
    problem = _problem(**kw, layout=layout, bias=bias)
    plan = lower(problem, host_cpu(), algorithm="lanes")
    kernel = problem.kernel
    taps = math.prod(kernel)
    tiling = dataclasses.replace(plan.tiling, tap_rows=True, kb=kernel[-2] * kernel[-1], rb=channels * taps,
                                 splits=splits, copy_per_item=1 if planes else 0, stage=False)
    return dataclasses.replace(plan, tiling=tiling)


def _keys():
    return [(name, layout, bias) for name, *_, planes in CASES for layout in LAYOUTS
            if not planes or layout is Layout.CHANNELS_LAST for bias in (True, False)]


@pytest.fixture(scope="module")
def kernels():
    return kernels_by_key(_keys(), _plan)


@pytest.mark.parametrize("key", _keys(), ids=lambda k: f"{k[0]}-{'nchw' if k[1] is Layout.CONTIGUOUS else 'cl'}"
                                                      f"-{'bias' if k[2] else 'no_bias'}")
def test_tap_aligned_tiles_match_aten(kernels, key):
    name, layout, bias = key
    plan, kernel = kernels[key]
    text = emit(plan).text
    assert "const ACC* p0 = xs + ro[rt];" in text and "TOFF1 =" in text
    assert ("fill_planes(x, lp, g" in text) == (plan.tiling.copy_per_item > 0)
    gen = torch.Generator().manual_seed(zlib.crc32(f"tap-rows-{name}-{layout}-{bias}".encode()))
    check_weight_gradient(kernel, plan.problem, gen)


def test_planner_takes_tap_aligned_tiles_where_they_hold_enough():
    target = cpu_target("avx512", 48 * 1024, 2 << 20)
    tiling = lambda **kw: lower(_problem(**kw, layout=Layout.CHANNELS_LAST), target, algorithm="lanes").tiling
    unet3d = tiling(n=2, c=32, k=32, size=(16, 32, 32), kernel=(3, 3, 3))
    assert unet3d.tap_rows and unet3d.kb == 9 and unet3d.nv == 2 and unet3d.rb % 27 == 0
    assert tiling(n=2, c=24, k=48, size=(16, 16), kernel=(3, 3)).tap_rows, "3 vectors x 9 taps"
    r50 = tiling(n=8, c=64, k=64, size=(56, 56), kernel=(3, 3))
    assert not r50.tap_rows and r50.kb == 6, "4 vectors x 9 taps would not fit the registers"
    assert not tiling(n=8, c=64, k=16, size=(56, 56), kernel=(3, 3)).tap_rows, "one vector x 9 taps: too few"
    assert not tiling(n=8, c=64, k=32, size=(1, 1024), kernel=(1, 5), pad=((0, 0), (2, 2))).tap_rows, "a row's window"
    bf16 = lower(_problem(n=2, c=32, k=32, size=(16, 32, 32), kernel=(3, 3, 3), dtype=DType.BF16),
                 dataclasses.replace(target, bf16_dot=True), algorithm="lanes").tiling
    assert not bf16.tap_rows, "pairs of pixels keep their own tiles"
    avx2 = lower(_problem(n=2, c=32, k=32, size=(16, 32, 32), kernel=(3, 3, 3)), cpu_target("avx2"),
                 algorithm="lanes").tiling
    assert not avx2.tap_rows, "16 registers: 2 x 9 accumulators do not fit"
