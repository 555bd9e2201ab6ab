/* compressor.cuh: the CUDA twin of ops/compressor.h's KV-source compressor
 * (SPEC 3.7-3.9, R.3, R.4) for one call from an empty tail, with device
 * pointers, a cuBLAS handle and a stream, and the compress op's slot.
 *
 *   project  v = u W_kv^T and, at ratio > 1, g = u W_gate^T: kern_linear
 *            (cuBLAS, pedantic fp32);
 *   pool     one thread per (entry, channel): m = the max of the group's
 *            gates (slots in position order, the first of equal values),
 *            e_k = expf(g_k - m), s and acc summed slot by slot in position
 *            order, c_hat = acc / s, each step one IEEE rounding as
 *            ops/compressor.c's pool_group / pool_pair (ratio 1 copies v);
 *   norm     c = RMSNorm_C(c_hat) by kern_rmsnorm; kI = c W_ik^T by
 *            kern_linear over all the call's entries (the CPU runs it one
 *            row at a time: op_linear is row-invariant, so the same values);
 *            k_norm by kern_rmsnorm; kM = c;
 *   rope     kern_rope_apply on kM (main RoPE) and kI (indexer RoPE) at the
 *            entries' positions start + e ratio;
 *   pack     one thread per (entry, block) over both parts: kern_kv_pack_block
 *            writes the Main-KV FP4 part at main_off and the Indexer-K MXFP4
 *            part at idx_off of each entry, in place where KV is made.
 * The tail (the n % ratio rows after the last group) is the projected v and
 * g rows themselves, as the CPU keeps them.
 *
 * Bits: the projections' and W_ik's order are cuBLAS's, expf is CUDA's, so
 * every float differs from the CPU's by a derived tolerance, and a packed
 * code can move one step where its input differs; the codes equal the CPU
 * packer's for the same kM / kI bits (ops/num_codec.h). The harness checks
 * exactly that, with the op's floats=1 outputs (tests/test_backend_ops.c).
 *
 * Scratch: kern_compress_scratch_floats(n, ratio, d, idx_dim) device floats.
 */
#ifndef CEDAR_KERN_COMPRESSOR_CUH
#define CEDAR_KERN_COMPRESSOR_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/backend.h"
#include "ops/compressor.h"

size_t kern_compress_scratch_floats(int n, int ratio, int d, int idx_dim);

/* Device pointers throughout; L's weight pointers are device pointers, its
 * ropes and formats host structs (passed by value to the kernels). Writes
 * entries (n / ratio of out_entry_bytes, parts at main_off and idx_off),
 * kM (n/ratio, d) and kI (n/ratio, idx_dim) (both required: they are where
 * the packers read), tail_v and tail_g ((n % ratio, d), may be NULL at
 * ratio 1). pos: the n / ratio entry positions. */
cublasStatus_t kern_compress(cublasHandle_t h, uint8_t *entries, size_t entry_bytes, size_t main_off, size_t idx_off,
                             float *kM, float *kI, float *tail_v, float *tail_g, const float *u, const int64_t *pos,
                             int n, const struct op_comp_layer *L, float *scratch, cudaStream_t st);

/* The same call continuing a tail: tail_v / tail_g hold count pending
 * projected rows (0 <= count < ratio; the tail starts at a multiple of ratio,
 * so the first entry is the tail's group) whose group the call's first rows
 * complete, as op_comp_push pools them; pos: the (count + n_new) / ratio
 * entry positions; tail_v / tail_g get the (count + n_new) % ratio rows left
 * (read before they are written: the same buffers are fine). Scratch:
 * kern_compress_scratch_floats(count + n_new, ...). kern_compress is this
 * with count 0. */
cublasStatus_t kern_compress_tail(cublasHandle_t h, uint8_t *entries, size_t entry_bytes, size_t main_off,
                                  size_t idx_off, float *kM, float *kI, float *tail_v, float *tail_g, int count,
                                  const float *u, const int64_t *pos, int n_new, const struct op_comp_layer *L,
                                  float *scratch, cudaStream_t st);

/* kern_compress_tail for a graph segment (runtime/exec/devseg.h): the tail's
 * count, its first position and the entries the source has committed are
 * device values (cnt, pos0, e0: the step's parameter block), so every
 * launch has a grid fixed by n_new and the ratio and one capture serves
 * every step. The n_new rows are projected into rows of their own, the
 * pending rows and those are gathered by the device count, every group that
 * could close ((ratio - 1 + n_new) / ratio of them) is pooled, normed,
 * roped (at *pos0 + e ratio) and packed as kern_compress_tail does, and only
 * the groups that did close ((*cnt + n_new) / ratio) are written, entry
 * *e0 + e into pages (a device page table, page_entries each); the rows
 * after the last closed group become the tail. A group that could close
 * and did not is computed from zero rows and dropped. Each float is made
 * by the same kernels in the same order as kern_compress_tail's (the GEMMs
 * have the same shapes when n_new = 1). Scratch:
 * kern_compress_step_scratch_bytes(n_new, ratio, d, idx_dim, entry_bytes). */
size_t kern_compress_step_scratch_bytes(int n_new, int ratio, int d, int idx_dim, size_t entry_bytes);
cublasStatus_t kern_compress_step(cublasHandle_t h, uint8_t *const *pages, int page_entries, size_t entry_bytes,
                                  size_t main_off, size_t idx_off, float *tail_v, float *tail_g, const int32_t *cnt,
                                  const int64_t *pos0, const int64_t *e0, const float *u, int n_new,
                                  const struct op_comp_layer *L, void *scratch, cudaStream_t st);

extern "C" int kern_compress_run(const struct op_desc *self, struct op_io *io);

#endif
