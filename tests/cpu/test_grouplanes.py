"""The grouplanes forward and data gradient (depthwise and small groups in channels last): sliding
tiles, the interior's leftover columns in smaller tiles, and results stored past the caches.

- Sliding tiles (one channel per group, columns whose taps all fall inside the row): a tile's
  pixels overlap in the columns they read, so each column is loaded once for every (pixel, tap) it
  serves (slide_row in templates/cpu/grouplanes.j2); each pixel still sums its taps in the same
  order. Strides 1 to 3, dilation, kernel widths 1 to 5, the data gradient's stride phases
  (including phases no tap reaches), 3-D, a channel tail, and small groups (which keep the
  per-pair step) are checked against ATen in float64, outputs poisoned with NaN.
- The columns left over after whole tiles go in tiles of 8, 4, 2 and 1: widths here leave every
  remainder of the AVX-512 and AVX2 tiles.
- Results of STREAM_L2S L2s or more per call, on x86, whose pixels are whole 64-byte lines, are
  stored with non-temporal stores (the rule is checked; real results that large take seconds, so
  the checked plans lower the threshold to one byte), with a line-aligned result (streamed) and one
  a value off (cached stores).
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

from convgen.codegen.emit import emit
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.cpu.work import STREAM_L2S
from convgen.codegen.pipeline import lower
from convgen.codegen.target import ISA_WIDTHS, TargetKind, cpu_target, host_bf16_dot, host_isas
from convgen.dispatch.problem import TORCH_DTYPES, memory_format

from support.builds import kernels_by_key
from support.code_shapes import ShapeForThisHost, x86_shape
from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient, rel_err, tolerance


def _grouped(c, size, kernel, stride, padding, dilation=None, groups=None, n=2, op=Op.FWD,
             dtype=DType.F32) -> ConvProblem:
    """`c` channels to `c` in `groups` (None: one channel a group), every operand channels last
    (dilation None: 1)."""
    return conv_problem(n, c, c, size, kernel, stride, padding, dilation or 1, groups or c, op=op, dtype=dtype,
                        layout=Layout.CHANNELS_LAST)


# (name, channels, input size, kernel, stride, padding, dilation, groups (None: depthwise))
CASES = [
    # 3x3 at widths leaving 1 to 7 interior columns past whole tiles of 4 (and of 8)
    ("3x3_w7", 20, (3, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), None, None),
    ("3x3_w8", 32, (4, 8), (3, 3), (1, 1), ((1, 1), (1, 1)), None, None),
    ("3x3_w9", 20, (3, 9), (3, 3), (1, 1), ((1, 1), (1, 1)), None, None),
    ("3x3_w13", 16, (3, 13), (3, 3), (1, 1), ((1, 1), (1, 1)), None, None),
    ("3x3_w17", 40, (2, 17), (3, 3), (1, 1), ((1, 1), (1, 1)), None, None),
    ("3x3_w24", 20, (3, 24), (3, 3), (1, 1), ((1, 1), (1, 1)), None, None),
    ("s2_5x5_dil2", 24, (7, 29), (5, 5), (2, 2), ((4, 4), (3, 5)), (2, 2), None),
    ("s3_k2", 16, (5, 31), (2, 2), (3, 3), ((1, 1), (0, 1)), None, None),   # data gradient: a phase no tap reaches
    ("k1x5_uneven", 32, (3, 26), (1, 5), (1, 1), ((0, 0), (0, 4)), None, None),
    ("kw1", 16, (6, 19), (3, 1), (1, 2), ((1, 1), (0, 0)), None, None),      # one tap a row: nothing shared
    ("3d", 16, (3, 4, 14), (3, 3, 3), (1, 1, 1), ((1, 1), (1, 1), (1, 1)), None, None),
    ("groups_of_4", 16, (3, 15), (3, 3), (1, 1), ((1, 1), (1, 1)), None, 4),  # the per-pair step, tails of tiles
]
# The forward's edge tiles (grouplanes._edge_tiles, the forward's only): 2 or 3 columns a side meet the padding
EDGE_CASES = [
    ("5x5_w7_edges", 24, (3, 7), (5, 5), (1, 1), ((2, 2), (2, 2)), None, None),
    ("7x7_w9_edges", 20, (2, 9), (7, 7), (1, 1), ((3, 3), (3, 3)), None, None),
    ("5x5_w3_edges", 16, (4, 3), (5, 5), (1, 1), ((2, 2), (2, 2)), None, None),      # no interior column
    ("5x5_asym_edges", 16, (3, 10), (3, 5), (1, 1), ((1, 1), (1, 3)), None, None),
]
# A group a whole vector (its channel m broadcast from memory: add_spread in templates/cpu/grouplanes.j2):
# groups of 8 (AVX2 f32, AVX-512 f64) and of 16 (AVX-512 f32), strided for the stride phases (groups_of_4
# above is AVX2 f64's); bf16 takes the shuffles. (name, channels, ..., groups) as CASES, and the
# (dtype, code shape) pairs where the group is a vector (or bf16's where it fits)
VECTOR_CASES = [
    ("groups_of_8", 32, (3, 11), (3, 3), (1, 1), ((1, 1), (1, 1)), None, 4),
    ("groups_of_16_s2", 48, (5, 12), (3, 3), (2, 2), ((1, 1), (0, 2)), None, 3),
]
VECTOR_RUNS = [("groups_of_8", DType.F32, "avx2"), ("groups_of_8", DType.F64, "avx512"),
               ("groups_of_8", DType.BF16, "avx512"), ("groups_of_16_s2", DType.F32, "avx512"),
               ("groups_of_16_s2", DType.BF16, "avx512")]
DTYPES = [DType.F32, DType.BF16, DType.F64]
OPS = [Op.FWD, Op.BWD_DATA]
SHAPES = ["avx512", "avx2"]
BY_NAME = {case[0]: case for case in CASES + VECTOR_CASES + EDGE_CASES}


def _case_problem(name, op, dtype) -> ConvProblem:
    _, c, size, kernel, stride, padding, dilation, groups = BY_NAME[name]
    return _grouped(c, size, kernel, stride, padding, dilation, groups, op=op, dtype=dtype)


def _streaming(plan):
    return dataclasses.replace(plan, tiling=dataclasses.replace(plan.tiling, stream_bytes=1))


@pytest.fixture(scope="module")
def kernels():
    keys = [(case[0], op, dtype, shape) for case in CASES for op in OPS for dtype in DTYPES for shape in SHAPES]
    return kernels_by_key(keys, lambda name, op, dtype, shape: lower(_case_problem(name, op, dtype),
                                                                     x86_shape(shape), algorithm="grouplanes"))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_tiles_match_aten(kernels, case, op, dtype, shape):
    plan, kernel = kernels[(case[0], op, dtype, shape)]
    assert plan.algorithm == "grouplanes", plan.reasons
    check_forward_or_data_gradient(kernel, plan.problem, torch.Generator().manual_seed(
        zlib.crc32(f"{case[0]}-{op.value}-{dtype.value}-{shape}".encode())))


@pytest.fixture(scope="module")
def edge_kernels():
    keys = [(case[0], dtype, shape) for case in EDGE_CASES for dtype in DTYPES for shape in SHAPES]
    return kernels_by_key(keys, lambda name, dtype, shape: lower(_case_problem(name, Op.FWD, dtype),
                                                                 x86_shape(shape), algorithm="grouplanes"))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("case", EDGE_CASES, ids=[c[0] for c in EDGE_CASES])
def test_edge_tiles_match_aten(edge_kernels, case, dtype, shape):
    plan, kernel = edge_kernels[(case[0], dtype, shape)]
    assert plan.algorithm == "grouplanes" and plan.tiling.edge_tiles, plan.reasons
    check_forward_or_data_gradient(kernel, plan.problem, torch.Generator().manual_seed(
        zlib.crc32(f"{case[0]}-{dtype.value}-{shape}".encode())))


@pytest.fixture(scope="module")
def vector_kernels():
    keys = [(name, op, dtype, shape) for name, dtype, shape in VECTOR_RUNS for op in OPS]
    return kernels_by_key(keys, lambda name, op, dtype, shape: lower(_case_problem(name, op, dtype),
                                                                     x86_shape(shape), algorithm="grouplanes"))


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("name, dtype, shape", VECTOR_RUNS, ids=[f"{n}-{d.value}-{s}" for n, d, s in VECTOR_RUNS])
def test_a_group_a_vector_matches_aten(vector_kernels, name, op, dtype, shape):
    plan, kernel = vector_kernels[(name, op, dtype, shape)]
    assert plan.algorithm == "grouplanes", plan.reasons
    check_forward_or_data_gradient(kernel, plan.problem, torch.Generator().manual_seed(
        zlib.crc32(f"{name}-{op.value}-{dtype.value}-{shape}".encode())))


# bf16 in pairs of a group's channels (grouplanes._pairs: even M, targets with AVX512-BF16): M = 2 with a
# channel tail, 4, 8 (two groups a vector) and 16 (a group a vector), strides, edges and uneven padding.
# The portable target (the AVX-512 shape in C vector code for this host, vdpbf16ps emulated) runs on
# any host; the zmm and ymm shapes step the instruction, where the CPU has it.
PAIR_CASES = [
    ("pairs_m2_tail", 24, (3, 9), (3, 3), (1, 1), ((1, 1), (1, 1)), None, 12),
    ("pairs_m4_s2", 32, (5, 12), (3, 3), (2, 2), ((1, 1), (0, 2)), None, 8),
    ("pairs_m8_5x5", 64, (4, 11), (5, 5), (1, 1), ((2, 2), (2, 2)), None, 8),
    ("pairs_m16", 48, (3, 10), (3, 3), (1, 1), ((1, 1), (1, 1)), None, 3),
]
BY_NAME.update({case[0]: case for case in PAIR_CASES})
PAIR_TARGETS = {"portable": ShapeForThisHost(TargetKind.CPU, "avx512", ISA_WIDTHS["avx512"], 32, bf16_dot=True),
                "zmm": cpu_target("avx512", bf16_dot=True), "ymm": cpu_target("avx2", bf16_dot=True)}


def _pair_target_runs(which: str) -> bool:
    return which == "portable" or (host_bf16_dot() and PAIR_TARGETS[which].isa in host_isas())


def _pair_fits(name: str, which: str) -> bool:
    """(groups of 16 fill no whole vector of the ymm shape's 8 lanes: not grouplanes there)"""
    return "grouplanes" in lower(_case_problem(name, Op.FWD, DType.BF16), PAIR_TARGETS[which]).candidates


@pytest.fixture(scope="module")
def pair_kernels():
    keys = [(case[0], op, which) for case in PAIR_CASES for op in OPS for which in PAIR_TARGETS
            if _pair_target_runs(which) and _pair_fits(case[0], which)]
    return kernels_by_key(keys, lambda name, op, which: lower(_case_problem(name, op, DType.BF16),
                                                              PAIR_TARGETS[which], algorithm="grouplanes"))


PAIR_RUNS = [(case[0], op, which) for case in PAIR_CASES for op in OPS for which in PAIR_TARGETS
             if _pair_fits(case[0], which)]


@pytest.mark.parametrize("name, op, which", PAIR_RUNS, ids=[f"{n}-{o.value}-{w}" for n, o, w in PAIR_RUNS])
def test_bf16_pairs_of_group_channels_match_aten(pair_kernels, name, op, which):
    if not _pair_target_runs(which):
        pytest.skip("this CPU has no AVX512-BF16 for this shape: the portable target runs the same pairs")
    case = BY_NAME[name]
    plan, kernel = pair_kernels[(case[0], op, which)]
    assert plan.algorithm == "grouplanes" and plan.tiling.pairs, plan.reasons
    check_forward_or_data_gradient(kernel, plan.problem, torch.Generator().manual_seed(
        zlib.crc32(f"{case[0]}-{op.value}-{which}".encode())))


def test_pairs_only_for_bf16_on_bf16_targets_with_even_groups():
    def pairs(name, dtype=DType.BF16, target=PAIR_TARGETS["zmm"], op=Op.FWD):
        return lower(_case_problem(name, op, dtype), target, algorithm="grouplanes").tiling.pairs
    assert pairs("pairs_m8_5x5") and pairs("pairs_m8_5x5", op=Op.BWD_DATA)
    assert not pairs("pairs_m8_5x5", dtype=DType.F32)
    assert not pairs("pairs_m8_5x5", target=cpu_target("avx512")), "no AVX512-BF16: no pairs"
    assert not pairs("3x3_w13"), "depthwise (M = 1) keeps its sliding tiles"


def test_depthwise_forward_takes_edge_tiles_where_a_side_has_several_columns():
    def edges(name, op=Op.FWD):
        return lower(_case_problem(name, op, DType.F32), cpu_target("avx512"), algorithm="grouplanes").tiling.edge_tiles
    assert edges("5x5_w7_edges") and edges("7x7_w9_edges") and edges("5x5_w3_edges") and edges("5x5_asym_edges")
    assert not edges("3x3_w13"), "one column a side: a tile a column"
    assert not edges("5x5_w7_edges", Op.BWD_DATA), "the forward's only"
    assert not edges("groups_of_4"), "small groups keep a tile a column"
    text = emit(lower(_case_problem("5x5_w7_edges", Op.FWD, DType.F32), cpu_target("avx512"),
                      algorithm="grouplanes")).text
    assert "constexpr bool EDGE_TILES = true" in text


def test_depthwise_takes_sliding_tiles():
    text = emit(lower(_case_problem("3x3_w13", Op.FWD, DType.F32), cpu_target("avx512"), algorithm="grouplanes")).text
    assert "slide_row<RowTaps" in text and "tail<8>" in text
    text = emit(lower(_case_problem("3x3_w13", Op.BWD_DATA, DType.F32), cpu_target("avx512"),
                      algorithm="grouplanes")).text
    assert "slide_row<PhaseTaps<PH>" in text and "tail<PH, 8>" in text


# Streamed results: (name, channels, input size, kernel, stride, padding): 32 channels, whole lines
# per pixel in every dtype and width; stride 2 for the data gradient's phases
STREAM_CASES = [
    ("3x3", 32, (5, 11), (3, 3), (1, 1), ((1, 1), (1, 1))),
    ("s2_edges", 32, (7, 9), (3, 3), (2, 2), ((1, 1), (2, 0))),
    ("groups_of_2", 64, (4, 10), (3, 3), (1, 1), ((1, 1), (1, 1))),
]
STREAM_BY_NAME = {case[0]: case for case in STREAM_CASES}


def _stream_problem(name, op, dtype) -> ConvProblem:
    _, c, size, kernel, stride, padding = STREAM_BY_NAME[name]
    return _grouped(c, size, kernel, stride, padding, groups=32 if name == "groups_of_2" else None, op=op,
                    dtype=dtype)


@pytest.fixture(scope="module")
def streaming_kernels():
    def plan_for(name, op, dtype, shape):
        plan = lower(_stream_problem(name, op, dtype), x86_shape(shape), algorithm="grouplanes")
        assert plan.tiling.stream_bytes > 0, "the plan should stream this result"
        return _streaming(plan)
    keys = [(case[0], op, dtype, shape) for case in STREAM_CASES for op in OPS for dtype in DTYPES
            for shape in SHAPES]
    return kernels_by_key(keys, plan_for)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned_result"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
@pytest.mark.parametrize("case", STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_streamed_results_match_aten(streaming_kernels, case, op, dtype, shape, aligned):
    plan, kernel = streaming_kernels[(case[0], op, dtype, shape)]
    problem = plan.problem
    text = emit(plan).text
    assert "vstream_t(" in text and "store_fence()" in text
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(f"stream-{case[0]}-{op.value}-{dtype.value}".encode()))

    def cl(t):
        return t.contiguous(memory_format=memory_format(Layout.CHANNELS_LAST, t.dim()))

    w = cl(torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64).to(tdt))
    shape_out = problem.output_shape if op is Op.FWD else problem.input_shape
    # a result whose base is 64-byte aligned (streamed) or one value off (cached stores)
    flat = torch.full((torch.Size(shape_out).numel() + 64,), float("nan"), dtype=tdt)
    start = (-flat.data_ptr() % 64) // flat.element_size() + (0 if aligned else 1)
    out = flat.as_strided(shape_out, cl(torch.empty(shape_out, dtype=tdt)).stride(), start)
    assert (out.data_ptr() % 64 == 0) == aligned
    args = (list(problem.stride), [0, 0], [1, 1], False, [0, 0], problem.groups)
    pad = [side for lo, hi in reversed(problem.padding) for side in (lo, hi)]
    if op is Op.FWD:
        x = cl(torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).to(tdt))
        b = torch.randn(problem.k, generator=gen, dtype=torch.float64).to(tdt)
        kernel({"input": x, "weight": w, "bias": b, "output": out}, problem.n, 2)
        ref = torch.ops.aten.convolution(torch.nn.functional.pad(x.double(), pad), w.double(), b.double(), *args)
    else:
        gy = cl(torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).to(tdt))
        kernel({"grad_output": gy, "weight": w, "grad_input": out}, problem.n, 2)
        padded = torch.nn.functional.pad(torch.empty(problem.input_shape, dtype=torch.float64), pad)
        full = torch.ops.aten.convolution_backward(gy.double(), padded, w.double(), None, *args,
                                                   (True, False, False))[0]
        ref = full[(slice(None), slice(None)) + tuple(slice(lo, lo + s) for (lo, _), s in
                                                      zip(problem.padding, problem.in_size))]
    assert not torch.isnan(out).any(), "values left unwritten (NaN poison survived)"
    terms = problem.c // problem.groups * 9
    assert rel_err(out, ref) <= tolerance(tdt, terms), f"rel err {rel_err(out, ref):.2e}"
    assert torch.isnan(flat[:start]).all() and torch.isnan(flat[start + out.numel():]).all(), \
        "written outside the result"


