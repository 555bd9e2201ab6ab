/* test_prefix_hit.c: prefix hits end to end (issue 6; SPEC 5.4, 6.5, 8.8):
 * a second turn of a conversation through the prefix cache against the same
 * conversation kept live in memory (rt_continue).
 *
 *   path (a)  global blocks + the encoder snapshot at the end of turn 1:
 *             the prefill continues from exactly the state the live request
 *             holds, so logits, tokens and every state object must be
 *             BITWISE those of the live continuation (the same tiles run on
 *             the same inputs).
 *   path (b)  global blocks only: the encoder replays [c - W_enc, c) with
 *             global writes off; its drift against the live continuation is
 *             measured and printed (SPEC 6.5: recovery is approximate), and
 *             the counts (encoder replay and suffix, decoder replay and its
 *             cached part, new entries) are asserted.
 *   always    a hit never rewrites or re-appends a cached entry: checksums of
 *             every cached page before and after (SPEC 5.4, 8.8 #49); pages
 *             return to the pools at the end.
 *
 * Plans: tests/oracle/plans/tiny-40.yaml (the V4.1 schedule at toy widths:
 * window 16, replay 24) and tiny.yaml, with pages of 4 tokens and blocks of
 * 8 so that a 50-token conversation spans several blocks.
 * Run: ctest --test-dir build -R prefix_hit --output-on-failure
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ops/basic.h"
#include "ops/sample.h"
#include "base/check.h"
#include "runtime/gen/generate.h"
#include "runtime/cache/prefix_cache.h"
#include "tests/harness.h"

static char err[1024];

struct fx {
  struct plan p;
  struct weights w;
  struct rt_model M;
  struct rt_kv_pool pools[PLAN_MAX_LAYERS];
  bool ok;
};

static bool fx_open(struct fx *f, const char *path) {
  memset(f, 0, sizeof(*f));
  if (!h_load_plan(path, &f->p)) return false;
  f->p.serving.page_tokens = 4;        /* several blocks in a short conversation */
  f->p.serving.prefix_block_tokens = 8;
  f->ok = !weights_synth(&f->w, &f->p, 11, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) &&
          !rt_model_init(&f->M, &f->p, &f->w, err, sizeof err) && !rt_kv_pools_init(f->pools, &f->p, err, sizeof err);
  EXPECT(f->ok, "%s: %s", path, err);
  return f->ok;
}

static void fx_close(struct fx *f) {
  for (int l = 0; l < f->p.n_layers; l++)
    if (f->pools[l].entry_bytes) EXPECT_EQ(f->pools[l].pages_in_use, 0, "L%d: every page returned", l);
  rt_kv_pools_free(f->pools, f->p.n_layers);
  rt_model_free(&f->M);
  weights_free(&f->w);
  plan_free(&f->p);
}

static void tokens(int32_t *t, int n, int vocab, uint64_t seed) {
  for (int i = 0; i < n; i++) t[i] = (int32_t)(op_rng_next(&seed) % (uint64_t)vocab);
}

/* XXH3 of the pages of every block the cache holds now, by slot; blocks
 * inserted later are not in the list (keys[i] == 0 ends it). */
struct sums {
  uint64_t key[256], sum[256];
  int n;
};

static uint64_t block_sum(const struct pc_cache *c, const struct pc_block *b) {
  uint64_t h = 0;
  for (int s = 0, k = 0; s < c->n_sources; s++) {
    int l = c->sources[s];
    for (int j = 0; j < c->pages_per_block[l]; j++, k++)
      h = XXH3_64bits_withSeed(c->pools[l].page[b->pages[k]], (size_t)c->pools[l].page_entries * c->pools[l].entry_bytes,
                               h);
  }
  return h;
}

static void cache_sums(const struct pc_cache *c, struct sums *s) {
  s->n = 0;
  for (int64_t i = 0; i < c->cap && s->n < 256; i++)
    if (c->tab[i].used) {
      s->key[s->n] = c->tab[i].key;
      s->sum[s->n++] = block_sum(c, &c->tab[i]);
    }
}

/* Every block of `before` still cached, with the same bytes. */
static bool cache_unchanged(const struct pc_cache *c, const struct sums *before) {
  for (int i = 0; i < before->n; i++) {
    bool found = false;
    for (int64_t k = 0; k < c->cap; k++)
      if (c->tab[k].used && c->tab[k].key == before->key[i]) {
        found = true;
        if (block_sum(c, &c->tab[k]) != before->sum[i]) return false;
      }
    if (!found) return false;
  }
  return true;
}

