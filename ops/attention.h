/* attention.h: sparse attention with one joint softmax and a sink, inverse
 * RoPE, and the grouped output projection (SPEC 3.12, 3.18, 8.4, R.2).
 *
 * What it is: the CPU reference (numerical spec) of the attention core of
 * every layer. For each query at absolute position p it reads
 *   G_p  the valid entries of its Top-K list, dequantized from the FP4
 *        Main-KV part of the layer's global source (SWA-only layers: none);
 *   S_p  the slots of the layer's own SWA ring whose STORED position s
 *        satisfies max(p - W + 1, r0) <= s <= p (SPEC 3.9; never the slot
 *        index),
 * and computes, per head h, with K = V = the full latent k_e:
 *   z_e = tau * q_h . k_e,   m = max(sigma_h, max_e z_e),
 *   Z   = exp(sigma_h - m) + sum_e exp(z_e - m),
 *   o_h = sum_e exp(z_e - m) k_e / Z,
 * then the inverse partial RoPE of o_h with the query position (sign -1).
 * One softmax covers global, local and sink; the sink is in the denominator
 * only. An entry present in both paths is two entries (SPEC 8.4.23).
 *
 * How: streaming (online) softmax over blocks of entries. Entries are
 * visited in a fixed order (visible SWA slots in slot order, then the Top-K
 * list in list order, as R.2's [window, compressed] index list) and taken 32
 * at a time (the last block of a query may be partial): the block is
 * dequantized once per query into a (32, head_dim) buffer used by every
 * head; its logits are computed for all heads; per head, when the block's
 * largest logit exceeds the running max, the running sum and accumulator are
 * rescaled once by exp(m_old - m_new); then each entry's weight exp(z - m)
 * joins the running sum and the accumulator in entry order. Only one block
 * of the selected set is ever materialized.
 * Fixed orders (what a bitwise comparison may rely on): each logit is
 * fl(tau * dot) with the dot summed over channels 0, 1, ..., head_dim-1 in
 * order, independent of the block size and fill; each channel of the
 * accumulator and the running sum add their terms in entry order.
 *
 * What it is not: the indexer (Top-K causality is the indexer's job, SPEC
 * 3.10 / 8.3.13: the op drops only indices < 0 and >= n_entries, which would
 * read outside the committed pool), nor a cache (the views are read-only).
 *
 * Test: ctest --test-dir build -R ops_attention --output-on-failure
 */
#ifndef CEDAR_OPS_ATTENTION_H
#define CEDAR_OPS_ATTENTION_H

#include <math.h>
#include <stdint.h>

#include "ops/kvview.h"
#include "ops/qweight.h"
#include "ops/rope.h"

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

/* The scalar parameters of one attention call (plan parameters). */
struct op_attn_params {
  int heads;      /* H [A 64] */
  int head_dim;   /* d_h, the latent width [A 512] */
  int topk;       /* Top-K list length per query [A 512]; 0 for SWA-only layers */
  int window;     /* SWA visibility span W [A 128]; 0 = no local entries. The
                     ring may hold more slots (a prefill chunk's entries, a
                     speculative ring of W + max draft): all are scanned. */
  int64_t r0;     /* replay start: SWA positions < r0 are invisible (SPEC 3.9,
                     8.8.40); 0 normally */
  float tau;      /* softmax scale [R-cfg 1/sqrt(head_dim)]: op_attn_tau_default */
  const float *sink;          /* (heads): sigma_h, fp32, unscaled (R.2); NULL = no sink */
  const struct op_rope *rope; /* the layer's RoPE (dim == head_dim) for the inverse
                                 rotation of o; NULL = no rotation */
  const struct op_rope_angles *angles; /* optional: rows [0, S) hold the queries'
                                          angles under rope (the layer's table,
                                          same positions: asserted); NULL = each
                                          call computes them. Same bits either way. */
};

static inline float op_attn_tau_default(int head_dim) { return 1.0f / sqrtf((float)head_dim); }

/* Attention for S queries over the packed caches.
 *
 * o        (S, heads, head_dim): output, after inverse RoPE at -pos[i].
 * n_used   (S) or NULL: the number of entries (logits per head) query i
 *          used, |G_p| + |S_p| <= topk + window (SPEC 8.4.20). A deliberate
 *          test and trace hook; the op never needs it.
 * q        (S, heads, head_dim): main Q, already RoPE'd at pos[i].
 * pos      (S): absolute query positions (>= 0).
 * topk_idx (S, topk) int32 or NULL: indices into kv's entries; -1 (any
 *          negative) or >= kv->n_entries means "none".
 * kv       the layer's global source, or NULL when topk_idx is NULL.
 *          kv->main_w must equal head_dim.
 * swa      the layer's SWA ring, or NULL (no local entries). swa->w must
 *          equal head_dim; a position < 0 marks an empty slot.
 *
 * A query with no entries gives o = 0 (R.2: "all indices invalid outputs
 * 0"). With a sink the formula agrees: its numerator is empty, so o = 0/Z.
 * A NaN entry (a poisoned block, docs/formats.md 3) makes the output NaN. */
