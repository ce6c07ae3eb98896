"""The lanes weight gradient of 1-D channel rows with chunks staged per thread (`Tiling.stage`).

Where the input and grad_output are contiguous and the problem is one-dimensional with images of
STAGE_MIN_PIXELS or more (smaller cases below are made to stage), the kernel neither copies the
whole input zero-padded nor packs the whole grad_output up front: each chunk of the reduction stages
the input window it reads (the item's channels, zero-padded) and its grad_output, pixel-major, in
buffers of its thread; the bias sums come from the staged chunks (the first row block's item of each
part of the reduction takes them). These tests check every such path against ATen in float64:
windows that reach into the padding on either side and windows wholly in it, no padding, uneven
padding, strides with dilation, several blocks of output channels (the last partial), groups, work
items whose rows start inside a channel's taps (several row blocks), parts of the reduction that cut
images (chunks stop at each image's end), and f64 and bf16, with and without the bias gradient; on
every x86 code shape this CPU runs. The API's 1-D calls (a transposed convolution too) are checked
end to end, and the plans are checked to stage exactly where they should.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import pytest
import torch

import convgen
from convgen.codegen.emit import emit
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.cpu.lanes_wgrad import STAGE_MIN_PIXELS
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target, host_cpu
from convgen.api.ops import call_problems
from convgen.dispatch.problem import TORCH_DTYPES

from support.builds import load_keyed
from support.code_shapes import second_isa
from support.problems import conv_problem
from support.reference import rel_err, tolerance

_problem = functools.partial(conv_problem, op=Op.BWD_WEIGHT)   # 1-D weight gradients (and the bias's by default)


# name, problem, forced tiling (rb: rows per work item, as a multiple of the tile's rows; splits)
CASES = [
    ("dilated", dict(n=3, c=20, k=36, size=300, kernel=3, pad=4, dil=4), {}),
    ("stride2_dilated", dict(n=2, c=7, k=20, size=101, kernel=5, stride=2, pad=3, dil=2), {}),
    ("uneven", dict(n=2, c=9, k=17, size=77, kernel=4, pad=((3, 0),)), {}),
    ("window_in_padding", dict(n=2, c=5, k=16, size=20, kernel=3, pad=6), {}),   # first and last windows all zeros
    ("no_padding", dict(n=3, c=12, k=24, size=130, kernel=7, pad=0), {}),
    ("blocks", dict(n=2, c=6, k=144, size=90, kernel=3), {}),                    # several blocks, the last partial
    ("groups", dict(n=2, c=12, k=40, size=64, kernel=5, pad=2, groups=2), {}),
    ("row_blocks", dict(n=2, c=11, k=16, size=70, kernel=5, pad=2), {"rb": 2}),  # items start inside a channel
    ("split_images", dict(n=3, c=10, k=20, size=333, kernel=3, pad=1), {"splits": 5}),
    ("f64", dict(n=2, c=9, k=20, size=150, kernel=3, pad=2, dil=2, dtype=DType.F64), {"splits": 3}),
    ("bf16", dict(n=2, c=9, k=20, size=150, kernel=3, pad=2, dil=2, dtype=DType.BF16), {"splits": 3}),
]
# these also run on the second code shape (the AVX2 shape on an AVX-512 host)
SECOND = ("dilated", "row_blocks", "split_images")


def _targets(name):
    # bf16 in pairs (vdpbf16ps, AMD's default) has its own paired input copy and does not stage
    yield "host", dataclasses.replace(host_cpu(), bf16_dot=False)
    if second_isa() and name in SECOND:
        yield "second", cpu_target(second_isa(), bf16_dot=False)


def _plans():
    for name, kw, forced in CASES:
        for bias in (True, False):
            problem = _problem(**kw, bias=bias)
            for which, target in _targets(name):
                plan = lower(problem, target, algorithm="lanes")
                # (plans stage images of STAGE_MIN_PIXELS or more; these smaller ones are made to)
                tiling = dataclasses.replace(plan.tiling, stage=True)
                if "rb" in forced:
                    tiling = dataclasses.replace(tiling, rb=forced["rb"] * tiling.kb)
                if "splits" in forced:
                    tiling = dataclasses.replace(tiling, splits=forced["splits"])
                yield (name, bias, which), dataclasses.replace(plan, tiling=tiling)


@pytest.fixture(scope="module")
def kernels():
    return load_keyed(_plans())


RUNS = [(name, which) for name, _, _ in CASES for which in ("host", "second") if which == "host" or name in SECOND]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("name, which", RUNS, ids=[f"{n}-{w}" for n, w in RUNS])
def test_staged_chunks_match_aten(kernels, name, which, bias):
    if (name, bias, which) not in kernels:
        pytest.skip("this CPU runs one x86 code shape only (AVX2 without AVX-512): the host's runs instead")
    plan, kernel = kernels[(name, bias, which)]
    text = emit(plan).text
    assert "stage_input(x, lx, g" in text and "pad_input(x, xp" not in text
    problem = plan.problem
    tdt = TORCH_DTYPES[problem.dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(f"staged-{name}-{bias}".encode()))
    x = torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).to(tdt)
    gy = torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).to(tdt)
    gw = torch.full(problem.weight_shape, float("nan"), dtype=tdt)
    gb = torch.full((problem.k,), float("nan"), dtype=tdt)
    kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb if bias else None}, problem.n, 2)
    (lo, hi), = problem.padding
    _, ref_w, ref_b = torch.ops.aten.convolution_backward(
        gy.double(), torch.nn.functional.pad(x.double(), (lo, hi)), torch.empty(problem.weight_shape, dtype=torch.float64),
        [problem.k], list(problem.stride), [0], list(problem.dilation), False, [0], problem.groups, [False, True, bias])
    terms = problem.n * problem.output_shape[2]
    assert not torch.isnan(gw).any(), "weight gradients left unwritten"
    assert rel_err(gw, ref_w) <= tolerance(tdt, terms), f"grad_weight rel err {rel_err(gw, ref_w):.2e}"
    if bias:
        assert rel_err(gb, ref_b) <= tolerance(tdt, terms), f"grad_bias rel err {rel_err(gb, ref_b):.2e}"


API_CASES = [
    # (input, weight, stride, padding, dilation, transposed, output_padding, groups)
    ((2, 32, 2100), (48, 32, 3), 1, 2, 2, False, 0, 1),
    # (16 output channels a group: a vector's worth, so lanes; fewer take the planes weight gradient)
    ((2, 24, 4201), (128, 3, 5), 2, 1, 1, False, 0, 8),
    ((2, 16, 2100), (16, 40, 4), 2, 1, 1, True, 1, 1),   # transposed: grad_output is the wider operand
]


@pytest.mark.parametrize("case", API_CASES, ids=["dilated", "grouped_strided", "transposed"])
def test_api_backward_with_staged_chunks_matches_aten(case):
    xs, ws, stride, padding, dilation, transposed, output_padding, groups = case
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    x = torch.randn(xs, generator=gen, dtype=torch.float64).float()
    w = torch.randn(ws, generator=gen, dtype=torch.float64).float()
    args = ([stride], [padding], [dilation], transposed, [output_padding], groups)
    y = torch.ops.aten.convolution(x.double(), w.double(), None, *args)
    gy = torch.randn(y.shape, generator=gen, dtype=torch.float64).float()
    bias_sizes = [ws[1] * groups if transposed else ws[0]]
    problems = call_problems(x, w, torch.zeros(bias_sizes), *args, grad_output=gy)
    plans = [lower(p, host_cpu()) for p in problems if p.op is Op.BWD_WEIGHT]
    assert [p.tiling.stage for p in plans] == [True] * len(plans), \
        f"the weight gradient: {[(p.algorithm, p.tiling.stage) for p in plans]}"
    got = convgen.convolution_backward(gy, x, w, bias_sizes, *args, [True, True, True])
    ref = torch.ops.aten.convolution_backward(gy.double(), x.double(), w.double(), bias_sizes, *args, [True, True, True])
    terms = xs[0] * max(xs[2], y.shape[2])
    for name, a, r, t in zip(("grad_input", "grad_weight", "grad_bias"), got, ref,
                             (ws[0] * ws[2], terms, terms)):
        assert rel_err(a, r) <= tolerance(torch.float32, t), f"{name} rel err {rel_err(a, r):.2e}"


def test_staged_only_where_it_applies():
    target = cpu_target("avx512")
    tiling = lambda problem: lower(problem, target, algorithm="lanes").tiling
    assert tiling(_problem(n=8, c=128, k=128, size=4096, kernel=3, pad=4, dil=4)).stage, "wavenet_1d"
    assert tiling(_problem(n=2, c=16, k=16, size=STAGE_MIN_PIXELS, kernel=3)).stage, "images of the threshold"
    assert not tiling(_problem(n=16, c=64, k=64, size=1024, kernel=5, pad=2)).stage, "shorter images keep the copies"
    two_d = dataclasses.replace(_problem(n=2, c=16, k=16, size=8, kernel=3), in_size=(6, 8), kernel=(3, 3),
                                stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), output_padding=(0, 0))
    assert not tiling(two_d).stage, "2-D planes keep the whole copy"
    one_row = dataclasses.replace(two_d, in_size=(1, 2 * STAGE_MIN_PIXELS), kernel=(1, 3), padding=((0, 0), (1, 1)))
    assert tiling(one_row).stage, "a 2-D problem of one row is one-dimensional"
    cl_one_row = dataclasses.replace(one_row, input_layout=Layout.CHANNELS_LAST, weight_layout=Layout.CHANNELS_LAST,
                                     output_layout=Layout.CHANNELS_LAST)
    assert not tiling(cl_one_row).stage, "channels last: pixels are not one run per channel"
    pairs = lower(_problem(n=2, c=16, k=16, size=STAGE_MIN_PIXELS, kernel=3, dtype=DType.BF16),
                  dataclasses.replace(target, bf16_dot=True), algorithm="lanes").tiling
    assert pairs.pairs and not pairs.stage, "bf16 pairs keep their paired copy"
