/* test_plan_load.c: the shipped plans load to what SPEC says.
 *
 *  - plans/v41-flash.yaml resolves to SPEC 2.2's table and SPEC 8.1's
 *    invariants (modes, KV and Top-K sources, pool writer and readers);
 *  - plans/v41-mini.yaml has the same structure with small widths;
 *  - plans/dense-40.yaml: every CSA2 layer owns its KV and Top-K, CED off;
 *  - the alternative schedules resolve as their comments say;
 *  - values read from YAML and defaults land in the right fields;
 *  - a plan need not have 40 layers (tests/plans/small.yaml).
 * Run from the repo root: ./build/tests/test_plan_load
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/plan.h"
#include "tests/harness.h"
#include "scheduler/plan_bus.h"
#include "ops/formats.h"


/* SPEC 2.1, written out independently of the loader's derivation. */
static void spec_schedule(int l, enum plan_mode *mode, int *kv, int *topk) {
  static const int kv_sources[] = {2, 8, 14, 20};
  static const int index_sources[] = {2, 8, 14, 20, 24, 28, 32, 36};
  *kv = *topk = -1;
  for (int i = 0; i < 4; i++) if (kv_sources[i] <= l) *kv = kv_sources[i];
  for (int i = 0; i < 8; i++) if (index_sources[i] <= l) *topk = index_sources[i];
  bool is_kv = *kv == l, is_index = *topk == l;
  if (l <= 1) *mode = PLAN_SWA_ONLY, *kv = *topk = -1;
  else if (is_kv) *mode = PLAN_FULL;
  else if (is_index) *mode = PLAN_REINDEX;
  else *mode = PLAN_REUSE;
}

/* The 40-layer V4.1 structure, shared by flash and mini (SPEC 2.2, 8.1). */
static void check_v41_structure(const struct plan *p) {
  EXPECT(p->n_layers == 40, "%s: %d layers", p->name, p->n_layers);
  int counts[4] = {0};
  for (int l = 0; l < p->n_layers; l++) {
    const struct plan_layer *L = &p->layer[l];
    enum plan_mode mode;
    int kv, topk;
    spec_schedule(l, &mode, &kv, &topk);
    counts[L->mode]++;
    EXPECT(L->mode == mode, "%s L%d: mode %s", p->name, l, plan_mode_name(L->mode));
    EXPECT(L->kv_src == kv, "%s L%d: kv_src %d, SPEC %d", p->name, l, L->kv_src, kv);
    EXPECT(L->topk_src == topk, "%s L%d: topk_src %d, SPEC %d", p->name, l, L->topk_src, topk);
    EXPECT(L->region == (l < 20 ? PLAN_ENCODER : PLAN_DECODER), "%s L%d: region", p->name, l);
    EXPECT(L->ratio == (l < 2 ? 0 : l < 20 ? 2 : 1), "%s L%d: ratio %d", p->name, l, L->ratio);
    bool builds = l == 20, reads = l == 24 || l == 28 || l == 32 || l == 36;
    EXPECT((L->cand == PLAN_CAND_BUILD) == builds, "%s L%d: pool build", p->name, l);
    EXPECT((L->cand == PLAN_CAND_READ) == reads, "%s L%d: pool read", p->name, l);
    EXPECT(!reads || L->pool_src == 20, "%s L%d: pool source %d", p->name, l, L->pool_src);
    EXPECT(L->engram == (l == 1 || l == 14), "%s L%d: engram", p->name, l);
  }
  EXPECT(counts[PLAN_SWA_ONLY] == 2 && counts[PLAN_FULL] == 4 && counts[PLAN_REINDEX] == 4 &&
             counts[PLAN_REUSE] == 30,
         "%s: counts %d/%d/%d/%d, SPEC 8.1 says 2/4/4/30", p->name, counts[0], counts[1], counts[2], counts[3]);
  EXPECT(p->model.window == 128 && p->model.topk == 512, "%s: window/topk", p->name);
  EXPECT(p->model.cand_block == 8 && p->model.cand_top_blocks == 2048, "%s: candidates", p->name);
  EXPECT(p->serving.ced, "%s: CED on", p->name);
  EXPECT(p->serving.replay_encoder == 128 && p->serving.replay_decoder == 128, "%s: replay windows", p->name);
}

