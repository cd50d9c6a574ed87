/* Recovery: revoke, the public agree / shrink / grow, the move to a decided epoch with the
 * state transfer to newcomers and laggards, and the resilient allreduce that redoes a failed
 * allreduce with the survivors' (and newcomers') contributions (ULFM elastic paper 3.2). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_internal.h"

#define MODULE "recovery"

/* What a sender says about its state before the buffers themselves. */
typedef struct state_meta {
  uint64_t resilient_seq;
  uint64_t count;
  uint64_t sizes[KEEL__MAX_STATE_BUFFERS];
} state_meta;

keel_status keel_comm_revoke(keel_comm *comm) {
  if (comm == NULL) return KEEL_EINVAL;
  comm->revoked_locally = true;
  keel__note_revoke(comm->ctx, comm->epoch);
  return KEEL_OK;
}

/* ---- state transfer */

static size_t chunks_of(size_t bytes) {
  return bytes == 0 ? 1 : (bytes + KEEL__STATE_FRAME_BYTES - 1) / KEEL__STATE_FRAME_BYTES;
}

static size_t chunk_length(size_t bytes, size_t chunk) {
  size_t first = chunk * KEEL__STATE_FRAME_BYTES;
  return bytes - first < KEEL__STATE_FRAME_BYTES ? bytes - first : KEEL__STATE_FRAME_BYTES;
}

static void fill_meta(const keel_ctx *ctx, state_meta *meta) {
  memset(meta, 0, sizeof *meta);
  meta->resilient_seq = ctx->resilient_seq;
  meta->count = (uint64_t)ctx->state_count;
  for (int i = 0; i < ctx->state_count; i++) meta->sizes[i] = ctx->state[i].bytes;
}

static keel_status send_state(keel_comm *comm, const keel__decision *decision) {
  keel_ctx *ctx = comm->ctx;
  state_meta meta;
  fill_meta(ctx, &meta);
  int pending = 0;
  int64_t sent = 0;
  for (int r = 0; r < decision->receiver_count; r++) {
    uint32_t uid = decision->receivers[r];
    keel__send(ctx, uid, KEEL_FRAME_STATE, comm->epoch, KEEL__STATE_TAG(KEEL__STATE_META_INDEX, 0),
               &meta, sizeof meta, &pending);
    for (int i = 0; i < ctx->state_count; i++) {
      const keel__state_buffer *buffer = &ctx->state[i];
      for (size_t chunk = 0; chunk < chunks_of(buffer->bytes); chunk++) {
        keel__send(ctx, uid, KEEL_FRAME_STATE, comm->epoch, KEEL__STATE_TAG(i, chunk),
                   (const uint8_t *)buffer->data + chunk * KEEL__STATE_FRAME_BYTES,
                   chunk_length(buffer->bytes, chunk), &pending);
        keel__fault_check(ctx, "state", ++sent);
      }
    }
  }
  /* Wait until it is all written: the buffers are live training state, and the receivers
   * are reading right now, so this is quick. */
  return keel__wait_posted(comm, ctx->slot_count, &pending,
                           keel_deadline_after_ns(comm->timeout_ns));
}

static keel_status receive_state(keel_comm *comm, uint32_t sender) {
  keel_ctx *ctx = comm->ctx;
  state_meta meta;
  size_t first_slot = ctx->slot_count;
  bool posted = keel__post_recv(ctx, KEEL_FRAME_STATE, sender, comm->epoch,
                                KEEL__STATE_TAG(KEEL__STATE_META_INDEX, 0), &meta,
                                sizeof meta) != NULL;
  for (int i = 0; i < ctx->state_count && posted; i++) {
    keel__state_buffer *buffer = &ctx->state[i];
    for (size_t chunk = 0; chunk < chunks_of(buffer->bytes) && posted; chunk++) {
      posted = keel__post_recv(ctx, KEEL_FRAME_STATE, sender, comm->epoch, KEEL__STATE_TAG(i, chunk),
                               (uint8_t *)buffer->data + chunk * KEEL__STATE_FRAME_BYTES,
                               chunk_length(buffer->bytes, chunk)) != NULL;
    }
  }
  if (!posted) {
    keel__abandon_operation(ctx);
    return KEEL_ENOMEM;
  }
  int pending = 0;
  keel_status status =
      keel__wait_posted(comm, first_slot, &pending, keel_deadline_after_ns(comm->timeout_ns));
  if (status == KEEL_EPROTO || (status == KEEL_OK && meta.count != (uint64_t)ctx->state_count)) {
    KEEL_LOG_E(MODULE, "the state sent by uid %u does not match the buffers registered here "
                       "(register the same buffers, in the same order, in every process)",
               sender);
    return KEEL_EPROTO;
  }
  if (status != KEEL_OK) return status;
  ctx->resilient_seq = meta.resilient_seq;
  return KEEL_OK;
}

