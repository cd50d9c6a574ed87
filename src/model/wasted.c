/* Wasted time per failure, Gemini's Figure 10: a failure costs the work done since the
 * checkpoint the job goes back to (redone after recovery) plus the time to retrieve that
 * checkpoint. keel's in-memory snapshots every E iterations against a periodic disk
 * checkpoint every T; pure arithmetic on the measured or given inputs. */
#include <math.h>

#include "keel/model.h"
#include "model/model_internal.h"

static bool is_positive(double value) { return isfinite(value) && value > 0.0; }

static bool wasted_params_valid(const keel_model_wasted_params *params) {
  return is_positive(params->iteration_s) && isfinite(params->every_steps) &&
         params->every_steps >= 1.0 && keel__model_is_cost(params->memory_retrieval_s) &&
         is_positive(params->disk_interval_s) && keel__model_is_cost(params->state_bytes) &&
         is_positive(params->disk_read_bytes_per_s);
}

/* A failure falls uniformly between two checkpoints interval_s apart, so on average half an
 * interval of work is lost; worst_intervals says how many intervals can be lost at worst. */
static keel_model_wasted_policy policy_make(double interval_s, double worst_intervals,
                                            double retrieval_s) {
  keel_model_wasted_policy policy = {.interval_s = interval_s,
                                     .lost_mean_s = interval_s / 2.0,
                                     .lost_worst_s = worst_intervals * interval_s,
                                     .retrieval_s = retrieval_s};
  policy.total_mean_s = policy.lost_mean_s + retrieval_s;
  policy.total_worst_s = policy.lost_worst_s + retrieval_s;
  return policy;
}

keel_status keel_model_wasted_per_failure(const keel_model_wasted_params *params,
                                          keel_model_wasted *wasted_p) {
  if (params == NULL || wasted_p == NULL || !wasted_params_valid(params)) return KEEL_EINVAL;
  keel_model_wasted wasted;
  /* In memory: a snapshot completes within its iteration (the commit waits for the peers'
   * copies of the one before), so the newest is at most E iterations old. At worst the job
   * goes back one snapshot more: a rank lost inside a collective leaves the survivors one
   * step ahead of what any tier holds of its shard (docs/MEMORY.md, "why three slots"). */
  wasted.memory =
      policy_make(params->every_steps * params->iteration_s, 2.0, params->memory_retrieval_s);
  /* On disk: the newest checkpoint is at most T old, and retrieval reads the rank's state
   * back at the disk's speed (remote storage in the paper). */
  wasted.disk = policy_make(params->disk_interval_s, 1.0,
                            params->state_bytes / params->disk_read_bytes_per_s);
  /* total_mean_s > 0: m > 0 and E >= 1. */
  wasted.ratio_mean = wasted.disk.total_mean_s / wasted.memory.total_mean_s;
  wasted.ratio_worst = wasted.disk.total_worst_s / wasted.memory.total_worst_s;
  *wasted_p = wasted;
  return KEEL_OK;
}
