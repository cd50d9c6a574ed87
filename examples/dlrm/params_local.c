/* The "local" parameter backend of params.h: the row blocks and the dense block that the
 * parameter servers will hold, here in this process's memory. A bitmap marks the rows made
 * so far; a row is made from keel_ec_row_initial when first pulled or pushed, which gives
 * the same bytes as making every row at the start. */
#include <stdlib.h>

#include "params.h"

#define MODULE "dlrm"

typedef struct local_params {
  uint64_t total_rows;
  int dim;
  uint64_t seed;
  float init_scale;
  keel_ec_optimizer optimizer;
  int dense_count;
  size_t row_bytes, dense_bytes;
  uint8_t *rows;  /* total_rows x row_bytes */
  uint64_t *made; /* one bit per row */
  uint8_t *dense; /* dense_bytes */
  float *initial; /* dim values: a row being made */
  uint8_t *fresh; /* row_bytes: a row not made yet, for the checksum */
} local_params;

static void local_destroy(void *self) {
  local_params *params = self;
  if (params == NULL) return;
  free(params->fresh);
  free(params->initial);
  free(params->dense);
  free(params->made);
  free(params->rows);
  free(params);
}

/* Writes row's starting block into block. */
static void row_make(local_params *params, uint64_t row, uint8_t *block) {
  /* Neither can fail: dim, scale and optimizer were checked at creation. */
  keel_ec_row_initial(params->seed, row, params->dim, params->init_scale, params->initial);
  keel_ec_row_init(&params->optimizer, params->dim, params->initial, block);
}

static bool row_made(const local_params *params, uint64_t row) {
  return (params->made[row / 64] >> (row % 64) & 1) != 0;
}

/* The row's block, made first if no call has touched it yet. */
static uint8_t *row_block(local_params *params, uint64_t row) {
  uint8_t *block = params->rows + row * params->row_bytes;
  if (!row_made(params, row)) {
    row_make(params, row, block);
    params->made[row / 64] |= UINT64_C(1) << (row % 64);
  }
  return block;
}

static keel_status rows_check(const local_params *params, const uint64_t *rows, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (rows[i] >= params->total_rows || (i > 0 && rows[i] <= rows[i - 1])) {
      KEEL_LOG_E(MODULE, "row %llu (index %zu) is out of range or out of order",
                 (unsigned long long)rows[i], i);
      return KEEL_EINVAL;
    }
  }
  return KEEL_OK;
}

static keel_status local_pull_rows(void *self, const uint64_t *rows, size_t count, float *values) {
  local_params *params = self;
  keel_status status = rows_check(params, rows, count);
  for (size_t i = 0; status == KEEL_OK && i < count; i++)
    status =
        keel_ec_row_read(params->dim, row_block(params, rows[i]), values + i * (size_t)params->dim);
  return status;
}

/* The steps need no stamp here: one process applies them in its own order. */
static keel_status local_push_rows(void *self, uint64_t step, const uint64_t *rows, size_t count,
                                   const float *gradients) {
  (void)step;
  local_params *params = self;
  keel_status status = rows_check(params, rows, count);
  for (size_t i = 0; status == KEEL_OK && i < count; i++)
    status = keel_ec_row_apply(&params->optimizer, params->dim, row_block(params, rows[i]),
                               gradients + i * (size_t)params->dim, NULL);
  return status;
}

static keel_status local_pull_dense(void *self, float *values) {
  local_params *params = self;
  return keel_ec_row_read(params->dense_count, params->dense, values);
}

static keel_status local_push_dense(void *self, uint64_t step, const float *gradients) {
  (void)step;
  local_params *params = self;
  return keel_ec_row_apply(&params->optimizer, params->dense_count, params->dense, gradients, NULL);
}

static keel_status local_checksum(void *self, uint32_t *crc32c_p) {
  local_params *params = self;
  uint32_t crc = 0;
  for (uint64_t row = 0; row < params->total_rows; row++) {
    const uint8_t *block = params->rows + row * params->row_bytes;
    /* Making untouched rows in scratch keeps their pages unmapped. */
    if (!row_made(params, row)) {
      row_make(params, row, params->fresh);
      block = params->fresh;
    }
    crc = keel_crc32c(crc, block, params->row_bytes);
  }
  *crc32c_p = keel_crc32c(crc, params->dense, params->dense_bytes);
  return KEEL_OK;
}

static const dlrm_params_ops local_ops = {
    .pull_rows = local_pull_rows,
    .push_rows = local_push_rows,
    .pull_dense = local_pull_dense,
    .push_dense = local_push_dense,
    .checksum = local_checksum,
    .destroy = local_destroy,
};

/* Sizes the blocks and checks what the ec functions would refuse later, so that the hot
 * path's calls cannot fail. */
static keel_status config_check(const dlrm_params_config *config, size_t *row_bytes_p,
                                size_t *dense_bytes_p) {
  keel_status status = keel_ec_row_block_bytes(&config->optimizer, config->dim, row_bytes_p);
  if (status == KEEL_OK)
    status = keel_ec_row_block_bytes(&config->optimizer, config->dense_count, dense_bytes_p);
  if (status != KEEL_OK) return status;
  float probe;
  status = keel_ec_row_initial(config->seed, 0, 1, config->init_scale, &probe);
  if (status != KEEL_OK) return status;
  if (config->total_rows == 0 || config->total_rows > SIZE_MAX / *row_bytes_p) {
    KEEL_LOG_E(MODULE, "%llu rows of %zu bytes do not fit in memory",
               (unsigned long long)config->total_rows, *row_bytes_p);
    return KEEL_EINVAL;
  }
  return KEEL_OK;
}

keel_status dlrm_params_local_create(const dlrm_params_config *config, dlrm_params *params_p) {
  size_t row_bytes, dense_bytes;
  keel_status status = config_check(config, &row_bytes, &dense_bytes);
  if (status != KEEL_OK) return status;
  local_params *params = calloc(1, sizeof *params);
  if (params == NULL) return KEEL_ENOMEM;
  params->total_rows = config->total_rows;
  params->dim = config->dim;
  params->seed = config->seed;
  params->init_scale = config->init_scale;
  params->optimizer = config->optimizer;
  params->dense_count = config->dense_count;
  params->row_bytes = row_bytes;
  params->dense_bytes = dense_bytes;
  params->rows = calloc(config->total_rows, row_bytes);
  params->made = calloc(config->total_rows / 64 + 1, sizeof(uint64_t));
  params->dense = malloc(dense_bytes);
  params->initial = malloc((size_t)config->dim * sizeof(float));
  params->fresh = malloc(row_bytes);
  if (!params->rows || !params->made || !params->dense || !params->initial || !params->fresh) {
    KEEL_LOG_E(MODULE, "cannot allocate %llu row blocks of %zu bytes",
               (unsigned long long)config->total_rows, row_bytes);
    local_destroy(params);
    return KEEL_ENOMEM;
  }
  keel_ec_row_init(&config->optimizer, config->dense_count, config->dense_initial, params->dense);
  *params_p = (dlrm_params){.ops = &local_ops, .self = params};
  return KEEL_OK;
}
