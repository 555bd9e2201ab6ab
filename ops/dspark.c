/* dspark.c: DSpark Markov head, confidence head, expected accepted length
 * and verify-length choice (see dspark.h). */
#include "ops/dspark.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/registry.h"
#include "ops/sample.h"
#include "base/check.h"

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

/* ---- registry descriptors (ops/registry.h) ------------------------------ */

/* Shape checks for the descriptors. (The same small helpers sit in each
 * family file that registers ops: registry.c offers none that format
 * shapes.) */

/* -- dspark_draft --
 * Each position is one op_dspark_markov_draft call of length 1 continuing
 * from the previous draft with the same generator: the same arithmetic and
 * the same draws as one call of length L, and it keeps every position's
 * sampling distribution (the op keeps only the last), which acceptance
 * needs. */

int op_dspark_draft_prepare(const struct op_desc *self, struct op_io *io, struct op_dspark_draft_call *c) {
  int64_t bd[2], ad[2], ud[2], y0;
  double given;
  const struct op_tensor *base = op_io_in(self, io, "base", 2, bd), *A = NULL, *U = NULL;
  if (!base || !(A = op_io_in(self, io, "A", 2, ad)) || !(U = op_io_in(self, io, "U", 2, ud)) ||
      !op_io_dims_fit_int(io, self->name, "base", bd, 2) || !op_io_dims_fit_int(io, self->name, "A", ad, 2))
    return CEDAR_EINVAL;
  int64_t L = bd[0], V = bd[1], rank = ad[1];
  if (V < 1 || rank < 1)
    return op_io_fail(io, "dspark_draft: needs a vocabulary V >= 1 (base is (%lld, %lld)) and rank >= 1 (A is "
                          "(%lld, %lld))", (long long)L, (long long)V, (long long)ad[0], (long long)rank);
  if (!op_io_dims_match(io, self->name, "A", ad, (int64_t[]){V, rank}, 2, "base", bd, 2) ||
      !op_io_dims_match(io, self->name, "U", ud, ad, 2, "A", ad, 2))
    return CEDAR_EINVAL;
  if (!io->param(io, "y0", &given))
    return op_io_fail(io, "dspark_draft: parameter y0 (the last committed token) is required");
  float temperature, top_p;
  uint64_t rng;
  if (!op_io_param_int(self, io, "y0", 0, V - 1, &y0) || !op_sample_params(self, io, &temperature, &top_p, &rng))
    return CEDAR_EINVAL;
  int32_t *draft = op_io_out(self, io, "draft", 1, (int64_t[]){L});
  float *logits = draft ? op_io_out(self, io, "logits", 2, bd) : NULL;
  float *prob = logits ? op_io_out(self, io, "prob", 2, bd) : NULL;
  if (!prob) return CEDAR_ENOMEM;
  *c = (struct op_dspark_draft_call){.base = base->data, .A = A->data, .U = U->data, .L = (int)L, .V = (int)V,
                                     .rank = (int)rank, .y0 = (int32_t)y0, .temperature = temperature,
                                     .top_p = top_p, .seed = rng, .draft = draft, .logits = logits, .prob = prob};
  return 0;
}

int op_dspark_draft_bad_position(struct op_io *io, int64_t i) {
  return op_io_fail(io, "dspark_draft: the logits of draft position %lld hold NaN or +inf, or no finite value",
                    (long long)i);
}

static int dspark_draft_run(const struct op_desc *self, struct op_io *io) {
  struct op_dspark_draft_call c;
  int rc = op_dspark_draft_prepare(self, io, &c);
  if (rc) return rc;
  const int64_t V = c.V;
  int32_t *order = malloc((size_t)V * sizeof *order);
  if (!order) return op_io_fail(io, "dspark_draft: cannot allocate %lld ids of workspace", (long long)V), CEDAR_ENOMEM;
  uint64_t rng = c.seed;
  int32_t prev = c.y0;
  for (int64_t i = 0; i < c.L; i++) {
    if (op_dspark_markov_draft(c.draft + i, c.logits + i * V, c.prob + i * V, order, c.base + i * V, c.A, c.U, prev,
                               1, c.V, c.rank, c.temperature, c.top_p, &rng)) {
      rc = op_dspark_draft_bad_position(io, i);
      break;
    }
    prev = c.draft[i];
  }
  free(order);
  return rc;
}

const struct op_desc op_desc_dspark_draft = {
    .name = "dspark_draft",
    .summary = "DSpark Markov head: draft L tokens left to right from base_i + U A[y_{i-1}] (SPEC 3.16)",
    .inputs = (const struct op_arg[]){{"base", OP_F32, "(L, V)", "the drafter's base logits of the L positions"},
                                      {"A", OP_F32, "(V, rank)", "embedding of the previous token"},
                                      {"U", OP_F32, "(V, rank)", "rank -> V map, stored (out, in)"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"draft", OP_I32, "(L)", "draft token ids"},
                                       {"logits", OP_F32, "(L, V)", "base_i + U A[y_{i-1}]"},
                                       {"prob", OP_F32, "(L, V)", "distribution each draft was drawn from (one-hot "
                                                                  "when greedy)"},
                                       {0}},
    .params = (const struct op_param[]){{"y0", OP_PARAM_INT, -1, "last committed token, required [R]"},
                                        {"temperature", OP_PARAM_FLOAT, 0, "0 = greedy [cedar; SPEC silent]"},
                                        {"top_p", OP_PARAM_FLOAT, 1, "nucleus mass, 1 = off [cedar; SPEC silent]"},
                                        {"seed", OP_PARAM_INT, 0, "splitmix64 seed of the draws [cedar]"},
                                        {0}},
    .run = dspark_draft_run,
};

