/* The parameter-server backend: the rows and the dense block live on the job's erasure-coded
 * parameter servers (`keel run --servers S --ec k=K,r=R`), reached through keel_ec_client.
 * A lost server is invisible here: the client reads and updates its rows through the parity. */
#include <stdio.h>
#include <stdlib.h>

#include "params.h"

static keel_status servers_pull_rows(void *self, const uint64_t *rows, size_t count,
                                     float *values) {
  return keel_ec_client_pull_rows(self, rows, count, values);
}

static keel_status servers_push_rows(void *self, uint64_t step, const uint64_t *rows, size_t count,
                                     const float *gradients) {
  return keel_ec_client_push_rows(self, step, rows, count, gradients);
}

static keel_status servers_pull_dense(void *self, float *values) {
  return keel_ec_client_pull_dense(self, values);
}

static keel_status servers_push_dense(void *self, uint64_t step, const float *gradients) {
  return keel_ec_client_push_dense(self, step, gradients);
}

static keel_status servers_checksum(void *self, uint32_t *crc32c_p) {
  return keel_ec_client_checksum(self, crc32c_p);
}

static void servers_destroy(void *self) { keel_ec_client_close(self); }

static const dlrm_params_ops servers_ops = {
    .pull_rows = servers_pull_rows,
    .push_rows = servers_push_rows,
    .pull_dense = servers_pull_dense,
    .push_dense = servers_push_dense,
    .checksum = servers_checksum,
    .destroy = servers_destroy,
};

keel_status dlrm_params_servers_create(const dlrm_params_config *config, dlrm_params *params_p) {
  keel_ec_config tables = {
      .dim = config->dim,
      .optimizer = config->optimizer,
      .total_rows = config->total_rows,
      .dense_count = (uint64_t)config->dense_count,
      .seed = config->seed,
      .init_scale = config->init_scale,
      .replicate_dense = true,
      .two_phase_commit = config->two_phase_commit && !config->without_parity,
      .without_parity = config->without_parity,
  };
  keel_ec_config from_launcher = tables;
  keel_status status = keel_ec_config_from_env(&from_launcher);
  if (status == KEEL_ENOTFOUND) {
    fprintf(stderr,
            "dlrm: --backend servers needs a job with parameter servers "
            "(keel run --servers S --ec k=K,r=R)\n");
    return KEEL_EINVAL;
  }
  /* Synchronous servers wait for every worker's push of a step: --sync must agree. */
  if (status == KEEL_OK && (from_launcher.workers > 0) != config->synchronous) {
    fprintf(stderr, "dlrm: --sync and keel run's --ec-sync must go together\n");
    return KEEL_EINVAL;
  }
  if (status == KEEL_OK && from_launcher.workers > 0 && from_launcher.workers != config->workers) {
    fprintf(stderr, "dlrm: the servers expect %d workers, the job has %d\n", from_launcher.workers,
            config->workers);
    return KEEL_EINVAL;
  }
  keel_ec_client *client = NULL;
  if (status == KEEL_OK) status = keel_ec_client_open_env(&tables, config->worker, &client);
  /* Every worker makes the same initial values from the seed; the first to arrive sets the
   * dense block, so none reads it unset. */
  if (status == KEEL_OK) status = keel_ec_client_init_dense(client, config->dense_initial);
  if (status != KEEL_OK) {
    keel_ec_client_close(client);
    return status;
  }
  *params_p = (dlrm_params){.ops = &servers_ops, .self = client};
  return KEEL_OK;
}
