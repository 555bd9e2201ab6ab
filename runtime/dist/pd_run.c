/* pd_run.c: one request across the prefill and decode roles (pd.h:
 * rt_pd_generate): in one process, or P and D on two ranks through
 * StarPU-MPI (runtime/comm/comm_mpi.c), with the deadline, the figures and the test
 * faults. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "runtime/comm/comm.h"
#include "base/check.h"
#include "ops/sample.h"
#include "runtime/dist/pd.h"
#include "runtime/dist/pd_internal.h"
#include "runtime/dist/pipeline.h"
#include "scheduler/plan_place.h"

/* ---- the driver ---------------------------------------------------------- */

/* receive's "P went quiet past the deadline" (never leaves this file). */
#define PD_STALLED (-100)

int rt_pd_deadline_check(char *err, size_t err_len) { return comm_deadline_check(err, err_len); }

double pd_deadline_s(void) { return comm_deadline_s(); }

double rt_pd_deadline_s(void) { return pd_deadline_s(); }

#define deadline_s pd_deadline_s

/* ---- P's part of a multi-rank trace (rt_pd_last_trace) -------------------- */

void rt_pd_trace_free(struct rt_pd_trace *t) {
  if (t->g) graph_free((struct graph *)t->g);
  free((void *)t->g);
  free((void *)t->p_times);
  free((void *)t->arrive_us);
  free((void *)t->msg_bytes);
  memset(t, 0, sizeof *t);
}

/* CLOCK_MONOTONIC microseconds minus rt_task_time's clock, now. */
static double clock_offset_us(void) { return 1e6 * comm_now() - rt_starpu_now_us(); }

/* Wait until every message in ms[idx[..]] completed, or until none has
 * completed for dl seconds (the deadline restarts at every arrival: a long
 * prefill streams its messages, a dead or stuck peer stops them). */
bool pd_wait_all(const struct graph *g, struct comm_msg *ms, const int *idx, int n_idx, double dl,
                 struct rt_pd_rx *rx, int die_at) {
  double until = comm_now() + dl;
  int seen = 0;
  for (;;) {
    int done = 0, miss = -1;
    for (int i = 0; i < n_idx; i++) {
      if (atomic_load(&ms[idx[i]].done))
        done++;
      else if (miss < 0)
        miss = idx[i];
    }
    if (rx) rx->arrived = done;
    if (die_at > 0 && done >= die_at) comm_die("D", done); /* a test: D dies mid-package */
    if (done == n_idx) return true;
    if (done > seen) {
      seen = done;
      until = comm_now() + dl;
    }
    if (comm_now() > until) {
      static const char *const extra[] = {"the record", "the prefill logits", "D's acknowledgment",
                                          "P's node times"};
      if (rx && miss >= 0)
        snprintf(rx->first_missing, sizeof rx->first_missing, "%s",
                 miss < g->n_node ? g->node[miss].name : miss - g->n_node < 4 ? extra[miss - g->n_node]
                                                                   : "a package record or answer");
      return false;
    }
    nanosleep(&(struct timespec){0, 500000}, NULL);
  }
}

struct run {
  const struct rt_model *M;
  const struct rt_model *MP, *MD; /* the prefill and decode roles' views (plan_role_view; else M) */
  struct rt_model mp, md;         /* P/D with stages or experts in one process: the views' models */
  struct plan *vp, *vd;
  const struct rt_gen_opts *o;
  struct rt_pipe_figs figs;       /* where the stages' and experts' figures go (the caller's, or own_*) */
  struct rt_pipe_stats own_pipe;
  struct rt_ep_stats own_ep;
  struct graph g;
  int64_t n;
  struct pd_link L;
  struct rt_pd_meta m;
  struct rt_pd_rx rx;
  float *logits;
  int64_t *pos;
  int *xfer;       /* transfer node indices (their messages' slots; the others': pd_slot) */
  int n_xfer;
  double t0;
  uint64_t rng;                   /* D's sampler state */
  bool replay_d;                  /* serving.placement.replay: decode */
  struct rt_exec_stats dstats;    /* D's replay graph */
  int d_nodes, d_edges;
  int64_t d_rows;
  double ttft_d;                  /* TTFT when D delivers y1 */
  struct pd_ack ack;              /* D's answer (P receives, D sends) */
  bool trace;                     /* under mpirun with a trace: P sends its node times */
  struct rt_task_time *ptimes;    /* P: (n_node) its nodes' times */
  double *tmsg;                   /* (3 n_node): worker, start, end in CLOCK_MONOTONIC microseconds */
  int64_t *mbytes;                /* D: (n_node) each transfer message's bytes */
  bool acked;                     /* D: the answer went out */
  bool mpi_on;                    /* StarPU-MPI started for this request */
};

/* KV pages the pools hold for any request. */
static int64_t pages_in_use(const struct plan *p, struct rt_kv_pool *pools) {
  int64_t n = 0;
  for (int l = 0; l < p->n_layers; l++) n += pools[l].pages_in_use;
  return n;
}

