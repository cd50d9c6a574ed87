/* The synthetic click data of the DLRM example: a hidden model made from a data seed labels
 * samples that are pure functions of (data seed, sample index), so any number of workers
 * each make their own shard with no file and no coordination (docs/DLRM.md). */
#ifndef DLRM_DATA_H
#define DLRM_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "keel/core.h"

#define DLRM_MAX_TABLES 1024
#define DLRM_MAX_TABLE_ROWS (UINT64_C(1) << 32)
#define DLRM_MAX_DENSE_FEATURES 4096
#define DLRM_MAX_HOTNESS 1024
/* Training samples are numbered from 0 and held-out ones from here: two ranges no run can
 * make meet. */
#define DLRM_EVAL_FIRST_SAMPLE (UINT64_C(1) << 62)

typedef struct dlrm_data_config {
  uint64_t seed;
  size_t table_count;         /* T, 1 .. DLRM_MAX_TABLES */
  const uint64_t *table_rows; /* T sizes, 1 .. DLRM_MAX_TABLE_ROWS each; copied */
  size_t dense_features;      /* D, 1 .. DLRM_MAX_DENSE_FEATURES */
  size_t hotness;             /* ids per table per sample, 1 .. DLRM_MAX_HOTNESS */
  double zipf_exponent;       /* s in [0, 10]; 0 draws ids uniformly */
} dlrm_data_config;

/* One sample: the arrays belong to the caller, sized from the config. */
typedef struct dlrm_sample {
  float *dense;  /* D features */
  uint32_t *ids; /* T x hotness row indices within each table, table-major */
  float label;   /* 0 or 1 */
  double logit;  /* the hidden model's logit: the Bayes-optimal score */
} dlrm_sample;

typedef struct dlrm_data dlrm_data;

/* Makes the hidden model of config (a few kilobytes whatever the table sizes). KEEL_EINVAL
 * for a config out of range, KEEL_ENOMEM; *data_p set only on success; the caller ends it
 * with dlrm_data_destroy. Immutable once made: threads may draw samples at once. */
keel_status dlrm_data_create(const dlrm_data_config *config, dlrm_data **data_p);
void dlrm_data_destroy(dlrm_data *data);

/* Writes sample `index` into *sample: a pure function of (seed, index) and the config.
 * Allocates nothing. */
void dlrm_data_sample(const dlrm_data *data, uint64_t index, dlrm_sample *sample);

#endif
