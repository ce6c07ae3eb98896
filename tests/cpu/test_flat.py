"""The flat forward and data gradient (codegen/cpu/flat.py): depthwise rows of few channels in
channels last as flat runs of (column, channel) values in the vector lanes, each tap's weights
C / gcd(C, V) lane patterns.

Checked against ATen in float64 on both x86 code shapes (AVX-512's 16 f32 lanes: up to 7 channels;
AVX2's 8: up to 3), outputs poisoned with NaN: every pattern count (1, 3, 5, 7), taps reaching the
padding on both ends, uneven padding, padding wider than the kernel (rows of bias alone), dilation,
strides across rows (the data gradient's rows a tap lands on), rows narrower than a vector (edges
only), rows cut into parts (few rows an image), 3-D, and each dtype the lanes allow. Then the rule:
flat where it fits, not at a stride along the rows nor in NCHW.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from convgen.codegen.cpu import flat
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target

from support.builds import kernels_by_key
from support.code_shapes import x86_shape
from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient

# (name, channels, input size, kernel, stride, padding, dilation, batch)
CASES = [
    ("rgb_1x9", 3, (5, 40), (1, 9), (1, 1), ((0, 0), (4, 4)), (1, 1), 2),
    ("rgb_3x3_rows_s2", 3, (9, 21), (3, 3), (2, 1), ((1, 1), (1, 1)), (1, 1), 2),
    ("two_5x5_dil2", 2, (11, 16), (5, 5), (1, 1), ((4, 4), (4, 4)), (2, 2), 1),
    ("one_uneven", 1, (6, 37), (3, 5), (1, 1), ((1, 1), (0, 4)), (1, 1), 2),
    ("pad_beyond", 3, (4, 9), (3, 3), (1, 1), ((3, 3), (3, 3)), (1, 1), 1),
    ("narrow", 3, (5, 2), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 2),
    ("row_parts", 2, (1, 300), (1, 7), (1, 1), ((0, 0), (3, 3)), (1, 1), 1),
    ("rows_s3_dil2", 1, (13, 50), (3, 4), (3, 1), ((2, 2), (1, 2)), (2, 3), 1),
    ("five", 5, (4, 23), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 2),
    ("six_dil3", 6, (7, 19), (3, 3), (1, 1), ((3, 3), (2, 4)), (3, 3), 1),
    ("seven_3d", 7, (3, 4, 10), (3, 3, 3), (1, 2, 1), ((1, 1), (1, 1), (1, 1)), (1, 1, 1), 1),
]
DTYPES = [DType.F32, DType.F64, DType.BF16, DType.F16]
OPS = [Op.FWD, Op.BWD_DATA]
SHAPES = ["avx512", "avx2"]
BY_NAME = {case[0]: case for case in CASES}


def _problem(name: str, op: Op, dtype: DType, layout: Layout = Layout.CHANNELS_LAST, stride=None) -> ConvProblem:
    _, c, size, kernel, s, padding, dilation, n = BY_NAME[name]
    return conv_problem(n, c, c, size, kernel, stride or s, padding, dilation, c, op=op, dtype=dtype, layout=layout)


def _fits(name: str, dtype: DType, shape: str) -> bool:
    """Channels fewer than half the shape's lanes of the dtype's accumulator (grouplanes.few_channels)."""
    lanes = x86_shape(shape).vector_bytes // dtype.accumulator.itemsize
    return 2 * BY_NAME[name][1] < lanes


KEYS = [(case[0], op, dtype, shape) for case in CASES for op in OPS for dtype in DTYPES for shape in SHAPES
        if _fits(case[0], dtype, shape)]


@pytest.fixture(scope="module")
def kernels():
    return kernels_by_key(KEYS, lambda name, op, dtype, shape: lower(_problem(name, op, dtype), x86_shape(shape)))


@pytest.mark.parametrize("key", KEYS, ids=lambda k: f"{k[0]}-{k[1].value}-{k[2].value}-{k[3]}")
def test_flat_rows_match_aten(kernels, key):
    plan, kernel = kernels[key]
    assert plan.algorithm == flat.NAME, plan.reasons
    check_forward_or_data_gradient(kernel, plan.problem, torch.Generator().manual_seed(
        zlib.crc32("-".join(str(getattr(k, "value", k)) for k in key).encode())))


def test_every_pattern_count_and_edge_is_covered():
    """The cases above reach 1, 3, 5 and 7 patterns a tap, rows of edges only and rows cut in parts."""
    counts = {flat.patterns(BY_NAME[k[0]][1], x86_shape(k[3]).vector_bytes // k[2].accumulator.itemsize)
              for k in KEYS}
    assert {1, 3, 5, 7} <= counts
    parts = lower(_problem("row_parts", Op.FWD, DType.F32), cpu_target("avx2")).tiling
    assert parts.ksb < -(-300 * 2 // 8), "row_parts should cut its one row into parts"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
def test_flat_is_the_choice_where_it_fits(shape, op):
    target = cpu_target(shape)
    assert lower(_problem("rgb_1x9", op, DType.F32), target).algorithm == flat.NAME
    # a stride along the rows: consecutive results do not read consecutive values
    strided = lower(_problem("rgb_1x9", op, DType.F32, stride=(1, 2)), target)
    assert flat.NAME not in strided.candidates
    # NCHW: a row is one channel's already, pixels fill the lanes
    assert flat.NAME not in lower(_problem("rgb_1x9", op, DType.F32, layout=Layout.CONTIGUOUS), target).candidates
    # channels that fill half a vector or more: grouplanes (channels in the lanes)
    lanes = target.vector_bytes // 4
    wide = conv_problem(2, lanes // 2, lanes // 2, (5, 40), (1, 9), 1, ((0, 0), (4, 4)), 1, lanes // 2, op=op,
                        layout=Layout.CHANNELS_LAST)
    assert flat.NAME not in lower(wide, target).candidates
    # the weight gradient is not flat's
    wgrad = lower(_problem("rgb_1x9", Op.BWD_WEIGHT, DType.F32), target)
    assert flat.NAME not in wgrad.candidates
