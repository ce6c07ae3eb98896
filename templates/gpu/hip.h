// convgen's HIP wrappers (ROCm 5.2 and later): the one place where HIP differs from CUDA for
// generated kernels. Waves are 64 lanes on gfx90a/gfx940; ROCm 5.2 has only mask-less shuffles.
// Under -DCONVGEN_SIM (with -DCONVGEN_SIM_WARP=64) the simulator provides the same names.
#pragma once
#if defined(CONVGEN_SIM)
#ifndef CONVGEN_SIM_WARP
#define CONVGEN_SIM_WARP 64
#endif
#include "sim/simt.h"
#else
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <hip/hip_bfloat16.h>
typedef hipStream_t convgen_stream_t;
#define CONVGEN_WARP 64
// hip-clang takes the triple chevron as an expression (hipLaunchKernelGGL is a statement)
#define CONVGEN_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
    (kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__), static_cast<int>(hipGetLastError()))
#define CONVGEN_DYNAMIC_SHARED(T, name) \
    extern __shared__ __align__(16) unsigned char convgen_dynamic_shared_[]; \
    T* name = reinterpret_cast<T*>(convgen_dynamic_shared_)
// A static shared array: `CONVGEN_SHARED(float, tile, [32][33]);` (the simulator places it where its
// checks see it).
#define CONVGEN_SHARED(T, name, dims) __shared__ __align__(16) T name dims
// Dynamic LDS up to 64 KiB needs no opt-in on gfx90a/gfx940 (convgen's tiles stay below it).
#define CONVGEN_SHARED_OPT_IN(kernel, bytes) ((bytes) > 64 * 1024 ? 1 : 0)
// A plan entry's scratch memory (a split-K workspace), stream-ordered (ROCm 5.2 has hipMallocAsync
// and hipFreeAsync): 0 when done, else HIP's error.
inline int convgen_malloc_async(void** p, unsigned long long bytes, convgen_stream_t stream) {
    return static_cast<int>(hipMallocAsync(p, bytes, stream));
}
inline int convgen_free_async(void* p, convgen_stream_t stream) { return static_cast<int>(hipFreeAsync(p, stream)); }
#endif

// A kernel's launch bounds: at most `threads` per block, and `blocks` of them resident on a CU as
// waves per execution unit (HIP's second __launch_bounds__ argument counts those: a CU's 4 SIMDs
// share the blocks' waves), at least 2. That caps a lane at gfx90a's 256 VGPRs, where the compiler
// gives the matrix instructions' accumulators ordinary registers; with the whole 512-register file
// open (1 wave per SIMD) hipcc kept them in AGPRs and copied every accumulator out and back at each
// k-step (128 v_accvgpr moves per 32 MFMAs in the 16-bit main loops).
#define CONVGEN_WAVES_PER_EU(threads, blocks) \
    (((threads) / 64 * (blocks) + 3) / 4 < 2 ? 2 : ((threads) / 64 * (blocks) + 3) / 4)
#define CONVGEN_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, CONVGEN_WAVES_PER_EU(threads, blocks))
// A value kept in a register as computed (cuda.h's, where nvcc rematerialised the copies' shared
// offsets at every k-step); nothing here: hipcc's main loops have not needed it.
__device__ __forceinline__ void convgen_keep(int& v) {
    (void)v;
}
__device__ __forceinline__ void convgen_keep(unsigned& v) { (void)v; }
__device__ __forceinline__ void convgen_keep(unsigned long long& v) { (void)v; }
template <class P> __device__ __forceinline__ void convgen_keep(P*& p) { (void)p; }

