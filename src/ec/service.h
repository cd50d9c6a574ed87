/* Private to src/ec: what parameter servers and their clients share: calls to a server over an
 * authenticated link (one request, its reply), and the directory in the job's store that says
 * where each server listens and which servers the job has declared lost. */
#ifndef KEEL_EC_SERVICE_H
#define KEEL_EC_SERVICE_H

#include <pthread.h>

#include "ec/protocol.h"
#include "keel/ec.h"

/* Bounds every wait of a call: a server that does not answer in this time is taken for lost. */
#define KEEL__EC_CALL_TIMEOUT_NS ((int64_t)30 * 1000 * 1000 * 1000)
/* How long a call keeps trying to connect to a server that refuses. */
#define KEEL__EC_CONNECT_TIMEOUT_NS ((int64_t)1000 * 1000 * 1000)
/* Most rows or refs in one request: keeps a frame far under the link's payload bound. */
#define KEEL__EC_MAX_COUNT 65536u
/* Room for a server's address ("host:port") and its terminating NUL. */
#define KEEL__EC_ADDRESS_BYTES 64

/* The job's store as the directory of servers, shared by a process's threads: the store
 * handle serves one thread at a time, so every use takes the lock. */
typedef struct keel__ec_directory {
  keel_store *store;
  pthread_mutex_t lock;
} keel__ec_directory;

void keel__ec_directory_init(keel__ec_directory *directory, keel_store *store);
void keel__ec_directory_destroy(keel__ec_directory *directory);

/* One server as seen by a caller: its link (opened on first use, dropped after a failure so
 * that the next call reconnects) under a lock, so that threads take turns; a call that cannot
 * have its turn by its deadline ends with KEEL_ETIMEDOUT, as one the server did not answer. */
typedef struct keel__ec_peer {
  pthread_mutex_t lock;
  int index;
  keel_link *link;
  char address[KEEL__EC_ADDRESS_BYTES];
  uint64_t next_tag;
} keel__ec_peer;

void keel__ec_peer_init(keel__ec_peer *peer, int index);
void keel__ec_peer_destroy(keel__ec_peer *peer);

/* Sends request to the peer's server and waits for its reply, by deadline_ns. The reply's
 * body (keel__ec_reply_body_bytes of the request) is copied to body (NULL when it has none).
 * Returns the server's own answer (KEEL_EAGAIN: it does not serve that, ask again after
 * refreshing the lost servers; KEEL_EPEERLOST: a server it called on while serving was lost,
 * likewise), or KEEL_ECLOSED / KEEL_ECONNREFUSED / KEEL_ETIMEDOUT when the server itself could
 * not be reached (the link is dropped): a reply never says that, so a server's failure to reach
 * another is never taken for its own. KEEL_EPROTO for a malformed reply. When the server could
 * not be reached, failed_address (KEEL__EC_ADDRESS_BYTES, or NULL) gets the address tried, for
 * keel__ec_directory_declare_lost. */
keel_status keel__ec_peer_call(keel__ec_peer *peer, keel__ec_directory *directory,
                               const keel_auth *auth, const keel__ec_request *request,
                               const keel__ec_limits *limits, void *body, int64_t deadline_ns,
                               char *failed_address);

/* A call in two halves, for a caller that talks to several servers at once: start sends the
 * request (connecting first if need be) and holds the peer until finish, which receives the
 * reply and gives what keel__ec_peer_call gives (the request sent once more to a replacement
 * where a link opened earlier led to a server since replaced). A start that returns an error
 * (KEEL_EINVAL, KEEL_ENOMEM: nothing sent) needs no finish; every other start needs exactly
 * one, from the same thread. Send failures come out of finish. */
typedef struct keel__ec_pending {
  keel__ec_peer *peer;
  const uint8_t *payload;
  uint8_t *owned; /* the payload when start encoded it */
  size_t length, body_bytes;
  uint16_t op;
  uint64_t tag;
  bool locked; /* the peer's lock was taken by the deadline (else status is KEEL_ETIMEDOUT) */
  bool reused; /* the link was open before this call */
  char address_before[KEEL__EC_ADDRESS_BYTES];
  /* When the call ends unreachable: the address whose link failed ("" when the peer's lock
   * was not taken), for keel__ec_directory_declare_lost. */
  char failed_address[KEEL__EC_ADDRESS_BYTES];
  keel_status status; /* of the sending */
} keel__ec_pending;

keel_status keel__ec_peer_start(keel__ec_peer *peer, keel__ec_directory *directory,
                                const keel_auth *auth, const keel__ec_request *request,
                                const keel__ec_limits *limits, int64_t deadline_ns,
                                keel__ec_pending *pending);
keel_status keel__ec_peer_finish(keel__ec_pending *pending, keel__ec_directory *directory,
                                 const keel_auth *auth, void *body, int64_t deadline_ns);