static void check_flash(void) {
  struct plan p;
  if (!h_load_plan("plans/v41-flash.yaml", &p)) return;
  check_v41_structure(&p);
  const struct plan_model *m = &p.model;
  EXPECT(!strcmp(p.name, "v41-flash"), "name %s", p.name);
  EXPECT(m->hidden == 5120 && m->heads == 64 && m->head_dim == 512 && m->rope_dim == 64, "attention widths");
  EXPECT(m->q_rank == 1280 && m->o_groups == 8 && m->o_rank == 1024, "q/o ranks");
  EXPECT(m->idx_heads == 32 && m->idx_head_dim == 128 && m->idx_rope_dim == 64 && m->idx_rope_last, "indexer");
  EXPECT(m->n_routed == 384 && m->n_shared == 1 && m->n_active == 6 && m->moe_inter == 2304, "moe");
  EXPECT(m->moe_score == PLAN_SCORE_SQRTSOFTPLUS && m->route_scale == 1.5 && m->swiglu_limit == 10, "moe score");
  EXPECT(m->hc_streams == 4 && m->hc_sinkhorn_iters == 20, "mhc");
  /* Appendix V: the vendor's values are what v41-flash computes */
  EXPECT(m->hc_pairing == PLAN_PAIRING_V41 && m->hc_merge == PLAN_MERGE_CARRIED, "mhc pairing v41, merge carried");
  EXPECT(m->norm_eps == 1e-20 && !m->q_head_norm && m->idx_k_norm && m->idx_q_mxfp4 && m->cand_pin_newest,
         "Appendix V #6, #11, #12, #19");
  EXPECT(m->idx_key_slot == PLAN_KEY_SLOT_VENDOR, "Appendix V #25: key_slot vendor");
  EXPECT(m->rope_swa.theta == 10000 && !m->rope_swa.yarn, "SWA rope");
  EXPECT(m->rope_csa.theta == 160000 && m->rope_csa.yarn && m->rope_csa.yarn_factor == 16 &&
             m->rope_csa.yarn_original_len == 65536 && m->rope_csa.yarn_beta_fast == 32,
         "CSA rope");
  EXPECT(m->engram_n_orders == 3 && m->engram_orders[2] == 4 && m->engram_heads == 8 && m->engram_head_dim == 256,
         "engram");
  EXPECT(m->dspark_n_targets == 3 && m->dspark_targets[0] == 37 && m->dspark_draft == 5, "dspark");
  EXPECT(m->main_kv.elem == PLAN_E2M1 && m->main_kv.scale == PLAN_SCALE_E4M3 && m->main_kv.block == 16, "main kv");
  EXPECT(m->indexer_k.scale == PLAN_SCALE_E8M0 && m->indexer_k.block == 32 && m->indexer_k.rule == PLAN_RULE_CEIL,
         "indexer k");
  EXPECT(fabs(plan_softmax_scale(&p) - 1 / sqrt(512.0)) < 1e-15, "softmax scale default");
  EXPECT(m->norm_eps == 1e-20, "norm eps (Appendix V #19)");
  /* The plan's byte accounting and the ops' packed layouts agree (docs/formats.md). */
  EXPECT(plan_format_bytes(&m->main_kv, m->head_dim) == (int64_t)op_fp4_bytes(m->head_dim, m->main_kv.block) &&
             plan_format_bytes(&m->main_kv, m->head_dim) == 288,
         "main KV entry bytes");
  EXPECT(plan_format_bytes(&m->indexer_k, m->idx_head_dim) ==
                 (int64_t)op_mxfp4_bytes(m->idx_head_dim, m->indexer_k.block) &&
             plan_format_bytes(&m->indexer_k, m->idx_head_dim) == 68,
         "indexer K entry bytes");
  EXPECT(plan_format_bytes(&m->swa, m->head_dim) == (int64_t)op_fp8_bytes(m->head_dim, m->swa.block, OP_SCALE_E8M0) &&
             plan_format_bytes(&m->swa, m->head_dim) == 528,
         "SWA entry bytes"); /* Appendix V #21: E4M3 + one E8M0 scale per 32 */
  struct op_kv_format mf = plan_kv_format(m, &m->main_kv), sf = plan_kv_format(m, &m->swa);
  EXPECT(mf.rule == OP_KV_RNE && mf.floor == 0x1p-9f && mf.bf16 && sf.rule == OP_KV_CEIL && sf.floor == 1e-4f && sf.bf16 &&
             op_kv_bytes(&sf, m->head_dim) == 528,
         "the vendor's rules and floors resolved (Appendix V #21)");
  /* SPEC 8.1.3-4 on the bus table. */
  struct plan_bus *bus = calloc(200, sizeof *bus);
  int n = plan_buses(&p, bus, 200);
  for (int b = 0; b < n; b++) {
    const struct plan_layer *w = &p.layer[bus[b].writer];
    if (bus[b].kind == PLAN_BUS_MAIN_KV || bus[b].kind == PLAN_BUS_INDEXER_K)
      EXPECT(w->mode == PLAN_FULL, "KV bus written by L%d", w->index);
    if (bus[b].kind == PLAN_BUS_TOPK) EXPECT(plan_is_index_source(w), "Top-K bus written by L%d", w->index);
    if (bus[b].kind == PLAN_BUS_POOL) {
      EXPECT(w->index == 20, "pool written by L%d", w->index);
      EXPECT(bus[b].n_readers == 4 && bus[b].readers[0] == 24 && bus[b].readers[3] == 36, "pool readers");
    }
  }
  free(bus);
  struct plan_totals t;
  plan_totals(&p, &t);
  EXPECT(t.kv_sources == 4 && t.index_sources == 8 && t.reuse == 30 && t.swa_only == 2 && t.csa == 38, "totals");
  plan_free(&p);
}

