/* http.c: cedar serve's HTTP front on libmicrohttpd (serve.h): routes,
 * the API key, body limits, each request checked and tokenized, then
 * waited on (JSON at the end, or server-sent events as text comes).
 *
 * One thread per connection (MHD_USE_THREAD_PER_CONNECTION): a handler may
 * block on its request's condition variable, and while it waits it checks
 * every 50 ms whether its client is still there (poll for a hang-up on the
 * connection's socket), so a client that leaves cancels its request at the
 * engine's next step. Slow or silent clients are closed by libmicrohttpd
 * after --idle-timeout seconds; connections past --max-connections are
 * refused at accept. Malformed HTTP is answered 400 by libmicrohttpd itself.
 * The server's own life (the daemon, the signals, the drain): server.c.
 */
#define _GNU_SOURCE /* POLLRDHUP: the peer closed its side */
#include <arpa/inet.h>
#include <cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "serve/serve_internal.h"

enum route { R_NONE = 0, R_HEALTH, R_METRICS, R_MODELS, R_COMPLETIONS, R_CHAT };

/* One HTTP request on a connection (con_cls), and its SSE stream. */
struct conn {
  int refs;                  /* the connection's (until completed) and a stream response's */
  struct srv *s;
  struct MHD_Connection *c;
  char *body;
  size_t len, cap;
  bool too_big;
  struct srv_req *r;         /* once submitted */
  /* the stream */
  char *out;                 /* SSE bytes made, not yet all sent */
  size_t out_len, out_off;
  size_t sent;               /* of r->text, put in events */
  bool first_sent, final_sent;
};

static void conn_unref(struct conn *cs) {
  if (--cs->refs) return;
  if (cs->r) {
    pthread_mutex_lock(&cs->s->mu);
    if (cs->r->end == SRV_END_NONE) { /* the client left before the end: the engine cancels it */
      cs->r->cancel = true;
      pthread_cond_signal(&cs->s->loop_cv);
    }
    srv_req_unref_locked(cs->r);
    pthread_mutex_unlock(&cs->s->mu);
  }
  free(cs->body);
  free(cs->out);
  free(cs);
}

/* ---- responses ------------------------------------------------------------------ */

