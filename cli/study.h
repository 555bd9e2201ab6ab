/* study.h: what `cedar report` and `cedar explore` share: memory by state
 * class from `plan cost`'s accounting (SPEC 4.5's classes), one measured
 * run of a plan (`cedar run --exact-replay --json` on the direct executor,
 * in a child process of this binary, so a run that fails or runs out of
 * memory reports instead of taking the command down), its quality over a
 * text (`cedar eval --dense-ref --json`, a child too), gnuplot, and small
 * file helpers.
 *
 * Tested through tests/cli/report.sh and tests/cli/explore.sh.
 */
#ifndef CEDAR_CLI_STUDY_H
#define CEDAR_CLI_STUDY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "scheduler/plan.h"
#include "scheduler/plan_cost.h"

/* Bytes per request after c->q.tokens positions, by state class. */
struct study_mem {
  int64_t main_kv, indexer_k; /* global KV: the sources' Main-KV and Indexer-K entries */
  int64_t swa, tails;         /* SWA rings (payload + scales), compressor tails */
  int64_t total;              /* the four above (what `cedar run` holds, less pages' slack) */
  int64_t baseline;           /* global KV if every CSA2 layer owned its own (SPEC 4.5) */
};
void study_mem_of(const struct plan_cost *c, struct study_mem *m);

/* One measured run. */
struct study_run_opts {
  int64_t prompt;       /* prompt tokens: the built-in text as bytes, or ids (37 i + 11) mod vocab
                           when the plan's vocabulary is under 256 */
  int decode;           /* tokens generated; the first comes from the prefill */
  bool drift;           /* also --exact-replay */
  uint64_t max_weights; /* do not run plans whose weights exceed this (bytes) */
};
struct study_run {
  bool ok;
  char why[800];          /* when !ok: what failed */
  char cmd[512];          /* the command run, for the report */
  double prefill_s, itl_s; /* TTFT (prefill + first sample), steady inter-token latency */
  int64_t token_layers;   /* prefill */
  bool has_drift;
  double drift_rel_rms, drift_max_abs;
  bool same_top1, entries_equal;
  bool state_agrees;      /* the run's state bytes equal plan cost's for its positions */
};
/* Run `cedar run` on plan_path (loaded as p) in a child. Returns 0 when it
 * ran (r->ok), 1 with r->why otherwise. */
int study_run(const char *plan_path, const struct plan *p, const struct study_run_opts *o, struct study_run *r);

/* Quality (issue 30): `cedar eval --json --dense-ref` on plan_path in a
 * child: held-out bits per byte of a text, next-token accuracy, and the
 * agreement with the same plan's dense `ced: false` forward (top-1, KL). */
struct study_quality_opts {
  const char *text;         /* the held-out text (required) */
  const char *model;        /* a released checkpoint (--model DIR), or NULL */
  const char *weights;      /* a weights file, or NULL: synthetic (seed 0) */
  int64_t context, stride;  /* eval's windows (0: eval's defaults) */
  uint64_t max_weights;     /* as study_run_opts: synthetic weights above this are not run */
};
struct study_quality {
  bool ok;
  char why[800];
  char cmd[1024];
  int64_t tokens, bytes;
  double bits_per_byte, accuracy, agreement, kl, tokens_per_s;
  double dense_bits_per_byte; /* the dense forward's own, on the same text */
};
/* Returns 0 when it ran (q->ok), 1 with q->why otherwise. */
int study_quality_run(const char *plan_path, const struct plan *p, const struct study_quality_opts *o,
                      struct study_quality *q);
/* SIGINT, SIGTERM and SIGHUP while a study runs (issue 28 row 17): the
 * handler stops the child running now (`cedar run`, gnuplot) and no other
 * starts; the caller sees study_interrupted() != 0, cleans up (its
 * temporary directory) and calls study_reraise() to end by that signal. */
void study_trap_signals(void);
int study_interrupted(void);
void study_reraise(void);

/* Run `gnuplot SCRIPT` in dir; a script X.gp must write X.png (not empty).
 * Returns 0, or 1 with a message (gnuplot failed, or its image is missing). */
int study_gnuplot(const char *dir, const char *script, char *err, size_t err_len);
/* Whether gnuplot is on PATH. */
bool study_have_gnuplot(void);
/* mkdir -p of one level (the parent must exist). Returns 0 or 1 with a message. */
int study_mkdir(const char *dir, char *err, size_t err_len);
/* Start writing dir/name (a temporary beside it, base/file.h), with a
 * message on failure. At most 8 open at once. */
FILE *study_open(const char *dir, const char *name, char *err, size_t err_len);
/* Finish a study_open file: every write, the flush, fsync and close
 * checked, then renamed into place; on failure the temporary is removed.
 * Returns 0, or 1 with a message (ENOSPC and EFBIG by name). */
int study_close(FILE *f, char *err, size_t err_len);
/* Parse "A,B,C" of positive integers into out (at most max). Returns the count, or -1. */
int study_parse_list(const char *s, int64_t *out, int max);

#endif
