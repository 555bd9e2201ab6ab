/* plan_cost.c: plan accounting from the plan alone (see plan_cost.h).
 *
 * Every figure is derived from the plan's resolved wiring (mode, ratio,
 * kv_src, cand per layer), its widths and formats and its serving knobs; no
 * layer number is hard-coded. For the flash plan the results are SPEC's:
 * 356 B per source entry, 890 B/token, 2.5M entries at N = 10^6, 2,621,440 B
 * of SWA payload, 12,288 B of tails, 23,040 cold-prefill token-layers for
 * n = 1024, and 5,200 token-layers / 3,560 B for the SPEC 6.6 prefix hit.
 *
 * Not here: printing (cli/cmd_plan_cost.c), FLOPs, latency, allocator
 * overheads. Test: tests/test_plan_cost.c.
 */
#include "scheduler/plan_cost.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "ops/engram.h"

/* ---- storage formats (plan.h) ---------------------------------------- */

static int64_t elem_bits(enum plan_elem e) {
  switch (e) {
  case PLAN_E2M1: return 4;
  case PLAN_E4M3: return 8;
  case PLAN_BF16: return 16;
  case PLAN_F32: return 32;
  }
  return 0;
}

static int64_t scale_bytes(enum plan_scale s) {
  switch (s) {
  case PLAN_SCALE_NONE: return 0;
  case PLAN_SCALE_E4M3: return 1;
  case PLAN_SCALE_E8M0: return 1;
  case PLAN_SCALE_F32: return 4;
  }
  return 0;
}

/* Packed elements, rounded up to whole bytes (an odd count of 4-bit values
 * still occupies the last byte). */
int64_t plan_format_payload_bytes(const struct plan_format *f, int width) {
  if (width <= 0) return 0;
  return ((int64_t)width * elem_bits(f->elem) + 7) / 8;
}

/* Payload plus one scale per `block` values, the last block possibly short.
 * A block <= 0 (rejected by the plan checker) counts as one scale per vector. */
int64_t plan_format_bytes(const struct plan_format *f, int width) {
  if (width <= 0) return 0;
  int64_t block = f->block > 0 ? f->block : width;
  int64_t n_scales = f->scale == PLAN_SCALE_NONE ? 0 : ((int64_t)width + block - 1) / block;
  return plan_format_payload_bytes(f, width) + n_scales * scale_bytes(f->scale);
}

/* The ops' format of a checked cache class: what the runtime packs, whose
 * op_kv_bytes equals plan_format_bytes (tests/test_formats_plan.c). */
_Static_assert((int)PLAN_E2M1 == OP_KV_E2M1 && (int)PLAN_E4M3 == OP_KV_E4M3 && (int)PLAN_BF16 == OP_KV_BF16 &&
                   (int)PLAN_F32 == OP_KV_F32 && (int)PLAN_SCALE_NONE == OP_KV_SCALE_NONE &&
                   (int)PLAN_SCALE_E4M3 == OP_KV_SCALE_E4M3 && (int)PLAN_SCALE_E8M0 == OP_KV_SCALE_E8M0 &&
                   (int)PLAN_SCALE_F32 == OP_KV_SCALE_F32,
               "plan and op format enums list the same types");
struct op_kv_format plan_kv_format(const struct plan_model *m, const struct plan_format *f) {
  static const enum op_kv_rule rule[] = {[PLAN_RULE_CEIL] = OP_KV_CEIL, [PLAN_RULE_OCP] = OP_KV_OCP,
                                         [PLAN_RULE_RNE] = OP_KV_RNE, [PLAN_RULE_ROUNDUP] = OP_KV_ROUNDUP,
                                         [PLAN_RULE_AUTO] = OP_KV_FLOAT};
  return (struct op_kv_format){
      .elem = (enum op_kv_elem)f->elem, /* the enums list the same types in the same order */
      .scale = (enum op_kv_scale)f->scale,
      .block = f->block,
      .rule = (unsigned)f->rule <= PLAN_RULE_AUTO ? rule[f->rule] : OP_KV_FLOAT,
      .floor = f->floor > 0 ? (float)f->floor : 0.0f,
      .nibble = m->nibble_low_first ? OP_NIBBLE_EVEN_LOW : OP_NIBBLE_EVEN_HIGH,
      .bf16 = f->bf16_round,
  };
}

