/* speculate.c: speculative decoding of one request: snapshot, verify,
 * accept, roll back (speculate.h). */
#include "runtime/engine/speculate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/basic.h"
#include "ops/dspark.h"
#include "ops/sample.h"
#include "base/check.h"
#include "runtime/gen/step.h"

_Static_assert(RT_MTP_SLACK > RT_SPEC_LMAX + 1, "a verify step must not overwrite the capture window a draft reads (runtime/model/mtp.h)");

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- snapshot and commit ------------------------------------------------- */

static void rt_spec_snap_free(struct rt_spec_snap *s);

/* Buffers for steps of up to cap positions of requests of plan p. 0 or
 * CEDAR_ENOMEM. */
static int rt_spec_snap_init(struct rt_spec_snap *s, const struct plan *p, int cap) {
  memset(s, 0, sizeof(*s));
  s->p = p;
  s->cap = cap;
  const struct plan_model *m = &p->model;
  bool ok = true;
  for (int l = 0; l < p->n_layers; l++) {
    /* ring entry bytes are the request's (state.c); sized at take time from
     * the first request: every request of a plan has the same */
    if (plan_is_kv_source(&p->layer[l])) {
      int ratio = p->layer[l].ratio;
      size_t tf = op_comp_tail_floats(ratio, m->head_dim);
      if (tf) ok &= (s->tail_rows[l] = malloc(sizeof(float) * tf)) != NULL;
      s->log[l].d = m->head_dim;
      s->log[l].cap = cap;
      ok &= (s->log[l].v = malloc(sizeof(float) * (size_t)cap * m->head_dim)) != NULL;
      if (ratio > 1) ok &= (s->log[l].g = malloc(sizeof(float) * (size_t)cap * m->head_dim)) != NULL;
    }
    ok &= (s->ring_pos[l] = malloc(sizeof(int64_t) * (size_t)cap)) != NULL;
  }
  ok &= (s->xe_rows = malloc(sizeof(float) * (size_t)cap * rt_xe_row_floats(m))) != NULL;
  ok &= (s->xe_pos = malloc(sizeof(int64_t) * (size_t)cap)) != NULL;
  if (!ok) {
    rt_spec_snap_free(s);
    return CEDAR_ENOMEM;
  }
  return 0;
}

static void rt_spec_snap_free(struct rt_spec_snap *s) {
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) {
    free(s->tail_rows[l]);
    free(s->ring_slot[l]);
    free(s->ring_pos[l]);
    free(s->log[l].v);
    free(s->log[l].g);
  }
  free(s->xe_rows);
  free(s->xe_pos);
  memset(s, 0, sizeof(*s));
}

/* Keep r's state for a step over [r->n_pos, r->n_pos + n) (n <= cap) and
 * attach the tail logs to r. */
static void rt_spec_snap_take(struct rt_spec_snap *s, struct rt_request *r, int n) {
  CEDAR_ASSERT(n >= 0 && n <= s->cap && r->plan == s->p);
  s->pos = r->n_pos;
  s->n = n;
  s->n_tokens = r->n_tokens;
  const struct plan *p = s->p;
  for (int l = 0; l < p->n_layers; l++) {
    struct rt_ring *g = &r->ring[l];
    if (g->slot) {
      CEDAR_ASSERT_MSG(n <= g->window, "a verify step of %d positions is longer than layer %d's window %d", n, l,
                       g->window);
      if (!s->ring_slot[l]) s->ring_slot[l] = cedar_xmalloc((size_t)s->cap * g->entry_bytes);
      for (int k = 0; k < n; k++) {
        int slot = (int)((s->pos + k) % g->window);
        memcpy(s->ring_slot[l] + (size_t)k * g->entry_bytes, g->slot + (size_t)slot * g->entry_bytes, g->entry_bytes);
        s->ring_pos[l][k] = g->pos[slot];
      }
      s->ring_r0[l] = g->r0;
    }
    if (r->seq[l].pool) {
      s->n_entries[l] = r->seq[l].n_entries;
      s->tail[l] = r->tail[l];
      size_t tf = op_comp_tail_floats(r->tail[l].ratio, r->tail[l].d);
      if (tf) memcpy(s->tail_rows[l], r->tail_buf[l], sizeof(float) * tf);
      s->log[l].a0 = s->pos;
    }
  }
  if (r->xe_cap > 0) {
    size_t row = rt_xe_row_floats(&p->model);
    for (int k = 0; k < n; k++) {
      int slot = (int)((s->pos + k) % r->xe_cap);
      memcpy(s->xe_rows + (size_t)k * row, r->xe + (size_t)slot * row, sizeof(float) * row);
      s->xe_pos[k] = r->xe_pos[slot];
    }
  }
  r->tail_log = s->log;
}

