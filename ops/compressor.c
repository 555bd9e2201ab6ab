/* compressor.c: KV-source compressor, tail and global entry emission (see
 * compressor.h for the math, the tail contract and what is bitwise).
 *
 * Arithmetic order, fixed so that a group's entry depends only on its r
 * projected (v, g) rows and never on the call that completed it:
 *   pooling, per channel c: m = max_i g_i[c] (slots in position order);
 *     s = sum_i e_i, acc = sum_i e_i v_i[c] with e_i = expf(g_i[c] - m),
 *     accumulated slot by slot in position order; c_hat[c] = acc / s;
 *     ratio 1 copies v (the softmax over one slot is exactly 1: SPEC 3.7);
 *   then op_rmsnorm on one row, op_linear on one row for kI (a 1-row GEMM
 *   has one code path whatever the call), op_rope_apply on one row, and the
 *   packers of ops/formats.h.
 *
 * Test: tests/test_ops_compressor.c (ctest -R ops_compressor).
 */
#include "ops/compressor.h"

#include <math.h>
#include <string.h>

#include "ops/basic.h"
#include "runtime/check.h"

size_t op_comp_tail_floats(int ratio, int d) { return ratio > 1 ? 2 * (size_t)(ratio - 1) * (size_t)d : 0; }

int op_comp_tail_init(struct op_comp_tail *t, float *buf, int ratio, int d, int64_t start) {
  CEDAR_ASSERT(ratio >= 1 && d > 0);
  CEDAR_ASSERT(ratio == 1 || buf != NULL);
  if (start < 0 || start % ratio != 0) return -1;
  t->ratio = ratio;
  t->d = d;
  t->count = 0;
  t->pos0 = start;
  t->v = ratio > 1 ? buf : NULL;
  t->g = ratio > 1 ? buf + (size_t)(ratio - 1) * d : NULL;
  return 0;
}

size_t op_comp_work_floats(int d, int idx_dim) { return 2 * (size_t)d + (size_t)idx_dim; }

size_t op_comp_scratch_floats(int n, int ratio, int d, int idx_dim) {
  return (size_t)n * (size_t)d * (ratio > 1 ? 2 : 1) + op_comp_work_floats(d, idx_dim);
}

void op_comp_project(float *v, float *g, const float *u, int n, const struct op_comp_layer *L) {
  op_linear(v, u, L->W_kv, n, L->hidden, L->d, L->hidden, L->d);
  if (L->ratio > 1) op_linear(g, u, L->W_gate, n, L->hidden, L->d, L->hidden, L->d);
}

/* Row k of a group whose first nt rows sit in (tv, tg) and the rest in
 * (nv, ng): the tail's pending rows come before the call's new rows. */
static const float *group_row(const float *t, const float *nw, int nt, int k, int d) {
  return k < nt ? t + (size_t)k * d : nw + (size_t)(k - nt) * d;
}

/* c_hat = per-channel softmax(g)-weighted sum of v over the r slots (SPEC
 * 3.7), in the order the file header fixes. */
static void pool_group(float *c_hat /* (d) */, const float *tv, const float *tg, int nt, const float *nv,
                       const float *ng, int r, int d) {
  if (r == 1) {
    memcpy(c_hat, group_row(tv, nv, nt, 0, d), (size_t)d * sizeof *c_hat);
    return;
  }
  for (int c = 0; c < d; c++) {
    float m = group_row(tg, ng, nt, 0, d)[c];
    for (int k = 1; k < r; k++) m = fmaxf(m, group_row(tg, ng, nt, k, d)[c]);
    float s = 0.0f, acc = 0.0f;
    for (int k = 0; k < r; k++) {
      float e = expf(group_row(tg, ng, nt, k, d)[c] - m);
      s += e;
      acc += e * group_row(tv, nv, nt, k, d)[c];
    }
    c_hat[c] = acc / s;
  }
}

/* Turn work[0, d) = c_hat of the group at `pos` into entry e of `out` (SPEC
 * 3.7 norm, 3.8): c, kI from c before RoPE, kM = RoPE(c), then pack. */
static void emit_entry(const struct op_comp_out *out, int e, float *work, int64_t pos, const struct op_comp_layer *L) {
  const int d = L->d, di = L->idx_dim;
  float *c = work, *kM = work + d, *kI = work + 2 * d;
  op_rmsnorm(c, c, L->gamma, 1, d, L->eps);

  op_linear(kI, c, L->W_ik, 1, d, di, d, di);
  if (L->k_norm) op_rmsnorm(kI, kI, L->k_gamma, 1, di, L->eps);
  op_rope_apply(kI, L->rope_i, &pos, 1, 1, di, +1);

  memcpy(kM, c, (size_t)d * sizeof *kM);
  op_rope_apply(kM, L->rope, &pos, 1, 1, d, +1);

  uint8_t *entry = out->entries + (size_t)e * out->entry_bytes;
  op_fp4_pack(entry + out->main_off, kM, d, L->main_block, L->nibble);
  op_mxfp4_pack(entry + out->idx_off, kI, di, L->idx_block, L->mx, L->nibble);

  if (out->pos) out->pos[e] = pos;
  if (out->c) memcpy(out->c + (size_t)e * d, c, (size_t)d * sizeof *c);
  if (out->kM) memcpy(out->kM + (size_t)e * d, kM, (size_t)d * sizeof *kM);
  if (out->kI) memcpy(out->kI + (size_t)e * di, kI, (size_t)di * sizeof *kI);
}

