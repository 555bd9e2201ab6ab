/* test_ops_sample.c: ops/sample.h's top-k and repetition penalty against a
 * float64 reference (issue 13 section 4). Greedy, top-p and the generator
 * are tests/test_ops_dspark.c's.
 *
 * What it checks:
 *   - the penalty: every seen id (duplicates once) gets l/theta (l >= 0) or
 *     l*theta (l < 0), others unchanged, bit for bit against the float64
 *     quotient/product rounded to fp32 (one correctly rounded fp32 operation
 *     equals the double result rounded, since 53 >= 2*24 + 2: double
 *     rounding is innocuous for * and /); -inf stays -inf; an id outside
 *     [0, V) is refused with out untouched; penalty then greedy moves the
 *     argmax;
 *   - top-k (then top-p among the k): the kept set equals the float64
 *     reference's (cases whose top-p boundary lies within rounding of the
 *     threshold are skipped and counted, at most a few), and each kept
 *     probability is within the tolerance derived below;
 *   - top-k off (k <= 0 or k >= V) is op_sample bit for bit (ids, prob,
 *     generator state), so the rules before top-k stay exact;
 *   - the same seed gives the same draws; the draws' frequencies match the
 *     reference distribution within 5 standard deviations and never leave
 *     the top k.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/sample.h"
#include "tests/harness.h"

static uint64_t lcg = 0x243F6A8885A308D3ull;
static double urand(void) {
  lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(lcg >> 11) * 0x1p-53;
}

static void test_penalty(void) {
  enum { V = 1000, NS = 300 };
  float l[V], out[V], before[V];
  int32_t seen[NS];
  const float thetas[] = {1.3f, 0.7f, 2.0f};
  for (int t = 0; t < 3; t++) {
    for (int i = 0; i < V; i++) l[i] = (float)(urand() * 20 - 10);
    l[3] = 0.0f, l[4] = -INFINITY, l[5] = -0.0f;
    for (int i = 0; i < NS; i++) seen[i] = (int32_t)(urand() * 50); /* many duplicates */
    seen[0] = 3, seen[1] = 4, seen[2] = 5, seen[3] = 999;
    EXPECT(op_sample_penalize(out, l, V, seen, NS, thetas[t]) == 0, "penalize failed");
    bool is_seen[V] = {0};
    for (int i = 0; i < NS; i++) is_seen[seen[i]] = true;
    int bad = 0;
    for (int y = 0; y < V; y++) {
      double ref = is_seen[y] ? (l[y] < 0 ? (double)l[y] * thetas[t] : (double)l[y] / thetas[t]) : l[y];
      float want = (float)ref;
      if (memcmp(&want, &out[y], sizeof want) && !(isinf(want) && isinf(out[y]) && want == out[y])) bad++;
    }
    EXPECT(bad == 0, "theta %g: %d ids differ from the float64 reference", thetas[t], bad);
    EXPECT(out[4] == -INFINITY && out[3] == 0.0f, "-inf and 0 stay");
  }
  /* an id outside [0, V): refused, out untouched */
  for (int y = 0; y < V; y++) out[y] = before[y] = (float)y;
  seen[7] = V;
  EXPECT(op_sample_penalize(out, l, V, seen, NS, 1.5f) == -1, "id V must be refused");
  seen[7] = -1;
  EXPECT(op_sample_penalize(out, l, V, seen, NS, 1.5f) == -1, "id -1 must be refused");
  EXPECT(!memcmp(out, before, sizeof out), "a refused penalty must not write");
  /* penalty then greedy: the seen maximum loses to an unseen one */
  float g[4] = {1.0f, 3.0f, 2.5f, -1.0f}, pg[4];
  int32_t s1[2] = {1, 1};
  EXPECT(op_sample_greedy(g, 4) == 1, "greedy before");
  op_sample_penalize(pg, g, 4, s1, 2, 1.25f); /* 3 / 1.25 = 2.4 < 2.5 */
  EXPECT(op_sample_greedy(pg, 4) == 2, "greedy after the penalty picks id 2");
}