/* Row j of the sequence (old tail rows, then the logged rows of the step). */
static const float *tail_row(const struct rt_spec_snap *s, int l, bool gate, int j) {
  const struct op_comp_tail *t = &s->tail[l];
  size_t d = (size_t)t->d;
  if (j < t->count) { /* the old tail's buffer copy: v rows then g rows, as op_comp_tail_init lays them out */
    const float *base = gate ? s->tail_rows[l] + (size_t)(t->ratio - 1) * d : s->tail_rows[l];
    return base + (size_t)j * d;
  }
  const float *lg = gate ? s->log[l].g : s->log[l].v;
  return lg + (size_t)(j - t->count) * d;
}

/* After the step ran: keep positions [pos, pos + c), 0 <= c <= n, roll the
 * rest back, detach the logs; r->n_pos = pos + c, r->n_tokens likewise. */
static void rt_spec_commit(struct rt_spec_snap *s, struct rt_request *r, int c) {
  CEDAR_ASSERT(c >= 0 && c <= s->n && r->n_pos == s->pos + s->n);
  const struct plan *p = s->p;
  for (int l = 0; l < p->n_layers; l++) {
    struct rt_ring *g = &r->ring[l];
    if (g->slot) { /* the slots rejected positions overwrote get their old bytes and tags back (SPEC 7.8) */
      for (int k = c; k < s->n; k++) {
        int slot = (int)((s->pos + k) % g->window);
        memcpy(g->slot + (size_t)slot * g->entry_bytes, s->ring_slot[l] + (size_t)k * g->entry_bytes, g->entry_bytes);
        g->pos[slot] = s->ring_pos[l][k];
      }
      g->r0 = s->ring_r0[l];
    }
    struct rt_kv_seq *q = &r->seq[l];
    if (!q->pool) continue;
    const struct op_comp_tail *t0 = &s->tail[l];
    int ratio = t0->ratio, total = t0->count + c, groups = total / ratio;
    CEDAR_ASSERT_MSG(q->n_entries == s->n_entries[l] + (t0->count + s->n) / ratio,
                     "layer %d: the verify step appended %lld entries, expected %d", l,
                     (long long)(q->n_entries - s->n_entries[l]), (t0->count + s->n) / ratio);
    /* the global append area: only groups the kept positions complete stay */
    q->n_entries = s->n_entries[l] + groups;
    int keep_pages = (int)((q->n_entries + q->pool->page_entries - 1) / q->pool->page_entries);
    while (q->n_pages > keep_pages) {
      rt_kv_page_unref(q->pool, q->page_id[--q->n_pages]);
      q->page_id[q->n_pages] = -1;
      q->page_ptr[q->n_pages] = NULL;
    }
    /* the tail: the last total % ratio rows of (old rows, kept logged rows) */
    struct op_comp_tail *t = &r->tail[l];
    int cnt = total % ratio;
    float *v = t->v, *gg = t->g;
    for (int j = 0; j < cnt; j++) { /* from the snapshot's copies, never from t's own rows */
      if (v) memcpy(v + (size_t)j * t->d, tail_row(s, l, false, groups * ratio + j), sizeof(float) * (size_t)t->d);
      if (gg) memcpy(gg + (size_t)j * t->d, tail_row(s, l, true, groups * ratio + j), sizeof(float) * (size_t)t->d);
    }
    t->count = cnt;
    t->pos0 = t0->pos0 + (int64_t)groups * ratio;
  }
  if (r->xe_cap > 0) {
    size_t row = rt_xe_row_floats(&p->model);
    for (int k = c; k < s->n; k++) {
      int slot = (int)((s->pos + k) % r->xe_cap);
      memcpy(r->xe + (size_t)slot * row, s->xe_rows + (size_t)k * row, sizeof(float) * row);
      r->xe_pos[slot] = s->xe_pos[k];
    }
  }
  r->n_pos = s->pos + c;
  r->n_tokens = s->n_tokens + c;
  r->tail_log = NULL;
}

