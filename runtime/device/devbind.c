/* devbind.c: a request's state in a device state's slabs (devbind.h):
 * addresses, the twin, a node's regions, the parameter block, the copies,
 * the context and the host-memory stand-in. Host logic in every build; the
 * CUDA context's opening is devstate_cuda.c's.
 * Test: tests/test_devbind.c. */
#include "runtime/device/devbind.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "runtime/node/backend.h"
#include "runtime/node/node.h"

/* ---- addresses ------------------------------------------------------------ */

void *rt_dev_addr_page(const struct rt_dev_addrs *A, int l, int32_t id) {
  if (!A->kv || l < 0 || l >= A->L.n_layers || id < 0 || id >= A->L.pages[l]) return NULL;
  return A->kv + A->L.kv[l].off + (size_t)id * A->L.page_bytes[l];
}

static uint8_t *req_at(const struct rt_dev_addrs *A, int slot, int l, const struct rt_dev_region *r) {
  if (!A->req || l < 0 || l >= A->L.n_layers || !r[l].bytes || slot < 0 || slot >= A->L.n_slots) return NULL;
  return A->req + (size_t)slot * A->L.req_bytes + r[l].off;
}

void *rt_dev_addr_ring(const struct rt_dev_addrs *A, int slot, int l) { return req_at(A, slot, l, A->L.ring); }
int64_t *rt_dev_addr_ring_pos(const struct rt_dev_addrs *A, int slot, int l) {
  return (int64_t *)req_at(A, slot, l, A->L.ring_pos);
}
float *rt_dev_addr_tail(const struct rt_dev_addrs *A, int slot, int l) { return (float *)req_at(A, slot, l, A->L.tail); }

/* ---- the twin ------------------------------------------------------------- */

/* A twin of r in slot of A (r's rings, tails and pools must be the ones
 * the layout was made for). Returns 0 or CEDAR_EINVAL (slot out of range,
 * or a ring or tail whose size differs from the layout's region). */
static int rt_dev_twin_init(struct rt_dev_twin *t, const struct rt_dev_addrs *A, int slot, const struct rt_request *r,
                     char *err, size_t err_len) {
  memset(t, 0, sizeof(*t));
  if (slot < 0 || slot >= A->L.n_slots) {
    snprintf(err, err_len, "device state: request slot %d of %d", slot, A->L.n_slots);
    return CEDAR_EINVAL;
  }
  t->A = A;
  t->slot = slot;
  t->n_layers = A->L.n_layers;
  for (int l = 0; l < t->n_layers; l++) {
    const struct rt_ring *g = &r->ring[l];
    size_t ring_bytes = (size_t)g->window * g->entry_bytes, tail_bytes = 0;
    if (r->tail_buf[l]) tail_bytes = sizeof(float) * op_comp_tail_floats(r->tail[l].ratio, r->tail[l].d);
    if (ring_bytes != A->L.ring[l].bytes || tail_bytes != A->L.tail[l].bytes) {
      snprintf(err, err_len, "device state: layer %d's ring (%zu bytes) or tail (%zu) is not the layout's (%zu, %zu)",
               l, ring_bytes, tail_bytes, A->L.ring[l].bytes, A->L.tail[l].bytes);
      return CEDAR_EINVAL;
    }
    t->ring[l] = *g;
    t->ring[l].slot = rt_dev_addr_ring(A, slot, l);
    t->ring[l].pos = rt_dev_addr_ring_pos(A, slot, l);
    t->tail[l] = r->tail[l];
    if (r->tail_buf[l]) { /* v and g keep their offsets inside the tail's buffer */
      float *dt = rt_dev_addr_tail(A, slot, l);
      t->tail[l].v = r->tail[l].v ? dt + (r->tail[l].v - r->tail_buf[l]) : NULL;
      t->tail[l].g = r->tail[l].g ? dt + (r->tail[l].g - r->tail_buf[l]) : NULL;
    }
    const struct rt_kv_seq *s = &r->seq[l];
    if (s->pool) {
      t->seq[l] = *s;
      t->seq[l].page_ptr = cedar_xcalloc((size_t)(s->cap_pages > 0 ? s->cap_pages : 1), sizeof(uint8_t *));
      t->seq[l].n_pages = t->seq[l].cap_pages = 0;
    }
  }
  return 0;
}

