/* view_read.c: reading a Chrome Trace Event JSON file for `cedar view`
 * (view.h): cJSON parses it; lanes, slices and flows are checked and kept.
 * Every refusal names the file and the event index (or line:col). */
#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/file.h"
#include "viz/view.h"

#define VIEW_MAX_FILE ((size_t)1 << 31) /* 2 GiB: far above any trace a browser can hold */
/* Timestamps and durations (microseconds) beyond this are refused (issue 28
 * row 16): 1e17 us is 3,000 years, room for epoch-based clocks (1.7e15
 * now), and the page's differences of two of them stay finite. */
#define VIEW_MAX_US 1e17

static char *read_file(const char *path, size_t *len, char *err, size_t err_len) {
  return cedar_read_all(path, VIEW_MAX_FILE, len, err, err_len); /* base/file.h: bounded, no FIFO or device */
}

static int viz_view_sym(struct viz_view *v, const char *s) {
  for (int i = 0; i < v->n_sym; i++)
    if (!strcmp(v->sym[i], s)) return i;
  v->sym = cedar_xrealloc(v->sym, sizeof(*v->sym) * (size_t)(v->n_sym + 1));
  v->sym[v->n_sym] = cedar_xstrdup(s);
  return v->n_sym++;
}

static int lane_of(struct viz_view *v, int pid, int tid) {
  for (int i = 0; i < v->n_lane; i++)
    if (v->lane[i].pid == pid && v->lane[i].tid == tid) return i;
  v->lane = cedar_xrealloc(v->lane, sizeof(*v->lane) * (size_t)(v->n_lane + 1));
  struct viz_view_lane *l = &v->lane[v->n_lane];
  memset(l, 0, sizeof(*l));
  l->pid = pid, l->tid = tid, l->rank = -1, l->sort = tid;
  snprintf(l->name, sizeof l->name, "pid %d tid %d", pid, tid);
  return v->n_lane++;
}

static bool get_int(const cJSON *o, const char *k, int *out) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || fabs(x->valuedouble) > 2e9) return false;
  *out = (int)x->valuedouble;
  return true;
}

static double arg_num(const cJSON *args, const char *k, double dflt) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(args, k);
  return cJSON_IsNumber(x) && isfinite(x->valuedouble) ? x->valuedouble : dflt;
}

static const char *arg_str(const cJSON *args, const char *k) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(args, k);
  return cJSON_IsString(x) ? x->valuestring : "";
}

struct flow_end {
  double id;
  int lane;
  double ts;
  bool start, enclosing;
  int ev;
};

struct reader {
  struct viz_view *v;
  int cap_ev;
  struct flow_end *fe;
  int n_fe, cap_fe;
  int *open; /* "B" events waiting for their "E": event indices, a stack per file order */
  int n_open, cap_open;
};

static struct viz_view_ev *new_event(struct reader *R) {
  struct viz_view *v = R->v;
  if (v->n_ev == R->cap_ev) {
    R->cap_ev = R->cap_ev ? 2 * R->cap_ev : 1024;
    v->ev = cedar_xrealloc(v->ev, sizeof(*v->ev) * (size_t)R->cap_ev);
  }
  return &v->ev[v->n_ev++];
}

static void fill_args(struct viz_view *v, struct viz_view_ev *e, const cJSON *ev) {
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
  const cJSON *cat = cJSON_GetObjectItemCaseSensitive(ev, "cat");
  const char *op = arg_str(args, "op");
  if (!*op && cJSON_IsString(cat)) op = cat->valuestring;
  e->op = viz_view_sym(v, op);
  e->mode = viz_view_sym(v, arg_str(args, "mode"));
  e->phase = viz_view_sym(v, arg_str(args, "phase"));
  e->layer = (int)arg_num(args, "layer", -1);
  e->chunk = (int)arg_num(args, "chunk", -1);
  e->request = (int)arg_num(args, "request", -1);
  e->node = (int)arg_num(args, "node", -1);
  e->rank = (int)arg_num(args, "rank", -1);
  e->pos = (int64_t)arg_num(args, "pos", -1);
  e->n = (int64_t)arg_num(args, "n", -1);
  e->bytes = (int64_t)arg_num(args, "bytes", -1);
  e->flops = arg_num(args, "flops", -1);
}

