/* The recovery engine, one for every policy: failure hooks (once per epoch), then rounds of
 * revoke, agree, move to the decided epoch and move state by the plan the decision implies,
 * until a round succeeds. The policy (policy_*.c) says what this member votes for and whether
 * recovery happens in the process at all. Growth at a step boundary and the admission of a
 * spare or joiner are the same round without a failure. One member of the new epoch writes
 * the recovery's event, with its time broken down. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_internal.h"

#define MODULE "recovery"
/* Rounds of one recovery: each settles an agreement or fails within deadlines; a failure
 * during a round (a sender that dies mid-transfer) starts the next. */
#define MAX_ROUNDS 32
/* How long a spare tries to link ahead of time with one member. */
#define PRECONNECT_NS (50 * (int64_t)1000000)
/* A spare waits for its admission in slices of this (each ends early on any interruption). */
#define ADMISSION_SLICE_NS (600 * (int64_t)1000000000)

struct keel__recovery {
  keel_failure_hook hooks[KEEL_MAX_HOOKS];
  void *hook_args[KEEL_MAX_HOOKS];
  int hook_count;
  bool hooks_ran; /* for hooks_epoch */
  uint64_t hooks_epoch;
  bool final_hooks_ran;    /* a stop or a lost launcher: once per process */
  keel_decision *decision; /* the agreement's result; large, allocated once */
  keel_recovery last;
  uint64_t count;
  /* The recovery whose event is still to be written. */
  bool report_pending;
  bool reporter;
  const char *kind;
  int64_t detected_ns;
  uint32_t failed[KEEL_MAX_WORLD]; /* every uid lost across the rounds */
  int failed_count;
  uint32_t reporter_uid; /* who writes the event of the last round's decision */
  /* The last recovery's failed uids, kept by a member that did not write its event (or took
   * a rank in it): if its writer is among the next recovery's failed, that event may never
   * have come, and the next one names these uids too. */
  uint32_t unsure[KEEL_MAX_WORLD];
  int unsure_count;
  uint32_t unsure_reporter;
  bool unsure_open;     /* kept by a newcomer whose new epoch has not yet seen a collective */
  char transfers[1024]; /* the last round's plan, for the event */
  /* keel_mark_resume */
  bool resume_pending;
  uint64_t resume_step;
  char resume_kind[16];
};

keel_status keel__recovery_create(keel__recovery **recovery_p) {
  keel__recovery *recovery = calloc(1, sizeof *recovery);
  if (recovery == NULL) return KEEL_ENOMEM;
  recovery->decision = malloc(sizeof *recovery->decision);
  if (recovery->decision == NULL) {
    free(recovery);
    return KEEL_ENOMEM;
  }
  *recovery_p = recovery;
  return KEEL_OK;
}

void keel__recovery_destroy(keel__recovery *recovery) {
  if (recovery == NULL) return;
  free(recovery->decision);
  free(recovery);
}

keel_status keel_on_failure(keel_ctx *ctx, keel_failure_hook hook, void *arg) {
  keel__recovery *recovery = ctx->recovery;
  if (hook == NULL) return KEEL_EINVAL;
  if (recovery->hook_count == KEEL_MAX_HOOKS) return KEEL_ERANGE;
  recovery->hooks[recovery->hook_count] = hook;
  recovery->hook_args[recovery->hook_count] = arg;
  recovery->hook_count++;
  return KEEL_OK;
}

uint64_t keel_last_recovery(const keel_ctx *ctx, keel_recovery *recovery_p) {
  if (recovery_p != NULL) *recovery_p = ctx->recovery->last;
  return ctx->recovery->count;
}

