/* bench_ops.h: the op cases of `cedar bench ops` (cli/bench_ops.c) and
 * what they share with the command (cli/cmd_bench.c): the run's state,
 * its bounds and the case table.
 *
 * Internal to those two files; bench.h is the measuring half they both use.
 */
#ifndef CEDAR_BENCH_OPS_H
#define CEDAR_BENCH_OPS_H

#include <stdint.h>

#include "ops/kvview.h"
#include "ops/rope.h"
#include "cli/bench.h"
#include "scheduler/plan.h"

#define DEFAULT_REPS 10
#define ROW_BUDGET_S 0.5         /* a row stops repeating once its samples add up to this */
#define MAX_ROWS 96
#define WIDE_HIDDEN 1024         /* wider than this: the chunk rows of the scalar scans are bounded */
#define WIDE_CHUNK 64            /* ... to this many queries */
#define CTX_MAX (1 << 20)        /* the largest context of the decode rows, in entries */
#define CODEC_ENTRIES 4096       /* entries packed / unpacked per codec call */
#define MOE_MAX_BYTES (1ull << 30)    /* larger routed-expert weights: MoE at the mini plan's widths */
#define ENGRAM_MAX_BYTES (256ull << 20) /* Engram table bound (L3 here is 32 MiB) */
#define FLASH_PLAN "plans/v41-flash.yaml"

/* One run: the plan's widths, the rows recorded so far, the notes on what
 * was bounded. */
struct bench {
  const struct plan *p;
  const struct plan_model *m;
  const struct plan_model *moe_m; /* widths the MoE rows use (m, or the mini plan's) */
  int reps, chunk, scan_chunk; /* samples per row; chunk rows' positions; the scalar scans' chunk */
  uint64_t rng;
  int64_t engram_base; /* table_base, bounded to ENGRAM_MAX_BYTES */
  struct op_rope rope_q, rope_i; /* CSA RoPE at head_dim and at the indexer width */
  struct bench_kv kv; /* the ratio-1 global source of CTX_MAX entries, built on first use */
  struct bench_row rows[MAX_ROWS];
  int n_rows;
  struct bench_meta meta;
  char notes[4][320];
  int n_notes;
};

/* Add a note to the report (what the run bounded, and why). */
void bench_note(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The cases in report order: each times its op at b's widths and records
 * rows under `name` (several names may share one function). */
struct bench_case {
  const char *name;
  void (*run)(struct bench *b, const char *name);
};
extern const struct bench_case bench_cases[];
extern const int bench_n_cases;

#endif
