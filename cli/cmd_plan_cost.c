/* cmd_plan_cost.c: `cedar plan cost` and `cedar plan diff`, the printers of
 * scheduler/plan_cost.c's accounting (tables on stdout, or one JSON object).
 *
 * Every scalar figure is listed once, in `rows` below; the tables, the JSON
 * and the diff are all generated from that list, so a new figure is one row.
 * Per-source and per-indexer details are printed beside it.
 *
 * Not here: the arithmetic (scheduler/plan_cost.c).
 * Test: tests/cli/plan_cost.sh, e.g.
 *   cedar plan cost plans/v41-flash.yaml --prompt 4100 --hit 4096 --swa-miss --json
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "base/check.h"
#include "cli/cli.h"
#include "scheduler/plan.h"
#include "scheduler/plan_cost.h"
#include "cli/run_pd.h"
#include "cli/run_place.h"

/* ---- the figures, once ---------------------------------------------------- */

enum row_kind { ROW_I32, ROW_I64, ROW_REAL, ROW_RANGE };

struct row {
  const char *section; /* JSON object; table heading via `sections` */
  const char *key;     /* JSON key */
  const char *label;   /* table label */
  enum row_kind kind;
  size_t off;          /* into struct plan_cost */
};

#define ROW(sec, key, label, kind, field) {sec, key, label, kind, offsetof(struct plan_cost, field)}

