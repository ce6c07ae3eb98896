"""ldmatrix (templates/gpu/cuda.h's convgen_ldmatrix_x1/x2/x4 and _trans) and its emulation in the
simulator (templates/gpu/sim/mma.h), against the PTX ISA's definition computed here in Python.

One warp loads 32 rows of 8 16-bit elements staged in shared memory, each lane naming a row out of
order (lane l: row 5 l mod 32), and writes its registers out. Lane 8 j + i gives row i of matrix j;
lane l receives of matrix j the elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1), low half
first, or with .trans (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4). The checks see each row as its
lane's 16-byte shared load: a row off 16 bytes faults, a row another warp writes without a barrier
is a race. nvcc builds every variant into LDSM instructions.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from convgen.building import sim_build
from convgen.codegen.errors import SimulatorError
from convgen.devices import sim

VARIANTS = [(num, trans) for num in (1, 2, 4) for trans in (False, True)]
KERNEL = r"""
#include "cuda.h"
// MODE 0: right; 1: every row 2 bytes off its 16-byte boundary; 2: warp 1 writes the rows warp 0
// loads, with no barrier between
template <int MODE>
__global__ void load_rows(const unsigned short* src, unsigned* out) {
    CONVGEN_SHARED(unsigned short, tile, [33 * 8]);
    if (MODE != 2 || threadIdx.x >= 32)
        for (int e = threadIdx.x % 32; e < 32 * 8; e += 32) tile[e + (MODE == 1 ? 1 : 0)] = src[e];
    if (MODE != 2) __syncthreads();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    const unsigned short* row = tile + (lane * 5) % 32 * 8 + (MODE == 1 ? 1 : 0);
    unsigned r[LDM_NUM];
    LDM_LOAD(r, row);
    for (int j = 0; j < LDM_NUM; ++j) out[j * 32 + lane] = r[j];
}
extern "C" int run(const unsigned short* src, unsigned* out, int mode) {
    return mode == 0 ? CONVGEN_LAUNCH(load_rows<0>, 1, 32, 0, 0, src, out)
         : mode == 1 ? CONVGEN_LAUNCH(load_rows<1>, 1, 32, 0, 0, src, out)
                     : CONVGEN_LAUNCH(load_rows<2>, 1, 64, 0, 0, src, out);
}
"""


def _source(num: int, trans: bool) -> str:
    return f"#define LDM_NUM {num}\n#define LDM_LOAD convgen_ldmatrix_x{num}{'_trans' if trans else ''}\n" + KERNEL


def expected(src: torch.Tensor, num: int, trans: bool) -> torch.Tensor:
    """The registers by the PTX ISA's definition: out[j * 32 + lane]."""
    rows = src.view(32, 8).to(torch.int64) & 0xFFFF
    out = torch.zeros(num * 32, dtype=torch.int64)
    for j in range(num):
        matrix = torch.stack([rows[(8 * j + i) * 5 % 32] for i in range(8)])   # row i from lane 8j + i
        for lane in range(32):
            g, c = lane // 4, 2 * (lane % 4)
            lo, hi = (matrix[c, g], matrix[c + 1, g]) if trans else (matrix[g, c], matrix[g, c + 1])
            out[j * 32 + lane] = lo | hi << 16
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if sim_build.fp16_include_dir() is None:
        pytest.skip("NVIDIA's cuda_fp16.h (CUDA toolkit) not found: cuda.h's matrix wrappers need it")
    d = tmp_path_factory.mktemp("ldmatrix")
    return {(num, trans): sim.build(_source(num, trans), d, f"ldmatrix_{num}_{int(trans)}", "cuda")
            for num, trans in VARIANTS}


@pytest.mark.parametrize("num,trans", VARIANTS)
@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
def test_each_lane_receives_its_words_of_the_rows_the_lanes_name(libs, num, trans, order):
    src = torch.randint(-(1 << 15), 1 << 15, (32 * 8,), dtype=torch.int16, generator=torch.Generator().manual_seed(num))
    out = torch.zeros(num * 32, dtype=torch.int32)
    libs[num, trans].call("run", sim.pointer(src, "src"), sim.pointer(out, "out"), 0, order=order, seed=7)
    assert torch.equal(out.to(torch.int64) & 0xFFFFFFFF, expected(src, num, trans))


@pytest.mark.parametrize("num,trans", [(4, False), (2, True)])
def test_a_misaligned_row_faults_and_an_unordered_row_is_a_race(libs, num, trans):
    src = torch.zeros(32 * 8, dtype=torch.int16)
    out = torch.zeros(num * 32, dtype=torch.int32)
    with pytest.raises(SimulatorError, match="ldmatrix's row.*not aligned to its 16 bytes"):
        libs[num, trans].call("run", sim.pointer(src, "src"), sim.pointer(out, "out"), 1)
    for order in ("forward", "reverse", "shuffle"):
        with pytest.raises(SimulatorError, match="race"):
            libs[num, trans].call("run", sim.pointer(src, "src"), sim.pointer(out, "out"), 2, order=order)


def test_the_rows_of_a_conflict_free_layout_take_one_wavefront_per_matrix(libs):
    """8 rows 16 bytes apart in banks (consecutive 16-byte rows cover all 32 banks) take one shared
    wavefront per matrix, and the profile says so: 4 per x4."""
    src = torch.zeros(32 * 8, dtype=torch.int16)
    out = torch.zeros(4 * 32, dtype=torch.int32)
    launches = libs[4, False].call("run", sim.pointer(src, "src"), sim.pointer(out, "out"), 0, profile=True)
    (launch,) = launches
    # the staging stores (8 requests of 2-byte stores) and the ldmatrix (one request of 4 phases)
    assert launch["shared_wavefronts"] == launch["shared_ideal"]
    assert launch["shared_requests"] == 9 and launch["shared_ideal"] == 8 + 4


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
def test_nvcc_builds_every_variant_into_ldsm(tmp_path):
    from support.toolchain import cuda_tool
    nvdisasm = cuda_tool("nvdisasm")
    if nvdisasm is None:
        pytest.skip("nvdisasm not found (CUDA toolkit or `pip install nvidia-cuda-nvdisasm`): machine code not checked")
    for num, trans in VARIANTS:
        src = tmp_path / f"l{num}{int(trans)}.cu"
        src.write_text(_source(num, trans))
        cubin = tmp_path / f"l{num}{int(trans)}.cubin"
        subprocess.run(["nvcc", "-arch=sm_80", "-cubin", "-I", str(sim_build.gpu_templates_dir()), str(src),
                        "-o", str(cubin)], check=True, capture_output=True)
        sass = subprocess.run([nvdisasm, str(cubin)], capture_output=True, text=True, check=True).stdout
        shape = ("MT88" if trans else "M88") + ("" if num == 1 else f".{num}")   # SASS: LDSM.16.MT88.4 is .x4.trans
        assert re.search(rf"LDSM\.16\.{re.escape(shape)} ", sass), f"no LDSM.16.{shape} for x{num}{' .trans' * trans}"