// --- staged copies global -> shared, 16 bytes at a time: registers, then LDS ---------------------
// The same names as cuda.h's cp.async wrappers. gfx90a/gfx940 have no asynchronous copy to LDS that
// ROCm 5.2 exposes, so a stage is double-buffered through registers: convgen_copy16 loads into the
// stage's registers (zeros when not valid), the kernel computes on the other shared buffer while
// the loads are in flight, and convgen_copy_land stores the registers to shared memory; commit and
// wait have nothing to do (the data is visible after land and the next __syncthreads).
#if defined(CONVGEN_SIM)
struct alignas(16) convgen_u128 { unsigned w[4]; };
#define CONVGEN_GLOBAL_U128 const convgen_u128
#define CONVGEN_LDS_U128 convgen_u128
#else   // a 16-byte vector, its address spaces spelled out: global_load_dwordx4 and ds_write_b128, not flat accesses
typedef unsigned convgen_u128 __attribute__((ext_vector_type(4)));
#define CONVGEN_GLOBAL_U128 const __attribute__((address_space(1))) convgen_u128
#define CONVGEN_LDS_U128 __attribute__((address_space(3))) convgen_u128
#endif
template <int N> struct convgen_copy_stage {
    convgen_u128 value[N];
    convgen_u128* shared[N];
};
template <int N>
__device__ __forceinline__ void convgen_copy16(convgen_copy_stage<N>& stage, int i, void* shared, const void* global,
                                               unsigned valid) {   // (valid: non-zero)
#if defined(CONVGEN_SIM)   // 16-byte accesses fault off 16-byte boundaries (the simulator's checks)
    if (valid) ::convgen_sim::require_aligned(global, 16, "global_load_dwordx4 (convgen_copy16's source)");
    ::convgen_sim::require_aligned(shared, 16, "ds_write_b128 (convgen_copy16's destination)");
#endif
    stage.value[i] = valid ? *(CONVGEN_GLOBAL_U128*)global : convgen_u128{};
    stage.shared[i] = static_cast<convgen_u128*>(shared);
}
template <int N> __device__ __forceinline__ void convgen_copy_land(convgen_copy_stage<N>& stage) {
#pragma unroll
    for (int i = 0; i < N; ++i) *(CONVGEN_LDS_U128*)stage.shared[i] = stage.value[i];
}
// Copies along the GEMM's rows or columns (an Op's A_MN / B_MN: a 16-byte chunk is 8 consecutive rows
// (columns) at one reduction index) into the K-major tiles the fragment reads take: land writes the
// chunk's 8 elements (16-bit) one a row, element e ROW_BYTES * e + off[e / SR] bytes from the chunk's
// first (off: where the swizzle moves the thread's reduction index in rows e, SR rows alike; set once
// by the kernel), so that e's part is each write's immediate offset.
#if defined(CONVGEN_SIM)
typedef char* convgen_lds_bytes;
typedef unsigned short* convgen_lds_u16;
#else   // 32-bit LDS addresses: the element writes add an offset to one, not to a 64-bit generic pointer
typedef __attribute__((address_space(3))) char* convgen_lds_bytes;
typedef __attribute__((address_space(3))) unsigned short* convgen_lds_u16;
#endif
template <int N, int ROW_BYTES, int SR> struct convgen_copy_stage_t {
    convgen_u128 value[N];
    convgen_lds_bytes shared[N];
    int off[8 / SR];
};
// The thread's offset of rows j * SR .. j * SR + SR - 1 (set once, before the main loop); nothing for
// the copies that land as they are.
template <int N, int ROW_BYTES, int SR>
__device__ __forceinline__ void convgen_copy_offset(convgen_copy_stage_t<N, ROW_BYTES, SR>& stage, int j, int off) {
    stage.off[j] = off;
}
template <int N> __device__ __forceinline__ void convgen_copy_offset(convgen_copy_stage<N>&, int, int) {}
template <int N, int ROW_BYTES, int SR>
__device__ __forceinline__ void convgen_copy16(convgen_copy_stage_t<N, ROW_BYTES, SR>& stage, int i, void* shared,
                                               const void* global, unsigned valid) {
#if defined(CONVGEN_SIM)
    if (valid) ::convgen_sim::require_aligned(global, 16, "global_load_dwordx4 (convgen_copy16's source)");
#endif
    stage.value[i] = valid ? *(CONVGEN_GLOBAL_U128*)global : convgen_u128{};
    stage.shared[i] = (convgen_lds_bytes)shared;
}
template <int N, int ROW_BYTES, int SR>
__device__ __forceinline__ void convgen_copy_land(convgen_copy_stage_t<N, ROW_BYTES, SR>& stage) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
#if defined(CONVGEN_SIM)
            const unsigned word = stage.value[i].w[e / 2];
