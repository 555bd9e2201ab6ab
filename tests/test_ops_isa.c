/* test_ops_isa.c: the kernels compiled for several vector ISAs (ops/isa.h)
 * give the same bits at every level this CPU has.
 *
 * What it checks: op_sparse_attn_f32 (online_flush), the indexer
 * (score_tile through op_indexer_score, op_indexer_topk and
 * op_indexer_reindex) and the KV packers (op_fp4_pack, op_mxfp4_pack,
 * op_fp8_pack, on rows with zeros, subnormals, NaN and Inf; their bytes
 * against the per-element reference are tests/test_formats_*.c's, at every
 * level) and the mHC ops (op_mhc_coeffs_from_stats, op_mhc_mix,
 * op_mhc_update, op_mhc_update_inplace, op_mhc_stats' sum of squares,
 * op_mhc_update_mix_fused, op_mhc_merge) run once per supported level,
 * forced with op_isa_force; every output is compared byte for byte with the default
 * (SSE2) level's. The check fails when the clones are built with FMA
 * contraction (tried: every attention and indexer case differs). Shapes are odd on purpose: head counts that are not a
 * multiple of the heads summed per pass, widths that are not a multiple of
 * a vector or a channel chunk, blocks left partly filled, -1 in Top-K;
 * mHC widths short of a tile or one past whole tiles, 3 streams, position
 * counts that leave the Sinkhorn lanes and the fused pass's blocks partial
 * (its rows of W go 3 at a time at SSE2 and 6 above: the same sums).
 * op_linear (the fixed-order kernel of ops/basic.c) is checked at every
 * level too, and for row invariance: each row computed in a call of n rows
 * (n = 1..9, 33; widths with and without a k tail, ldx/ldy wider than the
 * row) is bitwise the row computed alone.
 * Also: op_isa_force refuses a level the CPU lacks and an unknown one.
 *
 * What it is not: a check of the values (tests/test_ops_attention.c and
 * tests/test_ops_indexer.c compare them with float64 references).
 * On a CPU with only the default level it says so and checks that level
 * against itself.
 *
 * Run from the repository root: ctest --test-dir build -R ops_isa.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention.h"
#include "ops/basic.h"
#include "ops/formats.h"
#include "ops/indexer.h"
#include "ops/isa.h"
#include "ops/mhc.h"
#include "base/check.h"
#include "tests/harness.h"

/* ---- attention ----------------------------------------------------------- */

struct attn_case {
  int S, heads, d, topk, n_global, slots, window;
  bool sink;
};

/* o (S, heads, d) and n_used (S) of one case at the current level. */
static void attn_run(const struct attn_case *c, float *o, int32_t *used, uint64_t seed) {
  const size_t qn = (size_t)c->S * c->heads * c->d;
  float *q = malloc(qn * sizeof *q), *g = malloc((size_t)c->n_global * c->d * sizeof *g);
  float *sw = malloc((size_t)c->slots * c->d * sizeof *sw), sink[64];
  int64_t *pos = malloc((size_t)c->S * sizeof *pos), *spos = malloc((size_t)c->slots * sizeof *spos);
  int32_t *idx = malloc((size_t)c->S * c->topk * sizeof *idx);
  h_fill(q, qn, &seed, -2, 2);
  h_fill(g, (size_t)c->n_global * c->d, &seed, -3, 3);
  h_fill(sw, (size_t)c->slots * c->d, &seed, -3, 3);
  h_fill(sink, 64, &seed, -1, 1);
  for (int i = 0; i < c->S; i++) pos[i] = 200 + i;
  for (int s = 0; s < c->slots; s++) spos[s] = s % 7 == 3 ? -1 : 200 - c->slots / 2 + s; /* some empty, some future */
  for (int t = 0; t < c->S * c->topk; t++) idx[t] = t % 11 == 5 ? -1 : (int32_t)(h_uniform(&seed) * c->n_global);
  struct op_attn_params pr = {.heads = c->heads, .head_dim = c->d, .topk = c->topk, .window = c->window,
                              .tau = 0.125f, .sink = c->sink ? sink : NULL};
  op_sparse_attn_f32(o, used, q, pos, idx, g, c->n_global, sw, spos, c->slots, c->S, &pr);
  free(q), free(g), free(sw), free(pos), free(spos), free(idx);
}

