// convgen SIMT simulator, part 6: shared-memory barriers (mbarrier, sm_80+). Included by cuda.h under
// -DCONVGEN_SIM (after async_copy.h) for its convgen_mbarrier_* and convgen_copy_arrive wrappers.
//
// From the PTX ISA ("Parallel Synchronization and Communication Instructions: mbarrier"): an mbarrier
// is a 64-bit object in shared memory with a current phase, an expected arrival count (1 to
// 2^20 - 1, set by mbarrier.init) and the arrivals still pending in the phase. An arrive counts one
// arrival; the one that brings the pending count to zero completes the phase: the phase advances and
// the pending count starts again from the expected count. mbarrier.try_wait.parity P returns true
// once the phase of parity P has completed, that is while the current phase's parity is not P (a
// thread can tell the current phase from the one before it, no more). cp.async.mbarrier.arrive.noinc
// makes an arrival that happens when every cp.async the thread issued before it is complete (.noinc:
// it counts against the expected count like any arrival).
//
// The emulation keeps the state beside shared memory (Worker::mbarriers, by address), so a kernel
// that reads or writes the 8 bytes itself gets no help from it. An arrival counts at once. A
// cp.async.mbarrier.arrive takes the thread's copies in flight with it, and they land when the
// phase completes: the latest moment the PTX allows, so that a thread that reads a stage before its
// wait reads the stale bytes and the racecheck names the copy in flight (checks.h). A wait on a
// phase not yet complete parks the thread (State::AtMbarrier) until an arrival completes it; when
// every thread is parked or at a barrier and none can go on, the launch fails as a deadlock naming
// each waiting thread's barrier, its phase and the arrivals it still expects (simt.h).
// For the racecheck an mbarrier orders as a GPU's does: what a thread did before its arrival happens
// before what a thread does after a wait that the phase's completion released (vector clocks,
// checks.h), so that a producer's and its consumers' accesses to a stage need no __syncthreads.
// Failures (each undefined behaviour on a GPU): an mbarrier not in shared memory or not 8-byte
// aligned; an expected count out of range; an arrival or wait on an mbarrier never initialised, or
// whose initialisation by another thread nothing orders before it (no __syncthreads between); an
// mbarrier.init of one that threads wait on or that tracks copies.
#pragma once

