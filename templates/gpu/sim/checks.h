// convgen SIMT simulator, part 2: the checks a GPU's own tools make, and the profile counters.
// Included by simt.h (after fiber.h).
//
// With CONVGEN_SIM_CHECKS (building/sim_build.py's CHECK_FLAGS) g++ compiles the kernel file with
// its kernel-address instrumentation in call mode: every load and store the kernel makes calls
// one of the __asan_{load,store}{1,2,4,8,16,N}_noabort hooks defined here (no sanitizer runtime is
// linked; the hooks are this library's own, kept local by sim/hooks.map). A hook sorts the address:
//   the thread's own stack (its registers and locals)      -> nothing to check
//   the block's shared memory (one arena: dynamic + static) -> racecheck, initcheck, bounds, banks
//   a buffer the plan entry was called with, the workspace -> memcheck (bounds), workspace initcheck
//   the simulator's own state, the launching thread's stack (the kernel's arguments), a loaded
//   object's image or TLS                                   -> nothing to check
//   anything else                                           -> out of bounds of every buffer
// and checks natural alignment for 2-, 4-, 8- and 16-byte accesses (vector and asynchronous copies
// check theirs explicitly: require_aligned). A broken rule fails the launch as every simulator
// failure does (fiber.h's fail), with a message naming the kernel, block, thread(s), the code
// (as {pc 0x...} tokens that devices/sim.py turns into file:line) and the address.
//
// racecheck: shared-memory hazards (read after write, write after read, write after write) between
// two threads that nothing orders: of different warps within one barrier interval (between two
// __syncthreads of the block), or of one warp with no warp collective (shuffle, __syncwarp, ballot,
// matrix instruction) between them. An asynchronous copy (cp.async) is a write at its issue and
// stays live until the wait that lands it: any access to its bytes in between is a hazard. The
// check does not depend on the order the simulator runs threads in: it compares every access with
// the ones recorded for the same bytes in the same interval.
// initcheck: shared memory is uninitialised at a block's start (poisoned: 0xff bytes); a read of a
// byte no thread of the block wrote is an error. A workspace byte read before a kernel of the same
// call wrote it likewise.
// Profile (Settings::profile): per launch, shared-memory requests and their wavefronts (32 banks of
// 4 bytes; a request split in phases of 32, 16 or 8 lanes for 4-, 8- and 16-byte accesses; lanes on
// one word broadcast), global requests and 32-byte sectors (and apart, those of the requests that
// store: an epilogue's coalescing), bytes read and written, barriers and
// matrix instructions. A warp-level request is the n-th execution of one instruction by the lanes
// of a warp between two barriers, counted apart for its shared and its global accesses (a cp.async
// reads global memory only where its source is valid: a zero fill writes shared memory alone).
#pragma once

