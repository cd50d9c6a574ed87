/* keel net: authenticated, framed links between the processes of one job. A link is a
 * TCP connection (shared memory comes later behind the same ops) that starts with a
 * mutual challenge-response on the job's secret token and then carries frames, each with
 * a header checked before anything is allocated. Depends on core only. */
#ifndef KEEL_NET_H
#define KEEL_NET_H

#include "keel/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- frames. On the wire, little-endian, KEEL_FRAME_HEADER_BYTES bytes:
 *   magic u32 | version u16 | type u16 | job_id u64 | epoch u64 | tag u64 |
 *   length u64 | source u32 | payload_crc32c u32 | header_crc32c u32 | reserved u32
 * header_crc32c covers the 48 bytes before it; payload_crc32c covers the payload. */
#define KEEL_FRAME_MAGIC 0x4c45454bu /* "KEEL" read as little-endian bytes */
#define KEEL_FRAME_VERSION 1
#define KEEL_FRAME_HEADER_BYTES 56
/* Default bound on a frame's payload; a link may be given another with
 * keel_link_set_max_payload. Larger payloads are refused before allocation. */
#define KEEL_FRAME_DEFAULT_MAX_PAYLOAD ((uint64_t)256 << 20)

typedef enum keel_frame_type {
  KEEL_FRAME_HELLO = 1,     /* handshake: connector's nonce and identity */
  KEEL_FRAME_CHALLENGE = 2, /* handshake: acceptor's nonce and proof */
  KEEL_FRAME_RESPONSE = 3,  /* handshake: connector's proof */
  KEEL_FRAME_WELCOME = 4,   /* handshake: acceptor's verdict, identity */
  KEEL_FRAME_LINKED = 5,    /* handshake: the connector has the welcome; the link counts */
  KEEL_FRAME_DATA = 16,     /* collective payload */
  KEEL_FRAME_REVOKE = 17,   /* the sender revoked the communicator of this epoch */
  KEEL_FRAME_MESSAGE = 18,  /* point-to-point message (keel_comm_isend: state transfers) */
  KEEL_FRAME_CONTROL = 19,  /* small comm-level message (payload defined by comm) */
  KEEL_FRAME_STORE_REQUEST = 32,
  KEEL_FRAME_STORE_RESPONSE = 33,
  KEEL_FRAME_EC_REQUEST = 40,   /* to a parameter server (payload defined by ec) */
  KEEL_FRAME_EC_REPLY = 41,     /* a parameter server's answer; tag echoes the request's */
  KEEL_FRAME_CKPT_REQUEST = 44, /* to a node's snapshot service (payload defined by ckpt) */
  KEEL_FRAME_CKPT_DATA = 45,    /* snapshot bytes; the tag is their offset in the snapshot */
  KEEL_FRAME_CKPT_REPLY = 46,   /* a snapshot service's answer */
  KEEL_FRAME_GOODBYE = 48,      /* orderly close: the sender is leaving on purpose */
} keel_frame_type;

typedef struct keel_frame {
  uint16_t type; /* keel_frame_type */
  uint64_t job_id;
  uint64_t epoch;
  uint64_t tag;
  uint64_t length; /* payload bytes */
  uint32_t source; /* the sender's process id in the job (its uid), set by the sender */
  uint32_t payload_crc32c;
} keel_frame;

/* Encodes header into KEEL_FRAME_HEADER_BYTES bytes at wire; frame->payload_crc32c must
 * already hold the payload's crc. Never fails. */
void keel_frame_encode(const keel_frame *frame, uint8_t *wire);
/* Decodes and checks a header: magic, version, header crc, known type, job id (unless
 * expected_job_id is 0) and length <= max_payload. Writes *frame_p only on success.
 * Returns KEEL_ECORRUPT (bad magic/crc/type), KEEL_EPROTO (version or job mismatch),
 * KEEL_ERANGE (length over the bound). Pure function: the fuzz target's entry point. */
keel_status keel_frame_decode(const uint8_t *wire, size_t wire_length, uint64_t expected_job_id,
                              uint64_t max_payload, keel_frame *frame_p);

/* ---- authentication material of a job: its id and 32-byte secret token. */
#define KEEL_TOKEN_BYTES 32
typedef struct keel_auth {
  uint64_t job_id;
  uint8_t token[KEEL_TOKEN_BYTES];
  uint32_t local_id; /* this process's uid in the job, announced in the handshake */
} keel_auth;

/* Fills token with fresh random bytes (libsodium) and job_id with a random non-zero id. */
keel_status keel_auth_generate(keel_auth *auth);
/* Reads KEEL_JOB_ID (decimal) and KEEL_JOB_TOKEN (64 hex digits) from the environment;
 * local_id is left 0. KEEL_EINVAL with a logged message when missing or malformed. */
keel_status keel_auth_from_env(keel_auth *auth);

/* ---- listeners and links. All calls that can wait take an absolute deadline
 * (KEEL_NO_DEADLINE to wait forever) and return KEEL_ETIMEDOUT when it passes. Links and
 * listeners are owned by the caller and freed by their close function; a link is used by
 * one thread at a time. No call raises SIGPIPE. */
typedef struct keel_listener keel_listener;
typedef struct keel_link keel_link;

