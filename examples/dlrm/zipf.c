/* Rejection-inversion Zipf sampling (W. Hörmann, G. Derflinger, "Rejection-inversion to
 * generate variates from monotone discrete distributions", 1996), in the form of Apache
 * Commons Math's ZipfRejectionInversionSampler: no table, so a table of 2^32 rows costs
 * nothing to set up, and about one uniform value per draw. */
#include "zipf.h"

#include <math.h>

#define ZIPF_MAX_COUNT (UINT64_C(1) << 32)
#define ZIPF_MAX_EXPONENT 10.0

/* log1p(x) / x, with its series near 0 where the quotient loses every digit. */
static double log1p_over(double x) {
  if (fabs(x) > 1e-8) return log1p(x) / x;
  return 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}

/* expm1(x) / x, likewise. */
static double expm1_over(double x) {
  if (fabs(x) > 1e-8) return expm1(x) / x;
  return 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
}

/* The hat function h(x) = x^-s, and H, an antiderivative of it that stays finite at s = 1:
 * H(x) = (x^(1-s) - 1) / (1 - s), tending to log(x). */
static double hat(double exponent, double x) { return exp(-exponent * log(x)); }

static double hat_integral(double exponent, double x) {
  double log_x = log(x);
  return expm1_over((1.0 - exponent) * log_x) * log_x;
}

static double hat_integral_inverse(double exponent, double x) {
  double t = x * (1.0 - exponent);
  if (t < -1.0) t = -1.0; /* rounding near the domain's end */
  return exp(log1p_over(t) * x);
}

keel_status dlrm_zipf_init(uint64_t count, double exponent, dlrm_zipf *zipf_p) {
  if (count == 0 || count > ZIPF_MAX_COUNT || !(exponent >= 0.0 && exponent <= ZIPF_MAX_EXPONENT))
    return KEEL_EINVAL;
  dlrm_zipf zipf = {
      .count = count,
      .exponent = exponent,
      .integral_first = hat_integral(exponent, 1.5) - 1.0,
      .integral_last = hat_integral(exponent, (double)count + 0.5),
  };
  zipf.squeeze =
      2.0 - hat_integral_inverse(exponent, hat_integral(exponent, 2.5) - hat(exponent, 2.0));
  *zipf_p = zipf;
  return KEEL_OK;
}

uint64_t dlrm_zipf_draw(const dlrm_zipf *zipf, keel_random *random) {
  double exponent = zipf->exponent;
  for (;;) {
    /* u is uniform in (H(1.5) - 1, H(n + 0.5)]; its inverse image x falls near k with
     * probability close to k^-s, and the test below makes it exact. */
    double u = zipf->integral_last +
               keel_random_unit(random) * (zipf->integral_first - zipf->integral_last);
    double x = hat_integral_inverse(exponent, u);
    double rounded = floor(x + 0.5);
    if (rounded < 1.0) rounded = 1.0;
    if (rounded > (double)zipf->count) rounded = (double)zipf->count;
    if (rounded - x <= zipf->squeeze ||
        u >= hat_integral(exponent, rounded + 0.5) - hat(exponent, rounded))
      return (uint64_t)rounded - 1;
  }
}
