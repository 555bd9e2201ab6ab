/* graph_place.c: the compiler's placement pass for layer stages
 * (serving.placement.stages, scheduler/plan_place.h): every node goes to
 * the rank of the stage holding its layer, every state object to its
 * layer's stage, and an activation or bus read on another rank than the
 * one that last wrote it gets a TRANSFER node first (the residual streams
 * and the carried mHC pre at a stage boundary; a Top-K or candidate bus
 * read across one). A KV source's pages live with its stage; a reader in
 * another stage (a CSA layer reading the source's global KV) reads a copy
 * on its own rank, and before each such read a TRANSFER ships the entries
 * committed since the last one it received ([e_w0, e_w1) of the copy's
 * write). Expert dispatch packets and shard outputs (graph_ep.c, split
 * first, here) are activations too, so they travel the same way; without
 * stages the pass runs for them alone. Runs on a graph whose nodes are
 * emitted but whose edges are not derived yet: the transfers then get explicit edges like every node (read
 * after the write they ship, the copy's readers after it).
 * P/D stages ({layers: 0-13, prefill: 0, decode: 2}): the graph is built
 * from one role's view of the plan (plan_role_view), so stage[].rank is that
 * role's home. A prefill graph's P->D TRANSFER runs where its source lives
 * (the stage's prefill home) and its twin lives on the stage's decode home;
 * the token history goes to every decode home (one TRANSFER each).
 */
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "scheduler/graph.h"
#include "scheduler/plan_place.h"

static struct graph_place stage_place(const struct plan *p, int s) {
  const struct plan_stage *st = &p->serving.place.stage[s];
  struct graph_place pl = {st->rank, st->device == PLAN_DEV_CUDA ? GRAPH_DEV_CUDA : GRAPH_DEV_CPU, 0};
  if (pl.dev == GRAPH_DEV_CUDA) pl.dev_id = st->device_id;
  return pl;
}

/* Stage s's decode home (P/D stages). */
static struct graph_place decode_place(const struct plan *p, int s) {
  struct graph_place pl = stage_place(p, s);
  pl.rank = p->serving.place.stage[s].decode;
  return pl;
}

static int first_decoder(const struct plan *p) {
  for (int l = 0; l < p->n_layers; l++)
    if (p->layer[l].region == PLAN_DECODER) return l;
  return p->n_layers - 1;
}

/* Where node nd runs. */
static struct graph_place node_place(const struct plan *p, const struct graph_node *nd) {
  if (nd->op == GRAPH_MOE_SHARD || !plan_has_stages(p)) return nd->place; /* a shard's rank (graph_ep.c); the flow's */
  switch (nd->op) {
  case GRAPH_EMBED: return stage_place(p, plan_stage_of(p, 0));
  case GRAPH_HEAD: return stage_place(p, plan_stage_of(p, p->n_layers - 1));
  case GRAPH_KEEP_XE:
  case GRAPH_REPLAY_IN: return stage_place(p, plan_stage_of(p, first_decoder(p))); /* CED's replay lives there */
  default: return stage_place(p, plan_stage_of(p, nd->layer >= 0 ? nd->layer : 0));
  }
}

static void remap(struct graph_node *nd, int from, int to) {
  for (int u = 0; u < nd->n_use; u++)
    if (nd->use[u].data == from) nd->use[u].data = to;
  if (nd->x == from) nd->x = to;
  if (nd->aux == from) nd->aux = to;
  if (nd->pre == from) nd->pre = to;
  for (int i = 0; i < 4; i++)
    if (nd->bus[i] == from) nd->bus[i] = to;
}

static int add_copy(struct graph *g, int src, struct graph_place home) {
  if (g->n_data == g->cap_data) {
    g->cap_data = g->cap_data ? 2 * g->cap_data : 64;
    g->data = cedar_xrealloc(g->data, sizeof(*g->data) * g->cap_data);
  }
  struct graph_data *d = &g->data[g->n_data];
  *d = g->data[src];
  d->home = home;
  d->last_use = -1;
  char base[32];
  snprintf(base, sizeof base, "%s", g->data[src].name);
  snprintf(d->name, sizeof d->name, "%.24s@r%d", base, home.rank);
  return g->n_data++;
}

