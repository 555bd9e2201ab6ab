/* mhc.c: mHC coefficients, Sinkhorn, mix, update, the fused single pass and the head
 * merge (see mhc.h for the math and the decisions).
 *
 * The per-element loops over positions (mix_rows, update_rows, update_inplace_rows,
 * sumsq_rows, fused_pass and coeffs_rows, the Sinkhorn lanes) are compiled for SSE2, AVX2
 * and AVX-512 from one body each (ops/isa.h): their lanes are independent and keep the
 * order the C says, so every level gives the same bits. fused_pass takes 6 rows of W per
 * pass over x above SSE2 and 3 at it (see GROUP), which changes no sum's order. */
#include "ops/mhc.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/isa.h"
#include "ops/num_sinkhorn.h"
#include "ops/registry.h"
#include "base/check.h"

/* ---- per-element passes --------------------------------------------------------------- */

/* The per-element expressions, shared by the plain and the fused paths so that both give
 * the same bits (the build is ISO C11: no floating-point contraction into FMA). x points at
 * stream 0 of one position, at the tile's first column; streams are d apart. Each element
 * follows the scalar formula's roundings: stream 0's product, then streams 1..hc-1 added
 * in order (then post[j] F). The column loop is the outer one and the streams are unrolled
 * (hc is a constant where the hot calls below inline these), so every column's values stay
 * in registers and the column loop vectorizes. */
static inline OP_ISA_BODY void mix_cols(float *restrict u, const float *restrict x, const float *restrict pre, int hc,
                                        size_t d, int len) {
  for (int k = 0; k < len; k++) {
    float s = pre[0] * x[k];
    for (int i = 1; i < hc; i++) s += pre[i] * x[i * d + k];
    u[k] = s;
  }
}

/* X'_j[k] = sum_i C[i][j] X_i[k] + post[j] F[k]. */
static inline OP_ISA_BODY void update_cols(float *restrict xn, const float *restrict x, const float *restrict C,
                                           const float *restrict post, const float *restrict f, int hc, size_t dn,
                                           size_t dx, int len) {
  for (int k = 0; k < len; k++)
    for (int j = 0; j < hc; j++) {
      float y = C[j] * x[k];
      for (int i = 1; i < hc; i++) y += C[i * hc + j] * x[i * dx + k];
      xn[j * dn + k] = y + post[j] * f[k];
    }
}

/* hc = 4 [A] gets its own unrolled copy; other widths run the same expressions in loops. */
static inline OP_ISA_BODY void mix_tile(float *u, const float *x, const float *pre, int hc, size_t d, int len) {
  if (hc == 4)
    mix_cols(u, x, pre, 4, d, len);
  else
    mix_cols(u, x, pre, hc, d, len);
}

static inline OP_ISA_BODY void update_tile(float *xn, size_t dn, const float *x, size_t dx, const float *C,
                                            const float *post, const float *f, int hc, int len) {
  if (hc == 4)
    update_cols(xn, x, C, post, f, 4, dn, dx, len);
  else
    update_cols(xn, x, C, post, f, hc, dn, dx, len);
}

/* ---- statistics in the fixed order of mhc.h ------------------------------------------- */

/* Rows of W that share each load of x: GROUP at AVX2 and AVX-512, where a row's 16 lanes
 * are one or two vectors and 6 rows keep enough adds in flight; GROUP_SSE2 at the default
 * level, whose 16 registers hold 3 rows of 4 vectors (6 rows spill: slower). UNROLL steps
 * of a lane run in a register between one load and one store of its accumulator. Neither
 * changes any sum's order. */
enum { LANES = OP_MHC_LANES, GROUP = 6, GROUP_SSE2 = 3, UNROLL = 4 };

/* acc[r][l] += w_r[c] x[c] for the columns c = l, l + LANES, l + 2 LANES, ... < len of one
 * stream, in that order, for the nr rows w_r = w + r ws (nr <= GROUP is a constant where
 * this inlines). The lane loop is the one that vectorizes, as in the indexer's head_dots;
 * each x value is read once for all nr rows (written so, the 6-row copy vectorizes too). */
