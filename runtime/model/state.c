/* state.c: page pools, page tables, SWA rings, tails and token history
 * (state.h explains the layout and the accounting). */
#include "runtime/model/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/formats.h"
#include "base/check.h"

/* Pages are allocated one at a time, aligned for vector loads. */
#define RT_PAGE_ALIGN 64

/* Every format a checked plan names is stored (op_kv_pack); this only
 * guards a plan that skipped checking. */
static int formats_supported(const struct plan_model *m, char *err, size_t err_len) {
  const struct { const char *name; const struct plan_format *f; int w; } c[] = {
      {"main_kv", &m->main_kv, m->head_dim}, {"indexer_k", &m->indexer_k, m->idx_head_dim}, {"swa", &m->swa, m->head_dim}};
  for (int i = 0; i < 3; i++) {
    struct op_kv_format f = plan_kv_format(m, c[i].f);
    const char *why = op_kv_check(&f, c[i].w);
    if (why) {
      snprintf(err, err_len, "formats.%s: %s", c[i].name, why);
      return CEDAR_EUNSUPPORTED;
    }
  }
  return 0;
}

int rt_kv_pools_init(struct rt_kv_pool *pools, const struct plan *p, char *err, size_t err_len) {
  const struct plan_model *m = &p->model;
  int rc = formats_supported(m, err, err_len);
  if (rc) return rc;
  memset(pools, 0, sizeof(*pools) * PLAN_MAX_LAYERS);
  for (int l = 0; l < p->n_layers; l++) {
    const struct plan_layer *L = &p->layer[l];
    if (!plan_is_kv_source(L)) continue;
    struct rt_kv_pool *pool = &pools[l];
    pool->layer = l;
    pool->ratio = L->ratio;
    pool->page_entries = p->serving.page_tokens / L->ratio;
    if (pool->page_entries < 1) pool->page_entries = 1;
    pool->main_w = m->head_dim;
    pool->main_fmt = plan_kv_format(m, &m->main_kv);
    pool->idx_w = m->idx_head_dim;
    pool->idx_fmt = plan_kv_format(m, &m->indexer_k);
    pool->main_bytes = op_kv_bytes(&pool->main_fmt, pool->main_w);
    pool->idx_bytes = op_kv_bytes(&pool->idx_fmt, pool->idx_w);
    pool->entry_bytes = pool->main_bytes + pool->idx_bytes;
    pthread_mutex_init(&pool->mu, NULL);
  }
  return 0;
}

void rt_kv_pools_free(struct rt_kv_pool *pools, int n_layers) {
  for (int l = 0; l < n_layers; l++) {
    struct rt_kv_pool *pool = &pools[l];
    if (!pool->entry_bytes) continue;
    if (pool->exec_release) pool->exec_release(pool->exec_data); /* handles before the memory they cover */
    for (int i = 0; i < pool->n_pages; i++) free(pool->page[i]);
    free(pool->page);
    free(pool->ref);
    free(pool->free_ids);
    pthread_mutex_destroy(&pool->mu);
    memset(pool, 0, sizeof(*pool));
  }
}

size_t rt_kv_page_bytes(const struct rt_kv_pool *pool) {
  size_t bytes = (size_t)pool->page_entries * pool->entry_bytes;
  return (bytes + RT_PAGE_ALIGN - 1) / RT_PAGE_ALIGN * RT_PAGE_ALIGN;
}

static bool pool_grow(struct rt_kv_pool *pool) {
  int cap = pool->cap ? 2 * pool->cap : 16;
  uint8_t **page = realloc(pool->page, sizeof(*page) * cap);
  if (!page) return false;
  pool->page = page;
  int32_t *ref = realloc(pool->ref, sizeof(*ref) * cap);
  if (!ref) return false;
  pool->ref = ref;
  int32_t *fr = realloc(pool->free_ids, sizeof(*fr) * cap);
  if (!fr) return false;
  pool->free_ids = fr;
  pool->cap = cap;
  return true;
}

int32_t rt_kv_page_alloc(struct rt_kv_pool *pool) {
  int32_t id = -1;
  pthread_mutex_lock(&pool->mu);
  if (pool->max_pages > 0 && pool->pages_in_use >= pool->max_pages) {
    /* full: the caller fails its request */
  } else if (pool->n_free > 0) {
    id = pool->free_ids[--pool->n_free];
  } else if (pool->n_pages < pool->cap || pool_grow(pool)) {
    uint8_t *mem = aligned_alloc(RT_PAGE_ALIGN, rt_kv_page_bytes(pool));
    if (mem) {
      id = pool->n_pages++;
      pool->page[id] = mem;
    }
  }
  if (id >= 0) {
    pool->ref[id] = 1;
    pool->pages_in_use++;
  }
  pthread_mutex_unlock(&pool->mu);
  return id;
}

