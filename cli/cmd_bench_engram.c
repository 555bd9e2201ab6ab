/* cmd_bench_engram.c: `cedar bench engram`, decode steps with the Engram
 * tables in memory against the mmap tier (runtime/engram_tier.h), measured
 * side by side in one run on the same prompt and weights:
 *
 *   memory     the tables in the weights' memory (serving.engram.tier: memory)
 *   mmap warm  the tables file mapped; its pages in the page cache
 *   mmap cold  the same, the tables' pages dropped from the process and the
 *              page cache before every decode step (rt_engram_tier_evict),
 *              so each step's prefetch faults its rows in from the file
 *
 * Per variant: the median decode step, the prefetch (engram_rows nodes)
 * time per step, the page faults per step (getrusage, the process), and on
 * StarPU (--workers N) the share of the prefetch time a layer task ran
 * beside it (viz/trace.h's measure). Every variant must give the memory
 * variant's tokens and logits bit for bit; the run fails otherwise.
 * The plans are the given plan extended by a temporary file (table_base,
 * tier, the tables file in a temporary directory).
 */
#define _GNU_SOURCE /* mkdtemp, realpath, setenv */
#include <cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/check.h"
#include "cli/cli.h"
#include "ops/basic.h"
#include "runtime/engine.h"
#include "runtime/engram_tier.h"
#include "viz/trace.h"

struct bargs {
  const char *plan;
  int64_t prompt, steps, table_base, workers;
  bool json;
};

struct variant {
  const char *name;
  bool mmap, cold;
  double step_ms, gather_ms, faults, overlap;
  uint64_t table_bytes;
  struct rt_gen_result res;
  bool ran;
};

struct probe {
  struct rt_engine *e;
  bool cold;
  struct viz_trace trace;
  long faults0;
};

static long faults_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt + ru.ru_majflt;
}

/* After each graph: record it for the overlap measure; before the next
 * decode step of a cold variant, drop the tables' pages. */
static void on_graph(void *user, const struct graph *g, const struct rt_task_time *t) {
  struct probe *p = user;
  if (t) {
    struct viz_task_time *vt = cedar_xmalloc(sizeof(*vt) * (size_t)(g->n_node > 0 ? g->n_node : 1));
    for (int k = 0; k < g->n_node; k++) vt[k] = (struct viz_task_time){t[k].worker, t[k].start_us, t[k].end_us};
    if (g->flow == GRAPH_DECODE) viz_trace_add_graph(&p->trace, g, vt, 0);
    free(vt);
  }
  if (g->flow != GRAPH_DECODE) p->faults0 = faults_now(); /* decode faults from here */
  if (p->cold) rt_engram_tier_evict(&p->e->engram, &p->e->weights);
}

