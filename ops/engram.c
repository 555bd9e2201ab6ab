/* engram.c: Engram tables, hashing, row gather and injection (see engram.h
 * for the rules and the choices made where SPEC is silent). */
#include "ops/engram.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/formats.h"
#include "ops/np_random.h"
#include "ops/qlinear.h"
#include "ops/registry.h"
#include "ops/sample.h"
#include "base/check.h"

#define MAX_ORDER 64 /* longest n-gram op_engram_hash accepts */

/* ---- primes ------------------------------------------------------------- */

/* (a + b) mod m for a, b < m, without overflow. */
static uint64_t addmod(uint64_t a, uint64_t b, uint64_t m) { return a >= m - b ? a - (m - b) : a + b; }

/* (a * b) mod m for a, b < m: one product when it fits in 64 bits, else
 * shift-and-add (portable C11, no 128-bit type). */
static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) {
  if (a <= UINT32_MAX && b <= UINT32_MAX) return a * b % m;
  uint64_t r = 0;
  for (; b; b >>= 1) {
    if (b & 1) r = addmod(r, a, m);
    a = addmod(a, a, m);
  }
  return r;
}

static uint64_t powmod(uint64_t b, uint64_t e, uint64_t m) {
  uint64_t r = 1 % m;
  for (b %= m; e; e >>= 1) {
    if (e & 1) r = mulmod(r, b, m);
    b = mulmod(b, b, m);
  }
  return r;
}

int op_engram_is_prime(int64_t n) {
  /* These 12 bases decide every n < 3.3e24 exactly (Sorenson and Webster 2015). */
  static const uint64_t base[12] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  if (n < 2) return 0;
  uint64_t u = (uint64_t)n;
  for (int i = 0; i < 12; i++)
    if (u % base[i] == 0) return u == base[i];
  uint64_t d = u - 1;
  int s = 0;
  for (; !(d & 1); d >>= 1) s++;
  for (int i = 0; i < 12; i++) {
    uint64_t x = powmod(base[i], d, u);
    if (x == 1 || x == u - 1) continue;
    int witness = 1;
    for (int r = 1; r < s && witness; r++) {
      x = mulmod(x, x, u);
      if (x == u - 1) witness = 0;
    }
    if (witness) return 0;
  }
  return 1;
}

/* The smallest prime > p, or -1 when it would pass INT64_MAX. */
static int64_t next_prime(int64_t p) {
  while (p < INT64_MAX)
    if (op_engram_is_prime(++p)) return p;
  return -1;
}

int op_engram_tables_init(struct op_engram_tables *t, int n_modules, int n_orders, int n_heads, int64_t table_base) {
  memset(t, 0, sizeof *t);
  if (n_modules <= 0 || n_orders <= 0 || n_heads <= 0 || table_base < 2) return -1;
  size_t per = (size_t)n_orders * n_heads, all = per * n_modules;
  t->prime = malloc(all * sizeof *t->prime);
  t->offset = malloc(all * sizeof *t->offset);
  t->rows = malloc((size_t)n_modules * sizeof *t->rows);
  if (!t->prime || !t->offset || !t->rows) goto fail;
  int64_t p = table_base - 1; /* the first prime is the smallest > table_base - 1 */
  for (int m = 0; m < n_modules; m++) {
    int64_t sum = 0;
    for (size_t k = 0; k < per; k++) { /* (order, head) in order */
      if ((p = next_prime(p)) < 0 || sum > INT64_MAX - p) goto fail;
      t->prime[m * per + k] = p;
      t->offset[m * per + k] = sum;
      sum += p;
    }
    t->rows[m] = sum;
  }
  t->n_modules = n_modules, t->n_orders = n_orders, t->n_heads = n_heads, t->table_base = table_base;
  return 0;
fail:
  op_engram_tables_free(t);
  return -1;
}

void op_engram_tables_free(struct op_engram_tables *t) {
  free(t->prime);
  free(t->offset);
  free(t->rows);
  memset(t, 0, sizeof *t);
}

/* ---- hashing ------------------------------------------------------------ */

