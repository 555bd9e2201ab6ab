/* moe.c: router, selection, clamped SwiGLU experts and the grouped MoE forward
 * (see moe.h for the math and the decisions). */
#include "ops/moe.h"

#include <math.h>
#include <string.h>

#include "ops/basic.h"

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
  int r = c->n_routed;
  op_linear(scores, x, router, n, c->hidden, r, c->hidden, r);
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
  float *g = ws, *u = ws + (size_t)n * inter;
  op_linear(g, x, w_gate, n, hidden, inter, hidden, inter);
  op_linear(u, x, w_up, n, hidden, inter, hidden, inter);
  op_moe_swiglu(g, g, u, row_scale, n, inter, limit);
  op_linear(y, g, w_down, n, inter, hidden, inter, hidden);
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

void op_moe_forward(float *y, int32_t *sel, float *weight, const float *x, const struct op_moe_weights *w,
                    const uint8_t *modality, int n, const struct op_moe_cfg *c, void *ws) {
  if (n <= 0) return;
  struct moe_ws s = ws_carve(ws, n, c);
  int d = c->hidden, I = c->inter, S = shared_width(c), k = c->n_active;

  op_moe_scores(s.scores, x, w->router, n, c);
  op_moe_select(sel, weight, s.scores, w->bias, modality, n, c);

  if (S > 0)
    op_moe_ffn(y, x, w->shared_gate, w->shared_up, w->shared_down, NULL, n, d, S, c->limit, s.gu);
  else
    memset(y, 0, (size_t)n * d * sizeof *y);

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
    op_moe_ffn(s.yg, s.xg, w->gate + (size_t)e * I * d, w->up + (size_t)e * I * d, w->down + (size_t)e * d * I, s.rs,
               cnt, d, I, c->limit, s.gu);
    for (int r = 0; r < cnt; r++) {
      float *yt = y + (size_t)s.tok[q0 + r] * d;
      const float *src = s.yg + (size_t)r * d;
      for (int j = 0; j < d; j++) yt[j] += src[j];
    }
  }
}
