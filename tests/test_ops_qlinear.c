/* test_ops_qlinear.c: linear layers from stored-format weights (ops/qlinear.h).
 *
 * What it checks, for F32, BF16, FP8 (E4M3, UE8M0 per 32 x 32 tile) and FP4
 * (E2M1, UE8M0 per row group of 32):
 *   - op_qweight_dequant gives, bit for bit, dec(q) * 2^(s - 127) computed
 *     element by element here through ops/formats.h's scalar codecs (the
 *     values runtime/ckpt_map.c's dequantizers write);
 *   - op_qlinear is bitwise op_linear over that dequantized matrix, at every
 *     ISA level this CPU has, for n = 1..9 and 33 (the fused one-row and
 *     few-row tiles, and the dequantized-panel path from
 *     OP_QLINEAR_PANEL_ROWS rows on), on odd shapes (in with and without a
 *     tail of in mod 16, out not a multiple of a tile or of a 32-row scale
 *     tile, several panels), with row strides wider than the row;
 *   - the same bits as a plain scalar loop of the documented order (16 lanes
 *     over k, mul then add, then the halving tree), written here apart from
 *     ops/lin_kernel.h, so a change of the shared kernel's order fails too;
 *   - row invariance: each row of a call of n rows is bitwise the row alone;
 *   - against a float64 reference over the dequantized weights within
 *     gamma(in) sum |x w| (Higham 3.1: an in-term fp32 sum; nothing after it);
 *   - scale codes on the fast path (s <= 134 fp8, <= 128 fp4), past it, 0
 *     (2^-127, a float subnormal) and 0xFF (NaN), and the E4M3 NaN codes:
 *     still bitwise the reference, NaN where it is;
 *   - outputs written only inside their rows (sentinels), and the
 *     descriptor `qlinear` through the registry, with its refusals.
 *
 * Run from the repository root: ctest --test-dir build -R ops_qlinear.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/formats.h"
#include "ops/isa.h"
#include "ops/qlinear.h"
#include "base/check.h"
#include "tests/harness.h"

/* ---- a stored weight, made here ------------------------------------------- */

struct qw {
  struct op_qweight w;
  uint8_t *data, *scale;
};

static uint64_t rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

/* Scale codes: mostly around 2^-7 (weights ~ 1), some past the fast path,
 * some 0 (2^-127); NaN codes only when `poison`. */
static uint8_t scale_code(uint64_t *s, bool poison) {
  unsigned r = (unsigned)(rnd(s) % 100);
  if (poison && r == 0) return 0xFF;
  if (r < 4) return 0;
  if (r < 12) return (uint8_t)(129 + rnd(s) % 10); /* 129..138: both sides of 128 and 134 */
  return (uint8_t)(114 + rnd(s) % 12);
}

static uint8_t fp8_code(uint64_t *s, bool poison) {
  uint8_t c = (uint8_t)rnd(s);
  if (!poison && (c & 0x7F) == 0x7F) c ^= 1; /* 0x7E: +-448 */
  return c;
}

static void qw_make(struct qw *q, enum op_wfmt f, int out, int in, uint64_t seed, bool poison) {
  q->w = (struct op_qweight){f, out, in, NULL, NULL};
  size_t db = op_qweight_data_bytes(&q->w), sb = op_qweight_scale_bytes(&q->w);
  q->data = malloc(db + 1), q->scale = malloc(sb + 1);
  CEDAR_ASSERT(q->data && q->scale);
  uint64_t s = seed;
  for (size_t i = 0; i < db; i++) {
    if (f == OP_W_FP8) q->data[i] = fp8_code(&s, poison);
    else q->data[i] = (uint8_t)rnd(&s);
  }
  if (f == OP_W_F32 || f == OP_W_BF16) { /* finite values in [-2, 2] */
    for (size_t i = 0; i < (size_t)out * in; i++) {
      float v = (float)((double)rnd(&s) / 2147483648.0 * 4.0 - 2.0);
      uint32_t u;
      memcpy(&u, &v, 4);
      if (f == OP_W_F32) memcpy(q->data + 4 * i, &u, 4);
      else q->data[2 * i] = (uint8_t)(u >> 16), q->data[2 * i + 1] = (uint8_t)(u >> 24);
    }
  }
  for (size_t i = 0; i < sb; i++) q->scale[i] = scale_code(&s, poison);
  q->w.data = q->data, q->w.scale = q->scale;
}

