/* test_op_desc_attn.c: the registry descriptors of the attention families
 * (ops/formats.c, qkv.c, compressor.c, indexer.c, attention.c) run their op
 * exactly: for every descriptor, random inputs go through the registry
 * (h_io_run) and through the direct call, and the outputs must be the same
 * bits; and bad inputs (wrong shape, wrong dtype, missing or unwanted tensor,
 * bad parameter) are refused with a message that names the problem.
 *
 * What it is not: a numerical test of the ops (tests/test_ops_<family>.c and
 * tests/test_formats_*.c compare them with float64 references).
 * Run: ./build/tests/test_op_desc_attn (from the repo root). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention.h"
#include "ops/basic.h"
#include "ops/compressor.h"
#include "ops/formats.h"
#include "ops/indexer.h"
#include "ops/qkv.h"
#include "ops/registry.h"
#include "ops/rope.h"
#include "tests/harness.h"

static uint64_t seed = 20261;

/* ---- small helpers ------------------------------------------------------ */

/* Every input buffer of one check is kept (tests/harness.h: h_keep) and
 * freed together by h_kept_free(). */
static float *frand(size_t n, float lo, float hi) { return h_kept_floats(n, &seed, lo, hi); }


/* The input called `name` (to break one of its dims or its dtype). */
static struct op_tensor *in_named(struct h_io *h, const char *name) {
  for (int i = 0; i < h->n_in; i++)
    if (!strcmp(h->in_name[i], name)) return &h->in[i];
  EXPECT(0, "test bug: no input '%s'", name);
  static struct op_tensor dummy;
  return &dummy;
}

/* Output `name` has this dtype and shape and the bytes of `ref`. */
static void same(const struct h_io *h, const char *op, const char *name, enum op_dtype dt, int ndim,
                 const int64_t *shape, const void *ref) {
  const struct op_tensor *t = h_io_output(h, name);
  EXPECT(t, "%s: no output '%s' (%s)", op, name, h->error);
  if (!t) return;
  size_t count = 1;
  bool shape_ok = t->dtype == dt && t->ndim == ndim;
  for (int i = 0; shape_ok && i < ndim; i++) shape_ok = t->shape[i] == shape[i], count *= (size_t)shape[i];
  EXPECT(shape_ok, "%s: output '%s' has the wrong dtype or shape", op, name);
  if (shape_ok)
    EXPECT(!memcmp(t->data, ref, count * op_dtype_size(dt)), "%s: '%s' through the registry differs from the direct "
           "call", op, name);
}

/* Run `op` and expect success. */
static void runs(struct h_io *h, const char *op) {
  int rc = h_io_run(h, op);
  EXPECT(rc == 0, "%s failed (%d): %s", op, rc, h->error);
}

/* Run `op`, expect a refusal whose message contains `needle`, start over. */
static void refuses(struct h_io *h, const char *op, const char *needle) {
  int rc = h_io_run(h, op);
  EXPECT(rc < 0 && strstr(h->error, needle), "%s: expected a refusal with '%s', got %d '%s'", op, needle, rc,
         h->error);
  h_io_free(h);
  h_io_init(h);
}

/* ---- formats ------------------------------------------------------------ */

struct fmt_case {
  const char *pack, *unpack;
  int W, block, nibble, rule, scale; /* scale: FP8 only; block 0 = one per row */
};

static size_t fmt_bytes(const struct fmt_case *c) {
  if (!strcmp(c->pack, "fp8_pack")) return op_fp8_bytes(c->W, c->block ? c->block : c->W, c->scale);
  return op_fp4_bytes(c->W, c->block);
}

static void fmt_direct(const struct fmt_case *c, uint8_t *e, float *back, const float *x, int n) {
  const size_t b = fmt_bytes(c);
  for (int i = 0; i < n; i++) {
    const float *xi = x + (size_t)i * c->W;
    uint8_t *ei = e + (size_t)i * b;
    float *bi = back + (size_t)i * c->W;
    if (!strcmp(c->pack, "fp4_pack")) {
      op_fp4_pack(ei, xi, c->W, c->block, c->nibble);
      op_fp4_unpack(bi, ei, c->W, c->block, c->nibble);
    } else if (!strcmp(c->pack, "mxfp4_pack")) {
      op_mxfp4_pack(ei, xi, c->W, c->block, c->rule, c->nibble);
      op_mxfp4_unpack(bi, ei, c->W, c->block, c->nibble);
    } else {
      int blk = c->block ? c->block : c->W;
      op_fp8_pack(ei, xi, c->W, blk, c->scale);
      op_fp8_unpack(bi, ei, c->W, blk, c->scale);
    }
  }
}

static void fmt_params(struct h_io *h, const struct fmt_case *c) {
  h_io_param(h, "block", c->block);
  if (strcmp(c->pack, "fp8_pack")) h_io_param(h, "nibble", c->nibble);
  if (!strcmp(c->pack, "mxfp4_pack")) h_io_param(h, "scale_rule", c->rule);
  if (!strcmp(c->pack, "fp8_pack")) h_io_param(h, "scale", c->scale);
}

