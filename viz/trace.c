/* trace.c: Chrome Trace Event JSON from graphs and node times (trace.h).
 * Pure formatting of graph.h data and the times given; cJSON writes it. */
#include "viz/trace.h"

#include <cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/file.h"

void viz_trace_init(struct viz_trace *t, const char *process, int pid) {
  memset(t, 0, sizeof(*t));
  snprintf(t->process, sizeof t->process, "%s", process);
  t->pid = pid;
}

void viz_trace_free(struct viz_trace *t) {
  free(t->slice);
  free(t->flow);
  free(t->thread);
  free(t->thread_pid);
  free(t->proc);
  free(t->proc_pid);
  memset(t, 0, sizeof(*t));
}

void viz_trace_thread(struct viz_trace *t, int tid, const char *name) {
  CEDAR_ASSERT(tid >= 0);
  if (tid >= t->n_thread) {
    t->thread = cedar_xrealloc(t->thread, sizeof(*t->thread) * (size_t)(tid + 1));
    t->thread_pid = cedar_xrealloc(t->thread_pid, sizeof(*t->thread_pid) * (size_t)(tid + 1));
    for (int i = t->n_thread; i <= tid; i++) {
      snprintf(t->thread[i], sizeof t->thread[i], "worker %d", i);
      t->thread_pid[i] = -1;
    }
    t->n_thread = tid + 1;
  }
  snprintf(t->thread[tid], sizeof t->thread[tid], "%s", name);
}

/* Activation and bus bytes a node touches. */
static int64_t node_bytes(const struct graph *g, const struct graph_node *nd) {
  int64_t b = 0;
  for (int u = 0; u < nd->n_use; u++) b += g->data[nd->use[u].data].bytes;
  return b;
}

static const char *node_mode(const struct graph *g, const struct graph_node *nd) {
  if (nd->layer >= 0 && (nd->op == GRAPH_ATTN || nd->op == GRAPH_DEC_KV))
    return plan_mode_name(g->plan->layer[nd->layer].mode);
  return nd->layer >= 0 ? graph_op_name(nd->op) : "-";
}

void viz_trace_add_graph(struct viz_trace *t, const struct graph *g, const struct viz_task_time *times, int request) {
  viz_trace_add_graph_at(t, g, times, request, t->pid);
}

void viz_trace_process(struct viz_trace *t, int pid, const char *name) {
  t->proc = cedar_xrealloc(t->proc, sizeof(*t->proc) * (size_t)(t->n_proc + 1));
  t->proc_pid = cedar_xrealloc(t->proc_pid, sizeof(*t->proc_pid) * (size_t)(t->n_proc + 1));
  snprintf(t->proc[t->n_proc], sizeof t->proc[0], "%s", name);
  t->proc_pid[t->n_proc++] = pid;
}

void viz_trace_thread_of(struct viz_trace *t, int tid, int pid, const char *name) {
  viz_trace_thread(t, tid, name);
  t->thread_pid[tid] = pid;
}

int viz_trace_add_slice(struct viz_trace *t, const struct viz_slice *s) {
  if (t->n_slice == t->cap_slice) {
    t->cap_slice = t->cap_slice ? 2 * t->cap_slice : 256;
    t->slice = cedar_xrealloc(t->slice, sizeof(*t->slice) * (size_t)t->cap_slice);
  }
  t->slice[t->n_slice] = *s;
  if (s->tid >= t->n_thread) viz_trace_thread_of(t, s->tid, s->pid, "");
  return t->n_slice++;
}

static void add_flow(struct viz_trace *t, int from, int to, const char *cat) {
  if (t->n_flow == t->cap_flow) {
    t->cap_flow = t->cap_flow ? 2 * t->cap_flow : 256;
    t->flow = cedar_xrealloc(t->flow, sizeof(*t->flow) * (size_t)t->cap_flow);
  }
  t->flow[t->n_flow++] = (struct viz_flow){from, to, cat};
}

void viz_trace_add_flow(struct viz_trace *t, int from, int to, const char *cat) { add_flow(t, from, to, cat); }

/* Of [a, b), the time some non-prefetch node on another track ran: the
 * union of those intervals clipped to [a, b) (a sweep over sorted starts). */
static int cmp_iv(const void *x, const void *y) {
  const double *a = x, *b = y;
  return a[0] < b[0] ? -1 : a[0] > b[0];
}