namespace convgen_sim {

// The most shared memory a block may have here: above every target's (sm_90: 227 KiB a block).
constexpr size_t SHARED_CAPACITY = 256 * 1024;
constexpr uint16_t NOBODY = 0xffff;

// While alive, the running fiber's accesses are the simulator's own (not checked).
struct Inside {
    Fiber* f;
    CONVGEN_SIM_UNCHECKED Inside() : f(worker().current) { if (f) ++f->inside; }
    CONVGEN_SIM_UNCHECKED ~Inside() { if (f) --f->inside; }
};

// A buffer a plan entry was called with: a tensor's storage, or the workspace it allocated.
struct Buffer {
    uintptr_t lo = 0, hi = 0;
    unsigned element = 1;                 // bytes per element, for messages
    std::string name;
    unsigned char* written = nullptr;     // a workspace's bytes written by a kernel of this call
};

// The calling thread's buffers (devices/sim.py sets them around each entry call). Not armed: the
// caller did not say, and global accesses are not checked.
struct Registry {
    bool armed = false;
    std::vector<Buffer> buffers;
};
inline Registry& registry() { static thread_local Registry r; return r; }

struct Counters {
    unsigned long long blocks = 0, barriers = 0, tensor_instructions = 0;
    unsigned long long shared_requests = 0, shared_wavefronts = 0, shared_ideal = 0;
    unsigned long long global_requests = 0, global_sectors = 0, bytes_read = 0, bytes_written = 0;
    unsigned long long store_requests = 0, store_sectors = 0;   // the global requests that store, their sectors
    void add(const Counters& o) {
        blocks += o.blocks; barriers += o.barriers; tensor_instructions += o.tensor_instructions;
        shared_requests += o.shared_requests; shared_wavefronts += o.shared_wavefronts; shared_ideal += o.shared_ideal;
        global_requests += o.global_requests; global_sectors += o.global_sectors;
        bytes_read += o.bytes_read; bytes_written += o.bytes_written;
        store_requests += o.store_requests; store_sectors += o.store_sectors;
    }
};
struct LaunchProfile { std::string kernel; Counters counters; };
// The calling thread's launches since devices/sim.py last cleared them (with Settings::profile).
inline std::vector<LaunchProfile>& profiles() { static thread_local std::vector<LaunchProfile> p; return p; }

CONVGEN_SIM_RT void access(uintptr_t a, size_t bytes, bool store, const void* pc);

// One access recorded in the shadow: where (an instruction of this library, as an offset from the
// checks' own code: 4 bytes, not 8), by whom, the count of its warp's collectives then, and (once
// the block uses mbarriers) the thread's own clock then.
struct Access {
    int32_t pc = 0;
    uint32_t epoch = 0;
    uint32_t clock = 0;
    uint16_t thread = NOBODY;
    Access() = default;
    Access(const void* where, uint32_t e, unsigned t, uint32_t k)
        : pc(static_cast<int32_t>(reinterpret_cast<intptr_t>(where) - reinterpret_cast<intptr_t>(&access))),
          epoch(e), clock(k), thread(static_cast<uint16_t>(t)) {}
    const void* where() const { return reinterpret_cast<const char*>(&access) + pc; }
};
// Per byte of shared memory: the last write and up to two reads of the current interval (the first,
// and the first from another warp than it), and the asynchronous copy in flight to it. Intervals
// are numbered per worker thread, which lives for one launch.
struct ShadowByte {
    uint32_t write_interval = 0, read_interval = 0, copy_interval = 0;
    Access write, read, other_read, copy;
};

// A warp-level request for the profile: the lanes' addresses of one instruction's n-th execution.
struct Request {
    bool shared = false, store = false;
    unsigned bytes = 0;
    std::vector<std::pair<unsigned, uintptr_t>> lanes;
};

struct BlockChecks {
    unsigned char* shared = nullptr;      // SHARED_CAPACITY bytes: the dynamic part first, then the statics
    size_t dynamic_bytes = 0, used = 0;
    std::vector<std::pair<const char*, size_t>> statics;   // a static declaration's site and its offset
    std::vector<ShadowByte> shadow;
    uint32_t interval = 0, block_first = 0;      // barrier intervals, unique within the worker
    unsigned barriers = 0;
    const char* last_barrier = nullptr;
    // The interval's first read of bytes no thread wrote: reported at its end unless another
    // thread's write to them makes it a race first (the simulator may run the reader first).
    struct { bool set; size_t offset, bytes; unsigned thread; const void* pc; } unwritten{};
    std::vector<uint32_t> warp_epoch;     // warp collectives completed, per warp of the block
    std::vector<std::pair<uintptr_t, uintptr_t>> known;    // loaded objects' segments and TLS seen so far
    // Happens-before through mbarriers (sim/mbarrier.h), from the block's first mbarrier.init: per
    // thread, a vector clock (threads x threads: row t, what thread t has seen of each thread's clock;
    // t's own entry counts its arrivals, from 1). An access of thread a at its clock k is ordered
    // before thread t's when t's row holds k or more for a.
    bool ordered_by_mbarriers = false;
    unsigned clock_threads = 0;
    std::vector<uint32_t> clocks;
    Counters counters;
    // per thread: an instruction's count of shared [1] and of global [0] accesses
    std::vector<std::unordered_map<const void*, uint32_t>> executions[2];
    std::map<std::tuple<const void*, bool, uint32_t, unsigned>, Request> requests;   // (instruction, shared, execution, warp)
    ~BlockChecks() { std::free(shared); }
};

CONVGEN_SIM_RT std::string pc_text(const void* pc);
CONVGEN_SIM_RT std::string shared_text(size_t offset, size_t bytes);
CONVGEN_SIM_RT void block_begin(Worker& w, Launch& l);
CONVGEN_SIM_RT void block_end(Worker& w, Launch& l);
CONVGEN_SIM_RT void barrier_done(Worker& w, const char* site);
CONVGEN_SIM_RT void collective_done(Worker& w, unsigned warp, bool matrix);
CONVGEN_SIM_RT unsigned char* static_shared(size_t bytes, size_t align, const char* site);
CONVGEN_SIM_RT void require_aligned(const void* p, unsigned bytes, const char* what);
CONVGEN_SIM_RT void shared_load(const void* p, unsigned bytes, const char* what, const void* pc);
CONVGEN_SIM_RT void tensor_read(const void* p, unsigned bytes, const char* what, const void* pc);
CONVGEN_SIM_RT void tensor_instruction();
CONVGEN_SIM_RT void copy_issue(void* shared, const void* global, unsigned bytes, unsigned source_bytes, const void* pc);
CONVGEN_SIM_RT void copy_landed(void* shared, unsigned bytes, const void* pc);
CONVGEN_SIM_RT void workspace_added(void* p, unsigned long long bytes);
CONVGEN_SIM_RT void workspace_removed(void* p);
CONVGEN_SIM_RT void mbarrier_initialised(Mbarrier& m, const void* pc);
CONVGEN_SIM_RT void mbarrier_ordered_after_init(const Mbarrier& m, const char* what, const void* pc);
CONVGEN_SIM_RT void mbarrier_release(Mbarrier& m, unsigned thread);
CONVGEN_SIM_RT void mbarrier_arrived(unsigned thread);
CONVGEN_SIM_RT void mbarrier_acquire(const Mbarrier& m, unsigned thread);

CONVGEN_SIM_UNCHECKED inline unsigned char* dynamic_shared() { return worker().checks->shared; }

#if CONVGEN_SIM_DEFINE_RUNTIME
CONVGEN_SIM_RT void free_checks(BlockChecks* c) { delete c; }

// "{pc 0x1a2b}": an instruction of this library by its offset (devices/sim.py names its source line).
CONVGEN_SIM_RT std::string pc_text(const void* pc) {
    Dl_info info;
    char buf[64];
    if (pc && dladdr(pc, &info) && info.dli_fbase)
        snprintf(buf, sizeof buf, "{pc 0x%llx}",
                 static_cast<unsigned long long>(static_cast<const char*>(pc) - static_cast<const char*>(info.dli_fbase) - 1));
    else
        snprintf(buf, sizeof buf, "%p", pc);
    return buf;
}

CONVGEN_SIM_RT std::string shared_text(size_t offset, size_t bytes) {
    const BlockChecks& c = *worker().checks;
    std::string where = "shared memory bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                        ") of the block's " + std::to_string(c.used);
    const std::pair<const char*, size_t>* in = nullptr;   // statics are in increasing offsets
    for (const auto& s : c.statics)
        if (offset >= s.second) in = &s;
    if (in) where += " (in the static declaration at " + std::string(in->first) + ", from byte " + std::to_string(in->second) + ")";
    return where;
}

