/* test_model_options.c: every plan option that chooses between the vendor's
 * V4.1 (Appendix V, the shipped default) and SPEC's variant reaches the
 * forward. For each option, a plan that extends the oracle's tiny plan with
 * the non-default value runs the same prompt on the same synthetic weights
 * (weights_synth seeds each tensor by its name, so the tensors both plans
 * share are bit for bit the same; the test checks one) and must give other
 * logits than the default: a forward that ignored the option would give the
 * same bits. The oracle comparison (tests/cli/oracle_run.sh) checks that the
 * defaults compute the vendor's values; this checks that the switches switch.
 *
 * model.indexer.key_slot is not here: it changes decode steps only (a
 * prefill reads every source's own keys under both readings); the oracle
 * test tests/cli/oracle_key_slot.sh shows both its readings on decode.
 *
 * It also checks the tensor list each option implies (head.hc.* only with
 * `merge: learned`, attn.indexer.k_norm only with `k_norm: true`).
 *
 * Test: ctest --test-dir build -R model_options --output-on-failure
 */
#include <limits.h>
#include <unistd.h>

#include "ops/basic.h"
#include "ops/mhc.h"
#include "tests/model_fixture.h"

#define N_PROMPT 60 /* tiny: 60 decoder entries in 30 blocks of 2, a pool of 6 blocks, top-k 6 */

struct variant {
  const char *what;
  const char *yaml; /* the keys the variant sets, under the `extends:` line */
  const char *has;  /* a tensor the variant's weights must have, or NULL */
  const char *lacks;/* one they must not have, or NULL */
  bool f32;         /* compared with the default plan at `numerics` f32 (NUM_F32), the variant with it too:
                     * an option whose effect is below bf16's resolution vanishes under bf16 activations */
};

#define NUM_F32 "  numerics: {activations: f32, sublayer_io: f32, linear_inputs: f32}\n"

static const struct variant variants[] = {
    {"model.mhc.pairing: v4, merge: learned", "model:\n  mhc: {pairing: v4, merge: learned}\n", "head.hc.fn", NULL, false},
    {"model.mhc.pairing: v4, merge: sum", "model:\n  mhc: {pairing: v4, merge: sum}\n", NULL, "head.hc.fn", false},
    {"model.attention.q_head_norm: true", "model:\n  attention: {q_head_norm: true}\n", NULL, NULL, false},
    {"model.indexer.k_norm: false", "model:\n  indexer: {k_norm: false}\n", NULL, "layers.1.attn.indexer.k_norm", false},
    {"model.indexer.q_mxfp4: false", "model:\n  indexer: {q_mxfp4: false}\n", NULL, NULL, false},
    {"model.candidates.pin_newest: false", "model:\n  candidates: {pin_newest: false}\n", NULL, NULL, false},
    {"model.rope.*.angle: f64", "model:\n  rope: {swa: {angle: f64}, csa: {angle: f64}}\n" NUM_F32, NULL, NULL, true},
    {"model.norm_eps: 1.0e-6", "model:\n  norm_eps: 1.0e-6\n" NUM_F32, NULL, NULL, true},
    {"model.numerics.activations: f32", "model:\n  numerics: {activations: f32}\n", NULL, NULL, false},
    {"model.numerics.sublayer_io: f32", "model:\n  numerics: {sublayer_io: f32}\n", NULL, NULL, false},
    {"model.numerics.linear_inputs: f32", "model:\n  numerics: {linear_inputs: f32}\n", NULL, NULL, false},
};

/* The last prompt position's logits of plan `path` (V floats into out). */
static bool run(const char *path, float *out, int V, const char *has, const char *lacks, const float **wq) {
  struct fx f;
  bool ok = fx_open(&f, path);
  if (ok) {
    EXPECT(f.V == V, "%s: vocab %d, want %d", path, f.V, V);
    if (has) EXPECT(weights_f32(&f.w, has) != NULL, "%s: weights lack %s", path, has);
    if (lacks) EXPECT(weights_f32(&f.w, lacks) == NULL, "%s: weights have %s", path, lacks);
    const float *t = weights_f32(&f.w, "layers.3.attn.wq_a");
    static float first[8];
    if (*wq == NULL) {
      memcpy(first, t, sizeof first);
      *wq = first;
    } else {
      EXPECT(!memcmp(*wq, t, sizeof first), "%s: a shared tensor differs, so a logits difference proves nothing", path);
    }
    int32_t tok[N_PROMPT];
    make_prompt(tok, N_PROMPT, V, PROMPT_SEED);
    struct rt_request r;
    ok = prefill(&f, &r, tok, N_PROMPT, N_PROMPT + 1, 0, -1, out, NULL);
    if (ok) h_finite(out, (size_t)V, path);
    rt_request_free(&r);
  }
  fx_close(&f);
  return ok;
}

