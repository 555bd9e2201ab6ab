/* test_ops_attention.c: sparse attention (joint softmax + sink, inverse RoPE)
 * and the grouped output projection (ops/attention.h) against float64.
 *
 * What it is: op_sparse_attn (packed caches: FP4 Main KV in a paged pool,
 * FP8 SWA ring) and op_sparse_attn_f32 (float entries) compared, query by
 * query, with a reference written here that MATERIALIZES each query's entry
 * set (the SPEC 3.9 visibility rule written out again, then the valid Top-K)
 * and runs a plain two-pass softmax in double, then the inverse rotation in
 * double. Sizes include odd heads, head_dim 48/80 (odd block counts), odd
 * topk and window, rings larger than the window that have wrapped, empty
 * slots, future positions, r0 > 0, both nibble orders and SWA scale kinds,
 * and the V4.1 sizes (head_dim 512, topk 512, window 128). Every slot that no
 * query of a call may see and every uncommitted pool entry holds a NaN
 * (poisoned) entry, so a leak shows as a NaN.
 * SPEC 8.4 invariants: 19 joint softmax (entry weights sum to 1 - sink
 * weight, far from two softmaxes added), 20 at most topk + window entries
 * per query (n_used, exactly that many when saturated), 21 shift invariance
 * with quantization off, 23 an entry in both paths is two logits; R.2: a
 * query without entries gives exactly 0, with and without a sink.
 *
 * Tolerance (derived, not tuned; see ref_query). Per head, with n entries:
 *  - logit z_e = fl(tau fl(q.k)): |dz_e| <= Delta_e = tau gamma(d+1) sum|q||k_e|
 *    (d products and sums, then the tau product);
 *  - weight exp(z_e - m): the subtractions against the running max telescope
 *    to z_e - M (M the final max), each rounded, in all <= u (M - z_e + 1);
 *    <= 2u (1 ulp) per expf, for the entry's own exp and for each of <= n
 *    rescale factors (the op rescales at most once per block of 32 entries,
 *    so there are fewer; the count n stays an upper bound whatever the block
 *    size, and so does everything below); so every weight is off by a relative
 *    eps <= expm1(Delta + u (R + 1) + 2u (n + 1)), R = M - min logit;
 *  - the roundings that touch one term of the numerator or the sum: the
 *    product w k, its add, <= n later adds and <= n rescale products:
 *    alpha = eps + gamma(2n + 2)(1 + eps);
 *  - numerator and denominator each off by alpha relative to sum w|k| and Z:
 *    |o~ - o| <= (2 alpha / (1 - alpha) + u) A_j, A_j = sum_e p_e |k_e,j|
 *    (p the exact weights), plus u for the final division;
 *  - inverse RoPE mixes channel j with its pair j' and adds gamma(3) (cos/sin
 *    to float, the product, the sum: ops/rope.c): |err| <= coef (A_j + A_j').
 * h_close gets absref = A_j (or A_j + A_j') and k = coef / u, so
 * gamma(k) >= coef. Second-order terms are covered by gamma's denominators.
 *
 * Run: ctest --test-dir build -R ops_attention --output-on-failure
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention.h"
#include "ops/basic.h"
#include "ops/formats.h"
#include "ops/rope.h"
#include "tests/harness.h"

static uint64_t seed = 0x5eedA77e;

struct tcase {
  const char *name;
  int S, H, d, block, rope_dim, topk, window, extra_slots, ratio, page_entries, swa_block;
  int64_t p0, r0;
  bool sink, e8m0, last, yarn, holes;
  bool saturated, empty; /* expect n_used == topk + window / o == 0 and n_used == 0 */
  double p_invalid; /* share of Top-K slots that are -1 or out of range */
  enum op_nibble_order nib;
  float qamp;
};

/* One call's inputs: float rows first; pack_state adds the packed caches
 * and what they decode to. Global entry j sits at position ratio*j. */
struct state {
  const struct tcase *tc;
  int S, H, d, slots;
  int64_t n_global, cap;
  float *q, *grow, *srow, *sink;
  int64_t *pos, *spos;
  int32_t *idx;
  struct op_rope rope;
  struct op_attn_params pr;
  uint8_t *pool, *ring, **pages;
  struct op_kv_view kv;
  struct op_swa_view swa;
  float *gdeq, *sdeq;
};

/* Rows the reference reads, in double. */
struct rows {
  const double *grow, *srow;
  int64_t n_global;
  const int64_t *spos;
  int slots;
};

static double *to_double(const float *x, size_t n) {
  double *y = malloc(n * sizeof *y);
  for (size_t i = 0; i < n; i++) y[i] = x[i];
  return y;
}

static void fill_nan(float *x, int d) {
  for (int i = 0; i < d; i++) x[i] = NAN;
}

/* ---- case construction ------------------------------------------------ */

/* A Top-K list for query p: distinct visible indices, or an invalid kind. */
static void make_topk(int32_t *row, const struct state *st, int64_t p) {
  const int64_t n_vis = (p + 1) / st->tc->ratio;
  for (int t = 0; t < st->tc->topk; t++) {
    double r = h_uniform(&seed);
    row[t] = -1;
    if (r < st->tc->p_invalid) {
      static const int32_t bad[] = {-1, -7, INT32_MAX, 0};
      int k = (int)(h_uniform(&seed) * 4);
      row[t] = k < 3 ? bad[k] : (int32_t)(st->n_global + (int64_t)(h_uniform(&seed) * 3)); /* uncommitted */
      continue;
    }
    for (int tries = 0; tries < 64 && n_vis > 0 && row[t] < 0; tries++) {
      int32_t c = (int32_t)(h_uniform(&seed) * (double)n_vis);
      bool dup = false;
      for (int u = 0; u < t; u++) dup |= row[u] == c;
      if (!dup) row[t] = c;
    }
  }
}

/* Ring: positions [p0 - W + 1 - old, p1 + fut] at rotated slots (slot order
 * is not position order), some holes; a slot no query of the call may see
 * holds NaN. */