CONVGEN_SIM_RT std::string interval_text(const BlockChecks& c) {
    return c.barriers ? "after the block's barrier #" + std::to_string(c.barriers) + " (" + c.last_barrier +
                            ") and before the next"
                      : std::string("between the block's start and its first barrier");
}

CONVGEN_SIM_RT std::string thread_of(unsigned linear) {
    const Fiber& f = worker().fibers[linear];
    return "thread " + thread_name(f) + " (warp " + std::to_string(linear / CONVGEN_SIM_WARP) + ")";
}

// A rule broken by the running fiber: its own accesses are no longer checked (it never resumes).
[[noreturn]] CONVGEN_SIM_RT void check_failed(const std::string& message) {
    ++worker().current->inside;
    fail(message);
}

CONVGEN_SIM_RT void block_begin(Worker& w, Launch& l) {
    if (!w.checks) {
        w.checks = new BlockChecks;
        w.checks->shared = static_cast<unsigned char*>(std::aligned_alloc(128, SHARED_CAPACITY));
        if (!w.checks->shared) { fprintf(stderr, "convgen simulator: cannot allocate shared memory\n"); abort(); }
    }
    BlockChecks& c = *w.checks;
    if (l.shared_bytes > SHARED_CAPACITY) {
        record_error("the launch asks for " + std::to_string(l.shared_bytes) + " bytes of dynamic shared memory; no GPU "
                     "gives a block more than " + std::to_string(SHARED_CAPACITY) + " (sm_90: 232448)");
        return;
    }
    c.dynamic_bytes = l.shared_bytes;
    c.used = (l.shared_bytes + 15) / 16 * 16;
    c.statics.clear();
    std::memset(c.shared, 0xff, c.used);   // poisoned: NaN floats, -1 ints
    if (c.shadow.size() < c.used) c.shadow.resize(c.used);
    c.block_first = ++c.interval;
    c.barriers = 0;
    c.last_barrier = nullptr;
    c.unwritten.set = false;
    unsigned threads = static_cast<unsigned>(w.fibers.size());
    c.warp_epoch.assign((threads + CONVGEN_SIM_WARP - 1) / CONVGEN_SIM_WARP, 0);
    c.ordered_by_mbarriers = false;
    c.counters = Counters{};
    c.counters.blocks = 1;
    if (l.settings.profile) {
        for (auto& e : c.executions) e.assign(threads, {});
        c.requests.clear();
    }
}

// The profile's figures of the warp-level requests recorded since the last barrier.
CONVGEN_SIM_RT void flush_requests(BlockChecks& c) {
    for (auto& item : c.requests) {
        Request& r = item.second;
        if (r.shared) {
            unsigned per_phase = r.bytes <= 4 ? 32 : r.bytes == 8 ? 16 : 8;
            std::sort(r.lanes.begin(), r.lanes.end());
            size_t i = 0;
            ++c.counters.shared_requests;
            while (i < r.lanes.size()) {
                unsigned phase = r.lanes[i].first / per_phase;
                std::vector<uintptr_t> words[32];
                for (; i < r.lanes.size() && r.lanes[i].first / per_phase == phase; ++i)
                    for (uintptr_t word = r.lanes[i].second / 4; word <= (r.lanes[i].second + r.bytes - 1) / 4; ++word) {
                        auto& bank = words[word % 32];
                        if (std::find(bank.begin(), bank.end(), word) == bank.end()) bank.push_back(word);
                    }
                size_t wavefronts = 0;
                for (auto& bank : words) wavefronts = std::max(wavefronts, bank.size());
                c.counters.shared_wavefronts += wavefronts;
                c.counters.shared_ideal += 1;
            }
        } else {
            std::vector<uintptr_t> sectors;
            for (const auto& lane : r.lanes)
                for (uintptr_t s = lane.second / 32; s <= (lane.second + r.bytes - 1) / 32; ++s) sectors.push_back(s);
            std::sort(sectors.begin(), sectors.end());
            const auto distinct = static_cast<unsigned long long>(std::unique(sectors.begin(), sectors.end()) - sectors.begin());
            ++c.counters.global_requests;
            c.counters.global_sectors += distinct;
            if (r.store) {
                ++c.counters.store_requests;
                c.counters.store_sectors += distinct;
            }
        }
    }
    c.requests.clear();
    for (auto& kind : c.executions)
        for (auto& e : kind) e.clear();
}

