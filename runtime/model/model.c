/* model.c: binding a plan to its weights, and the op groups of model.h.
 * The steps follow docs/model.md section by section; the section is named
 * beside each group. */
#include "runtime/model/model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention.h"
#include "ops/basic.h"
#include "ops/formats.h"
#include "ops/indexer.h"
#include "ops/qkv.h"
#include "ops/qlinear.h"
#include "runtime/model/round_trace.h"
#include "base/check.h"
#include "runtime/model/engram_tier.h"

/* Gate floor of the Engram injection (docs/model.md s5, R.8). */
#define RT_ENGRAM_DOT_FLOOR 1e-6f
/* Values per E8M0 scale of an FP8 linear's MXFP8 input (Appendix V #22). */
#define RT_MXFP8_BLOCK 32

/* ---- activation numerics (docs/model.md s7, Appendix V #22) ------------- */

/* Each rounding of a computed value is recorded as point pt of layer l at
 * positions a.. for the oracle's flip accounting (round_trace.h; pt NULL:
 * not recorded, the input is exact, a < 0: the tile's positions). */
/* model.numerics.activations: the residual streams after each update. */
static void round_x(const struct rt_model *M, float *X, int n, const char *pt, int l) {
  const struct plan_model *m = &M->p->model;
  if (!m->num_act_bf16) return;
  op_bf16_round_n(X, (size_t)n * m->hc_streams * m->hidden);
  if (pt) rt_rtrace_f32(pt, l, -1, n, m->hc_streams * m->hidden, m->hc_streams * m->hidden, X);
}
/* model.numerics.sublayer_io: a sublayer's mixed input, normed input, output (n, hidden). */
static void round_io(const struct rt_model *M, float *x, int n, const char *pt, int l, int64_t a) {
  const int d = M->p->model.hidden;
  if (!M->p->model.num_io_bf16) return;
  op_bf16_round_n(x, (size_t)n * d);
  if (pt) rt_rtrace_f32(pt, l, a, n, d, d, x);
}
/* model.numerics.linear_inputs: the input an FP8 linear reads, (rows, cols);
 * the same buffer when nothing is quantized, else an MXFP8 copy. */
static const float *lin_in(const struct rt_model *M, const float *x, int rows, int cols, struct rt_arena *ar,
                           const char *pt, int l, int64_t a) {
  if (!M->p->model.num_lin_mxfp8) return x;
  float *q = RT_ALLOC(ar, float, (size_t)rows * cols);
  memcpy(q, x, sizeof(float) * (size_t)rows * cols);
  op_mxfp8_qdq(q, rows, cols, cols, RT_MXFP8_BLOCK);
  if (pt) rt_rtrace_f32(pt, l, a, rows, cols, cols, q);
  return q;
}

/* ---- binding ------------------------------------------------------------ */

/* A tensor the plan requires: weights were checked against the plan, so a
 * missing one is cedar's bug. */
static const float *need(const struct weights *w, int l, const char *name) {
  char full[WEIGHTS_NAME_MAX];
  if (l >= 0)
    snprintf(full, sizeof(full), "layers.%d.%s", l, name);
  else
    snprintf(full, sizeof(full), "%s", name);
  const float *t = weights_f32(w, full);
  CEDAR_ASSERT_MSG(t != NULL, "weights lack %s although they were checked against the plan", full);
  return t;
}

/* A linear the plan requires, as its view (held format). */
static struct op_qweight need_qw(const struct weights *w, int l, const char *name) {
  char full[WEIGHTS_NAME_MAX];
  if (l >= 0)
    snprintf(full, sizeof(full), "layers.%d.%s", l, name);
  else
    snprintf(full, sizeof(full), "%s", name);
  struct op_qweight q = weights_qw(w, full);
  CEDAR_ASSERT_MSG(q.data != NULL, "weights lack %s although they were checked against the plan", full);
  return q;
}

static struct op_qweight need_named(const struct weights *w, const char *prefix, int idx, const char *name) {
  char full[WEIGHTS_NAME_MAX];
  snprintf(full, sizeof(full), "%s.%d.ffn.%s", prefix, idx, name);
  struct op_qweight q = weights_qw(w, full);
  CEDAR_ASSERT_MSG(q.data != NULL, "weights lack %s although they were checked against the plan", full);
  return q;
}

void rt_bind_moe(const struct weights *w, const char *prefix, int idx, bool shared, struct op_moe_weights *moe) {
  char full[WEIGHTS_NAME_MAX];
  snprintf(full, sizeof(full), "%s.%d.ffn.bias", prefix, idx);
  *moe = (struct op_moe_weights){.bias = weights_f32(w, full), .has_q = true};
  CEDAR_ASSERT_MSG(moe->bias != NULL, "weights lack %s although they were checked against the plan", full);
  struct op_moe_qweights *q = &moe->q;
  q->router = need_named(w, prefix, idx, "gate");
  q->gate = need_named(w, prefix, idx, "experts.w_gate");
  q->up = need_named(w, prefix, idx, "experts.w_up");
  q->down = need_named(w, prefix, idx, "experts.w_down");
  if (!shared) return;
  q->shared_gate = need_named(w, prefix, idx, "shared.w_gate");
  q->shared_up = need_named(w, prefix, idx, "shared.w_up");
  q->shared_down = need_named(w, prefix, idx, "shared.w_down");
}

