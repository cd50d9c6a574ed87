/* The synthetic click generator (docs/DLRM.md, "Data"). Hidden model from the data seed:
 * dense weights w and a k x D projection A (standard normal), and for every row j of table t
 * a hidden vector u(t, j) of k = 4 values uniform with variance 1, made on demand from a
 * hash of (seed, t, j) so that tables of 2^32 rows cost no memory. Sample i, from the stream
 * keel_random_seed_for(seed, i, 0): D standard normal features x (Box-Muller), then per table
 * `hotness` ids, each a Zipf(s) rank through a keyed permutation of the table (popular ids
 * are scattered, not rows 0, 1, 2...), then the label: 1 with probability sigmoid(logit),
 *   z_0 = A x / sqrt(D),  z_t = (sum of the table's u(t, id)) / sqrt(hotness),  F = T + 1
 *   logit = BIAS + DENSE_WEIGHT * w.x / sqrt(D)
 *                + FIRST_ORDER_WEIGHT * sum over t of 1.z_t / sqrt(k T)
 *                + INTERACTION_WEIGHT * sum over a < b < F of z_a.z_b / sqrt(k F (F - 1) / 2)
 * (1 = (1, ..., 1), the hidden vector of a constant feature: each id's own click effect).
 * Each term has variance about 1 before its weight, whatever T; all are dot products of
 * hidden vectors, a DLRM's own structure, which the model can learn. The constants give a
 * click rate of 25-35% and a Bayes AUC near 0.8. */
#include "data.h"

#include <math.h>
#include <stdlib.h>

#include "zipf.h"

#define HIDDEN_DIM 4
#define BIAS (-1.1)
#define DENSE_WEIGHT 0.7
#define FIRST_ORDER_WEIGHT 1.0
#define INTERACTION_WEIGHT 0.6
#define FEISTEL_ROUNDS 4

/* The streams of keel_random_seed_for(seed, x, purpose) that the generator uses. */
enum stream_purpose {
  STREAM_SAMPLE = 0,      /* x = the sample index */
  STREAM_HIDDEN = 1,      /* x = 0: w and A */
  STREAM_PERMUTATION = 2, /* x = the table: its permutation's key */
  STREAM_VECTOR = 3,      /* x = the table: the key of its hidden vectors */
};

/* A keyed permutation of [0, count): a Feistel network over the smallest even number of
 * bits that holds count - 1 (at least 2), walked until it lands inside the table (fewer
 * than 4 rounds on average, since the domain is under 4 * count). */
typedef struct permutation {
  uint64_t key;
  uint64_t count;
  unsigned half_bits;
} permutation;

typedef struct table {
  dlrm_zipf zipf;
  permutation shuffle;
  uint64_t vector_key;
} table;

struct dlrm_data {
  uint64_t seed;
  size_t table_count, dense_features, hotness;
  double dense_scale;       /* 1 / sqrt(D) */
  double bag_scale;         /* 1 / sqrt(hotness) */
  double first_order_scale; /* FIRST_ORDER_WEIGHT / sqrt(k * T) */
  double interaction_scale; /* INTERACTION_WEIGHT / sqrt(k * pairs) */
  double *dense_weights;    /* w: D */
  double *projection;       /* A: k x D, row-major */
  table *tables;            /* T */
};

static permutation permutation_make(uint64_t key, uint64_t count) {
  unsigned bits = 2;
  while (bits < 64 && (count - 1) >> bits != 0) bits += 2;
  return (permutation){.key = key, .count = count, .half_bits = bits / 2};
}

static uint64_t feistel(const permutation *shuffle, uint64_t value) {
  uint64_t mask = (UINT64_C(1) << shuffle->half_bits) - 1;
  uint64_t left = value >> shuffle->half_bits, right = value & mask;
  for (uint64_t round = 0; round < FEISTEL_ROUNDS; round++) {
    uint64_t next = left ^ (keel_random_seed_for(shuffle->key, right, round) & mask);
    left = right;
    right = next;
  }
  return left << shuffle->half_bits | right;
}