static void check_formats(void) {
  static const struct fmt_case cases[] = {
      {"fp4_pack", "fp4_unpack", 48, 16, 0, 0, 0},    {"fp4_pack", "fp4_unpack", 30, 6, 1, 0, 0},
      {"mxfp4_pack", "mxfp4_unpack", 64, 32, 0, 0, 0}, {"mxfp4_pack", "mxfp4_unpack", 40, 8, 1, 1, 0},
      {"fp8_pack", "fp8_unpack", 24, 0, 0, 0, 0},      {"fp8_pack", "fp8_unpack", 24, 8, 0, 0, 1},
      {"fp8_pack", "fp8_unpack", 21, 7, 0, 0, 0},
  };
  enum { N = 5 };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    const struct fmt_case *c = &cases[k];
    const size_t b = fmt_bytes(c);
    float *x = frand((size_t)N * c->W, -9, 9), *back = h_kept_zeros((size_t)N * c->W * sizeof(float));
    uint8_t *e = h_kept_zeros((size_t)N * b);
    x[3] = 0, x[c->W + 1] = -1e-30f; /* a zero and a tiny value among them */
    fmt_direct(c, e, back, x, N);
    struct h_io h;
    h_io_init(&h);
    h_io_input(&h, "x", OP_F32, 2, (int64_t[]){N, c->W}, x);
    fmt_params(&h, c);
    runs(&h, c->pack);
    same(&h, c->pack, "entries", OP_U8, 2, (int64_t[]){N, (int64_t)b}, e);
    h_io_free(&h);
    h_io_init(&h);
    h_io_input(&h, "entries", OP_U8, 2, (int64_t[]){N, (int64_t)b}, e);
    fmt_params(&h, c);
    runs(&h, c->unpack);
    same(&h, c->unpack, "x", OP_F32, 2, (int64_t[]){N, c->W}, back);
    h_io_free(&h);
  }
  /* Refusals: one per descriptor. */
  float *x = frand(64, -1, 1);
  uint8_t *e = h_kept_zeros(64);
  struct h_io h;
  h_io_init(&h);
  h_io_input(&h, "x", OP_F32, 2, (int64_t[]){2, 30}, x);
  refuses(&h, "fp4_pack", "rows of x have 30 values; need a positive multiple of block 16");
  h_io_input(&h, "entries", OP_U8, 2, (int64_t[]){2, 20}, e);
  refuses(&h, "fp4_unpack", "rows of entries have 20 bytes: no row width W packs to that with block 16");
  h_io_input(&h, "x", OP_F32, 2, (int64_t[]){1, 32}, x);
  h_io_param(&h, "nibble", 2);
  refuses(&h, "mxfp4_pack", "parameter nibble = 2 must be an integer in [0, 1]");
  h_io_input(&h, "entries", OP_F32, 2, (int64_t[]){1, 17}, x);
  refuses(&h, "mxfp4_unpack", "input 'entries' must be U8 with 2 dims");
  h_io_input(&h, "X", OP_F32, 2, (int64_t[]){1, 32}, x);
  refuses(&h, "fp8_pack", "missing input tensor 'x'");
  h_io_input(&h, "entries", OP_U8, 2, (int64_t[]){2, 4}, e);
  refuses(&h, "fp8_unpack", "rows of entries have 4 bytes");
  h_io_input(&h, "x", OP_F32, 2, (int64_t[]){2, -16}, x);
  refuses(&h, "fp4_pack", "input 'x' dim 1 is -16");
  h_io_input(&h, "x", OP_F32, 2, (int64_t[]){2, 32}, x);
  h_io_param(&h, "block", 15);
  refuses(&h, "fp4_pack", "block 15 must be even");
  h_io_free(&h);
  h_kept_free();
}

/* ---- query path and SWA KV ---------------------------------------------- */

/* RoPE parameters as the descriptors take them, and the same op_rope. */
static void rope_params(struct h_io *h, int rope_dim, bool yarn) {
  h_io_param(h, "rope_dim", rope_dim);
  h_io_param(h, "theta", yarn ? 160000 : 10000);
  h_io_param(h, "yarn", yarn);
}

static void rope_make(struct op_rope *r, int dim, int rope_dim, bool yarn) {
  EXPECT(op_rope_init(r, dim, rope_dim, true, yarn ? 160000 : 10000, yarn, 16, 65536, 32, 1) == 0, "rope init");
}

enum { QN = 3, HID = 37, QR = 19 };