void op_engram_cmap_modulo(int32_t *cmap, int vocab, int compressed_vocab) {
  for (int t = 0; t < vocab; t++) cmap[t] = t % compressed_vocab;
}

void op_engram_multipliers_numpy(uint64_t *mult, int layer, int max_order, int64_t compressed_vocab) {
  CEDAR_ASSERT(compressed_vocab >= 1 && layer >= 0 && max_order >= 0);
  struct np_pcg64 g;
  np_default_rng(&g, 10007u * (uint64_t)layer);
  int64_t draw[MAX_ORDER];
  CEDAR_ASSERT(max_order <= MAX_ORDER);
  np_integers_i64(&g, (INT64_MAX / compressed_vocab) / 2, max_order, draw);
  for (int k = 0; k < max_order; k++) mult[k] = (uint64_t)(draw[k] * 2 + 1); /* < INT64_MAX: no wrap */
}

void op_engram_multipliers_splitmix64(uint64_t *mult, uint64_t seed, int layer, int max_order, int64_t id_bound) {
  uint64_t state = seed + 10007u * (uint64_t)layer;
  uint64_t half = 0;
  if (id_bound > 0) {
    half = (uint64_t)(INT64_MAX / id_bound) / 2;
    if (half < 1) half = 1;
  }
  for (int k = 0; k < max_order; k++) {
    uint64_t r = op_rng_next(&state);
    mult[k] = id_bound > 0 ? 2 * (r % half) + 1 : r | 1;
  }
}

/* g[k] for k < max_order at array index u: the compressed id k positions
 * back, or pad from the first position that is before tok[0] or at/behind
 * a dead position (a dead position is a sequence boundary). */
static void gram_ids(uint64_t *g, const int32_t *tok, const uint8_t *dead, const int32_t *cmap, int u,
                     int max_order, int32_t pad_id) {
  int cut = 0;
  for (int k = 0; k < max_order; k++) {
    if (u - k < 0 || (dead && dead[u - k])) cut = 1;
    g[k] = (uint64_t)(int64_t)(cut ? pad_id : cmap[tok[u - k]]); /* two's complement bits of the int64 id */
  }
}

int op_engram_hash(int64_t *row, const int32_t *tok, const uint8_t *dead, const int32_t *cmap, const uint64_t *mult,
                   const int *orders, const int64_t *prime, const int64_t *offset, int n_hist, int n, int vocab,
                   int n_orders, int n_heads, int32_t pad_id) {
  for (int u = 0; u < n_hist + n; u++)
    if (tok[u] < 0 || tok[u] >= vocab) return u;
  int max_order = 0;
  for (int o = 0; o < n_orders; o++) {
    CEDAR_ASSERT(orders[o] >= 1 && orders[o] <= MAX_ORDER);
    if (orders[o] > max_order) max_order = orders[o];
  }
  uint64_t g[MAX_ORDER];
  for (int i = 0; i < n; i++) {
    gram_ids(g, tok, dead, cmap, n_hist + i, max_order, pad_id);
    int64_t *ri = row + (size_t)i * n_orders * n_heads;
    for (int o = 0; o < n_orders; o++) {
      /* int64 products wrap as two's complement: the same bits as uint64
       * (ops/num_engram.h, shared with the CUDA kernels). */
      const uint64_t mix = op_hd_engram_mix(g, mult, orders[o]);
      for (int h = 0; h < n_heads; h++) {
        int j = o * n_heads + h;
        ri[j] = op_hd_engram_row(mix, prime[j], offset[j]);
      }
    }
  }
  return -1;
}

/* ---- row gather --------------------------------------------------------- */

size_t op_engram_row_bytes(int head_dim, int block) { return op_fp8_bytes(head_dim, block, OP_SCALE_E8M0); }

