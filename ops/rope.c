/* rope.c: partial rotary position embedding with optional YaRN (see rope.h).
 *
 * What it is: the CPU reference of RoPE and inverse RoPE (SPEC 3.5, 3.6,
 * 3.12, R.2). Frequencies and angles are double; each rotation is applied in
 * float from cos/sin rounded to float, so a CUDA twin that takes its cos/sin
 * from a double-precision table reproduces these results to a few ulps.
 *
 * What it is not: a position table cache. sin/cos are computed once per
 * (row, pair) and shared by all heads of the row; a caller that rotates
 * several tensors at the same rows computes them once for all of them with
 * op_rope_angles_init (the model does, per attention tile).
 *
 * Test: ctest --test-dir build -R ops_rope --output-on-failure
 */
#include "ops/rope.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "ops/registry.h"
#include "base/check.h"

/* M_PI is not in strict C11 (<math.h> under _POSIX_C_SOURCE only). */
#define ROPE_PI 3.14159265358979323846
#define ROPE_MAX_PAIRS ((int)(sizeof(((struct op_rope *)0)->freq) / sizeof(double)))

/* The dimension index at which a frequency makes `rotations` full turns over
 * `len` positions, solved from len * theta^(-2i/rope_dim) = 2 pi rotations
 * (YaRN's "correction dimension", in pair-index units of rope_dim/2 when
 * rope_dim is the full rotated width). */
static double yarn_correction_dim(double rotations, int rope_dim, double theta, double len) {
  return rope_dim * log(len / (rotations * 2.0 * ROPE_PI)) / (2.0 * log(theta));
}

/* YaRN (R.2): pairs below `low` (many turns within the original length) keep
 * their frequency, pairs above `high` are interpolated (divided by factor),
 * and a linear ramp blends the two in between. The range is clamped to
 * [0, rope_dim - 1] as DeepSeek's reference precompute_freqs_cis does (not to
 * rope_dim/2 - 1: see the note in rope.h). */
static void yarn_correct(double *freq, int rope_dim, double theta, double factor, double len, double beta_fast,
                         double beta_slow) {
  double low = floor(yarn_correction_dim(beta_fast, rope_dim, theta, len));
  double high = ceil(yarn_correction_dim(beta_slow, rope_dim, theta, len));
  if (low < 0) low = 0;
  if (high > rope_dim - 1) high = rope_dim - 1;
  if (low == high) high += 0.001; /* the reference's guard against a zero-width ramp */
  for (int i = 0; i < rope_dim / 2; i++) {
    double ramp = (i - low) / (high - low);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    double smooth = 1.0 - ramp;
    freq[i] = freq[i] / factor * (1.0 - smooth) + freq[i] * smooth;
  }
}

int op_rope_init(struct op_rope *r, int dim, int rope_dim, bool last, double theta, bool yarn, double factor,
                 int64_t original_len, double beta_fast, double beta_slow) {
  if (rope_dim < 0 || rope_dim % 2 != 0 || rope_dim > dim || rope_dim / 2 > ROPE_MAX_PAIRS) return -1;
  if (!(theta > 0) || !isfinite(theta)) return -1;
  /* YaRN divides by log(theta) and takes log(original_len / beta). */
  if (yarn && (!(theta > 1) || !(factor > 0) || !isfinite(factor) || original_len <= 0 || !(beta_fast > 0) ||
               !(beta_slow > 0)))
    return -1;

  memset(r, 0, sizeof *r);
  r->dim = dim;
  r->rope_dim = rope_dim;
  r->last = last;
  r->theta = theta;
  r->yarn = yarn;
  r->yarn_factor = factor;
  r->yarn_beta_fast = beta_fast;
  r->yarn_beta_slow = beta_slow;
  r->yarn_original_len = original_len;
  for (int i = 0; i < rope_dim / 2; i++) r->freq[i] = 1.0 / pow(theta, (2.0 * i) / rope_dim);
  if (yarn) yarn_correct(r->freq, rope_dim, theta, factor, (double)original_len, beta_fast, beta_slow);
  return 0;
}

const struct op_rope_params op_rope_params_csa = OP_ROPE_PARAMS_INIT(OP_ROPE_THETA_CSA, true);
const struct op_rope_params op_rope_params_swa = OP_ROPE_PARAMS_INIT(OP_ROPE_THETA_SWA, false);

