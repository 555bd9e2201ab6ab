/* dspark.c: DSpark Markov head, confidence head, expected accepted length
 * and verify-length choice (see dspark.h). */
#include "ops/dspark.h"

#include <math.h>
#include <stddef.h>

#include "ops/basic.h"
#include "ops/sample.h"
#include "runtime/check.h"

int op_dspark_markov_draft(int32_t *draft, float *logits, float *prob, int32_t *order, const float *base,
                           const float *A, const float *U, int32_t y0, int L, int V, int rank, float temperature,
                           float top_p, uint64_t *rng) {
  CEDAR_ASSERT_MSG(!(temperature > 0.0f) || (prob && order && rng), "sampled drafting needs prob, order and rng");
  int32_t prev = y0;
  for (int i = 0; i < L; i++) {
    if (prev < 0 || prev >= V) return -1;
    float *li = logits + (size_t)i * V;
    const float *bi = base + (size_t)i * V;
    /* The only sequential part: one rank-wide row of A through U. */
    op_linear(li, A + (size_t)prev * rank, U, 1, rank, V, rank, V);
    for (int y = 0; y < V; y++) li[y] += bi[y];
    int32_t y = prob ? op_sample(prob, order, li, V, temperature, top_p, rng) : op_sample_greedy(li, V);
    if (y < 0) return -1;
    draft[i] = prev = y;
  }
  return 0;
}

void op_dspark_confidence(float *a, const float *h, const float *w_c, float b_c, int L, int d) {
  op_linear(a, h, w_c, L, d, 1, d, 1); /* a linear layer with one output */
  for (int i = 0; i < L; i++) a[i] = op_sigmoid(a[i] + b_c);
}

void op_dspark_expected_accept(float *e, const float *a, int Lmax) {
  float p = 1.0f;
  e[0] = 0.0f;
  for (int i = 1; i <= Lmax; i++) {
    p *= a[i - 1]; /* P_i: drafts 1..i all accepted */
    e[i] = e[i - 1] + p;
  }
}

int op_dspark_verify_len(float *score, const float *a, const float *t_round, int Lmax) {
  for (int L = 0; L <= Lmax; L++)
    if (!(t_round[L] > 0.0f) || !isfinite(t_round[L])) return -1;
  int best = 0;
  float best_s = 0.0f, p = 1.0f, e = 0.0f;
  for (int L = 0; L <= Lmax; L++) {
    if (L > 0) p *= a[L - 1], e += p;
    float s = (1.0f + e) / t_round[L];
    if (score) score[L] = s;
    if (L == 0 || s > best_s) best_s = s, best = L; /* strict: ties keep the shorter L */
  }
  return best;
}
