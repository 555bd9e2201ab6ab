/* ckpt_plan_compare.c: plan -> config (ckpt_config_from_plan,
 * ckpt_config_json: what `cedar weights init --layout released` writes),
 * and the comparison of a plan with the plan a checkpoint implies
 * (ckpt_plan_compare: `--model DIR --plan P`). See ckpt_config.h.
 */
#include <cJSON.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "ops/engram.h"
#include "runtime/load/ckpt_config.h"

/* ---- plan -> config ----------------------------------------------------------- */

static const char *const score_names[] = {"sqrtsoftplus", "softmax", "sigmoid"};

int ckpt_config_from_plan(const struct plan *p, struct ckpt_config *c, char *err, size_t len) {
  const struct plan_model *m = &p->model;
  memset(c, 0, sizeof *c);
  *c = (struct ckpt_config){
      .vocab = m->vocab, .hidden = m->hidden, .n_layers = p->n_layers, .heads = m->heads,
      .head_dim = m->head_dim, .rope_dim = m->rope_dim, .q_rank = m->q_rank, .o_rank = m->o_rank,
      .o_groups = m->o_groups, .norm_eps = m->norm_eps, .swiglu_limit = m->swiglu_limit,
      .rope_theta = m->rope_swa.theta, .compress_rope_theta = m->rope_csa.theta,
      .yarn_factor = m->rope_csa.yarn ? m->rope_csa.yarn_factor : 1, .beta_fast = m->rope_csa.yarn_beta_fast,
      .beta_slow = m->rope_csa.yarn_beta_slow, .yarn_original_len = m->rope_csa.yarn_original_len,
      .n_routed = m->n_routed, .n_shared = m->n_shared, .n_active = m->n_active, .moe_inter = m->moe_inter,
      .norm_topk = m->moe_norm_topk, .route_scale = m->route_scale, .window = m->window,
      .idx_heads = m->idx_heads, .idx_head_dim = m->idx_head_dim, .idx_topk = m->topk, .cand_source = -1,
      .hc = m->hc_streams, .hc_iters = m->hc_sinkhorn_iters, .hc_eps = m->hc_eps,
      .image_token = m->image_token, .dspark_noise = -1};
  snprintf(c->score, sizeof c->score, "%s", score_names[m->moe_score]);
  if (m->n_shared && m->shared_inter != m->moe_inter)
    return snprintf(err, len, "plan '%s': shared_inter_dim %d differs from inter_dim %d; config.json has one "
                    "moe_intermediate_size", p->name, m->shared_inter, m->moe_inter), CEDAR_EINVAL;
  if (m->idx_rope_dim != m->rope_dim || !m->idx_rope_last)
    return snprintf(err, len, "plan '%s': the indexer's RoPE dims (%d, %s) are not the attention's last %d; "
                    "config.json has one qk_rope_head_dim", p->name, m->idx_rope_dim,
                    m->idx_rope_last ? "last" : "first", m->rope_dim), CEDAR_EINVAL;
  for (int l = 0; l < p->n_layers; l++) {
    const struct plan_layer *L = &p->layer[l];
    c->ratios.v[c->ratios.n++] = L->mode == PLAN_SWA_ONLY ? 0 : L->ratio;
    if (L->mode == PLAN_FULL) c->kv_sources.v[c->kv_sources.n++] = l;
    if (plan_is_index_source(L)) c->index_sources.v[c->index_sources.n++] = l;
    if (L->engram) c->engram_layers.v[c->engram_layers.n++] = l;
    if (L->cand == PLAN_CAND_BUILD) {
      if (c->cand_source >= 0)
        return snprintf(err, len, "plan '%s': layers %" PRId64 " and %d both build candidate pools; config.json "
                        "names one candidate_source_layer_id", p->name, c->cand_source, l), CEDAR_EINVAL;
      c->cand_source = l;
      c->cand_top_blocks = m->cand_top_blocks;
      c->cand_block = m->cand_block;
    }
  }
  if (c->engram_layers.n) {
    for (int k = 0; k < m->engram_n_orders; k++)
      if (m->engram_orders[k] != k + 2)
        return snprintf(err, len, "plan '%s': Engram orders must be 2..N for config.json's engram_max_ngram_size",
                        p->name), CEDAR_EINVAL;
    c->engram_max_ngram = m->engram_n_orders + 1;
    c->engram_vocab = m->engram_table_base;
    c->engram_heads = m->engram_heads;
    c->engram_head_dim = m->engram_head_dim;
    c->engram_pad = m->engram_pad_id;
    c->engram_cvocab = m->engram_compressed_vocab;
    struct op_engram_tables et;
    if (op_engram_tables_init(&et, c->engram_layers.n, m->engram_n_orders, m->engram_heads, m->engram_table_base))
      return snprintf(err, len, "plan '%s': Engram tables overflow", p->name), CEDAR_EINVAL;
    for (int i = 0; i < c->engram_layers.n; i++) c->engram_rows.v[c->engram_rows.n++] = et.rows[i];
    op_engram_tables_free(&et);
  }
  if (m->dspark_blocks > 0) {
    c->n_mtp = m->dspark_blocks;
    c->dspark_block = m->dspark_draft;
    c->dspark_noise = m->dspark_noise_token;
    c->dspark_markov_rank = m->dspark_markov_rank;
    c->dspark_experts = m->dspark_experts;
    c->dspark_active = m->dspark_active;
    for (int i = 0; i < m->dspark_n_targets; i++) c->dspark_targets.v[c->dspark_targets.n++] = m->dspark_targets[i];
    for (int i = 0; i < m->dspark_blocks; i++) c->ratios.v[c->ratios.n++] = 0; /* MTP blocks: window only */
  }
  if (m->vit_layers > 0) {
    c->vit_layers = m->vit_layers, c->vit_hidden = m->vit_hidden, c->vit_heads = m->vit_heads;
    c->vit_ffn = m->vit_ffn, c->vit_patch = m->vit_patch, c->vit_unshuffle = m->vit_unshuffle;
    c->vit_max_tokens = m->vit_max_tokens;
  }
  return 0;
}

