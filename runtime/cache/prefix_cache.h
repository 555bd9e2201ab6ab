/* prefix_cache.h: the global prefix cache and the encoder-SWA snapshot pool
 * (SPEC 5.2-5.4, 6.5; issue 6).
 *
 * Global prefix cache. A prompt is cut into blocks of B =
 * serving.cache.prefix_block_tokens tokens (even, a whole number of pages).
 * Block k's key is XXH3_64 of its B token ids seeded with block k-1's key;
 * block 0 is seeded with the fingerprint of plan and weights, so a cache
 * built for other weights or another plan never matches. One cache unit =
 * the pages of every KV source that hold the block's positions (Main KV and
 * Indexer K together, all sources at once): inserted and evicted together.
 * The cache holds a reference on each page; a request that hits attaches
 * the same pages read-only (another reference) and appends its new entries
 * to fresh pages (a cached page is always full, so the next append opens a
 * new one). Eviction is LRU over unpinned leaves (a block whose successor is
 * cached is not a leaf); a block a running request attached is pinned until
 * the request releases it. Capacity is serving.cache.host_cache_bytes of
 * pages (0: no limit).
 *
 * Encoder-SWA pool. A snapshot at an exact sequence boundary c (the end of a
 * request or turn) holds what the encoder needs to continue at c without a
 * replay: every encoder layer's ring (slots, positions, r0), every ratio > 1
 * source's tail, the global entries of [floor(c/B) B, c) that no full block
 * holds, and the encoder outputs X^E of the last min(c, replay.decoder)
 * positions, which the decoder's bounded replay of the next prompt reads for
 * its positions below c (SPEC 6.5: the global KV cannot be inverted to get
 * them; keeping them costs hc x hidden x 4 bytes per position and is
 * counted). Keyed by the chained hash of the whole prefix [0, c). TTL and
 * capacity from the plan (serving.cache.swa_pool_ttl_s, swa_pool_fraction
 * of the host's memory). Decoder SWA is never cached.
 *
 * With a disk tier (disk_tier.h) every inserted block is also written to a
 * file, and a lookup that misses in memory continues on disk, block by
 * block, while loading is expected to beat recomputing.
 *
 * Not here: running the hit paths (runtime/gen/generate.c).
 * Test: tests/test_prefix_cache_*.c.
 */
#ifndef CEDAR_RUNTIME_PREFIX_CACHE_H
#define CEDAR_RUNTIME_PREFIX_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/cache/disk_tier.h"
#include "runtime/model/state.h"

struct pc_block {
  uint64_t key, parent;     /* parent: the previous block's key (the seed for block 0) */
  int64_t index;            /* block k covers positions [k B, (k + 1) B) */
  int32_t *pages;           /* (n_sources, pages_per_block) page ids, source-major */
  int children;             /* cached blocks whose parent this is */
  int pins;                 /* running requests that attached it */
  uint64_t last_use;        /* LRU clock */
  bool used;                /* slot in use (open addressing) */
  bool tomb;                /* deleted slot */
};

struct pc_snapshot {
  int pins;                 /* hits using it now: never evicted, expired or replaced while pinned */
  uint64_t key;             /* chained hash of [0, c) (not block-aligned in general) */
  int64_t c;                /* boundary */
  double created;           /* seconds (CLOCK_MONOTONIC) */
  int64_t bytes;
  /* encoder rings, by layer (NULL for decoder layers) */
  uint8_t *ring_slot[PLAN_MAX_LAYERS];
  int64_t *ring_pos[PLAN_MAX_LAYERS];
  int64_t ring_r0[PLAN_MAX_LAYERS];
  /* ratio > 1 sources' tails (count and pos0; the rows are tail_rows, v and g are NULL) */
  struct op_comp_tail tail[PLAN_MAX_LAYERS];
  float *tail_rows[PLAN_MAX_LAYERS];
  /* every source's entries of [floor(c / B) B, c): count and bytes */
  int n_part[PLAN_MAX_LAYERS];
  uint8_t *part[PLAN_MAX_LAYERS];
  /* encoder outputs of [c - xe_rows, c), (xe_rows, rt_xe_row_floats): X^E and its carried pre */
  float *xe;
  int64_t xe_rows;
};

struct pc_stats {
  int64_t lookups, hit_blocks, miss_blocks, inserted, evicted;
  int64_t disk_blocks;        /* of hit_blocks, loaded from the disk tier */
  int64_t disk_skipped;       /* on disk but recomputing was expected to be faster */
  int64_t snap_saved, snap_hits, snap_misses, snap_evicted;
};