static void make_ring(struct state *st) {
  const struct tcase *tc = st->tc;
  const int64_t p1 = tc->p0 + tc->S - 1;
  const int fut = tc->extra_slots / 2, old = tc->extra_slots - fut;
  const int64_t base = tc->p0 - tc->window + 1 - old;
  const int rot = (int)(h_uniform(&seed) * st->slots);
  for (int k = 0; k < st->slots; k++) {
    int s = (k + rot) % st->slots;
    int64_t ps = base + k;
    if (ps < 0 || (tc->holes && h_uniform(&seed) < 0.12)) ps = -1;
    st->spos[s] = ps;
    float *row = st->srow + (size_t)s * st->d;
    bool seen = ps >= 0 && ps >= tc->r0 && ps <= p1 && ps >= tc->p0 - tc->window + 1;
    if (seen)
      h_fill(row, st->d, &seed, -2.0f, 2.0f);
    else
      fill_nan(row, st->d);
  }
}

static void build_state(struct state *st, const struct tcase *tc) {
  memset(st, 0, sizeof *st);
  st->tc = tc;
  st->S = tc->S, st->H = tc->H, st->d = tc->d;
  const int64_t p1 = tc->p0 + tc->S - 1;
  st->n_global = (p1 + 1) / tc->ratio;
  st->cap = st->n_global + 3;
  st->slots = tc->window + tc->S - 1 + tc->extra_slots;
  st->q = malloc((size_t)tc->S * tc->H * tc->d * sizeof(float));
  st->pos = malloc((size_t)tc->S * sizeof(int64_t));
  st->grow = malloc((size_t)st->cap * tc->d * sizeof(float));
  st->srow = malloc((size_t)st->slots * tc->d * sizeof(float));
  st->spos = malloc((size_t)st->slots * sizeof(int64_t));
  st->sink = malloc((size_t)tc->H * sizeof(float));
  h_fill(st->q, (size_t)tc->S * tc->H * tc->d, &seed, -tc->qamp, tc->qamp);
  h_fill(st->grow, (size_t)st->n_global * tc->d, &seed, -2.0f, 2.0f);
  for (int64_t j = st->n_global; j < st->cap; j++) fill_nan(st->grow + (size_t)j * tc->d, tc->d);
  h_fill(st->sink, (size_t)tc->H, &seed, -1.0f, 2.0f);
  for (int i = 0; i < tc->S; i++) st->pos[i] = tc->p0 + i;
  make_ring(st);
  if (tc->topk > 0) {
    st->idx = malloc((size_t)tc->S * tc->topk * sizeof(int32_t));
    for (int i = 0; i < tc->S; i++) make_topk(st->idx + (size_t)i * tc->topk, st, st->pos[i]);
  }
  EXPECT(op_rope_init(&st->rope, tc->d, tc->rope_dim, tc->last, tc->yarn ? 160000 : 10000, tc->yarn, 16, 65536, 32,
                      1) == 0,
         "%s: rope init", tc->name);
  st->pr = (struct op_attn_params){.heads = tc->H, .head_dim = tc->d, .topk = tc->topk, .window = tc->window,
                                   .r0 = tc->r0, .tau = op_attn_tau_default(tc->d),
                                   .sink = tc->sink ? st->sink : NULL, .rope = &st->rope};
}

/* Packed caches: the pool keeps an Indexer-K part first (filler the op must
 * not read) and the Main KV at an odd offset; the page table is reversed so
 * the op must go through it. gdeq/sdeq: what the op will decode. */
static void pack_state(struct state *st) {
  const struct tcase *tc = st->tc;
  const int d = st->d, pe = tc->page_entries;
  const size_t idx_bytes = op_mxfp4_bytes(32, 32), main_bytes = op_fp4_bytes(d, tc->block);
  const int n_pages = (int)((st->cap + pe - 1) / pe);
  st->kv = (struct op_kv_view){.page_entries = pe, .entry_bytes = idx_bytes + 2 + main_bytes + 3, .idx_off = 0,
                               .main_off = idx_bytes + 2, .n_entries = st->n_global, .ratio = tc->ratio,
                               .main_w = d, .idx_w = 32, .main_fmt = op_kv_fp4_format(tc->block, tc->nib),
                               .idx_fmt = op_kv_mxfp4_format(32, OP_MX_CEIL, tc->nib)};
  const size_t page_bytes = (size_t)pe * st->kv.entry_bytes;
  st->pool = malloc((size_t)n_pages * page_bytes);
  memset(st->pool, 0xEE, (size_t)n_pages * page_bytes);
  st->pages = malloc((size_t)n_pages * sizeof *st->pages);
  for (int i = 0; i < n_pages; i++) st->pages[i] = st->pool + (size_t)(n_pages - 1 - i) * page_bytes;
  st->kv.pages = (const uint8_t *const *)st->pages;
  st->gdeq = malloc((size_t)st->cap * d * sizeof(float));
  for (int64_t j = 0; j < st->cap; j++) {
    uint8_t *e = st->pages[j / pe] + (size_t)(j % pe) * st->kv.entry_bytes + st->kv.main_off;
    op_fp4_pack(e, st->grow + (size_t)j * d, d, tc->block, tc->nib);
    op_fp4_unpack(st->gdeq + (size_t)j * d, e, d, tc->block, tc->nib);
  }
  const enum op_scale_kind kind = tc->e8m0 ? OP_SCALE_E8M0 : OP_SCALE_FP32;
  const size_t sb = op_fp8_bytes(d, tc->swa_block, kind);
  st->ring = malloc((size_t)st->slots * sb);
  st->sdeq = malloc((size_t)st->slots * d * sizeof(float));
  for (int s = 0; s < st->slots; s++) {
    op_fp8_pack(st->ring + (size_t)s * sb, st->srow + (size_t)s * d, d, tc->swa_block, kind);
    op_fp8_unpack(st->sdeq + (size_t)s * d, st->ring + (size_t)s * sb, d, tc->swa_block, kind);
  }
  st->swa = (struct op_swa_view){.slots = st->ring, .pos = st->spos, .n_slots = st->slots, .entry_bytes = sb,
                                 .w = d, .fmt = op_kv_fp8_format(tc->swa_block, kind)};
}

