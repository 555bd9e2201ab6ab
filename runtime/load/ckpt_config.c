/* ckpt_config.c: config.json <-> struct ckpt_config (one table of field
 * names), and the config -> plan YAML rules (see ckpt_config.h). The plan
 * comparison is in ckpt_plan_compare.c.
 */
#include "runtime/load/ckpt_config.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/check.h"
#include "base/file.h"
#include "base/quote.h"
#include "ops/engram.h"

#define CONFIG_MAX_BYTES (16u << 20)

enum ftype { F_INT, F_DBL, F_BOOL, F_STR, F_LIST };
enum fscope { S_TEXT, S_ROOT, S_VISION };
enum fneed { OPT, REQ, ENGRAM }; /* ENGRAM: required when engram_layer_ids is not empty */

/* One field: its official spelling (a dotted path inside its scope), the
 * colibri short name (in the text scope), the member, limits for integers
 * and the default of an optional field. */
struct cfield {
  const char *name, *alias;
  enum fscope scope;
  enum ftype type;
  enum fneed need;
  size_t off;
  double lo, hi, def;
};

#define C(m) offsetof(struct ckpt_config, m)
#define BIG 1e15
static const struct cfield fields[] = {
    {"vocab_size", NULL, S_TEXT, F_INT, REQ, C(vocab), 1, 1 << 30, 0},
    {"hidden_size", "dim", S_TEXT, F_INT, REQ, C(hidden), 1, 1 << 20, 0},
    {"num_hidden_layers", "n_layers", S_TEXT, F_INT, REQ, C(n_layers), 1, PLAN_MAX_LAYERS, 0},
    {"num_attention_heads", "n_heads", S_TEXT, F_INT, REQ, C(heads), 1, 4096, 0},
    {"head_dim", NULL, S_TEXT, F_INT, REQ, C(head_dim), 2, 1 << 16, 0},
    {"qk_rope_head_dim", "rope_head_dim", S_TEXT, F_INT, REQ, C(rope_dim), 0, 1 << 16, 0},
    {"q_lora_rank", NULL, S_TEXT, F_INT, REQ, C(q_rank), 1, 1 << 20, 0},
    {"o_lora_rank", NULL, S_TEXT, F_INT, REQ, C(o_rank), 1, 1 << 20, 0},
    {"o_groups", NULL, S_TEXT, F_INT, REQ, C(o_groups), 1, 4096, 0},
    {"rms_norm_eps", "norm_eps", S_TEXT, F_DBL, REQ, C(norm_eps), 0, 1, 0},
    {"swiglu_limit", NULL, S_TEXT, F_DBL, OPT, C(swiglu_limit), 0, 1e9, 0},
    {"rope_theta", NULL, S_TEXT, F_DBL, REQ, C(rope_theta), 1, 1e12, 0},
    {"compress_rope_theta", NULL, S_TEXT, F_DBL, REQ, C(compress_rope_theta), 1, 1e12, 0},
    {"rope_scaling.factor", "rope_factor", S_TEXT, F_DBL, OPT, C(yarn_factor), 1, 1e6, 1},
    {"rope_scaling.beta_fast", "beta_fast", S_TEXT, F_DBL, OPT, C(beta_fast), 0, 1e6, 32},
    {"rope_scaling.beta_slow", "beta_slow", S_TEXT, F_DBL, OPT, C(beta_slow), 0, 1e6, 1},
    {"rope_scaling.original_max_position_embeddings", "original_seq_len", S_TEXT, F_INT, OPT,
     C(yarn_original_len), 1, 1e12, 65536},
    {"n_routed_experts", NULL, S_TEXT, F_INT, REQ, C(n_routed), 1, 1 << 16, 0},
    {"n_shared_experts", NULL, S_TEXT, F_INT, REQ, C(n_shared), 0, 64, 0},
    {"num_experts_per_tok", "n_activated_experts", S_TEXT, F_INT, REQ, C(n_active), 1, 1 << 16, 0},
    {"moe_intermediate_size", "moe_inter_dim", S_TEXT, F_INT, REQ, C(moe_inter), 1, 1 << 20, 0},
    {"scoring_func", "score_func", S_TEXT, F_STR, REQ, C(score), 0, 0, 0},
    {"norm_topk_prob", NULL, S_TEXT, F_BOOL, OPT, C(norm_topk), 0, 0, 1},
    {"routed_scaling_factor", "route_scale", S_TEXT, F_DBL, REQ, C(route_scale), 0, 1e6, 0},
    {"sliding_window", "window_size", S_TEXT, F_INT, REQ, C(window), 1, 1 << 24, 0},
    {"compress_ratios", NULL, S_TEXT, F_LIST, REQ, C(ratios), 0, 1 << 16, 0},
    {"kv_source_layer_ids", "kv_source_layers", S_TEXT, F_LIST, REQ, C(kv_sources), 0, PLAN_MAX_LAYERS - 1, 0},
    {"index_source_layer_ids", "index_source_layers", S_TEXT, F_LIST, REQ, C(index_sources), 0,
     PLAN_MAX_LAYERS - 1, 0},
    {"index_n_heads", NULL, S_TEXT, F_INT, REQ, C(idx_heads), 1, 4096, 0},
    {"index_head_dim", NULL, S_TEXT, F_INT, REQ, C(idx_head_dim), 2, 1 << 16, 0},
    {"index_topk", NULL, S_TEXT, F_INT, REQ, C(idx_topk), 1, 1 << 24, 0},
    {"candidate_source_layer_id", "candidate_source_layer", S_TEXT, F_INT, OPT, C(cand_source), -1,
     PLAN_MAX_LAYERS - 1, -1},
    {"candidate_topk_blocks", NULL, S_TEXT, F_INT, OPT, C(cand_top_blocks), 0, 1 << 24, 0},
    {"candidate_block_size", NULL, S_TEXT, F_INT, OPT, C(cand_block), 0, 1 << 16, 0},
    {"hc_mult", NULL, S_TEXT, F_INT, REQ, C(hc), 1, 64, 0},
    {"hc_sinkhorn_iters", NULL, S_TEXT, F_INT, REQ, C(hc_iters), 1, 10000, 0},
    {"hc_eps", NULL, S_TEXT, F_DBL, REQ, C(hc_eps), 0, 1, 0},
    {"engram_layer_ids", NULL, S_TEXT, F_LIST, OPT, C(engram_layers), 0, PLAN_MAX_LAYERS - 1, 0},
    {"engram_num_embeddings", NULL, S_TEXT, F_LIST, OPT, C(engram_rows), 1, BIG, 0},
    {"engram_max_ngram_size", NULL, S_TEXT, F_INT, ENGRAM, C(engram_max_ngram), 2, PLAN_MAX_ORDERS + 1, 0},
    {"engram_vocab_size", NULL, S_TEXT, F_INT, ENGRAM, C(engram_vocab), 2, BIG, 0},
    {"engram_n_heads", NULL, S_TEXT, F_INT, ENGRAM, C(engram_heads), 1, 1024, 0},
    {"engram_head_dim", NULL, S_TEXT, F_INT, ENGRAM, C(engram_head_dim), 1, 1 << 16, 0},
    {"engram_pad_token_id", "engram_pad_id", S_TEXT, F_INT, ENGRAM, C(engram_pad), 0, 1 << 30, 0},
    {"engram_compressed_vocab_size", NULL, S_TEXT, F_INT, ENGRAM, C(engram_cvocab), 1, 1 << 30, 0},
    {"num_nextn_predict_layers", "n_mtp_layers", S_TEXT, F_INT, OPT, C(n_mtp), 0, 64, 0},
    {"dspark_block_size", NULL, S_TEXT, F_INT, OPT, C(dspark_block), 0, 64, 0},
    {"dspark_noise_token_id", NULL, S_TEXT, F_INT, OPT, C(dspark_noise), -1, 1 << 30, -1},
    {"dspark_target_layer_ids", NULL, S_TEXT, F_LIST, OPT, C(dspark_targets), 0, PLAN_MAX_LAYERS - 1, 0},
    {"dspark_markov_rank", NULL, S_TEXT, F_INT, OPT, C(dspark_markov_rank), 0, 1 << 16, 0},
    {"dspark_n_routed_experts", NULL, S_TEXT, F_INT, OPT, C(dspark_experts), 0, 1 << 16, 0},
    {"dspark_num_experts_per_tok", "dspark_n_activated_experts", S_TEXT, F_INT, OPT, C(dspark_active), 0,
     1 << 16, 0},
    {"image_token_id", NULL, S_ROOT, F_INT, OPT, C(image_token), -1, 1 << 30, -1},
    {"num_hidden_layers", "vision_n_layers", S_VISION, F_INT, OPT, C(vit_layers), 0, 1024, 0},
    {"hidden_size", "vision_dim", S_VISION, F_INT, OPT, C(vit_hidden), 0, 1 << 20, 0},
    {"num_attention_heads", "vision_n_heads", S_VISION, F_INT, OPT, C(vit_heads), 0, 4096, 0},
    {"intermediate_size", "vision_inter_dim", S_VISION, F_INT, OPT, C(vit_ffn), 0, 1 << 20, 0},
    {"patch_size", "vision_patch_size", S_VISION, F_INT, OPT, C(vit_patch), 0, 4096, 0},
    {"downsample_ratio", "vision_downsample_ratio", S_VISION, F_INT, OPT, C(vit_unshuffle), 0, 64, 0},
    {"max_image_tokens", "vision_max_n_token", S_VISION, F_INT, OPT, C(vit_max_tokens), 0, 1 << 24, 0},
};
#define N_FIELDS (sizeof fields / sizeof fields[0])

