/* plan_check.c: pass three of plan loading. Semantic rules over the typed
 * plan, and the derived ownership SPEC 2.1 defines:
 *
 *   kv_src(l)   = latest full layer at or before l in l's region
 *   topk_src(l) = l for full/reindex layers, else the latest index source
 *                 before l in its region (reading the same KV source)
 *   pool_src(l) = the latest candidate-pool builder before l in its region
 *
 * An explicit `kv:`, `topk:` or `pool:` in the plan is checked against the
 * same rules instead of derived. Each rule has a failing plan in
 * tests/plans/bad/ and a case in tests/test_plan_rules.c.
 */
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "scheduler/plan_internal.h"

#define ERR(ctx, mark, hint, ...) plan__error(ctx, mark, hint, __VA_ARGS__)

/* Where a rule a layer breaks is blamed: the value's own mark, unless a
 * `layer_overrides` entry changed the layer after that value was set (the
 * override made the combination, e.g. `mode: swa_only` over an inherited
 * `ratio: 2`): then the override (issue 18 row 12). */
static struct plan_mark lmark(const struct plan_layer *l, struct plan_mark m) {
  const struct plan_mark *o = &l->mark_override;
  if (!o->file) return m;
  bool inside = m.file && !strcmp(m.file, o->file) && (m.line > o->line || (m.line == o->line && m.col >= o->col));
  return inside ? m : *o;
}

static const char *rname(const struct plan_layer *l) { return plan_region_name(l->region); }

/* Where a dotted key ("model.attention.rope_dim") was set; if it was not,
 * where its closest enclosing section was, or the top of the plan file. */
static struct plan_mark mark_of(struct plan_ctx *ctx, const char *path) {
  const struct pnode *n = ctx->root, *v;
  struct plan_mark m = {ctx->strings[0], 1, 1};
  char key[64];
  while (n && *path) {
    size_t len = strcspn(path, ".");
    if (len >= sizeof key) break;
    memcpy(key, path, len);
    key[len] = 0;
    path += len + (path[len] == '.');
    v = plan__map_get(n, key);
    if (!v) break;
    m = v->mark;
    n = v;
  }
  return m;
}

static void check_widths(struct plan_ctx *ctx, struct plan *p) {
  struct plan_model *m = &p->model;
  struct plan_mark at;
  at = mark_of(ctx, "model.attention.rope_dim");
  if (m->rope_dim > m->head_dim || m->rope_dim % 2)
    ERR(ctx, at, "rope pairs adjacent channels: use an even rope_dim <= head_dim",
        "model.attention.rope_dim = %d does not fit head_dim %d", m->rope_dim, m->head_dim);
  at = mark_of(ctx, "model.indexer.rope_dim");
  if (m->idx_rope_dim > m->idx_head_dim || m->idx_rope_dim % 2)
    ERR(ctx, at, "use an even indexer.rope_dim <= indexer.head_dim",
        "model.indexer.rope_dim = %d does not fit indexer head_dim %d", m->idx_rope_dim, m->idx_head_dim);
  at = mark_of(ctx, "model.attention.o_groups");
  if (m->heads % m->o_groups)
    ERR(ctx, at, "choose o_groups dividing heads", "model.attention.heads = %d is not a multiple of o_groups = %d",
        m->heads, m->o_groups);
  at = mark_of(ctx, "model.moe.active_experts");
  if (m->n_active > m->n_routed)
    ERR(ctx, at, "active_experts must be <= routed_experts", "model.moe.active_experts = %d > routed_experts = %d",
        m->n_active, m->n_routed);
  at = mark_of(ctx, "model.dspark.active_experts");
  if (m->dspark_active > m->dspark_experts)
    ERR(ctx, at, "active_experts must be <= routed_experts",
        "model.dspark.active_experts = %d > routed_experts = %d", m->dspark_active, m->dspark_experts);
  at = mark_of(ctx, "model.dspark.target_layers");
  for (int i = 0; i < m->dspark_n_targets; i++)
    if (m->dspark_targets[i] >= m->n_layers)
      ERR(ctx, at, "target layers must be model layers", "model.dspark.target_layers has %d, but the model has %d layers",
          m->dspark_targets[i], m->n_layers);
  bool engram = false;
  for (int i = 0; i < p->n_layers; i++) engram |= p->layer[i].engram;
  at = mark_of(ctx, "model.engram.head_dim");
  if (engram && m->engram_head_dim % 32)
    ERR(ctx, at, "use a multiple of 32: Engram rows carry one E8M0 scale per 32 values (SPEC 3.15)",
        "model.engram.head_dim = %d cannot be stored as Engram rows", m->engram_head_dim);
  at = mark_of(ctx, "model.engram.orders");
  for (int i = 1; i < m->engram_n_orders; i++)
    if (m->engram_orders[i] <= m->engram_orders[i - 1])
      ERR(ctx, at, "list n-gram orders in increasing order without repeats", "model.engram.orders is not increasing");
  at = mark_of(ctx, "model.engram.pad_id");
  if (engram && m->engram_pad_id >= m->vocab)
    ERR(ctx, at, "pad_id is engram_pad_token_id, a token id below model.vocab (the vendor's is 2)",
        "model.engram.pad_id = %d is not a token id (vocab %d)", m->engram_pad_id, m->vocab);
}

