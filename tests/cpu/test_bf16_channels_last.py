"""bf16 in channels last on AVX512-BF16 hosts (bf16 pairs on vdpbf16ps): the rules that make these
kernels faster, each checked for the plan it makes and against ATen in float64.

- Results rounded to bf16 by vcvtneps2bf16 (context.narrow_by_instruction) on x86 targets with
  AVX512-BF16; integer vector code on every other target.
- A forward into channels last takes a tile of whole-line channel blocks where one fills the
  channels (lanes_operands.line_step), so that a large output is stored past the caches.
- bf16 pairs read a channels-last operand of an even number of channels a group in place
  (lanes_operands.pairs_in_place), as words that are already pairs.
- The lanes weight gradient copies a channels-last input's pixel pairs channels innermost, in runs
  (CH_INNER in its source), and takes bf16 1x1 weight gradients of fewer than 256 input channels
  with unit strides from gemm (gemm._over_1x1).

The kernels run where the CPU has AVX512-BF16 (vdpbf16ps and vcvtneps2bf16 in assembly); elsewhere
the same rules' plans are checked and the portable emulation of the pairs runs in
cpu/test_variants.py.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from convgen.codegen.emit import emit
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import Target, TargetKind, cpu_target, host_bf16_dot, host_isas

from support.builds import load_keyed
from support.problems import conv_problem
from support.reference import in_channels_last, rel_err, tolerance

ZMM_PAIRS = cpu_target("avx512", bf16_dot=True)
RUNS = host_bf16_dot() and "avx512" in host_isas()
CL = Layout.CHANNELS_LAST

# (name, op, problem arguments), bf16 channels last
CASES = [
    ("fwd_1x1_96_streamed", Op.FWD, dict(n=2, c=16, k=96, size=(112, 112), kernel=1, pad=0)),   # 4.8 MB out
    ("fwd_3x3_96_pad", Op.FWD, dict(n=2, c=10, k=96, size=(9, 13), kernel=3)),
    # the reduced operand read in place as words of pairs (lanes_operands.pairs_in_place): 1x1, tiles within rows
    # (the padding never read), groups of an even count, a strided data gradient's phases
    ("fwd_1x1_in_place", Op.FWD, dict(n=2, c=64, k=48, size=(9, 11), kernel=1, pad=0)),
    ("fwd_3x3_rows_in_place", Op.FWD, dict(n=2, c=32, k=64, size=(6, 40), kernel=3)),
    ("fwd_grouped_in_place", Op.FWD, dict(n=2, c=20, k=64, size=(5, 7), kernel=1, pad=0, groups=2)),
    ("dgrad_1x1_in_place", Op.BWD_DATA, dict(n=2, c=40, k=96, size=(7, 9), kernel=1, pad=0)),
    ("dgrad_3x3_rows_in_place", Op.BWD_DATA, dict(n=2, c=64, k=32, size=(6, 40), kernel=3)),
    ("dgrad_s2_in_place", Op.BWD_DATA, dict(n=2, c=48, k=64, size=(9, 12), kernel=1, pad=0, stride=2)),
    ("wgrad_1x1_lanes", Op.BWD_WEIGHT, dict(n=3, c=24, k=64, size=(7, 9), kernel=1, pad=0)),
    ("wgrad_1x1_odd_width", Op.BWD_WEIGHT, dict(n=2, c=40, k=96, size=(5, 7), kernel=1, pad=0, groups=2)),
    # 24 filters: the pack's block of 32 is partial (its second vector 8 channels, a masked load)
    ("wgrad_1x1_partial_block", Op.BWD_WEIGHT, dict(n=2, c=40, k=24, size=(5, 8), kernel=1, pad=0)),
    ("wgrad_3x3_pad_stride2", Op.BWD_WEIGHT, dict(n=2, c=18, k=64, size=(11, 9), kernel=3, stride=2)),
    ("wgrad_3d_pad", Op.BWD_WEIGHT, dict(n=1, c=6, k=64, size=(3, 5, 7), kernel=3)),
]


def _plan(op: Op, kw: dict, target: Target = ZMM_PAIRS):
    return lower(conv_problem(**kw, op=op, dtype=DType.BF16, layout=CL), target)


@pytest.fixture(scope="module")
def kernels():
    return load_keyed([(name, _plan(op, kw)) for name, op, kw in CASES]) if RUNS else {}


@pytest.mark.parametrize("name, op, kw", CASES, ids=[c[0] for c in CASES])
def test_bf16_channels_last_matches_aten(kernels, name, op, kw):
    if not RUNS:
        pytest.skip("this CPU has no AVX512-BF16 with AVX-512: the plans are checked below, the portable pairs "
                    "in cpu/test_variants.py")
    plan, kernel = kernels[name]
    p = plan.problem
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    x = in_channels_last(torch.randn(p.input_shape, generator=gen, dtype=torch.float64).to(torch.bfloat16))
    w = in_channels_last(torch.randn(p.weight_shape, generator=gen, dtype=torch.float64).to(torch.bfloat16))
    args = (list(p.stride), [lo for lo, _ in p.padding], list(p.dilation), False, list(p.output_padding), p.groups)
    if op is Op.FWD:
        b = torch.randn(p.k, generator=gen, dtype=torch.float64).to(torch.bfloat16)
        y = in_channels_last(torch.full(p.output_shape, float("nan"), dtype=torch.bfloat16))
        kernel({"input": x, "weight": w, "bias": b, "output": y}, p.n, 2)
        ref = torch.ops.aten.convolution(x.double(), w.double(), b.double(), *args)
        terms = p.c // p.groups * torch.Size(p.kernel).numel()
        assert rel_err(y, ref) <= tolerance(torch.bfloat16, terms), f"output rel err {rel_err(y, ref):.2e}"
        return
    gy = in_channels_last(torch.randn(p.output_shape, generator=gen, dtype=torch.float64).to(torch.bfloat16))
    if op is Op.BWD_DATA:
        gx = in_channels_last(torch.full(p.input_shape, float("nan"), dtype=torch.bfloat16))
        kernel({"grad_output": gy, "weight": w, "grad_input": gx}, p.n, 2)
        ref = torch.ops.aten.convolution_backward(gy.double(), x.double(), w.double(), None, *args,
                                                  [True, False, False])[0]
        terms = p.k // p.groups * torch.Size(p.kernel).numel()
        assert rel_err(gx, ref) <= tolerance(torch.bfloat16, terms), f"grad_input rel err {rel_err(gx, ref):.2e}"
        return
    gw = in_channels_last(torch.full(p.weight_shape, float("nan"), dtype=torch.bfloat16))
    gb = torch.full((p.k,), float("nan"), dtype=torch.bfloat16)
    kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb}, p.n, 2)
    _, ref_w, ref_b = torch.ops.aten.convolution_backward(gy.double(), x.double(), w.double(), [p.k], *args,
                                                          [False, True, True])
    terms = p.n * torch.Size(p.output_shape[2:]).numel()
    assert rel_err(gw, ref_w) <= tolerance(torch.bfloat16, terms), f"grad_weight rel err {rel_err(gw, ref_w):.2e}"
    assert rel_err(gb, ref_b) <= tolerance(torch.bfloat16, terms), f"grad_bias rel err {rel_err(gb, ref_b):.2e}"


@pytest.mark.parametrize("name, op, kw", CASES, ids=[c[0] for c in CASES])
def test_bf16_results_rounded_by_the_instruction_only_on_bf16_hosts(name, op, kw):
    assert "vcvtneps2bf16" in emit(_plan(op, kw)).text
    portable = Target(TargetKind.CPU, "generic", 16, bf16_dot=True)   # (C vector code: no x86 assembly)
    for target in (cpu_target("avx512"), cpu_target("avx2"), portable):
        assert "vcvtneps2bf16" not in emit(_plan(op, kw, target)).text, target.name()
    f32 = lower(conv_problem(**kw, op=op, layout=CL), ZMM_PAIRS)
    assert "vcvtneps2bf16" not in emit(f32).text


@pytest.mark.parametrize("name, op, kw", [c for c in CASES if c[0].endswith("_in_place")],
                         ids=[c[0] for c in CASES if c[0].endswith("_in_place")])
def test_pairs_read_in_place_where_channels_pair(name, op, kw):
    plan = _plan(op, kw)
    assert plan.algorithm == "lanes" and plan.tiling.pairs, (plan.algorithm, plan.reasons)
    assert ("X" if op is Op.FWD else "Y") in plan.tiling.in_place, plan.reasons
    # an odd number of channels a group: its pairs are made by the copy
    odd = dict(kw, c=kw["c"] - 1 if op is Op.FWD else kw["c"], k=kw["k"] - 1 if op is Op.BWD_DATA else kw["k"])
    if op is Op.FWD and kw.get("groups", 1) > 1:
        odd = dict(kw, c=kw["c"] + kw["groups"])   # (groups of 11: odd)
    other = _plan(op, odd)
    assert not other.tiling.in_place, other.reasons


def test_forward_tile_of_whole_lines_streams_the_output():
    plan = _plan(Op.FWD, CASES[0][2])
    assert plan.algorithm == "lanes" and plan.tiling.pairs
    assert plan.tiling.nv % 2 == 0 and 96 % (plan.tiling.nv * 16) == 0, plan.tiling
    assert plan.tiling.stream_bytes > 0, "whole-line channel blocks: the output streams past the caches"
    # where no whole-line block fills the channels (48 = 3 vectors), the tile's own best stays
    odd = _plan(Op.FWD, dict(n=2, c=16, k=48, size=(56, 56), kernel=1, pad=0))
    assert odd.tiling.nv == 3 and odd.tiling.stream_bytes == 0
    # f32 (whole lines a vector) and the AVX2 shape keep their tiles
    assert lower(conv_problem(n=2, c=16, k=96, size=(112, 112), kernel=1, pad=0, layout=CL),
                 ZMM_PAIRS).tiling.nv == 3


@pytest.mark.parametrize("name, op, kw", [c for c in CASES if c[1] is Op.BWD_WEIGHT],
                         ids=[c[0] for c in CASES if c[1] is Op.BWD_WEIGHT])
def test_pair_copy_of_a_channels_last_input_is_channels_innermost(name, op, kw):
    plan = _plan(op, kw)
    assert plan.algorithm == "lanes" and plan.tiling.pairs, (plan.algorithm, plan.reasons)
    # (true for a channels-last input: X_SC == 1; channel planes evaluate it false and stay planes)
    assert "constexpr bool CH_INNER = true && X_SC == 1" in emit(plan).text
    unpaired = lower(conv_problem(**kw, op=op, layout=CL), ZMM_PAIRS, algorithm="lanes")
    assert not unpaired.tiling.pairs and "constexpr bool CH_INNER = false" in emit(unpaired).text


def test_bf16_1x1_weight_gradients_from_channels_last_take_lanes():
    def algorithm(c, stride=1, layout=CL):
        return lower(conv_problem(n=8, c=c, k=256, size=(56, 56), kernel=1, pad=0, stride=stride, op=Op.BWD_WEIGHT,
                                  dtype=DType.BF16, layout=layout), ZMM_PAIRS).algorithm
    assert algorithm(64) == "lanes" and algorithm(128) == "lanes"
    assert algorithm(256) == "gemm", "256 input channels and more stay gemm"
    assert algorithm(64, stride=2) == "gemm", "strided 1x1 stays gemm"
    assert algorithm(64, layout=Layout.CONTIGUOUS) != "lanes", "channel planes keep the earlier rules"
