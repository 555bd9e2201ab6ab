/* formats.cu: KV storage formats on CUDA, byte for byte the CPU's (see
 * formats.cuh; the rules are ops/num_codec.h's). */
#include "kernels/formats.cuh"

#include "base/check.h"
#include "kernels/kcall.cuh"

enum { FMT_THREADS = 128 };

const char *kern_kv_pack_supported(const struct op_kv_format *f) {
  if (f->elem == OP_KV_E2M1 && f->scale == OP_KV_SCALE_E4M3) return NULL;
  if (f->elem == OP_KV_E2M1 && f->scale == OP_KV_SCALE_E8M0) return NULL;
  if (f->elem == OP_KV_E4M3 && f->scale == OP_KV_SCALE_E8M0 && f->rule == OP_KV_CEIL) return NULL;
  if (f->elem == OP_KV_E4M3 && f->scale == OP_KV_SCALE_F32) return NULL;
  return "the CUDA packer stores e2m1 with e4m3 or e8m0 scales and e4m3 with a ceil e8m0 or f32 scale";
}

__global__ void kv_pack_kernel(const struct op_kv_format f, uint8_t *out, const float *x, int64_t n, int W,
                               size_t bytes) {
  const int nb = W / f.block;
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= n * nb) return;
  const int64_t row = k / nb;
  kern_kv_pack_block(f, out + (size_t)row * bytes, x + (size_t)row * W, W, (int)(k % nb));
}

/* Unscaled bf16 / f32 elements, one thread per value. */
__global__ void kv_pack_plain_kernel(const struct op_kv_format f, uint8_t *out, const float *x, int64_t total, int W,
                                     size_t bytes) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= total) return;
  uint8_t *e = out + (size_t)(k / W) * bytes;
  const int i = (int)(k % W);
  if (f.elem == OP_KV_BF16) {
    const uint32_t u = op_hd_bf16_round_bits(op_hd_bits(x[k]));
    e[2 * i] = (uint8_t)(u >> 16), e[2 * i + 1] = (uint8_t)(u >> 24);
  } else {
    const uint32_t u = op_hd_bits(x[k]);
    for (int b = 0; b < 4; b++) e[4 * i + b] = (uint8_t)(u >> (8 * b));
  }
}

cudaError_t kern_kv_pack_rows(const struct op_kv_format *f, uint8_t *out, const float *x, int64_t n, int W,
                              cudaStream_t st) {
  const size_t bytes = op_kv_bytes(f, W);
  if (!bytes) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  if (f->elem == OP_KV_BF16 || f->elem == OP_KV_F32) {
    kv_pack_plain_kernel<<<kcall_blocks(n * W, FMT_THREADS), FMT_THREADS, 0, st>>>(*f, out, x, n * W, W, bytes);
    return cudaGetLastError();
  }
  if (kern_kv_pack_supported(f)) return cudaErrorNotSupported;
  kv_pack_kernel<<<kcall_blocks(n * (W / f->block), FMT_THREADS), FMT_THREADS, 0, st>>>(*f, out, x, n, W, bytes);
  return cudaGetLastError();
}

__global__ void kv_unpack_kernel(const struct op_kv_format f, float *out, const uint8_t *in, int64_t total, int W,
                                 size_t bytes) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= total) return;
  out[k] = kern_kv_value(f, in + (size_t)(k / W) * bytes, W, (int)(k % W));
}

cudaError_t kern_kv_unpack_rows(const struct op_kv_format *f, float *out, const uint8_t *in, int64_t n, int W,
                                cudaStream_t st) {
  const size_t bytes = op_kv_bytes(f, W);
  if (!bytes) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  kv_unpack_kernel<<<kcall_blocks(n * W, FMT_THREADS), FMT_THREADS, 0, st>>>(*f, out, in, n * W, W, bytes);
  return cudaGetLastError();
}

/* ---- op slots ------------------------------------------------------------------------- */

/* The op_kv_format of a formats descriptor's call (ops/formats.h's op_kv_*_format). */
static struct op_kv_format call_format(const struct op_fmt_call *a) {
  struct op_kv_format f = {};
  f.block = a->block, f.nibble = a->nibble, f.floor = 0.0f, f.bf16 = false;
  if (a->kind == OP_FMT_FP4) {
    f.elem = OP_KV_E2M1, f.scale = OP_KV_SCALE_E4M3, f.rule = OP_KV_ROUNDUP;
  } else if (a->kind == OP_FMT_MXFP4) {
    f.elem = OP_KV_E2M1, f.scale = OP_KV_SCALE_E8M0, f.rule = a->rule == OP_MX_OCP ? OP_KV_OCP : OP_KV_CEIL;
  } else {
    const bool e8 = a->scale == OP_SCALE_E8M0;
    f.elem = OP_KV_E4M3, f.scale = e8 ? OP_KV_SCALE_E8M0 : OP_KV_SCALE_F32, f.rule = e8 ? OP_KV_CEIL : OP_KV_FLOAT;
    f.nibble = OP_NIBBLE_EVEN_LOW;
  }
  return f;
}

