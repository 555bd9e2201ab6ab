/* gpu_test.cuh: what the GPU tests in tests/gpu/ share: the checks that
 * end a test on a CUDA or cuBLAS error (naming the call and where), and a
 * small seeded generator for their inputs (xorshift64: the same inputs on
 * every run). Test code only. */
#ifndef CEDAR_TESTS_GPU_TEST_CUH
#define CEDAR_TESTS_GPU_TEST_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                                  \
  do {                                                                                            \
    cudaError_t _e = (call);                                                                      \
    if (_e != cudaSuccess) {                                                                      \
      fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(_e)); \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

#define BK(call)                                                                                     \
  do {                                                                                               \
    cublasStatus_t _s = (call);                                                                      \
    if (_s != CUBLAS_STATUS_SUCCESS) {                                                               \
      fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cublasGetStatusString(_s)); \
      exit(1);                                                                                       \
    }                                                                                                \
  } while (0)

/* xorshift64 over *s (never 0): 32 random bits; a float in [-0.5, 0.5). */
static inline uint32_t gt_urand(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return (uint32_t)(*s >> 32);
}
static inline float gt_frand(uint64_t *s) { return (float)(gt_urand(s) & 0xffffff) / (float)0x1000000 - 0.5f; }

#endif
