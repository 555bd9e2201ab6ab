/* loop.c: cedar serve's engine thread (serve.h): the locked queue in, the
 * continuous-batching steps (runtime/engine/batch.h) from a real clock, and each
 * request's ids out as text (runtime/text/text_out.h).
 *
 * The loop, under srv.mu except while a step runs:
 *   1. queued requests join the batch (rt_batch_submit, their sampler);
 *      one whose client already left ends at once;
 *   2. a request whose client left is aborted: its slot and pages return
 *      now (rt_batch_abort), before the next step;
 *   3. past the drain deadline every request left is aborted;
 *   4. one step (the lock released), then every request's new ids: text
 *      for the HTTP side, the TTFT and ITL clocks, and its end (EOS or a
 *      stop string: rt_batch_stop; max_tokens; a failure: 500 for it, the
 *      others go on);
 *   5. idle: wait for a request (or the stop) on loop_cv.
 * A request over is forgotten by the batch (rt_batch_forget), so a server
 * that runs for days holds only its live requests.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "serve/serve_internal.h"

double srv_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void req_free(struct srv_req *r) {
  srv_params_free(&r->prm);
  free(r->ids);
  free(r->text);
  free(r->out_ids);
  pthread_cond_destroy(&r->cv);
  free(r);
}

void srv_req_unref_locked(struct srv_req *r) {
  if (--r->refs == 0) req_free(r);
}

int srv_submit(struct srv *s, struct srv_req *r, char *err, size_t err_len) {
  pthread_mutex_lock(&s->mu);
  int rc = 0;
  if (s->draining) {
    snprintf(err, err_len, "the server is shutting down; retry on another instance");
    rc = 503;
  } else if (s->m.waiting >= s->o.max_waiting) { /* queued here and waiting in the batch */
    snprintf(err, err_len, "%lld requests are already waiting (--max-waiting %d); retry later",
             (long long)s->m.waiting, s->o.max_waiting);
    rc = 429;
  } else {
    r->refs++;
    r->handle = -1;
    if (s->q_tail) s->q_tail->next = r;
    else s->q_head = r;
    s->q_tail = r;
    s->n_queued++;
    s->m.waiting++; /* counted at once, so a burst between two steps meets the limit */
    pthread_cond_signal(&s->loop_cv);
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* text_out's emit: the text grows (s->mu held by the loop). */
static void emit(void *user, const char *t, size_t n) {
  struct srv_req *r = user;
  if (r->len + n + 1 > r->cap) {
    r->cap = (r->len + n + 1) * 2;
    r->text = cedar_xrealloc(r->text, r->cap);
  }
  memcpy(r->text + r->len, t, n);
  r->len += n;
  r->text[r->len] = 0;
}

/* r is over: its end, its metrics, the HTTP side woken, the engine's reference dropped. */
static void end_req(struct srv *s, struct srv_req *r, enum srv_end end, const char *why) {
  r->end = end;
  if (why) snprintf(r->err, sizeof r->err, "%s", why);
  enum srv_outcome oc = end == SRV_END_FAILED ? SRV_FAILED : end == SRV_END_CANCELLED ? SRV_CANCELLED
                      : end == SRV_END_ABORTED ? SRV_ABORTED : SRV_OK;
  s->m.requests[oc]++;
  if (oc == SRV_OK) srv_hist_observe(&s->m.e2e, srv_now() - r->t_arrive);
  if (r->tout_live) text_out_free(&r->tout), r->tout_live = false;
  if (r->handle >= 0) {
    rt_batch_abort(&s->batch, r->handle); /* a no-op when it is over already */
    rt_batch_forget(&s->batch, r->handle);
    r->handle = -1;
  }
  pthread_cond_broadcast(&r->cv);
  srv_req_unref_locked(r);
}

static void join_batch(struct srv *s, struct srv_req *r) {
  char err[256];
  int h = rt_batch_submit(&s->batch, r->ids, r->n_ids, r->max_new, r->seed, 0, err, sizeof err);
  if (h < 0) {
    end_req(s, r, SRV_END_FAILED, err);
    return;
  }
  r->handle = h;
  rt_batch_sample(&s->batch, h, r->prm.temperature, r->prm.top_p, r->prm.top_k, r->prm.rep_penalty);
  srv_tout_open(s, r);
  s->m.prompt_tokens += (uint64_t)r->n_ids;
}

/* Steps 1-3 of the loop. act holds the requests in the batch. */
static void intake(struct srv *s, struct srv_req ***act, int *n_act, int *cap) {
  while (s->q_head) {
    struct srv_req *r = srv_pop(s);
    if (r->cancel) {
      end_req(s, r, SRV_END_CANCELLED, NULL);
      continue;
    }
    join_batch(s, r);
    if (r->handle < 0) continue;
    if (*n_act == *cap) *act = cedar_xrealloc(*act, sizeof(**act) * (size_t)(*cap = *cap ? 2 * *cap : 64));
    (*act)[(*n_act)++] = r;
  }
  bool late = s->draining && srv_now() > s->drain_deadline;
  for (int i = 0; i < *n_act;) {
    struct srv_req *r = (*act)[i];
    if (r->cancel || late) {
      end_req(s, r, late ? SRV_END_ABORTED : SRV_END_CANCELLED,
              late ? "the server shut down before this request finished (--drain-s)" : NULL);
      (*act)[i] = (*act)[--*n_act];
    } else {
      i++;
    }
  }
}

/* Step 4: r's new ids after a step; true when r is over. */
static bool collect(struct srv *s, struct srv_req *r) {
  struct rt_batch *b = &s->batch;
  const struct rt_bq *q = b->q[r->handle];
  double now = srv_now();
  bool ended = r->tout.end != TEXT_RUNNING;
  while (!ended && r->n_out < q->n_tokens) {
    int32_t id = q->tokens[r->n_out];
    if (r->n_out == r->cap_out) r->out_ids = cedar_xrealloc(r->out_ids, sizeof(int32_t) * (size_t)(r->cap_out = r->cap_out ? 2 * r->cap_out : 64));
    r->out_ids[r->n_out++] = id;
    if (r->n_out == 1) srv_hist_observe(&s->m.ttft, now - r->t_arrive);
    else srv_hist_observe(&s->m.itl, now - r->t_last);
    r->t_last = now;
    s->m.generation_tokens++;
    if (text_out_push(&r->tout, id)) {
      ended = true;
      rt_batch_stop(b, r->handle); /* EOS or a stop string: it ends here, as finished */
    }
  }
  pthread_cond_broadcast(&r->cv);
  if (q->state < RT_BQ_DONE) return false;
  if (q->state == RT_BQ_FAILED) {
    end_req(s, r, SRV_END_FAILED, q->err);
    return true;
  }
  s->m.prefix_hit_tokens += (uint64_t)(q->hrep.hit > 0 ? q->hrep.hit : 0);
  if (r->tout.end == TEXT_RUNNING) text_out_finish(&r->tout);
  if (r->tout.end == TEXT_ERROR) {
    char why[160];
    snprintf(why, sizeof why, "the model generated id %d, which the tokenizer has no token for", r->tout.bad_id);
    end_req(s, r, SRV_END_FAILED, why);
  } else {
    end_req(s, r, r->tout.end == TEXT_EOS || r->tout.end == TEXT_STOP ? SRV_END_STOP : SRV_END_LENGTH, NULL);
  }
  return true;
}

static void gauges(struct srv *s) {
  const struct rt_batch *b = &s->batch;
  int64_t running = 0, waiting = 0;
  for (int i = 0; i < b->n_live; i++) {
    if (b->q[b->live[i]]->state == RT_BQ_WAITING) waiting++;
    else running++;
  }
  s->m.running = running;
  s->m.waiting = waiting + s->n_queued;
  int64_t pages = 0;
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) pages += s->e->pools[l].pages_in_use;
  s->m.kv_pages_in_use = pages;
  if (s->e->cache) {
    s->m.cache_bytes = s->e->cache->bytes;
    s->m.cache_capacity_bytes = s->e->cache->capacity_bytes;
    s->m.cache_blocks = s->e->cache->count;
  }
}