static void count(struct srv *s, enum srv_outcome oc) {
  pthread_mutex_lock(&s->mu);
  s->m.requests[oc]++;
  pthread_mutex_unlock(&s->mu);
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type, char *text, size_t len,
                                 const char *retry_after) {
  struct MHD_Response *rs = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
  if (!rs) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(rs, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (retry_after) MHD_add_response_header(rs, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
  if (status == 401) MHD_add_response_header(rs, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  if (status == 413 || status == 503) MHD_add_response_header(rs, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result ret = MHD_queue_response(c, status, rs);
  MHD_destroy_response(rs);
  return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, cJSON *j) {
  char *t = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  return t ? send_text(c, status, "application/json", t, strlen(t), NULL) : MHD_NO;
}

/* OpenAI's error object; counted under its outcome. */
static enum MHD_Result send_error(struct srv *s, struct MHD_Connection *c, unsigned status, const char *msg) {
  enum srv_outcome oc = status == 401 ? SRV_UNAUTHORIZED : status == 429 ? SRV_REJECTED
                      : status == 503 ? SRV_ABORTED : status >= 500 ? SRV_FAILED : SRV_BAD_REQUEST;
  count(s, oc);
  cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
  cJSON_AddStringToObject(e, "message", msg);
  cJSON_AddStringToObject(e, "type", status == 401 ? "authentication_error" : status == 429 ? "rate_limit_error"
                                     : status >= 500 ? "server_error" : "invalid_request_error");
  cJSON_AddNumberToObject(e, "code", status);
  char *t = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!t) return MHD_NO;
  if (!s->o.quiet) fprintf(stderr, "cedar serve: %u: %s\n", status, msg);
  return send_text(c, status, "application/json", t, strlen(t), status == 429 ? "1" : NULL);
}

/* ---- the API key ------------------------------------------------------------------ */

/* "Bearer <key>" against the key, in time that depends on neither's bytes. */
static bool authorized(const struct srv *s, struct MHD_Connection *c) {
  if (!s->o.api_key) return true;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!h || strncmp(h, "Bearer ", 7)) return false;
  const char *got = h + 7, *want = s->o.api_key;
  size_t gl = strlen(got), wl = strlen(want);
  unsigned diff = gl != wl;
  for (size_t i = 0; i < wl; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < gl ? got[i] : 0);
  return diff == 0;
}

/* ---- waiting for the engine ------------------------------------------------------ */

/* Whether the client closed its side (a hang-up or an error on the socket). */
static bool client_gone(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return true;
  struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  char ch;
  ssize_t n = recv(ci->connect_fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* One wait of at most 50 ms on r (s->mu held). False when the client left:
 * r is then cancelled. */
static bool wait_some(struct conn *cs) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += 50 * 1000 * 1000;
  if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
  pthread_cond_timedwait(&cs->r->cv, &cs->s->mu, &ts);
  if (cs->r->end == SRV_END_NONE && client_gone(cs->c)) {
    cs->r->cancel = true;
    pthread_cond_signal(&cs->s->loop_cv);
    return false;
  }
  return true;
}

/* ---- the response bodies ---------------------------------------------------------- */

static const char *finish_name(enum srv_end e) { return e == SRV_END_STOP ? "stop" : "length"; }

static cJSON *ids_array(const int32_t *ids, int64_t n) {
  cJSON *a = cJSON_CreateArray();
  for (int64_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
  return a;
}

static cJSON *usage(const struct srv_req *r) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)r->n_ids);
  cJSON_AddNumberToObject(u, "completion_tokens", r->n_out);
  cJSON_AddNumberToObject(u, "total_tokens", (double)r->n_ids + r->n_out);
  return u;
}

static cJSON *envelope(const struct srv *s, const struct srv_req *r, bool chunk) {
  bool chat = r->prm.kind == SRV_CHAT;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "id", r->id);
  cJSON_AddStringToObject(j, "object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
  cJSON_AddNumberToObject(j, "created", (double)r->created);
  cJSON_AddStringToObject(j, "model", s->model_name);
  return j;
}

/* A choice: text (or a chat message / delta) and finish (NULL: still running). */
static cJSON *choice(const struct srv_req *r, const char *text, size_t len, const char *finish, bool chunk,
                     bool role) {
  cJSON *c = cJSON_CreateObject();
  cJSON_AddNumberToObject(c, "index", 0);
  char *t = cedar_xmalloc(len + 1);
  memcpy(t, text, len);
  t[len] = 0;
  if (r->prm.kind == SRV_CHAT) {
    cJSON *m = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
    if (role || !chunk) cJSON_AddStringToObject(m, "role", "assistant");
    if (len || !chunk || role) cJSON_AddStringToObject(m, "content", t);
  } else {
    cJSON_AddStringToObject(c, "text", t);
    cJSON_AddNullToObject(c, "logprobs");
  }
  free(t);
  if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
  else cJSON_AddNullToObject(c, "finish_reason");
  return c;
}

static cJSON *whole_response(const struct srv *s, const struct srv_req *r) {
  cJSON *j = envelope(s, r, false);
  cJSON *cs = cJSON_AddArrayToObject(j, "choices");
  cJSON *c = choice(r, r->text ? r->text : "", r->len, finish_name(r->end), false, false);
  if (r->prm.return_token_ids) {
    cJSON_AddItemToObject(c, "prompt_token_ids", ids_array(r->ids, r->n_ids));
    cJSON_AddItemToObject(c, "token_ids", ids_array(r->out_ids, r->n_out));
  }
  cJSON_AddItemToArray(cs, c);
  cJSON_AddItemToObject(j, "usage", usage(r));
  return j;
}

/* ---- the stream ------------------------------------------------------------------- */

static void out_event(struct conn *cs, cJSON *j) {
  char *t = j ? cJSON_PrintUnformatted(j) : NULL;
  const char *body = t ? t : "[DONE]";
  size_t n = strlen(body) + 8;
  cs->out = cedar_xrealloc(cs->out, cs->out_len + n + 1);
  cs->out_len += (size_t)snprintf(cs->out + cs->out_len, n + 1, "data: %s\n\n", body);
  free(t);
  cJSON_Delete(j);
}

/* The events for what r holds now (s->mu held): new text, and after the
 * end the finishing chunk, the usage chunk and [DONE]. */
static void make_events(struct conn *cs) {
  const struct srv *s = cs->s;
  struct srv_req *r = cs->r;
  bool role = r->prm.kind == SRV_CHAT && !cs->first_sent;
  if (r->len > cs->sent || role) {
    cJSON *j = envelope(s, r, true);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), choice(r, r->text + cs->sent, r->len - cs->sent, NULL, true, role));
    out_event(cs, j);
    cs->sent = r->len;
    cs->first_sent = true;
  }
  if (r->end == SRV_END_NONE) return;
  if (r->end == SRV_END_STOP || r->end == SRV_END_LENGTH) {
    cJSON *j = envelope(s, r, true);
    cJSON *c = choice(r, "", 0, finish_name(r->end), true, false);
    if (r->prm.return_token_ids) {
      cJSON_AddItemToObject(c, "prompt_token_ids", ids_array(r->ids, r->n_ids));
      cJSON_AddItemToObject(c, "token_ids", ids_array(r->out_ids, r->n_out));
    }
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), c);
    out_event(cs, j);
    if (r->prm.include_usage) {
      j = envelope(s, r, true);
      cJSON_AddArrayToObject(j, "choices");
      cJSON_AddItemToObject(j, "usage", usage(r));
      out_event(cs, j);
    }
  } else { /* it failed after its first event: an error event (the status line is long gone) */
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", r->err);
    cJSON_AddStringToObject(e, "type", "server_error");
    cJSON_AddNumberToObject(e, "code", r->end == SRV_END_ABORTED ? 503 : 500);
    out_event(cs, j);
  }
  out_event(cs, NULL);
  cs->final_sent = true;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  struct conn *cs = cls;
  if (cs->out_off == cs->out_len) {
    cs->out_len = cs->out_off = 0;
    if (cs->final_sent) return MHD_CONTENT_READER_END_OF_STREAM;
    pthread_mutex_lock(&cs->s->mu);
    while (!cs->out_len) {
      make_events(cs);
      if (cs->out_len) break;
      if (!wait_some(cs)) {
        pthread_mutex_unlock(&cs->s->mu);
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
    }
    pthread_mutex_unlock(&cs->s->mu);
  }
  size_t n = cs->out_len - cs->out_off < max ? cs->out_len - cs->out_off : max;
  memcpy(buf, cs->out + cs->out_off, n);
  cs->out_off += n;
  return (ssize_t)n;
}

