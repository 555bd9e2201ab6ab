/* cmd_bench_pp.c: `cedar bench pp`, layer stages on several ranks against
 * one process, measured side by side in one mpirun (runtime/dist/pipeline.h).
 *
 *   mpirun -np S cedar bench pp [--plan P] [--prompt-len N] [--chunk N] [--max-new N]
 *                              [--executor direct|starpu] [--workers N] [--json]
 *
 * In one run, in this order: one process (rank 0 runs the plan with its
 * stages dropped while the other ranks sleep in a polling barrier), then the
 * same request through the stages. Rank 0 prints: TTFT and prefill time of
 * both and their ratio; each rank's prefill busy time (its own non-transfer
 * nodes, from the recorded node times) over the rank-time (the first
 * stage's start to the last rank's end, one monotonic clock on one host);
 * the pipeline efficiency (busy over rank-time, all ranks) and the bubble
 * fraction against the ideal C / (C + S - 1) for C chunks through S equal
 * stages; and the activation bytes the prefill moved against the per-rank
 * accounting (runtime/dist/place_cost.h: act B/tok x prompt tokens, which counts
 * every position across every boundary: a stage of CED decoder layers
 * receives only its replay's positions, so it is an upper bound there).
 */
#include <cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "base/check.h"
#include "cli/cli.h"
#include "cli/run_place.h"
#include "runtime/engine/engine.h"
#include "runtime/dist/pd.h"
#include "runtime/dist/pipeline.h"
#include "runtime/dist/place_cost.h"
#include "scheduler/plan_place.h"

#define BENCH_PP_PLAN "plans/v41-mini-pp2.yaml"

struct bopts {
  const char *plan;
  int64_t n, chunk, max_new, workers;
  enum rt_executor ex;
  bool json;
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np S cedar bench pp [--plan P] [--prompt-len N] [--chunk N] [--max-new N]\n"
          "                                  [--executor direct|starpu] [--workers N] [--json]\n"
          "\n"
          "Layer stages (serving.placement.stages) on S ranks against one process, in one run: rank 0\n"
          "first runs the plan with its stages dropped (the other ranks sleep), then every rank runs\n"
          "its stages of the same request. Rank 0 prints TTFT and prefill time of both and their ratio;\n"
          "each rank's prefill busy time (its own non-transfer nodes) over the rank-time (the first\n"
          "stage's start to the last rank's end, one clock on one host); the pipeline efficiency (busy\n"
          "over rank-time, all ranks) and bubble fraction against the ideal C / (C + S - 1) for C\n"
          "chunks through S equal stages; and the activation bytes the prefill moved against\n"
          "`cedar plan cost --per-rank` (act B/tok x prompt tokens).\n"
          "\n"
          "options:\n"
          "  --plan P          a plan with stages (default %s)\n"
          "  --prompt-len N    prompt tokens (default 512)\n"
          "  --chunk N         prefill chunk (default: the plan's serving.prefill_chunk)\n"
          "  --max-new N       tokens to generate (default 4)\n"
          "  --executor E      direct (default) or starpu\n"
          "  --workers N       StarPU CPU workers per rank (default 1: the ranks share this machine)\n"
          "  --json            one JSON object instead of the text\n"
          "  -h, --help        show this help\n",
          BENCH_PP_PLAN);
}

static int parse(int argc, char **argv, struct bopts *o) {
  *o = (struct bopts){.plan = BENCH_PP_PLAN, .n = 512, .max_new = 4, .workers = 1, .ex = RT_EXEC_DIRECT};
  static const struct option lo[] = {{"plan", required_argument, NULL, 'p'},    {"prompt-len", required_argument, NULL, 'n'},
                                     {"chunk", required_argument, NULL, 'c'},   {"max-new", required_argument, NULL, 'm'},
                                     {"executor", required_argument, NULL, 'e'}, {"workers", required_argument, NULL, 'w'},
                                     {"json", no_argument, NULL, 'j'},           {"help", no_argument, NULL, 'h'},
                                     {NULL, 0, NULL, 0}};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'p': o->plan = optarg; break;
    case 'n':
      if (!cli_parse_int(optarg, 1, 1 << 20, &o->n)) return cli_usage_error("bench pp", "--prompt-len wants 1..1048576");
      break;
    case 'c':
      if (!cli_parse_int(optarg, 1, 1 << 20, &o->chunk)) return cli_usage_error("bench pp", "--chunk wants 1..1048576");
      break;
    case 'm':
      if (!cli_parse_int(optarg, 1, 1 << 16, &o->max_new)) return cli_usage_error("bench pp", "--max-new wants 1..65536");
      break;
    case 'e':
      if (!rt_executor_parse(optarg, &o->ex)) return cli_usage_error("bench pp", "--executor wants direct or starpu");
      break;
    case 'w':
      if (!cli_parse_int(optarg, 1, 256, &o->workers)) return cli_usage_error("bench pp", "--workers wants 1..256");
      break;
    case 'j': o->json = true; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc) return cli_usage_error("bench pp", "unexpected argument '%s'", argv[optind]);
  return -1;
}

