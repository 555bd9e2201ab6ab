/* backend_cuda.cu: kern_backend_cuda for the CUDA build (see kernels/backend.h).
 *
 * What it is: the CUDA row of the ops' backend table. available() asks the
 * CUDA runtime for a device and, when there is none (or no driver), answers
 * false with the CUDA error name, e.g. "cudaErrorNoDevice: no CUDA-capable
 * device is detected (100) from cudaGetDeviceCount".
 *
 * The run slots: one line per CUDA twin below (KERN_SLOT), each the slot
 * function beside its kernels in kernels/<family>.cu; an op without a line is
 * NULL, "not implemented on cuda", never a fallback. cpu_bits is false: the
 * twins of reductions and transcendentals are compared with the CPU under a
 * tolerance; those whose outputs are codes or ids are compared bitwise by the
 * harness anyway (docs/kernels.md lists which twin gives which bits).
 *
 * Test: tests/test_backend_ops.c (on a GPU), tests/test_kern_host.c (here).
 */
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/attention.cuh"
#include "kernels/backend.h"
#include "kernels/basic.cuh"
#include "kernels/compressor.cuh"
#include "kernels/dspark.cuh"
#include "kernels/engram.cuh"
#include "kernels/formats.cuh"
#include "kernels/indexer.cuh"
#include "kernels/mhc.cuh"
#include "kernels/moe.cuh"
#include "kernels/qkv.cuh"
#include "kernels/qlinear.cuh"
#include "kernels/rope.cuh"
#include "kernels/sample.cuh"

static bool cuda_available(char *why, size_t len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* clear it */
    if (why && len)
      snprintf(why, len, "%s: %s (%d) from cudaGetDeviceCount", cudaGetErrorName(e), cudaGetErrorString(e), (int)e);
    return false;
  }
  if (n < 1) {
    if (why && len) snprintf(why, len, "cudaGetDeviceCount found no CUDA device");
    return false;
  }
  if (why && len) why[0] = '\0';
  return true;
}

/* slot<OP_ID_x>() is x's CUDA run function, or NULL (C++17 has no designated
 * array initializers, so the table is generated from CEDAR_OPS in op order). */
template <int id>
constexpr op_backend_run_fn slot() {
  return nullptr;
}
#define KERN_SLOT(op, fn)                  \
  template <>                              \
  constexpr op_backend_run_fn slot<OP_ID_##op>() { \
    return fn;                             \
  }
KERN_SLOT(embed, kern_embed_run)
KERN_SLOT(rmsnorm, kern_rmsnorm_run)
KERN_SLOT(linear, kern_linear_run)
KERN_SLOT(qlinear, kern_qlinear_run)
KERN_SLOT(rope, kern_rope_run)
KERN_SLOT(fp4_pack, kern_fp4_pack_run)
KERN_SLOT(fp4_unpack, kern_fp4_unpack_run)
KERN_SLOT(mxfp4_pack, kern_mxfp4_pack_run)
KERN_SLOT(mxfp4_unpack, kern_mxfp4_unpack_run)
KERN_SLOT(fp8_pack, kern_fp8_pack_run)
KERN_SLOT(fp8_unpack, kern_fp8_unpack_run)
KERN_SLOT(q_latent, kern_q_latent_run)
KERN_SLOT(q_main, kern_q_main_run)
KERN_SLOT(q_indexer, kern_q_indexer_run)
KERN_SLOT(index_weights, kern_index_weights_run)
KERN_SLOT(swa_kv, kern_swa_kv_run)
KERN_SLOT(compress, kern_compress_run)
KERN_SLOT(indexer_topk, kern_indexer_topk_run)
KERN_SLOT(reindex, kern_reindex_run)
KERN_SLOT(sparse_attn, kern_sparse_attn_run)
KERN_SLOT(oproj, kern_oproj_run)
KERN_SLOT(moe, kern_moe_run)
KERN_SLOT(mhc_coeffs, kern_mhc_coeffs_run)
KERN_SLOT(mhc_mix, kern_mhc_mix_run)
KERN_SLOT(mhc_update, kern_mhc_update_run)
KERN_SLOT(mhc_merge, kern_mhc_merge_run)
KERN_SLOT(engram_hash, kern_engram_hash_run)
KERN_SLOT(engram_gather, kern_engram_gather_run)
KERN_SLOT(engram_inject, kern_engram_inject_run)
KERN_SLOT(dspark_draft, kern_dspark_draft_run)
KERN_SLOT(dspark_confidence, kern_dspark_confidence_run)
KERN_SLOT(dspark_verify_len, kern_dspark_verify_len_run)
KERN_SLOT(sample, kern_sample_run)
#undef KERN_SLOT

/* By position (C++17): name, available, cpu_bits, run. */
#define KERN_ENTRY_(name) slot<OP_ID_##name>(),
extern "C" const struct op_backend kern_backend_cuda = {"cuda", cuda_available, false, {CEDAR_OPS(KERN_ENTRY_)}};
#undef KERN_ENTRY_
