/* view_html.c: the page `cedar view` writes (view.h): one HTML file with the
 * CSS, the data as JSON in a <script type="application/json"> block and
 * viz/view.js inlined. The data is columnar (one array per field, events
 * sorted by lane and start) so the page parses 100k events in one
 * JSON.parse; strings are escaped so that no "<" appears inside a script. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/file.h"
#include "scheduler/plan_bus.h"
#include "viz/view.h"

/* A JSON string, with <, > and & as \u escapes (safe inside <script>). */
static void jstr(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p < 0x20 || *p == '<' || *p == '>' || *p == '&') fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

void viz_html_text(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else if (*s == '"') fputs("&quot;", f);
    else fputc(*s, f);
  }
}

#define COLUMN(key, fmt, expr)                                  \
  do {                                                          \
    fprintf(f, ",\"%s\":[", key);                               \
    for (int i = 0; i < v->n_ev; i++) {                         \
      const struct viz_view_ev *e = &v->ev[i];                  \
      (void)e;                                                  \
      fprintf(f, i ? "," fmt : fmt, expr);                      \
    }                                                           \
    fputc(']', f);                                              \
  } while (0)

static void write_events(FILE *f, const struct viz_view *v, double t0) {
  fprintf(f, "\"ev\":{\"n\":%d", v->n_ev);
  COLUMN("lane", "%d", e->lane);
  COLUMN("depth", "%d", e->depth);
  COLUMN("ts", "%.3f", e->ts - t0);
  COLUMN("dur", "%.3f", e->dur);
  COLUMN("op", "%d", e->op);
  COLUMN("mode", "%d", e->mode);
  COLUMN("phase", "%d", e->phase);
  COLUMN("layer", "%d", e->layer);
  COLUMN("chunk", "%d", e->chunk);
  COLUMN("request", "%d", e->request);
  COLUMN("node", "%d", e->node);
  COLUMN("pos", "%" PRId64, e->pos);
  COLUMN("len", "%" PRId64, e->n);
  COLUMN("bytes", "%" PRId64, e->bytes);
  COLUMN("flops", "%.6g", e->flops);
  COLUMN("crit", "%d", e->crit ? 1 : 0);
  fputs(",\"name\":[", f);
  for (int i = 0; i < v->n_ev; i++) {
    if (i) fputc(',', f);
    jstr(f, v->ev[i].name);
  }
  fputs("]}", f);
}

static void write_graph(FILE *f, const struct viz_view_graph *g) {
  fprintf(f, ",\"graph\":{\"measured\":%s,\"crit_w\":%.3f,\"n_crit\":%d,\"name\":[", g->measured ? "true" : "false",
          g->crit_w, g->n_crit);
  for (int k = 0; k < g->n_node; k++) {
    if (k) fputc(',', f);
    jstr(f, g->name[k]);
  }
  fputs("],\"a\":[", f);
  for (int k = 0; k < g->n_node; k++) fprintf(f, k ? ",%" PRId64 : "%" PRId64, g->a[k]);
  fputs("],\"b\":[", f);
  for (int k = 0; k < g->n_node; k++) fprintf(f, k ? ",%" PRId64 : "%" PRId64, g->b[k]);
  fputs("],\"w\":[", f);
  for (int k = 0; k < g->n_node; k++) fprintf(f, k ? ",%.3f" : "%.3f", g->w[k]);
  fputs("],\"level\":[", f);
  for (int k = 0; k < g->n_node; k++) fprintf(f, k ? ",%d" : "%d", g->level[k]);
  fputs("],\"crit\":[", f);
  for (int k = 0; k < g->n_node; k++) fprintf(f, k ? ",%d" : "%d", g->crit[k] ? 1 : 0);
  fputs("],\"path\":[", f);
  for (int i = 0; i < g->n_crit; i++) fprintf(f, i ? ",%d" : "%d", g->path[i]);
  fputs("],\"edges\":[", f);
  for (int e = 0; e < g->n_edge; e++) fprintf(f, e ? ",%d,%d" : "%d,%d", g->edge[e][0], g->edge[e][1]);
  fputs("]}", f);
}

