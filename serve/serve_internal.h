/* serve_internal.h: what serve/http.c, serve/loop.c and serve/metrics.c
 * share: the server, one request as both threads see it, and the locked
 * queue between them. Not a public header (cli/ includes serve/serve.h).
 *
 * Locking: srv.mu guards the queue, every srv_req field marked "shared",
 * the metrics and the gauges. The engine thread takes it only between
 * steps; an HTTP thread waits on its request's cv. A request is freed by
 * whichever side drops the last reference (refs: the HTTP side holds one
 * until its response is done, the engine one until the request is over).
 */
#ifndef CEDAR_SERVE_SERVE_INTERNAL_H
#define CEDAR_SERVE_SERVE_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "serve/metrics.h"
#include "serve/request.h"
#include "runtime/text/text_out.h"
#include "serve/serve.h"

enum srv_end { SRV_END_NONE = 0, SRV_END_LENGTH, SRV_END_STOP, SRV_END_FAILED, SRV_END_CANCELLED, SRV_END_ABORTED };

struct srv_req {
  struct srv_params prm;     /* the request as parsed */
  int32_t *ids;              /* the prompt (n_ids) */
  int64_t n_ids;
  int max_new;
  uint64_t seed;
  char id[48];               /* "cmpl-N" / "chatcmpl-N" */
  int64_t created;           /* unix seconds */
  double t_arrive;           /* monotonic */
  /* shared */
  int refs;
  bool cancel;               /* the client left (HTTP side) */
  char *text;                /* the output text so far (streamed as it grows) */
  size_t len, cap;
  int32_t *out_ids;          /* the generated ids (n_out) */
  int n_out, cap_out;
  enum srv_end end;          /* set once, when the request is over */
  char err[256];             /* SRV_END_FAILED / ABORTED: why */
  pthread_cond_t cv;         /* signalled when text grows or the request ends */
  struct srv_req *next;      /* the queue */
  /* engine thread only */
  int handle;                /* in the batch; -1 before */
  struct text_out tout;
  bool tout_live;
  double t_last;             /* monotonic time of its last token */
};

struct srv {
  struct rt_engine *e;
  struct srv_text text;
  struct srv_opts o;
  const char *model_name;
  pthread_mutex_t mu;
  pthread_mutex_t tok_mu;    /* tok_encode keeps a cache: one encode at a time */
  pthread_cond_t loop_cv;    /* the engine thread waits on it when idle */
  struct srv_req *q_head, *q_tail; /* submitted, not yet in the batch */
  int n_queued;
  bool draining;             /* SIGTERM: no new requests */
  bool stop;                 /* the engine thread ends */
  double drain_deadline;     /* monotonic */
  uint64_t next_id;
  struct srv_metrics m;      /* shared */
  struct rt_batch batch;     /* engine thread only (not under mpirun: ranks > 1) */
  int ranks;                 /* o.ranks.n; > 1: one request at a time through the ranks (ranks.c) */
  pthread_t loop;
};

double srv_now(void);
/* libmicrohttpd's access handler and completion callback (http.c). */
enum MHD_Result srv_http_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls);
void srv_http_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);
/* The engine thread (loop.c). */
void *srv_loop_main(void *arg);
/* The engine thread with several ranks, one request at a time through
 * o.ranks.run (ranks.c); and the end of a request and its
 * streamed text (its text_out, set up for r), shared with it (loop.c;
 * s->mu held). */
void *srv_ranks_main(void *arg);
void srv_end_req(struct srv *s, struct srv_req *r, enum srv_end end, const char *why);
void srv_tout_open(struct srv *s, struct srv_req *r);
/* The queue's head, taken off it (the queue is not empty). */
struct srv_req *srv_pop(struct srv *s);
/* Queue r for the engine (refs +1). Returns 0, or 429 / 503 with err when
 * the queue is full or the server drains. */
int srv_submit(struct srv *s, struct srv_req *r, char *err, size_t err_len);
/* Drop one reference (under s->mu); the last frees r. */
void srv_req_unref_locked(struct srv_req *r);

#endif
