/* state.h: the state a request owns or shares while it runs (SPEC s5,
 * docs/model.md s3, s6), and its memory accounting.
 *
 *   global KV   one page pool per KV source of the plan (struct rt_kv_pool),
 *               shared by every request; a request holds a page table per
 *               source (struct rt_kv_seq). An entry is the plan's Main-KV
 *               part then its Indexer-K part (docs/formats.md; 288 + 68 =
 *               356 bytes in the flash formats). Pages hold
 *               serving.page_tokens / ratio entries and are refcounted so a
 *               prefix cache (prefix_cache.h) shares them read-only.
 *   SWA         one ring of `window` FP8 entries per (request, layer); the
 *               slot of position p is p mod window and each slot remembers
 *               its absolute position (-1 = empty), so attention never
 *               confuses a slot with a position. `r0` is the replay start:
 *               positions below it are never visible (SPEC 3.9).
 *   tails       per (request, ratio > 1 source): the unfinished compressor
 *               group (ops/compressor.h), fp32 projected rows.
 *   encoder outputs  (CED) X^E of the last replay.decoder positions, kept
 *               for the decoder replay of a prompt that continues this one.
 *   tokens      every id the request has consumed (Engram reads the last
 *               max_order - 1 of them; prefix caching will key on them), and
 *               the sampled-but-unconsumed token.
 *
 * Accounting (rt_request_bytes): "entries" bytes count committed entries
 * times the entry size, which is exactly what `cedar plan cost` reports for
 * the same plan and length; "pages" bytes count whole allocated pages (what
 * the process holds). SWA and tails are allocated whole at request start and
 * match plan cost's per-request figures.
 *
 * Thread safety: page allocation takes the pool's mutex; a sequence's page
 * table is reserved for the request's whole length up front
 * (rt_request_init's max_tokens), so appending never moves the table that
 * concurrent readers of earlier entries hold. A sequence's n_entries is
 * published after the entry bytes are written.
 *
 * Not here: the forward (runtime/model/model.h), graphs (scheduler/graph.h),
 * the prefix cache (runtime/cache/prefix_cache.h).
 * Test: tests/test_state.c (ctest -R state).
 */
#ifndef CEDAR_RUNTIME_STATE_H
#define CEDAR_RUNTIME_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/compressor.h"
#include "ops/kvview.h"
#include "scheduler/plan.h"

/* The page pool of one KV source, shared by requests. */
struct rt_kv_pool {
  int layer, ratio;
  int page_entries;            /* serving.page_tokens / ratio (>= 1) */
  size_t entry_bytes;          /* main_bytes + idx_bytes */
  size_t main_bytes, idx_bytes;/* the two parts, main first */
  int main_w, idx_w;
  struct op_kv_format main_fmt, idx_fmt; /* plan formats.main_kv / indexer_k */
  uint8_t **page;              /* (cap) page memory, NULL when free */
  int32_t *ref;                /* (cap) refcounts; 0 = free */
  int n_pages, cap;            /* pages ever allocated (slots used), capacity */
  int32_t *free_ids;           /* (cap) stack of free slot ids */
  int n_free;
  int64_t pages_in_use;
  int64_t max_pages;           /* 0 = bounded by memory only; else allocation fails at this many in use */
  pthread_mutex_t mu;
  /* An executor's data handles over these pages, released by
   * rt_kv_pools_free through exec_release. NULL when none (StarPU's are per
   * request: one page list per source, exec_starpu_pages.c). */
  void *exec_data;
  void (*exec_release)(void *exec_data);
};

/* One request's entries of one KV source. */
struct rt_kv_seq {
  struct rt_kv_pool *pool;
  int32_t *page_id;            /* (cap_pages) */
  const uint8_t **page_ptr;    /* (cap_pages): what struct op_kv_view reads */
  int n_pages, cap_pages;
  int64_t n_entries;           /* committed entries */
};

/* One (request, layer) SWA ring. */
struct rt_ring {
  uint8_t *slot;               /* (window, entry_bytes) */
  int64_t *pos;                /* (window): absolute position, -1 = empty */
  int window;
  size_t entry_bytes;
  int64_t r0;                  /* replay start */
};

/* Speculative decoding (runtime/engine/speculate.h): the compressor's projected
 * rows (v, and g when ratio > 1; d floats each) of positions [a0, a0 + cap)
 * of one source, recorded while a verify step runs, so that a rollback can
 * rebuild a tail that keeps some of them (SPEC 7.8's x1). */
struct rt_tail_log {
  float *v, *g;                /* (cap, d) each; g NULL when ratio == 1 */
  int64_t a0;
  int cap, d;
};

/* Bytes by state class (rt_request_bytes). */
struct rt_state_bytes {
  int64_t kv_entries, kv_entry_bytes; /* committed, all sources (= plan cost) */
  int64_t kv_page_bytes;              /* allocated pages held by this request, alignment included */
  int64_t swa_bytes;                  /* rings: payload + scales, all layers */
  int64_t tail_bytes;                 /* ratio > 1 sources' tails */
  int64_t token_bytes;                /* token history (capacity) */
  int64_t xe_bytes;                   /* kept encoder outputs (CED) */
};

