/* test_engram_tier.c: the Engram tables' tier and prefetch (runtime/model/engram_tier.h,
 * docs/runtime.md "Engram tiers and prefetch").
 *
 *  1. plans: serving.engram.tier / file / prefetch read, and agreeing with
 *     serving.placement.engram.memory (file = the mmap tier, either way);
 *     the refusals are in test_plan_rules (tests/plans/bad/engram_*).
 *  2. the tables file of synthetic weights: written when absent with the
 *     same bytes weights_synth makes, reopened without rewriting; a
 *     truncated file, one of another seed, a safetensors file that is not
 *     cedar's tables, and bytes that are not safetensors are each refused
 *     naming the reason, and left as they were.
 *  3. bitwise: prefill and decode logits and tokens of tiny-40 are the same
 *     bits with the tables in memory or mapped, with the prefetch on or
 *     off, on the direct executor and on StarPU (1 and 2 workers).
 *  4. order: on StarPU every prefetch of a graph starts no later than the
 *     first layer of its tile and ends before that layer starts (eager,
 *     lws, prio, dmda, dmdas; 1 and 2 workers): in decode, step t+1's rows
 *     are fetched before its first layer.
 *  5. a released-layout checkpoint (--model; ckpt_write of tiny-40, several
 *     shards): with tier: mmap each table's values and scales are the
 *     shards' own tensors (never copied), and prefill and decode logits and
 *     tokens equal the memory tier's bitwise (prefetch on and off, direct
 *     and StarPU, the prefetch order as in 4); weights_identity is stable,
 *     follows a rewritten shard, and reads no table page; a truncated shard
 *     is refused naming it.
 *  6. not read whole: with larger tables (table_base 100000, ~20 MB a
 *     module) dropped from the page cache after the open (rt_engram_tier_evict:
 *     the open's header reads bring a readahead window), the identity and a
 *     short mmap run leave resident (mincore) only about the pages of the
 *     rows it hashed to; skipped with a note where the page cache cannot be
 *     dropped (a tmpfs TMPDIR).
 */
#define _GNU_SOURCE /* mkdtemp, realpath, setenv */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "ops/basic.h"
#include "runtime/load/checkpoint.h"
#include "runtime/engine/engine.h"
#include "runtime/model/engram_tier.h"
#include "runtime/exec/exec.h"
#include "scheduler/graph.h"
#include "tests/harness.h"

static char err[2048];
static char dir[256];

#define T40 "tests/oracle/plans/tiny-40.yaml"
#define T40_MMAP "tests/plans/tiny-40-mmap.yaml"
#define T40_NOPF "tests/plans/tiny-40-noprefetch.yaml"

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CEDAR_ASSERT(f);
  fputs(text, f);
  fclose(f);
}

/* ---- 1. plans ---------------------------------------------------------------- */

static void plans(void) {
  struct plan p;
  struct plan_diags d = {0};
  EXPECT(plan_load(T40, &p, &d) == 0, "load %s", T40);
  EXPECT(p.serving.engram_tier == PLAN_ENGRAM_TIER_MEMORY && p.serving.engram_prefetch && !p.serving.engram_file,
         "defaults: memory tier, prefetch on, no file");
  plan_free(&p);
  EXPECT(plan_load(T40_MMAP, &p, &d) == 0, "load %s", T40_MMAP);
  EXPECT(p.serving.engram_tier == PLAN_ENGRAM_TIER_MMAP, "tier: mmap read");
  plan_free(&p);
  EXPECT(plan_load(T40_NOPF, &p, &d) == 0, "load %s", T40_NOPF);
  EXPECT(!p.serving.engram_prefetch, "prefetch: false read");
  plan_free(&p);
  char cwd[512], path[600], text[1200];
  CEDAR_ASSERT(getcwd(cwd, sizeof cwd));
  /* issue 19's `memory: file` is the mmap tier; tier: mmap gives the placement's home `file` */
  snprintf(path, sizeof path, "%s/home-file.yaml", dir);
  snprintf(text, sizeof text, "extends: %s/" T40 "\nserving:\n  placement:\n    engram: {rank: 0, memory: file}\n", cwd);
  write_text(path, text);
  EXPECT(plan_load(path, &p, &d) == 0, "load %s", path);
  EXPECT(p.serving.engram_tier == PLAN_ENGRAM_TIER_MMAP, "placement.engram.memory: file did not select the mmap tier");
  plan_free(&p);
  snprintf(path, sizeof path, "%s/tier-home.yaml", dir);
  snprintf(text, sizeof text,
           "extends: %s/" T40 "\nserving:\n  engram: {tier: mmap, file: %s/t.safetensors}\n  placement:\n"
           "    engram: {rank: 0}\n", cwd, dir);
  write_text(path, text);
  EXPECT(plan_load(path, &p, &d) == 0, "load %s", path);
  EXPECT(p.serving.place.engram_memory == PLAN_ENGRAM_FILE, "tier: mmap did not make the placement's home `file`");
  EXPECT(p.serving.engram_file && strstr(p.serving.engram_file, "t.safetensors"), "file read");
  plan_free(&p);
  plan_diags_free(&d);
}

