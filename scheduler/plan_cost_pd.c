/* plan_cost_pd.c: the P->D state package from the plan alone
 * (plan_cost_pd.h). */
#include "scheduler/plan_cost_pd.h"

#include <string.h>

#include "base/check.h"
#include "scheduler/graph.h"
#include "scheduler/plan_cost.h"
#include "scheduler/plan_place.h"

int plan_cost_pd_package(const struct plan *p, int64_t n, struct plan_pd_package *out) {
  memset(out, 0, sizeof(*out));
  const struct plan_serving *s = &p->serving;
  out->split = s->prefill_rank != s->decode_rank || s->prefill_device != s->decode_device ||
               (s->prefill_device == PLAN_DEV_CUDA && s->prefill_device_id != s->decode_device_id);
  out->replay_on_decode = s->pd_replay == PLAN_REPLAY_ON_DECODE;
  struct plan_cost pc;
  struct plan_cost_query q;
  plan_cost_query_init(&q);
  q.tokens = n;
  q.prompt = n;
  if (plan_cost_compute(p, &q, &pc)) return CEDAR_EINVAL;
  out->kv = pc.bytes;
  /* key_slot: vendor with P/D stages: a source's stream also goes to the decode home of each stage that scores
   * its keys as the slot's (graph_place.c: key_sources_to_decode_homes) */
  const struct plan_placement *pl = &s->place;
  for (int i = 0; i < pc.n_sources && plan_has_stages(p) && pl->stage[0].pd; i++) {
    int src = pc.src[i].layer, home = pl->stage[plan_stage_of(p, src)].decode;
    bool to[PLAN_MAX_STAGES] = {false};
    for (int l = 0; l < p->n_layers; l++) {
      int key[2], st = plan_stage_of(p, l), r = pl->stage[st].decode;
      graph__key_sources(p, l, key);
      bool seen = false;
      for (int t = 0; t < pl->n_stages; t++) seen |= to[t] && pl->stage[t].decode == r;
      if ((key[0] != src && key[1] != src) || st == plan_stage_of(p, src) || r == home || seen) continue;
      to[st] = true;
      out->kv += pc.src[i].bytes;
    }
  }
  int64_t ring = p->n_layers ? (pc.swa_payload_bytes + pc.swa_scale_bytes) / p->n_layers : 0;
  bool ced = false;
  for (int l = 0; l < p->n_layers; l++) {
    bool dec = s->ced && p->layer[l].region == PLAN_DECODER;
    ced |= dec;
    if (!dec)
      out->swa_enc += ring;
    else if (!out->replay_on_decode) /* else D rebuilds them */
      out->swa_dec += ring;
  }
  out->tails = pc.tail_bytes;
  /* a kept encoder row: X^E (hc x hidden) and the pre it carries (hc), as
   * runtime/model/state.h's rt_xe_row_floats lays it out */
  out->xe = ced ? (int64_t)s->replay_decoder * p->model.hc_streams * (p->model.hidden + 1) * (int64_t)sizeof(float) : 0;
  out->total = out->kv + out->swa_enc + out->swa_dec + out->tails + out->xe;
  return 0;
}