/* ---- query ------------------------------------------------------------- */

void plan_cost_query_init(struct plan_cost_query *q) {
  memset(q, 0, sizeof *q);
  q->tokens = PLAN_COST_DEFAULT_TOKENS;
  q->prompt = PLAN_COST_DEFAULT_PROMPT;
}

int plan_cost_query_check(const struct plan_cost_query *q, char *msg, size_t msg_size) {
  if (q->tokens < 0)
    snprintf(msg, msg_size, "--tokens %lld is negative", (long long)q->tokens);
  else if (q->tokens > PLAN_COST_MAX_TOKENS)
    snprintf(msg, msg_size, "--tokens %lld is larger than the limit %lld", (long long)q->tokens,
             (long long)PLAN_COST_MAX_TOKENS);
  else if (q->prompt > PLAN_COST_MAX_TOKENS)
    snprintf(msg, msg_size, "--prompt %lld is larger than the limit %lld", (long long)q->prompt,
             (long long)PLAN_COST_MAX_TOKENS);
  else if (q->prompt < 1)
    snprintf(msg, msg_size, "--prompt %lld: a prompt has at least 1 token", (long long)q->prompt);
  else if (q->has_hit && q->hit < 0)
    snprintf(msg, msg_size, "--hit %lld is negative", (long long)q->hit);
  else if (q->has_hit && q->hit > q->prompt)
    snprintf(msg, msg_size,
             "--hit %lld is larger than --prompt %lld (a cached prefix is part of the prompt)",
             (long long)q->hit, (long long)q->prompt);
  else if (q->swa_miss && !q->has_hit)
    snprintf(msg, msg_size, "--swa-miss needs --hit C (it describes a prefix hit)");
  else
    return CEDAR_OK;
  return CEDAR_EINVAL;
}

/* ---- plan wiring and size checks --------------------------------------- */

static int fail(struct plan_cost *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct plan_cost *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->error, sizeof c->error, fmt, ap);
  va_end(ap);
  return CEDAR_EINVAL;
}

/* A loaded plan has passed plan_check.c; this guards hand-built plans (tests)
 * so the arithmetic below never divides by zero or indexes out of range. */
static int check_wiring(const struct plan *p, struct plan_cost *c) {
  if (p->n_layers < 1 || p->n_layers > PLAN_MAX_LAYERS)
    return fail(c, "plan has %d layers (1..%d expected)", p->n_layers, PLAN_MAX_LAYERS);
  for (int i = 0; i < p->n_layers; i++) {
    const struct plan_layer *l = &p->layer[i];
    if (!plan_is_csa(l)) continue;
    if (l->ratio < 1)
      return fail(c, "layer %d: a CSA2 layer with ratio %d (>= 1 expected)", i, l->ratio);
    if (l->kv_src < 0 || l->kv_src >= p->n_layers || !plan_is_kv_source(&p->layer[l->kv_src]))
      return fail(c, "layer %d: kv_src %d is not a full (KV source) layer", i, l->kv_src);
    if (plan_is_kv_source(l) && l->kv_src != i)
      return fail(c, "layer %d: a full layer must read its own pool, not layer %d", i, l->kv_src);
  }
  return CEDAR_OK;
}

/* Conservative magnitude of the largest figure, computed in double, so the
 * exact int64 arithmetic below cannot overflow. */
