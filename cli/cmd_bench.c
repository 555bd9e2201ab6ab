/* cmd_bench.c: `cedar bench ops`, every CPU op at a plan's widths, timed
 * against this machine's peaks measured in the same run (cli/bench.c).
 *
 *   cedar bench ops [--plan FILE | --flash] [--reps N] [--json] [--filter NAME]
 *
 * This file is the command: options, the run's set-up (widths and the
 * bounds it applies, each reported as a note) and the report. The op cases
 * and the rules for counting FLOPs and bytes are in cli/bench_ops.c;
 * `cedar bench model` is cli/cmd_bench_model.c.
 */
#include <cJSON.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/basic.h"
#include "ops/engram.h"
#include "ops/rope.h"
#include "cli/bench.h"
#include "cli/bench_ops.h"
#include "base/check.h"
#include "cli/cli.h"
#include "scheduler/plan.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: cedar bench ops [--plan FILE | --flash] [--reps N] [--json] [--filter NAME]\n"
          "       cedar bench model [--plan P]... [--prompt-len N] [--decode S]  (the whole model; --help)\n"
          "       cedar bench tokenizer [--file F] [--mb N] [--no-js]  (encode MB/s against JS; --help)\n"
          "       mpirun -np 2 cedar bench pd [--plan P] [--prompt-len N]  (P/D against one process; --help)\n"
          "       mpirun -np S cedar bench pp [--plan P] [--prompt-len N]  (layer stages: bubbles, against one process; --help)\n"
          "       cedar bench engram [--plan P] [--table-base B] [--workers W]  (Engram tiers side by side; --help)\n"
          "       cedar bench serve --url http://127.0.0.1:PORT [--rate R | --concurrency C] [--num-prompts K]\n"
          "                         (a load client for `cedar serve`: TTFT, TPOT, ITL, E2EL, goodput; --help)\n"
          "\n"
          "Times every CPU op at a plan's widths against this machine's peaks, measured first in\n"
          "the same run: a one-thread OpenBLAS sgemm (1024x1024x1024) in GFLOP/s and a 256 MiB\n"
          "memcpy in GB/s counting read + write. Per call shape it prints the best and median time,\n"
          "FLOPs and bytes counted from the shapes (bench_ops.c's header says how), GFLOP/s, GB/s,\n"
          "the roofline floor max(flops / peak sgemm, bytes / peak memcpy) and time / floor; for the\n"
          "GEMM-shaped ops also x gemm, the time over that of the op's own op_linear calls alone at the\n"
          "same shapes, timed right after it.\n"
          "Shapes: a prefill chunk of serving.prefill_chunk positions and a decode step of 1 (the\n"
          "chunk rows of indexer_scan, reindex and sparse_attn use at most %d queries when hidden >\n"
          "%d); indexer, Top-K, pool, reindex and attention read a ratio-1 source of up to %d\n"
          "entries (indexer decode scans at 4K, 64K and 1M). MoE rows use the default plan's MoE\n"
          "widths when the plan's routed experts exceed %llu GiB of fp32 weights; Engram tables are\n"
          "bounded to %llu MiB. The run prints every bound it applied.\n"
          "cedar's own kernels (attention, indexer, packers) run at the vector ISA the header names:\n"
          "the best this CPU has, or CEDAR_ISA=default|avx2|avx512 (the same bits at every level).\n"
          "Nothing is asserted: these VMs are noisy, compare the ratios, not the times.\n"
          "\n"
          "options:\n"
          "  --plan FILE    plan whose widths to use (default %s)\n"
          "  --flash        the real widths: --plan %s\n"
          "  --reps N       samples per row, best and median of them (1-%d, default %d); a row\n"
          "                 stops early once its samples add up to %.1f s, after a warm-up call\n"
          "  --json         print one JSON object instead of the table\n"
          "  --filter NAME  only the ops whose name contains NAME\n"
          "  -h, --help     show this help\n"
          "\n"
          "ops:",
          WIDE_CHUNK, WIDE_HIDDEN, CTX_MAX, MOE_MAX_BYTES >> 30, ENGRAM_MAX_BYTES >> 20, cli_default_plan(),
          FLASH_PLAN, BENCH_MAX_REPS, DEFAULT_REPS, ROW_BUDGET_S);
  for (int i = 0; i < bench_n_cases; i++) fprintf(f, "%s%s", i % 6 ? " " : "\n  ", bench_cases[i].name);
  fprintf(f, "\n\nExit status: 0 success, 1 the plan failed to load, 2 a usage error.\n");
}

