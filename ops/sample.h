/* sample.h: token sampling from logits: greedy, temperature, top-k, top-p
 * (nucleus), a repetition penalty, with cedar's own seeded generator (used by
 * decode and by the DSpark drafter, SPEC 3.16).
 *
 * Generator [cedar]: splitmix64 (Steele, Lea, Flood 2014; the constants of
 * java.util.SplittableRandom): state += 0x9E3779B97F4A7C15, then the output
 * mix z = (z ^ z>>30) * 0xBF58476D1CE4E5B9, z = (z ^ z>>27) * 0x94D049BB133111EB,
 * z ^ z>>31. A uniform double is the top 53 bits times 2^-53, in [0, 1).
 * Pure 64-bit integer arithmetic: the same seed gives the same sequence on
 * every platform and run (never rand()). One sampled token consumes exactly
 * one draw; a greedy pick consumes none.
 *
 * The distribution [cedar where SPEC is silent]:
 *   p(y) = exp((l_y - max l) / T) / sum, in fp32 (the sum too);
 *   top-p: ids sorted by p descending, equal p by increasing id; keep the
 *   smallest prefix whose mass (accumulated in double) is >= top_p times the
 *   total mass, at least one id; renormalize the kept mass to 1.
 *   draw: u = uniform * (kept mass, double), walk ids in increasing order,
 *   pick the first id whose running mass exceeds u.
 * Cost: the nucleus is found without sorting all V ids (a counting pass into
 * buckets by the top bits of p, then only the buckets the prefix reaches are
 * sorted: O(V + K log K) for K ids near the kept ones); the result is the one
 * a full sort gives, bit for bit. op_sample_top_p still sorts every bucket to
 * fill all of order.
 * Logits must be finite or -inf (a masked id). A NaN or +inf logit, or no
 * finite logit at all, is an upstream bug: the functions return -1 instead
 * of hiding it. temperature <= 0 means greedy; top_p >= 1 means no nucleus.
 * Reproducibility: the draw itself is bit-exact everywhere; the fp32 exp()
 * of the platform's libm can move a probability by an ulp, which changes a
 * draw only when u falls within that ulp of a boundary.
 *
 * Top-k [cedar, the rule of Fan, Lewis, Dauphin 2018 "Hierarchical Neural
 * Story Generation" s5.4 and of Hugging Face's TopKLogitsWarper]: after the
 * softmax, keep the k first ids of the placement order above (p descending,
 * equal p by increasing id; fewer when fewer have p > 0); with top_p < 1 the
 * nucleus is then taken among those k: the smallest prefix of them whose
 * mass (double, in that order) is >= top_p times their mass; renormalize
 * the kept mass to 1; draw as above. The order of the steps is Hugging
 * Face's: penalty, temperature, top-k, top-p. top_k <= 0 or >= V is off and
 * then every bit is op_sample's (the rules above are unchanged by top-k).
 *
 * Repetition penalty theta > 0 [the rule of Hugging Face's
 * RepetitionPenaltyLogitsProcessor; CTRL, Keskar et al. 2019, arXiv
 * 1909.05858 s4.1, divides the logit by theta; HF multiplies a negative one
 * so the penalty always lowers it]: for every distinct id y among `seen`
 * (the request's prompt and the ids generated so far),
 *   l'_y = l_y / theta   when l_y >= 0,
 *   l'_y = l_y * theta   when l_y < 0,
 * each computed once from the unpenalized l_y (an id seen twice is
 * penalized once), in fp32 (one correctly rounded operation); other ids keep
 * l_y. theta = 1 is off; theta > 1 discourages repeats, theta < 1 favours
 * them. It applies before greedy too. Then the rules above run on l'.
 *
 * Not here: batching, speculative acceptance.
 * Test: tests/test_ops_dspark.c (ctest -R ops_dspark) covers greedy, top-p
 * and the generator; tests/test_ops_sample.c top-k and the penalty against
 * a float64 reference.
 */
#ifndef CEDAR_OPS_SAMPLE_H
#define CEDAR_OPS_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

/* splitmix64: advances *state and returns the next 64-bit output. */
uint64_t op_rng_next(uint64_t *state /* splitmix64 state */);
/* A uniform double in [0, 1) from the top 53 bits of one op_rng_next. */
double op_rng_uniform(uint64_t *state /* splitmix64 state */);