// The end of a barrier interval: an unwritten read that no race explained is an error now.
CONVGEN_SIM_RT void interval_end(BlockChecks& c) {
    if (!c.unwritten.set) return;
    c.unwritten.set = false;
    record_error(thread_of(c.unwritten.thread) + ": shared load of " + std::to_string(c.unwritten.bytes) + " bytes at " +
                 pc_text(c.unwritten.pc) + " read " + shared_text(c.unwritten.offset, c.unwritten.bytes) +
                 ", which no thread of the block wrote (uninitialised) " + interval_text(c));
}

CONVGEN_SIM_RT void block_end(Worker& w, Launch& l) {
    BlockChecks& c = *w.checks;
    interval_end(c);
    if (!l.counters) return;
    flush_requests(c);
    std::lock_guard<std::mutex> lock(l.error_mutex);
    l.counters->add(c.counters);
}

CONVGEN_SIM_RT void barrier_done(Worker& w, const char* site) {
    BlockChecks& c = *w.checks;
    interval_end(c);
    ++c.interval;
    ++c.barriers;
    ++c.counters.barriers;
    c.last_barrier = site;
    if (w.launch->settings.profile) flush_requests(c);
}

CONVGEN_SIM_RT void collective_done(Worker& w, unsigned warp, bool matrix) {
    BlockChecks& c = *w.checks;
    ++c.warp_epoch[warp];
    if (matrix) ++c.counters.tensor_instructions;
}

CONVGEN_SIM_RT unsigned char* static_shared(size_t bytes, size_t align, const char* site) {
    Inside inside;
    BlockChecks& c = *worker().checks;
    for (const auto& s : c.statics)
        if (s.first == site) return c.shared + s.second;
    align = std::max<size_t>(align, 16);
    size_t offset = (c.used + align - 1) / align * align;
    if (offset + bytes > SHARED_CAPACITY)
        fail("shared memory: the static declaration at " + std::string(site) + " (" + std::to_string(bytes) +
             " bytes) takes the block past " + std::to_string(SHARED_CAPACITY) + " bytes (" + std::to_string(c.used) +
             " already: " + std::to_string(c.dynamic_bytes) + " dynamic); no GPU gives a block that much");
    c.statics.push_back({site, offset});
    c.used = offset + bytes;
    std::memset(c.shared + offset, 0xff, bytes);
    if (c.shadow.size() < c.used) c.shadow.resize(c.used);
    return c.shared + offset;
}

// Is `a` memory of the simulator, of the kernel's arguments or of a loaded object (not a buffer)?
CONVGEN_SIM_RT bool known_memory(Worker& w, uintptr_t a) {
    const Launch& l = *w.launch;
    if (a - l.caller_stack_lo < l.caller_stack_hi - l.caller_stack_lo) return true;
    if (a - reinterpret_cast<uintptr_t>(&w) < sizeof(Worker)) return true;
    if (a - reinterpret_cast<uintptr_t>(w.fibers.data()) < w.fibers.size() * sizeof(Fiber)) return true;
    BlockChecks& c = *w.checks;
    if (a - reinterpret_cast<uintptr_t>(&c) < sizeof(BlockChecks)) return true;
    for (const auto& r : c.known)
        if (a - r.first < r.second - r.first) return true;
    struct Search { uintptr_t a; std::pair<uintptr_t, uintptr_t> found; } search{a, {0, 0}};
    dl_iterate_phdr([](dl_phdr_info* info, size_t, void* p) {
        Search& s = *static_cast<Search*>(p);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& h = info->dlpi_phdr[i];
            uintptr_t lo = 0;
            if (h.p_type == PT_LOAD) lo = info->dlpi_addr + h.p_vaddr;
            else if (h.p_type == PT_TLS && info->dlpi_tls_data) lo = reinterpret_cast<uintptr_t>(info->dlpi_tls_data);
            else continue;
            if (s.a - lo < h.p_memsz) { s.found = {lo, lo + h.p_memsz}; return 1; }
        }
        return 0;
    }, &search);
    if (!search.found.second) return false;
    c.known.push_back(search.found);
    return true;
}

CONVGEN_SIM_RT void record_request(Worker& w, Fiber& f, bool shared, uintptr_t a, size_t bytes, const void* pc,
                                   bool store) {
    BlockChecks& c = *w.checks;
    uint32_t n = c.executions[shared][f.linear][pc]++;
    Request& r = c.requests[{pc, shared, n, f.linear / CONVGEN_SIM_WARP}];
    r.shared = shared;
    r.store = store;
    r.bytes = static_cast<unsigned>(bytes);
    r.lanes.push_back({f.linear % CONVGEN_SIM_WARP, shared ? a - reinterpret_cast<uintptr_t>(c.shared) : a});
}