static bool movable(const struct graph_data *d) { return d->kind == GRAPH_ACT || d->kind == GRAPH_BUS; }

static void grow(struct graph *g) {
  if (g->n_node == g->cap_node) {
    g->cap_node = g->cap_node ? 2 * g->cap_node : 64;
    g->node = cedar_xrealloc(g->node, sizeof(*g->node) * g->cap_node);
  }
}

/* A TRANSFER of activation d's current version from its copy src on rank
 * `from` to its copy dst on rank `to`, before node nd. It runs on the
 * sending side (graph.h); the receiving side runs it too (graph_runs_on). */
static void push_transfer(struct graph *g, const struct graph_node *nd, int d, int src, int dst, int from, int to) {
  grow(g);
  struct graph_node *t = &g->node[g->n_node++];
  memset(t, 0, sizeof *t);
  t->op = GRAPH_TRANSFER;
  t->layer = -1;
  t->chunk = nd->chunk;
  t->a = g->data[d].a0;
  t->n = nd->n;
  t->x = t->aux = t->pre = -1;
  for (int i = 0; i < 4; i++) t->bus[i] = -1;
  t->n_slots = 1;
  t->xfer_src = src;
  t->xfer_dst = dst;
  t->place = g->data[src].home;
  char nm[32];
  snprintf(nm, sizeof nm, "%s", g->data[d].name);
  snprintf(t->name, sizeof t->name, "xfer %.16s r%d>r%d", nm, from & 0xff, to & 0xff);
  t->use = cedar_xmalloc(sizeof(*t->use) * 2);
  t->use[0] = (struct graph_use){src, GRAPH_R, 0, 0, 0};
  t->use[1] = (struct graph_use){dst, GRAPH_W, 0, 0, 0};
  t->n_use = 2;
  t->flags = GRAPH_F_STAGE;
  if (g->data[d].ep) { /* an expert dispatch or combine (graph_ep.c) */
    t->flags |= GRAPH_F_EP;
    t->layer = nd->layer;
    g->n_ep_transfer++;
  }
  g->n_act_transfer++;
}

static bool is_kv(const struct graph_data *d) { return d->kind == GRAPH_STATE && d->state == GRAPH_ST_KV; }

/* A TRANSFER of KV source d's entries [e0, e1) from its home (rank
 * `from`) to its copy dst on rank `to`, before node nd. */
static void push_kv_transfer(struct graph *g, const struct graph_node *nd, int d, int dst, int from, int to,
                             int64_t e0, int64_t e1) {
  grow(g);
  struct graph_node *t = &g->node[g->n_node++];
  memset(t, 0, sizeof *t);
  t->op = GRAPH_TRANSFER;
  t->layer = g->data[d].layer;
  t->chunk = nd->chunk;
  t->a = nd->a;
  t->n = nd->n;
  t->x = t->aux = t->pre = -1;
  for (int i = 0; i < 4; i++) t->bus[i] = -1;
  t->n_slots = 1;
  t->xfer_src = d;
  t->xfer_dst = dst;
  t->place = g->data[d].home;
  t->flags = GRAPH_F_STAGE;
  snprintf(t->name, sizeof t->name, "xfer L%d.kv c%d r%d>r%d", t->layer, nd->chunk & 0xffff, from & 0xff, to & 0xff);
  t->use = cedar_xmalloc(sizeof(*t->use) * 2);
  t->use[0] = (struct graph_use){d, GRAPH_R, e1, 0, 0};
  t->use[1] = (struct graph_use){dst, GRAPH_W, 0, e0, e1};
  t->n_use = 2;
  g->n_kv_transfer++;
}

/* The entries source d had committed when the graph began: its first
 * access says (an append starts there; a read sees them all). -1: unused. */
static void kv_start(const struct graph *g, const struct graph_node *node, int n_node, int64_t *start) {
  for (int d = 0; d < g->n_data; d++) start[d] = -1;
  for (int k = 0; k < n_node; k++)
    for (int u = 0; u < node[k].n_use; u++) {
      const struct graph_use *us = &node[k].use[u];
      if (!is_kv(&g->data[us->data]) || start[us->data] >= 0) continue;
      start[us->data] = us->mode == GRAPH_APPEND ? us->e_w0 : us->e_read;
    }
}

