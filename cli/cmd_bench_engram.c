/* cmd_bench_engram.c: `cedar bench engram`, decode steps with the Engram
 * tables in memory against the mmap tier (runtime/model/engram_tier.h), measured
 * side by side in one run on the same prompt and weights:
 *
 *   memory     the tables in the weights' memory (serving.engram.tier: memory)
 *   mmap warm  the tables file mapped; its pages in the page cache
 *   mmap cold  the same, the tables' pages dropped from the process and the
 *              page cache before every decode step (rt_engram_tier_evict),
 *              so each step's prefetch faults its rows in from the file
 *
 * The three engines are open at once and run in turn for --rounds rounds
 * (so a busy moment of a shared machine hits all of them). Per variant: the
 * median decode step (wall time from one step's graph to the next), the
 * prefetch (engram_rows nodes) time per step, the page faults per step
 * (getrusage, the process), and on StarPU (--workers N) the share of the
 * prefetch time a layer task ran beside it (viz/trace.h's measure). Every variant must give the memory
 * variant's tokens and logits bit for bit; the run fails otherwise.
 * The plans are the given plan extended by a temporary file (table_base,
 * tier, the tables file in a temporary directory: one per mmap variant, as
 * a page the warm variant maps could not be dropped for the cold one).
 * With --model DIR the three engines load the checkpoint (its config's plan,
 * as `plan import` writes it, or --plan, checked against it, extended the
 * same way without a tables file): the mmap variants' tables stay in the shards,
 * which all three map, so before a cold step every variant's pages of the
 * tables are dropped (a page any mapping holds stays in the page cache), and
 * before each of its requests the warm variant reads the shards through to
 * put them back in the page cache (untimed).
 */
#define _GNU_SOURCE /* mkdtemp, realpath, setenv */
#include <errno.h>
#include <cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "base/quote.h"
#include "cli/cli.h"
#include "ops/basic.h"
#include "runtime/load/checkpoint.h"
#include "runtime/engine/engine.h"
#include "runtime/model/engram_tier.h"
#include "viz/trace.h"

struct bargs {
  const char *plan, *model;
  int64_t prompt, steps, table_base, workers, rounds;
  bool json;
};

struct variant {
  const char *name;
  bool mmap, cold;
  struct rt_engine e;
  bool open;
  double *step_s; /* (rounds * steps) */
  int n_step;
  double gather_s, pf_us, pf_overlap_us;
  long faults;
  uint64_t table_bytes;
  struct rt_gen_result first; /* round 0's result: the bitwise comparison */
};

struct probe {
  struct variant *v, *all; /* all: the three, when they share a checkpoint's shards (--model) */
  double t_last;
  long faults0;
};

static long faults_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt + ru.ru_majflt;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* After each graph: a decode step's wall time (since the graph before it
 * ended: graph building, the step, sampling), its prefetch overlap from
 * the recorded task times; then, for a cold variant, drop the tables'
 * pages before the next step. */
static void on_graph(void *user, const struct graph *g, const struct rt_task_time *t) {
  struct probe *p = user;
  struct variant *v = p->v;
  double now = now_s();
  if (g->flow == GRAPH_DECODE) {
    v->step_s[v->n_step++] = now - p->t_last;
    if (t) {
      struct viz_trace tr;
      viz_trace_init(&tr, "bench", 0);
      struct viz_task_time *vt = cedar_xmalloc(sizeof(*vt) * (size_t)(g->n_node > 0 ? g->n_node : 1));
      for (int k = 0; k < g->n_node; k++) vt[k] = (struct viz_task_time){t[k].worker, t[k].start_us, t[k].end_us};
      viz_trace_add_graph(&tr, g, vt, 0);
      v->pf_us += tr.prefetch.us;
      v->pf_overlap_us += tr.prefetch.overlapped_us;
      free(vt);
      viz_trace_free(&tr);
    }
  } else {
    p->faults0 = faults_now(); /* decode faults from here */
  }
  if (v->cold)
    for (int i = 0; i < (p->all ? 3 : 1); i++) {
      struct variant *x = p->all ? &p->all[i] : v;
      if (x->open) rt_engram_tier_evict(&x->e.engram, &x->e.weights);
    }
  p->t_last = now_s(); /* the eviction is not the step's */
}

/* --model, the warm variant: the shards back into the page cache (a cold
 * variant's step dropped them), read through before its request. */
static void warm_shards(const struct ckpt_shards *s) {
  char path[4200];
  uint8_t *buf = cedar_xmalloc(1 << 20);
  for (size_t i = 0; s && i < s->n; i++) {
    snprintf(path, sizeof path, "%s/%s", s->dir, s->names[i]);
    FILE *f = fopen(path, "rb");
    while (f && fread(buf, 1, 1 << 20, f) == 1 << 20) {}
    if (f) fclose(f);
  }
  free(buf);
}

