// convgen's CUDA wrappers: the one place where CUDA differs from HIP for generated kernels.
// Kernels use CONVGEN_LAUNCH, CONVGEN_DYNAMIC_SHARED, CONVGEN_WARP, CONVGEN_FULL_MASK,
// convgen_stream_t and convgen_shfl_* only; under -DCONVGEN_SIM the simulator provides them.
#pragma once
#if defined(CONVGEN_SIM)
#ifndef CONVGEN_SIM_WARP
#define CONVGEN_SIM_WARP 32
#endif
#include "sim/simt.h"
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef cudaStream_t convgen_stream_t;
#define CONVGEN_WARP 32
// A launch: the kernel's status (0 when it was queued), never <<<>>> in kernel templates.
#define CONVGEN_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
    (kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__), static_cast<int>(cudaGetLastError()))
#ifndef CONVGEN_SHARED_ALIGN
#define CONVGEN_SHARED_ALIGN 16   // the dynamic shared memory's alignment (a kernel file may ask more first)
#endif
#define CONVGEN_DYNAMIC_SHARED(T, name) \
    extern __shared__ __align__(CONVGEN_SHARED_ALIGN) unsigned char convgen_dynamic_shared_[]; \
    T* name = reinterpret_cast<T*>(convgen_dynamic_shared_)
// A static shared array: `CONVGEN_SHARED(float, tile, [32][33]);` (the simulator places it where its
// checks see it).
#define CONVGEN_SHARED(T, name, dims) __shared__ __align__(16) T name dims
// A kernel that takes more than 48 KiB of dynamic shared memory opts in first: 0, else CUDA's error.
#define CONVGEN_SHARED_OPT_IN(kernel, bytes) \
    ((bytes) > 48 * 1024 \
         ? static_cast<int>(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (bytes))) : 0)
// A plan entry's scratch memory (a split-K workspace), stream-ordered: 0 when done, else CUDA's error.
inline int convgen_malloc_async(void** p, unsigned long long bytes, convgen_stream_t stream) {
    return static_cast<int>(cudaMallocAsync(p, bytes, stream));
}
inline int convgen_free_async(void* p, convgen_stream_t stream) { return static_cast<int>(cudaFreeAsync(p, stream)); }
#endif

// A kernel's launch bounds: at most `threads` per block, registers for `blocks` resident per SM.
#define CONVGEN_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
// A value kept in a register as computed, never recomputed where it is used: nvcc rematerialised the
// copies' shared offsets (a swizzle of threadIdx.x) at every k-step of a main loop rather than keep them
// in registers. An empty asm that may change it is the barrier; nothing in the simulator.
__device__ __forceinline__ void convgen_keep(int& v) {
#if !defined(CONVGEN_SIM)
    asm volatile("" : "+r"(v));
#else
    (void)v;
#endif
}
__device__ __forceinline__ void convgen_keep(unsigned& v) {   // a tap mask likewise
#if !defined(CONVGEN_SIM)
    asm volatile("" : "+r"(v));
#else
    (void)v;
#endif
}
__device__ __forceinline__ void convgen_keep(unsigned long long& v) {
#if !defined(CONVGEN_SIM)
    asm volatile("" : "+l"(v));
#else
    (void)v;
#endif
}
template <class P> __device__ __forceinline__ void convgen_keep(P*& p) {   // a pointer likewise
#if !defined(CONVGEN_SIM)
    asm volatile("" : "+l"(p));
#else
    (void)p;
#endif
}

