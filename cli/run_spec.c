/* run_spec.c: `cedar run --speculate` (run_spec.h). */
#include "cli/run_spec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "cli/bench.h"
#include "runtime/model/mtp.h"
#include "runtime/engine/speculate.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool run_spec_parse(const char *arg, struct run_spec_opts *o, char *err, size_t err_len) {
  if (!strcmp(arg, "mtp") || !strcmp(arg, "dspark")) { /* the model's own drafter (runtime/model/mtp.h) */
    o->mtp = true;
    o->n_rates = 1;
    o->rate[0] = -1;
    return true;
  }
  o->mtp = false;
  if (strncmp(arg, "forced:", 7)) {
    snprintf(err, err_len, "--speculate takes forced:R[,R...] with R in [0, 1] (got '%s')", arg);
    return false;
  }
  o->n_rates = 0;
  const char *s = arg + 7;
  while (*s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0 && v <= 1) || (*end && *end != ',') || o->n_rates == RUN_SPEC_MAX_RATES) {
      snprintf(err, err_len, "--speculate forced: takes up to %d rates in [0, 1], comma-separated (got '%s')",
               RUN_SPEC_MAX_RATES, arg);
      return false;
    }
    o->rate[o->n_rates++] = (float)v;
    s = *end ? end + 1 : end;
  }
  if (!o->n_rates) {
    snprintf(err, err_len, "--speculate forced: needs at least one rate (forced:1,0.5)");
    return false;
  }
  return true;
}

struct spec_run {
  float rate;
  struct rt_spec_stats st;
  double tok_s;
  bool equal;
  int n_tokens;
  int mtp_blocks;          /* rate < 0: the DSpark drafter's */
  int64_t mtp_runs;
  double mtp_s;
};

static void print_text(const struct spec_run *sr, int nr, int lmax, double plain_tok_s, int plain_n, bool greedy,
                       int verify_len) {
  char blas[160];
  bench_blas_core(blas, sizeof blas);
  printf("plain and speculative decoding of the same request, one after the other in this process; %s\n", blas);
  printf("plain decode (the faster of a run before and one after the speculative ones): %d tokens, %.2f tokens/s\n",
         plain_n, plain_tok_s);
  for (int k = 0; k < nr; k++) {
    const struct spec_run *s = &sr[k];
    const struct rt_spec_stats *st = &s->st;
    char who[64];
    if (s->rate < 0)
      snprintf(who, sizeof who, "DSpark drafter mtp.0..%d", s->mtp_blocks - 1);
    else
      snprintf(who, sizeof who, "forced acceptance %.2f", (double)s->rate);
    printf("speculative (%s, %s verify length): %d tokens, %.2f tokens/s, %.2fx plain; tokens %s\n",
           who, verify_len < 0 ? "chosen" : "fixed", s->n_tokens, s->tok_s,
           plain_tok_s > 0 ? s->tok_s / plain_tok_s : 0.0,
           greedy ? (s->equal ? "bitwise equal to plain greedy" : "DIFFER from plain greedy") : "sampled (not compared)");
    printf("  SpecDecoding metrics: Mean acceptance length: %.2f, Accepted: %lld tokens, Drafted: %lld tokens, "
           "Drafts: %lld, Avg Draft acceptance rate: %.1f%%, Per-position acceptance rate:",
           rt_spec_mean_accept_len(st), (long long)st->num_accepted_tokens, (long long)st->num_draft_tokens,
           (long long)st->num_drafts,
           st->num_draft_tokens ? 100.0 * (double)st->num_accepted_tokens / (double)st->num_draft_tokens : 0.0);
    for (int i = 0; i < lmax; i++)
      printf(" %.3f", st->num_drafts ? (double)st->accepted_per_pos[i] / (double)st->num_drafts : 0.0);
    if (s->rate < 0)
      printf("\n  drafter: %lld draft blocks, %.3f s of the %.3f s decode (%.2f ms a block)", (long long)s->mtp_runs,
             s->mtp_s, st->decode_s, s->mtp_runs ? 1e3 * s->mtp_s / (double)s->mtp_runs : 0.0);
    printf("\n  verify rounds: %lld; by length L:", (long long)st->rounds);
    for (int L = 0; L <= lmax; L++) printf(" %d:%lld", L, (long long)st->len_hist[L]);
    if (verify_len < 0) {
      printf("\n  measured t_round(L) ms:");
      for (int L = 0; L <= lmax; L++) printf(" %.2f", 1e3 * st->t_round[L]);
    }
    printf("\n");
  }
}

