/* test_kern_host.c: the host side of the CUDA twins (kernels/backend.h),
 * checked on a machine with or without a GPU.
 *
 * What it checks, for every op whose cuda slot is filled:
 * 1. The slot refuses what the CPU op refuses, with the CPU's message and
 *    status, before any device work: no inputs at all; each declared input
 *    missing in turn (from a well-formed call); and malformed calls (a
 *    wrong rank, a wrong dtype, mismatched dims or a parameter out of range)
 *    from tests of each family below.
 * 2. Without a usable GPU (this machine), a well-formed call fails cleanly:
 *    a negative status and a one-line message "<op> on cuda: <cudaError...>"
 *    naming the CUDA error, no crash (the device half of the slot is then
 *    tests/test_backend_ops.c's, through tests/gpu/run.sh on a GPU).
 * In the CPU-only build there are no slots: it says so and exits 77.
 *
 * Run: ctest --test-dir build -R kern_host --output-on-failure
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "kernels/backend.h"
#include "ops/backend.h"
#include "ops/formats.h"
#include "tests/harness.h"

static uint64_t seed = 0xC0DA;

#define DIMS_(...) ((int64_t[]){__VA_ARGS__})
#define IN(h, name, dt, data, ...) \
  h_io_input(h, name, dt, (int)(sizeof DIMS_(__VA_ARGS__) / sizeof(int64_t)), DIMS_(__VA_ARGS__), data)

static float *fl(size_t n) { return h_kept_floats(n, &seed, -1, 1); }

/* A well-formed call of op id (only the ops with a slot need one), or false. */
static bool build(enum op_id id, struct h_io *h) {
  static int32_t tok[3] = {0, 2, 1};
  static int64_t pos[3] = {0, 5, 70000};
  switch (id) {
    case OP_ID_embed: IN(h, "table", OP_F32, fl(4 * 8), 4, 8), IN(h, "tokens", OP_I32, tok, 3); return true;
    case OP_ID_rmsnorm: IN(h, "x", OP_F32, fl(3 * 8), 3, 8), IN(h, "gamma", OP_F32, fl(8), 8); return true;
    case OP_ID_linear: IN(h, "x", OP_F32, fl(3 * 8), 3, 8), IN(h, "w", OP_F32, fl(5 * 8), 5, 8); return true;
    case OP_ID_qlinear: /* FP8 E4M3 weights (zero codes), one UE8M0 scale per 32x32 tile */
      IN(h, "x", OP_F32, fl(3 * 32), 3, 32), IN(h, "w", OP_U8, h_kept_zeros(5 * 32), 5, 32);
      IN(h, "scale", OP_U8, h_kept_zeros(1), 1, 1);
      h_io_param(h, "format", 2);
      return true;
    case OP_ID_rope:
      IN(h, "x", OP_F32, fl(3 * 2 * 16), 3, 2, 16), IN(h, "pos", OP_I64, pos, 3);
      h_io_param(h, "rope_dim", 8);
      return true;
    case OP_ID_fp4_pack:
    case OP_ID_mxfp4_pack:
    case OP_ID_fp8_pack: IN(h, "x", OP_F32, fl(3 * 64), 3, 64); return true;
    case OP_ID_fp4_unpack: IN(h, "entries", OP_U8, h_kept_zeros(3 * 36), 3, 36); return true;
    case OP_ID_mxfp4_unpack: IN(h, "entries", OP_U8, h_kept_zeros(3 * 34), 3, 34); return true;
    case OP_ID_fp8_unpack: IN(h, "entries", OP_U8, h_kept_zeros(3 * 68), 3, 68); return true;
    case OP_ID_sparse_attn: {
      static int32_t topk[3 * 2] = {0, -1, 1, 0, -1, -1};
      static int64_t spos[4] = {0, 4, -1, 3};
      const size_t eb = op_fp4_bytes(16, 16), sb = op_fp8_bytes(16, 16, OP_SCALE_FP32);
      IN(h, "q", OP_F32, fl(3 * 2 * 16), 3, 2, 16), IN(h, "pos", OP_I64, pos, 3);
      IN(h, "topk", OP_I32, topk, 3, 2), IN(h, "entries", OP_U8, h_kept_zeros(2 * eb), 2, (int64_t)eb);
      IN(h, "swa", OP_U8, h_kept_zeros(4 * sb), 4, (int64_t)sb), IN(h, "swa_pos", OP_I64, spos, 4);
      IN(h, "sink", OP_F32, fl(2), 2);
      h_io_param(h, "rope_dim", 8);
      return true;
    }
    case OP_ID_oproj:
      IN(h, "o", OP_F32, fl(3 * 4 * 8), 3, 4, 8), IN(h, "W_oa", OP_F32, fl(2 * 5 * 16), 2, 5, 16);
      IN(h, "W_ob", OP_F32, fl(7 * 10), 7, 10);
      return true;
    case OP_ID_engram_hash: {
      static int32_t t[5] = {1, 2, 3, 4, 9};
      IN(h, "tokens", OP_I32, t, 5);
      h_io_param(h, "vocab", 10), h_io_param(h, "compressed_vocab", 7), h_io_param(h, "table_base", 100);
      h_io_param(h, "heads", 2);
      return true;
    }
    case OP_ID_engram_gather: {
      static int64_t r[2 * 3 * 2] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1};
      const size_t rb = op_fp8_bytes(16, 8, OP_SCALE_E8M0);
      IN(h, "table", OP_U8, h_kept_zeros(5 * rb), 5, (int64_t)rb), IN(h, "rows", OP_I64, r, 2, 3, 2);
      h_io_param(h, "head_dim", 16), h_io_param(h, "block", 8);
      return true;
    }
    case OP_ID_engram_inject:
      IN(h, "X", OP_F32, fl(2 * 2 * 8), 2, 2, 8), IN(h, "e", OP_F32, fl(2 * 6), 2, 6);
      IN(h, "w_kv", OP_F32, fl(24 * 6), 24, 6), IN(h, "q_w", OP_F32, fl(16), 2, 8), IN(h, "k_w", OP_F32, fl(16), 2, 8);
      return true;
    case OP_ID_mhc_coeffs:
    case OP_ID_mhc_merge: {
      const int rows = id == OP_ID_mhc_coeffs ? 24 : 4;
      IN(h, "X", OP_F32, fl(2 * 4 * 8), 2, 4, 8), IN(h, "W_fn", OP_F32, fl((size_t)rows * 32), rows, 32);
      IN(h, "scale", OP_F32, fl(3), id == OP_ID_mhc_coeffs ? 3 : 1), IN(h, "base", OP_F32, fl(24), rows);
      return true;
    }
    case OP_ID_mhc_mix: IN(h, "X", OP_F32, fl(2 * 4 * 8), 2, 4, 8), IN(h, "pre", OP_F32, fl(8), 2, 4); return true;
    case OP_ID_mhc_update:
      IN(h, "X", OP_F32, fl(2 * 4 * 8), 2, 4, 8), IN(h, "C", OP_F32, fl(32), 2, 4, 4);
      IN(h, "post", OP_F32, fl(8), 2, 4), IN(h, "F", OP_F32, fl(16), 2, 8);
      return true;
    case OP_ID_moe:
      IN(h, "x", OP_F32, fl(3 * 8), 3, 8), IN(h, "router", OP_F32, fl(5 * 8), 5, 8);
      IN(h, "w_gate", OP_F32, fl(5 * 4 * 8), 5, 4, 8), IN(h, "w_up", OP_F32, fl(5 * 4 * 8), 5, 4, 8);
      IN(h, "w_down", OP_F32, fl(5 * 8 * 4), 5, 8, 4);
      h_io_param(h, "n_active", 2);
      return true;
    case OP_ID_indexer_topk: {
      const size_t kb = op_mxfp4_bytes(16, 8);
      IN(h, "q", OP_F32, fl(3 * 2 * 16), 3, 2, 16), IN(h, "w", OP_F32, fl(6), 3, 2), IN(h, "pos", OP_I64, pos, 3);
      IN(h, "keys", OP_U8, h_kept_zeros(4 * kb), 4, (int64_t)kb);
      h_io_param(h, "idx_block", 8), h_io_param(h, "k", 2), h_io_param(h, "build_pool", 1), h_io_param(h, "pool_top", 2);
      h_io_param(h, "pool_block", 2);
      return true;
    }
    case OP_ID_sample:
      IN(h, "logits", OP_F32, fl(3 * 11), 3, 11);
      h_io_param(h, "temperature", 0.7), h_io_param(h, "top_p", 0.8);
      return true;
    case OP_ID_reindex: {
      static int32_t pool[3 * 2] = {0, 1, 1, -1, -1, -1};
      const size_t kb = op_mxfp4_bytes(16, 8);
      IN(h, "q", OP_F32, fl(3 * 2 * 16), 3, 2, 16), IN(h, "w", OP_F32, fl(6), 3, 2), IN(h, "pos", OP_I64, pos, 3);
      IN(h, "keys", OP_U8, h_kept_zeros(4 * kb), 4, (int64_t)kb), IN(h, "pool", OP_I32, pool, 3, 2);
      h_io_param(h, "idx_block", 8), h_io_param(h, "k", 2), h_io_param(h, "pool_block", 2);
      return true;
    }
    case OP_ID_q_latent:
      IN(h, "u", OP_F32, fl(3 * 8), 3, 8), IN(h, "W_qa", OP_F32, fl(5 * 8), 5, 8), IN(h, "gamma_q", OP_F32, fl(5), 5);
      return true;
    case OP_ID_q_main:
    case OP_ID_q_indexer:
      IN(h, "cq", OP_F32, fl(3 * 8), 3, 8), IN(h, "pos", OP_I64, pos, 3);
      IN(h, id == OP_ID_q_main ? "W_qb" : "W_iq", OP_F32, fl(2 * 16 * 8), 2 * 16, 8);
      h_io_param(h, "heads", 2), h_io_param(h, "head_dim", 16), h_io_param(h, "rope_dim", 8);
      return true;
    case OP_ID_index_weights: IN(h, "u", OP_F32, fl(3 * 8), 3, 8), IN(h, "W_w", OP_F32, fl(4 * 8), 4, 8); return true;
    case OP_ID_swa_kv:
      IN(h, "u", OP_F32, fl(3 * 8), 3, 8), IN(h, "W_kv", OP_F32, fl(16 * 8), 16, 8), IN(h, "gamma", OP_F32, fl(16), 16);
      IN(h, "pos", OP_I64, pos, 3);
      h_io_param(h, "rope_dim", 8), h_io_param(h, "pack", 1), h_io_param(h, "block", 8), h_io_param(h, "scale", 1);
      return true;
    case OP_ID_compress:
      IN(h, "u", OP_F32, fl(5 * 8), 5, 8), IN(h, "W_kv", OP_F32, fl(16 * 8), 16, 8);
      IN(h, "W_gate", OP_F32, fl(16 * 8), 16, 8), IN(h, "gamma_c", OP_F32, fl(16), 16);
      IN(h, "W_ik", OP_F32, fl(8 * 16), 8, 16), IN(h, "k_gamma", OP_F32, fl(8), 8);
      h_io_param(h, "ratio", 2), h_io_param(h, "start", 2), h_io_param(h, "k_norm", 1), h_io_param(h, "floats", 1);
      h_io_param(h, "main_block", 16), h_io_param(h, "idx_block", 8), h_io_param(h, "rope_dim", 8);
      h_io_param(h, "idx_rope_dim", 4);
      return true;
    case OP_ID_dspark_draft:
      IN(h, "base", OP_F32, fl(2 * 9), 2, 9), IN(h, "A", OP_F32, fl(9 * 3), 9, 3), IN(h, "U", OP_F32, fl(9 * 3), 9, 3);
      h_io_param(h, "y0", 4), h_io_param(h, "temperature", 0.7);
      return true;
    case OP_ID_dspark_confidence: {
      static float b[1] = {0.5f};
      IN(h, "h", OP_F32, fl(3 * 8), 3, 8), IN(h, "w_c", OP_F32, fl(8), 8), IN(h, "b_c", OP_F32, b, 1);
      return true;
    }
    case OP_ID_dspark_verify_len: {
      static float t[4] = {1.0f, 1.1f, 1.25f, 1.5f};
      IN(h, "a", OP_F32, fl(3), 3), IN(h, "t_round", OP_F32, t, 4);
      return true;
    }
    default: return false;
  }
}

