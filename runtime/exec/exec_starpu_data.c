/* exec_starpu_data.c: StarPU data handles over cedar's real buffers
 * (exec_starpu_data.h). Registration and release run on the submitting
 * thread only (rt_exec_starpu is synchronous), so the owner list needs no
 * lock.
 * Test: tests/test_exec_starpu_data.c (a page read through its handle).
 */
#include "runtime/exec/exec_starpu_data.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "runtime/device/devbind.h"
#include "ops/compressor.h"

/* One owner of handles: a request, or a device state's stand-in (is_dev). */
struct sp_owner {
  bool is_dev;
  void *obj;                     /* struct rt_request * or struct rt_dev_ctx * */
  struct sp_owner *prev, *next;
};

struct sp_req_handles {
  struct sp_owner own;
  starpu_data_handle_t ring_slot[PLAN_MAX_LAYERS], ring_pos[PLAN_MAX_LAYERS], tail[PLAN_MAX_LAYERS];
  starpu_data_handle_t pages[PLAN_MAX_LAYERS]; /* each KV source's page list (exec_starpu_pages.c) */
  starpu_data_handle_t tokens, xe, xe_pos;
};

static struct sp_owner *owners;

static void link_owner(struct sp_owner *o) {
  o->prev = NULL;
  o->next = owners;
  if (owners) owners->prev = o;
  owners = o;
}

static void unlink_owner(struct sp_owner *o) {
  if (o->prev) o->prev->next = o->next;
  else owners = o->next;
  if (o->next) o->next->prev = o->prev;
}

static starpu_data_handle_t reg(void *p, size_t bytes, const char *name) {
  starpu_data_handle_t h;
  starpu_variable_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)p, bytes);
  starpu_data_set_sequential_consistency_flag(h, 0); /* the graph's edges are the only ordering */
  starpu_data_set_name(h, name);
  return h;
}

static void unreg(starpu_data_handle_t *h) {
  if (*h) starpu_data_unregister(*h); /* coherent: the data is back in its home buffer */
  *h = NULL;
}

/* ---- requests ------------------------------------------------------------ */

static void request_release(void *data) {
  struct sp_req_handles *q = data;
  struct rt_request *r = q->own.obj;
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) {
    unreg(&q->ring_slot[l]);
    unreg(&q->ring_pos[l]);
    unreg(&q->tail[l]);
    unreg(&q->pages[l]);
  }
  unreg(&q->tokens);
  unreg(&q->xe);
  unreg(&q->xe_pos);
  unlink_owner(&q->own);
  free(q);
  r->exec_data = NULL;
  r->exec_release = NULL;
}

static struct sp_req_handles *sp__request_handles(struct rt_request *r) {
  if (r->exec_data) return r->exec_data;
  const struct plan *p = r->plan;
  struct sp_req_handles *q = cedar_xcalloc(1, sizeof(*q));
  q->own.obj = r;
  for (int l = 0; l < p->n_layers; l++) {
    struct rt_ring *g = &r->ring[l];
    q->ring_slot[l] = reg(g->slot, (size_t)g->window * g->entry_bytes, "ring");
    q->ring_pos[l] = reg(g->pos, sizeof(int64_t) * (size_t)g->window, "ring pos");
    if (r->tail_buf[l])
      q->tail[l] = reg(r->tail_buf[l], sizeof(float) * op_comp_tail_floats(r->tail[l].ratio, r->tail[l].d), "tail");
    if (r->seq[l].pool) q->pages[l] = sp__pages_register(&r->seq[l]);
  }
  q->tokens = reg(r->tokens, sizeof(int32_t) * (size_t)(r->max_tokens > 0 ? r->max_tokens : 1), "tokens");
  if (r->xe) {
    size_t row = rt_xe_row_floats(&p->model);
    q->xe = reg(r->xe, sizeof(float) * row * (size_t)r->xe_cap, "XE ring");
    q->xe_pos = reg(r->xe_pos, sizeof(int64_t) * (size_t)r->xe_cap, "XE pos");
  }
  link_owner(&q->own);
  r->exec_data = q;
  r->exec_release = request_release;
  return q;
}

/* ---- the stand-in of a device state ----------------------------------------- */

struct sp_dev_handles {
  struct sp_owner own;
  starpu_data_handle_t *page[PLAN_MAX_LAYERS]; /* (pages[l]) */
  starpu_data_handle_t *ring, *pos, *tail;     /* (n_slots * n_layers) */
};

