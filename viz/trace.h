/* trace.h: execution traces as Chrome Trace Event JSON (the format Perfetto,
 * chrome://tracing and speedscope open), built from graphs that ran and the
 * recorded time of each node.
 *
 * One process (pid) per trace, or one per rank of a multi-rank run
 * (viz_trace_process), one track (tid) per worker, named by metadata
 * events; one complete event ("ph":"X") per task, named as the
 * executor named it ("L3.attn c2 r0"), with args layer, mode (the layer's
 * attention mode, or the node kind's role), chunk, request, flops, bytes
 * (activations and buses the node touches), op, phase (the graph's flow),
 * node (its index), pos and n (the tile's first absolute position and its
 * positions) and rank (the MPI rank it ran on; 0 when one process runs); one flow pair ("ph":"s" / "ph":"f", bound to the
 * enclosing slices) per graph edge whose two ends ran on different tracks
 * (category "dep"), and any flow a caller adds (a P/D transfer: "transfer",
 * from the send on P's process to the receive on D's); the Engram prefetch
 * as a counter lane and a measured overlap (struct viz_prefetch).
 * Events are written in timestamp order, so every track's timestamps are
 * non-decreasing; slices of one track come from one worker and never
 * overlap.
 *
 * Timestamps are microseconds from any fixed origin (the executor's: since
 * StarPU started). What it is not: a recorder (runtime/exec/exec_starpu.c
 * records), nor a viewer.
 * Test: tests/cli/trace.sh (format, nesting, order, flow pairing, and a real
 * consumer when one is installed).
 */
#ifndef CEDAR_VIZ_TRACE_H
#define CEDAR_VIZ_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler/graph.h"

/* When and where one node ran (microseconds). */
struct viz_task_time {
  int tid;
  double start_us, end_us;
};

struct viz_slice {
  int tid;
  double ts, dur;
  char name[56];
  const char *op, *mode, *phase;
  int layer, chunk, request, node, rank;
  int64_t pos, n;
  double flops;
  int64_t bytes;
  int pid;       /* its process: viz_trace_add_graph gives the trace's own */
};

struct viz_flow {
  int from, to;    /* slice indices */
  const char *cat; /* "dep" (a graph edge) unless given (viz_trace_add_flow) */
};

/* The Engram prefetch (graph nodes engram_rows), measured over the graphs
 * added: tasks, their time, the part of it during which a non-prefetch
 * task of the same graph ran on another track (overlapped with compute),
 * and how many started no later than the first layer of their tile (the
 * lowest-layer attention node of the same chunk). */
struct viz_prefetch {
  int tasks, ahead;
  double us, overlapped_us;
};

struct viz_trace {
  char process[64];
  int pid;
  struct viz_slice *slice;
  int n_slice, cap_slice;
  struct viz_flow *flow;
  int n_flow, cap_flow;
  char (*thread)[32];  /* (n_thread) track names by tid */
  int *thread_pid;     /* (n_thread) the process of each track; -1: the trace's own */
  int n_thread;
  /* Processes besides the trace's own (a multi-rank run: one per rank). */
  char (*proc)[64];
  int *proc_pid;
  int n_proc;
  struct viz_prefetch prefetch;
};

void viz_trace_init(struct viz_trace *t, const char *process, int pid);
void viz_trace_free(struct viz_trace *t);
/* Name track tid ("CPU 0"). */
void viz_trace_thread(struct viz_trace *t, int tid, const char *name);
/* The nodes of one graph run: times (g->n_node); the task of node k is
 * named "<node name> r<request>". */
void viz_trace_add_graph(struct viz_trace *t, const struct graph *g, const struct viz_task_time *times, int request);
/* Multi-process traces (a P/D run under mpirun: a process per rank).
 * Tracks (tids) stay unique across the trace; each belongs to a process. */
/* Name process pid (another than the trace's own, which init named). */
void viz_trace_process(struct viz_trace *t, int pid, const char *name);
/* Name track tid as one of process pid's. */
void viz_trace_thread_of(struct viz_trace *t, int tid, int pid, const char *name);
/* viz_trace_add_graph for process pid; returns the index of node 0's slice
 * (node k's is that + k). */
int viz_trace_add_graph_at(struct viz_trace *t, const struct graph *g, const struct viz_task_time *times,
                           int request, int pid);
/* The nodes of one graph split over processes (layer stages under mpirun:
 * a process per rank): node k on process pid_of[k], skipped when negative;
 * slice_of (g->n_node) receives each node's slice index or -1. Graph edges
 * inside one process become "dep" flows; none crosses processes. */
void viz_trace_add_graph_split(struct viz_trace *t, const struct graph *g, const struct viz_task_time *times,
                               int request, const int *pid_of, int *slice_of);
/* One slice of its own (s->pid, s->tid); returns its index. */
int viz_trace_add_slice(struct viz_trace *t, const struct viz_slice *s);
/* A flow from slice `from` to slice `to`, in category cat (e.g. "transfer"). */
void viz_trace_add_flow(struct viz_trace *t, int from, int to, const char *cat);
/* One line on the prefetch ("Engram prefetch: ..."); false when none ran.
 * The trace carries the same figures as otherData.engram_prefetch and a
 * counter lane per process ("ph":"C", "Engram prefetch": tasks running). */
bool viz_trace_prefetch_text(const struct viz_trace *t, char *out, size_t len);
/* Write the JSON to path. Returns 0, or CEDAR_EIO with a message. */
int viz_trace_write(const struct viz_trace *t, const char *path, char *err, size_t err_len);

#endif
