/* test_backend_ops.c: every registered op on every backend present, against
 * the CPU reference (ggml's test-backend-ops, for cedar's backend table
 * ops/backend.h).
 *
 * What it is: one case per op of CEDAR_OPS (the test fails when an op has
 * none), each building seeded random, never-zero inputs at odd sizes. For
 * every backend (cpu, cuda) the case runs when the backend is available and
 * implements the op: the run must succeed; every output must be declared,
 * have its declared dtype and number of dims, stay inside its buffer (guard
 * bytes on both sides) and be finite (every case's inputs are finite and in
 * range, where every op promises finite results); two runs must give the
 * same bits; and the result must equal the CPU's: bitwise for a backend that
 * promises the CPU's bits (cpu_bits), else under the tolerance of
 * close_to_cpu below. A missing input must be refused with a negative status
 * and a message naming it, without a crash. The CPU run itself is checked
 * against float64 references computed here where they are simple (embed,
 * rmsnorm, linear, rope, and the fp4 / mxfp4 / fp8 round trips).
 * A backend not available is reported as skipped with its reason; an op
 * whose slot is NULL as "not implemented on <backend>" (listed, not failed).
 * The summary table prints op x backend: ok, FAIL, n/a or skipped.
 *
 * What it is not: the op-level numerical tests (tests/test_ops_<family>.c)
 * or the descriptor refusal tests (tests/test_op_desc_*.c).
 * Run: ctest --test-dir build -R backend_ops --output-on-failure
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "kernels/backend.h"
#include "ops/backend.h"
#include "ops/basic.h"
#include "ops/engram.h"
#include "ops/formats.h"
#include "ops/mhc.h"
#include "ops/qlinear.h"
#include "ops/registry.h"
#include "ops/rope.h"
#include "tests/harness.h"

static const struct op_backend *const backends[] = {&op_backend_cpu, &kern_backend_cuda};
enum { N_BACKENDS = sizeof backends / sizeof *backends, GUARD = 64 };

static uint64_t seed = 0xBAC0E0D5;

/* ---- input helpers -------------------------------------------------------- */

/* Every input buffer of one check is kept (tests/harness.h: h_keep) and
 * freed together by h_kept_free(). */
static float *frand(size_t n, float lo, float hi) { return h_kept_floats(n, &seed, lo, hi); }

static int64_t below(int64_t k) { return (int64_t)(h_uniform(&seed) * (double)k); }

static int32_t *irand32(size_t n, int32_t k) {
  int32_t *v = h_keep(malloc((n ? n : 1) * sizeof *v));
  for (size_t i = 0; i < n; i++) v[i] = (int32_t)below(k);
  return v;
}

static int64_t *irand64(size_t n, int64_t k) {
  int64_t *v = h_keep(malloc((n ? n : 1) * sizeof *v));
  for (size_t i = 0; i < n; i++) v[i] = below(k);
  return v;
}


/* IN(h, "x", OP_F32, data, dims...): an input of the dims given. */
#define DIMS_(...) ((int64_t[]){__VA_ARGS__})
#define IN(h, name, dt, data, ...) \
  h_io_input(h, name, dt, (int)(sizeof DIMS_(__VA_ARGS__) / sizeof(int64_t)), DIMS_(__VA_ARGS__), data)

/* The value of parameter `name` of a call, or def. */
static double pget(const struct h_io *h, const char *name, double def) {
  for (int i = 0; i < h->n_param; i++)
    if (!strcmp(h->p_name[i], name)) return h->p_val[i];
  return def;
}

static const struct op_tensor *input_of(const struct h_io *h, const char *name) {
  for (int i = 0; i < h->n_in; i++)
    if (!strcmp(h->in_name[i], name)) return &h->in[i];
  return NULL;
}

/* A fresh call with src's inputs (but `skip`) and parameters, guarded outputs. */
static void clone_call(struct h_io *dst, const struct h_io *src, const char *skip) {
  h_io_init(dst);
  dst->guard = GUARD;
  for (int i = 0; i < src->n_in; i++)
    if (!skip || strcmp(src->in_name[i], skip))
      h_io_input(dst, src->in_name[i], src->in[i].dtype, src->in[i].ndim, src->in[i].shape, src->in[i].data);
  for (int i = 0; i < src->n_param; i++) h_io_param(dst, src->p_name[i], src->p_val[i]);
}

/* ---- cases: inputs of every op -------------------------------------------- */

enum { HID = 37 };

static void build_embed(struct h_io *h) {
  IN(h, "table", OP_F32, frand(11 * 13, -1, 1), 11, 13);
  IN(h, "tokens", OP_I32, irand32(7, 11), 7);
}

static void build_rmsnorm(struct h_io *h) {
  IN(h, "x", OP_F32, frand(7 * HID, -2, 2), 7, HID);
  IN(h, "gamma", OP_F32, frand(HID, 0.5f, 1.5f), HID);
  h_io_param(h, "eps", 1e-5);
}

static void build_linear(struct h_io *h) {
  IN(h, "x", OP_F32, frand(5 * HID, -2, 2), 5, HID);
  IN(h, "w", OP_F32, frand(11 * HID, -1, 1), 11, HID);
}

/* An FP8 weight (11, HID): E4M3 codes without the NaN ones, UE8M0 tile
 * scales around 2^-7 (weights ~ 1); its float64 check goes through
 * op_qweight_dequant, which test_ops_qlinear ties to the codecs. */
static void build_qlinear(struct h_io *h) {
  enum { O = 11, TC = (HID + 31) / 32 };
  uint8_t *w = h_kept_zeros((size_t)O * HID), *s = h_kept_zeros(TC);
  for (size_t i = 0; i < (size_t)O * HID; i++) w[i] = (uint8_t)(below(256) & 0xF7); /* never 0x7F / 0xFF */
  for (int i = 0; i < TC; i++) s[i] = (uint8_t)(118 + below(8));
  IN(h, "x", OP_F32, frand(5 * HID, -2, 2), 5, HID);
  IN(h, "w", OP_U8, w, O, HID);
  IN(h, "scale", OP_U8, s, 1, TC);
  h_io_param(h, "format", OP_W_FP8);
}

static int64_t *positions(int n, int64_t max) {
  int64_t *p = irand64((size_t)n, max);
  p[0] = 0; /* position 0 (the identity) among them */
  return p;
}

/* The rope defaults are the CSA2 ones (theta 160000 with YaRN): at rope_dim
 * 16 the YaRN ramp runs over pairs 3..7, so all three regimes are rotated. */
static void build_rope(struct h_io *h) {
  IN(h, "x", OP_F32, frand(5 * 3 * 40, -1, 1), 5, 3, 40);
  IN(h, "pos", OP_I64, positions(5, 200000), 5);
  h_io_param(h, "rope_dim", 16);
}

/* The x rows an unpack case's entries were packed from (its float64 check). */
static const float *packed_from;

static void build_fp4_pack(struct h_io *h) {
  IN(h, "x", OP_F32, frand(5 * 48, -9, 9), 5, 48);
  h_io_param(h, "block", 16);
}

