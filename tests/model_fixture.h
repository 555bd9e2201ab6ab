/* model_fixture.h: what the tests/test_model_*.c files share. A plan with
 * in-memory synthetic weights (weights_synth, fixed seed), its model and KV
 * pools (struct fx); drivers that run one graph at a time the way
 * runtime/gen/generate.c does (prefill, decode); and the comparison of two
 * requests' stored state (state_compare: global entries, rings, tails),
 * with FLIP ORIGIN, the rule that tells a rounding flip from a wrong value.
 *
 * What it is not: a test by itself (it has no main), nor a check of the
 * values of the forward (tests/oracle/ does that). Everything here is
 * static inline so each test executable compiles only what it uses.
 *
 * Tested through its users: ctest --test-dir build -R '^model_'.
 */
#ifndef CEDAR_TESTS_MODEL_FIXTURE_H
#define CEDAR_TESTS_MODEL_FIXTURE_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/sample.h"
#include "base/check.h"
#include "runtime/exec/exec.h"
#include "runtime/gen/generate.h"
#include "runtime/model/model.h"
#include "runtime/model/state.h"
#include "scheduler/graph.h"
#include "scheduler/plan_cost.h"
#include "tests/harness.h"

#define PLAN_TINY "tests/oracle/plans/tiny.yaml"
#define PLAN_DENSE "tests/oracle/plans/tiny-dense.yaml"
#define PLAN_T40 "tests/oracle/plans/tiny-40.yaml"
#define PLAN_TWO "tests/oracle/plans/tiny-two-dec.yaml"
#define PLAN_WIDE "tests/plans/tiny-40-wide.yaml" /* tiny-40, window 64: rings keep every prompt position */
#define WEIGHT_SEED 7
#define PROMPT_SEED 0x5eedULL

static char err[1024];

/* ---- fixture: a plan, its synthetic weights, the model, the pools -------- */

struct fx {
  const char *path;
  struct plan *p;
  struct weights w;
  struct rt_model M;
  struct rt_kv_pool *pools; /* (PLAN_MAX_LAYERS) */
  int V;
  bool ok;
};

static inline bool fx_open(struct fx *f, const char *path) {
  memset(f, 0, sizeof(*f));
  f->path = path;
  f->p = calloc(1, sizeof(*f->p));
  f->pools = calloc(PLAN_MAX_LAYERS, sizeof(*f->pools));
  CEDAR_ASSERT(f->p && f->pools);
  if (!h_load_plan(path, f->p)) return false;
  int rc;
  rc = weights_synth(&f->w, f->p, WEIGHT_SEED, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err);
  EXPECT(rc == 0, "%s: weights_synth: %s", path, err);
  if (rc) return false;
  rc = rt_model_init(&f->M, f->p, &f->w, err, sizeof err);
  EXPECT(rc == 0, "%s: rt_model_init: %s", path, err);
  if (rc) return false;
  rc = rt_kv_pools_init(f->pools, f->p, err, sizeof err);
  EXPECT(rc == 0, "%s: rt_kv_pools_init: %s", path, err);
  f->V = f->p->model.vocab;
  f->ok = rc == 0;
  return f->ok;
}

static inline void fx_close(struct fx *f) {
  if (f->p) {
    rt_kv_pools_free(f->pools, f->p->n_layers);
    rt_model_free(&f->M);
    weights_free(&f->w);
    plan_free(f->p);
  }
  free(f->pools);
  free(f->p);
  memset(f, 0, sizeof(*f));
}

/* Seeded prompt ids in [0, V). */
static inline void make_prompt(int32_t *t, int64_t n, int V, uint64_t seed) {
  for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(op_rng_next(&seed) % (uint64_t)V);
}

static inline int n_region(const struct plan *p, enum plan_region r) { return plan_count_region(p, r); }

static inline int64_t replay_of(const struct plan *p) {
  return p->serving.replay_decoder >= 0 ? p->serving.replay_decoder : p->model.window;
}