/* ---- reading -------------------------------------------------------------- */

/* A dotted path inside obj; NULL when any step is absent. */
static const cJSON *at_path(const cJSON *obj, const char *path) {
  char buf[96];
  snprintf(buf, sizeof buf, "%s", path);
  const cJSON *o = obj;
  for (char *save = NULL, *k = strtok_r(buf, ".", &save); k && o; k = strtok_r(NULL, ".", &save))
    o = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
  return o;
}

static bool integral(double v, double lo, double hi) { return v == floor(v) && v >= lo && v <= hi; }

/* Store one JSON value into the member; a message on a bad value. */
static int store(const struct cfield *f, const char *key, const cJSON *v, struct ckpt_config *c, const char *label,
                 char *err, size_t len) {
  void *m = (char *)c + f->off;
  switch (f->type) {
    case F_INT:
      if (!cJSON_IsNumber(v) || !integral(v->valuedouble, f->lo, f->hi))
        return snprintf(err, len, "%s: `%s` must be an integer in [%.0f, %.0f]", label, key, f->lo, f->hi),
               CEDAR_EFORMAT;
      *(int64_t *)m = (int64_t)v->valuedouble;
      return 0;
    case F_DBL:
      if (!cJSON_IsNumber(v) || !(v->valuedouble >= f->lo && v->valuedouble <= f->hi))
        return snprintf(err, len, "%s: `%s` must be a number in [%g, %g]", label, key, f->lo, f->hi), CEDAR_EFORMAT;
      *(double *)m = v->valuedouble;
      return 0;
    case F_BOOL:
      if (!cJSON_IsBool(v)) return snprintf(err, len, "%s: `%s` must be true or false", label, key), CEDAR_EFORMAT;
      *(bool *)m = cJSON_IsTrue(v);
      return 0;
    case F_STR:
      if (!cJSON_IsString(v) || strlen(v->valuestring) >= sizeof c->score)
        return snprintf(err, len, "%s: `%s` must be a short string", label, key), CEDAR_EFORMAT;
      snprintf(m, sizeof c->score, "%s", v->valuestring);
      return 0;
    case F_LIST: {
      struct ckpt_list *l = m;
      int n = cJSON_GetArraySize(v);
      if (!cJSON_IsArray(v) || n > CKPT_MAX_LIST)
        return snprintf(err, len, "%s: `%s` must be a list of at most %d integers", label, key, CKPT_MAX_LIST),
               CEDAR_EFORMAT;
      l->n = 0;
      const cJSON *e;
      cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsNumber(e) || !integral(e->valuedouble, f->lo, f->hi))
          return snprintf(err, len, "%s: `%s` item %d must be an integer in [%.0f, %.0f]", label, key, l->n + 1, f->lo,
                          f->hi),
                 CEDAR_EFORMAT;
        l->v[l->n++] = (int64_t)e->valuedouble;
      }
      return 0;
    }
  }
  return CEDAR_EINVAL;
}

