"""codegen/gpu/resources.py: the vendor compilers' reports parsed per kernel, occupancy from an
arch's limits, the roofline bound, and `convgen explain --target cuda-sm_90|hip-gfx90a` printing
them (from the compiler's report when the compiler is here, else saying it is unavailable); the
main loops read in the machine code (runtime/building/machine_code.py) and the bound their issue
rate sets."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shutil

import pytest

from convgen import cli, knobs
from convgen.building import machine_code
from convgen.codegen.gpu.resources import blocks_per_sm, loop_bound, loop_line, parse_report, roofline, short_name
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


# ------------------------------------------------------------------ main loops in machine code

# nvdisasm's text in the shape it prints: a kernel whose main loop (.L_x_1 .. the BRA back to it)
# holds two HMMA.16816, an LDSM, an LDGSTS, and a gather loop nested in it (.L_x_2); a loop
# without tensor instructions before it; and a function without any.
SASS = """
        .text._ZN3cgk3fwdEv:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/                   ISETP.GE.AND P0, PT, R2, 0x4, PT ;
        /*0030*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0040*/                   LDGSTS.E.BYPASS.LTC128B.128 [R3], desc[UR4][R4.64] ;
        /*0050*/                   LDSM.16.M88.4 R8, [R5] ;
        /*0060*/                   HMMA.16816.F32.BF16 R12, R8, R10, R12 ;
        /*0070*/                   HMMA.16816.F32.BF16 R16, R8, R11, R16 ;
        /*0080*/               @P1 BRA `(.L_x_3) ;
.L_x_2:
        /*0090*/                   LDG.E.U16 R6, desc[UR4][R4.64] ;
        /*00a0*/                   STS.U16 [R3], R6 ;
        /*00b0*/               @P2 BRA `(.L_x_2) ;
.L_x_3:
        /*00c0*/                   IADD3 R7, R7, 0x1, RZ ;
        /*00d0*/               @P3 BRA `(.L_x_1) ;
        /*00e0*/                   EXIT ;
        .text._ZN3cgk4copyEv:
        /*0000*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0010*/                   EXIT ;
"""


def test_the_main_loop_is_the_longest_tensor_loop_without_its_nested_loops():
    bodies = machine_code.functions(SASS)
    assert set(bodies) == {"_ZN3cgk3fwdEv", "_ZN3cgk4copyEv"}
    loop = machine_code.main_loop(bodies["_ZN3cgk3fwdEv"])
    assert loop[0].startswith("LDGSTS") and loop[-1] == "@P3 BRA `(.L_x_1)"
    outer, inner = machine_code.main_loop_parts(bodies["_ZN3cgk3fwdEv"])
    assert [x.split()[0] for x in inner] == ["LDG.E.U16", "STS.U16", "@P2"]
    mix = machine_code.loop_mix(bodies["_ZN3cgk3fwdEv"])
    assert (mix.total, mix.tensor, mix.multiply_adds, mix.ldsm, mix.ldgsts, mix.nested) == (7, 2, 4096, 1, 1, 3)
    assert mix.other == 5 and mix.per_2048 == 2.5
    assert machine_code.loop_mix(bodies["_ZN3cgk4copyEv"]) is None


# A warp-specialised consumer's loop as ptxas lays it out: the mbarrier wait's first phase check in
# the loop, its retries out of line (.L_x_4, back to the check: a loop nested in the main loop), the
# warpgroup MMAs, the release of the previous stage; an element gather loop nested too.
WS_SASS = """
        .text._ZN3cgk3fwdEv:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   SHF.L.U32 R9, R3, 0x1f, RZ ;
.L_x_5:
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R14+URZ], R9 ;
        /*0030*/              @!P0 BRA `(.L_x_4) ;
.L_x_6:
        /*0040*/                   WARPGROUP.ARRIVE ;
        /*0050*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0060*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR8], R88, gsb0 ;
        /*0070*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0080*/               @P2 BRA `(.L_x_3) ;
.L_x_2:
        /*0090*/                   LDS.U16 R6, [R3] ;
        /*00a0*/               @P2 BRA `(.L_x_2) ;
.L_x_3:
        /*00b0*/                   SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R7+URZ], RZ ;
        /*00c0*/               @P3 BRA `(.L_x_1) ;
        /*00d0*/                   EXIT ;
.L_x_4:
        /*00e0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R14+URZ], R9 ;
        /*00f0*/              @!P0 BRA `(.L_x_4) ;
        /*0100*/                   BRA `(.L_x_6) ;
"""


