"""The SIMT simulator (templates/gpu/sim/simt.h, runtime/building/sim_build.py, runtime/devices/sim.py):
small CUDA programs written here run on the CPU with CUDA's execution model and are checked against
numpy; broken ones (races, divergent barriers, bad masks) are caught; the same programs build with
nvcc and hipcc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

import numpy as np
import pytest

from convgen import knobs
from convgen.devices import sim
from convgen.building import build, sim_build
from convgen.codegen.errors import SimulatorError

from support.toolchain import run_sanitized

# Kernels that build for CUDA (cuda.h) and HIP (hip.h) alike: only the wrappers' names differ
# per vendor, and those live in the wrapper headers.
PORTABLE = r"""
// block reduction in dynamic shared memory: a tree with a barrier per level
__global__ void block_sum_kernel(const float* in, float* out, int n) {
    CONVGEN_DYNAMIC_SHARED(float, partial);
    unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    partial[t] = i < (unsigned)n ? in[i] : 0.0f;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) partial[t] += partial[t + half];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = partial[0];
}

// warp (wave) reduction by shuffles; each warp's lane 0 adds its total atomically
__global__ void warp_sum_kernel(const double* in, double* total, int* warps, int n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    double v = i < (unsigned)n ? in[i] : 0.0;
    for (int offset = CONVGEN_WARP / 2; offset > 0; offset /= 2) v += convgen_shfl_down(v, offset);
    if (threadIdx.x % CONVGEN_WARP == 0) { atomicAdd(total, v); atomicAdd(warps, 1); }
}

// 64x64 (any multiple of 16) matmul in 16x16 tiles staged through shared memory
#define TILE 16
__global__ void matmul_kernel(const float* a, const float* b, float* c, int n) {
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < n; k0 += TILE) {
        ta[threadIdx.y][threadIdx.x] = a[row * n + k0 + threadIdx.x];
        tb[threadIdx.y][threadIdx.x] = b[(k0 + threadIdx.y) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += ta[threadIdx.y][k] * tb[k][threadIdx.x];
        __syncthreads();
    }
    c[row * n + col] = acc;
}

// a race: the last thread sums what the others wrote, with no barrier between
__global__ void racy_sum_kernel(const float* in, float* out) {
    __shared__ float values[64];
    values[threadIdx.x] = in[blockIdx.x * 64 + threadIdx.x];
    if (threadIdx.x == 63) {
        float s = 0.0f;
        for (int i = 0; i < 64; ++i) s += values[i];
        out[blockIdx.x] = s;
    }
}

extern "C" int block_sum(const float* in, float* out, int n, int blocks) {
    return CONVGEN_LAUNCH(block_sum_kernel, blocks, 256, 256 * sizeof(float), 0, in, out, n);
}
extern "C" int warp_sum(const double* in, double* total, int* warps, int n, int threads) {
    return CONVGEN_LAUNCH(warp_sum_kernel, (n + threads - 1) / threads, threads, 0, 0, in, total, warps, n);
}
extern "C" int matmul(const float* a, const float* b, float* c, int n) {
    return CONVGEN_LAUNCH(matmul_kernel, dim3(n / TILE, n / TILE), dim3(TILE, TILE), 0, 0, a, b, c, n);
}
extern "C" int racy_sum(const float* in, float* out, int blocks) {
    return CONVGEN_LAUNCH(racy_sum_kernel, blocks, 64, 0, 0, in, out);
}
"""

# Kernels that break the execution model: run in the simulator only.
BROKEN = r"""
__global__ void divergent_barrier_kernel(float* out) {
    if (threadIdx.x < 16) {
        out[threadIdx.x] = 1.0f;
        __syncthreads();
    } else {
        __syncthreads();
    }
}
__global__ void early_return_kernel(float* out) {
    if (threadIdx.x == 3) return;
    out[threadIdx.x] = 1.0f;
    __syncthreads();
}
__global__ void cuda_mask_kernel(float* out) {
    float v = out[threadIdx.x];
    out[threadIdx.x] = v + __shfl_down_sync(0xffffffffu, v, 1);
}
// every collective: butterfly sums in 16-lane segments, a prefix step, ballot/any/all, __syncwarp
__global__ void collectives_kernel(const int* in, long long* out) {
    unsigned t = threadIdx.x, lane = t % warpSize;
    int v = in[t];
    int seg = v;
    for (int m = 8; m > 0; m /= 2) seg += __shfl_xor(seg, m, 16);
    int up = __shfl_up(v, 3);
    int from5 = __shfl(v, 5, 16);
    unsigned long long votes = __ballot(v > 0);
    int any = __any(v > 90), all = __all(v > -1000);
    __syncwarp();
    if (lane % 2 == 0) __syncwarp(CONVGEN_WARP == 64 ? 0x5555555555555555ull : 0x55555555ull);
    out[t * 6 + 0] = seg; out[t * 6 + 1] = up; out[t * 6 + 2] = from5;
    out[t * 6 + 3] = (long long)votes; out[t * 6 + 4] = any; out[t * 6 + 5] = all;
}
extern "C" int collectives(const int* in, long long* out, int threads) {
    return CONVGEN_LAUNCH(collectives_kernel, 1, threads, 0, 0, in, out);
}

