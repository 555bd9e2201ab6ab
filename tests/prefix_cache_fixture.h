/* prefix_cache_fixture.h: what the tests/test_prefix_cache_*.c files
 * share. The plan, its KV pools, the cache and five requests (static: each
 * test executable has its own); synthetic state built by hand, no weights
 * and no forward (make_req: token history, floor(n / ratio) entries per
 * source whose bytes are a function of (source, entry index, salt), rings
 * and tails filled from (layer, position, salt)), so every byte the cache
 * shares, copies or restores can be traced back to where it came from;
 * setup and teardown (every page returned); reads of the cache's table that
 * do not touch its LRU order; page checksums; check_lookup.
 *
 * Checks that reach into the cache's table (last_use, pins, children) do so
 * on purpose: LRU order among leaves cannot be set up through the API alone,
 * because lookups and inserts always touch a block's ancestors too.
 *
 * What it is not: a test by itself (no main). Functions are static inline
 * so each test compiles only what it uses.
 *
 * Tested through its users: ctest --test-dir build -R '^prefix_cache_'.
 */
#ifndef CEDAR_TESTS_PREFIX_CACHE_FIXTURE_H
#define CEDAR_TESTS_PREFIX_CACHE_FIXTURE_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "ops/formats.h"
#include "base/check.h"
#include "runtime/cache/prefix_cache.h"
#include "runtime/model/state.h"
#include "scheduler/plan.h"
#include "tests/harness.h"

#define SEED_A 0x5eedA11CE0001ull
#define SEED_B 0x5eedB0B500002ull
/* A snapshot pool no test fills (1 TiB): "unbounded" without relying on
 * what a capacity of 0 means. */
#define SNAP_BIG ((int64_t)1 << 40)

/* Large structs (PLAN_MAX_LAYERS arrays): kept off the stack. */
static struct plan plan;
static struct rt_kv_pool pools[PLAN_MAX_LAYERS];
static struct pc_cache cache;
/* The requests (rq[5], as large) are declared by the tests that use them. */

/* ---- synthetic state ------------------------------------------------------ */

static inline uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x =
      a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 32);
}

/* Byte i of entry e of source l, written by the request with this salt. */
static inline uint8_t ent_byte(int l, int64_t e, size_t i, int salt) {
  return (uint8_t)mix((uint64_t)l * 1000003u + (uint64_t)salt, (uint64_t)e, i);
}

static inline void fill_tokens(int32_t *t, int64_t n, int stream) {
  for (int64_t i = 0; i < n; i++)
    t[i] = (int32_t)(mix(777, (uint64_t)stream, (uint64_t)i) % (uint64_t)plan.model.vocab);
}

/* Append entries [n_entries, e_end) of source l, salt `salt`. */
static inline void append_entries(struct rt_kv_seq *s, int l, int64_t e_end, int salt) {
  int64_t e0 = s->n_entries, n = e_end - e0;
  if (n <= 0) return;
  size_t eb = s->pool->entry_bytes;
  uint8_t *buf = malloc(eb * (size_t)n);
  for (int64_t k = 0; k < n; k++)
    for (size_t i = 0; i < eb; i++) buf[(size_t)k * eb + i] = ent_byte(l, e0 + k, i, salt);
  CEDAR_ASSERT(rt_kv_append(s, buf, (int)n) == 0);
  free(buf);
}

/* Entries [e0, e1) of s carry salt's bytes; returns how many do not. */
static inline int64_t bad_entries(const struct rt_kv_seq *s, int l, int64_t e0, int64_t e1, int salt) {
  int64_t bad = 0;
  for (int64_t e = e0; e < e1; e++) {
    const uint8_t *p = rt_kv_entry(s, e);
    for (size_t i = 0; i < s->pool->entry_bytes; i++)
      if (p[i] != ent_byte(l, e, i, salt)) {
        bad++;
        break;
      }
  }
  return bad;
}

/* Every slot's bytes a pattern (so whole rings compare with memcmp), r0 =
 * 1 + (l + salt) % 3, positions [max(r0, npos - window), npos) written. */
