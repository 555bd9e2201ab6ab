/* sample.cu: the sampler on CUDA (see sample.cuh; ops/sample.c is the rule). */
#include "kernels/sample.cuh"

#include "base/check.h"
#include "kernels/kcall.cuh"

enum { SAMPLE_THREADS = 64 };

__device__ __forceinline__ uint64_t rng_next(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* a is placed after b: lower probability, or equal and a higher id. */
__device__ __forceinline__ bool placed_after(const float *p, int32_t a, int32_t b) {
  return p[a] < p[b] || (p[a] == p[b] && a > b);
}

__device__ void sift_down(int32_t *o, const float *p, int root, int end) {
  for (;;) {
    int child = 2 * root + 1;
    if (child >= end) return;
    if (child + 1 < end && placed_after(p, o[child + 1], o[child])) child++;
    if (!placed_after(p, o[child], o[root])) return;
    const int32_t t = o[root];
    o[root] = o[child], o[child] = t;
    root = child;
  }
}

__global__ void sample_kernel(int32_t *ids, float *prob, int32_t *order, const float *logits, int64_t n, int V,
                              float temperature, float top_p, uint64_t seed) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float *l = logits + (size_t)i * V;
  float *p = prob + (size_t)i * V;
  if (!(temperature > 0.0f)) { /* greedy: one-hot, no draw */
    int32_t best = -1;
    float bv = -INFINITY;
    for (int y = 0; y < V; y++)
      if (l[y] > bv) bv = l[y], best = y;
    for (int y = 0; y < V; y++) p[y] = y == best ? 1.0f : 0.0f;
    ids[i] = best;
    return;
  }
  float m = -INFINITY, sum = 0.0f;
  for (int y = 0; y < V; y++) m = l[y] > m ? l[y] : m;
  for (int y = 0; y < V; y++) p[y] = expf(__fdiv_rn(__fadd_rn(l[y], -m), temperature)), sum = __fadd_rn(sum, p[y]);
  for (int y = 0; y < V; y++) p[y] = __fdiv_rn(p[y], sum);
  if (top_p < 1.0f) { /* the nucleus: the longest needed prefix of the placement order */
    double total = 0.0;
    for (int y = 0; y < V; y++) total = __dadd_rn(total, (double)p[y]);
    const double threshold = __dmul_rn((double)top_p, total);
    int32_t *o = order + (size_t)i * V;
    for (int y = 0; y < V; y++) o[y] = y;
    for (int r = V / 2 - 1; r >= 0; r--) sift_down(o, p, r, V);
    for (int end = V - 1; end > 0; end--) {
      const int32_t t = o[0];
      o[0] = o[end], o[end] = t;
      sift_down(o, p, 0, end);
    }
    double mass = 0.0;
    int kept = 0;
    while (kept < V && p[o[kept]] > 0.0f) {
      mass = __dadd_rn(mass, (double)p[o[kept++]]);
      if (mass >= threshold) break;
    }
    for (int k = kept; k < V; k++) p[o[k]] = 0.0f;
    for (int k = 0; k < kept; k++) p[o[k]] = (float)__ddiv_rn((double)p[o[k]], mass);
  }
  double total = 0.0;
  for (int y = 0; y < V; y++) total = __dadd_rn(total, (double)p[y]);
  uint64_t state = seed + (uint64_t)i * 0x9E3779B97F4A7C15ull; /* i draws in: the CPU's order of rows */
  const double u = __dmul_rn((double)(rng_next(&state) >> 11) * 0x1p-53, total);
  double run = 0.0;
  int32_t last = -1, pick = -1;
  for (int y = 0; y < V && pick < 0; y++) {
    if (!(p[y] > 0.0f)) continue;
    run = __dadd_rn(run, (double)p[y]);
    last = y;
    if (run > u) pick = y;
  }
  ids[i] = pick >= 0 ? pick : last;
}

cudaError_t kern_sample_rows(int32_t *ids, float *prob, int32_t *order, const float *logits, int64_t n, int V,
                             float temperature, float top_p, uint64_t seed, cudaStream_t st) {
  if (n <= 0) return cudaSuccess;
  sample_kernel<<<kcall_blocks(n, SAMPLE_THREADS), SAMPLE_THREADS, 0, st>>>(ids, prob, order, logits, n, V,
                                                                             temperature, top_p, seed);
  return cudaGetLastError();
}

int kern_sample_run(const struct op_desc *self, struct op_io *io) {
  struct op_sample_call a = {};
  int rc = op_sample_prepare(self, io, &a);
  if (rc) return rc;
  if (a.top_k > 0) /* top-k (ops/sample.h) has no CUDA twin yet: refused, never ignored */
    return op_io_fail(io, "sample: top_k %d is not implemented by the CUDA kernel yet; run sample on the CPU", a.top_k);
  for (int64_t i = 0; i < a.n; i++) /* the CPU refuses the first unusable row */
    if (!op_sample_row_usable(a.logits + (size_t)i * a.V, a.V)) return op_sample_bad_row(io, i);
  const size_t pb = (size_t)a.n * a.V * sizeof(float);
  struct kcall c;
  kcall_begin(&c, self, io);
  const float *logits = (const float *)kcall_upload(&c, a.logits, pb, "logits");
  float *prob = (float *)kcall_alloc(&c, pb, "prob");
  int32_t *ids = (int32_t *)kcall_alloc(&c, (size_t)a.n * sizeof(int32_t), "ids");
  int32_t *order = (int32_t *)kcall_alloc(&c, (size_t)a.n * a.V * sizeof(int32_t), "order");
  if (kcall_ok(&c))
    kcall_cuda(&c, kern_sample_rows(ids, prob, order, logits, a.n, a.V, a.temperature, a.top_p, a.seed, c.stream),
               "sample_kernel");
  kcall_download(&c, a.ids, ids, (size_t)a.n * sizeof(int32_t), "ids");
  kcall_download(&c, a.prob, prob, pb, "prob");
  return kcall_end(&c);
}
