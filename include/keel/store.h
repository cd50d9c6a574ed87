/* keel store: the job's key-value store: put, get, compare-and-swap, delete, prefix list,
 * leases that expire with their keys, and waiting for a change. Membership, addresses,
 * liveness and recovery decisions live here. Backends fill keel_store_ops: the embedded
 * server (a thread in the launcher, over keel net links) and an etcd cluster (its v3 JSON
 * gateway, over libcurl). Depends on core and net. */
#ifndef KEEL_STORE_H
#define KEEL_STORE_H

#include "keel/net.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds enforced by client and server alike (a request past them is KEEL_ERANGE). */
#define KEEL_STORE_MAX_KEY 512
#define KEEL_STORE_MAX_VALUE (1u << 20)
#define KEEL_STORE_MAX_KEYS 65536
/* Prefixes one keel_store_list_prefixes may read together. */
#define KEEL_STORE_MAX_PREFIXES 8

/* ---- the embedded server. It runs on its own threads inside the process that starts it
 * (the launcher), accepts only links that pass the job's handshake, and serves any number
 * of clients; a client that sends a bad frame is disconnected without disturbing others.
 * Revisions are global and increase by one with each change, as in etcd. */
typedef struct keel_store_server keel_store_server;

keel_status keel_store_server_start(const char *listen_address, const keel_auth *auth,
                                    keel_store_server **server_p);
/* "host:port" the server listens on; valid until stop. */
const char *keel_store_server_address(const keel_store_server *server);
/* Stops the threads, closes every client link and frees the server. NULL is allowed. */
void keel_store_server_stop(keel_store_server *server);

/* ---- the client. A handle is thread-safe (calls are serialised on its one link); a
 * thread that waits long (keel_store_wait) should use a handle of its own. */
typedef struct keel_store keel_store;

typedef struct keel_store_entry {
  char *key;
  uint8_t *value; /* NUL-terminated for convenience; value_length excludes the NUL */
  size_t value_length;
  uint64_t revision; /* revision of the last change to this key */
  int64_t lease;     /* 0 when the key has no lease */
} keel_store_entry;

/* endpoint: "host:port" of an embedded server (an "embedded://" prefix is accepted), or an
 * etcd cluster: "etcd://h1:2379,h2:2379,..." over HTTP, "https://h1:2379,..." over TLS with
 * the files KEEL_RDZV_CA, KEEL_RDZV_CERT and KEEL_RDZV_KEY name (the environment). Retries
 * until deadline while the server is not yet listening. With etcd, auth's job id names the
 * job's namespace ("keel/<job id>/", invisible to the caller; etcd's own TLS, not the
 * token, guards the cluster); requests go to one member and move to the next when it
 * cannot be reached (a read also when it does not answer in its share of the timeout); a
 * write that reached a member is never resent. A member that answers but not like etcd's
 * gateway is KEEL_ECORRUPT at once. */
keel_status keel_store_connect(const char *endpoint, const keel_auth *auth, int64_t deadline_ns,
                               keel_store **store_p);
/* Closes the link; leases the client held expire on their own (no implicit revoke). */
void keel_store_close(keel_store *store);

/* How long each request of this handle may take to be answered (a wait: on top of its own
 * deadline); 10 s until set. A request that misses it returns KEEL_ETIMEDOUT, one whose
 * link breaks KEEL_ECLOSED; either way the handle drops its link, and its next request
 * first reconnects (the job's handshake, within that request's timeout; a failed attempt
 * returns KEEL_ETIMEDOUT or KEEL_ECLOSED too) and then proceeds, so a handle outlives a
 * store that stalls or drops it. A failed request may or may not have been applied; it
 * is never sent twice. Applies from the next request; callable from any thread.
 * KEEL_EINVAL unless timeout_ns > 0. */
keel_status keel_store_set_timeout(keel_store *store, int64_t timeout_ns);
/* How many times the handle re-established its link (0 while it never lost one), for a
 * keepalive thread to report; callable from any thread, never blocks. */
uint64_t keel_store_reconnects(const keel_store *store);

/* Sets key to value. lease 0: none; else the key is deleted when that lease expires or is
 * revoked (KEEL_ENOTFOUND if the lease does not exist). *revision_p (optional) receives
 * the revision of this change. */
keel_status keel_store_put(keel_store *store, const char *key, const void *value, size_t length,
                           int64_t lease, uint64_t *revision_p);
/* Reads key into a new entry the caller frees with keel_store_entry_free; KEEL_ENOTFOUND
 * when absent. */
keel_status keel_store_get(keel_store *store, const char *key, keel_store_entry **entry_p);
/* Writes value only if key's revision is expected_revision (0: only if key is absent).
 * KEEL_ECONFLICT otherwise, with nothing changed. */
