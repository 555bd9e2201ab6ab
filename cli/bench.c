/* bench.c: timing loop, machine peaks, roofline floor and the report of
 * `cedar bench ops` (see bench.h). Not a test: it never asserts a timing.
 * Test: tests/cli/bench.sh.
 */
#include "cli/bench.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops/formats.h"
#include "ops/isa.h"
#include "ops/sample.h"
#include "base/check.h"

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the timing loop ----------------------------------------------------- */

void bench_loop_start(struct bench_loop *l, int reps, double budget_s) {
  CEDAR_ASSERT(reps >= 1 && reps <= BENCH_MAX_REPS);
  l->reps = reps;
  l->inner = 1;
  l->done = 0;
  l->call = -1;
  l->spent = 0.0;
  l->budget_s = budget_s;
}

/* Called before every call; reads the clock only at the ends of a sample. */
bool bench_loop_next(struct bench_loop *l) {
  if (l->call >= 0 && ++l->call < l->inner) return true;
  double now = bench_now();
  if (l->call == -1) { /* start the warm-up call */
    l->call = -2;
    l->t0 = now;
    return true;
  }
  if (l->call == -2) { /* warm-up done: enough calls per sample to pass BENCH_MIN_SAMPLE_S */
    double w = now - l->t0;
    double k = w >= BENCH_MIN_SAMPLE_S ? 1.0 : ceil(BENCH_MIN_SAMPLE_S / (w > 1e-9 ? w : 1e-9));
    l->inner = k > 1e6 ? 1000000 : (int)k;
  } else { /* a sample ended */
    double s = now - l->t0;
    l->sample[l->done++] = s / l->inner;
    l->spent += s;
    if (l->done == l->reps || l->spent >= l->budget_s) return false;
  }
  l->call = 0;
  l->t0 = bench_now();
  return true;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_loop_best(const struct bench_loop *l) {
  CEDAR_ASSERT(l->done >= 1);
  double best = l->sample[0];
  for (int i = 1; i < l->done; i++) best = l->sample[i] < best ? l->sample[i] : best;
  return best;
}

void bench_row_set(struct bench_row *r, const char *name, const char *shape, double flops, double bytes,
                   const struct bench_loop *l) {
  double s[BENCH_MAX_REPS];
  CEDAR_ASSERT(l->done >= 1);
  memcpy(s, l->sample, (size_t)l->done * sizeof *s);
  qsort(s, (size_t)l->done, sizeof *s, cmp_double);
  snprintf(r->name, sizeof r->name, "%s", name);
  snprintf(r->shape, sizeof r->shape, "%s", shape);
  r->reps = l->done;
  r->inner = l->inner;
  r->best_s = s[0];
  r->median_s = l->done % 2 ? s[l->done / 2] : 0.5 * (s[l->done / 2 - 1] + s[l->done / 2]);
  r->flops = flops;
  r->bytes = bytes;
  r->gemm_s = 0.0;
}

/* ---- inputs ---------------------------------------------------------------- */

void *bench_alloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "cedar bench: out of memory allocating %zu bytes\n", bytes);
    exit(1);
  }
  return p;
}

void bench_fill(float *x, size_t n, float scale, uint64_t *rng) {
  for (size_t i = 0; i < n; i++) x[i] = scale * (float)(2.0 * op_rng_uniform(rng) - 1.0);
}

float *bench_rand(size_t n, double scale, uint64_t *rng) {
  float *x = bench_alloc(n * sizeof *x);
  bench_fill(x, n, (float)scale, rng);
  return x;
}

const char *bench_count_str(char *buf, int64_t n) {
  if (n != 0 && n % (1 << 20) == 0) snprintf(buf, 24, "%lldM", (long long)(n >> 20));
  else if (n != 0 && n % 1024 == 0) snprintf(buf, 24, "%lldK", (long long)(n >> 10));
  else snprintf(buf, 24, "%lld", (long long)n);
  return buf;
}

int64_t *bench_positions(int64_t first, int n) {
  int64_t *pos = bench_alloc((size_t)n * sizeof *pos);
  for (int i = 0; i < n; i++) pos[i] = first + i;
  return pos;
}

