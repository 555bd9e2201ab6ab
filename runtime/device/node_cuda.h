/* node_cuda.h: the CUDA op groups (runtime/node/backend.h: rt_backend_cuda), the
 * node-level twins of exec_node.c's CPU entries over runtime/model/model.c. Each
 * runs the CPU group's sequence of ops, in model.c's order, as kernels/
 * launchers on ctx->stream over device-resident data, and never
 * synchronizes: a StarPU CUDA codelet (STARPU_CUDA_ASYNC) or a CUDA graph
 * capture can call it.
 *
 *   node_cuda_model.cu   the model on a device (struct rt_cuda_model: every
 *                        weight pointer of struct rt_model, from the device
 *                        weights upload; the Engram tables), a worker's
 *                        device scratch arena and cuBLAS handle (struct
 *                        rt_cuda_worker), the shared numerics helpers;
 *   node_cuda_attn.cu    attn and dec_kv: mHC, q, the SWA ring, the
 *                        compressor with its tail, Top-K, sparse attention,
 *                        the grouped output projection;
 *   node_cuda_groups.cu  embed, engram_rows, engram, moe, keep_xe,
 *                        replay_in, head.
 * TRANSFER has no CUDA entry (pd.c / pipeline.c move state; NCCL between
 * two GPUs is runtime/comm/nccl.h).
 *
 * What a CUDA entry reads (the contract with the executor that binds a
 * CUDA node; docs/cuda.md "Node op groups on CUDA"):
 *   ctx->buf[d]   device addresses of the activations and buses;
 *   ctx->st       the same host structs as a CPU node's, whose buffers are
 *                 device memory: ring->slot and ring->pos (rt_dev_ring,
 *                 rt_dev_ring_pos), tail->v and tail->g (rt_dev_tail); the
 *                 scalars (ring window, entry_bytes, r0; tail count, pos0;
 *                 a sequence's n_entries) stay host values, which the entry
 *                 updates in stream order as the CPU group does;
 *                 kv_r_pages a device array of device page addresses
 *                 covering kv_r_end entries (required when kv_r is set);
 *                 kv_w_pages the same for kv_w covering kv_w_end entries,
 *                 pages reserved by the binder (rt_kv_reserve) before the
 *                 node runs, so the entry allocates nothing. These
 *                 structs are the request's CUDA state and persist across
 *                 its nodes (not per-node copies): the host scalars the
 *                 entry updates are what the next node of the request reads;
 *   ctx->cuda     struct rt_cuda_env (backend.h): the device model, the
 *                 worker and the request's tokens on the device;
 *   ctx->out      host memory (HEAD's logits are copied into it on the
 *                 stream: pinned memory keeps that copy asynchronous).
 * An entry without ctx->cuda fails the node with CEDAR_EUNSUPPORTED and the
 * reason (rt_cuda_node_why); the round trace (round_trace.h), speculative
 * verify steps' tail logs, the DSpark capture and expert-parallel layers
 * are CPU-only and refused the same way.
 *
 * Bits: every kernel shares the CPU op's numeric core (ops/num*.h); the
 * GEMMs are cuBLAS's (pedantic fp32), not OpenBLAS's, so the floats after a
 * GEMM differ by the GEMM's rounding and whatever follows inherits that:
 * tests/gpu/run.sh compares v41-mini's tokens exactly and its logits under
 * a bound derived from fp32's eps and the reduction lengths.
 *
 * Host-side parts, compiled in every build: rt_cuda_swa_rank (the SWA
 * view's slot order, shared with the device kernel; tested against
 * model.c's insertion sort in tests/test_backend_nodes.c).
 * Not run on a GPU yet: docs/cuda.md.
 */
#ifndef CEDAR_RUNTIME_NODE_CUDA_H
#define CEDAR_RUNTIME_NODE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "ops/num.h"
#include "runtime/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct rt_node_ctx;
struct rt_dev_weights;
struct rt_cuda_model;  /* node_cuda_model.cu */
struct rt_cuda_worker; /* node_cuda_model.cu */

/* Where the slot s of a ring of `window` slots with positions pos (-1:
 * empty) goes in the SWA view model.c's swa_view builds: slots in position
 * order, empty ones last in slot order (its stable insertion sort). The
 * ranks of 0..window-1 are a permutation of them. O(window) per slot. */
OP_HD_INLINE int rt_cuda_swa_rank(const int64_t *pos, int window, int s) {
  const uint64_t ks = pos[s] < 0 ? UINT64_MAX : (uint64_t)pos[s];
  int rank = 0;
  for (int j = 0; j < window; j++) {
    const uint64_t kj = pos[j] < 0 ? UINT64_MAX : (uint64_t)pos[j];
    rank += kj < ks || (kj == ks && j < s);
  }
  return rank;
}

/* The model M on CUDA device dev, its weights from dw (rt_dev_weights_upload
 * of M's weights): every pointer model.c binds, looked up by the same names,
 * and the Engram hash tables (token map, multipliers, primes, offsets)
 * uploaded once. Synchronous (called when the engine opens, never from an
 * entry). 0, or CEDAR_EUNSUPPORTED / CEDAR_ENOMEM / CEDAR_EIO with err. */
int rt_cuda_model_open(struct rt_cuda_model **out, const struct rt_model *M, const struct rt_dev_weights *dw, int dev,
                       char *err, size_t err_len);
void rt_cuda_model_close(struct rt_cuda_model *cm);

/* One worker's device scratch (scratch_bytes, one cudaMalloc) and cuBLAS
 * handle, for the nodes one stream runs one after another (an entry resets
 * it: the stream orders a node's kernels after the previous node's). A node
 * that needs more fails with RT_ENOMEM_SCRATCH; rt_cuda_worker_need then
 * says how much it asked for. 0 or CEDAR_ENOMEM / CEDAR_EIO with err. */
int rt_cuda_worker_open(struct rt_cuda_worker **out, int dev, size_t scratch_bytes, char *err, size_t err_len);
void rt_cuda_worker_close(struct rt_cuda_worker *w);
size_t rt_cuda_worker_need(const struct rt_cuda_worker *w);

/* Why the last CUDA entry on this thread refused its node (CEDAR_EUNSUPPORTED
 * or CEDAR_EIO: the CUDA or cuBLAS error and the step); "" when none. */
const char *rt_cuda_node_why(void);

/* The entries of rt_backend_cuda (backend.c). */
int rt_cuda_embed(const struct rt_node_ctx *c);
int rt_cuda_engram_rows(const struct rt_node_ctx *c);
int rt_cuda_engram(const struct rt_node_ctx *c);
int rt_cuda_attn(const struct rt_node_ctx *c);
int rt_cuda_moe(const struct rt_node_ctx *c);
int rt_cuda_moe_shard(const struct rt_node_ctx *c); /* refuse: expert-parallel layers run on CPU ranks */
int rt_cuda_moe_sum(const struct rt_node_ctx *c);
int rt_cuda_dec_kv(const struct rt_node_ctx *c);
int rt_cuda_keep_xe(const struct rt_node_ctx *c);
int rt_cuda_replay_in(const struct rt_node_ctx *c);
int rt_cuda_head(const struct rt_node_ctx *c);

#ifdef __cplusplus
}
#endif

#endif
