/* safetensors_internal.h: what the safetensors reader (safetensors.c) and
 * writer (safetensors_write.c) share: error messages that name the file and
 * the tensor, and the UTF-8 check. Not part of the API. */
#ifndef CEDAR_SAFETENSORS_INTERNAL_H
#define CEDAR_SAFETENSORS_INTERNAL_H

#include <stddef.h>

#include "runtime/load/safetensors.h"

struct st__ctx {
  const char *label; /* the file, for messages */
  char *err;
  size_t err_len;
};

#define ST__QUOTE_MAX 72

/* A name made safe to print: control bytes become '?', long names are cut at
 * a UTF-8 character boundary and end in "...". */
const char *st__quote(char out[ST__QUOTE_MAX], const char *s, size_t len);
/* Fill the message "<file>: tensor '<name>': <what>" (or "<file>: <what>"
 * when tensor is NULL) and return status. */
int st__fail(const struct st__ctx *c, int status, const char *tensor, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "[a, b, c]". */
void st__fmt_shape(char *out, size_t len, const struct st_tensor *t);
/* Strict UTF-8: the offset of the first bad byte, or n when all is well. */
size_t st__utf8_check(const unsigned char *s, size_t n);

#endif
