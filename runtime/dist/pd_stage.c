/* pd_stage.c: one request under mpirun with prefill (P) and decode (D) each
 * on ranks of its own: P/D stages ({layers: 0-13, prefill: 0, decode: 2})
 * and P/D experts ({prefill: [0, 2], decode: [1, 2]}); docs/placement.md,
 * "P/D with stages and experts". pd_run.c's contract (rt_pd_generate), built
 * from its parts and the pipeline's:
 *
 *   - every rank runs every graph in one order (the prefill graph, then each
 *     decode step) through the pipeline driver (rt_pipe_open / _close,
 *     rt_pipe_bind: this rank's nodes, then rt_pipe_after_graph: the logits reach every rank, so
 *     every rank samples the same ids from the same seed); the prefill
 *     graph is built from the prefill role's view of the plan
 *     (plan_role_view), the decode graphs from the decode role's, so each
 *     role's stages and expert shards are its own ranks;
 *   - the prefill graph's P->D TRANSFER nodes run on the P rank holding
 *     their layers and ship to the D rank holding them (pd.c), chunk by
 *     chunk, while the next chunk computes; each D rank posts its receives
 *     before the graph runs;
 *   - after the graph each P rank sends every D rank it fed a package
 *     record (its layers' lengths, rings, tails, the chain of its messages'
 *     checksums); each D rank applies its messages in graph order, checks
 *     each sender's record against what came from it (pd_ready_mask, over
 *     the layers both hold), then the ready barrier over its own layers on
 *     the merged record, and answers each sender; then all ranks agree on
 *     the outcome before the first decode step;
 *   - every wait has the deadline CEDAR_PD_DEADLINE_S: a dead or stuck peer
 *     fails the request on every rank (rt_pipe_close then ends the job if a
 *     message is still posted), never a hang.
 *
 * Rank 0 reports (the pipeline's rule): the D ranks' transfer figures are
 * summed there (into the caller's st), with the pipeline's and the
 * experts' (into the caller's figs).
 * Test: tests/cli/pdx_mpi.sh.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "runtime/comm/comm.h"
#include "base/check.h"
#include "runtime/dist/pd.h"
#include "runtime/dist/pd_internal.h"
#include "runtime/dist/pipeline.h"
#include "scheduler/plan_place.h"

/* Tags of rt_pipe_xchg (below the pipeline's own, 0xffff0 and up). */
enum { TAG_AGREE = 0xfff00, TAG_STATS = 0xfff10 };

struct agree_msg {
  int32_t rc, rank;
  int32_t suspect; /* the rank this rank's failure gave up on (rt_pipe_suspect), or -1 */
  char err[244];
};

/* How long a rank waits for rank 0's verdict beyond three deadlines: rank
 * 0 may reach agree one deadline late (itself waiting on a dead peer),
 * then gathers for at most two more (a live rank may be as late as it
 * was); 2 s covers the messages and scheduling of a loaded host.
 * docs/placement.md states the bound this gives. */
#define AGREE_MARGIN_S 2.0

static int suspect_of(const void *msg) {
  const struct agree_msg *x = msg;
  return !x->rc ? -1 : x->suspect >= 0 ? x->suspect : -2;
}

/* Rank 0's verdict: a rank that did not report is the cause (it died or is
 * stuck), named before any failure it caused on the others; else the
 * first failure in rank order. */
static void verdict(struct agree_msg *m, struct agree_msg *x, const bool *got, int W) {
  for (int r = 1; r < W; r++)
    if (!got[r]) {
      *m = (struct agree_msg){CEDAR_EIO, r, r, {0}};
      snprintf(m->err, sizeof m->err, "rank %d stopped answering: it did not report within %.0f s "
               "(CEDAR_PD_DEADLINE_S): it died or is stuck", r, pd_deadline_s());
      return;
    }
  for (int r = 1; r < W && !m->rc; r++) {
    x[r].err[sizeof x[r].err - 1] = 0;
    if (x[r].rc) *m = x[r];
  }
}

/* Every rank's outcome to rank 0, the verdict back to every rank: all go
 * on to decode, or all fail with the same message, which names the rank
 * that stopped answering (issue 28 row 11). Rank 0 gathers every report at
 * once and stops waiting as soon as each rank has reported or was named by
 * a failure (its own or a report's); else after one deadline when no rank
 * failed, two when one did (a live rank waiting on a dead peer reports one
 * deadline late). A rank that did not report is named in the verdict. The
 * others wait three deadlines and AGREE_MARGIN_S for it, and then know the
 * dead rank too (rt_pipe_close does not wait for it again). */