static void free_state(struct state *st) {
  free(st->q), free(st->pos), free(st->grow), free(st->srow), free(st->spos), free(st->sink), free(st->idx);
  free(st->pool), free(st->pages), free(st->ring), free(st->gdeq), free(st->sdeq);
}

/* ---- float64 reference -------------------------------------------------- */

/* Query p's entry set, materialized: the visible ring rows (SPEC 3.9:
 * max(p - W + 1, r0) <= s <= p on the stored position), then the valid
 * Top-K rows. Returns the count; *n_swa = how many came from the ring. */
static int ref_gather(const double **ent, int *n_swa, int64_t p, const int32_t *idx, const struct rows *r,
                      const struct op_attn_params *pr, int d) {
  int n = 0;
  for (int s = 0; s < r->slots; s++) {
    int64_t ps = r->spos[s];
    if (ps >= 0 && ps >= p - pr->window + 1 && ps >= pr->r0 && ps <= p) ent[n++] = r->srow + (size_t)s * d;
  }
  *n_swa = n;
  for (int t = 0; idx && t < pr->topk; t++)
    if (idx[t] >= 0 && idx[t] < r->n_global) ent[n++] = r->grow + (size_t)idx[t] * d;
  return n;
}

/* Inverse rotation at -p in double, and the bound magnitudes of a pair. */
static void ref_unrotate(double *o, double *absb, const struct op_rope *rope, int64_t p) {
  const int off = rope->last ? rope->dim - rope->rope_dim : 0;
  for (int j = 0; j < rope->rope_dim / 2; j++) {
    double t = (double)p * rope->freq[j], c = cos(t), s = -sin(t);
    double *a = o + off + 2 * j, *b = a + 1;
    double x = *a, y = *b;
    *a = x * c - y * s, *b = x * s + y * c;
    double m = absb[off + 2 * j] + absb[off + 2 * j + 1];
    absb[off + 2 * j] = absb[off + 2 * j + 1] = m;
  }
}

/* One query, all heads: two-pass softmax over the materialized set. Writes
 * o and absb (H, d), sinkw (H) and *n; returns h_close's k (header).
 * extra_logit / extra_val: unit roundoffs of input error per q.k product
 * and per value (the shift test's rounded rotations). */
static double ref_query(double *o, double *absb, double *sinkw, int *n, const double *q, int64_t p,
                        const int32_t *idx, const struct rows *r, const struct op_attn_params *pr,
                        double extra_logit, double extra_val) {
  const int H = pr->heads, d = pr->head_dim;
  const double u = H_U32, tau = pr->tau;
  const double **ent = malloc((size_t)(pr->topk + r->slots + 1) * sizeof *ent);
  double *z = malloc((size_t)(pr->topk + r->slots + 1) * sizeof *z);
  int n_swa;
  *n = ref_gather(ent, &n_swa, p, idx, r, pr, d);
  double kmax = 0;
  for (int h = 0; h < H; h++) {
    const double *qh = q + (size_t)h * d;
    double *oh = o + (size_t)h * d, *ah = absb + (size_t)h * d, delta = 0;
    double M = pr->sink ? pr->sink[h] : -INFINITY, lo = pr->sink ? pr->sink[h] : INFINITY;
    for (int e = 0; e < *n; e++) {
      double dot = 0, mag = 0;
      for (int i = 0; i < d; i++) dot += qh[i] * ent[e][i], mag += fabs(qh[i] * ent[e][i]);
      z[e] = tau * dot;
      delta = fmax(delta, tau * h_gamma(d + 1 + extra_logit) * mag);
      M = fmax(M, z[e]), lo = fmin(lo, z[e]);
    }
    double Z = pr->sink ? exp(pr->sink[h] - M) : 0;
    for (int e = 0; e < *n; e++) Z += exp(z[e] - M);
    memset(oh, 0, (size_t)d * sizeof *oh), memset(ah, 0, (size_t)d * sizeof *ah);
    sinkw[h] = pr->sink && Z > 0 ? exp(pr->sink[h] - M) / Z : 0;
    for (int e = 0; e < *n && Z > 0; e++) {
      double w = exp(z[e] - M) / Z;
      for (int i = 0; i < d; i++) oh[i] += w * ent[e][i], ah[i] += w * fabs(ent[e][i]);
    }
    if (pr->rope) ref_unrotate(oh, ah, pr->rope, p);
    EXPECT(delta < 0.5, "reference: logit error bound %g too large for the derivation", delta);
    double eps = expm1(delta + u * (M - lo + 1) + 2 * u * (*n + 1));
    double alpha = eps + h_gamma(2.0 * *n + 2) * (1 + eps);
    double coef = 2 * alpha / (1 - alpha) + u + extra_val * u;
    coef += h_gamma(3) * (1 + coef);
    kmax = fmax(kmax, coef / u);
  }
  free(ent), free(z);
  return kmax;
}

/* All queries of a call. o/absb (S, H, d), k and n (S), sinkw (S, H). */
static void ref_all(double *o, double *absb, double *k, int *n, double *sinkw, const struct state *st,
                    const double *q, const struct rows *r, double extra_logit, double extra_val) {
  const size_t row = (size_t)st->H * st->d;
  for (int i = 0; i < st->S; i++)
    k[i] = ref_query(o + i * row, absb + i * row, sinkw + (size_t)i * st->H, n + i, q + i * row, st->pos[i],
                     st->idx ? st->idx + (size_t)i * st->tc->topk : NULL, r, &st->pr, extra_logit, extra_val);
}

/* ---- comparing ---------------------------------------------------------- */

