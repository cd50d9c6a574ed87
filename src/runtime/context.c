/* The process's context: keel_init assembles the parts (configuration, events, failure
 * detector, store session, endpoint, registry, steps, recovery) and keel_finalize takes them
 * apart in reverse; in between, this file answers the endpoint's questions about the
 * membership (addresses, deaths, interruptions) from the detector and the session, and
 * carries the small public calls that belong to no single part. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime_internal.h"

#define MODULE KEEL__RUNTIME_MODULE
#define JOIN_DEADLINE_NS (60 * (int64_t)1000000000)
/* A leaving process reads its peers' last frames for at most this long. */
#define LINGER_NS ((int64_t)1000 * 1000 * 1000)
#define REPORT_INTERVAL_NS (100 * (int64_t)1000000)
#define COMMITS_INTERVAL_NS (1000 * (int64_t)1000000)

/* ---- the endpoint's membership questions */

static keel_status membership_address(void *context, uint32_t uid, char *address, size_t capacity) {
  keel_ctx *ctx = context;
  return keel__session_address(ctx->session, uid, address, capacity);
}

static void membership_suspect(void *context, uint32_t uid, const char *reason) {
  keel_ctx *ctx = context;
  keel__detector_observe(ctx->detector, uid, reason);
}

static keel_status membership_publish(void *context) {
  keel_ctx *ctx = context;
  keel__detector_flush(ctx->detector, keel__session_store(ctx->session));
  return KEEL_OK;
}

static keel_status membership_take_view(void *context, const keel_store_entry *entries,
                                        size_t count) {
  keel_ctx *ctx = context;
  return keel__detector_take(ctx->detector, entries, count);
}

static bool membership_dead(void *context, uint32_t uid) {
  keel_ctx *ctx = context;
  return keel__detector_dead(ctx->detector, uid);
}

static int membership_node(void *context, uint32_t uid) {
  keel_ctx *ctx = context;
  return keel__detector_node(ctx->detector, uid);
}

static keel_status membership_interrupted(void *context) {
  keel_ctx *ctx = context;
  return keel__session_interrupted(ctx->session);
}

static int64_t membership_sections_until(void *context) {
  keel_ctx *ctx = context;
  return keel__session_sections_until(ctx->session);
}

static const keel_membership_ops membership_ops = {
    .address = membership_address,
    .suspect = membership_suspect,
    .publish = membership_publish,
    .view_prefixes = keel__detector_prefixes,
    .take_view = membership_take_view,
    .dead = membership_dead,
    .node = membership_node,
    .interrupted = membership_interrupted,
    .sections_until = membership_sections_until,
};

keel_status keel__interruption(keel_ctx *ctx) { return keel__session_interrupted(ctx->session); }

/* ---- reporting */

void keel__report_line(keel_ctx *ctx, const char *event, const char *fields) {
  keel_comm *world = keel_world(ctx);
  keel__events_line(ctx->events, ctx->config.uid, world ? keel_comm_rank(world) : -1,
                    world ? keel_comm_epoch(world) : 0, event, fields);
}

static void fault_reported(void *context, const char *action, const char *point, uint64_t step) {
  char fields[160];
  snprintf(fields, sizeof fields, "\"action\":\"%s\",\"point\":\"%s\",\"step\":%" PRIu64, action,
           point, step);
  keel__report_line(context, "fault", fields);
}

void keel_report(keel_ctx *ctx, uint64_t step, double loss, double samples_per_second) {
  int64_t now = keel_now_ns();
  if (ctx->events == NULL || now - ctx->last_report_ns < REPORT_INTERVAL_NS) return;
  ctx->last_report_ns = now;
  /* nan and inf (a diverged loss) are no JSON numbers: the launcher would drop the line. */
  char loss_text[32] = "null", rate_text[64] = "null";
  if (isfinite(loss)) snprintf(loss_text, sizeof loss_text, "%.6g", loss);
  if (isfinite(samples_per_second))
    snprintf(rate_text, sizeof rate_text, "%.1f", samples_per_second);
  char fields[256];
  keel_comm *world = keel_world(ctx);
  snprintf(fields, sizeof fields,
           "\"world\":%d,\"step\":%" PRIu64 ",\"loss\":%s,\"samples_per_s\":%s",
           world ? keel_comm_size(world) : 0, step, loss_text, rate_text);
  keel__report_line(ctx, "progress", fields);
}

