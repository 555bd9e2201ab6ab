/* test_state.c: the request state module (runtime/model/state.h), no weights.
 *
 *  - page pools: alloc gives refcount 1, ref/unref count, a page returns to
 *    the pool at 0 and the next alloc reuses it (no new memory);
 *  - rt_kv_append across page boundaries, in odd batch sizes: every entry
 *    lands where rt_kv_entry and rt_kv_view say, its bytes intact,
 *    n_entries published; an append that would overflow the table reserved
 *    by rt_request_init fails and leaves the sequence (entries, pages, pool)
 *    unchanged; rt_request_free returns every page;
 *  - SWA rings: slot = p mod window, each slot remembers its absolute
 *    position (never the slot number), reset forgets all and sets r0;
 *  - token history: max_tokens ids fit, one more is refused, nothing moves;
 *  - accounting: rt_request_bytes agrees exactly with plan_cost_compute
 *    (scheduler/plan_cost.h) for plans/v41-flash.yaml, v41-mini.yaml and
 *    dense-40.yaml at several lengths (odd ones included), with synthetic
 *    entries floor(N / ratio) per source; the flash formats give 356 B per
 *    source entry (SPEC 8.7 #31, #33) and SPEC 4.5's SWA figure (#35).
 *
 * Not tested here: what the entries mean (the ops and tests/test_ops_*),
 * the executor writing them (runtime/gen/generate.h), pool exhaustion by a
 * failing allocator (not reachable without a fault-injecting malloc).
 * Run: ctest --test-dir build -R '^state$', or build/tests/test_state from
 * the repository root.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/formats.h"
#include "base/check.h"
#include "runtime/model/state.h"
#include "scheduler/plan.h"
#include "scheduler/plan_cost.h"
#include "tests/harness.h"

/* Large structs (PLAN_MAX_LAYERS arrays): kept off the stack. */
static struct plan plan;
static struct rt_kv_pool pools[PLAN_MAX_LAYERS];
static struct rt_request req;
static struct plan_cost cost;

static bool load(const char *path) {
  return h_load_plan(path, &plan);
}

static bool init_pools(const char *what) {
  char err[256] = "";
  int rc = rt_kv_pools_init(pools, &plan, err, sizeof err);
  EXPECT(rc == 0, "%s: rt_kv_pools_init: %d %s", what, rc, err);
  return rc == 0;
}

/* The first KV source of a region (-1 when none). */
static int first_source(enum plan_region r) {
  for (int l = 0; l < plan.n_layers; l++)
    if (plan.layer[l].region == r && plan_is_kv_source(&plan.layer[l])) return l;
  return -1;
}

/* The byte of synthetic entry e at offset i: differs between neighbours in
 * both e and i, so a misplaced or shifted entry shows. */
static uint8_t pat(int64_t e, size_t i, int salt) {
  uint64_t x = (uint64_t)e * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + (uint64_t)salt * 0x94D049BB133111EBull;
  x ^= x >> 29;
  return (uint8_t)(x ^ (x >> 17));
}

static void fill_entries(uint8_t *buf, int64_t e0, int n, size_t eb, int salt) {
  for (int k = 0; k < n; k++)
    for (size_t i = 0; i < eb; i++) buf[(size_t)k * eb + i] = pat(e0 + k, i, salt);
}

static bool entry_ok(const uint8_t *p, int64_t e, size_t eb, int salt) {
  for (size_t i = 0; i < eb; i++)
    if (p[i] != pat(e, i, salt)) return false;
  return true;
}

/* ---- pools ---------------------------------------------------------------- */

