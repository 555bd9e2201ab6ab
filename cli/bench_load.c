/* bench_load.c: `cedar bench model --model DIR`'s load figures: the time to
 * open a released-layout checkpoint (map, check, verify hashes, dequantize:
 * runtime/load/checkpoint.h) against a plain read() of the same files in the same
 * run, both from a warm page cache (the files are read once before either is
 * timed), and the process's RSS growth against the weights' bytes (files on
 * disk, and dequantized F32 in memory). Wall and process CPU time both:
 * on a shared machine the CPU time is the steadier figure.
 *
 * Then the choice docs/checkpoints.md records: dequantize at load, or keep
 * the released bytes and use a fused dequantizing GEMV. One decode-shaped
 * GEMV (x of one row) on a matrix larger than the caches, three ways in the
 * same run: F32 weights through op_linear (BLAS, what cedar runs), and
 * scalar fused GEMVs straight from FP8 tiles and from FP4 row groups (table
 * decode, one multiply per element: what a simple fused kernel would be).
 * Nothing is asserted; docs/PERF.md records runs with their command.
 */
#include <cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "ops/basic.h"
#include "ops/formats.h"
#include "cli/bench_load.h"
#include "cli/cli.h"
#include "runtime/load/checkpoint.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- F32 GEMV against fused dequantizing GEMVs ------------------------------------ */

#define GV_OUT 4096
#define GV_IN 4096
#define GV_REPS 8

static void gemv_fp8(float *y, const float *x, const uint8_t *q, const uint8_t *s, const float *e4, const float *e8) {
  for (int r = 0; r < GV_OUT; r++) {
    const uint8_t *qr = q + (size_t)r * GV_IN, *sr = s + (size_t)(r / 32) * (GV_IN / 32);
    float acc = 0;
    for (int t = 0; t < GV_IN / 32; t++) {
      float part = 0;
      for (int c = 0; c < 32; c++) part += e4[qr[32 * t + c]] * x[32 * t + c];
      acc += part * e8[sr[t]];
    }
    y[r] = acc;
  }
}

static void gemv_fp4(float *y, const float *x, const uint8_t *q, const uint8_t *s, const float *e2, const float *e8) {
  for (int r = 0; r < GV_OUT; r++) {
    const uint8_t *qr = q + (size_t)r * GV_IN / 2, *sr = s + (size_t)r * (GV_IN / 32);
    float acc = 0;
    for (int t = 0; t < GV_IN / 32; t++) {
      float part = 0;
      for (int c = 0; c < 16; c++) {
        uint8_t b = qr[16 * t + c];
        part += e2[b & 15] * x[32 * t + 2 * c] + e2[b >> 4] * x[32 * t + 2 * c + 1];
      }
      acc += part * e8[sr[t]];
    }
    y[r] = acc;
  }
}

struct gv_result {
  double f32_s, fp8_s, fp4_s; /* per GEMV, best of the reps */
};

