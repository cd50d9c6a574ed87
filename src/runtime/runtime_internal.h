/* Private to src/runtime. The context is a handful of parts, each owned by one file (its
 * struct is defined there alone; the others call its functions):
 *   config.c        the launcher's environment, read once (read-only afterwards)
 *   events.c        status and event lines to the launcher, never blocking
 *   session.c       the store session: lease, keepalive, the launcher's liveness, job keys
 *   detector.c      the failure detector: the one place that decides a process is dead
 *   registry.c      the state registry
 *   state_source.c  state notes, the transfer plan, survivors and tiers
 *   step.c          step transactions, commit hooks, the undo copy
 *   recovery.c      the recovery engine, failure hooks, the recovery event
 *   policy_*.c      shrink, replace, restart: one table each
 *   context.c       init, start, finalize, and the endpoint's membership glue */
#ifndef KEEL_RUNTIME_INTERNAL_H
#define KEEL_RUNTIME_INTERNAL_H

#include "keel/runtime.h"

#define KEEL__RUNTIME_MODULE "runtime"

/* ---- config.c */
typedef enum keel__role { KEEL__ROLE_WORKER, KEEL__ROLE_SPARE, KEEL__ROLE_JOINER } keel__role;
typedef enum keel__policy_kind {
  KEEL__POLICY_SHRINK,
  KEEL__POLICY_REPLACE,
  KEEL__POLICY_RESTART, /* no recovery in process: save (failure hooks) and exit */
} keel__policy_kind;

typedef struct keel__config {
  bool standalone; /* no KEEL_STORE: a world of one */
  keel_auth auth;
  char store_endpoint[512];
  uint32_t uid;
  keel__role role;
  keel__policy_kind policy;
  bool node_domain;
  int node;
  int initial_world;
  int max_world;
  int status_fd;
  int64_t timeout_ns; /* with timeout_auto: the deadline until steps were observed */
  bool timeout_auto;  /* KEEL_TIMEOUT=auto: the watchdog sets it from the step times */
  uint64_t verify_every; /* KEEL_VERIFY_EVERY: replicas compared every N steps; 0: never */
  int64_t heartbeat_ns;
  int64_t replace_wait_ns;
  bool failure_detection;
  bool finish_crc; /* KEEL_FINISH_CRC=1: each commit keeps a crc32c of the state for `finish` */
  uint32_t restart_count;
  uint32_t first_uid;
  uint64_t first_epoch;
  char host[96];
  char resume_directory[4096]; /* "" unless KEEL_RESUME */
} keel__config;

/* Reads the environment `keel run` sets; standalone when KEEL_STORE is absent. Logs and
 * returns KEEL_EINVAL for a malformed or out-of-range value. */
keel_status keel__config_read(keel__config *config);
const char *keel__role_name(keel__role role);

/* ---- events.c */
typedef struct keel__events keel__events;
/* fd: the launcher's SOCK_SEQPACKET socket (KEEL_STATUS_FD); < 0: lines go nowhere. */
keel_status keel__events_create(int fd, keel__events **events_p);
void keel__events_destroy(keel__events *events);
/* Sends {"event":event,"uid":..,"rank":..,"epoch":..,"t_ns":..,fields} as one record without
 * waiting; a line the socket cannot take now is dropped and counted (the next line that gets
 * through says how many were dropped). */
void keel__events_line(keel__events *events, uint32_t uid, int rank, uint64_t epoch,
                       const char *event, const char *fields);
/* Whether an application's event (keel_report_event, keel_reporter_event) may be sent: a
 * name of 1..31 characters of [a-z0-9_], fields under 3 KiB. */
bool keel__event_acceptable(const char *event, const char *json_fields);
/* The fields of a `wait_late` line (keel_waits_late_format) if some wait of this process
 * ended past its deadline since the last take, with a warning in the log; false if none did
 * (one atomic load). */
bool keel__waits_late_fields(char *fields, size_t capacity);

