/* graph_edges.c: the edges of a compiled graph (graph.h), derived once from
 * the nodes' data accesses in program order: read after write, write after
 * read, write after write, and an append after the previous append only.
 * Also each data's last use. Moved out of graph.c (its 800-line bound).
 * Test: tests/test_graph.c (ctest -R graph). */
#include <stdlib.h>

#include "base/check.h"
#include "scheduler/graph.h"

static void add_dep(struct graph_node *nd, int from) {
  if (from < 0) return;
  for (int i = 0; i < nd->n_dep; i++)
    if (nd->dep[i] == from) return;
  nd->dep = cedar_xrealloc(nd->dep, sizeof(int) * (nd->n_dep + 1));
  nd->dep[nd->n_dep++] = from;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Derive edges from accesses in program order, and each data's last use. */
void graph__finish(struct graph *g) {
  int n = g->n_data;
  int *writer = cedar_xmalloc(sizeof(int) * n), *appender = cedar_xmalloc(sizeof(int) * n);
  int **readers = cedar_xcalloc(n, sizeof(int *));
  int *n_readers = cedar_xcalloc(n, sizeof(int));
  for (int i = 0; i < n; i++) writer[i] = appender[i] = -1;
  g->token_layers = 0;
  for (int k = 0; k < g->n_node; k++) {
    struct graph_node *nd = &g->node[k];
    if (nd->op == GRAPH_ATTN) g->token_layers += nd->n;
    for (int u = 0; u < nd->n_use; u++) {
      int d = nd->use[u].data;
      g->data[d].last_use = k;
      add_dep(nd, writer[d]);
      add_dep(nd, appender[d]);
      switch (nd->use[u].mode) {
      case GRAPH_R:
        readers[d] = cedar_xrealloc(readers[d], sizeof(int) * (n_readers[d] + 1));
        readers[d][n_readers[d]++] = k;
        break;
      case GRAPH_APPEND:
        appender[d] = k;
        break;
      default:
        for (int r = 0; r < n_readers[d]; r++) add_dep(nd, readers[d][r]);
        n_readers[d] = 0;
        writer[d] = k;
        break;
      }
    }
    for (int i = 0; i < nd->n_dep; i++) CEDAR_ASSERT(nd->dep[i] < k);
    if (nd->n_dep > 1) qsort(nd->dep, nd->n_dep, sizeof(int), cmp_int);
    if (nd->n_dep == 0) {
      free(nd->dep);
      nd->dep = NULL;
    }
  }
  for (int i = 0; i < n; i++) free(readers[i]);
  free(readers);
  free(n_readers);
  free(writer);
  free(appender);
}
