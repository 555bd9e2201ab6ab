/* pipeline.c: layer stages on several ranks (pipeline.h): the skip rule,
 * the activation and KV transfers, the logits after each graph, the trace
 * records, the placement check and the request driver. Messages go through
 * runtime/comm/comm.h (runtime/comm/comm_mpi.c). */
#include "runtime/node/backend.h"
#include "runtime/dist/pipeline.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "runtime/dist/expert_par.h"
#include "runtime/dist/pd.h"
#include "runtime/comm/comm.h"
#include "scheduler/plan_place.h"

/* One message: its buffer and completion, both kept until StarPU-MPI has
 * let go of them (comm_stop, at the end of the request). */
struct sent {
  void *buf;
  int peer;
  struct comm_msg st;
};

static struct {
  bool on;            /* under mpirun, between rt_pipe_open and rt_pipe_close */
  int me, world;
  int seq;            /* graphs run in this request: part of each tag */
  struct sent **sent; /* this request's messages */
  int n_sent, cap_sent;
  int first_open;     /* messages before it completed (sends_done) */
  bool held;          /* CEDAR_PIPE_TEST_FAULT=hold: a transfer was held back */
  int die_rank, die_at; /* CEDAR_PIPE_TEST_FAULT=die:R:K: rank R kills itself at its K-th transfer (-1: none) */
  atomic_int n_xfer;  /* transfers this rank ran in this request (sent or received) */
  pthread_mutex_t mu;
  char err[256];
  int rc;
  int suspect;        /* the rank a wait of this request gave up on first, or -1 (rt_pipe_suspect) */
  bool trace;         /* record the nodes' times for one trace (rt_pipe_trace) */
  double *arrive;     /* (cap_arrive) this graph's receives: when each message arrived (CLOCK_MONOTONIC s), by node */
  int cap_arrive;
  struct rt_pipe_stats *fig; /* the request's figures: its caller's (rt_pipe_open), between open and close */
} pp = {.mu = PTHREAD_MUTEX_INITIALIZER};

static struct rt_pipe_trace ptr; /* rank 0: the last graph's records */
static double *ptr_rec;
static int ptr_cap;


static double deadline_s(void) { return rt_pd_deadline_s(); } /* CEDAR_PD_DEADLINE_S, checked (pd.h) */

bool rt_pipe_multi(const struct plan *p) {
  return (plan_has_stages(p) || p->serving.place.n_ep_ranks) && comm_world_size() > 1;
}

/* ---- nodes ------------------------------------------------------------------ */

static void fail(int rc, const char *fmt, const char *a, int b, double c) {
  pthread_mutex_lock(&pp.mu);
  if (!pp.rc) {
    pp.rc = rc;
    snprintf(pp.err, sizeof pp.err, fmt, a, b, c);
  }
  pthread_mutex_unlock(&pp.mu);
}

/* fail, for a wait that gave up on rank peer: that rank becomes the suspect. */
static void fail_peer(const char *fmt, const char *a, int peer, double c) {
  pthread_mutex_lock(&pp.mu);
  if (pp.suspect < 0) pp.suspect = peer;
  pthread_mutex_unlock(&pp.mu);
  fail(CEDAR_EIO, fmt, a, peer, c);
}

void rt_pipe_set_suspect(int rank) {
  pthread_mutex_lock(&pp.mu);
  if (pp.suspect < 0) pp.suspect = rank;
  pthread_mutex_unlock(&pp.mu);
}

int rt_pipe_suspect(void) {
  pthread_mutex_lock(&pp.mu);
  int s = pp.suspect;
  pthread_mutex_unlock(&pp.mu);
  return s;
}

/* Wait for one message, or until dl seconds passed. */
static bool wait_done(struct comm_msg *s, double dl) {
  double until = comm_now() + dl;
  while (!atomic_load(&s->done)) {
    if (comm_now() > until) return false;
    nanosleep(&(struct timespec){0, 200000}, NULL);
  }
  return true;
}

