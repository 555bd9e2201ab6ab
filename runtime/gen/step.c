/* step.c: the one forward step of every decode driver: a row alone on its
 * executor, one-position rows in lockstep (step.h). */
#include "runtime/gen/step.h"

#include <setjmp.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "runtime/model/model.h"
#include "runtime/node/node.h"

/* One row through its own graph on o's executor. */
static void step_alone(const struct rt_model *M, struct rt_step_row *w, const struct rt_gen_opts *o,
                       struct rt_exec_stats *st) {
  struct graph g;
  w->rc = graph_build_verify(&g, M->p, w->r->n_pos, w->n, w->err, sizeof w->err);
  if (w->rc) return;
  w->nodes = g.n_node;
  struct rt_exec_out out = {.logits = w->logits, .pos = NULL};
  struct rt_exec_stats none = {0};
  w->rc = rt_gen_run_graph(&g, M, w->r, &out, st ? st : &none, o, NULL, true, NULL, w->err, sizeof w->err);
  graph_free(&g);
  if (!w->rc) w->r->n_pos += w->n;
}

/* A run of op groups on an arena whose out-of-memory jump lands here. */
#define GUARDED(ar, rc, body)            \
  do {                                   \
    jmp_buf jb_;                         \
    jmp_buf *prev_ = (ar)->on_oom;       \
    if (setjmp(jb_)) {                   \
      (ar)->on_oom = prev_;              \
      (rc) = RT_ENOMEM_SCRATCH;          \
      break;                             \
    }                                    \
    (ar)->on_oom = &jb_;                 \
    body;                                \
    (ar)->on_oom = prev_;                \
  } while (0)

static void *at(void *const *buf, int d) { return d < 0 ? NULL : buf[d]; }

/* Node k of the B graphs g, their rows batched where the op group is
 * row-wise (step.h); rc[i]: row i's first failure. */
static void lockstep_node(const struct rt_model *M, struct rt_step_row *const *w, const struct graph *g, int B, int k,
                          void **base, void **rows, const struct graph_node **nds, struct rt_bound *st,
                          struct rt_buses *bs, int *rrc, int *rc, float **logits, struct rt_arena *ar) {
  const struct graph *g0 = &g[0];
  const struct graph_node *nd = &g0->node[k];
  for (int i = 0; i < B; i++) {
    CEDAR_ASSERT(g[i].node[k].op == nd->op && g[i].node[k].layer == nd->layer);
    nds[i] = &g[i].node[k];
  }
  volatile int grc = 0;
  /* an expert-parallel layer's route, shards and sum (expert_par.h): per request, like the transfers */
  switch (nd->op == GRAPH_MOE && (nd->flags & GRAPH_F_EP) ? GRAPH_OP_COUNT : nd->op) {
  case GRAPH_EMBED: {
    int32_t *tok = RT_ALLOC(ar, int32_t, B);
    for (int i = 0; i < B; i++) tok[i] = w[i]->r->tokens[nds[i]->a];
    GUARDED(ar, grc, rt_embed(M, base[nd->x], base[nd->aux], tok, B, ar));
    break;
  }
  case GRAPH_ENGRAM:
    GUARDED(ar, grc, rt_engram_inject(M, nd->layer, base[nd->x], base[nd->aux], B, ar));
    break;
  case GRAPH_MOE: {
    struct graph_node all = *nd;
    all.n = B;
    GUARDED(ar, grc, rt_moe(M, &all, base[nd->x], base[nd->aux], ar));
    break;
  }
  case GRAPH_HEAD:
    *logits = base[nd->aux];
    GUARDED(ar, grc, rt_head(M, *logits, base[nd->x], at(base, nd->pre), B, ar));
    break;
  case GRAPH_ATTN:
    for (int i = 0; i < B; i++) {
      void **ri = rows + (size_t)i * g0->n_data;
      rt_bind_node(&g[i], w[i]->r, nds[i], &st[i]);
      bs[i] = (struct rt_buses){at(ri, nd->bus[GRAPH_TOPK_OUT]), at(ri, nd->bus[GRAPH_POOL_OUT]),
                                at(ri, nd->bus[GRAPH_TOPK_IN]), at(ri, nd->bus[GRAPH_POOL_IN])};
    }
    GUARDED(ar, grc, rt_attn_rows(M, nds, B, base[nd->x], base[nd->aux], bs, st, rrc, ar));
    for (int i = 0; i < B && !grc; i++)
      if (rrc[i] && !rc[i]) rc[i] = rrc[i];
    break;
  default: /* per request, through the dispatch every executor shares */
    for (int i = 0; i < B; i++) {
      int e = rt_run_node(&g[i], M, w[i]->r, nds[i], rows + (size_t)i * g0->n_data, NULL, NULL, 0, ar);
      if (e && !rc[i]) rc[i] = e;
      rt_arena_reset(ar);
    }
    break;
  }
  rt_arena_reset(ar);
  if (grc) /* scratch for the batched group itself: every row fails */
    for (int i = 0; i < B; i++)
      if (!rc[i]) rc[i] = grc;
}

/* The B one-position rows w in lockstep: one decode graph per row walked
 * node by node over per-step buffers of B rows (row i request i's). */
