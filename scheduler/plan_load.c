/* plan_load.c: pass two of plan loading. The merged YAML tree -> the typed
 * `struct plan`, driven by one field table per section: the tables are the
 * schema (keys, types, ranges, SPEC defaults live in plan__defaults), and
 * unknown keys get a did-you-mean from them.
 *
 * Not here: cross-field rules and derived ownership (plan_check.c).
 * Tested by tests/test_plan_load.c and tests/test_plan_rules.c.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "scheduler/plan_internal.h"

/* F_ENUM stores an int; F_BENUM a bool chosen by two words (names[1] = true). */
/* F_SKIP: a known key read elsewhere (layers, layer_overrides, extends). */
enum ftype { F_INT, F_INT64, F_DOUBLE, F_BOOL, F_ENUM, F_BENUM, F_SECTION, F_INT_LIST, F_STRING, F_SKIP };

struct field {
  const char *key;
  enum ftype type;
  size_t off;                     /* into the struct being filled (see read_section) */
  double min, max;                /* numbers; F_INT_LIST: item range */
  const char *const *names;       /* F_ENUM: value i is names[i]; NULL-terminated */
  const struct field *sub;        /* F_SECTION */
  size_t count_off;               /* F_INT_LIST: int count; max items in `max_items` */
  int max_items;
  size_t mark_off;                /* with has_mark: a struct plan_mark (same base) gets the value's place */
  bool has_mark;
};

#define P(member) offsetof(struct plan, member)
#define M(member) offsetof(struct plan, model.member)
#define S(member) offsetof(struct plan, serving.member)
#define INT(k, off, lo, hi) {k, F_INT, off, lo, hi, NULL, NULL, 0, 0, 0, false}
#define I64(k, off, lo, hi) {k, F_INT64, off, lo, hi, NULL, NULL, 0, 0, 0, false}
#define DBL(k, off, lo, hi) {k, F_DOUBLE, off, lo, hi, NULL, NULL, 0, 0, 0, false}
#define BOOL(k, off) {k, F_BOOL, off, 0, 0, NULL, NULL, 0, 0, 0, false}
#define ENUM(k, off, names) {k, F_ENUM, off, 0, 0, names, NULL, 0, 0, 0, false}
#define BENUM(k, off, names) {k, F_BENUM, off, 0, 0, names, NULL, 0, 0, 0, false}
#define SECTION(k, off, sub) {k, F_SECTION, off, 0, 0, NULL, sub, 0, 0, 0, false}
#define LIST(k, off, lo, hi, count, maxn) {k, F_INT_LIST, off, lo, hi, NULL, NULL, count, maxn, 0, false}
#define STR(k, off) {k, F_STRING, off, 0, 0, NULL, NULL, 0, 0, 0, false}
#define END {NULL, F_INT, 0, 0, 0, NULL, NULL, 0, 0, 0, false}

static const char *const elem_names[] = {"e2m1", "e4m3", "bf16", "f32", NULL};
static const char *const scale_names[] = {"none", "e4m3", "e8m0", "f32", NULL};
static const char *const rule_names[] = {"ceil", "ocp", "rne", "roundup", "auto", NULL}; /* = enum plan_scale_rule */
static const char *const score_names[] = {"sqrtsoftplus", "softmax", "sigmoid", NULL};
static const char *const merge_names[] = {"carried", "learned", "sum", NULL};
static const char *const pairing_names[] = {"v41", "v4", NULL};
static const char *const angle_names[] = {"f64", "f32", NULL};
static const char *const rope_pos_names[] = {"first", "last", NULL};
static const char *const key_slot_names[] = {"vendor", "own_source", NULL};
static const char *const nibble_names[] = {"high_first", "low_first", NULL};
static const char *const device_names[] = {"cpu", "cuda", NULL};
static const char *const engram_mult_names[] = {"numpy", "splitmix64", NULL};
static const char *const replay_place_names[] = {"prefill", "decode", NULL};
static const char *const engram_tier_names[] = {"memory", "mmap", NULL};
static const char *const act_names[] = {"f32", "bf16", NULL};
static const char *const lin_names[] = {"f32", "mxfp8", NULL};

