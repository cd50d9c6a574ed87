/* The DLRM forward and backward passes of model.h. Per sample, feature 0 is the bottom
 * output and feature 1 + t the bag of table t; the interaction lists z_i.z_j for i = 1 ..
 * T and j < i (the reference implementation's order, no self products), after the bottom
 * output in the top MLP's input. Sums run in sample order, so the gradients are the same
 * bits on every run. */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

struct dlrm_model {
  dlrm_shape shape;
  size_t max_batch;
  size_t pairs;       /* (T + 1) T / 2 */
  size_t top_width;   /* dim + pairs: the top MLP's input */
  size_t dense_count; /* both MLPs' parameters */
  dlrm_mlp bottom, top;
  float *bags;            /* max_batch x T x dim */
  float *top_input;       /* max_batch x top_width */
  float *logit_error;     /* max_batch */
  float *top_input_error; /* max_batch x top_width */
  float *bottom_error;    /* max_batch x dim */
  float *bag_error;       /* T x dim: one sample's */
  const float **features; /* T + 1: one sample's vectors */
  float **feature_errors; /* T + 1 */
};

void dlrm_model_destroy(dlrm_model *model) {
  if (model == NULL) return;
  free(model->feature_errors);
  free(model->features);
  free(model->bag_error);
  free(model->bottom_error);
  free(model->top_input_error);
  free(model->logit_error);
  free(model->top_input);
  free(model->bags);
  dlrm_mlp_release(&model->top);
  dlrm_mlp_release(&model->bottom);
  free(model);
}

static bool shape_valid(const dlrm_shape *shape) {
  if (shape->table_count == 0 || shape->table_count > DLRM_MAX_TABLES || shape->hotness == 0)
    return false;
  if (shape->bottom_count == 0 || shape->bottom_count > DLRM_MAX_LAYERS) return false;
  if (shape->top_count == 0 || shape->top_count > DLRM_MAX_LAYERS) return false;
  return shape->bottom[shape->bottom_count - 1] == shape->dim &&
         shape->top[shape->top_count - 1] == 1;
}

static keel_status workspaces_allocate(dlrm_model *model) {
  size_t batch = model->max_batch, tables = model->shape.table_count, dim = model->shape.dim;
  model->bags = calloc(batch * tables * dim, sizeof(float));
  model->top_input = calloc(batch * model->top_width, sizeof(float));
  model->logit_error = calloc(batch, sizeof(float));
  model->top_input_error = calloc(batch * model->top_width, sizeof(float));
  model->bottom_error = calloc(batch * dim, sizeof(float));
  model->bag_error = calloc(tables * dim, sizeof(float));
  model->features = calloc(tables + 1, sizeof(float *));
  model->feature_errors = calloc(tables + 1, sizeof(float *));
  bool allocated = model->bags && model->top_input && model->logit_error &&
                   model->top_input_error && model->bottom_error && model->bag_error &&
                   model->features && model->feature_errors;
  return allocated ? KEEL_OK : KEEL_ENOMEM;
}

keel_status dlrm_model_create(const dlrm_shape *shape, size_t max_batch, dlrm_model **model_p) {
  if (!shape_valid(shape) || max_batch == 0) return KEEL_EINVAL;
  dlrm_model *model = calloc(1, sizeof *model);
  if (model == NULL) return KEEL_ENOMEM;
  model->shape = *shape;
  model->max_batch = max_batch;
  model->pairs = (shape->table_count + 1) * shape->table_count / 2;
  model->top_width = shape->dim + model->pairs;
  keel_status status = dlrm_mlp_init(&model->bottom, shape->dense_features, shape->bottom,
                                     shape->bottom_count, true, 0, 0, max_batch);
  if (status == KEEL_OK)
    status = dlrm_mlp_init(&model->top, model->top_width, shape->top, shape->top_count, false,
                           model->bottom.end_offset, shape->bottom_count, max_batch);
  if (status == KEEL_OK) status = workspaces_allocate(model);
  if (status != KEEL_OK) {
    dlrm_model_destroy(model);
    return status;
  }
  model->dense_count = model->top.end_offset;
  *model_p = model;
  return KEEL_OK;
}

size_t dlrm_model_dense_count(const dlrm_model *model) { return model->dense_count; }

void dlrm_model_dense_initial(const dlrm_model *model, uint64_t seed, float *parameters) {
  dlrm_mlp_initial(&model->bottom, seed, parameters);
  dlrm_mlp_initial(&model->top, seed, parameters);
}

static float dot(const float *left, const float *right, size_t dim) {
  float sum = 0.0f;
  for (size_t c = 0; c < dim; c++) sum += left[c] * right[c];
  return sum;
}

/* Adds each sample's rows into its T bags. */
static void bags_sum(dlrm_model *model, const dlrm_batch *batch) {
  size_t dim = model->shape.dim, hotness = model->shape.hotness;
  size_t bag_count = batch->count * model->shape.table_count;
  for (size_t bag = 0; bag < bag_count; bag++) {
    float *sum = model->bags + bag * dim;
    memset(sum, 0, dim * sizeof(float));
    for (size_t slot = 0; slot < hotness; slot++) {
      const float *row = batch->row_values + (size_t)batch->lookups[bag * hotness + slot] * dim;
      for (size_t c = 0; c < dim; c++) sum[c] += row[c];
    }
  }
}

