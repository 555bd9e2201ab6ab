/* backend.h: the CUDA entry of the ops' backend table (ops/backend.h).
 *
 * kern_backend_cuda is defined twice, one per build: kernels/backend_cuda.cu
 * (CEDAR_CUDA=ON), available when the CUDA runtime sees a device, with a run
 * slot per registered op (each its CUDA twin: docs/kernels.md), and
 * kernels/backend_nocuda.c (CEDAR_CUDA=OFF), never available ("built
 * without CUDA"). Callers list it beside op_backend_cpu and ask available()
 * first; they need no #ifdef.
 *
 * Test: tests/test_backend_ops.c (reports cuda as skipped, with the reason,
 * where it is not available).
 */
#ifndef CEDAR_KERN_BACKEND_H
#define CEDAR_KERN_BACKEND_H

#include "ops/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const struct op_backend kern_backend_cuda;

#ifdef __cplusplus
}
#endif

#endif
