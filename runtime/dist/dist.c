/* dist.c: the distribution features' node entries, registered into the
 * backend table, and one request through a multi-rank driver with its
 * figures returned (dist.h). */
#include "runtime/dist/dist.h"

#include <string.h>

#include "runtime/device/cuda_backend.h"
#include "runtime/dist/expert_par.h"
#include "runtime/dist/pd.h"
#include "runtime/dist/pipeline.h"
#include "scheduler/plan_place.h"

void rt_dist_register(void) {
  rt_device_register();
  rt_pd_register();   /* TRANSFER: a P/D plan's state package */
  rt_pipe_register(); /* TRANSFER: a stage boundary's copy */
  rt_ep_register();   /* expert parallel: route, dispatch and combine, shards, sum */
}

void rt_dist_report_free(struct rt_dist_report *rep) {
  rt_pd_trace_free(&rep->pd_trace);
  memset(rep, 0, sizeof *rep);
}

int rt_dist_generate(enum graph_run run, const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r,
                     const int32_t *prompt, int64_t n, const struct rt_gen_opts *o, struct rt_gen_result *res,
                     struct rt_dist_report *rep, char *err, size_t err_len) {
  rt_dist_report_free(rep);
  const struct plan *p = M->p;
  /* the pipeline driver runs the ranks (for experts too): its per-rank figures go straight into rep */
  struct rt_pipe_figs figs = {&rep->pipe_stats, &rep->ep_stats, &rep->pd_trace};
  int rc = run == GRAPH_RUN_PD ? rt_pd_generate(M, pools, r, prompt, n, o, res, &rep->pd_stats, &figs, err, err_len)
                               : rt_pipe_generate(M, pools, r, prompt, n, o, &figs, res, err, err_len);
  rep->pd = run == GRAPH_RUN_PD;
  rep->pipe = plan_has_stages(p);
  rep->ep = p->serving.place.n_ep_ranks > 0;
  return rc;
}
