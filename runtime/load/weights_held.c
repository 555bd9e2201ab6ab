/* weights_held.c: weights held in their stored formats (weights.h, "Held
 * formats"): the format each tensor is stored in (ckpt_map.c's table, the
 * one `plan cost` sizes by), the stored values of synthetic weights, the
 * conversion of F32-held weights to stored holds, the views the model reads
 * (struct op_qweight) and the resident bytes by format.
 */
#include "runtime/load/weights.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/qlinear.h"
#include "runtime/load/checkpoint.h"
#include "base/check.h"

static uint64_t round_align(uint64_t n) { return (n + WEIGHTS_ALIGN - 1) / WEIGHTS_ALIGN * WEIGHTS_ALIGN; }

enum op_wfmt weights_stored_fmt(const struct weights_spec *s) {
  int layer;
  const struct ckpt_map_row *row = s->init == WEIGHTS_ENGRAM_ROWS ? NULL : ckpt_map_find(s->name, &layer);
  if (!row) return OP_W_F32;
  switch (row->conv) {
    case CKPT_FP8: return OP_W_FP8;
    case CKPT_EXPERTS: return OP_W_FP4;
    case CKPT_FLOAT: return row->dtype == ST_BF16 ? OP_W_BF16 : OP_W_F32;
    default: return OP_W_F32;
  }
}

/* The BF16 tensors whose readers take a view (runtime/model: the embedding
 * gather, the head, the router); the other BF16 tensors (norm vectors, the
 * compressor's and indexer's projections) are held widened to F32, which
 * weights_resident counts apart. */
static bool bf16_held(const struct weights_spec *s) {
  size_t n = strlen(s->name);
  return !strcmp(s->name, "embed") || !strcmp(s->name, "lm_head") || (n >= 9 && !strcmp(s->name + n - 9, ".ffn.gate"));
}

/* Rows and columns of s's 2-D view (the leading dimensions folded). */
static void view_dims(const struct weights_spec *s, int64_t *rows, int64_t *cols) {
  *cols = s->ndim ? s->shape[s->ndim - 1] : 1;
  *rows = 1;
  for (int k = 0; k + 1 < s->ndim; k++) *rows *= s->shape[k];
}

enum op_wfmt weights_held_fmt(const struct weights_spec *s) {
  enum op_wfmt f = weights_stored_fmt(s);
  int64_t rows, cols;
  view_dims(s, &rows, &cols);
  if (rows > INT32_MAX || cols > INT32_MAX) return OP_W_F32; /* op_qweight's int dimensions */
  switch (f) {
    case OP_W_FP8: /* a 3-D FP8 tensor (wo_a: G, o_rank, gw) is read a slab at a time: whole tile rows only */
      return s->ndim == 3 && s->shape[1] % OP_QW_BLOCK ? OP_W_F32 : OP_W_FP8;
    case OP_W_FP4: return cols % OP_QW_BLOCK ? OP_W_F32 : OP_W_FP4;
    case OP_W_BF16: return bf16_held(s) ? OP_W_BF16 : OP_W_F32;
    default: return OP_W_F32;
  }
}

/* Stored bytes of n_rows rows of cols values in format f: the elements, and
 * the scales (*scale_bytes). */
static uint64_t stored_bytes(enum op_wfmt f, int64_t n_rows, int64_t cols, uint64_t *scale_bytes) {
  struct op_qweight q = {f, (int)n_rows, (int)cols, NULL, NULL};
  *scale_bytes = op_qweight_scale_bytes(&q);
  return op_qweight_data_bytes(&q);
}

/* The rows of tensor i's 2-D view that w holds (a part: its rows of dim 0). */
static int64_t held_rows(const struct weights *w, size_t i) {
  const struct weights_spec *s = &w->list.t[i];
  int64_t rows, cols;
  view_dims(s, &rows, &cols);
  if (!w->part || s->ndim < 2 || !s->shape[0]) return rows;
  return rows / s->shape[0] * (w->part[i].hi - w->part[i].lo);
}

