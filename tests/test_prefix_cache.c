/* test_prefix_cache.c: the global prefix cache and the encoder-SWA snapshot
 * pool (runtime/prefix_cache.h), with synthetic state: no weights, no
 * forward. Requests are built by hand (rt_request_init, token history,
 * floor(n / ratio) entries per source whose bytes are a function of
 * (source, entry index, salt), rings and tails filled from (layer, position,
 * salt)), so every byte the cache shares, copies or restores can be traced
 * back to where it came from.
 *
 *  - keys: block k's key is XXH3_64 of its ids seeded with block k-1's key
 *    (block 0: the fingerprint), recomputed here independently; changing a
 *    token in block j changes keys j.. and none before; another fingerprint
 *    changes every key and a table built under one never hits under the
 *    other (blocks and snapshots); pc_prefix_key separates lengths, partial
 *    blocks and trailing zero ids, and ignores tokens past n;
 *  - insert, lookup, attach (tiny.yaml with 8-token blocks, and v41-mini.yaml
 *    with its own 256-token blocks): the longest cached prefix in whole
 *    blocks, capped by max_tokens; an attached request shares the cached
 *    page ids (refcount + 1), holds hit / ratio entries of every source with
 *    the original bytes, empty tails at pos0 = hit; its suffix goes to fresh
 *    pages and no cached page changes (checksums; SPEC 5.4, 8.8 #49); a
 *    request too small for the hit is refused and holds nothing; freeing
 *    requests and the cache, in either order, returns every page;
 *  - insert rules: idempotent, never a partial block, never a block some
 *    source lacks entries for (SPEC 8.9 #46: no half-filled group published),
 *    n capped by the argument and by the token history;
 *  - LRU: evicts the least recently used unpinned leaf, never a block with a
 *    cached successor, never a pinned one (a lookup not yet released); with
 *    everything pinned the insert stops; the block being extended is never
 *    evicted to make room for its child; a re-insert counts as a use; the
 *    cached set stays prefix-closed; evicted pages go back to the pool unless
 *    a request still holds them (then they stay valid, bytes intact);
 *  - the table: an 800-block chain (growth) and 3000 prompts through a
 *    100-block cache (tombstones);
 *  - snapshots: save then restore into a request attached to the same blocks
 *    reproduces every encoder ring (slots, positions, r0), every source's
 *    tail (count, pos0, rows) and the entries after the last full block, at
 *    odd and even boundaries below, above and at multiples of the block; no
 *    decoder ring is saved or touched (SPEC 5.2, 8.8 #44); the snapshot is a
 *    copy; the xe rows are kept; the bytes counted are what it holds; lookup
 *    picks the largest matching boundary <= max_tokens whose full blocks are
 *    cached, never one whose prefix differs by one token; a snapshot below
 *    the hit restores into a request attached to its own blocks only; TTL
 *    expiry, oldest-first capacity eviction, a snapshot larger than the pool
 *    is not kept, one boundary saved twice keeps the newer;
 *  - stats counters (struct pc_stats) after each step.
 *
 * Three checks guard bugs this test found first: an insert that inserts
 * nothing must not evict; a hit's snapshot must not change under it (it is
 * pinned); a swa_pool_fraction of 0 keeps nothing (not "no limit").
 *
 * Checks that reach into the cache's table (last_use, pins, children) do so
 * on purpose: LRU order among leaves cannot be set up through the API alone,
 * because lookups and inserts always touch a block's ancestors too.
 *
 * Not tested here: the hit paths that run the model (runtime/serve.c), the
 * disk tier, concurrency.
 * Run: ctest --test-dir build -R '^prefix_cache$', or
 * build/tests/test_prefix_cache from the repository root.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "ops/formats.h"
#include "base/check.h"
#include "runtime/prefix_cache.h"
#include "runtime/state.h"
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
static struct rt_request rq[5];

/* ---- synthetic state ------------------------------------------------------ */

static uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x =
      a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 32);
}

/* Byte i of entry e of source l, written by the request with this salt. */
static uint8_t ent_byte(int l, int64_t e, size_t i, int salt) {
  return (uint8_t)mix((uint64_t)l * 1000003u + (uint64_t)salt, (uint64_t)e, i);
}

static void fill_tokens(int32_t *t, int64_t n, int stream) {
  for (int64_t i = 0; i < n; i++)
    t[i] = (int32_t)(mix(777, (uint64_t)stream, (uint64_t)i) % (uint64_t)plan.model.vocab);
}

