/* rope.cu: partial RoPE with YaRN frequencies on CUDA (see rope.cuh). */
#include "kernels/rope.cuh"

#include "base/check.h"
#include "kernels/kcall.cuh"

enum { ROPE_THREADS = 128, ROPE_MAX_PAIRS = 512 };

__global__ void rope_kernel(float *x, const struct op_rope r, const int64_t *__restrict__ pos, int heads, int ld,
                            int sign) {
  __shared__ float cs[ROPE_MAX_PAIRS], sn[ROPE_MAX_PAIRS];
  const int half = r.rope_dim / 2, off = r.last ? r.dim - r.rope_dim : 0;
  const int64_t p = pos[blockIdx.x];
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const double t = r.angle_f32 ? (double)__fmul_rn((float)p, (float)r.freq[j]) : __dmul_rn((double)p, r.freq[j]);
    double s, c;
    sincos(t, &s, &c);
    cs[j] = (float)c;
    sn[j] = (float)(sign < 0 ? -s : s);
  }
  __syncthreads();
  float *row = x + (size_t)blockIdx.x * ld;
  for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
    const int h = k / half, j = k % half;
    float *v = row + (size_t)h * r.dim + off + 2 * j;
    const float a = v[0], b = v[1];
    v[0] = __fsub_rn(__fmul_rn(a, cs[j]), __fmul_rn(b, sn[j]));
    v[1] = __fadd_rn(__fmul_rn(a, sn[j]), __fmul_rn(b, cs[j]));
  }
}

cudaError_t kern_rope_apply(float *x, const struct op_rope *r, const int64_t *pos, int n, int heads, int ld, int sign,
                            cudaStream_t st) {
  if (n <= 0 || heads <= 0 || r->rope_dim <= 0) return cudaSuccess;
  if (r->rope_dim / 2 > ROPE_MAX_PAIRS) return cudaErrorInvalidValue;
  rope_kernel<<<n, ROPE_THREADS, 0, st>>>(x, *r, pos, heads, ld, sign);
  return cudaGetLastError();
}

int kern_rope_run(const struct op_desc *self, struct op_io *io) {
  struct op_rope_call a;
  int rc = op_rope_prepare(self, io, &a);
  if (rc) return rc;
  struct kcall c;
  kcall_begin(&c, self, io);
  const size_t yb = (size_t)a.n * a.heads * a.r.dim * sizeof(float);
  float *y = (float *)kcall_upload(&c, a.x, yb, "x"); /* rotated in place, as the CPU run's copy */
  const int64_t *pos = (const int64_t *)kcall_upload(&c, a.pos, (size_t)a.n * sizeof(int64_t), "pos");
  if (kcall_ok(&c))
    kcall_cuda(&c, kern_rope_apply(y, &a.r, pos, a.n, a.heads, a.heads * a.r.dim, a.sign, c.stream), "rope_kernel");
  kcall_download(&c, a.y, y, yb, "y");
  return kcall_end(&c);
}
