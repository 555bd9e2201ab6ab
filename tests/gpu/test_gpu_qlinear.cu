/* test_gpu_qlinear.cu: the CUDA twin of op_qlinear (kernels/qlinear.cu)
 * against the CPU kernel, and its speed against the copy bandwidth.
 *
 * Check: for F32, BF16, FP8 (E4M3, UE8M0 per 32 x 32 tile) and FP4 (E2M1,
 * UE8M0 per row group of 32), weights of random codes (no NaN codes; scale
 * codes on both sides of the CPU's fast-path bounds), odd shapes (a k tail,
 * out not a multiple of 8 or 32), n = 1, 3, 5, 33 and row strides wider than
 * the row: every output bitwise op_qlinear's (the order is the same: lane l
 * sums k = l, l + 16, ... with separate multiply and add, then the halving
 * tree; kernels/qlinear.cuh).
 *
 * Speed: a decode GEMV (n = 1) at v41-flash widths (the FP8 W_qb, 1280 ->
 * 32768, and a routed expert's FP4 w_gate, 5120 -> 2304, and the BF16 /
 * F32 of W_qb), best of 20 after 3 warm-ups, as GB/s of the stored bytes
 * (elements + scales + x + y) beside the device-to-device copy bandwidth
 * measured in the same process (read + write, 256 MiB). One JSON object to
 * $CEDAR_GPU_JSON when set. Exit 77 without a device. Run by
 * tests/gpu/run.sh; ctest gpu_qlinear.
 */
#include <string.h>

#include "kernels/qlinear.cuh"
#include "ops/basic.h"
#include "ops/qlinear.h"
#include "tests/gpu/gpu_test.cuh"

struct hw {
  struct op_qweight w;
  uint8_t *data, *scale;
};

static void make(struct hw *h, enum op_wfmt f, int out, int in, uint64_t *s) {
  h->w = (struct op_qweight){f, out, in, NULL, NULL};
  size_t db = op_qweight_data_bytes(&h->w), sb = op_qweight_scale_bytes(&h->w);
  h->data = (uint8_t *)malloc(db + 4), h->scale = (uint8_t *)malloc(sb + 1);
  for (size_t i = 0; i < db; i++) {
    uint8_t c = (uint8_t)gt_urand(s);
    if (f == OP_W_FP8 && (c & 0x7F) == 0x7F) c ^= 1;
    h->data[i] = c;
  }
  if (f == OP_W_F32 || f == OP_W_BF16) /* finite values */
    for (size_t i = 0; i < (size_t)out * in; i++) {
      float v = 4.0f * gt_frand(s);
      uint32_t u;
      memcpy(&u, &v, 4);
      if (f == OP_W_F32) memcpy(h->data + 4 * i, &u, 4);
      else h->data[2 * i] = (uint8_t)(u >> 16), h->data[2 * i + 1] = (uint8_t)(u >> 24);
    }
  for (size_t i = 0; i < sb; i++) { /* around 2^-7, some past 128 / 134, some 0 */
    uint32_t r = gt_urand(s) % 100;
    h->scale[i] = (uint8_t)(r < 4 ? 0 : r < 12 ? 129 + r % 10 : 114 + r % 12);
  }
  h->w.data = h->data, h->w.scale = h->scale;
}

/* The weight on the device (data and scale device pointers). */
static struct op_qweight upload(const struct hw *h, void **dd, void **ds) {
  struct op_qweight w = h->w;
  size_t db = op_qweight_data_bytes(&w), sb = op_qweight_scale_bytes(&w);
  CK(cudaMalloc(dd, db + 4));
  CK(cudaMalloc(ds, sb + 1));
  CK(cudaMemcpy(*dd, h->data, db, cudaMemcpyHostToDevice));
  if (sb) CK(cudaMemcpy(*ds, h->scale, sb, cudaMemcpyHostToDevice));
  w.data = *dd, w.scale = (const uint8_t *)*ds;
  return w;
}

