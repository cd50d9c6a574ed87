/* The command line of the DLRM example: every flag, its default and its bounds, parsed into
 * one plain struct (docs/DLRM.md lists them). */
#ifndef DLRM_OPTIONS_H
#define DLRM_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "keel/ec.h"
#include "mlp.h"

#define DLRM_PROGRAM "dlrm"

typedef struct dlrm_options {
  uint64_t table_rows[DLRM_MAX_TABLES];
  size_t table_count;
  size_t dim;
  size_t dense_features;
  size_t hotness;
  size_t bottom[DLRM_MAX_LAYERS]; /* the last is dim */
  size_t bottom_count;
  size_t top[DLRM_MAX_LAYERS]; /* the last is 1 */
  size_t top_count;
  size_t batch; /* samples per worker per step */
  uint64_t steps;
  keel_ec_optimizer_kind optimizer;
  float learning_rate;
  uint64_t seed;      /* the parameters' */
  uint64_t data_seed; /* the hidden model's and the samples' */
  double zipf_exponent;
  uint64_t eval_samples;
  uint64_t eval_every; /* 0: at the end only */
  bool sync;
  const char *backend;
  /* --fault-tolerance, for --backend servers: parity (ECRec) or none, and two-phase commit */
  bool without_parity, two_phase_commit;
  bool check_gradients;
  bool quiet;
} dlrm_options;

/* Parses argv into *parsed (defaults for what is not given). Returns -1 to go on, or the exit
 * code: 0 after --help, 2 after a message on stderr for an unknown flag, a malformed or
 * out-of-range value, or flags that contradict each other. */
int dlrm_options_parse(int argc, char **argv, dlrm_options *parsed);

/* The name of an optimizer kind as the flag spells it. */
const char *dlrm_optimizer_name(keel_ec_optimizer_kind kind);

#endif
