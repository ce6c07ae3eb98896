"""The warpgroup MMA wrappers (templates/gpu/cuda.h, convgen_wgmma*) and the simulator's emulation of
wgmma.mma_async (templates/gpu/sim/wgmma.h): descriptors, the 128-, 64- and 32-byte swizzles, K-major
and MN-major operands, the accumulators' layout, and the instruction's asynchrony.

A small kernel places A (64 x K) and B (K x N) in shared memory by its own formulas -- the implicit
GEMM's (igemm.cu.j2 tile_at: chunk ^ row / SWIZZLE_ROWS % SWIZZLE_CHUNKS; tile_mn: 64-element blocks,
chunk ^ k % 8), written independently of the emulator's address-bit rule -- describes them, multiplies
with one wgmma per 16-deep slice and stores the accumulators where convgen_wgmma_acc_row/_col say:
against torch's product (small integers: exact; random: f32's tolerance) that checks the descriptor
fields, the swizzle, the slices' advance, both transposes and the accumulator layout at once. Reading
the accumulators before the wait reads them as they were, and a stage written while an MMA reads it is
a race, as on the device. The kernel also builds for sm_90a with nvcc (test_device / tests/gpu).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from convgen.codegen.errors import SimulatorError
from convgen.devices import sim

from support.reference import assert_close, generator_for, randn
from support.toolchain import require_fp16

ORDERS = ("forward", "reverse", "shuffle")

KERNEL = r"""
#define CONVGEN_SHARED_ALIGN 1024
#include "cuda.h"
// A: 64 x K (row-major), B^T: N x K (row-major); W: a K-major row's bytes (its swizzle); TA / TB: MN-major.
template <int W> __device__ int k_major(int row, int k) {   // igemm's tile_at for rows of W / 2 elements
    constexpr int CHUNKS = W / 16, SW = CHUNKS < 8 ? CHUNKS : 8, SR = 8 / SW;
    return row * (W / 2) + ((k / 8) ^ (row / SR % SW)) * 8 + k % 8;
}
template <int K> __device__ int mn_major(int k, int mn) {   // igemm's wgmma tile_mn for K rows
    return (mn / 64) * (K * 64) + k * 64 + (((mn % 64) / 8) ^ (k % 8)) * 8 + mn % 8;
}
template <class T, int N, int W, int TA, int TB>
__global__ void mm(const unsigned short* a, const unsigned short* bt, float* c, int mode) {
    constexpr int K = W / 2;
    CONVGEN_DYNAMIC_SHARED(unsigned short, shared);
    unsigned short* sa = shared;
    unsigned short* sb = shared + 64 * K;
    for (int e = threadIdx.x; e < 64 * K; e += 128) sa[TA ? mn_major<K>(e % K, e / K) : k_major<W>(e / K, e % K)] = a[e];
    for (int e = threadIdx.x; e < N * K; e += 128) sb[TB ? mn_major<K>(e % K, e / K) : k_major<W>(e / K, e % K)] = bt[e];
    convgen_fence_async_shared();
    __syncthreads();
    const convgen_wgmma_desc_t da = TA ? convgen_wgmma_desc<128>(sa, K * 128, 1024) : convgen_wgmma_desc<W>(sa, 16, 8 * W);
    const convgen_wgmma_desc_t db = TB ? convgen_wgmma_desc<128>(sb, K * 128, 1024) : convgen_wgmma_desc<W>(sb, 16, 8 * W);
    float acc[N / 2];
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
    convgen_wgmma_fence();
    for (int s = 0; s < K / 16; ++s) convgen_wgmma<T, N, TA, TB>(acc, da + (TA ? 128 * s : 2 * s), db + (TB ? 128 * s : 2 * s));
    convgen_wgmma_commit();
    if (mode == 2) {   // a stage overwritten while the MMA may still read it
        __syncthreads();
        if (threadIdx.x == 0) sa[0] = 0;
    }
    if (mode != 1) convgen_wgmma_wait<0>();   // 1: the accumulators read before the wait
    convgen_wgmma_keep(acc);
    for (int i = 0; i < N / 2; ++i) c[convgen_wgmma_acc_row(threadIdx.x, i) * N + convgen_wgmma_acc_col(threadIdx.x, i)] = acc[i];
    if (mode == 1) convgen_wgmma_wait<0>();
}
#define ENTRY(T, name, N, W, TA, TB)                                                                             \
    extern "C" int wg_##name##_##N##_##W##_##TA##TB(const unsigned short* a, const unsigned short* bt, float* c, int mode) { \
        constexpr int bytes = (64 + N) * (W / 2) * 2;                                                            \
        return CONVGEN_LAUNCH((mm<T, N, W, TA, TB>), dim3(1), dim3(128), bytes, 0, a, bt, c, mode);                \
    }
