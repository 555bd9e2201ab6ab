/* batch.c: continuous batching (batch.h): admission, prefill segments and
 * the batched decode step. */
#include "runtime/engine/batch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "runtime/exec/exec.h"
#include "runtime/gen/step.h"
#include "scheduler/batch_policy.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int rt_batch_init(struct rt_batch *b, const struct rt_model *M, struct rt_kv_pool *pools,
                  const struct rt_batch_opts *o, char *err, size_t err_len) {
  memset(b, 0, sizeof(*b));
  const struct plan *p = M->p;
  const struct plan_serving *s = &p->serving;
  if (!graph_place_eq(graph_place_of(p, GRAPH_PREFILL_CED), graph_place_of(p, GRAPH_DECODE))) {
    snprintf(err, err_len, "plan %s puts prefill and decode on different homes (serving.placement): continuous "
             "batching runs both in one process; use a plan without serving.placement", p->name);
    return CEDAR_EINVAL;
  }
  if (graph_place_of(p, GRAPH_DECODE).dev == GRAPH_DEV_CUDA) { /* the batched decode calls the CPU op groups */
    snprintf(err, err_len, "plan %s places its flows on CUDA, and continuous batching runs the op groups on the CPU "
             "(runtime/engine/batch.c); serve it on the CPU, or run one request at a time on the device (cedar run "
             "--device cuda)", p->name);
    return CEDAR_EUNSUPPORTED;
  }
  b->M = M;
  b->pools = pools;
  b->o = *o;
  if (b->o.max_requests <= 0) b->o.max_requests = s->batch_max_requests;
  if (b->o.chunk <= 0) b->o.chunk = s->batch_chunk;
  if (b->o.step_tokens <= 0) b->o.step_tokens = o->step_tokens > 0 ? o->step_tokens : b->o.chunk + b->o.max_requests;
  if (o->step_tokens <= 0 && o->max_requests <= 0 && o->chunk <= 0) b->o.step_tokens = s->batch_step_tokens;
  if (b->o.top_p <= 0) b->o.top_p = 1;
  if (b->o.step_tokens < b->o.max_requests || b->o.chunk > b->o.step_tokens) {
    snprintf(err, err_len, "a batch step of %d tokens must hold every running request's decode row (max requests "
             "%d) and one prefill chunk (%d): raise the step's tokens", b->o.step_tokens, b->o.max_requests,
             b->o.chunk);
    return CEDAR_EINVAL;
  }
  if (rt_sampler_init(&b->smp, p->model.vocab)) {
    snprintf(err, err_len, "out of memory for the sampler");
    return CEDAR_ENOMEM;
  }
  b->ar = cedar_xcalloc(1, sizeof(*b->ar));
  rt_arena_init(b->ar, 0);
  return 0;
}

int rt_batch_submit(struct rt_batch *b, const int32_t *prompt, int64_t n, int max_new, uint64_t seed, int64_t user,
                    char *err, size_t err_len) {
  if (n < 1 || max_new < 1) {
    snprintf(err, err_len, "a request needs a prompt of at least one token and max_new of at least 1");
    return CEDAR_EINVAL;
  }
  if (b->n_q == b->cap_q) {
    b->cap_q = b->cap_q ? 2 * b->cap_q : 64;
    b->q = cedar_xrealloc(b->q, sizeof(*b->q) * (size_t)b->cap_q);
    b->live = cedar_xrealloc(b->live, sizeof(int) * (size_t)b->cap_q);
  }
  struct rt_bq *q = cedar_xcalloc(1, sizeof(*q));
  q->user = user;
  q->prompt = cedar_xmalloc(sizeof(int32_t) * (size_t)n);
  memcpy(q->prompt, prompt, sizeof(int32_t) * (size_t)n);
  q->n = n;
  q->max_new = max_new;
  q->rng = seed;
  q->temperature = b->o.temperature, q->top_p = b->o.top_p, q->top_k = b->o.top_k, q->rep_penalty = b->o.rep_penalty;
  q->t_submit = b->clock;
  int h = b->n_q++;
  b->q[h] = q;
  b->live[b->n_live++] = h;
  return h;
}

