/* cmd_env.c: `cedar env`, what this machine and this build give cedar.
 *
 * Prints the cedar version; the versions of StarPU, hwloc, libyaml, cJSON,
 * OpenBLAS and the CUDA runtime; the hwloc topology (packages, cores, PUs, NUMA
 * nodes, L3/L2); the StarPU workers a default starpu_init would start (with
 * the PU each CPU worker is bound to); the CUDA devices, or the CUDA error
 * that says why there are none; and the CUDA kernels built (ops with a CUDA
 * twin, node op groups with a CUDA entry) and whether nodes run on CUDA here. `--json` prints the same as one JSON object.
 *
 * Not a benchmark and not a configuration step: it changes nothing, runs no
 * tasks, and honours the user's StarPU and hwloc environment variables
 * (STARPU_NCPU, STARPU_SCHED, HWLOC_COMPONENTS, ...) exactly as the executor
 * would. It never queries PCI devices through hwloc (the PCI plugin leaks
 * under ASan; the tests run with HWLOC_COMPONENTS=-pci).
 *
 * A library that fails to start (hwloc topology, starpu_init) is reported in
 * the output and makes the exit status 1; having no GPU is not a failure.
 *
 * Run: cedar env [--json]. Test: tests/cli/env.sh.
 */
#include <cJSON.h>
#include <cblas.h> /* openblas_get_config, openblas_get_corename, openblas_get_num_threads */
#include <getopt.h>
#include <hwloc.h>
#include <starpu.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "kernels/backend.h"
#include "kernels/device.h"
#include "runtime/device/cuda_backend.h"
#include "ops/registry.h"
#include "runtime/node/backend.h"
#include "ops/isa.h"
#include "base/check.h"
#include "cli/cli.h"

#define ENV_MAX_CUDA 64

/* ---------------------------------------------------------------------------
 * cJSON helpers: the report is built once as a cJSON tree, then printed as
 * JSON or as text, so both forms always say the same thing. cJSON returns
 * NULL only when out of memory, which the CHECK tier treats as fatal. */

static cJSON *jcheck(cJSON *item, const char *what) {
  CEDAR_ASSERT_MSG(item != NULL, "cJSON: out of memory adding '%s'", what);
  return item;
}
static cJSON *jobj(cJSON *parent, const char *key) {
  return jcheck(cJSON_AddObjectToObject(parent, key), key);
}
static cJSON *jarr(cJSON *parent, const char *key) {
  return jcheck(cJSON_AddArrayToObject(parent, key), key);
}
static void jstr(cJSON *parent, const char *key, const char *val) {
  jcheck(cJSON_AddStringToObject(parent, key, val ? val : ""), key);
}
static void jnum(cJSON *parent, const char *key, double val) {
  jcheck(cJSON_AddNumberToObject(parent, key, val), key);
}
static void jbool(cJSON *parent, const char *key, bool val) {
  jcheck(cJSON_AddBoolToObject(parent, key, val), key);
}
static cJSON *jpush(cJSON *array) {
  cJSON *o = jcheck(cJSON_CreateObject(), "array item");
  CEDAR_ASSERT(cJSON_AddItemToArray(array, o));
  return o;
}
static const char *jget_str(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}
static double jget_num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : -1;
}
static const cJSON *jget(const cJSON *o, const char *key) {
  return cJSON_GetObjectItemCaseSensitive(o, key);
}

