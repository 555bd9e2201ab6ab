/* place_cost.h: what each rank of a layer and expert placement holds and
 * sends (`cedar plan cost --per-rank`, docs/placement.md), from the plan
 * alone:
 *
 *   weights   every tensor the plan needs, in the released checkpoint's
 *             stored formats (runtime/load/ckpt_map.c: FP8 E4M3 with 32x32 E8M0
 *             tiles, E2M1 experts with E8M0 per 32, BF16, F32): a layer's
 *             tensors on its stage's rank, routed experts on their expert
 *             rank (serving.placement.experts), the embedding with the first
 *             stage, the head with the last, Engram tables at their home;
 *   state     one request of N tokens: each KV source's Main KV + Indexer K
 *             and compressor tail on the source's stage, each layer's SWA ring
 *             on its stage (scheduler/plan_cost.h's figures);
 *   traffic   activation bytes per token a rank sends across its stage
 *             boundary (the residual streams and the carried mHC pre, f32,
 *             and any Top-K / candidate bus read across it), and expected
 *             expert-parallel dispatch and combine bytes per token under
 *             uniform routing: a token's input goes once to each other rank
 *             holding one of its selected experts (hidden f32), each selected
 *             expert's output comes back (hidden f32) so the combine sums in
 *             expert order, bitwise the one-process sum.
 *
 * Under P/D (prefill and decode on different homes) each role places the
 * model on its own homes (plan_role_view; without stages the decode role's
 * is serving.placement's decode rank) and a rank holds what either role
 * puts on it: a tensor both roles put on it once, a layer's routed experts
 * as the range covering both roles' blocks there (what runtime/dist/expert_par.c
 * loads), and each role's state, activation and expert traffic on its own
 * homes.
 *
 * Resident bytes = weights (less Engram tables kept in host memory or a
 * file) + state; a rank on cuda fits when that is at most the capacity.
 * Test: tests/test_place.c; tests/cli/place_cost.sh.
 */
#ifndef CEDAR_RUNTIME_PLACE_COST_H
#define CEDAR_RUNTIME_PLACE_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "scheduler/plan.h"

#define RT_PLACE_MAX_RANKS 64

struct rt_rank_cost {
  bool cuda;               /* the rank's stage runs on a GPU */
  int first_layer, last_layer; /* its stage's layers (-1: it holds experts only) */
  int64_t weights;         /* stored bytes on the rank's device, Engram tables at home there included */
  int64_t experts;         /* of which routed experts */
  int64_t engram_device;   /* of which Engram tables (engram memory: device, the default) */
  int64_t engram_host;     /* Engram tables in the rank's host memory (engram: {memory: host}) */
  int64_t engram_file;     /* Engram tables read from a file (engram: {memory: file}) */
  int64_t kv, swa, tails;  /* one request of N tokens (kv: with the copies of other stages' sources its layers read) */
  double kv_ship_per_token; /* its sources' KV entry bytes shipped to reader stages per token */
  int64_t kv_ship;         /* the same after N tokens (floor(N / ratio) entries to each reader rank) */
  int64_t resident;        /* weights + kv + swa + tails */
  int64_t act_per_token;   /* activation bytes sent across its stage boundary per token */
  double ep_dispatch_per_token, ep_combine_per_token; /* expected bytes sent per token of the whole batch */
  bool fits;               /* resident <= capacity */
};

struct rt_place_cost {
  int ranks;
  int64_t tokens;
  double capacity;
  int64_t total_weights;   /* all ranks, all homes */
  struct rt_rank_cost r[RT_PLACE_MAX_RANKS];
  char error[256];
};

/* Account plan p at N = tokens per request against a device capacity in
 * bytes. Returns 0, or a negative status with out->error. */
int rt_place_cost(const struct plan *p, int64_t tokens, double capacity, struct rt_place_cost *out);
/* The same for one role under P/D: role 0 the prefill role's homes alone,
 * 1 the decode role's, -1 both (rt_place_cost); without P/D every role is
 * the plan's one placement. */
int rt_place_cost_role(const struct plan *p, int role, int64_t tokens, double capacity, struct rt_place_cost *out);

/* The stored-format bytes of the routed experts weights w holds (a rank's
 * part, runtime/load/weights.h, or all of them), split per expert as
 * rt_place_cost splits them: a rank that holds exactly its experts holds
 * its r[rank].experts. */
struct weights;
int64_t rt_place_held_experts(const struct plan *p, const struct weights *w);

/* One tensor's bytes in the released checkpoint's stored format (the
 * table above: what `plan cost` counts), whatever format cedar holds it in
 * (serve-sim --floor's bytes floor). */
struct weights_spec;
int64_t rt_place_stored_bytes(const struct weights_spec *s);

#endif
