/* test_prefix_cache_attach.c: insert, lookup and attach of the global prefix
 * cache (runtime/cache/prefix_cache.h), with synthetic state
 * (tests/prefix_cache_fixture.h): no weights, no forward.
 *
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
 *  - stats counters (struct pc_stats) after each step.
 *
 * Not tested here: keys (test_prefix_cache_keys.c), eviction
 * (test_prefix_cache_lru.c), snapshots (test_prefix_cache_snap.c), the hit
 * paths that run the model (runtime/serve.c), the disk tier, concurrency.
 * Run: ctest --test-dir build -R '^prefix_cache_attach$', or
 * build/tests/test_prefix_cache_attach from the repository root.
 */
#include "tests/prefix_cache_fixture.h"

/* The cases' requests (large structs: kept off the stack). */
static struct rt_request rq[5];

/* ---- insert, lookup, attach ----------------------------------------------- */

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

int main(void) {
  test_hit("tests/oracle/plans/tiny.yaml", 4, 8);
  test_hit("plans/v41-mini.yaml", 0, 0);
  test_insert_rules();
  return h_report("prefix_cache_attach");
}
