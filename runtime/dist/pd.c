/* pd.c: the P/D state package (pd.h): roles, the messages TRANSFER nodes
 * make, applying them on D, the package record and the ready barrier. The
 * driver of one request is pd_run.c. */
#include "runtime/node/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/dist/pd.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "base/check.h"
#include "ops/sample.h"
#include "runtime/dist/pd_internal.h"
#include "scheduler/plan_cost_pd.h"
#include "scheduler/plan_place.h"

#define META_MAGIC 0x4d504443u /* "CDPM" */

const char *rt_pd_class_name(enum rt_pd_class c) {
  static const char *const n[RT_PD_CLASS_COUNT] = {"global KV", "encoder SWA", "decoder SWA", "tails",
                                                   "encoder outputs", "metadata"};
  return c < RT_PD_CLASS_COUNT ? n[c] : "?";
}

enum rt_pd_fault pd_fault;
int pd_fault_at;
/* rt_pd_set_fault with K for P_DIES / D_DIES. */
static void rt_pd_set_fault_at(enum rt_pd_fault f, int k) {
  pd_fault = f;
  pd_fault_at = k;
}
void rt_pd_set_fault(enum rt_pd_fault f) { rt_pd_set_fault_at(f, 0); }

int rt_pd_fault_parse(const char *s, char *err, size_t err_len) {
  static const struct {
    const char *name;
    enum rt_pd_fault f;
    bool k;
  } tab[] = {{"hold-kv", RT_PD_FAULT_INFLIGHT, false}, {"corrupt", RT_PD_FAULT_CORRUPT, false},
             {"truncate", RT_PD_FAULT_TRUNCATE, false},  {"p-dies:", RT_PD_FAULT_P_DIES, true},
             {"d-dies:", RT_PD_FAULT_D_DIES, true}};
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
    size_t n = strlen(tab[i].name);
    if (tab[i].k ? strncmp(s, tab[i].name, n) : strcmp(s, tab[i].name)) continue;
    char *end = NULL;
    long k = tab[i].k ? strtol(s + n, &end, 10) : 0;
    if (tab[i].k && (end == s + n || *end || k < 1 || k > 1000000)) break;
    rt_pd_set_fault_at(tab[i].f, (int)k);
    return 0;
  }
  snprintf(err, err_len, "CEDAR_PD_TEST_FAULT=%s: want hold-kv, corrupt, truncate, p-dies:K or d-dies:K (K >= 1)", s);
  return CEDAR_EINVAL;
}

/* ---- roles --------------------------------------------------------------- */

bool rt_pd_split(const struct plan *p) {
  return !graph_place_eq(graph_place_of(p, GRAPH_PREFILL_CED), graph_place_of(p, GRAPH_DECODE));
}

int rt_pd_ranks_needed(const struct plan *p) {
  if (plan_place_pd(p)) /* stages or experts per role: all of them (one process plays every one) */
    return comm_world_size() > 0 ? plan_place_ranks(p) : 1;
  int a = p->serving.prefill_rank, b = p->serving.decode_rank;
  return (a > b ? a : b) + 1;
}

enum rt_pd_role rt_pd_role_of(const struct plan *p) {
  if (!rt_pd_split(p)) return RT_PD_NONE;
  if (comm_world_size() == 0 || p->serving.prefill_rank == p->serving.decode_rank) return RT_PD_LOCAL;
  int me = comm_world_rank();
  if (me == p->serving.prefill_rank) return RT_PD_PREFILL;
  if (me == p->serving.decode_rank) return RT_PD_DECODE;
  return RT_PD_IDLE;
}

/* ---- what the plan says the package holds -------------------------------- */

/* memcpy of n bytes where n may be 0 and then a pointer may be NULL (an
 * empty tail, no kept rows): memcpy's arguments must be valid even then. */
static void copy_bytes(void *dst, const void *src, size_t n) {
  if (n) memcpy(dst, src, n);
}

/* One kept encoder output row: X^E and the pre it carries (rt_xe_row_floats). */
static size_t xe_row_bytes(const struct plan *p) { return sizeof(float) * rt_xe_row_floats(&p->model); }

void rt_pd_expected_bytes(const struct plan *p, int64_t n, int64_t replay, int64_t out[RT_PD_CLASS_COUNT]) {
  (void)replay;
  struct plan_pd_package k;
  memset(out, 0, sizeof(int64_t) * RT_PD_CLASS_COUNT);
  if (plan_cost_pd_package(p, n, &k)) return;
  out[RT_PD_KV] = k.kv;
  out[RT_PD_SWA_ENC] = k.swa_enc;
  out[RT_PD_SWA_DEC] = k.swa_dec;
  out[RT_PD_TAIL] = k.tails;
  out[RT_PD_XE] = k.xe;
  out[RT_PD_META] = -1;
}

