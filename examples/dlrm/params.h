/* Where the DLRM example keeps its parameters: an ops table that a trainer pulls rows and
 * dense parameters from and pushes gradients to, one optimizer step per push. "local" keeps
 * them in this process; a parameter-server backend implements the same table. */
#ifndef DLRM_PARAMS_H
#define DLRM_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/core.h"
#include "keel/ec.h"

/* What every backend is made from. Embedding rows are numbered globally: table t's row j is
 * row table_offset[t] + j, the offsets the prefix sums of the table sizes. Each row is a
 * keel_ec row block (ec.h) of dim parameters and the optimizer's state; row r starts as
 * keel_ec_row_initial(seed, r, dim, init_scale) with the optimizer state at its start. The
 * dense parameters are one more row block, of dense_count parameters (at most
 * KEEL_EC_ROW_MAX_DIM) and the optimizer's state, starting from dense_initial. The names
 * follow keel_ec_config's. */
typedef struct dlrm_params_config {
  uint64_t total_rows; /* the sum of the table sizes */
  int dim;
  uint64_t seed;
  float init_scale;
  keel_ec_optimizer optimizer; /* for rows and the dense block alike */
  int dense_count;
  const float *dense_initial; /* dense_count values; read during create only */
  int worker, workers;        /* this worker's rank, and the world */
  bool synchronous;           /* --sync: every step applied once all workers pushed it */
  bool without_parity;        /* --fault-tolerance none (a server backend only) */
  bool two_phase_commit;      /* --fault-tolerance ecrec-2pc (a server backend only) */
} dlrm_params_config;

/* One trainer calls these from one thread; each blocks until its work is done (a server
 * backend: until the servers answered). They return KEEL_OK or the backend's failure; a
 * failed push may have applied the step to some rows and not others. */
typedef struct dlrm_params_ops {
  /* values[i * dim ..] = the parameters of rows[i]; rows strictly increasing, each below
   * total_rows (KEEL_EINVAL otherwise, nothing written). */
  keel_status (*pull_rows)(void *self, const uint64_t *rows, size_t count, float *values);
  /* One optimizer step on each of rows from its gradient, gradients[i * dim ..], already
   * summed over the batch; rows as in pull_rows. step: the training step it belongs to (0,
   * 1, 2, ... for each worker, every step pushed even when count is 0), which a synchronous
   * server backend waits on and stamps updates with. */
  keel_status (*push_rows)(void *self, uint64_t step, const uint64_t *rows, size_t count,
                           const float *gradients);
  /* All dense_count dense parameters. */
  keel_status (*pull_dense)(void *self, float *values);
  /* One optimizer step on the dense parameters from dense_count gradient values, after the
   * step's push_rows. */
  keel_status (*push_dense)(void *self, uint64_t step, const float *gradients);
  /* keel_crc32c chained over every row block in global row order (rows never touched
   * included, as they start), then the dense block: parameters and optimizer state, bit for
   * bit, so two backends that saw the same pushes give the same value. */
  keel_status (*checksum)(void *self, uint32_t *crc32c_p);
  /* Frees the backend; self may be NULL. */
  void (*destroy)(void *self);
} dlrm_params_ops;

/* A backend: its ops and its state. */
typedef struct dlrm_params {
  const dlrm_params_ops *ops;
  void *self;
} dlrm_params;

/* How a backend is made (KEEL_EINVAL logged for a config it cannot serve, KEEL_ENOMEM, or
 * its own failure); *params_p set only on success; the caller ends it with
 * params_p->ops->destroy(params_p->self). */
typedef keel_status (*dlrm_params_create_fn)(const dlrm_params_config *config,
                                             dlrm_params *params_p);

/* The local backend: every row block in one array, allocated at once but made lazily, so
 * that pages of rows no batch has touched cost no memory (calloc leaves them unmapped) and
 * setup costs nothing whatever the table sizes. Deterministic; one thread. */
keel_status dlrm_params_local_create(const dlrm_params_config *config, dlrm_params *params_p);

/* The parameter-server backend: the job's ECRec servers (keel run --servers S --ec k=K,r=R
 * [--ec-sync]) through keel_ec_client, with two-phase commit and the dense block on two
 * servers. KEEL_EINVAL (with a message) outside such a job or when --sync and the job's
 * synchronous mode disagree. */
keel_status dlrm_params_servers_create(const dlrm_params_config *config, dlrm_params *params_p);

#endif
