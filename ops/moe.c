/* moe.c: router, selection, clamped SwiGLU experts and the grouped MoE forward
 * (see moe.h for the math and the decisions). */
#include "ops/moe.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/formats.h"
#include "ops/qlinear.h"
#include "ops/registry.h"
#include "base/check.h"

/* ---- router ------------------------------------------------------------ */

static void softmax_row(float *s, int k) {
  float m = s[0];
  for (int i = 1; i < k; i++) m = s[i] > m ? s[i] : m;
  float sum = 0.0f;
  for (int i = 0; i < k; i++) {
    s[i] = expf(s[i] - m);
    sum += s[i];
  }
  for (int i = 0; i < k; i++) s[i] /= sum;
}

void op_moe_scores(float *scores, const float *x, const float *router, int n, const struct op_moe_cfg *c) {
  struct op_qweight q = op_qw_f32(router, c->n_routed, c->hidden);
  op_moe_scores_q(scores, x, &q, n, c);
}

void op_moe_scores_q(float *scores, const float *x, const struct op_qweight *router, int n,
                     const struct op_moe_cfg *c) {
  int r = c->n_routed;
  CEDAR_ASSERT(router->out == r && router->in == c->hidden);
  op_qlinear(scores, x, router, n, c->hidden, r);
  for (int t = 0; t < n; t++) {
    float *s = scores + (size_t)t * r;
    switch (c->score) {
    case OP_MOE_SOFTMAX:
      softmax_row(s, r);
      break;
    case OP_MOE_SIGMOID:
      for (int i = 0; i < r; i++) s[i] = op_sigmoid(s[i]);
      break;
    case OP_MOE_SQRTSOFTPLUS:
    default:
      for (int i = 0; i < r; i++) s[i] = sqrtf(op_softplus(s[i]));
      break;
    }
  }
}

/* ---- selection ----------------------------------------------------------- */

/* The selection key; a NaN ranks below everything so the choice stays total. */
static inline float sel_key(const float *s, const float *b, int i) {
  float k = b ? s[i] + b[i] : s[i];
  return isnan(k) ? -INFINITY : k;
}

/* Top k of key(i) in the order (key descending, id ascending), without a mask: pick j is
 * the best candidate strictly after pick j-1 in that order. O(k * n_routed). */
static void topk_ids(int32_t *sel, const float *s, const float *b, int r, int k) {
  float prev = 0.0f;
  int prev_id = -1;
  for (int j = 0; j < k; j++) {
    int best = -1;
    float bk = 0.0f;
    for (int i = 0; i < r; i++) {
      float v = sel_key(s, b, i);
      if (prev_id >= 0 && !(v < prev || (v == prev && i > prev_id))) continue;
      if (best < 0 || v > bk) best = i, bk = v;
    }
    sel[j] = best;
    prev = bk, prev_id = best;
  }
  /* ascending id order (insertion sort; k is small) */
  for (int j = 1; j < k; j++)
    for (int q = j; q > 0 && sel[q - 1] > sel[q]; q--) {
      int32_t t = sel[q];
      sel[q] = sel[q - 1], sel[q - 1] = t;
    }
}

void op_moe_select(int32_t *sel, float *weight, const float *scores, const float *bias, const uint8_t *modality, int n,
                   const struct op_moe_cfg *c) {
  int r = c->n_routed, k = c->n_active;
  for (int t = 0; t < n; t++) {
    const float *s = scores + (size_t)t * r;
    const float *b = bias ? bias + (modality && modality[t] ? r : 0) : NULL;
    int32_t *st = sel + (size_t)t * k;
    float *wt = weight + (size_t)t * k;
    topk_ids(st, s, b, r, k);
    float sum = 0.0f; /* in ascending id order, so independent of the bias */
    for (int j = 0; j < k; j++) sum += s[st[j]];
    for (int j = 0; j < k; j++) wt[j] = (c->norm_topk ? s[st[j]] / sum : s[st[j]]) * c->route_scale;
  }
}

/* ---- experts --------------------------------------------------------------- */

void op_moe_swiglu(float *h, const float *g, const float *u, const float *row_scale, int n, int inter, float limit) {
  for (int t = 0; t < n; t++) {
    size_t o = (size_t)t * inter;
    for (int j = 0; j < inter; j++) {
      float a = g[o + j], b = u[o + j];
      a = a > limit ? limit : a;                         /* min(g, L); NaN stays NaN */
      b = b > limit ? limit : (b < -limit ? -limit : b); /* clamp(u, -L, L) */
      float s = op_silu(a);
      h[o + j] = (row_scale ? row_scale[t] * s : s) * b;
    }
  }
}

