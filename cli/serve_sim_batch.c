/* serve_sim_batch.c: `cedar serve-sim --max-batch N`: a serving simulation
 * of continuous batching (runtime/engine/batch.h, docs/serving.md). Requests
 * arrive by a Poisson process, in bursts or from a trace file, run through
 * one engine with at most N at a time, and the serving metrics come out
 * under vLLM's benchmark names: TTFT, TPOT, ITL and E2EL (mean, median,
 * std and the percentiles asked for, in ms), request and token throughput,
 * and goodput under each request's SLOs.
 *
 * Time is simulated arrivals against measured compute: arrival times are
 * drawn (or read) on a simulated clock; every step advances that clock by
 * the step's measured wall time; when nothing runs the clock jumps to the
 * next arrival (no sleeping). A request that arrives during a step joins at
 * the next step boundary. So the latencies are what this machine's compute
 * gives under that arrival pattern.
 *
 * With several N (--max-batch 1,8) the same workload runs once per N on the
 * same engine, and the summaries come side by side with the decode
 * throughput ratio to the first N.
 * Test: tests/cli/serve_sim_batch.sh (metrics recomputed from --json rows
 * by tests/cli/serve_sim_metrics.py).
 */
#include <cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "cli/bench.h"
#include "cli/weights_resident.h"
#include "cli/cli.h"
#include "cli/serve_metrics.h"
#include "cli/serve_sim_batch.h"
#include "ops/sample.h"
#include "runtime/engine/batch.h"
#include "runtime/dist/place_cost.h"
#include "runtime/engine/engine.h"

static const char usage[] =
    "usage: cedar serve-sim --max-batch N[,N...] [--plan P] [--weights W | --model DIR | --seed S]\n"
    "                       [--num-prompts K] [--prompt-len A[:B]] [--max-new A[:B]]\n"
    "                       [--rate R | --burst K --burst-every S | --trace FILE]\n"
    "                       [--slo-ttft-ms X] [--slo-tpot-ms X] [--slo-e2el-ms X] [--percentiles 50,90,99]\n"
    "                       [--step-tokens T] [--chunk C] [--no-cache] [--temperature T] [--floor] [--json]\n"
    "Continuous batching (docs/serving.md): at most N requests run at once; each step decodes one token\n"
    "of every running request, batched into the same op groups, and advances new requests' prefill under\n"
    "a token budget (serving.batch in the plan: step_tokens, chunk; --step-tokens and --chunk override).\n"
    "N = 1 is solo serving; several N run the same workload once each, side by side, without the\n"
    "prefix cache (the later runs would hit the first's prompts). Time: arrivals are simulated, compute is measured; each step advances the\n"
    "simulated clock by its measured wall time, and an idle engine jumps to the next arrival.\n"
    "  --num-prompts K    K synthetic requests (default 16); prompts of A..B tokens (default 32:256) and\n"
    "                     A..B new tokens (default 16), drawn from --seed\n"
    "  --rate R           Poisson arrivals at R requests per second (default: all at time 0)\n"
    "  --burst K          K requests arrive at once every --burst-every S seconds (default 1)\n"
    "  --trace FILE       JSON lines {\"arrival_s\", \"prompt_len\" | \"tokens\": [...], \"max_new\",\n"
    "                     \"slo_ttft_ms\", \"slo_tpot_ms\", \"slo_e2el_ms\"} (SLOs per request; the flags\n"
    "                     are the default for lines without them)\n"
    "  --slo-*-ms X       a request is good when its TTFT, TPOT (mean time per output token after the\n"
    "                     first) and E2EL are each within the SLOs given; goodput = good requests / duration\n"
    "  --percentiles L    percentiles reported (default 50,90,99; linear interpolation)\n"
    CLI_WEIGHTS_FORMAT_HELP
    "  --floor            measure this machine's memcpy peak and report each N's decode step time\n"
    "                     against its bytes floor: the weight bytes the step reads (every tensor but\n"
    "                     the embedding, Engram tables and routed experts, the B embedding rows, and\n"
    "                     each routed expert its MoE groups ran, once) in the plan's stored formats\n"
    "                     (plan cost's), over that peak; beside it the same bytes as the weights are\n"
    "                     held now; and routing's cap on batching: B x the first N's bytes a row over\n"
    "                     batch B's bytes\n"
    "  --json             one JSON object per request (its tokens, token times, metrics), then\n"
    "                     {\"totals\": {...}} with vLLM's metric names\n"
    "Metrics (vLLM's benchmark_serving names): ttft (arrival to first token), tpot ((e2el - ttft) /\n"
    "(tokens - 1), requests with 2+ tokens), itl (every gap between consecutive tokens), e2el (arrival\n"
    "to last token); request_throughput, output_throughput, total_token_throughput, request_goodput.\n";