static bool contains(const uint32_t *uids, int count, uint32_t uid) {
  for (int i = 0; i < count; i++) {
    if (uids[i] == uid) return true;
  }
  return false;
}

keel_status keel__apply_decision(keel_ctx *ctx, const keel__decision *decision,
                                 bool *received_state_p, int64_t *transfer_ns_p) {
  *received_state_p = false;
  if (transfer_ns_p) *transfer_ns_p = 0;
  if (!contains(decision->members, decision->member_count, ctx->uid)) return KEEL_EEXCLUDED;
  keel_comm *comm = keel__comm_create(ctx, decision->epoch + 1, decision->members,
                                      decision->member_count);
  if (comm == NULL) return KEEL_ENOMEM;
  keel__drop_stale_unexpected(ctx, comm->epoch);
  keel_status status = keel__ensure_links(ctx, comm->uids, comm->size,
                                          keel_deadline_after_ns(comm->timeout_ns));
  if (status != KEEL_OK) return status;
  keel__publish_proc(ctx, comm->rank, comm->epoch);
  if (decision->sender == UINT32_MAX) return KEEL_OK;
  bool receiver = contains(decision->receivers, decision->receiver_count, ctx->uid);
  if (decision->sender != ctx->uid && !receiver) return KEEL_OK;
  int64_t started = keel_now_ns();
  if (decision->sender == ctx->uid) {
    status = send_state(comm, decision);
  } else {
    status = receive_state(comm, decision->sender);
    if (status == KEEL_OK) *received_state_p = true;
  }
  if (transfer_ns_p) *transfer_ns_p = keel_now_ns() - started;
  return status;
}

/* ---- the public operations built on agreement */

keel_status keel_comm_agree(keel_comm *comm, uint32_t *flags, uint32_t *failed_uids,
                            size_t capacity, size_t *failed_count_p) {
  if (comm == NULL || flags == NULL) return KEEL_EINVAL;
  keel__contribution mine = {.flags = *flags};
  keel__decision decision;
  keel_status status = keel__agree(comm, &mine, &decision);
  if (status != KEEL_OK) return status;
  *flags = decision.flags;
  for (int i = 0; i < decision.failed_count && failed_uids != NULL && (size_t)i < capacity; i++)
    failed_uids[i] = decision.failed[i];
  if (failed_count_p) *failed_count_p = (size_t)decision.failed_count;
  return KEEL_OK;
}

static keel_status rebuild(keel_comm *comm, const keel__contribution *mine, keel__decision *decision,
                           bool *received_state_p) {
  keel_status status = keel__agree(comm, mine, decision);
  if (status != KEEL_OK) return status;
  return keel__apply_decision(comm->ctx, decision, received_state_p, NULL);
}

keel_status keel_comm_shrink(keel_comm *comm, keel_comm **new_p) {
  if (comm == NULL) return KEEL_EINVAL;
  keel__contribution mine = {.flags = 1, .rebuild = true, .force_shrink = true};
  keel__decision decision;
  bool received;
  keel_status status = rebuild(comm, &mine, &decision, &received);
  if (status == KEEL_OK && new_p) *new_p = comm->ctx->world;
  return status;
}