static int fmt_run(const struct op_desc *self, struct op_io *io, enum op_fmt_kind kind, bool pack) {
  struct op_fmt_call a;
  int rc = op_fmt_prepare(self, io, kind, pack, &a);
  if (rc) return rc;
  const struct op_kv_format f = call_format(&a);
  const size_t fb = (size_t)a.n * a.W * sizeof(float), eb = (size_t)a.n * a.bytes;
  struct kcall c;
  kcall_begin(&c, self, io);
  void *in = kcall_upload(&c, a.in, pack ? fb : eb, pack ? "x" : "entries");
  void *out = kcall_alloc(&c, pack ? eb : fb, pack ? "entries" : "x");
  if (kcall_ok(&c))
    kcall_cuda(&c,
               pack ? kern_kv_pack_rows(&f, (uint8_t *)out, (const float *)in, a.n, a.W, c.stream)
                    : kern_kv_unpack_rows(&f, (float *)out, (const uint8_t *)in, a.n, a.W, c.stream),
               pack ? "kv_pack_kernel" : "kv_unpack_kernel");
  kcall_download(&c, a.out, out, pack ? eb : fb, pack ? "entries" : "x");
  return kcall_end(&c);
}

int kern_fp4_pack_run(const struct op_desc *self, struct op_io *io) { return fmt_run(self, io, OP_FMT_FP4, true); }
int kern_fp4_unpack_run(const struct op_desc *self, struct op_io *io) { return fmt_run(self, io, OP_FMT_FP4, false); }
int kern_mxfp4_pack_run(const struct op_desc *self, struct op_io *io) { return fmt_run(self, io, OP_FMT_MXFP4, true); }
int kern_mxfp4_unpack_run(const struct op_desc *self, struct op_io *io) {
  return fmt_run(self, io, OP_FMT_MXFP4, false);
}
int kern_fp8_pack_run(const struct op_desc *self, struct op_io *io) { return fmt_run(self, io, OP_FMT_FP8, true); }
int kern_fp8_unpack_run(const struct op_desc *self, struct op_io *io) { return fmt_run(self, io, OP_FMT_FP8, false); }

__global__ void bf16_round_kernel(float *x, int64_t n) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k < n) x[k] = op_hd_bf16_round(x[k]);
}

cudaError_t kern_bf16_round(float *x, int64_t n, cudaStream_t st) {
  if (n <= 0) return cudaSuccess;
  bf16_round_kernel<<<kcall_blocks(n, FMT_THREADS), FMT_THREADS, 0, st>>>(x, n);
  return cudaGetLastError();
}

/* formats_act.c's pow2_ceil: 2^ceil(log2 v) for v > 0 finite, exact, clamped to E8M0's range. */
__device__ __forceinline__ float mx_pow2_ceil(float v) {
  int e;
  const float m = frexpf(v, &e);
  int k = m == 0.5f ? e - 1 : e;
  k = k < -127 ? -127 : k > 127 ? 127 : k;
  return ldexpf(1.0f, k);
}

__global__ void mxfp8_qdq_kernel(float *x, int rows, int cols, int ld, int block) {
  const int nb = (cols + block - 1) / block;
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= (int64_t)rows * nb) return;
  const int r = (int)(k / nb), b = (int)(k % nb) * block;
  const int w = cols - b < block ? cols - b : block;
  float *v = x + (size_t)r * ld + b, amax = 0.0f;
  bool bad = false;
  for (int i = 0; i < w; i++) {
    bad |= !isfinite(v[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  if (bad) {
    for (int i = 0; i < w; i++) v[i] = __int_as_float(0x7fc00000);
    return;
  }
  const float s = mx_pow2_ceil(__fdiv_rn(fmaxf(amax, OP_MXFP8_AMAX_FLOOR), 448.0f));
  for (int i = 0; i < w; i++) v[i] = __fmul_rn(op_hd_e4m3_decode(op_hd_e4m3_encode(__fdiv_rn(v[i], s))), s);
}

cudaError_t kern_mxfp8_qdq(float *x, int rows, int cols, int ld, int block, cudaStream_t st) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (block <= 0) return cudaErrorInvalidValue;
  const long long blocks = (long long)rows * ((cols + block - 1) / block);
  mxfp8_qdq_kernel<<<kcall_blocks(blocks, FMT_THREADS), FMT_THREADS, 0, st>>>(x, rows, cols, ld, block);
  return cudaGetLastError();
}