static void build_fp4_unpack(struct h_io *h) {
  enum { N = 5, W = 30, B = 6 };
  const size_t b = op_fp4_bytes(W, B);
  float *x = frand(N * W, -9, 9);
  uint8_t *e = h_kept_zeros(N * b);
  for (int i = 0; i < N; i++) op_fp4_pack(e + i * b, x + i * W, W, B, OP_NIBBLE_EVEN_HIGH);
  packed_from = x;
  IN(h, "entries", OP_U8, e, N, (int64_t)b);
  h_io_param(h, "block", B), h_io_param(h, "nibble", 1);
}

static void build_mxfp4_pack(struct h_io *h) {
  IN(h, "x", OP_F32, frand(5 * 40, -9, 9), 5, 40);
  h_io_param(h, "block", 8), h_io_param(h, "nibble", 1);
}

static void build_mxfp4_unpack(struct h_io *h) {
  enum { N = 3, W = 64, B = 32 };
  const size_t b = op_mxfp4_bytes(W, B);
  float *x = frand(N * W, -9, 9);
  uint8_t *e = h_kept_zeros(N * b);
  for (int i = 0; i < N; i++) op_mxfp4_pack(e + i * b, x + i * W, W, B, OP_MX_CEIL, OP_NIBBLE_EVEN_LOW);
  packed_from = x;
  IN(h, "entries", OP_U8, e, N, (int64_t)b);
}

static void build_fp8_pack(struct h_io *h) {
  IN(h, "x", OP_F32, frand(5 * 21, -9, 9), 5, 21);
  h_io_param(h, "block", 7);
}

static void build_fp8_unpack(struct h_io *h) {
  enum { N = 5, W = 24, B = 8 };
  const size_t b = op_fp8_bytes(W, B, OP_SCALE_E8M0);
  float *x = frand(N * W, -9, 9);
  uint8_t *e = h_kept_zeros(N * b);
  for (int i = 0; i < N; i++) op_fp8_pack(e + i * b, x + i * W, W, B, OP_SCALE_E8M0);
  packed_from = x;
  IN(h, "entries", OP_U8, e, N, (int64_t)b);
  h_io_param(h, "block", B), h_io_param(h, "scale", 1);
}

enum { QN = 3, QR = 19 };

static void build_q_latent(struct h_io *h) {
  IN(h, "u", OP_F32, frand(QN * HID, -2, 2), QN, HID);
  IN(h, "W_qa", OP_F32, frand(QR * HID, -1, 1), QR, HID);
  IN(h, "gamma_q", OP_F32, frand(QR, 0.5f, 1.5f), QR);
}

static void build_q_main(struct h_io *h) {
  IN(h, "cq", OP_F32, frand(QN * QR, -1, 1), QN, QR);
  IN(h, "W_qb", OP_F32, frand(3 * 16 * QR, -1, 1), 3 * 16, QR);
  IN(h, "pos", OP_I64, positions(QN, 100000), QN);
  h_io_param(h, "heads", 3), h_io_param(h, "head_dim", 16), h_io_param(h, "rope_dim", 8);
}

static void build_q_indexer(struct h_io *h) {
  IN(h, "cq", OP_F32, frand(QN * QR, -1, 1), QN, QR);
  IN(h, "W_iq", OP_F32, frand(2 * 12 * QR, -1, 1), 2 * 12, QR);
  IN(h, "pos", OP_I64, positions(QN, 100000), QN);
  h_io_param(h, "heads", 2), h_io_param(h, "head_dim", 12), h_io_param(h, "rope_dim", 6);
  h_io_param(h, "theta", OP_ROPE_THETA_SWA), h_io_param(h, "yarn", 0), h_io_param(h, "last", 0);
}

static void build_index_weights(struct h_io *h) {
  IN(h, "u", OP_F32, frand(QN * HID, -2, 2), QN, HID);
  IN(h, "W_w", OP_F32, frand(5 * HID, -1, 1), 5, HID);
}

static void build_swa_kv(struct h_io *h) {
  IN(h, "u", OP_F32, frand(4 * HID, -2, 2), 4, HID);
  IN(h, "W_kv", OP_F32, frand(16 * HID, -1, 1), 16, HID);
  IN(h, "gamma", OP_F32, frand(16, 0.5f, 1.5f), 16);
  IN(h, "pos", OP_I64, positions(4, 5000), 4);
  h_io_param(h, "rope_dim", 8), h_io_param(h, "theta", OP_ROPE_THETA_SWA), h_io_param(h, "yarn", 0);
  h_io_param(h, "pack", 1), h_io_param(h, "block", 8), h_io_param(h, "scale", 1);
}

/* Ratio 2 from start 4, seven rows: three entries and a tail of one. (The
 * names D and DI are the compressor's; packed_compress reads them back from
 * the shapes.) */
static void build_compress(struct h_io *h) {
  enum { N = 7, D = 32, DI = 16 };
  IN(h, "u", OP_F32, frand(N * HID, -2, 2), N, HID);
  IN(h, "W_kv", OP_F32, frand(D * HID, -0.3f, 0.3f), D, HID);
  IN(h, "W_gate", OP_F32, frand(D * HID, -0.1f, 0.1f), D, HID); /* gates of ~0.4: the k of its case */
  IN(h, "gamma_c", OP_F32, frand(D, -1.5f, 1.5f), D);
  IN(h, "W_ik", OP_F32, frand(DI * D, -0.3f, 0.3f), DI, D);
  IN(h, "k_gamma", OP_F32, frand(DI, 0.5f, 1.5f), DI);
  h_io_param(h, "ratio", 2), h_io_param(h, "start", 4), h_io_param(h, "k_norm", 1);
  h_io_param(h, "main_block", 16), h_io_param(h, "idx_block", 8);
  h_io_param(h, "rope_dim", 8), h_io_param(h, "idx_rope_dim", 4);
  h_io_param(h, "floats", 1); /* kM and kI, the packers' inputs: the entries' check below */
}

enum { IS = 5, IH = 3, IW = 16, IBLK = 8, IE = 23 };

/* 23 MXFP4 keys and five queries; Top-4 over blocks of 3, two blocks kept. */
static void indexer_inputs(struct h_io *h) {
  static const int64_t pos[IS] = {0, 5, 17, 44, 46};
  const size_t ib = op_mxfp4_bytes(IW, IBLK);
  uint8_t *keys = h_kept_zeros(IE * ib);
  float *k = frand(IE * IW, -3, 3);
  for (int e = 0; e < IE; e++) op_mxfp4_pack(keys + e * ib, k + e * IW, IW, IBLK, OP_MX_CEIL, OP_NIBBLE_EVEN_LOW);
  IN(h, "q", OP_F32, frand(IS * IH * IW, -1, 1), IS, IH, IW);
  IN(h, "w", OP_F32, frand(IS * IH, 0.2f, 1), IS, IH);
  IN(h, "pos", OP_I64, (void *)pos, IS);
  IN(h, "keys", OP_U8, keys, IE, (int64_t)ib);
  h_io_param(h, "k", 4), h_io_param(h, "idx_block", IBLK), h_io_param(h, "pool_block", 3);
  h_io_param(h, "pool_top", 2);
}

static void build_indexer_topk(struct h_io *h) {
  indexer_inputs(h);
  h_io_param(h, "build_pool", 1);
}

