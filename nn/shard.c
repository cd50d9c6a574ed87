/* Step-indexed data sharding: which samples a rank trains on at a step is a function of
 * (seed, step, rank, world, global batch), so a recovered or shrunk job resumes the same data
 * stream from its step counter alone, with no data-loader state to checkpoint. */
#include <stdlib.h>

#include "nn.h"

/* The third input of keel_random_seed_for, so the shuffle's stream differs from any
 * (seed, step, rank) stream a program draws for itself. */
#define SHUFFLE_STREAM 0x73687566666c65ull /* "shuffle" */

struct nn_sampler {
  size_t dataset_size;
  uint64_t seed;
  /* Permutations of two consecutive epochs, slot epoch % 2: a global batch that straddles an
   * epoch boundary then costs no reshuffle, and neither does the next step. */
  uint32_t *permutation[2];
  uint64_t epoch[2];
  bool filled[2];
};

keel_status nn_shard_split(size_t global_batch, int rank, int world, size_t *offset_p,
                           size_t *count_p) {
  if (world < 1 || rank < 0 || rank >= world) return KEEL_EINVAL;
  size_t ranks = (size_t)world, index = (size_t)rank;
  size_t base = global_batch / ranks, extra = global_batch % ranks;
  *offset_p = index * base + (index < extra ? index : extra);
  *count_p = base + (index < extra ? 1 : 0);
  return KEEL_OK;
}

void nn_sampler_destroy(nn_sampler *sampler) {
  if (sampler == NULL) return;
  free(sampler->permutation[0]);
  free(sampler->permutation[1]);
  free(sampler);
}

keel_status nn_sampler_create(size_t dataset_size, uint64_t seed, nn_sampler **sampler_p) {
  if (dataset_size == 0 || dataset_size > UINT32_MAX) return KEEL_EINVAL;
  nn_sampler *sampler = calloc(1, sizeof *sampler);
  if (sampler == NULL) return KEEL_ENOMEM;
  sampler->dataset_size = dataset_size;
  sampler->seed = seed;
  sampler->permutation[0] = malloc(dataset_size * sizeof(uint32_t));
  sampler->permutation[1] = malloc(dataset_size * sizeof(uint32_t));
  if (sampler->permutation[0] == NULL || sampler->permutation[1] == NULL) {
    nn_sampler_destroy(sampler);
    return KEEL_ENOMEM;
  }
  *sampler_p = sampler;
  return KEEL_OK;
}

/* The permutation of one epoch: Fisher-Yates driven by a stream seeded from (seed, epoch). */
static const uint32_t *epoch_permutation(nn_sampler *sampler, uint64_t epoch) {
  size_t slot = (size_t)(epoch & 1);
  uint32_t *permutation = sampler->permutation[slot];
  if (sampler->filled[slot] && sampler->epoch[slot] == epoch) return permutation;
  keel_random random;
  keel_random_seed(&random, keel_random_seed_for(sampler->seed, epoch, SHUFFLE_STREAM));
  size_t size = sampler->dataset_size;
  for (size_t i = 0; i < size; i++) permutation[i] = (uint32_t)i;
  for (size_t i = size - 1; i > 0; i--) {
    size_t j = (size_t)keel_random_below(&random, (uint64_t)i + 1);
    uint32_t held = permutation[i];
    permutation[i] = permutation[j];
    permutation[j] = held;
  }
  sampler->epoch[slot] = epoch;
  sampler->filled[slot] = true;
  return permutation;
}

keel_status nn_sampler_indices(nn_sampler *sampler, uint64_t step, int rank, int world,
                               size_t global_batch, uint32_t *indices, size_t capacity,
                               size_t *count_p) {
  size_t offset, count;
  keel_status status = nn_shard_split(global_batch, rank, world, &offset, &count);
  if (status != KEEL_OK) return status;
  if (count > capacity) return KEEL_ERANGE;
  uint64_t start, end;
  if (__builtin_mul_overflow(step, (uint64_t)global_batch, &start) ||
      __builtin_add_overflow(start, (uint64_t)offset, &start) ||
      __builtin_add_overflow(start, (uint64_t)count, &end))
    return KEEL_ERANGE;
  uint64_t size = sampler->dataset_size;
  size_t done = 0;
  while (done < count) {
    uint64_t position = start + done;
    uint64_t epoch = position / size, within = position % size;
    const uint32_t *permutation = epoch_permutation(sampler, epoch);
    /* Copy the run that stays inside this epoch in one go. */
    size_t run = count - done;
    if (run > size - within) run = (size_t)(size - within);
    for (size_t i = 0; i < run; i++) indices[done + i] = permutation[within + i];
    done += run;
  }
  *count_p = count;
  return KEEL_OK;
}
