/* sampler.h: the one path from a position's logits to the next token, for
 * every driver (rt_generate, P/D and stages, continuous batching): the
 * repetition penalty over the request's ids (prompt and generated), then
 * temperature, top-k and top-p (ops/sample.h), and the check that no
 * non-finite logits reach the token stream. A request whose logits hold
 * NaN or +inf (or no finite value) fails with a message naming the
 * position; the sampler never hands out -1.
 *
 * Not here: speculative acceptance (runtime/engine/speculate.c draws from
 * the same distribution through ops/sample.h's parts).
 * Test: tests/test_sampler.c (ctest -R sampler), tests/test_pd.c.
 */
#ifndef CEDAR_RUNTIME_GEN_SAMPLER_H
#define CEDAR_RUNTIME_GEN_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/model/state.h"

struct rt_sample_opts {
  float temperature; /* 0: greedy */
  float top_p;       /* 1: off */
  int top_k;         /* 0: off */
  float rep_penalty; /* 0 or 1: off */
  /* Teacher forcing (`cedar eval`, runtime/engine/eval.h): when pos + 1 <
   * n_teacher the next token is teacher[pos + 1], the request's own text,
   * instead of a draw (the logits are still checked, as above). NULL: off. */
  const int32_t *teacher;
  int64_t n_teacher;
};

/* Scratch for one vocabulary (one per driver or batch; not thread-safe). */
struct rt_sampler {
  int V;
  float *prob, *pen;
  int32_t *order;
};

/* 0, or CEDAR_ENOMEM. */
int rt_sampler_init(struct rt_sampler *s, int V);
void rt_sampler_free(struct rt_sampler *s);

/* The next token of r from logits (V values, position pos): 0 and *id >= 0,
 * or CEDAR_EINVAL with err (non-finite logits, an id of r outside the
 * vocabulary under the penalty). rng: the request's splitmix64 state. */
int rt_sample_next(struct rt_sampler *s, const struct rt_sample_opts *so, const struct rt_request *r,
                   const float *logits, int64_t pos, uint64_t *rng, int32_t *id, char *err, size_t err_len);

#endif
