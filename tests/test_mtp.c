/* test_mtp.c: the DSpark drafter (runtime/model/mtp.h) on v41-mini with synthetic
 * weights.
 *
 *  - Greedy speculative decoding with the drafter gives plain greedy's
 *    tokens bit for bit, at prompt lengths 1 (a window of one row), 37, 129
 *    (the replay and the window just full) and 200 (longer than the
 *    replay: the capture starts at the replay's first position), with the
 *    verify length fixed at the draft size and chosen from the profile;
 *    vLLM's figures are consistent (mean acceptance length = 1 +
 *    accepted / drafts, per-position counts non-increasing).
 *  - A draft block is deterministic, reads the capture (a lost row of the
 *    window is refused, naming the layer and position), and a recaptured
 *    position invalidates its cached main row.
 *  - The drafter is refused with a message on a plan without one.
 * Synthetic weights make acceptance meaningless: forced acceptance and
 * every rollback path are tests/test_speculate.c's.
 *
 * Dump mode (for tests/cli/oracle_mtp.sh, the comparison with the NumPy
 * oracle): test_mtp --dump PLAN WEIGHTS TOKENS STEPS OUT prefills TOKENS
 * (comma-separated ids), decodes STEPS greedy tokens, then runs one draft
 * block and writes draft.logits (B, V), draft.conf (B), draft.tokens (B),
 * draft.x (B, hidden), the window's captured rows capture.rows (n, targets,
 * hidden) with capture.pos (n), and tokens (consumed ids, then y0).
 */
#include "tests/model_fixture.h"

#include "runtime/model/mtp.h"
#include "runtime/engine/speculate.h"
#include "runtime/load/safetensors.h"

#define PLAN_MINI "plans/v41-mini.yaml"
#define NEW 10

static void spec_case(struct fx *f, const struct rt_mtp *D, int64_t n, bool adaptive) {
  int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n);
  make_prompt(prompt, n, f->V, PROMPT_SEED + (uint64_t)n);
  char what[96];
  snprintf(what, sizeof what, "prompt %lld, %s verify length", (long long)n, adaptive ? "chosen" : "fixed");
  struct rt_gen_opts o = {.max_new = NEW, .replay = -1, .top_p = 1};
  struct rt_request r;
  struct rt_gen_result plain;
  int rc = rt_generate(&f->M, f->pools, &r, prompt, n, &o, &plain, err, sizeof err);
  EXPECT(rc == 0, "%s: plain: %s", what, err);
  rt_request_free(&r);
  struct rt_mtp_cap cap;
  EXPECT(rt_mtp_cap_init(&cap, f->p) == 0, "capture");
  struct rt_mtp_drafter md;
  rt_mtp_drafter_init(&md, D, &cap);
  struct rt_spec_opts so = {.drafter = rt_mtp_drafter(&md), .lmax = D->B, .adaptive = adaptive};
  struct rt_gen_opts os = o;
  os.mtp_cap = &cap;
  struct rt_gen_result res;
  struct rt_spec_stats st;
  rc = rt_generate_spec(&f->M, f->pools, &r, prompt, n, &os, &so, &res, &st, err, sizeof err);
  EXPECT(rc == 0, "%s: speculative: %s", what, err);
  if (!rc && plain.n_tokens == NEW) {
    EXPECT(res.n_tokens == NEW && !memcmp(res.tokens, plain.tokens, sizeof(int32_t) * NEW),
           "%s: speculative greedy tokens with the DSpark drafter differ from plain greedy", what);
    EXPECT(md.blocks >= st.num_drafts && md.blocks <= st.rounds, /* every round with drafts drafted once */
           "%s: %lld draft blocks for %lld rounds with drafts", what, (long long)md.blocks, (long long)st.num_drafts);
    EXPECT(st.num_accepted_tokens <= st.num_draft_tokens, "%s: accepted %lld of %lld", what,
           (long long)st.num_accepted_tokens, (long long)st.num_draft_tokens);
    for (int i = 1; i < D->B; i++)
      EXPECT(st.accepted_per_pos[i] <= st.accepted_per_pos[i - 1], "%s: position %d accepted more than %d", what, i,
             i - 1);
    if (st.num_drafts)
      EXPECT(fabs(rt_spec_mean_accept_len(&st) - (1.0 + (double)st.num_accepted_tokens / (double)st.num_drafts)) < 1e-12,
             "%s: mean acceptance length", what);
    /* key_slot: vendor caps a round at position p to p drafts (graph_verify_rows_max): a one-token
     * prompt's rounds may stay below B within its NEW tokens */
    if (!adaptive && n >= D->B) EXPECT(st.len_hist[D->B] >= 1, "%s: no round verified %d drafts", what, D->B);
    printf("%s: %d tokens equal; %lld draft blocks, mean acceptance length %.2f\n", what, res.n_tokens,
           (long long)md.blocks, rt_spec_mean_accept_len(&st));
  }
  rt_gen_result_free(&res);
  rt_gen_result_free(&plain);
  rt_request_free(&r);
  rt_mtp_drafter_free(&md);
  rt_mtp_cap_free(&cap);
  free(prompt);
}

