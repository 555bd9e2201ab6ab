/* cmd_bench_serve.c: `cedar bench serve`, a load client for an
 * OpenAI-compatible server on this machine (`cedar serve`, or any server of
 * that API), reporting vLLM benchmark_serving's metrics through the code
 * serve-sim reports them with (cli/serve_metrics.h).
 *
 * K synthetic requests (prompts of random token ids, POST /v1/completions
 * with "stream": true) are sent at Poisson arrivals (--rate) or all at
 * once, with at most C in flight (--concurrency), over libcurl's multi
 * interface on one thread. Each stream is parsed event by event as it comes
 * in: the time of each server-sent event that carries text is a token event
 * (TTFT, ITL), the usage chunk gives the output token count (TPOT), `data:
 * [DONE]` ends it. A request is timed from when it is sent, as vLLM times
 * it.
 *
 * Safety: the URL must name a loopback address literally (127.0.0.0/8 or
 * [::1]) over http; no proxy, no redirects. Every loop is bounded: K is at
 * most 1,000,000, the whole run stops at --timeout-s (what has not finished
 * fails, named), one event is at most 1 MiB and one response 64 MiB.
 * Test: tests/cli/bench_serve.sh; docs/serving.md "cedar bench serve".
 */
#include <arpa/inet.h>
#include <cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "cli/cli.h"
#include "cli/serve_metrics.h"
#include "ops/sample.h"

static const char usage[] =
    "usage: cedar bench serve --url http://127.0.0.1:PORT [--num-prompts K] [--rate R] [--concurrency C]\n"
    "                         [--prompt-len A[:B]] [--max-new A[:B]] [--vocab V] [--seed S] [--temperature T]\n"
    "                         [--model NAME] [--api-key K] [--slo-ttft-ms X] [--slo-tpot-ms X] [--slo-e2el-ms X]\n"
    "                         [--percentiles 50,90,99] [--timeout-s S] [--trace FILE] [--json]\n"
    "A load client for an OpenAI-compatible server on this machine (`cedar serve`; docs/serving.md):\n"
    "K streamed POST /v1/completions requests of random token-id prompts, and vLLM benchmark_serving's\n"
    "metrics as the client sees them, computed by the code `cedar serve-sim` reports with.\n"
    "  --url U            the server's base URL: http, and a loopback address written out (127.x.x.x or\n"
    "                     [::1]); anything else is refused, names are not resolved\n"
    "  --num-prompts K    requests (default 16; at most 1000000)\n"
    "  --rate R           Poisson arrivals at R requests per second (default: all at once)\n"
    "  --concurrency C    at most C requests in flight (default: no limit)\n"
    "  --prompt-len A:B   prompt tokens, drawn per request in [A, B] (default 32)\n"
    "  --max-new A:B      max_tokens, drawn per request in [A, B] (default 16); a request may end sooner\n"
    "                     (EOS, stop): its output tokens are the server's usage count\n"
    "  --vocab V          prompt ids are drawn in [0, V) (default 256: inside every cedar plan's vocabulary)\n"
    "  --seed S           the draws above, and request i's sampling seed S + i (default 0)\n"
    "  --temperature T    sampling temperature sent (default 0: greedy)\n"
    "  --model NAME       the model field sent (default: none, the server's own)\n"
    "  --api-key K        sent as Authorization: Bearer K\n"
    "  --slo-*-ms X       a request is good when its TTFT, TPOT and E2EL are each within the SLOs given;\n"
    "                     goodput = good requests / duration\n"
    "  --percentiles L    percentiles reported (default 50,90,99; linear interpolation)\n"
    "  --timeout-s S      the whole run's limit (default 600); requests not finished by then fail\n"
    "  --trace FILE       the requests from a serve-sim trace (JSON lines {\"arrival_s\", \"tokens\": [...],\n"
    "                     \"max_new\", \"slo_ttft_ms\", \"slo_tpot_ms\", \"slo_e2el_ms\"}): the same workload\n"
    "                     `cedar serve-sim --trace FILE` replays (then --num-prompts, --rate, --prompt-len,\n"
    "                     --max-new and --vocab do not apply)\n"
    "  --json             one JSON object per request (its event times, metrics), then {\"totals\": {...}}\n"
    "Metrics (vLLM's names): ttft (sent to the first event with text), tpot ((e2el - ttft) /\n"
    "(output tokens - 1)), itl (every gap between consecutive text events: an event may carry more\n"
    "than one token, as in vLLM), e2el (sent to the last text event); throughputs over the run's\n"
    "duration. Exit status 1 when any request failed (each is named on stderr), 2 on a usage error.\n";

