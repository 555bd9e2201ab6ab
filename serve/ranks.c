/* ranks.c: cedar serve's engine thread when several ranks compute
 * (serve.h, srv_opts.ranks: under mpirun, a P/D, staged or
 * expert-parallel plan): the HTTP front and this thread on rank 0.
 *
 * One request at a time: continuous batching does not run across ranks
 * (rt_batch_init refuses such plans), so the thread takes the oldest queued
 * request and hands it to ranks.run (cli/serve_ranks.c: every rank runs it
 * as `cedar run` does, and the reporting rank's ids come back to rank 0).
 * The distributed drivers take no per-token callback and run the whole
 * max_tokens, so the ids arrive at the end: the text is cut at EOS or a
 * stop string here, a stream gets all its text in one event, TTFT is the
 * whole request and no inter-token latency is observed. A client that
 * leaves while its request runs is counted cancelled when it ends (a
 * request is not cut across ranks).
 * Test: tests/cli/serve_mpi.sh.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "serve/serve_internal.h"

/* r's ids as text, its end and its metrics (s->mu held). */
static void deliver(struct srv *s, struct srv_req *r, const int32_t *ids, int n) {
  srv_tout_open(s, r);
  double now = srv_now();
  srv_hist_observe(&s->m.ttft, now - r->t_arrive); /* every id arrives at once: no inter-token latency to observe */
  for (int k = 0; k < n; k++) {
    if (r->n_out == r->cap_out)
      r->out_ids = cedar_xrealloc(r->out_ids, sizeof(int32_t) * (size_t)(r->cap_out = r->cap_out ? 2 * r->cap_out : 64));
    r->out_ids[r->n_out++] = ids[k];
    s->m.generation_tokens++;
    if (text_out_push(&r->tout, ids[k])) break; /* EOS or a stop string: the ids after it are dropped */
  }
  if (r->tout.end == TEXT_RUNNING) text_out_finish(&r->tout);
  if (r->tout.end == TEXT_ERROR) {
    char why[160];
    snprintf(why, sizeof why, "the model generated id %d, which the tokenizer has no token for", r->tout.bad_id);
    srv_end_req(s, r, SRV_END_FAILED, why);
  } else {
    srv_end_req(s, r, r->tout.end == TEXT_EOS || r->tout.end == TEXT_STOP ? SRV_END_STOP : SRV_END_LENGTH, NULL);
  }
}

static void pages_gauge(struct srv *s) {
  int64_t pages = 0;
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) pages += s->e->pools[l].pages_in_use;
  s->m.kv_pages_in_use = pages;
}

void *srv_ranks_main(void *arg) {
  struct srv *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    pages_gauge(s);
    if (!s->q_head) {
      if (s->stop) break;
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 100 * 1000 * 1000;
      if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
      pthread_cond_timedwait(&s->loop_cv, &s->mu, &ts);
      continue;
    }
    struct srv_req *r = srv_pop(s);
    if (r->cancel) {
      srv_end_req(s, r, SRV_END_CANCELLED, NULL);
      continue;
    }
    if (s->draining && srv_now() > s->drain_deadline) {
      srv_end_req(s, r, SRV_END_ABORTED, "the server shut down before this request ran (--drain-s)");
      continue;
    }
    s->m.running = 1;
    s->m.prompt_tokens += (uint64_t)r->n_ids;
    pthread_mutex_unlock(&s->mu);
    int32_t *ids = NULL;
    int n = 0;
    char err[512];
    struct srv_rank_job j = {r->ids, r->n_ids, r->max_new, r->prm.top_k, r->seed, r->prm.temperature, r->prm.top_p,
                             r->prm.rep_penalty};
    int rc = s->o.ranks.run(s->o.ranks.user, &j, &ids, &n, err, sizeof err); /* a rank lost mid-request ends the job */
    pthread_mutex_lock(&s->mu);
    s->m.running = 0;
    s->m.steps++;
    if (rc) srv_end_req(s, r, SRV_END_FAILED, err);
    else if (r->cancel) srv_end_req(s, r, SRV_END_CANCELLED, NULL); /* it ran to its end: a request is not cut across ranks */
    else deliver(s, r, ids, n);
    free(ids);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}
