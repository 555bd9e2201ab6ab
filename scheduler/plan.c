/* plan.c: plan loading entry points, SPEC defaults and small accessors.
 *
 * Loading = plan_yaml.c (syntax, extends) -> plan_load.c + plan_layers.c
 * (keys, types) -> plan_check.c (rules, derived ownership). Every default
 * below is SPEC's value for V4.1-Flash, or Appendix V's (SPEC-V41.md) where
 * the vendor's model differs; the comment names its section and tag.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "scheduler/plan_internal.h"

void plan__defaults(struct plan *p) {
  struct plan_model *m = &p->model;
  m->n_layers = 40, m->hidden = 5120, m->vocab = 129280; /* SPEC 1.1, R.1 */
  m->norm_eps = 1e-20;                                   /* Appendix V #19 (SPEC 1.1 said 1e-6) */
  m->heads = 64, m->head_dim = 512, m->rope_dim = 64, m->q_rank = 1280;
  m->q_head_norm = false;                                /* Appendix V #6 (SPEC 3.5: V4 had it) */
  m->o_groups = 8, m->o_rank = 1024;                     /* SPEC 3.12 [R-cfg] */
  m->softmax_scale = 0;                                  /* 1/sqrt(head_dim) [R-cfg] */
  m->sink = true;
  m->rope_swa = op_rope_params_swa;                      /* SPEC 1.1 [R-cfg], ops/rope.h */
  m->rope_csa = op_rope_params_csa;
  m->idx_heads = 32, m->idx_head_dim = 128, m->idx_rope_dim = 64;
  m->idx_rope_last = true, m->idx_k_norm = true;         /* Appendix V #11 */
  m->idx_q_mxfp4 = true;                                 /* Appendix V #11 */
  m->idx_key_slot = PLAN_KEY_SLOT_VENDOR;                /* Appendix V #25 */
  m->topk = 512, m->window = 128;
  m->cand_block = 8, m->cand_top_blocks = 2048;
  m->cand_pin_newest = true;                             /* Appendix V #12 */
  m->num_act_bf16 = m->num_io_bf16 = true;               /* Appendix V #22 (sublayer_io: open, docs/model.md s7) */
  m->num_lin_mxfp8 = true;                               /* Appendix V #22 */
  m->n_routed = 384, m->n_shared = 1, m->n_active = 6;   /* SPEC 1.2 */
  m->moe_inter = 2304, m->shared_inter = 2304;
  m->moe_score = PLAN_SCORE_SQRTSOFTPLUS, m->moe_norm_topk = true;
  m->route_scale = 1.5, m->swiglu_limit = 10;
  m->hc_streams = 4, m->hc_sinkhorn_iters = 20, m->hc_eps = 1e-6; /* SPEC 1.3 */
  m->hc_pairing = PLAN_PAIRING_V41, m->hc_merge = PLAN_MERGE_CARRIED; /* Appendix V #1-#4 */
  m->engram_n_orders = 3;                                /* SPEC 1.4, 3.15 */
  m->engram_orders[0] = 2, m->engram_orders[1] = 3, m->engram_orders[2] = 4;
  m->engram_heads = 8, m->engram_head_dim = 256;
  m->engram_table_base = 16000000, m->engram_compressed_vocab = 99092, m->engram_pad_id = 2;
  m->engram_seed = 0;
  m->dspark_blocks = 3, m->dspark_window = 128, m->dspark_draft = 5; /* SPEC 1.5 */
  m->dspark_markov_rank = 256, m->dspark_experts = 128, m->dspark_active = 3;
  m->dspark_noise_token = 128799;
  m->dspark_n_targets = 3;
  m->dspark_targets[0] = 37, m->dspark_targets[1] = 38, m->dspark_targets[2] = 39;
  m->vit_layers = 32, m->vit_hidden = 1024, m->vit_heads = 16, m->vit_patch = 14; /* SPEC 1.6 */
  m->vit_ffn = 2816, m->vit_unshuffle = 3, m->vit_proj_hidden = 5120;
  m->vit_max_tokens = 1024, m->image_token = 129264;
  /* Appendix V #21: the vendor's V4.1 caches (rules and floors resolved by
   * plan checking from AUTO / -1; docs/formats.md s3). */
  m->main_kv = (struct plan_format){PLAN_E2M1, PLAN_SCALE_E4M3, 16, PLAN_RULE_AUTO, -1, true};   /* 288 B */
  m->indexer_k = (struct plan_format){PLAN_E2M1, PLAN_SCALE_E8M0, 32, PLAN_RULE_AUTO, -1, true}; /* 68 B */
  m->swa = (struct plan_format){PLAN_E4M3, PLAN_SCALE_E8M0, 32, PLAN_RULE_AUTO, -1, true};       /* 528 B */
  m->nibble_low_first = true;                                                        /* SPEC 4.1 [R] */

  struct plan_serving *s = &p->serving;
  s->ced = true;
  s->replay_encoder = s->replay_decoder = -1; /* = window unless set */
  s->prefill_chunk = 512;
  s->engram_prefetch = true; /* serving.engram.prefetch (docs/runtime.md, Engram tiers) */
  s->page_tokens = 64;                         /* even: SPEC 5.4 [R] */
  s->prefix_block_tokens = 256;
  s->gpu_cache_bytes = 0, s->host_cache_bytes = 0; /* 0 = no limit set */
  s->global_ttl_hours = 72;                    /* SPEC 5.3 [A] deployment policy */
  s->swa_pool_fraction = 0.10, s->swa_pool_ttl_s = 300; /* SPEC 5.2 [A]: ~10%, minutes */
  s->batch_max_requests = 8, s->batch_step_tokens = 0, s->batch_chunk = 0; /* 0: derived (plan_check.c) */
  s->prefill_rank = s->decode_rank = 0;
  s->prefill_device = s->decode_device = PLAN_DEV_CPU;
}

