/* devseg.c: decode segments, their keys and the metadata a replayed node
 * leaves (devseg.h). Host logic in every build.
 * Test: tests/test_devbind.c. */
#include "runtime/exec/devseg.h"

#include <string.h>

#include "runtime/model/arena.h"
#include "runtime/node/backend.h"
#include "runtime/exec/exec.h"

static bool has_kv(const struct graph *g, const struct graph_node *nd) {
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_data *gd = &g->data[nd->use[u].data];
    if (gd->kind == GRAPH_STATE && gd->state == GRAPH_ST_KV) return true;
  }
  return false;
}

/* Whether node nd can be in a segment: a layer's own group, at most 8
 * positions (the parameter block's ring slots), no ring reset (its r0
 * comes from the node, so it would be a step of its own), and no keys of
 * another source (key_slot: vendor on a step its source's group fills:
 * the block lists one node's pages; such a node runs eagerly). */
static bool in_segment(const struct graph_node *nd) {
  bool op = nd->op == GRAPH_ENGRAM || nd->op == GRAPH_ATTN || nd->op == GRAPH_MOE || nd->op == GRAPH_DEC_KV;
  bool slot = nd->key_src[0] >= 0 || nd->key_src[1] >= 0; /* a second page table: the block lists one (eager) */
  return op && nd->layer >= 0 && nd->n <= 8 && !(nd->flags & GRAPH_F_RING_RESET) && !slot;
}

int rt_dev_segments(const struct graph *g, int *seg_end) {
  memset(seg_end, 0, sizeof(int) * (size_t)g->n_node);
  if (g->flow != GRAPH_DECODE) return 0;
  int n = 0;
  for (int k = 0; k < g->n_node;) {
    const struct graph_node *nd = &g->node[k];
    if (!in_segment(nd)) {
      k++;
      continue;
    }
    int kv = has_kv(g, nd), e = k + 1; /* one KV node a segment: the block holds one node's tail and counts */
    while (e < g->n_node && in_segment(&g->node[e]) && g->node[e].layer == nd->layer && g->node[e].a == nd->a &&
           g->node[e].n == nd->n && kv + has_kv(g, &g->node[e]) <= 1)
      kv += has_kv(g, &g->node[e++]);
    seg_end[k] = e;
    n++;
    k = e;
  }
  return n;
}

int rt_dev_segment_lead(const struct graph *g, int k0, int k1) {
  for (int k = k0; k < k1; k++)
    if (has_kv(g, &g->node[k])) return k;
  return k0;
}

struct rt_cugraph_key rt_dev_segment_key(const struct graph *g, int k0, int k1, const struct rt_dev_params *P) {
  struct rt_cugraph_key k;
  memset(&k, 0, sizeof k);
  k.segment = g->node[k0].layer;
  k.shape[0] = P->n;
  k.shape[1] = P->n_pages;
  k.shape[2] = k1 - k0;
  k.shape[3] = g->n_node;
  size_t act = rt_dev_act_bytes(g);
  k.shape[4] = (int32_t)(act & 0x7fffffff);
  k.shape[5] = (int32_t)(act >> 31);
  k.shape[6] = g->node[k0].op;
  k.shape[7] = P->request; /* the slot's ring, tail and page-table addresses are baked in */
  k.shape[8] = (int32_t)(P->r0 & 0x7fffffff); /* the sparse attention's window floor, a kernel argument */
  k.shape[9] = (int32_t)(P->r0 >> 31);
  uint32_t flags = 0; /* the nodes' flags, hashed (unsigned: wraps, never overflows) */
  for (int j = k0; j < k1; j++) flags = flags * 31u + (uint32_t)g->node[j].flags;
  k.shape[10] = (int32_t)(flags & 0x7fffffff);
  return k;
}

void rt_dev_node_advance(struct rt_dev_twin *t, struct rt_request *r, const struct graph *g,
                         const struct graph_node *nd) {
  struct rt_bound st;
  rt_bind_node(g, r, nd, &st);
  if (st.kv_w) {
    int l = (int)(st.kv_w - r->seq);
    __atomic_store_n(&st.kv_w->n_entries, st.kv_w_end, __ATOMIC_RELEASE);
    if (t) t->seq[l].n_entries = st.kv_w_end;
  }
  if (st.tail && (nd->op == GRAPH_DEC_KV || (nd->flags & GRAPH_F_WRITE_KV))) {
    int l = (int)(st.tail - r->tail);
    int64_t next = nd->a + nd->n, ratio = st.tail->ratio;
    st.tail->pos0 = next / ratio * ratio;
    st.tail->count = (int)(next - st.tail->pos0);
    if (t) {
      t->tail[l].pos0 = st.tail->pos0;
      t->tail[l].count = st.tail->count;
    }
  }
  if (st.ring && nd->op == GRAPH_ATTN) {
    int l = (int)(st.ring - r->ring);
    if (nd->flags & GRAPH_F_RING_RESET) st.ring->r0 = nd->r0;
    else if (nd->r0 > st.ring->r0) st.ring->r0 = nd->r0;
    if (t) t->ring[l].r0 = st.ring->r0;
  }
}

/* The segment's nodes on stream, their per-step values from params (NULL:
 * host arguments). The host metadata is left to rt_dev_node_advance (the
 * replays run none of this), so the twin is put back as the caller's step
 * expects. */
static int seg_fn(void *stream, const void *params, void *arg) {
  struct rt_dev_seg *S = arg;
  for (int k = S->k0; k < S->k1; k++) {
    const struct graph_node *nd = &S->g->node[k];
    struct rt_bound st;
    rt_dev_bind_node(S->tw, S->g, S->r, nd, &st);
    struct rt_cuda_env env;
    const struct rt_node_dev dv = {stream, params, rt_dev_env(S->dv, S->tw, S->cw, &env)};
    int rc = rt_run_node_dev(S->g, S->M, S->r, nd, S->buf, &st, S->out, 0 /* HEAD is never in a segment */, S->ar,
                             &dv);
    rt_arena_reset(S->ar);
    if (rc) {
      S->failed = k + 1;
      S->rc = rc;
      return rc;
    }
  }
  return 0;
}

int rt_dev_seg_run(struct rt_dev_seg *S, struct rt_cugraph_cache *cache, bool graph, void *stream, char *err,
                   size_t err_len) {
  struct rt_dev_params P;
  char why[256];
  const struct graph *g = S->g;
  S->failed = S->rc = 0;
  bool block = rt_dev_params_fill(&P, g, S->r, S->tw->slot, &g->node[rt_dev_segment_lead(g, S->k0, S->k1)], why,
                                  sizeof why) == 0;
  int rc;
  if (block && cache) {
    struct rt_cugraph_key key = rt_dev_segment_key(g, S->k0, S->k1, &P);
    rc = rt_cugraph_run(cache, &key, seg_fn, S, &P, stream, graph, err, err_len);
  } else if (block && !S->dv->cm) { /* the host stand-in: in place, the block on the host */
    rc = seg_fn(stream, &P, S);
  } else { /* no block for this step or this stream: one by one, host arguments */
    rc = seg_fn(stream, NULL, S);
  }
  if (S->failed) rt_node_error(&g->node[S->failed - 1], S->rc, err, err_len);
  for (int j = S->k0; j < S->k1 && !rc; j++) rt_dev_node_advance(S->tw, S->r, g, &g->node[j]);
  return rc;
}