static void check_mini_and_dense(void) {
  struct plan mini, dense;
  if (h_load_plan("plans/v41-mini.yaml", &mini)) {
    check_v41_structure(&mini);
    EXPECT(mini.model.hidden == 256 && mini.model.heads == 4 && mini.model.n_routed == 8, "mini widths");
    EXPECT(mini.model.rope_csa.theta == 160000, "mini inherits flash's rope");
    EXPECT(!strcmp(mini.name, "v41-mini"), "mini name");
    plan_free(&mini);
  }
  if (h_load_plan("plans/dense-40.yaml", &dense)) {
    EXPECT(!dense.serving.ced, "dense: CED off");
    EXPECT(dense.model.hidden == 256, "dense at mini widths");
    for (int l = 0; l < dense.n_layers; l++) {
      const struct plan_layer *L = &dense.layer[l];
      if (!plan_is_csa(L)) continue;
      EXPECT(L->mode == PLAN_FULL && L->kv_src == l && L->topk_src == l, "dense L%d owns KV and Top-K", l);
      EXPECT(L->cand == PLAN_CAND_NONE, "dense L%d: no pool", l);
    }
    plan_free(&dense);
  }
}

static void check_alternatives(void) {
  struct plan p;
  if (h_load_plan("plans/alt-reindex2.yaml", &p)) {
    for (int l = 22; l < 40; l += 2) EXPECT(p.layer[l].mode == PLAN_REINDEX && p.layer[l].pool_src == 20, "L%d", l);
    EXPECT(p.layer[23].topk_src == 22 && p.layer[39].topk_src == 38, "reuse follows the nearer reindex");
    plan_free(&p);
  }
  if (h_load_plan("plans/alt-two-dec-sources.yaml", &p)) {
    EXPECT(p.layer[30].mode == PLAN_FULL && p.layer[31].kv_src == 30 && p.layer[29].kv_src == 20, "second source");
    EXPECT(p.layer[32].pool_src == 30 && p.layer[28].pool_src == 20, "pools follow their source");
    plan_free(&p);
  }
  if (h_load_plan("plans/alt-no-pool.yaml", &p)) {
    for (int l = 0; l < 40; l++) EXPECT(p.layer[l].cand == PLAN_CAND_NONE, "L%d has no pool", l);
    EXPECT(p.layer[24].mode == PLAN_REINDEX, "reindex stays");
    plan_free(&p);
  }
  if (h_load_plan("tests/plans/small.yaml", &p)) {
    EXPECT(p.n_layers == 6 && p.layer[2].kv_src == 1 && p.layer[5].topk_src == 4 && p.layer[4].pool_src == 3,
           "small plan");
    plan_free(&p);
  }
}

/* Defaults fill what a plan leaves out; explicit kv/topk are honoured. */
static void check_string_plan(void) {
  static const char text[] =
      "model: {n_layers: 4, hidden: 64, dspark: {target_layers: [3]}}\n"
      "layers:\n"
      "  - {at: 0, region: encoder, mode: full, ratio: 2}\n"
      "  - {at: 1, region: encoder, mode: reindex, ratio: 2}\n"
      "  - {at: 2, region: encoder, mode: reuse, ratio: 2, topk: 0}\n"
      "  - {at: 3, region: decoder, mode: full, ratio: 1}\n";
  struct plan p;
  struct plan_diags d = {0};
  int rc = plan_load_string("inline.yaml", text, sizeof text - 1, &p, &d);
  if (rc) plan_diags_print(&d, stderr);
  plan_diags_free(&d);
  EXPECT(rc == 0, "inline plan does not load");
  if (rc) return;
  EXPECT(p.model.hidden == 64 && p.model.head_dim == 512, "read and default");
  EXPECT(p.layer[2].topk_src == 0, "explicit older Top-K honoured (derived would be 1)");
  EXPECT(p.serving.replay_decoder == p.model.window, "replay defaults to the window");
  EXPECT(!strcmp(p.name, "inline.yaml"), "name defaults to the file name");
  plan_free(&p);
}

int main(void) {
  check_flash();
  check_mini_and_dense();
  check_alternatives();
  check_string_plan();
  if (!h_failures) printf("plan load: flash, mini, dense, alternatives and defaults as SPEC says\n");
  return h_report("plan load");
}
