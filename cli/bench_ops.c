/* bench_ops.c: the op cases of `cedar bench ops` (the command, its options
 * and the report are cli/cmd_bench.c; timing and peaks cli/bench.c).
 *
 * Each case below builds random inputs at the plan's widths, times one or
 * more call shapes (a prefill chunk of serving.prefill_chunk positions and a
 * decode step of 1, or several context lengths) and records per call the
 * FLOPs and bytes counted from the shapes. Counting rules, the same for every
 * op so that the floors compare:
 *   - FLOPs: the multiply-adds of the op's arithmetic (2 per MAC); exp, sqrt,
 *     sin/cos, compares and integer work are not counted, except where a
 *     case says it counts a nominal one per element (codecs, selection);
 *   - bytes: every input read once and every output written once, in the
 *     op's storage format; weights count in full; workspace and
 *     intermediates do not. That is the traffic an ideal fused op needs, so
 *     `x floor` also says how far the op's structure is from ideal.
 *
 * What it is not: a test (it asserts no timing; tests/cli/bench.sh checks the
 * report's shape) nor a tuner (the ops are other engineers' files).
 */
#include "cli/bench_ops.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention.h"
#include "ops/basic.h"
#include "ops/compressor.h"
#include "ops/engram.h"
#include "ops/formats.h"
#include "ops/indexer.h"
#include "ops/mhc.h"
#include "ops/moe.h"
#include "ops/qkv.h"
#include "ops/qlinear.h"
#include "ops/sample.h"
#include "base/check.h"

/* ---- helpers ------------------------------------------------------------- */

static float *frand(struct bench *b, size_t n, double scale) { return bench_rand(n, scale, &b->rng); }
static float *fbuf(size_t n) { return bench_alloc(n * sizeof(float)); }
static int32_t *ibuf(size_t n) { return bench_alloc(n * sizeof(int32_t)); }

void bench_note(struct bench *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->notes[b->n_notes], sizeof b->notes[0], fmt, ap);
  va_end(ap);
  b->meta.notes[b->n_notes] = b->notes[b->n_notes];
  b->n_notes++;
}

