/* safetensors.c: the safetensors reader (see safetensors.h and
 * docs/safetensors.md).
 *
 * Reading checks, in order: the 8-byte length against the file and the 100 MB
 * cap; the header's first byte ('{'), its UTF-8, and the lexical rules cJSON
 * is lenient about (raw control characters, \u0000, number syntax); the JSON
 * itself (cJSON); each entry (dtype, shape, data_offsets, metadata strings);
 * duplicate names; and last the layout of the data buffer, which must be
 * covered exactly, without overlaps or holes, as the official implementation
 * requires. The first problem found is reported; nothing is partly returned.
 *
 * Why mmap: checkpoint shards are several GB; a read-only private mapping
 * touches only the tensors a rank uses, shares pages with the page cache (and
 * other ranks on the node) and needs no second copy. The cost is SIGBUS if
 * another process truncates the file while it is mapped; cedar's writer
 * never does that (it renames a new file over the old one). read() is the
 * fallback where mmap is refused.
 *
 * The writer is runtime/load/safetensors_write.c.
 * Test: tests/test_safetensors.c; fuzz: tests/fuzz/fuzz_safetensors.c.
 */
#define _DEFAULT_SOURCE /* struct stat's st_mtim */
#include "runtime/load/safetensors.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "base/file.h"
#include "runtime/load/map_guard.h"
#include "runtime/load/safetensors_internal.h"

struct st_file {
  struct st_tensor *tensors;        /* n, in data-buffer order */
  const struct st_tensor **by_name; /* n, sorted by name */
  size_t n;
  struct st_meta *meta;             /* n_meta, sorted by key */
  size_t n_meta;
  void *map;                        /* st_open: the mapping (map_len bytes) */
  size_t map_len;
  void *owned;                      /* st_open: the read() fallback buffer */
  uint64_t id[4];                   /* st_open: st_file_id */
};

static const struct {
  const char *name;
  size_t size;
} dtypes[] = {
#define ST_ROW_(name, bytes) {#name, bytes},
    ST_DTYPES(ST_ROW_)
#undef ST_ROW_
};

const char *st_dtype_name(enum st_dtype t) {
  return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].name : NULL;
}

size_t st_dtype_size(enum st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].size : 0; }

int st_dtype_parse(const char *s, enum st_dtype *out) {
  for (int i = 0; s && i < ST_DTYPE_COUNT; i++)
    if (!strcmp(s, dtypes[i].name)) {
      *out = (enum st_dtype)i;
      return CEDAR_OK;
    }
  return CEDAR_EFORMAT;
}

/* ---- messages ------------------------------------------------------------ */

/* A name made safe to print: control bytes become '?', long names are cut at
 * a UTF-8 character boundary and end in "...". */
const char *st__quote(char out[ST__QUOTE_MAX], const char *s, size_t len) {
  size_t max = ST__QUOTE_MAX - 4, k = len < max ? len : max;
  if (k < len)
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
  for (size_t i = 0; i < k; i++) {
    unsigned char b = (unsigned char)s[i];
    out[i] = (b < 0x20 || b == 0x7F) ? '?' : (char)b;
  }
  strcpy(out + k, k < len ? "..." : "");
  return out;
}

/* Fill the message "<file>: tensor '<name>': <what>" (or "<file>: <what>"
 * when tensor is NULL) and return status. */
int st__fail(const struct st__ctx *c, int status, const char *tensor, const char *fmt, ...) {
  if (!c->err || !c->err_len) return status;
  char q[ST__QUOTE_MAX];
  int k = tensor ? snprintf(c->err, c->err_len, "%s: tensor '%s': ", c->label, st__quote(q, tensor, strlen(tensor)))
                 : snprintf(c->err, c->err_len, "%s: ", c->label);
  if (k >= 0 && (size_t)k < c->err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + k, c->err_len - (size_t)k, fmt, ap);
    va_end(ap);
  }
  return status;
}

static const char *json_kind(const cJSON *v) {
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsObject(v)) return "an object";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsBool(v)) return "a boolean";
  return "null";
}

