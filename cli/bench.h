/* bench.h: the measuring half of `cedar bench ops` (the other half:
 * cli/cmd_bench.c, the options, and cli/bench_ops.c, the op cases).
 *
 * What it is: a timing loop (warm-up, then best and median of N samples on
 * CLOCK_MONOTONIC), this machine's peaks measured in the same run (a one-
 * thread OpenBLAS sgemm in FLOP/s, a large memcpy in bytes/s counting read
 * plus write), the roofline floor of a call from its FLOP and byte counts,
 * and the table / JSON report.
 *
 * What it is not: a test. Timings on these VMs are noisy; nothing here
 * asserts one. Ratios to peaks measured in the same process are the result.
 * Test: tests/cli/bench.sh (ctest -R cli_bench) checks the report's shape.
 */
#ifndef CEDAR_BENCH_H
#define CEDAR_BENCH_H

#include <cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ops/kvview.h"

#define BENCH_MAX_REPS 1000
/* A sample lasts at least this long: calls faster than it are repeated
 * inside one sample and the sample divided by the count. */
#define BENCH_MIN_SAMPLE_S 2e-4

/* One row's timing loop. Use as
 *   struct bench_loop l;
 *   for (bench_loop_start(&l, reps, budget_s); bench_loop_next(&l);) call();
 * The first call is a warm-up (untimed; it also sets calls per sample).
 * The loop ends after `reps` samples, or earlier once at least one sample
 * was taken and the samples add up to budget_s seconds. */
struct bench_loop {
  int reps, inner;  /* samples wanted; calls per sample */
  int done, call;   /* samples taken; calls made in this sample (-1, -2: warm-up) */
  double t0, spent, budget_s;
  double sample[BENCH_MAX_REPS]; /* seconds per call, one per sample */
};

void bench_loop_start(struct bench_loop *l, int reps, double budget_s);
bool bench_loop_next(struct bench_loop *l);

/* Seconds on CLOCK_MONOTONIC. */
double bench_now(void);

/* This machine's peaks, measured once per run. */
struct bench_peaks {
  int gemm_n;            /* square sgemm size: n x n x n */
  double gemm_s;         /* best time of one sgemm */
  double gemm_flops;     /* 2 n^3 / gemm_s, FLOP/s */
  size_t copy_bytes;     /* bytes one memcpy copies */
  double copy_s;         /* best time of one memcpy */
  double bw;             /* 2 copy_bytes / copy_s: read + write, bytes/s */
};

/* One thread (op_blas_init must have run). Takes about a second. */
void bench_measure_peaks(struct bench_peaks *p, int reps);

/* One measured row of the report. */
struct bench_row {
  char name[32];   /* the op case, e.g. "rmsnorm" */
  char shape[112]; /* the call shape, e.g. "n=512 d=256" */
  int reps, inner; /* samples taken; calls per sample */
  double best_s, median_s;
  double flops, bytes; /* per call, counted from the shapes (bench_ops.c says how) */
  double gemm_s;       /* GEMM-shaped ops: best time of their op_linear calls alone, same
                          shapes, same run; 0 = not measured */
};

void bench_row_set(struct bench_row *r, const char *name, const char *shape, double flops, double bytes,
                   const struct bench_loop *l);

/* The best time of a loop's samples (seconds per call). */
double bench_loop_best(const struct bench_loop *l);

/* max(flops / peak sgemm, bytes / peak bandwidth): the time no call of this
 * size can beat on this machine, one thread. */
double bench_floor_s(const struct bench_peaks *p, double flops, double bytes);

/* What the report prints beside the rows. */
struct bench_meta {
  const char *plan_name, *plan_file;
  int chunk;             /* positions of a prefill chunk row */
  int scan_chunk;        /* queries of the chunk rows of the scalar scans (indexer, reindex, attention) */
  const char *notes[16]; /* bounds applied, one sentence each; NULL-terminated */
};

void bench_print_table(FILE *f, const struct bench_meta *m, const struct bench_peaks *p,
                       const struct bench_row *rows, int n);
/* The same as one JSON object (caller frees with cJSON_Delete). */
cJSON *bench_json(const struct bench_meta *m, const struct bench_peaks *p, const struct bench_row *rows, int n);

/* ---- inputs -------------------------------------------------------------- */

/* malloc that prints what failed and exits 1: the bench's sizes come from
 * the plan and are bounded (bench_ops.c), so running out is reported, not
 * recovered from. */
void *bench_alloc(size_t bytes);
/* Uniform floats in [-scale, scale) from a splitmix64 state (ops/sample.h). */
void bench_fill(float *x, size_t n, float scale, uint64_t *rng);
/* bench_alloc + bench_fill. */
float *bench_rand(size_t n, double scale, uint64_t *rng);
/* n as "4K", "64K", "1M" when a multiple of 1024, else in digits; buf has 24 bytes. */
const char *bench_count_str(char *buf /* (24) */, int64_t n);
/* pos[i] = first + i. */
int64_t *bench_positions(int64_t first, int n);
/* perm[i] = i, for bench_pick. */
int32_t *bench_iota(int64_t n);
/* k distinct values of [0, n) in ascending order: a partial Fisher-Yates
 * shuffle of perm (n values, a permutation of [0, n); it stays one). */
void bench_pick(int32_t *out /* (k) */, int k, int32_t *perm /* (n) */, int64_t n, uint64_t *rng);

/* A paged global source of n committed entries, ratio 1, laid out as
 * ops/kvview.h reads it: Main KV (op_fp4) then Indexer K (op_mxfp4) in each
 * entry. 1021 distinct random entries are packed once and copied around;
 * pages of page_entries hold consecutive entries and are placed in a
 * shuffled order, as a paged pool hands them out. */
struct bench_kv {
  uint8_t *mem;
  const uint8_t **pages;
  struct op_kv_view view;
  size_t main_bytes, idx_bytes; /* the two parts of an entry */
};

void bench_kv_init(struct bench_kv *k, int64_t n, int page_entries, int main_w, struct op_kv_format main_fmt,
                   int idx_w, struct op_kv_format idx_fmt, uint64_t *rng);
void bench_kv_free(struct bench_kv *k);

/* The BLAS core in use, for every benchmark's header (issue 18): what
 * OpenBLAS reports (openblas_get_corename) and OPENBLAS_CORETYPE, which
 * forces a core (on some machines one that halves sgemm):
 * "OpenBLAS core Haswell (OPENBLAS_CORETYPE unset)". The JSON form adds
 * blas_core and openblas_coretype (null when unset) to a machine object. */
void bench_blas_core(char *buf, size_t len);
struct cJSON;
void bench_blas_json(struct cJSON *machine);

#endif
