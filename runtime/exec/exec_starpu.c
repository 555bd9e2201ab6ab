/* exec_starpu.c: the StarPU executor (exec.h): one StarPU task per graph
 * node, on CPU workers, ordered by the graph's own edges and nothing else.
 *
 *   codelets  one per op group, generated from GRAPH_OPS with designated
 *             initializers: name, CPU function, a CUDA function
 *             (STARPU_CUDA_ASYNC, StarPU's local stream) set at init for
 *             the op groups rt_backend_cuda can run, and a
 *             flop-count cost model for the model-based schedulers (dmda).
 *             The CPU function runs the node through rt_run_node
 *             (exec_node.c), the dispatch the direct executor uses too,
 *             so both executors compute the same bits.
 *   data      real StarPU data over cedar's buffers (exec_starpu_data.h):
 *             a request's KV page lists (one handle per source over all its
 *             pages: exec_starpu_pages.c), rings, tails, tokens and kept
 *             encoder outputs once per request, each
 *             graph's activations and buses per graph; all with implicit
 *             sequential consistency off. A task's buffers are the handles
 *             of the node's accesses (a KV access: its source's page list),
 *             and the codelet takes its activations, buses, ring and the
 *             KV pages it reads from the task's interfaces.
 *   edges     graph_node.dep, submitted with starpu_task_declare_deps_array;
 *             Engram row gathers (no edges) are submitted first.
 *   tasks     named "<node name> r<request>" ("L3.attn c2 r0"), with the
 *             node's flops, a tag identifying (run, node) for traces, and a
 *             critical-path priority (lower layers of trailing tiles first).
 *   scratch   one rt_arena per worker, indexed by starpu_worker_get_id().
 *   segments  on a device home whose activation slab holds the graph
 *             (rt_dev_act_slab), a decode graph's layer segments
 *             (runtime/exec/devseg.h): the first node's task waits for every
 *             dependency of the segment and runs its nodes (rt_dev_seg_run,
 *             through its CUDA worker's graph cache); the later nodes'
 *             tasks run nothing and keep the graph's order.
 *
 * Failure: the KV pages a graph appends to are reserved at submission, so
 * a pool or table that is full fails the request before anything runs,
 * naming the first node short of pages; an activation that cannot be
 * allocated fails it the same way (CEDAR_ENOMEM). A node that fails while
 * running marks the run failed; the tasks after it return without work.
 * The request is dropped; the process and other requests go on.
 *
 * Not here: the graph (scheduler/graph.c), the op groups (model.c), traces
 * (viz/trace.c). Test: tests/test_exec_starpu.c (ctest -R exec_starpu),
 * tests/cli/trace.sh.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include <starpu.h>

#include "runtime/device/cuda_backend.h"
#include "base/check.h"
#include "base/log.h"
#include "runtime/node/backend.h"
#include "runtime/device/devbind.h"
#include "runtime/exec/devseg.h"
#include "runtime/exec/exec.h"
#include "runtime/exec/exec_starpu_data.h"
#include "scheduler/policy.h"

/* The CUDA function of a codelet is set at rt_starpu_init for exactly the
 * op groups rt_backend_cuda has an entry for (set_cuda_slots), and only
 * against a StarPU built with CUDA (STARPU_USE_CUDA: .ci/starpu-cuda.sh);
 * Debian's CPU-only StarPU has no CUDA workers to run one. */

/* The cost model dmda plans with: flops at a rate typical of these ops on
 * one core, plus a fixed per-task cost. Only relative sizes matter. */
#define RT_SP_MODEL_FLOPS_PER_US 20e3
#define RT_SP_MODEL_FIXED_US 5.0

