/* devbind.h: a request's state in a device state's slabs (issue 15): how a
 * node whose home is a device binds its ring, tail and KV pages there, what
 * the parameter block of a step holds, and the explicit copies that bring
 * a request's state to the device and back. Host logic, in every build.
 *
 * The rule: while a request runs on a device home, its state's bytes live
 * in the device slabs (runtime/device/devstate.h) and only there; the host
 * request keeps the metadata the executors and graphs reason with (page
 * tables, n_entries, ring r0, tail count and pos0) and, as bytes, what it
 * held when the request was claimed. Host code that reads the bytes after a
 * run (--dump, a P/D package, the prefix cache) gets them back with
 * rt_dev_request_download, never by reading a device pointer.
 *
 *   twin        (struct rt_dev_twin) host structs shaped like the
 *               request's own (struct rt_ring, op_comp_tail, rt_kv_seq)
 *               whose byte pointers are device addresses: a request slot's
 *               ring, positions and tail, and the device pages of the host
 *               page ids. rt_dev_bind_node gives a node a struct rt_bound
 *               over them; rt_dev_node_done writes the metadata a node
 *               changed (ring r0, tail count/pos0, n_entries) back to the
 *               host request. A twin's sequences have cap_pages = the pages
 *               reserved, so an append can never take a host page.
 *   regions     (rt_dev_node_regions) the device regions a node binds, with
 *               their access: what the StarPU executor hands a CUDA task as
 *               its buffers (runtime/exec/exec_starpu_data.c) and what a test can
 *               hold against the host binding.
 *   params      (rt_dev_params_fill) struct rt_dev_params for a node's step
 *               from the host metadata: what a CUDA graph replays with.
 *   copies      (rt_dev_copies) every (host, device, bytes) of a request:
 *               rings, positions, tails and the KV pages it holds; uploaded
 *               when a request is claimed, downloaded on demand.
 *   context     (struct rt_dev_ctx) what the engine hangs on rt_model.dev
 *               when a node's home is CUDA: the slabs' addresses, the memory
 *               operations of that home (cudaMemcpy for CUDA, memcpy for the
 *               host-memory stand-in tests use), the weights, the graph
 *               cache and the request slots.
 *
 * The host-memory stand-in (rt_dev_ctx_open_host): the same slabs in host
 * memory and every node bound through the twin, so the CPU backend runs the
 * whole path here (tests/test_devbind.c: bitwise the host-state run). It
 * is a test device, never chosen by a plan.
 *
 * Not here: the layout (devstate.c), cudaMalloc and StarPU's CUDA handles
 * (devstate_cuda.c), the graph cache (cuda_graph.h).
 * Test: tests/test_devbind.c (ctest -R devbind).
 */
#ifndef CEDAR_RUNTIME_DEVBIND_H
#define CEDAR_RUNTIME_DEVBIND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/device/cuda_graph.h"
#include "runtime/device/devstate.h"
#include "runtime/model/model.h"
#include "scheduler/graph.h"

struct rt_cuda_env;    /* runtime/node/backend.h */
struct rt_cuda_model;  /* runtime/device/node_cuda.h */
struct rt_cuda_worker;

/* Where a device state's slabs are (device addresses; host addresses for
 * the stand-in). The rt_dev_* accessors of devstate.h are these sums. */
struct rt_dev_addrs {
  struct rt_dev_layout L;
  uint8_t *kv, *req, *act;
  struct rt_dev_params *params;
};

void *rt_dev_addr_page(const struct rt_dev_addrs *A, int l, int32_t id);
void *rt_dev_addr_ring(const struct rt_dev_addrs *A, int slot, int l);
int64_t *rt_dev_addr_ring_pos(const struct rt_dev_addrs *A, int slot, int l);
float *rt_dev_addr_tail(const struct rt_dev_addrs *A, int slot, int l);

/* One request slot's state seen through device addresses. */
struct rt_dev_twin {
  const struct rt_dev_addrs *A;
  const struct rt_dev_state *state; /* its StarPU handles (a CUDA home), or NULL */
  const struct rt_dev_ctx *ctx;     /* the context it is in */
  int slot;
  int n_layers;
  struct rt_ring ring[PLAN_MAX_LAYERS];
  struct op_comp_tail tail[PLAN_MAX_LAYERS];
  struct rt_kv_seq seq[PLAN_MAX_LAYERS];    /* page_id: the host's ids; page_ptr: device pages */
  struct rt_dev_aux *aux;                  /* the slot's token ids and page tables (below) */
};

/* What a CUDA entry reads from the device besides the slabs (struct
 * rt_cuda_env, rt_bound.kv_r_pages/kv_w_pages), per request slot: one
 * allocation of the context's memory, made the first time the slot is
 * claimed and kept until the context closes (a captured segment bakes its
 * addresses in, keyed by the slot), holding the request's token ids
 * (tok_dev: the layout's slot_tokens of them) and each KV source's page
 * table (pt_dev[l]: device page addresses, as many as the pool has pages).
 * tok_host and pt_host[l] are what the device copies hold, so a sync
 * uploads only what changed (appended ids and pages, or a rolled-back
 * suffix rewritten); a new request in the slot starts from none held. */