/* A draft block after a prefill of n: deterministic, reads the capture. */
static void block_checks(struct fx *f, const struct rt_mtp *D) {
  const int64_t n = 60;
  int32_t prompt[60];
  make_prompt(prompt, n, f->V, PROMPT_SEED);
  struct rt_mtp_cap cap;
  EXPECT(rt_mtp_cap_init(&cap, f->p) == 0, "capture");
  struct rt_gen_opts o = {.max_new = 1, .replay = -1, .top_p = 1, .mtp_cap = &cap};
  struct rt_request r;
  struct rt_gen_result res;
  int rc = rt_generate(&f->M, f->pools, &r, prompt, n, &o, &res, err, sizeof err);
  EXPECT(rc == 0, "prefill: %s", err);
  if (rc) return;
  int B = D->B, V = f->V, d = f->p->model.hidden;
  int32_t d1[16], d2[16];
  float *l1 = malloc(sizeof(float) * (size_t)B * V), *l2 = malloc(sizeof(float) * (size_t)B * V);
  float c1[16], c2[16];
  struct rt_arena ar;
  rt_arena_init(&ar, 1 << 20);
  int32_t y0 = r.pending;
  EXPECT(rt_mtp_draft_block(D, &cap, r.n_pos, y0, d1, l1, c1, NULL, &ar, err, sizeof err) == 0, "draft: %s", err);
  rt_arena_reset(&ar);
  EXPECT(rt_mtp_draft_block(D, &cap, r.n_pos, y0, d2, l2, c2, NULL, &ar, err, sizeof err) == 0, "draft: %s", err);
  EXPECT(!memcmp(d1, d2, sizeof(int32_t) * (size_t)B) && !memcmp(l1, l2, sizeof(float) * (size_t)B * V) &&
             !memcmp(c1, c2, sizeof(float) * (size_t)B),
         "two draft blocks on the same state differ (the cached main rows must give the same bits)");
  for (int i = 0; i < B; i++)
    EXPECT(d1[i] == op_sample_greedy(l1 + (size_t)i * V, V), "draft %d is not the argmax of its logits", i);
  /* a recaptured position's main row is recomputed: scale one target row of
   * the newest position, the block's logits must move */
  int64_t last = r.n_pos - 1;
  int slot = (int)(last % cap.cap);
  float *row = cap.rows + (size_t)slot * cap.n_targets * d;
  float *X = malloc(sizeof(float) * (size_t)f->p->model.hc_streams * d);
  for (int k = 0; k < f->p->model.hc_streams; k++)
    for (int j = 0; j < d; j++) X[(size_t)k * d + j] = 2.0f * row[j];
  rt_mtp_capture(&cap, cap.targets[0], last, 1, X, f->p->model.hc_streams);
  rt_arena_reset(&ar);
  EXPECT(rt_mtp_draft_block(D, &cap, r.n_pos, y0, d2, l2, c2, NULL, &ar, err, sizeof err) == 0, "draft: %s", err);
  EXPECT(memcmp(l1, l2, sizeof(float) * (size_t)B * V) != 0, "a recaptured row did not change the draft logits");
  /* a lost row in the window is refused, naming it */
  cap.tag[(size_t)((last - 3) % cap.cap) * cap.n_targets + 1] = -1;
  rt_arena_reset(&ar);
  rc = rt_mtp_draft_block(D, &cap, r.n_pos, y0, d2, l2, c2, NULL, &ar, err, sizeof err);
  EXPECT(rc == CEDAR_EINVAL && strstr(err, "lacks target layer"), "a lost capture row: rc %d, %s", rc, err);
  free(X);
  free(l1);
  free(l2);
  rt_arena_free(&ar);
  rt_gen_result_free(&res);
  rt_request_free(&r);
  rt_mtp_cap_free(&cap);
}