/* A storage format must be one the runtime stores (op_kv_check): AUTO
 * rules and unset floors become the vendor's (Appendix V #21, docs/formats.md
 * s3), then every refusal names the key to change. */
static void check_format(struct plan_ctx *ctx, const char *name, struct plan_format *f, int width) {
  char path[64];
  const int errors = ctx->n_errors;
  snprintf(path, sizeof path, "formats.%s.scale_rule", name);
  struct plan_mark at = mark_of(ctx, path);
  if (f->rule == PLAN_RULE_AUTO && f->scale == PLAN_SCALE_E4M3) f->rule = PLAN_RULE_RNE;
  if (f->rule == PLAN_RULE_AUTO && f->scale == PLAN_SCALE_E8M0) f->rule = PLAN_RULE_CEIL;
  const bool e4m3_rule = f->rule == PLAN_RULE_RNE || f->rule == PLAN_RULE_ROUNDUP;
  const bool e8m0_rule = f->rule == PLAN_RULE_CEIL || f->rule == PLAN_RULE_OCP;
  if (f->scale == PLAN_SCALE_E4M3 && !e4m3_rule)
    ERR(ctx, at, "set `scale_rule: rne` (vendor) or `roundup` (SPEC 4.2), or leave it out",
        "formats.%s: an e4m3 scale is not chosen by the %s rule", name, e8m0_rule ? "e8m0" : "given");
  if (f->scale == PLAN_SCALE_E8M0 && !e8m0_rule)
    ERR(ctx, at, "set `scale_rule: ceil` (vendor) or `ocp`, or leave it out",
        "formats.%s: an e8m0 scale is not chosen by the %s rule", name, e4m3_rule ? "e4m3" : "given");
  if ((f->scale == PLAN_SCALE_F32 || f->scale == PLAN_SCALE_NONE) && f->rule != PLAN_RULE_AUTO)
    ERR(ctx, at, "remove `scale_rule` (or set `scale_rule: auto`)",
        "formats.%s: scale %s has no scale rule to choose", name, plan_scale_name(f->scale));
  snprintf(path, sizeof path, "formats.%s.scale_floor", name);
  at = mark_of(ctx, path);
  if (f->floor >= 0 && f->rule != PLAN_RULE_RNE && f->rule != PLAN_RULE_CEIL)
    ERR(ctx, at, "remove `scale_floor`: only the rne (e4m3) and ceil (e8m0) scale rules have a floor",
        "formats.%s: scale_floor set for a scale without a floor", name);
  if (f->floor < 0) /* the vendor's: 2^-9 (FP4 Main KV), 2^-126 (MXFP4 keys), 1e-4 (vLLM's FP8 SWA) */
    f->floor = f->rule == PLAN_RULE_RNE                             ? 0x1p-9
               : f->rule == PLAN_RULE_CEIL && f->elem == PLAN_E2M1 ? 0x1p-126
               : f->rule == PLAN_RULE_CEIL                          ? 1e-4
                                                                    : 0;
  snprintf(path, sizeof path, "formats.%s.block", name);
  at = mark_of(ctx, path);
  if (f->scale != PLAN_SCALE_NONE && (f->block <= 0 || width % f->block))
    ERR(ctx, at, "choose a block size that divides the vector width",
        "formats.%s.block = %d does not divide the %d-wide vectors it stores", name, f->block, width);
  if (ctx->n_errors > errors) return;
  struct plan_model m = {.nibble_low_first = true};
  struct op_kv_format of = plan_kv_format(&m, f);
  const char *why = op_kv_check(&of, width);
  if (!why) return;
  snprintf(path, sizeof path, "formats.%s.scale", name); /* element and scale disagree: blame the scale */
  at = mark_of(ctx, path);
  char hint[160];
  snprintf(hint, sizeof hint, "change formats.%s: %s", name, why);
  ERR(ctx, at, hint, "formats.%s {element: %s, scale: %s, block: %d} cannot store %d-wide vectors", name,
      plan_elem_name(f->elem), plan_scale_name(f->scale), f->block, width);
}

