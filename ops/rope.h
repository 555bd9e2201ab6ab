/* rope.h: partial rotary position embedding (SPEC 1.1, 3.5, 3.12, R.2).
 *
 * Rotates the last `rope_dim` of `dim` channels of each row (or the first,
 * when `last` is false), pairing ADJACENT channels (2i, 2i+1) of that slice:
 *   (a, b) -> (a cos t - b sin t, a sin t + b cos t),  t = pos * freq[i]
 * freq[i] = theta^(-2i/rope_dim), corrected by YaRN when enabled (R.2:
 * freq = freq/factor*(1-smooth) + freq*smooth, smooth = 1 - ramp over the
 * dimension index between the beta_fast/beta_slow correction range for
 * original_len). The angle pos*freq is formed in double precision (SPEC 3.1
 * precision note) before sin/cos. Inverse RoPE is the same with -pos.
 *
 * YaRN correction range, as DeepSeek's reference precompute_freqs_cis:
 *   c(beta) = rope_dim * ln(original_len / (2 pi beta)) / (2 ln theta)
 *   low = max(floor(c(beta_fast)), 0), high = min(ceil(c(beta_slow)), rope_dim-1)
 *   (high += 0.001 when low == high), ramp(i) = clamp((i-low)/(high-low), 0, 1)
 * The clamp bound is rope_dim - 1 (the reference's `dim - 1`), not the last
 * pair index rope_dim/2 - 1; the two agree whenever ceil(c(beta_slow)) <=
 * rope_dim/2 - 1, as at SPEC's defaults (theta 160000, 65536, 32/1, 64 dims:
 * low 15, high 25). mscale is not applied (SPEC 1.1: disabled).
 * Precision: cos and sin are taken in double and rounded to float; each
 * output is then one fp32 two-term combination, a*c - b*s or a*s + b*c.
 *
 * Not here: which layers use which theta (the plan decides; ops take the
 * parameters).
 * Test: tests/test_ops_rope.c (ctest -R ops_rope).
 */
#ifndef CEDAR_OPS_ROPE_H
#define CEDAR_OPS_ROPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

/* The RoPE/YaRN parameters of one class of layers: one struct for the ops
 * (op_rope_init_params, and the descriptors' parameters OP_ROPE_PARAM_LIST
 * below) and the plan (model.rope.swa and model.rope.csa in scheduler/plan.h,
 * whose keys are these field names). */
struct op_rope_params {
  double theta;              /* RoPE base */
  bool yarn;                 /* apply the YaRN frequency correction */
  double yarn_factor;        /* interpolation factor of the low frequencies */
  int64_t yarn_original_len; /* the pre-training context length */
  double yarn_beta_fast, yarn_beta_slow; /* the correction range, in turns */
  bool yarn_mscale;          /* a plan key only, never applied (SPEC 1.1: disabled) */
  bool angle_f32;            /* angle = fp32 (float)pos * (float)freq, the vendor's (Appendix V #8);
                                false: pos * freq in double (SPEC 3.1's precision note) */
};

/* SPEC defaults [R-cfg], the vendor's values: CSA2 (ratio-1 and ratio-2)
 * layers theta 160000 with YaRN factor 16, original_len 65536, beta_fast 32,
 * beta_slow 1; SWA-only layers theta 10000 without YaRN (the YaRN fields keep
 * the same values, unused). The descriptors' parameter defaults are the CSA2
 * ones. The numbers are macros because static initializers (the op_param
 * lists) need constant expressions. */
#define OP_ROPE_THETA_CSA 160000
#define OP_ROPE_THETA_SWA 10000
#define OP_ROPE_YARN_FACTOR 16
#define OP_ROPE_YARN_ORIGINAL_LEN 65536
#define OP_ROPE_YARN_BETA_FAST 32
#define OP_ROPE_YARN_BETA_SLOW 1
#define OP_ROPE_PARAMS_INIT(theta_, yarn_)                                                                  \
  {.theta = (theta_), .yarn = (yarn_), .yarn_factor = OP_ROPE_YARN_FACTOR,                                  \
   .yarn_original_len = OP_ROPE_YARN_ORIGINAL_LEN, .yarn_beta_fast = OP_ROPE_YARN_BETA_FAST,                \
   .yarn_beta_slow = OP_ROPE_YARN_BETA_SLOW, .yarn_mscale = false, .angle_f32 = true}
extern const struct op_rope_params op_rope_params_csa; /* OP_ROPE_PARAMS_INIT(OP_ROPE_THETA_CSA, true) */
extern const struct op_rope_params op_rope_params_swa; /* OP_ROPE_PARAMS_INIT(OP_ROPE_THETA_SWA, false) */

/* The op_param entries of struct op_rope_params, for a descriptor's .params
 * list (ops/registry.h must be included where it expands); each descriptor
 * adds its own rotated-width and position parameters beside them, and
 * op_rope_from_params reads them back. yarn_mscale is not an op parameter:
 * the ops never apply it. */
#define OP_ROPE_PARAM_LIST                                                                           \
  {"theta", OP_PARAM_FLOAT, OP_ROPE_THETA_CSA,                                                       \
   "RoPE base [R-cfg]: 160000 on CSA2 layers, 10000 (yarn=0) SWA-only"},                             \
  {"yarn", OP_PARAM_BOOL, 1, "YaRN correction [R-cfg]: on for CSA2 layers, off for SWA-only ones"},   \
  {"yarn_factor", OP_PARAM_FLOAT, OP_ROPE_YARN_FACTOR, "YaRN factor [R-cfg]"},                       \
  {"yarn_original_len", OP_PARAM_INT, OP_ROPE_YARN_ORIGINAL_LEN, "YaRN original length [R-cfg]"},    \
  {"yarn_beta_fast", OP_PARAM_FLOAT, OP_ROPE_YARN_BETA_FAST, "YaRN beta_fast [R-cfg]"},              \
  {"yarn_beta_slow", OP_PARAM_FLOAT, OP_ROPE_YARN_BETA_SLOW, "YaRN beta_slow [R-cfg]"}

