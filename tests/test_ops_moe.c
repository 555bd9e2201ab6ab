/* test_ops_moe.c: the MoE sublayer (ops/moe.h) against float64 references written here.
 *
 * What it is: router scores (sqrtsoftplus, softmax, sigmoid), selection (bias for selection
 * only, ties to the lower id, ascending ids), routing weights (normalised or not, times
 * route_scale), the clamped SwiGLU, one expert FFN and the whole grouped forward (shared +
 * routed) at odd and larger sizes, with derived error bounds; and SPEC 8.5's invariants:
 * 24 (a bias change that keeps the selected set keeps the output bit for bit), 25 (text and
 * image tokens with the same hidden state select differently when the biases differ), 26
 * (the SwiGLU clamp: past the limit a gate pre-activation acts as the limit, |up| <= limit).
 * Sentinels surround every output (h_alloc).
 *
 * What it is not: a performance test, or a test of expert parallelism.
 *
 * Run: ctest --test-dir build -R ops_moe --output-on-failure
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/moe.h"
#include "tests/harness.h"

/* max over x of |SiLU'(x)| = 1.0998 (at x = 2.40): SiLU's Lipschitz constant. */
#define SILU_LIP 1.1

/* ---- helpers ------------------------------------------------------------------ */

static float *fvec(size_t n, uint64_t *seed, float lo, float hi) {
  float *v = malloc((n ? n : 1) * sizeof(float));
  h_fill(v, n, seed, lo, hi);
  return v;
}

static double ref_silu(double x) { return x / (1.0 + exp(-x)); }
static double ref_softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double ref_clamp(double v, double lo, double hi) { return v > hi ? hi : (v < lo ? lo : v); }

/* ---- one random MoE sublayer ----------------------------------------------------- */

struct moe_case {
  struct op_moe_cfg c;
  struct op_moe_weights w;
  float *router, *bias, *gate, *up, *down, *sg, *su, *sd, *x;
  uint8_t *mod;
  int n;
};

/* Scales: x in [-1, 1]; router rows 2/sqrt(H) give logits of order 1; expert gate/up rows
 * 3/sqrt(H) give pre-activations of order 1, so a small limit clamps some and not others. */
static void case_init(struct moe_case *m, struct op_moe_cfg c, int n, uint64_t *seed) {
  int H = c.hidden, R = c.n_routed, I = c.inter, S = c.n_shared * c.shared_inter;
  float ar = 2.0f / sqrtf((float)H), ae = 3.0f / sqrtf((float)H);
  m->c = c, m->n = n;
  m->router = fvec((size_t)R * H, seed, -ar, ar);
  m->bias = fvec(2 * (size_t)R, seed, -0.5f, 0.5f);
  m->gate = fvec((size_t)R * I * H, seed, -ae, ae);
  m->up = fvec((size_t)R * I * H, seed, -ae, ae);
  m->down = fvec((size_t)R * H * I, seed, -1.0f / sqrtf((float)I), 1.0f / sqrtf((float)I));
  m->sg = fvec((size_t)S * H, seed, -ae, ae);
  m->su = fvec((size_t)S * H, seed, -ae, ae);
  m->sd = fvec((size_t)H * S, seed, -1.0f / sqrtf((float)(S ? S : 1)), 1.0f / sqrtf((float)(S ? S : 1)));
  m->x = fvec((size_t)n * H, seed, -1, 1);
  m->mod = malloc((size_t)(n ? n : 1));
  for (int t = 0; t < n; t++) m->mod[t] = h_uniform(seed) < 0.4 ? 1 : 0;
  m->w = (struct op_moe_weights){m->router, m->bias, m->gate, m->up, m->down, m->sg, m->su, m->sd, .has_q = false};
}

static void case_free(struct moe_case *m) {
  free(m->router), free(m->bias), free(m->gate), free(m->up), free(m->down);
  free(m->sg), free(m->su), free(m->sd), free(m->x), free(m->mod);
}

/* ---- float64 references ------------------------------------------------------------ */