static void rt_dev_twin_free(struct rt_dev_twin *t) {
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) free((void *)t->seq[l].page_ptr);
  memset(t, 0, sizeof(*t));
}

/* The twin's metadata from the host request: ring r0, tail count and pos0,
 * each sequence's n_entries and pages (device addresses of its page ids).
 * Returns 0 or CEDAR_ENOMEM when a page id is past the device pool's pages
 * (err names the source and the capacity). */
static int rt_dev_twin_sync(struct rt_dev_twin *t, const struct rt_request *r, char *err, size_t err_len) {
  for (int l = 0; l < t->n_layers; l++) {
    t->ring[l].r0 = r->ring[l].r0;
    t->tail[l].count = r->tail[l].count;
    t->tail[l].pos0 = r->tail[l].pos0;
    const struct rt_kv_seq *s = &r->seq[l];
    struct rt_kv_seq *d = &t->seq[l];
    if (!s->pool) continue;
    for (int i = 0; i < s->n_pages; i++) {
      d->page_ptr[i] = rt_dev_addr_page(t->A, l, s->page_id[i]);
      if (!d->page_ptr[i]) {
        snprintf(err, err_len, "device state: KV source %d holds page %d, past the device pool's %d pages; "
                 "this request is dropped", l, s->page_id[i], t->A->L.pages[l]);
        return CEDAR_ENOMEM;
      }
    }
    d->page_id = s->page_id;
    d->n_pages = d->cap_pages = s->n_pages; /* an append past the reserved pages fails, never takes a host page */
    d->n_entries = s->n_entries;
  }
  return 0;
}

void rt_dev_bind_node(struct rt_dev_twin *t, const struct graph *g, struct rt_request *r, const struct graph_node *nd,
                      struct rt_bound *st) {
  rt_bind_node(g, r, nd, st);
  if (st->ring) st->ring = &t->ring[st->ring - r->ring];
  if (st->tail) st->tail = &t->tail[st->tail - r->tail];
  if (st->kv_w) {
    st->kv_w = &t->seq[st->kv_w - r->seq];
    st->kv_w_pages = t->aux ? t->aux->pt_dev[st->kv_w - t->seq] : NULL;
  }
  if (st->kv_r) {
    st->kv_r = &t->seq[st->kv_r - r->seq];
    st->kv_r_pages = t->aux ? t->aux->pt_dev[st->kv_r - t->seq] : NULL;
  }
  for (int c = 0; c < 2; c++) /* the slot's keys (key_slot: vendor), on the device as kv_r */
    if (st->key_r[c]) {
      st->key_r[c] = &t->seq[st->key_r[c] - r->seq];
      st->key_r_pages[c] = t->aux ? t->aux->pt_dev[st->key_r[c] - t->seq] : NULL;
    }
}

void rt_dev_node_done(const struct rt_dev_twin *t, struct rt_request *r, const struct rt_bound *st) {
  if (st->ring) r->ring[st->ring - t->ring].r0 = st->ring->r0;
  if (st->tail) {
    struct op_comp_tail *h = &r->tail[st->tail - t->tail];
    h->count = st->tail->count;
    h->pos0 = st->tail->pos0;
  }
  if (st->kv_w) __atomic_store_n(&r->seq[st->kv_w - t->seq].n_entries, st->kv_w->n_entries, __ATOMIC_RELEASE);
}

int rt_reserve_pages(const struct graph *g, struct rt_request *r) {
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    for (int u = 0; u < nd->n_use; u++) {
      const struct graph_use *us = &nd->use[u];
      const struct graph_data *gd = &g->data[us->data];
      if (gd->kind != GRAPH_STATE || gd->state != GRAPH_ST_KV || us->mode != GRAPH_APPEND) continue;
      if (rt_kv_reserve(&r->seq[gd->layer], us->e_w1)) return k;
    }
  }
  return -1;
}