void op_engram_gather(float *e, const uint8_t *table, const int64_t *row, int n, int n_tables, int head_dim, int block,
                      int64_t n_rows) {
  size_t rb = op_engram_row_bytes(head_dim, block);
  CEDAR_ASSERT_MSG(rb > 0, "engram row: head_dim %d is not a multiple of block %d", head_dim, block);
  for (size_t j = 0; j < (size_t)n * n_tables; j++) {
    int64_t r = row[j];
    CEDAR_ASSERT_MSG(r >= 0 && r < n_rows, "engram row %lld outside the table (%lld rows)", (long long)r,
                     (long long)n_rows);
    op_fp8_unpack(e + j * head_dim, table + (size_t)r * rb, head_dim, block, OP_SCALE_E8M0);
  }
}

/* ---- injection ---------------------------------------------------------- */

/* gate = sigmoid(sign(dot) sqrt(max(|dot|, floor))) of one stream; a NaN dot
 * stays NaN (fmaxf would silently drop it). */
static float stream_gate(const float *x, const float *key, const float *q_w, const float *k_w, int hidden, float eps,
                         float dot_floor) {
  float ssx = 0.0f, ssk = 0.0f, s = 0.0f;
  for (int j = 0; j < hidden; j++) {
    ssx += x[j] * x[j];
    ssk += key[j] * key[j];
    s += (x[j] * q_w[j]) * (key[j] * k_w[j]);
  }
  /* Both RMSNorm factors as op_rmsnorm computes them, applied to the sum. */
  float rx = 1.0f / sqrtf(ssx / (float)hidden + eps);
  float rk = 1.0f / sqrtf(ssk / (float)hidden + eps);
  float dot = s * rx * rk / sqrtf((float)hidden);
  float z = dot == 0.0f ? 0.0f : isnan(dot) ? dot : copysignf(sqrtf(fmaxf(fabsf(dot), dot_floor)), dot);
  return op_sigmoid(z);
}

void op_engram_inject(float *x, float *kv, float *gate, const float *e, const float *w_kv, const float *q_w,
                      const float *k_w, int n, int d_e, int hidden, int hc, float norm_eps, float dot_floor) {
  struct op_qweight W = op_qw_f32(w_kv, (hc + 1) * hidden, d_e);
  op_engram_inject_q(x, kv, gate, e, &W, q_w, k_w, n, hidden, hc, norm_eps, dot_floor);
}

void op_engram_inject_q(float *x, float *kv, float *gate, const float *e, const struct op_qweight *w_kv,
                        const float *q_w, const float *k_w, int n, int hidden, int hc, float norm_eps,
                        float dot_floor) {
  int w = (hc + 1) * hidden;
  CEDAR_ASSERT(w_kv->out == w);
  op_qlinear(kv, e, w_kv, n, w_kv->in, w);
  for (int i = 0; i < n; i++) {
    const float *kvi = kv + (size_t)i * w;
    const float *value = kvi + (size_t)hc * hidden;
    for (int s = 0; s < hc; s++) {
      float *xs = x + ((size_t)i * hc + s) * hidden;
      float g = stream_gate(xs, kvi + (size_t)s * hidden, q_w + (size_t)s * hidden, k_w + (size_t)s * hidden,
                            hidden, norm_eps, dot_floor);
      if (gate) gate[(size_t)i * hc + s] = g;
      for (int j = 0; j < hidden; j++) xs[j] += g * value[j];
    }
  }
}

/* ---- registry descriptors (ops/registry.h) ------------------------------ */

/* Shape checks for the descriptors. (The same small helpers sit in each
 * family file that registers ops: registry.c offers none that format
 * shapes.) */

/* -- engram_hash --
 * The orders are four parameters o1..o4 (0 = unused) rather than a tensor:
 * SPEC's orders (2, 3, 4) are then the defaults, a CLI call needs no extra
 * tensor, and engram_max_ngram_size (4, R.1) bounds how many there are. The
 * tables are laid out for modules 0..module only: a module's primes depend
 * on the modules before it, never on those after it. */

#define ENGRAM_MAX_ORDERS 4
#define ENGRAM_MAX_TABLES 65536 /* primes one call may search (a typo such as heads=1e8 would run for minutes) */
#define ENGRAM_EXACT ((int64_t)1 << 53) /* integer parameters are doubles: exact up to here */