/* ---- detector.c */
typedef struct keel__detector keel__detector;
keel_status keel__detector_create(uint32_t self_uid, keel__detector **detector_p);
void keel__detector_destroy(keel__detector *detector);
/* An observation (a link broke): queued, never blocks; the store learns it on the next
 * flush, and the job fences the process. */
void keel__detector_observe(keel__detector *detector, uint32_t uid, const char *reason);
/* Writes queued observations as suspect/<uid> keys. Any thread. */
void keel__detector_flush(keel__detector *detector, keel_store *store);
/* The store prefixes the verdict is made of (dead/, suspect/, proc/), NULL-terminated. */
extern const char *const keel__detector_prefixes[];
/* Flushes, then reads the prefixes in one request and decides anew who is dead. */
keel_status keel__detector_refresh(keel__detector *detector, keel_store *store);
/* Decides anew from entries read by someone else at one revision (the agreement reads
 * them with its votes); entries under other prefixes are passed over. */
keel_status keel__detector_take(keel__detector *detector, const keel_store_entry *entries,
                                size_t count);
/* The verdict: dead/<uid> (reaped), suspect/<uid> (seen failing: being fenced), or no
 * proc/<uid> (its lease lapsed, or it left) at the last refresh. */
bool keel__detector_dead(keel__detector *detector, uint32_t uid);
int keel__detector_node(keel__detector *detector, uint32_t uid);
/* Removes the failure keys (dead/, suspect/, left/) of reaped processes that are in no
 * communicator from now on (not in members), so the store does not grow with failures. */
void keel__detector_forget(keel__detector *detector, keel_store *store, const uint32_t *members,
                           int member_count);

/* ---- session.c */
typedef struct keel__session keel__session;
/* Connects (main handle, keepalive handle, watch handle), grants the lease. */
keel_status keel__session_open(const keel__config *config, keel__detector *detector,
                               keel__session **session_p);
/* Starts the background thread: keepalive, the launcher's liveness, job/ and join/ keys,
 * flushing the detector's observations. endpoint is woken whenever a flag changes; events
 * receives store_unreachable / store_reachable lines. */
keel_status keel__session_start(keel__session *session, keel__events *events,
                                keel_endpoint *endpoint);
/* The endpoint is about to close: the thread must not wake it any more. */
void keel__session_detach(keel__session *session);
/* Says goodbye in the store (left/<uid>), revokes the lease, stops the thread, closes. */
void keel__session_close(keel__session *session, bool orderly);
keel_store *keel__session_store(keel__session *session);
int64_t keel__session_lease(const keel__session *session);
/* proc/<uid> = "pid=.. node=.. role=.. rank=.. epoch=.. addr=..", with the lease. */
keel_status keel__session_publish(keel__session *session, keel__role role, int rank, uint64_t epoch,
                                  const char *address);
/* Where uid listens, from its proc/ value; KEEL_ENOTFOUND while not published. */
keel_status keel__session_address(keel__session *session, uint32_t uid, char *address,
                                  size_t capacity);
/* KEEL_OK, or KEEL_EORPHANED (launcher gone), KEEL_EEXCLUDED (lease lost), KEEL_ESTOPPED
 * (job/stop), KEEL_EJOBDONE (job/done). Never blocks. */
keel_status keel__session_interrupted(const keel__session *session);
/* Looks at the launcher and reads the job's keys now (a store round trip unless the
 * launcher is gone) and returns keel__session_interrupted: failure (KEEL_OK if none) may be
 * the first sign of an orderly stop another process saw first, or of the launcher's death. */
keel_status keel__session_check(keel__session *session, keel_status failure);
/* Joiners waiting (join/ keys) at the last look. Never blocks. */
int keel__session_joiners_waiting(const keel__session *session);
/* Whether the session counts the idle spares (off by default); how many it found at its last
 * look, 0 while not wanted. */
void keel__session_want_spares(keel__session *session, bool wanted);
int keel__session_spares_waiting(const keel__session *session);
/* The latest end (keel_now_ns clock) of the sections other processes declared, at the last
 * look; 0: none. Never blocks. */