static void version_str(char *buf, size_t n, unsigned v) {
  snprintf(buf, n, "%u.%u.%u", (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff);
}

/* ---------------------------------------------------------------------------
 * Gathering. */

static void gather_versions(cJSON *root) {
  char buf[64];
  cJSON *lib = jobj(root, "libraries");

  int maj, min, rel;
  starpu_get_version(&maj, &min, &rel);
  snprintf(buf, sizeof buf, "%d.%d.%d", maj, min, rel);
  cJSON *s = jobj(lib, "starpu");
  jstr(s, "version", buf);
  jnum(s, "max_cpu_workers", STARPU_MAXCPUS);
#ifdef STARPU_USE_CUDA
  jbool(s, "cuda", true);
#else
  jbool(s, "cuda", false);
#endif

  cJSON *h = jobj(lib, "hwloc");
  version_str(buf, sizeof buf, hwloc_get_api_version());
  jstr(h, "api_runtime", buf);
  version_str(buf, sizeof buf, HWLOC_API_VERSION);
  jstr(h, "api_compiled", buf);

  jstr(jobj(lib, "libyaml"), "version", yaml_get_version_string());
  jstr(jobj(lib, "cjson"), "version", cJSON_Version());

  cJSON *b = jobj(lib, "openblas");
  jstr(b, "config", openblas_get_config());
  jstr(b, "core", openblas_get_corename());
  jnum(b, "threads", openblas_get_num_threads());

  cJSON *k = jobj(lib, "cedar_kernels"); /* ops/isa.h */
  jstr(k, "isa", op_isa_name(op_isa()));
  cJSON *lv = cJSON_AddArrayToObject(k, "supported");
  for (int i = 0; i < OP_ISA_COUNT; i++)
    if (op_isa_supported((enum op_isa)i)) cJSON_AddItemToArray(lv, cJSON_CreateString(op_isa_name((enum op_isa)i)));

  cJSON *c = jobj(lib, "cuda");
  char err[512];
  int rt = 0, drv = 0;
  int rc = kern_cuda_version(&rt, &drv, err, sizeof err);
  jbool(c, "built", rc != KERN_DEVICE_ENOCUDA);
  if (rc == 0) {
    snprintf(buf, sizeof buf, "%d.%d", rt / 1000, rt % 1000 / 10);
    jstr(c, "runtime", buf);
    snprintf(buf, sizeof buf, "%d.%d", drv / 1000, drv % 1000 / 10);
    jstr(c, "driver", drv ? buf : "none");
  } else {
    jstr(c, "error", err);
  }
}

/* Count and size of every cache object of one type (sizes may differ on
 * hybrid CPUs, so each distinct size is listed as "n x size"). */
static void gather_cache(cJSON *topo, hwloc_topology_t t, hwloc_obj_type_t type,
                         const char *key) {
  cJSON *arr = jarr(topo, key);
  int n = hwloc_get_nbobjs_by_type(t, type);
  for (int i = 0; i < n; i++) {
    hwloc_obj_t o = hwloc_get_obj_by_type(t, type, (unsigned)i);
    CEDAR_ASSERT(o != NULL && o->attr != NULL);
    double size = (double)o->attr->cache.size;
    cJSON *found = NULL, *it;
    cJSON_ArrayForEach(it, arr) {
      if (jget_num(it, "bytes") == size) found = it;
    }
    if (found) {
      cJSON *cnt = cJSON_GetObjectItemCaseSensitive(found, "count");
      cJSON_SetNumberValue(cnt, cnt->valuedouble + 1);
    } else {
      cJSON *e = jpush(arr);
      jnum(e, "count", 1);
      jnum(e, "bytes", size);
    }
  }
}

static int count_type(hwloc_topology_t t, hwloc_obj_type_t type) {
  int n = hwloc_get_nbobjs_by_type(t, type);
  return n < 0 ? 0 : n; /* -1 = "at several depths", impossible for these types */
}

static int gather_topology(cJSON *root) {
  cJSON *topo = jobj(root, "topology");
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) {
    jstr(topo, "error", "hwloc_topology_init failed");
    return 1;
  }
  if (hwloc_topology_load(t) != 0) {
    jstr(topo, "error", "hwloc_topology_load failed");
    hwloc_topology_destroy(t);
    return 1;
  }
  jnum(topo, "packages", count_type(t, HWLOC_OBJ_PACKAGE));
  jnum(topo, "cores", count_type(t, HWLOC_OBJ_CORE));
  jnum(topo, "pus", count_type(t, HWLOC_OBJ_PU));
  jnum(topo, "numa_nodes", count_type(t, HWLOC_OBJ_NUMANODE));
  hwloc_obj_t top = hwloc_get_root_obj(t);
  const char *hwv = hwloc_obj_get_info_by_name(top, "hwlocVersion");
  cJSON *lib = cJSON_GetObjectItemCaseSensitive(root, "libraries"); /* gather_versions ran */
  if (hwv) jstr(cJSON_GetObjectItemCaseSensitive(lib, "hwloc"), "version", hwv);
  jnum(topo, "memory_bytes", (double)top->total_memory);
  hwloc_obj_t pkg = hwloc_get_obj_by_type(t, HWLOC_OBJ_PACKAGE, 0);
  const char *model = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : NULL;
  if (model) jstr(topo, "cpu_model", model);
  gather_cache(topo, t, HWLOC_OBJ_L3CACHE, "l3");
  gather_cache(topo, t, HWLOC_OBJ_L2CACHE, "l2");
  hwloc_topology_destroy(t);
  return 0;
}

/* "CPU" from "STARPU_CPU_WORKER". */
static const char *worker_type(enum starpu_worker_archtype type) {
  switch (type) {
  case STARPU_CPU_WORKER: return "CPU";
  case STARPU_CUDA_WORKER: return "CUDA";
  case STARPU_OPENCL_WORKER: return "OpenCL";
  default: return starpu_worker_get_type_as_string(type);
  }
}

