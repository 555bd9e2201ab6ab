/* moe.h: the mixture-of-experts FFN sublayer (SPEC 1.2, 3.13, R.6).
 *
 * What it is: the CPU reference for routing and for the expert FFNs.
 *   logits   l_i = e_i . x                      router W (n_routed, hidden), op_linear
 *   scores   s_i = score(l)_i                   sqrt(softplus) [R-cfg], softmax or sigmoid
 *   select   Sel = top n_active of (s_i + b_i^{mod(token)})   bias for SELECTION only [A]
 *   weights  g_i = s_i / sum_{k in Sel} s_k * route_scale     (without the division when
 *                                                             norm_topk is false)
 *   FFN(x)   = W_down (g * SiLU(min(W_gate x, L)) * clamp(W_up x, -L, L))   L = swiglu_limit
 *   y        = FFN_shared(x) + sum_{i in Sel} FFN_i(x)         (shared expert unweighted)
 * The routing weight multiplies the intermediate before W_down, as R.6 writes it. The gate
 * is clamped from above only and the up projection both ways (R.6); NaN propagates through
 * both clamps (no fminf, which would turn a NaN gate into L).
 *
 * Decisions where SPEC is silent:
 *   - Ties in the selection key go to the lower expert id. The selected ids are returned in
 *     ascending id order, and both the weight normalisation sum and the accumulation of the
 *     expert outputs run in that order, so a bias change that keeps the selected set keeps
 *     the output bit for bit (SPEC 8.5.24), even when it reorders the set internally.
 *   - Modality is one byte per token: 0 = text, anything else = image.
 *   - The n_shared shared experts are stored as ONE SwiGLU FFN of width
 *     n_shared * shared_inter (their gate/up rows stacked, their down columns concatenated),
 *     as the reference checkpoints store them; the sum of n_shared SwiGLU FFNs equals that
 *     one FFN exactly in real arithmetic. The shared FFN uses the same clamp.
 *   - A token whose selected scores sum to 0 (every selected logit below about -104 with
 *     sqrtsoftplus) gets NaN weights, as the reference code does; it is not patched here.
 *
 * Batching: tokens are grouped by expert (counting sort, tokens in ascending order inside a
 * group) so each expert runs its three GEMMs once over all its tokens. op_linear is
 * row-invariant (ops/basic.h), so a token's output does not depend on which other tokens
 * share its expert batches or the shared expert's batch: bitwise the token run alone.
 *
 * What it is not: expert parallelism (dispatch/combine across ranks: runtime/dist/expert_par.h), or
 * the mHC around the sublayer (ops/mhc.h). The input x is the normalised u' (SPEC 3.3).
 * Test: tests/test_ops_moe.c (ctest -R ops_moe).
 */
#ifndef CEDAR_OPS_MOE_H
#define CEDAR_OPS_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/qweight.h"

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

enum op_moe_score {
  OP_MOE_SQRTSOFTPLUS = 0, /* sqrt(softplus(l)), default [R-cfg] */
  OP_MOE_SOFTMAX = 1,      /* softmax over the n_routed logits of a token */
  OP_MOE_SIGMOID = 2,      /* sigmoid(l) */
};

/* Dimensions and [R]/[R-cfg] parameters (plan: model.moe.*); SPEC defaults beside each. */
struct op_moe_cfg {
  int hidden;              /* d: 5120 */
  int n_routed;            /* routed experts: 384 [A] */
  int n_active;            /* experts per token: 6 [A]; 1 <= n_active <= n_routed */
  int inter;               /* routed expert intermediate dim: 2304 [A] */
  int n_shared;            /* shared experts: 1 [A]; 0 = none */
  int shared_inter;        /* intermediate dim of each shared expert: 2304 [R] */
  enum op_moe_score score; /* sqrtsoftplus [R-cfg] */
  bool norm_topk;          /* normalise the weights over the selected set: true [R-cfg] */
  float route_scale;       /* routed_scaling_factor: 1.5 [R-cfg] */
  float limit;             /* swiglu_limit: 10 [A] */
  int shared_mxfp8;        /* > 0: the shared expert (FP8 weights) reads its inputs, x and its hidden,
                            * through MXFP8 per this many values (op_mxfp8_qdq; Appendix V #22); 0: as given */
};

/* The expert matrices as views (ops/qweight.h): gate, up (n_routed * inter,
 * hidden) and down (n_routed * hidden, inter), expert e the rows e * inter
 * (e * hidden) on; the shared expert's three matrices. An F32 view is the
 * float path bit for bit; a stored one is bitwise it over the dequantized
 * matrices (ops/qlinear.h). */
struct op_moe_qweights {
  struct op_qweight router; /* (n_routed, hidden) */
  struct op_qweight gate, up, down;
  struct op_qweight shared_gate, shared_up, shared_down;
};

/* Weights of one MoE sublayer. Every matrix is (out, in), row-major. */
struct op_moe_weights {
  const float *router;      /* (n_routed, hidden): e_i, the router's W_gate */
  const float *bias;        /* (2, n_routed): correction bias, row 0 text, row 1 image; NULL = 0 */
  const float *gate;        /* (n_routed, inter, hidden): W_gate (w1) of each routed expert */
  const float *up;          /* (n_routed, inter, hidden): W_up (w3) */
  const float *down;        /* (n_routed, hidden, inter): W_down (w2) */
  const float *shared_gate; /* (n_shared * shared_inter, hidden) */
  const float *shared_up;   /* (n_shared * shared_inter, hidden) */
  const float *shared_down; /* (hidden, n_shared * shared_inter) */
  /* The matrices in their stored formats (the model's path) when has_q,
   * else the float ones above: with has_q, the router and every expert and
   * shared matrix come from q (router..shared_down unused; bias stays floats). */
  bool has_q;
  struct op_moe_qweights q;
};


