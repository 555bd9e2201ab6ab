/* np_random.h: NumPy's default generator, bit for bit, for the Engram hash
 * multipliers (Appendix V #18): `numpy.random.default_rng(seed)` is PCG64
 * seeded through SeedSequence, and `Generator.integers(low, high, size,
 * dtype=int64)` draws with Lemire's bounded-integer method.
 *
 * Written from the published algorithms (O'Neill's PCG XSL-RR 128/64;
 * NumPy's SeedSequence hash mixing, NEP 19 and numpy/random/bit_generator;
 * Lemire 2018, arXiv:1805.10941) and checked against Debian's numpy by
 * tests/test_np_random.c (ctest -R np_random):
 *   - SeedSequence(seed), seed >= 0: the seed as little-endian 32-bit words
 *     (at least one), mixed into a pool of 4 words; generate_state(4,
 *     uint64) gives PCG64's 128-bit state seed (words 0,1: high, low) and
 *     increment seed (words 2,3);
 *   - PCG64: state = state * M + inc (128-bit), output XSL-RR; seeding
 *     state = 0, inc = 2*initseq + 1, step, state += initstate, step;
 *     a 32-bit draw is the low half of a 64-bit one, the next 32-bit draw
 *     its high half (the generator's buffer);
 *   - integers(0, high) with high > 0, endpoint=False: rng = high - 1; rng 0
 *     gives 0; rng < 2^32 uses the 32-bit Lemire on 32-bit draws; else the
 *     64-bit Lemire (128-bit product, reject leftover < 2^64 mod (rng+1)).
 * Not here: other distributions, spawning, non-integer seeds.
 */
#ifndef CEDAR_OPS_NP_RANDOM_H
#define CEDAR_OPS_NP_RANDOM_H

#include <stdint.h>

struct np_pcg64 {
  uint64_t state_hi, state_lo, inc_hi, inc_lo;
  int has_u32;   /* a buffered high half waits */
  uint32_t u32;  /* that half */
};

/* default_rng(seed) for an integer seed >= 0 (up to 64 bits). */
void np_default_rng(struct np_pcg64 *g, uint64_t seed);

uint64_t np_next_u64(struct np_pcg64 *g);
uint32_t np_next_u32(struct np_pcg64 *g);

/* g.integers(0, high, size=n, dtype=int64) into out; high >= 1. */
void np_integers_i64(struct np_pcg64 *g, int64_t high, int n, int64_t *out);

#endif