keel_status keel_store_cas(keel_store *store, const char *key, uint64_t expected_revision,
                           const void *value, size_t length, int64_t lease, uint64_t *revision_p);
/* Deletes key; KEEL_ENOTFOUND when absent. */
keel_status keel_store_delete(keel_store *store, const char *key);
/* Every key starting with prefix ("" lists all), sorted by key; the caller frees the array
 * with keel_store_entries_free. *revision_p (optional) is the store's current revision,
 * read atomically with the list, to pass to keel_store_wait. */
keel_status keel_store_list(keel_store *store, const char *prefix, keel_store_entry **entries_p,
                            size_t *count_p, uint64_t *revision_p);
/* keel_store_list over several prefixes in one request, at one revision: the entries of
 * prefixes[0] in key order, then those of prefixes[1], and so on. 1 to
 * KEEL_STORE_MAX_PREFIXES prefixes, none empty and none a prefix of another (KEEL_EINVAL),
 * so that no key is listed twice. (etcd: one transaction of range reads.) */
keel_status keel_store_list_prefixes(keel_store *store, const char *const *prefixes,
                                     size_t prefix_count, keel_store_entry **entries_p,
                                     size_t *count_p, uint64_t *revision_p);
/* Blocks until a key starting with prefix is created, changed or deleted (by a put, cas,
 * delete or lease expiry) at a revision above after_revision, or until deadline
 * (KEEL_ETIMEDOUT). Returns at once if such a change already happened. *revision_p
 * receives the store's revision at the moment of return. */
keel_status keel_store_wait(keel_store *store, const char *prefix, uint64_t after_revision,
                            int64_t deadline_ns, uint64_t *revision_p);

/* Leases: a lease lives ttl after its last keepalive; then it and its keys go, with one
 * revision for all of them. */
keel_status keel_store_lease_grant(keel_store *store, int64_t ttl_ns, int64_t *lease_p);
keel_status keel_store_lease_keepalive(keel_store *store, int64_t lease);
keel_status keel_store_lease_revoke(keel_store *store, int64_t lease);
/* How long lease has left before it expires (*left_ns_p) and the time to live it was granted
 * with (*ttl_ns_p, optional): its age since the last keepalive is the difference. etcd
 * counts both in whole seconds. KEEL_ENOTFOUND for a lease that expired or never was. */
keel_status keel_store_lease_ttl(keel_store *store, int64_t lease, int64_t *left_ns_p,
                                 int64_t *ttl_ns_p);

/* ---- the election state of a replicated store (etcd), for fencing (docs/NODES.md) */
#define KEEL_STORE_MAX_MEMBERS 16

typedef struct keel_store_member_state {
  uint64_t id;     /* the member's id */
  uint64_t term;   /* its raft term when it answered */
  bool has_leader; /* it knew a leader then */
} keel_store_member_state;

typedef struct keel_store_quorum {
  int64_t asked_ns; /* keel_now_ns() before the first question: every answer came after */
  size_t voters;    /* the cluster's voting members, as a member listed them */
  size_t answered;  /* voting members that answered, each once */
  keel_store_member_state members[KEEL_STORE_MAX_MEMBERS];
} keel_store_quorum;

/* Asks every member the store was given for its election state, by deadline_ns, each in
 * its share of the time (a stopped member does not answer). KEEL_ENOTSUP for a store that
 * is one process (embedded); KEEL_ETIMEDOUT when no member listed the cluster. */
keel_status keel_store_quorum_read(keel_store *store, int64_t deadline_ns,
                                   keel_store_quorum *quorum);
/* The highest term a reading's members answered at. */
uint64_t keel_store_quorum_term(const keel_store_quorum *quorum);
/* Whether later shows that no leader of the store that existed when earlier was asked can
 * still commit a write: earlier read a majority of the voters, and later a majority with no
 * leader, each at a term above every term earlier read. A leader that commits afterwards
 * then won an election that a member of earlier's majority voted in after answering, so it
 * was elected after earlier->asked_ns; and etcd's new leader gives every lease its full
 * time again: no lease can expire before earlier->asked_ns plus its ttl. (A member that
 * answers without a leader at a term already seen may still follow that term's leader: a
 * vote cast but not yet heard of, or etcd's pre-vote.) */
bool keel_store_quorum_moved_on(const keel_store_quorum *earlier, const keel_store_quorum *later);

void keel_store_entry_free(keel_store_entry *entry);
void keel_store_entries_free(keel_store_entry *entries, size_t count);

#ifdef __cplusplus
}
#endif
#endif
