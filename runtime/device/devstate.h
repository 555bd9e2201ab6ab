/* devstate.h: cedar's state in GPU memory (issue 15): where each byte of the
 * KV page pools, the SWA rings, the compressor tails, the activations, the
 * per-step parameter block and the weights lives on a CUDA device, and the
 * StarPU handles over it on that device's memory node.
 *
 * Two halves:
 *   layout   (devstate.c, every build) pure arithmetic from a plan, its
 *            pools and the capacities: one region per class, each region
 *            256-byte aligned (cudaMalloc's own alignment) inside one slab
 *            per class. Tested on the CPU (tests/test_devstate.c): every
 *            region's size equals what the host state holds for the same
 *            request (rt_request_bytes, rt_kv_page_bytes), regions never
 *            overlap, and the totals are what `cedar env`/docs report.
 *   device   (devstate_cuda.c with CEDAR_CUDA, devstate_nocuda.c without)
 *            cudaMalloc, never managed memory: one slab for the pools' pages
 *            (page p of pool l at kv[l].off + p * page_bytes[l]), one for
 *            n_slots requests' rings, ring positions and tails, one for a
 *            graph's activations, one for the parameter block; the
 *            weights in one slab, uploaded once (rt_dev_weights_upload).
 *            With a StarPU built with CUDA (.ci/starpu-cuda.sh), each page,
 *            ring and tail is registered as StarPU variable data whose home
 *            is the CUDA memory node of the device (starpu_worker_get_memory_node
 *            of the device's CUDA worker), so tasks on that worker touch it in
 *            place and StarPU never copies it to RAM unless a CPU task asks.
 *            Against Debian's CPU-only StarPU, rt_dev_state_open refuses
 *            with that reason.
 *
 * What has run: the layout tests here. The device half compiles in the CUDA
 * build and is exercised by tests/gpu/run.sh on a GPU; docs/cuda.md says
 * whether it has run there.
 */
#ifndef CEDAR_RUNTIME_DEVSTATE_H
#define CEDAR_RUNTIME_DEVSTATE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/device/cuda_graph.h"
#include "runtime/model/state.h"
#include "runtime/load/weights.h"
#include "scheduler/graph.h"
#include "scheduler/plan.h"

/* cudaMalloc returns 256-byte aligned memory; regions keep that alignment. */
#define RT_DEV_ALIGN 256

struct rt_dev_region {
  size_t off, bytes; /* inside its class's slab */
};


struct rt_dev_layout {
  int n_layers, n_slots;
  int64_t slot_tokens;                 /* token ids a request slot holds (the shape request's max_tokens) */
  /* KV pool slab */
  int pages[PLAN_MAX_LAYERS];          /* page capacity of each pool (0: no pool) */
  size_t page_bytes[PLAN_MAX_LAYERS];  /* rt_kv_page_bytes */
  struct rt_dev_region kv[PLAN_MAX_LAYERS];
  size_t kv_total;
  /* request slab: slot s's region of layer l is at req_base[s] + the offsets below */
  struct rt_dev_region ring[PLAN_MAX_LAYERS], ring_pos[PLAN_MAX_LAYERS], tail[PLAN_MAX_LAYERS];
  size_t req_bytes;                    /* one request slot, aligned */
  size_t req_total;                    /* n_slots * req_bytes */
  /* activations: the largest graph's GRAPH_ACT + GRAPH_BUS data, each aligned */
  size_t act_total;
  /* parameter block */
  size_t param_bytes;
};

/* The layout for pools (rt_kv_pools_init) holding pages_per_pool pages each,
 * n_slots requests shaped like r (rt_request_init), and activations of up
 * to act_bytes (0: none). Returns 0 or CEDAR_EINVAL (a count out of range,
 * named in err). */
int rt_dev_layout_init(struct rt_dev_layout *L, const struct plan *p, const struct rt_kv_pool *pools,
                       const struct rt_request *r, int pages_per_pool, int n_slots, size_t act_bytes, char *err,
                       size_t err_len);
/* The activation bytes graph-shaped data needs: the sum of its GRAPH_ACT and
 * GRAPH_BUS data's bytes, each rounded up to RT_DEV_ALIGN. */
size_t rt_dev_act_bytes(const struct graph *g);
/* All slabs together (what rt_dev_state_open cudaMallocs besides weights). */
size_t rt_dev_layout_total(const struct rt_dev_layout *L);

/* ---- the device half (CUDA builds; the CPU-only build refuses) ----------- */

struct rt_dev_state;     /* slabs, StarPU handles: devstate_cuda.c */
struct rt_dev_weights;   /* one slab + an offset per tensor */

/* Allocate the slabs of L on CUDA device dev and, when StarPU is running,
 * register pages, rings, ring positions and tails with StarPU on that
 * device's memory node (it must then have a CUDA worker for dev; without
 * StarPU, for the direct executor, no handles are made and
 * rt_dev_state_node is -1). Returns 0, CEDAR_EUNSUPPORTED (no CUDA in this
 * build, no device, or a running StarPU without a CUDA worker on dev: err
 * says which) or CEDAR_ENOMEM (cudaMalloc failed: err has the bytes). */
int rt_dev_state_open(struct rt_dev_state **out, const struct rt_dev_layout *L, int dev, char *err, size_t err_len);
void rt_dev_state_close(struct rt_dev_state *s);
/* Device addresses: page id of pool l; ring slots, positions and tail of
 * request slot s, layer l; the activation slab; the parameter block. NULL
 * where the layout has no such region. */
void *rt_dev_page(const struct rt_dev_state *s, int l, int32_t id);
void *rt_dev_ring(const struct rt_dev_state *s, int slot, int l);
int64_t *rt_dev_ring_pos(const struct rt_dev_state *s, int slot, int l);
float *rt_dev_tail(const struct rt_dev_state *s, int slot, int l);
void *rt_dev_act(const struct rt_dev_state *s);
struct rt_dev_params *rt_dev_param_block(const struct rt_dev_state *s);
/* The StarPU handle (starpu_data_handle_t) of page id of pool l, and of the
 * ring of (slot, l); NULL when StarPU data was not registered. */
void *rt_dev_page_handle(const struct rt_dev_state *s, int l, int32_t id);
void *rt_dev_ring_handle(const struct rt_dev_state *s, int slot, int l);
/* ... of the ring positions and of the tail of (slot, l); NULL when none. */
void *rt_dev_ring_pos_handle(const struct rt_dev_state *s, int slot, int l);
void *rt_dev_tail_handle(const struct rt_dev_state *s, int slot, int l);
/* StarPU's memory node of the state (-1: not registered). */
int rt_dev_state_node(const struct rt_dev_state *s);

/* Upload every tensor of w once to device dev (one cudaMalloc, one copy per
 * tensor). Returns 0, CEDAR_EUNSUPPORTED or CEDAR_ENOMEM as above. */
int rt_dev_weights_upload(struct rt_dev_weights **out, const struct weights *w, int dev, char *err, size_t err_len);
/* The device copy of tensor name; NULL when w has no such tensor. */
const void *rt_dev_weights_get(const struct rt_dev_weights *dw, const char *name);
size_t rt_dev_weights_bytes(const struct rt_dev_weights *dw);
void rt_dev_weights_free(struct rt_dev_weights *dw);

#endif
