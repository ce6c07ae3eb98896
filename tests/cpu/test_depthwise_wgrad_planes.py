"""The depthwise weight gradient over whole planes for rows of 32 values and more.

Unit-stride depthwise weight gradients take the planes kernel (each tap a flat dot product over a
zero-padded plane) where the output rows are narrower than 32, and also where both plane buffers
fit in 85% of the L1 and a row is at most five vectors, or the problem is 1-D
(codegen/cpu/depthwise.py, PLANES_L1_SHARE), and for bf16 wherever both fit half the L2
(PLANES_NARROW_L2_SHARE); at most 16 taps per pass over the planes (PLANES_MAX_TAPS_PER_PASS). Each case is checked against ATen in float64 with
the results poisoned first, with and without the bias, natively where the CPU runs the code shape
and, for AVX-512 on an AVX2-only CPU, with that code shape compiled for this host's ISA (as
tests/cpu/test_variants.py does).
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from convgen.codegen.ir import ConvProblem, DType, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import Target, cpu_target
from convgen.dispatch.problem import TORCH_DTYPES

from support.builds import load_keyed
from support.code_shapes import x86_shape
from support.problems import conv_problem
from support.reference import rel_err, tolerance

L1, L2 = 48 * 1024, 2 * 1024 * 1024


def _target(isa: str) -> Target:
    return x86_shape(isa, L1, L2)


def _depthwise(n, c, size, kernel, pad, dilation, dtype, bias) -> ConvProblem:
    """The weight gradient of `c` channels, one per group, NCHW, stride 1."""
    return conv_problem(n, c, c, size, kernel, pad=pad, dil=dilation, groups=c, op=Op.BWD_WEIGHT, dtype=dtype,
                        bias=bias)


# (name, isa, n, channels, input size, kernel, padding, dilation): each takes the planes in f32 and bf16
CASES = [
    ("2d_40_avx512", "avx512", 2, 5, (13, 40), (3, 3), (1, 1), (1, 1)),          # 3 vectors a row
    ("2d_56_5x5_avx512", "avx512", 2, 3, (9, 56), (5, 5), (2, 2), (1, 1)),       # 4 vectors, 5x5
    ("2d_75_asym_avx512", "avx512", 1, 3, (7, 75), (3, 2), (1, 0), (2, 1)),      # 5 vectors, a tail of 11
    ("2d_37_avx2", "avx2", 2, 5, (11, 37), (3, 3), (1, 1), (1, 1)),              # 5 vectors of 8
    ("3d_40_avx2", "avx2", 2, 3, (3, 6, 40), (3, 3, 3), (1, 1, 1), (1, 1, 1)),   # 3-D, 5 vectors of 8
    ("1d_300_avx512", "avx512", 3, 6, (300,), (31,), (15,), (1,)),               # 1-D, 19 vectors
    ("1d_517_dil_avx2", "avx2", 2, 4, (517,), (9,), (3,), (2,)),                 # 1-D, dilated, 65 vectors
]
DTYPES = [DType.F32, DType.F64, DType.BF16]


def _plans():
    for name, isa, *args in CASES:
        for dtype in DTYPES:
            for bias in (True, False):
                yield (name, dtype, bias), lower(_depthwise(*args, dtype=dtype, bias=bias), _target(isa))


@pytest.fixture(scope="module")
def kernels():
    return load_keyed(_plans())


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_depthwise_planes_match_aten(kernels, name, dtype, bias):
    plan, kernel = kernels[(name, dtype, bias)]
    problem = plan.problem
    # f64 has half the lanes: its 2-D rows here are more than five vectors and stay on rows
    width, lanes = problem.output_shape[-1], plan.tiling.vector_lanes
    planes = len(problem.in_size) == 1 or math.ceil(width / lanes) <= 5
    assert plan.algorithm == "depthwise" and plan.tiling.planes == planes, (plan.algorithm, plan.tiling)
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}-{dtype.value}-{bias}".encode()))
    x = torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).to(tdt)
    gy = torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).to(tdt)
    gw = torch.full(problem.weight_shape, float("nan"), dtype=tdt)
    gb = torch.full((problem.k,), float("nan"), dtype=tdt)
    kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb if bias else None}, problem.n, 2)
    conv = (list(problem.stride), [lo for lo, _ in problem.padding], list(problem.dilation), False,
            list(problem.output_padding), problem.groups)
    _, ref_w, ref_b = torch.ops.aten.convolution_backward(
        gy.double(), x.double(), torch.empty(problem.weight_shape, dtype=torch.float64), [problem.k], *conv,
        [False, True, bias])
    terms = problem.n * math.prod(problem.output_shape[2:])
    assert rel_err(gw, ref_w) <= tolerance(tdt, terms), f"grad_weight rel err {rel_err(gw, ref_w):.2e}"
    if bias:
        assert rel_err(gb, ref_b) <= tolerance(tdt, terms), f"grad_bias rel err {rel_err(gb, ref_b):.2e}"


def _tiling(isa, size, kernel=(3, 3), pad=(1, 1), c=8, l1=L1, dtype=DType.F32):
    problem = _depthwise(2, c, size, kernel, pad, (1,) * len(size), dtype, True)
    return lower(problem, cpu_target(isa, l1, L2)).tiling


def test_planes_only_where_they_fit_and_rows_are_short():
    assert _tiling("avx512", (56, 56)).planes                       # 4 vectors a row, 25 KB
    assert not _tiling("avx2", (56, 56)).planes                     # 7 vectors of 8: rows
    assert _tiling("avx512", (56, 56), l1=32 * 1024).planes         # 25 KB within 85% of Zen 4's L1
    assert not _tiling("avx512", (56, 56), l1=28 * 1024).planes     # 25 KB above 85% of 28 KB
    assert not _tiling("avx512", (112, 112)).planes                 # 7 vectors, 100 KB
    assert not _tiling("avx512", (96, 96)).planes                   # 6 vectors a row
    assert _tiling("avx2", (2048,), kernel=(9,), pad=(4,)).planes   # 1-D: one row a plane
    assert not _tiling("avx2", (16000,), kernel=(9,), pad=(4,)).planes   # 1-D, 125 KB
    assert _tiling("avx2", (20, 20)).planes                         # narrower than 32: as before


def test_bf16_takes_the_planes_wherever_they_fit_half_the_l2():
    # bf16 rows cannot be read in place (the rows kernel copies and reads back every row)
    assert _tiling("avx512", (112, 112), dtype=DType.BF16).planes             # 100 KB, 7 vectors a row
    assert _tiling("avx2", (56, 56), dtype=DType.BF16).planes                 # 7 vectors of 8
    assert not _tiling("avx512", (112, 112)).planes                           # f32 there: rows
    assert not _tiling("avx512", (512, 512), dtype=DType.BF16).planes         # 2 MB, above half the L2
    assert _tiling("avx512", (56, 56), l1=28 * 1024, dtype=DType.BF16).planes


@pytest.mark.parametrize("isa, kernel, taps_per_pass", [
    ("avx512", (3, 3), 9), ("avx512", (5, 5), 13), ("avx512", (7, 7), 13), ("avx2", (5, 5), 9),
    ("avx2", (3, 3), 9)])
def test_taps_per_pass_within_the_unrolled_loop(isa, kernel, taps_per_pass):
    """At most 16 taps a pass (the tap loop's `#pragma GCC unroll`; past it the sums went to memory),
    and at most the registers allow (16 on AVX2: 11), the passes balanced."""
    tiling = _tiling(isa, (20, 20), kernel=kernel, pad=(kernel[0] // 2, kernel[1] // 2))
    assert tiling.planes and tiling.kb == taps_per_pass