static void check_q_latent_weights(void) {
  float *u = frand(QN * HID, -2, 2), *Wqa = frand(QR * HID, -1, 1), *g = frand(QR, 0.5f, 1.5f);
  float *Ww = frand(5 * HID, -1, 1), cq[QN * QR], cq1[QN * QR], w[QN * 5];
  op_q_latent(cq, u, Wqa, g, QN, HID, QR, 1e-6f);
  op_q_latent(cq1, u, Wqa, NULL, QN, HID, QR, 1e-5f);
  op_index_weights(w, u, Ww, QN, HID, 5, op_index_weight_scale(32, 128));
  struct h_io h;
  h_io_init(&h);
  h_io_input(&h, "u", OP_F32, 2, (int64_t[]){QN, HID}, u);
  h_io_input(&h, "W_qa", OP_F32, 2, (int64_t[]){QR, HID}, Wqa);
  h_io_input(&h, "W_w", OP_F32, 2, (int64_t[]){5, HID}, Ww);
  h_io_input(&h, "gamma_q", OP_F32, 1, (int64_t[]){QR}, g);
  runs(&h, "q_latent");
  same(&h, "q_latent", "cq", OP_F32, 2, (int64_t[]){QN, QR}, cq);
  runs(&h, "index_weights"); /* the default scale is R.4's at 32 x 128 */
  same(&h, "index_weights", "w", OP_F32, 2, (int64_t[]){QN, 5}, w);
  h_io_free(&h);
  h_io_init(&h); /* no gamma_q: weight 1 */
  h_io_input(&h, "u", OP_F32, 2, (int64_t[]){QN, HID}, u);
  h_io_input(&h, "W_qa", OP_F32, 2, (int64_t[]){QR, HID}, Wqa);
  h_io_param(&h, "eps", 1e-5);
  runs(&h, "q_latent");
  same(&h, "q_latent", "cq", OP_F32, 2, (int64_t[]){QN, QR}, cq1);
  h_io_free(&h);
  h_io_init(&h);
  h_io_input(&h, "u", OP_F32, 2, (int64_t[]){QN, HID}, u);
  h_io_input(&h, "W_qa", OP_F32, 2, (int64_t[]){QR, HID}, Wqa);
  h_io_input(&h, "gamma_q", OP_F32, 1, (int64_t[]){QR - 1}, g);
  refuses(&h, "q_latent", "gamma_q has 18 values but W_qa has 19");
  h_io_input(&h, "u", OP_F32, 2, (int64_t[]){QN, HID}, u);
  h_io_input(&h, "W_w", OP_F32, 2, (int64_t[]){5, HID}, Ww);
  h_io_param(&h, "scale", NAN);
  refuses(&h, "index_weights", "parameter scale = nan must be a number");
  h_io_input(&h, "u", OP_F32, 2, (int64_t[]){QN, HID}, u);
  h_io_input(&h, "W_w", OP_F32, 2, (int64_t[]){5, HID - 1}, Ww);
  refuses(&h, "index_weights", "W_w is (5, 36) but u is (3, 37)");
  h_io_free(&h);
  h_kept_free();
}

static void check_q_heads(void) {
  enum { H = 3, D = 16, HI = 2, DI = 12 };
  float *cq = frand(QN * QR, -1, 1), *Wqb = frand(H * D * QR, -1, 1), *Wiq = frand(HI * DI * QR, -1, 1);
  int64_t pos[QN] = {0, 7, 100003};
  float q[QN * H * D], qi[QN * HI * DI];
  struct op_rope r, ri;
  rope_make(&r, D, 8, true);
  rope_make(&ri, DI, 6, false);
  float ab[2 * QN * 8], aib[2 * QN * 8]; /* angle tables: rope_dim / 2 = 4 and 3 pairs per row */
  struct op_rope_angles a, ai;
  op_rope_angles_init(&a, ab, &r, pos, QN);
  op_rope_angles_init(&ai, aib, &ri, pos, QN);
  op_q_main(q, cq, Wqb, &a, &r, QN, QR, H, D, true, 1e-6f);
  op_q_indexer(qi, cq, Wiq, &ai, &ri, QN, QR, HI, DI);
  struct h_io h;
  h_io_init(&h);
  h_io_input(&h, "cq", OP_F32, 2, (int64_t[]){QN, QR}, cq);
  h_io_input(&h, "W_qb", OP_F32, 2, (int64_t[]){H * D, QR}, Wqb);
  h_io_input(&h, "pos", OP_I64, 1, (int64_t[]){QN}, pos);
  h_io_param(&h, "heads", H);
  h_io_param(&h, "head_dim", D);
  rope_params(&h, 8, true);
  runs(&h, "q_main");
  same(&h, "q_main", "q", OP_F32, 3, (int64_t[]){QN, H, D}, q);
  h_io_free(&h);
  h_io_init(&h);
  h_io_input(&h, "cq", OP_F32, 2, (int64_t[]){QN, QR}, cq);
  h_io_input(&h, "W_iq", OP_F32, 2, (int64_t[]){HI * DI, QR}, Wiq);
  h_io_input(&h, "pos", OP_I64, 1, (int64_t[]){QN}, pos);
  h_io_param(&h, "heads", HI);
  h_io_param(&h, "head_dim", DI);
  rope_params(&h, 6, false);
  runs(&h, "q_indexer");
  same(&h, "q_indexer", "qI", OP_F32, 3, (int64_t[]){QN, HI, DI}, qi);
  h_io_free(&h); /* the same call with an odd rope_dim is refused */
  h_io_param(&h, "rope_dim", 7);
  refuses(&h, "q_indexer", "invalid RoPE: rope_dim 7 must be even");
  h_io_input(&h, "cq", OP_F32, 2, (int64_t[]){QN, QR}, cq);
  h_io_input(&h, "W_qb", OP_F32, 2, (int64_t[]){H * D, QR}, Wqb);
  h_io_input(&h, "pos", OP_I64, 1, (int64_t[]){QN}, pos);
  h_io_param(&h, "heads", H + 1);
  h_io_param(&h, "head_dim", D);
  refuses(&h, "q_main", "W_qb is (48, 19) but heads 4 x head_dim 16 over cq (3, 19) needs (64, 19)");
  h_io_free(&h);
  h_kept_free();
}

