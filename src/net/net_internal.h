/* Private to src/net: the link's state, shared by the frame engine (link.c), the handshake
 * (auth.c) and the socket set-up (socket.c). Nothing here is part of the public API. */
#ifndef KEEL_NET_INTERNAL_H
#define KEEL_NET_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "keel/net.h"

/* Handshake frames are tiny; a peer that has not proved the token yet cannot make us read
 * more than this per frame. */
#define KEEL__HANDSHAKE_MAX_PAYLOAD 128
/* Bytes read ahead from the socket in one recv: whole small frames arrive in one system
 * call, while large payloads are read straight into their destination. */
#define KEEL__STAGING_BYTES 16384
/* Inside a large payload, a poll for more wakes only once this much of it has come (or all
 * that is left of it): one wake per few hundred kilobytes instead of one per few packets.
 * The bytes are sure to come, the sender writing whole frames. */
#define KEEL__RECEIVE_LOW_MARK_BYTES (128 * 1024)
/* Room for "[ipv6]:port" and a NUL. */
#define KEEL__ADDRESS_BYTES 64

struct keel_link {
  int fd;
  uint64_t job_id;
  uint32_t local_id;
  uint32_t peer_id;
  uint64_t max_payload;
  /* KEEL_OK while healthy; once set, every later call returns it. */
  keel_status broken;
  /* Until the handshake ends only handshake frames, with tiny payloads, are valid. */
  bool handshaking;
  char peer_address[KEEL__ADDRESS_BYTES];

  /* The frame being sent: the rest of the header, then the rest of the payload. */
  bool send_active;
  size_t send_header_sent;
  const uint8_t *send_payload;
  size_t send_length;
  size_t send_sent;
  uint8_t *send_detached; /* link-owned copy of the unsent bytes after a detach */
  uint8_t send_header[KEEL_FRAME_HEADER_BYTES];

  /* The frame being received; its header is already checked when recv_in_payload. */
  bool recv_in_payload;
  bool recv_destination_owned; /* allocated by the link, freed unless handed on */
  bool recv_discarding;        /* abandoned or unallocatable: bytes go to the bin */
  keel_status recv_discard_status;
  keel_frame recv_frame;
  uint8_t *recv_destination;
  uint64_t recv_received;
  uint32_t recv_crc;
  /* Bytes read from the socket and not yet consumed: [staged_start, staged_end). */
  size_t staged_start;
  size_t staged_end;
  /* The socket's SO_RCVLOWAT as last set (0: the kernel's default, 1). */
  int receive_low_mark;
  uint8_t staging[KEEL__STAGING_BYTES];
};

/* Wraps a connected, non-blocking socket in a link in the handshaking state; takes over fd
 * (closed on failure too). */
keel_status keel__link_create(int fd, const keel_auth *auth, const char *peer_address,
                              keel_link **link_p);
/* Receives one whole frame of the expected type into buffer (capacity bytes; the link's
 * max payload must not exceed it) by deadline; *length_p gets the payload length. */
keel_status keel__link_recv_into(keel_link *link, uint16_t type, void *buffer, size_t capacity,
                                 size_t *length_p, int64_t deadline_ns);
/* Sends one frame, waiting up to deadline; the public keel_link_send without its checks of
 * the frame type, so that the handshake can send handshake frames. */
keel_status keel__link_send_blocking(keel_link *link, const keel_frame *frame, const void *payload,
                                     size_t length, int64_t deadline_ns);

/* The two sides of the mutual challenge-response (auth.c). On success the link carries
 * data frames and knows its peer's uid; on failure the caller closes it. Each logs its
 * failure once. Return KEEL_EAUTH for any failure but a timeout (KEEL_ETIMEDOUT). */
keel_status keel__handshake_connect(keel_link *link, const keel_auth *auth, int64_t deadline_ns);
keel_status keel__handshake_accept(keel_link *link, const keel_auth *auth, int64_t deadline_ns);


/* True for the four handshake frame types; for every type net.h names. */
bool keel__frame_is_handshake(uint16_t type);
bool keel__frame_type_known(uint16_t type);

#endif
