"""The asynchronous-copy wrappers (templates/gpu/cuda.h: cp.async; hip.h: staged through registers)
and the simulator's emulation of cp.async (templates/gpu/sim/async_copy.h).

The emulation must keep the copy semantics honest: a copy's bytes reach shared memory only when the
issuing thread waits for its commit group (wait<N>: all but the newest N groups); a copy that is
not valid writes 16 zero bytes. A kernel that touches a copy's bytes before the wait that lands it,
or reads another thread's without a barrier, fails with the simulator's racecheck (sim/checks.h).
On HIP the same names stage through registers and `land` stores them.
"""

from __future__ import annotations

import pytest
import torch

from convgen.building import sim_build
from convgen.codegen.errors import SimulatorError
from convgen.devices import sim

# One block of one warp, W threads; thread t owns 8 u16 of shared memory in each of two slot rows.
# Group 0 copies src into row 0, group 1 src2 into row 1 (zeros where not valid: odd threads).
# out[0][t]: row 0's slot t after wait<1> (group 0 landed for this thread; group 1 may still fly)
# out[1][t]: row 1's slot of the neighbour (t+1) % W after wait<0> and a barrier
# MODE (the wrong kernels the checks must catch): 1 reads its slot before the wait; 2 reads the
# neighbour's slot without the barrier; 3 copies group 1 into row 0 while group 0 is in flight there.
KERNEL = r"""
#include "VENDOR.h"
__global__ void copies(const unsigned short* src, const unsigned short* src2, unsigned short* out) {
    CONVGEN_SHARED(unsigned short, slot, [2 * CONVGEN_WARP * 8]);
    int t = threadIdx.x;
    unsigned short* first = &slot[t * 8];
    unsigned short* second = &slot[(CONVGEN_WARP + t) * 8];
    convgen_copy_stage<1> a, b;
    convgen_copy16(a, 0, first, &src[t * 8], true);
    convgen_copy_land(a);
    convgen_copy_commit();
    if (MODE == 1) out[t] = first[3];
    bool valid = t % 2 == 0;
    convgen_copy16(b, 0, MODE == 3 ? first : second, valid ? &src2[t * 8] : src2, valid);
    convgen_copy_land(b);
    convgen_copy_commit();
    convgen_copy_wait<1>();
    out[t] = first[3];
    convgen_copy_wait<0>();
    if (MODE != 2) __syncthreads();
    out[CONVGEN_WARP + t] = slot[(CONVGEN_WARP + (t + 1) % CONVGEN_WARP) * 8 + 3];
}
extern "C" int VENDOR_copies(const unsigned short* src, const unsigned short* src2, unsigned short* out) {
    return CONVGEN_LAUNCH(copies, 1, CONVGEN_WARP, 0, 0, src, src2, out);
}
"""


def _build(d, vendor: str, mode: int):
    return sim.build(f"#define MODE {mode}\n" + KERNEL.replace("VENDOR", vendor), d, f"copies_{vendor}_{mode}", vendor)


def _operands(warp: int):
    src = torch.arange(warp * 8, dtype=torch.int16)
    src2 = 1000 + torch.arange(warp * 8, dtype=torch.int16)
    return src, src2, torch.zeros(2 * warp, dtype=torch.int16)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if sim_build.fp16_include_dir() is None:
        pytest.skip("NVIDIA's cuda_fp16.h/cuda_bf16.h (CUDA toolkit) not found: the wrappers need the 16-bit types")
    d = tmp_path_factory.mktemp("gpu_async_copy")
    return {(v, mode): _build(d, v, mode) for v in sim_build.WARP for mode in range(4)}


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
@pytest.mark.parametrize("vendor", list(sim_build.WARP))
def test_copies_land_at_the_wait_and_are_shared_after_the_barrier(libs, vendor, order):
    warp = sim_build.WARP[vendor]
    src, src2, out = _operands(warp)
    libs[vendor, 0].call(f"{vendor}_copies", sim.pointer(src, "src"), sim.pointer(src2, "src2"),
                         sim.pointer(out, "out"), order=order, seed=4)
    t = torch.arange(warp)
    assert torch.equal(out[:warp], src[t * 8 + 3])   # its own group 0, landed by its wait
    neighbour = (t + 1) % warp
    expected = torch.where(neighbour % 2 == 0, src2[neighbour * 8 + 3], torch.zeros_like(neighbour).to(torch.int16))
    assert torch.equal(out[warp:], expected.to(torch.int16))


# (vendor, mode): what the checks say. HIP stages through registers and stores them at `land`, so a
# read before the wait or a second copy to the same slot is no hazard there; a missing barrier is.
WRONG = [("cuda", 1, "in flight"), ("cuda", 3, "in flight"), ("cuda", 2, "(in flight|race)"), ("hip", 2, "race")]


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
@pytest.mark.parametrize("vendor,mode,says", WRONG)
def test_the_checks_catch_a_copy_read_too_early_or_overwritten_in_flight(libs, vendor, mode, says, order):
    src, src2, out = _operands(sim_build.WARP[vendor])
    with pytest.raises(SimulatorError, match=says):
        libs[vendor, mode].call(f"{vendor}_copies", sim.pointer(src, "src"), sim.pointer(src2, "src2"),
                                sim.pointer(out, "out"), order=order, seed=4)


def test_the_profile_counts_a_partly_zero_filled_copy_as_one_shared_request(libs):
    """The second copy reads global memory in the even lanes only (the odd ones zero-fill): the
    profile still sees one shared request of 4 phases (32 lanes x 16 bytes, conflict-free) and one
    global request of the 16 valid sources, not the two kinds of access mixed in one request."""
    src, src2, out = _operands(32)
    (launch,) = libs["cuda", 0].call("cuda_copies", sim.pointer(src, "src"), sim.pointer(src2, "src2"),
                                     sim.pointer(out, "out"), profile=True)
    # shared: two copies (4 phases each, one wavefront a phase) and two 2-byte reads 16 bytes apart (8
    # banks for 32 lanes: 4 wavefronts each, ideal 1)
    assert (launch["shared_requests"], launch["shared_ideal"], launch["shared_wavefronts"]) == (4, 10, 16)
    # global: src (512 bytes, 16 sectors), src2's even slots (16 sectors), out's two halves (2 each)
    assert (launch["global_requests"], launch["global_sectors"]) == (4, 36)
    assert (launch["bytes_read"], launch["bytes_written"]) == (512 + 16 * 16, 2 * 64)
