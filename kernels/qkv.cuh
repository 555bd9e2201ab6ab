/* qkv.cuh: the CUDA twins of ops/qkv.h's per-position projections (SPEC
 * 3.5, 3.6, R.2, R.4), argument for argument with device pointers, a cuBLAS
 * handle and a stream, and the slots of q_latent, q_main, q_indexer,
 * index_weights and swa_kv.
 *
 *   kern_q_latent       cq = RMSNorm(W_qa u) gamma_q: kern_linear (cuBLAS,
 *                       pedantic fp32) into tmp, then kern_rmsnorm into cq;
 *   kern_q_heads        q_main (head_norm as asked) and q_indexer (never):
 *                       kern_linear, the weightless per-head RMSNorm as
 *                       kern_rmsnorm over n heads rows of head_dim, then
 *                       kern_rope_apply on every head at pos;
 *   kern_index_weights  w = W_w u by kern_linear, then w *= scale one IEEE
 *                       product per value (skipped at scale 1, as the CPU);
 *   kern_swa_kv         kS = RoPE(RMSNorm(W_kv u) gamma), and with entries
 *                       the FP8 entries packed from kS by kern_kv_pack_rows
 *                       (the SWA write in its storage format, where made).
 * tmp: n x (rows of W) floats of device scratch (the GEMM's result before the
 * norm: the norm kernels read and write different buffers).
 *
 * Bits: the GEMM's order is cuBLAS's, not op_linear's, so every float differs
 * from the CPU's by the GEMM's rounding (the harness's tolerance); the steps
 * after it are the CPU's expressions (kernels/basic.cuh, rope.cuh). The FP8
 * codes are the CPU's packer's for the same kS bits (ops/num_codec.h); with
 * kS from a different GEMM a code can move one step, so the harness compares
 * entries by re-encoding the twin's own kS bitwise and by decoded values
 * under the GEMM's bound (tests/test_backend_ops.c).
 */
#ifndef CEDAR_KERN_QKV_CUH
#define CEDAR_KERN_QKV_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/backend.h"
#include "ops/formats.h"
#include "ops/qkv.h"
#include "ops/rope.h"

cublasStatus_t kern_q_latent(cublasHandle_t h, float *cq, float *tmp, const float *u, const float *W_qa,
                             const float *gamma_q, int n, int hidden, int q_rank, float eps, cudaStream_t st);
cublasStatus_t kern_q_heads(cublasHandle_t h, float *q, float *tmp, const float *cq, const float *W,
                            const struct op_rope *rope, const int64_t *pos, int n, int q_rank, int heads, int head_dim,
                            bool head_norm, float eps, cudaStream_t st);
cublasStatus_t kern_index_weights(cublasHandle_t h, float *w, const float *u, const float *W_w, int n, int hidden,
                                  int heads, float scale, cudaStream_t st);
/* entries: NULL, or n entries of op_kv_bytes(fmt, head_dim) bytes packed in
 * fmt (a format kern_kv_pack_supported takes). */
cublasStatus_t kern_swa_kv(cublasHandle_t h, float *kS, float *tmp, uint8_t *entries, const struct op_kv_format *fmt,
                           const float *u, const float *W_kv, const float *gamma, const struct op_rope *rope,
                           const int64_t *pos, int n, int hidden, int head_dim, float eps, cudaStream_t st);

extern "C" {
int kern_q_latent_run(const struct op_desc *self, struct op_io *io);
int kern_q_main_run(const struct op_desc *self, struct op_io *io);
int kern_q_indexer_run(const struct op_desc *self, struct op_io *io);
int kern_index_weights_run(const struct op_desc *self, struct op_io *io);
int kern_swa_kv_run(const struct op_desc *self, struct op_io *io);
}

#endif
