"""A channel-plane (NCHW) input copied channels innermost by the lanes forward (`Tiling.x_inner`).

The lanes forward reads its zero-padded copy of the input one value at a time (broadcast to every
lane of output channels). A channels-last input is copied channels innermost; a channel-plane input
was copied into planes, and where the layout rule says so (codegen/cpu/lanes_operands.py `x_inner`) it is now
copied channels innermost too: a transpose in the copy the kernel makes anyway. These cases force the
channels-innermost copy on channel-plane inputs (and the rule's own choice on the suite's shapes) and
check the results against ATen in float64, on every x86 code shape this CPU runs: every dtype (bf16 in
pairs of channels), groups, strides, dilations, uneven padding, 1-D and 3-D, an output channels last,
and the copy made per work item by each thread (`copy_per_item`).
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import pytest
import torch

from convgen.codegen.emit import emit
from convgen.codegen.ir import DType, Layout
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target

from support.builds import load_keyed
from support.code_shapes import host_and_second
from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient

_problem = functools.partial(conv_problem, layout=Layout.CONTIGUOUS)   # every operand in channel planes

CASES = [
    ("3x3", dict(n=3, c=5, k=20, size=(7, 9), kernel=(3, 3))),                       # items cross images
    ("dilated_uneven", dict(n=2, c=7, k=9, size=(10, 12), kernel=(3, 2), stride=(1, 2), pad=((2, 1), (0, 3)),
                            dil=(2, 3))),
    ("grouped_strided", dict(n=2, c=6, k=10, size=(9, 11), kernel=(3, 3), stride=2, groups=2)),
    ("1d", dict(n=2, c=12, k=16, size=37, kernel=5, pad=2)),
    ("3d", dict(n=2, c=17, k=18, size=(5, 6, 7), kernel=(3, 2, 3), stride=(2, 1, 2), dil=(2, 1, 1),
                pad=((2, 1), (0, 1), (1, 1)))),
    ("many_channels", dict(n=2, c=40, k=24, size=(6, 7), kernel=(3, 3), pad=2, dil=2)),   # 3 lines a pixel
    ("bf16", dict(n=2, c=9, k=20, size=(7, 9), kernel=(3, 3), dtype=DType.BF16)),      # an odd channel pair
    ("f64", dict(n=2, c=5, k=20, size=(7, 9), kernel=(3, 3), dtype=DType.F64)),
    ("f16", dict(n=2, c=5, k=20, size=(7, 9), kernel=(3, 3), dtype=DType.F16)),
    ("output_cl", dict(n=2, c=6, k=16, size=(8, 9), kernel=(3, 3),
                       layout=(Layout.CONTIGUOUS, Layout.CONTIGUOUS, Layout.CHANNELS_LAST))),
    ("per_item", dict(n=2, c=6, k=16, size=(9, 40), kernel=(3, 3))),                  # rows copied per item
]
PER_ITEM = ("per_item", "3x3", "bf16")


def _plans():
    for name, kw in CASES:
        for which, target in host_and_second(bf16_dot=False):
            plan = lower(_problem(**kw), target, algorithm="lanes")
            tiling = dataclasses.replace(plan.tiling, x_inner=True, in_place=(),
                                         copy_per_item=1 if name in PER_ITEM else 0)
            yield (name, which), dataclasses.replace(plan, tiling=tiling)


@pytest.fixture(scope="module")
def kernels():
    return load_keyed(_plans())


@pytest.mark.parametrize("which", ["host", "second"])
@pytest.mark.parametrize("name, kw", CASES, ids=[c[0] for c in CASES])
def test_planes_copied_channels_innermost_match_aten(kernels, name, kw, which):
    if (name, which) not in kernels:
        pytest.skip("this CPU runs one x86 code shape only (AVX2 without AVX-512): the host's runs instead")
    plan, kernel = kernels[(name, which)]
    text = emit(plan).text
    assert "CH_INNER = true;" in text, "the copy should be channels innermost"
    assert ("ROW_WINDOW = true" in text) == (name in PER_ITEM)
    assert plan.problem.input_layout is Layout.CONTIGUOUS, "the input is in channel planes"
    check_forward_or_data_gradient(kernel, plan.problem, torch.Generator().manual_seed(zlib.crc32(name.encode())))


def test_the_rule_takes_unit_stride_windows_of_many_channels():
    target = cpu_target("avx2")   # (16 registers: tiles across rows, which read a copy)
    tiling = lambda **kw: lower(_problem(**kw), target, algorithm="lanes").tiling
    assert tiling(n=4, c=256, k=256, size=(33, 33), kernel=(3, 3), pad=2, dil=2).x_inner, "deeplab_dil2"
    assert tiling(n=8, c=128, k=128, size=(28, 28), kernel=(3, 3)).x_inner
    assert tiling(n=2, c=128, k=192, size=(17, 17), kernel=(7, 1), pad=(3, 0)).x_inner
    assert not tiling(n=8, c=64, k=64, size=(56, 56), kernel=(3, 3)).x_inner, "fewer channels: planes"
    assert not tiling(n=8, c=128, k=128, size=(56, 56), kernel=(3, 3), stride=2).x_inner, "strided: planes"
    assert not tiling(n=2, c=128, k=128, size=(8, 28, 28), kernel=(3, 3, 3)).x_inner, "a depth window: planes"
    assert not lower(conv_problem(n=4, c=256, k=256, size=(33, 33), kernel=(3, 3), pad=2, dil=2,
                                  layout=Layout.CHANNELS_LAST), target, algorithm="lanes").tiling.x_inner, \
        "a channels-last input is copied channels innermost as it is"
    bf16_1x1 = lower(_problem(n=8, c=256, k=256, size=(14, 14), kernel=(1, 1), pad=0, dtype=DType.BF16),
                     cpu_target("avx512"), algorithm="lanes").tiling
    assert not bf16_1x1.in_place and not bf16_1x1.x_inner, "1x1: planes"
    in_place = lower(_problem(n=8, c=256, k=256, size=(14, 14), kernel=(3, 3)), cpu_target("avx512"),
                     algorithm="lanes").tiling
    assert in_place.in_place == ("X",) and not in_place.x_inner, "read in place: no copy to lay out"
