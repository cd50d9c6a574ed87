/* Private to src/comm: the runtime context, peers and their links, the communicator of one
 * epoch, the progress engine's receive slots, and the recovery decision. The files:
 * context.c (init, links, lease), progress.c (the poll loop), reduce.c (kernels),
 * collectives.c (algorithms), agree.c (agreement through the store), recovery.c (revoke,
 * rebuild, state transfer, the resilient allreduce), fault.c (KEEL_FAULT), report.c. */
#ifndef KEEL_COMM_INTERNAL_H
#define KEEL_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "keel/comm.h"

#define KEEL__MAX_UIDS 4096
#define KEEL__MAX_STATE_BUFFERS 64
#define KEEL__MAX_FAULT_RULES 8
/* State and collective payloads travel in frames of at most this many bytes. */
#define KEEL__MAX_SEGMENT_BYTES ((size_t)4 << 20)
#define KEEL__STATE_FRAME_BYTES ((size_t)64 << 20)

/* Tags of collective frames: the operation's sequence number in its epoch, the algorithm's
 * step and the segment within the step. */
#define KEEL__TAG(op_seq, step, segment) \
  (((uint64_t)(op_seq) << 32) | ((uint64_t)(step) << 16) | (uint64_t)(segment))
/* Tags of state frames: buffer index and chunk; the meta frame uses index 0xffff. */
#define KEEL__STATE_TAG(index, chunk) (((uint64_t)(index) << 32) | (uint64_t)(chunk))
#define KEEL__STATE_META_INDEX 0xffffu

typedef enum keel__role { KEEL__ROLE_WORKER, KEEL__ROLE_SPARE, KEEL__ROLE_JOINER } keel__role;
typedef enum keel__policy {
  KEEL__POLICY_SHRINK,
  KEEL__POLICY_REPLACE,
  KEEL__POLICY_RESTART, /* no recovery in process: save (failure hooks) and exit */
} keel__policy;

#define KEEL__MAX_FAILURE_HOOKS 4

/* A frame waiting its turn on a link; payload stays the sender's unless owned. */
typedef struct keel__send_item {
  struct keel__send_item *next;
  keel_frame frame;
  const void *payload;
  size_t length;
  void *owned; /* freed when sent or dropped */
  int *pending; /* decremented when fully written; may be NULL */
} keel__send_item;

/* A receive posted by an operation, matched on (type, source, epoch, tag). */
typedef struct keel__recv_slot {
  uint16_t type;
  uint32_t source;
  uint64_t epoch;
  uint64_t tag;
  void *destination;
  size_t length;
  bool posted;
  bool done;
  keel_status status;
} keel__recv_slot;

/* A whole frame that arrived before any receive matched it. */
typedef struct keel__unexpected {
  struct keel__unexpected *next;
  keel_frame frame;
  void *payload;
} keel__unexpected;

typedef struct keel__peer {
  uint32_t uid;
  keel_link *link;
  bool failed;  /* its link broke: it is suspected */
  bool left;    /* it said goodbye: EOF is not a failure */
  keel__send_item *queue_head, *queue_tail;
  bool in_flight;                /* queue_head has been begun on the link */
  keel__recv_slot *inbound_slot; /* where the frame being read goes, if an op's slot */
} keel__peer;

typedef struct keel__shm_group keel__shm_group;

struct keel_comm {
  keel_ctx *ctx;
  keel__shm_group *shm; /* shared memory of this epoch, when all ranks share a host */
  bool shm_tried;
  uint64_t epoch;
  int rank;
  int size;
  uint32_t *uids; /* rank -> uid */
  uint64_t op_seq;
  uint32_t agree_round;
  int64_t timeout_ns;
  bool revoked_locally;
  struct keel_comm *older; /* ctx keeps every epoch's handle until finalize */
};

typedef struct keel__state_buffer {
  char name[64];
  void *data;
  size_t bytes;
} keel__state_buffer;

typedef enum keel__fault_action {
  KEEL__FAULT_KILL,
  KEEL__FAULT_STOP,
  KEEL__FAULT_DELAY,
  KEEL__FAULT_EXIT,
  KEEL__FAULT_CORRUPT, /* the point's caller damages what it just wrote */
} keel__fault_action;

typedef struct keel__fault_rule {
  keel__fault_action action;
  int64_t uid;  /* -1: any */
  int64_t step; /* -1: any */
  char point[32];
  int64_t after; /* allreduce: chunk sends before firing */
  int64_t milliseconds;
  int64_t code;
  bool fired;
} keel__fault_rule;