/* Free request r on pools and say so after err's message: the pages it
 * returned and what the pools still hold. */
static void free_and_say(const struct plan *p, struct rt_kv_pool *pools, struct rt_request *r, const char *who,
                         char *err, size_t err_len) {
  int64_t before = pages_in_use(p, pools);
  rt_request_free(r);
  int64_t after = pages_in_use(p, pools);
  size_t n = strlen(err);
  if (n + 1 < err_len)
    snprintf(err + n, err_len - n, "; %s freed the request: %lld KV pages returned, %lld still in use", who,
             (long long)(before - after), (long long)after);
}

/* D under mpirun: tell P whether the package was accepted (rc, err), wait
 * for that to leave within the deadline, and stop StarPU-MPI. A message
 * still posted then (P gone) frees r and ends the job. */
static void d_answer(struct run *R, struct rt_kv_pool *pools, struct rt_request *r, int rc, const char *err) {
  if (R->acked) return;
  R->acked = true;
  struct pd_ack *a = &R->ack;
  memset(a, 0, sizeof *a);
  a->magic = PD_ACK_MAGIC;
  a->status = rc;
  if (rc) snprintf(a->msg, sizeof a->msg, "%s", err);
  a->sum = XXH3_64bits(a, offsetof(struct pd_ack, sum));
  int k = pd_slot(&R->g, PD_MSG_ANSWER);
  bool ok = !comm_send(a, sizeof *a, R->M->p->serving.prefill_rank, pd_tag(&R->g, PD_MSG_ANSWER), &R->L.ms[k]) &&
            pd_wait_all(&R->g, R->L.ms, &k, 1, deadline_s(), NULL, 0);
  if (!comm_stop() || !ok) {
    char why[512];
    snprintf(why, sizeof why, "%s", rc ? err : "D's acknowledgment did not leave within the deadline");
    if (r->plan) free_and_say(R->M->p, pools, r, "D", why, sizeof why);
    comm_abort(why);
  }
}

static void fill_result(struct run *R, struct rt_gen_result *res) {
  res->prefill = R->m.prefill;
  res->prefill_nodes = R->m.prefill_nodes + R->d_nodes;
  res->prefill_edges = R->m.prefill_edges + R->d_edges;
  res->replay = R->m.replay;
  res->prefill_rows = R->replay_d ? R->d_rows : R->m.out_rows;
  if (R->replay_d) { /* P's graph and D's replay, one prefill */
    struct rt_exec_stats *a = &res->prefill;
    const struct rt_exec_stats *b = &R->dstats;
    a->nodes += b->nodes;
    a->token_layers += b->token_layers;
    a->seconds += b->seconds;
    for (int i = 0; i < GRAPH_OP_COUNT; i++) a->op_seconds[i] += b->op_seconds[i], a->op_nodes[i] += b->op_nodes[i];
    for (int i = 0; i < RT_FAM_COUNT; i++) a->family_seconds[i] += b->family_seconds[i];
    if (b->act_peak_bytes > a->act_peak_bytes) a->act_peak_bytes = b->act_peak_bytes;
    if (b->scratch_peak_bytes > a->scratch_peak_bytes) a->scratch_peak_bytes = b->scratch_peak_bytes;
  }
  res->prefill_logits = R->logits;
  res->prefill_pos = R->pos;
  R->logits = NULL;
  R->pos = NULL;
  res->ttft_s = R->replay_d ? R->ttft_d : R->m.ttft_s;
}

/* P: prefill (TRANSFER nodes ship as they run), sample y1, make the record.
 * Returns 0 or a negative status with err. */
/* The next token from logits with o's whole sampler: the repetition penalty
 * over r's ids (the prompt and every id consumed so far), temperature,
 * top-k, top-p, one draw from rng: generate.c's ops in generate.c's order,
 * so P's y1 and D's ids are a single process's, bitwise (P ships its rng
 * state in the metadata). -1 as op_sample_k gives it, or for an id of r
 * outside the vocabulary. */
int pd_sample(const struct rt_gen_opts *o, const struct rt_request *r, const float *logits, int64_t pos,
              uint64_t *rng, int32_t *id, char *err, size_t err_len) {
  struct rt_sampler smp;
  if (rt_sampler_init(&smp, r->plan->model.vocab)) {
    snprintf(err, err_len, "out of memory for the sampler");
    return CEDAR_ENOMEM;
  }
  struct rt_sample_opts so = rt_gen_sample_opts(o);
  int rc = rt_sample_next(&smp, &so, r, logits, pos, rng, id, err, err_len);
  rt_sampler_free(&smp);
  return rc;
}

