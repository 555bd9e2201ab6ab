/* exec_node.c: the CPU backend (backend.h: rt_backend_cpu) and the node
 * dispatch every executor shares (exec.h: rt_bind_node, rt_run_node): the
 * direct and the StarPU executor bind a node's state from its data
 * accesses the same way and call the same op groups with the same
 * arguments, so they compute the same bits.
 *
 * Test: tests/test_backend_nodes.c, and every model test through the
 * executors. */
#include <math.h>
#include <setjmp.h>
#include <string.h>

#include "base/check.h"
#include "runtime/node/backend.h"
#include "runtime/node/node.h"
#include "runtime/model/mtp.h"
#include "runtime/model/round_trace.h"
#include "base/log.h"

static void *at(void *const *buf, int d) { return d < 0 ? NULL : buf[d]; }

/* KEEP_XE: the tile's encoder outputs (streams and carried pre) into the
 * request's ring of the last xe_cap positions (what the decoder replay of a
 * later prompt reads). */
static void keep_xe(const struct rt_model *M, struct rt_request *r, const struct graph_node *nd, const float *X,
                    const float *pre) {
  const struct plan_model *m = &M->p->model;
  size_t xr = (size_t)m->hc_streams * m->hidden, row = rt_xe_row_floats(m), hc = (size_t)m->hc_streams;
  CEDAR_ASSERT(r->xe_cap > 0 && pre);
  for (int i = 0; i < nd->n; i++) {
    int64_t p = nd->a + i;
    int slot = (int)(p % r->xe_cap);
    memcpy(r->xe + (size_t)slot * row, X + (size_t)i * xr, sizeof(float) * xr);
    memcpy(r->xe + (size_t)slot * row + xr, pre + (size_t)i * hc, sizeof(float) * hc);
    r->xe_pos[slot] = p;
  }
}

/* REPLAY_IN: the encoder output rows of [a, a + n) and the pre they carry
 * (docs/model.md s2), from the encoder tiles it reads, and below the first
 * of them from the request's ring (rows a restored snapshot brought in). */
static void replay_in(const struct graph *g, const struct rt_model *M, struct rt_request *r,
                      const struct graph_node *nd, void *const *buf) {
  const struct plan_model *m = &M->p->model;
  size_t xr = (size_t)m->hc_streams * m->hidden, hc = (size_t)m->hc_streams, row = rt_xe_row_floats(m);
  float *dst = at(buf, nd->x), *pre = at(buf, nd->aux);
  int64_t first_tile = nd->a + nd->n;
  bool from_ring = false;
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_data *gd = &g->data[nd->use[u].data];
    if (nd->use[u].mode != GRAPH_R) continue;
    if (gd->kind == GRAPH_STATE && gd->state == GRAPH_ST_XE) {
      from_ring = true;
      continue;
    }
    size_t w = gd->pre ? hc : xr; /* a tile's pre, or its streams */
    int64_t len = gd->bytes / (int64_t)(w * sizeof(float));
    int64_t lo = gd->a0 > nd->a ? gd->a0 : nd->a;
    int64_t hi = gd->a0 + len < nd->a + nd->n ? gd->a0 + len : nd->a + nd->n;
    if (gd->a0 < first_tile) first_tile = gd->a0 > nd->a ? gd->a0 : nd->a;
    const float *src = at(buf, nd->use[u].data);
    if (hi > lo)
      memcpy((gd->pre ? pre : dst) + (size_t)(lo - nd->a) * w, src + (size_t)(lo - gd->a0) * w,
             sizeof(float) * w * (size_t)(hi - lo));
  }
  for (int64_t p = nd->a; from_ring && p < first_tile; p++) {
    int slot = (int)(p % r->xe_cap);
    CEDAR_ASSERT_MSG(r->xe_pos[slot] == p, "%s: the encoder output of position %lld is not kept", nd->name,
                     (long long)p);
    memcpy(dst + (size_t)(p - nd->a) * xr, r->xe + (size_t)slot * row, sizeof(float) * xr);
    memcpy(pre + (size_t)(p - nd->a) * hc, r->xe + (size_t)slot * row + xr, sizeof(float) * hc);
  }
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

/* ---- the CPU backend's op groups ----------------------------------------- */

static int cpu_embed(const struct rt_node_ctx *c) {
  const struct graph_node *nd = c->nd;
  CEDAR_ASSERT(nd->a + nd->n <= c->r->n_tokens);
  rt_embed(c->M, at(c->buf, nd->x), at(c->buf, nd->aux), c->r->tokens + nd->a, nd->n, c->ar);
  return 0;
}

static int cpu_engram_rows(const struct rt_node_ctx *c) {
  rt_engram_rows(c->M, c->nd->layer, at(c->buf, c->nd->aux), c->r, c->nd->a, c->nd->n, c->ar);
  return 0;
}