static const struct row rows[] = {
    ROW("layers", "total", "layers", ROW_I32, n_layers),
    ROW("layers", "encoder", "encoder layers", ROW_I32, n_encoder),
    ROW("layers", "decoder", "decoder layers", ROW_I32, n_decoder),
    ROW("layers", "csa2", "CSA2 layers (not SWA-only)", ROW_I32, n_csa),
    ROW("layers", "index_sources", "index sources (full + reindex)", ROW_I32, n_index_sources),
    ROW("global", "n_sources", "KV sources (full layers)", ROW_I32, n_sources),
    ROW("global", "bytes_per_token", "bytes per token", ROW_REAL, bytes_per_token),
    ROW("global", "entries", "entries at N", ROW_I64, entries),
    ROW("global", "bytes", "bytes at N", ROW_I64, bytes),
    ROW("global", "baseline_bytes_per_token", "per-layer baseline: bytes per token", ROW_REAL,
        baseline_bytes_per_token),
    ROW("global", "baseline_entries", "per-layer baseline: entries at N", ROW_I64, baseline_entries),
    ROW("global", "baseline_bytes", "per-layer baseline: bytes at N", ROW_I64, baseline_bytes),
    ROW("swa", "window", "entries per ring (window)", ROW_I64, swa_window),
    ROW("swa", "payload_bytes_per_entry", "payload bytes per entry", ROW_I64, swa_payload_per_entry),
    ROW("swa", "scale_bytes_per_entry", "scale bytes per entry", ROW_I64, swa_scale_per_entry),
    ROW("swa", "payload_bytes_per_layer", "payload bytes per layer", ROW_I64, swa_payload_per_layer),
    ROW("swa", "payload_bytes", "payload bytes, all layers", ROW_I64, swa_payload_bytes),
    ROW("swa", "scale_bytes", "scale bytes, all layers", ROW_I64, swa_scale_bytes),
    ROW("tails", "n_sources", "sources with a tail (ratio > 1)", ROW_I32, n_tail_sources),
    ROW("tails", "bytes", "bytes", ROW_I64, tail_bytes),
    ROW("cold_prefill", "prompt", "prompt tokens n", ROW_I64, cold.prompt),
    ROW("cold_prefill", "encoder_positions", "encoder positions", ROW_I64, cold.encoder_positions),
    ROW("cold_prefill", "decoder", "decoder positions range", ROW_RANGE, cold.decoder),
    ROW("cold_prefill", "decoder_positions", "decoder positions", ROW_I64, cold.decoder_positions),
    ROW("cold_prefill", "token_layers", "token-layers", ROW_I64, cold.token_layers),
    ROW("cold_prefill", "dense_token_layers", "dense equivalent (every layer, every token)",
        ROW_I64, cold.dense_token_layers),
    ROW("cold_prefill", "new_entries", "new global entries", ROW_I64, cold.new_entries),
    ROW("cold_prefill", "new_bytes", "new global bytes", ROW_I64, cold.new_bytes),
    ROW("prefix_hit", "prompt", "prompt tokens n", ROW_I64, hit.prompt),
    ROW("prefix_hit", "hit", "cached prefix c", ROW_I64, hit.hit),
    ROW("prefix_hit", "encoder_replay", "SWA replay range", ROW_RANGE, hit.encoder_replay),
    ROW("prefix_hit", "encoder_positions", "encoder positions (replay + suffix)", ROW_I64,
        hit.encoder_positions),
    ROW("prefix_hit", "decoder", "decoder positions range", ROW_RANGE, hit.decoder),
    ROW("prefix_hit", "decoder_prefix", "decoder positions below c", ROW_I64, hit.decoder_prefix),
    ROW("prefix_hit", "decoder_suffix", "decoder positions at or above c", ROW_I64,
        hit.decoder_suffix),
    ROW("prefix_hit", "decoder_positions", "decoder positions", ROW_I64, hit.decoder_positions),
    ROW("prefix_hit", "token_layers", "token-layers", ROW_I64, hit.token_layers),
    ROW("prefix_hit", "suffix_only_token_layers", "suffix-only estimate (every layer, n - c)",
        ROW_I64, hit.dense_token_layers),
    ROW("prefix_hit", "new_entries", "new global entries", ROW_I64, hit.new_entries),
    ROW("prefix_hit", "new_bytes", "new global bytes", ROW_I64, hit.new_bytes),
    ROW("indexer", "position", "query position p = N", ROW_I64, idx_position),
    ROW("indexer", "full_key_dots", "full layers (scan own source)", ROW_I64, idx_full_key_dots),
    ROW("indexer", "reindex_key_dots", "reindex layers", ROW_I64, idx_reindex_key_dots),
    ROW("indexer", "key_dots", "total", ROW_I64, idx_key_dots),
    ROW("indexer", "per_layer_key_dots", "per-layer full indexing (every CSA2 layer)", ROW_I64,
        idx_per_layer_key_dots),
    ROW("engram", "modules", "Engram modules", ROW_I32, engram_modules),
    ROW("engram", "rows", "table rows, all modules", ROW_I64, engram_rows),
    ROW("engram", "row_bytes", "bytes per row (E4M3 + E8M0 per 32)", ROW_I64, engram_row_bytes),
    ROW("engram", "table_bytes", "table bytes", ROW_I64, engram_table_bytes),
    ROW("engram", "mmap", "tier mmap (1) or memory (0)", ROW_I32, engram_mmap),
    ROW("engram", "resident_bytes", "counted resident (memory tier)", ROW_I64, engram_resident_bytes),
    ROW("engram", "mapped_bytes", "mapped from a file, not resident (mmap tier)", ROW_I64, engram_mapped_bytes),
    ROW("engram", "rows_per_token", "rows one token's prefetch reads", ROW_I64, engram_rows_per_token),
    ROW("engram", "bytes_per_token", "bytes one token's prefetch reads", ROW_I64, engram_bytes_per_token),
};
#define N_ROWS (sizeof rows / sizeof rows[0])

static const struct section {
  const char *key, *title;
} sections[] = {
    {"layers", "Layers"},
    {"global", "Global KV (Main KV + Indexer K per source entry; floor(N / ratio) entries)"},
    {"swa", "SWA rings per request (every layer owns one)"},
    {"tails", "Compressor tails per request ((ratio - 1) x (value + gate) x fp32)"},
    {"cold_prefill", "Cold prefill of n = --prompt tokens"},
    {"prefix_hit", "Prefix hit: c = --hit of n = --prompt tokens cached"},
    {"indexer", "Indexer key-dots per decode token (per query head-set)"},
    {"engram", "Engram tables (serving.engram.tier; model weights, not request state)"},
};
#define N_SECTIONS (sizeof sections / sizeof sections[0])

