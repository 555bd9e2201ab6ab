/* indexer.cuh: the CUDA twin of ops/indexer.h's full scan (op_indexer_topk:
 * lightning-indexer scores, Top-K and, on the pool-building layer, the
 * candidate pool), argument for argument with device pointers (kv->pages a
 * device array of device page pointers) and a stream, and the slot of
 * indexer_topk.
 *
 *   scores  one thread per (query, visible entry): the MXFP4 key dequantized
 *           value by value (exact, kern_kv_value), d_h summed over channels in
 *           order and I over heads in order, one rounding per multiply and
 *           add, ReLU as the CPU's (d < 0 ? 0 : d, NaN kept): the CPU's
 *           scores bit for bit (its fixed order, ops/indexer.h), so the same
 *           Top-K ids.
 *   top-k   one CTA of 256 per query: k rounds, each the block's best entry
 *           ranked strictly after the previous pick under the ranking rule
 *           (score descending, NaN first, -0 == +0, ties to the lower index)
 *           as one 64-bit key; then the picks sorted ascending, -1 padded.
 *   pool    block scores (the best visible score of each block, the newest
 *           pinned to +inf) then the same top-k over the blocks.
 * Scratch (device): kern_indexer_topk_scratch_bytes. Cost: O(k n / 256) per
 * query for the selection, written for the bits, not yet for speed.
 * reindex: the candidates (the visible entries of the query's pool blocks)
 * as a mask over the full scan's scores (the same scores the CPU computes
 * for its gathered keys), then the same top-k: the CPU's ids. It scores
 * every visible entry rather than gathering the pool's first: the CPU's
 * work ~ pool saving is not taken yet.
 */
#ifndef CEDAR_KERN_INDEXER_CUH
#define CEDAR_KERN_INDEXER_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/backend.h"
#include "ops/indexer.h"

size_t kern_indexer_topk_scratch_bytes(const struct op_kv_view *kv, int S, int pool_block);
cudaError_t kern_indexer_topk(int32_t *topk, int32_t *pool, const float *q, const float *w, const int64_t *pos,
                              const struct op_kv_view *kv, int S, int heads, int k, int pool_block, int top_blocks,
                              bool pin_newest, void *scratch, cudaStream_t st);

/* Reindex (op_indexer_reindex): pool (S, pool_top) device block ids; scratch
 * S * n_entries * (4 + 1) bytes (scores and candidate masks). */
cudaError_t kern_indexer_reindex(int32_t *topk, const int32_t *pool, const float *q, const float *w,
                                 const int64_t *pos, const struct op_kv_view *kv, int S, int heads, int k,
                                 int pool_block, int pool_top, void *scratch, cudaStream_t st);

extern "C" {
int kern_indexer_topk_run(const struct op_desc *self, struct op_io *io);
int kern_reindex_run(const struct op_desc *self, struct op_io *io);
}

#endif
