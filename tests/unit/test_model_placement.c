/* Unit tests of Gemini's checkpoint placement (Algorithm 1) and its recovery odds: the
 * groups and holders the paper draws, the exact odds against a count of every failure set
 * (small N) and against Monte Carlo (larger N), Corollary 1 (93.3% for N=16, k=2, f=2) and
 * the inputs refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "keel/model.h"

static void check_near(double actual, double expected, double tolerance, const char *what) {
  if (!(fabs(actual - expected) <= tolerance))
    fail_msg("%s: got %.12g, expected %.12g (tolerance %.3g)", what, actual, expected, tolerance);
}

static keel_model_placement placement_of(uint32_t nodes, uint32_t replicas) {
  keel_model_placement placement;
  assert_int_equal(keel_model_placement_make(nodes, replicas, &placement), KEEL_OK);
  return placement;
}

static void test_groups_and_ring_as_drawn(void **state) {
  (void)state;
  /* Figure 3a: N=4, k=2, two groups; 3c: N=5, k=2, a group and a ring of three. */
  keel_model_placement group = placement_of(4, 2), mixed = placement_of(5, 2);
  assert_int_equal(group.strategy, KEEL_PLACEMENT_GROUP);
  assert_int_equal(group.groups, 2);
  assert_int_equal(mixed.strategy, KEEL_PLACEMENT_MIXED);
  assert_int_equal(mixed.groups, 2);
  uint32_t first, count;
  keel_model_placement_group(&mixed, 1, &first, &count);
  assert_int_equal(first, 2);
  assert_int_equal(count, 3);
  uint32_t holders[2];
  keel_model_placement_holders(&group, 1, holders);
  assert_int_equal(holders[0], 1);
  assert_int_equal(holders[1], 0);
  /* In the ring each node's snapshot is also on the node before it. */
  const uint32_t before[3][2] = {{2, 4}, {3, 2}, {4, 3}};
  for (uint32_t node = 2; node < 5; node++) {
    keel_model_placement_holders(&mixed, node, holders);
    assert_int_equal(holders[0], before[node - 2][0]);
    assert_int_equal(holders[1], before[node - 2][1]);
  }
}

static void test_refused_inputs(void **state) {
  (void)state;
  keel_model_placement placement;
  assert_int_equal(keel_model_placement_make(4, 0, &placement), KEEL_EINVAL);
  assert_int_equal(keel_model_placement_make(2, 3, &placement), KEEL_EINVAL);
  assert_int_equal(keel_model_placement_make(8, KEEL_MODEL_PLACEMENT_MAX_REPLICAS + 1, &placement),
                   KEEL_EINVAL);
  assert_int_equal(keel_model_placement_make(KEEL_MODEL_PLACEMENT_MAX_NODES + 1, 2, &placement),
                   KEEL_EINVAL);
  assert_int_equal(keel_model_placement_make(4, 2, NULL), KEEL_EINVAL);
  placement = placement_of(4, 2);
  double odds;
  assert_int_equal(keel_model_placement_odds(&placement, 5, &odds), KEEL_EINVAL);
  assert_int_equal(keel_model_placement_simulate(&placement, 1, 0, 1, &odds), KEEL_EINVAL);
  keel_model_placement mixed = placement_of(5, 2);
  assert_int_equal(keel_model_placement_corollary1(&mixed, 2, &odds), KEEL_ENOTSUP);
  assert_int_equal(keel_model_placement_corollary1(&placement, 4, &odds), KEEL_ENOTSUP);
}

/* Every failure set of up to 16 nodes, checked against every node's holders: per size f,
 * the share that spares every snapshot. */
static void count_every_failure_set(const keel_model_placement *placement, double *share) {
  uint32_t n = placement->nodes, k = placement->replicas;
  double spared[17] = {0}, total[17] = {0};
  uint32_t holders[KEEL_MODEL_PLACEMENT_MAX_REPLICAS];
  for (uint32_t mask = 0; mask < (1u << n); mask++) {
    bool survives = true;
    for (uint32_t node = 0; node < n && survives; node++) {
      keel_model_placement_holders(placement, node, holders);
      bool alive = false;
      for (uint32_t i = 0; i < k; i++) alive = alive || !(mask >> holders[i] & 1u);
      survives = alive;
    }
    uint32_t f = (uint32_t)__builtin_popcount(mask);
    total[f] += 1.0;
    if (survives) spared[f] += 1.0;
  }
  for (uint32_t f = 0; f <= n; f++) share[f] = spared[f] / total[f];
}

