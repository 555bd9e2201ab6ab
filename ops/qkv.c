/* qkv.c: query path, indexer query/weights and SWA KV projection (see qkv.h).
 *
 * Each op is a linear layer (op_qlinear over the weight's view: op_linear
 * itself for an F32 matrix, ops/qlinear.h for a stored FP8 / FP4 / BF16 one) written straight into its output,
 * followed by per-row work done in place: RMSNorm, the per-head norm (an
 * RMSNorm without weight over rows of head_dim), RoPE. Every step is
 * row-independent bit for bit (op_linear too: ops/basic.h), so a position's
 * results do not depend on how many positions share the call.
 *
 * Test: tests/test_ops_qkv.c (ctest -R ops_qkv).
 */
#include "ops/qkv.h"

#include "ops/basic.h"
#include "ops/qlinear.h"
#include "base/check.h"

void op_q_latent_q(float *cq, const float *u, const struct op_qweight *W_qa, const float *gamma_q, int n, float eps) {
  op_qlinear(cq, u, W_qa, n, W_qa->in, W_qa->out);
  op_rmsnorm(cq, cq, gamma_q, n, W_qa->out, eps);
}

void op_q_latent(float *cq, const float *u, const float *W_qa, const float *gamma_q, int n, int hidden, int q_rank,
                 float eps) {
  struct op_qweight w = op_qw_f32(W_qa, q_rank, hidden);
  op_q_latent_q(cq, u, &w, gamma_q, n, eps);
}

void op_q_main(float *q, const float *cq, const float *W_qb, const struct op_rope_angles *ang,
               const struct op_rope *rope, int n, int q_rank, int heads, int head_dim, bool head_norm, float eps) {
  struct op_qweight w = op_qw_f32(W_qb, heads * head_dim, q_rank);
  op_q_main_q(q, cq, &w, ang, rope, n, heads, head_dim, head_norm, eps);
}

void op_q_main_q(float *q, const float *cq, const struct op_qweight *W_qb, const struct op_rope_angles *ang,
                 const struct op_rope *rope, int n, int heads, int head_dim, bool head_norm, float eps) {
  CEDAR_ASSERT(rope->dim == head_dim && W_qb->out == heads * head_dim);
  const int width = heads * head_dim;
  op_qlinear(q, cq, W_qb, n, W_qb->in, width);
  /* (n, heads*head_dim) row-major is (n*heads, head_dim): one weightless
   * RMSNorm row per head is exactly q_h *= rsqrt(mean(q_h^2) + eps) (R.2). */
  if (head_norm) op_rmsnorm(q, q, NULL, n * heads, head_dim, eps);
  op_rope_rotate(q, rope, ang, 0, n, heads, width, +1);
}

void op_q_indexer(float *qI, const float *cq, const float *W_iq, const struct op_rope_angles *ang,
                  const struct op_rope *rope_i, int n, int q_rank, int idx_heads, int idx_dim) {
  struct op_qweight w = op_qw_f32(W_iq, idx_heads * idx_dim, q_rank);
  op_q_indexer_q(qI, cq, &w, ang, rope_i, n, idx_heads, idx_dim);
}

void op_q_indexer_q(float *qI, const float *cq, const struct op_qweight *W_iq, const struct op_rope_angles *ang,
                    const struct op_rope *rope_i, int n, int idx_heads, int idx_dim) {
  CEDAR_ASSERT(rope_i->dim == idx_dim && W_iq->out == idx_heads * idx_dim);
  const int width = idx_heads * idx_dim;
  op_qlinear(qI, cq, W_iq, n, W_iq->in, width);
  op_rope_rotate(qI, rope_i, ang, 0, n, idx_heads, width, +1);
}

void op_index_weights(float *w, const float *u, const float *W_w, int n, int hidden, int idx_heads, float scale) {
  op_linear(w, u, W_w, n, hidden, idx_heads, hidden, idx_heads);
  if (scale == 1.0f) return;
  for (size_t i = 0; i < (size_t)n * idx_heads; i++) w[i] *= scale;
}

void op_swa_kv(float *kS, const float *u, const float *W_kv, const float *gamma, const struct op_rope_angles *ang,
               const struct op_rope *rope, int n, int hidden, int head_dim, float eps) {
  struct op_qweight w = op_qw_f32(W_kv, head_dim, hidden);
  op_swa_kv_q(kS, u, &w, gamma, ang, rope, n, eps);
}