void st__fmt_shape(char *out, size_t len, const struct st_tensor *t) {
  size_t k = (size_t)snprintf(out, len, "[");
  for (int i = 0; i < t->ndim && k < len; i++)
    k += (size_t)snprintf(out + k, len - k, "%s%" PRId64, i ? ", " : "", t->shape[i]);
  if (k < len) snprintf(out + k, len - k, "]");
}

/* ---- lexical checks ------------------------------------------------------ */

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
 * Returns the offset of the first bad byte, or n when all is well. */
size_t st__utf8_check(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char b = s[i];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* range of the second byte */
    if (b < 0x80) len = 1;
    else if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) len = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) len = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    else return i;
    if (len > n - i) return i;
    if (len > 1 && (s[i + 1] < lo || s[i + 1] > hi)) return i;
    for (size_t k = 2; k < len; k++)
      if ((s[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return n;
}

/* A number token as the format's integers are written: -?(0|[1-9][0-9]*). */
static bool plain_int(const char *s, size_t n) {
  if (n && *s == '-') s++, n--;
  if (!n || (n > 1 && *s == '0')) return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

/* The first number that is not a plain integer, reported only once the
 * structural checks pass (a number where a string belongs is a better
 * message there). */
struct lex_finding {
  bool found;
  size_t at, len;
  char key[ST__QUOTE_MAX];
};

/* What cJSON lets through but JSON (and serde_json, the official parser)
 * does not: raw control bytes, and number syntax other than plain integers.
 * Also refuses \u0000, which C strings cannot hold. `key` tracks the last
 * top-level key (the tensor) for messages. */
static int lex_check(const struct st__ctx *c, const char *h, size_t n, struct lex_finding *bad) {
  char key[ST__QUOTE_MAX] = "";
  int depth = 0;
  for (size_t i = 0; i < n;) {
    unsigned char ch = (unsigned char)h[i];
    if (ch == '"') {
      /* Inside a tensor's entry, name the tensor; a top-level key is itself
       * the name being read, and "__metadata__" is no tensor. */
      const char *who = depth > 1 && *key && strcmp(key, "__metadata__") ? key : NULL;
      size_t s = ++i;
      while (i < n && h[i] != '"') {
        unsigned char b = (unsigned char)h[i];
        if (b < 0x20)
          return st__fail(c, CEDAR_EFORMAT, who,
                      "raw control byte 0x%02x inside a string at header byte %zu; JSON requires it escaped", b, i);
        if (b == '\\' && i + 5 < n && h[i + 1] == 'u' && !memcmp(h + i + 2, "0000", 4))
          return st__fail(c, CEDAR_EFORMAT, who,
                      "\\u0000 (NUL) in a string at header byte %zu; cedar accepts no NUL in names or metadata", i);
        i += b == '\\' ? 2 : 1;
      }
      if (depth == 1) st__quote(key, h + s, (i < n ? i : n) - s);
      i++;
    } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
      size_t s = i;
      while (i < n && h[i] && strchr("+-.eE0123456789", h[i])) i++;
      if (!bad->found && !plain_int(h + s, i - s)) {
        bad->found = true, bad->at = s, bad->len = i - s;
        strcpy(bad->key, key);
      }
    } else {
      if (ch == '{' || ch == '[') depth++;
      else if (ch == '}' || ch == ']') depth--;
      else if (ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r')
        return st__fail(c, CEDAR_EFORMAT, NULL, "control byte 0x%02x at header byte %zu, outside any string", ch, i);
      i++;
    }
  }
  return CEDAR_OK;
}

/* ---- entries ------------------------------------------------------------- */

/* A JSON number that is an integer in [0, 2^53). */
static int get_uint(const struct st__ctx *c, const char *tensor, const cJSON *v, const char *what, uint64_t *out) {
  if (!cJSON_IsNumber(v))
    return st__fail(c, CEDAR_EFORMAT, tensor, "%s is %s, not an integer", what, json_kind(v));
  double d = v->valuedouble;
  if (d < 0 || signbit(d))
    return st__fail(c, CEDAR_EFORMAT, tensor, "%s is %g; it must be a non-negative integer", what, d);
  if (d >= (double)ST_MAX_INT)
    return st__fail(c, CEDAR_EFORMAT, tensor, "%s is %.17g, not below 2^53 (the largest cedar reads exactly)", what, d);
  if (d != floor(d)) return st__fail(c, CEDAR_EFORMAT, tensor, "%s is %g, not an integer", what, d);
  *out = (uint64_t)d;
  return CEDAR_OK;
}

static const char *const subbyte_dtypes[] = {"F4", "F6_E2M3", "F6_E3M2"};

static int parse_dtype(const struct st__ctx *c, const char *name, const cJSON *v, struct st_tensor *t) {
  if (!cJSON_IsString(v))
    return st__fail(c, CEDAR_EFORMAT, name, "dtype is %s; expected a string such as \"F32\"", json_kind(v));
  if (st_dtype_parse(v->valuestring, &t->dtype) == CEDAR_OK) return CEDAR_OK;
  char q[ST__QUOTE_MAX];
  st__quote(q, v->valuestring, strlen(v->valuestring));
  for (size_t i = 0; i < sizeof subbyte_dtypes / sizeof *subbyte_dtypes; i++)
    if (!strcmp(v->valuestring, subbyte_dtypes[i]))
      return st__fail(c, CEDAR_EUNSUPPORTED, name, "dtype %s packs elements below one byte; cedar does not read it", q);
  char known[256];
  size_t k = 0;
  for (int i = 0; i < ST_DTYPE_COUNT && k < sizeof known; i++)
    k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? " " : "", dtypes[i].name);
  return st__fail(c, CEDAR_EFORMAT, name, "unknown dtype '%s' (known: %s)", q, known);
}

/* shape -> t->ndim, t->shape, t->nbytes (overflow-checked, in order, as the
 * official implementation does). */
static int parse_shape(const struct st__ctx *c, const char *name, const cJSON *v, struct st_tensor *t) {
  if (!cJSON_IsArray(v))
    return st__fail(c, CEDAR_EFORMAT, name, "shape is %s; expected an array of integers", json_kind(v));
  int nd = cJSON_GetArraySize(v);
  if (nd > ST_MAX_DIMS)
    return st__fail(c, CEDAR_EUNSUPPORTED, name, "shape has %d dimensions; cedar reads at most %d", nd, ST_MAX_DIMS);
  uint64_t count = 1, size = st_dtype_size(t->dtype);
  t->ndim = 0;
  for (const cJSON *d = v->child; d; d = d->next) {
    char what[32];
    uint64_t dim;
    snprintf(what, sizeof what, "shape[%d]", t->ndim);
    int rc = get_uint(c, name, d, what, &dim);
    if (rc) return rc;
    t->shape[t->ndim++] = (int64_t)dim;
    if (dim && count > UINT64_MAX / dim)
      return st__fail(c, CEDAR_EFORMAT, name, "shape has 2^64 elements or more (overflow at shape[%d])", t->ndim - 1);
    count *= dim;
  }
  if (count > UINT64_MAX / size) {
    char s[160];
    st__fmt_shape(s, sizeof s, t);
    return st__fail(c, CEDAR_EFORMAT, name, "shape %s of %s is 2^64 bytes or more", s, st_dtype_name(t->dtype));
  }
  t->nbytes = count * size;
  return CEDAR_OK;
}

static int parse_offsets(const struct st__ctx *c, const char *name, const cJSON *v, uint64_t data_len,
                         struct st_tensor *t) {
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2)
    return st__fail(c, CEDAR_EFORMAT, name, "data_offsets must be an array of two integers [begin, end]");
  uint64_t b, e;
  int rc = get_uint(c, name, v->child, "data_offsets[0]", &b);
  if (!rc) rc = get_uint(c, name, v->child->next, "data_offsets[1]", &e);
  if (rc) return rc;
  if (e < b) return st__fail(c, CEDAR_EFORMAT, name, "data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin", b, e);
  if (e > data_len)
    return st__fail(c, CEDAR_EFORMAT, name,
                "data_offsets [%" PRIu64 ", %" PRIu64 "] reach past the end of the %" PRIu64
                "-byte data buffer; the file may be truncated",
                b, e, data_len);
  if (e - b != t->nbytes) {
    char s[160];
    st__fmt_shape(s, sizeof s, t);
    return st__fail(c, CEDAR_EFORMAT, name,
                "data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64 " bytes, but %s shape %s needs %" PRIu64, b, e,
                e - b, st_dtype_name(t->dtype), s, t->nbytes);
  }
  t->offset = b;
  return CEDAR_OK;
}

static int parse_entry(const struct st__ctx *c, const cJSON *e, uint64_t data_len, struct st_tensor *t) {
  const char *name = t->name;
  if (!cJSON_IsObject(e))
    return st__fail(c, CEDAR_EFORMAT, name, "entry is %s; expected an object with dtype, shape and data_offsets",
                json_kind(e));
  const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
  char q[ST__QUOTE_MAX];
  for (const cJSON *k = e->child; k; k = k->next) {
    const cJSON **slot = !strcmp(k->string, "dtype")          ? &dtype
                         : !strcmp(k->string, "shape")        ? &shape
                         : !strcmp(k->string, "data_offsets") ? &offsets
                                                              : NULL;
    if (!slot)
      return st__fail(c, CEDAR_EFORMAT, name, "unknown key '%s'; a tensor entry has dtype, shape and data_offsets",
                  st__quote(q, k->string, strlen(k->string)));
    if (*slot) return st__fail(c, CEDAR_EFORMAT, name, "key '%s' appears twice", k->string);
    *slot = k;
  }
  const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offsets ? "data_offsets" : NULL;
  if (missing) return st__fail(c, CEDAR_EFORMAT, name, "entry has no '%s'", missing);
  int rc = parse_dtype(c, name, dtype, t);
  if (!rc) rc = parse_shape(c, name, shape, t);
  if (!rc) rc = parse_offsets(c, name, offsets, data_len, t);
  return rc;
}

static int cmp_meta(const void *a, const void *b) {
  return strcmp(((const struct st_meta *)a)->key, ((const struct st_meta *)b)->key);
}

static int parse_meta(const struct st__ctx *c, const cJSON *m, struct st_file *f) {
  if (cJSON_IsNull(m)) return CEDAR_OK; /* serde reads null as "no metadata" */
  if (!cJSON_IsObject(m))
    return st__fail(c, CEDAR_EFORMAT, NULL, "__metadata__ is %s; it must be an object of string values", json_kind(m));
  f->meta = calloc((size_t)cJSON_GetArraySize(m) + 1, sizeof *f->meta);
  if (!f->meta) return st__fail(c, CEDAR_ENOMEM, NULL, "out of memory reading __metadata__");
  char q[ST__QUOTE_MAX];
  for (const cJSON *k = m->child; k; k = k->next) {
    if (!cJSON_IsString(k))
      return st__fail(c, CEDAR_EFORMAT, NULL, "__metadata__: key '%s' has %s value; metadata values must be strings",
                  st__quote(q, k->string, strlen(k->string)), json_kind(k));
    struct st_meta *p = &f->meta[f->n_meta];
    p->key = strdup(k->string);
    p->value = strdup(k->valuestring);
    if (p->key || p->value) f->n_meta++; /* st_close frees what was copied */
    if (!p->key || !p->value) return st__fail(c, CEDAR_ENOMEM, NULL, "out of memory reading __metadata__");
  }
  qsort(f->meta, f->n_meta, sizeof *f->meta, cmp_meta);
  for (size_t i = 1; i < f->n_meta; i++)
    if (!strcmp(f->meta[i - 1].key, f->meta[i].key))
      return st__fail(c, CEDAR_EFORMAT, NULL, "__metadata__: key '%s' appears twice",
                  st__quote(q, f->meta[i].key, strlen(f->meta[i].key)));
  return CEDAR_OK;
}

/* Every top-level member: "__metadata__" or a tensor. */
static int parse_members(const struct st__ctx *c, const cJSON *root, uint64_t data_len, struct st_file *f) {
  f->tensors = calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof *f->tensors);
  if (!f->tensors) return st__fail(c, CEDAR_ENOMEM, NULL, "out of memory reading the header");
  bool seen_meta = false;
  for (const cJSON *k = root->child; k; k = k->next) {
    int rc;
    if (!strcmp(k->string, "__metadata__")) {
      if (seen_meta) return st__fail(c, CEDAR_EFORMAT, NULL, "__metadata__ appears twice");
      seen_meta = true;
      rc = parse_meta(c, k, f);
    } else {
      struct st_tensor *t = &f->tensors[f->n];
      if (!(t->name = strdup(k->string))) return st__fail(c, CEDAR_ENOMEM, NULL, "out of memory reading the header");
      f->n++;
      rc = parse_entry(c, k, data_len, t);
    }
    if (rc) return rc;
  }
  return CEDAR_OK;
}

