/* generate.c: prefill then decode, one request (generate.h). */
#include "runtime/gen/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *rt_executor_name(enum rt_executor e) { return e == RT_EXEC_STARPU ? "starpu" : "direct"; }

bool rt_executor_parse(const char *name, enum rt_executor *e) {
  for (int k = RT_EXEC_DIRECT; k <= RT_EXEC_STARPU; k++)
    if (!strcmp(name, rt_executor_name((enum rt_executor)k))) {
      *e = (enum rt_executor)k;
      return true;
    }
  return false;
}

static int64_t edges_of(const struct graph *g) {
  int64_t e = 0;
  for (int k = 0; k < g->n_node; k++) e += g->node[k].n_dep;
  return e;
}

int rt_gen_run_graph(const struct graph *g, const struct rt_model *M, struct rt_request *r, struct rt_exec_out *out,
                     struct rt_exec_stats *st, const struct rt_gen_opts *o, rt_progress_cb progress, bool notify,
                     struct rt_task_time *keep, char *err, size_t err_len) {
  out->one_rank = o->one_rank;
  out->rank = o->rank;
  void *user = progress ? o->user : NULL;
  if (o->executor == RT_EXEC_DIRECT) {
    int rc = rt_exec_direct(g, M, r, out, st, progress, user, err, err_len);
    if (o->after_graph) rc = o->after_graph(o->after_user, g, out, st, NULL, rc, err, err_len);
    if (!rc && notify && o->on_graph) o->on_graph(o->graph_user, g, NULL);
    return rc;
  }
  struct rt_task_time *times =
      keep ? keep : notify && o->on_graph ? cedar_xcalloc((size_t)g->n_node + 1, sizeof(*times)) : NULL;
  int rc = rt_exec_starpu(g, M, r, out, st, times, progress, user, err, err_len);
  if (o->after_graph) rc = o->after_graph(o->after_user, g, out, st, times, rc, err, err_len);
  if (!rc && times && notify && o->on_graph) o->on_graph(o->graph_user, g, times);
  if (times != keep) free(times);
  return rc;
}

/* Global entries r holds, all sources. */
static int64_t entries_of(const struct rt_request *r) {
  int64_t e = 0;
  for (int l = 0; l < r->plan->n_layers; l++) e += r->seq[l].pool ? r->seq[l].n_entries : 0;
  return e;
}

static int64_t entry_bytes_of(const struct rt_request *r) {
  int64_t b = 0;
  for (int l = 0; l < r->plan->n_layers; l++)
    b += r->seq[l].pool ? r->seq[l].n_entries * (int64_t)r->seq[l].pool->entry_bytes : 0;
  return b;
}

/* The longest cached prefix of the prompt into r (SPEC 6.5): its global
 * entries read-only and, when a snapshot continues exactly where they end,
 * the encoder rings, tails and kept encoder outputs at its boundary. */
static int attach_prefix(const struct rt_model *M, struct rt_request *r, const int32_t *prompt, int64_t n,
                         const struct rt_gen_opts *o, struct pc_hit *hit, struct rt_hit_report *h,
                         struct graph_opts *go, char *err, size_t err_len) {
  struct pc_cache *c = o->cache;
  int64_t disk0 = c->stats.disk_blocks;
  pc_lookup(c, prompt, n, n, hit);
  int64_t replay = o->replay >= 0 ? o->replay : M->p->serving.replay_decoder; /* resolved by plan_load */
  /* A snapshot restores encoder layers only, so it needs CED, and the kept
   * encoder outputs must cover the decoder replay. */
  bool ced = M->p->serving.ced && M->first_dec < M->p->n_layers;
  struct pc_snapshot *snap = hit->snap && ced && replay <= r->xe_cap ? hit->snap : NULL;
  if (pc_attach(c, hit, r)) {
    pc_release(c, hit); /* the request is too small to hold the hit: run cold */
    return 0;
  }
  h->global_hit = hit->n_blocks * c->block;
  h->bytes_attached = hit->n_blocks * c->block_bytes;
  h->disk_blocks = c->stats.disk_blocks - disk0;
  h->bytes_from_disk = h->disk_blocks * c->block_bytes;
  h->hit = h->global_hit;
  if (snap) {
    if (pc_snapshot_restore(c, snap, r)) {
      /* pages ran out half way: the state is neither the snapshot's nor the
       * blocks' alone, so the request fails (the cache is untouched) */
      snprintf(err, err_len, "restoring the encoder snapshot at %lld: the KV page pool is exhausted; this request "
               "is dropped", (long long)snap->c);
      return CEDAR_ENOMEM;
    }
    h->hit = snap->c;
    h->swa_hit = true;
    h->bytes_restored = snap->bytes;
  }
  go->hit = h->hit;
  go->swa_hit = h->swa_hit;
  return 0;
}