static int agree(int rc, char *err, size_t err_len) {
  int me = comm_world_rank(), W = comm_world_size();
  struct agree_msg m = {rc, me, rc ? rt_pipe_suspect() : -1, {0}};
  if (rc) snprintf(m.err, sizeof m.err, "%s", err);
  comm_test_fault("agree");
  if (me != 0) {
    /* A rank that already gave up on a peer waits one deadline and the
     * margin (rank 0 may be unable to send while a message to the dead
     * peer is stuck), then names that peer itself; else three deadlines. */
    int own = m.suspect;
    double dl = (own >= 0 ? 1 : 3) * pd_deadline_s() + AGREE_MARGIN_S;
    if (rt_pipe_xchg_dl(&m, sizeof m, 0, TAG_AGREE, true, dl) ||
        rt_pipe_xchg_dl(&m, sizeof m, 0, TAG_AGREE + 1, false, dl)) {
      if (own >= 0)
        snprintf(err, err_len, "rank %d: its wait gave up on rank %d after %.0f s (CEDAR_PD_DEADLINE_S): that rank "
                 "died or is stuck; rank 0 sent no verdict within %.0f s more; this request fails", me, own,
                 pd_deadline_s(), dl);
      else
        snprintf(err, err_len, "rank %d: rank 0 did not answer within %.0f s (3 x CEDAR_PD_DEADLINE_S + %.0f): rank "
                 "0 died or is stuck; this request fails", me, dl, AGREE_MARGIN_S);
      return CEDAR_EIO;
    }
    char ack = 1; /* a failed verdict: rank 0 ends the job next, and waits for this before it does */
    if (m.rc) rt_pipe_xchg(&ack, 1, 0, TAG_AGREE + 2, true);
  } else {
    struct agree_msg *x = cedar_xcalloc((size_t)W, sizeof *x);
    bool *got = cedar_xcalloc((size_t)W, sizeof *got);
    rt_pipe_gather(x, sizeof *x, TAG_AGREE, pd_deadline_s(), got, m.suspect, m.rc != 0, suspect_of);
    verdict(&m, x, got, W); /* m: rank 0's own outcome until a report says worse */
    for (int r = 1; r < W; r++) /* not to a rank that did not report: the send would stay posted */
      if (got[r]) rt_pipe_xchg(&m, sizeof m, r, TAG_AGREE + 1, true);
    /* A failed verdict is followed by the end of the job (MPI_Abort when a
     * message is still posted), which can drop a verdict still in flight:
     * each rank that reported acknowledges it first. */
    char ack;
    for (int r = 1; r < W && m.rc; r++)
      if (got[r]) rt_pipe_xchg(&ack, 1, r, TAG_AGREE + 2, false);
    free(x);
    free(got);
  }
  m.err[sizeof m.err - 1] = 0;
  if (m.rc && m.suspect >= 0 && m.suspect != me) rt_pipe_set_suspect(m.suspect); /* rt_pipe_close: no meeting */
  if (m.rc && m.rank != me) snprintf(err, err_len, "rank %d failed the request: %s", m.rank, m.err);
  return m.rc;
}

/* The D ranks' transfer figures summed on rank 0. */
static int gather_stats(struct rt_pd_stats *st) {
  int me = comm_world_rank(), W = comm_world_size();
  if (me != 0) return rt_pipe_xchg(st, sizeof *st, 0, TAG_STATS, true);
  for (int r = 1; r < W; r++) {
    struct rt_pd_stats x;
    int rc = rt_pipe_xchg(&x, sizeof x, r, TAG_STATS, false);
    if (rc) return rc;
    for (int c = 0; c < RT_PD_CLASS_COUNT; c++) st->bytes[c] += x.bytes[c];
    st->messages += x.messages;
    st->kv_bytes_before_end += x.kv_bytes_before_end;
    if (x.transfer_s > st->transfer_s) st->transfer_s = x.transfer_s;
    if (x.handoff_s > st->handoff_s) st->handoff_s = x.handoff_s;
    if (x.ready_s > st->ready_s) st->ready_s = x.ready_s;
  }
  return 0;
}

