/* compressor.c: KV-source compressor, tail and global entry emission (see
 * compressor.h for the math, the tail contract and what is bitwise).
 *
 * Arithmetic order, fixed so that a group's entry depends only on its r
 * projected (v, g) rows and never on the call that completed it:
 *   pooling, per channel c: m = max_i g_i[c] (slots in position order);
 *     s = sum_i e_i, acc = sum_i e_i v_i[c] with e_i = expf(g_i[c] - m),
 *     accumulated slot by slot in position order; c_hat[c] = acc / s;
 *     ratio 1 copies v (the softmax over one slot is exactly 1: SPEC 3.7);
 *   then op_rmsnorm (row by row in its own order, several entries at once),
 *   op_linear on one row for kI (a 1-row GEMM has one code path whatever
 *   the call), RoPE of kM and kI at the entry's position (from the caller's
 *   angle table when it has the position, else op_rope_apply_two: the same
 *   cos/sin either way), and the packers of ops/formats.h.
 *
 * Test: tests/test_ops_compressor.c (ctest -R ops_compressor).
 */
#include "ops/compressor.h"

#include <math.h>
#include <string.h>

#include "ops/basic.h"
#include "base/check.h"

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

/* Entries go through normalisation, W_ik, RoPE and packing COMP_BLOCK at a
 * time: the RMSNorms then run over several rows at once (op_rmsnorm keeps
 * each row's order, so an entry's bits do not depend on its neighbours). */
enum { COMP_BLOCK = 8 };

size_t op_comp_work_floats(int d, int idx_dim) {
  return COMP_BLOCK * (2 * (size_t)d + (size_t)idx_dim) + 3 * (size_t)d;
}

size_t op_comp_scratch_floats(int n, int ratio, int d, int idx_dim) {
  return (size_t)n * (size_t)d * (ratio > 1 ? 2 : 1) + op_comp_work_floats(d, idx_dim);
}

void op_comp_project(float *v, float *g, const float *u, int n, const struct op_comp_layer *L) {
  op_linear(v, u, L->W_kv, n, L->hidden, L->d, L->hidden, L->d);
  if (L->ratio > 1) op_linear(g, u, L->W_gate, n, L->hidden, L->d, L->hidden, L->d);
}

/* Row k of a group whose first nt rows sit in t and the rest in nw: the
 * tail's pending rows come before the call's new rows. */
static const float *group_row(const float *t, const float *nw, int nt, int k, int d) {
  return k < nt ? t + (size_t)k * d : nw + (size_t)(k - nt) * d;
}

/* pool_group at ratio 2 (the encoder sources' [A]), the same operations in
 * the same order: of z0 = g0 - m and z1 = g1 - m one is +0 (its weight
 * exp(+0) = 1 exactly, C11 F.10.3.1), so one expf per channel, of the other;
 * both are non-zero only for infinite or NaN gates, and then each gets its
 * own expf. z0, z1, ew: d floats of scratch each. */
static void pool_pair(float *restrict c_hat, float *restrict z0, float *restrict z1, float *restrict ew,
                      const float *restrict v0, const float *restrict g0, const float *restrict v1,
                      const float *restrict g1, int d) {
  for (int c = 0; c < d; c++) {
    const float m = g1[c] > g0[c] ? g1[c] : g0[c];
    z0[c] = g0[c] - m, z1[c] = g1[c] - m;
    ew[c] = z0[c] != 0.0f ? z0[c] : z1[c];
  }
  for (int c = 0; c < d; c++) ew[c] = expf(ew[c]);
  /* The weights, in place of z0 and z1; where both z were non-zero, z1 stays
   * raw and ew becomes 1 to mark it for its own expf below (the branch-free
   * loops vectorize, the rare one runs apart). */
  for (int c = 0; c < d; c++) {
    const bool both = z0[c] != 0.0f && z1[c] != 0.0f;
    const float e0 = z0[c] != 0.0f ? ew[c] : 1.0f;
    const float e1 = both ? z1[c] : z1[c] != 0.0f ? ew[c] : 1.0f;
    z0[c] = e0, z1[c] = e1, ew[c] = both;
  }
  for (int c = 0; c < d; c++)
    if (ew[c] != 0.0f) z1[c] = expf(z1[c]);
  for (int c = 0; c < d; c++) {
    float s = 0.0f, acc = 0.0f;
    s += z0[c];
    acc += z0[c] * v0[c];
    s += z1[c];
    acc += z1[c] * v1[c];
    c_hat[c] = acc / s;
  }
}

