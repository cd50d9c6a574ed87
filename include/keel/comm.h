/* keel comm: the process's runtime context and its communicator. Collectives that
 * complete or fail with KEEL_EPROCFAILED / KEEL_EREVOKED / KEEL_ETIMEDOUT, never hang past
 * their deadline; ULFM's revoke, agree and shrink; grow and replacement by spares; and the
 * forward-recovery helper that redoes a failed allreduce (ULFM elastic paper, 3.1-3.3).
 * Depends on core, net and store. The launcher's contract with this layer is in
 * docs/RUNTIME.md (environment variables, store keys, status lines). */
#ifndef KEEL_COMM_H
#define KEEL_COMM_H

#include "keel/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_ctx keel_ctx;
typedef struct keel_comm keel_comm;

typedef enum keel_dtype {
  KEEL_F32 = 0,
  KEEL_F64 = 1,
  KEEL_I32 = 2,
  KEEL_I64 = 3,
  KEEL_BF16 = 4, /* bfloat16 (uint16_t bits); reduced with f32 accumulation, rounded to
                    nearest even on the way back */
} keel_dtype;

typedef enum keel_reduce_op {
  KEEL_SUM = 0,
  KEEL_AVG = 1, /* sum, then divided by the communicator's size (integer division for ints) */
  KEEL_MAX = 2,
} keel_reduce_op;

size_t keel_dtype_size(keel_dtype dtype);

/* ---- the process's runtime. */

/* Joins the job described by the environment `keel run` sets (docs/RUNTIME.md): connects
 * to the store, listens, takes a lease that is this process's heartbeat, and links with
 * every other process of the job. Does not block on other workers beyond connecting. The
 * caller owns *ctx_p and ends it with keel_finalize. */
keel_status keel_init(keel_ctx **ctx_p);

/* Registers a buffer of training state (parameters, optimizer state, step counter, data
 * position, RNG) that a newcomer receives from a survivor. Call in the same order with the
 * same sizes in every process, before keel_start. The memory stays the caller's. */
keel_status keel_state_register(keel_ctx *ctx, const char *name, void *data, size_t bytes);

/* Starts training. A worker returns at once. A spare or a joiner blocks until it is given a
 * rank (then its registered state has been overwritten with a survivor's) or the job ends
 * (KEEL_EJOBDONE: exit 0). */
keel_status keel_start(keel_ctx *ctx);

/* The current communicator (it changes after a recovery); owned by ctx. */
keel_comm *keel_world(keel_ctx *ctx);
/* true if this process received its state from a survivor in keel_start. */
bool keel_is_newcomer(const keel_ctx *ctx);

/* Exit code of a worker that leaves because the job restarts (KEEL_ERESTART): the launcher
 * counts it as a healthy process that saved its state, not as a failure (EX_TEMPFAIL). */
#define KEEL_EXIT_RESTART 75

/* The registered state, for a checkpoint engine: buffer index (< keel_state_count) in the
 * order of registration. *name_p stays valid until keel_finalize. KEEL_ERANGE past the end. */
size_t keel_state_count(const keel_ctx *ctx);
keel_status keel_state_get(const keel_ctx *ctx, size_t index, const char **name_p, void **data_p,
                           size_t *bytes_p);
/* The job's id (KEEL_JOB_ID; 1 for a standalone world of one). */
uint64_t keel_job_id(const keel_ctx *ctx);
/* How many times the launcher has restarted the job's processes before this one started
 * (KEEL_RESTART; 0 in the first incarnation). */
uint32_t keel_restart_count(const keel_ctx *ctx);
/* The step keel_step last marked; false when none was marked yet. */
bool keel_current_step(const keel_ctx *ctx, uint64_t *step_p);