struct arrival {
  double t;
  int64_t prompt_len;
  int32_t *tokens; /* or NULL: drawn from the seed */
  int max_new;
  double slo_ttft, slo_tpot, slo_e2el; /* ms; < 0: none */
};

struct bopts {
  const char *plan, *weights, *model, *trace;
  uint64_t seed;
  int max_batch[8], n_batch;
  int64_t requests, plen_lo, plen_hi, new_lo, new_hi;
  double rate, burst_every, temperature;
  bool burst_every_set;
  int64_t burst;
  double slo_ttft, slo_tpot, slo_e2el;
  double pct[SM_MAX_PCT];
  int n_pct;
  int step_tokens, chunk;
  bool no_cache, json, floor, weights_f32;
};

static bool parse_ms(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || end == s || !isfinite(v) || v <= 0) return false;
  *out = v;
  return true;
}

static int parse(int argc, char **argv, struct bopts *o) {
  static const struct option opts[] = {
      {"max-batch", required_argument, NULL, 'B'},   {"plan", required_argument, NULL, 'p'},
      {"weights", required_argument, NULL, 'w'},     {"model", required_argument, NULL, 'M'},
      {"seed", required_argument, NULL, 's'},        {"num-prompts", required_argument, NULL, 'r'},
      {"requests", required_argument, NULL, 'Q'},
      {"prompt-len", required_argument, NULL, 'l'},  {"max-new", required_argument, NULL, 'm'},
      {"rate", required_argument, NULL, 'R'},        {"burst", required_argument, NULL, 'k'},
      {"burst-every", required_argument, NULL, 'e'}, {"trace", required_argument, NULL, 't'},
      {"slo-ttft-ms", required_argument, NULL, 1},   {"slo-tpot-ms", required_argument, NULL, 2},
      {"slo-e2el-ms", required_argument, NULL, 3},   {"percentiles", required_argument, NULL, 'P'},
      {"step-tokens", required_argument, NULL, 'T'}, {"chunk", required_argument, NULL, 'c'},
      {"no-cache", no_argument, NULL, 'n'},          {"temperature", required_argument, NULL, 'u'},
      {"json", no_argument, NULL, 'j'},              {"help", no_argument, NULL, 'h'},
      {"floor", no_argument, NULL, 'F'},             {"weights-format", required_argument, NULL, 4},
      {0, 0, 0, 0}};
  memset(o, 0, sizeof(*o));
  o->requests = 16, o->plen_lo = 32, o->plen_hi = 256, o->new_lo = o->new_hi = 16;
  o->burst_every = 1;
  o->slo_ttft = o->slo_tpot = o->slo_e2el = -1;
  o->pct[0] = 50, o->pct[1] = 90, o->pct[2] = 99, o->n_pct = 3;
  int c;
  int64_t v;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'B': {
      char buf[128], *save = NULL;
      snprintf(buf, sizeof buf, "%s", optarg);
      o->n_batch = 0;
      for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_batch == 8 || !cli_parse_int(t, 1, 4096, &v))
          return cli_usage_error("serve-sim", "--max-batch takes N (1..4096) or up to 8 of them, comma-separated (got '%s')", optarg);
        o->max_batch[o->n_batch++] = (int)v;
      }
      if (!o->n_batch) return cli_usage_error("serve-sim", "--max-batch takes N >= 1");
      break;
    }
    case 'p': o->plan = optarg; break;
    case 'w': o->weights = optarg; break;
    case 'M': o->model = optarg; break;
    case 't': o->trace = optarg; break;
    case 4:
      if (!cli_parse_weights_format(optarg, &o->weights_f32))
        return cli_usage_error("serve-sim", "--weights-format takes stored or f32, not '%s'", optarg);
      break;
    case 's':
      if (!cli_parse_int(optarg, 0, INT32_MAX, &v)) return cli_usage_error("serve-sim", "--seed takes S >= 0");
      o->seed = (uint64_t)v;
      break;
    case 'r':
      if (!cli_parse_int(optarg, 1, 1 << 20, &o->requests)) return cli_usage_error("serve-sim", "--num-prompts takes K in 1..1048576");
      break;
    case 'Q':
      return cli_usage_error("serve-sim", "--requests FILE (the chat workload) runs without --max-batch; with it give "
                             "--trace FILE (arrival times, prompts, SLOs) or --num-prompts K");
    case 'l':
      if (!cli_parse_range(optarg, 1, 1 << 24, &o->plen_lo, &o->plen_hi))
        return cli_usage_error("serve-sim", "--prompt-len takes A or A:B with 1 <= A <= B (got '%s')", optarg);
      break;
    case 'm':
      if (!cli_parse_range(optarg, 1, 1 << 20, &o->new_lo, &o->new_hi))
        return cli_usage_error("serve-sim", "--max-new takes A or A:B with 1 <= A <= B (got '%s')", optarg);
      break;
    case 'R':
      if (!parse_ms(optarg, &o->rate) || o->rate < 1e-6 || o->rate > 1e9) /* the clock's range: ARRIVAL_MAX_S */
        return cli_usage_error("serve-sim", "--rate takes requests per second in [1e-6, 1e9] (got '%s')", optarg);
      break;
    case 'k':
      if (!cli_parse_int(optarg, 1, 1 << 20, &o->burst)) return cli_usage_error("serve-sim", "--burst takes K >= 1");
      break;
    case 'e':
      if (!parse_ms(optarg, &o->burst_every) || o->burst_every > 1e6)
        return cli_usage_error("serve-sim", "--burst-every takes seconds in (0, 1e6]");
      o->burst_every_set = true;
      break;
    case 1: case 2: case 3: {
      double *dst = c == 1 ? &o->slo_ttft : c == 2 ? &o->slo_tpot : &o->slo_e2el;
      if (!parse_ms(optarg, dst)) return cli_usage_error("serve-sim", "an SLO takes milliseconds > 0 (got '%s')", optarg);
      break;
    }
    case 'P':
      if (!(o->n_pct = sm_parse_percentiles(optarg, o->pct)))
        return cli_usage_error("serve-sim", "--percentiles takes up to 16 numbers in (0, 100), comma-separated (got '%s')", optarg);
      break;
    case 'T':
      if (!cli_parse_int(optarg, 1, 1 << 24, &v)) return cli_usage_error("serve-sim", "--step-tokens takes T >= 1");
      o->step_tokens = (int)v;
      break;
    case 'c':
      if (!cli_parse_int(optarg, 1, 1 << 24, &v)) return cli_usage_error("serve-sim", "--chunk takes C >= 1");
      o->chunk = (int)v;
      break;
    case 'u': {
      char *end;
      o->temperature = strtod(optarg, &end);
      if (*end || end == optarg || !(o->temperature >= 0 && o->temperature <= 100))
        return cli_usage_error("serve-sim", "--temperature takes T in [0, 100]");
      break;
    }
    case 'n': o->no_cache = true; break;
    case 'j': o->json = true; break;
    case 'F': o->floor = true; break;
    case 'h': printf("%s", usage); return 0;
    default: return cli_usage_error("serve-sim", "bad option, or an option without its value: '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("serve-sim", "unexpected argument '%s'", argv[optind]);
  if (!o->n_batch) return cli_usage_error("serve-sim", "--max-batch N is required here");
  if (o->model && o->weights) return cli_usage_error("serve-sim", "--model DIR is the weights; drop --weights");
  int modes = (o->rate > 0) + (o->burst > 0) + (o->trace != NULL);
  if (modes > 1) return cli_usage_error("serve-sim", "give one arrival process: --rate, --burst or --trace");
  if (o->burst_every_set && !o->burst) return cli_usage_error("serve-sim", "--burst-every goes with --burst K");
  if (o->json && o->n_batch > 1) return cli_usage_error("serve-sim", "--json takes one --max-batch N");
  return -1;
}

