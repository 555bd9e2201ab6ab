/* place_check.c: the one placement check (dist.h): each flow's rank and
 * device, then the layer stages and expert shards. */
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "kernels/device.h"
#include "runtime/comm/comm.h"
#include "runtime/device/cuda_backend.h"
#include "runtime/dist/dist.h"
#include "runtime/dist/pd.h"
#include "runtime/node/backend.h"
#include "scheduler/graph.h"
#include "scheduler/plan_place.h"

/* Ranks this process can play: under mpirun the ranks it gave; without,
 * one process plays the prefill and decode roles of ranks 0 and 1. */
static int rt_ranks_available(void) {
  int w = comm_world_size();
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

/* A P/D state package can leave a home on dev (a TRANSFER entry). */
static bool has_transfer(enum graph_device dev) {
  struct graph_node nd = {0};
  nd.op = GRAPH_TRANSFER;
  nd.place.dev = dev;
  return rt_backend_entry(&nd) != NULL;
}

/* The op groups a flow's graphs may hold, all of which its backend must run. */
static bool runs_every_group(const struct rt_backend *b, bool need_transfer) {
  char none[1];
  return rt_backend_missing(b, need_transfer, none, 0) == 0;
}

/* p's stages and experts: every rank mpirun must give, CPU devices only. */
static int check_stages(const struct plan *p, struct plan_mark *at, char *err, size_t err_len) {
  const struct plan_placement *pl = &p->serving.place;
  int need = plan_place_ranks(p), have = comm_world_size();
  char w[320];
  for (int s = 0; s < pl->n_stages; s++) {
    const struct plan_stage *st = &pl->stage[s];
    if (have > 0 && st->rank >= have) {
      *at = st->mark_rank;
      snprintf(err, err_len, "%sserving.placement.stages[%d].rank is %d: this placement needs %d ranks, but mpirun "
               "gave %d; run mpirun -np %d or place the stage on a rank below %d", where(at, w, sizeof w), s,
               st->rank, need, have, need, have);
      return CEDAR_EUNSUPPORTED;
    }
    if (st->device == PLAN_DEV_CUDA) {
      struct kern_device_info info[16];
      char derr[128];
      int nd = kern_device_query(info, 16, derr, sizeof derr);
      if (nd < 0) nd = 0;
      *at = st->mark_device;
      if (st->device_id >= nd)
        snprintf(err, err_len, "%sserving.placement.stages[%d] names cuda:%d, but this machine has %d CUDA device%s; "
                 "%s", where(at, w, sizeof w), s, st->device_id, nd, nd == 1 ? "" : "s", nd > 0 ? "set a smaller device_id or device: cpu" : "set device: cpu");
      else
        snprintf(err, err_len, "%sserving.placement.stages[%d] names cuda:%d: layer stages run on CPU ranks only "
                 "(their transfers move host memory); set device: cpu", where(at, w, sizeof w), s, st->device_id);
      return CEDAR_EUNSUPPORTED;
    }
  }
  for (int s = 0; s < pl->n_stages; s++)
    if (have > 0 && pl->stage[s].pd && pl->stage[s].decode >= have) {
      *at = pl->stage[s].mark_decode;
      snprintf(err, err_len, "%sserving.placement.stages[%d].decode is %d: this placement needs %d ranks, but mpirun "
               "gave %d; run mpirun -np %d or place the stage's decode home on a rank below %d",
               where(at, w, sizeof w), s, pl->stage[s].decode, need, have, need, have);
      return CEDAR_EUNSUPPORTED;
    }
  for (int i = 0; i < pl->n_ep_ranks; i++)
    if (have > 0 && pl->ep_rank[i] >= have) {
      *at = pl->mark_ep_rank[i];
      snprintf(err, err_len, "%sserving.placement.experts.%s names rank %d: this placement needs %d ranks, but "
               "mpirun gave %d; run mpirun -np %d", where(at, w, sizeof w), pl->ep_pd ? "prefill" : "ranks",
               pl->ep_rank[i], need, have, need);
      return CEDAR_EUNSUPPORTED;
    }
  for (int i = 0; pl->ep_pd && i < pl->n_ep_ranks_d; i++)
    if (have > 0 && pl->ep_rank_d[i] >= have) {
      *at = pl->mark_ep_rank_d[i];
      snprintf(err, err_len, "%sserving.placement.experts.decode names rank %d: this placement needs %d ranks, but "
               "mpirun gave %d; run mpirun -np %d", where(at, w, sizeof w), pl->ep_rank_d[i], need, have, need);
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
    if (comm_world_size() > 0)
      snprintf(err, err_len, "%sserving.placement.%s.rank is %d: this placement needs %d ranks, but mpirun gave %d; "
               "run mpirun -np %d or set rank: 0 or 1", at, phase, pl.rank, need, have, need);
    else
      snprintf(err, err_len, "%sserving.placement.%s.rank is %d: this placement needs %d ranks, but this process "
               "runs %d (without mpirun one process plays ranks 0 and 1); run it under mpirun -np %d%s or set "
               "rank: 0 or 1", at, phase, pl.rank, need, have, need,
               comm_mpi_built() ? "" : " (this build has no StarPU-MPI)");
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
  rt_dist_register(); /* the backends and entries the check asks about */
  struct plan_mark own, *mk = at_out ? at_out : &own;
  memset(mk, 0, sizeof(*mk));
  int rc = check_flow(p, GRAPH_PREFILL_CED, mk, err, err_len);
  if (!rc) rc = check_flow(p, GRAPH_DECODE, mk, err, err_len);
  if (!rc) rc = check_stages(p, mk, err, err_len);
  if (rc) return rc;
  /* Both on one home: no transfer runs. Two homes in one process (say two
   * GPUs) would need a TRANSFER backend entry. */
  struct graph_place a = graph_place_of(p, GRAPH_PREFILL_CED), d = graph_place_of(p, GRAPH_DECODE);
  if (!graph_place_eq(a, d) && !has_transfer(a.dev)) {
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