static int check_magnitude(const struct plan *p, const struct plan_cost_query *q,
                           struct plan_cost *c) {
  const struct plan_model *m = &p->model;
  double layers = p->n_layers, max_ratio = 1;
  for (int i = 0; i < p->n_layers; i++)
    if (p->layer[i].ratio > max_ratio) max_ratio = p->layer[i].ratio;
  double entry = (double)plan_format_bytes(&m->main_kv, m->head_dim) +
                 (double)plan_format_bytes(&m->indexer_k, m->idx_head_dim) + 1;
  double big = layers * entry * ((double)q->tokens + 1) + layers * entry * ((double)q->prompt + 1) +
               layers * ((double)q->prompt + fabs((double)p->serving.replay_encoder) +
                         fabs((double)p->serving.replay_decoder)) +
               layers * fabs((double)m->window) * (double)plan_format_bytes(&m->swa, m->head_dim) +
               layers * max_ratio * fabs((double)m->head_dim) * 8 +
               layers * fabs((double)m->cand_block) * fabs((double)m->cand_top_blocks);
  if (big >= ldexp(1.0, 62))
    return fail(c, "the figures for --tokens %lld / --prompt %lld do not fit in 64-bit integers; "
                   "use smaller values",
                (long long)q->tokens, (long long)q->prompt);
  return CEDAR_OK;
}

/* ---- global KV (SPEC 4.5, 5.2) ------------------------------------------ */

static int64_t floor_div(int64_t a, int64_t b) { return a / b; } /* a >= 0, b >= 1 */

static void account_global(const struct plan *p, struct plan_cost *c) {
  const struct plan_model *m = &p->model;
  int64_t main_b = plan_format_bytes(&m->main_kv, m->head_dim);
  int64_t idx_b = plan_format_bytes(&m->indexer_k, m->idx_head_dim);
  int64_t n_tok = c->q.tokens;
  for (int i = 0; i < p->n_layers; i++) {
    const struct plan_layer *l = &p->layer[i];
    if (!plan_is_csa(l)) continue;
    c->n_csa++;
    if (plan_is_index_source(l)) c->n_index_sources++;
    /* Per-layer baseline: this layer owning a pool at its own ratio. */
    c->baseline_entries += floor_div(n_tok, l->ratio);
    c->baseline_bytes_per_token += (double)(main_b + idx_b) / l->ratio;
    if (!plan_is_kv_source(l)) continue;
    struct plan_cost_source *s = &c->src[c->n_sources++];
    s->layer = i;
    s->region = l->region;
    s->ratio = l->ratio;
    s->main_bytes = main_b;
    s->indexer_bytes = idx_b;
    s->entry_bytes = main_b + idx_b;
    s->bytes_per_token = (double)s->entry_bytes / l->ratio;
    s->entries = floor_div(n_tok, l->ratio);
    s->bytes = s->entries * s->entry_bytes;
    s->visible = floor_div(n_tok + 1, l->ratio);
    c->bytes_per_token += s->bytes_per_token;
    c->entries += s->entries;
    c->bytes += s->bytes;
  }
  c->baseline_bytes = c->baseline_entries * (main_b + idx_b);
  for (int i = 0; i < p->n_layers; i++) {
    const struct plan_layer *l = &p->layer[i];
    if (!plan_is_csa(l)) continue;
    for (int k = 0; k < c->n_sources; k++)
      if (c->src[k].layer == l->kv_src) c->src[k].readers++;
  }
}

/* ---- per-request state: SWA rings and compressor tails ----------------- */

static void account_request_state(const struct plan *p, struct plan_cost *c) {
  const struct plan_model *m = &p->model;
  /* Every layer, SWA-only ones included, owns a ring of `window` entries. */
  c->swa_window = m->window;
  c->swa_payload_per_entry = plan_format_payload_bytes(&m->swa, m->head_dim);
  c->swa_scale_per_entry = plan_format_bytes(&m->swa, m->head_dim) - c->swa_payload_per_entry;
  c->swa_payload_per_layer = c->swa_window * c->swa_payload_per_entry;
  c->swa_payload_bytes = p->n_layers * c->swa_payload_per_layer;
  c->swa_scale_bytes = p->n_layers * c->swa_window * c->swa_scale_per_entry;
  /* A ratio-r compressor holds up to r-1 pending tokens, each an fp32 value
   * and gate vector of head_dim (SPEC 3.7, 4.5); ratio 1 holds none. */
  for (int k = 0; k < c->n_sources; k++) {
    struct plan_cost_source *s = &c->src[k];
    s->tail_bytes = (int64_t)(s->ratio - 1) * (2 * (int64_t)m->head_dim) * 4;
    if (s->ratio > 1) c->n_tail_sources++;
    c->tail_bytes += s->tail_bytes;
  }
}