/* ---- arrivals ---------------------------------------------------------------- */

static double rng_unit(uint64_t *s) { return ((double)(op_rng_next(s) >> 11) + 0.5) / 9007199254740992.0; }

static int64_t draw(uint64_t *s, int64_t lo, int64_t hi) { return lo + (int64_t)(op_rng_next(s) % (uint64_t)(hi - lo + 1)); }

/* Arrival times stay below this (a trace's arrival_s too): a double then
 * resolves the clock to well under a microsecond, so latencies of
 * milliseconds are not lost in the arrival time's rounding. */
#define ARRIVAL_MAX_S 1e9

/* The synthetic workload: K requests, arrival times by the process; NULL
 * with a message when they run past ARRIVAL_MAX_S. */
static struct arrival *synth(const struct bopts *o, int64_t *n) {
  struct arrival *a = cedar_xcalloc((size_t)o->requests, sizeof(*a));
  uint64_t s = o->seed * 2654435761u + 17;
  double t = 0;
  for (int64_t i = 0; i < o->requests; i++) {
    if (o->rate > 0) t += -log(rng_unit(&s)) / o->rate; /* exponential gaps: a Poisson process */
    else if (o->burst > 0) t = (double)(i / o->burst) * o->burst_every;
    a[i] = (struct arrival){t, draw(&s, o->plen_lo, o->plen_hi), NULL, (int)draw(&s, o->new_lo, o->new_hi),
                            o->slo_ttft, o->slo_tpot, o->slo_e2el};
    if (!(t <= ARRIVAL_MAX_S)) {
      fprintf(stderr, "cedar serve-sim: request %" PRId64 " would arrive at %.3g s, past the %.0e s the simulated clock "
              "resolves to a microsecond: raise --rate or lower --num-prompts\n", i, t, ARRIVAL_MAX_S);
      free(a);
      return NULL;
    }
  }
  *n = o->requests;
  return a;
}

