/* harness.h: the shared op-test harness (STYLE.md 7). Every op test
 * (tests/test_ops_<family>.c) builds on it:
 *
 *   - h_alloc/h_check: outputs live between sentinel bytes; a write outside
 *     the documented range fails the test;
 *   - h_fill: seeded random inputs, never zero, in a chosen range;
 *   - h_finite: the NaN/Inf check that runs before any comparison;
 *   - h_close: compare an fp32 result with a float64 reference under a
 *     tolerance derived from the reduction, not tuned: for a sum of K terms
 *     computed in fp32, |got - ref| <= gamma(K) * sum|terms| with
 *     gamma(K) = K*u / (1 - K*u), u = 2^-24 (Higham, Accuracy and Stability
 *     of Numerical Algorithms, 3.1), plus `extra` ulps of |ref| for what the
 *     op does after the sum (a division, a sqrt, an exp: each adds <= 1-2 u
 *     relative; the caller says how many and why);
 *   - EXPECT / h_report: count failures, print each, exit non-zero.
 *
 * A test that prints its verdict and returns 0 anyway is a defect: use
 * h_report() as main's return value.
 */
#ifndef CEDAR_TESTS_HARNESS_H
#define CEDAR_TESTS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <inttypes.h>
#include <stdio.h>

extern int h_failures;

#define EXPECT(cond, ...)                                          \
  do {                                                             \
    if (!(cond)) {                                                 \
      h_failures++;                                                \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);         \
      fprintf(stderr, __VA_ARGS__);                                \
      fputc('\n', stderr);                                         \
    }                                                              \
  } while (0)

/* EXPECT got == want for integers (as int64); the trailing arguments are a
 * printf format and its values saying which case failed. */
#define EXPECT_EQ(got, want, ...)                                             \
  do {                                                                        \
    int64_t _g = (int64_t)(got), _w = (int64_t)(want);                        \
    if (_g != _w) {                                                           \
      char _m[1024];                                                          \
      snprintf(_m, sizeof _m, __VA_ARGS__);                                   \
      EXPECT(0, "%s = %" PRId64 ", want %" PRId64 " (%s)", #got, _g, _w, _m); \
    }                                                                         \
  } while (0)

#define H_U32 (1.0 / 16777216.0) /* unit roundoff of fp32, 2^-24 */

/* gamma(K) = K u / (1 - K u): the relative bound of a K-term fp32 sum. */
double h_gamma(double k);

/* A float buffer of n elements with 64 sentinel bytes on each side. */
float *h_alloc(size_t n);
/* true when both sentinels are intact; frees nothing. */
bool h_sentinels_ok(const float *buf, size_t n);
/* Check sentinels (EXPECT) and free. */
void h_free(float *buf, size_t n, const char *what);
/* Same for raw bytes. */
uint8_t *h_alloc_bytes(size_t n);
void h_free_bytes(uint8_t *buf, size_t n, const char *what);

/* Seeded uniform values in [lo, hi] with |x| >= 1e-3 * max(|lo|, |hi|) (never zero). */
void h_fill(float *x, size_t n, uint64_t *seed, float lo, float hi);
/* A uniform double in [0, 1). */
double h_uniform(uint64_t *seed);

/* EXPECT that all n values are finite. Returns true when they are. */
bool h_finite(const float *x, size_t n, const char *what);

/* Compare got[i] with ref[i]: |got - ref| <= h_gamma(k) * absref[i]
 * + extra_ulps * u * |ref[i]| + abs_floor. absref[i] = sum of |terms| of the
 * reduction that produced element i (pass NULL to use |ref[i]|).
 * Reports the worst element on failure; returns true when all pass. */
bool h_close(const float *got, const double *ref, const double *absref, size_t n, double k, double extra_ulps,
             double abs_floor, const char *what);

/* EXPECT |got[i] - ref[i]| <= bound[i] for every element (NaN/Inf first);
 * reports the worst element. For ops whose bound is derived per element. */
bool h_within(const float *got, const double *ref, const double *bound, size_t n, const char *what);

/* float64 references that carry an error bound beside each value (see
 * harness.c): y (n, out) = x W^T; RMSNorm rows (in place allowed); RoPE of
 * (n, heads * r->dim) rows in place. xb may be NULL for exact inputs. */
struct op_rope;
void h_ref_linear(double *y, double *yb, const float *W, const double *x, const double *xb, int n, int in, int out);
void h_ref_rmsnorm(double *y, double *yb, const double *x, const double *xb, const float *gamma, int n, int d,
                   float eps);
void h_ref_rope(double *x, double *xb, const struct op_rope *r, const int64_t *pos, int n, int heads);

/* Print a summary and return main's exit status (0 or 1). */
int h_report(const char *suite);

/* Load a plan file into *p; on failure print its diagnostics, count a
 * failure naming the file and return false (nothing to free). */
struct plan;
bool h_load_plan(const char *path, struct plan *p);

/* Buffers a test hands to op_io by pointer, kept until h_kept_free() frees
 * them all (one check's inputs). h_keep aborts on NULL (out of memory) or
 * past H_KEEP_MAX buffers, so nothing leaks unseen. */
#define H_KEEP_MAX 256
void *h_keep(void *p);
void h_kept_free(void);
/* n seeded floats in [lo, hi] (h_fill), or bytes zeroed, kept. */
float *h_kept_floats(size_t n, uint64_t *seed, float lo, float hi);
void *h_kept_zeros(size_t bytes);

/* ---- a memory-backed op_io (ops/registry.h), for descriptor tests -------- */

#include "ops/op_io_mem.h"
#include "ops/registry.h"

/* The tests' call is ops/op_io_mem.h's struct under its older name, so its
 * fields (in[], in_name[], n_param, error, ...) are the ones the descriptor
 * tests break on purpose; the h_io_* calls below wrap op_io_mem_* and count
 * a failure where the table is full. */
#define h_io op_io_mem
#define H_IO_MAX OP_IO_MEM_MAX

/* Start an empty call. */
void h_io_init(struct h_io *h);
/* Add an input (the data is borrowed) or a parameter (a repeated name
 * replaces the earlier value). */
void h_io_input(struct h_io *h, const char *name, enum op_dtype dtype, int ndim, const int64_t *shape, void *data);
void h_io_param(struct h_io *h, const char *name, double value);
/* Run `name` through the registry; returns the op's status. */
int h_io_run(struct h_io *h, const char *name);
/* The output called `name` (NULL if the op made none). */
const struct op_tensor *h_io_output(const struct h_io *h, const char *name);
/* Free the outputs (inputs and parameters stay for another run). */
void h_io_free(struct h_io *h);

#endif