/* ---- 2. the tables file ----------------------------------------------------- */

static int open_tier(struct rt_engram_tier *t, struct weights *w, const struct plan *p, uint64_t seed) {
  int rc = weights_synth_no_engram(w, p, seed, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err);
  CEDAR_ASSERT(rc == 0);
  err[0] = 0;
  rc = rt_engram_tier_open(t, p, w, err, sizeof err);
  if (rc) weights_free(w);
  return rc;
}

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) ? -1 : (long)st.st_size;
}

static void expect_refused(const struct plan *p, const char *path, uint64_t seed, const char *why, const char *what) {
  struct rt_engram_tier t;
  struct weights w;
  long before = file_size(path);
  int rc = open_tier(&t, &w, p, seed);
  EXPECT(rc != 0, "%s: the tables file was accepted", what);
  if (!rc) {
    rt_engram_tier_close(&t);
    weights_free(&w);
    return;
  }
  EXPECT(strstr(err, path) && strstr(err, why), "%s: the message lacks the path or '%s': %s", what, why, err);
  EXPECT(strstr(err, "delete it"), "%s: the message gives no fix: %s", what, err);
  EXPECT(file_size(path) == before, "%s: the refused file was changed", what);
}

static void tables_file(void) {
  char path[400], text[1200], cwd[512];
  CEDAR_ASSERT(getcwd(cwd, sizeof cwd));
  snprintf(path, sizeof path, "%s/tables.safetensors", dir);
  snprintf(text, sizeof text, "extends: %s/" T40 "\nserving:\n  engram: {tier: mmap, file: %s}\n", cwd, path);
  char plan_path[400];
  snprintf(plan_path, sizeof plan_path, "%s/own-file.yaml", dir);
  write_text(plan_path, text);
  struct plan p;
  struct plan_diags d = {0};
  CEDAR_ASSERT(plan_load(plan_path, &p, &d) == 0);
  struct weights full, w;
  CEDAR_ASSERT(weights_synth(&full, &p, 11, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0);
  struct rt_engram_tier t;
  int rc = open_tier(&t, &w, &p, 11);
  EXPECT(rc == 0, "first open: %s", err);
  if (!rc) {
    EXPECT(t.wrote && t.mmap && t.n_tables == 2, "first open wrote the file (%d), %d tables", t.wrote, t.n_tables);
    for (size_t i = 0; i < w.list.n; i++) {
      if (w.list.t[i].init != WEIGHTS_ENGRAM_ROWS) continue;
      EXPECT(w.data[i] && !memcmp(w.data[i], full.data[i], w.list.t[i].nbytes), "%s: mapped bytes differ from "
             "weights_synth's", w.list.t[i].name);
    }
    rt_engram_tier_close(&t);
    weights_free(&w);
  }
  rc = open_tier(&t, &w, &p, 11);
  EXPECT(rc == 0 && !t.wrote, "reopen: %s (wrote %d)", err, rc ? -1 : t.wrote);
  if (!rc) rt_engram_tier_close(&t), weights_free(&w);
  weights_free(&full);

  /* another seed's weights: refused, never rewritten */
  expect_refused(&p, path, 12, "seed 11", "another seed");
  /* truncated */
  long n = file_size(path);
  char cut[420];
  snprintf(cut, sizeof cut, "%s/cut.safetensors", dir);
  {
    FILE *in = fopen(path, "rb"), *out = fopen(cut, "wb");
    CEDAR_ASSERT(in && out);
    for (long i = 0; i < n - 100; i++) fputc(fgetc(in), out);
    fclose(in);
    fclose(out);
  }
  free(p.serving.engram_file);
  p.serving.engram_file = cedar_xstrdup(cut);
  expect_refused(&p, cut, 11, "the Engram tables file", "truncated");
  /* a safetensors file that is not cedar's tables: the weights of the plan */
  char foreign[420];
  snprintf(foreign, sizeof foreign, "%s/weights.safetensors", dir);
  CEDAR_ASSERT(weights_synth(&full, &p, 11, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0);
  CEDAR_ASSERT(weights_save(&full, foreign, err, sizeof err) == 0);
  weights_free(&full);
  free(p.serving.engram_file);
  p.serving.engram_file = cedar_xstrdup(foreign);
  expect_refused(&p, foreign, 11, "not a cedar Engram tables file", "foreign safetensors");
  /* bytes that are not safetensors */
  char junk[420];
  snprintf(junk, sizeof junk, "%s/junk.safetensors", dir);
  write_text(junk, "this is not a safetensors file, and cedar must say so\n");
  free(p.serving.engram_file);
  p.serving.engram_file = cedar_xstrdup(junk);
  expect_refused(&p, junk, 11, junk, "junk");
  plan_free(&p);
  plan_diags_free(&d);
}

/* ---- 3 and 4. bitwise and order --------------------------------------------- */

struct order {
  int graphs, prefetches, late_start, late_end;
};

static void on_graph(void *user, const struct graph *g, const struct rt_task_time *t) {
  struct order *o = user;
  if (!t) return;
  o->graphs++;
  for (int k = 0; k < g->n_node; k++) {
    if (g->node[k].op != GRAPH_ENGRAM_GATHER) continue;
    int first = -1;
    for (int j = 0; j < g->n_node; j++)
      if (g->node[j].op == GRAPH_ATTN && g->node[j].chunk == g->node[k].chunk && g->node[j].a == g->node[k].a &&
          (first < 0 || g->node[j].layer < g->node[first].layer))
        first = j;
    if (first < 0) continue;
    o->prefetches++;
    o->late_start += t[k].start_us > t[first].start_us;
    o->late_end += t[k].end_us > t[first].start_us;
  }
}

static bool same(const struct rt_gen_result *a, const struct rt_gen_result *b, int V) {
  return a->n_tokens == b->n_tokens && !memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens) &&
         a->prefill_rows == b->prefill_rows &&
         !memcmp(a->prefill_logits, b->prefill_logits, sizeof(float) * (size_t)(a->prefill_rows * V)) &&
         !memcmp(a->decode_logits, b->decode_logits, sizeof(float) * (size_t)((a->n_tokens - 1) * V));
}

/* One request on plan (and the checkpoint model, when not NULL). */
static int run_model(const char *plan, const char *model, struct rt_engine_exec x, struct rt_gen_result *res,
                     struct order *o, int n_prompt) {
  struct rt_engine e;
  int rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = plan, .model = model, .seed = 3, .exec = x}, err,
                          sizeof err);
  if (rc) return rc;
  int32_t prompt[100];
  CEDAR_ASSERT(n_prompt <= 100);
  for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 13 + 5) % e.plan.model.vocab);
  struct rt_gen_opts go = {.chunk = 24, .replay = -1, .max_new = 5, .top_p = 1, .all_logits = true,
                           .executor = x.executor, .on_graph = o ? on_graph : NULL, .graph_user = o};
  struct rt_request r;
  rc = rt_engine_generate(&e, &r, prompt, n_prompt, &go, res, err, sizeof err);
  rt_engine_request_free(&e, &r);
  rt_engine_close(&e);
  return rc;
}