static inline OP_ISA_BODY void seg_dots(float (*restrict acc)[LANES], int nr, const float *restrict w, size_t ws,
                                        const float *restrict x, int len) {
  int k = 0;
  for (; k + UNROLL * LANES <= len; k += UNROLL * LANES)
    for (int l = 0; l < LANES; l++) {
      float a[GROUP];
      for (int r = 0; r < nr; r++) a[r] = acc[r][l];
      for (int s = 0; s < UNROLL; s++) {
        const float xs = x[k + s * LANES + l];
        for (int r = 0; r < nr; r++) a[r] += w[r * ws + k + s * LANES + l] * xs;
      }
      for (int r = 0; r < nr; r++) acc[r][l] = a[r];
    }
  for (; k < len; k += LANES) /* the last columns: up to UNROLL - 1 whole steps and a short one */
    for (int r = 0; r < nr; r++)
      for (int l = 0; l < LANES && k + l < len; l++) acc[r][l] += w[r * ws + k + l] * x[k + l];
}

/* out[r] += lane 0 + lane 1 + ... + lane LANES - 1 of acc[r], for nr rows. */
static inline OP_ISA_BODY void add_lanes(float *out, float (*acc)[LANES], int nr) {
  for (int r = 0; r < nr; r++) {
    float p = acc[r][0];
    for (int l = 1; l < LANES; l++) p += acc[r][l];
    out[r] += p;
  }
}

/* *total += the sum of squares of one position's tile (x at its first column). */
static inline OP_ISA_BODY void tile_sumsq(float *total, const float *x, int hc, size_t d, int len) {
  float acc[1][LANES] = {{0}};
  for (int j = 0; j < hc; j++) seg_dots(acc, 1, x + j * d, 0, x + j * d, len);
  add_lanes(total, acc, 1);
}

/* Positions go in blocks of BLOCK and, inside a block, tile by tile. Within a tile, W's
 * rows go a group at a time, copied first into a packed buffer (group hc OP_MHC_TILE
 * values, 12 or 24 KiB for hc = 4, 64-byte aligned so that 16 lanes are one aligned
 * AVX-512 load): W's rows and streams lie hc d and d floats apart, a multiple of 4 KiB at
 * real widths, so unpacked they would fall into the same few L1 sets and not stay there
 * while the block's positions use them (blocks of fewer than PACK_MIN positions read W in
 * place). Every sum keeps its order for any blocking, packing, n or position. */
enum { BLOCK = 16, PACK_MIN = 4 };

static inline OP_ISA_BODY int tile_len(int d, int k0) { return d - k0 < OP_MHC_TILE ? d - k0 : OP_MHC_TILE; }

/* Add the statistics of one tile of nb positions (x at the first position's tile, the
 * positions width apart) to their totals: dots (nb, m) and sumsq (nb). W at row 0 and the
 * tile's first column; group: GROUP or GROUP_SSE2 rows per pass; wp: group hc OP_MHC_TILE
 * floats of scratch, or NULL not to pack (when few positions would share the packed rows). */
static inline OP_ISA_BODY void tile_stats(float *dots, float *sumsq, const float *W, const float *x, float *wp,
                                           int nb, int m, int hc, size_t d, int len, int group) {
  const size_t width = (size_t)hc * d, rs = wp ? (size_t)hc * OP_MHC_TILE : width, js = wp ? OP_MHC_TILE : d;
  float acc[GROUP][LANES];
  for (int q = 0; q < m;) { /* group rows at a time, the last m % group one by one */
    const int nr = m - q >= group ? group : 1;
    const float *w = wp ? wp : W + q * width;
    for (int r = 0; wp && r < nr; r++)
      for (int j = 0; j < hc; j++) memcpy(wp + r * rs + j * js, W + (q + r) * width + j * d, len * sizeof *wp);
    for (int t = 0; t < nb; t++) {
      memset(acc, 0, sizeof acc);
      for (int j = 0; j < hc; j++) {
        const float *xj = x + t * width + j * d;
        if (nr == GROUP)
          seg_dots(acc, GROUP, w + j * js, rs, xj, len);
        else if (nr == GROUP_SSE2)
          seg_dots(acc, GROUP_SSE2, w + j * js, rs, xj, len);
        else
          seg_dots(acc, 1, w + j * js, 0, xj, len);
      }
      add_lanes(dots + (size_t)t * m + q, acc, nr);
    }
    q += nr;
  }
  for (int t = 0; t < nb; t++) tile_sumsq(sumsq + t, x + t * width, hc, d, len);
}

void op_mhc_expand(float *X, const float *h, int n, int hc, int d) {
  for (int t = 0; t < n; t++)
    for (int i = 0; i < hc; i++) memcpy(X + ((size_t)t * hc + i) * d, h + (size_t)t * d, (size_t)d * sizeof *X);
}