static void check_swa_kv(void) {
  enum { N = 4, D = 16, BLK = 8 };
  float *u = frand(N * HID, -2, 2), *W = frand(D * HID, -1, 1), *g = frand(D, 0.5f, 1.5f), kS[N * D];
  int64_t pos[N] = {5, 6, 9, 130};
  const size_t b = op_fp8_bytes(D, BLK, OP_SCALE_E8M0);
  uint8_t *e = h_kept_zeros(N * b);
  struct op_rope r;
  rope_make(&r, D, 8, false);
  float ab[2 * N * 4];
  struct op_rope_angles a;
  op_rope_angles_init(&a, ab, &r, pos, N);
  op_swa_kv(kS, u, W, g, &a, &r, N, HID, D, 1e-6f);
  const struct op_kv_format sf = op_kv_fp8_format(BLK, OP_SCALE_E8M0);
  op_swa_pack(e, kS, N, D, &sf, b);
  struct h_io h;
  h_io_init(&h);
  h_io_input(&h, "u", OP_F32, 2, (int64_t[]){N, HID}, u);
  h_io_input(&h, "W_kv", OP_F32, 2, (int64_t[]){D, HID}, W);
  h_io_input(&h, "gamma", OP_F32, 1, (int64_t[]){D}, g);
  h_io_input(&h, "pos", OP_I64, 1, (int64_t[]){N}, pos);
  rope_params(&h, 8, false);
  h_io_param(&h, "pack", 1);
  h_io_param(&h, "block", BLK);
  h_io_param(&h, "scale", 1);
  runs(&h, "swa_kv");
  same(&h, "swa_kv", "kS", OP_F32, 2, (int64_t[]){N, D}, kS);
  same(&h, "swa_kv", "entries", OP_U8, 2, (int64_t[]){N, (int64_t)b}, e);
  h_io_free(&h);
  h_io_init(&h);
  h_io_input(&h, "u", OP_F32, 2, (int64_t[]){N, HID}, u);
  h_io_input(&h, "W_kv", OP_F32, 2, (int64_t[]){D, HID}, W);
  h_io_input(&h, "pos", OP_I64, 1, (int64_t[]){N - 1}, pos);
  rope_params(&h, 8, false);
  refuses(&h, "swa_kv", "pos has 3 positions but u has 4 rows");
  h_io_input(&h, "u", OP_F32, 2, (int64_t[]){N, HID}, u);
  h_io_input(&h, "W_kv", OP_F32, 2, (int64_t[]){D, HID}, W);
  h_io_input(&h, "pos", OP_I64, 1, (int64_t[]){N}, pos);
  rope_params(&h, 8, false);
  h_io_param(&h, "pack", 1);
  h_io_param(&h, "block", 5);
  refuses(&h, "swa_kv", "block 5 does not divide head_dim 16");
  h_io_free(&h);
  h_kept_free();
}

/* ---- compressor --------------------------------------------------------- */

struct comp_case {
  int ratio, n, start, d, idx_dim, main_block, idx_block, rope_dim, idx_rope;
  bool k_norm;
};

static void comp_inputs(struct h_io *h, const struct comp_case *c, float *u, float *Wkv, float *Wg, float *gc,
                        float *Wik, float *kg) {
  h_io_input(h, "u", OP_F32, 2, (int64_t[]){c->n, HID}, u);
  h_io_input(h, "W_kv", OP_F32, 2, (int64_t[]){c->d, HID}, Wkv);
  if (c->ratio > 1) h_io_input(h, "W_gate", OP_F32, 2, (int64_t[]){c->d, HID}, Wg);
  h_io_input(h, "gamma_c", OP_F32, 1, (int64_t[]){c->d}, gc);
  h_io_input(h, "W_ik", OP_F32, 2, (int64_t[]){c->idx_dim, c->d}, Wik);
  if (c->k_norm) h_io_input(h, "k_gamma", OP_F32, 1, (int64_t[]){c->idx_dim}, kg);
  h_io_param(h, "ratio", c->ratio);
  h_io_param(h, "start", c->start);
  h_io_param(h, "k_norm", c->k_norm);
  h_io_param(h, "main_block", c->main_block);
  h_io_param(h, "idx_block", c->idx_block);
  h_io_param(h, "rope_dim", c->rope_dim);
  h_io_param(h, "idx_rope_dim", c->idx_rope);
}