static int run(const char *plan, struct rt_engine_exec x, struct rt_gen_result *res, struct order *o) {
  return run_model(plan, NULL, x, res, o, 100);
}

static void bitwise_and_order(void) {
  struct rt_gen_result base = {0};
  int rc = run(T40, (struct rt_engine_exec){0}, &base, NULL);
  EXPECT(rc == 0, "baseline: %s", err);
  if (rc) return;
  int V = 97;
  /* order: every policy, since the tile's first layer reads its prefetches
   * (an edge); the priorities only decide how early they run */
  static const struct {
    const char *plan, *sched;
    int workers;
    bool order;
  } cfg[] = {
      {T40_MMAP, NULL, 0, false},  {T40_NOPF, NULL, 0, false},  {T40, "lws", 1, true},
      {T40_MMAP, "lws", 1, true},  {T40_MMAP, "lws", 2, true},  {T40, "eager", 2, true},
      {T40, "prio", 1, true},      {T40_MMAP, "dmdas", 2, true}, {T40_MMAP, "dmda", 2, true},
      {T40_NOPF, "lws", 2, false},
  };
  for (size_t i = 0; i < sizeof cfg / sizeof *cfg; i++) {
    struct rt_engine_exec x = {0};
    if (cfg[i].sched) x = (struct rt_engine_exec){.executor = RT_EXEC_STARPU, .workers = cfg[i].workers, .sched = cfg[i].sched, .profile = true};
    struct order o = {0};
    struct rt_gen_result r = {0};
    rc = run(cfg[i].plan, x, &r, cfg[i].sched ? &o : NULL);
    if (rc == CEDAR_EUNSUPPORTED && cfg[i].sched) { /* StarPU cannot start here: the direct cases still count */
      fprintf(stderr, "note: %s on StarPU skipped: %s\n", cfg[i].plan, err);
      continue;
    }
    EXPECT(rc == 0, "%s on %s/%d: %s", cfg[i].plan, cfg[i].sched ? cfg[i].sched : "direct", cfg[i].workers, err);
    if (rc) continue;
    EXPECT(same(&base, &r, V), "%s on %s/%d: logits or tokens differ from tiny-40 (memory, prefetch, direct)",
           cfg[i].plan, cfg[i].sched ? cfg[i].sched : "direct", cfg[i].workers);
    if (cfg[i].order) {
      EXPECT(o.prefetches >= 2 * o.graphs, "%s/%d: %d prefetches over %d graphs", cfg[i].sched, cfg[i].workers,
             o.prefetches, o.graphs);
      EXPECT(o.late_start == 0, "%s/%d: %d of %d prefetches started after their tile's first layer", cfg[i].sched,
             cfg[i].workers, o.late_start, o.prefetches);
      EXPECT(o.late_end == 0, "%s/%d: %d of %d prefetches ended after their tile's first layer started",
             cfg[i].sched, cfg[i].workers, o.late_end, o.prefetches);
    }
    rt_gen_result_free(&r);
  }
  rt_gen_result_free(&base);
}

