"""The planes weight gradient (groups of few channels; templates/cpu/planes_wgrad.cpp.j2).

Each case is checked against ATen in float64 with the results poisoned first, natively where the
CPU runs the code shape and, for AVX-512 on an AVX2-only CPU, with that code shape compiled for
this host's ISA (tests/support/code_shapes.py). The cases cover the template's edges: a last block of
output channels smaller than the register tile's, a last block of (input channel, tap) rows
smaller than the tile's (and tiles whose rows span two input channels), several chunks with a
short last one (a small L1 in the target), the batch in one part, in parts of unequal images and
in more parts than images (the reduction cut where the groups give few work items), strides (the
input split into phases; stride 2 rows split 2V columns at a time, the edges and other strides value
by value), 1-D, 2-D and 3-D windows, dilation, uneven padding, the
bias from grad_output and (transposed) from the input, a channels-last input read through strided
copies, and f32, f64 and bf16. Then the rule that picks the algorithm, the register tile, and
results that do not depend on the thread count.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.cpu import depthwise, planes, work
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target
from convgen.dispatch.problem import TORCH_DTYPES

from support.builds import load_keyed
from support.code_shapes import x86_shape
from support.problems import conv_problem
from support.reference import rel_err, tolerance


def _wgrad(n, c, k, size, kernel, pad, dilation, groups, stride=1, dtype=DType.F32, bias=True, transposed=False,
           layout=Layout.CONTIGUOUS) -> ConvProblem:
    """The weight gradient of CASES' problem arguments (and stride)."""
    return conv_problem(n, c, k, size, kernel, stride, pad, dilation, groups, op=Op.BWD_WEIGHT, transposed=transposed,
                        dtype=dtype, layout=layout, bias=bias)


# name: (isa, L1 bytes, problem arguments)
CASES = {
    # 4 in / 4 out per group (rnx_grouped's shape, small): one tile of 4 x 6 rows (AVX-512)
    "g4_2d": ("avx512", 32 * 1024, (2, 8, 8, (10, 12), (3, 3), ((1, 1), (1, 1)), (1, 1), 2)),
    # 3 in / 5 out: AVX-512 takes 5 x 4 (rows 27 = 6 x 4 + 3: a short last block, rows across channels)
    "g3o5_2d": ("avx512", 32 * 1024, (2, 12, 20, (9, 23), (3, 3), ((1, 1), (1, 1)), (1, 1), 4)),
    # 2 in / 6 out, 5x3 kernel, dilation 2 x 1, uneven padding; 4 KB of L1: chunks of 3 vectors of
    # the 17 a plane takes (a short last one)
    "g2o6_uneven": ("avx512", 4096, (3, 6, 18, (23, 13), (5, 3), ((2, 1), (0, 2)), (2, 1), 3)),
    # 7 output channels: AVX2 tiles of 2 (a last block of 1)
    "g2o7_avx2": ("avx2", 32 * 1024, (2, 4, 14, (7, 9), (3, 3), ((1, 1), (1, 1)), (1, 1), 2)),
    # 1-D, 4 in / 2 out, 7 taps dilated
    "g4o2_1d": ("avx512", 32 * 1024, (2, 8, 4, (30,), (7,), ((3, 3),), (2,), 2)),
    # 3-D, 2 in / 3 out
    "g2o3_3d": ("avx2", 32 * 1024, (1, 4, 6, (4, 5, 6), (3, 3, 3), ((1, 1), (1, 1), (1, 1)), (1, 1, 1), 2)),
    # no padding, a 1-row kernel: rows of exactly the input's width
    "g2_nopad": ("avx512", 2048, (2, 4, 4, (6, 40), (1, 5), ((0, 0), (0, 0)), (1, 1), 2)),
    # 16 groups: work items enough without cutting the batch (one part)
    "g2_16groups": ("avx512", 32 * 1024, (3, 32, 32, (9, 10), (3, 3), ((1, 1), (1, 1)), (1, 1), 16)),
    # 8 blocks: the batch of 5 in 2 parts, of 2 and 3 images
    "g2_5images": ("avx2", 32 * 1024, (5, 16, 16, (8, 9), (3, 3), ((1, 1), (1, 1)), (1, 1), 8)),
    # stride 2: the input split into 4 phases; rows of 41 split 2V columns at a time (f32, f64) around
    # value-by-value edges, odd padding
    "s2_odd": ("avx512", 32 * 1024, (2, 8, 8, (11, 41), (3, 3), ((1, 1), (1, 1)), (1, 1), 2), (2, 2)),
    # stride 2, no padding, AVX2 (vectors of 8 f32)
    "s2_nopad_avx2": ("avx2", 32 * 1024, (2, 8, 12, (12, 40), (3, 3), ((0, 0), (0, 0)), (1, 1), 2), (2, 2)),
    # strides 3 x 2 with a 5x4 kernel dilated 1 x 2 (taps of one phase 2 apart), uneven padding
    "s3x2_dil": ("avx512", 32 * 1024, (2, 6, 9, (13, 35), (5, 4), ((2, 1), (1, 2)), (1, 2), 3), (3, 2)),
    # 1-D stride 3, 3-D strides 2 x 1 x 2
    "s3_1d": ("avx2", 32 * 1024, (2, 6, 9, (40,), (5,), ((2, 1),), (2,), 3), (3,)),
    "s212_3d": ("avx512", 32 * 1024, (1, 4, 6, (7, 8, 9), (3, 3, 3), ((1, 1), (1, 1), (1, 1)), (1, 1, 1), 2),
                (2, 1, 2)),
}
DTYPES = [DType.F32, DType.F64, DType.BF16]