struct hash_args {
  int64_t module, layer, table_base, heads, scheme, seed, id_bound, pad_id, vocab, cvocab, n_hist;
  int orders[ENGRAM_MAX_ORDERS], n_orders, max_order;
};

struct hash_in {
  const struct op_tensor *tok, *dead, *cmap, *mult;
  int64_t td[1], dd[1], cd[1], md[1];
};

static bool hash_orders(const struct op_desc *self, struct op_io *io, struct hash_args *a) {
  static const char *const names[ENGRAM_MAX_ORDERS] = {"o1", "o2", "o3", "o4"};
  a->n_orders = a->max_order = 0;
  for (int k = 0; k < ENGRAM_MAX_ORDERS; k++) {
    int64_t o;
    if (!op_io_param_int(self, io, names[k], 0, 64, &o)) return false;
    if (o == 0) continue;
    if (a->n_orders != k)
      return op_io_fail(io, "engram_hash: %s = %lld follows an unused order (0); give the orders from o1 on",
                        names[k], (long long)o),
             false;
    a->orders[a->n_orders++] = (int)o;
    if (o > a->max_order) a->max_order = (int)o;
  }
  if (a->n_orders == 0) return op_io_fail(io, "engram_hash: no n-gram order: o1 must be at least 1"), false;
  return true;
}

static bool hash_params(const struct op_desc *self, struct op_io *io, struct hash_args *a) {
  if (!op_io_param_int(self, io, "module", 0, 1023, &a->module) || !op_io_param_int(self, io, "layer", 0, INT_MAX, &a->layer) ||
      !op_io_param_int(self, io, "table_base", 2, ENGRAM_EXACT, &a->table_base) ||
      !op_io_param_int(self, io, "heads", 1, ENGRAM_MAX_TABLES, &a->heads) ||
      !op_io_param_int(self, io, "scheme", 0, 1, &a->scheme) ||
      !op_io_param_int(self, io, "seed", 0, ENGRAM_EXACT, &a->seed) ||
      !op_io_param_int(self, io, "id_bound", 0, ENGRAM_EXACT, &a->id_bound) ||
      !op_io_param_int(self, io, "pad_id", INT32_MIN, INT32_MAX, &a->pad_id) ||
      !op_io_param_int(self, io, "vocab", 1, INT_MAX, &a->vocab) ||
      !op_io_param_int(self, io, "compressed_vocab", 1, INT_MAX, &a->cvocab) ||
      !op_io_param_int(self, io, "n_hist", 0, INT_MAX, &a->n_hist) || !hash_orders(self, io, a))
    return false;
  int64_t tables = (a->module + 1) * a->n_orders * a->heads;
  if (tables > ENGRAM_MAX_TABLES)
    return op_io_fail(io, "engram_hash: modules 0..%lld x %d orders x %lld heads = %lld tables; at most %d",
                      (long long)a->module, a->n_orders, (long long)a->heads, (long long)tables, ENGRAM_MAX_TABLES),
           false;
  return true;
}

static bool hash_inputs(const struct op_desc *self, struct op_io *io, struct hash_args *a, struct hash_in *h) {
  bool ok = true;
  if (!(h->tok = op_io_in(self, io, "tokens", 1, h->td))) return false;
  h->dead = op_io_in_opt(self, io, "dead", 1, h->dd, &ok);
  h->cmap = op_io_in_opt(self, io, "cmap", 1, h->cd, &ok);
  h->mult = op_io_in_opt(self, io, "mult", 1, h->md, &ok);
  if (!ok || !op_io_dims_fit_int(io, self->name, "tokens", h->td, 1)) return false;
  if (a->n_hist > h->td[0])
    return op_io_fail(io, "engram_hash: n_hist = %lld but tokens holds %lld ids", (long long)a->n_hist,
                      (long long)h->td[0]),
           false;
  if ((h->dead && !op_io_dims_match(io, self->name, "dead", h->dd, h->td, 1, "tokens", h->td, 1)) ||
      (h->mult && !op_io_dims_match(io, self->name, "mult", h->md, (int64_t[]){a->max_order}, 1, "the longest order", NULL, 0)))
    return false;
  if (h->cmap) { /* the table's length is the vocabulary */
    if (h->cd[0] < 1 || !op_io_dims_fit_int(io, self->name, "cmap", h->cd, 1))
      return op_io_fail(io, "engram_hash: cmap is (%lld); it needs one compressed id per token id", (long long)h->cd[0]),
             false;
    a->vocab = h->cd[0];
  }
  return true;
}

