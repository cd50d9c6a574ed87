/* One parameter server's rows and parity blocks: made from the seed (every server makes its
 * own part, no data is sent to start), found by (group, member), changed under the group's
 * stripe lock. */
#include <stdlib.h>
#include <string.h>

#include "ec/ec_internal.h"
#include "ec/shard.h"

/* Writes the initial row block of (group, member < k) into block: zeros past the table. */
static keel_status initial_block(keel__ec_shard *shard, uint64_t seed, float scale,
                                 uint64_t total_rows, uint64_t group, int member, float *values,
                                 uint8_t *block) {
  uint64_t row = group * (uint64_t)shard->layout.data_blocks + (uint64_t)member;
  if (row >= total_rows) {
    memset(block, 0, shard->block_bytes);
    return KEEL_OK;
  }
  keel_status status = keel_ec_row_initial(seed, row, shard->dim, scale, values);
  if (status != KEEL_OK) return status;
  return keel_ec_row_init(&shard->optimizer, shard->dim, values, block);
}

static keel_status fill_data(keel__ec_shard *shard, const keel__ec_config *config, float *values) {
  for (uint64_t slot = 0; slot < shard->data_rows; slot++) {
    keel_ec_location at;
    keel_status status =
        keel_ec_layout_locate_slot(&shard->layout, shard->index, KEEL_EC_DATA, slot, &at);
    if (status == KEEL_OK)
      status = initial_block(shard, config->seed, config->init_scale, config->total_rows, at.group,
                             at.member, values, shard->data + slot * shard->block_bytes);
    if (status != KEEL_OK) return status;
  }
  return KEEL_OK;
}

/* Each parity block is the code of its group's initial rows, made here from the seed. */
static keel_status fill_parity(keel__ec_shard *shard, const keel__ec_config *config,
                               float *values) {
  int k = shard->layout.data_blocks, r = shard->layout.parity_blocks;
  uint8_t *scratch = malloc(shard->block_bytes * (size_t)(k + r));
  if (scratch == NULL) return KEEL_ENOMEM;
  keel_status status = KEEL_OK;
  uint8_t *data[KEEL_EC_MAX_BLOCKS], *parity[KEEL_EC_MAX_BLOCKS];
  for (int i = 0; i < k; i++) data[i] = scratch + (size_t)i * shard->block_bytes;
  for (int i = 0; i < r; i++) parity[i] = scratch + (size_t)(k + i) * shard->block_bytes;
  for (uint64_t slot = 0; slot < shard->parity_rows && status == KEEL_OK; slot++) {
    keel_ec_location at;
    status = keel_ec_layout_locate_slot(&shard->layout, shard->index, KEEL_EC_PARITY, slot, &at);
    for (int member = 0; member < k && status == KEEL_OK; member++)
      status = initial_block(shard, config->seed, config->init_scale, config->total_rows, at.group,
                             member, values, data[member]);
    if (status == KEEL_OK)
      status =
          keel_ec_encode(shard->code, shard->block_bytes, (const uint8_t *const *)data, parity);
    if (status == KEEL_OK)
      memcpy(shard->parity + slot * shard->block_bytes, parity[at.member - k], shard->block_bytes);
  }
  free(scratch);
  return status;
}

static keel_status allocate(keel__ec_shard *shard) {
  size_t k = (size_t)shard->layout.data_blocks;
  shard->data = calloc(shard->data_rows > 0 ? shard->data_rows : 1, shard->block_bytes);
  shard->parity = calloc(shard->parity_rows > 0 ? shard->parity_rows : 1, shard->block_bytes);
  shard->parity_steps =
      calloc(shard->parity_rows > 0 ? shard->parity_rows * k : 1, sizeof *shard->parity_steps);
  shard->data_steps =
      calloc(shard->data_rows > 0 ? shard->data_rows : 1, sizeof *shard->data_steps);
  if (shard->holds_dense) shard->dense = calloc(1, shard->dense_block_bytes);
  if (shard->data == NULL || shard->parity == NULL || shard->parity_steps == NULL ||
      shard->data_steps == NULL || (shard->holds_dense && shard->dense == NULL))
    return KEEL_ENOMEM;
  return KEEL_OK;
}

keel_status keel__ec_shard_create(const keel__ec_config *config, int index, keel__ec_shard *shard) {
  memset(shard, 0, sizeof *shard);
  shard->index = index;
  shard->dim = (int)config->dim;
  shard->optimizer = keel__ec_config_optimizer(config);
  shard->groups = (config->total_rows + config->data_blocks - 1) / config->data_blocks;
  shard->dense_count = config->dense_count;
  bool replicated = (config->options & KEEL__EC_OPTION_DENSE_REPLICATED) != 0;
  shard->holds_dense = config->dense_count > 0 && (index == 0 || (replicated && index == 1));
  for (int i = 0; i < KEEL__EC_STRIPES; i++) pthread_mutex_init(&shard->stripes[i], NULL);
  pthread_mutex_init(&shard->dense_lock, NULL);
  keel_status status = keel_ec_layout_init((int)config->servers, (int)config->data_blocks,
                                           (int)config->parity_blocks, &shard->layout);
  if (status == KEEL_OK)
    status = keel_ec_code_create((int)config->data_blocks, (int)config->parity_blocks, KEEL_EC_AUTO,
                                 &shard->code);
  if (status == KEEL_OK)
    status = keel_ec_row_block_bytes(&shard->optimizer, shard->dim, &shard->block_bytes);
  if (status == KEEL_OK && shard->holds_dense)
    status = keel_ec_row_block_bytes(&shard->optimizer, (int)config->dense_count,
                                     &shard->dense_block_bytes);
  if (status == KEEL_OK)
    status = keel_ec_layout_count(&shard->layout, index, shard->groups, &shard->data_rows,
                                  &shard->parity_rows);
  if (status == KEEL_OK) status = allocate(shard);
  float *values = status == KEEL_OK ? malloc(sizeof(float) * (size_t)shard->dim) : NULL;
  if (status == KEEL_OK && values == NULL) status = KEEL_ENOMEM;
  if (status == KEEL_OK) status = fill_data(shard, config, values);
  if (status == KEEL_OK) status = fill_parity(shard, config, values);
  free(values);
  if (status != KEEL_OK) keel__ec_shard_destroy(shard);
  return status;
}