struct result {
  float *o;
  int32_t *n_used;
  double *oref, *absb, *k, *sinkw;
  int *nref;
};

static void result_alloc(struct result *res, const struct state *st) {
  const size_t n = (size_t)st->S * st->H * st->d;
  res->o = h_alloc(n);
  res->n_used = (int32_t *)h_alloc_bytes((size_t)st->S * sizeof(int32_t));
  res->oref = malloc(n * sizeof(double)), res->absb = malloc(n * sizeof(double));
  res->k = malloc((size_t)st->S * sizeof(double)), res->nref = malloc((size_t)st->S * sizeof(int));
  res->sinkw = malloc((size_t)st->S * st->H * sizeof(double));
}

static void result_free(struct result *res, const struct state *st, const char *what) {
  h_free(res->o, (size_t)st->S * st->H * st->d, what);
  h_free_bytes((uint8_t *)res->n_used, (size_t)st->S * sizeof(int32_t), what);
  free(res->oref), free(res->absb), free(res->k), free(res->nref), free(res->sinkw);
}

/* Each query against the reference; n_used against the set's size and the
 * SPEC 8.4.20 cap. */
static void check_result(const struct result *res, const struct state *st, const char *path) {
  const size_t row = (size_t)st->H * st->d;
  char what[160];
  for (int i = 0; i < st->S; i++) {
    snprintf(what, sizeof what, "%s [%s] query %d (p=%lld)", st->tc->name, path, i, (long long)st->pos[i]);
    h_close(res->o + i * row, res->oref + i * row, res->absb + i * row, row, res->k[i], 0, 0, what);
    EXPECT(res->n_used[i] == res->nref[i], "%s: n_used %d, reference set has %d", what, res->n_used[i],
           res->nref[i]);
    EXPECT(res->n_used[i] <= st->tc->topk + st->tc->window, "%s: %d entries > topk + window (SPEC 8.4.20)", what,
           res->n_used[i]);
  }
}

/* The cases built to saturate the entry count or to have no entry. */
static void check_flags(const struct result *res, const struct state *st, const char *path) {
  const struct tcase *tc = st->tc;
  for (int i = 0; i < st->S && tc->saturated; i++)
    EXPECT(res->n_used[i] == tc->topk + tc->window, "%s [%s] query %d: %d entries, expected topk + window = %d",
           tc->name, path, i, res->n_used[i], tc->topk + tc->window);
  for (int i = 0; i < st->S && tc->empty; i++) {
    EXPECT(res->n_used[i] == 0, "%s [%s] query %d: %d entries, expected none", tc->name, path, i, res->n_used[i]);
    for (size_t c = 0; c < (size_t)st->H * st->d; c++)
      if (res->o[(size_t)i * st->H * st->d + c] != 0.0f) {
        EXPECT(false, "%s [%s] query %d: o[%zu] = %g, expected exactly 0 (R.2)", tc->name, path, i, c,
               res->o[(size_t)i * st->H * st->d + c]);
        break;
      }
  }
}

/* Both paths of one case against the reference. */
static void run_case(const struct tcase *tc) {
  struct state st;
  struct result res;
  build_state(&st, tc);
  pack_state(&st);
  result_alloc(&res, &st);
  const size_t nq = (size_t)st.S * st.H * st.d;
  double *qd = to_double(st.q, nq);
  double *gd = to_double(st.gdeq, (size_t)st.cap * st.d), *sd = to_double(st.sdeq, (size_t)st.slots * st.d);
  struct rows r = {gd, sd, st.n_global, st.spos, st.slots};
  op_sparse_attn(res.o, res.n_used, st.q, st.pos, st.idx, st.idx ? &st.kv : NULL, &st.swa, st.S, &st.pr);
  ref_all(res.oref, res.absb, res.k, res.nref, res.sinkw, &st, qd, &r, 0, 0);
  check_result(&res, &st, "packed");
  check_flags(&res, &st, "packed");
  free(gd), free(sd);
  gd = to_double(st.grow, (size_t)st.cap * st.d), sd = to_double(st.srow, (size_t)st.slots * st.d);
  r = (struct rows){gd, sd, st.n_global, st.spos, st.slots};
  op_sparse_attn_f32(res.o, res.n_used, st.q, st.pos, st.idx, st.grow, st.n_global, st.srow, st.spos, st.slots,
                     st.S, &st.pr);
  ref_all(res.oref, res.absb, res.k, res.nref, res.sinkw, &st, qd, &r, 0, 0);
  check_result(&res, &st, "f32");
  check_flags(&res, &st, "f32");
  if (st.pr.rope) { /* the inverse RoPE from the caller's angle table: the same bits */
    const size_t no = (size_t)st.S * st.H * st.d;
    float *o2 = malloc((no + 1) * sizeof *o2), *abuf = malloc((op_rope_angles_floats(st.pr.rope, st.S) + 1) * sizeof *abuf);
    struct op_rope_angles ang;
    op_rope_angles_init(&ang, abuf, st.pr.rope, st.pos, st.S);
    struct op_attn_params pa = st.pr;
    pa.angles = &ang;
    op_sparse_attn_f32(o2, NULL, st.q, st.pos, st.idx, st.grow, st.n_global, st.srow, st.spos, st.slots, st.S, &pa);
    EXPECT(!memcmp(o2, res.o, no * sizeof *o2), "%s: f32 with the angle table differs", tc->name);
    op_sparse_attn(o2, NULL, st.q, st.pos, st.idx, st.idx ? &st.kv : NULL, &st.swa, st.S, &pa);
    op_sparse_attn(res.o, NULL, st.q, st.pos, st.idx, st.idx ? &st.kv : NULL, &st.swa, st.S, &st.pr);
    EXPECT(!memcmp(o2, res.o, no * sizeof *o2), "%s: packed with the angle table differs", tc->name);
    free(o2), free(abuf);
  }
  free(qd), free(gd), free(sd);
  result_free(&res, &st, tc->name);
  free_state(&st);
}

