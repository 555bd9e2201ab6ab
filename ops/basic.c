/* basic.c: embedding, RMSNorm and linear layers (see basic.h). */
#include "ops/basic.h"

#include <cblas.h>
#include <string.h>

void openblas_set_num_threads(int n);

void op_blas_init(void) { openblas_set_num_threads(1); }

int op_embed(float *out, const float *table, const int32_t *tok, int n, int d, int vocab) {
  int bad = -1;
  for (int i = 0; i < n; i++) {
    if (tok[i] < 0 || tok[i] >= vocab) {
      if (bad < 0) bad = i;
      continue;
    }
    memcpy(out + (size_t)i * d, table + (size_t)tok[i] * d, (size_t)d * sizeof *out);
  }
  return bad;
}

void op_rmsnorm(float *out, const float *x, const float *gamma, int n, int d, float eps) {
  for (int i = 0; i < n; i++) {
    const float *xi = x + (size_t)i * d;
    float *oi = out + (size_t)i * d;
    float ss = 0.0f;
    for (int j = 0; j < d; j++) ss += xi[j] * xi[j];
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (int j = 0; j < d; j++) oi[j] = xi[j] * r * (gamma ? gamma[j] : 1.0f);
  }
}

void op_linear(float *y, const float *x, const float *W, int n, int in, int out, int ldx, int ldy) {
  if (n <= 0 || out <= 0) return;
  if (in <= 0) {
    for (int i = 0; i < n; i++) memset(y + (size_t)i * ldy, 0, (size_t)out * sizeof *y);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, ldx, W, in, 0.0f, y, ldy);
}