/* The multipliers, the cmap and the outputs, once the tables exist. */
static int hash_setup(const struct op_desc *self, struct op_io *io, const struct hash_args *a, const struct hash_in *h,
                      struct op_engram_hash_call *c) {
  if (h->mult)
    for (int k = 0; k < a->max_order; k++) c->mult[k] = (uint64_t)((const int64_t *)h->mult->data)[k];
  else if (a->scheme == 0)
    op_engram_multipliers_numpy(c->mult, (int)a->layer, a->max_order, a->cvocab);
  else
    op_engram_multipliers_splitmix64(c->mult, (uint64_t)a->seed, (int)a->layer, a->max_order, a->id_bound);
  if (a->pad_id < 0 || a->pad_id >= a->vocab)
    return op_io_fail(io, "engram_hash: pad_id %lld is not a token id in [0, %lld)", (long long)a->pad_id,
                      (long long)a->vocab);
  if (!h->cmap && !(c->own = malloc((size_t)a->vocab * sizeof *c->own)))
    return op_io_fail(io, "engram_hash: cannot allocate a cmap of %lld ids", (long long)a->vocab), CEDAR_ENOMEM;
  if (c->own) op_engram_cmap_modulo(c->own, (int)a->vocab, (int)a->cvocab);
  c->cmap = c->own ? c->own : h->cmap->data;
  c->n = (int)(h->td[0] - a->n_hist), c->n_hist = (int)a->n_hist, c->vocab = (int)a->vocab;
  c->n_orders = a->n_orders, c->heads = (int)a->heads, c->max_order = a->max_order;
  for (int o = 0; o < a->n_orders; o++) c->orders[o] = a->orders[o];
  c->tok = h->tok->data, c->dead = h->dead ? h->dead->data : NULL;
  c->prime = op_engram_primes_of(&c->t, (int)a->module), c->offset = op_engram_offsets_of(&c->t, (int)a->module);
  c->pad = c->cmap[a->pad_id];
  c->rows = op_io_out(self, io, "rows", 3, (int64_t[]){c->n, a->n_orders, a->heads});
  int64_t *table_rows = c->rows ? op_io_out(self, io, "table_rows", 1, (int64_t[]){1}) : NULL;
  if (!table_rows) return CEDAR_ENOMEM;
  table_rows[0] = c->t.rows[a->module];
  return 0;
}

int op_engram_hash_prepare(const struct op_desc *self, struct op_io *io, struct op_engram_hash_call *c) {
  struct hash_args a;
  struct hash_in h;
  memset(c, 0, sizeof *c);
  if (!hash_params(self, io, &a) || !hash_inputs(self, io, &a, &h)) return CEDAR_EINVAL;
  if (op_engram_tables_init(&c->t, (int)a.module + 1, a.n_orders, (int)a.heads, a.table_base))
    return op_io_fail(io, "engram_hash: no table layout from table_base %lld (a module's rows would pass INT64_MAX, "
                          "or out of memory)", (long long)a.table_base);
  c->have_tables = true;
  int rc = hash_setup(self, io, &a, &h, c);
  if (rc) op_engram_hash_release(c);
  return rc;
}

void op_engram_hash_release(struct op_engram_hash_call *c) {
  if (c->have_tables) op_engram_tables_free(&c->t);
  free(c->own);
  c->own = NULL, c->have_tables = false;
}

int op_engram_hash_bad_token(struct op_io *io, const struct op_engram_hash_call *c, int bad) {
  return op_io_fail(io, "engram_hash: token %d at position %d is outside the vocabulary [0, %lld)", c->tok[bad], bad,
                    (long long)c->vocab);
}