static inline void fill_ring(struct rt_ring *g, int l, int64_t npos, int salt) {
  size_t nb = (size_t)g->window * g->entry_bytes;
  for (size_t i = 0; i < nb; i++) g->slot[i] = (uint8_t)mix(5, (uint64_t)l * 131 + (uint64_t)salt, i);
  int64_t r0 = 1 + (l + salt) % 3;
  rt_ring_reset(g, r0);
  uint8_t *e = malloc(g->entry_bytes);
  for (int64_t p = npos - g->window > r0 ? npos - g->window : r0; p < npos; p++) {
    for (size_t i = 0; i < g->entry_bytes; i++)
      e[i] = (uint8_t)mix(6, (uint64_t)l * 7919 + (uint64_t)salt, (uint64_t)p * 4096 + i);
    rt_ring_put(g, p, e);
  }
  free(e);
}

/* A tail as after npos positions: npos mod ratio pending rows from pos0. */
static inline void fill_tail(struct rt_request *r, int l, int64_t npos, int salt) {
  int ratio = r->seq[l].pool->ratio;
  int64_t count = npos % ratio;
  CEDAR_ASSERT(op_comp_tail_init(&r->tail[l], r->tail_buf[l], ratio, plan.model.head_dim, npos - count) == 0);
  r->tail[l].count = (int)count;
  size_t nf = op_comp_tail_floats(ratio, plan.model.head_dim);
  for (size_t i = 0; i < nf; i++)
    r->tail_buf[l][i] = (float)(mix(7, (uint64_t)l, (uint64_t)salt * 100000 + i) % 1000) - 500.f;
}

/* Request r "ran" tok[0, npos) and holds ntok >= npos ids. */
static inline void make_req(struct rt_request *r, const int32_t *tok, int64_t ntok, int64_t npos, int salt,
                            int64_t max_tokens) {
  CEDAR_ASSERT(rt_request_init(r, salt, &plan, pools, max_tokens) == 0);
  for (int64_t i = 0; i < ntok; i++) CEDAR_ASSERT(rt_request_push_token(r, tok[i]) == 0);
  for (int l = 0; l < plan.n_layers; l++) {
    fill_ring(&r->ring[l], l, npos, salt);
    if (!r->seq[l].pool) continue;
    append_entries(&r->seq[l], l, npos / r->seq[l].pool->ratio, salt);
    fill_tail(r, l, npos, salt);
  }
  r->n_pos = npos;
}

/* ---- setup ---------------------------------------------------------------- */

/* Load a plan; page > 0 overrides page_tokens and prefix_block_tokens (small
 * blocks keep the tiny-plan tests short). */
static inline bool setup(const char *path, int page, int block) {
  if (!h_load_plan(path, &plan)) return false;
  if (page) plan.serving.page_tokens = page, plan.serving.prefix_block_tokens = block;
  char err[256] = "";
  int rc = rt_kv_pools_init(pools, &plan, err, sizeof err);
  EXPECT(rc == 0, "%s: rt_kv_pools_init: %d %s", path, rc, err);
  if (rc) plan_free(&plan);
  return rc == 0;
}

static inline void teardown(const char *what) {
  for (int l = 0; l < plan.n_layers; l++)
    if (pools[l].entry_bytes) EXPECT_EQ(pools[l].pages_in_use, 0, "%s: L%d pages returned at the end", what, l);
  rt_kv_pools_free(pools, plan.n_layers);
  plan_free(&plan);
}

/* One block's pages, all sources, computed here (not read from the cache). */
static inline int64_t block_bytes(void) {
  int64_t b = 0;
  for (int l = 0; l < plan.n_layers; l++)
    if (pools[l].entry_bytes)
      b +=
          (int64_t)(plan.serving.prefix_block_tokens / plan.serving.page_tokens) * (int64_t)rt_kv_page_bytes(&pools[l]);
  return b;
}

static inline void cache_init(int64_t cap_blocks, int64_t snap_cap, uint64_t seed) {
  char err[256] = "";
  int rc = pc_init(&cache, &plan, pools, seed, cap_blocks * block_bytes(), snap_cap, err, sizeof err);
  CEDAR_ASSERT_MSG(rc == 0, "pc_init: %s", err);
}

static inline int ppb(int l) { return cache.pages_per_block[l]; }

/* The cached block with this key, found without touching it (no LRU). */
static inline struct pc_block *cached(uint64_t key) {
  for (int64_t i = 0; i < cache.cap; i++)
    if (cache.tab[i].used && cache.tab[i].key == key) return &cache.tab[i];
  return NULL;
}