/* Debian's StarPU 1.3 is built with non-blocking drivers: an idle CPU
 * worker polls the scheduler in a tight loop, taking a core from the worker
 * that has work, from this process's main thread and from other processes
 * (on a 2-vCPU VM with anything else running, a decode step on two workers
 * ran 10-17x slower than on one before this hook). The
 * idle hook turns that spin into a poll every RT_SP_IDLE_NAP_NS; a task
 * made ready while its worker naps waits at most that long (the worker that
 * releases a task usually runs it at once). Between graphs the workers are
 * paused (starpu_pause) and block. */
#define RT_SP_IDLE_NAP_NS 20000

static unsigned idle_nap(void *arg) {
  (void)arg;
  static _Thread_local bool slack_set;
  if (!slack_set) { /* the default 50 us timer slack would stretch every nap */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    slack_set = true;
  }
  nanosleep(&(struct timespec){0, RT_SP_IDLE_NAP_NS}, NULL);
  return 0;
}

/* ---- process-wide state ------------------------------------------------- */

static struct {
  bool up, profile;
  int n_workers;
  double epoch_us;           /* starpu_timing_now() at init */
  struct rt_arena *arena;    /* (n_workers) */
  char sched[32];
  atomic_uint_least64_t runs; /* tags: run serial << 32 | node */
} sp;

/* ---- one run ------------------------------------------------------------ */

struct run;

struct node_arg {
  struct run *R;
  int k;
  int64_t out_row;           /* HEAD: first row of its logits in out */
  double t0_us, t1_us;       /* the task's own clock (starpu_timing_now) */
  int worker;
  int seg_k1;                /* a decode segment's lead: the segment is [k, seg_k1) and this task runs it; else 0 */
  bool seg_member;           /* a later node of a segment: its lead ran it, this task only orders the graph */
  struct sp_task_map map;    /* where each access's handles are among the task's buffers */
  char name[48];
};

struct run {
  const struct graph *g;
  const struct rt_model *M;
  struct rt_request *r;
  struct rt_exec_out *out;
  void **buf;                /* (n_data) activations and buses */
  starpu_data_handle_t *h;   /* (n_data) */
  struct starpu_task **task; /* (n_node) */
  struct node_arg *arg;      /* (n_node) */
  int64_t act_bytes;
  struct rt_dev_ctx *dv;     /* the device home of this graph (M->dev), or NULL: the host's state */
  struct rt_dev_twin *tw;    /* r's twin there */
  bool slab;                 /* activations at the device's activation slab (rt_dev_act_slab): segments may run */
  atomic_int failed;         /* first failing node + 1, 0 when none */
  atomic_int failed_rc;      /* its status */
  atomic_int done;
};

/* Node nd's activation and bus pointers, and its state, from the task's
 * interfaces: buf (n_data, only the node's own entries written) and st.
 * The ring is bound as a copy over the interface buffers (its r0 is
 * written back by the caller); the KV pages it reads come from the
 * interfaces; tails, tokens and encoder outputs are the handles' home
 * buffers, which the asserts hold to (main RAM: the same memory). */