void keel_report_event(keel_ctx *ctx, const char *event, const char *json_fields) {
  if (keel__event_acceptable(event, json_fields)) keel__report_line(ctx, event, json_fields);
}

bool keel_fault_point(keel_ctx *ctx, const char *point) {
  return keel_fault_plan_fire(ctx->faults, point, 0);
}

int keel_exit_code(keel_status status) {
  switch (status) {
    case KEEL_OK:
    case KEEL_EJOBDONE:
    case KEEL_EEXCLUDED:
      return 0;
    case KEEL_ERESTART:
      return KEEL_EXIT_RESTART;
    case KEEL_EORPHANED:
      return KEEL_EXIT_ORPHANED;
    case KEEL_ESTOPPED:
      return KEEL_EXIT_STOPPED;
    default:
      return 1;
  }
}

void keel_note_saved(keel_ctx *ctx, const char *where) {
  snprintf(ctx->saved_at, sizeof ctx->saved_at, "%s", where ? where : "");
}

void keel__leaving_message(keel_ctx *ctx, keel_status cause) {
  if (ctx->left_message_written || cause == KEEL_EJOBDONE) return;
  ctx->left_message_written = true;
  char state[2 * sizeof ctx->saved_at + 64];
  if (ctx->saved_at[0] != '\0')
    snprintf(state, sizeof state, "state saved in %s (go on with: keel run --resume %s ...)",
             ctx->saved_at, ctx->saved_at);
  else if (!keel__step_state_held(ctx->step)) /* a spare or joiner not admitted yet */
    snprintf(state, sizeof state, "nothing to save (this process held no state yet)");
  else
    snprintf(state, sizeof state, "no state was saved (no checkpoint policy: keel run --ckpt jit)");
  if (cause == KEEL_EORPHANED)
    KEEL_LOG_E(MODULE, "the launcher (pid %d) is gone; %s; exiting with %d",
               keel__session_launcher_pid(ctx->session), state, KEEL_EXIT_ORPHANED);
  else if (cause == KEEL_ESTOPPED)
    KEEL_LOG_E(MODULE, "the job is stopping; %s; exiting with %d", state, KEEL_EXIT_STOPPED);
  else if (cause == KEEL_EEXCLUDED)
    KEEL_LOG_E(MODULE, "the job declared this process dead and went on without it; leaving");
}

/* ---- accessors */

keel_comm *keel_world(keel_ctx *ctx) { return keel_endpoint_current(ctx->endpoint); }
bool keel_is_newcomer(const keel_ctx *ctx) { return ctx->newcomer; }
uint64_t keel_job_id(const keel_ctx *ctx) {
  return ctx->config.standalone ? 1 : ctx->config.auth.job_id;
}
uint32_t keel_restart_count(const keel_ctx *ctx) { return ctx->config.restart_count; }
const char *keel_resume_directory(const keel_ctx *ctx) {
  return ctx->config.resume_directory[0] != '\0' ? ctx->config.resume_directory : NULL;
}
keel_registry *keel_state(keel_ctx *ctx) { return ctx->registry; }

keel_status keel_state_register(keel_ctx *ctx, const char *name, void *data, size_t bytes) {
  if (ctx == NULL) return KEEL_EINVAL;
  return keel_registry_add(ctx->registry, name, data, bytes);
}

