/* test_ops_indexer.c: the lightning indexer, Top-K, candidate pool and
 * reindex (ops/indexer.h) against float64 references and SPEC 8.3 (13-18).
 *
 * What it is: per case (several sizes, odd ones, ratios 1/2/3, both nibble
 * orders, small pools such as 4 blocks of 2 so the pool engages early):
 *   - scores vs a float64 reference computed here from the dequantized keys,
 *     under a tolerance derived from the two reductions;
 *   - Top-K and pool vs a full sort written here (same tie rule), on the op's
 *     OWN fp32 scores, so the comparison is exact; fp32 and float64 rankings
 *     may legitimately differ only between scores closer than the tolerance,
 *     which is checked separately;
 *   - the chunk entry points vs the single-query path, query by query;
 *   - SPEC 8.3.13-18: visibility and padding, scaling w, pool shape, Top-K
 *     inside the pool, reindex == score-everything-then-mask, short context;
 *   - exact ties (identical keys), garbage beyond n_entries, poisoned
 *     entries beyond p, and a reindex that must never read outside its pool;
 *   - the scans' own MXFP4 unpacker vs op_mxfp4_unpack, bitwise, over every
 *     payload byte under every scale code.
 *
 * What it is not: a performance test.
 *
 * Run: ctest --test-dir build -R ops_indexer --output-on-failure
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/formats.h"
#include "ops/indexer.h"
#include "tests/harness.h"

/* ---- a paged source with known keys ------------------------------------ */

struct cfg {
  const char *name;
  int64_t n_entries;
  int ratio, hd, hblock, heads, page_entries;
  enum op_nibble_order nibble;
  int k, pool_block, pool_top;
  int S; /* queries in the chunk */
};

struct src {
  struct op_kv_view kv;
  uint8_t **pages;
  int n_pages;
  float *keys; /* (n_entries, hd): the dequantized keys, what the op must see */
};

#define MAIN_W 32 /* a small Main-KV part in front, so idx_off != 0 */

/* Every slot is first filled with garbage whose Indexer-K scales are NaN
 * (0xFF) or huge (2^40): a slot that leaks into a score shows up. Then the
 * committed entries are packed from random keys. */
static void src_build(struct src *s, const struct cfg *c, uint64_t *seed) {
  size_t idx_bytes = op_mxfp4_bytes(c->hd, c->hblock), main_bytes = op_fp4_bytes(MAIN_W, 16);
  struct op_kv_view kv = {.page_entries = c->page_entries, .main_off = 0, .idx_off = main_bytes + 2,
                          .n_entries = c->n_entries, .ratio = c->ratio, .main_w = MAIN_W,
                          .main_fmt = op_kv_fp4_format(16, c->nibble), .idx_w = c->hd,
                          .idx_fmt = op_kv_mxfp4_format(c->hblock, OP_MX_CEIL, c->nibble)};
  kv.entry_bytes = kv.idx_off + idx_bytes + 3; /* an odd stride */
  s->n_pages = (int)((c->n_entries + c->page_entries - 1) / c->page_entries) + 1;
  s->pages = calloc((size_t)s->n_pages, sizeof *s->pages);
  for (int p = 0; p < s->n_pages; p++) {
    size_t bytes = (size_t)c->page_entries * kv.entry_bytes;
    s->pages[p] = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) s->pages[p][i] = (uint8_t)(h_uniform(seed) * 256);
    for (int e = 0; e < c->page_entries; e++)
      for (int b = 0; b < c->hd / c->hblock; b++)
        s->pages[p][e * kv.entry_bytes + kv.idx_off + c->hd / 2 + b] = (e % 2) ? 0xFF : 127 + 40;
  }
  kv.pages = (const uint8_t *const *)s->pages;
  s->kv = kv;
  s->keys = malloc((size_t)c->n_entries * c->hd * sizeof *s->keys);
  float *x = malloc((size_t)(c->hd > MAIN_W ? c->hd : MAIN_W) * sizeof *x);
  for (int64_t e = 0; e < c->n_entries; e++) {
    uint8_t *dst = (uint8_t *)op_kv_entry(&s->kv, e);
    h_fill(x, MAIN_W, seed, -2.0f, 2.0f);
    op_fp4_pack(dst + kv.main_off, x, MAIN_W, 16, c->nibble); /* some Main-KV bytes, unused here */
    h_fill(x, (size_t)c->hd, seed, -2.0f, 2.0f);
    op_mxfp4_pack(dst + kv.idx_off, x, c->hd, c->hblock, OP_MX_CEIL, c->nibble);
    op_mxfp4_unpack(s->keys + (size_t)e * c->hd, dst + kv.idx_off, c->hd, c->hblock, c->nibble);
  }
  free(x);
}

static void src_free(struct src *s) {
  for (int p = 0; p < s->n_pages; p++) free(s->pages[p]);
  free(s->pages);
  free(s->keys);
}

/* Overwrite entry e's Indexer-K with a copy of entry from's (bytes and keys). */
static void src_copy_key(struct src *s, int64_t e, int64_t from) {
  size_t n = op_mxfp4_bytes(s->kv.idx_w, s->kv.idx_fmt.block);
  memcpy((uint8_t *)op_kv_entry(&s->kv, e) + s->kv.idx_off, op_kv_entry(&s->kv, from) + s->kv.idx_off, n);
  memcpy(s->keys + e * s->kv.idx_w, s->keys + from * s->kv.idx_w, (size_t)s->kv.idx_w * sizeof *s->keys);
}

