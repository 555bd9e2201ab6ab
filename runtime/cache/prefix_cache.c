/* prefix_cache.c: the global prefix cache and the encoder-SWA pool
 * (prefix_cache.h). */
#include "runtime/cache/prefix_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/check.h"
#include "base/log.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- setup --------------------------------------------------------------- */

static int64_t host_memory_bytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? (int64_t)pages * size : 0;
}

int pc_init(struct pc_cache *c, const struct plan *p, struct rt_kv_pool *pools, uint64_t seed,
            int64_t capacity_bytes, int64_t snap_capacity_bytes, char *err, size_t err_len) {
  memset(c, 0, sizeof(*c));
  c->p = p;
  c->pools = pools;
  c->seed = seed;
  c->block = p->serving.prefix_block_tokens;
  if (c->block < 2 || c->block % 2 || c->block % p->serving.page_tokens) {
    snprintf(err, err_len, "serving.cache.prefix_block_tokens = %d must be even and a whole number of pages (%d tokens)",
             c->block, p->serving.page_tokens);
    return CEDAR_EINVAL;
  }
  for (int l = 0; l < p->n_layers; l++) {
    if (!pools[l].entry_bytes) continue;
    /* a page holds page_tokens positions of every source (page_entries = page_tokens / ratio) */
    c->pages_per_block[l] = c->block / p->serving.page_tokens;
    c->sources[c->n_sources++] = l;
    c->block_bytes += (int64_t)c->pages_per_block[l] * (int64_t)rt_kv_page_bytes(&pools[l]);
  }
  if (c->n_sources > 64) {
    snprintf(err, err_len, "the prefix cache handles at most 64 KV sources (the plan has %d)", c->n_sources);
    return CEDAR_EINVAL;
  }
  if (capacity_bytes > 0 && capacity_bytes < c->block_bytes) {
    snprintf(err, err_len, "a prefix cache of %lld bytes cannot hold one block (%lld bytes)", (long long)capacity_bytes,
             (long long)c->block_bytes);
    return CEDAR_EINVAL;
  }
  c->capacity_bytes = capacity_bytes;
  c->snap_capacity_bytes =
      snap_capacity_bytes >= 0 ? snap_capacity_bytes : (int64_t)(p->serving.swa_pool_fraction * host_memory_bytes());
  c->snap_ttl_s = p->serving.swa_pool_ttl_s;
  c->cap = 1024;
  c->tab = cedar_xcalloc((size_t)c->cap, sizeof(*c->tab));
  return 0;
}

static void snapshot_free(struct pc_snapshot *s) {
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) {
    free(s->ring_slot[l]);
    free(s->ring_pos[l]);
    free(s->tail_rows[l]);
    free(s->part[l]);
  }
  free(s->xe);
  memset(s, 0, sizeof(*s));
}

static void block_drop_pages(struct pc_cache *c, struct pc_block *b) {
  for (int i = 0; i < c->n_sources; i++) {
    int l = c->sources[i];
    for (int k = 0; k < c->pages_per_block[l]; k++)
      rt_kv_page_unref(&c->pools[l], b->pages[i * c->pages_per_block[l] + k]);
  }
  free(b->pages);
  b->pages = NULL;
}

void pc_free(struct pc_cache *c) {
  for (int64_t i = 0; i < c->cap; i++)
    if (c->tab[i].used) block_drop_pages(c, &c->tab[i]);
  free(c->tab);
  for (int i = 0; i < c->n_snap; i++) {
    snapshot_free(c->snap[i]);
    free(c->snap[i]);
  }
  free(c->snap);
  memset(c, 0, sizeof(*c));
}

/* ---- keys ---------------------------------------------------------------- */

int64_t pc_keys(const struct pc_cache *c, const int32_t *tok, int64_t n, uint64_t *keys) {
  uint64_t h = c->seed;
  int64_t k = 0;
  for (; (k + 1) * c->block <= n; k++) keys[k] = h = XXH3_64bits_withSeed(tok + k * c->block, sizeof(int32_t) * c->block, h);
  return k;
}

