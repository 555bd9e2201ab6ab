/* model_cmap.c: the Engram token map of a bound model (model.h:
 * rt_model_set_cmap): the tokenizer's compressed ids replace model.c's
 * id-mod-vocab default once a tokenizer is loaded. Moved out of model.c
 * (its 800-line bound). */
#include <stdio.h>

#include "base/check.h"
#include "runtime/model/model.h"

int rt_model_set_cmap(struct rt_model *M, const int32_t *map, int n, int n_distinct, const char *source, char *err,
                      size_t err_len) {
  const struct plan_model *m = &M->p->model;
  if (!M->cmap) return 0; /* no Engram layer: nothing to map */
  if (n_distinct != m->engram_compressed_vocab) {
    snprintf(err, err_len, "the tokenizer's Engram token map has %d distinct keys but model.engram.compressed_vocab is "
             "%d (engram_compressed_vocab_size): this tokenizer does not belong to this checkpoint; use the "
             "checkpoint's own tokenizer.json", n_distinct, m->engram_compressed_vocab);
    return CEDAR_EINVAL;
  }
  if (m->engram_pad_id >= n) {
    snprintf(err, err_len, "model.engram.pad_id %d is past the tokenizer's %d ids", m->engram_pad_id, n);
    return CEDAR_EINVAL;
  }
  for (int t = 0; t < m->vocab; t++) { /* [cedar] ids past the tokenizer (embedding padding rows) take the pad */
    int32_t c = t < n ? map[t] : map[m->engram_pad_id];
    CEDAR_ASSERT(c >= 0 && c < n_distinct);
    M->cmap[t] = c;
  }
  M->cmap_source = source;
  return 0;
}
