/* sampler.c: the next token from a position's logits (sampler.h). */
#include "runtime/gen/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "ops/sample.h"

int rt_sampler_init(struct rt_sampler *s, int V) {
  memset(s, 0, sizeof *s);
  s->V = V;
  s->prob = malloc(sizeof(float) * (size_t)V);
  s->pen = malloc(sizeof(float) * (size_t)V);
  s->order = malloc(sizeof(int32_t) * (size_t)V);
  if (s->prob && s->pen && s->order) return 0;
  rt_sampler_free(s);
  return CEDAR_ENOMEM;
}

void rt_sampler_free(struct rt_sampler *s) {
  free(s->prob);
  free(s->pen);
  free(s->order);
  memset(s, 0, sizeof *s);
}

int rt_sample_next(struct rt_sampler *s, const struct rt_sample_opts *so, const struct rt_request *r,
                   const float *logits, int64_t pos, uint64_t *rng, int32_t *id, char *err, size_t err_len) {
  const int V = s->V;
  const float *l = logits;
  *id = -1;
  if (so->rep_penalty > 0 && so->rep_penalty != 1.0f) { /* over the prompt and every id generated so far */
    if (op_sample_penalize(s->pen, logits, V, r->tokens, r->n_tokens, so->rep_penalty)) {
      snprintf(err, err_len, "the repetition penalty met a token id outside [0, %d); this request is dropped", V);
      return CEDAR_EINVAL;
    }
    l = s->pen;
  }
  int32_t t = op_sample_k(s->prob, s->order, l, V, so->temperature, so->top_k, so->top_p, rng);
  if (t < 0) {
    int nan = 0, inf = 0;
    for (int i = 0; i < V; i++) nan += isnan(logits[i]), inf += isinf(logits[i]) && logits[i] > 0;
    snprintf(err, err_len, "the logits of position %lld hold NaN or +inf, or no finite value (%d NaN, %d +inf of %d): "
             "the weights or activations hold non-finite values (`cedar weights check` checks a weights file); this "
             "request is dropped", (long long)pos, nan, inf, V);
    return CEDAR_EINVAL;
  }
  *id = so->teacher && pos >= 0 && pos + 1 < so->n_teacher ? so->teacher[pos + 1] : t;
  return 0;
}
