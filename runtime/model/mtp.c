/* mtp.c: the DSpark drafter: binding, the capture of the target layers'
 * rows, one draft block, and the speculate.h drafter over it (mtp.h). */
#include "runtime/model/mtp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention.h"
#include "ops/basic.h"
#include "ops/dspark.h"
#include "ops/formats.h"
#include "ops/mhc.h"
#include "ops/qkv.h"
#include "ops/qlinear.h"
#include "ops/rope.h"
#include "base/check.h"

#define MTP_MXFP8_BLOCK 32 /* as runtime/model/model.c: values per E8M0 scale of an FP8 linear's input */

/* ---- binding ---------------------------------------------------------------- */

static const float *need(const struct weights *w, int k, const char *name) {
  char full[WEIGHTS_NAME_MAX];
  snprintf(full, sizeof full, "mtp.%d.%s", k, name);
  const float *t = weights_f32(w, full);
  CEDAR_ASSERT_MSG(t != NULL, "weights lack %s although they were checked against the plan", full);
  return t;
}

static struct op_qweight need_qw(const struct weights *w, int k, const char *name) {
  char full[WEIGHTS_NAME_MAX];
  snprintf(full, sizeof full, "mtp.%d.%s", k, name);
  struct op_qweight q = weights_qw(w, full);
  CEDAR_ASSERT_MSG(q.data != NULL, "weights lack %s although they were checked against the plan", full);
  return q;
}

int rt_mtp_init(struct rt_mtp *D, const struct rt_model *M, char *err, size_t err_len) {
  const struct plan_model *m = &M->p->model;
  memset(D, 0, sizeof *D);
  if (m->dspark_blocks < 1 || m->dspark_n_targets < 1) {
    snprintf(err, err_len, "plan '%s' has no DSpark drafter (model.dspark.blocks %d, %d target layers): "
             "--speculate mtp needs one (v41-mini and v41-flash have it)", M->p->name, m->dspark_blocks,
             m->dspark_n_targets);
    return CEDAR_EUNSUPPORTED;
  }
  if (m->dspark_blocks > 8 || m->dspark_n_targets > 8 || m->hc_pairing != PLAN_PAIRING_V41 ||
      m->hc_merge != PLAN_MERGE_CARRIED) {
    snprintf(err, err_len, "the DSpark drafter runs up to 8 blocks over up to 8 target layers with mHC pairing v41 "
             "and merge carried (Appendix V #24); plan '%s' has %d blocks, %d targets", M->p->name,
             m->dspark_blocks, m->dspark_n_targets);
    return CEDAR_EUNSUPPORTED;
  }
  D->M = M;
  D->blocks = m->dspark_blocks;
  D->B = m->dspark_draft;
  D->window = m->dspark_window;
  D->n_targets = m->dspark_n_targets;
  memcpy(D->targets, m->dspark_targets, sizeof(int) * (size_t)D->n_targets);
  D->rank = m->dspark_markov_rank;
  D->noise = m->dspark_noise_token;
  if (D->noise < 0 || D->noise >= m->vocab) {
    snprintf(err, err_len, "model.dspark.noise_token %d is outside the vocabulary of %d ids", D->noise, m->vocab);
    return CEDAR_EUNSUPPORTED;
  }
  const struct weights *w = M->w;
  static const char *const sub[2] = {"hc_attn", "hc_ffn"};
  for (int k = 0; k < D->blocks; k++) {
    struct rt_mtp_block *b = &D->blk[k];
    char name[32];
    b->attn_norm = need(w, k, "attn_norm");
    b->ffn_norm = need(w, k, "ffn_norm");
    for (int s = 0; s < 2; s++) {
      snprintf(name, sizeof name, "%s.fn", sub[s]), b->hc_fn[s] = need(w, k, name);
      snprintf(name, sizeof name, "%s.scale", sub[s]), b->hc_scale[s] = need(w, k, name);
      snprintf(name, sizeof name, "%s.base", sub[s]), b->hc_base[s] = need(w, k, name);
    }
    b->wq_a = need_qw(w, k, "attn.wq_a");
    b->q_norm = need(w, k, "attn.q_norm");
    b->wq_b = need_qw(w, k, "attn.wq_b");
    b->wkv = need_qw(w, k, "attn.wkv");
    b->kv_norm = need(w, k, "attn.kv_norm");
    b->sink = m->sink ? need(w, k, "attn.sink") : NULL;
    b->wo_a = need_qw(w, k, "attn.wo_a");
    b->wo_b = need_qw(w, k, "attn.wo_b");
    rt_bind_moe(w, "mtp", k, m->n_shared > 0, &b->moe);
  }
  int last = D->blocks - 1;
  D->main_proj = need_qw(w, 0, "main_proj");
  D->main_norm = need(w, 0, "main_norm");
  D->norm = need(w, last, "norm");
  D->mk_embed = need(w, last, "markov_head.embed");
  D->mk_head = need(w, last, "markov_head.head");
  D->conf = need(w, last, "confidence_head.proj");
  D->moe = M->moe;
  D->moe.n_routed = m->dspark_experts;
  D->moe.n_active = m->dspark_active;
  return 0;
}

