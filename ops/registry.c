/* registry.c: the op table generated from CEDAR_OPS, and the small helpers
 * descriptors use to read inputs, allocate outputs and report errors. */
#include "ops/registry.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/check.h"

const struct op_desc *const op_registry[OP_COUNT] = {
#define OP_ENTRY_(name) &op_desc_##name,
    CEDAR_OPS(OP_ENTRY_)
#undef OP_ENTRY_
};

const char *op_name(enum op_id id) { return id < OP_COUNT ? op_registry[id]->name : "?"; }

const struct op_desc *op_find(const char *name) {
  for (int i = 0; i < OP_COUNT; i++)
    if (!strcmp(op_registry[i]->name, name)) return op_registry[i];
  return NULL;
}

const char *op_dtype_name(enum op_dtype t) {
  static const char *names[] = {"F32", "I32", "I64", "U8"};
  return t <= OP_U8 ? names[t] : "?";
}

size_t op_dtype_size(enum op_dtype t) {
  static const size_t sizes[] = {4, 4, 8, 1};
  return t <= OP_U8 ? sizes[t] : 0;
}

int op_io_fail(struct op_io *io, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  io->fail(io, msg);
  return CEDAR_EINVAL;
}

static const struct op_arg *find_arg(const struct op_arg *args, const char *name) {
  for (; args && args->name; args++)
    if (!strcmp(args->name, name)) return args;
  return NULL;
}

const struct op_tensor *op_io_in(const struct op_desc *self, struct op_io *io, const char *name, int ndim,
                                 int64_t *dims) {
  const struct op_arg *a = find_arg(self->inputs, name);
  CEDAR_ASSERT_MSG(a, "op %s declares no input '%s'", self->name, name);
  const struct op_tensor *t = io->input(io, name);
  if (!t) {
    op_io_fail(io, "%s: missing input tensor '%s' %s %s", self->name, name, op_dtype_name(a->dtype), a->shape);
    return NULL;
  }
  if (t->dtype != a->dtype || t->ndim != ndim) {
    op_io_fail(io, "%s: input '%s' must be %s with %d dims %s, got %s with %d dims", self->name, name,
               op_dtype_name(a->dtype), ndim, a->shape, op_dtype_name(t->dtype), t->ndim);
    return NULL;
  }
  for (int i = 0; i < ndim; i++) dims[i] = t->shape[i];
  return t;
}

void *op_io_out(const struct op_desc *self, struct op_io *io, const char *name, int ndim, const int64_t *shape) {
  const struct op_arg *a = find_arg(self->outputs, name);
  CEDAR_ASSERT_MSG(a, "op %s declares no output '%s'", self->name, name);
  void *p = io->output(io, name, a->dtype, ndim, shape);
  if (!p) op_io_fail(io, "%s: cannot allocate output '%s'", self->name, name);
  return p;
}

double op_io_param(const struct op_desc *self, struct op_io *io, const char *name) {
  const struct op_param *p = self->params;
  while (p && p->name && strcmp(p->name, name)) p++;
  CEDAR_ASSERT_MSG(p && p->name, "op %s declares no parameter '%s'", self->name, name);
  double v;
  return io->param(io, name, &v) ? v : p->def;
}