void keel__failure_hooks_run(keel_ctx *ctx, keel_status cause, bool in_process) {
  keel__recovery *recovery = ctx->recovery;
  keel_comm *world = keel_world(ctx);
  uint64_t epoch = world ? keel_comm_epoch(world) : 0;
  if (in_process && recovery->hooks_ran && recovery->hooks_epoch == epoch) return;
  if (!in_process && recovery->final_hooks_ran) return;
  recovery->hooks_ran = true;
  recovery->hooks_epoch = epoch;
  recovery->final_hooks_ran = !in_process;
  /* Every member learns at once that this epoch is over. */
  if (world != NULL) keel_comm_revoke(world);
  /* A process about to exit saves the step's starting state, which the undo copy holds when
   * the step changed registered state already. */
  if (!in_process) keel__step_undo_restore(ctx);
  uint64_t step = 0;
  keel_failure failure = {.cause = cause,
                          .step_known = keel_current_step(ctx, &step),
                          .epoch = epoch,
                          .in_process = in_process,
                          .failed_ns = keel_now_ns()};
  failure.step = step;
  char fields[160];
  snprintf(fields, sizeof fields,
           "\"cause\":\"%s\",\"step\":%" PRIu64 ",\"in_process\":%s,\"hooks\":%d",
           keel_status_name(cause), step, in_process ? "true" : "false", recovery->hook_count);
  keel__report_line(ctx, "failure", fields);
  for (int i = 0; i < recovery->hook_count; i++)
    recovery->hooks[i](recovery->hook_args[i], &failure);
}

/* ---- resumed events */

void keel_mark_resume(keel_ctx *ctx, uint64_t step, const char *kind) {
  keel__recovery *recovery = ctx->recovery;
  recovery->resume_pending = true;
  recovery->resume_step = step;
  snprintf(recovery->resume_kind, sizeof recovery->resume_kind, "%s", kind ? kind : "");
}

void keel__resume_committed(keel_ctx *ctx, uint64_t step) {
  keel__recovery *recovery = ctx->recovery;
  if (!recovery->resume_pending || step < recovery->resume_step) return;
  recovery->resume_pending = false;
  keel_comm *world = keel_world(ctx);
  if (world == NULL || keel_comm_rank(world) != 0) return;
  char fields[96];
  snprintf(fields, sizeof fields, "\"step\":%" PRIu64 ",\"kind\":\"%s\"", recovery->resume_step,
           recovery->resume_kind);
  keel__report_line(ctx, "resumed", fields);
}

/* ---- one round */

static bool failed_has(const keel__recovery *recovery, uint32_t uid) {
  for (int i = 0; i < recovery->failed_count; i++)
    if (recovery->failed[i] == uid) return true;
  return false;
}

static void failed_add(keel__recovery *recovery, const uint32_t *uids, int count) {
  for (int i = 0; i < count; i++)
    if (!failed_has(recovery, uids[i]) && recovery->failed_count < KEEL_MAX_WORLD)
      recovery->failed[recovery->failed_count++] = uids[i];
}

static void failed_note(keel__recovery *recovery, const keel_decision *decision) {
  failed_add(recovery, decision->failed, decision->failed_count);
}

/* The member that writes the event: the first of the new epoch that held state when it
 * voted (a newcomer never saw the failure). Every member computes the same. */
static uint32_t reporter_of(const keel_decision *decision) {
  for (int m = 0; m < decision->member_count; m++) {
    keel__position position;
    if (keel__position_parse(decision->notes[m], &position) != KEEL_OK || !position.has_state)
      continue;
    return decision->members[m];
  }
  return UINT32_MAX;
}

/* Keeps uids (a recovery's failed) in case the event that names them never comes: its
 * writer, reporter, may die before the new epoch's first collective, or that epoch may end
 * before any (open: no collective has succeeded here since). */
static void unsure_keep(keel__recovery *recovery, const uint32_t *uids, int count,
                        uint32_t reporter, bool open) {
  recovery->unsure_count = count < KEEL_MAX_WORLD ? count : KEEL_MAX_WORLD;
  memcpy(recovery->unsure, uids, sizeof *uids * (size_t)recovery->unsure_count);
  recovery->unsure_reporter = reporter;
  recovery->unsure_open = open;
}

/* The last recovery's event may never have come (its writer failed in this recovery, or its
 * epoch ended before a collective): its uids join this one's (named twice if it did come;
 * never not at all). */
static void unsure_settle(keel__recovery *recovery) {
  if (recovery->unsure_count > 0 &&
      (recovery->unsure_open || failed_has(recovery, recovery->unsure_reporter)))
    failed_add(recovery, recovery->unsure, recovery->unsure_count);
  recovery->unsure_count = 0;
}

/* No survivor held this member's shard and no tier had it. It does not leave on its own:
 * it ends the epoch, and says so in its next vote, so that every member reads the same
 * verdict from the same decision (the plan's `unrecoverable`). */
