/* sample.c: greedy, temperature and top-p sampling (see sample.h for the
 * exact rules, the generator and what is reproducible). */
#include "ops/sample.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/registry.h"
#include "base/check.h"

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

/* Heapsort of n ids into placement order: O(n log n), no allocation. A run that is
 * already in order (a bucket of equal probabilities: ids arrive ascending) is left as is. */
static void sort_by_prob(int32_t *o, const float *p, int n) {
  int i = 1;
  while (i < n && !placed_after(p, o[i - 1], o[i])) i++;
  if (i >= n) return;
  for (i = n / 2 - 1; i >= 0; i--) sift_down(o, p, i, n);
  for (int end = n - 1; end > 0; end--) {
    int32_t t = o[0];
    o[0] = o[end], o[end] = t;
    sift_down(o, p, 0, end);
  }
}

/* The nucleus without sorting all V ids. Ids are first distributed by the top bits of
 * their probability's fp32 pattern (for p >= 0 the pattern orders like the value) into
 * buckets, highest bucket first, ids ascending within a bucket (a counting sort: two passes
 * over V). Buckets are then sorted one at a time, highest first, and the walk of
 * op_sample_top_p runs over each sorted bucket: order[0..kept) is then exactly the prefix
 * of the full placement order, so kept and the kept mass (the same double sum in the same
 * order) are those of a full sort. The walk stops at the first id with p <= 0 (bucket 0
 * holds p <= 0 with the smallest p > 0). With sort_all every bucket is sorted and order is the
 * full placement order; otherwise order[kept..V) holds the other ids in no set order.
 * Any number of top bits orders the buckets; 18 bits of shift (32 buckets per octave of
 * p) keep the buckets near the nucleus small at V = 129,280, fewer serve a small V. */
enum { MIN_SHIFT = 18, MAX_BUCKETS = 1 << (31 - MIN_SHIFT) }; /* at most 32 buckets per octave */

/* p >= 0 finite: the top bits of its pattern (bits < 2^31); p <= 0 in bucket 0. */
static int bucket_of(float p, int shift) {
  uint32_t bits;
  memcpy(&bits, &p, sizeof bits);
  return p > 0.0f ? (int)(bits >> shift) : 0;
}

static int nucleus(int32_t *order, double *kept_mass, const float *prob, int V, double threshold, bool sort_all,
                   int max_kept) {
  int shift = MIN_SHIFT; /* no more buckets than ids: a small V does not pay for empty ones */
  while (shift < 31 && (1 << (31 - shift)) > V) shift++;
  int nb = 1 << (31 - shift), edge[MAX_BUCKETS]; /* counts, then starts, then ends = the next one's start */
  for (int b = 0; b < nb; b++) edge[b] = 0;
  for (int y = 0; y < V; y++) edge[bucket_of(prob[y], shift)]++;
  for (int b = nb - 1, at = 0; b >= 0; b--) {
    int c = edge[b];
    edge[b] = at, at += c;
  }
  for (int y = 0; y < V; y++) order[edge[bucket_of(prob[y], shift)]++] = y;
  double mass = 0.0;
  int kept = 0;
  bool stop = false;
  for (int b = nb - 1, start = 0; b >= 0 && (!stop || sort_all); start = edge[b--]) {
    sort_by_prob(order + start, prob, edge[b] - start);
    while (!stop && kept < edge[b] && prob[order[kept]] > 0.0f) {
      mass += prob[order[kept++]];
      stop = mass >= threshold || kept == max_kept; /* max_kept: top-k's count (V when only top-p walks) */
    }
    stop = stop || kept < edge[b]; /* an id with p <= 0: no mass after it */
  }
  *kept_mass = mass;
  return kept;
}

static double total_mass(const float *prob, int V) {
  double total = 0.0;
  for (int y = 0; y < V; y++) total += prob[y];
  return total;
}

/* op_sample_top_p; order is the full placement order when sort_all, else workspace. */
static int top_p_filter(float *prob, int32_t *order, int V, float top_p, bool sort_all) {
  double total = total_mass(prob, V);
  if (!(total > 0.0) || !isfinite(total)) return -1;
  double threshold = top_p >= 1.0f ? total : (double)top_p * total, kept_mass;
  int kept = nucleus(order, &kept_mass, prob, V, threshold, sort_all, V);
  for (int i = kept; i < V; i++) prob[order[i]] = 0.0f;
  for (int i = 0; i < kept; i++) prob[order[i]] = (float)(prob[order[i]] / kept_mass);
  return kept;
}

int op_sample_top_p(float *prob, int32_t *order, int V, float top_p) {
  return top_p_filter(prob, order, V, top_p, true);
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
  if (top_p < 1.0f && top_p_filter(prob, order, V, top_p, false) < 0) return -1;
  return op_sample_draw(prob, V, rng);
}

