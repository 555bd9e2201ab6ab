/* expert_par.c: routed experts on several ranks (expert_par.h): the op
 * groups of the compiler's split (scheduler/graph_ep.c): the owner's route
 * and dispatch packets, a shard's experts over its packet, the sum in
 * op_moe_forward's order; and the dispatch / combine TRANSFER nodes, as
 * StarPU-MPI messages between ranks (runtime/comm/comm_mpi.c) or a copy in one process. */
#include "runtime/node/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/dist/expert_par.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "base/log.h"
#include "ops/moe.h"
#include "runtime/dist/pd.h"
#include "runtime/dist/pd_internal.h"
#include "runtime/dist/place_cost.h"
#include "scheduler/plan_place.h"

#define EP_MAGIC 0x50454443u /* "CDEP" */

/* The header at the start of a dispatch packet or a shard's outputs
 * (GRAPH_EP_HDR_BYTES reserved; sent alone first under mpirun: `used`
 * sizes the body's receive). */
struct ep_hdr {
  uint32_t magic;
  int32_t role;        /* GRAPH_EP_DISPATCH or GRAPH_EP_OUT */
  int32_t layer, shard, owner; /* the owner's rank */
  int32_t n;           /* the node's rows */
  int32_t rows, pairs; /* token rows in the packet; (expert, row, weight) pairs (= output rows) */
  int64_t a;           /* the node's first position */
  int64_t used;        /* bytes used, the header included */
};
_Static_assert(sizeof(struct ep_hdr) <= GRAPH_EP_HDR_BYTES, "the header fits its room");

/* One message: its buffer and completion, kept until comm_stop. */
struct ep_msg {
  void *buf;
  bool posted;
  struct comm_msg st;
};

static struct {
  bool on; /* this request's shards are ranks under mpirun */
  int me, world;
  int64_t cnt[RT_EP_MAX_RANKS]; /* transfers with each peer so far, in graph order: part of their tags */
  struct ep_msg **m;
  int n_m, cap_m;
  int served;  /* outputs this rank sent back */
  int hold_at; /* CEDAR_EP_TEST_FAULT=hold[:N]: the N-th output is never sent (a test) */
  struct rt_ep_stats *fig; /* the request's figures: its caller's, from rt_ep_begin to rt_ep_end (else NULL: none counted) */
  pthread_mutex_t mu;
} ep = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int64_t held_here = -1; /* rt_ep_note_weights */

static double deadline_s(void) { return rt_pd_deadline_s(); } /* CEDAR_PD_DEADLINE_S, checked (pd.h) */

/* ---- the request ------------------------------------------------------------ */

int rt_ep_begin(const struct plan *p, const struct rt_gen_opts *o, bool mpi, struct rt_ep_stats *fig, char *err,
                size_t err_len) {
  rt_ep_register(); /* this feature's node entries (backend.h) */
  const struct plan_placement *pl = &p->serving.place;
  memset(fig, 0, sizeof *fig);
  fig->shards = pl->n_ep_ranks;
  for (int l = 0; l < p->n_layers; l++) fig->layers += plan_ep_layer(p, l);
  ep.on = false;
  if (!pl->n_ep_ranks) return 0;
  if (mpi && o->executor == RT_EXEC_STARPU) {
    snprintf(err, err_len, "routed experts on several ranks (serving.placement.experts) run on the direct executor "
             "under mpirun: a TRANSFER node's receive runs as a task that waits, and dispatch and combine go both "
             "ways between ranks, so a StarPU worker waiting for one packet can hold back the task its peer waits "
             "for; run with --executor direct (the default)");
    return CEDAR_EUNSUPPORTED;
  }
  if (mpi && comm_world_size() > RT_EP_MAX_RANKS) {
    snprintf(err, err_len, "expert parallelism runs on at most %d ranks; mpirun gave %d", RT_EP_MAX_RANKS,
             comm_world_size());
    return CEDAR_EUNSUPPORTED;
  }
  fig->mpi = ep.on = mpi;
  ep.me = mpi ? comm_world_rank() : 0;
  ep.world = mpi ? comm_world_size() : 1;
  memset(ep.cnt, 0, sizeof ep.cnt);
  ep.served = 0;
  if (mpi && held_here >= 0 && ep.me < RT_EP_MAX_RANKS) fig->rank[ep.me].held_expert_bytes = held_here;
  const char *f = getenv("CEDAR_EP_TEST_FAULT");
  ep.hold_at = f && !strncmp(f, "hold", 4) ? (f[4] == ':' ? atoi(f + 5) : 1) : 0;
  ep.fig = fig; /* until rt_ep_end */
  return 0;
}