static keel_status tier_failed_round(keel_comm *comm) {
  keel_comm_revoke(comm);
  return KEEL_EREVOKED;
}

typedef struct round_result {
  bool forward;
  bool received;
} round_result;

static int64_t elapsed_since(int64_t *mark) {
  int64_t now = keel_now_ns(), elapsed = now - *mark;
  *mark = now;
  return elapsed;
}

/* Revoke, agree on vote, move to the decided epoch, move the state. */
static keel_status round_run(keel_ctx *ctx, const keel_rebuild_vote *base_vote,
                             keel__position *position, keel_recovery *info, round_result *result) {
  keel__recovery *recovery = ctx->recovery;
  keel_decision *decision = recovery->decision;
  keel_comm *world = keel_world(ctx);
  int old_size = keel_comm_size(world);
  int64_t mark = keel_now_ns();
  keel_comm_revoke(world);
  info->revoke_ns += elapsed_since(&mark);
  keel_rebuild_vote vote = *base_vote;
  keel__position_note(position, vote.note, sizeof vote.note);
  keel_status status = keel_comm_decide(world, &vote, decision);
  info->agree_ns += elapsed_since(&mark);
  if (status != KEEL_OK) return status;
  failed_note(recovery, decision);
  keel_comm *comm = NULL;
  status = keel_endpoint_adopt(ctx->endpoint, decision, &comm);
  if (status == KEEL_OK)
    keel__session_publish(ctx->session, KEEL__ROLE_WORKER, keel_comm_rank(comm),
                          keel_comm_epoch(comm), keel_endpoint_address(ctx->endpoint));
  info->rebuild_ns += elapsed_since(&mark);
  info->replaced_count += decision->replaced_count;
  info->joined_count += decision->joined_count;
  info->failed_count += decision->failed_count;
  if (status != KEEL_OK) return status;
  keel__state_plan plan;
  status = keel__state_plan_make(decision, old_size, &plan);
  /* The step will begin again: the undo copy goes back first, so that what a survivor sends
   * is the step's starting state, not its half-done update. */
  if (status == KEEL_OK && !plan.forward) keel__step_undo_restore(ctx);
  if (status == KEEL_OK && plan.unrecoverable) {
    KEEL_LOG_E(MODULE,
               "no survivor holds shard %u of step %" PRIu64
               " and no checkpoint tier "
               "has it: the job cannot go on in process",
               plan.lost_shard, plan.version);
    return KEEL_ENOTFOUND;
  }
  keel__transfer_result transfer = {0};
  if (status == KEEL_OK) status = keel__state_transfer(ctx, comm, decision, &plan, &transfer);
  info->state_transfer_ns += elapsed_since(&mark);
  if (transfer.receiver && !transfer.received) position->has_state = false;
  position->tier_failed = transfer.tier_failed;
  position->has_fallback = transfer.has_fallback;
  position->fallback = transfer.fallback;
  if (transfer.tier_failed) status = tier_failed_round(comm);
  if (status != KEEL_OK) return status;
  position->has_state = true;
  position->version = plan.version;
  keel__step_state_set(ctx->step, plan.version, true);
  if (transfer.received) keel__commit_received(ctx, plan.version);
  result->forward = plan.forward;
  result->received = transfer.received;
  recovery->reporter_uid = reporter_of(decision);
  recovery->reporter = recovery->reporter_uid == ctx->config.uid;
  if (recovery->reporter && keel__state_plan_describe(decision, recovery->transfers,
                                                      sizeof recovery->transfers) != KEEL_OK)
    snprintf(recovery->transfers, sizeof recovery->transfers, "[]");
  return KEEL_OK;
}

static bool is_recoverable(keel_status status) {
  return status == KEEL_EPROCFAILED || status == KEEL_EREVOKED || status == KEEL_ETIMEDOUT ||
         status == KEEL_ECLOSED;
}

/* Rounds until one succeeds; a round that fails recoverably (a member died meanwhile)
 * starts the next on whatever world is current. */