/* The pool comes from indexer_topk on the CPU, as the model's L20 makes it. */
static void build_reindex(struct h_io *h) {
  indexer_inputs(h);
  struct h_io t;
  clone_call(&t, h, NULL);
  h_io_param(&t, "build_pool", 1);
  int rc = op_backend_run(&op_backend_cpu, OP_ID_indexer_topk, &t.io);
  const struct op_tensor *pool = op_io_mem_output(&t, "pool");
  EXPECT(rc == 0 && pool, "reindex inputs: indexer_topk failed: %s", t.error);
  int32_t *p = h_kept_zeros(IS * 2 * sizeof *p);
  if (pool) memcpy(p, pool->data, IS * 2 * sizeof *p);
  h_io_free(&t);
  IN(h, "pool", OP_I32, p, IS, 2);
}

enum { AS = 4, AH = 3, AD = 32, AK = 5, AN = 9, ASL = 6 };

/* Four queries over nine FP4 entries (topk with holes, -1; the op refuses
 * ids past the entries) and a six-slot FP8 ring with an empty slot, plus sinks. */
static void build_sparse_attn(struct h_io *h) {
  static const int64_t pos[AS] = {3, 10, 11, 40}, spos[ASL] = {8, 9, 10, -1, 6, 11};
  static const int32_t topk[AS * AK] = {0, 1, -1, -1, -1, 2, 7, 8, -1, -1, 4, 3, 0, -1, -1, 8, 6, 5, 1, 2};
  const size_t eb = op_fp4_bytes(AD, 16) + 10, sb = op_fp8_bytes(AD, 8, OP_SCALE_E8M0);
  uint8_t *entries = h_kept_zeros(AN * eb), *ring = h_kept_zeros(ASL * sb);
  float *g = frand(AN * AD, -2, 2), *s = frand(ASL * AD, -2, 2);
  for (int e = 0; e < AN; e++) op_fp4_pack(entries + e * eb, g + e * AD, AD, 16, OP_NIBBLE_EVEN_LOW);
  for (int e = 0; e < ASL; e++) op_fp8_pack(ring + e * sb, s + e * AD, AD, 8, OP_SCALE_E8M0);
  IN(h, "q", OP_F32, frand(AS * AH * AD, -0.5f, 0.5f), AS, AH, AD);
  IN(h, "pos", OP_I64, (void *)pos, AS);
  IN(h, "topk", OP_I32, (void *)topk, AS, AK);
  IN(h, "entries", OP_U8, entries, AN, (int64_t)eb);
  IN(h, "swa", OP_U8, ring, ASL, (int64_t)sb);
  IN(h, "swa_pos", OP_I64, (void *)spos, ASL);
  IN(h, "sink", OP_F32, frand(AH, -1, 1), AH);
  h_io_param(h, "window", 4), h_io_param(h, "swa_block", 8), h_io_param(h, "swa_scale", 1);
  h_io_param(h, "rope_dim", 8), h_io_param(h, "theta", OP_ROPE_THETA_SWA), h_io_param(h, "yarn", 0);
}

static void build_oproj(struct h_io *h) {
  enum { S = 3, H = 4, D = 6, G = 2, R = 5, HIDDEN = 7, GW = H / G * D };
  IN(h, "o", OP_F32, frand(S * H * D, -1, 1), S, H, D);
  IN(h, "W_oa", OP_F32, frand(G * R * GW, -1, 1), G, R, GW);
  IN(h, "W_ob", OP_F32, frand(HIDDEN * G * R, -1, 1), HIDDEN, G * R);
}

/* Eleven tokens (every third an image token), nine experts of width 7 and a
 * shared expert of width 5, every optional input present. */
static void build_moe(struct h_io *h) {
  enum { N = 11, D = 13, R = 9, I = 7, S = 5 };
  uint8_t *mod = h_kept_zeros(N);
  for (int t = 0; t < N; t++) mod[t] = (uint8_t)(t % 3 == 1);
  IN(h, "x", OP_F32, frand(N * D, -1, 1), N, D);
  IN(h, "router", OP_F32, frand(R * D, -0.5f, 0.5f), R, D);
  IN(h, "bias", OP_F32, frand(2 * R, -0.3f, 0.3f), 2, R);
  IN(h, "modality", OP_U8, mod, N);
  IN(h, "w_gate", OP_F32, frand(R * I * D, -0.5f, 0.5f), R, I, D);
  IN(h, "w_up", OP_F32, frand(R * I * D, -0.5f, 0.5f), R, I, D);
  IN(h, "w_down", OP_F32, frand(R * D * I, -0.5f, 0.5f), R, D, I);
  IN(h, "shared_gate", OP_F32, frand(S * D, -0.5f, 0.5f), S, D);
  IN(h, "shared_up", OP_F32, frand(S * D, -0.5f, 0.5f), S, D);
  IN(h, "shared_down", OP_F32, frand(D * S, -0.5f, 0.5f), D, S);
}

enum { MN = 5, MHC = 3, MD = 37 };

static void mhc_state(struct h_io *h) { IN(h, "X", OP_F32, frand(MN * MHC * MD, -2, 2), MN, MHC, MD); }

static void build_mhc_coeffs(struct h_io *h) {
  const int M = op_mhc_rows(MHC);
  mhc_state(h);
  IN(h, "W_fn", OP_F32, frand((size_t)M * MHC * MD, -0.2f, 0.2f), M, MHC * MD);
  IN(h, "scale", OP_F32, frand(3, 0.5f, 2), 3);
  IN(h, "base", OP_F32, frand((size_t)M, -1, 1), M);
}

static void build_mhc_mix(struct h_io *h) {
  mhc_state(h);
  IN(h, "pre", OP_F32, frand(MN * MHC, 0.1f, 1), MN, MHC);
}

static void build_mhc_update(struct h_io *h) {
  mhc_state(h);
  IN(h, "C", OP_F32, frand(MN * MHC * MHC, 0, 1), MN, MHC, MHC);
  IN(h, "post", OP_F32, frand(MN * MHC, 0, 2), MN, MHC);
  IN(h, "F", OP_F32, frand(MN * MD, -1, 1), MN, MD);
}

static void build_mhc_merge(struct h_io *h) {
  mhc_state(h);
  IN(h, "W_fn", OP_F32, frand(MHC * MHC * MD, -0.2f, 0.2f), MHC, MHC * MD);
  IN(h, "scale", OP_F32, frand(1, 0.5f, 2), 1);
  IN(h, "base", OP_F32, frand(MHC, -1, 1), MHC);
}

/* Module 1 (layer 14), three history ids then 17, two dead positions. */
static void build_engram_hash(struct h_io *h) {
  enum { HIST = 3, TOT = HIST + 17, VOCAB = 50 };
  uint8_t *dead = h_kept_zeros(TOT);
  dead[9] = dead[10] = 1;
  IN(h, "tokens", OP_I32, irand32(TOT, VOCAB), TOT);
  IN(h, "dead", OP_U8, dead, TOT);
  h_io_param(h, "module", 1), h_io_param(h, "layer", 14), h_io_param(h, "table_base", 1000);
  h_io_param(h, "heads", 3), h_io_param(h, "seed", 42), h_io_param(h, "vocab", VOCAB);
  h_io_param(h, "compressed_vocab", 37), h_io_param(h, "n_hist", HIST);
}