static bool section_shown(const char *section, const struct plan_cost *c) {
  if (!strcmp(section, "engram")) return c->engram_modules > 0;
  return c->q.has_hit || strcmp(section, "prefix_hit") != 0;
}

static const void *row_ptr(const struct row *r, const struct plan_cost *c) {
  return (const char *)c + r->off;
}

/* The row as one number: ranges give their length (used for ratios). */
static double row_number(const struct row *r, const struct plan_cost *c) {
  const void *p = row_ptr(r, c);
  switch (r->kind) {
  case ROW_I32: return *(const int *)p;
  case ROW_I64: return (double)*(const int64_t *)p;
  case ROW_REAL: return *(const double *)p;
  case ROW_RANGE: return (double)plan_cost_range_len(*(const struct plan_cost_range *)p);
  }
  return 0;
}

/* ---- number formatting ---------------------------------------------------- */

/* 1234567 -> "1,234,567". */
static char *fmt_int(char *buf, size_t size, int64_t v) {
  char digits[32];
  snprintf(digits, sizeof digits, "%" PRIu64, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v);
  size_t n = strlen(digits), o = 0;
  if (v < 0 && o + 1 < size) buf[o++] = '-';
  for (size_t i = 0; i < n && o + 1 < size; i++) {
    if (i > 0 && (n - i) % 3 == 0 && o + 2 < size) buf[o++] = ',';
    buf[o++] = digits[i];
  }
  buf[o] = '\0';
  return buf;
}

static char *fmt_real(char *buf, size_t size, double v) {
  if (v == floor(v) && fabs(v) < 9e18) return fmt_int(buf, size, (int64_t)v);
  char ip[32];
  double frac = fabs(v - trunc(v));
  char fr[16];
  snprintf(fr, sizeof fr, "%.2f", frac); /* "0.67" */
  if (fr[0] == '1') return fmt_int(buf, size, (int64_t)llround(v)); /* rounded up to a whole */
  snprintf(buf, size, "%s%s", fmt_int(ip, sizeof ip, (int64_t)trunc(v)), fr + 1);
  return buf;
}

static char *fmt_row(char *buf, size_t size, const struct row *r, const struct plan_cost *c) {
  const void *p = row_ptr(r, c);
  char a[32], b[32];
  switch (r->kind) {
  case ROW_I32: return fmt_int(buf, size, *(const int *)p);
  case ROW_I64: return fmt_int(buf, size, *(const int64_t *)p);
  case ROW_REAL: return fmt_real(buf, size, *(const double *)p);
  case ROW_RANGE: {
    const struct plan_cost_range *x = p;
    snprintf(buf, size, "[%s, %s)", fmt_int(a, sizeof a, x->begin), fmt_int(b, sizeof b, x->end));
    return buf;
  }
  }
  return buf;
}

/* ---- tables ---------------------------------------------------------------- */

static void print_sources(FILE *f, const struct plan_cost *c) {
  char b[6][32];
  fprintf(f, "  %-6s %-8s %5s %7s %6s %6s %7s %9s %14s %16s %7s\n", "source", "region", "ratio",
          "readers", "main B", "idx B", "entry B", "B/token", "entries at N", "bytes at N", "tail B");
  for (int k = 0; k < c->n_sources; k++) {
    const struct plan_cost_source *s = &c->src[k];
    char layer[16];
    snprintf(layer, sizeof layer, "L%d", s->layer);
    fprintf(f, "  %-6s %-8s %5d %7d %6" PRId64 " %6" PRId64 " %7" PRId64 " %9s %14s %16s %7s\n",
            layer, plan_region_name(s->region), s->ratio, s->readers, s->main_bytes,
            s->indexer_bytes, s->entry_bytes, fmt_real(b[0], 32, s->bytes_per_token),
            fmt_int(b[1], 32, s->entries), fmt_int(b[2], 32, s->bytes),
            fmt_int(b[3], 32, s->tail_bytes));
  }
}

