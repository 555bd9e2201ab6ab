/* cuda_graph_cuda.c: runtime/device/cuda_graph.h with the CUDA runtime API (host
 * code only; the kernels a segment launches live in kernels/).
 *
 * Keys are kept in a small array searched linearly: a decode step has one
 * key per layer segment and shape, tens at most. Each key owns a device
 * parameter block (cudaMalloc) and, once captured, a cudaGraphExec_t. The
 * capture stream is created once per cache (cudaStreamNonBlocking) and
 * captured in cudaStreamCaptureModeRelaxed. A replay is two stream-ordered
 * calls on the caller's stream: cudaMemcpyAsync of the step's parameters
 * into the block (from a pinned staging copy, so the call does not wait
 * for the host buffer) and cudaGraphLaunch.
 *
 * The pinned staging buffer of a key is rewritten by the next run of that
 * key only after the previous copy out of it has completed (an event per
 * key recorded after the copy), so hp may be reused on return.
 *
 * Test: tests/gpu/test_gpu_graph.cu (on a GPU; exits 77 here).
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "runtime/device/cuda_graph.h"

struct entry {
  struct rt_cugraph_key key;
  void *dparams;        /* device block */
  void *staging;        /* pinned host copy of the last parameters */
  cudaEvent_t copied;   /* recorded after the last copy out of staging */
  cudaGraphExec_t exec; /* NULL until captured */
};

struct rt_cugraph_cache {
  int dev;
  size_t param_bytes;
  cudaStream_t capture;
  struct entry *e;
  int n, cap;
  struct rt_cugraph_stats st;
};

static int fail(cudaError_t e, const char *call, char *err, size_t err_len) {
  (void)cudaGetLastError();
  snprintf(err, err_len, "%s: %s (%d) from %s", cudaGetErrorName(e), cudaGetErrorString(e), (int)e, call);
  return e == cudaErrorMemoryAllocation ? CEDAR_ENOMEM : CEDAR_EUNSUPPORTED;
}

#define TRY(call)                                                      \
  do {                                                                 \
    cudaError_t _e = (call);                                           \
    if (_e != cudaSuccess) return fail(_e, #call, err, err_len);       \
  } while (0)

int rt_cugraph_cache_open(struct rt_cugraph_cache **out, int dev, size_t param_bytes, char *err, size_t err_len) {
  *out = NULL;
  int n = 0;
  TRY(cudaGetDeviceCount(&n));
  if (dev < 0 || dev >= n) {
    snprintf(err, err_len, "CUDA device %d does not exist (this machine has %d)", dev, n);
    return CEDAR_EUNSUPPORTED;
  }
  TRY(cudaSetDevice(dev));
  struct rt_cugraph_cache *c = cedar_xcalloc(1, sizeof(*c));
  c->dev = dev;
  c->param_bytes = param_bytes;
  cudaError_t e = cudaStreamCreateWithFlags(&c->capture, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    free(c);
    return fail(e, "cudaStreamCreateWithFlags", err, err_len);
  }
  *out = c;
  return 0;
}

void rt_cugraph_cache_close(struct rt_cugraph_cache *c) {
  if (!c) return;
  cudaSetDevice(c->dev);
  for (int i = 0; i < c->n; i++) {
    if (c->e[i].exec) cudaGraphExecDestroy(c->e[i].exec);
    if (c->e[i].copied) {
      cudaEventSynchronize(c->e[i].copied);
      cudaEventDestroy(c->e[i].copied);
    }
    cudaFree(c->e[i].dparams);
    cudaFreeHost(c->e[i].staging);
  }
  free(c->e);
  cudaStreamDestroy(c->capture);
  free(c);
}

static struct entry *find(struct rt_cugraph_cache *c, const struct rt_cugraph_key *k) {
  for (int i = 0; i < c->n; i++)
    if (!memcmp(&c->e[i].key, k, sizeof(*k))) return &c->e[i];
  return NULL;
}

static struct entry *find_or_add(struct rt_cugraph_cache *c, const struct rt_cugraph_key *k, char *err, size_t err_len) {
  struct entry *en = find(c, k);
  if (en) return en;
  if (c->n == c->cap) {
    c->cap = c->cap ? 2 * c->cap : 16;
    c->e = cedar_xrealloc(c->e, sizeof(*c->e) * (size_t)c->cap);
  }
  en = &c->e[c->n];
  memset(en, 0, sizeof(*en));
  en->key = *k;
  cudaError_t e = cudaMalloc(&en->dparams, c->param_bytes ? c->param_bytes : 1);
  if (e == cudaSuccess) e = cudaMallocHost(&en->staging, c->param_bytes ? c->param_bytes : 1);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&en->copied, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    fail(e, "allocating a graph's parameter block", err, err_len);
    cudaFree(en->dparams);
    cudaFreeHost(en->staging);
    return NULL;
  }
  c->n++;
  return en;
}

void *rt_cugraph_params(struct rt_cugraph_cache *c, const struct rt_cugraph_key *k) {
  char err[256];
  struct entry *en = find_or_add(c, k, err, sizeof err);
  return en ? en->dparams : NULL;
}

/* Capture fn once on the cache's own stream and instantiate it. */
static int capture(struct rt_cugraph_cache *c, struct entry *en, rt_segment_fn fn, void *arg, char *err,
                   size_t err_len) {
  TRY(cudaStreamBeginCapture(c->capture, cudaStreamCaptureModeRelaxed));
  int rc = fn((void *)c->capture, en->dparams, arg);
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(c->capture, &g);
  if (rc) {
    if (g) cudaGraphDestroy(g);
    snprintf(err, err_len, "segment %d failed while being captured (%s)", en->key.segment, cedar_status_str(rc));
    return rc;
  }
  if (e != cudaSuccess) return fail(e, "cudaStreamEndCapture (the segment synchronized or used another stream)", err,
                                    err_len);
  e = cudaGraphInstantiate(&en->exec, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) return fail(e, "cudaGraphInstantiate", err, err_len);
  c->st.captures++;
  return 0;
}

int rt_cugraph_run(struct rt_cugraph_cache *c, const struct rt_cugraph_key *k, rt_segment_fn fn, void *arg,
                 const void *hp, void *stream, bool graph, char *err, size_t err_len) {
  cudaStream_t s = (cudaStream_t)stream;
  struct entry *en = find_or_add(c, k, err, err_len);
  if (!en) return CEDAR_ENOMEM;
  TRY(cudaEventSynchronize(en->copied)); /* the previous copy out of staging is done */
  memcpy(en->staging, hp, c->param_bytes);
  TRY(cudaMemcpyAsync(en->dparams, en->staging, c->param_bytes, cudaMemcpyHostToDevice, s));
  TRY(cudaEventRecord(en->copied, s));
  if (!graph) {
    c->st.eager_runs++;
    return fn(stream, en->dparams, arg);
  }
  if (!en->exec) {
    int rc = capture(c, en, fn, arg, err, err_len);
    if (rc) return rc;
  }
  TRY(cudaGraphLaunch(en->exec, s));
  c->st.replays++;
  return 0;
}

struct rt_cugraph_stats rt_cugraph_cache_stats(const struct rt_cugraph_cache *c) { return c->st; }