/* Cycle walking: a permutation of the larger domain, followed until it is back inside
 * [0, count), is a permutation of [0, count). */
static uint64_t permutation_apply(const permutation *shuffle, uint64_t rank) {
  uint64_t value = rank;
  do value = feistel(shuffle, value);
  while (value >= shuffle->count);
  return value;
}

/* Standard normal values by Box-Muller, two per pair of uniforms. 1 - u keeps log's
 * argument in (0, 1]. */
static void standard_normals(keel_random *random, size_t count, double *values) {
  const double two_pi = 6.283185307179586;
  for (size_t i = 0; i < count; i += 2) {
    double radius = sqrt(-2.0 * log(1.0 - keel_random_unit(random)));
    double angle = two_pi * keel_random_unit(random);
    values[i] = radius * cos(angle);
    if (i + 1 < count) values[i + 1] = radius * sin(angle);
  }
}

/* u(t, j): four 16-bit fields of one hash, each mapped to the middle of its bucket in
 * (-sqrt(3), sqrt(3)): mean 0, variance 1. */
static void hidden_vector(const table *source, uint64_t row, double *vector) {
  const double half_width = 1.7320508075688772;
  uint64_t bits = keel_random_seed_for(source->vector_key, row, 0);
  for (int c = 0; c < HIDDEN_DIM; c++) {
    double field = (double)((bits >> (16 * c)) & 0xffff);
    vector[c] = ((field + 0.5) / 32768.0 - 1.0) * half_width;
  }
}

void dlrm_data_destroy(dlrm_data *data) {
  if (data == NULL) return;
  free(data->tables);
  free(data->projection);
  free(data->dense_weights);
  free(data);
}

static bool config_valid(const dlrm_data_config *config) {
  if (config->table_count == 0 || config->table_count > DLRM_MAX_TABLES) return false;
  if (config->dense_features == 0 || config->dense_features > DLRM_MAX_DENSE_FEATURES) return false;
  if (config->hotness == 0 || config->hotness > DLRM_MAX_HOTNESS) return false;
  for (size_t t = 0; t < config->table_count; t++) {
    if (config->table_rows[t] == 0 || config->table_rows[t] > DLRM_MAX_TABLE_ROWS) return false;
  }
  return true;
}

static keel_status tables_make(const dlrm_data_config *config, dlrm_data *data) {
  for (size_t t = 0; t < config->table_count; t++) {
    table *made = &data->tables[t];
    keel_status status = dlrm_zipf_init(config->table_rows[t], config->zipf_exponent, &made->zipf);
    if (status != KEEL_OK) return status;
    made->shuffle = permutation_make(keel_random_seed_for(config->seed, t, STREAM_PERMUTATION),
                                     config->table_rows[t]);
    made->vector_key = keel_random_seed_for(config->seed, t, STREAM_VECTOR);
  }
  return KEEL_OK;
}

keel_status dlrm_data_create(const dlrm_data_config *config, dlrm_data **data_p) {
  if (!config_valid(config)) return KEEL_EINVAL;
  dlrm_data *data = calloc(1, sizeof *data);
  if (data == NULL) return KEEL_ENOMEM;
  size_t features = config->dense_features;
  data->seed = config->seed;
  data->table_count = config->table_count;
  data->dense_features = features;
  data->hotness = config->hotness;
  data->dense_weights = calloc(features, sizeof(double));
  data->projection = calloc(HIDDEN_DIM * features, sizeof(double));
  data->tables = calloc(config->table_count, sizeof(table));
  if (data->dense_weights == NULL || data->projection == NULL || data->tables == NULL) {
    dlrm_data_destroy(data);
    return KEEL_ENOMEM;
  }
  keel_status status = tables_make(config, data);
  if (status != KEEL_OK) {
    dlrm_data_destroy(data);
    return status;
  }
  keel_random random;
  keel_random_seed(&random, keel_random_seed_for(config->seed, 0, STREAM_HIDDEN));
  standard_normals(&random, features, data->dense_weights);
  standard_normals(&random, HIDDEN_DIM * features, data->projection);
  double pairs = (double)(config->table_count + 1) * (double)config->table_count / 2.0;
  data->dense_scale = 1.0 / sqrt((double)features);
  data->bag_scale = 1.0 / sqrt((double)config->hotness);
  data->first_order_scale = FIRST_ORDER_WEIGHT / sqrt(HIDDEN_DIM * (double)config->table_count);
  data->interaction_scale = INTERACTION_WEIGHT / sqrt(HIDDEN_DIM * pairs);
  *data_p = data;
  return KEEL_OK;
}

