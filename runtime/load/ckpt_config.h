/* ckpt_config.h: a released checkpoint's config.json, and the execution plan
 * it implies (`cedar plan import`), and back (the config a plan writes, for
 * `cedar weights init --layout released`).
 *
 * Reading: the fields of Appendix V's `text_config` in their official
 * spellings, found under "text_config" when the file has it (the release's
 * nesting), else at the top level (a flat config); colibri's short names
 * (`dim`, `n_layers`, `norm_eps`, `window_size`, ...) are accepted as
 * aliases, and a file that gives both spellings with different values is
 * refused. The table of names is in ckpt_config.c (one row per field).
 * `image_token_id` and `vision_config` are read from the top level.
 *
 * The plan: layers, modes and ownership from `compress_ratios`,
 * `kv_source_layer_ids`, `index_source_layer_ids` and
 * `candidate_source_layer_id`, every width, and the vendor's semantics
 * where the plan language has a key for them (docs/checkpoints.md lists the
 * rules). What config.json cannot say (cache formats, serving) is left at
 * the plan language's defaults.
 *
 * Not here: tensors (runtime/load/checkpoint.h), the plan loader (scheduler/).
 * Test: tests/test_checkpoint.c, tests/cli/checkpoint.sh.
 */
#ifndef CEDAR_RUNTIME_CKPT_CONFIG_H
#define CEDAR_RUNTIME_CKPT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler/plan.h"

#define CKPT_MAX_LIST (PLAN_MAX_LAYERS + 8)

struct ckpt_list {
  int n;
  int64_t v[CKPT_MAX_LIST];
};

/* The text model's fields (official names in ckpt_config.c's table). */
struct ckpt_config {
  int64_t vocab, hidden, n_layers, heads, head_dim, rope_dim, q_rank, o_rank, o_groups;
  double norm_eps, swiglu_limit, rope_theta, compress_rope_theta;
  double yarn_factor, beta_fast, beta_slow;
  int64_t yarn_original_len;
  int64_t n_routed, n_shared, n_active, moe_inter;
  char score[32];
  bool norm_topk;
  double route_scale;
  int64_t window;
  struct ckpt_list ratios, kv_sources, index_sources;
  int64_t idx_heads, idx_head_dim, idx_topk;
  int64_t cand_source, cand_top_blocks, cand_block; /* cand_source -1: none */
  int64_t hc, hc_iters;
  double hc_eps;
  struct ckpt_list engram_layers, engram_rows;
  int64_t engram_max_ngram, engram_vocab, engram_heads, engram_head_dim, engram_pad, engram_cvocab;
  int64_t n_mtp, dspark_block, dspark_noise, dspark_markov_rank, dspark_experts, dspark_active;
  struct ckpt_list dspark_targets;
  int64_t image_token;
  /* vision_config (0 layers: none) */
  int64_t vit_layers, vit_hidden, vit_heads, vit_ffn, vit_patch, vit_unshuffle, vit_max_tokens;
};

/* Read path (a config.json). Returns 0, or CEDAR_EIO / CEDAR_EFORMAT /
 * CEDAR_EINVAL with a message naming the file and the field. */
int ckpt_config_read(const char *path, struct ckpt_config *c, char *err, size_t err_len);
/* The same from text held in memory; `label` names it in messages. */
int ckpt_config_parse(const char *label, const char *text, size_t len, struct ckpt_config *c, char *err,
                      size_t err_len);

/* The plan YAML the config implies, named `name` (malloc'd into *yaml).
 * Returns 0, or CEDAR_EINVAL when the config names layers the plan
 * language cannot express (a message says which). */
int ckpt_config_plan_yaml(const struct ckpt_config *c, const char *name, char **yaml, char *err, size_t err_len);
/* ckpt_config_plan_yaml, then plan_load_string: the resolved plan. A plan
 * the loader refuses comes back as CEDAR_EINVAL with its first diagnostic. */
int ckpt_config_plan(const struct ckpt_config *c, const char *name, struct plan *p, char *err, size_t err_len);

/* The config a plan implies (the inverse of the above). CEDAR_EINVAL when
 * the plan has what config.json cannot carry (two candidate-pool builders,
 * n-gram orders that are not 2..N, explicit sources off the derived rule). */
int ckpt_config_from_plan(const struct plan *p, struct ckpt_config *c, char *err, size_t err_len);
/* config.json text in the release's shape: top-level model_type
 * deepseek_v41, text_config with the official spellings, vision_config,
 * quantization_config (malloc'd into *json). */
int ckpt_config_json(const struct ckpt_config *c, char **json);

/* Every difference between a plan and the plan a checkpoint implies, one
 * line each into *msgs (malloc'd array of malloc'd strings; the caller
 * frees them with ckpt_msgs_free). Returns the count. Cache formats and
 * serving settings are not compared (a checkpoint says nothing of them). */
size_t ckpt_plan_compare(const struct plan *plan, const struct plan *ckpt, char ***msgs);
void ckpt_msgs_free(char **msgs, size_t n);

#endif
