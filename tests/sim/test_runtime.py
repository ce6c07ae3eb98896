"""Generated GPU kernels run in the SIMT simulator through the normal runtime (CONVGEN_SIM).

With CONVGEN_SIM=cuda (sm_90, warp 32) or =hip (gfx90a, waves of 64), every convgen call on CPU
tensors builds the problem's CUDA or HIP kernels for the simulator and runs them there. These
tests take CASES.md cases (tests/support/cases.py's list and checks) through both vendors, for the
forward pass and every output_mask of the backward pass, against ATen in float64 with the
tolerances of tests/support/reference.py, and count the simulated launches each call makes (so a silent
CPU fallback cannot pass). The matrix crosses the CASES.md cases (every one,
ResNet-like and 3-D layers and the 4096-sample audio line included, at their CASES.md sizes), the
dtypes f32, f64 and one of bf16/f16 (the two take turns: their kernels differ in the matrix
instruction's type and the conversions alone) and the two layouts (contiguous NCHW and
channels-last input; 1-D has no channels-last format), each on one vendor, CUDA and HIP taking
turns (so each vendor runs f32 and f64 in each layout on half of the cases, bf16 and f16 on a
quarter), the thread and block orders forward, reversed and shuffled taking turns along it; plus the other operand variants (channels-last weight,
non-contiguous input or grad_output) spread over cases, dtypes and vendors. Both vendors on every
row took half an hour of a 2-core AMD EPYC (family 23), too much of CI's budget there; both 16-bit
dtypes on every row, 17 minutes of a 2-core Zen 4's test time. About 520
distinct kernel files per vendor, at about 0.6 s of CPU each to build for the simulator: the
largest part of this file's time. Then the public API's other doors (autograd through nn modules and convert(),
enabled(), the torch.library ops), a hypothesis property over random valid problems, and bad
values of CONVGEN_SIM.

Every kernel of the matrix builds up front in one ninja run per vendor.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import convgen
from convgen.codegen.errors import ConvgenError

from support import calls, cases
from support.builds import prebuild, problems_of_runs
from support.gpu_plans import call_launches
from support.reference import assert_close

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16}

ORDERS = ("forward", "reverse", "shuffle")
LAYOUTS = ("contiguous", "channels_last")


def _sixteen_bit(c: int, lay: int) -> str:
    """The 16-bit dtype case `c` runs in layout `lay`: bf16 and f16 take turns along the layouts and
    (in pairs, so that each meets both vendors) along the cases."""
    return ("bf16", "f16")[(c // 2 + lay) % 2]


def _cross_product():
    """(vendor, case id, dtype, layout, order) for every case and layout in f32, f64 and one 16-bit
    dtype, on one vendor each: CUDA and HIP take turns along the cases, dtypes and layouts, so each
    vendor runs f32 and f64 in every layout on half of the cases, and bf16 and f16 in each layout
    on a quarter; a case with both layouts runs both 16-bit dtypes."""
    rows = [(("cuda", "hip")[(c + d + lay) % 2], case.id, dtype, layout)
            for c, case in enumerate(cases.CASES) for d, dtype in enumerate(DTYPES)
            for lay, layout in enumerate(LAYOUTS) if layout in cases.variants_of(case)
            and (dtype in ("f32", "f64") or dtype == _sixteen_bit(c, lay))]
    return [(*row, ORDERS[i % len(ORDERS)]) for i, row in enumerate(rows)]


# The operand variants beyond the two layouts, spread over the axes:
# (vendor, CASES.md case, dtype, operand layout variant, thread/block order)
VARIANTS = [
    ("cuda", "19a-1d-stride2-padding2-dilation2", "f16", "noncontig_input", "forward"),
    ("cuda", "07-depthwise-multiplier2", "f32", "channels_last_weight", "reverse"),
    ("cuda", "21c-resnet-downsampling-3x3-stride2-batch2", "bf16", "noncontig_grad", "shuffle"),
    ("hip", "03-even-kernel-per-axis-dilation", "f32", "channels_last_weight", "shuffle"),
    ("hip", "13-stride-larger-than-kernel", "f64", "noncontig_grad", "forward"),
    ("hip", "12-dilation2-groups16", "f16", "noncontig_input", "reverse"),
]
MATRIX = _cross_product() + VARIANTS
def _params():
    for vendor, case_id, dtype, variant, order in MATRIX:
        yield pytest.param(vendor, cases.BY_ID[case_id], DTYPES[dtype], variant, order,
                           id=f"{vendor}-{case_id}-{dtype}-{variant}-{order}")


@pytest.fixture(scope="module")
def prebuilt():
    """Every kernel of the matrix, built in one ninja run per vendor."""
    for vendor in ("cuda", "hip"):
        prebuild(problems_of_runs((cases.BY_ID[case_id], DTYPES[dtype], variant)
                                  for v, case_id, dtype, variant, _ in MATRIX if v == vendor), sim=vendor)
    return convgen.stats()["builds"]


@pytest.mark.parametrize("vendor, case, dtype, variant, order", list(_params()))
def test_case_in_the_simulator(vendor, case, dtype, variant, order, prebuilt, monkeypatch):
    monkeypatch.setenv("CONVGEN_SIM", vendor)
    monkeypatch.setenv("CONVGEN_SIM_ORDER", order)
    monkeypatch.setenv("CONVGEN_SIM_SEED", "7")
    ops = cases.operands(case, dtype, variant)
    launches, algorithms = call_launches(ops, case, vendor, cases.MASKS)
    empty = 0 in (case.input[0], case.input[1])
    if not empty:   # no dtype falls back to direct
        assert "direct" not in algorithms and algorithms & {"igemm", "depthwise"}, algorithms
    before = convgen.stats()
    cases.check_case(case, dtype, ops)
    after = convgen.stats()
    assert after["sim_launches"] - before["sim_launches"] == (0 if empty else launches)
    assert after["builds"] == before["builds"], "the prebuild missed a kernel of this test"


@pytest.mark.parametrize("case_id, dtype, expected", [
    ("07-depthwise-multiplier2", "f64", {"depthwise"}),                      # every pass
    ("01-padding-as-large-as-kernel-allows", "f64", {"igemm", "stem"}),      # C=3: the weight gradient on stem
    ("20a-3d-3x1x9-groups3-stride1", "f16", {"depthwise"}),                 # 3 channels, 1 filter a group
    ("02-mixed-stride-padding-dilation4-groups2", "bf16", {"depthwise"}),   # 2 channels, 1 filter a group
    ("09-few-input-channels-per-group", "f32", {"igemm", "stem"}),          # 8 filters a group: the GEMM's
    ("16-transposed-output-padding", "bf16", {"igemm"}),                     # transposed: not stem, not depthwise
])
def test_the_matrix_reaches_each_gpu_algorithm(case_id, dtype, expected):
    case = cases.BY_ID[case_id]
    ops = cases.operands(case, DTYPES[dtype], "contiguous")
    for vendor in ("cuda", "hip"):
        assert call_launches(ops, case, vendor, cases.MASKS)[1] == expected


def test_prebuild_covered_the_matrix(prebuilt):
    assert convgen.stats()["builds"] == prebuilt


# ------------------------------------------------------------------------------- the other doors

CASE2 = cases.BY_ID["02-mixed-stride-padding-dilation4-groups2"]   # built above for cuda, f32, contiguous


def _case2_tensors(requires_grad: bool):
    ops = cases.operands(CASE2, torch.float32, "contiguous")
    return ops.x.requires_grad_(requires_grad), ops.w.requires_grad_(requires_grad), \
        ops.b.requires_grad_(requires_grad), ops.gy


def _grads64(x, w, b, gy):
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y = CASE2.aten().forward(*leaves)
    return y.detach(), torch.autograd.grad(y, leaves, gy.double())


def test_autograd_modules_enabled_and_library_ops(prebuilt, monkeypatch):
    """Module with convert(), enabled() around torch's own F.conv2d, and torch.ops.convgen: all
    served by the simulated cuda kernels (the launches are counted), all matching float64 ATen."""
    monkeypatch.setenv("CONVGEN_SIM", "cuda")
    x, w, b, gy = _case2_tensors(True)
    y64, (dx64, dw64, db64) = _grads64(x, w, b, gy)
    stride, padding, dilation, _, _, groups = CASE2.args()

    module = torch.nn.Conv2d(4, 2, 3, stride=stride, padding=padding, dilation=dilation, groups=groups)
    with torch.no_grad():
        module.weight.copy_(w)
        module.bias.copy_(b)
    convgen.convert(module)
    start = convgen.stats()["sim_launches"]
    xm = x.detach().clone().requires_grad_()
    y = module(xm)
    y.backward(gy)
    assert_close(y, y64, torch.float32, "convert(): forward")
    assert_close(xm.grad, dx64, torch.float32, "convert(): grad_input")
    assert_close(module.weight.grad, dw64, torch.float32, "convert(): grad_weight")
    assert_close(module.bias.grad, db64, torch.float32, "convert(): grad_bias")
    # forward; data gradient (igemm: one per stride phase); weight gradient on the stem kernel (2 channels
    # per group: partials, ordered sum) with the bias gradient fused into those two launches
    step = call_launches(cases.operands(CASE2, torch.float32, "contiguous"), CASE2, "cuda", [(True, True, True)])[0]
    assert step == 1 + 6 + 2   # 3 x 2 stride phases
    assert convgen.stats()["sim_launches"] - start == step

    start = convgen.stats()
    with convgen.enabled():
        y = F.conv2d(x, w, b, stride, padding, dilation, groups)
        grads = torch.autograd.grad(y, (x, w, b), gy)
    after = convgen.stats()
    assert after["aten_forward"] > start["aten_forward"] and after["aten_backward"] > start["aten_backward"]
    assert after["sim_launches"] - start["sim_launches"] == step
    assert_close(y, y64, torch.float32, "enabled(): forward")
    for g, r, name in zip(grads, (dx64, dw64, db64), ("grad_input", "grad_weight", "grad_bias")):
        assert_close(g, r, torch.float32, f"enabled(): {name}")

    start = convgen.stats()["sim_launches"]
    y = torch.ops.convgen.convolution(x.detach(), w.detach(), b.detach(), list(stride), list(padding),
                                      [dilation] * 2, False, [0, 0], groups)
    assert_close(y, y64, torch.float32, "torch.ops.convgen.convolution")
    assert convgen.stats()["sim_launches"] - start == 1


def test_sim_and_cpu_kernels_are_kept_apart(prebuilt, monkeypatch):
    """The same call with and without CONVGEN_SIM: the dispatch table and the call memo tell the
    simulated kernel from the CPU one (only the former launches in the simulator)."""
    x, w, b, _ = _case2_tensors(False)
    args = CASE2.args()
    monkeypatch.setenv("CONVGEN_SIM", "cuda")
    start = convgen.stats()["sim_launches"]
    y_sim = convgen.convolution(x, w, b, *args)
    assert convgen.stats()["sim_launches"] == start + 1
    monkeypatch.delenv("CONVGEN_SIM")
    y_cpu = convgen.convolution(x, w, b, *args)
    assert convgen.stats()["sim_launches"] == start + 1
    monkeypatch.setenv("CONVGEN_SIM", "cuda")
    convgen.convolution(x, w, b, *args)
    assert convgen.stats()["sim_launches"] == start + 2
    assert_close(y_sim, y_cpu.double(), torch.float32, "simulated against CPU")


@pytest.mark.parametrize("value", ["metal", "cpu", "1", "sycl-sm_90"])
def test_bad_convgen_sim_names_the_knob_value_and_choices(value, monkeypatch):
    monkeypatch.setenv("CONVGEN_SIM", value)
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    with pytest.raises(ConvgenError) as e:
        convgen.conv2d(x, w)
    message = str(e.value)
    assert "CONVGEN_SIM" in message and repr(value) in message and "cuda" in message and "hip" in message


def test_unsupported_arch_in_convgen_sim_is_named(monkeypatch):
    monkeypatch.setenv("CONVGEN_SIM", "cuda-sm_70")
    with pytest.raises(ValueError) as e:
        convgen.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3))
    assert "sm_70" in str(e.value) and "sm_80" in str(e.value)


# ------------------------------------------------------------------------------- property


GPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@settings(calls.SLOW, max_examples=8, derandomize=True, database=None)
@given(data=st.data())
def test_random_valid_problems_in_the_simulator(data):
    """Random valid small problems (tests/support/calls.py's strategy: every axis, every dtype,
    every layout, a random output_mask) in the simulator of a random vendor and order."""
    rank = data.draw(st.sampled_from([1, 2, 3]), label="rank")
    transposed = data.draw(st.booleans(), label="transposed")
    call = data.draw(calls.valid_calls(rank, transposed, GPU_DTYPES), label="call")
    assume(not calls.torch_refuses(call) and not calls.cases_md_refuses(call))
    vendor = data.draw(st.sampled_from(["cuda", "hip"]), label="vendor")
    order = data.draw(st.sampled_from(["forward", "reverse", "shuffle"]), label="order")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONVGEN_SIM", vendor)
        mp.setenv("CONVGEN_SIM_ORDER", order)
        start = convgen.stats()["sim_launches"]
        calls.check_against_torch(call, [(True, True, True), call.mask])
        empty = 0 in call.input_shape[:2] or call.out_channels == 0
        assert empty or convgen.stats()["sim_launches"] > start