static struct ep_msg *new_msg(size_t n) {
  struct ep_msg *s = cedar_xcalloc(1, sizeof *s);
  s->buf = cedar_xmalloc(n ? n : 1);
  pthread_mutex_lock(&ep.mu);
  if (ep.n_m == ep.cap_m) {
    ep.cap_m = ep.cap_m ? 2 * ep.cap_m : 64;
    ep.m = cedar_xrealloc(ep.m, sizeof(*ep.m) * (size_t)ep.cap_m);
  }
  ep.m[ep.n_m++] = s;
  pthread_mutex_unlock(&ep.mu);
  return s;
}

void rt_ep_end(void) {
  ep.fig = NULL; /* the figures are the caller's from here */
  for (int i = 0; i < ep.n_m; i++) {
    free(ep.m[i]->buf);
    free(ep.m[i]);
  }
  free(ep.m);
  ep.m = NULL;
  ep.n_m = ep.cap_m = 0;
  ep.on = false;
}

static bool wait_done(struct comm_msg *s, double dl) {
  double until = comm_now() + dl;
  while (!atomic_load(&s->done)) {
    if (comm_now() > until) return false;
    nanosleep(&(struct timespec){0, 100000}, NULL);
  }
  return true;
}

/* Tags: bit 30 set (the pipeline's stay below it), the kind, then the
 * count of transfers with that peer: both sides run the same transfer
 * nodes in the same (graph) order (the direct executor). */
enum { EP_HDR = 0, EP_BODY = 1, EP_STATS = 3 };
static int tag_of(int kind, int64_t cnt) { return (1 << 30) | (kind << 28) | (int)(cnt & 0x0fffffff); }

static int post(struct ep_msg *m, size_t n, int peer, int tag, bool send) {
  m->posted = true;
  return send ? comm_send(m->buf, n, peer, tag, &m->st) : comm_recv(m->buf, n, peer, tag, &m->st);
}

/* Every message of this request completed (each within the deadline): what
 * comm_stop needs to shut StarPU-MPI down. */
static int all_done(char *err, size_t err_len) {
  for (int i = 0; i < ep.n_m; i++)
    if (ep.m[i]->posted && !wait_done(&ep.m[i]->st, deadline_s())) {
      snprintf(err, err_len, "rank %d: an expert-parallel message did not complete in %.0f s (CEDAR_PD_DEADLINE_S)",
               ep.me, deadline_s());
      return CEDAR_EIO;
    }
  return 0;
}