/* A new message of n bytes to or from rank peer (copied from src when not NULL). */
static struct sent *new_msg(const void *src, size_t n, int peer) {
  struct sent *s = cedar_xcalloc(1, sizeof *s);
  s->peer = peer;
  s->buf = cedar_xmalloc(n ? n : 1);
  if (src) memcpy(s->buf, src, n);
  pthread_mutex_lock(&pp.mu);
  if (pp.n_sent == pp.cap_sent) {
    pp.cap_sent = pp.cap_sent ? 2 * pp.cap_sent : 64;
    pp.sent = cedar_xrealloc(pp.sent, sizeof(*pp.sent) * (size_t)pp.cap_sent);
  }
  pp.sent[pp.n_sent++] = s;
  pthread_mutex_unlock(&pp.mu);
  return s;
}

/* One tag per (graph, node): the low 20 bits the node, the rest the graph. */
static int tag_of(int k) { return ((pp.seq % 1024) << 20) | (k & 0xfffff); }

/* A KV transfer's entries [e0, e1) of source layer l (the copy's write). */
static void kv_range(const struct graph_node *nd, int64_t *e0, int64_t *e1) {
  *e0 = *e1 = 0;
  for (int u = 0; u < nd->n_use; u++)
    if (nd->use[u].data == nd->xfer_dst) *e0 = nd->use[u].e_w0, *e1 = nd->use[u].e_w1;
}

int rt_pipe_transfer_node(const struct rt_node_ctx *c) {
  const struct graph *g = c->g;
  const struct graph_node *nd = c->nd;
  int src = nd->xfer_src, dst = nd->xfer_dst;
  bool kv = g->data[src].kind == GRAPH_STATE;
  size_t bytes = (size_t)g->data[src].bytes;
  if (!pp.on) { /* one process plays every rank: its one request already holds a KV source's entries */
    if (!kv) memcpy(c->buf[dst], c->buf[src], bytes);
    return 0;
  }
  int64_t e0 = 0, e1 = 0;
  struct rt_kv_seq *seq = NULL;
  if (kv) { /* a KV source's entries for a reader stage: the same request's pages on both ranks */
    CEDAR_ASSERT(g->data[src].state == GRAPH_ST_KV && c->r);
    kv_range(nd, &e0, &e1);
    seq = &c->r->seq[g->data[src].layer];
    bytes = (size_t)(e1 - e0) * (size_t)seq->pool->entry_bytes;
  }
  int k = (int)(nd - g->node), from = g->data[src].home.rank, to = g->data[dst].home.rank;
  int nth = atomic_fetch_add(&pp.n_xfer, 1) + 1;
  if (pp.me == pp.die_rank && nth == pp.die_at) comm_die("a pipeline rank", nth); /* a test: dies mid-step */
  if (pp.me == from) { /* detached: the next chunk computes while it travels */
    struct sent *s = new_msg(kv ? NULL : c->buf[src], bytes, to);
    for (int64_t e = e0; kv && e < e1; e++)
      memcpy((uint8_t *)s->buf + (size_t)(e - e0) * seq->pool->entry_bytes, rt_kv_entry(seq, e),
             seq->pool->entry_bytes);
    pthread_mutex_lock(&pp.mu);
    struct rt_pipe_rank *rk = &pp.fig->rank[pp.me];
    rk->bytes_sent += (int64_t)bytes;
    rk->messages++;
    int64_t *tot = kv ? (g->flow != GRAPH_DECODE ? &rk->kv_prefill : &rk->kv_decode)
                      : (g->flow != GRAPH_DECODE ? &rk->act_prefill : &rk->act_decode);
    *tot += (int64_t)bytes;
    pthread_mutex_unlock(&pp.mu);
    const char *fault = getenv("CEDAR_PIPE_TEST_FAULT"); /* a test: this rank's first decode transfer never leaves */
    if (fault && !strcmp(fault, "hold") && g->flow == GRAPH_DECODE && !pp.held) {
      pp.held = true;
      atomic_store(&s->st.done, 1);
      return 0;
    }
    return comm_send(s->buf, bytes, to, tag_of(k), &s->st);
  }
  struct sent *m = new_msg(NULL, bytes, from);
  int rc = comm_recv(m->buf, bytes, from, tag_of(k), &m->st);
  if (rc) return rc;
  double dl = deadline_s();
  if (!wait_done(&m->st, dl)) {
    fail_peer("%s: nothing arrived from rank %d for %.0f s (CEDAR_PD_DEADLINE_S): that rank died or is stuck; "
              "this request fails", nd->name, from, dl);
    return CEDAR_EIO;
  }
  if (pp.trace) {
    pthread_mutex_lock(&pp.mu);
    if (k >= pp.cap_arrive) {
      int cap = k + 1 > 2 * pp.cap_arrive ? k + 1 : 2 * pp.cap_arrive;
      pp.arrive = cedar_xrealloc(pp.arrive, sizeof(double) * (size_t)cap);
      memset(pp.arrive + pp.cap_arrive, 0, sizeof(double) * (size_t)(cap - pp.cap_arrive));
      pp.cap_arrive = cap;
    }
    pp.arrive[k] = m->st.t_done;
    pthread_mutex_unlock(&pp.mu);
  }
  if (kv && seq->n_entries != e0) {
    fail(CEDAR_EINVAL, "%s: the entries do not follow the %d this rank holds (a KV copy grows in order); this "
         "request fails", nd->name, (int)seq->n_entries, 0.0);
    rc = CEDAR_EINVAL;
  } else if (kv && e1 > e0 && rt_kv_append(seq, m->buf, (int)(e1 - e0))) {
    fail(CEDAR_ENOMEM, "%s: this rank's KV page pool is exhausted (%d entries held); this request fails", nd->name,
         (int)seq->n_entries, 0.0);
    rc = CEDAR_ENOMEM;
  } else if (!kv) {
    memcpy(c->buf[dst], m->buf, bytes);
  }
  free(m->buf); /* the payload is no longer needed; the handle goes at comm_stop */
  m->buf = NULL;
  return rc;
}

