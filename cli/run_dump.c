/* run_dump.c: see run_dump.h. */
#include "cli/run_dump.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "cli/cli.h"
#include "runtime/model/round_trace.h"
#include "runtime/load/safetensors.h"

struct tlist {
  struct st_tensor *t;
  char **names;
  void **owned;
  size_t n, cap;
};

static void add(struct tlist *L, const char *name, enum st_dtype dt, int ndim, int64_t d0, int64_t d1,
                const void *data, void *owned) {
  if (L->n == L->cap) {
    L->cap = L->cap ? 2 * L->cap : 64;
    L->t = cedar_xrealloc(L->t, sizeof(*L->t) * L->cap);
    L->names = cedar_xrealloc(L->names, sizeof(char *) * L->cap);
    L->owned = cedar_xrealloc(L->owned, sizeof(void *) * L->cap);
  }
  L->names[L->n] = cedar_xstrdup(name);
  L->owned[L->n] = owned;
  struct st_tensor *t = &L->t[L->n++];
  memset(t, 0, sizeof(*t));
  t->name = L->names[L->n - 1];
  t->dtype = dt;
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->nbytes = (uint64_t)d0 * (ndim > 1 ? (uint64_t)d1 : 1) * st_dtype_size(dt);
  t->data = data;
}

static void add_source(struct tlist *L, const struct rt_request *r, int l) {
  const struct rt_kv_seq *s = &r->seq[l];
  const struct rt_kv_pool *pool = s->pool;
  int64_t n = s->n_entries;
  uint8_t *mk = cedar_xmalloc(n * pool->main_bytes + 1), *ik = cedar_xmalloc(n * pool->idx_bytes + 1);
  for (int64_t e = 0; e < n; e++) {
    const uint8_t *src = rt_kv_entry(s, e);
    memcpy(mk + e * pool->main_bytes, src, pool->main_bytes);
    memcpy(ik + e * pool->idx_bytes, src + pool->main_bytes, pool->idx_bytes);
  }
  char name[48];
  snprintf(name, sizeof(name), "L%d.main_kv", l);
  add(L, name, ST_U8, 2, n, (int64_t)pool->main_bytes, mk, mk);
  snprintf(name, sizeof(name), "L%d.indexer_k", l);
  add(L, name, ST_U8, 2, n, (int64_t)pool->idx_bytes, ik, ik);
  const struct op_comp_tail *t = &r->tail[l];
  int64_t *tp = cedar_xmalloc(sizeof(int64_t) * (size_t)(t->count + 1));
  for (int i = 0; i < t->count; i++) tp[i] = t->pos0 + i;
  snprintf(name, sizeof(name), "L%d.tail_pos", l);
  add(L, name, ST_I64, 1, t->count, 0, tp, tp);
}

static void add_ring(struct tlist *L, const struct rt_request *r, int l) {
  const struct rt_ring *g = &r->ring[l];
  int *idx = cedar_xmalloc(sizeof(int) * (size_t)g->window), k = 0;
  for (int i = 0; i < g->window; i++)
    if (g->pos[i] >= 0) idx[k++] = i;
  for (int i = 1; i < k; i++) /* by position; a window is small */
    for (int j = i; j > 0 && g->pos[idx[j - 1]] > g->pos[idx[j]]; j--) {
      int t = idx[j];
      idx[j] = idx[j - 1];
      idx[j - 1] = t;
    }
  uint8_t *bytes = cedar_xmalloc((size_t)k * g->entry_bytes + 1);
  int64_t *pos = cedar_xmalloc(sizeof(int64_t) * (size_t)(k + 1));
  for (int i = 0; i < k; i++) {
    memcpy(bytes + (size_t)i * g->entry_bytes, g->slot + (size_t)idx[i] * g->entry_bytes, g->entry_bytes);
    pos[i] = g->pos[idx[i]];
  }
  free(idx);
  char name[48];
  snprintf(name, sizeof(name), "L%d.swa", l);
  add(L, name, ST_U8, 2, k, (int64_t)g->entry_bytes, bytes, bytes);
  snprintf(name, sizeof(name), "L%d.swa_pos", l);
  add(L, name, ST_I64, 1, k, 0, pos, pos);
}

int run_dump_write(const char *path, const struct rt_model *M, const struct rt_request *r,
                  const struct rt_gen_result *res, char *err, size_t err_len) {
  const struct plan *p = M->p;
  const int V = p->model.vocab;
  struct tlist L = {0};
  add(&L, "prefill.logits", ST_F32, 2, res->prefill_rows, V, res->prefill_logits, NULL);
  add(&L, "prefill.positions", ST_I64, 1, res->prefill_rows, 0, res->prefill_pos, NULL);
  if (res->n_tokens > 1) add(&L, "decode.logits", ST_F32, 2, res->n_tokens - 1, V, res->decode_logits, NULL);
  int64_t *tok = cedar_xmalloc(sizeof(int64_t) * (size_t)(r->n_tokens + 1));
  for (int64_t i = 0; i < r->n_tokens; i++) tok[i] = r->tokens[i];
  add(&L, "tokens", ST_I64, 1, r->n_tokens, 0, tok, tok);
  for (int l = 0; l < p->n_layers; l++) {
    if (r->seq[l].pool) add_source(&L, r, l);
    add_ring(&L, r, l);
  }
  char tl[32];
  snprintf(tl, sizeof(tl), "%" PRId64, res->prefill.token_layers + res->decode.token_layers);
  struct st_meta meta[] = {{"cedar.plan", p->name}, {"cedar.token_layers", tl}};
  int rc = st_write(path, L.t, L.n, meta, 2, err, err_len);
  for (size_t i = 0; i < L.n; i++) {
    free(L.names[i]);
    free(L.owned[i]);
  }
  free(L.t);
  free(L.names);
  free(L.owned);
  return rc;
}

int run_round_begin(const char *path) {
  if (cli_check_out("run", "--dump-roundings", path)) return 1;
  rt_rtrace_begin();
  return 0;
}

int run_round_write(const char *path) {
  char err[512];
  if (!rt_rtrace_write(path, err, sizeof err)) return 0;
  fprintf(stderr, "cedar run: --dump-roundings: %s\n", err);
  return 1;
}
