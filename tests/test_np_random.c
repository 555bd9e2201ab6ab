/* test_np_random.c: ops/np_random.h (NumPy's PCG64 + SeedSequence + bounded
 * integers) and the Engram multipliers built on it, live against Debian's
 * numpy (python3-numpy): raw 64-bit and 32-bit draws for several seeds, and
 * default_rng(10007 l).integers(0, (INT64_MAX // Vc) // 2, size=4,
 * dtype=int64) * 2 + 1 for layers 0..40 and compressed vocabularies that
 * take both of numpy's Lemire paths (Vc >= 2^30 -> 32-bit draws). Exit 77
 * (skip) when python3 or numpy is missing. test_ops_engram keeps fixed
 * vectors that need no python.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/engram.h"
#include "ops/np_random.h"
#include "tests/harness.h"

static const int64_t VCS[] = {1, 2, 37, 512, 99045, 99092, 129280, 1000003, 1 << 30, 2147483647};
enum { N_VC = sizeof VCS / sizeof VCS[0], N_LAYERS = 41, N_SEEDS = 5 };

int main(void) {
  char script[4096];
  int len = snprintf(script, sizeof script,
                     "import numpy as np\n"
                     "I=np.iinfo(np.int64).max\n"
                     "for s in [0,1,10007,140098,2**40+3]:\n"
                     "  g=np.random.default_rng(s)\n"
                     "  print(*g.integers(0,2**64,size=3,dtype=np.uint64))\n"
                     "  print(*np.random.default_rng(s).integers(0,2**32,size=3,dtype=np.uint32))\n"
                     "for vc in [");
  for (int i = 0; i < N_VC; i++) len += snprintf(script + len, sizeof script - len, "%s%" PRId64, i ? "," : "", VCS[i]);
  snprintf(script + len, sizeof script - len,
           "]:\n"
           "  for l in range(%d):\n"
           "    print(*(np.random.default_rng(10007*l).integers(0,(I//vc)//2,size=4,dtype=np.int64)*2+1))\n",
           N_LAYERS);
  char path[64], cmd[128];
  snprintf(path, sizeof path, "/tmp/cedar_np_random_%d.py", (int)getpid()); /* one per process: ctest -j */
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s 2>/dev/null", path);
  FILE *f = fopen(path, "w");
  if (!f) return fprintf(stderr, "cannot write the numpy script\n"), 1;
  fputs(script, f);
  fclose(f);
  FILE *p = popen(cmd, "r");
  if (!p) return fprintf(stderr, "SKIP: no python3\n"), 77;
  static const uint64_t seeds[N_SEEDS] = {0, 1, 10007, 140098, (1ull << 40) + 3};
  int lines = 0;
  for (int s = 0; s < N_SEEDS; s++) {
    uint64_t want[3];
    if (fscanf(p, "%" SCNu64 " %" SCNu64 " %" SCNu64, &want[0], &want[1], &want[2]) != 3) break;
    struct np_pcg64 g;
    np_default_rng(&g, seeds[s]);
    for (int k = 0; k < 3; k++) EXPECT(np_next_u64(&g) == want[k], "seed %" PRIu64 " u64 draw %d", seeds[s], k);
    uint32_t w32[3];
    if (fscanf(p, "%" SCNu32 " %" SCNu32 " %" SCNu32, &w32[0], &w32[1], &w32[2]) != 3) break;
    np_default_rng(&g, seeds[s]);
    for (int k = 0; k < 3; k++) EXPECT(np_next_u32(&g) == w32[k], "seed %" PRIu64 " u32 draw %d", seeds[s], k);
    lines += 2;
  }
  for (int v = 0; v < N_VC && lines == 2 * N_SEEDS + v * N_LAYERS; v++)
    for (int l = 0; l < N_LAYERS; l++) {
      int64_t want[4];
      if (fscanf(p, "%" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64, &want[0], &want[1], &want[2], &want[3]) != 4) break;
      uint64_t m[4];
      op_engram_multipliers_numpy(m, l, 4, VCS[v]);
      for (int k = 0; k < 4; k++)
        EXPECT((int64_t)m[k] == want[k], "layer %d Vc %" PRId64 " k %d: %" PRId64 ", numpy %" PRId64, l, VCS[v], k,
               (int64_t)m[k], want[k]);
      lines++;
    }
  int rc = pclose(p);
  remove(path);
  if (lines == 0) return fprintf(stderr, "SKIP: python3 with numpy not available (rc %d)\n", rc), 77;
  EXPECT(lines == 2 * N_SEEDS + N_VC * N_LAYERS, "read %d of %d numpy lines", lines, 2 * N_SEEDS + N_VC * N_LAYERS);
  printf("np_random: %d numpy lines compared\n", lines);
  return h_report("np_random");
}