static void bind_attention(struct rt_model *M, struct rt_layer *L, int l) {
  const struct plan_model *m = &M->p->model;
  const struct weights *w = M->w;
  L->wq_a = need_qw(w, l, "attn.wq_a");
  L->q_norm = need(w, l, "attn.q_norm");
  L->wq_b = need_qw(w, l, "attn.wq_b");
  L->wkv = need_qw(w, l, "attn.wkv");
  L->kv_norm = need(w, l, "attn.kv_norm");
  L->sink = m->sink ? need(w, l, "attn.sink") : NULL;
  L->wo_a = need_qw(w, l, "attn.wo_a");
  L->wo_b = need_qw(w, l, "attn.wo_b");
  if (plan_is_index_source(L->pl)) {
    L->iq_b = need_qw(w, l, "attn.indexer.wq_b");
    L->iw = need(w, l, "attn.indexer.weights_proj");
  }
  if (!plan_is_kv_source(L->pl)) return;
  L->comp = (struct op_comp_layer){
      .ratio = L->pl->ratio,
      .hidden = m->hidden,
      .d = m->head_dim,
      .idx_dim = m->idx_head_dim,
      .W_kv = need(w, l, "attn.compressor.wkv"),
      .W_gate = L->pl->ratio > 1 ? need(w, l, "attn.compressor.wgate") : NULL,
      .gamma = need(w, l, "attn.compressor.norm"),
      .W_ik = need(w, l, "attn.indexer.wk"),
      .k_norm = m->idx_k_norm,
      .k_gamma = m->idx_k_norm ? need(w, l, "attn.indexer.k_norm") : NULL,
      .eps = M->eps,
      .rope = &M->rope_csa,
      .rope_i = &M->rope_idx,
      .main_fmt = plan_kv_format(m, &m->main_kv),
      .idx_fmt = plan_kv_format(m, &m->indexer_k),
  };
}

static void bind_layer(struct rt_model *M, int l, int *module) {
  const struct plan_model *m = &M->p->model;
  const struct weights *w = M->w;
  struct rt_layer *L = &M->L[l];
  L->pl = &M->p->layer[l];
  L->rope = plan_is_csa(L->pl) ? &M->rope_csa : &M->rope_swa;
  L->attn_norm = need(w, l, "attn_norm");
  L->ffn_norm = need(w, l, "ffn_norm");
  static const char *const sub[2] = {"hc_attn", "hc_ffn"};
  for (int k = 0; k < 2; k++) {
    char name[32];
    snprintf(name, sizeof(name), "%s.fn", sub[k]);
    L->hc_fn[k] = need(w, l, name);
    snprintf(name, sizeof(name), "%s.scale", sub[k]);
    L->hc_scale[k] = need(w, l, name);
    snprintf(name, sizeof(name), "%s.base", sub[k]);
    L->hc_base[k] = need(w, l, name);
  }
  bind_attention(M, L, l);
  rt_bind_moe(w, "layers", l, m->n_shared > 0, &L->moe);
  if (!L->pl->engram) return;
  L->e_module = (*module)++;
  char name[WEIGHTS_NAME_MAX];
  snprintf(name, sizeof(name), "layers.%d.engram.table", l);
  const struct weights_spec *spec = NULL;
  L->e_table = weights_get(w, name, &spec);
  CEDAR_ASSERT(L->e_table != NULL && spec != NULL);
  L->e_rows = spec->shape[0];
  L->e_scales = w->engram_scales ? w->engram_scales[spec - w->list.t] : NULL;
  L->e_wkv = need_qw(w, l, "engram.wkv");
  L->e_qw = need(w, l, "engram.q_w");
  L->e_kw = need(w, l, "engram.k_w");
  /* docs/model.md s5: the vendor's numpy default_rng(10007 l) over the
   * compressed vocabulary (Appendix V #18); or cedar's older splitmix64 from
   * seed + 10007 l, full-range odd (id_bound 0), by plan option. */
  if (m->engram_mult == PLAN_ENGRAM_MULT_SPLITMIX64)
    op_engram_multipliers_splitmix64(L->e_mult, m->engram_seed, l, M->e_max_order, 0);
  else
    op_engram_multipliers_numpy(L->e_mult, l, M->e_max_order, m->engram_compressed_vocab);
}

static int init_engram(struct rt_model *M, char *err, size_t err_len) {
  const struct plan_model *m = &M->p->model;
  int modules = 0;
  for (int l = 0; l < M->p->n_layers; l++) modules += M->p->layer[l].engram;
  M->e_max_order = 0;
  for (int i = 0; i < m->engram_n_orders; i++)
    if (m->engram_orders[i] > M->e_max_order) M->e_max_order = m->engram_orders[i];
  M->e_tables = m->engram_n_orders * m->engram_heads;
  if (!modules) return 0;
  if (M->e_max_order > 64) {
    snprintf(err, err_len, "model.engram.orders: n-grams longer than 64 tokens are not supported");
    return CEDAR_EUNSUPPORTED;
  }
  if (op_engram_tables_init(&M->eng, modules, m->engram_n_orders, m->engram_heads, m->engram_table_base)) {
    snprintf(err, err_len, "model.engram: the prime rule failed for table_base %lld", (long long)m->engram_table_base);
    return CEDAR_EINVAL;
  }
  M->cmap = malloc(sizeof(int32_t) * (size_t)m->vocab);
  if (!M->cmap) return CEDAR_ENOMEM;
  op_engram_cmap_modulo(M->cmap, m->vocab, m->engram_compressed_vocab);
  M->cmap_source = "id mod compressed_vocab (no tokenizer)";
  return 0;
}

