/* exec_direct.c: the direct executor (exec.h): one thread, graph order. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <math.h>

#include "runtime/check.h"
#include "runtime/exec.h"
#include "runtime/log.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct bufs {
  const struct graph *g;
  void **p;          /* (n_data) */
  int64_t live, peak;
};

/* The buffer of activation/bus d, allocated on first use. */
static void *buf(struct bufs *b, int d) {
  if (d < 0) return NULL;
  if (!b->p[d]) {
    const struct graph_data *gd = &b->g->data[d];
    CEDAR_ASSERT(gd->kind == GRAPH_ACT || gd->kind == GRAPH_BUS);
    b->p[d] = aligned_alloc(64, (size_t)((gd->bytes + 63) / 64 * 64 + 64));
    CEDAR_ASSERT_MSG(b->p[d] != NULL, "out of memory for %s (%lld bytes)", gd->name, (long long)gd->bytes);
    b->live += gd->bytes;
    if (b->live > b->peak) b->peak = b->live;
  }
  return b->p[d];
}

static void release_after(struct bufs *b, int k) {
  const struct graph_node *nd = &b->g->node[k];
  for (int u = 0; u < nd->n_use; u++) {
    int d = nd->use[u].data;
    if (b->g->data[d].last_use == k && b->p[d]) {
      free(b->p[d]);
      b->p[d] = NULL;
      b->live -= b->g->data[d].bytes;
    }
  }
}

/* REPLAY_IN: the encoder output rows of [a, a + n), from the encoder
 * tiles' X. */
static void replay_in(struct bufs *b, const struct rt_model *M, const struct graph_node *nd) {
  const struct plan_model *m = &M->p->model;
  size_t row = (size_t)m->hc_streams * m->hidden;
  float *dst = buf(b, nd->x);
  for (int u = 0; u < nd->n_use; u++) {
    int d = nd->use[u].data;
    const struct graph_data *gd = &b->g->data[d];
    if (nd->use[u].mode != GRAPH_R) continue;
    int64_t len = gd->bytes / (int64_t)(row * sizeof(float));
    int64_t lo = gd->a0 > nd->a ? gd->a0 : nd->a;
    int64_t hi = gd->a0 + len < nd->a + nd->n ? gd->a0 + len : nd->a + nd->n;
    const float *src = buf(b, d);
    if (hi > lo) memcpy(dst + (size_t)(lo - nd->a) * row, src + (size_t)(lo - gd->a0) * row, sizeof(float) * row * (size_t)(hi - lo));
  }
  memset(buf(b, nd->aux), 0, sizeof(float) * (size_t)nd->n * m->hc_streams);
}

/* CEDAR_LOG=debug: the RMS of the residual streams after each layer, the
 * check that synthetic weights keep activations O(1) (docs/weights.md). */
static void log_rms(struct bufs *b, const struct rt_model *M, const struct graph_node *nd) {
  const struct plan_model *m = &M->p->model;
  const float *X = buf(b, nd->x);
  size_t cnt = (size_t)nd->n * m->hc_streams * m->hidden;
  double ss = 0;
  for (size_t i = 0; i < cnt; i++) ss += (double)X[i] * X[i];
  LOG_DEBUG("%s: residual RMS %.4g over %d positions", nd->name, sqrt(ss / (double)cnt), nd->n);
}

