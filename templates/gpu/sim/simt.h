// convgen SIMT simulator: compiles and runs CUDA/HIP kernel source with g++ on the CPU.
// This header: configuration, the block scheduler, barriers, warp collectives, atomics, launches
// and the CUDA/HIP names; fiber.h: the execution contexts (fibers, context switch, failure);
// checks.h: racecheck, memcheck, alignment, initcheck and the profile.
//
// Execution model (CUDA's): every GPU thread is a fiber with its own stack, switched by a small
// x86-64 context switch (callee-saved registers and the stack pointer; no signal-mask syscall).
// One OS thread runs one block at a time, all of its fibers; blocks are spread over a pool of
// OS threads. `__shared__` is `static thread_local`, so shared memory is per block.
//
// Fibers switch only at collectives: `__syncthreads()` (every live thread of the block must reach
// the same call site, else the launch fails with a message naming the block, threads and sites),
// warp/wave collectives (shuffles, __syncwarp, ballot/any/all; every lane named by the mask must
// reach the same call site with the same mask; a mask must fit the warp size), and thread exit.
// Thread and block order: forward, reversed or shuffled by a seed (set by convgen_sim_configure,
// which the Python side calls with the settings of runtime/knobs.py), to expose races.
//
// A failure never kills the process: the failing fiber switches back to its scheduler, the launch
// stops, the launch macro returns a non-zero status and convgen_sim_error() holds the message.
// Memory accesses (races, bounds, alignment, uninitialised reads) are checked by checks.h.
//
// What it proves: indexing, tiling, boundaries, barrier placement, warp logic. What it does not:
// the vendor compilers' code, hardware rounding (FMA contraction, fast math) or speed.
// Matrix instructions (mma.sync m16n8k16, MFMA 16x16x16) are emulated in mma.h from the vendors'
// documented fragment layouts, as warp collectives (ldmatrix too); async_copy.h emulates cp.async.
#pragma once

#if !defined(__x86_64__)
#error "convgen's SIMT simulator switches fibers with x86-64 assembly; this host is not x86-64"
#endif

#if __has_include(<cuda_fp16.h>)
// NVIDIA's own half/bfloat16 types (bit-exact conversions); they bring vector_types.h (dim3, uint3)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define CONVGEN_SIM_HAVE_FP16 1
#endif

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__) && !defined(CONVGEN_SIM_CHECKS)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CONVGEN_SIM_ASAN 1
#endif

#ifndef CONVGEN_SIM_WARP
#define CONVGEN_SIM_WARP 32
#endif
#if CONVGEN_SIM_WARP != 32 && CONVGEN_SIM_WARP != 64
#error "CONVGEN_SIM_WARP must be 32 (CUDA warps) or 64 (gfx90a/gfx940 waves)"
#endif
#ifndef CONVGEN_SIM_STACK_BYTES
#define CONVGEN_SIM_STACK_BYTES (256 * 1024)
#endif

#ifndef CONVGEN_SIM_HAVE_FP16
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
#endif

// Everything of the simulator's own gets hidden visibility: each loaded simulator library keeps its
// own settings, counters, per-thread workers and functions (default visibility would merge the
// function statics across libraries as STB_GNU_UNIQUE objects and bind one library's calls to
// another's copies, built with another warp size or sanitizer). Only the extern "C" functions at
// the end are exported.
// The scheduler, the collectives' bookkeeping and the launch (the functions marked CONVGEN_SIM_RT)
// are the same code in every kernel library. By default each library compiles them (inline). With
// CONVGEN_SIM_SPLIT a kernel file only declares them, and an object file compiled once from this
// header with CONVGEN_SIM_RUNTIME as well (the runtime's builds: runtime/building/sim_build.py) is
// linked into the library instead: its symbols stay hidden, so every library still has its own copy
// and its own state, as above; only the per-kernel compile is shorter.
#if defined(CONVGEN_SIM_SPLIT) && !defined(CONVGEN_SIM_RUNTIME)
#define CONVGEN_SIM_DEFINE_RUNTIME 0
#else
#define CONVGEN_SIM_DEFINE_RUNTIME 1
#endif
// The simulator's own code is never instrumented by the checks (sim/checks.h).
#if defined(CONVGEN_SIM_CHECKS)
#define CONVGEN_SIM_UNCHECKED __attribute__((no_sanitize_address))
#else
#define CONVGEN_SIM_UNCHECKED
#endif
#ifdef CONVGEN_SIM_SPLIT
#define CONVGEN_SIM_RT CONVGEN_SIM_UNCHECKED
#else
#define CONVGEN_SIM_RT inline CONVGEN_SIM_UNCHECKED
#endif

#pragma GCC visibility push(hidden)
#include "fiber.h"