/* The node at a.b.c of the merged plan, or NULL. */
static const struct pnode *node_at(struct plan_ctx *ctx, const char *a, const char *b, const char *c) {
  const struct pnode *n = ctx->root ? plan__map_get(ctx->root, a) : NULL;
  n = n ? plan__map_get(n, b) : NULL;
  return n ? plan__map_get(n, c) : NULL;
}

/* A replay length written in one file and a window changed in another (an
 * extending plan): the replay no longer follows the window, which is seldom
 * meant (issue 18 row 15), so say so on stderr. Values set side by side in
 * one file are taken as meant (the oracle's plans replay past the window). */
static void warn_replay(struct plan_ctx *ctx, const struct plan *p, const char *which, int replay) {
  const struct pnode *r = node_at(ctx, "serving", "replay", which), *w = node_at(ctx, "model", "swa", "window");
  if (!r || !w || replay == p->model.window || !r->mark.file || !w->mark.file || !strcmp(r->mark.file, w->mark.file))
    return;
  LOG_WARN("%s:%d:%d: serving.replay.%s is %d but model.swa.window is %d (%s:%d): the replay no longer follows the "
           "window; set `replay: {%s: %d}` beside the window if it should", r->mark.file, r->mark.line, r->mark.col,
           which, replay, p->model.window, w->mark.file, w->mark.line, which, p->model.window);
}

