/* test_gpu_attn_speed.cu: cedar's sparse attention (kernels/attention.cuh,
 * kern_sparse_attn) at the flash widths, against the GPU's copy bandwidth
 * measured in the same process: issue 15's row "sparse attention decode at
 * flash shapes: >= 70% of HBM bandwidth for its bytes" (FlashMLA's sparse
 * decode is not built on the GPU machine: its source is not carried, so
 * the copy bandwidth is the reference, as the issue allows).
 *
 * Shape (plans/v41-flash.yaml, the FlashMLA sparse-decode anchor): one KV
 * head shared by 64 query heads, head_dim 512, Top-K 512 global entries of
 * the FP4 Main KV (E2M1 + E4M3 per 16: 288 B read per entry) out of 65536,
 * plus the 128-slot FP8 SWA ring (E4M3 + E8M0 per 32: 528 B a slot), the
 * sink, and the inverse RoPE (64 of 512 channels). Q queries (one decode
 * position each, Q from 1 to 128: a batch of decoding requests reads this
 * many lists) with their own random Top-K lists.
 *
 * Bytes counted per call: every query's Top-K entries' Main-KV parts and
 * the ring's slots as read by that query (a list's entries are read once
 * per query: no reuse is assumed across queries), its q and o (fp32,
 * 64 x 512 each) and its list; GB/s = bytes / median time (10 timed calls
 * after 3 warm-up ones, CUDA events). The reference: a 256 MiB
 * device-to-device copy, read + write, median of 10. The ratio is printed
 * against the 0.7 goal; nothing here asserts a speed (these are figures
 * for docs/PERF.md). It checks that the output is finite.
 *
 * Results: one JSON object to $CEDAR_GPU_JSON when set. Exit 77 without a
 * device. Run by tests/gpu/run.sh (step attn_speed).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.cuh"
#include "ops/formats.h"
#include "ops/rope.h"
#include "tests/gpu/gpu_test.cuh"

#define HEADS 64
#define HD 512
#define TOPK 512
#define WINDOW 128
#define ENTRIES 65536
#define PAGE_ENTRIES 64
#define ROPE_DIM 64
#define MAX_Q 128

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t urand(void) { return gt_urand(&rng); }
static float frand(void) { return gt_frand(&rng); }

static int cmpf(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Median milliseconds of reps timed runs of fn after 3 warm-up ones. */
template <typename F> static float median_ms(cudaStream_t st, int reps, F fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++) fn();
  float t[32];
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(a, st));
    fn();
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&t[i], a, b));
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  qsort(t, (size_t)reps, sizeof(float), cmpf);
  return t[reps / 2];
}