CONVGEN_SIM_RT std::string kind_text(bool store, size_t bytes) {
    return std::string(store ? "store" : "load") + " of " + std::to_string(bytes) + " byte" + (bytes == 1 ? "" : "s");
}

CONVGEN_SIM_RT void global_access(Worker& w, Fiber& f, uintptr_t a, size_t bytes, bool store, const void* pc) {
    Launch& l = *w.launch;
    Registry* r = l.registry;
    bool armed = r && r->armed;
    const Buffer* hit = nullptr;
    if (armed)
        for (const Buffer& b : r->buffers)
            if (a - b.lo < b.hi - b.lo) { hit = &b; break; }
    if (!hit) {
        if (known_memory(w, a)) return;
        if (armed) {
            const Buffer* near = nullptr;
            unsigned long long distance = ~0ull;
            for (const Buffer& b : r->buffers) {
                unsigned long long d = a >= b.hi ? a - b.hi : b.lo - a;
                if (d < distance) { distance = d; near = &b; }
            }
            std::string where = "outside every buffer the entry was given";
            if (near) {
                long long element = (static_cast<long long>(a) - static_cast<long long>(near->lo)) / near->element;
                where += "; nearest: " + near->name + ", " + std::to_string(distance) + " bytes " +
                         (a >= near->hi ? "past its end" : "before its start") + " (its element " +
                         std::to_string(element) + " of " + std::to_string((near->hi - near->lo) / near->element) +
                         " of " + std::to_string(near->element) + " bytes)";
            }
            check_failed("global " + kind_text(store, bytes) + " at " + pc_text(pc) + ", address 0x" +
                         hex(a).substr(2) + ": " + where);
        }
    } else {
        if (a + bytes > hit->hi)
            check_failed("global " + kind_text(store, bytes) + " at " + pc_text(pc) + " runs past the end of " +
                         hit->name + " (its element " + std::to_string((a - hit->lo) / hit->element) + " of " +
                         std::to_string((hit->hi - hit->lo) / hit->element) + ", " + std::to_string(a + bytes - hit->hi) +
                         " bytes past)");
        if (hit->written) {
            unsigned char* mark = hit->written + (a - hit->lo);
            if (store) {
                for (size_t i = 0; i < bytes; ++i) __atomic_store_n(mark + i, 1, __ATOMIC_RELAXED);
            } else {
                for (size_t i = 0; i < bytes; ++i)
                    if (!__atomic_load_n(mark + i, __ATOMIC_RELAXED))
                        check_failed("global " + kind_text(store, bytes) + " at " + pc_text(pc) + " reads " + hit->name +
                                     " byte " + std::to_string(a - hit->lo + i) + ", which no kernel of this call wrote "
                                     "(a workspace is uninitialised when allocated)");
            }
        }
    }
    if (l.settings.profile) {
        (store ? w.checks->counters.bytes_written : w.checks->counters.bytes_read) += bytes;
        record_request(w, f, false, a, bytes, pc, store);
    }
}

// Thread t's own clock, once the block uses mbarriers (else 0: accesses ordered by barriers alone).
CONVGEN_SIM_UNCHECKED inline uint32_t own_clock(const BlockChecks& c, unsigned t) {
    return c.ordered_by_mbarriers ? c.clocks[static_cast<size_t>(t) * c.clock_threads + t] : 0;
}

// Has thread t seen thread `other` at its clock `clock` (mbarrier arrivals and waits between)?
CONVGEN_SIM_UNCHECKED inline bool sees(const BlockChecks& c, unsigned t, unsigned other, uint32_t clock) {
    return c.ordered_by_mbarriers && clock && c.clocks[static_cast<size_t>(t) * c.clock_threads + other] >= clock;
}

// Is access x ordered before thread t's next one by mbarrier arrivals and waits?
CONVGEN_SIM_UNCHECKED inline bool seen_by(const BlockChecks& c, unsigned t, const Access& x) {
    return sees(c, t, x.thread, x.clock);
}

CONVGEN_SIM_RT void race(const char* kind, const std::string& where, const Access& mine, bool my_store,
                         const Access& theirs, bool their_store, const BlockChecks& c) {
    check_failed(std::string("shared-memory race (") + kind + ") on " + where + ": this thread " +
                 (my_store ? "writes" : "reads") + " at " + pc_text(mine.where()) + " and " + thread_of(theirs.thread) + " " +
                 (their_store ? "wrote" : "read") + " at " + pc_text(theirs.where()) + " " + interval_text(c) +
                 ", with no barrier between them" + (c.ordered_by_mbarriers ? " nor an mbarrier arrival and wait" : "") +
                 (theirs.thread / CONVGEN_SIM_WARP == mine.thread / CONVGEN_SIM_WARP ? " (same warp: nor a warp collective)" : ""));
}