int32_t *bench_iota(int64_t n) {
  int32_t *p = bench_alloc((size_t)n * sizeof *p);
  for (int64_t i = 0; i < n; i++) p[i] = (int32_t)i;
  return p;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

void bench_pick(int32_t *out, int k, int32_t *perm, int64_t n, uint64_t *rng) {
  CEDAR_ASSERT(k <= n);
  for (int i = 0; i < k; i++) {
    int64_t j = i + (int64_t)(op_rng_next(rng) % (uint64_t)(n - i));
    int32_t t = perm[i];
    perm[i] = perm[j], perm[j] = t;
    out[i] = perm[i];
  }
  qsort(out, (size_t)k, sizeof *out, cmp_i32);
}

void bench_kv_init(struct bench_kv *k, int64_t n, int page_entries, int main_w, struct op_kv_format main_fmt,
                   int idx_w, struct op_kv_format idx_fmt, uint64_t *rng) {
  const int P = 1021, pe = page_entries;
  k->main_bytes = op_kv_bytes(&main_fmt, main_w);
  k->idx_bytes = op_kv_bytes(&idx_fmt, idx_w);
  CEDAR_ASSERT(k->main_bytes > 0 && k->idx_bytes > 0 && pe >= 1);
  const size_t eb = k->main_bytes + k->idx_bytes, page_bytes = (size_t)pe * eb;
  const int64_t n_pages = (n + pe - 1) / pe;
  k->mem = bench_alloc((size_t)n_pages * page_bytes);
  uint8_t *pat = bench_alloc((size_t)P * eb);
  float *x = bench_alloc(((size_t)main_w + idx_w) * sizeof *x);
  for (int e = 0; e < P; e++) {
    bench_fill(x, (size_t)main_w + idx_w, 2.0f, rng);
    op_kv_pack(&main_fmt, pat + e * eb, x, main_w);
    op_kv_pack(&idx_fmt, pat + e * eb + k->main_bytes, x + main_w, idx_w);
  }
  for (size_t e = 0; e < (size_t)n_pages * pe; e++) memcpy(k->mem + e * eb, pat + (e % P) * eb, eb);
  int32_t *perm = bench_iota(n_pages);
  for (int64_t i = n_pages - 1; i > 0; i--) { /* Fisher-Yates */
    int64_t j = (int64_t)(op_rng_next(rng) % (uint64_t)(i + 1));
    int32_t t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  k->pages = bench_alloc((size_t)n_pages * sizeof *k->pages);
  for (int64_t i = 0; i < n_pages; i++) k->pages[i] = k->mem + (size_t)perm[i] * page_bytes;
  k->view = (struct op_kv_view){.pages = k->pages, .page_entries = pe, .entry_bytes = eb, .main_off = 0,
                                .idx_off = k->main_bytes, .n_entries = n, .ratio = 1, .main_w = main_w,
                                .idx_w = idx_w, .main_fmt = main_fmt, .idx_fmt = idx_fmt};
  free(pat), free(x), free(perm);
}

void bench_kv_free(struct bench_kv *k) {
  free(k->mem);
  free((void *)k->pages);
  memset(k, 0, sizeof *k);
}

/* ---- peaks ----------------------------------------------------------------- */

/* sgemm C = A B^T on square n x n matrices, the form op_linear calls. */
static void peak_gemm(struct bench_peaks *p, int reps) {
  const int n = 1024;
  size_t nn = (size_t)n * n;
  float *a = bench_alloc(3 * nn * sizeof *a), *b = a + nn, *c = b + nn;
  uint64_t rng = 1;
  bench_fill(a, 2 * nn, 1.0f, &rng);
  struct bench_loop l;
  for (bench_loop_start(&l, reps, 2.0); bench_loop_next(&l);)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  struct bench_row r;
  bench_row_set(&r, "sgemm", "", 0, 0, &l);
  p->gemm_n = n;
  p->gemm_s = r.best_s;
  p->gemm_flops = 2.0 * n * (double)nn / r.best_s;
  free(a);
}

/* memcpy of 256 MiB, far past any cache; both buffers are touched first so
 * page faults stay out of the timing. */
static void peak_copy(struct bench_peaks *p, int reps) {
  const size_t bytes = (size_t)256 << 20;
  char *src = bench_alloc(bytes), *dst = bench_alloc(bytes);
  memset(src, 1, bytes);
  memset(dst, 2, bytes);
  struct bench_loop l;
  for (bench_loop_start(&l, reps, 2.0); bench_loop_next(&l);) {
    memcpy(dst, src, bytes);
    /* dst is never read: without this barrier GCC removes the copy as a dead
     * store (it did, at -O3, once the buffers came from an inlined malloc). */
    __asm__ volatile("" : : "r"(dst) : "memory");
  }
  struct bench_row r;
  bench_row_set(&r, "memcpy", "", 0, 0, &l);
  p->copy_bytes = bytes;
  p->copy_s = r.best_s;
  p->bw = 2.0 * (double)bytes / r.best_s;
  free(src);
  free(dst);
}

void bench_measure_peaks(struct bench_peaks *p, int reps) {
  peak_gemm(p, reps);
  peak_copy(p, reps);
}

double bench_floor_s(const struct bench_peaks *p, double flops, double bytes) {
  double tc = flops / p->gemm_flops, tm = bytes / p->bw;
  return tc > tm ? tc : tm;
}

/* ---- the report -------------------------------------------------------------- */

/* The first "model name" of /proc/cpuinfo, or "unknown". */
static void cpu_model(char *out, size_t cap) {
  snprintf(out, cap, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) || !colon) continue;
    colon += 1 + (colon[1] == ' ');
    colon[strcspn(colon, "\n")] = 0;
    snprintf(out, cap, "%s", colon);
    break;
  }
  fclose(f);
}

