/* test_gpu_compress_step.cu: the compressor's step inside a CUDA graph
 * segment (kernels/compressor.cuh: kern_compress_step, the tail's count,
 * first position and the committed entries read from device memory)
 * against the eager path (kern_compress_tail with those values as host
 * arguments, its entries copied to their pages as runtime/device/node_cuda_attn.cu
 * does), one new row a step, bitwise; on a GPU only.
 *
 * For ratios 4, 2 and 1, STEPS steps of random rows through three copies
 * of one source (pages, tail):
 *   A  eager: kern_compress_tail, then the emitted entries into A's pages;
 *   B  one CUDA graph of kern_compress_step captured at step 0 and replayed
 *      at every step, the step's values copied into its device block first;
 *   C  kern_compress_step launched eagerly every step.
 * After the steps, the committed entries' bytes in the three page pools and
 * the tails' pending rows must be identical. B is the point: a graph made at
 * the first step (count 0, nothing committed) writes the right entry at the
 * right place at every later step, and only when a group closes.
 * The row projections and the indexer GEMM have the same shapes on both
 * paths for one row, and the pooling, norms, RoPE and packing are the same
 * kernels, so the bytes must agree exactly (no tolerance).
 *
 * Exit 77 without a device; ctest gpu_compress_step; run by tests/gpu/run.sh.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/compressor.cuh"
#include "tests/gpu/gpu_test.cuh"
#include "ops/formats.h"
#include "ops/rope.h"

#define HIDDEN 96
#define D 64
#define DI 32
#define PAGE_ENTRIES 4
#define PAGES 16
#define STEPS 37 /* several groups of every ratio, ending with pending rows */

struct step_params { /* what the parameter block holds for the step, the fields kern_compress_step reads */
  int32_t cnt;
  int64_t pos0;
  int64_t e0;
};

struct source {
  uint8_t *pool;             /* (PAGES, PAGE_ENTRIES, eb) */
  uint8_t **table;           /* device page table */
  float *tv, *tg;            /* tail rows (ratio, D) */
  int count;
  int64_t pos0, n_entries;   /* host metadata, as the request keeps it */
};

static int fails;
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { return gt_frand(&rng); }

static float *dev_random(size_t n, float scale) {
  float *h = (float *)malloc(n * sizeof(float)), *d;
  for (size_t i = 0; i < n; i++) h[i] = frand() * scale;
  CK(cudaMalloc(&d, n * sizeof(float)));
  CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
  free(h);
  return d;
}

static void source_open(struct source *s, size_t eb, int ratio) {
  memset(s, 0, sizeof *s);
  CK(cudaMalloc(&s->pool, (size_t)PAGES * PAGE_ENTRIES * eb));
  CK(cudaMemset(s->pool, 0, (size_t)PAGES * PAGE_ENTRIES * eb));
  uint8_t *host[PAGES];
  for (int p = 0; p < PAGES; p++) host[p] = s->pool + (size_t)p * PAGE_ENTRIES * eb;
  CK(cudaMalloc(&s->table, sizeof host));
  CK(cudaMemcpy(s->table, host, sizeof host, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&s->tv, sizeof(float) * ratio * D));
  CK(cudaMalloc(&s->tg, sizeof(float) * ratio * D));
  CK(cudaMemset(s->tv, 0, sizeof(float) * ratio * D));
  CK(cudaMemset(s->tg, 0, sizeof(float) * ratio * D));
}

static void source_close(struct source *s) {
  cudaFree(s->pool), cudaFree(s->table), cudaFree(s->tv), cudaFree(s->tg);
}

/* The host metadata after one row (append_entries' rule). */
static int advance(struct source *s, int ratio) {
  const int total = s->count + 1, emit = total / ratio;
  s->pos0 += (int64_t)emit * ratio;
  s->count = total - emit * ratio;
  s->n_entries += emit;
  return emit;
}

static bool same(const void *a, const void *b, size_t n, const char *what, int ratio) {
  if (!memcmp(a, b, n)) return true;
  fprintf(stderr, "FAIL ratio %d: %s differ\n", ratio, what);
  fails++;
  return false;
}

