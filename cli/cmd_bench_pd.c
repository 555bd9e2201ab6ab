/* cmd_bench_pd.c: `cedar bench pd`, prefill and decode on two ranks against
 * one process, measured side by side in one mpirun (runtime/dist/pd.h).
 *
 *   mpirun -np 2 cedar bench pd [--plan P] [--prompt-len N] [--chunk N] [--workers N] [--json]
 *
 * In one run, in this order: the link's one-way bandwidth (plain MPI, P's
 * rank to D's, messages of the package's sizes); TTFT of one process (the
 * same engine with the placement collapsed onto P's rank, D's rank asleep);
 * TTFT of the P/D request (P's request start to D ready with y1, one
 * CLOCK_MONOTONIC on one host); the overlap (the fraction of KV bytes that
 * arrived before P's prefill graph ended, from the recorded times); and the
 * transfer's bandwidth: the package's bytes over the time at least one
 * message was in flight (the union of [send posted on P, arrival on D]).
 * The decode rank prints the report.
 */
#include <cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "base/check.h"
#include "cli/cli.h"
#include "runtime/engine/engine.h"
#include "runtime/dist/pd.h"

#define BENCH_PD_PLAN "plans/v41-mini-pd.yaml"

struct bopts {
  const char *plan;
  int64_t n, chunk, workers;
  bool json;
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np 2 cedar bench pd [--plan P] [--prompt-len N] [--chunk N] [--workers N] [--json]\n"
          "\n"
          "Prefill on one rank and decode on another (the plan's serving.placement) against one\n"
          "process, in one run: the MPI link's one-way bandwidth between the two ranks (plain MPI,\n"
          "1 MiB and 8 MiB messages); TTFT of one process (the same engine, placement collapsed onto\n"
          "the prefill rank, the other rank asleep); TTFT of the P/D request (the prefill rank's\n"
          "request start to the decode rank ready with y1: one clock on one host); the overlap (the\n"
          "fraction of KV bytes that arrived before the prefill graph ended, from the recorded times);\n"
          "and the transfer's bandwidth (the package's bytes over the time a message was in flight).\n"
          "The decode rank prints the report. StarPU executor; one request of --max-new 1.\n"
          "\n"
          "options:\n"
          "  --plan P          a P/D plan (default %s)\n"
          "  --prompt-len N    prompt tokens (default 4096)\n"
          "  --chunk N         prefill chunk (default: the plan's serving.prefill_chunk)\n"
          "  --workers N       StarPU CPU workers per rank (default 1: two ranks share this machine)\n"
          "  --json            one JSON object instead of the text\n"
          "  -h, --help        show this help\n",
          BENCH_PD_PLAN);
}

static int parse(int argc, char **argv, struct bopts *o) {
  *o = (struct bopts){.plan = BENCH_PD_PLAN, .n = 4096, .workers = 1};
  static const struct option lo[] = {{"plan", required_argument, NULL, 'p'},   {"prompt-len", required_argument, NULL, 'n'},
                                     {"chunk", required_argument, NULL, 'c'},  {"workers", required_argument, NULL, 'w'},
                                     {"json", no_argument, NULL, 'j'},          {"help", no_argument, NULL, 'h'},
                                     {NULL, 0, NULL, 0}};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'p': o->plan = optarg; break;
    case 'n':
      if (!cli_parse_int(optarg, 1, 1 << 20, &o->n)) return cli_usage_error("bench pd", "--prompt-len wants 1..1048576");
      break;
    case 'c':
      if (!cli_parse_int(optarg, 1, 1 << 20, &o->chunk)) return cli_usage_error("bench pd", "--chunk wants 1..1048576");
      break;
    case 'w':
      if (!cli_parse_int(optarg, 1, 256, &o->workers)) return cli_usage_error("bench pd", "--workers wants 1..256");
      break;
    case 'j': o->json = true; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc) return cli_usage_error("bench pd", "unexpected argument");
  return -1;
}