static void bind_from_interfaces(struct run *R, const struct node_arg *A, void *buffers[], void **buf,
                                 struct rt_bound *st, struct rt_ring *ring) {
  const struct graph *g = R->g;
  const struct graph_node *nd = &g->node[A->k];
  bool dev = R->tw != NULL;
  if (dev) /* the twin: device addresses, which are the handles' homes on the CUDA node this task runs on */
    rt_dev_bind_node(R->tw, g, R->r, nd, st);
  else
    rt_bind_node(g, R->r, nd, st);
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_data *gd = &g->data[nd->use[u].data];
    void *p0 = A->map.count[u] ? (void *)STARPU_VARIABLE_GET_PTR(buffers[A->map.first[u]]) : NULL;
    if (gd->kind == GRAPH_ACT || gd->kind == GRAPH_BUS) {
      buf[nd->use[u].data] = p0;
    } else if (dev) {
      CEDAR_ASSERT(!p0 || gd->kind != GRAPH_STATE || gd->state != GRAPH_ST_RING || p0 == (void *)st->ring->slot);
    } else if (gd->kind == GRAPH_STATE && gd->state == GRAPH_ST_RING && A->map.count[u] == 2) {
      *ring = *st->ring;
      ring->slot = p0;
      ring->pos = (int64_t *)STARPU_VARIABLE_GET_PTR(buffers[A->map.first[u] + 1]);
      st->ring = ring;
    } else if (gd->kind == GRAPH_STATE && gd->state == GRAPH_ST_TAIL && p0) {
      CEDAR_ASSERT(p0 == (void *)R->r->tail_buf[gd->layer]);
    } else if (gd->kind == GRAPH_STATE && gd->state == GRAPH_ST_TOKENS && p0) { /* a twin elsewhere: none */
      CEDAR_ASSERT(p0 == (void *)R->r->tokens);
    }
  }
  if (A->map.kv_pages_count > 0 && dev) {
    /* the twin's page table (in the device's memory, what a CUDA entry
     * reads) holds the same addresses as the interfaces: the pages' homes */
    const struct rt_kv_seq *s = st->kv_r;
    for (int i = 0; i < A->map.kv_pages_count; i++)
      CEDAR_ASSERT(s && i < s->n_pages &&
                   s->page_ptr[i] == (const uint8_t *)STARPU_VARIABLE_GET_PTR(buffers[A->map.kv_pages_first + i]));
  } else if (A->map.kv_list >= 0) {
    /* the source's page list (exec_starpu_pages.c): the table of the sequence the node reads */
    const struct rt_kv_seq *s = sp__pages_seq(buffers[A->map.kv_list]);
    CEDAR_ASSERT(s == st->kv_r);
    st->kv_r_pages = s->page_ptr;
  }
}

/* A decode segment [A->k, A->seg_k1) in one task (runtime/exec/devseg.h): its
 * nodes on the task's stream through this worker's graph cache (a CUDA
 * worker's own; the stand-in's CPU workers run them in place), their
 * buffers the activation slab's and the twin's. The segment's later nodes
 * are tasks that only keep the graph's order (seg_member). */
static void run_segment(struct run *R, struct node_arg *A, struct rt_arena *ar, void *stream, int w) {
  const struct rt_dev_ctx *dv = R->dv;
  bool cuda = stream != NULL && w < dv->n_cw_sp;
  struct rt_dev_seg S = {R->g, R->M, R->r, dv, R->tw, R->buf, R->out, ar, cuda ? dv->cw_sp[w] : NULL, A->k,
                         A->seg_k1, 0, 0};
  char err[256];
  int rc = rt_dev_seg_run(&S, cuda ? dv->graphs_sp[w] : NULL, dv->graphs_on, stream, err, sizeof err);
  if (!rc) __atomic_fetch_add(&R->dv->segment_runs, 1, __ATOMIC_RELAXED);
  int none = 0, at = S.failed ? S.failed - 1 : A->k;
  if (rc && atomic_compare_exchange_strong(&R->failed, &none, at + 1)) atomic_store(&R->failed_rc, S.failed ? S.rc : rc);
}

/* A codelet's body on any worker: the node is in cl_arg, its data in the
 * task's interfaces; `stream` is the CUDA stream its kernels go on (NULL on
 * a CPU worker). */