/* ---- after a graph ------------------------------------------------------------ */

static int head_rank(const struct graph *g) {
  for (int k = g->n_node - 1; k >= 0; k--)
    if (g->node[k].op == GRAPH_HEAD) return g->node[k].place.rank;
  return 0;
}

/* Every message posted so far completed, within the deadline (the
 * deadline dl restarts at each completion); their payloads are freed. *peer:
 * the rank of the first that did not (when not NULL). */
static bool sends_done(int *peer, double dl) {
  for (int i = pp.first_open; i < pp.n_sent; i++) {
    if (!wait_done(&pp.sent[i]->st, dl)) {
      if (peer) *peer = pp.sent[i]->peer;
      return false;
    }
    free(pp.sent[i]->buf);
    pp.sent[i]->buf = NULL;
    pp.first_open = i + 1;
  }
  return true;
}

/* Free every message (after comm_stop let go of them). */
static void msgs_free(void) {
  for (int i = 0; i < pp.n_sent; i++) {
    free(pp.sent[i]->buf);
    free(pp.sent[i]);
  }
  free(pp.sent);
  pp.sent = NULL;
  pp.n_sent = pp.cap_sent = pp.first_open = 0;
}

/* Send / receive n bytes at buf between this rank and peer, waiting at
 * most dl seconds. */
static int xchg_dl(void *buf, size_t n, int peer, int tag, bool send, double dl) {
  struct sent *m = new_msg(send ? buf : NULL, n, peer);
  int rc = send ? comm_send(m->buf, n, peer, tag, &m->st) : comm_recv(m->buf, n, peer, tag, &m->st);
  if (rc) return rc;
  if (!wait_done(&m->st, dl)) {
    fail_peer("%s: no answer from rank %d for %.0f s (CEDAR_PD_DEADLINE_S): that rank died or is stuck; this "
              "request fails", send ? "sending the logits" : "waiting for the logits", peer, deadline_s());
    return CEDAR_EIO;
  }
  if (!send) memcpy(buf, m->buf, n);
  free(m->buf);
  m->buf = NULL;
  return 0;
}

static int xchg(void *buf, size_t n, int peer, int tag, bool send) { return xchg_dl(buf, n, peer, tag, send, deadline_s()); }

/* Every rank meets, through StarPU-MPI (no MPI call beside its progress
 * thread): each tells rank 0, rank 0 answers each; false when one does not
 * come within dl seconds. */
