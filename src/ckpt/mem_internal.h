/* Private to src/ckpt: what the in-memory checkpoints of workers (mem.c) and the snapshot
 * service of agents (mem_agent.c) share: the node's folder of shared-memory slots, the
 * control page through which a worker and its agent coordinate, and the wire format of the
 * service (mem_protocol.c). */
#ifndef KEEL_CKPT_MEM_INTERNAL_H
#define KEEL_CKPT_MEM_INTERNAL_H

#include <stdatomic.h>

#include "ckpt/ckpt_internal.h"

/* ---- slots: one file of the node's folder mapped shared (a region of the memory tier).
 * Names: "rank-<r>.slot-<i>" (a worker's own snapshots, i < KEEL__CKPT_OWN_SLOTS),
 * "peer-<r>.slot-<i>" (copies of rank r's snapshots sent by a peer agent, i <
 * KEEL__CKPT_PEER_SLOTS), "rank-<r>.control" (the control page).
 *
 * Why three own slots: a worker writes snapshot s+1 only once snapshot s is on every peer
 * (Gemini: a checkpoint completes within its iteration), so a peer's newest complete copy
 * of any rank is at most one snapshot behind that rank's newest; and survivors may be one
 * step ahead of a rank lost inside a collective. So the step the job may have to go back
 * to is at most two snapshots behind a survivor's newest: three slots keep it. A peer keeps
 * two: the newest complete copy, and the one being received. */
#define KEEL__CKPT_OWN_SLOTS 3
#define KEEL__CKPT_PEER_SLOTS 2
typedef struct keel__ckpt_slot {
  int file;
  keel_ckpt_region region;
} keel__ckpt_slot;

/* Opens directory/name and maps it shared. With bytes > 0 the file is made that size
 * (created if missing) and its pages are faulted in now (MAP_POPULATE; huge pages where the
 * kernel gives them for shared memory), so that the first save runs at memory speed; with
 * bytes 0 an existing file is mapped whole. KEEL_ENOTFOUND when it is missing (bytes 0). */
keel_status keel__ckpt_slot_open(const char *directory, const char *name, size_t bytes,
                                 keel__ckpt_slot *slot);
void keel__ckpt_slot_close(keel__ckpt_slot *slot);

/* The slots of a folder whose names start with prefix ("rank-", "peer-", or "" for both),
 * mapped read-only-in-practice (shared: a writer's seal shows at once). *slots_p is
 * allocated (free with keel__ckpt_slots_close). */
keel_status keel__ckpt_slots_list(const char *directory, const char *prefix,
                                  keel__ckpt_slot **slots_p, size_t *count_p);
void keel__ckpt_slots_close(keel__ckpt_slot *slots, size_t count);

/* A futex on a word of a shared mapping (between processes): waits while *word == expected,
 * at most timeout_ns (a wake, a signal or the timeout ends it; callers check again); wakes
 * every waiter. */
void keel__ckpt_futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns);
void keel__ckpt_futex_wake(_Atomic uint32_t *word);
/* Raises the word and wakes its waiters. */
void keel__ckpt_futex_ring(_Atomic uint32_t *word);

/* The identity of the snapshot a sealed region holds (its manifest decoded, no chunk
 * checked) and the seal it was read under: KEEL_ENOTFOUND when unsealed or rewritten
 * meanwhile, KEEL_ECORRUPT when malformed. */
keel_status keel__ckpt_region_identity(const keel_ckpt_region *region,
                                       keel_ckpt_identity *identity_p, uint64_t *seal_p);

/* ---- the control page of a rank's slots ("rank-<r>.control"): the agent says which seal
 * of each slot every peer now holds, so that a worker reuses a slot only once its snapshot
 * is replicated. And the node's heartbeat page ("agent.heartbeat"): the agent's clock, moved
 * on every 100 ms, so that a worker never waits for an agent that is gone. */