/* Sections whose struct is reused take offsets relative to that struct. */
#define R(member) offsetof(struct op_rope_params, member)
static const struct field rope_fields[] = {
    DBL("theta", R(theta), 1, 1e12),
    BOOL("yarn", R(yarn)),
    DBL("yarn_factor", R(yarn_factor), 1, 1e6),
    I64("yarn_original_len", R(yarn_original_len), 1, 1e12),
    DBL("yarn_beta_fast", R(yarn_beta_fast), 0, 1e6),
    DBL("yarn_beta_slow", R(yarn_beta_slow), 0, 1e6),
    BOOL("yarn_mscale", R(yarn_mscale)),
    BENUM("angle", R(angle_f32), angle_names),
    END,
};

#define F(member) offsetof(struct plan_format, member)
static const struct field format_fields[] = {
    ENUM("element", F(elem), elem_names),
    ENUM("scale", F(scale), scale_names),
    INT("block", F(block), 1, 1 << 16),
    ENUM("scale_rule", F(rule), rule_names),
    DBL("scale_floor", F(floor), 0, 1e38),
    BOOL("bf16_round", F(bf16_round)),
    END,
};

static const struct field attention_fields[] = {
    INT("heads", M(heads), 1, 4096),
    INT("head_dim", M(head_dim), 2, 1 << 16),
    INT("rope_dim", M(rope_dim), 0, 1 << 16),
    INT("q_rank", M(q_rank), 1, 1 << 20),
    BOOL("q_head_norm", M(q_head_norm)),
    INT("o_groups", M(o_groups), 1, 4096),
    INT("o_rank", M(o_rank), 1, 1 << 20),
    DBL("softmax_scale", M(softmax_scale), 0, 1e6),
    BOOL("sink", M(sink)),
    END,
};

static const struct field rope_section[] = {
    SECTION("swa", M(rope_swa), rope_fields),
    SECTION("csa", M(rope_csa), rope_fields),
    END,
};

static const struct field indexer_fields[] = {
    INT("heads", M(idx_heads), 1, 4096),
    INT("head_dim", M(idx_head_dim), 2, 1 << 16),
    INT("rope_dim", M(idx_rope_dim), 0, 1 << 16),
    BENUM("rope_position", M(idx_rope_last), rope_pos_names),
    BOOL("k_norm", M(idx_k_norm)),
    BOOL("q_mxfp4", M(idx_q_mxfp4)),
    ENUM("key_slot", M(idx_key_slot), key_slot_names),
    INT("topk", M(topk), 1, 1 << 24),
    END,
};

static const struct field swa_fields[] = {INT("window", M(window), 1, 1 << 24), END};

static const struct field cand_fields[] = {
    INT("block", M(cand_block), 1, 1 << 16),
    INT("top_blocks", M(cand_top_blocks), 1, 1 << 24),
    BOOL("pin_newest", M(cand_pin_newest)),
    END,
};

static const struct field moe_fields[] = {
    INT("routed_experts", M(n_routed), 1, 1 << 16),
    INT("shared_experts", M(n_shared), 0, 64),
    INT("active_experts", M(n_active), 1, 1 << 16),
    INT("inter_dim", M(moe_inter), 1, 1 << 20),
    INT("shared_inter_dim", M(shared_inter), 1, 1 << 20),
    ENUM("score", M(moe_score), score_names),
    BOOL("norm_topk", M(moe_norm_topk)),
    DBL("route_scale", M(route_scale), 0, 1e6),
    DBL("swiglu_limit", M(swiglu_limit), 0, 1e9),
    END,
};

static const struct field mhc_fields[] = {
    INT("streams", M(hc_streams), 1, 64),
    INT("sinkhorn_iters", M(hc_sinkhorn_iters), 1, 10000),
    DBL("eps", M(hc_eps), 0, 1),
    ENUM("pairing", M(hc_pairing), pairing_names),
    ENUM("merge", M(hc_merge), merge_names),
    END,
};

static const struct field engram_fields[] = {
    LIST("orders", M(engram_orders), 2, 16, M(engram_n_orders), PLAN_MAX_ORDERS),
    INT("heads", M(engram_heads), 1, 1024),
    INT("head_dim", M(engram_head_dim), 1, 1 << 16),
    I64("table_base", M(engram_table_base), 2, 1e15),
    INT("compressed_vocab", M(engram_compressed_vocab), 1, 1 << 30),
    INT("pad_id", M(engram_pad_id), 0, 1 << 30),
    ENUM("multipliers", M(engram_mult), engram_mult_names),
    I64("seed", M(engram_seed), 0, 9e15),
    END,
};