void weights_store_values(float *x, const struct weights_spec *s, int64_t n_rows) {
  enum op_wfmt f = weights_stored_fmt(s);
  int64_t rows, cols;
  view_dims(s, &rows, &cols);
  uint64_t n = (uint64_t)n_rows * (uint64_t)cols, sb;
  if (f == OP_W_BF16) {
    for (uint64_t k = 0; k < n; k++) x[k] = ckpt_bf16_to_f32(ckpt_f32_to_bf16(x[k]));
    return;
  }
  if (f != OP_W_FP8 && f != OP_W_FP4) return;
  CEDAR_ASSERT_MSG(f == OP_W_FP4 || n_rows == rows, "%s: an FP8 tensor is held whole (its tiles span rows)", s->name);
  uint64_t db = stored_bytes(f, n_rows, cols, &sb);
  uint8_t *q = cedar_xmalloc(db + 1), *sc = cedar_xmalloc(sb + 1);
  if (f == OP_W_FP8) {
    ckpt_fp8_quant(q, sc, x, n_rows, cols);
    ckpt_fp8_dequant(x, q, sc, n_rows, cols);
  } else {
    ckpt_fp4_quant(q, sc, x, n_rows, cols);
    ckpt_fp4_dequant(x, q, sc, n_rows, cols);
  }
  free(q);
  free(sc);
}

/* Quantize tensor i's F32 values (src) into dst (elements, then the scales
 * at the next aligned offset) as format f, and check that they decode to
 * exactly src: synthetic weights hold stored values (weights_store_values),
 * so anything else is a bug, refused rather than run with other numbers. */
static bool quantize_exact(struct op_qweight *v, uint8_t *dst, const float *src, enum op_wfmt f, int64_t rows,
                           int64_t cols) {
  uint64_t sb, db = stored_bytes(f, rows, cols, &sb);
  uint8_t *sc = dst + round_align(db);
  if (f == OP_W_FP8) ckpt_fp8_quant(dst, sc, src, rows, cols);
  else if (f == OP_W_FP4) ckpt_fp4_quant(dst, sc, src, rows, cols);
  else
    for (uint64_t k = 0; k < (uint64_t)rows * (uint64_t)cols; k++) {
      uint16_t b = ckpt_f32_to_bf16(src[k]);
      memcpy(dst + 2 * k, &b, 2);
    }
  *v = (struct op_qweight){f, (int)rows, (int)cols, dst, f == OP_W_BF16 ? NULL : sc};
  float *back = malloc(sizeof(float) * (size_t)(rows * cols) + 1);
  if (!back) return false;
  op_qweight_dequant(back, v);
  bool same = !memcmp(back, src, sizeof(float) * (size_t)(rows * cols));
  free(back);
  return same;
}

/* Whether tensor i lies in w's arena (else in a file's mapping, used in place). */
static bool in_arena(const struct weights *w, size_t i) {
  const uint8_t *p = w->data[i], *a = w->arena;
  return a && p >= a && p < a + w->arena_bytes;
}

int weights_hold_stored(struct weights *w, char *err, size_t err_len) {
  const struct weights_list *l = &w->list;
  CEDAR_ASSERT_MSG(!w->qw, "weights_hold_stored twice");
  uint64_t arena = 0;
  for (size_t i = 0; i < l->n; i++) {
    if (!w->data[i]) continue; /* an Engram table the mmap tier maps */
    enum op_wfmt f = weights_held_fmt(&l->t[i]);
    if (f == OP_W_F32 && !in_arena(w, i)) continue; /* in place in a mapping: stays there */
    int64_t rows, cols, hr = held_rows(w, i);
    view_dims(&l->t[i], &rows, &cols);
    uint64_t sb, db = f == OP_W_F32 ? weights_held_bytes(w, i) : stored_bytes(f, hr, cols, &sb);
    arena += round_align(db) + (f == OP_W_F32 ? 0 : round_align(sb));
  }
  void *base = NULL;
  w->qw = calloc(l->n ? l->n : 1, sizeof *w->qw);
  if (!w->qw || arena > SIZE_MAX || posix_memalign(&base, WEIGHTS_ALIGN, (size_t)(arena ? arena : 1))) {
    free(w->qw);
    w->qw = NULL;
    snprintf(err, err_len, "plan '%s': cannot allocate %" PRIu64 " bytes for the weights in their stored formats "
             "(--weights-format f32 holds them as F32 instead)", l->plan_name, arena);
    return CEDAR_ENOMEM;
  }
  uint8_t *at = base;
  for (size_t i = 0; i < l->n; i++) {
    if (!w->data[i]) continue;
    const struct weights_spec *s = &l->t[i];
    enum op_wfmt f = weights_held_fmt(s);
    int64_t rows, cols, hr = held_rows(w, i);
    view_dims(s, &rows, &cols);
    if (f == OP_W_F32 && !in_arena(w, i)) {
      w->qw[i] = (struct op_qweight){OP_W_F32, (int)hr, (int)cols, w->data[i], NULL};
    } else if (f == OP_W_F32) {
      memcpy(at, w->data[i], weights_held_bytes(w, i));
      w->qw[i] = (struct op_qweight){OP_W_F32, (int)hr, (int)cols, at, NULL};
      at += round_align(weights_held_bytes(w, i));
    } else {
      if (!quantize_exact(&w->qw[i], at, w->data[i], f, hr, cols)) {
        snprintf(err, err_len, "%s: its values are not exactly %s values, so holding it as %s would change the "
                 "model (cedar's bug for synthetic weights; --weights-format f32 runs them as they are)", s->name,
                 op_wfmt_name(f), op_wfmt_name(f));
        free(base);
        free(w->qw);
        w->qw = NULL;
        return CEDAR_EINVAL;
      }
      uint64_t sb, db = stored_bytes(f, hr, cols, &sb);
      at += round_align(db) + round_align(sb);
    }
  }
  for (size_t i = 0; i < l->n; i++) /* only now: a refusal above leaves w as it was */
    if (w->data[i]) w->data[i] = w->qw[i].data;
  free(w->arena);
  w->arena = base;
  w->arena_bytes = arena;
  return CEDAR_OK;
}

