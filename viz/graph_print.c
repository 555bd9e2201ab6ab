/* viz/graph_print.c: a graph as text (`cedar graph show`) and as Graphviz DOT
 * (`cedar graph dot`, `cedar run --dot`). Pure formatting of graph.h data. */
#include <inttypes.h>

#include "scheduler/graph.h"

static const char *kind_name(enum graph_data_kind k) {
  switch (k) {
  case GRAPH_WEIGHTS: return "weights";
  case GRAPH_STATE: return "state";
  case GRAPH_BUS: return "bus";
  case GRAPH_ACT: return "act";
  }
  return "?";
}

void graph_print(const struct graph *g, FILE *f, bool verbose) {
  int64_t edges = 0;
  for (int k = 0; k < g->n_node; k++) edges += g->node[k].n_dep;
  fprintf(f, "graph %s: plan %s, %s %" PRId64 ", tile %d", graph_flow_name(g->flow), g->plan->name,
          g->flow == GRAPH_DECODE ? "position" : "prompt", g->n_prompt, g->chunk);
  if (g->flow == GRAPH_PREFILL_CED) fprintf(f, ", decoder replay %" PRId64, g->replay);
  if (g->hit)
    fprintf(f, ", prefix hit %" PRId64 " (encoder from %" PRId64 "%s)", g->hit, g->encoder_start,
            g->encoder_start < g->hit ? ": replay with global writes off" : ": snapshot restored");
  char pl[32], peer[32];
  fprintf(f, "\n  on %s", graph_place_str(g->place, pl, sizeof pl));
  if (!graph_place_eq(g->place, g->peer))
    fprintf(f, "; decode on %s: %d transfer nodes", graph_place_str(g->peer, peer, sizeof peer), g->n_transfer);
  fprintf(f, "\n  %d nodes, %" PRId64 " edges, %d data objects, %" PRId64 " token-layers\n", g->n_node, edges,
          g->n_data, g->token_layers);
  fprintf(f, "  nodes by op:");
  for (int op = 0; op < GRAPH_OP_COUNT; op++) {
    int c = graph_count_op(g, op, -1);
    if (c) fprintf(f, " %s %d", graph_op_name(op), c);
  }
  fputc('\n', f);
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    fprintf(f, "%5d  %-20s pos [%" PRId64 ", %" PRId64 ")", k, nd->name, nd->a, nd->a + nd->n);
    if (nd->op == GRAPH_ATTN && nd->r0 > 0) fprintf(f, " r0 %" PRId64, nd->r0);
    if (nd->flags & GRAPH_F_WRITE_KV) fprintf(f, " +kv");
    if (nd->flags & GRAPH_F_RESTART) fprintf(f, " restart");
    for (int c = 0; c < 2; c++) /* key_slot: vendor (docs/model.md s3.2): the slot's keys, by row parity */
      if (nd->key_src[c] >= 0) fprintf(f, " keys L%d (p+1 %s)", nd->key_src[c], c ? "even" : "odd");
    fprintf(f, "  after");
    if (!nd->n_dep) fprintf(f, " -");
    for (int i = 0; i < nd->n_dep; i++) fprintf(f, " %d", nd->dep[i]);
    fputc('\n', f);
    if (!verbose) continue;
    for (int u = 0; u < nd->n_use; u++) {
      const struct graph_data *d = &g->data[nd->use[u].data];
      const struct graph_use *us = &nd->use[u];
      fprintf(f, "         %-6s %-7s %s", graph_access_name(us->mode), kind_name(d->kind), d->name);
      if (d->bytes) fprintf(f, " (%" PRId64 " B)", d->bytes);
      if (us->e_read > 0) fprintf(f, " entries [0, %" PRId64 ")", us->e_read);
      if (us->e_w1 > us->e_w0) fprintf(f, " appends [%" PRId64 ", %" PRId64 ")", us->e_w0, us->e_w1);
      if (!graph_place_eq(d->home, nd->place)) fprintf(f, " at %s", graph_place_str(d->home, pl, sizeof pl));
      fputc('\n', f);
    }
  }
}

static const char *op_color(enum graph_op op) {
  switch (op) {
  case GRAPH_ATTN: return "#9ecae1";
  case GRAPH_MOE: return "#fdae6b";
  case GRAPH_ENGRAM:
  case GRAPH_ENGRAM_GATHER: return "#a1d99b";
  case GRAPH_DEC_KV: return "#bcbddc";
  default: return "#d9d9d9";
  }
}

void graph_dot(const struct graph *g, FILE *f) {
  fprintf(f, "digraph \"%s %s\" {\n  rankdir=LR;\n  node [shape=box, style=filled, fontname=\"Helvetica\"];\n",
          g->plan->name, graph_flow_name(g->flow));
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    fprintf(f, "  n%d [label=\"%s\\n[%" PRId64 ", %" PRId64 ")\", fillcolor=\"%s\"];\n", k, nd->name, nd->a,
            nd->a + nd->n, op_color(nd->op));
  }
  for (int k = 0; k < g->n_node; k++)
    for (int i = 0; i < g->node[k].n_dep; i++) fprintf(f, "  n%d -> n%d;\n", g->node[k].dep[i], k);
  fprintf(f, "}\n");
}
