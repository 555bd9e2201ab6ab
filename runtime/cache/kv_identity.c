/* kv_identity.c: the prefix cache's key of a plan and its weights
 * (kv_identity.h): XXH3-64 over the weights' identity, each covered plan
 * key with its value, and the layer table with each layer's device kind. */
#include "runtime/cache/kv_identity.h"

#include <string.h>
#include <xxhash.h>

#include "base/check.h"

static const char *const serving_keys[] = {
    "serving.ced", "serving.replay.encoder", "serving.replay.decoder", "serving.prefill_chunk",
    "serving.cache.prefix_block_tokens", "serving.cache.page_tokens",
    /* the device kind of each flow's home (its number is not covered): also
     * in the layer table, with the stages' kinds */
    "serving.placement.prefill.device", "serving.placement.decode.device",
};

bool pc_kv_identity_covers(const char *key) {
  if (!strncmp(key, "model.", 6) || !strncmp(key, "formats.", 8)) return true;
  for (size_t i = 0; i < sizeof serving_keys / sizeof serving_keys[0]; i++)
    if (!strcmp(key, serving_keys[i])) return true;
  return false;
}

/* The key with its NUL, the value's length, the value: no two different
 * (key, value) sequences hash the same bytes. */
static void add_value(void *ctx, const char *key, const void *bytes, size_t n) {
  if (!pc_kv_identity_covers(key)) return;
  XXH3_state_t *st = ctx;
  uint64_t len = n;
  XXH3_64bits_update(st, key, strlen(key) + 1);
  XXH3_64bits_update(st, &len, sizeof len);
  XXH3_64bits_update(st, bytes, n);
}

/* The kind of device (CPU or CUDA, not which one) that computes layer l's
 * KV in the prefill flow or the decode flow: its stage's device, or the
 * flow's home. The two kinds do not make the same bytes (cuBLAS sums in
 * another order than op_linear), so a block one made must not hit for the
 * other; the device's number does not change them. */
static int32_t layer_device(const struct plan *p, int l, bool prefill) {
  const struct plan_placement *pl = &p->serving.place;
  for (int s = 0; s < pl->n_stages; s++)
    if (l >= pl->stage[s].lo && l <= pl->stage[s].hi) return pl->stage[s].device;
  return prefill ? (int32_t)p->serving.prefill_device : (int32_t)p->serving.decode_device;
}

uint64_t pc_kv_identity(const struct plan *p, uint64_t weights_id) {
  XXH3_state_t *st = XXH3_createState();
  CEDAR_ASSERT(st != NULL);
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, "cedar.kv.2", 11); /* the identity's own version: a change of what it covers bumps it
                                                 * (2: each layer's device kind) */
  XXH3_64bits_update(st, &weights_id, sizeof weights_id);
  plan_each_value(p, add_value, st);
  int32_t n = p->n_layers;
  XXH3_64bits_update(st, &n, sizeof n);
  for (int l = 0; l < p->n_layers; l++) {
    const struct plan_layer *L = &p->layer[l];
    int32_t v[11] = {L->index,   (int32_t)L->region, (int32_t)L->mode, L->ratio,
                     L->kv_src,  L->topk_src,        L->pool_src,      (int32_t)L->cand,
                     L->engram, layer_device(p, l, true), layer_device(p, l, false)};
    XXH3_64bits_update(st, v, sizeof v);
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}
