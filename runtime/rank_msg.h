/* rank_msg.h: messages between the ranks of an MPI job through StarPU-MPI
 * (pd_mpi.c), for the runtime's multi-rank drivers: prefill and decode on
 * different ranks (pd_run.c) and layer stages (pipeline.c). Every wait a
 * caller makes on them has a deadline: a send or receive is detached and
 * completes by a flag the caller polls; the meeting of all ranks polls a
 * non-blocking barrier; what cannot finish ends the job (pd_mpi_abort).
 * Without MPI in the build every call answers "not built".
 */
#ifndef CEDAR_RUNTIME_RANK_MSG_H
#define CEDAR_RUNTIME_RANK_MSG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

/* One message's completion, written by StarPU-MPI's progress thread. */
struct pd_msg_state {
  atomic_int done;
  double t_post, t_done; /* pd_now() */
};

double pd_now(void);
/* Every rank of the world meets here before a request's messages (so a
 * slow start on one rank is not counted against the transfer's deadline);
 * false when the others did not come within dl seconds (the barrier stays
 * posted: the caller ends the job). */
bool pd_mpi_meet(double dl);
/* Start StarPU-MPI (StarPU too when the executor is direct). */
int pd_mpi_start(char *err, size_t err_len);
/* Post a detached send / receive of bytes at buf; s->done turns 1 when it
 * completes. */
int pd_mpi_send(void *buf, size_t bytes, int dest, int tag, struct pd_msg_state *s);
int pd_mpi_recv(void *buf, size_t bytes, int src, int tag, struct pd_msg_state *s);
/* Release the messages' handles and stop StarPU-MPI; false when a message
 * was still in flight (then StarPU-MPI stays up). */
bool pd_mpi_stop(void);
/* After a failed transfer with messages still posted: log why and end the
 * MPI job (MPI_Abort), since neither side could shut StarPU-MPI down. */
void pd_mpi_abort(const char *why);

/* A test fault: say so on stderr, then SIGKILL this process (pd.c). */
void pd_die(const char *who, int nth);

#endif
