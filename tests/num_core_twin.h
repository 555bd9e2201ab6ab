/* num_core_twin.h: the functions tests/num_core_nvcc.cu exports: each
 * evaluates one numeric-core header function (ops/num_*.h) over an array,
 * compiled by nvcc as host code, so tests/test_num_core.c can compare the
 * nvcc build with its C build element by element. One signature per core
 * rule; the C side has the same loops over its own build (nc_c_*). */
#ifndef CEDAR_TESTS_NUM_CORE_TWIN_H
#define CEDAR_TESTS_NUM_CORE_TWIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every float rule of ops/num_codec.h over x[0..n): out[i * NC_FLOAT_RULES + r]. */
enum { NC_FLOAT_RULES = 12 };
void nc_nvcc_float_rules(uint32_t *out, const float *x, size_t n);
/* Every code rule (decoders, per code 0..255): out[c * NC_CODE_RULES + r]. */
enum { NC_CODE_RULES = 4 };
void nc_nvcc_code_rules(uint32_t *out);
/* op_hd_e2m1_code_scaled(x[i], thresholds(s[i])). */
void nc_nvcc_e2m1_scaled(uint32_t *out, const float *x, const float *s, size_t n);
/* op_hd_e8m0_scale_bits over (amax bits, qmax in {6, 448}, ceil in {0, 1}, kmin): out[i * 4 + rule]. */
void nc_nvcc_e8m0_scales(uint32_t *out, const uint32_t *amax_bits, const int32_t *kmin, size_t n);
/* op_hd_engram_row(op_hd_engram_mix(g + 4 i, mult + 4 i, order[i]), prime[i], offset[i]). */
void nc_nvcc_engram(int64_t *row, const uint64_t *g, const uint64_t *mult, const int *order, const int64_t *prime,
                    const int64_t *offset, size_t n);
/* op_hd_sinkhorn on n matrices of hc x hc (logits -> C, stride 1). */
void nc_nvcc_sinkhorn(float *C, const float *logits, int n, int hc, int iters, float eps);
/* The online softmax of ops/num_softmax.h over rows of z (n rows of k
 * logits, values v (k)), one output per row: start (sink[i] when has_sink),
 * raise per block of `block`, weights in order, then merge with a second
 * state over the row's second half when split, finish. */
void nc_nvcc_softmax(float *o, const float *z, const float *v, const float *sink, int n, int k, int block, int split);

#ifdef __cplusplus
}
#endif

#endif
