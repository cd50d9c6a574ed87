/* Private to src/comm. Who owns what:
 *   endpoint.c   the endpoint: listener, acceptor thread, peers and their links, creation
 *                and end of communicators (the only file that writes struct keel_endpoint's
 *                peer table and communicator chain);
 *   progress.c   the progress engine: operations (their receive slots and sends), the poll
 *                loop, revocation marks, the wait loop every operation uses;
 *   request.c    point-to-point requests over the engine;
 *   transport.c  the transports' table and the choice of one per epoch, and the public
 *                collectives that dispatch to it;
 *   tcp.c, shm.c the transports (one file each: a new one is one file and one table entry);
 *   reduce.c     reduction kernels;
 *   decide.c     the agreement's decision: a pure function over a table of votes;
 *   agree.c      the agreement's protocol through the store, revoke, shrink, grow, rebuild
 *                and admission. */
#ifndef KEEL_COMM_INTERNAL_H
#define KEEL_COMM_INTERNAL_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#include "keel/comm.h"

/* Collective payloads travel in frames of at most this many bytes. */
#define KEEL__MAX_SEGMENT_BYTES ((size_t)4 << 20)
/* Tags of collective frames: the operation's sequence number in its epoch, the algorithm's
 * step and the segment within the step. */
#define KEEL__TAG(op_seq, step, segment) \
  (((uint64_t)(op_seq) << 32) | ((uint64_t)(step) << 16) | (uint64_t)(segment))

typedef struct keel__op keel__op;

/* A frame waiting its turn on a link; the payload stays the sender's unless owned. */
typedef struct keel__send_item {
  struct keel__send_item *next;
  keel_frame frame;
  const void *payload;
  size_t length;
  void *owned;           /* freed when sent or dropped */
  keel__op *op;          /* whose send it is (told when it is written); NULL once let go */
  int64_t held_until_ns; /* keel_endpoint_delay_sends: not written before then (0: at once) */
} keel__send_item;

/* A receive posted by an operation, matched on (type, source, epoch, tag). */
typedef struct keel__recv_slot {
  uint16_t type;
  uint32_t source;
  uint64_t epoch;
  uint64_t tag;
  void *destination;
  size_t length;
  bool done;
  keel_status status;
  /* Where the payload is once done: destination, or, for a slot that adopts (posted with
   * keel__op_post_recv_adopting), the buffer of a frame that came before the post, which
   * the op then owns until it ends (no copy of a segment read only once). */
  const void *data;
  bool adopts;
  void *adopted;
} keel__recv_slot;

/* An operation in the progress engine: its own receive slots and count of sends in flight,
 * so that several (a collective and background transfers) move at once and one can be
 * abandoned without disturbing the others. Set up with keel__op_begin, ended with
 * keel__op_end or keel__op_abandon; the slots array is kept for reuse until keel__op_free. */
struct keel__op {
  keel_endpoint *endpoint;
  keel__op *next, *previous; /* the endpoint's active operations */
  bool active;
  keel__recv_slot *slots;
  size_t slot_count, slot_capacity;
  int sends_pending;
  keel_status send_error; /* a send failed: its peer failed */
};

/* A whole frame that arrived before any receive matched it. */
typedef struct keel__unexpected {
  struct keel__unexpected *next;
  keel_frame frame;
  void *payload;
} keel__unexpected;

typedef struct keel__peer {
  uint32_t uid;
  keel_link *link;
  bool failed;       /* its link broke: it is suspected */
  bool declared_dead; /* the job's verdict (keel_endpoint_declare_dead): it never links again */
  bool left;         /* it said goodbye: end of stream is not a failure */
  bool told_goodbye; /* we said ours (a link accepted while we linger gets it too) */
  keel__send_item *queue_head, *queue_tail;
  bool in_flight;       /* queue_head has been begun on the link */
  keel__op *inbound_op; /* where the frame being read goes: slot inbound_index of it */
  size_t inbound_index;
  size_t linked_index; /* place in the endpoint's list of linked peers */
} keel__peer;

typedef struct keel__transport_ops keel__transport_ops;

struct keel_comm {
  keel_endpoint *endpoint;
  uint64_t epoch;
  int rank;
  int size;
  uint32_t *uids; /* rank -> uid */
  uint64_t op_seq;
  uint32_t agree_round;
  int64_t timeout_ns;
  bool revoked_locally;
  /* Learnt with the transport, by the first collective: every rank on this node (network
   * namespace included), and the ranks that share this machine's cores (size until then). */
  bool all_on_this_node;
  int ranks_on_this_machine;
  const keel__transport_ops *transport; /* NULL until the first collective chooses one */
  void *transport_state;
  keel__op collective; /* the slots of this communicator's collective in progress */
  struct keel_comm *older;
};

