/* pd_internal.h: what pd.c, pd_run.c and runtime/comm/comm_mpi.c share: the message
 * header and the link TRANSFER nodes run through (the messages between
 * ranks themselves: runtime/comm/comm.h). Not for other files. */
#ifndef CEDAR_RUNTIME_PD_INTERNAL_H
#define CEDAR_RUNTIME_PD_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <pthread.h>
#include <stdint.h>

#include "runtime/dist/pd.h"
#include "runtime/comm/comm.h"

#define PD_MSG_MAGIC 0x44504443u /* "CDPD" */

/* One message: this header, then the payload (pd.c: pack, pd_apply). */
struct msg_hdr {
  uint32_t magic, version;
  int32_t node, kind, layer, pad;
  int64_t e0, e1, payload;
  uint64_t sum;     /* XXH3 of the payload */
  uint64_t hdr_sum; /* XXH3 of the header up to here */
};

#define PD_ACK_MAGIC 0x4b414443u /* "CDAK" */

/* D's answer to the package, sent after its barrier (or its refusal): P
 * holds the request until it arrives (or the deadline passes). */
struct pd_ack {
  uint32_t magic;
  int32_t status;   /* 0: accepted; else the negative cedar_status D failed with */
  char msg[240];    /* D's error when refused */
  uint64_t sum;     /* XXH3 of the ack up to here */
};

struct pd_link {
  enum rt_pd_role role;          /* LOCAL or PREFILL */
  const struct graph *g;
  struct rt_request *rp, *rd;    /* rd: LOCAL only */
  uint8_t **buf;                 /* (n_node) messages */
  struct comm_msg *ms;       /* (n_node) */
  int dest;
  struct rt_pd_stats *st;
  struct rt_pd_rx *rx;
  pthread_mutex_t mu;            /* LOCAL: applies are serialised (KV in order per source by the edges) */
  int last_kv;                   /* the last KV transfer node (a test holds it back) */
  uint64_t chain_p;              /* LOCAL: XXH3 chain of the payload checksums as packed */
  atomic_int posted;             /* PREFILL: messages posted so far (test faults) */
  atomic_int kv_faulted;         /* PREFILL: the first KV message took its test fault */
  int rc;
  char err[256];
};

extern struct pd_link *pd_cur;      /* the P/D request running now (one per process) */
extern enum rt_pd_fault pd_fault;   /* rt_pd_set_fault */
extern int pd_fault_at;             /* its K (P_DIES, D_DIES) */

/* The payload / message bytes of transfer node nd, from request r's shapes. */
int64_t pd_payload_bytes(const struct graph *g, const struct graph_node *nd, const struct rt_request *r);
int64_t pd_msg_bytes(const struct graph *g, const struct graph_node *nd, const struct rt_request *r);
/* Apply message k to D's request r (checked: header, checksum, order). */
int pd_apply(const struct graph *g, int k, const uint8_t *buf, int64_t len, struct rt_request *r,
             struct rt_pd_stats *st, struct rt_pd_rx *rx, char *err, size_t err_len);
void pd_meta_fill(struct rt_pd_meta *m, const struct rt_request *r, int64_t n, int32_t y1, uint64_t rng);
void pd_meta_seal(struct rt_pd_meta *m);
/* rt_pd_ready; with all false only what precedes D's own replay: the
 * record, the version, condition 5 and condition 1. */
int pd_ready_check(const struct plan *p, const struct rt_pd_meta *m, const struct rt_request *r,
                   const struct rt_pd_rx *rx, bool all, char *err, size_t err_len);
/* pd_ready_check over the layers mine[] names only (NULL: every layer): a
 * decode home of P/D stages holds its stages' layers (pd_stage.c). */
int pd_ready_mask(const struct plan *p, const struct rt_pd_meta *m, const struct rt_request *r,
                  const struct rt_pd_rx *rx, const bool *mine, bool all, char *err, size_t err_len);

/* Shared by pd_run.c and pd_stage.c (P/D with stages or experts): */
double pd_deadline_s(void);        /* CEDAR_PD_DEADLINE_S, default 60 */
/* Wait until ms[idx[..]] all completed, or none did for dl seconds (false;
 * rx->first_missing names it when rx). die_at: a test fault (0: none). */
bool pd_wait_all(const struct graph *g, struct comm_msg *ms, const int *idx, int n_idx, double dl,
                 struct rt_pd_rx *rx, int die_at);
/* The next token from logits through the one sampler path (runtime/gen/sampler.h):
 * 0 and *id, or CEDAR_EINVAL with err (non-finite logits at pos). */
int pd_sample(const struct rt_gen_opts *o, const struct rt_request *r, const float *logits, int64_t pos,
              uint64_t *rng, int32_t *id, char *err, size_t err_len);
/* D's decode loop from r's pending y1 (r->n_pos positions processed). */
int pd_decode(const struct rt_model *M, const struct rt_gen_opts *o, struct rt_request *r, uint64_t rng,
              struct rt_gen_result *res, char *err, size_t err_len);
/* One request under mpirun with each role on ranks of its own (stages,
 * experts): runtime/dist/pd_stage.c. rt_pd_generate's contract. */
int pd_stage_generate(const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r, const int32_t *prompt,
                      int64_t n, const struct rt_gen_opts *o, struct rt_gen_result *res, struct rt_pd_stats *st,
                      const struct rt_pipe_figs *figs, char *err, size_t err_len);

/* The messages after a prefill graph's transfer messages, in P/D's
 * message table: each one's slot (n_node + its index) and its MPI tag
 * (n_node + 1 + its index; transfer node k's tag is k + 1). */
enum pd_msg { PD_MSG_RECORD = 0, PD_MSG_LOGITS, PD_MSG_ANSWER, PD_MSG_TRACE, PD_MSG_COUNT };
static inline int pd_slot(const struct graph *g, enum pd_msg m) { return g->n_node + (int)m; }
static inline int pd_tag(const struct graph *g, enum pd_msg m) { return g->n_node + 1 + (int)m; }

#endif