static void test_pool(void) {
  if (!load("plans/v41-mini.yaml")) return;
  if (!init_pools("mini")) goto out;
  int l = first_source(PLAN_ENCODER);
  struct rt_kv_pool *pool = &pools[l];
  EXPECT_EQ(pool->ratio, plan.layer[l].ratio, "pool ratio");
  EXPECT_EQ(pool->page_entries, plan.serving.page_tokens / plan.layer[l].ratio, "page entries");
  EXPECT_EQ(pool->entry_bytes, pool->main_bytes + pool->idx_bytes, "entry = main + indexer");
  EXPECT_EQ(pools[0].entry_bytes, 0, "an SWA-only layer has no pool");

  int32_t a = rt_kv_page_alloc(pool), b = rt_kv_page_alloc(pool), c = rt_kv_page_alloc(pool);
  EXPECT(a >= 0 && b >= 0 && c >= 0 && a != b && b != c && a != c, "three distinct pages: %d %d %d", a, b, c);
  EXPECT_EQ(pool->pages_in_use, 3, "after 3 allocs");
  EXPECT_EQ(pool->ref[a], 1, "a fresh page has refcount 1");
  rt_kv_page_ref(pool, b);
  EXPECT_EQ(pool->ref[b], 2, "ref");
  rt_kv_page_unref(pool, b);
  EXPECT_EQ(pool->ref[b], 1, "unref to 1");
  EXPECT_EQ(pool->pages_in_use, 3, "a page with refs left stays in use");
  EXPECT_EQ(pool->n_free, 0, "nothing freed yet");
  uint8_t *mem_b = pool->page[b];
  rt_kv_page_unref(pool, b);
  EXPECT_EQ(pool->ref[b], 0, "unref to 0");
  EXPECT_EQ(pool->pages_in_use, 2, "the page returned");
  EXPECT_EQ(pool->n_free, 1, "one free page");
  int n_pages = pool->n_pages;
  int32_t d = rt_kv_page_alloc(pool);
  EXPECT_EQ(d, b, "the freed page is reused");
  EXPECT(pool->page[d] == mem_b, "the reused page keeps its memory");
  EXPECT_EQ(pool->n_pages, n_pages, "reuse allocates no new page");
  EXPECT_EQ(pool->ref[d], 1, "a reused page has refcount 1");
  /* Many pages: the pool grows past its first capacity and keeps old ones. */
  uint8_t *mem_a = pool->page[a];
  int32_t ids[100];
  for (int i = 0; i < 100; i++) ids[i] = rt_kv_page_alloc(pool);
  EXPECT(pool->page[a] == mem_a, "growing the pool keeps page memory in place");
  EXPECT_EQ(pool->pages_in_use, 103, "after 100 more allocs");
  for (int i = 0; i < 100; i++) rt_kv_page_unref(pool, ids[i]);
  rt_kv_page_unref(pool, a);
  rt_kv_page_unref(pool, c);
  rt_kv_page_unref(pool, d);
  EXPECT_EQ(pool->pages_in_use, 0, "every page returned");
  EXPECT_EQ(pool->n_free, pool->n_pages, "every slot free");
  rt_kv_pools_free(pools, plan.n_layers);
out:
  plan_free(&plan);
}

/* ---- appends ---------------------------------------------------------------- */

/* Every committed entry of s is where both accessors say and intact. */
static void check_seq(const struct rt_kv_seq *s, int salt, const char *what) {
  const struct rt_kv_pool *pool = s->pool;
  struct op_kv_view v = rt_kv_view(s);
  EXPECT_EQ(v.n_entries, s->n_entries, what);
  EXPECT_EQ(v.page_entries, pool->page_entries, what);
  EXPECT_EQ(v.entry_bytes, pool->entry_bytes, what);
  EXPECT_EQ(v.main_off, 0, what);
  EXPECT_EQ(v.idx_off, pool->main_bytes, what);
  EXPECT_EQ(v.ratio, pool->ratio, what);
  int bad = 0;
  for (int64_t e = 0; e < s->n_entries; e++) {
    const uint8_t *p = rt_kv_entry(s, e);
    const uint8_t *q = v.pages[e / v.page_entries] + (size_t)(e % v.page_entries) * v.entry_bytes;
    if (p != q || !entry_ok(p, e, pool->entry_bytes, salt)) bad++;
  }
  EXPECT(bad == 0, "%s: %d of %" PRId64 " entries misplaced or damaged", what, bad, s->n_entries);
}

/* Append in odd batch sizes across page boundaries up to the reserved
 * capacity, then overflow. */
