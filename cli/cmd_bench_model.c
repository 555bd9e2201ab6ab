/* cmd_bench_model.c: `cedar bench model`, the whole model side by side on
 * several plans in one run: cold prefill of N tokens, then decode steps, with
 * synthetic weights, on one or more executors: direct, and StarPU with each
 * worker count asked for. Reports per plan and executor the prefill time,
 * token-layers, decode tokens per second and the time by op group; against
 * the first row the time ratio beside the token-layer ratio (SPEC 6.2:
 * CED's (20N + 20 min(N, 128)) / 40N against the dense plan); and, when
 * StarPU runs beside direct, its overhead on one worker, its speedup on
 * two, the per-task overhead, tasks per prefill chunk and per decode step,
 * and two parallel ceilings measured in the same run: the machine's (the
 * same one-thread sgemm loop on one thread, then on two threads at once)
 * and the model's (two direct prefills at once, one thread each, against
 * one), since the attention's memory traffic scales worse than sgemm.
 *
 * Nothing is asserted: compare the ratios, not the times (these machines are
 * noisy). docs/PERF.md records runs with the command that made them.
 */
#include <cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/bench.h"
#include "ops/basic.h"
#include "ops/isa.h"
#include "base/check.h"
#include "cli/bench_load.h"
#include "cli/weights_resident.h"
#include "cli/cli.h"
#include "runtime/engine/engine.h"

#define MAX_PLANS 8
#define MAX_CONFIGS 6

static const char usage[] =
    "usage: cedar bench model [--plan P]... [--prompt-len N] [--decode S] [--chunk C] [--seed S]\n"
    "                         [--weights-format stored|f32] [--executor direct,starpu] [--workers 1,2] [--sched NAME] [--repeat R] [--json]\n"
    "Cold prefill of N tokens (default 4096) then S decode steps (default 16) on each plan P\n"
    "(default: plans/v41-mini.yaml and plans/dense-40.yaml), one after the other in this run, with\n"
    "synthetic weights from seed S (default 0), on each executor listed (default direct): direct\n"
    "(one thread), and starpu once per worker count listed (default 1,2) under policy NAME\n"
    "(default StarPU's). Prints per plan and executor: prefill seconds and token-layers, decode\n"
    "tokens/s, time by op group; against the first row, the prefill time ratio beside the\n"
    "token-layer ratio. With both executors: StarPU's overhead on one worker and speedup on two\n"
    "against direct, the per-task overhead, tasks per prefill chunk and per decode step, and two\n"
    "parallel ceilings measured in the same run: the machine's (a one-thread sgemm loop on one,\n"
    "then two threads) and the model's (two direct prefills at once, one thread each, against\n"
    "one). --repeat R (default 1) runs every configuration R times, interleaved (each\n"
    "round runs the ceiling loop and every executor once), and keeps each figure's minimum: on a\n"
    "shared machine the least disturbed run. The prompt is byte tokens of a fixed text. Nothing\n"
    "is asserted; docs/PERF.md keeps results with their command.\n"
    "  --model DIR  a checkpoint in the released layout (docs/checkpoints.md): first its load time\n"
    "               against a plain read of the same files and the RSS against the weights' bytes,\n"
    "               then the runs above with its weights on the plan its config implies (or each P)\n"
    CLI_WEIGHTS_FORMAT_HELP
    "Each plan's run first prints its resident weight bytes by format beside `plan cost`'s figure.\n";

/* One way of running: direct, or StarPU with a worker count. */
struct config {
  enum rt_executor ex;
  int workers;
  char name[24];
};

struct result {
  const char *path;
  char name[64];
  struct rt_gen_result res[MAX_CONFIGS];
  int ok[MAX_CONFIGS];
  int64_t chunks;   /* prefill tiles of the prompt */
  double pair_s;    /* two direct prefills at once, one thread each (minimum over rounds) */
};

