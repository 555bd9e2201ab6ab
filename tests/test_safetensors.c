/* test_safetensors.c: the safetensors reader and writer (runtime/load/safetensors.h).
 *
 *  - golden: the writer reproduces, byte for byte, the files the official
 *    implementation's own tests expect (safetensors/src/tensor.rs);
 *  - round trip through a real file: several dtypes, a 0-d scalar, empty
 *    tensors, metadata with escapes and UTF-8; bitwise equal data, aligned
 *    pointers, the documented order, no temporary file left behind, and a
 *    reader mapping the old file keeps the old bytes after an overwrite;
 *  - every rejection rule on a hand-made file, with the expected status and
 *    message (file, tensor, problem); edge cases the format allows;
 *  - every truncation of a small valid file, and byte flips, never crash;
 *  - the fuzz seeds (tests/fuzz/corpus_safetensors/, written by Python's json
 *    module, a writer independent of cedar's): ok_* load, bad_* do not.
 * Run from the repo root: ./build/tests/test_safetensors
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "runtime/load/safetensors.h"
#include "tests/harness.h"

#define LABEL "bad.safetensors"

static char err[1024];

/* le64(len(json)) + json + data_len bytes of a pattern. */
static unsigned char *mk(const char *json, size_t json_len, size_t data_len, size_t *len) {
  *len = 8 + json_len + data_len;
  unsigned char *b = malloc(*len + 1);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)json_len >> (8 * i));
  memcpy(b + 8, json, json_len);
  for (size_t i = 0; i < data_len; i++) b[8 + json_len + i] = (unsigned char)(i * 7 + 1);
  return b;
}

static int parse_json(const char *json, size_t data_len, st_file_t **f) {
  size_t len;
  unsigned char *b = mk(json, strlen(json), data_len, &len);
  int rc = st_parse(LABEL, b, len, f, err, sizeof err);
  if (rc == 0) {
    st_close(*f); /* the buffer is about to go */
    *f = NULL;
  }
  free(b);
  return rc;
}

/* ---- golden ------------------------------------------------------------- */