#ifdef CONVGEN_SIM_HAVE_FP16
__global__ void round_trip_kernel(const float* in, float* half, float* bf16, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        half[i] = __half2float(__float2half(in[i]));
        bf16[i] = __bfloat162float(__float2bfloat16(in[i]));
    }
}
extern "C" int round_trip(const float* in, float* half, float* bf16, int n) {
    return CONVGEN_LAUNCH(round_trip_kernel, (n + 127) / 128, 128, 0, 0, in, half, bf16, n);
}
#endif
__global__ void divergent_shuffle_kernel(float* out) {
    float v = out[threadIdx.x];
    if (threadIdx.x % 2) v += __shfl_xor_sync(0xffffffffu, v, 1);
    else v -= __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}
__global__ void shuffle_then_barrier_kernel(float* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_down_sync(0xffffffffu, out[threadIdx.x], 1);
    else __syncthreads();
}
extern "C" int divergent_shuffle(float* out) { return CONVGEN_LAUNCH(divergent_shuffle_kernel, 1, 32, 0, 0, out); }
extern "C" int shuffle_then_barrier(float* out) { return CONVGEN_LAUNCH(shuffle_then_barrier_kernel, 1, 32, 0, 0, out); }
extern "C" int divergent_barrier(float* out) { return CONVGEN_LAUNCH(divergent_barrier_kernel, 2, 64, 0, 0, out); }
extern "C" int early_return(float* out) { return CONVGEN_LAUNCH(early_return_kernel, 1, 64, 0, 0, out); }
extern "C" int cuda_mask(float* out) { return CONVGEN_LAUNCH(cuda_mask_kernel, 1, 64, 0, 0, out); }
"""

ORDERS = list(knobs.SIM_ORDERS)
P = sim.pointer


def _header(vendor: str) -> str:
    return f'#include "{vendor}.h"\n'


@pytest.fixture(scope="module", params=["whole", "split"])
def libs(request, tmp_path_factory):
    """The portable programs built for the simulator at both warp sizes, and the broken ones: each
    library compiling the whole simulator, and (as the runtime builds) the program alone with the
    simulator's own functions linked from an object compiled once (sim_build.precompiled_header)."""
    d = tmp_path_factory.mktemp("simt")
    pch = {vendor: None for vendor in sim_build.WARP}
    if request.param == "split":
        argv = knobs.cxx()
        pch = {vendor: sim_build.precompiled_header(vendor, tuple(argv), str(d), build.compiler_identity(argv))
               for vendor in sim_build.WARP}
        assert all(pch.values()), "the simulator's precompiled header and runtime object did not build"
    return {vendor: sim.build(_header(vendor) + PORTABLE + BROKEN, d, "programs", vendor, pch=pch[vendor])
            for vendor in sim_build.WARP}


@pytest.fixture
def rng():
    return np.random.default_rng(int.from_bytes(os.urandom(4), "little"))


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("order", ORDERS)
def test_block_reduction_with_shared_memory_and_barriers(libs, vendor, order, rng):
    n, blocks = 1000, 4
    x = rng.standard_normal(n).astype(np.float32)
    out = np.full(blocks, np.nan, np.float32)
    libs[vendor].call("block_sum", P(x), P(out), n, blocks, order=order, seed=rng.integers(1 << 30))
    ref = np.array([x[b * 256:(b + 1) * 256].astype(np.float64).sum() for b in range(blocks)])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("order", ORDERS)