struct op_rope {
  int dim;       /* row width */
  int rope_dim;  /* rotated channels (even) */
  bool last;     /* rotate the last rope_dim channels (else the first) */
  double theta;
  bool yarn;
  double yarn_factor, yarn_beta_fast, yarn_beta_slow;
  int64_t yarn_original_len;
  double freq[512]; /* rope_dim/2 inverse frequencies, filled by op_rope_init */
  bool angle_f32;   /* fp32 angles (op_rope_params.angle_f32); op_rope_init sets false */
};

/* Fill r->freq from the parameters; returns 0, or -1 (r untouched) when
 * rope_dim is odd, negative, larger than dim or than 1024, when theta is not
 * a positive finite number, or, with yarn, when theta <= 1, factor <= 0,
 * original_len <= 0 or a beta <= 0 (the correction range divides by
 * ln theta and takes ln(original_len / beta)). SPEC defaults [R-cfg]:
 * CSA2 layers theta 160000, YaRN factor 16, original_len 65536, beta_fast
 * 32, beta_slow 1; SWA-only layers theta 10000 without YaRN. */
int op_rope_init(struct op_rope *r, int dim, int rope_dim, bool last, double theta, bool yarn, double factor,
                 int64_t original_len, double beta_fast, double beta_slow);
/* The same with the parameters from one struct (the plan's, or
 * op_rope_params_csa/_swa, whose angles are fp32 as the vendor's);
 * p->yarn_mscale is ignored, as above. */
int op_rope_init_params(struct op_rope *r, int dim, int rope_dim, bool last, const struct op_rope_params *p);

/* Rotate rows in place. x: (n, heads, dim) with row stride ld (>= heads*dim);
 * every head of row i uses position pos[i]. sign = +1 for RoPE, -1 (any
 * negative value) for the inverse. Only the rope slice of each head is
 * written; other channels and the columns past heads*dim keep their bits. */
void op_rope_apply(float *x /* (n, ld) */, const struct op_rope *r, const int64_t *pos /* (n) */, int n, int heads,
                   int ld, int sign);

/* The cos and sin of some rows' angles under one RoPE's frequencies,
 * computed once and applied to every tensor rotated at those rows: a layer's
 * attention tile rotates q, qI, kS, its compressed entries and (inverse) its
 * output at the same positions, by the same angles wherever the frequencies
 * agree (op_rope_same_angles). Rotating through a table gives the bits of
 * op_rope_apply: the same cos/sin, rounded to float the same way, in the
 * same two-term expressions (and sin(-t) == -sin(t) exactly for the inverse). */
struct op_rope_angles {
  const struct op_rope *rope; /* the frequencies they were computed under */
  const int64_t *pos;         /* (n) the rows' positions (the caller's array) */
  int n;
  float *cs, *sn;             /* (n, rope->rope_dim / 2) each */
};

/* Floats a table of n rows needs: 2 n rope_dim / 2. */
size_t op_rope_angles_floats(const struct op_rope *r, int n);
/* Compute the table for positions pos[0, n) in buf (op_rope_angles_floats);
 * a keeps pointers to r, pos and buf. */
void op_rope_angles_init(struct op_rope_angles *a, float *buf, const struct op_rope *r, const int64_t *pos, int n);
/* Rotate n rows of x (layout as op_rope_apply) by the table's rows
 * [row0, row0 + n), under r's geometry (dim, rope_dim, last). r must have the
 * table's angles (op_rope_same_angles with a->rope: asserted). Bitwise
 * op_rope_apply(x, r, a->pos + row0, n, heads, ld, sign). */
void op_rope_rotate(float *x /* (n, ld) */, const struct op_rope *r, const struct op_rope_angles *a, int row0, int n,
                    int heads, int ld, int sign);

/* Two rows at one position, each rotated (sign +1) under its own RoPE:
 * bitwise op_rope_apply(x, rx, &pos, 1, 1, rx->dim, +1) and the same for y
 * under ry. When rx and ry have the same angles (op_rope_same_angles) the
 * cos/sin are computed once for both. */
void op_rope_apply_two(float *x /* (rx->dim) */, const struct op_rope *rx, float *y /* (ry->dim) */,
                       const struct op_rope *ry, int64_t pos);

/* Whether a and b rotate by the same angles at every position: the same
 * rope_dim and the same frequencies, bit for bit. */
bool op_rope_same_angles(const struct op_rope *a, const struct op_rope *b);

/* For op descriptors (ops/registry.h): the RoPE described by a descriptor's
 * parameters `dim_param` (rotated channels), `last_param`, and the shared
 * OP_ROPE_PARAM_LIST, for rows of `dim`; false after op_io_fail when
 * invalid. */
struct op_desc;
struct op_io;
bool op_rope_from_params(const struct op_desc *self, struct op_io *io, const char *dim_param,
                         const char *last_param, int dim, struct op_rope *r);

/* The rope descriptor's checked call (inputs, RoPE, output allocated), shared
 * by its CPU run and the CUDA twin (kernels/rope.cu): 0 or the status after
 * op_io_fail. y is the output (not yet a copy of x); sign +1, or -1 inverse. */
struct op_rope_call {
  const float *x;
  const int64_t *pos;
  float *y;
  int n, heads, sign;
  struct op_rope r;
};
int op_rope_prepare(const struct op_desc *self, struct op_io *io, struct op_rope_call *c);

#ifdef __cplusplus
}
#endif

#endif