/* ---- 5 and 6. a released-layout checkpoint ---------------------------------------- */

/* ckpt_write of plan_path's synthetic weights (seed 5) into out. */
static void write_ckpt(const char *plan_path, const char *out, uint64_t shard_bytes) {
  struct plan p;
  struct plan_diags d = {0};
  CEDAR_ASSERT(plan_load(plan_path, &p, &d) == 0);
  struct weights w;
  CEDAR_ASSERT(weights_synth(&w, &p, 5, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0);
  int rc = ckpt_write(&w, &p, out, shard_bytes, NULL, err, sizeof err);
  CEDAR_ASSERT_MSG(rc == 0, "ckpt_write: %s", err);
  weights_free(&w);
  plan_free(&p);
  plan_diags_free(&d);
}

/* The shard of ck holding tensor name, opened (the caller closes it); its path in path. */
static st_file_t *shard_of(const char *ck, const char *name, char *path, size_t len) {
  char cmd[600], line[1024];
  snprintf(cmd, sizeof cmd, "ls '%s'/*.safetensors", ck);
  FILE *ls = popen(cmd, "r");
  CEDAR_ASSERT(ls);
  st_file_t *got = NULL;
  while (!got && fgets(line, sizeof line, ls)) {
    line[strcspn(line, "\n")] = 0;
    st_file_t *f;
    if (st_open(line, &f, err, sizeof err)) continue;
    if (st_find(f, name)) got = f, snprintf(path, len, "%s", line);
    else st_close(f);
  }
  pclose(ls);
  return got;
}

/* The tensor of the engine's own shards by released name (NULL if none). */
static const struct st_tensor *own_tensor(const struct weights *w, const char *name) {
  for (size_t k = 0; w->shards && k < w->shards->n; k++) {
    const struct st_tensor *t = st_find(w->shards->files[k], name);
    if (t) return t;
  }
  return NULL;
}

static void released_bitwise(const char *ck) {
  char nopf[400], text[1200], cwd[512];
  CEDAR_ASSERT(getcwd(cwd, sizeof cwd));
  snprintf(nopf, sizeof nopf, "%s/mmap-noprefetch.yaml", dir);
  snprintf(text, sizeof text, "extends: %s/" T40_MMAP "\nserving:\n  engram: {prefetch: false}\n", cwd);
  write_text(nopf, text);
  struct rt_gen_result base = {0};
  int rc = run_model(T40, ck, (struct rt_engine_exec){0}, &base, NULL, 100);
  EXPECT(rc == 0, "--model, memory tier: %s", err);
  if (rc) return;
  static const struct {
    bool nopf;
    const char *sched;
    int workers;
  } cfg[] = {{false, NULL, 0}, {true, NULL, 0}, {false, "lws", 2}, {false, "dmdas", 2}, {true, "lws", 1}};
  for (size_t i = 0; i < sizeof cfg / sizeof *cfg; i++) {
    struct rt_engine_exec x = {0};
    if (cfg[i].sched)
      x = (struct rt_engine_exec){.executor = RT_EXEC_STARPU, .workers = cfg[i].workers, .sched = cfg[i].sched,
                                  .profile = true};
    struct order o = {0};
    struct rt_gen_result r = {0};
    const char *plan = cfg[i].nopf ? nopf : T40_MMAP;
    rc = run_model(plan, ck, x, &r, cfg[i].sched ? &o : NULL, 100);
    if (rc == CEDAR_EUNSUPPORTED && cfg[i].sched) {
      fprintf(stderr, "note: --model mmap on StarPU skipped: %s\n", err);
      continue;
    }
    const char *how = cfg[i].sched ? cfg[i].sched : "direct";
    EXPECT(rc == 0, "--model, %s on %s/%d: %s", plan, how, cfg[i].workers, err);
    if (rc) continue;
    EXPECT(same(&base, &r, 97), "--model, %s on %s/%d: logits or tokens differ from the memory tier", plan, how,
           cfg[i].workers);
    if (cfg[i].sched && !cfg[i].nopf)
      EXPECT(o.prefetches >= 2 * o.graphs && o.late_start == 0 && o.late_end == 0,
             "--model mmap on %s/%d: %d prefetches over %d graphs, %d started and %d ended late", how, cfg[i].workers,
             o.prefetches, o.graphs, o.late_start, o.late_end);
    rt_gen_result_free(&r);
  }
  rt_gen_result_free(&base);
}

/* The tables are the shards' tensors; the identity and its changes. */
static void released_in_place(const char *ck) {
  struct rt_engine e, m;
  int rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = T40_MMAP, .model = ck}, err, sizeof err);
  EXPECT(rc == 0, "open --model mmap: %s", err);
  if (rc) return;
  int rc2 = rt_engine_open(&m, &(struct rt_engine_opts){.plan = T40, .model = ck}, err, sizeof err);
  EXPECT(rc2 == 0, "open --model memory: %s", err);
  const struct weights *w = &e.weights;
  EXPECT(e.engram.mmap && e.engram.n_tables == 2 && w->engram_scales && w->shards && w->shards->n > 1,
         "the mmap tier over a checkpoint of several shards");
  char path[1100];
  int tables = 0;
  for (size_t i = 0; i < w->list.n && w->engram_scales; i++) {
    const struct weights_spec *sp = &w->list.t[i];
    if (sp->init != WEIGHTS_ENGRAM_ROWS) continue;
    tables++;
    char rel[96], rel2[96];
    snprintf(rel, sizeof rel, "layers.%d.engram.embed.weight", sp->layer);
    snprintf(rel2, sizeof rel2, "layers.%d.engram.embed.scale", sp->layer);
    const struct st_tensor *v = own_tensor(w, rel), *sc = own_tensor(w, rel2);
    /* in place: the pointers are the shards' mappings' own */
    EXPECT(v && v->data == w->data[i], "%s: the values are not read in place", sp->name);
    EXPECT(sc && sc->data == w->engram_scales[i], "%s: the scales are not read in place", sp->name);
    if (rc2 || !v || !sc) continue;
    /* the memory tier's rows are the same bytes, values then scales */
    size_t hd = (size_t)sp->row_values, ns = hd / 32;
    const uint8_t *mem = weights_get(&m.weights, sp->name, NULL), *mv = v->data, *ms = sc->data;
    bool eq = true;
    for (int64_t r = 0; r < sp->shape[0] && eq; r++)
      eq = !memcmp(mem + (size_t)r * (hd + ns), mv + (size_t)r * hd, hd) &&
           !memcmp(mem + (size_t)r * (hd + ns) + hd, ms + (size_t)r * ns, ns);
    EXPECT(eq, "%s: the mapped values and scales are not the memory tier's rows", sp->name);
  }
  EXPECT_EQ(tables, 2, "tables checked");
  /* never copied: the arena holds no table (its size is the rest) */
  EXPECT(e.weights.copied_bytes < m.weights.copied_bytes, "mmap copied %llu bytes, memory %llu",
         (unsigned long long)e.weights.copied_bytes, (unsigned long long)m.weights.copied_bytes);
  uint64_t id = weights_identity(&e.weights);
  rt_engine_close(&e);
  if (rc2 == 0) rt_engine_close(&m);
  rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = T40_MMAP, .model = ck}, err, sizeof err);
  EXPECT(rc == 0 && weights_identity(&e.weights) == id, "the identity of the same shards changed: %s", err);
  if (!rc) rt_engine_close(&e);
  /* a shard rewritten (a new modification time): another identity */
  st_file_t *f = shard_of(ck, "layers.1.engram.embed.weight", path, sizeof path);
  CEDAR_ASSERT(f);
  st_close(f);
  struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = 1000000000, .tv_nsec = 7}};
  CEDAR_ASSERT(utimensat(AT_FDCWD, path, ts, 0) == 0);
  rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = T40_MMAP, .model = ck}, err, sizeof err);
  EXPECT(rc == 0 && weights_identity(&e.weights) != id, "a rewritten shard kept the identity: %s", err);
  if (!rc) rt_engine_close(&e);
}