static void sse_free(void *cls) { conn_unref(cls); }

/* ---- a generation request -------------------------------------------------------- */

/* The prompt's ids (400 with err: too long, an id past the plan's vocab). */
static int prompt_ids(struct srv *s, struct srv_req *r, char *err, size_t n) {
  const struct srv_params *p = &r->prm;
  const int vocab = s->e->plan.model.vocab;
  if (p->ids) {
    r->ids = cedar_xmalloc(sizeof(int32_t) * (size_t)p->n_ids);
    memcpy(r->ids, p->ids, sizeof(int32_t) * (size_t)p->n_ids);
    r->n_ids = p->n_ids;
    return 0;
  }
  size_t len = 0;
  char *text = p->kind == SRV_CHAT ? srv_chat_render(p, s->text.chat, &len, err, n) : cedar_xstrdup(p->prompt);
  if (!text) return 400;
  if (p->kind != SRV_CHAT) len = strlen(text);
  int32_t *ids = NULL;
  size_t k = 0, cap = 0;
  pthread_mutex_lock(&s->tok_mu);
  int rc = tok_encode(s->text.tok, text, len, &ids, &k, &cap);
  pthread_mutex_unlock(&s->tok_mu);
  free(text);
  r->ids = ids, r->n_ids = (int64_t)k;
  if (rc) return snprintf(err, n, "the prompt could not be encoded (too long)"), 400;
  if (!k) return snprintf(err, n, "the prompt encodes to no tokens"), 400;
  if ((int64_t)k > s->o.max_prompt_tokens)
    return snprintf(err, n, "the prompt is %zu tokens; this server takes at most %lld (--max-prompt-tokens)", k,
                    (long long)s->o.max_prompt_tokens), 400;
  for (size_t i = 0; i < k; i++)
    if (ids[i] >= vocab)
      return snprintf(err, n, "the prompt's token %zu is id %d, past plan %s's vocabulary of %d ids", i, ids[i],
                      s->e->plan.name, vocab), 400;
  return 0;
}

