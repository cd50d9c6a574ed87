/* One DLRM worker (trainer.h): setup, the step (make the batch, pull, forward and backward,
 * push), progress, and the held-out evaluation with the figures the tests compare. */
#include "trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRESS_EVERY 100

typedef struct backend_entry {
  const char *name;
  dlrm_params_create_fn create;
} backend_entry;

/* The parameter backends --backend chooses from. */
static const backend_entry backends[] = {
    {"local", dlrm_params_local_create},
    {"servers", dlrm_params_servers_create},
};
#define BACKEND_COUNT (sizeof backends / sizeof backends[0])

static int fail(const char *what, keel_status status) {
  fprintf(stderr, DLRM_PROGRAM ": %s: %s\n", what, keel_strerror(status));
  return status == KEEL_EINVAL ? 2 : 1;
}

static int refuse(const char *message) {
  fprintf(stderr, DLRM_PROGRAM ": %s\n", message);
  return 2;
}

void dlrm_trainer_release(dlrm_trainer *trainer) {
  free(trainer->truth);
  free(trainer->scored);
  free(trainer->logits);
  free(trainer->dense_gradient);
  free(trainer->dense_parameters);
  dlrm_batch_release(&trainer->batch);
  if (trainer->params.ops != NULL) trainer->params.ops->destroy(trainer->params.self);
  dlrm_model_destroy(trainer->model);
  dlrm_data_destroy(trainer->data);
  memset(trainer, 0, sizeof *trainer);
}

static const backend_entry *backend_find(const char *name) {
  for (size_t i = 0; i < BACKEND_COUNT; i++) {
    if (strcmp(backends[i].name, name) == 0) return &backends[i];
  }
  return NULL;
}

static int backend_unknown(const char *name) {
  fprintf(stderr, DLRM_PROGRAM ": --backend: '%s' is not one of:", name);
  for (size_t i = 0; i < BACKEND_COUNT; i++) fprintf(stderr, " %s", backends[i].name);
  fprintf(stderr, "\n");
  return 2;
}

/* Refuses what no part below could serve, before anything is allocated. */
static int placement_check(const dlrm_trainer *trainer) {
  const dlrm_options *options = trainer->options;
  if (backend_find(options->backend) == NULL) return backend_unknown(options->backend);
  if (trainer->world > 1 && strcmp(options->backend, "local") == 0)
    return refuse("the local backend keeps the parameters in one process: run one worker");
  uint64_t global_batch = (uint64_t)options->batch * (uint64_t)trainer->world;
  if (options->steps > DLRM_EVAL_FIRST_SAMPLE / global_batch)
    return refuse("--steps x the global batch reaches the held-out samples' numbers");
  return 0;
}

static int data_setup(dlrm_trainer *trainer) {
  const dlrm_options *options = trainer->options;
  trainer->table_offsets[0] = 0;
  for (size_t t = 0; t < options->table_count; t++)
    trainer->table_offsets[t + 1] = trainer->table_offsets[t] + options->table_rows[t];
  dlrm_data_config config = {
      .seed = options->data_seed,
      .table_count = options->table_count,
      .table_rows = options->table_rows,
      .dense_features = options->dense_features,
      .hotness = options->hotness,
      .zipf_exponent = options->zipf_exponent,
  };
  keel_status status = dlrm_data_create(&config, &trainer->data);
  return status == KEEL_OK ? 0 : fail("the synthetic data", status);
}

