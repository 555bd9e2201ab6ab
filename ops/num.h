/* num.h: what the numeric-core headers (ops/num_*.h) need to compile the
 * same source as C for the CPU ops and as CUDA for the kernels.
 *
 * What it is:
 *   OP_HD        `__host__ __device__` under nvcc, empty in plain C, on every
 *                function of a core header (with OP_HD_INLINE: static inline,
 *                and always inlined, so that ops/isa.h's vector clones of a
 *                CPU loop get their own copy, as OP_ISA_BODY asks);
 *   op_hd_bits / op_hd_float: a float's bits and back (memcpy in C, the
 *                reinterpreting intrinsics on the device);
 *   OP_HD_ADD/MUL/DIV: one IEEE single operation rounded to nearest even.
 *                In C that is the plain operator (the build is ISO C11 with
 *                -ffp-contract=off, ops/isa.h); on the device the _rn
 *                intrinsics, which nvcc never contracts into an FMA, so a
 *                core rule whose bits depend on one rounding (the E4M3 grid
 *                add of num_codec.h, x / s of the packers) rounds once on both
 *                sides whatever -fmad the kernel is built with.
 *   OP_HD_EXPF, OP_HD_SQRTF: the libm call in C, CUDA's expf / sqrtf on the
 *                device. sqrtf is correctly rounded on both (nvcc's default
 *                -prec-sqrt=true); expf is not (glibc <= 1 ulp, CUDA <= 2 ulp),
 *                so a core function that calls OP_HD_EXPF shares its order of
 *                operations with the kernels, not its bits: the kernels' tests
 *                compare those under a tolerance (docs/kernels.md).
 *
 * What it is not: a place for op logic. Test: tests/test_num_core.c and its
 * nvcc twin tests/num_core_nvcc.cu (ctest -R num_core).
 */
#ifndef CEDAR_OPS_NUM_H
#define CEDAR_OPS_NUM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define OP_HD __host__ __device__
#define OP_HD_INLINE __host__ __device__ static inline __attribute__((always_inline))
#elif defined(__GNUC__)
#define OP_HD
#define OP_HD_INLINE static inline __attribute__((always_inline))
#else
#define OP_HD
#define OP_HD_INLINE static inline
#endif

OP_HD_INLINE uint32_t op_hd_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
#endif
}

OP_HD_INLINE float op_hd_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
#endif
}

#if defined(__CUDA_ARCH__)
#define OP_HD_ADD(a, b) __fadd_rn((a), (b))
#define OP_HD_MUL(a, b) __fmul_rn((a), (b))
#define OP_HD_DIV(a, b) __fdiv_rn((a), (b))
#else
#define OP_HD_ADD(a, b) ((a) + (b))
#define OP_HD_MUL(a, b) ((a) * (b))
#define OP_HD_DIV(a, b) ((a) / (b))
#endif
#define OP_HD_EXPF(x) expf(x)
#define OP_HD_SQRTF(x) sqrtf(x)

#endif