/* sumsq[t] = the sum of squares of state t, tile by tile in the fused pass's order. */
static inline OP_ISA_BODY void sumsq_rows_body(float *sumsq, const float *X, int n, int hc, int d) {
  const size_t width = (size_t)hc * d;
  for (int t = 0; t < n; t++) {
    float total = 0.0f;
    for (int k0 = 0; k0 < d; k0 += OP_MHC_TILE)
      tile_sumsq(&total, X + t * width + k0, hc, (size_t)d, tile_len(d, k0));
    sumsq[t] = total;
  }
}
/* sumsq_rows: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(sumsq_rows, (float *sumsq, const float *X, int n, int hc, int d), (sumsq, X, n, hc, d))

/* The dots through op_linear (row-invariant, ops/basic.h), the sum of squares in the fused
 * pass's order. */
void op_mhc_stats(float *dots, float *sumsq, const float *X, const float *W, int n, int m, int hc, int d) {
  const size_t width = (size_t)hc * d;
  op_linear(dots, X, W, n, (int)width, m, (int)width, m);
  sumsq_rows(sumsq, X, n, hc, d);
}

/* ---- coefficients ---------------------------------------------------------------- */

/* The order of Appendix V #5, shared with the CUDA kernels (ops/num_sinkhorn.h). */
void op_mhc_sinkhorn(float *C, const float *logits, int hc, int iters, float eps) {
  op_hd_sinkhorn(C, 1, logits, 1, hc, iters, eps);
}

/* op_mhc_sinkhorn on SL positions at once, c[q][p] = entry q of position p's matrix: the
 * same operations in the same order for every entry (so the same bits), with the loop over
 * positions innermost so that the sums and divisions vectorize. SL = 16 fills an AVX-512
 * vector (a lane is one position, so the width does not change its bits). SQ: the largest
 * hc * hc kept on the stack (SQ SL floats, 4 KiB). */
enum { SL = 16, SQ = 64 };

/* Divide each line a of the matrices by its sum + eps: entries a * major + b * minor, b =
 * 0..hc-1 (columns: major 1, minor hc; rows: major hc, minor 1). */
static inline OP_ISA_BODY void norm_lanes(float (*c)[SL], int hc, float eps, int major, int minor) {
  for (int a = 0; a < hc; a++) {
    float s[SL];
    for (int p = 0; p < SL; p++) s[p] = 0.0f;
    for (int b = 0; b < hc; b++)
      for (int p = 0; p < SL; p++) s[p] += c[a * major + b * minor][p];
    for (int b = 0; b < hc; b++)
      for (int p = 0; p < SL; p++) c[a * major + b * minor][p] /= s[p] + eps;
  }
}

static inline OP_ISA_BODY void sinkhorn_lanes(float (*c)[SL], int hc, int iters, float eps) {
  for (int i = 0; i < hc; i++) { /* softmax over each row, + eps */
    float (*row)[SL] = c + i * hc, m[SL], s[SL];
    for (int p = 0; p < SL; p++) m[p] = row[0][p], s[p] = 0.0f;
    for (int j = 1; j < hc; j++)
      for (int p = 0; p < SL; p++) m[p] = row[j][p] > m[p] ? row[j][p] : m[p];
    for (int j = 0; j < hc; j++) {
      for (int p = 0; p < SL; p++) row[j][p] = expf(row[j][p] - m[p]);
      for (int p = 0; p < SL; p++) s[p] += row[j][p];
    }
    for (int j = 0; j < hc; j++)
      for (int p = 0; p < SL; p++) row[j][p] = row[j][p] / s[p] + eps;
  }
  norm_lanes(c, hc, eps, 1, hc);
  for (int it = 1; it < iters; it++) {
    norm_lanes(c, hc, eps, hc, 1);
    norm_lanes(c, hc, eps, 1, hc);
  }
}

/* pre and post of one position (unless pre is NULL), and its H_res logits into lane p of z. */
static inline OP_ISA_BODY void coeff_row(float *pre, float *post, float (*z)[SL], int p, const float *mx, float sumsq,
                                          const float *scale, const float *base, const struct op_mhc_cfg *c) {
  const int hc = c->hc;
  const float r = 1.0f / sqrtf(sumsq / ((float)hc * (float)c->hidden) + c->norm_eps);
  for (int i = 0; pre && i < hc; i++) {
    pre[i] = op_sigmoid(mx[i] * r * scale[0] + base[i]) + c->hc_eps;
    post[i] = 2.0f * op_sigmoid(mx[hc + i] * r * scale[1] + base[hc + i]);
  }
  for (int q = 0; q < hc * hc; q++) z[q][p] = mx[2 * hc + q] * r * scale[2] + base[2 * hc + q];
}

