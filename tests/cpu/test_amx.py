"""bf16 kernels on AMX tiles (algorithm "amx", `Target.amx_bf16`).

The forward multiplies 16 x 32 bf16 tiles of a zero-padded channels-last copy of the input (16
output pixels x 32 input channels at one tap) by 32 x 16 tiles of the weights packed in pairs,
into 16 x 16 f32 tiles. These tests check it against ATen in float64 where its bookkeeping can
go wrong: tiles running across rows and images (unit strides) and tiles within rows (strides),
channel counts that are not whole tiles on either side, an odd number of tiles of pixels or of
output channels, groups, dilation, uneven padding and windows wholly in the padding, 1-D, 2-D and
3-D, both layouts, with and without the bias. The data gradient is the forward over grad_output per
stride phase (phases with every tap, some, or none when the stride exceeds the kernel); the weight
gradient reduces over a planar copy split into stride phases.

Every case runs on the C emulation of the tile instructions (an amx_bf16 target of another ISA
level: any x86 host), and natively where this CPU has AMX-BF16; the native kernels are built on
every host (their compile is checked there) but run only where the instructions exist.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib

import pytest
import torch

import convgen
from convgen.codegen.emit import emit
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target, host_amx, host_cpu, host_isas
from convgen.building.build import build_many
from convgen.dispatch import dispatch
from convgen.dispatch.problem import TORCH_DTYPES

from support.problems import conv_problem
from support.reference import rel_err, tolerance

# every problem here is bf16, with a bias unless a case says otherwise (the data gradient's too)
_problem = functools.partial(conv_problem, dtype=DType.BF16, bias=True)


# name -> problem (small: the emulation multiplies in scalar C)
CASES = {
    "flat_3x3": dict(n=2, c=32, k=32, size=(9, 11), kernel=3),                       # tiles across rows and images
    "strided_rows": dict(n=2, c=40, k=20, size=(9, 11), kernel=3, stride=2),         # tiles within rows
    "groups_7x7": dict(n=1, c=64, k=48, size=(7, 7), kernel=3, groups=2),            # an odd number of output tiles
    "tails_3d": dict(n=2, c=17, k=33, size=(4, 5, 6), kernel=3),                     # channels not whole tiles
    "dilated_1d": dict(n=2, c=32, k=16, size=(40,), kernel=5, stride=3, pad=2, dil=2),
    "pointwise": dict(n=2, c=48, k=64, size=(6, 7), kernel=1, pad=0),               # data gradient in place
    "pointwise_in_place": dict(n=3, c=64, k=40, size=(5, 7), kernel=1, pad=0),      # forward in place, a tail
    "pointwise_groups_whole": dict(n=2, c=64, k=64, size=(4, 8), kernel=1, pad=0, groups=2),   # tiles end images
    "uneven_pad": dict(n=1, c=70, k=18, size=(8, 9), kernel=(2, 3), pad=((3, 0), (0, 2)), dil=(2, 1)),
    "window_in_padding": dict(n=2, c=16, k=16, size=(3, 4), kernel=3, pad=4),       # first windows all zeros
    "strided_tall": dict(n=1, c=24, k=40, size=(20, 37), kernel=(3, 1), stride=(1, 2), pad=(1, 0)),
    "stride_over_kernel": dict(n=2, c=16, k=24, size=(11, 10), kernel=2, stride=3, pad=1),   # phases without taps
    "strided_3d": dict(n=1, c=20, k=16, size=(5, 6, 7), kernel=3, stride=2, pad=1, dil=(1, 2, 1)),
}


def _targets():
    yield "emulated", cpu_target("avx2", amx_bf16=True)
    yield "native", dataclasses.replace(cpu_target("avx512", amx_bf16=True), l1_bytes=host_cpu().l1_bytes)


OPS = [(name, op) for op in (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT) for name in CASES]


def _plans():
    for name, op in OPS:
        for layout in (Layout.CONTIGUOUS, Layout.CHANNELS_LAST):
            for bias in (True, False) if op is not Op.BWD_DATA else (False,):
                for which, target in _targets():
                    problem = _problem(**CASES[name], bias=bias, layout=layout, op=op)
                    yield (name, op, layout, bias, which), lower(problem, target, algorithm="amx")


@pytest.fixture(scope="module")
def kernels():
    """Every case's plan and kernel; the native kernels where this CPU has no AMX are built (their
    compile checked) but not loaded (None): their code may not run here."""
    keyed = list(_plans())
    runs = [(k, p) for k, p in keyed if k[-1] == "emulated" or host_amx()]
    built_only = [(k, p) for k, p in keyed if not (k[-1] == "emulated" or host_amx())]
    build_many([emit(p) for _, p in built_only])
    loaded = dict(zip([k for k, _ in runs], zip([p for _, p in runs], dispatch.load_plans([p for _, p in runs]))))
    return {**loaded, **{k: (p, None) for k, p in built_only}}


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def _reference(p: ConvProblem, x, w, b, gy):
    """ATen in float64 on the input padded explicitly (uneven padding too): the forward, or the data
    gradient cropped back to the input."""
    flat = [v for lo, hi in reversed(p.padding) for v in (lo, hi)]
    xd = torch.nn.functional.pad(x.double(), flat)
    zeros = [0] * len(p.padding)
    if p.op is Op.FWD:
        return torch.ops.aten.convolution(xd, w.double(), None if b is None else b.double(), list(p.stride), zeros,
                                          list(p.dilation), False, zeros, p.groups)
    if p.op is Op.BWD_WEIGHT:
        _, gw, gb = torch.ops.aten.convolution_backward(gy.double(), xd, w.double(), [p.k], list(p.stride), zeros,
                                                        list(p.dilation), False, zeros, p.groups,
                                                        [False, True, b is not None])
        return gw, gb
    gx, _, _ = torch.ops.aten.convolution_backward(gy.double(), xd, w.double(), None, list(p.stride), zeros,
                                                   list(p.dilation), False, zeros, p.groups, [True, False, False])
    for axis, (lo, _) in enumerate(p.padding):
        gx = gx.narrow(2 + axis, lo, x.shape[2 + axis])
    return gx


# (a data gradient has no bias; a transposed convolution's forward, a data gradient with one: the API test)
RUNS = [(name, op, bias) for name, op in OPS for bias in (True, False) if op is not Op.BWD_DATA or not bias]


@pytest.mark.parametrize("which", ["emulated", "native"])
@pytest.mark.parametrize("layout", [Layout.CONTIGUOUS, Layout.CHANNELS_LAST], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("name, op, bias", RUNS, ids=[f"{n}-{o.short}-{'bias' if b else 'no_bias'}" for n, o, b in RUNS])
def test_amx_matches_aten(kernels, name, op, layout, bias, which):
    plan, kernel = kernels[(name, op, layout, bias, which)]
    assert "_tile_dpbf16ps" in emit(plan).text if which == "native" else "emu_dp" in emit(plan).text
    if kernel is None:
        pytest.skip("this CPU has no AMX-BF16: the native kernel was built (its compile checked), not run; the "
                    "emulated one runs instead")
    p = plan.problem
    gen = torch.Generator().manual_seed(zlib.crc32(f"amx-{name}-{op.value}-{layout.value}-{bias}".encode()))
    x = torch.randn(p.input_shape, generator=gen, dtype=torch.float64).bfloat16()
    w = torch.randn(p.weight_shape, generator=gen, dtype=torch.float64).bfloat16()
    b = torch.randn(p.k, generator=gen, dtype=torch.float64).bfloat16() if bias else None
    gy = torch.randn(p.output_shape, generator=gen, dtype=torch.float64).bfloat16()
    if layout is Layout.CHANNELS_LAST:
        x, w, gy = _channels_last(x), _channels_last(w), _channels_last(gy)
    ref = _reference(p, x, w, b, gy)
    out = torch.full(ref[0].shape if op is Op.BWD_WEIGHT else ref.shape, float("nan"), dtype=torch.bfloat16)
    if layout is Layout.CHANNELS_LAST:
        out = _channels_last(out)
    if op is Op.FWD:
        kernel({"input": x, "weight": w, "bias": b, "output": out}, p.n, 2)
        terms = p.c // p.groups * math.prod(p.kernel)
    elif op is Op.BWD_DATA:
        kernel({"grad_output": gy, "weight": w, "grad_input": out}, p.n, 2)
        terms = p.k // p.groups * math.prod(p.kernel)
    else:
        ref, ref_b = ref
        out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16)
        if layout is Layout.CHANNELS_LAST:
            out = _channels_last(out)
        gb = torch.full((p.k,), float("nan"), dtype=torch.bfloat16)
        kernel({"grad_output": gy, "input": x, "grad_weight": out, "grad_bias": gb if bias else None}, p.n, 2)
        terms = p.n * math.prod(p.output_shape[2:])
        if bias:
            assert rel_err(gb, ref_b) <= tolerance(torch.bfloat16, terms), f"grad_bias rel err {rel_err(gb, ref_b):.2e}"
    assert not torch.isnan(out).any(), "results left unwritten"
    assert rel_err(out, ref) <= tolerance(torch.bfloat16, terms), f"rel err {rel_err(out, ref):.2e}"


# The weight gradient in several blocks of the reduction (blocks of 64 grid positions: each work item's
# sums carried from block to block), on the cases whose grids have a few hundred positions.
BLOCK_CASES = ("flat_3x3", "tails_3d", "strided_3d", "stride_over_kernel")


@pytest.fixture(scope="module")
def blocked_kernels():
    plans = {}
    for name in BLOCK_CASES:
        for which, target in _targets():
            plan = lower(_problem(**CASES[name], op=Op.BWD_WEIGHT, layout=Layout.CHANNELS_LAST), target,
                         algorithm="amx")
            plans[(name, which)] = dataclasses.replace(plan, tiling=dataclasses.replace(plan.tiling, pc=64))
    runs = {k: p for k, p in plans.items() if k[1] == "emulated" or host_amx()}
    return {k: (p, kernel) for (k, p), kernel in zip(runs.items(), dispatch.load_plans(list(runs.values())))}


@pytest.mark.parametrize("which", ["emulated", "native"])
@pytest.mark.parametrize("name", BLOCK_CASES)
def test_amx_weight_gradient_over_several_blocks(blocked_kernels, name, which):
    if (name, which) not in blocked_kernels:
        pytest.skip("this CPU has no AMX-BF16: the emulated kernel runs instead")
    plan, kernel = blocked_kernels[(name, which)]
    p = plan.problem
    gen = torch.Generator().manual_seed(zlib.crc32(f"amx-blocks-{name}".encode()))
    x = _channels_last(torch.randn(p.input_shape, generator=gen, dtype=torch.float64).bfloat16())
    w = _channels_last(torch.randn(p.weight_shape, generator=gen, dtype=torch.float64).bfloat16())
    gy = _channels_last(torch.randn(p.output_shape, generator=gen, dtype=torch.float64).bfloat16())
    ref, ref_b = _reference(p, x, w, torch.zeros(p.k), gy)
    gw = _channels_last(torch.full(ref.shape, float("nan"), dtype=torch.bfloat16))
    gb = torch.full((p.k,), float("nan"), dtype=torch.bfloat16)
    kernel({"grad_output": gy, "input": x, "grad_weight": gw, "grad_bias": gb}, p.n, 2)
    terms = p.n * math.prod(p.output_shape[2:])
    assert rel_err(gw, ref) <= tolerance(torch.bfloat16, terms), f"grad_weight rel err {rel_err(gw, ref):.2e}"
    assert rel_err(gb, ref_b) <= tolerance(torch.bfloat16, terms), f"grad_bias rel err {rel_err(gb, ref_b):.2e}"


@pytest.mark.parametrize("layout", [Layout.CONTIGUOUS, Layout.CHANNELS_LAST], ids=["nchw", "channels_last"])
def test_1x1_operands_read_in_place(layout):
    """The forward's input and the data gradient's grad_output are read in place (not copied) where the
    copy would be the operand itself: channels last, 1x1, unit strides, no padding, a group's channels
    whole tiles of 32. In place: the cases above whose last image's last tile reaches past the operand
    (35 and 42 pixels an image: rows from a zero-padded copy of that tile) and whose images end on a tile
    (32 pixels, groups of 32). Their results are test_amx_matches_aten's."""
    expected = {("pointwise", Op.BWD_DATA): "Y", ("pointwise_in_place", Op.FWD): "X",
                ("pointwise_groups_whole", Op.FWD): "X", ("pointwise_groups_whole", Op.BWD_DATA): "Y"}
    for name, op in OPS:
        if op is Op.BWD_WEIGHT:
            continue
        plan = lower(_problem(**CASES[name], layout=layout, op=op, bias=False), cpu_target("avx512", amx_bf16=True),
                     algorithm="amx")
        wanted = (expected[(name, op)],) if (name, op) in expected and layout is Layout.CHANNELS_LAST else ()
        assert plan.tiling.in_place == wanted, (name, op, plan.tiling.in_place)
        assert ("IN_PLACE = true;" in emit(plan).text) == bool(wanted)


