/* view.h: `cedar view`'s reader and renderer: a Chrome Trace Event JSON file
 * (what `cedar run --trace` writes, viz/trace.h), optionally the task graph
 * as the DOT `cedar run --dot` / `cedar graph dot` write and a plan, read
 * into one struct and written as one self-contained HTML page (the data as
 * JSON, viz/view.js and viz/view.css inlined; no server, no network).
 *
 * The reader (view_read.c) takes complete events ("X"), begin/end pairs
 * ("B"/"E"), flow pairs ("s"/"f"), and thread/process names ("M"); it
 * refuses a file that is not such a trace with the reason and the event's
 * index (or the JSON's line and column). Lanes are one per (pid, tid),
 * ordered by rank (args.rank, else the pid), then thread_sort_index, then
 * tid. The graph part (view_graph.c) reads cedar's DOT and marks the
 * critical path: the longest chain of edges, each node weighted by its
 * measured duration in the trace's first prefill (or 1 per node when the
 * trace has none of its nodes). The renderer (view_html.c) writes the page.
 *
 * Not here: option parsing (cli/cmd_view.c), drawing (viz/view.js).
 * Tests: tests/cli/view.sh (reader, graph, page content), and
 * tests/cli/view_browser.sh (the page in headless Chromium).
 */
#ifndef CEDAR_VIZ_VIEW_H
#define CEDAR_VIZ_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "scheduler/plan.h"

struct viz_view_lane {
  int pid, tid, rank, sort;
  char name[64];
};

/* One task (slice). Missing args are -1 (numbers) or "" (strings). */
struct viz_view_ev {
  int lane, depth;
  double ts, dur;   /* microseconds, as in the file */
  char *name;       /* owned */
  int op, mode, phase; /* string ids in viz_view.sym */
  int layer, chunk, request, node, rank;
  int64_t pos, n, bytes;
  double flops;
  bool crit;        /* on the graph's critical path */
};

struct viz_view_graph {
  int n_node;
  char (*name)[48];
  int64_t *a, *b;      /* positions [a, b) from the label, -1 when absent */
  int (*edge)[2];
  int n_edge;
  double *w;           /* weight of each node (us, or 1) */
  bool measured;       /* weights are trace durations */
  int *level;          /* longest chain of edges from a source */
  bool *crit;
  int *path;           /* the critical path, source to sink (n_crit nodes) */
  int n_crit;
  double crit_w;       /* the critical path's total weight */
};

struct viz_view {
  char process[64];
  struct viz_view_lane *lane;
  int n_lane;
  struct viz_view_ev *ev; /* sorted by lane, then start */
  int n_ev;
  int (*flow)[2];         /* event indices: from, to */
  int n_flow;
  char **sym;             /* ops, modes, phases */
  int n_sym;
  int n_ignored;          /* events of other phases (instant, counter, ...) */
  bool has_graph;
  struct viz_view_graph g;
};

/* Read a trace file into v (zeroed by the call). Returns 0, or CEDAR_EIO /
 * CEDAR_EINVAL with "path: reason" in err. */
int viz_view_read_trace(struct viz_view *v, const char *path, char *err, size_t err_len);
/* Read the DOT graph and mark the critical path (nodes and the trace's
 * events of the first prefill that ran them). Same returns. */
int viz_view_read_graph(struct viz_view *v, const char *path, char *err, size_t err_len);
/* Write the page; p may be NULL (no plan tables). Same returns. */
int viz_view_write_html(const struct viz_view *v, const struct plan *p, const char *title, const char *path,
                        char *err, size_t err_len);
void viz_view_free(struct viz_view *v);
/* s into f as attribute- and text-safe HTML (& < > " escaped); also cedar report's page. */
void viz_html_text(FILE *f, const char *s);

/* The inlined assets (generated at build time from viz/view.js, viz/view.css). */
extern const char viz_view_js[], viz_view_css[];

#endif