/* The coefficients of n positions, SL at a time; z: hc * hc lanes of scratch. */
static inline OP_ISA_BODY void coeffs_rows_body(float *pre, float *post, float *C, float (*z)[SL], const float *dots,
                                                const float *sumsq, const float *scale, const float *base, int n,
                                                const struct op_mhc_cfg *c) {
  const int hc = c->hc, M = op_mhc_rows(hc), q2 = hc * hc;
  for (int t0 = 0; t0 < n; t0 += SL) {
    const int nb = n - t0 < SL ? n - t0 : SL;
    const int lanes = nb == 1 ? 1 : SL; /* a lone position (decode) goes through op_mhc_sinkhorn */
    for (int p = 0; p < lanes; p++) { /* lanes past n repeat position t0; their C is dropped */
      const int t = t0 + (p < nb ? p : 0);
      coeff_row(p < nb ? pre + (size_t)t * hc : NULL, post + (size_t)t * hc, z, p, dots + (size_t)t * M, sumsq[t],
                scale, base, c);
    }
    if (nb > 1) sinkhorn_lanes(z, hc, c->sinkhorn_iters, c->hc_eps);
    for (int p = 0; p < nb; p++)
      for (int q = 0; q < q2; q++) C[(size_t)(t0 + p) * q2 + q] = z[q][p];
    if (nb == 1) op_mhc_sinkhorn(C + (size_t)t0 * q2, C + (size_t)t0 * q2, hc, c->sinkhorn_iters, c->hc_eps);
  }
}
/* coeffs_rows: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(coeffs_rows,
              (float *pre, float *post, float *C, float (*z)[SL], const float *dots, const float *sumsq,
               const float *scale, const float *base, int n, const struct op_mhc_cfg *c),
              (pre, post, C, z, dots, sumsq, scale, base, n, c))

void op_mhc_coeffs_from_stats(float *pre, float *post, float *C, const float *dots, const float *sumsq,
                              const float *scale, const float *base, int n, const struct op_mhc_cfg *c) {
  const int q2 = c->hc * c->hc;
  float zs[SQ][SL], (*z)[SL] = q2 <= SQ ? zs : cedar_xmalloc((size_t)q2 * sizeof *z);
  coeffs_rows(pre, post, C, z, dots, sumsq, scale, base, n, c);
  if (z != zs) free(z);
}

void op_mhc_coeffs(float *pre, float *post, float *C, float *dots, float *sumsq, const float *X, const float *W_fn,
                   const float *scale, const float *base, int n, const struct op_mhc_cfg *c) {
  op_mhc_stats(dots, sumsq, X, W_fn, n, op_mhc_rows(c->hc), c->hc, c->hidden);
  op_mhc_coeffs_from_stats(pre, post, C, dots, sumsq, scale, base, n, c);
}

/* ---- mix and update ------------------------------------------------------------------ */

static inline OP_ISA_BODY void mix_rows_body(float *u, const float *X, const float *pre, int n, int hc, int d) {
  for (int t = 0; t < n; t++)
    for (int k0 = 0; k0 < d; k0 += OP_MHC_TILE)
      mix_tile(u + (size_t)t * d + k0, X + (size_t)t * hc * d + k0, pre + (size_t)t * hc, hc, (size_t)d,
               tile_len(d, k0));
}
/* mix_rows: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(mix_rows, (float *u, const float *X, const float *pre, int n, int hc, int d), (u, X, pre, n, hc, d))

void op_mhc_mix(float *u, const float *X, const float *pre, int n, int hc, int d) { mix_rows(u, X, pre, n, hc, d); }

static inline OP_ISA_BODY void update_rows_body(float *Xn, const float *X, const float *C, const float *post,
                                                const float *F, int n, int hc, int d) {
  for (int t = 0; t < n; t++)
    for (int k0 = 0; k0 < d; k0 += OP_MHC_TILE) {
      size_t o = (size_t)t * hc * d + k0;
      update_tile(Xn + o, (size_t)d, X + o, (size_t)d, C + (size_t)t * hc * hc, post + (size_t)t * hc,
                  F + (size_t)t * d + k0, hc, tile_len(d, k0));
    }
}
/* update_rows: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(update_rows,
              (float *Xn, const float *X, const float *C, const float *post, const float *F, int n, int hc, int d),
              (Xn, X, C, post, F, n, hc, d))

void op_mhc_update(float *Xn, const float *X, const float *C, const float *post, const float *F, int n, int hc, int d) {
  update_rows(Xn, X, C, post, F, n, hc, d);
}

/* op_mhc_update over X itself; tile: hc OP_MHC_TILE floats of scratch. */
static inline OP_ISA_BODY void update_inplace_rows_body(float *X, float *tile, const float *C, const float *post,
                                                        const float *F, int n, int hc, int d) {
  for (int t = 0; t < n; t++)
    for (int k0 = 0; k0 < d; k0 += OP_MHC_TILE) {
      const size_t o = (size_t)t * hc * d + k0;
      const int len = tile_len(d, k0);
      for (int i = 0; i < hc; i++) memcpy(tile + (size_t)i * len, X + o + (size_t)i * d, (size_t)len * sizeof *tile);
      update_tile(X + o, (size_t)d, tile, (size_t)len, C + (size_t)t * hc * hc, post + (size_t)t * hc,
                  F + (size_t)t * d + k0, hc, len);
    }
}
/* update_inplace_rows: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(update_inplace_rows,
              (float *X, float *tile, const float *C, const float *post, const float *F, int n, int hc, int d),
              (X, tile, C, post, F, n, hc, d))

void op_mhc_update_inplace(float *X, const float *C, const float *post, const float *F, int n, int hc, int d) {
  float buf[8 * OP_MHC_TILE], *tile = hc <= 8 ? buf : cedar_xmalloc((size_t)hc * OP_MHC_TILE * sizeof *tile);
  update_inplace_rows(X, tile, C, post, F, n, hc, d);
  if (tile != buf) free(tile);
}

/* One pass: per block of positions and tile, write the tile of X' and mix u from it, then
 * add the tile's statistics while the block's tiles of X' are in cache. */