static void print_indexers(FILE *f, const struct plan_cost *c) {
  char b[32];
  fprintf(f, "  %-6s %-8s %-7s %-6s %14s\n", "layer", "mode", "reads", "pool", "key-dots");
  for (int k = 0; k < c->n_indexers; k++) {
    const struct plan_cost_indexer *x = &c->idx[k];
    char layer[16], src[16];
    snprintf(layer, sizeof layer, "L%d", x->layer);
    snprintf(src, sizeof src, "L%d", x->kv_src);
    fprintf(f, "  %-6s %-8s %-7s %-6s %14s\n", layer, plan_mode_name(x->mode), src,
            plan_cand_name(x->cand), fmt_int(b, sizeof b, x->key_dots));
  }
}

static void print_header(FILE *f, const char *tag, const struct plan *p, const struct plan_cost *c) {
  fprintf(f, "%s%s (%s): CED %s; serving.replay encoder %d, decoder %d\n", tag,
          p->name ? p->name : "?", p->path ? p->path : "built in", c->ced ? "on" : "off (dense)",
          p->serving.replay_encoder, p->serving.replay_decoder);
}

static void print_query(FILE *f, const struct plan_cost_query *q) {
  char a[32], b[32], h[32];
  fprintf(f, "N = %s tokens, n = %s prompt tokens", fmt_int(a, sizeof a, q->tokens),
          fmt_int(b, sizeof b, q->prompt));
  if (q->has_hit)
    fprintf(f, ", c = %s cached%s", fmt_int(h, sizeof h, q->hit),
            q->swa_miss ? ", SWA snapshot missing" : ", SWA snapshot at c");
  fputc('\n', f);
}

static void print_cost(FILE *f, const struct plan *p, const struct plan_cost *c) {
  print_header(f, "plan ", p, c);
  print_query(f, &c->q);
  for (size_t s = 0; s < N_SECTIONS; s++) {
    if (!section_shown(sections[s].key, c)) continue;
    fprintf(f, "\n%s\n", sections[s].title);
    if (!strcmp(sections[s].key, "global")) print_sources(f, c);
    if (!strcmp(sections[s].key, "indexer")) print_indexers(f, c);
    for (size_t i = 0; i < N_ROWS; i++) {
      char v[64];
      if (strcmp(rows[i].section, sections[s].key)) continue;
      fprintf(f, "  %-46s %22s\n", rows[i].label, fmt_row(v, sizeof v, &rows[i], c));
    }
  }
}

/* "KV sources: L2/2 L8/2 L14/2 L20/1" (layer/ratio), for the diff's header. */
static void print_source_list(FILE *f, const char *tag, const struct plan_cost *c) {
  fprintf(f, "%sKV sources (layer/ratio):", tag);
  for (int k = 0; k < c->n_sources; k++) fprintf(f, " L%d/%d", c->src[k].layer, c->src[k].ratio);
  fputc('\n', f);
}

static void print_diff(FILE *f, const struct plan *pa, const struct plan_cost *a,
                       const struct plan *pb, const struct plan_cost *b) {
  print_header(f, "A = ", pa, a);
  print_source_list(f, "    ", a);
  print_header(f, "B = ", pb, b);
  print_source_list(f, "    ", b);
  print_query(f, &a->q);
  for (size_t s = 0; s < N_SECTIONS; s++) {
    if (!section_shown(sections[s].key, a)) continue;
    fprintf(f, "\n%s\n  %-46s %22s %22s %9s\n", sections[s].title, "", "A", "B", "B/A");
    for (size_t i = 0; i < N_ROWS; i++) {
      const struct row *r = &rows[i];
      char va[64], vb[64], ratio[32] = "-";
      if (strcmp(r->section, sections[s].key)) continue;
      double x = row_number(r, a), y = row_number(r, b);
      if (x != 0) snprintf(ratio, sizeof ratio, "%.3f", y / x);
      fprintf(f, "  %-46s %22s %22s %9s\n", r->label, fmt_row(va, sizeof va, r, a),
              fmt_row(vb, sizeof vb, r, b), ratio);
    }
  }
}

/* ---- JSON -------------------------------------------------------------------- */

/* int64 as a raw JSON number, so values above 2^53 stay exact. */
static void json_int(cJSON *obj, const char *key, int64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRId64, v);
  cJSON_AddRawToObject(obj, key, buf);
}