static int run_variant(const struct bargs *a, const char *plan, struct variant *v, char *err, size_t len) {
  struct rt_engine e;
  struct rt_engine_exec x = {0};
  if (a->workers > 0) x = (struct rt_engine_exec){.executor = RT_EXEC_STARPU, .workers = (int)a->workers, .profile = true};
  int rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = plan, .seed = 1, .exec = x}, err, len);
  if (rc) return rc;
  v->table_bytes = e.engram.table_bytes;
  int V = e.plan.model.vocab;
  int32_t *prompt = cedar_xmalloc(sizeof(int32_t) * (size_t)a->prompt);
  for (int64_t i = 0; i < a->prompt; i++) prompt[i] = (int32_t)((i * 131 + 7) % V);
  struct probe p = {.e = &e, .cold = v->cold};
  viz_trace_init(&p.trace, "bench", 0);
  struct rt_gen_opts go = {.replay = -1, .max_new = (int)a->steps + 1, .top_p = 1, .executor = x.executor,
                           .on_graph = on_graph, .graph_user = &p};
  struct rt_request r;
  rc = rt_engine_generate(&e, &r, prompt, a->prompt, &go, &v->res, err, len);
  if (!rc) {
    double steps = (double)a->steps;
    v->step_ms = 1e3 * v->res.steady_itl_s;
    v->gather_ms = 1e3 * v->res.decode.op_seconds[GRAPH_ENGRAM_GATHER] / steps;
    v->faults = (double)(faults_now() - p.faults0) / steps;
    v->overlap = p.trace.prefetch.us > 0 ? p.trace.prefetch.overlapped_us / p.trace.prefetch.us : NAN;
    v->ran = true;
  }
  viz_trace_free(&p.trace);
  rt_engine_request_free(&e, &r);
  rt_engine_close(&e);
  free(prompt);
  return rc;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: cedar bench engram [--plan P] [--prompt-len N] [--steps S] [--table-base B] [--workers W] [--json]\n"
          "\n"
          "Decode steps with the Engram tables in memory, then memory-mapped (serving.engram.tier: mmap)\n"
          "with the file's pages in the page cache (warm) and dropped before every step (cold), in one run\n"
          "on the same prompt and synthetic weights. Prints per variant the median decode step (steady\n"
          "ITL), the Engram prefetch time per step, page faults per step and, on StarPU, the share of\n"
          "the prefetch time a layer task ran beside it. Fails unless every variant gives the memory\n"
          "variant's tokens and logits bit for bit.\n"
          "\n"
          "  --plan P          plan (default %s)\n"
          "  --prompt-len N    prompt tokens (default 32)\n"
          "  --steps S         decode steps (default 16)\n"
          "  --table-base B    model.engram.table_base for all variants (default: the plan's): larger\n"
          "                    tables, ~6 x B rows per module\n"
          "  --workers W       StarPU with W CPU workers (default 0: the direct executor)\n"
          "  --json            one JSON object\n",
          cli_default_plan());
}

static int parse(int argc, char **argv, struct bargs *a) {
  static const struct option lo[] = {{"plan", required_argument, NULL, 'p'},   {"prompt-len", required_argument, NULL, 'n'},
                                     {"steps", required_argument, NULL, 's'},  {"table-base", required_argument, NULL, 'b'},
                                     {"workers", required_argument, NULL, 'w'}, {"json", no_argument, NULL, 'j'},
                                     {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
  *a = (struct bargs){.plan = cli_default_plan(), .prompt = 32, .steps = 16};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'p': a->plan = optarg; break;
    case 'n':
      if (!cli_parse_int(optarg, 1, 1 << 20, &a->prompt)) return cli_usage_error("bench engram", "--prompt-len: 1 to 2^20");
      break;
    case 's':
      if (!cli_parse_int(optarg, 1, 100000, &a->steps)) return cli_usage_error("bench engram", "--steps: 1 to 100000");
      break;
    case 'b':
      if (!cli_parse_int(optarg, 2, (int64_t)1e12, &a->table_base))
        return cli_usage_error("bench engram", "--table-base: 2 to 10^12");
      break;
    case 'w':
      if (!cli_parse_int(optarg, 0, 64, &a->workers)) return cli_usage_error("bench engram", "--workers: 0 to 64");
      break;
    case 'j': a->json = true; break;
    case 'h': usage(stdout); return 0;
    default: return cli_usage_error("bench engram", "see cedar bench engram --help");
    }
  }
  if (optind < argc) return cli_usage_error("bench engram", "unexpected argument '%s'", argv[optind]);
  return -1;
}

/* dir/NAME.yaml extending the plan (its absolute path) with the overrides. */
static void write_plan(char *out, size_t len, const char *dir, const char *name, const struct bargs *a, bool mmap) {
  char abs[4096];
  if (!realpath(a->plan, abs)) snprintf(abs, sizeof abs, "%s", a->plan);
  snprintf(out, len, "%s/%s.yaml", dir, name);
  FILE *f = fopen(out, "w");
  CEDAR_ASSERT_MSG(f, "cannot write %s", out);
  fprintf(f, "extends: %s\n", abs);
  if (a->table_base) fprintf(f, "model:\n  engram: {table_base: %lld}\n", (long long)a->table_base);
  if (mmap) fprintf(f, "serving:\n  engram: {tier: mmap, file: %s/tables.safetensors}\n", dir);
  fclose(f);
}