struct keel_endpoint {
  keel_endpoint_config config;
  bool standalone;
  keel_listener *listener;
  char address[128];
  /* The acceptor thread authenticates incoming links and hands them over. */
  pthread_t acceptor_thread;
  bool acceptor_started;
  int wake_fd; /* eventfd: a link is waiting in accepted, or someone called keel_endpoint_wake */
  int64_t spin_ns; /* keel__drive polls without sleeping this long after each event */
  long cores;      /* online cores, read once: with fewer than ranks on this machine nobody spins */
  _Atomic int64_t send_delay_ns; /* keel_endpoint_delay_sends, set from any thread */
  int stop_fd;                   /* eventfd: close wakes the acceptor to stop */
  atomic_bool stopping;
  pthread_mutex_t accepted_mutex;
  keel_link *accepted[64];
  int accepted_count;
  /* Under accepted_mutex: uids the job declared dead (keel_endpoint_declare_dead), for the
   * poll loop to fail; a partitioned peer's link gives no sign of its own. */
  uint32_t declared_dead[64];
  int declared_dead_count;

  keel__peer **peers; /* by uid, grown on demand */
  size_t peer_capacity;
  keel__peer **linked; /* peers with a link, for the poll loop */
  size_t linked_count, linked_capacity;
  struct pollfd *pollers;
  keel__peer **poll_owners;
  size_t poll_capacity;

  keel__op *operations; /* active operations, newest first */
  keel__unexpected *unexpected_head;
  uint64_t revoked_epoch; /* epochs <= this are revoked (when any_revoked) */
  bool any_revoked;
  keel_comm *current; /* newest communicator; older ones chain through ->older */
  /* Epochs before this one have store keys this process's decision made finished
   * (keel_endpoint_collect removes them); 0: none. */
  uint64_t collect_before;

  uint8_t *scratch;
  size_t scratch_bytes;
};

/* ---- endpoint.c */
keel__peer *keel__peer_get(keel_endpoint *endpoint, uint32_t uid);
/* The peer of uid if it exists, without making one. */
keel__peer *keel__peer_find(const keel_endpoint *endpoint, uint32_t uid);
/* Registers links handed over by the acceptor thread. */
void keel__take_accepted_links(keel_endpoint *endpoint);
keel_status keel__scratch_reserve(keel_endpoint *endpoint, size_t bytes);
/* Fires a fault point of the endpoint's plan; _last at the point's last count in an
 * operation (keel_fault_plan_fire_last). */
bool keel__fault(keel_endpoint *endpoint, const char *point, int64_t counter);
bool keel__fault_last(keel_endpoint *endpoint, const char *point, int64_t counter);
/* Makes comm's epoch + members from a decision the endpoint's current communicator. */
keel_status keel__comm_from_decision(keel_endpoint *endpoint, const keel_decision *decision,
                                     keel_comm **comm_p);

/* ---- progress.c */
void keel__op_begin(keel_endpoint *endpoint, keel__op *op);
/* Posts a receive; the slot is op->slots[index] (the array may move on the next post). It
 * may complete at once from a frame that arrived earlier. KEEL_ENOMEM. */
keel_status keel__op_post_recv(keel__op *op, uint16_t type, uint32_t source, uint64_t epoch,
                               uint64_t tag, void *destination, size_t length, size_t *index_p);
/* The same, for a consumer that reads the payload at slots[index].data rather than at
 * destination, so that a frame that came first is used where it lies. */
keel_status keel__op_post_recv_adopting(keel__op *op, uint16_t type, uint32_t source,
                                        uint64_t epoch, uint64_t tag, void *destination,
                                        size_t length, size_t *index_p);
/* Queues a frame to uid on behalf of op (payload stays the caller's until written). */
keel_status keel__op_send(keel__op *op, uint32_t uid, uint16_t type, uint64_t epoch, uint64_t tag,
                          const void *payload, size_t length);
/* Whether every posted receive is done and every send written. */
bool keel__op_complete(const keel__op *op);
/* The first failed slot's status, or KEEL_OK. */
keel_status keel__op_slot_error(const keel__op *op);
/* Ends a completed operation (unregisters it; its slots are reset for reuse). */
void keel__op_end(keel__op *op);
/* Ends an operation that will not complete: frames half written are finished from copies,
 * its queued frames are dropped, its partly received frames go to the bin, slots reset. */