/* ---- regions -------------------------------------------------------------- */

static void span_add(struct rt_dev_span *out, int cap, int *n, struct rt_dev_span s) {
  if (*n < cap) out[*n] = s;
  (*n)++;
}

int rt_dev_node_regions(const struct rt_dev_twin *t, const struct graph *g, const struct rt_request *r,
                        const struct graph_node *nd, struct rt_dev_span *out, int cap) {
  int n = 0;
  const struct rt_dev_addrs *A = t->A;
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_use *us = &nd->use[u];
    const struct graph_data *gd = &g->data[us->data];
    if (gd->kind != GRAPH_STATE || !graph_place_eq(gd->home, nd->place)) continue; /* a TRANSFER's far twin */
    int l = gd->layer;
    bool w = us->mode != GRAPH_R;
    bool per_layer = gd->state == GRAPH_ST_RING || gd->state == GRAPH_ST_TAIL || gd->state == GRAPH_ST_KV;
    if (per_layer && (l < 0 || l >= A->L.n_layers)) continue;
    switch (gd->state) {
    case GRAPH_ST_RING:
      span_add(out, cap, &n, (struct rt_dev_span){RT_DEV_RING, l, -1, rt_dev_addr_ring(A, t->slot, l), A->L.ring[l].bytes, w, false});
      span_add(out, cap, &n, (struct rt_dev_span){RT_DEV_RING_POS, l, -1, rt_dev_addr_ring_pos(A, t->slot, l),
                                                  A->L.ring_pos[l].bytes, w, false});
      break;
    case GRAPH_ST_TAIL:
      if (A->L.tail[l].bytes) /* ratio 1: no pending rows, no region */
        span_add(out, cap, &n, (struct rt_dev_span){RT_DEV_TAIL, l, -1, rt_dev_addr_tail(A, t->slot, l), A->L.tail[l].bytes, w, false});
      break;
    case GRAPH_ST_KV: {
      const struct rt_kv_seq *s = &r->seq[l];
      int64_t pe = s->pool->page_entries;
      int64_t end = us->e_read > us->e_w1 ? us->e_read : us->e_w1;
      int64_t pages = (end + pe - 1) / pe, read_pages = (us->e_read + pe - 1) / pe;
      bool app = us->mode == GRAPH_APPEND && us->e_w1 > us->e_w0;
      int64_t w0 = app ? us->e_w0 / pe : pages;
      int64_t first = us->e_read > 0 ? 0 : w0;
      bool reads = us->mode == GRAPH_R || us->mode == GRAPH_APPEND;
      for (int64_t i = first; i < pages && i < s->n_pages; i++)
        span_add(out, cap, &n, (struct rt_dev_span){RT_DEV_PAGE, l, s->page_id[i], rt_dev_addr_page(A, l, s->page_id[i]),
                                                    A->L.page_bytes[l], app && i >= w0, reads && i < read_pages});
      break;
    }
    case GRAPH_ST_TOKENS: /* host: the token ids stay the request's (devbind.h) */
    case GRAPH_ST_XE:
    case GRAPH_ST_NONE: break;
    }
  }
  return n;
}

/* ---- the parameter block ----------------------------------------------------- */

/* The KV use of nd whose pages a parameter block lists: the source it
 * reads, else the one it appends to (rt_bind_node's kv_r: the last read). */
static const struct graph_use *listed_use(const struct graph *g, const struct graph_node *nd) {
  const struct graph_use *kv = NULL;
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_use *us = &nd->use[u];
    const struct graph_data *gd = &g->data[us->data];
    if (gd->kind != GRAPH_STATE || gd->state != GRAPH_ST_KV || graph_reads_keys_of(nd, gd->layer)) continue;
    bool reads = us->mode == GRAPH_R || (us->mode == GRAPH_APPEND && us->e_read > 0);
    if (!kv || reads) kv = us;
  }
  return kv;
}

