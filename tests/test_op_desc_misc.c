/* test_op_desc_misc.c: the registry descriptors of the MoE, mHC, Engram,
 * DSpark and sampling ops (the "registry descriptors" sections at the end of
 * ops/moe.c, mhc.c, engram.c, dspark.c, sample.c).
 *
 * What it is: for every descriptor, random inputs (h_fill) run through the
 * registry (h_io_run) and through the op called directly give the same bits,
 * with default and non-default parameters and with optional inputs present
 * and absent; and bad calls (wrong shape, wrong dtype or rank, missing
 * tensor, out-of-range id, row or parameter, NaN logits) are refused with a
 * negative status and a message that names the problem, before the op runs.
 * There is no tolerance anywhere: the registry must not change a bit.
 *
 * What it is not: a test of the ops' numbers (tests/test_ops_<family>.c).
 *
 * Run: ctest --test-dir build -R op_desc_misc --output-on-failure
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/dspark.h"
#include "ops/engram.h"
#include "ops/formats.h"
#include "ops/mhc.h"
#include "ops/moe.h"
#include "ops/registry.h"
#include "ops/sample.h"
#include "tests/harness.h"

/* ---- helpers ------------------------------------------------------------- */

static float *fvec(size_t n, uint64_t *seed, float lo, float hi) {
  float *v = malloc((n ? n : 1) * sizeof *v);
  h_fill(v, n, seed, lo, hi);
  return v;
}

/* A uniform integer in [0, k). */
static int64_t rand_below(uint64_t *seed, int64_t k) { return (int64_t)(h_uniform(seed) * (double)k); }

/* EXPECT that output `name` of the last run has dtype dt and shape (nd dims)
 * and the same bytes as ref. */
static void expect_out(const struct h_io *h, const char *op, const char *name, enum op_dtype dt, int nd,
                       const int64_t *shape, const void *ref) {
  const struct op_tensor *t = h_io_output(h, name);
  bool shaped = t && t->dtype == dt && t->ndim == nd && !memcmp(t->shape, shape, sizeof *shape * (size_t)nd);
  EXPECT(shaped, "%s: output '%s' missing or not %s with the expected shape", op, name, op_dtype_name(dt));
  if (!shaped) return;
  size_t count = 1;
  for (int i = 0; i < nd; i++) count *= (size_t)shape[i];
  EXPECT(!memcmp(t->data, ref, count * op_dtype_size(dt)), "%s: output '%s' through the registry differs from the "
         "direct call", op, name);
}

/* Run op on the inputs in h; EXPECT success. */
static void expect_run(struct h_io *h, const char *op) {
  int rc = h_io_run(h, op);
  EXPECT(rc == 0, "%s: failed (%d): %s", op, rc, h->error);
}

/* Run op on the inputs in h; EXPECT a refusal whose message contains want.
 * Frees whatever the op allocated before refusing. */
static void expect_reject(struct h_io *h, const char *op, const char *want) {
  h->error[0] = '\0'; /* the harness keeps the first message */
  int rc = h_io_run(h, op);
  EXPECT(rc < 0 && strstr(h->error, want), "%s: want a refusal with '%s', got status %d and '%s'", op, want, rc,
         h->error);
  h_io_free(h);
}

/* Every op of this file is registered and documented. */
static void check_table(void) {
  static const char *const names[] = {"moe",          "mhc_coeffs",        "mhc_mix",          "mhc_update",
                                      "mhc_merge",    "engram_hash",       "engram_gather",    "engram_inject",
                                      "dspark_draft", "dspark_confidence", "dspark_verify_len", "sample"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    const struct op_desc *d = op_find(names[i]);
    EXPECT(d && d->summary && d->outputs && d->outputs->name, "op %s not registered or incomplete", names[i]);
    for (const struct op_arg *a = d ? d->inputs : NULL; a && a->name; a++)
      EXPECT(a->shape && a->shape[0] == '(' && a->doc && a->doc[0], "%s.%s undocumented", names[i], a->name);
    for (const struct op_param *p = d ? d->params : NULL; p && p->name; p++)
      EXPECT(p->doc && p->doc[0], "%s.%s undocumented", names[i], p->name);
  }
}

/* ---- moe ----------------------------------------------------------------- */

struct moe_t {
  int n, hidden, r, inter, S;
  float *x, *router, *bias, *gate, *up, *down, *sg, *su, *sd;
  uint8_t *mod;
};

static struct moe_t moe_make(int n, int hidden, int r, int inter, int S, uint64_t *seed) {
  struct moe_t m = {.n = n, .hidden = hidden, .r = r, .inter = inter, .S = S};
  m.x = fvec((size_t)n * hidden, seed, -1, 1);
  m.router = fvec((size_t)r * hidden, seed, -0.5f, 0.5f);
  m.bias = fvec(2 * (size_t)r, seed, -0.3f, 0.3f);
  m.gate = fvec((size_t)r * inter * hidden, seed, -0.5f, 0.5f);
  m.up = fvec((size_t)r * inter * hidden, seed, -0.5f, 0.5f);
  m.down = fvec((size_t)r * hidden * inter, seed, -0.5f, 0.5f);
  m.sg = fvec((size_t)S * hidden, seed, -0.5f, 0.5f);
  m.su = fvec((size_t)S * hidden, seed, -0.5f, 0.5f);
  m.sd = fvec((size_t)hidden * S, seed, -0.5f, 0.5f);
  m.mod = malloc((size_t)n);
  for (int t = 0; t < n; t++) m.mod[t] = (uint8_t)(t % 3 == 1);
  return m;
}

