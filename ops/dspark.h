/* dspark.h: the DSpark drafter's heads and its verify-length choice
 * (SPEC 1.5, 3.16; all formulas there are [R], so every constant here is a
 * parameter).
 *
 *   Markov head:   logits_i(y) = base_i(y) + (U A[y_{i-1}])(y),  i = 1..L,
 *                  y_0 = the last committed token (the one the drafter
 *                  continues from), y_i = the draft chosen at position i,
 *                  left to right (greedy or sampled, ops/sample.h).
 *   Confidence:    a_i = sigmoid(w_c . h_i + b_c)
 *   Expectation:   P_i = prod_{j<=i} a_j,  E[A(L)] = sum_{i<=L} P_i,  E[A(0)] = 0
 *   Verify length: L* = argmax_{L in 0..Lmax} (1 + E[A(L)]) / T_round(L)
 *
 * Storage [cedar, SPEC silent]: A is the (V, rank) embedding of the previous
 * token; U, the rank -> V map SPEC writes "U: rank x V", is stored (V, rank)
 * like every linear weight in cedar (out, in), and applied with op_linear.
 * "1 +" counts the correction or bonus token the verifier always commits
 * (SPEC 3.16: committed ~ 1 + E[A(L)]). Equal scores pick the shorter L,
 * which costs the verifier less. Lmax is the drafter's block size
 * (plan dspark.draft, 5 in SPEC 1.5).
 *
 * Not here: the drafter's 3 transformer blocks (they are ordinary layers),
 * acceptance / rejection sampling, and the batch-level choice of {L_r}
 * (SPEC 3.16's sum over requests), which belongs to the scheduler.
 * Test: tests/test_ops_dspark.c (ctest -R ops_dspark).
 */
#ifndef CEDAR_OPS_DSPARK_H
#define CEDAR_OPS_DSPARK_H

#include <stdint.h>

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

/* Draft L tokens left to right. Position i's logits (row i of `logits`, no
 * aliasing with base) are base_i + U A[y_{i-1}]; the token is chosen by
 * op_sample with (temperature, top_p, rng), temperature <= 0 being greedy.
 * prob (V) ends holding the last position's sampling distribution (one-hot
 * when greedy); order (V) is workspace. For greedy drafting prob, order and
 * rng may all be NULL (then prob is not written). Returns 0, or -1 when y0 is
 * outside [0, V) or the sampler rejects a logit row (NaN/+inf), with draft
 * filled up to the failing position. */
int op_dspark_markov_draft(int32_t *draft /* (L) */, float *logits /* (L, V) */, float *prob /* (V) or NULL */,
                           int32_t *order /* (V) or NULL */, const float *base /* (L, V) */,
                           const float *A /* (V, rank) */, const float *U /* (V, rank) */, int32_t y0, int L, int V,
                           int rank, float temperature, float top_p, uint64_t *rng /* or NULL */);

/* a_i = sigmoid(w_c . h_i + b_c) for the L draft positions' hidden states. */
void op_dspark_confidence(float *a /* (L) */, const float *h /* (L, d) */, const float *w_c /* (d) */, float b_c,
                          int L, int d);

/* e[L] = E[A(L)] for L = 0..Lmax (e[0] = 0), products and sums in fp32. */
void op_dspark_expected_accept(float *e /* (Lmax + 1) */, const float *a /* (Lmax) */, int Lmax);

/* L* for a measured cost curve t_round[L] (seconds, or any unit, per
 * verification round of L drafts + 1). score (optional) receives
 * (1 + E[A(L)]) / t_round[L]. Returns L*, or -1 when some t_round[L] is not
 * positive and finite (a measurement bug, reported, not guessed around). */
int op_dspark_verify_len(float *score /* (Lmax + 1) or NULL */, const float *a /* (Lmax) */,
                         const float *t_round /* (Lmax + 1) */, int Lmax);

/* ---- the descriptors' checked calls -------------------------------------- */
/* What dspark_draft, dspark_confidence and dspark_verify_len's descriptors
 * read from an op_io once inputs and parameters are checked and the outputs
 * allocated, shared by the CPU runs (ops/dspark.c) and the CUDA twins
 * (kernels/dspark.cu), so both refuse the same calls with the same status
 * and message: 0 or the status after op_io_fail. */
struct op_desc;
struct op_io;
struct op_dspark_draft_call {
  const float *base, *A, *U; /* (L, V), (V, rank), (V, rank) */
  int L, V, rank;
  int32_t y0;
  float temperature, top_p;
  uint64_t seed;             /* the generator's state before position 0's draw */
  int32_t *draft;            /* (L) */
  float *logits, *prob;      /* (L, V) each */
};
int op_dspark_draft_prepare(const struct op_desc *self, struct op_io *io, struct op_dspark_draft_call *c);
/* The refusal of draft position i whose logits the sampler cannot use
 * (op_sample_row_usable false), after op_io_fail. */
int op_dspark_draft_bad_position(struct op_io *io, int64_t i);
struct op_dspark_confidence_call {
  const float *h, *w_c; /* (L, d), (d) */
  float b_c;
  int L, d;
  float *a; /* (L) */
};
int op_dspark_confidence_prepare(const struct op_desc *self, struct op_io *io, struct op_dspark_confidence_call *c);
struct op_dspark_verify_len_call {
  const float *a, *t_round; /* (Lmax), (Lmax + 1) */
  int Lmax;
  float *expected, *score; /* (Lmax + 1) each */
  int32_t *L_star;         /* (1) */
};
int op_dspark_verify_len_prepare(const struct op_desc *self, struct op_io *io, struct op_dspark_verify_len_call *c);
/* The refusal of the first t_round[L] that is not positive and finite (after
 * op_io_fail), or 0 when every one is. */
int op_dspark_verify_len_check_t(struct op_io *io, const struct op_dspark_verify_len_call *c);

#ifdef __cplusplus
}
#endif

#endif
