/* expert_par.c: routed experts on several ranks (expert_par.h): the
 * dispatch packet, a shard's experts over it, the combine in op_moe_forward's
 * order, and the StarPU-MPI messages between owner and shards (pd_mpi.c). */
#include "runtime/expert_par.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "base/log.h"
#include "ops/moe.h"
#include "runtime/pd.h"
#include "runtime/pd_internal.h"
#include "scheduler/plan_place.h"

#define EP_MAGIC 0x50454443u /* "CDEP" */

/* The header of a dispatch packet (sent alone first: its counts size the
 * packet's receive). */
struct ep_hdr {
  uint32_t magic;
  int32_t layer;
  int64_t a;           /* the node's first position */
  int32_t n, shard;    /* the node's rows; the shard it is for */
  int32_t rows, pairs; /* token rows in the packet; (expert, row, weight) pairs */
};

/* One message: its buffer and completion, kept until pd_mpi_stop. */
struct ep_msg {
  void *buf;
  bool posted;
  struct pd_msg_state st;
};

static struct {
  bool on; /* this request's shards are ranks under mpirun */
  int me, world;
  int64_t cnt[RT_EP_MAX_RANKS]; /* exchanges with each peer so far: part of their tags */
  struct ep_msg **m;
  int n_m, cap_m;
  int served;  /* shard exchanges this rank answered */
  int hold_at; /* CEDAR_EP_TEST_FAULT=hold[:N]: the N-th answer is never sent (a test) */
  pthread_mutex_t mu;
} ep = {.mu = PTHREAD_MUTEX_INITIALIZER};

static struct rt_ep_stats last;
const struct rt_ep_stats *rt_ep_last_stats(void) { return &last; }

bool rt_ep_layer(const struct plan *p, int l) {
  const struct plan_placement *pl = &p->serving.place;
  return pl->n_ep_ranks > 0 && l >= 0 && l < p->n_layers && pl->ep_layer[l];
}

static double deadline_s(void) {
  const char *s = getenv("CEDAR_PD_DEADLINE_S");
  double d = s ? atof(s) : 0;
  return d > 0 ? d : 60;
}

/* ---- the request ------------------------------------------------------------ */

int rt_ep_begin(const struct plan *p, const struct rt_gen_opts *o, bool mpi, char *err, size_t err_len) {
  const struct plan_placement *pl = &p->serving.place;
  memset(&last, 0, sizeof last);
  last.shards = pl->n_ep_ranks;
  for (int l = 0; l < p->n_layers; l++) last.layers += rt_ep_layer(p, l);
  ep.on = false;
  if (!pl->n_ep_ranks) return 0;
  if (mpi && o->executor == RT_EXEC_STARPU) {
    snprintf(err, err_len, "routed experts on several ranks (serving.placement.experts) run on the direct executor "
             "under mpirun: the ranks must meet each expert exchange in graph order, and a StarPU worker blocked in "
             "one exchange could wait for a task the other rank has not reached; run with --executor direct (the "
             "default)");
    return CEDAR_EUNSUPPORTED;
  }
  if (mpi && rt_pd_world_size() > RT_EP_MAX_RANKS) {
    snprintf(err, err_len, "expert parallelism runs on at most %d ranks; mpirun gave %d", RT_EP_MAX_RANKS,
             rt_pd_world_size());
    return CEDAR_EUNSUPPORTED;
  }
  last.mpi = ep.on = mpi;
  ep.me = mpi ? rt_pd_world_rank() : 0;
  ep.world = mpi ? rt_pd_world_size() : 1;
  memset(ep.cnt, 0, sizeof ep.cnt);
  ep.served = 0;
  const char *f = getenv("CEDAR_EP_TEST_FAULT");
  ep.hold_at = f && !strncmp(f, "hold", 4) ? (f[4] == ':' ? atoi(f + 5) : 1) : 0;
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
  for (int i = 0; i < ep.n_m; i++) {
    free(ep.m[i]->buf);
    free(ep.m[i]);
  }
  free(ep.m);
  ep.m = NULL;
  ep.n_m = ep.cap_m = 0;
  ep.on = false;
}