static keel_status rounds_run(keel_ctx *ctx, const keel_rebuild_vote *vote,
                              keel__position *position, keel_recovery *info, round_result *result) {
  keel_status status = KEEL_ETIMEDOUT;
  for (int round = 0; round < MAX_ROUNDS; round++) {
    status = round_run(ctx, vote, position, info, result);
    if (status == KEEL_OK || !is_recoverable(status)) return status;
    KEEL_LOG_I(MODULE, "recovery round %d failed (%s): another round", round,
               keel_strerror(status));
  }
  KEEL_LOG_E(MODULE, "no recovery round succeeded in %d tries", MAX_ROUNDS);
  return status;
}

/* The pending event and the garbage collection of the job's finished keys. */
static void recovery_settled(keel_ctx *ctx, const keel_recovery *info, const char *kind,
                             int64_t detected_ns) {
  keel__recovery *recovery = ctx->recovery;
  recovery->last = *info;
  recovery->count++;
  recovery->report_pending = true;
  recovery->kind = kind;
  recovery->detected_ns = detected_ns;
}

/* The garbage collection of the job's finished keys: after the recovery's first collective,
 * off the path every member waits on. */
static void collect_finished_keys(keel_ctx *ctx) {
  if (ctx->config.standalone) return;
  keel_endpoint_collect(ctx->endpoint);
  if (!ctx->recovery->reporter) return;
  keel_comm *world = keel_world(ctx);
  keel__detector_forget(ctx->detector, keel__session_store(ctx->session),
                        ctx->recovery->decision->members, keel_comm_size(world));
}

/* What a failure means for the caller: an orderly stop or a dead launcher explains a
 * store that stopped answering, and is what the program must hear (exit 77 or 76). */
static keel_status failure_cause(keel_ctx *ctx, keel_status failure) {
  if (ctx->config.standalone) return failure;
  keel_status interruption = keel__session_check(ctx->session, failure);
  return interruption != KEEL_OK ? interruption : failure;
}

keel_status keel__recover(keel_ctx *ctx, keel_status cause, keel__redo_kind redo,
                          int64_t operation_started_ns, bool *redo_step_p) {
  keel__recovery *recovery = ctx->recovery;
  const keel__policy_ops *policy = ctx->policy;
  keel_comm *world = keel_world(ctx);
  int64_t detected = keel_now_ns();
  keel_recovery info = {.old_epoch = keel_comm_epoch(world),
                        .old_size = keel_comm_size(world),
                        .detect_ns = detected - operation_started_ns};
  /* The failure may be a member leaving for an orderly stop: then this one leaves too. */
  if (!ctx->config.standalone) {
    keel_status interruption = keel__session_check(ctx->session, cause);
    if (interruption != KEEL_OK) return interruption;
  }
  /* A recovery whose event is still pending did not see a collective succeed in its new
   * world: this one continues it (one event, every uid lost, time from the first detection). */
  bool continuing = recovery->report_pending;
  if (continuing) {
    info = recovery->last;
    detected = recovery->detected_ns;
  } else {
    recovery->failed_count = 0;
  }
  keel__failure_hooks_run(ctx, cause, policy->in_process);
  if (!policy->in_process) return KEEL_ERESTART;
  KEEL_LOG_I(MODULE, "epoch %" PRIu64 " failed (%s): recovering by %s", info.old_epoch,
             keel_strerror(cause), policy->name);
  keel__position position;
  keel__step_position(ctx, redo, &position);
  keel_rebuild_vote vote = {0};
  policy->vote(&vote);
  round_result result = {0};
  keel_status status = rounds_run(ctx, &vote, &position, &info, &result);
  if (status != KEEL_OK) return failure_cause(ctx, status);
  unsure_settle(recovery);
  world = keel_world(ctx);
  info.recovered = true;
  info.redo_step = info.redo_step || !result.forward;
  info.state_received = info.state_received || result.received;
  info.new_epoch = keel_comm_epoch(world);
  info.new_size = keel_comm_size(world);
  recovery_settled(ctx, &info, policy->name, detected);
  /* A failure just after a recovery, before the new epoch's first collective. */
  keel_fault_plan_fire(ctx->faults, "recovered", 0);
  uint64_t step = 0;
  if (keel_current_step(ctx, &step)) keel_mark_resume(ctx, step, "in-process");
  *redo_step_p = info.redo_step;
  return KEEL_OK;
}