namespace convgen_sim {

CONVGEN_SIM_RT std::string hex(unsigned long long v);
CONVGEN_SIM_RT const char* coll_name(Coll c);
CONVGEN_SIM_RT unsigned long long warp_lanes(unsigned warp);
CONVGEN_SIM_RT unsigned long long collective(const char* site, Coll kind, bool has_mask, unsigned long long mask,
                                             unsigned long long value, long long arg, int width);
CONVGEN_SIM_RT bool resolve_collectives();
CONVGEN_SIM_RT std::string describe_waits();
CONVGEN_SIM_RT std::string mbarrier_phase(const Fiber& f);
CONVGEN_SIM_RT void run_block(Launch& l, unsigned long long linear_block);
CONVGEN_SIM_RT void run_queue(void* p);
CONVGEN_SIM_RT int launch(Launch& l);

}  // namespace convgen_sim
#include "checks.h"
namespace convgen_sim {

#if CONVGEN_SIM_DEFINE_RUNTIME
// --- warp collectives ----------------------------------------------------------------------
CONVGEN_SIM_RT std::string hex(unsigned long long v) { char b[32]; snprintf(b, sizeof b, "0x%llx", v); return b; }

CONVGEN_SIM_RT const char* coll_name(Coll c) {
    switch (c) {
        case Coll::Shfl: return "__shfl";
        case Coll::ShflUp: return "__shfl_up";
        case Coll::ShflDown: return "__shfl_down";
        case Coll::ShflXor: return "__shfl_xor";
        case Coll::SyncWarp: return "__syncwarp";
        case Coll::Ballot: return "__ballot";
        case Coll::Any: return "__any";
        case Coll::All: return "__all";
        case Coll::Matrix: return "matrix instruction";
        case Coll::MatrixLoad: return "ldmatrix";
    }
    return "?";
}

// The lanes of the calling fiber's warp that exist in this block (a partial last warp has fewer).
CONVGEN_SIM_RT unsigned long long warp_lanes(unsigned warp) {
    Worker& w = worker();
    unsigned n = static_cast<unsigned>(w.fibers.size());
    unsigned first = warp * CONVGEN_SIM_WARP, count = std::min<unsigned>(CONVGEN_SIM_WARP, n - first);
    return count == 64 ? ~0ull : ((1ull << count) - 1);
}

CONVGEN_SIM_RT unsigned long long collective(const char* site, Coll kind, bool has_mask, unsigned long long mask,
                                             unsigned long long value, long long arg, int width) {
    Inside inside;
    Worker& w = worker();
    Fiber& f = *w.current;
    unsigned lane = f.linear % CONVGEN_SIM_WARP;
    if (has_mask) {
        if (CONVGEN_SIM_WARP == 64 && mask == 0xffffffffull)
            fail(std::string(coll_name(kind)) + " at " + site + ": mask 0xffffffff names only 32 lanes but "
                 "waves are 64 wide (a CUDA full-warp mask under HIP); use the target's full mask");
        unsigned long long exists = warp_lanes(f.linear / CONVGEN_SIM_WARP);
        if (mask & ~exists)
            fail(std::string(coll_name(kind)) + " at " + site + ": mask " + hex(mask) + " names lanes that do not "
                 "exist in this warp (lanes present: " + hex(exists) + ", warp size " +
                 std::to_string(CONVGEN_SIM_WARP) + ")");
        if (!(mask >> lane & 1))
            fail(std::string(coll_name(kind)) + " at " + site + ": mask " + hex(mask) + " does not include the "
                 "calling lane " + std::to_string(lane));
    }
    if (width <= 0 || width > CONVGEN_SIM_WARP || (width & (width - 1)))
        fail(std::string(coll_name(kind)) + " at " + site + ": width " + std::to_string(width) +
             " must be a power of two no larger than the warp size " + std::to_string(CONVGEN_SIM_WARP));
    f.state = State::AtCollective;
    f.site = site; f.coll = kind; f.has_mask = has_mask; f.mask = mask;
    f.value = value; f.arg = arg; f.width = width;
    yield_to_scheduler();
    return f.result;
}

// Called by the scheduler when no fiber is ready: completes every warp collective whose lanes have
// all arrived. Returns whether any completed; records an error for inconsistent ones.
CONVGEN_SIM_RT bool resolve_collectives() {
    Worker& w = worker();
    unsigned n = static_cast<unsigned>(w.fibers.size());
    bool progress = false;
    for (unsigned first = 0; first < n; first += CONVGEN_SIM_WARP) {
        unsigned count = std::min<unsigned>(CONVGEN_SIM_WARP, n - first);
        unsigned long long waiting = 0, live = 0;
        for (unsigned i = 0; i < count; ++i) {
            const Fiber& f = w.fibers[first + i];
            if (f.state == State::AtCollective) waiting |= 1ull << i;
            if (f.state != State::Done) live |= 1ull << i;
        }
        unsigned long long pending = waiting;
        while (pending) {
            unsigned lead = __builtin_ctzll(pending);
            Fiber& a = w.fibers[first + lead];
            unsigned long long group = a.has_mask ? a.mask : live;
            if ((group & waiting) != group) { pending &= ~(1ull << lead); continue; }   // lanes still to come
            for (unsigned i = 0; i < count; ++i) {
                if (!(group >> i & 1)) continue;
                const Fiber& b = w.fibers[first + i];
                if (b.site != a.site || b.coll != a.coll || b.has_mask != a.has_mask || (a.has_mask && b.mask != a.mask)) {
                    record_error(std::string("warp ") + std::to_string(first / CONVGEN_SIM_WARP) + ": lane " +
                                 std::to_string(lead) + " is at " + coll_name(a.coll) + " (" + a.site + ", mask " +
                                 hex(a.mask) + ") but lane " + std::to_string(i) + " is at " + coll_name(b.coll) +
                                 " (" + b.site + ", mask " + hex(b.mask) + "): divergent warp collective");
                    return false;
                }
            }
            if (a.coll == Coll::Matrix || a.coll == Coll::MatrixLoad) {   // every lane of the warp, then one emulation
                unsigned long long exists = count == 64 ? ~0ull : ((1ull << count) - 1);
                if (group != exists || count != CONVGEN_SIM_WARP) {
                    record_error(std::string("warp ") + std::to_string(first / CONVGEN_SIM_WARP) + ": matrix "
                                 "instruction at " + a.site + " reached by lanes " + hex(group) + " only; every lane "
                                 "of a full warp of " + std::to_string(CONVGEN_SIM_WARP) + " must execute it "
                                 "(lanes present: " + hex(exists) + ")");
                    return false;
                }
                void* lanes[CONVGEN_SIM_WARP];
                for (unsigned i = 0; i < count; ++i) {
                    const Fiber& b = w.fibers[first + i];
                    if (b.arg != a.arg) {
                        record_error(std::string("warp ") + std::to_string(first / CONVGEN_SIM_WARP) + ": lanes " +
                                     std::to_string(lead) + " and " + std::to_string(i) + " execute different matrix "
                                     "instructions at " + a.site);
                        return false;
                    }
                    lanes[i] = reinterpret_cast<void*>(b.value);
                }
                reinterpret_cast<void (*)(void* const*)>(a.arg)(lanes);
                collective_done(w, first / CONVGEN_SIM_WARP, a.coll == Coll::Matrix);
                for (unsigned i = 0; i < count; ++i) w.fibers[first + i].state = State::Ready;
                waiting &= ~group;
                pending &= ~group;
                progress = true;
                continue;
            }
            unsigned long long ballot = 0;
            for (unsigned i = 0; i < count; ++i)
                if ((group >> i & 1) && w.fibers[first + i].value) ballot |= 1ull << i;
            for (unsigned i = 0; i < count; ++i) {
                if (!(group >> i & 1)) continue;
                Fiber& b = w.fibers[first + i];
                long long seg = i & ~static_cast<unsigned>(b.width - 1), src = i;
                switch (b.coll) {
                    case Coll::Shfl: src = seg + (b.arg & (b.width - 1)); break;
                    case Coll::ShflUp: src = (static_cast<long long>(i) - b.arg >= seg) ? i - b.arg : i; break;
                    case Coll::ShflDown: src = (i + b.arg < seg + b.width) ? i + b.arg : i; break;
                    case Coll::ShflXor: src = ((i ^ b.arg) < static_cast<unsigned long long>(seg + b.width)) ? (i ^ b.arg) : i; break;
                    default: break;
                }
                if (b.coll <= Coll::ShflXor) {
                    if (src < 0 || src >= static_cast<long long>(count) || !(group >> src & 1)) {
                        record_error(std::string(coll_name(b.coll)) + " at " + b.site + ": lane " + std::to_string(i) +
                                     " reads lane " + std::to_string(src) + ", which is not in the mask " + hex(group));
                        return false;
                    }
                    b.result = w.fibers[first + src].value;
                } else if (b.coll == Coll::Ballot) {
                    b.result = ballot;
                } else if (b.coll == Coll::Any) {
                    b.result = ballot != 0;
                } else if (b.coll == Coll::All) {
                    b.result = ballot == group;
                } else {
                    b.result = 0;
                }
            }
            collective_done(w, first / CONVGEN_SIM_WARP, false);
            for (unsigned i = 0; i < count; ++i)
                if (group >> i & 1) w.fibers[first + i].state = State::Ready;
            waiting &= ~group;
            pending &= ~group;
            progress = true;
        }
    }
    return progress;
}

// --- a block ---------------------------------------------------------------------------------
// The phase a thread parked at an mbarrier wait awaits, and where its barrier stands.
CONVGEN_SIM_RT std::string mbarrier_phase(const Fiber& f) {
    Worker& w = worker();
    for (const Mbarrier& m : w.mbarriers)
        if (m.address == f.mbarrier)
            return "the phase of parity " + std::to_string(f.parity) + " of the mbarrier at shared memory byte " +
                   std::to_string(static_cast<const unsigned char*>(m.address) - w.checks->shared) + " (phase " +
                   std::to_string(m.phase) + ": " + std::to_string(m.pending) + " of " + std::to_string(m.expected) +
                   " arrivals to come)";
    return "an mbarrier";
}

// Where the block's threads are, grouped by place: "threads (0,0,0) (1,0,0) ... (16 in all) at ...".
CONVGEN_SIM_RT std::string describe_waits() {
    Worker& w = worker();
    std::vector<std::pair<std::string, std::vector<const Fiber*>>> groups;
    for (const Fiber& f : w.fibers) {
        std::string where = f.state == State::Done ? std::string("exited")
            : f.state == State::AtBarrier ? "at __syncthreads (" + std::string(f.site) + ")"
            : f.state == State::AtCollective ? "at " + std::string(coll_name(f.coll)) + " (" + f.site + ")"
            : f.state == State::AtMbarrier ? "at an mbarrier wait (" + std::string(f.site) + ") for " + mbarrier_phase(f)
            : std::string("running");
        auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == where; });
        if (it == groups.end()) groups.push_back({where, {&f}});
        else it->second.push_back(&f);
    }
    std::string out;
    for (const auto& g : groups) {
        out += " thread";
        if (g.second.size() > 1) out += "s";
        for (size_t i = 0; i < g.second.size() && i < 4; ++i) out += " " + thread_name(*g.second[i]);
        if (g.second.size() > 4) out += " ... (" + std::to_string(g.second.size()) + " in all)";
        out += " " + g.first + ";";
    }
    return out;
}