int rt_model_init(struct rt_model *M, const struct plan *p, const struct weights *w, char *err, size_t err_len) {
  const struct plan_model *m = &p->model;
  memset(M, 0, sizeof(*M));
  if (m->rope_swa.yarn_mscale || m->rope_csa.yarn_mscale) { /* a plan key the ops never apply: refuse, not ignore */
    snprintf(err, err_len, "model.rope.%s.yarn_mscale: true is not implemented (the vendor's value is false, SPEC "
             "1.1); set yarn_mscale: false", m->rope_swa.yarn_mscale ? "swa" : "csa");
    return CEDAR_EUNSUPPORTED;
  }
  op_blas_init(); /* one BLAS thread: parallelism comes from the graph (ops/basic.h) */
  M->p = p;
  M->w = w;
  M->eps = (float)m->norm_eps;
  M->tau = (float)plan_softmax_scale(p);
  M->idx_scale = op_index_weight_scale(m->idx_heads, m->idx_head_dim);
  M->swa_fmt = plan_kv_format(m, &m->swa);
  M->swa_bytes = op_kv_bytes(&M->swa_fmt, m->head_dim);
  M->mhc = (struct op_mhc_cfg){m->hc_streams, m->hidden, m->hc_sinkhorn_iters, (float)m->hc_eps, M->eps};
  M->moe = (struct op_moe_cfg){
      .hidden = m->hidden,
      .n_routed = m->n_routed,
      .n_active = m->n_active,
      .inter = m->moe_inter,
      .n_shared = m->n_shared,
      .shared_inter = m->shared_inter,
      .score = m->moe_score == PLAN_SCORE_SOFTMAX   ? OP_MOE_SOFTMAX
               : m->moe_score == PLAN_SCORE_SIGMOID ? OP_MOE_SIGMOID
                                                    : OP_MOE_SQRTSOFTPLUS,
      .norm_topk = m->moe_norm_topk,
      .route_scale = (float)m->route_scale,
      .limit = (float)m->swiglu_limit,
      .shared_mxfp8 = m->num_lin_mxfp8 ? RT_MXFP8_BLOCK : 0, /* the shared expert's weights are FP8 */
  };
  if (op_rope_init_params(&M->rope_swa, m->head_dim, m->rope_dim, true, &m->rope_swa) ||
      op_rope_init_params(&M->rope_csa, m->head_dim, m->rope_dim, true, &m->rope_csa) ||
      op_rope_init_params(&M->rope_idx, m->idx_head_dim, m->idx_rope_dim, m->idx_rope_last, &m->rope_csa)) {
    snprintf(err, err_len, "model.attention: RoPE parameters the op cannot take (rope_dim %d of %d, indexer %d of %d)",
             m->rope_dim, m->head_dim, m->idx_rope_dim, m->idx_head_dim);
    return CEDAR_EUNSUPPORTED;
  }
  if (m->heads % m->o_groups) {
    snprintf(err, err_len, "model.attention: heads %d is not a multiple of o_groups %d", m->heads, m->o_groups);
    return CEDAR_EUNSUPPORTED;
  }
  int rc = init_engram(M, err, err_len);
  if (rc) {
    rt_model_free(M);
    return rc;
  }
  M->embed = need_qw(w, -1, "embed");
  M->norm = need(w, -1, "norm");
  M->lm_head = need_qw(w, -1, "lm_head");
  if (m->hc_merge == PLAN_MERGE_LEARNED) {
    M->head_fn = need(w, -1, "head.hc.fn");
    M->head_scale = need(w, -1, "head.hc.scale");
    M->head_base = need(w, -1, "head.hc.base");
  }
  M->L = calloc((size_t)p->n_layers, sizeof(*M->L));
  if (!M->L) {
    rt_model_free(M);
    return CEDAR_ENOMEM;
  }
  M->first_dec = p->n_layers;
  int module = 0;
  for (int l = 0; l < p->n_layers; l++) {
    if (p->layer[l].region == PLAN_DECODER && M->first_dec == p->n_layers) M->first_dec = l;
    bind_layer(M, l, &module);
  }
  return 0;
}

void rt_model_free(struct rt_model *M) {
  if (M->eng.prime) op_engram_tables_free(&M->eng);
  free(M->cmap);
  free(M->L);
  memset(M, 0, sizeof(*M));
}

/* ---- mHC around a sublayer (docs/model.md s2) ---------------------------- */

struct mhc_step {
  float *u, *post, *C;
  int k, l; /* sublayer (0 attention, 1 MoE) and layer, for the round trace */
  int64_t a;
};

/* Coefficients of sublayer k of layer l from its own fn on the state X
 * (own pre, post, C); the sublayer input u = sum_i pre[i] X_i with pre the
 * carried one from the tile buffer (pairing v41) or, with GRAPH_F_RESTART,
 * its own (v4); then, with GRAPH_F_PRE_NEXT, its own pre carried on in the
 * buffer for the next sublayer (or the head). */
static struct mhc_step mhc_begin(const struct rt_model *M, const struct graph_node *nd, int k, const float *X,
                                 float *pre, int n, struct rt_arena *ar) {
  const struct rt_layer *L = &M->L[nd->layer];
  int hc = M->mhc.hc, d = M->mhc.hidden, rows = op_mhc_rows(hc);
  struct mhc_step s = {.k = k, .l = nd->layer, .a = nd->a};
  s.post = RT_ALLOC(ar, float, (size_t)n * hc);
  s.C = RT_ALLOC(ar, float, (size_t)n * hc * hc);
  s.u = RT_ALLOC(ar, float, (size_t)n * d);
  float *own = RT_ALLOC(ar, float, (size_t)n * hc);
  float *dots = RT_ALLOC(ar, float, (size_t)n * rows);
  float *sumsq = RT_ALLOC(ar, float, n);
  RT_TIMED(ar, MHC, op_mhc_coeffs(own, s.post, s.C, dots, sumsq, X, L->hc_fn[k], L->hc_scale[k], L->hc_base[k], n, &M->mhc));
  RT_TIMED(ar, MHC, op_mhc_mix(s.u, X, (nd->flags & GRAPH_F_RESTART) ? own : pre, n, hc, d));
  round_io(M, s.u, n, k ? "ffn.u" : "attn.u", nd->layer, nd->a);
  if (nd->flags & GRAPH_F_PRE_NEXT) memcpy(pre, own, sizeof(float) * (size_t)n * hc);
  return s;
}

/* X = sum_i C[i][j] X_i + post[j] y, in place. */
static void mhc_end(const struct rt_model *M, float *X, const struct mhc_step *s, const float *y, int n,
                    struct rt_arena *ar) {
  RT_TIMED(ar, MHC, op_mhc_update_inplace(X, s->C, s->post, y, n, M->mhc.hc, M->mhc.hidden));
  round_x(M, X, n, s->k ? "ffn.x" : "attn.x", s->l);
}

/* ---- embed, Engram (docs/model.md s1, s5) -------------------------------- */

int rt_embed_rows(const struct rt_model *M, float *h, const int32_t *tok, int n) {
  const struct plan_model *m = &M->p->model;
  if (M->embed.fmt == OP_W_F32) return op_embed(h, M->embed.data, tok, n, m->hidden, m->vocab);
  for (int i = 0; i < n; i++) { /* one row of the stored table, decoded as op_qweight_dequant decodes it */
    if (tok[i] < 0 || tok[i] >= m->vocab) return i;
    struct op_qweight row = op_qweight_rows(&M->embed, tok[i], 1);
    op_qweight_dequant(h + (size_t)i * m->hidden, &row);
  }
  return -1;
}

