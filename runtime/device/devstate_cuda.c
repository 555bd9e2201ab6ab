/* devstate_cuda.c: the device half of runtime/device/devstate.h (CUDA builds):
 * the slabs with cudaMalloc (never managed memory), the weights uploaded
 * once, and StarPU variable data over pages and rings on the CUDA memory
 * node of the device.
 *
 * StarPU's memory node of device dev is the memory node of the CUDA worker
 * whose devid is dev; Debian's StarPU has no CUDA workers, so there the open
 * is refused with the reason and the fix (.ci/starpu-cuda.sh). Handles are
 * registered with the device address as their home, so a task on that
 * worker reads the bytes in place; they are unregistered without a copy
 * back (starpu_data_unregister_no_coherency) before the memory is freed.
 *
 * What has run: compiled here (CUDA 13, Debian's StarPU and StarPU-CUDA);
 * exercised on a GPU by tests/gpu/run.sh (tests/gpu/test_gpu_state.c).
 */
#include <cuda_runtime_api.h>
#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "runtime/device/devbind.h"
#include "runtime/device/devstate.h"
#include "ops/qweight.h"
#include "runtime/device/node_cuda.h"

struct rt_dev_state {
  struct rt_dev_layout L;
  int dev, node;
  uint8_t *kv, *req, *act;
  struct rt_dev_params *params;
  starpu_data_handle_t *page_h[PLAN_MAX_LAYERS]; /* (pages[l]) */
  starpu_data_handle_t *ring_h;                  /* (n_slots * n_layers) */
  starpu_data_handle_t *pos_h, *tail_h;          /* (n_slots * n_layers): ring positions, tails */
  struct rt_dev_addrs A;                         /* the same slabs, for devbind.h */
};

struct rt_dev_weights {
  const struct weights_list *list;
  uint8_t *slab;
  size_t *off; /* (list->n) */
  size_t bytes;
};

/* "cudaErrorMemoryAllocation: out of memory (2) from cudaMalloc(...)". */
static int cuda_fail(cudaError_t e, const char *what, int rc, char *err, size_t err_len) {
  (void)cudaGetLastError();
  snprintf(err, err_len, "%s: %s (%d) from %s", cudaGetErrorName(e), cudaGetErrorString(e), (int)e, what);
  return rc;
}

static int use_device(int dev, char *err, size_t err_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return cuda_fail(e, "cudaGetDeviceCount", CEDAR_EUNSUPPORTED, err, err_len);
  if (dev < 0 || dev >= n) {
    snprintf(err, err_len, "CUDA device %d does not exist (this machine has %d)", dev, n);
    return CEDAR_EUNSUPPORTED;
  }
  e = cudaSetDevice(dev);
  if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice", CEDAR_EUNSUPPORTED, err, err_len);
  return 0;
}

static int dev_alloc(void **p, size_t bytes, const char *what, char *err, size_t err_len) {
  *p = NULL;
  if (!bytes) return 0;
  cudaError_t e = cudaMalloc(p, bytes);
  if (e != cudaSuccess) {
    char call[96];
    snprintf(call, sizeof call, "cudaMalloc(%zu bytes: %s)", bytes, what);
    return cuda_fail(e, call, CEDAR_ENOMEM, err, err_len);
  }
  return 0;
}

/* The memory node of the CUDA worker on device dev; -1 when StarPU runs none. */
static int starpu_node_of(int dev) {
  if (!starpu_is_initialized()) return -1;
  int ids[STARPU_NMAXWORKERS];
  int n = starpu_worker_get_ids_by_type(STARPU_CUDA_WORKER, ids, STARPU_NMAXWORKERS);
  for (int i = 0; i < n; i++)
    if (starpu_worker_get_devid(ids[i]) == dev) return (int)starpu_worker_get_memory_node(ids[i]);
  return -1;
}

