/* node_cuda_internal.cuh: what the CUDA op groups' files share (nvcc only):
 * the model's device pointers (struct rt_cuda_model, struct rt_cuda_layer),
 * the worker (device scratch arena + cuBLAS handle), error reporting into a
 * thread's refusal message, and the numerics steps model.c applies between
 * ops (round_x, round_io, lin_in, the mHC begin and end) as device helpers.
 * Every helper enqueues on the node's stream and returns 0 or a cedar
 * status; none synchronizes. See runtime/device/node_cuda.h.
 */
#ifndef CEDAR_RUNTIME_NODE_CUDA_INTERNAL_CUH
#define CEDAR_RUNTIME_NODE_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/compressor.h"
#include "ops/moe.h"
extern "C" { /* runtime/'s C headers carry no extern "C" of their own */
#include "runtime/node/backend.h"
#include "runtime/node/node.h"
#include "runtime/model/model.h"
}
#include "runtime/device/node_cuda.h"

/* Values per E8M0 scale of an FP8 linear's MXFP8 input: model.c's RT_MXFP8_BLOCK (Appendix V #22). */
#define CN_MXFP8_BLOCK 32

/* struct rt_layer's pointers on the device (the ropes stay host structs:
 * kernels take them by value). */
struct rt_cuda_layer {
  const float *attn_norm, *ffn_norm;
  const float *hc_fn[2], *hc_scale[2], *hc_base[2];
  const float *wq_a, *q_norm, *wq_b, *wkv, *kv_norm, *sink, *wo_a, *wo_b;
  const float *iq_b, *iw;
  struct op_comp_layer comp; /* weights on the device, ropes and formats as M's */
  struct op_moe_weights moe;
  const uint8_t *e_table;
  const float *e_wkv, *e_qw, *e_kw;
  const uint64_t *e_mult;          /* (64) */
  const int64_t *e_prime, *e_off;  /* (orders x heads) of the layer's module */
};

struct rt_cuda_model {
  const struct rt_model *M;
  int dev;
  struct rt_cuda_layer *L; /* host array of (n_layers) */
  const float *embed, *norm, *lm_head, *head_fn, *head_scale, *head_base;
  const int32_t *cmap;     /* (vocab) */
  const int *e_orders;     /* (n_orders) */
  void *slab;              /* the tables above that are not weights, one cudaMalloc */
};

struct rt_cuda_worker {
  int dev;
  cublasHandle_t h;
  char *base;
  size_t cap, used, need;
};

/* The node's view: ctx plus the pieces every step takes. */
struct cn {
  const struct rt_node_ctx *c;
  const struct rt_model *M;
  const struct plan_model *m;
  const struct rt_cuda_model *cm;
  struct rt_cuda_worker *w;
  cudaStream_t st;
};

/* Begin a CUDA entry: checks ctx.cuda and what the CUDA path refuses,
 * resets the worker's arena. 0 or CEDAR_EUNSUPPORTED (why recorded). */
int cn_begin(struct cn *x, const struct rt_node_ctx *c, const char *group);

/* Record why a node failed ("<node>: ..."), return rc. */
int cn_fail(const struct cn *x, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* cudaError / cublasStatus of step `what` to 0 or CEDAR_EIO (recorded). */
int cn_cuda(const struct cn *x, cudaError_t e, const char *what);
int cn_blas(const struct cn *x, cublasStatus_t s, const char *what);

/* bytes of device scratch (256-aligned), or NULL when the arena is short
 * (need recorded; the caller returns RT_ENOMEM_SCRATCH). */
void *cn_alloc(const struct cn *x, size_t bytes);
#define CN_ALLOC(x, var, type, count)                                     \
  do {                                                                    \
    (var) = (type *)cn_alloc((x), sizeof(type) * (size_t)(count));        \
    if (!(var)) return RT_ENOMEM_SCRATCH;                                 \
  } while (0)
/* Every helper below returns 0 or a cedar status; CN_TRY returns it. */
#define CN_TRY(expr)            \
  do {                          \
    int _cn_rc = (expr);        \
    if (_cn_rc) return _cn_rc;  \
  } while (0)

/* The device address of buffer d of the node (NULL for d < 0). */
static inline void *cn_buf(const struct cn *x, int d) { return d < 0 ? NULL : x->c->buf[d]; }

/* pos[i] = a + i * step for i < n (device int64). */
int cn_iota(const struct cn *x, int64_t *pos, int64_t a, int64_t step, int n);
/* D2D copy on the stream. */
int cn_copy(const struct cn *x, void *dst, const void *src, size_t bytes);

/* model.c's numerics: round_x (the streams after an update), round_io (a
 * sublayer's (n, hidden) value), lin_in (an FP8 linear's input: the same
 * buffer, or an MXFP8 copy in scratch). */
int cn_round_x(const struct cn *x, float *X, int n);
int cn_round_io(const struct cn *x, float *v, int n);
int cn_lin_in(const struct cn *x, const float **out, const float *v, int rows, int cols);

/* mhc_begin / mhc_end of model.c on the device. */
struct cn_mhc {
  float *u, *post, *C;
};
int cn_mhc_begin(const struct cn *x, struct cn_mhc *s, const struct graph_node *nd, int k, const float *X, float *pre,
                 int n);
int cn_mhc_end(const struct cn *x, float *X, const struct cn_mhc *s, const float *y, int n);

#endif
