"""The matrix-instruction wrappers (templates/gpu/cuda.h, hip.h) and the simulator's emulation of
them (templates/gpu/sim/mma.h): mma.sync m16n8k16 at warp 32, v_mfma_f32_16x16x16 at wave 64.

A small GEMM kernel built only on the wrappers runs in the simulator against torch. Integer-valued
inputs make every product and sum exact, so one misplaced fragment element shows as a mismatch;
random inputs check the f32 accumulation; a lane that skips the instruction is an error.
Both vendors' libraries define the same kernel, `gemm<T>`, and are loaded into one process: the
simulator must keep each library's `__shared__` arrays its own (g++ would otherwise make the
function-static arrays of same-named kernels one object across libraries, STB_GNU_UNIQUE, and
the 64-lane library would overrun the 32-lane one's smaller tile).
"""

from __future__ import annotations

import pytest
import torch

from convgen.devices import sim
from convgen.building import sim_build
from convgen.codegen.errors import SimulatorError

from support.reference import assert_close, generator_for, randn
from support.toolchain import sim_libraries

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
ORDERS = ("forward", "reverse", "shuffle")

# ----------------------------------------------------------------------- matrix instructions

# One warp per CONVGEN_MMA_M x CONVGEN_MMA_N tile of C = A B; A row-major M x K, B given as B^T (N x K).
GEMM = r"""
#include "VENDOR.h"
template <class T>
__global__ void gemm(const unsigned short* a, const unsigned short* bt, float* c, int M, int N, int K, int skip_lane) {
    constexpr int D = convgen_mma_k<T>::value;   // the fragments' depth (HIP: a pack of two MFMAs, 32)
    CONVGEN_SHARED(unsigned short, a_tile, [CONVGEN_MMA_M * D]);   // (in the block's shared memory: HIP's
    CONVGEN_SHARED(unsigned short, b_tile, [CONVGEN_MMA_N * D]);   // 16-byte fragment reads check it is)
    int lane = threadIdx.x, m0 = blockIdx.x * CONVGEN_MMA_M, n0 = blockIdx.y * CONVGEN_MMA_N;
    convgen_mma_acc acc = {{0.0f, 0.0f, 0.0f, 0.0f}};
    for (int k0 = 0; k0 < K; k0 += D) {
        for (int e = lane; e < CONVGEN_MMA_M * D; e += CONVGEN_WARP) a_tile[e] = a[(m0 + e / D) * K + k0 + e % D];
        for (int e = lane; e < CONVGEN_MMA_N * D; e += CONVGEN_WARP) b_tile[e] = bt[(n0 + e / D) * K + k0 + e % D];
        __syncthreads();
        convgen_mma_a<T> fa;
        convgen_mma_b<T> fb;
        convgen_mma_load_a(fa, a_tile, D, lane);
        convgen_mma_load_b(fb, b_tile, D, lane);
        if (lane != skip_lane) convgen_mma_sync(acc, fa, fb);
        __syncthreads();
    }
    for (int e = 0; e < 4; ++e)
        c[(m0 + convgen_mma_acc_row(lane, e)) * N + n0 + convgen_mma_acc_col(lane, e)] = acc.c[e];
}
#define ENTRY(name, T) \
    extern "C" int name(const unsigned short* a, const unsigned short* bt, float* c, int M, int N, int K, int skip) { \
        return CONVGEN_LAUNCH(gemm<T>, dim3(M / CONVGEN_MMA_M, N / CONVGEN_MMA_N), CONVGEN_WARP, 0, 0, a, bt, c, M, N, K, skip); \
    }
ENTRY(VENDOR_gemm_bf16, convgen_bf16)
ENTRY(VENDOR_gemm_f16, convgen_f16)
"""


@pytest.fixture(scope="module")
def gemm_libs(tmp_path_factory):
    return sim_libraries(tmp_path_factory, "gpu_mma", lambda v: GEMM.replace("VENDOR", v), lambda v: f"gemm_{v}")


def _gemm(lib, vendor, dtype, a, b, order="forward", skip_lane=-1):
    (m, k), n = a.shape, b.shape[1]
    c = torch.full((m, n), float("nan"))
    bt = b.t().contiguous()
    lib.call(f"{vendor}_gemm_{dtype}", sim.pointer(a), sim.pointer(bt), sim.pointer(c), m, n, k, skip_lane,
             order=order, seed=7)
    return c


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_matrix_instruction_layouts_place_every_element(gemm_libs, vendor, dtype):
    """Small integers: every product and sum is exact, so C must equal A B exactly."""
    g = generator_for(f"mma-int-{vendor}-{dtype}")
    torch_dtype = DTYPES[dtype]
    a = torch.randint(-8, 9, (32, 64), generator=g).to(torch_dtype)   # K: whole fragments on both vendors
    b = torch.randint(-8, 9, (64, 48), generator=g).to(torch_dtype)
    for order in ORDERS:
        c = _gemm(gemm_libs[vendor], vendor, dtype, a, b, order)
        assert torch.equal(c, a.float() @ b.float()), order


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_matrix_instructions_accumulate_in_f32(gemm_libs, vendor, dtype):
    """Random 16-bit inputs are exact in f32; the f32 sums are within f32's tolerance of float64."""
    g = generator_for(f"mma-rand-{vendor}-{dtype}")
    a, b = randn((32, 64), DTYPES[dtype], g), randn((64, 48), DTYPES[dtype], g)
    c = _gemm(gemm_libs[vendor], vendor, dtype, a, b)
    assert_close(c, a.double() @ b.double(), torch.float32, f"{vendor} {dtype} gemm", terms=64)


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
def test_a_matrix_instruction_needs_the_whole_warp(gemm_libs, vendor):
    a = torch.ones(16, 64, dtype=torch.bfloat16)
    b = torch.ones(64, 16, dtype=torch.bfloat16)
    with pytest.raises(SimulatorError, match="matrix instruction"):
        _gemm(gemm_libs[vendor], vendor, "bf16", a, b, skip_lane=5)
