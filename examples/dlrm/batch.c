/* Filling a batch (batch.h): samples from the generator, then one sort of (row, position)
 * pairs, which both lists each distinct row once, ascending, and tells every lookup where its
 * row went. Positions are unique, so the order is total and the result does not depend on
 * qsort's stability. */
#include "batch.h"

#include <stdlib.h>
#include <string.h>

void dlrm_batch_release(dlrm_batch *batch) {
  free(batch->sorted);
  free(batch->row_gradients);
  free(batch->row_values);
  free(batch->rows);
  free(batch->lookups);
  free(batch->true_logits);
  free(batch->labels);
  free(batch->ids);
  free(batch->dense);
  memset(batch, 0, sizeof *batch);
}

keel_status dlrm_batch_init(dlrm_batch *batch, size_t capacity, size_t table_count, size_t hotness,
                            size_t dense_features, size_t dim) {
  memset(batch, 0, sizeof *batch);
  if (capacity == 0 || table_count == 0 || hotness == 0 || dim == 0) return KEEL_EINVAL;
  uint64_t lookups = (uint64_t)capacity * table_count * hotness;
  if (lookups >= UINT32_MAX / dim) return KEEL_EINVAL;
  batch->capacity = capacity;
  batch->table_count = table_count;
  batch->hotness = hotness;
  batch->dense_features = dense_features;
  batch->dim = dim;
  batch->dense = calloc(capacity * dense_features, sizeof(float));
  batch->ids = calloc(lookups, sizeof(uint32_t));
  batch->labels = calloc(capacity, sizeof(float));
  batch->true_logits = calloc(capacity, sizeof(double));
  batch->lookups = calloc(lookups, sizeof(uint32_t));
  batch->rows = calloc(lookups, sizeof(uint64_t));
  batch->row_values = calloc(lookups * dim, sizeof(float));
  batch->row_gradients = calloc(lookups * dim, sizeof(float));
  batch->sorted = calloc(lookups, sizeof(dlrm_lookup));
  if (!batch->dense || !batch->ids || !batch->labels || !batch->true_logits || !batch->lookups ||
      !batch->rows || !batch->row_values || !batch->row_gradients || !batch->sorted) {
    dlrm_batch_release(batch);
    return KEEL_ENOMEM;
  }
  return KEEL_OK;
}

static int by_row_then_position(const void *left, const void *right) {
  const dlrm_lookup *a = left, *b = right;
  if (a->row != b->row) return a->row < b->row ? -1 : 1;
  return (a->position > b->position) - (a->position < b->position);
}

static void gather_rows(dlrm_batch *batch, const uint64_t *table_offsets) {
  size_t per_sample = batch->table_count * batch->hotness;
  size_t total = batch->count * per_sample;
  for (size_t position = 0; position < total; position++) {
    size_t table = position % per_sample / batch->hotness;
    batch->sorted[position] = (dlrm_lookup){
        .row = table_offsets[table] + batch->ids[position],
        .position = (uint32_t)position,
    };
  }
  qsort(batch->sorted, total, sizeof *batch->sorted, by_row_then_position);
  size_t row_count = 0;
  for (size_t i = 0; i < total; i++) {
    const dlrm_lookup *lookup = &batch->sorted[i];
    if (row_count == 0 || batch->rows[row_count - 1] != lookup->row)
      batch->rows[row_count++] = lookup->row;
    batch->lookups[lookup->position] = (uint32_t)(row_count - 1);
  }
  batch->row_count = row_count;
}

void dlrm_batch_fill(dlrm_batch *batch, const dlrm_data *data, const uint64_t *table_offsets,
                     uint64_t first_sample, size_t count) {
  size_t per_sample = batch->table_count * batch->hotness;
  batch->count = count;
  for (size_t i = 0; i < count; i++) {
    dlrm_sample sample = {
        .dense = batch->dense + i * batch->dense_features,
        .ids = batch->ids + i * per_sample,
    };
    dlrm_data_sample(data, first_sample + i, &sample);
    batch->labels[i] = sample.label;
    batch->true_logits[i] = sample.logit;
  }
  gather_rows(batch, table_offsets);
}
