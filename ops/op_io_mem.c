/* op_io_mem.c: the memory-backed struct op_io (see op_io_mem.h).
 *
 * What it is: four callbacks over fixed tables of named tensors and
 * parameters, and the allocation of outputs (zeroed, optionally between
 * sentinel bytes). What it is not: a tensor library; it never copies inputs.
 * Test: every descriptor test runs through it (ctest -R "op_|backend_ops").
 */
#include "ops/op_io_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"

static const struct op_tensor *mem_input(struct op_io *io, const char *name) {
  struct op_io_mem *m = io->ctx;
  for (int i = 0; i < m->n_in; i++)
    if (!strcmp(m->in_name[i], name)) return &m->in[i];
  return NULL;
}

/* Element count of a shape; false when a dim is negative or the bytes
 * (16 per element bounds every dtype) would not fit a size_t. */
static bool shape_count(int ndim, const int64_t *shape, size_t *count) {
  size_t c = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] && c > SIZE_MAX / 16 / (size_t)shape[i])) return false;
    c *= (size_t)shape[i];
  }
  *count = c;
  return true;
}

static void *mem_output(struct op_io *io, const char *name, enum op_dtype dtype, int ndim, const int64_t *shape) {
  struct op_io_mem *m = io->ctx;
  size_t count;
  if (m->n_out == OP_IO_MEM_MAX || ndim < 0 || ndim > OP_MAX_DIMS || !shape_count(ndim, shape, &count)) return NULL;
  size_t bytes = count * op_dtype_size(dtype);
  if (bytes > SIZE_MAX - 2 * m->guard - 1) return NULL;
  uint8_t *raw = malloc(bytes + 2 * m->guard + 1); /* + 1: an empty output still gets a pointer */
  if (!raw) return NULL;
  memset(raw, OP_IO_MEM_SENTINEL, m->guard);
  memset(raw + m->guard, 0, bytes + 1);
  memset(raw + m->guard + bytes, OP_IO_MEM_SENTINEL, m->guard);
  struct op_tensor *t = &m->out[m->n_out];
  *t = (struct op_tensor){.dtype = dtype, .ndim = ndim, .data = raw + m->guard};
  memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  m->out_name[m->n_out++] = name;
  return t->data;
}

static bool mem_param(struct op_io *io, const char *name, double *out) {
  struct op_io_mem *m = io->ctx;
  for (int i = 0; i < m->n_param; i++)
    if (!strcmp(m->p_name[i], name)) return *out = m->p_val[i], true;
  return false;
}

/* The first message is the cause; later ones are its consequences. */
static void mem_fail(struct op_io *io, const char *msg) {
  struct op_io_mem *m = io->ctx;
  if (!m->error[0]) snprintf(m->error, sizeof m->error, "%s", msg);
}

void op_io_mem_init(struct op_io_mem *m) {
  memset(m, 0, sizeof *m);
  m->io = (struct op_io){.ctx = m, .input = mem_input, .output = mem_output, .param = mem_param, .fail = mem_fail};
}

int op_io_mem_input(struct op_io_mem *m, const char *name, enum op_dtype dtype, int ndim, const int64_t *shape,
                    void *data) {
  if (m->n_in == OP_IO_MEM_MAX || ndim < 0 || ndim > OP_MAX_DIMS) return CEDAR_EINVAL;
  struct op_tensor *t = &m->in[m->n_in];
  *t = (struct op_tensor){.dtype = dtype, .ndim = ndim, .data = data};
  memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  m->in_name[m->n_in++] = name;
  return 0;
}

int op_io_mem_param(struct op_io_mem *m, const char *name, double value) {
  for (int i = 0; i < m->n_param; i++)
    if (!strcmp(m->p_name[i], name)) { /* a second value replaces the first */
      m->p_val[i] = value;
      return 0;
    }
  if (m->n_param == OP_IO_MEM_MAX) return CEDAR_EINVAL;
  m->p_name[m->n_param] = name;
  m->p_val[m->n_param++] = value;
  return 0;
}

const struct op_tensor *op_io_mem_output(const struct op_io_mem *m, const char *name) {
  for (int i = 0; i < m->n_out; i++)
    if (!strcmp(m->out_name[i], name)) return &m->out[i];
  return NULL;
}

size_t op_io_mem_bytes(const struct op_tensor *t) {
  size_t count = 1;
  for (int i = 0; i < t->ndim; i++) count *= (size_t)t->shape[i];
  return count * op_dtype_size(t->dtype);
}

bool op_io_mem_guards_ok(const struct op_io_mem *m, int i) {
  const uint8_t *p = m->out[i].data;
  const size_t bytes = op_io_mem_bytes(&m->out[i]);
  for (size_t k = 0; k < m->guard; k++)
    if (p[-1 - (ptrdiff_t)k] != OP_IO_MEM_SENTINEL || p[bytes + k] != OP_IO_MEM_SENTINEL) return false;
  return true;
}

void op_io_mem_free(struct op_io_mem *m) {
  for (int i = 0; i < m->n_out; i++) free((uint8_t *)m->out[i].data - m->guard);
  m->n_out = 0;
}