static void append_source(int l, int64_t max_tokens) {
  struct rt_kv_seq *s = &req.seq[l];
  struct rt_kv_pool *pool = s->pool;
  char what[64];
  snprintf(what, sizeof what, "L%d append", l);
  EXPECT(pool == &pools[l], "%s: the sequence uses its source's pool", what);
  int64_t cap = (int64_t)s->cap_pages * pool->page_entries;
  EXPECT(cap >= max_tokens / pool->ratio, "%s: capacity %" PRId64 " below max_tokens / ratio", what, cap);
  size_t eb = pool->entry_bytes;
  uint8_t *buf = malloc(eb * (size_t)cap);
  static const int batch[] = {1, 2, 7, 31, 33, 64, 65, 3};
  int k = 0;
  while (s->n_entries < cap) {
    int n = batch[k++ % 8];
    if (n > cap - s->n_entries) n = (int)(cap - s->n_entries);
    int64_t e0 = s->n_entries;
    fill_entries(buf, e0, n, eb, l);
    EXPECT(rt_kv_append(s, buf, n) == 0, "%s: %d entries at %" PRId64, what, n, e0);
    EXPECT_EQ(s->n_entries, e0 + n, what);
    EXPECT_EQ(s->n_pages, (s->n_entries + pool->page_entries - 1) / pool->page_entries, what);
    check_seq(s, l, what);
  }
  /* Full: one more entry, or a batch that would straddle the end, fails. */
  int n_pages = s->n_pages;
  int64_t in_use = pool->pages_in_use;
  fill_entries(buf, cap, 1, eb, l + 1000);
  EXPECT(rt_kv_append(s, buf, 1) == CEDAR_ENOMEM, "%s: append past the reserved table", what);
  EXPECT_EQ(s->n_entries, cap, "a failed append commits nothing");
  EXPECT_EQ(s->n_pages, n_pages, "a failed append keeps the page table");
  EXPECT_EQ(pool->pages_in_use, in_use, "a failed append holds no page");
  check_seq(s, l, "after a failed append");
  free(buf);
}

/* A failing append in the middle of a page table (not only at the end). */
static void append_straddle(int l) {
  struct rt_kv_seq *s = &req.seq[l];
  struct rt_kv_pool *pool = s->pool;
  int64_t cap = (int64_t)s->cap_pages * pool->page_entries;
  int64_t start = cap - pool->page_entries - 3; /* 3 into the last-but-one page */
  size_t eb = pool->entry_bytes;
  uint8_t *buf = malloc(eb * (size_t)cap);
  fill_entries(buf, 0, (int)start, eb, 7);
  EXPECT(rt_kv_append(s, buf, (int)start) == 0, "L%d: %" PRId64 " entries at once", l, start);
  int n_pages = s->n_pages;
  int64_t in_use = pool->pages_in_use;
  fill_entries(buf, start, (int)(cap - start + 1), eb, 7);
  EXPECT(rt_kv_append(s, buf, (int)(cap - start + 1)) == CEDAR_ENOMEM, "L%d: a batch one past the end", l);
  EXPECT_EQ(s->n_entries, start, "the straddling batch commits nothing");
  EXPECT_EQ(s->n_pages, n_pages, "the straddling batch allocates no page");
  EXPECT_EQ(pool->pages_in_use, in_use, "the straddling batch holds no page");
  check_seq(s, 7, "after a straddling failure");
  EXPECT(rt_kv_append(s, buf, (int)(cap - start)) == 0, "L%d: exactly to the end", l);
  check_seq(s, 7, "filled to the end");
  free(buf);
}

static void test_append(void) {
  if (!load("plans/v41-mini.yaml")) return;
  if (!init_pools("mini")) goto out;
  int enc = first_source(PLAN_ENCODER), dec = first_source(PLAN_DECODER);
  int64_t max_tokens = 301; /* odd: the encoder table holds floor(301/2)+1 entries, rounded up to pages */
  EXPECT(rt_request_init(&req, 1, &plan, pools, max_tokens) == 0, "request init");
  EXPECT_EQ(req.pending, -1, "no pending token");
  EXPECT_EQ(req.n_pos, 0, "no position run");
  for (int l = 0; l < plan.n_layers; l++)
    EXPECT((req.seq[l].pool != NULL) == plan_is_kv_source(&plan.layer[l]), "L%d: a sequence iff a source", l);
  append_source(enc, max_tokens);
  append_source(dec, max_tokens);
  int64_t held = pools[enc].pages_in_use;
  EXPECT_EQ(held, req.seq[enc].n_pages, "the encoder pool's pages are this request's");
  rt_request_free(&req);
  EXPECT_EQ(pools[enc].pages_in_use, 0, "freeing the request returns its encoder pages");
  EXPECT_EQ(pools[dec].pages_in_use, 0, "freeing the request returns its decoder pages");

  /* A second request reuses the freed pages, and fails cleanly mid-table. */
  int before = pools[enc].n_pages;
  EXPECT(rt_request_init(&req, 2, &plan, pools, max_tokens) == 0, "request init");
  append_straddle(enc);
  EXPECT_EQ(pools[enc].n_pages, before, "a new request reuses freed pages");
  rt_request_free(&req);
  EXPECT_EQ(pools[enc].pages_in_use, 0, "every page returned");
  rt_kv_pools_free(pools, plan.n_layers);
out:
  plan_free(&plan);
}