int64_t keel__session_sections_until(const keel__session *session);
/* `keel inject hang|bitflip` (inject/<action>/<uid>) reaches the fault plan through the
 * session: the training thread takes it at its next step. */
void keel__session_set_faults(keel__session *session, keel_fault_plan *faults);
/* The launcher's pid when the session started (0: none), for messages. */
int keel__session_launcher_pid(const keel__session *session);

/* ---- registry.c (public API in runtime.h) */

/* ---- state_source.c */
typedef struct keel__state_sources keel__state_sources;
/* Where a member stands when it votes: what it holds and which collective failed. */
typedef enum keel__redo_kind {
  KEEL__REDO_NONE,      /* the failed operation cannot be redone alone: the step must be */
  KEEL__REDO_SAME_SIZE, /* redoable in a world of the same size (reduce-scatter, allgather) */
  KEEL__REDO_ANY_SIZE,  /* redoable in any world (an out-of-place allreduce) */
} keel__redo_kind;
typedef struct keel__position {
  bool has_state;   /* false: a newcomer, or a member whose state transfer failed */
  uint64_t version; /* the step the registered state is at the start of */
  uint32_t shard, shards;
  bool in_step;
  uint64_t step;       /* the open step */
  uint32_t collective; /* which collective of the step failed (0-based) */
  keel__redo_kind redo;
  bool tier_failed; /* a tier could not give this member its state last round */
  bool has_fallback; /* with tier_failed: a tier has its shard at an older step, */
  uint64_t fallback; /* this one, to which the job may roll back */
} keel__position;

keel_status keel__state_sources_create(keel__state_sources **sources_p);
void keel__state_sources_destroy(keel__state_sources *sources);
keel_status keel__state_sources_add(keel__state_sources *sources, const keel_state_source_ops *ops,
                                    void *context);
void keel__position_note(const keel__position *position, char *note, size_t capacity);
keel_status keel__position_parse(const char *note, keel__position *position);

/* What the decision means for state: the members that lack it and who gives it. */
typedef struct keel__state_plan {
  bool forward;       /* every member can redo the failed collective: no step redo */
  bool any_transfer;  /* someone receives state (then everyone redoes the step) */
  bool unrecoverable; /* a shard has no holder and no tier: recovery cannot go on */
  uint32_t lost_shard;
  uint64_t version; /* the state every member holds afterwards */
  uint32_t shards;
  bool rolled_back; /* version is older than a member's: a tier could not give the newest */
} keel__state_plan;
/* Computes the plan from the decision (every member computes the same). */
keel_status keel__state_plan_make(const keel_decision *decision, int old_size,
                                  keel__state_plan *plan);
/* The plan's transfers as a JSON array: [{"to":uid,"from":uid or "tier","shard":s},...]. */
keel_status keel__state_plan_describe(const keel_decision *decision, char *text, size_t capacity);
/* This process's part in a transfer. */
typedef struct keel__transfer_result {
  bool receiver;    /* it lacked the state */
  bool received;    /* and now holds it (from a survivor or a tier) */
  bool tier_failed; /* no survivor held its shard and no tier had it */
  bool has_fallback; /* with tier_failed: a tier has the shard at an older step, */
  uint64_t fallback;
} keel__transfer_result;
/* Carries out this process's part of the plan on comm (the new epoch): sends to its
 * receivers, receives from its sender, or restores from a tier. */
keel_status keel__state_transfer(keel_ctx *ctx, keel_comm *comm, const keel_decision *decision,
                                 const keel__state_plan *plan, keel__transfer_result *result);

/* ---- step.c */
typedef struct keel__step keel__step;
keel_status keel__step_create(keel__step **step_p);
void keel__step_destroy(keel__step *step);
/* The position this process votes with; collective_failed is the index of the failed one. */
void keel__step_position(keel_ctx *ctx, keel__redo_kind redo, keel__position *position);
/* After a recovery: the state is now at version (received or kept) and held. */
void keel__step_state_set(keel__step *step, uint64_t version, bool has_state);
bool keel__step_state_held(const keel__step *step);
/* Puts the undo copy back, when there is one. */
void keel__step_undo_restore(keel_ctx *ctx);