/* ---- the forced drafter -------------------------------------------------- */

static int forced_draft(void *self, const struct rt_model *M, struct rt_request *r, int32_t y0, int L, int32_t *draft,
                        float *q, float *conf, char *err, size_t err_len) {
  (void)M, (void)y0, (void)q, (void)err, (void)err_len;
  struct rt_forced *f = self;
  int64_t k = r->n_pos - f->ref_pos0; /* y0 is ref[k]: the next draft continues ref at k + 1 */
  for (int i = 0; i < L; i++) {
    int64_t j = k + 1 + i;
    int32_t want = j >= 0 && j < f->n_ref ? f->ref[j] : 0;
    bool agree = f->rate >= 0 ? op_rng_uniform(&f->rng) < (double)f->rate : i < f->k_agree;
    draft[i] = agree ? want : (want + 1) % f->V; /* any id but the target's own choice */
    conf[i] = f->rate >= 0 ? f->rate : (i < f->k_agree ? 1.0f : 0.0f);
  }
  return L;
}

struct rt_drafter rt_forced_drafter(struct rt_forced *f, int max_draft) {
  return (struct rt_drafter){forced_draft, f, max_draft, false};
}

double rt_spec_mean_accept_len(const struct rt_spec_stats *s) {
  return s->num_drafts ? 1.0 + (double)s->num_accepted_tokens / (double)s->num_drafts : 1.0; /* no drafts: one token a round */
}

/* ---- one verify step ----------------------------------------------------- */

/* Tokens tok (n: the pending one, then the drafts) at positions
 * [r->n_pos, + n) through every layer: logits (n, V). The snapshot is taken
 * here; the caller commits. */
static int verify(const struct rt_model *M, struct rt_request *r, struct rt_spec_snap *s, const int32_t *tok, int n,
                  float *logits, const struct rt_gen_opts *o, struct rt_exec_stats *st, char *err, size_t err_len) {
  if (r->n_tokens + n > r->max_tokens) {
    snprintf(err, err_len, "the request holds %lld ids and has room for %lld: %d more do not fit", (long long)r->n_tokens,
             (long long)r->max_tokens, n);
    return CEDAR_EINVAL;
  }
  rt_spec_snap_take(s, r, n);
  for (int i = 0; i < n; i++) rt_request_push_token(r, tok[i]);
  struct rt_step_row w = {.r = r, .n = n, .logits = logits}; /* the one step function (runtime/gen/step.h) */
  rt_gen_step(M, &w, 1, o, NULL, st);
  if (w.rc) {
    snprintf(err, err_len, "%s", w.err);
    r->tail_log = NULL; /* the request fails (pages ran out): it is dropped, never continued */
  }
  return w.rc;
}

/* Row i's logits after o's repetition penalty over the ids consumed up to
 * and including that row's token, seen[0, n_seen + i + 1) (what generate.c
 * penalizes over at the same position); the row itself when pen is NULL.
 * NULL for an id outside [0, V). */
static const float *penalized(const float *logits, int i, int V, const struct rt_gen_opts *o, const int32_t *seen,
                              int64_t n_seen, float *pen) {
  const float *li = logits + (size_t)i * V;
  if (!pen) return li;
  return op_sample_penalize(pen, li, V, seen, n_seen + i + 1, o->rep_penalty) ? NULL : pen;
}

/* Greedy: the drafts agreeing with the argmax of the (penalized) rows
 * before them, then that row's argmax (correction, or bonus after all L).
 * out (L + 1). */
static int accept_greedy(const float *logits, const int32_t *draft, int L, int V, const struct rt_gen_opts *o,
                         const int32_t *seen, int64_t n_seen, float *pen, int32_t *out, int64_t pos, char *err,
                         size_t err_len) {
  for (int i = 0; i <= L; i++) {
    const float *li = penalized(logits, i, V, o, seen, n_seen, pen);
    int32_t t = li ? op_sample_greedy(li, V) : -1;
    if (t < 0) {
      snprintf(err, err_len, "the logits of position %lld hold NaN or +inf, or no finite value: this request is "
               "dropped", (long long)(pos + i));
      return CEDAR_EINVAL;
    }
    out[i] = t;
    if (i == L || draft[i] != t) return i;
  }
  return L;
}

