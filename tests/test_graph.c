/* test_graph.c: the graph compiler (scheduler/graph.h), compile only: no
 * weights, nothing executed.
 *
 * Generic checks, on every graph built here (check_generic):
 *  - edges point backwards, sorted, no duplicates, and are exactly the set
 *    the accesses imply, re-derived here data by data (RAW, WAR, WAW; an
 *    append waits only for the previous append, a reader for the last
 *    append); every stored edge has a conflicting access pair behind it; on
 *    small graphs every conflicting pair is ordered by the edges'
 *    transitive closure;
 *  - every activation and bus is first written, never read first; each
 *    data's last_use is the last node touching it; only KV pools are
 *    appended to, and nothing writes them otherwise;
 *  - ATTN nodes' bus slots match their accesses; a reuse layer reads the
 *    Top-K its topk_src wrote in the same tile, a reindex layer with
 *    `candidates: read` the pool its pool_src built in the same tile;
 *    encoder layers never touch a pool (SPEC 8.1 #3); ENGRAM_GATHER nodes
 *    wait for nothing (SPEC 8.6 #28: addresses from token ids only);
 *  - the chunk wavefront: ATTN(l, c) waits for the node that last wrote
 *    X(c) (EMBED, ENGRAM(l, c), MOE(l-1, c) or REPLAY_IN) and for
 *    ATTN(l, c-1) through the ring, and never for a later chunk.
 * Flow checks: CED prefill (plans/v41-mini.yaml, v41-flash.yaml, and the
 * alt-*.yaml schedules) for N in {1, 2, 127, 128, 129, 1000, 4096} and chunk
 * sizes odd and even, below and above N:
 *  - token-layers = 20N + 20 min(N, 128) (SPEC 6.2, 8.8 #39), counted from
 *    the ATTN nodes; decoder layer-forwards = 20 min(N, 128) (#38);
 *  - every encoder layer's tiles cover [0, N) once, every decoder layer's
 *    [N-R, N) once with r0 = N-R; decoder rings are touched only by replay
 *    tiles at or after r0 (#40: replay never reads local history before
 *    its start);
 *  - decoder KV sources are appended by DEC_KV nodes for every position
 *    exactly once, in order (#38), and their replay ATTN nodes never write
 *    KV; encoder sources' ATTN nodes always append; replay queries wait for
 *    the last decoder append;
 *  - the replay input reads exactly the encoder tiles holding its positions;
 *    one HEAD at N-1 (R rows with all_logits);
 *  - other replay lengths (300 > window, 1) hold the same properties with
 *    R = min(N, replay); a replay of 0 under CED is refused.
 * Dense prefill (plans/dense-40.yaml): 40N token-layers, every layer covers
 * [0, N), every source appends from its own ATTN. Decode steps: one ATTN and
 * one MOE per layer, n_layers token-layers, one DEC_KV per decoder source
 * under CED (SPEC 8.8 #43). graph_print and graph_dot list every node and
 * edge.
 *
 * Not here: executing graphs (tests of runtime/exec/exec.h, generate.h), the
 * values appended (the runtime side of #38, #40).
 * Run: ctest --test-dir build -R '^graph$', or build/tests/test_graph from
 * the repository root.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "scheduler/graph.h"
#include "scheduler/plan.h"
#include "tests/harness.h"

static struct plan plan; /* large (PLAN_MAX_LAYERS layers): off the stack */
static char err[512];
static const char *what = ""; /* the graph under test, for messages */
/* SPEC 6.2's literal figures apply to the 40-layer plans: 20N + 20 min(N, 128)
 * for the flash schedule under CED, 40N for the dense baseline. */
static enum { LIT_NONE, LIT_CED, LIT_DENSE } literal;

#define FAILF(...) EXPECT(0, __VA_ARGS__)

static bool load(const char *path) {
  return h_load_plan(path, &plan);
}

static bool is_write(enum graph_access m) { return m == GRAPH_W || m == GRAPH_RW; }

static int first_decoder(void) {
  for (int l = 0; l < plan.n_layers; l++)
    if (plan.layer[l].region == PLAN_DECODER) return l;
  return plan.n_layers;
}

static bool has_dep(const struct graph_node *nd, int from) {
  for (int i = 0; i < nd->n_dep; i++)
    if (nd->dep[i] == from) return true;
  return false;
}

static enum graph_access mode_of(const struct graph_node *nd, int data) {
  for (int u = 0; u < nd->n_use; u++)
    if (nd->use[u].data == data) return nd->use[u].mode;
  return 0;
}

/* ---- per-data access lists (CSR, in program order) ------------------------- */

struct accs {
  int *off;  /* (n_data + 1) */
  int *node; /* (total uses) */
  enum graph_access *mode;
};

static void accs_build(const struct graph *g, struct accs *A) {
  A->off = calloc((size_t)g->n_data + 1, sizeof(int));
  int total = 0;
  for (int k = 0; k < g->n_node; k++) {
    total += g->node[k].n_use;
    for (int u = 0; u < g->node[k].n_use; u++) A->off[g->node[k].use[u].data + 1]++;
  }
  for (int d = 0; d < g->n_data; d++) A->off[d + 1] += A->off[d];
  A->node = malloc(sizeof(int) * (size_t)(total + 1));
  A->mode = malloc(sizeof(*A->mode) * (size_t)(total + 1));
  int *fill = malloc(sizeof(int) * (size_t)(g->n_data + 1));
  memcpy(fill, A->off, sizeof(int) * (size_t)g->n_data);
  for (int k = 0; k < g->n_node; k++)
    for (int u = 0; u < g->node[k].n_use; u++) {
      int d = g->node[k].use[u].data, i = fill[d]++;
      A->node[i] = k;
      A->mode[i] = g->node[k].use[u].mode;
    }
  free(fill);
}

