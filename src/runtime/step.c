/* Step transactions: keel_step_begin ... collectives ... keel_step_commit. A collective of
 * the step that fails goes to the recovery engine; afterwards the same collective is redone
 * in the new world (forward recovery) or the caller is told to begin the step again
 * (KEEL_EREDO), with the registered state at the step's start. Commit is where checkpoint
 * policies act and where joiners are admitted. This file owns what the runtime knows of the
 * step and of the state's version. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_internal.h"

#define MODULE "step"

struct keel__step {
  bool open;
  bool known;
  uint64_t step;
  uint32_t collectives_done; /* of the open step */
  uint64_t version;          /* the step the registered state is at the start of */
  bool has_state;
  bool undo_enabled;
  uint8_t *undo; /* a copy of the registered state at keel_step_begin */
  size_t undo_bytes;
  keel_commit_hook hooks[KEEL_MAX_HOOKS];
  void *hook_args[KEEL_MAX_HOOKS];
  int hook_count;
  keel_step_observer observers[KEEL_MAX_HOOKS];
  void *observer_args[KEEL_MAX_HOOKS];
  int observer_count;
};

static void marks_send(const keel__step *step, keel_step_mark mark) {
  if (step->observer_count == 0) return;
  int64_t now = keel_now_ns();
  for (int i = 0; i < step->observer_count; i++)
    step->observers[i](step->observer_args[i], mark, step->step, step->collectives_done, now);
}

keel_status keel_on_step_mark(keel_ctx *ctx, keel_step_observer observer, void *arg) {
  keel__step *step = ctx->step;
  if (observer == NULL) return KEEL_EINVAL;
  if (step->observer_count == KEEL_MAX_HOOKS) return KEEL_ERANGE;
  step->observers[step->observer_count] = observer;
  step->observer_args[step->observer_count] = arg;
  step->observer_count++;
  return KEEL_OK;
}

keel_status keel__step_create(keel__step **step_p) {
  keel__step *step = calloc(1, sizeof *step);
  if (step == NULL) return KEEL_ENOMEM;
  step->has_state = true;
  *step_p = step;
  return KEEL_OK;
}

void keel__step_destroy(keel__step *step) {
  if (step == NULL) return;
  free(step->undo);
  free(step);
}

bool keel_current_step(const keel_ctx *ctx, uint64_t *step_p) {
  if (ctx->step->known && step_p) *step_p = ctx->step->step;
  return ctx->step->known;
}

void keel__step_state_set(keel__step *step, uint64_t version, bool has_state) {
  step->version = version;
  step->has_state = has_state;
}

bool keel__step_state_held(const keel__step *step) { return step->has_state; }

void keel__step_position(keel_ctx *ctx, keel__redo_kind redo, keel__position *position) {
  const keel__step *step = ctx->step;
  keel_comm *world = keel_world(ctx);
  uint32_t shards = ctx->shard_count ? ctx->shard_count : 1;
  int rank = world ? keel_comm_rank(world) : 0;
  *position = (keel__position){
      .has_state = step->has_state,
      .version = step->version,
      .shard = rank >= 0 ? (uint32_t)rank % shards : 0,
      .shards = shards,
      .in_step = step->open,
      .step = step->step,
      .collective = step->collectives_done,
      .redo = step->open ? redo : KEEL__REDO_NONE,
  };
}

keel_status keel_on_commit(keel_ctx *ctx, keel_commit_hook hook, void *arg) {
  keel__step *step = ctx->step;
  if (hook == NULL) return KEEL_EINVAL;
  if (step->hook_count == KEEL_MAX_HOOKS) return KEEL_ERANGE;
  step->hooks[step->hook_count] = hook;
  step->hook_args[step->hook_count] = arg;
  step->hook_count++;
  return KEEL_OK;
}

/* ---- the undo copy */

keel_status keel_step_undo(keel_ctx *ctx, bool enabled) {
  keel__step *step = ctx->step;
  step->undo_enabled = enabled;
  if (!enabled) return KEEL_OK;
  keel_status status = keel__registry_copy_fit(ctx->registry, &step->undo, &step->undo_bytes);
  if (status != KEEL_OK) step->undo_enabled = false;
  return status;
}