/* key_slot: vendor (docs/model.md s3.2): the stages whose index layers score
 * KV source l's Indexer K on decode steps, though l is not their own
 * source (graph__key_sources): on[s] for stage s. Returns whether any. */
static bool key_stages(const struct plan *p, int l, bool *on) {
  bool any = false;
  for (int s = 0; s < p->serving.place.n_stages; s++) on[s] = false;
  for (int j = 0; j < p->n_layers; j++) {
    int src[2];
    graph__key_sources(p, j, src);
    if (src[0] != l && src[1] != l) continue;
    int s = plan_stage_of(p, j);
    any |= s != plan_stage_of(p, l);
    on[s] |= s != plan_stage_of(p, l);
  }
  return any;
}

/* A graph's last pass under key_slot: vendor: a KV source's entries reach
 * every stage whose index layers may score them as the slot's keys, up to
 * the graph's last entry. A reader in another stage ships only what it
 * reads (the entries committed since the last read), which holds because
 * it reads every step; slot readers read on some steps only, so every
 * graph ends with their ranks' copies whole, as the next one's first
 * access assumes (kv_start). end[d]: d's entries after the graph. */
static void key_copies_whole(struct graph *g, int n0, int R, int *own, int64_t *shipped, const int64_t *end,
                             const bool *twin) {
  const struct plan *p = g->plan;
  bool on[PLAN_MAX_STAGES];
  const struct graph_node last = g->node[g->n_node - 1];
  for (int d = 0; d < n0; d++) {
    const struct graph_data *gd = &g->data[d];
    if (!is_kv(gd) || twin[d] || end[d] < 0 || !key_stages(p, gd->layer, on)) continue;
    for (int s = 0; s < p->serving.place.n_stages; s++) {
      int me = stage_place(p, s).rank;
      if (!on[s] || me == gd->home.rank) continue;
      if (own[d * R + me] < 0) own[d * R + me] = add_copy(g, d, stage_place(p, s));
      if (end[d] > shipped[d * R + me])
        push_kv_transfer(g, &last, d, own[d * R + me], gd->home.rank, me, shipped[d * R + me], end[d]);
      shipped[d * R + me] = end[d];
    }
  }
}

/* P/D stages under key_slot: vendor: P->D transfer k of a KV source's
 * entries also goes to the decode home of every stage whose index layers
 * may score them as the slot's keys (a twin each), as the token history
 * goes to every decode home. */
static void key_sources_to_decode_homes(struct graph *g, int k) {
  const struct plan *p = g->plan;
  bool on[PLAN_MAX_STAGES];
  int l = g->data[g->node[k].xfer_src].layer;
  if (!key_stages(p, l, on)) return;
  for (int s = 0; s < p->serving.place.n_stages; s++) {
    int r = p->serving.place.stage[s].decode;
    if (!on[s] || r == g->data[g->node[k].xfer_dst].home.rank) continue;
    int dst = add_copy(g, g->node[k].xfer_dst, decode_place(p, s));
    grow(g);
    struct graph_node *c = &g->node[g->n_node];
    *c = g->node[k];
    c->xfer_dst = dst;
    c->use = cedar_xmalloc(sizeof(*c->use) * (size_t)c->n_use);
    memcpy(c->use, g->node[k].use, sizeof(*c->use) * (size_t)c->n_use);
    for (int u = 0; u < c->n_use; u++)
      if (c->use[u].data == g->node[k].xfer_dst) c->use[u].data = dst;
    snprintf(c->name, sizeof c->name, "xfer L%d.kv >r%d", l, r & 0xff);
    g->n_node++;
    g->n_transfer++;
  }
}

/* P/D stages: every decode home needs the token history (its Engram
 * gathers and the sampler read it): a clone of P->D transfer k for each
 * decode home other than its twin's, each to a twin of its own. */
