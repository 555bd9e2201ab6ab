/* qlinear.cu: linear layers from stored-format weights on CUDA (see
 * qlinear.cuh). */
#include "kernels/qlinear.cuh"

#include "base/check.h"
#include "kernels/kcall.cuh"
#include "ops/num_codec.h"

enum { QL_LANES = 16, QL_OUTS = 8, QL_ROWS = 4, QL_THREADS = QL_LANES * QL_OUTS };

/* Weight (o, k) as the CPU's loaders give it: dec(q) * 2^(s - 127). */
template <int FMT>
__device__ __forceinline__ float ql_weight(const void *__restrict__ data, const uint8_t *__restrict__ scale, int in,
                                           int tc, int o, int k) {
  const size_t e = (size_t)o * in + k;
  if (FMT == OP_W_F32) return ((const float *)data)[e];
  if (FMT == OP_W_BF16) return __uint_as_float((uint32_t)((const uint16_t *)data)[e] << 16);
  if (FMT == OP_W_FP8) {
    const float s = op_hd_e8m0_decode(scale[(size_t)(o / OP_QW_BLOCK) * tc + k / OP_QW_BLOCK]);
    return __fmul_rn(op_hd_e4m3_decode(((const uint8_t *)data)[e]), s);
  }
  const uint8_t b = ((const uint8_t *)data)[e / 2];
  const float s = op_hd_e8m0_decode(scale[(size_t)o * (in / OP_QW_BLOCK) + k / OP_QW_BLOCK]);
  return __fmul_rn(op_hd_e2m1_decode((uint8_t)(k & 1 ? b >> 4 : b & 15)), s);
}

/* At least 8 CTAs per SM (64 registers a thread): without the minimum,
 * ptxas gave the F32 variant 32 registers and spilled 24 bytes. */
template <int FMT>
__global__ void __launch_bounds__(QL_THREADS, 8) qlinear_kernel(float *__restrict__ y, const float *__restrict__ x,
                                                             const void *__restrict__ data,
                                                             const uint8_t *__restrict__ scale, int n, int in, int out,
                                                             int ldx, int ldy) {
  const int l = threadIdx.x % QL_LANES, o = blockIdx.x * QL_OUTS + threadIdx.x / QL_LANES;
  const int i0 = blockIdx.y * QL_ROWS, tc = (in + OP_QW_BLOCK - 1) / OP_QW_BLOCK;
  const bool live = o < out;
  float acc[QL_ROWS];
#pragma unroll
  for (int r = 0; r < QL_ROWS; r++) acc[r] = 0.0f;
  const int in16 = in - in % QL_LANES;
  if (live) {
#pragma unroll 4
    for (int k = l; k < in16; k += QL_LANES) {
      const float wv = ql_weight<FMT>(data, scale, in, tc, o, k);
#pragma unroll
      for (int r = 0; r < QL_ROWS; r++)
        if (i0 + r < n) acc[r] = __fadd_rn(acc[r], __fmul_rn(x[(size_t)(i0 + r) * ldx + k], wv));
    }
    if (in16 < in) { /* the short last chunk: lanes past in add 0 * 0, as the CPU's zero padding */
      const int k = in16 + l;
      const float wv = k < in ? ql_weight<FMT>(data, scale, in, tc, o, k) : 0.0f;
#pragma unroll
      for (int r = 0; r < QL_ROWS; r++)
        if (i0 + r < n) acc[r] = __fadd_rn(acc[r], __fmul_rn(k < in ? x[(size_t)(i0 + r) * ldx + k] : 0.0f, wv));
    }
  }
  /* the halving tree: lane l takes l + 8, then l + 4, l + 2, l + 1 */
#pragma unroll
  for (int r = 0; r < QL_ROWS; r++) {
    float v = acc[r];
#pragma unroll
    for (int h = QL_LANES / 2; h >= 1; h /= 2) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, h, QL_LANES));
    if (live && l == 0 && i0 + r < n) y[(size_t)(i0 + r) * ldy + o] = v;
  }
}

cudaError_t kern_qlinear(float *y, const float *x, const struct op_qweight *w, int n, int ldx, int ldy,
                         cudaStream_t st) {
  if (n <= 0 || w->out <= 0) return cudaSuccess;
  if (w->in <= 0) return cudaMemset2DAsync(y, (size_t)ldy * sizeof *y, 0, (size_t)w->out * sizeof *y, (size_t)n, st);
  const dim3 grid(kcall_blocks(w->out, QL_OUTS), kcall_blocks(n, QL_ROWS));
  switch (w->fmt) {
    case OP_W_BF16:
      qlinear_kernel<OP_W_BF16><<<grid, QL_THREADS, 0, st>>>(y, x, w->data, w->scale, n, w->in, w->out, ldx, ldy);
      break;
    case OP_W_FP8:
      qlinear_kernel<OP_W_FP8><<<grid, QL_THREADS, 0, st>>>(y, x, w->data, w->scale, n, w->in, w->out, ldx, ldy);
      break;
    case OP_W_FP4:
      qlinear_kernel<OP_W_FP4><<<grid, QL_THREADS, 0, st>>>(y, x, w->data, w->scale, n, w->in, w->out, ldx, ldy);
      break;
    default:
      qlinear_kernel<OP_W_F32><<<grid, QL_THREADS, 0, st>>>(y, x, w->data, w->scale, n, w->in, w->out, ldx, ldy);
      break;
  }
  return cudaGetLastError();
}

/* ---- op slot ---------------------------------------------------------------------------- */

int kern_qlinear_run(const struct op_desc *self, struct op_io *io) {
  struct op_qlinear_call a;
  int rc = op_qlinear_prepare(self, io, &a);
  if (rc) return rc;
  struct kcall c;
  kcall_begin(&c, self, io);
  const size_t yb = (size_t)a.n * a.w.out * sizeof(float);
  struct op_qweight w = a.w;
  w.data = kcall_upload(&c, a.w.data, op_qweight_data_bytes(&a.w), "w");
  w.scale = (const uint8_t *)kcall_upload(&c, a.w.scale, op_qweight_scale_bytes(&a.w), "scale");
  const float *x = (const float *)kcall_upload(&c, a.x, (size_t)a.n * a.w.in * sizeof(float), "x");
  float *y = (float *)kcall_alloc(&c, yb, "y");
  if (kcall_ok(&c)) kcall_cuda(&c, kern_qlinear(y, x, &w, a.n, a.w.in, a.w.out, c.stream), "qlinear_kernel");
  kcall_download(&c, a.y, y, yb, "y");
  return kcall_end(&c);
}
