/* dspark.cuh: the CUDA twins of ops/dspark.h's DSpark heads (SPEC 3.16),
 * with device pointers, a cuBLAS handle and a stream, and the slots of
 * dspark_draft, dspark_confidence and dspark_verify_len.
 *
 *   kern_dspark_draft_logits  one draft position i: the previous token (y0
 *              at i = 0, else draft[i - 1], read on the device) selects its
 *              row of A (one CTA copies it), kern_linear (cuBLAS, pedantic
 *              fp32) makes U A[prev], then logits_i = that + base_i, one IEEE
 *              sum per value (ops/dspark.c's li[y] += bi[y]). Position i is
 *              then sampled by kern_sample_rows (kernels/sample.cuh) on one
 *              row whose generator state is seed + i splitmix64 steps: the
 *              CPU draws once per sampled position, in order;
 *   kern_dspark_confidence    a = h w_c by kern_linear, then sigmoid(a + b_c)
 *              as op_sigmoid (1 / (1 + expf(-x)), one rounding per step);
 *   kern_dspark_verify_len    one thread: E[A(L)], the scores and L* in the
 *              CPU's order (products and sums in fp32, ties to the shorter
 *              L), every step one IEEE operation: the CPU's bits.
 *
 * Bits: the draft's logits differ from the CPU's by the GEMM's rounding (a
 * rank-long dot), the sampler's expf by an ulp; a draft id can differ only
 * where a draw or a greedy argmax falls within that rounding of a boundary
 * (the harness compares ids bitwise: such a near-tie is reported, as for
 * sample). The slot of dspark_draft synchronizes once per position to
 * check the row as the CPU does (op_sample_row_usable) before sampling it,
 * so an unusable row is refused with the CPU's message.
 */
#ifndef CEDAR_KERN_DSPARK_CUH
#define CEDAR_KERN_DSPARK_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/backend.h"
#include "ops/dspark.h"

/* arow: rank floats of device scratch. */
cublasStatus_t kern_dspark_draft_logits(cublasHandle_t h, float *logits_i, float *arow, const int32_t *draft,
                                        const float *base_i, const float *A, const float *U, int32_t y0, int i, int V,
                                        int rank, cudaStream_t st);
cublasStatus_t kern_dspark_confidence(cublasHandle_t h, float *a, const float *hs, const float *w_c, float b_c, int L,
                                      int d, cudaStream_t st);
cudaError_t kern_dspark_verify_len(float *expected, float *score, int32_t *L_star, const float *a,
                                   const float *t_round, int Lmax, cudaStream_t st);

extern "C" {
int kern_dspark_draft_run(const struct op_desc *self, struct op_io *io);
int kern_dspark_confidence_run(const struct op_desc *self, struct op_io *io);
int kern_dspark_verify_len_run(const struct op_desc *self, struct op_io *io);
}

#endif