static const double *sort_p;
static int by_p(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  if (sort_p[x] != sort_p[y]) return sort_p[x] > sort_p[y] ? -1 : 1;
  return x < y ? -1 : x > y;
}

/* The float64 reference of softmax(l / T), top-k, top-p among the k. keep[y]
 * set for kept ids, ref[y] their renormalized probability. Returns false
 * when the top-p boundary is within `margin` (relative) of the threshold. */
static bool reference(const float *l, int V, float T, int k, float top_p, bool *keep, double *ref, double margin) {
  double m = -INFINITY, sum = 0;
  for (int y = 0; y < V; y++) m = fmax(m, l[y]);
  double *p = malloc(sizeof(double) * V);
  int *ord = malloc(sizeof(int) * V);
  for (int y = 0; y < V; y++) sum += p[y] = exp(((double)l[y] - m) / T), ord[y] = y;
  for (int y = 0; y < V; y++) p[y] /= sum;
  sort_p = p;
  qsort(ord, (size_t)V, sizeof *ord, by_p); /* p descending, ties by id */
  double mk = 0;
  for (int i = 0; i < k; i++) mk += p[ord[i]];
  int kept = k;
  bool clear = true;
  if (top_p < 1) {
    double th = top_p * mk, c = 0;
    kept = 0;
    while (kept < k && c < th) c += p[ord[kept++]];
    double prev = c - p[ord[kept - 1]];
    clear = fabs(c - th) > margin * mk && fabs(prev - th) > margin * mk;
  }
  double km = 0;
  for (int i = 0; i < kept; i++) km += p[ord[i]];
  for (int y = 0; y < V; y++) keep[y] = false, ref[y] = 0;
  for (int i = 0; i < kept; i++) keep[ord[i]] = true, ref[ord[i]] = p[ord[i]] / km;
  free(p), free(ord);
  return clear;
}

static void test_top_k(void) {
  enum { V = 2000 };
  float *l = malloc(sizeof(float) * V), *prob = malloc(sizeof(float) * V);
  int32_t *order = malloc(sizeof(int32_t) * V);
  bool *keep = malloc(V);
  double *ref = malloc(sizeof(double) * V);
  const float Ts[] = {0.7f, 1.0f, 1.6f}, ps[] = {1.0f, 0.9f, 0.5f};
  const int ks[] = {1, 5, 50, 400};
  int cases = 0, skipped = 0;
  for (int rep = 0; rep < 4; rep++)
    for (int ti = 0; ti < 3; ti++)
      for (int ki = 0; ki < 4; ki++)
        for (int pi = 0; pi < 3; pi++) {
          /* distinct logits 0.01 apart in random order: neighbouring probabilities differ by >= 0.6%, far
           * beyond fp32 rounding, so the top-k set is decided; -inf for a few masked ids */
          for (int y = 0; y < V; y++) l[y] = (float)(0.01 * y);
          for (int y = V - 1; y > 0; y--) {
            int j = (int)(urand() * (y + 1));
            float t = l[y];
            l[y] = l[j], l[j] = t;
          }
          l[(int)(urand() * V)] = -INFINITY;
          float T = Ts[ti], top_p = ps[pi];
          int k = ks[ki];
          /* margin: the softmax's normalization error is one factor common to every probability, so it
           * moves the kept mass and the threshold alike; what moves the boundary is each probability's own
           * error, (2|arg| + 3)u at most (below), 2 more u for the walk's double sum: twice that is clear */
          double max_arg = 0.01 * V / T;
          if (!reference(l, V, T, k, top_p, keep, ref, 2 * (2 * max_arg + 5) * H_U32)) {
            skipped++;
            continue;
          }
          cases++;
          EXPECT(op_sample_softmax(prob, l, V, T) == 0, "softmax");
          int kept = op_sample_top_k(prob, order, V, k, top_p), want = 0, wrong = 0, far = 0;
          double m = -INFINITY;
          for (int y = 0; y < V; y++) m = fmax(m, l[y]);
          for (int y = 0; y < V; y++) {
            want += keep[y];
            if (keep[y] != (prob[y] > 0)) wrong++;
            if (!keep[y]) continue;
            /* tolerance: the exponent's argument (l - m)/T is two fp32 roundings off, so exp moves by
             * 2u|arg| relative, plus 2u for expf itself; the softmax sum of V terms gamma(V), the
             * division u; the renormalization: the kept mass in double (negligible) and one division
             * and the rounding to fp32, 2u */
            double arg = fabs(((double)l[y] - m) / T);
            double tol = (2 * arg + 2 + 1 + 2) * H_U32 + h_gamma(V);
            if (fabs(prob[y] - ref[y]) > tol * ref[y]) far++;
          }
          EXPECT(kept == want && !wrong, "T %g k %d top_p %g: kept %d ids, reference %d, %d differ", T, k, top_p, kept,
                 want, wrong);
          EXPECT(!far, "T %g k %d top_p %g: %d probabilities outside the tolerance", T, k, top_p, far);
        }
  EXPECT(cases >= 130 && skipped <= 14, "%d cases ran, %d skipped at a top-p boundary", cases, skipped);
  /* fewer ids with p > 0 than k: those are kept */
  float q[6] = {0.5f, 0, 0.25f, 0, 0.25f, 0};
  int32_t o6[6];
  EXPECT(op_sample_top_k(q, o6, 6, 5, 1.0f) == 3 && q[0] == 0.5f && q[1] == 0, "k above the ids with mass");
  free(l), free(prob), free(order), free(keep), free(ref);
}