/* One event i of the array. Returns 0 or CEDAR_EINVAL with the reason. */
static int read_event(struct reader *R, const cJSON *ev, int i, const char *path, char *err, size_t err_len) {
  struct viz_view *v = R->v;
  if (!cJSON_IsObject(ev)) {
    snprintf(err, err_len, "%s: event %d is not a JSON object", path, i);
    return CEDAR_EINVAL;
  }
  const cJSON *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph");
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(ev, "name");
  if (!cJSON_IsString(ph) || !ph->valuestring[0]) {
    snprintf(err, err_len, "%s: event %d has no \"ph\" (phase) string", path, i);
    return CEDAR_EINVAL;
  }
  char p = ph->valuestring[0];
  if (!strchr("XBEsftM", p)) { /* instant, counter, async, ...: not drawn */
    v->n_ignored++;
    return 0;
  }
  int pid = 0, tid = 0;
  if (!get_int(ev, "pid", &pid) || !get_int(ev, "tid", &tid)) {
    snprintf(err, err_len, "%s: event %d (ph \"%c\") has no integer \"pid\" and \"tid\"", path, i, p);
    return CEDAR_EINVAL;
  }
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
  if (p == 'M') {
    const char *nm = cJSON_IsString(name) ? name->valuestring : "";
    if (!strcmp(nm, "process_name") && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(args, "name")))
      snprintf(v->process, sizeof v->process, "%s", arg_str(args, "name"));
    else if (!strcmp(nm, "thread_name") && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(args, "name"))) {
      int l = lane_of(v, pid, tid); /* before indexing: it may move v->lane */
      snprintf(v->lane[l].name, sizeof v->lane[l].name, "%s", arg_str(args, "name"));
    } else if (!strcmp(nm, "thread_sort_index")) {
      int l = lane_of(v, pid, tid);
      v->lane[l].sort = (int)arg_num(args, "sort_index", tid);
    }
    return 0;
  }
  const cJSON *ts = cJSON_GetObjectItemCaseSensitive(ev, "ts");
  if (!cJSON_IsNumber(ts) || !isfinite(ts->valuedouble)) {
    snprintf(err, err_len, "%s: event %d (ph \"%c\") has no numeric \"ts\"", path, i, p);
    return CEDAR_EINVAL;
  }
  if (fabs(ts->valuedouble) > VIEW_MAX_US) {
    snprintf(err, err_len, "%s: event %d (ph \"%c\") has \"ts\" %g, beyond +-%g microseconds (a timestamp that "
             "far makes the page's times infinite)", path, i, p, ts->valuedouble, VIEW_MAX_US);
    return CEDAR_EINVAL;
  }
  int lane = lane_of(v, pid, tid);
  if (p == 'X' || p == 'B') {
    const cJSON *dur = cJSON_GetObjectItemCaseSensitive(ev, "dur");
    if (p == 'X' && (!cJSON_IsNumber(dur) || !isfinite(dur->valuedouble) || dur->valuedouble < 0 ||
                     dur->valuedouble > VIEW_MAX_US)) {
      snprintf(err, err_len, "%s: complete event %d has no non-negative numeric \"dur\" of at most %g microseconds", path, i,
               VIEW_MAX_US);
      return CEDAR_EINVAL;
    }
    struct viz_view_ev *e = new_event(R);
    memset(e, 0, sizeof(*e));
    e->lane = lane;
    e->ts = ts->valuedouble;
    e->dur = p == 'X' ? dur->valuedouble : -1; /* B: closed by its E */
    e->name = cedar_xstrdup(cJSON_IsString(name) ? name->valuestring : "");
    fill_args(v, e, ev);
    if (e->rank >= 0 && v->lane[lane].rank < 0) v->lane[lane].rank = e->rank;
    if (p == 'B') {
      if (R->n_open == R->cap_open) {
        R->cap_open = R->cap_open ? 2 * R->cap_open : 64;
        R->open = cedar_xrealloc(R->open, sizeof(int) * (size_t)R->cap_open);
      }
      R->open[R->n_open++] = v->n_ev - 1;
    }
    return 0;
  }
  if (p == 'E') {
    for (int k = R->n_open - 1; k >= 0; k--) {
      struct viz_view_ev *e = &v->ev[R->open[k]];
      if (e->lane != lane) continue;
      if (ts->valuedouble < e->ts) {
        snprintf(err, err_len, "%s: end event %d (ts %g) is before its begin (ts %g)", path, i, ts->valuedouble, e->ts);
        return CEDAR_EINVAL;
      }
      e->dur = ts->valuedouble - e->ts;
      memmove(&R->open[k], &R->open[k + 1], sizeof(int) * (size_t)(R->n_open - k - 1));
      R->n_open--;
      return 0;
    }
    snprintf(err, err_len, "%s: end event %d has no open begin event on pid %d tid %d", path, i, pid, tid);
    return CEDAR_EINVAL;
  }
  /* s, t, f: one end of a flow */
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(ev, "id");
  double idv;
  if (cJSON_IsNumber(id))
    idv = id->valuedouble;
  else if (cJSON_IsString(id)) { /* any string: its FNV-1a hash, in the 53 bits a double holds */
    uint64_t h = 1469598103934665603u;
    for (const unsigned char *c = (const unsigned char *)id->valuestring; *c; c++) h = (h ^ *c) * 1099511628211u;
    idv = (double)(h >> 11);
  }
  else {
    snprintf(err, err_len, "%s: flow event %d has no \"id\"", path, i);
    return CEDAR_EINVAL;
  }
  if (p == 't') return 0; /* a flow step: the arrow is drawn start to finish */
  const cJSON *bp = cJSON_GetObjectItemCaseSensitive(ev, "bp");
  if (R->n_fe == R->cap_fe) {
    R->cap_fe = R->cap_fe ? 2 * R->cap_fe : 256;
    R->fe = cedar_xrealloc(R->fe, sizeof(*R->fe) * (size_t)R->cap_fe);
  }
  R->fe[R->n_fe++] = (struct flow_end){idv, lane, ts->valuedouble, p == 's',
                                       p == 's' || (cJSON_IsString(bp) && !strcmp(bp->valuestring, "e")), -1};
  return 0;
}

