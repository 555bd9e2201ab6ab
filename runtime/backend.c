/* backend.c: the backend table by device kind, the CUDA backend's table,
 * whether CUDA can run nodes here (rt_cuda_ready), and the placement check
 * (backend.h). The CPU backend's entries live with
 * the dispatch they share with every executor, in exec_node.c. */
#include "runtime/backend.h"

#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "kernels/device.h"
#include "runtime/node_cuda.h"
#include "runtime/pd.h"
#include "runtime/pipeline.h"

/* The CUDA op groups (runtime/node_cuda.h) in a CUDA build: every slot but
 * TRANSFER. Without CUDA every slot is NULL, so a plan that places a flow on
 * cuda is refused by rt_placement_check instead of running on the CPU. */
#ifdef CEDAR_HAVE_CUDA
const struct rt_backend rt_backend_cuda = {
    .name = "cuda",
    .dev = GRAPH_DEV_CUDA,
    .run = {
        [GRAPH_EMBED] = rt_cuda_embed,
        [GRAPH_ENGRAM_GATHER] = rt_cuda_engram_rows,
        [GRAPH_ENGRAM] = rt_cuda_engram,
        [GRAPH_ATTN] = rt_cuda_attn,
        [GRAPH_MOE] = rt_cuda_moe,
        [GRAPH_DEC_KV] = rt_cuda_dec_kv,
        [GRAPH_KEEP_XE] = rt_cuda_keep_xe,
        [GRAPH_REPLAY_IN] = rt_cuda_replay_in,
        [GRAPH_HEAD] = rt_cuda_head,
        [GRAPH_MOE_SHARD] = rt_cuda_moe_shard,
        [GRAPH_MOE_SUM] = rt_cuda_moe_sum,
    },
};
#else
const struct rt_backend rt_backend_cuda = {.name = "cuda", .dev = GRAPH_DEV_CUDA};
#endif

const struct rt_backend *rt_backend_for(enum graph_device dev) {
  switch (dev) {
  case GRAPH_DEV_CPU: return &rt_backend_cpu;
  case GRAPH_DEV_CUDA: return &rt_backend_cuda;
  }
  return NULL;
}

/* Under mpirun, the ranks it gave; without, one process plays the prefill
 * and decode roles of ranks 0 and 1 (runtime/pd.h). */
int rt_ranks_available(void) {
  int w = rt_pd_world_size();
  return w > 0 ? w : 2;
}

/* "plans/x.yaml:141:20: " or "" for a value left at its default. */
static const char *where(const struct plan_mark *m, char *buf, size_t len) {
  if (m->file)
    snprintf(buf, len, "%s:%d:%d: ", m->file, m->line, m->col);
  else
    buf[0] = 0;
  return buf;
}

int rt_backend_missing(const struct rt_backend *b, bool with_transfer, char *list, size_t len) {
  int n = 0;
  size_t at = 0;
  if (len) list[0] = 0;
  for (int op = 0; op < GRAPH_OP_COUNT; op++) {
    if ((op == GRAPH_TRANSFER && !with_transfer) || b->run[op]) continue;
    if (at < len) at += (size_t)snprintf(list + at, len - at, "%s%s", n ? ", " : "", graph_op_name(op));
    n++;
  }
  return n;
}

/* The op groups a flow's graphs may hold, all of which its backend must run. */
static bool runs_every_group(const struct rt_backend *b, bool need_transfer) {
  char none[1];
  return rt_backend_missing(b, need_transfer, none, 0) == 0;
}

int rt_cuda_ready(char *err, size_t err_len) {
  char why[512] = "";
  int n = kern_device_query(NULL, 0, why, sizeof why);
  if (n < 0) {
    snprintf(err, err_len, "no CUDA device: %s", why);
    return CEDAR_EUNSUPPORTED;
  }
  if (n == 0) {
    snprintf(err, err_len, "no CUDA device: the CUDA runtime reports 0 devices");
    return CEDAR_EUNSUPPORTED;
  }
  char list[512];
  int missing = rt_backend_missing(&rt_backend_cuda, false, list, sizeof list);
  if (missing) {
    snprintf(err, err_len, "this build has no CUDA entry for %d of cedar's op groups (%s)%s", missing, list,
#ifdef CEDAR_HAVE_CUDA
             ""
#else
             ": it was built without CUDA (configure with -DCEDAR_CUDA=ON where nvcc is installed)"
#endif
    );
    return CEDAR_EUNSUPPORTED;
  }
  return 0;
}