static void json_row(cJSON *obj, const struct row *r, const struct plan_cost *c) {
  const void *p = row_ptr(r, c);
  switch (r->kind) {
  case ROW_I32: json_int(obj, r->key, *(const int *)p); break;
  case ROW_I64: json_int(obj, r->key, *(const int64_t *)p); break;
  case ROW_REAL: cJSON_AddNumberToObject(obj, r->key, *(const double *)p); break;
  case ROW_RANGE: {
    const struct plan_cost_range *x = p;
    cJSON *arr = cJSON_AddArrayToObject(obj, r->key);
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, x->begin);
    cJSON_AddItemToArray(arr, cJSON_CreateRaw(buf));
    snprintf(buf, sizeof buf, "%" PRId64, x->end);
    cJSON_AddItemToArray(arr, cJSON_CreateRaw(buf));
    break;
  }
  }
}

static void json_sources(cJSON *global, const struct plan_cost *c) {
  cJSON *arr = cJSON_AddArrayToObject(global, "sources");
  for (int k = 0; k < c->n_sources; k++) {
    const struct plan_cost_source *s = &c->src[k];
    cJSON *o = cJSON_CreateObject();
    json_int(o, "layer", s->layer);
    cJSON_AddStringToObject(o, "region", plan_region_name(s->region));
    json_int(o, "ratio", s->ratio);
    json_int(o, "readers", s->readers);
    json_int(o, "main_bytes", s->main_bytes);
    json_int(o, "indexer_bytes", s->indexer_bytes);
    json_int(o, "entry_bytes", s->entry_bytes);
    cJSON_AddNumberToObject(o, "bytes_per_token", s->bytes_per_token);
    json_int(o, "entries", s->entries);
    json_int(o, "bytes", s->bytes);
    json_int(o, "tail_bytes", s->tail_bytes);
    json_int(o, "cold_entries", s->cold_entries);
    if (c->q.has_hit) json_int(o, "hit_entries", s->hit_entries);
    if (c->q.has_hit) json_int(o, "hit_bytes", s->hit_bytes);
    json_int(o, "visible", s->visible);
    cJSON_AddItemToArray(arr, o);
  }
}

static void json_indexers(cJSON *indexer, const struct plan_cost *c) {
  cJSON *arr = cJSON_AddArrayToObject(indexer, "layers");
  for (int k = 0; k < c->n_indexers; k++) {
    const struct plan_cost_indexer *x = &c->idx[k];
    cJSON *o = cJSON_CreateObject();
    json_int(o, "layer", x->layer);
    cJSON_AddStringToObject(o, "mode", plan_mode_name(x->mode));
    json_int(o, "kv_src", x->kv_src);
    cJSON_AddStringToObject(o, "cand", plan_cand_name(x->cand));
    json_int(o, "key_dots", x->key_dots);
    cJSON_AddItemToArray(arr, o);
  }
}

static cJSON *json_cost(const struct plan *p, const struct plan_cost *c) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "plan", p->name ? p->name : "");
  cJSON_AddStringToObject(root, "path", p->path ? p->path : "");
  cJSON_AddBoolToObject(root, "ced", c->ced);
  cJSON *q = cJSON_AddObjectToObject(root, "query");
  json_int(q, "tokens", c->q.tokens);
  json_int(q, "prompt", c->q.prompt);
  if (c->q.has_hit) json_int(q, "hit", c->q.hit);
  else cJSON_AddNullToObject(q, "hit");
  cJSON_AddBoolToObject(q, "swa_miss", c->q.swa_miss);
  for (size_t s = 0; s < N_SECTIONS; s++) {
    if (!section_shown(sections[s].key, c)) continue;
    cJSON *sec = cJSON_AddObjectToObject(root, sections[s].key);
    for (size_t i = 0; i < N_ROWS; i++)
      if (!strcmp(rows[i].section, sections[s].key)) json_row(sec, &rows[i], c);
    if (!strcmp(sections[s].key, "global")) json_sources(sec, c);
    if (!strcmp(sections[s].key, "indexer")) json_indexers(sec, c);
  }
  return root;
}