static void check_serving(struct plan_ctx *ctx, struct plan *p) {
  struct plan_serving *s = &p->serving;
  warn_replay(ctx, p, "encoder", s->replay_encoder);
  warn_replay(ctx, p, "decoder", s->replay_decoder);
  struct plan_mark at = mark_of(ctx, "serving.cache.page_tokens");
  if (s->replay_encoder < 0) s->replay_encoder = p->model.window;
  if (s->replay_decoder < 0) s->replay_decoder = p->model.window;
  if (s->page_tokens % 2)
    ERR(ctx, at, "use an even page size so ratio-2 groups never straddle pages (SPEC 5.4)",
        "serving.cache.page_tokens = %d is odd", s->page_tokens);
  at = mark_of(ctx, "serving.cache.prefix_block_tokens");
  if (s->prefix_block_tokens % s->page_tokens)
    ERR(ctx, at, "make the prefix block a whole number of pages",
        "serving.cache.prefix_block_tokens = %d is not a multiple of page_tokens = %d", s->prefix_block_tokens,
        s->page_tokens);
  /* serving.batch (docs/serving.md): every running request decodes one
   * token a step, and a prefill chunk must fit one step's budget; 0 derives */
  bool own_chunk = s->batch_chunk > 0, own_step = s->batch_step_tokens > 0;
  if (!own_chunk) s->batch_chunk = s->prefill_chunk;
  if (!own_step) s->batch_step_tokens = s->batch_chunk + s->batch_max_requests;
  at = mark_of(ctx, "serving.batch.step_tokens");
  if (s->batch_step_tokens < s->batch_max_requests)
    ERR(ctx, at, "raise step_tokens to at least max_requests, or lower max_requests",
        "serving.batch.step_tokens = %d is below max_requests = %d: every running request decodes one token a "
        "step", s->batch_step_tokens, s->batch_max_requests);
  else if (s->batch_chunk > s->batch_step_tokens && own_chunk)
    ERR(ctx, mark_of(ctx, "serving.batch.chunk"), "set chunk to at most step_tokens (a chunk runs inside one step)",
        "serving.batch.chunk = %d is above step_tokens = %d", s->batch_chunk, s->batch_step_tokens);
  else if (s->batch_chunk > s->batch_step_tokens)
    ERR(ctx, at, "set serving.batch.chunk to at most step_tokens, or raise step_tokens",
        "serving.batch.step_tokens = %d is below the prefill chunk %d (serving.prefill_chunk; serving.batch.chunk "
        "is not set)", s->batch_step_tokens, s->batch_chunk);
}

/* Latest layer in [lo, hi] of `region` matching `want`, scanning down. */
static int latest(const struct plan *p, int lo, int hi, enum plan_region region,
                  bool (*want)(const struct plan_layer *, int), int arg) {
  for (int i = hi; i >= lo; i--)
    if (p->layer[i].region == region && want(&p->layer[i], arg)) return i;
  return -1;
}

static bool is_full(const struct plan_layer *l, int kv) { (void)kv; return l->mode == PLAN_FULL; }
static bool is_index_of(const struct plan_layer *l, int kv) { return plan_is_index_source(l) && l->kv_src == kv; }
static bool is_builder_of(const struct plan_layer *l, int kv) { return l->cand == PLAN_CAND_BUILD && l->kv_src == kv; }

static void check_kv(struct plan_ctx *ctx, struct plan *p, struct plan_layer *l) {
  int i = l->index;
  if (l->mode == PLAN_SWA_ONLY) return;
  if (l->mode == PLAN_FULL) {
    if (l->kv_src >= 0 && l->kv_src != i)
      ERR(ctx, lmark(l, l->mark_kv), "a full layer owns its KV: remove `kv:` or make the mode reuse/reindex",
          "layer %d: mode full builds its own KV source, but `kv: %d` names another layer", i, l->kv_src);
    l->kv_src = i;
    return;
  }
  if (l->kv_src == -2) {
    l->kv_src = latest(p, 0, i, l->region, is_full, 0);
    if (l->kv_src < 0) {
      ERR(ctx, lmark(l, l->mark_mode), "make an earlier layer of this region `mode: full`, or this one",
          "layer %d: mode %s needs a KV source (a full layer) at or before it in the %s", i, plan_mode_name(l->mode),
          rname(l));
      return;
    }
  }
  const struct plan_layer *s = &p->layer[l->kv_src];
  if (s->mode != PLAN_FULL)
    ERR(ctx, lmark(l, l->mark_kv), "point `kv:` at a layer with `mode: full`",
        "layer %d: `kv: %d` is not a KV source: layer %d is %s, only full layers own KV", i, l->kv_src, l->kv_src,
        plan_mode_name(s->mode));
  else if (s->index > i || s->region != l->region)
    ERR(ctx, lmark(l, l->mark_kv), "a layer reads a KV source at or before it in its own region",
        "layer %d (%s): `kv: %d` is %s", i, rname(l), l->kv_src,
        s->index > i ? "after it" : "in the other region");
  else if (s->ratio != l->ratio)
    ERR(ctx, lmark(l, l->mark_ratio), "a layer reading a KV source uses the source's compress ratio",
        "layer %d: ratio %d differs from its KV source layer %d (ratio %d)", i, l->ratio, s->index, s->ratio);
}