void op_moe_ffn(float *y, const float *x, const float *w_gate, const float *w_up, const float *w_down,
                const float *row_scale, int n, int hidden, int inter, float limit, float *ws) {
  struct op_qweight g = op_qw_f32(w_gate, inter, hidden), u = op_qw_f32(w_up, inter, hidden);
  struct op_qweight dn = op_qw_f32(w_down, hidden, inter);
  op_moe_ffn_q(y, x, &g, &u, &dn, row_scale, n, limit, ws);
}

void op_moe_ffn_q(float *y, const float *x, const struct op_qweight *w_gate, const struct op_qweight *w_up,
                  const struct op_qweight *w_down, const float *row_scale, int n, float limit, float *ws) {
  const int hidden = w_gate->in, inter = w_gate->out;
  CEDAR_ASSERT(w_up->out == inter && w_up->in == hidden && w_down->out == hidden && w_down->in == inter);
  float *g = ws, *u = ws + (size_t)n * inter;
  op_qlinear(g, x, w_gate, n, hidden, inter);
  op_qlinear(u, x, w_up, n, hidden, inter);
  op_moe_swiglu(g, g, u, row_scale, n, inter, limit);
  op_qlinear(y, g, w_down, n, inter, hidden);
}

/* The views of w: its own (w->q), or its float matrices as F32 views. */
static struct op_moe_qweights moe_views(const struct op_moe_weights *w, const struct op_moe_cfg *c) {
  if (w->has_q) return w->q;
  const int d = c->hidden, R = c->n_routed, I = c->inter, S = c->n_shared * c->shared_inter;
  return (struct op_moe_qweights){
      op_qw_f32(w->router, R, d), op_qw_f32(w->gate, R * I, d), op_qw_f32(w->up, R * I, d), op_qw_f32(w->down, R * d, I),
      op_qw_f32(w->shared_gate, S, d), op_qw_f32(w->shared_up, S, d), op_qw_f32(w->shared_down, d, S)};
}

/* ---- grouped forward -------------------------------------------------------- */

/* Scratch layout, floats first then ints (every piece a multiple of 4 bytes). */
struct moe_ws {
  float *scores; /* (n, n_routed) */
  float *xg;     /* (n, hidden): rows of one expert's tokens */
  float *yg;     /* (n, hidden): that expert's outputs */
  float *rs;     /* (n): their routing weights */
  float *gu;     /* (2, n, max(inter, shared width)) */
  int *start;    /* (n_routed + 1): group offsets */
  int *tok;      /* (n * n_active): token of each (token, slot), grouped by expert */
  int *slot;     /* (n * n_active): its slot in sel/weight */
};

static int shared_width(const struct op_moe_cfg *c) { return c->n_shared * c->shared_inter; }

static size_t ws_floats(int n, const struct op_moe_cfg *c) {
  int wmax = c->inter > shared_width(c) ? c->inter : shared_width(c);
  return (size_t)n * c->n_routed + 2 * (size_t)n * c->hidden + (size_t)n + 2 * (size_t)n * wmax;
}

size_t op_moe_workspace_bytes(int n, const struct op_moe_cfg *c) {
  size_t ints = (size_t)c->n_routed + 1 + 2 * (size_t)n * c->n_active;
  return ws_floats(n, c) * sizeof(float) + ints * sizeof(int);
}

static struct moe_ws ws_carve(void *ws, int n, const struct op_moe_cfg *c) {
  struct moe_ws w;
  w.scores = ws;
  w.xg = w.scores + (size_t)n * c->n_routed;
  w.yg = w.xg + (size_t)n * c->hidden;
  w.rs = w.yg + (size_t)n * c->hidden;
  w.gu = w.rs + n;
  w.start = (int *)((float *)ws + ws_floats(n, c));
  w.tok = w.start + c->n_routed + 1;
  w.slot = w.tok + (size_t)n * c->n_active;
  return w;
}

