/* weights_ckpt.h: the parts of `cedar weights init|check` that handle
 * released-layout checkpoint directories and content hashes
 * (cli/cmd_weights_ckpt.c; runtime/load/checkpoint.h does the work). Each returns
 * the command's exit status (0 ok, 1 failed). */
#ifndef CEDAR_CLI_WEIGHTS_CKPT_H
#define CEDAR_CLI_WEIGHTS_CKPT_H

#include <stdbool.h>
#include <stdint.h>

#include "scheduler/plan.h"

/* `weights init --layout released`: synthetic weights of p from seed into DIR. */
int cli_weights_init_released(const struct plan *p, uint64_t seed, uint64_t max_bytes, const char *dir,
                          uint64_t shard_bytes, const char *dequant, bool json);
/* Whether path names a directory. */
bool cli_weights_is_dir(const char *path);
/* `weights check DIR [--plan P] [--hash]`. */
int cli_weights_check_dir(const char *dir, const char *plan, bool hash, bool json);
/* `weights check --hash W`: record the missing hashes of one file (prints how many). */
int cli_weights_record_file(const char *path);

#endif
