/* engram.cuh: the CUDA twins of ops/engram.h: the n-gram hash, the row
 * gather and the gated injection, argument for argument (device pointers,
 * a stream), and the slots of engram_hash, engram_gather and engram_inject.
 *
 *   kern_engram_hash    one thread per position: the compressed ids of the
 *                       last max_order tokens (pad past the sequence start or
 *                       a dead position), then per order the wrapped int64
 *                       mix and per head floor_mod(mix, prime) + offset, all
 *                       through ops/num_engram.h: the CPU's rows exactly.
 *                       max_order <= 8 on the device (SPEC: 4).
 *   kern_engram_gather  one thread per output value: E4M3 x E8M0 decode of
 *                       the row's value (kern_kv_value): exact, the CPU's.
 *   kern_engram_inject  kv = e W_kv^T (cuBLAS sgemm, pedantic fp32), then a
 *                       CTA of 256 threads per (position, stream): the three
 *                       sums of stream_gate by block reduction, the gate as
 *                       ops/engram.c forms it (one rounding per step), x +=
 *                       g v. The sums' order and expf differ from the CPU:
 *                       compared under a tolerance.
 */
#ifndef CEDAR_KERN_ENGRAM_CUH
#define CEDAR_KERN_ENGRAM_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/backend.h"
#include "ops/engram.h"

enum { KERN_ENGRAM_MAX_ORDER = 8 };

/* *bad (device, may be NULL) gets the smallest array index of a token outside
 * [0, vocab); that position's rows are not written. mult and orders, prime
 * and offset are device arrays as in op_engram_hash. */
cudaError_t kern_engram_hash(int64_t *row, const int32_t *tok, const uint8_t *dead, const int32_t *cmap,
                             const uint64_t *mult, const int *orders, const int64_t *prime, const int64_t *offset,
                             int n_hist, int n, int vocab, int n_orders, int n_heads, int max_order, int32_t pad_id,
                             int *bad, cudaStream_t st);
cudaError_t kern_engram_gather(float *e, const uint8_t *table, const int64_t *row, int n, int n_tables, int head_dim,
                               int block, int64_t n_rows, cudaStream_t st);
cublasStatus_t kern_engram_inject(cublasHandle_t h, float *x, float *kv, float *gate, const float *e,
                                  const float *w_kv, const float *q_w, const float *k_w, int n, int d_e, int hidden,
                                  int hc, float norm_eps, float dot_floor, cudaStream_t st);

extern "C" {
int kern_engram_hash_run(const struct op_desc *self, struct op_io *io);
int kern_engram_gather_run(const struct op_desc *self, struct op_io *io);
int kern_engram_inject_run(const struct op_desc *self, struct op_io *io);
}

#endif