static void expect_bytes(const struct st_tensor *ts, size_t n, const struct st_meta *m, size_t nm, const char *hdr,
                         const float *data, size_t n_data, const char *what) {
  void *out = NULL;
  size_t len = 0;
  int rc = st_serialize(ts, n, m, nm, &out, &len, err, sizeof err);
  EXPECT(rc == 0, "%s: st_serialize: %s", what, err);
  size_t hl = strlen(hdr), want_len = 8 + hl + n_data * 4;
  unsigned char *want = malloc(want_len);
  for (int i = 0; i < 8; i++) want[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  memcpy(want + 8, hdr, hl);
  if (n_data) memcpy(want + 8 + hl, data, n_data * 4); /* little-endian host: x86-64, aarch64 */
  EXPECT(len == want_len && !memcmp(out, want, len), "%s: bytes differ from the official writer's (%zu vs %zu bytes)",
         what, len, want_len);
  st_file_t *f = NULL;
  EXPECT(st_parse(what, out, len, &f, err, sizeof err) == 0, "%s: re-parse: %s", what, err);
  st_close(f);
  free(want);
  free(out);
}

static void test_golden(void) {
  static const float v[6] = {0, 1, 2, 3, 4, 5};
  struct st_tensor t = {.name = "attn.0", .dtype = ST_F32, .ndim = 3, .shape = {1, 2, 3}, .nbytes = 24, .data = v};
  expect_bytes(&t, 1, NULL, 0, "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}", v, 6,
               "test_serialization");
  struct st_tensor t4 = {.name = "attn0", .dtype = ST_F32, .ndim = 4, .shape = {1, 1, 2, 3}, .nbytes = 24, .data = v};
  expect_bytes(&t4, 1, NULL, 0,
               "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ", v, 6,
               "test_serialization_forced_alignement");
  expect_bytes(NULL, 0, NULL, 0, "{}      ", NULL, 0, "test_empty");
  struct st_meta m = {"framework", "pt"};
  expect_bytes(NULL, 0, &m, 1, "{\"__metadata__\":{\"framework\":\"pt\"}}     ", NULL, 0, "test_empty metadata");
}

/* ---- round trip ----------------------------------------------------------- */

static char tmpdir[64];

/* A path in tmpdir; the buffer is reused by the next call. */
static char *path_in(const char *name) {
  static char p[128];
  snprintf(p, sizeof p, "%s/%s", tmpdir, name);
  return p;
}

static int dir_entries(void) {
  DIR *d = opendir(tmpdir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d) closedir(d);
  return n;
}

static unsigned char *read_file(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  *len = (size_t)ftell(fp);
  rewind(fp);
  unsigned char *b = malloc(*len + 1);
  if (fread(b, 1, *len, fp) != *len) *len = 0;
  fclose(fp);
  return b;
}

static void expect_same(const st_file_t *f, const struct st_tensor *ts, size_t n, const struct st_meta *m, size_t nm) {
  EXPECT(st_count(f) == n, "count %zu, want %zu", st_count(f), n);
  for (size_t i = 0; i < n; i++) {
    const struct st_tensor *g = st_find(f, ts[i].name);
    EXPECT(g != NULL, "tensor '%s' not found", ts[i].name);
    if (!g) continue;
    EXPECT(g->dtype == ts[i].dtype && g->ndim == ts[i].ndim && g->nbytes == ts[i].nbytes,
           "'%s': dtype/ndim/nbytes differ", ts[i].name);
    EXPECT(!memcmp(g->shape, ts[i].shape, sizeof(int64_t) * (size_t)ts[i].ndim), "'%s': shape differs", ts[i].name);
    EXPECT(!ts[i].nbytes || !memcmp(g->data, ts[i].data, ts[i].nbytes), "'%s': data differs", ts[i].name);
    EXPECT((uintptr_t)g->data % st_dtype_size(g->dtype) == 0, "'%s': data not aligned to %zu", ts[i].name,
           st_dtype_size(g->dtype));
  }
  /* The documented order: element size (dtype) descending, then name; contiguous. */
  uint64_t pos = 0;
  for (size_t i = 0; i < st_count(f); i++) {
    const struct st_tensor *a = st_tensor_at(f, i), *b = i ? st_tensor_at(f, i - 1) : NULL;
    EXPECT(a->offset == pos, "'%s' at %llu, want %llu", a->name, (unsigned long long)a->offset,
           (unsigned long long)pos);
    pos += a->nbytes;
    if (b) EXPECT(b->dtype > a->dtype || (b->dtype == a->dtype && strcmp(b->name, a->name) < 0), "order at %zu", i);
  }
  EXPECT(st_tensor_at(f, n) == NULL && st_find(f, "absent") == NULL, "lookups past the end");
  EXPECT(st_meta_count(f) == nm, "meta count %zu, want %zu", st_meta_count(f), nm);
  for (size_t i = 0; i < nm; i++) {
    const char *v = st_meta_get(f, m[i].key);
    EXPECT(v && !strcmp(v, m[i].value), "meta '%s' = '%s', want '%s'", m[i].key, v ? v : "(none)", m[i].value);
  }
  EXPECT(st_meta_get(f, "absent") == NULL, "absent meta key found");
}

static void test_round_trip(void) {
  float w[15], scalar = -0.0f;
  uint32_t bits[3] = {0x7FC00001u, 0xFF800000u, 0x00000001u}; /* a NaN payload, -Inf, a subnormal */
  uint64_t seed = 7;
  h_fill(w, 15, &seed, -3.0f, 3.0f);
  memcpy(w, bits, sizeof bits);
  int32_t ids[7] = {0, -1, 2147483647, -2147483647 - 1, 5, 6, 7};
  int64_t pos[6] = {0, 1, -1, INT64_MAX, INT64_MIN, 42};
  uint8_t mask[5] = {0, 1, 255, 3, 4}, e4m3[16], bf16[6] = {0x80, 0x3f, 0x00, 0xc0, 0x7f, 0x7f}, bools[3] = {1, 0, 1};
  double d[2] = {1.0 / 3.0, -2.5e300};
  for (int i = 0; i < 16; i++) e4m3[i] = (uint8_t)(i * 17); /* includes 0x7F-ish and 0xFF (NaN) patterns */
  struct st_tensor ts[] = {
      {.name = "w.f32", .dtype = ST_F32, .ndim = 2, .shape = {3, 5}, .nbytes = 60, .data = w},
      {.name = "ids", .dtype = ST_I32, .ndim = 1, .shape = {7}, .nbytes = 28, .data = ids},
      {.name = "pos", .dtype = ST_I64, .ndim = 2, .shape = {2, 3}, .nbytes = 48, .data = pos},
      {.name = "mask", .dtype = ST_U8, .ndim = 1, .shape = {5}, .nbytes = 5, .data = mask},
      {.name = "kv.e4m3", .dtype = ST_F8_E4M3, .ndim = 2, .shape = {4, 4}, .nbytes = 16, .data = e4m3},
      {.name = "bf", .dtype = ST_BF16, .ndim = 1, .shape = {3}, .nbytes = 6, .data = bf16},
      {.name = "scalar", .dtype = ST_F32, .ndim = 0, .nbytes = 4, .data = &scalar},
      {.name = "empty", .dtype = ST_F32, .ndim = 1, .shape = {0}, .nbytes = 0, .data = NULL},
      {.name = "empty3", .dtype = ST_I64, .ndim = 3, .shape = {3, 0, 2}, .nbytes = 0, .data = NULL},
      {.name = "d", .dtype = ST_F64, .ndim = 1, .shape = {2}, .nbytes = 16, .data = d},
      {.name = "b", .dtype = ST_BOOL, .ndim = 1, .shape = {3}, .nbytes = 3, .data = bools},
      {.name = "h\xc3\xa9 \"q\"\\/\x01", .dtype = ST_U8, .ndim = 1, .shape = {1}, .nbytes = 1, .data = mask},
  };
  size_t n = sizeof ts / sizeof ts[0];
  struct st_meta meta[] = {{"format", "pt"},
                           {"cedar.plan", "v41-mini"},
                           {"quote", "a\"b\\c\n\t\x01/"},
                           {"unicode", "h\xc3\xa9llo \xe2\x9c\x93"},
                           {"empty", ""}};
  size_t nm = sizeof meta / sizeof meta[0];

  char path[128];
  snprintf(path, sizeof path, "%s", path_in("rt.safetensors"));
  EXPECT(st_write(path, ts, n, meta, nm, err, sizeof err) == 0, "st_write: %s", err);
  EXPECT(dir_entries() == 1, "st_write left %d entries in %s (a temporary file?)", dir_entries(), tmpdir);
  st_file_t *f = NULL;
  EXPECT(st_open(path, &f, err, sizeof err) == 0, "st_open: %s", err);
  if (f) expect_same(f, ts, n, meta, nm);

  /* The file equals st_serialize's bytes; its header length is a multiple of 8. */
  size_t flen = 0, mlen = 0;
  unsigned char *fb = read_file(path, &flen);
  void *mb = NULL;
  EXPECT(st_serialize(ts, n, meta, nm, &mb, &mlen, err, sizeof err) == 0, "st_serialize: %s", err);
  EXPECT(fb && flen == mlen && !memcmp(fb, mb, flen), "st_write and st_serialize disagree");
  EXPECT(fb && flen >= 8 && fb[0] % 8 == 0, "header length not a multiple of 8");
  free(fb);
  free(mb);

  /* Overwrite: the open handle keeps the old bytes (rename, never truncate). */
  float w2[15];
  for (int i = 0; i < 15; i++) w2[i] = (float)i;
  struct st_tensor t2 = {.name = "w.f32", .dtype = ST_F32, .ndim = 2, .shape = {3, 5}, .nbytes = 60, .data = w2};
  EXPECT(st_write(path, &t2, 1, NULL, 0, err, sizeof err) == 0, "overwrite: %s", err);
  if (f) {
    const struct st_tensor *old = st_find(f, "w.f32");
    EXPECT(old && !memcmp(old->data, w, 60), "an open handle changed under an overwrite");
  }
  st_file_t *g = NULL;
  EXPECT(st_open(path, &g, err, sizeof err) == 0, "reopen: %s", err);
  if (g) expect_same(g, &t2, 1, NULL, 0);
  st_close(g);
  st_close(f);

  /* A failed write leaves the old file alone and nothing else behind. */
  struct st_tensor bad = t2;
  bad.nbytes = 59;
  EXPECT(st_write(path, &bad, 1, NULL, 0, err, sizeof err) == CEDAR_EINVAL, "short nbytes accepted");
  EXPECT(st_open(path, &g, err, sizeof err) == 0, "old file damaged: %s", err);
  st_close(g);
  EXPECT(dir_entries() == 1, "a failed write left files behind");
  EXPECT(st_write(path_in("no/such/dir/x.safetensors"), &t2, 1, NULL, 0, err, sizeof err) == CEDAR_EIO &&
             strstr(err, "no/such/dir/x.safetensors") && strstr(err, "cannot create temporary file"),
         "write into a missing directory: %s", err);
  unlink(path);
}

static void expect_write_rejects(const struct st_tensor *ts, size_t n, const struct st_meta *m, size_t nm,
                                 const char *substr) {
  const char *path = path_in("reject.safetensors");
  int rc = st_write(path, ts, n, m, nm, err, sizeof err);
  EXPECT(rc == CEDAR_EINVAL && strstr(err, substr) && strstr(err, path),
         "writer: want EINVAL with '%s', got %d: %s", substr, rc, err);
  EXPECT(dir_entries() == 0, "a rejected write left files behind");
}

static void test_writer_rejects(void) {
  uint8_t b[8] = {0};
  struct st_tensor a = {.name = "a", .dtype = ST_U8, .ndim = 1, .shape = {4}, .nbytes = 4, .data = b};
  struct st_tensor two[2] = {a, a};
  expect_write_rejects(two, 2, NULL, 0, "given twice");
  struct st_tensor t = a;
  t.name = "__metadata__";
  expect_write_rejects(&t, 1, NULL, 0, "reserved");
  t = a, t.nbytes = 3;
  expect_write_rejects(&t, 1, NULL, 0, "needs 4");
  t = a, t.ndim = ST_MAX_DIMS + 1;
  expect_write_rejects(&t, 1, NULL, 0, "ndim 9");
  t = a, t.shape[0] = -4;
  expect_write_rejects(&t, 1, NULL, 0, "outside [0, 2^53)");
  t = a, t.data = NULL;
  expect_write_rejects(&t, 1, NULL, 0, "data is NULL");
  t = a, t.name = "bad\xff";
  expect_write_rejects(&t, 1, NULL, 0, "not valid UTF-8");
  t = a, t.name = NULL;
  expect_write_rejects(&t, 1, NULL, 0, "no name");
  t = a, t.dtype = ST_DTYPE_COUNT;
  expect_write_rejects(&t, 1, NULL, 0, "not an st_dtype");
  struct st_meta m2[2] = {{"k", "1"}, {"k", "2"}};
  expect_write_rejects(&a, 1, m2, 2, "given twice");
  struct st_meta m1 = {"k", NULL};
  expect_write_rejects(&a, 1, &m1, 1, "NULL key or value");
}

/* ---- rejections ------------------------------------------------------------- */

#define U8_4(off) "{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":" off "}"

struct bad_case {
  const char *json;
  size_t data_len;
  int status;
  const char *expect; /* substring of the message */
  const char *tensor; /* the message names this tensor; NULL: no tensor */
};

static const struct bad_case bad_cases[] = {
    /* framing and JSON */
    {" {}", 0, CEDAR_EFORMAT, "does not start with '{'", NULL},
    {"[]", 0, CEDAR_EFORMAT, "does not start with '{'", NULL},
    {"{\"a\":", 0, CEDAR_EFORMAT, "not valid JSON", NULL},
    {"{\"a\":{},}", 0, CEDAR_EFORMAT, "not valid JSON", NULL},
    {"{} x", 0, CEDAR_EFORMAT, "bytes after its JSON object", NULL},
    {"{}{}", 0, CEDAR_EFORMAT, "bytes after its JSON object", NULL},
    {"{}\x01", 0, CEDAR_EFORMAT, "control byte 0x01", NULL},
    {"{\"a\xff\":{}}", 0, CEDAR_EFORMAT, "not valid UTF-8 (at header byte 3)", NULL},
    {"{\"\xc0\xaf\":{}}", 0, CEDAR_EFORMAT, "not valid UTF-8", NULL},     /* overlong '/' */
    {"{\"\xed\xa0\x80\":{}}", 0, CEDAR_EFORMAT, "not valid UTF-8", NULL}, /* a surrogate */
    {"{\"\xf4\x90\x80\x80\":{}}", 0, CEDAR_EFORMAT, "not valid UTF-8", NULL}, /* past U+10FFFF */
    {"{\"a\xe2\x9c\":{}}", 0, CEDAR_EFORMAT, "not valid UTF-8", NULL},       /* cut short */
    {"{\"a\nb\":" U8_4("[0,4]") "}", 4, CEDAR_EFORMAT, "raw control byte 0x0a inside a string", NULL},
    {"{\"a\\u0000b\":" U8_4("[0,4]") "}", 4, CEDAR_EFORMAT, "\\u0000", NULL},
    {"{\"a\":" U8_4("[0,4]") ",\"b\tc\":" U8_4("[4,8]") "}", 8, CEDAR_EFORMAT, "raw control byte 0x09", NULL},
    {"{\"a\":{\"dtype\":\"U8\n\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, CEDAR_EFORMAT, "raw control byte 0x0a",
     "a"},
    {"{\"a\\ud800\":" U8_4("[0,4]") "}", 4, CEDAR_EFORMAT, "not valid JSON", NULL}, /* lone surrogate escape */
    /* duplicates */
    {"{\"a\":" U8_4("[0,4]") ",\"a\":" U8_4("[4,8]") "}", 8, CEDAR_EFORMAT, "appears twice", "a"},
    {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, CEDAR_EFORMAT, "__metadata__ appears twice", NULL},
    {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, CEDAR_EFORMAT, "key 'k' appears twice", NULL},
    {"{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, CEDAR_EFORMAT,
     "key 'dtype' appears twice", "a"},
    /* entries */
    {"{\"a\":[1]}", 0, CEDAR_EFORMAT, "entry is an array", "a"},
    {"{\"a\":{\"shape\":[4],\"data_offsets\":[0,4]}}", 4, CEDAR_EFORMAT, "no 'dtype'", "a"},
    {"{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,4]}}", 4, CEDAR_EFORMAT, "no 'shape'", "a"},
    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4]}}", 4, CEDAR_EFORMAT, "no 'data_offsets'", "a"},
    {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"offsets\":[0,4]}}", 4, CEDAR_EFORMAT, "unknown key 'offsets'", "a"},
    {"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CEDAR_EFORMAT, "unknown dtype 'F33'", "a"},
    {"{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CEDAR_EFORMAT, "unknown dtype 'f32'", "a"},
    {"{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1, CEDAR_EUNSUPPORTED, "below one byte", "a"},
    {"{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CEDAR_EFORMAT, "dtype is a number", "a"},
    /* shapes */
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[-3],\"data_offsets\":[0,0]}}", 0, CEDAR_EFORMAT, "shape[0] is -3", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0, CEDAR_EFORMAT, "shape[0] is -0", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,2]}}", 2, CEDAR_EFORMAT, "2.5, not an integer",
     "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]}}", 2, CEDAR_EFORMAT,
     "number '2.0' at header byte 28 is not written as a plain integer", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[2e0],\"data_offsets\":[0,2]}}", 2, CEDAR_EFORMAT, "plain integer", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[02],\"data_offsets\":[0,2]}}", 2, CEDAR_EFORMAT, "plain integer", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2, CEDAR_EFORMAT, "shape[0] is a string",
     "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":2,\"data_offsets\":[0,2]}}", 2, CEDAR_EFORMAT, "shape is a number", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, CEDAR_EUNSUPPORTED,
     "9 dimensions", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[9007199254740992],\"data_offsets\":[0,1]}}", 1, CEDAR_EFORMAT,
     "not below 2^53", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,1]}}", 1, CEDAR_EFORMAT,
     "2^64 elements", "w"},
    {"{\"w\":{\"dtype\":\"F64\",\"shape\":[4294967296,1073741824],\"data_offsets\":[0,1]}}", 1, CEDAR_EFORMAT,
     "2^64 bytes", "w"},
    /* offsets */
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, CEDAR_EFORMAT,
     "[0, 4] hold 4 bytes, but F32 shape [2] needs 8", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,0]}}", 4, CEDAR_EFORMAT, "end before they begin", "w"},
    {"{\"w\":" U8_4("[0,8]") "}", 4, CEDAR_EFORMAT, "reach past the end of the 4-byte data buffer", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[5,5]}}", 0, CEDAR_EFORMAT, "reach past the end", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0]}}", 4, CEDAR_EFORMAT, "two integers", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4,8]}}", 4, CEDAR_EFORMAT, "two integers", "w"},
    {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[\"0\",4]}}", 4, CEDAR_EFORMAT,
     "data_offsets[0] is a string", "w"},
    /* layout: overlap, holes, trailing bytes */
    {"{\"a\":" U8_4("[0,4]") ",\"b\":" U8_4("[2,6]") "}", 6, CEDAR_EFORMAT, "overlap tensor 'a' [0, 4]", "b"},
    {"{\"b\":" U8_4("[0,4]") ",\"a\":" U8_4("[0,4]") "}", 4, CEDAR_EFORMAT, "overlap tensor 'a'", "b"},
    {"{\"a\":" U8_4("[0,4]") ",\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}", 4, CEDAR_EFORMAT,
     "overlap tensor 'a'", "e"},
    {"{\"a\":" U8_4("[0,4]") ",\"b\":" U8_4("[6,10]") "}", 10, CEDAR_EFORMAT,
     "tensor 'a' ends at 4: bytes [4, 6) belong to no tensor", "b"},
    {"{\"a\":" U8_4("[2,6]") "}", 6, CEDAR_EFORMAT, "bytes [0, 2) belong to no tensor", "a"},
    {"{\"a\":" U8_4("[0,4]") "}", 6, CEDAR_EFORMAT, "bytes [4, 6) belong to no tensor", NULL},
    {"{}", 3, CEDAR_EFORMAT, "bytes [0, 3) belong to no tensor", NULL},
    /* metadata */
    {"{\"__metadata__\":{\"k\":1}}", 0, CEDAR_EFORMAT, "key 'k' has a number value", NULL},
    {"{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, CEDAR_EFORMAT, "key 'k' has an object value", NULL},
    {"{\"__metadata__\":{\"k\":null}}", 0, CEDAR_EFORMAT, "key 'k' has null value", NULL},
    {"{\"__metadata__\":\"x\"}", 0, CEDAR_EFORMAT, "__metadata__ is a string", NULL},
    {"{\"__metadata__\":[]}", 0, CEDAR_EFORMAT, "__metadata__ is an array", NULL},
};

static void test_rejects(void) {
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    const struct bad_case *c = &bad_cases[i];
    st_file_t *f = (st_file_t *)&f; /* must come back NULL */
    int rc = parse_json(c->json, c->data_len, &f);
    char tensor[96] = "";
    if (c->tensor) snprintf(tensor, sizeof tensor, "tensor '%s': ", c->tensor);
    EXPECT(rc == c->status && f == NULL, "case %zu (%s): status %d (%s), want %d", i, c->json, rc,
           cedar_status_str(rc), c->status);
    EXPECT(!strncmp(err, LABEL ": ", strlen(LABEL) + 2), "case %zu: message does not start with the file: %s", i, err);
    EXPECT(strstr(err, c->expect), "case %zu (%s): message lacks '%s': %s", i, c->json, c->expect, err);
    EXPECT(c->tensor ? strstr(err, tensor) != NULL : strstr(err, "tensor '") == NULL,
           "case %zu: message should name %s: %s", i, c->tensor ? tensor : "no tensor", err);
  }
}