def test_an_mbarrier_waits_retries_are_told_from_the_loops_nested_in_the_main_loop():
    body = machine_code.functions(WS_SASS)["_ZN3cgk3fwdEv"]
    assert [x.split()[0] for x in machine_code.wait_loops(body)] == ["SYNCS.PHASECHK.TRANS64.TRYWAIT", "@!P0"]
    mix = machine_code.loop_mix(body)
    # the loop: the shift, the first check and its branch, the fence, 2 HGMMA, the MMA wait, the branch
    # around the gathers, the arrival, the back edge, and the retries' jump back into it; nested: the
    # gathers (2), the retries (2)
    assert (mix.total, mix.tensor, mix.nested, mix.waits) == (11, 2, 2, 2)
    assert mix.multiply_adds == 2 * 64 * 128 * 16 // 4
    line = loop_line(GPU_ARCHS["sm_90a"], "matrix16", mix)
    assert "the mbarrier waits' retries (2 instructions in loops nested in it) run only while a stage is not ready" in line
    assert "and 2 instructions in loops nested in it: the element gathers" in line


# hipcc's device assembly, shaped as its main loops are: the loop rotated (its header, .LBB0_3, after
# a block of its body, which the header's conditional branch jumps back to), an element loop nested in
# it, and an exit block after.
AMDGCN = """	.text
_ZN3cgk3fwdEv:                          ; @_ZN3cgk3fwdEv
; %bb.0:
	s_load_dwordx4 s[0:3], s[4:5], 0x0
	s_branch .LBB0_3
.LBB0_1:                                ;   in Loop: Header=BB0_3 Depth=1
	ds_read_b128 v[4:7], v1
	v_mfma_f32_16x16x16bf16_1k v[8:11], v[4:5], v[6:7], v[8:11]
	v_mfma_f32_16x16x16bf16_1k v[8:11], v[4:5], v[6:7], v[8:11]
	v_add_u32_e32 v1, 64, v1
.LBB0_2:                                ;   Parent Loop BB0_3 Depth=1
	ds_write_b16 v2, v3
	s_add_i32 s6, s6, -1
	s_cbranch_scc1 .LBB0_2
.LBB0_3:                                ; =>This Loop Header: Depth=1
	global_load_dwordx4 v[12:15], v[16:17], off
	s_waitcnt vmcnt(0)
	s_barrier
	s_cmp_lg_u32 s7, 0
	s_cbranch_scc1 .LBB0_1
; %bb.4:
	global_store_dword v[16:17], v8, off
	s_endpgm
.Lfunc_end0:
	.size	_ZN3cgk3fwdEv, .Lfunc_end0-_ZN3cgk3fwdEv
_ZN3cgk4copyEv:
	global_load_dword v1, v[2:3], off
	s_endpgm
.Lfunc_end1:
"""


def test_hipcc_assembly_main_loop_found_in_a_rotated_loop():
    bodies = machine_code.amd_functions(AMDGCN)
    assert set(bodies) == {"_ZN3cgk3fwdEv", "_ZN3cgk4copyEv"}
    outer, inner = machine_code.main_loop_parts(bodies["_ZN3cgk3fwdEv"], amd=True)
    assert [x.split()[0] for x in inner] == ["ds_write_b16", "s_add_i32", "s_cbranch_scc1"]
    assert "s_endpgm" not in [x.split()[0] for x in outer] and "s_load_dwordx4" not in [x.split()[0] for x in outer]
    mix = machine_code.loop_mix(bodies["_ZN3cgk3fwdEv"], amd=True)
    assert (mix.total, mix.tensor, mix.multiply_adds, mix.ldsm, mix.ldgsts, mix.nested) == (9, 2, 8192, 1, 1, 3)
    assert machine_code.loop_mix(bodies["_ZN3cgk4copyEv"], amd=True) is None
    line = loop_line(GPU_ARCHS["gfx90a"], "matrix16", mix)
    assert "2 MFMA (8192 multiply-adds), 1 ds_read_b128, 1 global_load_dwordx4, 5 other; MFMA : other 1 : 3.50" in line


@pytest.mark.parametrize("instruction, macs", [
    ("v_mfma_f32_16x16x16bf16_1k v[8:11], v[4:5], v[6:7], v[8:11]", 16 * 16 * 16),
    ("v_mfma_f32_16x16x16_bf16 v[8:11], v[4:5], v[6:7], v[8:11]", 16 * 16 * 16),
    ("v_mfma_f32_16x16x4f32 a[0:3], v1, v2, a[0:3]", 16 * 16 * 4), ("v_mfma_f64_16x16x4f64 v[0:7], v[8:9], v[10:11], v[0:7]", 16 * 16 * 4),
    ("HMMA.16816.F32.BF16 R12, R8, R10, R12", 16 * 8 * 16), ("@P0 HMMA.1688.F32.TF32 R4, R8, R10, R4", 16 * 8 * 8),
    ("DMMA.8x8x4 R4, R8, R10, R4", 8 * 8 * 4), ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24", 64 * 128 * 16 // 4),
    ("IADD3 R1, R2, R3, RZ", 0), ("LDSM.16.M88.4 R8, [R5]", 0),
])
def test_multiply_adds_per_tensor_instruction(instruction, macs):
    assert machine_code.multiply_adds(instruction) == macs