static int engram_hash_run(const struct op_desc *self, struct op_io *io) {
  struct op_engram_hash_call c = {0};
  int rc = op_engram_hash_prepare(self, io, &c);
  if (rc) return rc;
  int bad = op_engram_hash(c.rows, c.tok, c.dead, c.cmap, c.mult, c.orders, c.prime, c.offset, c.n_hist, c.n, c.vocab,
                           c.n_orders, c.heads, c.pad);
  if (bad >= 0) rc = op_engram_hash_bad_token(io, &c, bad);
  op_engram_hash_release(&c);
  return rc;
}

const struct op_desc op_desc_engram_hash = {
    .name = "engram_hash",
    .summary = "Engram n-gram hash: table rows of each position from token ids alone (SPEC 3.15, Appendix V #18)",
    .inputs =
        (const struct op_arg[]){
            {"tokens", OP_I32, "(n_hist + n)", "token ids; the first n_hist are history only"},
            {"dead", OP_U8, "(n_hist + n)", "optional: non-zero at dead (image) positions, which act as a sequence start"},
            {"cmap", OP_I32, "(vocab)", "optional: token id -> compressed id (the checkpoint's normalizer); its length "
                                        "is the vocabulary. Absent: id mod compressed_vocab"},
            {"mult", OP_I64, "(max order)", "optional: the layer's hash multipliers. Absent: from scheme and layer"},
            {0}},
    .outputs = (const struct op_arg[]){{"rows", OP_I64, "(n, orders, heads)", "row of each table inside the module's table"},
                                       {"table_rows", OP_I64, "(1)", "rows of the module's table (sum of its primes)"},
                                       {0}},
    .params = (const struct op_param[]){{"module", OP_PARAM_INT, 0, "Engram module index (0 at L1, 1 at L14) [A]"},
                                        {"layer", OP_PARAM_INT, 1, "the module's layer, seeds the multipliers [A]"},
                                        {"table_base", OP_PARAM_INT, 16000000, "primes start above this - 1 [R-cfg]"},
                                        {"heads", OP_PARAM_INT, 8, "hash heads per order [A]"},
                                        {"o1", OP_PARAM_INT, 2, "first n-gram order [A]"},
                                        {"o2", OP_PARAM_INT, 3, "second order, 0 = none [A]"},
                                        {"o3", OP_PARAM_INT, 4, "third order, 0 = none [A]"},
                                        {"o4", OP_PARAM_INT, 0, "fourth order, 0 = none [cedar: room for max_ngram_size 4]"},
                                        {"scheme", OP_PARAM_INT, 0, "multipliers: 0 numpy default_rng(10007 layer) "
                                                                    "over compressed_vocab [V #18]; 1 splitmix64 [cedar]"},
                                        {"seed", OP_PARAM_INT, 0, "splitmix64 multiplier seed (scheme 1) [cedar]"},
                                        {"id_bound", OP_PARAM_INT, 0, "scheme 1: 0 full-range odd multipliers; > 0 the "
                                                                      "demo's range for ids below it [cedar]"},
                                        {"pad_id", OP_PARAM_INT, 2, "engram_pad_token_id; the pad is cmap[pad_id] "
                                                                    "[V #18]"},
                                        {"vocab", OP_PARAM_INT, 129280, "token ids are in [0, vocab) [R]; cmap's "
                                                                        "length when given"},
                                        {"compressed_vocab", OP_PARAM_INT, 99092, "for the modulo cmap [R-cfg]"},
                                        {"n_hist", OP_PARAM_INT, 0, "leading history ids (decode: max order - 1)"},
                                        {0}},
    .run = engram_hash_run,
};

/* -- engram_gather -- */