static void check_compress_case(const struct comp_case *c) {
  const int d = c->d, di = c->idx_dim, n_emit = c->n / c->ratio, left = c->n % c->ratio;
  float *u = frand((size_t)c->n * HID, -2, 2), *Wkv = frand((size_t)d * HID, -0.3f, 0.3f);
  float *Wg = frand((size_t)d * HID, -1, 1), *gc = frand(d, -1.5f, 1.5f), *Wik = frand((size_t)di * d, -0.3f, 0.3f);
  float *kg = frand(di, 0.5f, 1.5f);
  struct op_rope r, ri;
  rope_make(&r, d, c->rope_dim, true);
  rope_make(&ri, di, c->idx_rope, true);
  struct op_comp_layer L = {.ratio = c->ratio, .hidden = HID, .d = d, .idx_dim = di, .W_kv = Wkv,
                            .W_gate = c->ratio > 1 ? Wg : NULL, .gamma = gc, .W_ik = Wik, .k_norm = c->k_norm,
                            .k_gamma = c->k_norm ? kg : NULL, .eps = 1e-6f, .rope = &r, .rope_i = &ri,
                            .main_fmt = op_kv_fp4_format(c->main_block, OP_NIBBLE_EVEN_LOW),
                            .idx_fmt = op_kv_mxfp4_format(c->idx_block, OP_MX_CEIL, OP_NIBBLE_EVEN_LOW)};
  const size_t mb = op_fp4_bytes(d, c->main_block), ib = op_mxfp4_bytes(di, c->idx_block);
  struct op_comp_out out = {.entries = h_kept_zeros((size_t)n_emit * (mb + ib)), .entry_bytes = mb + ib, .idx_off = mb,
                            .max_entries = n_emit, .pos = h_kept_zeros((size_t)n_emit * sizeof(int64_t)),
                            .kM = h_kept_zeros((size_t)n_emit * d * sizeof(float)),
                            .kI = h_kept_zeros((size_t)n_emit * di * sizeof(float))};
  float *tbuf = h_kept_zeros(op_comp_tail_floats(c->ratio, d) * sizeof(float));
  float *scratch = h_kept_zeros(op_comp_scratch_floats(c->n, c->ratio, d, di) * sizeof(float));
  struct op_comp_tail tail;
  EXPECT(op_comp_tail_init(&tail, tbuf, c->ratio, d, c->start) == 0, "tail init");
  EXPECT(op_compress(&out, &tail, scratch, u, c->start, c->n, &L, NULL) == n_emit, "direct compress");
  int64_t tpos[8] = {0};
  for (int i = 0; i < left; i++) tpos[i] = tail.pos0 + i;
  struct h_io h;
  h_io_init(&h);
  comp_inputs(&h, c, u, Wkv, Wg, gc, Wik, kg);
  runs(&h, "compress");
  same(&h, "compress", "entries", OP_U8, 2, (int64_t[]){n_emit, (int64_t)(mb + ib)}, out.entries);
  same(&h, "compress", "pos", OP_I64, 1, (int64_t[]){n_emit}, out.pos);
  same(&h, "compress", "tail_pos", OP_I64, 1, (int64_t[]){left}, tpos);
  if (left) {
    same(&h, "compress", "tail_v", OP_F32, 2, (int64_t[]){left, d}, tail.v);
    same(&h, "compress", "tail_g", OP_F32, 2, (int64_t[]){left, d}, tail.g);
  } else {
    const struct op_tensor *tv = h_io_output(&h, "tail_v");
    EXPECT(tv && tv->ndim == 2 && tv->shape[0] == 0 && tv->shape[1] == d, "compress: empty tail_v shape");
  }
  const struct op_tensor *p = h_io_output(&h, "pos");
  EXPECT(p && n_emit > 0 && ((int64_t *)p->data)[n_emit - 1] == c->start + (int64_t)(n_emit - 1) * c->ratio,
         "compress: entry positions");
  EXPECT(!h_io_output(&h, "kM") && !h_io_output(&h, "kI"), "compress: kM / kI written without floats=1");
  h_io_free(&h);
  /* floats=1: the packers' inputs, the same bits as the direct call's; the entries unchanged. */
  h_io_init(&h);
  comp_inputs(&h, c, u, Wkv, Wg, gc, Wik, kg);
  h_io_param(&h, "floats", 1);
  runs(&h, "compress");
  same(&h, "compress", "kM", OP_F32, 2, (int64_t[]){n_emit, d}, out.kM);
  same(&h, "compress", "kI", OP_F32, 2, (int64_t[]){n_emit, di}, out.kI);
  same(&h, "compress", "entries", OP_U8, 2, (int64_t[]){n_emit, (int64_t)(mb + ib)}, out.entries);
  h_io_free(&h);
  /* Refusals. */
  h_io_init(&h);
  comp_inputs(&h, c, u, Wkv, Wg, gc, Wik, kg);
  h_io_input(&h, "W_gate", OP_F32, 2, (int64_t[]){d, HID}, Wg);
  h_io_param(&h, "ratio", 1);
  refuses(&h, "compress", "W_gate given at ratio 1; a ratio-1 layer has no gate weights");
  comp_inputs(&h, c, u, Wkv, Wg, gc, Wik, kg);
  h_io_param(&h, "start", c->start + 1);
  if (c->ratio > 1) refuses(&h, "compress", "is not a multiple of ratio");
  h_io_init(&h);
  comp_inputs(&h, c, u, Wkv, Wg, gc, Wik, kg);
  h_io_input(&h, "k_gamma", OP_F32, 1, (int64_t[]){di}, kg);
  h_io_param(&h, "k_norm", 0);
  refuses(&h, "compress", "k_gamma given but k_norm is off");
  comp_inputs(&h, c, u, Wkv, Wg, gc, Wik, kg);
  h_io_param(&h, "main_block", 6);
  refuses(&h, "compress", "main_block 6 must be even and divide d = 32");
  comp_inputs(&h, c, u, Wkv, Wg, gc, Wik, kg);
  in_named(&h, "W_ik")->shape[1] = d + 1;
  refuses(&h, "compress", "W_ik is (16, 33) but W_kv is (32, 37): W_ik needs 32 columns");
  h_io_free(&h);
  h_kept_free();
}

static void check_compress(void) {
  struct comp_case c2 = {2, 7, 4, 32, 16, 16, 8, 8, 4, true}, c1 = {1, 3, 5, 32, 16, 8, 16, 16, 6, false};
  check_compress_case(&c2);
  check_compress_case(&c1);
  struct h_io h; /* ratio 2 without W_gate: a missing tensor */
  float *u = frand(2 * HID, -1, 1);
  h_io_init(&h);
  h_io_input(&h, "u", OP_F32, 2, (int64_t[]){2, HID}, u);
  h_io_input(&h, "W_kv", OP_F32, 2, (int64_t[]){32, HID}, frand(32 * HID, -1, 1));
  h_io_input(&h, "W_ik", OP_F32, 2, (int64_t[]){16, 32}, frand(16 * 32, -1, 1));
  refuses(&h, "compress", "missing input tensor 'W_gate'");
  h_io_free(&h);
  h_kept_free();
}

