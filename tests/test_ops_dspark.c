/* test_ops_dspark.c: the DSpark heads and verify-length choice
 * (ops/dspark.h) and the sampler they use (ops/sample.h), against float64
 * references and hand-computed cases written here.
 *
 * What it is:
 *   - splitmix64 against its published seed-0 outputs; reproducibility;
 *   - greedy: ties to the lower id, -inf masks, NaN/+inf rejected;
 *   - softmax with temperature vs float64 (bound below); temperature -> 0
 *     behaves as greedy, temperature 0 is greedy and draws nothing;
 *   - top-p keeps exactly the smallest prefix with mass >= p: dyadic
 *     distributions where every prefix mass is exact (ties at p included),
 *     and random ones against a selection-sort reference; op_sample_top_p
 *     and op_sample's nucleus bit for bit against a full sort (qsort) on
 *     random and tie-heavy distributions;
 *   - empirical frequencies of 200 000 draws within 5 binomial sigmas of
 *     the distribution (with and without top-p), the same seed giving the
 *     same sequence;
 *   - Markov head logits vs float64, greedy and sampled drafting left to
 *     right; confidence head vs float64; E[A(L)] and L* on hand cases.
 *
 * Tolerances. Softmax: the op forms fl(fl(l - m) / T) (2 roundings, so the
 * argument a is off by <= gamma(2)|a|), expf adds 1 ulp (2u) of relative
 * error, so each term is within eps_y = gamma(2)|a_y| + 2u relative; the
 * fp32 sum of V positive terms adds gamma(V); the division adds u:
 * |p - ref| <= ref (eps_y + max eps + gamma(V + 1)). Markov logits: sgemm of
 * `rank` products plus the base: gamma(rank + 1)(|base| + sum|A U|).
 * Confidence: z = w.h + b within gamma(d + 1)(sum|w h| + |b|) =: dz; the
 * sigmoid's slope is <= 1/4 and expf, 1+, / add gamma(4) relative.
 * E[A(L)]: i-1 products and L-1 adds of positive terms: gamma(2 Lmax).
 * Frequencies: a count c ~ Binomial(N, p) is within 5 sqrt(N p (1-p)) of
 * N p except with probability ~6e-7 per id; a fixed seed makes the check
 * deterministic, and a wrong draw rule moves counts by hundreds of sigmas.
 *
 * Run: ctest --test-dir build -R ops_dspark --output-on-failure
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/dspark.h"
#include "ops/sample.h"
#include "tests/harness.h"

/* ---- generator and greedy ----------------------------------------------- */

static void check_rng(void) {
  static const uint64_t want[4] = {0xE220A8397B1DCDAFull, 0x6E789E6AA1B965F4ull, 0x06C45D188009454Full,
                                   0xF88BB8A8724C81ECull}; /* splitmix64, seed 0 */
  uint64_t s = 0;
  for (int i = 0; i < 4; i++) EXPECT(op_rng_next(&s) == want[i], "splitmix64 output %d", i);
  uint64_t a = 12345, b = 12345;
  double lo = 1, hi = 0;
  for (int i = 0; i < 100000; i++) {
    double u = op_rng_uniform(&a);
    EXPECT(u == op_rng_uniform(&b), "same seed, same uniforms");
    lo = fmin(lo, u), hi = fmax(hi, u);
  }
  EXPECT(lo >= 0 && hi < 1 && lo < 1e-3 && hi > 1 - 1e-3, "uniform range [%g, %g]", lo, hi);
}

static void check_greedy(void) {
  float l1[] = {1, 3, 3, 2};
  EXPECT(op_sample_greedy(l1, 4) == 1, "tie between ids 1 and 2 goes to 1");
  float l2[] = {-INFINITY, -5, -INFINITY, -5, -7};
  EXPECT(op_sample_greedy(l2, 5) == 1, "-inf masked, tie to the lower id");
  float l3[] = {0, NAN, 1};
  EXPECT(op_sample_greedy(l3, 3) == -1, "NaN rejected");
  float l4[] = {0, INFINITY};
  EXPECT(op_sample_greedy(l4, 2) == -1, "+inf rejected");
  float l5[] = {-INFINITY, -INFINITY};
  EXPECT(op_sample_greedy(l5, 2) == -1, "all masked rejected");
  float prob[5];
  uint64_t s = 9;
  EXPECT(op_sample(prob, NULL, l2, 5, 0.0f, 0.9f, &s) == 1 && s == 9, "temperature 0: greedy, no draw");
  EXPECT(prob[1] == 1 && prob[0] == 0 && prob[3] == 0, "temperature 0: one-hot prob");
  EXPECT(op_sample_softmax(prob, l3, 3, 1.0f) == -1 && op_sample(prob, NULL, l5, 2, 1.0f, 1.0f, &s) == -1,
         "softmax rejects NaN and all -inf");
}