def _variants():
    for name, (isa, l1, args, *stride) in CASES.items():
        for dtype in DTYPES:
            for bias in (True, False):
                yield ((name, dtype.value, "bias" if bias else "no_bias"), isa, l1,
                       _wgrad(*args, *stride, dtype=dtype, bias=bias))
    isa, l1, args = CASES["g3o5_2d"]
    yield ("g3o5_2d", "f32", "transposed"), isa, l1, _wgrad(*args[:5], ((1, 1), (1, 1)), *args[6:], transposed=True)
    yield ("g3o5_2d", "f32", "channels_last"), isa, l1, _wgrad(*args, layout=Layout.CHANNELS_LAST)
    isa, l1, args, stride = CASES["s2_odd"]   # strided rows read value by value (channels last)
    yield ("s2_odd", "f32", "channels_last"), isa, l1, _wgrad(*args, stride, layout=Layout.CHANNELS_LAST)


VARIANTS = {key: (isa, l1, problem) for key, isa, l1, problem in _variants()}


@pytest.fixture(scope="module")
def kernels():
    return load_keyed((key, lower(problem, x86_shape(isa, l1), algorithm="planes"))
                      for key, (isa, l1, problem) in VARIANTS.items())


def _reference(problem: ConvProblem, x, gy):
    """ATen's weight and bias gradients in float64 (uneven padding as an explicit zero pad)."""
    conv = [list(problem.stride), [lo for lo, _ in problem.padding], list(problem.dilation), problem.transposed,
            list(problem.output_padding), problem.groups]
    x = x.double()
    if any(lo != hi for lo, hi in problem.padding):
        x = torch.nn.functional.pad(x, [v for lo, hi in reversed(problem.padding) for v in (lo, hi)])
        conv[1] = [0] * len(problem.padding)
    _, gw, gb = torch.ops.aten.convolution_backward(gy.double(), x, torch.empty(problem.weight_shape, dtype=torch.float64),
                                                    [problem.k], *conv, [False, True, True])
    return gw, gb


def _run(kernel, problem: ConvProblem, seed: str, threads: int = 2):
    tdt = TORCH_DTYPES[problem.dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(seed.encode()))
    fmt = torch.channels_last if problem.input_layout is Layout.CHANNELS_LAST else torch.contiguous_format
    x = torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).to(tdt).contiguous(memory_format=fmt)
    gy = torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).to(tdt).contiguous(memory_format=fmt)
    gw = torch.full(problem.weight_shape, float("nan"), dtype=tdt).contiguous(memory_format=fmt)
    gb = torch.full((problem.k,), float("nan"), dtype=tdt)
    kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb if problem.bias else None},
           problem.n, threads)
    return x, gy, gw, gb


@pytest.mark.parametrize("key", list(VARIANTS), ids=["-".join(k) for k in VARIANTS])
def test_planes_wgrad_matches_aten(kernels, key):
    plan, kernel = kernels[key]
    problem = plan.problem
    assert plan.algorithm == "planes" and plan.tiling.planes
    x, gy, gw, gb = _run(kernel, problem, "-".join(key))
    ref_w, ref_b = _reference(problem, x, gy)
    terms = problem.n * math.prod(problem.output_shape[2:] if not problem.transposed else problem.in_size)
    tdt = TORCH_DTYPES[problem.dtype]
    assert rel_err(gw, ref_w) <= tolerance(tdt, terms), f"grad_weight rel err {rel_err(gw, ref_w):.2e}"
    if problem.bias:
        assert rel_err(gb, ref_b) <= tolerance(tdt, terms), f"grad_bias rel err {rel_err(gb, ref_b):.2e}"


