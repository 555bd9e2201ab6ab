/* test_ops_qkv.c: ops/qkv.h (query path, indexer query and weights, SWA KV)
 * against float64 references written here (SPEC 3.5, 3.6, R.2, R.4).
 *
 * How the tolerances are derived. A reference is float64 arithmetic on the
 * op's float inputs (its own error, <= K 2^-53 relative, is 2^-29 of the fp32
 * bounds below and is ignored). Each reference value carries a bound B >=
 * |op - ref|, built stage by stage so a chain (linear -> norm -> linear ->
 * norm -> RoPE) propagates the earlier stages' bounds into the later ones:
 *   linear  y = W x, the op's input off by at most xb from x:
 *           B = gamma(K) sum|W| (|x| + xb) + sum|W| xb
 *           (Higham 3.1 for the fp32 dot product of the op's actual input,
 *           whatever sgemm's order or FMA use, plus the input error pushed
 *           through W: |W (x' - x)| <= sum |W| xb);
 *   RMSNorm y = x g / rms(x), rms = sqrt(mean x^2 + eps), delta = ||xb||_2:
 *           rms is 1-Lipschitz in ||x||_2/sqrt(d), so the op's input has
 *           rms' >= rms_lo = rms - delta/sqrt(d), and the exact norm of the
 *           op's input is off by |g| (xb/rms_lo + |x| delta/(sqrt(d) rms rms_lo));
 *           the op's own rounding (sum of squares gamma(d), /d, +eps, sqrt,
 *           1/x, two products) adds (gamma(d)/2 + 6u) |y'|, where 5u is the
 *           first-order count and 1u covers the second-order terms;
 *   RoPE    a pair (a, b) with bounds (ea, eb), angle t = pos * freq in
 *           double as the op forms it: the rotation does not grow the input
 *           error (ea|cos t| + eb|sin t|), and the op's float cos/sin (u/2
 *           each), two products and one sum add 3u (|a'||cos t| + |b'||sin t|).
 *           The frequency table is rope's (tests/test_ops_rope.c checks it);
 *           the reference takes r->freq as data and rotates by itself.
 * h_close then runs with k = 1 and absref = B / gamma(1), i.e. it checks
 * |op - ref| <= B element by element after the NaN/Inf check.
 *
 * Run: ctest --test-dir build -R ops_qkv --output-on-failure
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/qkv.h"
#include "tests/harness.h"

#define U H_U32
static const float EPS = 1e-6f;

/* ---- float64 references with error bounds (see the header) ----------- */

static double *dalloc(size_t n) {
  double *p = calloc(n ? n : 1, sizeof *p);
  if (!p) abort();
  return p;
}