static void check_attention(const enum op_isa *levels, int n_levels) {
  static const struct attn_case cases[] = {
      {3, 6, 72, 40, 100, 20, 16, true},   /* 4 + 2 heads, d not a multiple of 16 */
      {2, 8, 128, 33, 70, 9, 128, false},  /* blocks left part full, no sink */
      {1, 64, 512, 64, 200, 40, 32, true}, /* flash-like heads and width */
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    const struct attn_case *c = &cases[k];
    const size_t on = (size_t)c->S * c->heads * c->d;
    float *ref = malloc(on * sizeof *ref), *o = malloc(on * sizeof *o);
    int32_t ref_used[8], used[8];
    op_isa_force(OP_ISA_DEFAULT);
    attn_run(c, ref, ref_used, 0x1234 + k);
    EXPECT(h_finite(ref, on, "attention reference"), "case %zu", k);
    for (int l = 0; l < n_levels; l++) {
      EXPECT(op_isa_force(levels[l]), "force %s", op_isa_name(levels[l]));
      memset(o, 0xA5, on * sizeof *o);
      attn_run(c, o, used, 0x1234 + k);
      EXPECT(!memcmp(o, ref, on * sizeof *o) && !memcmp(used, ref_used, (size_t)c->S * sizeof *used),
             "attention case %zu (S %d heads %d d %d): level %s differs from default", k, c->S, c->heads, c->d,
             op_isa_name(levels[l]));
    }
    free(ref), free(o);
  }
}

/* ---- indexer ------------------------------------------------------------- */

enum { IDX_W = 64, IDX_BLOCK = 32, PAGE = 16 };

struct idx_src {
  struct op_kv_view kv;
  uint8_t *pages[32];
};

static void idx_build(struct idx_src *s, int n_entries, uint64_t seed) {
  const size_t eb = op_mxfp4_bytes(IDX_W, IDX_BLOCK);
  s->kv = (struct op_kv_view){.page_entries = PAGE, .entry_bytes = eb, .n_entries = n_entries, .ratio = 1,
                              .idx_w = IDX_W,
                              .idx_fmt = op_kv_mxfp4_format(IDX_BLOCK, OP_MX_CEIL, OP_NIBBLE_EVEN_LOW)};
  float x[IDX_W];
  for (int p = 0; p * PAGE < n_entries; p++) {
    s->pages[p] = calloc(PAGE, eb);
    for (int e = 0; e < PAGE && p * PAGE + e < n_entries; e++) {
      h_fill(x, IDX_W, &seed, -4, 4);
      op_mxfp4_pack(s->pages[p] + (size_t)e * eb, x, IDX_W, IDX_BLOCK, OP_MX_CEIL, OP_NIBBLE_EVEN_LOW);
    }
  }
  s->kv.pages = (const uint8_t *const *)s->pages;
}

struct idx_out {
  float scores[400];
  int32_t topk[4 * 24], pool[4 * 6], re[4 * 24];
};

static void idx_run(const struct idx_src *s, struct idx_out *out, int heads, uint64_t seed) {
  enum { S = 4, K = 24, BLOCK = 8, TOP = 6 };
  float q[S * 7 * IDX_W], w[S * 7];
  int64_t pos[S] = {150, 260, 300, 399};
  h_fill(q, (size_t)S * heads * IDX_W, &seed, -1, 1);
  h_fill(w, (size_t)S * heads, &seed, -1, 1);
  memset(out, 0, sizeof *out);
  op_indexer_score(out->scores, q, w, &s->kv, 399, heads);
  size_t wb = op_indexer_topk_work_bytes(&s->kv, pos, S, BLOCK);
  size_t rb = op_indexer_reindex_work_bytes(&s->kv, BLOCK, TOP);
  void *work = malloc(wb > rb ? wb : rb);
  op_indexer_topk(out->topk, out->pool, work, q, w, pos, &s->kv, S, heads, K, BLOCK, TOP, true);
  op_indexer_reindex(out->re, work, out->pool, q, w, pos, &s->kv, S, heads, K, BLOCK, TOP);
  free(work);
}

static void check_indexer(const enum op_isa *levels, int n_levels) {
  struct idx_src s = {0};
  idx_build(&s, 400, 99);
  static struct idx_out ref, got;
  for (int heads = 1; heads <= 7; heads += 3) { /* 1, 4, 7: one head, a full HBLK, a partial one */
    op_isa_force(OP_ISA_DEFAULT);
    idx_run(&s, &ref, heads, 7 + heads);
    EXPECT(h_finite(ref.scores, 400, "indexer reference scores"), "heads %d", heads);
    for (int l = 0; l < n_levels; l++) {
      op_isa_force(levels[l]);
      idx_run(&s, &got, heads, 7 + heads);
      EXPECT(!memcmp(&got, &ref, sizeof got), "indexer heads %d: level %s differs from default (scores %s)", heads,
             op_isa_name(levels[l]), memcmp(got.scores, ref.scores, sizeof got.scores) ? "differ" : "equal");
    }
  }
  for (int p = 0; p < 32; p++) free(s.pages[p]);
}