/* ---- freeing --------------------------------------------------------------- */

/* Everything q holds but its outputs: the graph, its buffers, its cache
 * pins and its pages (at once). */
static void release(struct rt_batch *b, struct rt_bq *q) {
  if (q->buf) {
    for (int d = 0; d < q->g.n_data; d++) free(q->buf[d]);
    free(q->buf);
    q->buf = NULL;
  }
  if (q->g_live) graph_free(&q->g), q->g_live = false;
  free(q->seg), q->seg = NULL;
  free(q->plogits), q->plogits = NULL;
  if (q->spec) rt_spec_req_free(q->spec), free(q->spec), q->spec = NULL;
  if (b->o.cache) pc_release(b->o.cache, &q->hit);
  if (q->r_live) rt_request_free(&q->r), q->r_live = false;
}

static void unlive(struct rt_batch *b, int h) {
  for (int i = 0; i < b->n_live; i++)
    if (b->live[i] == h) {
      memmove(b->live + i, b->live + i + 1, sizeof(int) * (size_t)(b->n_live - i - 1));
      b->n_live--;
      return;
    }
}

static void fail(struct rt_batch *b, int h, const char *why) {
  struct rt_bq *q = b->q[h];
  snprintf(q->err, sizeof q->err, "%s", why);
  q->state = RT_BQ_FAILED;
  release(b, q);
  unlive(b, h);
}

static struct rt_gen_opts gen_opts(const struct rt_batch *b) {
  return (struct rt_gen_opts){.chunk = b->o.chunk, .replay = -1, .max_new = 1, .top_p = 1, .cache = b->o.cache,
                              .save_snapshot = b->o.save_snapshot};
}

/* A request that sampled its last token: with a cache its blocks go in and
 * its snapshot is saved (rt_generate's end), then its pages return. */
static void finish(struct rt_batch *b, int h) {
  struct rt_bq *q = b->q[h];
  if (b->o.cache && q->r_live) {
    struct rt_gen_opts go = gen_opts(b);
    rt_gen_prefix_finish(b->M, &q->r, &go, &q->hit, &q->hrep, q->prefill_s, q->prefill_tl);
  }
  q->state = RT_BQ_DONE;
  release(b, q);
  unlive(b, h);
}

void rt_batch_abort(struct rt_batch *b, int h) {
  if (h < 0 || h >= b->n_q || !b->q[h]) return;
  struct rt_bq *q = b->q[h];
  if (q->state >= RT_BQ_DONE) return;
  q->state = RT_BQ_ABORTED;
  release(b, q);
  unlive(b, h);
}

void rt_batch_sample(struct rt_batch *b, int h, float temperature, float top_p, int top_k, float rep_penalty) {
  struct rt_bq *q = b->q[h];
  q->temperature = temperature, q->top_p = top_p > 0 ? top_p : 1;
  q->top_k = top_k, q->rep_penalty = rep_penalty;
}