static bool meet_all(double dl) {
  char b = 1;
  int tag = tag_of(0xffffb);
  if (pp.me != 0) return !xchg_dl(&b, 1, 0, tag, true, dl) && !xchg_dl(&b, 1, 0, tag - 1, false, dl);
  for (int r = 1; r < pp.world; r++)
    if (xchg_dl(&b, 1, r, tag, false, dl)) return false;
  for (int r = 1; r < pp.world; r++)
    if (xchg_dl(&b, 1, r, tag - 1, true, dl)) return false;
  return true;
}

/* CLOCK_MONOTONIC microseconds minus struct rt_task_time's clock, now. */
static double clock_offset_us(void) { return 1e6 * comm_now() - rt_starpu_now_us(); }

/* The nodes' times of graph g to rank 0 (see rt_pipe_trace). */
static int trace_graph(const struct graph *g, const struct rt_task_time *times) {
  int n = g->n_node, W = pp.world;
  if (ptr_cap < n * 4 * W) {
    ptr_cap = n * 4 * W;
    ptr_rec = cedar_xrealloc(ptr_rec, sizeof(double) * (size_t)ptr_cap);
  }
  double off = clock_offset_us(), *mine = ptr_rec + (size_t)pp.me * n * 4;
  for (int k = 0; k < n; k++) {
    bool ran = graph_runs_on(g, &g->node[k], pp.me);
    double *x = mine + 4 * k;
    x[0] = ran ? times[k].worker : -1;
    x[1] = ran ? times[k].start_us + off : 0;
    x[2] = ran ? times[k].end_us + off : 0;
    x[3] = k < pp.cap_arrive && pp.arrive[k] > 0 ? 1e6 * pp.arrive[k] : 0;
  }
  int rc = 0, tag = tag_of(0xffffc);
  size_t bytes = sizeof(double) * 4 * (size_t)n;
  if (pp.me != 0) return xchg(mine, bytes, 0, tag, true);
  for (int r = 1; r < W && !rc; r++) rc = xchg(ptr_rec + (size_t)r * n * 4, bytes, r, tag, false);
  if (rc) return rc;
  for (int i = 0; i < n * W; i++) /* back to this process's task clock */
    for (int j = 1; j < 4; j++)
      if (ptr_rec[4 * i + j] != 0) ptr_rec[4 * i + j] -= off;
  ptr = (struct rt_pipe_trace){g, W, n, ptr_rec};
  return 0;
}

const struct rt_pipe_trace *rt_pipe_graph_trace(const struct graph *g) {
  return ptr.g && ptr.g == g && pp.me == 0 ? &ptr : NULL;
}

int rt_pipe_after_graph(const struct graph *g, struct rt_exec_out *out, const struct rt_exec_stats *st,
                        const struct rt_task_time *times, int rc, char *err, size_t err_len) {
  ptr.g = NULL;
  if (!pp.on) return rc;
  if (!rc && st) {
    double busy = 0;
    for (int op = 0; op < GRAPH_OP_COUNT; op++)
      if (op != GRAPH_TRANSFER) busy += st->op_seconds[op];
    struct rt_pipe_rank *rk = &pp.fig->rank[pp.me];
    /* st accumulates over the decode steps; the prefill is one graph */
    if (g->flow == GRAPH_DECODE)
      rk->decode_busy_s = busy, rk->decode_wall_s = st->seconds;
    else {
      rk->prefill_busy_s = busy, rk->prefill_wall_s = st->seconds;
      rk->prefill_t1 = comm_now();
      rk->prefill_t0 = rk->prefill_t1 - st->seconds;
    }
  }
  int peer = -1;
  if (!rc && !sends_done(&peer, deadline_s()))
    fail_peer("%s: a message to or from rank %d did not complete in %.0f s (CEDAR_PD_DEADLINE_S): that rank "
              "died or is stuck; this request fails", "the pipeline", peer, deadline_s());
  const int V = g->plan->model.vocab;
  int hr = head_rank(g), tag = tag_of(0xfffff);
  for (int r = 0; r < pp.world && !rc && !pp.rc; r++) {
    if (r == hr || (pp.me != hr && pp.me != r) || g->out_rows == 0) continue;
    bool send = pp.me == hr;
    if (out->logits) rc = xchg(out->logits, sizeof(float) * (size_t)g->out_rows * V, send ? r : hr, tag, send);
    if (!rc && out->pos) rc = xchg(out->pos, sizeof(int64_t) * (size_t)g->out_rows, send ? r : hr, tag - 1, send);
  }
  if (!rc && !pp.rc && pp.trace && times) rc = trace_graph(g, times);
  if (pp.cap_arrive) memset(pp.arrive, 0, sizeof(double) * (size_t)pp.cap_arrive); /* the next graph's */
  pp.seq++;
  if (pp.rc) {
    snprintf(err, err_len, "rank %d: %s", pp.me, pp.err);
    return pp.rc;
  }
  return rc;
}

