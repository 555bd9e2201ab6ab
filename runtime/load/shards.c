/* shards.c: freeing a checkpoint's shard set (shards.h). */
#include "runtime/load/shards.h"

#include <stdlib.h>

void ckpt_shards_free(struct ckpt_shards *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) {
    st_close(s->files[i]);
    free(s->names[i]);
  }
  free(s->dir);
  free(s->files);
  free(s->names);
  free(s);
}
