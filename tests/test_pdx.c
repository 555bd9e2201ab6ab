/* test_pdx.c: P/D with stages and experts in one process (scheduler/
 * plan_place.c, scheduler/graph_place.c; docs/placement.md, "P/D with
 * stages and experts").
 *
 *  - plan language: a stage with one home only, with `rank` and a P/D home,
 *    stages mixing the forms, a rank in both roles, a KV source read from
 *    another stage, the replay on D, experts with `ranks` under P/D, role
 *    lists without P/D, a written prefill rank disagreeing with the stages:
 *    each refused at its file:line:col with a hint;
 *  - the role views: stage[].rank and the shard list are the prefill role's
 *    or the decode role's; the P/D homes come from the first stage;
 *  - the compiler: every P->D TRANSFER of a prefill graph built from the
 *    prefill view runs on its layer's prefill home and lands on that
 *    stage's decode home; every KV source is shipped exactly once in entry
 *    order; the token history reaches every decode home; a decode home
 *    does not run a P->D transfer inside the graph (graph_runs_on); a decode
 *    graph from the decode view runs on the decode homes only.
 * Equivalence (one process and mpirun on 3 and 4 ranks, bitwise):
 * tests/cli/pdx_mpi.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/graph.h"
#include "scheduler/plan_place.h"
#include "tests/harness.h"

static char err[512];

static void refused(const char *placement, int line, const char *want, const char *label) {
  char text[2048];
  snprintf(text, sizeof text, "extends: tests/oracle/plans/tiny-40.yaml\nname: t\nserving:\n  placement:\n%s",
           placement);
  struct plan p;
  struct plan_diags d = {0};
  int rc = plan_load_string("pdx.yaml", text, strlen(text), &p, &d);
  EXPECT(rc != 0, "%s: loaded", label);
  if (rc == 0) {
    plan_free(&p);
    return;
  }
  bool found = false;
  for (size_t i = 0; i < d.n; i++)
    if (strstr(d.d[i].msg, want)) {
      found = true;
      EXPECT(d.d[i].mark.line == line && d.d[i].hint, "%s: at line %d (want %d) with a hint: %s", label,
             d.d[i].mark.line, line, d.d[i].msg);
    }
  EXPECT(found, "%s: no diagnostic says '%s' (first: %s)", label, want, d.n ? d.d[0].msg : "none");
  plan_diags_free(&d);
}

static void plan_language(void) {
  refused("    stages:\n      - {layers: 0-13, prefill: 0}\n      - {layers: 14-39, prefill: 1, decode: 3}\n", 6,
          "needs both `prefill` and `decode`", "one home only");
  refused("    stages:\n      - {layers: 0-13, rank: 0, prefill: 0, decode: 2}\n"
          "      - {layers: 14-39, prefill: 1, decode: 3}\n", 6, "names `rank` and a P/D home", "rank and P/D");
  refused("    stages:\n      - {layers: 0-13, prefill: 0, decode: 2}\n      - {layers: 14-39, rank: 1}\n", 7,
          "must all name one home or all a P/D pair", "mixed forms");
  refused("    stages:\n      - {layers: 0-13, prefill: 0, decode: 1}\n      - {layers: 14-39, prefill: 1, decode: 2}\n",
          6, "a rank holds one role", "a rank in both roles");
  refused("    stages:\n      - {layers: 0-10, prefill: 0, decode: 2}\n      - {layers: 11-39, prefill: 1, decode: 3}\n",
          7, "reads KV source L8 of stage 0", "a KV source read from another stage");
  refused("    replay: decode\n    stages:\n      - {layers: 0-13, prefill: 0, decode: 2}\n"
          "      - {layers: 14-39, prefill: 1, decode: 3}\n", 7, "replay on D", "replay on D");
  refused("    prefill: {rank: 0}\n    decode: {rank: 1}\n    experts: {ranks: [0, 2]}\n", 7,
          "needs each role's shard ranks", "experts with one list under P/D");
  refused("    experts: {prefill: [0, 2], decode: [1, 2]}\n", 5, "share one home", "role lists without P/D");
  refused("    experts: {prefill: [0, 2]}\n    prefill: {rank: 0}\n    decode: {rank: 1}\n", 5,
          "names only the prefill role's shards", "one role's shards");
  refused("    prefill: {rank: 0}\n    decode: {rank: 1}\n    experts: {prefill: [0, 2], decode: [1, 2, 3]}\n", 7,
          "experts.decode splits 4 routed experts over 3 ranks", "decode shards unequal");
  refused("    decode: {rank: 1}\n    stages:\n      - {layers: 0-13, prefill: 0, decode: 2}\n"
          "      - {layers: 14-39, prefill: 1, decode: 3}\n", 5, "stage 0's decode home is 2", "decode rank disagrees");
}

static void views(void) {
  struct plan p, v;
  if (!h_load_plan("tests/plans/pdppep4-tiny-40.yaml", &p)) return;
  EXPECT(plan_place_pd(&p), "pdppep4 is a P/D placement");
  EXPECT(p.serving.prefill_rank == 0 && p.serving.decode_rank == 2, "homes from stage 0: P %d D %d",
         p.serving.prefill_rank, p.serving.decode_rank);
  EXPECT_EQ(plan_place_ranks(&p), 4, "pdppep4 ranks");
  plan_role_view(&p, false, &v);
  EXPECT(v.serving.place.stage[1].rank == 1 && v.serving.place.ep_rank[0] == 1, "prefill view: stage 1 on rank %d, "
         "shard 0 on rank %d", v.serving.place.stage[1].rank, v.serving.place.ep_rank[0]);
  plan_role_view(&p, true, &v);
  EXPECT(v.serving.place.stage[0].rank == 2 && v.serving.place.stage[1].rank == 3 && v.serving.place.ep_rank[0] == 3 &&
         v.serving.place.ep_rank[1] == 2, "decode view: stages on %d, %d; shards on %d, %d", v.serving.place.stage[0].rank,
         v.serving.place.stage[1].rank, v.serving.place.ep_rank[0], v.serving.place.ep_rank[1]);
  plan_free(&p);
  if (!h_load_plan("plans/v41-mini-pp2.yaml", &p)) return;
  EXPECT(!plan_place_pd(&p), "v41-mini-pp2 keeps one home a stage");
  plan_free(&p);
}

/* The compiler on plan `path` (decode homes dec[stage]). */
static void compiled(const char *path, int64_t n, int chunk) {
  struct plan p, *vp = malloc(sizeof *vp), *vd = malloc(sizeof *vd);
  if (!h_load_plan(path, &p)) {
    free(vp), free(vd);
    return;
  }
  plan_role_view(&p, false, vp);
  plan_role_view(&p, true, vd);
  struct graph g;
  struct graph_opts o = {.chunk = chunk, .replay = -1};
  int rc = graph_build_prefill(&g, vp, n, &o, err, sizeof err);
  EXPECT(rc == 0, "%s: prefill: %s", path, err);
  if (!rc) {
    int64_t shipped[PLAN_MAX_LAYERS], cloned[PLAN_MAX_LAYERS][8];
    bool tokens_to[8] = {0}, key_home[PLAN_MAX_LAYERS][8] = {{0}};
    for (int l = 0; l < p.n_layers; l++) {
      shipped[l] = 0;
      for (int r = 0; r < 8; r++) cloned[l][r] = 0;
    }
    /* key_slot: vendor: a source's stream also goes to the decode homes of the stages scoring its keys */
    for (int l = 0; l < p.n_layers; l++) {
      int key[2];
      graph__key_sources(&p, l, key);
      for (int c = 0; c < 2; c++) {
        int dh = p.serving.place.stage[plan_stage_of(&p, l)].decode;
        if (key[c] >= 0 && dh != p.serving.place.stage[plan_stage_of(&p, key[c])].decode) key_home[key[c]][dh & 7] = true;
      }
    }
    for (int k = 0; k < g.n_node; k++) {
      const struct graph_node *nd = &g.node[k];
      if (nd->op != GRAPH_TRANSFER || (nd->flags & GRAPH_F_STAGE)) continue;
      const struct graph_data *s = &g.data[nd->xfer_src], *d = &g.data[nd->xfer_dst];
      int l = s->layer >= 0 ? s->layer : 0;
      const struct plan_stage *st = &p.serving.place.stage[plan_stage_of(&p, l)];
      if (s->state == GRAPH_ST_TOKENS) {
        EXPECT(nd->place.rank == p.serving.place.stage[0].rank, "%s: %s on rank %d", path, nd->name, nd->place.rank);
        if (d->home.rank >= 0 && d->home.rank < 8) tokens_to[d->home.rank] = true;
        continue;
      }
      if (s->state == GRAPH_ST_XE) continue; /* with the first decoder layer's stage: checked by its homes below */
      if (s->state == GRAPH_ST_KV && d->home.rank != st->decode) { /* a clone to a key-reading stage's home */
        EXPECT(key_home[l][d->home.rank & 7] && nd->place.rank == st->rank, "%s: %s ships to rank %d", path, nd->name,
               d->home.rank);
        for (int u = 0; u < nd->n_use; u++)
          if (nd->use[u].data == nd->xfer_dst) {
            EXPECT(nd->use[u].e_w0 == cloned[l][d->home.rank & 7], "%s: %s ships from entry %lld", path, nd->name,
                   (long long)nd->use[u].e_w0);
            cloned[l][d->home.rank & 7] = nd->use[u].e_w1;
          }
        continue;
      }
      EXPECT(nd->place.rank == st->rank && d->home.rank == st->decode, "%s: %s runs on rank %d to rank %d, want %d "
             "to %d", path, nd->name, nd->place.rank, d->home.rank, st->rank, st->decode);
      EXPECT(!graph_runs_on(&g, nd, st->decode), "%s: %s runs inside the graph on its decode home", path, nd->name);
      if (s->state == GRAPH_ST_KV)
        for (int u = 0; u < nd->n_use; u++)
          if (nd->use[u].data == nd->xfer_dst) {
            EXPECT(nd->use[u].e_w0 == shipped[l], "%s: %s ships from entry %lld after %lld", path, nd->name,
                   (long long)nd->use[u].e_w0, (long long)shipped[l]);
            shipped[l] = nd->use[u].e_w1;
          }
    }
    for (int l = 0; l < p.n_layers; l++)
      if (plan_is_kv_source(&p.layer[l]))
        EXPECT(shipped[l] == n / p.layer[l].ratio, "%s: source L%d shipped %lld entries, want %lld", path, l,
               (long long)shipped[l], (long long)(n / p.layer[l].ratio));
    for (int l = 0; l < p.n_layers; l++)
      for (int r = 0; r < 8; r++)
        EXPECT(!key_home[l][r] || cloned[l][r] == n / p.layer[l].ratio, "%s: L%d's keys reached rank %d up to %lld",
               path, l, r, (long long)cloned[l][r]);
    for (int s = 0; s < p.serving.place.n_stages; s++)
      EXPECT(tokens_to[p.serving.place.stage[s].decode], "%s: no token history for decode home %d", path,
             p.serving.place.stage[s].decode);
    graph_free(&g);
  }
  rc = graph_build_decode(&g, vd, n, err, sizeof err);
  EXPECT(rc == 0, "%s: decode: %s", path, err);
  if (!rc) {
    for (int k = 0; k < g.n_node; k++) {
      const struct graph_node *nd = &g.node[k];
      if (nd->op == GRAPH_TRANSFER || nd->layer < 0) continue;
      int want = p.serving.place.stage[plan_stage_of(&p, nd->layer)].decode, shard = -1;
      if (nd->op == GRAPH_MOE_SHARD) { /* the decode role's shard rank (graph_ep.c): "L<l>.moe_shard<s> ..." */
        EXPECT(sscanf(nd->name, "L%*d.moe_shard%d", &shard) == 1, "%s: shard node name %s", path, nd->name);
        if (shard >= 0 && shard < vd->serving.place.n_ep_ranks) want = vd->serving.place.ep_rank[shard];
      }
      EXPECT(nd->place.rank == want, "%s: decode %s on rank %d, want %d", path, nd->name, nd->place.rank, want);
    }
    graph_free(&g);
  }
  plan_free(&p);
  free(vp), free(vd);
}

int main(void) {
  plan_language();
  views();
  compiled("tests/plans/pdpp3-tiny-40.yaml", 37, 16);
  compiled("tests/plans/pdpp4-tiny-40.yaml", 101, 40);
  compiled("tests/plans/pdppep4-tiny-40.yaml", 37, 7);
  compiled("plans/v41-mini-pp2-pd.yaml", 64, 16);
  return h_report("pdx");
}