/* ---- the request -------------------------------------------------------------- */

/* Rank 0 gathers every rank's figures (each within the deadline). */
static int gather_figures(void) {
  int rc = 0;
  if (pp.me != 0) return xchg(&pp.fig->rank[pp.me], sizeof pp.fig->rank[0], 0, tag_of(0xffffd), true);
  for (int r = 1; r < pp.world && r < RT_PIPE_MAX_RANKS && !rc; r++)
    rc = xchg(&pp.fig->rank[r], sizeof pp.fig->rank[0], r, tag_of(0xffffd), false);
  for (int r = 0; r < pp.world && r < RT_PIPE_MAX_RANKS && !rc; r++) { /* what every sender moved */
    struct rt_pipe_stats *f = pp.fig;
    f->act_bytes_prefill += f->rank[r].act_prefill;
    f->act_bytes_decode += f->rank[r].act_decode;
    f->kv_bytes_prefill += f->rank[r].kv_prefill;
    f->kv_bytes_decode += f->rank[r].kv_decode;
  }
  return rc;
}

/* CEDAR_PIPE_TEST_FAULT (tests/cli/pp_mpi.sh): hold (a rank's first
 * decode transfer never leaves) or die:R:K (rank R SIGKILLs itself as it
 * runs its K-th transfer). 0, or CEDAR_EINVAL naming the values. */
static int fault_parse(char *err, size_t err_len) {
  const char *f = getenv("CEDAR_PIPE_TEST_FAULT");
  pp.die_rank = pp.die_at = -1;
  if (!f || !strcmp(f, "hold")) return 0;
  int r, k, used = 0;
  if (sscanf(f, "die:%d:%d%n", &r, &k, &used) == 2 && !f[used] && r >= 0 && k >= 1) {
    pp.die_rank = r, pp.die_at = k;
    return 0;
  }
  snprintf(err, err_len, "CEDAR_PIPE_TEST_FAULT=%s: want hold or die:RANK:K (K >= 1)", f);
  return CEDAR_EINVAL;
}

int rt_pipe_open(const struct plan *p, const struct plan *ep_plan, const struct rt_gen_opts *o, int64_t n,
                 const struct rt_pipe_figs *figs, char *err, size_t err_len) {
  CEDAR_ASSERT_MSG(figs && figs->pipe && figs->ep, "rt_pipe_open needs the request's figures (pipeline.h)");
  rt_pipe_register(); /* this feature's node entries (backend.h) */
  if (fault_parse(err, err_len)) return CEDAR_EINVAL;
  struct rt_pipe_stats *f = figs->pipe;
  memset(f, 0, sizeof *f);
  f->ranks = plan_place_ranks(p);
  f->stages = p->serving.place.n_stages;
  int chunk = o->chunk > 0 ? o->chunk : p->serving.prefill_chunk;
  f->chunks = (int)((n + chunk - 1) / chunk);
  int rc = rt_ep_begin(ep_plan, o, rt_pipe_multi(p), figs->ep, err, err_len); /* routed experts on ranks (expert_par.h) */
  if (rc || !rt_pipe_multi(p)) return rc;
  if (o->cache) {
    snprintf(err, err_len, "layer stages on several ranks run without the prefix cache (each rank would cache only "
             "its layers); run without --cache");
    rt_ep_end();
    return CEDAR_EUNSUPPORTED;
  }
  if (comm_world_size() > RT_PIPE_MAX_RANKS) {
    snprintf(err, err_len, "layer stages run on at most %d ranks; mpirun gave %d", RT_PIPE_MAX_RANKS,
             comm_world_size());
    rt_ep_end();
    return CEDAR_EUNSUPPORTED;
  }
  /* every rank's engine up before any deadline counts (a slow start is not
   * a dead peer); a rank that never comes ends the job, bounded */
  if (!comm_meet(deadline_s())) {
    snprintf(err, err_len, "rank %d: the other ranks did not start the request within %.0f s (CEDAR_PD_DEADLINE_S): "
             "one died or is stuck; ending the job", comm_world_rank(), deadline_s());
    comm_abort(err);
    rt_ep_end();
    return CEDAR_EIO;
  }
  rc = comm_start(err, err_len);
  if (rc) {
    rt_ep_end();
    return rc;
  }
  f->mpi = true;
  pp.me = comm_world_rank();
  pp.world = comm_world_size();
  pp.seq = 0;
  pp.held = false;
  atomic_store(&pp.n_xfer, 0);
  pp.rc = 0;
  pp.err[0] = 0;
  pp.suspect = -1;
  pp.trace = o->on_graph && o->executor == RT_EXEC_STARPU;
  pp.fig = f; /* used only while pp.on */
  pp.on = true;
  return 0;
}