/* Largest |got - ref| in units of the derived bound (for "far above"). */
static double worst_ratio(const float *got, const double *ref, const double *absb, size_t n, double k) {
  double w = 0;
  for (size_t i = 0; i < n; i++) {
    double b = h_gamma(k) * absb[i], e = fabs((double)got[i] - ref[i]);
    if (b > 0) w = fmax(w, e / b);
  }
  return w;
}

/* ---- SPEC 8.4.19: one joint softmax --------------------------------------- */

/* Every entry is 3 e_c on a channel of its own outside the RoPE slice
 * (global entry j: channel j mod 24; ring position s: 24 + s mod 24), exact
 * in FP4 and E8M0-FP8. So o_h[c] / 3 is the weight the op gave that entry and
 * the sum over channels the total entry weight: it must be 1 - sink weight
 * and far from two separately normalized softmaxes (global + sink, local +
 * sink) added. */
static void test_joint_softmax(void) {
  static const struct tcase tc = {.name = "8.4.19 joint softmax", .S = 2, .H = 3, .d = 64, .block = 16,
                                  .rope_dim = 16, .topk = 9, .window = 7, .extra_slots = 4, .ratio = 2,
                                  .page_entries = 4, .swa_block = 32, .p0 = 40, .sink = true, .e8m0 = true,
                                  .last = true, .holes = true, .p_invalid = 0.2, .qamp = 3};
  struct state st;
  struct result res;
  build_state(&st, &tc);
  const int d = st.d, half = (d - tc.rope_dim) / 2;
  EXPECT(st.n_global <= half, "8.4.19: test needs <= %d global entries", half);
  for (int64_t j = 0; j < st.n_global; j++) {
    memset(st.grow + (size_t)j * d, 0, (size_t)d * sizeof(float));
    st.grow[(size_t)j * d + (size_t)(j % half)] = 3.0f;
  }
  for (int s = 0; s < st.slots; s++) {
    float *row = st.srow + (size_t)s * d;
    if (isnan(row[0])) continue; /* invisible to the whole call: stays poisoned */
    memset(row, 0, (size_t)d * sizeof(float));
    row[half + st.spos[s] % half] = 3.0f;
  }
  pack_state(&st);
  result_alloc(&res, &st);
  const size_t row = (size_t)st.H * d;
  double *qd = to_double(st.q, (size_t)st.S * row);
  double *gd = to_double(st.gdeq, (size_t)st.cap * d), *sd = to_double(st.sdeq, (size_t)st.slots * d);
  struct rows r = {gd, sd, st.n_global, st.spos, st.slots};
  op_sparse_attn(res.o, res.n_used, st.q, st.pos, st.idx, &st.kv, &st.swa, st.S, &st.pr);
  ref_all(res.oref, res.absb, res.k, res.nref, res.sinkw, &st, qd, &r, 0, 0);
  check_result(&res, &st, "packed");
  const double **ent = malloc((size_t)(tc.topk + st.slots) * sizeof *ent);
  for (int i = 0; i < st.S; i++) {
    int n_swa, n = ref_gather(ent, &n_swa, st.pos[i], st.idx + (size_t)i * tc.topk, &r, &st.pr, d);
    EXPECT(n_swa > 0 && n > n_swa, "8.4.19: query %d needs entries in both paths (%d local, %d global)", i, n_swa,
           n - n_swa);
    for (int h = 0; h < st.H; h++) {
      const float *oh = res.o + i * row + (size_t)h * d;
      const double *ah = res.absb + i * row + (size_t)h * d, *qh = qd + i * row + (size_t)h * d;
      double total = 0, tol = 0, path[2] = {0, 0}, sig = st.sink[h];
      for (int c = 0; c < 2 * half; c++) total += oh[c] / 3.0, tol += h_gamma(res.k[i]) * ah[c] / 3.0;
      /* The alternative: each path normalized on its own, with the sink. */
      for (int side = 0; side < 2; side++) {
        double num = 0;
        for (int e = side ? n_swa : 0; e < (side ? n : n_swa); e++) {
          double dot = 0;
          for (int c = 0; c < d; c++) dot += qh[c] * ent[e][c];
          num += exp(st.pr.tau * dot);
        }
        path[side] = num / (exp(sig) + num);
      }
      double joint = 1.0 - res.sinkw[(size_t)i * st.H + h], alt = path[0] + path[1];
      EXPECT(fabs(total - joint) <= tol, "8.4.19 query %d head %d: entry weights sum to %.9g, 1 - sink weight = %.9g",
             i, h, total, joint);
      EXPECT(fabs(total - alt) > 1000 * tol,
             "8.4.19 query %d head %d: sum %.9g is not far from two softmaxes added (%.9g, tolerance %.3g)", i, h,
             total, alt, tol);
    }
  }
  free(ent), free(qd), free(gd), free(sd);
  result_free(&res, &st, tc.name);
  free_state(&st);
}

/* ---- SPEC 8.4.21: shift invariance, quantization off ----------------------- */

/* Forward RoPE in double at pos[i] + D of every head of n rows; rows with a
 * negative position (empty slots) are copied. */
static void rot_d(double *out, const float *in, int n, int heads, int d, const int64_t *pos, int64_t D,
                  const struct op_rope *rope) {
  const int off = rope->last ? d - rope->rope_dim : 0;
  for (size_t i = 0; i < (size_t)n * heads * d; i++) out[i] = in[i];
  for (int i = 0; i < n; i++) {
    if (pos[i] < 0) continue;
    for (int h = 0; h < heads; h++) {
      double *v = out + ((size_t)i * heads + h) * d + off;
      for (int j = 0; j < rope->rope_dim / 2; j++) {
        double t = (double)(pos[i] + D) * rope->freq[j], c = cos(t), s = sin(t), a = v[2 * j], b = v[2 * j + 1];
        v[2 * j] = a * c - b * s, v[2 * j + 1] = a * s + b * c;
      }
    }
  }
}