/* B/A for every row, null where A is 0. */
static cJSON *json_ratios(const struct plan_cost *a, const struct plan_cost *b) {
  cJSON *root = cJSON_CreateObject();
  for (size_t s = 0; s < N_SECTIONS; s++) {
    if (!section_shown(sections[s].key, a)) continue;
    cJSON *sec = cJSON_AddObjectToObject(root, sections[s].key);
    for (size_t i = 0; i < N_ROWS; i++) {
      const struct row *r = &rows[i];
      if (strcmp(r->section, sections[s].key)) continue;
      double x = row_number(r, a), y = row_number(r, b);
      if (x != 0) cJSON_AddNumberToObject(sec, r->key, y / x);
      else cJSON_AddNullToObject(sec, r->key);
    }
  }
  return root;
}

/* ---- options ----------------------------------------------------------------- */

struct cost_args {
  struct plan_cost_query q;
  bool json;
  int swa_given; /* 1: --swa-miss, 2: --swa-hit */
  const char *file[2];
  int n_files;
  bool per_rank;   /* --per-rank: layer and expert placement (runtime/dist/place_cost.h) */
  double capacity; /* --capacity BYTES a device (default an H200's 141 GB) */
};

static void usage(FILE *f, bool diff) {
  if (diff)
    fprintf(f, "usage: cedar plan diff A B [--tokens N] [--prompt N] [--hit C [--swa-miss | --swa-hit]] [--json]\n"
               "       cedar plan diff A B --per-rank [--tokens N] [--capacity B] [--json]   (two placements)\n"
               "\n"
               "The accounting of 'cedar plan cost' for plans A and B side by side, with a B/A\n"
               "column (JSON: {\"a\": ..., \"b\": ..., \"b_over_a\": ...}).\n");
  else
    fprintf(f, "usage: cedar plan cost [FILE] [--tokens N] [--prompt N] [--hit C [--swa-miss | --swa-hit]] [--json]\n"
               "       cedar plan cost [FILE] --per-rank [--tokens N] [--capacity B] [--json]\n"
               "\n"
               "Accounting from the plan alone (SPEC 4.5, 4.6, 6.1-6.6): global KV entries and bytes\n"
               "per source and in total, SWA and compressor-tail bytes per request, token-layers of a\n"
               "cold prefill and of a prefix hit, indexer key-dots per decode token. Not a FLOP or\n"
               "latency model: page tables, alignment, workspaces and weights are excluded.\n"
               "FILE defaults to %s.\n",
            cli_default_plan());
  fprintf(f,
          "\n"
          "options:\n"
          "  --tokens N   context length for global KV and the decode indexer (default %d)\n"
          "  --prompt N   prompt length n of the cold prefill and the prefix hit (default %d)\n"
          "  --hit C      also account a prefix hit: the first C of n tokens are cached (0 <= C <= n)\n"
          "  --swa-miss   the hit found no SWA snapshot at C (path b, the default, as `cedar graph show\n"
          "               --hit`): replay [max(0, C - replay.encoder), C); C must end on a whole group\n"
          "               of every source's ratio (the tail of a partial group is only in a snapshot)\n"
          "  --swa-hit    the snapshot at C is restored (path a): no replay, any C\n"
          "  --json       print one JSON object instead of tables\n"
          "  --per-rank   per rank of serving.placement (stages, experts, engram): weights in stored\n"
          "               formats, KV/SWA/tails of one request of --tokens N, Engram bytes, activation\n"
          "               and expert-parallel bytes sent per token, and whether each fits (docs/placement.md)\n"
          "  --capacity B bytes a device holds for --per-rank (default 141e9, an H200)\n"
          "  -h, --help   show this help\n"
          "\n"
          "Prefix hit with serving.ced on: encoder layers run the replay (on --swa-miss) and the\n"
          "suffix [C, n); decoder layers run only [max(0, n - replay.decoder), n). With ced off\n"
          "(dense baseline) every layer runs the suffix, and on --swa-miss every layer first\n"
          "replays [max(0, C - replay.encoder), C), since no layer has a snapshot to resume from.\n"
          "\n"
          "Exit status: 0 success, 1 a plan failed to load, 2 a usage error.\n",
          PLAN_COST_DEFAULT_TOKENS, PLAN_COST_DEFAULT_PROMPT);
}

