/* Private to src/store: the wire format of store requests and responses (carried in
 * KEEL_FRAME_STORE_REQUEST / STORE_RESPONSE payloads), the key-value state machine the
 * embedded server applies them to, and the ops table that client backends fill. */
#ifndef KEEL_STORE_INTERNAL_H
#define KEEL_STORE_INTERNAL_H

#include "keel/store.h"

/* ---- wire format, little-endian, version 1.
 * request:  version u8 | op u8 | key_length u16 | value_length u32 | id u64 |
 *           revision u64 | lease i64 | duration_ns i64 | key | value
 * response: version u8 | op u8 | reserved u16 | status i32 | id u64 | revision u64 |
 *           lease i64 | entry_count u32 | entries
 * entry:    key_length u16 | value_length u32 | revision u64 | lease i64 | key | value
 * Every length is explicit and checked against the bytes present and the store's bounds
 * before anything is read or allocated; keys never contain a NUL byte. */
#define KEEL__STORE_WIRE_VERSION 1
#define KEEL__STORE_REQUEST_HEADER_BYTES 40
#define KEEL__STORE_RESPONSE_HEADER_BYTES 36
#define KEEL__STORE_ENTRY_HEADER_BYTES 22
#define KEEL__STORE_MAX_REQUEST \
  (KEEL__STORE_REQUEST_HEADER_BYTES + KEEL_STORE_MAX_KEY + KEEL_STORE_MAX_VALUE)
/* Bytes of keys and values the store holds at most (KEEL_ENOSPC past it): small enough
 * that a list of the whole store always fits in one frame of the default bound. */
#define KEEL__STORE_MAX_BYTES ((size_t)240 << 20)
#define KEEL__STORE_MAX_RESPONSE                               \
  (KEEL__STORE_RESPONSE_HEADER_BYTES + KEEL__STORE_MAX_BYTES + \
   (size_t)KEEL_STORE_MAX_KEYS * KEEL__STORE_ENTRY_HEADER_BYTES)
/* A keel_buffer keeps one byte past its length for a NUL, so the buffers that hold a
 * whole request or response have a maximum one above it. */
#define KEEL__STORE_REQUEST_BUFFER_MAX (KEEL__STORE_MAX_REQUEST + 1)
#define KEEL__STORE_RESPONSE_BUFFER_MAX (KEEL__STORE_MAX_RESPONSE + 1)

typedef enum keel__store_op {
  KEEL__STORE_OP_PUT = 1,
  KEEL__STORE_OP_GET = 2,
  KEEL__STORE_OP_CAS = 3,
  KEEL__STORE_OP_DELETE = 4,
  KEEL__STORE_OP_LIST = 5,
  KEEL__STORE_OP_WAIT = 6,
  KEEL__STORE_OP_LEASE_GRANT = 7,
  KEEL__STORE_OP_LEASE_KEEPALIVE = 8,
  KEEL__STORE_OP_LEASE_REVOKE = 9,
  KEEL__STORE_OP_LIST_PREFIXES = 10, /* value: the prefixes, each ended by a NUL byte */
  /* The response's lease field is the ns the lease has left, its revision the lease's ttl. */
  KEEL__STORE_OP_LEASE_TTL = 11,
} keel__store_op;

/* A decoded request. key and value point into the payload it was decoded from (no copy);
 * key is not NUL-terminated. revision is the expected revision of a cas and the
 * after_revision of a wait; duration_ns is a wait's timeout and a grant's ttl. */
typedef struct keel__store_request {
  uint8_t op;
  uint64_t id;
  uint64_t revision;
  int64_t lease;
  int64_t duration_ns;
  const char *key;
  size_t key_length;
  const uint8_t *value;
  size_t value_length;
} keel__store_request;

/* Appends the encoding of request to buffer; KEEL_ERANGE / KEEL_ENOMEM from the buffer. */
keel_status keel__store_request_encode(const keel__store_request *request, keel_buffer *buffer);
/* Decodes and validates one request payload: version, known op, lengths that add up
 * exactly, bounds, no NUL in the key, the fields each op uses and zeros in the others.
 * Returns KEEL_EPROTO (version or op unknown), KEEL_ERANGE (over a bound) or
 * KEEL_ECORRUPT (anything else malformed); writes *request_p only on success. Pure and
 * allocation-free: the fuzz target's entry point. */
keel_status keel__store_request_decode(const uint8_t *payload, size_t length,
                                       keel__store_request *request_p);

