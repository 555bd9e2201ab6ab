/* view_graph.c: the task graph for `cedar view` (view.h): cedar's DOT (as
 * viz/graph_print.c writes it) read back, each node weighted by its
 * measured duration in the trace, and the critical path marked: the chain
 * of edges with the largest total weight, found in topological order. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/file.h"
#include "viz/view.h"

static void grow(void **p, int n, int *cap, size_t each) {
  if (n < *cap) return;
  *cap = *cap ? 2 * *cap : 256;
  *p = cedar_xrealloc(*p, each * (size_t)*cap);
}

/* One node line: `  nK [label="NAME\n[a, b)", ...];`. Returns false when it is not one. */
static bool node_line(const char *s, int *k, char *name, size_t name_len, int64_t *a, int64_t *b) {
  int used = 0;
  if (sscanf(s, " n%d [label=\"%n", k, &used) != 1 || !used) return false;
  const char *p = s + used, *q = strstr(p, "\\n[");
  const char *close = strchr(p, '"');
  if (!close) return false;
  if (!q || q > close) q = close;
  snprintf(name, name_len, "%.*s", (int)(q - p), p);
  *a = *b = -1;
  if (q != close && sscanf(q, "\\n[%" SCNd64 ", %" SCNd64 ")", a, b) != 2) *a = *b = -1;
  return true;
}

static int parse_dot(struct viz_view_graph *g, const char *path, char *err, size_t err_len) {
  FILE *f = cedar_fopen_in(path, CEDAR_TEXT_MAX, err, err_len); /* base/file.h: no FIFO or device */
  if (!f) return CEDAR_EIO;
  char line[512];
  int ln = 0, cap_n = 0, cap_e = 0, rc = 0;
  bool header = false;
  while (fgets(line, sizeof line, f)) {
    ln++;
    int k, j;
    char name[48];
    int64_t a, b;
    const char *s = line + strspn(line, " \t");
    if (!*s || *s == '\n') continue;
    if (!header) {
      if (strncmp(s, "digraph", 7)) break;
      header = true;
    } else if (!strncmp(s, "rankdir", 7) || !strncmp(s, "node [", 6) || *s == '}') {
      continue;
    } else if (sscanf(s, "n%d -> n%d;", &j, &k) == 2) {
      grow((void **)&g->edge, g->n_edge, &cap_e, sizeof(*g->edge));
      g->edge[g->n_edge][0] = j;
      g->edge[g->n_edge][1] = k;
      g->n_edge++;
    } else if (node_line(s, &k, name, sizeof name, &a, &b)) {
      if (k != g->n_node) {
        snprintf(err, err_len, "%s:%d: node n%d out of order (expected n%d)", path, ln, k, g->n_node);
        rc = CEDAR_EINVAL;
        break;
      }
      int c = cap_n;
      grow((void **)&g->name, g->n_node, &c, sizeof(*g->name));
      c = cap_n;
      grow((void **)&g->a, g->n_node, &c, sizeof(*g->a));
      grow((void **)&g->b, g->n_node, &cap_n, sizeof(*g->b));
      snprintf(g->name[k], sizeof g->name[k], "%s", name);
      g->a[k] = a, g->b[k] = b;
      g->n_node++;
    } else {
      snprintf(err, err_len, "%s:%d: not a line of the DOT `cedar run --dot` or `cedar graph dot` writes: %.60s",
               path, ln, s);
      rc = CEDAR_EINVAL;
      break;
    }
  }
  fclose(f);
  if (!rc && !header) {
    snprintf(err, err_len, "%s: not a Graphviz digraph (the first line does not start with `digraph`)", path);
    rc = CEDAR_EINVAL;
  }
  if (!rc && g->n_node == 0) {
    snprintf(err, err_len, "%s: the graph has no nodes", path);
    rc = CEDAR_EINVAL;
  }
  for (int e = 0; !rc && e < g->n_edge; e++)
    if (g->edge[e][0] < 0 || g->edge[e][0] >= g->n_node || g->edge[e][1] < 0 || g->edge[e][1] >= g->n_node) {
      snprintf(err, err_len, "%s: edge n%d -> n%d names a node that is not in the graph", path, g->edge[e][0],
               g->edge[e][1]);
      rc = CEDAR_EINVAL;
    }
  return rc;
}

/* Weights from the trace: the events of its first prefill (the request of
 * the earliest prefill event) by node index. ev_of[k]: the event, or -1. */