static double covered(const struct graph *g, const struct viz_task_time *times, int k, double (*iv)[2]) {
  double a = times[k].start_us, b = times[k].end_us, sum = 0, hi = a;
  int n = 0;
  for (int j = 0; j < g->n_node; j++)
    if (g->node[j].op != GRAPH_ENGRAM_GATHER && times[j].tid != times[k].tid && times[j].end_us > a &&
        times[j].start_us < b)
      iv[n][0] = times[j].start_us > a ? times[j].start_us : a, iv[n++][1] = times[j].end_us < b ? times[j].end_us : b;
  qsort(iv, (size_t)n, sizeof *iv, cmp_iv);
  for (int i = 0; i < n; i++) {
    double s0 = iv[i][0] > hi ? iv[i][0] : hi;
    if (iv[i][1] > s0) sum += iv[i][1] - s0, hi = iv[i][1];
  }
  return sum;
}

static void measure_prefetch(struct viz_prefetch *pf, const struct graph *g, const struct viz_task_time *times) {
  double (*iv)[2] = NULL;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    if (nd->op != GRAPH_ENGRAM_GATHER) continue;
    if (!iv) iv = cedar_xmalloc(sizeof(*iv) * (size_t)g->n_node);
    int first = -1; /* the tile's first layer: its lowest-layer attention */
    for (int j = 0; j < g->n_node; j++)
      if (g->node[j].op == GRAPH_ATTN && g->node[j].chunk == nd->chunk && g->node[j].a == nd->a &&
          (first < 0 || g->node[j].layer < g->node[first].layer))
        first = j;
    pf->tasks++;
    pf->ahead += first < 0 || times[k].start_us <= times[first].start_us;
    pf->us += times[k].end_us > times[k].start_us ? times[k].end_us - times[k].start_us : 0;
    pf->overlapped_us += covered(g, times, k, iv);
  }
  free(iv);
}

bool viz_trace_prefetch_text(const struct viz_trace *t, char *out, size_t len) {
  const struct viz_prefetch *p = &t->prefetch;
  if (!p->tasks) return false;
  snprintf(out, len, "Engram prefetch: %d tasks, %.0f us, %.1f%% of it beside layer compute on another worker; "
           "%d of %d started no later than their tile's first layer", p->tasks, p->us,
           p->us > 0 ? 100.0 * p->overlapped_us / p->us : 0.0, p->ahead, p->tasks);
  return true;
}

/* The nodes of g as slices: every node on process pid, or, with pid_of,
 * node k on process pid_of[k] (skipped when negative); slice_of[k] gets
 * node k's slice index (-1 when skipped). A graph edge between two tracks
 * of one process becomes a "dep" flow. */
static void add_nodes(struct viz_trace *t, const struct graph *g, const struct viz_task_time *times, int request,
                      int pid, const int *pid_of, int *slice_of) {
  if (t->n_slice + g->n_node > t->cap_slice) {
    t->cap_slice = 2 * (t->n_slice + g->n_node);
    t->slice = cedar_xrealloc(t->slice, sizeof(*t->slice) * (size_t)t->cap_slice);
  }
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    int to = pid_of ? pid_of[k] : pid;
    slice_of[k] = -1;
    if (to < 0) continue;
    slice_of[k] = t->n_slice;
    struct viz_slice *s = &t->slice[t->n_slice++];
    memset(s, 0, sizeof(*s));
    s->tid = times[k].tid;
    s->ts = times[k].start_us;
    s->dur = times[k].end_us > times[k].start_us ? times[k].end_us - times[k].start_us : 0;
    snprintf(s->name, sizeof s->name, "%s r%d", nd->name, request);
    s->op = graph_op_name(nd->op);
    s->mode = node_mode(g, nd);
    s->phase = graph_flow_name(g->flow);
    s->layer = nd->layer;
    s->chunk = nd->chunk;
    s->request = request;
    s->node = k;
    s->rank = nd->place.rank;
    s->pos = nd->a;
    s->n = nd->n;
    s->flops = nd->flops;
    s->bytes = node_bytes(g, nd);
    s->pid = to;
    if (s->tid >= t->n_thread) viz_trace_thread_of(t, s->tid, to == t->pid ? -1 : to, "");
    if (!t->thread[s->tid][0]) snprintf(t->thread[s->tid], sizeof t->thread[s->tid], "worker %d", s->tid);
  }
  measure_prefetch(&t->prefetch, g, times);
  for (int k = 0; k < g->n_node; k++)
    for (int i = 0; i < g->node[k].n_dep; i++) {
      int j = g->node[k].dep[i];
      if (slice_of[j] < 0 || slice_of[k] < 0 || times[j].tid == times[k].tid) continue;
      if (t->slice[slice_of[j]].pid != t->slice[slice_of[k]].pid) continue; /* another rank's: a transfer's flow */
      add_flow(t, slice_of[j], slice_of[k], NULL);
    }
}