/* Counting sort of the (token, slot) pairs by expert; tokens ascend inside a group. */
static void group_by_expert(struct moe_ws *w, const int32_t *sel, int n, const struct op_moe_cfg *c) {
  int r = c->n_routed, k = c->n_active;
  memset(w->start, 0, (size_t)(r + 1) * sizeof(int));
  for (size_t q = 0; q < (size_t)n * k; q++) w->start[sel[q] + 1]++;
  for (int e = 0; e < r; e++) w->start[e + 1] += w->start[e];
  /* start[e] serves as expert e's cursor, then is shifted back to its offset */
  for (int t = 0; t < n; t++)
    for (int j = 0; j < k; j++) {
      int e = sel[(size_t)t * k + j];
      int q = w->start[e]++;
      w->tok[q] = t, w->slot[q] = j;
    }
  for (int e = r; e > 0; e--) w->start[e] = w->start[e - 1];
  w->start[0] = 0;
}

_Thread_local struct op_moe_tap op_moe_tap;

void op_moe_shared(float *y, const float *x, const struct op_moe_weights *w, int n, const struct op_moe_cfg *c,
                   void *ws) {
  if (n <= 0) return;
  struct moe_ws s = ws_carve(ws, n, c);
  int d = c->hidden, S = shared_width(c);
  const struct op_moe_qweights q = moe_views(w, c);
  if (S > 0 && c->shared_mxfp8 > 0) { /* op_moe_ffn with MXFP8 inputs to each linear (s.xg is free here) */
    float *g = s.gu, *u = s.gu + (size_t)n * S;
    memcpy(s.xg, x, (size_t)n * d * sizeof *x);
    op_mxfp8_qdq(s.xg, n, d, d, c->shared_mxfp8);
    op_qlinear(g, s.xg, &q.shared_gate, n, d, S);
    op_qlinear(u, s.xg, &q.shared_up, n, d, S);
    op_moe_swiglu(g, g, u, NULL, n, S, c->limit);
    op_mxfp8_qdq(g, n, S, S, c->shared_mxfp8);
    op_qlinear(y, g, &q.shared_down, n, S, d);
  } else if (S > 0)
    op_moe_ffn_q(y, x, &q.shared_gate, &q.shared_up, &q.shared_down, NULL, n, c->limit, s.gu);
  else
    memset(y, 0, (size_t)n * d * sizeof *y);
  if (S > 0 && op_moe_tap.fn) op_moe_tap.fn(op_moe_tap.ctx, -1, n);
}

void op_moe_forward(float *y, int32_t *sel, float *weight, const float *x, const struct op_moe_weights *w,
                    const uint8_t *modality, int n, const struct op_moe_cfg *c, void *ws) {
  if (n <= 0) return;
  struct moe_ws s = ws_carve(ws, n, c);
  int d = c->hidden, I = c->inter, k = c->n_active;
  const struct op_moe_qweights q = moe_views(w, c);

  op_moe_scores_q(s.scores, x, &q.router, n, c);
  op_moe_select(sel, weight, s.scores, w->bias, modality, n, c);
  op_moe_shared(y, x, w, n, c, ws); /* uses xg and gu only: the scores are done with */

  /* routed experts in ascending id order, each once over its tokens */
  group_by_expert(&s, sel, n, c);
  for (int e = 0; e < c->n_routed; e++) {
    int q0 = s.start[e], cnt = s.start[e + 1] - q0;
    if (cnt == 0) continue;
    for (int r = 0; r < cnt; r++) {
      int t = s.tok[q0 + r];
      memcpy(s.xg + (size_t)r * d, x + (size_t)t * d, (size_t)d * sizeof *x);
      s.rs[r] = weight[(size_t)t * k + s.slot[q0 + r]];
    }
    struct op_qweight g = op_qweight_rows(&q.gate, e * I, I), u = op_qweight_rows(&q.up, e * I, I);
    struct op_qweight dn = op_qweight_rows(&q.down, e * d, d);
    op_moe_ffn_q(s.yg, s.xg, &g, &u, &dn, s.rs, cnt, c->limit, s.gu);
    if (op_moe_tap.fn) op_moe_tap.fn(op_moe_tap.ctx, e, cnt);
    for (int r = 0; r < cnt; r++) {
      float *yt = y + (size_t)s.tok[q0 + r] * d;
      const float *src = s.yg + (size_t)r * d;
      for (int j = 0; j < d; j++) yt[j] += src[j];
    }
  }
}

/* ---- registry descriptor (ops/registry.h) -------------------------------------------- */


/* The tensors of one call, cross-checked: n and hidden come from x, n_routed from router,
 * inter from w_gate, the shared width S from shared_gate. */
struct moe_in {
  const struct op_tensor *x, *router, *bias, *modality, *gate, *up, *down, *sgate, *sup, *sdown;
  int64_t xd[2], rd[2], bd[2], md[1], gd[3], ud[3], dd[3], sgd[2], sud[2], sdd[2];
};