static void moe_free(struct moe_t *m) {
  free(m->x), free(m->router), free(m->bias), free(m->gate), free(m->up), free(m->down);
  free(m->sg), free(m->su), free(m->sd), free(m->mod);
}

/* The required inputs, plus bias, modality and the shared expert when asked. */
static void moe_inputs(struct h_io *h, const struct moe_t *m, bool optional) {
  h_io_init(h);
  h_io_input(h, "x", OP_F32, 2, (int64_t[]){m->n, m->hidden}, m->x);
  h_io_input(h, "router", OP_F32, 2, (int64_t[]){m->r, m->hidden}, m->router);
  h_io_input(h, "w_gate", OP_F32, 3, (int64_t[]){m->r, m->inter, m->hidden}, m->gate);
  h_io_input(h, "w_up", OP_F32, 3, (int64_t[]){m->r, m->inter, m->hidden}, m->up);
  h_io_input(h, "w_down", OP_F32, 3, (int64_t[]){m->r, m->hidden, m->inter}, m->down);
  if (!optional) return;
  h_io_input(h, "bias", OP_F32, 2, (int64_t[]){2, m->r}, m->bias);
  h_io_input(h, "modality", OP_U8, 1, (int64_t[]){m->n}, m->mod);
  h_io_input(h, "shared_gate", OP_F32, 2, (int64_t[]){m->S, m->hidden}, m->sg);
  h_io_input(h, "shared_up", OP_F32, 2, (int64_t[]){m->S, m->hidden}, m->su);
  h_io_input(h, "shared_down", OP_F32, 2, (int64_t[]){m->hidden, m->S}, m->sd);
}

/* The registry call against op_moe_forward with config c (params set in h by the caller). */
static void moe_compare(struct h_io *h, const struct moe_t *m, const struct op_moe_cfg *c, bool optional) {
  int n = m->n, k = c->n_active;
  float *y = malloc((size_t)n * m->hidden * sizeof *y), *w = malloc((size_t)n * k * sizeof *w);
  int32_t *sel = malloc((size_t)n * k * sizeof *sel);
  void *ws = malloc(op_moe_workspace_bytes(n, c));
  struct op_moe_weights wt = {m->router, optional ? m->bias : NULL, m->gate, m->up, m->down,
                              optional ? m->sg : NULL, optional ? m->su : NULL, optional ? m->sd : NULL, .has_q = false};
  op_moe_forward(y, sel, w, m->x, &wt, optional ? m->mod : NULL, n, c, ws);
  expect_run(h, "moe");
  expect_out(h, "moe", "y", OP_F32, 2, (int64_t[]){n, m->hidden}, y);
  expect_out(h, "moe", "selected", OP_I32, 2, (int64_t[]){n, k}, sel);
  expect_out(h, "moe", "weights", OP_F32, 2, (int64_t[]){n, k}, w);
  h_io_free(h);
  free(y), free(w), free(sel), free(ws);
}

static void check_moe(uint64_t *seed) {
  struct moe_t m = moe_make(11, 13, 9, 7, 5, seed);
  struct h_io h;
  /* SPEC defaults: 6 of 9 experts, sqrtsoftplus, normalised, 1.5, limit 10; all inputs */
  moe_inputs(&h, &m, true);
  struct op_moe_cfg c = {m.hidden, m.r, 6, m.inter, 1, m.S, OP_MOE_SQRTSOFTPLUS, true, 1.5f, 10, 0};
  moe_compare(&h, &m, &c, true);
  /* every parameter set, a limit that clamps, no optional inputs */
  moe_inputs(&h, &m, false);
  h_io_param(&h, "n_active", 2), h_io_param(&h, "score", 2), h_io_param(&h, "norm_topk", 0);
  h_io_param(&h, "route_scale", 0.7), h_io_param(&h, "limit", 0.25);
  c = (struct op_moe_cfg){m.hidden, m.r, 2, m.inter, 0, 0, OP_MOE_SIGMOID, false, 0.7f, 0.25f, 0};
  moe_compare(&h, &m, &c, false);
  moe_inputs(&h, &m, true);
  h_io_param(&h, "score", 1);
  c = (struct op_moe_cfg){m.hidden, m.r, 6, m.inter, 1, m.S, OP_MOE_SOFTMAX, true, 1.5f, 10, 0};
  moe_compare(&h, &m, &c, true);

  /* refusals */
  moe_inputs(&h, &m, false);
  h.in[4].shape[1] = 14, h.in[4].shape[2] = 6; /* w_down */
  expect_reject(&h, "moe", "moe: w_down is (9, 14, 6) but must be (9, 13, 7) to match w_gate (9, 7, 13)");
  moe_inputs(&h, &m, false);
  h.in[1].shape[1] = m.hidden + 2;
  expect_reject(&h, "moe", "moe: router is (9, 15) but must be (9, 13) to match x (11, 13)");
  moe_inputs(&h, &m, true);
  h.in[6].shape[0] = m.n - 1; /* modality */
  expect_reject(&h, "moe", "modality is (10) but must be (11) to match x (11, 13)");
  moe_inputs(&h, &m, true);
  h.in[6].dtype = OP_I32;
  expect_reject(&h, "moe", "input 'modality' must be U8");
  moe_inputs(&h, &m, true);
  h.in[5].shape[0] = 1; /* bias (1, 9) */
  expect_reject(&h, "moe", "bias is (1, 9) but must be (2, 9) to match router (9, 13)");
  moe_inputs(&h, &m, true);
  h.in_name[9] = "shared_dn"; /* shared_down missing */
  expect_reject(&h, "moe", "needs shared_gate, shared_up and shared_down together (missing: shared_down)");
  moe_inputs(&h, &m, false);
  h.in_name[0] = "xx";
  expect_reject(&h, "moe", "moe: missing input tensor 'x' F32 (n, hidden)");
  moe_inputs(&h, &m, false);
  h_io_param(&h, "n_active", 10);
  expect_reject(&h, "moe", "parameter n_active = 10 must be an integer in [1, 9]");
  moe_inputs(&h, &m, false);
  h_io_param(&h, "score", 3);
  expect_reject(&h, "moe", "parameter score = 3 must be an integer in [0, 2]");
  moe_inputs(&h, &m, false);
  h_io_param(&h, "limit", -1);
  expect_reject(&h, "moe", "limit (-1) must be positive");
  moe_free(&m);
}