/* Malformed variants of the call: each is refused by the CPU. */
static int n_bad_variants(enum op_id id) {
  switch (id) {
    case OP_ID_embed: return 3;
    case OP_ID_rmsnorm:
    case OP_ID_linear: return 2;
    case OP_ID_rope: return 3;
    case OP_ID_sparse_attn: return 3;
    case OP_ID_oproj: return 2;
    case OP_ID_engram_hash: return 3;
    case OP_ID_sample: return 3;
    case OP_ID_indexer_topk: return 2;
    case OP_ID_reindex: return 2;
    case OP_ID_moe: return 3;
    case OP_ID_mhc_coeffs:
    case OP_ID_mhc_merge: return 3;
    case OP_ID_mhc_mix:
    case OP_ID_mhc_update: return 2;
    case OP_ID_engram_gather: return 2;
    case OP_ID_engram_inject: return 2;
    case OP_ID_fp4_pack:
    case OP_ID_mxfp4_pack:
    case OP_ID_fp8_pack: return 2;
    case OP_ID_q_latent:
    case OP_ID_q_main:
    case OP_ID_swa_kv: return 3;
    case OP_ID_q_indexer:
    case OP_ID_index_weights:
    case OP_ID_dspark_confidence: return 2;
    case OP_ID_compress: return 5;
    case OP_ID_dspark_draft: return 4;
    case OP_ID_dspark_verify_len: return 3;
    default: return 1;
  }
}