CONVGEN_SIM_RT void run_block(Launch& l, unsigned long long linear_block) {
    Worker& w = worker();
    w.launch = &l;
    w.block_linear = linear_block;
    w.block_idx = {static_cast<unsigned>(linear_block % l.grid.x),
                   static_cast<unsigned>(linear_block / l.grid.x % l.grid.y),
                   static_cast<unsigned>(linear_block / (1ull * l.grid.x * l.grid.y))};
    unsigned n = l.block.x * l.block.y * l.block.z;
    if (w.fibers.size() < n) w.fibers.resize(n);
    else if (w.fibers.size() > n) {
        for (size_t i = n; i < w.fibers.size(); ++i)
            if (w.fibers[i].stack) munmap(w.fibers[i].stack, CONVGEN_SIM_STACK_BYTES);
        w.fibers.resize(n);
    }
    block_begin(w, l);   // shared memory poisoned: NaN floats, -1 ints
    w.mbarriers.clear();
    if (l.failed.load()) return;
    for (unsigned i = 0; i < n; ++i) {
        Fiber& f = w.fibers[i];
        f.linear = i;
        f.copies.clear();
        f.copy_groups = 0;
        f.mmas.clear();
        f.mma_groups = 0;
        f.mbarrier = nullptr;
        f.tid = {i % l.block.x, i / l.block.x % l.block.y, i / (l.block.x * l.block.y)};
        start_fiber(f);
    }
    std::mt19937_64 rng(l.settings.seed * 0x9E3779B97F4A7C15ull + linear_block);
    std::vector<unsigned> order(n);
    for (unsigned i = 0; i < n; ++i) order[i] = l.settings.order == 1 ? n - 1 - i : i;
    for (;;) {
        if (l.settings.order == 2) std::shuffle(order.begin(), order.end(), rng);   // a new order per round
        bool ran = false;
        for (unsigned i : order) {
            if (l.failed.load(std::memory_order_relaxed)) return;
            if (w.fibers[i].state == State::Ready) { resume(w.fibers[i]); ran = true; }
        }
        if (l.failed.load()) return;
        if (ran) continue;
        if (resolve_collectives()) continue;
        if (l.failed.load()) return;
        unsigned done = 0, at_barrier = 0, at_mbarrier = 0;
        const char* site = nullptr;
        bool same_site = true;
        for (const Fiber& f : w.fibers) {
            if (f.state == State::Done) ++done;
            else if (f.state == State::AtMbarrier) ++at_mbarrier;
            else if (f.state == State::AtBarrier) {
                ++at_barrier;
                if (site && site != f.site && std::strcmp(site, f.site) != 0) same_site = false;
                site = f.site;
            }
        }
        if (done == n) { block_end(w, l); return; }
        if (at_barrier + done == n && done == 0 && same_site) {
            barrier_done(w, site);
            for (Fiber& f : w.fibers) f.state = State::Ready;
            continue;
        }
        std::string why = done && at_barrier + done == n && same_site
            ? "threads exited before a __syncthreads that the others wait at (an early return before a barrier):"
            : at_barrier + done == n ? "threads wait at different __syncthreads call sites (a barrier in divergent code):"
            : at_mbarrier ? "deadlock: threads wait on mbarrier phases that no thread left running will complete (the "
                            "arrivals they need never come, or come from threads that wait themselves):"
                          : "deadlock: no thread can proceed (a warp collective waits for lanes that are at a barrier or exited):";
        record_error(why + describe_waits());
        return;
    }
}