int op_rope_init_params(struct op_rope *r, int dim, int rope_dim, bool last, const struct op_rope_params *p) {
  int rc = op_rope_init(r, dim, rope_dim, last, p->theta, p->yarn, p->yarn_factor, p->yarn_original_len,
                        p->yarn_beta_fast, p->yarn_beta_slow);
  if (!rc) r->angle_f32 = p->angle_f32;
  return rc;
}

/* cos and sin of pos * freq[j] for the rope_dim / 2 pairs. SPEC 3.1
 * precision note: pos * freq in double, so the angle keeps ~1e-10 rad at pos
 * 1e6 where float would lose ~0.06 rad. With angle_f32 the angle is the
 * vendor's fp32 product (float)pos * (float)freq (Appendix V #8), then cos
 * and sin of that float in double. sin(-t) is -sin(t) exactly, so the
 * inverse is the transpose bit for bit. */
static void row_angles(float *cs, float *sn, const struct op_rope *r, int64_t pos, int sign) {
  for (int j = 0; j < r->rope_dim / 2; j++) {
    double t = r->angle_f32 ? (double)((float)pos * (float)r->freq[j]) : (double)pos * r->freq[j];
    cs[j] = (float)cos(t);
    sn[j] = (float)(sign < 0 ? -sin(t) : sin(t));
  }
}

/* The rope slice of every head of one row, by the given angles. */
static void rotate_row(float *x, const struct op_rope *r, const float *cs, const float *sn, int heads) {
  const int half = r->rope_dim / 2, off = r->last ? r->dim - r->rope_dim : 0;
  for (int h = 0; h < heads; h++) {
    float *v = x + (size_t)h * r->dim + off;
    for (int j = 0; j < half; j++) {
      float a = v[2 * j], b = v[2 * j + 1];
      v[2 * j] = a * cs[j] - b * sn[j];
      v[2 * j + 1] = a * sn[j] + b * cs[j];
    }
  }
}

void op_rope_apply(float *x, const struct op_rope *r, const int64_t *pos, int n, int heads, int ld, int sign) {
  float cs[ROPE_MAX_PAIRS], sn[ROPE_MAX_PAIRS];
  for (int i = 0; i < n; i++) { /* angles once per row, shared by all heads */
    row_angles(cs, sn, r, pos[i], sign);
    rotate_row(x + (size_t)i * ld, r, cs, sn, heads);
  }
}

size_t op_rope_angles_floats(const struct op_rope *r, int n) {
  return 2 * (size_t)(n > 0 ? n : 0) * (size_t)(r->rope_dim / 2);
}

void op_rope_angles_init(struct op_rope_angles *a, float *buf, const struct op_rope *r, const int64_t *pos, int n) {
  const size_t half = (size_t)(r->rope_dim / 2);
  *a = (struct op_rope_angles){.rope = r, .pos = pos, .n = n, .cs = buf, .sn = buf + (size_t)n * half};
  for (int i = 0; i < n; i++) row_angles(a->cs + i * half, a->sn + i * half, r, pos[i], +1);
}

void op_rope_rotate(float *x, const struct op_rope *r, const struct op_rope_angles *a, int row0, int n, int heads,
                    int ld, int sign) {
  CEDAR_ASSERT_MSG(op_rope_same_angles(r, a->rope) && row0 >= 0 && row0 + n <= a->n,
                   "op_rope_rotate: rows [%d, %d) of a %d-row table, or other frequencies", row0, row0 + n, a->n);
  const int half = r->rope_dim / 2;
  float neg[ROPE_MAX_PAIRS];
  for (int i = 0; i < n; i++) {
    const float *cs = a->cs + (size_t)(row0 + i) * half, *sn = a->sn + (size_t)(row0 + i) * half;
    if (sign < 0) { /* (float)-sin(t) == -(float)sin(t): rounding is symmetric */
      for (int j = 0; j < half; j++) neg[j] = -sn[j];
      sn = neg;
    }
    rotate_row(x + (size_t)i * ld, r, cs, sn, heads);
  }
}

bool op_rope_same_angles(const struct op_rope *a, const struct op_rope *b) {
  return a->rope_dim == b->rope_dim && a->angle_f32 == b->angle_f32 &&
         !memcmp(a->freq, b->freq, (size_t)(a->rope_dim / 2) * sizeof a->freq[0]);
}