int rt_ep_gather(char *err, size_t err_len) {
  if (!ep.on) return 0;
  if (ep.me != 0) {
    struct ep_msg *m = new_msg(sizeof *ep.fig);
    memcpy(m->buf, ep.fig, sizeof *ep.fig);
    int rc = post(m, sizeof *ep.fig, 0, tag_of(EP_STATS, 0), true);
    if (rc) snprintf(err, err_len, "rank %d: sending the expert-parallel figures failed", ep.me);
    return rc ? rc : all_done(err, err_len);
  }
  for (int r = 1; r < ep.world; r++) {
    struct ep_msg *m = new_msg(sizeof *ep.fig);
    int rc = post(m, sizeof *ep.fig, r, tag_of(EP_STATS, 0), false);
    if (rc) return snprintf(err, err_len, "rank 0: receiving the expert-parallel figures failed"), rc;
    if (!wait_done(&m->st, deadline_s())) {
      snprintf(err, err_len, "rank 0: no expert-parallel figures from rank %d for %.0f s (CEDAR_PD_DEADLINE_S)", r,
               deadline_s());
      return CEDAR_EIO;
    }
    const struct rt_ep_stats *o = m->buf;
    ep.fig->passes += o->passes;
    for (int k = 0; k < RT_EP_MAX_RANKS; k++) {
      struct rt_ep_rank *a = &ep.fig->rank[k];
      const struct rt_ep_rank *b = &o->rank[k];
      a->rows += b->rows, a->expert_rows += b->expert_rows, a->expert_s += b->expert_s;
      a->dispatch_bytes += b->dispatch_bytes, a->dispatch_meta_bytes += b->dispatch_meta_bytes;
      a->combine_bytes += b->combine_bytes, a->messages += b->messages;
      a->held_expert_bytes += b->held_expert_bytes;
    }
  }
  return all_done(err, err_len);
}

/* ---- placement ------------------------------------------------------------------ */

/* This rank's shard of the plan (-1: none). */
static void count(int rank, void (*f)(struct rt_ep_rank *, int64_t, int64_t, double), int64_t a, int64_t b,
                  double c) {
  pthread_mutex_lock(&ep.mu);
  if (ep.fig && rank >= 0 && rank < RT_EP_MAX_RANKS) f(&ep.fig->rank[rank], a, b, c);
  pthread_mutex_unlock(&ep.mu);
}
static void add_load(struct rt_ep_rank *k, int64_t rows, int64_t pairs, double s) {
  k->rows += rows, k->expert_rows += pairs, k->expert_s += s;
}
static void add_dispatch(struct rt_ep_rank *k, int64_t x, int64_t meta, double msgs) {
  k->dispatch_bytes += x, k->dispatch_meta_bytes += meta, k->messages += (int64_t)msgs;
}
static void add_combine(struct rt_ep_rank *k, int64_t b, int64_t msgs, double unused) {
  (void)unused;
  k->combine_bytes += b, k->messages += msgs;
}

/* ---- a rank's weights ---------------------------------------------------------- */

/* Rank's shard in a shard list of n ranks, as rows [lo, hi) of E experts
 * (empty when the rank holds none there). */
static struct weights_rows shard_rows(const int *list, int n, int rank, int E) {
  for (int s = 0; s < n; s++)
    if (list[s] == rank) return (struct weights_rows){(int64_t)s * (E / n), (int64_t)(s + 1) * (E / n)};
  return (struct weights_rows){0, 0};
}

/* The smallest range holding a and b (an empty one adds nothing). */
static struct weights_rows cover(struct weights_rows a, struct weights_rows b) {
  if (a.hi <= a.lo) return b;
  if (b.hi <= b.lo) return a;
  return (struct weights_rows){a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
}

/* Under P/D a rank holds what either role puts on it (plan.h: ep_rank is
 * the prefill role's shard list, ep_rank_d the decode role's; a stage's
 * rank its prefill home, decode its decode home). One range a tensor: when
 * a rank's shards of the two roles are not adjacent it holds the experts
 * between them too (correct, more bytes). */
static bool part_rows(const struct weights_spec *s, struct weights_rows *r, const void *ctx) {
  const struct rt_ep_part *e = ctx;
  const struct plan *p = e->p;
  const struct plan_placement *pl = &p->serving.place;
  const int E = p->model.n_routed;
  if (s->layer < 0 || !strstr(s->name, ".ffn.experts.") || s->shape[0] != E) return false;
  if (!plan_ep_layer(p, s->layer)) { /* with stages, a layer's own experts live with its stage alone */
    if (!plan_has_stages(p)) return false;
    const struct plan_stage *st = &pl->stage[plan_stage_of(p, s->layer)];
    if (st->rank == e->rank || (st->pd && st->decode == e->rank)) return false;
    *r = (struct weights_rows){0, 0};
    return true;
  }
  *r = shard_rows(pl->ep_rank, pl->n_ep_ranks, e->rank, E);
  if (pl->n_ep_ranks_d) *r = cover(*r, shard_rows(pl->ep_rank_d, pl->n_ep_ranks_d, e->rank, E));
  if (r->hi <= r->lo) *r = (struct weights_rows){0, 0};
  return true;
}

void rt_ep_note_weights(const struct plan *p, const struct weights *w) {
  held_here = p->serving.place.n_ep_ranks ? rt_place_held_experts(p, w) : -1;
}

const struct weights_part *rt_ep_part_init(struct rt_ep_part *e, const struct plan *p, int rank) {
  if (!p->serving.place.n_ep_ranks) return NULL;
  *e = (struct rt_ep_part){{part_rows, e}, p, rank};
  return &e->part;
}

/* ---- the buffers ------------------------------------------------------------------ */

/* The data of node nd with expert-parallel role `role` (shard s; -1 any). */
static int data_of(const struct graph *g, const struct graph_node *nd, int role, int s) {
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_data *gd = &g->data[nd->use[u].data];
    if (gd->ep == role && (s < 0 || gd->ep_shard == s)) return nd->use[u].data;
  }
  return -1;
}