static void record(struct bench *b, const char *name, double flops, double bytes, const struct bench_loop *l,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void record(struct bench *b, const char *name, double flops, double bytes, const struct bench_loop *l,
                   const char *fmt, ...) {
  char shape[112];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(shape, sizeof shape, fmt, ap);
  va_end(ap);
  CEDAR_ASSERT(b->n_rows < MAX_ROWS);
  bench_row_set(&b->rows[b->n_rows++], name, shape, flops, bytes, l);
}

/* The plan's storage formats, as the runtime packs them. */
static struct op_kv_format fmt_main(const struct plan_model *m) { return plan_kv_format(m, &m->main_kv); }
static struct op_kv_format fmt_idx(const struct plan_model *m) { return plan_kv_format(m, &m->indexer_k); }
static struct op_kv_format fmt_swa(const struct plan_model *m) { return plan_kv_format(m, &m->swa); }

/* TIME(l, b) call; runs `call` under bench.h's timing loop l. */
#define TIME(l, b) for (bench_loop_start(&(l), (b)->reps, ROW_BUDGET_S); bench_loop_next(&(l));)

/* The last recorded row's GEMMs alone: `lg` timed its op_linear calls at the
 * same shapes (the x gemm column). */
static void record_gemm(struct bench *b, const struct bench_loop *lg) {
  CEDAR_ASSERT(b->n_rows > 0);
  b->rows[b->n_rows - 1].gemm_s = bench_loop_best(lg);
}

/* ---- projections: linear, rmsnorm, rope, q path, SWA KV ------------------- */

static void case_linear(struct bench *b, const char *name) {
  const int in = b->m->q_rank, out = b->m->heads * b->m->head_dim, ns[2] = {b->chunk, 1};
  float *W = frand(b, (size_t)out * in, 1.0 / sqrt(in)), *x = frand(b, (size_t)b->chunk * in, 1.0);
  float *y = fbuf((size_t)b->chunk * out);
  for (int k = 0; k < 2; k++) {
    const int n = ns[k];
    struct bench_loop l;
    TIME(l, b) op_linear(y, x, W, n, in, out, in, out);
    /* flops 2 n in out; bytes 4 (n in + out in + n out): x and W read, y written */
    record(b, name, 2.0 * n * in * out, 4.0 * ((double)n * in + (double)out * in + (double)n * out), &l,
           "W_qb n=%d in=%d out=%d", n, in, out);
    /* the same product through OpenBLAS sgemm, which op_linear was until it
     * became row-invariant: the price (or gain) of the fixed order */
    TIME(l, b) op_linear_sgemm(y, x, W, n, in, out, in, out);
    record(b, "linear_sgemm", 2.0 * n * in * out, 4.0 * ((double)n * in + (double)out * in + (double)n * out), &l,
           "W_qb n=%d in=%d out=%d", n, in, out);
  }
  free(W), free(x), free(y);
}

/* "qlinear": op_qlinear from stored weights beside op_linear (and sgemm) on
 * the same product, at two shapes of the plan: an FP8 linear (W_qb, q_rank ->
 * heads head_dim; also BF16) and a routed expert's FP4 w_gate (hidden ->
 * inter). Rows: n = 1 (decode), 8 (a batch; an expert over its rows) and the
 * chunk. Weights: the plan-scale floats quantized as the generator does
 * (one E8M0 scale for the whole matrix here: the kernel reads one per tile
 * anyway). bytes = the stored weight bytes (elements + scales) + x + y, so x
 * mem is the call against the stored-bytes floor of this run's memcpy. */
static void qlin_rows(struct bench *b, const struct op_qweight *w, const float *x, float *y) {
  const int in = w->in, out = w->out, ns[3] = {1, 8, b->chunk};
  const double wb = (double)op_qweight_data_bytes(w) + (double)op_qweight_scale_bytes(w);
  for (int k = 0; k < 3; k++) {
    const int n = ns[k];
    struct bench_loop l;
    TIME(l, b) op_qlinear(y, x, w, n, in, out);
    record(b, "qlinear", 2.0 * n * in * out, wb + 4.0 * n * ((double)in + out), &l, "%s n=%d in=%d out=%d",
           op_wfmt_name(w->fmt), n, in, out);
  }
}

static void case_qlinear(struct bench *b, const char *name) {
  (void)name;
  const struct plan_model *m = b->m;
  const int shapes[2][2] = {{m->q_rank, m->heads * m->head_dim}, {m->hidden, m->moe_inter}};
  for (int s = 0; s < 2; s++) {
    const int in = shapes[s][0], out = shapes[s][1], ns[3] = {1, 8, b->chunk};
    const size_t e = (size_t)out * in;
    float *W = frand(b, e, 1.0 / sqrt(in)), *x = frand(b, (size_t)b->chunk * in, 1.0);
    float *y = fbuf((size_t)b->chunk * out);
    for (int k = 0; k < 3; k++) { /* the F32 baselines, same product */
      struct bench_loop l;
      const int n = ns[k];
      TIME(l, b) op_linear(y, x, W, n, in, out, in, out);
      record(b, "qlinear", 2.0 * n * in * out, 4.0 * ((double)e + (double)n * in + (double)n * out), &l,
             "f32 op_linear n=%d in=%d out=%d", n, in, out);
      if (n == 1) continue;
      TIME(l, b) op_linear_sgemm(y, x, W, n, in, out, in, out);
      record(b, "qlinear", 2.0 * n * in * out, 4.0 * ((double)e + (double)n * in + (double)n * out), &l,
             "f32 sgemm n=%d in=%d out=%d", n, in, out);
    }
    float amax = 0;
    for (size_t i = 0; i < e; i++) amax = fmaxf(amax, fabsf(W[i]));
    uint8_t *q = bench_alloc(e), *sc = bench_alloc(e / 32 + (size_t)out + 1);
    const enum op_wfmt fmts[2][2] = {{OP_W_BF16, OP_W_FP8}, {OP_W_FP4, OP_W_COUNT}};
    for (int f = 0; f < 2 && fmts[s][f] != OP_W_COUNT; f++) {
      struct op_qweight w = {fmts[s][f], out, in, q, sc};
      if (w.fmt == OP_W_FP4 && in % 32) continue;
      const uint8_t code = op_e8m0_scale(amax, w.fmt == OP_W_FP4 ? 6.0f : 448.0f, OP_MX_CEIL);
      const float inv = op_e8m0_decode(code);
      memset(sc, code, op_qweight_scale_bytes(&w));
      for (size_t i = 0; i < e; i++) {
        if (w.fmt == OP_W_FP8) q[i] = op_e4m3_encode(W[i] / inv);
        else if (w.fmt == OP_W_FP4 && i % 2 == 0)
          q[i / 2] = (uint8_t)(op_e2m1_encode(W[i] / inv) | op_e2m1_encode(W[i + 1] / inv) << 4);
      }
      if (w.fmt == OP_W_BF16) { /* 2 bytes per element: a buffer of its own */
        uint16_t *h = bench_alloc(2 * e);
        for (size_t i = 0; i < e; i++) {
          uint32_t u;
          memcpy(&u, &W[i], 4);
          h[i] = (uint16_t)(u >> 16);
        }
        w.data = h;
        qlin_rows(b, &w, x, y);
        free(h);
      } else {
        qlin_rows(b, &w, x, y);
      }
    }
    free(W), free(x), free(y), free(q), free(sc);
  }
}

static void case_rmsnorm(struct bench *b, const char *name) {
  const int d = b->m->hidden, ns[2] = {b->chunk, 1};
  float *x = frand(b, (size_t)b->chunk * d, 1.0), *g = frand(b, (size_t)d, 1.0);
  float *y = fbuf((size_t)b->chunk * d);
  for (int k = 0; k < 2; k++) {
    const int n = ns[k];
    struct bench_loop l;
    TIME(l, b) op_rmsnorm(y, x, g, n, d, (float)b->m->norm_eps);
    /* flops 4 n d (square-add, then x r g); bytes 4 (2 n d + d) */
    record(b, name, 4.0 * n * d, 4.0 * (2.0 * n * d + d), &l, "n=%d d=%d", n, d);
  }
  free(x), free(g), free(y);
}

/* Three rows: op_rope_apply (the angles and one tensor rotated, as a lone
 * caller runs it), the angle table alone (op_rope_angles_init, once per
 * attention tile in the model), and one tensor rotated from the table
 * (op_rope_rotate, what each of the tile's five rotations costs then). */
static void case_rope(struct bench *b, const char *name) {
  const int H = b->m->heads, hd = b->m->head_dim, rd = b->m->rope_dim, ns[2] = {b->chunk, 1};
  float *x = frand(b, (size_t)b->chunk * H * hd, 1.0), *abuf = fbuf(op_rope_angles_floats(&b->rope_q, b->chunk) + 1);
  int64_t *pos = bench_positions(4096, b->chunk);
  struct op_rope_angles ang;
  for (int k = 0; k < 2; k++) {
    const int n = ns[k];
    struct bench_loop l;
    TIME(l, b) op_rope_apply(x, &b->rope_q, pos, n, H, H * hd, 1);
    /* flops 3 n H rope_dim (6 per pair; the n rope_dim/2 cos/sin in double not
     * counted); bytes 8 n H rope_dim (the rope slice read and written) + 8 n */
    record(b, name, 3.0 * n * H * rd, 8.0 * n * H * rd + 8.0 * n, &l, "q n=%d heads=%d dim=%d rope=%d", n, H, hd,
           rd);
    TIME(l, b) op_rope_angles_init(&ang, abuf, &b->rope_q, pos, n);
    /* flops: the cos/sin are not counted; bytes 8 n + 4 n rope_dim (positions
     * read, the cos and sin tables written) */
    record(b, name, 0, 8.0 * n + 4.0 * n * rd, &l, "angles n=%d rope=%d (once per tile)", n, rd);
    TIME(l, b) op_rope_rotate(x, &b->rope_q, &ang, 0, n, H, H * hd, 1);
    /* as op_rope_apply, plus the table read: 4 n rope_dim bytes */
    record(b, name, 3.0 * n * H * rd, 8.0 * n * H * rd + 4.0 * n * rd, &l, "q n=%d heads=%d from the angles", n, H);
  }
  free(x), free(abuf), free(pos);
}

static void case_q_path(struct bench *b, const char *name) {
  const struct plan_model *m = b->m;
  const int d = m->hidden, r = m->q_rank, qo = m->heads * m->head_dim, io = m->idx_heads * m->idx_head_dim;
  const int iH = m->idx_heads, C = b->chunk, ns[2] = {C, 1};
  float *Wa = frand(b, (size_t)r * d, 1.0 / sqrt(d)), *ga = frand(b, (size_t)r, 1.0);
  float *Wb = frand(b, (size_t)qo * r, 1.0 / sqrt(r)), *Wi = frand(b, (size_t)io * r, 1.0 / sqrt(r));
  float *Ww = frand(b, (size_t)iH * d, 1.0 / sqrt(d)), *u = frand(b, (size_t)C * d, 1.0);
  float *cq = fbuf((size_t)C * r), *q = fbuf((size_t)C * qo), *qI = fbuf((size_t)C * io), *w = fbuf((size_t)C * iH);
  int64_t *pos = bench_positions(4096, C);
  const float eps = (float)m->norm_eps, ws = op_index_weight_scale(iH, m->idx_head_dim);
  /* The tile's angle table is built inside the loop (q is its first user in
   * the model); qI shares it when its frequencies agree, as in the model. */
  const bool share = op_rope_same_angles(&b->rope_q, &b->rope_i);
  float *abuf = fbuf(op_rope_angles_floats(&b->rope_q, C) + 1), *aibuf = fbuf(op_rope_angles_floats(&b->rope_i, C) + 1);
  struct op_rope_angles aq, ai;
  for (int k = 0; k < 2; k++) {
    const int n = ns[k];
    struct bench_loop l;
    TIME(l, b) {
      op_rope_angles_init(&aq, abuf, &b->rope_q, pos, n);
      if (!share) op_rope_angles_init(&ai, aibuf, &b->rope_i, pos, n);
      op_q_latent(cq, u, Wa, ga, n, d, r, eps);
      op_q_main(q, cq, Wb, &aq, &b->rope_q, n, r, m->heads, m->head_dim, m->q_head_norm, eps);
      op_q_indexer(qI, cq, Wi, share ? &aq : &ai, &b->rope_i, n, r, iH, m->idx_head_dim);
      op_index_weights(w, u, Ww, n, d, iH, ws);
    }
    /* flops 2 n (d r + r qo + r io + d iH): the four GEMMs (norms, RoPE not
     * counted); bytes 4 (weights d r + r + r qo + r io + iH d) + 4 n (d + r +
     * qo + io + iH): u read, c_q, q, qI, w written */
    double W = (double)d * r + r + (double)r * qo + (double)r * io + (double)iH * d;
    record(b, name, 2.0 * n * ((double)d * r + (double)r * qo + (double)r * io + (double)d * iH),
           4.0 * W + 4.0 * n * ((double)d + r + qo + io + iH), &l, "n=%d hidden=%d q_rank=%d q=%d qI=%d", n, d, r,
           qo, io);
    TIME(l, b) {
      op_linear(cq, u, Wa, n, d, r, d, r);
      op_linear(q, cq, Wb, n, r, qo, r, qo);
      op_linear(qI, cq, Wi, n, r, io, r, io);
      op_linear(w, u, Ww, n, d, iH, d, iH);
    }
    record_gemm(b, &l);
  }
  free(Wa), free(ga), free(Wb), free(Wi), free(Ww), free(u), free(cq), free(q), free(qI), free(w), free(pos);
  free(abuf), free(aibuf);
}

static void case_swa_kv(struct bench *b, const char *name) {
  const struct plan_model *m = b->m;
  const int d = m->hidden, hd = m->head_dim, C = b->chunk, ns[2] = {C, 1};
  const struct op_kv_format sf = fmt_swa(m);
  const size_t eb = op_kv_bytes(&sf, hd);
  float *W = frand(b, (size_t)hd * d, 1.0 / sqrt(d)), *g = frand(b, (size_t)hd, 1.0), *u = frand(b, (size_t)C * d, 1);
  float *kS = fbuf((size_t)C * hd);
  uint8_t *out = bench_alloc((size_t)C * eb);
  int64_t *pos = bench_positions(4096, C);
  struct op_rope rope;
  const struct op_rope_params *pr = &m->rope_swa;
  op_rope_init(&rope, hd, m->rope_dim, true, pr->theta, pr->yarn, pr->yarn_factor, pr->yarn_original_len,
               pr->yarn_beta_fast, pr->yarn_beta_slow);
  /* The layer's angle table, built before the loop: in the model q_path's
   * timed build serves kS too (see the rope rows for its cost). */
  float *abuf = fbuf(op_rope_angles_floats(&rope, C) + 1);
  struct op_rope_angles ang;
  op_rope_angles_init(&ang, abuf, &rope, pos, C);
  for (int k = 0; k < 2; k++) {
    const int n = ns[k];
    struct bench_loop l;
    TIME(l, b) {
      op_swa_kv(kS, u, W, g, &ang, &rope, n, d, hd, (float)m->norm_eps);
      op_swa_pack(out, kS, n, hd, &sf, eb);
    }
    /* flops 2 n d hd (the projection); bytes 4 (hd d + hd + n d) + n entry:
     * W, gamma, u read, FP8 entries written (kS is an intermediate) */
    record(b, name, 2.0 * n * d * hd, 4.0 * ((double)hd * d + hd + (double)n * d) + (double)n * eb, &l,
           "n=%d hidden=%d head_dim=%d fp8 %zu B", n, d, hd, eb);
    TIME(l, b) op_linear(kS, u, W, n, d, hd, d, hd);
    record_gemm(b, &l);
  }
  free(W), free(g), free(u), free(kS), free(out), free(pos), free(abuf);
}

/* ---- compressor ------------------------------------------------------------ */

static void case_compress(struct bench *b, const char *name) {
  const struct plan_model *m = b->m;
  const int r = strstr(name, "r2") ? 2 : 1, d = m->head_dim, id = m->idx_head_dim, hid = m->hidden, C = b->chunk;
  const size_t mb = op_fp4_bytes(d, m->main_kv.block), ib = op_mxfp4_bytes(id, m->indexer_k.block);
  float *Wkv = frand(b, (size_t)d * hid, 1.0 / sqrt(hid)), *gam = frand(b, (size_t)d, 1.0);
  float *Wg = r > 1 ? frand(b, (size_t)d * hid, 1.0 / sqrt(hid)) : NULL, *u = frand(b, (size_t)C * hid, 1);
  float *Wik = frand(b, (size_t)id * d, 1.0 / sqrt(d));
  float *scratch = fbuf(op_comp_scratch_floats(C, r, d, id));
  float *tbuf = r > 1 ? frand(b, op_comp_tail_floats(r, d), 1.0) : NULL;
  uint8_t *entries = bench_alloc((size_t)(C / r + 1) * (mb + ib));
  float *gv = fbuf((size_t)C * d), *gg = fbuf((size_t)C * d), *gk = fbuf((size_t)(C / r + 1) * id);
  struct op_comp_layer L = {.ratio = r, .hidden = hid, .d = d, .idx_dim = id, .W_kv = Wkv, .W_gate = Wg,
                            .gamma = gam, .W_ik = Wik, .k_norm = m->idx_k_norm, .eps = (float)m->norm_eps,
                            .rope = &b->rope_q, .rope_i = &b->rope_i, 
                            .main_fmt = fmt_main(m), .idx_fmt = fmt_idx(m)};
  struct op_comp_out out = {.entries = entries, .entry_bytes = mb + ib, .main_off = 0, .idx_off = mb,
                            .max_entries = C / r + 1};
  struct op_comp_tail t;
  /* The tile's angle table (positions 0 .. C - 1), built before the loop as
   * the layer shares it; the decode row's entry began in the tail, so it
   * computes its own, as in the model. */
  int64_t *pos = bench_positions(0, C);
  float *abuf = fbuf(op_rope_angles_floats(&b->rope_q, C) + 1);
  struct op_rope_angles ang;
  op_rope_angles_init(&ang, abuf, &b->rope_q, pos, C);
  for (int k = 0; k < 2; k++) {
    /* The chunk starts a fresh request; the decode step is the one that
     * completes a group (r - 1 rows already pending in the tail). */
    const int n = k == 0 ? C : 1, e = k == 0 ? C / r : 1;
    struct bench_loop l;
    TIME(l, b) {
      op_comp_tail_init(&t, tbuf, r, d, 0);
      t.count = k == 0 ? 0 : r - 1;
      op_compress(&out, &t, scratch, u, t.count, n, &L, k == 0 ? &ang : NULL);
    }
    /* flops 2 n hid d (r > 1 ? 2 : 1) (v and gate projections) + e 2 d id
     * (W_ik per entry; pooling, norms, RoPE, packing not counted); bytes 4
     * (weights + n hid) + e (mb + ib) entries written (+ 8 (r-1) d tail read) */
    double w = (double)d * hid * (r > 1 ? 2 : 1) + d + (double)id * d;
    record(b, name, 2.0 * n * hid * d * (r > 1 ? 2 : 1) + 2.0 * e * d * id,
           4.0 * (w + (double)n * hid) + (double)e * (mb + ib) + (k ? 8.0 * (r - 1) * d : 0.0), &l,
           "%s n=%d hidden=%d d=%d -> %d entries", k ? "decode" : "chunk", n, hid, d, e);
    TIME(l, b) { /* as the op calls them: the value and gate projections of the n rows, then W_ik
                  * one entry at a time (compressor.c: an entry's bits never depend on the call) */
      op_linear(gv, u, Wkv, n, hid, d, hid, d);
      if (r > 1) op_linear(gg, u, Wg, n, hid, d, hid, d);
      for (int j = 0; j < e; j++) op_linear(gk + (size_t)j * id, gv + (size_t)j * d, Wik, 1, d, id, d, id);
    }
    record_gemm(b, &l);
  }
  free(Wkv), free(Wg), free(gam), free(Wik), free(u), free(scratch), free(tbuf), free(entries), free(pos), free(abuf);
  free(gv), free(gg), free(gk);
}

/* ---- storage formats -------------------------------------------------------- */

/* One entry through codec `kind` (0 FP4 Main KV, 1 MXFP4 Indexer K, 2 FP8
 * SWA, with the plan's formats): x packed into q, or q unpacked into y. */
static void codec_one(const struct op_kv_format *f, bool pack, uint8_t *q, float *y, const float *x, int W) {
  if (pack) op_kv_pack(f, q, x, W);
  else op_kv_unpack(f, y, q, W);
}

/* name: fp4_*, mxfp4_* or fp8_*, then _pack or _unpack. */
static void case_codec(struct bench *b, const char *name) {
  const struct plan_model *m = b->m;
  const int kind = name[0] == 'm' ? 1 : name[2] == '4' ? 0 : 2, n = CODEC_ENTRIES;
  const bool pack = strstr(name, "_unpack") == NULL;
  const int W = kind == 1 ? m->idx_head_dim : m->head_dim;
  const struct op_kv_format f = kind == 0 ? fmt_main(m) : kind == 1 ? fmt_idx(m) : fmt_swa(m);
  const int blk = f.block;
  const size_t eb = op_kv_bytes(&f, W);
  float *x = frand(b, (size_t)n * W, 4.0), *y = fbuf((size_t)n * W);
  uint8_t *q = bench_alloc((size_t)n * eb);
  for (int e = 0; e < n; e++) codec_one(&f, true, q + e * eb, NULL, x + (size_t)e * W, W); /* for unpack */
  struct bench_loop l;
  TIME(l, b) {
    for (int e = 0; e < n; e++) codec_one(&f, pack, q + e * eb, y + (size_t)e * W, x + (size_t)e * W, W);
  }
  /* flops: a nominal 1 per value (the scaling; rounding is integer work);
   * bytes 4 n W floats + n eb packed bytes, one side read and one written */
  record(b, name, (double)n * W, 4.0 * n * W + (double)n * eb, &l, "%d entries of %d, block %d, %zu B", n, W, blk,
         eb);
  free(x), free(y), free(q);
}

/* ---- the global source: indexer, Top-K, pool, reindex, attention --------------- */

/* The shared source, built on first use. */
static const struct bench_kv *kvpool(struct bench *b) {
  const struct plan_model *m = b->m;
  if (!b->kv.mem)
    bench_kv_init(&b->kv, CTX_MAX, b->p->serving.page_tokens, m->head_dim, fmt_main(m), m->idx_head_dim, fmt_idx(m),
                  &b->rng);
  return &b->kv;
}

/* Full scan (op_indexer_topk) of S queries ending at position ctx - 1. */
static void time_scan(struct bench *b, const char *name, const float *q, const float *w, int S, int64_t ctx) {
  const struct plan_model *m = b->m;
  const int iH = m->idx_heads, id = m->idx_head_dim, k = m->topk;
  struct op_kv_view v = kvpool(b)->view;
  v.n_entries = ctx;
  int64_t *pos = bench_positions(ctx - S, S);
  int32_t *topk = ibuf((size_t)S * k);
  void *work = bench_alloc(op_indexer_topk_work_bytes(&v, pos, S, 0));
  double keys = 0;
  for (int i = 0; i < S; i++) keys += (double)op_indexer_visible(&v, pos[i]);
  struct bench_loop l;
  char c[24];
  TIME(l, b) op_indexer_topk(topk, NULL, work, q, w, pos, &v, S, iH, k, 0, 0, false);
  /* flops (2 id + 2) iH per (query, visible key): the dot, w ReLU, the head
   * sum (key dequantization not counted); bytes: each visible key's Indexer-K
   * part once (idx_bytes, not the whole entry) + 4 S (iH id + iH + k) + 8 S */
  record(b, name, keys * iH * (2.0 * id + 2.0),
         (double)ctx * kvpool(b)->idx_bytes + 4.0 * S * ((double)iH * id + iH + k) + 8.0 * S, &l,
         "%s S=%d ctx=%s heads=%d dim=%d k=%d", S == 1 ? "decode" : "chunk", S, bench_count_str(c, ctx), iH, id, k);
  free(pos), free(topk), free(work);
}

static void case_indexer(struct bench *b, const char *name) {
  const int iH = b->m->idx_heads, id = b->m->idx_head_dim, C = b->scan_chunk;
  float *q = frand(b, (size_t)C * iH * id, 1.0), *w = frand(b, (size_t)C * iH, 1.0);
  time_scan(b, name, q, w, C, 4096);
  for (int64_t ctx = 4096; ctx <= CTX_MAX; ctx *= 16) time_scan(b, name, q, w, 1, ctx);
  free(q), free(w);
}

static void case_topk(struct bench *b, const char *name) {
  const int k = b->m->topk;
  float *s = frand(b, CTX_MAX, 1.0);
  int32_t *out = ibuf((size_t)k);
  for (int64_t n = 65536; n <= CTX_MAX; n *= 16) {
    struct bench_loop l;
    TIME(l, b) op_topk_select(out, s, n, k);
    /* flops: a nominal 1 compare per score; bytes 4 n + 4 k */
    record(b, name, (double)n, 4.0 * n + 4.0 * k, &l, "n=%lld k=%d", (long long)n, k);
  }
  free(s), free(out);
}

static void case_pool(struct bench *b, const char *name) {
  const int B = b->m->cand_block, top = b->m->cand_top_blocks;
  float *s = frand(b, CTX_MAX, 1.0), *bs = fbuf((size_t)(CTX_MAX / B + 1));
  int32_t *blocks = ibuf((size_t)top), *entries = ibuf((size_t)top * B);
  for (int64_t n = 65536; n <= CTX_MAX; n *= 16) {
    struct bench_loop l;
    TIME(l, b) {
      int got = op_pool_select(blocks, bs, s, n, B, top, true);
      op_pool_expand(entries, blocks, got, B, n);
    }
    /* flops: a nominal 1 compare per score; bytes 4 n scores + 4 n/B block
     * scores written + 4 top (1 + B) block ids and entries written */
    record(b, name, (double)n, 4.0 * n + 4.0 * n / B + 4.0 * top * (1.0 + B), &l, "n_vis=%lld block=%d top=%d",
           (long long)n, B, top);
  }
  free(s), free(bs), free(blocks), free(entries);
}

static void case_reindex(struct bench *b, const char *name) {
  const struct plan_model *m = b->m;
  const int iH = m->idx_heads, id = m->idx_head_dim, k = m->topk, B = m->cand_block, top = m->cand_top_blocks;
  const int C = b->scan_chunk, ns[2] = {C, 1};
  const struct op_kv_view *v = &kvpool(b)->view;
  char c[24];
  float *q = frand(b, (size_t)C * iH * id, 1.0), *w = frand(b, (size_t)C * iH, 1.0);
  int32_t *pool = ibuf((size_t)C * top), *topk = ibuf((size_t)C * k);
  int32_t *perm = bench_iota(CTX_MAX / B);
  for (int i = 0; i < C; i++) bench_pick(pool + (size_t)i * top, top, perm, CTX_MAX / B, &b->rng);
  void *work = bench_alloc(op_indexer_reindex_work_bytes(v, B, top));
  int64_t *pos = bench_positions(CTX_MAX - C, C);
  for (int j = 0; j < 2; j++) {
    const int S = ns[j];
    const int64_t *ps = pos + (C - S); /* the decode step is the last position */
    struct bench_loop l;
    TIME(l, b) op_indexer_reindex(topk, work, pool, q, w, ps, v, S, iH, k, B, top);
    /* flops (2 id + 2) iH per (query, candidate), top B candidates each;
     * bytes per query: top B Indexer-K parts + 4 top pool ids + 4 (iH id +
     * iH + k) + 8 */
    double cand = (double)top * B;
    record(b, name, S * cand * iH * (2.0 * id + 2.0),
           S * (cand * kvpool(b)->idx_bytes + 4.0 * top + 4.0 * ((double)iH * id + iH + k) + 8.0), &l,
           "%s S=%d pool=%dx%d ctx=%s heads=%d dim=%d", S == 1 ? "decode" : "chunk", S, top, B, bench_count_str(c, CTX_MAX), iH,
           id);
  }
  free(q), free(w), free(pool), free(topk), free(perm), free(work), free(pos);
}

/* A ring of `slots` SWA entries holding positions first .. first + slots - 1. */
static uint8_t *swa_ring(struct bench *b, int64_t **spos, int slots, int64_t first, size_t *eb) {
  const struct plan_model *m = b->m;
  const int hd = m->head_dim;
  const struct op_kv_format sf = fmt_swa(m);
  *eb = op_kv_bytes(&sf, hd);
  uint8_t *ring = bench_alloc((size_t)slots * *eb);
  float *x = fbuf((size_t)hd);
  for (int s = 0; s < slots; s++) {
    bench_fill(x, (size_t)hd, 2.0f, &b->rng);
    op_kv_pack(&sf, ring + s * *eb, x, hd);
  }
  free(x);
  *spos = bench_positions(first, slots);
  return ring;
}

static void case_attention(struct bench *b, const char *name) {
  const struct plan_model *m = b->m;
  const int H = m->heads, hd = m->head_dim, k = m->topk, W = m->window, C = b->scan_chunk, ns[2] = {C, 1};
  const struct bench_kv *kv = kvpool(b);
  int64_t *spos, *pos = bench_positions(CTX_MAX - C, C);
  size_t sb;
  uint8_t *ring = swa_ring(b, &spos, W + C, CTX_MAX - C - W, &sb);
  float *q = frand(b, (size_t)C * H * hd, 1.0), *o = fbuf((size_t)C * H * hd), *sink = frand(b, (size_t)H, 1);
  int32_t *idx = ibuf((size_t)C * k), *perm = bench_iota(CTX_MAX - C);
  float *abuf = fbuf(op_rope_angles_floats(&b->rope_q, C) + 1);
  struct op_rope_angles ang;
  for (int i = 0; i < C; i++) bench_pick(idx + (size_t)i * k, k, perm, CTX_MAX - C, &b->rng); /* all causal */
  struct op_attn_params pr = {.heads = H, .head_dim = hd, .topk = k, .window = W, .r0 = 0,
                              .tau = (float)plan_softmax_scale(b->p), .sink = m->sink ? sink : NULL,
                              .rope = &b->rope_q};
  for (int j = 0; j < 2; j++) {
    /* The S queries are the last S positions; their view of the ring holds
     * exactly the W + S - 1 positions they can see (W for a decode step, the
     * chunk's own entries too for a chunk). */
    const int S = ns[j], off = C - S, first = C - S + 1;
    struct op_swa_view swa = {.slots = ring + (size_t)first * sb, .pos = spos + first, .n_slots = W + S - 1,
                              .entry_bytes = sb, .w = hd, .fmt = fmt_swa(m)};
    op_rope_angles_init(&ang, abuf, &b->rope_q, pos + off, S); /* the layer's table, built by q_path */
    pr.angles = &ang;
    struct bench_loop l;
    TIME(l, b) op_sparse_attn(o + (size_t)off * H * hd, NULL, q + (size_t)off * H * hd, pos + off,
                              idx + (size_t)off * k, &kv->view, &swa, S, &pr);
    /* flops 4 H hd (k + W) per query: q.k and the weighted sum, every head,
     * every entry (exp, rescales, dequantization, inverse RoPE not counted);
     * bytes per query k (main_bytes + 4) + 8 H hd (q read, o written) + 8,
     * and the ring's W + S - 1 visible entries once */
    record(b, name, 4.0 * S * H * hd * (k + W),
           S * (k * (kv->main_bytes + 4.0) + 8.0 * H * hd + 8.0) + (double)(W + S - 1) * sb, &l,
           "%s S=%d heads=%d d=%d topk=%d+window=%d", S == 1 ? "decode" : "chunk", S, H, hd, k, W);
  }
  free(pos), free(spos), free(ring), free(q), free(o), free(sink), free(idx), free(perm), free(abuf);
}

static void case_oproj(struct bench *b, const char *name) {
  const struct plan_model *m = b->m;
  const int H = m->heads, hd = m->head_dim, G = m->o_groups, R = m->o_rank, d = m->hidden, C = b->chunk;
  const int gw = H / G * hd, ns[2] = {C, 1};
  float *o = frand(b, (size_t)C * H * hd, 1.0), *Wa = frand(b, (size_t)G * R * gw, 1.0 / sqrt(gw));
  float *Wb = frand(b, (size_t)d * G * R, 1.0 / sqrt(G * R)), *a = fbuf((size_t)C * d);
  float *z = fbuf((size_t)C * G * R);
  for (int j = 0; j < 2; j++) {
    const int n = ns[j];
    struct bench_loop l;
    TIME(l, b) op_grouped_oproj(a, z, o, Wa, Wb, n, H, hd, G, R, d);
    /* flops 2 n (H hd R + G R d); bytes 4 (G R gw + d G R) weights + 4 n (H
     * hd + G R + d): o read, z and a written */
    record(b, name, 2.0 * n * ((double)H * hd * R + (double)G * R * d),
           4.0 * ((double)G * R * gw + (double)d * G * R) + 4.0 * n * ((double)H * hd + (double)G * R + d), &l,
           "n=%d in=%d groups=%d o_rank=%d hidden=%d", n, H * hd, G, R, d);
    TIME(l, b) {
      for (int g = 0; g < G; g++)
        op_linear(z + (size_t)g * R, o + (size_t)g * gw, Wa + (size_t)g * R * gw, n, gw, R, H * hd, G * R);
      op_linear(a, z, Wb, n, G * R, d, G * R, d);
    }
    record_gemm(b, &l);
  }
  free(o), free(Wa), free(Wb), free(a), free(z);
}

/* ---- MoE, mHC ---------------------------------------------------------------- */

/* The MoE row's GEMMs alone, at the shapes its call ran: the router and the
 * shared expert over n rows, and each routed expert over the tokens sel sent
 * it (gate, up, down). */
static void moe_gemms(struct bench *b, const struct op_moe_weights *w, const int32_t *sel, const float *x, int n,
                      const struct op_moe_cfg *c) {
  const int d = c->hidden, R = c->n_routed, I = c->inter, SI = c->n_shared * c->shared_inter;
  const int wide = (I > SI ? I : SI) > (d > R ? d : R) ? (I > SI ? I : SI) : (d > R ? d : R);
  int *cnt = calloc((size_t)R, sizeof *cnt);
  float *t1 = fbuf((size_t)n * wide), *t2 = fbuf((size_t)n * wide);
  CEDAR_ASSERT(cnt);
  for (int t = 0; t < n * c->n_active; t++) cnt[sel[t]]++;
  struct bench_loop l;
  TIME(l, b) {
    op_linear(t1, x, w->router, n, d, R, d, R);
    if (SI > 0) {
      op_linear(t1, x, w->shared_gate, n, d, SI, d, SI);
      op_linear(t2, x, w->shared_up, n, d, SI, d, SI);
      op_linear(t2, t1, w->shared_down, n, SI, d, SI, d);
    }
    for (int e = 0; e < R; e++) {
      if (!cnt[e]) continue;
      op_linear(t1, x, w->gate + (size_t)e * I * d, cnt[e], d, I, d, I);
      op_linear(t2, x, w->up + (size_t)e * I * d, cnt[e], d, I, d, I);
      op_linear(t2, t1, w->down + (size_t)e * d * I, cnt[e], I, d, I, d);
    }
  }
  record_gemm(b, &l);
  free(cnt), free(t1), free(t2);
}

static void case_moe(struct bench *b, const char *name) {
  const struct plan_model *m = b->moe_m;
  const struct op_moe_cfg c = {
      .hidden = m->hidden, .n_routed = m->n_routed, .n_active = m->n_active, .inter = m->moe_inter,
      .n_shared = m->n_shared, .shared_inter = m->shared_inter, .norm_topk = m->moe_norm_topk,
      .score = m->moe_score == PLAN_SCORE_SOFTMAX ? OP_MOE_SOFTMAX
               : m->moe_score == PLAN_SCORE_SIGMOID ? OP_MOE_SIGMOID : OP_MOE_SQRTSOFTPLUS,
      .route_scale = (float)m->route_scale, .limit = (float)m->swiglu_limit};
  const int d = c.hidden, R = c.n_routed, A = c.n_active, I = c.inter, SI = c.n_shared * c.shared_inter;
  const int C = b->chunk, ns[2] = {C, 1};
  const double s_in = 1.0 / sqrt(d), s_mid = 1.0 / sqrt(I);
  struct op_moe_weights w = {
      .router = frand(b, (size_t)R * d, s_in), .bias = frand(b, 2 * (size_t)R, 0.1),
      .gate = frand(b, (size_t)R * I * d, s_in), .up = frand(b, (size_t)R * I * d, s_in),
      .down = frand(b, (size_t)R * d * I, s_mid), .shared_gate = frand(b, (size_t)SI * d, s_in),
      .shared_up = frand(b, (size_t)SI * d, s_in), .shared_down = frand(b, (size_t)d * SI, 1.0 / sqrt(SI + 1))};
  float *x = frand(b, (size_t)C * d, 1.0), *y = fbuf((size_t)C * d), *wt = fbuf((size_t)C * A);
  int32_t *sel = ibuf((size_t)C * A);
  void *ws = bench_alloc(op_moe_workspace_bytes(C, &c));
  bool *used = bench_alloc((size_t)R);
  for (int j = 0; j < 2; j++) {
    const int n = ns[j];
    struct bench_loop l;
    TIME(l, b) op_moe_forward(y, sel, wt, x, &w, NULL, n, &c, ws);
    int touched = 0; /* experts whose weights this call read */
    memset(used, 0, (size_t)R);
    for (int t = 0; t < n * A; t++) touched += !used[sel[t]], used[sel[t]] = true;
    /* flops 2 n d R (router) + 6 n d (A I + SI) (three GEMMs per expert);
     * bytes 4 (R d router + touched 3 I d + 3 SI d) + 8 n d (x read, y written) */
    record(b, name, 2.0 * n * d * R + 6.0 * n * d * ((double)A * I + SI),
           4.0 * ((double)R * d + 3.0 * touched * I * d + 3.0 * SI * d) + 8.0 * n * d, &l,
           "n=%d d=%d top %d/%d inter=%d shared=%d, %d read", n, d, A, R, I, SI, touched);
    moe_gemms(b, &w, sel, x, n, &c);
  }
  free((void *)w.router), free((void *)w.bias), free((void *)w.gate), free((void *)w.up), free((void *)w.down);
  free((void *)w.shared_gate), free((void *)w.shared_up), free((void *)w.shared_down);
  free(x), free(y), free(wt), free(sel), free(ws), free(used);
}

/* "mhc": op_mhc_coeffs + op_mhc_mix before a sublayer, op_mhc_update after
 * it; "mhc_fused": op_mhc_update_mix_fused + op_mhc_coeffs_from_stats, the
 * same state transition in one pass (SPEC 3.14). */
static void case_mhc(struct bench *b, const char *name) {
  const struct plan_model *m = b->m;
  const struct op_mhc_cfg c = {.hc = m->hc_streams, .hidden = m->hidden, .sinkhorn_iters = m->hc_sinkhorn_iters,
                               .hc_eps = (float)m->hc_eps, .norm_eps = (float)m->norm_eps};
  const int hc = c.hc, d = c.hidden, M = op_mhc_rows(hc), Wd = hc * d, C = b->chunk, ns[2] = {C, 1};
  const bool fused = strstr(name, "fused") != NULL;
  float *X = frand(b, (size_t)C * Wd, 1.0), *Xn = fbuf((size_t)C * Wd), *F = frand(b, (size_t)C * d, 1);
  float *Wfn = frand(b, (size_t)M * Wd, 1.0 / sqrt(Wd)), *scale = frand(b, 3, 1.0), *base = frand(b, (size_t)M, 1);
  float *pre = frand(b, (size_t)C * hc, 1.0), *post = fbuf((size_t)C * hc), *Cm = fbuf((size_t)C * hc * hc);
  float *dots = fbuf((size_t)C * M), *ss = fbuf((size_t)C), *u = fbuf((size_t)C * d);
  op_mhc_coeffs(pre, post, Cm, dots, ss, X, Wfn, scale, base, C, &c); /* valid C and post for the fused row */
  for (int j = 0; j < 2; j++) {
    const int n = ns[j];
    struct bench_loop l;
    if (fused) {
      TIME(l, b) {
        op_mhc_update_mix_fused(Xn, u, dots, ss, X, Cm, post, F, pre, Wfn, n, M, hc, d);
        op_mhc_coeffs_from_stats(pre, post, Cm, dots, ss, scale, base, n, &c);
      }
    } else {
      TIME(l, b) {
        op_mhc_coeffs(pre, post, Cm, dots, ss, X, Wfn, scale, base, n, &c);
        op_mhc_mix(u, X, pre, n, hc, d);
        op_mhc_update(Xn, X, Cm, post, F, n, hc, d);
      }
    }
    /* flops per position: 2 M Wd (dots) + 2 Wd (sum of squares) + 2 Wd (mix)
     * + (2 hc + 2) Wd (update) + 4 iters hc^2 (Sinkhorn); bytes 4 (M Wd)
     * weights + 4 n (2 Wd + 2 d): X and F read, X' and u written, once */
    record(b, name, n * (2.0 * M * Wd + (2.0 * hc + 6.0) * Wd + 4.0 * c.sinkhorn_iters * hc * hc),
           4.0 * M * Wd + 4.0 * n * (2.0 * Wd + 2.0 * d), &l, "n=%d streams=%d hidden=%d rows=%d", n, hc, d, M);
    TIME(l, b) op_linear(dots, X, Wfn, n, Wd, M, Wd, M); /* the M dot products through sgemm */
    record_gemm(b, &l);
  }
  free(X), free(Xn), free(F), free(Wfn), free(scale), free(base), free(pre), free(post), free(Cm), free(dots);
  free(ss), free(u);
}

/* ---- Engram, sampling ---------------------------------------------------------- */

/* name: engram_hash, engram_gather or engram_inject. One module's tables,
 * bounded to ENGRAM_MAX_BYTES (see the notes the run prints). */
static void case_engram(struct bench *b, const char *name) {
  const struct plan_model *m = b->m;
  const int no = m->engram_n_orders, nh = m->engram_heads, hd = m->engram_head_dim, T = no * nh;
  const int blk = hd % 32 == 0 ? 32 : hd, hc = m->hc_streams, hid = m->hidden, de = T * hd, C = b->chunk;
  int max_order = 0;
  for (int i = 0; i < no; i++) max_order = m->engram_orders[i] > max_order ? m->engram_orders[i] : max_order;
  const size_t rb = op_engram_row_bytes(hd, blk);
  struct op_engram_tables t;
  uint64_t mult[64];
  int32_t *cmap = ibuf((size_t)m->vocab), *tok = ibuf((size_t)(C + max_order));
  int64_t *row = bench_alloc((size_t)C * T * 8);
  if (op_engram_tables_init(&t, 1, no, nh, b->engram_base) != 0) {
    fprintf(stderr, "cedar bench: engram tables (%d x %d from %lld) failed\n", no, nh, (long long)b->engram_base);
    exit(1);
  }
  op_engram_cmap_modulo(cmap, m->vocab, m->engram_compressed_vocab);
  op_engram_multipliers_numpy(mult, 1, max_order, m->engram_compressed_vocab);
  for (int i = 0; i < C + max_order; i++) tok[i] = (int32_t)(op_rng_next(&b->rng) % (uint64_t)m->vocab);
  const int ns[2] = {C, 1}, hist[2] = {0, max_order - 1};
  uint8_t *table = NULL;
  float *e = NULL, *x = NULL, *kv = NULL, *wkv = NULL, *qw = NULL, *kw = NULL, *gate = NULL;
  op_engram_hash(row, tok, NULL, cmap, mult, m->engram_orders, t.prime, t.offset, 0, C, m->vocab, no, nh,
                 cmap[m->engram_pad_id]);
  if (strstr(name, "gather")) { /* FP8 rows: payload codes below 0x7F in magnitude, E8M0 scales near 1 */
    table = bench_alloc((size_t)t.rows[0] * rb), e = fbuf((size_t)C * de);
    for (size_t i = 0; i < (size_t)t.rows[0] * rb; i++)
      table[i] = (i % rb) < (size_t)hd ? (uint8_t)(op_rng_next(&b->rng) % 0x7E | (i & 1) << 7) : (uint8_t)(120 + i % 8);
  }
  if (strstr(name, "inject")) {
    e = frand(b, (size_t)C * de, 1.0), x = frand(b, (size_t)C * hc * hid, 1.0);
    kv = fbuf((size_t)C * (hc + 1) * hid), gate = fbuf((size_t)C * hc);
    wkv = frand(b, (size_t)(hc + 1) * hid * de, 1.0 / sqrt(de)), qw = frand(b, (size_t)hc * hid, 1.0);
    kw = frand(b, (size_t)hc * hid, 1.0);
  }
  for (int j = 0; j < 2; j++) {
    const int n = ns[j];
    struct bench_loop l;
    if (strstr(name, "hash")) {
      TIME(l, b) op_engram_hash(row, tok, NULL, cmap, mult, m->engram_orders, t.prime, t.offset, hist[j], n,
                                m->vocab, no, nh, cmap[m->engram_pad_id]);
      /* flops 0 (integer work); bytes 4 (n + hist) ids + 4 cmap lookups + 8 n T rows */
      record(b, name, 0.0, 8.0 * (n + hist[j]) + 8.0 * n * T, &l, "n=%d orders=%d heads=%d", n, no, nh);
    } else if (table) {
      TIME(l, b) op_engram_gather(e, table, row, n, T, hd, blk, t.rows[0]);
      /* flops: a nominal 1 per value (the scale); bytes n T (rb + 8) read + 4 n de written */
      record(b, name, (double)n * de, (double)n * T * (rb + 8.0) + 4.0 * n * de, &l,
             "n=%d rows=%d of %zu B, table %lld rows", n, T, rb, (long long)t.rows[0]);
    } else {
      TIME(l, b) op_engram_inject(x, kv, gate, e, wkv, qw, kw, n, de, hid, hc, (float)m->norm_eps, 1e-6f);
      /* flops 2 n de (hc + 1) hid (kv GEMM) + 10 n hc hid (gates, inject);
       * bytes 4 ((hc + 1) hid de + 2 hc hid) + 4 n (de + 2 hc hid + (hc + 1) hid) */
      record(b, name, 2.0 * n * de * (hc + 1) * hid + 10.0 * n * hc * hid,
             4.0 * ((double)(hc + 1) * hid * de + 2.0 * hc * hid) +
                 4.0 * n * ((double)de + 2.0 * hc * hid + (double)(hc + 1) * hid),
             &l, "n=%d d_e=%d streams=%d hidden=%d", n, de, hc, hid);
      TIME(l, b) op_linear(kv, e, wkv, n, de, (hc + 1) * hid, de, (hc + 1) * hid);
      record_gemm(b, &l);
    }
  }
  op_engram_tables_free(&t);
  free(cmap), free(tok), free(row), free(table), free(e), free(x), free(kv), free(wkv), free(qw), free(kw);
  free(gate);
}

static void case_sample(struct bench *b, const char *name) {
  const int V = b->m->vocab;
  const bool greedy = strstr(name, "greedy") != NULL;
  float *logits = frand(b, (size_t)V, 8.0), *prob = fbuf((size_t)V);
  int32_t *order = ibuf((size_t)V);
  uint64_t rng = 7;
  struct bench_loop l;
  if (greedy) {
    TIME(l, b) op_sample_greedy(logits, V);
    /* flops: a nominal 1 compare per logit; bytes 4 V */
    record(b, name, (double)V, 4.0 * V, &l, "V=%d", V);
  } else {
    TIME(l, b) op_sample(prob, order, logits, V, 1.0f, 0.9f, &rng);
    /* flops 4 V (softmax: subtract, scale, exp, sum; the sort by probability
     * is compares, not counted); bytes 4 V logits + 4 V prob + 4 V order */
    record(b, name, 4.0 * V, 12.0 * V, &l, "V=%d temperature=1 top_p=0.9", V);
  }
  free(logits), free(prob), free(order);
}

/* ---- the case table ------------------------------------------------------------ */

const struct bench_case bench_cases[] = {
    {"linear", case_linear},        {"rmsnorm", case_rmsnorm},          {"rope", case_rope},
    {"qlinear", case_qlinear},
    {"q_path", case_q_path},        {"swa_kv_pack", case_swa_kv},       {"compress_r2", case_compress},
    {"compress_r1", case_compress}, {"fp4_pack", case_codec},           {"fp4_unpack", case_codec},
    {"mxfp4_pack", case_codec},     {"mxfp4_unpack", case_codec},       {"fp8_pack", case_codec},
    {"fp8_unpack", case_codec},     {"indexer_scan", case_indexer},     {"topk_select", case_topk},
    {"pool_select", case_pool},     {"reindex", case_reindex},          {"sparse_attn", case_attention},
    {"grouped_oproj", case_oproj},  {"moe", case_moe},                  {"mhc", case_mhc},
    {"mhc_fused", case_mhc},        {"engram_hash", case_engram},       {"engram_gather", case_engram},
    {"engram_inject", case_engram}, {"sample_top_p", case_sample},      {"sample_greedy", case_sample},
};
const int bench_n_cases = (int)(sizeof bench_cases / sizeof bench_cases[0]);