static bool same_json(const cJSON *a, const cJSON *b) { return cJSON_Compare(a, b, true); }

/* A key given twice in one object anywhere in the file: cJSON would keep the
 * first and Python's json the last, so the two readers would build different
 * models; refused, naming the key and where it is. */
static int dup_keys(const cJSON *o, const char *where, const char *label, char *err, size_t len) {
  for (const cJSON *a = o->child; a; a = a->next) {
    for (const cJSON *b = a->next; cJSON_IsObject(o) && b; b = b->next)
      if (!strcmp(a->string, b->string))
        return snprintf(err, len, "%s: `%s` is given twice in %s%s%s; give it once", label, a->string,
                        *where ? "`" : "the top level", where, *where ? "`" : ""),
               CEDAR_EFORMAT;
    if (cJSON_IsObject(a) || cJSON_IsArray(a)) {
      char sub[160];
      snprintf(sub, sizeof sub, "%s%s%s", where, *where ? "." : "", a->string ? a->string : "[]");
      int rc = dup_keys(a, sub, label, err, len);
      if (rc) return rc;
    }
  }
  return 0;
}

/* The objects a field's dotted path passes through (rope_scaling,
 * text_config, vision_config) must be objects when present: a string
 * `rope_scaling` would otherwise read as absent and silently turn YaRN off.
 * null is absent (Hugging Face writes "rope_scaling": null for none). */
