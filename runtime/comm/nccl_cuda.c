/* runtime/comm/nccl_cuda.c: runtime/comm/nccl.h in CUDA builds: NCCL communicators over
 * two devices and the send/receive StarPU tasks (see the header for the
 * design). Compiled with NCCL when CMake finds it (CEDAR_HAVE_NCCL) and
 * the tasks with a StarPU built with CUDA (STARPU_USE_CUDA); otherwise the
 * calls refuse, naming what is missing.
 *
 * What has run: nothing; it compiles here. It needs two GPUs in one node.
 */
#include <cuda_runtime_api.h>
#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/check.h"
#include "runtime/comm/nccl.h"

#ifdef CEDAR_HAVE_NCCL
#include <nccl.h>

struct comm_nccl_pair {
  int dev[2];      /* src, dst */
  ncclComm_t comm[2];
  int worker[2];   /* StarPU CUDA worker of each device, -1 none */
};

static int nccl_fail(ncclResult_t r, const char *call, char *err, size_t err_len) {
  snprintf(err, err_len, "%s: %s", call, ncclGetErrorString(r));
  return CEDAR_EUNSUPPORTED;
}

static int worker_of(int dev) {
  if (!starpu_is_initialized()) return -1;
  int ids[STARPU_NMAXWORKERS];
  int n = starpu_worker_get_ids_by_type(STARPU_CUDA_WORKER, ids, STARPU_NMAXWORKERS);
  for (int i = 0; i < n; i++)
    if (starpu_worker_get_devid(ids[i]) == dev) return ids[i];
  return -1;
}

int comm_nccl_open(struct comm_nccl_pair **out, int src_dev, int dst_dev, char *err, size_t err_len) {
  *out = NULL;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(err, err_len, "%s: %s from cudaGetDeviceCount", cudaGetErrorName(e), cudaGetErrorString(e));
    return CEDAR_EUNSUPPORTED;
  }
  if (src_dev == dst_dev || src_dev < 0 || dst_dev < 0 || src_dev >= n || dst_dev >= n) {
    snprintf(err, err_len, "an NCCL transfer needs two distinct CUDA devices; asked for %d and %d of %d", src_dev,
             dst_dev, n);
    return CEDAR_EUNSUPPORTED;
  }
  struct comm_nccl_pair *p = cedar_xcalloc(1, sizeof(*p));
  p->dev[0] = src_dev;
  p->dev[1] = dst_dev;
  ncclResult_t r = ncclCommInitAll(p->comm, 2, p->dev);
  if (r != ncclSuccess) {
    free(p);
    return nccl_fail(r, "ncclCommInitAll", err, err_len);
  }
  p->worker[0] = worker_of(src_dev);
  p->worker[1] = worker_of(dst_dev);
  *out = p;
  return 0;
}

void comm_nccl_close(struct comm_nccl_pair *p) {
  if (!p) return;
  for (int i = 0; i < 2; i++) ncclCommDestroy(p->comm[i]);
  free(p);
}

#ifdef STARPU_USE_CUDA
struct side {
  struct comm_nccl_pair *p;
  size_t bytes;
};

/* Rank 0 is the source device, rank 1 the destination (ncclCommInitAll's
 * order); each task enqueues on its worker's stream and returns. */
static void send_cuda(void *buffers[], void *cl_arg) {
  struct side *s = cl_arg;
  ncclResult_t r = ncclSend((const void *)STARPU_VARIABLE_GET_PTR(buffers[0]), s->bytes, ncclUint8, 1,
                            s->p->comm[0], starpu_cuda_get_local_stream());
  CEDAR_ASSERT_MSG(r == ncclSuccess, "ncclSend: %s", ncclGetErrorString(r));
}