struct stage_run {
  struct graph g;
  int W, me;
  int *src, *dst;            /* (n_node) a P->D transfer's sending and receiving rank; -1 other nodes */
  bool *feeds, *fed_by;      /* (W) this rank sends to / receives from rank r */
  struct pd_link L;
  struct rt_pd_meta *rec;    /* (W) P: the record to D rank r; D: the record from P rank r */
  struct pd_ack *ack;        /* (W) P: D rank r's answer; D: the answer to P rank r */
  struct rt_pd_rx *rx;       /* (W) D: what came from P rank r */
  int *idx;
};

/* After pd_wait_all gave up: the peer of the first message among idx that
 * did not complete becomes this request's suspect (rt_pipe_set_suspect),
 * so agree can name the rank that stopped answering. */
static void suspect_first_missing(const struct stage_run *S, int n_idx) {
  const int n = S->g.n_node;
  for (int i = 0; i < n_idx; i++) {
    int k = S->idx[i];
    if (atomic_load(&S->L.ms[k].done)) continue;
    int peer = k < n ? (S->src[k] == S->me ? S->dst[k] : S->src[k]) : k < n + S->W ? k - n : k - n - S->W;
    if (peer >= 0 && peer != S->me) rt_pipe_set_suspect(peer);
    return;
  }
}

/* P rank: the record for D rank d: rp's state, the messages sent to d and
 * the chain of their checksums in graph order. */
static void record_for(struct stage_run *S, struct rt_request *rp, int64_t n, int32_t y1, uint64_t rng, int d,
                       const struct rt_exec_stats *ps, double t0, double t_end) {
  struct rt_pd_meta *m = &S->rec[d];
  pd_meta_fill(m, rp, n, y1, rng);
  for (int k = 0; k < S->g.n_node; k++) {
    if (S->src[k] != S->me || S->dst[k] != d) continue;
    struct msg_hdr h;
    memcpy(&h, S->L.buf[k], sizeof h);
    m->chain = XXH3_64bits_withSeed(&h.sum, 8, m->chain);
    m->n_messages++;
  }
  m->prefill = *ps;
  m->out_rows = S->g.out_rows;
  m->t_start = t0;
  m->t_end = m->t_first_send = t_end;
  for (int k = 0; k < S->g.n_node; k++) /* the first message posted to d */
    if (S->src[k] == S->me && S->dst[k] == d && S->L.ms[k].t_post > 0 && S->L.ms[k].t_post < m->t_first_send)
      m->t_first_send = S->L.ms[k].t_post;
  m->prefill_s = t_end - t0;
  m->replay = S->g.replay;
  pd_meta_seal(m);
}

/* D rank: every message and record within the deadline, applied and
 * checked (each sender's record on the layers it holds, then the barrier
 * over this rank's layers on the merged record). */