static int cmp_ev(const void *a, const void *b) {
  const struct viz_view_ev *x = a, *y = b;
  if (x->lane != y->lane) return x->lane - y->lane;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  return x->dur > y->dur ? -1 : x->dur < y->dur; /* the enclosing slice first */
}

static int cmp_lane(const void *a, const void *b) {
  const struct viz_view_lane *x = a, *y = b;
  if (x->rank != y->rank) return x->rank - y->rank;
  if (x->sort != y->sort) return x->sort - y->sort;
  if (x->pid != y->pid) return x->pid - y->pid;
  return x->tid - y->tid;
}

static int cmp_fe(const void *a, const void *b) {
  const struct flow_end *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return (int)y->start - (int)x->start; /* start first */
}

/* The slice a flow end binds to: the innermost one enclosing ts on its lane
 * (or, for a finish without bp "e", the next to start there). */
static int bind(const struct viz_view *v, const int *lane0, const struct flow_end *f) {
  int lo = lane0[f->lane], hi = lane0[f->lane + 1];
  int found = -1;
  /* the last slice starting at or before ts */
  int a = lo, b = hi;
  while (a < b) {
    int m = (a + b) / 2;
    if (v->ev[m].ts <= f->ts) a = m + 1;
    else b = m;
  }
  for (int k = a - 1; k >= lo; k--) {
    if (v->ev[k].ts + v->ev[k].dur >= f->ts) {
      found = k;
      break;
    }
    if (v->ev[k].depth == 0) break; /* nothing earlier at depth 0 can enclose ts */
  }
  if (found < 0 && !f->enclosing && a < hi) found = a;
  return found;
}

