/* graph_ep.c: the compiler's expert-parallel split (serving.placement.experts,
 * scheduler/plan_place.h; runtime/dist/expert_par.h runs it). Each MoE node of
 * a layer whose routed experts are sharded over R ranks becomes
 *
 *   L.moe      (MOE, GRAPH_F_EP) on the owner (the layer's rank): the mHC
 *              mix, the router, the selection and the shared expert; writes
 *              the owner's state (L.ep: y, sel, weights, mHC post and C) and
 *              one dispatch packet per shard (L.dispS: the rows that chose one
 *              of shard S's experts, and the (expert, row, weight) pairs);
 *   L.moe_shardS (MOE_SHARD) on shard S's rank: its experts over its packet,
 *              one output row per pair (L.outS);
 *   L.moe_sum  (MOE_SUM) on the owner: the outputs added to the shared
 *              expert's in ascending expert id, then the mHC update of X.
 *
 * Packets and outputs are activations like any other: the stage pass
 * (graph_place.c) that runs next ships the ones read on another rank than
 * their writer's as TRANSFER nodes (dispatch owner -> shard, combine shard
 * -> owner: the all-to-all of one MoE node), with explicit edges, flagged
 * GRAPH_F_EP (a packet's used length travels, not its bound). A shard on
 * the owner's rank reads its packet in place. Sizes are the most a tile of
 * n rows can need: every row, min(k, E/R) pairs a row.
 */
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "scheduler/graph.h"
#include "scheduler/plan_place.h"

static bool ep_layer(const struct plan *p, int l) {
  const struct plan_placement *pl = &p->serving.place;
  return pl->n_ep_ranks > 0 && l >= 0 && l < p->n_layers && pl->ep_layer[l];
}

static int new_data(struct graph *g, int layer, int chunk, int64_t a0, int64_t bytes, int role, int shard, struct graph_place home,
                    const char *stem, const char *tag) {
  if (g->n_data == g->cap_data) {
    g->cap_data = g->cap_data ? 2 * g->cap_data : 64;
    g->data = cedar_xrealloc(g->data, sizeof(*g->data) * g->cap_data);
  }
  struct graph_data *d = &g->data[g->n_data];
  memset(d, 0, sizeof *d);
  d->kind = GRAPH_ACT;
  d->layer = -1; /* an activation: never homed by its layer's stage */
  d->chunk = chunk;
  d->bytes = bytes;
  d->a0 = a0;
  d->last_use = -1;
  d->home = home;
  d->ep = (unsigned char)role;
  d->ep_shard = (short)shard;
  if (shard >= 0)
    snprintf(d->name, sizeof d->name, "L%d.%s%d %.12s", layer, stem, shard, tag);
  else
    snprintf(d->name, sizeof d->name, "L%d.%s %.12s", layer, stem, tag);
  return g->n_data++;
}

static void add_use(struct graph_node *nd, int data, enum graph_access mode) {
  nd->use = cedar_xrealloc(nd->use, sizeof(*nd->use) * (size_t)(nd->n_use + 1));
  nd->use[nd->n_use++] = (struct graph_use){data, mode, 0, 0, 0};
}

static struct graph_node *push(struct graph *g, const struct graph_node *like) {
  if (g->n_node == g->cap_node) {
    g->cap_node = g->cap_node ? 2 * g->cap_node : 64;
    g->node = cedar_xrealloc(g->node, sizeof(*g->node) * g->cap_node);
  }
  struct graph_node *nd = &g->node[g->n_node++];
  *nd = *like;
  nd->use = NULL;
  nd->n_use = 0;
  nd->dep = NULL;
  nd->n_dep = 0;
  return nd;
}

void graph__split_experts(struct graph *g) {
  const struct plan *p = g->plan;
  const struct plan_placement *pl = &p->serving.place;
  if (!pl->n_ep_ranks) return;
  const struct plan_model *m = &p->model;
  const int R = pl->n_ep_ranks, E = m->n_routed, k = m->n_active, d = m->hidden, hc = m->hc_streams;
  const int per = E / R, kmax = k < per ? k : per;
  struct graph_node *old = g->node;
  int n_old = g->n_node;
  g->node = NULL;
  g->n_node = g->cap_node = 0;
  for (int i = 0; i < n_old; i++) {
    struct graph_node *o = &old[i];
    if (o->op != GRAPH_MOE || !ep_layer(p, o->layer)) {
      *push(g, o) = *o; /* keeps its uses and (still empty) edges */
      continue;
    }
    const int l = o->layer, n = o->n;
    const char *sp = strchr(o->name, ' '), *tag = sp ? sp + 1 : "";
    int64_t st_bytes = (int64_t)n * 4 * ((int64_t)d + 2 * k + hc + (int64_t)hc * hc);
    int st = new_data(g, l, o->chunk, o->a, st_bytes, GRAPH_EP_STATE, -1, o->place, "ep", tag);
    int pk[PLAN_MAX_EP_RANKS], out[PLAN_MAX_EP_RANKS];
    for (int s = 0; s < R; s++) {
      int64_t pairs = (int64_t)n * kmax;
      pk[s] = new_data(g, l, o->chunk, o->a, GRAPH_EP_HDR_BYTES + pairs * 12 + (int64_t)n * d * 4, GRAPH_EP_DISPATCH, s,
                       o->place, "disp", tag);
      out[s] = new_data(g, l, o->chunk, o->a, GRAPH_EP_HDR_BYTES + pairs * d * 4, GRAPH_EP_OUT, s, o->place, "out", tag);
    }
    /* the owner's route: its original accesses, X only read (the sum writes it) */
    struct graph_node *rt = push(g, o);
    for (int u = 0; u < o->n_use; u++)
      add_use(rt, o->use[u].data, o->use[u].data == o->x ? GRAPH_R : o->use[u].mode);
    add_use(rt, st, GRAPH_W);
    for (int s = 0; s < R; s++) add_use(rt, pk[s], GRAPH_W);
    rt->flags |= GRAPH_F_EP;
    rt->flops = (double)n * d * (E + 3.0 * m->n_shared * m->shared_inter);
    int w = -1; /* the layer's weights */
    for (int u = 0; u < o->n_use; u++)
      if (g->data[o->use[u].data].kind == GRAPH_WEIGHTS) w = o->use[u].data;
    for (int s = 0; s < R; s++) {
      struct graph_node *sh = push(g, o);
      sh->op = GRAPH_MOE_SHARD;
      sh->flags = 0;
      sh->x = sh->aux = sh->pre = -1;
      sh->place = (struct graph_place){pl->ep_rank[s], GRAPH_DEV_CPU, 0};
      sh->flops = 3.0 * d * m->moe_inter * (double)n * k / R;
      snprintf(sh->name, sizeof sh->name, "L%d.moe_shard%d %.16s", l, s, tag);
      add_use(sh, pk[s], GRAPH_R);
      if (w >= 0) add_use(sh, w, GRAPH_R);
      add_use(sh, out[s], GRAPH_W);
    }
    struct graph_node *sum = push(g, o);
    sum->op = GRAPH_MOE_SUM;
    sum->flags = 0;
    sum->aux = sum->pre = -1;
    sum->flops = (double)n * d * (k + 2.0 * hc);
    snprintf(sum->name, sizeof sum->name, "L%d.moe_sum %.20s", l, tag);
    add_use(sum, st, GRAPH_R);
    for (int s = 0; s < R; s++) add_use(sum, out[s], GRAPH_R);
    add_use(sum, o->x, GRAPH_RW);
    free(o->use);
  }
  free(old);
}
