/* test_weights_finite.c: which stored bits are not numbers
 * (runtime/load/weights_finite.h; issue 28 row 9).
 *
 * Per dtype, the codes that are NaN or infinite are counted, with the first
 * one's index, and their finite neighbours (the largest finite value, zero,
 * negative zero, subnormals, E4M3's 448 = 0x7E, E8M0's 2^127 = 0xFE) are
 * not; integer and packed-FP4 bytes are never counted. Every case is
 * checked against the C library's isfinite where the type has a C
 * counterpart (F32, F64).
 * Run from the repository root: ctest --test-dir build -R weights_finite.
 */
#include <math.h>
#include <string.h>

#include "runtime/load/weights_finite.h"
#include "tests/harness.h"

static uint64_t count(enum st_dtype dt, const void *data, uint64_t nbytes, uint64_t *first) {
  struct st_tensor t = {.name = "t", .dtype = dt, .ndim = 1, .nbytes = nbytes, .data = data};
  t.shape[0] = (int64_t)(nbytes / st_dtype_size(dt));
  return weights_nonfinite_count(&t, first);
}

int main(void) {
  uint64_t first = 99;
  float f32[] = {0.0f, -0.0f, 1e-45f, 3.4028235e38f, -3.4028235e38f, NAN, INFINITY, -INFINITY};
  EXPECT_EQ(count(ST_F32, f32, sizeof f32, &first), 3, "F32: NaN, +Inf, -Inf");
  EXPECT_EQ(first, 5, "F32's first non-finite");
  for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++)
    EXPECT_EQ(count(ST_F32, &f32[i], 4, NULL), !isfinite(f32[i]), "F32 element %zu against isfinite", i);
  double f64[] = {1.0, 1.7976931348623157e308, NAN, -INFINITY};
  EXPECT_EQ(count(ST_F64, f64, sizeof f64, &first), 2, "F64");
  EXPECT_EQ(first, 2, "F64's first");
  uint16_t bf16[] = {0x0000, 0x8000, 0x7f7f, 0xff7f, 0x0001, 0x7f80, 0xff80, 0x7fc0, 0xffff};
  EXPECT_EQ(count(ST_BF16, bf16, sizeof bf16, &first), 4, "BF16: +-Inf, NaN, negative NaN");
  EXPECT_EQ(first, 5, "BF16's first");
  uint16_t f16[] = {0x7bff, 0xfbff, 0x0001, 0x7c00, 0xfc00, 0x7e00};
  EXPECT_EQ(count(ST_F16, f16, sizeof f16, &first), 3, "F16: +-Inf, NaN");
  EXPECT_EQ(first, 3, "F16's first");
  uint8_t e4m3[] = {0x7e, 0xfe, 0x00, 0x80, 0x01, 0x7f, 0xff};
  EXPECT_EQ(count(ST_F8_E4M3, e4m3, sizeof e4m3, &first), 2, "E4M3FN: only S.1111.111 is NaN (448 = 0x7E is finite)");
  EXPECT_EQ(first, 5, "E4M3's first");
  uint8_t e5m2[] = {0x7b, 0xfb, 0x7c, 0xfc, 0x7d, 0x00};
  EXPECT_EQ(count(ST_F8_E5M2, e5m2, sizeof e5m2, &first), 3, "E5M2: +-Inf, NaN");
  EXPECT_EQ(first, 2, "E5M2's first");
  uint8_t e8m0[] = {0x00, 0x7f, 0xfe, 0xff, 0xff};
  EXPECT_EQ(count(ST_F8_E8M0, e8m0, sizeof e8m0, &first), 2, "E8M0: 0xFF is NaN, 0xFE = 2^127 is not");
  EXPECT_EQ(first, 3, "E8M0's first");
  uint8_t bytes[] = {0xff, 0x7f, 0xfe, 0x80};
  EXPECT_EQ(count(ST_U8, bytes, sizeof bytes, NULL), 0, "U8 (packed E2M1): no code is non-finite");
  EXPECT_EQ(count(ST_I8, bytes, sizeof bytes, NULL), 0, "I8");
  EXPECT_EQ(count(ST_I32, bytes, sizeof bytes, NULL), 0, "I32");
  return h_report("weights_finite");
}