/* ---- mhc ----------------------------------------------------------------- */

static void mhc_state_input(struct h_io *h, const float *X, int n, int hc, int d) {
  h_io_init(h);
  h_io_input(h, "X", OP_F32, 3, (int64_t[]){n, hc, d}, (void *)X);
}

static void check_mhc_coeffs(const float *X, int n, int hc, int d, uint64_t *seed) {
  int M = op_mhc_rows(hc);
  float *W = fvec((size_t)M * hc * d, seed, -0.2f, 0.2f), *scale = fvec(3, seed, 0.5f, 2), *base = fvec(M, seed, -1, 1);
  float *pre = malloc((size_t)n * hc * 4), *post = malloc((size_t)n * hc * 4), *C = malloc((size_t)n * hc * hc * 4);
  float *dots = malloc((size_t)n * M * 4), *ss = malloc((size_t)n * 4);
  struct h_io h;
  for (int pass = 0; pass < 2; pass++) { /* SPEC defaults, then every parameter set */
    struct op_mhc_cfg c = {hc, d, pass ? 3 : 20, pass ? 1e-3f : 1e-6f, pass ? 1e-20f : 1e-6f};
    op_mhc_coeffs(pre, post, C, dots, ss, X, W, scale, base, n, &c);
    mhc_state_input(&h, X, n, hc, d);
    h_io_input(&h, "W_fn", OP_F32, 2, (int64_t[]){M, hc * d}, W);
    h_io_input(&h, "scale", OP_F32, 1, (int64_t[]){3}, scale);
    h_io_input(&h, "base", OP_F32, 1, (int64_t[]){M}, base);
    if (pass) h_io_param(&h, "sinkhorn_iters", 3), h_io_param(&h, "hc_eps", 1e-3), h_io_param(&h, "norm_eps", 1e-20);
    expect_run(&h, "mhc_coeffs");
    expect_out(&h, "mhc_coeffs", "pre", OP_F32, 2, (int64_t[]){n, hc}, pre);
    expect_out(&h, "mhc_coeffs", "post", OP_F32, 2, (int64_t[]){n, hc}, post);
    expect_out(&h, "mhc_coeffs", "C", OP_F32, 3, (int64_t[]){n, hc, hc}, C);
    expect_out(&h, "mhc_coeffs", "dots", OP_F32, 2, (int64_t[]){n, M}, dots);
    expect_out(&h, "mhc_coeffs", "sumsq", OP_F32, 1, (int64_t[]){n}, ss);
    h_io_free(&h);
  }
  /* refusals, on the last inputs */
  h.in[1].shape[0] = M - 1;
  expect_reject(&h, "mhc_coeffs", "mhc_coeffs: W_fn is (14, 111) but must be (15, 111) to match X (5, 3, 37)");
  h.in[1].shape[0] = M, h.in[2].shape[0] = 2;
  expect_reject(&h, "mhc_coeffs", "scale is (2) but must be (3)");
  h.in[2].shape[0] = 3, h.in[3].shape[0] = M + 1;
  expect_reject(&h, "mhc_coeffs", "base is (16) but must be (15) to match W_fn (15, 111)");
  h.in[3].shape[0] = M, h.n_param = 0;
  h_io_param(&h, "sinkhorn_iters", 0);
  expect_reject(&h, "mhc_coeffs", "parameter sinkhorn_iters = 0 must be an integer in [1, 1000000]");
  h.n_param = 0;
  h_io_param(&h, "hc_eps", -1);
  expect_reject(&h, "mhc_coeffs", "parameter hc_eps = -1 must be finite and >= 0");
  h.n_param = 0, h.in[0].shape[1] = 0; /* no streams */
  expect_reject(&h, "mhc_coeffs", "it needs hc >= 1 streams");
  free(W), free(scale), free(base), free(pre), free(post), free(C), free(dots), free(ss);
}