void rt_embed(const struct rt_model *M, float *X, float *pre, const int32_t *tok, int n, struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  float *h = RT_ALLOC(ar, float, (size_t)n * m->hidden);
  int bad = rt_embed_rows(M, h, tok, n);
  CEDAR_ASSERT_MSG(bad < 0, "token id %d at %d is outside the vocabulary (ids are checked before a run)",
                   bad >= 0 ? tok[bad] : 0, bad);
  op_mhc_expand(X, h, n, m->hc_streams, m->hidden);
  round_x(M, X, n, NULL, 0); /* embedding rows: exact */
  memset(pre, 0, sizeof(float) * (size_t)n * m->hc_streams); /* the one-hot start (1, 0, ..., 0) */
  for (int i = 0; i < n; i++) pre[(size_t)i * m->hc_streams] = 1.0f;
}

void rt_engram_rows(const struct rt_model *M, int l, float *e, const struct rt_request *r, int64_t a, int n,
                    struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  const struct rt_layer *L = &M->L[l];
  int hist = (int)(a < M->e_max_order - 1 ? a : M->e_max_order - 1);
  CEDAR_ASSERT(a + n <= r->n_tokens);
  int64_t *rows = RT_ALLOC(ar, int64_t, (size_t)n * M->e_tables), bad;
  RT_TIMED(ar, ENGRAM, bad = op_engram_hash(rows, r->tokens + a - hist, NULL, M->cmap, L->e_mult, m->engram_orders,
                           op_engram_primes_of(&M->eng, L->e_module), op_engram_offsets_of(&M->eng, L->e_module),
                           hist, n, m->vocab, m->engram_n_orders, m->engram_heads, M->cmap[m->engram_pad_id]));
  CEDAR_ASSERT(bad < 0);
  struct rt_engram_view v = {L->e_table, L->e_scales, L->e_rows, m->engram_head_dim, WEIGHTS_ENGRAM_BLOCK};
  if (M->p->serving.engram_tier == PLAN_ENGRAM_TIER_MMAP) /* the prefetch faults the rows in here, not the layer */
    rt_engram_willneed(&v, rows, n * M->e_tables);
  RT_TIMED(ar, ENGRAM, rt_engram_gather(e, &v, rows, n, M->e_tables));
}

void rt_engram_inject(const struct rt_model *M, int l, float *X, const float *e, int n, struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  const struct rt_layer *L = &M->L[l];
  int hc = m->hc_streams, d = m->hidden, de = M->e_tables * m->engram_head_dim;
  float *kv = RT_ALLOC(ar, float, (size_t)n * (hc + 1) * d);
  const float *eq = lin_in(M, e, n, de, ar, NULL, l, -1); /* engram.wkv is FP8; its rows are exact */
  RT_TIMED(ar, ENGRAM, op_engram_inject_q(X, kv, NULL, eq, &L->e_wkv, L->e_qw, L->e_kw, n, d, hc, M->eps, RT_ENGRAM_DOT_FLOOR));
  round_x(M, X, n, "engram.x", l);
}

/* ---- attention (docs/model.md s3) ---------------------------------------- */

/* A verify step's projected rows (op_compress leaves v, then g, at the start
 * of its scratch) into the source's log, for speculate.c's rollback. */
static void log_rows(struct rt_tail_log *lg, const float *v, const float *g, int64_t a, int n) {
  for (int i = 0; i < n; i++) {
    int64_t k = a + i - lg->a0;
    if (k < 0 || k >= lg->cap) continue;
    memcpy(lg->v + (size_t)k * lg->d, v + (size_t)i * lg->d, sizeof(float) * (size_t)lg->d);
    if (g && lg->g) memcpy(lg->g + (size_t)k * lg->d, g + (size_t)i * lg->d, sizeof(float) * (size_t)lg->d);
  }
}

/* Compress the tile's attention inputs into entries and append them to
 * source l (s3.1). */
static int append_entries(const struct rt_model *M, const struct rt_bound *st, int l, const float *a_in, int64_t a,
                          int n, const struct op_rope_angles *ang, struct rt_arena *ar) {
  const struct rt_layer *L = &M->L[l];
  struct rt_kv_seq *seq = st->kv_w;
  struct op_comp_tail *tail = st->tail;
  CEDAR_ASSERT(seq && tail);
  int emit = op_comp_n_emit(tail, n);
  size_t eb = seq->pool->entry_bytes;
  struct op_comp_out out = {
      .entries = RT_ALLOC(ar, uint8_t, (size_t)(emit ? emit : 1) * eb),
      .entry_bytes = eb,
      .main_off = 0,
      .idx_off = seq->pool->main_bytes,
      .max_entries = emit,
  };
  const struct op_comp_layer *C = &L->comp;
  float *scratch = RT_ALLOC(ar, float, op_comp_scratch_floats(n, C->ratio, C->d, C->idx_dim));
  int got;
  if (ang && !op_rope_same_angles(C->rope, ang->rope)) ang = NULL; /* other frequencies: computed per entry */
  RT_TIMED(ar, COMPRESS, got = op_compress(&out, tail, scratch, a_in, a, n, C, ang));
  if (st->tail_log) log_rows(st->tail_log, scratch, C->ratio > 1 ? scratch + (size_t)n * C->d : NULL, a, n);
  CEDAR_ASSERT_MSG(got == emit, "layer %d: compressor emitted %d entries, expected %d (tail at %lld + %d, tile at %lld)",
                   l, got, emit, (long long)tail->pos0, tail->count, (long long)a);
  int rc = emit ? rt_kv_append(seq, out.entries, emit) : 0;
  CEDAR_ASSERT_MSG(rc || seq->n_entries == st->kv_w_end, "layer %d: %lld entries after the tile at %lld, the graph "
                   "declared %lld", l, (long long)seq->n_entries, (long long)a, (long long)st->kv_w_end);
  return rc;
}

