/* bench_load.h: the checkpoint load figures of `cedar bench model --model
 * DIR` (cli/bench_load.c): load time against a plain read of the same files,
 * RSS against the weights' bytes. The load holds the stored formats
 * (ckpt_load_held), or F32 with f32 (--weights-format f32). Returns the
 * exit status. */
#ifndef CEDAR_CLI_BENCH_LOAD_H
#define CEDAR_CLI_BENCH_LOAD_H

#include <stdbool.h>

int bench_load(const char *dir, const char *plan_path, int repeat, bool json, bool f32);

#endif