static int run_prefill(struct run *R, struct rt_kv_pool *pools, struct rt_request *rp, struct rt_pd_stats *st,
                       const int32_t *prompt, char *err, size_t err_len) {
  const struct plan *p = R->M->p;
  const int V = p->model.vocab;
  int rc = rt_request_init(rp, 0, p, pools, R->n + 1);
  if (rc) {
    snprintf(err, err_len, "out of memory for a request of %lld tokens", (long long)R->n);
    return rc;
  }
  for (int64_t i = 0; i < R->n; i++) rt_request_push_token(rp, prompt[i]);
  R->L.rp = rp;
  R->L.st = st;
  R->L.rx = &R->rx;
  R->L.g = &R->g;
  pd_cur = &R->L;
  double t0 = comm_now();
  struct rt_exec_out out = {.logits = R->logits, .pos = R->pos};
  if (R->trace) R->ptimes = cedar_xcalloc((size_t)R->g.n_node + 1, sizeof(*R->ptimes));
  rc = rt_gen_run_graph(&R->g, R->MP, rp, &out, &R->m.prefill, R->o, NULL, R->L.role == RT_PD_LOCAL, R->ptimes, err, err_len);
  if (!rc && R->trace) {
    double off = clock_offset_us();
    for (int k = 0; k < R->g.n_node; k++) {
      R->tmsg[3 * k] = R->ptimes[k].worker;
      R->tmsg[3 * k + 1] = R->ptimes[k].start_us + off;
      R->tmsg[3 * k + 2] = R->ptimes[k].end_us + off;
    }
  }
  double t_end = comm_now();
  pd_cur = NULL;
  if (!rc && R->L.rc) {
    rc = R->L.rc;
    snprintf(err, err_len, "%s", R->L.err);
  }
  if (rc) return rc;
  rp->n_pos = R->n;
  uint64_t rng = R->o->seed;
  int32_t y1 = -1;
  if (R->g.out_rows > 0) { /* replay on P: P samples y1 (non-finite logits fail the request: D's wait ends) */
    rc = pd_sample(R->o, rp, R->logits + (size_t)(R->g.out_rows - 1) * V, R->n - 1, &rng, &y1, err, err_len);
    if (rc) return rc;
  }
  double ttft = comm_now() - t0;
  struct rt_exec_stats ps = R->m.prefill;
  pd_meta_fill(&R->m, rp, R->n, y1, rng);
  R->m.prefill = ps;
  if (y1 < 0) R->m.y1_sampler = 1; /* D samples after its replay */
  R->m.t_start = t0;
  R->m.n_messages = R->g.n_transfer;
  for (int i = 0; i < R->n_xfer; i++) {
    struct msg_hdr h;
    if (R->L.role == RT_PD_PREFILL) {
      memcpy(&h, R->L.buf[R->xfer[i]], sizeof h);
      R->m.chain = XXH3_64bits_withSeed(&h.sum, 8, R->m.chain);
    }
  }
  if (R->L.role == RT_PD_LOCAL) R->m.chain = R->L.chain_p; /* as packed, in the order they ran */
  R->m.out_rows = R->g.out_rows;
  R->m.ttft_s = ttft;
  R->m.prefill_s = t_end - t0;
  R->m.t_end = t_end;
  R->m.t_first_send = t_end;
  for (int i = 0; i < R->n_xfer; i++)
    if (R->L.ms[R->xfer[i]].t_post > 0 && R->L.ms[R->xfer[i]].t_post < R->m.t_first_send)
      R->m.t_first_send = R->L.ms[R->xfer[i]].t_post;
  R->m.prefill_nodes = R->g.n_node;
  int64_t e = 0;
  for (int k = 0; k < R->g.n_node; k++) e += R->g.node[k].n_dep;
  R->m.prefill_edges = (int32_t)e;
  R->m.replay = R->g.replay;
  if (pd_fault == RT_PD_FAULT_VERSION) R->m.version = RT_PD_STATE_VERSION + 1;
  pd_meta_seal(&R->m);
  st->prefill_s = t_end - t0;
  return 0;
}

/* The figures once every message is applied on D. */
static void figures(struct run *R, struct rt_pd_stats *st, double t_ready) {
  double first = R->m.t_first_send, lastd = 0;
  int64_t kv = 0, kv_before = 0;
  for (int i = 0; i < R->n_xfer; i++) {
    struct comm_msg *s = &R->L.ms[R->xfer[i]];
    if (s->t_done > lastd) lastd = s->t_done;
    const struct graph_node *nd = &R->g.node[R->xfer[i]];
    if (R->g.data[nd->xfer_src].state != GRAPH_ST_KV) continue;
    int64_t b = pd_payload_bytes(&R->g, nd, R->L.rd ? R->L.rd : R->L.rp);
    kv += b;
    if (s->t_done <= R->m.t_end) kv_before += b;
  }
  st->messages = R->n_xfer + 2;
  st->kv_bytes_before_end = kv_before;
  st->overlap = kv ? (double)kv_before / (double)kv : 1;
  st->transfer_s = lastd > first ? lastd - first : 0;
  st->handoff_s = t_ready > R->m.t_end ? t_ready - R->m.t_end : 0;
  st->prefill_s = R->m.prefill_s;
  rt_pd_expected_bytes(R->M->p, R->n, R->g.replay, st->expected);
  st->bytes[RT_PD_META] += (int64_t)sizeof(struct rt_pd_meta);
}