static bool num_of(const cJSON *j, const char *k, double lo, double hi, double *out, bool *given) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  *given = v != NULL;
  if (!v) return true;
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) return false;
  *out = v->valuedouble;
  return true;
}

/* num_of for a count: a whole number too (1.5 tokens is refused, not cut). */
static bool whole_of(const cJSON *j, const char *k, double lo, double hi, double *out, bool *given) {
  return num_of(j, k, lo, hi, out, given) && (!*given || *out == floor(*out));
}

/* A trace line's keys, as --requests checks its own (issue 28 row 14): an
 * unknown key (a typo such as "max_nwe") is refused, not ignored. NULL, or
 * the first unknown key. */
static const char *unknown_key(const cJSON *j) {
  static const char *const keys[] = {"arrival_s", "prompt_len", "tokens", "max_new", "slo_ttft_ms", "slo_tpot_ms",
                                     "slo_e2el_ms"};
  for (const cJSON *c = j->child; c; c = c->next) {
    size_t k = 0;
    while (k < sizeof keys / sizeof keys[0] && strcmp(c->string, keys[k])) k++;
    if (k == sizeof keys / sizeof keys[0]) return c->string;
  }
  return NULL;
}

/* A trace: one JSON object a line, arrival times non-decreasing. */
static struct arrival *read_trace(const struct bopts *o, int vocab, int64_t max_pos, int64_t *n) {
  size_t len;
  char *txt = cli_read_all("serve-sim", o->trace, &len);
  if (!txt) return NULL;
  struct arrival *a = NULL;
  int64_t cap = 0, k = 0;
  long line = 0;
  bool ok = true;
  double prev = 0;
  /* line by line, blank lines counted (strtok would skip them and misnumber) */
  for (char *l = txt, *nl; l && ok && l < txt + len; l = nl ? nl + 1 : NULL) {
    nl = strchr(l, '\n');
    if (nl) *nl = '\0';
    line++;
    if (!l[strspn(l, " \t\r")]) continue;
    cJSON *j = cli_json_has_nul(l) ? NULL : cJSON_Parse(l);
    const char *why = NULL, *bad_key = NULL;
    char key_why[256];
    double t = 0, pl = 0, mn = 16;
    bool g_t, g_pl, g_mn, g;
    struct arrival x = {0, 0, NULL, 0, o->slo_ttft, o->slo_tpot, o->slo_e2el};
    const cJSON *tok = j ? cJSON_GetObjectItemCaseSensitive(j, "tokens") : NULL;
    if (cli_json_has_nul(l)) why = "a \\u0000 (NUL) in a string: cedar's strings end at NUL; remove it";
    else if (!cJSON_IsObject(j)) why = "not a JSON object";
    else if ((bad_key = unknown_key(j)))
      snprintf(key_why, sizeof key_why, "unknown key \"%.60s\" (a trace line has arrival_s, prompt_len or tokens, "
               "max_new, slo_ttft_ms, slo_tpot_ms, slo_e2el_ms)", bad_key), why = key_why;
    else if (!num_of(j, "arrival_s", 0, ARRIVAL_MAX_S, &t, &g_t) || !g_t) why = "\"arrival_s\" (seconds >= 0) is required";
    else if (t < prev) why = "arrival times must not decrease";
    else if (!whole_of(j, "prompt_len", 1, (double)(1 << 24), &pl, &g_pl) || (g_pl == (tok != NULL)))
      why = "give one of \"prompt_len\" (a whole number 1..16777216) or \"tokens\"";
    else if (!whole_of(j, "max_new", 1, (double)(1 << 20), &mn, &g_mn)) why = "\"max_new\" takes a whole number 1..1048576";
    else if (!num_of(j, "slo_ttft_ms", 1e-9, 1e12, &x.slo_ttft, &g) || !num_of(j, "slo_tpot_ms", 1e-9, 1e12, &x.slo_tpot, &g) ||
             !num_of(j, "slo_e2el_ms", 1e-9, 1e12, &x.slo_e2el, &g))
      why = "an SLO takes milliseconds > 0";
    if (!why && tok) {
      int m = cJSON_IsArray(tok) ? cJSON_GetArraySize(tok) : 0;
      if (m < 1) why = "\"tokens\" must be a non-empty array of ids";
      x.tokens = m > 0 ? cedar_xmalloc(sizeof(int32_t) * (size_t)m) : NULL;
      int i = 0;
      const cJSON *e;
      cJSON_ArrayForEach(e, tok) {
        if (why) break;
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble >= vocab)
          why = "a token id is not a whole number in [0, vocab)";
        else
          x.tokens[i++] = (int32_t)e->valuedouble;
      }
      pl = m;
    }
    if (!why && pl + mn > (double)max_pos) why = "the prompt and max_new exceed the plan's positions";
    cJSON_Delete(j);
    if (why) {
      fprintf(stderr, "cedar serve-sim: %s:%ld: %s\n", o->trace, line, why);
      free(x.tokens);
      ok = false;
      break;
    }
    prev = t;
    x.t = t, x.prompt_len = (int64_t)pl, x.max_new = (int)mn;
    if (k == cap) a = cedar_xrealloc(a, sizeof(*a) * (size_t)(cap = cap ? 2 * cap : 64));
    a[k++] = x;
  }
  free(txt);
  if (ok && !k) fprintf(stderr, "cedar serve-sim: %s: no requests\n", o->trace), ok = false;
  if (!ok) {
    for (int64_t i = 0; i < k; i++) free(a[i].tokens);
    free(a);
    return NULL;
  }
  *n = k;
  return a;
}

