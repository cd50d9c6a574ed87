/* keel comm: the process's endpoint (its links to the other processes of the job) and the
 * communicators built on it. Collectives complete or fail with KEEL_EPROCFAILED /
 * KEEL_EREVOKED / KEEL_ETIMEDOUT and never hang past their deadline; ULFM's revoke, agree
 * and shrink, grow by spares and joiners, and point-to-point requests that progress in the
 * background while a collective runs (ULFM elastic paper, 3.1-3.3). Moving bytes is the
 * business of transports (tcp links, shared memory) behind one operations table.
 * Depends on core, net and store; knows nothing of training state (the runtime does). */
#ifndef KEEL_COMM_H
#define KEEL_COMM_H

#include "keel/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_endpoint keel_endpoint;
typedef struct keel_comm keel_comm;
typedef struct keel_request keel_request;

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

/* ---- what the endpoint needs from the process's membership in the job. The runtime
 * provides it (its failure detector and store session); a test may provide its own. */
#define KEEL_VIEW_PREFIXES_MAX 4
typedef struct keel_membership_ops {
  /* The "host:port" uid listens on, into address; KEEL_ENOTFOUND while it is not published
   * yet. May block briefly (a store read); never called from the progress loop. */
  keel_status (*address)(void *context, uint32_t uid, char *address, size_t capacity);
  /* The endpoint saw uid's link break. Called from the progress loop: must not block. */
  void (*suspect)(void *context, uint32_t uid, const char *reason);
  /* Writes what this process suspects to the store, for the others to see (may block: a
   * store write). The agreement calls it before each look at the votes. */
  keel_status (*publish)(void *context);
  /* The failure detector's view is the store's keys under view_prefixes (NULL-terminated,
   * at most KEEL_VIEW_PREFIXES_MAX): the agreement reads them in the same request as its
   * votes, so that a look is one round trip, and hands the entries to take_view (those of
   * the other prefixes among them) before it asks dead and node. */
  const char *const *view_prefixes;
  keel_status (*take_view)(void *context, const keel_store_entry *entries, size_t count);
  /* Whether uid is dead by the detector's current view, and its node (-1: unknown). Must
   * not block. */
  bool (*dead)(void *context, uint32_t uid);
  int (*node)(void *context, uint32_t uid);
  /* KEEL_OK, or the status that must end every wait at once: the job is stopping
   * (KEEL_ESTOPPED), its launcher is gone (KEEL_EORPHANED), this process was declared dead
   * (KEEL_EEXCLUDED), the job is done (KEEL_EJOBDONE). Must not block. */
  keel_status (*interrupted)(void *context);
  /* The latest end (keel_now_ns clock) of the legitimately long work other members declared
   * and have not ended (a runtime's sections), 0: none. An operation that reaches its
   * deadline meanwhile waits on until that end plus the communicator's deadline. May be
   * NULL. Must not block. */
  int64_t (*sections_until)(void *context);
} keel_membership_ops;

typedef struct keel_endpoint_config {
  uint32_t uid;            /* this process's id in the job (< KEEL_MAX_UIDS) */
  keel_auth auth;          /* the job's id and token; local_id is set to uid */
  keel_store *store;       /* the job's store (not owned); NULL: a world of one, no links */
  int64_t lease;           /* the lease the pool keys (spare/, join/) live with */
  const char *host;        /* where to listen; NULL: 127.0.0.1 */
  int node;                /* this process's failure domain */
  bool node_domain;        /* a member's failure takes every member of its node */
  int max_world;           /* a grow stops at this size */
  /* replace: idle spares beyond the failed fill the world back up to this size, so that a
   * world that shrank for want of a ready spare grows back when one is; 0: never */
  int refill_world;
  int64_t timeout_ns;      /* default deadline of every operation; 0: 30 s */
  int64_t spare_wait_ns;   /* replace: how long an agreement waits for spares; 0: 10 s */
  bool failure_detection;  /* false: operations end only by completion or deadline (a
                              benchmark's switch, KEEL_FAILURE_DETECTION=off) */
  keel_fault_plan *faults; /* points "allreduce", "agree"; may be NULL; not owned */
  const keel_membership_ops *membership; /* required with a store */
  void *membership_context;
} keel_endpoint_config;