static int d_side(struct stage_run *S, const struct plan *p, const struct plan *vd, struct rt_request *r, int32_t y1,
                  uint64_t rng, struct rt_pd_stats *st, char *err, size_t err_len) {
  const struct graph *g = &S->g;
  int n_idx = 0;
  for (int k = 0; k < g->n_node; k++)
    if (S->dst[k] == S->me) S->idx[n_idx++] = k;
  for (int s = 0; s < S->W; s++)
    if (S->fed_by[s]) S->idx[n_idx++] = g->n_node + s;
  struct rt_pd_rx all = {0};
  double dl = pd_deadline_s();
  if (!pd_wait_all(g, S->L.ms, S->idx, n_idx, dl, &all, 0)) {
    suspect_first_missing(S, n_idx);
    snprintf(err, err_len, "rank %d: the P->D transfer stalled: no message for %.0f s (CEDAR_PD_DEADLINE_S), first "
             "missing: %s; this request is dropped", S->me, dl, all.first_missing);
    return CEDAR_EIO;
  }
  int rc = 0;
  for (int k = 0; k < g->n_node && !rc; k++) {
    if (S->dst[k] != S->me) continue;
    struct rt_pd_rx *x = &S->rx[S->src[k]];
    x->expected++, x->arrived++;
    rc = pd_apply(g, k, S->L.buf[k], pd_msg_bytes(g, &g->node[k], r), r, st, x, err, err_len);
    if (S->L.ms[k].t_done > st->transfer_s) st->transfer_s = S->L.ms[k].t_done; /* the last arrival, for now */
    st->messages++;
  }
  if (rc) return rc;
  bool mine[PLAN_MAX_LAYERS], theirs[PLAN_MAX_LAYERS];
  int from[PLAN_MAX_LAYERS]; /* the P rank of each of this rank's layers */
  for (int l = 0; l < p->n_layers; l++) {
    bool st_ = plan_has_stages(p);
    int d = st_ ? vd->serving.place.stage[plan_stage_of(p, l)].rank : p->serving.decode_rank;
    from[l] = st_ ? p->serving.place.stage[plan_stage_of(p, l)].rank : p->serving.prefill_rank;
    mine[l] = d == S->me;
  }
  int first = -1;
  double t_end = 0, t_first = 0;
  for (int s = 0; s < S->W && !rc; s++) {
    if (!S->fed_by[s]) continue;
    if (first < 0) first = s;
    for (int l = 0; l < p->n_layers; l++) theirs[l] = mine[l] && from[l] == s;
    r->n_pos = g->n_prompt; /* the positions this request's prefill processed: condition 1 checks the record's */
    rc = pd_ready_mask(p, &S->rec[s], r, &S->rx[s], theirs, false, err, err_len);
    if (!rc && (S->rec[s].y1 != y1 || S->rec[s].rng != rng)) { /* every sender sampled what this rank did */
      snprintf(err, err_len, "ready barrier: D refuses to decode: condition 4 (sampled-but-unconsumed token): P "
               "rank %d sampled y1 = %d, this rank %d (or their sampler states differ)", s, S->rec[s].y1, y1);
      rc = CEDAR_EINVAL;
    }
    if (S->rec[s].t_end > t_end) t_end = S->rec[s].t_end;
    if (t_first == 0 || S->rec[s].t_first_send < t_first) t_first = S->rec[s].t_first_send;
  }
  if (rc) return rc;
  if (first < 0) {
    snprintf(err, err_len, "rank %d holds decode layers but no prefill rank feeds it", S->me);
    return CEDAR_EINVAL;
  }
  struct rt_pd_meta m = S->rec[first]; /* the model-wide fields (every sender's agree: one prompt, one sampler) */
  for (int l = 0; l < p->n_layers; l++)
    if (mine[l] && S->fed_by[from[l]]) {
      const struct rt_pd_meta *x = &S->rec[from[l]];
      m.n_entries[l] = x->n_entries[l], m.entry_bytes[l] = x->entry_bytes[l], m.ring_end[l] = x->ring_end[l];
      m.tail_count[l] = x->tail_count[l], m.tail_pos0[l] = x->tail_pos0[l];
    }
  struct rt_pd_rx merged = {0}; /* each sender's chain is checked above; the merged record carries the count */
  m.n_messages = 0;
  m.chain = 0;
  for (int s = 0; s < S->W; s++) merged.expected += S->rx[s].expected, merged.arrived += S->rx[s].arrived,
                                  merged.applied += S->rx[s].applied, m.n_messages += S->rx[s].applied;
  pd_meta_seal(&m);
  r->n_pos = g->n_prompt;
  r->pending = y1; /* this rank's own sample from the same logits: condition 4 checks P's against it */
  double t_r = comm_now();
  rc = pd_ready_mask(p, &m, r, &merged, mine, true, err, err_len);
  double t_ready = comm_now();
  st->ready_s = t_ready - t_r;
  st->handoff_s = t_ready > t_end ? t_ready - t_end : 0;
  st->transfer_s = st->transfer_s > t_first ? st->transfer_s - t_first : 0;
  for (int k = 0; k < g->n_node; k++) /* KV bytes that arrived before the prefill ended */
    if (S->dst[k] == S->me && g->data[g->node[k].xfer_src].state == GRAPH_ST_KV && S->L.ms[k].t_done <= t_end)
      st->kv_bytes_before_end += pd_payload_bytes(g, &g->node[k], r);
  for (int s = 0; s < S->W; s++) st->bytes[RT_PD_META] += S->fed_by[s] ? (int64_t)sizeof(struct rt_pd_meta) : 0;
  st->messages += 2 * (int64_t)(st->messages > 0); /* a record and an answer (as pd_run.c counts them) */
  return rc;
}

/* The answers: D ranks to each sender, P ranks from each D rank fed; all
 * within the deadline. P refuses on a refusal. */