/* Poison entry e's Indexer-K: every scale NaN, so its score is NaN. */
static void src_poison(struct src *s, int64_t e) {
  uint8_t *p = (uint8_t *)op_kv_entry(&s->kv, e) + s->kv.idx_off + s->kv.idx_w / 2;
  memset(p, 0xFF, (size_t)(s->kv.idx_w / s->kv.idx_fmt.block));
}

/* ---- float64 references, written plainly ------------------------------- */

static int64_t ref_visible(int64_t p, int ratio, int64_t n_entries) {
  int64_t n = 0; /* count entries s with r*s + r - 1 <= p, s < n_entries */
  while (n < n_entries && (int64_t)ratio * n + ratio - 1 <= p) n++;
  return n;
}

/* ref[s] = sum_h w_h max(0, q_h . k_s) in double; absref[s] = sum_h |w_h| sum_i |q_hi k_si|. */
static void ref_scores(double *ref, double *absref, const float *q, const float *w, const float *keys, int64_t n,
                       int heads, int hd) {
  for (int64_t s = 0; s < n; s++) {
    double acc = 0, mag = 0;
    for (int h = 0; h < heads; h++) {
      double d = 0, a = 0;
      for (int i = 0; i < hd; i++) {
        double t = (double)q[h * hd + i] * keys[s * hd + i];
        d += t, a += fabs(t);
      }
      acc += w[h] * (d > 0 ? d : 0);
      mag += fabs(w[h]) * a;
    }
    ref[s] = acc, absref[s] = mag;
  }
}

struct ranked {
  double score;
  int64_t idx;
};

/* Best first: NaN above numbers, higher score, then lower index. */
static int ranked_cmp(const void *pa, const void *pb) {
  const struct ranked *a = pa, *b = pb;
  int an = isnan(a->score), bn = isnan(b->score);
  if (an != bn) return bn - an;
  if (!an && a->score != b->score) return a->score > b->score ? -1 : 1;
  return (a->idx > b->idx) - (a->idx < b->idx);
}

static int i32_cmp(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Full sort of n scores, keep the first min(k, n), ascending, pad -1. */
static void ref_topk(int32_t *out, const double *sc, int64_t n, int k) {
  struct ranked *r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r);
  for (int64_t i = 0; i < n; i++) r[i].score = sc[i], r[i].idx = i;
  qsort(r, (size_t)n, sizeof *r, ranked_cmp);
  int m = n < k ? (int)n : k;
  for (int j = 0; j < m; j++) out[j] = (int32_t)r[j].idx;
  qsort(out, (size_t)m, sizeof *out, i32_cmp);
  for (int j = m; j < k; j++) out[j] = -1;
  free(r);
}

static void ref_topk_f(int32_t *out, const float *sc, int64_t n, int k) {
  double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
  for (int64_t i = 0; i < n; i++) d[i] = sc[i];
  ref_topk(out, d, n, k);
  free(d);
}

/* Block b's score: the max of its visible fp32 scores (NaN wins); then the full sort. */
static void ref_pool(int32_t *out, const float *sc, int64_t n, int B, int top) {
  int64_t nb = (n + B - 1) / B;
  double *bs = malloc((size_t)(nb > 0 ? nb : 1) * sizeof *bs);
  for (int64_t b = 0; b < nb; b++) {
    double best = -INFINITY;
    for (int64_t s = b * B; s < n && s < b * B + B && !isnan(best); s++)
      if (isnan(sc[s]) || sc[s] > best) best = sc[s];
    bs[b] = best;
  }
  ref_topk(out, bs, nb, top);
  free(bs);
}

static bool same_i32(const int32_t *a, const int32_t *b, int n) { return memcmp(a, b, (size_t)n * sizeof *a) == 0; }

/* Reference reindex, the way the reference code does it (SPEC 3.11, 8.3.17):
 * score every visible entry, set those outside C_p to -inf, take the top
 * min(k, n_vis), then drop the masked ones (selected only when |C_p| < k). */
static void ref_reindex_masked(int32_t *out, const float *sc, const int32_t *pool, int top, int B, int64_t n_vis,
                               int k) {
  double *m = malloc((size_t)(n_vis > 0 ? n_vis : 1) * sizeof *m);
  char *in = calloc((size_t)(n_vis > 0 ? n_vis : 1), 1);
  for (int i = 0; i < top; i++)
    for (int64_t s = (int64_t)pool[i] * B; pool[i] >= 0 && s < (int64_t)pool[i] * B + B && s < n_vis; s++) in[s] = 1;
  for (int64_t s = 0; s < n_vis; s++) m[s] = in[s] ? sc[s] : -INFINITY;
  ref_topk(out, m, n_vis, k);
  int n = 0;
  for (int j = 0; j < k; j++)
    if (out[j] >= 0 && in[out[j]]) out[n++] = out[j];
  for (; n < k; n++) out[n] = -1;
  free(m);
  free(in);
}

/* ---- invariants -------------------------------------------------------- */

/* SPEC 8.3.13: min(k, n_vis) valid indices, all visible, strictly ascending
 * (so no duplicates), then -1 padding. */
