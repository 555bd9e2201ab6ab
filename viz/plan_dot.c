/* plan_dot.c: `cedar plan dot`. One node per layer, clustered by region and
 * coloured by mode; the layer chain in grey; one edge per bus read
 * (Main-KV solid, Top-K dashed, candidate pool dotted) from the writer to the
 * reader. Render with `dot -Tsvg`. Tested by tests/cli/plan_tools.sh, which
 * runs the output through Graphviz when it is installed. */
#include "viz/plan_dot.h"

#include <stdlib.h>

#include "base/check.h"
#include "scheduler/plan_bus.h"

static const char *mode_color(enum plan_mode m) {
  switch (m) {
    case PLAN_SWA_ONLY: return "#e0e0e0";
    case PLAN_FULL: return "#f4a261";
    case PLAN_REINDEX: return "#e9c46a";
    case PLAN_REUSE: return "#a8dadc";
  }
  return "white";
}

static void write_cluster(const struct plan *p, FILE *f, enum plan_region r) {
  fprintf(f, "  subgraph cluster_%s {\n    label=\"%s\"; style=rounded; color=\"#888888\";\n",
          plan_region_name(r), plan_region_name(r));
  for (int i = 0; i < p->n_layers; i++) {
    const struct plan_layer *l = &p->layer[i];
    if (l->region != r) continue;
    fprintf(f, "    L%d [label=\"L%d\\n%s", i, i, plan_mode_name(l->mode));
    if (l->ratio) fprintf(f, " r%d", l->ratio);
    if (l->cand == PLAN_CAND_BUILD) fprintf(f, "\\nbuilds pool");
    if (l->engram) fprintf(f, "\\nengram");
    fprintf(f, "\", fillcolor=\"%s\"];\n", mode_color(l->mode));
  }
  fprintf(f, "  }\n");
}

int viz_plan_dot_write(const struct plan *p, FILE *f) {
  static const char *style[] = {"solid", "solid", "dashed", "dotted"};
  static const char *color[] = {"#264653", "#264653", "#e76f51", "#2a9d8f"};
  fprintf(f, "digraph \"%s\" {\n  rankdir=LR;\n  node [shape=box, style=\"filled,rounded\", fontname=\"Helvetica\"];\n",
          p->name);
  fprintf(f, "  edge [fontname=\"Helvetica\", fontsize=9];\n");
  write_cluster(p, f, PLAN_ENCODER);
  write_cluster(p, f, PLAN_DECODER);
  for (int i = 1; i < p->n_layers; i++) fprintf(f, "  L%d -> L%d [color=\"#bbbbbb\", weight=10];\n", i - 1, i);
  struct plan_bus *bus = cedar_xcalloc(4 * (size_t)p->n_layers + 1, sizeof *bus);
  int n = plan_buses(p, bus, 4 * p->n_layers + 1);
  for (int b = 0; b < n; b++) {
    if (bus[b].kind == PLAN_BUS_INDEXER_K) continue; /* travels with Main-KV */
    for (int r = 0; r < bus[b].n_readers; r++) {
      int w = bus[b].writer, rd = bus[b].readers[r];
      if (w == rd) continue;
      fprintf(f, "  L%d -> L%d [style=%s, color=\"%s\", constraint=false, tooltip=\"%s\"];\n", w, rd,
              style[bus[b].kind], color[bus[b].kind], plan_bus_name(bus[b].kind));
    }
  }
  free(bus);
  fprintf(f,
          "  subgraph cluster_legend {\n    label=\"buses\"; style=dashed;\n"
          "    leg_kv [label=\"main-kv + indexer-k\", shape=plaintext, style=\"\"];\n"
          "    leg_tk [label=\"top-k (dashed)\", shape=plaintext, style=\"\"];\n"
          "    leg_pool [label=\"candidate pool (dotted)\", shape=plaintext, style=\"\"];\n  }\n}\n");
  return ferror(f) ? CEDAR_EIO : CEDAR_OK;
}