static inline OP_ISA_BODY void fused_pass_body(float *Xn, float *u_next, float *dots, float *sumsq, const float *X,
                                                const float *C, const float *post, const float *F,
                                                const float *pre_next, const float *W, float *wp, int n, int m, int hc,
                                                int d, int group) {
  const size_t width = (size_t)hc * d;
  for (int t0 = 0; t0 < n; t0 += BLOCK) {
    const int nb = n - t0 < BLOCK ? n - t0 : BLOCK;
    for (int k0 = 0; k0 < d; k0 += OP_MHC_TILE) {
      const int len = tile_len(d, k0);
      for (int t = t0; t < t0 + nb; t++) {
        const size_t o = t * width + k0;
        update_tile(Xn + o, (size_t)d, X + o, (size_t)d, C + (size_t)t * hc * hc, post + (size_t)t * hc,
                    F + (size_t)t * d + k0, hc, len);
        mix_tile(u_next + (size_t)t * d + k0, Xn + o, pre_next + (size_t)t * hc, hc, (size_t)d, len);
      }
      tile_stats(dots + (size_t)t0 * m, sumsq + t0, W + k0, Xn + t0 * width + k0, nb >= PACK_MIN ? wp : NULL, nb, m,
                 hc, (size_t)d, len, group);
    }
  }
}
/* fused_pass: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(fused_pass,
              (float *Xn, float *u_next, float *dots, float *sumsq, const float *X, const float *C, const float *post,
               const float *F, const float *pre_next, const float *W, float *wp, int n, int m, int hc, int d,
               int group),
              (Xn, u_next, dots, sumsq, X, C, post, F, pre_next, W, wp, n, m, hc, d, group))

void op_mhc_update_mix_fused(float *Xn, float *u_next, float *dots, float *sumsq, const float *X, const float *C,
                             const float *post, const float *F, const float *pre_next, const float *W, int n, int m,
                             int hc, int d) {
  const int group = OP_ISA_CLONES && op_isa() != OP_ISA_DEFAULT ? GROUP : GROUP_SSE2; /* rows per pass: see GROUP */
  float *wp = n >= PACK_MIN ? cedar_xaligned(64, (size_t)GROUP * hc * OP_MHC_TILE * sizeof *wp) : NULL;
  memset(dots, 0, (size_t)n * m * sizeof *dots);
  memset(sumsq, 0, (size_t)n * sizeof *sumsq);
  fused_pass(Xn, u_next, dots, sumsq, X, C, post, F, pre_next, W, wp, n, m, hc, d, group);
  free(wp);
}

/* ---- head merge -------------------------------------------------------------------- */

void op_mhc_merge(float *y, float *pre, const float *X, const float *W_fn, float scale, const float *base, int n,
                  const struct op_mhc_cfg *c) {
  const int hc = c->hc, d = c->hidden;
  const size_t width = (size_t)hc * d;
  op_linear(pre, X, W_fn, n, (int)width, hc, (int)width, hc); /* the dots, as op_mhc_stats; transformed below */
  for (int t = 0; t < n; t++) {
    float ss;
    sumsq_rows(&ss, X + t * width, 1, hc, d);
    float r = 1.0f / sqrtf(ss / (float)width + c->norm_eps), *p = pre + (size_t)t * hc;
    for (int i = 0; i < hc; i++) p[i] = op_sigmoid(p[i] * r * scale + base[i]) + c->hc_eps;
  }
  op_mhc_mix(y, X, pre, n, hc, d);
}

