/* cmd_weights_ckpt.c: `cedar weights init --layout released`, `cedar weights
 * check DIR` and `--hash` (weights_ckpt.h). Tested by tests/cli/checkpoint.sh.
 */
#include <cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>

#include "base/check.h"
#include "cli/cli.h"
#include "cli/weights_ckpt.h"
#include "runtime/load/checkpoint.h"
#include "runtime/load/weights_finite.h"

int cli_weights_init_released(const struct plan *p, uint64_t seed, uint64_t max_bytes, const char *dir,
                          uint64_t shard_bytes, const char *dequant, bool json) {
  struct weights w;
  char err[1024];
  int rc = weights_synth(&w, p, seed, max_bytes, err, sizeof err);
  if (rc) {
    fprintf(stderr, "cedar weights init: %s\n", err);
    return 1;
  }
  rc = ckpt_write(&w, p, dir, shard_bytes, dequant, err, sizeof err);
  if (rc) fprintf(stderr, "cedar weights init: %s\n", err);
  /* read back what was written: the shard count and sizes, and proof that it loads */
  struct weights back;
  struct ckpt_load_stats st = {0};
  if (!rc && (rc = ckpt_load(&back, p, dir, true, NULL, &st, err, sizeof err)))
    fprintf(stderr, "cedar weights init: wrote %s, but it does not load back: %s\n", dir, err);
  if (!rc) weights_free(&back);
  if (!rc && json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", dir);
    cJSON_AddStringToObject(j, "layout", "released");
    cJSON_AddStringToObject(j, "plan", p->name);
    cJSON_AddNumberToObject(j, "seed", (double)seed);
    cJSON_AddNumberToObject(j, "shards", (double)st.n_shards);
    cJSON_AddNumberToObject(j, "tensors", (double)st.n_tensors);
    cJSON_AddNumberToObject(j, "bytes", (double)st.file_bytes);
    cJSON_AddNumberToObject(j, "dequantized_bytes", (double)w.list.total_bytes);
    cli_print_json(j);
  } else if (!rc) {
    printf("%s: plan %s, seed %" PRIu64 ", released layout: %zu shards, %zu tensors, %" PRIu64
           " bytes on disk (%" PRIu64 " dequantized)%s%s\n",
           dir, p->name, seed, st.n_shards, st.n_tensors, st.file_bytes, w.list.total_bytes,
           dequant ? "; dequantized values in " : "", dequant ? dequant : "");
  }
  weights_free(&w);
  return rc ? 1 : 0;
}

bool cli_weights_is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Every shard of a loaded checkpoint, value by value (weights_finite.h). */
static size_t shards_finite(const struct weights *w, struct weights_problems *pr) {
  size_t bad = 0;
  char label[4096];
  for (size_t k = 0; w->shards && k < w->shards->n; k++) {
    snprintf(label, sizeof label, "%s/%s", w->shards->dir, w->shards->names[k]);
    bad += weights_finite_check(w->shards->files[k], label, pr);
  }
  return bad;
}

int cli_weights_record_file(const char *path) {
  size_t added;
  char err[1024];
  st_file_t *f = NULL;
  if (st_open(path, &f, err, sizeof err) == 0) { /* a damaged value gets no hash: the hash would vouch for it */
    struct weights_problems pr = {0};
    size_t bad = weights_finite_check(f, path, &pr);
    st_close(f);
    if (bad) {
      fprintf(stderr, "cedar weights check: %s: %zu tensor%s with values that are not finite; no hash recorded:\n",
              path, bad, bad == 1 ? "" : "s");
      weights_problems_print(&pr, stderr, 20);
      weights_problems_free(&pr);
      return 1;
    }
  }
  if (weights_hash_record(path, &added, err, sizeof err)) {
    fprintf(stderr, "cedar weights check: %s\n", err);
    return 1;
  }
  fprintf(stderr, "%s: recorded %zu content hash%s\n", path, added, added == 1 ? "" : "es");
  return 0;
}

int cli_weights_check_dir(const char *dir, const char *plan_path, bool hash, bool json) {
  char err[1024];
  struct plan p;
  struct weights_problems pr = {0};
  struct weights w;
  struct ckpt_load_stats st = {0};
  int rc = ckpt_plan(dir, plan_path, &p, &pr, err, sizeof err);
  bool have_plan = rc == 0;
  if (have_plan) p.serving.engram_tier = PLAN_ENGRAM_TIER_MEMORY; /* a check reads every hash, the tables' too */
  if (!rc && hash) {
    /* the layout first, without hashes: only a checkpoint that loads gets them */
    rc = ckpt_load(&w, &p, dir, false, &pr, &st, err, sizeof err);
    size_t bad = rc ? 0 : shards_finite(&w, &pr); /* a damaged value gets no hash: the hash would vouch for it */
    if (!rc) weights_free(&w);
    if (bad)
      rc = (snprintf(err, sizeof err, "%s: %zu tensor%s with values that are not finite; no hash recorded", dir, bad,
                     bad == 1 ? "" : "s"),
            CEDAR_EFORMAT);
    size_t added = 0;
    if (!rc && (rc = ckpt_record_hashes(dir, &added, err, sizeof err)) == 0)
      fprintf(stderr, "%s: recorded %zu content hash%s\n", dir, added, added == 1 ? "" : "es");
  }
  if (!rc) rc = ckpt_load(&w, &p, dir, true, &pr, &st, err, sizeof err);
  size_t bad = rc ? 0 : shards_finite(&w, &pr);
  if (!rc) weights_free(&w);
  if (bad)
    rc = (snprintf(err, sizeof err, "%s: %zu tensor%s with values that are not finite", dir, bad, bad == 1 ? "" : "s"),
          CEDAR_EFORMAT);
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "dir", dir);
    cJSON_AddStringToObject(j, "plan", have_plan ? p.name : "");
    cJSON_AddBoolToObject(j, "valid", rc == 0);
    cJSON_AddNumberToObject(j, "shards", (double)st.n_shards);
    cJSON_AddNumberToObject(j, "tensors", (double)st.n_tensors);
    cJSON_AddNumberToObject(j, "hashed", (double)st.hashed);
    cJSON_AddNumberToObject(j, "unhashed", (double)st.unhashed);
    cJSON_AddNumberToObject(j, "skipped_mtp", (double)st.skipped_mtp);
    cJSON_AddNumberToObject(j, "skipped_vision", (double)st.skipped_vision);
    cJSON *arr = cJSON_AddArrayToObject(j, "problems");
    for (size_t i = 0; i < pr.n; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(pr.msg[i]));
    if (rc && !pr.n) cJSON_AddItemToArray(arr, cJSON_CreateString(err));
    cli_print_json(j);
  } else if (rc) {
    fprintf(stderr, "cedar weights check: %s\n", err);
    weights_problems_print(&pr, stderr, 20);
  } else {
    printf("%s: ok for plan %s (%zu shards, %zu tensors, %zu content hashes verified, %zu without; "
           "skipped %zu mtp.* and %zu vision tensors)\n",
           dir, p.name, st.n_shards, st.n_tensors, st.hashed, st.unhashed, st.skipped_mtp, st.skipped_vision);
  }
  weights_problems_free(&pr);
  if (have_plan) plan_free(&p);
  return rc ? 1 : 0;
}