void op_rope_apply_two(float *x, const struct op_rope *rx, float *y, const struct op_rope *ry, int64_t pos) {
  float cs[ROPE_MAX_PAIRS], sn[ROPE_MAX_PAIRS];
  row_angles(cs, sn, rx, pos, +1);
  rotate_row(x, rx, cs, sn, 1);
  if (!op_rope_same_angles(rx, ry)) row_angles(cs, sn, ry, pos, +1);
  rotate_row(y, ry, cs, sn, 1);
}

/* ---- registry descriptor (ops/registry.h) ------------------------------- */

bool op_rope_from_params(const struct op_desc *self, struct op_io *io, const char *dim_param,
                         const char *last_param, int dim, struct op_rope *r) {
  double rd, last, yarn, olen;
  if (!op_io_param_in(self, io, dim_param, 0, INT_MAX, &rd) || !op_io_param_in(self, io, last_param, 0, 1, &last) ||
      !op_io_param_in(self, io, "yarn", 0, 1, &yarn) ||
      !op_io_param_in(self, io, "yarn_original_len", 1, 0x1p53, &olen))
    return false;
  const struct op_rope_params p = {.theta = op_io_param(self, io, "theta"),
                                   .yarn = yarn != 0,
                                   .yarn_factor = op_io_param(self, io, "yarn_factor"),
                                   .yarn_original_len = (int64_t)olen,
                                   .yarn_beta_fast = op_io_param(self, io, "yarn_beta_fast"),
                                   .yarn_beta_slow = op_io_param(self, io, "yarn_beta_slow")};
  if (op_rope_init_params(r, dim, (int)rd, last != 0, &p)) {
    op_io_fail(io, "%s: invalid RoPE: %s %d must be even, <= the row width %d and <= 1024; theta positive (> 1 "
                   "with yarn); yarn_factor and betas positive", self->name, dim_param, (int)rd, dim);
    return false;
  }
  return true;
}

int op_rope_prepare(const struct op_desc *self, struct op_io *io, struct op_rope_call *c) {
  int64_t xd[3], pd[1];
  const struct op_tensor *x = op_io_in(self, io, "x", 3, xd);
  const struct op_tensor *pos = x ? op_io_in(self, io, "pos", 1, pd) : NULL;
  if (!pos) return CEDAR_EINVAL;
  if (pd[0] != xd[0]) return op_io_fail(io, "rope: %lld positions for %lld rows", (long long)pd[0], (long long)xd[0]);
  if (!op_rope_from_params(self, io, "rope_dim", "last", (int)xd[2], &c->r)) return CEDAR_EINVAL;
  float *y = op_io_out(self, io, "y", 3, xd);
  if (!y) return CEDAR_ENOMEM;
  c->x = x->data, c->pos = pos->data, c->y = y, c->n = (int)xd[0], c->heads = (int)xd[1];
  c->sign = op_io_param(self, io, "inverse") != 0 ? -1 : 1;
  return 0;
}

static int rope_run(const struct op_desc *self, struct op_io *io) {
  struct op_rope_call c = {0};
  int rc = op_rope_prepare(self, io, &c);
  if (rc) return rc;
  memcpy(c.y, c.x, (size_t)c.n * c.heads * c.r.dim * sizeof *c.y);
  op_rope_apply(c.y, &c.r, c.pos, c.n, c.heads, c.heads * c.r.dim, c.sign);
  return 0;
}

const struct op_desc op_desc_rope = {
    .name = "rope",
    .summary = "partial RoPE on adjacent pairs, with YaRN; inverse with inverse=1 (SPEC 3.5, 3.12)",
    .inputs = (const struct op_arg[]){{"x", OP_F32, "(n, heads, dim)", "rows to rotate"},
                                      {"pos", OP_I64, "(n)", "absolute position of each row"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"y", OP_F32, "(n, heads, dim)", "rotated rows"}, {0}},
    .params = (const struct op_param[]){{"rope_dim", OP_PARAM_INT, 64, "rotated channels [A]"},
                                        {"last", OP_PARAM_BOOL, 1, "rotate the last rope_dim channels (else the first)"},
                                        OP_ROPE_PARAM_LIST,
                                        {"inverse", OP_PARAM_BOOL, 0, "rotate by -pos"},
                                        {0}},
    .run = rope_run,
};
