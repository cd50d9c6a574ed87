/* A worker of `keel run --servers S --ec k=K,r=R [--ec-sync]` for the launcher's tests: it
 * trains embedding rows and a dense block on the job's parameter servers (no communicator:
 * its rank and world come from KEEL_UID, KEEL_FIRST_UID and KEEL_WORLD). Each step it pulls
 * rows drawn from (seed, step, rank), pulls the dense block, and pushes gradients that depend
 * on what it pulled, so a wrong degraded read changes the result. It prints
 *   progress step S rank R                          after each step
 *   params-crc32c XXXXXXXX lost-servers 0xBITS     worker 0, at the end
 *   parity-inconsistent-groups N                    worker 0, then: the parity scrub
 *                                                   (keel_ec_client_verify); N > 0 exits 1
 * and, for tools outside the job (keel chaos), worker 0 reports the events `progress` (step,
 * world) after each step and `finish` (step, world, state_crc32c: that crc) at the end.
 * Synchronous jobs end with the same crc on every run, servers lost or not.
 * Flags: --steps N --rows N --dim D --dense N --rows-per-step N --seed S --step-ms MS
 * --two-phase-commit 0|1 (default 1): the servers' updates in two phases (docs/ECREC.md)
 * --trace-every N: every N steps each worker also prints
 *   trace step S rank R dense XXXXXXXX rows ROW:XXXXXXXX ...   crc32c of each thing it pulled
 * so two runs that end with different models can be compared step by step to where they part.
 * Like a keel process it leaves with KEEL_EXIT_STOPPED (77) once job/stop is set, every worker
 * at the same step (ec_train/stop_step): in a synchronous job a worker that left a step
 * early would hold the others in that step's barrier until their calls' deadline. */
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/keel.h"

#define MAX_DIM 64
#define MAX_DENSE 4096
#define MAX_ROWS_PER_STEP 256
#define STORE_CONNECT_NS (10 * INT64_C(1000000000))
#define STOP_STEP_KEY "ec_train/stop_step"

typedef struct options {
  int64_t steps, rows, dim, dense, rows_per_step, seed, step_ms, trace_every, two_phase_commit;
} options;

typedef struct worker {
  options options;
  int64_t rank, world;
  keel_store *store; /* for job/stop only: the client has a store of its own */
  keel_reporter *reporter;
  int64_t stop_step; /* the step every worker leaves at; -1 until job/stop is seen */
  keel_ec_client *client;
  uint64_t rows[MAX_ROWS_PER_STEP];
  float values[MAX_ROWS_PER_STEP * MAX_DIM], gradients[MAX_ROWS_PER_STEP * MAX_DIM];
  float dense[MAX_DENSE], dense_gradients[MAX_DENSE];
} worker;

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.steps = 40,
                    .rows = 600,
                    .dim = 8,
                    .dense = 16,
                    .rows_per_step = 32,
                    .seed = 7,
                    .two_phase_commit = 1};
  static const struct option long_options[] = {{"steps", required_argument, 0, 's'},
                                               {"rows", required_argument, 0, 'r'},
                                               {"dim", required_argument, 0, 'd'},
                                               {"dense", required_argument, 0, 'D'},
                                               {"rows-per-step", required_argument, 0, 'p'},
                                               {"seed", required_argument, 0, 'e'},
                                               {"step-ms", required_argument, 0, 'm'},
                                               {"trace-every", required_argument, 0, 't'},
                                               {"two-phase-commit", required_argument, 0, 'c'},
                                               {0, 0, 0, 0}};
  static const struct {
    int option;
    int64_t minimum, maximum;
    size_t offset;
  } bounds[] = {{'s', 0, 1 << 30, offsetof(options, steps)},
                {'r', 1, 1 << 30, offsetof(options, rows)},
                {'d', 1, MAX_DIM, offsetof(options, dim)},
                {'D', 1, MAX_DENSE, offsetof(options, dense)},
                {'p', 1, MAX_ROWS_PER_STEP, offsetof(options, rows_per_step)},
                {'e', 0, 1 << 30, offsetof(options, seed)},
                {'m', 0, 60000, offsetof(options, step_ms)},
                {'t', 0, 1 << 30, offsetof(options, trace_every)},
                {'c', 0, 1, offsetof(options, two_phase_commit)}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    bool known = false;
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
      if (bounds[i].option != option) continue;
      int64_t *field = (int64_t *)((char *)opts + bounds[i].offset);
      known = keel_parse_int(optarg, bounds[i].minimum, bounds[i].maximum, field) == KEEL_OK;
    }
    if (!known) {
      fprintf(stderr, "ec_train: bad flag or value (see the file's header)\n");
      return -1;
    }
  }
  return 0;
}