static int run_node(struct bufs *b, const struct rt_model *M, struct rt_request *r, const struct graph_node *nd,
                    struct rt_exec_out *out, int64_t *out_row, struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  switch (nd->op) {
  case GRAPH_EMBED:
    CEDAR_ASSERT(nd->a + nd->n <= r->n_tokens);
    rt_embed(M, buf(b, nd->x), r->tokens + nd->a, nd->n, ar);
    memset(buf(b, nd->aux), 0, sizeof(float) * (size_t)nd->n * m->hc_streams);
    return 0;
  case GRAPH_ENGRAM_GATHER:
    rt_engram_rows(M, nd->layer, buf(b, nd->aux), r, nd->a, nd->n, ar);
    return 0;
  case GRAPH_ENGRAM:
    rt_engram_inject(M, nd->layer, buf(b, nd->x), buf(b, nd->aux), nd->n, ar);
    return 0;
  case GRAPH_ATTN: {
    struct rt_buses bs = {buf(b, nd->bus[GRAPH_TOPK_OUT]), buf(b, nd->bus[GRAPH_POOL_OUT]),
                          buf(b, nd->bus[GRAPH_TOPK_IN]), buf(b, nd->bus[GRAPH_POOL_IN])};
    return rt_attn(M, r, nd, buf(b, nd->x), buf(b, nd->aux), &bs, ar);
  }
  case GRAPH_MOE:
    rt_moe(M, nd, buf(b, nd->x), buf(b, nd->aux), ar);
    if (cedar_log_level() >= CEDAR_LOG_DEBUG) log_rms(b, M, nd);
    return 0;
  case GRAPH_DEC_KV:
    return rt_dec_kv(M, r, nd->layer, buf(b, nd->x), nd->a, nd->n, ar);
  case GRAPH_REPLAY_IN:
    replay_in(b, M, nd);
    return 0;
  case GRAPH_HEAD: {
    const struct graph_data *xd = &b->g->data[nd->x];
    const float *X = (const float *)buf(b, nd->x) + (size_t)(nd->a - xd->a0) * m->hc_streams * m->hidden;
    float *lg = buf(b, nd->aux);
    rt_head(M, lg, X, nd->n, ar);
    if (out && out->logits)
      memcpy(out->logits + (size_t)*out_row * m->vocab, lg, sizeof(float) * (size_t)nd->n * m->vocab);
    if (out && out->pos)
      for (int i = 0; i < nd->n; i++) out->pos[*out_row + i] = nd->a + i;
    *out_row += nd->n;
    return 0;
  }
  case GRAPH_OP_COUNT: break;
  }
  CEDAR_ASSERT_MSG(0, "unknown node kind %d", (int)nd->op);
  return 0;
}

int rt_exec_direct(const struct graph *g, const struct rt_model *M, struct rt_request *r, struct rt_exec_out *out,
                   struct rt_exec_stats *st, rt_progress_cb progress, void *user, char *err, size_t err_len) {
  struct bufs b = {g, cedar_xcalloc((size_t)g->n_data, sizeof(void *)), 0, 0};
  struct rt_arena ar;
  rt_arena_init(&ar, 0);
  int64_t out_row = 0;
  int rc = 0;
  double t0 = now_s();
  for (int k = 0; k < g->n_node && rc == 0; k++) {
    const struct graph_node *nd = &g->node[k];
    double t = now_s();
    rc = run_node(&b, M, r, nd, out, &out_row, &ar);
    rt_arena_reset(&ar);
    if (st) {
      st->op_seconds[nd->op] += now_s() - t;
      st->op_nodes[nd->op]++;
      st->nodes++;
      if (nd->op == GRAPH_ATTN) st->token_layers += nd->n;
    }
    if (rc) snprintf(err, err_len, "%s: the KV page pool is exhausted; this request is dropped", nd->name);
    release_after(&b, k);
    if (progress) progress(user, k + 1, g->n_node);
  }
  for (int d = 0; d < g->n_data; d++) free(b.p[d]);
  free(b.p);
  if (st) {
    st->seconds += now_s() - t0;
    if (b.peak > st->act_peak_bytes) st->act_peak_bytes = b.peak;
    if ((int64_t)ar.peak > st->scratch_peak_bytes) st->scratch_peak_bytes = (int64_t)ar.peak;
    for (int f = 0; f < RT_FAM_COUNT; f++) st->family_seconds[f] += ar.fam_s[f];
  }
  rt_arena_free(&ar);
  return rc;
}