def test_a_loop_is_issue_bound_when_it_issues_more_than_the_tensor_cores_consume():
    h100, a100 = GPU_ARCHS["sm_90"], GPU_ARCHS["sm_80"]
    mix = machine_code.LoopMix(total=64 * 10, tensor=64, multiply_adds=64 * 2048, ldsm=16, ldgsts=8, nested=0)
    # H100: an HMMA.16816 a clock an SM; 10 instructions an HMMA issue in 2.5 clocks: 40%
    which, fraction = loop_bound(h100, "matrix16", mix)
    assert which == "issue" and abs(fraction - 0.4) < 1e-9
    # A100 does half the multiply-adds a clock: the same loop keeps up to 80%
    which, fraction = loop_bound(a100, "matrix16", mix)
    assert which == "issue" and abs(fraction - 0.8) < 1e-9
    lean = machine_code.LoopMix(total=64 * 3, tensor=64, multiply_adds=64 * 2048, ldsm=16, ldgsts=8, nested=0)
    assert loop_bound(h100, "matrix16", lean) == ("tensor", 1.0)
    assert loop_bound(GPU_ARCHS["sm_86"], "matrix16", mix) is None   # no peaks for that part here
    line = loop_line(h100, "matrix16", mix)
    assert "640 instructions: 64 tensor" in line and "9.0 non-tensor per 2048" in line and "at 40% of" in line
    assert "below" in loop_line(h100, "matrix16", dataclasses.replace(mix, nested=5), gathers=True)


def _explained_loops(target: str, numbers: str):
    """Per pass: explain's text for FLAGS on `target`, its GEMM kernel's main-loop line, and the six
    counts and one figure `numbers` (a pattern of that line) takes from it."""
    for op, kernel in (("fwd", "fwd"), ("bwd_data", "bwd_data"), ("bwd_weight", "bwd_weight_partial")):
        text = _explain(*FLAGS, "--op", op, "--target", target)
        line = re.search(rf"\n  {kernel}: .*\n    (main loop \(machine code.*)", text)
        assert line, text
        m = re.search(numbers, line.group(1))
        assert m, line.group(1)
        yield text, line.group(1), (*map(int, m.groups()[:6]), float(m.group(7)))


def test_explain_prints_each_matrix_kernels_main_loop_from_its_machine_code():
    nvcc = knobs.nvcc()
    if not nvcc or not shutil.which(nvcc) or machine_code.nvdisasm() is None:
        pytest.skip("nvcc or nvdisasm is not installed: the machine code is not read")
    numbers = (r"(\d+) instructions: (\d+) tensor \((\d+) multiply-adds\), (\d+) LDSM, (\d+) LDGSTS, "
               r"(\d+) other; ([\d.]+) non-tensor per 2048")
    for _, line, (total, tensor, macs, ldsm, ldgsts, other, per) in _explained_loops("cuda-sm_90", numbers):
        assert tensor > 0 and macs == tensor * 2048 and ldsm > 0 and total == tensor + ldsm + ldgsts + other
        assert abs(per - (total - tensor) * 2048 / macs) < 0.06
        assert "% of the matrix peak" in line or "tensor-bound" in line


def test_explain_prints_a_hip_kernels_main_loop_from_hipccs_assembly():
    if not knobs.hipcc() or not shutil.which(knobs.hipcc()):
        pytest.skip("hipcc is not installed: no report to read beside")
    numbers = (r"a k-step a wave\): (\d+) instructions: (\d+) MFMA \((\d+) multiply-adds\), (\d+) ds_read_b128, "
               r"(\d+) global_load_dwordx4, (\d+) other; MFMA : other 1 : ([\d.]+)")
    for text, _, (total, mfma, macs, reads, copies, other, ratio) in _explained_loops("hip-gfx90a", numbers):
        assert mfma > 0 and macs == mfma * 4096 and reads > 0 and total == mfma + reads + copies + other
        assert abs(ratio - (total - mfma) / mfma) < 0.006
        assert "main loops: not read" not in text