/* Listens and starts the thread that authenticates incoming links. The caller owns
 * *endpoint_p and ends it with keel_endpoint_close. */
keel_status keel_endpoint_create(const keel_endpoint_config *config, keel_endpoint **endpoint_p);
/* "host:port" where the endpoint listens ("" for a world of one); valid until close. */
const char *keel_endpoint_address(const keel_endpoint *endpoint);
/* Any thread: makes an operation that waits on this endpoint look at membership->interrupted
 * at once. */
void keel_endpoint_wake(keel_endpoint *endpoint);
/* Any thread: the job declared uid dead (its dead/ key): a linked peer of that uid fails at
 * the endpoint's next poll, as if its link broke, so that an operation waiting on a peer
 * that went silent (a partitioned node) fails at once instead of at its deadline. */
void keel_endpoint_declare_dead(keel_endpoint *endpoint, uint32_t uid);
/* Any thread: every frame this endpoint sends from now on waits delay_ns before it is written
 * (0: none), as if its link were that slow; frames keep their order. `keel inject delay`
 * emulates a slow node with it, since this kernel has no netem. Shared-memory collectives
 * move no frames and are not delayed. */
void keel_endpoint_delay_sends(keel_endpoint *endpoint, int64_t delay_ns);
/* Leaves in order: tells every linked peer this is a goodbye, not a failure, reads what they
 * still send until each said goodbye or linger_ns passed, then frees every communicator,
 * request and link. NULL is allowed. */
void keel_endpoint_close(keel_endpoint *endpoint, int64_t linger_ns);
/* The endpoint's newest communicator (NULL before the first); operations on older ones
 * fail with KEEL_EREVOKED. */
keel_comm *keel_endpoint_current(keel_endpoint *endpoint);

/* Links with uid now if it is not linked yet, best effort by deadline (a spare does it ahead
 * of time, so that taking a rank costs no handshake). Only uids below this process's connect;
 * higher ones are waited for by keel_comm_create. */
keel_status keel_endpoint_link(keel_endpoint *endpoint, uint32_t uid, int64_t deadline_ns);

/* Makes the communicator of epoch over uids (rank order; this process among them) and
 * links with every member: connects to lower uids, waits for higher ones, by deadline. It
 * becomes the endpoint's current one. *comm_p is owned by the endpoint. */
keel_status keel_comm_create(keel_endpoint *endpoint, uint64_t epoch, const uint32_t *uids,
                             int count, int64_t deadline_ns, keel_comm **comm_p);

/* ---- the communicator. Handles are owned by the endpoint and stay valid until it closes
 * (an old epoch's operations fail with KEEL_EREVOKED). Operations are called by one thread.
 * Every operation waits at most the communicator's deadline. */
int keel_comm_rank(const keel_comm *comm);
int keel_comm_size(const keel_comm *comm);
uint64_t keel_comm_epoch(const keel_comm *comm);
/* The uid (job-wide process id) of a rank; UINT32_MAX when out of range. */
uint32_t keel_comm_uid(const keel_comm *comm, int rank);
/* The rank of uid in comm, or -1. */
int keel_comm_rank_of(const keel_comm *comm, uint32_t uid);
/* The communicator's deadline; the communicators of later epochs (a recovery's) start with the
 * current one's. */
void keel_comm_set_timeout(keel_comm *comm, int64_t timeout_ns);
int64_t keel_comm_timeout(const keel_comm *comm);
/* The transport the collectives use: "shm" (shared memory, every rank on this host),
 * "tcp" (the links), or "self" (a world of one). Chosen by the first collective of an
 * epoch; "tcp" before it. KEEL_TRANSPORT=tcp in the environment rules shared memory out. */