static void recv_cuda(void *buffers[], void *cl_arg) {
  struct side *s = cl_arg;
  ncclResult_t r = ncclRecv((void *)STARPU_VARIABLE_GET_PTR(buffers[0]), s->bytes, ncclUint8, 0, s->p->comm[1],
                            starpu_cuda_get_local_stream());
  CEDAR_ASSERT_MSG(r == ncclSuccess, "ncclRecv: %s", ncclGetErrorString(r));
}

static struct starpu_codelet send_cl = {
    .cuda_funcs = {send_cuda}, .cuda_flags = {STARPU_CUDA_ASYNC}, .nbuffers = 1, .modes = {STARPU_R},
    .name = "pd.nccl_send"};
static struct starpu_codelet recv_cl = {
    .cuda_funcs = {recv_cuda}, .cuda_flags = {STARPU_CUDA_ASYNC}, .nbuffers = 1, .modes = {STARPU_W},
    .name = "pd.nccl_recv"};

static int submit_side(struct starpu_codelet *cl, int worker, void *h, struct side *arg) {
  struct starpu_task *t = starpu_task_create();
  t->cl = cl;
  t->handles[0] = (starpu_data_handle_t)h;
  t->cl_arg = arg;
  t->cl_arg_size = sizeof(*arg);
  t->cl_arg_free = 1;
  t->execute_on_a_specific_worker = 1;
  t->workerid = (unsigned)worker;
  return starpu_task_submit(t);
}

int comm_nccl_submit(struct comm_nccl_pair *p, void *src_handle, void *dst_handle, size_t bytes, char *err,
                   size_t err_len) {
  if (p->worker[0] < 0 || p->worker[1] < 0) {
    snprintf(err, err_len, "StarPU runs no CUDA worker on device %d: an NCCL transfer runs on both devices' workers",
             p->worker[0] < 0 ? p->dev[0] : p->dev[1]);
    return CEDAR_EUNSUPPORTED;
  }
  struct side *a = cedar_xmalloc(sizeof(*a)), *b = cedar_xmalloc(sizeof(*b));
  *a = (struct side){p, bytes};
  *b = *a;
  if (submit_side(&send_cl, p->worker[0], src_handle, a) || submit_side(&recv_cl, p->worker[1], dst_handle, b)) {
    snprintf(err, err_len, "starpu_task_submit refused an NCCL transfer task");
    return CEDAR_EUNSUPPORTED;
  }
  return 0;
}

int comm_nccl_built(void) { return 1; }
#else /* NCCL, but a StarPU without CUDA workers */
int comm_nccl_submit(struct comm_nccl_pair *p, void *src_handle, void *dst_handle, size_t bytes, char *err,
                   size_t err_len) {
  (void)p, (void)src_handle, (void)dst_handle, (void)bytes;
  snprintf(err, err_len, "this StarPU has no CUDA workers (Debian's is CPU-only): build .ci/starpu-cuda.sh and "
           "configure cedar against it to run NCCL transfer tasks");
  return CEDAR_EUNSUPPORTED;
}
int comm_nccl_built(void) { return 0; }
#endif

#else /* no NCCL */
int comm_nccl_open(struct comm_nccl_pair **out, int src_dev, int dst_dev, char *err, size_t err_len) {
  (void)src_dev, (void)dst_dev;
  *out = NULL;
  snprintf(err, err_len, "built without NCCL (CMake found no libnccl beside CUDA; -DCEDAR_NCCL=ON with NCCL "
           "installed enables it)");
  return CEDAR_EUNSUPPORTED;
}
void comm_nccl_close(struct comm_nccl_pair *p) { (void)p; }
int comm_nccl_submit(struct comm_nccl_pair *p, void *src_handle, void *dst_handle, size_t bytes, char *err,
                   size_t err_len) {
  (void)p, (void)src_handle, (void)dst_handle, (void)bytes;
  snprintf(err, err_len, "built without NCCL");
  return CEDAR_EUNSUPPORTED;
}
int comm_nccl_built(void) { return 0; }
#endif
