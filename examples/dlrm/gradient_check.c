/* --check-gradients: the model's gradient of one batch against central finite differences
 * of its loss, for every dense parameter and every value of every row the batch uses, so
 * that a wrong backward pass (or a row counted once where it occurs twice) shows. Meant for
 * tiny models: it runs two forward passes per parameter. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

/* Float forward passes carry about 1e-7 relative noise; a step of 1e-3 keeps its effect on
 * the quotient near 1e-4, well under the tolerance, while curvature stays small. */
#define STEP 1e-3f
#define ABSOLUTE_TOLERANCE 2e-4
#define RELATIVE_TOLERANCE 2e-2

typedef struct check_result {
  size_t compared, failed;
  double worst; /* the largest |analytic - numeric| / (absolute + relative * |numeric|) */
} check_result;

/* The derivative of the batch loss along *value, by central differences over the steps
 * float can take there. */
static double numeric_derivative(dlrm_trainer *trainer, float *value) {
  float kept = *value, up = kept + STEP, down = kept - STEP;
  *value = up;
  double loss_up = dlrm_trainer_batch_loss(trainer);
  *value = down;
  double loss_down = dlrm_trainer_batch_loss(trainer);
  *value = kept;
  return (loss_up - loss_down) / ((double)up - (double)down);
}

static void compare(dlrm_trainer *trainer, float *values, const float *analytic, size_t count,
                    check_result *result) {
  for (size_t i = 0; i < count; i++) {
    double numeric = numeric_derivative(trainer, &values[i]);
    double allowed = ABSOLUTE_TOLERANCE + RELATIVE_TOLERANCE * fabs(numeric);
    double ratio = fabs((double)analytic[i] - numeric) / allowed;
    if (ratio > result->worst) result->worst = ratio;
    result->failed += ratio > 1.0;
    result->compared++;
  }
}

int dlrm_gradient_check(dlrm_trainer *trainer) {
  dlrm_batch *batch = &trainer->batch;
  if (dlrm_trainer_load(trainer, 0, batch->capacity) != KEEL_OK) return 1;
  double loss;
  /* The gradient of the mean loss, whose differences are taken. */
  float scale = 1.0f / (float)batch->count;
  keel_status status = dlrm_model_gradient(trainer->model, trainer->dense_parameters, batch, scale,
                                           trainer->dense_gradient, &loss);
  if (status != KEEL_OK) {
    fprintf(stderr, DLRM_PROGRAM ": gradient: %s\n", keel_strerror(status));
    return 1;
  }
  size_t row_values = batch->row_count * batch->dim;
  float *row_gradients = malloc((row_values ? row_values : 1) * sizeof(float));
  if (row_gradients == NULL) {
    fprintf(stderr, DLRM_PROGRAM ": out of memory\n");
    return 1;
  }
  /* Forward passes leave the row gradients alone, but a copy makes that no assumption. */
  memcpy(row_gradients, batch->row_gradients, row_values * sizeof(float));
  check_result dense = {0}, rows = {0};
  compare(trainer, trainer->dense_parameters, trainer->dense_gradient, trainer->dense_count,
          &dense);
  compare(trainer, batch->row_values, row_gradients, row_values, &rows);
  free(row_gradients);
  printf(
      "gradient-check loss %.6f dense %zu failed %zu worst %.3f rows %zu values %zu "
      "failed %zu worst %.3f\n",
      loss, dense.compared, dense.failed, dense.worst, batch->row_count, rows.compared, rows.failed,
      rows.worst);
  return dense.failed == 0 && rows.failed == 0 ? 0 : 1;
}
