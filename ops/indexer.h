/* indexer.h: the lightning indexer, Top-K, the hierarchical candidate pool and
 * reindex (SPEC 3.9-3.11, 4.3, 4.6, R.4, R.5).
 *
 * What it is: the CPU reference that decides which global entries a query
 * attends to. For a query at absolute position p with indexer heads
 * q (heads, idx_w) and head weights w (heads):
 *
 *   I_{p,s} = sum_h w_h * ReLU(q_h . kI_s)        over the visible entries s
 *   T_p     = argtop_{min(k, n_vis)} I_{p,.}       (the Top-K bus, SPEC 2.4)
 *
 * Entry s of a ratio-r source covers tokens [r*s, r*s + r) and is visible iff
 * r*s + r - 1 <= p and s < n_entries, so the visible entries are exactly
 * [0, n_vis) with n_vis = min(n_entries, floor((p + 1) / r)) (SPEC 3.9, R.4).
 * Keys are the MXFP4 Indexer-K part of each cached entry, read through
 * struct op_kv_view and dequantized with op_mxfp4_unpack (docs/formats.md).
 *
 * Ranking rule, shared by every selection here [R, SPEC 3.10; cedar where
 * SPEC is silent]: a higher score ranks first; equal scores rank the lower
 * index first (-0 equals +0); a NaN score ranks above every number, as in
 * torch.topk, so a poisoned key (docs/formats.md 3) is selected and shows up
 * downstream instead of vanishing. Outputs hold min(k, n) indices in
 * ASCENDING order, then -1 padding up to k [cedar: a deterministic order;
 * SPEC says order is irrelevant to the attention math].
 *
 * Candidate pool (decoder, the pool-building layer, SPEC 3.11, R.5): block b
 * = entries [B*b, B*b + B); its score is the best score among its visible
 * entries (a partial last block counts, as if padded with -inf); Sel = the top
 * min(top_blocks, #visible blocks) blocks under the same ranking rule; the
 * pool output is the block ids (the bus content), and C_p = the visible
 * entries of those blocks (op_pool_expand). Reindex layers gather the keys of
 * C_p first and score only them (work ~ pool, not context).
 *
 * Reduction order [cedar]: every score is computed by one function with a
 * fixed order, whatever path calls it, so single-query, batched and reindex
 * scores are bitwise equal and chunking a prefill never changes a Top-K:
 *   d_h = 0; d_h += q_h[i] * k[i] for i = 0, 1, ..., idx_w - 1 (in order);
 *   I   = 0; I   += w_h * ReLU(d_h)  for h = 0, 1, ..., heads - 1 (in order).
 * The speed comes from scoring a tile of 64 keys at once with the lanes over
 * KEYS (indexer.c), never from reordering a sum. No BLAS here for that reason
 * (written when op_linear was OpenBLAS, which is not row-independent; the
 * order above is the indexer's own either way).
 *
 * Parameters the plan passes [R]: k (index_topk, default 512), pool block
 * B (candidate_block_size, default 8), top_blocks (candidate_topk_blocks,
 * default 2048), heads (index_n_heads, default 32); the key width is
 * kv->idx_w (index_head_dim, default 128). Any positive sizes work.
 *
 * What it is not: the query projection, RoPE or the head-weight scale (the
 * caller passes q and w ready: SPEC R.4's w scale is folded in upstream), and
 * not attention. Nothing here knows layers or plans.
 *
 * Test: ctest --test-dir build -R ops_indexer --output-on-failure
 */
#ifndef CEDAR_OPS_INDEXER_H
#define CEDAR_OPS_INDEXER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/kvview.h"

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

/* ---- single query: the spec in its plainest form ------------------------ */

/* Number of entries of kv visible to a query at position pos >= 0:
 * min(kv->n_entries, floor((pos + 1) / kv->ratio)). */
int64_t op_indexer_visible(const struct op_kv_view *kv, int64_t pos);

/* scores[s] = I_{pos,s} for s in [0, n_vis), n_vis = op_indexer_visible(kv,
 * pos); writes exactly n_vis floats. Each key is dequantized once and scored
 * against every head. Allocates one tile of keys (64 x kv->idx_w floats) per
 * call. */
void op_indexer_score(float *scores /* (n_vis) */, const float *q /* (heads, kv->idx_w) */,
                      const float *w /* (heads) */, const struct op_kv_view *kv, int64_t pos, int heads);

/* Top-k of scores[0, n) under the ranking rule above: writes the min(k, n)
 * best indices in ascending order, then -1 up to k; returns min(k, n).
 * A bounded heap of size k kept in out itself: O(n log k), then a radix
 * sort of the kept indices (scratch on the stack up to k = 2048, allocated
 * above); no sort of n. Needs k >= 1 and n <= INT32_MAX. */
int op_topk_select(int32_t *out /* (k) */, const float *scores /* (n) */, int64_t n, int k);

/* The candidate pool from one query's scores over its n_vis visible entries:
 * block_scores[b] = best of scores[B*b, min(B*b + B, n_vis)) (scratch, also
 * readable afterwards); with pin_newest the newest visible block's score is
 * +inf, so it is always kept (the vendor's V4.1, Appendix V #12: an older
 * full block cannot outscore the partial newest one); then blocks =
 * op_topk_select(block_scores, top_blocks). Returns the number of selected
 * blocks, min(top_blocks, ceil(n_vis / B)). */