/* The step's rows of this rank: strictly increasing, from (seed, step, rank). */
static size_t step_rows(worker *self, uint64_t step, keel_random *random) {
  const options *opts = &self->options;
  keel_random_seed(random, keel_random_seed_for((uint64_t)opts->seed, step, (uint64_t)self->rank));
  uint64_t total = (uint64_t)opts->rows, spread = 2 * total / (uint64_t)opts->rows_per_step + 1;
  size_t count = 0;
  for (uint64_t row = keel_random_below(random, 4);
       count < (size_t)opts->rows_per_step && row < total;
       row += 1 + keel_random_below(random, spread))
    self->rows[count++] = row;
  return count;
}

/* gradient = (value - target) * weight: targets and weight from the random stream, so the
 * gradient depends on what the pull returned. */
static void gradients_make(keel_random *random, size_t count, const float *values,
                           float *gradients) {
  float weight = (float)(0.5 + keel_random_unit(random));
  for (size_t i = 0; i < count; i++)
    gradients[i] = (values[i] - (float)(keel_random_unit(random) - 0.5)) * weight;
}

static void trace(const worker *self, uint64_t step, size_t count) {
  size_t dim = (size_t)self->options.dim;
  printf("trace step %llu rank %lld dense %08x rows", (unsigned long long)step,
         (long long)self->rank,
         (unsigned)keel_crc32c(0, self->dense, (size_t)self->options.dense * sizeof(float)));
  for (size_t i = 0; i < count; i++)
    printf(" %llu:%08x", (unsigned long long)self->rows[i],
           (unsigned)keel_crc32c(0, self->values + i * dim, dim * sizeof(float)));
  printf("\n");
}

static keel_status step_run(worker *self, uint64_t step) {
  const options *opts = &self->options;
  keel_random random;
  size_t count = step_rows(self, step, &random);
  size_t floats = count * (size_t)opts->dim;
  keel_status status = keel_ec_client_pull_rows(self->client, self->rows, count, self->values);
  if (status == KEEL_OK) status = keel_ec_client_pull_dense(self->client, self->dense);
  if (status != KEEL_OK) return status;
  if (opts->trace_every > 0 && step % (uint64_t)opts->trace_every == 0) trace(self, step, count);
  gradients_make(&random, floats, self->values, self->gradients);
  gradients_make(&random, (size_t)opts->dense, self->dense, self->dense_gradients);
  status = keel_ec_client_push_rows(self->client, step, self->rows, count, self->gradients);
  if (status == KEEL_OK)
    status = keel_ec_client_push_dense(self->client, step, self->dense_gradients);
  return status;
}

/* The step agreed on in the store, into self->stop_step; false while there is none. */
static bool stop_step_read(worker *self) {
  keel_store_entry *entry = NULL;
  if (keel_store_get(self->store, STOP_STEP_KEY, &entry) != KEEL_OK) return false;
  char text[24];
  snprintf(text, sizeof text, "%.*s", (int)entry->value_length, (const char *)entry->value);
  keel_store_entry_free(entry);
  return keel_parse_int(text, 0, INT64_MAX, &self->stop_step) == KEEL_OK;
}

/* Whether to leave before step. The first worker to see job/stop proposes the next step
 * (a worker may be in this one already, waiting for this worker's push), and the first
 * proposal wins: in a synchronous job no worker is more than a step ahead of another, so
 * each one reads the agreed step before it would begin it. */
static bool stop_requested(worker *self, int64_t step) {
  if (self->stop_step < 0 && !stop_step_read(self)) {
    keel_store_entry *entry = NULL;
    if (keel_store_get(self->store, "job/stop", &entry) != KEEL_OK) return false;
    keel_store_entry_free(entry);
    char text[24];
    int length = snprintf(text, sizeof text, "%lld", (long long)(step + 1));
    keel_status status =
        keel_store_cas(self->store, STOP_STEP_KEY, 0, text, (size_t)length, 0, NULL);
    if (status != KEEL_OK && !stop_step_read(self)) return false;
    if (status == KEEL_OK) self->stop_step = step + 1;
  }
  return self->stop_step >= 0 && step >= self->stop_step;
}

static void pause_ms(int64_t milliseconds) {
  struct timespec pause = {(time_t)(milliseconds / 1000), (long)(milliseconds % 1000) * 1000000};
  nanosleep(&pause, NULL);
}

/* Every worker sets the same initial dense block (the first call wins): whichever pulls
 * first, it reads these values, so the run does not depend on which worker came first. */
static keel_status dense_initialize(worker *self) {
  for (int64_t i = 0; i < self->options.dense; i++) self->dense[i] = (float)i / 64.0f - 0.25f;
  return keel_ec_client_init_dense(self->client, self->dense);
}

/* The tables' shape and optimizer; the servers and the code come from KEEL_EC_*. */
static keel_status client_open(worker *self) {
  keel_ec_config tables = {
      .dim = (int)self->options.dim,
      .total_rows = (uint64_t)self->options.rows,
      .dense_count = (uint64_t)self->options.dense,
      /* On servers 0 and 1, as examples/dlrm has it: any one server may be lost and replaced. */
      .replicate_dense = true,
      /* With r >= 2, a server lost while it sends a change to its parity holders would leave
       * them disagreeing without it, and a second loss would decode wrong rows (finding 46). */
      .two_phase_commit = self->options.two_phase_commit != 0,
      .seed = (uint64_t)self->options.seed,
      .init_scale = 0.1f,
  };
  keel_status status = keel_ec_optimizer_init(KEEL_EC_ADAGRAD, 0.05f, &tables.optimizer);
  if (status == KEEL_OK) status = keel_ec_client_open_env(&tables, (int)self->rank, &self->client);
  return status;
}