/* Router scores in float64 and an absolute bound on the fp32 scores' error. The logit is an
 * fp32 dot product of H terms: error el <= gamma(H) sum|e_i x|. It moves a score by
 *   sqrtsoftplus: d ln s / dl = sigmoid(l) / (2 softplus(l)) <= 1/2 (sigmoid <= softplus);
 *   sigmoid:      d ln s / dl = 1 - s <= 1;
 *   softmax:      d ln p_i = dl_i - sum_k p_k dl_k, so <= 2 max_k el_k.
 * Rounding after the logit, relative: sqrtsoftplus expf, log1pf (1 ulp = 2u each, the exp
 * error weighted by <= 1) and sqrtf (u, and it halves the rest): <= 3u, take 5u as
 * op_softplus's own test does for softplus alone; sigmoid expf 2u + add + divide: 4u;
 * softmax: the subtraction l - m (u |l - m| absolute in the exponent, twice through the
 * normalisation), expf 2u, the sum gamma(R), the division u. */
static void ref_scores(double *s, double *bd, const float *x, const float *router, int n, const struct op_moe_cfg *c) {
  int H = c->hidden, R = c->n_routed;
  double *l = malloc((size_t)R * sizeof(double)), *el = malloc((size_t)R * sizeof(double));
  for (int t = 0; t < n; t++) {
    double m = -INFINITY, emax = 0, sum = 0;
    for (int i = 0; i < R; i++) {
      double v = 0, a = 0;
      for (int k = 0; k < H; k++) {
        double p = (double)router[(size_t)i * H + k] * x[(size_t)t * H + k];
        v += p, a += fabs(p);
      }
      l[i] = v, el[i] = h_gamma(H) * a;
      m = fmax(m, v), emax = fmax(emax, el[i]);
    }
    double dmax = 0;
    for (int i = 0; i < R; i++) sum += exp(l[i] - m), dmax = fmax(dmax, fabs(l[i] - m));
    for (int i = 0; i < R; i++) {
      double *si = s + (size_t)t * R + i, *bi = bd + (size_t)t * R + i;
      switch (c->score) {
      case OP_MOE_SOFTMAX:
        *si = exp(l[i] - m) / sum;
        *bi = *si * (2 * emax + H_U32 * (2 * (dmax + 1) + 2 + 1) + h_gamma(R));
        break;
      case OP_MOE_SIGMOID:
        *si = 1.0 / (1.0 + exp(-l[i]));
        *bi = *si * ((1 - *si) * el[i] + 4 * H_U32);
        break;
      default:
        *si = sqrt(ref_softplus(l[i]));
        *bi = *si * (0.5 * el[i] + 5 * H_U32);
        break;
      }
    }
  }
  free(l), free(el);
}

/* Check a routing (sel, weight) against float64 scores s with error bounds sb.
 * Selection: ids valid and ascending; every selected expert's reference key s + b is at
 * least every unselected one's, up to both keys' bounds (sb plus the rounding of the fp32
 * add, u |key|). This is exact set equality wherever the k-th and (k+1)-th keys are further
 * apart than that. Weights: g = s / sum_sel s * scale from the reference scores over the
 * op's set; relative error <= e_i + max_k e_k (sum) + gamma(k) (its k-1 adds) + 2u (divide,
 * scale), e_i = sb_i / s_i; without normalisation e_i + u. */
static void check_routing(const int32_t *sel, const float *weight, const double *s, const double *sb, const float *bias,
                          const uint8_t *mod, int n, const struct op_moe_cfg *c, const char *what) {
  int R = c->n_routed, k = c->n_active, bad_ids = 0, bad_sel = 0;
  double *gref = malloc((size_t)n * k * sizeof(double)), *gbd = malloc((size_t)n * k * sizeof(double));
  char *in = malloc((size_t)R);
  for (int t = 0; t < n; t++) {
    const int32_t *st = sel + (size_t)t * k;
    const double *ss = s + (size_t)t * R, *sbt = sb + (size_t)t * R;
    const float *b = bias ? bias + (mod && mod[t] ? R : 0) : NULL;
    memset(in, 0, (size_t)R);
    bool ok = true;
    for (int j = 0; j < k; j++) {
      ok = ok && st[j] >= 0 && st[j] < R && (j == 0 || st[j] > st[j - 1]);
      if (st[j] >= 0 && st[j] < R) in[st[j]] = 1;
    }
    if (!ok) {
      bad_ids++;
      continue;
    }
    for (int i = 0; i < R; i++)
      for (int q = 0; q < R; q++) {
        if (!in[i] || in[q]) continue;
        double ki = ss[i] + (b ? b[i] : 0), kq = ss[q] + (b ? b[q] : 0);
        double tol = sbt[i] + sbt[q] + H_U32 * (fabs(ki) + fabs(kq) + sbt[i] + sbt[q]);
        if (ki < kq - tol) bad_sel++;
      }
    double sum = 0, emax = 0;
    for (int j = 0; j < k; j++) sum += ss[st[j]], emax = fmax(emax, sbt[st[j]] / ss[st[j]]);
    for (int j = 0; j < k; j++) {
      double g = (c->norm_topk ? ss[st[j]] / sum : ss[st[j]]) * c->route_scale, e = sbt[st[j]] / ss[st[j]];
      gref[(size_t)t * k + j] = g;
      gbd[(size_t)t * k + j] = fabs(g) * (c->norm_topk ? e + emax + h_gamma(k) + 2 * H_U32 : e + H_U32);
    }
  }
  EXPECT(bad_ids == 0, "%s: %d tokens with invalid, repeated or unsorted expert ids", what, bad_ids);
  EXPECT(bad_sel == 0, "%s: %d (selected, unselected) pairs out of order beyond the bound", what, bad_sel);
  if (bad_ids == 0) h_within(weight, gref, gbd, (size_t)n * k, what);
  free(gref), free(gbd), free(in);
}