/* ---- names and layout ---------------------------------------------------- */

static int cmp_offset(const void *a, const void *b) {
  const struct st_tensor *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name); /* deterministic order for messages */
}

static int cmp_name_ptr(const void *a, const void *b) {
  return strcmp((*(const struct st_tensor *const *)a)->name, (*(const struct st_tensor *const *)b)->name);
}

static int index_names(const struct st__ctx *c, struct st_file *f) {
  f->by_name = malloc((f->n + 1) * sizeof *f->by_name);
  if (!f->by_name) return st__fail(c, CEDAR_ENOMEM, NULL, "out of memory indexing tensor names");
  for (size_t i = 0; i < f->n; i++) f->by_name[i] = &f->tensors[i];
  qsort(f->by_name, f->n, sizeof *f->by_name, cmp_name_ptr);
  for (size_t i = 1; i < f->n; i++)
    if (!strcmp(f->by_name[i - 1]->name, f->by_name[i]->name))
      return st__fail(c, CEDAR_EFORMAT, f->by_name[i]->name, "appears twice in the header; names must be unique");
  return CEDAR_OK;
}

/* Tensors sorted by offset must tile [0, data_len) exactly: no overlap, no
 * hole, nothing after the last one (the official rule; it also rules out
 * polyglot files). */