static void check_mhc_mix_update(const float *X, int n, int hc, int d, uint64_t *seed) {
  float *pre = fvec((size_t)n * hc, seed, 0.1f, 1), *C = fvec((size_t)n * hc * hc, seed, 0, 1);
  float *post = fvec((size_t)n * hc, seed, 0, 2), *F = fvec((size_t)n * d, seed, -1, 1);
  float *u = malloc((size_t)n * d * 4), *Xn = malloc((size_t)n * hc * d * 4);
  op_mhc_mix(u, X, pre, n, hc, d);
  op_mhc_update(Xn, X, C, post, F, n, hc, d);
  struct h_io h;
  mhc_state_input(&h, X, n, hc, d);
  h_io_input(&h, "pre", OP_F32, 2, (int64_t[]){n, hc}, pre);
  expect_run(&h, "mhc_mix");
  expect_out(&h, "mhc_mix", "u", OP_F32, 2, (int64_t[]){n, d}, u);
  h_io_free(&h);
  h.in[1].dtype = OP_I32;
  expect_reject(&h, "mhc_mix", "mhc_mix: input 'pre' must be F32 with 2 dims (n, hc), got I32 with 2 dims");
  h.in[1].dtype = OP_F32, h.in[1].shape[1] = hc + 1;
  expect_reject(&h, "mhc_mix", "mhc_mix: pre is (5, 4) but must be (5, 3) to match X (5, 3, 37)");

  mhc_state_input(&h, X, n, hc, d);
  h_io_input(&h, "C", OP_F32, 3, (int64_t[]){n, hc, hc}, C);
  h_io_input(&h, "post", OP_F32, 2, (int64_t[]){n, hc}, post);
  h_io_input(&h, "F", OP_F32, 2, (int64_t[]){n, d}, F);
  expect_run(&h, "mhc_update");
  expect_out(&h, "mhc_update", "X_next", OP_F32, 3, (int64_t[]){n, hc, d}, Xn);
  h_io_free(&h);
  h.in[3].shape[1] = d + 1;
  expect_reject(&h, "mhc_update", "mhc_update: F is (5, 38) but must be (5, 37) to match X (5, 3, 37)");
  h.in[3].shape[1] = d, h.in[1].shape[2] = 2;
  expect_reject(&h, "mhc_update", "C is (5, 3, 2) but must be (5, 3, 3)");
  h.in_name[2] = "pots";
  h.in[1].shape[2] = hc;
  expect_reject(&h, "mhc_update", "missing input tensor 'post'");
  free(pre), free(C), free(post), free(F), free(u), free(Xn);
}

static void check_mhc_merge(const float *X, int n, int hc, int d, uint64_t *seed) {
  float *W = fvec((size_t)hc * hc * d, seed, -0.2f, 0.2f), *scale = fvec(1, seed, 0.5f, 2), *base = fvec(hc, seed, -1, 1);
  float *y = malloc((size_t)n * d * 4), *pre = malloc((size_t)n * hc * 4);
  struct op_mhc_cfg c = {hc, d, 1, 1e-6f, 1e-6f};
  op_mhc_merge(y, pre, X, W, scale[0], base, n, &c);
  struct h_io h;
  mhc_state_input(&h, X, n, hc, d);
  h_io_input(&h, "W_fn", OP_F32, 2, (int64_t[]){hc, hc * d}, W);
  h_io_input(&h, "scale", OP_F32, 1, (int64_t[]){1}, scale);
  h_io_input(&h, "base", OP_F32, 1, (int64_t[]){hc}, base);
  expect_run(&h, "mhc_merge");
  expect_out(&h, "mhc_merge", "y", OP_F32, 2, (int64_t[]){n, d}, y);
  expect_out(&h, "mhc_merge", "pre", OP_F32, 2, (int64_t[]){n, hc}, pre);
  h_io_free(&h);
  h.in[2].shape[0] = 3;
  expect_reject(&h, "mhc_merge", "mhc_merge: scale is (3) but must be (1) to match the head's one scale");
  h.in[2].shape[0] = 1, h.in[1].shape[1] = hc * d - 1;
  expect_reject(&h, "mhc_merge", "W_fn is (3, 110) but must be (3, 111) to match X (5, 3, 37)");
  free(W), free(scale), free(base), free(y), free(pre);
}

static void check_mhc(uint64_t *seed) {
  enum { N = 5, HC = 3, D = 37 };
  float *X = fvec((size_t)N * HC * D, seed, -2, 2);
  check_mhc_coeffs(X, N, HC, D, seed);
  check_mhc_mix_update(X, N, HC, D, seed);
  check_mhc_merge(X, N, HC, D, seed);
  free(X);
}

/* ---- engram ---------------------------------------------------------------- */

enum { EH_HIST = 3, EH_N = 17, EH_TOT = EH_HIST + EH_N, EH_VOCAB = 50 };

/* engram_hash on tokens/dead with module 1 at layer 14, table_base 1000, 3 heads. */
static void hash_inputs(struct h_io *h, int32_t *tok, uint8_t *dead) {
  h_io_init(h);
  h_io_input(h, "tokens", OP_I32, 1, (int64_t[]){EH_TOT}, tok);
  h_io_input(h, "dead", OP_U8, 1, (int64_t[]){EH_TOT}, dead);
  h_io_param(h, "module", 1), h_io_param(h, "layer", 14), h_io_param(h, "table_base", 1000);
  h_io_param(h, "heads", 3), h_io_param(h, "seed", 42), h_io_param(h, "vocab", EH_VOCAB);
  h_io_param(h, "compressed_vocab", 37), h_io_param(h, "n_hist", EH_HIST);
}