struct pc_cache {
  const struct plan *p;
  struct rt_kv_pool *pools;   /* (PLAN_MAX_LAYERS) */
  uint64_t seed;              /* fingerprint of plan and weights */
  int block;                  /* B, tokens */
  int pages_per_block[PLAN_MAX_LAYERS]; /* per source; 0 for non-sources */
  int sources[PLAN_MAX_LAYERS], n_sources;
  int64_t block_bytes;        /* pages of one block, all sources */
  int64_t capacity_bytes;     /* 0: unbounded */
  int64_t bytes;              /* held now */
  struct pc_block *tab;       /* open addressing by key */
  int64_t cap, count, tombs;
  uint64_t clock;
  /* SWA pool */
  struct pc_snapshot **snap;  /* (n_snap) stable addresses: hits hold pointers */
  int n_snap, cap_snap;
  int64_t snap_capacity_bytes, snap_bytes;  /* capacity 0: the pool keeps nothing */
  double snap_ttl_s;
  struct dt_tier *disk;       /* the persistent tier, or NULL: blocks are written through on insert and
                                 looked up after the memory tier misses */
  struct pc_stats stats;
};

/* A lookup's result: the blocks of the longest cached prefix, pinned. */
struct pc_hit {
  int64_t n_blocks;           /* hit = n_blocks * B tokens */
  uint64_t *keys;             /* (n_blocks) */
  struct pc_snapshot *snap;   /* pinned: a snapshot at a boundary c with floor(c / B) == n_blocks, or NULL */
};

/* Returns 0, or CEDAR_EINVAL (block size not a whole number of pages of
 * every source, or odd; a capacity below one block) with a message.
 * capacity_bytes 0: no limit. snap_capacity_bytes < 0: the plan's
 * swa_pool_fraction of this host's memory (a fraction of 0 keeps nothing). */
int pc_init(struct pc_cache *c, const struct plan *p, struct rt_kv_pool *pools, uint64_t seed,
            int64_t capacity_bytes, int64_t snap_capacity_bytes, char *err, size_t err_len);
void pc_free(struct pc_cache *c);

/* Block keys of tokens[0, n): keys[k] for every full block; returns the
 * number of full blocks. */
int64_t pc_keys(const struct pc_cache *c, const int32_t *tok, int64_t n, uint64_t *keys);
/* The chained hash of a whole prefix [0, n) (full blocks, then the rest). */
uint64_t pc_prefix_key(const struct pc_cache *c, const int32_t *tok, int64_t n);

/* Longest cached prefix of tok[0, n), at most max_tokens tokens: pins its
 * blocks, and the snapshot at the largest boundary c <= max_tokens whose
 * prefix key matches and whose full blocks are exactly the hit's
 * (floor(c / B) == n_blocks: the snapshot continues where the blocks end;
 * an older boundary would recompute cached blocks, so path (b) is used
 * instead). The caller releases both with pc_release. */
void pc_lookup(struct pc_cache *c, const int32_t *tok, int64_t n, int64_t max_tokens, struct pc_hit *hit);
/* Give the hit's pages to a fresh request (read-only, refcounted): its
 * sequences then hold entries [0, hit) of every source. */
int pc_attach(struct pc_cache *c, const struct pc_hit *hit, struct rt_request *r);
void pc_release(struct pc_cache *c, struct pc_hit *hit);

/* Insert the full blocks of request r's first n positions (tokens and
 * entries) that are not cached yet; evicts LRU unpinned leaves to stay
 * within capacity. Returns the number of blocks inserted. */
int64_t pc_insert(struct pc_cache *c, const struct rt_request *r, int64_t n);

/* Save r's encoder state at its boundary c = r->n_pos (rings, tails, the
 * entries after the last full block, and xe (xe_rows, rt_xe_row_floats): the
 * encoder outputs of [c - xe_rows, c)). Returns 0 or CEDAR_ENOMEM. */
int pc_snapshot_save(struct pc_cache *c, const struct rt_request *r, const float *xe, int64_t xe_rows);
/* Restore a snapshot into r, whose sequences hold [0, floor(c / B) B)
 * (pc_attach): rings, tails, the partial block's entries. */
int pc_snapshot_restore(const struct pc_cache *c, const struct pc_snapshot *s, struct rt_request *r);
/* Drop snapshots older than the TTL; returns how many. */
int pc_snapshot_expire(struct pc_cache *c, double now);

#endif