// The blocks of a launch, taken in turn by its worker threads.
struct BlockQueue {
    Launch* launch;
    const unsigned long long* order;
    unsigned long long blocks;
    std::atomic<unsigned long long> next;
};

CONVGEN_SIM_RT void run_queue(void* p) {
    BlockQueue& q = *static_cast<BlockQueue*>(p);
    running_worker = &tls_worker;
    for (;;) {
        unsigned long long i = q.next.fetch_add(1);
        if (i >= q.blocks || q.launch->failed.load()) break;
        run_block(*q.launch, q.order[i]);
    }
    worker().launch = nullptr;
}

CONVGEN_SIM_RT int launch(Launch& l) {
    launch_count()++;
    l.settings = settings();
    l.registry = &registry();
    caller_stack(l.caller_stack_lo, l.caller_stack_hi);
    if (l.settings.profile) {
        profiles().push_back({l.kernel, {}});
        l.counters = &profiles().back().counters;
    }
    unsigned long long blocks = 1ull * l.grid.x * l.grid.y * l.grid.z;
    unsigned long long threads = 1ull * l.block.x * l.block.y * l.block.z;
    last_error().clear();
    if (threads == 0 || threads > 1024 || blocks == 0) {
        if (blocks == 0 || threads == 0) return 0;   // an empty launch does nothing
        last_error() = std::string("kernel ") + l.kernel + ": " + std::to_string(threads) +
                       " threads per block; at most 1024 are allowed";
        return 1;
    }
    std::vector<unsigned long long> block_order(blocks);
    for (unsigned long long i = 0; i < blocks; ++i) block_order[i] = i;
    if (settings().order == 1) std::reverse(block_order.begin(), block_order.end());
    if (settings().order == 2) {
        std::mt19937_64 rng(settings().seed);
        std::shuffle(block_order.begin(), block_order.end(), rng);
    }
    unsigned workers = settings().workers > 0 ? static_cast<unsigned>(settings().workers)
                                              : std::max(1u, std::thread::hardware_concurrency());
    workers = static_cast<unsigned>(std::min<unsigned long long>(workers, blocks));
    BlockQueue queue{&l, block_order.data(), blocks, {0}};
    // std::thread gets a plain function and a void*: an instantiation of std::thread for a type of
    // ours would be exported with its vtable despite hidden visibility (std:: is default-visible),
    // and another loaded simulator library's copy could then run this library's blocks.
    if (workers <= 1) {
        std::thread t(run_queue, static_cast<void*>(&queue));   // the caller's stack stays untouched
        t.join();
    } else {
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < workers; ++t) pool.emplace_back(run_queue, static_cast<void*>(&queue));
        for (std::thread& t : pool) t.join();
    }
    if (!l.failed.load()) return 0;
    last_error() = l.error;
    return 1;
}

