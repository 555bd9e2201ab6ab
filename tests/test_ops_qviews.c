/* test_ops_qviews.c: the ops the model calls with weights in their stored
 * formats (the `_q` entry points over struct op_qweight views, issue 31).
 *
 * What it checks: each op over a stored view (FP8 E4M3 with UE8M0 32 x 32
 * tiles, FP4 E2M1 with UE8M0 per row group of 32, BF16) writes, bit for bit,
 * what the float op writes over the dequantized matrix (op_qweight_dequant):
 * op_q_latent_q, op_q_main_q, op_q_indexer_q, op_swa_kv_q (FP8),
 * op_grouped_oproj_q (FP8 wo_a sliced per group at whole tile rows, FP8
 * wo_b), op_moe_scores_q (BF16 router), op_moe_forward with has_q (BF16
 * router, FP4 experts sliced per expert, FP8 shared expert, with and
 * without MXFP8 inputs to the shared expert), op_moe_ffn_q, and
 * op_engram_inject_q (FP8 w_kv). Shapes are odd where the ops allow it
 * (rows and columns not multiples of 32 for FP8), and n is 1 (decode) and
 * 9 (past OP_QLINEAR_PANEL_ROWS: the dequantized-panel path). A view of
 * rows (op_qweight_rows) is checked against the rows of the dequantized
 * matrix. Bitwise, so no tolerance: ops/qlinear.h's contract.
 *
 * Run from the repository root: ctest --test-dir build -R ops_qviews.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention.h"
#include "ops/engram.h"
#include "ops/formats.h"
#include "ops/moe.h"
#include "ops/qkv.h"
#include "ops/qlinear.h"
#include "ops/rope.h"
#include "base/check.h"
#include "tests/harness.h"

/* A stored matrix (out, in) of format f with random codes (no NaN: E4M3
 * 0x7f/0xff avoided; scales 2^-4 .. 2^3 around 1), and its F32 values. */
struct qm {
  struct op_qweight q;
  uint8_t *data, *scale;
  float *f;
};

static struct qm make(enum op_wfmt f, int out, int in, uint64_t *seed) {
  struct qm m = {.q = {f, out, in, NULL, NULL}};
  size_t db = op_qweight_data_bytes(&m.q), sb = op_qweight_scale_bytes(&m.q);
  m.data = malloc(db + 1), m.scale = malloc(sb + 1), m.f = malloc(sizeof(float) * (size_t)out * in + 4);
  for (size_t i = 0; i < db; i++) {
    uint8_t b = (uint8_t)(h_uniform(seed) * 256);
    if (f == OP_W_FP8 && (b & 0x7f) == 0x7f) b ^= 1;
    if (f == OP_W_BF16 && (i & 1)) b = (uint8_t)(0x3c + (b & 3)) | (b & 0x80); /* high byte: |w| in [2^-7, 2) */
    m.data[i] = b;
  }
  for (size_t i = 0; i < sb; i++) m.scale[i] = (uint8_t)(123 + (int)(h_uniform(seed) * 8));
  m.q.data = m.data, m.q.scale = sb ? m.scale : NULL;
  op_qweight_dequant(m.f, &m.q);
  return m;
}

static void drop(struct qm *m) { free(m->data), free(m->scale), free(m->f); }

static float *vec(size_t n, uint64_t *seed) {
  float *x = malloc(sizeof(float) * n + 4);
  h_fill(x, n, seed, -1, 1);
  return x;
}

static void same(const float *a, const float *b, size_t n, const char *what, int rows) {
  EXPECT(!memcmp(a, b, sizeof(float) * n), "%s (n %d): the stored view differs from the float op over the dequantized "
         "matrix", what, rows);
}