/* The shared expert: all three matrices or none. */
static bool moe_shared_inputs(const struct op_desc *self, struct op_io *io, struct moe_in *m) {
  bool ok = true;
  m->sgate = op_io_in_opt(self, io, "shared_gate", 2, m->sgd, &ok);
  m->sup = op_io_in_opt(self, io, "shared_up", 2, m->sud, &ok);
  m->sdown = op_io_in_opt(self, io, "shared_down", 2, m->sdd, &ok);
  if (!ok) return false;
  int given = !!m->sgate + !!m->sup + !!m->sdown;
  if (given == 0) return true;
  if (given != 3)
    return op_io_fail(io, "moe: the shared expert needs shared_gate, shared_up and shared_down together (missing:%s%s%s)",
                      m->sgate ? "" : " shared_gate", m->sup ? "" : " shared_up", m->sdown ? "" : " shared_down"),
           false;
  int64_t hidden = m->xd[1], S = m->sgd[0];
  return op_io_dims_fit_int(io, "moe", "shared_gate", m->sgd, 2) &&
         op_io_dims_match(io, "moe", "shared_gate", m->sgd, (int64_t[]){S, hidden}, 2, "x", m->xd, 2) &&
         op_io_dims_match(io, "moe", "shared_up", m->sud, m->sgd, 2, "shared_gate", m->sgd, 2) &&
         op_io_dims_match(io, "moe", "shared_down", m->sdd, (int64_t[]){hidden, S}, 2, "shared_gate", m->sgd, 2);
}

static bool moe_inputs(const struct op_desc *self, struct op_io *io, struct moe_in *m) {
  bool ok = true;
  if (!(m->x = op_io_in(self, io, "x", 2, m->xd)) || !(m->router = op_io_in(self, io, "router", 2, m->rd)) ||
      !(m->gate = op_io_in(self, io, "w_gate", 3, m->gd)) || !(m->up = op_io_in(self, io, "w_up", 3, m->ud)) ||
      !(m->down = op_io_in(self, io, "w_down", 3, m->dd)))
    return false;
  m->bias = op_io_in_opt(self, io, "bias", 2, m->bd, &ok);
  m->modality = op_io_in_opt(self, io, "modality", 1, m->md, &ok);
  if (!ok) return false;
  int64_t n = m->xd[0], hidden = m->xd[1], r = m->rd[0], inter = m->gd[1];
  return op_io_dims_fit_int(io, "moe", "x", m->xd, 2) && op_io_dims_fit_int(io, "moe", "router", m->rd, 2) &&
         op_io_dims_fit_int(io, "moe", "w_gate", m->gd, 3) &&
         op_io_dims_match(io, "moe", "router", m->rd, (int64_t[]){r, hidden}, 2, "x", m->xd, 2) &&
         op_io_dims_match(io, "moe", "w_gate", m->gd, (int64_t[]){r, inter, hidden}, 3, "router", m->rd, 2) &&
         op_io_dims_match(io, "moe", "w_up", m->ud, m->gd, 3, "w_gate", m->gd, 3) &&
         op_io_dims_match(io, "moe", "w_down", m->dd, (int64_t[]){r, hidden, inter}, 3, "w_gate", m->gd, 3) &&
         (!m->bias || op_io_dims_match(io, "moe", "bias", m->bd, (int64_t[]){2, r}, 2, "router", m->rd, 2)) &&
         (!m->modality || op_io_dims_match(io, "moe", "modality", m->md, (int64_t[]){n}, 1, "x", m->xd, 2)) &&
         moe_shared_inputs(self, io, m);
}

/* The config from the shapes and the parameters; false after op_io_fail. */
static bool moe_config(const struct op_desc *self, struct op_io *io, const struct moe_in *m, struct op_moe_cfg *c) {
  int64_t k, score;
  if (!op_io_param_int(self, io, "n_active", 1, m->rd[0], &k) || !op_io_param_int(self, io, "score", 0, 2, &score)) return false;
  double limit = op_io_param(self, io, "limit"), scale = op_io_param(self, io, "route_scale");
  if (!(limit > 0) || !isfinite(limit) || !isfinite(scale))
    return op_io_fail(io, "moe: limit (%g) must be positive and finite, route_scale (%g) finite", limit, scale), false;
  *c = (struct op_moe_cfg){.hidden = (int)m->xd[1], .n_routed = (int)m->rd[0], .n_active = (int)k,
                           .inter = (int)m->gd[1], .n_shared = m->sgate ? 1 : 0,
                           .shared_inter = m->sgate ? (int)m->sgd[0] : 0, .score = (enum op_moe_score)score,
                           .norm_topk = op_io_param(self, io, "norm_topk") != 0, .route_scale = (float)scale,
                           .limit = (float)limit};
  return true;
}