/* One SwiGLU FFN over n rows in float64, with an absolute bound on the fp32 op's error:
 *   a = W_gate x, b = W_up x: fp32 dot products of H terms, |da| <= gamma(H) sum|W_gate x|;
 *   h = rs SiLU(min(a, L)) clamp(b): min and clamp are 1-Lipschitz, SiLU SILU_LIP-Lipschitz,
 *     so |dh| <= |rs| (SILU_LIP |da| |clamp b| + |SiLU| |db|) + 6u |h| (SiLU: expf 2u, add
 *     and divide 2u, as in test_ops_basic; then two products);
 *   y = W_down h: |dy| <= sum|W_down| |dh| (1 + gamma(I)) + gamma(I) sum|W_down h|. */
static void ref_ffn(double *y, double *bd, const float *x, const float *Wg, const float *Wu, const float *Wd,
                    const float *rs, int n, int H, int I, float L) {
  double *h = malloc((size_t)(I ? I : 1) * sizeof(double)), *dh = malloc((size_t)(I ? I : 1) * sizeof(double));
  for (int t = 0; t < n; t++) {
    const float *xt = x + (size_t)t * H;
    double r = rs ? rs[t] : 1.0;
    for (int j = 0; j < I; j++) {
      double a = 0, aa = 0, b = 0, ab = 0;
      for (int k = 0; k < H; k++) {
        double p = (double)Wg[(size_t)j * H + k] * xt[k], q = (double)Wu[(size_t)j * H + k] * xt[k];
        a += p, aa += fabs(p), b += q, ab += fabs(q);
      }
      double sv = ref_silu(a > L ? L : a), bc = ref_clamp(b, -L, L);
      h[j] = r * sv * bc;
      dh[j] = fabs(r) * (SILU_LIP * h_gamma(H) * aa * fabs(bc) + fabs(sv) * h_gamma(H) * ab) + 6 * H_U32 * fabs(h[j]);
    }
    for (int i = 0; i < H; i++) {
      double v = 0, av = 0, ad = 0;
      for (int j = 0; j < I; j++) {
        double w = Wd[(size_t)i * I + j];
        v += w * h[j], av += fabs(w * h[j]), ad += fabs(w) * dh[j];
      }
      y[(size_t)t * H + i] = v;
      bd[(size_t)t * H + i] = ad * (1 + h_gamma(I)) + h_gamma(I) * av;
    }
  }
  free(h), free(dh);
}

/* The whole sublayer in float64 for the op's routing (sel, weight taken as exact inputs:
 * check_routing tests them). Bound: the FFN bounds, plus the fp32 accumulation of the
 * shared output and k expert outputs, gamma(k) times the sum of their magnitudes. */