/* Appendix V #19: norm_eps 1e-20 (a normal float; rsqrt of it is 1e10) keeps
 * zero rows finite: RMSNorm of a zero row is 0, the mHC coefficients of a
 * zero state are those of zero mixes. */
static void test_eps_zero_rows(void) {
  enum { D = 64, HC = 4 };
  const float eps = 1e-20f;
  float x[D] = {0}, y[D], g[D];
  for (int i = 0; i < D; i++) g[i] = 1.0f;
  op_rmsnorm(y, x, g, 1, D, eps);
  bool zero = true;
  for (int i = 0; i < D; i++) zero &= y[i] == 0.0f;
  EXPECT(zero, "RMSNorm of a zero row with eps 1e-20 is not 0");
  float X[HC * D] = {0}, fn[(2 + HC) * HC * HC * D], scale[3] = {1, 1, 1}, base[(2 + HC) * HC] = {0};
  for (size_t i = 0; i < sizeof fn / sizeof *fn; i++) fn[i] = (float)((i % 7) - 3) * 0.01f;
  float pre[HC], post[HC], C[HC * HC], dots[(2 + HC) * HC], ss[1];
  struct op_mhc_cfg c = {HC, D, 20, 1e-6f, eps};
  op_mhc_coeffs(pre, post, C, dots, ss, X, fn, scale, base, 1, &c);
  h_finite(pre, HC, "mHC pre of a zero state");
  h_finite(C, HC * HC, "mHC C of a zero state");
}

int main(void) {
  test_eps_zero_rows();
  char root[PATH_MAX], dir[] = "/tmp/cedar_model_options_XXXXXX";
  CEDAR_ASSERT(getcwd(root, sizeof root) && mkdtemp(dir));
  struct plan p;
  if (!h_load_plan(PLAN_TINY, &p)) return h_report("model_options");
  int V = p.model.vocab;
  EXPECT(p.model.hc_pairing == PLAN_PAIRING_V41 && p.model.hc_merge == PLAN_MERGE_CARRIED && !p.model.q_head_norm &&
             p.model.idx_k_norm && p.model.idx_q_mxfp4 && p.model.cand_pin_newest && p.model.rope_csa.angle_f32 &&
             p.model.norm_eps == 1e-20 && p.model.num_act_bf16 && p.model.num_io_bf16 && p.model.num_lin_mxfp8 &&
             p.model.idx_key_slot == PLAN_KEY_SLOT_VENDOR,
         "%s: the defaults are not Appendix V's", PLAN_TINY);
  plan_free(&p);
  float *base = calloc((size_t)V, sizeof *base), *alt = calloc((size_t)V, sizeof *alt);
  float *base32 = calloc((size_t)V, sizeof *base32);
  const float *wq = NULL;
  CEDAR_ASSERT(base && alt && base32);
  char path32[PATH_MAX + 64];
  snprintf(path32, sizeof path32, "%s/f32.yaml", dir);
  FILE *f32 = fopen(path32, "w");
  CEDAR_ASSERT(f32);
  fprintf(f32, "extends: %s/%s\nmodel:\n" NUM_F32, root, PLAN_TINY);
  fclose(f32);
  bool ok32 = run(path32, base32, V, NULL, NULL, &wq);
  unlink(path32);
  if (ok32 && run(PLAN_TINY, base, V, NULL, "head.hc.fn", &wq)) {
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
      const struct variant *v = &variants[i];
      char path[PATH_MAX + 64];
      snprintf(path, sizeof path, "%s/v%zu.yaml", dir, i);
      FILE *fp = fopen(path, "w");
      CEDAR_ASSERT(fp);
      fprintf(fp, "# %s\nextends: %s/%s\n%s", v->what, root, PLAN_TINY, v->yaml);
      fclose(fp);
      if (run(path, alt, V, v->has, v->lacks, &wq)) {
        double dmax = 0;
        const float *ref = v->f32 ? base32 : base;
        for (int j = 0; j < V; j++) dmax = fmax(dmax, fabs((double)alt[j] - ref[j]));
        /* Any difference at all: a forward that ignored the option would
         * compute the very same bits (same weights, same prompt, same graph). */
        EXPECT(dmax > 0, "%s: the logits are bit for bit those of the default: the option is ignored", v->what);
        printf("%-40s max |logit difference| %.3g\n", v->what, dmax);
      }
      unlink(path);
    }
  }
  rmdir(dir);
  free(base);
  free(base32);
  free(alt);
  return h_report("model_options");
}
