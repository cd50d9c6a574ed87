/* The launcher's contract with a process (docs/RUNTIME.md, "Environment"): the KEEL_*
 * variables read once at keel_init, checked against the limits `keel run` uses, and never
 * changed afterwards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_internal.h"

#define MODULE KEEL__RUNTIME_MODULE

const char *keel__role_name(keel__role role) {
  static const char *const names[] = {"worker", "spare", "joiner"};
  return names[role];
}

static void config_defaults(keel__config *config) {
  memset(config, 0, sizeof *config);
  config->status_fd = -1;
  config->timeout_ns = 30 * (int64_t)1000000000;
  /* Two seconds: a lease must survive a process not being scheduled for a while on a loaded
   * machine, or a slow process is taken for a hung one. */
  config->heartbeat_ns = 2000000000;
  config->replace_wait_ns = 10 * (int64_t)1000000000;
  config->initial_world = 1;
  config->max_world = 1;
  const char *detection = getenv("KEEL_FAILURE_DETECTION");
  config->failure_detection = detection == NULL || strcmp(detection, "off") != 0;
  const char *finish_crc = getenv("KEEL_FINISH_CRC");
  config->finish_crc = finish_crc != NULL && strcmp(finish_crc, "1") == 0;
  snprintf(config->host, sizeof config->host, "%s",
           getenv("KEEL_HOST") ? getenv("KEEL_HOST") : "127.0.0.1");
}

static keel_status read_role(keel__config *config) {
  const char *role = getenv("KEEL_ROLE");
  if (role == NULL || strcmp(role, "worker") == 0) config->role = KEEL__ROLE_WORKER;
  else if (strcmp(role, "spare") == 0) config->role = KEEL__ROLE_SPARE;
  else if (strcmp(role, "joiner") == 0) config->role = KEEL__ROLE_JOINER;
  else {
    KEEL_LOG_E(MODULE, "KEEL_ROLE=%s: expected worker, spare or joiner", role);
    return KEEL_EINVAL;
  }
  const char *policy = getenv("KEEL_ON_FAILURE");
  if (policy == NULL || strcmp(policy, "shrink") == 0) config->policy = KEEL__POLICY_SHRINK;
  else if (strcmp(policy, "replace") == 0) config->policy = KEEL__POLICY_REPLACE;
  else if (strcmp(policy, "restart") == 0) config->policy = KEEL__POLICY_RESTART;
  else {
    KEEL_LOG_E(MODULE, "KEEL_ON_FAILURE=%s: expected shrink, replace or restart", policy);
    return KEEL_EINVAL;
  }
  const char *domain = getenv("KEEL_FAILURE_DOMAIN");
  config->node_domain = domain != NULL && strcmp(domain, "node") == 0;
  return KEEL_OK;
}

/* A job that restarts its processes gives every incarnation fresh uids and epochs, so that
 * nothing in the store of an earlier one is mistaken for this one's: ranks are
 * uid - KEEL_FIRST_UID, the first epoch is KEEL_FIRST_EPOCH. */
static keel_status read_incarnation(keel__config *config) {
  int64_t restart = 0, first_uid = 0, first_epoch = 0;
  if (keel_env_int("KEEL_RESTART", 0, UINT32_MAX, &restart) != KEEL_OK ||
      keel_env_int("KEEL_FIRST_UID", 0, KEEL_MAX_UIDS - 1, &first_uid) != KEEL_OK ||
      keel_env_int("KEEL_FIRST_EPOCH", 0, INT64_MAX / 2, &first_epoch) != KEEL_OK) {
    KEEL_LOG_E(MODULE, "KEEL_RESTART, KEEL_FIRST_UID or KEEL_FIRST_EPOCH is out of range");
    return KEEL_EINVAL;
  }
  config->restart_count = (uint32_t)restart;
  config->first_uid = (uint32_t)first_uid;
  config->first_epoch = (uint64_t)first_epoch;
  const char *resume = getenv("KEEL_RESUME");
  if (resume != NULL && strlen(resume) >= sizeof config->resume_directory) {
    KEEL_LOG_E(MODULE, "KEEL_RESUME is too long");
    return KEEL_EINVAL;
  }
  snprintf(config->resume_directory, sizeof config->resume_directory, "%s", resume ? resume : "");
  return KEEL_OK;
}