/* Sampled (Leviathan et al. 2023, Algorithm 1): p_i the target's
 * distribution at row i as the plain sampler draws from it (the repetition
 * penalty over the ids up to row i, temperature, top-k, top-p: op_sample_k's
 * filters), q_i the draft's (NULL: one-hot at the draft). Accept x_i with
 * probability min(1, p(x)/q(x)); on the first rejection draw from
 * norm(max(0, p_i - q_i)); after L accepted, draw the bonus from p_L. The
 * rule holds for any p_i fixed by the prefix, so the committed tokens are
 * distributed as plain sampling's. prob, order: (V) workspace; resid (V). */
int rt_spec_accept_sampled(const float *logits, const int32_t *draft, const float *q, int L, int V,
                           const struct rt_gen_opts *o, const int32_t *seen, int64_t n_seen, float *pen,
                           uint64_t *rng, float *prob, int32_t *order, float *resid, int32_t *out, int64_t pos,
                           char *err, size_t err_len) {
  for (int i = 0; i <= L; i++) {
    const float *li = penalized(logits, i, V, o, seen, n_seen, pen);
    bool k = o->top_k > 0 && o->top_k < V;
    if (!li || op_sample_softmax(prob, li, V, o->temperature) ||
        (k ? op_sample_top_k(prob, order, V, o->top_k, o->top_p) : op_sample_top_p(prob, order, V, o->top_p)) < 0) {
      snprintf(err, err_len, "the logits of position %lld hold NaN or +inf, or no finite value: this request is "
               "dropped", (long long)(pos + i));
      return CEDAR_EINVAL;
    }
    if (i == L) {
      out[i] = op_sample_draw(prob, V, rng);
      return L;
    }
    int32_t x = draft[i];
    double qx = q ? q[(size_t)i * V + x] : 1.0, px = prob[x];
    if (qx > 0 && op_rng_uniform(rng) < (px >= qx ? 1.0 : px / qx)) {
      out[i] = x;
      continue;
    }
    double mass = 0;
    for (int y = 0; y < V; y++) {
      float qy = q ? q[(size_t)i * V + y] : (y == x ? 1.0f : 0.0f);
      resid[y] = prob[y] > qy ? prob[y] - qy : 0.0f;
      mass += resid[y];
    }
    out[i] = mass > 0 ? op_sample_draw(resid, V, rng) : op_sample_draw(prob, V, rng);
    return i;
  }
  return L;
}

/* ---- the measured profile (SPEC 3.16) ------------------------------------- */

int rt_spec_profile(const struct rt_model *M, struct rt_request *r, const struct rt_gen_opts *o, int lmax, int reps,
                    double *t_round, char *err, size_t err_len) {
  const int V = M->p->model.vocab;
  struct rt_spec_snap s;
  float *lg = malloc(sizeof(float) * (size_t)V * (lmax + 1));
  int32_t tok[RT_SPEC_LMAX + 1];
  if (!lg || rt_spec_snap_init(&s, M->p, lmax + 1)) {
    free(lg);
    snprintf(err, err_len, "out of memory for the verify profile");
    return CEDAR_ENOMEM;
  }
  int rc = 0;
  int32_t y = r->pending >= 0 ? r->pending : 0;
  for (int i = 0; i <= lmax; i++) tok[i] = y;
  for (int k = 0; k < 2 && !rc; k++) { /* warm-up: the first steps pay for cold caches and arena growth */
    struct rt_exec_stats st = {0};
    rc = verify(M, r, &s, tok, lmax + 1, lg, o, &st, err, err_len);
    if (!rc) rt_spec_commit(&s, r, 0);
  }
  for (int L = 0; L <= lmax && !rc; L++) {
    t_round[L] = 0;
    for (int k = 0; k < reps && !rc; k++) {
      struct rt_exec_stats st = {0};
      double t = now_s();
      rc = verify(M, r, &s, tok, L + 1, lg, o, &st, err, err_len);
      t = now_s() - t;
      if (!rc) rt_spec_commit(&s, r, 0);
      if (!rc && (k == 0 || t < t_round[L])) t_round[L] = t;
    }
  }
  rt_spec_snap_free(&s);
  free(lg);
  return rc;
}