static int model_setup(dlrm_trainer *trainer) {
  const dlrm_options *options = trainer->options;
  dlrm_shape shape = {
      .table_count = options->table_count,
      .dim = options->dim,
      .dense_features = options->dense_features,
      .hotness = options->hotness,
      .bottom_count = options->bottom_count,
      .top_count = options->top_count,
  };
  memcpy(shape.bottom, options->bottom, sizeof shape.bottom);
  memcpy(shape.top, options->top, sizeof shape.top);
  keel_status status = dlrm_model_create(&shape, options->batch, &trainer->model);
  /* The options' bounds leave one way to an invalid shape: the top MLP's input, dim + T (T +
   * 1) / 2 wide, makes a layer of more weights than one row block holds. */
  if (status == KEEL_EINVAL)
    return refuse("the top MLP's first layer has more than 2^24 weights: use fewer tables");
  if (status != KEEL_OK) return fail("the model", status);
  trainer->dense_count = dlrm_model_dense_count(trainer->model);
  /* The dense parameters are one row block on the servers. */
  if (trainer->dense_count > KEEL_EC_ROW_MAX_DIM)
    return refuse("the MLPs have more than 2^24 parameters: use fewer tables or narrower layers");
  size_t capacity = options->batch, samples = options->eval_samples;
  trainer->dense_parameters = calloc(trainer->dense_count, sizeof(float));
  trainer->dense_gradient = calloc(trainer->dense_count, sizeof(float));
  trainer->logits = calloc(capacity, sizeof(float));
  trainer->scored = calloc(samples ? samples : 1, sizeof(dlrm_scored));
  trainer->truth = calloc(samples ? samples : 1, sizeof(dlrm_scored));
  if (!trainer->dense_parameters || !trainer->dense_gradient || !trainer->logits ||
      !trainer->scored || !trainer->truth)
    return fail("the model's buffers", KEEL_ENOMEM);
  status = dlrm_batch_init(&trainer->batch, capacity, options->table_count, options->hotness,
                           options->dense_features, options->dim);
  return status == KEEL_OK ? 0 : fail("the batch", status);
}

/* Row blocks start as keel_ec_row_initial(seed, row, dim, 1 / sqrt(dim)): each row's norm
 * near 1/sqrt(3) whatever dim, so the dot products start small but not vanishing. */
static int params_setup(dlrm_trainer *trainer) {
  const dlrm_options *options = trainer->options;
  dlrm_params_config config = {
      .total_rows = trainer->table_offsets[options->table_count],
      .dim = (int)options->dim,
      .seed = options->seed,
      .init_scale = 1.0f / sqrtf((float)options->dim),
      .dense_count = (int)trainer->dense_count,
      .dense_initial = trainer->dense_parameters,
      .worker = trainer->rank,
      .workers = trainer->world,
      .synchronous = options->sync,
      .without_parity = options->without_parity,
      .two_phase_commit = options->two_phase_commit,
  };
  keel_status status =
      keel_ec_optimizer_init(options->optimizer, options->learning_rate, &trainer->optimizer);
  if (status != KEEL_OK) return fail("the optimizer", status);
  config.optimizer = trainer->optimizer;
  dlrm_model_dense_initial(trainer->model, options->seed, trainer->dense_parameters);
  status = backend_find(options->backend)->create(&config, &trainer->params);
  return status == KEEL_OK ? 0 : fail("the parameter backend", status);
}

static void describe(const dlrm_trainer *trainer) {
  const dlrm_options *options = trainer->options;
  size_t row_bytes = 0;
  keel_ec_row_block_bytes(&trainer->optimizer, (int)options->dim, &row_bytes);
  uint64_t rows = trainer->table_offsets[options->table_count];
  fprintf(stderr,
          DLRM_PROGRAM
          ": %zu tables, %llu rows of %zu (%.1f MiB of row blocks), %zu dense "
          "parameters, %s at %g, batch %zu x %d workers\n",
          options->table_count, (unsigned long long)rows, options->dim,
          (double)rows * (double)row_bytes / 1048576.0, trainer->dense_count,
          dlrm_optimizer_name(options->optimizer), (double)options->learning_rate, options->batch,
          trainer->world);
}

int dlrm_trainer_setup(dlrm_trainer *trainer, const dlrm_options *options, int rank, int world) {
  memset(trainer, 0, sizeof *trainer);
  trainer->options = options;
  trainer->rank = rank;
  trainer->world = world;
  int code = placement_check(trainer);
  if (code == 0) code = data_setup(trainer);
  if (code == 0) code = model_setup(trainer);
  if (code == 0) code = params_setup(trainer);
  if (code == 0 && !options->quiet) describe(trainer);
  return code;
}