/* ---- packers ---------------------------------------------------------------- */

enum { PW = 512, PROWS = 24 };

/* Rows of PW values: mixed magnitudes, with zeros, -0, subnormals, huge
 * values, and one NaN or Inf in some blocks. */
static void pack_rows(float *x, uint64_t seed) {
  h_fill(x, (size_t)PW * PROWS, &seed, -50, 50);
  for (int i = 0; i < PW * PROWS; i++) {
    double u = h_uniform(&seed);
    if (u < 0.05) x[i] = 0.0f;
    else if (u < 0.08) x[i] = -0.0f;
    else if (u < 0.12) x[i] *= 1e-40f; /* subnormal */
    else if (u < 0.14) x[i] *= 1e30f;
  }
  x[3 * PW + 17] = NAN, x[7 * PW + 200] = INFINITY, x[11 * PW + 33] = -INFINITY;
  for (int i = 0; i < 32; i++) x[13 * PW + i] = 0.0f; /* an all-zero block */
}

/* Every packer's bytes over the rows, for one format setting, appended to out. */
static size_t pack_all(uint8_t *out, const float *x) {
  size_t o = 0;
  for (int r = 0; r < PROWS; r++, o += op_fp4_bytes(PW, 16))
    op_fp4_pack(out + o, x + (size_t)r * PW, PW, 16, r % 2 ? OP_NIBBLE_EVEN_HIGH : OP_NIBBLE_EVEN_LOW);
  for (int r = 0; r < PROWS; r++, o += op_fp4_bytes(PW, 64)) op_fp4_pack(out + o, x + (size_t)r * PW, PW, 64, 0);
  for (int r = 0; r < PROWS; r++, o += op_mxfp4_bytes(PW, 32))
    op_mxfp4_pack(out + o, x + (size_t)r * PW, PW, 32, r % 2 ? OP_MX_OCP : OP_MX_CEIL, OP_NIBBLE_EVEN_LOW);
  for (int r = 0; r < PROWS; r++, o += op_mxfp4_bytes(PW, 128))
    op_mxfp4_pack(out + o, x + (size_t)r * PW, PW, 128, OP_MX_CEIL, OP_NIBBLE_EVEN_HIGH);
  for (int r = 0; r < PROWS; r++, o += op_fp8_bytes(PW, PW, OP_SCALE_FP32))
    op_fp8_pack(out + o, x + (size_t)r * PW, PW, PW, OP_SCALE_FP32);
  for (int r = 0; r < PROWS; r++, o += op_fp8_bytes(PW, 32, OP_SCALE_E8M0))
    op_fp8_pack(out + o, x + (size_t)r * PW, PW, 32, OP_SCALE_E8M0);
  return o;
}

static void check_packers(const enum op_isa *levels, int n_levels) {
  float *x = malloc((size_t)PW * PROWS * sizeof *x);
  const size_t cap = (size_t)PROWS * 6 * (PW + 64);
  uint8_t *ref = calloc(cap, 1), *got = calloc(cap, 1);
  pack_rows(x, 4242);
  op_isa_force(OP_ISA_DEFAULT);
  size_t n = pack_all(ref, x);
  CEDAR_ASSERT(n <= cap);
  for (int l = 0; l < n_levels; l++) {
    op_isa_force(levels[l]);
    memset(got, 0xA5, cap);
    pack_all(got, x);
    size_t first = 0;
    while (first < n && got[first] == ref[first]) first++;
    EXPECT(first == n, "packers: level %s differs from default at byte %zu of %zu", op_isa_name(levels[l]), first, n);
  }
  free(x), free(ref), free(got);
}

/* ---- mHC ------------------------------------------------------------------- */

/* Random inputs of one mHC case: the state and its coefficients, m = (2 + hc) hc rows of
 * W, statistics scaled so that rsqrt(mean) is near 1 and the Sinkhorn logits stay within
 * a few units. */
struct mhc_case {
  int n, hc, d, m;
  float *X, *C, *post, *F, *pre, *W, *dots, *sumsq, scale[3], *base;
};