/* ---- drivers: one graph at a time, as generate.c runs them ------------- */

/* A fresh request r able to hold cap positions; prefill the n prompt ids in
 * tiles of `chunk` (0: the plan's) with decoder replay `replay` (< 0: the
 * plan's). last (V) receives the last position's logits. */
static inline bool prefill(const struct fx *f, struct rt_request *r, const int32_t *tok, int64_t n, int64_t cap,
                           int chunk, int64_t replay, float *last, struct rt_exec_stats *st) {
  int rc = rt_request_init(r, 0, f->p, f->pools, cap);
  EXPECT(rc == 0, "rt_request_init(%lld)", (long long)cap);
  if (rc) return false;
  for (int64_t i = 0; i < n; i++) CEDAR_ASSERT(rt_request_push_token(r, tok[i]) == 0);
  struct graph g;
  struct graph_opts go = {.chunk = chunk, .replay = replay, .all_logits = false};
  rc = graph_build_prefill(&g, f->p, n, &go, err, sizeof err);
  EXPECT(rc == 0, "graph_build_prefill(%lld): %s", (long long)n, err);
  if (rc) return false;
  CEDAR_ASSERT(g.out_rows == 1);
  struct rt_exec_out out = {.logits = last, .pos = NULL};
  rc = rt_exec_direct(&g, &f->M, r, &out, st, NULL, NULL, err, sizeof err);
  graph_free(&g);
  EXPECT(rc == 0, "%s: prefill of %lld (chunk %d): %s", f->path, (long long)n, chunk, err);
  if (!rc) r->n_pos = n;
  return rc == 0;
}

/* Consume tok at position r->n_pos; logits (V) of that position. */
static inline bool decode(const struct fx *f, struct rt_request *r, int32_t tok, float *logits,
                          struct rt_exec_stats *st) {
  CEDAR_ASSERT(rt_request_push_token(r, tok) == 0);
  struct graph g;
  int rc = graph_build_decode(&g, f->p, r->n_pos, err, sizeof err);
  EXPECT(rc == 0, "graph_build_decode: %s", err);
  if (rc) return false;
  struct rt_exec_out out = {.logits = logits, .pos = NULL};
  rc = rt_exec_direct(&g, &f->M, r, &out, st, NULL, NULL, err, sizeof err);
  graph_free(&g);
  EXPECT(rc == 0, "%s: decode at %lld: %s", f->path, (long long)r->n_pos, err);
  if (!rc) r->n_pos++;
  return rc == 0;
}

static inline int32_t greedy(const float *logits, int V) { return op_sample_greedy(logits, V); }

/* ---- state comparison ---------------------------------------------------- */

/* How two rings of layer l differ. Payload: the head_dim E4M3 codes of a
 * filled slot (docs/formats.md 2.3: payload first, then the scales). */
struct ring_cmp {
  int tags;        /* slots whose position tag differs, or the whole window when r0 differs */
  int codes;       /* payload codes that differ */
  int far_codes;   /* of those, codes that are not one E4M3 step apart (or +-0 vs the smallest) */
  int scales;      /* slots whose scale bytes differ */
  double scale_rel;/* FP32 scales: the largest relative difference */
  int64_t compared;/* payload codes compared */
};

/* Two E4M3 codes one rounding step apart: same sign and magnitude codes
 * adjacent (the magnitude bits are monotone in the value), or a sign flip
 * between codes of magnitude <= 1 (a value within one subnormal of 0). */
static inline bool e4m3_adjacent(uint8_t a, uint8_t b) {
  int ma = a & 0x7f, mb = b & 0x7f;
  if ((a & 0x80) == (b & 0x80)) return abs(ma - mb) <= 1;
  return ma <= 1 && mb <= 1;
}

/* The same for E2M1 codes (4 bits, bit 3 the sign). */
static inline bool e2m1_adjacent(unsigned a, unsigned b) {
  int ma = (int)(a & 7u), mb = (int)(b & 7u);
  if ((a & 8u) == (b & 8u)) return abs(ma - mb) <= 1;
  return ma <= 1 && mb <= 1;
}