/* Rank and world as keel run set them, and a store client to hear job/stop by. */
static keel_status identity_read(worker *self) {
  int64_t uid = 0, first_uid = 0;
  keel_auth auth;
  const char *endpoint = getenv("KEEL_STORE");
  keel_status status = endpoint != NULL ? KEEL_OK : KEEL_ENOTFOUND;
  if (status == KEEL_OK) status = keel_env_int("KEEL_UID", 0, INT32_MAX, &uid);
  if (status == KEEL_OK) status = keel_env_int("KEEL_FIRST_UID", 0, INT32_MAX, &first_uid);
  if (status == KEEL_OK) status = keel_env_int("KEEL_WORLD", 1, INT32_MAX, &self->world);
  if (status == KEEL_OK) status = keel_auth_from_env(&auth);
  if (status == KEEL_OK)
    status =
        keel_store_connect(endpoint, &auth, keel_deadline_after_ns(STORE_CONNECT_NS), &self->store);
  self->rank = uid - first_uid;
  return status;
}

/* Worker 0's events: progress after each step, finish (with the model's crc) at the end. */
static void report(worker *self, const char *event, int64_t step, uint32_t crc) {
  if (self->rank != 0) return;
  char fields[160];
  int length = snprintf(fields, sizeof fields, "\"step\":%lld,\"world\":%lld", (long long)step,
                        (long long)self->world);
  if (strcmp(event, "finish") == 0)
    snprintf(fields + length, sizeof fields - (size_t)length,
             ",\"shard\":0,\"state_crc32c\":\"%08x\"", (unsigned)crc);
  keel_reporter_event(self->reporter, 0, event, fields);
}

static int train(worker *self) {
  keel_status status = dense_initialize(self);
  for (int64_t step = 0; step < self->options.steps && status == KEEL_OK; step++) {
    if (stop_requested(self, step)) return KEEL_EXIT_STOPPED;
    status = step_run(self, (uint64_t)step);
    if (status != KEEL_OK) break;
    printf("progress step %lld rank %lld\n", (long long)step, (long long)self->rank);
    fflush(stdout);
    report(self, "progress", step + 1, 0); /* no crc: only finish carries one */
    keel_reporter_waits_late(self->reporter, (int)self->rank);
    if (self->options.step_ms > 0) pause_ms(self->options.step_ms);
  }
  uint32_t crc = 0;
  uint64_t inconsistent = 0;
  if (status == KEEL_OK && self->rank == 0) status = keel_ec_client_checksum(self->client, &crc);
  /* A model other than the failure-free run's says little by itself: the scrub tells a parity
   * that disagrees with its rows (a change folded at one holder and not another) from rows
   * that are wrong with their parity (a step applied twice or missed). */
  if (status == KEEL_OK && self->rank == 0)
    status = keel_ec_client_verify(self->client, &inconsistent);
  if (status != KEEL_OK) {
    fprintf(stderr, "ec_train rank %lld: %s\n", (long long)self->rank, keel_strerror(status));
    return 1;
  }
  if (self->rank == 0) {
    printf("params-crc32c %08x lost-servers 0x%llx\n", (unsigned)crc,
           (unsigned long long)keel_ec_client_lost(self->client));
    printf("parity-inconsistent-groups %llu\n", (unsigned long long)inconsistent);
    fflush(stdout);
    report(self, "finish", self->options.steps, crc);
  }
  if (inconsistent > 0) {
    fprintf(stderr, "ec_train: the parity of %llu groups is not the code of their rows\n",
            (unsigned long long)inconsistent);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  worker *self = calloc(1, sizeof *self);
  if (self == NULL) return 1;
  self->stop_step = -1;
  int exit_code = 2;
  if (parse_options(argc, argv, &self->options) != 0) goto free_worker;
  exit_code = 1;
  keel_status status = keel_reporter_open(&self->reporter);
  if (status == KEEL_OK) status = identity_read(self);
  if (status != KEEL_OK) {
    fprintf(stderr, "ec_train: run me with keel run --servers S --ec k=K,r=R: %s\n",
            keel_strerror(status));
    goto close_store;
  }
  status = client_open(self);
  if (status != KEEL_OK) {
    fprintf(stderr, "ec_train rank %lld: no parameter servers: %s\n", (long long)self->rank,
            keel_strerror(status));
    goto close_store;
  }
  exit_code = train(self);
  keel_ec_client_close(self->client);
close_store:
  keel_store_close(self->store);
  keel_reporter_close(self->reporter);
free_worker:
  free(self);
  return exit_code;
}
