"""The depthwise kernels (codegen/gpu/depthwise.py, templates/gpu/depthwise.cu.j2) and the
few-channel (stem) weight gradient (codegen/gpu/stem.py, templates/gpu/stem_wgrad.cu.j2).

- Rendered kernels run in the simulator at warp 32 (cuda.h) and 64 (hip.h) against ATen in
  float64 on fresh random data, every output poisoned with NaN first, with the tolerances of
  tests/support/reference.py: forward, data, weight and bias gradients of depthwise problems; weight and
  bias gradients of few-channel ones. f32, f64, bf16, f16; contiguous and channels-last.
- Both weight gradients are bitwise the same under forward, reversed and shuffled thread and
  block orders (workspace included), and are the in-order sum of their partials, rounded once.
- Every rendered variant, and full-size MobileNetV2, EfficientNet and ResNet-50 stem layers, builds
  with nvcc for sm_80 and sm_90 with spills as errors (no stack frame either), and with hipcc for
  gfx90a without scratch.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import random
import re
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

from convgen.devices import sim
from convgen.building import sim_build
from convgen.codegen.errors import ConvSpecError
from convgen.codegen.gpu.depthwise import depthwise_context, render_depthwise
from convgen.codegen.gpu.stem import render_stem, stem_context
from convgen.codegen.ir import DType, Layout
from convgen.codegen.target import parse_target

from support.gpu_plans import bias_partials, bias_partials_at
from support.problems import case_problem
from support.reference import assert_close, generator_for, in_layout, randn, reduction_terms
from support.toolchain import require_fp16, run_sanitized, sim_libraries

# One worker runs this module, whole (pyproject.toml: --dist loadgroup): its `libs` fixture builds one
# simulator library per vendor of every case of the depthwise kernels (a single file of tens of thousands
# of lines, 20-50 s of CPU each); split across workers, each worker built them all again.
pytestmark = pytest.mark.xdist_group("gpu_depthwise")


# (name, input N,C,*spatial, K, kernel, stride, padding (low, high) per axis, dilation, groups)
DEPTHWISE = [
    ("c6", (2, 4, 6, 6), 4, (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 4),              # CASES 6: depthwise
    ("c7", (2, 4, 6, 6), 8, (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 4),              # CASES 7: channel multiplier 2
    ("c11", (1, 16, 9, 9), 16, (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 16),          # CASES 11: pointwise depthwise (smaller)
    ("mb_s1", (2, 8, 10, 10), 8, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 8),         # MobileNet 3x3 stride 1
    ("mb_s2", (2, 8, 11, 11), 8, (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 8),         # MobileNet 3x3 stride 2
    ("d2", (1, 6, 13, 12), 6, (5, 5), (1, 1), ((4, 4), (4, 4)), (2, 2), 6),            # 5x5 dilation 2
    ("asym", (2, 5, 7, 9), 5, (2, 3), (1, 1), ((0, 1), (2, 0)), (1, 1), 5),            # asymmetric padding, even kernel
    ("s3", (1, 3, 11, 10), 3, (2, 2), (3, 3), ((0, 0), (1, 0)), (1, 1), 3),            # stride > kernel: taps-free phases
    ("s2d2", (2, 4, 9, 9), 4, (3, 3), (2, 2), ((2, 2), (2, 2)), (2, 2), 4),            # gcd(stride, dilation) 2
    ("c1d", (2, 6, 40), 6, (5,), (2,), ((2, 2),), (2,), 6),                            # 1-D, stride and dilation 2
    ("c3d", (2, 3, 5, 6, 7), 3, (3, 3, 3), (1, 2, 2), ((1, 1),) * 3, (1, 1, 1), 3),    # 3-D
    ("tiles", (1, 2, 20, 70), 2, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 2),         # several tiles per image
    ("split", (4, 4, 20, 20), 4, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 4),         # weight gradient split several ways
    ("wide_cl", (2, 40, 5, 6), 40, (3, 3), (2, 1), ((1, 1), (1, 1)), (1, 1), 40),      # channels-last: two channel tiles
    ("lonely", (1, 2, 1, 4), 2, (1, 3), (2, 1), ((1, 1), (1, 1)), (1, 1), 2),          # no tap reaches any input row: dx all zeros
    ("empty", (0, 6, 7, 8), 6, (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 6),           # CASES 15: empty batch
    ("g4", (2, 16, 7, 8), 16, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 4),             # grouped: 4 channels, 4 filters a group
    ("g_uneven", (2, 6, 9, 7), 8, (3, 2), (2, 1), ((1, 0), (1, 1)), (1, 2), 2),         # 3 channels, 4 filters a group
    ("g_split", (2, 24, 6, 7), 36, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 12),       # 2 / 3 a group: CT 32 cuts group 10
]
# few input channels per group: the weight gradient only
STEM = [
    ("resnet", (1, 3, 24, 24), 64, (7, 7), (2, 2), ((3, 3), (3, 3)), (1, 1), 1),       # ResNet's stem, small image
    ("c1", (1, 3, 4, 4), 3, (3, 3), (2, 2), ((2, 2), (2, 2)), (1, 1), 1),              # CASES 1: padding as large as allowed
    ("c9", (2, 4, 6, 6), 16, (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 2),             # CASES 9: few channels per group
    ("c12", (2, 16, 11, 13), 32, (3, 3), (1, 1), ((0, 0), (0, 0)), (2, 2), 16),        # CASES 12: one channel per group, dilation
    ("mixed", (2, 4, 9, 8), 6, (3, 2), (2, 1), ((1, 0), (0, 2)), (2, 1), 1),           # 4 channels, asymmetric padding
    ("s1d", (2, 2, 30), 5, (7,), (3,), ((2, 4),), (1,), 1),                            # 1-D
    ("s3d", (2, 1, 5, 6, 7), 4, (3, 3, 3), (2, 2, 2), ((1, 1),) * 3, (1, 1, 1), 1),    # 3-D
    ("split", (2, 3, 40, 40), 8, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),         # several splits with work
    ("empty", (0, 3, 7, 8), 12, (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 3),          # CASES 15: empty batch
]
# full-size layers: compiled only (their default tiles must not spill), never simulated
FULL_SIZE = [
    ("depthwise", ("mbv2_s2", (32, 96, 112, 112), 96, (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 96)),   # MobileNetV2
    ("depthwise", ("effnet_5x5", (32, 240, 28, 28), 240, (5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1), 240)),  # EfficientNet
    ("depthwise", ("resnext", (32, 128, 56, 56), 128, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 32)),     # ResNeXt 32x4d
    ("depthwise", ("convnext", (32, 96, 56, 56), 96, (7, 7), (1, 1), ((3, 3), (3, 3)), (1, 1), 96)),      # ConvNeXt 7x7
    ("stem", ("resnet224", (32, 3, 224, 224), 64, (7, 7), (2, 2), ((3, 3), (3, 3)), (1, 1), 1)),         # ResNet-50's stem
]
CASES = ({("depthwise", c[0]): c for c in DEPTHWISE} | {("stem", c[0]): c for c in STEM}
         | {(kind, c[0]): c for kind, c in FULL_SIZE})
COMPILED_ONLY = [("depthwise", "mbv2_s2", "bf16", "nchw"), ("depthwise", "mbv2_s2", "f32", "cl"),
                 ("depthwise", "effnet_5x5", "f16", "cl"), ("depthwise", "effnet_5x5", "f64", "nchw"),
                 ("depthwise", "resnext", "bf16", "cl"), ("depthwise", "resnext", "f32", "nchw"),
                 ("depthwise", "convnext", "bf16", "cl"),   # 49 taps unrolled a phase: the sums kept in registers
                 ("stem", "resnet224", "f32", "nchw"), ("stem", "resnet224", "bf16", "cl"),
                 ("stem", "resnet224", "f64", "nchw")]
DTYPES = {"f32": (DType.F32, torch.float32), "f64": (DType.F64, torch.float64),
          "bf16": (DType.BF16, torch.bfloat16), "f16": (DType.F16, torch.float16)}
LAYOUTS = ("nchw", "cl", "x_cl")   # support/problems.py's GPU_LAYOUTS that these kernels take
# every case in f32, NCHW; the others where they say something new
EXTRA = {
    "depthwise": [("c7", "f64", "nchw"), ("mb_s2", "bf16", "nchw"), ("d2", "f16", "nchw"), ("c3d", "bf16", "nchw"),
                  ("c1d", "f16", "nchw"), ("s2d2", "f64", "nchw"), ("asym", "bf16", "nchw"), ("empty", "bf16", "nchw"),
                  ("c11", "f32", "cl"), ("mb_s2", "f32", "cl"), ("c7", "bf16", "cl"), ("c3d", "f16", "cl"),
                  ("wide_cl", "f32", "cl"), ("wide_cl", "f64", "x_cl"), ("s3", "f32", "x_cl"),
                  ("g4", "bf16", "cl"), ("g4", "f16", "x_cl"), ("g_uneven", "f64", "x_cl"), ("g_split", "f32", "cl"),
                  ("g_split", "bf16", "nchw")],
    "stem": [("resnet", "bf16", "nchw"), ("resnet", "f32", "cl"), ("c9", "f64", "nchw"), ("mixed", "f16", "cl"),
             ("s3d", "bf16", "cl"), ("s1d", "f64", "nchw"), ("c12", "f16", "x_cl"), ("empty", "f16", "nchw")],
}
PARAMS = [(kind, c[0], "f32", "nchw") for kind, cases in (("depthwise", DEPTHWISE), ("stem", STEM)) for c in cases]
PARAMS += [(kind, *rest) for kind, extra in EXTRA.items() for rest in extra]


def _random_params(count: int, seed: int, grouped: bool = False) -> list[tuple]:
    """Small valid problems of both kinds drawn over every axis (rank, channels, multiplier or
    groups, kernel, stride, dilation, asymmetric padding, batch 1-3, dtype, layouts), the same on
    every run; they join CASES. grouped: depthwise-kernel problems of 1-4 channels and filters a group."""
    rng, params = random.Random(seed), []
    while len(params) < count:
        kind, rank = ("depthwise", "stem")[len(params) % 2] if not grouped else "depthwise", rng.randint(1, 3)
        if grouped:
            groups = rng.randint(2, 6)
            c, k = groups * rng.randint(1, 4), groups * rng.randint(1, 4)
        elif kind == "depthwise":
            c = groups = rng.randint(1, 40)
            k = c * rng.choice([1, 1, 2, 3])
        else:
            groups = rng.randint(1, 3)
            c, k = groups * rng.randint(1, 4), groups * rng.randint(1, 40)
        case = (f"{'grand' if grouped else 'rand'}{len(params)}", (rng.randint(1, 3), c, *(rng.randint(1, 12 if rank < 3 else 6) for _ in range(rank))),
                k, tuple(rng.randint(1, 5) for _ in range(rank)), tuple(rng.randint(1, 4) for _ in range(rank)),
                tuple((rng.randint(0, 3), rng.randint(0, 3)) for _ in range(rank)),
                tuple(rng.randint(1, 3) for _ in range(rank)), groups)
        dtype, layout = rng.choice(list(DTYPES)), rng.choice(list(LAYOUTS)) if rank > 1 else "nchw"
        try:
            case_problem(case, DTYPES[dtype][0], layout)
        except ConvSpecError:
            continue   # the kernel does not fit the padded input: draw again
        CASES[kind, case[0]] = case
        params.append((kind, case[0], dtype, layout))
    return params
# the edges for the sanitizers: taps-free phases with mixed layouts, two channel tiles in
# channels-last, a stem with asymmetric padding and dilation in channels-last
SANITIZED = [("depthwise", "s3", "f32", "x_cl"), ("depthwise", "wide_cl", "f32", "cl"), ("stem", "mixed", "f16", "cl")]
RENDER = {"depthwise": render_depthwise, "stem": render_stem}
ORDERS = ("forward", "reverse", "shuffle")


PARAMS += _random_params(8, seed=17) + _random_params(4, seed=23, grouped=True)


def _prefix(vendor: str, kind: str, name: str, dtype: str, layout: str) -> str:
    return f"{vendor}_{kind}_{name}_{dtype}_{layout}"


def _source(vendor: str, arch: str | None = None, params=None) -> str:
    target = parse_target(f"{vendor}-{arch}" if arch else vendor)
    return "".join(RENDER[kind](case_problem(CASES[kind, n], DTYPES[d][0], lay), target, _prefix(vendor, kind, n, d, lay))
                   for kind, n, d, lay in (params or PARAMS))


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    return sim_libraries(tmp_path_factory, "gpu_depthwise", _source, lambda vendor: "depthwise")


# ----------------------------------------------------------------------- the kernels' decisions


def test_what_the_kernels_do_not_take_is_refused_by_name():
    cuda = parse_target("cuda-sm_80")
    depthwise = case_problem(CASES["depthwise", "c6"], DType.F32)
    for change, word in [({"groups": 1}, "groups=1"), ({"k": 6}, "filters=6"),
                         ({"c": 16, "k": 16, "groups": 2, "in_size": (6, 6)}, "at most 4 channels"),
                         ({"c": 4, "k": 10, "groups": 2, "in_size": (6, 6)}, "and 4 filters"),
                         ({"c": 8, "k": 8, "groups": 2, "kernel": (9, 9), "in_size": (10, 10)}, "sums a thread"),
                         ({"transposed": True, "output_padding": (0, 0)}, "transposed"),
                         ({"kernel": (17, 17), "in_size": (20, 20)}, "at most 256 taps"),
                         ({"in_size": (1 << 15, 1 << 15)}, "an input image has 4294967296 elements")]:
        with pytest.raises(ConvSpecError, match=word):
            depthwise_context(dataclasses.replace(depthwise, **change), cuda, "p")
    stem = case_problem(CASES["stem", "resnet"], DType.F32)
    for change, word in [({"c": 8, "in_size": (24, 24)}, "1 to 4 input channels per group"),
                         ({"transposed": True, "output_padding": (0, 0)}, "transposed")]:
        with pytest.raises(ConvSpecError, match=word):
            stem_context(dataclasses.replace(stem, **change), cuda, "p")
    for context, problem in ((depthwise_context, depthwise), (stem_context, stem)):
        with pytest.raises(ConvSpecError, match="cuda or hip"):
            context(problem, parse_target("cpu"), "p")
        with pytest.raises(ConvSpecError, match="prefix"):
            context(problem, cuda, "not an identifier")


def test_the_tiles_follow_the_layout_and_the_windows():
    cuda = parse_target("cuda-sm_80")
    nchw = depthwise_context(case_problem(CASES["depthwise", "mbv2_s2"], DType.F32), cuda, "p")
    cl = depthwise_context(case_problem(CASES["depthwise", "mbv2_s2"], DType.F32, "cl"), cuda, "p")
    assert (nchw.ct, nchw.lanes, nchw.tile) == (1, 32, (16, 32))   # a channel's pixels, rows a warp wide
    # a run of channels, 8 outputs a thread: 64 pixels, but 8x8's 17x17 stride-2 windows overrun the budget
    assert (cl.ct, cl.lanes, cl.tile) == (32, 1, (8, 4))
    stride1 = dataclasses.replace(case_problem(CASES["depthwise", "mbv2_s2"], DType.F32, "cl"), stride=(1, 1))
    assert depthwise_context(stride1, cuda, "p").tile == (8, 8)   # stride 1: 10x10 windows fit
    stem = stem_context(case_problem(CASES["stem", "resnet224"], DType.F32), cuda, "p")
    # register tiles of 4 filters x 4 taps, 2 a thread for 32 filters a block (32 sums); their staged
    # grad_output and the window fit 8 x 16 pixels (rows of 16 along a contiguous input): not 1 x 128, a
    # 7x7 window overlaps
    assert (stem.kt, stem.ft, stem.tt, stem.tile) == (32, 4, 4, (8, 16)) and stem.split > 1
    # an axis whose every residue is taps-free (input 1, padding 1, stride 2): a window of one row, not zero
    assert depthwise_context(case_problem(CASES["depthwise", "lonely"], DType.F32), cuda, "p").data_window[1] == 1


# ----------------------------------------------------------------------- against ATen


def _reference(case, x, w, b, dy):
    """ATen's results in float64, padding applied explicitly so asymmetric pairs work too."""
    _, _, _, _, stride, padding, dilation, groups = case
    pads = [p for pair in reversed(padding) for p in pair]
    x64 = F.pad(x.double(), pads)
    zeros = [0] * len(stride)
    y = torch.ops.aten.convolution(x64, w.double(), b.double(), list(stride), zeros, list(dilation), False, zeros, groups)
    dxp, dw, db = torch.ops.aten.convolution_backward(dy.double(), x64, w.double(), [b.numel()], list(stride), zeros,
                                                      list(dilation), False, zeros, groups, [True, True, True])
    slices = [slice(None), slice(None)] + [slice(lo, dxp.shape[2 + i] - hi) for i, (lo, hi) in enumerate(padding)]
    return {"forward": y, "grad_input": dxp[tuple(slices)], "grad_weight": dw, "grad_bias": db}