keel_status keel__grow(keel_ctx *ctx) {
  keel_comm *world = keel_world(ctx);
  keel_recovery info = {.old_epoch = keel_comm_epoch(world), .old_size = keel_comm_size(world)};
  keel__position position;
  keel__step_position(ctx, KEEL__REDO_NONE, &position);
  keel_rebuild_vote vote = {
      .flags = 1, .admit_joiners = true, .admit_spares = keel__refill_world(ctx) > 0};
  ctx->recovery->failed_count = 0;
  round_result result = {0};
  int64_t started = keel_now_ns();
  keel_status status = rounds_run(ctx, &vote, &position, &info, &result);
  if (status != KEEL_OK) return status;
  world = keel_world(ctx);
  info.recovered = true;
  info.new_epoch = keel_comm_epoch(world);
  info.new_size = keel_comm_size(world);
  recovery_settled(ctx, &info, "grow", started);
  keel__recovery_report(ctx, 0);
  return KEEL_OK;
}

/* The "recovery" event, written by the new epoch's reporter alone. */
static void recovery_event(keel_ctx *ctx) {
  keel__recovery *recovery = ctx->recovery;
  const keel_recovery *info = &recovery->last;
  char fields[3072];
  int used = snprintf(fields, sizeof fields,
                      "\"old_epoch\":%" PRIu64 ",\"new_epoch\":%" PRIu64
                      ",\"old_world\":%d,\"new_world\":%d,\"policy\":\"%s\",\"replaced\":%d,"
                      "\"joined\":%d,\"restart_step\":%s,\"redo_minibatches\":%d,\"failed\":[",
                      info->old_epoch, info->new_epoch, info->old_size, info->new_size,
                      recovery->kind, info->replaced_count, info->joined_count,
                      info->redo_step ? "true" : "false", info->redo_step ? 1 : 0);
  for (int i = 0; i < recovery->failed_count && used < (int)sizeof fields - 400; i++)
    used += snprintf(fields + used, sizeof fields - (size_t)used, i ? ",%" PRIu32 : "%" PRIu32,
                     recovery->failed[i]);
  int64_t total =
      info->revoke_ns + info->agree_ns + info->rebuild_ns + info->state_transfer_ns + info->redo_ns;
  snprintf(fields + used, sizeof fields - (size_t)used,
           "],\"transfers\":%s,\"detect_ms\":%.3f,\"revoke_ms\":%.3f,\"agree_ms\":%.3f,"
           "\"rebuild_ms\":%.3f,\"state_transfer_ms\":%.3f,\"redo_ms\":%.3f,\"total_ms\":%.3f,"
           "\"t_detect_ns\":%" PRId64,
           recovery->transfers[0] ? recovery->transfers : "[]", info->detect_ns / 1e6,
           info->revoke_ns / 1e6, info->agree_ns / 1e6, info->rebuild_ns / 1e6,
           info->state_transfer_ns / 1e6, info->redo_ns / 1e6, total / 1e6, recovery->detected_ns);
  keel__report_line(ctx, "recovery", fields);
}

void keel__recovery_report(keel_ctx *ctx, int64_t redo_ns) {
  keel__recovery *recovery = ctx->recovery;
  recovery->unsure_open = false;
  if (!recovery->report_pending) return;
  if (recovery->kind != NULL && strcmp(recovery->kind, "grow") != 0)
    recovery->last.redo_ns = redo_ns;
  recovery->report_pending = false;
  if (recovery->reporter) recovery_event(ctx);
  if (!recovery->reporter)
    unsure_keep(recovery, recovery->failed, recovery->failed_count, recovery->reporter_uid, false);
  collect_finished_keys(ctx);
}

/* ---- a spare or a joiner */

/* A spare links ahead of time with the live members below its uid, so that taking a rank
 * costs no handshake. Best effort and brief. */