keel_status dlrm_trainer_load(dlrm_trainer *trainer, uint64_t first, size_t count) {
  dlrm_batch *batch = &trainer->batch;
  dlrm_batch_fill(batch, trainer->data, trainer->table_offsets, first, count);
  const dlrm_params_ops *ops = trainer->params.ops;
  keel_status status = ops->pull_dense(trainer->params.self, trainer->dense_parameters);
  if (status == KEEL_OK)
    status = ops->pull_rows(trainer->params.self, batch->rows, batch->row_count, batch->row_values);
  if (status != KEEL_OK) fail("pull", status);
  return status;
}

double dlrm_trainer_batch_loss(dlrm_trainer *trainer) {
  const dlrm_batch *batch = &trainer->batch;
  dlrm_model_forward(trainer->model, trainer->dense_parameters, batch, trainer->logits);
  double total = 0.0;
  for (size_t i = 0; i < batch->count; i++)
    total += dlrm_logistic_loss((double)trainer->logits[i], (double)batch->labels[i]);
  return total / (double)batch->count;
}

static keel_status train_step(dlrm_trainer *trainer, uint64_t step, double *loss_p) {
  const dlrm_options *options = trainer->options;
  uint64_t first =
      step * options->batch * (uint64_t)trainer->world + (uint64_t)trainer->rank * options->batch;
  keel_status status = dlrm_trainer_load(trainer, first, options->batch);
  if (status != KEEL_OK) return status;
  dlrm_batch *batch = &trainer->batch;
  /* Synchronous servers add the workers' gradients: each scaled by the global batch, they
   * add up to its mean, the step one worker would take over the whole global batch. */
  size_t scaled_count = options->batch * (options->sync ? (size_t)trainer->world : 1);
  status = dlrm_model_gradient(trainer->model, trainer->dense_parameters, batch,
                               1.0f / (float)scaled_count, trainer->dense_gradient, loss_p);
  const dlrm_params_ops *ops = trainer->params.ops;
  if (status == KEEL_OK)
    status = ops->push_rows(trainer->params.self, step, batch->rows, batch->row_count,
                            batch->row_gradients);
  if (status == KEEL_OK)
    status = ops->push_dense(trainer->params.self, step, trainer->dense_gradient);
  if (status != KEEL_OK) fail("push", status);
  return status;
}

typedef struct evaluation {
  double log_loss, auc, base_log_loss, bayes_log_loss, bayes_auc, click_rate;
} evaluation;

/* Scores held-out samples DLRM_EVAL_FIRST_SAMPLE + j, j < eval_samples, in batches. */
static keel_status evaluate(dlrm_trainer *trainer, evaluation *result_p) {
  uint64_t samples = trainer->options->eval_samples;
  size_t capacity = trainer->batch.capacity;
  double loss = 0.0, bayes_loss = 0.0, clicks = 0.0;
  for (uint64_t first = 0; first < samples; first += capacity) {
    size_t count = samples - first < capacity ? (size_t)(samples - first) : capacity;
    keel_status status = dlrm_trainer_load(trainer, DLRM_EVAL_FIRST_SAMPLE + first, count);
    if (status != KEEL_OK) return status;
    dlrm_model_forward(trainer->model, trainer->dense_parameters, &trainer->batch, trainer->logits);
    for (size_t i = 0; i < count; i++) {
      double label = (double)trainer->batch.labels[i], truth = trainer->batch.true_logits[i];
      loss += dlrm_logistic_loss((double)trainer->logits[i], label);
      bayes_loss += dlrm_logistic_loss(truth, label);
      clicks += label;
      trainer->scored[first + i] = (dlrm_scored){(double)trainer->logits[i], (float)label};
      trainer->truth[first + i] = (dlrm_scored){truth, (float)label};
    }
  }
  double count = (double)samples;
  *result_p = (evaluation){
      .log_loss = loss / count,
      .auc = dlrm_auc(trainer->scored, samples),
      .base_log_loss = dlrm_base_log_loss(clicks / count),
      .bayes_log_loss = bayes_loss / count,
      .bayes_auc = dlrm_auc(trainer->truth, samples),
      .click_rate = clicks / count,
  };
  return KEEL_OK;
}