static void check_topk(struct plan_ctx *ctx, struct plan *p, struct plan_layer *l) {
  int i = l->index;
  if (l->mode == PLAN_SWA_ONLY) return;
  if (plan_is_index_source(l)) {
    if (l->topk_src >= 0 && l->topk_src != i)
      ERR(ctx, lmark(l, l->mark_topk), "full and reindex layers publish their own Top-K: remove `topk:` or use mode reuse",
          "layer %d: mode %s computes its own Top-K, but `topk: %d` names another layer", i, plan_mode_name(l->mode),
          l->topk_src);
    l->topk_src = i;
    return;
  }
  if (l->kv_src < 0) return; /* already reported */
  if (l->topk_src == -2) {
    l->topk_src = latest(p, 0, i - 1, l->region, is_index_of, l->kv_src);
    if (l->topk_src < 0)
      ERR(ctx, lmark(l, l->mark_mode), "make an earlier layer reading the same KV source full or reindex",
          "layer %d: mode reuse needs an index source before it in the %s reading KV source %d", i, rname(l),
          l->kv_src);
    return;
  }
  const struct plan_layer *s = &p->layer[l->topk_src];
  if (!plan_is_index_source(s))
    ERR(ctx, lmark(l, l->mark_topk), "point `topk:` at a full or reindex layer",
        "layer %d: `topk: %d` is not an index source (layer %d is %s)", i, l->topk_src, s->index,
        plan_mode_name(s->mode));
  else if (s->index >= i || s->region != l->region)
    ERR(ctx, lmark(l, l->mark_topk), "a reuse layer reads the Top-K of an earlier layer of its own region",
        "layer %d (%s): `topk: %d` is %s", i, rname(l), l->topk_src,
        s->index >= i ? "not before it" : "in the other region");
  else if (s->kv_src != l->kv_src)
    ERR(ctx, lmark(l, l->mark_topk), "Top-K indices point into one KV source: read the Top-K of a layer with the same `kv`",
        "layer %d reads KV source %d but `topk: %d` indexes KV source %d", i, l->kv_src, l->topk_src, s->kv_src);
}

static void check_pool(struct plan_ctx *ctx, struct plan *p, struct plan_layer *l) {
  int i = l->index;
  if (l->mode == PLAN_SWA_ONLY) return;
  if (l->cand == PLAN_CAND_BUILD && l->mode != PLAN_FULL)
    ERR(ctx, lmark(l, l->mark_cand), "only a full layer scans every entry and can build the pool",
        "layer %d: `candidates: build` needs mode full, not %s", i, plan_mode_name(l->mode));
  if (l->cand != PLAN_CAND_READ) {
    if (l->pool_src >= 0)
      ERR(ctx, lmark(l, l->mark_cand), "add `candidates: read` or remove `pool:`", "layer %d sets `pool:` but does not read candidates", i);
    l->pool_src = -1;
    return;
  }
  if (l->mode != PLAN_REINDEX) {
    ERR(ctx, lmark(l, l->mark_cand), "only reindex layers search inside a candidate pool",
        "layer %d: `candidates: read` needs mode reindex, not %s", i, plan_mode_name(l->mode));
    return;
  }
  if (l->pool_src == -2) {
    l->pool_src = latest(p, 0, i - 1, l->region, is_builder_of, l->kv_src);
    if (l->pool_src < 0)
      ERR(ctx, lmark(l, l->mark_cand), "set `candidates: build` on an earlier full layer of the same KV source",
          "layer %d reads a candidate pool but no layer before it in the %s builds one for KV source %d", i,
          rname(l), l->kv_src);
    return;
  }
  const struct plan_layer *s = &p->layer[l->pool_src];
  if (s->cand != PLAN_CAND_BUILD || s->index >= i || s->region != l->region || s->kv_src != l->kv_src)
    ERR(ctx, lmark(l, l->mark_cand), "point `pool:` at an earlier layer of this region with `candidates: build` and the same `kv`",
        "layer %d: `pool: %d` is not a candidate source for it", i, l->pool_src);
}