/* The Top-K this layer attends with: rt__select_topk (model_topk.c). */

/* The SWA entries a tile sees: the ring as it was, then the tile's own
 * entries (a tile may be longer than the window), as one view. */
static struct op_swa_view swa_view(const struct rt_model *M, const struct rt_ring *g, const float *kS,
                                   const int64_t *pos, int n, struct rt_arena *ar, uint8_t **fresh) {
  const struct plan_model *m = &M->p->model;
  size_t eb = g->entry_bytes;
  int slots = g->window + n;
  uint8_t *buf = RT_ALLOC(ar, uint8_t, (size_t)slots * eb);
  int64_t *spos = RT_ALLOC(ar, int64_t, slots);
  /* The ring's slots in position order (empty slots last), so a query visits
   * its window oldest first whether its newer neighbours sit in the ring
   * (one-row decode) or in this tile's fresh rows (a verify step): the same
   * entries in the same order give the same bits (docs/speculative.md). */
  int *ord = RT_ALLOC(ar, int, g->window);
  for (int s = 0; s < g->window; s++) { /* insertion sort of slot ids by position: the ring is a rotation, cheap */
    int64_t ps = g->pos[s] < 0 ? INT64_MAX : g->pos[s];
    int j = s;
    for (; j > 0 && (g->pos[ord[j - 1]] < 0 ? INT64_MAX : g->pos[ord[j - 1]]) > ps; j--) ord[j] = ord[j - 1];
    ord[j] = s;
  }
  for (int j = 0; j < g->window; j++) {
    spos[j] = g->pos[ord[j]];
    memcpy(buf + (size_t)j * eb, g->slot + (size_t)ord[j] * eb, eb);
  }
  *fresh = buf + (size_t)g->window * eb;
  RT_TIMED(ar, QKV, op_swa_pack(*fresh, kS, n, m->head_dim, &M->swa_fmt, eb));
  memcpy(spos + g->window, pos, sizeof(int64_t) * (size_t)n);
  return (struct op_swa_view){buf, spos, slots, eb, m->head_dim, M->swa_fmt};
}

/* Tables of dequantized entries bigger than this fall back to the packed
 * path (one tile's union of selections at very long contexts). */
#define RT_ATTN_TABLE_MAX_BYTES ((size_t)256 << 20)

/* Sparse attention of one tile. Each distinct global entry the tile's
 * queries selected, and each visible SWA slot, is dequantized ONCE into an
 * fp32 table (not once per query that reads it); op_sparse_attn_f32 then
 * visits the same entries in the same order with the same values as
 * op_sparse_attn on the packed caches (ops/attention.h: one core, entries
 * copied instead of unpacked), so the result is bitwise the same. */
static void attend_tile(const struct rt_model *M, float *o, const float *q, const int64_t *pos, const int32_t *topk,
                        const struct op_kv_view *kv, const struct op_swa_view *sv, int n,
                        const struct op_attn_params *pr, struct rt_arena *ar) {
  const int d = M->p->model.head_dim, K = pr->topk;
  int32_t *idx = NULL, u = 0;
  float *gkv = NULL;
  if (topk) {
    int64_t ne = kv->n_entries;
    int32_t *slot_of = RT_ALLOC(ar, int32_t, ne ? ne : 1);
    memset(slot_of, 0xff, sizeof(int32_t) * (size_t)(ne ? ne : 1));
    idx = RT_ALLOC(ar, int32_t, (size_t)n * K);
    for (size_t i = 0; i < (size_t)n * K; i++) {
      int32_t e = topk[i];
      if (e < 0 || e >= ne) {
        idx[i] = -1;
        continue;
      }
      if (slot_of[e] < 0) slot_of[e] = u++;
      idx[i] = slot_of[e];
    }
    if ((size_t)u * d * sizeof(float) > RT_ATTN_TABLE_MAX_BYTES) {
      op_sparse_attn(o, NULL, q, pos, topk, kv, sv, n, pr);
      return;
    }
    gkv = RT_ALLOC(ar, float, (size_t)(u ? u : 1) * d);
    for (int64_t e = 0; e < ne; e++)
      if (slot_of[e] >= 0)
        op_kv_unpack(&kv->main_fmt, gkv + (size_t)slot_of[e] * d, op_kv_entry(kv, e) + kv->main_off, kv->main_w);
  }
  float *skv = RT_ALLOC(ar, float, (size_t)sv->n_slots * d);
  for (int s = 0; s < sv->n_slots; s++)
    if (sv->pos[s] >= 0) op_kv_unpack(&sv->fmt, skv + (size_t)s * d, sv->slots + (size_t)s * sv->entry_bytes, sv->w);
  op_sparse_attn_f32(o, NULL, q, pos, idx, gkv, u, skv, sv->pos, sv->n_slots, n, pr);
}

/* The grouped output projection (s3): op_grouped_oproj, or with MXFP8
 * inputs (wo_a and wo_b are FP8) the same two stages with o and z quantized. */
static void oproj(const struct rt_model *M, float *y, float *z, float *o, const struct rt_layer *L, int n, int l,
                  int64_t a) {
  const struct plan_model *m = &M->p->model;
  const int d = m->hidden, G = m->o_groups, R = m->o_rank, hd = m->heads * m->head_dim, gw = hd / G;
  if (!m->num_lin_mxfp8) {
    op_grouped_oproj_q(y, z, o, &L->wo_a, &L->wo_b, n, m->heads, m->head_dim, G);
    return;
  }
  op_mxfp8_qdq(o, n, hd, hd, RT_MXFP8_BLOCK); /* blocks of 32 inside a group when 32 divides its width */
  rt_rtrace_f32("attn.o", l, a, n, hd, hd, o);
  for (int g = 0; g < G; g++) {
    struct op_qweight wg = op_qweight_rows(&L->wo_a, g * R, R);
    op_qlinear(z + (size_t)g * R, o + (size_t)g * gw, &wg, n, hd, G * R);
  }
  op_mxfp8_qdq(z, n, G * R, G * R, RT_MXFP8_BLOCK);
  rt_rtrace_f32("attn.z", l, a, n, G * R, G * R, z);
  op_qlinear(y, z, &L->wo_b, n, G * R, d);
}