uint64_t pc_prefix_key(const struct pc_cache *c, const int32_t *tok, int64_t n) {
  uint64_t h = c->seed;
  int64_t k = 0;
  for (; (k + 1) * c->block <= n; k++) h = XXH3_64bits_withSeed(tok + k * c->block, sizeof(int32_t) * c->block, h);
  /* the rest of a partial block, and the length, so [0, c) and [0, c') differ */
  int64_t rest = n - k * c->block;
  h = XXH3_64bits_withSeed(tok + k * c->block, sizeof(int32_t) * (size_t)rest, h);
  return XXH3_64bits_withSeed(&n, sizeof(n), h);
}

/* ---- the table ----------------------------------------------------------- */

static struct pc_block *find(const struct pc_cache *c, uint64_t key) {
  for (int64_t i = (int64_t)(key % (uint64_t)c->cap), probes = 0; probes < c->cap; i = (i + 1) % c->cap, probes++) {
    struct pc_block *b = &c->tab[i];
    if (!b->used && !b->tomb) return NULL;
    if (b->used && b->key == key) return b;
  }
  return NULL;
}

static void rehash(struct pc_cache *c, int64_t cap) {
  struct pc_block *old = c->tab;
  int64_t old_cap = c->cap;
  c->tab = cedar_xcalloc((size_t)cap, sizeof(*c->tab));
  c->cap = cap;
  c->tombs = 0;
  for (int64_t i = 0; i < old_cap; i++) {
    if (!old[i].used) continue;
    int64_t j = (int64_t)(old[i].key % (uint64_t)cap);
    while (c->tab[j].used) j = (j + 1) % cap;
    c->tab[j] = old[i];
  }
  free(old);
}

static struct pc_block *insert_slot(struct pc_cache *c, uint64_t key) {
  if ((c->count + c->tombs + 1) * 4 > c->cap * 3) rehash(c, c->count * 4 > c->cap ? 2 * c->cap : c->cap);
  int64_t i = (int64_t)(key % (uint64_t)c->cap);
  while (c->tab[i].used) i = (i + 1) % c->cap;
  if (c->tab[i].tomb) c->tombs--;
  struct pc_block *b = &c->tab[i];
  memset(b, 0, sizeof(*b));
  b->used = true;
  b->key = key;
  c->count++;
  return b;
}

static void erase(struct pc_cache *c, struct pc_block *b) {
  if (b->index > 0) {
    struct pc_block *parent = find(c, b->parent);
    if (parent) parent->children--;
  }
  block_drop_pages(c, b);
  b->used = false;
  b->tomb = true;
  c->count--;
  c->tombs++;
  c->bytes -= c->block_bytes;
  c->stats.evicted++;
}

/* Evict the least recently used unpinned leaf; false when none can go. */
static bool evict_one(struct pc_cache *c) {
  struct pc_block *victim = NULL;
  for (int64_t i = 0; i < c->cap; i++) {
    struct pc_block *b = &c->tab[i];
    if (b->used && !b->pins && !b->children && (!victim || b->last_use < victim->last_use)) victim = b;
  }
  if (!victim) return false;
  erase(c, victim);
  return true;
}

/* ---- the disk tier --------------------------------------------------------- */

/* The layout of a block as the plan gives it (bytes unset). */
static void block_layout(const struct pc_cache *c, struct dt_block *d, uint64_t key, uint64_t parent, int64_t index) {
  memset(d, 0, sizeof(*d));
  d->key = key;
  d->parent = parent;
  d->index = index;
  for (int i = 0; i < c->n_sources; i++) {
    int l = c->sources[i];
    d->part[d->n_parts++] = (struct dt_part){l, c->pools[l].ratio, c->block / c->pools[l].ratio,
                                             c->pools[l].entry_bytes, NULL};
  }
}

/* Entry e of block b's pages of source i. */
static uint8_t *block_entry(const struct pc_cache *c, const struct pc_block *b, int i, int e) {
  int l = c->sources[i], pe = c->pools[l].page_entries;
  return rt_kv_page_mem(&c->pools[l], b->pages[i * c->pages_per_block[l] + e / pe]) +
         (size_t)(e % pe) * c->pools[l].entry_bytes;
}