/* The end of a request with a cache: its full blocks in, its encoder state
 * at its boundary saved (rows of the kept encoder outputs in position order). */
static void finish_prefix(const struct rt_model *M, struct rt_request *r, const struct rt_gen_opts *o,
                          struct pc_hit *hit, struct rt_hit_report *h, double res_prefill_s, int64_t res_prefill_tl) {
  struct pc_cache *c = o->cache;
  h->blocks_inserted = pc_insert(c, r, r->n_pos);
  if (c->disk && res_prefill_tl > 0) {
    /* what recomputing one block costs here, from this prefill: B positions
     * through the encoder (every layer when dense) at the measured seconds
     * per token-layer; the disk tier loads a block only when that is slower */
    int n_enc = 0;
    for (int l = 0; l < M->p->n_layers; l++) n_enc += M->p->layer[l].region == PLAN_ENCODER || !M->p->serving.ced;
    double per_block = res_prefill_s / (double)res_prefill_tl * (double)c->block * n_enc;
    double *est = &c->disk->recompute_s_per_block;
    *est = *est > 0 ? 0.7 * *est + 0.3 * per_block : per_block;
  }
  if (o->save_snapshot && r->xe_cap > 0) {
    int64_t rows = r->n_pos < r->xe_cap ? r->n_pos : r->xe_cap;
    size_t row = rt_xe_row_floats(&M->p->model);
    float *xe = malloc(sizeof(float) * row * (size_t)(rows ? rows : 1));
    bool ok = xe != NULL;
    for (int64_t i = 0; ok && i < rows; i++) {
      int64_t p = r->n_pos - rows + i;
      int slot = (int)(p % r->xe_cap);
      ok = r->xe_pos[slot] == p;
      if (ok) memcpy(xe + (size_t)i * row, r->xe + (size_t)slot * row, sizeof(float) * row);
    }
    if (ok) pc_snapshot_save(c, r, xe, rows);
    free(xe);
  }
  pc_release(c, hit);
}

static int prefill(const struct rt_model *M, struct rt_request *r, int64_t n, const struct rt_gen_opts *o,
                   const struct graph_opts *hit_opts, struct rt_gen_result *res, char *err, size_t err_len) {
  const struct plan *p = M->p;
  struct graph g;
  struct graph_opts go = *hit_opts;
  go.chunk = o->chunk;
  go.replay = o->replay;
  go.all_logits = o->all_logits;
  int rc = graph_build_prefill(&g, p, n, &go, err, err_len);
  if (rc) return rc;
  struct rt_hit_report *h = &res->hit;
  h->encoder_replay_start = g.encoder_start;
  h->encoder_replay = g.hit - g.encoder_start;
  h->encoder_positions = n - g.encoder_start;
  h->decoder_replay = g.replay;
  h->decoder_cached = g.replay && g.hit > n - g.replay ? g.hit - (n - g.replay) : 0;
  int64_t e0 = entries_of(r), b0 = entry_bytes_of(r);
  res->replay = g.replay;
  res->prefill_nodes = g.n_node;
  res->prefill_edges = (int)edges_of(&g);
  res->prefill_rows = g.out_rows;
  res->prefill_logits = malloc(sizeof(float) * (size_t)g.out_rows * p->model.vocab);
  res->prefill_pos = malloc(sizeof(int64_t) * (size_t)g.out_rows);
  if (!res->prefill_logits || !res->prefill_pos) {
    graph_free(&g);
    return CEDAR_ENOMEM;
  }
  struct rt_exec_out out = {.logits = res->prefill_logits, .pos = res->prefill_pos};
  rc = rt_gen_run_graph(&g, M, r, &out, &res->prefill, o, o->progress, true, NULL, err, err_len);
  graph_free(&g);
  if (!rc) r->n_pos = n;
  h->new_entries = entries_of(r) - e0;
  h->new_entry_bytes = entry_bytes_of(r) - b0;
  return rc;
}

struct rt_sample_opts rt_gen_sample_opts(const struct rt_gen_opts *o) {
  return (struct rt_sample_opts){o->temperature, o->top_p, o->top_k, o->rep_penalty, o->teacher, o->n_teacher};
}

/* Prefill the request's tokens [0, n) from the state it holds (hit_opts
 * say where that state ends), then decode. With a cache (rt_generate) the
 * hit is attached before and the blocks inserted after. */
