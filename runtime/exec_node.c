/* exec_node.c: one graph node on its buffers, the dispatch every executor
 * shares (exec.h: rt_run_node), so the direct and the StarPU executor call
 * the same op groups with the same arguments and compute the same bits. */
#include <math.h>
#include <string.h>

#include "base/check.h"
#include "runtime/exec.h"
#include "base/log.h"

static void *at(void *const *buf, int d) { return d < 0 ? NULL : buf[d]; }

/* KEEP_XE: the tile's encoder outputs into the request's ring of the last
 * xe_cap positions (what the decoder replay of a later prompt reads). */
static void keep_xe(const struct rt_model *M, struct rt_request *r, const struct graph_node *nd, const float *X) {
  const struct plan_model *m = &M->p->model;
  size_t row = (size_t)m->hc_streams * m->hidden;
  CEDAR_ASSERT(r->xe_cap > 0);
  for (int i = 0; i < nd->n; i++) {
    int64_t p = nd->a + i;
    int slot = (int)(p % r->xe_cap);
    memcpy(r->xe + (size_t)slot * row, X + (size_t)i * row, sizeof(float) * row);
    r->xe_pos[slot] = p;
  }
}

/* REPLAY_IN: the encoder output rows of [a, a + n), from the encoder tiles
 * it reads, and below the first of them from the request's ring (rows a
 * restored snapshot brought in). */
static void replay_in(const struct graph *g, const struct rt_model *M, struct rt_request *r,
                      const struct graph_node *nd, void *const *buf) {
  const struct plan_model *m = &M->p->model;
  size_t row = (size_t)m->hc_streams * m->hidden;
  float *dst = at(buf, nd->x);
  int64_t first_tile = nd->a + nd->n;
  bool from_ring = false;
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_data *gd = &g->data[nd->use[u].data];
    if (nd->use[u].mode != GRAPH_R) continue;
    if (gd->kind == GRAPH_STATE && gd->state == GRAPH_ST_XE) {
      from_ring = true;
      continue;
    }
    int64_t len = gd->bytes / (int64_t)(row * sizeof(float));
    int64_t lo = gd->a0 > nd->a ? gd->a0 : nd->a;
    int64_t hi = gd->a0 + len < nd->a + nd->n ? gd->a0 + len : nd->a + nd->n;
    if (gd->a0 < first_tile) first_tile = gd->a0 > nd->a ? gd->a0 : nd->a;
    const float *src = at(buf, nd->use[u].data);
    if (hi > lo)
      memcpy(dst + (size_t)(lo - nd->a) * row, src + (size_t)(lo - gd->a0) * row, sizeof(float) * row * (size_t)(hi - lo));
  }
  for (int64_t p = nd->a; from_ring && p < first_tile; p++) {
    int slot = (int)(p % r->xe_cap);
    CEDAR_ASSERT_MSG(r->xe_pos[slot] == p, "%s: the encoder output of position %lld is not kept", nd->name,
                     (long long)p);
    memcpy(dst + (size_t)(p - nd->a) * row, r->xe + (size_t)slot * row, sizeof(float) * row);
  }
  memset(at(buf, nd->aux), 0, sizeof(float) * (size_t)nd->n * m->hc_streams);
}

/* CEDAR_LOG=debug: the RMS of the residual streams after each layer, the
 * check that synthetic weights keep activations O(1) (docs/weights.md). */
static void log_rms(const struct rt_model *M, const struct graph_node *nd, const float *X) {
  const struct plan_model *m = &M->p->model;
  size_t cnt = (size_t)nd->n * m->hc_streams * m->hidden;
  double ss = 0;
  for (size_t i = 0; i < cnt; i++) ss += (double)X[i] * X[i];
  LOG_DEBUG("%s: residual RMS %.4g over %d positions", nd->name, sqrt(ss / (double)cnt), nd->n);
}

int rt_run_node(const struct graph *g, const struct rt_model *M, struct rt_request *r, const struct graph_node *nd,
                void *const *buf, struct rt_exec_out *out, int64_t out_row, struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  switch (nd->op) {
  case GRAPH_EMBED:
    CEDAR_ASSERT(nd->a + nd->n <= r->n_tokens);
    rt_embed(M, at(buf, nd->x), r->tokens + nd->a, nd->n, ar);
    memset(at(buf, nd->aux), 0, sizeof(float) * (size_t)nd->n * m->hc_streams);
    return 0;
  case GRAPH_ENGRAM_GATHER:
    rt_engram_rows(M, nd->layer, at(buf, nd->aux), r, nd->a, nd->n, ar);
    return 0;
  case GRAPH_ENGRAM:
    rt_engram_inject(M, nd->layer, at(buf, nd->x), at(buf, nd->aux), nd->n, ar);
    return 0;
  case GRAPH_ATTN: {
    struct rt_buses bs = {at(buf, nd->bus[GRAPH_TOPK_OUT]), at(buf, nd->bus[GRAPH_POOL_OUT]),
                          at(buf, nd->bus[GRAPH_TOPK_IN]), at(buf, nd->bus[GRAPH_POOL_IN])};
    return rt_attn(M, r, nd, at(buf, nd->x), at(buf, nd->aux), &bs, ar);
  }
  case GRAPH_MOE:
    rt_moe(M, nd, at(buf, nd->x), at(buf, nd->aux), ar);
    if (cedar_log_level() >= CEDAR_LOG_DEBUG) log_rms(M, nd, at(buf, nd->x));
    return 0;
  case GRAPH_DEC_KV:
    return rt_dec_kv(M, r, nd->layer, at(buf, nd->x), nd->a, nd->n, ar);
  case GRAPH_KEEP_XE:
    keep_xe(M, r, nd, at(buf, nd->x));
    return 0;
  case GRAPH_REPLAY_IN:
    replay_in(g, M, r, nd, buf);
    return 0;
  case GRAPH_HEAD: {
    const struct graph_data *xd = &g->data[nd->x];
    const float *X = (const float *)at(buf, nd->x) + (size_t)(nd->a - xd->a0) * m->hc_streams * m->hidden;
    float *lg = at(buf, nd->aux);
    rt_head(M, lg, X, nd->n, ar);
    if (out && out->logits)
      memcpy(out->logits + (size_t)out_row * m->vocab, lg, sizeof(float) * (size_t)nd->n * m->vocab);
    if (out && out->pos)
      for (int i = 0; i < nd->n; i++) out->pos[out_row + i] = nd->a + i;
    return 0;
  }
  case GRAPH_OP_COUNT: break;
  }
  CEDAR_ASSERT_MSG(0, "unknown node kind %d", (int)nd->op);
  return 0;
}