// --- asynchronous copies global -> shared: cp.async (sm_80+), 16 bytes at a time -------------------
// A stage's copies are issued with convgen_copy16 (valid: any non-zero value, e.g. a predicate's bit, so
// that no 0/1 is made of it; a copy that is not valid gives 16 zero bytes and
// reads nothing, whatever its source address: padding and ragged edges), closed with convgen_copy_commit; convgen_copy_wait<N>() returns when at most the
// newest N committed stages are still in flight, and only after it *and a __syncthreads* may any
// thread read what the copies wrote. convgen_copy_land is for vendors that stage in registers
// (hip.h); here copies go straight to shared memory and it does nothing.
template <int N> struct convgen_copy_stage {};
#if defined(CONVGEN_SIM)
#include "sim/async_copy.h"
template <int N>
__device__ __forceinline__ void convgen_copy16(convgen_copy_stage<N>&, int, void* shared, const void* global, unsigned valid) {
    ::convgen_sim::async_copy(shared, global, 16, valid ? 16 : 0);
}
__device__ __forceinline__ void convgen_copy_commit() { ::convgen_sim::async_commit(); }
template <int N> __device__ __forceinline__ void convgen_copy_wait() { ::convgen_sim::async_wait(N); }
#else
template <int N>
__device__ __forceinline__ void convgen_copy16(convgen_copy_stage<N>&, int, void* shared, const void* global, unsigned valid) {
    unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    // ignore-src (PTX ISA 7.5): a copy that is not valid reads nothing at all -- its source address
    // may be anything -- and writes 16 zero bytes
    asm volatile("{\n .reg .pred ignore;\n setp.eq.u32 ignore, %2, 0;\n"
                 " cp.async.cg.shared.global [%0], [%1], 16, ignore;\n}\n" ::"r"(address), "l"(global), "r"(valid)
                 : "memory");
}
__device__ __forceinline__ void convgen_copy_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void convgen_copy_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif
template <int N> __device__ __forceinline__ void convgen_copy_land(convgen_copy_stage<N>&) {}
#define CONVGEN_ASYNC_COPY 1   // copies overlap the matrix instructions without registers

// --- shared-memory barriers: mbarrier (sm_80+; the waits' try_wait on sm_90) ----------------------------
// A 64-bit object in shared memory, 8-byte aligned, named by its shared-window address
// (convgen_mbarrier_at(pointer): taken once, outside a loop, a barrier array's next entry 8 bytes
// further). convgen_mbarrier_init(bar, count) by one thread, then a __syncthreads before any other
// thread uses it: each phase completes after `count` arrivals (convgen_mbarrier_arrive: one each;
// convgen_copy_arrive: one when every cp.async the thread issued before it has landed -- the copies
// need no commit or wait of their own). convgen_mbarrier_wait(bar, parity) returns once the phase of
// that parity (0, 1, 0, ...: phase i has parity i % 2) has completed; what the arrivals of that phase
// wrote to shared memory (their copies included) is then visible to the waiting thread, without a
// __syncthreads (PTX ISA, "mbarrier").
#if defined(CONVGEN_SIM)
#include "sim/mbarrier.h"
__device__ __forceinline__ unsigned convgen_mbarrier_at(const unsigned long long* bar) {
    return static_cast<unsigned>(reinterpret_cast<const unsigned char*>(bar) - ::convgen_sim::dynamic_shared());
}
__device__ __forceinline__ void* convgen_sim_mbarrier(unsigned bar) { return ::convgen_sim::dynamic_shared() + bar; }
__device__ __forceinline__ void convgen_mbarrier_init(unsigned bar, unsigned count) {
    ::convgen_sim::mbarrier_init(convgen_sim_mbarrier(bar), count);
}
__device__ __forceinline__ void convgen_mbarrier_arrive(unsigned bar) { ::convgen_sim::mbarrier_arrive(convgen_sim_mbarrier(bar)); }
__device__ __forceinline__ void convgen_copy_arrive(unsigned bar) { ::convgen_sim::copy_arrive(convgen_sim_mbarrier(bar)); }
#define convgen_mbarrier_wait(bar, parity) ::convgen_sim::mbarrier_wait(convgen_sim_mbarrier(bar), parity, CONVGEN_SIM_SITE)
#else
__device__ __forceinline__ unsigned convgen_mbarrier_at(const unsigned long long* bar) {
    return static_cast<unsigned>(__cvta_generic_to_shared(bar));
}
__device__ __forceinline__ void convgen_mbarrier_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void convgen_mbarrier_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void convgen_copy_arrive(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void convgen_mbarrier_wait(unsigned bar, unsigned parity) {
    // (labels inside braces are local to the block: every inlined copy has its own)
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n .reg .pred done;\n again:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 " @!done bra again;\n}\n" ::"r"(bar), "r"(parity) : "memory");
#else
    asm volatile("{\n .reg .pred done;\n again:\n mbarrier.test_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 " @!done bra again;\n}\n" ::"r"(bar), "r"(parity) : "memory");
#endif
}
#endif