/* Faults a negative test asks for, on D's state before the barrier. */
static void inject(struct run *R, struct rt_request *rd) {
  const struct plan *p = R->M->p;
  if (pd_fault == RT_PD_FAULT_DROP_TAIL)
    for (int l = 0; l < p->n_layers; l++)
      if (rd->seq[l].pool && rd->seq[l].pool->ratio > 1) {
        rd->tail[l].count = 0; /* as a request starts: the tail message never applied */
        rd->tail[l].pos0 = 0;
        break;
      }
  if (pd_fault == RT_PD_FAULT_SWA_SHIFT && rd->n_pos > 0) {
    struct rt_ring *q = &rd->ring[0];
    q->pos[(rd->n_pos - 1) % q->window] = -1; /* the ring one position behind the boundary */
  }
  if (pd_fault == RT_PD_FAULT_Y1) rt_request_push_token(rd, rd->pending);
}

/* D with serving.placement.replay: decode: the decoder's bounded replay
 * from the kept encoder outputs P shipped (a prefix-hit graph whose whole
 * prompt is "cached": hit = n with the encoder state restored), then y1. */
static int replay_on_d(struct run *R, struct rt_request *r, char *err, size_t err_len) {
  const struct rt_gen_opts *o = R->o;
  const int V = R->M->p->model.vocab;
  struct graph g;
  struct graph_opts go = {.chunk = o->chunk, .replay = o->replay, .all_logits = o->all_logits, .hit = R->n,
                          .swa_hit = true, .at_decode = true};
  int rc = graph_build_prefill(&g, R->MD->p, R->n, &go, err, err_len);
  if (rc) return rc;
  free(R->logits);
  free(R->pos);
  R->logits = cedar_xmalloc(sizeof(float) * (size_t)g.out_rows * V);
  R->pos = cedar_xmalloc(sizeof(int64_t) * (size_t)g.out_rows);
  struct rt_exec_out out = {.logits = R->logits, .pos = R->pos};
  rc = rt_gen_run_graph(&g, R->MD, r, &out, &R->dstats, o, NULL, true, NULL, err, err_len);
  R->d_nodes = g.n_node;
  for (int k = 0; k < g.n_node; k++) R->d_edges += g.node[k].n_dep;
  R->d_rows = g.out_rows;
  if (!rc) rc = pd_sample(o, r, R->logits + (size_t)(g.out_rows - 1) * V, R->n - 1, &R->rng, &r->pending, err, err_len);
  if (!rc) R->ttft_d = comm_now() - R->m.t_start; /* D delivers y1: the handoff is inside TTFT */
  graph_free(&g);
  return rc;
}

/* D: consume y1 and decode (the one decode loop: rt_gen_decode). */
static int run_decode(struct run *R, struct rt_request *r, struct rt_gen_result *res, char *err, size_t err_len) {
  return pd_decode(R->MD, R->o, r, R->rng, res, err, err_len);
}

int pd_decode(const struct rt_model *M, const struct rt_gen_opts *o, struct rt_request *r, uint64_t rng,
              struct rt_gen_result *res, char *err, size_t err_len) {
  const int V = M->p->model.vocab;
  res->tokens = cedar_xmalloc(sizeof(int32_t) * (size_t)o->max_new);
  res->decode_logits = cedar_xmalloc(sizeof(float) * (size_t)V * (size_t)(o->max_new > 1 ? o->max_new - 1 : 1));
  res->tokens[res->n_tokens++] = r->pending;
  struct rt_sampler smp;
  if (rt_sampler_init(&smp, V)) {
    snprintf(err, err_len, "out of memory for the sampler");
    return CEDAR_ENOMEM;
  }
  int rc = rt_gen_decode(M, r, o, &smp, &rng, res, err, err_len);
  rt_sampler_free(&smp);
  return rc;
}