keel_status keel_state_shard(keel_ctx *ctx, uint32_t count) {
  if (ctx == NULL || count == 0 || count > KEEL_MAX_WORLD) return KEEL_EINVAL;
  ctx->shard_count = count;
  return KEEL_OK;
}

uint32_t keel_state_shards(const keel_ctx *ctx) { return ctx->shard_count; }

keel_status keel_state_source_add(keel_ctx *ctx, const keel_state_source_ops *ops, void *context) {
  if (ctx == NULL) return KEEL_EINVAL;
  return keel__state_sources_add(ctx->sources, ops, context);
}

/* ---- init, start, finalize */

static const keel__policy_ops *policy_of(keel__policy_kind kind) {
  switch (kind) {
    case KEEL__POLICY_REPLACE:
      return &keel__policy_replace;
    case KEEL__POLICY_RESTART:
      return &keel__policy_restart;
    case KEEL__POLICY_SHRINK:
      break;
  }
  return &keel__policy_shrink;
}

static keel_status parts_create(keel_ctx *ctx) {
  keel_status status = keel_registry_create(&ctx->registry);
  if (status == KEEL_OK) status = keel__step_create(&ctx->step);
  if (status == KEEL_OK) status = keel__recovery_create(&ctx->recovery);
  if (status == KEEL_OK) status = keel__state_sources_create(&ctx->sources);
  if (status == KEEL_OK) status = keel__watchdog_create(&ctx->config, &ctx->watchdog);
  if (status == KEEL_OK) status = keel__verify_create(&ctx->config, &ctx->verify);
  if (status == KEEL_OK)
    status = keel_fault_plan_create(getenv("KEEL_FAULT"), ctx->config.uid, &ctx->faults);
  if (status == KEEL_OK) keel_fault_plan_set_reporter(ctx->faults, fault_reported, ctx);
  if (status == KEEL_OK) keel_fault_plan_set_node(ctx->faults, ctx->config.node);
  return status;
}

static keel_status init_standalone(keel_ctx *ctx) {
  keel_endpoint_config config = {.uid = 0, .faults = ctx->faults, .failure_detection = true};
  keel_status status = keel_endpoint_create(&config, &ctx->endpoint);
  uint32_t only = 0;
  keel_comm *world = NULL;
  if (status == KEEL_OK)
    status = keel_comm_create(ctx->endpoint, 0, &only, 1, KEEL_NO_DEADLINE, &world);
  return status;
}

static keel_status endpoint_open(keel_ctx *ctx) {
  const keel__config *config = &ctx->config;
  keel_endpoint_config endpoint = {
      .uid = config->uid,
      .auth = config->auth,
      .store = keel__session_store(ctx->session),
      .lease = keel__session_lease(ctx->session),
      .host = config->host,
      .node = config->node,
      .node_domain = config->node_domain,
      .max_world = config->max_world,
      .refill_world = keel__refill_world(ctx),
      .timeout_ns = config->timeout_ns,
      .spare_wait_ns = config->replace_wait_ns,
      .failure_detection = config->failure_detection,
      .faults = ctx->faults,
      .membership = &membership_ops,
      .membership_context = ctx,
  };
  return keel_endpoint_create(&endpoint, &ctx->endpoint);
}

int keel__refill_world(const keel_ctx *ctx) {
  keel_rebuild_vote vote = {0};
  ctx->policy->vote(&vote);
  return vote.admit_spares && !ctx->config.node_domain ? ctx->config.initial_world : 0;
}