int main(void) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("test_gpu_attn_speed: no CUDA device: skipped\n");
    return 77;
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  /* the reference: a device-to-device copy, read + write */
  const size_t cb = (size_t)256 << 20;
  void *ca, *cbuf;
  CK(cudaMalloc(&ca, cb));
  CK(cudaMalloc(&cbuf, cb));
  CK(cudaMemset(ca, 0x3c, cb));
  float copy_ms = median_ms(st, 10, [&] { CK(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice, st)); });
  const double copy_gbs = 2.0 * (double)cb / (copy_ms * 1e-3) / 1e9;
  cudaFree(ca), cudaFree(cbuf);

  /* the KV: 64 distinct packed entries tiled over the pool (values do not change the time) */
  const struct op_kv_format main_fmt = op_kv_fp4_format(16, OP_NIBBLE_EVEN_LOW);
  const struct op_kv_format swa_fmt = op_kv_fp8_format(32, OP_SCALE_E8M0);
  const size_t eb = op_kv_bytes(&main_fmt, HD), sb = op_kv_bytes(&swa_fmt, HD);
  uint8_t *host = (uint8_t *)malloc((size_t)ENTRIES * eb);
  float row[HD];
  for (int e = 0; e < 64; e++) {
    for (int c = 0; c < HD; c++) row[c] = frand() * 4.0f;
    op_kv_pack(&main_fmt, host + (size_t)e * eb, row, HD);
  }
  for (int e = 64; e < ENTRIES; e++) memcpy(host + (size_t)e * eb, host + (size_t)(e % 64) * eb, eb);
  uint8_t *pool, **table;
  CK(cudaMalloc(&pool, (size_t)ENTRIES * eb));
  CK(cudaMemcpy(pool, host, (size_t)ENTRIES * eb, cudaMemcpyHostToDevice));
  const int pages = ENTRIES / PAGE_ENTRIES;
  uint8_t **ptab = (uint8_t **)malloc(sizeof(uint8_t *) * pages);
  for (int p = 0; p < pages; p++) ptab[p] = pool + (size_t)p * PAGE_ENTRIES * eb;
  CK(cudaMalloc(&table, sizeof(uint8_t *) * pages));
  CK(cudaMemcpy(table, ptab, sizeof(uint8_t *) * pages, cudaMemcpyHostToDevice));
  /* the ring: positions P - 127 .. P, every query at P sees them all */
  const int64_t P = 4 * (int64_t)ENTRIES + 3;
  uint8_t *hring = (uint8_t *)malloc((size_t)WINDOW * sb), *ring;
  int64_t hpos[WINDOW], *rpos;
  for (int s = 0; s < WINDOW; s++) {
    for (int c = 0; c < HD; c++) row[c] = frand() * 4.0f;
    op_kv_pack(&swa_fmt, hring + (size_t)s * sb, row, HD);
    hpos[s] = P - WINDOW + 1 + s;
  }
  CK(cudaMalloc(&ring, (size_t)WINDOW * sb));
  CK(cudaMalloc(&rpos, sizeof hpos));
  CK(cudaMemcpy(ring, hring, (size_t)WINDOW * sb, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(rpos, hpos, sizeof hpos, cudaMemcpyHostToDevice));
  /* queries, lists, sink */
  const size_t qf = (size_t)MAX_Q * HEADS * HD;
  float *hq = (float *)malloc(qf * sizeof(float)), *q, *o, *sink, hs[HEADS];
  for (size_t i = 0; i < qf; i++) hq[i] = frand();
  for (int h = 0; h < HEADS; h++) hs[h] = frand();
  int32_t *hidx = (int32_t *)malloc(sizeof(int32_t) * MAX_Q * TOPK), *idx, *n_used;
  for (int i = 0; i < MAX_Q * TOPK; i++) hidx[i] = (int32_t)(urand() % ENTRIES);
  int64_t hqp[MAX_Q], *qpos;
  for (int i = 0; i < MAX_Q; i++) hqp[i] = P;
  CK(cudaMalloc(&q, qf * sizeof(float)));
  CK(cudaMalloc(&o, qf * sizeof(float)));
  CK(cudaMalloc(&sink, sizeof hs));
  CK(cudaMalloc(&idx, sizeof(int32_t) * MAX_Q * TOPK));
  CK(cudaMalloc(&n_used, sizeof(int32_t) * MAX_Q));
  CK(cudaMalloc(&qpos, sizeof hqp));
  CK(cudaMemcpy(q, hq, qf * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sink, hs, sizeof hs, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(idx, hidx, sizeof(int32_t) * MAX_Q * TOPK, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(qpos, hqp, sizeof hqp, cudaMemcpyHostToDevice));
  void *scratch;
  CK(cudaMalloc(&scratch, kern_sparse_attn_scratch_bytes(MAX_Q, WINDOW, TOPK)));

  struct op_rope rope;
  if (op_rope_init_params(&rope, HD, ROPE_DIM, true, &op_rope_params_csa)) {
    fprintf(stderr, "FAIL rope init\n");
    return 1;
  }
  struct op_kv_view kv = {};
  kv.pages = table, kv.page_entries = PAGE_ENTRIES, kv.entry_bytes = eb, kv.main_off = 0, kv.idx_off = eb;
  kv.n_entries = ENTRIES, kv.ratio = 4, kv.main_w = HD, kv.idx_w = 0, kv.main_fmt = main_fmt;
  struct op_swa_view sv = {ring, rpos, WINDOW, sb, HD, swa_fmt};
  struct op_attn_params pr = {};
  pr.heads = HEADS, pr.head_dim = HD, pr.topk = TOPK, pr.window = WINDOW, pr.r0 = 0;
  pr.tau = op_attn_tau_default(HD), pr.sink = sink, pr.rope = &rope, pr.angles = NULL;

  const int qs[] = {1, 8, 32, 64, 128};
  char json[4096];
  int at = snprintf(json, sizeof json, "{\"copy_gbs\": %.1f, \"heads\": %d, \"head_dim\": %d, \"topk\": %d, "
                    "\"window\": %d, \"entry_bytes\": %zu, \"slot_bytes\": %zu, \"rows\": [", copy_gbs, HEADS, HD,
                    TOPK, WINDOW, eb, sb);
  printf("copy bandwidth (read + write): %.1f GB/s\n", copy_gbs);
  printf("%6s %10s %12s %10s %10s\n", "Q", "time_us", "bytes", "GB/s", "of copy");
  bool finite = true;
  for (int k = 0; k < (int)(sizeof qs / sizeof qs[0]); k++) {
    const int S = qs[k];
    float ms = median_ms(st, 10, [&] {
      CK(kern_sparse_attn(o, n_used, q, qpos, idx, &kv, &sv, S, &pr, scratch, st));
    });
    const double bytes = (double)S * (TOPK * (double)op_kv_bytes(&main_fmt, HD) + WINDOW * (double)sb +
                                      2.0 * HEADS * HD * sizeof(float) + TOPK * sizeof(int32_t));
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("%6d %10.1f %12.0f %10.1f %10.3f\n", S, ms * 1e3, bytes, gbs, gbs / copy_gbs);
    at += snprintf(json + at, sizeof json - (size_t)at, "%s{\"queries\": %d, \"us\": %.2f, \"bytes\": %.0f, "
                   "\"gbs\": %.1f, \"of_copy\": %.3f}", k ? ", " : "", S, ms * 1e3, bytes, gbs, gbs / copy_gbs);
  }
  float *ho = (float *)malloc(qf * sizeof(float));
  CK(cudaMemcpy(ho, o, qf * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < (size_t)MAX_Q * HEADS * HD; i++) finite = finite && isfinite(ho[i]);
  snprintf(json + at, sizeof json - (size_t)at, "], \"goal_of_copy\": 0.7, \"flashmla\": \"not built: its source is "
           "not carried to the GPU machine\", \"output_finite\": %s}\n", finite ? "true" : "false");
  const char *path = getenv("CEDAR_GPU_JSON");
  if (path) {
    FILE *f = fopen(path, "w");
    if (f) fputs(json, f), fclose(f);
  }
  if (!finite) {
    fprintf(stderr, "FAIL: the attention's output is not finite\n");
    return 1;
  }
  printf("test_gpu_attn_speed: ok (figures, not assertions)\n");
  return 0;
}