static void build_bad(enum op_id id, int v, struct h_io *h) {
  static int32_t badtok[3] = {0, 9, 1};
  static int64_t pos3[3] = {0, 1, 2};
  switch (id) {
    case OP_ID_embed:
      if (v == 0) IN(h, "table", OP_F32, fl(4 * 8), 4, 8), IN(h, "tokens", OP_I32, badtok, 3); /* token 9 >= 4 */
      if (v == 1) IN(h, "table", OP_F32, fl(4 * 8), 32), IN(h, "tokens", OP_I32, badtok, 3);   /* rank */
      if (v == 2) IN(h, "table", OP_F32, fl(4 * 8), 4, 8), IN(h, "tokens", OP_I64, badtok, 1); /* dtype */
      return;
    case OP_ID_rmsnorm:
      IN(h, "x", OP_F32, fl(3 * 8), 3, 8);
      if (v == 0) IN(h, "gamma", OP_F32, fl(8), 7); /* 7 weights for rows of 8 */
      if (v == 1) IN(h, "gamma", OP_F32, fl(8), 1, 8); /* rank */
      return;
    case OP_ID_linear: IN(h, "x", OP_F32, fl(3 * 8), 3, 8), IN(h, "w", OP_F32, fl(5 * 8), v ? 4 : 5, v ? 10 : 7); return;
    case OP_ID_rope:
      IN(h, "x", OP_F32, fl(3 * 2 * 16), 3, 2, 16);
      if (v == 0) IN(h, "pos", OP_I64, pos3, 2);     /* 2 positions for 3 rows */
      if (v == 1) IN(h, "pos", OP_I32, pos3, 3);     /* dtype */
      if (v == 2) IN(h, "pos", OP_I64, pos3, 3);
      h_io_param(h, "rope_dim", v == 2 ? 7 : 8); /* odd rope_dim */
      return;
    case OP_ID_fp4_pack:
    case OP_ID_mxfp4_pack:
    case OP_ID_fp8_pack:
      IN(h, "x", OP_F32, fl(3 * 63), 3, 63); /* not a multiple of any block */
      h_io_param(h, "block", v ? 5 : 16); /* then an odd block that does not divide 63 */
      return;
    case OP_ID_sparse_attn: {
      static int32_t topk[3 * 2] = {0, 5, 1, 0, -1, -1}, ok[3 * 2] = {0, 1, 1, 0, -1, -1}; /* 5: past 2 entries */
      const size_t eb = op_fp4_bytes(16, 16);
      IN(h, "q", OP_F32, fl(3 * 2 * 16), 3, 2, 16), IN(h, "pos", OP_I64, pos3, v == 0 ? 2 : 3);
      IN(h, "topk", OP_I32, v == 2 ? ok : topk, 3, 2), IN(h, "entries", OP_U8, h_kept_zeros(2 * eb), 2, (int64_t)eb);
      if (v == 2) IN(h, "swa", OP_U8, h_kept_zeros(4 * 8), 4, 8); /* swa without swa_pos */
      return;
    }
    case OP_ID_oproj:
      IN(h, "o", OP_F32, fl(3 * 4 * 8), 3, 4, 8), IN(h, "W_oa", OP_F32, fl(3 * 5 * 16), v ? 2 : 3, 5, 16);
      IN(h, "W_ob", OP_F32, fl(7 * 10), 7, v ? 9 : 10); /* 3 groups of 4 heads; then W_ob one column short */
      return;
    case OP_ID_engram_hash: {
      static int32_t t[5] = {1, 2, 11, 4, 9}; /* 11 >= vocab 10 */
      IN(h, "tokens", OP_I32, t, 5);
      h_io_param(h, "vocab", 10), h_io_param(h, "compressed_vocab", 7), h_io_param(h, "table_base", 100);
      if (v == 1) h_io_param(h, "n_hist", 6); /* more history than tokens */
      if (v == 2) h_io_param(h, "pad_id", 12);
      return;
    }
    case OP_ID_engram_gather: {
      static int64_t r[2 * 3 * 2] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 1}; /* 5: past the 5 rows */
      const size_t rb = op_fp8_bytes(16, 8, OP_SCALE_E8M0);
      IN(h, "table", OP_U8, h_kept_zeros(5 * (rb + 1)), 5, (int64_t)(v ? rb + 1 : rb)), IN(h, "rows", OP_I64, r, 2, 3, 2);
      h_io_param(h, "head_dim", 16), h_io_param(h, "block", 8);
      return;
    }
    case OP_ID_engram_inject:
      IN(h, "X", OP_F32, fl(2 * 2 * 8), 2, 2, 8), IN(h, "e", OP_F32, fl(3 * 6), v ? 2 : 3, 6);
      IN(h, "w_kv", OP_F32, fl(24 * 6), 24, 6), IN(h, "q_w", OP_F32, fl(16), 2, v ? 7 : 8), IN(h, "k_w", OP_F32, fl(16), 2, 8);
      return;
    case OP_ID_mhc_coeffs:
    case OP_ID_mhc_merge: {
      const int rows = id == OP_ID_mhc_coeffs ? 24 : 4;
      IN(h, "X", OP_F32, fl(2 * 4 * 8), 2, 4, 8), IN(h, "W_fn", OP_F32, fl((size_t)rows * 32), rows, v == 0 ? 31 : 32);
      IN(h, "scale", OP_F32, fl(3), v == 1 ? 2 : id == OP_ID_mhc_coeffs ? 3 : 1), IN(h, "base", OP_F32, fl(24), rows);
      if (v == 2) h_io_param(h, "hc_eps", -1);
      return;
    }
    case OP_ID_mhc_mix: IN(h, "X", OP_F32, fl(2 * 4 * 8), 2, 4, 8), IN(h, "pre", OP_F32, fl(8), v ? 4 : 2, v ? 2 : 3); return;
    case OP_ID_mhc_update:
      IN(h, "X", OP_F32, fl(2 * 4 * 8), 2, 4, 8), IN(h, "C", OP_F32, fl(32), 2, 4, v ? 4 : 3);
      IN(h, "post", OP_F32, fl(8), 2, 4), IN(h, "F", OP_F32, fl(16), 2, v ? 7 : 8);
      return;
    case OP_ID_moe:
      IN(h, "x", OP_F32, fl(3 * 8), 3, 8), IN(h, "router", OP_F32, fl(5 * 8), 5, 8);
      IN(h, "w_gate", OP_F32, fl(5 * 4 * 8), 5, 4, 8), IN(h, "w_up", OP_F32, fl(5 * 4 * 8), 5, 4, v == 0 ? 7 : 8);
      IN(h, "w_down", OP_F32, fl(5 * 8 * 4), 5, 8, 4);
      if (v == 1) IN(h, "shared_gate", OP_F32, fl(6 * 8), 6, 8); /* without shared_up and shared_down */
      h_io_param(h, "n_active", v == 2 ? 6 : 2);                 /* 6 of 5 experts */
      return;
    case OP_ID_indexer_topk: {
      const size_t kb = op_mxfp4_bytes(16, 8);
      IN(h, "q", OP_F32, fl(3 * 2 * 16), 3, 2, 16), IN(h, "w", OP_F32, fl(6), 3, v ? 3 : 2), IN(h, "pos", OP_I64, pos3, 3);
      IN(h, "keys", OP_U8, h_kept_zeros(4 * kb), 4, (int64_t)kb);
      h_io_param(h, "idx_block", v ? 8 : 7); /* odd block; then 3 head weights for 2 heads */
      return;
    }
    case OP_ID_sample: {
      float *l = fl(3 * 11);
      l[11 + 4] = v == 0 ? NAN : INFINITY; /* row 1: NaN, then +inf */
      if (v == 2) l[11 + 4] = 0.0f, h_io_param(h, "top_p", 0); /* top_p outside (0, 1] */
      IN(h, "logits", OP_F32, l, 3, 11);
      return;
    }
    case OP_ID_reindex: {
      static int32_t pool[3 * 2] = {0, 1, 1, 1, -1, -1}; /* block 1 twice in row 1 */
      const size_t kb = op_mxfp4_bytes(16, 8);
      IN(h, "q", OP_F32, fl(3 * 2 * 16), 3, 2, 16), IN(h, "w", OP_F32, fl(6), 3, 2), IN(h, "pos", OP_I64, pos3, 3);
      IN(h, "keys", OP_U8, h_kept_zeros(4 * kb), 4, (int64_t)kb), IN(h, "pool", OP_I32, pool, v ? 2 : 3, 2);
      h_io_param(h, "idx_block", 8), h_io_param(h, "k", 2), h_io_param(h, "pool_block", 2);
      return;
    }
    case OP_ID_q_latent:
      IN(h, "u", OP_F32, fl(3 * 8), 3, 8), IN(h, "W_qa", OP_F32, fl(5 * 8), 5, v == 0 ? 7 : 8); /* 7 columns */
      IN(h, "gamma_q", OP_F32, fl(5), v == 1 ? 4 : 5);                                          /* 4 weights */
      if (v == 2) h_io_param(h, "eps", -1);
      return;
    case OP_ID_q_main:
    case OP_ID_q_indexer:
      IN(h, "cq", OP_F32, fl(3 * 8), 3, 8), IN(h, "pos", OP_I64, pos3, v == 1 ? 2 : 3); /* 2 positions, 3 rows */
      IN(h, id == OP_ID_q_main ? "W_qb" : "W_iq", OP_F32, fl(2 * 16 * 8), v == 0 ? 31 : 32, 8); /* not heads x dim */
      h_io_param(h, "heads", 2), h_io_param(h, "head_dim", 16), h_io_param(h, "rope_dim", v == 2 ? 7 : 8); /* odd */
      return;
    case OP_ID_index_weights:
      if (v == 0) IN(h, "u", OP_F32, fl(3 * 8), 3, 8), IN(h, "W_w", OP_F32, fl(4 * 8), 4, 7); /* widths differ */
      if (v == 1) IN(h, "u", OP_F32, fl(3 * 8), 24), IN(h, "W_w", OP_F32, fl(4 * 8), 4, 8);  /* rank */
      return;
    case OP_ID_swa_kv:
      IN(h, "u", OP_F32, fl(3 * 8), 3, 8), IN(h, "W_kv", OP_F32, fl(16 * 8), 16, 8);
      IN(h, "pos", v == 1 ? OP_I32 : OP_I64, pos3, 3); /* then a dtype */
      h_io_param(h, "pack", 1), h_io_param(h, "block", v == 0 ? 5 : 8); /* 5 does not divide 16 */
      if (v == 2) h_io_param(h, "scale", 2);
      return;
    case OP_ID_compress:
      IN(h, "u", OP_F32, fl(5 * 8), 5, 8), IN(h, "W_kv", OP_F32, fl(16 * 8), 16, 8);
      IN(h, "W_gate", OP_F32, fl(16 * 8), 16, 8), IN(h, "W_ik", OP_F32, fl(8 * 16), 8, 16);
      h_io_param(h, "ratio", v == 0 ? 1 : 2); /* W_gate at ratio 1 */
      h_io_param(h, "start", v == 1 ? 3 : 2); /* mid-group */
      h_io_param(h, "main_block", v == 2 ? 6 : 16), h_io_param(h, "idx_block", 8); /* 6 does not divide 16 */
      if (v == 3) IN(h, "k_gamma", OP_F32, fl(8), 8);                             /* k_norm off */
      if (v == 4) h_io_param(h, "floats", 2);
      return;
    case OP_ID_dspark_draft:
      IN(h, "base", OP_F32, fl(2 * 9), 2, 9), IN(h, "A", OP_F32, fl(9 * 3), 9, 3);
      IN(h, "U", OP_F32, fl(9 * 4), 9, v == 2 ? 4 : 3); /* U's rank differs from A's */
      if (v != 0) h_io_param(h, "y0", v == 1 ? 9 : 4); /* y0 missing, then past V */
      if (v == 3) h_io_param(h, "top_p", 0);
      return;
    case OP_ID_dspark_confidence: {
      static float b[2] = {0.5f, 0.5f};
      IN(h, "h", OP_F32, fl(3 * 8), 3, 8), IN(h, "w_c", OP_F32, fl(8), v == 0 ? 7 : 8), IN(h, "b_c", OP_F32, b, v ? 2 : 1);
      return;
    }
    case OP_ID_dspark_verify_len: {
      static float t[3][4] = {{1, 1, 1, 1}, {1, 0, 1, 1}, {1, 1, NAN, 1}}; /* 3 lengths for Lmax 3; t = 0; NaN */
      IN(h, "a", OP_F32, fl(3), 3), IN(h, "t_round", OP_F32, t[v], v == 0 ? 3 : 4);
      return;
    }
    default: /* no W packs to 37 bytes (fp8: 8 values and a 4-byte scale per block) */
      IN(h, "entries", OP_U8, h_kept_zeros(3 * 37), 3, 37);
      if (id == OP_ID_fp8_unpack) h_io_param(h, "block", 8);
      return;
  }
}