/* ---- recovery.c */
typedef struct keel__recovery keel__recovery;
keel_status keel__recovery_create(keel__recovery **recovery_p);
void keel__recovery_destroy(keel__recovery *recovery);
/* Runs the failure hooks once for cause (in_process says whether recovery follows). */
void keel__failure_hooks_run(keel_ctx *ctx, keel_status cause, bool in_process);
/* Recovers from a failure of the world seen where the step stands (redo: what the failed
 * operation allows). KEEL_OK: *redo_step_p tells whether the step must begin again; the
 * recovery's event waits for keel__recovery_report. Or KEEL_ERESTART (after the hooks),
 * KEEL_EEXCLUDED, an interruption, or KEEL_ENOTFOUND (a shard is lost everywhere). */
keel_status keel__recover(keel_ctx *ctx, keel_status cause, keel__redo_kind redo,
                          int64_t operation_started_ns, bool *redo_step_p);
/* Writes the pending recovery's event (one member writes it), with the time the redone
 * collective took (0: none was redone). */
void keel__recovery_report(keel_ctx *ctx, int64_t redo_ns);
/* Admits waiting joiners at a step boundary (no failure: no revoke, no hooks). */
keel_status keel__grow(keel_ctx *ctx);
/* A spare or joiner waits for its admission and takes its state. */
keel_status keel__admission(keel_ctx *ctx);
/* resumed events: keel_mark_resume and the report when the step commits. */
void keel__resume_committed(keel_ctx *ctx, uint64_t step);

/* ---- policies: one table each (policy_shrink.c, policy_replace.c, policy_restart.c). */
typedef struct keel__policy_ops {
  const char *name;
  bool in_process; /* false: the job restarts its processes instead */
  /* What this member asks of the membership change. */
  void (*vote)(keel_rebuild_vote *vote);
} keel__policy_ops;
extern const keel__policy_ops keel__policy_shrink;
extern const keel__policy_ops keel__policy_replace;
extern const keel__policy_ops keel__policy_restart;

/* ---- the context: pointers to the parts, owned by context.c (init and finalize). */
/* ---- registry.c: the whole registered state at once */
/* crc32c over every buffer but those each process's own, in order: what replicas hold alike. */
uint32_t keel__registry_crc32c(const keel_registry *registry);
/* Copies every buffer, in order, into copy (back == false) or from it (back == true); the
 * buffers beyond capacity (registered after copy was sized) are left out. */
void keel__registry_copy(const keel_registry *registry, uint8_t *copy, size_t capacity, bool back);
/* Grows *copy (of *capacity bytes) to hold the whole registered state; KEEL_ENOMEM leaves it. */
keel_status keel__registry_copy_fit(const keel_registry *registry, uint8_t **copy,
                                    size_t *capacity);

/* ---- verify.c: replicas compared every KEEL_VERIFY_EVERY steps (--verify-replicas) */
typedef struct keel__verify keel__verify;
keel_status keel__verify_create(const keel__config *config, keel__verify **verify_p);
void keel__verify_destroy(keel__verify *verify);
/* At a commit that makes version (the registered state is that step's start): every
 * KEEL_VERIFY_EVERY versions, compares the replicas' crc32c; all equal, the state is kept as
 * the last verified one; else every rank returns to the last verified version (its snapshot,
 * or a healthy replica's copy), *rolled_back_p is set and the step's bookkeeping moves there.
 * A collective that fails leaves the check for the next time (KEEL_OK). */
keel_status keel__verify_commit(keel_ctx *ctx, uint64_t version, bool *rolled_back_p);
/* The `bitflip` fault at step: one bit of the largest registered buffer, chosen from the step
 * and the uid. */
void keel__verify_bitflip(keel_ctx *ctx, uint64_t step);