/* A count flag: digits only (no sign, no spaces), through the commands' one
 * integer parser (cli_parse_int). */
static int parse_count(const char *cmd, const char *flag, const char *s, int64_t *out) {
  if (s[0] < '0' || s[0] > '9' || !cli_parse_int(s, 0, INT64_MAX, out))
    return cli_usage_error(cmd, "%s '%s': expected an integer from 0 to 2^63 - 1", flag, s);
  return 0;
}

enum { OPT_TOKENS = 256, OPT_PROMPT, OPT_HIT, OPT_SWA_MISS, OPT_SWA_HIT, OPT_JSON, OPT_PER_RANK, OPT_CAPACITY };

static int parse_option(const char *cmd, int opt, struct cost_args *a) {
  switch (opt) {
  case OPT_TOKENS: return parse_count(cmd, "--tokens", optarg, &a->q.tokens);
  case OPT_PROMPT: return parse_count(cmd, "--prompt", optarg, &a->q.prompt);
  case OPT_HIT: a->q.has_hit = true; return parse_count(cmd, "--hit", optarg, &a->q.hit);
  case OPT_SWA_MISS: a->swa_given |= 1; return 0;
  case OPT_SWA_HIT: a->swa_given |= 2; return 0;
  case OPT_JSON: a->json = true; return 0;
  case OPT_PER_RANK: a->per_rank = true; return 0;
  case OPT_CAPACITY: {
    char *end;
    a->capacity = strtod(optarg, &end);
    if (*end || !(a->capacity > 0) || !isfinite(a->capacity))
      return cli_usage_error(cmd, "--capacity '%s': expected a positive number of bytes, e.g. 141e9", optarg);
    return 0;
  }
  default: return 2;
  }
}

/* Returns 0 to run, -1 after --help, 2 on a usage error (message printed). */
static int parse_args(const char *cmd, bool diff, int argc, char **argv, struct cost_args *a) {
  static const struct option longopts[] = {
      {"tokens", required_argument, NULL, OPT_TOKENS}, {"prompt", required_argument, NULL, OPT_PROMPT},
      {"hit", required_argument, NULL, OPT_HIT},       {"swa-miss", no_argument, NULL, OPT_SWA_MISS},
      {"swa-hit", no_argument, NULL, OPT_SWA_HIT},
      {"json", no_argument, NULL, OPT_JSON},           {"help", no_argument, NULL, 'h'},
      {"per-rank", no_argument, NULL, OPT_PER_RANK},   {"capacity", required_argument, NULL, OPT_CAPACITY},
      {NULL, 0, NULL, 0}};
  memset(a, 0, sizeof *a);
  a->capacity = 141e9;
  plan_cost_query_init(&a->q);
  optind = 0; /* full re-initialization (glibc and musl): cmd_plan may have parsed before */
  opterr = 0;
  int opt;
  while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    if (opt == 'h') {
      usage(stdout, diff);
      return -1;
    }
    if (opt == ':') return cli_usage_error(cmd, "%s needs a value", argv[optind - 1]);
    if (opt == '?' && optopt) return cli_usage_error(cmd, "unknown option '-%c'", optopt);
    if (opt == '?') return cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
    if (parse_option(cmd, opt, a)) return 2;
  }
  int want = diff ? 2 : 1;
  a->n_files = argc - optind;
  if (a->n_files > want || (diff && a->n_files < 2))
    return cli_usage_error(cmd, diff ? "expected two plan files, A and B" : "expected at most one plan file");
  for (int i = 0; i < a->n_files; i++) a->file[i] = argv[optind + i];
  if (!diff && a->n_files == 0) a->file[a->n_files++] = cli_default_plan();
  /* path (b), the snapshot missing, unless --swa-hit: as `cedar graph show --hit` */
  if (a->swa_given == 3) return cli_usage_error(cmd, "give one of --swa-miss (the default) and --swa-hit");
  if (a->swa_given && !a->q.has_hit)
    return cli_usage_error(cmd, "%s needs --hit C (it describes a prefix hit)", a->swa_given == 1 ? "--swa-miss" : "--swa-hit");
  a->q.swa_miss = a->q.has_hit && a->swa_given != 2;
  char msg[256];
  if (plan_cost_query_check(&a->q, msg, sizeof msg)) return cli_usage_error(cmd, "%s", msg);
  return 0;
}