void op_sparse_attn(float *o /* (S, heads, head_dim) */, int32_t *n_used /* (S) or NULL */,
                    const float *q /* (S, heads, head_dim) */, const int64_t *pos /* (S) */,
                    const int32_t *topk_idx /* (S, topk) or NULL */, const struct op_kv_view *kv,
                    const struct op_swa_view *swa, int S, const struct op_attn_params *pr);

/* The same attention over plain float entries: quantization disabled (SPEC
 * 8.4.21), for tests and for any caller that holds fp32 entries.
 * gkv (n_global, head_dim): global entry j is row j; skv (slots, head_dim)
 * with spos (slots) the position each slot holds (< 0 = empty). */
void op_sparse_attn_f32(float *o /* (S, heads, head_dim) */, int32_t *n_used /* (S) or NULL */,
                        const float *q /* (S, heads, head_dim) */, const int64_t *pos /* (S) */,
                        const int32_t *topk_idx /* (S, topk) or NULL */, const float *gkv /* (n_global, head_dim) */,
                        int64_t n_global, const float *skv /* (slots, head_dim) */, const int64_t *spos /* (slots) */,
                        int slots, int S, const struct op_attn_params *pr);

/* Grouped output projection (SPEC 3.12, R.2): o (S, heads*head_dim) is
 * viewed as G groups of gw = (heads/G)*head_dim channels;
 *   z[:, g] = o[:, group g] W_oa[g]^T   (W_oa[g]: (o_rank, gw)),
 *   a       = z W_ob^T                  (W_ob: (hidden, G*o_rank)),
 * both through op_linear. z is returned too (an intermediate the caller
 * owns). heads must be a multiple of G. Defaults [R-cfg]: G = 8,
 * o_rank = 1024, hidden = 5120. */
void op_grouped_oproj(float *a /* (S, hidden) */, float *z /* (S, G*o_rank) */,
                      const float *o /* (S, heads*head_dim) */, const float *w_oa /* (G, o_rank, gw) */,
                      const float *w_ob /* (hidden, G*o_rank) */, int S, int heads, int head_dim, int G, int o_rank,
                      int hidden);
/* The same over weights in their stored formats: w_oa (G * o_rank, gw) as
 * one matrix (its group g the rows g * o_rank ..: an FP8 one needs o_rank a
 * multiple of 32, whole tile rows), w_ob (hidden, G * o_rank); bitwise the
 * float op over the dequantized matrices (ops/qlinear.h). */
void op_grouped_oproj_q(float *a /* (S, hidden) */, float *z /* (S, G*o_rank) */,
                        const float *o /* (S, heads*head_dim) */, const struct op_qweight *w_oa,
                        const struct op_qweight *w_ob, int S, int heads, int head_dim, int G);

/* The sparse_attn descriptor's checked call (inputs, views over them,
 * parameters, outputs o and n_used allocated), shared by its CPU run and the
 * CUDA twin (kernels/attention.cu): 0 or the status after op_io_fail. The
 * global view is one page (page) of the entries tensor; pr.rope points at
 * rope (or is NULL). */
struct op_desc;
struct op_io;
struct op_attn_call {
  const float *q;
  const int64_t *pos;
  const int32_t *topk; /* NULL: SWA-only */
  const uint8_t *page; /* the entries tensor: the global view's only page */
  struct op_kv_view kv;
  struct op_swa_view swa;
  bool has_swa;
  struct op_rope rope;
  struct op_attn_params pr;
  int S;
  float *o;        /* (S, heads, head_dim) */
  int32_t *n_used; /* (S) */
};
int op_sparse_attn_prepare(const struct op_desc *self, struct op_io *io, struct op_attn_call *c);
/* The oproj descriptor's checked call (outputs a and z allocated), shared by
 * its CPU run and the CUDA twin. */
struct op_oproj_call {
  const float *o, *w_oa, *w_ob;
  float *a, *z;
  int S, heads, head_dim, G, o_rank, hidden;
};
int op_oproj_prepare(const struct op_desc *self, struct op_io *io, struct op_oproj_call *c);

#ifdef __cplusplus
}
#endif

#endif
