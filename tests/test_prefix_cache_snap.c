/* test_prefix_cache_snap.c: the encoder-SWA snapshot pool of the global
 * prefix cache (runtime/cache/prefix_cache.h), with synthetic state
 * (tests/prefix_cache_fixture.h): no weights, no forward.
 *
 *  - snapshots: save then restore into a request attached to the same blocks
 *    reproduces every encoder ring (slots, positions, r0), every source's
 *    tail (count, pos0, rows) and the entries after the last full block, at
 *    odd and even boundaries below, above and at multiples of the block
 *    (tiny.yaml with 8-token blocks, v41-mini.yaml with 256-token ones); no
 *    decoder ring is saved or touched (SPEC 5.2, 8.8 #44); the snapshot is a
 *    copy; the xe rows are kept; the bytes counted are what it holds;
 *  - lookup picks the largest matching boundary <= max_tokens whose full
 *    blocks are cached, never one whose prefix differs by one token; a
 *    snapshot below the hit restores into a request attached to its own
 *    blocks only; a table built under one fingerprint never hits under
 *    another;
 *  - the pool: TTL expiry, oldest-first capacity eviction, a snapshot larger
 *    than the pool is not kept, one boundary saved twice keeps the newer;
 *  - stats counters (struct pc_stats) after each step.
 *
 * Two checks guard bugs this test found first: a hit's snapshot must not
 * change under it (it is pinned); a swa_pool_fraction of 0 keeps nothing
 * (not "no limit").
 *
 * Not tested here: blocks without snapshots (test_prefix_cache_attach.c,
 * test_prefix_cache_lru.c), the hit paths that run the model
 * (runtime/serve.c), the disk tier, concurrency.
 * Run: ctest --test-dir build -R '^prefix_cache_snap$', or
 * build/tests/test_prefix_cache_snap from the repository root.
 */
#include "tests/prefix_cache_fixture.h"

/* The cases' requests (large structs: kept off the stack). */
static struct rt_request rq[5];

/* ---- encoder-SWA snapshots ---------------------------------------------------- */

enum { SALT_D = 37 };

static size_t xe_row(void) { return rt_xe_row_floats(&plan.model); }

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
  static const int64_t tiny_cs[] = {5, 6, 8, 21, 22, 24}, mini_cs[] = {37, 256, 293};
  test_snapshots("tests/oracle/plans/tiny.yaml", 4, 8, tiny_cs, 6);
  test_snapshots("plans/v41-mini.yaml", 0, 0, mini_cs, 3);
  test_snap_lookup();
  test_snap_pool();
  return h_report("prefix_cache_snap");
}
