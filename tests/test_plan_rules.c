/* test_plan_rules.c: every plan validation rule has a failing plan in
 * tests/plans/bad/, and each must be rejected with a diagnostic at the exact
 * file:line:col that names the problem. Also: loading never crashes or leaks
 * on damaged input (every prefix of every shipped plan, and seeded byte
 * mutations), which the ASan build in CI turns into a memory check.
 *
 * Run: ctest -R plan_rules (from the build dir), or ./build/test_plan_rules
 * from the repo root.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/plan.h"
#include "tests/harness.h"


struct bad_case {
  const char *name;  /* tests/plans/bad/<name>.yaml */
  const char *file;  /* file the diagnostic must name (suffix) */
  int line, col;
  const char *text;  /* substring of the message */
};

static const struct bad_case cases[] = {
    {"unknown_key", "bad/unknown_key.yaml", 5, 5, "unknown key `hedas` in `model.attention`"},
    {"layer_unknown_key", "bad/layer_unknown_key.yaml", 4, 13, "unknown key `topK`"},
    {"wrong_type", "bad/wrong_type.yaml", 5, 12, "must be an integer"},
    {"wrong_type_bool", "bad/wrong_type_bool.yaml", 4, 8, "must be true or false"},
    {"out_of_range", "bad/out_of_range.yaml", 4, 11, "`model.hidden` = -5 is out of range"},
    {"window_zero", "bad/window_zero.yaml", 5, 13, "`model.swa.window` = 0 is out of range"},
    {"topk_zero", "bad/topk_zero.yaml", 5, 11, "`model.indexer.topk` = 0 is out of range"},
    {"bad_enum", "bad/bad_enum.yaml", 4, 19, "'resue' is not a known value"},
    {"list_too_long", "bad/list_too_long.yaml", 5, 13, "has 9 values"},
    {"layers_missing", "bad/layers_missing.yaml", 4, 3, "layer 2 is missing"},
    {"layers_duplicate", "bad/layers_duplicate.yaml", 5, 10, "layer 1 is defined twice"},
    {"layers_out_of_order", "bad/layers_out_of_order.yaml", 6, 10, "layer 1 is out of order"},
    {"layer_no_mode", "bad/layer_no_mode.yaml", 4, 5, "has no `mode`"},
    {"at_backwards", "bad/at_backwards.yaml", 4, 10, "runs backwards"},
    {"no_layers", "bad/no_layers.yaml", 2, 1, "has no `layers`"},
    {"reuse_no_source", "bad/reuse_no_source.yaml", 4, 19, "layer 3: mode reuse needs a KV source"},
    {"reindex_no_source", "bad/reindex_no_source.yaml", 4, 19, "layer 1: mode reindex needs a KV source"},
    {"kv_not_full", "bad/kv_not_full.yaml", 4, 17, "`kv: 4` is not a KV source"},
    {"kv_other_region", "bad/kv_other_region.yaml", 4, 17, "`kv: 1` is in the other region"},
    {"kv_after", "bad/kv_after.yaml", 4, 30, "`kv: 2` is after it"},
    {"full_kv_other", "bad/full_kv_other.yaml", 4, 17, "mode full builds its own KV source"},
    {"topk_not_index", "bad/topk_not_index.yaml", 6, 19, "`topk: 4` is not an index source"},
    {"topk_other_kv", "bad/topk_other_kv.yaml", 5, 26, "`topk: 3` indexes KV source 3"},
    {"cand_no_source", "small.yaml", 13, 67, "no layer before it in the decoder builds one"},
    {"cand_read_not_reindex", "bad/cand_read_not_reindex.yaml", 4, 25, "needs mode reindex"},
    {"cand_build_not_full", "bad/cand_build_not_full.yaml", 4, 25, "needs mode full"},
    {"ratio_unstorable", "bad/ratio_unstorable.yaml", 4, 22, "compress ratio 3 cannot be stored"},
    {"ratio_mismatch", "bad/ratio_mismatch.yaml", 4, 20, "ratio 1 differs from its KV source"},
    {"swa_only_ratio", "bad/swa_only_ratio.yaml", 4, 20, "swa_only has no compress ratio"},
    {"csa_no_ratio", "bad/csa_no_ratio.yaml", 5, 5, "needs a compress ratio"},
    {"region_order", "bad/region_order.yaml", 5, 21, "encoder layer after decoder layer"},
    {"ced_no_decoder", "plans/v41-flash.yaml", 144, 8, "CED prefill needs both"},
    {"rope_dim", "bad/rope_dim.yaml", 5, 15, "rope_dim = 33 does not fit"},
    {"mhc_merge_v41", "bad/mhc_merge_v41.yaml", 5, 12, "merge: learned contradicts pairing: v41"},
    {"mhc_carried_v4", "plans/v41-flash.yaml", 68, 12, "merge: carried needs pairing: v41"},
    {"engram_width", "bad/engram_width.yaml", 5, 15, "head_dim = 48 cannot be stored as Engram rows"},
    {"format_block", "bad/format_block.yaml", 4, 20, "block = 24 does not divide"},
    {"format_scaled", "bad/format_scaled.yaml", 4, 31, "cannot store 128-wide vectors"},
    {"format_rule", "bad/format_rule.yaml", 4, 27, "an e8m0 scale is not chosen by the e4m3 rule"},
    {"format_floor", "bad/format_floor.yaml", 4, 45, "scale_floor set for a scale without a floor"},
    {"page_odd", "bad/page_odd.yaml", 5, 18, "page_tokens = 63 is odd"},
    {"engram_tier_value", "bad/engram_tier_value.yaml", 5, 11, "'disk' is not a known value"},
    {"engram_tier_contradicts", "bad/engram_tier_contradicts.yaml", 5, 11,
     "serving.engram.tier = memory contradicts serving.placement.engram.memory = file"},
    {"engram_file_memory", "bad/engram_file_memory.yaml", 5, 11, "serving.engram.file is read only by the mmap tier"},
    {"batch_step_below_requests", "bad/batch_step_below_requests.yaml", 6, 18, "step_tokens = 8 is below max_requests = 16"},
    {"batch_chunk_above_step", "bad/batch_chunk_above_step.yaml", 6, 12, "serving.batch.chunk = 100 is above step_tokens = 64"},
    {"batch_step_below_chunk", "bad/batch_step_below_chunk.yaml", 6, 18, "step_tokens = 64 is below the prefill chunk 128"},
    {"batch_requests_zero", "bad/batch_requests_zero.yaml", 5, 19, "`serving.batch.max_requests` = 0 is out of range"},
    {"batch_unknown_key", "bad/batch_unknown_key.yaml", 5, 5, "unknown key `max_request` in `serving.batch`"},
    {"extends_missing", "bad/extends_missing.yaml", 2, 10, "cannot open plan"},
    {"extends_cycle_a", "bad/extends_cycle_b.yaml", 2, 10, "`extends` cycle"},
    {"yaml_syntax", "bad/yaml_syntax.yaml", 4, 1, "YAML syntax error"},
    {"duplicate_key", "bad/duplicate_key.yaml", 5, 3, "key `hidden` appears twice"},
    {"alias", "bad/alias.yaml", 5, 12, "aliases"},
    {"top_not_map", "bad/top_not_map.yaml", 2, 1, "must be a mapping"},
    {"key_slot_value", "bad/key_slot_value.yaml", 4, 23, "'shared' is not a known value"},
    {"key_slot_last_ratio2", "bad/key_slot_last_ratio2.yaml", 4, 20, "needs the last KV source to have ratio 1"},
    {"key_slot_ratio4", "bad/key_slot_ratio4.yaml", 4, 23, "KV sources of ratio 1 and 2 (layer 1 has ratio 4)"},
};

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