keel_status keel_comm_grow(keel_comm *comm, keel_comm **new_p) {
  if (comm == NULL) return KEEL_EINVAL;
  keel_ctx *ctx = comm->ctx;
  keel__contribution mine = {.flags = 1, .rebuild = true, .grow = true, .has_state = true,
                             .resilient_seq = ctx->resilient_seq};
  keel__decision decision;
  bool received;
  keel_status status = rebuild(comm, &mine, &decision, &received);
  if (status == KEEL_OK && new_p) *new_p = ctx->world;
  return status;
}

/* ---- the resilient allreduce */

bool keel__recoverable(keel_status status) {
  return status == KEEL_EPROCFAILED || status == KEEL_EREVOKED || status == KEEL_ETIMEDOUT;
}

keel_status keel__operation_end(keel_comm *comm, keel_status status) {
  if (!keel__recoverable(status) || comm == NULL) return status;
  keel_ctx *ctx = comm->ctx;
  bool restart = ctx->policy == KEEL__POLICY_RESTART;
  keel_status outcome = restart ? KEEL_ERESTART : status;
  if (comm != ctx->world || (ctx->failure_hook_count == 0 && !restart)) return outcome;
  if (ctx->failure_hooks_ran && ctx->failure_hooks_epoch == comm->epoch) return outcome;
  ctx->failure_hooks_ran = true;
  ctx->failure_hooks_epoch = comm->epoch;
  keel_failure failure = {.cause = status, .step = ctx->current_step,
                          .step_known = ctx->step_known, .epoch = comm->epoch,
                          .in_process = !restart, .failed_ns = keel_now_ns()};
  keel_comm_revoke(comm);
  for (int i = 0; i < ctx->failure_hook_count; i++)
    ctx->failure_hooks[i](ctx->failure_hook_args[i], &failure);
  return outcome;
}

/* One line per recovery, from one survivor: the state's sender when there was one (rank 0
 * may be a newcomer that never saw the failure), else rank 0 of the new world. */
typedef struct failed_set {
  uint32_t uids[256];
  int count;
} failed_set;

static void failed_set_add(failed_set *set, const keel__decision *decision) {
  for (int i = 0; i < decision->failed_count; i++) {
    bool known = false;
    for (int j = 0; j < set->count && !known; j++) known = set->uids[j] == decision->failed[i];
    if (!known && set->count < 256) set->uids[set->count++] = decision->failed[i];
  }
}

static void report_recovery(keel_ctx *ctx, const keel_recovery *recovery, const keel__decision *decision,
                            const failed_set *failed, int64_t detected_ns) {
  bool reporter = decision->sender != UINT32_MAX ? decision->sender == ctx->uid
                                                 : ctx->world->rank == 0;
  if (!reporter) return;
  char fields[1536];
  int used = snprintf(fields, sizeof fields,
                      "\"old_epoch\":%" PRIu64 ",\"new_epoch\":%" PRIu64
                      ",\"old_world\":%d,\"new_world\":%d,\"policy\":\"%s\",\"replaced\":%d,"
                      "\"restart_step\":%s,\"redo_minibatches\":%d,\"failed\":[",
                      recovery->old_epoch, recovery->new_epoch, recovery->old_size,
                      recovery->new_size, ctx->policy == KEEL__POLICY_REPLACE ? "replace" : "shrink",
                      recovery->replaced_count, recovery->restart_step ? "true" : "false",
                      decision->receiver_count > 0 || decision->grew ? 1 : 0);
  for (int i = 0; i < failed->count && used < (int)sizeof fields - 32; i++)
    used += snprintf(fields + used, sizeof fields - (size_t)used, i ? ",%" PRIu32 : "%" PRIu32,
                     failed->uids[i]);
  int64_t total = recovery->revoke_ns + recovery->agree_ns + recovery->rebuild_ns +
                  recovery->state_transfer_ns + recovery->redo_ns;
  snprintf(fields + used, sizeof fields - (size_t)used,
           "],\"detect_ms\":%.3f,\"revoke_ms\":%.3f,\"agree_ms\":%.3f,\"rebuild_ms\":%.3f,"
           "\"state_transfer_ms\":%.3f,\"redo_ms\":%.3f,\"total_ms\":%.3f,\"t_detect_ns\":%" PRId64,
           recovery->detect_ns / 1e6, recovery->revoke_ns / 1e6, recovery->agree_ns / 1e6,
           recovery->rebuild_ns / 1e6, recovery->state_transfer_ns / 1e6, recovery->redo_ns / 1e6,
           total / 1e6, detected_ns);
  keel__report_line(ctx, "recovery", fields);
}

