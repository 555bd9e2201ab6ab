/* policy.c: critical-path priorities (policy.h).
 *
 * The longest chain of tasks from a node of sublayer s (2 layer + MoE) and
 * tile c to the end of a wavefront is about (2 n_layers - s) + (tiles - c),
 * so lower layers of later tiles, which trail the front, go before higher
 * layers of earlier ones (a trailing last tile is what runs alone at the
 * end). Engram prefetches (row gathers: token ids only) rank above every
 * layer node, earlier tiles first, so a policy that reads priorities runs
 * them ahead of the layers (docs/runtime.md, "Engram prefetch"). Only
 * priority-aware StarPU policies (prio, dmda, lws, ...) read it.
 */
#include "scheduler/policy.h"

int sched_tiles(const struct graph *g) {
  int tiles = 1;
  for (int k = 0; k < g->n_node; k++)
    if (g->node[k].chunk + 1 > tiles) tiles = g->node[k].chunk + 1;
  return tiles;
}

int sched_priority(const struct graph *g, int k, int tiles, int lo, int hi) {
  const struct graph_node *nd = &g->node[k];
  int sub = nd->layer >= 0 ? 2 * nd->layer + (nd->op == GRAPH_MOE) : 0;
  int max_rank = 2 * g->plan->n_layers + 2 * tiles;
  int rank = (2 * g->plan->n_layers - sub) + (tiles - nd->chunk);
  if (nd->op == GRAPH_ENGRAM_GATHER && g->plan->serving.engram_prefetch) rank = 2 * g->plan->n_layers + tiles + (tiles - nd->chunk);
  if (hi <= lo) return lo;
  return (int)(lo + ((int64_t)hi - lo) * rank / max_rank); /* policies without priorities span all of int */
}