/* ---- indexer ------------------------------------------------------------ */

enum { IS = 5, IH = 3, IW = 16, IBLK = 8, IE = 23, IK = 4, PB = 3, PT = 2 };

struct idx_data {
  float *q, *w;
  int64_t pos[IS];
  uint8_t *keys;   /* (IE, ib): MXFP4 rows */
  uint8_t *padded; /* (IE, ib + 7): the same keys at byte 5 */
  size_t ib;
};

static void idx_data(struct idx_data *D) {
  static const int64_t pos[IS] = {0, 5, 17, 44, 46};
  memcpy(D->pos, pos, sizeof pos);
  D->q = frand(IS * IH * IW, -1, 1);
  D->w = frand(IS * IH, 0.2f, 1);
  D->ib = op_mxfp4_bytes(IW, IBLK);
  D->keys = h_kept_zeros(IE * D->ib);
  D->padded = h_kept_zeros(IE * (D->ib + 7));
  float *k = frand(IE * IW, -3, 3);
  for (int e = 0; e < IE; e++) {
    op_mxfp4_pack(D->keys + e * D->ib, k + e * IW, IW, IBLK, OP_MX_CEIL, OP_NIBBLE_EVEN_LOW);
    memcpy(D->padded + e * (D->ib + 7) + 5, D->keys + e * D->ib, D->ib);
  }
}

static void idx_inputs(struct h_io *h, const struct idx_data *D, bool padded) {
  h_io_input(h, "q", OP_F32, 3, (int64_t[]){IS, IH, IW}, D->q);
  h_io_input(h, "w", OP_F32, 2, (int64_t[]){IS, IH}, D->w);
  h_io_input(h, "pos", OP_I64, 1, (int64_t[]){IS}, (void *)D->pos);
  h_io_input(h, "keys", OP_U8, 2, (int64_t[]){IE, (int64_t)(D->ib + (padded ? 7 : 0))},
             padded ? D->padded : D->keys);
  h_io_param(h, "idx_off", padded ? 5 : 0);
  h_io_param(h, "k", IK);
  h_io_param(h, "idx_block", IBLK);
  h_io_param(h, "pool_block", PB);
}

static void check_indexer(void) {
  struct idx_data D;
  idx_data(&D);
  const uint8_t *page = D.keys;
  struct op_kv_view kv = {.pages = &page, .page_entries = IE, .entry_bytes = D.ib, .n_entries = IE, .ratio = 2,
                          .idx_w = IW, .idx_fmt = op_kv_mxfp4_format(IBLK, OP_MX_CEIL, OP_NIBBLE_EVEN_LOW)};
  int32_t topk[IS * IK], pool[IS * PT], retopk[IS * IK];
  void *work = h_kept_zeros(op_indexer_topk_work_bytes(&kv, D.pos, IS, PB));
  op_indexer_topk(topk, pool, work, D.q, D.w, D.pos, &kv, IS, IH, IK, PB, PT, true); /* the descriptor's default pin */
  void *rwork = h_kept_zeros(op_indexer_reindex_work_bytes(&kv, PB, PT));
  op_indexer_reindex(retopk, rwork, pool, D.q, D.w, D.pos, &kv, IS, IH, IK, PB, PT);
  for (int padded = 0; padded < 2; padded++) { /* idx_off 0, then keys at byte 5 of wider rows */
    struct h_io h;
    h_io_init(&h);
    idx_inputs(&h, &D, padded);
    h_io_param(&h, "build_pool", 1);
    h_io_param(&h, "pool_top", PT);
    runs(&h, "indexer_topk");
    same(&h, "indexer_topk", "topk", OP_I32, 2, (int64_t[]){IS, IK}, topk);
    same(&h, "indexer_topk", "pool", OP_I32, 2, (int64_t[]){IS, PT}, pool);
    h_io_free(&h);
    h_io_init(&h);
    idx_inputs(&h, &D, padded);
    h_io_input(&h, "pool", OP_I32, 2, (int64_t[]){IS, PT}, pool);
    runs(&h, "reindex");
    same(&h, "reindex", "topk", OP_I32, 2, (int64_t[]){IS, IK}, retopk);
    h_io_free(&h);
  }
  /* Without build_pool there is no pool output. */
  struct h_io h;
  h_io_init(&h);
  idx_inputs(&h, &D, false);
  runs(&h, "indexer_topk");
  same(&h, "indexer_topk", "topk", OP_I32, 2, (int64_t[]){IS, IK}, topk);
  EXPECT(!h_io_output(&h, "pool"), "indexer_topk made a pool without build_pool");
  h_io_free(&h);
  /* Refusals. */
  h_io_init(&h);
  idx_inputs(&h, &D, false);
  in_named(&h, "w")->shape[1] = IH + 1;
  refuses(&h, "indexer_topk", "w is (5, 4) but q is (5, 3, 16): w needs (5, 3)");
  idx_inputs(&h, &D, false);
  h_io_param(&h, "idx_off", 1);
  refuses(&h, "indexer_topk", "keys rows have 10 bytes but an MXFP4 key of 16 values (block 8) at idx_off 1 needs 11");
  int64_t neg[IS] = {0, 5, -1, 44, 46};
  idx_inputs(&h, &D, false);
  in_named(&h, "pos")->data = neg;
  refuses(&h, "indexer_topk", "pos[2] = -1 is outside [0, 2^53]");
  int32_t dup[IS * PT];
  memcpy(dup, pool, sizeof dup);
  dup[2 * PT + 1] = dup[2 * PT] = 1;
  idx_inputs(&h, &D, false);
  h_io_input(&h, "pool", OP_I32, 2, (int64_t[]){IS, PT}, dup);
  refuses(&h, "reindex", "block 1 appears twice in the pool of query 2");
  idx_inputs(&h, &D, false);
  h_io_input(&h, "pool", OP_I32, 2, (int64_t[]){IS - 1, PT}, pool);
  refuses(&h, "reindex", "pool is (4, 2) for 5 queries");
  idx_inputs(&h, &D, false);
  refuses(&h, "reindex", "missing input tensor 'pool'");
  h_io_free(&h);
  h_kept_free();
}