void keel__ec_shard_destroy(keel__ec_shard *shard) {
  free(shard->data);
  free(shard->parity);
  free(shard->parity_steps);
  free(shard->data_steps);
  free(shard->dense);
  keel_ec_code_destroy(shard->code);
  for (int i = 0; i < KEEL__EC_STRIPES; i++) pthread_mutex_destroy(&shard->stripes[i]);
  pthread_mutex_destroy(&shard->dense_lock);
  memset(shard, 0, sizeof *shard);
}

/* The slot of (group, member) on this server, or false when another server holds it. */
static bool held_slot(const keel__ec_shard *shard, uint64_t group, int member, uint64_t *slot_p) {
  keel_ec_location at;
  if (group >= shard->groups ||
      keel_ec_layout_locate(&shard->layout, group, member, &at) != KEEL_OK ||
      at.server != shard->index)
    return false;
  *slot_p = at.slot;
  return true;
}

uint8_t *keel__ec_shard_block(keel__ec_shard *shard, uint64_t group, int member) {
  uint64_t slot;
  if (!held_slot(shard, group, member, &slot)) return NULL;
  uint8_t *base = member < shard->layout.data_blocks ? shard->data : shard->parity;
  return base + slot * shard->block_bytes;
}

pthread_mutex_t *keel__ec_shard_lock(keel__ec_shard *shard, uint64_t group) {
  return &shard->stripes[group % KEEL__EC_STRIPES];
}

uint64_t *keel__ec_shard_parity_step(keel__ec_shard *shard, uint64_t group, int parity_member,
                                     int data_member) {
  uint64_t slot;
  if (parity_member < shard->layout.data_blocks || !held_slot(shard, group, parity_member, &slot))
    return NULL;
  return &shard->parity_steps[slot * (uint64_t)shard->layout.data_blocks + (uint64_t)data_member];
}

uint64_t *keel__ec_shard_data_step(keel__ec_shard *shard, uint64_t group, int member) {
  uint64_t slot;
  if (member >= shard->layout.data_blocks || !held_slot(shard, group, member, &slot)) return NULL;
  return &shard->data_steps[slot];
}

void keel__ec_shard_stamps(keel__ec_shard *shard, uint64_t group, int member, uint64_t *stamps) {
  int k = shard->layout.data_blocks;
  for (int j = 0; j < k; j++) stamps[j] = 0;
  if (member < k) {
    stamps[member] = *keel__ec_shard_data_step(shard, group, member);
    return;
  }
  for (int j = 0; j < k; j++) stamps[j] = *keel__ec_shard_parity_step(shard, group, member, j);
}

keel_status keel__ec_shard_apply(keel__ec_shard *shard, uint8_t *block, const float *gradient,
                                 uint8_t *delta) {
  return keel_ec_row_apply(&shard->optimizer, shard->dim, block, gradient, delta);
}

keel_status keel__ec_shard_fold(keel__ec_shard *shard, uint64_t group, int data_member,
                                int parity_member, const uint8_t *delta, uint64_t step_mark) {
  uint8_t *block = keel__ec_shard_block(shard, group, parity_member);
  if (block == NULL || data_member >= shard->layout.data_blocks) return KEEL_EAGAIN;
  bool itself = parity_member == data_member;
  uint64_t *stamp = itself ? keel__ec_shard_data_step(shard, group, data_member)
                           : keel__ec_shard_parity_step(shard, group, parity_member, data_member);
  if (step_mark != 0 && *stamp >= step_mark) return KEEL_OK;
  keel_status status = KEEL_OK;
  if (itself) /* old XOR (old XOR new) = new */
    keel_ec_delta(shard->block_bytes, block, delta, block);
  else
    status =
        keel_ec_update_parity(shard->code, data_member, parity_member - shard->layout.data_blocks,
                              shard->block_bytes, delta, block);
  if (status == KEEL_OK && step_mark != 0) *stamp = step_mark;
  return status;
}

void keel__ec_shard_dense_install(keel__ec_shard *shard, const uint8_t *block, uint64_t stamp) {
  if (shard->dense_set && stamp < shard->dense_stamp) return;
  memcpy(shard->dense, block, shard->dense_block_bytes);
  shard->dense_stamp = stamp;
  shard->dense_set = true;
}