/* ---- softmax ------------------------------------------------------------ */

/* float64 softmax(l / T) of the float logits, and the bound of the header. */
static void ref_softmax(double *p, double *bound, const float *l, int V, float T) {
  double m = -INFINITY, sum = 0, max_eps = 0;
  for (int y = 0; y < V; y++) m = fmax(m, l[y]);
  for (int y = 0; y < V; y++) p[y] = exp(((double)l[y] - m) / T), sum += p[y];
  for (int y = 0; y < V; y++) {
    double a = isinf(l[y]) ? 0 : fabs(((double)l[y] - m) / T);
    bound[y] = h_gamma(2) * a + 2 * H_U32;
    max_eps = fmax(max_eps, bound[y]);
  }
  for (int y = 0; y < V; y++) {
    p[y] /= sum;
    bound[y] = p[y] * (bound[y] + max_eps + h_gamma(V + 1)) + 1e-300; /* masked ids: exactly 0 */
  }
}

static void check_softmax(int V, float T, uint64_t *seed) {
  float *l = malloc(V * sizeof *l), *p = h_alloc(V);
  double *ref = malloc(V * sizeof *ref), *bound = malloc(V * sizeof *bound);
  h_fill(l, V, seed, -8, 8);
  if (V > 2) l[V / 2] = -INFINITY;
  EXPECT(op_sample_softmax(p, l, V, T) == 0, "softmax V %d", V);
  ref_softmax(ref, bound, l, V, T);
  h_within(p, ref, bound, V, "softmax");
  h_free(p, V, "softmax p");
  free(l), free(ref), free(bound);
}

static void check_temperature_to_zero(uint64_t *seed) {
  enum { V = 33 };
  float l[V], prob[V];
  int32_t order[V];
  for (int y = 0; y < V; y++) l[y] = (float)(y % 7) * 0.25f; /* maxima 1.5 at ids 6, 13, 20, 27 */
  l[20] = 1.51f;                                          /* a unique maximum, 0.01 above the rest */
  int bad = 0;
  for (int i = 0; i < 2000; i++) {
    uint64_t s = *seed + (uint64_t)i;
    bad += op_sample(prob, order, l, V, 1e-4f, 1.0f, &s) != 20;
    bad += op_sample(prob, order, l, V, 1e-6f, 0.5f, &s) != 20;
  }
  EXPECT(bad == 0, "temperature -> 0 drew a non-argmax %d times", bad);
  EXPECT(op_sample_greedy(l, V) == 20, "greedy argmax");
}

/* ---- top-p -------------------------------------------------------------- */

static void check_top_p_exact(void) {
  /* Sorted: id1 .5, id3 .25, id0 .125, id2 .0625, id4 .0625 (tie: id 2 first). */
  static const float base[5] = {0.125f, 0.5f, 0.0625f, 0.25f, 0.0625f};
  static const struct {
    float p;
    int kept;
  } cases[] = {{0.0f, 1},   {0.25f, 1},   {0.5f, 1},  {0.5000001f, 2}, {0.75f, 2},
               {0.8f, 3},   {0.875f, 3},  {0.9f, 4},  {0.9375f, 4},    {0.94f, 5}, {1.0f, 5}};
  static const int32_t order_want[5] = {1, 3, 0, 2, 4};
  for (int scale = 1; scale <= 3; scale += 2) /* an unnormalized vector (mass 3) keeps the same sets */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      float prob[5];
      int32_t order[5];
      double mass = 0;
      for (int y = 0; y < 5; y++) prob[y] = base[y] * (float)scale;
      int kept = op_sample_top_p(prob, order, 5, cases[c].p);
      EXPECT(kept == cases[c].kept, "top_p %.7g: kept %d, want %d", cases[c].p, kept, cases[c].kept);
      EXPECT(!memcmp(order, order_want, sizeof order), "top_p order (ties to the lower id)");
      for (int i = 0; i < cases[c].kept; i++) mass += base[order_want[i]];
      for (int i = 0; i < 5; i++) {
        int y = order_want[i];
        double want = i < cases[c].kept ? base[y] / mass : 0.0; /* renormalized: one rounding */
        EXPECT(fabs(prob[y] - want) <= H_U32 * want, "top_p %.7g id %d: %g, want %g", cases[c].p, y, prob[y], want);
      }
    }
  float zero[3] = {0, 0, 0};
  int32_t o3[3];
  EXPECT(op_sample_top_p(zero, o3, 3, 0.5f) == -1, "no mass rejected");
}