static inline int64_t total_pins(void) {
  int64_t n = 0;
  for (int64_t i = 0; i < cache.cap; i++)
    if (cache.tab[i].used) n += cache.tab[i].pins;
  return n;
}

/* Key of block k of tok (k < n / B). */
static inline uint64_t key_of(const int32_t *tok, int64_t k) {
  uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)(k + 1));
  CEDAR_ASSERT(pc_keys(&cache, tok, (k + 1) * cache.block, keys) == k + 1);
  uint64_t key = keys[k];
  free(keys);
  return key;
}

/* Source i's pages of the cached block `key` are ids[0, pages per block). */
static inline bool block_pages_are(uint64_t key, int i, const int32_t *ids) {
  const struct pc_block *b = cached(key);
  int n = ppb(cache.sources[i]);
  return b && memcmp(b->pages + i * n, ids, sizeof(int32_t) * (size_t)n) == 0;
}

/* ---- page checksums ------------------------------------------------------- */

struct page_sum {
  int layer;
  int32_t id;
  uint64_t sum;
};

static inline uint64_t page_sum(int l, int32_t id) {
  /* cached pages are full: every byte of page_entries entries was written */
  return XXH3_64bits(pools[l].page[id], (size_t)pools[l].page_entries * pools[l].entry_bytes);
}

/* Checksums of every page of every cached block; *n set; caller frees. */
static inline struct page_sum *cache_sums(int *n) {
  int per = 0;
  for (int i = 0; i < cache.n_sources; i++) per += ppb(cache.sources[i]);
  struct page_sum *s = malloc(sizeof(*s) * (size_t)(cache.count * per + 1));
  *n = 0;
  for (int64_t b = 0; b < cache.cap; b++) {
    if (!cache.tab[b].used) continue;
    for (int i = 0; i < cache.n_sources; i++) {
      int l = cache.sources[i];
      for (int j = 0; j < ppb(l); j++) {
        int32_t id = cache.tab[b].pages[i * ppb(l) + j];
        s[(*n)++] = (struct page_sum){l, id, page_sum(l, id)};
      }
    }
  }
  return s;
}

static inline int changed_pages(const struct page_sum *s, int n) {
  int bad = 0;
  for (int i = 0; i < n; i++) bad += pools[s[i].layer].ref[s[i].id] == 0 || page_sum(s[i].layer, s[i].id) != s[i].sum;
  return bad;
}

static inline bool is_cached_page(const struct page_sum *s, int n, int l, int32_t id) {
  for (int i = 0; i < n; i++)
    if (s[i].layer == l && s[i].id == id) return true;
  return false;
}

/* ---- lookups ---------------------------------------------------------------- */

/* Salts of the requests: A the first (cached) one, C one that attached. */
enum { SALT_A = 11, SALT_C = 23 };

/* Lookups of tok[0, n) capped at max_tokens: hits and counters. */
static inline void check_lookup(const int32_t *tok, int64_t n, int64_t max_tokens, int64_t want, const char *what) {
  struct pc_stats s0 = cache.stats;
  struct pc_hit h;
  pc_lookup(&cache, tok, n, max_tokens, &h);
  int64_t full = (max_tokens < n ? max_tokens : n) / cache.block;
  EXPECT_EQ(h.n_blocks, want, "%s: n %" PRId64 " max_tokens %" PRId64, what, n, max_tokens);
  for (int64_t k = 0; k < h.n_blocks; k++) {
    EXPECT(h.keys[k] == key_of(tok, k), "%s: hit key %" PRId64, what, k);
    struct pc_block *b = cached(h.keys[k]);
    EXPECT(b && b->pins == 1, "%s: block %" PRId64 " pinned once by the lookup", what, k);
  }
  EXPECT_EQ(cache.stats.lookups, s0.lookups + 1, "%s: lookups", what);
  EXPECT_EQ(cache.stats.hit_blocks, s0.hit_blocks + want, "%s: hit_blocks", what);
  EXPECT_EQ(cache.stats.miss_blocks, s0.miss_blocks + full - want, "%s: miss_blocks", what);
  pc_release(&cache, &h);
  EXPECT_EQ(total_pins(), 0, "%s: released", what);
}

#endif