static void write_through(struct pc_cache *c, const struct pc_block *b) {
  struct dt_block d;
  block_layout(c, &d, b->key, b->parent, b->index);
  for (int i = 0; i < d.n_parts; i++) {
    struct dt_part *p = &d.part[i];
    p->bytes = cedar_xmalloc((size_t)p->n_entries * p->entry_bytes + 1);
    for (int e = 0; e < p->n_entries; e++)
      memcpy(p->bytes + (size_t)e * p->entry_bytes, block_entry(c, b, i, e), p->entry_bytes);
  }
  char err[512];
  if (dt_write(c->disk, &d, err, sizeof err)) LOG_WARN("prefix cache: %s (the block stays in memory only)", err);
  dt_block_free(&d);
}

static int32_t *alloc_block_pages(struct pc_cache *c, int *total);

/* Block `index` with this key from disk into the memory tier; NULL when it
 * is not there, unusable, or not worth loading. */
static struct pc_block *load_from_disk(struct pc_cache *c, uint64_t key, uint64_t parent, int64_t index) {
  struct dt_block want, got;
  block_layout(c, &want, key, parent, index);
  if (!dt_has(c->disk, key)) return NULL;
  /* Recomputing is expected to be faster: skip, but load every 16th such
   * block anyway so the load measurement follows the disk. */
  if (!dt_worth_loading(c->disk, c->block_bytes) && ++c->stats.disk_skipped % 16) return NULL;
  if (dt_read(c->disk, key, &want, &got)) return NULL;
  while (c->capacity_bytes > 0 && c->bytes + c->block_bytes > c->capacity_bytes && evict_one(c)) {
  }
  int total;
  int32_t *pages = c->capacity_bytes > 0 && c->bytes + c->block_bytes > c->capacity_bytes ? NULL
                                                                                         : alloc_block_pages(c, &total);
  if (!pages) {
    dt_block_free(&got);
    return NULL;
  }
  struct pc_block *b = insert_slot(c, key);
  b->index = index;
  b->parent = parent;
  b->pages = pages;
  for (int i = 0; i < got.n_parts; i++)
    for (int e = 0; e < got.part[i].n_entries; e++)
      memcpy(block_entry(c, b, i, e), got.part[i].bytes + (size_t)e * got.part[i].entry_bytes, got.part[i].entry_bytes);
  dt_block_free(&got);
  if (index > 0) {
    struct pc_block *pa = find(c, parent);
    if (pa) pa->children++;
  }
  c->bytes += c->block_bytes;
  c->stats.disk_blocks++;
  return b;
}

/* Fresh pages for one block of every source (refcount 1: the cache's), in
 * the block's source-major order; NULL (nothing held) when a pool is full. */
static int32_t *alloc_block_pages(struct pc_cache *c, int *total) {
  *total = 0;
  for (int i = 0; i < c->n_sources; i++) *total += c->pages_per_block[c->sources[i]];
  int32_t *pages = cedar_xmalloc(sizeof(int32_t) * (size_t)*total);
  int k = 0;
  for (int i = 0; i < c->n_sources; i++) {
    int l = c->sources[i];
    for (int j = 0; j < c->pages_per_block[l]; j++) {
      int32_t id = rt_kv_page_alloc(&c->pools[l]);
      if (id < 0) { /* give back what this block took, source by source */
        for (int i2 = 0, k2 = 0; k2 < k; i2++)
          for (int j2 = 0; j2 < c->pages_per_block[c->sources[i2]] && k2 < k; j2++, k2++)
            rt_kv_page_unref(&c->pools[c->sources[i2]], pages[k2]);
        free(pages);
        return NULL;
      }
      pages[k++] = id;
    }
  }
  return pages;
}

/* ---- lookup, attach, release ---------------------------------------------- */

static struct pc_snapshot *find_snapshot(struct pc_cache *c, const int32_t *tok, int64_t hit_blocks,
                                         int64_t max_tokens) {
  struct pc_snapshot *best = NULL;
  for (int i = 0; i < c->n_snap; i++) {
    struct pc_snapshot *s = c->snap[i];
    if (s->c > max_tokens || s->c / c->block != hit_blocks || (best && s->c <= best->c)) continue;
    if (pc_prefix_key(c, tok, s->c) == s->key) best = s;
  }
  return best;
}

