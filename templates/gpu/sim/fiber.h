// convgen SIMT simulator, part 1: execution contexts. Included by simt.h only (after its
// configuration: CONVGEN_SIM_WARP, CONVGEN_SIM_STACK_BYTES, dim3/uint3, CONVGEN_SIM_ASAN).
//
// Owns the fibers (one per GPU thread: a stack and a saved stack pointer), the per-OS-thread
// worker that runs one block's fibers, the x86-64 context switch, ASan's fiber annotations, and
// failure: a broken rule records the launch's first error and leaves the fiber for good.
#pragma once

namespace convgen_sim {

enum class State { Ready, AtBarrier, AtCollective, AtMbarrier, Done };
enum class Coll { Shfl, ShflUp, ShflDown, ShflXor, SyncWarp, Ballot, Any, All, Matrix, MatrixLoad };

// An asynchronous copy issued and not yet completed (sim/async_copy.h): it lands at a wait.
struct AsyncCopy {
    void* shared;
    const void* global;
    unsigned bytes, source_bytes;        // source_bytes < bytes: the rest is zeros
    unsigned long long group;            // the commit group it belongs to
    const void* pc;                      // the instruction that issued it (checks.h)
};

// A shared-memory barrier object (mbarrier, sm_80+; sim/mbarrier.h), by its address in shared
// memory: the current phase, its arrivals still to come out of `expected`, the copies whose
// completion it tracks (cp.async.mbarrier.arrive: they land when the phase completes), and for the racecheck (checks.h) the vector clocks of the
// arrivals of this phase and of the last completed one.
struct Mbarrier {
    const void* address = nullptr;
    unsigned expected = 0, pending = 0;
    unsigned long long phase = 0;
    std::vector<AsyncCopy> copies;
    std::vector<uint32_t> arrived, completed;
    unsigned init_thread = 0;            // who initialised it, in which barrier interval (checks.h)
    uint32_t init_interval = 0, init_clock = 0;
    const void* init_pc = nullptr;
};

// A warpgroup MMA issued and not yet done (sim/wgmma.h): it runs at the wait that covers its group.
struct AsyncMma {
    float* d;                            // the thread's accumulators (n / 2 of them)
    int n;                               // the instruction's N (m64nNk16)
    unsigned long long a, b;             // the shared-memory matrix descriptors
    bool trans_a, trans_b;               // MN-major A / B
    float (*to_f32)(unsigned short);     // the 16-bit element type's value
    unsigned long long group;            // the commit group it belongs to
    const void* pc;                      // the instruction that issued it
};

struct Fiber {
    std::vector<AsyncCopy> copies;      // this thread's copies in flight (cp.async)
    std::vector<AsyncMma> mmas;         // this thread's warpgroup MMAs in flight (wgmma.mma_async)
    unsigned long long mma_groups = 0;  // their commit groups closed so far
    unsigned inside = 0;                // > 0 while in the simulator's own functions: checks.h skips their accesses
    unsigned long long copy_groups = 0; // commit groups closed so far
    void* sp = nullptr;                 // saved stack pointer while switched out
    char* stack = nullptr;              // lowest address of the mapping (a guard page first)
    uint3 tid{0, 0, 0};
    unsigned linear = 0;                // linear thread index within the block
    State state = State::Ready;
    const char* site = nullptr;         // barrier or collective call site ("file:line")
    Coll coll = Coll::SyncWarp;
    bool has_mask = true;
    unsigned long long mask = 0;
    long long arg = 0;                  // source lane / delta / lane mask / matrix emulation
    int width = CONVGEN_SIM_WARP;
    unsigned long long value = 0, result = 0;
    const void* mbarrier = nullptr;     // AtMbarrier: the barrier's address and the parity of the phase awaited
    unsigned parity = 0;
#ifdef CONVGEN_SIM_ASAN
    void* fake_stack = nullptr;
#endif
};

struct Settings { int order = 0; unsigned long long seed = 0; int workers = 0; bool profile = false; };
struct Registry;      // checks.h: the buffers a plan entry was called with (per calling thread)
struct BlockChecks;   // checks.h: a worker's shared memory, its shadow and the block's counters
struct Counters;      // checks.h: a launch's profile

struct Launch {
    const char* kernel = "";
    Settings settings;                  // the launching thread's, for the workers that run its blocks
    dim3 grid, block;
    size_t shared_bytes = 0;
    void (*body)(void*) = nullptr;
    void* closure = nullptr;
    std::atomic<bool> failed{false};
    std::mutex error_mutex;
    std::string error;                  // the first failure, handed to the launching thread's last_error()
    Registry* registry = nullptr;       // the launching thread's buffers (checks.h); null: not checked
    uintptr_t caller_stack_lo = 0, caller_stack_hi = 0;   // the launching thread's stack (the kernel's arguments)
    Counters* counters = nullptr;       // with Settings::profile: the launch's profile, added to by each block
};

// Per library (simt.h gives everything here hidden visibility, so two loaded simulator libraries
// never share these) and per launching OS thread: the settings of convgen_sim_configure, the last
// failure's message and the launch counter that the Python side reads around each call, so that
// concurrent callers and other libraries never disturb one another's counts, orders or messages.
inline Settings& settings() { static thread_local Settings s; return s; }
inline std::string& last_error() { static thread_local std::string e; return e; }
inline unsigned long long& launch_count() { static thread_local unsigned long long n = 0; return n; }

// Per OS thread (= per running block).
struct Worker {
    void* sched_sp = nullptr;
    Fiber* current = nullptr;
    Launch* launch = nullptr;
    std::vector<Fiber> fibers;
    BlockChecks* checks = nullptr;      // shared memory (dynamic and static) and its shadow: checks.h
    std::vector<Mbarrier> mbarriers;    // the block's initialised shared-memory barriers (sim/mbarrier.h)
    uint3 block_idx{0, 0, 0};
    unsigned long long block_linear = 0;
#ifdef CONVGEN_SIM_ASAN
    void* sched_fake = nullptr;
    const void* sched_bottom = nullptr;
    size_t sched_size = 0;
#endif
    ~Worker();
};
inline thread_local Worker tls_worker;
// The worker of a thread that runs blocks (set by run_queue), else null: a plain pointer, so reading
// it needs no TLS initialisation call (the checks' hooks read it on every load and store).
inline thread_local Worker* running_worker = nullptr;
inline Worker& worker() {
    Worker* w = running_worker;
    return w ? *w : tls_worker;
}

// The scheduler's side (see CONVGEN_SIM_RT in simt.h): declared here, defined below or in the
// runtime object.
CONVGEN_SIM_RT std::string block_name();
CONVGEN_SIM_RT std::string thread_name(const Fiber& f);
CONVGEN_SIM_RT void record_error(const std::string& message);
[[noreturn]] CONVGEN_SIM_RT void fail(const std::string& message);
CONVGEN_SIM_RT void start_fiber(Fiber& f);
CONVGEN_SIM_RT void resume(Fiber& f);
CONVGEN_SIM_RT void free_checks(BlockChecks* c);
inline Worker::~Worker() {
    for (Fiber& f : fibers)
        if (f.stack) munmap(f.stack, CONVGEN_SIM_STACK_BYTES);
    free_checks(checks);
}

// --- the context switch ---------------------------------------------------------------------
// switch_to(&save, next): push callee-saved registers, store rsp in *save, load next, pop, return.
__attribute__((naked, noinline)) static void switch_to(void** /*save*/, void* /*next*/) {
    asm volatile(
        "pushq %rbp\n\t"
        "pushq %rbx\n\t"
        "pushq %r12\n\t"
        "pushq %r13\n\t"
        "pushq %r14\n\t"
        "pushq %r15\n\t"
        "subq $8, %rsp\n\t"
        "stmxcsr (%rsp)\n\t"
        "fnstcw 4(%rsp)\n\t"
        "movq %rsp, (%rdi)\n\t"
        "movq %rsi, %rsp\n\t"
        "ldmxcsr (%rsp)\n\t"
        "fldcw 4(%rsp)\n\t"
        "addq $8, %rsp\n\t"
        "popq %r15\n\t"
        "popq %r14\n\t"
        "popq %r13\n\t"
        "popq %r12\n\t"
        "popq %rbx\n\t"
        "popq %rbp\n\t"
        "ret\n\t");
}

inline void asan_enter_fiber(Fiber& f) {
#ifdef CONVGEN_SIM_ASAN
    Worker& w = worker();
    __sanitizer_start_switch_fiber(&w.sched_fake, f.stack + 4096, CONVGEN_SIM_STACK_BYTES - 4096);
#else
    (void)f;
#endif
}
inline void asan_back_in_scheduler() {
#ifdef CONVGEN_SIM_ASAN
    __sanitizer_finish_switch_fiber(worker().sched_fake, nullptr, nullptr);
#endif
}
inline void asan_back_in_fiber(Fiber& f) {
#ifdef CONVGEN_SIM_ASAN
    Worker& w = worker();
    __sanitizer_finish_switch_fiber(f.fake_stack, &w.sched_bottom, &w.sched_size);
#else
    (void)f;
#endif
}
inline void asan_leave_fiber(Fiber& f, bool for_good) {
#ifdef CONVGEN_SIM_ASAN
    Worker& w = worker();
    __sanitizer_start_switch_fiber(for_good ? nullptr : &f.fake_stack, w.sched_bottom, w.sched_size);
#else
    (void)f; (void)for_good;
#endif
}

// From a fiber back to the block's scheduler; returns when the scheduler resumes this fiber.
inline void yield_to_scheduler(bool for_good = false) {
    Worker& w = worker();
    Fiber& f = *w.current;
    asan_leave_fiber(f, for_good);
    switch_to(&f.sp, w.sched_sp);
    asan_back_in_fiber(f);
}

#if CONVGEN_SIM_DEFINE_RUNTIME
CONVGEN_SIM_RT std::string block_name() {
    const Worker& w = worker();
    char buf[96];
    snprintf(buf, sizeof buf, "block (%u,%u,%u)", w.block_idx.x, w.block_idx.y, w.block_idx.z);
    return buf;
}

CONVGEN_SIM_RT std::string thread_name(const Fiber& f) {
    char buf[64];
    snprintf(buf, sizeof buf, "(%u,%u,%u)", f.tid.x, f.tid.y, f.tid.z);
    return buf;
}

// Record the launch's first error (later ones are dropped).
CONVGEN_SIM_RT void record_error(const std::string& message) {
    Launch& l = *worker().launch;
    std::lock_guard<std::mutex> lock(l.error_mutex);
    if (!l.failed.exchange(true))
        l.error = "kernel " + std::string(l.kernel) + ", " + block_name() + ": " + message;
}

// A rule broken inside a fiber: record it and leave the fiber for good (its stack is abandoned).
[[noreturn]] CONVGEN_SIM_RT void fail(const std::string& message) {
    record_error("thread " + thread_name(*worker().current) + ": " + message);
    yield_to_scheduler(true);
    __builtin_trap();   // never resumed
}

extern "C" CONVGEN_SIM_RT void convgen_sim_fiber_main() {
    Worker& w = worker();
    Fiber& f = *w.current;
    asan_back_in_fiber(f);
    w.launch->body(w.launch->closure);
    Worker& w2 = worker();
    w2.current->state = State::Done;
    yield_to_scheduler(true);
    __builtin_trap();
}

CONVGEN_SIM_RT void start_fiber(Fiber& f) {
    if (!f.stack) {
        void* p = mmap(nullptr, CONVGEN_SIM_STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) { fprintf(stderr, "convgen simulator: cannot map a fiber stack\n"); abort(); }
        mprotect(p, 4096, PROT_NONE);   // guard page: a stack overflow faults instead of corrupting
        f.stack = static_cast<char*>(p);
    }
#ifdef CONVGEN_SIM_ASAN
    __asan_unpoison_memory_region(f.stack + 4096, CONVGEN_SIM_STACK_BYTES - 4096);
    f.fake_stack = nullptr;
#endif
    // Frame read by switch_to: [mxcsr|fpcw] r15 r14 r13 r12 rbx rbp ret=fiber_main 0
    uintptr_t top = reinterpret_cast<uintptr_t>(f.stack + CONVGEN_SIM_STACK_BYTES) & ~uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top) - 2;   // ret slot 16-aligned: fiber_main sees rsp%16==8
    sp[1] = nullptr;
    sp[0] = reinterpret_cast<void*>(&convgen_sim_fiber_main);
    sp -= 6;
    for (int i = 0; i < 6; ++i) sp[i] = nullptr;
    sp -= 1;
    unsigned control[2];
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(control[0]), "=m"(control[1]));
    std::memcpy(sp, control, 8);
    f.sp = sp;
    f.state = State::Ready;
    f.inside = 0;
}

CONVGEN_SIM_RT void resume(Fiber& f) {
    Worker& w = worker();
    w.current = &f;
    asan_enter_fiber(f);
    switch_to(&w.sched_sp, f.sp);
    asan_back_in_scheduler();
    w.current = nullptr;
}

#endif  // CONVGEN_SIM_DEFINE_RUNTIME

}  // namespace convgen_sim