/* ---- attention and output projection ------------------------------------ */

enum { AS = 4, AH = 3, AD = 32, AK = 5, AN = 9, ASL = 6, MBLK = 16, SBLK = 8 };

struct attn_data {
  float *q, *sink;
  int64_t pos[AS], spos[ASL];
  int32_t topk[AS * AK];
  uint8_t *entries, *ring; /* (AN, eb) with the Main KV at 0; (ASL, sb) */
  size_t eb, sb;
};

static void attn_data(struct attn_data *D) {
  static const int64_t pos[AS] = {3, 10, 11, 40}, spos[ASL] = {8, 9, 10, -1, 6, 11};
  /* -1 = none; every other index names one of the AN entries (the op refuses others: check_sparse_attn) */
  static const int32_t topk[AS * AK] = {0, 1, -1, -1, -1, 2, 7, 8, -1, -1, 4, 3, 0, -1, -1, 8, 6, 5, 1, 2};
  memcpy(D->pos, pos, sizeof pos), memcpy(D->spos, spos, sizeof spos), memcpy(D->topk, topk, sizeof topk);
  D->q = frand(AS * AH * AD, -0.5f, 0.5f);
  D->sink = frand(AH, -1, 1);
  D->eb = op_fp4_bytes(AD, MBLK) + 10, D->sb = op_fp8_bytes(AD, SBLK, OP_SCALE_E8M0);
  D->entries = h_kept_zeros(AN * D->eb), D->ring = h_kept_zeros(ASL * D->sb);
  float *g = frand(AN * AD, -2, 2), *s = frand(ASL * AD, -2, 2);
  for (int e = 0; e < AN; e++) op_fp4_pack(D->entries + e * D->eb, g + e * AD, AD, MBLK, OP_NIBBLE_EVEN_LOW);
  for (int e = 0; e < ASL; e++) op_fp8_pack(D->ring + e * D->sb, s + e * AD, AD, SBLK, OP_SCALE_E8M0);
}

static void attn_inputs(struct h_io *h, struct attn_data *D, bool global, bool ring, bool sink) {
  h_io_input(h, "q", OP_F32, 3, (int64_t[]){AS, AH, AD}, D->q);
  h_io_input(h, "pos", OP_I64, 1, (int64_t[]){AS}, D->pos);
  if (global) h_io_input(h, "topk", OP_I32, 2, (int64_t[]){AS, AK}, D->topk);
  if (global) h_io_input(h, "entries", OP_U8, 2, (int64_t[]){AN, (int64_t)D->eb}, D->entries);
  if (ring) h_io_input(h, "swa", OP_U8, 2, (int64_t[]){ASL, (int64_t)D->sb}, D->ring);
  if (ring) h_io_input(h, "swa_pos", OP_I64, 1, (int64_t[]){ASL}, D->spos);
  if (sink) h_io_input(h, "sink", OP_F32, 1, (int64_t[]){AH}, D->sink);
  h_io_param(h, "window", 4);
  h_io_param(h, "swa_block", SBLK);
  h_io_param(h, "swa_scale", 1);
  rope_params(h, 8, false);
}