/* ---- the request ------------------------------------------------------------ */

/* What speculation refuses before it runs: 0, or the refusal in err. */
static int spec_refuse(const struct rt_model *M, const struct rt_gen_opts *o, const struct rt_spec_opts *so, char *err,
                       size_t err_len) {
  int lmax = so->lmax;
  if (lmax < 0 || lmax > RT_SPEC_LMAX || lmax > so->drafter.max_draft || lmax + 1 > M->p->model.window) {
    snprintf(err, err_len, "speculation verifies 0 to %d drafts a round (the drafter's %d, the window %d); got %d",
             RT_SPEC_LMAX, so->drafter.max_draft, M->p->model.window - 1, lmax);
    return CEDAR_EINVAL;
  }
  if (o->cache || o->executor != RT_EXEC_DIRECT) {
    snprintf(err, err_len, "speculative decoding runs on the direct executor without a prefix cache (its rollback is "
             "not yet checked under StarPU's data handles or with cached pages)");
    return CEDAR_EUNSUPPORTED;
  }
  return 0;
}

int rt_generate_spec(const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r, const int32_t *prompt,
                     int64_t n, const struct rt_gen_opts *o, struct rt_spec_opts *so, struct rt_gen_result *res,
                     struct rt_spec_stats *stats, char *err, size_t err_len) {
  memset(stats, 0, sizeof(*stats));
  int lmax = so->lmax;
  int rc = spec_refuse(M, o, so, err, err_len);
  if (rc) return rc;
  /* the prefill and the first token, as rt_generate; room for a round past max_new */
  struct rt_gen_opts o1 = *o;
  o1.max_new = 1;
  o1.reserve = (o->reserve > 0 ? o->reserve : 0) + o->max_new + lmax + 1;
  rc = rt_generate(M, pools, r, prompt, n, &o1, res, err, err_len);
  if (rc) return rc;
  const int V = M->p->model.vocab;
  free(res->decode_logits); /* rounds keep no per-token logits */
  res->decode_logits = NULL;
  int32_t *tokens = realloc(res->tokens, sizeof(int32_t) * ((size_t)o->max_new + lmax + 1));
  float *lg = malloc(sizeof(float) * (size_t)V * (lmax + 1));
  float *q = malloc(sizeof(float) * (size_t)V * (lmax > 0 ? lmax : 1));
  float *prob = malloc(sizeof(float) * (size_t)V), *resid = malloc(sizeof(float) * (size_t)V);
  int32_t *order = malloc(sizeof(int32_t) * (size_t)V);
  bool penalty = o->rep_penalty > 0 && o->rep_penalty != 1.0f;
  float *pen = penalty ? malloc(sizeof(float) * (size_t)V) : NULL;
  struct rt_spec_snap s;
  bool snap_ok = rt_spec_snap_init(&s, M->p, lmax + 1) == 0;
  if (tokens) res->tokens = tokens;
  if (!tokens || !lg || !q || !prob || !resid || !order || (penalty && !pen) || !snap_ok) {
    snprintf(err, err_len, "out of memory for speculative decoding");
    rc = CEDAR_ENOMEM;
  }
  bool have_profile = false;
  for (int L = 0; L <= lmax; L++) have_profile |= so->t_round[L] > 0;
  /* the profile verifies lmax + 1 rows where it runs: under key_slot: vendor
   * not before position lmax (graph_verify_rows_max); until then the rounds
   * take the drafts' count (clamped) as a fixed length would */
  bool need_profile = so->adaptive && !have_profile;
  if (!rc && need_profile && graph_verify_rows_max(M->p, r->n_pos) > lmax) {
    rc = rt_spec_profile(M, r, o, lmax, 3, so->t_round, err, err_len);
    need_profile = false;
  }
  memcpy(stats->t_round, so->t_round, sizeof(stats->t_round));
  uint64_t rng = o->seed ^ 0x5bd1e9955bd1e995ull; /* the verifier's draws: not the prefill's stream */
  double t_start = now_s(), steady = 0;
  while (!rc && res->n_tokens < o->max_new) {
    double t0 = now_s();
    int32_t y0 = r->pending;
    int32_t draft[RT_SPEC_LMAX], acc[RT_SPEC_LMAX + 1], tok[RT_SPEC_LMAX + 1];
    float conf[RT_SPEC_LMAX];
    int want = lmax, left = o->max_new - res->n_tokens; /* drafts past max_new are wasted work */
    if (want > left - 1) want = left - 1 > 0 ? left - 1 : 0;
    int cap = graph_verify_rows_max(M->p, r->n_pos) - 1; /* key_slot: vendor early in a request */
    if (want > cap) want = cap;
    if (need_profile && cap >= lmax) { /* the first position that takes lmax + 1 rows */
      rc = rt_spec_profile(M, r, o, lmax, 3, so->t_round, err, err_len);
      memcpy(stats->t_round, so->t_round, sizeof(stats->t_round));
      need_profile = false;
      if (rc) break;
    }
    int L = want ? so->drafter.draft(so->drafter.self, M, r, y0, want, draft, so->drafter.has_q ? q : NULL, conf,
                                     err, err_len)
                 : 0;
    if (L < 0) {
      rc = L;
      break;
    }
    if (so->adaptive && !need_profile && L > 0) { /* SPEC 3.16: L* = argmax (1 + E[A(L)]) / t_round(L) */
      float a[RT_SPEC_LMAX], tr[RT_SPEC_LMAX + 1];
      for (int i = 0; i < L; i++) a[i] = conf[i];
      for (int i = 0; i <= L; i++) tr[i] = (float)so->t_round[i];
      int best = op_dspark_verify_len(NULL, a, tr, L);
      if (best >= 0) L = best;
    }
    tok[0] = y0;
    memcpy(tok + 1, draft, sizeof(int32_t) * (size_t)L);
    r->pending = -1;
    int64_t pos = r->n_pos;
    rc = verify(M, r, &s, tok, L + 1, lg, o, &res->decode, err, err_len);
    if (rc) break;
    int64_t seen = r->n_tokens - (L + 1); /* the ids before tok[0]; verify pushed tok after them */
    int a = o->temperature > 0
                ? rt_spec_accept_sampled(lg, draft, so->drafter.has_q ? q : NULL, L, V, o, r->tokens, seen, pen, &rng,
                                         prob, order, resid, acc, pos, err, err_len)
                : accept_greedy(lg, draft, L, V, o, r->tokens, seen, pen, acc, pos, err, err_len);
    if (a < 0) {
      rc = a;
      break;
    }
    rt_spec_commit(&s, r, a + 1);
    if (so->on_commit) so->on_commit(so->user, r, pos, a + 1);
    for (int i = 0; i <= a; i++) tokens[res->n_tokens++] = acc[i];
    r->pending = acc[a];
    stats->rounds++;
    stats->len_hist[L]++;
    if (L > 0) {
      stats->num_drafts++;
      stats->num_draft_tokens += L;
      stats->num_accepted_tokens += a;
      for (int i = 0; i < a; i++) stats->accepted_per_pos[i]++;
    }
    double dt = now_s() - t0;
    if (stats->rounds == 1)
      res->first_itl_s = dt / (a + 1);
    else
      steady += dt;
  }
  stats->decode_s = now_s() - t_start;
  if (res->n_tokens > o->max_new) res->n_tokens = o->max_new; /* a last round may commit past it */
  int64_t later = res->n_tokens - 2;
  if (later > 0) res->steady_itl_s = steady / (double)later;
  rt_spec_snap_free(&s);
  free(lg);
  free(q);
  free(prob);
  free(resid);
  free(order);
  free(pen);
  return rc;
}