// Two adjacent elements in one shared store (the epilogue's accumulator pairs: STS, STS.64, STS.128),
// `at` aligned to both; in the simulator one access too, as the bank profile counts it.
template <class E> __device__ __forceinline__ void convgen_store_pair(E* at, E a, E b) {
#if defined(CONVGEN_SIM)
    typedef unsigned char Pair __attribute__((vector_size(2 * sizeof(E)), may_alias));
    Pair v;
    std::memcpy(&v, &a, sizeof(E));
    std::memcpy(reinterpret_cast<unsigned char*>(&v) + sizeof(E), &b, sizeof(E));
    *reinterpret_cast<Pair*>(at) = v;
#else
    struct alignas(2 * sizeof(E)) Pair { E v[2]; };
    *reinterpret_cast<Pair*>(at) = Pair{{a, b}};
#endif
}

// --- the epilogues' 16-byte accesses: a chunk from shared memory (LDS.128), to global memory
// (STG.E.128); both 16-byte aligned. (The simulator's: sim/simt.h.)
#if !defined(CONVGEN_SIM)
typedef uint4 convgen_v16;
__device__ __forceinline__ convgen_v16 convgen_shared16(const void* shared) { return *reinterpret_cast<const convgen_v16*>(shared); }
// (the store spelled out: nvcc split a plain uint4 store into four where the same words had an element path)
__device__ __forceinline__ void convgen_global16(void* global, convgen_v16 v) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(global), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
#endif

#define CONVGEN_FULL_MASK 0xffffffffu
template <class T> __device__ __forceinline__ T convgen_shfl_down(T v, unsigned delta) {
    return __shfl_down_sync(CONVGEN_FULL_MASK, v, delta);
}
template <class T> __device__ __forceinline__ T convgen_shfl_xor(T v, int lanes) {
    return __shfl_xor_sync(CONVGEN_FULL_MASK, v, lanes);
}
template <class T> __device__ __forceinline__ T convgen_shfl(T v, int lane) {
    return __shfl_sync(CONVGEN_FULL_MASK, v, lane);
}

// --- the matrix instructions' shared names: mma.sync.aligned.m16n8k{16,8} (sm_80+) -----------------
// Kernels keep operands as raw bits in shared memory (unsigned short for 16-bit floats, unsigned
// for f32 as tf32), load fragments with convgen_mma_load_a/_b, multiply with convgen_mma_sync and
// find their accumulators' places with convgen_mma_acc_row/_col. Both shapes have a 16 x 8 f32
// accumulator and 4 A registers and 2 B registers per lane; the depth is convgen_mma_k<T>::value
// (16 for bf16/f16, 8 for tf32). The layouts are the PTX ISA's "Matrix Fragments for mma.m16n8k16"
// and "... for mma.m16n8k8" (.tf32). f64 (further down) makes the same 16 x 8 shape, 4 deep, of two
// mma.m8n8k4 .f64 one above the other, with a double accumulator.
#define CONVGEN_MMA_M 16
#define CONVGEN_MMA_N 8
#define CONVGEN_MMA_K 16   // the 16-bit shape's depth; kernels ask convgen_mma_k<T>::value
template <class T> struct convgen_mma_k { static constexpr int value = 16; };
template <class T> struct convgen_mma_a { unsigned r[4]; };   // bf16/f16: a0..a7, two per register, low half first; tf32: a0..a3
template <class T> struct convgen_mma_b { unsigned r[2]; };   // bf16/f16: b0..b3; tf32: b0, b1
template <class A> struct convgen_mma_accum { A c[4]; };        // c0..c3 (f64 on DMMA: double)
typedef convgen_mma_accum<float> convgen_mma_acc;
// Where accumulator element e (0..3) of `lane` sits in the 16 x 8 result (every shape here, the
// accumulator's type A the same way; hip.h's f64 differs).
template <class A = float> __device__ __forceinline__ int convgen_mma_acc_row(int lane, int e) { return (lane >> 2) + (e >> 1) * 8; }
template <class A = float> __device__ __forceinline__ int convgen_mma_acc_col(int lane, int e) { return 2 * (lane & 3) + (e & 1); }
#if defined(CONVGEN_SIM)
#include "sim/mma.h"
#define convgen_mma_sync(d, a, b) convgen_sim_mma(CONVGEN_SIM_SITE, d, a, b)
#endif