static void accs_free(struct accs *A) {
  free(A->off);
  free(A->node);
  free(A->mode);
}

/* ---- structure: uses, deps, data ------------------------------------------ */

/* Uses name valid data once each; deps are earlier, sorted, unique. */
static void check_nodes(const struct graph *g) {
  int64_t tl = 0;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    if (nd->op == GRAPH_ATTN) tl += nd->n;
    for (int u = 0; u < nd->n_use; u++) {
      int d = nd->use[u].data;
      enum graph_access m = nd->use[u].mode;
      EXPECT(d >= 0 && d < g->n_data, "%s: node %d uses data %d", what, k, d);
      EXPECT(m == GRAPH_R || m == GRAPH_W || m == GRAPH_RW || m == GRAPH_APPEND, "%s: node %d mode %d", what, k, m);
      for (int v = 0; v < u; v++) EXPECT(nd->use[v].data != d, "%s: %s uses %d twice", what, nd->name, d);
    }
    for (int i = 0; i < nd->n_dep; i++) {
      EXPECT(nd->dep[i] >= 0 && nd->dep[i] < k, "%s: %s (node %d) waits for node %d: not earlier", what,
             nd->name, k, nd->dep[i]);
      EXPECT(i == 0 || nd->dep[i] > nd->dep[i - 1], "%s: %s deps not sorted/unique", what, nd->name);
    }
  }
  EXPECT(tl == g->token_layers, "%s: token_layers %" PRId64 " but the ATTN nodes hold %" PRId64, what,
         g->token_layers, tl);
}

/* Activations and buses are written first; last_use is the last toucher;
 * appends only on KV pools, which nothing writes. */
static void check_data(const struct graph *g, const struct accs *A) {
  for (int d = 0; d < g->n_data; d++) {
    const struct graph_data *D = &g->data[d];
    int b = A->off[d], e = A->off[d + 1];
    int last = e > b ? A->node[e - 1] : -1;
    EXPECT(D->last_use == last, "%s: %s last_use %d, last node touching it %d", what, D->name, D->last_use, last);
    if ((D->kind == GRAPH_ACT || D->kind == GRAPH_BUS) && e > b)
      EXPECT(A->mode[b] == GRAPH_W, "%s: %s is first touched by %s as %s, not written", what, D->name,
             g->node[A->node[b]].name, graph_access_name(A->mode[b]));
    bool app = false, wr = false;
    for (int i = b; i < e; i++) app |= A->mode[i] == GRAPH_APPEND, wr |= is_write(A->mode[i]);
    if (app)
      EXPECT(D->kind == GRAPH_STATE && D->state == GRAPH_ST_KV && !wr, "%s: %s is appended to but is not a KV pool "
             "or is also written", what, D->name);
    if (D->kind == GRAPH_WEIGHTS) EXPECT(!wr && !app, "%s: weights %s are written", what, D->name);
  }
}

/* ---- edges ------------------------------------------------------------------ */

struct edge {
  int from, to;
};

static int cmp_edge(const void *a, const void *b) {
  const struct edge *x = a, *y = b;
  if (x->to != y->to) return x->to < y->to ? -1 : 1;
  return (x->from > y->from) - (x->from < y->from);
}

struct edges {
  struct edge *e;
  size_t n, cap;
};

static void push(struct edges *E, int from, int to) {
  if (from < 0) return;
  if (E->n == E->cap) {
    E->cap = E->cap ? 2 * E->cap : 1024;
    E->e = realloc(E->e, sizeof(*E->e) * E->cap);
  }
  E->e[E->n++] = (struct edge){from, to};
}

/* The edges the accesses imply, walking each data's accesses in order:
 * a read waits for the last write and the last append; a write for the last
 * write, the last append and every read since the last write; an append for
 * the last append and the last write (never for readers). */
static void derive_edges(const struct graph *g, const struct accs *A, struct edges *E) {
  for (int d = 0; d < g->n_data; d++) {
    int last_w = -1, last_a = -1, w_at = A->off[d] - 1; /* w_at: list index of the last write */
    for (int i = A->off[d]; i < A->off[d + 1]; i++) {
      int k = A->node[i];
      push(E, last_w, k);
      push(E, last_a, k);
      if (A->mode[i] == GRAPH_APPEND) {
        last_a = k;
      } else if (is_write(A->mode[i])) {
        for (int j = w_at + 1; j < i; j++)
          if (A->mode[j] == GRAPH_R) push(E, A->node[j], k);
        last_w = k;
        w_at = i;
      }
    }
  }
  qsort(E->e, E->n, sizeof(*E->e), cmp_edge);
  size_t m = 0;
  for (size_t i = 0; i < E->n; i++)
    if (m == 0 || E->e[i].from != E->e[m - 1].from || E->e[i].to != E->e[m - 1].to) E->e[m++] = E->e[i];
  E->n = m;
}

/* Stored edges == derived edges, node by node. */
static void compare_edges(const struct graph *g, const struct edges *E) {
  size_t i = 0;
  int reported = 0;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    size_t j = i;
    while (j < E->n && E->e[j].to == k) j++;
    bool same = (size_t)nd->n_dep == j - i;
    for (int t = 0; same && t < nd->n_dep; t++) same = nd->dep[t] == E->e[i + t].from;
    if (!same && reported++ < 5)
      FAILF("%s: %s (node %d) has %d deps, the accesses imply %zu", what, nd->name, k, nd->n_dep, j - i);
    i = j;
  }
}

static bool conflicts(enum graph_access early, enum graph_access late) {
  if (is_write(early) || is_write(late)) return true; /* RAW, WAR, WAW */
  return early == GRAPH_APPEND;                         /* read or append after an append */
}