static void check_topk_shape(const int32_t *t, int k, int64_t n_vis, const char *what) {
  int m = n_vis < k ? (int)n_vis : k, bad = -1;
  for (int j = 0; j < k && bad < 0; j++) {
    bool ok = j < m ? (t[j] >= 0 && t[j] < n_vis && (j == 0 || t[j] > t[j - 1])) : t[j] == -1;
    if (!ok) bad = j;
  }
  EXPECT(bad < 0, "%s: slot %d holds %d (k=%d, n_vis=%lld)", what, bad, bad < 0 ? 0 : t[bad], k, (long long)n_vis);
}

/* SPEC 8.3.15: the pool has min(top, #visible blocks) visible blocks; C_p is
 * exactly those blocks clipped at n_vis (whole aligned blocks), |C_p| <=
 * top*B. SPEC 8.3.16: Top-K within C_p, which the ranking rule guarantees
 * when k <= top_blocks (each block ranked above T's block holds an entry
 * ranked above T, so fewer than k such blocks exist). */
static void check_pool_shape(const int32_t *blocks, int top, int B, int64_t n_vis, const int32_t *topk, int k,
                             const char *what) {
  int64_t nb = (n_vis + B - 1) / B;
  check_topk_shape(blocks, top, nb, what);
  int32_t *ent = malloc((size_t)top * B * sizeof *ent);
  int64_t n = op_pool_expand(ent, blocks, top, B, n_vis), want = 0, at = 0;
  bool exact = n <= (int64_t)top * B;
  for (int i = 0; i < top && blocks[i] >= 0 && exact; i++)
    for (int64_t s = (int64_t)blocks[i] * B; s < (int64_t)blocks[i] * B + B && s < n_vis; s++, want++)
      exact = exact && at < n && ent[at++] == s;
  EXPECT(exact && n == want, "%s: C_p (%lld entries) is not the selected blocks clipped at n_vis", what, (long long)n);
  if (k <= top)
    for (int j = 0; j < k && topk[j] >= 0; j++) {
      int32_t b = topk[j] / B;
      EXPECT(bsearch(&b, blocks, (size_t)(nb < top ? nb : top), sizeof b, i32_cmp), "%s: Top-K entry %d not in C_p",
             what, topk[j]);
    }
  free(ent);
}

/* The fp32 Top-K may differ from the float64 ranking only between scores
 * closer than their error bounds: every selected score, raised by its bound,
 * must reach every unselected one lowered by its bound. */
static void check_rank_vs_f64(const int32_t *t, int k, const double *ref, const double *tol, int64_t n,
                              const char *what) {
  char *sel = calloc((size_t)(n > 0 ? n : 1), 1);
  for (int j = 0; j < k && t[j] >= 0; j++) sel[t[j]] = 1;
  double lo = INFINITY, hi = -INFINITY;
  for (int64_t s = 0; s < n; s++) {
    if (sel[s] && ref[s] + tol[s] < lo) lo = ref[s] + tol[s];
    if (!sel[s] && ref[s] - tol[s] > hi) hi = ref[s] - tol[s];
  }
  EXPECT(lo >= hi, "%s: a selected entry scores %.9g (+tol) in float64, below an unselected %.9g (-tol)", what, lo,
         hi);
  free(sel);
}

/* ---- one configuration, a chunk of queries ------------------------------ */

struct run {
  const struct cfg *c;
  struct src s;
  int S;
  int64_t *pos;
  float *q, *w, *q2, *w2;    /* the pool-building layer's and a reindex layer's */
  int32_t *topk, *pool;      /* op_indexer_topk with q, w */
  int32_t *rtopk, *ftopk2;   /* op_indexer_reindex and a full scan with q2, w2 */
};

/* Positions at the visibility edges (past the entries, the end of the
 * entries, the short-context bound top*B, group boundaries, 0; the longest
 * first, so a short chunk still engages the pool), then random ones. */
static void pick_positions(int64_t *pos, int S, const struct cfg *c, uint64_t *seed) {
  int64_t n_tok = c->n_entries * c->ratio, edge = (int64_t)c->pool_top * c->pool_block * c->ratio;
  int64_t fixed[] = {n_tok + 3, n_tok, n_tok - 1, edge, edge - 1, 2 * c->ratio, 2 * c->ratio - 1, c->ratio, 1, 0};
  for (int i = 0; i < S; i++)
    pos[i] = i < (int)(sizeof fixed / sizeof *fixed) ? fixed[i] : (int64_t)(h_uniform(seed) * (double)(n_tok + 5));
  for (int i = 0; i < S; i++)
    if (pos[i] < 0) pos[i] = 0;
}

/* Runs the three chunk calls, each with its exact workspace between sentinels. */
static void run_ops(struct run *r, const float *w, int32_t *topk, int32_t *pool) {
  const struct cfg *c = r->c;
  size_t wb = op_indexer_topk_work_bytes(&r->s.kv, r->pos, r->S, c->pool_block);
  uint8_t *work = h_alloc_bytes(wb);
  op_indexer_topk(topk, pool, work, r->q, w, r->pos, &r->s.kv, r->S, c->heads, c->k, c->pool_block, c->pool_top, false);
  h_free_bytes(work, wb, "topk workspace");
}