static void run_task(void *buffers[], void *cl_arg, void *stream) {
  struct node_arg *A = cl_arg;
  struct run *R = A->R;
  const struct graph_node *nd = &R->g->node[A->k];
  int w = starpu_worker_get_id();
  CEDAR_ASSERT(w >= 0 && w < sp.n_workers);
  struct rt_arena *ar = &sp.arena[w];
  A->worker = w;
  A->t0_us = starpu_timing_now();
  if (atomic_load(&R->failed) == 0 && A->seg_k1 > A->k) {
    run_segment(R, A, ar, stream, w);
  } else if (atomic_load(&R->failed) == 0 && !A->seg_member) {
    void **buf = RT_ALLOC(ar, void *, R->g->n_data);
    struct rt_bound st;
    struct rt_ring ring;
    bind_from_interfaces(R, A, buffers, buf, &st, &ring);
    struct rt_cuda_env env;
    const struct rt_node_dev dv = {stream, NULL,
                                   stream && R->dv && w < R->dv->n_cw_sp ? rt_dev_env(R->dv, R->tw, R->dv->cw_sp[w], &env)
                                                                        : NULL};
    int rc = rt_run_node_dev(R->g, R->M, R->r, nd, buf, &st, R->out, A->out_row, ar, &dv);
    if (R->tw && !rc)
      rt_dev_node_done(R->tw, R->r, &st); /* the host keeps the metadata (runtime/device/devbind.h) */
    else if (st.ring == &ring)
      R->r->ring[nd->layer].r0 = ring.r0;
    int none = 0;
    if (rc && atomic_compare_exchange_strong(&R->failed, &none, A->k + 1)) atomic_store(&R->failed_rc, rc);
  }
  rt_arena_reset(ar);
  A->t1_us = starpu_timing_now();
  atomic_fetch_add(&R->done, 1);
}

/* The CPU function of every codelet. */
static void cpu_task(void *buffers[], void *cl_arg) { run_task(buffers, cl_arg, NULL); }

#ifdef STARPU_USE_CUDA
/* The CUDA function of a codelet whose op group has a CUDA entry: the
 * node's kernels are launched on this worker's StarPU stream and the
 * codelet is STARPU_CUDA_ASYNC, so this returns once they are enqueued and
 * StarPU waits on the stream. Buffers are bound as for the CPU: the
 * interfaces' pointers are device addresses on this worker's memory node. */
static void cuda_task(void *buffers[], void *cl_arg) {
  run_task(buffers, cl_arg, (void *)starpu_cuda_get_local_stream());
}
#endif

static double flops_cost(struct starpu_task *t, unsigned nimpl) {
  (void)nimpl;
  return RT_SP_MODEL_FIXED_US + t->flops / RT_SP_MODEL_FLOPS_PER_US;
}

static struct starpu_perfmodel flops_model = {
    .type = STARPU_COMMON,
    .cost_function = flops_cost,
    .symbol = "cedar_flops",
};

static struct starpu_codelet codelets[GRAPH_OP_COUNT] = {
#define X(e, s)                                       \
  [GRAPH_##e] = {                                     \
      .where = STARPU_CPU,                            \
      .cpu_funcs = {cpu_task},                        \
      .cpu_funcs_name = {"cpu_task"},                 \
      .nbuffers = STARPU_VARIABLE_NBUFFERS,           \
      .model = &flops_model,                          \
      .name = s,                                      \
  },
    GRAPH_OPS(X)
#undef X
};

/* Give each codelet whose op group has a CUDA entry its CUDA function;
 * returns how many (0: StarPU starts no CUDA worker). */
static int set_cuda_slots(void) {
  int n = 0;
#ifdef STARPU_USE_CUDA
  for (int op = 0; op < GRAPH_OP_COUNT; op++) {
    if (!rt_backend_cuda.run[op]) continue;
    codelets[op].cuda_funcs[0] = cuda_task;
    codelets[op].cuda_flags[0] = STARPU_CUDA_ASYNC;
    codelets[op].where |= STARPU_CUDA;
    n++;
  }
#endif
  return n;
}

/* ---- init and shutdown -------------------------------------------------- */

static bool sched_known(const char *name, char *list, size_t len) {
  struct starpu_sched_policy **pol = starpu_sched_get_predefined_policies();
  bool found = false;
  size_t used = 0;
  list[0] = 0;
  for (int i = 0; pol[i]; i++) {
    if (!strcmp(pol[i]->policy_name, name)) found = true;
    int w = snprintf(list + used, len - used, "%s%s", i ? ", " : "", pol[i]->policy_name);
    if (w > 0 && (size_t)w < len - used) used += (size_t)w;
  }
  return found;
}