static int check_objects(const cJSON *root, const cJSON *text_scope, const char *label, char *err, size_t len) {
  static const char *const top[] = {"text_config", "vision_config"};
  for (size_t i = 0; i < 2; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, top[i]);
    if (v && !cJSON_IsNull(v) && !cJSON_IsObject(v))
      return snprintf(err, len, "%s: `%s` must be an object, not %s", label, top[i], cJSON_IsString(v) ? "a string" : "another JSON type"),
             CEDAR_EFORMAT;
  }
  for (size_t i = 0; i < N_FIELDS; i++) {
    const char *dot = strchr(fields[i].name, '.');
    if (!dot || fields[i].scope != S_TEXT) continue;
    char head[64];
    snprintf(head, sizeof head, "%.*s", (int)(dot - fields[i].name), fields[i].name);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(text_scope, head);
    if (v && !cJSON_IsNull(v) && !cJSON_IsObject(v))
      return snprintf(err, len, "%s: `%s` must be an object holding `%s`, not %s", label, head, dot + 1,
                      cJSON_IsString(v) ? "a string" : "another JSON type"),
             CEDAR_EFORMAT;
  }
  return 0;
}

int ckpt_config_parse(const char *label, const char *text, size_t len, struct ckpt_config *c, char *err,
                      size_t err_len) {
  memset(c, 0, sizeof *c);
  cJSON *root = cJSON_ParseWithLength(text, len);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return snprintf(err, err_len, "%s: not a JSON object (a checkpoint's config.json)", label), CEDAR_EFORMAT;
  }
  const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
  const cJSON *text_scope = cJSON_IsObject(tc) ? tc : root;
  const cJSON *vc = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
  int rc = dup_keys(root, "", label, err, err_len);
  if (!rc) rc = check_objects(root, text_scope, label, err, err_len);
  for (size_t i = 0; i < N_FIELDS && !rc; i++) {
    const struct cfield *f = &fields[i];
    const cJSON *scope = f->scope == S_VISION ? (cJSON_IsObject(vc) ? vc : NULL) : f->scope == S_ROOT ? root : text_scope;
    const cJSON *v = scope ? at_path(scope, f->name) : NULL;
    if (!v && f->scope == S_ROOT) v = at_path(text_scope, f->name);
    const cJSON *a = f->alias ? cJSON_GetObjectItemCaseSensitive(text_scope, f->alias) : NULL;
    if (v && a && !same_json(v, a))
      rc = (snprintf(err, err_len, "%s: `%s` and its short name `%s` disagree; give one", label, f->name, f->alias),
      CEDAR_EFORMAT);
    else if (v || a)
      rc = store(f, v ? f->name : f->alias, v ? v : a, c, label, err, err_len);
    else if (f->type == F_INT)
      *(int64_t *)((char *)c + f->off) = (int64_t)f->def;
    else if (f->type == F_DBL)
      *(double *)((char *)c + f->off) = f->def;
    else if (f->type == F_BOOL)
      *(bool *)((char *)c + f->off) = f->def != 0;
    if (!rc && !v && !a && f->need == REQ)
      rc = (snprintf(err, err_len, "%s: no `%s`%s%s%s (Appendix V's text_config field; docs/checkpoints.md)", label,
                    f->name, f->alias ? " (or `" : "", f->alias ? f->alias : "", f->alias ? "`)" : ""),
      CEDAR_EFORMAT);
  }
  for (size_t i = 0; i < N_FIELDS && !rc && c->engram_layers.n; i++) {
    const struct cfield *f = &fields[i];
    if (f->need == ENGRAM && !at_path(text_scope, f->name) && !(f->alias && at_path(text_scope, f->alias)))
      rc = (snprintf(err, err_len, "%s: engram_layer_ids is set but `%s` is missing", label, f->name), CEDAR_EFORMAT);
  }
  cJSON_Delete(root);
  if (!rc && c->ratios.n < c->n_layers)
    rc = (snprintf(err, err_len, "%s: compress_ratios has %d entries for %" PRId64 " layers", label, c->ratios.n,
                  c->n_layers),
    CEDAR_EFORMAT);
  return rc;
}

