/* runtime/comm/comm_mpi.c: the ranks of a P/D run and the messages between them, through
 * StarPU-MPI over Open MPI (pd.h, pd_internal.h).
 *
 * MPI is initialised by cedar (MPI_THREAD_MULTIPLE) when mpirun started the
 * process, before the engine starts StarPU; StarPU-MPI is started on top of
 * the running StarPU (starpu_mpi_init_comm, MPI_COMM_WORLD) for the one
 * request, and stopped before StarPU is. Each message is a buffer
 * registered as a StarPU vector of bytes and sent or received detached
 * (starpu_mpi_isend_detached / irecv_detached); the completion callbacks,
 * on StarPU-MPI's progress thread, stamp the time and count. Nothing else
 * blocks: the caller waits for the count with a deadline.
 *
 * Without MPI in the build every entry answers "not built" and the world
 * size is 0, so a P/D plan runs both roles in one process.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "runtime/comm/comm.h"

#ifdef CEDAR_HAVE_MPI
#include <mpi.h>
#include <starpu.h>
#include <starpu_mpi.h>
#endif

static int world_size, world_rank;
static bool mpi_inited;

int comm_world_size(void) { return world_size; }
int comm_world_rank(void) { return world_rank; }

/* The value of CEDAR_PD_DEADLINE_S, or -1 when set and not a number of
 * seconds in (0, COMM_DEADLINE_MAX_S]; 60 when unset or empty. */
static double deadline_parse(const char *s) {
  if (!s || !*s) return 60;
  char *end;
  errno = 0;
  double d = strtod(s, &end);
  return errno || end == s || *end || !(d > 0 && d <= COMM_DEADLINE_MAX_S) ? -1 : d;
}

int comm_deadline_check(char *err, size_t err_len) {
  const char *s = getenv("CEDAR_PD_DEADLINE_S");
  if (deadline_parse(s) > 0) return 0;
  snprintf(err, err_len, "CEDAR_PD_DEADLINE_S=%.40s: give the deadline of a wait between ranks in seconds, a "
           "number in (0, %.0f] (unset: 60)", s, COMM_DEADLINE_MAX_S);
  return -1;
}

double comm_deadline_s(void) {
  double d = deadline_parse(getenv("CEDAR_PD_DEADLINE_S"));
  return d > 0 ? d : 60; /* refused at start-up (comm_deadline_check); 60 for a caller that did not check */
}

int comm_test_fault(const char *when) {
  const char *f = getenv("CEDAR_MPI_TEST_FAULT"), *rk = getenv("OMPI_COMM_WORLD_RANK");
  if (!f) return 0;
  int r = -1, used = 0;
  char w[16] = "";
  if (sscanf(f, "die-%15[a-z]:%d%n", w, &r, &used) != 2 || f[used] || r < 0 ||
      (strcmp(w, "init") && strcmp(w, "end") && strcmp(w, "agree")))
    return -1;
  if (!strcmp(w, when) && rk && atoi(rk) == r) {
    fprintf(stderr, "cedar: test fault: rank %d kills itself (SIGKILL) %s\n", r,
            !strcmp(when, "init") ? "before MPI_Init_thread"
            : !strcmp(when, "end") ? "before the ranks meet to finalize" : "before it reports to rank 0 (agree)");
    fflush(NULL);
    raise(SIGKILL);
  }
  return 0;
}

double comm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts); /* one clock for every process of one host */
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#ifdef CEDAR_HAVE_MPI

bool comm_mpi_built(void) { return true; }

static bool under_mpirun(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* MPI_Init_thread waits for every rank without a deadline: one killed
 * during start-up held the others there for ever under
 * orte_enable_recovery (issue 28 row 11). A timer bounds it: past three
 * deadlines and 20 s (a loaded host starts MPI slowly, and a slow start is
 * not a dead peer: 4 ranks took over 3 s beside another MPI test) this rank
 * says so and exits 1 (SIGALRM; the handler is async-signal-safe). */
#define INIT_MARGIN_S 20.0
static void on_init_timeout(int sig) {
  (void)sig;
  static const char msg[] = "cedar: error: MPI start-up (MPI_Init_thread) did not complete within 3 x "
                            "CEDAR_PD_DEADLINE_S + 20 s: a rank died or is stuck before it started; this rank ends "
                            "(exit 1)\n";
  ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)w;
  _exit(1);
}