static void build_engram_gather(struct h_io *h) {
  enum { N = 6, O = 2, H = 3, HD = 64, BLK = 16, R = 40 };
  const size_t rb = op_engram_row_bytes(HD, BLK);
  uint8_t *table = h_kept_zeros(R * rb);
  float *vals = frand((size_t)R * HD, -300, 300);
  for (int r = 0; r < R; r++) op_fp8_pack(table + r * rb, vals + (size_t)r * HD, HD, BLK, OP_SCALE_E8M0);
  IN(h, "table", OP_U8, table, R, (int64_t)rb);
  IN(h, "rows", OP_I64, irand64(N * O * H, R), N, O, H);
  h_io_param(h, "head_dim", HD), h_io_param(h, "block", BLK);
}

static void build_engram_inject(struct h_io *h) {
  enum { N = 4, HC = 3, H = 29, DE = 40, KVW = (HC + 1) * H };
  IN(h, "X", OP_F32, frand(N * HC * H, -2, 2), N, HC, H);
  IN(h, "e", OP_F32, frand(N * DE, -1, 1), N, DE);
  IN(h, "w_kv", OP_F32, frand(KVW * DE, -0.3f, 0.3f), KVW, DE);
  IN(h, "q_w", OP_F32, frand(HC * H, 0.5f, 1.5f), HC, H);
  IN(h, "k_w", OP_F32, frand(HC * H, 0.5f, 1.5f), HC, H);
}

/* Sampled, not greedy: temperature, top-p and a seed, so two runs must agree
 * on the draws too. */
static void build_dspark_draft(struct h_io *h) {
  enum { L = 5, V = 53, RANK = 7 };
  IN(h, "base", OP_F32, frand(L * V, -3, 3), L, V);
  IN(h, "A", OP_F32, frand(V * RANK, -1, 1), V, RANK);
  IN(h, "U", OP_F32, frand(V * RANK, -1, 1), V, RANK);
  h_io_param(h, "y0", 11), h_io_param(h, "temperature", 1.3), h_io_param(h, "top_p", 0.9);
  h_io_param(h, "seed", 12345);
}

static void build_dspark_confidence(struct h_io *h) {
  static float b[1] = {0.25f};
  IN(h, "h", OP_F32, frand(6 * 33, -1, 1), 6, 33);
  IN(h, "w_c", OP_F32, frand(33, -1, 1), 33);
  IN(h, "b_c", OP_F32, b, 1);
}

static void build_dspark_verify_len(struct h_io *h) {
  enum { LMAX = 5 };
  float *t = frand(LMAX + 1, 0, 0.05f);
  for (int L = 0; L <= LMAX; L++) t[L] += 1.0f + 0.1f * (float)L; /* rounds get slower with L */
  IN(h, "a", OP_F32, frand(LMAX, 0.05f, 0.95f), LMAX);
  IN(h, "t_round", OP_F32, t, LMAX + 1);
}

static void build_sample(struct h_io *h) {
  enum { N = 7, V = 61 };
  float *logits = frand(N * V, -4, 4);
  logits[2 * V + 7] = -INFINITY; /* a masked id */
  IN(h, "logits", OP_F32, logits, N, V);
  h_io_param(h, "temperature", 0.7), h_io_param(h, "top_p", 0.8), h_io_param(h, "seed", 987654321);
}

/* ---- float64 references of the CPU run, where they are simple -------------- */

/* The float64 copy of an input, and a zero bound beside it (exact inputs). */
static double *f64_of(const struct op_tensor *t, double **bound) {
  size_t n = op_io_mem_bytes(t) / sizeof(float);
  double *x = h_keep(malloc(n * sizeof *x));
  *bound = h_keep(calloc(n, sizeof **bound));
  for (size_t i = 0; i < n; i++) x[i] = ((const float *)t->data)[i];
  return x;
}

static bool shaped(const struct op_tensor *t, int nd, const int64_t *dims, const char *what) {
  bool ok = t && t->ndim == nd && !memcmp(t->shape, dims, sizeof *dims * (size_t)nd);
  EXPECT(ok, "%s: output missing or of the wrong shape", what);
  return ok;
}

/* A gather copies rows: bitwise. */
static void ref_embed(const struct h_io *in, const struct h_io *out) {
  const struct op_tensor *table = input_of(in, "table"), *tok = input_of(in, "tokens");
  const struct op_tensor *o = op_io_mem_output(out, "out");
  const int64_t n = tok->shape[0], d = table->shape[1];
  if (!shaped(o, 2, DIMS_(n, d), "embed vs rows of the table")) return;
  for (int64_t i = 0; i < n; i++) {
    const int32_t id = ((const int32_t *)tok->data)[i];
    EXPECT(!memcmp((float *)o->data + i * d, (const float *)table->data + id * d, (size_t)d * sizeof(float)),
           "embed: row %lld is not table row %d", (long long)i, id);
  }
}

/* Bounds: tests/harness.c's h_ref_rmsnorm (gamma(d)/2 + 6u of its own
 * rounding) and h_ref_linear (gamma(K) on sum |w||x|). */
static void ref_rmsnorm(const struct h_io *in, const struct h_io *out) {
  const struct op_tensor *x = input_of(in, "x"), *g = input_of(in, "gamma"), *o = op_io_mem_output(out, "out");
  const int n = (int)x->shape[0], d = (int)x->shape[1];
  if (!shaped(o, 2, x->shape, "rmsnorm vs float64")) return;
  double *xb, *y = f64_of(x, &xb);
  h_ref_rmsnorm(y, xb, y, xb, g->data, n, d, (float)pget(in, "eps", 1e-6));
  h_within(o->data, y, xb, (size_t)n * d, "rmsnorm vs float64");
}

static void ref_linear(const struct h_io *in, const struct h_io *out) {
  const struct op_tensor *x = input_of(in, "x"), *w = input_of(in, "w"), *o = op_io_mem_output(out, "y");
  const int n = (int)x->shape[0], k = (int)x->shape[1], m = (int)w->shape[0];
  if (!shaped(o, 2, DIMS_(n, m), "linear vs float64")) return;
  double *xb, *x64 = f64_of(x, &xb), *y = h_keep(malloc((size_t)n * m * sizeof *y));
  double *yb = h_keep(malloc((size_t)n * m * sizeof *yb));
  h_ref_linear(y, yb, w->data, x64, NULL, n, k, m);
  h_within(o->data, y, yb, (size_t)n * m, "linear vs float64");
}

static void ref_qlinear(const struct h_io *in, const struct h_io *out) {
  const struct op_tensor *x = input_of(in, "x"), *w = input_of(in, "w"), *o = op_io_mem_output(out, "y");
  const int n = (int)x->shape[0], k = (int)x->shape[1], m = (int)w->shape[0];
  if (!shaped(o, 2, DIMS_(n, m), "qlinear vs float64")) return;
  const struct op_qweight qw = {OP_W_FP8, m, k, w->data, input_of(in, "scale")->data};
  float *W = h_keep(malloc((size_t)m * k * sizeof *W));
  op_qweight_dequant(W, &qw);
  double *xb, *x64 = f64_of(x, &xb), *y = h_keep(malloc((size_t)n * m * sizeof *y));
  double *yb = h_keep(malloc((size_t)n * m * sizeof *yb));
  h_ref_linear(y, yb, W, x64, NULL, n, k, m);
  h_within(o->data, y, yb, (size_t)n * m, "qlinear vs float64");
}

