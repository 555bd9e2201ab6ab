/* quote.c: strings as gnuplot and YAML literals (quote.h). One writer per
 * language, emitting through a byte sink so the FILE and buffer forms are
 * the same code. */
#include "base/quote.h"

#include <string.h>

/* A sink: a FILE, or a buffer of cap bytes that counts what did not fit. */
struct sink {
  FILE *f;
  char *buf;
  size_t cap, len;
};

static void put(struct sink *k, const char *s, size_t n) {
  if (k->f) fwrite(s, 1, n, k->f);
  else
    for (size_t i = 0; i < n; i++)
      if (k->len + i + 1 < k->cap) k->buf[k->len + i] = s[i];
  k->len += n;
}

static void gnuplot(struct sink *k, const char *s) {
  put(k, "'", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '\'') put(k, "''", 2);
    else if (*c < 0x20 || *c == 0x7f) put(k, " ", 1);
    else put(k, (const char *)c, 1);
  }
  put(k, "'", 1);
}

static void yaml(struct sink *k, const char *s) {
  put(k, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    char esc[8];
    if (*c == '"' || *c == '\\') esc[0] = '\\', esc[1] = (char)*c, esc[2] = 0;
    else if (*c == '\n') strcpy(esc, "\\n");
    else if (*c == '\t') strcpy(esc, "\\t");
    else if (*c == '\r') strcpy(esc, "\\r");
    else if (*c < 0x20 || *c == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", *c);
    else esc[0] = (char)*c, esc[1] = 0;
    put(k, esc, strlen(esc));
  }
  put(k, "\"", 1);
}

static size_t to_buf(void (*fn)(struct sink *, const char *), char *out, size_t cap, const char *s) {
  struct sink k = {NULL, out, cap, 0};
  fn(&k, s);
  if (cap) out[k.len < cap ? k.len : cap - 1] = 0;
  return k.len;
}

void cedar_quote_gnuplot(FILE *f, const char *s) { gnuplot(&(struct sink){f, NULL, 0, 0}, s); }
void cedar_quote_yaml(FILE *f, const char *s) { yaml(&(struct sink){f, NULL, 0, 0}, s); }
size_t cedar_quote_gnuplot_buf(char *out, size_t cap, const char *s) { return to_buf(gnuplot, out, cap, s); }
size_t cedar_quote_yaml_buf(char *out, size_t cap, const char *s) { return to_buf(yaml, out, cap, s); }
