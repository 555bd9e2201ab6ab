/* shards.h: the mapped shard files of an open checkpoint: the directory,
 * each file's name and its safetensors mapping. The checkpoint reader
 * (checkpoint.c) fills it; the weights that point into the mappings own it
 * and free it with themselves (weights.c).
 * Test: tests/test_checkpoint.c. */
#ifndef CEDAR_RUNTIME_LOAD_SHARDS_H
#define CEDAR_RUNTIME_LOAD_SHARDS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/load/safetensors.h"

/* The mapped shards of an open checkpoint (owned by the weights it filled). */
struct ckpt_shards {
  char *dir;              /* the checkpoint directory */
  size_t n;
  char **names;           /* file names within the directory */
  st_file_t **files;
  uint64_t file_bytes;    /* the shards' total size */
};
void ckpt_shards_free(struct ckpt_shards *s);

#endif