static void test_exact_odds_against_every_failure_set(void **state) {
  (void)state;
  for (uint32_t n = 1; n <= 14; n++) {
    for (uint32_t k = 1; k <= 5 && k <= n; k++) {
      keel_model_placement placement = placement_of(n, k);
      double counted[17];
      count_every_failure_set(&placement, counted);
      for (uint32_t f = 0; f <= n; f++) {
        double odds;
        assert_int_equal(keel_model_placement_odds(&placement, f, &odds), KEEL_OK);
        char what[64];
        snprintf(what, sizeof what, "N=%u k=%u f=%u", n, k, f);
        check_near(odds, counted[f], 1e-12, what);
      }
    }
  }
}

static void test_exact_odds_against_monte_carlo(void **state) {
  (void)state;
  const uint32_t nodes[] = {16, 30, 64, 101}, replicas[] = {2, 3, 4};
  const uint64_t trials = 20000;
  for (size_t a = 0; a < sizeof nodes / sizeof nodes[0]; a++) {
    for (size_t b = 0; b < sizeof replicas / sizeof replicas[0]; b++) {
      keel_model_placement placement = placement_of(nodes[a], replicas[b]);
      for (uint32_t f = replicas[b]; f <= 3 * replicas[b]; f += replicas[b]) {
        double exact, sampled;
        assert_int_equal(keel_model_placement_odds(&placement, f, &exact), KEEL_OK);
        assert_int_equal(keel_model_placement_simulate(&placement, f, trials, 7 + f, &sampled),
                         KEEL_OK);
        /* Five standard errors of the estimate (and a floor for p near 0 or 1). */
        double error = sqrt(exact * (1.0 - exact) / (double)trials);
        char what[64];
        snprintf(what, sizeof what, "Monte Carlo N=%u k=%u f=%u", nodes[a], replicas[b], f);
        check_near(sampled, exact, 5.0 * error + 1e-3, what);
      }
    }
  }
}

static void test_corollary1(void **state) {
  (void)state;
  keel_model_placement placement = placement_of(16, 2);
  double odds;
  assert_int_equal(keel_model_placement_corollary1(&placement, 2, &odds), KEEL_OK);
  check_near(odds, 14.0 / 15.0, 1e-15, "Corollary 1, N=16 k=2 f=2 (93.3%)");
  assert_int_equal(keel_model_placement_corollary1(&placement, 1, &odds), KEEL_OK);
  check_near(odds, 1.0, 0.0, "fewer failures than replicas");
  /* Where it is exact (k <= f < 2k) the count agrees with it. */
  for (uint32_t k = 1; k <= 4; k++) {
    for (uint32_t n = k; n <= 64; n += k) {
      placement = placement_of(n, k);
      for (uint32_t f = 0; f < 2 * k && f <= n; f++) {
        double exact, formula;
        assert_int_equal(keel_model_placement_odds(&placement, f, &exact), KEEL_OK);
        assert_int_equal(keel_model_placement_corollary1(&placement, f, &formula), KEEL_OK);
        check_near(exact, formula, 1e-12, "count against Corollary 1");
      }
    }
  }
  /* Its largest case stays in range: 1 - (N/k) / C(N, 2) for N=4096, k=2, f=2. */
  placement = placement_of(KEEL_MODEL_PLACEMENT_MAX_NODES, 2);
  assert_int_equal(keel_model_placement_odds(&placement, 2, &odds), KEEL_OK);
  check_near(odds, 1.0 - 2048.0 / (4096.0 * 4095.0 / 2.0), 1e-15, "N=4096");
}

static void test_group_beats_ring(void **state) {
  (void)state;
  /* The paper's argument for groups, N=4, k=2, f=2: 2 of the 6 failure pairs lose a
   * snapshot with groups; with a ring of four, 4 of them would. */
  keel_model_placement placement = placement_of(4, 2);
  double odds;
  assert_int_equal(keel_model_placement_odds(&placement, 2, &odds), KEEL_OK);
  check_near(odds, 4.0 / 6.0, 1e-15, "groups of two among four");
  /* Mixed: N=5, k=2 has one group {0,1} and a ring {2,3,4}; of the 10 failure pairs,
   * {0,1} and the ring's three adjacent pairs lose a snapshot. */
  placement = placement_of(5, 2);
  assert_int_equal(keel_model_placement_odds(&placement, 2, &odds), KEEL_OK);
  check_near(odds, 6.0 / 10.0, 1e-15, "mixed, N=5 k=2");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_groups_and_ring_as_drawn),
      cmocka_unit_test(test_refused_inputs),
      cmocka_unit_test(test_exact_odds_against_every_failure_set),
      cmocka_unit_test(test_exact_odds_against_monte_carlo),
      cmocka_unit_test(test_corollary1),
      cmocka_unit_test(test_group_beats_ring),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