/* A truncated shard: refused in both tiers, naming the file. */
static void released_truncated(const char *ck) {
  char cut[400], cmd[1000], path[1100];
  snprintf(cut, sizeof cut, "%s/ck-cut", dir);
  snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", ck, cut);
  CEDAR_ASSERT(system(cmd) == 0);
  st_file_t *f = shard_of(cut, "layers.1.engram.embed.weight", path, sizeof path);
  CEDAR_ASSERT(f);
  st_close(f);
  long n = file_size(path);
  CEDAR_ASSERT(n > 100 && truncate(path, n - 100) == 0);
  const char *base = strrchr(path, '/') + 1;
  for (int k = 0; k < 2; k++) {
    struct rt_engine e;
    int rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = k ? T40_MMAP : T40, .model = cut}, err, sizeof err);
    EXPECT(rc != 0, "%s: a truncated shard was accepted", k ? "mmap" : "memory");
    if (!rc) {
      rt_engine_close(&e);
      continue;
    }
    EXPECT(strstr(err, base) && strstr(err, "truncated"), "%s: the refusal does not name the shard or say why: %s",
           k ? "mmap" : "memory", err);
  }
}

/* Pages of [p, p + n) resident (mincore), and their count in *total. */
static size_t resident(const void *p, size_t n, size_t *total) {
  size_t ps = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t b = (uintptr_t)p & ~(uintptr_t)(ps - 1), e = ((uintptr_t)p + n + ps - 1) & ~(uintptr_t)(ps - 1);
  size_t np = (e - b) / ps, k = 0;
  unsigned char *v = cedar_xmalloc(np ? np : 1);
  CEDAR_ASSERT(mincore((void *)b, e - b, v) == 0);
  for (size_t i = 0; i < np; i++) k += v[i] & 1;
  free(v);
  *total += np;
  return k;
}