/* What the runtime knows when a collective first fails in an epoch. */
typedef struct keel_failure {
  keel_status cause;  /* KEEL_EPROCFAILED, KEEL_EREVOKED or KEEL_ETIMEDOUT */
  uint64_t step;      /* the step keel_step last marked (the minibatch in progress) */
  bool step_known;    /* false when keel_step was never called */
  uint64_t epoch;     /* of the communicator that failed */
  bool in_process;    /* the runtime recovers inside this process (KEEL_ON_FAILURE shrink or
                         replace); false: the job restarts its processes (restart), so this
                         process must save what it needs now and exit */
  int64_t failed_ns;  /* when the collective returned the error (CLOCK_MONOTONIC) */
} keel_failure;
/* Called in the thread of the failing collective, after the communicator is revoked (so
 * every member learns of the failure at once) and before any recovery, at most once per
 * epoch. The training thread is inside the collective: registered state is the step's
 * starting state (the optimizer has not run) and stays still during the hook. A hook must
 * not call collectives. */
typedef void (*keel_failure_hook)(void *arg, const keel_failure *failure);
/* Adds a hook (at most 4; called in the order added). KEEL_ERANGE when full. With
 * KEEL_ON_FAILURE=restart every collective that fails so returns KEEL_ERESTART once the
 * hooks have run. */
keel_status keel_on_failure(keel_ctx *ctx, keel_failure_hook hook, void *arg);

/* Says that the registered state was just put back to the start of step (a restore after
 * a restart): when the minibatch of that step completes (keel_step of a later step), rank 0
 * reports a `resumed` event, the end of the recovery as the JIT paper's Table 7 counts it.
 * The resilient allreduce marks its recoveries the same way by itself. */
void keel_mark_resume(keel_ctx *ctx, uint64_t step, const char *kind);

/* Marks the start of a training step: fault-injection points (KEEL_FAULT) fire here, and
 * joiners waiting to grow the job are noticed. Cheap (no communication in steady state). */
keel_status keel_step(keel_ctx *ctx, uint64_t step);
/* A named fault-injection point inside the user's step ("forward", "optimizer") or a
 * checkpoint engine's ("save", "saved"): fires a KEEL_FAULT rule whose point= names it.
 * Returns true when a `corrupt` rule fired: the caller damages what it has just written
 * (points that write nothing ignore it). */
bool keel_fault_point(keel_ctx *ctx, const char *point);
/* Reports progress to the launcher's status line (rank 0's reports are shown). Never
 * blocks and never fails the caller. */
void keel_report(keel_ctx *ctx, uint64_t step, double loss, double samples_per_second);
/* Writes one event line to the launcher's event log: {"event":event, uid, rank, epoch,
 * t_ns, json_fields} where json_fields (may be NULL; under 3 KiB) are the object's other
 * members without braces. event: 1..31 characters of [a-z0-9_]. */
void keel_report_event(keel_ctx *ctx, const char *event, const char *json_fields);

/* Leaves the job in order: tells peers this is a goodbye, not a failure, drops the lease
 * and frees ctx. NULL is allowed. */
void keel_finalize(keel_ctx *ctx);

/* ---- the communicator. Handles are owned by ctx; a handle of an old epoch stays valid
 * (its operations fail with KEEL_EREVOKED) until keel_finalize. Operations are called by
 * one thread. Every operation waits at most the communicator's deadline (KEEL_TIMEOUT,
 * default 30 s). */
int keel_comm_rank(const keel_comm *comm);
int keel_comm_size(const keel_comm *comm);
uint64_t keel_comm_epoch(const keel_comm *comm);
/* The uid (job-wide process id) of a rank. */
uint32_t keel_comm_uid(const keel_comm *comm, int rank);
void keel_comm_set_timeout(keel_comm *comm, int64_t timeout_ns);
/* How this communicator's collectives move data: "shm" (shared memory, every rank on this
 * host), "tcp" (the links), or "self" (a world of one). Shared memory is set up by the first
 * collective of an epoch; before it, "tcp". KEEL_TRANSPORT=tcp in the environment turns
 * shared memory off. */
const char *keel_comm_transport(const keel_comm *comm);