int ckpt_config_read(const char *path, struct ckpt_config *c, char *err, size_t err_len) {
  size_t n;
  char *buf = cedar_read_all(path, CONFIG_MAX_BYTES, &n, err, err_len); /* base/file.h: no FIFO, device, giant */
  if (!buf) return CEDAR_EIO;
  int rc = ckpt_config_parse(path, buf, n, c, err, err_len);
  free(buf);
  return rc;
}

/* ---- the plan a config implies --------------------------------------------- */

static bool in_list(const struct ckpt_list *l, int64_t v) {
  for (int i = 0; i < l->n; i++)
    if (l->v[i] == v) return true;
  return false;
}

static const char *score_name(const char *s) {
  return !strcmp(s, "sqrtsoftplus") ? "sqrtsoftplus" : !strcmp(s, "softmax") ? "softmax"
                                                      : !strcmp(s, "sigmoid") ? "sigmoid" : NULL;
}

/* One layer's entry text (everything after `at`), so equal neighbours merge. */
static void layer_entry(const struct ckpt_config *c, int l, int decoder_from, char *out, size_t len) {
  int64_t r = c->ratios.v[l];
  const char *mode = r == 0 ? "swa_only" : in_list(&c->kv_sources, l) ? "full"
                                         : in_list(&c->index_sources, l) ? "reindex" : "reuse";
  int o = snprintf(out, len, "region: %s, mode: %s", l >= decoder_from ? "decoder" : "encoder", mode);
  if (r) o += snprintf(out + o, len - (size_t)o, ", ratio: %" PRId64, r);
  if (c->cand_source >= 0 && c->cand_top_blocks > 0 && r) {
    int64_t src = c->cand_source;
    if (l == src) o += snprintf(out + o, len - (size_t)o, ", candidates: build");
    else if (l > src && !strcmp(mode, "reindex") && c->ratios.v[src] == r)
      o += snprintf(out + o, len - (size_t)o, ", candidates: read");
  }
  if (in_list(&c->engram_layers, l)) snprintf(out + o, len - (size_t)o, ", engram: true");
}