static int answers(struct stage_run *S, bool is_p, bool is_d, int rc, char *err, size_t err_len) {
  int tag = pd_tag(&S->g, PD_MSG_ANSWER), n_idx = 0;
  for (int q = 0; q < S->W; q++) {
    struct comm_msg *ms = &S->L.ms[S->g.n_node + S->W + q];
    if (is_d && S->fed_by[q]) {
      struct pd_ack *a = &S->ack[q];
      a->magic = PD_ACK_MAGIC;
      a->status = rc;
      if (rc) snprintf(a->msg, sizeof a->msg, "%s", err);
      a->sum = XXH3_64bits(a, offsetof(struct pd_ack, sum));
      if (comm_send(a, sizeof *a, q, tag, ms)) return CEDAR_EIO;
      S->idx[n_idx++] = S->g.n_node + S->W + q;
    } else if (is_p && S->feeds[q]) {
      if (comm_recv(&S->ack[q], sizeof S->ack[q], q, tag, ms)) return CEDAR_EIO;
      S->idx[n_idx++] = S->g.n_node + S->W + q;
    }
  }
  for (int k = 0; is_p && k < S->g.n_node; k++) /* and P's own messages and records left */
    if (S->src[k] == S->me) S->idx[n_idx++] = k;
  for (int q = 0; is_p && q < S->W; q++)
    if (S->feeds[q]) S->idx[n_idx++] = S->g.n_node + q;
  struct rt_pd_rx w = {0};
  if (!pd_wait_all(&S->g, S->L.ms, S->idx, n_idx, pd_deadline_s(), &w, 0)) {
    suspect_first_missing(S, n_idx);
    if (rc) return rc;
    snprintf(err, err_len, "rank %d: the package's messages or answers did not complete within %.0f s "
             "(CEDAR_PD_DEADLINE_S), first missing: %s; this request fails", S->me, pd_deadline_s(), w.first_missing);
    return CEDAR_EIO;
  }
  for (int q = 0; is_p && !rc && q < S->W; q++) {
    if (!S->feeds[q]) continue;
    struct pd_ack *a = &S->ack[q];
    if (a->magic != PD_ACK_MAGIC || a->sum != XXH3_64bits(a, offsetof(struct pd_ack, sum))) {
      snprintf(err, err_len, "decode rank %d's answer fails its checksum", q);
      rc = CEDAR_EIO;
    } else if (a->status) {
      a->msg[sizeof a->msg - 1] = 0;
      snprintf(err, err_len, "decode rank %d refused the package: %s", q, a->msg);
      rc = CEDAR_EIO;
    }
  }
  return rc;
}

/* The message table of the prefill graph S->g: each P->D transfer's
 * sending and receiving rank, which peers this rank feeds and is fed by,
 * the buffers and completions (the transfers, then a record and an answer
 * per peer). CEDAR_EUNSUPPORTED when a transfer names a rank mpirun did
 * not give (the placement check refuses that earlier). */
static int stage_table(struct stage_run *S, struct rt_pd_stats *st, char *err, size_t err_len) {
  const struct graph *g = &S->g;
  int N = g->n_node, W = S->W;
  S->src = cedar_xmalloc(sizeof(int) * (size_t)N);
  S->dst = cedar_xmalloc(sizeof(int) * (size_t)N);
  S->feeds = cedar_xcalloc((size_t)W, sizeof(bool));
  S->fed_by = cedar_xcalloc((size_t)W, sizeof(bool));
  S->rec = cedar_xcalloc((size_t)W, sizeof(*S->rec));
  S->ack = cedar_xcalloc((size_t)W, sizeof(*S->ack));
  S->rx = cedar_xcalloc((size_t)W, sizeof(*S->rx));
  S->idx = cedar_xmalloc(sizeof(int) * ((size_t)N + 2 * (size_t)W + 1));
  S->L.buf = cedar_xcalloc((size_t)N, sizeof(uint8_t *));
  S->L.ms = cedar_xcalloc((size_t)N + 2 * (size_t)W, sizeof(*S->L.ms)); /* + records, answers: one per peer */
  S->L.role = RT_PD_PREFILL;
  S->L.g = g;
  S->L.st = st;
  S->L.last_kv = -1;
  for (int k = 0; k < N; k++) {
    const struct graph_node *nd = &g->node[k];
    S->src[k] = S->dst[k] = -1;
    if (nd->op != GRAPH_TRANSFER || (nd->flags & GRAPH_F_STAGE)) continue;
    S->src[k] = nd->place.rank;
    S->dst[k] = g->data[nd->xfer_dst].home.rank;
    if (S->src[k] >= W || S->dst[k] >= W) {
      snprintf(err, err_len, "%s runs between ranks %d and %d, but mpirun gave %d", nd->name, S->src[k], S->dst[k], W);
      return CEDAR_EUNSUPPORTED;
    }
    if (S->src[k] == S->me) S->feeds[S->dst[k]] = true;
    if (S->dst[k] == S->me) S->fed_by[S->src[k]] = true;
  }
  return 0;
}