const char *keel_comm_transport(const keel_comm *comm);
/* KEEL_OK, or why an operation on comm would fail now: KEEL_EREVOKED, KEEL_EPROCFAILED. */
keel_status keel_comm_health(keel_comm *comm);

/* send may equal recv (in place). Out of place, send is never written, which is what lets a
 * failed allreduce be redone. The result is bit-for-bit identical at every rank, from run to
 * run and over every transport: the order of reduction depends only on rank, size and count. */
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

/* ---- point-to-point requests: each has its own slots in the progress engine, so it moves
 * whenever any operation of the endpoint waits (a collective included): a background
 * transfer. The buffer stays the caller's and must stay valid until the request completes
 * or is freed. tag is the caller's; a send matches the receive with the same tag. */
keel_status keel_comm_isend(keel_comm *comm, int rank, uint64_t tag, const void *buffer,
                            size_t bytes, keel_request **request_p);
/* A receive of exactly bytes bytes (a frame of another length fails it, KEEL_EPROTO). */
keel_status keel_comm_irecv(keel_comm *comm, int rank, uint64_t tag, void *buffer, size_t bytes,
                            keel_request **request_p);
/* Moves whatever can move without waiting; *done_p says whether the request is complete.
 * Returns the request's failure once it has one (KEEL_EPROCFAILED, KEEL_EREVOKED, ...). */
keel_status keel_request_test(keel_request *request, bool *done_p);
/* Waits until the request completes, fails, or deadline (KEEL_ETIMEDOUT). */
keel_status keel_request_wait(keel_request *request, int64_t deadline_ns);
/* Frees a request; one still in flight is abandoned first (its frames are finished from
 * copies or dropped, so the caller's buffer is free on return). NULL is allowed. */
void keel_request_free(keel_request *request);
/* Blocking forms, by the communicator's deadline. */
keel_status keel_comm_send(keel_comm *comm, int rank, uint64_t tag, const void *buffer,
                           size_t bytes);
keel_status keel_comm_recv(keel_comm *comm, int rank, uint64_t tag, void *buffer, size_t bytes);

/* ---- ULFM: revoke, agree, shrink; and elastic membership. */

/* Revokes the communicator: every pending and later operation on its epoch fails with
 * KEEL_EREVOKED at every member (a reliable broadcast of the mark). Idempotent. */
keel_status keel_comm_revoke(keel_comm *comm);

/* Fault-tolerant agreement: every surviving member returns the same *flags and the same
 * failed set, even if members fail during it. *flags is the bitwise AND of the inputs of the
 * members whose votes counted: every survivor's, and that of a member that died after its
 * vote was written when the decision came before its death was seen (then it is not in the
 * failed set either: the set names exactly the members whose votes did not count).
 * failed_uids (optional, capacity entries) receives their uids, and *failed_count_p their
 * number. Works on a revoked communicator. KEEL_ETIMEDOUT if it cannot
 * decide by the communicator's deadline (members that stay silent that long are suspected
 * first, which makes the job fence them, and given one more deadline). */
keel_status keel_comm_agree(keel_comm *comm, uint32_t *flags, uint32_t *failed_uids,
                            size_t capacity, size_t *failed_count_p);

/* What a member asks of a membership change, and the change all members agreed on. */
typedef struct keel_rebuild_vote {
  uint32_t flags;           /* ANDed over the voters, as keel_comm_agree */
  bool rebuild;             /* make the next epoch (false: a plain agreement) */
  bool shrink_only;         /* no spares: the survivors alone (ULFM shrink) */
  bool admit_spares;        /* failed members' places go to idle spares, waiting for them a while */
  bool admit_joiners;       /* joiners waiting (join/ keys) are admitted, up to the maximum world */
  char note[KEEL_NOTE_MAX]; /* the member's word to the others (the runtime: what state it
                               holds); printable ASCII, no spaces */
} keel_rebuild_vote;