static void print_json(const struct spec_run *sr, int nr, int lmax, double plain_tok_s, int plain_n, bool greedy) {
  printf("{\"plain\": {\"tokens\": %d, \"tokens_per_s\": %.4f}, \"speculative\": [", plain_n, plain_tok_s);
  for (int k = 0; k < nr; k++) {
    const struct spec_run *s = &sr[k];
    const struct rt_spec_stats *st = &s->st;
    if (s->rate < 0)
      printf("%s{\"drafter\": \"mtp\", \"draft_blocks\": %lld, \"drafter_s\": %.6f, \"forced_acceptance\": null, ",
             k ? ", " : "", (long long)s->mtp_runs, s->mtp_s);
    else
      printf("%s{\"drafter\": \"forced\", \"forced_acceptance\": %.4f, ", k ? ", " : "", (double)s->rate);
    printf("\"tokens\": %d, \"tokens_per_s\": %.4f, \"speedup\": %.4f, "
           "\"equal_to_plain\": %s, \"mean_acceptance_length\": %.4f, \"num_drafts\": %lld, \"num_draft_tokens\": "
           "%lld, \"num_accepted_tokens\": %lld, \"per_position_acceptance_rate\": [",
           s->n_tokens, s->tok_s, plain_tok_s > 0 ? s->tok_s / plain_tok_s : 0.0,
           greedy ? (s->equal ? "true" : "false") : "null", rt_spec_mean_accept_len(st), (long long)st->num_drafts,
           (long long)st->num_draft_tokens, (long long)st->num_accepted_tokens);
    for (int i = 0; i < lmax; i++)
      printf("%s%.4f", i ? ", " : "", st->num_drafts ? (double)st->accepted_per_pos[i] / (double)st->num_drafts : 0.0);
    printf("], \"t_round_s\": [");
    for (int L = 0; L <= lmax; L++) printf("%s%.6f", L ? ", " : "", st->t_round[L]);
    printf("]}");
  }
  printf("]}\n");
}