/* ---- messages ------------------------------------------------------------ */


/* The payload bytes of transfer node nd, from request r's shapes (the same
 * on both sides: one plan). */
int64_t pd_payload_bytes(const struct graph *g, const struct graph_node *nd, const struct rt_request *r) {
  const struct graph_data *d = &g->data[nd->xfer_src];
  const struct graph_use *w = NULL;
  for (int u = 0; u < nd->n_use; u++)
    if (nd->use[u].data == nd->xfer_dst) w = &nd->use[u];
  switch (d->state) {
  case GRAPH_ST_KV: return (w->e_w1 - w->e_w0) * (int64_t)r->seq[d->layer].pool->entry_bytes;
  case GRAPH_ST_RING: {
    const struct rt_ring *q = &r->ring[d->layer];
    return (int64_t)q->window * ((int64_t)q->entry_bytes + 8) + 8;
  }
  case GRAPH_ST_TAIL:
    return (int64_t)op_comp_tail_floats(r->tail[d->layer].ratio, r->tail[d->layer].d) * 4 + 16;
  case GRAPH_ST_TOKENS: return 8 + 4 * g->n_prompt;
  case GRAPH_ST_XE: return (int64_t)r->xe_cap * ((int64_t)xe_row_bytes(r->plan) + 8);
  case GRAPH_ST_NONE: break;
  }
  return 0;
}

int64_t pd_msg_bytes(const struct graph *g, const struct graph_node *nd, const struct rt_request *r) {
  return (int64_t)sizeof(struct msg_hdr) + pd_payload_bytes(g, nd, r);
}

static void pack(const struct graph *g, int k, const struct rt_request *r, uint8_t *buf) {
  const struct graph_node *nd = &g->node[k];
  const struct graph_data *d = &g->data[nd->xfer_src];
  struct msg_hdr h = {PD_MSG_MAGIC, RT_PD_STATE_VERSION, k, (int32_t)d->state, d->layer, 0, 0, 0, 0, 0, 0};
  uint8_t *p = buf + sizeof h;
  h.payload = pd_payload_bytes(g, nd, r);
  switch (d->state) {
  case GRAPH_ST_KV: {
    for (int u = 0; u < nd->n_use; u++)
      if (nd->use[u].data == nd->xfer_dst) h.e0 = nd->use[u].e_w0, h.e1 = nd->use[u].e_w1;
    const struct rt_kv_seq *s = &r->seq[d->layer];
    for (int64_t e = h.e0; e < h.e1; e++, p += s->pool->entry_bytes)
      memcpy(p, rt_kv_entry(s, e), s->pool->entry_bytes);
    break;
  }
  case GRAPH_ST_RING: {
    const struct rt_ring *q = &r->ring[d->layer];
    copy_bytes(p, q->slot, (size_t)q->window * q->entry_bytes);
    p += (size_t)q->window * q->entry_bytes;
    copy_bytes(p, q->pos, sizeof(int64_t) * (size_t)q->window);
    p += sizeof(int64_t) * (size_t)q->window;
    memcpy(p, &q->r0, 8);
    break;
  }
  case GRAPH_ST_TAIL: {
    const struct op_comp_tail *t = &r->tail[d->layer];
    int64_t c = t->count;
    memcpy(p, &c, 8);
    memcpy(p + 8, &t->pos0, 8);
    copy_bytes(p + 16, r->tail_buf[d->layer], (size_t)op_comp_tail_floats(t->ratio, t->d) * 4);
    break;
  }
  case GRAPH_ST_TOKENS: {
    int64_t c = g->n_prompt;
    CEDAR_ASSERT(r->n_tokens >= c);
    memcpy(p, &c, 8);
    copy_bytes(p + 8, r->tokens, 4 * (size_t)c);
    break;
  }
  case GRAPH_ST_XE: {
    size_t row = xe_row_bytes(r->plan);
    copy_bytes(p, r->xe, row * (size_t)r->xe_cap);
    copy_bytes(p + row * (size_t)r->xe_cap, r->xe_pos, 8 * (size_t)r->xe_cap);
    break;
  }
  case GRAPH_ST_NONE: break;
  }
  h.sum = XXH3_64bits(buf + sizeof h, (size_t)h.payload);
  h.hdr_sum = XXH3_64bits(&h, offsetof(struct msg_hdr, hdr_sum));
  memcpy(buf, &h, sizeof h);
}