int viz_trace_add_graph_at(struct viz_trace *t, const struct graph *g, const struct viz_task_time *times,
                           int request, int pid) {
  int base = t->n_slice;
  int *slice_of = cedar_xmalloc(sizeof(int) * (size_t)(g->n_node > 0 ? g->n_node : 1));
  add_nodes(t, g, times, request, pid, NULL, slice_of);
  free(slice_of);
  return base;
}

void viz_trace_add_graph_split(struct viz_trace *t, const struct graph *g, const struct viz_task_time *times,
                               int request, const int *pid_of, int *slice_of) {
  add_nodes(t, g, times, request, t->pid, pid_of, slice_of);
}

/* ---- writing -------------------------------------------------------------- */

/* One event to write: a slice, or one end of a flow, at its timestamp. */
struct ev {
  double ts;
  int kind;  /* 0 slice, 1 flow start, 2 flow end */
  int idx;
};

static int cmp_ev(const void *a, const void *b) {
  const struct ev *x = a, *y = b;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  if (x->kind != y->kind) return x->kind - y->kind; /* the slice before the flows bound to it */
  return x->idx - y->idx;
}

static cJSON *event_of(int pid, const char *name, const char *ph, int tid) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddStringToObject(e, "name", name);
  cJSON_AddStringToObject(e, "ph", ph);
  cJSON_AddNumberToObject(e, "pid", pid);
  cJSON_AddNumberToObject(e, "tid", tid);
  return e;
}

static int thread_pid(const struct viz_trace *t, int tid) {
  return tid < t->n_thread && t->thread_pid[tid] >= 0 ? t->thread_pid[tid] : t->pid;
}

static cJSON *metadata(const struct viz_trace *t, const char *what, int tid, const char *key, cJSON *value) {
  cJSON *e = event_of(!strcmp(what, "process_name") ? t->pid : thread_pid(t, tid), what, "M", tid);
  cJSON *a = cJSON_AddObjectToObject(e, "args");
  cJSON_AddItemToObject(a, key, value);
  return e;
}

static cJSON *slice_event(const struct viz_slice *s) {
  cJSON *e = event_of(s->pid, s->name, "X", s->tid);
  cJSON_AddStringToObject(e, "cat", s->op);
  cJSON_AddNumberToObject(e, "ts", s->ts);
  cJSON_AddNumberToObject(e, "dur", s->dur);
  cJSON *a = cJSON_AddObjectToObject(e, "args");
  cJSON_AddNumberToObject(a, "layer", s->layer);
  cJSON_AddStringToObject(a, "mode", s->mode);
  cJSON_AddNumberToObject(a, "chunk", s->chunk);
  cJSON_AddNumberToObject(a, "request", s->request);
  cJSON_AddNumberToObject(a, "flops", s->flops);
  cJSON_AddNumberToObject(a, "bytes", (double)s->bytes);
  cJSON_AddStringToObject(a, "op", s->op);
  cJSON_AddStringToObject(a, "phase", s->phase);
  cJSON_AddNumberToObject(a, "node", s->node);
  cJSON_AddNumberToObject(a, "pos", (double)s->pos);
  cJSON_AddNumberToObject(a, "n", (double)s->n);
  cJSON_AddNumberToObject(a, "rank", s->rank);
  return e;
}

static cJSON *flow_event(const struct viz_trace *t, int f, bool start) {
  const struct viz_slice *s = &t->slice[start ? t->flow[f].from : t->flow[f].to];
  const char *cat = t->flow[f].cat ? t->flow[f].cat : "dep";
  cJSON *e = event_of(s->pid, cat, start ? "s" : "f", s->tid);
  cJSON_AddStringToObject(e, "cat", cat);
  cJSON_AddNumberToObject(e, "id", f);
  cJSON_AddNumberToObject(e, "ts", s->ts); /* the slice's start: inside it, so the flow binds to it */
  if (!start) cJSON_AddStringToObject(e, "bp", "e");
  return e;
}