static void dev_release(void *data) {
  struct sp_dev_handles *q = data;
  struct rt_dev_ctx *d = q->own.obj;
  const struct rt_dev_layout *L = &d->A.L;
  for (int l = 0; l < L->n_layers; l++) {
    for (int i = 0; q->page[l] && i < L->pages[l]; i++) unreg(&q->page[l][i]);
    free(q->page[l]);
  }
  for (int i = 0; i < L->n_slots * L->n_layers; i++) {
    unreg(&q->ring[i]);
    unreg(&q->pos[i]);
    unreg(&q->tail[i]);
  }
  free(q->ring);
  free(q->pos);
  free(q->tail);
  unlink_owner(&q->own);
  free(q);
  d->exec_data = NULL;
  d->exec_release = NULL;
}

void sp__dev_register(struct rt_dev_ctx *d) {
  if (d->exec_data || d->state) return; /* registered, or a CUDA state with handles of its own */
  const struct rt_dev_layout *L = &d->A.L;
  struct sp_dev_handles *q = cedar_xcalloc(1, sizeof(*q));
  q->own.is_dev = true;
  q->own.obj = d;
  for (int l = 0; l < L->n_layers; l++) {
    if (!L->pages[l]) continue;
    q->page[l] = cedar_xcalloc((size_t)L->pages[l], sizeof(starpu_data_handle_t));
    for (int i = 0; i < L->pages[l]; i++) q->page[l][i] = reg(rt_dev_addr_page(&d->A, l, i), L->page_bytes[l], "dev page");
  }
  size_t n = (size_t)L->n_slots * (size_t)L->n_layers;
  q->ring = cedar_xcalloc(n, sizeof(starpu_data_handle_t));
  q->pos = cedar_xcalloc(n, sizeof(starpu_data_handle_t));
  q->tail = cedar_xcalloc(n, sizeof(starpu_data_handle_t));
  for (int s = 0; s < L->n_slots; s++)
    for (int l = 0; l < L->n_layers; l++) {
      size_t i = (size_t)s * L->n_layers + l;
      if (L->ring[l].bytes) {
        q->ring[i] = reg(rt_dev_addr_ring(&d->A, s, l), L->ring[l].bytes, "dev ring");
        q->pos[i] = reg(rt_dev_addr_ring_pos(&d->A, s, l), L->ring_pos[l].bytes, "dev ring pos");
      }
      if (L->tail[l].bytes) q->tail[i] = reg(rt_dev_addr_tail(&d->A, s, l), L->tail[l].bytes, "dev tail");
    }
  link_owner(&q->own);
  d->exec_data = q;
  d->exec_release = dev_release;
}

void sp__release_all(void) {
  while (owners) {
    struct sp_owner *o = owners;
    if (o->is_dev)
      dev_release(o); /* own is the first member */
    else
      request_release((struct sp_req_handles *)o); /* own is the first member */
  }
}

/* ---- a task's buffers ---------------------------------------------------- */

static enum starpu_data_access_mode sp_mode(enum graph_access a) {
  switch (a) {
  case GRAPH_R: return STARPU_R;
  case GRAPH_W: return STARPU_W;
  case GRAPH_RW: return STARPU_RW;
  case GRAPH_APPEND: return STARPU_R; /* KV pages only; see add_pages */
  }
  return STARPU_RW;
}

struct tb {
  starpu_data_handle_t *h;
  enum starpu_data_access_mode *m;
  int n, cap;
};

static void tb_add(struct tb *b, starpu_data_handle_t h, enum starpu_data_access_mode m) {
  if (b->n == b->cap) {
    b->cap = b->cap ? 2 * b->cap : 16;
    b->h = cedar_xrealloc(b->h, sizeof(*b->h) * (size_t)b->cap);
    b->m = cedar_xrealloc(b->m, sizeof(*b->m) * (size_t)b->cap);
  }
  b->h[b->n] = h;
  b->m[b->n++] = m;
}

/* The page list of source l, which covers the pages an access binds (those
 * it reads, then those it appends to), in R mode. An append writes only
 * entries past every concurrent reader's view (the graph's entry ranges: a reader of [0, e)
 * never sees entry e or later) and publishes them through n_entries, so
 * the graph's edges are its whole ordering. Declared RW, StarPU's
 * per-handle exclusion would serialize the append with readers of the
 * boundary page, and Debian's StarPU 1.3 leaks a data requester each time
 * such a conflict queues (LeakSanitizer, tests/test_exec_starpu*.c). Pages
 * are only in host memory today; a backend that keeps copies elsewhere
 * moves them with TRANSFER nodes after the append (graph.h). */
