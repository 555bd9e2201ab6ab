/* serve_metrics.h: the serving metrics under vLLM benchmark_serving's
 * names, shared by `cedar serve-sim --max-batch` (cli/serve_sim_batch.c,
 * simulated arrivals against measured compute) and `cedar bench serve`
 * (cli/cmd_bench_serve.c, a real load client over HTTP): TTFT, TPOT, ITL
 * and E2EL (mean, median, std and percentiles, ms), request and token
 * throughput, and goodput under each request's SLOs.
 *
 * Definitions (one request, times in seconds from its arrival t0, its token
 * events t[0..n_ev) in order): TTFT = t[0] - t0; E2EL = t[n_ev-1] - t0;
 * TPOT = (E2EL - TTFT) / (out_tokens - 1) for requests of 2+ tokens; ITL =
 * every gap t[k] - t[k-1]. serve-sim has one event per token; an HTTP
 * stream has one per server-sent event, which may carry more than one
 * token (vLLM counts its ITL the same way). A request is good when each
 * SLO it carries holds; a failed request is never good but counts in the
 * goodput's request total. Percentiles interpolate linearly between
 * closest ranks (numpy.percentile's default).
 * Test: tests/cli/serve_sim_metrics.py recomputes serve-sim's totals from
 * its --json rows; tests/cli/bench_serve.sh does the same for bench serve.
 */
#ifndef CEDAR_CLI_SERVE_METRICS_H
#define CEDAR_CLI_SERVE_METRICS_H

#include <cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* A request's SLOs in ms (< 0: none). */
struct sm_slo {
  double ttft, tpot, e2el;
};

/* One finished request's metrics (ms). */
struct sm_req {
  double ttft, tpot, e2el;
  bool good;
};

/* The samples of one run. */
struct sm_run {
  double *ttft, *tpot, *itl, *e2el;
  int64_t n, n_done, n_tpot, n_itl, cap_itl;
  int64_t good, failed, in_tok, out_tok;
};

/* Room for n requests. */
void sm_init(struct sm_run *m, int64_t n);
void sm_free(struct sm_run *m);

/* A request that finished: arrival t0, n_ev >= 1 event times t (s), its
 * prompt and output tokens, its SLOs; its metrics into *out (may be NULL). */
void sm_add(struct sm_run *m, double t0, const double *t, int64_t n_ev, int64_t in_tok, int64_t out_tok,
            const struct sm_slo *slo, struct sm_req *out);
/* A request that failed. */
void sm_fail(struct sm_run *m);

/* Percentile p (0..100) of sorted v[n]. */
double sm_pct(const double *v, int64_t n, double p);

/* The totals into obj under vLLM's names (completed, failed, requests,
 * total_input_tokens, total_output_tokens, duration, request_throughput,
 * request_goodput, good_requests, output_throughput, total_token_throughput,
 * percentiles, <stat>_<metric>_ms); with txt, the same as four metric lines
 * and a throughput line. Sorts m's samples. */
/* --percentiles' comma-separated list into pct (at most SM_MAX_PCT, each in
 * (0, 100), at least one): its count, or 0 when the list is not that. */
#define SM_MAX_PCT 16
int sm_parse_percentiles(const char *arg, double pct[SM_MAX_PCT]);
void sm_totals(struct sm_run *m, double duration, const double *pct, int n_pct, cJSON *obj, FILE *txt);

#endif
