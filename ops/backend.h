/* backend.h: the backend table of the ops (STYLE.md 14), as ggml-backend
 * has one: a backend names itself, says whether it can run in this process
 * (and why not), and holds one run slot per registered op (enum op_id of
 * ops/registry.h). A NULL slot means "not implemented on this backend", never
 * "fall back silently": the caller sees it and decides.
 *
 *   op_backend_cpu      ops/backend.c: every slot runs the descriptor's own
 *                       run, the CPU reference (today's code, its bits);
 *   kern_backend_cuda   kernels/backend.h: CUDA twins, slot by slot as they
 *                       land (kernels/backend_cuda.cu; the CPU-only build's
 *                       kernels/backend_nocuda.c is never available).
 *
 * A slot takes the same (descriptor, op_io) as a descriptor's run, so the
 * inputs, parameters, checks and error messages of an op are the same on
 * every backend; a twin differs only in where and how it computes.
 *
 * Not here: choosing a backend per graph node (the executors, from the
 * node's device). Test: tests/test_backend_ops.c runs every registered op on
 * every backend present against the CPU (ctest -R backend_ops).
 */
#ifndef CEDAR_OPS_BACKEND_H
#define CEDAR_OPS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "ops/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int (*op_backend_run_fn)(const struct op_desc *self, struct op_io *io);

/* Keep the field order: kernels/backend_cuda.cu initializes it by position
 * (C++17 has no designated initializers). */
struct op_backend {
  const char *name; /* "cpu", "cuda": the device names of plans */
  /* Whether this process can run it; when not, a one-line reason in why
   * (why may be NULL when len is 0). Never aborts: no GPU is a normal state. */
  bool (*available)(char *why, size_t len);
  /* true when every implemented slot gives the CPU reference's bits (the
   * test then compares bitwise, else under a derived tolerance). */
  bool cpu_bits;
  op_backend_run_fn run[OP_COUNT]; /* NULL: not implemented on this backend */
};

extern const struct op_backend op_backend_cpu;

/* Whether backend b implements op id. */
bool op_backend_has(const struct op_backend *b, enum op_id id);
/* Run op id on backend b through io: the slot's status, or
 * CEDAR_EUNSUPPORTED after io->fail ("<op> is not implemented on <backend>")
 * when the slot is NULL. Availability is the caller's check, once. */
int op_backend_run(const struct op_backend *b, enum op_id id, struct op_io *io);

#ifdef __cplusplus
}
#endif

#endif