static void ref_moe(double *y, double *bd, const struct moe_case *m, const int32_t *sel, const float *weight) {
  const struct op_moe_cfg *c = &m->c;
  int H = c->hidden, I = c->inter, S = c->n_shared * c->shared_inter, k = c->n_active;
  size_t len = (size_t)m->n * H;
  double *ye = malloc(H * sizeof(double)), *be = malloc(H * sizeof(double));
  double *mag = calloc(len, sizeof(double));
  if (S > 0) {
    ref_ffn(y, bd, m->x, m->sg, m->su, m->sd, NULL, m->n, H, S, c->limit);
    for (size_t q = 0; q < len; q++) mag[q] = fabs(y[q]);
  } else {
    memset(y, 0, len * sizeof(double)), memset(bd, 0, len * sizeof(double));
  }
  for (int t = 0; t < m->n; t++)
    for (int j = 0; j < k; j++) {
      int e = sel[(size_t)t * k + j];
      ref_ffn(ye, be, m->x + (size_t)t * H, m->gate + (size_t)e * I * H, m->up + (size_t)e * I * H,
              m->down + (size_t)e * H * I, weight + (size_t)t * k + j, 1, H, I, c->limit);
      for (int i = 0; i < H; i++) {
        size_t q = (size_t)t * H + i;
        y[q] += ye[i], bd[q] += be[i], mag[q] += fabs(ye[i]);
      }
    }
  for (size_t q = 0; q < len; q++) bd[q] += h_gamma(k) * mag[q];
  free(ye), free(be), free(mag);
}

/* ---- the clamped SwiGLU and SPEC 8.5.26 ---------------------------------------------- */

/* h = rs SiLU(min(g, L)) clamp(u, -L, L) on exact fp32 inputs: 6u relative (see ref_ffn).
 * 8.5.26 on the activation: replacing every g > L by L and every u by clamp(u) gives the
 * same bits, and |h| <= |rs| max|SiLU| L. In place (h = g) gives the same bits. */
static void check_swiglu(int n, int inter, float L, bool scaled, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "swiglu n %d inter %d limit %g%s", n, inter, L, scaled ? " scaled" : "");
  size_t len = (size_t)n * inter;
  float *g = fvec(len, seed, -4 * L, 4 * L), *u = fvec(len, seed, -3 * L, 3 * L), *rs = fvec(n, seed, 0.1f, 2);
  float *gc = malloc(len * sizeof(float)), *uc = malloc(len * sizeof(float));
  float *h = h_alloc(len), *hc = h_alloc(len), *hin = h_alloc(len);
  double *ref = malloc(len * sizeof(double));
  const float *r = scaled ? rs : NULL;
  for (size_t q = 0; q < len; q++) {
    double rr = r ? r[q / inter] : 1.0;
    ref[q] = rr * ref_silu(g[q] > L ? L : g[q]) * ref_clamp(u[q], -L, L);
    gc[q] = g[q] > L ? L : g[q], uc[q] = (float)ref_clamp(u[q], -L, L);
  }
  op_moe_swiglu(h, g, u, r, n, inter, L);
  h_close(h, ref, NULL, len, 0, 6, 0, what);
  op_moe_swiglu(hc, gc, uc, r, n, inter, L);
  EXPECT(memcmp(h, hc, len * sizeof(float)) == 0, "%s: g > L or |u| > L does not act as the limit (8.5.26)", what);
  double silu_max = fmax(ref_silu(L), 0.2785); /* max |SiLU| on (-inf, L]; its minimum is -0.27846 */
  int over = 0;
  for (size_t q = 0; q < len; q++) over += fabs(h[q]) > (r ? r[q / inter] : 1.0) * silu_max * L * (1 + 8 * H_U32);
  EXPECT(over == 0, "%s: %d outputs exceed |rs| max|SiLU| L: |up| not limited (8.5.26)", what, over);
  memcpy(hin, g, len * sizeof(float));
  op_moe_swiglu(hin, hin, u, r, n, inter, L);
  EXPECT(memcmp(hin, h, len * sizeof(float)) == 0, "%s: in place differs", what);
  float nan_in[2] = {NAN, 1.0f}, nan_out[2];
  op_moe_swiglu(nan_out, nan_in, nan_in + 1, NULL, 1, 1, L);
  EXPECT(isnan(nan_out[0]), "%s: a NaN gate was clamped instead of propagated", what);
  h_free(h, len, what), h_free(hc, len, what), h_free(hin, len, what);
  free(g), free(u), free(rs), free(gc), free(uc), free(ref);
}

/* 8.5.26 through a whole FFN: gate rows aligned with sign(x) make every gate pre-activation
 * > L, up rows aligned with +-sign(x) make every |up| > L. Then doubling W_gate or W_up
 * changes no bit of the output (past the limit the size does not matter), the output
 * matches the float64 reference within the derived bound, and it is far from the unclamped
 * FFN (so the construction does reach the clamp). */