static bool wait_done(struct pd_msg_state *s, double dl) {
  double until = pd_now() + dl;
  while (!atomic_load(&s->done)) {
    if (pd_now() > until) return false;
    nanosleep(&(struct timespec){0, 100000}, NULL);
  }
  return true;
}

/* Tags: bit 30 set (the pipeline's stay below it), the kind, then the
 * count of exchanges with that peer: both sides count the same exchanges
 * in the same (graph) order. */
enum { EP_HDR = 0, EP_BODY = 1, EP_OUT = 2, EP_STATS = 3 };
static int tag_of(int kind, int64_t cnt) { return (1 << 30) | (kind << 28) | (int)(cnt & 0x0fffffff); }

static int post(struct ep_msg *m, size_t n, int peer, int tag, bool send) {
  m->posted = true;
  return send ? pd_mpi_send(m->buf, n, peer, tag, &m->st) : pd_mpi_recv(m->buf, n, peer, tag, &m->st);
}

/* Every message of this request completed (each within the deadline): what
 * pd_mpi_stop needs to shut StarPU-MPI down. */
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
    struct ep_msg *m = new_msg(sizeof last);
    memcpy(m->buf, &last, sizeof last);
    int rc = post(m, sizeof last, 0, tag_of(EP_STATS, 0), true);
    if (rc) snprintf(err, err_len, "rank %d: sending the expert-parallel figures failed", ep.me);
    return rc ? rc : all_done(err, err_len);
  }
  for (int r = 1; r < ep.world; r++) {
    struct ep_msg *m = new_msg(sizeof last);
    int rc = post(m, sizeof last, r, tag_of(EP_STATS, 0), false);
    if (rc) return snprintf(err, err_len, "rank 0: receiving the expert-parallel figures failed"), rc;
    if (!wait_done(&m->st, deadline_s())) {
      snprintf(err, err_len, "rank 0: no expert-parallel figures from rank %d for %.0f s (CEDAR_PD_DEADLINE_S)", r,
               deadline_s());
      return CEDAR_EIO;
    }
    const struct rt_ep_stats *o = m->buf;
    last.passes += o->passes;
    for (int k = 0; k < RT_EP_MAX_RANKS; k++) {
      struct rt_ep_rank *a = &last.rank[k];
      const struct rt_ep_rank *b = &o->rank[k];
      a->rows += b->rows, a->expert_rows += b->expert_rows, a->expert_s += b->expert_s;
      a->dispatch_bytes += b->dispatch_bytes, a->dispatch_meta_bytes += b->dispatch_meta_bytes;
      a->combine_bytes += b->combine_bytes, a->messages += b->messages;
    }
  }
  return all_done(err, err_len);
}

/* ---- placement ------------------------------------------------------------------ */

static int shard_rank(const struct plan *p, int s) { return p->serving.place.ep_rank[s]; }

/* This rank's shard of the plan (-1: none). */
static int my_shard(const struct plan *p, int rank) {
  for (int s = 0; s < p->serving.place.n_ep_ranks; s++)
    if (shard_rank(p, s) == rank) return s;
  return -1;
}

bool rt_ep_serves(const struct graph *g, const struct graph_node *nd, int rank) {
  return ep.on && nd->op == GRAPH_MOE && rt_ep_layer(g->plan, nd->layer) && nd->place.rank != rank &&
         my_shard(g->plan, rank) >= 0;
}

bool rt_ep_helper(const struct rt_model *M, const struct graph_node *nd) {
  return ep.on && rt_ep_layer(M->p, nd->layer) && nd->place.rank != ep.me;
}