int rt_starpu_init(const struct rt_starpu_opts *o, char *err, size_t err_len) {
  if (sp.up) {
    snprintf(err, err_len, "StarPU is already started in this process");
    return CEDAR_EINVAL;
  }
  char list[512];
  if (o->sched && !sched_known(o->sched, list, sizeof list)) {
    snprintf(err, err_len, "--sched: unknown StarPU scheduling policy '%s' (known: %s)", o->sched, list);
    return CEDAR_EINVAL;
  }
  if (o->workers > STARPU_MAXCPUS) {
    snprintf(err, err_len, "--workers: this StarPU build takes at most %d CPU workers (got %d)", STARPU_MAXCPUS,
             o->workers);
    return CEDAR_EINVAL;
  }
  struct starpu_conf conf;
  STARPU_CHECK(starpu_conf_init(&conf));
  if (o->workers > 0) conf.ncpus = o->workers;
  if (o->sched) conf.sched_policy_name = o->sched;
  conf.precedence_over_environment_variables = o->workers > 0 || o->sched;
  int cuda_groups = set_cuda_slots();
  conf.ncuda = cuda_groups ? -1 : 0; /* CUDA workers only when some op group can run on them */
  conf.nopencl = 0;
  conf.nmic = 0;
  conf.nmpi_ms = 0;
  int rc = starpu_init(&conf);
  if (rc) {
    snprintf(err, err_len, "starpu_init failed: %s (%d)", rc < 0 ? strerror(-rc) : "error", rc);
    return CEDAR_EUNSUPPORTED;
  }
  int n = (int)starpu_cpu_worker_get_count();
  int n_all = (int)starpu_worker_get_count(); /* CPU workers, then any CUDA workers */
  if ((o->workers > 0 && n != o->workers) || n < 1 || (!cuda_groups && n != n_all)) {
    snprintf(err, err_len, "StarPU started %d CPU workers of %u (asked for %d)", n, starpu_worker_get_count(),
             o->workers);
    starpu_shutdown();
    return CEDAR_EUNSUPPORTED;
  }
  starpu_idle_hook_register(idle_nap, NULL);
  sp.up = true;
  sp.profile = o->profile;
  sp.n_workers = n_all;
  sp.arena = cedar_xcalloc((size_t)n_all, sizeof(*sp.arena));
  for (int i = 0; i < n_all; i++) rt_arena_init(&sp.arena[i], 0);
  struct starpu_sched_policy *pol = starpu_sched_ctx_get_sched_policy(0); /* the global context */
  snprintf(sp.sched, sizeof sp.sched, "%s", pol && pol->policy_name ? pol->policy_name : "?");
  starpu_profiling_status_set(o->profile ? STARPU_PROFILING_ENABLE : STARPU_PROFILING_DISABLE);
  sp.epoch_us = starpu_timing_now();
  starpu_pause(); /* idle workers sleep between graphs (see rt_exec_starpu) */
  return 0;
}

void rt_starpu_shutdown(void) {
  if (!sp.up) return;
  starpu_resume();
  starpu_task_wait_for_all();
  sp__release_all(); /* pools and requests that outlive StarPU keep no dangling handle */
  starpu_shutdown();
  for (int i = 0; i < sp.n_workers; i++) rt_arena_free(&sp.arena[i]);
  free(sp.arena);
  sp.arena = NULL;
  sp.up = false;
  sp.n_workers = 0;
}

bool rt_starpu_running(void) { return sp.up; }
const char *rt_starpu_sched(void) { return sp.up ? sp.sched : ""; }
int rt_starpu_workers(void) { return sp.up ? sp.n_workers : 0; }
double rt_starpu_now_us(void) { return sp.up ? starpu_timing_now() - sp.epoch_us : 0; }

void rt_starpu_worker_name(int worker, char *b, size_t len) {
  if (sp.up && worker >= 0 && worker < sp.n_workers)
    starpu_worker_get_name(worker, b, len);
  else
    snprintf(b, len, "worker %d", worker);
}

