/* The deterministic random stream: xoshiro256** seeded through splitmix64. A run's data
 * order and initial weights are functions of its seed alone, the same on every machine. */
#include "keel/core.h"

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t rotate_left(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void keel_random_seed(keel_random *random, uint64_t seed) {
  uint64_t state = seed;
  for (int i = 0; i < 4; i++) random->state[i] = splitmix64(&state);
}

uint64_t keel_random_seed_for(uint64_t seed, uint64_t step, uint64_t rank) {
  uint64_t state = seed;
  uint64_t mixed = splitmix64(&state) ^ step;
  state = mixed;
  mixed = splitmix64(&state) ^ rank;
  state = mixed;
  return splitmix64(&state);
}

uint64_t keel_random_next(keel_random *random) {
  uint64_t *s = random->state;
  uint64_t result = rotate_left(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotate_left(s[3], 45);
  return result;
}

uint64_t keel_random_below(keel_random *random, uint64_t bound) {
  /* Rejection keeps the draw unbiased. */
  uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t draw;
  do {
    draw = keel_random_next(random);
  } while (draw >= limit);
  return draw % bound;
}

double keel_random_unit(keel_random *random) {
  return (double)(keel_random_next(random) >> 11) * (1.0 / 9007199254740992.0);
}
