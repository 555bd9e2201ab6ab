/* qlinear.cuh: the CUDA twin of ops/qlinear.h: y = x W^T with W in its
 * stored format (F32, BF16, FP8 E4M3 with UE8M0 32 x 32 tile scales, FP4
 * E2M1 with UE8M0 row-group scales) decoded in registers, and its op slot.
 *
 *   kern_qlinear  y (n, ldy) = x (n, ldx) W^T; w's data and scale are device
 *                 pointers (op_qweight_check(w) must be NULL). Launch: CTAs
 *                 of 128 threads = 8 outputs x 16 lanes; grid (ceil(out/8),
 *                 ceil(n/4)); each thread holds lane l of one output for 4
 *                 rows, so each weight is decoded once per 4 rows.
 *
 * Bits: the CPU's (finite outputs bitwise; a NaN output is CUDA's canonical
 * NaN 0x7FFFFFFF where the CPU keeps 0x7FC00000). Lane l sums the products
 * of k = l, l + 16, ... in increasing k with __fmul_rn then __fadd_rn (never
 * an FMA), a last chunk shorter than 16 adds +0 products in the lanes past
 * in, and the lanes meet in ops/lin_kernel.h's halving tree (l + 8, l + 4,
 * l + 2, l + 1) through warp shuffles; each weight is dec(q) * 2^(s - 127)
 * by ops/num_codec.h's decoders and one __fmul_rn, exactly the CPU's value.
 * So it is not a tensor-core GEMM: a prefill-sized call runs the same
 * per-lane chains as a GEMV (docs/kernels.md says what that costs).
 *
 * Test: tests/gpu/test_gpu_qlinear.cu (against op_qlinear, and GB/s of the
 * stored bytes against the copy bandwidth in the same process), and the
 * qlinear row of tests/test_backend_ops.c.
 */
#ifndef CEDAR_KERN_QLINEAR_CUH
#define CEDAR_KERN_QLINEAR_CUH

#include <cuda_runtime.h>

#include "ops/backend.h"
#include "ops/qlinear.h"

cudaError_t kern_qlinear(float *y /* (n, ldy) */, const float *x /* (n, ldx) */, const struct op_qweight *w, int n,
                         int ldx, int ldy, cudaStream_t st);

extern "C" {
int kern_qlinear_run(const struct op_desc *self, struct op_io *io);
}

#endif