/* ---- per-graph data -------------------------------------------------------- */

/* Buffers and handles for every activation and bus (state has its own,
 * exec_starpu_data.c). Returns -1, or the data id that could not be
 * allocated (the request fails with CEDAR_ENOMEM). */
static int register_acts(struct run *R) {
  const struct graph *g = R->g;
  R->slab = R->dv && rt_dev_act_slab(R->dv, g, R->buf); /* a device home: its slab when the graph fits */
  for (int d = 0; d < g->n_data; d++) {
    const struct graph_data *gd = &g->data[d];
    if (gd->kind != GRAPH_ACT && gd->kind != GRAPH_BUS) continue;
    size_t bytes = (size_t)gd->bytes;
    void *p = R->buf[d] = R->slab  ? R->buf[d]
                          : R->dv ? R->dv->ops->alloc(bytes)
                                  : aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) return d;
    R->act_bytes += gd->bytes;
    /* home: main RAM, or the device's memory node for a device-home graph (StarPU moves nothing then) */
    starpu_variable_data_register(&R->h[d], R->dv ? R->dv->starpu_node : STARPU_MAIN_RAM, (uintptr_t)p, bytes);
    starpu_data_set_sequential_consistency_flag(R->h[d], 0);
    starpu_data_set_name(R->h[d], gd->name);
  }
  return -1;
}

static void unregister_acts(struct run *R) {
  for (int d = 0; d < R->g->n_data; d++) {
    if (R->h[d]) starpu_data_unregister_no_coherency(R->h[d]);
    if (R->slab) /* the slab's addresses: the device's, kept */
      continue;
    if (R->dv && R->buf[d])
      R->dv->ops->free(R->buf[d]);
    else
      free(R->buf[d]);
  }
}

/* ---- tasks -------------------------------------------------------------- */

static struct starpu_task *make_task(struct run *R, int k, uint64_t tag0, int tiles) {
  const struct graph_node *nd = &R->g->node[k];
  struct node_arg *A = &R->arg[k];
  A->R = R;
  A->k = k;
  A->worker = -1;
  snprintf(A->name, sizeof A->name, "%s r%d", nd->name, R->r->id);
  struct starpu_task *t = starpu_task_create();
  t->cl = &codelets[nd->op];
  t->cl_arg = A;
  t->cl_arg_size = sizeof(*A);
  t->name = A->name;
  t->flops = nd->flops;
  t->tag_id = tag0 | (uint64_t)k; /* identifies the task; edges are task to task, so use_tag stays 0 */
  t->destroy = 0;                 /* deps and profiling are read after completion */
  t->sequential_consistency = 0;
  t->where = nd->place.dev == GRAPH_DEV_CUDA ? STARPU_CUDA : STARPU_CPU; /* the plan's placement, never moved */
  t->priority = sched_priority(R->g, k, tiles, starpu_sched_get_min_priority(), starpu_sched_get_max_priority());
  sp__task_buffers(t, R->g, nd, R->r, R->h, R->tw, &A->map);
  return t;
}

/* Create every task, declare the graph's edges, and submit: Engram row
 * gathers first (they wait for nothing) under serving.engram.prefetch, then
 * the rest in graph order. */