static int check_layout(const struct st__ctx *c, const struct st_file *f, uint64_t data_len) {
  uint64_t pos = 0;
  const struct st_tensor *prev = NULL; /* the last tensor that ends at pos */
  char q[ST__QUOTE_MAX];
  for (size_t i = 0; i < f->n; i++) {
    const struct st_tensor *t = &f->tensors[i];
    if (t->offset > pos && prev)
      return st__fail(c, CEDAR_EFORMAT, t->name,
                  "data begins at %" PRIu64 ", but tensor '%s' ends at %" PRIu64 ": bytes [%" PRIu64 ", %" PRIu64
                  ") belong to no tensor, and safetensors forbids holes",
                  t->offset, st__quote(q, prev->name, strlen(prev->name)), pos, pos, t->offset);
    if (t->offset > pos)
      return st__fail(c, CEDAR_EFORMAT, t->name,
                  "data begins at %" PRIu64 ": bytes [0, %" PRIu64
                  ") belong to no tensor, and safetensors forbids holes",
                  t->offset, t->offset);
    if (t->offset < pos)
      return st__fail(c, CEDAR_EFORMAT, t->name,
                  "data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor '%s' [%" PRIu64 ", %" PRIu64 "]", t->offset,
                  t->offset + t->nbytes, st__quote(q, prev->name, strlen(prev->name)), prev->offset,
                  prev->offset + prev->nbytes);
    if (t->nbytes) prev = t, pos = t->offset + t->nbytes;
  }
  if (pos != data_len)
    return st__fail(c, CEDAR_EFORMAT, NULL,
                "the data buffer is %" PRIu64 " bytes but its tensors end at %" PRIu64 ": bytes [%" PRIu64 ", %" PRIu64
                ") belong to no tensor, and safetensors forbids holes",
                data_len, pos, pos, data_len);
  return CEDAR_OK;
}

