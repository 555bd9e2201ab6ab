/* compressor.h: the KV-source compressor and global entry emission
 * (SPEC 3.7, 3.8, 3.9 tail rule, 4.2-4.3, R.3, R.4).
 *
 * Ratio r >= 1. Per position i: v_i = W_kv u_i, g_i = W_gate u_i (gate only
 * when r > 1: a ratio-1 layer has no gate weights and these functions never
 * read one). Group j = positions [r j, r j + r), non-overlapping. A group
 * completed in a call becomes one entry:
 *   c_hat[c] = sum_i softmax_i(g[., c]) v_i[c]     per channel, over the r slots
 *   c        = RMSNorm_C(c_hat)                     the normalised latent
 *   kI       = W_ik c (+ optional k_norm), indexer RoPE at r j, MXFP4
 *   kM       = c, main RoPE at r j, FP4            (quantized after RoPE)
 * kI comes from c before any RoPE or quantization, never from the FP4 bytes
 * (SPEC 3.8, 8.10). Entry position = the group's first token, r j.
 *
 * A group left unfinished at the end of a call stays in a caller-owned tail
 * (struct op_comp_tail: up to r-1 projected (v, g) rows in fp32) and is never
 * emitted (SPEC 3.9); the next call must continue at the tail's next position.
 *
 * Split invariance (SPEC 8.2.12). Once v and g exist, everything is per group
 * with a fixed arithmetic order: op_comp_push emits bit-identical entries,
 * floats and tails however the positions are split into calls. The only
 * split-dependent step was the projection (op_comp_project, a GEMM over the
 * call's n rows; op_linear is now row-invariant, ops/basic.h, so op_compress
 * agrees across splits bit for bit too). It was why the tail keeps projected
 * rows (each row is projected once, in the call that first sees it) and why
 * W_ik runs as a 1-row GEMM per entry rather than batched over a call's
 * entries: d x idx_dim multiply-adds per entry, 2.5% of the projection's at
 * ratio 1 and 0.6% at ratio 2 for SPEC widths (a gemv is slower per flop than
 * a GEMM, but W_ik, 256 KiB, stays in cache).
 *
 * Not here: pages, which pool an entry belongs to, visibility (SPEC 3.9 is
 * the scorer's business), the tail's persistence (runtime/).
 * Test: tests/test_ops_compressor.c (ctest -R ops_compressor).
 */
#ifndef CEDAR_OPS_COMPRESSOR_H
#define CEDAR_OPS_COMPRESSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/formats.h"
#include "ops/rope.h"