static void add_list(cJSON *o, const char *k, const struct ckpt_list *l) {
  cJSON *a = cJSON_AddArrayToObject(o, k);
  for (int i = 0; i < l->n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)l->v[i]));
}

int ckpt_config_json(const struct ckpt_config *c, char **json) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "model_type", "deepseek_v41");
  cJSON_AddNumberToObject(root, "pad_token_id", 2);
  if (c->image_token >= 0) cJSON_AddNumberToObject(root, "image_token_id", (double)c->image_token);
  cJSON *t = cJSON_AddObjectToObject(root, "text_config");
#define NUM(k, v) cJSON_AddNumberToObject(t, k, (double)(v))
  NUM("vocab_size", c->vocab);
  NUM("hidden_size", c->hidden);
  NUM("num_hidden_layers", c->n_layers);
  NUM("num_attention_heads", c->heads);
  NUM("num_key_value_heads", 1);
  NUM("head_dim", c->head_dim);
  NUM("qk_rope_head_dim", c->rope_dim);
  NUM("q_lora_rank", c->q_rank);
  NUM("o_lora_rank", c->o_rank);
  NUM("o_groups", c->o_groups);
  cJSON_AddStringToObject(t, "hidden_act", "silu");
  NUM("swiglu_limit", c->swiglu_limit);
  NUM("rms_norm_eps", c->norm_eps);
  cJSON_AddBoolToObject(t, "tie_word_embeddings", false);
  NUM("rope_theta", c->rope_theta);
  if (c->yarn_factor > 1) {
    cJSON *rs = cJSON_AddObjectToObject(t, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", "yarn");
    cJSON_AddNumberToObject(rs, "factor", c->yarn_factor);
    cJSON_AddNumberToObject(rs, "beta_fast", c->beta_fast);
    cJSON_AddNumberToObject(rs, "beta_slow", c->beta_slow);
    cJSON_AddNumberToObject(rs, "original_max_position_embeddings", (double)c->yarn_original_len);
  }
  NUM("compress_rope_theta", c->compress_rope_theta);
  NUM("n_routed_experts", c->n_routed);
  NUM("n_shared_experts", c->n_shared);
  NUM("num_experts_per_tok", c->n_active);
  NUM("moe_intermediate_size", c->moe_inter);
  cJSON_AddStringToObject(t, "scoring_func", c->score);
  cJSON_AddStringToObject(t, "topk_method", "noaux_tc");
  cJSON_AddBoolToObject(t, "norm_topk_prob", c->norm_topk);
  NUM("routed_scaling_factor", c->route_scale);
  NUM("sliding_window", c->window);
  add_list(t, "compress_ratios", &c->ratios);
  add_list(t, "kv_source_layer_ids", &c->kv_sources);
  add_list(t, "index_source_layer_ids", &c->index_sources);
  NUM("index_n_heads", c->idx_heads);
  NUM("index_head_dim", c->idx_head_dim);
  NUM("index_topk", c->idx_topk);
  if (c->cand_source >= 0) {
    NUM("candidate_source_layer_id", c->cand_source);
    NUM("candidate_topk_blocks", c->cand_top_blocks);
    NUM("candidate_block_size", c->cand_block);
  }
  NUM("hc_mult", c->hc);
  NUM("hc_sinkhorn_iters", c->hc_iters);
  NUM("hc_eps", c->hc_eps);
  if (c->engram_layers.n) {
    add_list(t, "engram_layer_ids", &c->engram_layers);
    add_list(t, "engram_num_embeddings", &c->engram_rows);
    NUM("engram_max_ngram_size", c->engram_max_ngram);
    NUM("engram_vocab_size", c->engram_vocab);
    NUM("engram_n_heads", c->engram_heads);
    NUM("engram_head_dim", c->engram_head_dim);
    NUM("engram_pad_token_id", c->engram_pad);
    NUM("engram_compressed_vocab_size", c->engram_cvocab);
  }
  if (c->n_mtp) {
    NUM("num_nextn_predict_layers", c->n_mtp);
    NUM("dspark_block_size", c->dspark_block);
    NUM("dspark_noise_token_id", c->dspark_noise);
    add_list(t, "dspark_target_layer_ids", &c->dspark_targets);
    NUM("dspark_markov_rank", c->dspark_markov_rank);
    NUM("dspark_n_routed_experts", c->dspark_experts);
    NUM("dspark_num_experts_per_tok", c->dspark_active);
  }
#undef NUM
  if (c->vit_layers) {
    cJSON *v = cJSON_AddObjectToObject(root, "vision_config");
    cJSON_AddNumberToObject(v, "num_hidden_layers", (double)c->vit_layers);
    cJSON_AddNumberToObject(v, "hidden_size", (double)c->vit_hidden);
    cJSON_AddNumberToObject(v, "num_attention_heads", (double)c->vit_heads);
    cJSON_AddNumberToObject(v, "intermediate_size", (double)c->vit_ffn);
    cJSON_AddNumberToObject(v, "patch_size", (double)c->vit_patch);
    cJSON_AddNumberToObject(v, "downsample_ratio", (double)c->vit_unshuffle);
    cJSON_AddNumberToObject(v, "max_image_tokens", (double)c->vit_max_tokens);
  }
  cJSON *q = cJSON_AddObjectToObject(root, "quantization_config");
  cJSON_AddStringToObject(q, "quant_method", "fp8");
  cJSON *bs = cJSON_AddArrayToObject(q, "weight_block_size");
  cJSON_AddItemToArray(bs, cJSON_CreateNumber(32));
  cJSON_AddItemToArray(bs, cJSON_CreateNumber(32));
  cJSON_AddStringToObject(q, "scale_fmt", "ue8m0");
  cJSON_AddStringToObject(q, "expert_dtype", "fp4");
  *json = cJSON_Print(root);
  cJSON_Delete(root);
  return *json ? 0 : CEDAR_ENOMEM;
}