/* k <= 0 or k >= V: op_sample's bits; top-k sampling is deterministic per seed and draws in proportion. */
static void test_draws(void) {
  enum { V = 16, N = 200000 };
  float l[V], p1[V], p2[V];
  int32_t o1[V], o2[V];
  for (int y = 0; y < V; y++) l[y] = (float)(urand() * 4);
  for (int rep = 0; rep < 50; rep++) {
    uint64_t a = 1000 + rep, b = a;
    int k = rep % 2 ? 0 : V;
    int32_t x = op_sample_k(p1, o1, l, V, 0.8f, k, 0.9f, &a), y = op_sample(p2, o2, l, V, 0.8f, 0.9f, &b);
    EXPECT(x == y && a == b && !memcmp(p1, p2, sizeof p1), "top-k off must be op_sample (rep %d)", rep);
  }
  uint64_t s1 = 42, s2 = 42, s3 = 43;
  int same = 1, diff = 0;
  for (int i = 0; i < 100; i++) {
    int32_t a = op_sample_k(p1, o1, l, V, 1.0f, 6, 1.0f, &s1), b = op_sample_k(p2, o2, l, V, 1.0f, 6, 1.0f, &s2);
    int32_t c = op_sample_k(p2, o2, l, V, 1.0f, 6, 1.0f, &s3);
    same &= a == b;
    diff += a != c;
  }
  EXPECT(same && diff > 10, "the same seed draws the same ids (%d), another seed others (%d of 100 differ)", same, diff);
  bool keep[V];
  double ref[V];
  reference(l, V, 1.0f, 4, 1.0f, keep, ref, 0);
  int count[V] = {0};
  uint64_t s = 7;
  for (int i = 0; i < N; i++) count[op_sample_k(p1, o1, l, V, 1.0f, 4, 1.0f, &s)]++;
  for (int y = 0; y < V; y++) {
    double sd = sqrt(ref[y] * (1 - ref[y]) / N), f = (double)count[y] / N;
    EXPECT(keep[y] ? fabs(f - ref[y]) <= 5 * sd : count[y] == 0, "id %d: frequency %g, reference %g (sd %g)", y, f,
           ref[y], sd);
  }
}

int main(void) {
  test_penalty();
  test_top_k();
  test_draws();
  return h_report("ops_sample");
}