/* D under mpirun: receive every message within the deadline and apply it. */
static int receive(struct run *R, struct rt_request *rd, struct rt_pd_stats *st, int src, char *err,
                   size_t err_len) {
  const struct graph *g = &R->g;
  int V = R->M->p->model.vocab;
  int64_t lg_bytes = R->g.out_rows * ((int64_t)V * 4 + 8);
  uint8_t *lg = cedar_xmalloc((size_t)lg_bytes + 1);
  R->mbytes = cedar_xcalloc((size_t)g->n_node + 1, sizeof(*R->mbytes));
  int rc = 0;
  for (int i = 0; i < R->n_xfer && !rc; i++) {
    int k = R->xfer[i];
    int64_t len = pd_msg_bytes(g, &g->node[k], rd);
    R->mbytes[k] = len;
    R->L.buf[k] = cedar_xmalloc((size_t)len);
    rc = comm_recv(R->L.buf[k], (size_t)len, src, k + 1, &R->L.ms[k]);
  }
  int s_rec = pd_slot(g, PD_MSG_RECORD), s_lg = pd_slot(g, PD_MSG_LOGITS), s_tr = pd_slot(g, PD_MSG_TRACE);
  if (!rc) rc = comm_recv(&R->m, sizeof R->m, src, pd_tag(g, PD_MSG_RECORD), &R->L.ms[s_rec]);
  if (!rc && lg_bytes > 0) rc = comm_recv(lg, (size_t)lg_bytes, src, pd_tag(g, PD_MSG_LOGITS), &R->L.ms[s_lg]);
  if (lg_bytes == 0) atomic_store(&R->L.ms[s_lg].done, 1); /* replay on D: P sends no logits */
  if (!rc && R->trace)
    rc = comm_recv(R->tmsg, sizeof(double) * 3 * (size_t)g->n_node, src, pd_tag(g, PD_MSG_TRACE), &R->L.ms[s_tr]);
  else
    atomic_store(&R->L.ms[s_tr].done, 1);
  if (rc) {
    snprintf(err, err_len, "posting the receives through StarPU-MPI failed");
    free(lg);
    return rc;
  }
  int all[R->n_xfer + 3];
  memcpy(all, R->xfer, sizeof(int) * (size_t)R->n_xfer);
  all[R->n_xfer] = s_rec;
  all[R->n_xfer + 1] = s_lg;
  all[R->n_xfer + 2] = s_tr;
  double dl = deadline_s();
  if (!pd_wait_all(g, R->L.ms, all, R->n_xfer + 3, dl, &R->rx, pd_fault == RT_PD_FAULT_D_DIES ? pd_fault_at : 0)) {
    int fake = !R->trace + (lg_bytes == 0); /* marked done above: no such message */
    snprintf(err, err_len, "the P->D transfer stalled: no message for %.0f s (CEDAR_PD_DEADLINE_S): %lld of %d "
             "messages arrived, first missing: %s; this request is dropped", dl, (long long)R->rx.arrived - fake,
             R->n_xfer + 3 - fake, R->rx.first_missing);
    free(lg);
    return PD_STALLED;
  }
  R->rx.arrived = R->n_xfer; /* the record and the logits are not transfer messages */
  for (int i = 0; i < R->n_xfer && !rc; i++) {
    int k = R->xfer[i];
    rc = pd_apply(g, k, R->L.buf[k], pd_msg_bytes(g, &g->node[k], rd), rd, st, &R->rx, err, err_len);
  }
  for (int64_t i = 0; !rc && i < R->g.out_rows; i++) {
    memcpy(R->logits + (size_t)i * V, lg + (size_t)i * V * 4, (size_t)V * 4);
    memcpy(&R->pos[i], lg + (size_t)R->g.out_rows * V * 4 + 8 * (size_t)i, 8);
  }
  free(lg);
  return rc;
}

/* A request's run: the role's models (views of the plan when each role has
 * stages or experts of its own), the prefill graph, the message table and
 * the buffers; the routed experts' figures opened (one process); both
 * engines met and StarPU-MPI up under mpirun. *opened: rt_pipe_open ran. */