static bool seq_equal(const struct rt_kv_seq *a, const struct rt_kv_seq *b, int64_t from) {
  if (a->n_entries != b->n_entries) return false;
  for (int64_t e = from; e < a->n_entries; e++)
    if (memcmp(rt_kv_entry(a, e), rt_kv_entry(b, e), a->pool->entry_bytes)) return false;
  return true;
}

static bool ring_equal(const struct rt_ring *a, const struct rt_ring *b) {
  return a->r0 == b->r0 && !memcmp(a->pos, b->pos, sizeof(int64_t) * (size_t)a->window) &&
         !memcmp(a->slot, b->slot, (size_t)a->window * a->entry_bytes);
}

/* Logits: max |a - b| and whether the argmax agrees. */
static double drift(const float *a, const float *b, int V, bool *same_top) {
  double m = 0;
  int ia = 0, ib = 0;
  for (int i = 0; i < V; i++) {
    m = fmax(m, fabs((double)a[i] - b[i]));
    if (a[i] > a[ia]) ia = i;
    if (b[i] > b[ib]) ib = i;
  }
  *same_top = ia == ib;
  return m;
}

/* Turn 1 (n1 tokens, 4 generated) then turn 2 (its history plus `extra`
 * new tokens) through the cache; the same turn 2 continued live. */