struct keel_ctx {
  bool standalone;
  keel_auth auth;
  uint32_t uid;
  keel__role role;
  keel__policy policy;
  bool node_domain;
  int node;
  int initial_world;
  int max_world;
  int status_fd;
  int64_t timeout_ns;
  int64_t heartbeat_ns;
  int64_t replace_wait_ns;
  /* KEEL_FAILURE_DETECTION=off (a benchmark's switch, to measure what detection costs):
   * operations no longer look at peers' health and end only by completing or deadline. */
  bool failure_detection;
  char store_endpoint[256];

  keel_store *store;
  int64_t lease;
  keel_listener *listener;
  char address[128];

  /* The keepalive thread refreshes the lease through its own store handle. */
  pthread_t keepalive_thread;
  bool keepalive_started;
  keel_store *keepalive_store;
  /* The acceptor thread authenticates incoming links and hands them over. */
  pthread_t acceptor_thread;
  bool acceptor_started;
  int wake_fd; /* eventfd: a link is waiting in accepted */
  int stop_fd; /* eventfd: keel_finalize wakes both threads to stop */
  pthread_mutex_t accepted_mutex;
  keel_link *accepted[64];
  int accepted_count;
  atomic_bool stopping;

  keel__peer *peers[KEEL__MAX_UIDS];

  keel_comm *world;
  uint64_t revoked_epoch; /* epochs <= this are revoked (0 with none_revoked) */
  bool any_revoked;

  /* Posted receives of the operation in progress (reused across operations). */
  keel__recv_slot *slots;
  size_t slot_count, slot_capacity;
  keel__unexpected *unexpected_head;

  keel__state_buffer state[KEEL__MAX_STATE_BUFFERS];
  int state_count;
  bool newcomer;
  uint64_t resilient_seq; /* resilient allreduces completed: the step's progress mark */

  uint8_t *scratch;
  size_t scratch_bytes;

  /* This incarnation of the job (the launcher restarts every process under
   * KEEL__POLICY_RESTART): how many came before, and the uid and epoch it starts with. */
  uint32_t restart_count;
  uint32_t first_uid;
  uint64_t first_epoch;
  keel_failure_hook failure_hooks[KEEL__MAX_FAILURE_HOOKS];
  void *failure_hook_args[KEEL__MAX_FAILURE_HOOKS];
  int failure_hook_count;
  bool failure_hooks_ran;        /* in failure_hooks_epoch */
  uint64_t failure_hooks_epoch;
  /* keel_mark_resume: rank 0 reports `resumed` when a step past resume_step begins. */
  bool resume_pending;
  uint64_t resume_step;
  char resume_kind[16];

  keel__fault_rule faults[KEEL__MAX_FAULT_RULES];
  int fault_count;
  uint64_t current_step;
  bool step_known;
  int64_t last_join_check_ns;
  bool grow_requested;

  /* Progress reports are rate-limited and carry the last measured throughput. */
  int64_t last_report_ns;
};

/* ---- context.c */
keel__peer *keel__peer_get(keel_ctx *ctx, uint32_t uid);
/* Registers links handed over by the acceptor thread. */
void keel__take_accepted_links(keel_ctx *ctx);
/* Makes sure every member of comm other than this process has a link: connects to lower
 * uids (address from the store), waits for higher ones to connect. */
keel_status keel__ensure_links(keel_ctx *ctx, const uint32_t *uids, int count, int64_t deadline_ns);
keel_status keel__publish_proc(keel_ctx *ctx, int rank, uint64_t epoch);
keel_comm *keel__comm_create(keel_ctx *ctx, uint64_t epoch, const uint32_t *uids, int count);
int keel__comm_rank_of(const keel_comm *comm, uint32_t uid);
keel_status keel__scratch_reserve(keel_ctx *ctx, size_t bytes);

/* ---- progress.c */
keel_status keel__send(keel_ctx *ctx, uint32_t uid, uint16_t type, uint64_t epoch, uint64_t tag,
                       const void *payload, size_t length, int *pending);
keel__recv_slot *keel__post_recv(keel_ctx *ctx, uint16_t type, uint32_t source, uint64_t epoch,
                                 uint64_t tag, void *destination, size_t length);
void keel__slots_reset(keel_ctx *ctx);
/* One round of the engine: polls every link (and the acceptor) for at most the time left
 * to deadline_ns (0: do not wait), reads and writes what it can. */
keel_status keel__progress(keel_ctx *ctx, int64_t deadline_ns);
/* Status of comm as the engine sees it: KEEL_EREVOKED, KEEL_EPROCFAILED or KEEL_OK. */
keel_status keel__comm_health(keel_comm *comm);
/* Ends an abandoned operation: frames in flight are finished from copies, queued frames of
 * the operation are dropped, partly received frames go to the bin, slots are cleared. */