static void print_evaluation(FILE *stream, const char *prefix, const evaluation *result,
                             uint64_t samples) {
  fprintf(stream,
          "%seval log-loss %.4f auc %.4f base-log-loss %.4f bayes-log-loss %.4f bayes-auc %.4f "
          "click-rate %.4f samples %llu\n",
          prefix, result->log_loss, result->auc, result->base_log_loss, result->bayes_log_loss,
          result->bayes_auc, result->click_rate, (unsigned long long)samples);
  fflush(stream);
}

/* Progress and timing of the training loop; evaluation time is kept out of the rates. */
typedef struct progress {
  int64_t started_ns, evaluating_ns;
  double loss_sum;
  uint64_t loss_steps;
} progress;

static double training_seconds(const progress *state) {
  return (double)(keel_now_ns() - state->started_ns - state->evaluating_ns) * 1e-9;
}

static void progress_print(const dlrm_trainer *trainer, progress *state, uint64_t done) {
  double seconds = training_seconds(state);
  double rate = seconds > 0.0 ? (double)done / seconds : 0.0;
  fprintf(stderr, "step %llu/%llu train log-loss %.4f %.1f steps/s %.0f samples/s\n",
          (unsigned long long)done, (unsigned long long)trainer->options->steps,
          state->loss_sum / (double)state->loss_steps, rate,
          rate * (double)trainer->options->batch);
  state->loss_sum = 0.0;
  state->loss_steps = 0;
}

static int evaluate_during(dlrm_trainer *trainer, progress *state, uint64_t done) {
  int64_t begun = keel_now_ns();
  evaluation result;
  if (evaluate(trainer, &result) != KEEL_OK) return 1;
  char prefix[48];
  snprintf(prefix, sizeof prefix, "step %llu ", (unsigned long long)done);
  print_evaluation(stderr, prefix, &result, trainer->options->eval_samples);
  state->evaluating_ns += keel_now_ns() - begun;
  return 0;
}

static int finish(dlrm_trainer *trainer) {
  const dlrm_options *options = trainer->options;
  if (options->eval_samples > 0) {
    evaluation result;
    if (evaluate(trainer, &result) != KEEL_OK) return 1;
    print_evaluation(stdout, "", &result, options->eval_samples);
  }
  uint32_t crc = 0;
  keel_status status = trainer->params.ops->checksum(trainer->params.self, &crc);
  if (status != KEEL_OK) return fail("checksum", status);
  printf("params-crc32c %08x\n", crc);
  fflush(stdout);
  return 0;
}

int dlrm_trainer_run(dlrm_trainer *trainer) {
  const dlrm_options *options = trainer->options;
  progress state = {.started_ns = keel_now_ns()};
  for (uint64_t step = 0; step < options->steps; step++) {
    double loss = 0.0;
    if (train_step(trainer, step, &loss) != KEEL_OK) return 1;
    state.loss_sum += loss;
    state.loss_steps++;
    uint64_t done = step + 1;
    if (!options->quiet && (done % PROGRESS_EVERY == 0 || done == options->steps))
      progress_print(trainer, &state, done);
    bool evaluation_due = options->eval_every > 0 && done % options->eval_every == 0;
    if (evaluation_due && options->eval_samples > 0 && done < options->steps &&
        evaluate_during(trainer, &state, done) != 0)
      return 1;
  }
  if (!options->quiet && options->steps > 0)
    fprintf(stderr, DLRM_PROGRAM ": trained %llu steps in %.3f s\n",
            (unsigned long long)options->steps, training_seconds(&state));
  return finish(trainer);
}
