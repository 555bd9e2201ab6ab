/* qkv.h: the per-position projections every attention layer runs before it
 * looks at any cache (SPEC 3.5, 3.6, R.2, R.4):
 *
 *   c_q = RMSNorm_q(W_qa u)                          op_q_latent
 *   q   = W_qb c_q, per-head RMS norm, RoPE          op_q_main
 *   qI  = W_iq c_q, indexer RoPE                     op_q_indexer  (full/reindex layers)
 *   w   = scale * W_w u                              op_index_weights (full/reindex layers)
 *   kS  = RMSNorm_swa(W_kv^swa u), RoPE              op_swa_kv (float)
 *   SWA entry bytes = FP8(kS)                        op_swa_pack
 *
 * Every function works on a batch of n positions (row i of u is position
 * pos[i]; positions need not be contiguous), writes only into the caller's
 * output arrays and allocates nothing: the projections are written straight
 * into the output and normalised/rotated in place.
 *
 * Parameters SPEC marks [R]/[R-cfg] are arguments, with SPEC's default named
 * beside them; RoPE parameters come as a `struct op_rope` (ops/rope.h)
 * because SWA-only layers and CSA2 layers use different thetas (SPEC 1.1).
 * The rotating ops take the rows' angles as a table (struct op_rope_angles,
 * rows 0..n-1 are positions pos[0..n-1]) that the caller computes once for
 * every tensor it rotates at those rows; `rope` gives the geometry (dim,
 * rope_dim, last) and must have the table's frequencies.
 *
 * Not here: where the SWA entry goes (the ring slot p mod W is the runtime's
 * business, SPEC 3.6), the compressor (ops/compressor.h), scoring.
 * Test: tests/test_ops_qkv.c (ctest -R ops_qkv).
 */
#ifndef CEDAR_OPS_QKV_H
#define CEDAR_OPS_QKV_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/formats.h"
#include "ops/qweight.h"
#include "ops/rope.h"

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

/* c_q = RMSNorm(W_qa u) * gamma_q, the query latent (SPEC 3.5; q_rank 1280
 * [A]). eps: model.norm_eps (default 1e-6 [R]). */
void op_q_latent(float *cq /* (n, q_rank) */, const float *u /* (n, hidden) */,
                 const float *W_qa /* (q_rank, hidden) */, const float *gamma_q /* (q_rank) or NULL */, int n,
                 int hidden, int q_rank, float eps);

/* Main query heads (SPEC 3.5, R.2): q = W_qb c_q viewed (heads, head_dim);
 * when head_norm, every head is scaled by rsqrt(mean(q_h^2) + eps) with no
 * weight (plan `q_head_norm`, default true [R-cfg, unverified]); then RoPE on
 * each head's rope slice at row i's angles. rope->dim must equal head_dim. */
void op_q_main(float *q /* (n, heads * head_dim) */, const float *cq /* (n, q_rank) */,
               const float *W_qb /* (heads * head_dim, q_rank) */, const struct op_rope_angles *ang /* >= n rows */,
               const struct op_rope *rope, int n, int q_rank, int heads, int head_dim, bool head_norm, float eps);

/* Indexer query heads (SPEC 3.5, R.4): qI = W_iq c_q viewed (idx_heads,
 * idx_dim), indexer RoPE at row i's angles (rope_i->dim must equal idx_dim;
 * default 64 of 128 dims, last [R-cfg]). No per-head norm (R.4 has none). */
void op_q_indexer(float *qI /* (n, idx_heads * idx_dim) */, const float *cq /* (n, q_rank) */,
                  const float *W_iq /* (idx_heads * idx_dim, q_rank) */,
                  const struct op_rope_angles *ang /* >= n rows */, const struct op_rope *rope_i, int n, int q_rank,
                  int idx_heads, int idx_dim);

/* Indexer head weights w = scale * (W_w u), from the query hidden u, not from
 * c_q (SPEC 3.5 [A]). A positive scale never changes Top-K (SPEC 3.10), so it
 * matters only for the score values; the default a plan should pass is R.4's,
 * op_index_weight_scale(). scale == 1 skips the multiply. */
void op_index_weights(float *w /* (n, idx_heads) */, const float *u /* (n, hidden) */,
                      const float *W_w /* (idx_heads, hidden) */, int n, int hidden, int idx_heads, float scale);

/* R.4's weight scale: idx_dim^-0.5 * idx_heads^-0.5 (128^-0.5 * 32^-0.5 for
 * V4.1-Flash), rounded to float once. */
