/* test_engine.c: runtime/engine/engine.h, the plan-to-executor bundle the commands
 * open (cedar run, serve-sim, bench model).
 *
 *  - every step of an open can fail: a missing plan, the caller's on_plan
 *    check, weights (a missing file, synthesis over its cap), the prefix
 *    cache (a capacity below one block, a disk tier that cannot be made),
 *    StarPU (an unknown policy). Each returns a negative status with a
 *    message, names the step, leaves nothing open (StarPU not running) and
 *    a close after it is harmless; under ASan (ASAN_OPTIONS=detect_leaks=1,
 *    set by ctest) anything a failed step kept is a leak that fails the run;
 *  - on_plan runs once, with the plan, before the weights are built;
 *  - an engine's generate is the plain rt_generate on its pieces, bitwise,
 *    and generate_isolated too, leaving the engine's pools untouched;
 *  - a prefix cache is plumbed through: the same prompt twice hits the
 *    second time (whole blocks), an engine without one never hits;
 *  - StarPU once per process: a second StarPU engine is refused while the
 *    first is open, a direct one opens beside it, and after the close the
 *    second opens; set_exec starts and stops it; StarPU gives direct's
 *    tokens (docs/runtime.md: every executor gives the same bits).
 * Plan: tests/oracle/plans/tiny-40.yaml (the V4.1 schedule at toy widths).
 * Run: ctest --test-dir build -R engine --output-on-failure
 */
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "ops/basic.h"
#include "runtime/engine/engine.h"
#include "tests/harness.h"

static const char *tiny = "tests/oracle/plans/tiny-40.yaml";
static char err[1024];

/* A failed open: its status, its step, nothing left. */
static void expect_failed(struct rt_engine *e, int rc, enum rt_engine_step step, const char *what) {
  EXPECT(rc < 0, "%s: open returned %d, want a negative status", what, rc);
  EXPECT_EQ(e->failed, step, "%s: the failed step", what);
  EXPECT(err[0], "%s: no message", what);
  EXPECT(!e->open && !e->pools && !e->cache && !e->disk && !e->holds_starpu, "%s: something is left open", what);
  EXPECT(!rt_starpu_running(), "%s: StarPU is left running", what);
  rt_engine_close(e); /* harmless */
}

struct probe {
  int calls, vocab;
  bool weights_built; /* were the weights there when on_plan ran? */
  const struct rt_engine *e;
  bool refuse;
};

static int probe_on_plan(void *user, const struct plan *p, char *msg, size_t len) {
  struct probe *q = user;
  q->calls++;
  q->vocab = p->model.vocab;
  q->weights_built = q->e->weights.list.n > 0;
  if (q->refuse) snprintf(msg, len, "prompt id 500 is not below vocab %d", p->model.vocab);
  return q->refuse ? CEDAR_EINVAL : 0;
}

static void failures(void) {
  struct rt_engine e;
  struct plan_diags d = {0};
  err[0] = 0;
  int rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = "tests/plans/no-such-plan.yaml", .diags = &d}, err,
                          sizeof err);
  expect_failed(&e, rc, RT_ENGINE_PLAN, "missing plan");
  EXPECT(d.n > 0, "missing plan: no diagnostics");
  plan_diags_free(&d);

  /* A placement this build cannot run: refused before on_plan and the weights. */
  struct probe q0 = {.e = &e};
  err[0] = 0;
  rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = "tests/plans/placement/decode-rank3.yaml",
                                                   .on_plan = probe_on_plan, .user = &q0},
                      err, sizeof err);
  expect_failed(&e, rc, RT_ENGINE_PLACEMENT, "decode on rank 3");
  EXPECT(strstr(err, "decode-rank3.yaml:7:20:") && strstr(err, "set rank: 0"), "placement message: %s", err);
  EXPECT_EQ(q0.calls, 0, "on_plan calls after a refused placement");

  struct probe q = {.e = &e, .refuse = true};
  err[0] = 0;
  rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = tiny, .on_plan = probe_on_plan, .user = &q}, err, sizeof err);
  expect_failed(&e, rc, RT_ENGINE_ON_PLAN, "on_plan refuses");
  EXPECT(strstr(err, "vocab 97"), "on_plan: its message is not passed on: %s", err);
  EXPECT_EQ(q.calls, 1, "on_plan calls");
  EXPECT(!q.weights_built, "on_plan ran after the weights were built");
  EXPECT(!strcmp(e.name, "oracle-tiny-40"), "the plan's name is not kept after a failed open: '%s'", e.name);

  struct weights_problems pr = {0};
  err[0] = 0;
  rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = tiny, .weights = "/nonexistent/w.safetensors", .problems = &pr},
                      err, sizeof err);
  expect_failed(&e, rc, RT_ENGINE_WEIGHTS, "missing weights file");
  weights_problems_free(&pr);
  err[0] = 0;
  rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = tiny, .synth_max_bytes = 1}, err, sizeof err);
  expect_failed(&e, rc, RT_ENGINE_WEIGHTS, "synthesis over its cap");

  err[0] = 0;
  rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = tiny, .cache = {.on = true, .capacity_bytes = 1}}, err,
                      sizeof err);
  expect_failed(&e, rc, RT_ENGINE_CACHE, "cache capacity below one block");
  err[0] = 0;
  rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = tiny, .cache = {.on = true, .capacity_bytes = -1, .dir = "/proc/no/such/dir"}},
                      err, sizeof err);
  expect_failed(&e, rc, RT_ENGINE_CACHE, "disk tier that cannot be made");

  err[0] = 0;
  rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = tiny, .exec = {RT_EXEC_STARPU, 1, "no-such-policy", false}},
                      err, sizeof err);
  expect_failed(&e, rc, RT_ENGINE_EXECUTOR, "unknown StarPU policy");
}

