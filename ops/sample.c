/* sample.c: greedy, temperature and top-p sampling (see sample.h for the
 * exact rules, the generator and what is reproducible). */
#include "ops/sample.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/registry.h"
#include "runtime/check.h"

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

/* ---- registry descriptor (ops/registry.h) ------------------------------- */

/* temperature (finite, >= 0; 0 = greedy), top_p in (0, 1], seed an integer a
 * double holds exactly; false after op_io_fail otherwise. */
bool op_sample_params(const struct op_desc *self, struct op_io *io, float *temperature, float *top_p,
                           uint64_t *seed) {
  double t = op_io_param(self, io, "temperature"), p = op_io_param(self, io, "top_p");
  int64_t s;
  if (!(t >= 0) || !isfinite(t) || !(p > 0 && p <= 1))
    return op_io_fail(io, "%s: temperature = %g must be finite and >= 0 (0 = greedy), top_p = %g in (0, 1]",
                      self->name, t, p),
           false;
  if (!op_io_param_int(self, io, "seed", 0, (int64_t)1 << 53, &s)) return false;
  *temperature = (float)t, *top_p = (float)p, *seed = (uint64_t)s;
  return true;
}

/* Rows are sampled in order from one generator seeded once: row i's draw is
 * the i-th draw of the sequence (greedy rows take none). */
static int sample_run(const struct op_desc *self, struct op_io *io) {
  int64_t ld[2];
  float temperature, top_p;
  uint64_t rng;
  const struct op_tensor *logits = op_io_in(self, io, "logits", 2, ld);
  if (!logits || !op_sample_params(self, io, &temperature, &top_p, &rng)) return CEDAR_EINVAL;
  if (ld[0] > INT32_MAX || ld[1] < 1 || ld[1] > INT32_MAX)
    return op_io_fail(io, "sample: logits is (%lld, %lld); it needs rows of 1 to %d values", (long long)ld[0],
                      (long long)ld[1], INT32_MAX);
  int64_t n = ld[0], V = ld[1];
  int32_t *ids = op_io_out(self, io, "ids", 1, (int64_t[]){n});
  float *prob = ids ? op_io_out(self, io, "prob", 2, ld) : NULL;
  if (!prob) return CEDAR_ENOMEM;
  int32_t *order = malloc((size_t)V * sizeof *order);
  if (!order) return op_io_fail(io, "sample: cannot allocate %lld ids of workspace", (long long)V), CEDAR_ENOMEM;
  int rc = 0;
  for (int64_t i = 0; i < n && !rc; i++) {
    ids[i] = op_sample(prob + i * V, order, (const float *)logits->data + i * V, (int)V, temperature, top_p, &rng);
    if (ids[i] < 0) rc = op_io_fail(io, "sample: logits row %lld holds NaN or +inf, or no finite value", (long long)i);
  }
  free(order);
  return rc;
}

const struct op_desc op_desc_sample = {
    .name = "sample",
    .summary = "token sampling per row: greedy, or temperature + top-p with a seeded splitmix64",
    .inputs = (const struct op_arg[]){{"logits", OP_F32, "(n, V)", "one row of logits per token (-inf = masked)"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"ids", OP_I32, "(n)", "chosen token ids"},
                                       {"prob", OP_F32, "(n, V)", "distribution each id was drawn from (one-hot when "
                                                                  "greedy)"},
                                       {0}},
    .params = (const struct op_param[]){{"temperature", OP_PARAM_FLOAT, 0, "0 = greedy [cedar; SPEC silent]"},
                                        {"top_p", OP_PARAM_FLOAT, 1, "nucleus mass, 1 = off [cedar; SPEC silent]"},
                                        {"seed", OP_PARAM_INT, 0, "splitmix64 seed, one draw per sampled row [cedar]"},
                                        {0}},
    .run = sample_run,
};