static void check_case(const struct bad_case *c) {
  char path[256];
  snprintf(path, sizeof path, "tests/plans/bad/%s.yaml", c->name);
  struct plan p;
  struct plan_diags d = {0};
  int rc = plan_load(path, &p, &d);
  EXPECT(rc < 0, "%s: loaded, but it breaks a rule", path);
  if (rc == 0) {
    plan_free(&p);
    return;
  }
  bool found = false;
  for (size_t i = 0; i < d.n && !found; i++) {
    const struct plan_diag *e = &d.d[i];
    found = e->file && ends_with(e->file, c->file) && e->mark.line == c->line && e->mark.col == c->col &&
            strstr(e->msg, c->text) && e->hint && *e->hint;
  }
  if (!found) {
    fprintf(stderr, "%s: expected %s:%d:%d with '%s' and a hint; got:\n", path, c->file, c->line, c->col, c->text);
    plan_diags_print(&d, stderr);
  }
  EXPECT(found, "%s: diagnostic missing or misplaced", c->name);
  plan_diags_free(&d);
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
  fclose(f);
  if (buf) buf[n] = 0;
  *len = (size_t)n;
  return buf;
}

/* Loading damaged text must fail cleanly (or succeed) without crashing;
 * a failing load must say why. */
/* A pool that may hold fewer than topk entries is legal (Appendix V #13:
 * Top-K pads with -1): the plan loads, with one warning at top_blocks. */