static keel_status join_job(keel_ctx *ctx) {
  const keel__config *config = &ctx->config;
  char identity[32];
  snprintf(identity, sizeof identity, "uid %" PRIu32, config->uid);
  keel_log_set_identity(identity);
  keel_status status = keel__events_create(config->status_fd, &ctx->events);
  if (status == KEEL_OK) status = keel__detector_create(config->uid, &ctx->detector);
  if (status == KEEL_OK) status = keel__session_open(config, ctx->detector, &ctx->session);
  if (status == KEEL_OK) keel__session_set_faults(ctx->session, ctx->faults);
  if (status == KEEL_OK) status = endpoint_open(ctx);
  if (status == KEEL_OK) status = keel__session_start(ctx->session, ctx->events, ctx->endpoint);
  if (status != KEEL_OK) return status;
  bool worker = config->role == KEEL__ROLE_WORKER;
  int rank = worker ? (int)(config->uid - config->first_uid) : -1;
  /* Before the process says it is ready: `delay` here makes a spare come late on purpose. */
  keel_fault_plan_fire(ctx->faults, "publish", 0);
  status = keel__session_publish(ctx->session, config->role, rank, config->first_epoch,
                                 keel_endpoint_address(ctx->endpoint));
  if (status != KEEL_OK || !worker) return status;
  uint32_t *uids = malloc(sizeof(uint32_t) * (size_t)config->initial_world);
  if (uids == NULL) return KEEL_ENOMEM;
  for (int member = 0; member < config->initial_world; member++)
    uids[member] = config->first_uid + (uint32_t)member;
  keel_comm *world = NULL;
  status = keel_comm_create(ctx->endpoint, config->first_epoch, uids, config->initial_world,
                            keel_deadline_after_ns(JOIN_DEADLINE_NS), &world);
  free(uids);
  return status;
}

keel_status keel_init(keel_ctx **ctx_p) {
  if (ctx_p == NULL) return KEEL_EINVAL;
  keel_ctx *ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) return KEEL_ENOMEM;
  ctx->shard_count = 1;
  keel_status status = keel__config_read(&ctx->config);
  if (status == KEEL_OK) status = parts_create(ctx);
  if (status == KEEL_OK) {
    ctx->policy = policy_of(ctx->config.policy);
    status = ctx->config.standalone ? init_standalone(ctx) : join_job(ctx);
  }
  if (status != KEEL_OK) {
    KEEL_LOG_E(MODULE, "cannot join the job: %s", keel_strerror(status));
    ctx->abandon = true;
    keel_finalize(ctx);
    return status;
  }
  *ctx_p = ctx;
  return KEEL_OK;
}

keel_status keel_start(keel_ctx *ctx) {
  if (ctx == NULL) return KEEL_EINVAL;
  if (ctx->config.standalone || ctx->config.role == KEEL__ROLE_WORKER) return KEEL_OK;
  keel_status status = keel__admission(ctx);
  if (status == KEEL_ESTOPPED || status == KEEL_EORPHANED) keel__leaving_message(ctx, status);
  /* Said here, since a program may leave with the status alone (finding 38's spare did). */
  else if (keel_exit_code(status) == 1) /* none of the orderly ends */
    KEEL_LOG_E(MODULE, "this %s could not wait for its admission: %s",
               ctx->config.role == KEEL__ROLE_SPARE ? "spare" : "joiner", keel_strerror(status));
  return status;
}

static void commits_report(keel_ctx *ctx) {
  keel__commit_run *run = &ctx->commits;
  if (!run->open || run->reported) return;
  char fields[160];
  snprintf(fields, sizeof fields,
           "\"run\":%" PRIu32 ",\"run_epoch\":%" PRIu64 ",\"from\":%" PRIu64 ",\"to\":%" PRIu64,
           run->number, run->epoch, run->first, run->last);
  keel__report_line(ctx, "commits", fields);
  run->reported = true;
  run->reported_ns = keel_now_ns();
}

/* A step that does not follow the run's last in the same epoch (a recovery moved the world
 * on; a verification rolled the state back) starts a new run, after a last line for the old
 * one. Lines come at most once a second otherwise: a run's tail not yet said when the process
 * dies is said by the other ranks that committed the same steps. */
