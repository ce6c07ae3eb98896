"""Few channels in channels last (RGB and two-channel images under depthwise filters): a pixel's
channels would fill few of a vector's lanes, so grouplanes (channels in the lanes) does not take
them (codegen/cpu/grouplanes.py `few_channels`); kernels with pixels in the lanes do. Every pass and
output mask against ATen in float64, in both layouts and every dtype, through the public API, and
the rule itself on the plans of every CPU code shape.
"""

from __future__ import annotations

import pytest
import torch

from convgen.codegen.cpu import grouplanes
from convgen.codegen.ir import Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target

from support.cases import Case, check_case, operands
from support.problems import conv_problem

# (what it is, the case): image filters of 2 and 3 channels, one per group
CASES = [
    Case("rgb-1x9-box-blur", (1, 3, 24, 40), 3, (1, 9), padding=(0, 4), groups=3),
    Case("rgb-3x3-sharpen-strided", (2, 3, 17, 19), 3, (3, 3), stride=2, padding=1, groups=3),
    Case("two-channel-5x5-dilated", (1, 2, 21, 16), 2, (5, 5), padding=4, dilation=2, groups=2),
    # an upsampling filter (a transposed depthwise convolution with a bias): its forward is the flat
    # data gradient in channels last, with the bias
    Case("rgb-transposed-rows-x2", (2, 3, 9, 17), 3, (4, 3), stride=(2, 1), padding=1, groups=3,
         transposed=True),
]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("variant", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_few_channel_filters_match_aten(case, dtype, variant):
    check_case(case, dtype, operands(case, dtype, variant))


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("channels", [1, 2, 3, 4, 8, 16])
def test_grouplanes_takes_only_channels_that_fill_half_a_vector(isa, channels):
    """f32 lanes: 16 (AVX-512), 8 (AVX2); grouplanes from half of them, pixels in the lanes below."""
    target = cpu_target(isa)
    lanes = target.vector_bytes // 4
    for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT):
        p = conv_problem(2, channels, channels, (32, 32), 3, pad=1, groups=channels, op=op,
                         layout=Layout.CHANNELS_LAST)
        plan = lower(p, target)
        if channels == 1:   # one group: not grouped at all
            assert plan.algorithm != grouplanes.NAME
        elif 2 * channels >= lanes:
            assert plan.algorithm == grouplanes.NAME, (op, plan.algorithm)
        else:
            assert grouplanes.NAME not in plan.candidates, (op, plan.candidates)
            assert grouplanes.few_channels(plan) == f"{channels} channels a pixel fill {channels} of {lanes} lanes"


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_strided_forward_of_few_channels_leaves_lanes(isa, channels):
    """A forward strided along the rows with a channels-last result took lanes (channels in the lanes)
    whatever its tile's score; with a channel or three a group, lanes' vectors are mostly idle: blocked
    (columns in the lanes) takes it (RGB 3x3 stride-2 depthwise filter on Zen 1: 5.2 -> 1.4 ms)."""
    target = cpu_target(isa)
    p = conv_problem(2, channels, channels, (64, 64), 3, stride=2, pad=1, groups=channels, op=Op.FWD,
                     layout=Layout.CHANNELS_LAST)
    plan = lower(p, target)
    assert plan.algorithm == "blocked", plan.reasons
    # many channels a group keep lanes
    wide = conv_problem(2, 64, 64, (64, 64), 3, stride=2, pad=1, op=Op.FWD, layout=Layout.CHANNELS_LAST)
    assert lower(wide, target).algorithm == "lanes"