static void init_timer(double s) {
  struct itimerval it = {{0, 0}, {(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)}};
  if (s > 0) signal(SIGALRM, on_init_timeout);
  setitimer(ITIMER_REAL, &it, NULL);
  if (s <= 0) signal(SIGALRM, SIG_DFL);
}

int comm_begin(int *argc, char ***argv, char *err, size_t err_len) {
  if (mpi_inited || !under_mpirun()) return 0;
  if (comm_test_fault("init")) {
    snprintf(err, err_len, "CEDAR_MPI_TEST_FAULT=%s: want die-init:RANK, die-agree:RANK or die-end:RANK", getenv("CEDAR_MPI_TEST_FAULT"));
    return CEDAR_EINVAL;
  }
  int provided = 0;
  init_timer(3 * comm_deadline_s() + INIT_MARGIN_S);
  int irc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  init_timer(0);
  if (irc != MPI_SUCCESS) {
    snprintf(err, err_len, "MPI_Init_thread failed");
    return CEDAR_EUNSUPPORTED;
  }
  mpi_inited = true;
  if (provided < MPI_THREAD_SERIALIZED) {
    snprintf(err, err_len, "this MPI gives thread level %d; StarPU-MPI needs MPI_THREAD_SERIALIZED", provided);
    return CEDAR_EUNSUPPORTED;
  }
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  return 0;
}

void comm_end(void) {
  if (!mpi_inited) return;
  int fin = 0;
  MPI_Finalized(&fin);
  /* MPI_Finalize waits for every rank, without a deadline: a rank that died
   * (Open MPI goes on without it under orte_enable_recovery) held the
   * others there for ever (issue 28 row 11: a rank killed at start-up hung
   * the job). So the ranks meet first, within three deadlines (a live rank
   * may still be failing its request: up to two in rt_pipe_close), and when
   * one does not come this rank leaves without MPI_Finalize, saying so. */
  double dl = 3 * comm_deadline_s();
  comm_test_fault("end");
  if (!fin && world_size > 1 && !comm_meet(dl)) {
    LOG_ERROR("rank %d: not every rank reached the end within %.0f s (3 x CEDAR_PD_DEADLINE_S): one died or is "
              "stuck; leaving without MPI_Finalize, which would wait for it for ever", world_rank, dl);
    fflush(NULL);
    mpi_inited = false;
    return;
  }
  if (!fin) MPI_Finalize();
  mpi_inited = false;
}

/* ---- plain MPI for bench pd ---------------------------------------------- */

static void wait_req(MPI_Request *q) {
  int done = 0;
  for (;;) {
    MPI_Test(q, &done, MPI_STATUS_IGNORE);
    if (done) return;
    nanosleep(&(struct timespec){0, 200000}, NULL);
  }
}