/* Where two runs' stored codes first part (FLIP ORIGIN, below): the earliest
 * position whose codes differ anywhere, and there the lowest layer. far: a
 * code at that site moved by more than one rounding step. */
struct flip_site {
  int64_t pos; /* INT64_MAX: no code differs */
  int rank;    /* order of the layer within a position: encoder layers, then decoder layers */
  int layer;
  bool far;
};

/* Within one position the encoder layers run before the decoder ones (the
 * decoder reads the encoder's outputs), each region bottom up. */
static inline int layer_rank(const struct plan *p, int l) { return (int)p->layer[l].region * p->n_layers + l; }

static inline void site_note(struct flip_site *o, int64_t pos, int rank, int layer, bool far) {
  if (pos < o->pos || (pos == o->pos && rank < o->rank)) *o = (struct flip_site){pos, rank, layer, far};
  else if (pos == o->pos && rank == o->rank) o->far |= far;
}

/* Whether two global entries differ by more than rounding flips: Main KV
 * (E2M1 nibbles, one E4M3 scale per block): scales one E4M3 step apart at
 * most, every nibble one E2M1 step (a one-step scale change moves x/s by at
 * most 12.5%, across at most one E2M1 boundary: consecutive boundaries are
 * >= 1.4x apart); Indexer K (E8M0 scales): scales equal and nibbles one step
 * apart, or scales one exponent apart (the block requantized at twice or
 * half the step: its nibbles may move anywhere). */
static inline bool entry_far(const struct rt_kv_pool *pl, const uint8_t *x, const uint8_t *y) {
  const uint8_t *xs = x + pl->main_w / 2, *ys = y + pl->main_w / 2;
  for (int j = 0; j < pl->main_w / 2; j++)
    if (!e2m1_adjacent(x[j] & 15u, y[j] & 15u) || !e2m1_adjacent(x[j] >> 4, y[j] >> 4)) return true;
  for (int b = 0; b < pl->main_w / pl->main_fmt.block; b++)
    if (!e4m3_adjacent(xs[b], ys[b])) return true;
  const uint8_t *xi = x + pl->main_bytes, *yi = y + pl->main_bytes;
  const int bb = pl->idx_fmt.block / 2; /* bytes of nibbles per block */
  for (int b = 0; b < pl->idx_w / pl->idx_fmt.block; b++) {
    int dx = (int)xi[pl->idx_w / 2 + b] - (int)yi[pl->idx_w / 2 + b];
    if (abs(dx) > 1) return true;
    for (int j = b * bb; dx == 0 && j < (b + 1) * bb; j++)
      if (!e2m1_adjacent(xi[j] & 15u, yi[j] & 15u) || !e2m1_adjacent(xi[j] >> 4, yi[j] >> 4)) return true;
  }
  return false;
}

/* Entries of source l that differ between a and b (counts must match). */
static inline int64_t kv_diff(struct flip_site *origin, const struct rt_request *a, const struct rt_request *b, int l,
                              int rank) {
  const struct rt_kv_seq *s = &a->seq[l], *t = &b->seq[l];
  if (s->n_entries != t->n_entries) return INT64_MAX;
  int64_t bad = 0;
  const int r = s->pool->ratio;
  for (int64_t e = 0; e < s->n_entries; e++) {
    const uint8_t *x = rt_kv_entry(s, e), *y = rt_kv_entry(t, e);
    if (!memcmp(x, y, s->pool->entry_bytes)) continue;
    bad++;
    /* an entry exists once its group's last position has run */
    site_note(origin, e * r + r - 1, rank, l, entry_far(s->pool, x, y));
  }
  return bad;
}

/* The SWA scales after the payload: FP32 ones compared as values (they carry
 * fp32 rounding), E8M0 ones as codes. */