/* ---- registry descriptors (ops/registry.h) -------------------------------------------- */

/* Shape checks for the descriptors. (The same small helpers sit in each family file that
 * registers ops: registry.c offers none that format shapes.) */

/* The state X (n, hc, d): hc >= 1 streams of d >= 1 values, n and hc * d ints. */
static const struct op_tensor *mhc_state(const struct op_desc *self, struct op_io *io, int64_t *xd) {
  const struct op_tensor *X = op_io_in(self, io, "X", 3, xd);
  if (X && (xd[1] < 1 || xd[2] < 1 || xd[0] > INT_MAX || xd[1] > INT_MAX || xd[2] > INT_MAX ||
            xd[1] * xd[2] > INT_MAX)) {
    char b[192];
    op_io_fail(io, "%s: X is %s; it needs hc >= 1 streams of d >= 1 values, with n and hc * d at most %d",
               self->name, op_dims_str(b, sizeof b, xd, 3), INT_MAX);
    return NULL;
  }
  return X;
}

/* hc, d from X's shape; sinkhorn_iters (when the op has it, else 1), hc_eps, norm_eps. */
static bool mhc_config(const struct op_desc *self, struct op_io *io, const int64_t *xd, bool sinkhorn,
                       struct op_mhc_cfg *c) {
  int64_t iters = 1;
  if (sinkhorn && !op_io_param_int(self, io, "sinkhorn_iters", 1, 1000000, &iters)) return false;
  c->hc = (int)xd[1], c->hidden = (int)xd[2], c->sinkhorn_iters = (int)iters;
  return op_io_param_nonneg(self, io, "hc_eps", &c->hc_eps) && op_io_param_nonneg(self, io, "norm_eps", &c->norm_eps);
}

static int coeffs_prepare(const struct op_desc *self, struct op_io *io, struct op_mhc_call *k) {
  int64_t xd[3], wd[2], sd[1], bd[1];
  const struct op_tensor *X = mhc_state(self, io, xd), *W = NULL, *scale = NULL, *base = NULL;
  if (!X || !(W = op_io_in(self, io, "W_fn", 2, wd)) || !(scale = op_io_in(self, io, "scale", 1, sd)) ||
      !(base = op_io_in(self, io, "base", 1, bd)))
    return CEDAR_EINVAL;
  int64_t n = xd[0], hc = xd[1], M = (2 + hc) * hc;
  struct op_mhc_cfg c;
  if (!op_io_dims_match(io, self->name, "W_fn", wd, (int64_t[]){M, hc * xd[2]}, 2, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "scale", sd, (int64_t[]){3}, 1, "the three scales (pre, post, res)", NULL, 0) ||
      !op_io_dims_match(io, self->name, "base", bd, (int64_t[]){M}, 1, "W_fn", wd, 2) || !mhc_config(self, io, xd, true, &c))
    return CEDAR_EINVAL;
  float *pre = op_io_out(self, io, "pre", 2, (int64_t[]){n, hc});
  float *post = pre ? op_io_out(self, io, "post", 2, (int64_t[]){n, hc}) : NULL;
  float *C = post ? op_io_out(self, io, "C", 3, (int64_t[]){n, hc, hc}) : NULL;
  float *dots = C ? op_io_out(self, io, "dots", 2, (int64_t[]){n, M}) : NULL;
  float *sumsq = dots ? op_io_out(self, io, "sumsq", 1, (int64_t[]){n}) : NULL;
  if (!sumsq) return CEDAR_ENOMEM;
  *k = (struct op_mhc_call){.X = X->data, .W_fn = W->data, .scale = scale->data, .base = base->data, .pre = pre,
                            .post = post, .C = C, .dots = dots, .sumsq = sumsq, .n = (int)n, .cfg = c};
  return 0;
}

static int mix_prepare(const struct op_desc *self, struct op_io *io, struct op_mhc_call *k) {
  int64_t xd[3], pd[2];
  const struct op_tensor *X = mhc_state(self, io, xd), *pre = X ? op_io_in(self, io, "pre", 2, pd) : NULL;
  if (!pre || !op_io_dims_match(io, self->name, "pre", pd, (int64_t[]){xd[0], xd[1]}, 2, "X", xd, 3)) return CEDAR_EINVAL;
  float *u = op_io_out(self, io, "u", 2, (int64_t[]){xd[0], xd[2]});
  if (!u) return CEDAR_ENOMEM;
  *k = (struct op_mhc_call){.X = X->data, .pre_in = pre->data, .u = u, .n = (int)xd[0]};
  k->cfg.hc = (int)xd[1], k->cfg.hidden = (int)xd[2];
  return 0;
}

