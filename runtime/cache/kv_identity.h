/* kv_identity.h: the identity of the KV bytes a plan and its weights make,
 * the key under which the prefix cache (in memory and on disk) keeps its
 * blocks (issue 28 row 2). Two runs share a cached block only when both
 * would compute the same bytes for it: the same weights (weights_identity)
 * and the same values of every plan key that changes a block's bytes:
 *   - every model.* key (widths, attention, RoPE, indexer, SWA window,
 *     candidates, MoE, mHC, Engram, DSpark, vision, numerics) and every
 *     formats.* key (element, scale, block, rule, floor, rounding, nibble
 *     order), walked from the plan loader's own tables (plan_each_value), so
 *     a key added there is covered without editing this file;
 *   - serving.ced, serving.replay.encoder/decoder, serving.prefill_chunk,
 *     serving.cache.prefix_block_tokens and serving.cache.page_tokens;
 *   - the resolved layer table: each layer's region, mode, ratio, KV, top-k
 *     and pool sources, candidates and Engram, and the kind of device (CPU
 *     or CUDA) that computes its KV in each flow (CUDA's kernels sum in
 *     another order, so the two kinds do not make the same bytes).
 * Not in it, because they do not change a block's bytes: the plan's name
 * and description, batching, cache sizes and TTLs, placement's ranks,
 * device numbers, stage bounds and experts, and the Engram tier. A miss costs a recompute;
 * a wrong hit would be silently wrong KV state.
 * Tested by tests/test_kv_identity.c and tests/cli/disk_tier_plans.sh.
 */
#ifndef CEDAR_RUNTIME_KV_IDENTITY_H
#define CEDAR_RUNTIME_KV_IDENTITY_H

#include <stdbool.h>
#include <stdint.h>

#include "scheduler/plan.h"

uint64_t pc_kv_identity(const struct plan *p, uint64_t weights_id);

/* Whether the plan key (dotted, as plan_each_value names it) is in the
 * identity. */
bool pc_kv_identity_covers(const char *key);

#endif
