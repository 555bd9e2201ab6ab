/* test_kv_identity.c: the prefix cache's key covers every plan knob that
 * changes a block's bytes (runtime/cache/kv_identity.h; issue 28 row 2).
 *
 *  - the same plan loaded twice, with the same weights, has one identity
 *    (a block it cached still hits);
 *  - every value plan_each_value visits under a covered key (every model.*
 *    and formats.* key, the serving keys that shape KV), changed alone in a
 *    copy of the plan, changes the identity; there are as many of them as
 *    the loader's tables hold (at least 100), so a walker that skipped a
 *    section would fail here;
 *  - every field of the layer table, changed alone at an encoder and a
 *    decoder layer, changes it; so do other weights;
 *  - the keys that do not change a block's bytes (name, batching, cache
 *    sizes, TTL, ranks, device numbers) leave it as it is, so runs of one
 *    model under another serving setup share their blocks;
 *  - the device kind (CPU or CUDA) that computes a layer's KV, as the
 *    flow's home or as its stage's device, changes it: the two kinds do not
 *    make the same bytes.
 * Run from the repository root: ctest --test-dir build -R kv_identity.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/cache/kv_identity.h"
#include "tests/harness.h"

#define W_ID 0x1234567890abcdefull
#define MAX_VALUES 512

struct seen {
  char key[MAX_VALUES][96];
  size_t off[MAX_VALUES], n[MAX_VALUES];
  int count;
  const struct plan *base;
};

static void record(void *ctx, const char *key, const void *bytes, size_t n) {
  struct seen *s = ctx;
  if (s->count == MAX_VALUES || !n) return; /* an empty list or string: nothing to change in place */
  snprintf(s->key[s->count], sizeof s->key[0], "%s", key);
  s->off[s->count] = (size_t)((const char *)bytes - (const char *)s->base);
  s->n[s->count++] = n;
}

/* Change the value at off in q: its lowest byte's lowest bit, which gives a
 * different value of every stored type (a bool flips; an int, int64 or the
 * first item of a list moves by one; a double's last mantissa bit). */
static void perturb(struct plan *q, size_t off) { ((unsigned char *)q + off)[0] ^= 1; }

static bool inside(const struct plan *p, size_t off) { return off < sizeof *p; }

int main(void) {
  struct plan *a = malloc(sizeof *a), *b = malloc(sizeof *b), *q = malloc(sizeof *q);
  if (!h_load_plan("plans/v41-mini.yaml", a) || !h_load_plan("plans/v41-mini.yaml", b)) return 1;
  uint64_t id = pc_kv_identity(a, W_ID);
  EXPECT(id == pc_kv_identity(b, W_ID), "the same plan loaded twice has two identities");
  EXPECT(id != pc_kv_identity(a, W_ID + 1), "other weights share the identity");

  struct seen *s = calloc(1, sizeof *s);
  s->base = a;
  plan_each_value(a, record, s);
  int covered = 0, kept = 0;
  for (int i = 0; i < s->count; i++) {
    memcpy(q, a, sizeof *q);
    bool is_string = !inside(a, s->off[i]);
    if (is_string) continue; /* name, description, engram file: none is covered */
    perturb(q, s->off[i]);
    bool differs = pc_kv_identity(q, W_ID) != id;
    if (pc_kv_identity_covers(s->key[i])) {
      covered++;
      EXPECT(differs, "%s changed, the identity did not: a block of one plan would hit for the other", s->key[i]);
    } else {
      kept++;
      EXPECT(!differs, "%s changes no KV byte but changed the identity", s->key[i]);
    }
  }
  EXPECT(covered >= 100, "only %d covered values visited: a section of the tables is not walked", covered);
  EXPECT(kept >= 10, "only %d serving values outside the identity visited", kept);
  static const char *const must[] = {"model.swa.window", "serving.replay.decoder", "serving.replay.encoder",
                                     "formats.main_kv.element", "model.hidden", "model.numerics.activations",
                                     "model.rope.csa.theta", "model.indexer.topk", "serving.ced"};
  for (size_t k = 0; k < sizeof must / sizeof must[0]; k++) {
    bool found = false;
    for (int i = 0; i < s->count; i++) found |= !strcmp(s->key[i], must[k]);
    EXPECT(found && pc_kv_identity_covers(must[k]), "%s is not visited and covered", must[k]);
  }
  EXPECT(!pc_kv_identity_covers("serving.batch.max_requests") && !pc_kv_identity_covers("name") &&
             !pc_kv_identity_covers("serving.cache.host_bytes"),
         "a knob that changes no byte is covered");

  /* the layer table, at an encoder layer and a decoder layer */
  int layers[2] = {3, a->n_layers - 1};
  for (int k = 0; k < 2; k++) {
    int l = layers[k];
    for (int field = 0; field < 9; field++) {
      memcpy(q, a, sizeof *q);
      struct plan_layer *L = &q->layer[l];
      switch (field) {
        case 0: L->index += 1; break;
        case 1: L->region = L->region == PLAN_ENCODER ? PLAN_DECODER : PLAN_ENCODER; break;
        case 2: L->mode = L->mode == PLAN_REUSE ? PLAN_REINDEX : PLAN_REUSE; break;
        case 3: L->ratio += 1; break;
        case 4: L->kv_src += 1; break;
        case 5: L->topk_src += 1; break;
        case 6: L->pool_src += 1; break;
        case 7: L->cand = L->cand == PLAN_CAND_NONE ? PLAN_CAND_READ : PLAN_CAND_NONE; break;
        case 8: L->engram = !L->engram; break;
      }
      EXPECT(pc_kv_identity(q, W_ID) != id, "layer %d field %d changed, the identity did not", l, field);
    }
  }
  /* the device kind computing the KV, not the device's number */
  memcpy(q, a, sizeof *q);
  q->serving.prefill_device = PLAN_DEV_CUDA;
  EXPECT(pc_kv_identity(q, W_ID) != id, "prefill moved to CUDA, the identity did not change");
  memcpy(q, a, sizeof *q);
  q->serving.decode_device = PLAN_DEV_CUDA;
  EXPECT(pc_kv_identity(q, W_ID) != id, "decode moved to CUDA, the identity did not change");
  memcpy(q, a, sizeof *q);
  q->serving.prefill_device_id = 3, q->serving.decode_device_id = 1;
  EXPECT(pc_kv_identity(q, W_ID) == id, "another device number of the same kind changed the identity");
  memcpy(q, a, sizeof *q);
  q->serving.place.n_stages = 2;
  q->serving.place.stage[0] = (struct plan_stage){.lo = 0, .hi = a->n_layers / 2 - 1, .device = PLAN_DEV_CPU};
  q->serving.place.stage[1] = (struct plan_stage){.lo = a->n_layers / 2, .hi = a->n_layers - 1, .rank = 1,
                                                  .device = PLAN_DEV_CPU};
  EXPECT(pc_kv_identity(q, W_ID) == id, "two CPU stages on two ranks changed the identity");
  q->serving.place.stage[1].device = PLAN_DEV_CUDA;
  EXPECT(pc_kv_identity(q, W_ID) != id, "a stage moved to CUDA, the identity did not change");

  memcpy(q, a, sizeof *q);
  q->name = "another name";
  EXPECT(pc_kv_identity(q, W_ID) == id, "the plan's name changed the identity");
  printf("kv_identity: %d covered values each change the identity, %d others do not, 18 layer fields\n", covered, kept);
  free(s);
  plan_free(a);
  plan_free(b);
  free(a);
  free(b);
  free(q);
  return h_report("kv_identity");
}
