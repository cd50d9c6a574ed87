/* Zipf sampling for the synthetic click data: ranks 0 .. n-1 drawn with probability
 * proportional to (rank + 1)^-s, in O(1) expected time and memory whatever n (up to 2^32),
 * by rejection-inversion (Hörmann and Derflinger 1996). */
#ifndef DLRM_ZIPF_H
#define DLRM_ZIPF_H

#include <stdint.h>

#include "keel/core.h"

/* The constants of one distribution, computed once; plain values the caller owns. */
typedef struct dlrm_zipf {
  uint64_t count;        /* n */
  double exponent;       /* s */
  double integral_first; /* H(1.5) - 1: the lower end of the sampled range */
  double integral_last;  /* H(n + 0.5): the upper end */
  double squeeze;        /* accept at once when k - x is at most this */
} dlrm_zipf;

/* Prepares the distribution over count ranks (1 .. 2^32) with exponent in [0, 10] (0 is
 * uniform). KEEL_EINVAL for values out of range; *zipf_p set only on success. */
keel_status dlrm_zipf_init(uint64_t count, double exponent, dlrm_zipf *zipf_p);

/* Draws one rank in [0, count) from random. The number of values it takes from random
 * varies (about 1.1 on average for s near 1), so callers give each sample a stream of its
 * own when samples must be reproducible one by one. */
uint64_t dlrm_zipf_draw(const dlrm_zipf *zipf, keel_random *random);

#endif