/* Start StarPU as the executor would (starpu_conf_init, which reads
 * STARPU_NCPU and friends), list its workers, shut it down. */
static int gather_starpu(cJSON *root) {
  cJSON *sp = jobj(root, "starpu");
  const char *knobs[] = {"STARPU_NCPU", "STARPU_NCUDA", "STARPU_NOPENCL", "STARPU_SCHED"};
  cJSON *envj = jobj(sp, "environment");
  for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
    if (getenv(knobs[i])) jstr(envj, knobs[i], getenv(knobs[i]));

  struct starpu_conf conf;
  STARPU_CHECK(starpu_conf_init(&conf));
  int rc = starpu_init(&conf);
  if (rc != 0) {
    char msg[160];
    snprintf(msg, sizeof msg, "starpu_init failed: %s (%d)", strerror(-rc), rc);
    jstr(sp, "error", msg);
    return 1;
  }
  /* Context 0 is StarPU's global context (STARPU_GLOBAL_SCHED_CTX, not in the public headers). */
  struct starpu_sched_policy *pol = starpu_sched_ctx_get_sched_policy(0);
  jstr(sp, "scheduler", pol && pol->policy_name ? pol->policy_name : "unknown");
  cJSON *workers = jarr(sp, "workers");
  unsigned n = starpu_worker_get_count();
  for (unsigned id = 0; id < n; id++) {
    char name[128];
    starpu_worker_get_name((int)id, name, sizeof name);
    enum starpu_worker_archtype type = starpu_worker_get_type((int)id);
    cJSON *w = jpush(workers);
    jnum(w, "id", id);
    jstr(w, "name", name);
    jstr(w, "type", worker_type(type));
    jnum(w, "devid", starpu_worker_get_devid((int)id));
    jnum(w, "bindid", starpu_worker_get_bindid((int)id));
    jnum(w, "memory_node", starpu_worker_get_memory_node(id));
    hwloc_obj_t obj = starpu_worker_get_hwloc_obj((int)id);
    if (type == STARPU_CPU_WORKER && obj) {
      cJSON *pu = jobj(w, "bound_to");
      jstr(pu, "type", hwloc_obj_type_string(obj->type));
      jnum(pu, "logical", obj->logical_index);
      jnum(pu, "os", obj->os_index);
    }
  }
  starpu_shutdown();
  return 0;
}

static void gather_cuda_devices(cJSON *root) {
  cJSON *cu = jobj(root, "cuda_devices");
  struct kern_device_info *devs = cedar_xcalloc(ENV_MAX_CUDA, sizeof *devs);
  char err[512];
  int n = kern_device_query(devs, ENV_MAX_CUDA, err, sizeof err);
  jnum(cu, "count", n < 0 ? 0 : n);
  if (n < 0) {
    /* err starts with the CUDA error name, e.g. "cudaErrorInsufficientDriver: ...". */
    size_t len = strcspn(err, ":");
    char name[96];
    snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), err);
    jstr(cu, "error_name", n == KERN_DEVICE_ENOCUDA ? "not built with CUDA" : name);
    jstr(cu, "error", err);
  }
  cJSON *arr = jarr(cu, "devices");
  for (int i = 0; i < n && i < ENV_MAX_CUDA; i++) {
    const struct kern_device_info *d = &devs[i];
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
    cJSON *o = jpush(arr);
    jnum(o, "index", d->index);
    jstr(o, "name", d->name);
    jstr(o, "compute_capability", cc);
    jnum(o, "memory_bytes", (double)d->total_mem);
    jnum(o, "sms", d->sm_count);
    jnum(o, "clock_khz", d->clock_khz);
  }
  free(devs);
}

/* The CUDA code this build has: the ops with a CUDA twin (kernels/backend.h),
 * the node op groups with a CUDA entry (runtime/node/backend.h), and whether
 * nodes can run on CUDA here (rt_cuda_ready) or why not. */