/* D: every receive of this rank posted before P starts sending (its
 * transfers' payloads into S->L.buf, sized from r; each feeder's record). */
static int post_receives(struct stage_run *S, const struct rt_request *r) {
  const struct graph *g = &S->g;
  int N = g->n_node, rc = 0;
  for (int k = 0; k < N && !rc; k++)
    if (S->dst[k] == S->me) {
      int64_t len = pd_msg_bytes(g, &g->node[k], r);
      S->L.buf[k] = cedar_xmalloc((size_t)len);
      rc = comm_recv(S->L.buf[k], (size_t)len, S->src[k], k + 1, &S->L.ms[k]);
    }
  for (int q = 0; q < S->W && !rc; q++)
    if (S->fed_by[q]) rc = comm_recv(&S->rec[q], sizeof S->rec[q], q, pd_tag(g, PD_MSG_RECORD), &S->L.ms[N + q]);
  return rc;
}

/* The request's transfer figures once it decoded: the plan's expectation,
 * every rank's bytes summed on rank 0, and how much KV left before the
 * prefill ended. */
static int final_figures(const struct stage_run *S, const struct plan *p, int64_t n, double prefill_s,
                         struct rt_pd_stats *st, char *err, size_t err_len) {
  rt_pd_expected_bytes(p, n, S->g.replay, st->expected);
  st->prefill_s = prefill_s;
  st->overlap = 1;
  int rc = gather_stats(st);
  if (rc) snprintf(err, err_len, "rank %d: the transfer figures did not reach rank 0", S->me);
  int64_t kv = st->bytes[RT_PD_KV]; /* rank 0's sums (the others' are their own) */
  st->overlap = kv ? (double)st->kv_bytes_before_end / (double)kv : 1;
  return rc;
}

static void stage_free(struct stage_run *S) {
  for (int k = 0; S->L.buf && k < S->g.n_node; k++) free(S->L.buf[k]);
  free(S->L.buf);
  free(S->L.ms);
  pthread_mutex_destroy(&S->L.mu);
  free(S->src), free(S->dst), free(S->feeds), free(S->fed_by), free(S->rec), free(S->ack), free(S->rx), free(S->idx);
  graph_free(&S->g);
  free(S);
}

