"""The shared-memory barrier wrappers (templates/gpu/cuda.h: mbarrier, cp.async.mbarrier.arrive) and
the simulator's emulation of them (templates/gpu/sim/mbarrier.h, the racecheck's ordering in checks.h).

A producer warp feeds two consumer warps through a ring of stages in shared memory, with no
__syncthreads after the start: each stage has a `full` barrier (the producer's 32 lanes arrive, by
cp.async.mbarrier.arrive when their copies land, or after plain stores) and an `empty` one (the 64
consumers arrive when they have read it). The results are checked against a scalar reference of what
each consumer sums, in every thread order; the emulation must keep the phases' parities, land each
copy when its phase completes, order the producer's writes before the consumers' reads and their
reads before the producer's next writes (no race reported), and fail each way such a pipeline goes
wrong on a GPU: a stage read before its wait, a stage refilled before the consumers are done, a
barrier used before its initialisation is ordered before the use, an arrival count that never comes
(a deadlock, named), an mbarrier outside shared memory. The wrappers build with nvcc for sm_80 and
sm_90 (mbarrier.try_wait: Hopper's SYNCS instructions).
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

from support.toolchain import cuda_tool

STAGES, ITERS, CHUNK = 3, 7, 128   # a chunk: 32 producer lanes x 4 floats (16 bytes) each

# MODE 0: copies, the pipeline as it should be; 1: plain stores and mbarrier.arrive instead of copies;
# 2: consumers read a stage without waiting for it to be full (copies); 3: the same with plain stores;
# 4: the producer refills a stage without waiting for it to be empty; 5: no __syncthreads after the
# barriers' initialisation; 6: `full` expects 33 arrivals (the producer has 32 lanes); 7: an
# mbarrier in global memory.
KERNEL = r"""
#include "cuda.h"
__global__ void pipeline(const float* src, float* out, unsigned long long* global_bar) {
    CONVGEN_SHARED(float, stage, [STAGES * CHUNK]);
    CONVGEN_SHARED(unsigned long long, full_bars, [STAGES]);
    CONVGEN_SHARED(unsigned long long, empty_bars, [STAGES]);
    const unsigned full = convgen_mbarrier_at(full_bars), empty = convgen_mbarrier_at(empty_bars);
    const int t = threadIdx.x;
    if (t == 0) {
        for (int s = 0; s < STAGES; ++s) {
            convgen_mbarrier_init(MODE == 7 ? convgen_mbarrier_at(&global_bar[s]) : full + 8 * s, MODE == 6 ? 33 : 32);
            convgen_mbarrier_init(empty + 8 * s, 64);
        }
    }
    if (MODE != 5) __syncthreads();
    if (t < 32) {   // the producer warp
        convgen_copy_stage<1> copy;
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES, k = i / STAGES;
            if (i >= STAGES && MODE != 4) convgen_mbarrier_wait(empty + 8 * s, (k - 1) & 1);
            float* to = &stage[s * CHUNK + t * 4];
            const float* from = &src[i * CHUNK + t * 4];
            if (MODE == 1 || MODE == 3) {
                for (int j = 0; j < 4; ++j) to[j] = from[j];
                convgen_mbarrier_arrive(full + 8 * s);
            } else {
                convgen_copy16(copy, 0, to, from, true);
                convgen_copy_arrive(full + 8 * s);
            }
        }
    } else {        // two consumer warps
        const int c = t - 32;
        float acc = 0.0f;
        for (int i = 0; i < ITERS; ++i) {
            const int s = i % STAGES, k = i / STAGES;
            if (MODE != 2 && MODE != 3) convgen_mbarrier_wait(full + 8 * s, k & 1);
            acc += (stage[s * CHUNK + c] + stage[s * CHUNK + c + 64]) * (float)(i + 1);
            convgen_mbarrier_arrive(empty + 8 * s);
        }
        out[c] = acc;
    }
}
extern "C" int cuda_pipeline(const float* src, float* out, unsigned long long* global_bar) {
    return CONVGEN_LAUNCH(pipeline, 1, 96, 0, 0, src, out, global_bar);
}
"""

MODES = range(8)


def _source(mode: int) -> str:
    return f"#define MODE {mode}\n#define STAGES {STAGES}\n#define ITERS {ITERS}\n#define CHUNK {CHUNK}\n" + KERNEL


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if sim_build.fp16_include_dir() is None:
        pytest.skip("NVIDIA's cuda_fp16.h/cuda_bf16.h (CUDA toolkit) not found: cuda.h needs the 16-bit types")
    d = tmp_path_factory.mktemp("gpu_mbarrier")
    return {mode: sim.build(_source(mode), d, f"mbarrier_{mode}", "cuda") for mode in MODES}


def _run(lib, order: str, seed: int = 3):
    src = torch.randn(ITERS * CHUNK, generator=torch.Generator().manual_seed(seed))
    out = torch.full((64,), float("nan"))
    bar = torch.zeros(STAGES, dtype=torch.int64)
    lib.call("cuda_pipeline", sim.pointer(src, "src"), sim.pointer(out, "out"), sim.pointer(bar, "global_bar"),
             order=order, seed=seed)
    return src, out


def _reference(src: torch.Tensor) -> torch.Tensor:
    """What consumer c sums: chunk i's elements c and c + 64, times i + 1, in the order of i (f32)."""
    chunks = src.view(ITERS, CHUNK)
    acc = torch.zeros(64)
    for i in range(ITERS):
        acc = acc + (chunks[i, :64] + chunks[i, 64:]) * float(i + 1)
    return acc


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
@pytest.mark.parametrize("mode", [0, 1], ids=["copies", "stores"])
def test_a_pipeline_on_mbarriers_runs_clean_and_matches_the_reference(libs, mode, order):
    src, out = _run(libs[mode], order)
    assert torch.equal(out, _reference(src))


