/* serve_sim_batch.h: `cedar serve-sim --max-batch N` (cli/serve_sim_batch.c),
 * which cmd_serve_sim.c hands its arguments to when --max-batch is given. */
#ifndef CEDAR_CLI_SERVE_SIM_BATCH_H
#define CEDAR_CLI_SERVE_SIM_BATCH_H

int serve_sim_batch(int argc, char **argv);

#endif