bool comm_meet(double dl) {
  if (!mpi_inited) return true;
  MPI_Request q;
  MPI_Ibarrier(MPI_COMM_WORLD, &q);
  double until = comm_now() + dl;
  for (int done = 0;;) {
    MPI_Test(&q, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (comm_now() > until) return false;
    nanosleep(&(struct timespec){0, 500000}, NULL);
  }
}

int comm_barrier(void) {
  if (!mpi_inited) return CEDAR_EUNSUPPORTED;
  MPI_Request q;
  MPI_Ibarrier(MPI_COMM_WORLD, &q);
  wait_req(&q);
  return 0;
}

int comm_bandwidth(int a, int b, size_t bytes, int reps, double *bytes_per_s) {
  if (!mpi_inited) return CEDAR_EUNSUPPORTED;
  *bytes_per_s = 0;
  if (world_rank != a && world_rank != b) return 0;
  char *buf = cedar_xcalloc(bytes ? bytes : 1, 1);
  char ack = 0;
  double bw = 0;
  /* one warm-up message, then reps timed ones and b's one-byte answer */
  for (int round = 0; round < 2; round++) {
    int n = round ? reps : 1;
    double t0 = comm_now();
    for (int i = 0; i < n; i++) {
      if (world_rank == a)
        MPI_Send(buf, (int)bytes, MPI_BYTE, b, 7000 + round, MPI_COMM_WORLD);
      else
        MPI_Recv(buf, (int)bytes, MPI_BYTE, a, 7000 + round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (world_rank == a)
      MPI_Recv(&ack, 1, MPI_BYTE, b, 7100 + round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    else
      MPI_Send(&ack, 1, MPI_BYTE, a, 7100 + round, MPI_COMM_WORLD);
    double dt = comm_now() - t0;
    if (round) bw = dt > 0 ? (double)bytes * n / dt : 0;
  }
  free(buf);
  if (world_rank == a)
    MPI_Send(&bw, 1, MPI_DOUBLE, b, 7200, MPI_COMM_WORLD);
  else
    MPI_Recv(&bw, 1, MPI_DOUBLE, a, 7200, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  *bytes_per_s = bw;
  return 0;
}

int comm_share(double *v, int n, int from, int to) {
  if (!mpi_inited) return CEDAR_EUNSUPPORTED;
  if (from == to) return 0;
  MPI_Request q;
  if (world_rank == from) {
    MPI_Isend(v, n, MPI_DOUBLE, to, 7300, MPI_COMM_WORLD, &q);
    wait_req(&q);
  } else if (world_rank == to) {
    MPI_Irecv(v, n, MPI_DOUBLE, from, 7300, MPI_COMM_WORLD, &q);
    wait_req(&q);
  }
  return 0;
}

int comm_put(const void *buf, size_t bytes, int to, int tag) {
  if (!mpi_inited) return CEDAR_EUNSUPPORTED;
  MPI_Request q;
  MPI_Isend(buf, (int)bytes, MPI_BYTE, to, tag, MPI_COMM_WORLD, &q);
  wait_req(&q);
  return 0;
}

int comm_take(int from, int tag, void **buf, size_t *bytes, int *src) {
  if (!mpi_inited) return CEDAR_EUNSUPPORTED;
  int flag = 0, n = 0;
  MPI_Status st;
  for (;;) { /* no deadline: the next request may be hours away; a dead rank ends the job (mpirun) */
    MPI_Iprobe(from < 0 ? MPI_ANY_SOURCE : from, tag, MPI_COMM_WORLD, &flag, &st);
    if (flag) break;
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  MPI_Get_count(&st, MPI_BYTE, &n);
  *buf = cedar_xmalloc((size_t)n + 1);
  MPI_Request q;
  MPI_Irecv(*buf, n, MPI_BYTE, st.MPI_SOURCE, tag, MPI_COMM_WORLD, &q);
  wait_req(&q);
  *bytes = (size_t)n;
  if (src) *src = st.MPI_SOURCE;
  return 0;
}

bool comm_all_ok(bool ok) {
  if (!mpi_inited) return ok;
  int in = ok, out = 0;
  MPI_Request q;
  MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD, &q);
  wait_req(&q);
  return out != 0;
}

/* ---- messages ------------------------------------------------------------ */

struct msg {
  starpu_data_handle_t h;
  struct comm_msg *st;
};

static struct msg *msgs;
static int n_msgs, cap_msgs;
static bool own_starpu, mpi_started;
static pthread_mutex_t msgs_mu = PTHREAD_MUTEX_INITIALIZER; /* transfer tasks post from several workers */

int comm_start(char *err, size_t err_len) {
  if (mpi_started) return 0;
  if (!starpu_is_initialized()) {
    /* the direct executor: StarPU only to carry the messages */
    struct starpu_conf conf;
    starpu_conf_init(&conf);
    conf.ncpus = 1;
    conf.ncuda = conf.nopencl = 0;
    if (starpu_init(&conf)) {
      snprintf(err, err_len, "starpu_init for StarPU-MPI failed");
      return CEDAR_EUNSUPPORTED;
    }
    own_starpu = true;
  }
  if (starpu_mpi_init_comm(NULL, NULL, 0, MPI_COMM_WORLD)) {
    snprintf(err, err_len, "starpu_mpi_init_comm failed");
    return CEDAR_EUNSUPPORTED;
  }
  mpi_started = true;
  return 0;
}

static void on_done(void *arg) {
  struct comm_msg *s = arg;
  s->t_done = comm_now();
  atomic_store(&s->done, 1);
}

static int post(void *buf, size_t bytes, int peer, int tag, struct comm_msg *s, bool send) {
  pthread_mutex_lock(&msgs_mu);
  if (n_msgs == cap_msgs) {
    cap_msgs = cap_msgs ? 2 * cap_msgs : 64;
    msgs = cedar_xrealloc(msgs, sizeof(*msgs) * (size_t)cap_msgs);
  }
  struct msg *m = &msgs[n_msgs++];
  m->st = s;
  starpu_vector_data_register(&m->h, STARPU_MAIN_RAM, (uintptr_t)buf, (uint32_t)bytes, 1);
  starpu_data_handle_t h = m->h;
  pthread_mutex_unlock(&msgs_mu);
  s->t_post = comm_now();
  int rc = send ? starpu_mpi_isend_detached(h, peer, tag, MPI_COMM_WORLD, on_done, s)
                : starpu_mpi_irecv_detached(h, peer, tag, MPI_COMM_WORLD, on_done, s);
  return rc ? CEDAR_EUNSUPPORTED : 0;
}

int comm_send(void *buf, size_t bytes, int dest, int tag, struct comm_msg *s) {
  return post(buf, bytes, dest, tag, s, true);
}

int comm_recv(void *buf, size_t bytes, int src, int tag, struct comm_msg *s) {
  return post(buf, bytes, src, tag, s, false);
}

/* How long a rank that ends the job waits first: one deadline, 1 to 5 s.
 * The other survivors of a dead rank reach their own deadline within about
 * one more, and MPI_Abort would end them before they name it
 * (tests/cli/pd_dead_rank.sh). */
static int abort_grace_s(void) {
  double d = comm_deadline_s();
  return d < 1 ? 1 : d > 5 ? 5 : (int)d;
}

void comm_abort(const char *why) {
  LOG_ERROR("%s", why);
  LOG_ERROR("rank %d: a message between ranks is still posted and StarPU-MPI cannot cancel it: ending the job "
            "(MPI_Abort) in %d s",
            world_rank, abort_grace_s());
  nanosleep(&(struct timespec){abort_grace_s(), 0}, NULL);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Unregister every completed message's handle; the caller owns the
 * buffers. A message still in flight keeps its handle (a failed request:
 * StarPU-MPI's shutdown is then skipped, the process exits). */
bool comm_stop(void) {
  bool all = true;
  for (int i = 0; i < n_msgs; i++) {
    if (atomic_load(&msgs[i].st->done))
      starpu_data_unregister(msgs[i].h);
    else
      all = false;
  }
  free(msgs);
  msgs = NULL;
  n_msgs = cap_msgs = 0;
  if (mpi_started && all) {
    starpu_mpi_shutdown();
    mpi_started = false;
    if (own_starpu) starpu_shutdown();
    own_starpu = false;
  }
  return all;
}

#else /* no MPI in this build */

bool comm_mpi_built(void) { return false; }
int comm_begin(int *argc, char ***argv, char *err, size_t err_len) {
  (void)argc, (void)argv, (void)err, (void)err_len;
  return 0;
}
void comm_end(void) {}
int comm_put(const void *buf, size_t bytes, int to, int tag) {
  (void)buf, (void)bytes, (void)to, (void)tag;
  return CEDAR_EUNSUPPORTED;
}
int comm_take(int from, int tag, void **buf, size_t *bytes, int *src) {
  (void)from, (void)tag, (void)buf, (void)bytes, (void)src;
  return CEDAR_EUNSUPPORTED;
}
bool comm_all_ok(bool ok) { return ok; }
int comm_start(char *err, size_t err_len) {
  snprintf(err, err_len, "this build has no StarPU-MPI (install libopenmpi-dev and rebuild)");
  return CEDAR_EUNSUPPORTED;
}
int comm_send(void *buf, size_t bytes, int dest, int tag, struct comm_msg *s) {
  (void)buf, (void)bytes, (void)dest, (void)tag, (void)s;
  return CEDAR_EUNSUPPORTED;
}
int comm_recv(void *buf, size_t bytes, int src, int tag, struct comm_msg *s) {
  (void)buf, (void)bytes, (void)src, (void)tag, (void)s;
  return CEDAR_EUNSUPPORTED;
}
bool comm_stop(void) { return true; }
bool comm_meet(double dl) {
  (void)dl;
  return true;
}

int comm_barrier(void) { return CEDAR_EUNSUPPORTED; }
int comm_bandwidth(int a, int b, size_t bytes, int reps, double *bytes_per_s) {
  (void)a, (void)b, (void)bytes, (void)reps;
  *bytes_per_s = 0;
  return CEDAR_EUNSUPPORTED;
}
int comm_share(double *v, int n, int from, int to) {
  (void)v, (void)n, (void)from, (void)to;
  return CEDAR_EUNSUPPORTED;
}
void comm_abort(const char *why) { (void)why; }

#endif

void comm_die(const char *who, int nth) {
  fprintf(stderr, "cedar: test fault: %s kills itself (SIGKILL) at message %d\n", who, nth);
  fflush(stderr);
  raise(SIGKILL);
}
