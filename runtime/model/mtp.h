/* mtp.h: the model's own drafter, DSpark (Appendix V #24; SPEC 3.16, 7.8):
 * model.dspark.blocks window-only blocks `mtp.{k}` drafting
 * model.dspark.draft tokens at once for speculative decoding
 * (runtime/engine/speculate.h verifies them in one target forward).
 *
 * One draft block, the pending token y0 at position P (cedar's reading of
 * Appendix V #24 where it is terse is marked [cedar]):
 *   main_j  = RMSNorm(main_proj . cat_{l in targets} mean_i X_i^(l)(j); main_norm)
 *             for the committed positions j in [P - window, P), X^(l) the
 *             state entering target layer l (after Engram), captured while
 *             the target runs (rt_mtp_capture);
 *   rows    = ids [y0, noise x (B - 1)] at positions P .. P + B - 1 [cedar:
 *             the token at its own position, the noise rows after it],
 *             embedded (shared embed) into every stream, one-hot pre;
 *   block k = an ordinary block (mHC pairing v41: each sublayer mixes with
 *             the pre carried in, leaves its own): attention whose keys are
 *             the main rows through block k's wkv/kv_norm (RoPE at j) and the
 *             draft rows' own (RoPE at their positions), every draft row
 *             seeing every key (no causal mask inside the block), the
 *             plan's SWA storage format on every key (as the target's ring),
 *             sink, RoPE theta of model.rope.swa; then the block's own MoE
 *             (dspark.routed_experts, top dspark.active_experts + shared);
 *   x_i     = the last block's streams collapsed with its FFN's own pre;
 *   base_i  = head(RMSNorm(x_i; mtp.{last}.norm))  (the shared lm_head);
 *   greedy Markov: d_0 = y0, logits_i = base_i + markov.head . markov.embed[d_i],
 *             d_{i+1} = argmax logits_i (ops/dspark.h, op_dspark_markov_draft);
 *   conf_i  = confidence_head.proj . [x_i, markov.embed[d_i]]  (no bias, no
 *             sigmoid: Appendix V's COL). The verify-length choice reads it
 *             as a probability through sigmoid (SPEC 3.16's form, b = 0) [cedar].
 * Numerics follow the plan's model.numerics at the target's points
 * (residual streams, sublayer io, MXFP8 inputs of the FP8 linears:
 * wq_a, wq_b, wkv, wo_a, wo_b, the shared expert, main_proj).
 *
 * The capture: a ring of window + RT_MTP_SLACK positions, each the target
 * layers' stream means with a position tag per target, written for every
 * position a target forward runs (prefill replay, decode, verify). Rows a
 * rejected verify position wrote are never read (a draft reads positions
 * below the committed end only) and are rewritten when that position runs
 * again, so the capture needs no rollback; the ring's slack keeps a verify
 * step from overwriting the window a later draft reads.
 * Not here: sampled drafting (the drafts are greedy; the verifier's rule
 * treats them as one-hot), batching of drafts.
 * Test: tests/test_mtp.c (ctest -R mtp), tests/cli/oracle_mtp.sh.
 */
#ifndef CEDAR_RUNTIME_MTP_H
#define CEDAR_RUNTIME_MTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/moe.h"
#include "runtime/model/arena.h"
#include "runtime/model/model.h"

#define RT_MTP_SLACK 32 /* capture slots past the window: more than a verify step's positions */

struct rt_mtp_block {
  const float *attn_norm, *ffn_norm;
  const float *hc_fn[2], *hc_scale[2], *hc_base[2];
  struct op_qweight wq_a, wq_b, wkv, wo_a, wo_b; /* views in their held formats (runtime/load/weights.h) */
  const float *q_norm, *kv_norm, *sink;
  struct op_moe_weights moe;
};

struct rt_mtp {
  const struct rt_model *M;
  int blocks, B, window, n_targets, rank, noise;
  int targets[8];
  struct rt_mtp_block blk[8];
  struct op_qweight main_proj;
  const float *main_norm, *norm, *mk_embed, *mk_head, *conf;
  struct op_moe_cfg moe;
};

/* Bind the drafter of M's plan to M's weights. CEDAR_EUNSUPPORTED with a
 * message when the plan has no drafter (dspark.blocks 0, no target layers)
 * or one these structs cannot hold. */
int rt_mtp_init(struct rt_mtp *D, const struct rt_model *M, char *err, size_t err_len);

/* The target-layer rows of one request (see the header). */
struct rt_mtp_cap {
  int n_targets, targets[8], d, cap;
  float *rows;      /* (cap, n_targets, d) stream means */
  int64_t *tag;     /* (cap, n_targets) position each row holds, -1 none */
  float *main;      /* (cap, d) main rows computed from them */
  int64_t *main_tag;/* (cap) */
};
int rt_mtp_cap_init(struct rt_mtp_cap *c, const struct plan *p);
void rt_mtp_cap_free(struct rt_mtp_cap *c);
/* The executor's hook: X (n, hc, d) entering layer l at positions
 * [a, a + n); a no-op for other layers. */
void rt_mtp_capture(struct rt_mtp_cap *c, int layer, int64_t a, int n, const float *X, int hc);

/* One draft block after the committed positions [0, P) with the pending
 * token y0: draft (B) the greedy drafts d_1..d_B, logits (B, V) with the
 * Markov term, conf (B) the raw confidence, x (B, hidden) the collapsed
 * rows, or NULL for any of the last three. Returns 0, or CEDAR_EINVAL with
 * err when the capture lacks a window row or the logits are not finite. */
int rt_mtp_draft_block(const struct rt_mtp *D, struct rt_mtp_cap *c, int64_t P, int32_t y0, int32_t *draft,
                       float *logits, float *conf, float *x, struct rt_arena *ar, char *err, size_t err_len);

#endif