/* A packet's body after its header: int32 expert[pairs], int32 row[pairs],
 * float weight[pairs], then float x[rows][hidden]. */
static int64_t body_bytes(int rows, int pairs, int d) { return (int64_t)pairs * 12 + (int64_t)rows * d * 4; }

struct view {
  int32_t *expert, *row;
  float *weight, *x;
};
static struct view view_of(void *pkt, int pairs) {
  struct view v;
  v.expert = (int32_t *)((char *)pkt + GRAPH_EP_HDR_BYTES);
  v.row = v.expert + pairs;
  v.weight = (float *)(v.row + pairs);
  v.x = v.weight + pairs;
  return v;
}

/* The owner's state (graph_ep.c sizes it): y, sel, wt, post, C. */
struct state {
  float *y;
  int32_t *sel;
  float *wt, *post, *C;
};
static struct state state_of(void *b, int n, int d, int k, int hc) {
  struct state s;
  s.y = b;
  s.sel = (int32_t *)(s.y + (size_t)n * d);
  s.wt = (float *)(s.sel + (size_t)n * k);
  s.post = s.wt + (size_t)n * k;
  s.C = s.post + (size_t)n * hc;
  return s;
}

/* The (token, slot) pairs of a selection grouped by expert, tokens
 * ascending: op_moe_forward's grouping. start[E + 1], tok/slot[n * k]. */
static void group(const int32_t *sel, int n, int k, int E, int *start, int *tok, int *slot, int *cur) {
  memset(start, 0, sizeof(int) * (size_t)(E + 1));
  for (int q = 0; q < n * k; q++) start[sel[q] + 1]++;
  for (int e = 0; e < E; e++) start[e + 1] += start[e];
  memcpy(cur, start, sizeof(int) * (size_t)E);
  for (int t = 0; t < n; t++)
    for (int j = 0; j < k; j++) {
      int q = cur[sel[(size_t)t * k + j]]++;
      tok[q] = t;
      if (slot) slot[q] = j;
    }
}

/* ---- the owner's route: routing, the shared expert, the packets --------------------- */