/* Derived columns of a row. */
struct derived {
  double gflops, gbs, floor_s, ratio, mem_ratio;
  const char *bound;
};

static struct derived derive(const struct bench_peaks *p, const struct bench_row *r) {
  struct derived d;
  d.gflops = r->flops / r->best_s * 1e-9;
  d.gbs = r->bytes / r->best_s * 1e-9;
  d.floor_s = bench_floor_s(p, r->flops, r->bytes);
  d.bound = r->flops / p->gemm_flops >= r->bytes / p->bw ? "compute" : "memory";
  d.ratio = r->best_s / d.floor_s;
  d.mem_ratio = r->bytes > 0 ? r->best_s / (r->bytes / p->bw) : 0.0;
  return d;
}

void bench_print_table(FILE *f, const struct bench_meta *m, const struct bench_peaks *p,
                       const struct bench_row *rows, int n) {
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  fprintf(f, "plan %s (%s): chunk rows n=%d positions, S=%d queries for indexer_scan, reindex, sparse_attn\n",
          m->plan_name, m->plan_file, m->chunk, m->scan_chunk);
  char core[128];
  bench_blas_core(core, sizeof core);
  fprintf(f, "machine: %ld CPUs online, %s; BLAS %s on 1 thread; cedar's kernels at %s (CEDAR_ISA)\n",
          sysconf(_SC_NPROCESSORS_ONLN), cpu, core, op_isa_name(op_isa()));
  fprintf(f, "peak sgemm %dx%dx%d: %.1f GFLOP/s (best %.2f ms)\n", p->gemm_n, p->gemm_n, p->gemm_n,
          p->gemm_flops * 1e-9, p->gemm_s * 1e3);
  fprintf(f, "peak memcpy %zu MiB: %.1f GB/s counting read + write (best %.2f ms)\n", p->copy_bytes >> 20,
          p->bw * 1e-9, p->copy_s * 1e3);
  for (int i = 0; m->notes[i]; i++) fprintf(f, "bound: %s\n", m->notes[i]);
  fprintf(f, "\n%-14s %-50s %4s %10s %10s %8s %7s %10s %-4s %7s %7s %7s\n", "op", "shape", "reps", "best ms",
          "median ms", "GFLOP/s", "GB/s", "floor ms", "by", "x floor", "x mem", "x gemm");
  for (int i = 0; i < n; i++) {
    const struct bench_row *r = &rows[i];
    struct derived d = derive(p, r);
    char xg[16] = "      -";
    if (r->gemm_s > 0) snprintf(xg, sizeof xg, "%7.2f", r->best_s / r->gemm_s);
    fprintf(f, "%-14s %-50s %4d %10.4f %10.4f %8.2f %7.2f %10.4f %-4s %7.2f %7.2f %s\n", r->name, r->shape, r->reps,
            r->best_s * 1e3, r->median_s * 1e3, d.gflops, d.gbs, d.floor_s * 1e3, d.bound[0] == 'c' ? "C" : "M",
            d.ratio, d.mem_ratio, xg);
  }
  fprintf(f, "\nby: the floor's bound, C compute (flops / peak sgemm) or M memory (bytes / peak memcpy).\n"
             "x floor = best / floor; x mem = best / (bytes / peak memcpy). Best and median are per call.\n"
             "x gemm (GEMM-shaped ops) = best / the best time of the op's own op_linear calls alone, at the\n"
             "same shapes, timed in the same run: what the op adds around its GEMMs.\n");
}