struct rt_dev_aux {
  void *mem;
  int32_t *tok_dev;
  int64_t tok_cap, tok_n;
  int32_t *tok_host;
  const uint8_t **pt_dev[PLAN_MAX_LAYERS];
  const uint8_t **pt_host[PLAN_MAX_LAYERS];
  int pt_cap[PLAN_MAX_LAYERS], pt_n[PLAN_MAX_LAYERS];
};

/* rt_bind_node's state for nd, over the twin (device addresses), with
 * kv_r_pages and kv_w_pages the twin's page tables in the context's memory
 * (what a CUDA entry reads; the host stand-in's CPU groups read the same
 * table through kv_r_pages). */
void rt_dev_bind_node(struct rt_dev_twin *t, const struct graph *g, struct rt_request *r, const struct graph_node *nd,
                      struct rt_bound *st);
/* After nd ran on st (rt_dev_bind_node's): the host request's metadata
 * from the twin (ring r0, tail count/pos0, n_entries of the source it
 * appended to). */
void rt_dev_node_done(const struct rt_dev_twin *t, struct rt_request *r, const struct rt_bound *st);

/* Make room in the host page tables for every append of g (in graph
 * order): the StarPU executor at submission (each task's page handles
 * exist before it runs) and a device home (the twin holds every page a
 * node will write). Returns the first node short of pages (the request
 * fails), or -1. */
int rt_reserve_pages(const struct graph *g, struct rt_request *r);

/* ---- the regions a node binds ---------------------------------------------- */

enum rt_dev_region_kind { RT_DEV_RING, RT_DEV_RING_POS, RT_DEV_TAIL, RT_DEV_PAGE };

struct rt_dev_span {
  enum rt_dev_region_kind kind;
  int layer;
  int32_t page;        /* RT_DEV_PAGE: the page id; else -1 */
  void *addr;          /* device address */
  size_t bytes;
  bool write;          /* written by the node (a ring, a tail, a page appended to) */
  bool read_kv;        /* RT_DEV_PAGE: among the pages the node reads (kv_r) */
};

/* The regions node nd of g binds for request r in the twin's slot, in the
 * order of its accesses (a ring's slots then positions; a KV source's pages
 * from the first it reads or appends to, through the last its entry ranges
 * cover). Returns how many, up to cap written (call with cap 0 to count). */
int rt_dev_node_regions(const struct rt_dev_twin *t, const struct graph *g, const struct rt_request *r,
                        const struct graph_node *nd, struct rt_dev_span *out, int cap);

/* ---- the parameter block of a step ---------------------------------------- */

/* struct rt_dev_params for node nd of request r in slot: the node's first
 * position and count, the SWA slots (pos + i) mod window of the node's
 * layer's ring and its first valid position (r0), the page ids of the KV
 * source it reads (else the one it appends to), as many as its entry
 * ranges cover (rt_dev_listed_pages), its tail's count and first position,
 * the entries committed in the source it appends to and the entries it may
 * read, all from r's host metadata before the node. Returns 0 or
 * CEDAR_EINVAL (more than 8 positions, or more pages than
 * RT_DEV_PARAM_MAX_PAGES: a graph segment cannot take that step). */
/* How many pages the block of nd lists (0 when nd has no KV use): a CUDA
 * entry inside a segment sizes its reads by them, and the segment's key
 * holds them. */
int64_t rt_dev_listed_pages(const struct graph *g, const struct rt_request *r, const struct graph_node *nd);
int rt_dev_params_fill(struct rt_dev_params *P, const struct graph *g, const struct rt_request *r, int slot,
                       const struct graph_node *nd, char *err, size_t err_len);

/* ---- copies between the host request and its slot ---------------------------- */

struct rt_dev_copy {
  void *host;
  void *dev;
  size_t bytes;
};

/* ---- the context on rt_model.dev ------------------------------------------- */

/* The memory operations of a device home. h2d/d2h return 0 or a
 * cedar_status with err; they complete before returning. */
struct rt_dev_ops {
  const char *name;    /* "cuda", "host (test stand-in)" */
  int (*h2d)(void *dev, const void *host, size_t bytes, char *err, size_t err_len);
  int (*d2h)(void *host, const void *dev, size_t bytes, char *err, size_t err_len);
  void *(*alloc)(size_t bytes);  /* an activation or bus; NULL when out of memory */
  void (*free)(void *p);
  int (*sync)(char *err, size_t err_len); /* wait for everything launched; NULL: nothing is asynchronous */
};

struct rt_dev_weights;
struct rt_dev_state;