/* One recovery round: revoke, agree, move to the decided epoch. */
static keel_status recover_once(keel_ctx *ctx, keel_recovery *recovery, keel__decision *decision,
                                bool *received_state_p) {
  keel_comm *comm = ctx->world;
  int64_t mark = keel_now_ns();
  keel_comm_revoke(comm);
  recovery->revoke_ns += keel_now_ns() - mark;
  mark = keel_now_ns();
  keel__contribution mine = {.flags = 1, .rebuild = true, .has_state = true,
                             .resilient_seq = ctx->resilient_seq, .grow = ctx->grow_requested};
  keel_status status = keel__agree(comm, &mine, decision);
  recovery->agree_ns += keel_now_ns() - mark;
  if (status != KEEL_OK) return status;
  mark = keel_now_ns();
  int64_t transfer_ns = 0;
  status = keel__apply_decision(ctx, decision, received_state_p, &transfer_ns);
  recovery->rebuild_ns += keel_now_ns() - mark - transfer_ns;
  recovery->state_transfer_ns += transfer_ns;
  ctx->grow_requested = false;
  recovery->replaced_count += decision->replaced_count;
  recovery->failed_count += decision->failed_count;
  return status;
}

keel_status keel_allreduce_resilient(keel_ctx *ctx, const void *send, void *recv, size_t count,
                                     keel_dtype dtype, keel_reduce_op op,
                                     keel_recovery *recovery_p) {
  keel_recovery recovery = {0};
  if (send == recv && count > 0) return KEEL_EINVAL;
  int64_t started = keel_now_ns();
  keel_status status = keel_comm_allreduce(ctx->world, send, recv, count, dtype, op);
  if (status == KEEL_OK) {
    ctx->resilient_seq++;
    if (recovery_p) *recovery_p = recovery;
    return KEEL_OK;
  }
  int64_t detected = keel_now_ns();
  recovery.detect_ns = detected - started;
  /* User-level JIT: the failure hooks have saved the state; the processes start again. */
  if (status == KEEL_ERESTART) {
    if (recovery_p) *recovery_p = recovery;
    return KEEL_ERESTART;
  }
  recovery.old_epoch = ctx->world->epoch;
  recovery.old_size = ctx->world->size;
  keel__decision decision;
  failed_set failed = {.count = 0};
  while (keel__recoverable(status)) {
    KEEL_LOG_I(MODULE, "allreduce failed in epoch %" PRIu64 " (%s): recovering",
               ctx->world->epoch, keel_strerror(status));
    bool received = false;
    status = recover_once(ctx, &recovery, &decision, &received);
    if (status == KEEL_OK) failed_set_add(&failed, &decision);
    if (status == KEEL_EEXCLUDED || (status != KEEL_OK && !keel__recoverable(status))) break;
    if (status != KEEL_OK) continue;
    recovery.recovered = true;
    recovery.new_epoch = ctx->world->epoch;
    recovery.new_size = ctx->world->size;
    if (received || decision.grew) {
      /* Our state was overwritten with a newer replica's, or the world grew: the step is
       * redone from the registered state instead of completing this allreduce. */
      recovery.restart_step = true;
      break;
    }
    int64_t mark = keel_now_ns();
    status = keel_comm_allreduce(ctx->world, send, recv, count, dtype, op);
    recovery.redo_ns += keel_now_ns() - mark;
    if (status == KEEL_OK) ctx->resilient_seq++;
  }
  if (status == KEEL_OK) {
    report_recovery(ctx, &recovery, &decision, &failed, detected);
    if (ctx->step_known) keel_mark_resume(ctx, ctx->current_step, "in-process");
  }
  if (recovery_p) *recovery_p = recovery;
  return status;
}