/* c_hat = per-channel softmax(g)-weighted sum of v over the r slots (SPEC
 * 3.7), in the order the file header fixes. Channels go side by side, slot
 * after slot, so each channel still sees its slots in position order; m, s
 * and e are d floats of scratch each. The max keeps the first of equal
 * values; it differs from fmaxf only when a gate is NaN, and then both give a
 * NaN channel (the NaN slot's e is NaN). */
static void pool_group(float *restrict c_hat /* (d) */, float *restrict m, float *restrict s, float *restrict e,
                       const float *tv, const float *tg, int nt, const float *nv, const float *ng, int r, int d) {
  if (r == 1) {
    memcpy(c_hat, group_row(tv, nv, nt, 0, d), (size_t)d * sizeof *c_hat);
    return;
  }
  if (r == 2) {
    pool_pair(c_hat, m, s, e, group_row(tv, nv, nt, 0, d), group_row(tg, ng, nt, 0, d), group_row(tv, nv, nt, 1, d),
              group_row(tg, ng, nt, 1, d), d);
    return;
  }
  memcpy(m, group_row(tg, ng, nt, 0, d), (size_t)d * sizeof *m);
  for (int k = 1; k < r; k++) {
    const float *restrict gk = group_row(tg, ng, nt, k, d);
    for (int c = 0; c < d; c++) m[c] = gk[c] > m[c] ? gk[c] : m[c];
  }
  for (int c = 0; c < d; c++) s[c] = 0.0f, c_hat[c] = 0.0f;
  for (int k = 0; k < r; k++) {
    const float *restrict gk = group_row(tg, ng, nt, k, d), *restrict vk = group_row(tv, nv, nt, k, d);
    for (int c = 0; c < d; c++) e[c] = expf(gk[c] - m[c]);
    for (int c = 0; c < d; c++) {
      s[c] += e[c];
      c_hat[c] += e[c] * vk[c];
    }
  }
  for (int c = 0; c < d; c++) c_hat[c] /= s[c];
}

/* Turn rows c (nb, d) = c_hat of groups e0 .. e0 + nb - 1 of the call, at
 * positions pos0 + j r, into those entries of `out` (SPEC 3.7 norm, 3.8):
 * c, kI from c before RoPE, kM = RoPE(c), then pack. ang: the call's rows'
 * angles (rows [0, n) = positions [a, a + n)) or NULL; an entry whose
 * position is not among them (its group began in an earlier call) gets its
 * angles computed here, with the same bits. */
static void emit_block(const struct op_comp_out *out, int e0, int nb, float *c, float *kM, float *kI, int64_t pos0,
                       const struct op_comp_layer *L, const struct op_rope_angles *ang, int64_t a, int n) {
  const int d = L->d, di = L->idx_dim;
  op_rmsnorm(c, c, L->gamma, nb, d, L->eps);
  for (int j = 0; j < nb; j++) op_linear(kI + (size_t)j * di, c + (size_t)j * d, L->W_ik, 1, d, di, d, di);
  if (L->k_norm) op_rmsnorm(kI, kI, L->k_gamma, nb, di, L->eps);
  memcpy(kM, c, (size_t)nb * d * sizeof *kM);
  const bool share_i = ang && op_rope_same_angles(L->rope_i, ang->rope);
  for (int j = 0; j < nb; j++) {
    const int e = e0 + j;
    const int64_t pos = pos0 + (int64_t)e * L->ratio;
    float *km = kM + (size_t)j * d, *ki = kI + (size_t)j * di;
    if (ang && pos >= a && pos < a + n) {
      const int row = (int)(pos - a);
      CEDAR_ASSERT_MSG(ang->pos[row] == pos, "compressor: angle row %d holds position %lld, not %lld", row,
                       (long long)ang->pos[row], (long long)pos);
      op_rope_rotate(km, L->rope, ang, row, 1, 1, d, +1);
      if (share_i)
        op_rope_rotate(ki, L->rope_i, ang, row, 1, 1, di, +1);
      else
        op_rope_apply(ki, L->rope_i, &pos, 1, 1, di, +1);
    } else {
      op_rope_apply_two(km, L->rope, ki, L->rope_i, pos); /* one sin/cos table when the angles agree */
    }
    uint8_t *entry = out->entries + (size_t)e * out->entry_bytes;
    op_kv_pack(&L->main_fmt, entry + out->main_off, km, d);
    op_kv_pack(&L->idx_fmt, entry + out->idx_off, ki, di);
    if (out->pos) out->pos[e] = pos;
    if (out->c) memcpy(out->c + (size_t)e * d, c + (size_t)j * d, (size_t)d * sizeof *c);
    if (out->kM) memcpy(out->kM + (size_t)e * d, km, (size_t)d * sizeof *km);
    if (out->kI) memcpy(out->kI + (size_t)e * di, ki, (size_t)di * sizeof *ki);
  }
}