/* Apply message k (len bytes) to D's request r; the payload bytes by class
 * go to st. Returns 0 or CEDAR_EINVAL naming what is wrong. */
int pd_apply(const struct graph *g, int k, const uint8_t *buf, int64_t len, struct rt_request *r,
                 struct rt_pd_stats *st, struct rt_pd_rx *rx, char *err, size_t err_len) {
  const struct graph_node *nd = &g->node[k];
  struct msg_hdr h;
  if (len < (int64_t)sizeof h) goto trunc;
  memcpy(&h, buf, sizeof h);
  if (h.magic != PD_MSG_MAGIC || h.hdr_sum != XXH3_64bits(&h, offsetof(struct msg_hdr, hdr_sum))) {
    snprintf(err, err_len, "%s: the message header is corrupt; this request is dropped", nd->name);
    return CEDAR_EINVAL;
  }
  if (h.node != k || h.payload != pd_payload_bytes(g, nd, r) || (int64_t)sizeof h + h.payload > len) goto trunc;
  const uint8_t *p = buf + sizeof h;
  if (XXH3_64bits(p, (size_t)h.payload) != h.sum) {
    rx->bad_checksum++;
    snprintf(err, err_len, "%s: the payload fails its checksum (XXH3); the package is refused and this request "
             "dropped", nd->name);
    return CEDAR_EINVAL;
  }
  rx->chain = XXH3_64bits_withSeed(&h.sum, 8, rx->chain);
  const struct graph_data *d = &g->data[nd->xfer_src];
  const struct plan *pl = r->plan;
  switch (d->state) {
  case GRAPH_ST_KV: {
    struct rt_kv_seq *s = &r->seq[d->layer];
    /* entries this request holds already: a source's stream cloned to another decode home (key_slot: vendor,
     * graph_place.c) lands in the same request when one process plays every rank; append-only, so the same bytes */
    int64_t held = s->n_entries > h.e1 ? h.e1 : s->n_entries, eb = (int64_t)s->pool->entry_bytes;
    for (int64_t e = h.e0; e < held && held > h.e0; e++)
      if (memcmp(rt_kv_entry(s, e), p + (size_t)((e - h.e0) * eb), (size_t)eb)) held = -1;
    if (held > h.e0) {
      if (h.e1 > held && rt_kv_append(s, p + (size_t)((held - h.e0) * eb), (int)(h.e1 - held))) {
        snprintf(err, err_len, "%s: D's KV page pool is exhausted; this request is dropped", nd->name);
        return CEDAR_ENOMEM;
      }
      st->bytes[RT_PD_KV] += h.payload;
      break;
    }
    if (s->n_entries != h.e0) {
      snprintf(err, err_len, "%s: entries [%lld, %lld) arrive after %lld entries; they must follow in order",
               nd->name, (long long)h.e0, (long long)h.e1, (long long)s->n_entries);
      return CEDAR_EINVAL;
    }
    if (h.e1 > h.e0 && rt_kv_append(s, p, (int)(h.e1 - h.e0))) {
      snprintf(err, err_len, "%s: D's KV page pool is exhausted; this request is dropped", nd->name);
      return CEDAR_ENOMEM;
    }
    st->bytes[RT_PD_KV] += h.payload;
    break;
  }
  case GRAPH_ST_RING: {
    struct rt_ring *q = &r->ring[d->layer];
    size_t eb = (size_t)q->window * q->entry_bytes;
    copy_bytes(q->slot, p, eb);
    copy_bytes(q->pos, p + eb, 8 * (size_t)q->window);
    memcpy(&q->r0, p + eb + 8 * (size_t)q->window, 8);
    bool dec = pl->serving.ced && pl->layer[d->layer].region == PLAN_DECODER;
    st->bytes[dec ? RT_PD_SWA_DEC : RT_PD_SWA_ENC] += (int64_t)eb;
    st->bytes[RT_PD_META] += h.payload - (int64_t)eb;
    break;
  }
  case GRAPH_ST_TAIL: {
    struct op_comp_tail *t = &r->tail[d->layer];
    int64_t c;
    memcpy(&c, p, 8);
    memcpy(&t->pos0, p + 8, 8);
    t->count = (int)c;
    copy_bytes(r->tail_buf[d->layer], p + 16, (size_t)(h.payload - 16));
    st->bytes[RT_PD_TAIL] += h.payload - 16;
    st->bytes[RT_PD_META] += 16;
    break;
  }
  case GRAPH_ST_TOKENS: {
    int64_t c;
    memcpy(&c, p, 8);
    if (c > r->max_tokens) goto trunc;
    copy_bytes(r->tokens, p + 8, 4 * (size_t)c);
    r->n_tokens = c;
    st->bytes[RT_PD_META] += h.payload;
    break;
  }
  case GRAPH_ST_XE: {
    size_t row = xe_row_bytes(pl);
    copy_bytes(r->xe, p, row * (size_t)r->xe_cap);
    copy_bytes(r->xe_pos, p + row * (size_t)r->xe_cap, 8 * (size_t)r->xe_cap);
    st->bytes[RT_PD_XE] += (int64_t)(row * (size_t)r->xe_cap);
    st->bytes[RT_PD_META] += 8 * (int64_t)r->xe_cap;
    break;
  }
  case GRAPH_ST_NONE: break;
  }
  st->bytes[RT_PD_META] += (int64_t)sizeof h;
  rx->applied++;
  return 0;
trunc:
  snprintf(err, err_len, "%s: the message is truncated or not the one expected; the package is refused and this "
           "request dropped", nd->name);
  return CEDAR_EINVAL;
}