static void run_ratio(int ratio, cublasHandle_t h, cudaStream_t st) {
  struct op_rope rope, rope_i;
  if (op_rope_init_params(&rope, D, 16, true, &op_rope_params_csa) ||
      op_rope_init_params(&rope_i, DI, 16, true, &op_rope_params_csa)) {
    fprintf(stderr, "FAIL rope init\n");
    exit(1);
  }
  struct op_comp_layer L = {};
  L.ratio = ratio, L.hidden = HIDDEN, L.d = D, L.idx_dim = DI;
  L.W_kv = dev_random((size_t)D * HIDDEN, 0.2f);
  L.W_gate = ratio > 1 ? dev_random((size_t)D * HIDDEN, 0.4f) : NULL;
  L.gamma = dev_random(D, 1.0f);
  L.W_ik = dev_random((size_t)DI * D, 0.3f);
  L.k_norm = true;
  L.k_gamma = dev_random(DI, 1.0f);
  L.eps = 1e-6f;
  L.rope = &rope, L.rope_i = &rope_i;
  L.main_fmt = op_kv_fp4_format(16, OP_NIBBLE_EVEN_LOW);
  L.idx_fmt = op_kv_mxfp4_format(32, OP_MX_CEIL, OP_NIBBLE_EVEN_LOW);
  const size_t main_b = op_kv_bytes(&L.main_fmt, D), eb = main_b + op_kv_bytes(&L.idx_fmt, DI);

  struct source A, B, C;
  source_open(&A, eb, ratio), source_open(&B, eb, ratio), source_open(&C, eb, ratio);
  float *u, *scratch, *kM, *kI;
  uint8_t *entries;
  int64_t *epos;
  void *sB, *sC;
  struct step_params *pB, *pC;
  CK(cudaMalloc(&u, sizeof(float) * HIDDEN));
  CK(cudaMalloc(&scratch, sizeof(float) * kern_compress_scratch_floats(ratio, ratio, D, DI)));
  CK(cudaMalloc(&kM, sizeof(float) * D));
  CK(cudaMalloc(&kI, sizeof(float) * DI));
  CK(cudaMalloc(&entries, eb));
  CK(cudaMalloc(&epos, sizeof(int64_t)));
  CK(cudaMalloc(&sB, kern_compress_step_scratch_bytes(1, ratio, D, DI, eb)));
  CK(cudaMalloc(&sC, kern_compress_step_scratch_bytes(1, ratio, D, DI, eb)));
  CK(cudaMalloc(&pB, sizeof *pB));
  CK(cudaMalloc(&pC, sizeof *pC));

  /* B: captured once, before the first step (count 0, nothing committed). */
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
  BK(kern_compress_step(h, B.table, PAGE_ENTRIES, eb, 0, main_b, B.tv, B.tg, &pB->cnt, &pB->pos0, &pB->e0, u, 1, &L,
                        sB, st));
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));

  float row[HIDDEN];
  for (int t = 0; t < STEPS; t++) {
    for (int i = 0; i < HIDDEN; i++) row[i] = frand();
    CK(cudaMemcpyAsync(u, row, sizeof row, cudaMemcpyHostToDevice, st));
    /* A: the eager path with host values */
    const int emit = (A.count + 1) / ratio;
    if (emit) CK(cudaMemcpyAsync(epos, &A.pos0, sizeof(int64_t), cudaMemcpyHostToDevice, st));
    BK(kern_compress_tail(h, entries, eb, 0, main_b, kM, kI, A.tv, A.tg, A.count, u, epos, 1, &L, scratch, st));
    if (emit) {
      uint8_t *dst = A.pool + ((size_t)(A.n_entries / PAGE_ENTRIES) * PAGE_ENTRIES + A.n_entries % PAGE_ENTRIES) * eb;
      CK(cudaMemcpyAsync(dst, entries, eb, cudaMemcpyDeviceToDevice, st));
    }
    /* B and C: the step's values in device memory, then the replay / the launch */
    struct step_params hb = {B.count, B.pos0, B.n_entries}, hc = {C.count, C.pos0, C.n_entries};
    CK(cudaMemcpyAsync(pB, &hb, sizeof hb, cudaMemcpyHostToDevice, st));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaMemcpyAsync(pC, &hc, sizeof hc, cudaMemcpyHostToDevice, st));
    BK(kern_compress_step(h, C.table, PAGE_ENTRIES, eb, 0, main_b, C.tv, C.tg, &pC->cnt, &pC->pos0, &pC->e0, u, 1, &L,
                          sC, st));
    CK(cudaStreamSynchronize(st)); /* the host copies above read stack values */
    advance(&A, ratio), advance(&B, ratio), advance(&C, ratio);
  }
  CK(cudaStreamSynchronize(st));
  const size_t pool_b = (size_t)PAGES * PAGE_ENTRIES * eb;
  uint8_t *ha = (uint8_t *)malloc(pool_b), *hb = (uint8_t *)malloc(pool_b), *hc = (uint8_t *)malloc(pool_b);
  CK(cudaMemcpy(ha, A.pool, pool_b, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb, B.pool, pool_b, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hc, C.pool, pool_b, cudaMemcpyDeviceToHost));
  const size_t committed = (size_t)A.n_entries * eb; /* pages in order: entry e at e * eb */
  int nonzero = 0;
  for (size_t i = 0; i < committed; i++) nonzero += ha[i] != 0;
  if (A.n_entries != STEPS / ratio || !nonzero) {
    fprintf(stderr, "FAIL ratio %d: %lld entries (want %d), %d nonzero bytes\n", ratio, (long long)A.n_entries,
            STEPS / ratio, nonzero);
    fails++;
  }
  same(ha, hb, pool_b, "the graph replay's pages and the eager path's", ratio);
  same(ha, hc, pool_b, "the eager step's pages and the eager path's", ratio);
  if (ratio > 1 && A.count > 0) {
    const size_t tb = sizeof(float) * (size_t)A.count * D;
    float *ta = (float *)malloc(tb), *tbb = (float *)malloc(tb), *tcc = (float *)malloc(tb);
    CK(cudaMemcpy(ta, A.tv, tb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(tbb, B.tv, tb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(tcc, C.tv, tb, cudaMemcpyDeviceToHost));
    same(ta, tbb, tb, "tail rows (graph)", ratio);
    same(ta, tcc, tb, "tail rows (eager step)", ratio);
    CK(cudaMemcpy(ta, A.tg, tb, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(tbb, B.tg, tb, cudaMemcpyDeviceToHost));
    same(ta, tbb, tb, "tail gates (graph)", ratio);
    free(ta), free(tbb), free(tcc);
  }
  printf("ratio %d: %d steps, %lld entries, %d pending rows: %s\n", ratio, STEPS, (long long)A.n_entries, A.count,
         fails ? "FAIL" : "bitwise");
  free(ha), free(hb), free(hc);
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
  source_close(&A), source_close(&B), source_close(&C);
  cudaFree(u), cudaFree(scratch), cudaFree(kM), cudaFree(kI), cudaFree(entries), cudaFree(epos);
  cudaFree(sB), cudaFree(sC), cudaFree(pB), cudaFree(pC);
  cudaFree((void *)L.W_kv), cudaFree((void *)L.W_gate), cudaFree((void *)L.gamma), cudaFree((void *)L.W_ik),
      cudaFree((void *)L.k_gamma);
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    printf("test_gpu_compress_step: no CUDA device: skipped\n");
    return 77;
  }
  cublasHandle_t h;
  cudaStream_t st;
  BK(cublasCreate(&h));
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int ratios[] = {4, 2, 1};
  for (int i = 0; i < 3; i++) run_ratio(ratios[i], h, st);
  cublasDestroy(h);
  cudaStreamDestroy(st);
  if (fails) {
    fprintf(stderr, "test_gpu_compress_step: %d failure(s)\n", fails);
    return 1;
  }
  printf("test_gpu_compress_step: ok\n");
  return 0;
}