void keel__op_abandon(keel__op *op);
/* Frees the slots array (the op must not be active). */
void keel__op_free(keel__op *op);
/* Queues a frame that belongs to no operation (revoke, goodbye). */
keel_status keel__send_control(keel_endpoint *endpoint, uint32_t uid, uint16_t type,
                               uint64_t epoch);
/* One round of the engine: polls every link (and the wake descriptor) for at most the time
 * left to deadline_ns (0: do not wait), reads and writes what it can. */
keel_status keel__progress(keel_endpoint *endpoint, int64_t deadline_ns);
/* Drives the engine until op is complete (and ready, when given, holds), the communicator
 * breaks, the membership interrupts, or the deadline. On any failure op is abandoned. */
typedef bool (*keel__ready_fn)(void *state);
keel_status keel__drive(keel_comm *comm, keel__op *op, int64_t deadline_ns, keel__ready_fn ready,
                        void *state);
/* Whether comm's epoch was revoked, here or by any member. */
bool keel__comm_revoked(const keel_comm *comm);
/* Status of comm as the engine sees it: KEEL_EREVOKED, KEEL_EPROCFAILED or KEEL_OK. */
keel_status keel__comm_health(keel_comm *comm);
/* Whether now is past *deadline_ns. A member's declared long work (membership's
 * sections_until) moves *deadline_ns to its end plus the communicator's deadline instead. */
bool keel__deadline_passed(keel_comm *comm, int64_t *deadline_ns);
/* The membership's interruption, if any (KEEL_OK otherwise). */
keel_status keel__interrupted(keel_endpoint *endpoint);
/* Blocks until every queued frame on every link is written or deadline. */
keel_status keel__flush(keel_endpoint *endpoint, int64_t deadline_ns);
void keel__peer_fail(keel_endpoint *endpoint, keel__peer *peer, const char *reason);
/* Marks epoch (and every older one) revoked and passes the mark on to the members. */
void keel__note_revoke(keel_endpoint *endpoint, uint64_t epoch);
void keel__drop_stale_unexpected(keel_endpoint *endpoint, uint64_t below_epoch);
/* Adds or removes a peer from the poll list when its link comes or goes. */
void keel__peer_linked(keel_endpoint *endpoint, keel__peer *peer);
void keel__peer_unlinked(keel_endpoint *endpoint, keel__peer *peer);

/* ---- transport.c: the table every transport fills (STYLE.md rule 7). Each operation is a
 * collective of comm: every member calls it, and it ends in success, KEEL_EPROCFAILED,
 * KEEL_EREVOKED, KEEL_ETIMEDOUT (or the membership's interruption), never hangs. */
struct keel__transport_ops {
  const char *name;
  /* Collective: decides with the members whether this transport serves comm's epoch and
   * sets it up (*state_p may stay NULL). KEEL_ENOTSUP when it does not serve comm; another
   * status is a failure of the communicator. */
  keel_status (*open)(keel_comm *comm, void **state_p);
  void (*close)(void *state);
  keel_status (*allreduce)(keel_comm *comm, void *state, const void *send, void *recv, size_t count,
                           keel_dtype dtype, keel_reduce_op op);
  keel_status (*broadcast)(keel_comm *comm, void *state, void *buffer, size_t bytes, int root);
  keel_status (*allgather)(keel_comm *comm, void *state, const void *send, void *recv,
                           size_t bytes_per_rank);
  keel_status (*reduce_scatter)(keel_comm *comm, void *state, const void *send, void *recv,
                                size_t count_per_rank, keel_dtype dtype, keel_reduce_op op);
};

extern const keel__transport_ops keel__transport_tcp;
extern const keel__transport_ops keel__transport_shm;
/* Closes comm's transport (a new epoch makes the old one's state useless). */
void keel__transport_release(keel_comm *comm);

/* ---- reduce.c */
void keel__reduce(keel_dtype dtype, keel_reduce_op op, void *destination, const void *left,
                  const void *right, size_t count);
void keel__reduce_reference(keel_dtype dtype, keel_reduce_op op, void *destination,
                            const void *left, const void *right, size_t count);
void keel__divide(keel_dtype dtype, void *buffer, size_t count, int divisor);