/* What the logit needs of the sample's hidden vectors, gathered in one pass with no storage
 * per feature: the sum over pairs a < b of z_a.z_b is (|sum z|^2 - sum |z|^2) / 2, and the
 * first-order term the sum of the bags' components. */
typedef struct hidden_sums {
  double sum[HIDDEN_DIM];
  double squares;
  double first_order;
} hidden_sums;

static void hidden_sums_add(hidden_sums *total, const double *feature) {
  for (int c = 0; c < HIDDEN_DIM; c++) {
    total->sum[c] += feature[c];
    total->squares += feature[c] * feature[c];
  }
}

static double pair_products(const hidden_sums *total) {
  double norm = 0.0;
  for (int c = 0; c < HIDDEN_DIM; c++) norm += total->sum[c] * total->sum[c];
  return (norm - total->squares) / 2.0;
}

/* Fills the dense features of the sample; returns w.x / sqrt(D) and adds z_0 to total. */
static double dense_part(const dlrm_data *data, keel_random *random, float *dense,
                         hidden_sums *total) {
  size_t features = data->dense_features;
  double linear = 0.0, projected[HIDDEN_DIM] = {0};
  for (size_t d = 0; d < features; d += 2) {
    double pair[2];
    size_t take = features - d < 2 ? features - d : 2;
    standard_normals(random, take, pair);
    for (size_t i = 0; i < take; i++) {
      dense[d + i] = (float)pair[i];
      /* The float the model sees, so the label depends on nothing it cannot see. */
      double value = (double)dense[d + i];
      linear += data->dense_weights[d + i] * value;
      for (int c = 0; c < HIDDEN_DIM; c++)
        projected[c] += data->projection[(size_t)c * features + d + i] * value;
    }
  }
  for (int c = 0; c < HIDDEN_DIM; c++) projected[c] *= data->dense_scale;
  hidden_sums_add(total, projected);
  return linear * data->dense_scale;
}

/* Draws the ids of one table and adds its z_t to total. */
static void table_part(const dlrm_data *data, const table *source, keel_random *random,
                       uint32_t *ids, hidden_sums *total) {
  double bag[HIDDEN_DIM] = {0};
  for (size_t h = 0; h < data->hotness; h++) {
    uint64_t row = permutation_apply(&source->shuffle, dlrm_zipf_draw(&source->zipf, random));
    ids[h] = (uint32_t)row;
    double vector[HIDDEN_DIM];
    hidden_vector(source, row, vector);
    for (int c = 0; c < HIDDEN_DIM; c++) bag[c] += vector[c];
  }
  for (int c = 0; c < HIDDEN_DIM; c++) bag[c] *= data->bag_scale;
  hidden_sums_add(total, bag);
  for (int c = 0; c < HIDDEN_DIM; c++) total->first_order += bag[c];
}

void dlrm_data_sample(const dlrm_data *data, uint64_t index, dlrm_sample *sample) {
  keel_random random;
  keel_random_seed(&random, keel_random_seed_for(data->seed, index, STREAM_SAMPLE));
  hidden_sums total = {{0}, 0.0, 0.0};
  double linear = dense_part(data, &random, sample->dense, &total);
  for (size_t t = 0; t < data->table_count; t++)
    table_part(data, &data->tables[t], &random, sample->ids + t * data->hotness, &total);
  double logit = BIAS + DENSE_WEIGHT * linear + data->first_order_scale * total.first_order +
                 data->interaction_scale * pair_products(&total);
  double probability = 1.0 / (1.0 + exp(-logit));
  sample->label = keel_random_unit(&random) < probability ? 1.0f : 0.0f;
  sample->logit = logit;
}