#endif  // CONVGEN_SIM_DEFINE_RUNTIME

template <class F>
inline void call_closure(void* p) { (*static_cast<F*>(p))(); }

template <class F>
inline int launch_kernel(const char* name, dim3 grid, dim3 block, size_t shared_bytes, F&& body) {
    Launch l;
    l.kernel = name;
    l.grid = grid;
    l.block = block;
    l.shared_bytes = shared_bytes;
    l.body = &call_closure<std::remove_reference_t<F>>;
    l.closure = &body;
    return launch(l);
}

// --- per-thread state, barriers ------------------------------------------------------------
CONVGEN_SIM_UNCHECKED inline void syncthreads(const char* site) {
    Inside inside;
    Fiber& f = *worker().current;
    f.state = State::AtBarrier;
    f.site = site;
    yield_to_scheduler();
}

CONVGEN_SIM_UNCHECKED inline uint3 thread_idx() { return worker().current->tid; }
CONVGEN_SIM_UNCHECKED inline uint3 block_idx() { return worker().block_idx; }
CONVGEN_SIM_UNCHECKED inline dim3 block_dim() { return worker().launch->block; }
CONVGEN_SIM_UNCHECKED inline dim3 grid_dim() { return worker().launch->grid; }

inline void syncwarp(const char* site) { collective(site, Coll::SyncWarp, false, 0, 0, 0, CONVGEN_SIM_WARP); }
inline void syncwarp(const char* site, unsigned long long mask) {
    collective(site, Coll::SyncWarp, true, mask, 0, 0, CONVGEN_SIM_WARP);
}

