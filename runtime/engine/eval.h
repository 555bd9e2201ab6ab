/* eval.h: teacher-forced scoring of a text (`cedar eval`, docs/runtime.md
 * "Teacher-forced evaluation"): the text's ids run through the engine's own
 * prefill graph and decode steps (CED, bounded replay and chunking as its
 * plan says), each step consuming the text's next id instead of a sampled
 * one (rt_gen_opts.teacher), and every scored id's log-probability is read
 * off the logits of the step that predicts it, as generation would sample
 * it: the last prefill row for a window's first scored id, then one decode
 * step per id.
 *
 * Windows: a text longer than the context runs as several requests. The
 * first prefills id 0 and scores ids [1, context); each later one prefills
 * the context - stride ids before its part and scores the next stride ids,
 * so every id after the first is scored exactly once, and after the first
 * window with at least context - stride ids before it.
 *
 * With a reference engine (the same plan and weights opened with
 * rt_engine_opts.dense: the dense `ced: false` forward, or .f32: fp32
 * numerics) every window runs on it too, and the two distributions are
 * compared per scored id: top-1 agreement and KL(reference || engine), and
 * the reference's own NLL.
 *
 * Not here: flags, the text's tokenization, printing (cli/cmd_eval.c).
 * Test: tests/cli/eval.sh (the NumPy oracle, executors, mpirun P/D).
 */
#ifndef CEDAR_RUNTIME_ENGINE_EVAL_H
#define CEDAR_RUNTIME_ENGINE_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/engine/engine.h"

struct rt_eval_opts {
  int64_t context;           /* ids per window, >= 2 */
  int64_t stride;            /* ids scored per window after the first, in [1, context - 1] */
  bool per_token;            /* keep each scored id's figures (rt_eval_result.tok_*) */
  struct rt_engine *ref;     /* the reference (dense or f32), or NULL */
  /* after each window: ids scored so far of total; NULL: none */
  void (*progress)(void *user, int64_t done, int64_t total);
  void *user;
};

struct rt_eval_result {
  int64_t windows;
  int64_t tokens;            /* ids scored */
  int64_t bytes;             /* their bytes (the caller's per-id byte counts) */
  double nll;                /* nats, summed over the scored ids */
  int64_t correct;           /* scored ids that were the argmax (ties: the lower id) */
  int64_t agree;             /* with ref: argmax equal to the reference's */
  double ref_nll;            /* with ref: the reference's NLL, nats, summed */
  double kl;                 /* with ref: KL(reference || engine), nats, summed over the scored ids */
  double seconds, ref_seconds; /* wall time in the engine's and the reference's requests */
  int64_t decode_steps;
  bool elsewhere;            /* this rank ran its part of every request; another rank reports */
  /* per_token: (tokens) each scored id's position in the text, NLL (nats),
   * the argmax, and with ref the KL (nats) */
  int64_t *tok_pos;
  double *tok_nll, *tok_kl;
  int32_t *tok_argmax;
};

/* Score ids[0, n) (n >= 2; every id < the plan's vocab, checked by the
 * caller), bytes[i] the bytes id i stands for. Returns 0 or a negative
 * cedar_status with err (a request failed, teacher forcing did not hold).
 * res is filled (free it with rt_eval_result_free) even on failure. */
int rt_eval_text(struct rt_engine *e, const int32_t *ids, const int32_t *bytes, int64_t n,
                 const struct rt_eval_opts *o, struct rt_eval_result *res, char *err, size_t err_len);
void rt_eval_result_free(struct rt_eval_result *res);

/* The windows of a text of n ids: the count, and the ids scored. */
int64_t rt_eval_windows(int64_t n, int64_t context, int64_t stride, int64_t *scored);

#endif
