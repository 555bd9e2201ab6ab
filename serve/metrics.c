/* metrics.c: cedar serve's Prometheus text (metrics.h). */
#include "serve/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"

static const char *const outcome_names[SRV_OUTCOME_COUNT] = {"ok",     "bad_request", "unauthorized", "rejected",
                                                             "failed", "cancelled",   "aborted"};

const char *srv_outcome_name(enum srv_outcome o) { return o < SRV_OUTCOME_COUNT ? outcome_names[o] : "?"; }

static void hist_init(struct srv_hist *h, const double *le, int n) {
  memset(h, 0, sizeof *h);
  h->n = n;
  memcpy(h->le, le, sizeof(double) * (size_t)n);
}

void srv_metrics_init(struct srv_metrics *m) {
  memset(m, 0, sizeof *m);
  /* vLLM's bucket bounds, cut to SRV_HIST_MAX */
  static const double ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10};
  static const double itl[] = {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                               0.4, 0.5, 0.75};
  static const double e2e[] = {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 60};
  hist_init(&m->ttft, ttft, 16);
  hist_init(&m->itl, itl, 16);
  hist_init(&m->e2e, e2e, 16);
  m->cache_bytes = m->cache_capacity_bytes = m->cache_blocks = -1;
}

void srv_hist_observe(struct srv_hist *h, double s) {
  for (int i = 0; i < h->n; i++)
    if (s <= h->le[i]) {
      h->bucket[i]++;
      break;
    }
  h->count++;
  h->sum += s;
}

struct out {
  char *s;
  size_t len, cap;
};

static void add(struct out *o, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(o->s + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < o->cap - o->len) {
      o->len += (size_t)n;
      return;
    }
    o->cap = o->cap * 2 + (size_t)(n > 0 ? n : 64);
    o->s = cedar_xrealloc(o->s, o->cap);
  }
}

static void hist(struct out *o, const char *name, const char *help, const struct srv_hist *h) {
  add(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cum = 0;
  for (int i = 0; i < h->n; i++) {
    cum += h->bucket[i];
    add(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
  }
  add(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)h->count, name, h->sum,
      name, (unsigned long long)h->count);
}

static void gauge(struct out *o, const char *name, const char *type, const char *help, double v) {
  add(o, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

char *srv_metrics_render(const struct srv_metrics *m, size_t *len) {
  struct out o = {cedar_xmalloc(4096), 0, 4096};
  o.s[0] = 0;
  add(&o, "# HELP cedar_requests_total Requests answered, by outcome.\n# TYPE cedar_requests_total counter\n");
  for (int i = 0; i < SRV_OUTCOME_COUNT; i++)
    add(&o, "cedar_requests_total{outcome=\"%s\"} %llu\n", outcome_names[i], (unsigned long long)m->requests[i]);
  hist(&o, "cedar_time_to_first_token_seconds", "From a request's arrival to its first token.", &m->ttft);
  hist(&o, "cedar_inter_token_latency_seconds", "Between consecutive tokens of a request.", &m->itl);
  hist(&o, "cedar_e2e_request_latency_seconds", "From a request's arrival to its end.", &m->e2e);
  gauge(&o, "cedar_requests_running", "gauge", "Requests in the batch (prefilling or decoding).", (double)m->running);
  gauge(&o, "cedar_requests_waiting", "gauge", "Requests queued for the batch.", (double)m->waiting);
  gauge(&o, "cedar_kv_pages_in_use", "gauge", "KV pages held, all pools (running requests and the prefix cache).",
        (double)m->kv_pages_in_use);
  if (m->cache_bytes >= 0) {
    gauge(&o, "cedar_prefix_cache_bytes", "gauge", "Bytes the prefix cache holds.", (double)m->cache_bytes);
    gauge(&o, "cedar_prefix_cache_capacity_bytes", "gauge", "The prefix cache's capacity (0: no limit).",
          (double)m->cache_capacity_bytes);
    gauge(&o, "cedar_prefix_cache_blocks", "gauge", "Blocks the prefix cache holds.", (double)m->cache_blocks);
  }
  gauge(&o, "cedar_prefix_cache_hit_tokens_total", "counter", "Prompt tokens whose state came from the prefix cache.",
        (double)m->prefix_hit_tokens);
  gauge(&o, "cedar_prompt_tokens_total", "counter", "Prompt tokens of requests that ran.", (double)m->prompt_tokens);
  gauge(&o, "cedar_generation_tokens_total", "counter", "Tokens generated.", (double)m->generation_tokens);
  gauge(&o, "cedar_engine_steps_total", "counter", "Batch steps the engine ran (under mpirun: requests run).",
        (double)m->steps);
  gauge(&o, "cedar_engine_max_running", "gauge",
        "Requests the engine runs at once (1 under mpirun: one at a time through the ranks, no batching).",
        (double)m->max_running);
  gauge(&o, "cedar_engine_ranks", "gauge", "MPI ranks computing (1: one process).", (double)m->ranks);
  *len = o.len;
  return o.s;
}