#define ENTRIES(T, name, N) ENTRY(T, name, N, 128, 0, 0) ENTRY(T, name, N, 64, 0, 0) ENTRY(T, name, N, 32, 0, 0) \
    ENTRY(T, name, N, 128, 1, 0) ENTRY(T, name, N, 128, 0, 1) ENTRY(T, name, N, 128, 1, 1) ENTRY(T, name, N, 64, 1, 1)
ENTRIES(convgen_bf16, bf16, 64)
ENTRIES(convgen_bf16, bf16, 128)
ENTRIES(convgen_f16, f16, 64)
ENTRIES(convgen_f16, f16, 128)
"""

# (N, W, TA, TB): every swizzle K-major, each operand MN-major alone and both, MN-major 32 deep
SHAPES = [(n, w, ta, tb) for n in (64, 128) for (w, ta, tb) in
          ((128, 0, 0), (64, 0, 0), (32, 0, 0), (128, 1, 0), (128, 0, 1), (128, 1, 1), (64, 1, 1))]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    require_fp16()
    return sim.build(KERNEL, tmp_path_factory.mktemp("wgmma"), "wgmma", "cuda")


def _mm(library, dtype, n, w, ta, tb, a, b, mode=0, order="forward"):
    c = torch.full((64, n), float("nan"))
    bt = b.t().contiguous()
    library.call(f"wg_{dtype}_{n}_{w}_{ta}{tb}", sim.pointer(a), sim.pointer(bt), sim.pointer(c), mode,
                 order=order, seed=11)
    return c


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n, w, ta, tb", SHAPES, ids=[f"n{n}-sw{w}-{'M' if ta else 'K'}{'N' if tb else 'K'}" for n, w, ta, tb in SHAPES])
def test_wgmma_places_every_element(library, dtype, n, w, ta, tb):
    """Small integers: every product and sum is exact, so C must equal A B exactly, in every order."""
    g = generator_for(f"wgmma-int-{dtype}-{n}-{w}-{ta}{tb}")
    k = w // 2
    a = torch.randint(-8, 9, (64, k), generator=g).to(DTYPES[dtype])
    b = torch.randint(-8, 9, (k, n), generator=g).to(DTYPES[dtype])
    for order in ORDERS:
        assert torch.equal(_mm(library, dtype, n, w, ta, tb, a, b, order=order), a.float() @ b.float()), order


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_wgmma_accumulates_in_f32(library, dtype):
    g = generator_for(f"wgmma-rand-{dtype}")
    a, b = randn((64, 64), DTYPES[dtype], g), randn((64, 128), DTYPES[dtype], g)
    c = _mm(library, dtype, 128, 128, 0, 1, a, b)
    assert_close(c, a.double() @ b.double(), torch.float32, f"wgmma {dtype}", terms=64)


def test_accumulators_read_before_the_wait_are_the_old_ones(library):
    """The MMA is asynchronous: until the wait covers it, the accumulators hold what they held."""
    a = torch.ones(64, 64, dtype=torch.bfloat16)
    b = torch.ones(64, 64, dtype=torch.bfloat16)
    assert torch.equal(_mm(library, "bf16", 64, 128, 0, 0, a, b, mode=1), torch.zeros(64, 64))


def test_a_stage_written_before_the_wait_is_a_race(library):
    """Shared memory an MMA reads is the MMA's until the wait: a write to it before then (after a
    barrier, so no other check objects) races with the tensor cores' read, in every order."""
    a = torch.ones(64, 64, dtype=torch.bfloat16)
    b = torch.ones(64, 64, dtype=torch.bfloat16)
    for order in ORDERS:
        with pytest.raises(SimulatorError, match="race"):
            _mm(library, "bf16", 64, 128, 0, 0, a, b, mode=2, order=order)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
def test_nvcc_builds_every_variant_into_hgmma(tmp_path):
    """The same kernel built by nvcc for sm_90a: each entry's MMA is an HGMMA of its shape (the
    transposes read from shared memory), its descriptors in uniform registers."""
    from convgen.building import sim_build
    from support.toolchain import cuda_tool
    nvdisasm = cuda_tool("nvdisasm")
    if nvdisasm is None:
        pytest.skip("nvdisasm not found (CUDA toolkit or `pip install nvidia-cuda-nvdisasm`): machine code not checked")
    src, cubin = tmp_path / "wgmma.cu", tmp_path / "wgmma.cubin"
    src.write_text(KERNEL)
    subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-Werror", "all-warnings", "-I", str(sim_build.gpu_templates_dir()),
                    str(src), "-o", str(cubin)], check=True, capture_output=True)
    sass = subprocess.run([nvdisasm, str(cubin)], capture_output=True, text=True, check=True).stdout
    for name in (".BF16", ""):   # (f16 is the unnamed default)
        for n in (64, 128):
            assert re.search(rf"HGMMA\.64x{n}x16\.F32{re.escape(name)} ", sass), f"no HGMMA.64x{n}x16.F32{name}"
    assert "HMMA" not in sass and "LDSM" not in sass