#define BS_MAX_EVENT ((size_t)1 << 20)
#define BS_MAX_BODY ((size_t)64 << 20)

struct bsopts {
  const char *url, *model, *api_key, *trace;
  int64_t n, plen_lo, plen_hi, new_lo, new_hi, vocab, conc;
  uint64_t seed;
  double rate, temperature, timeout_s;
  struct sm_slo slo;
  double pct[SM_MAX_PCT];
  int n_pct;
  bool json;
};

enum bs_state { BS_PENDING = 0, BS_RUNNING, BS_OK, BS_FAILED };

struct breq {
  int64_t i;
  double arrive;        /* planned, s after the run's start */
  double t_sent;        /* monotonic */
  int64_t plen, max_new;
  struct sm_slo slo;
  char *body;
  CURL *h;
  struct curl_slist *hdr;
  enum bs_state state;
  long status;          /* HTTP status, read at the first bytes */
  char *buf;            /* bytes of the stream not yet parsed (or an error body) */
  size_t len, cap, total;
  double *t_ev;         /* monotonic times of the text events */
  int64_t n_ev, cap_ev;
  int64_t out_tok;      /* usage.completion_tokens; -1 before */
  double t_finish;      /* the event with finish_reason */
  bool done;            /* data: [DONE] seen */
  char err[256];
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool parse_pos(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || end == s || !isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

/* The URL's host is a loopback address written out; http; no user, query
 * or path beyond "/". Returns true, or false with why. */
static bool loopback_url(const char *url, char *why, size_t n) {
  CURLU *u = curl_url();
  char *scheme = NULL, *host = NULL, *user = NULL, *query = NULL, *path = NULL;
  bool ok = false;
  if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK) {
    snprintf(why, n, "not a URL (write it as http://127.0.0.1:8000)");
  } else {
    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0);
    curl_url_get(u, CURLUPART_HOST, &host, 0);
    curl_url_get(u, CURLUPART_USER, &user, 0);
    curl_url_get(u, CURLUPART_QUERY, &query, 0);
    curl_url_get(u, CURLUPART_PATH, &path, 0);
    char h[64] = "";
    snprintf(h, sizeof h, "%s", host ? host : "");
    size_t hl = strlen(h);
    bool v6 = hl > 2 && h[0] == '[' && h[hl - 1] == ']';
    if (v6) memmove(h, h + 1, hl - 2), h[hl - 2] = 0;
    struct in_addr a4;
    struct in6_addr a6;
    bool loop = v6 ? inet_pton(AF_INET6, h, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6)
                   : inet_pton(AF_INET, h, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127;
    if (!scheme || strcmp(scheme, "http"))
      snprintf(why, n, "only http is spoken (a server on this machine needs no TLS)");
    else if (!loop)
      snprintf(why, n, "the host %s is not a loopback address written out: bench serve sends only to this machine "
               "(127.0.0.1 or [::1]; names are not resolved)", host ? host : "(none)");
    else if (user || query || (path && strcmp(path, "/") && *path))
      snprintf(why, n, "give the base URL only (http://127.0.0.1:PORT): requests go to /v1/completions under it");
    else
      ok = true;
  }
  curl_free(scheme), curl_free(host), curl_free(user), curl_free(query), curl_free(path);
  curl_url_cleanup(u);
  return ok;
}

static int parse(int argc, char **argv, struct bsopts *o) {
  static const struct option opts[] = {
      {"url", required_argument, NULL, 'u'},          {"num-prompts", required_argument, NULL, 'n'},
      {"rate", required_argument, NULL, 'r'},         {"concurrency", required_argument, NULL, 'c'},
      {"prompt-len", required_argument, NULL, 'L'},   {"max-new", required_argument, NULL, 'N'},
      {"vocab", required_argument, NULL, 'V'},        {"seed", required_argument, NULL, 's'},
      {"temperature", required_argument, NULL, 't'},  {"model", required_argument, NULL, 'm'},
      {"api-key", required_argument, NULL, 'k'},      {"slo-ttft-ms", required_argument, NULL, 'F'},
      {"slo-tpot-ms", required_argument, NULL, 'P'},  {"slo-e2el-ms", required_argument, NULL, 'E'},
      {"percentiles", required_argument, NULL, 'p'},  {"timeout-s", required_argument, NULL, 'T'},
      {"json", no_argument, NULL, 'j'},               {"help", no_argument, NULL, 'h'},
      {"trace", required_argument, NULL, 'R'},
      {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->n = 16, o->plen_lo = o->plen_hi = 32, o->new_lo = o->new_hi = 16, o->vocab = 256, o->conc = 0;
  o->timeout_s = 600, o->slo = (struct sm_slo){-1, -1, -1};
  o->pct[0] = 50, o->pct[1] = 90, o->pct[2] = 99, o->n_pct = 3;
  int64_t v;
  optind = 1;
  opterr = 0;
  for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
    switch (c) {
    case 'u': o->url = optarg; break;
    case 'n':
      if (!cli_parse_int(optarg, 1, 1000000, &o->n)) return cli_usage_error("bench serve", "--num-prompts takes 1..1000000");
      break;
    case 'r':
      if (!parse_pos(optarg, 1e-6, 1e9, &o->rate)) return cli_usage_error("bench serve", "--rate takes requests per second in [1e-6, 1e9]");
      break;
    case 'c':
      if (!cli_parse_int(optarg, 1, 1 << 20, &o->conc)) return cli_usage_error("bench serve", "--concurrency takes 1..1048576");
      break;
    case 'L':
      if (!cli_parse_range(optarg, 1, 1 << 24, &o->plen_lo, &o->plen_hi))
        return cli_usage_error("bench serve", "--prompt-len takes A or A:B with 1 <= A <= B");
      break;
    case 'N':
      if (!cli_parse_range(optarg, 1, 1 << 24, &o->new_lo, &o->new_hi))
        return cli_usage_error("bench serve", "--max-new takes A or A:B with 1 <= A <= B");
      break;
    case 'V':
      if (!cli_parse_int(optarg, 1, INT32_MAX, &o->vocab)) return cli_usage_error("bench serve", "--vocab takes 1..2147483647");
      break;
    case 's':
      if (!cli_parse_int(optarg, 0, INT64_MAX, &v)) return cli_usage_error("bench serve", "--seed takes an integer >= 0");
      o->seed = (uint64_t)v;
      break;
    case 't':
      if (!parse_pos(optarg, 0, 100, &o->temperature)) return cli_usage_error("bench serve", "--temperature takes 0..100");
      break;
    case 'm': o->model = optarg; break;
    case 'k': o->api_key = optarg; break;
    case 'F': case 'P': case 'E': {
      double *d = c == 'F' ? &o->slo.ttft : c == 'P' ? &o->slo.tpot : &o->slo.e2el;
      if (!parse_pos(optarg, 1e-9, 1e12, d)) return cli_usage_error("bench serve", "%s takes milliseconds > 0", argv[optind - 1]);
      break;
    }
    case 'p':
      if (!(o->n_pct = sm_parse_percentiles(optarg, o->pct))) return cli_usage_error("bench serve", "--percentiles takes up to 16 numbers in (0, 100), comma-separated");
      break;
    case 'T':
      if (!parse_pos(optarg, 0.001, 86400, &o->timeout_s)) return cli_usage_error("bench serve", "--timeout-s takes 0.001..86400 seconds");
      break;
    case 'j': o->json = true; break;
    case 'R': o->trace = optarg; break;
    case 'h': fputs(usage, stdout); return 0;
    case ':': return cli_usage_error("bench serve", "%s needs a value", argv[optind - 1]);
    default: return cli_usage_error("bench serve", "unknown option '%s' (cedar bench serve --help)", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("bench serve", "unexpected argument '%s'", argv[optind]);
  if (!o->url) return cli_usage_error("bench serve", "--url is required (the server's base URL, e.g. http://127.0.0.1:8000)");
  char why[256];
  if (!loopback_url(o->url, why, sizeof why)) return cli_usage_error("bench serve", "--url %s: %s", o->url, why);
  return -1;
}

/* ---- one request ------------------------------------------------------------------ */

__attribute__((format(printf, 2, 3))) static void fail(struct breq *r, const char *fmt, ...) {
  if (r->state == BS_FAILED) return;
  r->state = BS_FAILED;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err, sizeof r->err, fmt, ap);
  va_end(ap);
}

/* One server-sent event's data. */
static void on_event(struct breq *r, const char *data, double t) {
  if (!strcmp(data, "[DONE]")) {
    r->done = true;
    return;
  }
  cJSON *j = cJSON_Parse(data);
  if (!j) return fail(r, "the server sent an event that is not JSON: %.80s", data);
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
  const cJSON *em = e ? cJSON_GetObjectItemCaseSensitive(e, "message") : NULL;
  if (e) fail(r, "an error event: %.160s", cJSON_IsString(em) ? em->valuestring : "(no message)");
  const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
  const cJSON *text = ch ? cJSON_GetObjectItemCaseSensitive(ch, "text") : NULL;
  const cJSON *fin = ch ? cJSON_GetObjectItemCaseSensitive(ch, "finish_reason") : NULL;
  if (cJSON_IsString(text) && text->valuestring[0]) {
    if (r->n_ev == r->cap_ev)
      r->t_ev = cedar_xrealloc(r->t_ev, sizeof(double) * (size_t)(r->cap_ev = r->cap_ev ? 2 * r->cap_ev : 32));
    r->t_ev[r->n_ev++] = t;
  }
  if (cJSON_IsString(fin)) r->t_finish = t;
  const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
  const cJSON *ct = u ? cJSON_GetObjectItemCaseSensitive(u, "completion_tokens") : NULL;
  if (cJSON_IsNumber(ct) && ct->valuedouble >= 0) r->out_tok = (int64_t)ct->valuedouble;
  cJSON_Delete(j);
}

/* The complete events in r->buf ("\n\n"-ended; "data:" lines joined by
 * newlines, as the SSE format says), the rest kept for the next bytes. */
static void parse_events(struct breq *r, double t) {
  size_t start = 0;
  for (;;) {
    char *end = r->len > start ? strstr(r->buf + start, "\n\n") : NULL;
    if (!end) break;
    *end = 0;
    char *data = cedar_xmalloc((size_t)(end - (r->buf + start)) + 1);
    size_t dl = 0;
    for (char *line = r->buf + start; line && line < end;) {
      char *nl = strchr(line, '\n');
      if (nl) *nl = 0;
      if (!strncmp(line, "data:", 5)) {
        const char *v = line + 5 + (line[5] == ' ');
        if (dl) data[dl++] = '\n';
        memcpy(data + dl, v, strlen(v)), dl += strlen(v);
      }
      line = nl ? nl + 1 : NULL;
    }
    data[dl] = 0;
    if (dl) on_event(r, data, t);
    free(data);
    start = (size_t)(end - r->buf) + 2;
  }
  memmove(r->buf, r->buf + start, r->len - start);
  r->len -= start;
  r->buf[r->len] = 0;
}

static size_t on_bytes(char *p, size_t size, size_t nmemb, void *user) {
  struct breq *r = user;
  size_t n = size * nmemb;
  double t = now_s();
  if (!r->status) curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
  r->total += n;
  if (r->total > BS_MAX_BODY || r->len + n > BS_MAX_EVENT) {
    fail(r, "the response passed the limit on bytes (one event 1 MiB, the whole response 64 MiB)");
    return 0; /* curl ends the transfer */
  }
  if (r->len + n + 1 > r->cap) r->buf = cedar_xrealloc(r->buf, r->cap = (r->len + n + 1) * 2);
  memcpy(r->buf + r->len, p, n);
  r->len += n;
  r->buf[r->len] = 0;
  if (r->status == 200 && r->state != BS_FAILED) parse_events(r, t);
  return n;
}

/* Request i's body: the prompt's ids from tokens, or drawn from rng. */
static char *request_body(const struct bsopts *o, int64_t i, int64_t plen, int64_t max_new, const cJSON *tokens,
                          uint64_t *rng) {
  cJSON *j = cJSON_CreateObject();
  if (o->model) cJSON_AddStringToObject(j, "model", o->model);
  if (tokens) {
    cJSON_AddItemToObject(j, "prompt", cJSON_Duplicate(tokens, true));
  } else {
    cJSON *p = cJSON_AddArrayToObject(j, "prompt");
    for (int64_t k = 0; k < plen; k++)
      cJSON_AddItemToArray(p, cJSON_CreateNumber((double)(op_rng_next(rng) % (uint64_t)o->vocab)));
  }
  cJSON_AddNumberToObject(j, "max_tokens", (double)max_new);
  cJSON_AddNumberToObject(j, "temperature", o->temperature);
  cJSON_AddNumberToObject(j, "seed", (double)((o->seed + (uint64_t)i) & ((1ull << 53) - 1)));
  cJSON_AddBoolToObject(j, "stream", true);
  cJSON_AddBoolToObject(cJSON_AddObjectToObject(j, "stream_options"), "include_usage", true);
  char *s = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  return s;
}

static int64_t draw(uint64_t *s, int64_t lo, int64_t hi) { return lo + (int64_t)(op_rng_next(s) % (uint64_t)(hi - lo + 1)); }

/* The requests: sizes, bodies and arrivals from the seed. */
static struct breq *plan_requests(const struct bsopts *o) {
  struct breq *rq = cedar_xcalloc((size_t)o->n, sizeof *rq);
  uint64_t rng = o->seed * 0x9E3779B97F4A7C15ull + 1;
  double t = 0;
  for (int64_t i = 0; i < o->n; i++) {
    struct breq *r = &rq[i];
    r->i = i;
    r->plen = draw(&rng, o->plen_lo, o->plen_hi);
    r->max_new = draw(&rng, o->new_lo, o->new_hi);
    if (o->rate > 0) t += -log(1.0 - ((double)(op_rng_next(&rng) >> 11) + 0.5) / 9007199254740992.0) / o->rate;
    r->arrive = o->rate > 0 ? t : 0;
    r->out_tok = -1;
    r->slo = o->slo;
    r->body = request_body(o, i, r->plen, r->max_new, NULL, &rng);
  }
  return rq;
}

/* One trace line into r: NULL, or why it is refused. */
static const char *trace_line(const struct bsopts *o, const cJSON *j, int64_t i, double prev, struct breq *r) {
  static const char *const keys[] = {"arrival_s", "tokens", "max_new", "slo_ttft_ms", "slo_tpot_ms", "slo_e2el_ms"};
  if (!cJSON_IsObject(j)) return "not a JSON object";
  for (const cJSON *c = j->child; c; c = c->next) {
    size_t k = 0;
    while (k < sizeof keys / sizeof keys[0] && strcmp(c->string, keys[k])) k++;
    if (k == sizeof keys / sizeof keys[0])
      return "an unknown key (bench serve takes arrival_s, tokens, max_new, slo_ttft_ms, slo_tpot_ms, slo_e2el_ms; "
             "it sends ids, so prompt_len is not enough)";
  }
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "arrival_s"), *tok = cJSON_GetObjectItemCaseSensitive(j, "tokens");
  const cJSON *mn = cJSON_GetObjectItemCaseSensitive(j, "max_new");
  if (!cJSON_IsNumber(t) || !(t->valuedouble >= prev && t->valuedouble <= 1e9))
    return "\"arrival_s\" (seconds, 0..1e9, not below the line before) is required";
  if (!cJSON_IsArray(tok) || cJSON_GetArraySize(tok) < 1 || cJSON_GetArraySize(tok) > (1 << 24))
    return "\"tokens\" must be a non-empty array of ids";
  for (const cJSON *c = tok->child; c; c = c->next)
    if (!cJSON_IsNumber(c) || c->valuedouble < 0 || c->valuedouble > INT32_MAX || c->valuedouble != floor(c->valuedouble))
      return "\"tokens\" holds something that is not an id (a whole number >= 0)";
  if (!cJSON_IsNumber(mn) || mn->valuedouble < 1 || mn->valuedouble > (1 << 24) || mn->valuedouble != floor(mn->valuedouble))
    return "\"max_new\" (a whole number 1..16777216) is required";
  r->slo = o->slo;
  const char *slo_k[] = {"slo_ttft_ms", "slo_tpot_ms", "slo_e2el_ms"};
  double *slo_v[] = {&r->slo.ttft, &r->slo.tpot, &r->slo.e2el};
  for (int k = 0; k < 3; k++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, slo_k[k]);
    if (v && (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1e12))) return "an SLO takes milliseconds > 0";
    if (v) *slo_v[k] = v->valuedouble;
  }
  r->i = i, r->arrive = t->valuedouble, r->plen = cJSON_GetArraySize(tok), r->max_new = (int64_t)mn->valuedouble;
  r->out_tok = -1;
  r->body = request_body(o, i, r->plen, r->max_new, tok, NULL);
  return NULL;
}

/* The requests of --trace: one JSON object a line (blank lines counted),
 * at most 1,000,000; NULL with the line named on stderr. */
static struct breq *read_trace(struct bsopts *o) {
  size_t len;
  char *txt = cli_read_all("bench serve", o->trace, &len);
  if (!txt) return NULL;
  struct breq *rq = NULL;
  int64_t n = 0, cap = 0;
  long line = 0;
  const char *why = NULL;
  for (char *l = txt, *nl; l && !why && l < txt + len; l = nl ? nl + 1 : NULL) {
    nl = strchr(l, '\n');
    if (nl) *nl = '\0';
    line++;
    if (!l[strspn(l, " \t\r")]) continue;
    if (n == 1000000) {
      why = "more than 1000000 requests";
      break;
    }
    if (n == cap) rq = cedar_xrealloc(rq, sizeof *rq * (size_t)(cap = cap ? 2 * cap : 64));
    memset(&rq[n], 0, sizeof rq[n]);
    cJSON *j = cli_json_has_nul(l) ? NULL : cJSON_Parse(l);
    why = cli_json_has_nul(l) ? "a \\u0000 (NUL) in a string" : trace_line(o, j, n, n ? rq[n - 1].arrive : 0, &rq[n]);
    cJSON_Delete(j);
    if (!why) n++;
  }
  free(txt);
  if (!why && !n) why = "no requests in it", line = 0;
  if (why) {
    fprintf(stderr, "cedar bench serve: --trace %s:%ld: %s\n", o->trace, line, why);
    for (int64_t i = 0; i < n; i++) free(rq[i].body);
    free(rq);
    return NULL;
  }
  o->n = n;
  return rq;
}

static bool start(CURLM *m, const struct bsopts *o, const char *endpoint, struct breq *r, double deadline) {
  r->h = curl_easy_init();
  if (!r->h) return fail(r, "libcurl could not make a handle"), false;
  r->hdr = curl_slist_append(NULL, "Content-Type: application/json");
  if (o->api_key) {
    char *a = cedar_xmalloc(strlen(o->api_key) + 32);
    sprintf(a, "Authorization: Bearer %s", o->api_key);
    r->hdr = curl_slist_append(r->hdr, a);
    free(a);
  }
  long left_ms = (long)fmax(1, 1e3 * (deadline - now_s()));
  curl_easy_setopt(r->h, CURLOPT_URL, endpoint);
  curl_easy_setopt(r->h, CURLOPT_PROTOCOLS_STR, "http");
  curl_easy_setopt(r->h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(r->h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(r->h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(r->h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(r->h, CURLOPT_CONNECTTIMEOUT_MS, left_ms < 10000 ? left_ms : 10000L);
  curl_easy_setopt(r->h, CURLOPT_TIMEOUT_MS, left_ms);
  curl_easy_setopt(r->h, CURLOPT_HTTPHEADER, r->hdr);
  curl_easy_setopt(r->h, CURLOPT_POSTFIELDS, r->body);
  curl_easy_setopt(r->h, CURLOPT_WRITEFUNCTION, on_bytes);
  curl_easy_setopt(r->h, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(r->h, CURLOPT_PRIVATE, r);
  r->state = BS_RUNNING;
  r->t_sent = now_s();
  if (curl_multi_add_handle(m, r->h) != CURLM_OK) return fail(r, "libcurl could not start the request"), false;
  return true;
}

/* r's transfer ended with res: its outcome. */
static void finish(struct breq *r, CURLcode res) {
  if (r->state == BS_FAILED) return;
  if (res != CURLE_OK) return fail(r, "%s (curl %d)", curl_easy_strerror(res), (int)res);
  long st = 0;
  curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &st);
  if (st != 200) {
    char body[160];
    snprintf(body, sizeof body, "%.150s", r->buf ? r->buf : "");
    body[strcspn(body, "\r\n")] = 0;
    snprintf(r->err, sizeof r->err, "HTTP %ld: %s", st, body);
    r->state = BS_FAILED;
    return;
  }
  if (!r->done) return fail(r, "the stream ended before data: [DONE]");
  if (r->out_tok < 1) return fail(r, "no usage chunk with completion_tokens >= 1 came (stream_options.include_usage)");
  if (!r->n_ev) { /* every token's text was empty: the finishing event is when the client had them */
    r->t_ev = cedar_xmalloc(sizeof(double));
    r->t_ev[r->n_ev++] = r->t_finish > 0 ? r->t_finish : now_s();
  }
  r->state = BS_OK;
}

static void release(CURLM *m, struct breq *r) {
  if (r->h) curl_multi_remove_handle(m, r->h), curl_easy_cleanup(r->h);
  curl_slist_free_all(r->hdr);
  r->h = NULL, r->hdr = NULL;
  free(r->buf), free(r->body);
  r->buf = r->body = NULL;
  r->len = r->cap = 0;
}

/* Send every request at its arrival, at most o->conc in flight, until all
 * ended or the deadline; returns the run's duration. */
static double drive(const struct bsopts *o, struct breq *rq, const char *endpoint) {
  CURLM *m = curl_multi_init();
  double t0 = now_s(), deadline = t0 + o->timeout_s;
  int64_t next = 0, running = 0, ended = 0, conc = o->conc ? o->conc : o->n;
  double t_last = t0;
  while (ended < o->n) {
    double t = now_s();
    if (t >= deadline) break;
    while (next < o->n && running < conc && t0 + rq[next].arrive <= t) {
      struct breq *r = &rq[next++];
      if (start(m, o, endpoint, r, deadline)) running++;
      else release(m, r), ended++;
    }
    int still = 0;
    curl_multi_perform(m, &still);
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
      if (msg->msg != CURLMSG_DONE) continue;
      struct breq *r = NULL;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
      finish(r, msg->data.result);
      release(m, r);
      running--, ended++;
      t_last = now_s();
    }
    double wait = 0.1;
    if (next < o->n && running < conc) wait = fmin(wait, fmax(0, t0 + rq[next].arrive - now_s()));
    wait = fmin(wait, fmax(0, deadline - now_s()));
    if (ended < o->n) curl_multi_poll(m, NULL, 0, (int)ceil(1e3 * wait), NULL);
  }
  for (int64_t i = 0; i < o->n; i++) { /* past the deadline: what has not ended fails */
    struct breq *r = &rq[i];
    if (r->state == BS_PENDING || r->state == BS_RUNNING) {
      snprintf(r->err, sizeof r->err, "%s within --timeout-s %g", r->state == BS_PENDING ? "not sent" : "not finished",
               o->timeout_s);
      r->state = BS_FAILED;
      t_last = now_s();
    }
    release(m, r);
  }
  curl_multi_cleanup(m);
  return t_last - t0;
}

static void print_row(const struct breq *r, double t0, const struct sm_req *q) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "id", (double)r->i);
  cJSON_AddNumberToObject(j, "sent_s", r->t_sent - t0);
  cJSON_AddNumberToObject(j, "prompt_len", (double)r->plen);
  cJSON_AddNumberToObject(j, "max_tokens", (double)r->max_new);
  if (r->state == BS_OK) {
    cJSON_AddNumberToObject(j, "output_len", (double)r->out_tok);
    cJSON *tt = cJSON_AddArrayToObject(j, "event_times_s");
    for (int64_t k = 0; k < r->n_ev; k++) cJSON_AddItemToArray(tt, cJSON_CreateNumber(r->t_ev[k] - t0));
    cJSON_AddNumberToObject(j, "ttft_ms", q->ttft);
    cJSON_AddNumberToObject(j, "tpot_ms", q->tpot);
    cJSON_AddNumberToObject(j, "e2el_ms", q->e2el);
    cJSON_AddBoolToObject(j, "good", q->good);
  } else {
    cJSON_AddStringToObject(j, "error", r->err);
  }
  char *s = cJSON_PrintUnformatted(j);
  printf("%s\n", s);
  free(s);
  cJSON_Delete(j);
}

int cmd_bench_serve(int argc, char **argv) {
  struct bsopts o;
  int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  if (curl_global_init(CURL_GLOBAL_NOTHING) != CURLE_OK) {
    fprintf(stderr, "cedar bench serve: libcurl would not start\n");
    return 1;
  }
  char *endpoint = cedar_xmalloc(strlen(o.url) + 32);
  size_t ul = strlen(o.url);
  sprintf(endpoint, "%.*s/v1/completions", (int)(ul && o.url[ul - 1] == '/' ? ul - 1 : ul), o.url);
  struct breq *rq = o.trace ? read_trace(&o) : plan_requests(&o);
  if (!rq) {
    free(endpoint);
    curl_global_cleanup();
    return 1;
  }
  double t_begin = now_s();
  double dur = drive(&o, rq, endpoint);
  struct sm_run m;
  sm_init(&m, o.n);
  for (int64_t i = 0; i < o.n; i++) {
    struct breq *r = &rq[i];
    struct sm_req q = {0};
    if (r->state == BS_OK) sm_add(&m, r->t_sent, r->t_ev, r->n_ev, r->plen, r->out_tok, &r->slo, &q);
    else sm_fail(&m), fprintf(stderr, "cedar bench serve: request %" PRId64 " failed: %s\n", i, r->err);
    if (o.json) print_row(r, t_begin, &q);
  }
  cJSON *root = cJSON_CreateObject(), *t = cJSON_AddObjectToObject(root, "totals");
  FILE *txt = o.json ? NULL : stdout;
  cJSON_AddStringToObject(t, "url", o.url);
  if (o.rate > 0) cJSON_AddNumberToObject(t, "rate", o.rate); /* absent: all sent at once */
  cJSON_AddNumberToObject(t, "concurrency", (double)(o.conc ? o.conc : o.n));
  if (txt)
    printf("bench serve %s: %" PRId64 " requests (%" PRId64 " failed), %s, at most %" PRId64 " in flight, "
           "duration %.3f s (wall clock, streamed over HTTP)\n", endpoint, m.n_done, m.failed,
           o.rate > 0 ? "Poisson arrivals" : "all sent at once", o.conc ? o.conc : o.n, dur);
  sm_totals(&m, dur, o.pct, o.n_pct, t, txt);
  if (!txt) {
    char *s = cJSON_PrintUnformatted(root);
    printf("%s\n", s);
    free(s);
  }
  int failed = m.failed > 0;
  cJSON_Delete(root);
  sm_free(&m);
  for (int64_t i = 0; i < o.n; i++) free(rq[i].t_ev);
  free(rq);
  free(endpoint);
  curl_global_cleanup();
  return failed;
}