static void pool_small_warns(void) {
  struct plan p;
  struct plan_diags d = {0};
  int rc = plan_load("tests/plans/pool_small.yaml", &p, &d);
  EXPECT(rc == 0, "pool_small.yaml: refused, but a small pool is legal");
  EXPECT(d.n == 1 && d.d[0].warning && d.d[0].mark.line == 5 && d.d[0].mark.col == 38 &&
             strstr(d.d[0].msg, "padded with -1") && d.d[0].hint,
         "pool_small.yaml: want one warning at 5:38 saying the Top-K lists are padded");
  if (rc == 0) plan_free(&p);
  plan_diags_free(&d);
}

static void load_damaged(const char *text, size_t len) {
  struct plan p;
  struct plan_diags d = {0};
  int rc = plan_load_string("plans/damaged.yaml", text, len, &p, &d);
  if (rc == 0) plan_free(&p);
  else EXPECT(d.n > 0, "a failed load reported no diagnostic");
  plan_diags_free(&d);
}

static void robustness(const char *path, uint64_t seed) {
  size_t len;
  char *text = slurp(path, &len);
  EXPECT(text, "cannot read %s", path);
  if (!text) return;
  for (size_t cut = 0; cut <= len; cut += 1 + len / 200) load_damaged(text, cut);
  char *mut = malloc(len + 1);
  for (int round = 0; round < 1500; round++) {
    memcpy(mut, text, len + 1);
    for (int k = 0; k < 4; k++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      size_t at = (size_t)(seed >> 33) % (len ? len : 1);
      static const char bytes[] = ":-{}[]#&*!|>'\"\n 0123456789abcxyz\t,.";
      mut[at] = bytes[(seed >> 20) % (sizeof bytes - 1)];
    }
    load_damaged(mut, len);
  }
  free(mut);
  free(text);
}

int main(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
  pool_small_warns();
  static const char *plans[] = {"plans/v41-flash.yaml", "plans/v41-mini.yaml", "plans/dense-40.yaml",
                                "tests/plans/small.yaml"};
  for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) robustness(plans[i], 42 + i);
  /* NUL bytes and binary junk. */
  load_damaged("model:\0 {hidden: 4}", 19);
  load_damaged("\xff\xfe\x00\x01", 4);
  load_damaged("", 0);
  if (!h_failures) printf("plan rules: %zu failing plans rejected at the right place; damaged inputs handled\n",
         sizeof cases / sizeof cases[0]);
  return h_report("plan rules");
}