/* Append entries [n_entries, e_end) of source l, salt `salt`. */
static void append_entries(struct rt_kv_seq *s, int l, int64_t e_end, int salt) {
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
static int64_t bad_entries(const struct rt_kv_seq *s, int l, int64_t e0, int64_t e1, int salt) {
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
static void fill_ring(struct rt_ring *g, int l, int64_t npos, int salt) {
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
static void fill_tail(struct rt_request *r, int l, int64_t npos, int salt) {
  int ratio = r->seq[l].pool->ratio;
  int64_t count = npos % ratio;
  CEDAR_ASSERT(op_comp_tail_init(&r->tail[l], r->tail_buf[l], ratio, plan.model.head_dim, npos - count) == 0);
  r->tail[l].count = (int)count;
  size_t nf = op_comp_tail_floats(ratio, plan.model.head_dim);
  for (size_t i = 0; i < nf; i++)
    r->tail_buf[l][i] = (float)(mix(7, (uint64_t)l, (uint64_t)salt * 100000 + i) % 1000) - 500.f;
}

/* Request r "ran" tok[0, npos) and holds ntok >= npos ids. */
static void make_req(struct rt_request *r, const int32_t *tok, int64_t ntok, int64_t npos, int salt,
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
static bool setup(const char *path, int page, int block) {
  if (!h_load_plan(path, &plan)) return false;
  if (page) plan.serving.page_tokens = page, plan.serving.prefix_block_tokens = block;
  char err[256] = "";
  int rc = rt_kv_pools_init(pools, &plan, err, sizeof err);
  EXPECT(rc == 0, "%s: rt_kv_pools_init: %d %s", path, rc, err);
  if (rc) plan_free(&plan);
  return rc == 0;
}

static void teardown(const char *what) {
  for (int l = 0; l < plan.n_layers; l++)
    if (pools[l].entry_bytes) EXPECT_EQ(pools[l].pages_in_use, 0, "%s: L%d pages returned at the end", what, l);
  rt_kv_pools_free(pools, plan.n_layers);
  plan_free(&plan);
}

/* One block's pages, all sources, computed here (not read from the cache). */
static int64_t block_bytes(void) {
  int64_t b = 0;
  for (int l = 0; l < plan.n_layers; l++)
    if (pools[l].entry_bytes)
      b +=
          (int64_t)(plan.serving.prefix_block_tokens / plan.serving.page_tokens) * (int64_t)rt_kv_page_bytes(&pools[l]);
  return b;
}

static void cache_init(int64_t cap_blocks, int64_t snap_cap, uint64_t seed) {
  char err[256] = "";
  int rc = pc_init(&cache, &plan, pools, seed, cap_blocks * block_bytes(), snap_cap, err, sizeof err);
  CEDAR_ASSERT_MSG(rc == 0, "pc_init: %s", err);
}

static int ppb(int l) { return cache.pages_per_block[l]; }

/* The cached block with this key, found without touching it (no LRU). */
static struct pc_block *cached(uint64_t key) {
  for (int64_t i = 0; i < cache.cap; i++)
    if (cache.tab[i].used && cache.tab[i].key == key) return &cache.tab[i];
  return NULL;
}

static int64_t total_pins(void) {
  int64_t n = 0;
  for (int64_t i = 0; i < cache.cap; i++)
    if (cache.tab[i].used) n += cache.tab[i].pins;
  return n;
}

/* Key of block k of tok (k < n / B). */
static uint64_t key_of(const int32_t *tok, int64_t k) {
  uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)(k + 1));
  CEDAR_ASSERT(pc_keys(&cache, tok, (k + 1) * cache.block, keys) == k + 1);
  uint64_t key = keys[k];
  free(keys);
  return key;
}

/* Source i's pages of the cached block `key` are ids[0, pages per block). */
static bool block_pages_are(uint64_t key, int i, const int32_t *ids) {
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

static uint64_t page_sum(int l, int32_t id) {
  /* cached pages are full: every byte of page_entries entries was written */
  return XXH3_64bits(pools[l].page[id], (size_t)pools[l].page_entries * pools[l].entry_bytes);
}

/* Checksums of every page of every cached block; *n set; caller frees. */
static struct page_sum *cache_sums(int *n) {
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

static int changed_pages(const struct page_sum *s, int n) {
  int bad = 0;
  for (int i = 0; i < n; i++) bad += pools[s[i].layer].ref[s[i].id] == 0 || page_sum(s[i].layer, s[i].id) != s[i].sum;
  return bad;
}

static bool is_cached_page(const struct page_sum *s, int n, int l, int32_t id) {
  for (int i = 0; i < n; i++)
    if (s[i].layer == l && s[i].id == id) return true;
  return false;
}

/* ---- pc_init ---------------------------------------------------------------- */

static void test_init(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  char err[256] = "";
  static const int bad[][2] = {{4, 6}, {4, 7}, {8, 12}, {2, 0}, {4, 2}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    plan.serving.page_tokens = bad[i][0], plan.serving.prefix_block_tokens = bad[i][1];
    err[0] = 0;
    EXPECT_EQ(pc_init(&cache, &plan, pools, SEED_A, 0, 0, err, sizeof err), CEDAR_EINVAL, "page %d block %d", bad[i][0],
              bad[i][1]);
    EXPECT(err[0] != 0, "page %d block %d: an error message", bad[i][0], bad[i][1]);
  }
  plan.serving.page_tokens = 4, plan.serving.prefix_block_tokens = 8;
  cache_init(3, -1, SEED_A);
  int n_src = 0;
  for (int l = 0; l < plan.n_layers; l++) {
    bool src = plan_is_kv_source(&plan.layer[l]);
    EXPECT_EQ(ppb(l), src ? 2 : 0, "L%d pages per block (8-token blocks of 4-token pages)", l);
    if (!src) continue;
    EXPECT_EQ(cache.sources[n_src], l, "source list in layer order");
    n_src++;
  }
  EXPECT_EQ(cache.n_sources, n_src, "every KV source is in the unit");
  EXPECT(n_src == 2, "tiny has one encoder and one decoder source (%d)", n_src);
  EXPECT_EQ(cache.block_bytes, block_bytes(), "block bytes = pages of every source");
  EXPECT_EQ(cache.capacity_bytes, 3 * block_bytes(), "capacity as given");
  int64_t host = (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGE_SIZE);
  EXPECT_EQ(cache.snap_capacity_bytes, (int64_t)(plan.serving.swa_pool_fraction * host),
            "snap capacity -1: swa_pool_fraction of host memory");
  EXPECT(cache.snap_ttl_s == plan.serving.swa_pool_ttl_s && cache.snap_ttl_s > 0, "TTL from the plan");
  pc_free(&cache);
  teardown("init");
}

/* ---- keys ----------------------------------------------------------------- */

static void test_keys(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  cache_init(0, SNAP_BIG, SEED_A);
  const int B = cache.block, NB = 6;
  int64_t n = NB * B + 3;
  int32_t tok[6 * 8 + 3], t2[6 * 8 + 3];
  uint64_t keys[8], k2[8];
  fill_tokens(tok, n, 1);
  EXPECT_EQ(pc_keys(&cache, tok, n, keys), NB, "full blocks of %" PRId64 " tokens", n);
  EXPECT_EQ(pc_keys(&cache, tok, B - 1, k2), 0, "no full block");
  /* the documented chain, recomputed */
  uint64_t h = SEED_A;
  for (int k = 0; k < NB; k++) {
    h = XXH3_64bits_withSeed(tok + k * B, sizeof(int32_t) * (size_t)B, h);
    EXPECT(keys[k] == h, "block %d: key = XXH3_64(ids, seed = previous key)", k);
  }
  /* a key depends on every earlier token and on no later one */
  for (int j = 0; j < NB; j++) {
    memcpy(t2, tok, sizeof tok);
    t2[j * B + (j * 3) % B] = (t2[j * B + (j * 3) % B] + 1) % plan.model.vocab;
    pc_keys(&cache, t2, n, k2);
    for (int k = 0; k < NB; k++)
      EXPECT((k2[k] == keys[k]) == (k < j), "a token of block %d changed: key %d %s", j, k,
             k < j ? "changed too" : "did not change");
  }
  memcpy(t2, tok, sizeof tok);
  t2[n - 1] ^= 1; /* past the last full block */
  pc_keys(&cache, t2, n, k2);
  EXPECT(memcmp(k2, keys, sizeof(uint64_t) * NB) == 0, "a token after the last full block changes no key");
  EXPECT_EQ(pc_keys(&cache, tok, 2 * B, k2), 2, "shorter prompt");
  EXPECT(k2[0] == keys[0] && k2[1] == keys[1], "keys of a prefix are the prefix of the keys");
  /* another fingerprint: every key differs */
  struct pc_cache other = cache;
  other.seed = SEED_B;
  pc_keys(&other, tok, n, k2);
  for (int k = 0; k < NB; k++) EXPECT(k2[k] != keys[k], "block %d: another fingerprint, another key", k);

  /* prefix keys: length, partial block, zero ids, later tokens */
  uint64_t pk[6 * 8 + 4];
  for (int64_t m = 0; m <= n; m++) pk[m] = pc_prefix_key(&cache, tok, m);
  int dup = 0;
  for (int64_t a = 0; a <= n; a++)
    for (int64_t b = a + 1; b <= n; b++) dup += pk[a] == pk[b];
  EXPECT(dup == 0, "pc_prefix_key: %d equal pairs among the %" PRId64 " prefixes of one prompt", dup, n + 1);
  for (int k = 1; k <= NB; k++) EXPECT(pk[k * B] != keys[k - 1], "prefix key of %d blocks is not the block key", k);
  memcpy(t2, tok, sizeof tok);
  t2[2 * B + 1] = (t2[2 * B + 1] + 1) % plan.model.vocab;
  EXPECT(pc_prefix_key(&cache, t2, 2 * B + 3) != pk[2 * B + 3], "a token of the partial block changes the prefix key");
  EXPECT(pc_prefix_key(&cache, t2, 2 * B + 1) == pk[2 * B + 1], "a token past n does not");
  memcpy(t2, tok, sizeof tok);
  t2[2 * B + 3] = 0, t2[2 * B + 4] = 0;
  EXPECT(pc_prefix_key(&cache, t2, 2 * B + 3) != pc_prefix_key(&cache, t2, 2 * B + 4) &&
             pc_prefix_key(&cache, t2, 2 * B + 4) != pc_prefix_key(&cache, t2, 2 * B + 5),
         "trailing zero ids: the length is in the key");
  EXPECT(pc_prefix_key(&other, tok, 2 * B + 3) != pk[2 * B + 3] && pc_prefix_key(&other, tok, 5) != pk[5],
         "another fingerprint, another prefix key");
  pc_free(&cache);
  teardown("keys");
}

/* ---- insert, lookup, attach ----------------------------------------------- */

enum { SALT_A = 11, SALT_C = 23 };

/* Lookups of tok[0, n) capped at max_tokens: hits and counters. */
static void check_lookup(const int32_t *tok, int64_t n, int64_t max_tokens, int64_t want, const char *what) {
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

/* Request a ran n positions (3 full blocks and a partial one), its blocks are
 * cached; the lookups see the longest cached prefix in whole blocks. */
static void insert_and_lookups(int32_t *tok, int64_t n, const char *what) {
  const int64_t B = cache.block;
  struct rt_request *a = &rq[0];
  make_req(a, tok, n, n, SALT_A, 6 * B);
  EXPECT_EQ(pc_insert(&cache, a, n), 3, "%s: three full blocks", what);
  EXPECT_EQ(cache.stats.inserted, 3, "%s", what);
  EXPECT_EQ(cache.count, 3, "%s", what);
  EXPECT_EQ(cache.bytes, 3 * block_bytes(), "%s", what);
  for (int i = 0; i < cache.n_sources; i++) {
    int l = cache.sources[i];
    for (int k = 0; k < a->seq[l].n_pages; k++)
      EXPECT_EQ(pools[l].ref[a->seq[l].page_id[k]], k < 3 * ppb(l) ? 2 : 1, "%s: L%d page %d: the cache's reference",
                what, l, k);
    for (int k = 0; k < 3; k++)
      EXPECT(block_pages_are(key_of(tok, k), i, a->seq[l].page_id + k * ppb(l)),
             "%s: L%d block %d holds the request's pages", what, l, k);
  }
  EXPECT_EQ(pc_insert(&cache, a, n), 0, "%s: inserting again adds nothing", what);
  EXPECT_EQ(cache.stats.inserted, 3, "%s: idempotent", what);
  for (int i = 0; i < cache.n_sources; i++)
    EXPECT_EQ(pools[cache.sources[i]].ref[a->seq[cache.sources[i]].page_id[0]], 2, "%s: no second reference", what);

  const int64_t cut[][2] = {{5 * B, 3},     {10 * B, 3}, {3 * B, 3}, {3 * B - 1, 2},
                            {2 * B + 1, 2}, {B, 1},      {B - 1, 0}, {0, 0}};
  for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) check_lookup(tok, 5 * B, cut[i][0], cut[i][1], what);
  int32_t *t2 = malloc(sizeof(int32_t) * 5 * (size_t)B);
  memcpy(t2, tok, sizeof(int32_t) * 5 * (size_t)B);
  t2[B + 3] = (t2[B + 3] + 1) % plan.model.vocab;
  check_lookup(t2, 5 * B, 5 * B, 1, "a token of block 1 differs");
  t2[0] = (t2[0] + 1) % plan.model.vocab;
  check_lookup(t2, 5 * B, 5 * B, 0, "the first token differs");
  free(t2);
}

/* Every page of c's sequence l, and its entries: [0, hit) shared and
 * original (salt A), the rest c's own (salt C). */
static void check_attached(const struct rt_request *c, int l, int64_t hit, int64_t npos, const char *what) {
  const struct rt_kv_seq *s = &c->seq[l], *a = rq[0].plan ? &rq[0].seq[l] : NULL; /* NULL: freed */
  int ratio = s->pool->ratio, B = plan.serving.prefix_block_tokens, shared = (int)(hit / B) * (B / plan.serving.page_tokens);
  EXPECT_EQ(s->n_entries, npos / ratio, "%s: L%d entries", what, l);
  for (int k = 0; k < s->n_pages; k++) {
    EXPECT(s->page_ptr[k] == pools[l].page[s->page_id[k]], "%s: L%d page %d pointer", what, l, k);
    if (a && k < shared)
      EXPECT(s->page_id[k] == a->page_id[k], "%s: L%d page %d shared with the first request", what, l, k);
  }
  EXPECT_EQ(bad_entries(s, l, 0, hit / ratio, SALT_A), 0, "%s: L%d cached entries as written", what, l);
  EXPECT_EQ(bad_entries(s, l, hit / ratio, s->n_entries, SALT_C), 0, "%s: L%d suffix entries", what, l);
}

/* A second request hits the 3 cached blocks, appends 2 more blocks of its
 * own and inserts them. Leaves rq[1] alive. */
static void attach_and_append(const int32_t *tok, const char *what) {
  const int64_t B = cache.block;
  struct rt_request *a = &rq[0], *c = &rq[1];
  struct pc_hit h;
  pc_lookup(&cache, tok, 5 * B, 5 * B, &h);
  EXPECT_EQ(h.n_blocks, 3, "%s", what);
  int n_sum;
  struct page_sum *sums = cache_sums(&n_sum);
  CEDAR_ASSERT(rt_request_init(&rq[2], 3, &plan, pools, B) == 0);
  EXPECT_EQ(pc_attach(&cache, &h, &rq[2]), CEDAR_ENOMEM, "%s: a request too small for the hit", what);
  for (int i = 0; i < cache.n_sources; i++) {
    int l = cache.sources[i];
    EXPECT(rq[2].seq[l].n_pages == 0 && rq[2].seq[l].n_entries == 0, "%s: L%d a failed attach holds nothing", what, l);
    EXPECT_EQ(pools[l].ref[a->seq[l].page_id[0]], 2, "%s: L%d a failed attach takes no reference", what, l);
  }
  rt_request_free(&rq[2]);
  CEDAR_ASSERT(rt_request_init(c, 2, &plan, pools, 6 * B) == 0);
  for (int64_t i = 0; i < 5 * B; i++) CEDAR_ASSERT(rt_request_push_token(c, tok[i]) == 0);
  EXPECT_EQ(pc_attach(&cache, &h, c), 0, "%s", what);
  for (int i = 0; i < cache.n_sources; i++) {
    int l = cache.sources[i];
    struct rt_kv_seq *s = &c->seq[l];
    EXPECT_EQ(s->n_pages, 3 * ppb(l), "%s: L%d attached pages", what, l);
    for (int k = 0; k < s->n_pages; k++) EXPECT_EQ(pools[l].ref[s->page_id[k]], 3, "%s: L%d refcount + 1", what, l);
    check_attached(c, l, 3 * B, 3 * B, what);
    EXPECT(c->tail[l].count == 0 && c->tail[l].pos0 == 3 * B, "%s: L%d tail empty at the hit", what, l);
    append_entries(s, l, 5 * B / s->pool->ratio, SALT_C);
    for (int k = 3 * ppb(l); k < s->n_pages; k++)
      EXPECT(!is_cached_page(sums, n_sum, l, s->page_id[k]) && pools[l].ref[s->page_id[k]] == 1,
             "%s: L%d suffix page %d is fresh", what, l, k);
    check_attached(c, l, 3 * B, 5 * B, what);
    EXPECT_EQ(bad_entries(&a->seq[l], l, 0, a->seq[l].n_entries, SALT_A), 0, "%s: L%d first request intact", what, l);
  }
  c->n_pos = 5 * B;
  EXPECT_EQ(changed_pages(sums, n_sum), 0, "%s: the suffix rewrote a cached page (SPEC 8.8 #49)", what);
  EXPECT_EQ(pc_insert(&cache, c, 5 * B), 2, "%s: the hit request's own blocks", what);
  for (int i = 0; i < cache.n_sources; i++) {
    int l = cache.sources[i];
    for (int k = 3; k < 5; k++)
      EXPECT(block_pages_are(key_of(tok, k), i, c->seq[l].page_id + k * ppb(l)),
             "%s: L%d block %d is the hit request's pages", what, l, k);
  }
  EXPECT_EQ(changed_pages(sums, n_sum), 0, "%s: inserting rewrote a cached page", what);
  EXPECT_EQ(cache.stats.inserted, 5, "%s", what);
  pc_release(&cache, &h);
  EXPECT_EQ(total_pins(), 0, "%s", what);
  rt_request_free(a);
  for (int i = 0; i < cache.n_sources; i++) {
    int l = cache.sources[i];
    check_attached(c, l, 3 * B, 5 * B, "after the first request ended");
    EXPECT_EQ(pools[l].pages_in_use, 5 * ppb(l), "%s: L%d the cache and the second request share 5 blocks", what, l);
  }
  free(sums);
}

static void test_hit(const char *path, int page, int block) {
  if (!setup(path, page, block)) return;
  cache_init(0, SNAP_BIG, SEED_A);
  const int64_t B = cache.block;
  int32_t *tok = malloc(sizeof(int32_t) * 6 * (size_t)B);
  fill_tokens(tok, 6 * B, 1);
  insert_and_lookups(tok, 3 * B + B / 2 + 1, path);
  attach_and_append(tok, path);
  pc_free(&cache); /* before the request: its pages stay */
  for (int l = 0; l < plan.n_layers; l++) {
    if (!pools[l].entry_bytes) continue;
    for (int k = 0; k < rq[1].seq[l].n_pages; k++)
      EXPECT_EQ(pools[l].ref[rq[1].seq[l].page_id[k]], 1, "%s: L%d", path, l);
    check_attached(&rq[1], l, 3 * B, 5 * B, "after pc_free");
  }
  rt_request_free(&rq[1]);
  free(tok);
  teardown(path);
}

/* ---- insert rules ----------------------------------------------------------- */

static void test_insert_rules(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  cache_init(0, SNAP_BIG, SEED_A);
  const int64_t B = cache.block;
  int32_t tok[4 * 8];
  struct rt_request *r = &rq[0];
  fill_tokens(tok, 3 * B, 2);
  make_req(r, tok, 3 * B, 2 * B + 1, SALT_A, 4 * B);
  EXPECT_EQ(pc_insert(&cache, r, 3 * B), 2, "ids of 3 blocks, entries of 2B + 1 positions");
  EXPECT(!cached(key_of(tok, 2)), "the block without entries is not cached");
  EXPECT_EQ(pc_insert(&cache, r, B + 1), 0, "already cached");
  rt_request_free(r);

  fill_tokens(tok, 3 * B, 3);
  make_req(r, tok, 3 * B, 3 * B, SALT_A, 4 * B);
  EXPECT_EQ(pc_insert(&cache, r, B + 1), 1, "n = B + 1: one block");
  EXPECT_EQ(pc_insert(&cache, r, 100 * B), 2, "n past the token history: the rest");
  rt_request_free(r);

  fill_tokens(tok, B, 4);
  make_req(r, tok, B - 1, B - 1, SALT_A, 4 * B);
  EXPECT_EQ(pc_insert(&cache, r, B), 0, "a partial block is never inserted");
  rt_request_free(r);
  make_req(r, tok, B, B - 1, SALT_A, 4 * B);
  EXPECT_EQ(pc_insert(&cache, r, B), 0, "ids of a whole block, entries of B - 1 positions");
  rt_request_free(r);

  /* one source a position short of 2 blocks: only block 0 goes in */
  for (int i = 0; i < cache.n_sources; i++) {
    fill_tokens(tok, 2 * B, 10 + i);
    make_req(r, tok, 2 * B, 2 * B - 1, SALT_A, 4 * B);
    for (int j = 0; j < cache.n_sources; j++)
      if (j != i)
        append_entries(&r->seq[cache.sources[j]], cache.sources[j], 2 * B / pools[cache.sources[j]].ratio, SALT_A);
    r->n_pos = 2 * B;
    EXPECT_EQ(pc_insert(&cache, r, 2 * B), 1, "L%d lacks the last entry of block 1", cache.sources[i]);
    EXPECT(!cached(key_of(tok, 1)), "L%d: block 1 not cached", cache.sources[i]);
    rt_request_free(r);
  }
  EXPECT_EQ(cache.stats.inserted, 5 + cache.n_sources, "inserted");
  EXPECT_EQ(cache.count, 5 + cache.n_sources, "cached blocks");
  EXPECT_EQ(cache.stats.evicted, 0, "unbounded: nothing evicted");
  pc_free(&cache);
  teardown("insert rules");
}

/* ---- LRU -------------------------------------------------------------------- */

/* tok = the first nb blocks of stream s (nb <= 4). */
static void stream_tokens(int32_t *tok, int s, int nb) { fill_tokens(tok, nb * (int64_t)cache.block, s); }

static uint64_t skey(int s, int k) {
  int32_t tok[4 * 8];
  stream_tokens(tok, s, k + 1);
  return key_of(tok, k);
}

static bool has(int s, int k) { return cached(skey(s, k)) != NULL; }

/* Block k of stream s, which must be cached (a dummy when it is not, so the
 * failure is reported rather than crashing). */
static struct pc_block *blk(int s, int k) {
  static struct pc_block dummy;
  struct pc_block *b = cached(skey(s, k));
  EXPECT(b != NULL, "block %d of stream %d is not cached", k, s);
  return b ? b : &dummy;
}

/* Insert nb blocks of stream s from a request that then ends, so only the
 * cache holds the pages. Returns the blocks inserted. */
static int64_t insert_stream(int s, int nb) {
  int32_t tok[4 * 8];
  int64_t n = nb * (int64_t)cache.block;
  stream_tokens(tok, s, nb);
  make_req(&rq[4], tok, n, n, s, n);
  int64_t got = pc_insert(&cache, &rq[4], n);
  rt_request_free(&rq[4]);
  return got;
}

static void lookup_stream(int s, int nb, struct pc_hit *h) {
  int32_t tok[4 * 8];
  stream_tokens(tok, s, nb);
  pc_lookup(&cache, tok, nb * (int64_t)cache.block, nb * (int64_t)cache.block, h);
  EXPECT_EQ(h->n_blocks, nb, "lookup of stream %d", s);
}

static void touch(int s) {
  struct pc_hit h;
  lookup_stream(s, 1, &h);
  pc_release(&cache, &h);
}

static void check_in_use(int blocks, const char *what) {
  for (int i = 0; i < cache.n_sources; i++)
    EXPECT_EQ(pools[cache.sources[i]].pages_in_use, blocks * ppb(cache.sources[i]), "%s: L%d pages in use", what,
              cache.sources[i]);
}

/* Every cached block's parent is cached and counts it as a child: the cached
 * set stays prefix-closed, which is why a lookup may stop at its first
 * miss. */
static void check_prefix_closed(const char *what) {
  int bad = 0;
  for (int64_t i = 0; i < cache.cap; i++) {
    const struct pc_block *b = &cache.tab[i];
    if (!b->used) continue;
    int kids = 0;
    for (int64_t j = 0; j < cache.cap; j++)
      kids += cache.tab[j].used && cache.tab[j].index > 0 && cache.tab[j].parent == b->key;
    bad += kids != b->children || (b->index > 0 && !cached(b->parent)) || (b->index == 0 && b->parent != cache.seed);
  }
  EXPECT(bad == 0, "%s: %d cached blocks with a missing parent or a wrong child count", what, bad);
}

/* Capacity 3 one-block prompts: LRU order, pins, everything pinned. */
static void test_lru(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  cache_init(3, SNAP_BIG, SEED_A);
  for (int s = 1; s <= 3; s++) EXPECT_EQ(insert_stream(s, 1), 1, "stream %d", s);
  EXPECT_EQ(cache.bytes, 3 * block_bytes(), "full");
  touch(1); /* LRU order now 2, 3, 1 */
  struct pc_block *b2 = blk(2, 0);
  int32_t ids2[2 * PLAN_MAX_LAYERS];
  int n2 = 0;
  for (int i = 0; i < cache.n_sources; i++)
    for (int j = 0; j < ppb(cache.sources[i]); j++) ids2[n2++] = b2->pages[i * ppb(cache.sources[i]) + j];
  EXPECT_EQ(insert_stream(4, 1), 1, "stream 4");
  EXPECT_EQ(cache.stats.evicted, 1, "one eviction");
  EXPECT(!has(2, 0) && has(1, 0) && has(3, 0) && has(4, 0), "the least recently used block (stream 2) went");
  n2 = 0;
  for (int i = 0; i < cache.n_sources; i++)
    for (int j = 0; j < ppb(cache.sources[i]); j++)
      EXPECT_EQ(pools[cache.sources[i]].ref[ids2[n2++]], 0, "evicted page %d returned to the pool", j);
  check_in_use(3, "after an eviction");

  struct pc_hit h3, h4, h5;
  lookup_stream(3, 1, &h3);
  touch(1), touch(4); /* order: 3 (pinned), 1, 4 */
  EXPECT_EQ(insert_stream(5, 1), 1, "stream 5");
  EXPECT(has(3, 0) && !has(1, 0) && has(4, 0) && has(5, 0), "the pinned LRU block stays; the next one goes");
  lookup_stream(4, 1, &h4);
  lookup_stream(5, 1, &h5);
  struct pc_stats s0 = cache.stats;
  EXPECT_EQ(insert_stream(6, 1), 0, "everything pinned: nothing inserted");
  EXPECT_EQ(cache.stats.evicted, s0.evicted, "everything pinned: nothing evicted");
  EXPECT(cache.count == 3 && cache.bytes == 3 * block_bytes() && !has(6, 0), "everything pinned: unchanged");
  check_in_use(3, "after a refused insert");
  pc_release(&cache, &h3), pc_release(&cache, &h4), pc_release(&cache, &h5);
  EXPECT_EQ(insert_stream(6, 1), 1, "released: stream 6 goes in");
  EXPECT(!has(3, 0) && has(4, 0) && has(5, 0) && has(6, 0), "released: the oldest (stream 3) went");
  EXPECT_EQ(cache.stats.evicted, 3, "evicted");
  EXPECT_EQ(cache.stats.inserted, 6, "inserted");
  /* re-inserting a cached block counts as a use (the request ran it) */
  EXPECT_EQ(insert_stream(4, 1), 0, "stream 4 again"); /* order now 5, 6, 4 */
  EXPECT_EQ(insert_stream(1, 1), 1, "stream 1");
  EXPECT(has(4, 0) && !has(5, 0) && has(6, 0) && has(1, 0), "a re-insert refreshed stream 4; stream 5 went");
  check_prefix_closed("lru");
  pc_free(&cache);
  teardown("lru");
}

/* Leaves only; the block being extended stays; an incomplete block evicts
 * nothing. */
static void test_lru_leaves(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  cache_init(3, SNAP_BIG, SEED_A);
  EXPECT_EQ(insert_stream(7, 2), 2, "a two-block chain");
  EXPECT_EQ(insert_stream(8, 1), 1, "one block");
  struct pc_block *q0 = blk(7, 0), *q1 = blk(7, 1), *p = blk(8, 0);
  EXPECT(q0->children == 1 && q1->children == 0 && p->children == 0, "children counts");
  EXPECT(q0->index == 0 && q1->index == 1 && q0->parent == SEED_A && q1->parent == q0->key, "chain links");
  q0->last_use = 0, p->last_use = 1, q1->last_use = 2; /* the root is the oldest, but not a leaf */
  EXPECT_EQ(insert_stream(9, 1), 1, "stream 9");
  EXPECT(has(7, 0) && has(7, 1) && !has(8, 0), "the oldest leaf went, not the oldest block");
  blk(7, 0)->last_use = 0, blk(7, 1)->last_use = 1;
  EXPECT_EQ(insert_stream(10, 1), 1, "stream 10");
  EXPECT(has(7, 0) && !has(7, 1), "the chain's leaf went");
  EXPECT(blk(7, 0)->children == 0, "its parent lost its child");
  EXPECT_EQ(insert_stream(11, 1), 1, "stream 11");
  EXPECT(!has(7, 0) && has(9, 0) && has(10, 0) && has(11, 0), "the parent, now a leaf, went");
  EXPECT_EQ(cache.stats.evicted, 3, "evicted");
  check_prefix_closed("lru leaves");
  pc_free(&cache);

  cache_init(1, SNAP_BIG, SEED_A);
  EXPECT_EQ(insert_stream(12, 2), 1, "capacity 1: the first block only");
  EXPECT(has(12, 0) && !has(12, 1) && cache.stats.evicted == 0, "block 0 was not evicted to make room for block 1");
  struct pc_hit h;
  lookup_stream(12, 1, &h);
  pc_release(&cache, &h);
  pc_free(&cache);

  cache_init(2, SNAP_BIG, SEED_A);
  insert_stream(13, 1), insert_stream(14, 1);
  int32_t tok[8];
  stream_tokens(tok, 15, 1);
  make_req(&rq[0], tok, cache.block, cache.block - 1, SALT_A, cache.block);
  EXPECT_EQ(pc_insert(&cache, &rq[0], cache.block), 0, "an incomplete block is not inserted");
  rt_request_free(&rq[0]);
  /* pc_insert checks completeness before it evicts to make room. */
  EXPECT(cache.stats.evicted == 0 && has(13, 0) && has(14, 0),
         "an insert that inserts nothing evicted %" PRId64
         " block(s)",
         cache.stats.evicted);
  pc_free(&cache);
  teardown("lru leaves");
}

/* A block evicted while requests hold its pages: the pages stay valid. */
static void test_lru_in_use(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  cache_init(2, SNAP_BIG, SEED_A);
  const int64_t B = cache.block;
  int32_t tok[8];
  stream_tokens(tok, 16, 1);
  struct rt_request *r = &rq[0], *c = &rq[1];
  make_req(r, tok, B, B, SALT_A, 2 * B);
  EXPECT_EQ(pc_insert(&cache, r, B), 1, "stream 16");
  struct pc_hit h;
  pc_lookup(&cache, tok, B, B, &h);
  CEDAR_ASSERT(rt_request_init(c, 2, &plan, pools, 2 * B) == 0);
  EXPECT_EQ(pc_attach(&cache, &h, c), 0, "attach");
  pc_release(&cache, &h);
  int n_sum;
  struct page_sum *sums = cache_sums(&n_sum);
  insert_stream(17, 1), insert_stream(18, 1);
  EXPECT(!has(16, 0) && cache.stats.evicted == 1, "the block two requests hold was evicted");
  for (int i = 0; i < n_sum; i++)
    EXPECT_EQ(pools[sums[i].layer].ref[sums[i].id], 2, "L%d: both requests' references", sums[i].layer);
  EXPECT_EQ(changed_pages(sums, n_sum), 0, "evicted pages still held are intact");
  rt_request_free(r);
  EXPECT_EQ(changed_pages(sums, n_sum), 0, "and after the first request ends");
  for (int i = 0; i < cache.n_sources; i++) {
    int l = cache.sources[i];
    EXPECT_EQ(bad_entries(&c->seq[l], l, 0, c->seq[l].n_entries, SALT_A), 0, "L%d: the hit request reads its entries",
              l);
  }
  rt_request_free(c);
  for (int i = 0; i < n_sum; i++) EXPECT_EQ(pools[sums[i].layer].ref[sums[i].id], 0, "L%d: returned", sums[i].layer);
  free(sums);
  pc_free(&cache);
  teardown("lru in use");
}

/* ---- the table ---------------------------------------------------------------- */

/* Open addressing under growth and churn: a chain of 800 blocks (the table
 * grows) and 3000 one-block prompts through a 100-block cache (tombstones,
 * rehash in place). */
static void test_table(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  cache_init(0, SNAP_BIG, SEED_A);
  const int64_t NB = 800, n = NB * cache.block;
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
  fill_tokens(tok, n, 60);
  make_req(&rq[0], tok, n, n, SALT_A, n);
  EXPECT_EQ(pc_insert(&cache, &rq[0], n), NB, "a long chain");
  rt_request_free(&rq[0]);
  EXPECT(cache.cap > NB && cache.count == NB, "the table grew (cap %" PRId64 ")", cache.cap);
  check_lookup(tok, n, n, NB, "a long chain");
  check_lookup(tok, n, n - 1, NB - 1, "a long chain, one short");
  check_prefix_closed("a long chain");
  check_in_use((int)NB, "a long chain");
  pc_free(&cache);
  free(tok);

  cache_init(100, SNAP_BIG, SEED_A);
  int ins = 0;
  for (int s = 0; s < 3000; s++) ins += (int)insert_stream(1000 + s, 1);
  EXPECT(ins == 3000 && cache.count == 100 && cache.stats.evicted == 2900, "churn: %d inserted, %" PRId64 " cached",
         ins, cache.count);
  EXPECT(4 * (cache.count + cache.tombs) <= 3 * cache.cap,
         "churn: tombstones purged (%" PRId64 " + %" PRId64 " of %" PRId64 ")", cache.count, cache.tombs, cache.cap);
  int found = 0, stale = 0;
  for (int s = 2900; s < 3000; s++) {
    struct pc_hit h;
    lookup_stream(1000 + s, 1, &h);
    found += h.n_blocks == 1;
    pc_release(&cache, &h);
  }
  for (int s = 0; s < 100; s++) stale += has(1000 + s, 0);
  EXPECT(found == 100 && stale == 0, "churn: the last 100 found (%d), the first 100 gone (%d left)", found, stale);
  check_in_use(100, "churn");
  pc_free(&cache);
  teardown("table");
}

/* ---- encoder-SWA snapshots ---------------------------------------------------- */

enum { SALT_D = 37 };

static size_t xe_row(void) { return (size_t)plan.model.hc_streams * (size_t)plan.model.hidden; }

static float *make_xe(int64_t rows, int salt) {
  size_t nf = (size_t)rows * xe_row();
  float *x = malloc(sizeof(float) * (nf + 1));
  for (size_t i = 0; i < nf; i++) x[i] = (float)(salt * 1000 + (int)(i % 997));
  return x;
}

/* What a snapshot at c with `rows` xe rows holds, in bytes (the header:
 * encoder rings with their position tags, ratio > 1 tails, the entries after
 * the last full block, xe). */
static int64_t snap_bytes_expected(int64_t c, int64_t rows) {
  const struct plan_model *m = &plan.model;
  size_t swa_bytes =
      op_fp8_bytes(m->head_dim, m->swa.block, m->swa.scale == PLAN_SCALE_E8M0 ? OP_SCALE_E8M0 : OP_SCALE_FP32);
  int64_t b = rows * (int64_t)(xe_row() * sizeof(float)), B = plan.serving.prefix_block_tokens;
  for (int l = 0; l < plan.n_layers; l++) {
    if (plan.layer[l].region == PLAN_ENCODER) b += (int64_t)plan.model.window * (int64_t)(swa_bytes + sizeof(int64_t));
    if (!pools[l].entry_bytes) continue;
    if (pools[l].ratio > 1) b += (int64_t)(op_comp_tail_floats(pools[l].ratio, plan.model.head_dim) * sizeof(float));
    b += (c / pools[l].ratio - c / B * B / pools[l].ratio) * (int64_t)pools[l].entry_bytes;
  }
  return b;
}

static bool ring_eq(const struct rt_ring *a, const struct rt_ring *b) {
  return a->window == b->window && a->r0 == b->r0 && memcmp(a->pos, b->pos, sizeof(int64_t) * (size_t)a->window) == 0 &&
         memcmp(a->slot, b->slot, (size_t)a->window * a->entry_bytes) == 0;
}

/* d (attached, restored) against ref (what the saved request was) and dref
 * (what d was before: its decoder rings must not move). */
static void check_restored(int64_t c, const char *what) {
  const struct rt_request *a = &rq[0], *ref = &rq[1], *d = &rq[2], *dref = &rq[3];
  for (int l = 0; l < plan.n_layers; l++) {
    bool enc = plan.layer[l].region == PLAN_ENCODER;
    EXPECT(ring_eq(&d->ring[l], enc ? &ref->ring[l] : &dref->ring[l]), "%s c %" PRId64 ": L%d %s", what, c, l,
           enc ? "encoder ring restored" : "decoder ring untouched");
    const struct rt_kv_seq *s = &d->seq[l];
    if (!s->pool) continue;
    int ratio = s->pool->ratio;
    EXPECT_EQ(s->n_entries, c / ratio, "%s c %" PRId64 ": L%d entries", what, c, l);
    EXPECT_EQ(bad_entries(s, l, 0, s->n_entries, SALT_A), 0, "%s c %" PRId64 ": L%d entry bytes", what, c, l);
    int shared = (int)(c / cache.block) * ppb(l);
    for (int k = 0; k < s->n_pages; k++)
      EXPECT((s->page_id[k] == a->seq[l].page_id[k]) == (k < shared), "%s c %" PRId64 ": L%d page %d %s", what, c, l, k,
             k < shared ? "shared" : "fresh");
    EXPECT(d->tail[l].count == ref->tail[l].count && d->tail[l].pos0 == ref->tail[l].pos0,
           "%s c %" PRId64 ": L%d tail count %d pos0 %" PRId64 ", want %d %" PRId64, what, c, l, d->tail[l].count,
           d->tail[l].pos0, ref->tail[l].count, ref->tail[l].pos0);
    if (ratio == 1) continue;
    EXPECT(d->tail[l].v == d->tail_buf[l], "%s c %" PRId64 ": L%d the tail points at its own rows", what, c, l);
    EXPECT(
        memcmp(d->tail_buf[l], ref->tail_buf[l], sizeof(float) * op_comp_tail_floats(ratio, plan.model.head_dim)) == 0,
        "%s c %" PRId64 ": L%d tail rows", what, c, l);
  }
}

/* Save at boundary c, scribble on the saved request, restore into a fresh
 * request attached to the same blocks. */
static void snap_roundtrip(int64_t c, const char *what) {
  const int64_t B = cache.block, n = c + 5, rows = c < plan.serving.replay_decoder ? c : plan.serving.replay_decoder;
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
  fill_tokens(tok, n, 30 + (int)c);
  struct rt_request *a = &rq[0], *d = &rq[2];
  make_req(a, tok, c, c, SALT_A, n);
  make_req(&rq[1], tok, c, c, SALT_A, n);
  EXPECT_EQ(pc_insert(&cache, a, c), c / B, "%s c %" PRId64 ": blocks", what, c);
  float *xe = make_xe(rows, 3);
  struct pc_stats s0 = cache.stats;
  int64_t sb0 = cache.snap_bytes;
  EXPECT_EQ(pc_snapshot_save(&cache, a, xe, rows), 0, "%s c %" PRId64, what, c);
  EXPECT_EQ(cache.stats.snap_saved, s0.snap_saved + 1, "%s c %" PRId64, what, c);
  EXPECT_EQ(cache.snap_bytes - sb0, snap_bytes_expected(c, rows), "%s c %" PRId64 ": snapshot bytes", what, c);
  for (int l = 0; l < plan.n_layers; l++) { /* the snapshot must be a copy */
    fill_ring(&a->ring[l], l, c, 99);
    if (a->seq[l].pool) fill_tail(a, l, c + 1, 99);
  }
  memset(xe, 0, sizeof(float) * (size_t)rows * xe_row()); /* and of the caller's xe */
  free(xe);
  xe = make_xe(rows, 3); /* what was saved, for the comparison */
  struct pc_hit h;
  pc_lookup(&cache, tok, n, c, &h);
  EXPECT_EQ(h.n_blocks, c / B, "%s c %" PRId64 ": hit blocks", what, c);
  EXPECT(h.snap && h.snap->c == c, "%s c %" PRId64 ": the snapshot at c", what, c);
  for (int l = 0; h.snap && l < plan.n_layers; l++)
    EXPECT((h.snap->ring_slot[l] != NULL) == (plan.layer[l].region == PLAN_ENCODER),
           "%s c %" PRId64 ": L%d ring saved iff an encoder layer (SPEC 8.8 #44)", what, c, l);
  if (h.snap) {
    EXPECT(h.snap->xe_rows == rows && memcmp(h.snap->xe, xe, sizeof(float) * (size_t)rows * xe_row()) == 0,
           "%s c %" PRId64 ": xe rows kept", what, c);
    make_req(d, tok, n, 0, SALT_D, n);
    make_req(&rq[3], tok, n, 0, SALT_D, n);
    EXPECT_EQ(pc_attach(&cache, &h, d), 0, "%s c %" PRId64 ": attach", what, c);
    EXPECT_EQ(pc_snapshot_restore(&cache, h.snap, d), 0, "%s c %" PRId64 ": restore", what, c);
    check_restored(c, what);
    rt_request_free(d), rt_request_free(&rq[3]);
  }
  pc_release(&cache, &h);
  rt_request_free(a), rt_request_free(&rq[1]);
  free(xe), free(tok);
}

static void test_snapshots(const char *path, int page, int block, const int64_t *cs, int n_cs) {
  if (!setup(path, page, block)) return;
  cache_init(0, SNAP_BIG, SEED_A);
  for (int i = 0; i < n_cs; i++) snap_roundtrip(cs[i], path);
  EXPECT_EQ(cache.n_snap, n_cs, "%s: one snapshot per boundary", path);
  EXPECT_EQ(cache.stats.snap_evicted, 0, "%s: unbounded pool", path);
  pc_free(&cache);
  teardown(path);
}

/* A lookup of tok[0, n) capped at max_tokens: hit blocks and the snapshot
 * boundary (-1: none). */
static void expect_snap(const int32_t *tok, int64_t n, int64_t max_tokens, int64_t blocks, int64_t want_c,
                        const char *what) {
  struct pc_stats s0 = cache.stats;
  struct pc_hit h;
  pc_lookup(&cache, tok, n, max_tokens, &h);
  EXPECT_EQ(h.n_blocks, blocks, "%s: max_tokens %" PRId64, what, max_tokens);
  EXPECT_EQ(h.snap ? h.snap->c : -1, want_c, "%s: max_tokens %" PRId64 ": snapshot boundary", what, max_tokens);
  EXPECT_EQ(cache.stats.snap_hits, s0.snap_hits + (want_c >= 0), "%s: snap_hits", what);
  EXPECT_EQ(cache.stats.snap_misses, s0.snap_misses + (want_c < 0), "%s: snap_misses", what);
  pc_release(&cache, &h);
}

/* The prompt leaves the conversation inside block 3: the hit has 3 blocks,
 * the newest matching snapshot is at 2B + 1, below the hit's last block.
 * Restoring it would recompute (and re-append) cached block 2, so the
 * lookup does not offer it (prefix_cache.h): the hit takes path (b). */
static void snap_below_hit(const int32_t *tok, int64_t n) {
  const int64_t B = cache.block;
  int32_t t2[4 * 8];
  memcpy(t2, tok, sizeof(int32_t) * (size_t)n);
  t2[3 * B] = (t2[3 * B] + 1) % plan.model.vocab;
  struct pc_hit h;
  pc_lookup(&cache, t2, n, n, &h);
  EXPECT(h.n_blocks == 3 && h.snap == NULL, "a snapshot below the hit is not offered");
  pc_release(&cache, &h);
  EXPECT_EQ(total_pins(), 0, "the whole hit released");
}

/* Boundaries 5, B + 3, 2B + 1, 3B + 2 of one conversation. */
static void test_snap_lookup(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  cache_init(0, SNAP_BIG, SEED_A);
  const int64_t B = cache.block, n = 4 * B, cs[4] = {5, B + 3, 2 * B + 1, 3 * B + 2};
  int32_t tok[4 * 8], t2[4 * 8];
  fill_tokens(tok, n, 40);
  float *xe = make_xe(1, 1);
  for (int i = 0; i < 4; i++) {
    make_req(&rq[i], tok, cs[i], cs[i], SALT_A, n);
    EXPECT_EQ(pc_snapshot_save(&cache, &rq[i], xe, 1), 0, "save at %" PRId64, cs[i]);
  }
  EXPECT_EQ(pc_insert(&cache, &rq[3], 2 * B), 2, "blocks 0 and 1");
  expect_snap(tok, n, n, 2, cs[2], "block 2 not cached: not the snapshot at 3B + 2");
  EXPECT_EQ(pc_insert(&cache, &rq[3], 3 * B), 1, "block 2");
  const int64_t want[][3] = {{n, 3, cs[3]},
                             {3 * B + 2, 3, cs[3]},
                             {3 * B + 1, 3, -1}, /* 2B + 1 is in block 2: its blocks are not the hit's */
                             {2 * B + 1, 2, cs[2]},
                             {2 * B, 2, -1},
                             {B + 3, 1, cs[1]},
                             {B + 2, 1, -1},
                             {5, 0, cs[0]},
                             {4, 0, -1},
                             {0, 0, -1}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    expect_snap(tok, n, want[i][0], want[i][1], want[i][2], "one conversation");
  /* one token off: the block after the hit holds the changed token, so no
   * snapshot there matches, and older boundaries are not used (path (b)) */
  const int64_t off[][3] = {{3 * B, 3, -1}, {2 * B, 2, -1}, {B + 1, 1, -1}, {4, 0, -1}, {0, 0, -1}};
  for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
    memcpy(t2, tok, sizeof tok);
    t2[off[i][0]] = (t2[off[i][0]] + 1) % plan.model.vocab;
    char what[64];
    snprintf(what, sizeof what, "token %" PRId64 " differs", off[i][0]);
    expect_snap(t2, n, n, off[i][1], off[i][2], what);
  }
  snap_below_hit(tok, n);
  cache.seed = SEED_B; /* the same table read under another fingerprint */
  expect_snap(tok, n, n, 0, -1, "another fingerprint");
  cache.seed = SEED_A;
  expect_snap(tok, n, n, 3, cs[3], "the fingerprint back");
  for (int i = 0; i < 4; i++) rt_request_free(&rq[i]);
  free(xe);
  pc_free(&cache);
  teardown("snapshot lookup");
}

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A hit's snapshot must stay the one found until the hit is released, while
 * other requests save theirs (a batch runs lookups and ends of turns
 * interleaved). Pool of 2: rq[0] and rq[1] saved, the hit finds rq[1]'s,
 * then another conversation saves one and the oldest goes. */
static void snap_stability(const int64_t *cs, int64_t rows, int64_t S, const float *xe, const float *xe2) {
  const int64_t n = 5 * (int64_t)plan.serving.prefix_block_tokens;
  cache_init(0, 2 * S + S / 2, SEED_A);
  pc_snapshot_save(&cache, &rq[0], xe, rows), pc_snapshot_save(&cache, &rq[1], xe, rows);
  EXPECT_EQ(pc_insert(&cache, &rq[2], n), 4, "4 blocks");
  struct pc_hit h;
  pc_lookup(&cache, rq[1].tokens, cs[1], cs[1], &h);
  EXPECT(h.snap && h.snap->c == cs[1], "the hit finds the snapshot at %" PRId64, cs[1]);
  uint64_t key = h.snap ? h.snap->key : 0;
  int32_t tok[5 * 8];
  fill_tokens(tok, n, 51); /* another conversation, the same sizes */
  make_req(&rq[3], tok, cs[2], cs[2], SALT_A, n);
  pc_snapshot_save(&cache, &rq[3], xe2, rows);
  rt_request_free(&rq[3]);
  EXPECT(cache.stats.snap_evicted == 1, "the oldest went");
  /* The hit's snapshot is pinned: saves (capacity eviction, same-boundary
   * replacement, growth) and expiry leave it where it is. */
  EXPECT(h.snap && h.snap->key == key && h.snap->c == cs[1],
         "the hit's snapshot changed under it (now c %" PRId64 ")",
         h.snap ? h.snap->c : -1);
  pc_release(&cache, &h);
  pc_free(&cache);
}

/* Capacity (oldest first, too large not kept), one boundary twice, TTL. */
static void test_snap_pool(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  const int64_t B = plan.serving.prefix_block_tokens, n = 5 * B, cs[3] = {2 * B + 3, 3 * B + 3, 4 * B + 3};
  const int64_t rows = plan.serving.replay_decoder; /* <= every c here: equal sizes */
  const int64_t S = snap_bytes_expected(cs[0], rows);
  cache_init(0, 2 * S + S / 2, SEED_A);
  EXPECT(snap_bytes_expected(cs[2], rows) == S, "equal snapshot sizes");
  int32_t tok[5 * 8];
  fill_tokens(tok, n, 50);
  float *xe = make_xe(rows, 1), *xe2 = make_xe(rows, 2);
  for (int i = 0; i < 3; i++) make_req(&rq[i], tok, cs[i], cs[i], SALT_A, n);
  EXPECT_EQ(pc_insert(&cache, &rq[2], n), 4, "4 blocks");
  pc_snapshot_save(&cache, &rq[0], xe, rows), pc_snapshot_save(&cache, &rq[1], xe, rows);
  EXPECT_EQ(cache.n_snap, 2, "two snapshots");
  EXPECT_EQ(pc_snapshot_save(&cache, &rq[2], xe, rows), 0, "a third");
  EXPECT(cache.n_snap == 2 && cache.snap_bytes == 2 * S && cache.stats.snap_evicted == 1, "capacity: one went");
  expect_snap(tok, n, cs[0], 2, -1, "the oldest snapshot went");
  expect_snap(tok, n, cs[1], 3, cs[1], "the second stays");
  expect_snap(tok, n, n, 4, cs[2], "the newest stays");

  int64_t big = 3 * (S / (int64_t)(xe_row() * sizeof(float))) + rows;
  float *xe_big = make_xe(big, 4);
  EXPECT_EQ(pc_snapshot_save(&cache, &rq[0], xe_big, big), 0, "a snapshot larger than the pool");
  EXPECT(cache.n_snap == 2 && cache.stats.snap_saved == 3 && cache.stats.snap_evicted == 1 && cache.snap_bytes == 2 * S,
         "a snapshot larger than the pool is not kept and evicts nothing");
  EXPECT_EQ(pc_snapshot_save(&cache, &rq[2], xe2, rows), 0, "the newest boundary again");
  EXPECT(cache.n_snap == 2 && cache.snap_bytes == 2 * S && cache.stats.snap_evicted == 1, "one boundary, one snapshot");
  struct pc_hit h;
  pc_lookup(&cache, tok, n, n, &h);
  EXPECT(h.snap && h.snap->c == cs[2] && memcmp(h.snap->xe, xe2, sizeof(float) * (size_t)rows * xe_row()) == 0,
         "the newer save of a boundary is kept");
  pc_release(&cache, &h);

  double now = mono_now();
  EXPECT_EQ(pc_snapshot_expire(&cache, now), 0, "nothing older than the TTL yet");
  EXPECT_EQ(pc_snapshot_expire(&cache, now + cache.snap_ttl_s + 1), 2, "past the TTL: all go");
  EXPECT(cache.n_snap == 0 && cache.snap_bytes == 0 && cache.stats.snap_evicted == 3, "expired");
  expect_snap(tok, n, n, 4, -1, "after expiry");
  pc_free(&cache);

  snap_stability(cs, rows, S, xe, xe2);

  cache_init(0, S - 1, SEED_A);
  EXPECT_EQ(pc_snapshot_save(&cache, &rq[0], xe, rows), 0, "a pool smaller than one snapshot");
  EXPECT(cache.n_snap == 0 && cache.snap_bytes == 0 && cache.stats.snap_saved == 0, "nothing kept");
  pc_free(&cache);
  plan.serving.swa_pool_fraction = 0; /* a plan that turns the pool off */
  cache_init(0, -1, SEED_A);
  pc_snapshot_save(&cache, &rq[0], xe, rows);
  /* A capacity of 0 (swa_pool_fraction 0) keeps nothing. */
  EXPECT(cache.n_snap == 0,
         "swa_pool_fraction 0 kept %d snapshot(s)",
         cache.n_snap);
  pc_free(&cache);
  for (int i = 0; i < 3; i++) rt_request_free(&rq[i]);
  free(xe), free(xe2), free(xe_big);
  teardown("snapshot pool");
}

int main(void) {
  test_init();
  test_keys();
  test_hit("tests/oracle/plans/tiny.yaml", 4, 8);
  test_hit("plans/v41-mini.yaml", 0, 0);
  test_insert_rules();
  test_lru();
  test_lru_leaves();
  test_lru_in_use();
  test_table();
  static const int64_t tiny_cs[] = {5, 6, 8, 21, 22, 24}, mini_cs[] = {37, 256, 293};
  test_snapshots("tests/oracle/plans/tiny.yaml", 4, 8, tiny_cs, 6);
  test_snapshots("plans/v41-mini.yaml", 0, 0, mini_cs, 3);
  test_snap_lookup();
  test_snap_pool();
  return h_report("prefix_cache");
}