static int after_graph(void *user, const struct graph *g, struct rt_exec_out *out, const struct rt_exec_stats *st,
                       const struct rt_task_time *times, int rc, char *err, size_t err_len) {
  (void)user;
  return rt_pipe_after_graph(g, out, st, times, rc, err, err_len);
}

void rt_pipe_bind(struct rt_gen_opts *o) {
  if (!pp.on) return; /* one process plays every rank */
  o->one_rank = true;
  o->rank = pp.me;
  o->after_graph = after_graph;
  o->after_user = NULL;
}

int rt_pipe_xchg(void *buf, size_t n, int peer, int tag, bool send) { return xchg(buf, n, peer, tag_of(tag), send); }

int rt_pipe_xchg_dl(void *buf, size_t n, int peer, int tag, bool send, double dl) {
  return xchg_dl(buf, n, peer, tag_of(tag), send, dl);
}

int rt_pipe_gather(void *bufs, size_t n, int tag, double dl, bool *got, int suspect, bool failed,
                   int (*suspect_of)(const void *msg)) {
  struct sent **m = cedar_xcalloc((size_t)pp.world + 1, sizeof *m);
  for (int r = 1; r < pp.world; r++) { /* every receive posted at once: one deadline for all */
    got[r] = false;
    m[r] = new_msg(NULL, n, r);
    if (comm_recv(m[r]->buf, n, r, tag_of(tag), &m[r]->st)) m[r] = NULL;
  }
  double t0 = comm_now();
  bool *named = cedar_xcalloc((size_t)pp.world + 1, sizeof *named);
  for (;;) { /* until each rank has reported or is named dead (by this rank or by a report) */
    memset(named, 0, sizeof(bool) * (size_t)pp.world);
    if (suspect > 0 && suspect < pp.world) named[suspect] = true;
    bool any_failed = failed;
    for (int r = 1; r < pp.world; r++) {
      int s = m[r] && atomic_load(&m[r]->st.done) && suspect_of ? suspect_of(m[r]->buf) : -1;
      if (s > 0 && s < pp.world) named[s] = true;
      any_failed |= s != -1;
    }
    bool all = true;
    for (int r = 1; r < pp.world; r++) all &= (m[r] && atomic_load(&m[r]->st.done)) || named[r];
    /* one deadline when nothing failed (no live rank is held up by a dead peer), two otherwise */
    double waited = comm_now() - t0;
    if (all || waited > 2 * dl || (waited > dl && !any_failed)) break;
    nanosleep(&(struct timespec){0, 200000}, NULL);
  }
  free(named);
  int missing = 0;
  for (int r = 1; r < pp.world; r++) {
    got[r] = m[r] && atomic_load(&m[r]->st.done);
    if (got[r]) {
      memcpy((char *)bufs + (size_t)r * n, m[r]->buf, n);
      free(m[r]->buf);
      m[r]->buf = NULL;
    } else {
      missing++; /* still posted: rt_pipe_close ends the job (StarPU-MPI cannot cancel it) */
    }
  }
  free(m);
  return missing;
}