static void write_plan(FILE *f, const struct plan *p) {
  fputs(",\"plan\":{\"name\":", f);
  jstr(f, p->name ? p->name : "");
  fputs(",\"description\":", f);
  jstr(f, p->description ? p->description : "");
  fprintf(f, ",\"ced\":%s,\"window\":%d,\"topk\":%d,\"replay_decoder\":%d,\"chunk\":%d,\"layers\":[",
          p->serving.ced ? "true" : "false", p->model.window, p->model.topk, p->serving.replay_decoder,
          p->serving.prefill_chunk);
  for (int i = 0; i < p->n_layers; i++) {
    const struct plan_layer *l = &p->layer[i];
    fprintf(f, "%s{\"index\":%d,\"region\":\"%s\",\"mode\":\"%s\",\"ratio\":%d,\"kv\":%d,\"topk\":%d,\"pool\":%d,"
               "\"cand\":\"%s\",\"engram\":%s}",
            i ? "," : "", l->index, plan_region_name(l->region), plan_mode_name(l->mode), l->ratio, l->kv_src,
            l->topk_src, l->pool_src, plan_cand_name(l->cand), l->engram ? "true" : "false");
  }
  fputs("],\"buses\":[", f);
  int max = PLAN_BUS_COUNT * p->n_layers;
  struct plan_bus *bus = cedar_xmalloc(sizeof(*bus) * (size_t)(max > 0 ? max : 1));
  int nb = plan_buses(p, bus, max);
  for (int b = 0; b < nb; b++) {
    fprintf(f, "%s{\"kind\":\"%s\",\"writer\":%d,\"readers\":[", b ? "," : "", plan_bus_name(bus[b].kind),
            bus[b].writer);
    for (int r = 0; r < bus[b].n_readers; r++) fprintf(f, r ? ",%d" : "%d", bus[b].readers[r]);
    fputs("]}", f);
  }
  free(bus);
  fputs("]}", f);
}

static void write_data(FILE *f, const struct viz_view *v, const struct plan *p) {
  double t0 = v->ev[0].ts;
  for (int i = 1; i < v->n_ev; i++)
    if (v->ev[i].ts < t0) t0 = v->ev[i].ts;
  fputs("{\"process\":", f);
  jstr(f, v->process);
  fprintf(f, ",\"t0\":%.3f,\"ignored\":%d,\"lanes\":[", t0, v->n_ignored);
  for (int l = 0; l < v->n_lane; l++) {
    fprintf(f, "%s{\"name\":", l ? "," : "");
    jstr(f, v->lane[l].name);
    fprintf(f, ",\"rank\":%d,\"pid\":%d,\"tid\":%d}", v->lane[l].rank, v->lane[l].pid, v->lane[l].tid);
  }
  fputs("],\"sym\":[", f);
  for (int i = 0; i < v->n_sym; i++) {
    if (i) fputc(',', f);
    jstr(f, v->sym[i]);
  }
  fputs("],", f);
  write_events(f, v, t0);
  fputs(",\"flows\":[", f);
  for (int i = 0; i < v->n_flow; i++) fprintf(f, i ? ",%d,%d" : "%d,%d", v->flow[i][0], v->flow[i][1]);
  fputc(']', f);
  if (v->has_graph) write_graph(f, &v->g);
  if (p) write_plan(f, p);
  fputc('}', f);
}

int viz_view_write_html(const struct viz_view *v, const struct plan *p, const char *title, const char *path,
                        char *err, size_t err_len) {
  struct cedar_out o; /* base/file.h: a temporary renamed into place only when whole */
  if (cedar_out_open(&o, path, err, err_len)) return CEDAR_EIO;
  FILE *f = o.f;
  fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>cedar view: ", f);
  viz_html_text(f, title);
  fputs("</title>\n<style>\n", f);
  fputs(viz_view_css, f);
  fputs("</style></head>\n<body>\n<header><h1>cedar view: <span id=\"title\">", f);
  viz_html_text(f, title);
  fputs("</span></h1><div id=\"summary\"></div></header>\n"
        "<section id=\"timeline-section\"><h2>Timeline</h2>"
        "<div class=\"controls\"><label><input type=\"checkbox\" id=\"arrows\" checked> dependency and transfer "
        "arrows</label> <span class=\"hint\">wheel: zoom, drag: pan, double-click: reset</span></div>"
        "<div id=\"legend\"></div>"
        "<div id=\"tl-wrap\"><canvas id=\"timeline\"></canvas></div></section>\n"
        "<section id=\"graph-section\"><h2>Task graph</h2><div id=\"graph-summary\"></div>"
        "<div id=\"graph-wrap\"><canvas id=\"graph\"></canvas></div></section>\n"
        "<section id=\"plan-section\"><h2>Plan</h2><div id=\"plan\"></div></section>\n"
        "<div id=\"tip\" role=\"tooltip\"></div>\n"
        "<script id=\"cedar-data\" type=\"application/json\">",
        f);
  write_data(f, v, p);
  fputs("</script>\n<script>\n", f);
  fputs(viz_view_js, f);
  fputs("</script>\n</body></html>\n", f);
  return cedar_out_commit(&o, err, err_len) ? CEDAR_EIO : 0;
}