static void check_ffn_clamp(int n, int H, int I, float L, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "ffn clamp n %d H %d I %d limit %g", n, H, I, L);
  float *x = fvec((size_t)n * H, seed, -1, 1), *Wd = fvec((size_t)H * I, seed, -0.2f, 0.2f);
  float *Wg = malloc((size_t)I * H * sizeof(float)), *Wu = malloc((size_t)I * H * sizeof(float));
  float *Wg2 = malloc((size_t)I * H * sizeof(float)), *Wu2 = malloc((size_t)I * H * sizeof(float));
  float c = 4 * L / (float)H; /* x's mean |x| is 1/2: pre-activations >= about 2 L * 0.5 ... 4 L */
  for (int j = 0; j < I; j++) {
    float sgn = (j & 1) ? -1.0f : 1.0f;
    for (int k = 0; k < H; k++) {
      float sx = x[k] >= 0 ? 1.0f : -1.0f; /* one sign pattern: row 0 of x; others share it */
      Wg[(size_t)j * H + k] = sx * c * (float)(1 + h_uniform(seed));
      Wu[(size_t)j * H + k] = sgn * sx * c * (float)(1 + h_uniform(seed));
    }
  }
  for (int t = 1; t < n; t++) /* every row of x with row 0's signs and magnitudes in [0.1, 1] */
    for (int k = 0; k < H; k++)
      x[(size_t)t * H + k] = (x[k] >= 0 ? 1.0f : -1.0f) * (float)(0.1 + 0.9 * h_uniform(seed));
  for (size_t q = 0; q < (size_t)I * H; q++) Wg2[q] = 2 * Wg[q], Wu2[q] = 2 * Wu[q];
  size_t len = (size_t)n * H;
  float *y = h_alloc(len), *y2 = h_alloc(len), *y3 = h_alloc(len), *ws = malloc(2 * (size_t)n * I * sizeof(float));
  double *ref = malloc(len * sizeof(double)), *bd = malloc(len * sizeof(double));
  op_moe_ffn(y, x, Wg, Wu, Wd, NULL, n, H, I, L, ws);
  op_moe_ffn(y2, x, Wg2, Wu, Wd, NULL, n, H, I, L, ws);
  op_moe_ffn(y3, x, Wg, Wu2, Wd, NULL, n, H, I, L, ws);
  ref_ffn(ref, bd, x, Wg, Wu, Wd, NULL, n, H, I, L);
  h_within(y, ref, bd, len, what);
  EXPECT(memcmp(y, y2, len * sizeof(float)) == 0, "%s: doubling gate pre-activations above L changed y", what);
  EXPECT(memcmp(y, y3, len * sizeof(float)) == 0, "%s: doubling |up| above L changed y", what);
  ref_ffn(ref, bd, x, Wg, Wu, Wd, NULL, n, H, I, 1e30f); /* no clamp: much larger */
  double far = 0;
  for (size_t q = 0; q < len; q++) far = fmax(far, fabs(ref[q] - y[q]) / (fabs(ref[q]) + 1e-30));
  EXPECT(far > 0.5, "%s: the unclamped FFN is within %.3g of the clamped one: the clamp was not reached", what, far);
  h_free(y, len, what), h_free(y2, len, what), h_free(y3, len, what);
  free(x), free(Wd), free(Wg), free(Wu), free(Wg2), free(Wu2), free(ws), free(ref), free(bd);
}

/* ---- selection on given scores ---------------------------------------------------------- */

/* op_moe_select on exact fp32 scores (bound 0): random scores and biases, then hand-made
 * ties: equal keys go to the lower id, and ids come back ascending. */