def test_amx_where_it_is_chosen():
    amx = cpu_target("avx512", amx_bf16=True)
    choose = lambda target, **kw: lower(_problem(**{"n": 8, "size": (56, 56), "kernel": 3, **kw}), target).algorithm
    assert choose(amx, c=64, k=64) == "amx"
    assert choose(amx, c=256, k=64, kernel=1, pad=0) == "amx", "1x1 too"
    assert choose(amx, c=64, k=64, groups=64) != "amx", "depthwise: one channel per group"
    assert choose(amx, c=3, k=64, kernel=7, stride=2) != "amx", "three input channels would fill a tenth of a tile row"
    assert choose(cpu_target("avx512"), c=64, k=64) != "amx", "a target without AMX"
    dgrad = lambda **kw: lower(_problem(**{"n": 8, "size": (28, 28), "kernel": 3, "op": Op.BWD_DATA, **kw}), amx)
    assert dgrad(c=128, k=128).algorithm == "amx"
    assert dgrad(c=128, k=128, stride=2).algorithm == "amx", "per stride phase"
    f32 = dataclasses.replace(_problem(n=8, c=64, k=64, size=(56, 56), kernel=3), dtype=DType.F32)
    assert lower(f32, amx).algorithm != "amx", "bf16 only"
    assert "amx" in lower(_problem(n=1, c=3, k=8, size=(9, 9), kernel=3), amx).candidates, "a candidate for any size"