static float *to_float(const double *x, size_t n) {
  float *y = malloc(n * sizeof *y);
  for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
  return y;
}

/* The rows of build_state are un-rotated latents. The exact reference uses
 * them rotated in double at the true positions; the op gets them rotated at
 * position + D (query, global entries at ratio*j + D, ring slots, r0) and
 * rounded to float. Input error the bound adds: rounding q and k to float
 * moves each product q_i k_i by <= 2u, plus the double angles' error
 * (<= 2^-52 (p + D) freq ~ 1e-10 rad at D = 1e6, far below u): extra_logit
 * = 3; the values are off by <= u plus the same: extra_val = 2. */
static void test_shift(void) {
  static const struct tcase tc = {.name = "8.4.21 shift invariance", .S = 3, .H = 3, .d = 32, .block = 16,
                                  .rope_dim = 16, .topk = 6, .window = 5, .extra_slots = 3, .ratio = 2,
                                  .page_entries = 2, .swa_block = 32, .p0 = 40, .r0 = 38, .sink = true,
                                  .last = true, .yarn = true, .holes = true, .p_invalid = 0.2, .qamp = 2};
  static const int64_t shifts[] = {0, 7, 4097, 1000003};
  struct state st;
  struct result res;
  build_state(&st, &tc);
  result_alloc(&res, &st);
  const int d = st.d;
  const size_t row = (size_t)st.H * d, nq = (size_t)st.S * row;
  int64_t *gpos = malloc((size_t)st.cap * sizeof *gpos), *posD = malloc((size_t)st.S * sizeof *posD);
  int64_t *sposD = malloc((size_t)st.slots * sizeof *sposD);
  for (int64_t j = 0; j < st.cap; j++) gpos[j] = tc.ratio * j;
  double *qd = malloc(nq * sizeof *qd), *gd = malloc((size_t)st.cap * d * sizeof *gd);
  double *sd = malloc((size_t)st.slots * d * sizeof *sd);
  rot_d(qd, st.q, st.S, st.H, d, st.pos, 0, &st.rope);
  rot_d(gd, st.grow, (int)st.cap, 1, d, gpos, 0, &st.rope);
  rot_d(sd, st.srow, st.slots, 1, d, st.spos, 0, &st.rope);
  struct rows r = {gd, sd, st.n_global, st.spos, st.slots};
  ref_all(res.oref, res.absb, res.k, res.nref, res.sinkw, &st, qd, &r, 3, 2);
  float *o0 = malloc(nq * sizeof *o0);
  for (size_t s = 0; s < sizeof shifts / sizeof *shifts; s++) {
    const int64_t D = shifts[s];
    rot_d(qd, st.q, st.S, st.H, d, st.pos, D, &st.rope);
    rot_d(gd, st.grow, (int)st.cap, 1, d, gpos, D, &st.rope);
    rot_d(sd, st.srow, st.slots, 1, d, st.spos, D, &st.rope);
    float *qf = to_float(qd, nq), *gf = to_float(gd, (size_t)st.cap * d), *sf = to_float(sd, (size_t)st.slots * d);
    for (int i = 0; i < st.S; i++) posD[i] = st.pos[i] + D;
    for (int k = 0; k < st.slots; k++) sposD[k] = st.spos[k] < 0 ? -1 : st.spos[k] + D;
    struct op_attn_params pr = st.pr;
    pr.r0 += D;
    op_sparse_attn_f32(res.o, res.n_used, qf, posD, st.idx, gf, st.n_global, sf, sposD, st.slots, st.S, &pr);
    for (int i = 0; i < st.S; i++) {
      char what[96];
      snprintf(what, sizeof what, "8.4.21 shift %lld, query %d vs exact", (long long)D, i);
      h_close(res.o + i * row, res.oref + i * row, res.absb + i * row, row, res.k[i], 0, 0, what);
      EXPECT(res.n_used[i] == res.nref[i], "%s: n_used %d, expected %d", what, res.n_used[i], res.nref[i]);
      if (D == 0) continue;
      /* Each run is within the bound of the exact output: together, 2x. */
      double *od = to_double(o0 + i * row, row);
      snprintf(what, sizeof what, "8.4.21 shift %lld, query %d vs shift 0", (long long)D, i);
      h_close(res.o + i * row, od, res.absb + i * row, row, 2 * res.k[i], 0, 0, what);
      free(od);
    }
    if (D == 0) memcpy(o0, res.o, nq * sizeof *o0);
    free(qf), free(gf), free(sf);
  }
  free(o0), free(gpos), free(posD), free(sposD), free(qd), free(gd), free(sd);
  result_free(&res, &st, tc.name);
  free_state(&st);
}

/* ---- SPEC 8.4.23: an entry in both paths is two logits --------------------- */

/* The query's own position p is in the ring and, as global entry p (ratio
 * 1), in its Top-K, with the same vector, aligned with head 0's query so its
 * weight is large. The op must match the reference that counts it twice and
 * be far from the one that counts it once. */