int rt_ep_route(const struct rt_node_ctx *c) {
  const struct graph *g = c->g;
  const struct graph_node *nd = c->nd;
  const struct rt_model *M = c->M;
  const struct plan *p = M->p;
  struct rt_arena *ar = c->ar;
  const int n = nd->n, d = M->moe.hidden, k = M->moe.n_active, E = M->moe.n_routed, hc = M->mhc.hc;
  const int R = p->serving.place.n_ep_ranks, per = E / R, owner = nd->place.rank;
  int sd = data_of(g, nd, GRAPH_EP_STATE, -1);
  CEDAR_ASSERT_MSG(sd >= 0, "%s: no expert-parallel state (scheduler/graph_ep.c)", nd->name);
  struct state S = state_of(c->buf[sd], n, d, k, hc);
  float *x = RT_ALLOC(ar, float, (size_t)n * d);
  rt_moe_route(M, nd, c->buf[nd->x], nd->aux >= 0 ? c->buf[nd->aux] : NULL, x, S.y, S.sel, S.wt, S.post, S.C, ar);
  double t0 = rt_clock();
  int *start = RT_ALLOC(ar, int, E + 1), *tok = RT_ALLOC(ar, int, (size_t)n * k), *slot = RT_ALLOC(ar, int, (size_t)n * k);
  int *row_of = RT_ALLOC(ar, int, n);
  group(S.sel, n, k, E, start, tok, slot, RT_ALLOC(ar, int, E));
  for (int s = 0; s < R; s++) {
    int pd = data_of(g, nd, GRAPH_EP_DISPATCH, s);
    CEDAR_ASSERT_MSG(pd >= 0, "%s: no packet for shard %d", nd->name, s);
    int q0 = start[s * per], q1 = start[(s + 1) * per], rows = 0, rk = p->serving.place.ep_rank[s];
    for (int t = 0; t < n; t++) row_of[t] = -1;
    for (int q = q0; q < q1; q++) row_of[tok[q]] = 0; /* selected one of this shard's experts */
    for (int t = 0; t < n; t++)
      if (row_of[t] >= 0) row_of[t] = rows++;
    struct ep_hdr h = {EP_MAGIC, GRAPH_EP_DISPATCH, nd->layer, s, owner, n, rows, q1 - q0, nd->a,
                       GRAPH_EP_HDR_BYTES + body_bytes(rows, q1 - q0, d)};
    CEDAR_ASSERT(h.used <= g->data[pd].bytes);
    memcpy(c->buf[pd], &h, sizeof h);
    struct view v = view_of(c->buf[pd], q1 - q0);
    for (int q = q0; q < q1; q++) {
      v.expert[q - q0] = S.sel[(size_t)tok[q] * k + slot[q]];
      v.row[q - q0] = row_of[tok[q]];
      v.weight[q - q0] = S.wt[(size_t)tok[q] * k + slot[q]];
    }
    for (int t = 0; t < n; t++)
      if (row_of[t] >= 0) memcpy(v.x + (size_t)row_of[t] * d, x + (size_t)t * d, sizeof(float) * (size_t)d);
    if (rk != owner) /* dispatched to another rank (in one process: counted as if it were) */
      count(owner, add_dispatch, (int64_t)rows * d * 4, GRAPH_EP_HDR_BYTES + 12 * (int64_t)(q1 - q0),
            1 + (q1 > q0));
  }
  ar->fam_s[RT_FAM_MOE] += rt_clock() - t0;
  return 0;
}

/* ---- a shard: its experts over its packet -------------------------------------------- */

/* The packet or outputs at b: a header that fits node nd and its bound. */
static int check_hdr(const struct ep_hdr *h, const struct graph_node *nd, int role, int64_t bound, int kmax) {
  return h->magic == EP_MAGIC && h->role == role && h->layer == nd->layer && h->a == nd->a && h->n == nd->n &&
         h->rows >= 0 && h->rows <= nd->n && h->pairs >= h->rows && h->pairs <= (int64_t)nd->n * kmax &&
         h->used >= GRAPH_EP_HDR_BYTES && h->used <= bound;
}