def test_amx_target_key_and_name():
    plain = cpu_target("avx512")
    assert dataclasses.replace(plain, amx_bf16=False).key() == plain.key()
    amx = cpu_target("avx512", amx_bf16=True)
    assert amx.key() != plain.key() and amx.name() == "cpu-avx512+amx"
    assert "-mamx-tile" in amx.march_flags and "-mamx-tile" not in cpu_target("avx2", amx_bf16=True).march_flags


def test_host_target_takes_amx_where_the_cpu_has_it(monkeypatch):
    monkeypatch.delenv("CONVGEN_AMX", raising=False)
    monkeypatch.delenv("CONVGEN_ISA", raising=False)
    assert host_cpu().amx_bf16 == (host_amx() and host_cpu().isa == "avx512")
    monkeypatch.setenv("CONVGEN_AMX", "0")
    assert not host_cpu().amx_bf16
    monkeypatch.setenv("CONVGEN_AMX", "maybe")
    with pytest.raises(convgen.ConvgenError, match="CONVGEN_AMX='maybe'"):
        host_cpu()


API_CASES = [
    # (input, weight, stride, padding, dilation, groups, channels last)
    ((2, 32, 12, 13), (48, 32, 3, 3), 1, 1, 1, 1, False),
    ((2, 64, 11, 10), (32, 32, 3, 3), 2, 1, 1, 2, True),
    ((1, 20, 5, 6, 7), (24, 20, 3, 3, 3), 1, 1, 2, 1, True),
    ((2, 32, 9, 10), (32, 24, 3, 3), 1, 1, 1, 1, False, True),   # transposed: its forward is a data gradient
    ((2, 32, 6, 7), (32, 16, 4, 4), 2, 1, 1, 1, True, True),     # ... with strides (its phases)
]