template <class T>
inline unsigned long long to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffled values are at most 8 bytes");
    unsigned long long b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}
template <class T>
inline T from_bits(unsigned long long b) { T v; std::memcpy(&v, &b, sizeof v); return v; }

template <class T> inline T shfl(const char* s, bool m, unsigned long long mask, T v, int src, int width) {
    return from_bits<T>(collective(s, Coll::Shfl, m, mask, to_bits(v), src, width));
}
template <class T> inline T shfl_up(const char* s, bool m, unsigned long long mask, T v, unsigned d, int width) {
    return from_bits<T>(collective(s, Coll::ShflUp, m, mask, to_bits(v), d, width));
}
template <class T> inline T shfl_down(const char* s, bool m, unsigned long long mask, T v, unsigned d, int width) {
    return from_bits<T>(collective(s, Coll::ShflDown, m, mask, to_bits(v), d, width));
}
template <class T> inline T shfl_xor(const char* s, bool m, unsigned long long mask, T v, int lanes, int width) {
    return from_bits<T>(collective(s, Coll::ShflXor, m, mask, to_bits(v), lanes, width));
}

// --- atomics: fibers of one block never interleave inside one, blocks on other OS threads may ---
template <class T, class Op>
inline T atomic_update(T* address, Op op) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics on 4- or 8-byte values");
    using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    Bits* p = reinterpret_cast<Bits*>(address);
    Bits old = __atomic_load_n(p, __ATOMIC_RELAXED), desired;
    do {
        T value;
        std::memcpy(&value, &old, sizeof value);
        T next = op(value);
        std::memcpy(&desired, &next, sizeof desired);
    } while (!__atomic_compare_exchange_n(p, &old, desired, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    T previous;
    std::memcpy(&previous, &old, sizeof previous);
    return previous;
}

}  // namespace convgen_sim
#pragma GCC visibility pop

// --- the CUDA/HIP names kernels use --------------------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
// Hidden: a kernel's `__shared__` arrays (function statics) stay its library's own when several
// libraries with same-named kernels are loaded into one process (default visibility would let
// g++ merge them across libraries as STB_GNU_UNIQUE objects).
#define __global__ __attribute__((visibility("hidden")))
#define __device__ __attribute__((visibility("hidden")))
#define __host__
#define __shared__ static thread_local
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif

#define CONVGEN_SIM_STR2(x) #x
#define CONVGEN_SIM_STR(x) CONVGEN_SIM_STR2(x)
#define CONVGEN_SIM_SITE (__FILE__ ":" CONVGEN_SIM_STR(__LINE__))

// By value, from the simulator's own (unchecked) functions: a kernel's reads of them are no memory
// accesses of its own for the checks to sort.
#define threadIdx (::convgen_sim::thread_idx())
#define blockIdx (::convgen_sim::block_idx())
#define blockDim (::convgen_sim::block_dim())
#define gridDim (::convgen_sim::grid_dim())
static constexpr int warpSize = CONVGEN_SIM_WARP;

#define __syncthreads() ::convgen_sim::syncthreads(CONVGEN_SIM_SITE)
// __syncwarp(): every live lane of the warp; __syncwarp(mask): the lanes named
#define __syncwarp(...) ::convgen_sim::syncwarp(CONVGEN_SIM_SITE __VA_OPT__(,) __VA_ARGS__)