static void prompt_of(int32_t *t, int n, int vocab) {
  for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 7 + 3) % vocab);
}

static bool same_result(const struct rt_gen_result *a, const struct rt_gen_result *b, int vocab) {
  return a->n_tokens == b->n_tokens && !memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens) &&
         a->prefill_rows == b->prefill_rows &&
         !memcmp(a->prefill_logits, b->prefill_logits, sizeof(float) * (size_t)(a->prefill_rows * vocab));
}

/* The engine's calls against rt_generate on the engine's own pieces. */
static void generate(void) {
  struct rt_engine e;
  struct probe q = {.e = &e};
  int rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = tiny, .seed = 5, .on_plan = probe_on_plan, .user = &q},
                          err, sizeof err);
  EXPECT(rc == 0, "open %s: %s", tiny, err);
  if (rc) return;
  EXPECT(q.calls == 1 && q.vocab == 97, "on_plan: %d calls, vocab %d", q.calls, q.vocab);
  EXPECT(e.model.p == &e.plan && e.weights.synthetic && e.weights.seed == 5 && !e.cache, "the pieces");
  int n = 60, V = e.plan.model.vocab;
  int32_t prompt[60];
  prompt_of(prompt, n, V);
  struct rt_gen_opts go = {.replay = -1, .max_new = 3, .top_p = 1, .all_logits = true};
  struct rt_request ra, rb;
  struct rt_gen_result a = {0}, b = {0}, c = {0};
  EXPECT(rt_engine_generate(&e, &ra, prompt, n, &go, &a, err, sizeof err) == 0, "engine generate: %s", err);
  EXPECT(rt_generate(&e.model, e.pools, &rb, prompt, n, &go, &b, err, sizeof err) == 0, "rt_generate: %s", err);
  EXPECT(same_result(&a, &b, V), "the engine's generate differs from rt_generate on its pieces");
  EXPECT_EQ(a.hit.hit, 0, "no cache, no hit");
  rt_engine_request_free(&e, &ra);
  rt_request_free(&rb);
  EXPECT(rt_engine_generate_isolated(&e, prompt, n, &go, &c, err, sizeof err) == 0, "isolated: %s", err);
  EXPECT(same_result(&a, &c, V), "generate_isolated differs");
  for (int l = 0; l < e.plan.n_layers; l++)
    if (e.pools[l].entry_bytes) EXPECT_EQ(e.pools[l].pages_in_use, 0, "L%d: the engine's pages after the requests", l);
  rt_gen_result_free(&a);
  rt_gen_result_free(&b);
  rt_gen_result_free(&c);
  rt_engine_close(&e);
  EXPECT(!e.open && !e.pools, "closed");
}

/* The same prompt twice through an engine with a cache: the second attaches
 * the first's whole blocks (prefix_block_tokens each). */