#define KEEL__CKPT_CONTROL_MAGIC 0x4c52434bu /* "KCRL" */
#define KEEL__CKPT_MAX_WINDOWS 16
typedef struct keel__ckpt_control {
  uint32_t magic;
  uint32_t version;
  _Atomic uint64_t replicated[KEEL__CKPT_OWN_SLOTS]; /* the seal of slot i that every peer
                                                        holds; 0: none */
  /* The step the worker is in and when it began (CLOCK_MONOTONIC, one clock per host). */
  _Atomic uint64_t step;
  _Atomic int64_t step_begin_ns;
  /* The communication-idle windows of a step, learnt by profiling its first steps (Gemini
   * §5.4): window i starts window_start_ns[i] after the step's begin and lasts
   * window_length_ns[i] (the last one INT64_MAX: until the step ends). window_count is stored
   * last (release): 0 while there is no profile, and then the agent sends at once. */
  int64_t window_start_ns[KEEL__CKPT_MAX_WINDOWS];
  int64_t window_length_ns[KEEL__CKPT_MAX_WINDOWS];
  _Atomic uint32_t window_count;
  /* Raised by the agent (and woken, a futex shared between processes) whenever it updates
   * replicated[]: a worker waiting for its slot sleeps on it instead of polling. */
  _Atomic uint32_t replicated_sequence;
  uint8_t padding[4096 - 32 - 8 * KEEL__CKPT_OWN_SLOTS - 16 * KEEL__CKPT_MAX_WINDOWS];
} keel__ckpt_control;
_Static_assert(sizeof(keel__ckpt_control) == 4096, "the control page is one page");

typedef struct keel__ckpt_heartbeat {
  _Atomic int64_t agent_ns; /* CLOCK_MONOTONIC, which every process of the host shares */
  /* Raised and woken by a worker each time it seals a snapshot: the agent sleeps on it
   * (a futex) instead of polling the slots. */
  _Atomic uint32_t doorbell;
  uint8_t padding[4096 - 12];
} keel__ckpt_heartbeat;
_Static_assert(sizeof(keel__ckpt_heartbeat) == 4096, "the heartbeat page is one page");
#define KEEL__CKPT_HEARTBEAT_NAME "agent.heartbeat"
#define KEEL__CKPT_HEARTBEAT_EVERY_NS (100 * 1000 * 1000)

/* ---- the service's wire format, version 1, little-endian.
 * Requests (KEEL_FRAME_CKPT_REQUEST), payload KEEL__CKPT_REQUEST_BYTES:
 *   op u16 | zero u16 | origin_rank u32 | shard_index u32 | shard_count u32 |
 *   step u64 | region_bytes u64 | header 64 bytes (OFFER only; zero otherwise)
 *   op 1 OFFER:  a peer's snapshot of origin_rank follows: region_bytes in DATA frames, the
 *                region's header here (its seal is not taken); identity fields as its
 *                manifest says. Answer: READY (status) before any DATA is sent.
 *   op 2 COMMIT: every DATA frame of the offer was sent; the copy is checked and sealed.
 *                Answer: status (KEEL_ECORRUPT: refused, the copy is not counted).
 *   op 3 FETCH:  the newest complete snapshot held here of shard_index of shard_count at
 *                step (UINT64_MAX: any step). Answer: status and region_bytes, then (OK)
 *                region_bytes in DATA frames, then a final answer: OK, or KEEL_EAGAIN when
 *                the region was rewritten while it was sent.
 *   op 5 PROBE:  as FETCH, but only asks: the answer's value is the newest step at or below
 *                step of which a complete snapshot of the shard is held here.
 * DATA (KEEL_FRAME_CKPT_DATA): the frame's tag is the offset of the payload in the region,
 *   in order; an offer's start after the header (sent in the OFFER), a fetch's at 0.
 * Answers (KEEL_FRAME_CKPT_REPLY), payload 16: op u16 (the request's; 4 ACK of a DATA) |
 *   zero u16 | status i32 | value u64 (FETCH: region_bytes; ACK: the DATA's offset; PROBE:
 *   the step). */
#define KEEL__CKPT_REQUEST_BYTES 96
#define KEEL__CKPT_REPLY_BYTES 16
#define KEEL__CKPT_HEADER_BYTES 64
/* The largest region a peer accepts: the limit of one snapshot. */
#define KEEL__CKPT_MAX_REGION_BYTES ((uint64_t)64 << 30)