int rt_dev_state_open(struct rt_dev_state **out, const struct rt_dev_layout *L, int dev, char *err, size_t err_len) {
  *out = NULL;
  int rc = use_device(dev, err, err_len);
  if (rc) return rc;
  int node = starpu_node_of(dev);
  if (node < 0 && starpu_is_initialized()) { /* StarPU is up but could not reach the slabs */
    snprintf(err, err_len, "StarPU runs no CUDA worker on device %d (%s); the device state needs StarPU built with "
             "CUDA: .ci/starpu-cuda.sh, then configure cedar with PKG_CONFIG_PATH=.deps/starpu-cuda/lib/pkgconfig",
             dev, starpu_is_initialized() ? "STARPU_NCUDA=0, or this StarPU was built without CUDA" :
                                            "StarPU is not initialized");
    return CEDAR_EUNSUPPORTED;
  }
  struct rt_dev_state *s = cedar_xcalloc(1, sizeof(*s));
  s->L = *L;
  s->dev = dev;
  s->node = node;
  if ((rc = dev_alloc((void **)&s->kv, L->kv_total, "KV page pools", err, err_len)) ||
      (rc = dev_alloc((void **)&s->req, L->req_total, "request rings and tails", err, err_len)) ||
      (rc = dev_alloc((void **)&s->act, L->act_total, "activations", err, err_len)) ||
      (rc = dev_alloc((void **)&s->params, L->param_bytes, "parameter block", err, err_len))) {
    rt_dev_state_close(s);
    return rc;
  }
  s->A = (struct rt_dev_addrs){*L, s->kv, s->req, s->act, s->params};
  /* Empty rings: every position -1 (all bytes 0xff), as rt_ring_reset. */
  for (int slot = 0; slot < L->n_slots; slot++)
    for (int l = 0; l < L->n_layers; l++)
      if (L->ring_pos[l].bytes) cudaMemset(rt_dev_ring_pos(s, slot, l), 0xff, L->ring_pos[l].bytes);
  for (int l = 0; node >= 0 && l < L->n_layers; l++) { /* StarPU not started (the direct executor): no handles */
    if (!L->pages[l]) continue;
    s->page_h[l] = cedar_xcalloc((size_t)L->pages[l], sizeof(starpu_data_handle_t));
    for (int id = 0; id < L->pages[l]; id++)
      starpu_variable_data_register(&s->page_h[l][id], node, (uintptr_t)rt_dev_page(s, l, id), L->page_bytes[l]);
  }
  size_t n_rq = (size_t)L->n_slots * (size_t)L->n_layers;
  s->ring_h = cedar_xcalloc(n_rq, sizeof(starpu_data_handle_t));
  s->pos_h = cedar_xcalloc(n_rq, sizeof(starpu_data_handle_t));
  s->tail_h = cedar_xcalloc(n_rq, sizeof(starpu_data_handle_t));
  for (int slot = 0; node >= 0 && slot < L->n_slots; slot++)
    for (int l = 0; l < L->n_layers; l++) {
      int i = slot * L->n_layers + l;
      if (L->ring[l].bytes) {
        starpu_variable_data_register(&s->ring_h[i], node, (uintptr_t)rt_dev_ring(s, slot, l), L->ring[l].bytes);
        starpu_variable_data_register(&s->pos_h[i], node, (uintptr_t)rt_dev_ring_pos(s, slot, l), L->ring_pos[l].bytes);
      }
      if (L->tail[l].bytes)
        starpu_variable_data_register(&s->tail_h[i], node, (uintptr_t)rt_dev_tail(s, slot, l), L->tail[l].bytes);
    }
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    rt_dev_state_close(s);
    return cuda_fail(e, "cudaDeviceSynchronize after the state's memsets", CEDAR_EUNSUPPORTED, err, err_len);
  }
  *out = s;
  return 0;
}

void rt_dev_state_close(struct rt_dev_state *s) {
  if (!s) return;
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) {
    for (int id = 0; s->page_h[l] && id < s->L.pages[l]; id++)
      if (s->page_h[l][id]) starpu_data_unregister_no_coherency(s->page_h[l][id]);
    free(s->page_h[l]);
  }
  for (int i = 0; s->ring_h && i < s->L.n_slots * s->L.n_layers; i++) {
    if (s->ring_h[i]) starpu_data_unregister_no_coherency(s->ring_h[i]);
    if (s->pos_h[i]) starpu_data_unregister_no_coherency(s->pos_h[i]);
    if (s->tail_h[i]) starpu_data_unregister_no_coherency(s->tail_h[i]);
  }
  free(s->ring_h);
  free(s->pos_h);
  free(s->tail_h);
  cudaFree(s->kv);
  cudaFree(s->req);
  cudaFree(s->act);
  cudaFree(s->params);
  free(s);
}

void *rt_dev_page(const struct rt_dev_state *s, int l, int32_t id) { return rt_dev_addr_page(&s->A, l, id); }
void *rt_dev_ring(const struct rt_dev_state *s, int slot, int l) { return rt_dev_addr_ring(&s->A, slot, l); }
int64_t *rt_dev_ring_pos(const struct rt_dev_state *s, int slot, int l) { return rt_dev_addr_ring_pos(&s->A, slot, l); }
float *rt_dev_tail(const struct rt_dev_state *s, int slot, int l) { return rt_dev_addr_tail(&s->A, slot, l); }
void *rt_dev_act(const struct rt_dev_state *s) { return s->act; }
struct rt_dev_params *rt_dev_param_block(const struct rt_dev_state *s) { return s->params; }
int rt_dev_state_node(const struct rt_dev_state *s) { return s->node; }