int rt_batch_speculate(struct rt_batch *b, int h, struct rt_drafter d, int lmax, char *err, size_t err_len) {
  struct rt_bq *q = h >= 0 && h < b->n_q ? b->q[h] : NULL;
  if (!q || q->state != RT_BQ_WAITING || q->spec) {
    snprintf(err, err_len, "speculation is set on a request before its first step, once");
    return CEDAR_EINVAL;
  }
  const struct plan *p = b->M->p;
  if (lmax < 0 || lmax > RT_SPEC_LMAX || lmax > d.max_draft || lmax + 1 > p->model.window) {
    snprintf(err, err_len, "speculation verifies 0 to %d drafts a round (the drafter's %d, the window %d); got %d",
             RT_SPEC_LMAX, d.max_draft, p->model.window - 1, lmax);
    return CEDAR_EINVAL;
  }
  if (q->temperature > 0) {
    snprintf(err, err_len, "speculation inside the batch accepts greedily; a sampled request (temperature %g) "
             "decodes plainly here (sampled acceptance is cedar run --speculate's)", q->temperature);
    return CEDAR_EUNSUPPORTED;
  }
  if (b->o.cache) {
    snprintf(err, err_len, "speculation inside the batch runs without a prefix cache (its rollback is not yet checked "
             "with cached pages)");
    return CEDAR_EUNSUPPORTED;
  }
  struct rt_spec_req *x = cedar_xmalloc(sizeof *x);
  if (rt_spec_req_init(x, b->M, d, lmax, q->rep_penalty)) {
    free(x);
    snprintf(err, err_len, "out of memory for the request's speculative rounds");
    return CEDAR_ENOMEM;
  }
  q->spec = x;
  return 0;
}

void rt_batch_stop(struct rt_batch *b, int h) {
  if (h >= 0 && h < b->n_q && b->q[h] && b->q[h]->state == RT_BQ_DECODE) finish(b, h);
}

void rt_batch_forget(struct rt_batch *b, int h) {
  if (h < 0 || h >= b->n_q || !b->q[h]) return;
  struct rt_bq *q = b->q[h];
  if (q->state < RT_BQ_DONE) return;
  free(q->prompt);
  free(q->tokens);
  free(q->t_token);
  free(q->logits);
  free(q);
  b->q[h] = NULL;
}

void rt_batch_free(struct rt_batch *b) {
  for (int h = 0; h < b->n_q; h++) {
    rt_batch_abort(b, h);
    rt_batch_forget(b, h);
  }
  free(b->q);
  free(b->live);
  rt_sampler_free(&b->smp);
  if (b->ar) rt_arena_free(b->ar);
  free(b->ar);
  memset(b, 0, sizeof(*b));
}

/* ---- sampling ------------------------------------------------------------ */

/* The next token of q from one row of logits (the one sampler path:
 * runtime/gen/sampler.h), stamped with the clock; non-finite logits fail
 * the request alone. */
static bool take_token(struct rt_batch *b, int h, const float *lg, double t) {
  struct rt_bq *q = b->q[h];
  const int V = b->M->p->model.vocab;
  struct rt_sample_opts so = {q->temperature, q->top_p, q->top_k, q->rep_penalty, NULL, 0}; /* its own (rt_batch_sample) */
  int32_t id;
  char why[400];
  if (rt_sample_next(&b->smp, &so, &q->r, lg, q->r.n_pos - 1, &q->rng, &id, why, sizeof why)) {
    fail(b, h, why);
    return false;
  }
  if (b->o.keep_logits) memcpy(q->logits + (size_t)q->n_tokens * V, lg, sizeof(float) * (size_t)V);
  q->t_token[q->n_tokens] = t;
  q->tokens[q->n_tokens++] = q->r.pending = id;
  if (q->n_tokens == q->max_new) finish(b, h);
  return true;
}

/* ---- prefill, segment by segment ------------------------------------------ */

/* Admit q: its request state, its cached prefix, its prefill graph cut into
 * segments (a segment starts at each tile's EMBED or REPLAY_IN). */