void keel__commit_note(keel_ctx *ctx, uint64_t step) {
  if (!ctx->config.finish_crc) return;
  keel__commit_run *run = &ctx->commits;
  keel_comm *world = keel_world(ctx);
  uint64_t epoch = world != NULL ? keel_comm_epoch(world) : 0;
  if (run->open && (epoch != run->epoch || step != run->last + 1)) {
    commits_report(ctx);
    run->number++;
    run->open = false;
  }
  if (!run->open) {
    run->open = true;
    run->epoch = epoch;
    run->first = step;
  }
  run->last = step;
  run->reported = false;
  if (keel_now_ns() - run->reported_ns >= COMMITS_INTERVAL_NS) commits_report(ctx);
}

/* Waits of this process that ended past their deadline since the last look (none, while the
 * library keeps its deadlines): one `wait_late` line, which keel chaos counts against the
 * job (deadlines-kept), and a warning. */
void keel__waits_late_report(keel_ctx *ctx) {
  char fields[224];
  if (keel__waits_late_fields(fields, sizeof fields)) keel__report_line(ctx, "wait_late", fields);
}

/* A state this process received in a recovery (from a peer or a tier) says that the step
 * before its version was committed, by processes that may all die before their next
 * `commits` line (finding 43: a partitioned node's ranks committed a step alone, handed it
 * on and were fenced). The receivers live on, and their line fills that gap. */
void keel__commit_received(keel_ctx *ctx, uint64_t version) {
  if (!ctx->config.finish_crc || version == 0) return;
  char fields[48];
  snprintf(fields, sizeof fields, "\"step\":%" PRIu64, version - 1);
  keel__report_line(ctx, "received_commit", fields);
}

void keel__finish_note(keel_ctx *ctx, uint64_t version) {
  if (!ctx->config.finish_crc) return;
  ctx->finish_known = true;
  ctx->finish_crc = keel__registry_crc32c(ctx->registry);
  ctx->finish_step = version;
}

/* The `finish` event of a member that leaves in order (KEEL_FINISH_CRC): the steps it
 * committed and a crc32c over its registered state as the last commit left it, so that a
 * tool outside the job (`keel chaos`) can compare the ranks' final state with each other
 * and with a run without failures. */
static void finish_event(keel_ctx *ctx) {
  keel_comm *world = keel_world(ctx);
  if (!ctx->finish_known || world == NULL || keel_comm_rank(world) < 0) return;
  keel__position position;
  keel__step_position(ctx, KEEL__REDO_NONE, &position);
  char fields[192];
  snprintf(fields, sizeof fields,
           "\"world\":%d,\"step\":%" PRIu64 ",\"shard\":%" PRIu32 ",\"state_bytes\":%" PRIu64
           ",\"state_crc32c\":\"%08" PRIx32 "\"",
           keel_comm_size(world), ctx->finish_step, position.shard,
           keel_registry_bytes(ctx->registry), ctx->finish_crc);
  keel__report_line(ctx, "finish", fields);
}

void keel_finalize(keel_ctx *ctx) {
  if (ctx == NULL) return;
  keel_status interruption = keel__session_interrupted(ctx->session);
  /* After the launcher is gone (its store with it) or a failed init, nothing is said to
   * anyone: the peers learn from their links. */
  bool orderly = !ctx->abandon && interruption != KEEL_EORPHANED;
  if (orderly) {
    commits_report(ctx);
    keel__waits_late_report(ctx);
    finish_event(ctx);
  }
  keel__session_detach(ctx->session);
  keel_endpoint_close(ctx->endpoint, orderly ? LINGER_NS : 0);
  keel__session_close(ctx->session, orderly);
  keel__detector_destroy(ctx->detector);
  keel__events_destroy(ctx->events);
  keel__state_sources_destroy(ctx->sources);
  keel__recovery_destroy(ctx->recovery);
  keel__watchdog_destroy(ctx->watchdog);
  keel__verify_destroy(ctx->verify);
  keel__step_destroy(ctx->step);
  keel_registry_destroy(ctx->registry);
  keel_fault_plan_destroy(ctx->faults);
  free(ctx);
}