static void weigh(struct viz_view *v, int *ev_of) {
  struct viz_view_graph *g = &v->g;
  int first = -1;
  for (int i = 0; i < v->n_ev; i++)
    if (!strncmp(v->sym[v->ev[i].phase], "prefill", 7) && (first < 0 || v->ev[i].ts < v->ev[first].ts)) first = i;
  for (int k = 0; k < g->n_node; k++) ev_of[k] = -1;
  g->measured = false;
  for (int i = 0; first >= 0 && i < v->n_ev; i++) {
    const struct viz_view_ev *e = &v->ev[i];
    if (e->request != v->ev[first].request || e->node < 0 || e->node >= g->n_node ||
        strncmp(v->sym[e->phase], "prefill", 7))
      continue;
    if (ev_of[e->node] < 0 || e->ts < v->ev[ev_of[e->node]].ts) ev_of[e->node] = i;
    g->measured = true;
  }
  for (int k = 0; k < g->n_node; k++) g->w[k] = g->measured ? (ev_of[k] >= 0 ? v->ev[ev_of[k]].dur : 0) : 1;
}

static int critical_path(struct viz_view *v, const char *path, char *err, size_t err_len) {
  struct viz_view_graph *g = &v->g;
  int n = g->n_node, m = g->n_edge;
  int *indeg = calloc((size_t)n, sizeof(int)), *head = cedar_xmalloc(sizeof(int) * (size_t)(n + 1));
  int *adj = cedar_xmalloc(sizeof(int) * (size_t)(m > 0 ? m : 1)), *order = cedar_xmalloc(sizeof(int) * (size_t)n);
  int *ev_of = cedar_xmalloc(sizeof(int) * (size_t)n), *prev = cedar_xmalloc(sizeof(int) * (size_t)n);
  double *dist = cedar_xmalloc(sizeof(double) * (size_t)n);
  CEDAR_ASSERT(indeg != NULL);
  g->w = cedar_xmalloc(sizeof(double) * (size_t)n);
  g->level = calloc((size_t)n, sizeof(int));
  g->crit = calloc((size_t)n, sizeof(bool));
  CEDAR_ASSERT(g->level && g->crit);
  /* adjacency by source (counting sort of the edges) */
  memset(head, 0, sizeof(int) * (size_t)(n + 1));
  for (int e = 0; e < m; e++) head[g->edge[e][0] + 1]++, indeg[g->edge[e][1]]++;
  for (int k = 0; k < n; k++) head[k + 1] += head[k];
  int *fill = cedar_xmalloc(sizeof(int) * (size_t)n);
  memcpy(fill, head, sizeof(int) * (size_t)n);
  for (int e = 0; e < m; e++) adj[fill[g->edge[e][0]]++] = g->edge[e][1];
  free(fill);
  int qh = 0, qt = 0;
  for (int k = 0; k < n; k++)
    if (!indeg[k]) order[qt++] = k;
  while (qh < qt) {
    int k = order[qh++];
    for (int i = head[k]; i < head[k + 1]; i++)
      if (--indeg[adj[i]] == 0) order[qt++] = adj[i];
  }
  int rc = 0;
  if (qt != n) {
    snprintf(err, err_len, "%s: the graph has a cycle; a task graph must not", path);
    rc = CEDAR_EINVAL;
  } else {
    weigh(v, ev_of);
    for (int k = 0; k < n; k++) dist[k] = g->w[k], prev[k] = -1;
    int best = order[0];
    for (int q = 0; q < n; q++) {
      int k = order[q];
      if (dist[k] > dist[best]) best = k;
      for (int i = head[k]; i < head[k + 1]; i++) {
        int j = adj[i];
        if (g->level[k] + 1 > g->level[j]) g->level[j] = g->level[k] + 1;
        if (dist[k] + g->w[j] > dist[j]) dist[j] = dist[k] + g->w[j], prev[j] = k;
      }
    }
    g->crit_w = dist[best];
    for (int k = best; k >= 0; k = prev[k]) {
      g->crit[k] = true;
      g->n_crit++;
      if (ev_of[k] >= 0) v->ev[ev_of[k]].crit = true;
    }
    g->path = cedar_xmalloc(sizeof(int) * (size_t)g->n_crit);
    int i = g->n_crit;
    for (int k = best; k >= 0; k = prev[k]) g->path[--i] = k;
  }
  free(indeg);
  free(head);
  free(adj);
  free(order);
  free(ev_of);
  free(prev);
  free(dist);
  return rc;
}

int viz_view_read_graph(struct viz_view *v, const char *path, char *err, size_t err_len) {
  int rc = parse_dot(&v->g, path, err, err_len);
  if (!rc) rc = critical_path(v, path, err, err_len);
  v->has_graph = !rc;
  return rc;
}
