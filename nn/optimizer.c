/* SGD with momentum and Adam over flat float arrays. Their state is kept in a few plain
 * buffers named for keel_state_register, so a newcomer that receives them continues the
 * exact update sequence of the rank it replaces. */
#include <math.h>
#include <stdlib.h>

#include "nn.h"

struct nn_optimizer {
  nn_optimizer_config config;
  size_t parameter_count;
  float *velocity;                     /* SGD */
  float *first_moment, *second_moment; /* Adam */
  uint64_t step;                       /* Adam: updates applied so far, for bias correction */
};

nn_optimizer_config nn_optimizer_defaults(nn_optimizer_kind kind, float learning_rate) {
  nn_optimizer_config config = {
      .kind = kind,
      .learning_rate = learning_rate,
      .momentum = 0.9f,
      .beta1 = 0.9f,
      .beta2 = 0.999f,
      .epsilon = 1e-8f,
  };
  return config;
}

static bool fraction_valid(float value) { return value >= 0.0f && value < 1.0f; }

void nn_optimizer_destroy(nn_optimizer *optimizer) {
  if (optimizer == NULL) return;
  free(optimizer->velocity);
  free(optimizer->first_moment);
  free(optimizer->second_moment);
  free(optimizer);
}

keel_status nn_optimizer_create(const nn_optimizer_config *config, size_t parameter_count,
                                nn_optimizer **optimizer_p) {
  if (!(config->learning_rate > 0.0f) || !isfinite(config->learning_rate)) return KEEL_EINVAL;
  if (parameter_count > SIZE_MAX / sizeof(float)) return KEEL_EINVAL;
  switch (config->kind) {
    case NN_OPTIMIZER_SGD:
      if (!fraction_valid(config->momentum)) return KEEL_EINVAL;
      break;
    case NN_OPTIMIZER_ADAM:
      if (!fraction_valid(config->beta1) || !fraction_valid(config->beta2) ||
          !(config->epsilon > 0.0f))
        return KEEL_EINVAL;
      break;
    default:
      return KEEL_EINVAL;
  }
  nn_optimizer *optimizer = calloc(1, sizeof *optimizer);
  if (optimizer == NULL) return KEEL_ENOMEM;
  optimizer->config = *config;
  optimizer->parameter_count = parameter_count;
  /* One extra element keeps calloc from returning NULL for an empty model. */
  bool allocated;
  if (config->kind == NN_OPTIMIZER_SGD) {
    optimizer->velocity = calloc(parameter_count + 1, sizeof(float));
    allocated = optimizer->velocity != NULL;
  } else {
    optimizer->first_moment = calloc(parameter_count + 1, sizeof(float));
    optimizer->second_moment = calloc(parameter_count + 1, sizeof(float));
    allocated = optimizer->first_moment != NULL && optimizer->second_moment != NULL;
  }
  if (!allocated) {
    nn_optimizer_destroy(optimizer);
    return KEEL_ENOMEM;
  }
  *optimizer_p = optimizer;
  return KEEL_OK;
}

keel_status nn_optimizer_set_learning_rate(nn_optimizer *optimizer, float learning_rate) {
  if (!(learning_rate > 0.0f) || !isfinite(learning_rate)) return KEEL_EINVAL;
  optimizer->config.learning_rate = learning_rate;
  return KEEL_OK;
}

static void sgd_step(nn_optimizer *optimizer, float *parameters, const float *gradient) {
  float rate = optimizer->config.learning_rate, momentum = optimizer->config.momentum;
  float *velocity = optimizer->velocity;
  for (size_t i = 0; i < optimizer->parameter_count; i++) {
    velocity[i] = momentum * velocity[i] + gradient[i];
    parameters[i] -= rate * velocity[i];
  }
}

static void adam_step(nn_optimizer *optimizer, float *parameters, const float *gradient) {
  const nn_optimizer_config *config = &optimizer->config;
  optimizer->step++;
  /* The bias corrections are per step, not per element: computed once in double. */
  double first_correction = 1.0 - pow((double)config->beta1, (double)optimizer->step);
  double second_correction = 1.0 - pow((double)config->beta2, (double)optimizer->step);
  float step_size = (float)((double)config->learning_rate / first_correction);
  float second_scale = (float)(1.0 / sqrt(second_correction));
  float beta1 = config->beta1, beta2 = config->beta2, epsilon = config->epsilon;
  float *first = optimizer->first_moment, *second = optimizer->second_moment;
  for (size_t i = 0; i < optimizer->parameter_count; i++) {
    float slope = gradient[i];
    first[i] = beta1 * first[i] + (1.0f - beta1) * slope;
    second[i] = beta2 * second[i] + (1.0f - beta2) * slope * slope;
    parameters[i] -= step_size * first[i] / (sqrtf(second[i]) * second_scale + epsilon);
  }
}

void nn_optimizer_step(nn_optimizer *optimizer, float *parameters, const float *gradient) {
  if (optimizer->config.kind == NN_OPTIMIZER_SGD) {
    sgd_step(optimizer, parameters, gradient);
  } else {
    adam_step(optimizer, parameters, gradient);
  }
}

size_t nn_optimizer_state_count(const nn_optimizer *optimizer) {
  return optimizer->config.kind == NN_OPTIMIZER_SGD ? 1 : 3;
}

nn_state_buffer nn_optimizer_state(nn_optimizer *optimizer, size_t index) {
  size_t array_bytes = optimizer->parameter_count * sizeof(float);
  nn_state_buffer none = {NULL, NULL, 0};
  if (optimizer->config.kind == NN_OPTIMIZER_SGD) {
    if (index == 0)
      return (nn_state_buffer){"optimizer.velocity", optimizer->velocity, array_bytes};
    return none;
  }
  switch (index) {
    case 0:
      return (nn_state_buffer){"optimizer.m", optimizer->first_moment, array_bytes};
    case 1:
      return (nn_state_buffer){"optimizer.v", optimizer->second_moment, array_bytes};
    case 2:
      return (nn_state_buffer){"optimizer.step", &optimizer->step, sizeof optimizer->step};
    default:
      return none;
  }
}