static void check_select(uint64_t *seed) {
  struct op_moe_cfg c = {
      .n_routed = 23, .n_active = 5, .score = OP_MOE_SQRTSOFTPLUS, .norm_topk = true, .route_scale = 1.5f};
  int n = 17, R = c.n_routed, k = c.n_active;
  float *s = fvec((size_t)n * R, seed, 0.05f, 3), *b = fvec(2 * (size_t)R, seed, -1, 1);
  uint8_t mod[17];
  for (int t = 0; t < n; t++) mod[t] = (uint8_t)(t % 3 == 0);
  double *sd = malloc((size_t)n * R * sizeof(double)), *zero = calloc((size_t)n * R, sizeof(double));
  for (size_t q = 0; q < (size_t)n * R; q++) sd[q] = s[q];
  int32_t *sel = (int32_t *)h_alloc_bytes((size_t)n * k * sizeof(int32_t));
  float *w = h_alloc((size_t)n * k);
  for (int norm = 0; norm < 2; norm++) {
    c.norm_topk = norm;
    op_moe_select(sel, w, s, b, mod, n, &c);
    check_routing(sel, w, sd, zero, b, mod, n, &c, norm ? "select random" : "select random, no norm");
    op_moe_select(sel, w, s, NULL, NULL, n, &c);
    check_routing(sel, w, sd, zero, NULL, NULL, n, &c, "select without bias");
  }
  /* ties: all scores equal -> experts 0..k-1; keys 3,1,3,2,3,3,... with k = 2 -> {0, 2} */
  c.n_routed = 8, c.n_active = 2, c.norm_topk = true;
  float eq[8] = {1, 1, 1, 1, 1, 1, 1, 1}, tie[8] = {3, 1, 3, 2, 3, 3, 0.5f, 3}, tb[16] = {0};
  float sc[8] = {0.5f, 2.5f, 1, 2, 0.25f, 0.125f, 1, 1.5f}; /* + tb image row below -> keys 3, 3, 3, ... */
  float tw[2];
  int32_t ts[2];
  op_moe_select(ts, tw, eq, NULL, NULL, 1, &c);
  EXPECT(ts[0] == 0 && ts[1] == 1 && tw[0] == 0.75f && tw[1] == 0.75f, "all-equal scores: got %d %d (%g %g)", ts[0],
         ts[1], tw[0], tw[1]);
  op_moe_select(ts, tw, tie, NULL, NULL, 1, &c);
  EXPECT(ts[0] == 0 && ts[1] == 2, "tie to the lower id: got %d %d, want 0 2", ts[0], ts[1]);
  for (int i = 0; i < 8; i++) tb[8 + i] = 3 - sc[i]; /* image keys all exactly 3 */
  uint8_t img = 1;
  op_moe_select(ts, tw, sc, tb, &img, 1, &c);
  EXPECT(ts[0] == 0 && ts[1] == 1, "biased ties: got %d %d, want 0 1", ts[0], ts[1]);
  EXPECT(tw[0] == 0.5f / 3.0f * 1.5f && tw[1] == 2.5f / 3.0f * 1.5f,
         "biased ties: weights %g %g not from the original scores", tw[0], tw[1]);
  h_free_bytes((uint8_t *)sel, (size_t)n * k * sizeof(int32_t), "select sel");
  h_free(w, (size_t)n * k, "select weight");
  free(s), free(b), free(sd), free(zero);
}

/* ---- the forward -------------------------------------------------------------------------- */

static struct op_moe_cfg cfg(int H, int R, int k, int I, int ns, int si, enum op_moe_score sf, bool norm, float L) {
  return (struct op_moe_cfg){.hidden = H,
                             .n_routed = R,
                             .n_active = k,
                             .inter = I,
                             .n_shared = ns,
                             .shared_inter = si,
                             .score = sf,
                             .norm_topk = norm,
                             .route_scale = 1.5f,
                             .limit = L};
}

/* Run op_moe_forward on m; outputs into fresh sentinel buffers the caller frees. */
static void run_forward(float **y, int32_t **sel, float **w, const struct moe_case *m, const float *x,
                        const uint8_t *mod, int n) {
  const struct op_moe_cfg *c = &m->c;
  *y = h_alloc((size_t)n * c->hidden);
  *sel = (int32_t *)h_alloc_bytes((size_t)n * c->n_active * sizeof(int32_t));
  *w = h_alloc((size_t)n * c->n_active);
  void *ws = malloc(op_moe_workspace_bytes(n, c));
  op_moe_forward(*y, *sel, *w, x, &m->w, mod, n, c, ws);
  free(ws);
}

static void free_forward(float *y, int32_t *sel, float *w, int n, const struct op_moe_cfg *c, const char *what) {
  h_free(y, (size_t)n * c->hidden, what);
  h_free_bytes((uint8_t *)sel, (size_t)n * c->n_active * sizeof(int32_t), what);
  h_free(w, (size_t)n * c->n_active, what);
}

/* Scores alone, then the whole forward: routing against float64 scores, output against the
 * float64 sublayer. Then each token alone: its expert batches shrink to one row, so its
 * bits may change (DESIGN.md: sgemm is not row-independent) but it stays within the same
 * derived bound of the same reference. */