int pd_stage_generate(const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r, const int32_t *prompt,
                      int64_t n, const struct rt_gen_opts *o, struct rt_gen_result *res, struct rt_pd_stats *st,
                      const struct rt_pipe_figs *figs, char *err, size_t err_len) {
  const struct plan *p = M->p;
  struct rt_gen_opts ob;
  const int V = p->model.vocab;
  struct plan *vp = cedar_xmalloc(sizeof *vp), *vd = cedar_xmalloc(sizeof *vd);
  plan_role_view(p, false, vp);
  plan_role_view(p, true, vd);
  struct rt_model MP = *M, MD = *M;
  MP.p = vp, MD.p = vd;
  struct stage_run *S = cedar_xcalloc(1, sizeof *S);
  pthread_mutex_init(&S->L.mu, NULL);
  S->me = comm_world_rank();
  S->W = comm_world_size();
  st->mpi = true;
  struct rt_kv_pool *pools_p = cedar_xcalloc(PLAN_MAX_LAYERS, sizeof(*pools_p)); /* P's request: pools of its own */
  struct rt_request rp = {0};
  float *logits = NULL;
  int64_t *pos = NULL;
  bool opened = false, pools_on = false;
  struct rt_pipe_stats own_pipe; /* the caller keeps no figures (figs NULL): this request's own */
  struct rt_ep_stats own_ep;
  struct rt_pipe_figs fg = {figs && figs->pipe ? figs->pipe : &own_pipe, figs && figs->ep ? figs->ep : &own_ep,
                            NULL};
  struct graph_opts go = {.chunk = o->chunk, .replay = o->replay, .all_logits = o->all_logits};
  int rc = graph_build_prefill(&S->g, vp, n, &go, err, err_len);
  if (rc) goto out;
  const struct graph *g = &S->g;
  int N = g->n_node, W = S->W;
  rc = stage_table(S, st, err, err_len);
  if (rc) goto out;
  bool is_p = false, is_d = false;
  for (int q = 0; q < W; q++) is_p |= S->feeds[q], is_d |= S->fed_by[q];
  rc = rt_pipe_open(p, vp->serving.place.n_ep_ranks ? vp : vd, o, n, &fg, err, err_len);
  if (rc) goto out;
  opened = true;
  ob = *o; /* this rank's nodes, and the ranks' meeting after each graph */
  rt_pipe_bind(&ob);
  o = &ob;
  double t0 = 0, t_end = 0;
  uint64_t rng = o->seed;
  int32_t y1 = -1;
  struct rt_pd_rx prx = {0};
  /* the requests name the plan itself (r outlives the views: the caller frees it) */
  rc = rt_request_init(r, 0, p, pools, n + o->max_new); /* D's request; the other ranks follow its ids */
  if (!rc) rc = rt_kv_pools_init(pools_p, p, err, err_len);
  pools_on = !rc;
  if (!rc) rc = rt_request_init(&rp, 0, p, pools_p, n + 1);
  if (rc) {
    snprintf(err, err_len, "out of memory for a request of %lld tokens", (long long)(n + o->max_new));
    goto decided;
  }
  for (int64_t i = 0; i < n; i++) {
    rt_request_push_token(&rp, prompt[i]);
    if (!is_d) rt_request_push_token(r, prompt[i]); /* a D rank gets the history in the package */
  }
  rc = post_receives(S, r);
  if (rc) {
    snprintf(err, err_len, "posting the receives through StarPU-MPI failed");
    goto decided;
  }
  /* the prefill: P's stages and shards compute, the transfers ship */
  logits = cedar_xmalloc(sizeof(float) * (size_t)(g->out_rows ? g->out_rows : 1) * V);
  pos = cedar_xmalloc(sizeof(int64_t) * (size_t)(g->out_rows ? g->out_rows : 1));
  S->L.rp = &rp;
  S->L.rx = &prx;
  pd_cur = &S->L;
  t0 = comm_now();
  struct rt_exec_out out = {.logits = logits, .pos = pos};
  rc = rt_gen_run_graph(g, &MP, &rp, &out, &res->prefill, o, NULL, true, NULL, err, err_len);
  t_end = comm_now();
  pd_cur = NULL;
  if (!rc && S->L.rc) {
    rc = S->L.rc;
    snprintf(err, err_len, "%s", S->L.err);
  }
  if (!rc) { /* every rank has the logits (rt_pipe_after_graph): each samples y1, the same */
    rp.n_pos = n;
    rc = pd_sample(o, &rp, logits + (size_t)(g->out_rows - 1) * V, n - 1, &rng, &y1, err, err_len);
  }
  for (int q = 0; q < W && !rc && is_p; q++)
    if (S->feeds[q]) {
      record_for(S, &rp, n, y1, rng, q, &res->prefill, t0, t_end);
      rc = comm_send(&S->rec[q], sizeof S->rec[q], q, pd_tag(&S->g, PD_MSG_RECORD), &S->L.ms[N + q]);
    }
  if (!rc && is_d) rc = d_side(S, p, vd, r, y1, rng, st, err, err_len);
  if (is_p || is_d) rc = answers(S, is_p, is_d, rc, err, err_len);
decided:
  rc = agree(rc, err, err_len);
  if (!rc) {
    rt_request_free(&rp); /* D holds the state now */
    res->prefill_nodes = N;
    for (int k = 0; k < N; k++) res->prefill_edges += g->node[k].n_dep;
    res->replay = g->replay;
    res->prefill_rows = g->out_rows;
    res->prefill_logits = logits;
    res->prefill_pos = pos;
    logits = NULL, pos = NULL;
    res->ttft_s = t_end - t0;
    if (!is_d) r->n_pos = n, r->pending = y1;
    rc = pd_decode(&MD, o, r, rng, res, err, err_len);
  }
  if (!rc) rc = final_figures(S, p, n, t_end - t0, st, err, err_len);
out:
  if (opened) rc = rt_pipe_close(vd, r, rc, err, err_len);
  if (rp.plan) rt_request_free(&rp);
  if (pools_on) rt_kv_pools_free(pools_p, p->n_layers);
  free(pools_p);
  stage_free(S);
  free(logits);
  free(pos);
  free(vp);
  free(vd);
  return rc;
}