/* ---- the link a prefill graph's TRANSFER nodes run through --------------- */


struct pd_link *pd_cur; /* one P/D request at a time per process */

int rt_pd_transfer_node(const struct rt_node_ctx *c) {
  struct pd_link *L = pd_cur;
  if (!L || L->rp != c->r) return CEDAR_EUNSUPPORTED; /* a transfer outside a P/D run */
  int k = (int)(c->nd - L->g->node);
  int64_t len = pd_msg_bytes(L->g, c->nd, c->r);
  if (!L->buf[k]) L->buf[k] = cedar_xmalloc((size_t)len);
  pack(L->g, k, c->r, L->buf[k]);
  if (L->role == RT_PD_PREFILL) {
    if (pd_fault == RT_PD_FAULT_INFLIGHT && k == L->last_kv) { /* a test: this message never leaves P */
      atomic_store(&L->ms[k].done, 1);
      return 0;
    }
    int nth = atomic_fetch_add(&L->posted, 1) + 1;
    if (pd_fault == RT_PD_FAULT_P_DIES && nth == pd_fault_at) comm_die("P", nth);
    bool first_kv = L->g->data[c->nd->xfer_src].state == GRAPH_ST_KV && !atomic_exchange(&L->kv_faulted, 1);
    if (pd_fault == RT_PD_FAULT_CORRUPT && first_kv) L->buf[k][len - 1] ^= 0x40; /* after its checksum */
    if (pd_fault == RT_PD_FAULT_TRUNCATE && first_kv) len = len / 2;            /* the tail never sent */
    int dest = L->g->data[c->nd->xfer_dst].home.rank; /* the decode home of its layers (P/D stages: theirs) */
    return comm_send(L->buf[k], (size_t)len, dest, k + 1, &L->ms[k]);
  }
  pthread_mutex_lock(&L->mu);
  struct msg_hdr h;
  memcpy(&h, L->buf[k], sizeof h);
  L->chain_p = XXH3_64bits_withSeed(&h.sum, 8, L->chain_p);
  if (pd_fault == RT_PD_FAULT_INFLIGHT && k == L->last_kv) { /* held back: never arrives */
    L->ms[k].t_post = comm_now();
    pthread_mutex_unlock(&L->mu);
    snprintf(L->rx->first_missing, sizeof L->rx->first_missing, "%s", c->nd->name);
    return 0;
  }
  if (pd_fault == RT_PD_FAULT_CORRUPT && L->g->data[c->nd->xfer_src].state == GRAPH_ST_KV && L->rx->applied == 0)
    L->buf[k][len - 1] ^= 0x40;
  L->ms[k].t_post = comm_now();
  if (!L->rc) {
    int rc = pd_apply(L->g, k, L->buf[k], len, L->rd, L->st, L->rx, L->err, sizeof L->err);
    if (rc) L->rc = rc;
  }
  L->ms[k].t_done = comm_now();
  atomic_store(&L->ms[k].done, 1);
  L->rx->arrived++;
  pthread_mutex_unlock(&L->mu);
  free(L->buf[k]);
  L->buf[k] = NULL;
  return 0; /* a failed apply fails the request after the graph, with its own message */
}

/* ---- the package record -------------------------------------------------- */

