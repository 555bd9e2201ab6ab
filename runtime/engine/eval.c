/* eval.c: teacher-forced scoring of a text through the engine's prefill and
 * decode steps (eval.h). */
#include "runtime/engine/eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One window: prefill ids [c0, a), score ids [a, b). */
struct window {
  int64_t c0, a, b;
};

/* Window k of a text of n ids (the rule of eval.h); false past the last. */
static bool window_at(int64_t n, int64_t context, int64_t stride, int64_t k, struct window *w) {
  int64_t first = context < n ? context : n;
  if (k == 0) {
    *w = (struct window){0, 1, first};
    return first > 1;
  }
  int64_t a = first + (k - 1) * stride;
  if (a >= n) return false;
  int64_t b = a + stride < n ? a + stride : n;
  *w = (struct window){a - (context - stride), a, b};
  return true;
}

int64_t rt_eval_windows(int64_t n, int64_t context, int64_t stride, int64_t *scored) {
  struct window w;
  int64_t k = 0, s = 0;
  for (; window_at(n, context, stride, k, &w); k++) s += w.b - w.a;
  if (scored) *scored = s;
  return k;
}

/* log-sum-exp of one row, in double. */
static double lse_of(const float *l, int V) {
  double m = l[0];
  for (int i = 1; i < V; i++) m = l[i] > m ? l[i] : m;
  double s = 0;
  for (int i = 0; i < V; i++) s += exp((double)l[i] - m);
  return m + log(s);
}

static int32_t argmax_of(const float *l, int V) {
  int32_t a = 0;
  for (int i = 1; i < V; i++)
    if (l[i] > l[a]) a = i; /* ties to the lower id, as greedy sampling */
  return a;
}

/* KL(p || q) of two rows given as logits with their log-sum-exps. */
static double kl_of(const float *p, double lp, const float *q, double lq, int V) {
  double s = 0;
  for (int i = 0; i < V; i++) {
    double a = (double)p[i] - lp, b = (double)q[i] - lq;
    s += exp(a) * (a - b);
  }
  return s > 0 ? s : 0; /* rounding can leave -1e-17 for equal rows */
}

/* The logits row that predicts id j of window w in res. */
static const float *row_of(const struct rt_gen_result *res, const struct window *w, int64_t j, int V) {
  if (j == w->a) return res->prefill_logits + (size_t)(res->prefill_rows - 1) * V;
  return res->decode_logits + (size_t)(j - w->a - 1) * V;
}

/* One window on engine e: the request, timed; checks that every id was the text's. */
static int run_window(struct rt_engine *e, const int32_t *ids, const struct window *w, struct rt_gen_result *res,
                      double *seconds, char *err, size_t err_len) {
  struct rt_gen_opts go = {.max_new = (int)(w->b - w->a),
                           .temperature = 0,
                           .top_p = 1,
                           .replay = -1,
                           .teacher = ids + w->c0,
                           .n_teacher = w->b - w->c0};
  struct rt_request r = {0};
  double t0 = now_s();
  int rc = rt_engine_generate(e, &r, ids + w->c0, w->a - w->c0, &go, res, err, err_len);
  *seconds += now_s() - t0;
  rt_engine_request_free(e, &r);
  if (rc) return rc;
  if (res->n_tokens != w->b - w->a) {
    snprintf(err, err_len, "the request for ids [%lld, %lld) ended after %d of %lld ids", (long long)w->a,
             (long long)w->b, res->n_tokens, (long long)(w->b - w->a));
    return CEDAR_EINVAL;
  }
  for (int64_t j = w->a; j < w->b; j++)
    if (res->tokens[j - w->a] != ids[j]) {
      snprintf(err, err_len, "teacher forcing did not hold at position %lld (id %d, the text's %d)", (long long)j,
               res->tokens[j - w->a], ids[j]);
      return CEDAR_EINVAL;
    }
  return 0;
}

static void score_window(const struct rt_eval_opts *o, const int32_t *ids, const int32_t *bytes, const struct window *w,
                         const struct rt_gen_result *res, const struct rt_gen_result *ref, int V,
                         struct rt_eval_result *out) {
  for (int64_t j = w->a; j < w->b; j++) {
    const float *l = row_of(res, w, j, V);
    double lse = lse_of(l, V), nll = lse - (double)l[ids[j]];
    int32_t am = argmax_of(l, V);
    double kl = 0;
    if (ref) {
      const float *lr = row_of(ref, w, j, V);
      double lse_r = lse_of(lr, V);
      kl = kl_of(lr, lse_r, l, lse, V);
      out->ref_nll += lse_r - (double)lr[ids[j]];
      out->kl += kl;
      out->agree += argmax_of(lr, V) == am;
    }
    if (o->per_token) {
      int64_t k = out->tokens;
      out->tok_pos[k] = j;
      out->tok_nll[k] = nll;
      out->tok_kl[k] = kl;
      out->tok_argmax[k] = am;
    }
    out->nll += nll;
    out->correct += am == ids[j];
    out->bytes += bytes[j];
    out->tokens++;
  }
  out->decode_steps += w->b - w->a - 1;
}

int rt_eval_text(struct rt_engine *e, const int32_t *ids, const int32_t *bytes, int64_t n,
                 const struct rt_eval_opts *o, struct rt_eval_result *res, char *err, size_t err_len) {
  memset(res, 0, sizeof *res);
  if (n < 2 || o->context < 2 || o->stride < 1 || o->stride >= o->context) {
    snprintf(err, err_len, "scoring needs at least 2 ids (got %lld), a context of at least 2 (got %lld) and a "
             "stride in [1, context - 1] (got %lld)", (long long)n, (long long)o->context, (long long)o->stride);
    return CEDAR_EINVAL;
  }
  const int V = e->plan.model.vocab;
  int64_t total;
  rt_eval_windows(n, o->context, o->stride, &total);
  if (o->per_token) {
    res->tok_pos = cedar_xmalloc(sizeof(int64_t) * (size_t)total);
    res->tok_nll = cedar_xmalloc(sizeof(double) * (size_t)total);
    res->tok_kl = cedar_xmalloc(sizeof(double) * (size_t)total);
    res->tok_argmax = cedar_xmalloc(sizeof(int32_t) * (size_t)total);
  }
  struct window w;
  int rc = 0;
  for (int64_t k = 0; !rc && window_at(n, o->context, o->stride, k, &w); k++) {
    struct rt_gen_result ref = {0}, got = {0};
    if (o->ref) rc = run_window(o->ref, ids, &w, &ref, &res->ref_seconds, err, err_len);
    if (!rc) rc = run_window(e, ids, &w, &got, &res->seconds, err, err_len);
    if (rc == RT_GEN_ELSEWHERE) { /* a multi-rank driver: the reporting rank scores */
      res->elsewhere = true;
      rc = 0;
    } else if (!rc) {
      score_window(o, ids, bytes, &w, &got, o->ref ? &ref : NULL, V, res);
    }
    rt_gen_result_free(&ref);
    rt_gen_result_free(&got);
    res->windows++;
    if (!rc && o->progress) o->progress(o->user, w.b - 1, total);
  }
  return rc;
}

void rt_eval_result_free(struct rt_eval_result *res) {
  free(res->tok_pos);
  free(res->tok_nll);
  free(res->tok_kl);
  free(res->tok_argmax);
  memset(res, 0, sizeof *res);
}