static void cache(void) {
  struct rt_engine e;
  int rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = tiny, .cache = {.on = true, .capacity_bytes = -1, .snapshots = true}},
                          err, sizeof err);
  EXPECT(rc == 0 && e.cache, "open with a cache: %s", err);
  if (rc) return;
  int B = e.cache->block, n = B + 20;
  int32_t *prompt = cedar_xmalloc(sizeof(int32_t) * (size_t)n);
  prompt_of(prompt, n, e.plan.model.vocab);
  struct rt_gen_opts go = {.replay = -1, .max_new = 1, .top_p = 1};
  for (int turn = 0; turn < 2; turn++) {
    struct rt_request r;
    struct rt_gen_result g = {0};
    EXPECT(rt_engine_generate(&e, &r, prompt, n, &go, &g, err, sizeof err) == 0, "turn %d: %s", turn, err);
    EXPECT_EQ(g.hit.global_hit, turn ? B : 0, "turn %d: global tokens attached", turn);
    rt_gen_result_free(&g);
    rt_engine_request_free(&e, &r);
  }
  EXPECT(e.cache->stats.snap_saved > 0, "snapshots are kept but none was saved");
  free(prompt);
  rt_engine_close(&e);
}

/* StarPU once per process, through engines. */
static void starpu(void) {
  struct rt_engine a, b, d;
  struct rt_engine_exec sp = {.executor = RT_EXEC_STARPU, .workers = 1};
  int rc = rt_engine_open(&a, &(struct rt_engine_opts){.plan = tiny, .exec = sp}, err, sizeof err);
  if (rc) { /* this machine cannot start StarPU at all: nothing here can be checked */
    printf("engine: StarPU does not start here (%s); its checks skipped\n", err);
    return;
  }
  EXPECT(a.holds_starpu && rt_starpu_workers() == 1, "the first engine holds StarPU with one worker");
  err[0] = 0;
  rc = rt_engine_open(&b, &(struct rt_engine_opts){.plan = tiny, .exec = sp}, err, sizeof err);
  EXPECT(rc == CEDAR_EINVAL && b.failed == RT_ENGINE_EXECUTOR && !b.open, "a second StarPU engine: %d", rc);
  EXPECT(strstr(err, "already started"), "a second StarPU engine: message '%s'", err);
  EXPECT(rt_starpu_running() && rt_starpu_workers() == 1, "the refusal stopped the first engine's StarPU");
  rc = rt_engine_open(&d, &(struct rt_engine_opts){.plan = tiny}, err, sizeof err);
  EXPECT(rc == 0, "a direct engine beside a StarPU one: %s", err);
  int n = 50, V = a.plan.model.vocab;
  int32_t prompt[50];
  prompt_of(prompt, n, V);
  struct rt_gen_opts go = {.replay = -1, .max_new = 3, .top_p = 1, .all_logits = true};
  struct rt_request ra, rd;
  struct rt_gen_result ga = {0}, gd = {0};
  EXPECT(rt_engine_generate(&a, &ra, prompt, n, &go, &ga, err, sizeof err) == 0, "on StarPU: %s", err);
  if (!rc) EXPECT(rt_engine_generate(&d, &rd, prompt, n, &go, &gd, err, sizeof err) == 0, "direct: %s", err);
  if (!rc) EXPECT(same_result(&ga, &gd, V), "StarPU and direct engines differ");
  rt_engine_request_free(&a, &ra);
  if (!rc) rt_engine_request_free(&d, &rd);
  rt_gen_result_free(&ga);
  rt_gen_result_free(&gd);
  rt_engine_close(&d);
  EXPECT(rt_starpu_running(), "closing a direct engine stopped StarPU");
  rt_engine_close(&a);
  EXPECT(!rt_starpu_running(), "closing the StarPU engine left StarPU running");
  rc = rt_engine_open(&b, &(struct rt_engine_opts){.plan = tiny, .exec = sp}, err, sizeof err);
  EXPECT(rc == 0 && b.holds_starpu, "after the close a StarPU engine opens: %s", err);
  if (rc) return;
  EXPECT(rt_engine_set_exec(&b, &(struct rt_engine_exec){0}, err, sizeof err) == 0 && !rt_starpu_running() &&
             b.exec.executor == RT_EXEC_DIRECT,
         "set_exec direct stops StarPU");
  EXPECT(rt_engine_set_exec(&b, &(struct rt_engine_exec){RT_EXEC_STARPU, 2, NULL, false, false}, err, sizeof err) == 0 &&
             rt_starpu_workers() == 2 && b.holds_starpu,
         "set_exec starts StarPU with two workers: %s", err);
  err[0] = 0;
  EXPECT(rt_engine_set_exec(&b, &(struct rt_engine_exec){RT_EXEC_STARPU, 1, "no-such-policy", false, false}, err,
                            sizeof err) == CEDAR_EINVAL && !rt_starpu_running() && b.exec.executor == RT_EXEC_DIRECT,
         "a failed set_exec leaves the engine on direct");
  rt_engine_close(&b);
}

int main(void) {
  op_blas_init();
  failures();
  generate();
  cache();
  starpu();
  return h_report("engine");
}