int64_t rt_dev_listed_pages(const struct graph *g, const struct rt_request *r, const struct graph_node *nd) {
  const struct graph_use *kv = listed_use(g, nd);
  if (!kv) return 0;
  int64_t pe = r->seq[g->data[kv->data].layer].pool->page_entries, end = kv->e_read > kv->e_w1 ? kv->e_read : kv->e_w1;
  return (end + pe - 1) / pe;
}

int rt_dev_params_fill(struct rt_dev_params *P, const struct graph *g, const struct rt_request *r, int slot,
                       const struct graph_node *nd, char *err, size_t err_len) {
  memset(P, 0, sizeof(*P));
  if (nd->n > 8) {
    snprintf(err, err_len, "%s: %d positions; a graph segment's parameter block takes at most 8", nd->name, nd->n);
    return CEDAR_EINVAL;
  }
  P->pos = nd->a;
  P->n = nd->n;
  P->request = slot;
  const struct rt_ring *ring = nd->layer >= 0 ? &r->ring[nd->layer] : NULL;
  for (int i = 0; i < nd->n; i++) P->ring_slot[i] = ring && ring->window ? (int32_t)((nd->a + i) % ring->window) : -1;
  P->r0 = ring ? (ring->r0 > nd->r0 ? ring->r0 : nd->r0) : 0;
  struct rt_bound st; /* the node's state on the host request: pointers only, nothing is changed */
  rt_bind_node(g, (struct rt_request *)r, nd, &st);
  if (st.tail) {
    P->tail_count = st.tail->count;
    P->tail_pos0 = st.tail->pos0;
  }
  if (st.kv_w) P->w_entries = st.kv_w->n_entries;
  if (st.kv_r) P->r_entries = st.kv_r_end;
  const struct graph_use *kv = listed_use(g, nd);
  if (!kv) return 0;
  const struct rt_kv_seq *s = &r->seq[g->data[kv->data].layer];
  int64_t pages = rt_dev_listed_pages(g, r, nd);
  if (pages > RT_DEV_PARAM_MAX_PAGES || pages > s->n_pages) {
    snprintf(err, err_len, "%s: %lld KV pages (%d held); a graph segment's parameter block takes at most %d", nd->name,
             (long long)pages, s->n_pages, RT_DEV_PARAM_MAX_PAGES);
    return CEDAR_EINVAL;
  }
  P->n_pages = (int32_t)pages;
  memcpy(P->page, s->page_id, sizeof(int32_t) * (size_t)pages);
  return 0;
}

/* ---- copies --------------------------------------------------------------- */

/* Every copy of request r's state in the twin's slot: each layer's ring
 * slots, ring positions and tail, then each page r's sequences hold.
 * Returns how many, up to cap written. */
static int rt_dev_copies(const struct rt_dev_twin *t, const struct rt_request *r, struct rt_dev_copy *out, int cap) {
  int n = 0;
#define ADD(h, d, b)                                                 \
  do {                                                               \
    if ((b) && n < cap) out[n] = (struct rt_dev_copy){(h), (d), (b)}; \
    n += (b) != 0;                                                   \
  } while (0)
  const struct rt_dev_addrs *A = t->A;
  for (int l = 0; l < t->n_layers; l++) {
    ADD(r->ring[l].slot, t->ring[l].slot, A->L.ring[l].bytes);
    ADD(r->ring[l].pos, t->ring[l].pos, A->L.ring_pos[l].bytes);
    ADD(r->tail_buf[l], rt_dev_addr_tail(A, t->slot, l), A->L.tail[l].bytes);
  }
  for (int l = 0; l < t->n_layers; l++) {
    const struct rt_kv_seq *s = &r->seq[l];
    for (int i = 0; s->pool && i < s->n_pages; i++)
      ADD((void *)s->page_ptr[i], rt_dev_addr_page(A, l, s->page_id[i]), A->L.page_bytes[l]);
  }
#undef ADD
  return n;
}