typedef enum keel__ckpt_op {
  KEEL__CKPT_OFFER = 1,
  KEEL__CKPT_COMMIT = 2,
  KEEL__CKPT_FETCH = 3,
  KEEL__CKPT_ACK = 4,
  KEEL__CKPT_PROBE = 5,
} keel__ckpt_op;

typedef struct keel__ckpt_request {
  uint16_t op;
  uint32_t origin_rank, shard_index, shard_count;
  uint64_t step, region_bytes;
  uint8_t header[KEEL__CKPT_HEADER_BYTES];
} keel__ckpt_request;

typedef struct keel__ckpt_reply {
  uint16_t op;
  int32_t status;
  uint64_t value;
} keel__ckpt_reply;

void keel__ckpt_request_encode(const keel__ckpt_request *request,
                               uint8_t out[KEEL__CKPT_REQUEST_BYTES]);
/* Strict: exact length, known op, zero padding, region_bytes within
 * (KEEL__CKPT_HEADER_BYTES, KEEL__CKPT_MAX_REGION_BYTES] for OFFER. KEEL_EPROTO otherwise. */
keel_status keel__ckpt_request_decode(const uint8_t *data, size_t length,
                                      keel__ckpt_request *request_p);
void keel__ckpt_reply_encode(const keel__ckpt_reply *reply, uint8_t out[KEEL__CKPT_REPLY_BYTES]);
keel_status keel__ckpt_reply_decode(const uint8_t *data, size_t length, keel__ckpt_reply *reply_p);

/* Connects to a snapshot service and authenticates, with frames up to a chunk's size. A
 * refused connection is not retried: a service that refuses is gone (its node died), and
 * nobody waits on it. */
keel_status keel__ckpt_connect(const char *address, const keel_auth *auth, int64_t deadline_ns,
                               keel_link **link_p);

/* A link's calls, bounded by deadline_ns: one request, one answer. */
keel_status keel__ckpt_send_request(keel_link *link, const keel__ckpt_request *request,
                                    int64_t deadline_ns);
keel_status keel__ckpt_send_reply(keel_link *link, uint16_t op, keel_status status,
                                  uint64_t value, int64_t deadline_ns);
/* Waits for an answer to op (KEEL_EPROTO for anything else) and returns its status;
 * *value_p (may be NULL) gets its value. */
keel_status keel__ckpt_await_reply(keel_link *link, uint16_t op, uint64_t *value_p,
                                   int64_t deadline_ns);
/* DATA frames of one region to one link, in order, with at most `window` of them not yet
 * acknowledged (the pipelined buffers; 0: no ACKs are expected). */
#define KEEL__CKPT_MAX_IN_FLIGHT 64
typedef struct keel__ckpt_sender {
  keel_link *link;
  const uint8_t *base;
  uint64_t next;   /* the offset of the next frame */
  uint32_t window; /* <= KEEL__CKPT_MAX_IN_FLIGHT */
  uint32_t in_flight, oldest;
  uint64_t pending[KEEL__CKPT_MAX_IN_FLIGHT]; /* offsets awaiting their ACK, a ring */
} keel__ckpt_sender;
void keel__ckpt_sender_init(keel__ckpt_sender *sender, keel_link *link,
                            const keel_ckpt_region *region, uint64_t first, uint32_t window);
/* Sends the next length bytes as one frame, first waiting for the oldest ACK when the window
 * is full. */
keel_status keel__ckpt_sender_send(keel__ckpt_sender *sender, uint64_t length, int64_t deadline_ns);
/* Waits for every outstanding ACK. */
keel_status keel__ckpt_sender_drain(keel__ckpt_sender *sender, int64_t deadline_ns);
/* The whole region from offset first on, chunk_bytes per frame. */
keel_status keel__ckpt_send_region(keel_link *link, const keel_ckpt_region *region,
                                   uint64_t first, uint64_t chunk_bytes, uint32_t window,
                                   int64_t deadline_ns);

/* The service's address for node i from its node/<i> value ("... ckpt=host:port"): false
 * when it has none. */
bool keel__ckpt_agent_address_parse(const char *value, size_t length, char *address,
                                    size_t capacity);

#endif