static int run_once(const struct bargs *a, struct variant *v, struct variant *all, int round, char *err, size_t len) {
  if (a->model && v->mmap && !v->cold) warm_shards(v->e.weights.shards);
  struct rt_engine_exec x = {0};
  if (a->workers > 0) x = (struct rt_engine_exec){.executor = RT_EXEC_STARPU, .workers = (int)a->workers, .profile = true};
  int rc = rt_engine_set_exec(&v->e, &x, err, len);
  if (rc) return rc;
  int V = v->e.plan.model.vocab;
  int32_t *prompt = cedar_xmalloc(sizeof(int32_t) * (size_t)a->prompt);
  for (int64_t i = 0; i < a->prompt; i++) prompt[i] = (int32_t)((i * 131 + 7) % V);
  struct probe p = {.v = v, .all = a->model ? all : NULL, .t_last = now_s()};
  struct rt_gen_opts go = {.replay = -1, .max_new = (int)a->steps + 1, .top_p = 1, .executor = x.executor,
                           .on_graph = on_graph, .graph_user = &p};
  struct rt_request r;
  struct rt_gen_result res = {0};
  rc = rt_engine_generate(&v->e, &r, prompt, a->prompt, &go, &res, err, len);
  if (!rc) {
    v->gather_s += res.decode.op_seconds[GRAPH_ENGRAM_GATHER];
    v->faults += faults_now() - p.faults0;
  }
  rt_engine_request_free(&v->e, &r);
  if (!rc && round == 0) v->first = res;
  else rt_gen_result_free(&res);
  free(prompt);
  struct rt_engine_exec direct = {0};
  rt_engine_set_exec(&v->e, &direct, err, len); /* StarPU goes back for the next variant */
  return rc;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static double median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  return n ? (n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2])) : NAN;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: cedar bench engram [--plan P | --model DIR [--plan P]] [--prompt-len N] [--steps S] [--rounds R]\n"
          "                          [--table-base B] [--workers W] [--json]\n"
          "\n"
          "Decode steps with the Engram tables in memory, then memory-mapped (serving.engram.tier: mmap)\n"
          "with the file's pages in the page cache (warm) and dropped before every step (cold), in one run\n"
          "on the same prompt and synthetic weights, the three engines open at once and run in turn for\n"
          "R rounds. Prints per variant the median decode step (wall time from one step's graph to the\n"
          "next, sampling included), the Engram prefetch time per step, page faults per step (the\n"
          "process's) and, on StarPU, the share of the prefetch time a layer task ran beside it. Fails\n"
          "unless every variant gives the memory variant's tokens and logits bit for bit.\n"
          "\n"
          "  --plan P          plan (default %s)\n"
          "  --model DIR       a released-layout checkpoint (docs/checkpoints.md) instead of synthetic\n"
          "                    weights: its config's plan (or --plan P, checked against it); the mmap\n"
          "                    variants read the tables in place from its shards\n"
          "  --prompt-len N    prompt tokens (default 32)\n"
          "  --steps S         decode steps (default 16)\n"
          "  --rounds R        requests per variant, interleaved (default 3)\n"
          "  --table-base B    model.engram.table_base for all variants (default: the plan's): larger\n"
          "                    tables, ~6 x B rows per module\n"
          "  --workers W       StarPU with W CPU workers (default 0: the direct executor)\n"
          "  --json            one JSON object\n",
          cli_default_plan());
}

static int parse(int argc, char **argv, struct bargs *a) {
  static const struct option lo[] = {{"plan", required_argument, NULL, 'p'},   {"prompt-len", required_argument, NULL, 'n'},
                                     {"steps", required_argument, NULL, 's'},  {"table-base", required_argument, NULL, 'b'},
                                     {"rounds", required_argument, NULL, 'r'}, {"model", required_argument, NULL, 'm'},
                                     {"workers", required_argument, NULL, 'w'}, {"json", no_argument, NULL, 'j'},
                                     {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
  *a = (struct bargs){.plan = cli_default_plan(), .prompt = 32, .steps = 16, .rounds = 3};
  optind = 1;
  bool plan_given = false;
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'p': a->plan = optarg, plan_given = true; break;
    case 'm': a->model = optarg; break;
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
    case 'r':
      if (!cli_parse_int(optarg, 1, 1000, &a->rounds)) return cli_usage_error("bench engram", "--rounds: 1 to 1000");
      break;
    case 'j': a->json = true; break;
    case 'h': usage(stdout); return 0;
    default: return cli_usage_error("bench engram", "see cedar bench engram --help");
    }
  }
  if (optind < argc) return cli_usage_error("bench engram", "unexpected argument '%s'", argv[optind]);
  if (a->model && a->table_base)
    return cli_usage_error("bench engram", "--table-base with --model: the checkpoint's tables have their own rows");
  if (a->model && !plan_given) a->plan = NULL; /* the checkpoint's config gives it */
  return -1;
}