typedef struct keel_decision {
  uint64_t epoch; /* of the communicator that decided; the new one is epoch + 1 */
  uint32_t round;
  bool rebuild;
  uint32_t flags;
  int member_count; /* of the new epoch, in rank order */
  uint32_t members[KEEL_MAX_WORLD];
  char notes[KEEL_MAX_WORLD][KEEL_NOTE_MAX]; /* each member's note; "" for a newcomer */
  int failed_count;
  uint32_t failed[KEEL_MAX_WORLD];
  int replaced_count; /* failed members replaced by spares */
  int joined_count;   /* joiners admitted */
} keel_decision;

/* Agrees with the survivors on the next epoch and moves to it (links with every member,
 * newcomers included), ranks in the survivors' old order with spares in the failed members'
 * places and joiners at the end. decision (caller's memory: it is large) receives what was
 * decided; *new_p (owned by the endpoint; may be NULL) the new communicator. Returns
 * KEEL_EEXCLUDED when the others went on without this process. Moving state to newcomers is
 * the caller's business (the decision names them). */
keel_status keel_comm_rebuild(keel_comm *comm, const keel_rebuild_vote *vote,
                              keel_decision *decision, keel_comm **new_p);
/* The two halves of keel_comm_rebuild, for a caller that times them: agree on the decision
 * (the vote's rebuild flag is set for it), then move to it (links with every member of the
 * new epoch; KEEL_EEXCLUDED when this process is not one). */
keel_status keel_comm_decide(keel_comm *comm, const keel_rebuild_vote *vote,
                             keel_decision *decision);
keel_status keel_endpoint_adopt(keel_endpoint *endpoint, const keel_decision *decision,
                                keel_comm **comm_p);
/* keel_comm_rebuild with the survivors alone. *new_p is owned by the endpoint. */
keel_status keel_comm_shrink(keel_comm *comm, keel_comm **new_p);
/* keel_comm_rebuild admitting idle spares and waiting joiners, up to the maximum world.
 * Call at a step boundary, at every member; the newcomers get state from the runtime. */
keel_status keel_comm_grow(keel_comm *comm, keel_comm **new_p);

/* A process that is not a member yet offers itself: as a spare (takes a failed member's
 * place) or as a joiner (grows the job). Its key lives with the endpoint's lease. */
typedef enum keel_offer { KEEL_OFFER_SPARE, KEEL_OFFER_JOINER } keel_offer;
keel_status keel_endpoint_offer(keel_endpoint *endpoint, keel_offer offer);

/* Removes from the store the agreement keys of epochs a decision of this process finished
 * (a few store round trips; nothing when there are none). Kept off the recovery's path:
 * call it at a quiet moment, as the runtime does once the first collective of a recovered
 * epoch succeeded; otherwise the next agreement does it once its vote is written. */
void keel_endpoint_collect(keel_endpoint *endpoint);
/* Waits until a membership change admits this process (then links with the members and
 * returns its communicator and the decision), or membership->interrupted ends the wait
 * (KEEL_EJOBDONE when the job finished), or deadline. The offer is withdrawn on admission;
 * otherwise it stays until keel_endpoint_offer is called again or the lease ends. Admitted
 * but a member could not be linked (it died meanwhile): *comm_p is the new epoch's
 * communicator all the same, with that failure returned (KEEL_EPROCFAILED, ...): this
 * process is a member now and recovers the epoch with the others. Otherwise *comm_p is
 * NULL. */
keel_status keel_endpoint_await_admission(keel_endpoint *endpoint, int64_t deadline_ns,
                                          keel_decision *decision, keel_comm **comm_p);

#ifdef __cplusplus
}
#endif
#endif