uint8_t *rt_kv_page_mem(struct rt_kv_pool *pool, int32_t id) {
  pthread_mutex_lock(&pool->mu);
  CEDAR_ASSERT(id >= 0 && id < pool->n_pages);
  uint8_t *mem = pool->page[id];
  pthread_mutex_unlock(&pool->mu);
  return mem;
}

void rt_kv_page_ref(struct rt_kv_pool *pool, int32_t id) {
  pthread_mutex_lock(&pool->mu);
  CEDAR_ASSERT(id >= 0 && id < pool->n_pages && pool->ref[id] > 0);
  pool->ref[id]++;
  pthread_mutex_unlock(&pool->mu);
}

void rt_kv_page_unref(struct rt_kv_pool *pool, int32_t id) {
  pthread_mutex_lock(&pool->mu);
  CEDAR_ASSERT(id >= 0 && id < pool->n_pages && pool->ref[id] > 0);
  if (--pool->ref[id] == 0) {
    pool->free_ids[pool->n_free++] = id;
    pool->pages_in_use--;
  }
  pthread_mutex_unlock(&pool->mu);
}

static int ring_init(struct rt_ring *g, int window, size_t entry_bytes) {
  g->window = window;
  g->entry_bytes = entry_bytes;
  g->slot = malloc((size_t)window * entry_bytes);
  g->pos = malloc(sizeof(int64_t) * (size_t)window);
  if (!g->slot || !g->pos) return CEDAR_ENOMEM;
  rt_ring_reset(g, 0);
  return 0;
}

void rt_ring_reset(struct rt_ring *g, int64_t r0) {
  for (int i = 0; i < g->window; i++) g->pos[i] = -1;
  g->r0 = r0;
}

void rt_ring_put(struct rt_ring *g, int64_t p, const uint8_t *entry) {
  int slot = (int)(p % g->window);
  memcpy(g->slot + (size_t)slot * g->entry_bytes, entry, g->entry_bytes);
  g->pos[slot] = p;
}

int rt_request_init(struct rt_request *r, int id, const struct plan *p, struct rt_kv_pool *pools,
                    int64_t max_tokens) {
  const struct plan_model *m = &p->model;
  memset(r, 0, sizeof(*r));
  r->id = id;
  r->plan = p;
  r->max_tokens = max_tokens;
  r->pending = -1;
  r->tokens = malloc(sizeof(int32_t) * (size_t)(max_tokens > 0 ? max_tokens : 1));
  if (!r->tokens) goto fail;
  bool has_dec = false;
  for (int l = 0; l < p->n_layers; l++) has_dec |= p->layer[l].region == PLAN_DECODER;
  if (p->serving.ced && has_dec) {
    int cap = p->serving.replay_decoder; /* resolved by plan_load (the window unless set) */
    r->xe_cap = cap > 0 ? cap : 1;
    r->xe = malloc(sizeof(float) * (size_t)r->xe_cap * rt_xe_row_floats(m));
    r->xe_pos = malloc(sizeof(int64_t) * (size_t)r->xe_cap);
    if (!r->xe || !r->xe_pos) goto fail;
    for (int i = 0; i < r->xe_cap; i++) r->xe_pos[i] = -1;
  }
  const struct op_kv_format swa_fmt = plan_kv_format(m, &m->swa);
  size_t swa_bytes = op_kv_bytes(&swa_fmt, m->head_dim);
  for (int l = 0; l < p->n_layers; l++) {
    if (ring_init(&r->ring[l], m->window, swa_bytes)) goto fail;
    if (!pools[l].entry_bytes) continue;
    struct rt_kv_seq *s = &r->seq[l];
    struct rt_kv_pool *pool = &pools[l];
    s->pool = pool;
    int64_t entries = max_tokens / pool->ratio + 1;
    s->cap_pages = (int)((entries + pool->page_entries - 1) / pool->page_entries);
    s->page_id = malloc(sizeof(int32_t) * (size_t)s->cap_pages);
    s->page_ptr = malloc(sizeof(*s->page_ptr) * (size_t)s->cap_pages);
    if (!s->page_id || !s->page_ptr) goto fail;
    float *buf = NULL;
    if (pool->ratio > 1) {
      buf = malloc(sizeof(float) * op_comp_tail_floats(pool->ratio, m->head_dim));
      if (!buf) goto fail;
    }
    r->tail_buf[l] = buf;
    CEDAR_ASSERT(op_comp_tail_init(&r->tail[l], buf, pool->ratio, m->head_dim, 0) == 0);
  }
  return 0;
fail:
  rt_request_free(r);
  return CEDAR_ENOMEM;
}