static int run_open(struct run *R, const struct rt_model *M, enum rt_pd_role role, struct rt_pd_stats *st,
                    bool *opened, char *err, size_t err_len) {
  const struct plan *p = M->p;
  const struct rt_gen_opts *o = R->o;
  R->M = R->MP = R->MD = M;
  R->L.role = role;
  R->L.dest = p->serving.decode_rank;
  pthread_mutex_init(&R->L.mu, NULL);
  st->mpi = role != RT_PD_LOCAL;
  bool views = plan_place_pd(p); /* P/D stages or experts in one process: both roles' graphs here */
  if (views) {
    R->vp = cedar_xmalloc(sizeof *R->vp);
    R->vd = cedar_xmalloc(sizeof *R->vd);
    plan_role_view(p, false, R->vp);
    plan_role_view(p, true, R->vd);
    R->mp = *M, R->md = *M;
    R->mp.p = R->vp, R->md.p = R->vd;
    R->MP = &R->mp, R->MD = &R->md;
  }
  struct graph_opts go = {.chunk = o->chunk, .replay = o->replay, .all_logits = o->all_logits};
  int rc = graph_build_prefill(&R->g, R->MP->p, R->n, &go, err, err_len);
  if (!rc && views) { /* the routed experts' figures (rt_ep_begin): one process, no messages */
    if (!R->figs.pipe) R->figs.pipe = &R->own_pipe;
    if (!R->figs.ep) R->figs.ep = &R->own_ep;
    rc = rt_pipe_open(p, R->vp->serving.place.n_ep_ranks ? R->vp : R->vd, o, R->n, &R->figs, err, err_len);
    *opened = !rc;
  }
  if (rc) return rc;
  R->L.buf = cedar_xcalloc((size_t)R->g.n_node, sizeof(uint8_t *));
  R->L.ms = cedar_xcalloc((size_t)R->g.n_node + PD_MSG_COUNT, sizeof(*R->L.ms)); /* the transfers, then pd_msg's */
  R->trace = role != RT_PD_LOCAL && o->on_graph && o->executor != RT_EXEC_DIRECT;
  if (R->trace) R->tmsg = cedar_xcalloc(3 * (size_t)R->g.n_node + 1, sizeof(double));
  R->xfer = cedar_xmalloc(sizeof(int) * (size_t)(R->g.n_transfer + 1));
  R->L.last_kv = -1;
  for (int k = 0; k < R->g.n_node; k++) {
    if (R->g.node[k].op != GRAPH_TRANSFER || (R->g.node[k].flags & GRAPH_F_STAGE)) continue; /* P->D ones */
    R->xfer[R->n_xfer++] = k;
    if (R->g.data[R->g.node[k].xfer_src].state == GRAPH_ST_KV) R->L.last_kv = k;
  }
  R->logits = cedar_xmalloc(sizeof(float) * (size_t)R->g.out_rows * p->model.vocab);
  R->pos = cedar_xmalloc(sizeof(int64_t) * (size_t)R->g.out_rows);
  R->rx.expected = R->n_xfer;
  if (role != RT_PD_LOCAL && !comm_meet(deadline_s())) { /* both engines up before any deadline counts */
    snprintf(err, err_len, "the %s rank did not start the request within %.0f s (CEDAR_PD_DEADLINE_S)",
             role == RT_PD_PREFILL ? "decode" : "prefill", deadline_s());
    comm_abort(err);
  }
  if (role != RT_PD_LOCAL && (rc = comm_start(err, err_len))) return rc;
  R->mpi_on = role != RT_PD_LOCAL;
  return 0;
}

/* P under mpirun: prefill (the transfers ship as they run), then the
 * record, the logits and the trace to D, and D's answer, all within the
 * deadline. RT_GEN_ELSEWHERE when D took the package (D reports). */
static int p_side(struct run *R, struct rt_kv_pool *pools, struct rt_request *rp, struct rt_pd_stats *st,
                  const int32_t *prompt, char *err, size_t err_len) {
  const struct plan *p = R->M->p;
  const struct graph *g = &R->g;
  int rc = run_prefill(R, pools, rp, st, prompt, err, err_len);
  if (rc) { /* D would wait for its deadline: end the job now */
    rt_request_free(rp);
    comm_abort(err);
    return rc;
  }
  if (pd_fault == RT_PD_FAULT_P_DIES && pd_fault_at > R->n_xfer) comm_die("P", pd_fault_at); /* before the record */
  int64_t rows = g->out_rows, V = p->model.vocab;
  uint8_t *lg = cedar_xmalloc((size_t)(rows * (V * 4 + 8)) + 1);
  memcpy(lg, R->logits, (size_t)(rows * V * 4));
  memcpy(lg + rows * V * 4, R->pos, (size_t)rows * 8);
  struct comm_msg *ms = R->L.ms;
  rc = comm_send(&R->m, sizeof R->m, R->L.dest, pd_tag(g, PD_MSG_RECORD), &ms[pd_slot(g, PD_MSG_RECORD)]);
  if (!rc && rows > 0)
    rc = comm_send(lg, (size_t)(rows * (V * 4 + 8)), R->L.dest, pd_tag(g, PD_MSG_LOGITS), &ms[pd_slot(g, PD_MSG_LOGITS)]);
  if (rows == 0) atomic_store(&ms[pd_slot(g, PD_MSG_LOGITS)].done, 1); /* replay on D: no logits to send */
  if (!rc && R->trace)
    rc = comm_send(R->tmsg, sizeof(double) * 3 * (size_t)g->n_node, R->L.dest, pd_tag(g, PD_MSG_TRACE),
                   &ms[pd_slot(g, PD_MSG_TRACE)]);
  else
    atomic_store(&ms[pd_slot(g, PD_MSG_TRACE)].done, 1);
  if (!rc) rc = comm_recv(&R->ack, sizeof R->ack, R->L.dest, pd_tag(g, PD_MSG_ANSWER), &ms[pd_slot(g, PD_MSG_ANSWER)]);
  int all[R->n_xfer + PD_MSG_COUNT];
  memcpy(all, R->xfer, sizeof(int) * (size_t)R->n_xfer);
  for (int m = 0; m < PD_MSG_COUNT; m++) all[R->n_xfer + m] = pd_slot(g, (enum pd_msg)m);
  double dl = deadline_s();
  if (rc) {
    snprintf(err, err_len, "posting the package through StarPU-MPI failed");
  } else if (!pd_wait_all(g, ms, all, R->n_xfer + PD_MSG_COUNT, dl, &R->rx, 0)) {
    snprintf(err, err_len, "the decode rank stopped taking the package: nothing completed for %.0f s "
             "(CEDAR_PD_DEADLINE_S), first missing: %s", dl, R->rx.first_missing);
    rc = CEDAR_EIO;
  } else if (R->ack.magic != PD_ACK_MAGIC || R->ack.sum != XXH3_64bits(&R->ack, offsetof(struct pd_ack, sum))) {
    snprintf(err, err_len, "the decode rank's answer fails its checksum");
    rc = CEDAR_EIO;
  } else if (R->ack.status) {
    R->ack.msg[sizeof R->ack.msg - 1] = 0;
    snprintf(err, err_len, "the decode rank refused the package: %s", R->ack.msg);
    rc = CEDAR_EIO;
  }
  figures(R, st, comm_now()); /* before rp goes: the message sizes come from its shapes */
  st->handoff_s = 0;
  if (rc) free_and_say(p, pools, rp, "P", err, err_len); /* accepted: D holds the state now, P's goes too */
  bool stopped = comm_stop();
  if (stopped) free(lg); /* in flight: StarPU-MPI may still read it */
  if (!stopped) {
    if (rp->plan) rt_request_free(rp);
    comm_abort(err);
  }
  return rc ? rc : RT_GEN_ELSEWHERE;
}