static inline void scale_diff(struct ring_cmp *c, const uint8_t *x, const uint8_t *y, size_t bytes, bool f32) {
  if (!memcmp(x, y, bytes)) return;
  c->scales++;
  if (!f32) {
    c->codes += (int)bytes;
    return;
  }
  for (size_t k = 0; k + 4 <= bytes; k += 4) {
    float u, v;
    memcpy(&u, x + k, 4);
    memcpy(&v, y + k, 4);
    if (u != v) c->scale_rel = fmax(c->scale_rel, fabs((double)u - v) / fmax(fabs((double)u), fabs((double)v)));
  }
}

static inline void ring_diff(struct ring_cmp *c, struct flip_site *origin, const struct rt_request *a,
                             const struct rt_request *b, int l, int rank, int hd, bool f32) {
  const struct rt_ring *g = &a->ring[l], *h = &b->ring[l];
  if (g->r0 != h->r0) {
    c->tags += g->window;
    return;
  }
  for (int i = 0; i < g->window; i++) {
    if (g->pos[i] != h->pos[i]) {
      c->tags++;
      continue;
    }
    if (g->pos[i] < 0) continue;
    const uint8_t *x = g->slot + (size_t)i * g->entry_bytes, *y = h->slot + (size_t)i * h->entry_bytes;
    int codes = 0, far = 0;
    for (int k = 0; k < hd; k++) {
      codes += x[k] != y[k];
      far += !e4m3_adjacent(x[k], y[k]);
    }
    c->codes += codes;
    c->far_codes += far;
    c->compared += hd;
    int scales_before = c->scales;
    scale_diff(c, x + hd, y + hd, g->entry_bytes - (size_t)hd, f32);
    /* E8M0 scales one exponent apart requantize the slot at twice or half
     * the step: its codes may move anywhere, and that is still one flip. */
    bool e8_flip = false, e8_far = false;
    for (size_t k = hd; !f32 && k < g->entry_bytes; k++) {
      int dx = (int)x[k] - (int)y[k];
      e8_flip |= dx != 0;
      e8_far |= abs(dx) > 1;
    }
    if (codes > 0 || (!f32 && c->scales > scales_before))
      site_note(origin, g->pos[i], rank, l, e8_far || (!e8_flip && far > 0));
  }
}

/* The largest |difference| of the pending tail rows of source l relative to
 * the largest |value| (0 when bitwise equal); -1 when count or pos0
 * differ. */
static inline double tail_diff(const struct rt_request *a, const struct rt_request *b, int l) {
  const struct op_comp_tail *s = &a->tail[l], *t = &b->tail[l];
  if (s->count != t->count || s->pos0 != t->pos0) return -1;
  double worst = 0, scale = 0;
  for (int i = 0; i < s->count * s->d; i++) {
    worst = fmax(worst, fabs((double)s->v[i] - t->v[i]));
    worst = fmax(worst, fabs((double)s->g[i] - t->g[i]));
    scale = fmax(scale, fmax(fabs((double)t->v[i]), fabs((double)t->g[i])));
  }
  return worst > 0 ? worst / scale : 0;
}

struct state_cmp {
  int64_t kv_bad, kv_total; /* entries differing / compared, all sources */
  struct ring_cmp ring;     /* all layers */
  struct flip_site origin;  /* the first stored code that differs */
  double tail_rel;          /* worst tail row difference, relative */
  bool tail_shape_bad;      /* a tail's count or pos0 differs */
};

static inline struct state_cmp state_compare(const struct plan *p, const struct rt_request *a,
                                             const struct rt_request *b) {
  struct state_cmp c = {.origin = {.pos = INT64_MAX}};
  for (int l = 0; l < p->n_layers; l++) {
    ring_diff(&c.ring, &c.origin, a, b, l, layer_rank(p, l), p->model.head_dim,
              p->model.swa.scale == PLAN_SCALE_F32);
    if (!a->seq[l].pool) continue;
    int64_t kb = kv_diff(&c.origin, a, b, l, layer_rank(p, l));
    c.kv_bad += kb == INT64_MAX ? a->seq[l].n_entries + 1 : kb;
    c.kv_total += a->seq[l].n_entries;
    if (a->seq[l].pool->ratio > 1) {
      double td = tail_diff(a, b, l);
      if (td < 0) c.tail_shape_bad = true;
      c.tail_rel = fmax(c.tail_rel, td);
    }
  }
  return c;
}