/* -- dspark_confidence -- */

int op_dspark_confidence_prepare(const struct op_desc *self, struct op_io *io,
                                 struct op_dspark_confidence_call *c) {
  int64_t hd[2], wd[1], bd[1];
  const struct op_tensor *h = op_io_in(self, io, "h", 2, hd), *w = NULL, *b = NULL;
  if (!h || !(w = op_io_in(self, io, "w_c", 1, wd)) || !(b = op_io_in(self, io, "b_c", 1, bd)) ||
      !op_io_dims_fit_int(io, self->name, "h", hd, 2) ||
      !op_io_dims_match(io, self->name, "w_c", wd, (int64_t[]){hd[1]}, 1, "h", hd, 2) ||
      !op_io_dims_match(io, self->name, "b_c", bd, (int64_t[]){1}, 1, "the head's one bias", NULL, 0))
    return CEDAR_EINVAL;
  float *a = op_io_out(self, io, "a", 1, (int64_t[]){hd[0]});
  if (!a) return CEDAR_ENOMEM;
  *c = (struct op_dspark_confidence_call){.h = h->data, .w_c = w->data, .b_c = ((const float *)b->data)[0],
                                          .L = (int)hd[0], .d = (int)hd[1], .a = a};
  return 0;
}

static int dspark_confidence_run(const struct op_desc *self, struct op_io *io) {
  struct op_dspark_confidence_call c;
  int rc = op_dspark_confidence_prepare(self, io, &c);
  if (!rc) op_dspark_confidence(c.a, c.h, c.w_c, c.b_c, c.L, c.d);
  return rc;
}

const struct op_desc op_desc_dspark_confidence = {
    .name = "dspark_confidence",
    .summary = "DSpark confidence head: a_i = sigmoid(w_c . h_i + b_c) (SPEC 3.16)",
    .inputs = (const struct op_arg[]){{"h", OP_F32, "(L, d)", "hidden states of the draft positions"},
                                      {"w_c", OP_F32, "(d)", "confidence weight"},
                                      {"b_c", OP_F32, "(1)", "confidence bias"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"a", OP_F32, "(L)", "P(draft i accepted | drafts before it accepted)"}, {0}},
    .run = dspark_confidence_run,
};

/* -- dspark_verify_len -- */

int op_dspark_verify_len_prepare(const struct op_desc *self, struct op_io *io,
                                 struct op_dspark_verify_len_call *c) {
  int64_t ad[1], td[1];
  const struct op_tensor *a = op_io_in(self, io, "a", 1, ad), *t = NULL;
  if (!a || !(t = op_io_in(self, io, "t_round", 1, td)) || !op_io_dims_fit_int(io, self->name, "a", ad, 1) ||
      !op_io_dims_match(io, self->name, "t_round", td, (int64_t[]){ad[0] + 1}, 1, "a (Lmax + 1 lengths 0..Lmax)", ad, 1))
    return CEDAR_EINVAL;
  float *e = op_io_out(self, io, "expected", 1, td);
  float *score = e ? op_io_out(self, io, "score", 1, td) : NULL;
  int32_t *best = score ? op_io_out(self, io, "L_star", 1, (int64_t[]){1}) : NULL;
  if (!best) return CEDAR_ENOMEM;
  *c = (struct op_dspark_verify_len_call){.a = a->data, .t_round = t->data, .Lmax = (int)ad[0], .expected = e,
                                          .score = score, .L_star = best};
  return 0;
}

int op_dspark_verify_len_check_t(struct op_io *io, const struct op_dspark_verify_len_call *c) {
  const float *tr = c->t_round;
  for (int L = 0; L <= c->Lmax; L++)
    if (!(tr[L] > 0.0f) || !isfinite(tr[L]))
      return op_io_fail(io, "dspark_verify_len: t_round[%d] = %g is not positive and finite (a measurement bug)", L,
                        (double)tr[L]);
  return 0;
}

static int dspark_verify_len_run(const struct op_desc *self, struct op_io *io) {
  struct op_dspark_verify_len_call c;
  int rc = op_dspark_verify_len_prepare(self, io, &c);
  if (rc) return rc;
  op_dspark_expected_accept(c.expected, c.a, c.Lmax);
  c.L_star[0] = op_dspark_verify_len(c.score, c.a, c.t_round, c.Lmax);
  return c.L_star[0] < 0 ? op_dspark_verify_len_check_t(io, &c) : 0;
}

const struct op_desc op_desc_dspark_verify_len = {
    .name = "dspark_verify_len",
    .summary = "DSpark verify length: E[A(L)] and L* = argmax (1 + E[A(L)]) / t_round(L) (SPEC 3.16)",
    .inputs = (const struct op_arg[]){{"a", OP_F32, "(Lmax)", "confidence of each draft"},
                                      {"t_round", OP_F32, "(Lmax + 1)", "measured time of a round verifying L = "
                                                                        "0..Lmax drafts"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"expected", OP_F32, "(Lmax + 1)", "E[A(L)], L = 0..Lmax"},
                                       {"score", OP_F32, "(Lmax + 1)", "(1 + E[A(L)]) / t_round[L]"},
                                       {"L_star", OP_I32, "(1)", "the chosen length (ties to the shorter)"},
                                       {0}},
    .run = dspark_verify_len_run,
};
