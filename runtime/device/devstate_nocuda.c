/* devstate_nocuda.c: the device half of runtime/device/devstate.h for the CPU-only
 * build (CEDAR_CUDA=OFF): opening device state or uploading weights is
 * refused with "built without CUDA"; nothing is ever allocated, so the
 * accessors are never reached with a state and answer NULL.
 * Not a stub to fill in: the CUDA build uses devstate_cuda.c.
 * Test: tests/test_devstate.c (the refusal). */
#include <stdio.h>

#include "base/check.h"
#include "runtime/device/devbind.h"
#include "runtime/device/devstate.h"

static int no_cuda(char *err, size_t err_len) {
  snprintf(err, err_len, "built without CUDA: device state needs a build configured with -DCEDAR_CUDA=ON");
  return CEDAR_EUNSUPPORTED;
}

int rt_dev_state_open(struct rt_dev_state **out, const struct rt_dev_layout *L, int dev, char *err, size_t err_len) {
  (void)L, (void)dev;
  *out = NULL;
  return no_cuda(err, err_len);
}
void rt_dev_state_close(struct rt_dev_state *s) { (void)s; }
void *rt_dev_page(const struct rt_dev_state *s, int l, int32_t id) { return (void)s, (void)l, (void)id, NULL; }
void *rt_dev_ring(const struct rt_dev_state *s, int slot, int l) { return (void)s, (void)slot, (void)l, NULL; }
int64_t *rt_dev_ring_pos(const struct rt_dev_state *s, int slot, int l) { return (void)s, (void)slot, (void)l, NULL; }
float *rt_dev_tail(const struct rt_dev_state *s, int slot, int l) { return (void)s, (void)slot, (void)l, NULL; }
void *rt_dev_act(const struct rt_dev_state *s) { return (void)s, NULL; }
struct rt_dev_params *rt_dev_param_block(const struct rt_dev_state *s) { return (void)s, NULL; }
void *rt_dev_page_handle(const struct rt_dev_state *s, int l, int32_t id) { return (void)s, (void)l, (void)id, NULL; }
void *rt_dev_ring_handle(const struct rt_dev_state *s, int slot, int l) { return (void)s, (void)slot, (void)l, NULL; }
void *rt_dev_ring_pos_handle(const struct rt_dev_state *s, int slot, int l) { return (void)s, (void)slot, (void)l, NULL; }
void *rt_dev_tail_handle(const struct rt_dev_state *s, int slot, int l) { return (void)s, (void)slot, (void)l, NULL; }
int rt_dev_state_node(const struct rt_dev_state *s) { return (void)s, -1; }

int rt_dev_weights_upload(struct rt_dev_weights **out, const struct weights *w, int dev, char *err, size_t err_len) {
  (void)w, (void)dev;
  *out = NULL;
  return no_cuda(err, err_len);
}
const void *rt_dev_weights_get(const struct rt_dev_weights *dw, const char *name) {
  return (void)dw, (void)name, NULL;
}
size_t rt_dev_weights_bytes(const struct rt_dev_weights *dw) { return (void)dw, 0; }
void rt_dev_weights_free(struct rt_dev_weights *dw) { (void)dw; }

int rt_dev_ctx_open_cuda(struct rt_dev_ctx **out, const struct rt_dev_layout *L, int dev, const struct weights *w,
                         bool graphs, char *err, size_t err_len) {
  (void)L, (void)dev, (void)w, (void)graphs;
  *out = NULL;
  return no_cuda(err, err_len);
}

int rt_dev_ctx_open_model(struct rt_dev_ctx *d, const struct rt_model *M, size_t scratch_bytes, char *err,
                          size_t err_len) {
  (void)d, (void)M, (void)scratch_bytes;
  return no_cuda(err, err_len);
}
void rt_dev_model_close(struct rt_dev_ctx *d) { (void)d; }