/* FLIP ORIGIN. Once a code flips, what follows is chaotic: the flipped
 * value moves later positions and layers by ~1e-3 relative, more codes flip,
 * a Top-K or expert choice at a near-tie can change, and from there codes
 * and logits differ by O(1) (measured: one flip in a 40-layer plan's L20
 * entry for position 11 left 9% of entries and 12% of ring codes different
 * after 4 steps). So the share of differing codes says nothing; where they
 * start does. Nothing at position p depends on a later position, and within
 * p the encoder layers run before the decoder's, bottom up; so the earliest
 * differing site (the lowest such layer at the earliest such position) has
 * no differing input of its own but the fp32 rounding of the GEMMs, and its
 * codes can only be one rounding step apart (entry_far, e4m3_adjacent). An
 * entry or ring slot computed from wrong positions or a wrong tail moves by
 * O(1) where it is first wrong. */
static inline void expect_origin_flip(const struct state_cmp *c, const char *what) {
  if (c->origin.pos == INT64_MAX) return;
  EXPECT(!c->origin.far, "%s: the first differing codes (position %lld, layer %d) are more than one rounding step "
                         "apart: not a rounding flip", what, (long long)c->origin.pos, c->origin.layer);
}

/* ---- counts and equality of requests -------------------------------------- */

/* Every source of r after `pos` positions: ratio-r sources floor(pos / r)
 * entries and a tail of pos mod r rows starting at r floor(pos / r)
 * (SPEC 8.2.7). */
static inline void expect_entries(const struct fx *f, const struct rt_request *r, int64_t pos, const char *when) {
  for (int l = 0; l < f->p->n_layers; l++) {
    if (!plan_is_kv_source(&f->p->layer[l])) {
      EXPECT(r->seq[l].pool == NULL, "%s %s: L%d is no source but has a sequence", f->path, when, l);
      continue;
    }
    int ratio = f->p->layer[l].ratio;
    EXPECT(r->seq[l].n_entries == pos / ratio, "%s %s: L%d (ratio %d) has %lld entries, want %lld", f->path, when,
           l, ratio, (long long)r->seq[l].n_entries, (long long)(pos / ratio));
    if (ratio == 1) continue;
    EXPECT(r->tail[l].count == pos % ratio && r->tail[l].pos0 == pos / ratio * ratio,
           "%s %s: L%d tail holds %d rows from %lld, want %lld from %lld", f->path, when, l, r->tail[l].count,
           (long long)r->tail[l].pos0, (long long)(pos % ratio), (long long)(pos / ratio * ratio));
  }
}

/* a and b hold the same global entries and tails, bitwise, and the same
 * encoder rings; the decoder rings too when dec_rings. */
static inline bool requests_equal(const struct fx *f, const struct rt_request *a, const struct rt_request *b,
                                  bool dec_rings) {
  struct state_cmp c = state_compare(f->p, a, b);
  if (c.kv_bad || c.tail_rel != 0 || c.tail_shape_bad) return false;
  if (dec_rings) return c.ring.tags == 0 && c.ring.codes == 0 && c.ring.scales == 0;
  for (int l = 0; l < f->p->n_layers; l++) {
    if (f->p->layer[l].region == PLAN_DECODER) continue;
    struct ring_cmp rc = {0};
    struct flip_site origin = {.pos = INT64_MAX};
    ring_diff(&rc, &origin, a, b, l, layer_rank(f->p, l), f->p->model.head_dim,
              f->p->model.swa.scale == PLAN_SCALE_F32);
    if (rc.tags || rc.codes || rc.scales) return false;
  }
  return true;
}

#endif
