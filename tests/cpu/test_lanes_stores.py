"""The lanes forward's and data gradient's non-temporal stores of large results (channels last,
results of several L2s per call).

Real outputs that large take seconds in a test, so these plans lower the threshold to one byte:
every call then takes the large-output path, checked against ATen in float64 with the output poisoned first (an unwritten line shows as NaN).
The plan's own rule is checked too: it streams only where every tile store covers whole 64-byte
lines, on x86 targets. And the stores of channel-plane (NCHW) outputs through a register transpose
(PLANE_CASES below).
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import pytest
import torch

from convgen.dispatch import dispatch
from convgen.codegen.emit import emit
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target, host_cpu, host_isas
from convgen.dispatch.problem import TORCH_DTYPES

from support.problems import conv_problem
from support.reference import in_channels_last, rel_err, tolerance

_problem = functools.partial(conv_problem, layout=Layout.CHANNELS_LAST)   # forwards, every operand channels last


# (name, problem arguments): 64 output channels per group, so every channel block is whole in
# every dtype and vector width
CASES = [
    ("3x3_pad", dict(n=2, c=5, k=64, size=(7, 9), kernel=(3, 3))),
    ("1x1_in_place", dict(n=3, c=16, k=64, size=(5, 6), kernel=(1, 1), pad=0)),      # input read in place
    ("stride2_grouped", dict(n=2, c=6, k=128, size=(9, 11), kernel=(3, 3), stride=2, groups=2)),
    ("3d", dict(n=1, c=3, k=64, size=(3, 5, 6), kernel=(3, 3, 3))),
    ("tail_pixels", dict(n=1, c=4, k=64, size=(1, 7), kernel=(1, 3))),               # fewer pixels than a tile
]
DTYPES = [DType.F32, DType.BF16, DType.F64]


def _targets():
    yield "host", host_cpu()
    if "avx512" in host_isas():
        yield "avx512", cpu_target("avx512", bf16_dot=False)


# data gradients (grad_input channels last, 64 or 128 channels): a 3x3, and a 1x1 of stride 2 whose
# phases without taps store zeros
DGRAD_CASES = [
    ("dgrad_3x3", dict(n=2, c=64, k=5, size=(7, 9), kernel=(3, 3), op=Op.BWD_DATA)),
    ("dgrad_1x1_s2", dict(n=2, c=128, k=24, size=(9, 10), kernel=(1, 1), pad=0, stride=2, op=Op.BWD_DATA)),
]


def _streaming(problem: ConvProblem, target):
    plan = lower(problem, target, algorithm="lanes")
    assert plan.tiling.stream_bytes > 0, "the plan should stream this channels-last result"
    return dataclasses.replace(plan, tiling=dataclasses.replace(plan.tiling, stream_bytes=1))


@pytest.fixture(scope="module")
def kernels():
    keys = [(_problem(**kw, dtype=dt), target) for _, kw in CASES + DGRAD_CASES for dt in DTYPES
            for _, target in _targets()]
    plans = [_streaming(*key) for key in keys]
    return dict(zip(keys, zip(plans, dispatch.load_plans(plans))))


def _streaming_kernel(kernels, which, name, kw, dtype):
    """(problem, kernel, torch dtype, generator) of a case's streaming kernel on target `which`,
    its source checked to stream."""
    targets = dict(_targets())
    if which not in targets:
        pytest.skip("this CPU does not run AVX-512 code: the host target's streaming kernels run instead")
    problem = _problem(**kw, dtype=dtype)
    plan, kernel = kernels[(problem, targets[which])]
    text = emit(plan).text
    assert "vstream_t(dst + o0" in text and "store_fence()" in text
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}-{dtype.value}".encode()))
    return problem, kernel, TORCH_DTYPES[dtype], gen


def _poisoned_result(shape, tdt, aligned: bool) -> torch.Tensor:
    """A channels-last result of NaNs whose base is 64-byte aligned (streamed) or one element off
    (cached stores)."""
    flat = torch.full((torch.Size(shape).numel() + 64,), float("nan"), dtype=tdt)
    start = (-flat.data_ptr() % 64) // flat.element_size() + (0 if aligned else 1)
    out = flat.as_strided(shape, in_channels_last(torch.empty(shape, dtype=tdt)).stride(), start)
    assert (out.data_ptr() % 64 == 0) == aligned
    return out


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned_output"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("name, kw", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("which", ["host", "avx512"])
def test_streamed_output_matches_aten(kernels, which, name, kw, dtype, aligned):
    problem, kernel, tdt, gen = _streaming_kernel(kernels, which, name, kw, dtype)
    x = in_channels_last(torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).to(tdt))
    w = in_channels_last(torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64).to(tdt))
    b = torch.randn(problem.k, generator=gen, dtype=torch.float64).to(tdt)
    out = _poisoned_result(problem.output_shape, tdt, aligned)
    kernel({"input": x, "weight": w, "bias": b, "output": out}, problem.n, 2)
    ref = torch.ops.aten.convolution(x.double(), w.double(), b.double(), list(problem.stride),
                                     [lo for lo, _ in problem.padding], list(problem.dilation), False,
                                     list(problem.output_padding), problem.groups)
    assert not torch.isnan(out).any(), "elements left unwritten (NaN poison survived)"
    assert rel_err(out, ref) <= tolerance(tdt, 1), f"rel err {rel_err(out, ref):.2e}"


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned_grad_input"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("name, kw", DGRAD_CASES, ids=[c[0] for c in DGRAD_CASES])
@pytest.mark.parametrize("which", ["host", "avx512"])
def test_streamed_grad_input_matches_aten(kernels, which, name, kw, dtype, aligned):
    problem, kernel, tdt, gen = _streaming_kernel(kernels, which, name, kw, dtype)
    w = in_channels_last(torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64).to(tdt))
    gy = in_channels_last(torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).to(tdt))
    shape = problem.input_shape
    out = _poisoned_result(shape, tdt, aligned)
    kernel({"grad_output": gy, "weight": w, "grad_input": out}, problem.n, 2)
    ref = torch.ops.aten.convolution_backward(
        gy.double(), torch.empty(shape, dtype=torch.float64), w.double(), None, list(problem.stride),
        [lo for lo, _ in problem.padding], list(problem.dilation), False, list(problem.output_padding),
        problem.groups, [True, False, False])[0]
    assert not torch.isnan(out).any(), "elements left unwritten (NaN poison survived)"
    assert rel_err(out, ref) <= tolerance(tdt, problem.k), f"rel err {rel_err(out, ref):.2e}"


@pytest.mark.parametrize("kw, why", [
    (dict(n=2, c=8, k=40, size=(8, 8), kernel=(3, 3)), "40 channels (160 B per pixel): blocks split lines"),
    (dict(n=2, c=8, k=72, size=(8, 8), kernel=(3, 3)), "72 channels (288 B per pixel): blocks split lines"),
])
def test_no_streaming_where_stores_would_split_lines(kw, why):
    assert lower(_problem(**kw), host_cpu(), algorithm="lanes").tiling.stream_bytes == 0, why


def test_large_outputs_streamed_on_both_x86_shapes():
    problem = _problem(n=2, c=8, k=64, size=(8, 8), kernel=(3, 3))
    for isa in ("avx512", "avx2"):
        assert lower(problem, cpu_target(isa), algorithm="lanes").tiling.stream_bytes > 0, isa


def test_streaming_only_for_channels_last_outputs_on_x86():
    nchw = dataclasses.replace(_problem(n=2, c=8, k=64, size=(8, 8), kernel=(3, 3)),
                               input_layout=Layout.CONTIGUOUS, weight_layout=Layout.CONTIGUOUS,
                               output_layout=Layout.CONTIGUOUS)
    assert lower(nchw, host_cpu(), algorithm="lanes").tiling.stream_bytes == 0
    portable = cpu_target("generic")
    assert lower(_problem(n=2, c=8, k=64, size=(8, 8), kernel=(3, 3)), portable,
                 algorithm="lanes").tiling.stream_bytes == 0


# Channel-plane (contiguous) outputs of the lanes kernels, stored V pixels x V channels at a time
# through a register transpose where V pixels are neighbours in the plane, value by value where
# they are not (across images, stride phases, a run's tail): problems of every kind the lanes
# forward and data gradient take, against ATen in float64 with the output poisoned.
PLANE_CASES = [
    ("fwd_3x3", Op.FWD, dict(n=2, c=5, k=20, size=(7, 9), kernel=(3, 3))),
    ("fwd_1d_dil", Op.FWD, dict(n=3, c=8, k=12, size=(37,), kernel=(3,), pad=4, dil=4)),
    ("fwd_grouped_s2", Op.FWD, dict(n=2, c=6, k=10, size=(9, 11), kernel=(3, 3), stride=2, groups=2)),
    ("dgrad_3x3", Op.BWD_DATA, dict(n=2, c=7, k=9, size=(6, 10), kernel=(3, 3))),
    ("dgrad_s2_phases", Op.BWD_DATA, dict(n=2, c=9, k=5, size=(9, 8), kernel=(3, 3), stride=2)),
    ("dgrad_3d", Op.BWD_DATA, dict(n=1, c=4, k=6, size=(3, 5, 6), kernel=(3, 3, 3))),
    # stride-2 phases with runs of V pixels along a row: every other pixel by masked stores (vstore_t_step2)
    ("dgrad_s2_wide_rows", Op.BWD_DATA, dict(n=2, c=20, k=6, size=(3, 70), kernel=(3, 3), stride=2)),
    ("dgrad_1d_s2", Op.BWD_DATA, dict(n=2, c=18, k=8, size=(75,), kernel=(4,), stride=2, pad=1)),
]


def _plane_plan(problem: ConvProblem):
    return lower(problem, host_cpu(), algorithm="lanes")


@pytest.fixture(scope="module")
def plane_kernels():
    plans = [_plane_plan(conv_problem(**kw, op=op, dtype=dt)) for _, op, kw in PLANE_CASES for dt in DTYPES]
    return {p.problem: (p, k) for p, k in zip(plans, dispatch.load_plans(plans))}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("name, op, kw", PLANE_CASES, ids=[c[0] for c in PLANE_CASES])
def test_transposed_plane_stores_match_aten(plane_kernels, name, op, kw, dtype):
    problem = conv_problem(**kw, op=op, dtype=dtype)
    plan, kernel = plane_kernels[problem]
    assert "vtranspose(r);" in emit(plan).text and "transposed in registers" in " ".join(why for _, why in plan.reasons)
    tdt = TORCH_DTYPES[dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}-{dtype.value}".encode()))
    x = torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).to(tdt)
    w = torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64).to(tdt)
    b = torch.randn(problem.k, generator=gen, dtype=torch.float64).to(tdt)
    gy = torch.randn(problem.output_shape, generator=gen, dtype=torch.float64).to(tdt)
    args = (list(problem.stride), [lo for lo, _ in problem.padding], list(problem.dilation), False,
            list(problem.output_padding), problem.groups)
    if op is Op.FWD:
        out = torch.full(problem.output_shape, float("nan"), dtype=tdt)
        kernel({"input": x, "weight": w, "bias": b, "output": out}, problem.n, 2)
        ref = torch.ops.aten.convolution(x.double(), w.double(), b.double(), *args)
    else:
        out = torch.full(problem.input_shape, float("nan"), dtype=tdt)
        kernel({"grad_output": gy, "weight": w, "grad_input": out}, problem.n, 2)
        ref = torch.ops.aten.convolution_backward(gy.double(), x.double(), w.double(), None, *args,
                                                  [True, False, False])[0]
    assert not torch.isnan(out).any(), "elements left unwritten (NaN poison survived)"
    assert rel_err(out, ref) <= tolerance(tdt, 1), f"rel err {rel_err(out, ref):.2e}"


def test_transposed_stores_only_for_channel_planes():
    """Channel planes (NCHW) take the transposed stores and say so; channels-last outputs, whose
    vectors of channels are stored whole, do not."""
    said = lambda problem: "transposed in registers" in " ".join(
        why for _, why in lower(problem, host_cpu(), algorithm="lanes").reasons)
    assert said(conv_problem(n=1, c=16, k=16, size=(4096,), kernel=(3,), pad=4, dil=4))
    assert said(conv_problem(n=1, c=8, k=8, size=(56, 56), kernel=(3, 3), op=Op.BWD_DATA))
    assert not said(_problem(n=1, c=8, k=64, size=(16, 32), kernel=(3, 3)))
