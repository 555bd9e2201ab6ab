/* registry.c: the op table generated from CEDAR_OPS, and the small helpers
 * descriptors use to read inputs, allocate outputs and report errors. */
#include "ops/registry.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"

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
  for (int i = 0; i < ndim; i++) {
    dims[i] = t->shape[i];
    if (dims[i] < 0 || dims[i] > INT_MAX) {
      op_io_fail(io, "%s: input '%s' dim %d is %lld, outside [0, %d]", self->name, name, i, (long long)dims[i],
                 INT_MAX);
      return NULL;
    }
  }
  return t;
}

const struct op_tensor *op_io_in_opt(const struct op_desc *self, struct op_io *io, const char *name, int ndim,
                                     int64_t *dims, bool *ok) {
  if (!io->input(io, name)) return NULL;
  const struct op_tensor *t = op_io_in(self, io, name, ndim, dims);
  if (!t) *ok = false;
  return t;
}

void *op_io_out(const struct op_desc *self, struct op_io *io, const char *name, int ndim, const int64_t *shape) {
  const struct op_arg *a = find_arg(self->outputs, name);
  CEDAR_ASSERT_MSG(a, "op %s declares no output '%s'", self->name, name);
  /* The declared name, a static string: an op_io may keep the pointer. */
  void *p = io->output(io, a->name, a->dtype, ndim, shape);
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

bool op_io_param_in(const struct op_desc *self, struct op_io *io, const char *name, double lo, double hi,
                    double *out) {
  const struct op_param *p = self->params;
  while (p && p->name && strcmp(p->name, name)) p++;
  CEDAR_ASSERT_MSG(p && p->name, "op %s declares no parameter '%s'", self->name, name);
  double v = op_io_param(self, io, name);
  if (!(v >= lo && v <= hi) || (p->type != OP_PARAM_FLOAT && v != floor(v))) {
    op_io_fail(io, "%s: parameter %s = %g must be %s in [%g, %g]", self->name, name, v,
               p->type == OP_PARAM_FLOAT ? "a number" : "an integer", lo, hi);
    return false;
  }
  *out = v;
  return true;
}

bool op_io_param_int(const struct op_desc *self, struct op_io *io, const char *name, int64_t lo, int64_t hi,
                     int64_t *out) {
  double v = op_io_param(self, io, name);
  if (!(v >= (double)lo && v <= (double)hi) || v != floor(v)) {
    op_io_fail(io, "%s: parameter %s = %g must be an integer in [%lld, %lld]", self->name, name, v, (long long)lo,
               (long long)hi);
    return false;
  }
  *out = (int64_t)v;
  return true;
}

bool op_io_param_nonneg(const struct op_desc *self, struct op_io *io, const char *name, float *out) {
  double v = op_io_param(self, io, name);
  if (!(v >= 0) || !isfinite(v)) {
    op_io_fail(io, "%s: parameter %s = %g must be finite and >= 0", self->name, name, v);
    return false;
  }
  *out = (float)v;
  return true;
}

const char *op_dims_str(char *buf, size_t size, const int64_t *d, int nd) {
  size_t k = (size_t)snprintf(buf, size, "(");
  for (int i = 0; i < nd && k < size; i++) k += (size_t)snprintf(buf + k, size - k, i ? ", %lld" : "%lld", (long long)d[i]);
  if (k < size) snprintf(buf + k, size - k, ")");
  return buf;
}

bool op_io_dims_match(struct op_io *io, const char *op, const char *name, const int64_t *got, const int64_t *want,
                      int nd, const char *ref, const int64_t *ref_dims, int ref_nd) {
  if (!memcmp(got, want, sizeof *got * (size_t)nd)) return true;
  char g[192], w[192], r[192] = "";
  if (ref_dims) op_dims_str(r, sizeof r, ref_dims, ref_nd);
  op_io_fail(io, "%s: %s is %s but must be %s to match %s%s%s", op, name, op_dims_str(g, sizeof g, got, nd),
             op_dims_str(w, sizeof w, want, nd), ref, ref_dims ? " " : "", r);
  return false;
}

bool op_io_dims_fit_int(struct op_io *io, const char *op, const char *name, const int64_t *d, int nd) {
  for (int i = 0; i < nd; i++)
    if (d[i] > INT_MAX) {
      char b[192];
      op_io_fail(io, "%s: %s is %s; dimensions above %d are not supported", op, name, op_dims_str(b, sizeof b, d, nd),
                 INT_MAX);
      return false;
    }
  return true;
}
