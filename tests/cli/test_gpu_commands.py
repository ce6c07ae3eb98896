"""The command line for GPU targets: show (self-contained files the vendor compilers build),
explain (GPU reasons only), build (nvcc/hipcc, resource report, a missing compiler), check (every
pass against ATen in float64, in the simulator or on the CPU), and the simulator builds' keys.

The show outputs are compiled in one nvcc call per arch (sm_80, sm_90; ptxas spills are errors)
and one hipcc call (gfx90a). Without nvcc or hipcc those tests are skipped and say which
compiler is missing (.ci/run installs hipcc; see the README).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from convgen.building import build
from convgen.bench import check
from convgen import knobs
from convgen.codegen.emit import emit
from convgen.codegen.ir import ConvProblem, DType, Layout, Op
from convgen.codegen.pipeline import lower
from convgen.codegen.target import parse_target

from support.commands import run_cli
from support.toolchain import cuda_tool   # nvdisasm from the CUDA toolkit or the nvidia-cuda-nvdisasm wheel


# Problems whose kernels the vendor compilers build: every pass, every dtype, both layouts,
# transposed with output_padding, groups, 1-D and 3-D.
SHOWN = [
    ("fwd_f32", ["--input", "2,4,7,7", "--weight", "18,2,3,3", "--groups", "2", "--stride", "2", "--padding", "1",
                 "--op", "fwd", "--bias"]),   # 9 filters a group: the implicit GEMM's (4 or fewer: depthwise's)
    ("dgrad_f16_nhwc_t", ["--input", "2,4,7,7", "--weight", "4,3,3,3", "--groups", "2", "--stride", "2", "--padding",
                          "1", "--output-padding", "1", "--transposed", "--op", "bwd_data", "--dtype", "f16",
                          "--layout", "nhwc"]),
    ("wgrad_bf16_bias", ["--input", "2,16,6,6", "--weight", "8,8,3,3", "--groups", "2", "--dilation", "2", "--op",
                         "bwd_weight", "--bias", "--dtype", "bf16"]),
    ("bias_f64_3d", ["--input", "2,3,4,5,6", "--weight", "5,3,2,2,2", "--op", "bwd_bias", "--dtype", "f64"]),
    ("fwd_f16_1d_t", ["--input", "3,4,9", "--weight", "4,2,5", "--stride", "3", "--padding", "2", "--transposed",
                      "--op", "fwd", "--bias", "--dtype", "f16"]),
    ("dgrad_bf16_same", ["--input", "1,4,5,5", "--weight", "2,4,2,3", "--padding", "same", "--dilation", "3", "--op",
                         "bwd_data", "--dtype", "bf16", "--layout", "nhwc"]),
    ("fwd_bf16_nhwc", ["--input", "2,5,9,9", "--weight", "7,5,3,3", "--stride", "2", "--padding", "1", "--op", "fwd",
                       "--bias", "--dtype", "bf16", "--layout", "nhwc"]),
    ("dgrad_f16_s3d2", ["--input", "2,3,11,10", "--weight", "5,3,3,3", "--stride", "3", "--dilation", "2", "--padding",
                        "1", "--op", "bwd_data", "--dtype", "f16"]),
    # channel counts multiples of 8: operands by 16-byte copies (cp.async, LDGSTS in the machine code)
    ("fwd_bf16_vec", ["--input", "2,16,6,6", "--weight", "16,16,3,3", "--padding", "1", "--op", "fwd", "--dtype", "bf16",
                      "--layout", "nhwc"]),
    ("dgrad_f16_vec", ["--input", "2,16,6,6", "--weight", "16,16,3,3", "--padding", "1", "--op", "bwd_data", "--dtype",
                       "f16", "--layout", "nhwc"]),
    ("wgrad_bf16_vec", ["--input", "2,8,8,8", "--weight", "16,8,3,3", "--stride", "2", "--padding", "1", "--op",
                        "bwd_weight", "--dtype", "bf16"]),
]
ASYNC_COPIES = {"fwd_bf16_vec", "dgrad_f16_vec", "wgrad_bf16_vec"}   # their GEMM kernel holds LDGSTS
SHOWN += [
    ("dw_wgrad_f32_nhwc", ["--input", "2,6,9,9", "--weight", "12,1,3,3", "--groups", "6", "--stride", "2", "--padding",
                           "1", "--op", "bwd_weight", "--bias", "--layout", "nhwc"]),
    ("dw_dgrad_bf16", ["--input", "2,6,9,9", "--weight", "6,1,5,5", "--groups", "6", "--stride", "2", "--padding", "2",
                       "--op", "bwd_data", "--dtype", "bf16"]),
    ("stem_wgrad_f16", ["--input", "2,3,16,16", "--weight", "8,3,7,7", "--stride", "2", "--padding", "3", "--op",
                        "bwd_weight", "--bias", "--dtype", "f16"]),
]
# the algorithm each shown file must have: depthwise problems the depthwise kernels, few-channel weight
# gradients the stem kernel, the others igemm (bf16/f16 on tensor cores / matrix cores, f32 on FMAs or HIP's
# matrix cores, f64 on CUDA's DMMA or HIP's v_mfma_f64)
ALGORITHM = {name: "depthwise" if name.startswith("dw_") else "stem" if name.startswith("stem_") else "igemm"
             for name, flags in SHOWN}
LOW_PRECISION = {name for name, flags in SHOWN if ALGORITHM[name] == "igemm"
                 and any(d in flags for d in ("bf16", "f16"))}   # HMMA / v_mfma inside
GEMM_KERNEL = r"_ZN\w+(3fwd|8bwd_data|18bwd_weight_partial)E"


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    """The show outputs for cuda and hip, written to files."""
    directory = tmp_path_factory.mktemp("shown")
    files = {"cuda": [], "hip": []}
    for vendor, target in (("cuda", "cuda-sm_90"), ("hip", "hip-gfx90a")):
        for name, flags in SHOWN:
            code, out, err = run_cli("show", *flags, "--target", target)
            assert code == 0, err
            path = directory / f"{vendor}_{name}.cu"
            path.write_text(out)
            files[vendor].append(path)
    return files


def test_shown_files_are_self_contained(shown):
    for vendor, paths in shown.items():
        for path in paths:
            text = path.read_text()
            includes = [line.split(None, 1)[1] for line in text.splitlines() if line.startswith("#include")]
            # the simulator (under -DCONVGEN_SIM only) and the vendor's own headers, nothing of convgen's
            vendor_header = ("<cuda", "<mma.h") if vendor == "cuda" else ("<hip/",)
            assert '"sim/simt.h"' in includes, (path.name, includes)
            assert all(i.startswith('"sim/') or i.startswith(vendor_header) for i in includes), (path.name, includes)
            assert "// decisions:" in text and "[tiling]" in text and 'extern "C" int cg_' in text
            assert f"algorithm {ALGORITHM[path.stem.split('_', 1)[1]]}\n" in text, path.name
            if "_bwd_weight(convgen_pointer" in text and "algorithm direct" not in text:
                # the plan entry allocates the split-K workspace itself: from the allocator the caller
                # sets (torch's caching allocator on a device), else the vendor's stream-ordered one
                assert "_workspace(&workspace, bytes, stream)" in text and "_free(workspace, stream)" in text
                assert "convgen_malloc_async(p, bytes" in text and "convgen_free_async(p" in text


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_builds_the_shown_files_without_spills(shown, arch, tmp_path):
    nvcc = knobs.nvcc()
    if not nvcc or not shutil.which(nvcc):
        pytest.skip("nvcc is not installed (CONVGEN_NVCC, PATH, CUDA_HOME)")
    # the shown files are for sm_90; the sm_80 ones differ only in their header comment
    paths = shown["cuda"]
    if arch != "sm_90":
        paths = []
        for name, flags in SHOWN:
            code, out, err = run_cli("show", *flags, "--target", f"cuda-{arch}")
            assert code == 0, err
            (tmp_path / f"{name}.cu").write_text(out)
            paths.append(tmp_path / f"{name}.cu")
    done = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-warn-spills", "-Xptxas", "-Werror",
                           "-odir", str(tmp_path), *map(str, paths)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    assert len(list(tmp_path.glob("*.cubin"))) == len(paths)
    nvdisasm = cuda_tool("nvdisasm")
    if nvdisasm is None:
        pytest.skip("nvdisasm not found (CUDA toolkit or `pip install nvidia-cuda-nvdisasm`): machine code not checked")
    for path in paths:
        if path.stem.split("_", 1)[1] not in LOW_PRECISION:
            continue
        cubin = next(tmp_path.glob(f"{path.stem}*.cubin"))
        sass = subprocess.run([nvdisasm, str(cubin)], capture_output=True, text=True, check=True).stdout
        gemms = [f for f in re.split(r"\n\s*\.text\.", sass) if re.match(GEMM_KERNEL, f)]
        assert gemms, f"{path.name}: no matrix kernel in the cubin"
        for body in gemms:
            assert re.search(r"HMMA\.16816\.F32(\.BF16)?", body), (path.name, body.split(":", 1)[0])
            if path.stem.split("_", 1)[1] in ASYNC_COPIES:
                assert re.search(r"\bLDGSTS\b", body), (path.name, body.split(":", 1)[0])


def test_hipcc_builds_the_shown_files(shown, tmp_path):
    hipcc = knobs.hipcc()
    if not hipcc or not shutil.which(hipcc):
        pytest.skip("hipcc is not installed: apt-get install -y --no-install-recommends hipcc libamdhip64-dev")
    env = dict(os.environ, HIP_PLATFORM="amd")
    done = subprocess.run([hipcc, "-x", "hip", "--offload-arch=gfx90a", "-c", "-save-temps", *map(str, shown["hip"])],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all((tmp_path / f"{path.stem}.o").is_file() for path in shown["hip"])
    for path in shown["hip"]:   # igemm's matrix kernels issue gfx90a's v_mfma_f32_16x16x16{bf16_1k,f16}
        if path.stem.split("_", 1)[1] not in LOW_PRECISION:
            continue
        assembly = next(tmp_path.glob(f"{path.stem}*gfx90a*.s")).read_text()
        gemms = [f for f in re.split(r"\n(?=_ZN\w+:)", assembly) if re.match(GEMM_KERNEL + r"\w*:", f)]
        assert gemms, f"{path.name}: no matrix kernel in the assembly"
        for body in gemms:
            assert re.search(r"v_mfma_f32_16x16x16(bf16_1k|f16)\b", body), (path.name, body.split(":", 1)[0])


# ------------------------------------------------------------------------------- explain

CPU_WORDS = ("register tile", "vector", "OpenMP", "L1", "L2", "zero-padded", "lanes", "parallel over")


@pytest.mark.parametrize("target", ["cuda-sm_80", "cuda-sm_90", "hip-gfx90a", "hip-gfx940"])
@pytest.mark.parametrize("op", ["fwd", "bwd_data", "bwd_weight", "bwd_bias"])
def test_explain_gives_gpu_reasons(target, op):
    code, out, err = run_cli("explain", "--input", "8,64,56,56", "--weight", "128,64,3,3", "--padding", "1",
                             "--bias", "--op", op, "--target", target)
    assert code == 0, err
    decisions = out.split("decisions, pass by pass:")[1]
    assert "[algorithm] GPU " in decisions and "threads per block" in decisions
    warp = "64" if target.startswith("hip") else "32"
    assert f"warp {warp}" in decisions
    for word in CPU_WORDS:
        assert word not in decisions, f"a CPU reason in explain --target {target}: {word!r}\n{decisions}"
    assert "kernel:      conv2d_" in out and "self-contained" in out and "stream)" in out


@pytest.mark.parametrize("op, words", [
    ("fwd", ["tensor cores", "4 warps of 32", "tile 128x128x64, 3 stages (96 KiB shared)", "warp tile 64x64",
             "B by 16-byte cp.async copies", "data visible to the warps only after the copies' wait and a barrier"]),
    ("bwd_data", ["stride phases", "4 stride phases (4 with taps"]),
    ("bwd_weight", ["split-K", "split the batch x", "partials in a workspace summed in split order"]),
])
def test_explain_bf16_on_cuda_sm_90_gives_the_igemm_reasons(op, words):
    code, out, err = run_cli("explain", "--input", "8,64,56,56", "--weight", "128,64,3,3", "--padding", "1",
                             "--stride", "2", "--op", op, "--target", "cuda-sm_90", "--dtype", "bf16")
    assert code == 0, err
    decisions = out.split("decisions, pass by pass:")[1]
    assert "): igemm (" in decisions and "candidates ['igemm', 'direct']" in decisions
    assert "algorithm:   igemm" in out
    for word in words:
        assert word in decisions, (word, decisions)
    for word in CPU_WORDS:
        assert word not in decisions, f"a CPU reason in explain --target cuda-sm_90: {word!r}\n{decisions}"


@pytest.mark.parametrize("flags, op, algorithm", [
    (["--input", "8,32,56,56", "--weight", "32,1,3,3", "--groups", "32", "--padding", "1"], "bwd_data", "depthwise"),
    (["--input", "8,3,224,224", "--weight", "64,3,7,7", "--stride", "2", "--padding", "3"], "bwd_weight", "stem"),
])
@pytest.mark.parametrize("target", ["cuda-sm_90", "hip-gfx90a"])
def test_explain_depthwise_and_stem(flags, op, algorithm, target):
    code, out, err = run_cli("explain", *flags, "--op", op, "--target", target, "--dtype", "bf16")
    assert code == 0, err
    decisions = out.split("decisions, pass by pass:")[1]
    assert f"): {algorithm} (" in decisions and f"algorithm:   {algorithm}" in out
    assert "threads per block" in decisions and "split" in decisions
    for word in CPU_WORDS:
        assert word not in decisions, f"a CPU reason in explain --target {target}: {word!r}\n{decisions}"


@pytest.mark.parametrize("dtype, target", [("f32", "cuda-sm_90"), ("f64", "cuda-sm_90"), ("f64", "hip-gfx90a"),
                                           ("f32", "hip-gfx90a")])
def test_explain_f32_and_f64_take_igemm(dtype, target):
    # (the tests run with torch's tf32 switch off: f32 in f32)
    code, out, err = run_cli("explain", "--input", "2,4,7,7", "--weight", "6,4,3,3", "--dtype", dtype, "--target", target)
    assert code == 0, err
    assert "algorithm:   igemm (candidates: igemm, direct)" in out, out
    if (dtype, target) == ("f32", "hip-gfx90a"):   # true f32 on v_mfma_f32_16x16x4f32
        assert "f32 on the matrix cores (the target's matrix instruction)" in out and "f32 matrix" in out, out
        return
    if (dtype, target) == ("f64", "cuda-sm_90"):   # f64 on DMMA
        assert "f64 on the f64 tensor cores (mma.sync m8n8k4 .f64, DMMA)" in out and "f64 matrix" in out, out
        return
    if (dtype, target) == ("f64", "hip-gfx90a"):   # f64 on v_mfma_f64_16x16x4f64
        assert "f64 on the matrix cores (v_mfma_f64_16x16x4f64)" in out and "f64 matrix 47.85" in out, out
        return
    units = "CUDA cores" if target.startswith("cuda") else "SIMDs"
    assert f"{dtype} on the {units}" in out, out
    assert "keeps 32 results in registers" in out if target.startswith("cuda") else "keeps 16 results in registers" in out


# ------------------------------------------------------------------------------- build


def test_build_prints_artifact_and_resources():
    flags = ["--input", "2,4,6,6", "--weight", "4,4,3,3", "--op", "bwd_weight", "--bias"]
    if knobs.nvcc() and shutil.which(knobs.nvcc()):
        code, out, err = run_cli("build", *flags, "--target", "cuda-sm_90")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].endswith(".cubin") and os.path.isfile(lines[0])
        assert "registers" in out and "spill" in out
    if knobs.hipcc() and shutil.which(knobs.hipcc()):
        code, out, err = run_cli("build", *flags, "--target", "hip-gfx90a")
        assert code == 0, err
        assert out.splitlines()[0].endswith(".o") and "VGPRs" in out and "LDS" in out
    code, out, err = run_cli("build", *flags, "--target", "hip", "--sim")
    assert code == 0, err
    assert out.strip().endswith(".so")


@pytest.mark.parametrize("target, compiler, variable", [("cuda-sm_80", "nvcc", "CONVGEN_NVCC"),
                                                        ("hip-gfx90a", "hipcc", "CONVGEN_HIPCC")])
def test_build_without_the_compiler_names_it(target, compiler, variable, monkeypatch, tmp_path):
    flags = ["--input", "1,2,5,5", "--weight", "3,2,3,3", "--target", target, "--force"]
    for name in ("CONVGEN_NVCC", "CONVGEN_HIPCC", "CUDA_HOME", "CUDA_PATH", "ROCM_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))     # an empty directory: no compiler on PATH
    code, out, err = run_cli("build", *flags)
    assert code == 1 and out == ""
    assert f"{compiler} not found" in err and variable in err
    monkeypatch.setenv(variable, str(tmp_path / "missing" / compiler))
    code, out, err = run_cli("build", *flags)
    assert code == 1 and variable in err and "does not exist" in err


# ------------------------------------------------------------------------------- check

CHECKED = ["--input", "2,4,6,5", "--weight", "6,2,3,2", "--groups", "2", "--stride", "2", "--padding", "1"]


@pytest.mark.parametrize("target, dtype", [("cuda-sm_80", "f32"), ("hip", "bf16"), ("cpu", "f64")])
def test_check_runs_every_pass(target, dtype):
    code, out, err = run_cli("check", *CHECKED, "--target", target, "--dtype", dtype,
                             *(["--sim"] if not target.startswith("cpu") else []))
    assert code == 0, out + err
    lines = out.strip().splitlines()
    assert len(lines) == 6 and all(line.endswith(" ok") for line in lines[1:]), out
    for name in ("fwd", "bwd_data", "bwd_weight", "bwd_bias (fused)", "bwd_bias (alone)"):
        assert any(line.startswith(name) for line in lines[1:]), out
    if target != "cpu":
        # 2 channels and 3 filters a group: the depthwise family's kernels (a few channels a group), the
        # weight gradient's partials and ordered sum 2 launches (the bias gradient fused into them), bwd_data
        # 4 stride phases; the bias gradient alone 1
        launches = 1 + 4 + 2 + 1
        assert "simulated launches" in lines[0] and f"{launches} simulated launches" in lines[0]


def test_check_fails_when_out_of_tolerance(monkeypatch):
    monkeypatch.setattr(check, "TOLERANCE", {k: 0.0 for k in check.TOLERANCE})
    code, out, err = run_cli("check", *CHECKED, "--target", "cuda-sm_80", "--sim")
    assert code == 1 and out.count("FAIL") == 5, out + err


def test_check_of_a_gpu_target_needs_sim():
    code, out, err = run_cli("check", *CHECKED, "--target", "hip-gfx90a")
    assert code == 2 and "--sim" in err and "hip-gfx90a" in err


# ------------------------------------------------------------------------------- simulator builds


def test_simulator_builds_are_keyed_by_vendor_arch_and_warp():
    problem = ConvProblem(Op.FWD, 1, 2, 3, (5, 5), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1),
                          dtype=DType.F32, input_layout=Layout.CONTIGUOUS).validate()
    sources = {t: emit(lower(problem, parse_target(t))) for t in ("cuda-sm_90", "cuda-sm_80", "hip-gfx90a", "cpu")}
    keys = {t: build.source_key(s) for t, s in sources.items()}
    assert len(set(keys.values())) == 4
    commands = {t: build.compile_command("a.cu", "a.so", s.target) for t, s in sources.items()}
    assert "-DCONVGEN_SIM" in commands["cuda-sm_90"] and "-DCONVGEN_SIM_WARP=32" in commands["cuda-sm_90"]
    assert "-DCONVGEN_SIM_WARP=64" in commands["hip-gfx90a"]
    assert "-DCONVGEN_SIM" not in commands["cpu"]
    # the simulator's header comes precompiled and its own functions compiled, once per cache, compiler
    # and header version; the kernel file declares them (CONVGEN_SIM_SPLIT) and links the object
    command = commands["hip-gfx90a"]
    assert "-DCONVGEN_SIM_SPLIT" in command
    pch = command[command.index("-DCONVGEN_SIM_SPLIT") + 2]
    assert "sim-pch" in pch and os.path.isfile(os.path.join(pch, "sim", "simt.h.gch"))
    runtime = os.path.join(pch, "sim", "runtime.o")
    assert os.path.isfile(runtime) and command[command.index(runtime) - 2:command.index(runtime)] == ["-x", "none"]
    assert sources["cuda-sm_90"].language == "cuda" and sources["hip-gfx90a"].language == "hip"
