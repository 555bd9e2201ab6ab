/* plan_bus.c: buses and totals derived from a resolved plan (SPEC 2.4).
 *
 *   Main-KV bus    writer: each full layer      readers: layers with kv_src = it
 *   Indexer-K bus  writer: each full layer      readers: index sources (full,
 *                                               reindex) with kv_src = it
 *   Top-K bus      writer: each index source    readers: layers with topk_src = it
 *                                               other than itself
 *   Candidate pool writer: each pool builder    readers: layers with pool_src = it
 */
#include "scheduler/plan_bus.h"

#include <stdio.h>
#include <string.h>

const char *plan_bus_name(enum plan_bus_kind k) {
  static const char *names[] = {"main-kv", "indexer-k", "top-k", "candidate-pool"};
  return k < PLAN_BUS_COUNT ? names[k] : "?";
}

static bool reads(const struct plan_layer *l, enum plan_bus_kind k, int w) {
  switch (k) {
    case PLAN_BUS_MAIN_KV: return l->kv_src == w;
    case PLAN_BUS_INDEXER_K: return l->kv_src == w && plan_is_index_source(l);
    case PLAN_BUS_TOPK: return l->topk_src == w && l->index != w;
    case PLAN_BUS_POOL: return l->pool_src == w;
    default: return false;
  }
}

static bool writes(const struct plan_layer *l, enum plan_bus_kind k) {
  switch (k) {
    case PLAN_BUS_MAIN_KV:
    case PLAN_BUS_INDEXER_K: return plan_is_kv_source(l);
    case PLAN_BUS_TOPK: return plan_is_index_source(l);
    case PLAN_BUS_POOL: return l->cand == PLAN_CAND_BUILD;
    default: return false;
  }
}

int plan_buses(const struct plan *p, struct plan_bus *out, int max) {
  int n = 0;
  for (int k = 0; k < PLAN_BUS_COUNT; k++)
    for (int w = 0; w < p->n_layers; w++) {
      if (!writes(&p->layer[w], (enum plan_bus_kind)k) || n == max) continue;
      struct plan_bus *b = &out[n++];
      b->kind = (enum plan_bus_kind)k;
      b->writer = w;
      b->n_readers = 0;
      for (int r = 0; r < p->n_layers; r++)
        if (reads(&p->layer[r], b->kind, w)) b->readers[b->n_readers++] = r;
    }
  return n;
}

void plan_totals(const struct plan *p, struct plan_totals *t) {
  memset(t, 0, sizeof *t);
  for (int i = 0; i < p->n_layers; i++) {
    const struct plan_layer *l = &p->layer[i];
    t->kv_sources += l->mode == PLAN_FULL;
    t->index_sources += plan_is_index_source(l);
    t->reindex += l->mode == PLAN_REINDEX;
    t->reuse += l->mode == PLAN_REUSE;
    t->swa_only += l->mode == PLAN_SWA_ONLY;
    t->csa += plan_is_csa(l);
    t->pool_builders += l->cand == PLAN_CAND_BUILD;
    t->pool_readers += l->cand == PLAN_CAND_READ;
    t->engram += l->engram;
    t->encoder_layers += l->region == PLAN_ENCODER;
    t->decoder_layers += l->region == PLAN_DECODER;
  }
}

char *plan_layer_set_str(const int *layers, int n, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < n; i++) {
    int j = i;
    while (j + 1 < n && layers[j + 1] == layers[j] + 1) j++;
    int w = j > i ? snprintf(buf + used, size - used, "%s%d-%d", used ? ", " : "", layers[i], layers[j])
                  : snprintf(buf + used, size - used, "%s%d", used ? ", " : "", layers[i]);
    if (w < 0 || (size_t)w >= size - used) break;
    used += (size_t)w;
    i = j;
  }
  if (!n) snprintf(buf, size, "-");
  return buf;
}