/* ---- the capture ------------------------------------------------------------ */

int rt_mtp_cap_init(struct rt_mtp_cap *c, const struct plan *p) {
  const struct plan_model *m = &p->model;
  memset(c, 0, sizeof *c);
  c->n_targets = m->dspark_n_targets < 8 ? m->dspark_n_targets : 8;
  memcpy(c->targets, m->dspark_targets, sizeof(int) * (size_t)c->n_targets);
  c->d = m->hidden;
  c->cap = m->dspark_window + RT_MTP_SLACK;
  size_t slots = (size_t)c->cap;
  c->rows = malloc(sizeof(float) * slots * (size_t)c->n_targets * (size_t)c->d);
  c->tag = malloc(sizeof(int64_t) * slots * (size_t)c->n_targets);
  c->main = malloc(sizeof(float) * slots * (size_t)c->d);
  c->main_tag = malloc(sizeof(int64_t) * slots);
  if (!c->rows || !c->tag || !c->main || !c->main_tag) {
    rt_mtp_cap_free(c);
    return CEDAR_ENOMEM;
  }
  for (size_t i = 0; i < slots * (size_t)c->n_targets; i++) c->tag[i] = -1;
  for (size_t i = 0; i < slots; i++) c->main_tag[i] = -1;
  return 0;
}

void rt_mtp_cap_free(struct rt_mtp_cap *c) {
  free(c->rows);
  free(c->tag);
  free(c->main);
  free(c->main_tag);
  memset(c, 0, sizeof *c);
}

void rt_mtp_capture(struct rt_mtp_cap *c, int layer, int64_t a, int n, const float *X, int hc) {
  int t = 0;
  while (t < c->n_targets && c->targets[t] != layer) t++;
  if (t == c->n_targets) return;
  const int d = c->d;
  const float inv = 1.0f / (float)hc;
  for (int i = 0; i < n; i++) {
    int64_t p = a + i;
    int slot = (int)(p % c->cap);
    float *row = c->rows + ((size_t)slot * c->n_targets + t) * d;
    const float *x = X + (size_t)i * hc * d;
    for (int j = 0; j < d; j++) { /* mean over the streams, streams in order */
      float s = 0.0f;
      for (int k = 0; k < hc; k++) s += x[(size_t)k * d + j];
      row[j] = s * inv;
    }
    c->tag[(size_t)slot * c->n_targets + t] = p;
    c->main_tag[slot] = -1; /* its main row is stale */
  }
}

/* ---- numerics (as runtime/model/model.c: model.numerics) --------------------------- */

static void round_x(const struct rt_mtp *D, float *X, int n) {
  const struct plan_model *m = &D->M->p->model;
  if (m->num_act_bf16) op_bf16_round_n(X, (size_t)n * m->hc_streams * m->hidden);
}
static void round_io(const struct rt_mtp *D, float *x, size_t count) {
  if (D->M->p->model.num_io_bf16) op_bf16_round_n(x, count);
}
static const float *lin_in(const struct rt_mtp *D, const float *x, int rows, int cols, struct rt_arena *ar) {
  if (!D->M->p->model.num_lin_mxfp8) return x;
  float *q = RT_ALLOC(ar, float, (size_t)rows * cols);
  memcpy(q, x, sizeof(float) * (size_t)rows * cols);
  op_mxfp8_qdq(q, rows, cols, cols, MTP_MXFP8_BLOCK);
  return q;
}