int rt_ep_shard(const struct rt_node_ctx *c) {
  const struct graph *g = c->g;
  const struct graph_node *nd = c->nd;
  const struct rt_model *M = c->M;
  const struct op_moe_cfg *cf = &M->moe;
  const int d = cf->hidden, I = cf->inter, k = cf->n_active;
  int pd = data_of(g, nd, GRAPH_EP_DISPATCH, -1), od = data_of(g, nd, GRAPH_EP_OUT, -1);
  CEDAR_ASSERT_MSG(pd >= 0 && od >= 0, "%s: no packet or outputs (scheduler/graph_ep.c)", nd->name);
  struct ep_hdr h;
  memcpy(&h, c->buf[pd], sizeof h);
  if (!check_hdr(&h, nd, GRAPH_EP_DISPATCH, g->data[pd].bytes, k) || h.shard != g->data[pd].ep_shard) {
    LOG_ERROR("%s: the dispatch packet is for layer %d, position %lld, shard %d: the ranks disagree on the graph; "
              "this request fails", nd->name, h.layer, (long long)h.a, h.shard);
    return CEDAR_EIO;
  }
  const struct op_moe_weights *w = &M->L[nd->layer].moe;
  char nm[WEIGHTS_NAME_MAX];
  snprintf(nm, sizeof nm, "layers.%d.ffn.experts.w_gate", nd->layer);
  const int per = cf->n_routed / g->plan->serving.place.n_ep_ranks; /* the graph's role's shard list (P/D: plan_role_view) */
  const int64_t e0 = weights_row0(M->w, nm); /* this rank's first expert when it holds only its part */
  const struct weights_spec *ws = weights_list_find(&M->w->list, nm);
  CEDAR_ASSERT(ws != NULL);
  const size_t wi = (size_t)(ws - M->w->list.t);
  const int64_t e1 = M->w->part ? M->w->part[wi].hi : cf->n_routed; /* past its last held expert */
  struct view v = view_of(c->buf[pd], h.pairs);
  float *out = (float *)((char *)c->buf[od] + GRAPH_EP_HDR_BYTES);
  struct rt_arena *ar = c->ar;
  double t0 = rt_clock();
  float *xg = RT_ALLOC(ar, float, (size_t)h.rows * d + 1), *yg = RT_ALLOC(ar, float, (size_t)h.rows * d + 1);
  float *rs = RT_ALLOC(ar, float, h.rows + 1), *gu = RT_ALLOC(ar, float, 2 * (size_t)h.rows * I + 1);
  for (int q0 = 0; q0 < h.pairs;) { /* each expert once over its rows (ascending), as op_moe_forward */
    int e = v.expert[q0], cnt = 0;
    while (q0 + cnt < h.pairs && v.expert[q0 + cnt] == e) {
      memcpy(xg + (size_t)cnt * d, v.x + (size_t)v.row[q0 + cnt] * d, sizeof(float) * (size_t)d);
      rs[cnt] = v.weight[q0 + cnt];
      cnt++;
    }
    if (e < h.shard * per || e >= (h.shard + 1) * per || e < e0 || e >= e1) {
      LOG_ERROR("%s: expert %d is not shard %d's (or not held here); this request fails", nd->name, e, h.shard);
      return CEDAR_EIO;
    }
    size_t el = (size_t)(e - e0);
    struct op_qweight wg = op_qweight_rows(&w->q.gate, (int)el * I, I), wu = op_qweight_rows(&w->q.up, (int)el * I, I);
    struct op_qweight wd = op_qweight_rows(&w->q.down, (int)el * d, d); /* the held experts' views (model.c binds them) */
    op_moe_ffn_q(yg, xg, &wg, &wu, &wd, rs, cnt, cf->limit, gu);
    memcpy(out + (size_t)q0 * d, yg, sizeof(float) * (size_t)cnt * d);
    q0 += cnt;
  }
  double dt = rt_clock() - t0;
  ar->fam_s[RT_FAM_MOE] += dt;
  struct ep_hdr o = h;
  o.role = GRAPH_EP_OUT;
  o.used = GRAPH_EP_HDR_BYTES + (int64_t)h.pairs * d * 4;
  CEDAR_ASSERT(o.used <= g->data[od].bytes);
  memcpy(c->buf[od], &o, sizeof o);
  count(nd->place.rank, add_load, h.rows, h.pairs, dt);
  if (nd->place.rank != h.owner) /* the outputs go back: a header, then the rows (when any) */
    count(nd->place.rank, add_combine, (int64_t)h.pairs * d * 4, 1 + (h.pairs > 0), 0);
  return 0;
}