/* ---- one run --------------------------------------------------------------------- */

struct run_sum {
  double decode_tok_s, decode_cpu_tok_s, duration, mean_step_s, decode_cpu_s;
  int64_t steps, decode_rows, decode_steps;
  double decode_s;
  double fam_s[RT_FAM_COUNT];
  long long decode_experts;
};

/* The weight bytes a decode step reads, by kind (--floor). */
struct step_bytes {
  double dense;      /* tensors a step reads whole */
  double expert;     /* one routed expert of one layer (gate, up, down) */
  double embed_row;  /* one embedding row */
  double total;      /* every tensor */
};

/* stored: each tensor's bytes in the released formats (rt_place_stored_bytes,
 * plan cost's table), else as the weights hold it (nbytes). Engram tables
 * are stored as held (their rows are the stored bytes). */
static void step_bytes_of(const struct weights_list *l, const struct plan *p, bool stored, struct step_bytes *sb) {
  double experts = 0, embed = 0, all = 0;
  int moe_layers = 0;
  for (size_t i = 0; i < l->n; i++) {
    const struct weights_spec *t = &l->t[i];
    double b = stored ? (double)rt_place_stored_bytes(t) : (double)t->nbytes;
    all += b;
    if (strstr(t->name, ".ffn.experts.")) experts += b, moe_layers += !!strstr(t->name, ".w_gate");
    else if (!strcmp(t->name, "embed")) embed = b;
  }
  sb->dense = all - experts - embed - (double)l->engram_bytes;
  sb->expert = moe_layers ? experts / ((double)moe_layers * p->model.n_routed) : 0;
  sb->embed_row = embed / p->model.vocab;
  sb->total = all;
}

static double step_bytes(const struct step_bytes *sb, double rows, double experts) {
  return sb->dense + experts * sb->expert + rows * sb->embed_row;
}

/* The batch of one run at --max-batch N. */
static struct rt_batch_opts batch_opts(const struct bopts *o, const struct rt_engine *e, int N) {
  const struct plan *p = &e->plan;
  struct rt_batch_opts bo = {.max_requests = N, .step_tokens = o->step_tokens, .chunk = o->chunk,
                             .temperature = (float)o->temperature, .top_p = 1, .cache = e->cache,
                             .save_snapshot = e->cache != NULL};
  if (bo.step_tokens <= 0) { /* the plan's budget, widened to hold N decode rows beside a chunk */
    int chunk = bo.chunk > 0 ? bo.chunk : p->serving.batch_chunk;
    bo.step_tokens = p->serving.batch_step_tokens >= chunk + N ? p->serving.batch_step_tokens : chunk + N;
  }
  return bo;
}