static double *to_double(const float *x, size_t n) {
  double *d = dalloc(n);
  for (size_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

static float *rand_floats(size_t n, uint64_t *seed, float lo, float hi) {
  float *x = h_alloc(n);
  h_fill(x, n, seed, lo, hi);
  return x;
}

/* ---- cases -------------------------------------------------------------- */

struct qcase {
  int n, hidden, q_rank, heads, head_dim, rope_dim, idx_heads, idx_dim, idx_rope;
  bool last, yarn;
  int64_t pos_max;
};

struct qdata {
  const struct qcase *c;
  float *u, *W_qa, *g_q, *W_qb, *W_iq, *W_w, *W_kv, *g_kv;
  int64_t *pos;
  struct op_rope rope, rope_i, rope_swa;
  double *ud;
};

static void qdata_init(struct qdata *D, const struct qcase *c, uint64_t *seed) {
  D->c = c;
  float wa = 1.7f / sqrtf((float)c->hidden), wb = 3.0f / sqrtf((float)c->q_rank);
  D->u = rand_floats((size_t)c->n * c->hidden, seed, -1, 1);
  D->W_qa = rand_floats((size_t)c->q_rank * c->hidden, seed, -wa, wa);
  D->g_q = rand_floats((size_t)c->q_rank, seed, -1.5f, 1.5f);
  D->W_qb = rand_floats((size_t)c->heads * c->head_dim * c->q_rank, seed, -wb, wb);
  D->W_iq = rand_floats((size_t)c->idx_heads * c->idx_dim * c->q_rank, seed, -wb, wb);
  D->W_w = rand_floats((size_t)c->idx_heads * c->hidden, seed, -wa, wa);
  D->W_kv = rand_floats((size_t)c->head_dim * c->hidden, seed, -wa, wa);
  D->g_kv = rand_floats((size_t)c->head_dim, seed, -1.5f, 1.5f);
  D->pos = malloc((size_t)c->n * sizeof *D->pos);
  for (int i = 0; i < c->n; i++) D->pos[i] = (int64_t)(h_uniform(seed) * (double)(c->pos_max + 1));
  double theta = c->yarn ? 160000 : 10000;
  EXPECT(op_rope_init(&D->rope, c->head_dim, c->rope_dim, c->last, theta, c->yarn, 16, 65536, 32, 1) == 0, "rope");
  EXPECT(op_rope_init(&D->rope_i, c->idx_dim, c->idx_rope, c->last, theta, c->yarn, 16, 65536, 32, 1) == 0, "rope_i");
  EXPECT(op_rope_init(&D->rope_swa, c->head_dim, c->rope_dim, c->last, 10000, false, 1, 1, 1, 1) == 0, "rope_swa");
  D->ud = to_double(D->u, (size_t)c->n * c->hidden);
}

static void qdata_free(struct qdata *D) {
  const struct qcase *c = D->c;
  h_free(D->u, (size_t)c->n * c->hidden, "u");
  h_free(D->W_qa, (size_t)c->q_rank * c->hidden, "W_qa");
  h_free(D->g_q, (size_t)c->q_rank, "g_q");
  h_free(D->W_qb, (size_t)c->heads * c->head_dim * c->q_rank, "W_qb");
  h_free(D->W_iq, (size_t)c->idx_heads * c->idx_dim * c->q_rank, "W_iq");
  h_free(D->W_w, (size_t)c->idx_heads * c->hidden, "W_w");
  h_free(D->W_kv, (size_t)c->head_dim * c->hidden, "W_kv");
  h_free(D->g_kv, (size_t)c->head_dim, "g_kv");
  free(D->pos);
  free(D->ud);
}

/* The angle table of n rows at pos under r (the ops rotate from one); the
 * caller frees *buf. */
static struct op_rope_angles angles_of(const struct op_rope *r, const int64_t *pos, int n, float **buf) {
  struct op_rope_angles a;
  *buf = malloc((op_rope_angles_floats(r, n) + 1) * sizeof **buf);
  op_rope_angles_init(&a, *buf, r, pos, n);
  return a;
}

/* Main Q with and without the per-head norm. cqr/cqb: the c_q reference and
 * its bound. With the norm on, every head of the output has RMS 1 (RoPE keeps
 * each pair's norm): | rms(op head) - rms(ref head) | <= ||bound||_2/sqrt(hd). */
static void test_q_main(const struct qdata *D, const float *cq, const double *cqr, const double *cqb,
                        const char *name) {
  const struct qcase *c = D->c;
  const int W = c->heads * c->head_dim;
  const size_t nq = (size_t)c->n * W;
  double *qr = dalloc(nq), *qb = dalloc(nq);
  double max_off = 0; /* largest |rms - 1| of a head without the norm */
  for (int hn = 0; hn <= 1; hn++) {
    float *q = h_alloc(nq);
    float *abuf;
    struct op_rope_angles ang = angles_of(&D->rope, D->pos, c->n, &abuf);
    op_q_main(q, cq, D->W_qb, &ang, &D->rope, c->n, c->q_rank, c->heads, c->head_dim, hn, EPS);
    free(abuf);
    h_ref_linear(qr, qb, D->W_qb, cqr, cqb, c->n, c->q_rank, W);
    if (hn) h_ref_rmsnorm(qr, qb, qr, qb, NULL, c->n * c->heads, c->head_dim, EPS);
    h_ref_rope(qr, qb, &D->rope, D->pos, c->n, c->heads);
    char what[128];
    snprintf(what, sizeof what, "%s: q (q_head_norm %s)", name, hn ? "on" : "off");
    h_within(q, qr, qb, nq, what);
    for (size_t h = 0; h < (size_t)c->n * c->heads; h++) {
      double so = 0, sr = 0, sb = 0;
      for (int j = 0; j < c->head_dim; j++) {
        size_t k = h * c->head_dim + j;
        so += (double)q[k] * q[k], sr += qr[k] * qr[k], sb += qb[k] * qb[k];
      }
      double ro = sqrt(so / c->head_dim), rr = sqrt(sr / c->head_dim);
      if (hn) {
        EXPECT(fabs(ro - rr) <= sqrt(sb / c->head_dim), "%s: head %zu rms %.9g vs reference %.9g", what, h, ro, rr);
        EXPECT(fabs(rr - 1) < 1e-4, "%s: normalised head %zu has reference rms %.9g", what, h, rr);
      } else if (fabs(ro - 1) > max_off) {
        max_off = fabs(ro - 1);
      }
    }
    h_free(q, nq, "q");
  }
  EXPECT(max_off > 0.05, "%s: without q_head_norm every head already has rms ~1 (%g): the on/off check is vacuous",
         name, max_off);
  free(qr), free(qb);
}

static void test_indexer(const struct qdata *D, const float *cq, const double *cqr, const double *cqb,
                         const char *name) {
  const struct qcase *c = D->c;
  const size_t nqi = (size_t)c->n * c->idx_heads * c->idx_dim, nw = (size_t)c->n * c->idx_heads;
  double *r = dalloc(nqi), *b = dalloc(nqi);
  float *qI = h_alloc(nqi);
  float *abuf;
  struct op_rope_angles ang = angles_of(&D->rope_i, D->pos, c->n, &abuf);
  op_q_indexer(qI, cq, D->W_iq, &ang, &D->rope_i, c->n, c->q_rank, c->idx_heads, c->idx_dim);
  free(abuf);
  h_ref_linear(r, b, D->W_iq, cqr, cqb, c->n, c->q_rank, c->idx_heads * c->idx_dim);
  h_ref_rope(r, b, &D->rope_i, D->pos, c->n, c->idx_heads);
  char what[128];
  snprintf(what, sizeof what, "%s: qI", name);
  h_within(qI, r, b, nqi, what);
  h_free(qI, nqi, "qI");

  /* Head weights from u (not c_q); the scale multiply adds one rounding.
   * Same n, same GEMM: the scaled weights are fl(unscaled * scale) bit for
   * bit, a check far finer than the GEMM's bound. */
  const float scales[2] = {1.0f, op_index_weight_scale(c->idx_heads, c->idx_dim)};
  float *w1 = h_alloc(nw);
  for (int s = 0; s < 2; s++) {
    float *w = h_alloc(nw);
    op_index_weights(w, D->u, D->W_w, c->n, c->hidden, c->idx_heads, scales[s]);
    if (s == 0) memcpy(w1, w, nw * sizeof *w);
    for (size_t i = 0; s && i < nw; i++)
      EXPECT(w[i] == w1[i] * scales[s], "%s: w[%zu] = %.9g is not fl(%.9g * %.9g)", name, i, w[i], w1[i], scales[s]);
    h_ref_linear(r, b, D->W_w, D->ud, NULL, c->n, c->hidden, c->idx_heads);
    for (size_t i = 0; i < nw; i++) {
      r[i] *= scales[s], b[i] *= scales[s];
      b[i] += (s ? U : 0) * (fabs(r[i]) + b[i]);
    }
    snprintf(what, sizeof what, "%s: w (scale %g)", name, scales[s]);
    h_within(w, r, b, nw, what);
    h_free(w, nw, "w");
  }
  h_free(w1, nw, "w1");
  free(r), free(b);
}

/* SWA float path vs reference, then the packing: row i's bytes equal
 * op_fp8_pack of the float row, at stride `stride`, nothing else written. */
static void test_swa(const struct qdata *D, const char *name) {
  const struct qcase *c = D->c;
  const int hd = c->head_dim;
  const size_t nk = (size_t)c->n * hd;
  float *kS = h_alloc(nk);
  double *r = dalloc(nk), *b = dalloc(nk);
  float *abuf;
  struct op_rope_angles ang = angles_of(&D->rope_swa, D->pos, c->n, &abuf);
  op_swa_kv(kS, D->u, D->W_kv, D->g_kv, &ang, &D->rope_swa, c->n, c->hidden, hd, EPS);
  free(abuf);
  h_ref_linear(r, b, D->W_kv, D->ud, NULL, c->n, c->hidden, hd);
  h_ref_rmsnorm(r, b, r, b, D->g_kv, c->n, hd, EPS);
  h_ref_rope(r, b, &D->rope_swa, D->pos, c->n, 1);
  char what[128];
  snprintf(what, sizeof what, "%s: kS", name);
  h_within(kS, r, b, nk, what);

  const struct { int block; enum op_scale_kind kind; } fmts[] = {{hd, OP_SCALE_FP32}, {2, OP_SCALE_E8M0},
                                                                 {hd % 32 ? hd : 32, OP_SCALE_E8M0}};
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
    size_t bytes = op_fp8_bytes(hd, fmts[f].block, fmts[f].kind), stride = bytes + 3, total = stride * c->n;
    uint8_t *out = h_alloc_bytes(total), *one = malloc(bytes);
    memset(out, 0x5A, total);
    const struct op_kv_format sf = op_kv_fp8_format(fmts[f].block, fmts[f].kind);
    op_swa_pack(out, kS, c->n, hd, &sf, stride);
    for (int i = 0; i < c->n; i++) {
      op_fp8_pack(one, kS + (size_t)i * hd, hd, fmts[f].block, fmts[f].kind);
      EXPECT(memcmp(out + i * stride, one, bytes) == 0, "%s: swa pack fmt %zu row %d differs from op_fp8_pack",
             name, f, i);
      for (size_t k = bytes; k < stride; k++)
        EXPECT(out[i * stride + k] == 0x5A, "%s: swa pack fmt %zu row %d wrote padding byte %zu", name, f, i, k);
    }
    h_free_bytes(out, total, "swa entries");
    free(one);
  }
  h_free(kS, nk, "kS");
  free(r), free(b);
}

static void run_case(const struct qcase *c, uint64_t *seed) {
  struct qdata D;
  qdata_init(&D, c, seed);
  char name[96];
  snprintf(name, sizeof name, "case n=%d hidden=%d hd=%d", c->n, c->hidden, c->head_dim);

  const size_t ncq = (size_t)c->n * c->q_rank;
  float *cq = h_alloc(ncq);
  double *cqr = dalloc(ncq), *cqb = dalloc(ncq);
  op_q_latent(cq, D.u, D.W_qa, D.g_q, c->n, c->hidden, c->q_rank, EPS);
  h_ref_linear(cqr, cqb, D.W_qa, D.ud, NULL, c->n, c->hidden, c->q_rank);
  h_ref_rmsnorm(cqr, cqb, cqr, cqb, D.g_q, c->n, c->q_rank, EPS);
  char what[128];
  snprintf(what, sizeof what, "%s: c_q", name);
  h_within(cq, cqr, cqb, ncq, what);

  test_q_main(&D, cq, cqr, cqb, name);
  test_indexer(&D, cq, cqr, cqb, name);
  test_swa(&D, name);

  h_free(cq, ncq, "cq");
  free(cqr), free(cqb);
  qdata_free(&D);
}

int main(void) {
  op_blas_init();
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  static const struct qcase cases[] = {
      /* n hidden q_rank heads hd rope  ih idim irope last  yarn  pos_max */
      {1, 16, 8, 1, 8, 4, 1, 4, 2, true, false, 16},
      {7, 33, 19, 3, 10, 4, 2, 6, 4, true, false, 1000},
      {13, 96, 40, 4, 32, 8, 3, 16, 8, true, true, 1 << 20},
      {5, 257, 64, 2, 64, 16, 4, 32, 16, false, true, 70000},
      {3, 512, 96, 2, 128, 64, 2, 64, 32, true, true, 1000000},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], &seed);

  EXPECT(op_index_weight_scale(32, 128) == 0.015625f, "R.4 scale 128^-0.5 * 32^-0.5 = 1/64, got %.9g",
         op_index_weight_scale(32, 128));
  return h_report("ops_qkv");
}
