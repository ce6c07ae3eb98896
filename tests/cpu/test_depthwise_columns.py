"""The depthwise planes kernel's column tiles (AVX-512) and the stores and loads of partial vectors.

On the AVX-512 shape the depthwise forward and data gradient in NCHW (templates/cpu/
depthwise_planes.cpp.j2) take tiles of PLANES_COLUMN_ROWS output rows x one vector of columns
where the kernel has more than one row (codegen/cpu/depthwise.py): the buffer's row pitch is
rounded up to whole vectors, each input row is loaded once per tap column for every output row it
serves, the columns past a row's end are computed and dropped, and the rows left over at the
plane's end take a smaller tile; output rows of at most half a vector (7x7 planes) take half vectors
(8 lanes, ymm, with masked tails) for f32 and bf16. Kernels of one row (1-D), planes of one row and the AVX2 shape keep
the flat runs. Runs of values are loaded into the buffer and stored from it with one masked access
for their last partial vector where AVX-512 runs (load_run, store_run and PART_MASKED in
templates/cpu/vector.h.j2; every kernel's stores of rows go through store_run).

Checked here against ATen in float64, natively on the AVX-512 shape where the CPU runs it
(elsewhere compiled for the host, whose partial vectors go value by value): leftover rows, rows of
one, two and three vectors with partial last ones, a row exactly one vector wide, rows of half
vectors (7 and 8 wide), dilation, a 5x3
kernel, uneven padding, padding past the kernel's reach (the data gradient's source cropped),
f32, bf16 and f64 (8 lanes); and that nothing is written past a result's end.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from convgen.codegen.ir import ConvProblem, DType, Op
from convgen.codegen.cpu.depthwise import PLANES_COLUMN_ROWS
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target
from convgen.dispatch.problem import TORCH_DTYPES

from support.builds import kernels_by_key
from support.code_shapes import x86_shape
from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient, rel_err, tolerance

AVX512, AVX2 = cpu_target("avx512"), cpu_target("avx2")


def _depthwise(c, size, kernel, padding, dilation=None, n=2, op=Op.FWD, dtype=DType.F32) -> ConvProblem:
    """`c` channels, one per group, NCHW, stride 1 (dilation None: 1)."""
    return conv_problem(n, c, c, size, kernel, pad=padding, dil=dilation or 1, groups=c, op=op, dtype=dtype)


P1 = ((1, 1), (1, 1))


@pytest.mark.parametrize("problem, target, rows", [
    (_depthwise(144, (56, 56), (3, 3), P1), AVX512, PLANES_COLUMN_ROWS),            # mbv2_dw
    (_depthwise(144, (56, 56), (3, 3), P1, op=Op.BWD_DATA, dtype=DType.BF16), AVX512, PLANES_COLUMN_ROWS),
    (_depthwise(8, (5, 40), (3, 3), P1), AVX512, min(5, PLANES_COLUMN_ROWS)),                                 # fewer rows than a tile
    (_depthwise(8, (56, 56), (3, 3), P1), AVX2, 0),                                  # the AVX2 shape
    (_depthwise(8, (5, 300), (1, 7), ((0, 0), (3, 3))), AVX512, 0),                  # a kernel of one row
    (_depthwise(8, (3, 300), (3, 7), ((0, 0), (3, 3))), AVX512, 0),                  # a plane of one output row
    (_depthwise(8, (4096,), (31,), ((15, 15),)), AVX512, 0),                         # 1-D
    (_depthwise(1152, (7, 7), (5, 5), ((2, 2), (2, 2))), AVX512, 7),                 # eff_dw5_1152_7: half vectors
    (_depthwise(960, (7, 7), (3, 3), P1, dtype=DType.BF16), AVX512, 7),              # mb_dw_960_7
    (_depthwise(960, (7, 7), (3, 3), P1, dtype=DType.F64), AVX512, 7),               # f64: 8 lanes already
], ids=["mbv2_dw", "bf16_data_gradient", "five_rows", "avx2", "one_kernel_row", "one_row", "1d", "eff_dw5_1152_7",
        "mb_dw_960_7", "f64"])
def test_the_choice(problem, target, rows):
    plan = lower(problem, target)
    assert plan.algorithm == "depthwise", plan.reasons
    assert plan.tiling.rb == rows, plan.reasons
    half = rows and problem.dtype is not DType.F64 and plan.geometry.y_size[2] <= 8
    assert plan.tiling.vector_lanes == (8 if half or target is AVX2 or problem.dtype is DType.F64 else 16)
    if rows:
        assert "tiles of" in "; ".join(r for p, r in plan.reasons if p == "tiling")


# (name, channels, input size, kernel, padding, dilation): output rows 11, 9 and 10 (a whole tile of
# 8 and 3, 1 or 2 left over), 16 (two whole tiles), 7 and 6 (fewer than a tile); output widths 37
# (three vectors, the last of 5), 16 (exactly one), 40, 20, 18 and 6 (less than one); 7 and 8 (half
# vectors for f32 and bf16: 6 and 7 too)
CASES = [
    ("rows_left_over", 3, (11, 37), (3, 3), P1, None),
    ("one_vector_wide", 2, (16, 16), (3, 3), P1, None),
    ("dilated_5x3", 3, (9, 20), (5, 3), ((4, 4), (3, 3)), (2, 3)),
    ("uneven_padding", 2, (7, 40), (3, 3), ((2, 0), (0, 2)), None),
    ("past_the_reach", 2, (6, 18), (3, 3), ((3, 3), (3, 3)), None),
    ("narrow", 5, (6, 6), (2, 2), ((0, 1), (1, 0)), None),
    ("half_vector_7", 3, (7, 7), (5, 5), ((2, 2), (2, 2)), None),
    ("half_vector_8", 2, (10, 8), (3, 3), P1, None),
]
DTYPES = [DType.F32, DType.BF16, DType.F64]
OPS = [Op.FWD, Op.BWD_DATA]


def _key(case, op, dtype):
    return case[0], op, dtype


@pytest.fixture(scope="module")
def kernels():
    keys = [(case[0], op, dtype) for case in CASES for op in OPS for dtype in DTYPES]
    by_name = {case[0]: case for case in CASES}

    def plan_for(name, op, dtype):
        _, c, size, kernel, padding, dilation = by_name[name]
        return lower(_depthwise(c, size, kernel, padding, dilation, op=op, dtype=dtype), x86_shape("avx512"))
    return kernels_by_key(keys, plan_for)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_column_tiles_match_aten(kernels, case, op, dtype):
    plan, kernel = kernels[(case[0], op, dtype)]
    assert plan.algorithm == "depthwise" and plan.tiling.rb > 0, plan.reasons
    check_forward_or_data_gradient(kernel, plan.problem, torch.Generator().manual_seed(
        zlib.crc32(f"{case[0]}-{op.value}-{dtype.value}".encode())))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("name", ["rows_left_over", "half_vector_7"])
def test_nothing_is_written_past_the_result(kernels, name, op, dtype):
    """The last row's partial vector is stored by a masked store (or value by value): the values
    after the result, in the same allocation, keep their sentinel."""
    plan, kernel = kernels[(name, op, dtype)]
    problem = plan.problem
    tdt = TORCH_DTYPES[problem.dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(f"past-the-end-{op.value}-{dtype.value}".encode()))
    w = torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64).to(tdt)
    shape = problem.output_shape if op is Op.FWD else problem.input_shape
    room = torch.full((torch.Size(shape).numel() + 64,), 7.0, dtype=tdt)
    out = room[: torch.Size(shape).numel()].view(shape)
    args = ([1, 1], [lo for lo, _ in problem.padding], [1, 1], False, [0, 0], problem.groups)
    if op is Op.FWD:
        x = torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).to(tdt)
        b = torch.randn(problem.k, generator=gen, dtype=torch.float64).to(tdt)
        kernel({"input": x, "weight": w, "bias": b, "output": out}, problem.n, 2)
        ref = torch.ops.aten.convolution(x.double(), w.double(), b.double(), *args)
    else:
        gy = torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).to(tdt)
        kernel({"grad_output": gy, "weight": w, "grad_input": out}, problem.n, 2)
        ref = torch.ops.aten.convolution_backward(gy.double(), torch.empty(shape, dtype=torch.float64),
                                                  w.double(), None, *args, (True, False, False))[0]
    assert torch.equal(room[out.numel():], torch.full((64,), 7.0, dtype=tdt)), "written past the result's end"
    assert rel_err(out, ref) <= tolerance(tdt, torch.Size(problem.kernel).numel()), f"rel err {rel_err(out, ref):.2e}"