int run_spec(struct rt_engine *e, const int32_t *prompt, int64_t n, const struct rt_gen_opts *go,
             const struct run_spec_opts *so) {
  char err[1024];
  const struct plan *p = &e->plan;
  int lmax = so->draft_len > 0 ? so->draft_len : p->model.dspark_draft > 0 ? p->model.dspark_draft : 5;
  if (lmax > RT_SPEC_LMAX || lmax + 1 > p->model.window) {
    fprintf(stderr, "cedar run: --draft-len %d: a verify step holds at most %d drafts here (and window - 1 = %d)\n",
            lmax, RT_SPEC_LMAX, p->model.window - 1);
    return 1;
  }
  if (so->verify_len > lmax) {
    fprintf(stderr, "cedar run: --verify-len %d is more than the %d drafts a round makes\n", so->verify_len, lmax);
    return 1;
  }
  if (e->cache || go->executor != RT_EXEC_DIRECT) {
    fprintf(stderr, "cedar run: --speculate runs on the direct executor without a prefix cache\n");
    return 1;
  }
  bool greedy = !(go->temperature > 0);
  /* plain, greedy: the reference continuation the forced drafter drafts */
  struct rt_gen_opts plain = *go;
  plain.temperature = 0;
  plain.top_p = 1;
  struct rt_request r = {0};
  struct rt_gen_result res = {0};
  double t0 = now_s();
  int rc = rt_engine_generate(e, &r, prompt, n, &plain, &res, err, sizeof err);
  double plain_s = now_s() - t0 - res.ttft_s;
  rt_engine_request_free(e, &r);
  if (rc) {
    fprintf(stderr, "cedar run: %s\n", err);
    rt_gen_result_free(&res);
    return 1;
  }
  int plain_n = res.n_tokens;
  int32_t *ref = cedar_xmalloc(sizeof(int32_t) * (size_t)plain_n);
  memcpy(ref, res.tokens, sizeof(int32_t) * (size_t)plain_n);
  rt_gen_result_free(&res);
  double plain_tok_s = plain_n > 1 && plain_s > 0 ? (plain_n - 1) / plain_s : 0;
  struct spec_run sr[RUN_SPEC_MAX_RATES];
  int status = 0;
  double t_round[RT_SPEC_LMAX + 1] = {0}; /* measured once, on the first run's request, reused */
  struct rt_mtp D;
  struct rt_mtp_cap cap = {0};
  struct rt_mtp_drafter md = {0};
  if (so->mtp) {
    if (rt_mtp_init(&D, &e->model, err, sizeof err)) {
      fprintf(stderr, "cedar run: --speculate mtp: %s\n", err);
      status = 1;
    } else if (rt_mtp_cap_init(&cap, p)) {
      fprintf(stderr, "cedar run: --speculate mtp: out of memory for the drafter's rows\n");
      status = 1;
    } else {
      rt_mtp_drafter_init(&md, &D, &cap);
    }
  }
  for (int k = 0; k < so->n_rates && !status; k++) {
    struct rt_forced fd = {.ref = ref, .n_ref = plain_n, .ref_pos0 = n, .rate = so->rate[k], .rng = go->seed + 1,
                           .V = p->model.vocab};
    struct rt_spec_opts sp = {.drafter = so->mtp ? rt_mtp_drafter(&md) : rt_forced_drafter(&fd, lmax),
                              .lmax = so->verify_len >= 0 ? so->verify_len : lmax, .adaptive = so->verify_len < 0};
    memcpy(sp.t_round, t_round, sizeof t_round);
    struct rt_request rs = {0};
    struct rt_gen_result rr = {0};
    struct rt_gen_opts gs = *go;
    gs.mtp_cap = so->mtp ? &cap : NULL;
    rc = rt_generate_spec(&e->model, e->pools, &rs, prompt, n, &gs, &sp, &rr, &sr[k].st, err, sizeof err);
    sr[k].mtp_blocks = so->mtp ? D.blocks : 0;
    sr[k].mtp_runs = md.blocks;
    sr[k].mtp_s = md.draft_s;
    if (rc) {
      fprintf(stderr, "cedar run: --speculate: %s\n", err);
      status = 1;
    } else {
      memcpy(t_round, sp.t_round, sizeof t_round);
      sr[k].rate = so->rate[k];
      sr[k].n_tokens = rr.n_tokens;
      sr[k].tok_s = rr.n_tokens > 1 && sr[k].st.decode_s > 0 ? (rr.n_tokens - 1) / sr[k].st.decode_s : 0;
      sr[k].equal = rr.n_tokens == plain_n && !memcmp(rr.tokens, ref, sizeof(int32_t) * (size_t)plain_n);
      if (greedy && !sr[k].equal) status = 2;
    }
    rt_gen_result_free(&rr);
    rt_request_free(&rs);
  }
  if (status != 1) { /* plain again after them: the machine's load moves, the faster of the two is compared */
    memset(&res, 0, sizeof res);
    t0 = now_s();
    rc = rt_engine_generate(e, &r, prompt, n, &plain, &res, err, sizeof err);
    double again_s = now_s() - t0 - res.ttft_s;
    rt_engine_request_free(e, &r);
    if (rc || res.n_tokens != plain_n || memcmp(res.tokens, ref, sizeof(int32_t) * (size_t)plain_n)) {
      fprintf(stderr, "cedar run: the second plain run %s\n", rc ? err : "gave other tokens than the first");
      status = 1;
    } else if (again_s < plain_s) {
      plain_s = again_s;
      plain_tok_s = plain_n > 1 && plain_s > 0 ? (plain_n - 1) / plain_s : 0;
    }
    rt_gen_result_free(&res);
  }
  int nr = status == 1 ? 0 : so->n_rates, shown = so->verify_len >= 0 ? so->verify_len : lmax;
  if (nr) {
    if (so->json)
      print_json(sr, nr, shown, plain_tok_s, plain_n, greedy);
    else
      print_text(sr, nr, shown, plain_tok_s, plain_n, greedy, so->verify_len);
  }
  if (status == 2) fprintf(stderr, "cedar run: --speculate: greedy speculative tokens differ from plain greedy\n");
  if (so->mtp) {
    rt_mtp_drafter_free(&md);
    rt_mtp_cap_free(&cap);
  }
  free(ref);
  return status;
}