struct op_qweight weights_qw(const struct weights *w, const char *name) {
  const struct weights_spec *s;
  const void *d = weights_get(w, name, &s);
  struct op_qweight q = {OP_W_F32, 0, 0, NULL, NULL};
  if (!d || s->init == WEIGHTS_ENGRAM_ROWS) return q;
  size_t i = (size_t)(s - w->list.t);
  if (w->qw) return w->qw[i];
  int64_t rows, cols;
  view_dims(s, &rows, &cols);
  return op_qw_f32(d, (int)held_rows(w, i), (int)cols);
}

enum op_wfmt weights_fmt_at(const struct weights *w, size_t i) { return w->qw ? w->qw[i].fmt : OP_W_F32; }

void weights_f32_values(const struct weights *w, size_t i, float *out) {
  if (w->qw && w->qw[i].fmt != OP_W_F32) op_qweight_dequant(out, &w->qw[i]);
  else memcpy(out, w->data[i], weights_held_bytes(w, i));
}

void weights_resident(const struct weights *w, struct weights_resident *r) {
  memset(r, 0, sizeof *r);
  const struct weights_list *l = &w->list;
  for (size_t i = 0; i < l->n; i++) {
    const struct weights_spec *s = &l->t[i];
    if (!w->data[i]) continue;
    if (s->init == WEIGHTS_ENGRAM_ROWS) { /* E4M3 + E8M0 rows, in memory or mapped (the tier) */
      if (w->list.engram_in_file) r->engram_mapped += weights_held_bytes(w, i);
      else r->bytes[OP_W_FP8] += weights_held_bytes(w, i);
      continue;
    }
    enum op_wfmt f = weights_fmt_at(w, i);
    if (f == OP_W_F32) {
      r->bytes[OP_W_F32] += weights_held_bytes(w, i);
      enum op_wfmt sf = weights_stored_fmt(s);
      if (sf != OP_W_F32) {
        int64_t rows, cols;
        view_dims(s, &rows, &cols);
        uint64_t sb, db = stored_bytes(sf, held_rows(w, i), cols, &sb);
        r->widened += weights_held_bytes(w, i);
        r->widened_stored += db + sb;
      }
    } else {
      r->bytes[f] += op_qweight_data_bytes(&w->qw[i]) + op_qweight_scale_bytes(&w->qw[i]);
    }
  }
  for (int f = 0; f < OP_W_COUNT; f++) r->total += r->bytes[f];
}

void weights_resident_print(FILE *f, const struct weights_resident *r, int64_t plan_cost_bytes) {
  fprintf(f, "resident weights: %" PRIu64 " bytes (f32 %" PRIu64 ", bf16 %" PRIu64 ", fp8 %" PRIu64 ", fp4 %" PRIu64
          ")", r->total, r->bytes[OP_W_F32], r->bytes[OP_W_BF16], r->bytes[OP_W_FP8], r->bytes[OP_W_FP4]);
  if (r->widened)
    fprintf(f, ", of which %" PRIu64 " widened to f32 from %" PRIu64 " stored", r->widened, r->widened_stored);
  if (r->engram_mapped) fprintf(f, "; Engram tables mapped from a file: %" PRIu64, r->engram_mapped);
  if (plan_cost_bytes >= 0) fprintf(f, "; plan cost (stored formats): %" PRId64, plan_cost_bytes);
  fputc('\n', f);
}
