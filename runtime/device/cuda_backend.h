/* cuda_backend.h: the CUDA backend (runtime/node/backend.h's table for
 * GRAPH_DEV_CUDA: runtime/device/node_cuda.h's entries in CUDA builds, none
 * without CUDA), its registration into the node dispatch, and whether CUDA
 * can run nodes here.
 * Test: tests/test_backend_nodes.c. */
#ifndef CEDAR_RUNTIME_DEVICE_CUDA_BACKEND_H
#define CEDAR_RUNTIME_DEVICE_CUDA_BACKEND_H

#include <stddef.h>

#include "runtime/node/backend.h"

extern const struct rt_backend rt_backend_cuda;

/* Make rt_backend_for(GRAPH_DEV_CUDA) this table. Idempotent; called by
 * the placement check, rt_cuda_ready and the device home's open. */
void rt_device_register(void);

/* 0 when graph nodes can run on CUDA device 0 here: the build has CUDA,
 * the CUDA runtime sees a device, and rt_backend_cuda has an entry for
 * every op group. Else CEDAR_EUNSUPPORTED with the first reason in err
 * ("no CUDA device: cudaErrorNoDevice: ...", "no CUDA entry for op groups
 * embed, attn, ..."). Used by `cedar run --device cuda`, `cedar env` and
 * the placement check. */
int rt_cuda_ready(char *err, size_t err_len);

#endif