/* ---- one draft block --------------------------------------------------------- */

/* Main rows of positions [lo, P) into out (n, d), computed once per captured row. */
static void main_rows(const struct rt_mtp *D, struct rt_mtp_cap *c, int64_t lo, int64_t P, float *out,
                      struct rt_arena *ar) {
  const int d = c->d, T = c->n_targets;
  for (int64_t p = lo; p < P; p++) {
    int slot = (int)(p % c->cap);
    if (c->main_tag[slot] != p) {
      const float *cat = lin_in(D, c->rows + (size_t)slot * T * d, 1, T * d, ar); /* main_proj is FP8 */
      float *mr = c->main + (size_t)slot * d;
      op_qlinear(mr, cat, &D->main_proj, 1, T * d, d);
      op_rmsnorm(mr, mr, D->main_norm, 1, d, D->M->eps);
      round_io(D, mr, (size_t)d);
      c->main_tag[slot] = p;
    }
    memcpy(out + (size_t)(p - lo) * d, c->main + (size_t)slot * d, sizeof(float) * (size_t)d);
  }
}

/* mHC around a sublayer: own pre, post, C of block b's sublayer s from X;
 * u = mix with the carried pre, which becomes the own one. */
static float *mhc_begin(const struct rt_mtp *D, const struct rt_mtp_block *b, int s, const float *X, float *pre,
                        float *post, float *C, int n, struct rt_arena *ar) {
  const struct op_mhc_cfg *mc = &D->M->mhc;
  int hc = mc->hc, d = mc->hidden;
  float *own = RT_ALLOC(ar, float, (size_t)n * hc), *dots = RT_ALLOC(ar, float, (size_t)n * op_mhc_rows(hc));
  float *sumsq = RT_ALLOC(ar, float, n), *u = RT_ALLOC(ar, float, (size_t)n * d);
  op_mhc_coeffs(own, post, C, dots, sumsq, X, b->hc_fn[s], b->hc_scale[s], b->hc_base[s], n, mc);
  op_mhc_mix(u, X, pre, n, hc, d);
  round_io(D, u, (size_t)n * d);
  memcpy(pre, own, sizeof(float) * (size_t)n * hc);
  return u;
}

/* The attention sublayer of block b over the main rows (nm at positions
 * mpos) and the B draft rows (positions dpos), every draft row seeing every
 * key. y (B, d). */