def test_warp_shuffle_reduction_at_warp_32_and_64(libs, vendor, order, rng):
    lib = libs[vendor]
    assert lib.warp_size == sim_build.WARP[vendor]
    n, threads = 777, 128
    x = rng.standard_normal(n)
    total, warps = np.zeros(1), np.zeros(1, np.int32)
    lib.call("warp_sum", P(x), P(total), P(warps), n, threads, order=order, seed=rng.integers(1 << 30))
    assert warps[0] == (n + threads - 1) // threads * threads // lib.warp_size
    assert abs(total[0] - x.sum()) <= 1e-12 * np.abs(x).sum()


@pytest.mark.parametrize("order", ORDERS)
def test_tiled_matmul(libs, order, rng):
    n = 64
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    c = np.full((n, n), np.nan, np.float32)
    before = libs["cuda"].launches()
    libs["cuda"].call("matmul", P(a), P(b), P(c), n, order=order, seed=rng.integers(1 << 30))
    assert libs["cuda"].launches() == before + 1
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 1e-6


def test_each_library_and_each_calling_thread_has_its_own_counter_order_and_message(libs, rng):
    """Two simulator libraries in one process (cuda's and hip's builds of the same program) share
    nothing: a launch counts in its own library only, and their internals are not exported (they
    would merge across libraries). Threads calling one library at once each count their own
    launches and keep their own order and failure message (the runtime reads the counter around
    each call of a kernel)."""
    x = rng.standard_normal(1000).astype(np.float32)
    out = np.zeros(4, np.float32)
    before = {v: libs[v].launches() for v in libs}
    libs["cuda"].call("block_sum", P(x), P(out), 1000, 4)
    assert {v: libs[v].launches() - before[v] for v in libs} == {"cuda": 1, "hip": 0}
    if shutil.which("nm"):
        exported = subprocess.run(["nm", "-D", "-C", "--defined-only", str(libs["hip"].path)], capture_output=True,
                                  text=True, check=True).stdout
        assert "convgen_sim::" not in exported, [line for line in exported.splitlines() if "convgen_sim::" in line]

    counts, errors = {}, {}

    def work(name: str, times: int) -> None:
        start = libs["cuda"].launches()
        for _ in range(times):
            libs["cuda"].call("racy_sum", P(x), P(np.zeros(1, np.float32)), 1, order="reverse")
        counts[name] = libs["cuda"].launches() - start
        try:
            libs["cuda"].call("early_return", P(np.zeros(64, np.float32)))
        except SimulatorError as e:
            errors[name] = str(e)

    threads = [threading.Thread(target=work, args=(f"t{i}", 20 + i)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == {"t0": 20, "t1": 21, "t2": 22}
    assert set(errors) == {"t0", "t1", "t2"} and all("early_return_kernel" in e for e in errors.values())


def test_a_missing_barrier_is_hidden_in_forward_order_and_exposed_by_the_others(libs, rng):
    blocks = 3
    x = rng.standard_normal(blocks * 64).astype(np.float32) + 2.0
    ref = x.reshape(blocks, 64).astype(np.float64).sum(1)
    results = {}
    for order in ORDERS:
        out = np.full(blocks, np.nan, np.float32)
        libs["cuda"].call("racy_sum", P(x), P(out), blocks, order=order, seed=12345)
        results[order] = out
    np.testing.assert_allclose(results["forward"], ref, rtol=1e-5)   # thread 63 runs last: looks right
    for order in ("reverse", "shuffle"):
        assert not np.allclose(results[order], ref, rtol=1e-3), order   # stale shared memory shows


def test_orders_come_from_knobs(libs, monkeypatch, rng):
    x = rng.standard_normal(64).astype(np.float32) + 2.0
    out = np.zeros(1, np.float32)
    monkeypatch.setenv("CONVGEN_SIM_ORDER", "reverse")
    libs["cuda"].call("racy_sum", P(x), P(out), 1)
    assert not np.isclose(out[0], x.astype(np.float64).sum(), rtol=1e-3)
    monkeypatch.setenv("CONVGEN_SIM_ORDER", "sideways")
    with pytest.raises(Exception, match="CONVGEN_SIM_ORDER='sideways'.*forward, reverse, shuffle"):
        libs["cuda"].call("racy_sum", P(x), P(out), 1)


def test_a_barrier_in_divergent_code_is_a_python_error(libs):
    out = np.zeros(64, np.float32)
    with pytest.raises(SimulatorError) as e:
        libs["cuda"].call("divergent_barrier", P(out))
    text = str(e.value)
    assert "divergent_barrier_kernel" in text and "different __syncthreads call sites" in text
    assert "threads (0,0,0) (1,0,0) (2,0,0) (3,0,0) ... (16 in all) at __syncthreads" in text
    assert "threads (16,0,0) (17,0,0) (18,0,0) (19,0,0) ... (48 in all) at __syncthreads" in text
    assert text.count("programs.cu:") == 2
    ones = np.ones(256, np.float32)
    libs["cuda"].call("block_sum", P(ones), P(out), 256, 1)   # the library still works
    assert out[0] == 256


def test_an_early_return_before_a_barrier_is_a_python_error(libs):
    out = np.zeros(64, np.float32)
    with pytest.raises(SimulatorError, match=r"early_return_kernel, block \(0,0,0\): threads exited before a "
                                             r"__syncthreads.*thread \(3,0,0\) exited;"):
        libs["hip"].call("early_return", P(out))


def test_a_32_lane_mask_under_64_wide_waves_is_a_python_error(libs, rng):
    out = rng.standard_normal(64).astype(np.float32)
    with pytest.raises(SimulatorError, match=r"__shfl_down at .*mask 0xffffffff names only 32 lanes but waves are 64 wide"):
        libs["hip"].call("cuda_mask", P(out))
    # the same kernel is correct with 32-wide warps: each warp shifts down by one lane
    before = out.copy()
    libs["cuda"].call("cuda_mask", P(out))
    shifted = np.concatenate([np.append(before[1:32], before[31]), np.append(before[33:], before[63])])
    np.testing.assert_array_equal(out, before + shifted)


def test_lanes_at_different_shuffles_are_a_python_error(libs):
    out = np.zeros(64, np.float32)
    with pytest.raises(SimulatorError, match=r"divergent_shuffle_kernel, block \(0,0,0\): warp 0: lane 0 is at "
                                             r"__shfl_xor \(\S*programs.cu:\d+, mask 0xffffffff\) but lane 1 is at "
                                             r"__shfl_xor \(\S*programs.cu:\d+, mask 0xffffffff\): divergent warp collective"):
        libs["cuda"].call("divergent_shuffle", P(out))


def test_a_warp_waiting_for_lanes_at_a_barrier_is_a_python_error(libs):
    out = np.zeros(64, np.float32)
    with pytest.raises(SimulatorError, match=r"deadlock.*threads \(0,0,0\) .* \(16 in all\) at __shfl_down "
                                             r".*threads \(16,0,0\) .* \(16 in all\) at __syncthreads"):
        libs["cuda"].call("shuffle_then_barrier", P(out))


@pytest.mark.parametrize("vendor", list(sim_build.WARP))
@pytest.mark.parametrize("order", ORDERS)
def test_shuffles_votes_and_syncwarp_follow_cuda_semantics(libs, vendor, order, rng):
    warp, threads = sim_build.WARP[vendor], 128
    v = rng.integers(-100, 100, threads).astype(np.int32)
    out = np.full((threads, 6), -7, np.int64)
    libs[vendor].call("collectives", P(v), P(out), threads, order=order, seed=rng.integers(1 << 30))
    lanes = np.arange(threads) % warp
    warp_base = np.arange(threads) - lanes
    np.testing.assert_array_equal(out[:, 0], v.reshape(-1, 16).sum(1).repeat(16))
    np.testing.assert_array_equal(out[:, 1], np.where(lanes >= 3, v[np.arange(threads) - 3], v))
    np.testing.assert_array_equal(out[:, 2], v[np.arange(threads) // 16 * 16 + 5])
    votes = [sum(1 << i for i in range(warp) if v[b + i] > 0) for b in warp_base]
    np.testing.assert_array_equal(out[:, 3].view(np.uint64), np.array(votes, np.uint64))
    np.testing.assert_array_equal(out[:, 4], [int((v[b:b + warp] > 90).any()) for b in warp_base])
    np.testing.assert_array_equal(out[:, 5], 1)


@pytest.mark.skipif(sim_build.fp16_include_dir() is None, reason="NVIDIA's cuda_fp16.h/cuda_bf16.h not found (set CUDA_HOME)")
def test_half_and_bfloat16_conversions_are_bit_exact(libs, rng):
    torch = pytest.importorskip("torch")
    bits = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), rng.standard_normal(5000).astype(np.float32) * 1e-5,
                        np.float32([65504, 65520, 65519.99, 6e-8, 3e-8, np.inf, -np.inf, 1 + 2**-11, 1 + 2**-8])])
    x = x[~np.isnan(x)]
    half, bf16 = np.full_like(x, np.nan), np.full_like(x, np.nan)
    libs["hip"].call("round_trip", P(x), P(half), P(bf16), x.size)
    t = torch.from_numpy(x)
    np.testing.assert_array_equal(half.view(np.uint32), t.half().float().numpy().view(np.uint32))
    np.testing.assert_array_equal(bf16.view(np.uint32), t.bfloat16().float().numpy().view(np.uint32))


# --- the same programs through the vendor compilers ------------------------------------------

def _vendor_compile(tmp_path, argv, vendor, env=None):
    src = tmp_path / f"programs_{vendor}.cu"
    src.write_text(_header(vendor) + PORTABLE)
    done = subprocess.run([*argv, "-I", str(sim_build.gpu_templates_dir()), str(src), "-o", str(tmp_path / "out.o")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "out.o").stat().st_size > 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
def test_the_programs_build_with_nvcc_for_sm_80(tmp_path):
    _vendor_compile(tmp_path, ["nvcc", "-arch=sm_80", "-cubin"], "cuda")


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="hipcc (apt: hipcc libamdhip64-dev) is not on PATH")
def test_the_programs_build_with_hipcc_for_gfx90a(tmp_path):
    env = {**os.environ, "HIP_PLATFORM": "amd"}
    _vendor_compile(tmp_path, ["hipcc", "-x", "hip", "--offload-arch=gfx90a", "-c"], "hip", env)



# --- sanitizers: fibers switch stacks under ASan's eyes ---------------------------------------

ASAN_SCRIPT = r"""
import sys, numpy as np
from pathlib import Path
from convgen.devices import sim
from convgen.building import build, sim_build
import test_simt as T
out_of_bounds = '__global__ void oob_kernel(float* o) { o[threadIdx.x + 1] = 1.0f; }\n' \
                'extern "C" int oob(float* o) { return CONVGEN_LAUNCH(oob_kernel, 1, 64, 0, 0, o); }\n'
lib = sim.build(T._header("cuda") + T.PORTABLE + T.BROKEN + out_of_bounds, Path(sys.argv[1]), "asan", "cuda", sanitize=True)
rng = np.random.default_rng(7)
a, b = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
for order in ("forward", "reverse", "shuffle"):
    c = np.full((64, 64), np.nan, np.float32)
    lib.call("matmul", sim.pointer(a), sim.pointer(b), sim.pointer(c), 64, order=order, seed=5)
    assert np.abs(c - a @ b).max() < 1e-4
try:
    lib.call("divergent_barrier", sim.pointer(np.zeros(64, np.float32)))
except Exception as e:
    print("caught", type(e).__name__)
print("clean so far", flush=True)
big = np.zeros(4096, np.float32)
lib.call("oob", sim.pointer(big[4096 - 64:]))   # the last thread writes one past the end: ASan must report it
"""


def test_the_simulator_runs_clean_under_asan_and_ubsan_and_asan_sees_kernel_bugs(tmp_path):
    done = run_sanitized(ASAN_SCRIPT, tmp_path, __file__)
    text = done.stdout + done.stderr
    before, _, after = text.partition("clean so far")
    assert "caught SimulatorError" in before, text
    assert "AddressSanitizer" not in before and "runtime error" not in before, text
    assert done.returncode != 0 and "ERROR: AddressSanitizer: heap-buffer-overflow" in after, text
    assert "oob_kernel" in after, text