/* ---- plan vs checkpoint --------------------------------------------------------- */

struct msgs {
  char **v;
  size_t n, cap;
};

static void say(struct msgs *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct msgs *m, const char *fmt, ...) {
  char buf[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (m->n == m->cap) m->v = cedar_xrealloc(m->v, (m->cap = m->cap ? 2 * m->cap : 16) * sizeof *m->v);
  m->v[m->n++] = cedar_xstrdup(buf);
}

/* The model fields a checkpoint determines, by plan key. */
enum vt { V_INT, V_I64, V_DBL, V_BOOL };
struct mfield {
  const char *key;
  size_t off;
  enum vt t;
};
#define MI(k, m) {k, offsetof(struct plan_model, m), V_INT}
#define MD(k, m) {k, offsetof(struct plan_model, m), V_DBL}
#define MB(k, m) {k, offsetof(struct plan_model, m), V_BOOL}
static const struct mfield model_fields[] = {
    MI("model.hidden", hidden), MI("model.vocab", vocab), MD("model.norm_eps", norm_eps),
    MI("model.attention.heads", heads), MI("model.attention.head_dim", head_dim),
    MI("model.attention.rope_dim", rope_dim), MI("model.attention.q_rank", q_rank),
    MB("model.attention.q_head_norm", q_head_norm), MI("model.attention.o_groups", o_groups),
    MI("model.attention.o_rank", o_rank), MB("model.attention.sink", sink),
    MD("model.rope.swa.theta", rope_swa.theta), MD("model.rope.csa.theta", rope_csa.theta),
    MB("model.rope.csa.yarn", rope_csa.yarn), MD("model.rope.csa.yarn_factor", rope_csa.yarn_factor),
    {"model.rope.csa.yarn_original_len", offsetof(struct plan_model, rope_csa.yarn_original_len), V_I64},
    MD("model.rope.csa.yarn_beta_fast", rope_csa.yarn_beta_fast),
    MD("model.rope.csa.yarn_beta_slow", rope_csa.yarn_beta_slow),
    MI("model.indexer.heads", idx_heads), MI("model.indexer.head_dim", idx_head_dim),
    MI("model.indexer.rope_dim", idx_rope_dim), MB("model.indexer.k_norm", idx_k_norm),
    MI("model.indexer.topk", topk), MI("model.swa.window", window), MI("model.candidates.block", cand_block),
    MI("model.candidates.top_blocks", cand_top_blocks), MI("model.moe.routed_experts", n_routed),
    MI("model.moe.shared_experts", n_shared), MI("model.moe.active_experts", n_active),
    MI("model.moe.inter_dim", moe_inter), MI("model.moe.shared_inter_dim", shared_inter),
    MB("model.moe.norm_topk", moe_norm_topk), MD("model.moe.route_scale", route_scale),
    MD("model.moe.swiglu_limit", swiglu_limit), MI("model.mhc.streams", hc_streams),
    MI("model.mhc.sinkhorn_iters", hc_sinkhorn_iters), MD("model.mhc.eps", hc_eps),
    MI("model.engram.heads", engram_heads), MI("model.engram.head_dim", engram_head_dim),
    {"model.engram.table_base", offsetof(struct plan_model, engram_table_base), V_I64},
    MI("model.engram.compressed_vocab", engram_compressed_vocab), MI("model.engram.pad_id", engram_pad_id),
    MI("model.engram.n_orders", engram_n_orders),
};

static bool any_engram(const struct plan *p) {
  for (int l = 0; l < p->n_layers; l++)
    if (p->layer[l].engram) return true;
  return false;
}

static const char *src(char b[16], int l) {
  if (l < 0) return "none";
  snprintf(b, 16, "L%d", l);
  return b;
}

size_t ckpt_plan_compare(const struct plan *a, const struct plan *b, char ***out) {
  struct msgs m = {0};
  bool engram = any_engram(a) || any_engram(b);
  for (size_t i = 0; i < sizeof model_fields / sizeof model_fields[0]; i++) {
    const struct mfield *f = &model_fields[i];
    if (!engram && !strncmp(f->key, "model.engram.", 13)) continue;
    const char *pa = (const char *)&a->model + f->off, *pb = (const char *)&b->model + f->off;
    switch (f->t) {
      case V_INT:
        if (*(const int *)pa != *(const int *)pb)
          say(&m, "%s: plan %d, checkpoint %d", f->key, *(const int *)pa, *(const int *)pb);
        break;
      case V_I64:
        if (*(const int64_t *)pa != *(const int64_t *)pb)
          say(&m, "%s: plan %" PRId64 ", checkpoint %" PRId64, f->key, *(const int64_t *)pa, *(const int64_t *)pb);
        break;
      case V_DBL:
        if (*(const double *)pa != *(const double *)pb)
          say(&m, "%s: plan %.9g, checkpoint %.9g", f->key, *(const double *)pa, *(const double *)pb);
        break;
      case V_BOOL:
        if (*(const bool *)pa != *(const bool *)pb)
          say(&m, "%s: plan %s, checkpoint %s", f->key, *(const bool *)pa ? "true" : "false",
              *(const bool *)pb ? "true" : "false");
        break;
    }
  }
  static const char *const pairing_names[] = {"v41", "v4"}, *const merge_names[] = {"carried", "learned", "sum"};
  if (a->model.hc_pairing != b->model.hc_pairing)
    say(&m, "model.mhc.pairing: plan %s, checkpoint %s", pairing_names[a->model.hc_pairing],
        pairing_names[b->model.hc_pairing]);
  if (a->model.hc_merge != b->model.hc_merge)
    say(&m, "model.mhc.merge: plan %s, checkpoint %s (head.hc.* tensors only with learned)", merge_names[a->model.hc_merge],
        merge_names[b->model.hc_merge]);
  if (a->model.moe_score != b->model.moe_score)
    say(&m, "model.moe.score: plan %s, checkpoint %s", score_names[a->model.moe_score], score_names[b->model.moe_score]);
  if (a->n_layers != b->n_layers) say(&m, "model.n_layers: plan %d, checkpoint %d", a->n_layers, b->n_layers);
  for (int l = 0; l < a->n_layers && l < b->n_layers; l++) {
    const struct plan_layer *x = &a->layer[l], *y = &b->layer[l];
    if (x->mode != y->mode) say(&m, "layer %d mode: plan %s, checkpoint %s", l, plan_mode_name(x->mode), plan_mode_name(y->mode));
    else if (plan_is_csa(x) && x->ratio != y->ratio) say(&m, "layer %d ratio: plan %d, checkpoint %d", l, x->ratio, y->ratio);
    char sa[16], sb[16];
    if (x->kv_src != y->kv_src)
      say(&m, "layer %d kv source: plan %s, checkpoint %s", l, src(sa, x->kv_src), src(sb, y->kv_src));
    if (x->topk_src != y->topk_src)
      say(&m, "layer %d Top-K source: plan %s, checkpoint %s", l, src(sa, x->topk_src), src(sb, y->topk_src));
    if (x->cand != y->cand)
      say(&m, "layer %d candidates: plan %s, checkpoint %s", l, plan_cand_name(x->cand), plan_cand_name(y->cand));
    if (x->engram != y->engram)
      say(&m, "layer %d engram: plan %s, checkpoint %s", l, x->engram ? "true" : "false", y->engram ? "true" : "false");
  }
  *out = m.v;
  return m.n;
}

void ckpt_msgs_free(char **msgs, size_t n) {
  for (size_t i = 0; i < n; i++) free(msgs[i]);
  free(msgs);
}