// CUDA's masked collectives (width defaults to the warp size)
#define CONVGEN_SIM_W(...) CONVGEN_SIM_W_(__VA_ARGS__, warpSize, 0)
#define CONVGEN_SIM_W_(zero, arg, w, ...) w
#define __shfl_sync(mask, v, ...) ::convgen_sim::shfl(CONVGEN_SIM_SITE, true, mask, v, convgen_sim_first(__VA_ARGS__), CONVGEN_SIM_W(0, __VA_ARGS__))
#define __shfl_up_sync(mask, v, ...) ::convgen_sim::shfl_up(CONVGEN_SIM_SITE, true, mask, v, convgen_sim_first(__VA_ARGS__), CONVGEN_SIM_W(0, __VA_ARGS__))
#define __shfl_down_sync(mask, v, ...) ::convgen_sim::shfl_down(CONVGEN_SIM_SITE, true, mask, v, convgen_sim_first(__VA_ARGS__), CONVGEN_SIM_W(0, __VA_ARGS__))
#define __shfl_xor_sync(mask, v, ...) ::convgen_sim::shfl_xor(CONVGEN_SIM_SITE, true, mask, v, convgen_sim_first(__VA_ARGS__), CONVGEN_SIM_W(0, __VA_ARGS__))
#define __ballot_sync(mask, p) ::convgen_sim::collective(CONVGEN_SIM_SITE, ::convgen_sim::Coll::Ballot, true, mask, (p) != 0, 0, warpSize)
#define __any_sync(mask, p) static_cast<int>(::convgen_sim::collective(CONVGEN_SIM_SITE, ::convgen_sim::Coll::Any, true, mask, (p) != 0, 0, warpSize))
#define __all_sync(mask, p) static_cast<int>(::convgen_sim::collective(CONVGEN_SIM_SITE, ::convgen_sim::Coll::All, true, mask, (p) != 0, 0, warpSize))
// HIP 5.2's mask-less collectives: every live lane of the wave takes part
#define __shfl(v, ...) ::convgen_sim::shfl(CONVGEN_SIM_SITE, false, 0, v, convgen_sim_first(__VA_ARGS__), CONVGEN_SIM_W(0, __VA_ARGS__))
#define __shfl_up(v, ...) ::convgen_sim::shfl_up(CONVGEN_SIM_SITE, false, 0, v, convgen_sim_first(__VA_ARGS__), CONVGEN_SIM_W(0, __VA_ARGS__))
#define __shfl_down(v, ...) ::convgen_sim::shfl_down(CONVGEN_SIM_SITE, false, 0, v, convgen_sim_first(__VA_ARGS__), CONVGEN_SIM_W(0, __VA_ARGS__))
#define __shfl_xor(v, ...) ::convgen_sim::shfl_xor(CONVGEN_SIM_SITE, false, 0, v, convgen_sim_first(__VA_ARGS__), CONVGEN_SIM_W(0, __VA_ARGS__))
#define __ballot(p) ::convgen_sim::collective(CONVGEN_SIM_SITE, ::convgen_sim::Coll::Ballot, false, 0, (p) != 0, 0, warpSize)
#define __any(p) static_cast<int>(::convgen_sim::collective(CONVGEN_SIM_SITE, ::convgen_sim::Coll::Any, false, 0, (p) != 0, 0, warpSize))
#define __all(p) static_cast<int>(::convgen_sim::collective(CONVGEN_SIM_SITE, ::convgen_sim::Coll::All, false, 0, (p) != 0, 0, warpSize))
template <class A, class... R> inline A convgen_sim_first(A a, R...) { return a; }

// The epilogues' 16-byte accesses (cuda.h, hip.h): one 16-byte access each way, checked and profiled
// as such (g++ splits a struct's copy into narrower ones).
typedef unsigned convgen_v16 __attribute__((vector_size(16), may_alias));
inline convgen_v16 convgen_shared16(const void* shared) { return *reinterpret_cast<const convgen_v16*>(shared); }
inline void convgen_global16(void* global, convgen_v16 v) { *reinterpret_cast<convgen_v16*>(global) = v; }

