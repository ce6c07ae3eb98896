"""codegen/gpu/resources.py: the vendor compilers' reports parsed per kernel, occupancy from an
arch's limits, the roofline bound, and `convgen explain --target cuda-sm_90|hip-gfx90a` printing
them (from the compiler's report when the compiler is here, else saying it is unavailable)."""

from __future__ import annotations

import contextlib
import io
import shutil

import pytest

from convgen import cli, knobs
from convgen.codegen.gpu.resources import blocks_per_sm, parse_report, roofline, short_name
from convgen.codegen.arch.gpu import GPU_ARCHS

PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN3cgk3fwdEPKtS1_S1_Ptx' for 'sm_90'
ptxas info    : Function properties for _ZN3cgk3fwdEPKtS1_S1_Ptx
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compiling entry function '_ZN3cgk14bwd_weight_sumEPKfPt' for 'sm_90'
ptxas info    : Function properties for _ZN3cgk14bwd_weight_sumEPKfPt
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 31 registers, used 0 barriers
"""
HIPCC = """k.cu:388:1: remark: Function Name: _ZN3cgk3fwdEPKtS1_S1_Ptx [-Rpass-analysis=kernel-resource-usage]
k.cu:388:1: remark:     SGPRs: 68 [-Rpass-analysis=kernel-resource-usage]
k.cu:388:1: remark:     VGPRs: 97 [-Rpass-analysis=kernel-resource-usage]
k.cu:388:1: remark:     AGPRs: 36 [-Rpass-analysis=kernel-resource-usage]
k.cu:388:1: remark:     ScratchSize [bytes/lane]: 0 [-Rpass-analysis=kernel-resource-usage]
k.cu:388:1: remark:     Occupancy [waves/SIMD]: 3 [-Rpass-analysis=kernel-resource-usage]
k.cu:388:1: remark:     SGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
k.cu:388:1: remark:     VGPRs Spill: 2 [-Rpass-analysis=kernel-resource-usage]
k.cu:388:1: remark:     LDS Size [bytes/block]: 512 [-Rpass-analysis=kernel-resource-usage]
remark: k.cu:400:0: Function Name: _ZN3cgk8bwd_dataEPKt [-Rpass-analysis=kernel-resource-usage]
remark: k.cu:400:0:     VGPRs: 64 [-Rpass-analysis=kernel-resource-usage]
remark: k.cu:400:0:     AGPRs: 0 [-Rpass-analysis=kernel-resource-usage]
remark: k.cu:400:0:     ScratchSize [bytes/lane]: 0 [-Rpass-analysis=kernel-resource-usage]
"""   # the second kernel in the form hipcc prints with -save-temps


def test_reports_are_parsed_per_kernel():
    fwd, total = parse_report(PTXAS, "cuda")
    assert (short_name(fwd.name), fwd.registers, fwd.spill_bytes, fwd.static_shared) == ("fwd", 168, 12, 1024)
    assert (short_name(total.name), total.registers, total.spill_bytes, total.static_shared) == ("bwd_weight_sum", 31, 0, 0)
    hip, second = parse_report(HIPCC, "hip")
    assert (short_name(hip.name), hip.registers, hip.spill_bytes, hip.static_shared) == ("fwd", 133, 2, 512)
    assert (short_name(second.name), second.registers, second.spill_bytes) == ("bwd_data", 64, 0)


def test_occupancy_follows_the_arch_limits():
    h100, a100, mi250 = GPU_ARCHS["sm_90"], GPU_ARCHS["sm_80"], GPU_ARCHS["gfx90a"]
    # 168 registers x 32 lanes = 5376 per warp (a multiple of 256), 4 warps: 65536 // 21504 = 3 blocks
    assert blocks_per_sm(h100, 128, 168, 61440) == (3, "registers")
    # 80 KiB + 1 KiB reserved per block of A100's 164 KiB: 2 blocks
    assert blocks_per_sm(a100, 128, 64, 81920) == (2, "shared memory")
    assert blocks_per_sm(h100, 256, 32, 0) == (8, "threads")
    # 133 VGPRs -> 136: 3 waves per SIMD, 12 per CU, blocks of 4 waves: 3 (as hipcc's own "Occupancy 3")
    assert blocks_per_sm(mi250, 256, 133, 0) == (3, "registers")


def test_the_roofline_names_the_bound():
    h100 = GPU_ARCHS["sm_90"]
    assert roofline(h100, 10**12, 10**6, "matrix16").startswith("compute-bound")
    assert roofline(h100, 10**9, 10**9, "matrix16").startswith("memory-bound")
    assert "989" in roofline(h100, 1, 1, "matrix16") and "3.35 TB/s" in roofline(h100, 1, 1, "f32")
    assert "no datasheet figures" in roofline(GPU_ARCHS["sm_86"], 1, 1, "f32")


def _explain(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["explain", *argv]) == 0
    return out.getvalue()


FLAGS = ["--input", "4,16,10,10", "--weight", "32,16,3,3", "--padding", "1", "--dtype", "bf16", "--layout", "nhwc"]


@pytest.mark.parametrize("target,compiler", [("cuda-sm_90", "nvcc"), ("hip-gfx90a", "hipcc")])
def test_explain_reports_resources_occupancy_and_bound(target, compiler):
    text = _explain(*FLAGS, "--op", "fwd", "--target", target)
    section = text.split(f"resources on {target}", 1)[1]
    assert "roofline (4 images):" in section and "-bound:" in section
    found = knobs.nvcc() if compiler == "nvcc" else knobs.hipcc()
    if not found or not shutil.which(found):
        assert "compiler report: unavailable" in section
        pytest.skip(f"{compiler} is not installed: the report's figures are not checked")
    assert "fwd: " in section and " registers, 0 bytes spilled" in section and "% occupancy" in section
    assert "dynamic): " in section and "block(s) per" in section


def test_explain_without_the_compiler_says_the_report_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("CONVGEN_NVCC", str(tmp_path / "no-nvcc"))
    text = _explain(*FLAGS, "--op", "bwd_weight", "--target", "cuda-sm_80")
    assert "compiler report: unavailable (nvcc" in text
    assert "roofline (4 images):" in text
