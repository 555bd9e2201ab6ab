/* engram.c: Engram tables, hashing, row gather and injection (see engram.h
 * for the rules and the choices made where SPEC is silent). */
#include "ops/engram.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/formats.h"
#include "ops/sample.h"
#include "runtime/check.h"

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

void op_engram_multipliers(uint64_t *mult, uint64_t seed, int layer, int max_order, int64_t id_bound) {
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
    g[k] = (uint64_t)(int64_t)(cut ? pad_id : cmap[tok[u - k]]);
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
      uint64_t mix = 0;
      for (int k = 0; k < orders[o]; k++) mix ^= g[k] * mult[k]; /* wraps mod 2^64 */
      for (int h = 0; h < n_heads; h++) {
        int j = o * n_heads + h;
        ri[j] = (int64_t)(mix % (uint64_t)prime[j]) + offset[j];
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
  int w = (hc + 1) * hidden;
  op_linear(kv, e, w_kv, n, d_e, w, d_e, w);
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
