/* The formulas of the JIT checkpointing paper, §5: wasted GPU time per GPU per unit of
 * useful time for periodic checkpoints (eqs. 1-6), user-level JIT (eq. 7) and in-process JIT
 * (eq. 8). Each policy fills the same result, term by term, so callers can show the split. */
#include <math.h>

#include "keel/model.h"
#include "model/model_internal.h"

#define SECONDS_PER_HOUR 3600.0

keel_status keel_model_params_check(const keel_model_params *params) {
  if (params == NULL) return KEEL_EINVAL;
  /* f = 0 is refused: eq. 3 gives c* = 0, an interval of infinity, and every JIT figure is 0;
   * no caller means that. `!(x >= 1)` also catches NaN. */
  if (!isfinite(params->failure_rate) || !(params->failure_rate > 0.0)) return KEEL_EINVAL;
  if (!isfinite(params->gpu_count) || !(params->gpu_count >= 1.0)) return KEEL_EINVAL;
  if (!keel__model_is_cost(params->checkpoint_cost_s) ||
      !keel__model_is_cost(params->restart_cost_s) || !keel__model_is_cost(params->minibatch_s) ||
      !keel__model_is_cost(params->jit_overhead) ||
      !keel__model_is_cost(params->inprocess_recovery_s))
    return KEEL_EINVAL;
  return KEEL_OK;
}

/* Sums the terms into w and w_f (eq. 6: wasted time W·t over total time t + W·t). */
static void result_finish(keel_model_result *result) {
  result->wasted_per_time =
      result->checkpoint_term + result->overhead_term + result->restart_term + result->redo_term;
  result->wasted_fraction = result->wasted_per_time / (1.0 + result->wasted_per_time);
}

/* The job's failure rate N·f, the factor of every recovery term. */
static double job_failure_rate(const keel_model_params *params) {
  return params->gpu_count * params->failure_rate;
}

keel_status keel_model_optimal_frequency(const keel_model_params *params, double *per_second_p) {
  if (per_second_p == NULL || keel_model_params_check(params) != KEEL_OK) return KEEL_EINVAL;
  if (!(params->checkpoint_cost_s > 0.0)) return KEEL_EINVAL;
  *per_second_p = sqrt(job_failure_rate(params) / (2.0 * params->checkpoint_cost_s));
  return KEEL_OK;
}

/* Eq. 1 over N·t at frequency c (per second); the caller has checked params and c > 0. */
static void periodic_fill(const keel_model_params *params, double frequency,
                          keel_model_result *result) {
  double rate = job_failure_rate(params);
  result->interval_s = 1.0 / frequency;
  result->checkpoints_per_hour = frequency * SECONDS_PER_HOUR;
  result->checkpoint_term = frequency * params->checkpoint_cost_s;
  result->overhead_term = 0.0;
  result->restart_term = rate * params->restart_cost_s;
  /* A failure lands on average half an interval after the last checkpoint. */
  result->redo_term = rate / (2.0 * frequency);
  result_finish(result);
}

keel_status keel_model_periodic_at(const keel_model_params *params, double interval_s,
                                   keel_model_result *result_p) {
  if (result_p == NULL || keel_model_params_check(params) != KEEL_OK) return KEEL_EINVAL;
  if (!isfinite(interval_s) || !(interval_s > 0.0)) return KEEL_EINVAL;
  keel_model_result result;
  periodic_fill(params, 1.0 / interval_s, &result);
  *result_p = result;
  return KEEL_OK;
}

keel_status keel_model_periodic_optimal(const keel_model_params *params,
                                        keel_model_result *result_p) {
  double frequency;
  if (result_p == NULL) return KEEL_EINVAL;
  keel_status status = keel_model_optimal_frequency(params, &frequency);
  if (status != KEEL_OK) return status;
  /* frequency > 0 here: f > 0, N >= 1 and o > 0 were checked. */
  keel_model_result result;
  periodic_fill(params, frequency, &result);
  *result_p = result;
  return KEEL_OK;
}

/* The part both JIT policies share: the steady-state overhead and, since the checkpoint is
 * taken at the start of the failed minibatch, half a minibatch redone per failure. */
static void jit_common(const keel_model_params *params, keel_model_result *result) {
  result->overhead_term = params->jit_overhead;
  result->redo_term = job_failure_rate(params) * params->minibatch_s / 2.0;
}

keel_status keel_model_jit_user(const keel_model_params *params, keel_model_result *result_p) {
  if (result_p == NULL || keel_model_params_check(params) != KEEL_OK) return KEEL_EINVAL;
  keel_model_result result;
  double rate = job_failure_rate(params);
  jit_common(params, &result);
  /* Eq. 7 as printed charges the on-failure save to one GPU's time (N·f·t·o over N·t). */
  result.checkpoint_term = params->failure_rate * params->checkpoint_cost_s;
  result.restart_term = rate * params->restart_cost_s;
  result.interval_s = 1.0 / rate;
  result.checkpoints_per_hour = rate * SECONDS_PER_HOUR;
  result_finish(&result);
  *result_p = result;
  return KEEL_OK;
}

keel_status keel_model_jit_inprocess(const keel_model_params *params, keel_model_result *result_p) {
  if (result_p == NULL || keel_model_params_check(params) != KEEL_OK) return KEEL_EINVAL;
  keel_model_result result;
  jit_common(params, &result);
  /* The process survives, so no save and no restart: only what the recovery itself costs. */
  result.checkpoint_term = 0.0;
  result.restart_term = job_failure_rate(params) * params->inprocess_recovery_s;
  result.interval_s = INFINITY;
  result.checkpoints_per_hour = 0.0;
  result_finish(&result);
  *result_p = result;
  return KEEL_OK;
}
