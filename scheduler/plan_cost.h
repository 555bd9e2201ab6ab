/* plan_cost.h: plan accounting from the plan alone (SPEC 4.5, 4.6, 5.2, 6.1,
 * 6.2, 6.5, 6.6), generalized to any plan: global KV bytes and entries per
 * source, SWA and compressor-tail bytes per request, token-layers of a cold
 * prefill and of a prefix hit, and indexer key-dots per decode token.
 *
 * What it is not: a FLOP, latency or memory-allocator model. It counts what
 * the plan's wiring implies (SPEC 6.2 calls these "not a FLOP or latency
 * model") and excludes page tables, alignment, workspaces and weights, as
 * SPEC 4.5 does. Pure computation: nothing is printed or allocated here;
 * `cedar plan cost` / `cedar plan diff` (cli/cmd_plan_cost.c) print it.
 *
 * Test: tests/test_plan_cost.c (every SPEC figure for the flash plan, plus
 * generalizations), tests/cli/plan_cost.sh (the command's --json output).
 */
#ifndef CEDAR_PLAN_COST_H
#define CEDAR_PLAN_COST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler/plan.h"

/* What to account for. N (tokens) is the context for global KV and for the
 * decode-time indexer; n (prompt) is the prompt of the cold prefill and of
 * the prefix hit; c (hit) the cached prefix length. */
struct plan_cost_query {
  int64_t tokens;   /* N >= 0 */
  int64_t prompt;   /* n >= 1 */
  bool has_hit;     /* account for a prefix hit of `hit` tokens */
  int64_t hit;      /* c, 0 <= c <= n */
  bool swa_miss;    /* the prefix hit found no SWA snapshot at c */
};

#define PLAN_COST_DEFAULT_TOKENS 1000000
#define PLAN_COST_DEFAULT_PROMPT 1024
/* Upper bound for --tokens and --prompt (10^14), so every figure of a
 * plausible plan fits in int64; plan_cost_compute still checks the plan. */
#define PLAN_COST_MAX_TOKENS INT64_C(100000000000000)

/* Fill q with the defaults: N = 10^6, n = 1024, no prefix hit. */
void plan_cost_query_init(struct plan_cost_query *q);

/* One KV source (a FULL layer): the pool every layer with kv_src == layer reads. */
struct plan_cost_source {
  int layer;
  enum plan_region region;
  int ratio;
  int readers;            /* CSA2 layers reading this pool, the source included */
  int64_t main_bytes;     /* per entry: Main KV, head_dim values in main_kv format */
  int64_t indexer_bytes;  /* per entry: Indexer K, idx_head_dim values */
  int64_t entry_bytes;    /* main + indexer */
  double bytes_per_token; /* entry_bytes / ratio */
  int64_t entries, bytes; /* after N tokens: floor(N / ratio) entries */
  int64_t tail_bytes;     /* compressor tail per request: (r-1) x (value + gate) x fp32 */
  int64_t cold_entries;   /* after the cold prefill: floor(n / ratio) */
  int64_t hit_entries, hit_bytes; /* new on a prefix hit: floor(n/r) - floor(c/r) */
  int64_t visible;        /* entries visible to a query at position p = N */
};

/* One index source (FULL or REINDEX layer) at decode: key-dots per query
 * head-set for the query at position p = N. */
struct plan_cost_indexer {
  int layer;
  enum plan_mode mode;
  int kv_src;
  enum plan_cand cand;
  int64_t key_dots;
};

/* Positions [begin, end). */
struct plan_cost_range {
  int64_t begin, end;
};

static inline int64_t plan_cost_range_len(struct plan_cost_range r) {
  return r.end > r.begin ? r.end - r.begin : 0;
}

/* The layer work of one prefill: which positions each region runs. With CED
 * on, encoder layers run `encoder` (replay of the missing SWA) then
 * [c, n); decoder layers run `decoder` only. With CED off every layer runs
 * the same positions (see plan_cost.c). */
struct plan_cost_prefill {
  int64_t prompt, hit;            /* n, c (0 for a cold prefill) */
  struct plan_cost_range encoder_replay;
  int64_t encoder_positions;      /* replay + (n - c) */
  struct plan_cost_range decoder; /* decoder layers' positions */
  int64_t decoder_prefix;         /* part of `decoder` below c (already cached) */
  int64_t decoder_suffix;         /* part of `decoder` at or above c */
  int64_t decoder_positions;
  int64_t token_layers;           /* n_enc x encoder_positions + n_dec x decoder_positions */
  int64_t dense_token_layers;     /* cold: n_layers x n; hit: suffix-only n_layers x (n - c) */
  int64_t new_entries, new_bytes; /* global entries appended by this prefill */
};

struct plan_cost {
  struct plan_cost_query q;
  bool ced;
  int n_layers, n_encoder, n_decoder, n_csa, n_index_sources;

  /* Global KV (SPEC 4.5, 5.2) */
  int n_sources;
  struct plan_cost_source src[PLAN_MAX_LAYERS];
  double bytes_per_token;
  int64_t entries, bytes;                 /* at N */
  double baseline_bytes_per_token;        /* if every CSA2 layer owned its KV */
  int64_t baseline_entries, baseline_bytes;

  /* SWA per request: every layer owns a ring of `window` entries */
  int64_t swa_window;
  int64_t swa_payload_per_entry, swa_scale_per_entry; /* per layer entry */
  int64_t swa_payload_per_layer;
  int64_t swa_payload_bytes, swa_scale_bytes;         /* all layers */

  /* Compressor tails per request (sources with ratio > 1) */
  int n_tail_sources;
  int64_t tail_bytes;

  /* Prefill (SPEC 6.1, 6.2, 6.5, 6.6) */
  struct plan_cost_prefill cold;
  struct plan_cost_prefill hit; /* valid when q.has_hit */

  /* Indexer per decode token at context N (SPEC 4.6) */
  int64_t idx_position;             /* p = N */
  int n_indexers;
  struct plan_cost_indexer idx[PLAN_MAX_LAYERS];
  int64_t idx_full_key_dots;        /* FULL layers: full scans */
  int64_t idx_reindex_key_dots;     /* REINDEX layers */
  int64_t idx_key_dots;             /* total */
  int64_t idx_per_layer_key_dots;   /* every CSA2 layer a full scan of its own entries */

  /* Engram tables (serving.engram.tier): resident in memory, or mapped
   * from a file and paged in row by row by the prefetch */
  int engram_modules, engram_mmap;  /* mmap: 1 when the tier is mmap */
  int64_t engram_rows, engram_row_bytes, engram_table_bytes;
  int64_t engram_resident_bytes;    /* memory tier: the tables; mmap: 0 */
  int64_t engram_mapped_bytes;      /* mmap tier: the tables, file-backed */
  int64_t engram_rows_per_token, engram_bytes_per_token; /* read by one token's prefetch */

  char error[256]; /* why plan_cost_compute failed */
};

/* Check a query on its own: returns 0, or CEDAR_EINVAL with a message in msg
 * (naming the flag, e.g. "--hit 5000 is larger than --prompt 4100"). */
int plan_cost_query_check(const struct plan_cost_query *q, char *msg, size_t msg_size);

/* Account for plan p under query q. Returns 0, or CEDAR_EINVAL with
 * out->error set when the query is invalid, the plan's wiring is inconsistent
 * (a CSA2 layer without a KV source, a ratio < 1) or a figure would not fit in
 * int64. */
int plan_cost_compute(const struct plan *p, const struct plan_cost_query *q,
                      struct plan_cost *out);

#endif