static uint64_t plan_fp(const struct plan *p) {
  int64_t v[4 + 5 * PLAN_MAX_LAYERS];
  int k = 0;
  v[k++] = p->n_layers;
  v[k++] = p->model.hidden;
  v[k++] = p->model.window;
  v[k++] = p->model.hc_streams;
  for (int l = 0; l < p->n_layers; l++) {
    v[k++] = p->layer[l].mode;
    v[k++] = p->layer[l].ratio;
    v[k++] = p->layer[l].kv_src;
    v[k++] = p->layer[l].region;
    v[k++] = p->layer[l].engram;
  }
  return XXH3_64bits(v, sizeof(int64_t) * (size_t)k);
}

static int64_t ring_end(const struct rt_ring *q) {
  int64_t e = -1;
  for (int i = 0; i < q->window; i++)
    if (q->pos[i] > e) e = q->pos[i];
  return e;
}

void pd_meta_fill(struct rt_pd_meta *m, const struct rt_request *r, int64_t n, int32_t y1, uint64_t rng) {
  const struct plan *p = r->plan;
  memset(m, 0, sizeof(*m));
  m->magic = META_MAGIC;
  m->version = RT_PD_STATE_VERSION;
  m->plan_fp = plan_fp(p);
  m->n_prompt = n;
  m->n_pos = r->n_pos;
  m->n_tokens = r->n_tokens;
  m->y1 = y1;
  m->y1_sampler = 0;
  m->y1_consumer = 1;
  m->y1_pos = r->n_pos;
  m->rng = rng;
  for (int l = 0; l < p->n_layers; l++) {
    m->n_entries[l] = r->seq[l].pool ? r->seq[l].n_entries : -1;
    m->entry_bytes[l] = r->seq[l].pool ? (int64_t)r->seq[l].pool->entry_bytes : 0;
    m->ring_end[l] = ring_end(&r->ring[l]);
    m->tail_count[l] = r->seq[l].pool && r->seq[l].pool->ratio > 1 ? r->tail[l].count : -1;
    m->tail_pos0[l] = r->tail[l].pos0;
  }
  m->swa_entry_bytes = p->n_layers ? (int64_t)r->ring[0].entry_bytes : 0;
  for (int i = 0; i < 4; i++) m->last_ids[i] = -1;
  for (int64_t i = r->n_tokens > 3 ? r->n_tokens - 3 : 0, j = 0; i < r->n_tokens; i++, j++)
    m->last_ids[j] = r->tokens[i];
}

void pd_meta_seal(struct rt_pd_meta *m) { m->self_check = XXH3_64bits(m, offsetof(struct rt_pd_meta, self_check)); }

/* ---- the ready barrier (SPEC 7.3) ---------------------------------------- */

int rt_pd_ready(const struct plan *p, const struct rt_pd_meta *m, const struct rt_request *r,
                const struct rt_pd_rx *rx, char *err, size_t err_len) {
  return pd_ready_check(p, m, r, rx, true, err, err_len);
}

int pd_ready_check(const struct plan *p, const struct rt_pd_meta *m, const struct rt_request *r,
                   const struct rt_pd_rx *rx, bool all, char *err, size_t err_len) {
  return pd_ready_mask(p, m, r, rx, NULL, all, err, err_len);
}