int op_sample_top_k(float *prob, int32_t *order, int V, int top_k, float top_p) {
  double total = total_mass(prob, V), kept_mass;
  if (!(total > 0.0) || !isfinite(total)) return -1;
  if (top_k <= 0 || top_k >= V) return top_p_filter(prob, order, V, top_p, false);
  /* the k first ids of the placement order (fewer when fewer have p > 0), their mass in that order */
  int kept = nucleus(order, &kept_mass, prob, V, INFINITY, false, top_k);
  if (top_p < 1.0f) { /* the nucleus of the k, renormalized: the smallest prefix with top_p of their mass */
    double threshold = (double)top_p * kept_mass, mass = 0.0;
    int j = 0;
    while (j < kept && mass < threshold) mass += prob[order[j++]]; /* threshold > 0: at least one id */
    kept = j;
    kept_mass = mass;
  }
  for (int i = kept; i < V; i++) prob[order[i]] = 0.0f;
  for (int i = 0; i < kept; i++) prob[order[i]] = (float)(prob[order[i]] / kept_mass);
  return kept;
}

int op_sample_penalize(float *out, const float *logits, int V, const int32_t *seen, int64_t n_seen, float penalty) {
  for (int64_t i = 0; i < n_seen; i++)
    if (seen[i] < 0 || seen[i] >= V) return -1;
  memcpy(out, logits, sizeof(float) * (size_t)V);
  /* from the unpenalized value: an id seen twice is penalized once */
  for (int64_t i = 0; i < n_seen; i++) {
    float l = logits[seen[i]];
    out[seen[i]] = l < 0.0f ? l * penalty : l / penalty;
  }
  return 0;
}

int32_t op_sample_k(float *prob, int32_t *order, const float *logits, int V, float temperature, int top_k,
                    float top_p, uint64_t *rng) {
  if (!(temperature > 0.0f) || top_k <= 0 || top_k >= V)
    return op_sample(prob, order, logits, V, temperature, top_p, rng); /* top-k off: op_sample's bits */
  if (op_sample_softmax(prob, logits, V, temperature) != 0) return -1;
  if (op_sample_top_k(prob, order, V, top_k, top_p) < 0) return -1;
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
int op_sample_prepare(const struct op_desc *self, struct op_io *io, struct op_sample_call *c) {
  int64_t ld[2];
  const struct op_tensor *logits = op_io_in(self, io, "logits", 2, ld);
  int64_t top_k;
  if (!logits || !op_sample_params(self, io, &c->temperature, &c->top_p, &c->seed) ||
      !op_io_param_int(self, io, "top_k", 0, INT32_MAX, &top_k))
    return CEDAR_EINVAL;
  c->top_k = (int)top_k;
  if (ld[0] > INT32_MAX || ld[1] < 1 || ld[1] > INT32_MAX)
    return op_io_fail(io, "sample: logits is (%lld, %lld); it needs rows of 1 to %d values", (long long)ld[0],
                      (long long)ld[1], INT32_MAX);
  c->n = ld[0], c->V = (int)ld[1], c->logits = logits->data;
  c->ids = op_io_out(self, io, "ids", 1, (int64_t[]){c->n});
  c->prob = c->ids ? op_io_out(self, io, "prob", 2, ld) : NULL;
  return c->prob ? 0 : CEDAR_ENOMEM;
}

bool op_sample_row_usable(const float *logits, int V) {
  bool finite = false;
  for (int y = 0; y < V; y++) {
    if (bad_logit(logits[y])) return false;
    finite = finite || logits[y] > -INFINITY;
  }
  return finite;
}

int op_sample_bad_row(struct op_io *io, int64_t row) {
  return op_io_fail(io, "sample: logits row %lld holds NaN or +inf, or no finite value", (long long)row);
}

static int sample_run(const struct op_desc *self, struct op_io *io) {
  struct op_sample_call c = {0};
  int rc = op_sample_prepare(self, io, &c);
  if (rc) return rc;
  int64_t n = c.n, V = c.V;
  int32_t *order = malloc((size_t)V * sizeof *order);
  if (!order) return op_io_fail(io, "sample: cannot allocate %lld ids of workspace", (long long)V), CEDAR_ENOMEM;
  uint64_t rng = c.seed;
  for (int64_t i = 0; i < n && !rc; i++) {
    c.ids[i] = op_sample_k(c.prob + i * V, order, c.logits + i * V, (int)V, c.temperature, c.top_k, c.top_p, &rng);
    if (c.ids[i] < 0) rc = op_sample_bad_row(io, i);
  }
  free(order);
  return rc;
}

const struct op_desc op_desc_sample = {
    .name = "sample",
    .summary = "token sampling per row: greedy, or temperature + top-k + top-p with a seeded splitmix64",
    .inputs = (const struct op_arg[]){{"logits", OP_F32, "(n, V)", "one row of logits per token (-inf = masked)"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"ids", OP_I32, "(n)", "chosen token ids"},
                                       {"prob", OP_F32, "(n, V)", "distribution each id was drawn from (one-hot when "
                                                                  "greedy)"},
                                       {0}},
    .params = (const struct op_param[]){{"temperature", OP_PARAM_FLOAT, 0, "0 = greedy [cedar; SPEC silent]"},
                                        {"top_p", OP_PARAM_FLOAT, 1, "nucleus mass, 1 = off [cedar; SPEC silent]"},
                                        {"top_k", OP_PARAM_INT, 0, "keep the k most likely ids, 0 = off [cedar]"},
                                        {"seed", OP_PARAM_INT, 0, "splitmix64 seed, one draw per sampled row [cedar]"},
                                        {0}},
    .run = sample_run,
};
