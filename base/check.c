/* check.c: the status strings and the small allocation helpers of check.h.
 * Foundation code: includes nothing of cedar but base/. */
#include "base/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cedar_status_str(int status) {
  switch (status) {
    case CEDAR_OK: return "ok";
    case CEDAR_EINVAL: return "invalid input";
    case CEDAR_EIO: return "i/o error";
    case CEDAR_ENOMEM: return "out of memory";
    case CEDAR_EFORMAT: return "malformed file";
    case CEDAR_EUNSUPPORTED: return "unsupported";
  }
  return "unknown error";
}

static void *oom(size_t n) {
  fprintf(stderr, "cedar: out of memory allocating %zu bytes\n", n);
  abort();
}

void *cedar_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  return p ? p : oom(n);
}

void *cedar_xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  return p ? p : oom(n * size);
}

void *cedar_xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  return q ? q : oom(n);
}

void *cedar_xaligned(size_t align, size_t n) {
  size_t bytes = n ? (n + align - 1) / align * align : align; /* C11: a multiple of align */
  void *p = aligned_alloc(align, bytes);
  return p ? p : oom(bytes);
}

char *cedar_xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(cedar_xmalloc(n), s, n);
}