static void mhc_make(struct mhc_case *k, int n, int hc, int d, uint64_t seed) {
  const size_t xs = (size_t)n * hc * d;
  *k = (struct mhc_case){.n = n, .hc = hc, .d = d, .m = op_mhc_rows(hc)};
  k->X = malloc(xs * sizeof *k->X), k->C = malloc((size_t)n * hc * hc * sizeof *k->C);
  k->post = malloc((size_t)n * hc * sizeof *k->post), k->pre = malloc((size_t)n * hc * sizeof *k->pre);
  k->F = malloc((size_t)n * d * sizeof *k->F), k->W = malloc((size_t)k->m * hc * d * sizeof *k->W);
  k->dots = malloc((size_t)n * k->m * sizeof *k->dots), k->sumsq = malloc((size_t)n * sizeof *k->sumsq);
  k->base = malloc((size_t)k->m * sizeof *k->base);
  h_fill(k->X, xs, &seed, -3, 3);
  h_fill(k->C, (size_t)n * hc * hc, &seed, 0, 1);
  h_fill(k->post, (size_t)n * hc, &seed, 0, 2);
  h_fill(k->pre, (size_t)n * hc, &seed, 0, 1);
  h_fill(k->F, (size_t)n * d, &seed, -3, 3);
  h_fill(k->W, (size_t)k->m * hc * d, &seed, -1, 1);
  h_fill(k->dots, (size_t)n * k->m, &seed, -5, 5);
  h_fill(k->sumsq, (size_t)n, &seed, 0.1f * hc * d, 4.0f * hc * d);
  h_fill(k->scale, 3, &seed, 0.5f, 2);
  h_fill(k->base, (size_t)k->m, &seed, -1, 1);
}

static void mhc_free(struct mhc_case *k) {
  free(k->X), free(k->C), free(k->post), free(k->pre), free(k->F), free(k->W), free(k->dots), free(k->sumsq);
  free(k->base);
}

/* Floats of every output of mhc_run for case k. */
static size_t mhc_out_len(const struct mhc_case *k) {
  const size_t n = k->n, xs = n * k->hc * k->d, us = n * k->d;
  return n * (2 + k->hc) * k->hc + us + 2 * xs + n + (xs + us + n * k->m + n) + (us + n * k->hc);
}

static const char *const mhc_parts[] = {"coeffs_from_stats", "mix", "update", "update_inplace", "stats sumsq",
                                        "update_mix_fused", "merge"};
enum { MHC_PARTS = sizeof mhc_parts / sizeof *mhc_parts };

/* Every mHC entry point on case k at the current level, outputs one after another in out;
 * at[p] is where part p starts. Returns the floats written. */
static size_t mhc_run(const struct mhc_case *k, float *out, size_t *at) {
  const int n = k->n, hc = k->hc, d = k->d, m = k->m;
  const size_t xs = (size_t)n * hc * d, us = (size_t)n * d;
  const struct op_mhc_cfg c = {.hc = hc, .hidden = d, .sinkhorn_iters = 20, .hc_eps = 1e-6f, .norm_eps = 1e-6f};
  float *o = out, *dots = malloc((size_t)n * m * sizeof *dots);
  at[0] = 0;
  op_mhc_coeffs_from_stats(o, o + n * hc, o + 2 * n * hc, k->dots, k->sumsq, k->scale, k->base, n, &c);
  o += (size_t)n * (2 + hc) * hc, at[1] = o - out;
  op_mhc_mix(o, k->X, k->pre, n, hc, d);
  o += us, at[2] = o - out;
  op_mhc_update(o, k->X, k->C, k->post, k->F, n, hc, d);
  o += xs, at[3] = o - out;
  memcpy(o, k->X, xs * sizeof *o);
  op_mhc_update_inplace(o, k->C, k->post, k->F, n, hc, d);
  o += xs, at[4] = o - out;
  op_mhc_stats(dots, o, k->X, k->W, n, m, hc, d); /* the dots are OpenBLAS's: not compared */
  o += n, at[5] = o - out;
  op_mhc_update_mix_fused(o, o + xs, o + xs + us, o + xs + us + (size_t)n * m, k->X, k->C, k->post, k->F, k->pre, k->W,
                          n, m, hc, d);
  o += xs + us + (size_t)n * m + n, at[6] = o - out;
  op_mhc_merge(o, o + us, k->X, k->W, k->scale[0], k->base, n, &c);
  free(dots);
  return (size_t)(o - out) + us + (size_t)n * hc;
}

