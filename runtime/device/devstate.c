/* devstate.c: the layout half of runtime/device/devstate.h, in every build: where
 * each class of state goes in its device slab, from the plan, the host
 * pools and a request shaped like the ones that will run. Pure arithmetic;
 * the CUDA half (devstate_cuda.c) allocates what this says.
 * Test: tests/test_devstate.c. */
#include "runtime/device/devstate.h"

#include <stdio.h>
#include <string.h>

#include "base/check.h"

static size_t align_up(size_t n) { return (n + RT_DEV_ALIGN - 1) / RT_DEV_ALIGN * RT_DEV_ALIGN; }

/* Place a region of bytes at *cursor (aligned) and advance it. */
static struct rt_dev_region place(size_t *cursor, size_t bytes) {
  struct rt_dev_region r = {bytes ? *cursor : 0, bytes};
  *cursor += align_up(bytes);
  return r;
}

int rt_dev_layout_init(struct rt_dev_layout *L, const struct plan *p, const struct rt_kv_pool *pools,
                       const struct rt_request *r, int pages_per_pool, int n_slots, size_t act_bytes, char *err,
                       size_t err_len) {
  memset(L, 0, sizeof(*L));
  if (pages_per_pool < 0 || n_slots < 1) {
    snprintf(err, err_len, "device state: %d pages per pool and %d request slots: pages must be >= 0 and slots >= 1",
             pages_per_pool, n_slots);
    return CEDAR_EINVAL;
  }
  L->n_layers = p->n_layers;
  L->n_slots = n_slots;
  L->slot_tokens = r->max_tokens;
  size_t kv = 0, req = 0;
  for (int l = 0; l < p->n_layers; l++) {
    if (pools[l].entry_bytes) {
      L->pages[l] = pages_per_pool;
      L->page_bytes[l] = rt_kv_page_bytes(&pools[l]);
      L->kv[l] = place(&kv, (size_t)pages_per_pool * L->page_bytes[l]);
    }
    const struct rt_ring *g = &r->ring[l];
    L->ring[l] = place(&req, (size_t)g->window * g->entry_bytes);
    L->ring_pos[l] = place(&req, sizeof(int64_t) * (size_t)g->window);
    if (r->tail_buf[l])
      L->tail[l] = place(&req, sizeof(float) * op_comp_tail_floats(r->tail[l].ratio, r->tail[l].d));
  }
  L->kv_total = kv;
  L->req_bytes = align_up(req);
  L->req_total = L->req_bytes * (size_t)n_slots;
  L->act_total = align_up(act_bytes);
  L->param_bytes = align_up(sizeof(struct rt_dev_params));
  return 0;
}

size_t rt_dev_act_bytes(const struct graph *g) {
  size_t total = 0;
  for (int d = 0; d < g->n_data; d++)
    if (g->data[d].kind == GRAPH_ACT || g->data[d].kind == GRAPH_BUS) total += align_up((size_t)g->data[d].bytes);
  return total;
}

size_t rt_dev_layout_total(const struct rt_dev_layout *L) {
  return L->kv_total + L->req_total + L->act_total + L->param_bytes;
}