/* Parse, check and tokenize the body into a new request; its status on failure. */
static int make_req(struct srv *s, struct conn *cs, enum srv_kind kind, struct srv_req **out, char *err, size_t n) {
  struct srv_limits lim = {s->o.max_tokens_limit, s->o.max_prompt_tokens, s->e->plan.model.vocab};
  struct srv_req *r = cedar_xcalloc(1, sizeof *r);
  pthread_cond_init(&r->cv, NULL);
  r->refs = 1;
  r->handle = -1;
  *out = r;
  int rc = srv_params_parse(&r->prm, kind, cs->body ? cs->body : "", cs->len, &lim, err, n);
  if (rc) return rc;
  if (r->prm.model && strcmp(r->prm.model, s->model_name))
    return snprintf(err, n, "the model \"%.64s\" does not exist here; this server serves \"%s\" (GET /v1/models)",
                    r->prm.model, s->model_name), 404;
  if ((rc = prompt_ids(s, r, err, n))) return rc;
  r->max_new = r->prm.max_tokens ? r->prm.max_tokens : s->o.default_max_tokens;
  int64_t room = plan_max_positions(&s->e->plan);
  if (r->n_ids + r->max_new > room)
    return snprintf(err, n, "the prompt's %lld tokens and max_tokens %d need %lld positions; plan %s holds %lld",
                    (long long)r->n_ids, r->max_new, (long long)(r->n_ids + r->max_new), s->e->plan.name,
                    (long long)room), 400;
  r->seed = r->prm.has_seed ? r->prm.seed : s->o.default_seed;
  r->t_arrive = srv_now();
  r->created = (int64_t)time(NULL);
  pthread_mutex_lock(&s->mu);
  uint64_t id = ++s->next_id;
  pthread_mutex_unlock(&s->mu);
  snprintf(r->id, sizeof r->id, "%s-%llu", kind == SRV_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)id);
  return 0;
}

static enum MHD_Result generate(struct srv *s, struct conn *cs, enum srv_kind kind) {
  char err[512];
  struct srv_req *r = NULL;
  int rc = make_req(s, cs, kind, &r, err, sizeof err);
  if (!rc) rc = srv_submit(s, r, err, sizeof err);
  if (rc) {
    pthread_mutex_lock(&s->mu);
    srv_req_unref_locked(r);
    pthread_mutex_unlock(&s->mu);
    return send_error(s, cs->c, (unsigned)rc, err);
  }
  cs->r = r;
  /* wait for the end, or (a stream) its first text: a failure before it still gets its status */
  pthread_mutex_lock(&s->mu);
  while (r->end == SRV_END_NONE && !(r->prm.stream && r->n_out > 0))
    if (!wait_some(cs)) {
      pthread_mutex_unlock(&s->mu);
      return MHD_NO; /* the client left: no answer, the connection closes */
    }
  enum srv_end end = r->end;
  pthread_mutex_unlock(&s->mu);
  if (end == SRV_END_FAILED || end == SRV_END_ABORTED || end == SRV_END_CANCELLED) {
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", r->err[0] ? r->err : "cancelled");
    cJSON_AddStringToObject(e, "type", "server_error");
    cJSON_AddNumberToObject(e, "code", end == SRV_END_FAILED ? 500 : 503);
    return send_json(cs->c, end == SRV_END_FAILED ? 500 : 503, j);
  }
  if (!r->prm.stream) return send_json(cs->c, 200, whole_response(s, r));
  struct MHD_Response *rs = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, cs, sse_free);
  if (!rs) return MHD_NO;
  cs->refs++; /* the response's, dropped by sse_free */
  MHD_add_response_header(rs, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(rs, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  enum MHD_Result ret = MHD_queue_response(cs->c, 200, rs);
  MHD_destroy_response(rs);
  return ret;
}

/* ---- the other routes ------------------------------------------------------------- */

static enum MHD_Result models(struct srv *s, struct MHD_Connection *c) {
  count(s, SRV_OK);
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "object", "list");
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", s->model_name);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", 0);
  cJSON_AddStringToObject(m, "owned_by", "cedar");
  cJSON_AddNumberToObject(m, "max_model_len", (double)plan_max_positions(&s->e->plan));
  cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "data"), m);
  return send_json(c, 200, j);
}