/* Run op id on the CPU and on cuda with the same inputs and parameters:
 * when the CPU refuses, cuda must refuse with the same status and message.
 * A call the CPU accepts fails the test when it was meant to be malformed,
 * and is skipped when optional (an optional input left out). */
static void same_refusal(enum op_id id, struct h_io *cpu, struct h_io *cuda, const char *what, bool optional) {
  int rc_cpu = op_backend_run(&op_backend_cpu, id, &cpu->io);
  if (rc_cpu == 0) {
    EXPECT(optional, "%s %s: the CPU accepts this 'malformed' call: fix the test", op_name(id), what);
    return;
  }
  int rc_cuda = op_backend_run(&kern_backend_cuda, id, &cuda->io);
  EXPECT(rc_cuda == rc_cpu && !strcmp(cpu->error, cuda->error), "%s %s: cpu %d '%s', cuda %d '%s'", op_name(id), what,
         rc_cpu, cpu->error, rc_cuda, cuda->error);
}

static void copy_call(struct h_io *dst, const struct h_io *src, const char *skip) {
  h_io_init(dst);
  for (int i = 0; i < src->n_in; i++)
    if (!skip || strcmp(src->in_name[i], skip))
      h_io_input(dst, src->in_name[i], src->in[i].dtype, src->in[i].ndim, src->in[i].shape, src->in[i].data);
  for (int i = 0; i < src->n_param; i++) h_io_param(dst, src->p_name[i], src->p_val[i]);
}