static int update_prepare(const struct op_desc *self, struct op_io *io, struct op_mhc_call *k) {
  int64_t xd[3], cd[3], pd[2], fd[2];
  const struct op_tensor *X = mhc_state(self, io, xd), *C = NULL, *post = NULL, *F = NULL;
  if (!X || !(C = op_io_in(self, io, "C", 3, cd)) || !(post = op_io_in(self, io, "post", 2, pd)) ||
      !(F = op_io_in(self, io, "F", 2, fd)))
    return CEDAR_EINVAL;
  int64_t n = xd[0], hc = xd[1], d = xd[2];
  if (!op_io_dims_match(io, self->name, "C", cd, (int64_t[]){n, hc, hc}, 3, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "post", pd, (int64_t[]){n, hc}, 2, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "F", fd, (int64_t[]){n, d}, 2, "X", xd, 3))
    return CEDAR_EINVAL;
  float *Xn = op_io_out(self, io, "X_next", 3, xd);
  if (!Xn) return CEDAR_ENOMEM;
  *k = (struct op_mhc_call){.X = X->data, .C_in = C->data, .post_in = post->data, .F = F->data, .X_next = Xn,
                            .n = (int)n};
  k->cfg.hc = (int)hc, k->cfg.hidden = (int)d;
  return 0;
}

static int merge_prepare(const struct op_desc *self, struct op_io *io, struct op_mhc_call *k) {
  int64_t xd[3], wd[2], sd[1], bd[1];
  const struct op_tensor *X = mhc_state(self, io, xd), *W = NULL, *scale = NULL, *base = NULL;
  if (!X || !(W = op_io_in(self, io, "W_fn", 2, wd)) || !(scale = op_io_in(self, io, "scale", 1, sd)) ||
      !(base = op_io_in(self, io, "base", 1, bd)))
    return CEDAR_EINVAL;
  int64_t n = xd[0], hc = xd[1];
  struct op_mhc_cfg c;
  if (!op_io_dims_match(io, self->name, "W_fn", wd, (int64_t[]){hc, hc * xd[2]}, 2, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "scale", sd, (int64_t[]){1}, 1, "the head's one scale", NULL, 0) ||
      !op_io_dims_match(io, self->name, "base", bd, (int64_t[]){hc}, 1, "X", xd, 3) || !mhc_config(self, io, xd, false, &c))
    return CEDAR_EINVAL;
  float *y = op_io_out(self, io, "y", 2, (int64_t[]){n, xd[2]});
  float *pre = y ? op_io_out(self, io, "pre", 2, (int64_t[]){n, hc}) : NULL;
  if (!pre) return CEDAR_ENOMEM;
  *k = (struct op_mhc_call){.X = X->data, .W_fn = W->data, .scale = scale->data, .base = base->data, .pre = pre,
                            .y = y, .n = (int)n, .cfg = c};
  return 0;
}

int op_mhc_prepare(const struct op_desc *self, struct op_io *io, enum op_mhc_kind kind, struct op_mhc_call *c) {
  memset(c, 0, sizeof *c);
  switch (kind) {
    case OP_MHC_COEFFS: return coeffs_prepare(self, io, c);
    case OP_MHC_MIX: return mix_prepare(self, io, c);
    case OP_MHC_UPDATE: return update_prepare(self, io, c);
    default: return merge_prepare(self, io, c);
  }
}

static int mhc_coeffs_run(const struct op_desc *self, struct op_io *io) {
  struct op_mhc_call c = {0};
  int rc = op_mhc_prepare(self, io, OP_MHC_COEFFS, &c);
  if (!rc) op_mhc_coeffs(c.pre, c.post, c.C, c.dots, c.sumsq, c.X, c.W_fn, c.scale, c.base, c.n, &c.cfg);
  return rc;
}

static int mhc_mix_run(const struct op_desc *self, struct op_io *io) {
  struct op_mhc_call c = {0};
  int rc = op_mhc_prepare(self, io, OP_MHC_MIX, &c);
  if (!rc) op_mhc_mix(c.u, c.X, c.pre_in, c.n, c.cfg.hc, c.cfg.hidden);
  return rc;
}

