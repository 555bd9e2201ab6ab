/* ckpt_map.c: THE table from cedar's internal tensor names (docs/weights.md)
 * to the released DeepSeek-V4.1 checkpoint's names and dtypes (Appendix V,
 * "Checkpoint layout"), and the codecs of the released dtypes (BF16, FP8
 * E4M3 with E8M0 32x32 tile scales, E2M1 packed two to a byte with E8M0 per
 * row group of 32). The loader and the writer (checkpoint.c, ckpt_write.c)
 * both go through this table; no other code knows a released name.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/formats.h"
#include "runtime/load/checkpoint.h"

#define HEAD_HC_NOTE                                                                                          \
  "the release has no head.hc.* (its head collapses the streams with the last FFN's pre, Appendix V #4); the " \
  "plan's `model.mhc.merge: learned` needs them"

/* Internal name, released name, conversion, released dtype, second tensor, note. */
static const struct ckpt_map_row rows[] = {
    /* model-wide */
    {"embed", "embed.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"norm", "norm.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"lm_head", "head.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"head.hc.fn", NULL, CKPT_ABSENT, ST_F32, NULL, HEAD_HC_NOTE},
    {"head.hc.scale", NULL, CKPT_ABSENT, ST_F32, NULL, HEAD_HC_NOTE},
    {"head.hc.base", NULL, CKPT_ABSENT, ST_F32, NULL, HEAD_HC_NOTE},
    /* every layer (`layers.{l}.` on both sides) */
    {"attn_norm", "attn_norm.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"ffn_norm", "ffn_norm.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"hc_attn.fn", "hc_attn_fn", CKPT_FLOAT, ST_F32, NULL, NULL},
    {"hc_attn.scale", "hc_attn_scale", CKPT_FLOAT, ST_F32, NULL, NULL},
    {"hc_attn.base", "hc_attn_base", CKPT_FLOAT, ST_F32, NULL, NULL},
    {"hc_ffn.fn", "hc_ffn_fn", CKPT_FLOAT, ST_F32, NULL, NULL},
    {"hc_ffn.scale", "hc_ffn_scale", CKPT_FLOAT, ST_F32, NULL, NULL},
    {"hc_ffn.base", "hc_ffn_base", CKPT_FLOAT, ST_F32, NULL, NULL},
    {"attn.wq_a", "attn.wq_a.weight", CKPT_FP8, ST_F8_E4M3, NULL, NULL},
    {"attn.q_norm", "attn.q_norm.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"attn.wq_b", "attn.wq_b.weight", CKPT_FP8, ST_F8_E4M3, NULL, NULL},
    {"attn.wkv", "attn.wkv.weight", CKPT_FP8, ST_F8_E4M3, NULL, NULL},
    {"attn.kv_norm", "attn.kv_norm.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"attn.sink", "attn.attn_sink", CKPT_FLOAT, ST_F32, NULL, NULL},
    {"attn.wo_a", "attn.wo_a.weight", CKPT_FP8, ST_F8_E4M3, NULL, "[G*o_rank, H*dh/G] viewed (G, o_rank, H*dh/G)"},
    {"attn.wo_b", "attn.wo_b.weight", CKPT_FP8, ST_F8_E4M3, NULL, NULL},
    {"ffn.gate", "ffn.gate.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"ffn.bias", "ffn.gate.bias", CKPT_BIAS2, ST_F32, "ffn.gate.bias_vl", "row 0 text, row 1 image"},
    {"ffn.experts.w_gate", "ffn.experts.%d.w1.weight", CKPT_EXPERTS, ST_I8, NULL, NULL},
    {"ffn.experts.w_up", "ffn.experts.%d.w3.weight", CKPT_EXPERTS, ST_I8, NULL, NULL},
    {"ffn.experts.w_down", "ffn.experts.%d.w2.weight", CKPT_EXPERTS, ST_I8, NULL, NULL},
    {"ffn.shared.w_gate", "ffn.shared_experts.w1.weight", CKPT_FP8, ST_F8_E4M3, NULL, NULL},
    {"ffn.shared.w_up", "ffn.shared_experts.w3.weight", CKPT_FP8, ST_F8_E4M3, NULL, NULL},
    {"ffn.shared.w_down", "ffn.shared_experts.w2.weight", CKPT_FP8, ST_F8_E4M3, NULL, NULL},
    /* index sources */
    {"attn.indexer.wq_b", "attn.indexer.wq_b.weight", CKPT_FP8, ST_F8_E4M3, NULL, NULL},
    {"attn.indexer.weights_proj", "attn.indexer.weights_proj.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    /* KV sources */
    {"attn.compressor.wkv", "attn.compressor.wkv.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"attn.compressor.wgate", "attn.compressor.wgate.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"attn.compressor.norm", "attn.compressor.norm.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"attn.indexer.wk", "attn.indexer.wk.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"attn.indexer.k_norm", "attn.indexer.k_norm.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    /* Engram layers */
    {"engram.table", "engram.embed.weight", CKPT_ENGRAM, ST_F8_E4M3, "engram.embed.scale", "per-row E8M0 per 32"},
    {"engram.wkv", "engram.wkv.weight", CKPT_FP8, ST_F8_E4M3, NULL, NULL},
    {"engram.q_w", "engram.q_weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"engram.k_w", "engram.k_weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    /* the DSpark drafter's extras (`mtp.{k}.` on both sides; its blocks use
     * the rows above, its final norm the model-wide `norm` row) */
    {"main_proj", "main_proj.weight", CKPT_FP8, ST_F8_E4M3, NULL, NULL},
    {"main_norm", "main_norm.weight", CKPT_FLOAT, ST_BF16, NULL, NULL},
    {"markov_head.embed", "markov_head.embed.weight", CKPT_FLOAT, ST_BF16, NULL, "dtype unread (Appendix V)"},
    {"markov_head.head", "markov_head.head.weight", CKPT_FLOAT, ST_BF16, NULL, "dtype unread (Appendix V)"},
    {"confidence_head.proj", "confidence_head.proj.weight", CKPT_FLOAT, ST_BF16, NULL, "dtype unread (Appendix V)"},
};

const struct ckpt_map_row *ckpt_map_rows(size_t *n) {
  *n = sizeof rows / sizeof rows[0];
  return rows;
}

const struct ckpt_map_row *ckpt_map_find(const char *internal, int *layer) {
  *layer = -1;
  const char *s = internal;
  if (!strncmp(s, "layers.", 7)) {
    int l, n = 0;
    if (sscanf(s + 7, "%d.%n", &l, &n) != 1 || n == 0) return NULL;
    *layer = l;
    s += 7 + n;
  } else if (!strncmp(s, "mtp.", 4)) {
    int k, n = 0;
    if (sscanf(s + 4, "%d.%n", &k, &n) != 1 || n == 0 || k < 0) return NULL;
    *layer = CKPT_MTP_LAYER + k;
    s += 4 + n;
  }
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    if (!strcmp(rows[i].internal, s)) return &rows[i];
  return NULL;
}

void ckpt_map_name(char *out, size_t len, int layer, const char *fmt, int expert) {
  char tail[128];
  if (strstr(fmt, "%d")) snprintf(tail, sizeof tail, fmt, expert);
  else snprintf(tail, sizeof tail, "%s", fmt);
  if (layer >= CKPT_MTP_LAYER) snprintf(out, len, "mtp.%d.%s", layer - CKPT_MTP_LAYER, tail);
  else if (layer >= 0) snprintf(out, len, "layers.%d.%s", layer, tail);
  else snprintf(out, len, "%s", tail);
}

bool ckpt_is_mtp(const char *name) { return !strncmp(name, "mtp.", 4); }

bool ckpt_is_engram_table(const char *name) {
  int layer, n = 0;
  const struct ckpt_map_row *r = ckpt_map_find("engram.table", &layer);
  if (!r || sscanf(name, "layers.%d.%n", &layer, &n) != 1 || n == 0) return false;
  return !strcmp(name + n, r->released) || !strcmp(name + n, r->released2);
}

bool ckpt_is_vision(const char *name) {
  return !strncmp(name, "vision.", 7) || !strncmp(name, "aligner.", 8) || !strcmp(name, "image_start") ||
         !strcmp(name, "image_end") || !strcmp(name, "image_newline");
}

/* ---- codecs ------------------------------------------------------------------ */

float ckpt_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t ckpt_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static int64_t tiles(int64_t n) { return (n + CKPT_BLOCK - 1) / CKPT_BLOCK; }

void ckpt_fp8_quant(uint8_t *q, uint8_t *s, const float *x, int64_t rows, int64_t cols) {
  int64_t tc = tiles(cols);
  for (int64_t tr = 0; tr < tiles(rows); tr++)
    for (int64_t c0 = 0; c0 < tc; c0++) {
      int64_t r1 = tr * CKPT_BLOCK + CKPT_BLOCK < rows ? tr * CKPT_BLOCK + CKPT_BLOCK : rows;
      int64_t e1 = c0 * CKPT_BLOCK + CKPT_BLOCK < cols ? c0 * CKPT_BLOCK + CKPT_BLOCK : cols;
      float amax = 0;
      for (int64_t r = tr * CKPT_BLOCK; r < r1; r++)
        for (int64_t c = c0 * CKPT_BLOCK; c < e1; c++) amax = fmaxf(amax, fabsf(x[r * cols + c]));
      uint8_t code = op_e8m0_scale(amax, 448.0f, OP_MX_CEIL);
      float sc = op_e8m0_decode(code);
      s[tr * tc + c0] = code;
      for (int64_t r = tr * CKPT_BLOCK; r < r1; r++)
        for (int64_t c = c0 * CKPT_BLOCK; c < e1; c++) q[r * cols + c] = op_e4m3_encode(x[r * cols + c] / sc);
    }
}

/* The decoders go through tables built per call (256 + 256 entries: nothing
 * next to a tensor), the same values as op_e4m3_decode / op_e8m0_decode. */
void ckpt_fp8_dequant(float *x, const uint8_t *q, const uint8_t *s, int64_t rows, int64_t cols) {
  float e4[256], e8[256];
  for (int i = 0; i < 256; i++) e4[i] = op_e4m3_decode((uint8_t)i), e8[i] = op_e8m0_decode((uint8_t)i);
  int64_t tc = tiles(cols);
  for (int64_t r = 0; r < rows; r++) {
    const uint8_t *sr = s + (r / CKPT_BLOCK) * tc, *qr = q + r * cols;
    float *xr = x + r * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += CKPT_BLOCK) {
      float sc = e8[sr[c0 / CKPT_BLOCK]];
      int64_t e = c0 + CKPT_BLOCK < cols ? c0 + CKPT_BLOCK : cols;
      for (int64_t c = c0; c < e; c++) xr[c] = e4[qr[c]] * sc;
    }
  }
}

void ckpt_fp4_quant(uint8_t *q, uint8_t *s, const float *x, int64_t rows, int64_t cols) {
  int64_t g = cols / CKPT_BLOCK;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < g; k++) {
      const float *v = x + r * cols + k * CKPT_BLOCK;
      float amax = 0;
      for (int j = 0; j < CKPT_BLOCK; j++) amax = fmaxf(amax, fabsf(v[j]));
      uint8_t code = op_e8m0_scale(amax, 6.0f, OP_MX_CEIL);
      float sc = op_e8m0_decode(code);
      s[r * g + k] = code;
      uint8_t *o = q + r * (cols / 2) + k * (CKPT_BLOCK / 2);
      for (int j = 0; j < CKPT_BLOCK; j += 2)
        o[j / 2] = (uint8_t)(op_e2m1_encode(v[j] / sc) | (op_e2m1_encode(v[j + 1] / sc) << 4));
    }
}

void ckpt_fp4_dequant(float *x, const uint8_t *q, const uint8_t *s, int64_t rows, int64_t cols) {
  float e2[16], e8[256];
  for (int i = 0; i < 16; i++) e2[i] = op_e2m1_decode((uint8_t)i);
  for (int i = 0; i < 256; i++) e8[i] = op_e8m0_decode((uint8_t)i);
  int64_t g = cols / CKPT_BLOCK;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < g; k++) {
      float sc = e8[s[r * g + k]];
      const uint8_t *b = q + r * (cols / 2) + k * (CKPT_BLOCK / 2);
      float *o = x + r * cols + k * CKPT_BLOCK;
      for (int j = 0; j < CKPT_BLOCK / 2; j++) o[2 * j] = e2[b[j] & 15] * sc, o[2 * j + 1] = e2[b[j] >> 4] * sc;
    }
}
