/* test_moe_grouping.c: the MoE runs each expert once over all the rows that
 * chose it, in a batched decode step and in a prefill chunk (ops/moe.h
 * "Batching"; issue 31: what batching can gain is then set by routing).
 *
 * Through op_moe_tap, which reports every expert FFN op_moe_forward runs
 * (the shared expert as -1, first), on a continuous batch
 * (runtime/engine/batch.h) of B = 1, 2, 5 and 8 requests:
 *  - a decode step of B rows runs one MoE call per MoE layer, not one per
 *    request: the shared expert once per layer over all B rows;
 *  - inside each call every routed expert runs at most once (ids strictly
 *    ascending), and the rows they ran over add up to B x active experts:
 *    each chosen expert's weights are read once per step, whatever B;
 *  - a prefill chunk does the same over its rows: one MoE call per MoE node
 *    of the prefill graph (graph_build_prefill at the batch's chunk), the
 *    shared expert over that node's rows (a chunk: more than one), each
 *    routed expert once.
 * Plans: tests/oracle/plans/tiny-40.yaml (4 routed experts, 2 active) and
 * plans/v41-mini.yaml (8 routed, 2 active).
 * Run: ctest --test-dir build -R moe_grouping --output-on-failure
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ops/moe.h"
#include "runtime/engine/batch.h"
#include "tests/model_fixture.h"

/* What the tap saw: each expert FFN run, in order. */
struct seen {
  int n, cap;
  int *expert, *rows;
};

static void on_expert(void *ctx, int expert, int rows) {
  struct seen *s = ctx;
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 256;
    s->expert = realloc(s->expert, sizeof(int) * (size_t)s->cap);
    s->rows = realloc(s->rows, sizeof(int) * (size_t)s->cap);
    CEDAR_ASSERT(s->expert && s->rows);
  }
  s->expert[s->n] = expert;
  s->rows[s->n++] = rows;
}

/* The MoE calls in s (each opens with its shared expert): every call's
 * routed experts strictly ascending and over rows x active rows in all.
 * Returns the calls; *rows_sum the shared expert's rows over them, *widest
 * the most rows of one call. */
static int check_calls(const struct seen *s, int active, const char *what, int64_t *rows_sum, int *widest) {
  int calls = 0;
  *rows_sum = 0;
  *widest = 0;
  for (int i = 0; i < s->n;) {
    EXPECT(s->expert[i] == -1, "%s: event %d is expert %d, not a call's shared expert", what, i, s->expert[i]);
    if (s->expert[i] != -1) return calls;
    int n = s->rows[i], routed_rows = 0, prev = -1;
    calls++;
    *rows_sum += n;
    if (n > *widest) *widest = n;
    for (i++; i < s->n && s->expert[i] >= 0; i++) {
      EXPECT(s->expert[i] > prev, "%s: call %d runs expert %d after expert %d (each once, ascending)", what, calls,
             s->expert[i], prev);
      EXPECT(s->rows[i] >= 1 && s->rows[i] <= n, "%s: expert %d over %d rows of %d", what, s->expert[i], s->rows[i], n);
      prev = s->expert[i];
      routed_rows += s->rows[i];
    }
    EXPECT_EQ(routed_rows, n * active, "%s: call %d: rows the routed experts ran over (rows x active)", what, calls);
  }
  return calls;
}

static int moe_layers(const struct plan *p) {
  struct graph g;
  CEDAR_ASSERT(graph_build_decode(&g, p, 8, err, sizeof err) == 0);
  int n = 0;
  for (int k = 0; k < g.n_node; k++) n += g.node[k].op == GRAPH_MOE;
  graph_free(&g);
  return n;
}

/* B requests prefill (short prompts), then one decode step of all B rows is
 * watched. */
