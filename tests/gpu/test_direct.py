"""The direct GPU kernel (codegen/gpu/direct.py, templates/gpu/direct.cu.j2): rendered for CUDA
and HIP from one template, run in the SIMT simulator at warp 32 and 64 against ATen in float64
for every pass, and built by nvcc (sm_80) and hipcc (gfx90a)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F

from convgen.devices import sim
from convgen.building import sim_build
from convgen.codegen.gpu.direct import render_direct
from convgen.codegen.ir import ConvProblem, DType, Op
from convgen.codegen.target import parse_target

from support.problems import case_problem

# (CASES.md number, input N,C,*spatial, K, kernel, stride, padding (low, high) per axis, dilation, groups)
CASES = [
    ("1", (1, 3, 4, 4), 3, (3, 3), (2, 2), ((2, 2), (2, 2)), (1, 1), 1),                 # padding as large as allowed
    ("2", (2, 4, 8, 8), 2, (3, 3), (3, 2), ((2, 2), (1, 1)), (4, 4), 2),                 # mixed stride/padding, dilation 4, groups
    ("3", (1, 4, 5, 5), 1, (2, 3), (2, 2), ((1, 1), (1, 1)), (2, 3), 1),                 # even kernel, per-axis dilation
    ("4", (1, 2, 4, 3), 4, (3, 4), (2, 2), ((1, 1), (1, 1)), (1, 1), 1),                 # kernel wider than the input
    ("5", (1, 4, 5, 5), 1, (2, 3), (1, 1), ((1, 2), (3, 3)), (3, 3), 1),                 # 'same': asymmetric padding
    ("7", (2, 4, 6, 6), 8, (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 4),                 # depthwise, multiplier 2
    ("8", (2, 4, 6, 5), 6, (3, 2), (1, 1), ((0, 0), (0, 0)), (1, 1), 2),                 # grouped, non-square
    ("13", (2, 2, 4, 20), 2, (3, 5), (1, 10), ((0, 0), (0, 0)), (1, 1), 2),              # stride larger than the kernel
    ("15", (0, 6, 7, 8), 12, (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 3),               # empty batch
    ("19", (4, 8, 50), 16, (5,), (2,), ((2, 2),), (2,), 1),                              # 1-D
    ("20", (3, 9, 3, 1, 9), 3, (3, 1, 9), (2, 2, 2), ((0, 0),) * 3, (1, 1, 1), 3),       # 3-D, groups
]
DTYPES = {"f64": (DType.F64, torch.float64, 1e-12), "f32": (DType.F32, torch.float32, 1e-6)}
F32_CASES = {"2", "5", "19"}
PARAMS = [(case[0], d) for case in CASES for d in DTYPES if d == "f64" or case[0] in F32_CASES]


def _source(vendor: str) -> str:
    target = parse_target(vendor)
    by_number = {c[0]: c for c in CASES}
    return "".join(render_direct(case_problem(by_number[n], DTYPES[d][0]), target, f"case{n}_{d}") for n, d in PARAMS)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_direct")
    return {vendor: sim.build(_source(vendor), d, "direct", vendor) for vendor in sim_build.WARP}


def _reference(case, x, w, b, dy):
    """ATen's results in float64: padding applied explicitly, so asymmetric pairs work too."""
    _, _, _, _, stride, padding, dilation, groups = case
    pads = [p for pair in reversed(padding) for p in pair]
    x64 = F.pad(x.double(), pads).requires_grad_()
    zeros = [0] * len(stride)
    y = torch.ops.aten.convolution(x64, w.double(), b.double(), list(stride), zeros, list(dilation), False, zeros, groups)
    dxp, dw, db = torch.ops.aten.convolution_backward(dy.double(), x64, w.double(), [b.numel()], list(stride), zeros,
                                                      list(dilation), False, zeros, groups, [True, True, True])
    slices = [slice(None), slice(None)] + [slice(lo, dxp.shape[2 + i] - hi) for i, (lo, hi) in enumerate(padding)]
    return y, dxp[tuple(slices)], dw, db