static int cpu_engram(const struct rt_node_ctx *c) {
  rt_engram_inject(c->M, c->nd->layer, at(c->buf, c->nd->x), at(c->buf, c->nd->aux), c->nd->n, c->ar);
  return 0;
}

static int cpu_attn(const struct rt_node_ctx *c) {
  const struct graph_node *nd = c->nd;
  void *const *buf = c->buf;
  struct rt_buses bs = {at(buf, nd->bus[GRAPH_TOPK_OUT]), at(buf, nd->bus[GRAPH_POOL_OUT]),
                        at(buf, nd->bus[GRAPH_TOPK_IN]), at(buf, nd->bus[GRAPH_POOL_IN])};
  if (c->r && c->r->mtp_cap) /* the state entering the layer (after Engram): the drafter's rows */
    rt_mtp_capture(c->r->mtp_cap, nd->layer, nd->a, nd->n, at(buf, nd->x), c->M->p->model.hc_streams);
  return rt_attn(c->M, nd, at(buf, nd->x), at(buf, nd->aux), &bs, c->st, c->ar);
}

static int cpu_moe(const struct rt_node_ctx *c) {
  return rt_moe(c->M, c->nd, at(c->buf, c->nd->x), at(c->buf, c->nd->aux), c->ar);
}

static int cpu_dec_kv(const struct rt_node_ctx *c) {
  return rt_dec_kv(c->M, c->st, c->nd->layer, at(c->buf, c->nd->x), at(c->buf, c->nd->pre), c->nd->a, c->nd->n,
                   c->ar);
}

static int cpu_keep_xe(const struct rt_node_ctx *c) {
  keep_xe(c->M, c->r, c->nd, at(c->buf, c->nd->x), at(c->buf, c->nd->pre));
  return 0;
}

static int cpu_replay_in(const struct rt_node_ctx *c) {
  replay_in(c->g, c->M, c->r, c->nd, c->buf);
  return 0;
}

static int cpu_head(const struct rt_node_ctx *c) {
  const struct graph_node *nd = c->nd;
  const struct plan_model *m = &c->M->p->model;
  const struct graph_data *xd = &c->g->data[nd->x];
  const float *X = (const float *)at(c->buf, nd->x) + (size_t)(nd->a - xd->a0) * m->hc_streams * m->hidden;
  const float *pre = nd->pre < 0 ? NULL : (const float *)at(c->buf, nd->pre) + (size_t)(nd->a - xd->a0) * m->hc_streams;
  float *lg = at(c->buf, nd->aux);
  rt_head(c->M, lg, X, pre, nd->n, c->ar);
  if (c->out && c->out->logits)
    memcpy(c->out->logits + (size_t)c->out_row * m->vocab, lg, sizeof(float) * (size_t)nd->n * m->vocab);
  if (c->out && c->out->pos)
    for (int i = 0; i < nd->n; i++) c->out->pos[c->out_row + i] = nd->a + i;
  return 0;
}

/* TRANSFER, MOE_SHARD, MOE_SUM and an expert-parallel layer's route (MOE
 * with GRAPH_F_EP) are the features' entries (P/D, layer stages, expert
 * parallel: runtime/dist/ registers them, backend.h). */
const struct rt_backend rt_backend_cpu = {
    .name = "cpu",
    .dev = GRAPH_DEV_CPU,
    .run = {
        [GRAPH_EMBED] = cpu_embed,
        [GRAPH_ENGRAM_GATHER] = cpu_engram_rows,
        [GRAPH_ENGRAM] = cpu_engram,
        [GRAPH_ATTN] = cpu_attn,
        [GRAPH_MOE] = cpu_moe,
        [GRAPH_DEC_KV] = cpu_dec_kv,
        [GRAPH_KEEP_XE] = cpu_keep_xe,
        [GRAPH_REPLAY_IN] = cpu_replay_in,
        [GRAPH_HEAD] = cpu_head,
    },
};

/* ---- binding and dispatch ------------------------------------------------ */

void rt_node_error(const struct graph_node *nd, int rc, char *err, size_t err_len) {
  const struct rt_backend *b = rt_backend_for(nd->place.dev);
  const char *why = b && b->why ? b->why() : "";
  if (why[0]) /* the entry's own reason (a CUDA entry's: runtime/device/node_cuda.h) */
    snprintf(err, err_len, "%s; this request is dropped", why);
  else if (rc == CEDAR_ENOMEM)
    snprintf(err, err_len, "%s: the KV page pool is exhausted; this request is dropped", nd->name);
  else if (rc == RT_ENOMEM_SCRATCH)
    snprintf(err, err_len, "%s: out of memory for the node's scratch (the process's memory or its address-space "
             "limit, ulimit -v, is exhausted); this request is dropped", nd->name);
  else if (rc == CEDAR_EUNSUPPORTED)
    snprintf(err, err_len, "%s: no %s backend entry for op group %s; this request is dropped", nd->name,
             nd->place.dev == GRAPH_DEV_CUDA ? "cuda" : "cpu", graph_op_name(nd->op));
  else
    snprintf(err, err_len, "%s: failed (%s); this request is dropped", nd->name, cedar_status_str(rc));
}