static int run_request(const struct rt_model *M, struct rt_request *r, int64_t n, const struct rt_gen_opts *o,
                       const struct graph_opts *hit_opts, struct pc_hit *hit, double t0, struct rt_gen_result *res,
                       char *err, size_t err_len) {
  const int V = M->p->model.vocab;
  res->tokens = malloc(sizeof(int32_t) * (size_t)o->max_new);
  res->decode_logits = malloc(sizeof(float) * (size_t)V * (size_t)(o->max_new > 1 ? o->max_new - 1 : 1));
  struct rt_sampler smp;
  int rc = rt_sampler_init(&smp, V);
  if (rc || !res->tokens || !res->decode_logits) {
    snprintf(err, err_len, "out of memory for the request's outputs");
    rc = CEDAR_ENOMEM;
  }
  uint64_t rng = o->seed;
  if (!rc) rc = prefill(M, r, n, o, hit_opts, res, err, err_len);
  if (!rc) {
    const float *last = res->prefill_logits + (size_t)(res->prefill_rows - 1) * V;
    rc = rt_gen_take_token(&smp, last, o, &rng, n - 1, r, res, err, err_len);
    res->ttft_s = now_s() - t0;
  }
  if (!rc) rc = rt_gen_decode(M, r, o, &smp, &rng, res, err, err_len);
  if (o->cache) {
    if (!rc)
      finish_prefix(M, r, o, hit, &res->hit, res->prefill.seconds, res->prefill.token_layers);
    else
      pc_release(o->cache, hit);
  }
  rt_sampler_free(&smp);
  return rc;
}

int rt_generate(const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r, const int32_t *prompt,
                int64_t n, const struct rt_gen_opts *o, struct rt_gen_result *res, char *err, size_t err_len) {
  memset(res, 0, sizeof(*res));
  if (n < 1 || o->max_new < 1) {
    snprintf(err, err_len, "a request needs a prompt of at least one token and --max-new of at least 1");
    return CEDAR_EINVAL;
  }
  int64_t cap = n + o->max_new + (o->reserve > 0 ? o->reserve : 0);
  int rc = rt_request_init(r, 0, M->p, pools, cap);
  if (rc) {
    snprintf(err, err_len, "out of memory for a request of %lld tokens", (long long)cap);
    return rc;
  }
  r->mtp_cap = o->mtp_cap;
  for (int64_t i = 0; i < n; i++) rt_request_push_token(r, prompt[i]);
  double t0 = now_s();
  struct pc_hit hit = {0};
  struct graph_opts hit_opts = {.replay = -1};
  if (o->cache && (rc = attach_prefix(M, r, prompt, n, o, &hit, &res->hit, &hit_opts, err, err_len))) {
    pc_release(o->cache, &hit);
    return rc;
  }
  return run_request(M, r, n, o, &hit_opts, &hit, t0, res, err, err_len);
}

int rt_continue(const struct rt_model *M, struct rt_request *r, const int32_t *more, int64_t n_more,
                const struct rt_gen_opts *o, struct rt_gen_result *res, char *err, size_t err_len) {
  memset(res, 0, sizeof(*res));
  int64_t n = r->n_pos + n_more;
  if (n_more < 1 || o->max_new < 1 || r->n_tokens != r->n_pos || n + o->max_new > r->max_tokens) {
    snprintf(err, err_len, "a continuation needs new tokens, --max-new of at least 1 and room in the request "
             "(%lld positions run, %lld ids held, %lld new, %d to generate, capacity %lld)",
             (long long)r->n_pos, (long long)r->n_tokens, (long long)n_more, o->max_new, (long long)r->max_tokens);
    return CEDAR_EINVAL;
  }
  if (o->cache) {
    snprintf(err, err_len, "a continuation keeps its own state; it takes no cache");
    return CEDAR_EINVAL;
  }
  for (int64_t i = 0; i < n_more; i++) rt_request_push_token(r, more[i]);
  r->pending = -1;
  double t0 = now_s();
  /* the live state: global entries, tails, encoder rings and kept encoder
   * outputs all end at n_pos, exactly what a restored snapshot holds */
  struct graph_opts hit_opts = {.replay = -1, .hit = r->n_pos, .swa_hit = true};
  res->hit.hit = r->n_pos;
  res->hit.swa_hit = true;
  struct pc_hit none = {0};
  return run_request(M, r, n, o, &hit_opts, &none, t0, res, err, err_len);
}

void rt_gen_result_free(struct rt_gen_result *res) {
  free(res->tokens);
  free(res->prefill_logits);
  free(res->prefill_pos);
  free(res->decode_logits);
  memset(res, 0, sizeof(*res));
}

/* ---- the prefix-cache steps, for the batch loop (runtime/engine/batch.c) -------- */

int rt_gen_prefix_attach(const struct rt_model *M, struct rt_request *r, const int32_t *prompt, int64_t n,
                         const struct rt_gen_opts *o, struct pc_hit *hit, struct rt_hit_report *h,
                         struct graph_opts *go, char *err, size_t err_len) {
  return attach_prefix(M, r, prompt, n, o, hit, h, go, err, err_len);
}

void rt_gen_prefix_finish(const struct rt_model *M, struct rt_request *r, const struct rt_gen_opts *o,
                          struct pc_hit *hit, struct rt_hit_report *h, double prefill_s, int64_t prefill_tl) {
  finish_prefix(M, r, o, hit, h, prefill_s, prefill_tl);
}