static void check_top_p_random(int V, float top_p, uint64_t *seed) {
  float *prob = h_alloc(V), *orig = malloc(V * sizeof *orig);
  int32_t *order = (int32_t *)h_alloc_bytes(V * sizeof *order), *ref = malloc(V * sizeof *ref);
  char *used = calloc(V, 1);
  for (int y = 0; y < V; y++) orig[y] = (float)(int)(h_uniform(seed) * 50) / 64.0f; /* many ties and zeros */
  orig[V / 2] += 1.0f / 64; /* some mass */
  memcpy(prob, orig, V * sizeof *prob);
  int kept = op_sample_top_p(prob, order, V, top_p);
  double total = 0, run = 0;
  for (int y = 0; y < V; y++) total += orig[y];
  int want = 0;
  for (int i = 0; i < V; i++) { /* selection sort: largest p, then lowest id */
    int best = -1;
    for (int y = 0; y < V; y++)
      if (!used[y] && (best < 0 || orig[y] > orig[best])) best = y;
    used[best] = 1, ref[i] = best;
    if (want == i && orig[best] > 0 && (i == 0 || run < (double)top_p * total)) run += orig[best], want = i + 1;
  }
  EXPECT(!memcmp(order, ref, V * sizeof *ref), "top_p order V %d", V);
  EXPECT(kept == want, "top_p %.3g V %d: kept %d, want %d", top_p, V, kept, want);
  for (int i = 0; i < V; i++)
    EXPECT((prob[ref[i]] > 0) == (i < want), "top_p V %d: id %d kept = %d", V, ref[i], prob[ref[i]] > 0);
  h_free(prob, V, "top_p prob"), h_free_bytes((uint8_t *)order, V * sizeof *order, "top_p order");
  free(orig), free(ref), free(used);
}

/* The nucleus as it was first written (a full sort of all V ids, then the walk), kept
 * here as the reference the selection must match bit for bit: kept, order (op_sample_top_p
 * fills all of it) and every renormalized probability (the kept mass is a double sum in
 * placement order, so the same ids in the same order give the same bits). */
static const float *full_sort_p;
static int full_sort_cmp(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  float px = full_sort_p[x], py = full_sort_p[y];
  return px > py ? -1 : px < py ? 1 : (x > y) - (x < y); /* p descending, then id ascending */
}

static int full_sort_top_p(float *prob, int32_t *order, int V, float top_p) {
  double total = 0, threshold, kept_mass = 0;
  for (int y = 0; y < V; y++) total += prob[y], order[y] = y;
  full_sort_p = prob;
  qsort(order, (size_t)V, sizeof *order, full_sort_cmp);
  threshold = top_p >= 1.0f ? total : (double)top_p * total;
  int kept = 0;
  while (kept < V && prob[order[kept]] > 0.0f) {
    kept_mass += prob[order[kept]];
    kept++;
    if (kept_mass >= threshold) break;
  }
  for (int i = kept; i < V; i++) prob[order[i]] = 0.0f;
  for (int i = 0; i < kept; i++) prob[order[i]] = (float)(prob[order[i]] / kept_mass);
  return kept;
}

/* One distribution of V probabilities of the given kind: 0 softmax of wide logits, 1
 * coarse levels with many ties and zeros, 2 all equal, 3 powers of two down into the
 * subnormals (many ties across octaves), 4 one dominant id over a flat tail. */