static keel_status read_sizes(keel__config *config) {
  int64_t value = -1;
  if (keel_env_int("KEEL_UID", 0, KEEL_MAX_UIDS - 1, &value) != KEEL_OK || value < 0) {
    KEEL_LOG_E(MODULE, "KEEL_UID is missing or not below %d", KEEL_MAX_UIDS);
    return KEEL_EINVAL;
  }
  config->uid = (uint32_t)value;
  value = 0;
  if (keel_env_int("KEEL_WORLD", 1, KEEL_MAX_WORLD, &value) != KEEL_OK || value < 1) {
    KEEL_LOG_E(MODULE, "KEEL_WORLD is missing or not in 1..%d", KEEL_MAX_WORLD);
    return KEEL_EINVAL;
  }
  config->initial_world = (int)value;
  value = config->initial_world;
  if (keel_env_int("KEEL_MAX_WORLD", 1, KEEL_MAX_WORLD, &value) != KEEL_OK) return KEEL_EINVAL;
  config->max_world = (int)value;
  value = 0;
  if (keel_env_int("KEEL_NODE", 0, 1 << 20, &value) != KEEL_OK) return KEEL_EINVAL;
  config->node = (int)value;
  value = -1;
  if (keel_env_int("KEEL_STATUS_FD", 0, 1 << 20, &value) != KEEL_OK) return KEEL_EINVAL;
  config->status_fd = (int)value;
  return KEEL_OK;
}

keel_status keel__config_read(keel__config *config) {
  config_defaults(config);
  const char *store = getenv("KEEL_STORE");
  config->standalone = store == NULL;
  if (config->standalone) return KEEL_OK;
  if (strlen(store) >= sizeof config->store_endpoint) {
    KEEL_LOG_E("runtime", "KEEL_STORE is longer than %zu characters",
               sizeof config->store_endpoint - 1);
    return KEEL_EINVAL;
  }
  snprintf(config->store_endpoint, sizeof config->store_endpoint, "%s", store);
  keel_status status = keel_auth_from_env(&config->auth);
  if (status == KEEL_OK) status = read_sizes(config);
  if (status != KEEL_OK) return status;
  config->auth.local_id = config->uid;
  const char *timeout = getenv("KEEL_TIMEOUT");
  config->timeout_auto = timeout != NULL && strcmp(timeout, "auto") == 0;
  if ((!config->timeout_auto &&
       keel_env_duration_ns("KEEL_TIMEOUT", &config->timeout_ns) != KEEL_OK) ||
      keel_env_duration_ns("KEEL_HEARTBEAT", &config->heartbeat_ns) != KEEL_OK ||
      keel_env_duration_ns("KEEL_REPLACE_WAIT", &config->replace_wait_ns) != KEEL_OK)
    return KEEL_EINVAL;
  int64_t verify_every = 0;
  if (keel_env_int("KEEL_VERIFY_EVERY", 0, 1000000000, &verify_every) != KEEL_OK)
    return KEEL_EINVAL;
  config->verify_every = (uint64_t)verify_every;
  status = read_incarnation(config);
  if (status != KEEL_OK) return status;
  status = read_role(config);
  if (status != KEEL_OK) return status;
  bool worker = config->role == KEEL__ROLE_WORKER;
  if (worker && (config->uid < config->first_uid ||
                 config->uid - config->first_uid >= (uint32_t)config->initial_world)) {
    KEEL_LOG_E(MODULE, "uid %u is not a worker of the world KEEL_FIRST_UID=%u KEEL_WORLD=%d",
               config->uid, config->first_uid, config->initial_world);
    return KEEL_EINVAL;
  }
  return KEEL_OK;
}