static void attend(const struct rt_mtp *D, const struct rt_mtp_block *b, float *y, const float *a_in,
                   const float *mainr, const int64_t *mpos, int nm, const int64_t *dpos, int B, struct rt_arena *ar) {
  const struct rt_model *M = D->M;
  const struct plan_model *m = &M->p->model;
  const int d = m->hidden, dh = m->head_dim, H = m->heads, hd = H * dh, nk = nm + B;
  const struct op_rope *rope = &M->rope_swa; /* window-only blocks: model.rope.swa (theta 10000) */
  struct op_rope_angles ad, am;
  float *bd = RT_ALLOC(ar, float, op_rope_angles_floats(rope, B) + 1);
  float *bm = RT_ALLOC(ar, float, op_rope_angles_floats(rope, nm > 0 ? nm : 1) + 1);
  op_rope_angles_init(&ad, bd, rope, dpos, B);
  const float *a_q = lin_in(D, a_in, B, d, ar); /* wq_a and wkv are FP8 */
  float *cq = RT_ALLOC(ar, float, (size_t)B * m->q_rank), *q = RT_ALLOC(ar, float, (size_t)B * hd);
  op_q_latent_q(cq, a_q, &b->wq_a, b->q_norm, B, M->eps);
  const float *cq_q = lin_in(D, cq, B, m->q_rank, ar);
  op_q_main_q(q, cq_q, &b->wq_b, &ad, rope, B, H, dh, m->q_head_norm, M->eps);
  float *kS = RT_ALLOC(ar, float, (size_t)nk * dh); /* keys: the main rows, then the draft rows */
  if (nm > 0) {
    op_rope_angles_init(&am, bm, rope, mpos, nm);
    op_swa_kv_q(kS, lin_in(D, mainr, nm, d, ar), &b->wkv, b->kv_norm, &am, rope, nm, M->eps);
  }
  op_swa_kv_q(kS + (size_t)nm * dh, a_q, &b->wkv, b->kv_norm, &ad, rope, B, M->eps);
  /* every key through the plan's SWA storage format, as the target's ring holds its window */
  size_t eb = M->swa_bytes;
  uint8_t *packed = RT_ALLOC(ar, uint8_t, (size_t)nk * eb);
  op_swa_pack(packed, kS, nk, dh, &M->swa_fmt, eb);
  for (int i = 0; i < nk; i++) op_kv_unpack(&M->swa_fmt, kS + (size_t)i * dh, packed + (size_t)i * eb, dh);
  int32_t *idx = RT_ALLOC(ar, int32_t, (size_t)B * nk);
  for (int i = 0; i < B; i++)
    for (int j = 0; j < nk; j++) idx[(size_t)i * nk + j] = j;
  struct op_attn_params pr = {.heads = H, .head_dim = dh, .topk = nk, .window = 0, .r0 = 0, .tau = M->tau,
                              .sink = b->sink, .rope = rope, .angles = &ad};
  float *o = RT_ALLOC(ar, float, (size_t)B * hd);
  op_sparse_attn_f32(o, NULL, q, dpos, idx, kS, nk, NULL, NULL, 0, B, &pr);
  float *z = RT_ALLOC(ar, float, (size_t)B * m->o_groups * m->o_rank);
  const int G = m->o_groups, R = m->o_rank, gw = hd / G;
  if (!m->num_lin_mxfp8) {
    op_grouped_oproj_q(y, z, o, &b->wo_a, &b->wo_b, B, H, dh, G);
  } else { /* as runtime/model/model.c's oproj: o and z through MXFP8 (wo_a, wo_b are FP8) */
    op_mxfp8_qdq(o, B, hd, hd, MTP_MXFP8_BLOCK);
    for (int g = 0; g < G; g++) {
      struct op_qweight wg = op_qweight_rows(&b->wo_a, g * R, R);
      op_qlinear(z + (size_t)g * R, o + (size_t)g * gw, &wg, B, hd, G * R);
    }
    op_mxfp8_qdq(z, B, G * R, G * R, MTP_MXFP8_BLOCK);
    op_qlinear(y, z, &b->wo_b, B, G * R, d);
  }
  round_io(D, y, (size_t)B * d);
}