static void qkv_ops(int n, uint64_t *seed) {
  const int hidden = 96, q_rank = 72, heads = 3, hd = 32, idx_heads = 2, idx_dim = 32;
  struct qm wa = make(OP_W_FP8, q_rank, hidden, seed), wb = make(OP_W_FP8, heads * hd, q_rank, seed);
  struct qm wi = make(OP_W_FP8, idx_heads * idx_dim, q_rank, seed), wk = make(OP_W_FP8, hd, hidden, seed);
  float *u = vec((size_t)n * hidden, seed), *g = vec(q_rank, seed), *gk = vec(hd, seed);
  float *a = malloc(sizeof(float) * (size_t)n * 128), *b = malloc(sizeof(float) * (size_t)n * 128);
  op_q_latent_q(a, u, &wa.q, g, n, 1e-6f);
  op_q_latent(b, u, wa.f, g, n, hidden, q_rank, 1e-6f);
  same(a, b, (size_t)n * q_rank, "op_q_latent_q", n);
  struct op_rope rope, rope_i;
  CEDAR_ASSERT(!op_rope_init(&rope, hd, 16, true, 10000.0, false, 1, 1, 1, 1) &&
               !op_rope_init(&rope_i, idx_dim, 16, true, 10000.0, false, 1, 1, 1, 1));
  int64_t pos[16];
  for (int i = 0; i < n; i++) pos[i] = 3 + 5 * i;
  struct op_rope_angles ang, ang_i;
  float *ab = malloc(sizeof(float) * (op_rope_angles_floats(&rope, n) + 1));
  float *ab_i = malloc(sizeof(float) * (op_rope_angles_floats(&rope_i, n) + 1));
  op_rope_angles_init(&ang, ab, &rope, pos, n);
  op_rope_angles_init(&ang_i, ab_i, &rope_i, pos, n);
  float *cq = vec((size_t)n * q_rank, seed);
  op_q_main_q(a, cq, &wb.q, &ang, &rope, n, heads, hd, true, 1e-6f);
  op_q_main(b, cq, wb.f, &ang, &rope, n, q_rank, heads, hd, true, 1e-6f);
  same(a, b, (size_t)n * heads * hd, "op_q_main_q", n);
  op_q_indexer_q(a, cq, &wi.q, &ang_i, &rope_i, n, idx_heads, idx_dim);
  op_q_indexer(b, cq, wi.f, &ang_i, &rope_i, n, q_rank, idx_heads, idx_dim);
  same(a, b, (size_t)n * idx_heads * idx_dim, "op_q_indexer_q", n);
  op_swa_kv_q(a, u, &wk.q, gk, &ang, &rope, n, 1e-6f);
  op_swa_kv(b, u, wk.f, gk, &ang, &rope, n, hidden, hd, 1e-6f);
  same(a, b, (size_t)n * hd, "op_swa_kv_q", n);
  drop(&wa), drop(&wb), drop(&wi), drop(&wk);
  free(u), free(g), free(gk), free(a), free(b), free(ab), free(ab_i), free(cq);
}

static void oproj(int n, uint64_t *seed) {
  const int heads = 4, hd = 24, G = 2, R = 64, hidden = 40, gw = heads / G * hd;
  struct qm wa = make(OP_W_FP8, G * R, gw, seed), wb = make(OP_W_FP8, hidden, G * R, seed);
  float *o = vec((size_t)n * heads * hd, seed);
  float *a = malloc(sizeof(float) * (size_t)n * hidden), *b = malloc(sizeof(float) * (size_t)n * hidden);
  float *za = malloc(sizeof(float) * (size_t)n * G * R), *zb = malloc(sizeof(float) * (size_t)n * G * R);
  op_grouped_oproj_q(a, za, o, &wa.q, &wb.q, n, heads, hd, G);
  op_grouped_oproj(b, zb, o, wa.f, wb.f, n, heads, hd, G, R, hidden);
  same(za, zb, (size_t)n * G * R, "op_grouped_oproj_q z", n);
  same(a, b, (size_t)n * hidden, "op_grouped_oproj_q", n);
  /* a view of rows is those rows of the dequantized matrix */
  struct op_qweight r = op_qweight_rows(&wa.q, R, R);
  float *rf = malloc(sizeof(float) * (size_t)R * gw);
  op_qweight_dequant(rf, &r);
  same(rf, wa.f + (size_t)R * gw, (size_t)R * gw, "op_qweight_rows (fp8)", R);
  free(rf), free(o), free(a), free(b), free(za), free(zb);
  drop(&wa), drop(&wb);
}

