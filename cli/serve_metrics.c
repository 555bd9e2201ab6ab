/* serve_metrics.c: vLLM benchmark_serving's metrics over one run's
 * requests (serve_metrics.h says what each one is), for serve-sim and
 * bench serve alike.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "cli/serve_metrics.h"

void sm_init(struct sm_run *m, int64_t n) {
  memset(m, 0, sizeof *m);
  size_t k = (size_t)(n > 0 ? n : 1);
  m->n = n;
  m->ttft = cedar_xmalloc(sizeof(double) * k);
  m->tpot = cedar_xmalloc(sizeof(double) * k);
  m->e2el = cedar_xmalloc(sizeof(double) * k);
  m->cap_itl = 64;
  m->itl = cedar_xmalloc(sizeof(double) * (size_t)m->cap_itl);
}

void sm_free(struct sm_run *m) {
  free(m->ttft), free(m->tpot), free(m->e2el), free(m->itl);
  memset(m, 0, sizeof *m);
}

void sm_add(struct sm_run *m, double t0, const double *t, int64_t n_ev, int64_t in_tok, int64_t out_tok,
            const struct sm_slo *slo, struct sm_req *out) {
  double f = 1e3 * (t[0] - t0), l = 1e3 * (t[n_ev - 1] - t0);
  double tp = out_tok > 1 ? (l - f) / (double)(out_tok - 1) : 0;
  m->ttft[m->n_done] = f, m->e2el[m->n_done] = l;
  if (out_tok > 1) m->tpot[m->n_tpot++] = tp;
  if (m->n_itl + n_ev > m->cap_itl) {
    while (m->n_itl + n_ev > m->cap_itl) m->cap_itl *= 2;
    m->itl = cedar_xrealloc(m->itl, sizeof(double) * (size_t)m->cap_itl);
  }
  for (int64_t k = 1; k < n_ev; k++) m->itl[m->n_itl++] = 1e3 * (t[k] - t[k - 1]);
  bool ok = (slo->ttft < 0 || f <= slo->ttft) && (slo->tpot < 0 || tp <= slo->tpot) && (slo->e2el < 0 || l <= slo->e2el);
  m->good += ok, m->n_done++, m->in_tok += in_tok, m->out_tok += out_tok;
  if (out) *out = (struct sm_req){.ttft = f, .tpot = tp, .e2el = l, .good = ok};
}

void sm_fail(struct sm_run *m) { m->failed++; }

static int cmp_d(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

double sm_pct(const double *v, int64_t n, double p) {
  if (!n) return 0;
  double r = p / 100.0 * (double)(n - 1);
  int64_t lo = (int64_t)floor(r), hi = lo + 1 < n ? lo + 1 : lo;
  return v[lo] + (v[hi] - v[lo]) * (r - (double)lo);
}

/* mean, median, std and the percentiles of v (ms) into obj as <stat>_<name>_ms. */
static void stats_into(cJSON *obj, const char *name, double *v, int64_t n, const double *pct, int n_pct, FILE *txt) {
  qsort(v, (size_t)n, sizeof(double), cmp_d);
  double mean = 0, var = 0;
  for (int64_t i = 0; i < n; i++) mean += v[i];
  mean = n ? mean / (double)n : 0;
  for (int64_t i = 0; i < n; i++) var += (v[i] - mean) * (v[i] - mean);
  double sd = n ? sqrt(var / (double)n) : 0;
  char key[48];
  snprintf(key, sizeof key, "mean_%s_ms", name), cJSON_AddNumberToObject(obj, key, mean);
  snprintf(key, sizeof key, "median_%s_ms", name), cJSON_AddNumberToObject(obj, key, sm_pct(v, n, 50));
  snprintf(key, sizeof key, "std_%s_ms", name), cJSON_AddNumberToObject(obj, key, sd);
  if (txt) fprintf(txt, "  %-5s ms: mean %9.2f  median %9.2f", name, mean, sm_pct(v, n, 50));
  for (int k = 0; k < n_pct; k++) {
    snprintf(key, sizeof key, "p%g_%s_ms", pct[k], name);
    cJSON_AddNumberToObject(obj, key, sm_pct(v, n, pct[k]));
    if (txt) fprintf(txt, "  p%-4g %9.2f", pct[k], sm_pct(v, n, pct[k]));
  }
  if (txt) fprintf(txt, "\n");
}

void sm_totals(struct sm_run *m, double dur, const double *pct, int n_pct, cJSON *t, FILE *txt) {
  double done = (double)m->n_done, in = (double)m->in_tok, out = (double)m->out_tok, good = (double)m->good;
  cJSON_AddNumberToObject(t, "completed", done);
  cJSON_AddNumberToObject(t, "failed", (double)m->failed);
  cJSON_AddNumberToObject(t, "requests", (double)m->n);
  cJSON_AddNumberToObject(t, "total_input_tokens", in);
  cJSON_AddNumberToObject(t, "total_output_tokens", out);
  cJSON_AddNumberToObject(t, "duration", dur);
  cJSON_AddNumberToObject(t, "request_throughput", dur > 0 ? done / dur : 0);
  cJSON_AddNumberToObject(t, "request_goodput", dur > 0 ? good / dur : 0);
  cJSON_AddNumberToObject(t, "good_requests", good);
  cJSON_AddNumberToObject(t, "output_throughput", dur > 0 ? out / dur : 0);
  cJSON_AddNumberToObject(t, "total_token_throughput", dur > 0 ? (in + out) / dur : 0);
  cJSON *pc = cJSON_AddArrayToObject(t, "percentiles");
  for (int k = 0; k < n_pct; k++) cJSON_AddItemToArray(pc, cJSON_CreateNumber(pct[k]));
  stats_into(t, "ttft", m->ttft, m->n_done, pct, n_pct, txt);
  stats_into(t, "tpot", m->tpot, m->n_tpot, pct, n_pct, txt);
  stats_into(t, "itl", m->itl, m->n_itl, pct, n_pct, txt);
  stats_into(t, "e2el", m->e2el, m->n_done, pct, n_pct, txt);
  if (txt) /* a failed request is not good, and counts in the total */
    fprintf(txt, "  throughput: %.2f req/s, %.1f output tok/s, %.1f total tok/s; goodput %.2f req/s (%lld of %lld "
            "requests within their SLOs, %lld failed)\n", dur > 0 ? done / dur : 0, dur > 0 ? out / dur : 0,
            dur > 0 ? (in + out) / dur : 0, dur > 0 ? good / dur : 0, (long long)m->good, (long long)m->n,
            (long long)m->failed);
}

int sm_parse_percentiles(const char *arg, double pct[SM_MAX_PCT]) {
  char buf[128], *save = NULL;
  if (snprintf(buf, sizeof buf, "%s", arg) >= (int)sizeof buf) return 0;
  int n = 0;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    char *end;
    double p = strtod(t, &end);
    if (*end || end == t || !(p > 0 && p < 100) || n == SM_MAX_PCT) return 0;
    pct[n++] = p;
  }
  return n;
}