/* Every stored edge is justified by a conflicting pair of accesses. */
static void check_edge_reasons(const struct graph *g) {
  int reported = 0;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    for (int i = 0; i < nd->n_dep; i++) {
      const struct graph_node *from = &g->node[nd->dep[i]];
      bool why = false;
      for (int u = 0; u < nd->n_use && !why; u++) {
        enum graph_access m = mode_of(from, nd->use[u].data);
        why = m && conflicts(m, nd->use[u].mode);
      }
      if (!why && reported++ < 5) FAILF("%s: edge %s -> %s shares no conflicting access", what, from->name, nd->name);
    }
  }
}

/* Small graphs: every conflicting access pair is ordered by the closure. */
static void check_closure(const struct graph *g, const struct accs *A) {
  int n = g->n_node, words = (n + 63) / 64;
  uint64_t *reach = calloc((size_t)n * words, sizeof(uint64_t)); /* reach[k]: nodes k waits for, transitively */
  for (int k = 0; k < n; k++)
    for (int i = 0; i < g->node[k].n_dep; i++) {
      int f = g->node[k].dep[i];
      for (int w = 0; w < words; w++) reach[(size_t)k * words + w] |= reach[(size_t)f * words + w];
      reach[(size_t)k * words + f / 64] |= 1ull << (f % 64);
    }
  int reported = 0;
  for (int d = 0; d < g->n_data; d++)
    for (int j = A->off[d]; j < A->off[d + 1]; j++)
      for (int i = A->off[d]; i < j; i++) {
        int a = A->node[i], b = A->node[j];
        if (!conflicts(A->mode[i], A->mode[j])) continue;
        if (!(reach[(size_t)b * words + a / 64] >> (a % 64) & 1) && reported++ < 5)
          FAILF("%s: %s and %s conflict on %s but are not ordered", what, g->node[a].name, g->node[b].name,
                g->data[d].name);
      }
  free(reach);
}

/* ---- tiles, buses, wavefront ---------------------------------------------- */

/* Nodes from `rp` on belong to the replay phase (CED prefill). */
struct tiles {
  int rp, n_chunk, n_layers;
  int *attn; /* (2, n_chunk, n_layers): ATTN node of (phase, chunk, layer), -1 none */
};

static int phase_of(const struct tiles *T, int k) { return k >= T->rp; }

static int *attn_at(const struct tiles *T, int phase, int chunk, int layer) {
  return &T->attn[((size_t)phase * T->n_chunk + chunk) * T->n_layers + layer];
}

static void tiles_build(const struct graph *g, struct tiles *T) {
  T->rp = g->n_node;
  T->n_chunk = 1;
  T->n_layers = plan.n_layers;
  for (int k = 0; k < g->n_node; k++) {
    if (g->node[k].op == GRAPH_REPLAY_IN && T->rp == g->n_node) T->rp = k;
    if (g->node[k].chunk + 1 > T->n_chunk) T->n_chunk = g->node[k].chunk + 1;
  }
  size_t n = (size_t)2 * T->n_chunk * T->n_layers;
  T->attn = malloc(sizeof(int) * n);
  for (size_t i = 0; i < n; i++) T->attn[i] = -1;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    if (nd->op != GRAPH_ATTN) continue;
    int *slot = attn_at(T, phase_of(T, k), nd->chunk, nd->layer);
    EXPECT(*slot < 0, "%s: two ATTN nodes for layer %d tile %d", what, nd->layer, nd->chunk);
    *slot = k;
  }
}

/* A reader of a bus takes it from the right producer, in the same tile. */
static void check_bus_in(const struct graph *g, const struct tiles *T, int k, int slot, int src, int out_slot) {
  const struct graph_node *nd = &g->node[k];
  int p = *attn_at(T, phase_of(T, k), nd->chunk, src);
  if (p < 0) {
    FAILF("%s: %s reads L%d's bus but L%d has no ATTN in its tile", what, nd->name, src, src);
    return;
  }
  EXPECT(nd->bus[slot] >= 0 && nd->bus[slot] == g->node[p].bus[out_slot], "%s: %s reads bus %d, %s wrote %d",
         what, nd->name, nd->bus[slot], g->node[p].name, g->node[p].bus[out_slot]);
  EXPECT(mode_of(nd, nd->bus[slot]) == GRAPH_R, "%s: %s does not read its input bus", what, nd->name);
  EXPECT(has_dep(nd, p), "%s: %s does not wait for %s", what, nd->name, g->node[p].name);
}

/* Bus slots per layer mode (graph.h's enum graph_bus_slot). */
static void check_buses(const struct graph *g, const struct tiles *T, int k) {
  const struct graph_node *nd = &g->node[k];
  const struct plan_layer *L = &plan.layer[nd->layer];
  bool idx = plan_is_index_source(L), build = L->cand == PLAN_CAND_BUILD;
  bool read = L->mode == PLAN_REINDEX && L->cand == PLAN_CAND_READ;
  EXPECT((nd->bus[GRAPH_TOPK_OUT] >= 0) == idx, "%s: %s Top-K out %d", what, nd->name, nd->bus[GRAPH_TOPK_OUT]);
  EXPECT((nd->bus[GRAPH_POOL_OUT] >= 0) == build, "%s: %s pool out", what, nd->name);
  EXPECT(!!(nd->flags & GRAPH_F_BUILD_POOL) == build, "%s: %s BUILD_POOL flag", what, nd->name);
  EXPECT((nd->bus[GRAPH_TOPK_IN] >= 0) == (L->mode == PLAN_REUSE), "%s: %s Top-K in", what, nd->name);
  EXPECT((nd->bus[GRAPH_POOL_IN] >= 0) == read, "%s: %s pool in", what, nd->name);
  if (L->region == PLAN_ENCODER)
    EXPECT(nd->bus[GRAPH_POOL_OUT] < 0 && nd->bus[GRAPH_POOL_IN] < 0, "%s: encoder %s uses a pool", what, nd->name);
  if (idx) EXPECT(mode_of(nd, nd->bus[GRAPH_TOPK_OUT]) == GRAPH_W, "%s: %s does not write its Top-K", what, nd->name);
  if (build) EXPECT(mode_of(nd, nd->bus[GRAPH_POOL_OUT]) == GRAPH_W, "%s: %s does not write its pool", what, nd->name);
  if (L->mode == PLAN_REUSE) check_bus_in(g, T, k, GRAPH_TOPK_IN, L->topk_src, GRAPH_TOPK_OUT);
  if (read) check_bus_in(g, T, k, GRAPH_POOL_IN, L->pool_src, GRAPH_POOL_OUT);
  EXPECT(mode_of(nd, nd->x) == GRAPH_RW && mode_of(nd, nd->aux) == GRAPH_RW, "%s: %s does not update X and pre",
         what, nd->name);
  EXPECT(g->data[nd->x].a0 == nd->a, "%s: %s works on X of position %" PRId64, what, nd->name, g->data[nd->x].a0);
}