static void report(const struct bopts *o, const struct plan *p, const double single[2], const struct rt_gen_result *res,
                   const struct rt_place_cost *pc, const struct rt_dist_report *rep) {
  const struct rt_pipe_stats *s = &rep->pipe_stats;
  struct run_pipe_fig f;
  run_pipe_figures(p, rep, &f);
  double act_tok = 0;
  for (int r = 0; r < pc->ranks; r++) act_tok += (double)pc->r[r].act_per_token;
  double want = act_tok * (double)o->n, ratio = single[0] > 0 ? res->ttft_s / single[0] : 0;
  if (o->json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "plan", p->name);
    cJSON_AddNumberToObject(j, "prompt", (double)o->n);
    cJSON_AddStringToObject(j, "executor", rt_executor_name(o->ex));
    cJSON_AddNumberToObject(j, "ranks", f.ranks);
    cJSON_AddNumberToObject(j, "stages", f.stages);
    cJSON_AddNumberToObject(j, "chunks", f.chunks);
    cJSON_AddNumberToObject(j, "ttft_single_s", single[0]);
    cJSON_AddNumberToObject(j, "prefill_single_s", single[1]);
    cJSON_AddNumberToObject(j, "ttft_pipeline_s", res->ttft_s);
    cJSON_AddNumberToObject(j, "ttft_ratio", ratio);
    cJSON_AddNumberToObject(j, "prefill_rank_time_s", f.rank_time_s);
    cJSON_AddNumberToObject(j, "prefill_busy_s", f.busy_s);
    cJSON_AddNumberToObject(j, "prefill_efficiency", f.efficiency);
    cJSON_AddNumberToObject(j, "prefill_bubble_fraction", f.bubble);
    cJSON_AddNumberToObject(j, "ideal_efficiency", f.ideal);
    cJSON_AddNumberToObject(j, "ideal_bubble_fraction", f.ideal_bubble);
    cJSON_AddNumberToObject(j, "act_bytes_prefill", (double)s->act_bytes_prefill);
    cJSON_AddNumberToObject(j, "act_bytes_prefill_accounted", want);
    cJSON_AddNumberToObject(j, "kv_bytes_prefill", (double)s->kv_bytes_prefill);
    cJSON *a = cJSON_AddArrayToObject(j, "rank");
    for (int r = 0; r < f.ranks; r++) {
      cJSON *x = cJSON_CreateObject();
      cJSON_AddNumberToObject(x, "prefill_busy_s", s->rank[r].prefill_busy_s);
      cJSON_AddNumberToObject(x, "prefill_idle_fraction",
                              f.rank_time_s > 0 ? 1 - s->rank[r].prefill_busy_s / f.rank_time_s : 0.0);
      cJSON_AddNumberToObject(x, "bytes_sent", (double)s->rank[r].bytes_sent);
      cJSON_AddItemToArray(a, x);
    }
    cli_print_json(j);
    cJSON_Delete(j);
    return;
  }
  printf("bench pp: %s, prompt %lld, %d stages on %d ranks, %d chunks (%s executor)\n", p->name, (long long)o->n,
         f.stages, f.ranks, f.chunks, rt_executor_name(o->ex));
  printf("  TTFT one process %.3f s (prefill %.3f s); stages %.3f s; ratio %.3f\n", single[0], single[1], res->ttft_s,
         ratio);
  for (int r = 0; r < f.ranks; r++)
    printf("  rank %d: prefill busy %.3f s of %.3f s rank-time (idle %.0f%%), sent %lld B\n", r,
           s->rank[r].prefill_busy_s, f.rank_time_s,
           f.rank_time_s > 0 ? 100 * (1 - s->rank[r].prefill_busy_s / f.rank_time_s) : 0.0,
           (long long)s->rank[r].bytes_sent);
  printf("  prefill pipeline efficiency %.2f, bubble fraction %.2f; ideal for %d chunks through %d equal stages %.2f "
         "(bubble %.2f)\n", f.efficiency, f.bubble, f.chunks, f.stages, f.ideal, f.ideal_bubble);
  printf("  activations moved in the prefill %lld B; accounting (plan cost --per-rank: every position across every "
         "boundary; a CED decoder stage receives only its replay's) %.0f B a token x %lld = %.0f B",
         (long long)s->act_bytes_prefill, act_tok, (long long)o->n, want);
  if (s->kv_bytes_prefill) printf("; KV entries to reader stages %lld B", (long long)s->kv_bytes_prefill);
  putchar('\n');
}