/* Diagnostics in file order: files in the order their first problem was
 * found (the plan named on the command line first), then by line and column,
 * keeping the order of equal places. An insertion sort: lists are short. */
static int file_rank(const struct plan_diags *d, const char *file) {
  for (size_t i = 0; i < d->n; i++)
    if (!strcmp(d->d[i].file ? d->d[i].file : "", file ? file : "")) return (int)i;
  return (int)d->n;
}

static void sort_diags(struct plan_diags *d) {
  int *rank = cedar_xcalloc(d->n + 1, sizeof *rank);
  for (size_t i = 0; i < d->n; i++) rank[i] = file_rank(d, d->d[i].file);
  for (size_t i = 1; i < d->n; i++) {
    struct plan_diag cur = d->d[i];
    int r = rank[i];
    size_t j = i;
    for (; j > 0; j--) {
      const struct plan_diag *prev = &d->d[j - 1];
      bool before = r != rank[j - 1] ? r < rank[j - 1]
                    : cur.mark.line != prev->mark.line ? cur.mark.line < prev->mark.line
                                                        : cur.mark.col < prev->mark.col;
      if (!before) break;
      d->d[j] = d->d[j - 1];
      rank[j] = rank[j - 1];
    }
    d->d[j] = cur;
    rank[j] = r;
  }
  free(rank);
}

static void ctx_init(struct plan_ctx *ctx, struct plan_diags *diags) {
  memset(ctx, 0, sizeof *ctx);
  ctx->diags = diags ? diags : &ctx->own;
}

