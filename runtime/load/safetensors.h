/* safetensors.h: read and write safetensors files (Hugging Face's tensor
 * container: an 8-byte little-endian header length N, N bytes of UTF-8 JSON,
 * then the raw little-endian data buffer). docs/safetensors.md lists what
 * cedar accepts and rejects.
 *
 * Reading: st_open maps the file read-only; st_parse validates a buffer the
 * caller holds (tests, the fuzzer, files already in memory). Every rule of
 * the format is checked before the handle is returned: a bad file gives a
 * negative cedar_status and a message naming the file, the tensor and the
 * problem; nothing aborts. Tensor pointers point into the mapping and stay
 * valid until st_close.
 *
 * Writing: st_write writes a new file under a temporary name, fsyncs it and
 * renames it over the final name, so a crash never leaves a half-written
 * file there (and readers that still map the old file keep the old bytes).
 * Tensors are laid out as the official writer does: by dtype in the official
 * alignment order (largest elements first), then by name; the header is
 * padded with spaces to a multiple of 8, so every tensor is aligned to its
 * element size.
 *
 * Threads: a handle is read-only after st_parse/st_open returns and may be
 * shared. Parsing a file with invalid JSON writes cJSON's process-wide error
 * slot (harmless, but a race detector will see it).
 *
 * What it is not: a dtype converter (F32 <-> BF16/F16 lives elsewhere when it
 * is needed), nor a sharded-checkpoint index reader.
 *
 * Test: ctest --test-dir build -R safetensors --output-on-failure
 * Fuzz: make fuzz (tests/fuzz/fuzz_safetensors.c)
 */
#ifndef CEDAR_SAFETENSORS_H
#define CEDAR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* The largest header accepted, as the official implementation (100 MB). */
#define ST_MAX_HEADER 100000000u
/* Dimensions per tensor. Real checkpoints use at most 5; more is rejected
 * (CEDAR_EUNSUPPORTED) rather than allocated per tensor. */
#define ST_MAX_DIMS 8
/* Every dimension and offset is below 2^53, so cJSON's doubles hold it exactly. */
#define ST_MAX_INT 9007199254740992ull

/* Element types: X(name, bytes), in the official order of increasing
 * alignment (the writer sorts by it, largest first, as the official writer
 * does). Sub-byte types (F4, F6_E2M3, F6_E3M2) are recognised by the reader
 * and refused as unsupported. */
#define ST_DTYPES(X) \
  X(BOOL, 1)         \
  X(U8, 1)           \
  X(I8, 1)           \
  X(F8_E5M2, 1)      \
  X(F8_E4M3, 1)      \
  X(F8_E8M0, 1)      \
  X(I16, 2)          \
  X(U16, 2)          \
  X(F16, 2)          \
  X(BF16, 2)         \
  X(I32, 4)          \
  X(U32, 4)          \
  X(F32, 4)          \
  X(C64, 8)          \
  X(F64, 8)          \
  X(I64, 8)          \
  X(U64, 8)

enum st_dtype {
#define ST_ENUM_(name, bytes) ST_##name,
  ST_DTYPES(ST_ENUM_)
#undef ST_ENUM_
  ST_DTYPE_COUNT
};

/* "F32", ... ; NULL when out of range. */
const char *st_dtype_name(enum st_dtype t);
/* Bytes per element; 0 when out of range. */
size_t st_dtype_size(enum st_dtype t);
/* 0 and *out set when s names a supported dtype, else CEDAR_EFORMAT. */
int st_dtype_parse(const char *s, enum st_dtype *out);

/* One tensor. The reader fills every field; the writer reads name, dtype,
 * ndim, shape, nbytes and data (nbytes must equal prod(shape) * element size,
 * a guard against a short buffer) and ignores offset. */
struct st_tensor {
  const char *name;         /* NUL-terminated UTF-8 */
  enum st_dtype dtype;
  int ndim;                 /* 0 for a scalar */
  int64_t shape[ST_MAX_DIMS];
  uint64_t nbytes;
  uint64_t offset;          /* reader: begin of the data within the data buffer */
  const void *data;         /* nbytes bytes, little-endian, row-major */
};

struct st_meta {
  const char *key, *value;  /* NUL-terminated UTF-8 */
};

typedef struct st_file st_file_t;

/* Map `path` read-only and validate it. On success *out is a handle for
 * st_close; on failure *out is NULL and err (if not NULL) holds a message
 * starting with the path. Returns CEDAR_OK, CEDAR_EIO (cannot open or map),
 * CEDAR_EFORMAT (malformed), CEDAR_EUNSUPPORTED (valid but beyond cedar:
 * sub-byte dtypes, more than ST_MAX_DIMS dimensions) or CEDAR_ENOMEM. */
int st_open(const char *path, st_file_t **out, char *err, size_t err_len);

/* Validate `len` bytes at `buf` as a whole safetensors file; `label` names it
 * in messages. The handle borrows buf (no copy): buf must outlive it. Tensor
 * pointers are aligned to their element size when buf is 8-aligned and the
 * file was laid out as the official writer does. Same returns as st_open. */
int st_parse(const char *label, const void *buf, size_t len, st_file_t **out, char *err,
             size_t err_len);

/* What st_open's fstat said of the file it mapped: device, inode, size,
 * modification time in ns since the epoch; all 0 for st_parse. A file
 * rewritten (st_write renames a new inode over it) or replaced has another
 * one (weights_identity). */
void st_file_id(const st_file_t *f, uint64_t id[4]);

/* Release the handle (NULL is fine). Tensor and metadata pointers die with it. */
void st_close(st_file_t *f);

/* Tensors in data-buffer order (by offset). */
size_t st_count(const st_file_t *f);
const struct st_tensor *st_tensor_at(const st_file_t *f, size_t i);
/* By name (binary search); NULL when absent. */
const struct st_tensor *st_find(const st_file_t *f, const char *name);

/* The "__metadata__" map, sorted by key. */
size_t st_meta_count(const st_file_t *f);
const struct st_meta *st_meta_at(const st_file_t *f, size_t i);
/* The value for key; NULL when absent. */
const char *st_meta_get(const st_file_t *f, const char *key);

/* Write n tensors and n_meta metadata pairs (n_meta = 0: no "__metadata__")
 * to path, atomically (temporary file, fsync, rename, fsync of the
 * directory). Returns CEDAR_OK, CEDAR_EINVAL (bad input: duplicate or
 * invalid name, nbytes mismatch, ...) or CEDAR_EIO, with a message in err. */
int st_write(const char *path, const struct st_tensor *tensors, size_t n, const struct st_meta *meta,
             size_t n_meta, char *err, size_t err_len);

/* The same file built in memory: *out (malloc'd, caller frees) gets *out_len
 * bytes. For tests, the fuzzer and small files. */
int st_serialize(const struct st_tensor *tensors, size_t n, const struct st_meta *meta, size_t n_meta,
                 void **out, size_t *out_len, char *err, size_t err_len);

#endif