void rt_bind_node(const struct graph *g, struct rt_request *r, const struct graph_node *nd, struct rt_bound *st) {
  memset(st, 0, sizeof(*st));
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_use *us = &nd->use[u];
    const struct graph_data *gd = &g->data[us->data];
    if (gd->kind != GRAPH_STATE) continue;
    switch (gd->state) {
    case GRAPH_ST_RING: st->ring = &r->ring[gd->layer]; break;
    case GRAPH_ST_TAIL:
      st->tail = &r->tail[gd->layer];
      st->tail_log = r->tail_log ? &r->tail_log[gd->layer] : NULL;
      break;
    case GRAPH_ST_KV:
      if (graph_reads_keys_of(nd, gd->layer)) { /* the Indexer-K the vendor's slot holds (graph.h: key_src) */
        for (int c = 0; c < 2; c++)
          if (nd->key_src[c] == gd->layer) st->key_r[c] = &r->seq[gd->layer], st->key_r_end[c] = us->e_read;
        break;
      }
      if (us->mode == GRAPH_APPEND) {
        st->kv_w = &r->seq[gd->layer];
        st->kv_w_end = us->e_w1;
      }
      if (us->mode == GRAPH_R || (us->mode == GRAPH_APPEND && us->e_read > 0)) {
        st->kv_r = &r->seq[gd->layer];
        st->kv_r_end = us->e_read;
      }
      break;
    case GRAPH_ST_TOKENS:
    case GRAPH_ST_XE:
    case GRAPH_ST_NONE: break;
    }
  }
}

/* fn on c with the arena's out-of-memory jump set here: a scratch
 * allocation that fails makes the node fail with RT_ENOMEM_SCRATCH (the op
 * groups hold only arena memory, which the executor's next reset frees). */
static int run_guarded(rt_group_fn fn, struct rt_node_ctx *c, struct rt_arena *ar) {
  if (!ar) return fn(c); /* a group that allocates no scratch (a transfer), called without an arena */
  jmp_buf jb;
  jmp_buf *prev = ar->on_oom;
  if (setjmp(jb)) {
    ar->on_oom = prev;
    return RT_ENOMEM_SCRATCH;
  }
  ar->on_oom = &jb;
  int rc = fn(c);
  ar->on_oom = prev;
  return rc;
}

int rt_run_node(const struct graph *g, const struct rt_model *M, struct rt_request *r, const struct graph_node *nd,
                void *const *buf, const struct rt_bound *st, struct rt_exec_out *out, int64_t out_row,
                struct rt_arena *ar) {
  return rt_run_node_dev(g, M, r, nd, buf, st, out, out_row, ar, NULL);
}

/* The node ran on this rank: nd belongs to it (out->one_rank: layer stages
 * and expert shards under mpirun), or one process plays every rank. */
static bool runs_here(const struct graph *g, const struct graph_node *nd, const struct rt_exec_out *out) {
  return !out || !out->one_rank || graph_runs_on(g, nd, out->rank);
}

int rt_run_node_dev(const struct graph *g, const struct rt_model *M, struct rt_request *r, const struct graph_node *nd,
                    void *const *buf, const struct rt_bound *st, struct rt_exec_out *out, int64_t out_row,
                    struct rt_arena *ar, const struct rt_node_dev *dv) {
  rt_group_fn fn = rt_backend_entry(nd);
  if (!runs_here(g, nd, out)) return 0; /* another rank's node (layer stages, expert shards) */
  if (!fn) return CEDAR_EUNSUPPORTED; /* refused earlier by rt_placement_check; an executor names the node */
  struct rt_bound own = {0};
  if (!st) {
    if (r) rt_bind_node(g, r, nd, &own); /* no request (a transfer outside a P/D one): nothing to bind */
    st = &own;
  }
  struct rt_node_ctx c = {g, M, r, nd, buf, st, out, out_row, ar, dv ? dv->stream : NULL, dv ? dv->cuda : NULL,
                          dv ? dv->params : NULL};
  rt_rtrace_tile(nd->a); /* the positions of the op groups that are not given them (round_trace.h) */
  int rc = run_guarded(fn, &c, ar);
  if (!rc && nd->place.dev == GRAPH_DEV_CPU && cedar_log_level() >= CEDAR_LOG_DEBUG &&
      ((nd->op == GRAPH_MOE && !(nd->flags & GRAPH_F_EP)) || nd->op == GRAPH_MOE_SUM))
    log_rms(M, nd, at(buf, nd->x)); /* a layer's residual streams are complete after its MoE */
  return rc;
}