/* Listens on "host:port" (port 0 picks a free one), non-blocking, close-on-exec. */
keel_status keel_listener_open(const char *address, keel_listener **listener_p);
/* "host:port" with the real port; valid until the listener is closed. */
const char *keel_listener_address(const keel_listener *listener);
int keel_listener_fd(const keel_listener *listener);
/* Accepts one connection and runs the acceptor's side of the handshake. Returns
 * KEEL_EAGAIN if no connection is pending when deadline is 0 (a poll; a connection that is
 * pending then gets up to 2 s for its handshake), KEEL_EAUTH when the
 * connector failed authentication (its socket is closed; the listener stays usable),
 * KEEL_ETIMEDOUT when the handshake did not finish by handshake_deadline_ns. */
keel_status keel_listener_accept(keel_listener *listener, const keel_auth *auth,
                                 int64_t handshake_deadline_ns, keel_link **link_p);
void keel_listener_close(keel_listener *listener);

/* Connects to "host:port" and runs the connector's side of the handshake: the acceptor
 * must prove knowledge of the token too (mutual), so a process cannot be lured into an
 * impostor's job. Retries refused connections until the deadline (the peer may not be
 * listening yet). KEEL_EAUTH when the acceptor refused or did not prove the token (wrong
 * token, another job), KEEL_ECLOSED when it went away during the handshake (a peer that
 * died, not a refusal). */
keel_status keel_link_connect(const char *address, const keel_auth *auth, int64_t deadline_ns,
                              keel_link **link_p);
/* keel_link_connect that asks keep_trying(context) before each retry of a refused
 * connection, and every 100 ms while an attempt gets no answer at all (a partitioned host
 * drops it): false ends the wait at once with KEEL_ECONNREFUSED, for a caller that learns
 * meanwhile that nobody will listen there again (the peer was declared dead). */
typedef bool keel_link_retry_fn(void *context);
keel_status keel_link_connect_while(const char *address, const keel_auth *auth, int64_t deadline_ns,
                                    keel_link_retry_fn *keep_trying, void *context,
                                    keel_link **link_p);
/* The peer's uid announced in the handshake. */
uint32_t keel_link_peer_id(const keel_link *link);
int keel_link_fd(const keel_link *link);
void keel_link_set_max_payload(keel_link *link, uint64_t max_payload);
/* Closes the socket and frees the link and any frame it still owns. NULL is allowed. */
void keel_link_close(keel_link *link);

/* Blocking send of one frame (header fields type, epoch, tag are the caller's; job_id,
 * source, length and crcs are filled in). Must not be called while a non-blocking send
 * is in progress on the link. */
keel_status keel_link_send(keel_link *link, const keel_frame *frame, const void *payload,
                           size_t length, int64_t deadline_ns);
/* Blocking receive of one whole frame into a buffer the link allocates (bounded by the
 * link's max payload); the caller frees *payload_p with free() (NULL for an empty payload). */
keel_status keel_link_recv(keel_link *link, keel_frame *frame_p, void **payload_p,
                           int64_t deadline_ns);

/* ---- non-blocking use, for a progress engine that polls many links at once.
 *
 * Sending: keel_link_send_begin queues one frame whose payload stays owned by the caller
 * and must stay valid until the send completes or is detached. At most one frame is in
 * flight per link. keel_link_send_progress writes what the socket takes: KEEL_OK when the
 * frame is fully written, KEEL_EAGAIN when more remains (poll for POLLOUT), an error when
 * the link is broken. keel_link_send_detach copies whatever is left of the frame into
 * memory the link owns, so the caller may reuse its buffer while the rest is written by
 * later progress calls: a frame once begun is always finished, so the byte stream stays
 * in frame order even when the operation that sent it was abandoned. */
keel_status keel_link_send_begin(keel_link *link, const keel_frame *frame, const void *payload,
                                 size_t length);
keel_status keel_link_send_progress(keel_link *link);
keel_status keel_link_send_detach(keel_link *link);
bool keel_link_send_busy(const keel_link *link);

/* Receiving: keel_link_recv_progress reads what is available and, for each frame:
 * calls sink->destination_cb once its header is checked, which returns where its payload
 * goes (a buffer of at least frame->length bytes) or NULL to have the link allocate one;
 * then, once the payload is in and its crc checked, calls sink->complete_cb with the
 * buffer and KEEL_OK (or KEEL_ECORRUPT; the link is then broken). A buffer the link
 * allocated passes to complete_cb's ownership (free() it). keel_link_recv_abandon makes
 * the rest of a partly received payload go to the bin instead of the buffer destination_cb
 * returned, so that buffer may be reused; complete_cb is then called with buffer NULL and
 * KEEL_ECANCELED. If the link breaks while a payload is coming in, complete_cb gets buffer
 * NULL and the link's error. Returns KEEL_EAGAIN when the socket is drained, KEEL_ECLOSED when the
 * peer closed the link (after completing any whole frames before the close), or another
 * error when the link broke; a broken link stays broken. */
typedef struct keel_link_sink {
  void *(*destination_cb)(void *context, keel_link *link, const keel_frame *frame);
  void (*complete_cb)(void *context, keel_link *link, const keel_frame *frame, void *payload,
                      keel_status status);
  void *context;
} keel_link_sink;

keel_status keel_link_recv_progress(keel_link *link, const keel_link_sink *sink);
void keel_link_recv_abandon(keel_link *link);

#ifdef __cplusplus
}
#endif
#endif