static void run_init(struct run *r, const struct cfg *c, int S, uint64_t *seed) {
  memset(r, 0, sizeof *r);
  r->c = c, r->S = S;
  src_build(&r->s, c, seed);
  size_t nq = (size_t)S * c->heads * c->hd, nw = (size_t)S * c->heads;
  r->pos = malloc((size_t)S * sizeof *r->pos);
  pick_positions(r->pos, S, c, seed);
  r->q = h_alloc(nq), r->q2 = h_alloc(nq), r->w = h_alloc(nw), r->w2 = h_alloc(nw);
  h_fill(r->q, nq, seed, -1.0f, 1.0f), h_fill(r->q2, nq, seed, -1.0f, 1.0f);
  h_fill(r->w, nw, seed, -1.0f, 1.0f), h_fill(r->w2, nw, seed, -1.0f, 1.0f);
  size_t kb = (size_t)S * c->k * sizeof(int32_t), pb = (size_t)S * c->pool_top * sizeof(int32_t);
  r->topk = (int32_t *)h_alloc_bytes(kb), r->pool = (int32_t *)h_alloc_bytes(pb);
  r->rtopk = (int32_t *)h_alloc_bytes(kb), r->ftopk2 = (int32_t *)h_alloc_bytes(kb);
  run_ops(r, r->w, r->topk, r->pool);
  size_t rb = op_indexer_reindex_work_bytes(&r->s.kv, c->pool_block, c->pool_top);
  uint8_t *rwork = h_alloc_bytes(rb);
  op_indexer_reindex(r->rtopk, rwork, r->pool, r->q2, r->w2, r->pos, &r->s.kv, S, c->heads, c->k, c->pool_block,
                     c->pool_top);
  h_free_bytes(rwork, rb, "reindex workspace");
  size_t wb = op_indexer_topk_work_bytes(&r->s.kv, r->pos, S, 0);
  uint8_t *work = h_alloc_bytes(wb); /* no pool: the workspace needs no block scores */
  op_indexer_topk(r->ftopk2, NULL, work, r->q2, r->w2, r->pos, &r->s.kv, S, c->heads, c->k, 0, 0, false);
  h_free_bytes(work, wb, "topk workspace, no pool");
}

static void run_free(struct run *r) {
  const struct cfg *c = r->c;
  size_t nq = (size_t)r->S * c->heads * c->hd, nw = (size_t)r->S * c->heads;
  size_t kb = (size_t)r->S * c->k * sizeof(int32_t), pb = (size_t)r->S * c->pool_top * sizeof(int32_t);
  h_free(r->q, nq, "q"), h_free(r->q2, nq, "q2"), h_free(r->w, nw, "w"), h_free(r->w2, nw, "w2");
  h_free_bytes((uint8_t *)r->topk, kb, "topk"), h_free_bytes((uint8_t *)r->pool, pb, "pool");
  h_free_bytes((uint8_t *)r->rtopk, kb, "reindex topk"), h_free_bytes((uint8_t *)r->ftopk2, kb, "topk layer 2");
  free(r->pos);
  src_free(&r->s);
}

/* Every check that needs one query's own scores. */
static void check_query(struct run *r, int i) {
  const struct cfg *c = r->c;
  int k = c->k, top = c->pool_top, B = c->pool_block, hd = c->hd, heads = c->heads;
  int64_t p = r->pos[i], n = op_indexer_visible(&r->s.kv, p);
  char what[160];
  snprintf(what, sizeof what, "%s, query %d at p=%lld", c->name, i, (long long)p);
  EXPECT(n == ref_visible(p, c->ratio, c->n_entries), "%s: n_vis %lld", what, (long long)n);
  const float *qi = r->q + (size_t)i * heads * hd, *wi = r->w + (size_t)i * heads;
  float *sc = h_alloc((size_t)n), *sc2 = h_alloc((size_t)n);
  double *ref = malloc((size_t)(n + 1) * sizeof *ref), *tol = malloc((size_t)(n + 1) * sizeof *tol);
  op_indexer_score(sc, qi, wi, &r->s.kv, p, heads);
  ref_scores(ref, tol, qi, wi, r->s.keys, n, heads, hd);
  /* Tolerance: each head's dot of hd fp32 products errs by <= gamma(hd) sum|q k|
   * (ReLU is 1-Lipschitz), the product by w_h adds u, the sum over heads
   * gamma(heads); together <= gamma(hd + heads + 1) * sum_h |w_h| sum_i |q_hi k_i|.
   * The keys are the op's own dequantized keys, so quantization is not in it. */
  h_close(sc, ref, tol, (size_t)n, hd + heads + 1, 0, 0, what);
  for (int64_t s = 0; s < n; s++) tol[s] *= h_gamma(hd + heads + 1);

  int32_t *want = malloc((size_t)(k > top ? k : top) * sizeof *want), *t = r->topk + (size_t)i * k;
  int32_t *one = (int32_t *)h_alloc_bytes((size_t)k * sizeof *one);
  ref_topk_f(want, sc, n, k);
  EXPECT(same_i32(t, want, k), "%s: chunk Top-K differs from the full sort of its own scores", what);
  EXPECT(op_topk_select(one, sc, n, k) == (n < k ? n : k), "%s: op_topk_select count", what);
  EXPECT(same_i32(one, want, k), "%s: op_topk_select differs from the full sort", what);
  h_free_bytes((uint8_t *)one, (size_t)k * sizeof *one, "op_topk_select out");
  check_topk_shape(t, k, n, what);
  check_rank_vs_f64(t, k, ref, tol, n, what);

  int32_t *pl = r->pool + (size_t)i * top;
  ref_pool(want, sc, n, B, top);
  EXPECT(same_i32(pl, want, top), "%s: pool differs from the full sort of block maxima", what);
  check_pool_shape(pl, top, B, n, t, k, what);

  const float *q2 = r->q2 + (size_t)i * heads * hd, *w2 = r->w2 + (size_t)i * heads;
  op_indexer_score(sc2, q2, w2, &r->s.kv, p, heads);
  ref_topk_f(want, sc2, n, k);
  EXPECT(same_i32(r->ftopk2 + (size_t)i * k, want, k), "%s: Top-K without pool differs from the full sort", what);
  ref_reindex_masked(want, sc2, pl, top, B, n, k);
  EXPECT(same_i32(r->rtopk + (size_t)i * k, want, k), "%s: reindex != score-everything-then-mask (8.3.17)", what);
  if ((n + B - 1) / B <= top) /* SPEC 8.3.18: the pool holds every visible entry */
    EXPECT(same_i32(r->rtopk + (size_t)i * k, r->ftopk2 + (size_t)i * k, k), "%s: short context: reindex != scan",
           what);
  free(want), free(ref), free(tol);
  h_free(sc, (size_t)n, "scores"), h_free(sc2, (size_t)n, "scores layer 2");
}