int main(void) {
  int slots = 0;
  char why[256];
  const bool gpu = kern_backend_cuda.available(why, sizeof why);
  for (int i = 0; i < OP_COUNT; i++) slots += op_backend_has(&kern_backend_cuda, (enum op_id)i);
  if (!slots) {
    printf("kern_host: no CUDA slots in this build (%s): skipped\n", why);
    return 77;
  }
  for (int i = 0; i < OP_COUNT; i++) {
    const enum op_id id = (enum op_id)i;
    if (!op_backend_has(&kern_backend_cuda, id)) continue;
    struct h_io good, a, b;
    h_io_init(&good);
    EXPECT(build(id, &good), "op %s has a cuda slot but no case in tests/test_kern_host.c: add one", op_name(id));
    /* no inputs at all */
    h_io_init(&a), h_io_init(&b);
    same_refusal(id, &a, &b, "without inputs", false);
    h_io_free(&a), h_io_free(&b);
    /* each declared input missing */
    for (const struct op_arg *in = op_registry[id]->inputs; in->name; in++) {
      char what[96];
      snprintf(what, sizeof what, "without '%s'", in->name);
      copy_call(&a, &good, in->name), copy_call(&b, &good, in->name);
      same_refusal(id, &a, &b, what, in != op_registry[id]->inputs);
      h_io_free(&a), h_io_free(&b);
    }
    for (int v = 0; v < n_bad_variants(id); v++) {
      char what[64];
      snprintf(what, sizeof what, "malformed call %d", v);
      h_io_init(&a), build_bad(id, v, &a), copy_call(&b, &a, NULL);
      same_refusal(id, &a, &b, what, false);
      h_io_free(&a), h_io_free(&b);
    }
    /* a well-formed call without a GPU: a clean device error */
    if (!gpu) {
      copy_call(&a, &good, NULL);
      int rc = op_backend_run(&kern_backend_cuda, id, &a.io);
      char want[64];
      snprintf(want, sizeof want, "%s on cuda: cuda", op_name(id));
      EXPECT(rc == CEDAR_EIO && !strncmp(a.error, want, strlen(want)), "%s without a GPU: %d '%s'", op_name(id), rc,
             a.error);
      if (i == 0) printf("without a GPU, e.g.: %s\n", a.error);
      h_io_free(&a);
    }
    h_io_free(&good);
    h_kept_free();
  }
  printf("kern_host: %d cuda slots checked (%s)\n", slots, gpu ? "GPU present: device runs are test_backend_ops'" : why);
  return h_report("kern host");
}