static const struct field dspark_fields[] = {
    INT("blocks", M(dspark_blocks), 0, 64),
    INT("window", M(dspark_window), 1, 1 << 20),
    INT("draft", M(dspark_draft), 1, 64),
    INT("markov_rank", M(dspark_markov_rank), 1, 1 << 16),
    INT("routed_experts", M(dspark_experts), 1, 1 << 16),
    INT("active_experts", M(dspark_active), 1, 1 << 16),
    INT("noise_token", M(dspark_noise_token), 0, 1 << 30),
    LIST("target_layers", M(dspark_targets), 0, PLAN_MAX_LAYERS - 1, M(dspark_n_targets), PLAN_MAX_TARGETS),
    END,
};

static const struct field vision_fields[] = {
    INT("layers", M(vit_layers), 0, 1024),
    INT("hidden", M(vit_hidden), 1, 1 << 20),
    INT("heads", M(vit_heads), 1, 4096),
    INT("patch", M(vit_patch), 1, 4096),
    INT("ffn", M(vit_ffn), 1, 1 << 20),
    INT("unshuffle", M(vit_unshuffle), 1, 64),
    INT("proj_hidden", M(vit_proj_hidden), 1, 1 << 20),
    INT("max_tokens", M(vit_max_tokens), 1, 1 << 24),
    INT("image_token", M(image_token), 0, 1 << 30),
    END,
};

static const struct field numerics_fields[] = {
    BENUM("activations", M(num_act_bf16), act_names),
    BENUM("sublayer_io", M(num_io_bf16), act_names),
    BENUM("linear_inputs", M(num_lin_mxfp8), lin_names),
    END,
};

static const struct field model_fields[] = {
    INT("n_layers", M(n_layers), 1, PLAN_MAX_LAYERS),
    INT("hidden", M(hidden), 1, 1 << 20),
    INT("vocab", M(vocab), 1, 1 << 30),
    DBL("norm_eps", M(norm_eps), 0, 1),
    SECTION("attention", 0, attention_fields),
    SECTION("rope", 0, rope_section),
    SECTION("indexer", 0, indexer_fields),
    SECTION("swa", 0, swa_fields),
    SECTION("candidates", 0, cand_fields),
    SECTION("moe", 0, moe_fields),
    SECTION("mhc", 0, mhc_fields),
    SECTION("engram", 0, engram_fields),
    SECTION("dspark", 0, dspark_fields),
    SECTION("vision", 0, vision_fields),
    SECTION("numerics", 0, numerics_fields),
    END,
};

static const struct field formats_fields[] = {
    SECTION("main_kv", M(main_kv), format_fields),
    SECTION("indexer_k", M(indexer_k), format_fields),
    SECTION("swa", M(swa), format_fields),
    BENUM("nibble", M(nibble_low_first), nibble_names),
    END,
};

static const struct field replay_fields[] = {
    INT("encoder", S(replay_encoder), 0, 1 << 24),
    INT("decoder", S(replay_decoder), 1, 1 << 24),
    END,
};

static const struct field cache_fields[] = {
    INT("page_tokens", S(page_tokens), 1, 1 << 20),
    INT("prefix_block_tokens", S(prefix_block_tokens), 1, 1 << 24),
    I64("gpu_bytes", S(gpu_cache_bytes), 0, 9e18),
    I64("host_bytes", S(host_cache_bytes), 0, 9e18),
    DBL("global_ttl_hours", S(global_ttl_hours), 0, 1e6),
    DBL("swa_pool_fraction", S(swa_pool_fraction), 0, 1),
    DBL("swa_pool_ttl_s", S(swa_pool_ttl_s), 0, 1e9),
    END,
};

/* Placement values keep their place: runtime/node/backend.h refuses what this
 * build cannot run and names it. */
static const struct field prefill_place_fields[] = {
    {"rank", F_INT, S(prefill_rank), 0, 1 << 20, NULL, NULL, 0, 0, S(mark_prefill_rank), true},
    {"device", F_ENUM, S(prefill_device), 0, 0, device_names, NULL, 0, 0, S(mark_prefill_device), true},
    INT("device_id", S(prefill_device_id), 0, 1024),
    END,
};

static const struct field decode_place_fields[] = {
    {"rank", F_INT, S(decode_rank), 0, 1 << 20, NULL, NULL, 0, 0, S(mark_decode_rank), true},
    {"device", F_ENUM, S(decode_device), 0, 0, device_names, NULL, 0, 0, S(mark_decode_device), true},
    INT("device_id", S(decode_device_id), 0, 1024),
    END,
};