/* dir/NAME.yaml extending the plan (its absolute path) with the overrides. */
static bool write_plan(char *out, size_t len, const char *dir, const char *name, const struct bargs *a, bool mmap) {
  /* each mmap variant maps a file of its own: a page another mapping holds cannot leave the page cache */
  char abs[4096];
  if (!realpath(a->plan, abs)) snprintf(abs, sizeof abs, "%s", a->plan);
  snprintf(out, len, "%s/%s.yaml", dir, name);
  FILE *f = fopen(out, "w");
  if (!f) return false;
  fputs("extends: ", f); /* paths are data: quoted (base/quote.h) */
  cedar_quote_yaml(f, abs);
  fputc('\n', f);
  if (a->table_base) fprintf(f, "model:\n  engram: {table_base: %lld}\n", (long long)a->table_base);
  if (mmap && a->model) fprintf(f, "serving:\n  engram: {tier: mmap}\n"); /* the tables are the shards' */
  else if (mmap) {
    char file[4200];
    snprintf(file, sizeof file, "%s/%s.safetensors", dir, name);
    fputs("serving:\n  engram: {tier: mmap, file: ", f);
    cedar_quote_yaml(f, file);
    fputs("}\n", f);
  }
  bool ok = !ferror(f);
  return fclose(f) == 0 && ok; /* a full disk is a failed write, never a half plan */
}

/* --model without --plan: dir/base.yaml, the plan DIR/config.json implies
 * (as `cedar plan import` writes it), for the variants to extend. */
static int import_plan(char *out, size_t len, const char *dir, const char *model, char *err, size_t err_len) {
  char cfg[4200], *yaml = NULL;
  struct ckpt_config c;
  snprintf(cfg, sizeof cfg, "%s/" CKPT_CONFIG, model);
  snprintf(out, len, "%s/base.yaml", dir);
  int rc = ckpt_config_read(cfg, &c, err, err_len);
  if (!rc) rc = ckpt_config_plan_yaml(&c, "imported", &yaml, err, err_len);
  FILE *f = rc ? NULL : fopen(out, "w");
  if (!rc && (!f || fputs(yaml, f) < 0)) rc = CEDAR_EIO;
  if (f && fclose(f) && !rc) rc = CEDAR_EIO;
  if (rc == CEDAR_EIO) snprintf(err, err_len, "cannot write %.900s", out);
  free(yaml);
  return rc;
}

