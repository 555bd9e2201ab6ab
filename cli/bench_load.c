/* bench_load.c: `cedar bench model --model DIR`'s load figures: the time to
 * open a released-layout checkpoint (map, check, verify hashes, dequantize:
 * runtime/checkpoint.h) against a plain read() of the same files in the same
 * run, both from a warm page cache (the files are read once before either is
 * timed), and the process's RSS growth against the weights' bytes (files on
 * disk, and dequantized F32 in memory). Nothing is asserted; docs/PERF.md
 * records runs with their command.
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
#include "cli/bench_load.h"
#include "cli/cli.h"
#include "runtime/checkpoint.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

int bench_load(const char *dir, const char *plan_path, int repeat, bool json) {
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
  double t_read = 1e30, t_load = 1e30;
  uint64_t bytes = 0, rss_grow = 0, weights_bytes = 0;
  struct ckpt_load_stats st = {0};
  int rc = 0;
  for (int r = 0; r < repeat && !rc; r++) {
    double t0 = now_s();
    bytes = read_all(dir);
    double t1 = now_s();
    uint64_t rss0 = rss_bytes();
    struct weights w;
    double t2 = now_s();
    rc = ckpt_load(&w, &p, dir, true, NULL, &st, err, sizeof err);
    double t3 = now_s();
    if (rc) {
      fprintf(stderr, "cedar bench model: %s\n", err);
      break;
    }
    rss_grow = rss_bytes() - rss0;
    weights_bytes = w.list.total_bytes;
    weights_free(&w);
    if (t1 - t0 < t_read) t_read = t1 - t0;
    if (t3 - t2 < t_load) t_load = t3 - t2;
  }
  if (!rc && json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", dir);
    cJSON_AddStringToObject(j, "plan", p.name);
    cJSON_AddNumberToObject(j, "file_bytes", (double)bytes);
    cJSON_AddNumberToObject(j, "read_s", t_read);
    cJSON_AddNumberToObject(j, "load_s", t_load);
    cJSON_AddNumberToObject(j, "read_gb_s", (double)bytes / t_read / 1e9);
    cJSON_AddNumberToObject(j, "load_gb_s", (double)st.file_bytes / t_load / 1e9);
    cJSON_AddNumberToObject(j, "weights_f32_bytes", (double)weights_bytes);
    cJSON_AddNumberToObject(j, "rss_growth_bytes", (double)rss_grow);
    cJSON_AddNumberToObject(j, "in_place_bytes", (double)st.in_place_bytes);
    cJSON_AddNumberToObject(j, "dequantized_bytes", (double)st.dequant_bytes);
    cJSON_AddNumberToObject(j, "shards", (double)st.n_shards);
    cJSON_AddNumberToObject(j, "hashed", (double)st.hashed);
    cli_print_json(j);
  } else if (!rc) {
    printf("load %s (plan %s): %zu shards, %zu tensors, %.1f MB on disk, %zu content hashes verified\n", dir, p.name,
           st.n_shards, st.n_tensors, (double)st.file_bytes / 1e6, st.hashed);
    printf("  plain read() of the same files: %.3f s, %.2f GB/s (warm page cache; best of %d)\n", t_read,
           (double)bytes / t_read / 1e9, repeat);
    printf("  checkpoint load (map, check, hash, dequantize): %.3f s, %.2f GB/s of files; %.2fx the read time\n",
           t_load, (double)st.file_bytes / t_load / 1e9, t_load / t_read);
    printf("  RSS growth %.1f MB for %.1f MB of F32 weights (%.2fx) from %.1f MB of files (%.2fx); %.1f MB used in "
           "place from the mapping, %.1f MB of files dequantized\n",
           (double)rss_grow / 1e6, (double)weights_bytes / 1e6, (double)rss_grow / (double)weights_bytes,
           (double)st.file_bytes / 1e6, (double)rss_grow / (double)st.file_bytes, (double)st.in_place_bytes / 1e6,
           (double)st.dequant_bytes / 1e6);
  }
  plan_free(&p);
  return rc ? 1 : 0;
}