int cmd_bench_engram(int argc, char **argv) {
  struct bargs a;
  int rc = parse(argc, argv, &a);
  if (rc >= 0) return rc;
  op_blas_init();
  char dir[] = "/tmp/cedar-bench-engram-XXXXXX", pmem[4200], pmap[4200], err[1024];
  if (!mkdtemp(dir)) return fprintf(stderr, "cedar bench engram: cannot make a temporary directory\n"), 1;
  write_plan(pmem, sizeof pmem, dir, "memory", &a, false);
  write_plan(pmap, sizeof pmap, dir, "mmap", &a, true);
  struct variant v[3] = {{.name = "memory"}, {.name = "mmap warm", .mmap = true}, {.name = "mmap cold", .mmap = true, .cold = true}};
  int status = 0;
  for (int i = 0; i < 3 && !status; i++) {
    if (run_variant(&a, v[i].mmap ? pmap : pmem, &v[i], err, sizeof err)) {
      fprintf(stderr, "cedar bench engram: %s: %s\n", v[i].name, err);
      status = 1;
    }
  }
  int V = 0;
  struct plan p;
  if (!status && !plan_load(pmem, &p, NULL)) V = p.model.vocab, plan_free(&p);
  for (int i = 1; i < 3 && !status; i++) {
    const struct rt_gen_result *x = &v[0].res, *y = &v[i].res;
    bool same = x->n_tokens == y->n_tokens && !memcmp(x->tokens, y->tokens, sizeof(int32_t) * (size_t)x->n_tokens) &&
                !memcmp(x->decode_logits, y->decode_logits, sizeof(float) * (size_t)(x->n_tokens - 1) * (size_t)V);
    if (!same) fprintf(stderr, "cedar bench engram: %s: tokens or logits differ from the memory tier\n", v[i].name), status = 1;
  }
  if (!status && a.json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "plan", a.plan);
    cJSON_AddNumberToObject(o, "prompt", (double)a.prompt);
    cJSON_AddNumberToObject(o, "steps", (double)a.steps);
    cJSON_AddNumberToObject(o, "workers", (double)a.workers);
    cJSON_AddNumberToObject(o, "table_bytes", (double)v[0].table_bytes);
    cJSON *arr = cJSON_AddArrayToObject(o, "variants");
    for (int i = 0; i < 3; i++) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "name", v[i].name);
      cJSON_AddNumberToObject(e, "step_ms", v[i].step_ms);
      cJSON_AddNumberToObject(e, "prefetch_ms_per_step", v[i].gather_ms);
      cJSON_AddNumberToObject(e, "faults_per_step", v[i].faults);
      if (!isnan(v[i].overlap)) cJSON_AddNumberToObject(e, "prefetch_overlap", v[i].overlap);
      cJSON_AddItemToArray(arr, e);
    }
    cJSON_AddBoolToObject(o, "bitwise_equal", true);
    cli_print_json(o);
  } else if (!status) {
    printf("cedar bench engram: plan %s, prompt %lld, %lld decode steps, %s; Engram tables %.1f MiB\n", a.plan,
           (long long)a.prompt, (long long)a.steps, a.workers ? "StarPU" : "direct executor",
           (double)v[0].table_bytes / (1 << 20));
    if (a.workers) printf("StarPU CPU workers: %lld\n", (long long)a.workers);
    printf("%-10s %12s %16s %15s %s\n", "tier", "step ms", "prefetch ms/step", "faults/step", a.workers ? "prefetch beside layers" : "");
    for (int i = 0; i < 3; i++) {
      printf("%-10s %12.3f %16.4f %15.1f", v[i].name, v[i].step_ms, v[i].gather_ms, v[i].faults);
      if (a.workers && !isnan(v[i].overlap)) printf(" %21.1f%%", 100 * v[i].overlap);
      printf("\n");
    }
    printf("step ratio mmap warm / memory %.3f, mmap cold / memory %.3f; tokens and logits bitwise equal\n",
           v[1].step_ms / v[0].step_ms, v[2].step_ms / v[0].step_ms);
  }
  for (int i = 0; i < 3; i++) rt_gen_result_free(&v[i].res);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "cedar bench engram: could not remove %s\n", dir);
  return status;
}