static void gather_cuda_kernels(cJSON *root) {
  cJSON *k = jobj(root, "cuda_kernels");
  cJSON *ops = jarr(k, "ops");
  for (int id = 0; id < OP_COUNT; id++)
    if (kern_backend_cuda.run[id]) CEDAR_ASSERT(cJSON_AddItemToArray(ops, jcheck(cJSON_CreateString(op_name(id)), "op")));
  jnum(k, "ops_total", OP_COUNT);
  cJSON *groups = jarr(k, "op_groups");
  for (int op = 0; op < GRAPH_OP_COUNT; op++)
    if (rt_backend_cuda.run[op])
      CEDAR_ASSERT(cJSON_AddItemToArray(groups, jcheck(cJSON_CreateString(graph_op_name(op)), "group")));
  jnum(k, "op_groups_total", GRAPH_OP_COUNT);
  char why[768] = "";
  bool ready = rt_cuda_ready(why, sizeof why) == 0;
  jbool(k, "runs_nodes", ready);
  if (!ready) jstr(k, "why_not", why);
}

/* ---------------------------------------------------------------------------
 * Text form. */

static const char *human_bytes(double b, char *buf, size_t n) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, u++;
  snprintf(buf, n, b == (long long)b ? "%.0f %s" : "%.1f %s", b, unit[u]);
  return buf;
}

static void print_caches(const cJSON *topo, const char *key, const char *label) {
  const cJSON *it;
  char hb[32];
  printf("  %-9s", label);
  int any = 0;
  cJSON_ArrayForEach(it, jget(topo, key)) {
    printf("%s%.0f x %s", any++ ? ", " : " ", jget_num(it, "count"),
           human_bytes(jget_num(it, "bytes"), hb, sizeof hb));
  }
  printf("%s\n", any ? "" : " none reported");
}

static void print_libraries(const cJSON *lib) {
  const cJSON *sp = jget(lib, "starpu"), *hw = jget(lib, "hwloc"), *b = jget(lib, "openblas");
  const cJSON *cu = jget(lib, "cuda");
  printf("libraries:\n");
  printf("  %-9s %s (at most %.0f CPU workers, %s CUDA)\n", "StarPU", jget_str(sp, "version"),
         jget_num(sp, "max_cpu_workers"), cJSON_IsTrue(jget(sp, "cuda")) ? "with" : "without");
  printf("  %-9s %s (API %s at run time, %s at compile time)\n", "hwloc",
         jget_str(hw, "version") ? jget_str(hw, "version") : "version unknown",
         jget_str(hw, "api_runtime"), jget_str(hw, "api_compiled"));
  printf("  %-9s %s\n", "libyaml", jget_str(jget(lib, "libyaml"), "version"));
  printf("  %-9s %s\n", "cJSON", jget_str(jget(lib, "cjson"), "version"));
  printf("  %-9s %s; core %s; %.0f threads\n", "OpenBLAS", jget_str(b, "config"),
         jget_str(b, "core"), jget_num(b, "threads"));
  const cJSON *k = jget(lib, "cedar_kernels"), *lv;
  printf("  %-9s cedar's CPU kernels at %s (CEDAR_ISA; this CPU:", "ISA", jget_str(k, "isa"));
  cJSON_ArrayForEach(lv, jget(k, "supported")) printf(" %s", lv->valuestring);
  printf(")\n");
  if (jget_str(cu, "runtime"))
    printf("  %-9s runtime %s, driver %s\n", "CUDA", jget_str(cu, "runtime"),
           jget_str(cu, "driver"));
  else
    printf("  %-9s %s\n", "CUDA", jget_str(cu, "error"));
}

static void print_topology(const cJSON *t) {
  char hb[32];
  printf("topology (hwloc):\n");
  if (jget_str(t, "error")) {
    printf("  error: %s\n", jget_str(t, "error"));
    return;
  }
  double np = jget_num(t, "packages"), nc = jget_num(t, "cores"), npu = jget_num(t, "pus");
  double nn = jget_num(t, "numa_nodes");
  printf("  %-9s %.0f package%s, %.0f core%s, %.0f PU%s, %.0f NUMA node%s, %s memory\n",
         "machine", np, np == 1 ? "" : "s", nc, nc == 1 ? "" : "s", npu, npu == 1 ? "" : "s", nn,
         nn == 1 ? "" : "s", human_bytes(jget_num(t, "memory_bytes"), hb, sizeof hb));
  if (jget_str(t, "cpu_model")) printf("  %-9s %s\n", "CPU", jget_str(t, "cpu_model"));
  print_caches(t, "l3", "L3");
  print_caches(t, "l2", "L2");
}

