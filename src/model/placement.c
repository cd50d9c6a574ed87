/* Gemini's checkpoint placement (Algorithm 1: groups, and a ring for the remainder) and the
 * odds that a failure of f nodes leaves every snapshot a live holder: exactly, by counting
 * the failure sets that spare every holder set, and by Monte Carlo to check the count. */
#include <stdlib.h>
#include <string.h>

#include "keel/model.h"

keel_status keel_model_placement_make(uint32_t nodes, uint32_t replicas,
                                      keel_model_placement *placement_p) {
  if (placement_p == NULL || replicas < 1 || replicas > KEEL_MODEL_PLACEMENT_MAX_REPLICAS ||
      nodes < replicas || nodes > KEEL_MODEL_PLACEMENT_MAX_NODES)
    return KEEL_EINVAL;
  placement_p->nodes = nodes;
  placement_p->replicas = replicas;
  placement_p->groups = nodes / replicas;
  placement_p->strategy = nodes % replicas == 0 ? KEEL_PLACEMENT_GROUP : KEEL_PLACEMENT_MIXED;
  return KEEL_OK;
}

void keel_model_placement_group(const keel_model_placement *placement, uint32_t group,
                                uint32_t *first_p, uint32_t *count_p) {
  *first_p = group * placement->replicas;
  bool last = group + 1 == placement->groups;
  *count_p = last ? placement->nodes - *first_p : placement->replicas;
}

/* The ring of a mixed placement is the last group; a group placement has none. */
static bool in_ring(const keel_model_placement *placement, uint32_t group) {
  return placement->strategy == KEEL_PLACEMENT_MIXED && group + 1 == placement->groups;
}

void keel_model_placement_holders(const keel_model_placement *placement, uint32_t node,
                                  uint32_t *holders) {
  uint32_t group = node / placement->replicas;
  if (group >= placement->groups) group = placement->groups - 1;
  uint32_t first, count;
  keel_model_placement_group(placement, group, &first, &count);
  for (uint32_t i = 0; i < placement->replicas; i++) {
    uint32_t position = node - first;
    /* A group: its other members. The ring: the k-1 nodes before this one. */
    uint32_t offset = in_ring(placement, group) ? count - i : i;
    holders[i] = first + (position + offset) % count;
  }
}

/* C(n, r) as a long double (about 1e1232 at most here, in range). */
static long double binomial(uint32_t n, uint32_t r) {
  if (r > n) return 0.0L;
  if (r > n - r) r = n - r;
  long double value = 1.0L;
  for (uint32_t i = 1; i <= r; i++) value = value * (long double)(n - r + i) / (long double)i;
  return value;
}

/* ways[x] = the x-subsets of groups disjoint groups of k that contain no whole group: the
 * coefficients of ((1+z)^k - z^k)^groups, all positive, so nothing cancels. */
static keel_status group_ways(uint32_t groups, uint32_t k, long double **ways_p) {
  size_t size = (size_t)groups * k + 1;
  long double *ways = calloc(size, sizeof *ways), *next = calloc(size, sizeof *next);
  if (ways == NULL || next == NULL) {
    free(ways);
    free(next);
    return KEEL_ENOMEM;
  }
  ways[0] = 1.0L;
  for (uint32_t g = 0; g < groups; g++) {
    memset(next, 0, size * sizeof *next);
    for (size_t x = 0; x <= (size_t)g * k; x++) {
      if (ways[x] == 0.0L) continue;
      for (uint32_t taken = 0; taken < k; taken++)
        next[x + taken] += ways[x] * binomial(k, taken);
    }
    long double *swap = ways;
    ways = next;
    next = swap;
  }
  free(next);
  *ways_p = ways;
  return KEEL_OK;
}

/* Whether the failed set (a bit mask over a ring of count nodes) has k consecutive
 * members, around the end too: some snapshot lost all its holders. */
static bool ring_loses(uint32_t mask, uint32_t count, uint32_t k) {
  for (uint32_t start = 0; start < count; start++) {
    uint32_t run = 0;
    while (run < k && (mask >> ((start + run) % count) & 1u)) run++;
    if (run == k) return true;
  }
  return false;
}