/* Framing errors that need raw bytes. */
static void expect_raw(const unsigned char *b, size_t len, const char *substr) {
  unsigned char *copy = malloc(len ? len : 1); /* exact size: ASan sees any over-read */
  memcpy(copy, b, len);
  st_file_t *f = NULL;
  int rc = st_parse(LABEL, copy, len, &f, err, sizeof err);
  EXPECT(rc == CEDAR_EFORMAT && f == NULL && strstr(err, substr) && strstr(err, LABEL),
         "raw %zu bytes: want '%s', got %d: %s", len, substr, rc, err);
  st_close(f);
  free(copy);
}

static void test_rejects_raw(void) {
  unsigned char b[64] = {0};
  expect_raw(b, 0, "file is 0 bytes, shorter than the 8-byte header length");
  expect_raw(b, 7, "file is 7 bytes");
  b[7] = 0x80; /* 2^63 */
  expect_raw(b, 16, "header length 9223372036854775808 is over the 100000000-byte limit");
  memset(b, 0, 8);
  b[0] = 0x01, b[1] = 0xE1, b[2] = 0xF5, b[3] = 0x05; /* 100000001 */
  expect_raw(b, 16, "over the 100000000-byte limit");
  memset(b, 0, 8);
  b[0] = 100;
  memcpy(b + 8, "{}", 2);
  expect_raw(b, 18, "header length 100 is larger than the 10 bytes after it");
  b[0] = 0;
  expect_raw(b, 18, "does not start with '{'");
  memcpy(b, "\x08\0\0\0\0\0\0\0{}\0     ", 16); /* a NUL byte after the object */
  expect_raw(b, 16, "control byte 0x00");
  memcpy(b, "\x08\0\0\0\0\0\0\0{\"\0\":1}", 16); /* a NUL byte inside a string */
  expect_raw(b, 16, "raw control byte 0x00 inside a string");
}

