/* metrics.h: cedar serve's Prometheus metrics (GET /metrics, text format
 * 0.0.4): request counts by outcome, TTFT, ITL and end-to-end latency
 * histograms, running and waiting requests, KV pages and prefix-cache use,
 * prefix-hit and token counters. docs/serving.md lists every name.
 *
 * Plain data under the server's lock: the engine thread observes, an HTTP
 * thread renders. Not here: speculative acceptance (the batching loop runs
 * no drafter, so there is nothing to count; docs/serving.md says so).
 * Test: tests/cli/serve.sh (counts after known requests; the histogram
 * invariants: cumulative buckets, +Inf = _count).
 */
#ifndef CEDAR_SERVE_METRICS_H
#define CEDAR_SERVE_METRICS_H

#include <stddef.h>
#include <stdint.h>

enum srv_outcome {
  SRV_OK = 0,        /* answered in full */
  SRV_BAD_REQUEST,   /* 400, 404, 413 */
  SRV_UNAUTHORIZED,  /* 401 */
  SRV_REJECTED,      /* 429: the queue was full */
  SRV_FAILED,        /* 500: non-finite logits, out of pages */
  SRV_CANCELLED,     /* the client left before the end */
  SRV_ABORTED,       /* the drain deadline passed, or 503 while draining */
  SRV_OUTCOME_COUNT
};

#define SRV_HIST_MAX 16

struct srv_hist {
  int n;                       /* bucket bounds (seconds), ascending */
  double le[SRV_HIST_MAX];
  uint64_t bucket[SRV_HIST_MAX]; /* observations <= le[i] (not cumulative here) */
  uint64_t count;
  double sum;
};

struct srv_metrics {
  uint64_t requests[SRV_OUTCOME_COUNT];
  struct srv_hist ttft, itl, e2e;
  int64_t running, waiting;    /* gauges, after the last step */
  int64_t kv_pages_in_use;     /* every pool's pages held (requests and the cache) */
  int64_t cache_bytes, cache_capacity_bytes, cache_blocks; /* -1: no prefix cache */
  uint64_t prefix_hit_tokens;  /* prompt tokens served from the cache */
  uint64_t prompt_tokens, generation_tokens;
  uint64_t steps;
  int64_t max_running;         /* requests the engine runs at once (1 under mpirun: one at a time) */
  int64_t ranks;               /* the MPI ranks computing (1: this process alone) */
};

void srv_metrics_init(struct srv_metrics *m);
void srv_hist_observe(struct srv_hist *h, double seconds);
/* The exposition text, malloc'ed (*len bytes). */
char *srv_metrics_render(const struct srv_metrics *m, size_t *len);
const char *srv_outcome_name(enum srv_outcome o);

#endif