/* The direct call for orders (n_orders of them) and the given cmap/mult; compares rows and table_rows. */
static void hash_compare(struct h_io *h, const int32_t *tok, const uint8_t *dead, const int32_t *cmap,
                         const uint64_t *mult, const int *orders, int n_orders) {
  struct op_engram_tables t;
  EXPECT(op_engram_tables_init(&t, 2, n_orders, 3, 1000) == 0, "tables");
  int64_t rows[EH_N * 4 * 3];
  EXPECT(op_engram_hash(rows, tok, dead, cmap, mult, orders, op_engram_primes_of(&t, 1), op_engram_offsets_of(&t, 1),
                        EH_HIST, EH_N, EH_VOCAB, n_orders, 3, cmap[2]) == -1, "direct hash"); /* pad = cmap[pad_id 2] */
  expect_run(h, "engram_hash");
  expect_out(h, "engram_hash", "rows", OP_I64, 3, (int64_t[]){EH_N, n_orders, 3}, rows);
  expect_out(h, "engram_hash", "table_rows", OP_I64, 1, (int64_t[]){1}, &t.rows[1]);
  h_io_free(h);
  op_engram_tables_free(&t);
}

static void check_engram_hash(uint64_t *seed) {
  int32_t tok[EH_TOT], cmap[EH_VOCAB], cmap_own[EH_VOCAB];
  uint8_t dead[EH_TOT];
  for (int i = 0; i < EH_TOT; i++) tok[i] = (int32_t)rand_below(seed, EH_VOCAB), dead[i] = i == 9 || i == 10;
  for (int i = 0; i < EH_VOCAB; i++) cmap_own[i] = (int32_t)rand_below(seed, 1000);
  op_engram_cmap_modulo(cmap, EH_VOCAB, 37);
  uint64_t mult[5];
  struct h_io h;
  /* SPEC's orders (2, 3, 4) by default, the vendor's multipliers from layer and compressed_vocab */
  op_engram_multipliers_numpy(mult, 14, 4, 37);
  hash_inputs(&h, tok, dead);
  hash_compare(&h, tok, dead, cmap, mult, (int[]){2, 3, 4}, 3);
  /* scheme 1: cedar's older splitmix64 multipliers from seed and layer */
  op_engram_multipliers_splitmix64(mult, 42, 14, 4, 0);
  hash_inputs(&h, tok, dead);
  h_io_param(&h, "scheme", 1);
  hash_compare(&h, tok, dead, cmap, mult, (int[]){2, 3, 4}, 3);
  /* orders (1, 5), the caller's cmap and multipliers */
  int64_t mult_in[5];
  for (int k = 0; k < 5; k++) mult[k] = ((uint64_t)rand_below(seed, 1LL << 52) << 12) | 1, mult_in[k] = (int64_t)mult[k];
  hash_inputs(&h, tok, dead);
  h_io_input(&h, "cmap", OP_I32, 1, (int64_t[]){EH_VOCAB}, cmap_own);
  h_io_input(&h, "mult", OP_I64, 1, (int64_t[]){5}, mult_in);
  h_io_param(&h, "o1", 1), h_io_param(&h, "o2", 5), h_io_param(&h, "o3", 0);
  hash_compare(&h, tok, dead, cmap_own, mult, (int[]){1, 5}, 2);

  /* refusals */
  tok[4] = EH_VOCAB;
  hash_inputs(&h, tok, dead);
  expect_reject(&h, "engram_hash", "engram_hash: token 50 at position 4 is outside the vocabulary [0, 50)");
  tok[4] = -1;
  hash_inputs(&h, tok, dead);
  expect_reject(&h, "engram_hash", "token -1 at position 4");
  tok[4] = 0;
  hash_inputs(&h, tok, dead);
  h_io_param(&h, "o2", 0);
  expect_reject(&h, "engram_hash", "engram_hash: o3 = 4 follows an unused order (0)");
  hash_inputs(&h, tok, dead);
  h_io_param(&h, "o1", 65);
  expect_reject(&h, "engram_hash", "parameter o1 = 65 must be an integer in [0, 64]");
  hash_inputs(&h, tok, dead);
  h.in[1].shape[0] = EH_TOT - 1;
  expect_reject(&h, "engram_hash", "engram_hash: dead is (19) but must be (20) to match tokens (20)");
  hash_inputs(&h, tok, dead);
  h_io_input(&h, "mult", OP_I64, 1, (int64_t[]){3}, mult_in);
  expect_reject(&h, "engram_hash", "mult is (3) but must be (4) to match the longest order");
  hash_inputs(&h, tok, dead);
  h_io_param(&h, "n_hist", EH_TOT + 1);
  expect_reject(&h, "engram_hash", "n_hist = 21 but tokens holds 20 ids");
  hash_inputs(&h, tok, dead);
  h_io_param(&h, "heads", 70000);
  expect_reject(&h, "engram_hash", "parameter heads = 70000 must be an integer in [1, 65536]");
  hash_inputs(&h, tok, dead);
  h_io_param(&h, "heads", 20000);
  expect_reject(&h, "engram_hash", "modules 0..1 x 3 orders x 20000 heads = 120000 tables; at most 65536");
  hash_inputs(&h, tok, dead);
  h.in[0].dtype = OP_I64;
  expect_reject(&h, "engram_hash", "input 'tokens' must be I32");
}