/* What the format allows must load. */
static void expect_ok(const char *json, size_t data_len, const char *what) {
  size_t len;
  unsigned char *b = mk(json, strlen(json), data_len, &len);
  st_file_t *f = NULL;
  EXPECT(st_parse(LABEL, b, len, &f, err, sizeof err) == 0, "%s: rejected: %s", what, err);
  if (f && strstr(what, "escaped")) {
    const struct st_tensor *t = st_find(f, "a\"b\\c\xc3\xa9");
    EXPECT(t && t->nbytes == 4, "escaped name not decoded");
  }
  if (f && strstr(what, "order")) {
    EXPECT(!strcmp(st_tensor_at(f, 0)->name, "a") && !strcmp(st_tensor_at(f, 1)->name, "b"), "not in offset order");
    EXPECT(st_tensor_at(f, 1)->data == b + 8 + strlen(json) + 4, "data pointer of b is wrong");
  }
  st_close(f);
  free(b);
}

static void test_accepts(void) {
  expect_ok("{}", 0, "empty file");
  expect_ok("{}      ", 0, "padded");
  expect_ok("{}\n\t\r ", 0, "JSON whitespace after the object");
  expect_ok("{\"__metadata__\":null}", 0, "null metadata");
  expect_ok("{\"__metadata__\":{}}", 0, "empty metadata");
  expect_ok("{\"\":" U8_4("[0,4]") "}", 4, "empty name");
  expect_ok("{\"a\\\"b\\\\c\\u00e9\":" U8_4("[0,4]") "}", 4, "escaped name");
  expect_ok("{\"b\":" U8_4("[4,8]") ", \"a\" : " U8_4("[0,4]") "}", 8, "header order is not offset order");
  expect_ok("{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
            "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]},"
            "\"f\":{\"dtype\":\"I32\",\"shape\":[2,0,9007199254740991],\"data_offsets\":[8,8]},"
            "\"g\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
            8, "scalar and empty tensors");
  expect_ok("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]},"
            "\"b\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[2,10]}}",
            10, "unaligned data is the caller's concern");
}