static int copy_all(struct rt_dev_ctx *d, const struct rt_dev_twin *t, const struct rt_request *r, bool up, char *err,
                    size_t err_len) {
  int n = rt_dev_copies(t, r, NULL, 0);
  struct rt_dev_copy *c = cedar_xcalloc((size_t)(n ? n : 1), sizeof(*c));
  rt_dev_copies(t, r, c, n);
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    if (!c[i].dev) {
      snprintf(err, err_len, "device state: a page of this request is past the device pool; it cannot be copied");
      rc = CEDAR_ENOMEM;
    } else {
      rc = up ? d->ops->h2d(c[i].dev, c[i].host, c[i].bytes, err, err_len)
              : d->ops->d2h(c[i].host, c[i].dev, c[i].bytes, err, err_len);
    }
  }
  free(c);
  return rc;
}

/* ---- the context ---------------------------------------------------------- */

bool rt_dev_act_slab(const struct rt_dev_ctx *d, const struct graph *g, void **buf) {
  if (!d->A.act || rt_dev_act_bytes(g) > d->A.L.act_total) return false;
  size_t off = 0;
  for (int k = 0; k < g->n_data; k++) {
    const struct graph_data *gd = &g->data[k];
    if (gd->kind != GRAPH_ACT && gd->kind != GRAPH_BUS) continue;
    buf[k] = d->A.act + off;
    off += ((size_t)gd->bytes + RT_DEV_ALIGN - 1) / RT_DEV_ALIGN * RT_DEV_ALIGN;
  }
  return true;
}

#define AUX_ALIGN(b) (((b) + RT_DEV_ALIGN - 1) / RT_DEV_ALIGN * RT_DEV_ALIGN)

/* Slot s's token ids and page tables in d's memory, sized from the layout
 * (slot_tokens ids; as many page addresses as each pool has pages), made
 * once. */
static int aux_open(struct rt_dev_ctx *d, int s, char *err, size_t err_len) {
  struct rt_dev_aux *x = &d->aux[s];
  if (x->mem) return 0;
  const struct rt_dev_layout *L = &d->A.L;
  const int64_t ntok = L->slot_tokens > 0 ? L->slot_tokens : 1;
  size_t bytes = AUX_ALIGN(sizeof(int32_t) * (size_t)ntok);
  for (int l = 0; l < L->n_layers; l++)
    if (L->pages[l] > 0) bytes += AUX_ALIGN(sizeof(uint8_t *) * (size_t)L->pages[l]);
  x->mem = d->ops->alloc(bytes);
  if (!x->mem) {
    snprintf(err, err_len, "out of %s memory for a request slot's token ids and page tables (%zu bytes); this "
             "request is dropped", d->ops->name, bytes);
    return CEDAR_ENOMEM;
  }
  uint8_t *at = x->mem;
  x->tok_dev = (int32_t *)at;
  x->tok_cap = L->slot_tokens;
  x->tok_host = cedar_xcalloc((size_t)ntok, sizeof(int32_t));
  at += AUX_ALIGN(sizeof(int32_t) * (size_t)ntok);
  for (int l = 0; l < L->n_layers; l++) {
    if (L->pages[l] <= 0) continue;
    x->pt_dev[l] = (const uint8_t **)at;
    x->pt_host[l] = cedar_xcalloc((size_t)L->pages[l], sizeof(uint8_t *));
    x->pt_cap[l] = L->pages[l];
    at += AUX_ALIGN(sizeof(uint8_t *) * (size_t)L->pages[l]);
  }
  return 0;
}

static void aux_close(struct rt_dev_ctx *d, struct rt_dev_aux *x) {
  if (x->mem) d->ops->free(x->mem);
  free(x->tok_host);
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) free(x->pt_host[l]);
  memset(x, 0, sizeof(*x));
}