#else
            const unsigned word = stage.value[i][e / 2];
#endif   // ds_write_b16 (the odd elements' high halves: ds_write_b16_d16_hi)
            *(convgen_lds_u16)(stage.shared[i] + stage.off[e / SR] + e * ROW_BYTES) = (unsigned short)(word >> (e % 2 * 16));
        }
}
__device__ __forceinline__ void convgen_copy_commit() {}
template <int N> __device__ __forceinline__ void convgen_copy_wait() {}
#define CONVGEN_ASYNC_COPY 0   // staged through registers: two shared buffers

// --- the epilogues' 16-byte accesses: a chunk from LDS (ds_read_b128), to global memory
// (global_store_dwordx4); both 16-byte aligned. (The simulator's: sim/simt.h.)
#if !defined(CONVGEN_SIM)
typedef convgen_u128 convgen_v16;
__device__ __forceinline__ convgen_v16 convgen_shared16(const void* shared) { return *(CONVGEN_LDS_U128*)shared; }
__device__ __forceinline__ void convgen_global16(void* global, convgen_v16 v) {
    *(__attribute__((address_space(1))) convgen_u128*)global = v;
}
#endif

#define CONVGEN_FULL_MASK 0xffffffffffffffffull
template <class T> __device__ __forceinline__ T convgen_shfl_down(T v, unsigned delta) { return __shfl_down(v, delta); }
template <class T> __device__ __forceinline__ T convgen_shfl_xor(T v, int lanes) { return __shfl_xor(v, lanes); }
template <class T> __device__ __forceinline__ T convgen_shfl(T v, int lane) { return __shfl(v, lane); }

