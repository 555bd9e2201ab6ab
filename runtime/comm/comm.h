/* runtime/comm/comm.h: messages between the ranks of an MPI job through StarPU-MPI
 * (runtime/comm/comm_mpi.c), for the runtime's multi-rank drivers: prefill and decode on
 * different ranks (pd_run.c) and layer stages (pipeline.c). Every wait a
 * caller makes on them has a deadline: a send or receive is detached and
 * completes by a flag the caller polls; the meeting of all ranks polls a
 * non-blocking barrier; what cannot finish ends the job (comm_abort).
 * Without MPI in the build every call answers "not built".
 */
#ifndef CEDAR_RUNTIME_RANK_MSG_H
#define CEDAR_RUNTIME_RANK_MSG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

/* One message's completion, written by StarPU-MPI's progress thread. */
struct comm_msg {
  atomic_int done;
  double t_post, t_done; /* comm_now() */
};

double comm_now(void);
/* CEDAR_PD_DEADLINE_S, the deadline of every wait between ranks (P/D,
 * stages, experts): seconds in (0, 86400], default 60 when unset. A value
 * that is not such a number (abc, -1, nan, 0, 5x) is refused by
 * comm_deadline_check (cli/main.c, before any command runs: it used to
 * mean 60 s without a word); comm_deadline_s then still answers 60. */
#define COMM_DEADLINE_MAX_S 86400.0
double comm_deadline_s(void);
/* 0, or -1 with "CEDAR_PD_DEADLINE_S=<value>: why" in err. */
int comm_deadline_check(char *err, size_t err_len);
/* CEDAR_MPI_TEST_FAULT=die-init:R, die-agree:R or die-end:R: rank R
 * (OMPI_COMM_WORLD_RANK) SIGKILLs itself at that point ("init": before
 * MPI_Init_thread, "agree": before reporting to rank 0 in dist/pd_stage.c,
 * "end": before the ranks meet to finalize; tests/cli/pd_dead_rank.sh).
 * 0, or -1 when the value is none of these (refused by name). */
int comm_test_fault(const char *when);
/* Every rank of the world meets here before a request's messages (so a
 * slow start on one rank is not counted against the transfer's deadline);
 * false when the others did not come within dl seconds (the barrier stays
 * posted: the caller ends the job). */
bool comm_meet(double dl);
/* Start StarPU-MPI (StarPU too when the executor is direct). */
int comm_start(char *err, size_t err_len);
/* Post a detached send / receive of bytes at buf; s->done turns 1 when it
 * completes. */
int comm_send(void *buf, size_t bytes, int dest, int tag, struct comm_msg *s);
int comm_recv(void *buf, size_t bytes, int src, int tag, struct comm_msg *s);
/* Release the messages' handles and stop StarPU-MPI; false when a message
 * was still in flight (then StarPU-MPI stays up). */
bool comm_stop(void);
/* After a failed transfer with messages still posted: log why and end the
 * MPI job (MPI_Abort), since neither side could shut StarPU-MPI down. */
void comm_abort(const char *why);

/* The process's MPI world: comm_begin initialises MPI when this
 * process was started by mpirun (MPI built in and OMPI_COMM_WORLD_SIZE /
 * PMI_SIZE set); otherwise nothing. comm_world_size is then 0. Returns 0
 * or CEDAR_EUNSUPPORTED with a message. */
int comm_begin(int *argc, char ***argv, char *err, size_t err_len);
void comm_end(void);
int comm_world_size(void);
int comm_world_rank(void);
bool comm_mpi_built(void);
/* For `cedar bench pd` (plain MPI on MPI_COMM_WORLD, outside a request):
 * every rank waits here for the others, sleeping between polls (so a
 * waiting rank leaves the cores to the one working); the one-way bandwidth
 * in bytes/s from rank a to rank b with reps messages of `bytes` (the
 * other ranks return at once; a's result is sent to b, both return it);
 * and v[n] sent from rank `from` to rank `to` (in place on `to`). Return 0
 * or CEDAR_EUNSUPPORTED without MPI. */
int comm_barrier(void);
int comm_bandwidth(int a, int b, size_t bytes, int reps, double *bytes_per_s);
int comm_share(double *v, int n, int from, int to);

/* For `cedar serve` under mpirun (serve/ranks.c), plain MPI on
 * MPI_COMM_WORLD between requests: comm_put sends bytes to rank `to`;
 * comm_take waits, without a deadline (a server's ranks idle until the next
 * request; sleeping between polls), for a message from `from` (-1: any
 * rank) with tag, into *buf (malloc'ed, *bytes long; *src its sender);
 * comm_all_ok is true on every rank when ok is true on every rank. Return
 * 0 or CEDAR_EUNSUPPORTED without MPI. */
int comm_put(const void *buf, size_t bytes, int to, int tag);
int comm_take(int from, int tag, void **buf, size_t *bytes, int *src);
bool comm_all_ok(bool ok);
/* A test fault: say so on stderr, then SIGKILL this process (comm_mpi.c). */
void comm_die(const char *who, int nth);

#endif