/* ---- commands ----------------------------------------------------------------- */

/* --per-rank: the placement's ranks (runtime/dist/place_cost.h); 0 or 1. */
static int per_rank(const char *cmd, const struct cost_args *a, const struct plan *p, int n) {
  struct rt_place_cost *c = cedar_xcalloc(2, sizeof *c);
  int rc = 0;
  for (int i = 0; i < n && !rc; i++)
    if (rt_place_cost(&p[i], a->q.tokens, a->capacity, &c[i])) {
      fprintf(stderr, "cedar %s: %s: %s\n", cmd, a->file[i], c[i].error);
      rc = 1;
    }
  if (!rc && a->json && n == 1) {
    cli_print_json(place_cost_json(&p[0], &c[0]));
  } else if (!rc && a->json) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "a", place_cost_json(&p[0], &c[0]));
    cJSON_AddItemToObject(root, "b", place_cost_json(&p[1], &c[1]));
    cli_print_json(root);
  } else if (!rc && n == 1) {
    place_cost_print(stdout, &p[0], &c[0]);
  } else if (!rc) {
    place_cost_diff(stdout, &p[0], &c[0], &p[1], &c[1]);
  }
  free(c);
  return rc;
}

/* Load and account one plan; 0, or 1 with the reason on stderr. */
static int load_and_cost(const char *cmd, const char *path, const struct plan_cost_query *q,
                         struct plan *p, struct plan_cost *c) {
  if (cli_load_plan(cmd, path, p)) return 1;
  if (plan_cost_compute(p, q, c) != CEDAR_OK) {
    fprintf(stderr, "cedar %s: %s: %s\n", cmd, path, c->error);
    return 1;
  }
  return 0;
}

int cmd_plan_cost(int argc, char **argv) {
  const char *cmd = "plan cost";
  struct cost_args a;
  int rc = parse_args(cmd, false, argc, argv, &a);
  if (rc) return rc < 0 ? 0 : rc;
  struct plan *p = cedar_xcalloc(1, sizeof *p);
  struct plan_cost *c = cedar_xcalloc(1, sizeof *c);
  rc = load_and_cost(cmd, a.file[0], &a.q, p, c);
  if (!rc && a.per_rank) {
    rc = per_rank(cmd, &a, p, 1);
  } else if (!rc) {
    if (a.json) {
      cJSON *j = json_cost(p, c);
      run_pd_cost_json(j, p, c->q.prompt);
      cli_print_json(j);
    } else {
      print_cost(stdout, p, c);
      run_pd_cost_print(stdout, p, c->q.prompt);
    }
  }
  plan_free(p);
  free(p);
  free(c);
  return rc;
}

int cmd_plan_diff(int argc, char **argv) {
  const char *cmd = "plan diff";
  struct cost_args a;
  int rc = parse_args(cmd, true, argc, argv, &a);
  if (rc) return rc < 0 ? 0 : rc;
  struct plan *p = cedar_xcalloc(2, sizeof *p);
  struct plan_cost *c = cedar_xcalloc(2, sizeof *c);
  rc = load_and_cost(cmd, a.file[0], &a.q, &p[0], &c[0]);
  if (!rc) rc = load_and_cost(cmd, a.file[1], &a.q, &p[1], &c[1]);
  if (!rc && a.per_rank) {
    rc = per_rank(cmd, &a, p, 2);
  } else if (!rc && a.json) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "a", json_cost(&p[0], &c[0]));
    cJSON_AddItemToObject(root, "b", json_cost(&p[1], &c[1]));
    cJSON_AddItemToObject(root, "b_over_a", json_ratios(&c[0], &c[1]));
    cli_print_json(root);
  } else if (!rc) {
    print_diff(stdout, &p[0], &c[0], &p[1], &c[1]);
  }
  plan_free(&p[0]);
  plan_free(&p[1]);
  free(p);
  free(c);
  return rc;
}
