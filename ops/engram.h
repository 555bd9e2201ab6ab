/* engram.h: Engram conditional memory (SPEC 1.4, 3.15, 8.6 items 28-30, R.8):
 * the prime-sized hash tables, n-gram hashing of token ids, the FP8 row
 * gather, and the gated injection into the mHC residual streams.
 *
 * The flow for one Engram layer (module m):
 *   1. op_engram_tables_init once per model: primes, offsets, rows.
 *   2. op_engram_multipliers once per layer: the hash multipliers.
 *   3. op_engram_hash: row indices from token ids alone (SPEC 8.6.28); it
 *      can run at tokenization time, before any hidden state exists.
 *   4. op_engram_gather: dequantize the rows into e (n, tables * head_dim).
 *   5. op_engram_inject: X_i += gate_i * value for each residual stream.
 *
 * Prime rule [R-cfg, R.8]: iterate (module, order, head) in that order; each
 * prime is the smallest prime greater than the previous one, the first the
 * smallest prime > table_base - 1 (table_base = engram_vocab_size, 16e6 in
 * V4.1-Flash), so all primes are distinct. Table (m, o, h) has prime rows;
 * module m's table has the sum of its primes as rows; offset (m, o, h) is
 * the prefix sum of the primes before it inside module m. Primality is
 * decided by Miller-Rabin with the first 12 prime bases, which is exact for
 * every n < 3.3e24, so for all int64.
 *
 * Hash [R-cfg/R, R.8; cedar choices marked]:
 *   c_t   = cmap[tok_t], the compressed id (a text normalizer's table in
 *           the checkpoint; op_engram_cmap_modulo, identity or t mod C, for
 *           synthetic weights);
 *   g_k   = the id k positions back (k = 0 is the current token). It is the
 *           pad id when that position is before the start of the sequence,
 *           or when the n-gram reaches back across a dead (image) position:
 *           [cedar] a dead position acts like the start of the sequence, so
 *           every g_k with t-k <= the last dead position <= t is pad (a dead
 *           position's own n-grams are all pad);
 *   mix_n = XOR_{k<n} (g_k * mult[k])  in int64 arithmetic: products wrap
 *           (two's complement), as the vendor's numpy int64 does;
 *   row   = floor_mod(mix_n, prime[o][h]) + offset[o][h]: Python's modulo,
 *           never negative (Appendix V #18; a uint64 modulo differs as soon
 *           as a product wraps: multipliers [-1, 3], ids [5, pad 2], prime
 *           16000057 give 16000054, not 9903347).
 *   The pad is the compressed id of engram_pad_token_id: the caller passes
 *   cmap[pad_token] (Appendix V #18: pad = map[2]).
 * Multipliers [Appendix V #18, the vendor's]: op_engram_multipliers_numpy,
 * numpy.random.default_rng(10007 * layer).integers(0, (INT64_MAX // Vc) //
 * 2, size=max_order, dtype=int64) * 2 + 1 with Vc the compressed
 * vocabulary (ops/np_random.h). Their products with ids below Vc never
 * pass INT64_MAX.
 * [cedar's older scheme, plan option `multipliers: splitmix64`]:
 * op_engram_multipliers_splitmix64, splitmix64 (ops/sample.h) seeded with
 * seed + 10007 * layer, one draw per multiplier k = 0..max_order-1.
 * With id_bound > 0 each is 2 * (draw mod h) + 1, h = max(1, (INT64_MAX /
 * id_bound) / 2); id_bound = 0 gives full-range odd multipliers (draw | 1),
 * whose products wrap. A checkpoint's multipliers may also be given as an
 * array: the hash takes them as one.
 *
 * Row format [R-cfg, R.8]: head_dim E4M3 values then head_dim/block E8M0
 * scales: exactly the SWA E8M0 entry of ops/formats.h (docs/formats.md 2.3),
 * 256 + 8 = 264 bytes at head_dim 256, block 32.
 *
 * Injection [R, R.8 form; SPEC 3.15's simpler gate is the other reading]:
 *   kv = e W_kv^T, (hc + 1) * hidden wide: key i in columns
 *        [i*hidden, (i+1)*hidden) for i < hc, the value in the last hidden;
 *   dot_i  = (RMSNorm(x_i) * q_w[i]) . (RMSNorm(key_i) * k_w[i]) / sqrt(hidden)
 *   gate_i = sigmoid(sign(dot_i) * sqrt(max(|dot_i|, dot_floor)))   (1e-6)
 *   x_i   += gate_i * value.
 * RMSNorm as op_rmsnorm (eps is the model's norm eps). The checkpoint's FP8
 * projection weights are dequantized to fp32 by the loader before this op.
 *
 * Not here: prefetching rows from host memory, table storage, plans.
 * Test: tests/test_ops_engram.c (ctest -R ops_engram).
 */