static void count(int rank, void (*f)(struct rt_ep_rank *, int64_t, int64_t, double), int64_t a, int64_t b,
                  double c) {
  pthread_mutex_lock(&ep.mu);
  if (rank >= 0 && rank < RT_EP_MAX_RANKS) f(&last.rank[rank], a, b, c);
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

/* ---- the packet ------------------------------------------------------------------ */

/* Body: int32 expert[pairs], int32 row[pairs], float weight[pairs], then
 * float x[rows][hidden]. */
static size_t body_bytes(int rows, int pairs, int d) {
  return (size_t)pairs * 12 + (size_t)rows * (size_t)d * sizeof(float);
}

struct view {
  int32_t *expert, *row;
  float *weight, *x;
};
static struct view view_of(void *body, int pairs) {
  struct view v;
  v.expert = body;
  v.row = v.expert + pairs;
  v.weight = (float *)(v.row + pairs);
  v.x = v.weight + pairs;
  return v;
}

/* Shard s's experts over its packet: one output row per pair, in pair
 * order. Each expert runs once over its rows (ascending), as in
 * op_moe_forward. */
static void shard_compute(const struct rt_model *M, int layer, const struct ep_hdr *h, void *body, float *out,
                          int rank, struct rt_arena *ar) {
  const struct op_moe_cfg *c = &M->moe;
  const struct op_moe_weights *w = &M->L[layer].moe;
  int d = c->hidden, I = c->inter;
  struct view v = view_of(body, h->pairs);
  double t0 = rt_clock();
  float *xg = RT_ALLOC(ar, float, (size_t)h->rows * d), *yg = RT_ALLOC(ar, float, (size_t)h->rows * d);
  float *rs = RT_ALLOC(ar, float, h->rows > 0 ? h->rows : 1), *gu = RT_ALLOC(ar, float, 2 * (size_t)h->rows * I);
  for (int q0 = 0; q0 < h->pairs;) {
    int e = v.expert[q0], cnt = 0;
    while (q0 + cnt < h->pairs && v.expert[q0 + cnt] == e) {
      memcpy(xg + (size_t)cnt * d, v.x + (size_t)v.row[q0 + cnt] * d, sizeof(float) * (size_t)d);
      rs[cnt] = v.weight[q0 + cnt];
      cnt++;
    }
    op_moe_ffn(yg, xg, w->gate + (size_t)e * I * d, w->up + (size_t)e * I * d, w->down + (size_t)e * d * I, rs, cnt,
               d, I, c->limit, gu);
    memcpy(out + (size_t)q0 * d, yg, sizeof(float) * (size_t)cnt * d);
    q0 += cnt;
  }
  double dt = rt_clock() - t0;
  ar->fam_s[RT_FAM_MOE] += dt;
  count(rank, add_load, h->rows, h->pairs, dt);
}

/* ---- the owner --------------------------------------------------------------------- */

int rt_ep_forward(const struct rt_model *M, const struct graph_node *nd, float *y, int32_t *sel, float *wt,
                  const float *x, struct rt_arena *ar) {
  const struct plan *p = M->p;
  const struct op_moe_cfg *c = &M->moe;
  const struct op_moe_weights *w = &M->L[nd->layer].moe;
  const int n = nd->n, d = c->hidden, k = c->n_active, E = c->n_routed, R = p->serving.place.n_ep_ranks;
  const int per = E / R, owner = ep.on ? ep.me : nd->place.rank;
  if (n <= 0) return 0;
  /* 1. routing and the shared expert, as op_moe_forward */
  void *ws = rt_arena_alloc(ar, op_moe_workspace_bytes(n, c));
  float *scores = RT_ALLOC(ar, float, (size_t)n * E);
  RT_TIMED(ar, MOE, op_moe_scores(scores, x, w->router, n, c); op_moe_select(sel, wt, scores, w->bias, NULL, n, c);
           op_moe_shared(y, x, w, n, c, ws));
  /* the (token, slot) pairs grouped by expert, tokens ascending */
  int *start = RT_ALLOC(ar, int, E + 1), *tok = RT_ALLOC(ar, int, (size_t)n * k), *slot = RT_ALLOC(ar, int, (size_t)n * k);
  memset(start, 0, sizeof(int) * (size_t)(E + 1));
  for (int q = 0; q < n * k; q++) start[sel[q] + 1]++;
  for (int e = 0; e < E; e++) start[e + 1] += start[e];
  int *cur = RT_ALLOC(ar, int, E);
  memcpy(cur, start, sizeof(int) * (size_t)E);
  for (int t = 0; t < n; t++)
    for (int j = 0; j < k; j++) {
      int q = cur[sel[(size_t)t * k + j]]++;
      tok[q] = t, slot[q] = j;
    }
  /* 2. a packet per shard */
  struct ep_hdr *hdr = RT_ALLOC(ar, struct ep_hdr, R);
  void **body = RT_ALLOC(ar, void *, R);
  float **out = RT_ALLOC(ar, float *, R);
  struct ep_msg **rx = RT_ALLOC(ar, struct ep_msg *, R);
  int *row_of = RT_ALLOC(ar, int, n);
  for (int s = 0; s < R; s++) {
    int q0 = start[s * per], q1 = start[(s + 1) * per], rows = 0, rk = shard_rank(p, s);
    bool remote = rk != owner;
    for (int t = 0; t < n; t++) row_of[t] = -1;
    for (int q = q0; q < q1; q++) row_of[tok[q]] = 0; /* selected one of this shard's experts */
    for (int t = 0; t < n; t++)
      if (row_of[t] >= 0) row_of[t] = rows++;
    hdr[s] = (struct ep_hdr){EP_MAGIC, nd->layer, nd->a, n, s, rows, q1 - q0};
    size_t bb = body_bytes(rows, q1 - q0, d);
    struct ep_msg *bm = ep.on && remote ? new_msg(bb) : NULL;
    body[s] = bm ? bm->buf : rt_arena_alloc(ar, bb ? bb : 1);
    struct view v = view_of(body[s], q1 - q0);
    for (int q = q0; q < q1; q++) {
      v.expert[q - q0] = sel[(size_t)tok[q] * k + slot[q]];
      v.row[q - q0] = row_of[tok[q]];
      v.weight[q - q0] = wt[(size_t)tok[q] * k + slot[q]];
    }
    for (int t = 0; t < n; t++)
      if (row_of[t] >= 0) memcpy(v.x + (size_t)row_of[t] * d, x + (size_t)t * d, sizeof(float) * (size_t)d);
    if (remote)
      count(owner, add_dispatch, (int64_t)rows * d * 4, (int64_t)sizeof(struct ep_hdr) + 12 * (int64_t)(q1 - q0),
            1 + (rows > 0));
    rx[s] = NULL;
    out[s] = NULL;
    if (!(ep.on && remote)) continue;
    int64_t cn = ep.cnt[rk]++;
    struct ep_msg *hm = new_msg(sizeof(struct ep_hdr));
    memcpy(hm->buf, &hdr[s], sizeof hdr[s]);
    int rc = post(hm, sizeof hdr[s], rk, tag_of(EP_HDR, cn), true);
    if (!rc && rows > 0) rc = post(bm, bb, rk, tag_of(EP_BODY, cn), true);
    if (!rc && q1 > q0) {
      rx[s] = new_msg(sizeof(float) * (size_t)(q1 - q0) * d);
      rc = post(rx[s], sizeof(float) * (size_t)(q1 - q0) * d, rk, tag_of(EP_OUT, cn), false);
    }
    if (rc) {
      LOG_ERROR("rank %d: moe L%d: posting the dispatch to rank %d failed", owner, nd->layer, rk);
      return CEDAR_EIO;
    }
  }
  /* 3. the shards here: the owner's own, or every one in one process */
  for (int s = 0; s < R; s++) {
    if (rx[s] || (ep.on && shard_rank(p, s) != owner)) continue;
    out[s] = RT_ALLOC(ar, float, (size_t)hdr[s].pairs * d + 1);
    shard_compute(M, nd->layer, &hdr[s], body[s], out[s], shard_rank(p, s), ar);
    if (shard_rank(p, s) != owner && hdr[s].pairs > 0) /* what its rank would send back */
      count(shard_rank(p, s), add_combine, (int64_t)hdr[s].pairs * d * 4, 1, 0);
  }
  for (int s = 0; s < R; s++) {
    if (!rx[s]) continue;
    double t0 = rt_clock();
    if (!wait_done(&rx[s]->st, deadline_s())) {
      LOG_ERROR("rank %d: moe L%d (positions %lld+%d): no expert outputs from rank %d for %.0f s "
                "(CEDAR_PD_DEADLINE_S): that rank died or is stuck; this request fails", owner, nd->layer,
                (long long)nd->a, n, shard_rank(p, s), deadline_s());
      return CEDAR_EIO;
    }
    ar->fam_s[RT_FAM_MOE] += rt_clock() - t0;
    out[s] = rx[s]->buf;
  }
  /* 4. combine: ascending expert id, rows ascending (op_moe_forward's order) */
  for (int e = 0; e < E; e++) {
    int s = e / per, base = start[s * per];
    for (int q = start[e]; q < start[e + 1]; q++) {
      float *yt = y + (size_t)tok[q] * d;
      const float *src = out[s] + (size_t)(q - base) * d;
      for (int j = 0; j < d; j++) yt[j] += src[j];
    }
  }
  pthread_mutex_lock(&ep.mu);
  last.passes += n;
  pthread_mutex_unlock(&ep.mu);
  return 0;
}

/* ---- a shard rank ---------------------------------------------------------------------- */

int rt_ep_serve(const struct rt_model *M, const struct graph_node *nd, struct rt_arena *ar) {
  const struct plan *p = M->p;
  int s = my_shard(p, ep.me), owner = nd->place.rank, d = M->moe.hidden;
  if (s < 0) return 0;
  int64_t cn = ep.cnt[owner]++;
  double dl = deadline_s();
  struct ep_msg *hm = new_msg(sizeof(struct ep_hdr));
  int rc = post(hm, sizeof(struct ep_hdr), owner, tag_of(EP_HDR, cn), false);
  if (!rc && !wait_done(&hm->st, dl)) {
    LOG_ERROR("rank %d: moe L%d (positions %lld+%d): no tokens dispatched from rank %d for %.0f s "
              "(CEDAR_PD_DEADLINE_S): that rank died or is stuck; this request fails", ep.me, nd->layer,
              (long long)nd->a, nd->n, owner, dl);
    return CEDAR_EIO;
  }
  struct ep_hdr h;
  memcpy(&h, hm->buf, sizeof h);
  int64_t most = (int64_t)nd->n * M->moe.n_active; /* pairs a shard can get */
  if (rc || h.magic != EP_MAGIC || h.layer != nd->layer || h.a != nd->a || h.n != nd->n || h.shard != s ||
      h.rows < 0 || h.rows > nd->n || h.pairs < h.rows || h.pairs > most) {
    LOG_ERROR("rank %d: moe L%d: the dispatch from rank %d is for layer %d, position %lld, shard %d: the ranks "
              "disagree on the graph; this request fails", ep.me, nd->layer, owner, h.layer, (long long)h.a, h.shard);
    return CEDAR_EIO;
  }
  size_t bb = body_bytes(h.rows, h.pairs, d);
  struct ep_msg *bm = new_msg(bb);
  if (h.rows > 0) {
    rc = post(bm, bb, owner, tag_of(EP_BODY, cn), false);
    if (rc || !wait_done(&bm->st, dl)) {
      LOG_ERROR("rank %d: moe L%d: the dispatched rows from rank %d did not arrive in %.0f s; this request fails",
                ep.me, nd->layer, owner, dl);
      return CEDAR_EIO;
    }
  }
  if (h.pairs == 0) return 0;
  struct ep_msg *om = new_msg(sizeof(float) * (size_t)h.pairs * d);
  shard_compute(M, nd->layer, &h, bm->buf, om->buf, ep.me, ar);
  free(bm->buf); /* the handle goes at pd_mpi_stop; the payload is done with */
  bm->buf = NULL;
  count(ep.me, add_combine, (int64_t)h.pairs * d * 4, 1, 0);
  if (++ep.served == ep.hold_at) { /* a test: this answer never leaves */
    LOG_ERROR("rank %d: CEDAR_EP_TEST_FAULT: holding back the outputs of moe L%d", ep.me, nd->layer);
    atomic_store(&om->st.done, 1);
    return 0;
  }
  return post(om, sizeof(float) * (size_t)h.pairs * d, owner, tag_of(EP_OUT, cn), true);
}