/* ---- parse ---------------------------------------------------------------- */

static uint64_t le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* The JSON text of the header -> f's tensors and metadata (entry checks). */
static int parse_json(const struct st__ctx *c, const char *h, size_t n, uint64_t data_len, struct st_file *f) {
  struct lex_finding bad = {0};
  int rc = lex_check(c, h, n, &bad);
  if (rc) return rc;
  /* A NUL-terminated copy: cJSON then cannot read past the header. */
  char *text = malloc(n + 1);
  if (!text) return st__fail(c, CEDAR_ENOMEM, NULL, "out of memory copying the %zu-byte header", n);
  memcpy(text, h, n);
  text[n] = '\0';
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, n, &end, 0);
  if (!root) {
    rc = st__fail(c, CEDAR_EFORMAT, NULL, "header is not valid JSON (error near header byte %zu)",
              end ? (size_t)(end - text) : (size_t)0);
  } else {
    for (const char *p = end; p < text + n && !rc; p++)
      if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
        rc = st__fail(c, CEDAR_EFORMAT, NULL,
                  "header has bytes after its JSON object (at header byte %zu); only spaces may pad it",
                  (size_t)(p - text));
    if (!rc) rc = parse_members(c, root, data_len, f);
  }
  cJSON_Delete(root);
  free(text);
  if (!rc && bad.found) {
    char num[ST__QUOTE_MAX];
    rc = st__fail(c, CEDAR_EFORMAT, *bad.key ? bad.key : NULL,
              "number '%s' at header byte %zu is not written as a plain integer (no fraction, exponent, "
              "'+' or leading zero)",
              st__quote(num, h + bad.at, bad.len), bad.at);
  }
  return rc;
}