static cJSON *json_peaks(const struct bench_peaks *p) {
  cJSON *o = cJSON_CreateObject(), *g = cJSON_AddObjectToObject(o, "sgemm"), *c = cJSON_AddObjectToObject(o, "memcpy");
  cJSON_AddNumberToObject(g, "m", p->gemm_n);
  cJSON_AddNumberToObject(g, "n", p->gemm_n);
  cJSON_AddNumberToObject(g, "k", p->gemm_n);
  cJSON_AddNumberToObject(g, "threads", 1);
  cJSON_AddNumberToObject(g, "best_s", p->gemm_s);
  cJSON_AddNumberToObject(g, "gflops", p->gemm_flops * 1e-9);
  cJSON_AddNumberToObject(c, "bytes", (double)p->copy_bytes);
  cJSON_AddStringToObject(c, "counted", "read+write");
  cJSON_AddNumberToObject(c, "best_s", p->copy_s);
  cJSON_AddNumberToObject(c, "gbs", p->bw * 1e-9);
  return o;
}

static cJSON *json_row(const struct bench_peaks *p, const struct bench_row *r) {
  struct derived d = derive(p, r);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", r->name);
  cJSON_AddStringToObject(o, "shape", r->shape);
  cJSON_AddNumberToObject(o, "reps", r->reps);
  cJSON_AddNumberToObject(o, "calls_per_rep", r->inner);
  cJSON_AddNumberToObject(o, "best_s", r->best_s);
  cJSON_AddNumberToObject(o, "median_s", r->median_s);
  cJSON_AddNumberToObject(o, "flops", r->flops);
  cJSON_AddNumberToObject(o, "bytes", r->bytes);
  cJSON_AddNumberToObject(o, "gflops", d.gflops);
  cJSON_AddNumberToObject(o, "gbs", d.gbs);
  cJSON_AddNumberToObject(o, "floor_s", d.floor_s);
  cJSON_AddStringToObject(o, "bound", d.bound);
  cJSON_AddNumberToObject(o, "ratio", d.ratio);
  cJSON_AddNumberToObject(o, "mem_ratio", d.mem_ratio);
  if (r->gemm_s > 0) {
    cJSON_AddNumberToObject(o, "gemm_s", r->gemm_s);
    cJSON_AddNumberToObject(o, "gemm_ratio", r->best_s / r->gemm_s);
  }
  return o;
}

cJSON *bench_json(const struct bench_meta *m, const struct bench_peaks *p, const struct bench_row *rows, int n) {
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  cJSON *o = cJSON_CreateObject(), *mach = cJSON_AddObjectToObject(o, "machine");
  cJSON_AddStringToObject(o, "plan", m->plan_name);
  cJSON_AddStringToObject(o, "plan_file", m->plan_file);
  cJSON_AddNumberToObject(o, "chunk", m->chunk);
  cJSON_AddNumberToObject(o, "scan_chunk", m->scan_chunk);
  cJSON_AddNumberToObject(mach, "nproc", (double)sysconf(_SC_NPROCESSORS_ONLN));
  cJSON_AddStringToObject(mach, "cpu", cpu);
  cJSON_AddStringToObject(mach, "isa", op_isa_name(op_isa()));
  bench_blas_json(mach);
  cJSON_AddItemToObject(o, "peaks", json_peaks(p));
  cJSON *notes = cJSON_AddArrayToObject(o, "bounds"), *ops = cJSON_AddArrayToObject(o, "ops");
  for (int i = 0; m->notes[i]; i++) cJSON_AddItemToArray(notes, cJSON_CreateString(m->notes[i]));
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(ops, json_row(p, &rows[i]));
  return o;
}

void bench_blas_core(char *buf, size_t len) {
  const char *env = getenv("OPENBLAS_CORETYPE");
  snprintf(buf, len, "OpenBLAS core %s (OPENBLAS_CORETYPE%s%s)", openblas_get_corename(), env ? "=" : " unset",
           env ? env : "");
}

void bench_blas_json(cJSON *machine) {
  const char *env = getenv("OPENBLAS_CORETYPE");
  cJSON_AddStringToObject(machine, "blas_core", openblas_get_corename());
  if (env)
    cJSON_AddStringToObject(machine, "openblas_coretype", env);
  else
    cJSON_AddNullToObject(machine, "openblas_coretype");
}