/* requests[i] to peers[i] for every i < count with targets[i], all sent before any reply is
 * awaited (one round trip for all), peers taken in ascending order (every caller takes them
 * so: no two wait on each other). statuses[i] gets each one's answer, bodies[i] its reply's
 * body (bodies may be NULL when no reply has one); pending has room for count. The caller
 * declares the unreachable ones lost (each one's address in pending[i].failed_address). */
void keel__ec_peers_call_each(keel__ec_peer *peers, int count, keel__ec_directory *directory,
                              const keel_auth *auth, const keel__ec_limits *limits,
                              const bool *targets, const keel__ec_request *requests,
                              void *const *bodies, keel__ec_pending *pending,
                              keel_status *statuses);

/* Asks server peer for its configuration (INFO), into *config_p. */
keel_status keel__ec_peer_info(keel__ec_peer *peer, keel__ec_directory *directory,
                               const keel_auth *auth, keel__ec_config *config_p,
                               int64_t deadline_ns);

/* Maps a true status of the link (broken, refused, silent) to "the server is lost". */
bool keel__ec_unreachable(keel_status status);

/* ---- the directory: keys ec/server/<i> (its address) and ec/lost/<i> (its standing when it
 * is not simply live: "lost", "rebuilding", "rebuilt", or "back N").
 *
 * A server's standing, one number: LIVE; LOST (dead: it gets nothing); REBUILDING or REBUILT
 * (a replacement that is being or has been rebuilt: it gets every change but serves nothing,
 * its rows still served through the parity); or back at step N (1 .. KEEL__EC_REBUILT - 1):
 * served through the parity for steps before N, by itself from N on. So for a step, a server
 * is served through the parity exactly when step < standing. */
#define KEEL__EC_LIVE ((uint64_t)0)
#define KEEL__EC_LOST UINT64_MAX
#define KEEL__EC_REBUILDING (UINT64_MAX - 1)
#define KEEL__EC_REBUILT (UINT64_MAX - 2)

static inline bool keel__ec_lost_at(uint64_t standing, uint64_t step) { return step < standing; }
/* Whether a server of this standing holds its blocks whole: live, rebuilt, or back (from any
 * step); not lost, not still being rebuilt. */
static inline bool keel__ec_complete(uint64_t standing) {
  return standing != KEEL__EC_LOST && standing != KEEL__EC_REBUILDING;
}

/* Says where server index listens. */
keel_status keel__ec_directory_publish(keel__ec_directory *directory, int index,
                                       const char *address);
/* Where server index listens, waiting for it to say so until deadline_ns. */
keel_status keel__ec_directory_lookup(keel__ec_directory *directory, int index, char *address,
                                      size_t capacity, int64_t deadline_ns);
/* Declares server index lost after a link to it at failed_address broke: from then on every
 * caller routes around it. A replacement being rebuilt is left as it is (it serves nothing
 * yet); one back or coming back is lost. When the directory holds another address, the server
 * that failed was replaced already and nothing is written: a late failure on a link to it
 * must not take its replacement out (RELIABILITY.md, finding 60). failed_address "" declares
 * whatever listens now. */
keel_status keel__ec_directory_declare_lost(keel__ec_directory *directory, int index,
                                            const char *failed_address);
/* Sets server index's standing (LIVE deletes the mark). */
keel_status keel__ec_directory_set_standing(keel__ec_directory *directory, int index,
                                            uint64_t standing);
/* standing[i] for i < servers, from the store. */
keel_status keel__ec_directory_standing(keel__ec_directory *directory, int servers,
                                        uint64_t *standing);
/* lost[i] for i < servers: served through the parity at `step`. */
void keel__ec_lost_view(const uint64_t *standing, int servers, uint64_t step, bool *lost);

/* ---- routing, a pure function of the layout and the lost servers. */

/* The server that serves reads and updates of data row `row`: its own server while that one
 * is not lost, else the group's first parity holder that is not lost ("acting" for it, by
 * decoding), -1 when every one of them is lost too. */
int keel__ec_row_server(const keel_ec_layout *layout, uint64_t row, const bool *lost);
/* The server that holds the dense block: server 0 unless lost, else 1 when the dense block is
 * replicated and 1 is not lost; -1 when none. */
int keel__ec_dense_server(int servers, bool replicated, const bool *lost);

/* The store key of the published configuration (keel_ec_config_publish). */
#define KEEL__EC_CONFIG_KEY "ec/config"

/* The protocol's configuration as the public one, and back. */
void keel__ec_config_to_public(const keel__ec_config *wire, keel_ec_config *config);
keel_status keel__ec_config_from_public(const keel_ec_config *config, keel__ec_config *wire_p);

#endif