// One shared-memory access by the running thread; `copy` for an asynchronous copy's issue (a write
// checked now, live until it lands).
// `profile`: counted as one of the thread's requests (not for the tensor cores' own reads, sim/wgmma.h).
CONVGEN_SIM_RT void shared_access(Worker& w, Fiber& f, size_t offset, size_t bytes, bool store, const void* pc, bool copy,
                                  bool profile = true) {
    BlockChecks& c = *w.checks;
    if (offset + bytes > c.used)
        check_failed(std::string(copy ? "asynchronous copy" : store ? "shared store" : "shared load") + " of " +
                     std::to_string(bytes) + " bytes at " + pc_text(pc) + " to shared memory bytes [" +
                     std::to_string(offset) + ", " + std::to_string(offset + bytes) + "): the block has " +
                     std::to_string(c.used) + " (" + std::to_string(c.dynamic_bytes) + " dynamic)");
    const unsigned t = f.linear, warp = t / CONVGEN_SIM_WARP;
    const uint32_t epoch = c.warp_epoch[warp];
    const uint32_t now = c.interval;
    const Access mine(pc, epoch, t, own_clock(c, t));
    auto unordered = [&](const Access& x) {
        return x.thread != t && (x.thread / CONVGEN_SIM_WARP != warp || x.epoch == epoch) && !seen_by(c, t, x);
    };
    for (size_t i = 0; i < bytes; ++i) {
        ShadowByte& s = c.shadow[offset + i];
        if (s.copy.thread != NOBODY && s.copy_interval >= c.block_first)
            check_failed((copy ? std::string("asynchronous copy") : store ? std::string("shared store") : std::string("shared load")) +
                         " at " + pc_text(pc) + " touches " + shared_text(offset + i, 1) + " while the asynchronous copy " +
                         (s.copy.thread == t ? std::string("of this thread") : "of " + thread_of(s.copy.thread)) + " issued at " +
                         pc_text(s.copy.where()) + " is in flight (not yet landed by the wait that covers it)");
        if (!store) {
            if (s.write_interval < c.block_first && !c.unwritten.set) c.unwritten = {true, offset, bytes, t, pc};
            if (s.write_interval == now && unordered(s.write))
                race("read after write", shared_text(offset, bytes), mine, false, s.write, true, c);
            if (s.read_interval != now) {
                s.read_interval = now;
                s.read = mine;
                s.other_read.thread = NOBODY;
            } else if (c.ordered_by_mbarriers && (s.read.thread == t || seen_by(c, t, s.read))) {
                // (a pipeline on mbarriers runs in one barrier interval: the reads kept are the latest
                // ones no later read is ordered after, which a later write must be ordered after)
                s.read = mine;
                if (s.other_read.thread != NOBODY && (s.other_read.thread == t || seen_by(c, t, s.other_read)))
                    s.other_read.thread = NOBODY;
            } else if (s.other_read.thread == NOBODY && s.read.thread / CONVGEN_SIM_WARP != warp) {
                s.other_read = mine;
            }
        } else {
            if (s.write_interval == now && unordered(s.write))
                race("write after write", shared_text(offset, bytes), mine, true, s.write, true, c);
            if (s.read_interval == now) {
                if (unordered(s.read)) race("write after read", shared_text(offset, bytes), mine, true, s.read, false, c);
                if (s.other_read.thread != NOBODY && unordered(s.other_read))
                    race("write after read", shared_text(offset, bytes), mine, true, s.other_read, false, c);
            }
            if (copy) {
                s.copy = mine;
                s.copy_interval = now;
            } else {
                s.write_interval = now;
                s.write = mine;
            }
        }
    }
    if (profile && w.launch->settings.profile) record_request(w, f, true, reinterpret_cast<uintptr_t>(c.shared) + offset, bytes, pc, store);
}

CONVGEN_SIM_RT void misaligned(const char* what, uintptr_t a, unsigned bytes, const void* pc) {
    ++worker().current->inside;   // the message's own code (check_failed: never resumed)
    check_failed(std::string(what) + " at " + (pc ? pc_text(pc) : std::string("?")) + ", address 0x" + hex(a).substr(2) +
                 ": not aligned to its " + std::to_string(bytes) + " bytes (a GPU faults: misaligned address)");
}

CONVGEN_SIM_RT void access(uintptr_t a, size_t bytes, bool store, const void* pc) {
    Worker* running = running_worker;
    if (!running) return;   // not a thread that runs blocks: the plan entry's own code
    Worker& w = *running;
    Fiber* f = w.current;
    if (!f || f->inside) return;
    if (a - reinterpret_cast<uintptr_t>(f->stack) < CONVGEN_SIM_STACK_BYTES) return;   // its own locals
    ++f->inside;   // the library code the checks call (std::vector's, instrumented too) is not the kernel's
    if (bytes > 1 && bytes <= 16 && (bytes & (bytes - 1)) == 0 && (a & (bytes - 1)))
        misaligned(store ? "store" : "load", a, static_cast<unsigned>(bytes), pc);
    uintptr_t offset = a - reinterpret_cast<uintptr_t>(w.checks->shared);
    if (offset < SHARED_CAPACITY) shared_access(w, *f, offset, bytes, store, pc, false);
    else global_access(w, *f, a, bytes, store, pc);
    --f->inside;
}