void pc_lookup(struct pc_cache *c, const int32_t *tok, int64_t n, int64_t max_tokens, struct pc_hit *hit) {
  memset(hit, 0, sizeof(*hit));
  if (max_tokens > n) max_tokens = n;
  hit->keys = cedar_xmalloc(sizeof(uint64_t) * (size_t)(max_tokens / c->block + 1));
  int64_t nk = pc_keys(c, tok, max_tokens, hit->keys);
  c->stats.lookups++;
  c->clock++;
  for (int64_t k = 0; k < nk; k++) {
    struct pc_block *b = find(c, hit->keys[k]);
    if (!b && c->disk) b = load_from_disk(c, hit->keys[k], k ? hit->keys[k - 1] : c->seed, k);
    if (!b) break;
    b->pins++;
    b->last_use = c->clock;
    hit->n_blocks++;
  }
  c->stats.hit_blocks += hit->n_blocks;
  c->stats.miss_blocks += nk - hit->n_blocks;
  pc_snapshot_expire(c, now_s());
  hit->snap = find_snapshot(c, tok, hit->n_blocks, max_tokens);
  if (hit->snap) hit->snap->pins++;
  if (hit->snap)
    c->stats.snap_hits++;
  else
    c->stats.snap_misses++;
}

int pc_attach(struct pc_cache *c, const struct pc_hit *hit, struct rt_request *r) {
  for (int i = 0; i < c->n_sources; i++) /* all or nothing */
    if (hit->n_blocks * c->pages_per_block[c->sources[i]] > r->seq[c->sources[i]].cap_pages) return CEDAR_ENOMEM;
  for (int i = 0; i < c->n_sources; i++) {
    int l = c->sources[i], ppb = c->pages_per_block[l];
    struct rt_kv_seq *s = &r->seq[l];
    CEDAR_ASSERT(s->n_entries == 0 && s->n_pages == 0);
    if (hit->n_blocks * ppb > s->cap_pages) return CEDAR_ENOMEM;
    for (int64_t k = 0; k < hit->n_blocks; k++) {
      const struct pc_block *b = find(c, hit->keys[k]);
      CEDAR_ASSERT(b && b->pins > 0);
      for (int j = 0; j < ppb; j++) {
        int32_t id = b->pages[i * ppb + j];
        rt_kv_page_ref(&c->pools[l], id);
        s->page_id[s->n_pages] = id;
        s->page_ptr[s->n_pages] = rt_kv_page_mem(&c->pools[l], id);
        s->n_pages++;
      }
    }
    s->n_entries = hit->n_blocks * c->block / c->pools[l].ratio;
    if (c->pools[l].ratio > 1)
      CEDAR_ASSERT(op_comp_tail_init(&r->tail[l], r->tail_buf[l], c->pools[l].ratio, c->p->model.head_dim,
                                     hit->n_blocks * c->block) == 0);
    else
      r->tail[l].pos0 = hit->n_blocks * c->block;
  }
  return 0;
}

void pc_release(struct pc_cache *c, struct pc_hit *hit) {
  for (int64_t k = 0; k < hit->n_blocks; k++) {
    struct pc_block *b = find(c, hit->keys[k]);
    if (b && b->pins > 0) b->pins--;
  }
  if (hit->snap && hit->snap->pins > 0) hit->snap->pins--;
  free(hit->keys);
  memset(hit, 0, sizeof(*hit));
}

/* ---- insert --------------------------------------------------------------- */

