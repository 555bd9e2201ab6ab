/* sample.c: greedy, temperature and top-p sampling (see sample.h for the
 * exact rules, the generator and what is reproducible). */
#include "ops/sample.h"

#include <math.h>

uint64_t op_rng_next(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double op_rng_uniform(uint64_t *state) { return (double)(op_rng_next(state) >> 11) * 0x1p-53; }

/* A logit vector is usable when every value is finite or -inf. */
static int bad_logit(float l) { return isnan(l) || (isinf(l) && l > 0); }

int32_t op_sample_greedy(const float *logits, int V) {
  int32_t best = -1;
  float best_v = -INFINITY;
  for (int y = 0; y < V; y++) {
    if (bad_logit(logits[y])) return -1;
    if (logits[y] > best_v) best_v = logits[y], best = y; /* strict: ties keep the lower id */
  }
  return best;
}

int op_sample_softmax(float *prob, const float *logits, int V, float temperature) {
  float m = -INFINITY;
  for (int y = 0; y < V; y++) {
    if (bad_logit(logits[y])) return -1;
    if (logits[y] > m) m = logits[y];
  }
  if (m == -INFINITY) return -1;
  float sum = 0.0f;
  for (int y = 0; y < V; y++) {
    prob[y] = expf((logits[y] - m) / temperature); /* -inf logits give exactly 0 */
    sum += prob[y];
  }
  for (int y = 0; y < V; y++) prob[y] /= sum; /* sum >= 1: the max term is exp(0) */
  return 0;
}

/* true when id a is placed after id b: lower probability, or equal
 * probability and a higher id. A strict total order, so the sort below is
 * deterministic although heapsort is not stable. */
static int placed_after(const float *p, int32_t a, int32_t b) { return p[a] < p[b] || (p[a] == p[b] && a > b); }

static void sift_down(int32_t *o, const float *p, int root, int end) {
  for (;;) {
    int child = 2 * root + 1;
    if (child >= end) return;
    if (child + 1 < end && placed_after(p, o[child + 1], o[child])) child++;
    if (!placed_after(p, o[child], o[root])) return;
    int32_t t = o[root];
    o[root] = o[child], o[child] = t;
    root = child;
  }
}

/* Heapsort of all ids into placement order: O(V log V), no allocation. */
static void sort_by_prob(int32_t *order, const float *p, int V) {
  for (int y = 0; y < V; y++) order[y] = y;
  for (int i = V / 2 - 1; i >= 0; i--) sift_down(order, p, i, V);
  for (int end = V - 1; end > 0; end--) {
    int32_t t = order[0];
    order[0] = order[end], order[end] = t;
    sift_down(order, p, 0, end);
  }
}

static double total_mass(const float *prob, int V) {
  double total = 0.0;
  for (int y = 0; y < V; y++) total += prob[y];
  return total;
}

int op_sample_top_p(float *prob, int32_t *order, int V, float top_p) {
  double total = total_mass(prob, V);
  if (!(total > 0.0) || !isfinite(total)) return -1;
  sort_by_prob(order, prob, V);
  double threshold = top_p >= 1.0f ? total : (double)top_p * total;
  double kept_mass = 0.0;
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

int32_t op_sample_draw(const float *prob, int V, uint64_t *rng) {
  double total = total_mass(prob, V);
  if (!(total > 0.0) || !isfinite(total)) return -1;
  double u = op_rng_uniform(rng) * total;
  double run = 0.0;
  int32_t last = -1;
  for (int y = 0; y < V; y++) {
    if (!(prob[y] > 0.0f)) continue;
    run += prob[y];
    last = y;
    if (run > u) return y;
  }
  return last; /* u within rounding of the total: the last id with mass */
}

int32_t op_sample(float *prob, int32_t *order, const float *logits, int V, float temperature, float top_p,
                  uint64_t *rng) {
  if (!(temperature > 0.0f)) {
    int32_t y = op_sample_greedy(logits, V);
    if (y < 0) return -1;
    for (int i = 0; i < V; i++) prob[i] = 0.0f;
    prob[y] = 1.0f;
    return y;
  }
  if (op_sample_softmax(prob, logits, V, temperature) != 0) return -1;
  if (top_p < 1.0f && op_sample_top_p(prob, order, V, top_p) < 0) return -1;
  return op_sample_draw(prob, V, rng);
}