int pd_ready_mask(const struct plan *p, const struct rt_pd_meta *m, const struct rt_request *r,
                  const struct rt_pd_rx *rx, const bool *mine, bool all, char *err, size_t err_len) {
#define REFUSE(...)                                                              \
  do {                                                                           \
    int o_ = snprintf(err, err_len, "ready barrier: D refuses to decode: ");     \
    snprintf(err + o_, err_len - (size_t)o_, __VA_ARGS__);                       \
    return CEDAR_EINVAL;                                                         \
  } while (0)
  if (m->magic != META_MAGIC || m->self_check != XXH3_64bits(m, offsetof(struct rt_pd_meta, self_check)))
    REFUSE("the package record is corrupt (checksum)");
  if (m->version != RT_PD_STATE_VERSION || m->plan_fp != plan_fp(p))
    REFUSE("state version mismatch: the package is version %u of plan %016llx, D runs version %u of plan %016llx",
           m->version, (unsigned long long)m->plan_fp, RT_PD_STATE_VERSION, (unsigned long long)plan_fp(p));
  /* 5: every async copy complete */
  if (rx->arrived < rx->expected || rx->applied < m->n_messages || rx->arrived < m->n_messages)
    REFUSE("condition 5 (transfers complete): %lld of %lld messages arrived, %lld applied; a page is still in "
           "flight%s%s", (long long)rx->arrived, (long long)m->n_messages, (long long)rx->applied,
           rx->first_missing[0] ? ": " : "", rx->first_missing);
  if (rx->chain != m->chain) REFUSE("condition 5 (transfers complete): the messages applied are not the ones P sent");
  /* 1: global pages, lengths and visibility */
  if (r->n_pos != m->n_pos || m->n_pos != m->n_prompt)
    REFUSE("condition 1 (lengths): D holds %lld positions, the package %lld of a %lld-token prompt",
           (long long)r->n_pos, (long long)m->n_pos, (long long)m->n_prompt);
  for (int l = 0; l < p->n_layers; l++) {
    if (!r->seq[l].pool || (mine && !mine[l])) continue;
    int64_t want = m->n_pos / r->seq[l].pool->ratio;
    if (r->seq[l].n_entries != m->n_entries[l] || m->n_entries[l] != want ||
        m->entry_bytes[l] != (int64_t)r->seq[l].pool->entry_bytes)
      REFUSE("condition 1 (global pages): source L%d has %lld entries on D, P committed %lld, %lld positions make "
             "%lld", l, (long long)r->seq[l].n_entries, (long long)m->n_entries[l], (long long)m->n_pos,
             (long long)want);
  }
  if (!all) return 0; /* what D's own replay needs is there */
  /* 2: every ring at the same boundary (rings P did not ship, D rebuilt) */
  for (int l = 0; l < p->n_layers; l++) {
    if (mine && !mine[l]) continue;
    int64_t e = ring_end(&r->ring[l]);
    if (e != m->n_pos - 1 || (m->ring_end[l] >= 0 && e != m->ring_end[l]) ||
        r->ring[l].entry_bytes != (size_t)m->swa_entry_bytes)
      REFUSE("condition 2 (SWA boundary): layer %d's ring ends at position %lld, the processed boundary is %lld",
             l, (long long)e, (long long)m->n_pos - 1);
  }
  /* 3: tail non-empty <=> the boundary is not a multiple of the ratio */
  for (int l = 0; l < p->n_layers; l++) {
    if (!r->seq[l].pool || r->seq[l].pool->ratio < 2 || (mine && !mine[l])) continue;
    int ratio = r->seq[l].pool->ratio;
    int want = (int)(m->n_pos % ratio);
    if (r->tail[l].count != want || r->tail[l].count != m->tail_count[l] ||
        r->tail[l].pos0 != m->n_pos - want || r->tail[l].pos0 != m->tail_pos0[l])
      REFUSE("condition 3 (compressor tail): source L%d's tail on D holds %d row(s) from position %lld; %lld "
             "positions with %lld complete entries need %d from %lld (a missing tail?)", l, r->tail[l].count,
             (long long)r->tail[l].pos0, (long long)m->n_pos, (long long)r->seq[l].n_entries, want,
             (long long)(m->n_pos - want));
  }
  /* 4: the sampled-but-unconsumed token: P sampled it and sent it, or D
   * sampled it after its own replay; either way exactly one, not consumed */
  bool by_p = m->y1_sampler == 0, by_d = m->y1_sampler == 1;
  bool ok4 = m->y1_consumer == 1 && m->y1_pos == m->n_pos && r->n_tokens == m->n_pos && r->pending >= 0 &&
             r->pending < p->model.vocab &&
             ((by_p && m->y1 == r->pending) || (by_d && m->y1 == -1));
  if (!ok4)
    REFUSE("condition 4 (sampled-but-unconsumed token): y1 = %d sampled by %s for %s at position %lld, but D's "
           "history holds %lld ids and its pending token is %d: ambiguous", m->y1, by_p ? "P" : by_d ? "D" : "?",
           m->y1_consumer ? "D" : "P", (long long)m->y1_pos, (long long)r->n_tokens, r->pending);
  for (int i = 0; i < 3 && i < r->n_tokens; i++)
    if (m->last_ids[i] != r->tokens[r->n_tokens - (r->n_tokens < 3 ? r->n_tokens : 3) + i])
      REFUSE("condition 1 (lengths): the last Engram ids differ from D's token history");
  return 0;
#undef REFUSE
}

void rt_pd_register(void) {
  rt_backend_feature(GRAPH_DEV_CPU, GRAPH_TRANSFER, GRAPH_F_STAGE | GRAPH_F_EP, 0, rt_pd_transfer_node);
}