static void nucleus_dist(float *p, int V, int kind, uint64_t *seed) {
  for (int y = 0; y < V; y++) {
    double u = h_uniform(seed);
    p[y] = kind == 0   ? (float)exp(12 * u - 12)
           : kind == 1 ? (float)(int)(u * 6) / 8.0f
           : kind == 2 ? 0.25f
           : kind == 3 ? ldexpf(1.0f, -(int)(u * 150))
                       : 1e-3f * (float)u;
  }
  if (kind == 4) p[(int)(h_uniform(seed) * V)] = 1.0f;
  p[(int)(h_uniform(seed) * V)] += 1.0f / 8; /* some mass in every kind */
}

/* op_sample_top_p, and op_sample's own nucleus (which sorts only the kept ids), against
 * full_sort_top_p on many random and tie-heavy distributions and nucleus masses. */
static void check_top_p_full_sort(uint64_t *seed) {
  static const int Vs[] = {1, 2, 7, 64, 1000, 4099};
  static const float ps[] = {0.0f, 0.1f, 0.5f, 0.9f, 0.999f, 1.0f};
  int bad_kept = 0, bad_order = 0, bad_prob = 0, bad_draw = 0, runs = 0;
  for (size_t v = 0; v < sizeof Vs / sizeof Vs[0]; v++) {
    int V = Vs[v];
    float *orig = malloc(V * sizeof *orig), *a = h_alloc(V), *b = malloc(V * sizeof *b), *l = malloc(V * sizeof *l);
    int32_t *oa = (int32_t *)h_alloc_bytes(V * sizeof *oa), *ob = malloc(V * sizeof *ob);
    for (int kind = 0; kind < 5; kind++)
      for (int rep = 0; rep < 4; rep++)
        for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++, runs++) {
          nucleus_dist(orig, V, kind, seed);
          memcpy(a, orig, V * sizeof *a), memcpy(b, orig, V * sizeof *b);
          int ka = op_sample_top_p(a, oa, V, ps[j]), kb = full_sort_top_p(b, ob, V, ps[j]);
          bad_kept += ka != kb;
          bad_order += memcmp(oa, ob, V * sizeof *oa) != 0;
          bad_prob += memcmp(a, b, V * sizeof *a) != 0;
          /* op_sample from logits whose softmax is orig up to rounding (ties stay ties):
           * its prob and draw against the full sort applied to op_sample_softmax's. */
          if (ps[j] >= 1.0f) continue;
          for (int y = 0; y < V; y++) l[y] = orig[y] > 0 ? logf(orig[y]) : -INFINITY;
          uint64_t sa = *seed, sb = *seed;
          int32_t ya = op_sample(a, oa, l, V, 1.0f, ps[j], &sa);
          EXPECT(op_sample_softmax(b, l, V, 1.0f) == 0, "softmax of the logits");
          full_sort_top_p(b, ob, V, ps[j]);
          bad_prob += memcmp(a, b, V * sizeof *a) != 0;
          bad_draw += ya != op_sample_draw(b, V, &sb);
        }
    h_free(a, V, "nucleus prob"), h_free_bytes((uint8_t *)oa, V * sizeof *oa, "nucleus order");
    free(orig), free(b), free(l), free(ob);
  }
  EXPECT(!bad_kept && !bad_order && !bad_prob && !bad_draw,
         "nucleus vs a full sort over %d runs: kept differs %d, order %d, prob %d, draw %d times", runs, bad_kept,
         bad_order, bad_prob, bad_draw);
}

/* ---- frequencies -------------------------------------------------------- */