/* Router scores s = score(x router^T) for n tokens; the ORIGINAL scores, without bias. */
void op_moe_scores(float *scores /* (n, n_routed) */, const float *x /* (n, hidden) */,
                   const float *router /* (n_routed, hidden) */, int n, const struct op_moe_cfg *c);

/* The same with the router as a view (ops/qweight.h). */
void op_moe_scores_q(float *scores /* (n, n_routed) */, const float *x /* (n, hidden) */,
                     const struct op_qweight *router, int n, const struct op_moe_cfg *c);

/* Selection and weights from the scores: sel[t] = the n_active experts with the largest
 * scores[t][i] + bias[mod(t)][i] (fp32 sum; ties to the lower id), in ascending id order;
 * weight[t][k] = the weight of expert sel[t][k] from the original scores.
 * bias (2, n_routed) or NULL; modality (n) or NULL (all text). */
void op_moe_select(int32_t *sel /* (n, n_active) */, float *weight /* (n, n_active) */,
                   const float *scores /* (n, n_routed) */, const float *bias /* (2, n_routed) */,
                   const uint8_t *modality /* (n) */, int n, const struct op_moe_cfg *c);

/* The clamped SwiGLU: h = row_scale[r] * SiLU(min(g, limit)) * clamp(u, -limit, limit).
 * row_scale NULL means 1. h may alias g or u. */
void op_moe_swiglu(float *h /* (n, inter) */, const float *g /* (n, inter) */, const float *u /* (n, inter) */,
                   const float *row_scale /* (n) */, int n, int inter, float limit);

/* One expert FFN over n rows: y = W_down(swiglu(W_gate x, W_up x, row_scale)).
 * ws holds 2 * n * inter floats of scratch. */
void op_moe_ffn(float *y /* (n, hidden) */, const float *x /* (n, hidden) */, const float *w_gate /* (inter, hidden) */,
                const float *w_up /* (inter, hidden) */, const float *w_down /* (hidden, inter) */,
                const float *row_scale /* (n) */, int n, int hidden, int inter, float limit,
                float *ws /* (2, n, inter) */);

/* The same over views (expert e of a stack: op_qweight_rows(gate, e * inter, inter)). */
void op_moe_ffn_q(float *y /* (n, hidden) */, const float *x /* (n, hidden) */, const struct op_qweight *w_gate,
                  const struct op_qweight *w_up, const struct op_qweight *w_down, const float *row_scale /* (n) */,
                  int n, float limit, float *ws /* (2, n, inter) */);

/* Bytes of scratch op_moe_forward needs for n tokens. */
size_t op_moe_workspace_bytes(int n, const struct op_moe_cfg *c);

/* The shared expert alone: y = FFN_shared(x) (0 without one), exactly as op_moe_forward
 * computes it before adding the routed experts (expert parallelism, runtime/dist/expert_par.h,
 * adds them elsewhere in the same order). ws as op_moe_forward's. */
void op_moe_shared(float *y /* (n, hidden) */, const float *x /* (n, hidden) */, const struct op_moe_weights *w,
                   int n, const struct op_moe_cfg *c, void *ws);

/* The MoE sublayer for n tokens: y, plus the routing (sel, weight as op_moe_select returns
 * them) for tests and traces. ws: op_moe_workspace_bytes(n, c) bytes, any alignment
 * malloc gives. */
void op_moe_forward(float *y /* (n, hidden) */, int32_t *sel /* (n, n_active) */, float *weight /* (n, n_active) */,
                    const float *x /* (n, hidden) */, const struct op_moe_weights *w, const uint8_t *modality /* (n) */,
                    int n, const struct op_moe_cfg *c, void *ws);

/* A tap on the expert FFNs, for tests and counters: while fn is set on a
 * thread, op_moe_shared and op_moe_forward on that thread call
 * fn(ctx, expert, rows) once for each expert FFN they run, expert -1 for the
 * shared expert (before the routed ones) and the routed expert's id
 * otherwise, over the rows that expert ran on. A call of op_moe_forward over
 * n rows reports the shared expert once over n rows, then each selected
 * expert once, in ascending id order (tests/test_moe_grouping.c). */
struct op_moe_tap {
  void (*fn)(void *ctx, int expert, int rows);
  void *ctx;
};
#ifndef __cplusplus /* CUDA sources include this header; the tap is the CPU ops' */
extern _Thread_local struct op_moe_tap op_moe_tap;
#endif

/* The moe descriptor's checked call (outputs y, selected, weights allocated),
 * shared by its CPU run and the CUDA twin (kernels/moe.cu): 0 or the status
 * after op_io_fail. */
struct op_desc;
struct op_io;
struct op_moe_call {
  const float *x;
  const uint8_t *modality; /* or NULL */
  struct op_moe_weights w;
  struct op_moe_cfg cfg;
  int n;
  float *y, *weight;
  int32_t *sel;
};
int op_moe_prepare(const struct op_desc *self, struct op_io *io, struct op_moe_call *c);

#ifdef __cplusplus
}
#endif

#endif
