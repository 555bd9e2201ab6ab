/* num_core_eval.h: the loops both builds of the numeric core run for
 * tests/test_num_core.c: included once by that C file (prefix nc_c_) and
 * once by tests/num_core_nvcc.cu (prefix nc_nvcc_), so the two compilers
 * evaluate the same ops/num_*.h source over the same inputs. NC_NAME(x)
 * names a function for the including build. */
#include "ops/num_codec.h"
#include "ops/num_engram.h"
#include "ops/num_sinkhorn.h"
#include "ops/num_softmax.h"
#include "tests/num_core_twin.h"

void NC_NAME(float_rules)(uint32_t *out, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t *o = out + i * NC_FLOAT_RULES;
    const float a = fabsf(x[i]);
    const uint32_t ab = op_hd_bits(a);
    o[0] = op_hd_e2m1_encode(x[i]);
    o[1] = op_hd_e4m3_encode(x[i]);
    o[2] = op_hd_e4m3_roundup(x[i]);
    o[3] = a < 464.0f ? op_hd_e4m3_code_fast(x[i]) : 0xFFFFu;
    o[4] = op_hd_fp4_scale_roundup(ab);
    o[5] = op_hd_fp4_scale_rne(ab, 0x1p-9f);
    o[6] = op_hd_f32_scale_bits(ab, 448.0f);
    o[7] = op_hd_f32_scale_bits(ab, 6.0f);
    o[8] = op_hd_bf16_round_bits(op_hd_bits(x[i]));
    o[9] = op_hd_bf16_encode(x[i]);
    o[10] = (uint32_t)op_hd_e8m0_floor_code(a < 0x1p127f ? a : 0x1p127f);
    o[11] = op_hd_rne_magnitude(a < 6.0f ? a : 6.0f, 1, 1);
  }
}

void NC_NAME(code_rules)(uint32_t *out) {
  for (int c = 0; c < 256; c++) {
    uint32_t *o = out + c * NC_CODE_RULES;
    o[0] = op_hd_bits(op_hd_e4m3_decode((uint8_t)c));
    o[1] = op_hd_bits(op_hd_e2m1_decode((uint8_t)c));
    o[2] = op_hd_bits(op_hd_e8m0_decode((uint8_t)c));
    o[3] = op_hd_bits(op_hd_bf16_decode((uint16_t)(c << 8 | c)));
  }
}

void NC_NAME(e2m1_scaled)(uint32_t *out, const float *x, const float *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const struct op_hd_e2m1_thr t = op_hd_e2m1_thresholds(s[i]);
    out[i] = op_hd_e2m1_code_scaled(x[i], &t);
  }
}

void NC_NAME(e8m0_scales)(uint32_t *out, const uint32_t *amax_bits, const int32_t *kmin, size_t n) {
  const uint32_t q6 = op_hd_bits(6.0f), q448 = op_hd_bits(448.0f);
  for (size_t i = 0; i < n; i++) {
    out[i * 4 + 0] = op_hd_e8m0_scale_bits(amax_bits[i], q6, 1, kmin[i]);
    out[i * 4 + 1] = op_hd_e8m0_scale_bits(amax_bits[i], q6, 0, 0);
    out[i * 4 + 2] = op_hd_e8m0_scale_bits(amax_bits[i], q448, 1, kmin[i]);
    out[i * 4 + 3] = op_hd_e8m0_scale_bits(amax_bits[i], q448, 0, 0);
  }
}

void NC_NAME(engram)(int64_t *row, const uint64_t *g, const uint64_t *mult, const int *order, const int64_t *prime,
                     const int64_t *offset, size_t n) {
  for (size_t i = 0; i < n; i++)
    row[i] = op_hd_engram_row(op_hd_engram_mix(g + 4 * i, mult + 4 * i, order[i]), prime[i], offset[i]);
}

void NC_NAME(sinkhorn)(float *C, const float *logits, int n, int hc, int iters, float eps) {
  for (int i = 0; i < n; i++)
    op_hd_sinkhorn(C + (size_t)i * hc * hc, 1, logits + (size_t)i * hc * hc, 1, hc, iters, eps);
}

/* One row: entries [lo, hi) of z with values v, in blocks; acc is a scalar
 * channel (sum of w v). */
static struct op_hd_online NC_NAME(softmax_part)(float *acc, const float *z, const float *v, int lo, int hi,
                                                 int block, int has_sink, float sink) {
  struct op_hd_online st = op_hd_online_start(has_sink, sink);
  *acc = 0.0f;
  for (int b0 = lo; b0 < hi; b0 += block) {
    const int b1 = hi - b0 < block ? hi : b0 + block;
    float mb = st.m;
    for (int b = b0; b < b1; b++) mb = z[b] > mb ? z[b] : mb;
    *acc = OP_HD_MUL(*acc, op_hd_online_raise(&st, mb));
    for (int b = b0; b < b1; b++) *acc = OP_HD_ADD(*acc, OP_HD_MUL(op_hd_online_weight(&st, z[b]), v[b]));
  }
  return st;
}

void NC_NAME(softmax)(float *o, const float *z, const float *v, const float *sink, int n, int k, int block,
                      int split) {
  for (int i = 0; i < n; i++) {
    const float *zi = z + (size_t)i * k;
    float acc;
    const int half = split ? k / 2 : k;
    struct op_hd_online st = NC_NAME(softmax_part)(&acc, zi, v, 0, half, block, sink != NULL, sink ? sink[i] : 0.0f);
    if (split) {
      float acc2, ca, cb;
      const struct op_hd_online st2 = NC_NAME(softmax_part)(&acc2, zi, v, half, k, block, 0, 0.0f);
      op_hd_online_merge(&st, st2, &ca, &cb);
      acc = OP_HD_ADD(OP_HD_MUL(acc, ca), OP_HD_MUL(acc2, cb));
    }
    o[i] = op_hd_online_out(acc, st.l);
  }
}
