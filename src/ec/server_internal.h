/* Private to src/ec: the parameter server's state, shared by the server (server.c) and a
 * replacement's rebuild (rebuild.c), and the few server functions the rebuild calls. */
#ifndef KEEL_EC_SERVER_INTERNAL_H
#define KEEL_EC_SERVER_INTERNAL_H

#include <stdatomic.h>

#include "ec/service.h"
#include "ec/shard.h"

typedef struct keel__ec_rebuild keel__ec_rebuild;

typedef struct connection {
  struct connection *next;
  keel_ec_server *server;
  keel_link *link;
  pthread_t thread;
  bool finished;
} connection;

/* One worker's push of a step, kept until the step is applied. */
typedef struct step_push {
  keel__ec_request request;
  void *payload;
} step_push;

/* The pushes of one (op, acting, step) in synchronous mode. */
typedef struct step_slot {
  struct step_slot *next;
  uint16_t op;
  bool acting;
  uint64_t step;
  int arrived, left;
  bool applying, applied;
  keel_status result;
  step_push *pushes; /* workers of them */
} step_slot;

/* A parity holder's part of an update prepared but not yet committed. */
typedef struct prepared_update {
  struct prepared_update *next;
  uint64_t id;
  size_t count;
  keel__ec_ref *refs;
  uint8_t *deltas;
  /* A decider was told it is prepared here (or this holder decides it): from then on only a
   * verdict (KEEL__EC_FLAG_VERDICT) ends it, never a late commit of its origin (finding 58). */
  bool asked;
} prepared_update;

/* Committed update ids remembered for the other holders' questions. */
#define COMMITTED_MEMORY 4096

struct keel_ec_server {
  keel__ec_config wire;
  keel__ec_limits limits;
  keel__ec_shard shard;
  keel_ec_decoder *decoder; /* under decode_lock */
  pthread_mutex_t decode_lock;
  int index, servers;
  keel_auth auth;
  keel_listener *listener;
  pthread_t acceptor;
  atomic_bool stopping;
  pthread_mutex_t connections_lock;
  connection *connections;
  keel__ec_peer *peers;
  keel__ec_directory directory;
  pthread_mutex_t lost_lock;
  uint64_t *standing; /* under lost_lock: each server's (service.h), as last read */
  pthread_mutex_t step_lock;
  pthread_cond_t step_done; /* a slot applied, or a server's step marked */
  step_slot *steps;
  /* Under step_lock: for each server, 1 + the last synchronous step whose own rows it has
   * applied and whose changes (or, with none for this server, a mark) have reached this one.
   * A phase-2 push of a step every other server has marked carries only rows that are in. */
  uint64_t *marked_steps;
  /* Under step_lock: the same for each server's second phase (the rows it acts for, a mark
   * when none of them reach this one), and for each worker, 1 + the last step whose
   * second-phase push from it this server has applied: a push of that step again is a
   * second round (finding 47). */
  uint64_t *marked_acting, *acting_applied;
  atomic_uint_fast64_t next_update;
  /* Held shared by every update from its role check to its last change sent; a rebuild's
   * barrier takes it alone once, so that updates begun before it are done. */
  pthread_rwlock_t updates_lock;
  pthread_mutex_t prepared_lock;
  prepared_update *prepared;
  uint64_t committed[COMMITTED_MEMORY];
  size_t committed_next;
  pthread_mutex_t fault_lock;
  keel_fault_plan *faults; /* KEEL_FAULT: points ec_prepared, ec_committing, ec_answered */
  bool replacement;        /* started with --replace: its rules fire at REPLACEMENT_POINT only */
  /* With fault rules only: a step's answers go out one at a time, counted (answer()). */
  pthread_mutex_t answer_lock;
  uint64_t answered_update; /* the step and phase answered_count counts in */
  int64_t answered_count;
  keel__ec_rebuild *rebuild; /* a replacement's, until it is complete (rebuild.c) */
  /* False for a replacement until its rebuild is complete: it serves none of its own rows
   * before, whatever its view of the directory says (finding 54). */
  atomic_bool blocks_complete;
  uint32_t rebuild_chunk_groups, rebuild_pause_ms; /* keel_ec_config's */
};

/* What this server knows of the others for one step: which are served through the parity
 * (lost) and each one's standing (a holder gets changes unless it is LOST). */
typedef struct keel__ec_view {
  bool *lost;
  uint64_t *standing;
} keel__ec_view;

keel_status keel__ec_view_make(keel_ec_server *server, keel__ec_view *view);
void keel__ec_view_free(keel__ec_view *view);
void keel__ec_view_at(keel_ec_server *server, uint64_t step, keel__ec_view *view);
/* Reads the servers' standing from the directory anew. */
void keel__ec_server_refresh(keel_ec_server *server);
/* A call to another server; a server found unreachable is declared lost. */
keel_status keel__ec_server_call(keel_ec_server *server, int index, const keel__ec_request *request,
                                 void *body);
/* requests[i] to every server i with targets[i], all sent before any reply is awaited (one
 * round trip for all); statuses[i] each one's answer, its body into bodies[i] (bodies may be
 * NULL when no reply has one), losses declared as by keel__ec_server_call. KEEL_ENOMEM, or
 * KEEL_OK with the answers in statuses. */
keel_status keel__ec_server_call_each(keel_ec_server *server, const bool *targets,
                                      const keel__ec_request *requests, void *const *bodies,
                                      keel_status *statuses);

/* The other holder of the dense block (1 for server 0, 0 for server 1); -1 when this
 * server holds none or the block is not replicated. */
int keel__ec_dense_replica(const keel_ec_server *server);

/* ---- a replacement's rebuild (rebuild.c) */

/* A replacement's rebuild state, made before it takes any request: from then on it serves no
 * block and keeps the changes it gets for after its groups are rebuilt (keel__ec_rebuild_running
 * is true), though the rebuild itself has not started. */
keel_status keel__ec_rebuild_prepare(keel_ec_server *server);
/* Starts rebuilding this server's blocks from the others in a thread of its own: the state is
 * prepared, and the server listens and is marked REBUILDING. */
keel_status keel__ec_rebuild_start(keel_ec_server *server);
/* Stops the rebuild thread (if started) and frees its state (if prepared). */
void keel__ec_rebuild_stop(keel_ec_server *server);
/* Whether this server is a replacement whose blocks are not all rebuilt yet. */
bool keel__ec_rebuild_running(const keel_ec_server *server);
/* While a rebuild runs, a change to a group not rebuilt yet is kept for after (true); false
 * when it may be folded now. Caller holds the group's lock. */
bool keel__ec_rebuild_keep(keel_ec_server *server, const keel__ec_ref *ref, const uint8_t *delta,
                           uint64_t stamp);

#endif