/* The dimension checks shared by push and compress (internal invariants:
 * a mismatch is a caller bug, not user input). */
static void check_layer(const struct op_comp_out *out, const struct op_comp_tail *tail,
                        const struct op_comp_layer *L) {
  CEDAR_ASSERT(L->ratio >= 1 && L->ratio == tail->ratio && L->d == tail->d);
  CEDAR_ASSERT(L->rope->dim == L->d && L->rope_i->dim == L->idx_dim);
  if (!out) return;
  size_t mb = op_fp4_bytes(L->d, L->main_block), ib = op_mxfp4_bytes(L->idx_dim, L->idx_block);
  CEDAR_ASSERT_MSG(mb > 0 && ib > 0, "compressor: d %d / block %d or idx_dim %d / block %d", L->d, L->main_block,
                   L->idx_dim, L->idx_block);
  CEDAR_ASSERT_MSG(out->main_off + mb <= out->entry_bytes && out->idx_off + ib <= out->entry_bytes &&
                       (out->main_off + mb <= out->idx_off || out->idx_off + ib <= out->main_off),
                   "compressor: parts [%zu,+%zu) and [%zu,+%zu) do not fit apart in %zu-byte entries", out->main_off,
                   mb, out->idx_off, ib, out->entry_bytes);
}

/* 0 when a call of n rows at position a may run: it continues the tail and
 * its entries fit in out. */
static int check_call(const struct op_comp_out *out, const struct op_comp_tail *tail, int64_t a, int n) {
  CEDAR_ASSERT(n >= 0);
  if (a != tail->pos0 + tail->count) return -1;
  if (op_comp_n_emit(tail, n) > (out ? out->max_entries : 0)) return -1;
  return 0;
}

int op_comp_push(const struct op_comp_out *out, struct op_comp_tail *tail, float *work, const float *v,
                 const float *g, int64_t a, int n, const struct op_comp_layer *L) {
  check_layer(out, tail, L);
  if (check_call(out, tail, a, n) != 0) return -1;
  const int r = L->ratio, d = L->d, t = tail->count;
  CEDAR_ASSERT(r == 1 || g != NULL || n == 0);
  const int n_emit = op_comp_n_emit(tail, n);

  /* Group e covers rows [e r, e r + r) of (tail rows, then new rows). */
  for (int e = 0; e < n_emit; e++) {
    int first = e * r;                                   /* index of its first row */
    int nt = first < t ? t - first : 0;                  /* rows of it still in the tail (e == 0 only) */
    const float *nv = v + (size_t)(first + nt - t) * d;  /* its first new row */
    const float *ng = r > 1 ? g + (size_t)(first + nt - t) * d : NULL;
    pool_group(work, tail->v, tail->g, nt, nv, ng, r, d);
    emit_entry(out, e, work, tail->pos0 + first, L);
  }

  /* What is left (fewer than r rows) becomes the tail. With no entry emitted,
   * the new rows join the pending ones; otherwise the rest are all new rows. */
  int rem = t + n - n_emit * r;
  int dst = n_emit == 0 ? t : 0, moved = rem - dst, src = n - moved;
  if (moved > 0) {
    memcpy(tail->v + (size_t)dst * d, v + (size_t)src * d, (size_t)moved * d * sizeof *v);
    memcpy(tail->g + (size_t)dst * d, g + (size_t)src * d, (size_t)moved * d * sizeof *g);
  }
  tail->pos0 += (int64_t)n_emit * r;
  tail->count = rem;
  return n_emit;
}

int op_compress(const struct op_comp_out *out, struct op_comp_tail *tail, float *scratch, const float *u, int64_t a,
                int n, const struct op_comp_layer *L) {
  check_layer(out, tail, L);
  if (check_call(out, tail, a, n) != 0) return -1;
  const size_t rows = (size_t)n * L->d;
  float *v = scratch, *g = L->ratio > 1 ? scratch + rows : NULL;
  float *work = scratch + rows * (L->ratio > 1 ? 2 : 1);
  op_comp_project(v, g, u, n, L);
  return op_comp_push(out, tail, work, v, g, a, n, L);
}