/* Points model->features at sample's bottom output and bags. */
static void features_point(dlrm_model *model, const float *bottom_output, size_t sample) {
  size_t dim = model->shape.dim, tables = model->shape.table_count;
  model->features[0] = bottom_output + sample * dim;
  for (size_t t = 0; t < tables; t++)
    model->features[1 + t] = model->bags + (sample * tables + t) * dim;
}

static void interact(dlrm_model *model, const float *bottom_output, size_t count) {
  size_t dim = model->shape.dim, features = model->shape.table_count + 1;
  for (size_t sample = 0; sample < count; sample++) {
    features_point(model, bottom_output, sample);
    float *input = model->top_input + sample * model->top_width;
    memcpy(input, model->features[0], dim * sizeof(float));
    float *products = input + dim;
    for (size_t i = 1; i < features; i++) {
      for (size_t j = 0; j < i; j++) *products++ = dot(model->features[i], model->features[j], dim);
    }
  }
}

/* The logits of the batch, in the top MLP's output. */
static const float *forward(dlrm_model *model, const float *parameters, const dlrm_batch *batch) {
  const float *bottom_output =
      dlrm_mlp_forward(&model->bottom, parameters, batch->dense, batch->count);
  bags_sum(model, batch);
  interact(model, bottom_output, batch->count);
  return dlrm_mlp_forward(&model->top, parameters, model->top_input, batch->count);
}

keel_status dlrm_model_forward(dlrm_model *model, const float *parameters, const dlrm_batch *batch,
                               float *logits) {
  if (batch->count == 0 || batch->count > model->max_batch) return KEEL_EINVAL;
  memcpy(logits, forward(model, parameters, batch), batch->count * sizeof(float));
  return KEEL_OK;
}

/* The gradient of z_i.z_j is g z_j for z_i and g z_i for z_j. */
static void interact_backward(dlrm_model *model, size_t sample) {
  size_t dim = model->shape.dim, features = model->shape.table_count + 1;
  const float *input_error = model->top_input_error + sample * model->top_width;
  model->feature_errors[0] = model->bottom_error + sample * dim;
  for (size_t t = 0; t < model->shape.table_count; t++)
    model->feature_errors[1 + t] = model->bag_error + t * dim;
  memcpy(model->feature_errors[0], input_error, dim * sizeof(float));
  memset(model->bag_error, 0, model->shape.table_count * dim * sizeof(float));
  const float *product_errors = input_error + dim;
  for (size_t i = 1; i < features; i++) {
    for (size_t j = 0; j < i; j++) {
      float error = *product_errors++;
      float *error_i = model->feature_errors[i], *error_j = model->feature_errors[j];
      const float *z_i = model->features[i], *z_j = model->features[j];
      for (size_t c = 0; c < dim; c++) {
        error_i[c] += error * z_j[c];
        error_j[c] += error * z_i[c];
      }
    }
  }
}

/* Every row of a bag gets the bag's gradient, added up over its occurrences. */
static void bags_backward(dlrm_model *model, dlrm_batch *batch, size_t sample) {
  size_t dim = model->shape.dim, hotness = model->shape.hotness;
  for (size_t t = 0; t < model->shape.table_count; t++) {
    const float *error = model->bag_error + t * dim;
    const uint32_t *lookups = batch->lookups + (sample * model->shape.table_count + t) * hotness;
    for (size_t slot = 0; slot < hotness; slot++) {
      float *gradient = batch->row_gradients + (size_t)lookups[slot] * dim;
      for (size_t c = 0; c < dim; c++) gradient[c] += error[c];
    }
  }
}

/* The mean loss, and at each logit the gradient of scale x the summed loss:
 * (sigmoid(x) - y) x scale. */
static double loss_and_logit_error(dlrm_model *model, const float *logits, const float *labels,
                                   size_t count, float scale) {
  double total = 0.0;
  for (size_t i = 0; i < count; i++) {
    double logit = (double)logits[i];
    total += dlrm_logistic_loss(logit, (double)labels[i]);
    double probability = 1.0 / (1.0 + exp(-logit));
    model->logit_error[i] = (float)((probability - (double)labels[i]) * (double)scale);
  }
  return total / (double)count;
}

keel_status dlrm_model_gradient(dlrm_model *model, const float *parameters, dlrm_batch *batch,
                                float scale, float *dense_gradient, double *loss_p) {
  size_t count = batch->count;
  if (count == 0 || count > model->max_batch) return KEEL_EINVAL;
  const float *logits = forward(model, parameters, batch);
  double loss = loss_and_logit_error(model, logits, batch->labels, count, scale);
  dlrm_mlp_backward(&model->top, parameters, model->top_input, model->logit_error, count,
                    dense_gradient, model->top_input_error);
  const float *bottom_output = model->bottom.outputs[model->bottom.layer_count];
  memset(batch->row_gradients, 0, batch->row_count * model->shape.dim * sizeof(float));
  for (size_t sample = 0; sample < count; sample++) {
    features_point(model, bottom_output, sample);
    interact_backward(model, sample);
    bags_backward(model, batch, sample);
  }
  dlrm_mlp_backward(&model->bottom, parameters, batch->dense, model->bottom_error, count,
                    dense_gradient, NULL);
  *loss_p = loss;
  return KEEL_OK;
}