static void moe(int n, int mxfp8, uint64_t *seed) {
  struct op_moe_cfg c = {.hidden = 64, .n_routed = 5, .n_active = 2, .inter = 32, .n_shared = 1, .shared_inter = 40,
                         .score = OP_MOE_SQRTSOFTPLUS, .norm_topk = true, .route_scale = 1.5f, .limit = 10,
                         .shared_mxfp8 = mxfp8};
  const int d = c.hidden, R = c.n_routed, I = c.inter, S = c.shared_inter;
  struct qm rt = make(OP_W_BF16, R, d, seed), g = make(OP_W_FP4, R * I, d, seed), u = make(OP_W_FP4, R * I, d, seed);
  struct qm dn = make(OP_W_FP4, R * d, I, seed), sg = make(OP_W_FP8, S, d, seed), su = make(OP_W_FP8, S, d, seed);
  struct qm sd = make(OP_W_FP8, d, S, seed);
  float *bias = vec(2 * (size_t)R, seed), *x = vec((size_t)n * d, seed);
  struct op_moe_weights wf = {rt.f, bias, g.f, u.f, dn.f, sg.f, su.f, sd.f, .has_q = false};
  struct op_moe_weights wq = {.bias = bias, .has_q = true, .q = {rt.q, g.q, u.q, dn.q, sg.q, su.q, sd.q}};
  void *ws = malloc(op_moe_workspace_bytes(n, &c));
  float *ya = malloc(sizeof(float) * (size_t)n * d), *yb = malloc(sizeof(float) * (size_t)n * d);
  float *wa = malloc(sizeof(float) * (size_t)n * 2), *wb = malloc(sizeof(float) * (size_t)n * 2);
  int32_t *sa = malloc(sizeof(int32_t) * (size_t)n * 2), *sb = malloc(sizeof(int32_t) * (size_t)n * 2);
  op_moe_forward(ya, sa, wa, x, &wq, NULL, n, &c, ws);
  op_moe_forward(yb, sb, wb, x, &wf, NULL, n, &c, ws);
  EXPECT(!memcmp(sa, sb, sizeof(int32_t) * (size_t)n * 2), "op_moe_forward (has_q): another selection");
  same(ya, yb, (size_t)n * d, mxfp8 ? "op_moe_forward (has_q, mxfp8 shared)" : "op_moe_forward (has_q)", n);
  float *sc_a = malloc(sizeof(float) * (size_t)n * R), *sc_b = malloc(sizeof(float) * (size_t)n * R);
  op_moe_scores_q(sc_a, x, &rt.q, n, &c);
  op_moe_scores(sc_b, x, rt.f, n, &c);
  same(sc_a, sc_b, (size_t)n * R, "op_moe_scores_q (bf16)", n);
  struct op_qweight eg = op_qweight_rows(&g.q, 3 * I, I), eu = op_qweight_rows(&u.q, 3 * I, I);
  struct op_qweight ed = op_qweight_rows(&dn.q, 3 * d, d);
  op_moe_ffn_q(ya, x, &eg, &eu, &ed, NULL, n, c.limit, ws);
  op_moe_ffn(yb, x, g.f + (size_t)3 * I * d, u.f + (size_t)3 * I * d, dn.f + (size_t)3 * d * I, NULL, n, d, I, c.limit,
             ws);
  same(ya, yb, (size_t)n * d, "op_moe_ffn_q (fp4 expert 3)", n);
  drop(&rt), drop(&g), drop(&u), drop(&dn), drop(&sg), drop(&su), drop(&sd);
  free(bias), free(x), free(ws), free(ya), free(yb), free(wa), free(wb), free(sa), free(sb), free(sc_a), free(sc_b);
}

static void engram(int n, uint64_t *seed) {
  const int hidden = 48, hc = 2, d_e = 40, w = (hc + 1) * hidden;
  struct qm wkv = make(OP_W_FP8, w, d_e, seed);
  float *e = vec((size_t)n * d_e, seed), *qw = vec((size_t)hc * hidden, seed), *kw = vec((size_t)hc * hidden, seed);
  float *xa = vec((size_t)n * hc * hidden, seed), *xb = malloc(sizeof(float) * (size_t)n * hc * hidden);
  memcpy(xb, xa, sizeof(float) * (size_t)n * hc * hidden);
  float *ka = malloc(sizeof(float) * (size_t)n * w), *kb = malloc(sizeof(float) * (size_t)n * w);
  op_engram_inject_q(xa, ka, NULL, e, &wkv.q, qw, kw, n, hidden, hc, 1e-6f, 1e-6f);
  op_engram_inject(xb, kb, NULL, e, wkv.f, qw, kw, n, d_e, hidden, hc, 1e-6f, 1e-6f);
  same(ka, kb, (size_t)n * w, "op_engram_inject_q kv", n);
  same(xa, xb, (size_t)n * hc * hidden, "op_engram_inject_q", n);
  drop(&wkv);
  free(e), free(qw), free(kw), free(xa), free(xb), free(ka), free(kb);
}

int main(void) {
  uint64_t seed = 31;
  static const int rows[] = {1, 9};
  for (int k = 0; k < 2; k++) {
    qkv_ops(rows[k], &seed);
    oproj(rows[k], &seed);
    moe(rows[k], 0, &seed);
    moe(rows[k], 32, &seed);
    engram(rows[k], &seed);
  }
  return h_report("ops_qviews");
}