void op_swa_kv_q(float *kS, const float *u, const struct op_qweight *W_kv, const float *gamma,
                 const struct op_rope_angles *ang, const struct op_rope *rope, int n, float eps) {
  const int head_dim = W_kv->out;
  CEDAR_ASSERT(rope->dim == head_dim);
  op_qlinear(kS, u, W_kv, n, W_kv->in, head_dim);
  op_rmsnorm(kS, kS, gamma, n, head_dim, eps);
  op_rope_rotate(kS, rope, ang, 0, n, 1, head_dim, +1);
}

void op_swa_pack(uint8_t *out, const float *kS, int n, int w, const struct op_kv_format *fmt, size_t stride) {
  size_t bytes = op_kv_bytes(fmt, w);
  CEDAR_ASSERT_MSG(bytes > 0 && stride >= bytes, "op_swa_pack: w %d, block %d, stride %zu (entry is %zu B)", w,
                   fmt->block, stride, bytes);
  for (int i = 0; i < n; i++) op_kv_pack(fmt, out + (size_t)i * stride, kS + (size_t)i * w, w);
}

/* ---- registry descriptors (ops/registry.h) ------------------------------ */
/* `cedar op q_latent`, q_main, q_indexer, index_weights, swa_kv. Every input
 * is checked against the others before the op runs.
 * Test: tests/test_op_desc_attn.c (ctest -R op_desc_attn). */

#include <float.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ops/registry.h"

#define QKV_ROPE_PARAMS_                                                                                   \
  {"rope_dim", OP_PARAM_INT, 64, "rotated channels per head, 0 = none [A: 64 of 512; R-cfg: 64 of 128]"},   \
  {"last", OP_PARAM_BOOL, 1, "rotate the last rope_dim channels, else the first [A; R-cfg for the indexer]"}, \
  OP_ROPE_PARAM_LIST
#define QKV_EPS_ {"eps", OP_PARAM_FLOAT, 1e-6, "RMSNorm epsilon, model.norm_eps [R]"}

/* u (n, hidden) and a weight (out, hidden) whose rows it multiplies. */
static bool read_proj(const struct op_desc *self, struct op_io *io, const char *wname, const struct op_tensor **u,
                      int64_t *ud, const struct op_tensor **W, int64_t *wd) {
  *u = op_io_in(self, io, "u", 2, ud);
  *W = *u ? op_io_in(self, io, wname, 2, wd) : NULL;
  if (!*W) return false;
  if (wd[1] != ud[1])
    return op_io_fail(io, "%s: %s is (%lld, %lld) but u is (%lld, %lld): rows of u must have %lld values",
                      self->name, wname, (long long)wd[0], (long long)wd[1], (long long)ud[0], (long long)ud[1],
                      (long long)wd[1]),
           false;
  return true;
}

/* An optional weight vector of `len` values; false after op_io_fail when it
 * is present but misshapen, true with *out = NULL when absent. */
static bool read_gamma(const struct op_desc *self, struct op_io *io, const char *name, int64_t len,
                       const char *of, const float **out) {
  int64_t gd[1];
  *out = NULL;
  if (!io->input(io, name)) return true;
  const struct op_tensor *g = op_io_in(self, io, name, 1, gd);
  if (!g) return false;
  if (gd[0] != len)
    return op_io_fail(io, "%s: %s has %lld values but %s has %lld", self->name, name, (long long)gd[0], of,
                      (long long)len),
           false;
  *out = g->data;
  return true;
}

/* pos (n) I64 beside a tensor `of` of n rows. */
static const int64_t *read_pos(const struct op_desc *self, struct op_io *io, int64_t n, const char *of) {
  int64_t pd[1];
  const struct op_tensor *p = op_io_in(self, io, "pos", 1, pd);
  if (p && pd[0] != n) {
    op_io_fail(io, "%s: pos has %lld positions but %s has %lld rows", self->name, (long long)pd[0], of,
               (long long)n);
    return NULL;
  }
  return p ? p->data : NULL;
}

/* The angles of n rows at pos, in *buf (the caller frees it); false when
 * out of memory. */
static bool angles_at(struct op_rope_angles *a, float **buf, const struct op_rope *r, const int64_t *pos, int n) {
  *buf = malloc((op_rope_angles_floats(r, n) + 1) * sizeof **buf);
  if (!*buf) return false;
  op_rope_angles_init(a, *buf, r, pos, n);
  return true;
}

