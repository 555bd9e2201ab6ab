/* dist.c: the distribution features' node entries, registered into the
 * backend table (dist.h). */
#include "runtime/dist/dist.h"

#include "runtime/device/cuda_backend.h"
#include "runtime/dist/expert_par.h"
#include "runtime/dist/pd.h"
#include "runtime/dist/pipeline.h"

void rt_dist_register(void) {
  rt_device_register();
  rt_pd_register();   /* TRANSFER: a P/D plan's state package */
  rt_pipe_register(); /* TRANSFER: a stage boundary's copy */
  rt_ep_register();   /* expert parallel: route, dispatch and combine, shards, sum */
}