static void qw_free(struct qw *q) { free(q->data), free(q->scale); }

/* The definition, element by element: ops/formats.h's decoders and one
 * float multiply (runtime/ckpt_map.c's ckpt_fp8_dequant / ckpt_fp4_dequant). */
static float ref_weight(const struct op_qweight *w, int o, int k) {
  size_t e = (size_t)o * w->in + k;
  const uint8_t *d = w->data;
  switch (w->fmt) {
    case OP_W_F32: {
      float v;
      memcpy(&v, d + 4 * e, 4);
      return v;
    }
    case OP_W_BF16: {
      uint32_t u = (uint32_t)(d[2 * e] | d[2 * e + 1] << 8) << 16;
      float v;
      memcpy(&v, &u, 4);
      return v;
    }
    case OP_W_FP8: return op_e4m3_decode(d[e]) * op_e8m0_decode(op_qweight_scale_at(w, o, k));
    default: {
      uint8_t b = d[e / 2], c = (uint8_t)(k % 2 ? b >> 4 : b & 15);
      return op_e2m1_decode(c) * op_e8m0_decode(op_qweight_scale_at(w, o, k));
    }
  }
}

static bool same_bits(const float *a, const float *b, size_t n, size_t *at) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(a + i, b + i, 4)) {
      *at = i;
      return false;
    }
  return true;
}

/* The documented order as a plain loop: lane l sums k = l, l + 16, ... (the
 * padding of the last chunk adds +0 products), then (l, l+8), (l, l+4),
 * (l, l+2), (0, 1). */
static float scalar_order(const float *x, const float *W, int in) {
  float lane[16] = {0};
  int kk = (in + 15) / 16 * 16;
  for (int k = 0; k < kk; k++) {
    float p = k < in ? x[k] * W[k] : 0.0f * 0.0f;
    lane[k % 16] = lane[k % 16] + p;
  }
  for (int h = 8; h >= 1; h /= 2)
    for (int l = 0; l < h; l++) lane[l] = lane[l] + lane[l + h];
  return lane[0];
}

/* ---- the checks ------------------------------------------------------------ */

struct shape {
  int out, in;
};

/* One weight: dequant against the definition, then every n at every level
 * against op_linear, the scalar order, row invariance and float64. */