int op_q_latent_prepare(const struct op_desc *self, struct op_io *io, struct op_qkv_call *c) {
  const struct op_tensor *u, *W;
  int64_t ud[2], wd[2];
  const float *gamma;
  double eps;
  if (!read_proj(self, io, "W_qa", &u, ud, &W, wd) || !read_gamma(self, io, "gamma_q", wd[0], "W_qa", &gamma) ||
      !op_io_param_in(self, io, "eps", 0, DBL_MAX, &eps))
    return CEDAR_EINVAL;
  float *cq = op_io_out(self, io, "cq", 2, (int64_t[]){ud[0], wd[0]});
  if (!cq) return CEDAR_ENOMEM;
  *c = (struct op_qkv_call){.x = u->data, .W = W->data, .gamma = gamma, .out = cq, .n = (int)ud[0],
                            .in = (int)ud[1], .rows = (int)wd[0], .eps = (float)eps};
  return 0;
}

static int q_latent_run(const struct op_desc *self, struct op_io *io) {
  struct op_qkv_call c;
  int rc = op_q_latent_prepare(self, io, &c);
  if (!rc) op_q_latent(c.out, c.x, c.W, c.gamma, c.n, c.in, c.rows, c.eps);
  return rc;
}

/* q_main and q_indexer: cq (n, q_rank) through W (heads*head_dim, q_rank),
 * per-head norm (main only), RoPE at pos. */
int op_q_heads_prepare(const struct op_desc *self, struct op_io *io, bool main, struct op_qkv_call *c) {
  const char *wname = main ? "W_qb" : "W_iq";
  int64_t cd[2], wd[2];
  double heads, hd, norm = 0, eps = 0;
  const struct op_tensor *cq = op_io_in(self, io, "cq", 2, cd);
  const struct op_tensor *W = cq ? op_io_in(self, io, wname, 2, wd) : NULL;
  const int64_t *pos = W ? read_pos(self, io, cd[0], "cq") : NULL;
  if (!pos || !op_io_param_in(self, io, "heads", 1, INT_MAX, &heads) || !op_io_param_in(self, io, "head_dim", 1, INT_MAX, &hd) ||
      (main && (!op_io_param_in(self, io, "head_norm", 0, 1, &norm) || !op_io_param_in(self, io, "eps", 0, DBL_MAX, &eps))))
    return CEDAR_EINVAL;
  if (wd[0] != (int64_t)(heads * hd) || wd[1] != cd[1])
    return op_io_fail(io, "%s: %s is (%lld, %lld) but heads %g x head_dim %g over cq (%lld, %lld) needs (%lld, %lld)",
                      self->name, wname, (long long)wd[0], (long long)wd[1], heads, hd, (long long)cd[0],
                      (long long)cd[1], (long long)(heads * hd), (long long)cd[1]);
  memset(c, 0, sizeof *c);
  if (!op_rope_from_params(self, io, "rope_dim", "last", (int)hd, &c->rope)) return CEDAR_EINVAL;
  float *q = op_io_out(self, io, main ? "q" : "qI", 3, (int64_t[]){cd[0], (int64_t)heads, (int64_t)hd});
  if (!q) return CEDAR_ENOMEM;
  c->x = cq->data, c->W = W->data, c->pos = pos, c->out = q, c->n = (int)cd[0], c->in = (int)cd[1];
  c->rows = (int)wd[0], c->heads = (int)heads, c->head_dim = (int)hd, c->head_norm = norm != 0, c->eps = (float)eps;
  return 0;
}

static int q_heads_run(const struct op_desc *self, struct op_io *io, bool main) {
  struct op_qkv_call c;
  int rc = op_q_heads_prepare(self, io, main, &c);
  if (rc) return rc;
  struct op_rope_angles ang;
  float *abuf;
  if (!angles_at(&ang, &abuf, &c.rope, c.pos, c.n)) return CEDAR_ENOMEM;
  if (main)
    op_q_main(c.out, c.x, c.W, &ang, &c.rope, c.n, c.in, c.heads, c.head_dim, c.head_norm, c.eps);
  else
    op_q_indexer(c.out, c.x, c.W, &ang, &c.rope, c.n, c.in, c.heads, c.head_dim);
  free(abuf);
  return 0;
}

static int q_main_run(const struct op_desc *self, struct op_io *io) { return q_heads_run(self, io, true); }
static int q_indexer_run(const struct op_desc *self, struct op_io *io) { return q_heads_run(self, io, false); }