#ifndef CEDAR_OPS_ENGRAM_H
#define CEDAR_OPS_ENGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/num_engram.h"
#include "ops/qweight.h"

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

/* The table layout of every Engram module of a model. */
struct op_engram_tables {
  int n_modules, n_orders, n_heads;
  int64_t table_base;
  int64_t *prime;  /* (n_modules, n_orders, n_heads) */
  int64_t *offset; /* (n_modules, n_orders, n_heads): first row inside the module's table */
  int64_t *rows;   /* (n_modules): rows of each module's table */
};

/* Fill t by the prime rule. Returns 0, or -1 (t zeroed, nothing allocated)
 * when a count is not positive, table_base < 2, a row sum would overflow
 * int64, or allocation fails. */
int op_engram_tables_init(struct op_engram_tables *t, int n_modules, int n_orders, int n_heads, int64_t table_base);
void op_engram_tables_free(struct op_engram_tables *t);

/* Module m's (n_orders, n_heads) primes and offsets, for op_engram_hash. */
static inline const int64_t *op_engram_primes_of(const struct op_engram_tables *t, int m) {
  return t->prime + (size_t)m * t->n_orders * t->n_heads;
}
static inline const int64_t *op_engram_offsets_of(const struct op_engram_tables *t, int m) {
  return t->offset + (size_t)m * t->n_orders * t->n_heads;
}

/* true when n is prime (deterministic for all n >= 0). */
int op_engram_is_prime(int64_t n);

/* cmap[t] = t mod compressed_vocab: the identity when compressed_vocab >=
 * vocab. The synthetic-weights stand-in for the checkpoint's normalizer. */
void op_engram_cmap_modulo(int32_t *cmap /* (vocab) */, int vocab, int compressed_vocab);

/* The vendor's max_order (<= 64) odd multipliers of one Engram layer:
 * NumPy's default_rng(10007 * layer), compressed_vocab >= 1 (see the header).
 * Stored as the int64 values' bits. */
void op_engram_multipliers_numpy(uint64_t *mult /* (max_order) */, int layer, int max_order, int64_t compressed_vocab);

/* cedar's older scheme (plan option `multipliers: splitmix64`; the header). */
void op_engram_multipliers_splitmix64(uint64_t *mult /* (max_order) */, uint64_t seed, int layer, int max_order,
                                      int64_t id_bound);

/* a mod p with Python's sign rule for p > 0: the result is in [0, p). */
static inline int64_t op_engram_floor_mod(int64_t a, int64_t p) { return op_hd_floor_mod(a, p); }

/* Row indices (inside the module's table) of positions n_hist .. n_hist+n-1
 * of tok. The first n_hist ids are history only (a decode step passes the
 * last max_order - 1 ids, SPEC 3.15); positions before tok[0] count as
 * before the sequence start. orders are the n-gram lengths (>= 1, at most
 * 64; SPEC: 2, 3, 4); mult has max(orders) entries. Returns -1 on success,
 * or the index in tok of the first id outside [0, vocab), writing nothing.
 * pad_id is a compressed id: cmap[engram_pad_token_id]. mult holds int64
 * bits. */