int cmd_bench_pp(int argc, char **argv) {
  struct bopts o;
  int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  char err[1024];
  if (comm_begin(&argc, &argv, err, sizeof err)) {
    fprintf(stderr, "cedar bench pp: %s\n", err);
    return 1;
  }
  if (comm_world_size() < 2) {
    fprintf(stderr, "cedar bench pp: it measures layer stages on several ranks: run it under mpirun -np S%s\n",
            comm_mpi_built() ? "" : " (this build has no StarPU-MPI: install libopenmpi-dev and rebuild)");
    comm_end();
    return 1;
  }
  struct rt_engine_opts eo = {.plan = o.plan, .exec = {.executor = o.ex, .workers = (int)o.workers}};
  struct rt_engine e;
  int status = 1;
  if (rt_engine_open(&e, &eo, err, sizeof err)) {
    fprintf(stderr, "cedar bench pp: %s: %s\n", o.plan, err);
    comm_end();
    return 1;
  }
  struct plan *p = &e.plan;
  int me = comm_world_rank();
  struct rt_place_cost *pc = cedar_xcalloc(1, sizeof *pc);
  if (!plan_has_stages(p) || rt_pd_split(p)) {
    fprintf(stderr, "cedar bench pp: %s has no layer stages (serving.placement.stages); give one (%s)\n", o.plan,
            BENCH_PP_PLAN);
    goto out;
  }
  if (rt_place_cost(p, o.n, 141e9, pc)) {
    fprintf(stderr, "cedar bench pp: plan cost --per-rank: %s\n", pc->error);
    goto out;
  }
  int32_t *tok = cedar_xmalloc(sizeof(int32_t) * (size_t)o.n);
  for (int64_t i = 0; i < o.n; i++) tok[i] = (int32_t)((i * 7919 + 13) % p->model.vocab);
  struct rt_gen_opts go = {.chunk = (int)o.chunk, .replay = -1, .max_new = (int)o.max_new, .temperature = 0,
                           .top_p = 1, .seed = 1, .executor = o.ex};
  /* 1. one process on rank 0, the stages dropped; the others wait */
  double single[2] = {0, 0}; /* TTFT, prefill graph seconds */
  comm_barrier();
  if (me == 0) {
    int save = p->serving.place.n_stages;
    enum graph_run run = e.run; /* the engine's driver follows: one home */
    p->serving.place.n_stages = 0;
    e.run = GRAPH_RUN_ONE;
    struct rt_request r = {0};
    struct rt_gen_result res = {0};
    int grc = rt_engine_generate(&e, &r, tok, o.n, &go, &res, err, sizeof err);
    if (grc) fprintf(stderr, "cedar bench pp: the one-process run: %s\n", err);
    single[0] = grc ? -1 : res.ttft_s;
    single[1] = grc ? -1 : res.prefill.seconds;
    rt_gen_result_free(&res);
    rt_engine_request_free(&e, &r);
    p->serving.place.n_stages = save;
    e.run = run;
  }
  comm_barrier();
  /* 2. the stages */
  struct rt_request r = {0};
  struct rt_gen_result res = {0};
  int grc = rt_engine_generate(&e, &r, tok, o.n, &go, &res, err, sizeof err);
  free(tok);
  if (grc == RT_GEN_ELSEWHERE) { /* another rank than 0: rank 0 reports */
    status = 0;
  } else if (grc) {
    fprintf(stderr, "cedar bench pp: the staged run: %s\n", err);
  } else if (single[0] < 0) {
    fprintf(stderr, "cedar bench pp: no one-process figure\n");
  } else {
    report(&o, p, single, &res, pc, &e.dist);
    status = 0;
  }
  rt_gen_result_free(&res);
  rt_engine_request_free(&e, &r);
out:
  free(pc);
  rt_engine_close(&e);
  comm_end();
  return status;
}
