/* model_topk.c: the Top-K an attention node attends with (docs/model.md s3:
 * full, reindex, reuse), for rt_attn and rt_attn_rows (model.c): the
 * indexer query (with indexer.q_mxfp4's round trip), the head weights, and
 * the scoring of the keys model.indexer.key_slot names (s3.2: the vendor's
 * shared slot, or each layer's own source). Moved out of model.c (its
 * 800-line bound) when the key slot came in.
 * Test: ctest -R 'model_|graph|oracle' (the oracle holds both readings). */
#include <string.h>

#include "base/check.h"
#include "ops/formats.h"
#include "ops/indexer.h"
#include "ops/qkv.h"
#include "runtime/model/arena.h"
#include "runtime/model/model.h"
#include "runtime/model/round_trace.h"

/* indexer.q_mxfp4 (docs/model.md s3, Appendix V #11): each indexer query
 * head through the Indexer-K format (E2M1, an E8M0 scale per block) and
 * back, as the vendor quantizes qI before scoring; the keys already are
 * (they are read from the MXFP4 cache). Like the keys, after a bf16 round
 * when the format says bf16_round (#11: vLLM quantizes q "after a bf16
 * round"; the oracle's flip accounting found it missing). */
static void q_mxfp4_roundtrip(const struct rt_model *M, float *qI, int rows, struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  int w = m->idx_head_dim, blk = m->indexer_k.block;
  enum op_mx_rule rule = m->indexer_k.rule == PLAN_RULE_OCP ? OP_MX_OCP : OP_MX_CEIL;
  uint8_t *buf = RT_ALLOC(ar, uint8_t, op_mxfp4_bytes(w, blk));
  if (m->indexer_k.bf16_round) op_bf16_round_n(qI, (size_t)rows * w);
  for (int i = 0; i < rows; i++) {
    op_mxfp4_pack(buf, qI + (size_t)i * w, w, blk, rule, OP_NIBBLE_EVEN_LOW);
    op_mxfp4_unpack(qI + (size_t)i * w, buf, w, blk, OP_NIBBLE_EVEN_LOW);
  }
}

/* The keys rows of class c score (graph_node.key_src; docs/model.md s3.2):
 * the slot's source's Indexer-K seen as the reader's own (its ratio, its
 * count: floor((p + 1) / r) rows for a query at p), or kv itself. */
static struct op_kv_view key_view(const struct op_kv_view *kv, const struct rt_bound *st, int c) {
  if (!st->key_r[c]) return *kv;
  struct op_kv_view v = rt_kv_view(st->key_r[c]);
  CEDAR_ASSERT_MSG(v.n_entries >= st->key_r_end[c], "key slot: %lld entries committed, the graph declared %lld",
                   (long long)v.n_entries, (long long)st->key_r_end[c]);
  if (st->key_r_pages[c]) v.pages = st->key_r_pages[c];
  v.n_entries = kv->n_entries < st->key_r_end[c] ? kv->n_entries : st->key_r_end[c];
  v.ratio = kv->ratio;
  return v;
}

/* Rows [i0, i0 + n) of a tile score keys kv: reindex over the pool it
 * reads, else the full scan (with the pool when this layer builds it). */
static void score_rows(const struct rt_model *M, const struct graph_node *nd, const struct rt_buses *b,
                       const float *qI, const float *w, const int64_t *pos, const struct op_kv_view *kv, int i0, int n,
                       struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  const int H = m->idx_heads, qw = H * m->idx_head_dim, K = m->topk, TB = m->cand_top_blocks;
  qI += (size_t)i0 * qw, w += (size_t)i0 * H, pos += i0;
  if (M->L[nd->layer].pl->mode == PLAN_REINDEX && b->pool_in) {
    void *work = rt_arena_alloc(ar, op_indexer_reindex_work_bytes(kv, m->cand_block, TB));
    RT_TIMED(ar, INDEXER, op_indexer_reindex(b->topk_out + (size_t)i0 * K, work, b->pool_in + (size_t)i0 * TB, qI, w,
                                             pos, kv, n, H, K, m->cand_block, TB));
    return;
  }
  bool pool = (nd->flags & GRAPH_F_BUILD_POOL) != 0;
  void *work = rt_arena_alloc(ar, op_indexer_topk_work_bytes(kv, pos, n, pool ? m->cand_block : 0));
  RT_TIMED(ar, INDEXER, op_indexer_topk(b->topk_out + (size_t)i0 * K, pool ? b->pool_out + (size_t)i0 * TB : NULL,
                                        work, qI, w, pos, kv, n, H, K, m->cand_block, TB, m->cand_pin_newest));
}

/* The Top-K this layer attends with (s3: full, reindex, reuse). */
const int32_t *rt__select_topk(const struct rt_model *M, const struct graph_node *nd,
                                  const float *a_in, const float *cq, const int64_t *pos,
                                  const struct op_rope_angles *ang, const struct op_kv_view *kv,
                                  const struct rt_bound *st, const struct rt_buses *b, struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  const struct rt_layer *L = &M->L[nd->layer];
  int n = nd->n;
  if (L->pl->mode == PLAN_REUSE) return b->topk_in;
  float *qI = RT_ALLOC(ar, float, (size_t)n * m->idx_heads * m->idx_head_dim);
  float *w = RT_ALLOC(ar, float, (size_t)n * m->idx_heads);
  struct op_rope_angles own;
  if (!op_rope_same_angles(&M->rope_idx, ang->rope)) { /* other frequencies: a table of its own */
    float *buf = RT_ALLOC(ar, float, op_rope_angles_floats(&M->rope_idx, n) + 1);
    RT_TIMED(ar, INDEXER, op_rope_angles_init(&own, buf, &M->rope_idx, pos, n));
    ang = &own;
  }
  RT_TIMED(ar, INDEXER, op_q_indexer_q(qI, cq, &L->iq_b, ang, &M->rope_idx, n, m->idx_heads, m->idx_head_dim));
  if (m->idx_q_mxfp4) RT_TIMED(ar, INDEXER, q_mxfp4_roundtrip(M, qI, n * m->idx_heads, ar));
  if (m->idx_q_mxfp4) rt_rtrace_f32("idx.qI", nd->layer, pos[0], n, m->idx_heads * m->idx_head_dim,
                                    m->idx_heads * m->idx_head_dim, qI);
  RT_TIMED(ar, INDEXER, op_index_weights(w, a_in, L->iw, n, m->hidden, m->idx_heads, M->idx_scale));
  /* One key tensor for every row, or (a verify tile under key_slot: vendor)
   * each row its parity's: a row's scores never depend on the rows beside it. */
  struct op_kv_view kc[2] = {key_view(kv, st, 0), key_view(kv, st, 1)};
  if (st->key_r[0] == st->key_r[1])
    score_rows(M, nd, b, qI, w, pos, &kc[0], 0, n, ar);
  else
    for (int i = 0; i < n; i++) score_rows(M, nd, b, qI, w, pos, &kc[(pos[i] + 1) % 2 == 0], i, 1, ar);
  if (nd->flags & GRAPH_F_BUILD_POOL) rt_rtrace_i32("idx.pool", nd->layer, pos[0], n, m->cand_top_blocks, b->pool_out);
  rt_rtrace_i32("idx.topk", nd->layer, pos[0], n, m->topk, b->topk_out);
  return b->topk_out;
}