static enum MHD_Result metrics(struct srv *s, struct MHD_Connection *c) {
  size_t len;
  pthread_mutex_lock(&s->mu);
  char *t = srv_metrics_render(&s->m, &len);
  pthread_mutex_unlock(&s->mu);
  return send_text(c, 200, "text/plain; version=0.0.4", t, len, NULL);
}

static enum route route_of(const char *url, const char *method, bool *wrong_method) {
  static const struct { const char *url, *method; enum route r; } tab[] = {
      {"/health", "GET", R_HEALTH},           {"/metrics", "GET", R_METRICS},
      {"/v1/models", "GET", R_MODELS},        {"/v1/completions", "POST", R_COMPLETIONS},
      {"/v1/chat/completions", "POST", R_CHAT}};
  *wrong_method = false;
  for (size_t i = 0; i < sizeof tab / sizeof *tab; i++)
    if (!strcmp(url, tab[i].url)) {
      if (!strcmp(method, tab[i].method)) return tab[i].r;
      *wrong_method = true;
    }
  return R_NONE;
}

static enum MHD_Result dispatch(struct srv *s, struct conn *cs, const char *url, const char *method) {
  bool wrong;
  enum route rt = route_of(url, method, &wrong);
  char msg[256];
  if (rt == R_NONE) {
    snprintf(msg, sizeof msg, wrong ? "%.16s is not allowed on %.64s" : "no route %.16s %.64s (the API: GET "
             "/v1/models, POST /v1/completions, POST /v1/chat/completions, GET /health, GET /metrics)", method, url);
    return send_error(s, cs->c, wrong ? 405 : 404, msg);
  }
  if (rt == R_HEALTH) {
    pthread_mutex_lock(&s->mu);
    bool draining = s->draining;
    pthread_mutex_unlock(&s->mu);
    const char *t = draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}";
    return send_text(cs->c, draining ? 503 : 200, "application/json", cedar_xstrdup(t), strlen(t), NULL);
  }
  if (rt == R_METRICS) return metrics(s, cs->c);
  if (!authorized(s, cs->c))
    return send_error(s, cs->c, 401, "this server needs an API key: send the header \"Authorization: Bearer <key>\"");
  if (rt == R_MODELS) return models(s, cs->c);
  return generate(s, cs, rt == R_CHAT ? SRV_CHAT : SRV_COMPLETIONS);
}

static enum MHD_Result too_big(struct srv *s, struct conn *cs) {
  char msg[160];
  cs->too_big = true;
  free(cs->body), cs->body = NULL, cs->len = cs->cap = 0;
  snprintf(msg, sizeof msg, "the body is over this server's limit of %zu bytes (--max-body)", s->o.max_body);
  return send_error(s, cs->c, 413, msg); /* queued before the body ends: the rest is not read, the connection closes */
}

enum MHD_Result srv_http_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  (void)version;
  struct srv *s = cls;
  struct conn *cs = *con_cls;
  if (!cs) {
    cs = cedar_xcalloc(1, sizeof *cs);
    cs->refs = 1, cs->s = s, cs->c = c;
    *con_cls = cs;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > s->o.max_body) return too_big(s, cs);
    return MHD_YES;
  }
  if (cs->too_big) return (*upload_size = 0), MHD_YES;
  if (*upload_size) { /* a piece of the body, kept up to the limit */
    size_t n = *upload_size;
    *upload_size = 0;
    if (cs->len + n > s->o.max_body) return too_big(s, cs);
    if (cs->len + n > cs->cap) cs->body = cedar_xrealloc(cs->body, cs->cap = (cs->len + n) * 2);
    memcpy(cs->body + cs->len, upload, n);
    cs->len += n;
    return MHD_YES;
  }
  return dispatch(s, cs, url, method);
}

void srv_http_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)cls, (void)c, (void)toe;
  if (*con_cls) conn_unref(*con_cls);
  *con_cls = NULL;
}