// --- the matrix instructions' shared names: v_mfma_{f32,f64}_16x16x{16,4} (gfx90a, gfx940) --------
// The same names as cuda.h's (kernels read alike). Every shape has a 16 x 16 accumulator, 4
// elements per lane: D[4(l / 16) + j][l % 16], j < 4, in lane l for the f32 accumulators,
// D[4j + l / 16][l % 16] for f64's.
// A fragment is a pack of P instructions' operands that each lane loads with one 16-byte read
// (ds_read_b128) from its row (A) or column (B) of the shared tile: E = 16 / bytes consecutive k,
// k = E * (l / 16) + q (q < E): 8 of 16-bit operands (P = 2), 4 of f32 (P = 4), 2 of f64 (P = 2).
// The pack's instruction p takes the lane's elements 4p..4p+3 (16-bit) or element p (f32, f64), so
// A and B hand every k of the pack (4 lane groups x E = 64 / bytes of them) to exactly one
// instruction and one k-slot, alike: the P instructions sum every product of the pack's k, in
// another order than one instruction per 16 (4) k would. The depth convgen_mma_k<T>::value is the
// pack's: 32 for bf16/f16, 16 for f32, 8 for f64. One read per fragment instead of 2-4 narrower ones
// (and their addresses). The
// 8 lanes of each 16-byte phase read 8 rows at one chunk: 16-bit tiles swizzle their rows' chunks
// (the kernel's tile_at; convgen_mma_load16 takes the lane's own address), 4- and 8-byte tiles pad
// their rows by 16 bytes (convgen_mma_load_a/_b add the lane's offset): 8 different 16-byte groups of
// banks either way (igemm_tiles.swizzled_rows).
#define CONVGEN_MMA_M 16
#define CONVGEN_MMA_N 16
#define CONVGEN_MMA_K 32
template <class T> struct convgen_mma_k { static constexpr int value = CONVGEN_MMA_K; };
template <class T> struct convgen_mma_a { convgen_u128 v; };   // every dtype's pack: its 16 bytes as read
template <class T> struct convgen_mma_b { convgen_u128 v; };
// This lane's 16 bytes of a fragment pack at `at` (16-byte aligned: the rows' length and the lanes'
// offsets are whole 16 bytes), one ds_read_b128.
#if defined(CONVGEN_SIM)   // one 16-byte shared read, checked and profiled as such (g++ would split a plain copy)
__attribute__((noinline)) CONVGEN_SIM_UNCHECKED inline convgen_u128 convgen_fragment_load16(const void* at) {
    ::convgen_sim::Inside inside;
    ::convgen_sim::shared_load(at, 16, "ds_read_b128 (a matrix fragment)", __builtin_return_address(0));
    convgen_u128 v;
    std::memcpy(&v, at, 16);
    return v;
}
#else
__device__ __forceinline__ convgen_u128 convgen_fragment_load16(const void* at) {
    return *(const CONVGEN_LDS_U128*)at;
}
typedef unsigned convgen_v2u __attribute__((ext_vector_type(2)));
// 8 bytes of a pack: words 2p and 2p + 1
__device__ __forceinline__ convgen_v2u convgen_pack_half(const convgen_u128& v, int p) {
    return p == 0 ? convgen_v2u{v[0], v[1]} : convgen_v2u{v[2], v[3]};
}
#endif
// A fragment pack whose lane's 16 bytes are at `at` (rows whose chunks are swizzled: the kernel finds them)
template <class F> __device__ __forceinline__ void convgen_mma_load16(F& f, const void* at) { f.v = convgen_fragment_load16(at); }
// A (B) fragment pack from a tile of padded rows, tile[row * ld + k] (tile[col * ld + k]) of elements E:
// the lane's row (column) lane % 16, its 16 / sizeof(E) elements from k = 16 / sizeof(E) * (lane / 16)
template <class F, class E> __device__ __forceinline__ void convgen_mma_load_a(F& a, const E* tile, int ld, int lane) {
    a.v = convgen_fragment_load16(tile + (lane % 16) * ld + 16 / (int)sizeof(E) * (lane / 16));
}
template <class F, class E> __device__ __forceinline__ void convgen_mma_load_b(F& b, const E* tile, int ld, int lane) {
    b.v = convgen_fragment_load16(tile + (lane % 16) * ld + 16 / (int)sizeof(E) * (lane / 16));
}
template <class A> struct convgen_mma_accum { A c[4]; };
typedef convgen_mma_accum<float> convgen_mma_acc;
// Where accumulator element e (0..3) of `lane` sits in the 16 x 16 result, for accumulators of type A.
template <class A = float> __device__ __forceinline__ int convgen_mma_acc_row(int lane, int e) { return 4 * (lane / 16) + e; }
template <> __device__ __forceinline__ int convgen_mma_acc_row<double>(int lane, int e) { return 4 * e + lane / 16; }
template <class A = float> __device__ __forceinline__ int convgen_mma_acc_col(int lane, int e) { return lane % 16; }
#if defined(CONVGEN_SIM)
#include "sim/mma.h"
#define convgen_mma_sync(d, a, b) convgen_sim_mma(CONVGEN_SIM_SITE, d, a, b)   // each dtype's overload below
#endif