static void check_layer_shape(struct plan_ctx *ctx, struct plan *p, struct plan_layer *l) {
  int i = l->index;
  if (l->mode == PLAN_SWA_ONLY) {
    if (l->ratio > 0)
      ERR(ctx, lmark(l, l->mark_ratio), "remove `ratio:` (an SWA-only layer keeps no global memory)",
          "layer %d: mode swa_only has no compress ratio", i);
    if (l->kv_src >= 0 || l->topk_src >= 0 || l->cand != PLAN_CAND_NONE)
      ERR(ctx, lmark(l, l->mark), "remove kv/topk/candidates from SWA-only layers", "layer %d: mode swa_only reads no shared state", i);
    l->ratio = 0, l->kv_src = l->topk_src = l->pool_src = -1;
    return;
  }
  if (l->ratio < 0) {
    ERR(ctx, lmark(l, l->mark), "add `ratio: 1` or `ratio: 2`", "layer %d: mode %s needs a compress ratio", i, plan_mode_name(l->mode));
    l->ratio = 1;
  } else if (p->serving.page_tokens % 2 == 0 && p->serving.page_tokens % l->ratio) {
    char hint[160];
    snprintf(hint, sizeof hint, "use a ratio that divides serving.cache.page_tokens (%d) and is at most the window (%d)",
             p->serving.page_tokens, p->model.window);
    ERR(ctx, lmark(l, l->mark_ratio), hint, "layer %d: compress ratio %d cannot be stored: a %d-token page would split a group",
        i, l->ratio, p->serving.page_tokens);
  } else if (l->ratio > p->model.window) {
    char hint[160];
    snprintf(hint, sizeof hint, "use a ratio of at most model.window (%d), or widen the window", p->model.window);
    ERR(ctx, lmark(l, l->mark_ratio), hint, "layer %d: compress ratio %d is larger than the sliding window of %d tokens: a "
        "group would leave the window before it is complete", i, l->ratio, p->model.window);
  }
}

static void check_regions(struct plan_ctx *ctx, struct plan *p) {
  int n_dec = 0, n_enc = 0;
  for (int i = 0; i < p->n_layers; i++) {
    const struct plan_layer *l = &p->layer[i];
    if (l->region == PLAN_DECODER) n_dec++;
    else n_enc++;
    if (i && l->region == PLAN_ENCODER && p->layer[i - 1].region == PLAN_DECODER)
      ERR(ctx, lmark(l, l->mark_region), "put every encoder layer before the first decoder layer",
          "layer %d is an encoder layer after decoder layer %d", i, i - 1);
  }
  if (p->serving.ced && (!n_dec || !n_enc))
    ERR(ctx, mark_of(ctx, "serving.ced"),
        "give the plan encoder and decoder layers, or set `serving.ced: false`",
        "CED prefill needs both an encoder and a decoder region (this plan has %d encoder and %d decoder layers)",
        n_enc, n_dec);
}