/* ---- one request's rounds inside a batch step (speculate.h: rt_spec_req) ------------ */

int rt_spec_req_init(struct rt_spec_req *x, const struct rt_model *M, struct rt_drafter d, int lmax, float rep_penalty) {
  memset(x, 0, sizeof *x);
  const int V = M->p->model.vocab;
  x->drafter = d;
  x->lmax = lmax;
  x->rep_penalty = rep_penalty;
  x->lg = malloc(sizeof(float) * (size_t)V * (lmax + 1));
  x->pen = rep_penalty > 0 && rep_penalty != 1.0f ? malloc(sizeof(float) * (size_t)V) : NULL;
  if (x->lg && (x->pen || !(rep_penalty > 0 && rep_penalty != 1.0f)) && !rt_spec_snap_init(&x->snap, M->p, lmax + 1))
    return 0;
  free(x->lg);
  free(x->pen);
  memset(x, 0, sizeof *x);
  return CEDAR_ENOMEM;
}

void rt_spec_req_free(struct rt_spec_req *x) {
  if (!x->lg) return;
  rt_spec_snap_free(&x->snap);
  free(x->lg);
  free(x->pen);
  memset(x, 0, sizeof *x);
}

int rt_spec_propose(struct rt_spec_req *x, const struct rt_model *M, struct rt_request *r, int want, char *err,
                    size_t err_len) {
  int32_t y0 = r->pending;
  float conf[RT_SPEC_LMAX];
  if (want > x->lmax) want = x->lmax;
  int cap = graph_verify_rows_max(M->p, r->n_pos) - 1; /* key_slot: vendor early in a request */
  if (want > cap) want = cap;
  int L = want > 0 ? x->drafter.draft(x->drafter.self, M, r, y0, want, x->draft, NULL, conf, err, err_len) : 0;
  if (L < 0) return L;
  if (r->n_tokens + L + 1 > r->max_tokens) {
    snprintf(err, err_len, "the request holds %lld ids and has room for %lld: %d more do not fit",
             (long long)r->n_tokens, (long long)r->max_tokens, L + 1);
    return CEDAR_EINVAL;
  }
  x->L = L;
  x->pos = r->n_pos;
  rt_spec_snap_take(&x->snap, r, L + 1);
  rt_request_push_token(r, y0);
  for (int i = 0; i < L; i++) rt_request_push_token(r, x->draft[i]);
  r->pending = -1;
  return L + 1;
}