/* The prefixes of a LIST_PREFIXES request's value, in order, into prefixes[] (pointers into
 * value, each ended by its NUL) and *count_p; false unless the value is 1 to
 * KEEL_STORE_MAX_PREFIXES non-empty NUL-ended prefixes of at most KEEL_STORE_MAX_KEY bytes,
 * none a prefix of another. The decoder's check and the server's reading both. */
/* True when one of the two NUL-ended prefixes begins the other: a key under both. */
bool keel__store_prefixes_overlap(const char *a, const char *b);
bool keel__store_prefixes_parse(const uint8_t *value, size_t length,
                                const char *prefixes[KEEL_STORE_MAX_PREFIXES], size_t *count_p);

/* A decoded response header; entries stay encoded until keel__store_response_entries. */
typedef struct keel__store_response {
  uint8_t op;
  keel_status status;
  uint64_t id;
  uint64_t revision;
  int64_t lease;
  uint32_t entry_count;
  const uint8_t *entries; /* into the payload */
  size_t entries_length;
} keel__store_response;

/* Appends a response header announcing entry_count entries; the caller then appends
 * exactly that many with keel__store_response_add_entry. */
keel_status keel__store_response_begin(keel_buffer *buffer, uint8_t op, uint64_t id,
                                       keel_status status, uint64_t revision, int64_t lease,
                                       uint32_t entry_count);
keel_status keel__store_response_add_entry(keel_buffer *buffer, const char *key, size_t key_length,
                                           const void *value, size_t value_length,
                                           uint64_t revision, int64_t lease);
/* Checks a response header and walks its entries (counts, lengths, bounds) without
 * allocating; KEEL_ECORRUPT / KEEL_EPROTO / KEEL_ERANGE as for requests. */
keel_status keel__store_response_decode(const uint8_t *payload, size_t length,
                                        keel__store_response *response_p);
/* Copies the entries of a decoded response into a new array of response->entry_count
 * entries (NULL when 0), freed with keel_store_entries_free. */
keel_status keel__store_response_entries(const keel__store_response *response,
                                         keel_store_entry **entries_p);

/* ---- the key-value state machine of the embedded server. Not thread-safe: the server
 * calls it under its one mutex. Time is passed in (keel_now_ns) so tests can drive it. */
typedef struct keel__store_kv keel__store_kv;

/* While leases exist the server services the kv (keel__store_kv_expire) at least this
 * often, even with nothing to expire, so that a long gap between two services can only
 * mean the server itself did not run. */
#define KEEL__STORE_LEASE_TICK_NS ((int64_t)100 * 1000000)
/* A gap between two services of the kv longer than this is a stall of the server (its
 * process stopped, or not scheduled), and earns every lease a grace period (see
 * keel__store_kv_expire). Five lease ticks, not a fraction of the shortest ttl: the
 * scheduling delays of a loaded machine stay well below it, so grace is never handed out
 * in normal running (where it would keep a dead holder's short lease alive tick after
 * tick). A holder sends keepalives every third of its ttl, so only a gap over two thirds
 * of the ttl can cost a healthy holder its lease: for every ttl from 750 ms up (the
 * runtime's are seconds) such a gap is seen as a stall. */
#define KEEL__STORE_STALL_NS ((int64_t)500 * 1000000)

keel_status keel__store_kv_create(keel__store_kv **kv_p);
void keel__store_kv_destroy(keel__store_kv *kv);
uint64_t keel__store_kv_revision(const keel__store_kv *kv);
/* Applies one request other than a wait at now_ns and appends its response to response
 * (a failed request is a response with its status, not an error here). *changed_p is
 * true when the revision moved, so waiters must be woken. Returns KEEL_ENOMEM or
 * KEEL_ERANGE only when the response could not be encoded; the store is then unchanged
 * unless *changed_p says otherwise. */
keel_status keel__store_kv_apply(keel__store_kv *kv, const keel__store_request *request,
                                 int64_t now_ns, keel_buffer *response, bool *changed_p);
/* Services the kv at now_ns: expires every lease whose ttl has passed, deleting their
 * keys with one revision; returns true when that changed the store. keel__store_kv_apply
 * calls it first. Stall grace, as etcd gives leases when a new leader takes over: when
 * more than KEEL__STORE_STALL_NS passed since the previous service, the server itself did
 * not run while the holders kept trying to reach it, so every lease first gets at least
 * its ttl from now_ns (expiry = max(expiry, now_ns + ttl)) and the stall is counted. A
 * holder that really died still loses its lease one ttl after the resume at the latest;
 * a holder that stops while the server runs gets no grace. */