static int mhc_update_run(const struct op_desc *self, struct op_io *io) {
  struct op_mhc_call c = {0};
  int rc = op_mhc_prepare(self, io, OP_MHC_UPDATE, &c);
  if (!rc) op_mhc_update(c.X_next, c.X, c.C_in, c.post_in, c.F, c.n, c.cfg.hc, c.cfg.hidden);
  return rc;
}

static int mhc_merge_run(const struct op_desc *self, struct op_io *io) {
  struct op_mhc_call c = {0};
  int rc = op_mhc_prepare(self, io, OP_MHC_MERGE, &c);
  if (!rc) op_mhc_merge(c.y, c.pre, c.X, c.W_fn, c.scale[0], c.base, c.n, &c.cfg);
  return rc;
}

#define MHC_X_ARG {"X", OP_F32, "(n, hc, d)", "residual state: hc streams of d values per position"}
#define MHC_EPS_PARAMS                                                                                     \
  {"hc_eps", OP_PARAM_FLOAT, 1e-6, "hc_eps [R-cfg]"},                                                      \
  {"norm_eps", OP_PARAM_FLOAT, 1e-6, "eps in rsqrt(mean(xf^2) + eps) [R] (SPEC 1.1; R.1 reports 1e-20)"}

const struct op_desc op_desc_mhc_coeffs = {
    .name = "mhc_coeffs",
    .summary = "mHC coefficients pre, post and Sinkhorn C of each position's state (SPEC 3.14, R.7)",
    .inputs = (const struct op_arg[]){MHC_X_ARG,
                                      {"W_fn", OP_F32, "((2 + hc) * hc, hc * d)", "the sublayer's mHC projection"},
                                      {"scale", OP_F32, "(3)", "scales of the pre, post and res mixes"},
                                      {"base", OP_F32, "((2 + hc) * hc)", "biases of the mixes"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"pre", OP_F32, "(n, hc)", "input mix: sigmoid(.) + hc_eps"},
                                       {"post", OP_F32, "(n, hc)", "output gains: 2 sigmoid(.)"},
                                       {"C", OP_F32, "(n, hc, hc)", "H_res after Sinkhorn"},
                                       {"dots", OP_F32, "(n, (2 + hc) * hc)", "statistics: W_fn xf"},
                                       {"sumsq", OP_F32, "(n)", "statistics: sum of xf^2"},
                                       {0}},
    .params = (const struct op_param[]){{"sinkhorn_iters", OP_PARAM_INT, 20, "hc_sinkhorn_iters [R-cfg]"},
                                        MHC_EPS_PARAMS,
                                        {0}},
    .run = mhc_coeffs_run,
};

const struct op_desc op_desc_mhc_mix = {
    .name = "mhc_mix",
    .summary = "mHC input mix u = sum_i pre[i] X_i, before the sublayer's RMSNorm (SPEC 3.14, R.7)",
    .inputs = (const struct op_arg[]){MHC_X_ARG, {"pre", OP_F32, "(n, hc)", "input mix coefficients"}, {0}},
    .outputs = (const struct op_arg[]){{"u", OP_F32, "(n, d)", "sublayer input"}, {0}},
    .run = mhc_mix_run,
};

const struct op_desc op_desc_mhc_update = {
    .name = "mhc_update",
    .summary = "mHC state update X'_j = sum_i C[i][j] X_i + post[j] F (SPEC 3.14, R.7)",
    .inputs = (const struct op_arg[]){MHC_X_ARG,
                                      {"C", OP_F32, "(n, hc, hc)", "H_res (Sinkhorn output)"},
                                      {"post", OP_F32, "(n, hc)", "output gains"},
                                      {"F", OP_F32, "(n, d)", "the sublayer's output"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"X_next", OP_F32, "(n, hc, d)", "updated state"}, {0}},
    .run = mhc_update_run,
};

const struct op_desc op_desc_mhc_merge = {
    .name = "mhc_merge",
    .summary = "mHC head merge: y = sum_i pre[i] X_i with pre = sigmoid(.) + hc_eps, no Sinkhorn (R.7)",
    .inputs = (const struct op_arg[]){MHC_X_ARG,
                                      {"W_fn", OP_F32, "(hc, hc * d)", "the head's mHC projection"},
                                      {"scale", OP_F32, "(1)", "the head's scale"},
                                      {"base", OP_F32, "(hc)", "the head's biases"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"y", OP_F32, "(n, d)", "merged hidden state (before the final RMSNorm)"},
                                       {"pre", OP_F32, "(n, hc)", "merge coefficients"},
                                       {0}},
    .params = (const struct op_param[]){MHC_EPS_PARAMS, {0}},
    .run = mhc_merge_run,
};
