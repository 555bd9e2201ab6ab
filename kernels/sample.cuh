/* sample.cuh: the CUDA twin of ops/sample.h's sampler (greedy, temperature,
 * top-p with the seeded splitmix64), argument for argument over rows, and
 * the sample op's slot.
 *
 * kern_sample_rows: one thread per row, the CPU's steps in its order: the
 * greedy argmax (ties to the lower id); else the softmax (max, then
 * exp((l - m) / T) one rounding per step, the sum in id order, the
 * divisions), the nucleus (the ids placed by probability descending, equal
 * ones by id, with a heapsort over all V ids: the prefix ops/sample.c's
 * bucketed walk finds, its mass summed in double in that order) and the
 * draw (u = uniform * total in double, ids in increasing order). Row i's
 * generator state is seed + i splitmix64 steps (the CPU draws rows in
 * order, one draw per sampled row), so a row's draw is the CPU's for the
 * same probabilities; expf differs by an ulp, which moves a draw only when u
 * falls within that ulp of a boundary (ops/sample.h says the same of two
 * libms). order: V ids of device scratch per row. Rows must be usable
 * (op_sample_row_usable): the slot refuses the others first, as the CPU does.
 */
#ifndef CEDAR_KERN_SAMPLE_CUH
#define CEDAR_KERN_SAMPLE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/backend.h"
#include "ops/sample.h"

cudaError_t kern_sample_rows(int32_t *ids, float *prob, int32_t *order, const float *logits, int64_t n, int V,
                             float temperature, float top_p, uint64_t seed, cudaStream_t st);

extern "C" int kern_sample_run(const struct op_desc *self, struct op_io *io);

#endif