/* ---- watchdog.c: the deadline from observed steps (KEEL_TIMEOUT=auto) and sections */
#define KEEL__SECTION_NAME_MAX 64
typedef struct keel__watchdog keel__watchdog;
keel_status keel__watchdog_create(const keel__config *config, keel__watchdog **watchdog_p);
void keel__watchdog_destroy(keel__watchdog *watchdog);
/* keel_step_begin: the interval since the last begin is a sample unless a recovery or a
 * section came in it; after the warm-up the world's deadline follows the samples' p99. */
void keel__watchdog_step_begin(keel_ctx *ctx);
/* A spare or joiner just admitted starts from the deadline rank 0 set last (watchdog/timeout),
 * not from 30 s, while it observes steps of its own. */
void keel__watchdog_adopt(keel_ctx *ctx);
/* The latest end, on keel_now_ns's clock, of the sections/ values among entries (those of
 * other processes than own_uid); 0: none. */
int64_t keel__sections_until(const keel_store_entry *entries, size_t count, uint32_t own_uid);

/* The run of consecutive steps that this process committed in one epoch, as the `commits`
 * lines report it: each line repeats the run from its first step, so a lost line (a launcher
 * that does not read) costs nothing once a later one arrives. */
typedef struct keel__commit_run {
  bool open, reported; /* reported: the last line said every step of the run */
  uint32_t number;     /* of the run in this process, from 0 */
  uint64_t epoch, first, last;
  int64_t reported_ns;
} keel__commit_run;

struct keel_ctx {
  keel__config config;
  keel_fault_plan *faults;
  keel__events *events;
  keel__detector *detector;
  keel__session *session;
  keel_endpoint *endpoint;
  keel_registry *registry;
  uint32_t shard_count;
  keel__state_sources *sources;
  keel__step *step;
  keel__recovery *recovery;
  keel__watchdog *watchdog;
  keel__verify *verify;
  const keel__policy_ops *policy;
  bool newcomer;
  bool abandon;              /* init failed: finalize says nothing to anyone */
  bool left_message_written; /* keel__leaving_message */
  int64_t last_report_ns;    /* keel_report is rate-limited */
  char saved_at[4096];       /* keel_note_saved */
  /* KEEL_FINISH_CRC: the state's crc32c as the last commit left it, for the finish event
   * (at keel_finalize the program may have freed its buffers already). */
  bool finish_known;
  uint32_t finish_crc;
  uint64_t finish_step;
  keel__commit_run commits; /* KEEL_FINISH_CRC: the steps committed, for `commits` lines */
};

/* context.c: with KEEL_FINISH_CRC, notes that this process committed step (called by
 * keel_step_commit once the commit hooks ran) for the `commits` lines. */
void keel__commit_note(keel_ctx *ctx, uint64_t step);
/* context.c: with KEEL_FINISH_CRC, says in a `received_commit` line that this process took a
 * state of version (its step version - 1 committed elsewhere) in a recovery. */
void keel__commit_received(keel_ctx *ctx, uint64_t version);
/* context.c: with KEEL_FINISH_CRC, keeps the crc32c of the registered state that the commit
 * of step version - 1 left (called by keel_step_commit). */
void keel__finish_note(keel_ctx *ctx, uint64_t version);
/* context.c: the size a replace world grows back to with idle spares once it shrank for want
 * of a ready one; 0 when the policy takes no spares, or a node's ranks must come back as a
 * node (a spare node's, in one replace: single spares would split it). */
int keel__refill_world(const keel_ctx *ctx);
/* context.c: an event line with this process's uid, rank and epoch. */
void keel__report_line(keel_ctx *ctx, const char *event, const char *fields);
/* A `wait_late` line if some wait of the process ended past its deadline since the last. */
void keel__waits_late_report(keel_ctx *ctx);
/* The world's status when it must stop: KEEL_OK or the session's interruption. */
keel_status keel__interruption(keel_ctx *ctx);
/* Says the process must leave (stop or launcher gone): one line on stderr, once. */
void keel__leaving_message(keel_ctx *ctx, keel_status cause);

#endif