static void add_pages(struct tb *b, struct rt_request *r, const struct sp_req_handles *q, int l,
                      const struct graph_use *us) {
  const struct rt_kv_seq *s = &r->seq[l];
  int64_t pe = s->pool->page_entries;
  int64_t end = us->e_read > us->e_w1 ? us->e_read : us->e_w1;
  int64_t pages = (end + pe - 1) / pe;
  CEDAR_ASSERT_MSG(pages <= s->n_pages, "layer %d: %lld pages bound, %d reserved", l, (long long)pages, s->n_pages);
  CEDAR_ASSERT(q->pages[l]);
  if (pages > 0) tb_add(b, q->pages[l], STARPU_R);
}

/* The device state's handle of one region (devbind.h), in its mode. */
static void dev_region(struct tb *b, const struct rt_dev_twin *tw, const struct rt_dev_span *sp) {
  const struct rt_dev_state *ds = tw->state;
  const struct sp_dev_handles *q = tw->ctx ? tw->ctx->exec_data : NULL; /* the stand-in's */
  size_t i = (size_t)tw->slot * (size_t)tw->n_layers + (size_t)sp->layer;
  void *h = NULL;
  switch (sp->kind) {
  case RT_DEV_RING: h = ds ? rt_dev_ring_handle(ds, tw->slot, sp->layer) : q ? q->ring[i] : NULL; break;
  case RT_DEV_RING_POS: h = ds ? rt_dev_ring_pos_handle(ds, tw->slot, sp->layer) : q ? q->pos[i] : NULL; break;
  case RT_DEV_TAIL: h = ds ? rt_dev_tail_handle(ds, tw->slot, sp->layer) : q ? q->tail[i] : NULL; break;
  case RT_DEV_PAGE:
    h = ds ? rt_dev_page_handle(ds, sp->layer, sp->page) : q && q->page[sp->layer] ? q->page[sp->layer][sp->page] : NULL;
    break;
  }
  CEDAR_ASSERT_MSG(h, "device state: no StarPU handle for a region of layer %d (StarPU was not running when the "
                   "state opened)", sp->layer);
  tb_add(b, h, sp->kind != RT_DEV_PAGE && sp->write ? STARPU_RW : STARPU_R); /* pages: R, as add_pages says */
}

/* A device-home node's state accesses: the regions rt_dev_node_regions
 * lists for use u, as the device state's handles. */
static void dev_use(struct tb *b, const struct graph *g, const struct graph_node *nd, struct rt_request *r,
                    const struct rt_dev_twin *tw, int u, struct sp_task_map *map) {
  struct graph_node one = *nd; /* the regions of this one access */
  one.use = &nd->use[u];
  one.n_use = 1;
  int n = rt_dev_node_regions(tw, g, r, &one, NULL, 0);
  struct rt_dev_span *sp = cedar_xcalloc((size_t)(n ? n : 1), sizeof(*sp));
  rt_dev_node_regions(tw, g, r, &one, sp, n);
  const struct graph_use *us = &nd->use[u];
  bool reads = g->data[us->data].state == GRAPH_ST_KV && us->e_read > 0 &&
               (us->mode == GRAPH_R || us->mode == GRAPH_APPEND) && !graph_reads_keys_of(nd, g->data[us->data].layer);
  if (reads) map->kv_pages_first = b->n;
  for (int i = 0; i < n; i++) dev_region(b, tw, &sp[i]);
  if (reads && map->kv_pages_count < 0) map->kv_pages_count = b->n - map->kv_pages_first;
  free(sp);
}