void keel__abandon_operation(keel_ctx *ctx);
/* Blocks until every queued frame on every link is written or deadline. */
keel_status keel__flush(keel_ctx *ctx, int64_t deadline_ns);
void keel__peer_fail(keel_ctx *ctx, keel__peer *peer, const char *reason);
/* Marks epoch (and every older one) revoked and passes the mark on to the members. */
void keel__note_revoke(keel_ctx *ctx, uint64_t epoch);
void keel__drop_stale_unexpected(keel_ctx *ctx, uint64_t below_epoch);

/* ---- collectives.c */
/* Drives the engine until the receives posted from first_slot on are in and *sends_pending
 * is zero, or the communicator breaks, or the deadline. */
keel_status keel__wait_posted(keel_comm *comm, size_t first_slot, int *sends_pending,
                              int64_t deadline_ns);

/* ---- shm.c */
/* Allreduce through the epoch's shared memory when every rank is on this host (set up on
 * first use, collectively). *used_p false: not eligible, the caller uses the links. */
keel_status keel__shm_allreduce(keel_comm *comm, const void *send, void *recv, size_t count,
                                keel_dtype dtype, keel_reduce_op op, bool *used_p);
/* The other collectives through the same segment; *used_p false: go over the links. */
keel_status keel__shm_allgather(keel_comm *comm, const void *send, void *recv,
                                size_t bytes_per_rank, bool *used_p);
keel_status keel__shm_broadcast(keel_comm *comm, void *buffer, size_t bytes, int root,
                                bool *used_p);
keel_status keel__shm_reduce_scatter(keel_comm *comm, const void *send, void *recv,
                                     size_t count_per_rank, keel_dtype dtype, keel_reduce_op op,
                                     bool *used_p);
void keel__shm_release(keel_comm *comm);

/* ---- reduce.c */
void keel__reduce(keel_dtype dtype, keel_reduce_op op, void *destination, const void *left,
                  const void *right, size_t count);
void keel__reduce_reference(keel_dtype dtype, keel_reduce_op op, void *destination,
                            const void *left, const void *right, size_t count);
void keel__divide(keel_dtype dtype, void *buffer, size_t count, int divisor);

/* ---- agree.c */
typedef struct keel__decision {
  uint64_t epoch;       /* of the communicator that decided */
  uint32_t round;
  bool rebuild;         /* makes epoch + 1 */
  uint32_t flags;
  uint32_t members[1024]; /* new epoch, rank order */
  int member_count;
  uint32_t failed[256];
  int failed_count;
  uint32_t receivers[256]; /* members that must receive state */
  int receiver_count;
  uint32_t sender; /* member that sends state; UINT32_MAX if none */
  uint64_t resilient_seq;
  bool grew;
  int replaced_count;
} keel__decision;

typedef struct keel__contribution {
  uint32_t flags;
  bool has_state;
  uint64_t resilient_seq;
  bool grow;
  bool rebuild;
  bool force_shrink;
} keel__contribution;
/* A decision's view of whether the contribution carries state worth sending is `has_state`;
 * a plain shrink sends none. */

/* Runs one round of agreement on comm's epoch through the store (see agree.c). */
keel_status keel__agree(keel_comm *comm, const keel__contribution *mine, keel__decision *decision);
keel_status keel__decision_parse(const char *text, keel__decision *decision);
keel_status keel__decision_format(const keel__decision *decision, keel_buffer *text);
/* Waits (spare or joiner) for a rebuild decision that makes this process a member. */
keel_status keel__wait_for_admission(keel_ctx *ctx, keel__decision *decision);
void keel__epoch_key(char *key, size_t capacity, const char *prefix, uint64_t epoch,
                     uint32_t round, const char *suffix);

/* ---- recovery.c */
/* Moves to the decided epoch: links, then state to or from the members that need it.
 * *transfer_ns_p (optional) receives the time spent on the state alone. */
keel_status keel__apply_decision(keel_ctx *ctx, const keel__decision *decision,
                                 bool *received_state_p, int64_t *transfer_ns_p);

/* Ends a public operation on comm: a failure of the current world (a member failed, the
 * epoch was revoked, the deadline passed) revokes it and runs the failure hooks, once per
 * epoch, when there are hooks or the job restarts on failure. Returns status, or
 * KEEL_ERESTART for such a failure when the job restarts on failure. */
keel_status keel__operation_end(keel_comm *comm, keel_status status);
/* Whether status is a failure of the communicator that recovery handles. */
bool keel__recoverable(keel_status status);

/* ---- fault.c */
keel_status keel__faults_parse(keel_ctx *ctx, const char *text);
/* Fires the rules due at point; true when one was a `corrupt` rule. */
bool keel__fault_check(keel_ctx *ctx, const char *point, int64_t counter);

/* ---- report.c */
void keel__report_line(keel_ctx *ctx, const char *event, const char *fields);

#endif