// --- 16-bit floats: mma.sync.aligned.m16n8k16 ---------------------------------------------------
// (A simulator build without NVIDIA's half/bfloat16 headers has none of this; f32/f64 kernels build.)
#if !defined(CONVGEN_SIM) || defined(CONVGEN_SIM_HAVE_FP16)
typedef __nv_bfloat16 convgen_bf16;
typedef __half convgen_f16;
__device__ __forceinline__ float convgen_to_f32(convgen_bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float convgen_to_f32(convgen_f16 v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T convgen_from_f32(float v);   // round to nearest even
template <> __device__ __forceinline__ convgen_bf16 convgen_from_f32<convgen_bf16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ convgen_f16 convgen_from_f32<convgen_f16>(float v) { return __float2half(v); }

__device__ __forceinline__ unsigned convgen_pack2(unsigned short low, unsigned short high) {
    return static_cast<unsigned>(low) | static_cast<unsigned>(high) << 16;
}
// A (16 x 16) from tile[row * ld + k]: lane holds rows lane/4 and lane/4 + 8, columns 2(lane%4) + {0, 1, 8, 9}.
template <class T>
__device__ __forceinline__ void convgen_mma_load_a(convgen_mma_a<T>& a, const unsigned short* tile, int ld, int lane) {
    const unsigned short* top = tile + (lane >> 2) * ld + 2 * (lane & 3);
    const unsigned short* bottom = top + 8 * ld;
    a.r[0] = convgen_pack2(top[0], top[1]);
    a.r[1] = convgen_pack2(bottom[0], bottom[1]);
    a.r[2] = convgen_pack2(top[8], top[9]);
    a.r[3] = convgen_pack2(bottom[8], bottom[9]);
}
// B (16 x 8) from tile[col * ld + k]: lane holds column lane/4, rows 2(lane%4) + {0, 1, 8, 9}.
template <class T>
__device__ __forceinline__ void convgen_mma_load_b(convgen_mma_b<T>& b, const unsigned short* tile, int ld, int lane) {
    const unsigned short* column = tile + (lane >> 2) * ld + 2 * (lane & 3);
    b.r[0] = convgen_pack2(column[0], column[1]);
    b.r[1] = convgen_pack2(column[8], column[9]);
}

// --- ldmatrix (sm_75+): the warp loads 1, 2 or 4 8x8 matrices of 16-bit elements from shared memory.
// Lane 8j + i passes the address of row i of matrix j (16 bytes, 16-byte aligned; lanes past 8 x NUM
// pass any); r[j] receives the lane's register of matrix j as an mma fragment holds it: row lane/4,
// columns 2 (lane%4) and +1, low half first; _trans: column lane/4, rows 2 (lane%4) and +1.
#if defined(CONVGEN_SIM)
#define convgen_ldmatrix_x1(r, row) ::convgen_sim::matrix_load<1, false>(CONVGEN_SIM_SITE, r, row)
#define convgen_ldmatrix_x2(r, row) ::convgen_sim::matrix_load<2, false>(CONVGEN_SIM_SITE, r, row)
#define convgen_ldmatrix_x4(r, row) ::convgen_sim::matrix_load<4, false>(CONVGEN_SIM_SITE, r, row)
#define convgen_ldmatrix_x1_trans(r, row) ::convgen_sim::matrix_load<1, true>(CONVGEN_SIM_SITE, r, row)
#define convgen_ldmatrix_x2_trans(r, row) ::convgen_sim::matrix_load<2, true>(CONVGEN_SIM_SITE, r, row)
#define convgen_ldmatrix_x4_trans(r, row) ::convgen_sim::matrix_load<4, true>(CONVGEN_SIM_SITE, r, row)
#else
#define CONVGEN_LDMATRIX(name, shape, regs, ...)                                                          \
    __device__ __forceinline__ void name(unsigned* r, const void* row) {                                   \
        unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));                           \
        asm volatile("ldmatrix.sync.aligned.m8n8." shape ".shared.b16 " regs ", [%" #__VA_ARGS__ "];\n"     \
                     : CONVGEN_LDMATRIX_OUT_##__VA_ARGS__ : "r"(address));                                  \
    }
#define CONVGEN_LDMATRIX_OUT_1 "=r"(r[0])
#define CONVGEN_LDMATRIX_OUT_2 "=r"(r[0]), "=r"(r[1])
#define CONVGEN_LDMATRIX_OUT_4 "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
CONVGEN_LDMATRIX(convgen_ldmatrix_x1, "x1", "{%0}", 1)
CONVGEN_LDMATRIX(convgen_ldmatrix_x2, "x2", "{%0, %1}", 2)
CONVGEN_LDMATRIX(convgen_ldmatrix_x4, "x4", "{%0, %1, %2, %3}", 4)
CONVGEN_LDMATRIX(convgen_ldmatrix_x1_trans, "x1.trans", "{%0}", 1)
CONVGEN_LDMATRIX(convgen_ldmatrix_x2_trans, "x2.trans", "{%0, %1}", 2)
CONVGEN_LDMATRIX(convgen_ldmatrix_x4_trans, "x4.trans", "{%0, %1, %2, %3}", 4)
#undef CONVGEN_LDMATRIX
#endif

// 16-bit mma.m16n8k16 fragments by one ldmatrix.x4 each, from a shared tile that keeps each row's
// (A) or column's (B) k-slice in 16-byte chunks, in any order of chunks (the lanes name the rows, so
// the tile may be swizzled). `row`: this lane's row address; matrix j comes from lanes 8j..8j+7 and
// lands in register j, so that each mma operand is whole consecutive registers (no moves).
// A (16 x 16): lane l gives row l % 16, the 8 elements at k + 8 (l / 16) of the 16-deep slice:
// matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) are a0..a3.
template <class T> __device__ __forceinline__ void convgen_mma_load_a_x4(convgen_mma_a<T>& a, const unsigned short* row) {
    convgen_ldmatrix_x4(a.r, row);
}
// B of two mma's (each 16 deep x 8 columns, tile[col][k]): lane l gives column 8 (l / 16) + l % 8, the
// 8 elements at k + 8 (l / 8 % 2): columns 0-7 are `first` (b0: k 0-7, b1: k 8-15), 8-15 `second`.
template <class T>
__device__ __forceinline__ void convgen_mma_load_b2_x4(convgen_mma_b<T>& first, convgen_mma_b<T>& second,
                                                       const unsigned short* row) {
    unsigned r[4];
    convgen_ldmatrix_x4(r, row);
    first.r[0] = r[0];
    first.r[1] = r[1];
    second.r[0] = r[2];
    second.r[1] = r[3];
}

// The same fragments from tiles kept the other way round (rows of the tile are k: tile[k][row] for A,
// tile[k][col] for B), by ldmatrix.x4.trans. A: lane l gives k row 8 (l / 16) + l % 8 of the slice, the 8
// elements at row 8 (l / 8 % 2) of the 16; B: k row 8 (l / 8 % 2) + l % 8, the 8 elements at column
// 8 (l / 16) of the 16. The registers are those the untransposed loads above give.
template <class T> __device__ __forceinline__ void convgen_mma_load_a_x4_trans(convgen_mma_a<T>& a, const unsigned short* row) {
    convgen_ldmatrix_x4_trans(a.r, row);
}
template <class T>
__device__ __forceinline__ void convgen_mma_load_b2_x4_trans(convgen_mma_b<T>& first, convgen_mma_b<T>& second,
                                                             const unsigned short* row) {
    unsigned r[4];
    convgen_ldmatrix_x4_trans(r, row);
    first.r[0] = r[0];
    first.r[1] = r[1];
    second.r[0] = r[2];
    second.r[1] = r[3];
}

#if defined(CONVGEN_SIM)
template <class T> struct convgen_sim_bits;
template <> struct convgen_sim_bits<convgen_bf16> { typedef ::convgen_sim::Bf16Bits type; };
template <> struct convgen_sim_bits<convgen_f16> { typedef ::convgen_sim::F16Bits type; };
template <class T>
inline void convgen_sim_mma(const char* site, convgen_mma_acc& d, const convgen_mma_a<T>& a, const convgen_mma_b<T>& b) {
    unsigned short a16[8], b16[4];   // the registers' 16-bit halves in element order (little-endian)
    std::memcpy(a16, a.r, sizeof a16);
    std::memcpy(b16, b.r, sizeof b16);
    ::convgen_sim::matrix_instruction(site, &::convgen_sim::emulate_mma_m16n8k16<typename convgen_sim_bits<T>::type>,
                                      a16, b16, d.c);
}
#else
// d += a b on the tensor cores, f32 accumulation.
__device__ __forceinline__ void convgen_mma_sync(convgen_mma_acc& d, const convgen_mma_a<convgen_bf16>& a,
                                                 const convgen_mma_b<convgen_bf16>& b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d.c[0]), "+f"(d.c[1]), "+f"(d.c[2]), "+f"(d.c[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}
__device__ __forceinline__ void convgen_mma_sync(convgen_mma_acc& d, const convgen_mma_a<convgen_f16>& a,
                                                 const convgen_mma_b<convgen_f16>& b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d.c[0]), "+f"(d.c[1]), "+f"(d.c[2]), "+f"(d.c[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}
#endif

// --- warpgroup MMA (sm_90a): wgmma.mma_async.sync.aligned.m64nNk16, A and B from shared memory ----------
// A block's 128 threads (a warpgroup, 4 warps) multiply a 64 x 16 A by a 16 x N B (N = 64 or 128 here)
// into N / 2 f32 accumulators a thread: d[i] at row 16 (warp) + lane / 4 + 8 ((i / 2) % 2), column
// 8 (i / 4) + 2 (lane % 4) + i % 2 (convgen_wgmma_acc_row/_col). Each operand is described by a
// 64-bit shared-memory matrix descriptor (convgen_wgmma_desc: start address, LBO, SBO, swizzle); TRANS
// 0 reads it K-major (rows of the reduction contiguous), 1 MN-major (PTX ISA, "Asynchronous Warpgroup
// Level Matrix Multiply-Accumulate"). The MMAs are asynchronous: convgen_wgmma_fence before the first
// of a batch (the accumulators were touched by other instructions), convgen_wgmma_commit closes a
// group, convgen_wgmma_wait<N>() returns when at most the newest N groups are in flight -- only then
// may the accumulators be read or the shared stage they read be overwritten. Shared memory written by
// the threads (st.shared, cp.async) is made visible to the tensor cores' reads (the async proxy) by
// convgen_fence_async_shared, after the writes land and before the barrier that publishes them.
typedef unsigned long long convgen_wgmma_desc_t;
#if defined(CONVGEN_SIM)
#include "sim/wgmma.h"
// The shared window's address of a shared pointer: its offset in the block's shared memory.
__device__ __forceinline__ unsigned convgen_shared_address(const void* p) {
    return static_cast<unsigned>(static_cast<const unsigned char*>(p) - ::convgen_sim::dynamic_shared());
}
template <class T, int N, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void convgen_wgmma(float (&d)[N / 2], convgen_wgmma_desc_t a, convgen_wgmma_desc_t b) {
    static_assert(N == 64 || N == 128, "wgmma wrappers for N = 64 and 128");
    ::convgen_sim::wgmma_issue<typename convgen_sim_bits<T>::type>(d, N, a, b, TRANS_A, TRANS_B);
}
__device__ __forceinline__ void convgen_wgmma_fence() {}
__device__ __forceinline__ void convgen_wgmma_commit() { ::convgen_sim::wgmma_commit(); }
template <int N> __device__ __forceinline__ void convgen_wgmma_wait() { ::convgen_sim::wgmma_wait(N); }
template <int N> __device__ __forceinline__ void convgen_wgmma_keep(float (&)[N]) {}
__device__ __forceinline__ void convgen_fence_async_shared() {}
#else
__device__ __forceinline__ unsigned convgen_shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#define CONVGEN_WGMMA_D8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
    "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define CONVGEN_WGMMA_D32(d) CONVGEN_WGMMA_D8(d, 0), CONVGEN_WGMMA_D8(d, 8), CONVGEN_WGMMA_D8(d, 16), CONVGEN_WGMMA_D8(d, 24)
#define CONVGEN_WGMMA_D64(d) CONVGEN_WGMMA_D32(d), CONVGEN_WGMMA_D8(d, 32), CONVGEN_WGMMA_D8(d, 40), \
    CONVGEN_WGMMA_D8(d, 48), CONVGEN_WGMMA_D8(d, 56)
// d += A B (scale-d 1: the accumulators start at zero), scale-a and scale-b 1, TA / TB: MN-major A / B.
// One struct per shape and type: `regs` the accumulators' operand list, `a`, `b` the descriptors' operands.
#define CONVGEN_WGMMA_SHAPE(n, type, regs, a, b, ta, tb, operands)                                              \
    template <int TA, int TB> struct convgen_wgmma_n##n##_##type {                                             \
        static __device__ __forceinline__ void run(float (&d)[n / 2], convgen_wgmma_desc_t da, convgen_wgmma_desc_t db) { \
            asm volatile("wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." #type "." #type " {" regs "}, " a ", " b  \
                         ", 1, 1, 1, " ta ", " tb ";\n"                                                         \
                         : operands(d) : "l"(da), "l"(db), "n"(TA), "n"(TB));                                   \
        }                                                                                                       \
    };
#define CONVGEN_WGMMA_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define CONVGEN_WGMMA_REGS64 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
CONVGEN_WGMMA_SHAPE(64, bf16, CONVGEN_WGMMA_REGS32, "%32", "%33", "%34", "%35", CONVGEN_WGMMA_D32)
CONVGEN_WGMMA_SHAPE(64, f16, CONVGEN_WGMMA_REGS32, "%32", "%33", "%34", "%35", CONVGEN_WGMMA_D32)
CONVGEN_WGMMA_SHAPE(128, bf16, CONVGEN_WGMMA_REGS64, "%64", "%65", "%66", "%67", CONVGEN_WGMMA_D64)
CONVGEN_WGMMA_SHAPE(128, f16, CONVGEN_WGMMA_REGS64, "%64", "%65", "%66", "%67", CONVGEN_WGMMA_D64)
template <class T> struct convgen_is_bf16 { static constexpr bool value = false; };
template <> struct convgen_is_bf16<convgen_bf16> { static constexpr bool value = true; };
template <class T, int N, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void convgen_wgmma(float (&d)[N / 2], convgen_wgmma_desc_t a, convgen_wgmma_desc_t b) {
    static_assert(N == 64 || N == 128, "wgmma wrappers for N = 64 and 128");
    constexpr bool bf16 = convgen_is_bf16<T>::value;
    if constexpr (N == 64) {
        if constexpr (bf16) convgen_wgmma_n64_bf16<TRANS_A, TRANS_B>::run(d, a, b);
        else convgen_wgmma_n64_f16<TRANS_A, TRANS_B>::run(d, a, b);
    } else {
        if constexpr (bf16) convgen_wgmma_n128_bf16<TRANS_A, TRANS_B>::run(d, a, b);
        else convgen_wgmma_n128_f16<TRANS_A, TRANS_B>::run(d, a, b);
    }
}
__device__ __forceinline__ void convgen_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void convgen_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void convgen_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// The accumulators pinned after a wait: nvcc may not move their reads above it (an empty asm that may
// change them, ordered after the wait's volatile asm).
template <int N> __device__ __forceinline__ void convgen_wgmma_keep(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void convgen_fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#endif
__device__ __forceinline__ int convgen_wgmma_acc_row(int thread, int i) { return 16 * (thread / 32) + thread % 32 / 4 + 8 * (i / 2 % 2); }
__device__ __forceinline__ int convgen_wgmma_acc_col(int thread, int i) { return 8 * (i / 4) + 2 * (thread % 4) + i % 2; }
// A shared-memory matrix descriptor: `tile` the operand's first byte, WIDTH the swizzle's bytes (128, 64
// or 32: an atom of 8 rows of WIDTH bytes, on a WIDTH * 8-byte boundary), lbo and sbo in bytes.
template <int WIDTH>
__device__ __forceinline__ convgen_wgmma_desc_t convgen_wgmma_desc(const void* tile, unsigned lbo, unsigned sbo) {
    static_assert(WIDTH == 128 || WIDTH == 64 || WIDTH == 32, "the 128-, 64- and 32-byte swizzles");
    constexpr unsigned long long mode = WIDTH == 128 ? 1 : WIDTH == 64 ? 2 : 3;
    return (convgen_wgmma_desc_t)(convgen_shared_address(tile) >> 4 & 0x3fff) | (convgen_wgmma_desc_t)(lbo >> 4 & 0x3fff) << 16 |
           (convgen_wgmma_desc_t)(sbo >> 4 & 0x3fff) << 32 | mode << 62;
}
#endif

// --- f32 as tf32: mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 -----------------------------
// convgen_mma_a<float>/_b<float> are tf32 fragments: f32 operands (raw bits in shared memory)
// rounded to tf32 as they are loaded -- round to nearest, ties away from zero, as cvt.rna.tf32.f32
// does (10 explicit mantissa bits, the low 13 bits zero) -- and multiplied with f32 accumulation.
// The epilogues' conversions are the identity.
__device__ __forceinline__ float convgen_to_f32(float v) { return v; }
template <class T> __device__ __forceinline__ T convgen_from_f32(float v);
template <> __device__ __forceinline__ float convgen_from_f32<float>(float v) { return v; }
template <> struct convgen_mma_k<float> { static constexpr int value = 8; };
#if defined(CONVGEN_SIM)
__device__ __forceinline__ unsigned convgen_tf32(unsigned bits) { return ::convgen_sim::round_tf32(bits); }
#else
__device__ __forceinline__ unsigned convgen_tf32(unsigned bits) {
    unsigned rounded;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(rounded) : "f"(__uint_as_float(bits)));
    return rounded;
}
#endif
// A (16 x 8) from tile[row * ld + k]: lane holds rows lane/4 (a0, a2) and lane/4 + 8 (a1, a3),
// columns lane%4 (a0, a1) and lane%4 + 4 (a2, a3).
__device__ __forceinline__ void convgen_mma_load_a(convgen_mma_a<float>& a, const unsigned* tile, int ld, int lane) {
    const unsigned* top = tile + (lane >> 2) * ld + (lane & 3);
    const unsigned* bottom = top + 8 * ld;
    a.r[0] = convgen_tf32(top[0]);
    a.r[1] = convgen_tf32(bottom[0]);
    a.r[2] = convgen_tf32(top[4]);
    a.r[3] = convgen_tf32(bottom[4]);
}
// B (8 x 8) from tile[col * ld + k]: lane holds column lane/4, rows lane%4 (b0) and lane%4 + 4 (b1).
__device__ __forceinline__ void convgen_mma_load_b(convgen_mma_b<float>& b, const unsigned* tile, int ld, int lane) {
    const unsigned* column = tile + (lane >> 2) * ld + (lane & 3);
    b.r[0] = convgen_tf32(column[0]);
    b.r[1] = convgen_tf32(column[4]);
}
#if defined(CONVGEN_SIM)
inline void convgen_sim_mma(const char* site, convgen_mma_acc& d, const convgen_mma_a<float>& a,
                            const convgen_mma_b<float>& b) {
    ::convgen_sim::matrix_instruction32(site, &::convgen_sim::emulate_mma_m16n8k8_tf32, a.r, b.r, d.c);
}
#else
// d += a b on the tensor cores, tf32 operands, f32 accumulation.
__device__ __forceinline__ void convgen_mma_sync(convgen_mma_acc& d, const convgen_mma_a<float>& a,
                                                 const convgen_mma_b<float>& b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d.c[0]), "+f"(d.c[1]), "+f"(d.c[2]), "+f"(d.c[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}
#endif

// --- f64: mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 (DMMA, sm_80+), two per 16 x 8 x 4 step ---
// PTX ISA, "Matrix Fragments for mma.m8n8k4 with .f64": A (8 x 4, row) one double per lane at row
// lane/4, column lane%4; B (4 x 8, col) one at row lane%4, column lane/4; C, D (8 x 8) two at row
// lane/4, columns 2(lane%4) + {0, 1}. The upper 8 x 8 instruction takes rows 0-7 of the 16-row
// fragment and accumulators c0, c1, the lower one rows 8-15 and c2, c3: convgen_mma_acc_row/_col
// hold as they are. Operands are doubles in shared memory; the epilogues' conversions are the identity.
template <> struct convgen_mma_k<double> { static constexpr int value = 4; };
template <> struct convgen_mma_a<double> { double r[2]; };   // rows lane/4 and lane/4 + 8, column lane%4
template <> struct convgen_mma_b<double> { double r[1]; };   // column lane/4, row lane%4
__device__ __forceinline__ void convgen_mma_load_a(convgen_mma_a<double>& a, const double* tile, int ld, int lane) {
    const double* top = tile + (lane >> 2) * ld + (lane & 3);
    a.r[0] = top[0];
    a.r[1] = top[8 * ld];
}
__device__ __forceinline__ void convgen_mma_load_b(convgen_mma_b<double>& b, const double* tile, int ld, int lane) {
    b.r[0] = tile[(lane >> 2) * ld + (lane & 3)];
}
#if defined(CONVGEN_SIM)
inline void convgen_sim_mma(const char* site, convgen_mma_accum<double>& d, const convgen_mma_a<double>& a,
                            const convgen_mma_b<double>& b) {
    ::convgen_sim::matrix_instruction64(site, &::convgen_sim::emulate_dmma_m8n8k4, &a.r[0], b.r, &d.c[0]);
    ::convgen_sim::matrix_instruction64(site, &::convgen_sim::emulate_dmma_m8n8k4, &a.r[1], b.r, &d.c[2]);
}
#else
// d += a b on the f64 tensor cores.
__device__ __forceinline__ void convgen_mma_sync(convgen_mma_accum<double>& d, const convgen_mma_a<double>& a,
                                                 const convgen_mma_b<double>& b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+d"(d.c[0]), "+d"(d.c[1]) : "d"(a.r[0]), "d"(b.r[0]));
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+d"(d.c[2]), "+d"(d.c[3]) : "d"(a.r[1]), "d"(b.r[0]));
}
#endif
