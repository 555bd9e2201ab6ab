/* reduce.cuh: the block-level sum and max the kernels share (warp shuffles,
 * then one warp over the warps' partials). Device code only, header-only.
 *
 * The order of a block sum is fixed by the launch (blockDim.x, a multiple of
 * 32): thread t adds its strided elements in index order, lanes combine by
 * the butterfly, then warps in order. So a kernel's result is the same on
 * every run of the same shape (the harness's run-twice check), but not the
 * CPU's serial order: the twins are compared under tolerances derived from
 * the reduction length (tests/test_backend_ops.c).
 */
#ifndef CEDAR_KERN_REDUCE_CUH
#define CEDAR_KERN_REDUCE_CUH

#include <cuda_runtime.h>

__device__ __forceinline__ float kern_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__device__ __forceinline__ float kern_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__device__ __forceinline__ unsigned kern_warp_umax(unsigned v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

/* The sum of every thread's v over the block, returned to all threads.
 * shared: 32 floats. blockDim.x a multiple of 32, at most 1024. */
__device__ __forceinline__ float kern_block_sum(float v, float *shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = kern_warp_sum(v);
  __syncthreads(); /* shared may hold a previous call's partials */
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float t = lane < nw ? shared[lane] : 0.0f;
  return kern_warp_sum(t);
}

#endif