/* The arrivals through the batch on its simulated clock: each request
 * submitted at its arrival time (a prompt of random byte tokens when the
 * trace gives only its length), steps run until every one finished. The
 * handles, by arrival. */
static int64_t *replay(const struct bopts *o, struct rt_batch *b, const struct plan *p, const struct arrival *arr,
                       int64_t n) {
  char err[512];
  uint64_t s = o->seed * 40503u + 99;
  int32_t *buf = cedar_xmalloc(sizeof(int32_t) * 1024);
  size_t buf_cap = 1024;
  int64_t *h = cedar_xmalloc(sizeof(int64_t) * (size_t)n);
  int64_t next = 0;
  struct rt_batch_step st;
  while (next < n || rt_batch_pending(b)) {
    while (next < n && arr[next].t <= b->clock) {
      const struct arrival *a = &arr[next];
      const int32_t *prompt = a->tokens;
      if (!prompt) {
        if ((size_t)a->prompt_len > buf_cap) buf = cedar_xrealloc(buf, sizeof(int32_t) * (buf_cap = (size_t)a->prompt_len));
        int lim = p->model.vocab < 256 ? p->model.vocab : 256; /* byte tokens, as serve-sim gen draws them */
        for (int64_t i = 0; i < a->prompt_len; i++) buf[i] = (int32_t)(op_rng_next(&s) % (uint64_t)lim);
        prompt = buf;
      }
      double clock = b->clock;
      b->clock = a->t; /* stamped with its own arrival time */
      h[next] = rt_batch_submit(b, prompt, a->prompt_len, a->max_new, o->seed + (uint64_t)next, next, err, sizeof err);
      b->clock = clock;
      next++;
    }
    if (!rt_batch_pending(b)) {
      b->clock = arr[next].t; /* idle: jump to the next arrival */
      continue;
    }
    rt_batch_run_step(b, &st);
  }
  free(buf);
  return h;
}