// --- 16-bit floats: v_mfma_f32_16x16x16{bf16_1k,f16} ---------------------------------------------
// AMD's layouts for one 16x16x16 block: lane l holds A[l % 16][4(l / 16) + j], B[4(l / 16) + j][l % 16].
#if !defined(CONVGEN_SIM) || defined(CONVGEN_SIM_HAVE_FP16)
#if defined(CONVGEN_SIM)
typedef __nv_bfloat16 convgen_bf16;   // the simulator's 16-bit types: NVIDIA's, bit-exact conversions
typedef __half convgen_f16;
__device__ __forceinline__ float convgen_to_f32(convgen_bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float convgen_to_f32(convgen_f16 v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T convgen_from_f32(float v);   // round to nearest even
template <> __device__ __forceinline__ convgen_bf16 convgen_from_f32<convgen_bf16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ convgen_f16 convgen_from_f32<convgen_f16>(float v) { return __float2half(v); }
#else
typedef hip_bfloat16 convgen_bf16;
typedef __half convgen_f16;
__device__ __forceinline__ float convgen_to_f32(convgen_bf16 v) { return static_cast<float>(v); }
__device__ __forceinline__ float convgen_to_f32(convgen_f16 v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T convgen_from_f32(float v);   // round to nearest even
template <> __device__ __forceinline__ convgen_bf16 convgen_from_f32<convgen_bf16>(float v) { return convgen_bf16(v); }
template <> __device__ __forceinline__ convgen_f16 convgen_from_f32<convgen_f16>(float v) { return __float2half(v); }
#endif



#if defined(CONVGEN_SIM)
template <class T> struct convgen_sim_bits;
template <> struct convgen_sim_bits<convgen_bf16> { typedef ::convgen_sim::Bf16Bits type; };
template <> struct convgen_sim_bits<convgen_f16> { typedef ::convgen_sim::F16Bits type; };
template <class T>
inline void convgen_sim_mma(const char* site, convgen_mma_acc& d, const convgen_mma_a<T>& a, const convgen_mma_b<T>& b) {
    for (int p = 0; p < 2; ++p)
        ::convgen_sim::matrix_instruction(site, &::convgen_sim::emulate_mfma_16x16x16<typename convgen_sim_bits<T>::type>,
                                          reinterpret_cast<const unsigned short*>(a.v.w) + 4 * p,
                                          reinterpret_cast<const unsigned short*>(b.v.w) + 4 * p, d.c);
}
#else
typedef short convgen_v4i16 __attribute__((ext_vector_type(4)));
typedef _Float16 convgen_v4f16 __attribute__((ext_vector_type(4)));
typedef float convgen_v4f32 __attribute__((ext_vector_type(4)));
// d += a b on the matrix cores, f32 accumulation (cbsz, abid, blgp 0: no broadcast, no swizzle).
__device__ __forceinline__ void convgen_mma_sync(convgen_mma_acc& d, const convgen_mma_a<convgen_bf16>& a,
                                                 const convgen_mma_b<convgen_bf16>& b) {
    convgen_v4f32 vd = {d.c[0], d.c[1], d.c[2], d.c[3]};
#pragma unroll
    for (int p = 0; p < 2; ++p)
        vd = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(convgen_v4i16, convgen_pack_half(a.v, p)),
                                                       __builtin_bit_cast(convgen_v4i16, convgen_pack_half(b.v, p)), vd, 0, 0, 0);
    for (int j = 0; j < 4; ++j) d.c[j] = vd[j];
}
__device__ __forceinline__ void convgen_mma_sync(convgen_mma_acc& d, const convgen_mma_a<convgen_f16>& a,
                                                 const convgen_mma_b<convgen_f16>& b) {
    convgen_v4f32 vd = {d.c[0], d.c[1], d.c[2], d.c[3]};
#pragma unroll
    for (int p = 0; p < 2; ++p)
        vd = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(convgen_v4f16, convgen_pack_half(a.v, p)),
                                                   __builtin_bit_cast(convgen_v4f16, convgen_pack_half(b.v, p)), vd, 0, 0, 0);
    for (int j = 0; j < 4; ++j) d.c[j] = vd[j];
}
#endif
#endif

// --- f32: v_mfma_f32_16x16x4f32 (gfx90a; gfx940 spells it v_mfma_f32_16x16x4_f32) ---------------
// True f32 operands (no tf32 on AMD), raw bits in shared memory: AMD's layout for the one 16x16x4
// block: lane l holds A[l % 16][l / 16] and B[l / 16][l % 16] (one element each), D as above; a pack of
// four (16 deep): lane l's A row, B column at k = 4(l / 16) .. 4(l / 16) + 3, instruction p taking the p-th.
__device__ __forceinline__ float convgen_to_f32(float v) { return v; }
template <class T> __device__ __forceinline__ T convgen_from_f32(float v);
template <> __device__ __forceinline__ float convgen_from_f32<float>(float v) { return v; }
template <> struct convgen_mma_k<float> { static constexpr int value = 16; };
#if defined(CONVGEN_SIM)
inline void convgen_sim_mma(const char* site, convgen_mma_acc& d, const convgen_mma_a<float>& a,
                            const convgen_mma_b<float>& b) {
    for (int p = 0; p < 4; ++p)
        ::convgen_sim::matrix_instruction_f32(site, &::convgen_sim::emulate_mfma_16x16x4_f32, a.v.w + p, b.v.w + p, d.c);
}
#else
__device__ __forceinline__ void convgen_mma_sync(convgen_mma_acc& d, const convgen_mma_a<float>& a,
                                                 const convgen_mma_b<float>& b) {
    convgen_v4f32 vd = {d.c[0], d.c[1], d.c[2], d.c[3]};
#pragma unroll
    for (int p = 0; p < 4; ++p)
        vd = __builtin_amdgcn_mfma_f32_16x16x4f32(__uint_as_float(a.v[p]), __uint_as_float(b.v[p]), vd, 0, 0, 0);
    for (int j = 0; j < 4; ++j) d.c[j] = vd[j];
}
#endif

// --- f64: v_mfma_f64_16x16x4f64 (gfx90a; gfx940 spells it v_mfma_f64_16x16x4_f64) ---------------
// Doubles in shared memory, f64 accumulation. Lane l holds A[l % 16][l / 16] and B[l / 16][l % 16]
// (one double each), as the f32 16x16x4 shape does, but its four accumulators are D[4j + l / 16][l % 16]:
// each group of 16 lanes takes every fourth row (AMD's "AMD matrix cores" lab notes, the
// v_mfma_f64_16x16x4f64 example; convgen_mma_acc_row<double> above). A pack of two (8 deep): lane l's
// A row, B column at k = 2(l / 16), 2(l / 16) + 1, instruction p taking the p-th.
template <> struct convgen_mma_k<double> { static constexpr int value = 8; };
#if defined(CONVGEN_SIM)
inline void convgen_sim_mma(const char* site, convgen_mma_accum<double>& d, const convgen_mma_a<double>& a,
                            const convgen_mma_b<double>& b) {
    for (int p = 0; p < 2; ++p)
        ::convgen_sim::matrix_instruction64(site, &::convgen_sim::emulate_mfma_16x16x4_f64,
                                            reinterpret_cast<const double*>(a.v.w) + p, reinterpret_cast<const double*>(b.v.w) + p, d.c);
}
#else
typedef double convgen_v4f64 __attribute__((ext_vector_type(4)));
__device__ __forceinline__ void convgen_mma_sync(convgen_mma_accum<double>& d, const convgen_mma_a<double>& a,
                                                 const convgen_mma_b<double>& b) {
    convgen_v4f64 vd = {d.c[0], d.c[1], d.c[2], d.c[3]};
#pragma unroll
    for (int p = 0; p < 2; ++p)
        vd = __builtin_amdgcn_mfma_f64_16x16x4f64(__builtin_bit_cast(double, convgen_pack_half(a.v, p)),
                                                  __builtin_bit_cast(double, convgen_pack_half(b.v, p)), vd, 0, 0, 0);
    for (int j = 0; j < 4; ++j) d.c[j] = vd[j];
}
#endif
