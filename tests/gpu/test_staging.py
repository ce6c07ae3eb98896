"""The layout pass's channels-last staging for the GPU implicit GEMM (codegen/gpu/staging.py): which
operands it converts and why, and what the emitted plan entry does with that decision. The staged
kernels' numbers against ATen are tests/gpu/test_igemm.py's (its nchw_staged cases and the NCHW
cases the rule stages) and tests/sim/test_runtime.py's (CASES.md through the plan entries)."""

from __future__ import annotations

import re

import pytest

from convgen.codegen.gpu.entry import emit_gpu, staged_kinds
from convgen.codegen.gpu.igemm import igemm_context, render_igemm
from convgen.codegen.gpu.normal import Normal
from convgen.codegen.gpu.padding import padded_channels
from convgen.codegen.gpu.staging import staging
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import parse_target

from support.problems import conv_problem

CL, NCHW = Layout.CHANNELS_LAST, Layout.CONTIGUOUS


def _layer(op=Op.FWD, c=256, k=256, size=(14, 14), kernel=(3, 3), stride=1, dtype=DType.BF16, groups=1,
           layouts=(NCHW, NCHW, NCHW), transposed=False, n=8) -> ConvProblem:
    """A layer without bias (bf16, 256 -> 256 channels at 14x14, 3x3, batch 8 unless said otherwise),
    padded by (kernel - 1) // 2 on both sides of each axis; validated."""
    return conv_problem(n, c, k, size, kernel, stride, tuple((r - 1) // 2 for r in kernel), groups=groups, op=op,
                        transposed=transposed, dtype=dtype, layout=layouts, bias=False).validate()


def _layout_reason(plan) -> str:
    return [reason for name, reason in plan.reasons if name == "layout"][-1]


@pytest.mark.parametrize("target", ["cuda-sm_80", "cuda-sm_90", "hip-gfx90a", "hip-gfx940"])
def test_a_3x3_nchw_forward_and_data_gradient_are_staged_with_their_costs_in_the_reason(target):
    fwd = lower(_layer(), parse_target(target))
    assert fwd.algorithm == "igemm" and staged_kinds(fwd) == ("W", "X")
    assert dict(fwd.layouts) == {"X": CL, "W": CL, "Y": NCHW} and len(fwd.conversions) == 2
    reason = _layout_reason(fwd)
    # every option with its figures, the chosen one first
    assert re.search(r"fastest option: an image's share of a batch of 32: X\+W staged [\d.]+ us \(conversion "
                     r"[\d.]+ us: 2 x \d+ B at [\d.]+ TB/s and 1 launch, over 32 images; GEMM [\d.]+ us", reason), reason
    assert "in the caller's layouts" in reason and "X staged" in reason and "W staged" in reason
    # the data gradient: grad_output channels-last and the weight with filters innermost (its own
    # layout: the plan keeps the caller's name for it and says so in the conversion)
    dgrad = lower(_layer(op=Op.BWD_DATA), parse_target(target))
    assert staged_kinds(dgrad) == ("W", "Y") and dict(dgrad.layouts) == {"X": NCHW, "W": NCHW, "Y": CL}
    assert any(c.startswith("W: contiguous -> filters innermost") for c in dgrad.conversions)


def test_the_bias_gradient_reads_the_caller_layout():
    plan = lower(_layer(op=Op.BWD_BIAS), parse_target("cuda-sm_90"))
    assert plan.conversions == () and staged_kinds(plan) == ()


@pytest.mark.parametrize("target", ["cuda-sm_80", "cuda-sm_90", "hip-gfx90a"])
def test_an_nchw_16_bit_weight_gradient_stages_both_activations_channels_last(target):
    """The weight gradient copies along channels (mn_major) only with both activations channels-last:
    NCHW input and grad_output are both staged, or neither; its reason gives both options' figures.
    (HIP too: its copies land transposed into K-major rows.)"""
    cuda = parse_target(target)
    plan = lower(_layer(op=Op.BWD_WEIGHT), cuda)
    assert staged_kinds(plan) == ("X", "Y") and dict(plan.layouts) == {"X": CL, "Y": CL, "W": NCHW}
    reason = _layout_reason(plan)
    assert re.search(r"X\+Y staged [\d.]+ us \(conversion [\d.]+ us: 2 x \d+ B at [\d.]+ TB/s and 1 launch", reason)
    assert "wgrad GEMM in the caller's layouts" in reason, reason
    context = igemm_context(plan.problem, cuda, "p", staged=staged_kinds(plan))
    assert dict(context.converts)["WGRAD"] == ("X", "Y") and dict(context.tiles)["WGRAD"].mn_major
    assert {"bwd_weight", "bwd_weight_bias"} <= set(context.staged_entries)
    # one activation channels-last already: only the other is converted
    assert staging(_layer(op=Op.BWD_WEIGHT, layouts=(CL, NCHW, NCHW)), cuda).kinds == ("Y",)
    # both channels-last: nothing to convert; the tile copies along channels as it is
    assert staging(_layer(op=Op.BWD_WEIGHT, layouts=(CL, CL, CL)), cuda).kinds == ()
    # 4-byte operands (f32 on tf32), or channels not whole 16-byte copies: the caller's layouts
    for problem in (_layer(op=Op.BWD_WEIGHT, dtype=DType.F32), _layer(op=Op.BWD_WEIGHT, c=12)):
        why = staging(problem, cuda)
        assert why.kinds == () and "16-bit operands" in why.reason, why


def test_the_staged_weight_gradient_entry_converts_after_its_partials():
    plan = lower(_layer(op=Op.BWD_WEIGHT), parse_target("cuda-sm_90"))
    source = emit_gpu(plan).text
    # one launch converts both, after the partials
    assert source.count("convert_pair(job(x, ") == 1 and "job(x, copies," in source and "job(dy, staged_dy," in source
    entry = source[source.index("_bwd_weight_workspace_bytes(long long batch)"):]
    assert "wgrad_staged_bytes(batch)" in entry and "+ 255) / 256 * 256" in entry
    assert "bias_from" in source   # the fused bias gradient sums the caller's grad_output, not the copy


def test_what_staging_cannot_help_is_not_staged_and_says_why():
    cuda = parse_target("cuda-sm_90")
    # 12 filters: grad_output not whole 16-byte copies of 8 bf16 (the data gradient pads nothing)
    ragged = staging(_layer(op=Op.BWD_DATA, k=12), cuda)
    assert ragged.kinds == () and "12 channels" in ragged.reason and "8 elements" in ragged.reason
    grouped = staging(_layer(c=48, k=48, groups=6, size=(56, 56)), cuda)   # 8 a group: whole copies
    assert grouped.kinds == ("X", "W")
    assert staging(_layer(c=48, k=48, groups=4, size=(56, 56)), cuda).kinds == ()   # 12 a group
    # a small problem: the launches' gaps cost more than its gathers
    small = staging(_layer(c=8, k=8, size=(8, 8)), cuda)
    assert small.kinds == () and "would not pay for itself" in small.reason and "launch" in small.reason
    already = staging(_layer(layouts=(CL, CL, NCHW)), cuda)
    assert already.kinds == () and "already channels-last" in already.reason
    # an input already channels-last with a contiguous weight: only the weight, so that B copies 16 bytes too
    assert staging(_layer(layouts=(CL, NCHW, NCHW)), cuda).kinds == ("W",)
    # grad_output already channels-last: the data gradient's NCHW weight is still gathered, so it alone is
    # staged (filters innermost); a channels-last one the kernel copies along its channels (16-bit on
    # CUDA), elsewhere (HIP) it is staged too
    assert staging(_layer(op=Op.BWD_DATA, layouts=(NCHW, NCHW, CL)), cuda).kinds == ("W",)
    along = staging(_layer(op=Op.BWD_DATA, layouts=(CL, CL, CL)), cuda)
    assert along.kinds == () and "copies the weight along its channels" in along.reason
    # (80 channels of a 3x3: one 96-wide tile of the staged weight, where tiles of reduction rows would take
    # 128 columns; a 1x1's copies along channels save the conversion)
    assert staging(_layer(op=Op.BWD_DATA, c=80, k=80, size=(28, 28), layouts=(CL, CL, CL), n=32), cuda).kinds == ("W",)
    assert staging(_layer(op=Op.BWD_DATA, c=80, k=80, kernel=(1, 1), layouts=(CL, CL, CL)), cuda).kinds == ()
    assert staging(_layer(op=Op.BWD_DATA, layouts=(CL, CL, CL)), parse_target("hip-gfx90a")).kinds == ("W",)
    assert staging(_layer(op=Op.BWD_DATA, layouts=(CL, CL, CL), dtype=DType.F32), cuda).kinds == ("W",)


def test_the_conversion_is_weighed_against_what_it_saves():
    cuda = parse_target("cuda-sm_90")
    # a 1x1 from 64 channels reads each input element once per 128 filters: the conversion costs
    # about what it saves, and the GEMM is bound by memory anyway
    pointwise = staging(_layer(c=64, k=256, size=(56, 56), kernel=(1, 1)), cuda)
    assert pointwise.kinds == () and "would not pay for itself" in pointwise.reason
    # gathers wait out a memory latency every k-step (outside the copies' pipeline): a 1x1 whose
    # images' 196 pixels are not whole 16-byte copies stages its activation whichever pass, the weight
    # gradient both (MobileNetV2's 96 -> 576 at 14x14, left gathered before the latency was weighed)
    for op, kinds in ((Op.FWD, ("X",)), (Op.BWD_DATA, ("Y",)), (Op.BWD_WEIGHT, ("X", "Y"))):
        expansion = staging(_layer(op=op, c=96, k=576, size=(14, 14), kernel=(1, 1), n=32), cuda)
        assert expansion.kinds == kinds and "exposed latency" in expansion.reason, (op, expansion.reason)
    # the same layer with nine taps reads every element nine times: staging wins
    assert staging(_layer(c=64, k=256, size=(56, 56), kernel=(3, 3)), cuda).kinds == ("X", "W")
    # the decision is the batch's: every cost and saving grows with it (the weight's charged in full)
    for n in (1, 2, 64, 512):
        assert staging(_layer(n=n), cuda).kinds == ("X", "W")
    # each subset is weighed (every option in the reason); the weight's conversion rides in the
    # activation's launch, so it costs its bytes alone: a 3-D 8 -> 16 forward (CASES.md 20c), whose small
    # weight's gathers were cheaper than a launch of its own, stages it beside its input; its data
    # gradient beside grad_output
    for op, both, alone in ((Op.FWD, ("X", "W"), "X staged"), (Op.BWD_DATA, ("Y", "W"), "Y staged")):
        three_d = staging(_layer(op=op, c=8, k=16, size=(6, 10, 10), kernel=(3, 3, 3), n=2), cuda)
        assert three_d.kinds == both and alone in three_d.reason and "W staged" in three_d.reason
        assert "caller's layouts" in three_d.reason


def test_a_transposed_forward_stages_its_input_as_the_normal_grad_output():
    plan = lower(_layer(transposed=True), parse_target("cuda-sm_90"))
    assert plan.kop.value == "dgrad" and staged_kinds(plan) == ("W", "Y")
    source = emit_gpu(plan).text
    assert re.search(r"int cgk_\w+_fwd\(const convgen_bf16\* input,[^)]*float\* workspace, long long batch", source)


def test_the_plan_entry_allocates_the_workspace_and_launches_the_conversions():
    plan = lower(_layer(), parse_target("cuda-sm_90"))
    source = emit_gpu(plan).text
    entry = source[source.index("The plan's scratch memory"):]
    assert "_fwd_workspace_bytes(batch)" in entry and "convgen_malloc_async" in entry and "convgen_free_async" in entry
    assert "_set_allocator(void* alloc, void* release)" in entry
    assert "__global__ void CONVGEN_LAUNCH_BOUNDS(THREADS, 1) to_channels_last" in source
    # one launch converts both
    assert source.count("convert_pair(job(x, ") == 1 and "job(x, workspace," in source and "job(weight, staged_w," in source
    # without staging the entry neither converts nor takes a workspace
    plain = render_igemm(_layer(), parse_target("cuda-sm_90"), "p", entries=("fwd",), staged=())
    assert "to_channels_last" not in plain and "p_fwd_workspace_bytes" not in plain


def test_staged_kinds_are_checked_and_only_their_entries_take_a_workspace():
    cuda = parse_target("cuda-sm_90")
    with pytest.raises(Exception, match=r"staged \['Z'\]"):
        igemm_context(_layer(), cuda, "p", staged=("Z",))
    context = igemm_context(_layer(), cuda, "p", staged=("X", "W", "Y"))
    assert context.staged_entries == ("fwd", "bwd_data", "bwd_weight", "bwd_weight_bias")
    assert dict(context.converts) == {"FWD": ("X", "W"), "DGRAD": ("Y", "W"), "WGRAD": ("X", "Y")}
    assert igemm_context(_layer(), cuda, "p", staged=("Y",)).staged_entries == ("bwd_data",)
    # a transposed problem's fwd entry is the normal data gradient (reads Y), its bwd_data the normal forward
    assert igemm_context(_layer(transposed=True), cuda, "p", staged=("Y",)).staged_entries == ("fwd",)
    # what is channels-last already is not converted again; the data gradient's weight copy always is
    cl = igemm_context(_layer(layouts=(CL, CL, CL)), cuda, "p", staged=("X", "W", "Y"))
    assert dict(cl.converts) == {"FWD": (), "DGRAD": ("W",), "WGRAD": ()} and cl.staged_entries == ("bwd_data",)
    # the weight gradient reads its activations' copies only with both staged (one alone does not make
    # its copies run along channels): its tiles are then mn_major, else the caller's
    assert dict(context.tiles)["WGRAD"].mn_major
    assert dict(igemm_context(_layer(), cuda, "p", staged=("X",)).converts)["WGRAD"] == ()
    assert not dict(igemm_context(_layer(), cuda, "p", staged=("X",)).tiles)["WGRAD"].mn_major


def test_the_cases_md_matrix_reaches_every_staging_path():
    """tests/sim/test_runtime.py runs every CASES.md case through the plan entries on both vendors: among
    them are forwards and data gradients that stage an activation, the weight or both, normal and
    transposed, so the conversions run there against ATen (this pins that they still do)."""
    import torch

    from convgen.api.ops import call_problems
    from support import cases

    seen = set()
    for case in cases.CASES:
        for layout in ("contiguous", "channels_last"):
            if layout not in cases.variants_of(case):
                continue
            ops = cases.operands(case, torch.bfloat16, layout)
            for p in call_problems(ops.x, ops.w, ops.b, *case.args(), output_mask=(True, True, True),
                                   grad_output=ops.gy):
                for vendor in ("cuda", "hip"):
                    plan = lower(p, parse_target(vendor))
                    if plan.staged:
                        seen.add((vendor, plan.kop.value, staged_kinds(plan), p.transposed))
    # (on CUDA a weight the kernel would gather is staged beside its activation, in the same launch; an
    # activation alone goes through the same launch with no second job, as HIP's weight alone with no first)
    for vendor in ("cuda", "hip"):
        assert {(vendor, "fwd", ("W", "X"), False), (vendor, "dgrad", ("W", "Y"), False)} <= seen, sorted(seen)
    assert ("cuda", "dgrad", ("W", "Y"), True) in seen
    assert {("hip", "fwd", ("W",), False), ("hip", "dgrad", ("W",), False), ("hip", "dgrad", ("W", "Y"), True)} <= seen


@pytest.mark.parametrize("layouts", [(NCHW, NCHW, NCHW), (CL, CL, CL)])
def test_a_forward_of_few_channels_stages_its_input_and_weight_padded_to_whole_copies(layouts):
    """An RGB stem (3 channels: no 16-byte copies in either layout) stages its input and weight with 8
    channels, 5 of them zeros (padding.padded_channels): the forward then copies both 16 bytes at a
    time, tap-major, its reduction 8 x 49 deep; one launch pads both (pad_job: the caller's strides in
    either layout), the workspace sized for the padded copies. Grouped problems are not padded."""
    cuda = parse_target("cuda-sm_90")
    stem = _layer(c=3, k=64, size=(224, 224), kernel=(7, 7), stride=2, layouts=layouts, n=32)
    decided = staging(stem, cuda)
    assert decided.kinds == ("X", "W") and "with 8 channels (5 of zeros)" in decided.reason
    plan = lower(stem, cuda)
    assert staged_kinds(plan) == ("W", "X") and len(plan.conversions) == 2
    assert all("with 8 channels (5 of zeros)" in c for c in plan.conversions)
    context = igemm_context(stem, cuda, "p", staged=("W", "X"))
    fwd = dict(context.tiles)["FWD"]
    assert context.fwd_channels == 8 and fwd.vector_a and fwd.vector_b and fwd.tap_major
    assert dict(context.converts)["FWD"] == ("X", "W") and dict(context.iterators)["FWD_A"]
    source = emit_gpu(plan).text
    # the caller's strides of a channel and a pixel (a tap): (1, 3) channels-last, (pixels, 1) NCHW
    x_strides, w_strides = ("1, 3", "1, 3") if layouts[0] is CL else ("50176, 1", "49, 1")
    assert f"pad_job(x, workspace, C, ID * IH * IW, batch, {x_strides}, FCG)" in source
    assert f"pad_job(weight, staged_w, CG, RV, K, {w_strides}, FCG)" in source
    assert "constexpr int FCG = 8;" in source and "FCG * G * ID * IH * IW" in source
    # f32 (tf32: 4 a copy) pads to 4; a grouped problem of 3 channels a group is not padded
    assert igemm_context(_layer(c=3, k=64, kernel=(7, 7), dtype=DType.F32), cuda, "p",
                         staged=("W", "X")).fwd_channels == 4
    assert staging(_layer(c=6, k=64, groups=2, size=(56, 56)), cuda).kinds == ()
    # an image whose padded copy would pass 2^31 elements (the kernel's 32-bit indexing) is not padded
    huge = Normal.of(_layer(c=3, k=8, size=(16384, 16384), n=1))
    assert padded_channels(huge, ("W", "X"), 2) == 3 and padded_channels(huge, ("W", "X"), 4) == 4