static void check_weight(const struct qw *q, const enum op_isa *levels, int n_levels, bool poison) {
  const struct op_qweight *w = &q->w;
  const int out = w->out, in = w->in, NMAX = 33, ldx = in + 3, ldy = out + 5;
  char what[160];
  snprintf(what, sizeof what, "%s out %d in %d%s", op_wfmt_name(w->fmt), out, in, poison ? " (NaN codes)" : "");
  float *W = malloc((size_t)out * in * sizeof *W + 4), *Wref = malloc((size_t)out * in * sizeof *W + 4);
  float *x = malloc((size_t)NMAX * ldx * sizeof *x), *ref = malloc((size_t)NMAX * ldy * sizeof *ref);
  uint64_t seed = 0x9E37u + (uint64_t)out * 131 + (uint64_t)in;
  h_fill(x, (size_t)NMAX * ldx, &seed, -1.0f, 1.0f);
  for (int o = 0; o < out; o++)
    for (int k = 0; k < in; k++) Wref[(size_t)o * in + k] = ref_weight(w, o, k);
  size_t at = 0;
  op_qweight_dequant(W, w);
  EXPECT(same_bits(W, Wref, (size_t)out * in, &at), "%s: dequant element %zu is %a, the definition %a", what, at,
         (double)W[at], (double)Wref[at]);
  op_isa_force(OP_ISA_DEFAULT);
  op_linear(ref, x, Wref, NMAX, in, out, ldx, ldy);
  for (int i = 0; i < NMAX && !poison; i += 7)
    for (int o = 0; o < out; o++) {
      float s = scalar_order(x + (size_t)i * ldx, Wref + (size_t)o * in, in);
      EXPECT(!memcmp(&s, ref + (size_t)i * ldy + o, 4), "%s: op_linear row %d out %d is %a, the scalar order %a",
             what, i, o, (double)ref[(size_t)i * ldy + o], (double)s);
    }
  static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 33};
  for (int li = 0; li < n_levels; li++) {
    op_isa_force(levels[li]);
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
      const int n = ns[t];
      float *y = h_alloc((size_t)n * ldy);
      for (size_t j = 0; j < (size_t)n * ldy; j++) y[j] = 7.0f; /* the gaps between rows stay 7 */
      op_qlinear(y, x, w, n, ldx, ldy);
      for (int i = 0; i < n; i++) {
        bool ok = same_bits(y + (size_t)i * ldy, ref + (size_t)i * ldy, (size_t)out, &at);
        EXPECT(ok, "%s: level %s n %d row %d out %zu is %a, dequant + op_linear %a", what,
               op_isa_name(levels[li]), n, i, at, (double)y[(size_t)i * ldy + at],
               (double)ref[(size_t)i * ldy + at]);
        for (int j = out; j < ldy && i + 1 < n; j++)
          EXPECT(y[(size_t)i * ldy + j] == 7.0f, "%s: n %d wrote column %d of row %d's stride", what, n, j, i);
      }
      h_free(y, (size_t)n * ldy, what);
    }
  }
  op_isa_force(OP_ISA_DEFAULT);
  if (!poison) { /* values: float64 over the dequantized weights */
    double *xd = malloc((size_t)NMAX * in * sizeof *xd), *yd = malloc((size_t)NMAX * out * sizeof *yd);
    double *yb = malloc((size_t)NMAX * out * sizeof *yb);
    float *yc = malloc((size_t)NMAX * out * sizeof *yc);
    for (int i = 0; i < NMAX; i++)
      for (int k = 0; k < in; k++) xd[(size_t)i * in + k] = x[(size_t)i * ldx + k];
    h_ref_linear(yd, yb, Wref, xd, NULL, NMAX, in, out);
    op_qlinear(yc, x, w, NMAX, ldx, out);
    /* yb = gamma(in) sum_k |x w| (h_ref_linear): an in-term fp32 sum, the
     * products rounded once each inside gamma(in) too, nothing after it. */
    if (h_finite(yc, (size_t)NMAX * out, what)) h_within(yc, yd, yb, (size_t)NMAX * out, what);
    free(xd), free(yd), free(yb), free(yc);
  } else { /* a NaN weight makes its output NaN, and only those */
    for (int o = 0; o < out; o++) {
      bool has = false;
      for (int k = 0; k < in; k++) has |= isnan(Wref[(size_t)o * in + k]);
      EXPECT(!!isnan(ref[o]) == has, "%s: out %d NaN %d but its weights %s NaN", what, o, !!isnan(ref[o]),
             has ? "hold a" : "hold no");
    }
  }
  free(W), free(Wref), free(x), free(ref);
}

static void check_formats(const enum op_isa *levels, int n_levels) {
  static const struct shape any[] = {{1, 1}, {7, 13}, {33, 47}, {64, 96}, {37, 160}, {9, 300}, {100, 2048}};
  static const struct shape fp4[] = {{1, 32}, {7, 32}, {33, 64}, {37, 160}, {65, 288}, {100, 2048}};
  for (int f = 0; f < OP_W_COUNT; f++) {
    const struct shape *sh = f == OP_W_FP4 ? fp4 : any;
    int ns = f == OP_W_FP4 ? (int)(sizeof fp4 / sizeof fp4[0]) : (int)(sizeof any / sizeof any[0]);
    for (int i = 0; i < ns; i++) {
      struct qw q;
      qw_make(&q, (enum op_wfmt)f, sh[i].out, sh[i].in, 17u + (uint64_t)i * 1000 + (uint64_t)f, false);
      check_weight(&q, levels, n_levels, false);
      qw_free(&q);
    }
    if (f == OP_W_FP8 || f == OP_W_FP4) { /* NaN scales (and E4M3 NaN codes) */
      struct qw q;
      qw_make(&q, (enum op_wfmt)f, 70, 96, 99u + (uint64_t)f, true);
      check_weight(&q, levels, n_levels, true);
      qw_free(&q);
    }
  }
}