static void check_frequencies(float T, float top_p, uint64_t seed0) {
  enum { V = 7, N = 200000 };
  static const float l[V] = {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};
  double p[V], bound[V], keep_mass = 0;
  ref_softmax(p, bound, l, V, T);
  int kept = V; /* the reference nucleus: ids are already sorted by p */
  for (int y = 0; y < V && top_p < 1; y++)
    if ((keep_mass += p[y]) >= top_p) {
      EXPECT(fabs(keep_mass - top_p) > 1e-4, "test setup: nucleus boundary too close to call");
      kept = y + 1;
      break;
    }
  if (top_p >= 1) kept = V, keep_mass = 1;
  float prob[V];
  int32_t order[V], *seq = malloc(N * sizeof *seq);
  long count[V] = {0};
  uint64_t s = seed0;
  for (int i = 0; i < N; i++) {
    seq[i] = op_sample(prob, order, l, V, T, top_p, &s);
    EXPECT(seq[i] >= 0 && seq[i] < V, "draw %d out of range", seq[i]);
    if (seq[i] >= 0 && seq[i] < V) count[seq[i]]++;
  }
  for (int y = 0; y < V; y++) {
    double q = y < kept ? p[y] / keep_mass : 0, sigma = sqrt(N * q * (1 - q));
    double tol = 5 * sigma + N * 4 * bound[y]; /* 5 sigma + the op's own rounding of p (twice, renormalized) */
    EXPECT(fabs(count[y] - N * q) <= tol, "T %.2g top_p %.2g id %d: %ld draws, expected %.1f +- %.1f", T, top_p, y,
           count[y], N * q, tol);
  }
  s = seed0;
  int same = 1;
  for (int i = 0; i < N && same; i++) same = op_sample(prob, order, l, V, T, top_p, &s) == seq[i];
  EXPECT(same, "the same seed reproduces the sequence");
  s = seed0 + 1;
  int differ = 0;
  for (int i = 0; i < 64; i++) differ += op_sample(prob, order, l, V, T, top_p, &s) != seq[i];
  EXPECT(differ > 0, "another seed gives another sequence");
  free(seq);
}

/* ---- Markov head -------------------------------------------------------- */

struct markov_case {
  int L, V, rank;
  float temperature, top_p;
};

static void check_markov(const struct markov_case *c, uint64_t *seed) {
  int L = c->L, V = c->V, R = c->rank;
  float *base = malloc((size_t)L * V * sizeof *base), *A = malloc((size_t)V * R * sizeof *A);
  float *U = malloc((size_t)V * R * sizeof *U), *logits = h_alloc((size_t)L * V), *prob = h_alloc(V);
  float *logits2 = malloc((size_t)L * V * sizeof *logits2), *prob2 = malloc(V * sizeof *prob2);
  int32_t *draft = (int32_t *)h_alloc_bytes(L * sizeof *draft), *order = malloc(V * sizeof *order);
  int32_t *draft2 = malloc(L * sizeof *draft2);
  h_fill(base, (size_t)L * V, seed, -2, 2), h_fill(A, (size_t)V * R, seed, -1, 1), h_fill(U, (size_t)V * R, seed, -1, 1);
  int32_t y0 = (int32_t)(h_uniform(seed) * V);
  uint64_t s0 = *seed, s = s0;
  int greedy = !(c->temperature > 0);
  EXPECT(op_dspark_markov_draft(draft, logits, prob, order, base, A, U, y0, L, V, R, c->temperature, c->top_p, &s) == 0,
         "markov draft");
  double *ref = malloc((size_t)L * V * sizeof *ref), *abs_ = malloc((size_t)L * V * sizeof *abs_);
  for (int i = 0; i < L; i++) { /* row i from the op's own previous draft: checked at i - 1 */
    int32_t prev = i ? draft[i - 1] : y0;
    for (int y = 0; y < V; y++) {
      double sum = base[(size_t)i * V + y], a = fabs(sum);
      for (int r = 0; r < R; r++) {
        double t = (double)A[(size_t)prev * R + r] * U[(size_t)y * R + r];
        sum += t, a += fabs(t);
      }
      ref[(size_t)i * V + y] = sum, abs_[(size_t)i * V + y] = a;
    }
  }
  h_close(logits, ref, abs_, (size_t)L * V, R + 1, 0, 0, "markov logits");
  uint64_t s2 = s0;
  for (int i = 0; i < L; i++) { /* each token is the sampler's pick from its row, in sequence */
    const float *row = logits + (size_t)i * V;
    int32_t want = greedy ? op_sample_greedy(row, V) : op_sample(prob2, order, row, V, c->temperature, c->top_p, &s2);
    EXPECT(draft[i] == want, "draft %d: %d, sampler says %d", i, draft[i], want);
    if (greedy) { /* and a true argmax of the float64 logits, up to rounding */
      double mx = -INFINITY, tol = 0;
      for (int y = 0; y < V; y++) mx = fmax(mx, ref[(size_t)i * V + y]), tol = fmax(tol, abs_[(size_t)i * V + y]);
      EXPECT(ref[(size_t)i * V + draft[i]] >= mx - 2 * h_gamma(R + 1) * tol, "greedy draft %d is the argmax", i);
    }
  }
  if (!greedy) {
    EXPECT(s2 == s && !memcmp(prob, prob2, V * sizeof *prob), "one draw per position; prob is the last row's");
    s = s0;
    op_dspark_markov_draft(draft2, logits2, prob2, order, base, A, U, y0, L, V, R, c->temperature, c->top_p, &s);
    EXPECT(!memcmp(draft, draft2, L * sizeof *draft), "same seed, same drafts");
  } else {
    EXPECT(op_dspark_markov_draft(draft2, logits2, NULL, NULL, base, A, U, y0, L, V, R, 0, 1, NULL) == 0 &&
               !memcmp(draft, draft2, L * sizeof *draft),
           "greedy drafting without sampler buffers");
  }
  EXPECT(op_dspark_markov_draft(draft2, logits2, NULL, NULL, base, A, U, V, L, V, R, 0, 1, NULL) == -1,
         "y0 out of range rejected");
  h_free(logits, (size_t)L * V, "markov logits"), h_free(prob, V, "markov prob");
  h_free_bytes((uint8_t *)draft, L * sizeof *draft, "markov draft");
  free(base), free(A), free(U), free(logits2), free(prob2), free(order), free(draft2), free(ref), free(abs_);
}

