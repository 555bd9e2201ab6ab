/* mhc.cuh: the CUDA twins of ops/mhc.h (coefficients with Sinkhorn, mix,
 * update, head merge), argument for argument with device pointers and a
 * stream, and the slots of mhc_coeffs, mhc_mix, mhc_update and mhc_merge.
 *
 *   kern_mhc_mix, kern_mhc_update  one thread per (position, column): the
 *        CPU's per-element expressions in the CPU's order (stream 0's
 *        product, then streams 1..hc-1 added in order, then + post F), one
 *        rounding each: the CPU's bits.
 *   kern_mhc_coeffs  the dots X W_fn^T by cuBLAS (pedantic fp32), the sum of
 *        squares by a block reduction (256 threads per position), then one
 *        thread per position: pre, post and the H_res logits as ops/mhc.c's
 *        coeff_row forms them, and Sinkhorn through ops/num_sinkhorn.h, the
 *        order the CPU runs. The GEMM's and the reduction's order and expf
 *        differ from the CPU: compared under a tolerance.
 *   kern_mhc_merge   the same statistics at hc rows, the sigmoid pre, then mix.
 * Scratch: kern_mhc_merge needs n floats of sumsq (device) from the caller.
 */
#ifndef CEDAR_KERN_MHC_CUH
#define CEDAR_KERN_MHC_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "ops/backend.h"
#include "ops/mhc.h"

cudaError_t kern_mhc_mix(float *u, const float *X, const float *pre, int n, int hc, int d, cudaStream_t st);
cudaError_t kern_mhc_update(float *Xn, const float *X, const float *C, const float *post, const float *F, int n, int hc,
                            int d, cudaStream_t st);
cublasStatus_t kern_mhc_coeffs(cublasHandle_t h, float *pre, float *post, float *C, float *dots, float *sumsq,
                               const float *X, const float *W_fn, const float *scale, const float *base, int n,
                               const struct op_mhc_cfg *c, cudaStream_t st);
cublasStatus_t kern_mhc_merge(cublasHandle_t h, float *y, float *pre, float *sumsq, const float *X, const float *W_fn,
                              const float *scale, const float *base, int n, const struct op_mhc_cfg *c,
                              cudaStream_t st);

extern "C" {
int kern_mhc_coeffs_run(const struct op_desc *self, struct op_io *io);
int kern_mhc_mix_run(const struct op_desc *self, struct op_io *io);
int kern_mhc_update_run(const struct op_desc *self, struct op_io *io);
int kern_mhc_merge_run(const struct op_desc *self, struct op_io *io);
}

#endif
