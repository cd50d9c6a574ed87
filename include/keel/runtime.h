/* keel runtime: the process's membership in the job. It joins from the environment that
 * `keel run` sets (docs/RUNTIME.md), holds the store session and the lease that is the
 * process's heartbeat, keeps the one failure detector, reports events, owns the one registry
 * of training state, frames each iteration as a step transaction, and recovers from failures
 * by policy (shrink, replace, restart) over one recovery engine, with state from a state
 * source (a survivor, a checkpoint tier, or none). Never exits the process, never changes
 * its signal handling, never waits without a deadline. Depends on comm and below. */
#ifndef KEEL_RUNTIME_H
#define KEEL_RUNTIME_H

#include "keel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_ctx keel_ctx;

/* ---- exit codes a worker leaves with, which `keel run` reads (docs/RUNTIME.md). */
/* KEEL_ERESTART: the state was saved; the launcher restarts the job (EX_TEMPFAIL). */
#define KEEL_EXIT_RESTART 75
/* KEEL_EORPHANED: the launcher is gone; the state was saved where a policy keeps it. */
#define KEEL_EXIT_ORPHANED 76
/* KEEL_ESTOPPED: `keel run` was interrupted and asked for an orderly stop. */
#define KEEL_EXIT_STOPPED 77
/* The exit code that goes with a status a training loop ends on: 0 for KEEL_OK,
 * KEEL_EJOBDONE and KEEL_EEXCLUDED (the job went on without this process), the codes above,
 * 1 for anything else. */
int keel_exit_code(keel_status status);

/* ---- the state registry: named buffers of training state (parameters, optimizer state,
 * step, data position, RNG) in the order they were added. One registry serves recovery
 * (what a newcomer receives), checkpoints and the bindings. The memory stays the caller's,
 * alive and unmoved while the registry is used. Not thread-safe: add at setup. */
typedef struct keel_registry keel_registry;

typedef struct keel_state_buffer {
  char name[KEEL_STATE_NAME_MAX + 1];
  void *data;
  size_t bytes;
} keel_state_buffer;

/* An empty registry with room for KEEL_MAX_STATE_BUFFERS (allocated now, so that nothing
 * is allocated after a failure). The caller frees it with keel_registry_destroy. */
keel_status keel_registry_create(keel_registry **registry_p);
void keel_registry_destroy(keel_registry *registry);
/* name: 1..KEEL_STATE_NAME_MAX printable ASCII bytes but space, unique; copied. data may be
 * NULL only when bytes is 0. KEEL_EINVAL for a bad name or pointer, KEEL_EEXIST for a
 * duplicate name, KEEL_ERANGE past KEEL_MAX_STATE_BUFFERS or a total past 2^64. */
keel_status keel_registry_add(keel_registry *registry, const char *name, void *data,
                              size_t bytes);
size_t keel_registry_count(const keel_registry *registry);
/* Sum of the registered sizes. */
uint64_t keel_registry_bytes(const keel_registry *registry);
/* Buffer index (< count), or NULL past the end. Valid while the registry lives. */
const keel_state_buffer *keel_registry_entry(const keel_registry *registry, size_t index);
/* Marks the buffer called name as each process's own: state that moves with the rest (a
 * newcomer receives it, a checkpoint holds it) but that replicas need not hold alike, such
 * as random streams each process seeded for itself. The replicas' checksums (--verify-replicas)
 * and the final state's (KEEL_FINISH_CRC) leave it out. KEEL_ENOTFOUND for an unknown name. */
keel_status keel_registry_mark_per_process(keel_registry *registry, const char *name);
/* Whether buffer index (< count) is marked each process's own. */
bool keel_registry_per_process(const keel_registry *registry, size_t index);
/* Whether name is a valid buffer name. */
bool keel_state_name_valid(const char *name, size_t length);

/* ---- the process */

/* Joins the job described by the environment `keel run` sets: connects to the store, takes
 * the lease, listens, and links with every other worker. Without KEEL_STORE in the
 * environment it makes a world of one, so a training program also runs by itself. The
 * caller owns *ctx_p and ends it with keel_finalize. */
keel_status keel_init(keel_ctx **ctx_p);
/* Adds a buffer of training state to the process's registry (keel_registry_add's rules).
 * Call in the same order with the same sizes in every process, before keel_start. */
keel_status keel_state_register(keel_ctx *ctx, const char *name, void *data, size_t bytes);
/* Hybrid sharding (JIT paper §3.1): the registered state is one of count shards, and rank r
 * holds shard r % count (ranks r, r+count, ... are its replicas). A newcomer then receives
 * its shard from a survivor that holds the same one. Default 1: every rank holds it all. */