int rt_mtp_draft_block(const struct rt_mtp *D, struct rt_mtp_cap *c, int64_t P, int32_t y0, int32_t *draft,
                       float *logits, float *conf, float *x_out, struct rt_arena *ar, char *err, size_t err_len) {
  const struct rt_model *M = D->M;
  const struct plan_model *m = &M->p->model;
  const int B = D->B, d = m->hidden, hc = m->hc_streams, V = m->vocab, T = c->n_targets;
  /* the window of committed positions whose rows every target captured */
  int64_t lo = P - D->window > 0 ? P - D->window : 0;
  for (;;) { /* skip positions never captured (a replay shorter than the window) */
    bool have = lo < P;
    for (int t = 0; have && t < T; t++) have = c->tag[(size_t)(lo % c->cap) * T + t] == lo;
    if (have || lo >= P) break;
    lo++;
  }
  for (int64_t p = lo; p < P; p++)
    for (int t = 0; t < T; t++)
      if (c->tag[(size_t)(p % c->cap) * T + t] != p) {
        snprintf(err, err_len, "the DSpark drafter lacks target layer %d's row of position %lld (window [%lld, %lld))",
                 c->targets[t], (long long)p, (long long)lo, (long long)P);
        return CEDAR_EINVAL;
      }
  int nm = (int)(P - lo);
  float *mainr = RT_ALLOC(ar, float, (size_t)(nm > 0 ? nm : 1) * d);
  int64_t *mpos = RT_ALLOC(ar, int64_t, nm > 0 ? nm : 1), *dpos = RT_ALLOC(ar, int64_t, B);
  for (int i = 0; i < nm; i++) mpos[i] = lo + i;
  for (int i = 0; i < B; i++) dpos[i] = P + i;
  main_rows(D, c, lo, P, mainr, ar);
  /* the draft rows: [y0, noise ...] into every stream, one-hot pre */
  int32_t *ids = RT_ALLOC(ar, int32_t, B);
  ids[0] = y0;
  for (int i = 1; i < B; i++) ids[i] = D->noise;
  float *h = RT_ALLOC(ar, float, (size_t)B * d), *X = RT_ALLOC(ar, float, (size_t)B * hc * d);
  float *pre = RT_ALLOC(ar, float, (size_t)B * hc);
  if (rt_embed_rows(M, h, ids, B) >= 0) {
    snprintf(err, err_len, "the drafter's token %d is outside the vocabulary", y0);
    return CEDAR_EINVAL;
  }
  op_mhc_expand(X, h, B, hc, d);
  round_x(D, X, B);
  memset(pre, 0, sizeof(float) * (size_t)B * hc);
  for (int i = 0; i < B; i++) pre[(size_t)i * hc] = 1.0f;
  float *post = RT_ALLOC(ar, float, (size_t)B * hc), *C = RT_ALLOC(ar, float, (size_t)B * hc * hc);
  float *xn = RT_ALLOC(ar, float, (size_t)B * d), *y = RT_ALLOC(ar, float, (size_t)B * d);
  int32_t *sel = RT_ALLOC(ar, int32_t, (size_t)B * D->moe.n_active);
  float *wt = RT_ALLOC(ar, float, (size_t)B * D->moe.n_active);
  for (int k = 0; k < D->blocks; k++) {
    const struct rt_mtp_block *b = &D->blk[k];
    float *u = mhc_begin(D, b, 0, X, pre, post, C, B, ar);
    op_rmsnorm(xn, u, b->attn_norm, B, d, M->eps);
    round_io(D, xn, (size_t)B * d);
    attend(D, b, y, xn, mainr, mpos, nm, dpos, B, ar);
    op_mhc_update_inplace(X, C, post, y, B, hc, d);
    round_x(D, X, B);
    u = mhc_begin(D, b, 1, X, pre, post, C, B, ar);
    op_rmsnorm(xn, u, b->ffn_norm, B, d, M->eps);
    round_io(D, xn, (size_t)B * d);
    void *ws = rt_arena_alloc(ar, op_moe_workspace_bytes(B, &D->moe));
    op_moe_forward(y, sel, wt, xn, &b->moe, NULL, B, &D->moe, ws);
    round_io(D, y, (size_t)B * d);
    op_mhc_update_inplace(X, C, post, y, B, hc, d);
    round_x(D, X, B);
  }
  /* collapse with the last FFN's own pre, the drafter's norm, the shared head */
  op_mhc_mix(h, X, pre, B, hc, d);
  round_io(D, h, (size_t)B * d);
  op_rmsnorm(xn, h, D->norm, B, d, M->eps);
  round_io(D, xn, (size_t)B * d);
  float *base = RT_ALLOC(ar, float, (size_t)B * V), *lg = logits ? logits : RT_ALLOC(ar, float, (size_t)B * V);
  op_qlinear(base, xn, &M->lm_head, B, d, V);
  if (op_dspark_markov_draft(draft, lg, NULL, NULL, base, D->mk_embed, D->mk_head, y0, B, V, D->rank, 0.0f, 1.0f,
                             NULL)) {
    snprintf(err, err_len, "the drafter's logits after position %lld hold NaN or +inf, or no finite value",
             (long long)P);
    return CEDAR_EINVAL;
  }
  if (conf) { /* conf_i = proj . [x_i, markov.embed[d_i]], d_0 = y0 */
    const int w = d + D->rank;
    float *cat = RT_ALLOC(ar, float, (size_t)B * w);
    for (int i = 0; i < B; i++) {
      int32_t prev = i ? draft[i - 1] : y0;
      memcpy(cat + (size_t)i * w, h + (size_t)i * d, sizeof(float) * (size_t)d);
      memcpy(cat + (size_t)i * w + d, D->mk_embed + (size_t)prev * D->rank, sizeof(float) * (size_t)D->rank);
    }
    op_linear(conf, cat, D->conf, B, w, 1, w, 1);
  }
  if (x_out) memcpy(x_out, h, sizeof(float) * (size_t)B * d);
  return 0;
}
