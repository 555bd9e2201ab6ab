/* weights_finite.h: whether a weights file's values are all finite (issue
 * 28 row 9). `cedar weights check` reads every tensor of a file or of each
 * shard of a checkpoint and refuses one holding a value that is not a
 * number: a NaN or infinity in F32/F64/F16/BF16, a NaN code in FP8 E4M3
 * (S.1111.111), an Inf/NaN in E5M2 (exponent all ones), or the E8M0 scale
 * 0xFF (the format's NaN: every value of its block would be NaN). `--hash`
 * records no hash for such a file. Integer and packed E2M1 (U8/I8) tensors
 * hold no such code.
 *
 * Not here: the loader, which maps tensors without reading every value
 * (runtime/weights.c, runtime/checkpoint.c).
 * Tested by tests/test_weights_finite.c and tests/cli/checkpoint_trust.sh.
 */
#ifndef CEDAR_RUNTIME_WEIGHTS_FINITE_H
#define CEDAR_RUNTIME_WEIGHTS_FINITE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/load/safetensors.h"
#include "runtime/load/weights.h"

/* The number of non-finite values of t; *first (may be NULL) the index of
 * the first, undefined when there is none. */
uint64_t weights_nonfinite_count(const struct st_tensor *t, uint64_t *first);

/* One problem per tensor of f holding a non-finite value, naming label
 * (the file), the tensor, the count and the first. Returns how many
 * tensors; pr may be NULL (count only). */
size_t weights_finite_check(const st_file_t *f, const char *label, struct weights_problems *pr);

#endif