int rt_attn(const struct rt_model *M, const struct graph_node *nd, float *X, float *pre, const struct rt_buses *b,
            const struct rt_bound *st, struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  const int l = nd->layer, n = nd->n, d = m->hidden, hd = m->heads * m->head_dim;
  const struct rt_layer *L = &M->L[l];
  struct rt_ring *ring = st->ring;
  CEDAR_ASSERT(ring);
  struct mhc_step s = mhc_begin(M, nd, 0, X, pre, n, ar);

  float *a_in = RT_ALLOC(ar, float, (size_t)n * d);
  RT_TIMED(ar, OTHER, op_rmsnorm(a_in, s.u, L->attn_norm, n, d, M->eps));
  round_io(M, a_in, n, "attn.a", l, nd->a);
  const float *a_q = lin_in(M, a_in, n, d, ar, NULL, l, nd->a); /* wq_a and wkv are FP8; the BF16 ones read a_in */
  int64_t *pos = RT_ALLOC(ar, int64_t, n);
  for (int i = 0; i < n; i++) pos[i] = nd->a + i;
  /* The tile's RoPE angles, once for q, kS, the attention's inverse and,
   * where the frequencies agree, qI and the compressed entries (ops/rope.h). */
  struct op_rope_angles ang;
  float *abuf = RT_ALLOC(ar, float, op_rope_angles_floats(L->rope, n) + 1);
  RT_TIMED(ar, QKV, op_rope_angles_init(&ang, abuf, L->rope, pos, n));
  float *cq = RT_ALLOC(ar, float, (size_t)n * m->q_rank);
  float *q = RT_ALLOC(ar, float, (size_t)n * hd);
  RT_TIMED(ar, QKV, op_q_latent_q(cq, a_q, &L->wq_a, L->q_norm, n, M->eps));
  const float *cq_q = lin_in(M, cq, n, m->q_rank, ar, "attn.cq", l, nd->a); /* wq_b and indexer.wq_b are FP8 */
  RT_TIMED(ar, QKV, op_q_main_q(q, cq_q, &L->wq_b, &ang, L->rope, n, m->heads, m->head_dim, m->q_head_norm, M->eps));
  float *kS = RT_ALLOC(ar, float, (size_t)n * m->head_dim);
  RT_TIMED(ar, QKV, op_swa_kv_q(kS, a_q, &L->wkv, L->kv_norm, &ang, L->rope, n, M->eps));
  if (nd->flags & GRAPH_F_RING_RESET) rt_ring_reset(ring, nd->r0);
  if (nd->r0 > ring->r0) ring->r0 = nd->r0;
  uint8_t *fresh;
  struct op_swa_view sv = swa_view(M, ring, kS, pos, n, ar, &fresh);
  rt_rtrace_u8("attn.swa", l, nd->a, n, (int)ring->entry_bytes, fresh);

  if (nd->flags & GRAPH_F_WRITE_KV) {
    int rc = append_entries(M, st, l, a_in, nd->a, n, &ang, ar);
    if (rc) return rc;
  }
  struct op_kv_view kv;
  const int32_t *topk = NULL;
  if (st->kv_r) { /* the entries the graph lets this node see, from the pages it was handed */
    kv = rt_kv_view(st->kv_r);
    CEDAR_ASSERT_MSG(kv.n_entries >= st->kv_r_end, "%s: %lld entries committed, the graph declared %lld", nd->name,
                     (long long)kv.n_entries, (long long)st->kv_r_end);
    kv.n_entries = st->kv_r_end;
    if (st->kv_r_pages) kv.pages = st->kv_r_pages;
    topk = rt__select_topk(M, nd, a_in, cq_q, pos, &ang, &kv, st, b, ar);
  }
  struct op_attn_params pr = {
      .heads = m->heads,
      .head_dim = m->head_dim,
      .topk = topk ? m->topk : 0,
      .window = m->window,
      .r0 = ring->r0,
      .tau = M->tau,
      .sink = L->sink,
      .rope = L->rope,
      .angles = &ang,
  };
  float *o = RT_ALLOC(ar, float, (size_t)n * hd);
  RT_TIMED(ar, ATTENTION, attend_tile(M, o, q, pos, topk, topk ? &kv : NULL, &sv, n, &pr, ar));
  float *y = RT_ALLOC(ar, float, (size_t)n * d);
  float *z = RT_ALLOC(ar, float, (size_t)n * m->o_groups * m->o_rank);
  RT_TIMED(ar, OPROJ, oproj(M, y, z, o, L, n, l, nd->a));
  round_io(M, y, n, "attn.y", l, nd->a);
  for (int i = 0; i < n; i++) rt_ring_put(ring, pos[i], fresh + (size_t)i * ring->entry_bytes);
  mhc_end(M, X, &s, y, n, ar);
  return 0;
}

/* Batched decode attention: B requests, one position each. The row-wise
 * parts run once over the B rows (mHC, norm, q, kS, the output projection:
 * GEMMs over M = B), the per-request parts on each request's own state
 * exactly as rt_attn runs a one-position tile (the same numerics rounding
 * points, model.numerics): its ring, its compressor tail
 * and KV append, its Top-K over its own entries, its sparse attention. With
 * row-invariant ops (each row's bits independent of the rows beside it)
 * row i is bitwise what rt_attn gives request i alone. */