@pytest.mark.parametrize("case", API_CASES, ids=["nchw", "grouped_strided_cl", "dilated_3d_cl", "transposed",
                                                "transposed_strided_cl"])
def test_api_bf16_forward_and_backward(case):
    """The API end to end in bf16 (on this host's target: AMX where the CPU has it)."""
    xs, ws, stride, padding, dilation, groups, cl, *transposed = case
    transposed = bool(transposed and transposed[0])
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    x = torch.randn(xs, generator=gen, dtype=torch.float64).bfloat16()
    w = torch.randn(ws, generator=gen, dtype=torch.float64).bfloat16()
    out_channels = ws[1] * groups if transposed else ws[0]
    b = torch.randn(out_channels, generator=gen, dtype=torch.float64).bfloat16()
    if cl:
        x, w = _channels_last(x), _channels_last(w)
    args = ([stride] * (len(xs) - 2), [padding] * (len(xs) - 2), [dilation] * (len(xs) - 2), transposed,
            [0] * (len(xs) - 2), groups)
    y = convgen.convolution(x, w, b, *args)
    ref = torch.ops.aten.convolution(x.double(), w.double(), b.double(), *args)
    terms = max(ws[0], ws[1]) * math.prod(ws[2:])
    assert rel_err(y, ref) <= tolerance(torch.bfloat16, terms), f"forward rel err {rel_err(y, ref):.2e}"
    gy = torch.randn(ref.shape, generator=gen, dtype=torch.float64).bfloat16()
    got = convgen.convolution_backward(gy, x, w, [out_channels], *args, [True, True, True])
    want = torch.ops.aten.convolution_backward(gy.double(), x.double(), w.double(), [out_channels], *args,
                                               [True, True, True])
    over_pixels = xs[0] * math.prod(ref.shape[2:])
    for name, a, r, t in zip(("grad_input", "grad_weight", "grad_bias"), got, want,
                             (terms, over_pixels, over_pixels)):
        assert rel_err(a, r) <= tolerance(torch.bfloat16, t), f"{name} rel err {rel_err(a, r):.2e}"
