/* attention.cuh: the CUDA twin of ops/attention.h's sparse attention (one
 * joint softmax over the visible SWA slots and the Top-K global entries,
 * with the sink in the denominator, then the inverse RoPE), argument for
 * argument: the views hold device memory (kv->pages a device array of
 * device page pointers, swa->slots and swa->pos device arrays, pr->sink a
 * device array; pr->rope stays a host struct, passed by value).
 *
 * Launch shape (the FlashMLA sparse-decode shape, one KV head shared by the
 * query heads): kern_attn_list, one thread per query, writes each query's
 * entry list (visible SWA slots in slot order, then the valid Top-K indices
 * in list order: op_sparse_attn's order) and n_used; kern_attn_main, a CTA
 * of 256 threads per (query, group of HG = min(8, 4096 / head_dim) heads),
 * takes the list 32 entries at a time (ATTN_BLOCK, the CPU's block): the
 * block is dequantized once into shared memory (rows padded by one float
 * against bank conflicts) for the CTA's heads; one thread per (head, entry)
 * forms the logit as the CPU does (channels in order, one rounding per
 * multiply and add, then times tau); per head the running max and sum follow
 * ops/num_softmax.h in entry order; each thread keeps 16 accumulator
 * channels in registers and adds the block's terms in entry order. So the
 * logits and the order of every sum are the CPU's; only expf's last ulp
 * differs (CUDA's expf vs glibc's), hence the harness's tolerance.
 * head_dim is at most 1024 (shared memory: 32 x 1025 floats of entries).
 *
 * kern_grouped_oproj: the grouped output projection through cuBLAS.
 *
 * Not yet: the speed of FlashMLA's sparse decode (tensor cores, FP8
 * entries fed to WGMMA, pipelined TMA loads); this kernel is the numerical
 * twin, and has not run on a GPU yet (docs/kernels.md).
 */
#ifndef CEDAR_KERN_ATTENTION_CUH
#define CEDAR_KERN_ATTENTION_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/attention.h"
#include "ops/backend.h"

/* Device scratch kern_sparse_attn needs: the entry lists, S x (slots + topk) int32. */
size_t kern_sparse_attn_scratch_bytes(int S, int slots, int topk);

cudaError_t kern_sparse_attn(float *o, int32_t *n_used, const float *q, const int64_t *pos, const int32_t *topk_idx,
                             const struct op_kv_view *kv, const struct op_swa_view *swa, int S,
                             const struct op_attn_params *pr, void *scratch, cudaStream_t st);

/* Grouped output projection, op_grouped_oproj's arguments: z = per group
 * o_g W_oa[g]^T as one cublasSgemmStridedBatched over the G groups, then a =
 * z W_ob^T (cublasSgemm); fp32 with CUBLAS_PEDANTIC_MATH (no TF32). */
cublasStatus_t kern_grouped_oproj(cublasHandle_t h, float *a, float *z, const float *o, const float *w_oa,
                                  const float *w_ob, int S, int heads, int head_dim, int G, int o_rank, int hidden,
                                  cudaStream_t st);

extern "C" {
int kern_sparse_attn_run(const struct op_desc *self, struct op_io *io);
int kern_oproj_run(const struct op_desc *self, struct op_io *io);
}

#endif