int64_t pc_insert(struct pc_cache *c, const struct rt_request *r, int64_t n) {
  if (n > r->n_tokens) n = r->n_tokens;
  uint64_t *keys = cedar_xmalloc(sizeof(uint64_t) * (size_t)(n / c->block + 1));
  int64_t nk = pc_keys(c, r->tokens, n, keys), added = 0;
  c->clock++;
  for (int64_t k = 0; k < nk; k++) {
    struct pc_block *b = find(c, keys[k]);
    if (b) {
      b->last_use = c->clock;
      continue;
    }
    /* every source must hold the block's pages (it ran through these positions) */
    bool complete = true;
    for (int i = 0; i < c->n_sources; i++) {
      int l = c->sources[i];
      if (r->seq[l].n_entries * c->pools[l].ratio < (k + 1) * c->block) complete = false;
    }
    if (!complete) break;
    struct pc_block *parent = k ? find(c, keys[k - 1]) : NULL;
    if (parent) parent->pins++; /* the block it extends must not go to make room for it */
    while (c->capacity_bytes > 0 && c->bytes + c->block_bytes > c->capacity_bytes && evict_one(c)) {
    }
    if (parent) parent->pins--;
    if (c->capacity_bytes > 0 && c->bytes + c->block_bytes > c->capacity_bytes) break; /* all pinned */
    b = insert_slot(c, keys[k]);
    b->index = k;
    b->parent = k ? keys[k - 1] : c->seed;
    b->last_use = c->clock;
    int total = 0;
    for (int i = 0; i < c->n_sources; i++) total += c->pages_per_block[c->sources[i]];
    b->pages = cedar_xmalloc(sizeof(int32_t) * (size_t)total);
    for (int i = 0; i < c->n_sources; i++) {
      int l = c->sources[i], ppb = c->pages_per_block[l];
      for (int j = 0; j < ppb; j++) {
        int32_t id = r->seq[l].page_id[k * ppb + j];
        rt_kv_page_ref(&c->pools[l], id);
        b->pages[i * ppb + j] = id;
      }
    }
    if (k > 0) {
      struct pc_block *parent = find(c, keys[k - 1]);
      if (parent) parent->children++;
    }
    c->bytes += c->block_bytes;
    c->stats.inserted++;
    added++;
    if (c->disk) write_through(c, b);
  }
  free(keys);
  return added;
}

/* ---- encoder-SWA snapshots ------------------------------------------------ */

static void *copy_of(const void *src, size_t n) {
  void *d = malloc(n ? n : 1);
  if (d && n) memcpy(d, src, n);
  return d;
}

static void snap_remove(struct pc_cache *c, int i) {
  c->snap_bytes -= c->snap[i]->bytes;
  snapshot_free(c->snap[i]);
  free(c->snap[i]);
  c->snap[i] = c->snap[--c->n_snap];
}

/* The oldest unpinned snapshot goes; false when every one is pinned. */
static bool snap_evict_oldest(struct pc_cache *c) {
  int o = -1;
  for (int i = 0; i < c->n_snap; i++)
    if (!c->snap[i]->pins && (o < 0 || c->snap[i]->created < c->snap[o]->created)) o = i;
  if (o < 0) return false;
  snap_remove(c, o);
  c->stats.snap_evicted++;
  return true;
}