int op_engram_hash(int64_t *row /* (n, n_orders, n_heads) */, const int32_t *tok /* (n_hist + n) */,
                   const uint8_t *dead /* (n_hist + n) or NULL */, const int32_t *cmap /* (vocab) */,
                   const uint64_t *mult /* (max order) */, const int *orders /* (n_orders) */,
                   const int64_t *prime /* (n_orders, n_heads) */, const int64_t *offset /* (n_orders, n_heads) */,
                   int n_hist, int n, int vocab, int n_orders, int n_heads, int32_t pad_id);

/* Bytes of one table row: op_fp8_bytes(head_dim, block, E8M0); 0 if invalid. */
size_t op_engram_row_bytes(int head_dim, int block);

/* e[i, j*head_dim ...] = dequant(table[row[i, j]]) for the n_tables rows of
 * each position (j runs over (order, head) as op_engram_hash writes them).
 * table holds n_rows rows of op_engram_row_bytes bytes; a row index outside
 * [0, n_rows) is an internal error (assert). */
void op_engram_gather(float *e /* (n, n_tables * head_dim) */, const uint8_t *table /* (n_rows, row_bytes) */,
                      const int64_t *row /* (n, n_tables) */, int n, int n_tables, int head_dim, int block,
                      int64_t n_rows);

/* Gated injection (see the header). x is updated in place; kv receives
 * e W_kv^T; gate (optional) receives gate_i per position and stream. */
void op_engram_inject(float *x /* (n, hc, hidden) */, float *kv /* (n, (hc + 1) * hidden) */,
                      float *gate /* (n, hc) or NULL */, const float *e /* (n, d_e) */,
                      const float *w_kv /* ((hc + 1) * hidden, d_e) */, const float *q_w /* (hc, hidden) */,
                      const float *k_w /* (hc, hidden) */, int n, int d_e, int hidden, int hc, float norm_eps,
                      float dot_floor);
/* The same with w_kv ((hc + 1) * hidden, d_e) in its stored format
 * (ops/qweight.h): bitwise the float op over the dequantized matrix. */
void op_engram_inject_q(float *x, float *kv, float *gate, const float *e, const struct op_qweight *w_kv,
                        const float *q_w, const float *k_w, int n, int hidden, int hc, float norm_eps,
                        float dot_floor);

/* The engram_hash descriptor's checked call: tables, multipliers, the cmap
 * (its own when the caller gave none) and the outputs, shared by its CPU run
 * and the CUDA twin (kernels/engram.cu). 0 or the status after op_io_fail;
 * on 0 the caller runs the hash into rows and calls op_engram_hash_release.
 * A token outside [0, vocab) is refused after the hash finds it:
 * op_engram_hash_bad_token(io, c, index) says so. */
struct op_desc;
struct op_io;
struct op_engram_hash_call {
  struct op_engram_tables t;
  bool have_tables;
  int32_t *own;          /* the modulo cmap when the caller gave none */
  uint64_t mult[64];
  const int32_t *tok, *cmap;
  const uint8_t *dead;
  const int64_t *prime, *offset;
  int orders[4], n_orders, max_order, n_hist, n, vocab, heads;
  int32_t pad;
  int64_t *rows;         /* output (n, n_orders, heads) */
};
int op_engram_hash_prepare(const struct op_desc *self, struct op_io *io, struct op_engram_hash_call *c);
void op_engram_hash_release(struct op_engram_hash_call *c);
int op_engram_hash_bad_token(struct op_io *io, const struct op_engram_hash_call *c, int bad);
/* engram_gather's and engram_inject's checked calls (outputs allocated). */
struct op_engram_gather_call {
  float *e;
  const uint8_t *table;
  const int64_t *rows;
  int n, tables, head_dim, block;
  int64_t n_rows;
  size_t row_bytes;
};
int op_engram_gather_prepare(const struct op_desc *self, struct op_io *io, struct op_engram_gather_call *c);
struct op_engram_inject_call {
  const float *X, *e, *w_kv, *q_w, *k_w;
  float *X_next, *kv, *gate;
  int n, d_e, hidden, hc;
  float norm_eps, dot_floor;
};
int op_engram_inject_prepare(const struct op_desc *self, struct op_io *io, struct op_engram_inject_call *c);

#ifdef __cplusplus
}
#endif

#endif