/* Is node w the expected last writer of X before ATTN nd? */
static bool x_writer_ok(const struct graph *g, const struct tiles *T, int k, int w) {
  const struct graph_node *nd = &g->node[k], *W = &g->node[w];
  if (phase_of(T, w) != phase_of(T, k) || W->chunk != nd->chunk) return false;
  switch (W->op) {
  case GRAPH_EMBED: return nd->layer == 0;
  case GRAPH_REPLAY_IN: return nd->layer == first_decoder();
  case GRAPH_ENGRAM: return W->layer == nd->layer;
  case GRAPH_MOE: return W->layer == nd->layer - 1;
  default: return false;
  }
}

/* The wavefront: X(c)'s last writer, ATTN(l, c-1), nothing from a later tile. */
static void check_wavefront(const struct graph *g, const struct tiles *T) {
  int *last_w = malloc(sizeof(int) * (size_t)g->n_data);
  for (int d = 0; d < g->n_data; d++) last_w[d] = -1;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    for (int i = 0; i < nd->n_dep; i++) {
      int f = nd->dep[i];
      if (phase_of(T, f) == phase_of(T, k))
        EXPECT(g->node[f].chunk <= nd->chunk, "%s: %s waits for %s of a later tile", what, nd->name, g->node[f].name);
    }
    if (nd->op == GRAPH_ENGRAM_GATHER) EXPECT(nd->n_dep == 0, "%s: %s waits for %d nodes", what, nd->name, nd->n_dep);
    if (nd->op == GRAPH_ATTN) {
      int w = last_w[nd->x];
      EXPECT(w >= 0 && x_writer_ok(g, T, k, w) && has_dep(nd, w), "%s: %s: X last written by %s", what, nd->name,
             w >= 0 ? g->node[w].name : "nothing");
      if (nd->chunk > 0) {
        int prev = *attn_at(T, phase_of(T, k), nd->chunk - 1, nd->layer);
        EXPECT(prev >= 0 && has_dep(nd, prev), "%s: %s does not wait for the previous tile's ATTN", what, nd->name);
      }
      check_buses(g, T, k);
    }
    for (int u = 0; u < nd->n_use; u++)
      if (is_write(nd->use[u].mode)) last_w[nd->use[u].data] = k;
  }
  free(last_w);
}

/* ---- print and dot ------------------------------------------------------ */

static char *slurp(FILE *f) {
  long n = ftell(f);
  rewind(f);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = 0;
  return s;
}

/* Every node name in order; for DOT, every edge line "nF -> nT" in order. */
static void check_text(const struct graph *g, const char *s, bool dot) {
  const char *cur = s;
  for (int k = 0; k < g->n_node; k++) {
    const char *hit = strstr(cur, g->node[k].name);
    EXPECT(hit, "%s: %s output lacks node %d %s", what, dot ? "dot" : "print", k, g->node[k].name);
    if (!hit) return;
    cur = hit + 1;
  }
  if (!dot) return;
  int64_t arrows = 0, want = 0;
  for (const char *p = strstr(s, "->"); p; p = strstr(p + 2, "->")) arrows++;
  for (int k = 0; k < g->n_node; k++) {
    want += g->node[k].n_dep;
    for (int i = 0; i < g->node[k].n_dep; i++) {
      char line[64];
      snprintf(line, sizeof line, " n%d -> n%d;", g->node[k].dep[i], k);
      const char *hit = strstr(cur, line);
      EXPECT(hit, "%s: dot lacks edge %s", what, line);
      if (!hit) return;
      cur = hit + 1;
    }
  }
  EXPECT(arrows == want, "%s: dot has %" PRId64 " arrows for %" PRId64 " edges", what, arrows, want);
}

static void check_print(const struct graph *g) {
  for (int mode = 0; mode < 3; mode++) {
    FILE *f = tmpfile();
    if (!f) {
      FAILF("tmpfile failed");
      return;
    }
    if (mode == 2)
      graph_dot(g, f);
    else
      graph_print(g, f, mode == 1);
    char *s = slurp(f);
    fclose(f);
    EXPECT(strlen(s) > 0, "%s: empty output", what);
    check_text(g, s, mode == 2);
    if (mode == 2) EXPECT(!strncmp(s, "digraph", 7) && strstr(s, "}\n"), "%s: not a DOT digraph", what);
    free(s);
  }
}

/* ---- all generic checks ------------------------------------------------------ */

static void check_generic(const struct graph *g, bool print) {
  struct accs A;
  accs_build(g, &A);
  check_nodes(g);
  check_data(g, &A);
  struct edges E = {0};
  derive_edges(g, &A, &E);
  compare_edges(g, &E);
  free(E.e);
  check_edge_reasons(g);
  if (g->n_node <= 3000) check_closure(g, &A);
  struct tiles T;
  tiles_build(g, &T);
  check_wavefront(g, &T);
  free(T.attn);
  accs_free(&A);
  if (print) check_print(g);
}