keel_status keel_state_shard(keel_ctx *ctx, uint32_t count);
uint32_t keel_state_shards(const keel_ctx *ctx);
/* The process's registry (owned by ctx). */
keel_registry *keel_state(keel_ctx *ctx);

/* Starts training. A worker returns at once. A spare or a joiner blocks until it is given a
 * rank (then its registered state holds a survivor's) or the job ends (KEEL_EJOBDONE: exit
 * 0); KEEL_ESTOPPED / KEEL_EORPHANED as for a step. */
keel_status keel_start(keel_ctx *ctx);

/* The current communicator (it changes with every recovery); owned by ctx. */
keel_comm *keel_world(keel_ctx *ctx);
/* true if this process received its state from a survivor in keel_start. */
bool keel_is_newcomer(const keel_ctx *ctx);
/* The job's id (KEEL_JOB_ID; 1 for a world of one). */
uint64_t keel_job_id(const keel_ctx *ctx);
/* How many times the launcher restarted the job before this process's incarnation. */
uint32_t keel_restart_count(const keel_ctx *ctx);
/* The old job's checkpoint folder this job resumes from (`keel run --resume DIR`), or NULL. */
const char *keel_resume_directory(const keel_ctx *ctx);
/* The step of the open (or last) transaction; false when none began yet. */
bool keel_current_step(const keel_ctx *ctx, uint64_t *step_p);

/* ---- failures and commits: where checkpoint policies hook in. */

/* What the runtime knows when a step first fails in an epoch, or must stop. */
typedef struct keel_failure {
  keel_status cause;  /* KEEL_EPROCFAILED, KEEL_EREVOKED, KEEL_ETIMEDOUT; or KEEL_ESTOPPED
                         (orderly stop), KEEL_EORPHANED (launcher gone) */
  uint64_t step;      /* the step in progress */
  bool step_known;    /* false when no step began yet */
  uint64_t epoch;     /* of the communicator that failed */
  bool in_process;    /* the runtime recovers inside this process; false: this process must
                         save what it needs now and exit (restart, stop, launcher gone) */
  int64_t failed_ns;  /* when the failure was seen (CLOCK_MONOTONIC) */
} keel_failure;
/* Called in the training thread, after the communicator is revoked (every member learns of
 * the failure at once) and before any recovery, at most once per epoch (once for a stop).
 * Registered state is the step's starting state and stays still during the hook. A hook
 * must not call collectives. */
typedef void (*keel_failure_hook)(void *arg, const keel_failure *failure);
/* Adds a hook (KEEL_MAX_HOOKS at most, called in the order added). */
keel_status keel_on_failure(keel_ctx *ctx, keel_failure_hook hook, void *arg);
/* A hook that saved the state says where (a folder), for the line the runtime prints when
 * the process must exit; copied. */
void keel_note_saved(keel_ctx *ctx, const char *where);
/* Called by keel_step_commit once the step's state is final (the optimizer ran), before the
 * next step begins: a checkpoint policy's moment. step is the step that committed. */
typedef keel_status (*keel_commit_hook)(void *arg, uint64_t step);
keel_status keel_on_commit(keel_ctx *ctx, keel_commit_hook hook, void *arg);

/* Where the time of a step goes, for a policy that schedules its own traffic around the
 * job's (Gemini §5.4 profiles the collectives' timeline): called in the training thread at
 * keel_step_begin and at the start and the successful end of each step collective, with
 * the step, the collective's index in it (0 for the begin) and CLOCK_MONOTONIC. Must not
 * block or call collectives. */
typedef enum keel_step_mark {
  KEEL_STEP_BEGIN,
  KEEL_STEP_COLLECTIVE_BEGIN,
  KEEL_STEP_COLLECTIVE_END,
} keel_step_mark;
typedef void (*keel_step_observer)(void *arg, keel_step_mark mark, uint64_t step, uint32_t index,
                                   int64_t now_ns);
/* Adds an observer (KEEL_MAX_HOOKS at most). */
keel_status keel_on_step_mark(keel_ctx *ctx, keel_step_observer observer, void *arg);

/* ---- state sources: where a rank that lacks the state gets it. Survivors come first (a
 * live replica sends it, chosen from what each reports it holds); a checkpoint tier is
 * asked when no survivor holds a shard; none (shrink) needs nothing. */
