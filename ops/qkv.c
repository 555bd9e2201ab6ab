/* qkv.c: query path, indexer query/weights and SWA KV projection (see qkv.h).
 *
 * Each op is a linear layer (op_linear, so OpenBLAS sgemm) written straight
 * into its output, followed by per-row work done in place: RMSNorm, the
 * per-head norm (an RMSNorm without weight over rows of head_dim), RoPE. The
 * per-row steps are row-independent bit for bit; the GEMM is not (DESIGN.md
 * facts), so results for one position may differ in the last bits between
 * batches of different n.
 *
 * Test: tests/test_ops_qkv.c (ctest -R ops_qkv).
 */
#include "ops/qkv.h"

#include "ops/basic.h"
#include "runtime/check.h"

void op_q_latent(float *cq, const float *u, const float *W_qa, const float *gamma_q, int n, int hidden, int q_rank,
                 float eps) {
  op_linear(cq, u, W_qa, n, hidden, q_rank, hidden, q_rank);
  op_rmsnorm(cq, cq, gamma_q, n, q_rank, eps);
}

void op_q_main(float *q, const float *cq, const float *W_qb, const int64_t *pos, const struct op_rope *rope, int n,
               int q_rank, int heads, int head_dim, bool head_norm, float eps) {
  CEDAR_ASSERT(rope->dim == head_dim);
  const int width = heads * head_dim;
  op_linear(q, cq, W_qb, n, q_rank, width, q_rank, width);
  /* (n, heads*head_dim) row-major is (n*heads, head_dim): one weightless
   * RMSNorm row per head is exactly q_h *= rsqrt(mean(q_h^2) + eps) (R.2). */
  if (head_norm) op_rmsnorm(q, q, NULL, n * heads, head_dim, eps);
  op_rope_apply(q, rope, pos, n, heads, width, +1);
}

void op_q_indexer(float *qI, const float *cq, const float *W_iq, const int64_t *pos, const struct op_rope *rope_i,
                  int n, int q_rank, int idx_heads, int idx_dim) {
  CEDAR_ASSERT(rope_i->dim == idx_dim);
  const int width = idx_heads * idx_dim;
  op_linear(qI, cq, W_iq, n, q_rank, width, q_rank, width);
  op_rope_apply(qI, rope_i, pos, n, idx_heads, width, +1);
}

void op_index_weights(float *w, const float *u, const float *W_w, int n, int hidden, int idx_heads, float scale) {
  op_linear(w, u, W_w, n, hidden, idx_heads, hidden, idx_heads);
  if (scale == 1.0f) return;
  for (size_t i = 0; i < (size_t)n * idx_heads; i++) w[i] *= scale;
}

void op_swa_kv(float *kS, const float *u, const float *W_kv, const float *gamma, const int64_t *pos,
               const struct op_rope *rope, int n, int hidden, int head_dim, float eps) {
  CEDAR_ASSERT(rope->dim == head_dim);
  op_linear(kS, u, W_kv, n, hidden, head_dim, hidden, head_dim);
  op_rmsnorm(kS, kS, gamma, n, head_dim, eps);
  op_rope_apply(kS, rope, pos, n, 1, head_dim, +1);
}

void op_swa_pack(uint8_t *out, const float *kS, int n, int w, int block, enum op_scale_kind kind, size_t stride) {
  size_t bytes = op_fp8_bytes(w, block, kind);
  CEDAR_ASSERT_MSG(bytes > 0 && stride >= bytes, "op_swa_pack: w %d, block %d, stride %zu (entry is %zu B)", w,
                   block, stride, bytes);
  for (int i = 0; i < n; i++) op_fp8_pack(out + (size_t)i * stride, kS + (size_t)i * w, w, block, kind);
}
