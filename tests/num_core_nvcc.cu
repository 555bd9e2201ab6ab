/* num_core_nvcc.cu: the numeric-core headers (ops/num_*.h) compiled by nvcc
 * as host code, for tests/test_num_core.c: the loops of
 * tests/num_core_eval.h with the nc_nvcc_ prefix (C linkage from
 * tests/num_core_twin.h). Its functions run on this CPU; the test compares
 * them with the C build's, bit for bit. (On the device the same headers take
 * the _rn intrinsics of ops/num.h; that half runs in tests/gpu/.) */
#include <math.h>

#include "tests/num_core_twin.h"

#define NC_NAME(x) nc_nvcc_##x
#include "tests/num_core_eval.h"