static int admit(struct rt_batch *b, int h, char *err, size_t err_len) {
  struct rt_bq *q = b->q[h];
  const struct plan *p = b->M->p;
  q->tokens = cedar_xmalloc(sizeof(int32_t) * (size_t)q->max_new);
  q->t_token = cedar_xmalloc(sizeof(double) * (size_t)q->max_new);
  if (b->o.keep_logits) q->logits = cedar_xmalloc(sizeof(float) * (size_t)q->max_new * p->model.vocab);
  q->t_admit = b->clock;
  if (q->spec && q->temperature > 0) { /* rt_batch_sample after rt_batch_speculate */
    snprintf(err, err_len, "speculation inside the batch accepts greedily, and this request samples (temperature %g)",
             q->temperature);
    return CEDAR_EUNSUPPORTED;
  }
  int64_t cap = q->n + q->max_new + (q->spec ? q->spec->lmax + 1 : 0); /* a last round may verify past max_new */
  int rc = rt_request_init(&q->r, h, p, b->pools, cap);
  if (rc) {
    snprintf(err, err_len, "out of memory for a request of %lld tokens", (long long)cap);
    return rc;
  }
  q->r_live = true;
  for (int64_t i = 0; i < q->n; i++) rt_request_push_token(&q->r, q->prompt[i]);
  struct graph_opts go = {.replay = -1};
  if (b->o.cache) {
    struct rt_gen_opts o = gen_opts(b);
    if ((rc = rt_gen_prefix_attach(b->M, &q->r, q->prompt, q->n, &o, &q->hit, &q->hrep, &go, err, err_len)))
      return rc;
  }
  go.chunk = b->o.chunk;
  go.replay = -1;
  if ((rc = graph_build_prefill(&q->g, p, q->n, &go, err, err_len))) return rc;
  q->g_live = true;
  q->buf = cedar_xcalloc((size_t)q->g.n_data, sizeof(void *));
  q->seg = cedar_xmalloc(sizeof(int) * (size_t)(q->g.n_node + 1));
  q->n_seg = 0;
  bool tile = false;
  for (int k = 0; k < q->g.n_node; k++) {
    enum graph_op op = q->g.node[k].op;
    bool start = op == GRAPH_EMBED || op == GRAPH_REPLAY_IN;
    if (k == 0 || (start && tile)) q->seg[q->n_seg++] = k, tile = false;
    tile |= start;
  }
  q->seg[q->n_seg] = q->g.n_node;
  q->plogits = cedar_xmalloc(sizeof(float) * (size_t)(q->g.out_rows ? q->g.out_rows : 1) * p->model.vocab);
  q->state = RT_BQ_PREFILL;
  return 0;
}

/* Positions of segment s of q: its tile's (0 when it holds none). */
static int seg_tokens(const struct rt_bq *q, int s) {
  for (int k = q->seg[s]; k < q->seg[s + 1]; k++) {
    const struct graph_node *nd = &q->g.node[k];
    if (nd->op == GRAPH_EMBED || nd->op == GRAPH_REPLAY_IN) return nd->n;
  }
  return 0;
}

/* The next segment of q's prefill, as the direct executor runs those nodes;
 * after the last one the request samples its first token. */
static void prefill_segment(struct rt_batch *b, int h) {
  struct rt_bq *q = b->q[h];
  const struct graph *g = &q->g;
  double t0 = now_s();
  char err[256];
  int rc = 0;
  struct rt_exec_out out = {.logits = q->plogits, .pos = NULL};
  for (int k = q->seg[q->next_seg]; k < q->seg[q->next_seg + 1] && !rc; k++) {
    const struct graph_node *nd = &g->node[k];
    for (int u = 0; u < nd->n_use && !rc; u++) {
      int d = nd->use[u].data;
      const struct graph_data *gd = &g->data[d];
      if ((gd->kind == GRAPH_ACT || gd->kind == GRAPH_BUS) && !q->buf[d] &&
          !(q->buf[d] = aligned_alloc(64, (size_t)((gd->bytes + 63) / 64 * 64 + 64))))
        rc = CEDAR_ENOMEM;
    }
    if (!rc) rc = rt_run_node(g, b->M, &q->r, nd, q->buf, NULL, &out, q->out_row, b->ar);
    if (nd->op == GRAPH_HEAD) q->out_row += nd->n;
    if (nd->op == GRAPH_ATTN) q->prefill_tl += nd->n;
    rt_arena_reset(b->ar);
    if (rc) rt_node_error(nd, rc, err, sizeof err);
    for (int u = 0; u < nd->n_use; u++) {
      int d = nd->use[u].data;
      if (g->data[d].last_use == k && q->buf[d]) free(q->buf[d]), q->buf[d] = NULL;
    }
  }
  q->prefill_s += now_s() - t0;
  if (rc) {
    fail(b, h, err);
    return;
  }
  if (++q->next_seg < q->n_seg) return;
  q->r.n_pos = q->n; /* its first token is sampled at the end of the step (rt_batch_run_step) */
}

