/* A batch of the DLRM example: its samples, the distinct global rows they look up (sorted,
 * as the parameter backend wants them), and room for those rows' values and gradients.
 * Allocated once for the largest batch; filling one allocates nothing. */
#ifndef DLRM_BATCH_H
#define DLRM_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"

typedef struct dlrm_lookup {
  uint64_t row;      /* global row */
  uint32_t position; /* (sample * T + table) * hotness + slot */
} dlrm_lookup;

typedef struct dlrm_batch {
  size_t capacity, count;
  size_t table_count, hotness, dense_features, dim;
  float *dense;        /* count x D */
  uint32_t *ids;       /* count x T x hotness: rows within each table */
  float *labels;       /* count */
  double *true_logits; /* count: the hidden model's, for the Bayes-optimal AUC */
  uint32_t *lookups;   /* count x T x hotness: index into rows */
  uint64_t *rows;      /* row_count distinct global rows, strictly increasing */
  size_t row_count;
  float *row_values;    /* row_count x dim: pulled before the model runs */
  float *row_gradients; /* row_count x dim: summed over each row's occurrences */
  dlrm_lookup *sorted;  /* scratch of count x T x hotness */
} dlrm_batch;

/* Allocates a batch of up to capacity samples (lookups fit in 32 bits: capacity * T *
 * hotness < 2^32). KEEL_EINVAL, KEEL_ENOMEM; on failure *batch holds nothing to release. */
keel_status dlrm_batch_init(dlrm_batch *batch, size_t capacity, size_t table_count, size_t hotness,
                            size_t dense_features, size_t dim);
/* Frees the buffers; a zeroed batch is fine. */
void dlrm_batch_release(dlrm_batch *batch);

/* Makes samples first_sample .. first_sample + count - 1 (count <= capacity) of data, then
 * the sorted distinct global rows they use (table t's row j is table_offsets[t] + j) and each
 * lookup's index among them. */
void dlrm_batch_fill(dlrm_batch *batch, const dlrm_data *data, const uint64_t *table_offsets,
                     uint64_t first_sample, size_t count);

#endif
