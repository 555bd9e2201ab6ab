/* test_op_registry.c: the op registry (ops/registry.h) is well formed, and
 * the descriptors of the basic ops and RoPE run their op exactly: a call
 * through the registry gives the same bits as the direct call, and bad
 * inputs are refused with a message. Descriptors of the other families are
 * tested the same way in tests/test_op_desc_<family>.c.
 * Run: ./build/tests/test_op_registry (from the repo root). */
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/registry.h"
#include "ops/rope.h"
#include "tests/harness.h"

static void check_table(void) {
  EXPECT(OP_COUNT >= 4, "only %d ops registered", OP_COUNT);
  for (int i = 0; i < OP_COUNT; i++) {
    const struct op_desc *d = op_registry[i];
    EXPECT(d && d->name && d->summary && d->inputs && d->outputs && d->run, "op %d incomplete", i);
    if (!d) continue;
    EXPECT(!strcmp(op_name((enum op_id)i), d->name) && op_find(d->name) == d, "%s: name table", d->name);
    for (int j = 0; j < i; j++) EXPECT(strcmp(op_registry[j]->name, d->name), "duplicate op %s", d->name);
    EXPECT(d->outputs->name, "%s declares no outputs", d->name);
    for (const struct op_arg *a = d->inputs; a->name; a++) EXPECT(a->shape && a->doc, "%s.%s undocumented", d->name, a->name);
    for (const struct op_param *p = d->params; p && p->name; p++) EXPECT(p->doc, "%s.%s undocumented", d->name, p->name);
  }
  EXPECT(op_find("no-such-op") == NULL, "op_find invents ops");
}

static void check_rmsnorm_linear(void) {
  uint64_t seed = 11;
  enum { N = 7, D = 33, O = 5 };
  float x[N * D], g[D], w[O * D], ref[N * D], yref[N * O];
  h_fill(x, N * D, &seed, -2, 2);
  h_fill(g, D, &seed, 0.5f, 1.5f);
  h_fill(w, O * D, &seed, -1, 1);
  op_rmsnorm(ref, x, g, N, D, 1e-5f);
  op_linear(yref, x, w, N, D, O, D, O);
  struct h_io h;
  h_io_init(&h);
  h_io_input(&h, "x", OP_F32, 2, (int64_t[]){N, D}, x);
  h_io_input(&h, "gamma", OP_F32, 1, (int64_t[]){D}, g);
  h_io_input(&h, "w", OP_F32, 2, (int64_t[]){O, D}, w);
  h_io_param(&h, "eps", 1e-5);
  EXPECT(h_io_run(&h, "rmsnorm") == 0, "rmsnorm: %s", h.error);
  const struct op_tensor *out = h_io_output(&h, "out");
  EXPECT(out && out->ndim == 2 && out->shape[0] == N && out->shape[1] == D, "rmsnorm output shape");
  EXPECT(out && !memcmp(out->data, ref, sizeof ref), "rmsnorm through the registry differs from the direct call");
  EXPECT(h_io_run(&h, "linear") == 0, "linear: %s", h.error);
  const struct op_tensor *y = h_io_output(&h, "y");
  EXPECT(y && y->shape[1] == O && !memcmp(y->data, yref, sizeof yref), "linear through the registry differs");
  h_io_free(&h);
  /* A gamma of the wrong length is refused with a message. */
  h_io_init(&h);
  h_io_input(&h, "x", OP_F32, 2, (int64_t[]){N, D}, x);
  h_io_input(&h, "gamma", OP_F32, 1, (int64_t[]){D - 1}, g);
  EXPECT(h_io_run(&h, "rmsnorm") < 0 && strstr(h.error, "gamma has 32 values"), "bad gamma accepted: '%s'", h.error);
  h_io_free(&h);
}

static void check_embed_rope(void) {
  float table[4 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  int32_t tok[3] = {2, 0, 3}, bad[2] = {1, 4};
  struct h_io h;
  h_io_init(&h);
  h_io_input(&h, "table", OP_F32, 2, (int64_t[]){4, 3}, table);
  h_io_input(&h, "tokens", OP_I32, 1, (int64_t[]){3}, tok);
  EXPECT(h_io_run(&h, "embed") == 0, "embed: %s", h.error);
  const struct op_tensor *o = h_io_output(&h, "out");
  EXPECT(o && !memcmp(o->data, table + 6, 3 * sizeof(float)) && !memcmp((float *)o->data + 3, table, 12),
         "embed rows");
  h_io_free(&h);
  h_io_init(&h);
  h_io_input(&h, "table", OP_F32, 2, (int64_t[]){4, 3}, table);
  h_io_input(&h, "tokens", OP_I32, 1, (int64_t[]){2}, bad);
  EXPECT(h_io_run(&h, "embed") < 0 && strstr(h.error, "token 4 at position 1"), "bad token: '%s'", h.error);
  h_io_free(&h);

  uint64_t seed = 5;
  enum { N = 3, H = 2, D = 24 };
  float x[N * H * D], ref[N * H * D];
  int64_t pos[N] = {0, 17, 100003};
  h_fill(x, N * H * D, &seed, -1, 1);
  memcpy(ref, x, sizeof x);
  struct op_rope r;
  EXPECT(op_rope_init(&r, D, 8, true, 10000, false, 16, 65536, 32, 1) == 0, "rope init");
  op_rope_apply(ref, &r, pos, N, H, H * D, 1);
  h_io_init(&h);
  h_io_input(&h, "x", OP_F32, 3, (int64_t[]){N, H, D}, x);
  h_io_input(&h, "pos", OP_I64, 1, (int64_t[]){N}, pos);
  h_io_param(&h, "rope_dim", 8);
  h_io_param(&h, "theta", 10000);
  h_io_param(&h, "yarn", 0);
  EXPECT(h_io_run(&h, "rope") == 0, "rope: %s", h.error);
  o = h_io_output(&h, "y");
  EXPECT(o && !memcmp(o->data, ref, sizeof ref), "rope through the registry differs from the direct call");
  h_io_free(&h);
}

int main(void) {
  op_blas_init();
  check_table();
  check_rmsnorm_linear();
  check_embed_rope();
  return h_report("op registry");
}