/* The frequencies from rope.h's formulas, written again here (not
 * op_rope_init): theta^(-2i/rope_dim), then YaRN's ramp between the
 * correction dims of beta_fast and beta_slow, clamped to [0, rope_dim - 1]. */
static void ref_freq(double *f, int rd, const struct op_rope_params *p) {
  for (int i = 0; i < rd / 2; i++) f[i] = 1.0 / pow(p->theta, 2.0 * i / rd);
  if (!p->yarn) return;
  const double pi = 3.14159265358979323846, len = (double)p->yarn_original_len;
  double lo = floor(rd * log(len / (2 * pi * p->yarn_beta_fast)) / (2 * log(p->theta)));
  double hi = ceil(rd * log(len / (2 * pi * p->yarn_beta_slow)) / (2 * log(p->theta)));
  lo = fmax(lo, 0), hi = fmin(hi, rd - 1);
  if (lo == hi) hi += 0.001;
  for (int i = 0; i < rd / 2; i++) {
    double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
    f[i] = f[i] / p->yarn_factor * ramp + f[i] * (1 - ramp);
  }
}

/* Bound: h_ref_rope's 3u of the rotation (cos/sin rounded to float, two
 * products and a sum); a last-bit difference of the frequencies moves the
 * angle by about 1e-16 * pos, far below it at pos < 2^18. */
static void ref_rope(const struct h_io *in, const struct h_io *out) {
  const struct op_tensor *x = input_of(in, "x"), *pos = input_of(in, "pos"), *o = op_io_mem_output(out, "y");
  if (!shaped(o, 3, x->shape, "rope vs float64")) return;
  struct op_rope r;
  memset(&r, 0, sizeof r);
  r.dim = (int)x->shape[2], r.rope_dim = (int)pget(in, "rope_dim", 64), r.last = pget(in, "last", 1) != 0;
  const double olen = pget(in, "yarn_original_len", OP_ROPE_YARN_ORIGINAL_LEN);
  const struct op_rope_params p = {.theta = pget(in, "theta", OP_ROPE_THETA_CSA),
                                   .yarn = pget(in, "yarn", 1) != 0,
                                   .yarn_factor = pget(in, "yarn_factor", OP_ROPE_YARN_FACTOR),
                                   .yarn_original_len = (int64_t)olen,
                                   .yarn_beta_fast = pget(in, "yarn_beta_fast", OP_ROPE_YARN_BETA_FAST),
                                   .yarn_beta_slow = pget(in, "yarn_beta_slow", OP_ROPE_YARN_BETA_SLOW)};
  ref_freq(r.freq, r.rope_dim, &p);
  double *xb, *y = f64_of(x, &xb);
  h_ref_rope(y, xb, &r, pos->data, (int)x->shape[0], (int)x->shape[1]);
  h_within(o->data, y, xb, op_io_mem_bytes(o) / sizeof(float), "rope vs float64");
}

/* Round trips, with docs/formats.md section 5's bounds written without the
 * scale the op chose, from the block's amax alone:
 *   fp4 (E4M3 scale s <= amax/6 * 9/8, the E4M3 step above amax/6 >= 2^-6)
 *   and mxfp4 (CEIL: s < amax/3): |x - x^| <= h(a) s <= max(s/4, |x|/4);
 *   fp8, FP32 scale s = amax/448: <= max(2^-10 s, 2^-4 |x|)(1 + 2^-23)
 *   + 2^-22 |x|; E8M0 scale s < 2 amax/448: <= max(2^-10 s, 2^-4 |x|). */
enum fmt { FMT_FP4, FMT_MXFP4, FMT_FP8 };

/* The round-trip bound of every value of n rows of W (blocks of `block`,
 * 0 = the row) into bound. */
static void roundtrip_bounds(enum fmt f, const float *x, int n, int W, int block, int e8m0, double *bound) {
  const int B = block ? block : W;
  for (int i = 0; i < n * W; i += B) {
    double amax = 0;
    for (int j = i; j < i + B; j++) amax = fmax(amax, fabs(x[j]));
    for (int j = i; j < i + B; j++) {
      const double ax = fabs(x[j]);
      if (f == FMT_FP4 || f == FMT_MXFP4) {
        const double s = f == FMT_FP4 ? amax / 6 * 9 / 8 : amax / 3;
        bound[j] = fmax(s / 4, ax / 4);
      } else if (!e8m0) {
        bound[j] = fmax(0x1p-10 * amax / 448, 0x1p-4 * ax) * (1 + 0x1p-23) + 0x1p-22 * ax;
      } else {
        bound[j] = fmax(0x1p-10 * 2 * amax / 448, 0x1p-4 * ax);
      }
    }
  }
}

static void roundtrip_within(enum fmt f, const float *x, const float *back, int n, int W, int block, int e8m0,
                             const char *what) {
  double *ref = h_keep(malloc((size_t)n * W * sizeof *ref)), *bound = h_keep(malloc((size_t)n * W * sizeof *bound));
  for (int j = 0; j < n * W; j++) ref[j] = x[j];
  roundtrip_bounds(f, x, n, W, block, e8m0, bound);
  h_within(back, ref, bound, (size_t)n * W, what);
}

static enum fmt fmt_of(enum op_id id) {
  return id == OP_ID_fp4_pack || id == OP_ID_fp4_unpack       ? FMT_FP4
         : id == OP_ID_mxfp4_pack || id == OP_ID_mxfp4_unpack ? FMT_MXFP4
                                                              : FMT_FP8;
}

/* A pack case: unpack its entries on the CPU and compare with x. */
static void ref_pack(enum op_id pack, enum op_id unpack, const struct h_io *in, const struct h_io *out) {
  const struct op_tensor *x = input_of(in, "x"), *e = op_io_mem_output(out, "entries");
  if (!e) {
    EXPECT(0, "%s: no entries", op_name(pack));
    return;
  }
  struct h_io u;
  h_io_init(&u);
  h_io_input(&u, "entries", OP_U8, 2, e->shape, e->data);
  for (int i = 0; i < in->n_param; i++) h_io_param(&u, in->p_name[i], in->p_val[i]);
  int rc = op_backend_run(&op_backend_cpu, unpack, &u.io);
  const struct op_tensor *back = op_io_mem_output(&u, "x");
  char what[64];
  snprintf(what, sizeof what, "%s then %s vs x", op_name(pack), op_name(unpack));
  EXPECT(rc == 0 && back, "%s: %s", what, u.error);
  if (rc == 0 && shaped(back, 2, x->shape, what))
    roundtrip_within(fmt_of(pack), x->data, back->data, (int)x->shape[0], (int)x->shape[1],
                     (int)pget(in, "block", pack == OP_ID_fp4_pack ? 16 : pack == OP_ID_mxfp4_pack ? 32 : 0),
                     (int)pget(in, "scale", 0), what);
  h_io_free(&u);
}

static void ref_fp4_pack(const struct h_io *in, const struct h_io *out) {
  ref_pack(OP_ID_fp4_pack, OP_ID_fp4_unpack, in, out);
}
static void ref_mxfp4_pack(const struct h_io *in, const struct h_io *out) {
  ref_pack(OP_ID_mxfp4_pack, OP_ID_mxfp4_unpack, in, out);
}
static void ref_fp8_pack(const struct h_io *in, const struct h_io *out) {
  ref_pack(OP_ID_fp8_pack, OP_ID_fp8_unpack, in, out);
}