/* The first index where a[0, n) and b[0, n) differ, n when none. */
static int64_t first_diff(const void *a, const void *b, int64_t n, size_t each) {
  const int64_t chunk = 1024;
  int64_t i = 0;
  while (i < n && !memcmp((const char *)a + (size_t)i * each, (const char *)b + (size_t)i * each,
                          each * (size_t)(n - i < chunk ? n - i : chunk)))
    i += chunk;
  for (; i < n; i++)
    if (memcmp((const char *)a + (size_t)i * each, (const char *)b + (size_t)i * each, each)) break;
  return i < n ? i : n;
}

/* Upload what changed in r's token ids and the twin's page tables since
 * the last call: from the first id (page) that differs from the mirror. */
static int aux_sync(struct rt_dev_ctx *d, struct rt_dev_twin *t, const struct rt_request *r, char *err,
                    size_t err_len) {
  struct rt_dev_aux *x = t->aux;
  if (r->n_tokens > x->tok_cap) {
    snprintf(err, err_len, "device state: %lld token ids, a request slot holds %lld; this request is dropped",
             (long long)r->n_tokens, (long long)x->tok_cap);
    return CEDAR_EINVAL;
  }
  int64_t same = first_diff(r->tokens, x->tok_host, x->tok_n < r->n_tokens ? x->tok_n : r->n_tokens, sizeof(int32_t));
  if (same < r->n_tokens) {
    size_t b = sizeof(int32_t) * (size_t)(r->n_tokens - same);
    int rc = d->ops->h2d(x->tok_dev + same, r->tokens + same, b, err, err_len);
    if (rc) return rc;
    memcpy(x->tok_host + same, r->tokens + same, b);
  }
  x->tok_n = r->n_tokens;
  for (int l = 0; l < t->n_layers; l++) {
    const struct rt_kv_seq *s = &t->seq[l];
    if (!x->pt_dev[l]) continue;
    if (s->n_pages > x->pt_cap[l]) { /* a page past the pool fails the sync first: not reached */
      snprintf(err, err_len, "device state: KV source %d holds %d pages, its page table %d", l, s->n_pages,
               x->pt_cap[l]);
      return CEDAR_EINVAL;
    }
    int64_t k = first_diff(s->page_ptr, x->pt_host[l], x->pt_n[l] < s->n_pages ? x->pt_n[l] : s->n_pages,
                           sizeof(uint8_t *));
    if (k < s->n_pages) {
      size_t b = sizeof(uint8_t *) * (size_t)(s->n_pages - k);
      int rc = d->ops->h2d((void *)(x->pt_dev[l] + k), s->page_ptr + k, b, err, err_len);
      if (rc) return rc;
      memcpy(x->pt_host[l] + k, s->page_ptr + k, b);
    }
    x->pt_n[l] = s->n_pages;
  }
  return 0;
}

/* Give slot s back: its tables stay (their addresses are baked into
 * captured segments), holding nothing for the next request. */
static void twin_drop(struct rt_dev_ctx *d, int s) {
  rt_dev_twin_free(&d->twin[s]);
  d->owner[s] = NULL;
  d->aux[s].tok_n = 0;
  memset(d->aux[s].pt_n, 0, sizeof(d->aux[s].pt_n));
}

const struct rt_cuda_env *rt_dev_env(const struct rt_dev_ctx *d, const struct rt_dev_twin *t,
                                     struct rt_cuda_worker *w, struct rt_cuda_env *env) {
  if (!d || !d->cm || !t) return NULL;
  *env = (struct rt_cuda_env){d->cm, w, t->aux->tok_dev};
  return env;
}

static int slot_of(const struct rt_dev_ctx *d, const struct rt_request *r) {
  for (int s = 0; s < d->A.L.n_slots; s++)
    if (d->owner[s] == r) return s;
  return -1;
}