/* ---- the owner's sum: ascending expert id, rows ascending ------------------------------- */

int rt_ep_sum(const struct rt_node_ctx *c) {
  const struct graph *g = c->g;
  const struct graph_node *nd = c->nd;
  const struct rt_model *M = c->M;
  const struct plan *p = M->p;
  struct rt_arena *ar = c->ar;
  const int n = nd->n, d = M->moe.hidden, k = M->moe.n_active, E = M->moe.n_routed, hc = M->mhc.hc;
  const int R = p->serving.place.n_ep_ranks, per = E / R;
  int sd = data_of(g, nd, GRAPH_EP_STATE, -1);
  CEDAR_ASSERT_MSG(sd >= 0, "%s: no expert-parallel state", nd->name);
  struct state S = state_of(c->buf[sd], n, d, k, hc);
  double t0 = rt_clock();
  float *y = RT_ALLOC(ar, float, (size_t)n * d); /* the state is read here, never written */
  memcpy(y, S.y, sizeof(float) * (size_t)n * d);
  int *start = RT_ALLOC(ar, int, E + 1), *tok = RT_ALLOC(ar, int, (size_t)n * k);
  group(S.sel, n, k, E, start, tok, NULL, RT_ALLOC(ar, int, E));
  const float **out = RT_ALLOC(ar, const float *, R);
  for (int s = 0; s < R; s++) {
    int od = data_of(g, nd, GRAPH_EP_OUT, s);
    CEDAR_ASSERT_MSG(od >= 0, "%s: no outputs of shard %d", nd->name, s);
    struct ep_hdr h;
    memcpy(&h, c->buf[od], sizeof h);
    if (!check_hdr(&h, nd, GRAPH_EP_OUT, g->data[od].bytes, k) || h.shard != s ||
        h.pairs != start[(s + 1) * per] - start[s * per]) {
      LOG_ERROR("%s: shard %d's outputs are for layer %d, position %lld, %d pairs: not this node's; this request "
                "fails", nd->name, s, h.layer, (long long)h.a, h.pairs);
      return CEDAR_EIO;
    }
    out[s] = (const float *)((const char *)c->buf[od] + GRAPH_EP_HDR_BYTES);
  }
  for (int e = 0; e < E; e++) {
    int s = e / per, base = start[s * per];
    for (int q = start[e]; q < start[e + 1]; q++) {
      float *yt = y + (size_t)tok[q] * d;
      const float *src = out[s] + (size_t)(q - base) * d;
      for (int j = 0; j < d; j++) yt[j] += src[j];
    }
  }
  ar->fam_s[RT_FAM_MOE] += rt_clock() - t0;
  rt_moe_finish(M, nd, c->buf[nd->x], S.post, S.C, y, S.sel, ar);
  pthread_mutex_lock(&ep.mu);
  if (ep.fig) ep.fig->passes += n;
  pthread_mutex_unlock(&ep.mu);
  return 0;
}

/* ---- dispatch and combine: the TRANSFER nodes ---------------------------------------- */