static void check_sparse_attn(void) {
  struct attn_data D;
  attn_data(&D);
  const uint8_t *page = D.entries;
  struct op_kv_view kv = {.pages = &page, .page_entries = AN, .entry_bytes = D.eb, .n_entries = AN, .ratio = 1,
                          .main_w = AD, .main_fmt = op_kv_fp4_format(MBLK, OP_NIBBLE_EVEN_LOW)};
  struct op_swa_view swa = {.slots = D.ring, .pos = D.spos, .n_slots = ASL, .entry_bytes = D.sb, .w = AD,
                            .fmt = op_kv_fp8_format(SBLK, OP_SCALE_E8M0)};
  struct op_rope r;
  rope_make(&r, AD, 8, false);
  for (int mode = 0; mode < 2; mode++) { /* 0: global + ring + sink; 1: SWA only, no sink */
    struct op_attn_params pr = {.heads = AH, .head_dim = AD, .topk = mode ? 0 : AK, .window = 4,
                                .tau = op_attn_tau_default(AD), .sink = mode ? NULL : D.sink, .rope = &r};
    float o[AS * AH * AD];
    int32_t used[AS];
    op_sparse_attn(o, used, D.q, D.pos, mode ? NULL : D.topk, mode ? NULL : &kv, &swa, AS, &pr);
    struct h_io h;
    h_io_init(&h);
    attn_inputs(&h, &D, !mode, true, !mode);
    runs(&h, "sparse_attn");
    same(&h, "sparse_attn", "o", OP_F32, 3, (int64_t[]){AS, AH, AD}, o);
    same(&h, "sparse_attn", "n_used", OP_I32, 1, (int64_t[]){AS}, used);
    h_io_free(&h);
  }
  struct h_io h;
  h_io_init(&h);
  /* an index past the entries given, or below -1, is refused, not skipped (issue 18 row 15) */
  D.topk[13] = AN;
  attn_inputs(&h, &D, true, true, false);
  refuses(&h, "sparse_attn", "topk[2][3] = 9 is neither -1 (none) nor an entry index in [0, 9)");
  D.topk[13] = -5;
  attn_inputs(&h, &D, true, true, false);
  refuses(&h, "sparse_attn", "topk[2][3] = -5 is neither -1");
  D.topk[13] = -1;
  attn_inputs(&h, &D, true, true, false);
  in_named(&h, "swa_pos")->shape[0] = ASL - 1;
  refuses(&h, "sparse_attn", "swa_pos has 5 positions but swa has 6 slots");
  attn_inputs(&h, &D, false, false, false);
  h_io_input(&h, "swa", OP_U8, 2, (int64_t[]){ASL, (int64_t)D.sb}, D.ring);
  refuses(&h, "sparse_attn", "give both swa and swa_pos, or neither (got only swa)");
  attn_inputs(&h, &D, false, true, false);
  h_io_input(&h, "entries", OP_U8, 2, (int64_t[]){AN, (int64_t)D.eb}, D.entries);
  refuses(&h, "sparse_attn", "entries given without topk");
  attn_inputs(&h, &D, false, true, false);
  h_io_input(&h, "topk", OP_I32, 2, (int64_t[]){AS, AK}, D.topk);
  refuses(&h, "sparse_attn", "missing input tensor 'entries'");
  attn_inputs(&h, &D, true, true, true);
  in_named(&h, "sink")->shape[0] = AH + 1;
  refuses(&h, "sparse_attn", "sink has 4 values but q has 3 heads");
  attn_inputs(&h, &D, true, true, false);
  h_io_param(&h, "swa_scale", 0);
  refuses(&h, "sparse_attn", "swa rows have 36 bytes but an FP8 entry of head_dim 32 with swa_block 8");
  attn_inputs(&h, &D, true, true, false);
  h_io_param(&h, "main_off", 20);
  refuses(&h, "sparse_attn", "entries rows have 28 bytes but a Main-KV entry of 32 values (block 16) at main_off 20 "
          "needs 38");
  int64_t neg[AS] = {3, 10, -2, 40};
  attn_inputs(&h, &D, true, true, true);
  in_named(&h, "pos")->data = neg;
  refuses(&h, "sparse_attn", "pos[2] = -2 is outside [0, 2^53]");
  attn_inputs(&h, &D, true, false, false);
  in_named(&h, "pos")->dtype = OP_I32;
  refuses(&h, "sparse_attn", "input 'pos' must be I64 with 1 dims");
  h_io_free(&h);
  h_kept_free();
}

static void check_oproj(void) {
  enum { S = 3, H = 4, D = 6, G = 2, R = 5, HIDDEN = 7, GW = H / G * D };
  float *o = frand(S * H * D, -1, 1), *wa = frand(G * R * GW, -1, 1), *wb = frand(HIDDEN * G * R, -1, 1);
  float a[S * HIDDEN], z[S * G * R];
  op_grouped_oproj(a, z, o, wa, wb, S, H, D, G, R, HIDDEN);
  struct h_io h;
  h_io_init(&h);
  h_io_input(&h, "o", OP_F32, 3, (int64_t[]){S, H, D}, o);
  h_io_input(&h, "W_oa", OP_F32, 3, (int64_t[]){G, R, GW}, wa);
  h_io_input(&h, "W_ob", OP_F32, 2, (int64_t[]){HIDDEN, G * R}, wb);
  runs(&h, "oproj");
  same(&h, "oproj", "a", OP_F32, 2, (int64_t[]){S, HIDDEN}, a);
  same(&h, "oproj", "z", OP_F32, 2, (int64_t[]){S, G * R}, z);
  h_io_free(&h);
  in_named(&h, "W_oa")->shape[0] = 3; /* 3 groups do not divide 4 heads, though 4/3*6 = 6 would */
  in_named(&h, "W_oa")->shape[2] = 6;
  refuses(&h, "oproj", "W_oa is (3, 5, 6) but o is (3, 4, 6)");
  h_io_input(&h, "o", OP_F32, 3, (int64_t[]){S, H, D}, o);
  h_io_input(&h, "W_oa", OP_F32, 3, (int64_t[]){G, R, GW}, wa);
  h_io_input(&h, "W_ob", OP_F32, 2, (int64_t[]){HIDDEN, G * R + 1}, wb);
  refuses(&h, "oproj", "W_ob is (7, 11) but W_oa is (2, 5, 12): W_ob needs 10 columns");
  h_io_free(&h);
  h_kept_free();
}

int main(void) {
  op_blas_init();
  check_formats();
  check_q_latent_weights();
  check_q_heads();
  check_swa_kv();
  check_compress();
  check_indexer();
  check_sparse_attn();
  check_oproj();
  return h_report("attention-family descriptors");
}
