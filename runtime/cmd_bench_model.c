/* cmd_bench_model.c: `cedar bench model`, the whole model side by side on
 * several plans in one run: cold prefill of N tokens, then decode steps, on
 * the direct executor with synthetic weights. Reports per plan the prefill
 * time, token-layers, decode tokens per second and the time by op group, and
 * against the first plan the time ratio beside the token-layer ratio (SPEC
 * 6.2: CED's (20N + 20 min(N, 128)) / 40N against the dense plan).
 *
 * Nothing is asserted: compare the ratios, not the times (these machines are
 * noisy). docs/PERF.md records runs with the command that made them.
 */
#include <cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/check.h"
#include "runtime/cli.h"
#include "runtime/generate.h"

#define MAX_PLANS 8

static const char usage[] =
    "usage: cedar bench model [--plan P]... [--prompt-len N] [--decode S] [--chunk C] [--seed S] [--json]\n"
    "Cold prefill of N tokens (default 4096) then S decode steps (default 16) on each plan P\n"
    "(default: plans/v41-mini.yaml and plans/dense-40.yaml), one after the other in this run, on\n"
    "the direct executor with synthetic weights from seed S (default 0). Prints per plan: prefill\n"
    "seconds and token-layers, decode tokens/s, time by op group; and, against the first plan,\n"
    "the prefill time ratio beside the token-layer ratio. The prompt is byte tokens of a fixed\n"
    "text. Nothing is asserted; docs/PERF.md keeps results with their command.\n";

struct result {
  const char *path;
  char name[64];
  struct rt_gen_result res;
  int64_t layers;
  int ok;
};

static bool parse_i(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

static int run_plan(struct result *r, long n, long steps, int chunk, uint64_t seed) {
  struct plan p;
  if (cli_load_plan("bench model", r->path, &p)) return 1;
  snprintf(r->name, sizeof(r->name), "%s", p.name);
  r->layers = p.n_layers;
  char err[1024];
  struct weights w;
  struct rt_model M;
  struct rt_kv_pool *pools = cedar_xcalloc(PLAN_MAX_LAYERS, sizeof(*pools));
  struct rt_request q = {0};
  int rc = weights_synth(&w, &p, seed, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err);
  if (rc) {
    fprintf(stderr, "cedar bench model: %s: %s\n", r->path, err);
    free(pools);
    plan_free(&p);
    return 1;
  }
  rc = rt_model_init(&M, &p, &w, err, sizeof err);
  if (!rc) rc = rt_kv_pools_init(pools, &p, err, sizeof err);
  int32_t *tok = cedar_xmalloc(sizeof(int32_t) * (size_t)n);
  static const char text[] = "The quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. ";
  for (long i = 0; i < n; i++) tok[i] = (unsigned char)text[i % (long)(sizeof(text) - 1)] % p.model.vocab;
  struct rt_gen_opts go = {.chunk = chunk, .replay = -1, .max_new = (int)steps + 1, .top_p = 1, .seed = seed};
  if (!rc) rc = rt_generate(&M, pools, &q, tok, n, &go, &r->res, err, sizeof err);
  if (rc) fprintf(stderr, "cedar bench model: %s: %s\n", r->path, err);
  r->ok = rc == 0;
  free(tok);
  rt_request_free(&q);
  rt_kv_pools_free(pools, p.n_layers);
  free(pools);
  rt_model_free(&M);
  weights_free(&w);
  plan_free(&p);
  return rc ? 1 : 0;
}

static double tok_s(const struct rt_gen_result *g) { return g->steady_itl_s > 0 ? 1.0 / g->steady_itl_s : 0; }

static void print_text(const struct result *r, int n_plans, long n, long steps) {
  printf("cold prefill of %ld tokens, then %ld decode steps; direct executor, one thread\n\n", n, steps);
  printf("%-16s %10s %14s %10s %10s %12s %12s\n", "plan", "prefill s", "token-layers", "time/1st", "tl/1st",
         "decode tok/s", "ITL ms");
  for (int i = 0; i < n_plans; i++) {
    if (!r[i].ok) continue;
    const struct rt_gen_result *g = &r[i].res;
    printf("%-16s %10.3f %14lld %10.3f %10.3f %12.1f %12.2f\n", r[i].name, g->ttft_s,
           (long long)g->prefill.token_layers, g->ttft_s / r[0].res.ttft_s,
           (double)g->prefill.token_layers / (double)r[0].res.prefill.token_layers, tok_s(g),
           1e3 * g->steady_itl_s);
  }
  printf("\ntime by op group, %% of prefill | %% of decode:\n");
  for (int i = 0; i < n_plans; i++) {
    if (!r[i].ok) continue;
    const struct rt_gen_result *g = &r[i].res;
    double tp = 0, td = 0;
    for (int k = 0; k < GRAPH_OP_COUNT; k++) tp += g->prefill.op_seconds[k], td += g->decode.op_seconds[k];
    printf("  %-16s", r[i].name);
    for (int k = 0; k < GRAPH_OP_COUNT; k++)
      if (g->prefill.op_nodes[k])
        printf(" %s %.1f|%.1f", graph_op_name(k), 100 * g->prefill.op_seconds[k] / tp,
               td > 0 ? 100 * g->decode.op_seconds[k] / td : 0.0);
    printf("\n");
  }
}

static void print_json(const struct result *r, int n_plans, long n, long steps) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "prompt_len", (double)n);
  cJSON_AddNumberToObject(j, "decode_steps", (double)steps);
  cJSON *a = cJSON_AddArrayToObject(j, "plans");
  for (int i = 0; i < n_plans; i++) {
    if (!r[i].ok) continue;
    const struct rt_gen_result *g = &r[i].res;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "plan", r[i].name);
    cJSON_AddNumberToObject(o, "prefill_s", g->ttft_s);
    cJSON_AddNumberToObject(o, "prefill_token_layers", (double)g->prefill.token_layers);
    cJSON_AddNumberToObject(o, "time_ratio", g->ttft_s / r[0].res.ttft_s);
    cJSON_AddNumberToObject(o, "token_layer_ratio",
                            (double)g->prefill.token_layers / (double)r[0].res.prefill.token_layers);
    cJSON_AddNumberToObject(o, "decode_tok_s", tok_s(g));
    cJSON *ops = cJSON_AddObjectToObject(o, "op_seconds");
    for (int k = 0; k < GRAPH_OP_COUNT; k++) {
      if (!g->prefill.op_nodes[k]) continue;
      cJSON *e = cJSON_AddObjectToObject(ops, graph_op_name(k));
      cJSON_AddNumberToObject(e, "prefill", g->prefill.op_seconds[k]);
      cJSON_AddNumberToObject(e, "decode", g->decode.op_seconds[k]);
    }
    cJSON_AddItemToArray(a, o);
  }
  cli_print_json(j);
}