/* The checks a config must pass before it becomes YAML (the plan loader then
 * checks the rest, e.g. that a reuse layer has a source before it). */
static int check_layers(const struct ckpt_config *c, char *err, size_t len) {
  const struct ckpt_list *lists[] = {&c->kv_sources, &c->index_sources, &c->engram_layers};
  const char *names[] = {"kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids"};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < lists[k]->n; i++) {
      int64_t l = lists[k]->v[i];
      if (l >= c->n_layers)
        return snprintf(err, len, "%s names layer %" PRId64 ", past the %" PRId64 " layers", names[k], l, c->n_layers),
               CEDAR_EINVAL;
      if (k < 2 && c->ratios.v[l] == 0)
        return snprintf(err, len, "%s names layer %" PRId64 ", whose compress ratio is 0 (window only)", names[k], l),
               CEDAR_EINVAL;
    }
  for (int i = 0; i < c->kv_sources.n; i++)
    if (!in_list(&c->index_sources, c->kv_sources.v[i]))
      return snprintf(err, len, "KV source layer %" PRId64 " is not in index_source_layer_ids (cedar's `mode: full` "
                      "owns both)", c->kv_sources.v[i]),
             CEDAR_EINVAL;
  if (c->engram_layers.n && c->engram_rows.n && c->engram_rows.n != c->engram_layers.n)
    return snprintf(err, len, "engram_num_embeddings has %d entries for %d Engram layers", c->engram_rows.n,
                    c->engram_layers.n),
           CEDAR_EINVAL;
  if (!score_name(c->score))
    return snprintf(err, len, "scoring_func '%s' is not one cedar runs (sqrtsoftplus, softmax, sigmoid)", c->score),
           CEDAR_EINVAL;
  if (c->cand_source >= c->n_layers || (c->cand_source >= 0 && !in_list(&c->kv_sources, c->cand_source)))
    return snprintf(err, len, "candidate_source_layer_id %" PRId64 " is not a KV source layer", c->cand_source),
           CEDAR_EINVAL;
  return 0;
}

/* The CED decoder region starts at the first ratio-1 layer (V4.1: L20, the
 * candidate source); without one the whole model is one region, run dense. */
static int decoder_start(const struct ckpt_config *c) {
  for (int l = 0; l < c->n_layers; l++)
    if (c->ratios.v[l] == 1) return l;
  return (int)c->n_layers;
}

/* The shortest text that reads back as v (YAML and JSON both take it). */
struct gbuf {
  char s[32];
};
static struct gbuf G(double v) {
  struct gbuf b;
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(b.s, sizeof b.s, "%.*g", prec, v);
    if (strtod(b.s, NULL) == v) break;
  }
  return b;
}