struct bench_args {
  const char *plan, *filter;
  bool flash, json;
  int reps;
};

static bool filter_matches(const char *filter) {
  for (int i = 0; i < bench_n_cases; i++)
    if (strstr(bench_cases[i].name, filter)) return true;
  return false;
}

/* 0 to run, -1 after --help, 2 on a usage error (message printed). */
/* The benchmarks other than ops, each its own command; BENCH_NAMES lists
 * them all for the usage error. */
static const struct {
  const char *name;
  int (*cmd)(int, char **);
} benches[] = {{"model", cmd_bench_model}, {"tokenizer", cmd_bench_tokenizer}, {"pd", cmd_bench_pd},
               {"pp", cmd_bench_pp},       {"serve", cmd_bench_serve},         {"engram", cmd_bench_engram}};
#define BENCH_NAMES "'ops', 'model', 'tokenizer', 'pd', 'pp', 'serve' or 'engram'"

static int parse_args(int argc, char **argv, struct bench_args *a) {
  enum { OPT_PLAN = 256, OPT_FLASH, OPT_REPS, OPT_JSON, OPT_FILTER };
  static const struct option longopts[] = {
      {"plan", required_argument, NULL, OPT_PLAN}, {"flash", no_argument, NULL, OPT_FLASH},
      {"reps", required_argument, NULL, OPT_REPS}, {"json", no_argument, NULL, OPT_JSON},
      {"filter", required_argument, NULL, OPT_FILTER}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
  *a = (struct bench_args){.reps = DEFAULT_REPS};
  if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) return usage(stdout), -1;
  if (argc < 2 || strcmp(argv[1], "ops"))
    return argc < 2 ? cli_usage_error("bench", "expected %s", BENCH_NAMES)
                    : cli_usage_error("bench", "unknown benchmark '%s' (expected %s)", argv[1], BENCH_NAMES);
  optind = 2;
  opterr = 0;
  int opt;
  while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    char *end;
    switch (opt) {
      case 'h': return usage(stdout), -1;
      case OPT_PLAN: a->plan = optarg; break;
      case OPT_FLASH: a->flash = true; break;
      case OPT_JSON: a->json = true; break;
      case OPT_FILTER:
        a->filter = optarg;
        if (!filter_matches(a->filter))
          return cli_usage_error("bench", "no op name contains '%s' (cedar bench --help lists them)", optarg);
        break;
      case OPT_REPS:
        a->reps = (int)strtol(optarg, &end, 10);
        if (end == optarg || *end || a->reps < 1 || a->reps > BENCH_MAX_REPS)
          return cli_usage_error("bench", "--reps '%s': expected an integer from 1 to %d", optarg, BENCH_MAX_REPS);
        break;
      case ':': return cli_usage_error("bench", "%s needs a value", argv[optind - 1]);
      default: return cli_usage_error("bench", "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("bench", "unexpected argument '%s'", argv[optind]);
  if (a->plan && a->flash) return cli_usage_error("bench", "--plan and --flash both name a plan; give one");
  return 0;
}

/* Widths, RoPE tables, the chunk bound and the MoE fallback; notes say what was bounded. */
static int setup(struct bench *b, const struct plan *p, struct plan *mini, int reps) {
  const struct plan_model *m = &p->model;
  const struct op_rope_params *r = &m->rope_csa;
  b->p = p, b->m = m, b->moe_m = m, b->reps = reps, b->rng = 0x5eed;
  b->chunk = b->scan_chunk = p->serving.prefill_chunk;
  if (m->hidden > WIDE_HIDDEN && b->chunk > WIDE_CHUNK) {
    bench_note(b, "the chunk rows of indexer_scan, reindex and sparse_attn (scalar code) use S=%d queries, not "
            "serving.prefill_chunk=%d (hidden %d > %d), so the run stays short on a CPU",
         WIDE_CHUNK, b->chunk, m->hidden, WIDE_HIDDEN);
    b->scan_chunk = WIDE_CHUNK;
  }
  double moe_bytes = 12.0 * m->n_routed * m->moe_inter * (double)m->hidden;
  if (moe_bytes > (double)MOE_MAX_BYTES) {
    if (cli_load_plan("bench", NULL, mini)) return 1;
    b->moe_m = &mini->model;
    bench_note(b, "moe rows use %s's MoE widths (hidden %d, %d experts x %d): this plan's routed experts need %.0f GiB "
            "of fp32 weights", mini->name, b->moe_m->hidden, b->moe_m->n_routed, b->moe_m->moe_inter,
         moe_bytes / (1 << 30));
  }
  size_t rb = op_engram_row_bytes(m->engram_head_dim, m->engram_head_dim % 32 ? m->engram_head_dim : 32);
  int64_t cap = (int64_t)(ENGRAM_MAX_BYTES / ((uint64_t)m->engram_n_orders * m->engram_heads * rb));
  b->engram_base = m->engram_table_base < cap ? m->engram_table_base : cap;
  if (m->engram_table_base > cap)
    bench_note(b, "engram tables start at %lld rows, not table_base %lld, so the table fits in %llu MiB (still far past "
            "the caches)", (long long)cap, (long long)m->engram_table_base, ENGRAM_MAX_BYTES >> 20);
  if (op_rope_init(&b->rope_q, m->head_dim, m->rope_dim, true, r->theta, r->yarn, r->yarn_factor,
                   r->yarn_original_len, r->yarn_beta_fast, r->yarn_beta_slow) ||
      op_rope_init(&b->rope_i, m->idx_head_dim, m->idx_rope_dim, m->idx_rope_last, r->theta, r->yarn,
                   r->yarn_factor, r->yarn_original_len, r->yarn_beta_fast, r->yarn_beta_slow)) {
    fprintf(stderr, "cedar bench: %s: the RoPE parameters are invalid\n", p->path);
    return 1;
  }
  b->meta.plan_name = p->name, b->meta.plan_file = p->path, b->meta.chunk = b->chunk;
  b->meta.scan_chunk = b->scan_chunk;
  return 0;
}

/* The flash plan beside the default one (a checkout, else the source tree). */
static const char *flash_plan(void) {
  return access(FLASH_PLAN, R_OK) == 0 ? FLASH_PLAN : CEDAR_SOURCE_DIR "/" FLASH_PLAN;
}

int cmd_bench(int argc, char **argv) {
  for (size_t i = 0; argc >= 2 && i < sizeof benches / sizeof benches[0]; i++)
    if (!strcmp(argv[1], benches[i].name)) return benches[i].cmd(argc - 1, argv + 1);
  struct bench_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc < 0 ? 0 : rc;
  struct plan *p = cedar_xcalloc(2, sizeof *p);
  struct bench *b = cedar_xcalloc(1, sizeof *b);
  rc = cli_load_plan("bench", a.flash ? flash_plan() : a.plan, &p[0]);
  if (!rc) rc = setup(b, &p[0], &p[1], a.reps);
  if (!rc) {
    op_blas_init();
    struct bench_peaks peaks;
    bench_measure_peaks(&peaks, a.reps > 5 ? a.reps : 5);
    for (int i = 0; i < bench_n_cases; i++)
      if (!a.filter || strstr(bench_cases[i].name, a.filter)) bench_cases[i].run(b, bench_cases[i].name);
    if (a.json) {
      cli_print_json(bench_json(&b->meta, &peaks, b->rows, b->n_rows));
    } else {
      bench_print_table(stdout, &b->meta, &peaks, b->rows, b->n_rows);
    }
  }
  bench_kv_free(&b->kv);
  plan_free(&p[0]);
  plan_free(&p[1]);
  free(p);
  free(b);
  return rc;
}
