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
typedef hipStream_t convgen_stream_t;
#define CONVGEN_WARP 64
// hip-clang takes the triple chevron as an expression (hipLaunchKernelGGL is a statement)
#define CONVGEN_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
    (kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__), static_cast<int>(hipGetLastError()))
#define CONVGEN_DYNAMIC_SHARED(T, name) \
    extern __shared__ __align__(16) unsigned char convgen_dynamic_shared_[]; \
    T* name = reinterpret_cast<T*>(convgen_dynamic_shared_)
#endif

#define CONVGEN_FULL_MASK 0xffffffffffffffffull
template <class T> __device__ __forceinline__ T convgen_shfl_down(T v, unsigned delta) { return __shfl_down(v, delta); }
template <class T> __device__ __forceinline__ T convgen_shfl_xor(T v, int lanes) { return __shfl_xor(v, lanes); }
template <class T> __device__ __forceinline__ T convgen_shfl(T v, int lane) { return __shfl(v, lane); }