inline float atomicAdd(float* p, float v) { return convgen_sim::atomic_update(p, [v](float x) { return x + v; }); }
inline double atomicAdd(double* p, double v) { return convgen_sim::atomic_update(p, [v](double x) { return x + v; }); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicMax(int* p, int v) { return convgen_sim::atomic_update(p, [v](int x) { return x > v ? x : v; }); }
inline int atomicMin(int* p, int v) { return convgen_sim::atomic_update(p, [v](int x) { return x < v ? x : v; }); }
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline float atomicExch(float* p, float v) { return convgen_sim::atomic_update(p, [v](float) { return v; }); }
inline int atomicCAS(int* p, int expected, int desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// The generator-owned wrappers that kernels and launch entries use (see ../cuda.h, ../hip.h).
typedef void* convgen_stream_t;
#define CONVGEN_WARP CONVGEN_SIM_WARP
#define CONVGEN_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
    ((void)(stream), ::convgen_sim::launch_kernel(#kernel, dim3(grid), dim3(block), (shared_bytes), \
                                                  [&]() { kernel(__VA_ARGS__); }))
#define CONVGEN_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::convgen_sim::dynamic_shared())
// A static shared array (CUDA's `__shared__ T name dims;`), placed in the block's shared memory after
// the dynamic part, where the checks see it (sim/checks.h); one per declaration and block.
#define CONVGEN_SHARED(T, name, dims)                                                                    \
    typedef T convgen_shared_type_##name dims;                                                           \
    convgen_shared_type_##name& name = *reinterpret_cast<convgen_shared_type_##name*>(                   \
        ::convgen_sim::static_shared(sizeof(convgen_shared_type_##name), alignof(T), CONVGEN_SIM_SITE))
#define CONVGEN_SHARED_OPT_IN(kernel, bytes) ((void)(kernel), 0)
// A plan entry's scratch memory: host memory here (launches run to completion before they return).
// A failure returns 2 (cudaErrorMemoryAllocation, hipErrorOutOfMemory) with a message for the caller.
// The checks know it as "the workspace": bounds, and reads of bytes no kernel wrote yet.
inline int convgen_malloc_async(void** p, unsigned long long bytes, convgen_stream_t) {
    *p = bytes ? std::malloc(bytes) : nullptr;
    if (bytes && !*p) {
        ::convgen_sim::last_error() = "workspace: could not allocate " + std::to_string(bytes) + " bytes";
        return 2;
    }
    if (*p) ::convgen_sim::workspace_added(*p, bytes);
    return 0;
}
inline int convgen_free_async(void* p, convgen_stream_t) {
    if (p) ::convgen_sim::workspace_removed(p);
    std::free(p);
    return 0;
}

// What the Python side calls: settings before a launch, the last failure's message, a counter.
#if CONVGEN_SIM_DEFINE_RUNTIME
extern "C" {
__attribute__((visibility("default"), used)) void convgen_sim_configure(int order, unsigned long long seed, int workers) {
    convgen_sim::Settings& s = convgen_sim::settings();
    s.order = order;
    s.seed = seed;
    s.workers = workers;
}
__attribute__((visibility("default"), used)) const char* convgen_sim_error() { return convgen_sim::last_error().c_str(); }
// the launches made by the calling thread through this library
__attribute__((visibility("default"), used)) unsigned long long convgen_sim_launches() { return convgen_sim::launch_count(); }
__attribute__((visibility("default"), used)) int convgen_sim_warp_size() { return CONVGEN_SIM_WARP; }
// 1 where the library was built with the checks' instrumentation (racecheck, memcheck, initcheck of
// every load and store), 0 where only the explicit ones run (asynchronous copies, alignment).
__attribute__((visibility("default"), used)) int convgen_sim_checked() {
#if defined(CONVGEN_SIM_CHECKS)
    return 1;
#else
    return 0;
#endif
}
// The calling thread's buffers for its next entry calls (armed = 0: global accesses unchecked):
// name, first byte, size and element size of each (a tensor's storage). A workspace the entry
// allocates is added and removed by the entry itself.
__attribute__((visibility("default"), used)) void convgen_sim_set_buffers(int armed, int n, const char* const* names,
                                                                         const unsigned long long* base,
                                                                         const unsigned long long* bytes,
                                                                         const int* element) {
    convgen_sim::Registry& r = convgen_sim::registry();
    for (auto& b : r.buffers) std::free(b.written);
    r.buffers.clear();
    r.armed = armed != 0;
    for (int i = 0; i < n; ++i) {
        convgen_sim::Buffer b;
        b.lo = base[i];
        b.hi = base[i] + bytes[i];
        b.element = element[i] > 0 ? static_cast<unsigned>(element[i]) : 1u;
        b.name = names[i];
        r.buffers.push_back(std::move(b));
    }
}
// Profile the calling thread's next launches (1) or not (0); either way the profiles so far are dropped.
__attribute__((visibility("default"), used)) void convgen_sim_profile(int on) {
    convgen_sim::settings().profile = on != 0;
    convgen_sim::profiles().clear();
}
__attribute__((visibility("default"), used)) int convgen_sim_profile_count() {
    return static_cast<int>(convgen_sim::profiles().size());
}
// Launch i's kernel name, and its counters in this order: blocks, barriers, tensor_instructions,
// shared_requests, shared_wavefronts, shared_ideal, global_requests, global_sectors, bytes_read, bytes_written.
__attribute__((visibility("default"), used)) const char* convgen_sim_profile_get(int i, unsigned long long* out) {
    const convgen_sim::LaunchProfile& p = convgen_sim::profiles().at(static_cast<size_t>(i));
    const convgen_sim::Counters& c = p.counters;
    const unsigned long long values[] = {c.blocks, c.barriers, c.tensor_instructions, c.shared_requests,
                                         c.shared_wavefronts, c.shared_ideal, c.global_requests, c.global_sectors,
                                         c.bytes_read, c.bytes_written, c.store_requests, c.store_sectors};
    std::memcpy(out, values, sizeof values);
    return p.kernel.c_str();
}
}
#endif  // CONVGEN_SIM_DEFINE_RUNTIME
