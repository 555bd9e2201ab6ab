/* rope.cuh: the CUDA twin of ops/rope.h's op_rope_apply, argument for
 * argument (device x and pos, a stream), and the rope op's slot.
 *
 * kern_rope_apply: one block of 128 threads per row; the row's rope_dim / 2
 * angles go to shared memory once (as op_rope_apply's row_angles: pos *
 * freq in double, or the vendor's fp32 product (float)pos * (float)freq when
 * r->angle_f32, then cos and sin in double rounded to float, sin negated for
 * the inverse), then every head's pairs rotate as ops/rope.c's rotate_row:
 * a c - b s and a s + b c, each product and difference one IEEE rounding
 * (the _rn intrinsics, never an FMA). So the bits are the CPU's wherever
 * CUDA's double cos/sin round to the same float as glibc's (both are within
 * an ulp of double; a float boundary between them is a ~2^-28 event): the
 * harness still compares under a tolerance, not bitwise.
 * The struct op_rope (its 512 frequencies) travels by value in the kernel's
 * parameters (4.2 KB: CUDA 12.1+ allows 32 KB on sm_70+), so a captured
 * graph needs no frequency buffer.
 */
#ifndef CEDAR_KERN_ROPE_CUH
#define CEDAR_KERN_ROPE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/backend.h"
#include "ops/rope.h"

cudaError_t kern_rope_apply(float *x, const struct op_rope *r, const int64_t *pos, int n, int heads, int ld, int sign,
                            cudaStream_t st);

extern "C" int kern_rope_run(const struct op_desc *self, struct op_io *io);

#endif