int pc_snapshot_save(struct pc_cache *c, const struct rt_request *r, const float *xe, int64_t xe_rows) {
  const struct plan *p = c->p;
  struct pc_snapshot s;
  memset(&s, 0, sizeof(s));
  s.c = r->n_pos;
  s.key = pc_prefix_key(c, r->tokens, s.c);
  s.created = now_s();
  bool ok = true;
  for (int l = 0; l < p->n_layers && ok; l++) {
    if (p->layer[l].region == PLAN_ENCODER) {
      const struct rt_ring *g = &r->ring[l];
      s.ring_slot[l] = copy_of(g->slot, (size_t)g->window * g->entry_bytes);
      s.ring_pos[l] = copy_of(g->pos, sizeof(int64_t) * (size_t)g->window);
      s.ring_r0[l] = g->r0;
      ok = s.ring_slot[l] && s.ring_pos[l];
      s.bytes += (int64_t)g->window * (int64_t)(g->entry_bytes + sizeof(int64_t));
    }
    const struct rt_kv_seq *q = &r->seq[l];
    if (!q->pool || !ok) continue;
    s.tail[l] = r->tail[l];
    s.tail[l].v = s.tail[l].g = NULL;
    if (q->pool->ratio > 1) {
      size_t fl = op_comp_tail_floats(q->pool->ratio, p->model.head_dim);
      s.tail_rows[l] = copy_of(r->tail_buf[l], sizeof(float) * fl);
      ok = s.tail_rows[l] != NULL;
      s.bytes += (int64_t)(sizeof(float) * fl);
    }
    int64_t first = s.c / c->block * c->block / q->pool->ratio;
    s.n_part[l] = (int)(q->n_entries - first);
    s.part[l] = malloc((size_t)s.n_part[l] * q->pool->entry_bytes + 1);
    ok = ok && s.part[l];
    for (int e = 0; ok && e < s.n_part[l]; e++)
      memcpy(s.part[l] + (size_t)e * q->pool->entry_bytes, rt_kv_entry(q, first + e), q->pool->entry_bytes);
    s.bytes += (int64_t)s.n_part[l] * (int64_t)q->pool->entry_bytes;
  }
  size_t row = rt_xe_row_floats(&p->model);
  s.xe_rows = xe_rows;
  s.xe = copy_of(xe, sizeof(float) * row * (size_t)xe_rows);
  s.bytes += (int64_t)(sizeof(float) * row * (size_t)xe_rows);
  if (!ok || !s.xe) {
    snapshot_free(&s);
    return CEDAR_ENOMEM;
  }
  if (s.bytes > c->snap_capacity_bytes) {
    snapshot_free(&s); /* larger than the whole pool (or the pool keeps nothing): not kept */
    return 0;
  }
  for (int i = 0; i < c->n_snap; i++)
    if (c->snap[i]->key == s.key && !c->snap[i]->pins) { /* the same boundary again: keep the newer */
      snap_remove(c, i);
      break;
    }
  while (c->n_snap && c->snap_bytes + s.bytes > c->snap_capacity_bytes && snap_evict_oldest(c)) {
  }
  if (c->snap_bytes + s.bytes > c->snap_capacity_bytes) {
    snapshot_free(&s); /* everything left is pinned by running hits */
    return 0;
  }
  if (c->n_snap == c->cap_snap) {
    c->cap_snap = c->cap_snap ? 2 * c->cap_snap : 8;
    c->snap = cedar_xrealloc(c->snap, sizeof(*c->snap) * (size_t)c->cap_snap);
  }
  struct pc_snapshot *kept = cedar_xmalloc(sizeof(*kept));
  *kept = s;
  c->snap[c->n_snap++] = kept;
  c->snap_bytes += s.bytes;
  c->stats.snap_saved++;
  return 0;
}

int pc_snapshot_restore(const struct pc_cache *c, const struct pc_snapshot *s, struct rt_request *r) {
  const struct plan *p = c->p;
  if (s->xe_rows && r->xe_cap) { /* the kept encoder outputs, into the request's ring */
    size_t row = rt_xe_row_floats(&p->model);
    for (int64_t i = 0; i < s->xe_rows; i++) {
      int64_t pos = s->c - s->xe_rows + i;
      int slot = (int)(pos % r->xe_cap);
      memcpy(r->xe + (size_t)slot * row, s->xe + (size_t)i * row, sizeof(float) * row);
      r->xe_pos[slot] = pos;
    }
  }
  for (int l = 0; l < p->n_layers; l++) {
    if (s->ring_slot[l]) {
      struct rt_ring *g = &r->ring[l];
      memcpy(g->slot, s->ring_slot[l], (size_t)g->window * g->entry_bytes);
      memcpy(g->pos, s->ring_pos[l], sizeof(int64_t) * (size_t)g->window);
      g->r0 = s->ring_r0[l];
    }
    struct rt_kv_seq *q = &r->seq[l];
    if (!q->pool) continue;
    CEDAR_ASSERT(q->n_entries * q->pool->ratio == s->c / c->block * c->block);
    if (s->n_part[l]) {
      int rc = rt_kv_append(q, s->part[l], s->n_part[l]);
      if (rc) return rc;
    }
    struct op_comp_tail *t = &r->tail[l];
    t->count = s->tail[l].count;
    t->pos0 = s->tail[l].pos0;
    if (s->tail_rows[l])
      memcpy(r->tail_buf[l], s->tail_rows[l], sizeof(float) * op_comp_tail_floats(q->pool->ratio, p->model.head_dim));
  }
  return 0;
}

int pc_snapshot_expire(struct pc_cache *c, double now) {
  int gone = 0;
  for (int i = 0; i < c->n_snap;) {
    if (c->snap_ttl_s > 0 && now - c->snap[i]->created > c->snap_ttl_s && !c->snap[i]->pins) {
      snap_remove(c, i);
      gone++;
      c->stats.snap_evicted++;
    } else {
      i++;
    }
  }
  return gone;
}
