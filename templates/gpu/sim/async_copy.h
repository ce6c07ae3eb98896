// convgen SIMT simulator, part 4: asynchronous copies (cp.async). Included by cuda.h under
// -DCONVGEN_SIM (after simt.h) for its convgen_copy16 / _commit / _wait wrappers.
//
// The copy semantics are kept honest: a copy issued by a thread only records what it will do; the
// bytes reach shared memory when that thread waits for the copy's commit group (cp.async.wait_group
// N: every group but the newest N). Until then the destination keeps its old contents, so a kernel
// that reads a stage before the wait and the following __syncthreads reads stale data (and shuffled
// thread orders make that visible as a wrong answer). Copies of a group not yet committed never
// complete by a wait, as in PTX.
#pragma once

namespace convgen_sim {

// Issued by the thread: checked now (sim/checks.h: alignment, the source's bounds, a write of the
// destination live until it lands), done at the wait.
__attribute__((noinline)) CONVGEN_SIM_UNCHECKED inline void async_copy(void* shared, const void* global, unsigned bytes,
                                                                     unsigned source_bytes) {
    Inside inside;
    const void* pc = __builtin_return_address(0);
    copy_issue(shared, global, bytes, source_bytes, pc);
    Fiber& f = *worker().current;
    f.copies.push_back({shared, global, bytes, source_bytes, f.copy_groups, pc});
}

CONVGEN_SIM_UNCHECKED inline void async_commit() { ++worker().current->copy_groups; }

// A copy's bytes reach shared memory (at the wait that covers it, or when the phase of the mbarrier
// that tracks it completes: sim/mbarrier.h).
CONVGEN_SIM_UNCHECKED inline void land(const AsyncCopy& c) {
    if (c.source_bytes) std::memcpy(c.shared, c.global, c.source_bytes);   // none: the source is never touched
    std::memset(static_cast<char*>(c.shared) + c.source_bytes, 0, c.bytes - c.source_bytes);
    copy_landed(c.shared, c.bytes, c.pc);
}

CONVGEN_SIM_UNCHECKED inline void async_wait(unsigned newest_pending) {
    Inside inside;
    Fiber& f = *worker().current;
    unsigned long long done_below = f.copy_groups > newest_pending ? f.copy_groups - newest_pending : 0;
    std::vector<AsyncCopy> still;
    for (const AsyncCopy& c : f.copies) {
        if (c.group >= done_below) still.push_back(c);
        else land(c);
    }
    f.copies.swap(still);
}

}  // namespace convgen_sim