/* ---- prefill token-layers (SPEC 6.1, 6.2, 6.5, 6.6) --------------------- */

/* The work of a prefill of n tokens of which the first c are a global prefix
 * hit (c = 0: a cold prefill).
 *
 * CED on: encoder layers replay [max(0, c - replay_encoder), c) when the
 * encoder SWA snapshot at c is missing, then run the suffix [c, n) (new
 * global entries); decoder layers run only the bounded replay
 * [max(0, n - replay_decoder), n). The encoder outputs for the cached part
 * of that replay are assumed available (SPEC 6.5 leaves their supply to the
 * protocol); their recompute is not counted.
 *
 * CED off (dense baseline): every layer runs the suffix [c, n), and on an
 * SWA miss every layer first replays [max(0, c - replay_encoder), c): no
 * layer has a snapshot to resume from, and replay_encoder is the plan's
 * bound on SWA replay.
 *
 * A replay bound < 0 is "unset" (the loader resolves it to the window). */
static int64_t replay_bound(int value, int window) { return value < 0 ? window : value; }

static void account_prefill(const struct plan *p, struct plan_cost *c, int64_t n, int64_t hit,
                            bool swa_miss, struct plan_cost_prefill *f) {
  f->prompt = n;
  f->hit = hit;
  int64_t re = replay_bound(p->serving.replay_encoder, p->model.window);
  int64_t rd = replay_bound(p->serving.replay_decoder, p->model.window);
  int64_t replay_begin = hit;
  if (swa_miss) replay_begin = hit > re ? hit - re : 0;
  f->encoder_replay = (struct plan_cost_range){replay_begin, hit};
  f->encoder_positions = plan_cost_range_len(f->encoder_replay) + (n - hit);
  int64_t dec_begin = replay_begin;
  if (p->serving.ced) dec_begin = n > rd ? n - rd : 0;
  f->decoder = (struct plan_cost_range){dec_begin, n};
  f->decoder_positions = plan_cost_range_len(f->decoder);
  f->decoder_prefix = hit > dec_begin ? hit - dec_begin : 0;
  f->decoder_suffix = f->decoder_positions - f->decoder_prefix;
  f->token_layers = c->n_encoder * f->encoder_positions + c->n_decoder * f->decoder_positions;
  f->dense_token_layers = p->n_layers * (n - hit);
  for (int k = 0; k < c->n_sources; k++) {
    const struct plan_cost_source *s = &c->src[k];
    int64_t e = floor_div(n, s->ratio) - floor_div(hit, s->ratio);
    f->new_entries += e;
    f->new_bytes += e * s->entry_bytes;
  }
}

static void account_sources_prefill(struct plan_cost *c) {
  for (int k = 0; k < c->n_sources; k++) {
    struct plan_cost_source *s = &c->src[k];
    s->cold_entries = floor_div(c->q.prompt, s->ratio);
    if (!c->q.has_hit) continue;
    s->hit_entries = s->cold_entries - floor_div(c->q.hit, s->ratio);
    s->hit_bytes = s->hit_entries * s->entry_bytes;
  }
}

/* ---- indexer per decode token (SPEC 3.9-3.11, 4.6) ---------------------- */

/* The query at position p = N sees floor((p+1)/r) entries of a ratio-r pool
 * (a group is visible once complete; ratio 1 includes the query's own). A
 * full layer scans all of them; a reindex layer scores only its candidate
 * pool when it reads one (at most cand_top_blocks x cand_block entries). */
