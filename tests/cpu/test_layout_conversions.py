"""The CPU layout pass's conversions (codegen/passes/layout.py, codegen/cpu/layout_cost.py,
templates/cpu/convert_layouts.j2).

A plan whose activations are read in another layout than the caller's gets an entry that converts
them in its scratch and the result back: run with the caller's tensors (NCHW or channels last), every
kernel op, several families, dtypes, groups, strides, uneven padding, 3-D and transposed problems,
against ATen in float64, the internal layout forced (`lower(..., layout=)`). Then the cost model's
choices: a conversion where the caller's layout leaves most lanes idle and converting measured
faster, none for the layers of the layout issue (where every conversion measured slower), a
requested algorithm that only another layout has, and `convgen explain`'s options.
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

from convgen.codegen.cpu import layout_cost
from convgen.codegen.errors import ConvgenError
from convgen.codegen.ir import DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import cpu_target, host_cpu
from convgen.dispatch.problem import TORCH_DTYPES, memory_format

from support.builds import kernels_by_key, load_keyed
from support.commands import run_cli
from support.problems import conv_problem
from support.reference import check_forward_or_data_gradient, check_weight_gradient, rel_err, tolerance

NCHW, CL = Layout.CONTIGUOUS, Layout.CHANNELS_LAST
OTHER = {NCHW: CL, CL: NCHW}
CASES = {
    "rgb_s2_depthwise": dict(n=2, c=3, k=3, size=(9, 10), kernel=3, pad=1, stride=2, groups=3),
    "general": dict(n=2, c=20, k=24, size=(7, 9), kernel=3, pad=1),
    "grouped_3d": dict(n=2, c=6, k=8, size=(3, 5, 6), kernel=(3, 1, 3), pad=1, groups=2),
    "narrow_rows_bf16": dict(n=2, c=4, k=32, size=(12, 1), kernel=(3, 5), stride=(1, 2), pad=(1, 2), groups=4,
                             dtype=DType.BF16),
    "uneven_pad_f64": dict(n=1, c=5, k=7, size=(6, 8), kernel=(2, 3), pad=((0, 1), (1, 2)), dtype=DType.F64),
    "pointwise": dict(n=2, c=16, k=32, size=(5, 6), kernel=1, pad=0),
    "small_groups": dict(n=2, c=32, k=32, size=(6, 7), kernel=3, pad=1, groups=4),
    # planes 4 KiB apart (relayout's buffered tiles: two of 64 pixels a row, a partial block of channels)
    "aliased_planes_bf16": dict(n=1, c=20, k=24, size=(16, 128), kernel=3, pad=1, dtype=DType.BF16),
    "aliased_planes_f32": dict(n=1, c=20, k=8, size=(8, 128), kernel=(1, 3), pad=(0, 1)),
}
OPS = (Op.FWD, Op.BWD_DATA, Op.BWD_WEIGHT)


def _keys():
    return [(name, layout, op) for name, spec in CASES.items() for layout in (NCHW, CL) for op in OPS
            if op is not Op.BWD_DATA or spec.get("stride", 1) == 1]


def _plan(name, layout, op):
    return lower(conv_problem(**CASES[name], op=op, layout=layout), host_cpu(), layout=OTHER[layout])


@pytest.fixture(scope="module")
def kernels():
    return kernels_by_key(_keys(), _plan)


@pytest.mark.parametrize("key", _keys(), ids=lambda k: f"{k[0]}-{'nchw' if k[1] is NCHW else 'cl'}-{k[2].value}")
def test_converted_kernel_matches_aten(kernels, key):
    name, layout, op = key
    plan, kernel = kernels[key]
    assert plan.conversions and plan.name().endswith(f"_via_{OTHER[layout].value}"), plan.conversions
    assert dict(plan.layouts)["X"] is OTHER[layout] and dict(plan.layouts)["W"] is layout
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}{layout}{op}".encode()))
    check = check_weight_gradient if op is Op.BWD_WEIGHT else check_forward_or_data_gradient
    check(kernel, plan.problem, gen)


@pytest.mark.parametrize("layout", [NCHW, CL], ids=["nchw", "cl"])
def test_converted_transposed_forward_matches_aten(layout):
    """A transposed convolution's forward (a data-gradient kernel, input and output swapped) converted."""
    problem = conv_problem(2, 6, 10, (5, 7), (3, 3), stride=2, pad=1, groups=2, op=Op.FWD, transposed=True,
                           output_padding=1, layout=layout)
    plan = lower(problem, host_cpu(), layout=OTHER[layout])
    assert plan.conversions
    (_, kernel), = load_keyed([(0, plan)]).values()
    gen = torch.Generator().manual_seed(7)
    fmt = memory_format(layout, 4)
    x = torch.randn(problem.input_shape, generator=gen, dtype=torch.float64).float().contiguous(memory_format=fmt)
    w = torch.randn(problem.weight_shape, generator=gen, dtype=torch.float64).float().contiguous(memory_format=fmt)
    b = torch.randn(problem.k, generator=gen, dtype=torch.float64).float()
    out = torch.full(problem.output_shape, float("nan")).contiguous(memory_format=fmt)
    kernel({"input": x, "weight": w, "bias": b, "output": out}, problem.n, 2)
    ref = torch.ops.aten.convolution(x.double(), w.double(), b.double(), [2, 2], [1, 1], [1, 1], True, [1, 1], 2)
    assert out.is_contiguous(memory_format=fmt)
    assert rel_err(out, ref) <= tolerance(torch.float32, 6 // 2 * 9), rel_err(out, ref)


def test_requested_algorithm_of_another_layout_converts():
    """grouplanes reads channels last only: requested for an NCHW caller (as the tuner or an AOT bundle
    names a converting plan's kernel) the plan converts; an algorithm of no layout is refused."""
    problem = conv_problem(2, 32, 32, (6, 7), 3, pad=1, groups=32, op=Op.FWD, layout=NCHW)
    plan = lower(problem, host_cpu(), algorithm="grouplanes")
    assert plan.algorithm == "grouplanes" and dict(plan.layouts)["X"] is CL and plan.conversions
    (_, kernel), = load_keyed([(0, plan)]).values()
    check_forward_or_data_gradient(kernel, problem, torch.Generator().manual_seed(3))
    with pytest.raises(ConvgenError, match="'pointwise' is not a candidate"):
        lower(problem, host_cpu(), algorithm="pointwise")


AVX512 = cpu_target("avx512", 48 * 1024, 2 << 20)
AVX2 = cpu_target("avx2", 32 * 1024, 512 * 1024)


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_model_converts_where_the_callers_layout_idles_the_lanes(target):
    """Rows of one output pixel in NCHW leave all but one lane of blocked's vectors idle; lanes over the
    channels in channels last fills them (measured on the Xeon, kernel alone, f32: blocked 0.205 ms, lanes
    with both conversions 0.103 ms). A requested algorithm keeps the caller's layout where it has it."""
    problem = conv_problem(16, 4, 128, (56, 1), (3, 5), stride=(1, 2), pad=(1, 2), groups=4, op=Op.FWD)
    plan = lower(problem, target)
    keep, converted = plan.layout_options
    assert dict(plan.layouts)["X"] is CL and plan.algorithm == "lanes", plan.reasons
    assert converted.total_s <= layout_cost.CONVERT_GAIN * keep.total_s and converted.converted == ("X", "Y")
    assert not lower(problem, target, algorithm="blocked").conversions


AMX = cpu_target("avx512", 48 * 1024, 2 << 20, bf16_dot=True, amx_bf16=True)


def test_model_converts_the_amx_data_gradient_strided_along_w():
    """The amx data gradient writes each stride phase's tiles into a planar grad_input an element a store
    where the stride along W is above 1; converted to channels last and back it measured 1.2-1.9x faster
    (BENCHMARKS.md, 2026-12-05 (second session): r50 3x3 128 stride 2 5.08 -> 2.73 ms, kernel alone, 8
    images). At unit stride (its tiles' pixels adjacent) the caller's layout stays."""
    for stride, converts in ((2, ("X", "Y")), (1, ())):
        problem = conv_problem(8, 128, 128, (56, 56), 3, stride=stride, pad=1, op=Op.BWD_DATA, dtype=DType.BF16)
        plan = lower(problem, AMX)
        assert plan.algorithm == "amx" and tuple(k for k in ("X", "Y") if dict(plan.layouts)[k] is CL) == converts, \
            [o.describe() for o in plan.layout_options]


ISSUE_LAYERS = [
    dict(n=1, c=3, k=3, size=(1024, 1024), kernel=(1, 9), pad=(0, 4), groups=3),        # RGB filter
    dict(n=8, c=3, k=96, size=(224, 224), kernel=4, stride=4, pad=0),                    # ConvNeXt stem
    dict(n=8, c=240, k=240, size=(28, 28), kernel=1, pad=0, groups=3),                   # ShuffleNet
    dict(n=4, c=64, k=64, size=(8, 56, 56), kernel=(3, 1, 1), pad=(1, 0, 0)),             # R(2+1)D
    dict(n=8, c=24, k=144, size=(56, 56), kernel=1, pad=0),                              # EfficientNet
    dict(n=8, c=96, k=96, size=(56, 56), kernel=7, pad=3, groups=96),                    # ConvNeXt depthwise
    dict(n=8, c=3, k=3, size=(224, 224), kernel=3, stride=2, pad=1, groups=3),           # RGB s2 depthwise
]


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_model_keeps_the_callers_layout_on_the_issues_layers(target):
    """Every conversion of these layers measured slower than the kernel in the caller's layout (BENCHMARKS.md,
    2026-12-03): the whole-tensor copies cost more than the packing the kernels do tile by tile."""
    for spec in ISSUE_LAYERS:
        for layout in (NCHW, CL):
            for op in OPS:
                plan = lower(conv_problem(**spec, op=op, layout=layout), target)
                assert not plan.conversions, (spec, layout, op, [o.describe() for o in plan.layout_options])
                assert len(plan.layout_options) == 2 and plan.layout_options[0].layouts == plan.layouts


def test_one_dimensional_and_bias_plans_have_no_options():
    plan = lower(conv_problem(2, 8, 8, 20, 3, op=Op.FWD), host_cpu())
    assert not plan.conversions and not plan.layout_options
    plan = lower(conv_problem(2, 8, 8, (5, 5), 3, op=Op.BWD_WEIGHT, layout=CL), host_cpu(), layout=CL)
    assert not plan.conversions and "requested channels_last" in dict(plan.reasons)["layout"]


def test_explain_prints_the_layout_options():
    code, out, _ = run_cli("explain", "--input", "2,4,56,1", "--weight", "128,1,3,5", "--groups", "4",
                           "--stride", "1,2", "--padding", "1,2")
    assert code == 0
    lines = out.splitlines()
    at = lines.index(next(line for line in lines if line.strip().startswith("layout options")))
    taken = [line for line in lines[at + 1:at + 3] if line.strip().startswith("*")]
    assert len(taken) == 1 and "X=channels_last" in taken[0] and "convert X/Y" in taken[0], lines[at:at + 3]
    assert any(line.strip().startswith("conversions: X: contiguous -> channels_last") for line in lines)


@pytest.mark.parametrize("channels,size,kernel,taken", [(8, (7, 7), 3, "lanes"), (8, (7, 5), (5, 7), "lanes"),
                                                        (8, (28, 28), 3, "grouplanes"), (4, (14, 14), 3, "grouplanes"),
                                                        (4, (14, 14), 7, "lanes"), (1, (7, 7), 7, "grouplanes")])
def test_small_group_weight_gradients_leave_grouplanes_for_many_taps_or_few_pixels(channels, size, kernel, taken):
    """grouplanes.SMALL_WGRAD_PIXELS / SMALL_WGRAD_TAPS, on the Xeon's figures (grouplanes 6-22x slower
    than lanes at 7x7 pixels or 5x7 taps for 8-channel groups; depthwise always faster)."""
    groups = 256 // channels
    problem = conv_problem(8, 256, 256, size, kernel, pad=1, groups=groups, op=Op.BWD_WEIGHT, layout=CL)
    assert lower(problem, AVX512).algorithm == taken


@pytest.mark.parametrize("target", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_pruned_options_change_no_choice(target):
    """A layout whose conversions alone exceed CONVERT_GAIN of the caller's estimate is not weighed
    (layout_cost.options' prune): weighing every option takes the same layout, and the pruned one is said."""
    from convgen.codegen.passes.algorithm import choose_for
    narrow = dict(n=16, c=4, k=128, size=(56, 1), kernel=(3, 5), stride=(1, 2), pad=(1, 2), groups=4)
    pruned_seen = 0
    for spec in ISSUE_LAYERS + [narrow]:
        for layout in (NCHW, CL):
            for op in OPS:
                plan = lower(conv_problem(**spec, op=op, layout=layout), target)
                keep = plan.layout_options[0]   # the plan as the layout pass met it: the caller's layouts
                before = dataclasses.replace(plan, layouts=(), algorithm=keep.algorithm, candidates=keep.candidates)
                full = layout_cost.options(before, choose_for, prune=False)
                assert layout_cost.cheapest(full).layouts == plan.layouts
                for option in plan.layout_options[1:]:
                    if not option.algorithm:
                        pruned_seen += 1
                        assert option.convert_s > layout_cost.CONVERT_GAIN * plan.layout_options[0].total_s
                        assert "its kernel not weighed" in option.describe()
    assert pruned_seen > 0


def test_model_rates_bf16_pairs_above_widened_bf16():
    """The kernels that reduce bf16 in pairs on vdpbf16ps (lanes here) are estimated PAIRS_SPEEDUP times
    as fast as the same multiply-adds widened to f32 FMAs (pointwise), and without vdpbf16ps at f32's rate."""
    problem = conv_problem(8, 64, 256, (56, 56), 3, pad=1, dtype=DType.BF16, layout=CL)
    for target, speedup in ((cpu_target("avx512", bf16_dot=True), layout_cost.PAIRS_SPEEDUP),
                            (cpu_target("avx512"), 1.0)):
        plan = lower(problem, target)
        lanes, pointwise = (layout_cost.kernel_seconds(plan, a) for a in ("lanes", "pointwise"))
        assert lanes * speedup == pytest.approx(pointwise), target