static void check_engram_gather(uint64_t *seed) {
  enum { N = 6, O = 2, H = 3, HD = 64, BLK = 16, R = 40 };
  size_t rb = op_engram_row_bytes(HD, BLK);
  EXPECT(rb == HD + HD / BLK, "row bytes");
  uint8_t *table = malloc(R * rb);
  float *vals = fvec((size_t)R * HD, seed, -300, 300);
  for (int r = 0; r < R; r++) op_fp8_pack(table + r * rb, vals + (size_t)r * HD, HD, BLK, OP_SCALE_E8M0);
  int64_t rows[N * O * H];
  for (int j = 0; j < N * O * H; j++) rows[j] = rand_below(seed, R);
  float *e = malloc((size_t)N * O * H * HD * sizeof *e);
  op_engram_gather(e, table, rows, N, O * H, HD, BLK, R);
  struct h_io h;
  h_io_init(&h);
  h_io_input(&h, "table", OP_U8, 2, (int64_t[]){R, (int64_t)rb}, table);
  h_io_input(&h, "rows", OP_I64, 3, (int64_t[]){N, O, H}, rows);
  h_io_param(&h, "head_dim", HD), h_io_param(&h, "block", BLK);
  expect_run(&h, "engram_gather");
  expect_out(&h, "engram_gather", "e", OP_F32, 2, (int64_t[]){N, O * H * HD}, e);
  h_io_free(&h);
  /* refusals: a row past the table, a negative row, a row size that does not fit the params */
  rows[1 * O * H + 0 * H + 2] = R;
  expect_reject(&h, "engram_gather", "engram_gather: rows[1, 0, 2] = 40 is outside the table's 40 rows");
  rows[1 * O * H + 0 * H + 2] = 0, rows[N * O * H - 1] = -3;
  expect_reject(&h, "engram_gather", "rows[5, 1, 2] = -3 is outside");
  rows[N * O * H - 1] = 0, h.n_param = 0; /* the defaults, 256/32, want 264-byte rows */
  expect_reject(&h, "engram_gather", "engram_gather: table rows are 68 bytes; head_dim 256 with block 32 needs 264");
  h_io_param(&h, "head_dim", 60), h_io_param(&h, "block", 16);
  expect_reject(&h, "engram_gather", "head_dim 60 is not a multiple of block 16");
  h.n_param = 0, h.in[1].ndim = 2;
  expect_reject(&h, "engram_gather", "input 'rows' must be I64 with 3 dims");
  free(table), free(vals), free(e);
}

static void check_engram_inject(uint64_t *seed) {
  enum { N = 4, HC = 3, HID = 29, DE = 40, KVW = (HC + 1) * HID };
  float *X = fvec((size_t)N * HC * HID, seed, -2, 2), *e = fvec((size_t)N * DE, seed, -1, 1);
  float *w = fvec((size_t)KVW * DE, seed, -0.3f, 0.3f), *q = fvec(HC * HID, seed, 0.5f, 1.5f);
  float *k = fvec(HC * HID, seed, 0.5f, 1.5f);
  float *Xn = malloc(sizeof(float) * N * HC * HID), *kv = malloc(sizeof(float) * N * KVW), gate[N * HC];
  struct h_io h;
  for (int pass = 0; pass < 2; pass++) { /* defaults, then both parameters set */
    memcpy(Xn, X, sizeof(float) * N * HC * HID);
    op_engram_inject(Xn, kv, gate, e, w, q, k, N, DE, HID, HC, pass ? 1e-20f : 1e-6f, pass ? 0.5f : 1e-6f);
    h_io_init(&h);
    h_io_input(&h, "X", OP_F32, 3, (int64_t[]){N, HC, HID}, X);
    h_io_input(&h, "e", OP_F32, 2, (int64_t[]){N, DE}, e);
    h_io_input(&h, "w_kv", OP_F32, 2, (int64_t[]){KVW, DE}, w);
    h_io_input(&h, "q_w", OP_F32, 2, (int64_t[]){HC, HID}, q);
    h_io_input(&h, "k_w", OP_F32, 2, (int64_t[]){HC, HID}, k);
    if (pass) h_io_param(&h, "norm_eps", 1e-20), h_io_param(&h, "dot_floor", 0.5);
    expect_run(&h, "engram_inject");
    expect_out(&h, "engram_inject", "X_next", OP_F32, 3, (int64_t[]){N, HC, HID}, Xn);
    expect_out(&h, "engram_inject", "kv", OP_F32, 2, (int64_t[]){N, KVW}, kv);
    expect_out(&h, "engram_inject", "gate", OP_F32, 2, (int64_t[]){N, HC}, gate);
    h_io_free(&h);
  }
  h.in[2].shape[1] = DE - 1;
  expect_reject(&h, "engram_inject", "engram_inject: w_kv is (116, 39) but must be (116, 40) to match e (4, 40)");
  h.in[2].shape[1] = DE, h.in[2].shape[0] = KVW - HID;
  expect_reject(&h, "engram_inject", "w_kv is (87, 40) but must be (116, 40) to match X (4, 3, 29)");
  h.in[2].shape[0] = KVW, h.in[1].shape[0] = N + 1;
  expect_reject(&h, "engram_inject", "e is (5, 40) but must be (4, 40) to match X (4, 3, 29)");
  h.in[1].shape[0] = N, h.in[4].ndim = 1;
  expect_reject(&h, "engram_inject", "input 'k_w' must be F32 with 2 dims (hc, hidden), got F32 with 1 dims");
  free(X), free(e), free(w), free(q), free(k), free(Xn), free(kv);
}