static int check_flow(const struct plan *p, enum graph_flow f, struct plan_mark *mk, char *err, size_t err_len) {
  const struct plan_serving *s = &p->serving;
  bool pre = f != GRAPH_DECODE;
  const char *phase = pre ? "prefill" : "decode";
  struct graph_place pl = graph_place_of(p, f);
  char at[320];
  if (rt_pd_ranks_needed(p) > rt_ranks_available()) {
    int need = rt_pd_ranks_needed(p), have = rt_ranks_available();
    if (pl.rank < have) return 0; /* the other flow's rank is the one out of range */
    *mk = pre ? s->mark_prefill_rank : s->mark_decode_rank;
    where(mk, at, sizeof at);
    if (rt_pd_world_size() > 0)
      snprintf(err, err_len, "%sserving.placement.%s.rank is %d: this placement needs %d ranks, but mpirun gave %d; "
               "run mpirun -np %d or set rank: 0 or 1", at, phase, pl.rank, need, have, need);
    else
      snprintf(err, err_len, "%sserving.placement.%s.rank is %d: this placement needs %d ranks, but this process "
               "runs %d (without mpirun one process plays ranks 0 and 1); run it under mpirun -np %d%s or set "
               "rank: 0 or 1", at, phase, pl.rank, need, have, need,
               rt_pd_mpi_built() ? "" : " (this build has no StarPU-MPI)");
    return CEDAR_EUNSUPPORTED;
  }
  const struct rt_backend *b = rt_backend_for(pl.dev);
  if (!b || !runs_every_group(b, false)) {
    *mk = pre ? s->mark_prefill_device : s->mark_decode_device;
    where(mk, at, sizeof at);
    snprintf(err, err_len, "%sserving.placement.%s.device is %s, but this build has no %s backend for cedar's op "
             "groups (it was built without CUDA: -DCEDAR_CUDA=ON where nvcc is installed); set device: cpu", at, phase,
             pl.dev == GRAPH_DEV_CUDA ? "cuda" : "?", pl.dev == GRAPH_DEV_CUDA ? "CUDA" : "such");
    return CEDAR_EUNSUPPORTED;
  }
  char why[512];
  if (pl.dev == GRAPH_DEV_CUDA && rt_cuda_ready(why, sizeof why)) {
    *mk = pre ? s->mark_prefill_device : s->mark_decode_device;
    where(mk, at, sizeof at);
    snprintf(err, err_len, "%sserving.placement.%s.device is cuda, but %s; set device: cpu", at, phase, why);
    return CEDAR_EUNSUPPORTED;
  }
  return 0;
}

int rt_placement_check(const struct plan *p, struct plan_mark *at_out, char *err, size_t err_len) {
  struct plan_mark own, *mk = at_out ? at_out : &own;
  memset(mk, 0, sizeof(*mk));
  int rc = check_flow(p, GRAPH_PREFILL_CED, mk, err, err_len);
  if (!rc) rc = check_flow(p, GRAPH_DECODE, mk, err, err_len);
  if (!rc) rc = rt_pipe_placement_check(p, mk, err, err_len); /* layer stages and experts (runtime/pipeline.h) */
  if (rc) return rc;
  /* Both on one home: no transfer runs. Two homes in one process (say two
   * GPUs) would need a TRANSFER backend entry. */
  struct graph_place a = graph_place_of(p, GRAPH_PREFILL_CED), d = graph_place_of(p, GRAPH_DECODE);
  if (!graph_place_eq(a, d) && !rt_backend_for(a.dev)->run[GRAPH_TRANSFER]) {
    char pa[32], pd[32], at[320];
    *mk = p->serving.mark_decode_rank.file ? p->serving.mark_decode_rank : p->serving.mark_decode_device;
    where(mk, at, sizeof at);
    snprintf(err, err_len, "%sprefill runs on %s and decode on %s: moving state between them (TRANSFER nodes) is "
             "not built yet; place both phases on the same rank and device", at, graph_place_str(a, pa, sizeof pa),
             graph_place_str(d, pd, sizeof pd));
    return CEDAR_EUNSUPPORTED;
  }
  return 0;
}