keel_status keel_model_placement_odds(const keel_model_placement *placement, uint32_t failed,
                                      double *recover_p) {
  if (placement == NULL || recover_p == NULL || failed > placement->nodes) return KEEL_EINVAL;
  uint32_t k = placement->replicas;
  bool mixed = placement->strategy == KEEL_PLACEMENT_MIXED;
  uint32_t groups = placement->groups - (mixed ? 1 : 0);
  uint32_t ring = placement->nodes - groups * k; /* 0 with group placement */
  long double *ways = NULL;
  keel_status status = group_ways(groups, k, &ways);
  if (status != KEEL_OK) return status;
  /* Failures split between the ring (those r of them) and the groups (the rest). */
  long double spared = 0.0L;
  if (ring == 0) {
    spared = failed <= groups * k ? ways[failed] : 0.0L;
  } else {
    for (uint32_t mask = 0; mask < (1u << ring); mask++) {
      uint32_t r = (uint32_t)__builtin_popcount(mask);
      if (r > failed || failed - r > groups * k || ring_loses(mask, ring, k)) continue;
      spared += ways[failed - r];
    }
  }
  free(ways);
  *recover_p = (double)(spared / binomial(placement->nodes, failed));
  return KEEL_OK;
}

keel_status keel_model_placement_corollary1(const keel_model_placement *placement,
                                            uint32_t failed, double *recover_p) {
  if (placement == NULL || recover_p == NULL || failed > placement->nodes) return KEEL_EINVAL;
  uint32_t n = placement->nodes, k = placement->replicas;
  if (placement->strategy != KEEL_PLACEMENT_GROUP || failed >= 2 * k) return KEEL_ENOTSUP;
  if (failed < k) {
    *recover_p = 1.0;
    return KEEL_OK;
  }
  long double lost = (long double)(n / k) * binomial(n - k, failed - k) / binomial(n, failed);
  *recover_p = (double)(1.0L - lost);
  return KEEL_OK;
}

/* One draw: the first failed entries of a partial Fisher-Yates shuffle of order. */
static void draw_failures(keel_random *random, uint32_t *order, uint32_t nodes, uint32_t failed,
                          bool *down) {
  memset(down, 0, nodes * sizeof *down);
  for (uint32_t i = 0; i < failed; i++) {
    uint32_t j = i + (uint32_t)keel_random_below(random, nodes - i);
    uint32_t swap = order[i];
    order[i] = order[j];
    order[j] = swap;
    down[order[i]] = true;
  }
}

static bool every_snapshot_survives(const keel_model_placement *placement, const bool *down) {
  uint32_t holders[KEEL_MODEL_PLACEMENT_MAX_REPLICAS];
  for (uint32_t node = 0; node < placement->nodes; node++) {
    keel_model_placement_holders(placement, node, holders);
    bool alive = false;
    for (uint32_t i = 0; i < placement->replicas && !alive; i++) alive = !down[holders[i]];
    if (!alive) return false;
  }
  return true;
}

keel_status keel_model_placement_simulate(const keel_model_placement *placement, uint32_t failed,
                                          uint64_t trials, uint64_t seed, double *recover_p) {
  if (placement == NULL || recover_p == NULL || failed > placement->nodes || trials == 0)
    return KEEL_EINVAL;
  uint32_t nodes = placement->nodes;
  uint32_t *order = malloc(nodes * sizeof *order);
  bool *down = malloc(nodes * sizeof *down);
  if (order == NULL || down == NULL) {
    free(order);
    free(down);
    return KEEL_ENOMEM;
  }
  for (uint32_t i = 0; i < nodes; i++) order[i] = i;
  keel_random random;
  keel_random_seed(&random, seed);
  uint64_t survived = 0;
  for (uint64_t trial = 0; trial < trials; trial++) {
    draw_failures(&random, order, nodes, failed, down);
    if (every_snapshot_survives(placement, down)) survived++;
  }
  free(order);
  free(down);
  *recover_p = (double)survived / (double)trials;
  return KEEL_OK;
}