static int run_one(const struct bopts *o, struct rt_engine *e, const struct arrival *arr, int64_t n, int N,
                   struct run_sum *sum) {
  const struct plan *p = &e->plan;
  char err[512];
  struct rt_batch b;
  struct rt_batch_opts bo = batch_opts(o, e, N);
  if (rt_batch_init(&b, &e->model, e->pools, &bo, err, sizeof err)) {
    fprintf(stderr, "cedar serve-sim: %s\n", err);
    return 1;
  }
  int64_t *h = replay(o, &b, p, arr, n);
  struct sm_run m;
  sm_init(&m, n);
  for (int64_t i = 0; i < n; i++) {
    const struct rt_bq *q = b.q[h[i]];
    if (q->state != RT_BQ_DONE) {
      sm_fail(&m);
      fprintf(stderr, "cedar serve-sim: request %" PRId64 " failed: %s (the others go on)\n", i, q->err);
      continue;
    }
    double t0 = arr[i].t;
    struct sm_slo slo = {arr[i].slo_ttft, arr[i].slo_tpot, arr[i].slo_e2el};
    struct sm_req r;
    sm_add(&m, t0, q->t_token, q->n_tokens, q->n, q->n_tokens, &slo, &r);
    double f = r.ttft, tp = r.tpot, l = r.e2el;
    bool ok = r.good;
    if (o->json) {
      cJSON *j = cJSON_CreateObject();
      cJSON_AddNumberToObject(j, "id", (double)i);
      cJSON_AddNumberToObject(j, "arrival_s", t0);
      cJSON_AddNumberToObject(j, "admitted_s", q->t_admit);
      cJSON_AddNumberToObject(j, "prompt_len", (double)q->n);
      cJSON_AddNumberToObject(j, "output_len", q->n_tokens);
      cJSON *tk = cJSON_AddArrayToObject(j, "tokens");
      cJSON *tt = cJSON_AddArrayToObject(j, "token_times_s");
      for (int k = 0; k < q->n_tokens; k++) {
        cJSON_AddItemToArray(tk, cJSON_CreateNumber(q->tokens[k]));
        cJSON_AddItemToArray(tt, cJSON_CreateNumber(q->t_token[k]));
      }
      cJSON_AddNumberToObject(j, "ttft_ms", f);
      cJSON_AddNumberToObject(j, "tpot_ms", tp);
      cJSON_AddNumberToObject(j, "e2el_ms", l);
      if (arr[i].slo_ttft > 0) cJSON_AddNumberToObject(j, "slo_ttft_ms", arr[i].slo_ttft);
      if (arr[i].slo_tpot > 0) cJSON_AddNumberToObject(j, "slo_tpot_ms", arr[i].slo_tpot);
      if (arr[i].slo_e2el > 0) cJSON_AddNumberToObject(j, "slo_e2el_ms", arr[i].slo_e2el);
      cJSON_AddBoolToObject(j, "good", ok);
      cJSON_AddNumberToObject(j, "prefix_hit", (double)q->hrep.hit);
      char *txt = cJSON_PrintUnformatted(j);
      printf("%s\n", txt);
      free(txt);
      cJSON_Delete(j);
    }
  }
  double dur = b.clock;
  sum->duration = dur;
  sum->steps = b.steps;
  sum->decode_rows = b.decode_rows;
  sum->decode_tok_s = b.decode_s > 0 ? (double)b.decode_rows / b.decode_s : 0;
  sum->decode_steps = b.decode_steps;
  sum->decode_cpu_s = b.decode_cpu_s;
  sum->decode_cpu_tok_s = b.decode_cpu_s > 0 ? (double)b.decode_rows / b.decode_cpu_s : 0;
  sum->decode_s = b.decode_s;
  sum->decode_experts = b.decode_experts;
  memcpy(sum->fam_s, b.decode_fam_s, sizeof sum->fam_s);
  sum->mean_step_s = b.steps ? dur / (double)b.steps : 0;
  cJSON *root = cJSON_CreateObject(), *t = cJSON_AddObjectToObject(root, "totals");
  FILE *txt = o->json ? NULL : stdout;
  int64_t failed = m.failed;
  if (txt)
    printf("max batch %d: %" PRId64 " requests (%" PRId64 " failed), %" PRId64 " steps, duration %.3f s (simulated "
           "arrivals, measured compute)\n", N, m.n_done, failed, b.steps, dur);
  cJSON_AddNumberToObject(t, "max_batch", N);
  cJSON_AddStringToObject(t, "time", "simulated arrivals, measured compute");
  cJSON_AddNumberToObject(t, "steps", (double)b.steps);
  cJSON_AddNumberToObject(t, "decode_tokens", (double)b.decode_rows);
  cJSON_AddNumberToObject(t, "decode_seconds", b.decode_s);
  cJSON_AddNumberToObject(t, "decode_throughput", sum->decode_tok_s);
  cJSON_AddNumberToObject(t, "decode_steps", (double)b.decode_steps);
  cJSON_AddNumberToObject(t, "decode_cpu_seconds", b.decode_cpu_s);
  cJSON_AddNumberToObject(t, "decode_experts", (double)b.decode_experts);
  sm_totals(&m, dur, o->pct, o->n_pct, t, txt);
  if (txt)
    printf("  decode: %.1f tok/s over %.3f s of batched decode\n", sum->decode_tok_s, b.decode_s);
  else {
    char *s2 = cJSON_PrintUnformatted(root);
    printf("%s\n", s2);
    free(s2);
  }
  cJSON_Delete(root);
  sm_free(&m);
  free(h);
  rt_batch_free(&b);
  return failed ? 1 : 0;
}

/* --floor: each N's decode step against its bytes floor, stored and as
 * held, and routing's cap on what batching gains over the first N. */