/* ---- flow checks ------------------------------------------------------------ */

static int kv_data(const struct graph *g, int layer) {
  for (int d = 0; d < g->n_data; d++)
    if (g->data[d].kind == GRAPH_STATE && g->data[d].state == GRAPH_ST_KV && g->data[d].layer == layer) return d;
  return -1;
}

/* Layer l's ATTN tiles cover [lo, N) exactly once (positions below lo never),
 * with replay start r0; returns the positions they hold. */
static int64_t check_cover(const struct graph *g, int l, int64_t lo, int64_t N, int64_t r0) {
  uint8_t *cnt = calloc((size_t)N, 1);
  int64_t held = 0;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    if (nd->op != GRAPH_ATTN || nd->layer != l) continue;
    held += nd->n;
    EXPECT(nd->n >= 1 && nd->a >= lo && nd->a + nd->n <= N, "%s: %s holds [%" PRId64 ", %" PRId64 ") outside [%"
           PRId64 ", %" PRId64 ")", what, nd->name, nd->a, nd->a + nd->n, lo, N);
    EXPECT(nd->r0 == r0, "%s: %s has r0 %" PRId64 ", want %" PRId64, what, nd->name, nd->r0, r0);
    EXPECT(!!(nd->flags & GRAPH_F_REPLAY) == (r0 > 0), "%s: %s REPLAY flag", what, nd->name);
    for (int64_t p = nd->a; p < nd->a + nd->n && p < N; p++)
      if (p >= 0 && cnt[p] < 255) cnt[p]++;
  }
  int64_t bad = 0;
  for (int64_t p = 0; p < N; p++) bad += cnt[p] != (p >= lo);
  EXPECT(bad == 0, "%s: layer %d: %" PRId64 " positions not covered exactly once in [%" PRId64 ", %" PRId64 ")", what,
         l, bad, lo, N);
  free(cnt);
  return held;
}

/* Who appends source l's entries, and in what order: [lo, hi) contiguously,
 * each position once. dec_kv: DEC_KV nodes (CED decoder sources), else the
 * source's own ATTN with GRAPH_F_WRITE_KV. Returns the last appender. */
static int check_appends(const struct graph *g, int l, int64_t lo, int64_t hi, bool dec_kv) {
  int kv = kv_data(g, l), last = -1;
  EXPECT(kv >= 0, "%s: source L%d has no KV pool data", what, l);
  int64_t next = lo;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    bool app = kv >= 0 && mode_of(nd, kv) == GRAPH_APPEND;
    if (nd->op == GRAPH_ATTN && nd->layer == l)
      EXPECT(app == !dec_kv && !!(nd->flags & GRAPH_F_WRITE_KV) == !dec_kv, "%s: %s %s KV", what, nd->name,
             dec_kv ? "writes" : "does not write");
    if (!app) continue;
    EXPECT(nd->layer == l && nd->op == (dec_kv ? GRAPH_DEC_KV : GRAPH_ATTN), "%s: %s appends to L%d's pool", what,
           nd->name, l);
    EXPECT(nd->a == next, "%s: %s appends from %" PRId64 ", the pool holds up to %" PRId64, what, nd->name, nd->a,
           next);
    next = nd->a + nd->n;
    last = k;
  }
  EXPECT(next == hi, "%s: L%d's appends end at %" PRId64 ", want %" PRId64, what, l, next, hi);
  return last;
}

/* Only layer l's own ATTN nodes touch its ring (SPEC 8.1 #4); under replay,
 * only at or after r0 (SPEC 8.8 #40), first at r0. */
static void check_rings(const struct graph *g, const struct accs *A, int64_t r0_dec) {
  int fd = first_decoder();
  for (int d = 0; d < g->n_data; d++) {
    if (g->data[d].state != GRAPH_ST_RING) continue;
    int l = g->data[d].layer;
    bool replay = g->flow == GRAPH_PREFILL_CED && l >= fd;
    for (int i = A->off[d]; i < A->off[d + 1]; i++) {
      const struct graph_node *nd = &g->node[A->node[i]];
      EXPECT(nd->op == GRAPH_ATTN && nd->layer == l, "%s: %s touches L%d's ring", what, nd->name, l);
      if (replay) EXPECT(nd->r0 == r0_dec && nd->a >= r0_dec, "%s: %s reads ring before replay start", what, nd->name);
      if (replay && i == A->off[d]) EXPECT(nd->a == r0_dec, "%s: L%d's replay starts at %" PRId64, what, l, nd->a);
    }
  }
}

/* HEAD nodes: one at N-1, or every row of [lo, N) with all_logits. */
static void check_heads(const struct graph *g, int64_t lo, int64_t N, bool all) {
  int64_t next = all ? lo : N - 1, rows = 0;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    if (nd->op != GRAPH_HEAD) continue;
    EXPECT(nd->a == next, "%s: %s at %" PRId64 ", want %" PRId64, what, nd->name, nd->a, next);
    const struct graph_data *x = &g->data[nd->x];
    EXPECT(x->a0 <= nd->a && mode_of(nd, nd->x) == GRAPH_R, "%s: %s reads X of %" PRId64, what, nd->name, x->a0);
    next = nd->a + nd->n;
    rows += nd->n;
  }
  EXPECT(next == N && rows == g->out_rows && rows == (all ? N - lo : 1), "%s: heads end at %" PRId64 " with %"
         PRId64 " rows (out_rows %" PRId64 ")", what, next, rows, g->out_rows);
}

/* DEC_KV reads its tile's encoder output, after the last encoder layer and
 * before the replay (nodes from rp on). */
