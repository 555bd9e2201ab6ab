/* weights_hash.c: per-tensor content hashes of a safetensors file (issue 18
 * row 16): `cedar.hash.<tensor name>` in `__metadata__`, the XXH3-64 of the
 * tensor's bytes as 16 hex digits. `cedar weights init` writes them, loading
 * and `cedar weights check` verify the ones a file has, and
 * weights_hash_record adds them to a file that has none (`weights check
 * --hash`), rewriting it atomically (st_write). See weights.h.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/check.h"
#include "runtime/load/weights.h"

void weights_hash_key(char *out, size_t len, const char *name) { snprintf(out, len, "%s%s", WEIGHTS_HASH_PREFIX, name); }

void weights_hash_hex(char out[17], const void *data, uint64_t n) {
  snprintf(out, 17, "%016" PRIx64, XXH3_64bits(data, (size_t)n));
}

int weights_hash_record(const char *path, size_t *added, char *err, size_t err_len) {
  st_file_t *f;
  *added = 0;
  int rc = st_open(path, &f, err, err_len);
  if (rc) return rc;
  size_t n = st_count(f), nm = st_meta_count(f);
  struct st_tensor *ts = cedar_xcalloc(n + 1, sizeof *ts);
  struct st_meta *meta = cedar_xcalloc(nm + n + 1, sizeof *meta);
  char (*keys)[WEIGHTS_NAME_MAX + 300] = cedar_xcalloc(n + 1, sizeof *keys);
  char (*vals)[17] = cedar_xcalloc(n + 1, sizeof *vals);
  for (size_t i = 0; i < nm; i++) meta[i] = *st_meta_at(f, i);
  size_t m = nm;
  for (size_t i = 0; i < n; i++) {
    ts[i] = *st_tensor_at(f, i);
    weights_hash_key(keys[i], sizeof keys[i], ts[i].name);
    if (st_meta_get(f, keys[i])) continue;
    weights_hash_hex(vals[i], ts[i].data, ts[i].nbytes);
    meta[m++] = (struct st_meta){keys[i], vals[i]};
  }
  *added = m - nm;
  if (*added) rc = st_write(path, ts, n, meta, m, err, err_len);
  free(vals);
  free(keys);
  free(meta);
  free(ts);
  st_close(f);
  return rc;
}
