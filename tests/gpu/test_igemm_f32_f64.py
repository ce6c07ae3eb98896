"""The implicit-GEMM GPU kernel's f32 and f64 paths (codegen/gpu/igemm.py, templates/gpu/igemm.cu.j2):
CUDA's f32 without tf32 multiplied on the vector units by each thread's register tile of fused
multiply-adds (`on_fma`), accumulated in f32; f64 on matrix instructions (`on_f64_matrix`, f64
accumulation): CUDA's f64 tensor cores (two mma.sync m8n8k4 .f64 per 16 x 8 x 4 step), HIP's
v_mfma_f64_16x16x4f64 (accumulators every fourth row); HIP's f32 on v_mfma_f32_16x16x4f32 (true
f32 operands, f32 accumulation).

- The `algorithm` pass gives them igemm (the direct kernel stays a candidate), and explain says how.
- The FMA path's f64 and 64-wide-wave branches, which no default plan takes any more, run with the
  path forced (FORCED_F64_FMA) in the simulator and in the nvcc/hipcc builds.
- The rendered kernels run in the simulator at warp 32 and 64 against ATen in float64, every pass
  and the fused bias gradient, over the cases of test_igemm.py (ragged channels, stride
  phases, 1-D/3-D, groups, channels-last, 16-byte copies) and its random ones, under forward,
  reversed and shuffled thread and block orders; the weight gradient's split-K sum is bitwise the
  same in any order.
- They build with nvcc for sm_80 and sm_90 with spills as errors, f32 with FFMA and no HMMA in
  their machine code, f64 with DMMA (sm_80 spells it DMMA.884, sm_90 DMMA.8x8x4) and no DFMA or
  HMMA, and with hipcc for gfx90a and gfx940 without scratch: f64 with v_mfma_f64_16x16x4(_)f64 and
  no v_fma(c)_f64, f32 with v_mfma_f32_16x16x4(_)f32.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import pytest
import torch

from convgen.building import sim_build
from convgen.codegen.gpu.igemm import igemm_context, render_igemm
from convgen.codegen.gpu.igemm_tiles import on_f64_matrix, on_fma
from convgen.codegen.gpu.resources import explain_lines
from convgen.codegen.ir import DType
from convgen.codegen.pipeline import lower
from convgen.codegen.target import parse_target
from convgen.devices import sim

from support.problems import case_problem
from support.reference import generator_for, randn
from support.toolchain import cuda_tool
from test_igemm import BY_NAME, CASES, CHANNELS_LAST_CASES, NCHW_ONLY_IN_LAYOUT, ORDERS, RANDOM_CASES, _run, _staged, \
    check_every_pass, hipcc_functions

# One worker runs this module, whole (pyproject.toml: --dist loadgroup): its `libs` fixture builds one
# simulator library per vendor of every case of the f32/f64 implicit GEMM (a single file of tens of thousands
# of lines, 20-50 s of CPU each); split across workers, each worker built them all again.
pytestmark = pytest.mark.xdist_group("gpu_igemm_f32_f64")

DTYPES = {"f32": (DType.F32, torch.float32), "f64": (DType.F64, torch.float64)}
F64_CASES = {"c2", "c19", "c20", "ragged", "tiles", "s3d2", "s_3d", "split", "vec_nchw", "empty"}
PARAMS = ([(c[0], "f32", "nchw") for c in CASES if c[0] not in NCHW_ONLY_IN_LAYOUT]
          + [(name, "f64", "nchw") for name in sorted(F64_CASES)]
          + [(name, "f32", layout) for name, layout in CHANNELS_LAST_CASES.items()]
          + [("vec_cl", "f64", "cl"), ("s_3d", "f64", "cl")]
          + [(c[0], "f64" if i % 2 else "f32", "cl" if i % 3 == 0 and len(c[1]) > 3 else "nchw")
             for i, c in enumerate(RANDOM_CASES)]
          # the forward's input and weight staged, their 3 channels padded to 4 (16-byte copies of f32, two of f64)
          + [("ragged", "f32", "nchw_staged"), ("stem", "f64", "cl_staged")])


def _prefix(vendor: str, name: str, dtype: str, layout: str = "nchw") -> str:
    return f"fma_{vendor}_{name}_{dtype}_{layout}"


# f64 takes matrix instructions on both vendors by default; the template's FMA path still takes f64
# (and 64-wide waves, a 4 x 4 tile a lane): rendered here with the path forced, so it stays tested.
FORCED_F64_FMA = [("c2", "nchw"), ("ragged", "nchw"), ("split", "nchw"), ("s_3d", "cl"), ("vec_cl", "cl")]


def _forced_fma_source(vendor: str, name: str, layout: str, target) -> str:
    from convgen.codegen.render import environment

    context = igemm_context(case_problem(BY_NAME[name], DType.F64, layout), target, _prefix(vendor, name, "f64fma", layout))
    assert context.f64_matrix and not context.fma
    forced = dataclasses.replace(context, fma=True, f64_matrix=False)
    return environment().get_template("gpu/igemm.cu.j2").render(c=forced)


def _source(vendor: str, arch: str | None = None) -> str:
    target = parse_target(f"{vendor}-{arch}" if arch else vendor)
    return ("".join(render_igemm(case_problem(BY_NAME[n], DTYPES[d][0], lay), target, _prefix(vendor, n, d, lay),
                                 staged=_staged(lay))
                    for n, d, lay in PARAMS)
            + "".join(_forced_fma_source(vendor, n, lay, target) for n, lay in FORCED_F64_FMA))


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_fma")
    return {vendor: sim.build(_source(vendor), d, "fma", vendor) for vendor in sim_build.WARP}


def test_f64_and_f32_without_tf32_take_igemm_and_explain_says_how():
    base = case_problem(BY_NAME["ragged"], DType.F32)
    for target in ("cuda-sm_80", "cuda-sm_90", "hip-gfx90a", "hip-gfx940"):
        for problem in (base, dataclasses.replace(base, dtype=DType.F64)):
            mfma = target.startswith("hip") and problem.dtype is DType.F32
            f64 = problem.dtype is DType.F64   # on matrix instructions on every target
            assert on_fma(problem, parse_target(target)) == (not mfma and not f64)
            assert on_f64_matrix(problem, parse_target(target)) == f64
            plan = lower(problem, parse_target(target))
            assert plan.algorithm == "igemm" and "direct" in plan.candidates
            words = " ".join(why for _, why in plan.reasons)
            if mfma:
                assert "f32 on the matrix cores (the target's matrix instruction)" in words, words
                assert "f32 matrix" in " ".join(explain_lines(plan, None, "no compiler"))   # the roofline's units
            elif f64:
                assert ("f64 on the f64 tensor cores (mma.sync m8n8k4 .f64, DMMA), f64 accumulation"
                        if target.startswith("cuda") else
                        "f64 on the matrix cores (v_mfma_f64_16x16x4f64), f64 accumulation") in words, words
                assert "f64 matrix" in " ".join(explain_lines(plan, None, "no compiler"))   # the roofline's units
            else:
                units = "CUDA cores" if target.startswith("cuda") else "SIMDs"
                assert f"{problem.dtype.value} on the {units}" in words and "results in registers" in words, words
            context = igemm_context(problem, parse_target(target), "p")
            assert context.fma == (not mfma and not f64) and context.f64_matrix == f64
            assert context.acc == ("double" if problem.dtype is DType.F64 else "float")
            if not mfma:   # 64 a side (gpu/igemm_tiles.py): 32 f64 or f32 results a lane
                assert all(t.m == 64 and t.n == 64 for _, t in context.tiles)
            limit = parse_target(target).gpu.shared_bytes_per_block   # HIP: 64 KiB of LDS, f64 steps 16 deep
            assert all(t.shared_bytes <= limit for _, t in context.tiles), (target, problem.dtype, context.tiles)
            assert context.block_k == (16 if problem.dtype is DType.F64 else 32)
    tf32 = dataclasses.replace(base, tf32=True)
    assert not on_fma(tf32, parse_target("cuda-sm_80")) and not igemm_context(tf32, parse_target("cuda-sm_80"), "p").fma
    big = dataclasses.replace(base, c=256, k=256)   # 128-wide f32 tiles: two stages over HIP's 64 KiB, so one side is 64
    tiles = igemm_context(big, parse_target("hip-gfx90a"), "p").tiles
    assert all(t.shared_bytes <= 65536 and 64 in (t.m, t.n) for _, t in tiles) and any(128 in (t.m, t.n) for _, t in tiles)
    on_hip = lower(tf32, parse_target("hip-gfx90a"))   # tf32 is CUDA's: such a problem goes to direct on HIP
    assert on_hip.algorithm == "direct" and "not igemm: tf32 on hip-gfx90a" in " ".join(w for _, w in on_hip.reasons)


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("name,dtype,layout", PARAMS)
def test_every_pass_matches_aten(libs, vendor, name, dtype, layout):
    check_every_pass(libs[vendor], _prefix(vendor, name, dtype, layout), BY_NAME[name], DTYPES[dtype], layout,
                     ORDERS[(len(name) + len(dtype) + (vendor == "hip")) % 3], f"fma-{vendor}-{name}-{dtype}-{layout}")


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("name,layout", FORCED_F64_FMA)
def test_f64_on_the_forced_fma_path_matches_aten(libs, vendor, name, layout):
    check_every_pass(libs[vendor], _prefix(vendor, name, "f64fma", layout), BY_NAME[name], DTYPES["f64"], layout,
                     ORDERS[(len(name) + (vendor == "hip")) % 3], f"fma-forced-{vendor}-{name}-f64-{layout}")


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_weight_gradient_is_bitwise_the_same_in_any_order(libs, vendor, dtype):
    kind, torch_dtype = DTYPES[dtype]
    problem = case_problem(BY_NAME["split"], kind)
    assert igemm_context(problem, parse_target(vendor), "p").split > 1
    g = generator_for(f"fma-determinism-{vendor}-{dtype}")
    x, dy = randn(problem.input_shape, torch_dtype, g), randn(problem.output_shape, torch_dtype, g)
    w, b = randn(problem.weight_shape, torch_dtype, g), randn((problem.k,), torch_dtype, g)
    bits = torch.int64 if torch_dtype is torch.float64 else torch.int32
    kept = [{} for _ in range(4)]
    results = [_run(libs[vendor], _prefix(vendor, "split", dtype), problem, torch_dtype, x, w, b, dy, order, seed, keep)
               for (order, seed), keep in zip((("forward", 0), ("reverse", 0), ("shuffle", 1), ("shuffle", 2)), kept)]
    for other, keep in zip(results[1:], kept[1:]):
        for i in (2, 4, 5):   # grad_weight, and fused with grad_bias
            assert torch.equal(results[0][i].view(bits), other[i].view(bits))
        for space in ("workspace", "fused workspace"):
            assert torch.equal(kept[0][space].view(torch.int32), keep[space].view(torch.int32)), space


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
# sm_90 (the default CUDA target) here; every configuration of these kernels also builds for sm_80, with
# the same instruction checks (FFMA, DMMA, HMMA.1688.F32.TF32), in tests/gpu/test_cases_build.py
@pytest.mark.parametrize("arch", ["sm_90"])
def test_the_kernels_build_with_nvcc_without_spills_f32_on_ffma_f64_on_dmma(tmp_path, arch):
    src = tmp_path / f"fma_{arch}.cu"
    src.write_text(_source("cuda", arch))
    cubin = tmp_path / "fma.cubin"
    done = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v,-warn-spills,-Werror",
                           "-I", str(sim_build.gpu_templates_dir()), str(src), "-o", str(cubin)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    report = done.stdout + done.stderr
    assert set(re.findall(r"(\d+) bytes spill stores", report)) == {"0"}
    nvdisasm = cuda_tool("nvdisasm")
    if nvdisasm is None:
        pytest.skip("nvdisasm not found (CUDA toolkit or `pip install nvidia-cuda-nvdisasm`): machine code not checked")
    sass = subprocess.run([nvdisasm, str(cubin)], capture_output=True, text=True, check=True).stdout
    functions = re.split(r"\n\s*\.text\.", sass)
    for n, d, lay in PARAMS:
        prefix = _prefix("cuda", n, d, lay)
        for symbol in ("3fwd", "8bwd_data", "18bwd_weight_partial"):
            (body,) = [f for f in functions if re.match(rf"_ZN{len(prefix)}{prefix}{symbol}E", f)]
            assert re.search(r"\bDMMA\.(884|8x8x4)\b" if d == "f64" else r"\bFFMA\b", body), (prefix, symbol)
            assert not re.search(r"\bHMMA\b|\bDFMA\b" if d == "f64" else r"\bHMMA\b", body), (prefix, symbol)


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="hipcc (apt: hipcc libamdhip64-dev) is not on PATH")
def test_the_kernels_build_with_hipcc_for_gfx90a_and_gfx940_without_scratch_on_mfma(tmp_path):
    for arch, functions in hipcc_functions(tmp_path, _source("hip", "gfx90a"), "fma_hip").items():   # no scratch
        for n, d, lay in PARAMS:
            prefix = _prefix("hip", n, d, lay)
            for symbol in ("3fwd", "8bwd_data", "18bwd_weight_partial"):
                (body,) = [f for f in functions if re.match(rf"_ZN{len(prefix)}{prefix}{symbol}E\w*:", f)]
                if d == "f64":   # gfx90a spells it v_mfma_f64_16x16x4f64, gfx940 v_mfma_f64_16x16x4_f64
                    assert re.search(r"\bv_mfma_f64_16x16x4_?f64\b", body), (arch, prefix, symbol)
                    assert not re.search(r"\bv_fmac?_f64|\bv_mfma_f32", body), (arch, prefix, symbol)
                else:   # gfx90a spells it v_mfma_f32_16x16x4f32, gfx940 v_mfma_f32_16x16x4_f32
                    assert re.search(r"\bv_mfma_f32_16x16x4_?f32\b", body), (arch, prefix, symbol)