static void tokens_to_every_decode_home(struct graph *g, int k) {
  const struct plan_placement *pl = &g->plan->serving.place;
  for (int s = 0; s < pl->n_stages; s++) {
    int r = pl->stage[s].decode, seen = g->data[g->node[k].xfer_dst].home.rank == r;
    for (int t = 0; t < s; t++) seen |= pl->stage[t].decode == r;
    if (seen) continue;
    int dst = add_copy(g, g->node[k].xfer_dst, decode_place(g->plan, s));
    grow(g);
    struct graph_node *c = &g->node[g->n_node];
    *c = g->node[k];
    c->xfer_dst = dst;
    c->use = cedar_xmalloc(sizeof(*c->use) * (size_t)c->n_use);
    memcpy(c->use, g->node[k].use, sizeof(*c->use) * (size_t)c->n_use);
    for (int u = 0; u < c->n_use; u++)
      if (c->use[u].data == g->node[k].xfer_dst) c->use[u].data = dst;
    snprintf(c->name, sizeof c->name, "xfer tokens >r%d", r & 0xff);
    g->n_node++;
    g->n_transfer++;
  }
}

void graph__place_stages(struct graph *g) {
  const struct plan *p = g->plan;
  graph__split_experts(g);
  if (!plan_has_stages(p) && !p->serving.place.n_ep_ranks) return;
  int R = plan_place_ranks(p), n0 = g->n_data;
  /* state and weights: with their layer's stage; the kept encoder outputs
   * with the decoder; the token history and the model-wide weights on every
   * rank (each embeds or gathers Engram rows from its own copy). */
  bool *twin = cedar_xcalloc((size_t)n0 + 1, sizeof(bool)); /* the decode side's copies of P->D transfers */
  for (int k = 0; k < g->n_node; k++)
    if (g->node[k].op == GRAPH_TRANSFER && g->node[k].xfer_dst >= 0) twin[g->node[k].xfer_dst] = true;
  for (int d = 0; d < n0; d++) {
    struct graph_data *gd = &g->data[d];
    if (twin[d] && plan_has_stages(p) && p->serving.place.stage[0].pd) { /* with its layer's stage's decode home */
      int l = gd->layer >= 0 ? gd->layer : gd->state == GRAPH_ST_XE ? first_decoder(p) : 0;
      gd->home = decode_place(p, plan_stage_of(p, l));
      continue;
    }
    if (gd->layer >= 0 && !movable(gd) && plan_has_stages(p)) gd->home = stage_place(p, plan_stage_of(p, gd->layer));
    if (gd->kind == GRAPH_STATE && gd->state == GRAPH_ST_XE && plan_has_stages(p)) gd->home = stage_place(p, plan_stage_of(p, first_decoder(p)));
  }
  /* own[d * R + r]: d's data id on rank r (-1 until needed; the first
   * writer's rank takes d itself); cur: that copy holds d's current version */
  int *own = cedar_xmalloc(sizeof(int) * (size_t)n0 * (size_t)R);
  bool *cur = cedar_xcalloc((size_t)n0 * (size_t)R, sizeof(bool));
  bool *taken = cedar_xcalloc((size_t)n0, sizeof(bool));
  for (int i = 0; i < n0 * R; i++) own[i] = -1;
  struct graph_node *old = g->node;
  int n_old = g->n_node;
  /* KV sources: shipped[d * R + r], the entries rank r's copy holds (the
   * graph's start: every earlier graph shipped what its readers read) */
  int64_t *start = cedar_xmalloc(sizeof(int64_t) * (size_t)n0), *shipped = cedar_xmalloc(sizeof(int64_t) * (size_t)n0 * R);
  kv_start(g, old, n_old, start);
  int64_t *end = cedar_xmalloc(sizeof(int64_t) * (size_t)n0); /* key_copies_whole */
  memcpy(end, start, sizeof(int64_t) * (size_t)n0);
  for (int d = 0; d < n0; d++)
    for (int r = 0; r < R; r++) shipped[d * R + r] = start[d];
  g->node = NULL;
  g->n_node = g->cap_node = 0;
  g->n_act_transfer = g->n_kv_transfer = g->n_ep_transfer = 0;
  for (int k = 0; k < n_old; k++) {
    struct graph_node nd = old[k];
    nd.place = node_place(p, &nd);
    if (nd.op == GRAPH_TRANSFER) nd.place = g->data[nd.xfer_src].home; /* P->D: where its source lives */
    int me = nd.place.rank;
    for (int u = 0; u < nd.n_use; u++) {
      int d = nd.use[u].data;
      if (d < n0 && twin[d]) continue; /* the decode side's copy: the P->D transfer's own business */
      if (d < n0 && is_kv(&g->data[d]) && g->data[d].home.rank != me) { /* a reader in another stage */
        CEDAR_ASSERT_MSG(nd.use[u].mode == GRAPH_R, "%s writes %s, which another stage holds", nd.name,
                         g->data[d].name);
        int *o = &own[d * R];
        if (o[me] < 0) o[me] = add_copy(g, d, nd.place);
        int64_t *sh = &shipped[d * R + me], need = nd.use[u].e_read;
        if (need > *sh) {
          push_kv_transfer(g, &nd, d, o[me], g->data[d].home.rank, me, *sh, need);
          *sh = need;
        }
        nd.use[u].data = o[me];
        continue;
      }
      if (d >= n0 || !movable(&g->data[d])) continue;
      int *o = &own[d * R];
      bool *c = &cur[d * R];
      if (o[me] < 0) {
        if (!taken[d]) {
          o[me] = d;
          g->data[d].home = nd.place;
          taken[d] = true;
        } else {
          o[me] = add_copy(g, d, nd.place);
        }
      }
      if ((nd.use[u].mode & GRAPH_R) && !c[me]) { /* the current version lives elsewhere: ship it */
        int from = -1;
        for (int r = 0; r < R && from < 0; r++)
          if (c[r]) from = r;
        CEDAR_ASSERT_MSG(from >= 0, "%s reads %s before anything wrote it", nd.name, g->data[d].name);
        push_transfer(g, &nd, d, o[from], o[me], from, me);
        c[me] = true;
      }
      if (nd.use[u].mode & GRAPH_W) /* a new version: only this rank's copy is current */
        for (int r = 0; r < R; r++) c[r] = r == me;
      if (o[me] != d) remap(&nd, d, o[me]);
    }
    grow(g);
    g->node[g->n_node++] = nd;
    if (nd.op == GRAPH_TRANSFER && g->data[nd.xfer_src].state == GRAPH_ST_TOKENS && p->serving.place.stage[0].pd)
      tokens_to_every_decode_home(g, g->n_node - 1);
    if (nd.op == GRAPH_TRANSFER && !(nd.flags & GRAPH_F_STAGE) && is_kv(&g->data[nd.xfer_src]) &&
        plan_has_stages(p) && p->serving.place.stage[0].pd)
      key_sources_to_decode_homes(g, g->n_node - 1);
    for (int u = 0; u < nd.n_use && plan_has_stages(p); u++) { /* each KV source's entries after the graph */
      const struct graph_use *us = &old[k].use[u];
      if (us->data >= n0 || !is_kv(&g->data[us->data])) continue;
      int64_t e = us->e_w1 > us->e_read ? us->e_w1 : us->e_read;
      if (e > end[us->data]) end[us->data] = e;
    }
  }
  bool pd_prefill = false; /* P's prefill: its P->D transfers carry the slot's sources (key_sources_to_decode_homes) */
  for (int d = 0; d < n0; d++) pd_prefill |= twin[d];
  if (plan_has_stages(p) && g->n_node && !pd_prefill) key_copies_whole(g, n0, R, own, shipped, end, twin);
  free(twin);
  free(own);
  free(cur);
  free(taken);
  free(start);
  free(end);
  free(shipped);
  for (int d = 0; d < g->n_data; d++) g->data[d].last_use = -1; /* finish() derives them */
  free(old);
}

bool graph_runs_on(const struct graph *g, const struct graph_node *nd, int rank) {
  if (nd->op == GRAPH_TRANSFER && (nd->flags & GRAPH_F_STAGE) && g->data[nd->xfer_dst].home.rank == rank)
    return true; /* a stage transfer's receiving side (a P->D one is received outside the graph: pd.h) */
  return nd->place.rank == rank;
}

enum graph_run graph_run_kind(const struct graph *g) {
  bool ranks = false;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    if (nd->op == GRAPH_TRANSFER && !(nd->flags & (GRAPH_F_STAGE | GRAPH_F_EP))) return GRAPH_RUN_PD;
    ranks |= (nd->op == GRAPH_TRANSFER) || nd->op == GRAPH_MOE_SHARD || (nd->flags & GRAPH_F_EP);
  }
  return ranks ? GRAPH_RUN_RANKS : GRAPH_RUN_ONE;
}
