"""The asynchronous-copy wrappers (templates/gpu/cuda.h: cp.async; hip.h: staged through registers)
and the simulator's emulation of cp.async (templates/gpu/sim/async_copy.h).

The emulation must keep the copy semantics honest: a copy's bytes reach shared memory only when the
issuing thread waits for its commit group (wait<N>: all but the newest N groups), so a kernel that
reads a stage too early reads stale data; a copy that is not valid writes 16 zero bytes. On HIP the
same names stage through registers and `land` stores them.
"""

from __future__ import annotations

import pytest
import torch

from convgen.building import sim_build
from convgen.devices import sim

# One block of W threads; thread t owns 8 u16 of shared memory at slot t.
# out[0][t]: slot t read right after issuing (before any wait): the old contents on CUDA
# out[1][t]: slot t after wait<1> with two groups committed: group 0 (src) landed, group 1 not yet
# out[2][t]: the neighbour's slot (t+1) % W after wait<0> and a barrier: the second copy (zeros
#            where the copy is not valid, odd threads)
KERNEL = r"""
#include "VENDOR.h"
__global__ void copies(const unsigned short* src, const unsigned short* src2, unsigned short* out) {
    __shared__ __align__(16) unsigned short slot[CONVGEN_WARP * 8];
    int t = threadIdx.x;
    for (int e = 0; e < 8; ++e) slot[t * 8 + e] = 0xdead;
    convgen_copy_stage<1> stage;
    convgen_copy16(stage, 0, &slot[t * 8], &src[t * 8], true);
    out[t] = slot[t * 8 + 3];
    convgen_copy_land(stage);
    convgen_copy_commit();
    convgen_copy_stage<1> second;
    bool valid = t % 2 == 0;
    if (CONVGEN_ASYNC_COPY) convgen_copy16(second, 0, &slot[t * 8], valid ? &src2[t * 8] : src2, valid);
    convgen_copy_commit();
    convgen_copy_wait<1>();
    out[CONVGEN_WARP + t] = slot[t * 8 + 3];
    if (!CONVGEN_ASYNC_COPY) convgen_copy16(second, 0, &slot[t * 8], valid ? &src2[t * 8] : src2, valid);
    convgen_copy_land(second);
    convgen_copy_wait<0>();
    __syncthreads();
    out[2 * CONVGEN_WARP + t] = slot[(t + 1) % CONVGEN_WARP * 8 + 3];
}
extern "C" int VENDOR_copies(const unsigned short* src, const unsigned short* src2, unsigned short* out) {
    return CONVGEN_LAUNCH(copies, 1, CONVGEN_WARP, 0, 0, src, src2, out);
}
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if sim_build.fp16_include_dir() is None:
        pytest.skip("NVIDIA's cuda_fp16.h/cuda_bf16.h (CUDA toolkit) not found: the wrappers need the 16-bit types")
    d = tmp_path_factory.mktemp("gpu_async_copy")
    return {v: sim.build(KERNEL.replace("VENDOR", v), d, f"copies_{v}", v) for v in sim_build.WARP}


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
@pytest.mark.parametrize("vendor", list(sim_build.WARP))
def test_copies_land_at_the_wait_and_are_shared_after_the_barrier(libs, vendor, order):
    warp = sim_build.WARP[vendor]
    src = torch.arange(warp * 8, dtype=torch.int16)
    src2 = 1000 + torch.arange(warp * 8, dtype=torch.int16)
    out = torch.zeros(3 * warp, dtype=torch.int16)
    libs[vendor].call(f"{vendor}_copies", sim.pointer(src), sim.pointer(src2), sim.pointer(out), order=order, seed=4)
    t = torch.arange(warp)
    # CUDA: nothing has landed before a wait; HIP (registers, landed by convgen_copy_land): neither
    assert (out[:warp] == torch.tensor(0xdead).to(torch.int16)).all()
    assert torch.equal(out[warp:2 * warp], src[t * 8 + 3])   # group 0 landed, group 1 still in flight (CUDA)
    neighbour = (t + 1) % warp
    expected = torch.where(neighbour % 2 == 0, src2[neighbour * 8 + 3], torch.zeros_like(neighbour).to(torch.int16))
    assert torch.equal(out[2 * warp:], expected.to(torch.int16))
