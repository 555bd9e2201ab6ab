/* serve_ranks.h: `cedar serve` under mpirun (cli/serve_ranks.c): the MPI
 * side of serve/ranks.c's one-request-at-a-time engine thread. Rank 0's
 * srv_opts.ranks runs a request on every rank (serve_ranks_run) and ends the
 * others' wait (serve_ranks_stop); every other rank runs serve_ranks_follow.
 */
#ifndef CEDAR_CLI_SERVE_RANKS_H
#define CEDAR_CLI_SERVE_RANKS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/engine/engine.h"
#include "serve/serve.h"

/* srv_ranks.run with user = the engine: j sent to every other rank, run
 * here, and the ids of the rank that reports them into *out. */
int serve_ranks_run(void *user, const struct srv_rank_job *j, int32_t **out, int *n_out, char *err, size_t err_len);
/* srv_ranks.stop: every other rank leaves serve_ranks_follow. */
void serve_ranks_stop(void *user);
/* A rank other than 0: run what rank 0 sends until its stop. 0, or a
 * negative cedar_status with err. */
int serve_ranks_follow(struct rt_engine *e, char *err, size_t err_len);

#endif