static int parse_into(const struct st__ctx *c, const unsigned char *p, size_t len, struct st_file *f) {
  if (len < 8)
    return st__fail(c, CEDAR_EFORMAT, NULL, "file is %zu bytes, shorter than the 8-byte header length it must start with",
                len);
  uint64_t n = le64(p);
  if (n > ST_MAX_HEADER)
    return st__fail(c, CEDAR_EFORMAT, NULL, "header length %" PRIu64 " is over the %u-byte limit; not a safetensors file?", n,
                ST_MAX_HEADER);
  if (n > len - 8)
    return st__fail(c, CEDAR_EFORMAT, NULL,
                "header length %" PRIu64 " is larger than the %zu bytes after it; the file is truncated or not "
                "safetensors",
                n, len - 8);
  const char *h = (const char *)p + 8;
  if (n == 0 || h[0] != '{') return st__fail(c, CEDAR_EFORMAT, NULL, "header does not start with '{'");
  size_t bad = st__utf8_check((const unsigned char *)h, n);
  if (bad != n) return st__fail(c, CEDAR_EFORMAT, NULL, "header is not valid UTF-8 (at header byte %zu)", bad);
  uint64_t data_len = len - 8 - n;
  int rc = parse_json(c, h, n, data_len, f);
  if (rc) return rc;
  qsort(f->tensors, f->n, sizeof *f->tensors, cmp_offset);
  if ((rc = index_names(c, f)) || (rc = check_layout(c, f, data_len))) return rc;
  for (size_t i = 0; i < f->n; i++) f->tensors[i].data = p + 8 + n + f->tensors[i].offset;
  return CEDAR_OK;
}

int st_parse(const char *label, const void *buf, size_t len, st_file_t **out, char *err, size_t err_len) {
  struct st__ctx c = {label ? label : "<buffer>", err, err_len};
  if (err && err_len) err[0] = '\0';
  *out = NULL;
  if (!buf && len) return st__fail(&c, CEDAR_EINVAL, NULL, "no buffer given");
  struct st_file *f = calloc(1, sizeof *f);
  if (!f) return st__fail(&c, CEDAR_ENOMEM, NULL, "out of memory");
  int rc = parse_into(&c, buf ? buf : "", len, f);
  if (rc) {
    st_close(f);
    return rc;
  }
  *out = f;
  return CEDAR_OK;
}

/* read() into a buffer, for files mmap refuses. */
static int read_whole(const struct st__ctx *c, int fd, size_t len, void **out) {
  unsigned char *buf = malloc(len);
  if (!buf) return st__fail(c, CEDAR_ENOMEM, NULL, "out of memory reading %zu bytes", len);
  for (size_t got = 0; got < len;) {
    ssize_t k = pread(fd, buf + got, len - got < (1u << 30) ? len - got : (1u << 30), (off_t)got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = k < 0 ? errno : 0;
      free(buf);
      return st__fail(c, CEDAR_EIO, NULL, "read failed at byte %zu: %s", got, e ? strerror(e) : "file shrank");
    }
    got += (size_t)k;
  }
  *out = buf;
  return CEDAR_OK;
}

