/* check.h: cedar's three error tiers (STYLE.md 6).
 *
 *   1. CHECK macros around library calls (StarPU, libyaml, CUDA, ...): print the
 *      call, file:line and the library's own error string, then abort. A failing
 *      library call here is a broken environment or a cedar bug, not user input.
 *   2. CEDAR_ASSERT for internal invariants: abort with file:line.
 *   3. User-facing errors (bad plan, bad file, bad flag) never abort: functions
 *      return a negative cedar_status and fill a message naming the place and
 *      the fix.
 *
 * All macros are single statements (do { } while (0)).
 */
#ifndef CEDAR_CHECK_H
#define CEDAR_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum cedar_status {
  CEDAR_OK = 0,
  CEDAR_EINVAL = -1,  /* bad user input: plan, flag, request */
  CEDAR_EIO = -2,     /* a file could not be read or written */
  CEDAR_ENOMEM = -3,  /* an allocation failed */
  CEDAR_EFORMAT = -4, /* a file is malformed (plan syntax, weights, cache) */
  CEDAR_EUNSUPPORTED = -5,
};

const char *cedar_status_str(int status);

#define CEDAR_ASSERT(cond)                                                      \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "cedar: internal error: assertion '%s' failed at %s:%d\n", \
              #cond, __FILE__, __LINE__);                                       \
      abort();                                                                  \
    }                                                                           \
  } while (0)

#define CEDAR_ASSERT_MSG(cond, ...)                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "cedar: internal error at %s:%d: ", __FILE__, __LINE__);  \
      fprintf(stderr, __VA_ARGS__);                                             \
      fputc('\n', stderr);                                                      \
      abort();                                                                  \
    }                                                                           \
  } while (0)

/* StarPU calls return 0 or a negative errno value. */
#define STARPU_CHECK(call)                                                      \
  do {                                                                          \
    int _cedar_rc = (call);                                                     \
    if (_cedar_rc != 0) {                                                       \
      fprintf(stderr, "cedar: %s failed at %s:%d: %s (%d)\n", #call, __FILE__,   \
              __LINE__, _cedar_rc < 0 ? strerror(-_cedar_rc) : "error",         \
              _cedar_rc);                                                       \
      abort();                                                                  \
    }                                                                           \
  } while (0)

/* Allocation that cannot fail silently. Use only for small internal buffers;
 * user-sized allocations return CEDAR_ENOMEM instead. */
void *cedar_xmalloc(size_t n);
void *cedar_xcalloc(size_t n, size_t size);
void *cedar_xrealloc(void *p, size_t n);
/* n bytes (rounded up to a multiple of align, a power of two) at an align-byte
 * boundary; free() releases them. */
void *cedar_xaligned(size_t align, size_t n);
char *cedar_xstrdup(const char *s);

#endif