/* ---- truncation and corruption --------------------------------------------- */

static void test_truncation(void) {
  float w[6] = {1, 2, 3, 4, 5, 6};
  int64_t p[2] = {3, -4};
  uint8_t k[3] = {0x38, 0x7e, 0xfe};
  struct st_tensor ts[] = {{.name = "w", .dtype = ST_F32, .ndim = 2, .shape = {2, 3}, .nbytes = 24, .data = w},
                           {.name = "p", .dtype = ST_I64, .ndim = 1, .shape = {2}, .nbytes = 16, .data = p},
                           {.name = "k", .dtype = ST_F8_E4M3, .ndim = 1, .shape = {3}, .nbytes = 3, .data = k}};
  struct st_meta m = {"format", "pt"};
  void *full = NULL;
  size_t len = 0;
  EXPECT(st_serialize(ts, 3, &m, 1, &full, &len, err, sizeof err) == 0, "serialize: %s", err);
  if (!full) return;
  int rejected = 0;
  for (size_t k = 0; k < len; k++) {
    unsigned char *b = malloc(k ? k : 1);
    memcpy(b, full, k);
    st_file_t *f = NULL;
    int rc = st_parse("trunc.safetensors", b, k, &f, err, sizeof err);
    rejected += rc == CEDAR_EFORMAT && !f && strstr(err, "trunc.safetensors: ");
    st_close(f);
    free(b);
  }
  EXPECT(rejected == (int)len, "%d of %zu truncations rejected with a message", rejected, len);

  /* One byte too many is a hole at the end. */
  unsigned char *longer = malloc(len + 1);
  memcpy(longer, full, len);
  longer[len] = 0;
  expect_raw(longer, len + 1, "belong to no tensor");
  free(longer);

  /* The same through files, including the empty file (no mapping). */
  static const size_t cuts[] = {0, 7, 8, 20, 0};
  size_t cut[5];
  memcpy(cut, cuts, sizeof cut);
  cut[4] = len - 1;
  const char *path = path_in("trunc.safetensors");
  for (int i = 0; i < 5; i++) {
    FILE *fp = fopen(path, "wb");
    fwrite(full, 1, cut[i], fp);
    fclose(fp);
    st_file_t *f = NULL;
    int rc = st_open(path, &f, err, sizeof err);
    EXPECT(rc == CEDAR_EFORMAT && !f && strstr(err, path), "file cut at %zu: %d: %s", cut[i], rc, err);
    st_close(f);
  }
  unlink(path);

  /* Byte flips: anything may happen but a crash; a load has sane pointers. */
  static const unsigned char masks[] = {0x01, 0x20, 0x80, 0xFF};
  unsigned char *b = malloc(len);
  int loaded = 0;
  for (size_t i = 0; i < len; i++)
    for (size_t j = 0; j < sizeof masks; j++) {
      memcpy(b, full, len);
      b[i] ^= masks[j];
      st_file_t *f = NULL;
      int rc = st_parse("flip", b, len, &f, err, sizeof err);
      EXPECT(rc == 0 || (!f && err[0]), "flip %zu^%02x: failed without a message", i, masks[j]);
      for (size_t t = 0; f && t < st_count(f); t++) {
        const struct st_tensor *x = st_tensor_at(f, t);
        EXPECT((const unsigned char *)x->data >= b + 8 &&
                   (const unsigned char *)x->data + x->nbytes <= b + len && st_find(f, x->name) == x,
               "flip %zu^%02x: tensor %zu out of the buffer", i, masks[j], t);
      }
      loaded += f != NULL;
      st_close(f);
    }
  EXPECT(loaded > 0, "no byte flip loaded (flips in tensor data must)");
  free(b);
  free(full);
}