/* ---- reduce.c: the canonical order of reduction, the same over every transport (the why is
 * in reduce.c). A small allreduce folds in rank order (tcp exchanges whole buffers directly);
 * a larger one in the ring's order. Small is up to DIRECT_ALLREDUCE_BYTES, or while the direct
 * exchange sends each rank no more than DIRECT_ALLREDUCE_SENT_BYTES in all: one round of
 * messages then beats the ring's 2(n-1) rounds, each a wake-up (BENCHMARKS.md, issue 10). */
#define KEEL__DIRECT_ALLREDUCE_BYTES ((size_t)32 << 10)
#define KEEL__DIRECT_ALLREDUCE_SENT_BYTES ((size_t)256 << 10)
bool keel__allreduce_is_direct(size_t bytes, int size);
/* With more ranks than cores, tcp folds an allreduce at rank 0 while rank 0 sends the result
 * to the others in no more than this (tcp.c; the order of reduction stays the canonical one). */
#define KEEL__AT_ROOT_ALLREDUCE_SENT_BYTES ((size_t)4 << 20)
/* The first element of part `part` (0..parts; `parts` gives count) when count elements are
 * cut in parts parts, the first count % parts of them one element longer: the ring's chunks. */
size_t keel__part_start(size_t count, int parts, int part);
/* The rank whose contribution starts the fold of element index of a count-element allreduce
 * (element_size bytes each) over size ranks; *run_end_p: the end of the run of elements from
 * index on whose fold starts at the same rank. */
int keel__allreduce_fold_start(size_t count, size_t element_size, int size, size_t index,
                               size_t *run_end_p);
/* The rank whose contribution starts the fold of a reduce-scatter's block. */
int keel__reduce_scatter_fold_start(int size, int block);
/* destination = the fold of count elements of size contributions, rank r's at
 * contributions + r * stride: first_rank's, then first_rank + 1's ... (mod size), each step
 * keel__reduce(partial, next); KEEL_AVG divides the sum once at the end. destination overlaps
 * no contribution. */
void keel__reduce_fold(keel_dtype dtype, keel_reduce_op op, void *destination,
                       const uint8_t *contributions, size_t stride, int size, int first_rank,
                       size_t count);
/* Elements [first, first + count) of an allreduce of total elements, folded in the canonical
 * order into destination (element first lands at destination); contributions and stride as
 * for keel__reduce_fold, contributions pointing at element first of rank 0. */
void keel__allreduce_fold(keel_dtype dtype, keel_reduce_op op, void *destination,
                          const uint8_t *contributions, size_t stride, int size, size_t total,
                          size_t first, size_t count);

/* ---- decide.c: the agreement's decision as a pure function (table tests in
 * tests/unit/test_comm_units.c cover every order of votes and deaths up to 4 members). */
typedef enum keel__ballot_state {
  KEEL__BALLOT_PENDING, /* alive, and no vote of this epoch yet */
  KEEL__BALLOT_CAST,    /* voted in this epoch and round */
  KEEL__BALLOT_DEAD,    /* the failure detector says dead (voted or not) */
} keel__ballot_state;

typedef struct keel__ballot {
  uint32_t uid;
  keel__ballot_state state;
  int node;            /* -1: unknown */
  uint64_t vote_epoch; /* the epoch the vote was cast in; another epoch's counts as none */
  keel_rebuild_vote vote;
} keel__ballot;

typedef struct keel__decide_input {
  uint64_t epoch;
  uint32_t round;
  const keel__ballot *ballots; /* the members of comm, in rank order */
  int count;
  const uint32_t *spares; /* idle spares, alive, not members, ascending */
  int spare_count;
  const uint32_t *joiners; /* waiting joiners, alive, not members, ascending */
  int joiner_count;
  bool node_domain;
  bool waited_enough_for_spares;
  int max_world;
  int refill_world; /* keel_endpoint_config's */
} keel__decide_input;

/* Decides the round when the table settles it: every member has voted or is dead. Returns
 * false (decision untouched) while some member is pending, or while a replacement waits
 * for spares that have not come yet and waited_enough_for_spares is false. */
bool keel__decide(const keel__decide_input *input, keel_decision *decision);

/* ---- agree.c */
keel_status keel__decision_format(const keel_decision *decision, keel_buffer *text);
keel_status keel__decision_parse(const char *text, keel_decision *decision);
keel_status keel__vote_format(const keel_rebuild_vote *vote, uint64_t epoch, int node, char *text,
                              size_t capacity);
keel_status keel__vote_parse(const char *text, keel_rebuild_vote *vote, uint64_t *epoch_p,
                             int *node_p);
void keel__epoch_key(char *key, size_t capacity, const char *prefix, uint64_t epoch, uint32_t round,
                     const char *suffix);

#endif