/* Copies the registered state into the undo buffer (to == false) or back (to == true). */
static void undo_copy(keel_ctx *ctx, bool back) {
  keel__registry_copy(ctx->registry, ctx->step->undo, ctx->step->undo_bytes, back);
}

/* Only inside an open step: after a commit the registered state is the next step's start. */
void keel__step_undo_restore(keel_ctx *ctx) {
  keel__step *step = ctx->step;
  if (step->open && step->undo_enabled && step->undo != NULL) undo_copy(ctx, true);
}

/* ---- the transaction */

/* A stop or a lost launcher ends the step: the hooks save, the caller exits. */
static keel_status step_interrupted(keel_ctx *ctx, keel_status cause) {
  keel__failure_hooks_run(ctx, cause, false);
  keel__leaving_message(ctx, cause);
  return cause;
}

static bool is_interruption(keel_status status) {
  return status == KEEL_ESTOPPED || status == KEEL_EORPHANED || status == KEEL_EEXCLUDED ||
         status == KEEL_EJOBDONE;
}

static bool is_recoverable(keel_status status) {
  return status == KEEL_EPROCFAILED || status == KEEL_EREVOKED || status == KEEL_ETIMEDOUT;
}

keel_status keel_step_begin(keel_ctx *ctx, uint64_t step_number) {
  keel__step *step = ctx->step;
  keel_status status = keel__interruption(ctx);
  if (status != KEEL_OK) return step_interrupted(ctx, status);
  step->open = true;
  step->known = true;
  step->step = step_number;
  step->collectives_done = 0;
  step->version = step_number; /* by contract the registered state is this step's start */
  keel__watchdog_step_begin(ctx);
  keel_fault_plan_set_step(ctx->faults, step_number);
  if (keel_fault_plan_fire(ctx->faults, "step", 0)) keel__verify_bitflip(ctx, step_number);
  if (step->undo_enabled) undo_copy(ctx, false);
  marks_send(step, KEEL_STEP_BEGIN);
  return KEEL_OK;
}

/* One collective of a step, as data: what to run and what a redo of it allows. */
typedef enum operation_kind { OPERATION_ALLREDUCE, OPERATION_REDUCE_SCATTER,
                              OPERATION_ALLGATHER, OPERATION_BROADCAST } operation_kind;

typedef struct step_operation {
  operation_kind kind;
  const void *send;
  void *recv;
  size_t count; /* elements (allreduce, per rank for reduce-scatter) or bytes */
  keel_dtype dtype;
  keel_reduce_op op;
  int root;
} step_operation;

static keel_status operation_run(keel_comm *comm, const step_operation *operation) {
  switch (operation->kind) {
    case OPERATION_ALLREDUCE:
      return keel_comm_allreduce(comm, operation->send, operation->recv, operation->count,
                                 operation->dtype, operation->op);
    case OPERATION_REDUCE_SCATTER:
      return keel_comm_reduce_scatter(comm, operation->send, operation->recv, operation->count,
                                      operation->dtype, operation->op);
    case OPERATION_ALLGATHER:
      return keel_comm_allgather(comm, operation->send, operation->recv, operation->count);
    case OPERATION_BROADCAST:
      return keel_comm_broadcast(comm, operation->recv, operation->count, operation->root);
  }
  return KEEL_EINVAL;
}

static bool ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
  const uint8_t *left = a, *right = b;
  return left < right + b_bytes && right < left + a_bytes;
}

/* What a redo of the failed operation needs: its input must have survived it (out of place);
 * reduce-scatter and allgather lay their buffers out by the world's size. */