int rt_spec_settle_greedy(struct rt_spec_req *x, const struct rt_model *M, struct rt_request *r, int32_t *acc,
                          char *err, size_t err_len) {
  const int V = M->p->model.vocab;
  struct rt_gen_opts o = {.rep_penalty = x->rep_penalty};
  int64_t seen = r->n_tokens - (x->L + 1); /* the ids before the round's first token */
  int a = accept_greedy(x->lg, x->draft, x->L, V, &o, r->tokens, seen, x->pen, acc, x->pos, err, err_len);
  if (a < 0) {
    rt_spec_abandon(r);
    return a;
  }
  rt_spec_commit(&x->snap, r, a + 1);
  r->pending = acc[a];
  return a;
}

void rt_spec_abandon(struct rt_request *r) { r->tail_log = NULL; }

/* ---- the DSpark drafter (runtime/model/mtp.h) as a speculate.h drafter ------------------------------------------------ */

void rt_mtp_drafter_init(struct rt_mtp_drafter *f, const struct rt_mtp *D, struct rt_mtp_cap *cap) {
  memset(f, 0, sizeof *f);
  f->D = D;
  f->cap = cap;
  rt_arena_init(&f->ar, (size_t)1 << 20);
}

void rt_mtp_drafter_free(struct rt_mtp_drafter *f) {
  rt_arena_free(&f->ar);
  memset(f, 0, sizeof *f);
}

static int mtp_draft(void *self, const struct rt_model *M, struct rt_request *r, int32_t y0, int L, int32_t *draft,
                     float *q, float *conf, char *err, size_t err_len) {
  (void)M, (void)q;
  struct rt_mtp_drafter *f = self;
  CEDAR_ASSERT_MSG(r->mtp_cap == f->cap, "the drafter's capture is not attached to the request");
  double t0 = rt_clock();
  rt_arena_reset(&f->ar);
  int B = f->D->B;
  int32_t *d = RT_ALLOC(&f->ar, int32_t, B);
  float *c = RT_ALLOC(&f->ar, float, B);
  int rc = rt_mtp_draft_block(f->D, f->cap, r->n_pos, y0, d, NULL, c, NULL, &f->ar, err, err_len);
  f->draft_s += rt_clock() - t0;
  f->blocks++;
  if (rc) return rc;
  int n = L < B ? L : B;
  for (int i = 0; i < n; i++) draft[i] = d[i], conf[i] = op_sigmoid(c[i]);
  return n;
}

struct rt_drafter rt_mtp_drafter(struct rt_mtp_drafter *f) { return (struct rt_drafter){mtp_draft, f, f->D->B, false}; }