static void account_indexer(const struct plan *p, struct plan_cost *c) {
  const struct plan_model *m = &p->model;
  int64_t pos = c->q.tokens;
  int64_t pool = (int64_t)m->cand_top_blocks * m->cand_block;
  c->idx_position = pos;
  for (int i = 0; i < p->n_layers; i++) {
    const struct plan_layer *l = &p->layer[i];
    if (!plan_is_csa(l)) continue;
    c->idx_per_layer_key_dots += floor_div(pos + 1, l->ratio);
    if (!plan_is_index_source(l)) continue;
    int64_t vis = floor_div(pos + 1, p->layer[l->kv_src].ratio);
    struct plan_cost_indexer *x = &c->idx[c->n_indexers++];
    x->layer = i;
    x->mode = l->mode;
    x->kv_src = l->kv_src;
    x->cand = l->cand;
    if (l->mode == PLAN_FULL) {
      x->key_dots = vis;
      c->idx_full_key_dots += vis;
    } else {
      x->key_dots = l->cand == PLAN_CAND_READ && pool < vis ? pool : vis;
      c->idx_reindex_key_dots += x->key_dots;
    }
    c->idx_key_dots += x->key_dots;
  }
}

/* ---- entry point --------------------------------------------------------- */

/* The Engram tables (SPEC 3.15, 8.6.30) and where serving.engram.tier puts
 * them: memory counts them resident; mmap maps them from a file, so they
 * are not resident and only the rows a token's prefetch reads are paged in
 * (at most one or two pages a row). Weights are otherwise not accounted. */
static void account_engram(const struct plan *p, struct plan_cost *out) {
  const struct plan_model *m = &p->model;
  for (int i = 0; i < p->n_layers; i++) out->engram_modules += p->layer[i].engram;
  size_t rb = op_engram_row_bytes(m->engram_head_dim, 32); /* E4M3 + one E8M0 per 32 (docs/weights.md) */
  struct op_engram_tables et;
  if (!out->engram_modules || !rb ||
      op_engram_tables_init(&et, out->engram_modules, m->engram_n_orders, m->engram_heads, m->engram_table_base))
    return;
  for (int i = 0; i < out->engram_modules; i++) out->engram_rows += et.rows[i];
  op_engram_tables_free(&et);
  out->engram_row_bytes = (int64_t)rb;
  out->engram_table_bytes = out->engram_rows * out->engram_row_bytes;
  out->engram_mmap = p->serving.engram_tier == PLAN_ENGRAM_TIER_MMAP;
  out->engram_resident_bytes = out->engram_mmap ? 0 : out->engram_table_bytes;
  out->engram_mapped_bytes = out->engram_mmap ? out->engram_table_bytes : 0;
  out->engram_rows_per_token = (int64_t)out->engram_modules * m->engram_n_orders * m->engram_heads;
  out->engram_bytes_per_token = out->engram_rows_per_token * out->engram_row_bytes;
}

int plan_cost_compute(const struct plan *p, const struct plan_cost_query *q,
                      struct plan_cost *out) {
  memset(out, 0, sizeof *out);
  out->q = *q;
  int rc = plan_cost_query_check(q, out->error, sizeof out->error);
  if (rc == CEDAR_OK && q->has_hit) rc = plan_hit_check(p, q->hit, !q->swa_miss, out->error, sizeof out->error);
  if (rc == CEDAR_OK) rc = check_wiring(p, out);
  if (rc == CEDAR_OK) rc = check_magnitude(p, q, out);
  if (rc != CEDAR_OK) return rc;
  out->ced = p->serving.ced;
  out->n_layers = p->n_layers;
  for (int i = 0; i < p->n_layers; i++) {
    if (p->layer[i].region == PLAN_ENCODER) out->n_encoder++;
    else out->n_decoder++;
  }
  account_global(p, out);
  account_request_state(p, out);
  account_sources_prefill(out);
  account_prefill(p, out, q->prompt, 0, false, &out->cold);
  if (q->has_hit) account_prefill(p, out, q->prompt, q->hit, q->swa_miss, &out->hit);
  account_indexer(p, out);
  account_engram(p, out);
  return CEDAR_OK;
}