/* An unpack case: its output against the rows its entries were packed from. */
static void ref_unpack(enum op_id unpack, int block, const struct h_io *in, const struct h_io *out) {
  const struct op_tensor *back = op_io_mem_output(out, "x");
  if (!back || back->ndim != 2) {
    EXPECT(0, "%s: no 2-dim x", op_name(unpack));
    return;
  }
  roundtrip_within(fmt_of(unpack), packed_from, back->data, (int)back->shape[0], (int)back->shape[1],
                   (int)pget(in, "block", block), (int)pget(in, "scale", 0), op_name(unpack));
}

static void ref_fp4_unpack(const struct h_io *in, const struct h_io *out) { ref_unpack(OP_ID_fp4_unpack, 16, in, out); }
static void ref_mxfp4_unpack(const struct h_io *in, const struct h_io *out) {
  ref_unpack(OP_ID_mxfp4_unpack, 32, in, out);
}
static void ref_fp8_unpack(const struct h_io *in, const struct h_io *out) { ref_unpack(OP_ID_fp8_unpack, 0, in, out); }

/* ---- entries packed from a GEMM's result: swa_kv, compress ----------------- */
/* A twin packs KV from its own floats (kS; kM and kI), which differ from the
 * CPU's by the GEMM's rounding, so one code may move a step: entries are not
 * compared bitwise across backends. Instead, per part of every entry:
 * 1. codes: the twin's bytes are the CPU packer's encoding (op_kv_pack) of
 *    the twin's own float output, byte for byte (codes are bitwise wherever
 *    the encoder's input is bitwise equal);
 * 2. values: the twin's entries decoded and the CPU's decoded differ by at
 *    most |x_twin - x_cpu| + rt(x_twin) + rt(x_cpu) per value, rt being the
 *    format's round-trip bound from the block's amax (roundtrip_bounds,
 *    docs/formats.md section 5), and x_twin - x_cpu the GEMM's difference,
 *    itself held to close_to_cpu's tolerance on the float output (compare). */
static void packed_part(const struct op_kv_format *f, enum fmt kind, const uint8_t *got, const uint8_t *ref,
                        size_t stride, size_t off, const float *xg, const float *xr, int n, int W, const char *what) {
  const size_t bytes = op_kv_bytes(f, W), nw = (size_t)n * W;
  const int e8m0 = f->scale == OP_KV_SCALE_E8M0;
  uint8_t *enc = h_kept_zeros(bytes + 1);
  float *dg = h_keep(malloc((nw + 1) * sizeof *dg)), *dr = h_keep(malloc((nw + 1) * sizeof *dr));
  double *bg = h_keep(malloc((nw + 1) * sizeof *bg)), *br = h_keep(malloc((nw + 1) * sizeof *br));
  double *r64 = h_keep(malloc((nw + 1) * sizeof *r64));
  for (int i = 0; i < n; i++) {
    op_kv_pack(f, enc, xg + (size_t)i * W, W);
    EXPECT(!memcmp(enc, got + (size_t)i * stride + off, bytes),
           "%s: entry %d's codes are not the CPU packer's for the twin's own floats", what, i);
    op_kv_unpack(f, dg + (size_t)i * W, got + (size_t)i * stride + off, W);
    op_kv_unpack(f, dr + (size_t)i * W, ref + (size_t)i * stride + off, W);
  }
  roundtrip_bounds(kind, xg, n, W, f->block, e8m0, bg);
  roundtrip_bounds(kind, xr, n, W, f->block, e8m0, br);
  for (size_t j = 0; j < nw; j++) r64[j] = dr[j], bg[j] += br[j] + fabs((double)xg[j] - (double)xr[j]);
  h_within(dg, r64, bg, nw, what);
}

static bool outputs_of(const struct h_io *h, const char *a, const struct op_tensor **ta, const char *b,
                       const struct op_tensor **tb) {
  *ta = op_io_mem_output(h, a), *tb = op_io_mem_output(h, b);
  return *ta && *tb;
}

static void packed_swa_kv(const struct h_io *in, const struct h_io *got, const struct h_io *ref, const char *what) {
  const struct op_tensor *eg, *xg, *er, *xr;
  if (!outputs_of(got, "entries", &eg, "kS", &xg) || !outputs_of(ref, "entries", &er, "kS", &xr)) {
    EXPECT(0, "swa_kv %s: entries or kS missing", what);
    return;
  }
  const int n = (int)xg->shape[0], W = (int)xg->shape[1], blk = (int)pget(in, "block", 0);
  const struct op_kv_format f = op_kv_fp8_format(blk ? blk : W, (enum op_scale_kind)pget(in, "scale", 0));
  char w[96];
  snprintf(w, sizeof w, "swa_kv %s: FP8 entries", what);
  packed_part(&f, FMT_FP8, eg->data, er->data, (size_t)eg->shape[1], 0, xg->data, xr->data, n, W, w);
}

static void packed_compress(const struct h_io *in, const struct h_io *got, const struct h_io *ref, const char *what) {
  const struct op_tensor *eg, *mg, *ig, *er, *mr, *ir;
  ig = op_io_mem_output(got, "kI"), ir = op_io_mem_output(ref, "kI");
  if (!outputs_of(got, "entries", &eg, "kM", &mg) || !outputs_of(ref, "entries", &er, "kM", &mr) || !ig || !ir) {
    EXPECT(0, "compress %s: entries, kM or kI missing (the case sets floats=1)", what);
    return;
  }
  const int n = (int)mg->shape[0], d = (int)mg->shape[1], di = (int)ig->shape[1];
  const enum op_nibble_order nib = (enum op_nibble_order)pget(in, "nibble", 0);
  EXPECT(pget(in, "scale_rule", 0) == 0, "compress %s: rt bounds are the ceil rule's", what);
  const struct op_kv_format mf = op_kv_fp4_format((int)pget(in, "main_block", 16), nib);
  const struct op_kv_format xf = op_kv_mxfp4_format((int)pget(in, "idx_block", 32), OP_MX_CEIL, nib);
  const size_t stride = (size_t)eg->shape[1];
  char w[96];
  snprintf(w, sizeof w, "compress %s: Main-KV FP4 part", what);
  packed_part(&mf, FMT_FP4, eg->data, er->data, stride, 0, mg->data, mr->data, n, d, w);
  snprintf(w, sizeof w, "compress %s: Indexer-K MXFP4 part", what);
  packed_part(&xf, FMT_MXFP4, eg->data, er->data, stride, op_kv_bytes(&mf, d), ig->data, ir->data, n, di, w);
}

/* ---- the table ------------------------------------------------------------ */