/* SPEC 8.3.14: w scaled by a power of two scales every score exactly, so the
 * Top-K and the pool stay the same (checked bitwise on the scores too). */
static void check_scaling(struct run *r) {
  const struct cfg *c = r->c;
  size_t nw = (size_t)r->S * c->heads, kb = (size_t)r->S * c->k, pb = (size_t)r->S * c->pool_top;
  const float factors[] = {8.0f, 0.125f};
  float *ws = h_alloc(nw);
  int32_t *t = malloc(kb * sizeof *t), *pl = malloc(pb * sizeof *pl);
  for (int f = 0; f < 2; f++) {
    for (size_t j = 0; j < nw; j++) ws[j] = r->w[j] * factors[f];
    run_ops(r, ws, t, pl);
    EXPECT(same_i32(t, r->topk, (int)kb) && same_i32(pl, r->pool, (int)pb), "%s: w * %g changed the Top-K or pool",
           c->name, factors[f]);
    for (int i = 0; i < r->S; i++) {
      int64_t n = op_indexer_visible(&r->s.kv, r->pos[i]);
      float *a = malloc((size_t)(n + 1) * sizeof *a), *b = malloc((size_t)(n + 1) * sizeof *b);
      op_indexer_score(a, r->q + (size_t)i * c->heads * c->hd, r->w + (size_t)i * c->heads, &r->s.kv, r->pos[i],
                       c->heads);
      op_indexer_score(b, r->q + (size_t)i * c->heads * c->hd, ws + (size_t)i * c->heads, &r->s.kv, r->pos[i],
                       c->heads);
      int64_t bad = -1;
      for (int64_t s = 0; s < n && bad < 0; s++)
        if (b[s] != a[s] * factors[f]) bad = s;
      EXPECT(bad < 0, "%s: query %d, w * %g: score %lld does not scale exactly", c->name, i, factors[f],
             (long long)bad);
      free(a), free(b);
    }
  }
  free(t), free(pl);
  h_free(ws, nw, "scaled w");
}

static void test_case(const struct cfg *c, uint64_t *seed) {
  struct run r;
  run_init(&r, c, c->S, seed);
  int engaged = 0; /* queries whose pool leaves some visible block out */
  for (int i = 0; i < r.S; i++) {
    check_query(&r, i);
    engaged += op_indexer_visible(&r.s.kv, r.pos[i]) > (int64_t)c->pool_top * c->pool_block;
  }
  EXPECT(engaged > 0, "%s: no query engages the pool; the case tests too little", c->name);
  check_scaling(&r);
  run_free(&r);
}

/* ---- constructed cases --------------------------------------------------- */

static void chunk_topk(int32_t *topk, int32_t *pool, const struct src *s, const struct cfg *c, const float *q,
                       const float *w, const int64_t *pos, int S) {
  size_t wb = op_indexer_topk_work_bytes(&s->kv, pos, S, c->pool_block);
  uint8_t *work = h_alloc_bytes(wb);
  op_indexer_topk(topk, pool, work, q, w, pos, &s->kv, S, c->heads, c->k, c->pool_block, c->pool_top, false);
  h_free_bytes(work, wb, "topk workspace");
}