int op_engram_gather_prepare(const struct op_desc *self, struct op_io *io, struct op_engram_gather_call *c) {
  int64_t td[2], rd[3], hd, blk;
  const struct op_tensor *table = op_io_in(self, io, "table", 2, td), *rows = NULL;
  if (!table || !(rows = op_io_in(self, io, "rows", 3, rd)) || !op_io_param_int(self, io, "head_dim", 1, INT_MAX, &hd) ||
      !op_io_param_int(self, io, "block", 1, INT_MAX, &blk) || !op_io_dims_fit_int(io, self->name, "rows", rd, 3))
    return CEDAR_EINVAL;
  size_t rb = op_engram_row_bytes((int)hd, (int)blk);
  if (!rb)
    return op_io_fail(io, "engram_gather: head_dim %lld is not a multiple of block %lld", (long long)hd,
                      (long long)blk);
  if (td[1] != (int64_t)rb)
    return op_io_fail(io, "engram_gather: table rows are %lld bytes; head_dim %lld with block %lld needs %zu "
                          "(E4M3 values, then E8M0 scales)", (long long)td[1], (long long)hd, (long long)blk, rb);
  int64_t n = rd[0], tables = rd[1] * rd[2];
  if (tables > INT_MAX) return op_io_fail(io, "engram_gather: %lld tables per position is too many", (long long)tables);
  const int64_t *r = rows->data;
  for (int64_t j = 0; j < n * tables; j++)
    if (r[j] < 0 || r[j] >= td[0])
      return op_io_fail(io, "engram_gather: rows[%lld, %lld, %lld] = %lld is outside the table's %lld rows",
                        (long long)(j / tables), (long long)(j % tables / rd[2]), (long long)(j % rd[2]),
                        (long long)r[j], (long long)td[0]);
  float *e = op_io_out(self, io, "e", 2, (int64_t[]){n, tables * hd});
  if (!e) return CEDAR_ENOMEM;
  *c = (struct op_engram_gather_call){.e = e, .table = table->data, .rows = r, .n = (int)n, .tables = (int)tables,
                                      .head_dim = (int)hd, .block = (int)blk, .n_rows = td[0], .row_bytes = rb};
  return 0;
}

static int engram_gather_run(const struct op_desc *self, struct op_io *io) {
  struct op_engram_gather_call c = {0};
  int rc = op_engram_gather_prepare(self, io, &c);
  if (!rc) op_engram_gather(c.e, c.table, c.rows, c.n, c.tables, c.head_dim, c.block, c.n_rows);
  return rc;
}

const struct op_desc op_desc_engram_gather = {
    .name = "engram_gather",
    .summary = "Engram row gather: dequantize the FP8 rows of each position and concatenate (SPEC 3.15, R.8)",
    .inputs = (const struct op_arg[]){{"table", OP_U8, "(table_rows, row_bytes)", "the module's table, one packed "
                                                                                   "row each (264 B at 256/32)"},
                                      {"rows", OP_I64, "(n, orders, heads)", "row indices, as engram_hash writes them"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"e", OP_F32, "(n, orders * heads * head_dim)", "concatenated rows"}, {0}},
    .params = (const struct op_param[]){{"head_dim", OP_PARAM_INT, 256, "values per row [R-cfg]"},
                                        {"block", OP_PARAM_INT, 32, "values per E8M0 scale [R-cfg]"},
                                        {0}},
    .run = engram_gather_run,
};

/* -- engram_inject -- */