static void print_floor(const struct bopts *o, const struct rt_engine *e, const struct run_sum *sum) {
  struct bench_peaks pk;
  struct step_bytes st, held;
  char core[160];
  bench_measure_peaks(&pk, 5);
  step_bytes_of(&e->weights.list, &e->plan, true, &st);
  step_bytes_of(&e->weights.list, &e->plan, false, &held);
  bench_blas_core(core, sizeof core);
  printf("bytes floor of a decode step (%s; memcpy peak %.2f GB/s, read + write, this run)\n"
         "weights: %.0f bytes in the plan's stored formats (plan cost), %.0f bytes as held now\n", core, pk.bw / 1e9,
         st.total, held.total);
  double rows0 = 0, bytes0 = 0, tok0 = 0;
  for (int k = 0; k < o->n_batch; k++) {
    if (!sum[k].decode_steps) continue;
    double steps = (double)sum[k].decode_steps, rows = (double)sum[k].decode_rows / steps;
    double ex = (double)sum[k].decode_experts / steps;
    double bs = step_bytes(&st, rows, ex), bh = step_bytes(&held, rows, ex);
    double fs = bs / pk.bw, fh = bh / pk.bw;
    double step_s = sum[k].decode_s / steps, step_cpu = sum[k].decode_cpu_s / steps;
    printf("  max batch %4d: %.2f rows a step, %.1f routed experts run a step; stored %.2f MB a step (floor %.2f ms), "
           "held %.1f MB (floor %.2f ms); step %.2f ms wall = %.2fx the stored floor (%.2fx held), %.2f ms CPU = "
           "%.2fx (%.2fx)\n", o->max_batch[k], rows, ex, bs / 1e6, 1e3 * fs, bh / 1e6, 1e3 * fh, 1e3 * step_s,
           step_s / fs, step_s / fh, 1e3 * step_cpu, step_cpu / fs, step_cpu / fh);
    printf("                  a step's time by op family:");
    for (int f = 0; f < RT_FAM_COUNT; f++)
      if (sum[k].fam_s[f] > 0.005 * sum[k].decode_s)
        printf(" %s %.1f%%", rt_family_name((enum rt_family)f), 100 * sum[k].fam_s[f] / sum[k].decode_s);
    printf("\n");
    if (rows0 <= 0) {
      rows0 = rows, bytes0 = bs, tok0 = sum[k].decode_tok_s;
      continue;
    }
    /* the bytes a row of the first N, times the rows: what batch N would read with no expert shared */
    printf("                  routing's cap over max batch %d: %.2f rows x %.2f MB a row / %.2f MB = %.2fx; decode "
           "measured %.2fx\n", o->max_batch[0], rows, bytes0 / rows0 / 1e6, bs / 1e6, rows / rows0 * bytes0 / bs,
           tok0 > 0 ? sum[k].decode_tok_s / tok0 : 0);
  }
}

int serve_sim_batch(int argc, char **argv) {
  struct bopts o;
  int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  char err[1024];
  struct plan_diags diags = {0};
  struct rt_engine_opts eo = {
      .plan = o.plan ? o.plan : o.model ? NULL : cli_default_plan(),
      .weights = o.weights,
      .model = o.model,
      .seed = o.seed,
      .weights_f32 = o.weights_f32,
      /* several N replay the same prompts: a cache would serve the later runs from the first */
      .cache = {.on = !o.no_cache && o.n_batch == 1, .capacity_bytes = -1, .snapshots = true},
      .diags = &diags};
  struct rt_engine e;
  rc = rt_engine_open(&e, &eo, err, sizeof err);
  if (rc && e.failed == RT_ENGINE_PLAN) plan_diags_print(&diags, stderr);
  plan_diags_free(&diags);
  if (rc) {
    fprintf(stderr, "cedar serve-sim: %s\n", err);
    rt_engine_close(&e);
    return 1;
  }
  if (!o.json) cli_weights_resident_line(stdout, &e.plan, &e.weights);
  int64_t n = 0;
  struct arrival *arr = o.trace ? read_trace(&o, e.plan.model.vocab, plan_max_positions(&e.plan), &n) : synth(&o, &n);
  int status = arr ? 0 : 1;
  if (arr && !o.trace && o.plen_hi + o.new_hi > plan_max_positions(&e.plan)) {
    fprintf(stderr, "cedar serve-sim: --prompt-len and --max-new need %" PRId64 " positions; plan %s holds at most %" PRId64 "\n",
            o.plen_hi + o.new_hi, e.plan.name, plan_max_positions(&e.plan));
    status = 1;
  }
  struct run_sum sum[8];
  for (int k = 0; !status && k < o.n_batch; k++) status = run_one(&o, &e, arr, n, o.max_batch[k], &sum[k]);
  if (!status && o.floor) print_floor(&o, &e, sum);
  if (!status && o.n_batch > 1) {
    printf("side by side (one process, same engine, same workload):\n");
    for (int k = 0; k < o.n_batch; k++)
      printf("  max batch %4d: decode %8.1f tok/s wall (%.2fx max batch %d), %8.1f tok/s CPU (%.2fx); %" PRId64
             " steps, %.2f ms a step, duration %.3f s\n",
             o.max_batch[k], sum[k].decode_tok_s, sum[0].decode_tok_s > 0 ? sum[k].decode_tok_s / sum[0].decode_tok_s : 0,
             o.max_batch[0], sum[k].decode_cpu_tok_s,
             sum[0].decode_cpu_tok_s > 0 ? sum[k].decode_cpu_tok_s / sum[0].decode_cpu_tok_s : 0, sum[k].steps,
             1e3 * sum[k].mean_step_s, sum[k].duration);
  }
  for (int64_t i = 0; arr && i < n; i++) free(arr[i].tokens);
  free(arr);
  rt_engine_close(&e);
  return status;
}