int op_moe_prepare(const struct op_desc *self, struct op_io *io, struct op_moe_call *c) {
  struct moe_in m;
  if (!moe_inputs(self, io, &m) || !moe_config(self, io, &m, &c->cfg)) return CEDAR_EINVAL;
  int n = (int)m.xd[0];
  c->y = op_io_out(self, io, "y", 2, m.xd);
  c->sel = c->y ? op_io_out(self, io, "selected", 2, (int64_t[]){n, c->cfg.n_active}) : NULL;
  c->weight = c->sel ? op_io_out(self, io, "weights", 2, (int64_t[]){n, c->cfg.n_active}) : NULL;
  if (!c->weight) return CEDAR_ENOMEM;
  c->w = (struct op_moe_weights){
      .router = m.router->data, .bias = m.bias ? m.bias->data : NULL, .gate = m.gate->data, .up = m.up->data,
      .down = m.down->data, .shared_gate = m.sgate ? m.sgate->data : NULL, .shared_up = m.sup ? m.sup->data : NULL,
      .shared_down = m.sdown ? m.sdown->data : NULL};
  c->x = m.x->data, c->modality = m.modality ? m.modality->data : NULL, c->n = n;
  return 0;
}

static int moe_run(const struct op_desc *self, struct op_io *io) {
  struct op_moe_call c = {0};
  int rc = op_moe_prepare(self, io, &c);
  if (rc) return rc;
  size_t bytes = op_moe_workspace_bytes(c.n, &c.cfg);
  void *ws = malloc(bytes ? bytes : 1);
  if (!ws) return op_io_fail(io, "moe: cannot allocate %zu bytes of workspace", bytes), CEDAR_ENOMEM;
  op_moe_forward(c.y, c.sel, c.weight, c.x, &c.w, c.modality, c.n, &c.cfg, ws);
  free(ws);
  return 0;
}

const struct op_desc op_desc_moe = {
    .name = "moe",
    .summary = "MoE sublayer: router, bias-corrected top-k, clamped SwiGLU experts + shared expert (SPEC 3.13, R.6)",
    .inputs =
        (const struct op_arg[]){
            {"x", OP_F32, "(n, hidden)", "normalised sublayer input u'"},
            {"router", OP_F32, "(n_routed, hidden)", "router weight e_i (its rows give n_routed)"},
            {"bias", OP_F32, "(2, n_routed)", "optional: selection bias, row 0 text, row 1 image (absent = 0)"},
            {"modality", OP_U8, "(n)", "optional: 0 = text, else image (absent = all text)"},
            {"w_gate", OP_F32, "(n_routed, inter, hidden)", "W_gate (w1) of every routed expert, stacked"},
            {"w_up", OP_F32, "(n_routed, inter, hidden)", "W_up (w3), stacked"},
            {"w_down", OP_F32, "(n_routed, hidden, inter)", "W_down (w2), stacked"},
            {"shared_gate", OP_F32, "(S, hidden)", "optional, with shared_up/down: shared experts as one FFN of width S"},
            {"shared_up", OP_F32, "(S, hidden)", "optional: shared W_up"},
            {"shared_down", OP_F32, "(hidden, S)", "optional: shared W_down"},
            {0}},
    .outputs = (const struct op_arg[]){{"y", OP_F32, "(n, hidden)", "FFN_shared(x) + sum of weighted routed experts"},
                                       {"selected", OP_I32, "(n, n_active)", "selected expert ids, ascending"},
                                       {"weights", OP_F32, "(n, n_active)", "routing weight of each selected expert"},
                                       {0}},
    .params = (const struct op_param[]){{"n_active", OP_PARAM_INT, 6, "experts per token [A]"},
                                        {"score", OP_PARAM_INT, 0, "0 sqrtsoftplus, 1 softmax, 2 sigmoid [R-cfg]"},
                                        {"norm_topk", OP_PARAM_BOOL, 1, "normalise weights over the selection [R-cfg]"},
                                        {"route_scale", OP_PARAM_FLOAT, 1.5, "routed_scaling_factor [R-cfg]"},
                                        {"limit", OP_PARAM_FLOAT, 10, "swiglu_limit [A]"},
                                        {0}},
    .run = moe_run,
};
