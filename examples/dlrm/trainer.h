/* The DLRM trainer: everything one worker holds (data generator, model workspaces, a batch,
 * the parameter backend), its training loop, and the held-out evaluation. Worker `rank` of
 * `world` takes, at step s, samples s * (world * batch) + rank * batch + i for i < batch:
 * the global batch of step s is one contiguous range of sample indices, whatever the world. */
#ifndef DLRM_TRAINER_H
#define DLRM_TRAINER_H

#include "batch.h"
#include "data.h"
#include "metrics.h"
#include "model.h"
#include "options.h"
#include "params.h"

typedef struct dlrm_trainer {
  const dlrm_options *options;
  int rank, world;
  uint64_t table_offsets[DLRM_MAX_TABLES + 1]; /* [T]: the number of rows in all */
  dlrm_data *data;
  dlrm_model *model;
  keel_ec_optimizer optimizer; /* the rows' and the dense parameters' */
  dlrm_params params;          /* ops NULL until made */
  dlrm_batch batch;
  size_t dense_count;
  float *dense_parameters, *dense_gradient;
  float *logits;       /* batch capacity */
  dlrm_scored *scored; /* eval_samples: the model's scores */
  dlrm_scored *truth;  /* eval_samples: the hidden model's */
} dlrm_trainer;

/* Builds the trainer of options for worker rank of world. Returns 0, or the exit code after
 * a message on stderr: 2 for a configuration no backend can serve, 1 for other failures.
 * Whatever it returns, dlrm_trainer_release frees what it made. */
int dlrm_trainer_setup(dlrm_trainer *trainer, const dlrm_options *options, int rank, int world);
void dlrm_trainer_release(dlrm_trainer *trainer);

/* Trains options->steps steps, printing progress on stderr; then evaluates and prints the
 * result lines on stdout: "eval log-loss X auc Y ..." and "params-crc32c XXXXXXXX".
 * Returns the exit code. */
int dlrm_trainer_run(dlrm_trainer *trainer);

/* Makes batch samples first .. first + count - 1 and pulls the dense parameters and the
 * batch's rows from the backend. Returns the backend's status, after a message. */
keel_status dlrm_trainer_load(dlrm_trainer *trainer, uint64_t first, size_t count);

/* The mean loss of the loaded batch at the trainer's dense parameters and row values,
 * forward only. */
double dlrm_trainer_batch_loss(dlrm_trainer *trainer);

/* --check-gradients: compares the model's gradient of one batch (dense parameters and
 * rows) with central finite differences; prints the worst error and returns 0 when every
 * component agrees, 1 otherwise. */
int dlrm_gradient_check(dlrm_trainer *trainer);

#endif