namespace convgen_sim {

constexpr unsigned MBARRIER_MAX_COUNT = (1u << 20) - 1;

CONVGEN_SIM_UNCHECKED inline std::string mbarrier_text(const void* bar) {
    return "the mbarrier at " + shared_text(static_cast<const unsigned char*>(bar) - worker().checks->shared, 8);
}

// `bar` for operation `what`: in the block's shared memory, 8-byte aligned.
CONVGEN_SIM_UNCHECKED inline void mbarrier_placed(const void* bar, const char* what, const void* pc) {
    const BlockChecks& c = *worker().checks;
    uintptr_t offset = reinterpret_cast<uintptr_t>(bar) - reinterpret_cast<uintptr_t>(c.shared);
    if (offset >= c.used || reinterpret_cast<uintptr_t>(bar) % 8)
        fail(std::string(what) + " at " + pc_text(pc) + ": the address 0x" + hex(reinterpret_cast<uintptr_t>(bar)).substr(2) +
             (offset >= c.used ? " is not in the block's shared memory" : " is not 8-byte aligned") +
             " (an mbarrier is a 64-bit object in shared memory)");
}

// The state of `bar` for operation `what`, checked: in shared memory, aligned, initialised, and its
// initialisation ordered before this thread's use.
CONVGEN_SIM_UNCHECKED inline Mbarrier& mbarrier_of(const void* bar, const char* what, const void* pc) {
    mbarrier_placed(bar, what, pc);
    Worker& w = worker();
    for (Mbarrier& m : w.mbarriers)
        if (m.address == bar) {
            mbarrier_ordered_after_init(m, what, pc);
            return m;
        }
    fail(std::string(what) + " at " + pc_text(pc) + " on " + mbarrier_text(bar) + ", which no mbarrier.init initialised");
}

__attribute__((noinline)) CONVGEN_SIM_UNCHECKED inline void mbarrier_init(void* bar, unsigned count) {
    Inside inside;
    const void* pc = __builtin_return_address(0);
    mbarrier_placed(bar, "mbarrier.init", pc);
    Worker& w = worker();
    if (count < 1 || count > MBARRIER_MAX_COUNT)
        fail("mbarrier.init at " + pc_text(pc) + " of " + mbarrier_text(bar) + ": expected count " +
             std::to_string(count) + "; it must be 1 to " + std::to_string(MBARRIER_MAX_COUNT));
    Mbarrier* m = nullptr;
    for (Mbarrier& x : w.mbarriers)
        if (x.address == bar) m = &x;
    if (m) {
        for (const Fiber& f : w.fibers)
            if (f.state == State::AtMbarrier && f.mbarrier == bar)
                fail("mbarrier.init at " + pc_text(pc) + " of " + mbarrier_text(bar) + ", which thread " +
                     thread_name(f) + " waits on (" + f.site + ")");
        if (!m->copies.empty())
            fail("mbarrier.init at " + pc_text(pc) + " of " + mbarrier_text(bar) + ", which still tracks " +
                 std::to_string(m->copies.size()) + " asynchronous copies of a cp.async.mbarrier.arrive whose phase "
                 "has not completed");
    } else {
        w.mbarriers.emplace_back();
        m = &w.mbarriers.back();
    }
    *m = Mbarrier{};
    m->address = bar;
    m->expected = m->pending = count;
    mbarrier_initialised(*m, pc);
}

// One arrival on `m` by the running thread (its copies in `copies`, if any, land with the phase).
CONVGEN_SIM_UNCHECKED inline void mbarrier_arrival(Mbarrier& m) {
    Worker& w = worker();
    Fiber& f = *w.current;
    mbarrier_release(m, f.linear);
    if (--m.pending == 0) {
        for (const AsyncCopy& c : m.copies) land(c);
        m.copies.clear();
        m.completed.swap(m.arrived);
        m.arrived.clear();
        const unsigned done = static_cast<unsigned>(m.phase & 1);
        ++m.phase;
        m.pending = m.expected;
        for (Fiber& g : w.fibers)
            if (g.state == State::AtMbarrier && g.mbarrier == m.address && g.parity == done) {
                mbarrier_acquire(m, g.linear);
                g.state = State::Ready;
                g.mbarrier = nullptr;
            }
    }
    mbarrier_arrived(f.linear);
}

__attribute__((noinline)) CONVGEN_SIM_UNCHECKED inline void mbarrier_arrive(void* bar) {
    Inside inside;
    mbarrier_arrival(mbarrier_of(bar, "mbarrier.arrive", __builtin_return_address(0)));
}

// cp.async.mbarrier.arrive.noinc: the thread's copies issued so far land when the phase completes.
__attribute__((noinline)) CONVGEN_SIM_UNCHECKED inline void copy_arrive(void* bar) {
    Inside inside;
    Mbarrier& m = mbarrier_of(bar, "cp.async.mbarrier.arrive", __builtin_return_address(0));
    Fiber& f = *worker().current;
    m.copies.insert(m.copies.end(), f.copies.begin(), f.copies.end());
    f.copies.clear();
    mbarrier_arrival(m);
}

// mbarrier.try_wait.parity, retried until true: returns once the phase of `parity` has completed.
__attribute__((noinline)) CONVGEN_SIM_UNCHECKED inline void mbarrier_wait(void* bar, unsigned parity, const char* site) {
    Inside inside;
    Mbarrier& m = mbarrier_of(bar, "mbarrier.try_wait.parity", __builtin_return_address(0));
    Fiber& f = *worker().current;
    if ((m.phase & 1) != (parity & 1)) {   // the phase before the current one: complete
        mbarrier_acquire(m, f.linear);
        return;
    }
    f.state = State::AtMbarrier;
    f.mbarrier = bar;
    f.parity = parity & 1;
    f.site = site;
    yield_to_scheduler();   // made ready by the arrival that completes the phase (which also orders it)
}

}  // namespace convgen_sim