/* send may equal recv (in place). Out of place, send is never written, which is what lets
 * the resilient helper redo the operation. The result is bit-for-bit identical at every
 * rank and from run to run: the order of reduction depends only on rank and size. */
keel_status keel_comm_allreduce(keel_comm *comm, const void *send, void *recv, size_t count,
                                keel_dtype dtype, keel_reduce_op op);
keel_status keel_comm_broadcast(keel_comm *comm, void *buffer, size_t bytes, int root);
/* recv holds size * bytes_per_rank bytes, rank r's contribution at offset r*bytes_per_rank. */
keel_status keel_comm_allgather(keel_comm *comm, const void *send, void *recv,
                                size_t bytes_per_rank);
/* send holds size * count_per_rank elements; rank r receives the reduction of block r. */
keel_status keel_comm_reduce_scatter(keel_comm *comm, const void *send, void *recv,
                                     size_t count_per_rank, keel_dtype dtype, keel_reduce_op op);
keel_status keel_comm_barrier(keel_comm *comm);

/* Revokes the communicator: every pending and later operation on its epoch fails with
 * KEEL_EREVOKED at every member (a reliable broadcast of the mark). Idempotent. */
keel_status keel_comm_revoke(keel_comm *comm);

/* Fault-tolerant agreement: every surviving member returns the same *flags (the bitwise AND
 * of the survivors' inputs) and the same failed set, even if members fail during it.
 * failed_uids (optional, capacity entries) receives the uids of members that failed, and
 * *failed_count_p their number. Works on a revoked communicator. */
keel_status keel_comm_agree(keel_comm *comm, uint32_t *flags, uint32_t *failed_uids,
                            size_t capacity, size_t *failed_count_p);

/* Builds the communicator of the next epoch from the survivors, ranks in their old order,
 * and makes it the world. *new_p is owned by ctx. */
keel_status keel_comm_shrink(keel_comm *comm, keel_comm **new_p);
/* Like shrink, and admits idle spares and waiting joiners (up to the job's maximum world);
 * the lowest surviving rank sends them the registered state. Call at a step boundary, at
 * every member. */
keel_status keel_comm_grow(keel_comm *comm, keel_comm **new_p);

/* ---- forward recovery (ULFM elastic paper 3.2, 3.3). */
typedef struct keel_recovery {
  bool recovered;     /* a failure happened and was recovered during this call */
  bool restart_step;  /* the registered state was replaced or the world grew: redo the step
                         from the (new) state instead of applying this result */
  uint64_t old_epoch, new_epoch;
  int old_size, new_size;
  int failed_count;
  int replaced_count; /* failed ranks taken over by spares */
  /* Time broken down, nanoseconds. */
  int64_t detect_ns, revoke_ns, agree_ns, rebuild_ns, state_transfer_ns, redo_ns;
} keel_recovery;

/* Allreduce that survives failures: on KEEL_EPROCFAILED, KEEL_EREVOKED or KEEL_ETIMEDOUT it
 * revokes, agrees, rebuilds the communicator by the job's policy (shrink; or replace, where
 * spares take the failed ranks and receive the state) and redoes the same allreduce with
 * the survivors' contributions (and the newcomers'), until it succeeds, so the step goes
 * on without rollback. send must differ from recv and stay unchanged during the call.
 * Returns KEEL_EEXCLUDED if this process was declared failed. With KEEL_ON_FAILURE=restart
 * (user-level JIT checkpoints) it does not recover: it revokes, runs the failure hooks (which
 * save the state) and returns KEEL_ERESTART; the process should then exit with
 * KEEL_EXIT_RESTART and the launcher starts the job's processes again. *recovery_p is
 * optional. */
keel_status keel_allreduce_resilient(keel_ctx *ctx, const void *send, void *recv, size_t count,
                                     keel_dtype dtype, keel_reduce_op op,
                                     keel_recovery *recovery_p);

#ifdef __cplusplus
}
#endif
#endif
