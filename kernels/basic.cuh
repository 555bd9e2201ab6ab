/* basic.cuh: the CUDA twins of ops/basic.h: embedding, RMSNorm and the linear
 * layer (cuBLAS), argument for argument with device pointers and a stream,
 * and their op slots for kernels/backend.h.
 *
 *   kern_embed     out[i] = table[tok[i]]; grid (n rows) x 128 threads; a
 *                  token outside [0, vocab) leaves its row and sets *bad to
 *                  the smallest such row (device int, may be NULL);
 *   kern_rmsnorm   one block of 256 threads per row: the sum of squares by
 *                  kernels/reduce.cuh's block sum, then out = (x r) gamma with
 *                  r = 1 / sqrt(ss / d + eps), each step one IEEE operation
 *                  as ops/basic.c rounds it (only the sum's order differs);
 *   kern_linear    y = x W^T through cublasSgemm with CUBLAS_PEDANTIC_MATH
 *                  (fp32 inputs, fp32 accumulation, no TF32): the released
 *                  checkpoint's BF16/FP8 weights reach it as fp32 today, as
 *                  they reach the CPU op; a BF16/FP8 GEMM path is not built
 *                  yet (docs/kernels.md).
 *
 * The slots (kern_<op>_run) check their call with the CPU's own prepare
 * functions (ops/basic.h), so both refuse the same inputs with the same
 * message, then upload, launch and download through kernels/kcall.cuh.
 */
#ifndef CEDAR_KERN_BASIC_CUH
#define CEDAR_KERN_BASIC_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/backend.h"

cudaError_t kern_embed(float *out, const float *table, const int32_t *tok, int n, int d, int vocab, int *bad,
                       cudaStream_t st);
cudaError_t kern_rmsnorm(float *out, const float *x, const float *gamma, int n, int d, float eps, cudaStream_t st);
/* ldx, ldy: row strides of x and y, as op_linear's. */
cublasStatus_t kern_linear(cublasHandle_t h, float *y, const float *x, const float *W, int n, int in, int out, int ldx,
                           int ldy, cudaStream_t st);

extern "C" {
int kern_embed_run(const struct op_desc *self, struct op_io *io);
int kern_rmsnorm_run(const struct op_desc *self, struct op_io *io);
int kern_linear_run(const struct op_desc *self, struct op_io *io);
}

#endif