static keel__redo_kind operation_redo(const keel_comm *comm, const step_operation *operation) {
  size_t element = keel_dtype_size(operation->dtype);
  size_t size = (size_t)keel_comm_size(comm);
  switch (operation->kind) {
    case OPERATION_ALLREDUCE:
      return operation->send != operation->recv || operation->count == 0 ? KEEL__REDO_ANY_SIZE
                                                                         : KEEL__REDO_NONE;
    case OPERATION_REDUCE_SCATTER:
      return ranges_overlap(operation->send, operation->count * element * size, operation->recv,
                            operation->count * element)
                 ? KEEL__REDO_NONE
                 : KEEL__REDO_SAME_SIZE;
    case OPERATION_ALLGATHER:
      return ranges_overlap(operation->send, operation->count, operation->recv,
                            operation->count * size)
                 ? KEEL__REDO_NONE
                 : KEEL__REDO_SAME_SIZE;
    case OPERATION_BROADCAST:
      return KEEL__REDO_NONE; /* a root that died took the data with it */
  }
  return KEEL__REDO_NONE;
}

static keel_status step_collective(keel_ctx *ctx, const step_operation *operation) {
  keel__step *step = ctx->step;
  if (!step->open) {
    KEEL_LOG_E(MODULE, "a step collective outside a step: call keel_step_begin first");
    return KEEL_EINVAL;
  }
  int64_t redo_started = 0;
  for (;;) {
    keel_comm *world = keel_world(ctx);
    keel__redo_kind redo = operation_redo(world, operation);
    int64_t started = keel_now_ns();
    marks_send(step, KEEL_STEP_COLLECTIVE_BEGIN);
    keel_status status = operation_run(world, operation);
    if (status == KEEL_OK) {
      marks_send(step, KEEL_STEP_COLLECTIVE_END);
      /* The first collective that succeeds in a new world ends the recovery before it. */
      keel__recovery_report(ctx, redo_started != 0 ? keel_now_ns() - redo_started : 0);
      step->collectives_done++;
      return KEEL_OK;
    }
    if (is_interruption(status)) return step_interrupted(ctx, status);
    if (!is_recoverable(status)) return status;
    bool redo_step = false;
    status = keel__recover(ctx, status, redo, started, &redo_step);
    if (is_interruption(status)) return step_interrupted(ctx, status);
    if (status != KEEL_OK) return status;
    if (redo_step) {
      step->collectives_done = 0;
      return KEEL_EREDO;
    }
    redo_started = keel_now_ns(); /* forward recovery: the same collective, new world */
  }
}

keel_status keel_step_allreduce(keel_ctx *ctx, const void *send, void *recv, size_t count,
                                keel_dtype dtype, keel_reduce_op op) {
  step_operation operation = {.kind = OPERATION_ALLREDUCE, .send = send, .recv = recv,
                              .count = count, .dtype = dtype, .op = op};
  return step_collective(ctx, &operation);
}

keel_status keel_step_reduce_scatter(keel_ctx *ctx, const void *send, void *recv,
                                     size_t count_per_rank, keel_dtype dtype, keel_reduce_op op) {
  step_operation operation = {.kind = OPERATION_REDUCE_SCATTER, .send = send, .recv = recv,
                              .count = count_per_rank, .dtype = dtype, .op = op};
  return step_collective(ctx, &operation);
}

keel_status keel_step_allgather(keel_ctx *ctx, const void *send, void *recv,
                                size_t bytes_per_rank) {
  step_operation operation = {.kind = OPERATION_ALLGATHER, .send = send, .recv = recv,
                              .count = bytes_per_rank, .dtype = KEEL_I32};
  return step_collective(ctx, &operation);
}

keel_status keel_step_broadcast(keel_ctx *ctx, void *buffer, size_t bytes, int root) {
  step_operation operation = {.kind = OPERATION_BROADCAST, .recv = buffer, .count = bytes,
                              .dtype = KEEL_I32, .root = root};
  return step_collective(ctx, &operation);
}

keel_status keel_allreduce_resilient(keel_ctx *ctx, const void *send, void *recv, size_t count,
                                     keel_dtype dtype, keel_reduce_op op,
                                     keel_recovery *recovery_p) {
  if (send == recv && count > 0) return KEEL_EINVAL;
  keel_recovery last;
  uint64_t before = keel_last_recovery(ctx, &last);
  keel_status status = keel_step_allreduce(ctx, send, recv, count, dtype, op);
  if (recovery_p != NULL) {
    bool recovered = keel_last_recovery(ctx, &last) != before;
    if (recovered) *recovery_p = last;
    else memset(recovery_p, 0, sizeof *recovery_p);
  }
  return status;
}