static cJSON *build(const struct viz_trace *t) {
  cJSON *root = cJSON_CreateObject();
  cJSON *evs = cJSON_AddArrayToObject(root, "traceEvents");
  cJSON_AddItemToArray(evs, metadata(t, "process_name", 0, "name", cJSON_CreateString(t->process)));
  for (int i = 0; i < t->n_proc; i++) {
    cJSON *pe = event_of(t->proc_pid[i], "process_name", "M", 0);
    cJSON_AddItemToObject(cJSON_AddObjectToObject(pe, "args"), "name", cJSON_CreateString(t->proc[i]));
    cJSON_AddItemToArray(evs, pe);
  }
  for (int i = 0; i < t->n_thread; i++) {
    cJSON_AddItemToArray(evs, metadata(t, "thread_name", i, "name", cJSON_CreateString(t->thread[i])));
    cJSON_AddItemToArray(evs, metadata(t, "thread_sort_index", i, "sort_index", cJSON_CreateNumber(i)));
  }
  int n = 3 * t->n_slice + 2 * t->n_flow;
  struct ev *e = cedar_xmalloc(sizeof(*e) * (size_t)(n > 0 ? n : 1));
  int m = 0;
  for (int i = 0; i < t->n_slice; i++) {
    e[m++] = (struct ev){t->slice[i].ts, 0, i};
    if (!strcmp(t->slice[i].op, graph_op_name(GRAPH_ENGRAM_GATHER))) { /* the counter lane: end, then start */
      e[m++] = (struct ev){t->slice[i].ts + t->slice[i].dur, 3, i};
      e[m++] = (struct ev){t->slice[i].ts, 4, i};
    }
  }
  for (int f = 0; f < t->n_flow; f++) {
    e[m++] = (struct ev){t->slice[t->flow[f].from].ts, 1, f};
    e[m++] = (struct ev){t->slice[t->flow[f].to].ts, 2, f};
  }
  qsort(e, (size_t)m, sizeof(*e), cmp_ev);
  int *running = cedar_xcalloc((size_t)(t->n_proc + 1), sizeof *running); /* by process: the trace's, then proc[] */
  for (int i = 0; i < m; i++) {
    if (e[i].kind >= 3) {
      const struct viz_slice *s = &t->slice[e[i].idx];
      int p = 0;
      for (int q = 0; q < t->n_proc; q++)
        if (t->proc_pid[q] == s->pid) p = q + 1;
      running[p] += e[i].kind == 4 ? 1 : -1;
      cJSON *c = event_of(s->pid, "Engram prefetch", "C", 0);
      cJSON_AddNumberToObject(c, "ts", e[i].ts);
      cJSON_AddNumberToObject(cJSON_AddObjectToObject(c, "args"), "running", running[p]);
      cJSON_AddItemToArray(evs, c);
      continue;
    }
    cJSON_AddItemToArray(evs, e[i].kind == 0 ? slice_event(&t->slice[e[i].idx]) : flow_event(t, e[i].idx, e[i].kind == 1));
  }
  free(running);
  free(e);
  cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
  if (t->prefetch.tasks) {
    const struct viz_prefetch *p = &t->prefetch;
    cJSON *o = cJSON_AddObjectToObject(cJSON_AddObjectToObject(root, "otherData"), "engram_prefetch");
    cJSON_AddNumberToObject(o, "tasks", p->tasks);
    cJSON_AddNumberToObject(o, "us", p->us);
    cJSON_AddNumberToObject(o, "overlapped_us", p->overlapped_us);
    cJSON_AddNumberToObject(o, "overlap_fraction", p->us > 0 ? p->overlapped_us / p->us : 0);
    cJSON_AddNumberToObject(o, "started_ahead_of_first_layer", p->ahead);
  }
  return root;
}

int viz_trace_write(const struct viz_trace *t, const char *path, char *err, size_t err_len) {
  cJSON *root = build(t);
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  CEDAR_ASSERT_MSG(s != NULL, "cJSON_PrintUnformatted: out of memory");
  /* base/file.h: a temporary renamed into place only when whole (a full
   * disk or `ulimit -f` leaves no truncated trace behind) */
  struct cedar_out o;
  int rc = cedar_out_open(&o, path, err, err_len) ? CEDAR_EIO : 0;
  if (!rc) {
    cedar_out_write(&o, s, strlen(s));
    cedar_out_write(&o, "\n", 1);
    if (cedar_out_commit(&o, err, err_len)) rc = CEDAR_EIO;
  }
  cJSON_free(s);
  return rc;
}