static void step_lockstep(const struct rt_model *M, struct rt_step_row **w, int B, struct rt_arena *ar) {
  const int V = M->p->model.vocab;
  struct graph *g = cedar_xcalloc((size_t)B, sizeof(*g));
  int *rc = cedar_xcalloc((size_t)B, sizeof(int));
  char err[256];
  for (int i = 0; i < B; i++) {
    int e = graph_build_verify(&g[i], M->p, w[i]->r->n_pos, 1, err, sizeof err);
    CEDAR_ASSERT_MSG(!e, "decode graph: %s", err);
    CEDAR_ASSERT(g[i].n_node == g[0].n_node && g[i].n_data == g[0].n_data);
  }
  const struct graph *g0 = &g[0];
  void **base = cedar_xcalloc((size_t)g0->n_data, sizeof(void *));
  void **rows = cedar_xcalloc((size_t)B * g0->n_data, sizeof(void *));
  for (int d = 0; d < g0->n_data; d++) { /* activations and buses: B rows of each */
    const struct graph_data *gd = &g0->data[d];
    if (gd->kind != GRAPH_ACT && gd->kind != GRAPH_BUS) continue;
    base[d] = cedar_xaligned(64, (size_t)((B * gd->bytes + 63) / 64 * 64 + 64));
    for (int i = 0; i < B; i++) rows[(size_t)i * g0->n_data + d] = (char *)base[d] + (size_t)i * gd->bytes;
  }
  const struct graph_node **nds = cedar_xmalloc(sizeof(*nds) * (size_t)B);
  struct rt_bound *st = cedar_xmalloc(sizeof(*st) * (size_t)B);
  struct rt_buses *bs = cedar_xmalloc(sizeof(*bs) * (size_t)B);
  int *rrc = cedar_xmalloc(sizeof(int) * (size_t)B);
  float *logits = NULL;
  for (int k = 0; k < g0->n_node; k++) lockstep_node(M, w, g, B, k, base, rows, nds, st, bs, rrc, rc, &logits, ar);
  for (int i = 0; i < B; i++) {
    w[i]->nodes = g[i].n_node;
    if ((w[i]->rc = rc[i])) {
      rt_node_error(&g[i].node[0], rc[i], w[i]->err, sizeof w[i]->err);
      continue;
    }
    w[i]->r->n_pos++;
    memcpy(w[i]->logits, logits + (size_t)i * V, sizeof(float) * (size_t)V);
  }
  for (int d = 0; d < g0->n_data; d++) free(base[d]);
  for (int i = 0; i < B; i++) graph_free(&g[i]);
  free(base);
  free(rows);
  free(nds);
  free(st);
  free(bs);
  free(rrc);
  free(rc);
  free(g);
}

int rt_gen_step(const struct rt_model *M, struct rt_step_row *rows, int n_rows, const struct rt_gen_opts *o,
                struct rt_arena *ar, struct rt_exec_stats *st) {
  bool batched = ar && o->executor == RT_EXEC_DIRECT && !o->one_rank && !o->after_graph;
  struct rt_step_row **w = cedar_xmalloc(sizeof(*w) * (size_t)(n_rows ? n_rows : 1));
  int B = 0;
  for (int i = 0; i < n_rows; i++) {
    rows[i].rc = 0, rows[i].nodes = 0, rows[i].err[0] = 0;
    if (batched && rows[i].n == 1 && !rows[i].alone)
      w[B++] = &rows[i];
    else
      step_alone(M, &rows[i], o, st);
  }
  if (B) step_lockstep(M, w, B, ar); /* one row too: the batch's arena counts its groups */
  free(w);
  int failed = 0;
  for (int i = 0; i < n_rows; i++) failed += rows[i].rc != 0;
  return failed;
}

/* ---- the decode loop of the single-request drivers (generate.h) ---------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One decode position of r through the one step function (step.h). */
static int decode_step(const struct rt_model *M, struct rt_request *r, float *logits, const struct rt_gen_opts *o,
                       struct rt_gen_result *res, char *err, size_t err_len) {
  struct rt_step_row w = {.r = r, .n = 1, .logits = logits};
  rt_gen_step(M, &w, 1, o, NULL, &res->decode);
  if (w.nodes) res->decode_nodes = w.nodes;
  if (w.rc) snprintf(err, err_len, "%s", w.err);
  return w.rc;
}

int rt_gen_take_token(struct rt_sampler *s, const float *logits, const struct rt_gen_opts *o, uint64_t *rng,
                      int64_t pos, struct rt_request *r, struct rt_gen_result *res, char *err, size_t err_len) {
  struct rt_sample_opts so = rt_gen_sample_opts(o);
  int32_t id;
  int rc = rt_sample_next(s, &so, r, logits, pos, rng, &id, err, err_len);
  if (rc) return rc;
  res->tokens[res->n_tokens++] = r->pending = id;
  if (o->on_token && o->on_token(o->token_user, id)) res->stopped = true;
  return 0;
}

int rt_gen_decode(const struct rt_model *M, struct rt_request *r, const struct rt_gen_opts *o, struct rt_sampler *s,
                  uint64_t *rng, struct rt_gen_result *res, char *err, size_t err_len) {
  const int V = M->p->model.vocab;
  if (res->n_tokens < 1 || r->pending < 0) { /* a driver's state without a sampled token: refuse, never decode -1 */
    snprintf(err, err_len, "the decode loop has no sampled token to continue from; this request is dropped");
    return CEDAR_EINVAL;
  }
  double steady = 0;
  int rc = 0;
  for (int i = res->n_tokens; i < o->max_new && !rc && !res->stopped; i++) {
    double t = now_s();
    rt_request_push_token(r, r->pending);
    r->pending = -1;
    float *lg = res->decode_logits + (size_t)(i - 1) * V;
    rc = decode_step(M, r, lg, o, res, err, err_len);
    if (!rc) rc = rt_gen_take_token(s, lg, o, rng, r->n_pos - 1, r, res, err, err_len);
    if (rc) break;
    double dt = now_s() - t;
    if (i == 1)
      res->first_itl_s = dt;
    else
      steady += dt;
  }
  if (res->n_tokens > 2) res->steady_itl_s = steady / (res->n_tokens - 2);
  return rc;
}