void rt_attn_rows(const struct rt_model *M, const struct graph_node *const *nds, int B, float *X, float *pre,
                  const struct rt_buses *b, const struct rt_bound *st, int *rc, struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  const int l = nds[0]->layer, d = m->hidden, hd = m->heads * m->head_dim;
  const struct rt_layer *L = &M->L[l];
  struct graph_node rows = *nds[0];
  rows.n = B;
  struct mhc_step s = mhc_begin(M, &rows, 0, X, pre, B, ar);
  float *a_in = RT_ALLOC(ar, float, (size_t)B * d);
  RT_TIMED(ar, OTHER, op_rmsnorm(a_in, s.u, L->attn_norm, B, d, M->eps));
  round_io(M, a_in, B, NULL, l, 0); /* batched rows are not traced (round_trace.h) */
  const float *a_q = lin_in(M, a_in, B, d, ar, NULL, l, 0); /* as rt_attn: wq_a and wkv are FP8 */
  int64_t *pos = RT_ALLOC(ar, int64_t, B);
  for (int i = 0; i < B; i++) pos[i] = nds[i]->a;
  struct op_rope_angles ang;
  float *abuf = RT_ALLOC(ar, float, op_rope_angles_floats(L->rope, B) + 1);
  RT_TIMED(ar, QKV, op_rope_angles_init(&ang, abuf, L->rope, pos, B));
  float *cq = RT_ALLOC(ar, float, (size_t)B * m->q_rank);
  float *q = RT_ALLOC(ar, float, (size_t)B * hd);
  RT_TIMED(ar, QKV, op_q_latent_q(cq, a_q, &L->wq_a, L->q_norm, B, M->eps));
  const float *cq_q = lin_in(M, cq, B, m->q_rank, ar, NULL, l, 0);
  RT_TIMED(ar, QKV, op_q_main_q(q, cq_q, &L->wq_b, &ang, L->rope, B, m->heads, m->head_dim, m->q_head_norm, M->eps));
  float *kS = RT_ALLOC(ar, float, (size_t)B * m->head_dim);
  RT_TIMED(ar, QKV, op_swa_kv_q(kS, a_q, &L->wkv, L->kv_norm, &ang, L->rope, B, M->eps));
  float *o = RT_ALLOC(ar, float, (size_t)B * hd);
  uint8_t **fresh = RT_ALLOC(ar, uint8_t *, B);
  const size_t half = (size_t)(L->rope->rope_dim / 2);
  for (int i = 0; i < B; i++) {
    const struct graph_node *nd = nds[i];
    struct rt_ring *ring = st[i].ring;
    CEDAR_ASSERT(ring && nd->n == 1 && nd->layer == l);
    rc[i] = 0;
    /* row i's angles, as a one-row table (what rt_attn builds for it alone) */
    struct op_rope_angles ai = {L->rope, pos + i, 1, ang.cs + i * half, ang.sn + i * half};
    if (nd->flags & GRAPH_F_RING_RESET) rt_ring_reset(ring, nd->r0);
    if (nd->r0 > ring->r0) ring->r0 = nd->r0;
    struct op_swa_view sv = swa_view(M, ring, kS + (size_t)i * m->head_dim, pos + i, 1, ar, &fresh[i]);
    if ((nd->flags & GRAPH_F_WRITE_KV) && (rc[i] = append_entries(M, &st[i], l, a_in + (size_t)i * d, nd->a, 1, &ai, ar)))
      continue;
    struct op_kv_view kv;
    const int32_t *topk = NULL;
    if (st[i].kv_r) {
      kv = rt_kv_view(st[i].kv_r);
      CEDAR_ASSERT_MSG(kv.n_entries >= st[i].kv_r_end, "%s: %lld entries committed, the graph declared %lld", nd->name,
                       (long long)kv.n_entries, (long long)st[i].kv_r_end);
      kv.n_entries = st[i].kv_r_end;
      if (st[i].kv_r_pages) kv.pages = st[i].kv_r_pages;
      topk = rt__select_topk(M, nd, a_in + (size_t)i * d, cq_q + (size_t)i * m->q_rank, pos + i, &ai, &kv, &st[i], &b[i],
                         ar);
    }
    struct op_attn_params pr = {
        .heads = m->heads,
        .head_dim = m->head_dim,
        .topk = topk ? m->topk : 0,
        .window = m->window,
        .r0 = ring->r0,
        .tau = M->tau,
        .sink = L->sink,
        .rope = L->rope,
        .angles = &ai,
    };
    RT_TIMED(ar, ATTENTION, attend_tile(M, o + (size_t)i * hd, q + (size_t)i * hd, pos + i, topk, topk ? &kv : NULL,
                                        &sv, 1, &pr, ar));
  }
  float *y = RT_ALLOC(ar, float, (size_t)B * d);
  float *z = RT_ALLOC(ar, float, (size_t)B * m->o_groups * m->o_rank);
  RT_TIMED(ar, OPROJ, oproj(M, y, z, o, L, B, l, 0));
  round_io(M, y, B, NULL, l, 0);
  for (int i = 0; i < B; i++)
    if (!rc[i]) rt_ring_put(st[i].ring, pos[i], fresh[i]);
  mhc_end(M, X, &s, y, B, ar);
}

/* ---- MoE (docs/model.md s4) ---------------------------------------------- */

/* The shared expert's two MXFP8 inputs (x, then the SwiGLU hidden), seen
 * through op_qdq_tap while the round trace records. */
struct moe_tap {
  int l;
  int64_t a;
  int calls;
};
static void moe_tap(void *ctx, const float *x, int rows, int cols, int ld) {
  struct moe_tap *t = ctx;
  rt_rtrace_f32(t->calls++ ? "ffn.sh" : "ffn.sx", t->l, t->a, rows, cols, ld, x);
}

/* The MoE sublayer's input x (ffn_norm of the mHC mix) and its mHC step. */
static struct mhc_step moe_in(const struct rt_model *M, const struct graph_node *nd, float *X, float *pre, float *x,
                              struct rt_arena *ar) {
  struct mhc_step s = mhc_begin(M, nd, 1, X, pre, nd->n, ar);
  RT_TIMED(ar, OTHER, op_rmsnorm(x, s.u, M->L[nd->layer].ffn_norm, nd->n, M->p->model.hidden, M->eps));
  round_io(M, x, nd->n, "ffn.a", nd->layer, nd->a);
  return s;
}

void rt_moe_finish(const struct rt_model *M, const struct graph_node *nd, float *X, const float *post,
                   const float *C, float *y, const int32_t *sel, struct rt_arena *ar) {
  const int n = nd->n, k = M->p->model.n_active;
  struct mhc_step s = {.k = 1, .l = nd->layer, .a = nd->a, .post = (float *)post, .C = (float *)C};
  rt_rtrace_i32("ffn.sel", nd->layer, nd->a, n, k, sel);
  round_io(M, y, n, "ffn.y", nd->layer, nd->a);
  unsigned char *hit = RT_ALLOC(ar, unsigned char, M->moe.n_routed);
  memset(hit, 0, (size_t)M->moe.n_routed);
  for (int i = 0; i < n * k; i++) ar->experts += !hit[sel[i]], hit[sel[i]] = 1;
  mhc_end(M, X, &s, y, n, ar);
}

