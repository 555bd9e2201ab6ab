/* runtime/comm/nccl.h: P->D KV transfer between two GPUs of one node over NCCL
 * (issue 15). When a P/D plan's prefill and decode homes are both CUDA
 * memory in one process, the package (runtime/dist/pd.h) moves device to device
 * as an NCCL send on the prefill GPU and an NCCL receive on the decode GPU;
 * between nodes StarPU-MPI carries it as before (runtime/comm/comm_mpi.c).
 *
 * A pair holds one communicator per device (ncclCommInitAll over the two).
 * comm_nccl_submit is two StarPU tasks, each pinned to the CUDA worker of its
 * device and STARPU_CUDA_ASYNC: ncclSend(src handle) on the prefill worker's
 * stream and ncclRecv(dst handle) on the decode worker's stream. Each task
 * enqueues and returns; the pair of NCCL kernels meets on the GPUs. The
 * receive's handle is written (STARPU_W), so decode tasks reading it are
 * ordered after it by StarPU.
 *
 * What has run: compiled against NCCL 2 (CUDA 13's) here; never run: the
 * lent GPU machine has one GPU, and NCCL send/recv needs two.
 * Builds without NCCL, or against a StarPU without CUDA, refuse with why.
 */
#ifndef CEDAR_RUNTIME_PD_NCCL_H
#define CEDAR_RUNTIME_PD_NCCL_H

#include <stddef.h>

struct comm_nccl_pair;

/* Communicators for devices src and dst (src != dst). Returns 0 or
 * CEDAR_EUNSUPPORTED (no NCCL or CUDA in this build, a device missing, an
 * NCCL error: err says which). */
int comm_nccl_open(struct comm_nccl_pair **out, int src_dev, int dst_dev, char *err, size_t err_len);
void comm_nccl_close(struct comm_nccl_pair *p);

/* Submit the transfer of bytes from StarPU data src (home: src_dev's CUDA
 * memory node) to dst (dst_dev's) as a send task and a receive task.
 * Returns 0 once both are submitted, or CEDAR_EUNSUPPORTED with err. */
int comm_nccl_submit(struct comm_nccl_pair *p, void *src_handle, void *dst_handle, size_t bytes, char *err,
                   size_t err_len);

/* Whether this build has NCCL (and a StarPU with CUDA to run its tasks). */
int comm_nccl_built(void);

#endif
