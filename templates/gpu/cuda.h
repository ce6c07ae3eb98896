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
#define CONVGEN_DYNAMIC_SHARED(T, name) \
    extern __shared__ __align__(16) unsigned char convgen_dynamic_shared_[]; \
    T* name = reinterpret_cast<T*>(convgen_dynamic_shared_)
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