CONVGEN_SIM_RT void require_aligned(const void* p, unsigned bytes, const char* what) {
    Inside inside;
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (a % bytes) misaligned(what, a, bytes, __builtin_return_address(0));
}

// A load the simulator makes for a thread (an ldmatrix row): `bytes` aligned, in shared memory,
// checked and recorded as the thread's own load at `pc`. Racecheck, initcheck and the profile need
// every store the kernel makes seen, which only the checks' instrumentation does: a library built
// without it (checks off, or under ASan) checks the alignment and the place alone.
CONVGEN_SIM_RT void shared_load(const void* p, unsigned bytes, const char* what, const void* pc) {
    Worker& w = worker();
    uintptr_t a = reinterpret_cast<uintptr_t>(p), offset = a - reinterpret_cast<uintptr_t>(w.checks->shared);
    if (a % bytes) misaligned(what, a, bytes, pc);
    if (offset >= SHARED_CAPACITY)
        check_failed(std::string(what) + " at " + pc_text(pc) + ": the address 0x" + hex(a).substr(2) + " is not shared memory");
#if defined(CONVGEN_SIM_CHECKS)
    shared_access(w, *w.current, offset, bytes, false, pc, false);
#endif
}

// A read of shared memory the tensor cores make for a thread's warpgroup MMA (sim/wgmma.h), done when
// the thread's wait covers it: in shared memory, checked (racecheck, initcheck) as the thread's load
// at `pc`, not counted among its requests (the profile's bank figures are the threads' own accesses).
CONVGEN_SIM_RT void tensor_read(const void* p, unsigned bytes, const char* what, const void* pc) {
    Worker& w = worker();
    uintptr_t a = reinterpret_cast<uintptr_t>(p), offset = a - reinterpret_cast<uintptr_t>(w.checks->shared);
    if (offset >= w.checks->used || offset + bytes > w.checks->used)
        check_failed(std::string(what) + " issued at " + pc_text(pc) + ": shared memory bytes [" + std::to_string(offset) +
                     ", " + std::to_string(offset + bytes) + ") are past the block's " + std::to_string(w.checks->used));
#if defined(CONVGEN_SIM_CHECKS)
    shared_access(w, *w.current, offset, bytes, false, pc, false, false);
#endif
}

// A warpgroup MMA counted in the profile: once a warp (the lane 0 of each warp calls it), as a warp's
// mma.sync is.
CONVGEN_SIM_RT void tensor_instruction() { ++worker().checks->counters.tensor_instructions; }

CONVGEN_SIM_RT void copy_issue(void* shared, const void* global, unsigned bytes, unsigned source_bytes, const void* pc) {
    Worker& w = worker();
    Fiber& f = *w.current;
    uintptr_t s = reinterpret_cast<uintptr_t>(shared), g = reinterpret_cast<uintptr_t>(global);
    if (s % bytes) misaligned("cp.async's shared destination", s, bytes, pc);
    if (source_bytes && g % bytes) misaligned("cp.async's global source", g, bytes, pc);
    uintptr_t offset = s - reinterpret_cast<uintptr_t>(w.checks->shared);
    if (offset >= SHARED_CAPACITY)
        check_failed("cp.async at " + pc_text(pc) + ": the destination 0x" + hex(s).substr(2) + " is not shared memory");
    if (source_bytes) global_access(w, f, g, source_bytes, false, pc);
    shared_access(w, f, offset, bytes, true, pc, true);
}

CONVGEN_SIM_RT void copy_landed(void* shared, unsigned bytes, const void* pc) {
    Worker& w = worker();
    BlockChecks& c = *w.checks;
    const unsigned t = w.current->linear;
    size_t offset = static_cast<unsigned char*>(shared) - c.shared;
    const Access landed(pc, c.warp_epoch[t / CONVGEN_SIM_WARP], t, own_clock(c, t));
    for (size_t i = 0; i < bytes; ++i) {
        ShadowByte& s = c.shadow[offset + i];
        s.copy.thread = NOBODY;
        s.write_interval = c.interval;
        s.write = landed;
    }
}

CONVGEN_SIM_RT void workspace_added(void* p, unsigned long long bytes) {
    Registry& r = registry();
    Buffer b;
    b.lo = reinterpret_cast<uintptr_t>(p);
    b.hi = b.lo + bytes;
    b.name = "the workspace";
#if defined(CONVGEN_SIM_CHECKS)   // which bytes were written is known only where every store is seen
    b.written = static_cast<unsigned char*>(std::calloc(bytes ? bytes : 1, 1));
#endif
    r.buffers.push_back(std::move(b));
}

CONVGEN_SIM_RT void workspace_removed(void* p) {
    Registry& r = registry();
    for (size_t i = 0; i < r.buffers.size(); ++i)
        if (r.buffers[i].lo == reinterpret_cast<uintptr_t>(p) && r.buffers[i].name == "the workspace") {
            std::free(r.buffers[i].written);
            r.buffers.erase(r.buffers.begin() + static_cast<long>(i));
            return;
        }
}