static void check_candidates(struct plan_ctx *ctx, struct plan *p) {
  const struct plan_model *m = &p->model;
  bool used = false;
  for (int i = 0; i < p->n_layers; i++) used |= p->layer[i].cand != PLAN_CAND_NONE;
  /* Legal in the vendor model (Appendix V #13: Top-K pads with -1), so a
   * warning: a layer reading the pool then selects fewer than topk entries. */
  if (used && (int64_t)m->cand_top_blocks * m->cand_block - (m->cand_block - 1) < m->topk)
    plan__warn(ctx, mark_of(ctx, "model.candidates.top_blocks"),
               "grow candidates.top_blocks or shrink indexer.topk to select topk entries from the pool",
               "a pool of %d blocks of %d may hold fewer than topk = %d entries: its readers' Top-K lists are padded "
               "with -1 (top_blocks*block - (block-1) < topk)",
               m->cand_top_blocks, m->cand_block, m->topk);
}

/* The mHC pairing and the head collapse go together (docs/plans.md, model.mhc). */
static void check_mhc(struct plan_ctx *ctx, const struct plan *p) {
  const struct plan_model *m = &p->model;
  static const char *const merge[] = {"carried", "learned", "sum"};
  if (m->hc_pairing == PLAN_PAIRING_V41 && m->hc_merge != PLAN_MERGE_CARRIED)
    ERR(ctx, mark_of(ctx, "model.mhc.merge"),
        "set `merge: carried` (V4.1 collapses with the last FFN's pre), or `pairing: v4` to study V4's merge",
        "model.mhc.merge: %s contradicts pairing: v41 (V4.1 has no head.hc tensors)", merge[m->hc_merge]);
  if (m->hc_pairing == PLAN_PAIRING_V4 && m->hc_merge == PLAN_MERGE_CARRIED)
    ERR(ctx, mark_of(ctx, "model.mhc.merge"), "with `pairing: v4` set `merge: learned` (V4's head.hc) or `merge: sum`",
        "model.mhc.merge: carried needs pairing: v41 (under pairing: v4 no pre is carried to the head)");
}

/* model.indexer.key_slot: vendor (docs/model.md s3.2). A step's first index
 * layers read the slot the previous forward left; the graph compiler takes
 * it to be the last KV source in layer order, which holds only when that
 * source publishes on every tile, i.e. has ratio 1 (L20 in V4.1). Else the
 * slot would depend on how the previous forward was chunked, which no
 * graph carries. And with ratios 1 and 2 only (V4.1's), whether a source
 * publishes at a decode position is its parity, so a verify tile's rows
 * read at most two key tensors (graph_node.key_src). Other plans are
 * refused rather than guessed. */
static void check_key_slot(struct plan_ctx *ctx, const struct plan *p) {
  if (p->model.idx_key_slot != PLAN_KEY_SLOT_VENDOR) return;
  int last = -1, wide = -1;
  for (int i = 0; i < p->n_layers; i++)
    if (plan_is_kv_source(&p->layer[i])) {
      last = i;
      if (p->layer[i].ratio > 2 && wide < 0) wide = i;
    }
  int bad = wide >= 0 ? wide : last;
  if (bad < 0 || (wide < 0 && p->layer[last].ratio == 1)) return;
  const struct pnode *v = plan__map_get(ctx->root, "model");
  v = v && v->kind == PN_MAP ? plan__map_get(v, "indexer") : NULL;
  bool named = v && v->kind == PN_MAP && plan__map_get(v, "key_slot");
  const struct plan_layer *l = &p->layer[bad];
  /* blamed: key_slot where the plan itself names it, else the layer's ratio (an inherited key_slot, as
   * v41-flash.yaml's, is not what the plan changed) */
  struct plan_mark ks = mark_of(ctx, "model.indexer.key_slot");
  named = named && ks.file && !strcmp(ks.file, ctx->strings[0]);
  if (wide >= 0)
    ERR(ctx, named ? ks : lmark(l, l->mark_ratio),
        "set model.indexer.key_slot: own_source, or use ratios 1 and 2 (V4.1's)",
        "model.indexer.key_slot: vendor is implemented for KV sources of ratio 1 and 2 (layer %d has ratio %d)", bad,
        l->ratio);
  else
    ERR(ctx, named ? ks : lmark(l, l->mark_ratio),
        "set model.indexer.key_slot: own_source, or end the KV sources with a ratio-1 layer (as V4.1's L20)",
        "model.indexer.key_slot: vendor needs the last KV source to have ratio 1 (layer %d has ratio %d): the slot a "
        "decode step starts with would depend on how the previous forward was chunked", bad, l->ratio);
}