/* argmax; equal maxima go to the lower id. -1 when a logit is NaN or +inf,
 * or every logit is -inf. */
int32_t op_sample_greedy(const float *logits /* (V) */, int V);

/* prob = softmax(logits / temperature), temperature > 0. Returns 0, or -1
 * (prob untouched) on NaN/+inf logits or when every logit is -inf. */
int op_sample_softmax(float *prob /* (V) */, const float *logits /* (V) */, int V, float temperature);

/* Nucleus filter of a probability vector (non-negative, any total mass),
 * in place: order receives the ids sorted as described above (all V of
 * them); ids outside the kept prefix get prob 0 and the kept ones are
 * renormalized to sum 1. top_p >= 1 keeps every id with p > 0 (order is
 * still filled). Returns the number of ids kept (>= 1), or -1 when the total
 * mass is not positive and finite. */
int op_sample_top_p(float *prob /* (V) */, int32_t *order /* (V) */, int V, float top_p);

/* One draw from a non-negative prob vector (any positive total mass): one
 * op_rng_next. Returns -1 when the mass is not positive and finite. */
int32_t op_sample_draw(const float *prob /* (V) */, int V, uint64_t *rng /* splitmix64 state */);

/* The whole sampler. temperature <= 0: greedy, prob becomes one-hot at the
 * pick (the drafter's q distribution), rng and order untouched (order may be
 * NULL then). Otherwise softmax, top-p (order is workspace, (V)), one draw;
 * prob holds the distribution the token was drawn from. Returns the id, or
 * -1 as above. */
int32_t op_sample(float *prob /* (V) */, int32_t *order /* (V) */, const float *logits /* (V) */, int V,
                  float temperature, float top_p, uint64_t *rng /* splitmix64 state */);

/* Top-k then top-p (rules above) on a probability vector, in place: ids
 * outside the kept set get 0, the kept ones are renormalized to sum 1; order
 * is workspace (V). top_k <= 0 or >= V: exactly op_sample_top_p's filter.
 * Returns the number kept (>= 1), or -1 when the total mass is not positive
 * and finite. */
int op_sample_top_k(float *prob /* (V) */, int32_t *order /* (V) */, int V, int top_k, float top_p);

/* The repetition penalty (rule above): out = logits with every id in seen
 * penalized by theta = penalty. out and logits must not overlap. Returns 0,
 * or -1 (out untouched) when a seen id is outside [0, V). */
int op_sample_penalize(float *out /* (V) */, const float *logits /* (V) */, int V, const int32_t *seen /* (n_seen) */,
                       int64_t n_seen, float penalty);

/* op_sample with top-k: temperature > 0 and 0 < top_k < V: softmax, top-k
 * (then top-p among the k), one draw; otherwise exactly op_sample. */
int32_t op_sample_k(float *prob /* (V) */, int32_t *order /* (V) */, const float *logits /* (V) */, int V,
                    float temperature, int top_k, float top_p, uint64_t *rng /* splitmix64 state */);

/* For op descriptors (ops/registry.h): read the parameters temperature
 * (finite, >= 0; 0 = greedy), top_p in (0, 1] and seed (an integer a double
 * holds exactly); false after op_io_fail otherwise. */
struct op_desc;
struct op_io;
bool op_sample_params(const struct op_desc *self, struct op_io *io, float *temperature, float *top_p,
                      uint64_t *seed);

/* The sample descriptor's checked call (outputs ids and prob allocated),
 * shared by its CPU run and the CUDA twin (kernels/sample.cu): 0 or the
 * status after op_io_fail. Rows are sampled in order from one generator
 * seeded with seed: row i's draw is the i-th (greedy rows take none). */
struct op_desc;
struct op_io;
struct op_sample_call {
  const float *logits; /* (n, V) */
  int64_t n;
  int V;
  float temperature, top_p;
  int top_k; /* 0: off */
  uint64_t seed;
  int32_t *ids; /* (n) */
  float *prob;  /* (n, V) */
};
int op_sample_prepare(const struct op_desc *self, struct op_io *io, struct op_sample_call *c);
/* Whether op_sample can sample the row (every logit finite or -inf, one finite). */
bool op_sample_row_usable(const float *logits /* (V) */, int V);
/* The sample op's refusal of row `row` (after op_io_fail). */
int op_sample_bad_row(struct op_io *io, int64_t row);

#ifdef __cplusplus
}
#endif

#endif