static void check_mhc(const enum op_isa *levels, int n_levels) {
  static const int ns[] = {1, 5, 17, 33}, hcs[] = {4, 3}, ds[] = {256, 7, 300};
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 2; b++)
      for (int e = 0; e < 3; e++) {
        struct mhc_case k;
        mhc_make(&k, ns[a], hcs[b], ds[e], 0x5eed + 97 * a + 13 * b + e);
        const size_t len = mhc_out_len(&k);
        float *ref = malloc(len * sizeof *ref), *got = malloc(len * sizeof *got);
        size_t at[MHC_PARTS];
        op_isa_force(OP_ISA_DEFAULT);
        CEDAR_ASSERT(mhc_run(&k, ref, at) == len);
        EXPECT(h_finite(ref, len, "mhc reference"), "n %d hc %d d %d", k.n, k.hc, k.d);
        for (int l = 0; l < n_levels; l++) {
          op_isa_force(levels[l]);
          memset(got, 0xA5, len * sizeof *got);
          mhc_run(&k, got, at);
          size_t i = 0, p = 0;
          while (i < len && !memcmp(got + i, ref + i, sizeof *got)) i++;
          while (p + 1 < MHC_PARTS && at[p + 1] <= i) p++;
          EXPECT(i == len, "mhc n %d hc %d d %d: level %s differs from default in %s", k.n, k.hc, k.d,
                 op_isa_name(levels[l]), mhc_parts[p]);
        }
        free(ref), free(got);
        mhc_free(&k);
      }
}

/* ---- op_linear: levels and row invariance -------------------------------- */

static void check_linear(const enum op_isa *levels, int n_levels) {
  static const int ins[] = {1, 15, 16, 17, 256, 300}, outs[] = {1, 7, 8, 9, 33};
  static const int ns[] = {1, 2, 3, 4, 5, 7, 9, 33};
  enum { NMAX = 33, PAD = 3 };
  uint64_t seed = 0x11ea;
  for (size_t a = 0; a < sizeof ins / sizeof *ins; a++)
    for (size_t b = 0; b < sizeof outs / sizeof *outs; b++) {
      int in = ins[a], out = outs[b], ldx = in + PAD, ldy = out + PAD;
      float *x = malloc((size_t)NMAX * ldx * sizeof *x), *W = malloc((size_t)out * in * sizeof *W);
      float *ref = malloc((size_t)NMAX * out * sizeof *ref), *y = malloc((size_t)NMAX * ldy * sizeof *y);
      h_fill(x, (size_t)NMAX * ldx, &seed, -1, 1);
      h_fill(W, (size_t)out * in, &seed, -1, 1);
      op_isa_force(OP_ISA_DEFAULT);
      for (int i = 0; i < NMAX; i++) op_linear(ref + (size_t)i * out, x + (size_t)i * ldx, W, 1, in, out, ldx, out);
      EXPECT(h_finite(ref, (size_t)NMAX * out, "linear reference"), "in %d out %d", in, out);
      for (int l = 0; l < n_levels; l++) {
        op_isa_force(levels[l]);
        for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
          int n = ns[c], bad = -1;
          for (int i0 = 0; i0 + n <= NMAX; i0 += n) {
            op_linear(y, x + (size_t)i0 * ldx, W, n, in, out, ldx, ldy);
            for (int i = 0; i < n && bad < 0; i++)
              if (memcmp(y + (size_t)i * ldy, ref + (size_t)(i0 + i) * out, (size_t)out * sizeof *y)) bad = i0 + i;
          }
          EXPECT(bad < 0, "linear in %d out %d: level %s, row %d of calls with n %d differs from the row alone at the default level",
                 in, out, op_isa_name(levels[l]), bad, n);
        }
      }
      op_isa_force(OP_ISA_DEFAULT);
      free(x), free(W), free(ref), free(y);
    }
}

int main(void) {
  enum op_isa levels[OP_ISA_COUNT];
  int n = 0;
  for (int i = 0; i < OP_ISA_COUNT; i++)
    if (op_isa_supported((enum op_isa)i)) levels[n++] = (enum op_isa)i;
  printf("levels on this CPU:");
  for (int i = 0; i < n; i++) printf(" %s", op_isa_name(levels[i]));
  printf("%s\n", n == 1 ? " (only the default level: it is checked against itself)" : "");
  EXPECT(!op_isa_force((enum op_isa)OP_ISA_COUNT), "an unknown level must be refused");
  for (int i = 0; i < OP_ISA_COUNT; i++)
    if (!op_isa_supported((enum op_isa)i))
      EXPECT(!op_isa_force((enum op_isa)i), "level %s is not supported here: force must refuse it",
             op_isa_name((enum op_isa)i));
  check_attention(levels, n);
  check_indexer(levels, n);
  check_packers(levels, n);
  check_mhc(levels, n);
  check_linear(levels, n);
  return h_report("test_ops_isa");
}