void *rt_dev_page_handle(const struct rt_dev_state *s, int l, int32_t id) {
  return s->page_h[l] && id >= 0 && id < s->L.pages[l] ? s->page_h[l][id] : NULL;
}

void *rt_dev_ring_handle(const struct rt_dev_state *s, int slot, int l) {
  if (!s->ring_h || slot < 0 || slot >= s->L.n_slots) return NULL;
  return s->ring_h[slot * s->L.n_layers + l];
}

void *rt_dev_ring_pos_handle(const struct rt_dev_state *s, int slot, int l) {
  if (!s->pos_h || slot < 0 || slot >= s->L.n_slots) return NULL;
  return s->pos_h[slot * s->L.n_layers + l];
}

void *rt_dev_tail_handle(const struct rt_dev_state *s, int slot, int l) {
  if (!s->tail_h || slot < 0 || slot >= s->L.n_slots) return NULL;
  return s->tail_h[slot * s->L.n_layers + l];
}

int rt_dev_weights_upload(struct rt_dev_weights **out, const struct weights *w, int dev, char *err, size_t err_len) {
  *out = NULL;
  /* Whole tensors only: a rank's part (weights.h: weights_part) holds some
   * rows, and the mmap tier's split Engram tables (engram_scales) keep
   * values and scales apart in the shards; copying nbytes from either
   * would read past what is there. */
  if (w->part || w->engram_scales)
    return snprintf(err, err_len, "weights on a CUDA device need every tensor whole in memory: %s",
                    w->part ? "this rank holds only its experts (expert parallel under mpirun)"
                            : "serving.engram.tier: mmap keeps the Engram tables in the files; use tier: memory"),
           CEDAR_EUNSUPPORTED;
  int rc = use_device(dev, err, err_len);
  if (rc) return rc;
  struct rt_dev_weights *dw = cedar_xcalloc(1, sizeof(*dw));
  dw->list = &w->list;
  dw->off = cedar_xcalloc(w->list.n ? w->list.n : 1, sizeof(size_t));
  for (size_t i = 0; i < w->list.n; i++) {
    dw->off[i] = dw->bytes;
    dw->bytes += (w->list.t[i].nbytes + RT_DEV_ALIGN - 1) / RT_DEV_ALIGN * RT_DEV_ALIGN;
  }
  if ((rc = dev_alloc((void **)&dw->slab, dw->bytes, "weights", err, err_len))) {
    rt_dev_weights_free(dw);
    return rc;
  }
  for (size_t i = 0; i < w->list.n; i++) {
    /* A tensor held in a stored format (weights_hold_stored) goes up as its
     * F32 values: the device kernels read F32 weights (kernels/qlinear.cu's
     * stored-format twin is not wired into the device nodes yet), so device
     * memory for them is the F32 size, not the stored bytes. */
    float *f32 = NULL;
    const void *src = w->data[i];
    if (weights_fmt_at(w, i) != OP_W_F32) {
      f32 = malloc(w->list.t[i].nbytes + 1);
      if (!f32) {
        rt_dev_weights_free(dw);
        return snprintf(err, err_len, "out of host memory dequantizing weight %s for the device", w->list.t[i].name),
               CEDAR_ENOMEM;
      }
      weights_f32_values(w, i, f32);
      src = f32;
    }
    cudaError_t e = cudaMemcpy(dw->slab + dw->off[i], src, w->list.t[i].nbytes, cudaMemcpyHostToDevice);
    free(f32);
    if (e != cudaSuccess) {
      char call[WEIGHTS_NAME_MAX + 48];
      snprintf(call, sizeof call, "cudaMemcpy of weight %s", w->list.t[i].name);
      rt_dev_weights_free(dw);
      return cuda_fail(e, call, CEDAR_EUNSUPPORTED, err, err_len);
    }
  }
  *out = dw;
  return 0;
}

const void *rt_dev_weights_get(const struct rt_dev_weights *dw, const char *name) {
  const struct weights_spec *sp = weights_list_find(dw->list, name);
  return sp ? dw->slab + dw->off[sp - dw->list->t] : NULL;
}

size_t rt_dev_weights_bytes(const struct rt_dev_weights *dw) { return dw->bytes; }

void rt_dev_weights_free(struct rt_dev_weights *dw) {
  if (!dw) return;
  cudaFree(dw->slab);
  free(dw->off);
  free(dw);
}

/* ---- the context on rt_model.dev (devbind.h) ---------------------------------- */

