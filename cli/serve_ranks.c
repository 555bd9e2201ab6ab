/* serve_ranks.c: the MPI side of `cedar serve` under mpirun
 * (serve_ranks.h; serve/ranks.c is the engine thread it serves).
 *
 * Between requests the ranks talk plain MPI (runtime/comm/comm.h: comm_put,
 * comm_take): rank 0 sends each request as a job message (a fixed header:
 * its sizes and sampling, then the prompt's ids) to every other rank, and
 * all of them call rt_engine_generate, which runs the plan's distributed
 * driver (P/D, layer stages, experts) exactly as `cedar run` does. The rank
 * that reports (the decode rank; RT_GEN_ELSEWHERE everywhere else) sends
 * its ids, or its failure, back as a result message unless it is rank 0.
 * A rank lost inside a request ends the job there (the drivers' deadlines,
 * comm_abort), as under `cedar run`. The stop is a job message of its own
 * kind; a rank waits for the next job without a deadline (a server idles).
 * Test: tests/cli/serve_mpi.sh.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "cli/serve_ranks.h"
#include "runtime/comm/comm.h"

#define TAG_JOB 7400
#define TAG_RESULT 7401

enum { JOB_RUN = 1, JOB_STOP = 2 };

/* On the wire: a job, the prompt's ids after it. */
struct job {
  int32_t kind, max_new, top_k, pad;
  int64_t n_ids;
  uint64_t seed;
  float temperature, top_p, rep_penalty, pad2;
};

/* On the wire: a result, the ids after it. */
struct result {
  int32_t rc, n_tokens;
  char err[256];
};

static void send_all(const void *buf, size_t bytes) {
  for (int k = 1; k < comm_world_size(); k++) comm_put(buf, bytes, k, TAG_JOB);
}

void serve_ranks_stop(void *user) {
  (void)user;
  struct job j = {.kind = JOB_STOP};
  send_all(&j, sizeof j);
}

/* The job on this rank; its ids into *out when this rank reports, else
 * RT_GEN_ELSEWHERE. */
static int run_job(struct rt_engine *e, const struct job *j, const int32_t *ids, int32_t **out, int *n_out, char *err,
                   size_t err_len) {
  struct rt_gen_opts go = {.replay = -1, .max_new = j->max_new, .temperature = j->temperature, .top_p = j->top_p,
                           .top_k = j->top_k, .rep_penalty = j->rep_penalty, .seed = j->seed};
  struct rt_request r = {0};
  struct rt_gen_result res = {0};
  int rc = rt_engine_generate(e, &r, ids, j->n_ids, &go, &res, err, err_len);
  *out = NULL, *n_out = 0;
  if (!rc && res.n_tokens > 0) {
    *out = cedar_xmalloc(sizeof(int32_t) * (size_t)res.n_tokens);
    memcpy(*out, res.tokens, sizeof(int32_t) * (size_t)res.n_tokens);
    *n_out = res.n_tokens;
  }
  rt_gen_result_free(&res);
  rt_engine_request_free(e, &r);
  return rc;
}

int serve_ranks_follow(struct rt_engine *e, char *err, size_t err_len) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, NULL); /* rank 0 decides when the server ends */
  for (;;) {
    void *buf = NULL;
    size_t bytes = 0;
    if (comm_take(0, TAG_JOB, &buf, &bytes, NULL)) {
      snprintf(err, err_len, "rank %d: no MPI to hear rank 0 on", comm_world_rank());
      return CEDAR_EUNSUPPORTED;
    }
    struct job j;
    if (bytes < sizeof j) {
      free(buf);
      snprintf(err, err_len, "rank %d: a job message of %zu bytes from rank 0", comm_world_rank(), bytes);
      return CEDAR_EIO;
    }
    memcpy(&j, buf, sizeof j);
    if (j.kind != JOB_RUN) {
      free(buf);
      return 0; /* the stop */
    }
    if (j.n_ids < 1 || bytes != sizeof j + sizeof(int32_t) * (size_t)j.n_ids) {
      free(buf);
      snprintf(err, err_len, "rank %d: a job of %zu bytes does not hold its %lld ids", comm_world_rank(), bytes,
               (long long)j.n_ids);
      return CEDAR_EIO;
    }
    struct result res = {0};
    int32_t *out = NULL;
    int n = 0;
    int32_t *ids = cedar_xmalloc(sizeof(int32_t) * (size_t)j.n_ids); /* aligned, whatever the message's layout */
    memcpy(ids, (char *)buf + sizeof j, sizeof(int32_t) * (size_t)j.n_ids);
    free(buf);
    res.rc = run_job(e, &j, ids, &out, &n, res.err, sizeof res.err);
    free(ids);
    if (res.rc != RT_GEN_ELSEWHERE) { /* this rank reports: its ids (or its failure) to rank 0 */
      res.n_tokens = n;
      size_t sz = sizeof res + sizeof(int32_t) * (size_t)n;
      char *msg = cedar_xmalloc(sz);
      memcpy(msg, &res, sizeof res);
      if (n) memcpy(msg + sizeof res, out, sizeof(int32_t) * (size_t)n);
      comm_put(msg, sz, 0, TAG_RESULT);
      free(msg);
    }
    free(out);
  }
}

int serve_ranks_run(void *user, const struct srv_rank_job *rj, int32_t **out, int *n_out, char *err, size_t err_len) {
  struct rt_engine *e = user;
  struct job j = {.kind = JOB_RUN, .max_new = rj->max_new, .top_k = rj->top_k, .n_ids = rj->n_ids, .seed = rj->seed,
                  .temperature = rj->temperature, .top_p = rj->top_p, .rep_penalty = rj->rep_penalty};
  size_t sz = sizeof j + sizeof(int32_t) * (size_t)rj->n_ids;
  char *msg = cedar_xmalloc(sz);
  memcpy(msg, &j, sizeof j);
  memcpy(msg + sizeof j, rj->ids, sizeof(int32_t) * (size_t)rj->n_ids);
  send_all(msg, sz);
  free(msg);
  int rc = run_job(e, &j, rj->ids, out, n_out, err, err_len);
  if (rc != RT_GEN_ELSEWHERE) return rc;
  void *buf = NULL;
  size_t bytes = 0;
  int src = -1;
  comm_take(-1, TAG_RESULT, &buf, &bytes, &src);
  struct result res;
  if (bytes < sizeof res) {
    free(buf);
    snprintf(err, err_len, "rank %d answered with %zu bytes, not a result", src, bytes);
    return CEDAR_EIO;
  }
  memcpy(&res, buf, sizeof res);
  res.err[sizeof res.err - 1] = 0;
  if (res.rc || res.n_tokens < 0 || bytes != sizeof res + sizeof(int32_t) * (size_t)res.n_tokens) {
    snprintf(err, err_len, "rank %d: %s", src, res.rc ? res.err : "a result of the wrong size");
    free(buf);
    return res.rc ? res.rc : CEDAR_EIO;
  }
  *n_out = res.n_tokens;
  *out = cedar_xmalloc(sizeof(int32_t) * (size_t)(res.n_tokens + 1));
  memcpy(*out, (char *)buf + sizeof res, sizeof(int32_t) * (size_t)res.n_tokens);
  free(buf);
  return 0;
}