static void check_dec_kv(const struct graph *g, int rp) {
  int fd = first_decoder();
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    if (nd->op != GRAPH_DEC_KV) continue;
    bool after = false;
    for (int i = 0; i < nd->n_dep; i++) {
      const struct graph_node *f = &g->node[nd->dep[i]];
      after |= f->op == GRAPH_MOE && f->layer == fd - 1 && f->chunk == nd->chunk && f->x == nd->x;
    }
    EXPECT(k < rp && after && mode_of(nd, nd->x) == GRAPH_R, "%s: %s does not read its encoder output", what,
           nd->name);
  }
}

/* REPLAY_IN reads exactly the encoder tiles holding its positions. */
static void check_replay_in(const struct graph *g, int rp) {
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    if (nd->op != GRAPH_REPLAY_IN) continue;
    int want = 0, got = 0;
    for (int e = 0; e < rp; e++) {
      const struct graph_node *em = &g->node[e];
      if (em->op != GRAPH_EMBED) continue;
      bool meets = em->a < nd->a + nd->n && nd->a < em->a + em->n;
      want += meets;
      enum graph_access m = mode_of(nd, em->x);
      got += meets && m == GRAPH_R;
      EXPECT(meets || !m, "%s: %s reads %s, which holds none of its positions", what, nd->name, g->data[em->x].name);
    }
    EXPECT(want > 0 && got == want, "%s: %s reads %d of the %d encoder tiles it needs", what, nd->name, got, want);
  }
}

/* Source-level checks shared by the flows: who appends, and when readers of
 * a pool may start. */
static void check_sources(const struct graph *g, int64_t lo, int64_t hi, int rp) {
  bool ced = g->flow != GRAPH_PREFILL_DENSE && plan.serving.ced && first_decoder() < plan.n_layers;
  for (int l = 0; l < plan.n_layers; l++) {
    const struct plan_layer *L = &plan.layer[l];
    if (!plan_is_kv_source(L)) continue;
    bool dec_kv = ced && L->region == PLAN_DECODER;
    int last = check_appends(g, l, lo, hi, dec_kv);
    /* SPEC 8.8 #38: every decoder entry exists before the replay queries. */
    if (dec_kv && g->flow == GRAPH_PREFILL_CED) EXPECT(last < rp, "%s: L%d appends during the replay", what, l);
  }
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    if (nd->op != GRAPH_ATTN) continue;
    const struct plan_layer *L = &plan.layer[nd->layer];
    if (!plan_is_kv_source(L)) EXPECT(!(nd->flags & GRAPH_F_WRITE_KV), "%s: %s writes KV", what, nd->name);
    if (plan_is_csa(L)) {
      enum graph_access m = mode_of(nd, kv_data(g, L->kv_src));
      EXPECT(m == GRAPH_R || (m == GRAPH_APPEND && L->kv_src == nd->layer), "%s: %s does not read L%d's pool", what,
             nd->name, L->kv_src);
    }
  }
}

/* One prefill of N tokens; replay < 0 takes the plan's serving.replay.decoder. */
static void check_prefill(const char *path, int64_t N, int chunk, int64_t replay, bool all, bool print) {
  char label[160];
  snprintf(label, sizeof label, "%s N=%" PRId64 " chunk=%d replay=%" PRId64 "%s", path, N, chunk, replay,
           all ? " all-logits" : "");
  what = label;
  struct graph g;
  struct graph_opts o = {.chunk = chunk, .replay = replay, .all_logits = all};
  int rc = graph_build_prefill(&g, &plan, N, &o, err, sizeof err);
  EXPECT(rc == 0, "%s: %s", label, err);
  if (rc) return;
  int fd = first_decoder(), n_dec = plan.n_layers - fd, n_enc = fd;
  bool ced = plan.serving.ced && n_dec > 0;
  int64_t want_r = replay >= 0 ? replay : plan.serving.replay_decoder;
  int64_t R = ced ? (N < want_r ? N : want_r) : 0;
  EXPECT(g.flow == (ced ? GRAPH_PREFILL_CED : GRAPH_PREFILL_DENSE), "%s: flow %s", label, graph_flow_name(g.flow));
  EXPECT(g.replay == R && g.n_prompt == N && g.chunk == (chunk > 0 ? chunk : plan.serving.prefill_chunk),
         "%s: replay %" PRId64 " prompt %" PRId64 " chunk %d", label, g.replay, g.n_prompt, g.chunk);
  check_generic(&g, print);
  struct accs A;
  accs_build(&g, &A);
  int rp = g.n_node;
  for (int k = g.n_node - 1; k >= 0; k--)
    if (g.node[k].op == GRAPH_REPLAY_IN) rp = k;
  int64_t enc_tl = 0, dec_tl = 0;
  for (int l = 0; l < plan.n_layers; l++) {
    bool replay = ced && l >= fd;
    int64_t held = check_cover(&g, l, replay ? N - R : 0, N, replay ? N - R : 0);
    if (l < fd) enc_tl += held;
    else dec_tl += held;
  }
  /* SPEC 6.2, 8.8 #38, #39 (mini and flash: 20 + 20 layers, R = min(N, 128)). */
  EXPECT(g.token_layers == (int64_t)n_enc * N + (int64_t)n_dec * (ced ? R : N), "%s: token-layers %" PRId64, label,
         g.token_layers);
  EXPECT(enc_tl + dec_tl == g.token_layers, "%s: per-layer positions disagree with token-layers", label);
  if (literal == LIT_CED && replay < 0)
    EXPECT(g.token_layers == 20 * N + 20 * (N < 128 ? N : 128), "%s: token-layers %" PRId64 " != 20N + 20 min(N, 128)",
           label, g.token_layers);
  if (literal == LIT_DENSE) EXPECT(g.token_layers == 40 * N, "%s: token-layers != 40N", label);
  if (ced) EXPECT(dec_tl == (int64_t)n_dec * R, "%s: decoder layer-forwards %" PRId64, label, dec_tl);
  check_sources(&g, 0, N, rp);
  check_rings(&g, &A, N - R);
  check_heads(&g, ced ? N - R : 0, N, all);
  int n_chunks = (int)((N + g.chunk - 1) / g.chunk), n_dec_src = 0;
  for (int l = fd; l < plan.n_layers; l++) n_dec_src += plan_is_kv_source(&plan.layer[l]);
  EXPECT(graph_count_op(&g, GRAPH_DEC_KV, -1) == (ced ? n_chunks * n_dec_src : 0), "%s: %d DEC_KV nodes", label,
         graph_count_op(&g, GRAPH_DEC_KV, -1));
  EXPECT(graph_count_op(&g, GRAPH_EMBED, -1) == n_chunks, "%s: EMBED per chunk", label);
  EXPECT(graph_count_op(&g, GRAPH_REPLAY_IN, -1) == (ced ? (int)((R + g.chunk - 1) / g.chunk) : 0),
         "%s: REPLAY_IN per replay tile", label);
  check_dec_kv(&g, rp);
  if (ced) check_replay_in(&g, rp);
  accs_free(&A);
  graph_free(&g);
}