int cmd_bench_model(int argc, char **argv) {
  static const struct option opts[] = {{"plan", required_argument, NULL, 'p'},
                                       {"prompt-len", required_argument, NULL, 'n'},
                                       {"decode", required_argument, NULL, 'd'},
                                       {"chunk", required_argument, NULL, 'c'},
                                       {"seed", required_argument, NULL, 's'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},
                                       {0, 0, 0, 0}};
  struct result r[MAX_PLANS];
  memset(r, 0, sizeof(r));
  int n_plans = 0, c, chunk = 0;
  long n = 4096, steps = 16, v;
  uint64_t seed = 0;
  bool json = false;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'p':
      if (n_plans == MAX_PLANS) return cli_usage_error("bench model", "at most %d plans", MAX_PLANS);
      r[n_plans++].path = optarg;
      break;
    case 'n':
      if (!parse_i(optarg, 1, 1 << 22, &n)) return cli_usage_error("bench model", "--prompt-len takes N >= 1");
      break;
    case 'd':
      if (!parse_i(optarg, 0, 1 << 16, &steps)) return cli_usage_error("bench model", "--decode takes S >= 0");
      break;
    case 'c':
      if (!parse_i(optarg, 1, 1 << 20, &v)) return cli_usage_error("bench model", "--chunk takes C >= 1");
      chunk = (int)v;
      break;
    case 's':
      if (!parse_i(optarg, 0, 1L << 62, &v)) return cli_usage_error("bench model", "--seed takes S >= 0");
      seed = (uint64_t)v;
      break;
    case 'j': json = true; break;
    case 'h': fputs(usage, stdout); return 0;
    default:
      return cli_usage_error("bench model", "bad option, or an option without its value: '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("bench model", "unexpected argument '%s'", argv[optind]);
  if (!n_plans) {
    r[n_plans++].path = "plans/v41-mini.yaml";
    r[n_plans++].path = "plans/dense-40.yaml";
  }
  int status = 0;
  for (int i = 0; i < n_plans; i++) {
    if (!json) fprintf(stderr, "bench model: %s ...\n", r[i].path);
    status |= run_plan(&r[i], n, steps, chunk, seed);
  }
  if (!r[0].ok) status = 1;
  if (r[0].ok) (json ? print_json : print_text)(r, n_plans, n, steps);
  for (int i = 0; i < n_plans; i++) rt_gen_result_free(&r[i].res);
  return status;
}