/* ---- confidence, E[A(L)], L* ------------------------------------------- */

static void check_confidence(int L, int d, uint64_t *seed) {
  float *h = malloc((size_t)L * d * sizeof *h), *w = malloc(d * sizeof *w), *a = h_alloc(L), b = 0.3f;
  double *ref = malloc(L * sizeof *ref), *bound = malloc(L * sizeof *bound);
  h_fill(h, (size_t)L * d, seed, -1, 1), h_fill(w, d, seed, -0.5f, 0.5f);
  op_dspark_confidence(a, h, w, b, L, d);
  for (int i = 0; i < L; i++) {
    double z = b, za = fabs(b);
    for (int j = 0; j < d; j++) z += (double)w[j] * h[(size_t)i * d + j], za += fabs((double)w[j] * h[(size_t)i * d + j]);
    ref[i] = 1 / (1 + exp(-z));
    bound[i] = h_gamma(d + 1) * za / 4 + h_gamma(4) * ref[i];
  }
  h_within(a, ref, bound, L, "confidence");
  h_free(a, L, "confidence a");
  free(h), free(w), free(ref), free(bound);
}

static void check_expected_accept(void) {
  float half[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, e[6];
  op_dspark_expected_accept(e, half, 5);
  static const float want[6] = {0, 0.5f, 0.75f, 0.875f, 0.9375f, 0.96875f}; /* dyadic: exact */
  for (int L = 0; L <= 5; L++) EXPECT(e[L] == want[L], "E[A(%d)] = %g, want %g", L, e[L], want[L]);
  float ones[3] = {1, 1, 1};
  op_dspark_expected_accept(e, ones, 3);
  EXPECT(e[0] == 0 && e[1] == 1 && e[2] == 2 && e[3] == 3, "all-accept: E[A(L)] = L");
  float a[5] = {0.9f, 0.8f, 0.5f, 0.2f, 0.1f};
  /* By hand, from the decimal a: P = .9 .72 .36 .072 .0072. The float a
   * differ from the decimals by < 1e-8 relative, hence the 1e-7 below. */
  double ref[6] = {0, 0.9, 1.62, 1.98, 2.052, 2.0592};
  op_dspark_expected_accept(e, a, 5);
  double p = 1, run = 0, fref[6] = {0};
  for (int L = 1; L <= 5; L++) p *= a[L - 1], run += p, fref[L] = run;
  for (int L = 0; L <= 5; L++) EXPECT(fabs(fref[L] - ref[L]) < 1e-7, "hand value E[A(%d)]", L);
  h_close(e, fref, NULL, 6, 10, 0, 0, "E[A(L)]"); /* gamma(2 Lmax) */
  op_dspark_expected_accept(e, a, 0);
  EXPECT(e[0] == 0, "Lmax 0");
}

static void check_verify_len(void) {
  float half[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, score[6];
  float flat[6] = {1, 1, 1, 1, 1, 1};
  EXPECT(op_dspark_verify_len(score, half, flat, 5) == 5, "flat cost: verify everything");
  EXPECT(score[0] == 1 && score[5] == 1.96875f, "flat scores");
  float tied[6] = {1, 1.5f, 1.75f, 1.875f, 1.9375f, 1.96875f}; /* T = 1 + E: every score exactly 1 */
  EXPECT(op_dspark_verify_len(score, half, tied, 5) == 0, "equal scores: the shortest L");
  /* a = .9 .8 .5 .2 .1, T = 1 + L/10: scores 1, 1.727, 2.183, 2.292, 2.180, 2.039 -> L* = 3. */
  float a[5] = {0.9f, 0.8f, 0.5f, 0.2f, 0.1f}, lin[6] = {1.0f, 1.1f, 1.2f, 1.3f, 1.4f, 1.5f};
  EXPECT(op_dspark_verify_len(score, a, lin, 5) == 3, "hand case: L* = 3");
  static const double want[6] = {1.0, 1.9 / 1.1, 2.62 / 1.2, 2.98 / 1.3, 3.052 / 1.4, 3.0592 / 1.5};
  for (int L = 0; L <= 5; L++)
    EXPECT(fabs(score[L] - want[L]) <= 1e-6 * want[L], "score(%d) = %.7g, want %.7g", L, score[L], want[L]);
  float steep[6] = {1, 4, 9, 16, 25, 36}; /* verifying costs more than a draft can return */
  EXPECT(op_dspark_verify_len(NULL, a, steep, 5) == 0, "steep cost: verify nothing");
  float low[2] = {0.05f};
  float cheap[2] = {1.0f, 1.04f}; /* (1 + .05)/1.04 > 1 */
  EXPECT(op_dspark_verify_len(NULL, low, cheap, 1) == 1, "low confidence, cheaper-than-confidence cost: L = 1");
  float bad[6] = {1, 1, 0, 1, 1, 1};
  EXPECT(op_dspark_verify_len(score, a, bad, 5) == -1, "zero cost rejected");
  bad[2] = INFINITY;
  EXPECT(op_dspark_verify_len(score, a, bad, 5) == -1, "infinite cost rejected");
  EXPECT(op_dspark_verify_len(NULL, a, lin, 0) == 0, "Lmax 0");
}

int main(void) {
  op_blas_init();
  uint64_t seed = 0xD5A4C001;
  check_rng();
  check_greedy();
  check_softmax(1, 1.0f, &seed);
  check_softmax(7, 0.7f, &seed);
  check_softmax(129, 1.0f, &seed);
  check_softmax(1001, 3.0f, &seed);
  check_temperature_to_zero(&seed);
  check_top_p_exact();
  check_top_p_random(1, 0.3f, &seed);
  check_top_p_random(37, 0.5f, &seed);
  check_top_p_random(200, 0.9f, &seed);
  check_top_p_random(99, 0.0f, &seed);
  check_top_p_full_sort(&seed);
  check_frequencies(1.0f, 1.0f, 1234);
  check_frequencies(2.0f, 1.0f, 99);
  check_frequencies(1.0f, 0.8f, 7);
  check_frequencies(0.5f, 0.95f, 5);
  struct markov_case mc[] = {{5, 50, 16, 0, 1}, {3, 37, 7, 0, 1}, {1, 11, 1, 0, 1},
                             {5, 64, 16, 0.9f, 0.95f}, {4, 33, 5, 1.0f, 1.0f}};
  for (size_t i = 0; i < sizeof mc / sizeof mc[0]; i++) check_markov(&mc[i], &seed);
  check_confidence(5, 64, &seed);
  check_confidence(3, 37, &seed);
  check_confidence(1, 1, &seed);
  check_expected_accept();
  check_verify_len();
  return h_report("ops_dspark");
}