static void no_graph(void *user, const struct graph *g, const struct rt_task_time *times) {
  (void)user, (void)g, (void)times; /* asks P for its node times (the report's pd_trace) */
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The package's bytes and the time at least one message was in flight
 * (the union of [P's transfer node end, arrival on D]). */
static void in_flight(const struct rt_pd_trace *x, int64_t *bytes, double *busy_s) {
  const struct graph *g = x->g;
  double *iv = cedar_xmalloc(sizeof(double) * 2 * (size_t)(g->n_node + 1));
  int n = 0;
  *bytes = 0;
  for (int k = 0; k < g->n_node; k++) {
    if (g->node[k].op != GRAPH_TRANSFER) continue;
    iv[2 * n] = x->p_times[k].end_us;
    iv[2 * n + 1] = x->arrive_us[k] > iv[2 * n] ? x->arrive_us[k] : iv[2 * n];
    *bytes += x->msg_bytes[k];
    n++;
  }
  qsort(iv, (size_t)n, 2 * sizeof(double), cmp_d); /* by start */
  double busy = 0, a = 0, b = -1;
  for (int i = 0; i < n; i++) {
    if (iv[2 * i] > b) {
      if (b > a) busy += b - a;
      a = iv[2 * i];
      b = iv[2 * i + 1];
    } else if (iv[2 * i + 1] > b) {
      b = iv[2 * i + 1];
    }
  }
  if (b > a) busy += b - a;
  *busy_s = 1e-6 * busy;
  free(iv);
}

/* The request in one process on P's rank, the placement collapsed onto
 * P's home (the engine's driver too): single[0] its TTFT, single[1] its
 * prefill graph's seconds (-1 when it failed). */
static void one_process(struct rt_engine *e, const int32_t *tok, int64_t n, const struct rt_gen_opts *go,
                        double single[2]) {
  struct plan *p = &e->plan;
  struct plan_serving keep = p->serving;
  enum graph_run run = e->run;
  p->serving.decode_rank = p->serving.prefill_rank;
  p->serving.decode_device = p->serving.prefill_device;
  p->serving.decode_device_id = p->serving.prefill_device_id;
  e->run = GRAPH_RUN_ONE;
  struct rt_request r = {0};
  struct rt_gen_result res = {0};
  char err[1024];
  int grc = rt_engine_generate(e, &r, tok, n, go, &res, err, sizeof err);
  if (grc) fprintf(stderr, "cedar bench pd: the one-process run: %s\n", err);
  single[0] = grc ? -1 : res.ttft_s;
  single[1] = grc ? -1 : res.prefill.seconds;
  rt_gen_result_free(&res);
  rt_engine_request_free(e, &r);
  p->serving = keep;
  e->run = run;
}

int cmd_bench_pd(int argc, char **argv) {
  struct bopts o;
  int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  char err[1024];
  if (comm_begin(&argc, &argv, err, sizeof err)) {
    fprintf(stderr, "cedar bench pd: %s\n", err);
    return 1;
  }
  if (comm_world_size() < 2) {
    fprintf(stderr, "cedar bench pd: it measures prefill and decode on two ranks: run it under mpirun -np 2%s\n",
            comm_mpi_built() ? "" : " (this build has no StarPU-MPI: install libopenmpi-dev and rebuild)");
    comm_end();
    return 1;
  }
  struct rt_engine_opts eo = {.plan = o.plan, .exec = {.executor = RT_EXEC_STARPU, .workers = (int)o.workers}};
  struct rt_engine e;
  int status = 1;
  if (rt_engine_open(&e, &eo, err, sizeof err)) {
    fprintf(stderr, "cedar bench pd: %s: %s\n", o.plan, err);
    comm_end();
    return 1;
  }
  struct plan *p = &e.plan;
  int pr = p->serving.prefill_rank, dr = p->serving.decode_rank, me = comm_world_rank();
  enum rt_pd_role role = rt_pd_role_of(p);
  if (role == RT_PD_NONE || role == RT_PD_LOCAL) {
    fprintf(stderr, "cedar bench pd: %s puts prefill and decode on one rank; give a P/D plan (%s)\n", o.plan,
            BENCH_PD_PLAN);
    goto out;
  }
  int32_t *tok = cedar_xmalloc(sizeof(int32_t) * (size_t)o.n);
  for (int64_t i = 0; i < o.n; i++) tok[i] = (int32_t)((i * 7919 + 13) % p->model.vocab);
  struct rt_gen_opts go = {.chunk = (int)o.chunk, .replay = -1, .max_new = 1, .temperature = 0, .top_p = 1, .seed = 1,
                           .executor = RT_EXEC_STARPU};
  /* 1. the link */
  double bw1 = 0, bw8 = 0;
  comm_barrier();
  comm_bandwidth(pr, dr, 1 << 20, 32, &bw1);
  comm_bandwidth(pr, dr, 8 << 20, 8, &bw8);
  /* 2. one process, on P's rank, the placement collapsed */
  double single[2] = {0, 0}; /* TTFT, prefill graph seconds */
  comm_barrier();
  if (me == pr) one_process(&e, tok, o.n, &go, single);
  comm_share(single, 2, pr, dr);
  comm_barrier();
  /* 3. the P/D request */
  go.on_graph = no_graph;
  struct rt_request r = {0};
  struct rt_gen_result res = {0};
  int grc = rt_engine_generate(&e, &r, tok, o.n, &go, &res, err, sizeof err);
  free(tok);
  if (grc == RT_GEN_ELSEWHERE) { /* P (or an idle rank): D reports */
    status = 0;
    rt_gen_result_free(&res);
    goto out;
  }
  if (grc) {
    fprintf(stderr, "cedar bench pd: the P/D run: %s\n", err);
    rt_gen_result_free(&res);
    rt_engine_request_free(&e, &r);
    goto out;
  }
  const struct rt_pd_stats *st = &e.dist.pd_stats;
  const struct rt_pd_trace *x = e.dist.pd_trace.g ? &e.dist.pd_trace : NULL; /* P's part (the engine frees it) */
  double ttft_pd = st->prefill_s + st->handoff_s; /* P's request start to D ready with y1 */
  int64_t bytes = 0;
  double busy = 0;
  if (x) in_flight(x, &bytes, &busy);
  double bw_x = busy > 0 ? (double)bytes / busy : 0, ratio = single[0] > 0 ? ttft_pd / single[0] : 0;
  if (single[0] < 0) {
    fprintf(stderr, "cedar bench pd: no one-process figure (it failed on rank %d)\n", pr);
  } else if (o.json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "plan", p->name);
    cJSON_AddNumberToObject(j, "prompt", (double)o.n);
    cJSON_AddNumberToObject(j, "ttft_single_s", single[0]);
    cJSON_AddNumberToObject(j, "ttft_pd_s", ttft_pd);
    cJSON_AddNumberToObject(j, "ttft_ratio", ratio);
    cJSON_AddNumberToObject(j, "prefill_pd_s", st->prefill_s);
    cJSON_AddNumberToObject(j, "handoff_s", st->handoff_s);
    cJSON_AddNumberToObject(j, "overlap", st->overlap);
    cJSON_AddNumberToObject(j, "package_bytes", (double)bytes);
    cJSON_AddNumberToObject(j, "in_flight_s", busy);
    cJSON_AddNumberToObject(j, "transfer_bytes_per_s", bw_x);
    cJSON_AddNumberToObject(j, "link_bytes_per_s_1mib", bw1);
    cJSON_AddNumberToObject(j, "link_bytes_per_s_8mib", bw8);
    cli_print_json(j);
    cJSON_Delete(j);
    status = 0;
  } else {
    printf("bench pd: %s, prompt %lld, prefill on rank %d, decode on rank %d (StarPU, %lld worker%s a rank)\n",
           p->name, (long long)o.n, pr, dr, (long long)o.workers, o.workers == 1 ? "" : "s");
    printf("  TTFT one process %.3f s; P/D %.3f s (prefill %.3f s + handoff %.2f ms); ratio %.3f\n", single[0],
           ttft_pd, st->prefill_s, 1e3 * st->handoff_s, ratio);
    printf("  overlap: %.1f%% of the KV bytes arrived before the prefill ended (%lld B)\n", 100 * st->overlap,
           (long long)st->kv_bytes_before_end);
    printf("  transfer: %lld B in %d messages, in flight %.3f s: %.1f MB/s; link (plain MPI, one way) %.1f MB/s at "
           "1 MiB, %.1f MB/s at 8 MiB\n", (long long)bytes, x ? x->g->n_transfer : 0, busy, 1e-6 * bw_x,
           1e-6 * bw1, 1e-6 * bw8);
    status = 0;
  }
  rt_gen_result_free(&res);
  rt_engine_request_free(&e, &r);
out:
  rt_engine_close(&e);
  comm_end();
  return status;
}