/* Exact ties from identical keys: the lower index (entry or block) wins. */
static void test_ties(uint64_t *seed) {
  const struct cfg c = {"ties", 24, 1, 32, 32, 4, 5, OP_NIBBLE_EVEN_LOW, 5, 2, 4, 3};
  struct src s;
  src_build(&s, &c, seed);
  int64_t pos[3] = {23, 10, 4};
  float q[3 * 4 * 32], w[3 * 4], sc[24];
  h_fill(q, sizeof q / sizeof *q, seed, -1.0f, 1.0f), h_fill(w, 12, seed, 0.1f, 1.0f);
  int32_t topk[3 * 5], pool[3 * 4], want[5];
  for (int64_t e = 3; e < 24; e++) src_copy_key(&s, e, e % 3); /* three classes of 8 equal keys */
  chunk_topk(topk, pool, &s, &c, q, w, pos, 3);
  for (int i = 0; i < 3; i++) {
    int64_t n = op_indexer_visible(&s.kv, pos[i]);
    op_indexer_score(sc, q + i * 4 * 32, w + i * 4, &s.kv, pos[i], 4);
    ref_topk_f(want, sc, n, 5);
    EXPECT(same_i32(topk + i * 5, want, 5), "ties, query %d: Top-K differs from the full sort", i);
    char sel[24] = {0};
    for (int j = 0; j < 5 && topk[i * 5 + j] >= 0; j++) sel[topk[i * 5 + j]] = 1;
    for (int64_t a = 0; a < n; a++) /* every tie across the cut is won by the lower index */
      for (int64_t b = 0; b < n; b++)
        if (sel[a] && !sel[b] && sc[a] == sc[b])
          EXPECT(a < b, "ties, query %d: %lld kept, %lld dropped", i, (long long)a, (long long)b);
  }
  for (int64_t e = 1; e < 24; e++) src_copy_key(&s, e, 0); /* every key equal */
  chunk_topk(topk, pool, &s, &c, q, w, pos, 3);
  const int32_t first5[5] = {0, 1, 2, 3, 4}, first4[4] = {0, 1, 2, 3};
  EXPECT(same_i32(topk, first5, 5) && same_i32(pool, first4, 4), "all keys equal: not the lowest indices/blocks");
  const int32_t unsorted_pool[4] = {5, -1, 2, 7}, want_r[5] = {4, 5, 10, 11, 14};
  int32_t rtopk[5];
  size_t rb = op_indexer_reindex_work_bytes(&s.kv, 2, 4);
  uint8_t *rwork = h_alloc_bytes(rb);
  op_indexer_reindex(rtopk, rwork, unsorted_pool, q, w, pos, &s.kv, 1, 4, 5, 2, 4);
  h_free_bytes(rwork, rb, "reindex workspace");
  EXPECT(same_i32(rtopk, want_r, 5), "ties in reindex: not the lowest entry ids of an unsorted pool");
  src_free(&s);
}

/* Entries a query must not see: a poisoned (NaN-score, so top-ranked) ratio-2
 * entry j is hidden from p = 2j and seen from p = 2j + 1; entries past p and
 * page bytes past n_entries (src_build's garbage) never leak. */
static void test_hidden(uint64_t *seed) {
  const struct cfg c = {"hidden", 20, 2, 32, 16, 3, 4, OP_NIBBLE_EVEN_LOW, 3, 2, 4, 4};
  struct src s;
  src_build(&s, &c, seed);
  src_poison(&s, 7);
  int64_t pos[4] = {14, 15, 0, 45};
  float q[4 * 3 * 32], w[4 * 3], sc[20];
  h_fill(q, sizeof q / sizeof *q, seed, -1.0f, 1.0f), h_fill(w, 12, seed, -1.0f, 1.0f);
  int32_t topk[4 * 3], pool[4 * 4];
  chunk_topk(topk, pool, &s, &c, q, w, pos, 4);
  op_indexer_score(sc, q, w, &s.kv, 14, 3);
  h_finite(sc, 7, "hidden: scores at p = 14");
  check_topk_shape(topk, 3, 7, "hidden: p = 14 sees entries 0..6");
  check_topk_shape(pool, 4, 4, "hidden: p = 14 pools blocks 0..3 (block 3 partial)");
  EXPECT(bsearch(&(int32_t){7}, topk + 3, 3, sizeof(int32_t), i32_cmp), "hidden: p = 15 must see entry 7");
  EXPECT(bsearch(&(int32_t){3}, pool + 4, 4, sizeof(int32_t), i32_cmp), "hidden: p = 15 must pool block 3");
  check_topk_shape(topk + 6, 3, 0, "hidden: ratio 2, p = 0 sees nothing");
  check_topk_shape(pool + 8, 4, 0, "hidden: ratio 2, p = 0 pools nothing");
  check_topk_shape(topk + 9, 3, 20, "hidden: p beyond the entries sees n_entries only");
  src_free(&s);

  const struct cfg c1 = {"past p", 40, 1, 32, 32, 2, 6, OP_NIBBLE_EVEN_HIGH, 4, 2, 3, 20};
  src_build(&s, &c1, seed);
  for (int64_t e = 20; e < 40; e++) src_poison(&s, e);
  int64_t pos1[20];
  float q1[20 * 2 * 32], w1[20 * 2], sc1[20];
  h_fill(q1, sizeof q1 / sizeof *q1, seed, -1.0f, 1.0f), h_fill(w1, 40, seed, -1.0f, 1.0f);
  int32_t topk1[20 * 4], pool1[20 * 3];
  for (int i = 0; i < 20; i++) pos1[i] = 19 - i;
  chunk_topk(topk1, pool1, &s, &c1, q1, w1, pos1, 20);
  for (int i = 0; i < 20; i++) {
    op_indexer_score(sc1, q1 + i * 2 * 32, w1 + i * 2, &s.kv, pos1[i], 2);
    h_finite(sc1, (size_t)pos1[i] + 1, "past p: scores");
    check_topk_shape(topk1 + i * 4, 4, pos1[i] + 1, "past p: Top-K");
    check_topk_shape(pool1 + i * 3, 3, (pos1[i] + 2) / 2, "past p: pool");
  }
  src_free(&s);
}