int rt_ep_transfer_node(const struct rt_node_ctx *c) {
  const struct graph *g = c->g;
  const struct graph_node *nd = c->nd;
  int src = nd->xfer_src, dst = nd->xfer_dst;
  const struct graph_data *sd = &g->data[src], *dd = &g->data[dst];
  if (!ep.on) { /* one process: the used part of the packet or outputs, copied */
    struct ep_hdr h;
    memcpy(&h, c->buf[src], sizeof h);
    CEDAR_ASSERT(h.magic == EP_MAGIC && h.used >= GRAPH_EP_HDR_BYTES && h.used <= dd->bytes);
    memcpy(c->buf[dst], c->buf[src], (size_t)h.used);
    return 0;
  }
  int from = sd->home.rank, to = dd->home.rank, peer = ep.me == from ? to : from;
  CEDAR_ASSERT(peer >= 0 && peer < RT_EP_MAX_RANKS && (ep.me == from || ep.me == to));
  int64_t cn = ep.cnt[peer]++;
  double dl = deadline_s();
  if (ep.me == from) { /* the header, then the used body; both detached */
    struct ep_hdr h;
    memcpy(&h, c->buf[src], sizeof h);
    struct ep_msg *hm = new_msg(GRAPH_EP_HDR_BYTES), *bm = NULL;
    memcpy(hm->buf, c->buf[src], GRAPH_EP_HDR_BYTES);
    size_t body = (size_t)(h.used - GRAPH_EP_HDR_BYTES);
    if (body) {
      bm = new_msg(body);
      memcpy(bm->buf, (char *)c->buf[src] + GRAPH_EP_HDR_BYTES, body);
    }
    if (sd->ep == GRAPH_EP_OUT && ++ep.served == ep.hold_at) { /* a test: these outputs never leave */
      LOG_ERROR("rank %d: CEDAR_EP_TEST_FAULT: holding back %s", ep.me, nd->name);
      return 0;
    }
    int rc = post(hm, GRAPH_EP_HDR_BYTES, to, tag_of(EP_HDR, cn), true);
    if (!rc && bm) rc = post(bm, body, to, tag_of(EP_BODY, cn), true);
    if (rc) LOG_ERROR("rank %d: %s: posting the send to rank %d failed", ep.me, nd->name, to);
    return rc ? CEDAR_EIO : 0;
  }
  struct ep_msg *hm = new_msg(GRAPH_EP_HDR_BYTES);
  int rc = post(hm, GRAPH_EP_HDR_BYTES, from, tag_of(EP_HDR, cn), false);
  if (rc || !wait_done(&hm->st, dl)) {
    LOG_ERROR("rank %d: %s (positions %lld+%d): nothing from rank %d for %.0f s (CEDAR_PD_DEADLINE_S): that rank "
              "died or is stuck; this request fails", ep.me, nd->name, (long long)nd->a, nd->n, from, dl);
    return CEDAR_EIO;
  }
  struct ep_hdr h;
  memcpy(&h, hm->buf, sizeof h);
  if (!check_hdr(&h, nd, sd->ep, dd->bytes, c->M->moe.n_active) || h.shard != sd->ep_shard) {
    LOG_ERROR("rank %d: %s: rank %d sent layer %d, position %lld, shard %d: the ranks disagree on the graph; this "
              "request fails", ep.me, nd->name, from, h.layer, (long long)h.a, h.shard);
    return CEDAR_EIO;
  }
  memcpy(c->buf[dst], hm->buf, GRAPH_EP_HDR_BYTES);
  size_t body = (size_t)(h.used - GRAPH_EP_HDR_BYTES);
  if (!body) return 0;
  struct ep_msg *bm = new_msg(body);
  rc = post(bm, body, from, tag_of(EP_BODY, cn), false);
  if (rc || !wait_done(&bm->st, dl)) {
    LOG_ERROR("rank %d: %s: the %zu bytes after the header from rank %d did not arrive in %.0f s; this request "
              "fails", ep.me, nd->name, body, from, dl);
    return CEDAR_EIO;
  }
  memcpy((char *)c->buf[dst] + GRAPH_EP_HDR_BYTES, bm->buf, body);
  free(bm->buf); /* the handle goes at comm_stop; the payload is done with */
  bm->buf = NULL;
  return 0;
}

void rt_ep_register(void) {
  rt_backend_feature(GRAPH_DEV_CPU, GRAPH_TRANSFER, GRAPH_F_EP, GRAPH_F_EP, rt_ep_transfer_node); /* stage pass or not */
  rt_backend_feature(GRAPH_DEV_CPU, GRAPH_MOE, GRAPH_F_EP, GRAPH_F_EP, rt_ep_route);
  rt_backend_feature(GRAPH_DEV_CPU, GRAPH_MOE_SHARD, 0, 0, rt_ep_shard);
  rt_backend_feature(GRAPH_DEV_CPU, GRAPH_MOE_SUM, 0, 0, rt_ep_sum);
}