void sp__task_buffers(struct starpu_task *t, const struct graph *g, const struct graph_node *nd, struct rt_request *r,
                      starpu_data_handle_t *act, const struct rt_dev_twin *tw, struct sp_task_map *map) {
  struct sp_req_handles *q = tw ? NULL : sp__request_handles(r);
  struct tb b = {0};
  map->first = cedar_xcalloc((size_t)(nd->n_use ? nd->n_use : 1), sizeof(int));
  map->count = cedar_xcalloc((size_t)(nd->n_use ? nd->n_use : 1), sizeof(int));
  map->kv_pages_first = map->kv_pages_count = map->kv_list = -1;
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_use *us = &nd->use[u];
    const struct graph_data *gd = &g->data[us->data];
    enum starpu_data_access_mode m = sp_mode(us->mode);
    map->first[u] = b.n;
    int l = gd->layer;
    if (gd->kind == GRAPH_ACT || gd->kind == GRAPH_BUS) {
      tb_add(&b, act[us->data], m);
    } else if (gd->kind == GRAPH_STATE && !graph_place_eq(gd->home, nd->place)) {
      /* a twin at another home (TRANSFER's destination): no buffer in this process */
    } else if (gd->kind == GRAPH_STATE && tw) {
      dev_use(&b, g, nd, r, tw, u, map);
    } else if (gd->kind == GRAPH_STATE) {
      switch (gd->state) {
      case GRAPH_ST_RING:
        tb_add(&b, q->ring_slot[l], m);
        tb_add(&b, q->ring_pos[l], m);
        break;
      case GRAPH_ST_TAIL:
        if (q->tail[l]) tb_add(&b, q->tail[l], m); /* ratio 1: no pending rows, no buffer */
        break;
      case GRAPH_ST_KV:
        /* the slot's keys (graph.h: key_src): bound R for the order, read through the seq's own table */
        if (us->e_read > 0 && (us->mode == GRAPH_R || us->mode == GRAPH_APPEND) && !graph_reads_keys_of(nd, l) &&
            map->kv_list < 0)
          map->kv_list = b.n;
        add_pages(&b, r, q, l, us);
        break;
      case GRAPH_ST_TOKENS: tb_add(&b, q->tokens, m); break;
      case GRAPH_ST_XE:
        tb_add(&b, q->xe, m);
        tb_add(&b, q->xe_pos, m);
        break;
      case GRAPH_ST_NONE: break;
      }
    } /* weights: bound through the model (see the header) */
    map->count[u] = b.n - map->first[u];
  }
  map->n_buffers = b.n;
  t->nbuffers = b.n;
  if (b.n > STARPU_NMAXBUFS) { /* freed by starpu_task_destroy */
    t->dyn_handles = cedar_xmalloc(sizeof(*t->dyn_handles) * (size_t)b.n);
    t->dyn_modes = cedar_xmalloc(sizeof(*t->dyn_modes) * (size_t)b.n);
  }
  for (int i = 0; i < b.n; i++) {
    STARPU_TASK_SET_HANDLE(t, b.h[i], i);
    STARPU_TASK_SET_MODE(t, b.m[i], i);
  }
  free(b.h);
  free(b.m);
}

void sp__task_map_free(struct sp_task_map *map) {
  free(map->first);
  free(map->count);
  memset(map, 0, sizeof(*map));
}

/* ---- reading through handles (tests; transfers will read the same way) -- */

static int64_t read_handle(starpu_data_handle_t h, void *dst, size_t cap) {
  if (starpu_data_acquire(h, STARPU_R)) return CEDAR_EINVAL; /* brings the data home first */
  size_t n = starpu_variable_get_elemsize(h);
  const void *p = (const void *)starpu_variable_get_local_ptr(h);
  if (n > cap) n = cap;
  memcpy(dst, p, n);
  starpu_data_release(h);
  return (int64_t)n;
}

int64_t rt_starpu_page_read(struct rt_request *r, int layer, int page, void *dst, size_t cap) {
  struct sp_req_handles *q = r->exec_data;
  if (!rt_starpu_running() || !q || layer < 0 || layer >= PLAN_MAX_LAYERS || !q->pages[layer]) return CEDAR_EINVAL;
  starpu_data_handle_t h = q->pages[layer];
  if (starpu_data_acquire(h, STARPU_R)) return CEDAR_EINVAL;
  const struct rt_kv_seq *s = sp__pages_seq(starpu_data_get_interface_on_node(h, STARPU_MAIN_RAM));
  int64_t n = CEDAR_EINVAL;
  if (page >= 0 && page < s->n_pages) {
    n = (int64_t)(rt_kv_page_bytes(s->pool) < cap ? rt_kv_page_bytes(s->pool) : cap);
    memcpy(dst, s->page_ptr[page], (size_t)n);
  }
  starpu_data_release(h);
  return n;
}

int64_t rt_starpu_ring_read(struct rt_request *r, int layer, void *dst, size_t cap) {
  struct sp_req_handles *q = r->exec_data;
  if (!rt_starpu_running() || !q || layer < 0 || layer >= PLAN_MAX_LAYERS || !q->ring_slot[layer]) return CEDAR_EINVAL;
  return read_handle(q->ring_slot[layer], dst, cap);
}

void rt_starpu_handle_counts(int64_t *pages, int64_t *request_bufs) {
  *pages = *request_bufs = 0;
  for (const struct sp_owner *o = owners; o; o = o->next) {
    if (o->is_dev) continue;
    const struct sp_req_handles *q = (const struct sp_req_handles *)o;
    for (int l = 0; l < PLAN_MAX_LAYERS; l++) {
      *request_bufs += (q->ring_slot[l] != NULL) + (q->ring_pos[l] != NULL) + (q->tail[l] != NULL);
      *pages += q->pages[l] != NULL;
    }
    *request_bufs += (q->tokens != NULL) + (q->xe != NULL) + (q->xe_pos != NULL);
  }
}