/* Drop every shard of ck from the page cache. */
static void drop_cache(const char *ck) {
  char cmd[600], line[1024];
  snprintf(cmd, sizeof cmd, "ls '%s'/*.safetensors", ck);
  FILE *ls = popen(cmd, "r");
  CEDAR_ASSERT(ls);
  while (fgets(line, sizeof line, ls)) {
    line[strcspn(line, "\n")] = 0;
    int fd = open(line, O_RDONLY);
    if (fd >= 0) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), close(fd);
  }
  pclose(ls);
}

static size_t tables_resident(const struct weights *w, size_t *total) {
  size_t k = 0;
  for (size_t i = 0; i < w->list.n; i++) {
    const struct weights_spec *s = &w->list.t[i];
    if (s->init != WEIGHTS_ENGRAM_ROWS) continue;
    k += resident(w->data[i], (size_t)s->shape[0] * (size_t)s->row_values, total);
    k += resident(w->engram_scales[i], (size_t)s->shape[0] * (size_t)(s->row_values / 32), total);
  }
  return k;
}

static void released_not_read_whole(void) {
  char plan[400], text[1200], cwd[512], ck[400];
  CEDAR_ASSERT(getcwd(cwd, sizeof cwd));
  snprintf(plan, sizeof plan, "%s/big-mmap.yaml", dir);
  snprintf(text, sizeof text, "extends: %s/" T40_MMAP "\nmodel:\n  engram: {table_base: 100000}\n", cwd);
  write_text(plan, text);
  snprintf(ck, sizeof ck, "%s/ck-big", dir);
  write_ckpt(plan, ck, 8u << 20);
  drop_cache(ck);
  struct rt_engine e;
  int rc = rt_engine_open(&e, &(struct rt_engine_opts){.plan = plan, .model = ck}, err, sizeof err);
  EXPECT(rc == 0, "open the larger checkpoint, mmap: %s", err);
  if (rc) return;
  /* opening faulted each shard's header in, and with it the kernel's
   * readahead window (read_ahead_kb: 8 MB here) before the tier set
   * MADV_RANDOM: drop that too, then count from there */
  rt_engram_tier_evict(&e.engram, &e.weights);
  size_t total = 0, before = tables_resident(&e.weights, &total);
  if (before * 10 > total) {
    fprintf(stderr, "note: %zu of %zu table pages stay in the page cache after POSIX_FADV_DONTNEED (a tmpfs?): the "
            "residency check is skipped\n", before, total);
    rt_engine_close(&e);
    return;
  }
  (void)weights_identity(&e.weights); /* reads no table page */
  size_t t2 = 0, after_id = tables_resident(&e.weights, &t2);
  EXPECT(after_id <= before + 4, "weights_identity made %zu table pages resident", after_id - before);
  int32_t prompt[20];
  for (int i = 0; i < 20; i++) prompt[i] = (int32_t)((i * 13 + 5) % e.plan.model.vocab);
  struct rt_gen_opts go = {.chunk = 24, .replay = -1, .max_new = 4, .top_p = 1};
  struct rt_request r;
  struct rt_gen_result res = {0};
  rc = rt_engine_generate(&e, &r, prompt, 20, &go, &res, err, sizeof err);
  EXPECT(rc == 0, "run: %s", err);
  rt_engine_request_free(&e, &r);
  rt_gen_result_free(&res);
  size_t t3 = 0, after = tables_resident(&e.weights, &t3);
  /* 23 positions hashed (prompt + 3 steps) x 6 rows a module: at most 2
   * value pages a row (32 bytes never straddle more), and the scales'
   * pages, which are few (1 byte a row) and mostly touched */
  size_t scale_pages = 0, value_rows = 23 * 6 * 2;
  for (size_t i = 0; i < e.weights.list.n; i++)
    if (e.weights.list.t[i].init == WEIGHTS_ENGRAM_ROWS) {
      size_t t = 0;
      resident(e.weights.engram_scales[i], (size_t)e.weights.list.t[i].shape[0], &t);
      scale_pages += t;
    }
  size_t bound = before + value_rows * 2 + scale_pages + 8;
  fprintf(stderr, "note: table pages resident: %zu before, %zu after the run, of %zu (bound %zu)\n", before, after, t3,
          bound);
  EXPECT(after <= bound && after * 4 < t3, "the mmap run made %zu of %zu table pages resident (bound %zu)", after, t3,
         bound);
  rt_engine_close(&e);
}

static void released(void) {
  char ck[400];
  snprintf(ck, sizeof ck, "%s/ck", dir);
  write_ckpt(T40, ck, 64u << 10);
  released_bitwise(ck);
  released_in_place(ck);
  released_truncated(ck);
  released_not_read_whole();
}

int main(void) {
  op_blas_init();
  snprintf(dir, sizeof dir, "%s/cedar-engram-tier-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  CEDAR_ASSERT(mkdtemp(dir));
  setenv("TMPDIR", dir, 1); /* the derived tables files of tiny-40-mmap land here */
  plans();
  tables_file();
  bitwise_and_order();
  released();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "note: could not remove %s\n", dir);
  return h_report("engram_tier");
}