/* ---- dspark ---------------------------------------------------------------- */

enum { DS_L = 5, DS_V = 53, DS_RANK = 7, DS_Y0 = 11 };

static void draft_inputs(struct h_io *h, float *base, float *A, float *U) {
  h_io_init(h);
  h_io_input(h, "base", OP_F32, 2, (int64_t[]){DS_L, DS_V}, base);
  h_io_input(h, "A", OP_F32, 2, (int64_t[]){DS_V, DS_RANK}, A);
  h_io_input(h, "U", OP_F32, 2, (int64_t[]){DS_V, DS_RANK}, U);
}

/* The registry's draft against one direct call of length L; every row of prob against the
 * distribution op_sample draws from on the direct logits of that row. */
static void draft_compare(struct h_io *h, const float *base, const float *A, const float *U, float T, float top_p,
                          uint64_t seed) {
  int32_t draft[DS_L], order[DS_V];
  float logits[DS_L * DS_V], last[DS_V], prob[DS_L * DS_V];
  uint64_t rng = seed;
  EXPECT(op_dspark_markov_draft(draft, logits, last, order, base, A, U, DS_Y0, DS_L, DS_V, DS_RANK, T, top_p, &rng) ==
             0, "direct draft");
  for (int i = 0; i < DS_L; i++) {
    float *p = prob + i * DS_V;
    if (T > 0) {
      op_sample_softmax(p, logits + i * DS_V, DS_V, T);
      if (top_p < 1) op_sample_top_p(p, order, DS_V, top_p);
    } else {
      for (int y = 0; y < DS_V; y++) p[y] = y == draft[i] ? 1.0f : 0.0f;
    }
  }
  EXPECT(!memcmp(prob + (DS_L - 1) * DS_V, last, sizeof last), "the last row's distribution is the op's prob");
  expect_run(h, "dspark_draft");
  expect_out(h, "dspark_draft", "draft", OP_I32, 1, (int64_t[]){DS_L}, draft);
  expect_out(h, "dspark_draft", "logits", OP_F32, 2, (int64_t[]){DS_L, DS_V}, logits);
  expect_out(h, "dspark_draft", "prob", OP_F32, 2, (int64_t[]){DS_L, DS_V}, prob);
  h_io_free(h);
}

static void check_dspark_draft(uint64_t *seed) {
  float *base = fvec(DS_L * DS_V, seed, -3, 3), *A = fvec(DS_V * DS_RANK, seed, -1, 1);
  float *U = fvec(DS_V * DS_RANK, seed, -1, 1);
  struct h_io h;
  draft_inputs(&h, base, A, U); /* greedy by default */
  h_io_param(&h, "y0", DS_Y0);
  draft_compare(&h, base, A, U, 0, 1, 0);
  draft_inputs(&h, base, A, U);
  h_io_param(&h, "y0", DS_Y0), h_io_param(&h, "temperature", 1.3), h_io_param(&h, "top_p", 0.9);
  h_io_param(&h, "seed", 12345);
  draft_compare(&h, base, A, U, 1.3f, 0.9f, 12345);

  draft_inputs(&h, base, A, U);
  expect_reject(&h, "dspark_draft", "dspark_draft: parameter y0 (the last committed token) is required");
  draft_inputs(&h, base, A, U);
  h_io_param(&h, "y0", DS_V);
  expect_reject(&h, "dspark_draft", "parameter y0 = 53 must be an integer in [0, 52]");
  draft_inputs(&h, base, A, U);
  h_io_param(&h, "y0", 0), h_io_param(&h, "top_p", 0);
  expect_reject(&h, "dspark_draft", "top_p = 0 in (0, 1]");
  draft_inputs(&h, base, A, U);
  h_io_param(&h, "y0", 0), h.in[2].shape[1] = DS_RANK + 1;
  expect_reject(&h, "dspark_draft", "dspark_draft: U is (53, 8) but must be (53, 7) to match A (53, 7)");
  draft_inputs(&h, base, A, U);
  h_io_param(&h, "y0", 0), h.in[1].shape[0] = DS_V - 1;
  expect_reject(&h, "dspark_draft", "A is (52, 7) but must be (53, 7) to match base (5, 53)");
  base[2 * DS_V + 5] = NAN;
  draft_inputs(&h, base, A, U);
  h_io_param(&h, "y0", 0);
  expect_reject(&h, "dspark_draft", "the logits of draft position 2 hold NaN or +inf");
  free(base), free(A), free(U);
}

