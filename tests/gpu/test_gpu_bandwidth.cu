/* test_gpu_bandwidth.cu: the GPU's measured device-to-device copy bandwidth,
 * the reference issue 15 measures sparse attention against when FlashMLA
 * cannot be built on the GPU machine (">= 70% of HBM bandwidth for its
 * bytes"). A copy of N bytes reads N and writes N, so the figure is 2N/t.
 *
 * 1 GiB buffers, 3 warm-up copies, then 20 timed with CUDA events; the
 * median of 5 such runs. Checks that a copy arrived (first and last words).
 * Results: one JSON object to $CEDAR_GPU_JSON when set. Exit 77 without a
 * device. Run by tests/gpu/run.sh; ctest gpu_bandwidth.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                                  \
  do {                                                                                            \
    cudaError_t _e = (call);                                                                      \
    if (_e != cudaSuccess) {                                                                      \
      fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(_e)); \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

static int cmp(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    printf("gpu_bandwidth: no CUDA device (%s): skipped\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  const size_t bytes = (size_t)1 << 30;
  unsigned *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 0x5a, bytes));
  CK(cudaMemset(b, 0, bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; i++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
  float gbs[5];
  for (int r = 0; r < 5; r++) {
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < 20; i++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    gbs[r] = (float)(2.0 * 20 * (double)bytes / (ms * 1e-3) / 1e9);
  }
  qsort(gbs, 5, sizeof(float), cmp);
  unsigned first = 0, last = 0;
  CK(cudaMemcpy(&first, b, sizeof first, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&last, (char *)b + bytes - sizeof last, sizeof last, cudaMemcpyDeviceToHost));
  int ok = first == 0x5a5a5a5au && last == 0x5a5a5a5au;
  printf("gpu_bandwidth: device-to-device copy %.0f GB/s (read + write, median of 5)%s\n", gbs[2],
         ok ? "" : "; FAIL: the copy did not arrive");
  const char *js = getenv("CEDAR_GPU_JSON");
  FILE *f = js ? fopen(js, "w") : NULL;
  if (f) {
    fprintf(f, "{\"test\": \"gpu_bandwidth\", \"copy_gbs\": %.1f, \"bytes\": %zu, \"ok\": %s}\n", gbs[2], bytes,
            ok ? "true" : "false");
    fclose(f);
  }
  cudaFree(a);
  cudaFree(b);
  return ok ? 0 : 1;
}