/* Reindex gathers before it scores: poisoning every entry outside all the
 * pools (a NaN score would rank first if it were scored) changes nothing. */
static void test_reindex_reads_only_pool(uint64_t *seed) {
  const struct cfg c = {"pool only", 60, 1, 32, 16, 3, 8, OP_NIBBLE_EVEN_LOW, 3, 2, 4, 12};
  struct run r;
  run_init(&r, &c, c.S, seed);
  char in[60] = {0};
  for (int i = 0; i < r.S; i++) {
    int64_t n = op_indexer_visible(&r.s.kv, r.pos[i]);
    for (int j = 0; j < 4; j++) {
      int64_t b = r.pool[i * 4 + j];
      for (int64_t e = b * 2; b >= 0 && e < n && e < b * 2 + 2; e++) in[e] = 1;
    }
  }
  int poisoned = 0;
  for (int64_t e = 0; e < 60; e++)
    if (!in[e]) src_poison(&r.s, e), poisoned++;
  EXPECT(poisoned > 10, "pool only: the pools cover too much for this check (%d poisoned)", poisoned);
  int32_t t[12 * 3];
  size_t rb = op_indexer_reindex_work_bytes(&r.s.kv, 2, 4);
  uint8_t *rwork = h_alloc_bytes(rb);
  op_indexer_reindex(t, rwork, r.pool, r.q2, r.w2, r.pos, &r.s.kv, r.S, 3, 3, 2, 4);
  h_free_bytes(rwork, rb, "reindex workspace");
  EXPECT(same_i32(t, r.rtopk, 12 * 3), "pool only: reindex read an entry outside the pool");
  run_free(&r);
}

/* The scans dequantize keys with their own unpacker (op__indexer_unpack_lane,
 * a table and exponent bits instead of op_e8m0_decode): it must write bitwise
 * what op_mxfp4_unpack writes, NaN and -0 included, for every payload byte
 * under every E8M0 code, in both nibble orders, and touch only its lane. One
 * entry of W = 512 holds all 256 bytes; its scales take every code in turn. */
static void test_unpack_lane(void) {
  enum { W = 512, LANES = 3, LANE = 1 };
  const int blocks[] = {32, 2};
  uint8_t in[W / 2 + W / 2]; /* payload, then up to W / 2 scales (block 2) */
  float want[W], tile[W * LANES];
  for (int bi = 0; bi < 2; bi++)
    for (int order = 0; order < 2; order++) {
      const int block = blocks[bi], n_scales = W / block;
      int bad = 0, moved = 0;
      for (int j = 0; j < W / 2; j++) in[j] = (uint8_t)j;
      for (int code = 0; code < 256; code++) {
        for (int b = 0; b < n_scales; b++) in[W / 2 + b] = (uint8_t)(code + 37 * b); /* code in block 0 */
        op_mxfp4_unpack(want, in, W, block, (enum op_nibble_order)order);
        for (int i = 0; i < W * LANES; i++) tile[i] = 1234.5f; /* sentinel in the other lanes */
        op__indexer_unpack_lane(tile, LANES, LANE, in, W, block, (enum op_nibble_order)order);
        for (int i = 0; i < W; i++) {
          bad += memcmp(&tile[i * LANES + LANE], &want[i], sizeof(float)) != 0;
          moved += tile[i * LANES + LANE - 1] != 1234.5f || tile[i * LANES + LANE + 1] != 1234.5f;
        }
      }
      EXPECT(bad == 0, "unpack lane, block %d, nibble order %d: %d values differ from op_mxfp4_unpack bitwise", block,
             order, bad);
      EXPECT(moved == 0, "unpack lane, block %d, nibble order %d: wrote %d values outside its lane", block, order,
             moved);
    }
}

/* Scores go through tiles of keys, one key per lane: a key's score must not
 * depend on its lane, its tile, how full the tile is or which path scored it.
 * With every key equal (odd widths, several tiles and a partial one) every
 * score is bitwise the score of entry 0 scored alone, and every selection
 * keeps the lowest ids (scan, pool, and a reindex whose pool puts the keys
 * in other lanes). */