bool keel__store_kv_expire(keel__store_kv *kv, int64_t now_ns);
/* Earliest time a lease expires; KEEL_NO_DEADLINE when there are none. */
int64_t keel__store_kv_next_expiry(const keel__store_kv *kv);
/* How many stalls earned the leases a grace period (for tests and diagnostics). */
uint64_t keel__store_kv_stalls(const keel__store_kv *kv);
/* True when a key starting with prefix was created, changed or deleted at a revision
 * above after_revision. The history of deletions is bounded: when after_revision is older
 * than the deletions still remembered, the answer is true (a wake the caller confirms
 * by listing), never a missed change. */
bool keel__store_kv_changed_since(const keel__store_kv *kv, const char *prefix,
                                  size_t prefix_length, uint64_t after_revision);

/* ---- client backends (STYLE.md rule 7): one file each, chosen by the endpoint's
 * scheme. Arguments are validated (bounds, NULLs) by client.c before they get here. */
typedef struct keel__store_ops {
  const char *scheme; /* "embedded://"; an endpoint without a scheme is embedded */
  keel_status (*connect)(const char *address, const keel_auth *auth, int64_t deadline_ns,
                         void **backend_p);
  void (*close)(void *backend);
  /* conditional false: a put; true: a cas on expected_revision. */
  keel_status (*put)(void *backend, const char *key, const void *value, size_t length,
                     int64_t lease, bool conditional, uint64_t expected_revision,
                     uint64_t *revision_p);
  keel_status (*get)(void *backend, const char *key, keel_store_entry **entry_p);
  keel_status (*remove)(void *backend, const char *key);
  keel_status (*list)(void *backend, const char *prefix, keel_store_entry **entries_p,
                      size_t *count_p, uint64_t *revision_p);
  keel_status (*list_prefixes)(void *backend, const char *const *prefixes, size_t prefix_count,
                               keel_store_entry **entries_p, size_t *count_p, uint64_t *revision_p);
  keel_status (*wait)(void *backend, const char *prefix, uint64_t after_revision,
                      int64_t deadline_ns, uint64_t *revision_p);
  keel_status (*lease_grant)(void *backend, int64_t ttl_ns, int64_t *lease_p);
  keel_status (*lease_keepalive)(void *backend, int64_t lease);
  keel_status (*lease_revoke)(void *backend, int64_t lease);
  keel_status (*lease_ttl)(void *backend, int64_t lease, int64_t *left_ns_p, int64_t *ttl_ns_p);
  /* NULL for a store of one process: keel_store_quorum_read says KEEL_ENOTSUP. */
  keel_status (*quorum_read)(void *backend, int64_t deadline_ns, keel_store_quorum *quorum);
  /* Every backend fills these two: the handle's request timeout (> 0, checked by
   * client.c) and how many times it re-established its connection. */
  keel_status (*set_timeout)(void *backend, int64_t timeout_ns);
  uint64_t (*reconnects)(const void *backend);
} keel__store_ops;

extern const keel__store_ops keel__store_embedded_ops;
/* etcd_client.c: "etcd://h1:2379,h2:2379" over HTTP, "https://..." over TLS. */
extern const keel__store_ops keel__store_etcd_ops;
extern const keel__store_ops keel__store_etcd_tls_ops;

/* ---- etcd's v3 JSON gateway (etcd_codec.c): request bodies and reply readers. Requests
 * return a NUL-terminated body the caller frees, or NULL for an invalid argument (a key
 * empty or too long, a value too long) or no memory. Replies: an error reply of the
 * gateway becomes its status (grpc code: NOT_FOUND -> KEEL_ENOTFOUND, UNAVAILABLE ->
 * KEEL_EAGAIN, ...; its text into message when given), anything that is not the expected
 * shape KEEL_ECORRUPT; nothing is written on failure. Fields left out read as their
 * defaults (0, false, empty); int64 fields are decimal strings (or integers). */
/* The etcd backend keeps a job's keys under a namespace of at most this many bytes, so the
 * keys the codec reads and writes are that much longer than keel's own. */
#define KEEL__ETCD_MAX_NAMESPACE 64
#define KEEL__ETCD_MAX_KEY (KEEL_STORE_MAX_KEY + KEEL__ETCD_MAX_NAMESPACE)
size_t keel__base64_encoded_bytes(size_t length);
/* text must hold keel__base64_encoded_bytes(length) + 1 bytes. */
void keel__base64_encode(const uint8_t *data, size_t length, char *text);
/* Strict: padded, standard alphabet, zero bits under the padding (KEEL_ECORRUPT). *data_p
 * has a NUL after its length bytes; the caller frees it. */
keel_status keel__base64_decode(const char *text, size_t text_length, uint8_t **data_p,
                                size_t *length_p);
