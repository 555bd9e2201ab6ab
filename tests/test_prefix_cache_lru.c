/* test_prefix_cache_lru.c: eviction and the hash table of the global prefix
 * cache (runtime/cache/prefix_cache.h), with synthetic state
 * (tests/prefix_cache_fixture.h): no weights, no forward.
 *
 *  - LRU: evicts the least recently used unpinned leaf, never a block with a
 *    cached successor, never a pinned one (a lookup not yet released); with
 *    everything pinned the insert stops; the block being extended is never
 *    evicted to make room for its child; a re-insert counts as a use; the
 *    cached set stays prefix-closed; evicted pages go back to the pool unless
 *    a request still holds them (then they stay valid, bytes intact);
 *  - the table: an 800-block chain (growth) and 3000 prompts through a
 *    100-block cache (tombstones);
 *  - stats counters (struct pc_stats) after each step.
 *
 * One check guards a bug this test found first: an insert that inserts
 * nothing must not evict.
 *
 * Not tested here: insert and attach as such (test_prefix_cache_attach.c),
 * snapshots (test_prefix_cache_snap.c), the hit paths that run the model
 * (runtime/serve.c), the disk tier, concurrency.
 * Run: ctest --test-dir build -R '^prefix_cache_lru$', or
 * build/tests/test_prefix_cache_lru from the repository root.
 */
#include "tests/prefix_cache_fixture.h"

/* The cases' requests (large structs: kept off the stack). */
static struct rt_request rq[5];

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

int main(void) {
  test_lru();
  test_lru_leaves();
  test_lru_in_use();
  test_table();
  return h_report("prefix_cache_lru");
}