/* ---- rings and tokens ------------------------------------------------------ */

static void test_ring(void) {
  if (!load("plans/v41-mini.yaml")) return;
  if (!init_pools("mini")) goto out;
  int64_t max_tokens = 40;
  EXPECT(rt_request_init(&req, 3, &plan, pools, max_tokens) == 0, "request init");
  struct rt_ring *g = &req.ring[5];
  int W = plan.model.window;
  EXPECT_EQ(g->window, W, "ring window");
  EXPECT_EQ(g->entry_bytes, plan_format_bytes(&plan.model.swa, plan.model.head_dim), "ring entry size");
  EXPECT_EQ(g->r0, 0, "a new ring starts at 0");
  int empty = 0;
  for (int i = 0; i < W; i++) empty += g->pos[i] == -1;
  EXPECT_EQ(empty, W, "a new ring is empty");
  uint8_t *e = malloc(g->entry_bytes);
  int64_t last = 3 * W + 17;
  for (int64_t p = 0; p <= last; p++) {
    fill_entries(e, p, 1, g->entry_bytes, 99);
    rt_ring_put(g, p, e);
    EXPECT_EQ(g->pos[p % W], p, "the slot remembers the absolute position");
  }
  /* Slot s holds the latest p <= last with p mod W == s, bytes intact. */
  int bad = 0;
  for (int s = 0; s < W; s++) {
    int64_t p = last - ((last - s) % W);
    if (g->pos[s] != p || !entry_ok(g->slot + (size_t)s * g->entry_bytes, p, g->entry_bytes, 99)) bad++;
  }
  EXPECT(bad == 0, "%d ring slots hold the wrong position or bytes", bad);
  /* Other layers' rings are untouched (SPEC 8.1 #4: no shared rings). */
  EXPECT_EQ(req.ring[4].pos[0], -1, "a neighbour ring stays empty");
  EXPECT(req.ring[4].slot != g->slot, "rings do not share memory");
  rt_ring_reset(g, 77);
  empty = 0;
  for (int i = 0; i < W; i++) empty += g->pos[i] == -1;
  EXPECT_EQ(empty, W, "reset forgets every entry");
  EXPECT_EQ(g->r0, 77, "reset sets the replay start");
  rt_ring_put(g, 77 + W, e); /* slot 77: position 205, never 77 */
  EXPECT_EQ(g->pos[77], 77 + W, "after reset, a slot takes the new absolute position");
  free(e);

  /* Tokens: max_tokens fit, one more is refused. */
  for (int i = 0; i < max_tokens; i++) EXPECT(rt_request_push_token(&req, 1000 + i) == 0, "token %d", i);
  EXPECT(rt_request_push_token(&req, 5) == CEDAR_EINVAL, "a token past max_tokens is refused");
  EXPECT_EQ(req.n_tokens, max_tokens, "the refused token is not counted");
  bad = 0;
  for (int i = 0; i < max_tokens; i++) bad += req.tokens[i] != 1000 + i;
  EXPECT(bad == 0, "%d token ids changed", bad);
  rt_request_free(&req);
  rt_kv_pools_free(pools, plan.n_layers);
out:
  plan_free(&plan);
}

/* ---- accounting against plan cost ---------------------------------------- */

/* Append synthetic entries until each source holds floor(N / ratio). */
static void grow_to(int64_t N) {
  for (int l = 0; l < plan.n_layers; l++) {
    struct rt_kv_seq *s = &req.seq[l];
    if (!s->pool) continue;
    int64_t want = N / s->pool->ratio, n = want - s->n_entries;
    if (n <= 0) continue;
    uint8_t *buf = malloc(s->pool->entry_bytes * (size_t)n);
    fill_entries(buf, s->n_entries, (int)n, s->pool->entry_bytes, l);
    EXPECT(rt_kv_append(s, buf, (int)n) == 0, "L%d: grow to %" PRId64, l, want);
    free(buf);
  }
}