static void preconnect(keel_ctx *ctx) {
  keel_store *store = keel__session_store(ctx->session);
  if (keel__detector_refresh(ctx->detector, store) != KEEL_OK) return;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(store, "proc/", &entries, &count, NULL) != KEEL_OK) return;
  for (size_t i = 0; i < count; i++) {
    char *end;
    unsigned long uid = strtoul(entries[i].key + 5, &end, 10);
    if (*end != '\0' || uid >= ctx->config.uid || keel__detector_dead(ctx->detector, (uint32_t)uid))
      continue;
    /* Its address is published, so it listens: a refusal is a dead process, not one that
     * is starting. */
    keel_endpoint_link(ctx->endpoint, (uint32_t)uid, keel_deadline_after_ns(PRECONNECT_NS));
  }
  keel_store_entries_free(entries, count);
}

/* Takes the state the admitting decision's plan gives this newcomer. */
static keel_status admitted(keel_ctx *ctx, keel_comm *comm, bool *received_p,
                            keel__transfer_result *failed_p) {
  keel_decision *decision = ctx->recovery->decision;
  keel__session_publish(ctx->session, KEEL__ROLE_WORKER, keel_comm_rank(comm),
                        keel_comm_epoch(comm), keel_endpoint_address(ctx->endpoint));
  keel__state_plan plan;
  keel_status status = keel__state_plan_make(decision, 0, &plan);
  if (status == KEEL_OK && plan.unrecoverable) return KEEL_ENOTFOUND;
  keel__transfer_result transfer = {0};
  if (status == KEEL_OK) status = keel__state_transfer(ctx, comm, decision, &plan, &transfer);
  *received_p = transfer.received;
  *failed_p = transfer;
  if (transfer.tier_failed) status = tier_failed_round(comm);
  if (status == KEEL_OK) keel__step_state_set(ctx->step, plan.version, true);
  if (status == KEEL_OK && transfer.received) keel__commit_received(ctx, plan.version);
  if (status == KEEL_OK)
    unsure_keep(ctx->recovery, decision->failed, decision->failed_count, reporter_of(decision),
                true);
  return status;
}

keel_status keel__admission(keel_ctx *ctx) {
  keel_offer offer = ctx->config.role == KEEL__ROLE_SPARE ? KEEL_OFFER_SPARE : KEEL_OFFER_JOINER;
  keel__step_state_set(ctx->step, 0, false);
  keel_status status = keel_endpoint_offer(ctx->endpoint, offer);
  if (status != KEEL_OK) return failure_cause(ctx, status);
  preconnect(ctx);
  for (;;) {
    keel_comm *comm = NULL;
    status = keel_endpoint_await_admission(
        ctx->endpoint, keel_deadline_after_ns(ADMISSION_SLICE_NS), ctx->recovery->decision, &comm);
    if (status == KEEL_ETIMEDOUT && comm == NULL) continue; /* no news: the offer stands */
    if (status != KEEL_OK && (comm == NULL || !is_recoverable(status)))
      return failure_cause(ctx, status);
    bool received = false;
    keel__transfer_result transfer = {0};
    /* Named in a decision whose members could not all be linked (one died meanwhile): a
     * member all the same, which recovers the epoch below like any other. Leaving instead
     * would hold the others' next agreement up until it was declared dead. */
    if (status == KEEL_OK) status = admitted(ctx, comm, &received, &transfer);
    if (status == KEEL_OK) {
      ctx->newcomer = received;
      keel__watchdog_adopt(ctx);
      return KEEL_OK;
    }
    if (status == KEEL_EEXCLUDED) {
      /* A later decision went on without us: offer again. */
      keel_endpoint_offer(ctx->endpoint, offer);
      continue;
    }
    if (!is_recoverable(status)) return failure_cause(ctx, status);
    /* A member of the new epoch whose state did not arrive (its sender died): recover the
     * epoch like any member, as one that holds no state, so another sender is named. */
    KEEL_LOG_W(MODULE, "joining epoch %" PRIu64 " failed (%s); recovering it as a member",
               keel_comm_epoch(comm), keel_strerror(status));
    keel__position position;
    keel__step_position(ctx, KEEL__REDO_NONE, &position);
    position.tier_failed = transfer.tier_failed;
    position.has_fallback = transfer.has_fallback;
    position.fallback = transfer.fallback;
    keel_rebuild_vote vote = {0};
    ctx->policy->vote(&vote);
    keel_recovery info = {0};
    round_result result = {0};
    status = rounds_run(ctx, &vote, &position, &info, &result);
    if (status == KEEL_OK) ctx->newcomer = true;
    return status;
  }
}