typedef struct keel_state_source_ops {
  const char *name; /* "persistent", "memory", ... */
  /* Overwrites the registered buffers with the state of shard index of count at the start
   * of step (exactly), or returns KEEL_ENOTFOUND leaving them as they were. */
  keel_status (*restore)(void *context, keel_registry *registry, uint32_t index, uint32_t count,
                         uint64_t step);
  /* Optional (NULL: none). The newest step at or below max_step of which the tier can give
   * shard index of count, or KEEL_ENOTFOUND. When no tier has a lost shard at the job's
   * step, the member that needs it says so with this step, and the job rolls back to the
   * lowest step so named: every member, survivors included, restores that step from the
   * tiers (Gemini §6: a failure during a snapshot's transfer restores the one before). */
  keel_status (*newest)(void *context, uint32_t index, uint32_t count, uint64_t max_step,
                        uint64_t *step_p);
} keel_state_source_ops;
/* Adds a tier (KEEL_MAX_STATE_SOURCES at most, asked in the order added); ops is not
 * copied and must outlive ctx. */
keel_status keel_state_source_add(keel_ctx *ctx, const keel_state_source_ops *ops, void *context);

/* ---- step transactions. A step is
 *     keel_step_begin(ctx, step);  ... keel_step_allreduce / _reduce_scatter / _allgather /
 *     _broadcast, any number ...  [optimizer];  keel_step_commit(ctx);
 * When a collective of the step fails, the runtime recovers by the job's policy. Then either
 * the collective is redone in the new world and returns KEEL_OK (forward recovery, ULFM
 * §3.2: every member was at that collective and nobody lacked state), or it returns
 * KEEL_EREDO: the registered state is the step's starting state (put back from the undo
 * copy when there is one) and the caller begins the same step again. Under replace the end
 * is bit-identical to a run without failure. Other returns: KEEL_ERESTART (the job restarts:
 * the state was saved, exit with KEEL_EXIT_RESTART), KEEL_ESTOPPED, KEEL_EORPHANED,
 * KEEL_EEXCLUDED (declared dead: exit 0), or a collective's own error. Registered state may
 * change only after a step's last collective (the optimizer), unless keel_step_undo is on. */
keel_status keel_step_begin(keel_ctx *ctx, uint64_t step);
keel_status keel_step_allreduce(keel_ctx *ctx, const void *send, void *recv, size_t count,
                                keel_dtype dtype, keel_reduce_op op);
keel_status keel_step_reduce_scatter(keel_ctx *ctx, const void *send, void *recv,
                                     size_t count_per_rank, keel_dtype dtype, keel_reduce_op op);
keel_status keel_step_allgather(keel_ctx *ctx, const void *send, void *recv,
                                size_t bytes_per_rank);
keel_status keel_step_broadcast(keel_ctx *ctx, void *buffer, size_t bytes, int root);
/* Ends the step: commit hooks run (checkpoint policies), and when the world may grow
 * (`--max-world`) joiners waiting are admitted here, at the step boundary, without revoking
 * anything. Failures are recovered as in the step, with the committed state. */
keel_status keel_step_commit(keel_ctx *ctx);
/* For steps that change registered state between collectives (ZeRO's update of its shard
 * before the all-gather): keel_step_begin then copies the registered state (into memory
 * allocated once, here) and a recovery that redoes the step puts it back before any state
 * is sent; failure hooks of a process about to exit see it put back too. Register every
 * buffer before enabling it. */
keel_status keel_step_undo(keel_ctx *ctx, bool enabled);
/* The end of training, after the last commit: returns KEEL_OK once every member of the world
 * has reached it, so that none leaves while another may still fail the last step's
 * collective (a member that got its result out of a collective another did not would leave
 * with a model the other then redoes alone, in a smaller world). A failure meanwhile is
 * recovered as a commit's (the laggard receives the last committed state) and KEEL_EREDO
 * returned: redo whatever depends on the world (a final gather) and call it again. Other
 * returns as keel_step_commit's. */
keel_status keel_finish(keel_ctx *ctx);

/* What the last recovery did, with its time broken down. */
typedef struct keel_recovery {
  bool recovered;     /* a failure happened and was recovered during the call */
  bool redo_step;     /* the step must begin again (KEEL_EREDO) */
  /* This process's registered state was replaced by a survivor's: it lacked state, or it was
   * behind (its collective failed after the others had the result and committed the step),
   * and then the state received is of a later step than the one it was in. */
  bool state_received;
  uint64_t old_epoch, new_epoch;
  int old_size, new_size;
  int failed_count;
  int replaced_count; /* failed ranks taken over by spares */
  int joined_count;
  int64_t detect_ns, revoke_ns, agree_ns, rebuild_ns, state_transfer_ns, redo_ns;
} keel_recovery;
/* How many recoveries this process has taken part in, and the last one in *recovery_p
 * (optional; zeroed when there was none). After KEEL_EREDO it says whether the registered
 * state changed under the caller (state_received): a caller that keeps its own copy of the
 * state (the PyTorch binding packs tensors into registered buffers) must take it back then. */