void *srv_loop_main(void *arg) {
  struct srv *s = arg;
  struct srv_req **act = NULL;
  int n_act = 0, cap = 0;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    intake(s, &act, &n_act, &cap);
    gauges(s);
    if (!rt_batch_pending(&s->batch)) {
      if (s->stop) break;
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 100 * 1000 * 1000;
      if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
      if (!s->q_head) pthread_cond_timedwait(&s->loop_cv, &s->mu, &ts);
      continue;
    }
    pthread_mutex_unlock(&s->mu);
    struct rt_batch_step st;
    rt_batch_run_step(&s->batch, &st);
    pthread_mutex_lock(&s->mu);
    s->m.steps++;
    for (int i = 0; i < n_act;) {
      if (collect(s, act[i])) act[i] = act[--n_act];
      else i++;
    }
  }
  for (int i = 0; i < n_act; i++) end_req(s, act[i], SRV_END_ABORTED, "the server stopped");
  gauges(s);
  pthread_mutex_unlock(&s->mu);
  free(act);
  return NULL;
}

/* For the ranks' engine thread (serve/ranks.c), which ends requests and
 * grows their text the same way. */
void srv_end_req(struct srv *s, struct srv_req *r, enum srv_end end, const char *why) { end_req(s, r, end, why); }
struct srv_req *srv_pop(struct srv *s) {
  struct srv_req *r = s->q_head;
  s->q_head = r->next;
  if (!s->q_head) s->q_tail = NULL;
  r->next = NULL;
  s->n_queued--;
  s->m.waiting--;
  return r;
}

void srv_tout_open(struct srv *s, struct srv_req *r) {
  memset(&r->tout, 0, sizeof r->tout);
  r->tout.tok = s->text.tok;
  r->tout.eos_id = s->text.eos_id;
  r->tout.stops = (const char *const *)r->prm.stop;
  r->tout.n_stops = r->prm.n_stop;
  r->tout.emit = emit;
  r->tout.user = r;
  text_out_init(&r->tout);
  r->tout_live = true;
}