struct bench {
  struct config cfg[MAX_CONFIGS];
  int n_cfg;
  const char *sched;
  int64_t n, steps;
  int chunk;
  uint64_t seed;
  int repeat;
  const char *model;
  bool weights_f32, json; /* --weights-format f32; --json (no resident line then) */
  double ceiling_t1, ceiling_t2; /* the sgemm loop: one thread; two threads at once (minimum over rounds) */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the machine's parallel ceiling ---------------------------------------- */

/* The loop: op_linear (one BLAS thread) at a v41-mini prefill-tile shape,
 * (512 x 256) x (256 x 1024), repeated. */
#define CEIL_N 512
#define CEIL_IN 256
#define CEIL_OUT 1024
#define CEIL_REPS 40

static void *ceil_loop(void *arg) {
  float *b = arg, *x = b, *W = b + CEIL_N * CEIL_IN, *y = W + CEIL_IN * CEIL_OUT;
  for (int r = 0; r < CEIL_REPS; r++) op_linear(y, x, W, CEIL_N, CEIL_IN, CEIL_OUT, CEIL_IN, CEIL_OUT);
  return NULL;
}

/* Seconds for the loop on one thread, then on two threads at once (each
 * its own buffers). Ceiling = 2 t1 / t2. */
static void measure_ceiling(struct bench *B) {
  op_blas_init();
  size_t floats = (size_t)CEIL_N * CEIL_IN + (size_t)CEIL_IN * CEIL_OUT + (size_t)CEIL_N * CEIL_OUT;
  float *buf[2];
  for (int t = 0; t < 2; t++) {
    buf[t] = cedar_xmalloc(sizeof(float) * floats);
    for (size_t i = 0; i < floats; i++) buf[t][i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  }
  ceil_loop(buf[0]); /* warm up */
  double t = now_s();
  ceil_loop(buf[0]);
  t = now_s() - t;
  if (B->ceiling_t1 == 0 || t < B->ceiling_t1) B->ceiling_t1 = t;
  pthread_t th[2];
  t = now_s();
  for (int i = 0; i < 2; i++) CEDAR_ASSERT(pthread_create(&th[i], NULL, ceil_loop, buf[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  t = now_s() - t;
  if (B->ceiling_t2 == 0 || t < B->ceiling_t2) B->ceiling_t2 = t;
  free(buf[0]);
  free(buf[1]);
}

static double ceiling(const struct bench *B) { return B->ceiling_t2 > 0 ? 2 * B->ceiling_t1 / B->ceiling_t2 : 0; }

/* ---- runs -------------------------------------------------------------------- */

static void find_cfgs(const struct bench *B, int *d, int *s1, int *s2);

/* One direct prefill on pools of its own (the pools' page arrays are not
 * safe to grow from two threads: docs/runtime.md). */
struct pair_job {
  const struct rt_engine *e;
  const int32_t *tok;
  long n;
  int chunk;
  int rc;
};

static void *pair_prefill(void *arg) {
  struct pair_job *j = arg;
  char err[512];
  struct rt_gen_result res = {0};
  struct rt_gen_opts go = {.chunk = j->chunk, .replay = -1, .max_new = 1, .top_p = 1};
  j->rc = rt_engine_generate_isolated(j->e, j->tok, j->n, &go, &res, err, sizeof err);
  rt_gen_result_free(&res);
  return NULL;
}

/* The model's own ceiling: two direct prefills at once, one thread each
 * (against one direct prefill alone, the direct row). */
static void measure_pair(struct result *r, const struct bench *B, const struct rt_engine *e, const int32_t *tok) {
  struct pair_job j[2] = {{e, tok, B->n, B->chunk, 0}, {e, tok, B->n, B->chunk, 0}};
  pthread_t th[2];
  double t = now_s();
  for (int i = 0; i < 2; i++) CEDAR_ASSERT(pthread_create(&th[i], NULL, pair_prefill, &j[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  t = now_s() - t;
  if (!j[0].rc && !j[1].rc && (r->pair_s == 0 || t < r->pair_s)) r->pair_s = t;
}

/* Keep the run with the shorter prefill, and the shorter steady ITL. */
static void keep_best(struct rt_gen_result *best, struct rt_gen_result *got, bool first) {
  if (first) {
    *best = *got;
    return;
  }
  double itl = got->steady_itl_s < best->steady_itl_s ? got->steady_itl_s : best->steady_itl_s;
  if (got->ttft_s < best->ttft_s) {
    rt_gen_result_free(best);
    *best = *got;
  } else {
    rt_gen_result_free(got);
  }
  best->steady_itl_s = itl;
}

/* One generate on configuration c; the best of the rounds is kept. StarPU
 * is started for the run and stopped after it, so direct runs have no
 * StarPU workers alive. */
static int run_config(struct result *r, const struct bench *B, int c, struct rt_engine *e, const int32_t *tok,
                      bool first) {
  const struct config *cf = &B->cfg[c];
  char err[1024];
  struct rt_gen_opts go = {.chunk = B->chunk, .replay = -1, .max_new = (int)B->steps + 1, .top_p = 1,
                           .seed = B->seed};
  struct rt_engine_exec x = {.executor = cf->ex, .workers = cf->workers, .sched = B->sched};
  int rc = rt_engine_set_exec(e, &x, err, sizeof err);
  struct rt_request q = {0};
  struct rt_gen_result got = {0};
  if (!rc) rc = rt_engine_generate(e, &q, tok, B->n, &go, &got, err, sizeof err);
  rt_engine_request_free(e, &q);
  char ignored[8]; /* switching to direct cannot fail */
  rt_engine_set_exec(e, &(struct rt_engine_exec){.executor = RT_EXEC_DIRECT}, ignored, sizeof ignored);
  if (rc) {
    fprintf(stderr, "cedar bench model: %s, %s: %s\n", r->path ? r->path : B->model, cf->name, err);
    rt_gen_result_free(&got);
    return rc;
  }
  keep_best(&r->res[c], &got, first);
  return 0;
}

/* Every configuration on one plan, --repeat rounds, through one engine per
 * plan whose executor is switched per configuration (rt_engine_set_exec):
 * the rounds interleave the configurations, so an engine per configuration
 * would either rebuild the weights for every run or hold several StarPU
 * starts at once, which a process cannot. Weights and model are built once;
 * each round measures the ceiling first. */
static int run_plan(struct result *r, struct bench *B) {
  char err[1024];
  struct plan_diags diags = {0};
  struct rt_engine_opts eo = {.plan = r->path, .model = B->model, .seed = B->model ? 0 : B->seed,
                              .weights_f32 = B->weights_f32, .diags = &diags};
  struct rt_engine e;
  int rc = rt_engine_open(&e, &eo, err, sizeof err);
  if (rc && e.failed == RT_ENGINE_PLAN) {
    plan_diags_print(&diags, stderr);
    fprintf(stderr, "cedar bench model: %s\n", err);
  } else if (rc) {
    fprintf(stderr, "cedar bench model: %s: %s\n", r->path ? r->path : B->model, err);
  }
  plan_diags_free(&diags);
  if (rc) return 1;
  const struct plan *p = &e.plan;
  if (!B->json) cli_weights_resident_line(stdout, p, &e.weights);
  snprintf(r->name, sizeof(r->name), "%s", p->name);
  int32_t *tok = cedar_xmalloc(sizeof(int32_t) * (size_t)B->n);
  static const char text[] = "The quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. ";
  for (long i = 0; i < B->n; i++) tok[i] = (unsigned char)text[i % (long)(sizeof(text) - 1)] % p->model.vocab;
  int chunk = B->chunk > 0 ? B->chunk : p->serving.prefill_chunk;
  r->chunks = (B->n + chunk - 1) / chunk;
  int d, s1, s2;
  find_cfgs(B, &d, &s1, &s2);
  for (int round = 0; round < B->repeat && !rc; round++) {
    measure_ceiling(B);
    if (d >= 0 && s2 >= 0) measure_pair(r, B, &e, tok);
    for (int c = 0; c < B->n_cfg && !rc; c++) {
      rc = run_config(r, B, c, &e, tok, round == 0);
      r->ok[c] = rc == 0;
    }
  }
  free(tok);
  rt_engine_close(&e);
  return rc ? 1 : 0;
}

static double tok_s(const struct rt_gen_result *g) { return g->steady_itl_s > 0 ? 1.0 / g->steady_itl_s : 0; }

/* ---- the executor comparison ------------------------------------------------ */

/* Rows of the direct run and of StarPU on one and on two workers (-1: not run). */
static void find_cfgs(const struct bench *B, int *d, int *s1, int *s2) {
  *d = *s1 = *s2 = -1;
  for (int c = 0; c < B->n_cfg; c++) {
    if (B->cfg[c].ex == RT_EXEC_DIRECT) *d = c;
    if (B->cfg[c].ex == RT_EXEC_STARPU && B->cfg[c].workers == 1) *s1 = c;
    if (B->cfg[c].ex == RT_EXEC_STARPU && B->cfg[c].workers == 2) *s2 = c;
  }
}

struct cmp {
  double overhead_prefill, overhead_decode; /* StarPU x1 / direct */
  double task_us_prefill, task_us_decode;   /* (StarPU x1 - direct) per task */
  double speedup_prefill, speedup_decode;   /* direct / StarPU x2 */
  double model_ceiling;                     /* 2 x direct prefill / two direct prefills at once */
  double tasks_per_chunk;
  int tasks_per_step;
  bool has1, has2;
};

static struct cmp compare(const struct result *r, const struct bench *B) {
  struct cmp c = {0};
  int d, s1, s2;
  find_cfgs(B, &d, &s1, &s2);
  if (d < 0 || !r->ok[d]) return c;
  const struct rt_gen_result *D = &r->res[d];
  c.tasks_per_chunk = (double)D->prefill_nodes / (double)r->chunks;
  c.tasks_per_step = D->decode_nodes;
  if (s1 >= 0 && r->ok[s1]) {
    const struct rt_gen_result *S = &r->res[s1];
    c.has1 = true;
    c.overhead_prefill = S->ttft_s / D->ttft_s;
    c.overhead_decode = S->steady_itl_s / D->steady_itl_s;
    c.task_us_prefill = 1e6 * (S->ttft_s - D->ttft_s) / D->prefill_nodes;
    c.task_us_decode = D->decode_nodes ? 1e6 * (S->steady_itl_s - D->steady_itl_s) / D->decode_nodes : 0;
  }
  if (s2 >= 0 && r->ok[s2]) {
    c.has2 = true;
    c.speedup_prefill = D->ttft_s / r->res[s2].ttft_s;
    c.model_ceiling = r->pair_s > 0 ? 2 * D->ttft_s / r->pair_s : 0;
    c.speedup_decode = r->res[s2].steady_itl_s > 0 ? D->steady_itl_s / r->res[s2].steady_itl_s : 0;
  }
  return c;
}

/* ---- printing ---------------------------------------------------------------- */

static void print_compare_text(const struct result *r, int n_plans, const struct bench *B) {
  printf("\nparallel ceiling of this machine (op_linear 512x256x1024, one BLAS thread, x%d): one thread %.3f s, two "
         "threads at once %.3f s: ceiling %.2fx\n",
         CEIL_REPS, B->ceiling_t1, B->ceiling_t2, ceiling(B));
  for (int i = 0; i < n_plans; i++) {
    struct cmp c = compare(&r[i], B);
    if (!c.has1 && !c.has2) continue;
    printf("  %-16s tasks: %.1f per prefill chunk, %d per decode step\n", r[i].name, c.tasks_per_chunk,
           c.tasks_per_step);
    if (c.has1)
      printf("  %-16s StarPU x1 / direct: prefill %.3f, decode step %.3f; per-task overhead %.1f us (prefill), "
             "%.1f us (decode)\n",
             "", c.overhead_prefill, c.overhead_decode, c.task_us_prefill, c.task_us_decode);
    if (c.has2) {
      printf("  %-16s model ceiling: two direct prefills at once (one thread each) %.3f s against one %.3f s: %.2fx\n",
             "", r[i].pair_s, r[i].res[0].ttft_s, c.model_ceiling);
      printf("  %-16s direct / StarPU x2: prefill %.2fx (%.0f%% of the sgemm ceiling, %.0f%% of the model ceiling), "
             "decode step %.2fx\n",
             "", c.speedup_prefill, ceiling(B) > 0 ? 100 * c.speedup_prefill / ceiling(B) : 0,
             c.model_ceiling > 0 ? 100 * c.speedup_prefill / c.model_ceiling : 0, c.speedup_decode);
    }
  }
}

static void print_text(const struct result *r, int n_plans, const struct bench *B) {
  char core[128];
  bench_blas_core(core, sizeof core);
  printf("cold prefill of %" PRId64 " tokens, then %" PRId64 " decode steps%s%s; minimum of %d interleaved run%s; "
         "kernels at %s (CEDAR_ISA); BLAS %s\n\n", B->n, B->steps, B->sched ? "; StarPU policy " : "",
         B->sched ? B->sched : "", B->repeat, B->repeat > 1 ? "s" : "", op_isa_name(op_isa()), core);
  printf("%-16s %-10s %10s %14s %10s %10s %12s %12s\n", "plan", "executor", "prefill s", "token-layers", "time/1st",
         "tl/1st", "decode tok/s", "ITL ms");
  const struct rt_gen_result *first = &r[0].res[0];
  for (int i = 0; i < n_plans; i++)
    for (int c = 0; c < B->n_cfg; c++) {
      if (!r[i].ok[c]) continue;
      const struct rt_gen_result *g = &r[i].res[c];
      printf("%-16s %-10s %10.3f %14lld %10.3f %10.3f %12.1f %12.2f\n", r[i].name, B->cfg[c].name, g->ttft_s,
             (long long)g->prefill.token_layers, g->ttft_s / first->ttft_s,
             (double)g->prefill.token_layers / (double)first->prefill.token_layers, tok_s(g), 1e3 * g->steady_itl_s);
    }
  printf("\ntime by op group, %% of prefill | %% of decode (summed task time):\n");
  for (int i = 0; i < n_plans; i++)
    for (int c = 0; c < B->n_cfg; c++) {
      if (!r[i].ok[c]) continue;
      const struct rt_gen_result *g = &r[i].res[c];
      double tp = 0, td = 0;
      for (int k = 0; k < GRAPH_OP_COUNT; k++) tp += g->prefill.op_seconds[k], td += g->decode.op_seconds[k];
      printf("  %-16s %-10s", r[i].name, B->cfg[c].name);
      for (int k = 0; k < GRAPH_OP_COUNT; k++)
        if (g->prefill.op_nodes[k])
          printf(" %s %.1f|%.1f", graph_op_name(k), 100 * g->prefill.op_seconds[k] / tp,
                 td > 0 ? 100 * g->decode.op_seconds[k] / td : 0.0);
      printf("\n");
    }
  printf("\ntime inside the ops by op family, %% of prefill | %% of decode:\n");
  for (int i = 0; i < n_plans; i++)
    for (int c = 0; c < B->n_cfg; c++) {
      if (!r[i].ok[c]) continue;
      const struct rt_gen_result *g = &r[i].res[c];
      double tp = 0, td = 0;
      for (int k = 0; k < RT_FAM_COUNT; k++) tp += g->prefill.family_seconds[k], td += g->decode.family_seconds[k];
      printf("  %-16s %-10s", r[i].name, B->cfg[c].name);
      for (int k = 0; k < RT_FAM_COUNT; k++)
        printf(" %s %.1f|%.1f", rt_family_name(k), tp > 0 ? 100 * g->prefill.family_seconds[k] / tp : 0.0,
               td > 0 ? 100 * g->decode.family_seconds[k] / td : 0.0);
      printf("\n");
    }
  print_compare_text(r, n_plans, B);
}

static void json_compare(cJSON *o, const struct result *r, const struct bench *B) {
  struct cmp c = compare(r, B);
  if (!c.has1 && !c.has2) return;
  cJSON *e = cJSON_AddObjectToObject(o, "executors");
  cJSON_AddNumberToObject(e, "tasks_per_prefill_chunk", c.tasks_per_chunk);
  cJSON_AddNumberToObject(e, "tasks_per_decode_step", c.tasks_per_step);
  if (c.has1) {
    cJSON_AddNumberToObject(e, "overhead_x1_prefill", c.overhead_prefill);
    cJSON_AddNumberToObject(e, "overhead_x1_decode", c.overhead_decode);
    cJSON_AddNumberToObject(e, "task_overhead_us_prefill", c.task_us_prefill);
    cJSON_AddNumberToObject(e, "task_overhead_us_decode", c.task_us_decode);
  }
  if (c.has2) {
    cJSON_AddNumberToObject(e, "speedup_x2_prefill", c.speedup_prefill);
    cJSON_AddNumberToObject(e, "speedup_x2_decode", c.speedup_decode);
    cJSON_AddNumberToObject(e, "speedup_x2_prefill_of_ceiling", ceiling(B) > 0 ? c.speedup_prefill / ceiling(B) : 0);
    cJSON_AddNumberToObject(e, "model_ceiling", c.model_ceiling);
    cJSON_AddNumberToObject(e, "pair_prefill_s", r->pair_s);
  }
}

static void print_json(const struct result *r, int n_plans, const struct bench *B) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "prompt_len", (double)B->n);
  cJSON_AddNumberToObject(j, "decode_steps", (double)B->steps);
  bench_blas_json(cJSON_AddObjectToObject(j, "machine"));
  cJSON *ce = cJSON_AddObjectToObject(j, "ceiling");
  cJSON_AddNumberToObject(ce, "one_thread_s", B->ceiling_t1);
  cJSON_AddNumberToObject(ce, "two_threads_s", B->ceiling_t2);
  cJSON_AddNumberToObject(ce, "speedup", ceiling(B));
  cJSON *a = cJSON_AddArrayToObject(j, "plans");
  const struct rt_gen_result *first = &r[0].res[0];
  for (int i = 0; i < n_plans; i++)
    for (int c = 0; c < B->n_cfg; c++) {
      if (!r[i].ok[c]) continue;
      const struct rt_gen_result *g = &r[i].res[c];
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "plan", r[i].name);
      cJSON_AddStringToObject(o, "executor", B->cfg[c].name);
      cJSON_AddNumberToObject(o, "prefill_s", g->ttft_s);
      cJSON_AddNumberToObject(o, "prefill_token_layers", (double)g->prefill.token_layers);
      cJSON_AddNumberToObject(o, "time_ratio", g->ttft_s / first->ttft_s);
      cJSON_AddNumberToObject(o, "token_layer_ratio", (double)g->prefill.token_layers / (double)first->prefill.token_layers);
      cJSON_AddNumberToObject(o, "decode_tok_s", tok_s(g));
      cJSON_AddNumberToObject(o, "itl_steady_s", g->steady_itl_s);
      cJSON *ops = cJSON_AddObjectToObject(o, "op_seconds");
      for (int k = 0; k < GRAPH_OP_COUNT; k++) {
        if (!g->prefill.op_nodes[k]) continue;
        cJSON *e = cJSON_AddObjectToObject(ops, graph_op_name(k));
        cJSON_AddNumberToObject(e, "prefill", g->prefill.op_seconds[k]);
        cJSON_AddNumberToObject(e, "decode", g->decode.op_seconds[k]);
      }
      if (c == 0) json_compare(o, &r[i], B);
      cJSON_AddItemToArray(a, o);
    }
  cli_print_json(j);
}

/* ---- options ------------------------------------------------------------------- */

/* --executor LIST and --workers LIST into configurations: direct first,
 * then StarPU per worker count. */
static int make_configs(struct bench *B, const char *ex, const char *workers) {
  bool direct = false, starpu = false;
  char *copy = cedar_xstrdup(ex ? ex : "direct"), *save = NULL;
  for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    enum rt_executor e;
    if (rt_executor_parse(t, &e))
      *(e == RT_EXEC_DIRECT ? &direct : &starpu) = true;
    else {
      int rc = cli_usage_error("bench model", "--executor takes direct, starpu or both, comma-separated (got '%s')", t);
      free(copy); /* t points into it */
      return rc;
    }
  }
  free(copy);
  if (direct) B->cfg[B->n_cfg++] = (struct config){RT_EXEC_DIRECT, 0, "direct"};
  if (!starpu) return workers ? cli_usage_error("bench model", "--workers needs --executor starpu") : -1;
  copy = cedar_xstrdup(workers ? workers : "1,2");
  save = NULL;
  for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int64_t v;
    if (!cli_parse_int(t, 1, 64, &v) || B->n_cfg == MAX_CONFIGS) {
      free(copy);
      return cli_usage_error("bench model", "--workers takes up to %d counts >= 1, comma-separated", MAX_CONFIGS - 1);
    }
    struct config *c = &B->cfg[B->n_cfg++];
    *c = (struct config){RT_EXEC_STARPU, (int)v, ""};
    snprintf(c->name, sizeof c->name, "starpu x%" PRId64, v);
  }
  free(copy);
  return -1;
}

int cmd_bench_model(int argc, char **argv) {
  static const struct option opts[] = {{"plan", required_argument, NULL, 'p'},
                                       {"prompt-len", required_argument, NULL, 'n'},
                                       {"decode", required_argument, NULL, 'd'},
                                       {"chunk", required_argument, NULL, 'c'},
                                       {"seed", required_argument, NULL, 's'},
                                       {"executor", required_argument, NULL, 'E'},
                                       {"workers", required_argument, NULL, 'W'},
                                       {"sched", required_argument, NULL, 'S'},
                                       {"repeat", required_argument, NULL, 'R'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},
                                       {"model", required_argument, NULL, 'M'},
                                       {"weights-format", required_argument, NULL, 'F'},
                                       {0, 0, 0, 0}};
  static struct result r[MAX_PLANS];
  memset(r, 0, sizeof(r));
  struct bench B = {.n = 4096, .steps = 16, .repeat = 1};
  const char *ex = NULL, *workers = NULL;
  int n_plans = 0, c;
  int64_t v;
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
      if (!cli_parse_int(optarg, 1, 1 << 22, &B.n)) return cli_usage_error("bench model", "--prompt-len takes N >= 1");
      break;
    case 'd':
      if (!cli_parse_int(optarg, 0, 1 << 16, &B.steps)) return cli_usage_error("bench model", "--decode takes S >= 0");
      break;
    case 'c':
      if (!cli_parse_int(optarg, 1, 1 << 20, &v)) return cli_usage_error("bench model", "--chunk takes C >= 1");
      B.chunk = (int)v;
      break;
    case 's':
      if (!cli_parse_int(optarg, 0, 1L << 62, &v)) return cli_usage_error("bench model", "--seed takes S >= 0");
      B.seed = (uint64_t)v;
      break;
    case 'E': ex = optarg; break;
    case 'W': workers = optarg; break;
    case 'S': B.sched = optarg; break;
    case 'R':
      if (!cli_parse_int(optarg, 1, 100, &v)) return cli_usage_error("bench model", "--repeat takes R in [1, 100]");
      B.repeat = (int)v;
      break;
    case 'j': json = B.json = true; break;
    case 'M': B.model = optarg; break;
    case 'F':
      if (!cli_parse_weights_format(optarg, &B.weights_f32))
        return cli_usage_error("bench model", "--weights-format takes stored or f32, not '%s'", optarg);
      break;
    case 'h': fputs(usage, stdout); return 0;
    default:
      return cli_usage_error("bench model", "bad option, or an option without its value: '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("bench model", "unexpected argument '%s'", argv[optind]);
  int rc = make_configs(&B, ex, workers);
  if (rc >= 0) return rc;
  if (B.model) {
    if (bench_load(B.model, r[0].path, B.repeat, json, B.weights_f32)) return 1;
    if (!n_plans) n_plans = 1; /* the plan the checkpoint implies (path NULL) */
  }
  if (!n_plans) {
    r[n_plans++].path = "plans/v41-mini.yaml";
    r[n_plans++].path = "plans/dense-40.yaml";
  }
  int status = 0;
  for (int i = 0; i < n_plans; i++) {
    if (!json) fprintf(stderr, "bench model: %s ...\n", r[i].path ? r[i].path : B.model);
    status |= run_plan(&r[i], &B);
  }
  if (!r[0].ok[0]) status = 1;
  if (r[0].ok[0]) (json ? print_json : print_text)(r, n_plans, &B);
  for (int i = 0; i < n_plans; i++)
    for (int k = 0; k < B.n_cfg; k++) rt_gen_result_free(&r[i].res[k]);
  return status;
}
