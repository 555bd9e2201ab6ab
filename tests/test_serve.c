/* test_serve.c: cedar serve in-process (serve/serve.h): a request whose
 * logits go non-finite fails alone with 500, naming the cause, while a
 * request beside it answers 200; the failure is counted in /metrics; its
 * pages return; SIGTERM ends srv_run with 0.
 *
 * The embedding row of one token id is poisoned with NaN (as test_pd does),
 * so a prompt of that id gives NaN logits at its first sample. The server
 * runs on tests/plans/text-tiny.yaml with the npm tokenizer on a free
 * loopback port; a client thread speaks HTTP/1.1 over a plain socket.
 * Skips (77) without the npm tokenizer (make install-deps).
 * Run: ctest --test-dir build -R '^serve$' --output-on-failure
 */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/engine/engine.h"
#include "runtime/text/tokenizer.h"
#include "serve/serve.h"
#include "tests/harness.h"

#define POISON 12345 /* a token id whose embedding row becomes NaN */

static char port_file[64];

struct reply {
  int status;
  char body[8192];
};

/* One request on a fresh connection (Connection: close), the whole reply read. */
static void http(int port, const char *method, const char *path, const char *body, struct reply *out) {
  memset(out, 0, sizeof *out);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
    if (fd >= 0) close(fd);
    return;
  }
  char req[1024];
  int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                   method, path, body ? strlen(body) : 0, body ? body : "");
  if (write(fd, req, (size_t)n) != n) {
    close(fd);
    return;
  }
  static __thread char buf[65536];
  size_t len = 0;
  ssize_t k;
  while (len < sizeof buf - 1 && (k = read(fd, buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)k;
  buf[len] = 0;
  close(fd);
  sscanf(buf, "HTTP/1.1 %d", &out->status);
  const char *b = strstr(buf, "\r\n\r\n");
  if (b) snprintf(out->body, sizeof out->body, "%s", b + 4);
}

struct call {
  int port;
  const char *body;
  struct reply r;
};

static void *call_main(void *arg) {
  struct call *c = arg;
  http(c->port, "POST", "/v1/completions", c->body, &c->r);
  return NULL;
}

static void *client_main(void *arg) {
  (void)arg;
  int port = 0;
  for (int i = 0; i < 600 && !port; i++) { /* the port file, written once the server listens */
    FILE *f = fopen(port_file, "r");
    if (f) {
      if (fscanf(f, "%d", &port) != 1) port = 0;
      fclose(f);
    }
    if (!port) nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
  }
  EXPECT(port > 0, "the server wrote its port");
  if (port) {
    char bad[128];
    snprintf(bad, sizeof bad, "{\"prompt\": [%d], \"max_tokens\": 4, \"temperature\": 0}", POISON);
    struct call c[2] = {{port, bad, {0}}, {port, "{\"prompt\": [1, 2, 3], \"max_tokens\": 8, \"temperature\": 0}", {0}}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, call_main, &c[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    EXPECT(c[0].r.status == 500 && strstr(c[0].r.body, "NaN"), "the poisoned request: %d %s", c[0].r.status, c[0].r.body);
    EXPECT(c[1].r.status == 200 && strstr(c[1].r.body, "\"finish_reason\":\"length\""), "the request beside it: %d %s",
           c[1].r.status, c[1].r.body);
    struct reply m;
    http(port, "GET", "/metrics", NULL, &m);
    EXPECT(m.status == 200 && strstr(m.body, "cedar_requests_total{outcome=\"failed\"} 1\n") &&
               strstr(m.body, "cedar_requests_running 0\n"),
           "metrics count the failure: %.600s", m.body);
    printf("non-finite logits: the poisoned request got %d, the one beside it %d\n", c[0].r.status, c[1].r.status);
  }
  kill(getpid(), SIGTERM); /* srv_run's sigwait takes it */
  return NULL;
}

int main(void) {
  const char *tj = tok_default_path();
  if (!tj) {
    printf("SKIP: no npm tokenizer (make install-deps)\n");
    return 77;
  }
  char err[1024];
  struct tokenizer *tok = tok_load(tj, err, sizeof err);
  EXPECT(tok != NULL, "tokenizer: %s", err);
  struct rt_engine e;
  /* weights_f32: the test poisons one row of an F32 embedding (stored, it is BF16) */
  struct rt_engine_opts eo = {.plan = "tests/plans/text-tiny.yaml", .tokenizer = tj, .weights_f32 = true};
  int rc = rt_engine_open(&e, &eo, err, sizeof err);
  EXPECT(rc == 0, "engine: %s", err);
  if (rc || !tok) return h_report("serve");
  const int d = e.plan.model.hidden;
  float *row = (float *)e.model.embed.data + (size_t)POISON * d;
  for (int i = 0; i < d; i++) row[i] = NAN;
  snprintf(port_file, sizeof port_file, "/tmp/cedar-test-serve-%d.port", (int)getpid());
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL); /* every thread: only srv_run's sigwait sees SIGTERM */
  pthread_t client;
  pthread_create(&client, NULL, client_main, NULL);
  struct srv_opts o = {.port = 0, .port_file = port_file, .max_waiting = 8, .max_body = 1 << 16,
                       .max_tokens_limit = 64, .default_max_tokens = 4, .max_prompt_tokens = 256,
                       .max_connections = 16, .idle_timeout_s = 10, .drain_s = 5, .quiet = true};
  struct srv_text t = {tok, NULL, -1};
  rc = srv_run(&e, &t, &o, err, sizeof err);
  pthread_join(client, NULL);
  EXPECT(rc == 0, "srv_run after SIGTERM: %d %s", rc, err);
  int64_t pages = 0;
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) pages += e.pools[l].pages_in_use;
  EXPECT(pages == 0, "pages held after the server stopped (no prefix cache): %lld", (long long)pages);
  unlink(port_file);
  rt_engine_close(&e);
  tok_free(tok);
  return h_report("serve");
}