static void compare_at(int64_t N, const char *path) {
  struct plan_cost_query q;
  plan_cost_query_init(&q);
  q.tokens = N;
  q.prompt = N > 0 ? N : 1;
  EXPECT(plan_cost_compute(&plan, &q, &cost) == 0, "%s: plan cost at %" PRId64 ": %s", path, N, cost.error);
  struct rt_state_bytes b;
  rt_request_bytes(&req, &b);
  char what[96];
  snprintf(what, sizeof what, "%s N=%" PRId64, path, N);
  EXPECT_EQ(b.kv_entries, cost.entries, what);
  EXPECT_EQ(b.kv_entry_bytes, cost.bytes, what);
  EXPECT_EQ(b.swa_bytes, cost.swa_payload_bytes + cost.swa_scale_bytes, what);
  EXPECT_EQ(b.tail_bytes, cost.tail_bytes, what);
  EXPECT_EQ(b.token_bytes, req.max_tokens * 4, what);
  /* Pages: whole pages, at most one partly used per source. */
  int64_t slack = 0;
  for (int k = 0; k < cost.n_sources; k++) {
    const struct plan_cost_source *src = &cost.src[k];
    const struct rt_kv_seq *s = &req.seq[src->layer];
    EXPECT(s->pool != NULL, "%s: plan cost's source L%d has no sequence", what, src->layer);
    if (!s->pool) continue;
    EXPECT_EQ(s->n_entries, src->entries, what);
    EXPECT_EQ(s->pool->main_bytes, src->main_bytes, what);
    EXPECT_EQ(s->pool->idx_bytes, src->indexer_bytes, what);
    EXPECT_EQ(s->pool->entry_bytes, src->entry_bytes, what);
    slack += (int64_t)s->pool->page_entries * src->entry_bytes;
  }
  EXPECT(b.kv_page_bytes >= b.kv_entry_bytes && b.kv_page_bytes < b.kv_entry_bytes + slack + (N == 0),
         "%s: page bytes %" PRId64 " outside [%" PRId64 ", +%" PRId64 ")", what, b.kv_page_bytes, b.kv_entry_bytes,
         slack);
}

static void test_bytes(const char *path, bool flash) {
  if (!load(path)) return;
  if (!init_pools(path)) goto out;
  int n_src = 0;
  for (int l = 0; l < plan.n_layers; l++) n_src += pools[l].entry_bytes != 0;
  static const int64_t Ns[] = {0, 1, 2, 3, 127, 128, 129, 1023, 1024, 1025, 4097};
  int64_t max_tokens = 4097;
  EXPECT(rt_request_init(&req, 4, &plan, pools, max_tokens) == 0, "%s: request init", path);
  for (size_t i = 0; i < sizeof Ns / sizeof Ns[0]; i++) {
    grow_to(Ns[i]);
    compare_at(Ns[i], path);
  }
  EXPECT_EQ(n_src, cost.n_sources, path);
  if (flash) {
    /* SPEC 8.7 #31, #33, #35. */
    for (int l = 0; l < plan.n_layers; l++) {
      if (!pools[l].entry_bytes) continue;
      EXPECT_EQ(pools[l].main_bytes, 288, "flash Main KV entry");
      EXPECT_EQ(pools[l].idx_bytes, 68, "flash Indexer K entry");
      EXPECT_EQ(pools[l].entry_bytes, 356, "flash source entry");
    }
    struct rt_state_bytes b;
    rt_request_bytes(&req, &b);
    EXPECT_EQ(b.kv_entry_bytes, 356 * (3 * (4097 / 2) + 4097), "SPEC 8.7 #33 at n = 4097");
    EXPECT_EQ(b.swa_bytes, 40 * 128 * 528, "flash rings: 40 x 128 x (512 payload + 16 E8M0 scales)");
  }
  rt_request_free(&req);
  rt_kv_pools_free(pools, plan.n_layers);
out:
  plan_free(&plan);
}

int main(void) {
  test_pool();
  test_append();
  test_ring();
  test_bytes("plans/v41-flash.yaml", true);
  test_bytes("plans/v41-mini.yaml", false);
  test_bytes("plans/dense-40.yaml", false);
  return h_report("state");
}