def _rel(out, ref):
    if ref.numel() == 0:
        return 0.0
    scale = ref.norm().item()
    return (out.double() - ref).norm().item() / (scale if scale else 1.0)


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("number,dtype", PARAMS)
def test_every_pass_matches_aten(libs, vendor, number, dtype):
    case = next(c for c in CASES if c[0] == number)
    problem = case_problem(case, DTYPES[dtype][0])
    torch_dtype, tolerance = DTYPES[dtype][1:]
    x = torch.randn(problem.input_shape, dtype=torch_dtype)
    w = torch.randn(problem.weight_shape, dtype=torch_dtype)
    b = torch.randn(problem.k, dtype=torch_dtype)
    dy = torch.randn(problem.output_shape, dtype=torch_dtype)
    y, dx, dw, db = (torch.full(s, float("nan"), dtype=torch_dtype) for s in
                     (problem.output_shape, problem.input_shape, problem.weight_shape, (problem.k,)))
    lib, p, n, prefix = libs[vendor], sim.pointer, ctypes.c_longlong(problem.n), f"case{number}_{dtype}"
    order = "shuffle" if int(number) % 2 else "reverse"
    lib.call(f"{prefix}_fwd", p(x), p(w), p(b), p(y), n, None, order=order, seed=int(number))
    lib.call(f"{prefix}_bwd_data", p(dy), p(w), p(dx), n, None, order=order, seed=int(number))
    lib.call(f"{prefix}_bwd_weight", p(dy), p(x), p(dw), n, None, order=order, seed=int(number))
    lib.call(f"{prefix}_bwd_bias", p(dy), p(db), n, None, order=order, seed=int(number))
    refs = _reference(case, x, w, b, dy)
    for name, out, ref in zip(("forward", "data gradient", "weight gradient", "bias gradient"), (y, dx, dw, db), refs):
        assert out.shape == ref.shape, name
        assert _rel(out, ref) < tolerance, (name, _rel(out, ref))
    # the bias gradient fused into the weight gradient's launch: the same sums, so the same bits
    dw2, db2 = torch.full_like(dw, float("nan")), torch.full_like(db, float("nan"))
    launches = lib.launches()
    lib.call(f"{prefix}_bwd_weight_bias", p(dy), p(x), p(dw2), p(db2), n, None, order=order, seed=int(number))
    assert lib.launches() - launches == (1 if dw.numel() + db.numel() else 0)
    assert torch.equal(dw2, dw) and torch.equal(db2, db)


def test_the_batch_size_is_a_run_time_argument(libs):
    case = next(c for c in CASES if c[0] == "2")
    problem = case_problem(case, DType.F64)
    x = torch.randn(problem.input_shape, dtype=torch.float64)[:1].contiguous()
    w, b = torch.randn(problem.weight_shape, dtype=torch.float64), torch.randn(problem.k, dtype=torch.float64)
    y = torch.full((1, *problem.output_shape[1:]), float("nan"), dtype=torch.float64)
    p = sim.pointer
    libs["cuda"].call("case2_f64_fwd", p(x), p(w), p(b), p(y), ctypes.c_longlong(1), None)
    ref = _reference(case, x, w, b, torch.zeros_like(y))[0]
    assert _rel(y, ref) < 1e-12


def _vendor_build(tmp_path, vendor, argv, env=None):
    src = tmp_path / f"direct_{vendor}.cu"
    src.write_text(_source(vendor))
    done = subprocess.run([*argv, "-I", str(sim_build.gpu_templates_dir()), str(src), "-o", str(tmp_path / "direct.o")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
def test_the_direct_kernels_build_with_nvcc_for_sm_80(tmp_path):
    _vendor_build(tmp_path, "cuda", ["nvcc", "-arch=sm_80", "-cubin"])


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="hipcc (apt: hipcc libamdhip64-dev) is not on PATH")
def test_the_direct_kernels_build_with_hipcc_for_gfx90a(tmp_path):
    _vendor_build(tmp_path, "hip", ["hipcc", "-x", "hip", "--offload-arch=gfx90a", "-c"], {**os.environ, "HIP_PLATFORM": "amd"})


# Offsets within an image or the weight are 32-bit `int` where they fit (half the registers and
# instructions of 64-bit index arithmetic), `long long` past that. One problem on each side of the limit; the 64-bit one is only built (it would need
# 9 GB per tensor to run).
NEAR_LIMIT = [
    ("int", (1, 1, 1290, 1290, 1290)),    # 2 146 689 000 input elements: the largest offset fits
    ("long long", (1, 1, 1291, 1291, 1291)),   # 2 151 685 171: past 2^31 - 1
]


@pytest.mark.parametrize("index,shape", NEAR_LIMIT)
def test_in_image_offsets_are_int_only_where_they_fit(tmp_path, index, shape):
    problem = ConvProblem(Op.FWD, shape[0], shape[1], 1, shape[2:], (1, 1, 1), (1, 1, 1), ((0, 0),) * 3, (1, 1, 1),
                          dtype=DType.F32, bias=True).validate()
    text = render_direct(problem, parse_target("cuda"), "big")
    assert f"typedef {index} Index;" in text
    lib = sim.build(text, tmp_path, "direct_big", "cuda")   # the simulator's compiler builds every kernel
    assert lib is not None