/* The first token of a request whose prefill ended this step. */
static void first_token(struct rt_batch *b, int h) {
  struct rt_bq *q = b->q[h];
  const float *last = q->plogits + (size_t)(q->g.out_rows - 1) * b->M->p->model.vocab;
  if (take_token(b, h, last, b->clock) && q->state == RT_BQ_PREFILL) {
    q->state = RT_BQ_DECODE;
    free(q->buf), q->buf = NULL; /* every buffer was freed after its last use */
    graph_free(&q->g), q->g_live = false;
    free(q->plogits), q->plogits = NULL;
  }
}

/* ---- the batched decode step ---------------------------------------------- */

/* One decode position of each of the B requests hs through the one step
 * function (runtime/gen/step.h), their tiles batched into the same op
 * groups (batch.h), out (B, vocab); a speculative request's verify row
 * (its pending token and drafts) alone into its own buffer. A row that
 * failed fails its request. */
static void decode_rows(struct rt_batch *b, const int *hs, int B, float *out) {
  const int V = b->M->p->model.vocab;
  struct rt_step_row *w = cedar_xcalloc((size_t)B, sizeof(*w));
  int *wh = cedar_xmalloc(sizeof(int) * (size_t)B), n = 0;
  for (int i = 0; i < B; i++) {
    struct rt_bq *q = b->q[hs[i]];
    if (q->spec) {
      char err[400];
      int left = q->max_new - q->n_tokens; /* drafts past max_new are wasted work */
      int rows = rt_spec_propose(q->spec, b->M, &q->r, left - 1, err, sizeof err);
      if (rows < 0) {
        fail(b, hs[i], err);
        continue;
      }
      w[n] = (struct rt_step_row){.r = &q->r, .n = rows, .alone = true, .logits = q->spec->lg};
    } else {
      rt_request_push_token(&q->r, q->r.pending);
      q->r.pending = -1;
      w[n] = (struct rt_step_row){.r = &q->r, .n = 1, .logits = out + (size_t)i * V};
    }
    wh[n++] = hs[i];
  }
  struct rt_gen_opts o = gen_opts(b);
  rt_gen_step(b->M, w, n, &o, b->ar, NULL);
  for (int i = 0; i < n; i++)
    if (w[i].rc) {
      if (b->q[wh[i]]->spec) rt_spec_abandon(&b->q[wh[i]]->r);
      fail(b, wh[i], w[i].err);
    }
  free(wh);
  free(w);
}

/* A speculative request's round after its verify row ran: greedy
 * acceptance and rollback (speculate.h), then its committed tokens (up to
 * max_new), stamped with the clock. */
static void take_round(struct rt_batch *b, int h, double t) {
  struct rt_bq *q = b->q[h];
  const int V = b->M->p->model.vocab;
  int32_t acc[RT_SPEC_LMAX + 1];
  char why[400];
  int a = rt_spec_settle_greedy(q->spec, b->M, &q->r, acc, why, sizeof why);
  if (a < 0) {
    fail(b, h, why);
    return;
  }
  for (int i = 0; i <= a && q->n_tokens < q->max_new; i++) {
    if (b->o.keep_logits) memcpy(q->logits + (size_t)q->n_tokens * V, q->spec->lg + (size_t)i * V, sizeof(float) * V);
    q->t_token[q->n_tokens] = t;
    q->tokens[q->n_tokens++] = acc[i];
  }
  if (q->n_tokens == q->max_new) finish(b, h);
}

/* ---- one step ---------------------------------------------------------------- */