/* serving.engram.tier against serving.placement.engram.memory (issue 19's
 * home of the tables): `memory: file` is the mmap tier; one written without
 * the other takes it, and the two written differently are refused. */
static void check_engram_tier(struct plan_ctx *ctx, struct plan *p) {
  struct plan_serving *s = &p->serving;
  struct plan_placement *pl = &s->place;
  bool tier_set = s->mark_engram_tier.file != NULL, engram = false;
  const struct pnode *v = plan__map_get(ctx->root, "serving");
  v = v && v->kind == PN_MAP ? plan__map_get(v, "placement") : NULL;
  v = v && v->kind == PN_MAP ? plan__map_get(v, "engram") : NULL;
  bool memory_set = v && v->kind == PN_MAP && plan__map_get(v, "memory");
  for (int i = 0; i < p->n_layers; i++) engram |= p->layer[i].engram;
  bool mmap_tier = s->engram_tier == PLAN_ENGRAM_TIER_MMAP, file_home = pl->engram_memory == PLAN_ENGRAM_FILE;
  if (tier_set && memory_set && mmap_tier != file_home) {
    struct plan_mark mm = mark_of(ctx, "serving.placement.engram.memory");
    ERR(ctx, s->mark_engram_tier, "write tier: mmap with memory: file, or tier: memory with memory: host",
        "serving.engram.tier = %s contradicts serving.placement.engram.memory = %s (%s:%d:%d)",
        mmap_tier ? "mmap" : "memory", file_home ? "file" : "host", mm.file, mm.line, mm.col);
    return;
  }
  if (memory_set && file_home) s->engram_tier = PLAN_ENGRAM_TIER_MMAP, mmap_tier = true;
  if (mmap_tier && pl->engram_set) pl->engram_memory = PLAN_ENGRAM_FILE;
  struct plan_mark at = mark_of(ctx, "serving.engram.file");
  if (s->engram_file && !mmap_tier)
    ERR(ctx, at, "set serving.engram.tier: mmap, or drop `file`",
        "serving.engram.file is read only by the mmap tier, and the tier is memory");
  else if (s->engram_file && !s->engram_file[0])
    ERR(ctx, at, "name a file, or drop `file` for the derived one", "serving.engram.file is empty");
  else if (mmap_tier && !engram)
    plan__warn(ctx, tier_set ? s->mark_engram_tier : at, "drop serving.engram, or give a layer `engram: true`",
               "serving.engram.tier = mmap, but the plan has no Engram layer: there is nothing to map");
}

void plan__check(struct plan_ctx *ctx, struct plan *p) {
  check_widths(ctx, p);
  check_mhc(ctx, p);
  check_format(ctx, "main_kv", &p->model.main_kv, p->model.head_dim);
  check_format(ctx, "indexer_k", &p->model.indexer_k, p->model.idx_head_dim);
  check_format(ctx, "swa", &p->model.swa, p->model.head_dim);
  check_serving(ctx, p);
  check_engram_tier(ctx, p);
  check_regions(ctx, p);
  for (int i = 0; i < p->n_layers; i++) check_layer_shape(ctx, p, &p->layer[i]);
  if (ctx->n_errors) return;
  for (int i = 0; i < p->n_layers; i++) check_kv(ctx, p, &p->layer[i]);
  for (int i = 0; i < p->n_layers; i++) check_topk(ctx, p, &p->layer[i]);
  for (int i = 0; i < p->n_layers; i++) check_pool(ctx, p, &p->layer[i]);
  check_candidates(ctx, p);
  check_key_slot(ctx, p);
  if (!ctx->n_errors) plan__check_placement(ctx, p);
}