static void check_decode(const char *path, int64_t pos, bool print) {
  char label[160];
  snprintf(label, sizeof label, "%s decode at %" PRId64, path, pos);
  what = label;
  struct graph g;
  int rc = graph_build_decode(&g, &plan, pos, err, sizeof err);
  EXPECT(rc == 0, "%s: %s", label, err);
  if (rc) return;
  EXPECT(g.flow == GRAPH_DECODE && g.n_prompt == pos, "%s: flow %s", label, graph_flow_name(g.flow));
  check_generic(&g, print);
  for (int l = 0; l < plan.n_layers; l++)
    EXPECT(graph_count_op(&g, GRAPH_ATTN, l) == 1 && graph_count_op(&g, GRAPH_MOE, l) == 1,
           "%s: layer %d has %d ATTN and %d MOE nodes", label, l, graph_count_op(&g, GRAPH_ATTN, l),
           graph_count_op(&g, GRAPH_MOE, l));
  EXPECT(g.token_layers == plan.n_layers, "%s: token-layers %" PRId64, label, g.token_layers);
  for (int k = 0; k < g.n_node; k++)
    EXPECT(g.node[k].a == pos && g.node[k].n == 1 && g.node[k].r0 == 0, "%s: %s holds [%" PRId64 ", +%d) r0 %" PRId64,
           label, g.node[k].name, g.node[k].a, g.node[k].n, g.node[k].r0);
  struct accs A;
  accs_build(&g, &A);
  check_sources(&g, pos, pos + 1, g.n_node); /* SPEC 8.8 #43: one entry per source */
  bool ced = plan.serving.ced && first_decoder() < plan.n_layers;
  int n_dec_src = 0;
  for (int l = first_decoder(); l < plan.n_layers; l++) n_dec_src += plan_is_kv_source(&plan.layer[l]);
  check_dec_kv(&g, g.n_node);
  EXPECT(graph_count_op(&g, GRAPH_DEC_KV, -1) == (ced ? n_dec_src : 0), "%s: DEC_KV nodes", label);
  EXPECT(graph_count_op(&g, GRAPH_EMBED, -1) == 1 && graph_count_op(&g, GRAPH_REPLAY_IN, -1) == 0, "%s: EMBED",
         label);
  check_rings(&g, &A, 0);
  check_heads(&g, pos, pos + 1, false);
  accs_free(&A);
  graph_free(&g);
}

/* ---- the matrix ------------------------------------------------------------ */

static const int64_t Ns[] = {1, 2, 127, 128, 129, 1000, 4096};
#define N_NS (int)(sizeof Ns / sizeof Ns[0])

/* Chunk sizes: odd and even, below, at and above N; 0 = the plan's default.
 * Tiny tiles only for the shorter prompts (node count grows as N / chunk). */
static int chunks_for(int64_t N, bool full, int *c) {
  int n = 0;
  if (full && N <= 1000) c[n++] = 1, c[n++] = 2;
  c[n++] = 3;
  if (full) c[n++] = 64, c[n++] = 127;
  c[n++] = 128;
  c[n++] = 0;
  c[n++] = (int)N + 1;
  if (full && N > 2) c[n++] = (int)N - 1;
  return n;
}

static void test_plan(const char *path, bool full, int lit) {
  literal = lit;
  if (!load(path)) return;
  for (int i = 0; i < N_NS; i++) {
    int c[16], n = chunks_for(Ns[i], full, c);
    for (int j = 0; j < n; j++) check_prefill(path, Ns[i], c[j], -1, false, Ns[i] == 129 && c[j] == 64);
  }
  check_prefill(path, 129, 64, -1, true, false);
  check_prefill(path, 1000, 127, -1, true, false);
  check_prefill(path, 2, 1, -1, true, true);
  /* Other replay lengths: longer than the window, one position. */
  check_prefill(path, 1000, 127, 300, false, false);
  check_prefill(path, 129, 5, 1, true, false);
  static const int64_t pos[] = {0, 1, 127, 128, 1000, 4096};
  for (int i = 0; i < 6; i++) check_decode(path, pos[i], i == 3);
  plan_free(&plan);
}