void rt_request_free(struct rt_request *r) {
  if (!r->plan) return;
  if (r->exec_release) r->exec_release(r->exec_data);
  for (int l = 0; l < r->plan->n_layers; l++) {
    struct rt_kv_seq *s = &r->seq[l];
    for (int i = 0; i < s->n_pages; i++) rt_kv_page_unref(s->pool, s->page_id[i]);
    free(s->page_id);
    free(s->page_ptr);
    free(r->tail_buf[l]);
    free(r->ring[l].slot);
    free(r->ring[l].pos);
  }
  free(r->tokens);
  free(r->xe);
  free(r->xe_pos);
  memset(r, 0, sizeof(*r));
}

int rt_kv_reserve(struct rt_kv_seq *s, int64_t entries) {
  struct rt_kv_pool *pool = s->pool;
  int64_t pages = (entries + pool->page_entries - 1) / pool->page_entries;
  if (pages > s->cap_pages) return CEDAR_ENOMEM;
  while (s->n_pages < pages) {
    int32_t id = rt_kv_page_alloc(pool);
    if (id < 0) return CEDAR_ENOMEM;
    s->page_id[s->n_pages] = id;
    s->page_ptr[s->n_pages] = rt_kv_page_mem(pool, id);
    s->n_pages++;
  }
  return 0;
}

int rt_kv_append(struct rt_kv_seq *s, const uint8_t *entries, int n) {
  struct rt_kv_pool *pool = s->pool;
  int64_t need = s->n_entries + n;
  int64_t pages = (need + pool->page_entries - 1) / pool->page_entries;
  if (pages > s->cap_pages) return CEDAR_ENOMEM;
  int added = 0;
  while (s->n_pages < pages) {
    int32_t id = rt_kv_page_alloc(pool);
    if (id < 0) {
      while (added-- > 0) rt_kv_page_unref(pool, s->page_id[--s->n_pages]);
      return CEDAR_ENOMEM;
    }
    s->page_id[s->n_pages] = id;
    s->page_ptr[s->n_pages] = rt_kv_page_mem(pool, id);
    s->n_pages++;
    added++;
  }
  for (int i = 0; i < n; i++) {
    int64_t e = s->n_entries + i;
    uint8_t *dst = (uint8_t *)s->page_ptr[e / pool->page_entries] + (size_t)(e % pool->page_entries) * pool->entry_bytes;
    memcpy(dst, entries + (size_t)i * pool->entry_bytes, pool->entry_bytes);
  }
  __atomic_store_n(&s->n_entries, need, __ATOMIC_RELEASE);
  return 0;
}

struct op_kv_view rt_kv_view(const struct rt_kv_seq *s) {
  const struct rt_kv_pool *pool = s->pool;
  return (struct op_kv_view){
      .pages = s->page_ptr,
      .page_entries = pool->page_entries,
      .entry_bytes = pool->entry_bytes,
      .main_off = 0,
      .idx_off = pool->main_bytes,
      .n_entries = __atomic_load_n(&s->n_entries, __ATOMIC_ACQUIRE),
      .ratio = pool->ratio,
      .main_w = pool->main_w,
      .idx_w = pool->idx_w,
      .main_fmt = pool->main_fmt,
      .idx_fmt = pool->idx_fmt,
  };
}

const uint8_t *rt_kv_entry(const struct rt_kv_seq *s, int64_t e) {
  CEDAR_ASSERT(e >= 0 && e < s->n_entries);
  return s->page_ptr[e / s->pool->page_entries] + (size_t)(e % s->pool->page_entries) * s->pool->entry_bytes;
}

int rt_request_push_token(struct rt_request *r, int32_t tok) {
  if (r->n_tokens >= r->max_tokens) return CEDAR_EINVAL;
  r->tokens[r->n_tokens++] = tok;
  return 0;
}

void rt_request_bytes(const struct rt_request *r, struct rt_state_bytes *b) {
  memset(b, 0, sizeof(*b));
  const struct plan *p = r->plan;
  for (int l = 0; l < p->n_layers; l++) {
    const struct rt_kv_seq *s = &r->seq[l];
    b->swa_bytes += (int64_t)r->ring[l].window * (int64_t)r->ring[l].entry_bytes;
    if (!s->pool) continue;
    b->kv_entries += s->n_entries;
    b->kv_entry_bytes += s->n_entries * (int64_t)s->pool->entry_bytes;
    b->kv_page_bytes += (int64_t)s->n_pages * (int64_t)rt_kv_page_bytes(s->pool);
    if (s->pool->ratio > 1) b->tail_bytes += (int64_t)op_comp_tail_floats(s->pool->ratio, p->model.head_dim) * 4;
  }
  b->token_bytes = r->max_tokens * (int64_t)sizeof(int32_t);
  b->xe_bytes = (int64_t)r->xe_cap * (int64_t)(sizeof(float) * rt_xe_row_floats(&p->model) + sizeof(int64_t));
}