static void check_forward(struct op_moe_cfg c, int n, uint64_t *seed) {
  char what[160];
  snprintf(what, sizeof what, "forward n %d H %d R %d k %d I %d shared %dx%d score %d norm %d limit %g", n, c.hidden,
           c.n_routed, c.n_active, c.inter, c.n_shared, c.shared_inter, c.score, c.norm_topk, c.limit);
  struct moe_case m;
  case_init(&m, c, n, seed);
  size_t ns = (size_t)n * c.n_routed, len = (size_t)n * c.hidden;
  float *s = h_alloc(ns);
  double *sref = malloc(ns * sizeof(double)), *sbd = malloc(ns * sizeof(double));
  double *yref = malloc(len * sizeof(double)), *ybd = malloc(len * sizeof(double));
  op_moe_scores(s, m.x, m.router, n, &c);
  ref_scores(sref, sbd, m.x, m.router, n, &c);
  h_within(s, sref, sbd, ns, what);
  h_free(s, ns, what);

  float *y, *w;
  int32_t *sel;
  run_forward(&y, &sel, &w, &m, m.x, m.mod, n);
  check_routing(sel, w, sref, sbd, m.bias, m.mod, n, &c, what);
  ref_moe(yref, ybd, &m, sel, w);
  h_within(y, yref, ybd, len, what);

  int differ = 0;
  for (int t = 0; t < n && n > 1; t++) {
    float *y1, *w1;
    int32_t *s1;
    run_forward(&y1, &s1, &w1, &m, m.x + (size_t)t * c.hidden, m.mod + t, 1);
    EXPECT(memcmp(s1, sel + (size_t)t * c.n_active, c.n_active * sizeof(int32_t)) == 0,
           "%s: token %d alone selects differently", what, t);
    if (memcmp(s1, sel + (size_t)t * c.n_active, c.n_active * sizeof(int32_t)) == 0) {
      h_within(y1, yref + (size_t)t * c.hidden, ybd + (size_t)t * c.hidden, c.hidden, what);
      differ += memcmp(y1, y + (size_t)t * c.hidden, c.hidden * sizeof(float)) != 0;
    }
    free_forward(y1, s1, w1, 1, &c, what);
  }
  if (n > 1) printf("%s: %d of %d tokens change bits when run alone (allowed)\n", what, differ, n);
  free_forward(y, sel, w, n, &c, what);
  free(sref), free(sbd), free(yref), free(ybd);
  case_free(&m);
}

/* ---- SPEC 8.5.24 and 8.5.25 -------------------------------------------------------------- */

static void set_bias(float *bias, int R, int k, bool vary, uint64_t *seed) {
  for (int i = 0; i < R; i++) {
    bool in_t = i % 3 == 0 && i / 3 < k, in_g = i % 2 == 1 && i / 2 < k;
    float big_t = vary ? (float)(50 + 100 * h_uniform(seed)) : 100,
          big_g = vary ? (float)(50 + 100 * h_uniform(seed)) : 100;
    bias[i] = in_t ? big_t : (float)(2 * h_uniform(seed) - 1);
    bias[R + i] = in_g ? big_g : (float)(2 * h_uniform(seed) - 1);
  }
}

/* 8.5.24: with set_bias every token of a modality selects its set (scores are O(1), the
 * margin is ~50). Redrawing the biases (vary) reorders the keys inside each set and moves
 * every other key, but keeps the sets, so no bit of y or of the weights may change. */
static void check_bias_invariance(struct op_moe_cfg c, int n, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "8.5.24 bias invariance n %d R %d k %d score %d", n, c.n_routed, c.n_active, c.score);
  struct moe_case m;
  case_init(&m, c, n, seed);
  int R = c.n_routed, k = c.n_active;
  float *y0, *w0, *y1, *w1;
  int32_t *s0, *s1;
  set_bias(m.bias, R, k, false, seed);
  run_forward(&y0, &s0, &w0, &m, m.x, m.mod, n);
  set_bias(m.bias, R, k, true, seed);
  run_forward(&y1, &s1, &w1, &m, m.x, m.mod, n);
  int wrong_set = 0;
  for (int t = 0; t < n; t++)
    for (int j = 0; j < k; j++) {
      int want = m.mod[t] ? 2 * j + 1 : 3 * j;
      wrong_set += s0[(size_t)t * k + j] != want || s1[(size_t)t * k + j] != want;
    }
  EXPECT(wrong_set == 0, "%s: the construction did not fix the selected sets (%d slots)", what, wrong_set);
  EXPECT(memcmp(w0, w1, (size_t)n * k * sizeof(float)) == 0, "%s: weights changed with the bias", what);
  EXPECT(memcmp(y0, y1, (size_t)n * c.hidden * sizeof(float)) == 0, "%s: y changed with the bias", what);
  free_forward(y0, s0, w0, n, &c, what), free_forward(y1, s1, w1, n, &c, what);
  case_free(&m);
}