static const struct field placement_fields[] = {
    SECTION("prefill", 0, prefill_place_fields),
    SECTION("decode", 0, decode_place_fields),
    ENUM("replay", S(pd_replay), replay_place_names),
    {"stages", F_SKIP, 0, 0, 0, NULL, NULL, 0, 0, 0, false},  /* plan_place.c */
    {"experts", F_SKIP, 0, 0, 0, NULL, NULL, 0, 0, 0, false},
    {"engram", F_SKIP, 0, 0, 0, NULL, NULL, 0, 0, 0, false},
    END,
};

static const struct field batch_fields[] = {
    INT("max_requests", S(batch_max_requests), 1, 4096),
    INT("step_tokens", S(batch_step_tokens), 0, 1 << 24),
    INT("chunk", S(batch_chunk), 0, 1 << 24),
    END,
};

static const struct field serving_engram_fields[] = {
    {"tier", F_ENUM, S(engram_tier), 0, 0, engram_tier_names, NULL, 0, 0, S(mark_engram_tier), true},
    STR("file", S(engram_file)),
    BOOL("prefetch", S(engram_prefetch)),
    END,
};

static const struct field serving_fields[] = {
    BOOL("ced", S(ced)),
    SECTION("replay", 0, replay_fields),
    INT("prefill_chunk", S(prefill_chunk), 1, 1 << 24),
    SECTION("batch", 0, batch_fields),
    SECTION("cache", 0, cache_fields),
    SECTION("placement", 0, placement_fields),
    SECTION("engram", 0, serving_engram_fields),
    END,
};

/* `layers` and `layer_overrides` are read by hand below; listed here so the
 * did-you-mean knows them. */
static const struct field top_fields[] = {
    STR("name", P(name)),
    STR("description", P(description)),
    SECTION("model", 0, model_fields),
    SECTION("formats", 0, formats_fields),
    SECTION("serving", 0, serving_fields),
    {"layers", F_SKIP, 0, 0, 0, NULL, NULL, 0, 0, 0, false},
    {"layer_overrides", F_SKIP, 0, 0, 0, NULL, NULL, 0, 0, 0, false},
    {"extends", F_SKIP, 0, 0, 0, NULL, NULL, 0, 0, 0, false},
    END,
};

/* ---------------------------------------------------------------- scalars */

/* Parse a plain integer (digits, optional sign, '_' separators). */
static bool parse_int(const char *s, long long *out) {
  char buf[64];
  size_t n = 0;
  for (const char *c = s; *c; c++) {
    if (*c == '_') continue;
    if (n + 1 >= sizeof buf) return false;
    buf[n++] = *c;
  }
  buf[n] = 0;
  if (!n) return false;
  char *end;
  errno = 0;
  long long v = strtoll(buf, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

static bool parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || end == s || !isfinite(v)) return false;
  *out = v;
  return true;
}

static const char *type_word(enum ftype t) {
  switch (t) {
    case F_INT:
    case F_INT64: return "an integer";
    case F_DOUBLE: return "a number";
    case F_BOOL: return "true or false";
    case F_ENUM:
    case F_BENUM: return "one of the listed words";
    case F_SECTION: return "a mapping";
    case F_INT_LIST: return "a list of integers";
    case F_STRING: return "a string";
    case F_SKIP: return "?";
  }
  return "?";
}

static void wrong_type(struct plan_ctx *ctx, const struct pnode *v, const char *key, enum ftype t) {
  char hint[160];
  snprintf(hint, sizeof hint, "write %s for `%s`", type_word(t), key);
  if (v->kind == PN_SCALAR)
    plan__error(ctx, v->mark, hint, "`%s` must be %s, not %s'%s'", key, type_word(t),
                v->plain ? "" : "the quoted string ", v->str);
  else
    plan__error(ctx, v->mark, hint, "`%s` must be %s, not %s", key, type_word(t), plan__kind_name(v));
}

static void out_of_range(struct plan_ctx *ctx, const struct pnode *v, const char *key, double lo,
                         double hi) {
  char hint[160];
  snprintf(hint, sizeof hint, "use a value from %.17g to %.17g", lo, hi);
  plan__error(ctx, v->mark, hint, "`%s` = %s is out of range", key, v->str);
}