static int finish(struct reader *R, const char *path, char *err, size_t err_len) {
  struct viz_view *v = R->v;
  for (int k = 0; k < R->n_open; k++)
    if (v->ev[R->open[k]].dur < 0) {
      snprintf(err, err_len, "%s: begin event \"%s\" is never ended", path, v->ev[R->open[k]].name);
      return CEDAR_EINVAL;
    }
  if (v->n_ev == 0) {
    snprintf(err, err_len, "%s: no slices (complete \"X\" or begin/end events) to show", path);
    return CEDAR_EINVAL;
  }
  /* Lanes in display order, events renumbered to them. */
  for (int i = 0; i < v->n_lane; i++)
    if (v->lane[i].rank < 0) v->lane[i].rank = v->lane[i].pid;
  int *order = cedar_xmalloc(sizeof(int) * (size_t)v->n_lane);
  struct viz_view_lane *tmp = cedar_xmalloc(sizeof(*tmp) * (size_t)v->n_lane);
  /* insertion sort of lane indices by the key (lanes are few) */
  for (int i = 0; i < v->n_lane; i++) order[i] = i;
  for (int i = 1; i < v->n_lane; i++)
    for (int j = i; j > 0 && cmp_lane(&v->lane[order[j]], &v->lane[order[j - 1]]) < 0; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  int *newpos = cedar_xmalloc(sizeof(int) * (size_t)v->n_lane);
  for (int i = 0; i < v->n_lane; i++) {
    tmp[i] = v->lane[order[i]];
    newpos[order[i]] = i;
  }
  memcpy(v->lane, tmp, sizeof(*tmp) * (size_t)v->n_lane);
  for (int i = 0; i < v->n_ev; i++) v->ev[i].lane = newpos[v->ev[i].lane];
  for (int i = 0; i < R->n_fe; i++) R->fe[i].lane = newpos[R->fe[i].lane];
  free(order);
  free(tmp);
  free(newpos);

  qsort(v->ev, (size_t)v->n_ev, sizeof(*v->ev), cmp_ev);
  int *lane0 = cedar_xmalloc(sizeof(int) * (size_t)(v->n_lane + 1));
  for (int l = 0, k = 0; l <= v->n_lane; l++) {
    while (k < v->n_ev && v->ev[k].lane < l) k++;
    lane0[l] = k;
  }
  /* Depth: slices of a lane nest or are disjoint; a partial overlap is an error. */
  int *stack = cedar_xmalloc(sizeof(int) * (size_t)v->n_ev);
  for (int l = 0; l < v->n_lane; l++) {
    int sp = 0;
    for (int k = lane0[l]; k < lane0[l + 1]; k++) {
      struct viz_view_ev *e = &v->ev[k];
      while (sp && v->ev[stack[sp - 1]].ts + v->ev[stack[sp - 1]].dur <= e->ts) sp--;
      if (sp) {
        const struct viz_view_ev *o = &v->ev[stack[sp - 1]];
        /* 1e-6 us: the rounding of two decimal timestamps */
        if (e->ts + e->dur > o->ts + o->dur + 1e-6) {
          snprintf(err, err_len, "%s: slices \"%s\" and \"%s\" on lane \"%s\" overlap without nesting", path, o->name,
                   e->name, v->lane[l].name);
          free(stack);
          free(lane0);
          return CEDAR_EINVAL;
        }
      }
      e->depth = sp;
      stack[sp++] = k;
    }
  }
  free(stack);
  /* Flows: pair the ends by id, bind each to its slice. */
  if (R->n_fe) qsort(R->fe, (size_t)R->n_fe, sizeof(*R->fe), cmp_fe); /* none: fe may be NULL */
  v->flow = cedar_xmalloc(sizeof(*v->flow) * (size_t)(R->n_fe / 2 + 1));
  for (int i = 0; i < R->n_fe;) {
    int j = i;
    while (j < R->n_fe && R->fe[j].id == R->fe[i].id) j++;
    if (j - i != 2 || !R->fe[i].start || R->fe[i + 1].start) {
      snprintf(err, err_len, "%s: flow id %g has %d ends; a flow is one \"s\" and one \"f\"", path, R->fe[i].id,
               j - i);
      free(lane0);
      return CEDAR_EINVAL;
    }
    int a = bind(v, lane0, &R->fe[i]), b = bind(v, lane0, &R->fe[i + 1]);
    if (a < 0 || b < 0) {
      snprintf(err, err_len, "%s: flow id %g is not bound to a slice at its %s", path, R->fe[i].id,
               a < 0 ? "start" : "finish");
      free(lane0);
      return CEDAR_EINVAL;
    }
    v->flow[v->n_flow][0] = a;
    v->flow[v->n_flow][1] = b;
    v->n_flow++;
    i = j;
  }
  free(lane0);
  return 0;
}

int viz_view_read_trace(struct viz_view *v, const char *path, char *err, size_t err_len) {
  memset(v, 0, sizeof(*v));
  size_t len = 0;
  char *text = read_file(path, &len, err, err_len);
  if (!text) return CEDAR_EIO;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
  if (!root) {
    size_t off = end && end >= text ? (size_t)(end - text) : 0;
    int line = 1, col = 1;
    for (size_t i = 0; i < off && i < len; i++) {
      if (text[i] == '\n') line++, col = 1;
      else col++;
    }
    snprintf(err, err_len, "%s:%d:%d: not valid JSON (a Chrome trace is a JSON object with \"traceEvents\")", path,
             line, col);
    free(text);
    return CEDAR_EINVAL;
  }
  free(text);
  const cJSON *evs = cJSON_IsArray(root) ? root : cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
  if (!cJSON_IsArray(evs)) {
    snprintf(err, err_len, "%s: no \"traceEvents\" array: not a Chrome Trace Event file", path);
    cJSON_Delete(root);
    return CEDAR_EINVAL;
  }
  struct reader R = {.v = v};
  int rc = 0, i = 0;
  snprintf(v->process, sizeof v->process, "trace");
  for (const cJSON *e = evs->child; e && !rc; e = e->next, i++) rc = read_event(&R, e, i, path, err, err_len);
  cJSON_Delete(root);
  if (!rc) rc = finish(&R, path, err, err_len);
  free(R.fe);
  free(R.open);
  if (rc) viz_view_free(v);
  return rc;
}

void viz_view_free(struct viz_view *v) {
  for (int i = 0; i < v->n_ev; i++) free(v->ev[i].name);
  free(v->ev);
  free(v->lane);
  free(v->flow);
  for (int i = 0; i < v->n_sym; i++) free(v->sym[i]);
  free(v->sym);
  struct viz_view_graph *g = &v->g;
  free(g->name);
  free(g->a);
  free(g->b);
  free(g->edge);
  free(g->w);
  free(g->level);
  free(g->crit);
  free(g->path);
  memset(v, 0, sizeof(*v));
}
