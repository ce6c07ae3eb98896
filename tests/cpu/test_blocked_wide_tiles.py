"""The blocked data gradient's one-vector tiles of more than 16 channels (AVX-512's 32 registers).

A strided data gradient (or a transposed convolution's forward) whose phases are one vector wide
takes up to 30 channels a tile on the AVX-512 code shape. Each case is checked against ATen in
float64 with the result poisoned first, natively where the CPU runs AVX-512 and, elsewhere, with
that code shape compiled for this host's ISA (as cpu/test_variants.py does).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from convgen.codegen.ir import ConvProblem, DType, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target
from convgen.dispatch.problem import TORCH_DTYPES

from support.builds import load_keyed
from support.code_shapes import x86_shape
from support.problems import conv_problem
from support.reference import rel_err, tolerance

TARGET = x86_shape("avx512", 48 * 1024, 2 * 1024 * 1024)


def _case_problem(op, n, c, k, size, kernel, stride, pad, transposed, dtype) -> ConvProblem:
    """A row of CASES (NCHW, without bias) in `dtype`."""
    return conv_problem(n, c, k, size, kernel, stride, pad, op=op, transposed=transposed, dtype=dtype, bias=False)


# (name, op, n, c, k, size, kernel, stride, pad, transposed): 40-44 gradient channels, 22 or 20 a tile
CASES = [
    ("tconv_4x4_s2", Op.FWD, 2, 24, 44, (6, 7), (4, 4), 2, 1, True),
    ("tconv_3x3_s3", Op.FWD, 2, 20, 40, (5, 9), (3, 3), 3, 1, True),
    ("dgrad_4x4_s2", Op.BWD_DATA, 2, 44, 24, (12, 14), (4, 4), 2, 1, False),
    ("dgrad_3x3_s2_odd", Op.BWD_DATA, 2, 40, 20, (13, 25), (3, 3), 2, 1, False),
]
DTYPES = [DType.F32, DType.F64, DType.BF16]


def _plans():
    for name, *args in CASES:
        for dtype in DTYPES:
            plan = lower(_case_problem(*args, dtype=dtype), TARGET, algorithm="blocked")
            yield (name, dtype), plan


@pytest.fixture(scope="module")
def kernels():
    return load_keyed(_plans())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_wide_blocked_data_gradient_tiles_match_aten(kernels, name, dtype):
    plan, kernel = kernels[(name, dtype)]
    if dtype is DType.F32:
        assert plan.tiling.kb > 16 and plan.tiling.nv == 1, plan.tiling
    problem = plan.problem
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}-{dtype.value}".encode()))
    w = torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64).to(tdt)
    conv = (list(problem.stride), [lo for lo, _ in problem.padding], list(problem.dilation), problem.transposed,
            list(problem.output_padding), problem.groups)
    if problem.op is Op.FWD:
        x = torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).to(tdt)
        out = torch.full(problem.output_shape, float("nan"), dtype=tdt)
        kernel({"input": x, "weight": w, "bias": None, "output": out}, problem.n, 2)
        ref = torch.ops.aten.convolution(x.double(), w.double(), None, *conv)
        terms = problem.c * torch.Size(problem.kernel).numel()
    else:
        gy = torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).to(tdt)
        out = torch.full(problem.input_shape, float("nan"), dtype=tdt)
        kernel({"grad_output": gy, "weight": w, "grad_input": out}, problem.n, 2)
        x = torch.empty(problem.input_shape, dtype=torch.float64)
        ref = torch.ops.aten.convolution_backward(gy.double(), x, w.double(), None, *conv, [True, False, False])[0]
        terms = problem.k * torch.Size(problem.kernel).numel()
    assert not torch.isnan(out).any(), "elements left unwritten (NaN poison survived)"
    assert rel_err(out, ref) <= tolerance(tdt, terms), f"rel err {rel_err(out, ref):.2e}"


def test_forward_tiles_keep_16_channels():
    plan = lower(_case_problem(Op.FWD, 2, 24, 44, (12, 14), (4, 4), 2, 1, False, DType.F32), cpu_target("avx512"),
                 algorithm="blocked")
    assert plan.tiling.kb <= 16, plan.tiling