int rt_pipe_close(const struct plan *p, const struct rt_request *r, int rc, char *err, size_t err_len) {
  if (!pp.on) { /* one process: nothing was opened but the experts' figures */
    rt_ep_end();
    return rc;
  }
  if (!rc) { /* the entries of the sources this rank holds (not the copies it received for its readers) */
    struct rt_pipe_rank *k = &pp.fig->rank[pp.me];
    if (plan_has_stages(p)) {
      for (int l = 0; l < p->n_layers; l++) {
        const struct rt_kv_seq *s = &r->seq[l];
        if (!s->pool || p->serving.place.stage[plan_stage_of(p, l)].rank != pp.me) continue;
        k->kv_entries += s->n_entries;
        k->kv_entry_bytes += s->n_entries * (int64_t)s->pool->entry_bytes;
        k->kv_page_bytes += (int64_t)s->n_pages * (int64_t)rt_kv_page_bytes(s->pool);
      }
    } else { /* experts only: every rank holds the whole request's state (P/D: the decode home) */
      struct rt_state_bytes b;
      rt_request_bytes(r, &b);
      k->kv_entries = b.kv_entries;
      k->kv_entry_bytes = b.kv_entry_bytes;
      k->kv_page_bytes = b.kv_page_bytes;
    }
    rc = gather_figures();
    if (rc) snprintf(err, err_len, "rank %d: %s", pp.me, pp.err);
    if (!rc) rc = rt_ep_gather(err, err_len);
  }
  pp.on = false;
  pp.fig = NULL; /* the figures are the caller's from here */
  ptr.g = NULL; /* no later graph is this request's */
  /* The end: every message completed, then every rank meets within the
   * deadline before StarPU-MPI stops, because starpu_mpi_shutdown's barrier
   * (starpu_mpi_wait_for_all) waits for every rank without one: a rank that
   * died would hold the others there for ever (under orte_enable_recovery,
   * or before mpirun notices). A rank that failed waits two deadlines (a
   * peer waiting for its messages fails one deadline later). A message
   * still posted, or a rank that does not come, ends the job (MPI_Abort). */
  bool idle = sends_done(NULL, rc ? 1 : deadline_s()); /* failed: what is still posted stays so */
  double dl = rc ? 2 * deadline_s() : deadline_s();
  /* a rank known dead (rt_pipe_suspect) would only make the meeting wait its deadline */
  bool gone = rc && rt_pipe_suspect() >= 0;
  bool met = idle && !gone && meet_all(dl) && sends_done(NULL, dl);
  if (met) idle = comm_stop();
  if (!idle || !met) {
    char why[1200];
    snprintf(why, sizeof why, "%s%s", rc ? err : "",
             !idle ? (rc ? "; a pipeline message is still posted" : "a pipeline message is still posted")
             : gone ? "; a rank stopped answering, so StarPU-MPI cannot stop in order"
                    : (rc ? "; the other ranks did not end the request in time" : "the other ranks did not end the request within the deadline (CEDAR_PD_DEADLINE_S): one died or is stuck"));
    comm_abort(why);
    if (!rc) { /* (without MPI comm_abort returns) */
      snprintf(err, err_len, "%s", why);
      rc = CEDAR_EIO;
    }
  }
  msgs_free();
  rt_ep_end();
  free(pp.arrive);
  pp.arrive = NULL;
  pp.cap_arrive = 0;
  pp.trace = false;
  if (rc) return rc;
  return pp.me == 0 ? 0 : RT_GEN_ELSEWHERE;
}

int rt_pipe_generate(const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r, const int32_t *prompt,
                     int64_t n, const struct rt_gen_opts *o, const struct rt_pipe_figs *figs, struct rt_gen_result *res,
                     char *err, size_t err_len) {
  const struct plan *p = M->p;
  int rc = rt_pipe_open(p, p, o, n, figs, err, err_len);
  if (rc) return rc;
  struct rt_gen_opts ob = *o;
  rt_pipe_bind(&ob);
  rc = rt_generate(M, pools, r, prompt, n, &ob, res, err, err_len);
  return rt_pipe_close(p, r, rc, err, err_len);
}

void rt_pipe_register(void) {
  rt_backend_feature(GRAPH_DEV_CPU, GRAPH_TRANSFER, GRAPH_F_STAGE | GRAPH_F_EP, GRAPH_F_STAGE, rt_pipe_transfer_node);
}