uint64_t keel_last_recovery(const keel_ctx *ctx, keel_recovery *recovery_p);
/* The step allreduce with the recovery's breakdown (the one-collective step): as
 * keel_step_allreduce; send must differ from recv. *recovery_p is optional. */
keel_status keel_allreduce_resilient(keel_ctx *ctx, const void *send, void *recv, size_t count,
                                     keel_dtype dtype, keel_reduce_op op,
                                     keel_recovery *recovery_p);

/* ---- reporting and fault points */

/* Says that the registered state was just put back to the start of step (a restore after a
 * restart): when that step commits, rank 0 reports a `resumed` event, the end of the
 * recovery as the JIT paper's Table 7 counts it. */
void keel_mark_resume(keel_ctx *ctx, uint64_t step, const char *kind);
/* A named fault-injection point inside the user's step ("forward", "optimizer") or a
 * checkpoint engine's ("save", "saved"): fires a KEEL_FAULT rule whose point= names it.
 * Returns true when a `corrupt` rule fired: the caller damages what it has just written. */
bool keel_fault_point(keel_ctx *ctx, const char *point);
/* Legitimately long work of this rank outside the other ranks' pace (an evaluation, a save
 * that rank 0 alone makes): until keel_section_end, and at most until deadline_ns (keel's
 * clock, keel_deadline_after_ns), a collective of any other rank that reaches its deadline
 * waiting for this one waits on until the section's end plus its deadline, instead of taking
 * this rank for hung. A section that outlasts deadline_ns is a hang like any other. name:
 * 1..63 characters, no space, quote or backslash. One section at a time: KEEL_EINVAL inside
 * one, with a past deadline or a bad name; a store error when the others cannot be told. The
 * others learn of it within about 100 ms. Events section_begin and section_end. */
keel_status keel_section_begin(keel_ctx *ctx, const char *name, int64_t deadline_ns);
/* Ends the section begun last; KEEL_EINVAL when none is open. */
keel_status keel_section_end(keel_ctx *ctx);
/* Progress for the launcher's status line (rank 0's are shown). Never blocks, never fails
 * the caller: a full pipe drops the line and counts it. */
void keel_report(keel_ctx *ctx, uint64_t step, double loss, double samples_per_second);
/* One event line to the launcher's event log: {"event":event, uid, rank, epoch, t_ns,
 * json_fields} where json_fields (may be NULL; under 3 KiB) are the object's other members
 * without braces. event: 1..31 characters of [a-z0-9_]. Never blocks. */
void keel_report_event(keel_ctx *ctx, const char *event, const char *json_fields);

/* Leaves the job in order: tells peers this is a goodbye, not a failure, says so in the
 * store, drops the lease and frees ctx. NULL is allowed. */
void keel_finalize(keel_ctx *ctx);

/* ---- event lines without a context: a process of the job that joins no communicator (a
 * worker of parameter servers: ec_train, examples/dlrm) reports to the launcher's events
 * file as keel_report_event does for a ctx, so that tools outside the job (keel chaos, keel
 * report) see its progress and its end. From the environment keel run sets (KEEL_STATUS_FD,
 * KEEL_UID); outside keel run every line goes nowhere. KEEL_ENOMEM or KEEL_EINVAL (a
 * malformed variable). */
typedef struct keel_reporter keel_reporter;
keel_status keel_reporter_open(keel_reporter **reporter_p);
/* One line {"event":event, uid, rank, "epoch":0, t_ns, json_fields}, on the terms of
 * keel_report_event (the same checks of event and json_fields). Never blocks. */
void keel_reporter_event(keel_reporter *reporter, int rank, const char *event,
                         const char *json_fields);
/* A `wait_late` line (docs/RUNTIME.md) if some wait of this process (a call to a parameter
 * server, a store request) ended past its deadline since the last such line, as
 * keel_step_commit sends one for a context: one atomic load when none did, so a training loop
 * may call it every step. Never blocks. */
void keel_reporter_waits_late(keel_reporter *reporter, int rank);
/* Sends the last wait_late line if one is due. NULL is allowed. */
void keel_reporter_close(keel_reporter *reporter);

#ifdef __cplusplus
}
#endif
#endif