int op_index_weights_prepare(const struct op_desc *self, struct op_io *io, struct op_qkv_call *c) {
  const struct op_tensor *u, *W;
  int64_t ud[2], wd[2];
  double scale;
  if (!read_proj(self, io, "W_w", &u, ud, &W, wd) || !op_io_param_in(self, io, "scale", -DBL_MAX, DBL_MAX, &scale))
    return CEDAR_EINVAL;
  float *w = op_io_out(self, io, "w", 2, (int64_t[]){ud[0], wd[0]});
  if (!w) return CEDAR_ENOMEM;
  *c = (struct op_qkv_call){.x = u->data, .W = W->data, .out = w, .n = (int)ud[0], .in = (int)ud[1],
                            .rows = (int)wd[0], .scale = (float)scale};
  return 0;
}

static int index_weights_run(const struct op_desc *self, struct op_io *io) {
  struct op_qkv_call c;
  int rc = op_index_weights_prepare(self, io, &c);
  if (!rc) op_index_weights(c.out, c.x, c.W, c.n, c.in, c.rows, c.scale);
  return rc;
}

int op_swa_kv_prepare(const struct op_desc *self, struct op_io *io, struct op_qkv_call *c) {
  const struct op_tensor *u, *W;
  int64_t ud[2], wd[2];
  const float *gamma;
  const int64_t *pos;
  double eps, pack, block, scale;
  memset(c, 0, sizeof *c);
  if (!read_proj(self, io, "W_kv", &u, ud, &W, wd) || !read_gamma(self, io, "gamma", wd[0], "W_kv", &gamma) ||
      !(pos = read_pos(self, io, ud[0], "u")) || !op_io_param_in(self, io, "eps", 0, DBL_MAX, &eps) ||
      !op_io_param_in(self, io, "pack", 0, 1, &pack) || !op_io_param_in(self, io, "block", 0, INT_MAX, &block) ||
      !op_io_param_in(self, io, "scale", 0, 1, &scale) || !op_rope_from_params(self, io, "rope_dim", "last", (int)wd[0], &c->rope))
    return CEDAR_EINVAL;
  const int n = (int)ud[0], hd = (int)wd[0], blk = block ? (int)block : hd;
  size_t bytes = op_fp8_bytes(hd, blk, (enum op_scale_kind)scale);
  if (pack && !bytes)
    return op_io_fail(io, "swa_kv: block %d does not divide head_dim %d (the rows of W_kv)", blk, hd);
  float *kS = op_io_out(self, io, "kS", 2, (int64_t[]){n, hd});
  uint8_t *entries = kS && pack ? op_io_out(self, io, "entries", 2, (int64_t[]){n, (int64_t)bytes}) : NULL;
  if (!kS || (pack && !entries)) return CEDAR_ENOMEM;
  c->x = u->data, c->W = W->data, c->gamma = gamma, c->pos = pos, c->out = kS, c->entries = entries;
  c->n = n, c->in = (int)ud[1], c->rows = hd, c->heads = 1, c->head_dim = hd, c->eps = (float)eps;
  c->fmt = op_kv_fp8_format(blk, (enum op_scale_kind)scale), c->bytes = bytes;
  return 0;
}

static int swa_kv_run(const struct op_desc *self, struct op_io *io) {
  struct op_qkv_call c;
  int rc = op_swa_kv_prepare(self, io, &c);
  if (rc) return rc;
  struct op_rope_angles ang;
  float *abuf;
  if (!angles_at(&ang, &abuf, &c.rope, c.pos, c.n)) return CEDAR_ENOMEM;
  op_swa_kv(c.out, c.x, c.W, c.gamma, &ang, &c.rope, c.n, c.in, c.head_dim, c.eps);
  free(abuf);
  if (c.entries) op_swa_pack(c.entries, c.out, c.n, c.head_dim, &c.fmt, c.bytes);
  return 0;
}

const struct op_desc op_desc_q_latent = {
    .name = "q_latent",
    .summary = "query latent c_q = RMSNorm(W_qa u) * gamma_q (SPEC 3.5)",
    .inputs = (const struct op_arg[]){{"u", OP_F32, "(n, hidden)", "attention input rows"},
                                      {"W_qa", OP_F32, "(q_rank, hidden)", "query down-projection (q_rank 1280 [A])"},
                                      {"gamma_q", OP_F32, "(q_rank)", "optional: q_norm weight (absent = 1)"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"cq", OP_F32, "(n, q_rank)", "query latent"}, {0}},
    .params = (const struct op_param[]){QKV_EPS_, {0}},
    .run = q_latent_run,
};