static int cuda_h2d(void *dev, const void *host, size_t bytes, char *err, size_t err_len) {
  cudaError_t e = cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
  return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemcpy (upload of a request's state)", CEDAR_EIO, err, err_len);
}

static int cuda_d2h(void *host, const void *dev, size_t bytes, char *err, size_t err_len) {
  cudaError_t e = cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemcpy (download of a request's state)", CEDAR_EIO, err, err_len);
}

static void *cuda_alloc(size_t bytes) {
  void *p = NULL;
  return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

static void cuda_free(void *p) { cudaFree(p); }

static int cuda_sync(char *err, size_t err_len) {
  cudaError_t e = cudaDeviceSynchronize();
  return e == cudaSuccess ? 0 : cuda_fail(e, "cudaDeviceSynchronize after a graph", CEDAR_EIO, err, err_len);
}

static const struct rt_dev_ops cuda_ops = {
    .name = "cuda", .h2d = cuda_h2d, .d2h = cuda_d2h, .alloc = cuda_alloc, .free = cuda_free, .sync = cuda_sync};

int rt_dev_ctx_open_cuda(struct rt_dev_ctx **out, const struct rt_dev_layout *L, int dev, const struct weights *w,
                         bool graphs, char *err, size_t err_len) {
  *out = NULL;
  struct rt_dev_ctx *d = cedar_xcalloc(1, sizeof(*d));
  d->ops = &cuda_ops;
  d->dev = dev;
  d->starpu_node = -1;
  int rc = rt_dev_state_open(&d->state, L, dev, err, err_len);
  if (!rc) rc = rt_dev_weights_upload(&d->weights, w, dev, err, err_len);
  if (!rc) rc = rt_cugraph_cache_open(&d->graphs, dev, sizeof(struct rt_dev_params), err, err_len);
  if (rc) {
    rt_dev_ctx_close(d);
    return rc;
  }
  d->A = d->state->A;
  d->starpu_node = d->state->node;
  d->segments = true;
  d->graphs_on = graphs;
  d->twin = cedar_xcalloc((size_t)L->n_slots, sizeof(*d->twin));
  d->aux = cedar_xcalloc((size_t)L->n_slots, sizeof(*d->aux));
  d->owner = cedar_xcalloc((size_t)L->n_slots, sizeof(*d->owner));
  *out = d;
  return 0;
}

/* ---- the device model and the workers (devbind.h) ------------------------------ */

int rt_dev_ctx_open_model(struct rt_dev_ctx *d, const struct rt_model *M, size_t scratch_bytes, char *err,
                          size_t err_len) {
  int rc = rt_cuda_model_open(&d->cm, M, d->weights, d->dev, err, err_len);
  if (!rc) rc = rt_cuda_worker_open(&d->cw_direct, d->dev, scratch_bytes, err, err_len);
  if (!rc && starpu_is_initialized()) { /* a worker per StarPU CUDA worker on the device: its stream's nodes */
    int ids[STARPU_NMAXWORKERS];
    int n = starpu_worker_get_ids_by_type(STARPU_CUDA_WORKER, ids, STARPU_NMAXWORKERS);
    d->n_cw_sp = (int)starpu_worker_get_count();
    d->cw_sp = cedar_xcalloc((size_t)(d->n_cw_sp > 0 ? d->n_cw_sp : 1), sizeof(*d->cw_sp));
    d->graphs_sp = cedar_xcalloc((size_t)(d->n_cw_sp > 0 ? d->n_cw_sp : 1), sizeof(*d->graphs_sp));
    for (int i = 0; i < n && !rc; i++)
      if (starpu_worker_get_devid(ids[i]) == d->dev && ids[i] < d->n_cw_sp) {
        rc = rt_cuda_worker_open(&d->cw_sp[ids[i]], d->dev, scratch_bytes, err, err_len);
        if (!rc) rc = rt_cugraph_cache_open(&d->graphs_sp[ids[i]], d->dev, sizeof(struct rt_dev_params), err, err_len);
      }
  }
  if (rc) rt_dev_model_close(d);
  return rc;
}

void rt_dev_model_close(struct rt_dev_ctx *d) {
  for (int i = 0; i < d->n_cw_sp; i++) {
    rt_cuda_worker_close(d->cw_sp[i]);
    rt_cugraph_cache_close(d->graphs_sp[i]);
  }
  free(d->cw_sp);
  free(d->graphs_sp);
  d->graphs_sp = NULL;
  rt_cuda_worker_close(d->cw_direct);
  rt_cuda_model_close(d->cm);
  d->cw_sp = NULL;
  d->n_cw_sp = 0;
  d->cw_direct = NULL;
  d->cm = NULL;
}