struct bo_case {
  void (*build)(struct h_io *h); /* inputs and parameters */
  /* The longest fp32 reduction behind one output element (1 for elementwise
   * ops): sizes the tolerance for backends without the CPU's bits. Where an
   * output comes from a chain of reductions (a GEMM, then a norm, a softmax
   * or a second GEMM), k is the sum of the chain's lengths: to first order
   * the chain's normalized error is the sum of its stages' (a norm divides
   * a relative error out, a rotation keeps it, a second GEMM over random
   * weights maps it at about unit gain), and 2 gamma(k) sqrt(k) grows faster
   * than k, so the bound of the sum covers the sum of the bounds. A stage
   * that amplifies (an exp of a value with an error) counts its input's
   * length once more per unit of gain, as the table says. */
  int k;
  /* The CPU's output against a float64 reference, where one is simple. */
  void (*ref)(const struct h_io *in, const struct h_io *out);
  /* For ops whose U8 "entries" are packed from a GEMM's result: their check
   * against the CPU's on a backend without the CPU's bits (above), in place
   * of the bitwise one. */
  void (*packed)(const struct h_io *in, const struct h_io *got, const struct h_io *ref, const char *what);
};

#define CASE_(op, kk, reff) [OP_ID_##op] = {.build = build_##op, .k = (kk), .ref = (reff)}
#define PACKED_(op, kk) [OP_ID_##op] = {.build = build_##op, .k = (kk), .packed = packed_##op}
static const struct bo_case cases[OP_COUNT] = {
    CASE_(embed, 1, ref_embed),
    CASE_(rmsnorm, HID, ref_rmsnorm),
    CASE_(linear, HID, ref_linear),
    CASE_(qlinear, HID, ref_qlinear),
    CASE_(rope, 2, ref_rope),
    CASE_(fp4_pack, 1, ref_fp4_pack),
    CASE_(fp4_unpack, 1, ref_fp4_unpack),
    CASE_(mxfp4_pack, 1, ref_mxfp4_pack),
    CASE_(mxfp4_unpack, 1, ref_mxfp4_unpack),
    CASE_(fp8_pack, 1, ref_fp8_pack),
    CASE_(fp8_unpack, 1, ref_fp8_unpack),
    CASE_(q_latent, HID + QR, NULL),    /* W_qa, then RMSNorm over q_rank */
    CASE_(q_main, QR + 16, NULL),       /* W_qb, then the head norm over head_dim 16 (RoPE: 3u) */
    CASE_(q_indexer, QR, NULL),         /* W_iq (RoPE: 3u) */
    CASE_(index_weights, HID, NULL),    /* W_w (the scale: one rounding) */
    PACKED_(swa_kv, HID + 16),          /* W_kv, then RMSNorm over head_dim 16 */
    /* W_kv; W_gate through the softmax's exp, whose weights move by 2 |dg|
     * relative (max and slot): |g| <= 37 * 2 * 0.1 = 7.4, ~0.4 typical, so
     * 2 HID more; RMSNorm_C over D = 32; W_ik over 32; k_norm over 16. */
    PACKED_(compress, 3 * HID + 2 * 32 + 16),
    CASE_(indexer_topk, IH * IW, NULL),
    CASE_(reindex, IH * IW, NULL),
    CASE_(sparse_attn, (AK + ASL) * AD, NULL),
    CASE_(oproj, 12, NULL),
    CASE_(moe, 13, NULL),
    CASE_(mhc_coeffs, MHC * MD, NULL),
    CASE_(mhc_mix, MHC, NULL),
    CASE_(mhc_update, MHC, NULL),
    CASE_(mhc_merge, MHC * MD, NULL),
    CASE_(engram_hash, 1, NULL),
    CASE_(engram_gather, 1, NULL),
    CASE_(engram_inject, 40, NULL),
    /* U A[prev] over rank 7; the softmax's exp((l - m) / T) moves p by
     * |dl| / T relative, |l| <= 3 + 7 and T = 1.3: two ranks more; then the
     * sum over V = 53. */
    CASE_(dspark_draft, 3 * 7 + 53, NULL),
    /* w_c . h over 33; the sigmoid moves a by |x| (1 - a) |dx / x| relative,
     * |x| ~ 2 (33 terms in [-1, 1]^2): twice more. */
    CASE_(dspark_confidence, 3 * 33, NULL),
    CASE_(dspark_verify_len, 6, NULL),
    CASE_(sample, 61, NULL),
};
#undef CASE_
#undef PACKED_

/* ---- the checks ------------------------------------------------------------ */

/* Dims of a declared shape such as "((2 + hc) * hc, hc * d)": top-level commas + 1. */
static int declared_dims(const char *shape) {
  int depth = 0, commas = 0;
  for (const char *c = shape; *c; c++) {
    if (*c == '(') depth++;
    else if (*c == ')') depth--;
    else if (*c == ',' && depth == 1) commas++;
  }
  return commas + 1;
}

static const struct op_arg *declared(const struct op_arg *a, const char *name) {
  for (; a && a->name; a++)
    if (!strcmp(a->name, name)) return a;
  return NULL;
}

/* Outputs are declared, of their declared dtype and rank, inside their
 * guards, and finite. */
static void check_outputs(const struct op_desc *d, const struct h_io *r, const char *be) {
  EXPECT(r->n_out > 0, "%s on %s: no outputs", d->name, be);
  for (int i = 0; i < r->n_out; i++) {
    const struct op_tensor *t = &r->out[i];
    const struct op_arg *a = declared(d->outputs, r->out_name[i]);
    EXPECT(a, "%s on %s: undeclared output '%s'", d->name, be, r->out_name[i]);
    if (!a) continue;
    EXPECT(t->dtype == a->dtype && t->ndim == declared_dims(a->shape), "%s on %s: '%s' is %s with %d dims, declared "
           "%s %s", d->name, be, a->name, op_dtype_name(t->dtype), t->ndim, op_dtype_name(a->dtype), a->shape);
    EXPECT(op_io_mem_guards_ok(r, i), "%s on %s: write outside output '%s'", d->name, be, a->name);
    if (t->dtype == OP_F32) {
      char what[96];
      snprintf(what, sizeof what, "%s on %s: '%s'", d->name, be, a->name);
      h_finite(t->data, op_io_mem_bytes(t) / sizeof(float), what);
    }
  }
}

/* Same outputs, same shapes; then the same bytes (bitwise) or, for F32
 * outputs of a backend without the CPU's bits, a normalized error within
 * close_to_cpu's bound. */
static void compare(const struct op_desc *d, const struct h_io *a, const struct h_io *ref, bool bitwise, int k,
                    const char *what, const char *skip) {
  EXPECT(a->n_out == ref->n_out, "%s %s: %d outputs, reference %d", d->name, what, a->n_out, ref->n_out);
  for (int i = 0; i < ref->n_out; i++) {
    const struct op_tensor *r = &ref->out[i], *t = op_io_mem_output(a, ref->out_name[i]);
    if (!t || t->dtype != r->dtype || t->ndim != r->ndim ||
        memcmp(t->shape, r->shape, sizeof(int64_t) * (size_t)r->ndim)) {
      EXPECT(0, "%s %s: output '%s' missing or shaped differently", d->name, what, ref->out_name[i]);
      continue;
    }
    const size_t bytes = op_io_mem_bytes(r);
    if (skip && !strcmp(ref->out_name[i], skip)) continue; /* the case's packed check instead */
    if (bitwise || r->dtype != OP_F32) {
      /* Ids, codes and counts have no tolerance: a backend whose rounding
       * can move one across a boundary must promise the CPU's bits. */
      EXPECT(!memcmp(t->data, r->data, bytes), "%s %s: '%s' differs from the reference's bits", d->name, what,
             ref->out_name[i]);
      continue;
    }
    /* close_to_cpu: each backend forms an element from k fp32 terms, each
     * within gamma(k) sum|terms| of the exact value (Higham 3.1), so the two
     * within 2 gamma(k) sum|terms|. For these inputs (uniform, random signs)
     * sum|terms| is about sqrt(k) times an element's magnitude on average, so
     * the normalized error over the tensor, sqrt(sum (a - r)^2 / sum r^2),
     * is bounded by 2 gamma(k) sqrt(k), plus 8u for the op's elementwise
     * steps after the sum (a norm, an exp, a division: 1-2u each). Compared
     * per tensor, not per element: one cancelling element has no useful
     * relative bound. */
    const float *x = t->data, *y = r->data;
    double num = 0, den = 0;
    for (size_t j = 0; j < bytes / sizeof(float); j++) {
      const double e = (double)x[j] - y[j];
      num += e * e, den += (double)y[j] * y[j];
    }
    const double err = den > 0 ? sqrt(num / den) : sqrt(num), tol = 2 * h_gamma(k) * sqrt((double)k) + 8 * H_U32;
    EXPECT(err <= tol, "%s %s: '%s' normalized error %.3g > %.3g (k %d)", d->name, what, ref->out_name[i], err, tol, k);
  }
}