/* Build the plan from a merged tree; on errors free what was built. */
static int finish(struct plan_ctx *ctx, struct pnode *root, struct plan *out) {
  memset(out, 0, sizeof *out);
  plan__defaults(out);
  ctx->root = root;
  if (root) {
    plan__from_tree(ctx, root, out);
    if (!ctx->n_errors) plan__check(ctx, out);
  }
  plan__node_free(root);
  out->strings = ctx->strings;
  out->n_strings = ctx->n_strings;
  int rc = ctx->n_errors || !root ? CEDAR_EINVAL : CEDAR_OK;
  LOG_DEBUG("plan: %s, %d layer(s), %d error(s)", rc ? "rejected" : "resolved", out->n_layers, ctx->n_errors);
  sort_diags(ctx->diags);
  if (rc) plan_free(out);
  plan_diags_free(&ctx->own);
  return rc;
}

int plan_load(const char *path, struct plan *out, struct plan_diags *diags) {
  struct plan_ctx ctx;
  ctx_init(&ctx, diags);
  struct pnode *root = plan__read_file(&ctx, path);
  int rc = finish(&ctx, root, out);
  if (!rc) {
    out->path = path ? out->strings[0] : NULL; /* the first file interned is `path` */
    if (!out->name) {
      const char *slash = strrchr(path, '/');
      out->name = cedar_xstrdup(slash ? slash + 1 : path);
    }
  }
  return rc;
}

int plan_load_string(const char *name, const char *text, size_t len, struct plan *out,
                     struct plan_diags *diags) {
  struct plan_ctx ctx;
  ctx_init(&ctx, diags);
  struct pnode *root = plan__read_string(&ctx, name, text, len);
  int rc = finish(&ctx, root, out);
  if (!rc) {
    out->path = out->strings[0];
    if (!out->name) out->name = cedar_xstrdup(name);
  }
  return rc;
}

void plan_free(struct plan *p) {
  if (!p) return;
  free(p->name);
  free(p->description);
  free(p->serving.engram_file);
  for (size_t i = 0; i < p->n_strings; i++) free(p->strings[i]);
  free(p->strings);
  memset(p, 0, sizeof *p);
}

const char *plan_elem_name(enum plan_elem e) {
  static const char *n[] = {"e2m1", "e4m3", "bf16", "f32"};
  return e <= PLAN_F32 ? n[e] : "?";
}

const char *plan_scale_name(enum plan_scale s) {
  static const char *n[] = {"none", "e4m3", "e8m0", "f32"};
  return s <= PLAN_SCALE_F32 ? n[s] : "?";
}

int plan_count_region(const struct plan *p, enum plan_region r) {
  int n = 0;
  for (int i = 0; i < p->n_layers; i++) n += p->layer[i].region == r;
  return n;
}

double plan_softmax_scale(const struct plan *p) {
  return p->model.softmax_scale > 0 ? p->model.softmax_scale : 1.0 / sqrt((double)p->model.head_dim);
}

int64_t plan_max_positions(const struct plan *p) {
  const struct op_rope_params *r = &p->model.rope_csa;
  double n = r->yarn ? r->yarn_factor * (double)r->yarn_original_len : (double)r->yarn_original_len;
  return n >= 1 && n < 9e15 ? (int64_t)n : 1;
}

int plan_hit_check(const struct plan *p, int64_t hit, bool snapshot, char *err, size_t err_len) {
  if (snapshot) return 0;
  int64_t lcm = 1;
  int bad = -1;
  for (int l = 0; l < p->n_layers; l++) {
    int r = p->layer[l].ratio;
    if (!plan_is_kv_source(&p->layer[l]) || r < 1) continue;
    if (bad < 0 && hit % r) bad = l;
    int64_t a = lcm, b = r;
    while (b) { int64_t t = a % b; a = b; b = t; }
    lcm = lcm / a * r;
  }
  if (bad < 0) return 0;
  snprintf(err, err_len, "a prefix hit of %lld tokens ends inside a ratio-%d group of layer %d: without the "
           "encoder-SWA snapshot at the hit (path b) a hit is a multiple of every source's ratio (give --hit %lld, "
           "or --swa-hit for path a, whose snapshot carries the group's tail)",
           (long long)hit, p->layer[bad].ratio, bad, (long long)(hit - hit % lcm));
  return CEDAR_EINVAL;
}