def test_the_cases_reach_the_templates_edges(kernels):
    """What the cases are there for: tails of both tile dimensions, several chunks, a short last one."""
    def tiles(key):
        plan = kernels[key][0]
        g, t = plan.geometry, plan.tiling
        rows = g.cin_g * math.prod(g.kernel)
        nvec, _, _ = depthwise.plane_layout(g, t.vector_lanes)
        return g.cout_g % t.nv, rows % t.kb, rows // t.kb, nvec / (t.pc // t.vector_lanes)

    k_tail, r_tail, blocks, _ = tiles(("g3o5_2d", "f32", "bias"))
    assert k_tail == 0 and r_tail and blocks > 1
    assert tiles(("g2o7_avx2", "f32", "bias"))[0]                       # a short block of output channels
    chunks = tiles(("g2o6_uneven", "f32", "bias"))[3]
    assert chunks > 2 and chunks != int(chunks)                          # several chunks, a short last one
    # the batch in one part, in parts of unequal images, and in more parts than images
    assert kernels[("g2_16groups", "f32", "bias")][0].tiling.splits == 1
    assert kernels[("g2_5images", "f32", "bias")][0].tiling.splits == 2
    plan = kernels[("g4_2d", "f32", "bias")][0]
    assert plan.tiling.splits > plan.problem.n


@pytest.mark.parametrize("name", ["g3o5_2d", "g2_16groups", "g2_5images"])
def test_results_do_not_depend_on_the_thread_count(kernels, name):
    plan, kernel = kernels[(name, "f32", "bias")]
    runs = [_run(kernel, plan.problem, "threads", threads) for threads in (1, 2, 3)]
    for _, _, gw, gb in runs[1:]:
        assert torch.equal(gw, runs[0][2]) and torch.equal(gb, runs[0][3])


def _default(c, k, size, groups, isa="avx512", dtype=DType.F32, layout=Layout.CONTIGUOUS, kernel=(3, 3),
             stride=1, l2=1024 * 1024):
    problem = _wgrad(8, c, k, size, kernel, tuple(q // 2 for q in kernel), 1, groups, stride, dtype=dtype,
                     layout=layout)
    return lower(problem, cpu_target(isa, 32 * 1024, l2)).algorithm


def test_planes_where_a_groups_output_channels_fill_less_than_a_vector():
    assert _default(128, 128, (56, 56), 32) == "planes"                       # rnx_grouped: 4 of 16 lanes
    assert _default(256, 256, (28, 28), 32) == "planes"                       # 8 of 16
    assert _default(256, 256, (28, 28), 32, isa="avx2") == "lanes"            # 8 of 8: a full vector
    assert _default(128, 128, (56, 56), 32, isa="avx2") == "planes"           # 4 of 8
    assert _default(512, 512, (14, 14), 32) == "lanes"                        # 16 of 16
    assert _default(128, 128, (56, 56), 32, dtype=DType.BF16) == "planes"     # f32 sums: 16 lanes
    assert _default(64, 64, (4096,), 8, kernel=(3,)) == "planes"              # 1-D
    assert _default(128, 128, (7, 7), 32) == "lanes"                          # 49 output pixels an image
    assert _default(128, 128, (8, 8), 32) == "planes"                         # 64
    assert _default(128, 128, (56, 56), 32, layout=Layout.CHANNELS_LAST) != "planes"
    assert _default(128, 128, (112, 112), 32, stride=2) == "planes"           # strided: the input in phases
    assert _default(256, 256, (56, 56), 32, stride=2) == "planes"             # 8 of 16
    assert _default(512, 512, (28, 28), 32, stride=2) == "lanes"              # 16 of 16
    assert _default(64, 64, (56, 56), 64) == "depthwise"                      # one input channel: its own kernel
    # 64 input planes of 58 x 58 and 4 grad_output planes (about 880 KB): within 4 L2s of 1 MB, not of 128 KB
    assert _default(128, 8, (56, 56), 2) == "planes"
    assert _default(128, 8, (56, 56), 2, l2=128 * 1024) == "lanes"


@pytest.mark.parametrize("cout_g, rows, registers, tile", [
    (4, 36, 32, (4, 6)),     # rnx_grouped on AVX-512: 24 sums + 4 grad_output vectors + 1 input, 3 spare
    (4, 36, 16, (2, 5)),     # AVX2: 10 + 2 + 1
    (1, 9, 32, (1, 9)),      # one output channel: every tap in one pass
    (8, 72, 32, (4, 6)),     # two blocks of 4 x 6 (240 loads per vector of pixels) over 8 x 2 (360)
    (5, 27, 32, (5, 4)),     # 5 x 4, rows 27 in 7 passes of 4 (the last one 3)
])
def test_register_tile(cout_g, rows, registers, tile):
    kr, tb = planes.planes_wgrad_tile(cout_g, rows, registers)
    assert (kr, tb) == tile
    assert kr * tb + kr + 1 + work.SPARE_REGISTERS <= registers


def test_candidate_for_groups_of_several_channels():
    def candidates(groups, stride=1, c=8):
        problem = _wgrad(2, c, 8, (9, 9), (3, 3), 1, 1, groups, stride, bias=False)
        return lower(problem, cpu_target("avx2")).candidates

    assert "planes" in candidates(2)
    assert "planes" not in candidates(1)               # no groups: lanes' vectors fill with output channels
    assert "planes" in candidates(2, stride=2)
    assert "planes" not in candidates(8)               # one input channel per group: depthwise
    assert planes.PLANES_WGRAD_MIN_PIXELS == 64