struct rt_request {
  int id;
  const struct plan *plan;
  int64_t max_tokens;          /* capacity: prompt + generated */
  int32_t *tokens;             /* (max_tokens) consumed ids */
  int64_t n_tokens;            /* ids in `tokens` */
  int64_t n_pos;               /* positions that have run (state covers [0, n_pos)) */
  int32_t pending;             /* sampled, not yet consumed; -1 = none */
  struct rt_kv_seq seq[PLAN_MAX_LAYERS];   /* by source layer; pool NULL elsewhere */
  struct op_comp_tail tail[PLAN_MAX_LAYERS];
  float *tail_buf[PLAN_MAX_LAYERS];
  struct rt_ring ring[PLAN_MAX_LAYERS];
  struct rt_tail_log *tail_log;  /* (PLAN_MAX_LAYERS) while a verify step runs, else NULL (speculate.c owns it) */
  /* CED: the encoder outputs of the last xe_cap positions (xe_cap =
   * replay.decoder), slot p mod xe_cap, rt_xe_row_floats each: X^E (hc x
   * hidden) then the carried mHC pre (hc; docs/model.md s2), with their
   * positions (-1 empty): the decoder replay of a later prompt that continues
   * this one reads them (SPEC 6.1 "keep", 6.5 obtain_encoder_outputs). */
  float *xe;
  int64_t *xe_pos;
  int xe_cap;
  /* An executor's data handles over this request's buffers (rings, tails,
   * tokens, encoder outputs), released by rt_request_free. NULL when none. */
  void *exec_data;
  void (*exec_release)(void *exec_data);
  /* The DSpark drafter's capture of the target layers' rows while it drafts
   * for this request (runtime/model/mtp.h; the drafter owns it), else NULL. */
  struct rt_mtp_cap *mtp_cap;
};

/* One pool per KV source of p (index by source layer; others left zeroed).
 * Returns 0, CEDAR_EUNSUPPORTED (a storage format the ops cannot pack, named
 * in err) or CEDAR_ENOMEM. */
int rt_kv_pools_init(struct rt_kv_pool *pools /* (PLAN_MAX_LAYERS) */, const struct plan *p, char *err,
                     size_t err_len);
void rt_kv_pools_free(struct rt_kv_pool *pools /* (PLAN_MAX_LAYERS) */, int n_layers);

/* Bytes of one page as allocated (entries rounded up to 64-byte alignment). */
size_t rt_kv_page_bytes(const struct rt_kv_pool *pool);
/* A page from the pool with refcount 1; -1 when memory is exhausted. */
int32_t rt_kv_page_alloc(struct rt_kv_pool *pool);
void rt_kv_page_ref(struct rt_kv_pool *pool, int32_t id);
/* The memory of page id, read under the pool's lock (another thread may be
 * growing the page directory). */
uint8_t *rt_kv_page_mem(struct rt_kv_pool *pool, int32_t id);
/* Drop one reference; the page returns to the pool at 0. */
void rt_kv_page_unref(struct rt_kv_pool *pool, int32_t id);

/* A request able to hold max_tokens positions, with its pages drawn from
 * pools. Returns 0 or CEDAR_ENOMEM (nothing held). */
int rt_request_init(struct rt_request *r, int id, const struct plan *p, struct rt_kv_pool *pools,
                    int64_t max_tokens);
/* Return every page and free the rest. */
void rt_request_free(struct rt_request *r);

/* Make room for `entries` entries in s (pages allocated now, n_entries
 * unchanged), so that appends up to there allocate nothing. Returns 0 or
 * CEDAR_ENOMEM (pool or table full; pages taken so far stay with s). */
int rt_kv_reserve(struct rt_kv_seq *s, int64_t entries);

/* Append n entries (n * entry_bytes contiguous bytes) to a sequence,
 * allocating pages as needed. Returns 0, or CEDAR_ENOMEM when the pool is
 * exhausted or the reserved table is full (nothing appended). */
int rt_kv_append(struct rt_kv_seq *s, const uint8_t *entries /* (n, entry_bytes) */, int n);
/* The read-only view the indexer and attention take, of the entries
 * committed now. */
struct op_kv_view rt_kv_view(const struct rt_kv_seq *s);
/* Entry e (< n_entries). */
const uint8_t *rt_kv_entry(const struct rt_kv_seq *s, int64_t e);

/* Write the entry of position p into its slot (p mod window). */
void rt_ring_put(struct rt_ring *g, int64_t p, const uint8_t *entry /* (entry_bytes) */);
/* Forget every entry and set the replay start. */
void rt_ring_reset(struct rt_ring *g, int64_t r0);

/* Append an id to the token history; CEDAR_EINVAL when full. */
int rt_request_push_token(struct rt_request *r, int32_t tok);

void rt_request_bytes(const struct rt_request *r, struct rt_state_bytes *b);

/* Floats of one kept encoder output row: the streams X^E (hc x hidden), then
 * the pre they carry into the first decoder layer (hc). */
static inline size_t rt_xe_row_floats(const struct plan_model *m) {
  return (size_t)m->hc_streams * (size_t)m->hidden + (size_t)m->hc_streams;
}

#endif