int st_open(const char *path, st_file_t **out, char *err, size_t err_len) {
  struct st__ctx c = {path, err, err_len};
  if (err && err_len) err[0] = '\0';
  *out = NULL;
  char why[1024]; /* base/file.h: a FIFO, a device or a directory is refused without blocking */
  int fd = cedar_open_in(path, CEDAR_NO_CAP, NULL, why, sizeof why);
  if (fd < 0) return st__fail(&c, CEDAR_EIO, NULL, "%s", cedar_file_why(why, path));
  struct stat sb;
  int rc = CEDAR_OK;
  if (fstat(fd, &sb)) rc = st__fail(&c, CEDAR_EIO, NULL, "cannot stat: %s", strerror(errno));
  else if (!S_ISREG(sb.st_mode)) rc = st__fail(&c, CEDAR_EIO, NULL, "not a regular file");
  else if ((uintmax_t)sb.st_size > SIZE_MAX) rc = st__fail(&c, CEDAR_EIO, NULL, "file too large to map");
  size_t len = rc ? 0 : (size_t)sb.st_size;
  void *map = NULL, *owned = NULL;
  if (!rc && len) {
    map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      map = NULL;
      rc = read_whole(&c, fd, len, &owned);
    } else {
      rt_map_guard_add(map, len, path); /* truncated under us: SIGBUS names the file (map_guard.h) */
    }
  }
  close(fd);
  if (!rc) rc = st_parse(path, map ? map : owned, len, out, err, err_len);
  if (rc) {
    if (map) rt_map_guard_remove(map), munmap(map, len);
    free(owned);
    return rc;
  }
  (*out)->map = map, (*out)->map_len = len, (*out)->owned = owned;
  (*out)->id[0] = (uint64_t)sb.st_dev, (*out)->id[1] = (uint64_t)sb.st_ino, (*out)->id[2] = (uint64_t)sb.st_size;
  (*out)->id[3] = (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec;
  return CEDAR_OK;
}

void st_file_id(const st_file_t *f, uint64_t id[4]) { memcpy(id, f->id, sizeof f->id); }

void st_close(st_file_t *f) {
  if (!f) return;
  for (size_t i = 0; i < f->n; i++) free((char *)f->tensors[i].name);
  for (size_t i = 0; i < f->n_meta; i++) {
    free((char *)f->meta[i].key);
    free((char *)f->meta[i].value);
  }
  free(f->tensors);
  free(f->by_name);
  free(f->meta);
  if (f->map) rt_map_guard_remove(f->map), munmap(f->map, f->map_len);
  free(f->owned);
  free(f);
}

size_t st_count(const st_file_t *f) { return f->n; }

const struct st_tensor *st_tensor_at(const st_file_t *f, size_t i) { return i < f->n ? &f->tensors[i] : NULL; }

static int cmp_key_name(const void *key, const void *elem) {
  return strcmp(key, (*(const struct st_tensor *const *)elem)->name);
}

const struct st_tensor *st_find(const st_file_t *f, const char *name) {
  if (!name || !f->n) return NULL;
  const struct st_tensor *const *hit = bsearch(name, f->by_name, f->n, sizeof *f->by_name, cmp_key_name);
  return hit ? *hit : NULL;
}

size_t st_meta_count(const st_file_t *f) { return f->n_meta; }

const struct st_meta *st_meta_at(const st_file_t *f, size_t i) { return i < f->n_meta ? &f->meta[i] : NULL; }

static int cmp_key_meta(const void *key, const void *elem) { return strcmp(key, ((const struct st_meta *)elem)->key); }

const char *st_meta_get(const st_file_t *f, const char *key) {
  if (!key || !f->n_meta) return NULL;
  const struct st_meta *hit = bsearch(key, f->meta, f->n_meta, sizeof *f->meta, cmp_key_meta);
  return hit ? hit->value : NULL;
}