int cmd_bench_engram(int argc, char **argv) {
  struct bargs a;
  int rc = parse(argc, argv, &a);
  if (rc >= 0) return rc;
  op_blas_init();
  char dir[] = "/tmp/cedar-bench-engram-XXXXXX", pmem[4200], pwarm[4200], pcold[4200], err[1024];
  if (!mkdtemp(dir)) return fprintf(stderr, "cedar bench engram: cannot make a temporary directory\n"), 1;
  char base[4200];
  bool bad = a.model && !a.plan && import_plan(base, sizeof base, dir, a.model, err, sizeof err);
  if (!bad && a.model && !a.plan) a.plan = base;
  if (!bad && (!write_plan(pmem, sizeof pmem, dir, "memory", &a, false) ||
               !write_plan(pwarm, sizeof pwarm, dir, "warm", &a, true) ||
               !write_plan(pcold, sizeof pcold, dir, "cold", &a, true))) {
    snprintf(err, sizeof err, "cannot write the variant plans in %s: %s", dir, strerror(errno));
    bad = true;
  }
  if (bad) {
    fprintf(stderr, "cedar bench engram: %s\n", err);
    char cmd[200]; /* dir is mkdtemp's: no quote in it */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "cedar bench engram: could not remove %s\n", dir);
    return 1;
  }
  struct variant v[3] = {{.name = "memory"}, {.name = "mmap warm", .mmap = true}, {.name = "mmap cold", .mmap = true, .cold = true}};
  int status = 0;
  for (int i = 0; i < 3 && !status; i++) { /* all three open at once (direct), so the rounds interleave them */
    v[i].step_s = cedar_xcalloc((size_t)(a.rounds * a.steps), sizeof(double));
    struct rt_engine_opts eo = {.plan = v[i].cold ? pcold : v[i].mmap ? pwarm : pmem, .seed = 1, .model = a.model};
    if (rt_engine_open(&v[i].e, &eo, err, sizeof err)) {
      fprintf(stderr, "cedar bench engram: %s: %s\n", v[i].name, err);
      status = 1;
      break;
    }
    v[i].open = true;
    v[i].table_bytes = v[i].e.engram.table_bytes;
  }
  for (int r = 0; r < a.rounds && !status; r++)
    for (int i = 0; i < 3 && !status; i++)
      if (run_once(&a, &v[i], v, r, err, sizeof err)) {
        fprintf(stderr, "cedar bench engram: %s: %s\n", v[i].name, err);
        status = 1;
      }
  int V = v[0].open ? v[0].e.plan.model.vocab : 0;
  for (int i = 1; i < 3 && !status; i++) {
    const struct rt_gen_result *x = &v[0].first, *y = &v[i].first;
    bool same = x->n_tokens == y->n_tokens && !memcmp(x->tokens, y->tokens, sizeof(int32_t) * (size_t)x->n_tokens) &&
                !memcmp(x->decode_logits, y->decode_logits, sizeof(float) * (size_t)(x->n_tokens - 1) * (size_t)V);
    if (!same) fprintf(stderr, "cedar bench engram: %s: tokens or logits differ from the memory tier\n", v[i].name), status = 1;
  }
  double step_ms[3], pf_ms[3], faults[3], overlap[3];
  for (int i = 0; i < 3 && !status; i++) {
    double n = (double)(a.rounds * a.steps);
    step_ms[i] = 1e3 * median(v[i].step_s, v[i].n_step);
    pf_ms[i] = 1e3 * v[i].gather_s / n;
    faults[i] = (double)v[i].faults / n;
    overlap[i] = v[i].pf_us > 0 ? v[i].pf_overlap_us / v[i].pf_us : NAN;
  }
  if (!status && a.json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "plan", v[0].e.plan.name);
    if (a.model) cJSON_AddStringToObject(o, "model", a.model);
    cJSON_AddNumberToObject(o, "prompt", (double)a.prompt);
    cJSON_AddNumberToObject(o, "steps", (double)a.steps);
    cJSON_AddNumberToObject(o, "rounds", (double)a.rounds);
    cJSON_AddNumberToObject(o, "workers", (double)a.workers);
    cJSON_AddNumberToObject(o, "table_bytes", (double)v[0].table_bytes);
    cJSON *arr = cJSON_AddArrayToObject(o, "variants");
    for (int i = 0; i < 3; i++) {
      cJSON *e = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "name", v[i].name);
      cJSON_AddNumberToObject(e, "step_ms_median", step_ms[i]);
      cJSON_AddNumberToObject(e, "prefetch_ms_per_step", pf_ms[i]);
      cJSON_AddNumberToObject(e, "faults_per_step", faults[i]);
      if (!isnan(overlap[i])) cJSON_AddNumberToObject(e, "prefetch_overlap", overlap[i]);
      cJSON_AddItemToArray(arr, e);
    }
    cJSON_AddBoolToObject(o, "bitwise_equal", true);
    cli_print_json(o);
  } else if (!status) {
    printf("cedar bench engram: plan %s, prompt %lld, %lld decode steps x %lld rounds (variants interleaved), %s; "
           "Engram tables %.1f MiB%s%s\n", v[0].e.plan.name, (long long)a.prompt, (long long)a.steps, (long long)a.rounds,
           a.workers ? "StarPU" : "direct executor", (double)v[0].table_bytes / (1 << 20), a.model ? "; checkpoint " : "",
           a.model ? a.model : "");
    if (a.workers) printf("StarPU CPU workers: %lld\n", (long long)a.workers);
    printf("%-10s %15s %17s %12s%s\n", "tier", "median step ms", "prefetch ms/step", "faults/step",
           a.workers ? "  prefetch beside layers" : "");
    for (int i = 0; i < 3; i++) {
      printf("%-10s %15.3f %17.4f %12.1f", v[i].name, step_ms[i], pf_ms[i], faults[i]);
      if (a.workers && !isnan(overlap[i])) printf(" %22.1f%%", 100 * overlap[i]);
      printf("\n");
    }
    printf("median step: mmap warm / memory %.3f, mmap cold / memory %.3f; tokens and logits bitwise equal\n",
           step_ms[1] / step_ms[0], step_ms[2] / step_ms[0]);
  }
  for (int i = 0; i < 3; i++) {
    rt_gen_result_free(&v[i].first);
    free(v[i].step_s);
    if (v[i].open) rt_engine_close(&v[i].e);
  }
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "cedar bench engram: could not remove %s\n", dir);
  return status;
}