static void test_every_lane_alike(uint64_t *seed) {
  enum { N = 203, HEADS = 5, HD = 42, K = 7 };
  const struct cfg c = {"every lane alike", N, 1, HD, 14, HEADS, 16, OP_NIBBLE_EVEN_HIGH, K, 3, 4, 2};
  struct src s;
  src_build(&s, &c, seed);
  for (int64_t e = 1; e < N; e++) src_copy_key(&s, e, 0);
  float q[2 * HEADS * HD], w[2 * HEADS], alone, sc[N];
  h_fill(q, sizeof q / sizeof *q, seed, -1.0f, 1.0f), h_fill(w, 2 * HEADS, seed, 0.1f, 1.0f);
  int64_t pos[2] = {N - 1, 150};
  op_indexer_score(&alone, q, w, &s.kv, 0, HEADS); /* pos 0: entry 0 only */
  op_indexer_score(sc, q, w, &s.kv, pos[0], HEADS);
  int64_t bad = -1;
  for (int64_t e = 0; e < N && bad < 0; e++)
    if (memcmp(&sc[e], &alone, sizeof alone) != 0) bad = e;
  EXPECT(bad < 0, "every lane alike: entry %lld scores %a, entry 0 alone %a", (long long)bad, bad < 0 ? 0.0 : sc[bad],
         alone);
  int32_t topk[2 * K], pool[2 * 4], rtopk[2 * K];
  chunk_topk(topk, pool, &s, &c, q, w, pos, 2);
  const int32_t first[K] = {0, 1, 2, 3, 4, 5, 6}, first_blocks[4] = {0, 1, 2, 3};
  EXPECT(same_i32(topk, first, K) && same_i32(topk + K, first, K) && same_i32(pool, first_blocks, 4),
         "every lane alike: the scan did not keep the lowest ids and blocks");
  const int32_t far_pool[2 * 4] = {66, 3, 20, 40, 49, -1, 21, 1}, want[2 * K] = {9, 10, 11, 60, 61, 62, 120,
                                                                                 3, 4, 5, 63, 64, 65, 147};
  size_t rb = op_indexer_reindex_work_bytes(&s.kv, 3, 4);
  uint8_t *rwork = h_alloc_bytes(rb);
  op_indexer_reindex(rtopk, rwork, far_pool, q, w, pos, &s.kv, 2, HEADS, K, 3, 4);
  h_free_bytes(rwork, rb, "reindex workspace");
  EXPECT(same_i32(rtopk, want, 2 * K), "every lane alike: reindex did not keep the lowest entry ids of its pool");
  src_free(&s);
}

/* candidates.pin_newest (Appendix V #12): the newest visible block is kept
 * even when it ranks last, in place of the block that ranked last among the
 * kept ones; without the pin the pool is the plain top by block max. Scores:
 * block b of 2 entries has max 10 - b, so the newest ranks last. */
static void test_pool_pin(void) {
  enum { B = 2, NB = 7, TOP = 3 };
  float sc[NB * B - 1], bs[NB];
  for (int b = 0; b < NB; b++)
    for (int j = 0; j < B && b * B + j < NB * B - 1; j++) sc[b * B + j] = (float)(10 - b) - 0.5f * (float)j;
  int64_t n_vis = NB * B - 1; /* the newest block is partial */
  int32_t plain[TOP], pinned[TOP];
  EXPECT(op_pool_select(plain, bs, sc, n_vis, B, TOP, false) == TOP, "unpinned pool size");
  EXPECT(plain[0] == 0 && plain[1] == 1 && plain[2] == 2, "unpinned: blocks %d %d %d, want 0 1 2", plain[0], plain[1],
         plain[2]);
  EXPECT(op_pool_select(pinned, bs, sc, n_vis, B, TOP, true) == TOP, "pinned pool size");
  EXPECT(pinned[0] == 0 && pinned[1] == 1 && pinned[2] == NB - 1, "pinned: blocks %d %d %d, want 0 1 %d", pinned[0],
         pinned[1], pinned[2], NB - 1);
  EXPECT(isinf(bs[NB - 1]) && bs[NB - 1] > 0, "pinned block score %g, want +inf", bs[NB - 1]);
  int32_t one[1];
  EXPECT(op_pool_select(one, bs, sc, 1, B, 1, true) == 1 && one[0] == 0, "one visible entry: its block");
}

int main(void) {
  op_blas_init();
  test_pool_pin();
  uint64_t seed = 0x1DE8A11CEull;
  /* name, n_entries, ratio, idx_w, idx_block, heads, page_entries, nibble, k, pool block, top blocks, S */
  const struct cfg cases[] = {
      {"flash widths, pool 4x2", 150, 1, 128, 32, 32, 16, OP_NIBBLE_EVEN_LOW, 4, 2, 4, 13},
      {"ratio 2, odd widths", 37, 2, 42, 14, 3, 5, OP_NIBBLE_EVEN_HIGH, 5, 3, 5, 13},
      {"ratio 1, 5 heads", 101, 1, 96, 32, 5, 7, OP_NIBBLE_EVEN_LOW, 7, 3, 9, 17},
      {"ratio 3", 40, 3, 64, 32, 4, 6, OP_NIBBLE_EVEN_LOW, 3, 5, 3, 3},
      {"tiny, one query", 9, 1, 2, 2, 1, 1, OP_NIBBLE_EVEN_LOW, 4, 1, 7, 1},
      {"tiny", 9, 1, 2, 2, 1, 1, OP_NIBBLE_EVEN_LOW, 4, 1, 7, 10},
      {"k above top blocks", 80, 1, 32, 16, 2, 8, OP_NIBBLE_EVEN_HIGH, 9, 4, 3, 11},
      {"mini-like", 600, 1, 64, 32, 8, 64, OP_NIBBLE_EVEN_LOW, 16, 8, 32, 21},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) test_case(&cases[i], &seed);
  test_ties(&seed);
  test_hidden(&seed);
  test_reindex_reads_only_pool(&seed);
  test_every_lane_alike(&seed);
  test_unpack_lane();
  return h_report("ops_indexer");
}