CONVGEN_SIM_RT void caller_stack(uintptr_t& lo, uintptr_t& hi) {
    static thread_local uintptr_t cached_lo = 0, cached_hi = 0;
    if (!cached_hi) {
        pthread_attr_t attr;
        void* base = nullptr;
        size_t size = 0;
        if (pthread_getattr_np(pthread_self(), &attr) == 0) {
            pthread_attr_getstack(&attr, &base, &size);
            pthread_attr_destroy(&attr);
        }
        cached_lo = reinterpret_cast<uintptr_t>(base);
        cached_hi = cached_lo + size;
    }
    lo = cached_lo;
    hi = cached_hi;
}

#if defined(CONVGEN_SIM_CHECKS)
// The instrumentation's entry points (g++'s kernel-address call mode).
#define CONVGEN_SIM_HOOKS(n)                                                                                      \
    extern "C" CONVGEN_SIM_UNCHECKED void __asan_load##n##_noabort(void* p) {                                    \
        access(reinterpret_cast<uintptr_t>(p), n, false, __builtin_return_address(0));                            \
    }                                                                                                             \
    extern "C" CONVGEN_SIM_UNCHECKED void __asan_store##n##_noabort(void* p) {                                   \
        access(reinterpret_cast<uintptr_t>(p), n, true, __builtin_return_address(0));                             \
    }
CONVGEN_SIM_HOOKS(1)
CONVGEN_SIM_HOOKS(2)
CONVGEN_SIM_HOOKS(4)
CONVGEN_SIM_HOOKS(8)
CONVGEN_SIM_HOOKS(16)
#undef CONVGEN_SIM_HOOKS
extern "C" CONVGEN_SIM_UNCHECKED void __asan_loadN_noabort(void* p, long n) {
    access(reinterpret_cast<uintptr_t>(p), static_cast<size_t>(n), false, __builtin_return_address(0));
}
extern "C" CONVGEN_SIM_UNCHECKED void __asan_storeN_noabort(void* p, long n) {
    access(reinterpret_cast<uintptr_t>(p), static_cast<size_t>(n), true, __builtin_return_address(0));
}
extern "C" CONVGEN_SIM_UNCHECKED void __asan_handle_no_return() {}
#endif
// --- mbarriers (sim/mbarrier.h) and the happens-before they give --------------------------------
CONVGEN_SIM_RT void mbarrier_initialised(Mbarrier& m, const void* pc) {
    Worker& w = worker();
    BlockChecks& c = *w.checks;
    const unsigned t = w.current->linear;
    if (!c.ordered_by_mbarriers) {
        const unsigned n = static_cast<unsigned>(w.fibers.size());
        c.ordered_by_mbarriers = true;
        c.clock_threads = n;
        c.clocks.assign(static_cast<size_t>(n) * n, 0);
        for (unsigned i = 0; i < n; ++i) c.clocks[static_cast<size_t>(i) * n + i] = 1;
    }
    m.init_thread = t;
    m.init_interval = c.interval;
    m.init_clock = own_clock(c, t);
    m.init_pc = pc;
}

// An mbarrier operation of the running thread must come after the barrier's initialisation: the
// same thread, a __syncthreads since, or an mbarrier arrival and wait ordering them.
CONVGEN_SIM_RT void mbarrier_ordered_after_init(const Mbarrier& m, const char* what, const void* pc) {
    Worker& w = worker();
    const BlockChecks& c = *w.checks;
    const unsigned t = w.current->linear;
    if (t == m.init_thread || c.interval != m.init_interval || sees(c, t, m.init_thread, m.init_clock)) return;
    fail(std::string(what) + " at " + pc_text(pc) + " on the mbarrier at " +
         shared_text(static_cast<const unsigned char*>(m.address) - c.shared, 8) + ", which " + thread_of(m.init_thread) +
         " initialised at " + pc_text(m.init_pc) + " with nothing ordering that before this (a __syncthreads after "
         "mbarrier.init)");
}

// An arrival of `thread`: what it has seen joins the phase's clocks (its own clock advances after).
CONVGEN_SIM_RT void mbarrier_release(Mbarrier& m, unsigned thread) {
    const BlockChecks& c = *worker().checks;
    const unsigned n = c.clock_threads;
    if (m.arrived.size() != n) m.arrived.assign(n, 0);
    const uint32_t* row = &c.clocks[static_cast<size_t>(thread) * n];
    for (unsigned i = 0; i < n; ++i) m.arrived[i] = std::max(m.arrived[i], row[i]);
}

CONVGEN_SIM_RT void mbarrier_arrived(unsigned thread) {
    BlockChecks& c = *worker().checks;
    ++c.clocks[static_cast<size_t>(thread) * c.clock_threads + thread];
}

// A wait of `thread` that the completion of the phase released: it has seen what the arrivals had.
CONVGEN_SIM_RT void mbarrier_acquire(const Mbarrier& m, unsigned thread) {
    BlockChecks& c = *worker().checks;
    const unsigned n = c.clock_threads;
    if (m.completed.size() != n) return;
    uint32_t* row = &c.clocks[static_cast<size_t>(thread) * n];
    for (unsigned i = 0; i < n; ++i) row[i] = std::max(row[i], m.completed[i]);
}

#endif  // CONVGEN_SIM_DEFINE_RUNTIME

}  // namespace convgen_sim