char *keel__etcd_range_request(const char *key, bool prefix);
char *keel__etcd_put_request(const char *key, const void *value, size_t length, int64_t lease);
char *keel__etcd_delete_request(const char *key, bool prefix);
/* A txn: put if the key's mod_revision is expected_revision (0: if it is absent). */
char *keel__etcd_cas_request(const char *key, uint64_t expected_revision, const void *value,
                             size_t length, int64_t lease);
/* A txn of one prefix range per prefix (1 to KEEL_STORE_MAX_PREFIXES; "" is every key). */
char *keel__etcd_ranges_request(const char *const *prefixes, size_t count);
/* What a wait reads before it watches: the keys (no values) under prefix changed after
 * after_revision; and how many keys prefix held at a past revision (>= 1). */
char *keel__etcd_changed_since_request(const char *prefix, uint64_t after_revision);
char *keel__etcd_count_at_request(const char *prefix, uint64_t revision);
/* A watch of every key under prefix from start_revision (>= 1) on. */
char *keel__etcd_watch_request(const char *prefix, uint64_t start_revision);
char *keel__etcd_lease_grant_request(int64_t ttl_seconds);
/* The body of /v3/lease/keepalive and /v3/lease/revoke. */
char *keel__etcd_lease_id_request(int64_t lease);
keel_status keel__etcd_range_reply(const char *body, size_t length, keel_store_entry **entries_p,
                                   size_t *count_p, uint64_t *revision_p, char *message,
                                   size_t capacity);
/* The reply to keel__etcd_ranges_request of range_count prefixes: every range's entries
 * in order, at the txn's revision. */
keel_status keel__etcd_ranges_reply(const char *body, size_t length, size_t range_count,
                                    keel_store_entry **entries_p, size_t *count_p,
                                    uint64_t *revision_p, char *message, size_t capacity);
/* The reply to either request above: "count", how many keys it listed, the header's
 * revision. */
keel_status keel__etcd_range_count_reply(const char *body, size_t length, int64_t *count_p,
                                         size_t *listed_p, uint64_t *revision_p, char *message,
                                         size_t capacity);
/* A txn's reply: a failed one has no "succeeded". */
keel_status keel__etcd_txn_reply(const char *body, size_t length, bool *succeeded_p,
                                 uint64_t *revision_p, char *message, size_t capacity);
/* A put's or deleterange's reply: the header's revision, and how many keys were deleted. */
keel_status keel__etcd_write_reply(const char *body, size_t length, int64_t *deleted_p,
                                   uint64_t *revision_p, char *message, size_t capacity);
keel_status keel__etcd_lease_grant_reply(const char *body, size_t length, int64_t *lease_p,
                                         int64_t *ttl_seconds_p, char *message, size_t capacity);
/* One message of the keepalive stream; a TTL of 0 (left out) is a lease that is gone
 * (KEEL_ENOTFOUND). */
keel_status keel__etcd_keepalive_reply(const char *body, size_t length, int64_t *ttl_seconds_p,
                                       char *message, size_t capacity);
/* /v3/lease/timetolive: {"header", "ID", "TTL", "grantedTTL"}; a TTL of -1 is a lease that
 * is gone (KEEL_ENOTFOUND), one left out is 0 s left. */
keel_status keel__etcd_lease_ttl_reply(const char *body, size_t length, int64_t *left_seconds_p,
                                       int64_t *granted_seconds_p, char *message, size_t capacity);
/* GET /debug/vars: its "raft.status" (etcd's raft node: "id" and "lead" in hex, "lead" "0"
 * without a leader, "term" the current term). The term /v3/maintenance/status reports is
 * the last applied entry's, which stands still while the members campaign. */
keel_status keel__etcd_raft_status_reply(const char *body, size_t length,
                                         keel_store_member_state *state);
/* /v3/cluster/member/list: the ids of the members that vote (learners do not), at most
 * capacity of them (KEEL_ERANGE beyond). */
keel_status keel__etcd_member_list_reply(const char *body, size_t length, uint64_t *voters,
                                         size_t capacity, size_t *count_p, char *message,
                                         size_t message_capacity);
/* One message of a watch stream, as far as a wait needs it. */
typedef struct keel__etcd_watch_message {
  uint64_t revision; /* the header's: the store's revision when the message was sent */
  bool created;      /* the answer to the create_request */
  bool canceled;     /* the watch ended (compacted start, or the server's reason) */
  int64_t compact_revision;
  size_t events;
} keel__etcd_watch_message;
keel_status keel__etcd_watch_reply(const char *body, size_t length,
                                   keel__etcd_watch_message *message_p, char *message,
                                   size_t capacity);

#endif