/* 8.5.25: one hidden state as a text and as an image token in the same batch. With equal
 * biases both select the same set; with b_img = b_txt except +50 on the k experts text
 * ranks lowest, the image token selects exactly those, and its output differs. */
static void check_modality(struct op_moe_cfg c, uint64_t *seed) {
  const char *what = "8.5.25 modality";
  struct moe_case m;
  case_init(&m, c, 2, seed);
  int R = c.n_routed, k = c.n_active, H = c.hidden;
  memcpy(m.x + H, m.x, H * sizeof(float));
  m.mod[0] = 0, m.mod[1] = 1;
  memcpy(m.bias + R, m.bias, R * sizeof(float));
  float *y, *w;
  int32_t *sel;
  run_forward(&y, &sel, &w, &m, m.x, m.mod, 2);
  EXPECT(memcmp(sel, sel + k, k * sizeof(int32_t)) == 0, "%s: equal biases, different selections", what);
  free_forward(y, sel, w, 2, &c, what);
  /* the k lowest text keys, by the op's own scores */
  float *s = malloc((size_t)R * sizeof(float));
  op_moe_scores(s, m.x, m.router, 1, &c);
  int32_t *low = malloc((size_t)k * sizeof(int32_t));
  char *used = calloc((size_t)R, 1);
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int i = 0; i < R; i++)
      if (!used[i] && (best < 0 || s[i] + m.bias[i] < s[best] + m.bias[best])) best = i;
    used[best] = 1, low[j] = best, m.bias[R + best] += 50;
  }
  run_forward(&y, &sel, &w, &m, m.x, m.mod, 2);
  int hit = 0, same = 0;
  for (int j = 0; j < k; j++) hit += used[sel[k + j]], same += sel[j] == sel[k + j];
  EXPECT(hit == k, "%s: the image token picked %d of its %d boosted experts", what, hit, k);
  EXPECT(same < k, "%s: text and image tokens selected the same experts", what);
  EXPECT(memcmp(y, y + H, H * sizeof(float)) != 0, "%s: text and image outputs are equal", what);
  free_forward(y, sel, w, 2, &c, what);
  free(s), free(low), free(used);
  case_free(&m);
}

int main(void) {
  op_blas_init();
  uint64_t seed = 0x30E5EED1;

  check_swiglu(7, 13, 10, false, &seed);
  check_swiglu(5, 37, 1.5f, true, &seed);
  check_swiglu(1, 1, 10, true, &seed);
  check_ffn_clamp(5, 64, 24, 10, &seed);
  check_ffn_clamp(3, 37, 11, 2, &seed);
  check_select(&seed);

  /* odd sizes, every score function, with and without shared experts and normalisation */
  check_forward(cfg(37, 13, 3, 19, 1, 11, OP_MOE_SQRTSOFTPLUS, true, 1.5f), 1, &seed);
  check_forward(cfg(37, 13, 3, 19, 1, 11, OP_MOE_SQRTSOFTPLUS, true, 1.5f), 7, &seed);
  check_forward(cfg(29, 9, 1, 7, 0, 0, OP_MOE_SOFTMAX, false, 10), 11, &seed);
  check_forward(cfg(33, 17, 4, 21, 2, 5, OP_MOE_SIGMOID, true, 1.0f), 33, &seed);
  check_forward(cfg(16, 6, 6, 8, 1, 8, OP_MOE_SOFTMAX, true, 10), 5, &seed); /* k = n_routed */
  /* a larger shape with many tokens per expert (v41-mini's 8 routed, 2 active) */
  check_forward(cfg(256, 8, 2, 256, 1, 256, OP_MOE_SQRTSOFTPLUS, true, 10), 40, &seed);
  check_forward(cfg(512, 64, 6, 96, 1, 96, OP_MOE_SQRTSOFTPLUS, true, 1.5f), 24, &seed);

  check_bias_invariance(cfg(40, 24, 4, 16, 1, 12, OP_MOE_SQRTSOFTPLUS, true, 1.5f), 19, &seed);
  check_bias_invariance(cfg(40, 24, 4, 16, 1, 12, OP_MOE_SOFTMAX, true, 10), 19, &seed);
  check_modality(cfg(48, 16, 3, 20, 1, 8, OP_MOE_SQRTSOFTPLUS, true, 10), &seed);
  return h_report("ops_moe");
}