int ckpt_config_plan_yaml(const struct ckpt_config *c, const char *name, char **yaml, char *err, size_t err_len) {
  *yaml = NULL;
  int rc = check_layers(c, err, err_len);
  if (rc) return rc;
  size_t size = 0;
  FILE *f = open_memstream(yaml, &size);
  CEDAR_ASSERT(f);
  int dec = decoder_start(c);
  fprintf(f, "# The plan a released checkpoint's config.json implies (`cedar plan import`).\n"
             "# Semantic keys and cache formats follow the vendor (Appendix V); serving is\n"
             "# the plan language's defaults: edit it in a plan that `extends` this one.\n");
  fputs("name: ", f);
  cedar_quote_yaml(f, name); /* --name NAME is any string: data, never keys (base/quote.h) */
  fputs("\ndescription: imported from config.json\n\nmodel:\n", f);
  fprintf(f, "  n_layers: %" PRId64 "\n  hidden: %" PRId64 "\n  vocab: %" PRId64 "\n  norm_eps: %s\n", c->n_layers,
          c->hidden, c->vocab, G(c->norm_eps).s);
  fprintf(f, "  attention:\n    heads: %" PRId64 "\n    head_dim: %" PRId64 "\n    rope_dim: %" PRId64
             "\n    q_rank: %" PRId64 "\n    q_head_norm: false\n    o_groups: %" PRId64 "\n    o_rank: %" PRId64
             "\n    sink: true\n",
          c->heads, c->head_dim, c->rope_dim, c->q_rank, c->o_groups, c->o_rank);
  bool yarn = c->yarn_factor > 1;
  fprintf(f, "  rope:\n    swa: {theta: %s, yarn: false}\n    csa:\n      theta: %s\n      yarn: %s\n",
          G(c->rope_theta).s, G(c->compress_rope_theta).s, yarn ? "true" : "false");
  if (yarn)
    fprintf(f, "      yarn_factor: %s\n      yarn_original_len: %" PRId64 "\n      yarn_beta_fast: %s\n"
               "      yarn_beta_slow: %s\n      yarn_mscale: false\n",
            G(c->yarn_factor).s, c->yarn_original_len, G(c->beta_fast).s, G(c->beta_slow).s);
  fprintf(f, "  indexer:\n    heads: %" PRId64 "\n    head_dim: %" PRId64 "\n    rope_dim: %" PRId64
             "\n    rope_position: last\n    k_norm: true\n    topk: %" PRId64 "\n",
          c->idx_heads, c->idx_head_dim, c->rope_dim, c->idx_topk);
  fprintf(f, "  swa:\n    window: %" PRId64 "\n", c->window);
  if (c->cand_block > 0 && c->cand_top_blocks > 0)
    fprintf(f, "  candidates:\n    block: %" PRId64 "\n    top_blocks: %" PRId64 "\n", c->cand_block,
            c->cand_top_blocks);
  fprintf(f, "  moe:\n    routed_experts: %" PRId64 "\n    shared_experts: %" PRId64 "\n    active_experts: %" PRId64
             "\n    inter_dim: %" PRId64 "\n    shared_inter_dim: %" PRId64 "\n    score: %s\n    norm_topk: %s\n"
             "    route_scale: %s\n",
          c->n_routed, c->n_shared, c->n_active, c->moe_inter, c->moe_inter, score_name(c->score),
          c->norm_topk ? "true" : "false", G(c->route_scale).s);
  if (c->swiglu_limit > 0) fprintf(f, "    swiglu_limit: %s\n", G(c->swiglu_limit).s);
  fprintf(f, "  mhc:\n    streams: %" PRId64 "\n    sinkhorn_iters: %" PRId64 "\n    eps: %s\n    pairing: v41\n    merge: carried\n",
          c->hc, c->hc_iters, G(c->hc_eps).s);
  if (c->engram_layers.n) {
    fprintf(f, "  engram:\n    orders: [");
    for (int64_t k = 2; k <= c->engram_max_ngram; k++) fprintf(f, "%s%" PRId64, k > 2 ? ", " : "", k);
    fprintf(f, "]\n    heads: %" PRId64 "\n    head_dim: %" PRId64 "\n    table_base: %" PRId64
               "\n    compressed_vocab: %" PRId64 "\n    pad_id: %" PRId64 "\n",
            c->engram_heads, c->engram_head_dim, c->engram_vocab, c->engram_cvocab, c->engram_pad);
  }
  if (c->n_mtp > 0 && c->dspark_block > 0) {
    fprintf(f, "  dspark:\n    blocks: %" PRId64 "\n    window: %" PRId64 "\n    draft: %" PRId64 "\n", c->n_mtp,
            c->window, c->dspark_block);
    if (c->dspark_markov_rank) fprintf(f, "    markov_rank: %" PRId64 "\n", c->dspark_markov_rank);
    if (c->dspark_experts) fprintf(f, "    routed_experts: %" PRId64 "\n", c->dspark_experts);
    if (c->dspark_active) fprintf(f, "    active_experts: %" PRId64 "\n", c->dspark_active);
    if (c->dspark_noise >= 0) fprintf(f, "    noise_token: %" PRId64 "\n", c->dspark_noise);
    fprintf(f, "    target_layers: [");
    for (int i = 0; i < c->dspark_targets.n; i++) fprintf(f, "%s%" PRId64, i ? ", " : "", c->dspark_targets.v[i]);
    fprintf(f, "]\n");
  } else {
    fprintf(f, "  dspark: {blocks: 0, target_layers: []}\n");
  }
  if (c->vit_layers > 0) {
    fprintf(f, "  vision:\n    layers: %" PRId64 "\n    hidden: %" PRId64 "\n    heads: %" PRId64 "\n    patch: %" PRId64
               "\n    ffn: %" PRId64 "\n    unshuffle: %" PRId64 "\n    proj_hidden: %" PRId64
               "\n    max_tokens: %" PRId64 "\n",
            c->vit_layers, c->vit_hidden, c->vit_heads, c->vit_patch, c->vit_ffn, c->vit_unshuffle, c->hidden,
            c->vit_max_tokens);
    if (c->image_token >= 0) fprintf(f, "    image_token: %" PRId64 "\n", c->image_token);
  } else {
    fprintf(f, "  vision: {layers: 0}\n");
  }
  /* the vendor's cache formats (Appendix V #21): config.json does not carry them */
  fprintf(f, "\nformats:\n  main_kv: {element: e2m1, scale: e4m3, block: 16}\n"
             "  indexer_k: {element: e2m1, scale: e8m0, block: 32, scale_rule: ceil}\n"
             "  swa: {element: e4m3, scale: e8m0, block: 32}\n  nibble: low_first\n");
  fprintf(f, "\nlayers:\n");
  char cur[160], next[160];
  for (int l = 0; l < c->n_layers;) {
    layer_entry(c, l, dec, cur, sizeof cur);
    int e = l + 1;
    for (; e < c->n_layers; e++) {
      layer_entry(c, e, dec, next, sizeof next);
      if (strcmp(cur, next)) break;
    }
    if (e - 1 > l) fprintf(f, "  - {at: %d-%d, %s}\n", l, e - 1, cur);
    else fprintf(f, "  - {at: %d, %s}\n", l, cur);
    l = e;
  }
  fprintf(f, "\nserving:\n  ced: %s\n", dec < c->n_layers && dec > 0 ? "true" : "false");
  fclose(f);
  return 0;
}