/* A collective after a commit failed: the step is committed at every survivor, so the
 * recovery moves the committed state (to a member still in the step, or a spare), and the
 * next step begins in the new world whatever the plan says of redoing this one. */
static keel_status committed_collective_failed(keel_ctx *ctx, keel_status status,
                                               int64_t started_ns) {
  if (is_interruption(status)) return step_interrupted(ctx, status);
  if (!is_recoverable(status)) return status;
  bool redo_step = false;
  status = keel__recover(ctx, status, KEEL__REDO_NONE, started_ns, &redo_step);
  if (is_interruption(status)) return step_interrupted(ctx, status);
  return status;
}

/* Rank 0's count of who may join: the joiners below --max-world, and the idle spares while a
 * replace world is below its size (its session counts them only then). */
static int32_t newcomers_waiting(keel_ctx *ctx, int size, int refill) {
  int32_t waiting = 0;
  if (size < ctx->config.max_world) waiting += keel__session_joiners_waiting(ctx->session);
  if (size < refill) waiting += keel__session_spares_waiting(ctx->session);
  return waiting;
}

/* When the world may grow, rank 0 says at every commit how many joiners (or, in a replace
 * world that shrank, idle spares) wait: a 4-byte broadcast, so that every member decides at
 * the same step boundary; if any, the members agree on a world with them and the survivors
 * give them the committed state. */
static keel_status commit_grow(keel_ctx *ctx) {
  keel_comm *world = keel_world(ctx);
  if (ctx->config.standalone) return KEEL_OK;
  int size = keel_comm_size(world), refill = keel__refill_world(ctx);
  bool first = keel_comm_rank(world) == 0;
  keel__session_want_spares(ctx->session, first && size < refill);
  if (size >= ctx->config.max_world && size >= refill) return KEEL_OK;
  int32_t waiting = first ? newcomers_waiting(ctx, size, refill) : 0;
  int64_t started = keel_now_ns();
  keel_status status = keel_comm_broadcast(world, &waiting, sizeof waiting, 0);
  if (status == KEEL_OK) keel__recovery_report(ctx, 0);
  if (status == KEEL_OK) return waiting > 0 ? keel__grow(ctx) : KEEL_OK;
  return committed_collective_failed(ctx, status, started);
}

keel_status keel_step_commit(keel_ctx *ctx) {
  keel__step *step = ctx->step;
  if (!step->open) return KEEL_EINVAL;
  /* Before the hooks: a checkpoint policy must not keep a state the replicas disagree on. */
  bool rolled_back = false;
  keel_status verified = keel__verify_commit(ctx, step->step + 1, &rolled_back);
  if (verified != KEEL_OK) return verified;
  if (rolled_back) {
    /* The registered state (the program's step counter with it) is at a verified step
     * again, whose hooks ran when it was committed the first time. */
    step->open = false;
    keel__finish_note(ctx, step->version);
    return commit_grow(ctx);
  }
  for (int i = 0; i < step->hook_count; i++) {
    keel_status status = step->hooks[i](step->hook_args[i], step->step);
    if (status != KEEL_OK)
      KEEL_LOG_W(MODULE, "a commit hook failed at step %" PRIu64 ": %s", step->step,
                 keel_strerror(status));
  }
  step->open = false;
  step->version = step->step + 1;
  step->has_state = true;
  keel__commit_note(ctx, step->step);
  keel__waits_late_report(ctx);
  keel__finish_note(ctx, step->version);
  keel__resume_committed(ctx, step->step);
  return commit_grow(ctx);
}

/* A barrier: a member passes it only once every member has entered it, after its last
 * commit, so a member that then fails it (a peer died in it) already holds the final state. */
keel_status keel_finish(keel_ctx *ctx) {
  if (ctx == NULL) return KEEL_EINVAL;
  int64_t started = keel_now_ns();
  keel_status status = keel_comm_barrier(keel_world(ctx));
  if (status == KEEL_OK) {
    keel__recovery_report(ctx, 0);
    return KEEL_OK;
  }
  status = committed_collective_failed(ctx, status, started);
  return status == KEEL_OK ? KEEL_EREDO : status;
}