/* ---- files: open errors and the fuzz seeds ------------------------------------ */

static void test_open_errors(void) {
  st_file_t *f = NULL;
  int rc = st_open("/nonexistent/model.safetensors", &f, err, sizeof err);
  EXPECT(rc == CEDAR_EIO && !f && strstr(err, "/nonexistent/model.safetensors: cannot open"), "missing: %s", err);
  rc = st_open(tmpdir, &f, err, sizeof err);
  EXPECT(rc == CEDAR_EIO && !f && strstr(err, "not a regular file"), "directory: %s", err);
}

static void test_corpus(void) {
  const char *dir = "tests/fuzz/corpus_safetensors";
  DIR *d = opendir(dir);
  EXPECT(d != NULL, "cannot open %s (run from the repo root)", dir);
  int ok = 0, bad = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    bool want_ok = !strncmp(e->d_name, "ok_", 3);
    if (!want_ok && strncmp(e->d_name, "bad_", 4)) continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    st_file_t *f = NULL;
    int rc = st_open(path, &f, err, sizeof err);
    EXPECT((rc == 0) == want_ok, "%s: status %d: %s", path, rc, err);
    if (f && !strcmp(e->d_name, "ok_basic.safetensors")) {
      const struct st_tensor *w = st_find(f, "w");
      static const float want[4] = {1, 2, 3, 4};
      EXPECT(st_count(f) == 5 && w && w->dtype == ST_F32 && w->ndim == 2 && !memcmp(w->data, want, 16),
             "ok_basic: tensor w wrong");
      const char *note = st_meta_get(f, "note");
      EXPECT(note && !strcmp(note, "h\xc3\xa9llo"), "ok_basic: metadata note wrong");
    }
    ok += want_ok, bad += !want_ok;
    st_close(f);
  }
  if (d) closedir(d);
  EXPECT(ok >= 3 && bad >= 3, "corpus: %d ok and %d bad seeds, want at least 3 of each", ok, bad);
}

static void test_dtypes(void) {
  for (int i = 0; i < ST_DTYPE_COUNT; i++) {
    enum st_dtype t;
    EXPECT(st_dtype_parse(st_dtype_name((enum st_dtype)i), &t) == 0 && t == (enum st_dtype)i, "dtype %d", i);
  }
  EXPECT(st_dtype_size(ST_F32) == 4 && st_dtype_size(ST_BF16) == 2 && st_dtype_size(ST_F8_E4M3) == 1 &&
             st_dtype_size(ST_I64) == 8 && st_dtype_size(ST_C64) == 8 && st_dtype_size(ST_DTYPE_COUNT) == 0,
         "dtype sizes");
  enum st_dtype t;
  EXPECT(st_dtype_parse("F4", &t) != 0 && st_dtype_parse(NULL, &t) != 0, "sub-byte or NULL dtype parsed");
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/cedar-st-XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_dtypes();
  test_golden();
  test_round_trip();
  test_writer_rejects();
  test_rejects();
  test_rejects_raw();
  test_accepts();
  test_truncation();
  test_open_errors();
  test_corpus();
  EXPECT(dir_entries() == 0, "%s not empty at the end", tmpdir);
  rmdir(tmpdir);
  return h_report("safetensors");
}