static void check_refusals(void) {
  uint8_t b[64] = {0};
  struct op_qweight w = {OP_W_FP4, 2, 33, b, b};
  EXPECT(op_qweight_check(&w) != NULL, "fp4 with in 33 accepted");
  w = (struct op_qweight){OP_W_FP8, 2, 16, b, NULL};
  EXPECT(op_qweight_check(&w) != NULL, "fp8 without scales accepted");
  w = (struct op_qweight){(enum op_wfmt)9, 2, 16, b, b};
  EXPECT(op_qweight_check(&w) != NULL, "format 9 accepted");
  w = (struct op_qweight){OP_W_BF16, 0, 16, NULL, NULL};
  EXPECT(op_qweight_check(&w) == NULL, "an empty bf16 weight refused");
  w = (struct op_qweight){OP_W_FP8, 33, 40, b, b};
  EXPECT_EQ(op_qweight_data_bytes(&w), 33 * 40, "fp8 data bytes");
  EXPECT_EQ(op_qweight_scale_bytes(&w), 2 * 2, "fp8 scale tiles");
  w = (struct op_qweight){OP_W_FP4, 3, 64, b, b};
  EXPECT_EQ(op_qweight_data_bytes(&w), 3 * 32, "fp4 data bytes");
  EXPECT_EQ(op_qweight_scale_bytes(&w), 3 * 2, "fp4 scale groups");
}

/* The registry's qlinear: the fp8 call's y is op_qlinear's; bad inputs are
 * refused with a message naming the tensor. */
static void check_descriptor(void) {
  struct qw q;
  qw_make(&q, OP_W_FP8, 40, 50, 5, false);
  float x[3 * 50], y[3 * 40];
  uint64_t seed = 3;
  h_fill(x, sizeof x / sizeof x[0], &seed, -1, 1);
  op_qlinear(y, x, &q.w, 3, 50, 40);
  struct h_io io;
  h_io_init(&io);
  h_io_input(&io, "x", OP_F32, 2, (int64_t[]){3, 50}, x);
  h_io_input(&io, "w", OP_U8, 2, (int64_t[]){40, 50}, q.data);
  h_io_input(&io, "scale", OP_U8, 2, (int64_t[]){2, 2}, q.scale);
  h_io_param(&io, "format", OP_W_FP8);
  EXPECT_EQ(h_io_run(&io, "qlinear"), 0, "qlinear fp8: %s", io.error);
  const struct op_tensor *t = h_io_output(&io, "y");
  EXPECT(t && t->shape[0] == 3 && t->shape[1] == 40 && !memcmp(t->data, y, sizeof y), "qlinear fp8: y differs");
  h_io_free(&io);
  h_io_param(&io, "format", OP_W_FP4); /* 50 bytes is no fp4 row of 50 values */
  EXPECT(h_io_run(&io, "qlinear") < 0 && strstr(io.error, "fp4"), "fp4 over fp8 bytes: %s", io.error);
  h_io_free(&io);
  h_io_init(&io);
  h_io_input(&io, "x", OP_F32, 2, (int64_t[]){3, 50}, x);
  h_io_input(&io, "w", OP_U8, 2, (int64_t[]){40, 50}, q.data);
  h_io_input(&io, "scale", OP_U8, 2, (int64_t[]){2, 1}, q.scale);
  EXPECT(h_io_run(&io, "qlinear") < 0 && strstr(io.error, "scale"), "short scales: %s", io.error);
  h_io_free(&io);
  h_io_init(&io);
  h_io_input(&io, "x", OP_F32, 2, (int64_t[]){3, 50}, x);
  h_io_input(&io, "w", OP_U8, 2, (int64_t[]){40, 50}, q.data);
  EXPECT(h_io_run(&io, "qlinear") < 0 && strstr(io.error, "scale"), "no scales: %s", io.error);
  h_io_free(&io);
  qw_free(&q);
}

int main(void) {
  op_blas_init();
  enum op_isa levels[OP_ISA_COUNT];
  int n = 0;
  for (int i = 0; i < OP_ISA_COUNT; i++)
    if (op_isa_supported((enum op_isa)i)) levels[n++] = (enum op_isa)i;
  printf("levels:");
  for (int i = 0; i < n; i++) printf(" %s", op_isa_name(levels[i]));
  printf("\n");
  check_refusals();
  check_formats(levels, n);
  check_descriptor();
  return h_report("ops_qlinear");
}