static inline float op_index_weight_scale(int idx_heads, int idx_dim) {
  return (float)(1.0 / sqrt((double)idx_heads * (double)idx_dim));
}

/* SWA key/value, float path (SPEC 3.6): kS = RMSNorm(W_kv u) * gamma, then
 * RoPE on the rope slice at row i's angles. rope->dim must equal head_dim. This is the
 * layer's own projection, never the global compressor's (SPEC 8.10). */
void op_swa_kv(float *kS /* (n, head_dim) */, const float *u /* (n, hidden) */,
               const float *W_kv /* (head_dim, hidden) */, const float *gamma /* (head_dim) or NULL */,
               const struct op_rope_angles *ang /* >= n rows */, const struct op_rope *rope, int n, int hidden,
               int head_dim, float eps);

/* SWA entries (SPEC 4.4, R.2, Appendix V #21): row i of kS packed with
 * op_kv_pack in `fmt` (plan `formats.swa`) into out + i * stride; stride >=
 * op_kv_bytes(fmt, w), and bytes past the entry inside a stride are left
 * untouched. The V4.1 plans store E4M3 with one E8M0 scale per 32 (528 B). */
void op_swa_pack(uint8_t *out /* (n, stride) */, const float *kS /* (n, w) */, int n, int w,
                 const struct op_kv_format *fmt, size_t stride);

/* ---- the descriptors' checked calls -------------------------------------- */
/* What q_latent, q_main, q_indexer, index_weights and swa_kv's descriptors
 * read from an op_io once every input and parameter is checked and the
 * outputs allocated: one function per op, shared by the CPU runs (below in
 * ops/qkv.c) and the CUDA twins (kernels/qkv.cu), so both refuse the same
 * calls with the same status and message. Each returns 0 or the status after
 * op_io_fail. The angles are not part of it: each side makes its own. */
struct op_desc;
struct op_io;
struct op_qkv_call {
  const float *x;      /* u (n, in), or cq for q_main / q_indexer */
  const float *W;      /* (rows, in) */
  const float *gamma;  /* (rows) or NULL: q_latent's gamma_q, swa_kv's gamma */
  const int64_t *pos;  /* (n): q_main, q_indexer, swa_kv */
  float *out;          /* (n, rows): cq, q, qI, w or kS */
  uint8_t *entries;    /* swa_kv with pack=1: (n, bytes); else NULL */
  int n, in, rows;     /* rows = heads * head_dim for the head ops */
  int heads, head_dim; /* the head ops */
  bool head_norm;      /* q_main */
  float eps, scale;    /* eps: q_latent, q_main, swa_kv; scale: index_weights */
  struct op_rope rope; /* q_main, q_indexer, swa_kv */
  struct op_kv_format fmt; /* swa_kv with pack=1: the FP8 format */
  size_t bytes;        /* its entry bytes */
};
/* The same ops over weights in their stored formats (ops/qweight.h; the
 * model's path): bitwise the float ones over the dequantized matrices
 * (ops/qlinear.h). The widths come from the views: W_qa (q_rank, hidden),
 * W_qb (heads * head_dim, q_rank), W_iq (idx_heads * idx_dim, q_rank),
 * W_kv (head_dim, hidden). The float entry points above are F32 views. */
void op_q_latent_q(float *cq, const float *u, const struct op_qweight *W_qa, const float *gamma_q, int n, float eps);
void op_q_main_q(float *q, const float *cq, const struct op_qweight *W_qb, const struct op_rope_angles *ang,
                 const struct op_rope *rope, int n, int heads, int head_dim, bool head_norm, float eps);
void op_q_indexer_q(float *qI, const float *cq, const struct op_qweight *W_iq, const struct op_rope_angles *ang,
                    const struct op_rope *rope_i, int n, int idx_heads, int idx_dim);
void op_swa_kv_q(float *kS, const float *u, const struct op_qweight *W_kv, const float *gamma,
                 const struct op_rope_angles *ang, const struct op_rope *rope, int n, float eps);

int op_q_latent_prepare(const struct op_desc *self, struct op_io *io, struct op_qkv_call *c);
/* main: q_main (W_qb, head norm), else q_indexer (W_iq). */
int op_q_heads_prepare(const struct op_desc *self, struct op_io *io, bool main, struct op_qkv_call *c);
int op_index_weights_prepare(const struct op_desc *self, struct op_io *io, struct op_qkv_call *c);
int op_swa_kv_prepare(const struct op_desc *self, struct op_io *io, struct op_qkv_call *c);

#ifdef __cplusplus
}
#endif

#endif