static void submit_graph(struct run *R) {
  const struct graph *g = R->g;
  uint64_t tag0 = (uint64_t)atomic_fetch_add(&sp.runs, 1) << 32;
  int64_t row = 0;
  int tiles = sched_tiles(g);
  for (int k = 0; k < g->n_node; k++) {
    R->task[k] = make_task(R, k, tag0, tiles);
    if (g->node[k].op == GRAPH_HEAD) {
      R->arg[k].out_row = row;
      row += g->node[k].n;
    }
  }
  struct starpu_task **deps = cedar_xmalloc(sizeof(*deps) * (size_t)(g->n_node > 0 ? g->n_node : 1));
  int *seg_end = cedar_xcalloc((size_t)(g->n_node > 0 ? g->n_node : 1), sizeof(*seg_end));
  if (R->slab && R->dv->segments) rt_dev_segments(g, seg_end); /* runtime/exec/devseg.h; the slab's fixed addresses */
  for (int k = 0; k < g->n_node; k++)
    if (seg_end[k] > k) {
      R->arg[k].seg_k1 = seg_end[k];
      for (int j = k + 1; j < seg_end[k]; j++) R->arg[j].seg_member = true;
    }
  for (int pass = 0; pass < 2; pass++)
    for (int k = 0; k < g->n_node; k++) {
      const struct graph_node *nd = &g->node[k];
      if ((nd->op == GRAPH_ENGRAM_GATHER && g->plan->serving.engram_prefetch) != (pass == 0)) continue;
      int n = 0;
      for (int j = k; j < (seg_end[k] > k ? seg_end[k] : k + 1); j++) /* a segment's lead waits for all it runs */
        for (int i = 0; i < g->node[j].n_dep; i++) {
          int dk = g->node[j].dep[i];
          bool seen = dk >= k && j > k; /* inside the segment: the lead runs it */
          for (int q = 0; q < n && !seen; q++) seen = deps[q] == R->task[dk];
          if (!seen) deps[n++] = R->task[dk];
        }
      if (n) starpu_task_declare_deps_array(R->task[k], (unsigned)n, deps);
      STARPU_CHECK(starpu_task_submit(R->task[k]));
    }
  free(seg_end);
  free(deps);
}

/* Wait for every task of the graph (the workers were resumed before it
 * was submitted), calling progress from this thread meanwhile; pause the
 * workers again. */
static void wait_graph(struct run *R, rt_progress_cb progress, void *user) {
  int n = R->g->n_node;
  while (progress && atomic_load(&R->done) < n) {
    progress(user, atomic_load(&R->done), n);
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
  }
  STARPU_CHECK(starpu_task_wait_for_all());
  starpu_pause();
  if (progress) progress(user, n, n);
}

/* Seconds per op family, summed over the workers' arenas (since init). */
static void family_seconds(double *fam /* (RT_FAM_COUNT) */) {
  for (int f = 0; f < RT_FAM_COUNT; f++) fam[f] = 0;
  for (int w = 0; w < sp.n_workers; w++)
    for (int f = 0; f < RT_FAM_COUNT; f++) fam[f] += sp.arena[w].fam_s[f];
}

static void collect(struct run *R, struct rt_exec_stats *st, struct rt_task_time *times, const double *fam0) {
  const struct graph *g = R->g;
  for (int k = 0; k < g->n_node; k++) {
    const struct node_arg *A = &R->arg[k];
    const struct graph_node *nd = &g->node[k];
    struct starpu_profiling_task_info *pi = R->task[k]->profiling_info; /* StarPU takes it non-const */
    if (st) {
      st->op_seconds[nd->op] += 1e-6 * (A->t1_us - A->t0_us);
      st->op_nodes[nd->op]++;
      st->nodes++;
      if (nd->op == GRAPH_ATTN) st->token_layers += nd->n;
    }
    if (!times) continue;
    struct rt_task_time *t = &times[k];
    if (sp.profile && pi) {
      t->worker = pi->workerid;
      t->submit_us = starpu_timing_timespec_to_us(&pi->submit_time) - sp.epoch_us;
      t->start_us = starpu_timing_timespec_to_us(&pi->start_time) - sp.epoch_us;
      t->end_us = starpu_timing_timespec_to_us(&pi->end_time) - sp.epoch_us;
    } else {
      *t = (struct rt_task_time){A->worker, 0, A->t0_us - sp.epoch_us, A->t1_us - sp.epoch_us};
    }
  }
  if (st) {
    double fam[RT_FAM_COUNT];
    family_seconds(fam);
    for (int f = 0; f < RT_FAM_COUNT; f++) st->family_seconds[f] += fam[f] - fam0[f];
    if (R->act_bytes > st->act_peak_bytes) st->act_peak_bytes = R->act_bytes;
    for (int w = 0; w < sp.n_workers; w++)
      if ((int64_t)sp.arena[w].peak > st->scratch_peak_bytes) st->scratch_peak_bytes = (int64_t)sp.arena[w].peak;
  }
}

