/* fuzz_safetensors.c: libFuzzer target for the safetensors reader
 * (st_parse, the in-memory entry point st_open also uses).
 * Build with -DCEDAR_FUZZ=ON (clang); run `make fuzz`, seeded from
 * tests/fuzz/corpus_safetensors/. Any input must load or fail with a message
 * naming the file, never crash, hang or leak. What loads must also survive
 * the writer: serialized again and re-read, it gives the same tensors, bytes
 * and metadata (the writer's order may differ from the input's).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/load/safetensors.h"

#define LABEL "fuzz.safetensors"

static volatile unsigned sink; /* keeps the reads of tensor data */

static void check_same(const st_file_t *a, const st_file_t *b) {
  if (st_count(a) != st_count(b) || st_meta_count(a) != st_meta_count(b)) abort();
  for (size_t i = 0; i < st_count(a); i++) {
    const struct st_tensor *x = st_tensor_at(a, i), *y = st_find(b, x->name);
    if (!y || x->dtype != y->dtype || x->ndim != y->ndim || x->nbytes != y->nbytes) abort();
    if (memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim)) abort();
    if (x->nbytes && memcmp(x->data, y->data, (size_t)x->nbytes)) abort();
  }
  for (size_t i = 0; i < st_meta_count(a); i++) {
    const struct st_meta *m = st_meta_at(a, i);
    const char *v = st_meta_get(b, m->key);
    if (!v || strcmp(v, m->value)) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[512];
  st_file_t *f = NULL;
  int rc = st_parse(LABEL, data, size, &f, err, sizeof err);
  if (rc) {
    if (f || strncmp(err, LABEL ": ", strlen(LABEL) + 2)) abort(); /* a failed load must say why */
    return 0;
  }
  /* Touch every byte the handle points at (ASan checks the bounds). */
  unsigned sum = 0;
  for (size_t i = 0; i < st_count(f); i++) {
    const struct st_tensor *t = st_tensor_at(f, i);
    if (st_find(f, t->name) != t) abort();
    for (uint64_t k = 0; k < t->nbytes; k++) sum += ((const uint8_t *)t->data)[k];
  }
  sink = sum;
  for (size_t i = 0; i < st_meta_count(f); i++)
    if (st_meta_get(f, st_meta_at(f, i)->key) != st_meta_at(f, i)->value) abort();

  /* Round trip through the writer. */
  struct st_tensor *ts = malloc((st_count(f) + 1) * sizeof *ts);
  struct st_meta *ms = malloc((st_meta_count(f) + 1) * sizeof *ms);
  for (size_t i = 0; i < st_count(f); i++) ts[i] = *st_tensor_at(f, i);
  for (size_t i = 0; i < st_meta_count(f); i++) ms[i] = *st_meta_at(f, i);
  void *out = NULL;
  size_t len = 0;
  if (st_serialize(ts, st_count(f), ms, st_meta_count(f), &out, &len, err, sizeof err)) abort();
  st_file_t *g = NULL;
  if (st_parse("reserialized", out, len, &g, err, sizeof err)) abort();
  check_same(f, g);
  check_same(g, f);
  st_close(g);
  free(out);
  free(ms);
  free(ts);
  st_close(f);
  return 0;
}