/* D (or both roles in one process, after P's prefill into pools of its
 * own): the record, D's replay when it replays, the ready barrier, the
 * answer to P, then the decode. *pools_p: P's pools, freed once D holds
 * the state. */
static int d_side_run(struct run *R, enum rt_pd_role role, struct rt_kv_pool *pools, struct rt_kv_pool **pools_p,
                      struct rt_request *r, struct rt_request *rp, struct rt_pd_stats *st, struct rt_gen_result *res,
                      char *err, size_t err_len) {
  const struct plan *p = R->M->p;
  r->n_pos = R->m.n_pos;
  r->pending = R->m.y1;
  R->rng = R->m.rng;
  R->replay_d = R->m.y1_sampler == 1;
  st->replay_on_d = R->replay_d;
  int rc = 0;
  if (R->replay_d) { /* the package first, then D's replay on it (SPEC 7.3: replays complete before decode) */
    rc = pd_ready_check(p, &R->m, r, &R->rx, false, err, err_len);
    if (!rc) rc = replay_on_d(R, r, err, err_len);
    if (rc) {
      figures(R, st, comm_now());
      return rc;
    }
  }
  if (role == RT_PD_LOCAL) {
    rt_request_free(rp);
    rt_kv_pools_free(*pools_p, p->n_layers);
    free(*pools_p);
    *pools_p = NULL;
  }
  inject(R, r);
  double t_r = comm_now();
  rc = rt_pd_ready(p, &R->m, r, &R->rx, err, err_len);
  double t_ready = comm_now();
  st->ready_s = t_ready - t_r;
  figures(R, st, t_ready);
  if (!rc && !R->replay_d && R->m.out_rows != R->g.out_rows) {
    snprintf(err, err_len, "the package record announces %lld logits rows, the prefill graph makes %lld; refused",
             (long long)R->m.out_rows, (long long)R->g.out_rows);
    rc = CEDAR_EINVAL;
  }
  if (role == RT_PD_DECODE) d_answer(R, pools, r, rc, err);
  if (rc) return rc;
  fill_result(R, res);
  return run_decode(R, r, res, err, err_len);
}

/* D under mpirun with a trace: P's part on D's clock, into the caller's
 * R->figs.pd_trace (the trace takes R's graph). */
static void keep_p_trace(struct run *R, const struct plan *p) {
  struct rt_pd_trace *t = R->figs.pd_trace;
  if (!t) return;
  for (int k = 0; k < R->g.n_node; k++) free(R->L.buf[k]), R->L.buf[k] = NULL;
  rt_pd_trace_free(t);
  double off = clock_offset_us();
  struct rt_task_time *times = cedar_xcalloc((size_t)R->g.n_node + 1, sizeof(*times));
  double *arrive = cedar_xcalloc((size_t)R->g.n_node + 1, sizeof(*arrive));
  int workers = 0;
  for (int k = 0; k < R->g.n_node; k++) {
    times[k] = (struct rt_task_time){(int)R->tmsg[3 * k], 0, R->tmsg[3 * k + 1] - off, R->tmsg[3 * k + 2] - off};
    if (times[k].worker > workers - 1) workers = times[k].worker + 1;
  }
  for (int i = 0; i < R->n_xfer; i++) arrive[R->xfer[i]] = 1e6 * R->L.ms[R->xfer[i]].t_done - off;
  struct graph *g = cedar_xmalloc(sizeof *g);
  *g = R->g;
  memset(&R->g, 0, sizeof R->g); /* the trace owns it now */
  *t = (struct rt_pd_trace){g, times, arrive, R->mbytes, p->serving.prefill_rank, p->serving.decode_rank, workers};
  R->mbytes = NULL;
}