static void gemv_compare(struct gv_result *g) {
  op_blas_init();
  size_t n = (size_t)GV_OUT * GV_IN;
  float *W = cedar_xmalloc(n * sizeof *W), *x = cedar_xmalloc(GV_IN * sizeof *x), *y = cedar_xmalloc(GV_OUT * sizeof *y);
  uint8_t *q8 = cedar_xmalloc(n), *s8 = cedar_xmalloc(n / 1024), *q4 = cedar_xmalloc(n / 2), *s4 = cedar_xmalloc(n / 32);
  for (size_t i = 0; i < n; i++) W[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
  for (int i = 0; i < GV_IN; i++) x[i] = (float)(i % 7) - 3.0f;
  ckpt_fp8_quant(q8, s8, W, GV_OUT, GV_IN);
  ckpt_fp4_quant(q4, s4, W, GV_OUT, GV_IN);
  float e2[16], e4[256], e8[256];
  for (int i = 0; i < 16; i++) e2[i] = op_e2m1_decode((uint8_t)i);
  for (int i = 0; i < 256; i++) e4[i] = op_e4m3_decode((uint8_t)i), e8[i] = op_e8m0_decode((uint8_t)i);
  *g = (struct gv_result){1e30, 1e30, 1e30};
  for (int r = 0; r < GV_REPS; r++) {
    double t0 = now_s();
    op_linear(y, x, W, 1, GV_IN, GV_OUT, GV_IN, GV_OUT);
    double t1 = now_s();
    gemv_fp8(y, x, q8, s8, e4, e8);
    double t2 = now_s();
    gemv_fp4(y, x, q4, s4, e2, e8);
    double t3 = now_s();
    if (t1 - t0 < g->f32_s) g->f32_s = t1 - t0;
    if (t2 - t1 < g->fp8_s) g->fp8_s = t2 - t1;
    if (t3 - t2 < g->fp4_s) g->fp4_s = t3 - t2;
  }
  free(W), free(x), free(y), free(q8), free(s8), free(q4), free(s4);
}

/* Resident set size in bytes (/proc/self/statm). */
static uint64_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long size = 0, res = 0;
  if (f) {
    if (fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
    fclose(f);
  }
  return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* read() every regular file of dir once; the bytes read. */
static uint64_t read_all(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  size_t cap = 8u << 20;
  char *buf = cedar_xmalloc(cap);
  uint64_t total = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    for (ssize_t n; (n = read(fd, buf, cap)) > 0;) total += (uint64_t)n;
    close(fd);
  }
  closedir(d);
  free(buf);
  return total;
}

int bench_load(const char *dir, const char *plan_path, int repeat, bool json, bool f32) {
  char err[1024];
  struct plan p;
  struct weights_problems pr = {0};
  if (ckpt_plan(dir, plan_path, &p, &pr, err, sizeof err)) {
    fprintf(stderr, "cedar bench model: %s\n", err);
    weights_problems_print(&pr, stderr, 20);
    weights_problems_free(&pr);
    return 1;
  }
  read_all(dir); /* warm the page cache for both */
  double t_read = 1e30, t_load = 1e30, c_read = 1e30, c_load = 1e30;
  uint64_t bytes = 0, rss_grow = 0, weights_bytes = 0;
  struct ckpt_load_stats st = {0};
  int rc = 0;
  for (int r = 0; r < repeat && !rc; r++) {
    double c0 = cpu_s(), t0 = now_s();
    bytes = read_all(dir);
    double t1 = now_s(), c1 = cpu_s();
    uint64_t rss0 = rss_bytes();
    struct weights w;
    double c2 = cpu_s(), t2 = now_s();
    rc = ckpt_load_held(&w, &p, dir, true, !f32, NULL, &st, err, sizeof err);
    double t3 = now_s(), c3 = cpu_s();
    if (rc) {
      fprintf(stderr, "cedar bench model: %s\n", err);
      break;
    }
    rss_grow = rss_bytes() - rss0;
    struct weights_resident wr;
    weights_resident(&w, &wr);
    weights_bytes = wr.total; /* as held: stored formats, or F32 with --weights-format f32 */
    weights_free(&w);
    if (t1 - t0 < t_read) t_read = t1 - t0;
    if (t3 - t2 < t_load) t_load = t3 - t2;
    if (c1 - c0 < c_read) c_read = c1 - c0;
    if (c3 - c2 < c_load) c_load = c3 - c2;
  }
  struct gv_result g;
  if (!rc) gemv_compare(&g);
  double mb = (double)GV_OUT * GV_IN / 1e6;
  if (!rc && json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", dir);
    cJSON_AddStringToObject(j, "plan", p.name);
    cJSON_AddNumberToObject(j, "file_bytes", (double)bytes);
    cJSON_AddNumberToObject(j, "read_s", t_read);
    cJSON_AddNumberToObject(j, "load_s", t_load);
    cJSON_AddNumberToObject(j, "read_gb_s", (double)bytes / t_read / 1e9);
    cJSON_AddNumberToObject(j, "load_gb_s", (double)st.file_bytes / t_load / 1e9);
    cJSON_AddNumberToObject(j, f32 ? "weights_f32_bytes" : "weights_resident_bytes", (double)weights_bytes);
    cJSON_AddNumberToObject(j, "copied_bytes", (double)st.copied_bytes);
    cJSON_AddNumberToObject(j, "rss_growth_bytes", (double)rss_grow);
    cJSON_AddNumberToObject(j, "in_place_bytes", (double)st.in_place_bytes);
    cJSON_AddNumberToObject(j, "dequantized_bytes", (double)st.dequant_bytes);
    cJSON_AddNumberToObject(j, "shards", (double)st.n_shards);
    cJSON_AddNumberToObject(j, "hashed", (double)st.hashed);
    cJSON_AddNumberToObject(j, "read_cpu_s", c_read);
    cJSON_AddNumberToObject(j, "load_cpu_s", c_load);
    cJSON_AddNumberToObject(j, "gemv_f32_s", g.f32_s);
    cJSON_AddNumberToObject(j, "gemv_fp8_fused_s", g.fp8_s);
    cJSON_AddNumberToObject(j, "gemv_fp4_fused_s", g.fp4_s);
    cli_print_json(j);
  } else if (!rc) {
    printf("load %s (plan %s): %zu shards, %zu tensors, %.1f MB on disk, %zu content hashes verified\n", dir, p.name,
           st.n_shards, st.n_tensors, (double)st.file_bytes / 1e6, st.hashed);
    printf("  plain read() of the same files: %.3f s, %.2f GB/s (warm page cache; best of %d)\n", t_read,
           (double)bytes / t_read / 1e9, repeat);
    printf("  checkpoint load (map, check, hash, %s): %.3f s, %.2f GB/s of files; %.2fx the read time\n",
           f32 ? "dequantize to F32" : "hold the stored formats", t_load, (double)st.file_bytes / t_load / 1e9,
           t_load / t_read);
    printf("  process CPU time: read %.3f s, load %.3f s (%.1fx)\n", c_read, c_load, c_load / c_read);
    printf("  RSS growth %.1f MB for %.1f MB of %s weights (%.2fx) from %.1f MB of files (%.2fx); %.1f MB used in "
           "place from the mapping, %.1f MB copied, %.1f MB of files dequantized\n",
           (double)rss_grow / 1e6, (double)weights_bytes / 1e6, f32 ? "F32" : "resident",
           (double)rss_grow / (double)weights_bytes, (double)st.file_bytes / 1e6,
           (double)rss_grow / (double)st.file_bytes, (double)st.in_place_bytes / 1e6, (double)st.copied_bytes / 1e6,
           (double)st.dequant_bytes / 1e6);
    printf("decode-shaped GEMV, %dx%d weights, one row of x, best of %d (one thread):\n", GV_OUT, GV_IN, GV_REPS);
    printf("  F32 op_linear (BLAS):   %.3f ms, %.1f MB of weights, %.2f GB/s\n", 1e3 * g.f32_s, 4 * mb,
           4 * mb / 1e3 / g.f32_s);
    printf("  fused FP8 tiles:        %.3f ms, %.1f MB, %.2f GB/s; %.2fx the F32 time\n", 1e3 * g.fp8_s,
           mb * (1 + 1.0 / 1024), mb * (1 + 1.0 / 1024) / 1e3 / g.fp8_s, g.fp8_s / g.f32_s);
    printf("  fused FP4 row groups:   %.3f ms, %.1f MB, %.2f GB/s; %.2fx the F32 time\n", 1e3 * g.fp4_s,
           mb * (0.5 + 1.0 / 32), mb * (0.5 + 1.0 / 32) / 1e3 / g.fp4_s, g.fp4_s / g.f32_s);
  }
  plan_free(&p);
  return rc ? 1 : 0;
}
