/* op_io_mem.h: struct op_io (ops/registry.h) backed by memory, the one
 * implementation behind `cedar op` (cli/cmd_op.c, which reads the inputs
 * from a safetensors file and writes the outputs to one) and the op tests
 * (tests/harness.h's h_io is this struct).
 *
 *   struct op_io_mem m;
 *   op_io_mem_init(&m);
 *   op_io_mem_input(&m, "x", OP_F32, 2, (int64_t[]){n, d}, x);  // borrowed
 *   op_io_mem_param(&m, "eps", 1e-5);
 *   int rc = desc->run(desc, &m.io);    // rc < 0: m.error says why
 *   const struct op_tensor *y = op_io_mem_output(&m, "out");
 *   op_io_mem_free(&m);
 *
 * Inputs and parameter names are borrowed (the caller keeps them alive for
 * the call); outputs are allocated zeroed, owned by the struct and freed by
 * op_io_mem_free. The first message a run records is kept in `error` (later
 * ones are usually its consequences). With `guard` > 0 every output sits
 * between `guard` bytes of OP_IO_MEM_SENTINEL on each side, which
 * op_io_mem_guards_ok checks: a write outside an output's shape is caught.
 *
 * Not here: files (cli/cmd_op.c), choosing a backend (ops/backend.h).
 * Tested through every descriptor test (tests/test_op_desc_*.c,
 * tests/test_op_registry.c, tests/test_backend_ops.c) and tests/cli/op.sh.
 */
#ifndef CEDAR_OPS_OP_IO_MEM_H
#define CEDAR_OPS_OP_IO_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/registry.h"

#define OP_IO_MEM_MAX 64      /* inputs, outputs and parameters, each */
#define OP_IO_MEM_SENTINEL 0xA5

struct op_io_mem {
  struct op_io io; /* hand &m->io to a descriptor's run (io.ctx is the struct) */
  const char *in_name[OP_IO_MEM_MAX];
  struct op_tensor in[OP_IO_MEM_MAX]; /* data borrowed from the caller */
  int n_in;
  const char *out_name[OP_IO_MEM_MAX];
  struct op_tensor out[OP_IO_MEM_MAX]; /* data owned, zeroed when allocated */
  int n_out;
  const char *p_name[OP_IO_MEM_MAX];
  double p_val[OP_IO_MEM_MAX];
  int n_param;
  size_t guard;    /* sentinel bytes on each side of every output; 0 = none. Set it
                    * after init and keep it until op_io_mem_free. */
  char error[512]; /* the first message the run recorded; "" = none */
};

/* An empty call: no inputs, outputs or parameters, no guard. */
void op_io_mem_init(struct op_io_mem *m);
/* Add an input (data borrowed), or a parameter (a repeated name replaces the
 * earlier value). CEDAR_EINVAL when the table is full or ndim is outside
 * [0, OP_MAX_DIMS]; 0 otherwise. */
int op_io_mem_input(struct op_io_mem *m, const char *name, enum op_dtype dtype, int ndim, const int64_t *shape,
                    void *data);
int op_io_mem_param(struct op_io_mem *m, const char *name, double value);
/* The output called `name`, or NULL when the run made none. */
const struct op_tensor *op_io_mem_output(const struct op_io_mem *m, const char *name);
/* Bytes of output t's data (its shape times its dtype's size). */
size_t op_io_mem_bytes(const struct op_tensor *t);
/* Whether the guard bytes around output i are intact (true when guard is 0). */
bool op_io_mem_guards_ok(const struct op_io_mem *m, int i);
/* Free the outputs; inputs, parameters and the error stay, so the same call
 * can run again (or run after an input is changed). */
void op_io_mem_free(struct op_io_mem *m);

#endif