int64_t rt_batch_run_step(struct rt_batch *b, struct rt_batch_step *st) {
  memset(st, 0, sizeof(*st));
  int n = b->n_live;
  if (!n) return 0;
  double t0 = now_s();
  struct bp_req *pq = cedar_xmalloc(sizeof(*pq) * (size_t)n);
  int *take = cedar_xmalloc(sizeof(int) * (size_t)n), *hs = cedar_xmalloc(sizeof(int) * (size_t)n);
  int *rc = cedar_xcalloc((size_t)n, sizeof(int));
  for (int i = 0; i < n; i++) {
    const struct rt_bq *q = b->q[b->live[i]];
    pq[i].phase = q->state == RT_BQ_WAITING ? BP_WAITING : q->state == RT_BQ_PREFILL ? BP_PREFILL : BP_DECODE;
    pq[i].next = q->state == RT_BQ_WAITING ? (int)(q->n < b->o.chunk ? q->n : b->o.chunk)
               : q->state == RT_BQ_PREFILL ? seg_tokens(q, q->next_seg)
               : q->spec ? q->spec->lmax + 1 : 1; /* a verify row: at most its drafts and the pending token */
  }
  struct bp_limits lim = {b->o.max_requests, b->o.step_tokens};
  int64_t tokens = bp_plan_step(pq, n, &lim, take, &st->admitted);
  int *order = cedar_xmalloc(sizeof(int) * (size_t)n);
  memcpy(order, b->live, sizeof(int) * (size_t)n); /* handles: the live list changes as requests end */
  /* the decode rows, batched */
  int B = 0;
  for (int i = 0; i < n; i++)
    if (take[i] && pq[i].phase == BP_DECODE) hs[B++] = order[i];
  const int V = b->M->p->model.vocab;
  float *logits = B ? cedar_xmalloc(sizeof(float) * (size_t)B * V) : NULL;
  double td = now_s(), tc = cpu_s();
  long long e0 = b->ar->experts;
  double f0[RT_FAM_COUNT];
  memcpy(f0, b->ar->fam_s, sizeof f0);
  if (B) decode_rows(b, hs, B, logits), b->decode_steps++;
  for (int f = 0; f < RT_FAM_COUNT; f++) b->decode_fam_s[f] += b->ar->fam_s[f] - f0[f];
  b->decode_s += now_s() - td;
  b->decode_cpu_s += cpu_s() - tc;
  b->decode_experts += b->ar->experts - e0;
  /* the prefill segments: running prefills, then the admitted, in order */
  int *ended = cedar_xmalloc(sizeof(int) * (size_t)n), n_ended = 0;
  for (int i = 0; i < n; i++) {
    if (!take[i] || pq[i].phase == BP_DECODE) continue;
    int h = order[i];
    struct rt_bq *q = b->q[h];
    if (pq[i].phase == BP_WAITING) {
      char err[256];
      if (admit(b, h, err, sizeof err)) {
        fail(b, h, err);
        continue;
      }
    }
    prefill_segment(b, h);
    st->prefill_segments++;
    st->prefill_tokens += take[i];
    if (q->state == RT_BQ_PREFILL && q->next_seg == q->n_seg) ended[n_ended++] = h;
  }
  st->seconds = now_s() - t0;
  b->clock += st->seconds;
  /* every token of the step is stamped with the clock at its end */
  for (int i = 0; i < B; i++)
    if (b->q[hs[i]]->state == RT_BQ_DECODE) {
      if (b->q[hs[i]]->spec)
        take_round(b, hs[i], b->clock);
      else
        take_token(b, hs[i], logits + (size_t)i * V, b->clock);
    }
  for (int i = 0; i < n_ended; i++) first_token(b, ended[i]);
  st->decode_rows = B;
  st->tokens = tokens;
  b->steps++;
  b->decode_rows += B;
  b->prefill_tokens += st->prefill_tokens;
  free(ended);
  free(logits);
  free(order);
  free(rc);
  free(hs);
  free(take);
  free(pq);
  return tokens;
}