static void test_both_paths(void) {
  static const struct tcase tc = {.name = "8.4.23 entry in both paths", .S = 1, .H = 2, .d = 32, .block = 16,
                                  .rope_dim = 8, .topk = 4, .window = 4, .extra_slots = 2, .ratio = 1,
                                  .page_entries = 2, .swa_block = 32, .p0 = 50, .sink = true, .last = true,
                                  .p_invalid = 0, .qamp = 1};
  struct state st;
  struct result res;
  build_state(&st, &tc);
  result_alloc(&res, &st);
  const int d = st.d;
  const int64_t p = st.pos[0];
  int slot = -1;
  for (int s = 0; s < st.slots; s++)
    if (st.spos[s] == p) slot = s;
  EXPECT(slot >= 0, "8.4.23: position %lld not in the ring", (long long)p);
  if (slot < 0) slot = 0;
  for (int c = 0; c < d; c++) st.grow[(size_t)p * d + c] = st.srow[(size_t)slot * d + c] = st.q[c] > 0 ? 1.5f : -1.5f;
  for (int t = 1; t < tc.topk; t++)
    if (st.idx[t] == p) st.idx[t] = -1;
  st.idx[0] = (int32_t)p;
  double *qd = to_double(st.q, (size_t)st.H * d);
  double *gd = to_double(st.grow, (size_t)st.cap * d), *sd = to_double(st.srow, (size_t)st.slots * d);
  struct rows r = {gd, sd, st.n_global, st.spos, st.slots};
  op_sparse_attn_f32(res.o, res.n_used, st.q, st.pos, st.idx, st.grow, st.n_global, st.srow, st.spos, st.slots,
                     st.S, &st.pr);
  ref_all(res.oref, res.absb, res.k, res.nref, res.sinkw, &st, qd, &r, 0, 0);
  check_result(&res, &st, "f32, counted twice");
  st.idx[0] = -1; /* the deduplicated set */
  ref_all(res.oref, res.absb, res.k, res.nref, res.sinkw, &st, qd, &r, 0, 0);
  double w = worst_ratio(res.o, res.oref, res.absb, (size_t)st.H * d, res.k[0]);
  EXPECT(w > 100, "8.4.23: output only %.3g x the bound away from the deduplicated set", w);
  free(qd), free(gd), free(sd);
  result_free(&res, &st, tc.name);
  free_state(&st);
}

/* ---- poisoned entries -------------------------------------------------- */

/* A visible entry holding a NaN (a poisoned block, docs/formats.md 3) makes
 * that query's output NaN in every head, where it can be traced; the other
 * query, which cannot see it, stays finite. */
static void test_nan_propagates(void) {
  static const struct tcase tc = {.name = "poisoned entry", .S = 2, .H = 2, .d = 16, .block = 16, .rope_dim = 4,
                                  .topk = 3, .window = 4, .extra_slots = 2, .ratio = 2, .page_entries = 2,
                                  .swa_block = 16, .p0 = 30, .sink = true, .e8m0 = true, .last = true, .qamp = 1};
  struct state st;
  struct result res;
  build_state(&st, &tc);
  for (int s = 0; s < st.slots; s++)
    if (st.spos[s] == st.pos[1]) st.srow[(size_t)s * st.d + 5] = NAN; /* seen by query 1 only */
  pack_state(&st);
  result_alloc(&res, &st);
  const size_t row = (size_t)st.H * st.d;
  op_sparse_attn(res.o, res.n_used, st.q, st.pos, st.idx, &st.kv, &st.swa, st.S, &st.pr);
  h_finite(res.o, row, "poisoned entry: query 0 (cannot see it)");
  size_t nan = 0;
  for (size_t c = 0; c < row; c++) nan += isnan(res.o[row + c]) != 0;
  EXPECT(nan == row, "poisoned entry: query 1 has %zu NaN of %zu outputs, expected all", nan, row);
  result_free(&res, &st, tc.name);
  free_state(&st);
}

/* ---- grouped output projection ------------------------------------------------ */

/* z = per-group W_oa o: a gw-term sum, gamma(gw) on sum|W||o|. a = W_ob z:
 * G*rank terms on a z that is itself off by gamma(gw) of its magnitude sum,
 * so gamma(G*rank + gw) on sum_m |W_ob| (sum |W_oa||o|). */
static void check_oproj(int S, int heads, int d, int G, int rank, int hidden) {
  const int gw = heads / G * d, zw = G * rank;
  float *o = malloc((size_t)S * heads * d * sizeof *o), *woa = malloc((size_t)G * rank * gw * sizeof *woa);
  float *wob = malloc((size_t)hidden * zw * sizeof *wob);
  h_fill(o, (size_t)S * heads * d, &seed, -1, 1);
  h_fill(woa, (size_t)G * rank * gw, &seed, -1, 1);
  h_fill(wob, (size_t)hidden * zw, &seed, -1, 1);
  float *a = h_alloc((size_t)S * hidden), *z = h_alloc((size_t)S * zw);
  op_grouped_oproj(a, z, o, woa, wob, S, heads, d, G, rank, hidden);
  double *zr = calloc((size_t)S * zw, sizeof *zr), *za = calloc((size_t)S * zw, sizeof *za);
  double *ar = calloc((size_t)S * hidden, sizeof *ar), *aa = calloc((size_t)S * hidden, sizeof *aa);
  for (int i = 0; i < S; i++) {
    for (int g = 0; g < G; g++)
      for (int k = 0; k < rank; k++)
        for (int c = 0; c < gw; c++) {
          double w = woa[((size_t)g * rank + k) * gw + c], x = o[(size_t)i * heads * d + (size_t)g * gw + c];
          zr[(size_t)i * zw + g * rank + k] += w * x, za[(size_t)i * zw + g * rank + k] += fabs(w * x);
        }
    for (int j = 0; j < hidden; j++)
      for (int m = 0; m < zw; m++) {
        double w = wob[(size_t)j * zw + m];
        ar[(size_t)i * hidden + j] += w * zr[(size_t)i * zw + m];
        aa[(size_t)i * hidden + j] += fabs(w) * za[(size_t)i * zw + m];
      }
  }
  char what[96];
  snprintf(what, sizeof what, "oproj z S=%d H=%d d=%d G=%d r=%d", S, heads, d, G, rank);
  h_close(z, zr, za, (size_t)S * zw, gw, 0, 0, what);
  snprintf(what, sizeof what, "oproj a S=%d H=%d d=%d G=%d r=%d hidden=%d", S, heads, d, G, rank, hidden);
  h_close(a, ar, aa, (size_t)S * hidden, zw + gw, 0, 0, what);
  h_free(a, (size_t)S * hidden, "oproj a"), h_free(z, (size_t)S * zw, "oproj z");
  free(o), free(woa), free(wob), free(zr), free(za), free(ar), free(aa);
}