# (mode, what the simulator says): a stage read without its wait is read while the copies are in
# flight, or unordered with their landing (which the last arrival made: the producer's lanes ran
# first) or with a later copy's issue (the consumers ran first); before the plain stores, the
# racecheck sees the read and the store unordered (or, read first, the bytes unwritten); a refill
# races with the consumers' reads or lands on a copy in flight. Without the __syncthreads, a thread
# that runs before thread 0 finds its barrier uninitialised, one after it its initialisation unordered.
WRONG = [
    (2, "(in flight|race \\((read after write|write after read)\\))"),
    (3, "(race \\((read after write|write after read)\\)|which no thread of the block wrote)"),
    (4, "(in flight|race \\(write after read\\))"),
    (5, "(with nothing ordering that before this|which no mbarrier.init initialised)"),
    (6, "deadlock: threads wait on mbarrier phases.*phase of parity 0 of the mbarrier at shared memory byte "
        "\\d+ \\(phase 0: 1 of 33 arrivals to come\\)"),
    (7, "mbarrier.init at .*is not in the block's shared memory"),
]


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
@pytest.mark.parametrize("mode, says", WRONG, ids=[f"mode{m}" for m, _ in WRONG])
def test_the_simulator_fails_a_pipeline_that_goes_wrong(libs, mode, says, order):
    with pytest.raises(SimulatorError, match=says):
        _run(libs[mode], order)


def test_an_initialisation_nothing_orders_is_named(libs):
    """Forward order runs thread 0 first: it initialises the barriers and goes on to produce; the next
    lane's arrival finds the barrier initialised, but by another thread with no __syncthreads since."""
    with pytest.raises(SimulatorError, match="cp.async.mbarrier.arrive at .* which thread \\(0,0,0\\) \\(warp 0\\) "
                                             "initialised at .* with nothing ordering that before this"):
        _run(libs[5], "forward")


def test_the_unordered_stores_are_a_race_when_the_producer_runs_first(libs):
    """Forward order runs the producer warp first: its stores are in place before the consumers read
    them, and only the racecheck's ordering (no mbarrier wait between) tells the read from a good one."""
    with pytest.raises(SimulatorError, match="race \\(read after write\\).*nor an mbarrier arrival and wait"):
        _run(libs[3], "forward")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_wrappers_build_with_nvcc(tmp_path, arch):
    """The good pipeline (both modes) compiles; on sm_90 its waits are Hopper's SYNCS phase checks."""
    from convgen.codegen.gpu.wrappers import vendor_wrappers
    src = tmp_path / "mbarrier.cu"
    src.write_text("".join(_source(mode).replace('#include "cuda.h"', vendor_wrappers("cuda"))
                           .replace("pipeline", f"pipeline{mode}") for mode in (0, 1)))
    cubin = tmp_path / "mbarrier.cubin"
    done = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", str(src), "-o", str(cubin)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    nvdisasm = cuda_tool("nvdisasm")
    if nvdisasm is None:
        pytest.skip("nvdisasm not found (CUDA toolkit or `pip install nvidia-cuda-nvdisasm`): machine code not checked")
    sass = subprocess.run([nvdisasm, str(cubin)], capture_output=True, text=True, check=True).stdout
    if arch == "sm_90":
        assert re.search(r"\bSYNCS\.PHASECHK", sass), sass[:2000]
        assert re.search(r"\bSYNCS\.ARRIVE", sass), sass[:2000]
    assert re.search(r"\bLDGSTS\b", sass)   # the copies