static void print_starpu(const cJSON *sp) {
  const cJSON *it, *envj = jget(sp, "environment");
  printf("StarPU workers (starpu_init with the default conf");
  cJSON_ArrayForEach(it, envj) printf(", %s=%s", it->string, it->valuestring);
  if (jget_str(sp, "error")) {
    printf("):\n  error: %s\n", jget_str(sp, "error"));
    return;
  }
  printf("; scheduler %s):\n", jget_str(sp, "scheduler"));
  cJSON_ArrayForEach(it, jget(sp, "workers")) {
    const cJSON *pu = jget(it, "bound_to");
    printf("  %2.0f  %-6s %-20s", jget_num(it, "id"), jget_str(it, "type"), jget_str(it, "name"));
    if (pu)
      printf(" bound to %s L#%.0f (P#%.0f)", jget_str(pu, "type"), jget_num(pu, "logical"),
             jget_num(pu, "os"));
    printf("\n");
  }
}

static void print_cuda_kernels(const cJSON *k) {
  const cJSON *it;
  printf("CUDA kernels: %d of %.0f ops", cJSON_GetArraySize(jget(k, "ops")), jget_num(k, "ops_total"));
  int i = 0;
  cJSON_ArrayForEach(it, jget(k, "ops")) printf("%s%s", i++ ? ", " : " (", it->valuestring);
  printf("%s; %d of %.0f node op groups", i ? ")" : "", cJSON_GetArraySize(jget(k, "op_groups")),
         jget_num(k, "op_groups_total"));
  i = 0;
  cJSON_ArrayForEach(it, jget(k, "op_groups")) printf("%s%s", i++ ? ", " : " (", it->valuestring);
  printf("%s\n", i ? ")" : "");
  if (cJSON_IsTrue(jget(k, "runs_nodes")))
    printf("  nodes run on CUDA here (cedar run --device cuda)\n");
  else
    printf("  nodes do not run on CUDA here: %s\n", jget_str(k, "why_not"));
}

static void print_cuda(const cJSON *cu) {
  const cJSON *it;
  char hb[32];
  printf("CUDA devices:\n");
  if (jget_str(cu, "error")) {
    printf("  none: %s\n", jget_str(cu, "error"));
    return;
  }
  if (jget_num(cu, "count") == 0) printf("  none: the CUDA runtime reports 0 devices\n");
  cJSON_ArrayForEach(it, jget(cu, "devices")) {
    printf("  %.0f  %s, compute capability %s, %s, %.0f SMs, %.0f MHz\n", jget_num(it, "index"),
           jget_str(it, "name"), jget_str(it, "compute_capability"),
           human_bytes(jget_num(it, "memory_bytes"), hb, sizeof hb), jget_num(it, "sms"),
           jget_num(it, "clock_khz") / 1000);
  }
}

/* ---------------------------------------------------------------------------
 * The command. */

static void usage(FILE *f) {
  fprintf(f,
          "usage: cedar env [--json]\n"
          "\n"
          "Show the cedar version, library versions (StarPU, hwloc, libyaml, cJSON, OpenBLAS,\n"
          "CUDA), the CPU topology, the StarPU workers cedar would start and the CUDA devices\n"
          "(or why there are none), with the CUDA kernels and node op groups this build has.\n"
          "Starts and stops StarPU once; runs no tasks.\n"
          "\n"
          "options:\n"
          "  --json    print one JSON object instead of text\n"
          "  --help    this message\n"
          "\n"
          "StarPU reads its usual variables (STARPU_NCPU, STARPU_SCHED, ...); hwloc reads\n"
          "HWLOC_COMPONENTS (use HWLOC_COMPONENTS=-pci under ASan or valgrind).\n");
}

int cmd_env(int argc, char **argv) {
  static const struct option opts[] = {
      {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
  bool json = false;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'j': json = true; break;
    case 'h': usage(stdout); return 0;
    default: return cli_usage_error("env", "unknown option");
    }
  }
  if (optind < argc) return cli_usage_error("env", "unexpected argument '%s'", argv[optind]);

  cJSON *root = jcheck(cJSON_CreateObject(), "root");
  jstr(jobj(root, "cedar"), "version", CEDAR_VERSION);
  gather_versions(root);
  int failed = gather_topology(root);
  failed |= gather_starpu(root);
  gather_cuda_devices(root);
  gather_cuda_kernels(root);

  if (json) {
    char *s = cJSON_Print(root);
    CEDAR_ASSERT_MSG(s != NULL, "cJSON_Print: out of memory");
    printf("%s\n", s);
    cJSON_free(s);
  } else {
    printf("cedar %s\n", CEDAR_VERSION);
    print_libraries(jget(root, "libraries"));
    print_topology(jget(root, "topology"));
    print_starpu(jget(root, "starpu"));
    print_cuda(jget(root, "cuda_devices"));
    print_cuda_kernels(jget(root, "cuda_kernels"));
  }
  cJSON_Delete(root);
  return failed ? 1 : 0;
}