#ifdef __cplusplus /* the CUDA twin in kernels/ includes it */
extern "C" {
#endif

/* An unfinished group, carried across calls. Caller-owned: the rows live in a
 * caller buffer of op_comp_tail_floats(ratio, d) floats. A ratio-1 tail has
 * no rows (v = g = NULL) and only tracks the next position. */
struct op_comp_tail {
  int ratio, d;  /* tokens per group; latent width */
  int count;     /* pending rows, 0 .. ratio - 1 */
  int64_t pos0;  /* absolute position of the first pending row, a multiple of
                    ratio; the next call must start at pos0 + count */
  float *v;      /* (ratio - 1, d): projected values of the pending rows */
  float *g;      /* (ratio - 1, d): their gate scores */
};

/* The compressor of one KV-source layer: weights, widths, RoPE and storage
 * formats. Grouped in a struct because the same 17 values go to every call
 * and a positional list that long invites swapped arguments. */
struct op_comp_layer {
  int ratio;                   /* r: 2 for encoder sources, 1 for L20 [A] */
  int hidden, d, idx_dim;      /* input width; latent width (head_dim, 512 [A]); indexer K width (128 [A]) */
  const float *W_kv;           /* (d, hidden) */
  const float *W_gate;         /* (d, hidden) when ratio > 1; ignored (may be NULL) when ratio == 1 */
  const float *gamma;          /* (d) RMSNorm_C weight, or NULL */
  const float *W_ik;           /* (idx_dim, d) indexer key projection */
  bool k_norm;                 /* plan `indexer.k_norm` (default false [R]): RMSNorm on kI */
  const float *k_gamma;        /* (idx_dim) or NULL: the k_norm weight */
  float eps;                   /* model.norm_eps (default 1e-6 [R]) for both norms */
  const struct op_rope *rope;  /* main RoPE, dim == d (CSA2: theta 160000 + YaRN [R-cfg]) */
  const struct op_rope *rope_i; /* indexer RoPE, dim == idx_dim */
  struct op_kv_format main_fmt; /* Main KV storage (plan formats.main_kv; E2M1 + E4M3 per 16 [A]) */
  struct op_kv_format idx_fmt;  /* Indexer K storage (plan formats.indexer_k; MXFP4 per 32 [A]) */
};

/* Where a call's entries go, in emission order. Entry e of the call is at
 * entries + e * entry_bytes, its Main-KV part (op_kv_bytes(main_fmt, d))
 * at main_off and its Indexer-K part (op_kv_bytes(idx_fmt, idx_dim)) at
 * idx_off, as ops/kvview.h reads them; bytes outside the two parts are not
 * written. The float arrays, each optional, expose the values before packing
 * (for tests and debugging). */
struct op_comp_out {
  uint8_t *entries;  /* (max_entries, entry_bytes) */
  size_t entry_bytes, main_off, idx_off;
  int max_entries;   /* capacity: a call that would emit more fails */
  int64_t *pos;      /* (max_entries) or NULL: entry positions r j */
  float *c;          /* (max_entries, d) or NULL: normalised latent, before RoPE */
  float *kM;         /* (max_entries, d) or NULL: Main KV after RoPE, before FP4 */
  float *kI;         /* (max_entries, idx_dim) or NULL: Indexer K after k_norm and RoPE, before MXFP4 */
};

/* Floats a tail of this ratio and width needs: 2 (ratio - 1) d. */
size_t op_comp_tail_floats(int ratio, int d);

/* An empty tail whose first group starts at `start` (0 for a new request, the
 * boundary for a prefix hit). Returns 0, or -1 when start is negative or not
 * a multiple of ratio (a group cannot begin mid-group). */
int op_comp_tail_init(struct op_comp_tail *t, float *buf /* (op_comp_tail_floats(ratio, d)) or NULL if ratio == 1 */,
                      int ratio, int d, int64_t start);

/* Entries a call of n positions emits: floor((count + n) / ratio). */
static inline int op_comp_n_emit(const struct op_comp_tail *t, int n) { return (t->count + n) / t->ratio; }

/* Work floats op_comp_push needs (entries go a few at a time, COMP_BLOCK in
 * compressor.c): 8 (2 d + idx_dim) + 3 d. */
size_t op_comp_work_floats(int d, int idx_dim);
/* Scratch op_compress needs for n positions: n d (v), n d more for g when
 * ratio > 1, plus op_comp_work_floats. */
size_t op_comp_scratch_floats(int n, int ratio, int d, int idx_dim);

/* v = W_kv u and, when ratio > 1, g = W_gate u. With ratio == 1 neither
 * W_gate nor g is touched (both may be NULL). */
void op_comp_project(float *v /* (n, d) */, float *g /* (n, d), or NULL when ratio == 1 */,
                     const float *u /* (n, hidden) */, int n, const struct op_comp_layer *L);

/* Feed projected rows of positions [a, a + n) through the tail: emits one
 * entry per group completed, in order, into `out`, and leaves the rest in the
 * tail. Returns the number of entries emitted, or -1 (and changes nothing)
 * when a != tail->pos0 + tail->count or out->max_entries is too small.
 * Bitwise independent of how positions are split into calls (header note).
 * ang: NULL, or the RoPE angles of the call's rows under L->rope (rows
 * [0, n) = positions [a, a + n): the caller's table, computed once for all
 * its users); entries at those positions take their cos/sin from it, the
 * others compute them, with the same bits either way. */
int op_comp_push(const struct op_comp_out *out, struct op_comp_tail *tail, float *work /* (op_comp_work_floats) */,
                 const float *v /* (n, d) */, const float *g /* (n, d), or NULL when ratio == 1 */, int64_t a, int n,
                 const struct op_comp_layer *L, const struct op_rope_angles *ang /* or NULL */);

/* op_comp_project then op_comp_push on the inputs u of positions [a, a + n).
 * Same return values; checks before projecting. */
int op_compress(const struct op_comp_out *out, struct op_comp_tail *tail,
                float *scratch /* (op_comp_scratch_floats(n, ratio, d, idx_dim)) */, const float *u /* (n, hidden) */,
                int64_t a, int n, const struct op_comp_layer *L, const struct op_rope_angles *ang /* or NULL */);

/* ---- the descriptor's checked call --------------------------------------- */
/* What the compress descriptor reads from an op_io once every input and
 * parameter is checked and the outputs allocated (entry and tail positions
 * already filled: integer work), shared by the CPU run (ops/compressor.c)
 * and the CUDA twin (kernels/compressor.cu), so both refuse the same calls
 * with the same status and message: 0 or the status after op_io_fail.
 * L.rope and L.rope_i point into the struct itself: use it where
 * op_compress_prepare filled it, never a copy. */
struct op_desc;
struct op_io;
struct op_compress_call {
  struct op_comp_layer L;
  struct op_rope rope, rope_i;
  const float *u;       /* (n, hidden), positions start .. start + n - 1 */
  int n, n_emit, left;  /* rows; entries emitted (n / ratio); tail rows (n % ratio) */
  int64_t start;
  bool floats;          /* out.kM and out.kI are outputs */
  struct op_comp_out out; /* entries, pos (filled), kM/kI with floats; main part at 0, index part after */
  float *tail_v, *tail_g; /* (left, d) */
  int64_t *tail_pos;      /* (left), filled */
};
int op_compress_prepare(const struct op_desc *self, struct op_io *io, struct op_compress_call *c);

#ifdef __cplusplus
}
#endif

#endif
