/* moe.cuh: the CUDA twin of ops/moe.h's MoE sublayer (router scores, biased
 * top-k selection, clamped SwiGLU experts, shared expert), argument for
 * argument with device pointers and a stream, and the moe op's slot.
 *
 *   scores   logits x router^T by cuBLAS (pedantic fp32), then one thread per
 *            token: sqrt(softplus), sigmoid or a row softmax, as op_moe_scores.
 *   select   one thread per token: ops/moe.c's topk_ids (key descending, id
 *            ascending, NaN last), ascending ids, the weights normalised in
 *            that order: the CPU's selection for the same scores. The scores
 *            come from a GEMM whose rounding differs from OpenBLAS's, so ids
 *            can differ where two keys are within a few ulp (the harness
 *            compares ids bitwise: a near-tie is a reported difference).
 *   experts  one warp per (token, slot, intermediate row): the gate and up
 *            dots (lanes over hidden, a butterfly sum), the clamp and SiLU as
 *            op_moe_swiglu (routing weight times SiLU, then times the clamped
 *            up); then one warp per (token, output channel): the shared
 *            expert's down dot, then each selected expert's in ascending id
 *            order added to it, the CPU's order of the expert sum.
 * With cfg.shared_mxfp8 the shared expert reads x and its SwiGLU hidden
 * through kern_mxfp8_qdq (kernels/formats.cuh), as op_moe_shared does.
 * Scratch (device): kern_moe_scratch_bytes(n, cfg).
 * The weights are fp32 here, as the op takes them; the released FP4 experts
 * (e2m1 + ue8m0 per 32) are not read directly yet (docs/kernels.md).
 */
#ifndef CEDAR_KERN_MOE_CUH
#define CEDAR_KERN_MOE_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "ops/backend.h"
#include "ops/moe.h"

size_t kern_moe_scratch_bytes(int n, const struct op_moe_cfg *c);
cublasStatus_t kern_moe_forward(cublasHandle_t h, float *y, int32_t *sel, float *weight, const float *x,
                                const struct op_moe_weights *w, const uint8_t *modality, int n,
                                const struct op_moe_cfg *c, void *scratch, cudaStream_t st);

extern "C" int kern_moe_run(const struct op_desc *self, struct op_io *io);

#endif