@pytest.mark.parametrize("c, dtype, streams", [
    (144, DType.F32, True),     # 576 bytes a pixel
    (144, DType.BF16, False),   # 288: pixels split lines
    (32, DType.BF16, True),
    (40, DType.F32, False),     # 160
    (8, DType.F64, True),
])
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.value)
def test_the_streaming_rule(c, dtype, streams, op):
    problem = _grouped(c, (8, 8), (3, 3), (1, 1), ((1, 1), (1, 1)), op=op, dtype=dtype)
    for isa in ("avx512", "avx2"):
        target = cpu_target(isa)
        plan = lower(problem, target, algorithm="grouplanes")
        assert plan.tiling.stream_bytes == (STREAM_L2S * target.l2_bytes if streams else 0), (isa, plan.tiling)
    assert lower(problem, cpu_target("generic"), algorithm="grouplanes").tiling.stream_bytes == 0


def test_kernels_loaded_together_keep_their_own_taps():
    """Each kernel's compile-time tables stay its own when many are loaded in one process: a class
    template's static data member outside the unnamed namespace is one process-wide (GNU unique)
    symbol, and at -O1, where it is read from memory, every kernel loaded later took the first one's
    taps (the AVX-512 shape built for an AVX2-only host, as these tests build it there)."""
    from support.code_shapes import ShapeForThisHost
    from convgen.codegen.target import ISA_WIDTHS, TargetKind
    shape = ShapeForThisHost(TargetKind.CPU, "avx2", ISA_WIDTHS["avx2"], 16)   # built for this host at -O1
    names = ["3x3_w7", "k1x5_uneven", "s2_5x5_dil2", "s3_k2"]
    keys = [(name, op) for name in names for op in OPS]
    loaded = kernels_by_key(keys, lambda name, op: lower(_case_problem(name, op, DType.F32), shape,
                                                         algorithm="grouplanes"))
    for (name, op), (plan, kernel) in loaded.items():
        check_forward_or_data_gradient(kernel, plan.problem, torch.Generator().manual_seed(
            zlib.crc32(f"together-{name}-{op.value}".encode())))


def test_small_groups_count_channel_vectors_for_the_tile():
    """The tile's vectors of channels are counted over the channels, not the groups: RegNet's 8 groups of
    8 channels (64 channels: 8 AVX2 vectors, 4 AVX-512 ones) take two vectors a tile, where counting the
    8 groups as one vector's worth gave one (AVX2 shape, kernel alone: forward 2.53 -> 1.37 ms, data
    gradient 2.97 -> 1.49; BENCHMARKS.md, grouplanes: a group a vector by broadcasts)."""
    for isa, chunk in (("avx2", 8), ("avx512", 4)):
        for op in OPS:
            plan = lower(conv_problem(8, 64, 64, (56, 56), (3, 3), 1, 1, 1, 8, op=op, layout=Layout.CHANNELS_LAST),
                         cpu_target(isa), algorithm="grouplanes")
            assert (plan.tiling.nv, plan.tiling.ksb) == (2, chunk), (isa, op, plan.tiling)
