/* weights_finite.c: every value of a weights file is a number
 * (weights_finite.h). One predicate per dtype on the stored bits, so no
 * value is decoded and a NaN payload cannot compare equal to anything. */
#define _GNU_SOURCE /* vasprintf */
#include "runtime/load/weights_finite.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"

/* Whether element i of a tensor of dtype dt is a NaN or an infinity, from
 * its bits (little-endian). The exponent fields: F32 8 bits at 23, F64 11
 * at 52, F16 5 at 10, BF16 8 at 7; all ones = Inf or NaN. */
static bool bad_at(enum st_dtype dt, const uint8_t *p, uint64_t i) {
  uint16_t h;
  uint32_t w;
  uint64_t d;
  switch (dt) {
    case ST_F32: memcpy(&w, p + 4 * i, 4); return (w & 0x7f800000u) == 0x7f800000u;
    case ST_F64: memcpy(&d, p + 8 * i, 8); return (d & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
    case ST_F16: memcpy(&h, p + 2 * i, 2); return (h & 0x7c00u) == 0x7c00u;
    case ST_BF16: memcpy(&h, p + 2 * i, 2); return (h & 0x7f80u) == 0x7f80u;
    case ST_F8_E4M3: return (p[i] & 0x7f) == 0x7f; /* E4M3FN: no infinity, NaN = S.1111.111 */
    case ST_F8_E5M2: return (p[i] & 0x7c) == 0x7c;
    case ST_F8_E8M0: return p[i] == 0xff;
    default: return false;
  }
}

uint64_t weights_nonfinite_count(const struct st_tensor *t, uint64_t *first) {
  size_t es = st_dtype_size(t->dtype);
  uint64_t n = es ? t->nbytes / es : 0, bad = 0;
  for (uint64_t i = 0; i < n; i++)
    if (bad_at(t->dtype, t->data, i) && !bad++ && first) *first = i;
  return bad;
}

static void add(struct weights_problems *pr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct weights_problems *pr, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  CEDAR_ASSERT(n >= 0 && s != NULL);
  if (pr->n == pr->cap) {
    pr->cap = pr->cap ? 2 * pr->cap : 16;
    pr->msg = cedar_xrealloc(pr->msg, pr->cap * sizeof *pr->msg);
  }
  pr->msg[pr->n++] = s;
}

size_t weights_finite_check(const st_file_t *f, const char *label, struct weights_problems *pr) {
  size_t tensors = 0;
  for (size_t i = 0; i < st_count(f); i++) {
    const struct st_tensor *t = st_tensor_at(f, i);
    uint64_t first = 0, bad = weights_nonfinite_count(t, &first);
    if (!bad) continue;
    tensors++;
    if (pr)
      add(pr, "%s: %s: %" PRIu64 " value%s not finite (%s; the first at element %" PRIu64 "): the weights are damaged",
          label, t->name, bad, bad == 1 ? " is" : "s are",
          t->dtype == ST_F8_E8M0 ? "E8M0 scale 0xFF, the format's NaN" : "NaN or infinity", first);
  }
  return tensors;
}
