/* plan_place.h: layer (pipeline) and expert placement from the plan:
 * serving.placement.stages, .experts and .engram (docs/placement.md).
 *
 *   stages   [{layers: 0-13, rank: 0}, {layers: 14-39, rank: 1, device: cpu}]
 *            contiguous layer groups, in order, covering every layer once;
 *            each runs on its rank (and device). The embedding runs with the
 *            first layer, the head with the last; a KV source's pages live
 *            with its stage, and its readers in other stages receive its
 *            entries as transfers (scheduler/graph_place.c).
 *   experts  {ranks: [0, 1], layers: 0-39}: the routed experts of those
 *            layers (all when `layers` is absent) split into equal contiguous
 *            blocks over the ranks; router and shared expert stay with the
 *            layer's stage. Accounted (plan cost --per-rank) and run
 *            (runtime/dist/expert_par.h: dispatch, shards, combine).
 *   engram   {rank: 0, memory: host | file}: where the Engram tables live.
 *
 * With prefill and decode on different homes (P/D), each stage names both
 * homes instead of one rank ({layers: 0-13, prefill: 0, decode: 2}) and the
 * experts each role's shards ({prefill: [0, 2], decode: [1, 2]}); a rank
 * holds one role, a KV source's readers share its stage, and the replay
 * runs on P (checked here; docs/placement.md, "P/D with stages and experts").
 *
 * The loader reads them (plan__read_placement, after the layer table) and
 * checks them against the layers (plan__check_placement, after ownership
 * is derived); errors carry file:line:col and the fix.
 * Test: tests/test_place.c (ctest -R place).
 */
#ifndef CEDAR_SCHEDULER_PLAN_PLACE_H
#define CEDAR_SCHEDULER_PLAN_PLACE_H

#include <stdbool.h>

#include "scheduler/plan.h"

/* The plan places layers on stages (serving.placement.stages). */
static inline bool plan_has_stages(const struct plan *p) { return p->serving.place.n_stages > 0; }
/* The stage holding layer l (0 without stages). */
int plan_stage_of(const struct plan *p, int l);
/* Ranks the layer and expert placement names (max rank + 1; 1 without any). */
int plan_place_ranks(const struct plan *p);
/* Layer l's routed experts are split over ranks (serving.placement.experts). */
bool plan_ep_layer(const struct plan *p, int l);
/* The rank holding routed expert e of layer l: its stage's rank, or its
 * block of serving.placement.experts. */
int plan_expert_rank(const struct plan *p, int l, int e);
/* P/D with stages or experts: the stages name a prefill and a decode home
 * each ({layers: 0-13, prefill: 0, decode: 2}), or the experts each role's
 * shards ({prefill: [0, 2], decode: [1, 2]}). */
bool plan_place_pd(const struct plan *p);
/* The plan as one role sees it: a copy whose stage[].rank and ep_rank name
 * the prefill role's homes (decode false: the plan as written) or the
 * decode role's. The graph compiler and the expert shards read only these,
 * so a prefill graph built from the prefill view runs on the P ranks and a
 * decode graph from the decode view on the D ranks (runtime/dist/pd_stage.c). */
void plan_role_view(const struct plan *p, bool decode, struct plan *v);
/* The rank holding the Engram tables (the first stage's without engram:). */
int plan_engram_rank(const struct plan *p);

#endif