def _run(lib, prefix, kind, problem, torch_dtype, x, w, b, dy, order, seed=0, keep=None):
    """Every pass `kind` has, on NaN-poisoned outputs: the weight gradient alone, the bias gradient
    alone, and the two fused ("grad_weight (fused)", "grad_bias (fused)": the weight gradient's two
    launches, no third); `keep` (a dict) receives the workspaces ("workspace", "fused workspace")."""
    p, n = sim.pointer, ctypes.c_longlong(problem.n)
    x, w, dy = in_layout(x, problem.input_layout), in_layout(w, problem.weight_layout), in_layout(dy, problem.output_layout)

    def poisoned(shape, layout):
        return in_layout(torch.full(shape, float("nan"), dtype=torch_dtype), layout)

    out = {}
    if kind == "depthwise":
        out["forward"] = poisoned(problem.output_shape, problem.output_layout)
        out["grad_input"] = poisoned(problem.input_shape, problem.input_layout)
        lib.call(f"{prefix}_fwd", p(x), p(w), p(b), p(out["forward"]), n, None, order=order, seed=seed)
        lib.call(f"{prefix}_bwd_data", p(dy), p(w), p(out["grad_input"]), n, None, order=order, seed=seed)
    out["grad_weight"] = poisoned(problem.weight_shape, problem.weight_layout)
    out["grad_bias"] = poisoned((problem.k,), Layout.CONTIGUOUS)
    acc = torch.float64 if torch_dtype is torch.float64 else torch.float32

    def workspace(entry):   # poisoned: every partial is written
        lib.lib[f"{prefix}_{entry}_workspace_bytes"].restype = ctypes.c_ulonglong
        return torch.full((lib.lib[f"{prefix}_{entry}_workspace_bytes"](n) // acc.itemsize,), float("nan"), dtype=acc)

    plain, fused = workspace("bwd_weight"), workspace("bwd_weight_bias")
    split = plain.numel() // math.prod(problem.weight_shape)   # (the bias partials: f64, from an 8-byte boundary)
    assert fused.numel() * acc.itemsize == bias_partials_at(plain.numel() * acc.itemsize) + split * problem.k * 8
    lib.call(f"{prefix}_bwd_weight", p(dy), p(x), p(out["grad_weight"]), p(plain), n, None, order=order, seed=seed)
    lib.call(f"{prefix}_bwd_bias", p(dy), p(out["grad_bias"]), n, None, order=order, seed=seed)
    out["grad_weight (fused)"] = poisoned(problem.weight_shape, problem.weight_layout)
    out["grad_bias (fused)"] = poisoned((problem.k,), Layout.CONTIGUOUS)
    launches = lib.launches()
    lib.call(f"{prefix}_bwd_weight_bias", p(dy), p(x), p(out["grad_weight (fused)"]), p(out["grad_bias (fused)"]),
             p(fused), n, None, order=order, seed=seed)
    assert lib.launches() - launches == 2   # partials and their ordered sum, the bias gradient inside them
    if keep is not None:
        keep["workspace"], keep["fused workspace"] = plain, fused
    return out


def _data(problem, torch_dtype, test_id):
    g = generator_for(test_id)
    return (randn(problem.input_shape, torch_dtype, g), randn(problem.weight_shape, torch_dtype, g),
            randn((problem.k,), torch_dtype, g), randn(problem.output_shape, torch_dtype, g))


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("kind,name,dtype,layout", PARAMS)
def test_every_pass_matches_aten(libs, vendor, kind, name, dtype, layout):
    case = CASES[kind, name]
    problem, torch_dtype = case_problem(case, DTYPES[dtype][0], layout), DTYPES[dtype][1]
    x, w, b, dy = _data(problem, torch_dtype, f"{kind}-{vendor}-{name}-{dtype}-{layout}")
    order = ORDERS[(len(name) + (vendor == "hip")) % 3]
    out = _run(libs[vendor], _prefix(vendor, kind, name, dtype, layout), kind, problem, torch_dtype, x, w, b, dy,
               order, seed=len(name))
    terms = reduction_terms(problem.input_shape, problem.weight_shape, problem.output_shape)
    reference = _reference(case, x, w, b, dy)
    for what, got in out.items():
        plain = what.split(" ")[0]
        assert_close(got, reference[plain], torch_dtype, f"{vendor} {kind} {name} {dtype} {layout} {what} ({order})",
                     terms[plain])
    assert torch.equal(out["grad_weight (fused)"], out["grad_weight"])   # fusing changes no weight's sum


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("kind", ["depthwise", "stem"])
def test_the_weight_gradient_is_bitwise_the_same_in_any_order(libs, vendor, kind):
    problem = case_problem(CASES[kind, "split"], DType.F32)
    context = (depthwise_context if kind == "depthwise" else stem_context)(problem, parse_target(vendor), "p")
    assert context.split > 1
    x, w, b, dy = _data(problem, torch.float32, f"{kind}-determinism-{vendor}")
    kept = [{} for _ in range(4)]
    results = [_run(libs[vendor], _prefix(vendor, kind, "split", "f32", "nchw"), kind, problem, torch.float32,
                    x, w, b, dy, order, seed, keep)
               for (order, seed), keep in zip((("forward", 0), ("reverse", 0), ("shuffle", 1), ("shuffle", 2)), kept)]
    for other, keep in zip(results[1:], kept[1:]):
        for what in ("grad_weight", "grad_bias", "grad_weight (fused)", "grad_bias (fused)"):
            assert torch.equal(results[0][what].view(torch.int32), other[what].view(torch.int32)), what
        for space in ("workspace", "fused workspace"):
            assert torch.equal(kept[0][space].view(torch.int32), keep[space].view(torch.int32)), space
    # grad_weight is the in-order f32 sum of the partials (in (k, c, tap) order), rounded once
    partials = kept[0]["workspace"].view(context.split, problem.k, -1)
    assert torch.isfinite(partials).all()
    total = torch.zeros(partials.shape[1:], dtype=torch.float32)
    for s in range(context.split):
        total += partials[s]
    assert torch.equal(results[0]["grad_weight"].reshape(problem.k, -1), total)
    # fused: the bias partials (f64) follow the weight's, and grad_bias is their in-order sum too
    partial = bias_partials(kept[0]["fused workspace"], partials.numel() * 4, context.split, problem.k)
    assert torch.isfinite(partial).all()
    bias = torch.zeros(problem.k, dtype=torch.float64)
    for s in range(context.split):
        bias += partial[s]
    assert torch.equal(results[0]["grad_bias (fused)"], bias.float())


@pytest.mark.parametrize("kind,name", [("stem", "resnet"), ("depthwise", "mb_s2")])
def test_bf16_weight_gradients_round_once_after_summing_f32_partials_in_split_order(libs, kind, name):
    """The workspace holds f32 partials (not rounded to bf16); grad_weight is their sum in split
    order, in f32, rounded to bf16 once."""
    problem = case_problem(CASES[kind, name], DType.BF16)
    context = (depthwise_context if kind == "depthwise" else stem_context)(problem, parse_target("cuda"), "p")
    assert context.split > 1
    x, w, b, dy = _data(problem, torch.bfloat16, f"{kind}-rounding")
    keep = {}
    out = _run(libs["cuda"], _prefix("cuda", kind, name, "bf16", "nchw"), kind, problem, torch.bfloat16, x, w, b, dy,
               "shuffle", 5, keep)
    dw = out["grad_weight"]
    partials = keep["workspace"].view(context.split, problem.k, -1)
    assert torch.isfinite(partials).all()
    assert not torch.equal(partials, partials.bfloat16().float())   # f32 precision, not bf16
    total = torch.zeros(partials.shape[1:], dtype=torch.float32)
    for s in range(context.split):
        total += partials[s]
    assert torch.equal(dw.reshape(problem.k, -1).view(torch.int16), total.bfloat16().view(torch.int16))
    # the fused bias gradient: f64 partials after the weight's, summed in split order, rounded once (to
    # the f32 accumulator, then to bf16)
    partial = bias_partials(keep["fused workspace"], partials.numel() * 4, context.split, problem.k)
    assert not torch.equal(partial, partial.bfloat16().double())
    bias = torch.zeros(problem.k, dtype=torch.float64)
    for s in range(context.split):
        bias += partial[s]
    assert torch.equal(out["grad_bias (fused)"].view(torch.int16), bias.float().bfloat16().view(torch.int16))


def test_the_batch_size_is_a_run_time_argument(libs):
    case = CASES["depthwise", "mb_s2"]
    problem = case_problem(case, DType.F32)
    x, w, b, _ = _data(problem, torch.float32, "depthwise-batch")
    x = x[:1].contiguous()
    y = torch.full((1, *problem.output_shape[1:]), float("nan"))
    p = sim.pointer
    libs["cuda"].call("cuda_depthwise_mb_s2_f32_nchw_fwd", p(x), p(w), p(b), p(y), ctypes.c_longlong(1), None)
    assert_close(y, _reference(case, x, w, b, torch.zeros_like(y))["forward"], torch.float32, "batch 1 forward", 9)


# ----------------------------------------------------------------------- the vendors' compilers


def _kernel_count(kind: str, name: str, dtype: str, layout: str) -> int:
    """__global__ functions a rendered case holds: the stem's 3 (bwd_weight_partial, bwd_weight_sum,
    bwd_bias); the depthwise's fwd, bwd_weight_partial, bwd_weight_sum, bwd_bias and a bwd_data a
    stride phase."""
    if kind == "stem":
        return 3
    problem = case_problem(CASES[kind, name], DTYPES[dtype][0], layout)
    return 4 + len(depthwise_context(problem, parse_target("cuda"), "p").phases)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_kernels_build_with_nvcc_without_spills(tmp_path, arch):
    src = tmp_path / f"depthwise_{arch}.cu"
    src.write_text(_source("cuda", arch, PARAMS + COMPILED_ONLY))
    done = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v,-warn-spills,-Werror",
                           "-I", str(sim_build.gpu_templates_dir()), str(src), "-o", str(tmp_path / "depthwise.cubin")],
                          capture_output=True, text=True)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    spills = re.findall(r"(\d+) bytes spill stores", report)
    assert len(spills) == sum(_kernel_count(*p) for p in PARAMS + COMPILED_ONLY) and set(spills) == {"0"}
    assert set(re.findall(r"(\d+) bytes stack frame", report)) == {"0"}   # no local memory either


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="hipcc (apt: hipcc libamdhip64-dev) is not on PATH")
def test_the_kernels_build_with_hipcc_for_gfx90a(tmp_path):
    src = tmp_path / "depthwise_hip.cu"
    src.write_text(_source("hip", "gfx90a", PARAMS + COMPILED_ONLY))
    # (the device code alone, as tests/gpu/test_igemm.py's hipcc_functions: no host compile)
    done = subprocess.run(["hipcc", "-x", "hip", "--offload-arch=gfx90a", "--cuda-device-only", "-S",
                           "-Wno-unused-command-line-argument", "-Rpass-analysis=kernel-resource-usage",
                           "-I", str(sim_build.gpu_templates_dir()), str(src), "-o", str(tmp_path / "depthwise.s")],
                          capture_output=True, text=True, env={**os.environ, "HIP_PLATFORM": "amd"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(re.findall(r"ScratchSize \[bytes/lane\]: (\d+)", done.stderr)) == {"0"}   # no spills to scratch


# ----------------------------------------------------------------------- sanitizers

ASAN_SCRIPT = r"""
import sys
from pathlib import Path
import test_depthwise as T
from convgen.devices import sim
from convgen.building import sim_build
from support.problems import case_problem
for vendor in ("hip",):   # one vendor keeps the test short; warp 64 is the less travelled width
    lib = sim.build(T._source(vendor, None, T.SANITIZED), Path(sys.argv[1]), "asan_" + vendor, vendor, sanitize=True)
    for kind, n, d, lay in T.SANITIZED:
        problem, torch_dtype = case_problem(T.CASES[kind, n], T.DTYPES[d][0], lay), T.DTYPES[d][1]
        x, w, b, dy = T._data(problem, torch_dtype, "asan")
        T._run(lib, T._prefix(vendor, kind, n, d, lay), kind, problem, torch_dtype, x, w, b, dy, "shuffle", 3)
        print("ran", vendor, kind, n, d, lay, flush=True)
print("all ran")
"""


def test_the_kernels_run_clean_under_asan_and_ubsan(tmp_path):
    """Every access of every pass stays inside its tensor, workspace and shared array."""
    require_fp16()
    done = run_sanitized(ASAN_SCRIPT, tmp_path, __file__)
    text = done.stdout + done.stderr
    assert done.returncode == 0 and "all ran" in text, text
    assert "AddressSanitizer" not in text and "runtime error" not in text, text
    assert text.count("ran ") == len(SANITIZED)