struct rt_dev_twin *rt_dev_request_twin(struct rt_dev_ctx *d, struct rt_request *r, char *err, size_t err_len) {
  int s = slot_of(d, r);
  if (s < 0) {
    s = slot_of(d, NULL);
    if (s < 0) {
      snprintf(err, err_len, "device state: all %d request slots are taken; this request is dropped", d->A.L.n_slots);
      return NULL;
    }
    if (rt_dev_twin_init(&d->twin[s], &d->A, s, r, err, err_len)) return NULL;
    d->twin[s].aux = &d->aux[s];
    if (aux_open(d, s, err, err_len) || rt_dev_twin_sync(&d->twin[s], r, err, err_len) ||
        copy_all(d, &d->twin[s], r, true, err, err_len)) {
      rt_dev_twin_free(&d->twin[s]);
      return NULL;
    }
    d->twin[s].state = d->state;
    d->twin[s].ctx = d;
    d->owner[s] = r;
  }
  if (rt_dev_twin_sync(&d->twin[s], r, err, err_len) || aux_sync(d, &d->twin[s], r, err, err_len)) return NULL;
  return &d->twin[s];
}

int rt_dev_request_download(struct rt_dev_ctx *d, struct rt_request *r, char *err, size_t err_len) {
  int s = slot_of(d, r);
  return s < 0 ? 0 : copy_all(d, &d->twin[s], r, false, err, err_len);
}

int rt_dev_request_release(struct rt_dev_ctx *d, struct rt_request *r, char *err, size_t err_len) {
  int s = slot_of(d, r);
  if (s < 0) return 0;
  int rc = copy_all(d, &d->twin[s], r, false, err, err_len);
  twin_drop(d, s);
  return rc;
}

/* ---- the host-memory stand-in ------------------------------------------------ */

static int host_copy(void *dst, const void *src, size_t bytes, char *err, size_t err_len) {
  (void)err, (void)err_len;
  memcpy(dst, src, bytes);
  return 0;
}

static void *host_alloc(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64); }

static const struct rt_dev_ops host_ops = {
    .name = "host (test stand-in)", .h2d = host_copy, .d2h = host_copy, .alloc = host_alloc, .free = free};

int rt_dev_ctx_open_host(struct rt_dev_ctx **out, const struct rt_dev_layout *L, char *err, size_t err_len) {
  *out = NULL;
  size_t total = rt_dev_layout_total(L);
  uint8_t *m = aligned_alloc(RT_DEV_ALIGN, total ? total : RT_DEV_ALIGN);
  if (!m) {
    snprintf(err, err_len, "host stand-in of the device state: out of memory for %zu bytes", total);
    return CEDAR_ENOMEM;
  }
  memset(m, 0x5a, total); /* not zero: a read of a region nobody uploaded shows */
  struct rt_dev_ctx *d = cedar_xcalloc(1, sizeof(*d));
  d->ops = &host_ops;
  d->A.L = *L;
  d->A.kv = m;
  d->A.req = m + L->kv_total;
  d->A.act = d->A.req + L->req_total;
  d->A.params = (struct rt_dev_params *)(d->A.act + L->act_total);
  d->dev = -1;
  d->starpu_node = 0; /* STARPU_MAIN_RAM: the StarPU executor registers its handles there */
  d->all_nodes = true;
  d->segments = true;
  d->host_slabs = m;
  d->twin = cedar_xcalloc((size_t)L->n_slots, sizeof(*d->twin));
  d->aux = cedar_xcalloc((size_t)L->n_slots, sizeof(*d->aux));
  d->owner = cedar_xcalloc((size_t)L->n_slots, sizeof(*d->owner));
  *out = d;
  return 0;
}

void rt_dev_ctx_close(struct rt_dev_ctx *d) {
  if (!d) return;
  if (d->exec_release) d->exec_release(d->exec_data);
  for (int s = 0; d->owner && s < d->A.L.n_slots; s++)
    if (d->owner[s]) twin_drop(d, s);
  for (int s = 0; d->aux && s < d->A.L.n_slots; s++) aux_close(d, &d->aux[s]);
  rt_dev_model_close(d);
  free(d->aux);
  free(d->twin);
  free(d->owner);
  rt_cugraph_cache_close(d->graphs);
  rt_dev_weights_free(d->weights);
  rt_dev_state_close(d->state);
  free(d->host_slabs);
  free(d);
}