enum cell { CELL_OK, CELL_FAIL, CELL_NA, CELL_SKIP };
static const char *const cell_text[] = {"ok", "FAIL", "n/a", "skipped"};

/* One op on one backend; ref holds the CPU's outputs (filled when b is the CPU). */
static enum cell run_on(enum op_id id, const struct bo_case *c, const struct h_io *in, const struct op_backend *b,
                        struct h_io *ref, bool have_ref) {
  const struct op_desc *d = op_registry[id];
  const int before = h_failures;
  struct h_io r1, r2, bad;
  if (!op_backend_has(b, id)) { /* listed, not failed; the helper says so too */
    clone_call(&r1, in, NULL);
    int rc = op_backend_run(b, id, &r1.io);
    EXPECT(rc == CEDAR_EUNSUPPORTED && strstr(r1.error, "not implemented on"), "%s on %s: NULL slot gave %d '%s'",
           d->name, b->name, rc, r1.error);
    h_io_free(&r1);
    return h_failures == before ? CELL_NA : CELL_FAIL;
  }
  clone_call(&r1, in, NULL), clone_call(&r2, in, NULL);
  int rc1 = op_backend_run(b, id, &r1.io), rc2 = op_backend_run(b, id, &r2.io);
  EXPECT(rc1 == 0 && rc2 == 0, "%s on %s failed (%d, %d): %s", d->name, b->name, rc1, rc2, r1.error);
  if (rc1 == 0 && rc2 == 0) {
    check_outputs(d, &r1, b->name);
    char what[64];
    snprintf(what, sizeof what, "on %s, run twice", b->name);
    compare(d, &r2, &r1, true, c->k, what, NULL);
    if (b == &op_backend_cpu) {
      if (c->ref) c->ref(in, &r1);
      *ref = r1, ref->io.ctx = ref; /* keep the outputs as the reference */
      r1.n_out = 0;
    } else if (have_ref) {
      snprintf(what, sizeof what, "on %s vs cpu", b->name);
      const bool packed = c->packed && !b->cpu_bits;
      compare(d, &r1, ref, b->cpu_bits, c->k, what, packed ? "entries" : NULL);
      if (packed) c->packed(in, &r1, ref, what);
    }
  }
  h_io_free(&r1), h_io_free(&r2);
  /* A missing input is refused by name, through the backend. */
  const char *first = d->inputs[0].name;
  clone_call(&bad, in, first);
  int rc = op_backend_run(b, id, &bad.io);
  char want[96];
  snprintf(want, sizeof want, "missing input tensor '%s'", first);
  EXPECT(rc < 0 && strstr(bad.error, want), "%s on %s without '%s': status %d, '%s'", d->name, b->name, first, rc,
         bad.error);
  h_io_free(&bad);
  return h_failures == before ? CELL_OK : CELL_FAIL;
}

/* The packed checks on the CPU's own outputs (so they run, and can fail,
 * without a GPU): the CPU against itself passes; with one payload byte of
 * the entries flipped, the codes check must fail. */
static void packed_selftest(enum op_id id, const struct bo_case *c, const struct h_io *in, const struct h_io *ref) {
  const int before = h_failures;
  c->packed(in, ref, ref, "cpu vs itself");
  EXPECT(h_failures == before, "%s: the packed check fails the CPU against itself", op_name(id));
  const struct op_tensor *e = op_io_mem_output(ref, "entries");
  if (!e || !op_io_mem_bytes(e)) return;
  uint8_t *b = e->data;
  b[0] ^= 0x11;
  printf("%s: packed-check self-test, a failure is expected next:\n", op_name(id));
  const int mid = h_failures;
  c->packed(in, ref, ref, "self-test, one byte flipped");
  const bool caught = h_failures > mid;
  h_failures = mid, b[0] ^= 0x11;
  EXPECT(caught, "%s: the packed check accepts an entry byte that is not the packer's", op_name(id));
}

int main(void) {
  op_blas_init();
  bool avail[N_BACKENDS];
  char why[N_BACKENDS][256];
  for (int j = 0; j < N_BACKENDS; j++) avail[j] = backends[j]->available(why[j], sizeof why[j]);
  EXPECT(avail[0], "the cpu backend is not available: %s", why[0]);
  static enum cell grid[OP_COUNT][N_BACKENDS];
  for (int i = 0; i < OP_COUNT; i++) {
    const struct bo_case *c = &cases[i];
    EXPECT(c->build && c->k >= 1, "op %s has no case in tests/test_backend_ops.c: add one", op_name((enum op_id)i));
    if (!c->build) {
      for (int j = 0; j < N_BACKENDS; j++) grid[i][j] = CELL_FAIL;
      continue;
    }
    struct h_io in, ref;
    h_io_init(&in), h_io_init(&ref);
    c->build(&in);
    bool have_ref = false;
    for (int j = 0; j < N_BACKENDS; j++) {
      grid[i][j] = avail[j] ? run_on((enum op_id)i, c, &in, backends[j], &ref, have_ref) : CELL_SKIP;
      have_ref = have_ref || (j == 0 && grid[i][j] == CELL_OK);
    }
    if (have_ref && c->packed) packed_selftest((enum op_id)i, c, &in, &ref);
    h_io_free(&ref);
    h_kept_free();
  }
  printf("%-18s", "op");
  for (int j = 0; j < N_BACKENDS; j++) printf(" %-8s", backends[j]->name);
  printf("\n");
  for (int i = 0; i < OP_COUNT; i++) {
    printf("%-18s", op_name((enum op_id)i));
    for (int j = 0; j < N_BACKENDS; j++) printf(" %-8s", cell_text[grid[i][j]]);
    printf("\n");
  }
  for (int j = 0; j < N_BACKENDS; j++) {
    if (!avail[j]) {
      printf("%s: skipped: %s\n", backends[j]->name, why[j]);
      continue;
    }
    int na = 0;
    for (int i = 0; i < OP_COUNT; i++) na += grid[i][j] == CELL_NA;
    if (na) printf("%s: %d of %d ops not implemented on %s\n", backends[j]->name, na, OP_COUNT, backends[j]->name);
  }
  return h_report("backend ops");
}