int op_engram_inject_prepare(const struct op_desc *self, struct op_io *io, struct op_engram_inject_call *c) {
  int64_t xd[3], ed[2], wd[2], qd[2], kd[2];
  const struct op_tensor *X = op_io_in(self, io, "X", 3, xd), *e = NULL, *w = NULL, *q = NULL, *k = NULL;
  if (!X || !(e = op_io_in(self, io, "e", 2, ed)) || !(w = op_io_in(self, io, "w_kv", 2, wd)) ||
      !(q = op_io_in(self, io, "q_w", 2, qd)) || !(k = op_io_in(self, io, "k_w", 2, kd)) ||
      !op_io_dims_fit_int(io, self->name, "X", xd, 3) || !op_io_dims_fit_int(io, self->name, "e", ed, 2))
    return CEDAR_EINVAL;
  int64_t n = xd[0], hc = xd[1], hidden = xd[2], kvw = (hc + 1) * hidden;
  if (hc < 1 || hidden < 1 || kvw > INT_MAX) {
    char b[192];
    return op_io_fail(io, "engram_inject: X is %s; it needs hc >= 1 streams of hidden >= 1 values, (hc + 1) * hidden "
                          "at most %d", op_dims_str(b, sizeof b, xd, 3), INT_MAX);
  }
  float norm_eps, dot_floor;
  if (!op_io_dims_match(io, self->name, "e", ed, (int64_t[]){n, ed[1]}, 2, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "w_kv", wd, (int64_t[]){kvw, wd[1]}, 2, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "w_kv", wd, (int64_t[]){kvw, ed[1]}, 2, "e", ed, 2) ||
      !op_io_dims_match(io, self->name, "q_w", qd, (int64_t[]){hc, hidden}, 2, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "k_w", kd, (int64_t[]){hc, hidden}, 2, "X", xd, 3) ||
      !op_io_param_nonneg(self, io, "norm_eps", &norm_eps) || !op_io_param_nonneg(self, io, "dot_floor", &dot_floor))
    return CEDAR_EINVAL;
  float *Xn = op_io_out(self, io, "X_next", 3, xd);
  float *kv = Xn ? op_io_out(self, io, "kv", 2, (int64_t[]){n, kvw}) : NULL;
  float *gate = kv ? op_io_out(self, io, "gate", 2, (int64_t[]){n, hc}) : NULL;
  if (!gate) return CEDAR_ENOMEM;
  *c = (struct op_engram_inject_call){.X = X->data, .e = e->data, .w_kv = w->data, .q_w = q->data, .k_w = k->data,
                                      .X_next = Xn, .kv = kv, .gate = gate, .n = (int)n, .d_e = (int)ed[1],
                                      .hidden = (int)hidden, .hc = (int)hc, .norm_eps = norm_eps,
                                      .dot_floor = dot_floor};
  return 0;
}

static int engram_inject_run(const struct op_desc *self, struct op_io *io) {
  struct op_engram_inject_call c = {0};
  int rc = op_engram_inject_prepare(self, io, &c);
  if (rc) return rc;
  memcpy(c.X_next, c.X, (size_t)c.n * c.hc * c.hidden * sizeof *c.X_next);
  op_engram_inject(c.X_next, c.kv, c.gate, c.e, c.w_kv, c.q_w, c.k_w, c.n, c.d_e, c.hidden, c.hc, c.norm_eps,
                   c.dot_floor);
  return 0;
}

const struct op_desc op_desc_engram_inject = {
    .name = "engram_inject",
    .summary = "Engram gated injection: X_i += sigmoid(gate_i) * value for each stream (SPEC 3.15, R.8)",
    .inputs = (const struct op_arg[]){{"X", OP_F32, "(n, hc, hidden)", "residual streams"},
                                      {"e", OP_F32, "(n, d_e)", "gathered rows (engram_gather)"},
                                      {"w_kv", OP_F32, "((hc + 1) * hidden, d_e)", "hc keys then the value"},
                                      {"q_w", OP_F32, "(hc, hidden)", "RMSNorm weight of each stream"},
                                      {"k_w", OP_F32, "(hc, hidden)", "RMSNorm weight of each key"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"X_next", OP_F32, "(n, hc, hidden)", "streams after the injection"},
                                       {"kv", OP_F32, "(n, (hc + 1) * hidden)", "e w_kv^T"},
                                       {"gate", OP_F32, "(n, hc)", "gate of each stream"},
                                       {0}},
    .params = (const struct op_param[]){{"norm_eps", OP_PARAM_FLOAT, 1e-6, "RMSNorm eps [R] (SPEC 1.1; R.1 reports "
                                                                           "1e-20)"},
                                        {"dot_floor", OP_PARAM_FLOAT, 1e-6, "floor of |dot| under the sqrt [R]"},
                                        {0}},
    .run = engram_inject_run,
};