struct rt_dev_ctx {
  const struct rt_dev_ops *ops;
  struct rt_dev_addrs A;
  int dev;                         /* CUDA device; -1 for the stand-in */
  int starpu_node;                 /* StarPU memory node of the slabs (0, main RAM, for the stand-in), -1: none */
  bool all_nodes;                  /* the stand-in: every node binds here, whatever its device */
  struct rt_dev_state *state;      /* CUDA: the slabs and their StarPU handles (devstate_cuda.c) */
  struct rt_dev_weights *weights;  /* CUDA: the weights, uploaded once */
  /* CUDA: what the op groups' entries run on (runtime/device/node_cuda.h), opened
   * by rt_dev_ctx_open_model: the model's device pointers; the direct
   * executor's worker (device scratch and cuBLAS handle); one worker per
   * StarPU CUDA worker on this device, by StarPU worker id (cw_sp[id], NULL
   * for the others; n_cw_sp ids), each with a graph cache of its own
   * (graphs_sp[id]: a capture bakes in its worker's scratch, and a cache
   * serves one replaying stream). All NULL on the stand-in (its nodes run
   * the CPU groups). */
  struct rt_cuda_model *cm;
  struct rt_cuda_worker *cw_direct;
  struct rt_cuda_worker **cw_sp;
  struct rt_cugraph_cache **graphs_sp;
  int n_cw_sp;
  struct rt_cugraph_cache *graphs;   /* CUDA: decode segments (cuda_graph.h); NULL: none */
  bool segments;                   /* run decode steps by layer segment (devseg.h): CUDA with a graph cache; the stand-in calls them in place */
  bool graphs_on;                  /* replay segments as graphs (else eager) */
  int64_t segment_runs;            /* segments run so far (both executors; atomic), for reports and tests */
  struct rt_dev_twin *twin;        /* (L.n_slots) */
  struct rt_dev_aux *aux;          /* (L.n_slots) each slot's token ids and page tables, once claimed */
  struct rt_request **owner;       /* (L.n_slots) the request in each slot, or NULL */
  void *host_slabs;                /* the stand-in's memory */
  /* The stand-in's StarPU handles over its slabs, on main RAM (a CUDA home
   * uses its state's): registered by the StarPU executor the first time it
   * runs on this context (exec_starpu_data.c), released through
   * exec_release by rt_dev_ctx_close or rt_starpu_shutdown. */
  void *exec_data;
  void (*exec_release)(void *exec_data);
};

/* g's activations and buses at fixed offsets of d's activation slab (data
 * id order, each RT_DEV_ALIGN-aligned: the same addresses for every graph
 * of one shape, which a captured segment bakes in), in buf (g->n_data
 * entries, the others untouched): true; false, buf untouched, when the slab
 * cannot hold them all. */
bool rt_dev_act_slab(const struct rt_dev_ctx *d, const struct graph *g, void **buf);

/* Whether node nd binds its state in d (its home is d's device). */
static inline bool rt_dev_home(const struct rt_dev_ctx *d, const struct graph_node *nd) {
  return d && (d->all_nodes || nd->place.dev == GRAPH_DEV_CUDA);
}

/* The host-memory stand-in for layout L (tests). 0 or CEDAR_ENOMEM. */
int rt_dev_ctx_open_host(struct rt_dev_ctx **out, const struct rt_dev_layout *L, char *err, size_t err_len);
/* The context over an open CUDA state (devstate_cuda.c fills A and ops). */
int rt_dev_ctx_open_cuda(struct rt_dev_ctx **out, const struct rt_dev_layout *L, int dev, const struct weights *w,
                         bool graphs, char *err, size_t err_len);
void rt_dev_ctx_close(struct rt_dev_ctx *d);
/* The device model of M over d's weights and the workers with
 * scratch_bytes of device scratch each (devstate_cuda.c): the direct
 * executor's, and one per StarPU CUDA worker on d's device when StarPU is
 * running. 0, or CEDAR_EUNSUPPORTED / CEDAR_ENOMEM / CEDAR_EIO with err. */
int rt_dev_ctx_open_model(struct rt_dev_ctx *d, const struct rt_model *M, size_t scratch_bytes, char *err,
                          size_t err_len);
/* Close what rt_dev_ctx_open_model opened (rt_dev_ctx_close calls it). */
void rt_dev_model_close(struct rt_dev_ctx *d);
/* The struct rt_cuda_env a CUDA node of the twin's request runs with on
 * worker w (a cw_direct or cw_sp entry), in *env; NULL when d has no device
 * model (the stand-in: its CPU groups take none). */
const struct rt_cuda_env *rt_dev_env(const struct rt_dev_ctx *d, const struct rt_dev_twin *t,
                                     struct rt_cuda_worker *w, struct rt_cuda_env *env);

/* r's twin, claiming a free slot and uploading r's state into it the
 * first time r is seen (a restored prefix or a P/D package arrive that
 * way), its metadata synced from r every call. NULL with err when every
 * slot is taken or a copy or sync fails. */
struct rt_dev_twin *rt_dev_request_twin(struct rt_dev_ctx *d, struct rt_request *r, char *err, size_t err_len);
/* r's state bytes from its slot into the host request (the download step
 * before host code reads them). 0 when r holds no slot. */
int rt_dev_request_download(struct rt_dev_ctx *d, struct rt_request *r, char *err, size_t err_len);
/* Download r's state and give its slot back (before rt_request_free). */
int rt_dev_request_release(struct rt_dev_ctx *d, struct rt_request *r, char *err, size_t err_len);

#endif