static void check_dspark_confidence(uint64_t *seed) {
  enum { L = 6, D = 33 };
  float *hs = fvec(L * D, seed, -1, 1), *w = fvec(D, seed, -1, 1), b[2] = {0.25f, 0}, a[L];
  op_dspark_confidence(a, hs, w, b[0], L, D);
  struct h_io h;
  h_io_init(&h);
  h_io_input(&h, "h", OP_F32, 2, (int64_t[]){L, D}, hs);
  h_io_input(&h, "w_c", OP_F32, 1, (int64_t[]){D}, w);
  h_io_input(&h, "b_c", OP_F32, 1, (int64_t[]){1}, b);
  expect_run(&h, "dspark_confidence");
  expect_out(&h, "dspark_confidence", "a", OP_F32, 1, (int64_t[]){L}, a);
  h_io_free(&h);
  h.in[2].shape[0] = 2;
  expect_reject(&h, "dspark_confidence", "dspark_confidence: b_c is (2) but must be (1)");
  h.in[2].shape[0] = 1, h.in[1].shape[0] = D + 1;
  expect_reject(&h, "dspark_confidence", "w_c is (34) but must be (33) to match h (6, 33)");
  free(hs), free(w);
}

static void check_dspark_verify_len(uint64_t *seed) {
  enum { LMAX = 5 };
  float a[LMAX], t[LMAX + 1], e[LMAX + 1], score[LMAX + 1];
  h_fill(a, LMAX, seed, 0.05f, 0.95f);
  for (int L = 0; L <= LMAX; L++) t[L] = 1.0f + 0.1f * (float)L + (float)h_uniform(seed) * 0.05f;
  op_dspark_expected_accept(e, a, LMAX);
  int32_t best = op_dspark_verify_len(score, a, t, LMAX);
  EXPECT(best >= 0 && best <= LMAX, "direct L* %d", best);
  struct h_io h;
  h_io_init(&h);
  h_io_input(&h, "a", OP_F32, 1, (int64_t[]){LMAX}, a);
  h_io_input(&h, "t_round", OP_F32, 1, (int64_t[]){LMAX + 1}, t);
  expect_run(&h, "dspark_verify_len");
  expect_out(&h, "dspark_verify_len", "expected", OP_F32, 1, (int64_t[]){LMAX + 1}, e);
  expect_out(&h, "dspark_verify_len", "score", OP_F32, 1, (int64_t[]){LMAX + 1}, score);
  expect_out(&h, "dspark_verify_len", "L_star", OP_I32, 1, (int64_t[]){1}, &best);
  h_io_free(&h);
  h.in[1].shape[0] = LMAX;
  expect_reject(&h, "dspark_verify_len", "dspark_verify_len: t_round is (5) but must be (6) to match a");
  h.in[1].shape[0] = LMAX + 1, t[3] = 0;
  expect_reject(&h, "dspark_verify_len", "t_round[3] = 0 is not positive and finite");
  t[3] = INFINITY;
  expect_reject(&h, "dspark_verify_len", "t_round[3] = inf is not positive and finite");
}

/* ---- sample ---------------------------------------------------------------- */

static void check_sample(uint64_t *seed) {
  enum { N = 7, V = 61 };
  float *logits = fvec(N * V, seed, -4, 4), prob[N * V];
  int32_t ids[N], order[V];
  logits[2 * V + 7] = -INFINITY; /* a masked id */
  struct h_io h;
  for (int pass = 0; pass < 3; pass++) { /* greedy by default; temperature; temperature + top-p */
    float T = pass ? 0.7f : 0, top_p = pass == 2 ? 0.8f : 1;
    uint64_t rng = 987654321;
    for (int i = 0; i < N; i++) ids[i] = op_sample(prob + i * V, order, logits + i * V, V, T, top_p, &rng);
    h_io_init(&h);
    h_io_input(&h, "logits", OP_F32, 2, (int64_t[]){N, V}, logits);
    if (pass) h_io_param(&h, "temperature", 0.7), h_io_param(&h, "seed", 987654321);
    if (pass == 2) h_io_param(&h, "top_p", 0.8);
    expect_run(&h, "sample");
    expect_out(&h, "sample", "ids", OP_I32, 1, (int64_t[]){N}, ids);
    expect_out(&h, "sample", "prob", OP_F32, 2, (int64_t[]){N, V}, prob);
    h_io_free(&h);
  }
  h_io_param(&h, "temperature", -1);
  expect_reject(&h, "sample", "sample: temperature = -1 must be finite and >= 0");
  h.n_param = 0;
  h_io_param(&h, "seed", 1.5);
  expect_reject(&h, "sample", "parameter seed = 1.5 must be an integer");
  h.n_param = 0, h.in[0].dtype = OP_I32;
  expect_reject(&h, "sample", "input 'logits' must be F32");
  h.in[0].dtype = OP_F32, h.in[0].shape[1] = 0;
  expect_reject(&h, "sample", "it needs rows of 1 to");
  h.in[0].shape[1] = V, logits[3 * V + 1] = INFINITY;
  expect_reject(&h, "sample", "sample: logits row 3 holds NaN or +inf");
  free(logits);
}

int main(void) {
  op_blas_init();
  uint64_t seed = 0xDE5C0DE;
  check_table();
  check_moe(&seed);
  check_mhc(&seed);
  check_engram_hash(&seed);
  check_engram_gather(&seed);
  check_engram_inject(&seed);
  check_dspark_draft(&seed);
  check_dspark_confidence(&seed);
  check_dspark_verify_len(&seed);
  check_sample(&seed);
  return h_report("op descriptors: moe, mhc, engram, dspark, sample");
}