int op_pool_select(int32_t *blocks /* (top_blocks) */, float *block_scores /* (ceil(n_vis / block)) */,
                   const float *scores /* (n_vis) */, int64_t n_vis, int block, int top_blocks, bool pin_newest);

/* C_p: the entries of the given blocks that are visible (< n_vis), block by
 * block in the order given (ascending blocks give ascending entries); -1
 * block ids are skipped. Returns the count, at most top_blocks * block. */
int64_t op_pool_expand(int32_t *entries /* (top_blocks * block) */, const int32_t *blocks /* (top_blocks) */,
                       int top_blocks, int block, int64_t n_vis);

/* ---- a chunk of S queries, each with its own position, Top-K and pool ---- */

/* Workspace of op_indexer_topk, in bytes (float-aligned; 0 when S == 0):
 * a tile of dequantized keys, the scores of up to 8 queries over the widest
 * visible range of the chunk, and the block scores. pool_block is the pool's
 * block size, or 0 when no pool is built. */
size_t op_indexer_topk_work_bytes(const struct op_kv_view *kv, const int64_t *pos /* (S) */, int S, int pool_block);

/* Full scan for a Full layer (SPEC 2.3): for every query i at position
 * pos[i], topk[i] = op_topk_select of its scores, and, when pool is not NULL
 * (the pool-building layer, SPEC 3.11), pool[i] = op_pool_select of the same
 * scores (with pin_newest). Queries are scored in tiles of 8 against tiles of 64 entries, so
 * each key is dequantized once per query tile; the scores are bitwise those
 * of op_indexer_score. pool_block and pool_top are ignored when pool is NULL. */
void op_indexer_topk(int32_t *topk /* (S, k) */, int32_t *pool /* (S, pool_top) or NULL */,
                     void *work /* (op_indexer_topk_work_bytes) */, const float *q /* (S, heads, kv->idx_w) */,
                     const float *w /* (S, heads) */, const int64_t *pos /* (S) */, const struct op_kv_view *kv,
                     int S, int heads, int k, int pool_block, int pool_top, bool pin_newest);

/* Workspace of op_indexer_reindex, in bytes (float-aligned). */
size_t op_indexer_reindex_work_bytes(const struct op_kv_view *kv, int pool_block, int pool_top);

/* Reindex (SPEC 3.11): for every query i, gather the keys of C_p (the visible
 * entries of the blocks pool[i], in any order, -1 padded, no duplicates),
 * score only those with this layer's q and w, and select the top
 * min(k, |C_p|) entry ids under the ranking rule (ties: lower ENTRY id).
 * Equal to scoring everything and masking the rest to -inf (SPEC 8.3.17). */
void op_indexer_reindex(int32_t *topk /* (S, k) */, void *work /* (op_indexer_reindex_work_bytes) */,
                        const int32_t *pool /* (S, pool_top) */, const float *q /* (S, heads, kv->idx_w) */,
                        const float *w /* (S, heads) */, const int64_t *pos /* (S) */,
                        const struct op_kv_view *kv, int S, int heads, int k, int pool_block, int pool_top);

/* ---- internal, for tests ------------------------------------------------- */

/* The dequantizer the scans use, one key into one lane of a transposed tile:
 * tile[i * lanes + lane] = x_i for i in [0, W), bitwise what op_mxfp4_unpack
 * writes to x (E2M1 by a 16-entry table, E8M0 from its exponent bits). */
void op__indexer_unpack_lane(float *tile /* (W, lanes) */, int lanes, int lane,
                             const uint8_t *in /* (op_mxfp4_bytes(W, block)) */, int W, int block,
                             enum op_nibble_order order);

/* The indexer_topk descriptor's checked call (outputs topk and, with
 * build_pool, pool allocated; pool NULL otherwise), shared by its CPU run and
 * the CUDA twin (kernels/indexer.cu): 0 or the status after op_io_fail. The
 * view is one page (page) of the keys tensor. */
struct op_desc;
struct op_io;
struct op_indexer_topk_call {
  const float *q, *w;
  const int64_t *pos;
  const uint8_t *page;
  struct op_kv_view kv;
  int S, heads, k, pool_block, pool_top;
  bool pin_newest;
  int32_t *topk, *pool;
};
int op_indexer_topk_prepare(const struct op_desc *self, struct op_io *io, struct op_indexer_topk_call *c);
/* The reindex descriptor's checked call (the pool checked: no block twice in
 * a row; output topk allocated), shared by its CPU run and the CUDA twin. */
struct op_reindex_call {
  const float *q, *w;
  const int64_t *pos;
  const uint8_t *page;
  struct op_kv_view kv;
  int S, heads, k, pool_block, pool_top;
  const int32_t *pool; /* (S, pool_top) */
  int32_t *topk;
};
int op_reindex_prepare(const struct op_desc *self, struct op_io *io, struct op_reindex_call *c);

#ifdef __cplusplus
}
#endif

#endif