void rt_moe_route(const struct rt_model *M, const struct graph_node *nd, float *X, float *pre, float *x, float *y,
                  int32_t *sel, float *wt, float *post, float *C, struct rt_arena *ar) {
  const int n = nd->n, hc = M->mhc.hc;
  struct mhc_step s = moe_in(M, nd, X, pre, x, ar);
  memcpy(post, s.post, sizeof(float) * (size_t)n * hc);
  memcpy(C, s.C, sizeof(float) * (size_t)n * hc * hc);
  struct moe_tap tap = {nd->layer, nd->a, 0};
  if (rt_rtrace_on()) op_qdq_tap = (struct op_qdq_tap){moe_tap, &tap}; /* the shared expert's MXFP8 inputs */
  const struct op_moe_weights *w = &M->L[nd->layer].moe;
  void *ws = rt_arena_alloc(ar, op_moe_workspace_bytes(n, &M->moe));
  float *scores = RT_ALLOC(ar, float, (size_t)n * M->moe.n_routed); /* op_moe_forward's steps, one by one */
  RT_TIMED(ar, MOE, op_moe_scores_q(scores, x, &w->q.router, n, &M->moe);
           op_moe_select(sel, wt, scores, w->bias, NULL, n, &M->moe); op_moe_shared(y, x, w, n, &M->moe, ws));
  op_qdq_tap.fn = NULL;
}

int rt_moe(const struct rt_model *M, const struct graph_node *nd, float *X, float *pre, struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  const int n = nd->n, d = m->hidden;
  float *x = RT_ALLOC(ar, float, (size_t)n * d), *y = RT_ALLOC(ar, float, (size_t)n * d);
  int32_t *sel = RT_ALLOC(ar, int32_t, (size_t)n * m->n_active);
  float *wt = RT_ALLOC(ar, float, (size_t)n * m->n_active);
  struct mhc_step s = moe_in(M, nd, X, pre, x, ar);
  struct moe_tap tap = {nd->layer, nd->a, 0};
  if (rt_rtrace_on()) op_qdq_tap = (struct op_qdq_tap){moe_tap, &tap}; /* the shared expert's MXFP8 inputs */
  void *ws = rt_arena_alloc(ar, op_moe_workspace_bytes(n, &M->moe));
  RT_TIMED(ar, MOE, op_moe_forward(y, sel, wt, x, &M->L[nd->layer].moe, NULL, n, &M->moe, ws));
  op_qdq_tap.fn = NULL;
  rt_moe_finish(M, nd, X, s.post, s.C, y, sel, ar);
  return 0;
}

/* ---- decoder global from the encoder output (docs/model.md s3.1) -------- */

int rt_dec_kv(const struct rt_model *M, const struct rt_bound *st, int l, const float *XE, const float *carried,
              int64_t a, int n, struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  const struct rt_layer *L = &M->L[l];
  int hc = m->hc_streams, d = m->hidden;
  float *u = RT_ALLOC(ar, float, (size_t)n * d);
  const float *pre = carried;
  if (m->hc_pairing == PLAN_PAIRING_V4) { /* the layer's own pre from X^E */
    float *own = RT_ALLOC(ar, float, (size_t)n * hc), *post = RT_ALLOC(ar, float, (size_t)n * hc);
    float *C = RT_ALLOC(ar, float, (size_t)n * hc * hc), *dots = RT_ALLOC(ar, float, (size_t)n * op_mhc_rows(hc));
    float *sumsq = RT_ALLOC(ar, float, n);
    RT_TIMED(ar, MHC, op_mhc_coeffs(own, post, C, dots, sumsq, XE, L->hc_fn[0], L->hc_scale[0], L->hc_base[0], n, &M->mhc));
    pre = own;
  }
  RT_TIMED(ar, MHC, op_mhc_mix(u, XE, pre, n, hc, d));
  round_io(M, u, n, "dec.u", l, a);
  float *a_enc = RT_ALLOC(ar, float, (size_t)n * d);
  op_rmsnorm(a_enc, u, L->attn_norm, n, d, M->eps);
  round_io(M, a_enc, n, "dec.a", l, a);
  return append_entries(M, st, l, a_enc, a, n, NULL, ar); /* its one user computes its own angles */
}

/* ---- head (docs/model.md s1, s2) ------------------------------------------ */

void rt_head(const struct rt_model *M, float *logits, const float *X, const float *carried, int n,
             struct rt_arena *ar) {
  const struct plan_model *m = &M->p->model;
  int hc = m->hc_streams, d = m->hidden;
  float *h = RT_ALLOC(ar, float, (size_t)n * d), *pre = RT_ALLOC(ar, float, (size_t)n * hc);
  double t0 = rt_clock();
  if (m->hc_merge == PLAN_MERGE_CARRIED) { /* the last FFN's own pre (Appendix V #4) */
    CEDAR_ASSERT(carried);
    op_mhc_mix(h, X, carried, n, hc, d);
  } else if (M->head_fn) {
    op_mhc_merge(h, pre, X, M->head_fn, M->head_scale[0], M->head_base, n, &M->mhc);
  } else {
    for (int i = 0; i < n * hc; i++) pre[i] = 1.0f;
    op_mhc_mix(h, X, pre, n, hc, d);
  }
  round_io(M, h, n, "head.h", M->p->n_layers, -1);
  float *hn = RT_ALLOC(ar, float, (size_t)n * d);
  op_rmsnorm(hn, h, M->norm, n, d, M->eps);
  round_io(M, hn, n, "head.hn", M->p->n_layers, -1);
  op_qlinear(logits, hn, &M->lm_head, n, d, m->vocab);
  ar->fam_s[RT_FAM_HEAD] += rt_clock() - t0;
}