static void conversation(const char *path, int n1, int extra, bool snapshots) {
  struct fx f;
  if (!fx_open(&f, path)) {
    fx_close(&f);
    return;
  }
  const int V = f.p.model.vocab, gen = 4;
  struct pc_cache cache;
  CEDAR_ASSERT(pc_init(&cache, &f.p, f.pools, f.w.list.fingerprint, 0, snapshots ? (int64_t)1 << 30 : 0, err,
                       sizeof err) == 0);
  int32_t *p2 = malloc(sizeof(int32_t) * (size_t)(n1 + gen + extra));
  tokens(p2, n1, V, 5);
  struct rt_gen_opts go = {.replay = -1, .max_new = gen, .top_p = 1, .cache = &cache, .save_snapshot = true,
                           .reserve = gen + extra + 8};
  struct rt_request live, hit;
  struct rt_gen_result g1, g2, gl;
  CEDAR_ASSERT(rt_generate(&f.M, f.pools, &live, p2, n1, &go, &g1, err, sizeof err) == 0);
  EXPECT_EQ(live.n_pos, n1 + gen - 1, "%s: turn 1 consumed all but the last sampled token", path);
  for (int i = 0; i < gen; i++) p2[n1 + i] = g1.tokens[i];
  tokens(p2 + n1 + gen, extra, V, 6);
  const int n2 = n1 + gen + extra;
  const int64_t c_end = live.n_pos, B = cache.block;

  struct sums before;
  cache_sums(&cache, &before);
  struct rt_gen_opts go2 = go;
  go2.save_snapshot = false;
  CEDAR_ASSERT(rt_generate(&f.M, f.pools, &hit, p2, n2, &go2, &g2, err, sizeof err) == 0);
  EXPECT(before.n > 0 && cache_unchanged(&cache, &before), "%s: a hit rewrote a cached page (SPEC 5.4)", path);
  struct rt_gen_opts gol = {.replay = -1, .max_new = gen, .top_p = 1};
  CEDAR_ASSERT(rt_continue(&f.M, &live, p2 + c_end, n2 - c_end, &gol, &gl, err, sizeof err) == 0);

  const struct rt_hit_report *h = &g2.hit;
  int64_t c = snapshots ? c_end : c_end / B * B;
  EXPECT_EQ(h->global_hit, c_end / B * B, "%s: global hit in whole blocks", path);
  EXPECT_EQ(h->hit, c, "%s: the boundary the prefill continued from", path);
  EXPECT(h->swa_hit == snapshots, "%s: path %s expected", path, snapshots ? "(a)" : "(b)");
  int64_t W = f.p.serving.replay_encoder; /* resolved by plan_load */
  int64_t e0 = snapshots ? c : (c > W ? c - W : 0);
  int64_t R = f.p.serving.replay_decoder < n2 ? f.p.serving.replay_decoder : n2;
  EXPECT_EQ(h->encoder_replay, c - e0, "%s: encoder replay", path);
  EXPECT_EQ(h->encoder_positions, n2 - e0, "%s: encoder positions", path);
  EXPECT_EQ(h->decoder_replay, R, "%s: decoder replay", path);
  EXPECT_EQ(h->decoder_cached, c > n2 - R ? c - (n2 - R) : 0, "%s: decoder replay below the hit", path);
  int n_enc = 0, n_dec = 0;
  for (int l = 0; l < f.p.n_layers; l++) {
    if (f.p.layer[l].region == PLAN_ENCODER)
      n_enc++;
    else
      n_dec++;
  }
  EXPECT_EQ(g2.prefill.token_layers, n_enc * (n2 - e0) + n_dec * R, "%s: token-layers (SPEC 6.6's count)", path);
  int64_t new_entries = 0;
  for (int l = 0; l < f.p.n_layers; l++)
    if (f.pools[l].entry_bytes) new_entries += n2 / f.pools[l].ratio - c / f.pools[l].ratio;
  EXPECT_EQ(h->new_entries, new_entries, "%s: new global entries = floor(n/r) - floor(c/r) per source", path);

  bool same_top;
  const float *l2 = g2.prefill_logits + (size_t)(g2.prefill_rows - 1) * V;
  const float *ll = gl.prefill_logits + (size_t)(gl.prefill_rows - 1) * V;
  double d = drift(l2, ll, V, &same_top);
  if (snapshots) {
    EXPECT(d == 0.0, "%s: path (a) logits differ from the live continuation by %g", path, d);
    EXPECT(g2.n_tokens == gl.n_tokens && !memcmp(g2.tokens, gl.tokens, sizeof(int32_t) * (size_t)gl.n_tokens),
           "%s: path (a) tokens differ from the live continuation", path);
    EXPECT(!memcmp(g2.decode_logits, gl.decode_logits, sizeof(float) * (size_t)V * (size_t)(gen - 1)),
           "%s: path (a) decode logits differ", path);
    for (int l = 0; l < f.p.n_layers; l++) {
      EXPECT(ring_equal(&hit.ring[l], &live.ring[l]), "%s: L%d ring differs from the live one", path, l);
      if (!f.pools[l].entry_bytes) continue;
      EXPECT(seq_equal(&hit.seq[l], &live.seq[l], 0), "%s: L%d global entries differ", path, l);
      EXPECT(hit.tail[l].count == live.tail[l].count && hit.tail[l].pos0 == live.tail[l].pos0,
             "%s: L%d tail differs", path, l);
    }
  } else {
    /* entries below c are the cached ones; above it the suffix was computed
     * from replayed encoder windows, so it may drift */
    int64_t diff = 0, after = 0;
    for (int l = 0; l < f.p.n_layers; l++)
      if (f.pools[l].entry_bytes) {
        EXPECT(seq_equal(&hit.seq[l], &live.seq[l], 0) || hit.seq[l].n_entries == live.seq[l].n_entries,
               "%s: L%d entry counts differ", path, l);
        for (int64_t e = 0; e < c / f.pools[l].ratio; e++)
          EXPECT(!memcmp(rt_kv_entry(&hit.seq[l], e), rt_kv_entry(&live.seq[l], e), f.pools[l].entry_bytes),
                 "%s: L%d cached entry %lld differs", path, l, (long long)e);
        for (int64_t e = c / f.pools[l].ratio; e < hit.seq[l].n_entries; e++, after++)
          diff += memcmp(rt_kv_entry(&hit.seq[l], e), rt_kv_entry(&live.seq[l], e), f.pools[l].entry_bytes) != 0;
      }
    printf("%s path (b): c %" PRId64 ", encoder replay [%" PRId64 ", %" PRId64 "): last-position logits drift "
           "%.3g against the live continuation, top-1 %s, %" PRId64 " of %" PRId64 " entries after c differ\n",
           path, c, e0, c, d, same_top ? "same" : "differs", diff, after);
    EXPECT(isfinite(d), "%s: path (b) logits are not finite", path);
  }
  rt_gen_result_free(&g1);
  rt_gen_result_free(&g2);
  rt_gen_result_free(&gl);
  rt_request_free(&live);
  rt_request_free(&hit);
  pc_free(&cache);
  free(p2);
  fx_close(&f);
}

int main(void) {
  op_blas_init();
  /* path (a): turn 1 ends at c = n1 + 3 (the last sampled token is not
   * consumed): 40 (a block boundary), 45 (odd: a one-row tail and a partial
   * block in the snapshot), 33 (tiny: a partial block) */
  conversation("tests/oracle/plans/tiny-40.yaml", 37, 9, true);
  conversation("tests/oracle/plans/tiny-40.yaml", 42, 9, true);   /* c = 45: odd, a tail row */
  conversation("tests/oracle/plans/tiny.yaml", 30, 7, true);
  conversation("tests/oracle/plans/tiny-40.yaml", 37, 9, false); /* path (b) at c = 40 */
  conversation("tests/oracle/plans/tiny-40.yaml", 61, 5, false); /* c = 64 - (64 % 8) = 64 */
  conversation("tests/oracle/plans/tiny.yaml", 30, 7, false);
  return h_report("prefix_hit");
}