/* Read an integer scalar in [lo, hi]; false after reporting. */
bool plan__read_int(struct plan_ctx *ctx, const struct pnode *v, const char *key, double lo, double hi,
                    long long *out) {
  if (v->kind != PN_SCALAR || !v->plain || !parse_int(v->str, out)) {
    wrong_type(ctx, v, key, F_INT);
    return false;
  }
  if ((double)*out < lo || (double)*out > hi) {
    out_of_range(ctx, v, key, lo, hi);
    return false;
  }
  return true;
}

bool plan__read_bool(struct plan_ctx *ctx, const struct pnode *v, const char *key, bool *out) {
  if (v->kind == PN_SCALAR && v->plain && (!strcmp(v->str, "true") || !strcmp(v->str, "false"))) {
    *out = v->str[0] == 't';
    return true;
  }
  wrong_type(ctx, v, key, F_BOOL);
  return false;
}

bool plan__read_enum(struct plan_ctx *ctx, const struct pnode *v, const char *key,
                     const char *const *names, int *out) {
  if (v->kind == PN_SCALAR)
    for (int i = 0; names[i]; i++)
      if (!strcmp(v->str, names[i])) {
        *out = i;
        return true;
      }
  char hint[256] = "use one of:";
  for (int i = 0; names[i]; i++) {
    strncat(hint, " ", sizeof hint - strlen(hint) - 1);
    strncat(hint, names[i], sizeof hint - strlen(hint) - 1);
  }
  if (v->kind == PN_SCALAR)
    plan__error(ctx, v->mark, hint, "`%s` = '%s' is not a known value", key, v->str);
  else
    plan__error(ctx, v->mark, hint, "`%s` must be a word, not %s", key, plan__kind_name(v));
  return false;
}

/* ---------------------------------------------------------------- sections */

void plan__unknown_key(struct plan_ctx *ctx, const struct pnode *k, const char *where,
                       const char *const *known, size_t n_known) {
  const char *best = NULL;
  int best_d = 99;
  for (size_t i = 0; i < n_known; i++) {
    int d = plan__edit_distance(k->str, known[i]);
    if (d < best_d) best_d = d, best = known[i];
  }
  /* keys a plan may still carry from an older cedar, with what replaced them */
  static const char *const retired[][2] = {
      {"max_batch", "`serving.max_batch` was retired: continuous batching reads `serving.batch.max_requests` "
                    "(docs/serving.md)"},
  };
  char hint[512];
  for (size_t i = 0; i < sizeof retired / sizeof retired[0]; i++)
    if (!strcmp(k->str, retired[i][0])) {
      plan__error(ctx, k->mark, retired[i][1], "unknown key `%s` %s", k->str, where);
      return;
    }
  if (best && best_d <= 1 + (int)strlen(k->str) / 3) {
    snprintf(hint, sizeof hint, "did you mean `%s`?", best);
  } else {
    snprintf(hint, sizeof hint, "known keys here:");
    for (size_t i = 0; i < n_known; i++) {
      strncat(hint, " ", sizeof hint - strlen(hint) - 1);
      strncat(hint, known[i], sizeof hint - strlen(hint) - 1);
    }
  }
  plan__error(ctx, k->mark, hint, "unknown key `%s` %s", k->str, where);
}

static void read_field(struct plan_ctx *ctx, const struct field *f, const struct pnode *v, char *base,
                       const char *where);

/* `where` is the section's dotted path ("model.attention"), for messages. */
static void read_section(struct plan_ctx *ctx, const struct field *table, const struct pnode *map,
                         const char *where, char *base) {
  if (map->kind != PN_MAP) {
    wrong_type(ctx, map, where, F_SECTION);
    return;
  }
  for (size_t i = 0; i + 1 < map->n; i += 2) {
    const struct pnode *k = map->kids[i];
    const struct field *f = table;
    while (f->key && strcmp(f->key, k->str)) f++;
    if (!f->key) {
      const char *known[32];
      size_t n = 0;
      for (const struct field *g = table; g->key && n < 32; g++) known[n++] = g->key;
      char place[96];
      snprintf(place, sizeof place, *where ? "in `%s`" : "at the top level", where);
      plan__unknown_key(ctx, k, place, known, n);
      continue;
    }
    read_field(ctx, f, map->kids[i + 1], base, where);
  }
}