const struct op_desc op_desc_q_main = {
    .name = "q_main",
    .summary = "main query heads: W_qb c_q, per-head RMS norm, RoPE at pos (SPEC 3.5, R.2)",
    .inputs = (const struct op_arg[]){{"cq", OP_F32, "(n, q_rank)", "query latent (q_latent)"},
                                      {"W_qb", OP_F32, "(heads*head_dim, q_rank)", "query up-projection"},
                                      {"pos", OP_I64, "(n)", "absolute position of each row"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"q", OP_F32, "(n, heads, head_dim)", "RoPE'd query heads"}, {0}},
    .params = (const struct op_param[]){{"heads", OP_PARAM_INT, 64, "query heads H [A]"},
                                        {"head_dim", OP_PARAM_INT, 512, "head width d_h [A]"},
                                        {"head_norm", OP_PARAM_BOOL, 1, "weightless per-head RMS norm, plan "
                                                                        "q_head_norm [R-cfg, unverified]"},
                                        QKV_EPS_,
                                        QKV_ROPE_PARAMS_,
                                        {0}},
    .run = q_main_run,
};

const struct op_desc op_desc_q_indexer = {
    .name = "q_indexer",
    .summary = "indexer query heads: W_iq c_q, indexer RoPE at pos (SPEC 3.5, R.4)",
    .inputs = (const struct op_arg[]){{"cq", OP_F32, "(n, q_rank)", "query latent (q_latent)"},
                                      {"W_iq", OP_F32, "(heads*head_dim, q_rank)", "indexer query projection"},
                                      {"pos", OP_I64, "(n)", "absolute position of each row"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"qI", OP_F32, "(n, heads, head_dim)", "RoPE'd indexer query heads"}, {0}},
    .params = (const struct op_param[]){{"heads", OP_PARAM_INT, 32, "indexer heads H_I [A]"},
                                        {"head_dim", OP_PARAM_INT, 128, "indexer head width d_I [A]"},
                                        QKV_ROPE_PARAMS_,
                                        {0}},
    .run = q_indexer_run,
};

const struct op_desc op_desc_index_weights = {
    .name = "index_weights",
    .summary = "indexer head weights w = scale * (W_w u), from the query hidden u (SPEC 3.5, R.4)",
    .inputs = (const struct op_arg[]){{"u", OP_F32, "(n, hidden)", "attention input rows (not c_q)"},
                                      {"W_w", OP_F32, "(heads, hidden)", "head-weight projection"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"w", OP_F32, "(n, heads)", "per-head weights"}, {0}},
    .params = (const struct op_param[]){{"scale", OP_PARAM_FLOAT, 0.015625,
                                         "idx_dim^-0.5 * heads^-0.5 [R, R.4]: 1/64 at 128 x 32; 1 = none"},
                                        {0}},
    .run = index_weights_run,
};

const struct op_desc op_desc_swa_kv = {
    .name = "swa_kv",
    .summary = "SWA key/value kS = RoPE(RMSNorm(W_kv u) * gamma), optionally packed to FP8 (SPEC 3.6, 4.4)",
    .inputs = (const struct op_arg[]){{"u", OP_F32, "(n, hidden)", "attention input rows"},
                                      {"W_kv", OP_F32, "(head_dim, hidden)", "the layer's own SWA projection"},
                                      {"gamma", OP_F32, "(head_dim)", "optional: kv_norm weight (absent = 1)"},
                                      {"pos", OP_I64, "(n)", "absolute position of each row"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"kS", OP_F32, "(n, head_dim)", "SWA entries, float"},
                                       {"entries", OP_U8, "(n, bytes)", "with pack=1: FP8 entries (fp8_pack layout)"},
                                       {0}},
    .params = (const struct op_param[]){QKV_EPS_,
                                        QKV_ROPE_PARAMS_,
                                        {"pack", OP_PARAM_BOOL, 0, "also write the packed FP8 entries"},
                                        {"block", OP_PARAM_INT, 0, "values per FP8 scale; 0 = one per entry [R] "
                                                                   "(R.2 serving: 32)"},
                                        {"scale", OP_PARAM_INT, 0, "0: FP32 scales [R]; 1: E8M0 scales (R.2)"},
                                        {0}},
    .run = swa_kv_run,
};
