/* server.c: srv_run (serve.h): the batch, the engine thread, the
 * libmicrohttpd daemon on the address asked for, the signals, and the drain:
 * SIGTERM or SIGINT stops accepting (the listening socket closes; requests
 * on open connections get 503), lets the running and queued requests finish
 * within --drain-s seconds (a second signal ends the wait at once), aborts
 * what is left, and returns 0.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "serve/serve_internal.h"

/* The bound port into path, whole or not at all (written, then renamed). */
static int write_port(const char *path, unsigned port, char *err, size_t err_len) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%u\n", port) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
    snprintf(err, err_len, "--port-file %s: cannot write it (%s)", path, strerror(errno));
    return CEDAR_EIO;
  }
  return 0;
}

static struct MHD_Daemon *start_daemon(struct srv *s, char *err, size_t err_len) {
  const char *host = s->o.host ? s->o.host : "127.0.0.1";
  struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->o.port)};
  struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)s->o.port)};
  bool v6 = strchr(host, ':') != NULL;
  if (v6 ? inet_pton(AF_INET6, host, &a6.sin6_addr) != 1 : inet_pton(AF_INET, host, &a4.sin_addr) != 1) {
    snprintf(err, err_len, "--host %s: not an IPv4 or IPv6 address (names are not resolved; 127.0.0.1 is the default)",
             host);
    return NULL;
  }
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                   (v6 ? MHD_USE_IPv6 : 0);
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, 0, NULL, NULL, srv_http_request, s, MHD_OPTION_SOCK_ADDR, v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned)s->o.idle_timeout_s, MHD_OPTION_NOTIFY_COMPLETED, srv_http_completed, s, MHD_OPTION_END);
  if (!d)
    snprintf(err, err_len, "cannot listen on %s port %d (in use, or not an address of this machine): choose another "
             "--port", host, s->o.port);
  return d;
}

/* Wait for the running and queued requests, at most until the deadline
 * (the engine aborts what is left then); a second signal ends it now. */
static void drain(struct srv *s, const sigset_t *set) {
  struct timespec tick = {0, 20 * 1000 * 1000};
  for (;;) {
    pthread_mutex_lock(&s->mu);
    bool idle = !s->q_head && s->m.running == 0 && s->m.waiting == 0;
    pthread_mutex_unlock(&s->mu);
    if (idle) return;
    if (sigtimedwait(set, NULL, &tick) > 0) {
      pthread_mutex_lock(&s->mu);
      s->drain_deadline = srv_now();
      pthread_cond_signal(&s->loop_cv);
      pthread_mutex_unlock(&s->mu);
    }
  }
}

static int serve(struct srv *s, char *err, size_t err_len) {
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, &old); /* the threads started here inherit it: only sigwait sees them */
  signal(SIGPIPE, SIG_IGN);               /* a client gone mid-write is an error return, not a death */
  int rc = pthread_create(&s->loop, NULL, s->ranks > 1 ? srv_ranks_main : srv_loop_main, s);
  if (rc) {
    snprintf(err, err_len, "cannot start the engine thread (%s)", strerror(rc));
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return CEDAR_ENOMEM;
  }
  struct MHD_Daemon *d = start_daemon(s, err, err_len);
  const union MHD_DaemonInfo *di = d ? MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT) : NULL;
  unsigned port = di ? di->port : 0;
  rc = d ? 0 : CEDAR_EINVAL;
  if (!rc && s->o.port_file) rc = write_port(s->o.port_file, port, err, err_len);
  if (!rc) {
    fprintf(stderr, "cedar serve: %s on http://%s%s%s:%u (model \"%s\"; POST /v1/completions, /v1/chat/completions; "
            "SIGTERM drains and exits)\n", s->e->plan.name, strchr(s->o.host ? s->o.host : "", ':') ? "[" : "",
            s->o.host ? s->o.host : "127.0.0.1", strchr(s->o.host ? s->o.host : "", ':') ? "]" : "", port,
            s->model_name);
    if (s->ranks > 1)
      fprintf(stderr, "cedar serve: %d ranks compute each request as `cedar run` does, one request at a time (no "
              "batching across ranks; no prefix cache); a stream gets its text at the end\n", s->ranks);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "cedar serve: %s: no new requests; draining for at most %.1f s\n", strsignal(sig), s->o.drain_s);
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    s->drain_deadline = srv_now() + s->o.drain_s;
    pthread_mutex_unlock(&s->mu);
    MHD_socket ls = MHD_quiesce_daemon(d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    drain(s, &set);
  }
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->loop_cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->loop, NULL);
  if (d) MHD_stop_daemon(d);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (!rc)
    fprintf(stderr, "cedar serve: stopped: %llu requests ok, %llu cancelled, %llu aborted, %llu failed\n",
            (unsigned long long)s->m.requests[SRV_OK], (unsigned long long)s->m.requests[SRV_CANCELLED],
            (unsigned long long)s->m.requests[SRV_ABORTED], (unsigned long long)s->m.requests[SRV_FAILED]);
  return rc;
}

int srv_run(struct rt_engine *e, const struct srv_text *t, const struct srv_opts *o, char *err, size_t err_len) {
  struct srv *s = cedar_xcalloc(1, sizeof *s);
  s->e = e;
  s->text = *t;
  s->o = *o;
  s->model_name = o->model_name ? o->model_name : e->plan.name;
  srv_metrics_init(&s->m);
  s->ranks = o->ranks.n > 1 ? o->ranks.n : 1;
  struct rt_batch_opts bo = o->batch;
  bo.cache = e->cache;
  bo.save_snapshot = e->cache != NULL;
  bo.keep_logits = false;
  int rc = s->ranks > 1 ? 0 : rt_batch_init(&s->batch, &e->model, e->pools, &bo, err, err_len);
  if (rc) {
    free(s);
    return rc;
  }
  s->m.ranks = s->ranks;
  s->m.max_running = s->ranks > 1 ? 1 : s->batch.o.max_requests;
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->tok_mu, NULL);
  pthread_cond_init(&s->loop_cv, NULL);
  rc = serve(s, err, err_len);
  if (s->ranks > 1) o->ranks.stop(o->ranks.user); /* the other ranks stop waiting */
  else rt_batch_free(&s->batch);
  pthread_cond_destroy(&s->loop_cv);
  pthread_mutex_destroy(&s->tok_mu);
  pthread_mutex_destroy(&s->mu);
  free(s);
  return rc;
}