static void run_free(struct run *R) {
  for (int k = 0; R->L.buf && k < R->g.n_node; k++) free(R->L.buf[k]);
  free(R->L.buf);
  free(R->L.ms);
  free(R->xfer);
  free(R->logits);
  free(R->pos);
  free(R->ptimes);
  free(R->tmsg);
  free(R->mbytes);
  pthread_mutex_destroy(&R->L.mu);
  graph_free(&R->g);
  free(R->vp); /* after the graph built from it */
  free(R->vd);
  free(R);
}

/* The request's checks before any role runs: 0, or the refusal. */
static int pd_refuse(int64_t n, const struct rt_gen_opts *o, char *err, size_t err_len) {
  const char *tf = getenv("CEDAR_PD_TEST_FAULT"); /* tests/cli/pd_mpi.sh, pd_faults.sh */
  if (tf && rt_pd_fault_parse(tf, err, err_len)) return CEDAR_EINVAL;
  if (n < 1 || o->max_new < 1) {
    snprintf(err, err_len, "a request needs a prompt of at least one token and --max-new of at least 1");
    return CEDAR_EINVAL;
  }
  if (o->cache) {
    snprintf(err, err_len, "a P/D placement (prefill and decode on different ranks) runs without the prefix cache: "
             "a hit would need the cached pages on D and the encoder snapshot on P, which is not built; turn the "
             "prefix cache off for this plan, or run it without serving.placement");
    return CEDAR_EUNSUPPORTED;
  }
  return 0;
}

int rt_pd_generate(const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r, const int32_t *prompt,
                   int64_t n, const struct rt_gen_opts *o, struct rt_gen_result *res, struct rt_pd_stats *st,
                   const struct rt_pipe_figs *figs, char *err, size_t err_len) {
  rt_pd_register(); /* this feature's node entries (backend.h) */
  const struct plan *p = M->p;
  memset(res, 0, sizeof(*res));
  memset(st, 0, sizeof(*st));
  enum rt_pd_role role = rt_pd_role_of(p);
  int rc = pd_refuse(n, o, err, err_len);
  if (rc) return rc;
  if (plan_place_pd(p) && comm_world_size() > 1) /* each role on ranks of its own (pd_stage.c) */
    return pd_stage_generate(M, pools, r, prompt, n, o, res, st, figs, err, err_len);
  if (role == RT_PD_IDLE || role == RT_PD_NONE) {
    if (role == RT_PD_IDLE && !comm_meet(deadline_s())) comm_abort("the other ranks did not start the request");
    if (role == RT_PD_IDLE && !comm_start(err, err_len)) comm_stop();
    return RT_GEN_ELSEWHERE;
  }
  struct run *R = cedar_xcalloc(1, sizeof(*R));
  R->o = o;
  R->n = n;
  if (figs) R->figs = *figs;
  struct rt_kv_pool *pools_p = NULL;
  struct rt_request rp = {0};
  bool opened = false;
  rc = run_open(R, M, role, st, &opened, err, err_len);
  if (!rc && (role == RT_PD_LOCAL || role == RT_PD_DECODE)) {
    rc = rt_request_init(r, 0, p, pools, n + o->max_new);
    if (rc) snprintf(err, err_len, "out of memory on D for a request of %lld tokens", (long long)(n + o->max_new));
    R->L.rd = r;
  }
  if (!rc && role == RT_PD_LOCAL) {
    pools_p = cedar_xcalloc(PLAN_MAX_LAYERS, sizeof(*pools_p)); /* P's home: pools of its own */
    rc = rt_kv_pools_init(pools_p, p, err, err_len);
    if (!rc) rc = run_prefill(R, pools_p, &rp, st, prompt, err, err_len);
  } else if (!rc && role == RT_PD_PREFILL) {
    rc = p_side(R, pools, &rp, st, prompt, err, err_len);
  } else if (!rc) {
    rc = receive(R, r, st, p->serving.prefill_rank, err, err_len);
    if (rc == PD_STALLED) { /* P is gone: a receive stays posted (StarPU-MPI cannot cancel it) */
      rc = CEDAR_EIO;
      R->acked = true; /* nobody to answer */
      free_and_say(p, pools, r, "D", err, err_len);
      if (!comm_stop()) comm_abort(err); /* ends the job: exit 1 */
    }
  }
  if (!rc && role != RT_PD_PREFILL) rc = d_side_run(R, role, pools, &pools_p, r, &rp, st, res, err, err_len);
  if (!rc && R->trace && role == RT_PD_DECODE) keep_p_trace(R, p);
  if (role == RT_PD_DECODE && R->mpi_on && !R->acked)
    d_answer(R, pools, r, rc, err); /* refused before the barrier: P hears why */
  if (opened) rc = rt_pipe_close(R->vd, r, rc, err, err_len);
  if (rp.plan) rt_request_free(&rp);
  if (pools_p) {
    rt_kv_pools_free(pools_p, p->n_layers);
    free(pools_p);
  }
  run_free(R);
  return rc;
}
