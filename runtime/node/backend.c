/* backend.c: the backend table by device kind and the feature entries
 * registered beside it (backend.h). The CPU backend's entries live with the
 * dispatch they share with every executor, in exec_node.c; the CUDA
 * backend is registered by the device home (runtime/device/cuda_backend.c). */
#include "runtime/node/backend.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"

#define MAX_FEATURES 32

struct feature {
  enum graph_device dev;
  enum graph_op op;
  uint32_t mask, value; /* a node is this feature's when (flags & mask) == value */
  _Atomic(rt_group_fn) fn;
};

static struct feature features[MAX_FEATURES];
static atomic_int n_features; /* entries [0, n) are complete (written before the count) */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(const struct rt_backend *) cuda_backend;
static const struct rt_backend no_cuda = {.name = "cuda", .dev = GRAPH_DEV_CUDA};

const struct rt_backend *rt_backend_for(enum graph_device dev) {
  switch (dev) {
  case GRAPH_DEV_CPU: return &rt_backend_cpu;
  case GRAPH_DEV_CUDA: {
    const struct rt_backend *b = atomic_load(&cuda_backend);
    return b ? b : &no_cuda;
  }
  }
  return NULL;
}

void rt_backend_set(const struct rt_backend *b) {
  CEDAR_ASSERT(b && b->dev == GRAPH_DEV_CUDA); /* the CPU's is built in */
  atomic_store(&cuda_backend, b);
}

void rt_backend_feature(enum graph_device dev, enum graph_op op, uint32_t mask, uint32_t value, rt_group_fn fn) {
  CEDAR_ASSERT((value & ~mask) == 0);
  pthread_mutex_lock(&reg_mu);
  int n = atomic_load(&n_features);
  for (int k = 0; k < n; k++)
    if (features[k].dev == dev && features[k].op == op && features[k].mask == mask && features[k].value == value) {
      atomic_store(&features[k].fn, fn);
      pthread_mutex_unlock(&reg_mu);
      return;
    }
  CEDAR_ASSERT_MSG(n < MAX_FEATURES, "more than %d feature entries", MAX_FEATURES);
  for (int k = 0; k < n; k++) /* two entries must never claim one node */
    CEDAR_ASSERT_MSG(features[k].dev != dev || features[k].op != op ||
                         ((features[k].value ^ value) & features[k].mask & mask) != 0,
                     "two feature entries select the same %s nodes", graph_op_name(op));
  features[n].dev = dev, features[n].op = op, features[n].mask = mask, features[n].value = value;
  atomic_store(&features[n].fn, fn);
  atomic_store(&n_features, n + 1);
  pthread_mutex_unlock(&reg_mu);
}

/* The feature entry of (dev, op) that selects a node with these flags
 * (at most one does: rt_backend_feature refuses overlaps); NULL when none. */
static rt_group_fn feature_for(enum graph_device dev, enum graph_op op, uint32_t flags) {
  int n = atomic_load(&n_features);
  for (int k = 0; k < n; k++) {
    const struct feature *f = &features[k];
    if (f->dev == dev && f->op == op && (flags & f->mask) == f->value) return atomic_load(&f->fn);
  }
  return NULL;
}

rt_group_fn rt_backend_entry(const struct graph_node *nd) {
  rt_group_fn fn = feature_for(nd->place.dev, nd->op, nd->flags);
  if (fn) return fn;
  const struct rt_backend *b = rt_backend_for(nd->place.dev);
  return b ? b->run[nd->op] : NULL;
}

int rt_backend_missing(const struct rt_backend *b, bool with_transfer, char *list, size_t len) {
  int n = 0;
  size_t at = 0;
  if (len) list[0] = 0;
  for (int op = 0; op < GRAPH_OP_COUNT; op++) {
    if ((op == GRAPH_TRANSFER && !with_transfer) || b->run[op] || feature_for(b->dev, op, 0)) continue;
    if (at < len) at += (size_t)snprintf(list + at, len - at, "%s%s", n ? ", " : "", graph_op_name(op));
    n++;
  }
  return n;
}