/* The dimension checks shared by push and compress (internal invariants:
 * a mismatch is a caller bug, not user input). */
static void check_layer(const struct op_comp_out *out, const struct op_comp_tail *tail,
                        const struct op_comp_layer *L) {
  CEDAR_ASSERT(L->ratio >= 1 && L->ratio == tail->ratio && L->d == tail->d);
  CEDAR_ASSERT(L->rope->dim == L->d && L->rope_i->dim == L->idx_dim);
  if (!out) return;
  size_t mb = op_kv_bytes(&L->main_fmt, L->d), ib = op_kv_bytes(&L->idx_fmt, L->idx_dim);
  CEDAR_ASSERT_MSG(mb > 0 && ib > 0, "compressor: d %d / block %d or idx_dim %d / block %d", L->d, L->main_fmt.block,
                   L->idx_dim, L->idx_fmt.block);
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
                 const float *g, int64_t a, int n, const struct op_comp_layer *L, const struct op_rope_angles *ang) {
  check_layer(out, tail, L);
  if (check_call(out, tail, a, n) != 0) return -1;
  const int r = L->ratio, d = L->d, t = tail->count;
  CEDAR_ASSERT(r == 1 || g != NULL || n == 0);
  CEDAR_ASSERT(!ang || ang->n >= n);
  const int n_emit = op_comp_n_emit(tail, n);
  float *c = work, *kM = c + (size_t)COMP_BLOCK * d, *kI = kM + (size_t)COMP_BLOCK * d;
  float *m = kI + (size_t)COMP_BLOCK * L->idx_dim, *s = m + d, *ex = s + d;

  /* Group e covers rows [e r, e r + r) of (tail rows, then new rows). */
  for (int e0 = 0; e0 < n_emit; e0 += COMP_BLOCK) {
    const int nb = n_emit - e0 < COMP_BLOCK ? n_emit - e0 : COMP_BLOCK;
    for (int j = 0; j < nb; j++) {
      int first = (e0 + j) * r;                            /* index of its first row */
      int nt = first < t ? t - first : 0;                  /* rows of it still in the tail (e == 0 only) */
      const float *nv = v + (size_t)(first + nt - t) * d;  /* its first new row */
      const float *ng = r > 1 ? g + (size_t)(first + nt - t) * d : NULL;
      pool_group(c + (size_t)j * d, m, s, ex, tail->v, tail->g, nt, nv, ng, r, d);
    }
    emit_block(out, e0, nb, c, kM, kI, tail->pos0, L, ang, a, n);
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
                int n, const struct op_comp_layer *L, const struct op_rope_angles *ang) {
  check_layer(out, tail, L);
  if (check_call(out, tail, a, n) != 0) return -1;
  const size_t rows = (size_t)n * L->d;
  float *v = scratch, *g = L->ratio > 1 ? scratch + rows : NULL;
  float *work = scratch + rows * (L->ratio > 1 ? 2 : 1);
  op_comp_project(v, g, u, n, L);
  return op_comp_push(out, tail, work, v, g, a, n, L, ang);
}

/* ---- registry descriptors (ops/registry.h) ------------------------------ */
/* `cedar op compress`: one op_compress call from an empty tail whose group
 * starts at parameter `start`; it writes the emitted entries, their
 * positions and the tail left behind (the pending projected rows).
 * Test: tests/test_op_desc_attn.c (ctest -R op_desc_attn). */

#include <float.h>
#include <limits.h>
#include <stdlib.h>

#include "ops/registry.h"

/* Input `name` of (rows, cols) exactly, or a message naming both shapes. */
static const float *in_shape(const struct op_desc *self, struct op_io *io, const char *name, int64_t rows,
                             int64_t cols, const char *why) {
  int64_t d[2];
  const struct op_tensor *t = op_io_in(self, io, name, 2, d);
  if (t && (d[0] != rows || d[1] != cols)) {
    op_io_fail(io, "compress: %s is (%lld, %lld) but %s needs (%lld, %lld)", name, (long long)d[0], (long long)d[1],
               why, (long long)rows, (long long)cols);
    return NULL;
  }
  return t ? t->data : NULL;
}

/* An optional vector of `len` floats: true with *out NULL when absent, false
 * after op_io_fail when present but misshapen. */
static bool in_vector(const struct op_desc *self, struct op_io *io, const char *name, int64_t len, const char *why,
                      const float **out) {
  int64_t d[1];
  *out = NULL;
  if (!io->input(io, name)) return true;
  const struct op_tensor *t = op_io_in(self, io, name, 1, d);
  if (!t) return false;
  if (d[0] != len)
    return op_io_fail(io, "compress: %s has %lld values but %s has %lld", name, (long long)d[0], why,
                      (long long)len),
           false;
  *out = t->data;
  return true;
}

static int comp_params(const struct op_desc *self, struct op_io *io, struct op_compress_call *c) {
  double ratio, start, eps, mb, ib, rule, nibble, k_norm, floats;
  if (!op_io_param_in(self, io, "ratio", 1, INT_MAX, &ratio) || !op_io_param_in(self, io, "start", 0, 0x1p53, &start) ||
      !op_io_param_in(self, io, "eps", 0, DBL_MAX, &eps) || !op_io_param_in(self, io, "main_block", 2, INT_MAX, &mb) ||
      !op_io_param_in(self, io, "idx_block", 2, INT_MAX, &ib) || !op_io_param_in(self, io, "scale_rule", 0, 1, &rule) ||
      !op_io_param_in(self, io, "nibble", 0, 1, &nibble) || !op_io_param_in(self, io, "k_norm", 0, 1, &k_norm) ||
      !op_io_param_in(self, io, "floats", 0, 1, &floats))
    return CEDAR_EINVAL;
  if ((int64_t)start % (int64_t)ratio != 0)
    return op_io_fail(io, "compress: start %lld is not a multiple of ratio %d (a group cannot begin mid-group)",
                      (long long)start, (int)ratio);
  c->start = (int64_t)start;
  c->floats = floats != 0;
  c->L = (struct op_comp_layer){.ratio = (int)ratio, .k_norm = k_norm != 0, .eps = (float)eps,
                                .rope = &c->rope, .rope_i = &c->rope_i,
                                .main_fmt = op_kv_fp4_format((int)mb, (enum op_nibble_order)nibble),
                                .idx_fmt = op_kv_mxfp4_format((int)ib, (enum op_mx_rule)rule,
                                                              (enum op_nibble_order)nibble)};
  return 0;
}

/* The tensors, checked against W_kv (d, hidden) and W_ik (idx_dim, d). */
static int comp_inputs(const struct op_desc *self, struct op_io *io, struct op_compress_call *c) {
  struct op_comp_layer *L = &c->L;
  int64_t ud[2], kd[2], id[2];
  const struct op_tensor *u = op_io_in(self, io, "u", 2, ud);
  const struct op_tensor *Wkv = u ? op_io_in(self, io, "W_kv", 2, kd) : NULL;
  const struct op_tensor *Wik = Wkv ? op_io_in(self, io, "W_ik", 2, id) : NULL;
  if (!Wik) return CEDAR_EINVAL;
  if (kd[1] != ud[1])
    return op_io_fail(io, "compress: W_kv is (%lld, %lld) but u is (%lld, %lld): widths differ", (long long)kd[0],
                      (long long)kd[1], (long long)ud[0], (long long)ud[1]);
  if (id[1] != kd[0])
    return op_io_fail(io, "compress: W_ik is (%lld, %lld) but W_kv is (%lld, %lld): W_ik needs %lld columns",
                      (long long)id[0], (long long)id[1], (long long)kd[0], (long long)kd[1], (long long)kd[0]);
  c->u = u->data, c->n = (int)ud[0];
  L->hidden = (int)ud[1], L->d = (int)kd[0], L->idx_dim = (int)id[0];
  L->W_kv = Wkv->data, L->W_ik = Wik->data;
  if (L->ratio == 1 && io->input(io, "W_gate"))
    return op_io_fail(io, "compress: W_gate given at ratio 1; a ratio-1 layer has no gate weights (SPEC 3.7)");
  if (L->ratio > 1 && !(L->W_gate = in_shape(self, io, "W_gate", kd[0], kd[1], "W_kv's shape")))
    return CEDAR_EINVAL;
  if (!L->k_norm && io->input(io, "k_gamma"))
    return op_io_fail(io, "compress: k_gamma given but k_norm is off (set k_norm=1 to use it)");
  if (!in_vector(self, io, "gamma_c", kd[0], "d (the rows of W_kv)", &L->gamma) ||
      !in_vector(self, io, "k_gamma", id[0], "idx_dim (the rows of W_ik)", &L->k_gamma))
    return CEDAR_EINVAL;
  if (!op_kv_bytes(&L->main_fmt, L->d) || !op_kv_bytes(&L->idx_fmt, L->idx_dim))
    return op_io_fail(io, "compress: main_block %d must be even and divide d = %d, and idx_block %d even and "
                          "divide idx_dim = %d", L->main_fmt.block, L->d, L->idx_fmt.block, L->idx_dim);
  if (!op_rope_from_params(self, io, "rope_dim", "last", L->d, &c->rope) ||
      !op_rope_from_params(self, io, "idx_rope_dim", "idx_rope_last", L->idx_dim, &c->rope_i))
    return CEDAR_EINVAL;
  return 0;
}

/* The outputs: entries (Main-KV part first, then the Indexer-K part), their
 * positions (filled here: integer work), the tail left behind, and with
 * floats=1 kM and kI. */
static int comp_outputs(const struct op_desc *self, struct op_io *io, struct op_compress_call *c) {
  const struct op_comp_layer *L = &c->L;
  const int r = L->ratio, d = L->d;
  c->n_emit = c->n / r, c->left = c->n % r;
  size_t mb = op_kv_bytes(&L->main_fmt, d), ib = op_kv_bytes(&L->idx_fmt, L->idx_dim);
  c->out = (struct op_comp_out){.entry_bytes = mb + ib, .main_off = 0, .idx_off = mb, .max_entries = c->n_emit};
  if (!(c->out.entries = op_io_out(self, io, "entries", 2, (int64_t[]){c->n_emit, (int64_t)(mb + ib)})) ||
      !(c->out.pos = op_io_out(self, io, "pos", 1, (int64_t[]){c->n_emit})) ||
      !(c->tail_v = op_io_out(self, io, "tail_v", 2, (int64_t[]){c->left, d})) ||
      !(c->tail_g = op_io_out(self, io, "tail_g", 2, (int64_t[]){c->left, d})) ||
      !(c->tail_pos = op_io_out(self, io, "tail_pos", 1, (int64_t[]){c->left})) ||
      (c->floats && (!(c->out.kM = op_io_out(self, io, "kM", 2, (int64_t[]){c->n_emit, d})) ||
                     !(c->out.kI = op_io_out(self, io, "kI", 2, (int64_t[]){c->n_emit, L->idx_dim})))))
    return CEDAR_ENOMEM;
  for (int e = 0; e < c->n_emit; e++) c->out.pos[e] = c->start + (int64_t)e * r;
  for (int i = 0; i < c->left; i++) c->tail_pos[i] = c->start + (int64_t)c->n_emit * r + i;
  return 0;
}

int op_compress_prepare(const struct op_desc *self, struct op_io *io, struct op_compress_call *c) {
  memset(c, 0, sizeof *c);
  int rc = comp_params(self, io, c);
  if (!rc) rc = comp_inputs(self, io, c);
  if (!rc) rc = comp_outputs(self, io, c);
  return rc;
}

/* Run the prepared call: one op_compress from an empty tail at start, its
 * tail copied out. */
static int comp_compute(struct op_io *io, struct op_compress_call *c) {
  const struct op_comp_layer *L = &c->L;
  const int r = L->ratio, d = L->d, left = c->left;
  float *scratch = calloc(op_comp_scratch_floats(c->n, r, d, L->idx_dim), sizeof *scratch);
  float *tbuf = r > 1 ? calloc(op_comp_tail_floats(r, d), sizeof *tbuf) : NULL;
  if (!scratch || (r > 1 && !tbuf)) {
    free(scratch), free(tbuf);
    return op_io_fail(io, "compress: cannot allocate the scratch for %d rows of %d", c->n, d), CEDAR_ENOMEM;
  }
  struct op_comp_tail tail;
  int rc = op_comp_tail_init(&tail, tbuf, r, d, c->start);
  if (rc == 0) rc = op_compress(&c->out, &tail, scratch, c->u, c->start, c->n, L, NULL);
  CEDAR_ASSERT_MSG(rc == c->n_emit && tail.count == left, "compress: emitted %d of %d", rc, c->n_emit);
  if (left) {
    memcpy(c->tail_v, tail.v, (size_t)left * d * sizeof *c->tail_v);
    memcpy(c->tail_g, tail.g, (size_t)left * d * sizeof *c->tail_g);
  }
  free(scratch), free(tbuf);
  return 0;
}

static int compress_run(const struct op_desc *self, struct op_io *io) {
  struct op_compress_call c;
  int rc = op_compress_prepare(self, io, &c);
  return rc ? rc : comp_compute(io, &c);
}

const struct op_desc op_desc_compress = {
    .name = "compress",
    .summary = "KV-source compressor, one call from an empty tail: gated pooling, RMSNorm, Main-KV + "
               "Indexer-K entries (SPEC 3.7-3.8)",
    .inputs = (const struct op_arg[]){
        {"u", OP_F32, "(n, hidden)", "attention input rows of positions start .. start+n-1"},
        {"W_kv", OP_F32, "(d, hidden)", "compressor KV projection (d = head_dim, 512 [A])"},
        {"W_gate", OP_F32, "(d, hidden)", "gate projection; required when ratio > 1, refused at ratio 1"},
        {"gamma_c", OP_F32, "(d)", "optional: norm_c weight (absent = 1)"},
        {"W_ik", OP_F32, "(idx_dim, d)", "indexer key projection (idx_dim 128 [A])"},
        {"k_gamma", OP_F32, "(idx_dim)", "optional, with k_norm=1 only: k_norm weight (absent = 1)"},
        {0}},
    .outputs = (const struct op_arg[]){
        {"entries", OP_U8, "(n/ratio, main+idx bytes)", "Main-KV part (fp4) at 0, Indexer-K part (mxfp4) after it"},
        {"pos", OP_I64, "(n/ratio)", "entry positions, each its group's first token"},
        {"tail_v", OP_F32, "(n%ratio, d)", "the tail after the call: projected values of the pending rows"},
        {"tail_g", OP_F32, "(n%ratio, d)", "their gate scores"},
        {"tail_pos", OP_I64, "(n%ratio)", "their positions (the next call starts after the last)"},
        {"kM", OP_F32, "(n/ratio, d)", "with floats=1: Main KV after RoPE, before FP4 (the encoder's input)"},
        {"kI", OP_F32, "(n/ratio, idx_dim)", "with floats=1: Indexer K after k_norm and RoPE, before MXFP4"},
        {0}},
    .params = (const struct op_param[]){
        {"ratio", OP_PARAM_INT, 2, "tokens per entry r [A]: 2 encoder sources, 1 L20"},
        {"start", OP_PARAM_INT, 0, "position of u's first row, a multiple of ratio (the tail starts empty)"},
        {"eps", OP_PARAM_FLOAT, 1e-6, "epsilon of both norms, model.norm_eps [R]"},
        {"k_norm", OP_PARAM_BOOL, 0, "RMSNorm on kI, plan indexer.k_norm [R]"},
        {"main_block", OP_PARAM_INT, 16, "values per E4M3 scale in Main KV [A]"},
        {"idx_block", OP_PARAM_INT, 32, "values per E8M0 scale in Indexer K [A]"},
        {"scale_rule", OP_PARAM_INT, 0, "Indexer-K scale: 0 ceil [R-cfg, R.9], 1 OCP MX"},
        {"nibble", OP_PARAM_INT, 0, "0: element 2j in the low nibble, 1: in the high one [R]"},
        {"rope_dim", OP_PARAM_INT, 64, "main RoPE channels of d [A]"},
        {"last", OP_PARAM_BOOL, 1, "main RoPE on the last rope_dim channels [A]"},
        {"idx_rope_dim", OP_PARAM_INT, 64, "indexer RoPE channels of idx_dim [R-cfg]"},
        {"idx_rope_last", OP_PARAM_BOOL, 1, "indexer RoPE on the last channels; theta and YaRN below are both "
                                            "RoPEs' [R-cfg]"},
        {"floats", OP_PARAM_BOOL, 0, "also write kM and kI, the values the packers encoded [cedar]"},
        OP_ROPE_PARAM_LIST,
        {0}},
    .run = compress_run,
};
