/* safetensors_write.c: the safetensors writer (see safetensors.h and
 * docs/safetensors.md): the official layout (tensors sorted by dtype size,
 * then name; compact JSON; header padded with spaces to a multiple of 8), built
 * in memory and written to a temporary file that is fsynced and renamed over
 * the target, so a crash never leaves a half file under the final name.
 * Test: tests/test_safetensors.c.
 */
#include "runtime/load/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "base/file.h"
#include "runtime/load/safetensors_internal.h"

/* A growing byte string; oom latches the first failed allocation. */
struct sbuf {
  char *p;
  size_t len, cap;
  bool oom;
};

static void sb_put(struct sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (n > b->cap - b->len) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n) {
      if (cap > SIZE_MAX / 2) {
        b->oom = true;
        return;
      }
      cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static void sb_puts(struct sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(struct sbuf *b, uint64_t v) {
  char t[24];
  sb_put(b, t, (size_t)snprintf(t, sizeof t, "%" PRIu64, v));
}

/* A JSON string as serde_json (the official writer) escapes it: '"', '\' and
 * control bytes; UTF-8 passes as is. */
static void sb_json_str(struct sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    const char *esc = ch == '"'    ? "\\\""
                      : ch == '\\' ? "\\\\"
                      : ch == '\n' ? "\\n"
                      : ch == '\r' ? "\\r"
                      : ch == '\t' ? "\\t"
                      : ch == '\b' ? "\\b"
                      : ch == '\f' ? "\\f"
                                   : NULL;
    char u[8];
    if (!esc && ch < 0x20) snprintf(u, sizeof u, "\\u%04x", ch), esc = u;
    if (esc) sb_puts(b, esc);
    else sb_put(b, s, 1);
  }
  sb_put(b, "\"", 1);
}

/* What goes to disk: the tensors in file order and the padded header. */
struct layout {
  const struct st_tensor **order;
  struct sbuf hdr;
  uint64_t data_len;
};

static void layout_free(struct layout *l) {
  free(l->order);
  free(l->hdr.p);
}

static bool is_utf8(const char *s) { return st__utf8_check((const unsigned char *)s, strlen(s)) == strlen(s); }

static int check_tensor_input(const struct st__ctx *c, const struct st_tensor *t) {
  if (!t->name) return st__fail(c, CEDAR_EINVAL, NULL, "a tensor has no name");
  if (!is_utf8(t->name)) return st__fail(c, CEDAR_EINVAL, t->name, "name is not valid UTF-8");
  if (!strcmp(t->name, "__metadata__")) return st__fail(c, CEDAR_EINVAL, t->name, "the name is reserved for metadata");
  if ((unsigned)t->dtype >= ST_DTYPE_COUNT) return st__fail(c, CEDAR_EINVAL, t->name, "dtype %d is not an st_dtype", (int)t->dtype);
  if (t->ndim < 0 || t->ndim > ST_MAX_DIMS)
    return st__fail(c, CEDAR_EINVAL, t->name, "ndim %d is outside 0..%d", t->ndim, ST_MAX_DIMS);
  uint64_t count = 1, size = st_dtype_size(t->dtype);
  for (int i = 0; i < t->ndim; i++) {
    uint64_t d = (uint64_t)t->shape[i];
    if (t->shape[i] < 0 || d >= ST_MAX_INT)
      return st__fail(c, CEDAR_EINVAL, t->name, "shape[%d] = %" PRId64 " is outside [0, 2^53)", i, t->shape[i]);
    if (d && count > UINT64_MAX / d) return st__fail(c, CEDAR_EINVAL, t->name, "shape has 2^64 elements or more");
    count *= d;
  }
  if (count > UINT64_MAX / size) return st__fail(c, CEDAR_EINVAL, t->name, "tensor is 2^64 bytes or more");
  if (count * size != t->nbytes) {
    char s[160];
    st__fmt_shape(s, sizeof s, t);
    return st__fail(c, CEDAR_EINVAL, t->name, "nbytes is %" PRIu64 ", but %s shape %s needs %" PRIu64, t->nbytes,
                st_dtype_name(t->dtype), s, count * size);
  }
  if (t->nbytes && !t->data) return st__fail(c, CEDAR_EINVAL, t->name, "data is NULL");
  return CEDAR_OK;
}

/* Largest element first, then by name: the official writer's order, which
 * keeps every tensor aligned to its element size. */
static int cmp_write_order(const void *a, const void *b) {
  const struct st_tensor *x = *(const struct st_tensor *const *)a, *y = *(const struct st_tensor *const *)b;
  if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int cmp_meta_ptr(const void *a, const void *b) {
  return strcmp((*(const struct st_meta *const *)a)->key, (*(const struct st_meta *const *)b)->key);
}

/* The metadata object, keys sorted (deterministic output). */
static int put_meta(const struct st__ctx *c, const struct st_meta *meta, size_t n_meta, struct sbuf *h) {
  const struct st_meta **mo = malloc((n_meta + 1) * sizeof *mo);
  if (!mo) return st__fail(c, CEDAR_ENOMEM, NULL, "out of memory");
  int rc = CEDAR_OK;
  for (size_t i = 0; i < n_meta && !rc; i++) {
    mo[i] = &meta[i];
    if (!meta[i].key || !meta[i].value) rc = st__fail(c, CEDAR_EINVAL, NULL, "metadata entry %zu has a NULL key or value", i);
    else if (!is_utf8(meta[i].key) || !is_utf8(meta[i].value))
      rc = st__fail(c, CEDAR_EINVAL, NULL, "metadata entry %zu is not valid UTF-8", i);
  }
  if (!rc) qsort(mo, n_meta, sizeof *mo, cmp_meta_ptr);
  for (size_t i = 1; i < n_meta && !rc; i++)
    if (!strcmp(mo[i - 1]->key, mo[i]->key)) {
      char q[ST__QUOTE_MAX];
      rc = st__fail(c, CEDAR_EINVAL, NULL, "metadata key '%s' given twice", st__quote(q, mo[i]->key, strlen(mo[i]->key)));
    }
  if (!rc) {
    sb_puts(h, "\"__metadata__\":{");
    for (size_t i = 0; i < n_meta; i++) {
      if (i) sb_puts(h, ",");
      sb_json_str(h, mo[i]->key);
      sb_puts(h, ":");
      sb_json_str(h, mo[i]->value);
    }
    sb_puts(h, "}");
  }
  free(mo);
  return rc;
}

static int layout_build(const struct st__ctx *c, const struct st_tensor *ts, size_t n, const struct st_meta *meta,
                        size_t n_meta, struct layout *l) {
  memset(l, 0, sizeof *l);
  if ((n && !ts) || (n_meta && !meta)) return st__fail(c, CEDAR_EINVAL, NULL, "the tensor or metadata list is NULL");
  for (size_t i = 0; i < n; i++) {
    int rc = check_tensor_input(c, &ts[i]);
    if (rc) return rc;
  }
  if (!(l->order = malloc((n + 1) * sizeof *l->order))) return st__fail(c, CEDAR_ENOMEM, NULL, "out of memory");
  for (size_t i = 0; i < n; i++) l->order[i] = &ts[i];
  qsort(l->order, n, sizeof *l->order, cmp_write_order);
  for (size_t i = 1; i < n; i++)
    if (!strcmp(l->order[i - 1]->name, l->order[i]->name))
      return st__fail(c, CEDAR_EINVAL, l->order[i]->name, "given twice; names must be unique");
  struct sbuf *h = &l->hdr;
  sb_puts(h, "{");
  if (n_meta) {
    int rc = put_meta(c, meta, n_meta, h);
    if (rc) return rc;
  }
  for (size_t i = 0; i < n; i++) {
    const struct st_tensor *t = l->order[i];
    if (t->nbytes > ST_MAX_INT - 1 - l->data_len)
      return st__fail(c, CEDAR_EINVAL, t->name, "the data buffer would reach 2^53 bytes");
    if (i || n_meta) sb_puts(h, ",");
    sb_json_str(h, t->name);
    sb_puts(h, ":{\"dtype\":");
    sb_json_str(h, st_dtype_name(t->dtype));
    sb_puts(h, ",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      if (d) sb_puts(h, ",");
      sb_u64(h, (uint64_t)t->shape[d]);
    }
    sb_puts(h, "],\"data_offsets\":[");
    sb_u64(h, l->data_len);
    sb_puts(h, ",");
    sb_u64(h, l->data_len += t->nbytes);
    sb_puts(h, "]}");
  }
  sb_puts(h, "}");
  while (h->len % 8) sb_puts(h, " "); /* the official padding: data starts 8-aligned */
  if (h->oom) return st__fail(c, CEDAR_ENOMEM, NULL, "out of memory building the header");
  if (h->len > ST_MAX_HEADER)
    return st__fail(c, CEDAR_EINVAL, NULL, "the header would be %zu bytes, over the %u-byte limit", h->len, ST_MAX_HEADER);
  return CEDAR_OK;
}

static void put_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

int st_serialize(const struct st_tensor *tensors, size_t n, const struct st_meta *meta, size_t n_meta, void **out,
                 size_t *out_len, char *err, size_t err_len) {
  struct st__ctx c = {"<memory>", err, err_len};
  if (err && err_len) err[0] = '\0';
  *out = NULL, *out_len = 0;
  struct layout l;
  int rc = layout_build(&c, tensors, n, meta, n_meta, &l);
  unsigned char *buf = NULL;
  if (!rc && l.data_len > SIZE_MAX - 8 - l.hdr.len) rc = st__fail(&c, CEDAR_ENOMEM, NULL, "file too large for memory");
  if (!rc && !(buf = malloc(8 + l.hdr.len + (size_t)l.data_len)))
    rc = st__fail(&c, CEDAR_ENOMEM, NULL, "out of memory for %" PRIu64 " bytes", 8 + l.hdr.len + l.data_len);
  if (!rc) {
    put_le64(buf, l.hdr.len);
    memcpy(buf + 8, l.hdr.p, l.hdr.len);
    size_t pos = 8 + l.hdr.len;
    for (size_t i = 0; i < n; i++) {
      if (l.order[i]->nbytes) memcpy(buf + pos, l.order[i]->data, (size_t)l.order[i]->nbytes);
      pos += (size_t)l.order[i]->nbytes;
    }
    *out = buf, *out_len = pos;
  }
  layout_free(&l);
  return rc;
}

int st_write(const char *path, const struct st_tensor *tensors, size_t n, const struct st_meta *meta, size_t n_meta,
             char *err, size_t err_len) {
  struct st__ctx c = {path ? path : "<null path>", err, err_len};
  if (err && err_len) err[0] = '\0';
  if (!path || !*path) return st__fail(&c, CEDAR_EINVAL, NULL, "no path given");
  struct layout l;
  int rc = layout_build(&c, tensors, n, meta, n_meta, &l);
  if (rc) {
    layout_free(&l); /* a refused layout may hold part of its header */
    return rc;
  }
  /* base/file.h's writer: a temporary beside path, every write, fsync and
   * close checked, renamed only when whole; removed on failure (ENOSPC,
   * EFBIG under `ulimit -f`, a path that is a device or a directory). */
  struct cedar_out o;
  char why[1024];
  if (cedar_out_open(&o, path, why, sizeof why)) {
    layout_free(&l);
    return st__fail(&c, CEDAR_EIO, NULL, "%s", cedar_file_why(why, path));
  }
  unsigned char len8[8];
  put_le64(len8, l.hdr.len);
  cedar_out_write(&o, len8, 8);
  cedar_out_write(&o, l.hdr.p, l.hdr.len);
  for (size_t i = 0; i < n && !o.err_no; i++) cedar_out_write(&o, l.order[i]->data, l.order[i]->nbytes);
  if (cedar_out_commit(&o, why, sizeof why)) rc = st__fail(&c, CEDAR_EIO, NULL, "%s", cedar_file_why(why, path));
  layout_free(&l);
  return rc;
}