int ckpt_config_plan(const struct ckpt_config *c, const char *name, struct plan *p, char *err, size_t err_len) {
  char *yaml;
  int rc = ckpt_config_plan_yaml(c, name, &yaml, err, err_len);
  if (rc) return rc;
  struct plan_diags d = {0};
  rc = plan_load_string(name, yaml, strlen(yaml), p, &d);
  if (rc) {
    snprintf(err, err_len, "config.json implies a plan cedar refuses: %s%s%s", d.n ? d.d[0].msg : "?",
             d.n && d.d[0].hint ? " (" : "", d.n && d.d[0].hint ? d.d[0].hint : "");
    if (d.n && d.d[0].hint) strncat(err, ")", err_len - strlen(err) - 1);
    rc = CEDAR_EINVAL;
  }
  plan_diags_free(&d);
  free(yaml);
  /* engram_num_embeddings must be the rows the primes give (the tables' shapes) */
  struct op_engram_tables et;
  if (!rc && c->engram_rows.n &&
      !op_engram_tables_init(&et, c->engram_layers.n, p->model.engram_n_orders, p->model.engram_heads,
                             p->model.engram_table_base)) {
    for (int i = 0; i < c->engram_rows.n && !rc; i++)
      if (et.rows[i] != c->engram_rows.v[i])
        rc = (snprintf(err, err_len, "engram_num_embeddings[%d] = %" PRId64 ", but engram_vocab_size %" PRId64
                       " with %d heads x %d orders gives %" PRId64 " rows", i, c->engram_rows.v[i], c->engram_vocab,
                       p->model.engram_heads, p->model.engram_n_orders, (int64_t)et.rows[i]), CEDAR_EINVAL);
    op_engram_tables_free(&et);
    if (rc) plan_free(p);
  }
  return rc;
}