static void read_list(struct plan_ctx *ctx, const struct field *f, const struct pnode *v, char *base,
                      const char *path) {
  if (v->kind != PN_SEQ) {
    wrong_type(ctx, v, path, F_INT_LIST);
    return;
  }
  if ((int)v->n > f->max_items) {
    char hint[64];
    snprintf(hint, sizeof hint, "list at most %d values", f->max_items);
    plan__error(ctx, v->mark, hint, "`%s` has %zu values", path, v->n);
    return;
  }
  int *items = (int *)(base + f->off);
  for (size_t i = 0; i < v->n; i++) {
    long long x;
    if (!plan__read_int(ctx, v->kids[i], path, f->min, f->max, &x)) return;
    items[i] = (int)x;
  }
  *(int *)(base + f->count_off) = (int)v->n;
}

static void read_field(struct plan_ctx *ctx, const struct field *f, const struct pnode *v, char *base,
                       const char *where) {
  void *dst = base + f->off;
  if (f->has_mark) *(struct plan_mark *)(base + f->mark_off) = v->mark;
  char path[96];
  snprintf(path, sizeof path, "%s%s%s", where, *where ? "." : "", f->key);
  long long i;
  double d;
  int e;
  switch (f->type) {
    case F_INT:
      if (plan__read_int(ctx, v, path, f->min, f->max, &i)) *(int *)dst = (int)i;
      break;
    case F_INT64:
      if (plan__read_int(ctx, v, path, f->min, f->max, &i)) *(int64_t *)dst = i;
      break;
    case F_DOUBLE:
      if (v->kind != PN_SCALAR || !v->plain || !parse_double(v->str, &d))
        wrong_type(ctx, v, path, F_DOUBLE);
      else if (d < f->min || d > f->max)
        out_of_range(ctx, v, path, f->min, f->max);
      else
        *(double *)dst = d;
      break;
    case F_BOOL:
      plan__read_bool(ctx, v, path, (bool *)dst);
      break;
    case F_ENUM:
      if (plan__read_enum(ctx, v, path, f->names, &e)) *(int *)dst = e;
      break;
    case F_BENUM:
      if (plan__read_enum(ctx, v, path, f->names, &e)) *(bool *)dst = e == 1;
      break;
    case F_SECTION:
      read_section(ctx, f->sub, v, path, (char *)dst);
      break;
    case F_INT_LIST:
      read_list(ctx, f, v, base, path);
      break;
    case F_SKIP:
      break;
    case F_STRING:
      if (v->kind != PN_SCALAR) {
        wrong_type(ctx, v, path, F_STRING);
      } else {
        free(*(char **)dst);
        *(char **)dst = cedar_xstrdup(v->str);
      }
      break;
  }
}

/* ---------------------------------------------------------------- values */

static void each_value(const struct field *table, const char *base, const char *where, plan_value_fn fn, void *ctx) {
  for (const struct field *f = table; f->key; f++) {
    char path[96];
    snprintf(path, sizeof path, "%s%s%s", where, *where ? "." : "", f->key);
    const char *v = base + f->off;
    switch (f->type) {
      case F_INT:
      case F_ENUM: fn(ctx, path, v, sizeof(int)); break;
      case F_INT64: fn(ctx, path, v, sizeof(int64_t)); break;
      case F_DOUBLE: fn(ctx, path, v, sizeof(double)); break;
      case F_BOOL:
      case F_BENUM: fn(ctx, path, v, sizeof(bool)); break;
      case F_INT_LIST: fn(ctx, path, v, sizeof(int) * (size_t)*(const int *)(base + f->count_off)); break;
      case F_STRING: {
        const char *str = *(char *const *)v;
        fn(ctx, path, str ? str : "", str ? strlen(str) : 0);
        break;
      }
      case F_SECTION: each_value(f->sub, v, path, fn, ctx); break;
      case F_SKIP: break;
    }
  }
}

void plan_each_value(const struct plan *p, plan_value_fn fn, void *ctx) {
  each_value(top_fields, (const char *)p, "", fn, ctx);
}

void plan__read_layers(struct plan_ctx *ctx, const struct pnode *root, struct plan *p);

void plan__from_tree(struct plan_ctx *ctx, const struct pnode *root, struct plan *p) {
  read_section(ctx, top_fields, root, "", (char *)p);
  plan__read_layers(ctx, root, p);
  plan__read_placement(ctx, root, p);
}
