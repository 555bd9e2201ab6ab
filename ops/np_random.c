/* np_random.c: NumPy's SeedSequence + PCG64 + bounded integers (see
 * np_random.h for the rules and sources). */
#include "ops/np_random.h"

#include <stddef.h>

#include "base/check.h"

/* ---- SeedSequence (pool of 4 uint32 words) ------------------------------- */

#define SS_POOL 4
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u
#define SS_XSHIFT 16

static uint32_t hashmix(uint32_t v, uint32_t *hc) {
  v ^= *hc;
  *hc *= SS_MULT_A;
  v *= *hc;
  return v ^ (v >> SS_XSHIFT);
}

static uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
  return r ^ (r >> SS_XSHIFT);
}

/* The pool from the seed's 32-bit words, then generate_state(4, uint64). */
static void seed_state(uint64_t seed, uint64_t out[4]) {
  uint32_t ent[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  int n_ent = (seed >> 32) ? 2 : 1;
  uint32_t pool[SS_POOL], hc = SS_INIT_A;
  for (int i = 0; i < SS_POOL; i++) pool[i] = hashmix(i < n_ent ? ent[i] : 0u, &hc);
  for (int s = 0; s < SS_POOL; s++)
    for (int d = 0; d < SS_POOL; d++)
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], &hc));
  /* n_ent <= SS_POOL: no words left over to mix in. */
  uint32_t hb = SS_INIT_B, w[8];
  for (int i = 0; i < 8; i++) {
    uint32_t v = pool[i % SS_POOL] ^ hb;
    hb *= SS_MULT_B;
    v *= hb;
    w[i] = v ^ (v >> SS_XSHIFT);
  }
  for (int i = 0; i < 4; i++) out[i] = (uint64_t)w[2 * i] | (uint64_t)w[2 * i + 1] << 32;
}

/* ---- PCG64 (128-bit LCG, XSL-RR output) ---------------------------------- */

#define PCG_MULT_HI 0x2360ED051FC65DA4ull
#define PCG_MULT_LO 0x4385DF649FCCF645ull

static void step(struct np_pcg64 *g) {
  unsigned __int128 s = (unsigned __int128)g->state_hi << 64 | g->state_lo;
  unsigned __int128 m = (unsigned __int128)PCG_MULT_HI << 64 | PCG_MULT_LO;
  unsigned __int128 c = (unsigned __int128)g->inc_hi << 64 | g->inc_lo;
  s = s * m + c;
  g->state_hi = (uint64_t)(s >> 64), g->state_lo = (uint64_t)s;
}

void np_default_rng(struct np_pcg64 *g, uint64_t seed) {
  uint64_t v[4];
  seed_state(seed, v);
  unsigned __int128 init = (unsigned __int128)v[0] << 64 | v[1];
  unsigned __int128 seq = (unsigned __int128)v[2] << 64 | v[3];
  unsigned __int128 inc = seq << 1 | 1u;
  g->state_hi = g->state_lo = 0;
  g->inc_hi = (uint64_t)(inc >> 64), g->inc_lo = (uint64_t)inc;
  step(g);
  unsigned __int128 s = ((unsigned __int128)g->state_hi << 64 | g->state_lo) + init;
  g->state_hi = (uint64_t)(s >> 64), g->state_lo = (uint64_t)s;
  step(g);
  g->has_u32 = 0, g->u32 = 0;
}

uint64_t np_next_u64(struct np_pcg64 *g) {
  step(g);
  uint64_t x = g->state_hi ^ g->state_lo;
  unsigned rot = (unsigned)(g->state_hi >> 58);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t np_next_u32(struct np_pcg64 *g) {
  if (g->has_u32) {
    g->has_u32 = 0;
    return g->u32;
  }
  uint64_t x = np_next_u64(g);
  g->has_u32 = 1, g->u32 = (uint32_t)(x >> 32);
  return (uint32_t)x;
}

/* ---- bounded integers (Lemire) ------------------------------------------- */

static uint32_t lemire32(struct np_pcg64 *g, uint32_t rng) {
  uint32_t excl = rng + 1;
  uint64_t m = (uint64_t)np_next_u32(g) * excl;
  uint32_t left = (uint32_t)m;
  if (left < excl) {
    uint32_t thr = (UINT32_MAX - rng) % excl;
    while (left < thr) {
      m = (uint64_t)np_next_u32(g) * excl;
      left = (uint32_t)m;
    }
  }
  return (uint32_t)(m >> 32);
}

static uint64_t lemire64(struct np_pcg64 *g, uint64_t rng) {
  uint64_t excl = rng + 1;
  unsigned __int128 m = (unsigned __int128)np_next_u64(g) * excl;
  uint64_t left = (uint64_t)m;
  if (left < excl) {
    uint64_t thr = (UINT64_MAX - rng) % excl;
    while (left < thr) {
      m = (unsigned __int128)np_next_u64(g) * excl;
      left = (uint64_t)m;
    }
  }
  return (uint64_t)(m >> 64);
}

void np_integers_i64(struct np_pcg64 *g, int64_t high, int n, int64_t *out) {
  CEDAR_ASSERT(high >= 1 && n >= 0);
  uint64_t rng = (uint64_t)(high - 1);
  /* NumPy's 32-bit path has no case for rng = 2^32 - 1 (its Lemire would
   * divide by zero); high = 2^32 cannot come from (INT64_MAX // V) // 2. */
  CEDAR_ASSERT(rng != 0xFFFFFFFFull);
  for (int i = 0; i < n; i++)
    out[i] = rng == 0 ? 0 : rng < 0xFFFFFFFFull ? (int64_t)lemire32(g, (uint32_t)rng) : (int64_t)lemire64(g, rng);
}