/* Inputs the compiler refuses. */
static void test_rejections(void) {
  if (!load("plans/v41-mini.yaml")) return;
  struct graph g;
  memset(&g, 0, sizeof g);
  err[0] = 0;
  EXPECT(graph_build_prefill(&g, &plan, 0, NULL, err, sizeof err) == CEDAR_EINVAL && err[0],
         "a prefill of 0 tokens is refused");
  err[0] = 0;
  EXPECT(graph_build_decode(&g, &plan, -1, err, sizeof err) == CEDAR_EINVAL && err[0],
         "a decode at position -1 is refused");
  /* Under CED the first token's logits come from the decoder replay. */
  struct graph_opts o = {.chunk = 64, .replay = 0};
  err[0] = 0;
  EXPECT(graph_build_prefill(&g, &plan, 100, &o, err, sizeof err) == CEDAR_EINVAL && err[0],
         "a CED prefill with no decoder replay is refused");
  EXPECT(g.n_node == 0 && g.data == NULL, "a refused prefill holds nothing");
  plan_free(&plan);
}

/* model.indexer.key_slot (docs/model.md s3.2) on v41-mini: sources L2, L8,
 * L14 (ratio 2) and L20 (ratio 1, the last). The index layers' key sources
 * per row parity, the reads they imply, a verify tile longer than the
 * committed slot rows allows, and own_source's plain reads. */
static const struct graph_node *attn_of(const struct graph *g, int l) {
  for (int k = 0; k < g->n_node; k++)
    if (g->node[k].op == GRAPH_ATTN && g->node[k].layer == l) return &g->node[k];
  return NULL;
}

static int64_t reads_kv_of(const struct graph *g, const struct graph_node *nd, int l) {
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_data *d = &g->data[nd->use[u].data];
    if (d->kind == GRAPH_STATE && d->state == GRAPH_ST_KV && d->layer == l) return nd->use[u].e_read;
  }
  return -1;
}

static void test_key_slot(void) {
  if (!load("plans/v41-mini.yaml")) return;
  EXPECT(plan.model.idx_key_slot == PLAN_KEY_SLOT_VENDOR, "v41-mini: key_slot vendor by default");
  struct graph g;
  /* p = 1000: p + 1 odd, the ratio-2 groups fill: L2, L8, L14 score L20's
   * keys of the step before (1000 entries committed), L20 and L24 their own */
  CEDAR_ASSERT(!graph_build_decode(&g, &plan, 1000, err, sizeof err));
  for (int l = 2; l <= 14; l += 6) {
    const struct graph_node *nd = attn_of(&g, l);
    EXPECT(nd->key_src[0] == 20 && nd->key_src[1] == -1, "decode 1000: L%d scores L%d/L%d, want L20", l,
           nd->key_src[0], nd->key_src[1]);
    EXPECT(reads_kv_of(&g, nd, 20) == 1000, "decode 1000: L%d reads %lld of L20's entries", l,
           (long long)reads_kv_of(&g, nd, 20));
  }
  for (int l = 3; l < 40; l++)
    if (l % 6 != 2 || l > 14) EXPECT(attn_of(&g, l)->key_src[0] == -1, "decode 1000: L%d scores another source", l);
  check_generic(&g, false); /* the edges the key reads imply, re-derived */
  graph_free(&g);
  /* p = 1001 completes every group: every layer its own source's keys */
  CEDAR_ASSERT(!graph_build_decode(&g, &plan, 1001, err, sizeof err));
  for (int l = 0; l < 40; l++)
    EXPECT(attn_of(&g, l)->key_src[0] < 0 && attn_of(&g, l)->key_src[1] < 0 &&
               (l >= 20 || reads_kv_of(&g, attn_of(&g, l), 20) < 0),
           "decode 1001: L%d scores another source", l);
  graph_free(&g);
  /* a verify tile [1000, 1004): rows 1000 and 1002 read L20's, 1001 and 1003 their own */
  CEDAR_ASSERT(!graph_build_verify(&g, &plan, 1000, 4, err, sizeof err));
  EXPECT(attn_of(&g, 8)->key_src[0] == 20 && attn_of(&g, 8)->key_src[1] == -1, "verify: L8's key sources");
  check_generic(&g, false);
  graph_free(&g);
  /* [2, 8): row 6 would need L20's entry 2, which only this tile computes */
  err[0] = 0;
  EXPECT(graph_build_verify(&g, &plan, 2, 6, err, sizeof err) == CEDAR_EINVAL && strstr(err, "row 6"),
         "a verify tile past the committed slot rows is refused (%s)", err);
  EXPECT(graph_build_verify(&g, &plan, 2, 3, err, sizeof err) == 0, "verify [2, 5): %s", err);
  graph_free(&g);
  /* a prefill is one vendor forward: every source publishes, own keys everywhere */
  struct graph_opts o = {.chunk = 1, .replay = -1};
  CEDAR_ASSERT(!graph_build_prefill(&g, &plan, 9, &o, err, sizeof err));
  for (int k = 0; k < g.n_node; k++)
    EXPECT(g.node[k].key_src[0] < 0 && g.node[k].key_src[1] < 0, "prefill: %s scores another source", g.node[k].name);
  graph_free(&g);
  /* own_source: no key reads at all */
  plan.model.idx_key_slot = PLAN_KEY_SLOT_OWN;
  CEDAR_ASSERT(!graph_build_decode(&g, &plan, 1000, err, sizeof err));
  EXPECT(attn_of(&g, 2)->key_src[0] == -1 && reads_kv_of(&g, attn_of(&g, 2), 20) < 0, "own_source: L2 reads L20");
  check_generic(&g, false);
  graph_free(&g);
  plan_free(&plan);
}

int main(void) {
  test_plan("plans/v41-mini.yaml", true, LIT_CED);
  test_plan("plans/v41-flash.yaml", false, LIT_CED);
  test_plan("plans/dense-40.yaml", false, LIT_DENSE);
  test_plan("plans/alt-reindex2.yaml", false, LIT_CED);
  test_plan("plans/alt-two-dec-sources.yaml", false, LIT_CED);
  test_plan("plans/alt-no-pool.yaml", false, LIT_CED);
  test_rejections();
  test_key_slot();
  return h_report("graph");
}
