/* plan_bus.h: the shared-state buses a plan implies (SPEC 2.4), derived from
 * its resolved layers: who writes each bus and who reads it. Used by
 * `cedar plan show`, `cedar plan dot` and, later, the graph compiler. */
#ifndef CEDAR_PLAN_BUS_H
#define CEDAR_PLAN_BUS_H

#include "scheduler/plan.h"

enum plan_bus_kind { PLAN_BUS_MAIN_KV = 0, PLAN_BUS_INDEXER_K, PLAN_BUS_TOPK, PLAN_BUS_POOL, PLAN_BUS_COUNT };

struct plan_bus {
  enum plan_bus_kind kind;
  int writer;
  int n_readers;
  int readers[PLAN_MAX_LAYERS];
};

const char *plan_bus_name(enum plan_bus_kind k);

/* Fill `out` (capacity `max`) with every bus instance, by kind then writer.
 * Returns the count. */
int plan_buses(const struct plan *p, struct plan_bus *out, int max);

struct plan_totals {
  int kv_sources, index_sources, reindex, reuse, swa_only, csa, pool_builders, pool_readers, engram;
  int encoder_layers, decoder_layers;
};
void plan_totals(const struct plan *p, struct plan_totals *t);

/* Write a set of layer numbers compactly ("3-7, 9"); returns buf. */
char *plan_layer_set_str(const int *layers, int n, char *buf, size_t size);

#endif