static int check(enum op_wfmt f, int out, int in, uint64_t *s) {
  struct hw h;
  make(&h, f, out, in, s);
  const int NMAX = 33, ldx = in + 3, ldy = out + 5, ns[] = {1, 3, 5, 33};
  float *x = (float *)malloc(sizeof(float) * NMAX * ldx), *yc = (float *)malloc(sizeof(float) * NMAX * ldy);
  float *yg = (float *)malloc(sizeof(float) * NMAX * ldy);
  for (int i = 0; i < NMAX * ldx; i++) x[i] = 2.0f * gt_frand(s);
  void *dd, *ds;
  float *dx, *dy;
  struct op_qweight w = upload(&h, &dd, &ds);
  CK(cudaMalloc(&dx, sizeof(float) * NMAX * ldx));
  CK(cudaMalloc(&dy, sizeof(float) * NMAX * ldy));
  CK(cudaMemcpy(dx, x, sizeof(float) * NMAX * ldx, cudaMemcpyHostToDevice));
  int bad = 0;
  for (int t = 0; t < 4; t++) {
    const int n = ns[t];
    op_qlinear(yc, x, &h.w, n, ldx, ldy);
    CK(cudaMemset(dy, 0, sizeof(float) * NMAX * ldy));
    CK(kern_qlinear(dy, dx, &w, n, ldx, ldy, 0));
    CK(cudaMemcpy(yg, dy, sizeof(float) * NMAX * ldy, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n && !bad; i++)
      for (int o = 0; o < out; o++) {
        const float a = yc[(size_t)i * ldy + o], b = yg[(size_t)i * ldy + o];
        if (memcmp(&a, &b, 4) && !(a != a && b != b)) {
          fprintf(stderr, "FAIL gpu_qlinear: %s out %d in %d n %d: row %d out %d is %a on the GPU, %a on the CPU\n",
                  op_wfmt_name(f), out, in, n, i, o, (double)b, (double)a);
          bad = 1;
          break;
        }
      }
  }
  cudaFree(dd), cudaFree(ds), cudaFree(dx), cudaFree(dy);
  free(h.data), free(h.scale), free(x), free(yc), free(yg);
  return bad;
}

static double copy_gbs(void) {
  const size_t bytes = (size_t)256 << 20;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int r = 0; r < 23; r++) {
    CK(cudaEventRecord(e0, 0));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 3 && ms < best) best = ms;
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaFree(a), cudaFree(b);
  return 2.0 * (double)bytes / (best * 1e-3) / 1e9;
}

/* GB/s of the stored bytes of one GEMV (best of 20 after 3 warm-ups). */
static double gemv_gbs(enum op_wfmt f, int out, int in, uint64_t *s, double *ms_out) {
  struct hw h;
  make(&h, f, out, in, s);
  void *dd, *ds;
  float *dx, *dy;
  struct op_qweight w = upload(&h, &dd, &ds);
  CK(cudaMalloc(&dx, sizeof(float) * in));
  CK(cudaMalloc(&dy, sizeof(float) * out));
  CK(cudaMemset(dx, 0, sizeof(float) * in));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int r = 0; r < 23; r++) {
    CK(cudaEventRecord(e0, 0));
    CK(kern_qlinear(dy, dx, &w, 1, in, out, 0));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 3 && ms < best) best = ms;
  }
  const double bytes = (double)op_qweight_data_bytes(&h.w) + (double)op_qweight_scale_bytes(&h.w) + 4.0 * (in + out);
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaFree(dd), cudaFree(ds), cudaFree(dx), cudaFree(dy);
  free(h.data), free(h.scale);
  *ms_out = best;
  return bytes / (best * 1e-3) / 1e9;
}

int main(void) {
  int nd = 0;
  if (cudaGetDeviceCount(&nd) != cudaSuccess || nd < 1) {
    printf("gpu_qlinear: no CUDA device (%s): skipped\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  op_blas_init();
  uint64_t s = 0x51u;
  int bad = 0;
  const int any[][2] = {{1, 1}, {7, 13}, {33, 47}, {37, 160}, {100, 2048}};
  const int fp4[][2] = {{7, 32}, {33, 64}, {37, 160}, {100, 2048}};
  for (int f = 0; f < OP_W_COUNT; f++)
    for (int i = 0; i < (f == OP_W_FP4 ? 4 : 5); i++)
      bad |= f == OP_W_FP4 ? check((enum op_wfmt)f, fp4[i][0], fp4[i][1], &s)
                           : check((enum op_wfmt)f, any[i][0], any[i][1], &s);
  printf("gpu_qlinear: bitwise against op_qlinear: %s\n", bad ? "FAIL" : "ok");
  const double copy = copy_gbs();
  const struct {
    enum op_wfmt f;
    int out, in;
    const char *what;
  } rows[] = {{OP_W_FP8, 32768, 1280, "W_qb fp8"},
              {OP_W_BF16, 32768, 1280, "W_qb bf16"},
              {OP_W_F32, 32768, 1280, "W_qb f32"},
              {OP_W_FP4, 2304, 5120, "expert w_gate fp4"}};
  const char *js = getenv("CEDAR_GPU_JSON");
  FILE *jf = js ? fopen(js, "w") : NULL;
  if (jf) fprintf(jf, "{\"test\": \"gpu_qlinear\", \"bitwise\": %s, \"copy_gbs\": %.1f, \"gemv\": [", bad ? "false" : "true", copy);
  printf("gpu_qlinear: device-to-device copy %.0f GB/s (read + write)\n", copy);
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    double ms = 0, g = gemv_gbs(rows[r].f, rows[r].out, rows[r].in, &s, &ms);
    printf("gpu_qlinear: GEMV %-18s %5d x %5d: %.4f ms, %.0f GB/s of stored bytes = %.2f of the copy\n", rows[r].what,
           rows[r].out, rows[r].in, ms, g, g / copy);
    if (jf)
      fprintf(jf, "%s{\"what\": \"%s\", \"out\": %d, \"in\": %d, \"ms\": %.4f, \"gbs\": %.1f}", r ? ", " : "",
              rows[r].what, rows[r].out, rows[r].in, ms, g);
  }
  if (jf) fprintf(jf, "]}\n"), fclose(jf);
  return bad;
}