static void refusal(void) {
  struct fx f;
  if (!fx_open(&f, PLAN_TINY)) return fx_close(&f);
  struct rt_mtp D;
  int rc = rt_mtp_init(&D, &f.M, err, sizeof err);
  EXPECT(rc == CEDAR_EUNSUPPORTED && strstr(err, "noise_token"), "tiny (noise id past its vocabulary): %d %s", rc, err);
  fx_close(&f);
}

static int parse_ids(const char *s, int32_t *out, int cap) {
  int n = 0;
  while (*s && n < cap) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s) return -1;
    out[n++] = (int32_t)v;
    s = *end == ',' ? end + 1 : end;
  }
  return n;
}

static int dump(const char *plan_path, const char *wpath, const char *toks, int steps, const char *out) {
  static struct plan p;
  if (!h_load_plan(plan_path, &p)) return 1;
  static int32_t prompt[1 << 16];
  int n = parse_ids(toks, prompt, 1 << 16);
  struct weights w;
  struct weights_problems pr = {0};
  struct rt_model M;
  static struct rt_kv_pool pools[PLAN_MAX_LAYERS];
  struct rt_mtp D;
  struct rt_mtp_cap cap;
  if (n < 1 || weights_load(&w, &p, wpath, &pr, err, sizeof err) || rt_model_init(&M, &p, &w, err, sizeof err) ||
      rt_kv_pools_init(pools, &p, err, sizeof err) || rt_mtp_init(&D, &M, err, sizeof err) ||
      rt_mtp_cap_init(&cap, &p)) {
    fprintf(stderr, "test_mtp --dump: %s\n", n < 1 ? "no tokens" : err);
    return 1;
  }
  struct rt_gen_opts o = {.max_new = steps + 1, .replay = -1, .top_p = 1, .mtp_cap = &cap};
  struct rt_request r;
  struct rt_gen_result res;
  if (rt_generate(&M, pools, &r, prompt, n, &o, &res, err, sizeof err)) {
    fprintf(stderr, "test_mtp --dump: %s\n", err);
    return 1;
  }
  int B = D.B, V = p.model.vocab, d = p.model.hidden, T = cap.n_targets;
  int32_t draft[16];
  float *lg = malloc(sizeof(float) * (size_t)B * V), conf[16], *x = malloc(sizeof(float) * (size_t)B * d);
  struct rt_arena ar;
  rt_arena_init(&ar, 1 << 20);
  int64_t P = r.n_pos;
  if (rt_mtp_draft_block(&D, &cap, P, r.pending, draft, lg, conf, x, &ar, err, sizeof err)) {
    fprintf(stderr, "test_mtp --dump: %s\n", err);
    return 1;
  }
  int64_t lo = P - D.window > 0 ? P - D.window : 0;
  while (lo < P && cap.tag[(size_t)(lo % cap.cap) * T] != lo) lo++;
  int nw = (int)(P - lo);
  float *rows = malloc(sizeof(float) * (size_t)(nw ? nw : 1) * T * d);
  int64_t *rpos = malloc(sizeof(int64_t) * (size_t)(nw ? nw : 1)), dtok[16], *tok = malloc(sizeof(int64_t) * (size_t)(P + 1));
  for (int i = 0; i < nw; i++) {
    rpos[i] = lo + i;
    memcpy(rows + (size_t)i * T * d, cap.rows + (size_t)((lo + i) % cap.cap) * T * d, sizeof(float) * (size_t)T * d);
  }
  for (int i = 0; i < B; i++) dtok[i] = draft[i];
  for (int64_t i = 0; i < P; i++) tok[i] = r.tokens[i];
  tok[P] = r.pending;
  struct st_tensor t[] = {
      {.name = "draft.logits", .dtype = ST_F32, .ndim = 2, .shape = {B, V}, .nbytes = sizeof(float) * (size_t)B * V, .data = lg},
      {.name = "draft.conf", .dtype = ST_F32, .ndim = 1, .shape = {B}, .nbytes = sizeof(float) * (size_t)B, .data = conf},
      {.name = "draft.tokens", .dtype = ST_I64, .ndim = 1, .shape = {B}, .nbytes = sizeof(int64_t) * (size_t)B, .data = dtok},
      {.name = "draft.x", .dtype = ST_F32, .ndim = 2, .shape = {B, d}, .nbytes = sizeof(float) * (size_t)B * d, .data = x},
      {.name = "capture.rows", .dtype = ST_F32, .ndim = 3, .shape = {nw, T, d}, .nbytes = sizeof(float) * (size_t)nw * T * d, .data = rows},
      {.name = "capture.pos", .dtype = ST_I64, .ndim = 1, .shape = {nw}, .nbytes = sizeof(int64_t) * (size_t)nw, .data = rpos},
      {.name = "tokens", .dtype = ST_I64, .ndim = 1, .shape = {P + 1}, .nbytes = sizeof(int64_t) * (size_t)(P + 1), .data = tok},
  };
  if (st_write(out, t, sizeof t / sizeof t[0], NULL, 0, err, sizeof err)) {
    fprintf(stderr, "test_mtp --dump: %s\n", err);
    return 1;
  }
  printf("draft after position %lld (y0 %d):", (long long)P, r.pending);
  for (int i = 0; i < B; i++) printf(" %d", draft[i]);
  printf("\n");
  free(lg), free(x), free(rows), free(rpos), free(tok); /* everything back, so LSan sees no leak */
  rt_arena_free(&ar);
  rt_gen_result_free(&res);
  rt_request_free(&r);
  rt_mtp_cap_free(&cap);
  rt_kv_pools_free(pools, p.n_layers);
  rt_model_free(&M);
  weights_free(&w);
  weights_problems_free(&pr);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--dump")) {
    if (argc != 7) {
      fprintf(stderr, "usage: test_mtp --dump PLAN WEIGHTS TOKENS STEPS OUT\n");
      return 2;
    }
    return dump(argv[2], argv[3], argv[4], atoi(argv[5]), argv[6]);
  }
  refusal();
  struct fx f;
  if (fx_open(&f, PLAN_MINI)) {
    struct rt_mtp D;
    int rc = rt_mtp_init(&D, &f.M, err, sizeof err);
    EXPECT(rc == 0, "v41-mini's drafter: %s", err);
    if (!rc) {
      block_checks(&f, &D);
      static const int64_t lens[] = {1, 37, 129, 200};
      for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) spec_case(&f, &D, lens[i], false);
      spec_case(&f, &D, 37, true);
    }
  }
  fx_close(&f);
  return h_report("mtp");
}