int rt_exec_starpu(const struct graph *g, const struct rt_model *M, struct rt_request *r, struct rt_exec_out *out,
                   struct rt_exec_stats *st, struct rt_task_time *times, rt_progress_cb progress, void *user,
                   char *err, size_t err_len) {
  if (!sp.up) {
    snprintf(err, err_len, "the StarPU executor needs rt_starpu_init first");
    return CEDAR_EINVAL;
  }
  struct run R = {.g = g, .M = M, .r = r, .out = out};
  size_t nd = (size_t)(g->n_data > 0 ? g->n_data : 1), nn = (size_t)(g->n_node > 0 ? g->n_node : 1);
  R.buf = cedar_xcalloc(nd, sizeof(*R.buf));
  R.h = cedar_xcalloc(nd, sizeof(*R.h));
  R.task = cedar_xcalloc(nn, sizeof(*R.task));
  R.arg = cedar_xcalloc(nn, sizeof(*R.arg));
  atomic_init(&R.failed, 0);
  atomic_init(&R.failed_rc, 0);
  atomic_init(&R.done, 0);
  double t0 = starpu_timing_now(), fam0[RT_FAM_COUNT];
  family_seconds(fam0);
  int rc = 0, short_k = rt_reserve_pages(g, r);
  if (short_k < 0 && M->dev && g->n_node > 0 && rt_dev_home(M->dev, &g->node[0])) { /* runtime/device/devbind.h */
    R.dv = M->dev;
    if (R.dv->starpu_node < 0) {
      snprintf(err, err_len, "the %s device state has no StarPU handles (it was opened while StarPU was not "
               "running); this request is dropped", R.dv->ops->name);
      rc = CEDAR_EUNSUPPORTED;
    } else if (sp__dev_register(R.dv), !(R.tw = rt_dev_request_twin(R.dv, r, err, err_len))) {
      rc = CEDAR_ENOMEM;
    }
  }
  int oom_d = short_k < 0 && !rc ? register_acts(&R) : -1;
  if (rc) { /* err says why: nothing was submitted */
  } else if (short_k >= 0) {
    rt_node_error(&g->node[short_k], CEDAR_ENOMEM, err, err_len);
    rc = CEDAR_ENOMEM;
  } else if (oom_d >= 0) {
    snprintf(err, err_len, "out of memory for %s (%lld bytes); this request is dropped", g->data[oom_d].name,
             (long long)g->data[oom_d].bytes);
    rc = CEDAR_ENOMEM;
  } else {
    /* The workers run while the rest is submitted: submission (a task's
     * buffers are its KV pages too) overlaps the first tasks. Declaring an
     * edge to a task that already ran is valid while it is not destroyed
     * (destroy = 0 until the end). */
    starpu_resume();
    submit_graph(&R);
    wait_graph(&R, progress, user);
  }
  unregister_acts(&R);
  if (st) st->seconds += 1e-6 * (starpu_timing_now() - t0);
  int failed = atomic_load(&R.failed);
  if (!rc) collect(&R, st, times, fam0);
  if (failed) {
    rc = atomic_load(&R.failed_rc);
    rt_node_error(&g->node[failed - 1], rc, err, err_len);
  }
  for (int k = 0; k < g->n_node; k++) {
    if (R.task[k]) starpu_task_destroy(R.task[k]);
    sp__task_map_free(&R.arg[k].map);
  }
  free(R.task);
  free(R.arg);
  free(R.h);
  free(R.buf);
  return rc;
}