static void decode_step(struct fx *f, int B) {
  const int active = f->p->model.n_active, L = moe_layers(f->p);
  struct rt_batch b;
  struct rt_batch_opts o = {.max_requests = B, .step_tokens = 8 * B + B, .chunk = 8, .top_p = 1};
  int rc = rt_batch_init(&b, &f->M, f->pools, &o, err, sizeof err);
  EXPECT(rc == 0, "rt_batch_init: %s", err);
  if (rc) return;
  for (int i = 0; i < B; i++) {
    int32_t prompt[5];
    make_prompt(prompt, 5, f->V, PROMPT_SEED + (uint64_t)i);
    EXPECT(rt_batch_submit(&b, prompt, 5, 4, 1 + (uint64_t)i, i, err, sizeof err) >= 0, "submit: %s", err);
  }
  struct rt_batch_step st;
  for (int steps = 0; steps < 10; steps++) {
    int decoding = 0;
    for (int i = 0; i < b.n_live; i++) decoding += b.q[b.live[i]]->state == RT_BQ_DECODE;
    if (decoding == B) break;
    rt_batch_run_step(&b, &st);
  }
  struct seen s = {0};
  op_moe_tap = (struct op_moe_tap){on_expert, &s};
  rt_batch_run_step(&b, &st);
  op_moe_tap.fn = NULL;
  char what[96];
  snprintf(what, sizeof what, "%s, decode step of %d rows", f->path, B);
  EXPECT(st.decode_rows == B && st.tokens == B, "%s: the watched step ran %d decode rows, %lld tokens", what,
         st.decode_rows, (long long)st.tokens);
  int64_t rows;
  int widest, calls = check_calls(&s, active, what, &rows, &widest);
  EXPECT_EQ(calls, L, "%s: MoE calls (one per MoE layer, not one per request)", what);
  EXPECT_EQ(rows, (int64_t)L * B, "%s: the shared expert's rows (all B rows, once per layer)", what);
  int routed = s.n - calls;
  printf("%s: %d MoE calls, %d routed expert runs (%.2f a layer; %d rows x %d active = %d row-slots a layer)\n", what,
         calls, routed, calls ? (double)routed / calls : 0, B, active, B * active);
  free(s.expert), free(s.rows);
  rt_batch_free(&b);
}

/* One request's prompt in chunks: each chunk's rows grouped by expert. */
static void prefill_chunks(struct fx *f) {
  const int active = f->p->model.n_active, L = moe_layers(f->p), n = 40, chunk = 16;
  struct rt_batch b;
  struct rt_batch_opts o = {.max_requests = 1, .step_tokens = chunk + 1, .chunk = chunk, .top_p = 1};
  int rc = rt_batch_init(&b, &f->M, f->pools, &o, err, sizeof err);
  EXPECT(rc == 0, "rt_batch_init: %s", err);
  if (rc) return;
  int32_t prompt[40];
  make_prompt(prompt, n, f->V, PROMPT_SEED);
  EXPECT(rt_batch_submit(&b, prompt, n, 1, 1, 0, err, sizeof err) >= 0, "submit: %s", err);
  struct seen s = {0};
  struct rt_batch_step st;
  op_moe_tap = (struct op_moe_tap){on_expert, &s};
  for (int steps = 0; steps < 20 && rt_batch_pending(&b); steps++) rt_batch_run_step(&b, &st);
  op_moe_tap.fn = NULL;
  char what[96];
  snprintf(what, sizeof what, "%s, prefill of %d in chunks of %d", f->path, n, chunk);
  struct graph g; /* what the batch runs: the prefill graph at its chunk */
  CEDAR_ASSERT(graph_build_prefill(&g, f->p, n, &(struct graph_opts){.chunk = chunk, .replay = -1}, err, sizeof err) == 0);
  int nodes = 0;
  int64_t node_rows = 0;
  for (int k = 0; k < g.n_node; k++)
    if (g.node[k].op == GRAPH_MOE) nodes++, node_rows += g.node[k].n;
  graph_free(&g);
  int64_t rows;
  int widest, calls = check_calls(&s, active, what, &rows, &widest);
  EXPECT_EQ(calls, nodes, "%s: MoE calls (one per MoE node of the prefill graph)", what);
  EXPECT_EQ(rows, node_rows, "%s: the shared expert's rows (each MoE node's rows, once)", what);
  EXPECT(widest == chunk && calls >= L, "%s: %d MoE calls of at most %d rows over %d MoE layers", what, calls, widest,
         L);
  printf("%s: %d MoE calls of up to %d rows, %d routed expert runs\n", what, calls, widest, s.n - calls);
  free(s.expert), free(s.rows);
  rt_batch_free(&b);
}

int main(void) {
  const char *plans[] = {PLAN_T40, "plans/v41-mini.yaml"};
  for (int i = 0; i < 2; i++) {
    struct fx f;
    if (!fx_open(&f, plans[i])) continue;
    const int Bs[] = {1, 2, 5, 8};
    for (int k = 0; k < 4; k++) decode_step(&f, Bs[k]);
    prefill_chunks(&f);
    fx_close(&f);
  }
  return h_report("moe_grouping");
}