int main(void) {
  op_blas_init();
  static const struct tcase cases[] = {
      {.name = "decode, 1 head, d 16", .S = 1, .H = 1, .d = 16, .block = 16, .rope_dim = 4, .topk = 3, .window = 4,
       .extra_slots = 3, .ratio = 2, .page_entries = 2, .swa_block = 16, .p0 = 37, .sink = true, .e8m0 = true,
       .last = true, .holes = true, .p_invalid = 0.3, .qamp = 1},
      {.name = "chunk 5, 3 heads, d 48 (3 blocks), FP32 scale, even-high nibbles", .S = 5, .H = 3, .d = 48,
       .block = 16, .rope_dim = 16, .topk = 7, .window = 5, .extra_slots = 4, .ratio = 2, .page_entries = 3,
       .swa_block = 48, .p0 = 60, .sink = true, .last = true, .holes = true, .p_invalid = 0.25,
       .nib = OP_NIBBLE_EVEN_HIGH, .qamp = 4},
      {.name = "ratio 1, r0 inside the window, YaRN, no sink", .S = 4, .H = 5, .d = 64, .block = 16, .rope_dim = 16,
       .topk = 13, .window = 9, .extra_slots = 6, .ratio = 1, .page_entries = 7, .swa_block = 32, .p0 = 200,
       .r0 = 197, .e8m0 = true, .last = true, .yarn = true, .holes = true, .p_invalid = 0.2, .qamp = 2},
      {.name = "SWA-only layer, positions below the window", .S = 3, .H = 2, .d = 32, .block = 16, .rope_dim = 8,
       .topk = 0, .window = 6, .extra_slots = 5, .ratio = 1, .page_entries = 2, .swa_block = 16, .p0 = 2,
       .sink = true, .last = true, .holes = true, .qamp = 1.5f},
      {.name = "large logits, first-slice RoPE, d 80", .S = 2, .H = 4, .d = 80, .block = 16, .rope_dim = 16,
       .topk = 11, .window = 3, .extra_slots = 2, .ratio = 2, .page_entries = 5, .swa_block = 16, .p0 = 1001,
       .sink = true, .e8m0 = true, .holes = true, .p_invalid = 0.2, .qamp = 8},
      {.name = "replay: r0 > first query, block 8", .S = 4, .H = 2, .d = 32, .block = 8, .rope_dim = 8, .topk = 5,
       .window = 8, .extra_slots = 3, .ratio = 2, .page_entries = 4, .swa_block = 8, .p0 = 90, .r0 = 91,
       .sink = true, .last = true, .p_invalid = 0.2, .qamp = 2},
      {.name = "saturated: topk + window entries", .S = 3, .H = 2, .d = 32, .block = 16, .rope_dim = 8, .topk = 10,
       .window = 6, .extra_slots = 5, .ratio = 1, .page_entries = 3, .swa_block = 32, .p0 = 100, .sink = true,
       .e8m0 = true, .last = true, .saturated = true, .qamp = 1},
      {.name = "no entries, sink: o = 0", .S = 2, .H = 3, .d = 16, .block = 16, .rope_dim = 4, .topk = 5,
       .window = 4, .extra_slots = 2, .ratio = 2, .page_entries = 2, .swa_block = 16, .p0 = 20, .r0 = 22,
       .sink = true, .e8m0 = true, .last = true, .empty = true, .p_invalid = 1, .qamp = 1},
      {.name = "no entries, no sink: o = 0", .S = 2, .H = 3, .d = 16, .block = 16, .rope_dim = 4, .topk = 5,
       .window = 4, .extra_slots = 2, .ratio = 2, .page_entries = 2, .swa_block = 16, .p0 = 20, .r0 = 22,
       .e8m0 = true, .last = true, .empty = true, .p_invalid = 1, .qamp = 1},
      /* The op folds entries in blocks of 32: sets across and exactly at
       * block boundaries, with large logits so later blocks raise the max. */
      {.name = "entry blocks: 3 heads, d 40, topk 41 + window 24, large logits", .S = 3, .H = 3, .d = 40,
       .block = 8, .rope_dim = 8, .topk = 41, .window = 24, .extra_slots = 5, .ratio = 1, .page_entries = 6,
       .swa_block = 8, .p0 = 300, .sink = true, .e8m0 = true, .last = true, .holes = true, .p_invalid = 0.15,
       .qamp = 8},
      {.name = "saturated at 33 entries: a full block and one entry, no sink", .S = 2, .H = 2, .d = 24,
       .block = 8, .rope_dim = 8, .topk = 27, .window = 6, .extra_slots = 3, .ratio = 1, .page_entries = 4,
       .swa_block = 24, .p0 = 150, .last = true, .saturated = true, .qamp = 3},
      {.name = "saturated at 64 entries: two full blocks", .S = 2, .H = 3, .d = 32, .block = 16, .rope_dim = 8,
       .topk = 57, .window = 7, .extra_slots = 2, .ratio = 1, .page_entries = 5, .swa_block = 32, .p0 = 400,
       .sink = true, .e8m0 = true, .last = true, .saturated = true, .qamp = 6},
      {.name = "V4.1 sizes: d 512, topk 512, window 128 (4 heads)", .S = 2, .H = 4, .d = 512, .block = 16,
       .rope_dim = 64, .topk = 512, .window = 128, .extra_slots = 6, .ratio = 1, .page_entries = 64,
       .swa_block = 32, .p0 = 2000, .sink = true, .e8m0 = true, .last = true, .yarn = true, .holes = true,
       .p_invalid = 0.1, .qamp = 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
  test_joint_softmax();
  test_shift();
  test_both_paths();
  test_nan_propagates();
  check_oproj(3, 4, 8, 2, 5, 7);
  check_oproj(2, 6, 5, 3, 4, 9);
  check_oproj(1, 8, 16, 8, 12, 10);
  check_oproj(4, 3, 7, 1, 6, 5);
  check_oproj(2, 16, 64, 8, 32, 48);
  return h_report("ops_attention");
}
