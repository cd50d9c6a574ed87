/* The frame engine of a link: non-blocking send and receive state machines over one TCP
 * socket, and the blocking calls built on them as poll loops with a deadline. Large
 * payloads move straight between the socket and the caller's memory; small frames are
 * read ahead into a staging buffer so that many arrive in one system call. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "net_internal.h"

#define LOG_MODULE "net"
#define HUGE_PAGE_BYTES ((uint64_t)2 << 20)

keel_status keel__link_create(int fd, const keel_auth *auth, const char *peer_address,
                              keel_link **link_p) {
  keel_link *link = calloc(1, sizeof *link);
  if (link == NULL) {
    close(fd);
    KEEL_LOG_E(LOG_MODULE, "no memory for a link to %s", peer_address);
    return KEEL_ENOMEM;
  }
  link->fd = fd;
  link->job_id = auth->job_id;
  link->local_id = auth->local_id;
  link->max_payload = KEEL__HANDSHAKE_MAX_PAYLOAD;
  link->handshaking = true;
  link->broken = KEEL_OK;
  snprintf(link->peer_address, sizeof link->peer_address, "%s", peer_address);
  *link_p = link;
  return KEEL_OK;
}

uint32_t keel_link_peer_id(const keel_link *link) { return link->peer_id; }

int keel_link_fd(const keel_link *link) { return link->fd; }

void keel_link_set_max_payload(keel_link *link, uint64_t max_payload) {
  link->max_payload = max_payload;
}

void keel_link_close(keel_link *link) {
  if (link == NULL) return;
  if (link->recv_destination_owned) free(link->recv_destination);
  free(link->send_detached);
  close(link->fd);
  free(link);
}

/* Marks the link broken with status (the first failure wins and is logged once, here
 * where it is decided) and shuts the socket so that the peer learns of it at once; the
 * descriptor stays open until keel_link_close so that its number is not reused under a
 * caller's poll set. During the handshake the handshake logs the verdict instead. */
static keel_status link_fail(keel_link *link, keel_status status, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
static keel_status link_fail(keel_link *link, keel_status status, const char *format, ...) {
  if (link->broken != KEEL_OK) return link->broken;
  link->broken = status;
  shutdown(link->fd, SHUT_RDWR);
  keel_log_level level = KEEL_LOG_WARN;
  if (link->handshaking || status == KEEL_ECLOSED) level = KEEL_LOG_DEBUG;
  if (keel_log_enabled(level)) {
    char reason[256];
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(reason, sizeof reason, format, arguments);
    va_end(arguments);
    keel_log(level, LOG_MODULE, "link to %s (peer %u) broken: %s (%s)", link->peer_address,
             (unsigned)link->peer_id, reason, keel_status_name(status));
  }
  return status;
}

/* Waits until the socket is ready for events or the deadline passes. Readiness includes
 * errors and hang-ups: the next system call reports them. */
static keel_status link_wait(keel_link *link, short events, int64_t deadline_ns) {
  for (;;) {
    struct pollfd entry = {.fd = link->fd, .events = events};
    int ready = poll(&entry, 1, keel_poll_timeout_ms(deadline_ns));
    if (ready > 0) return KEEL_OK;
    if (ready == 0) {
      if (keel_now_ns() >= deadline_ns) return KEEL_ETIMEDOUT;
      continue;
    }
    int error = errno;
    if (error == EINTR) continue;
    return link_fail(link, keel_status_from_errno(error), "poll: %s", strerror(error));
  }
}

/* ---- sending */

static keel_status link_send_start(keel_link *link, const keel_frame *frame, const void *payload,
                                   size_t length) {
  if (link->broken != KEEL_OK) return link->broken;
  if (link->send_active) return KEEL_EAGAIN;
  if (length > 0 && payload == NULL) return KEEL_EINVAL;
  keel_frame header = *frame;
  header.job_id = link->job_id;
  header.source = link->local_id;
  header.length = length;
  header.payload_crc32c = keel_crc32c(0, payload, length);
  keel_frame_encode(&header, link->send_header);
  link->send_active = true;
  link->send_header_sent = 0;
  link->send_payload = payload;
  link->send_length = length;
  link->send_sent = 0;
  return KEEL_OK;
}

/* A frame type the caller may send once the handshake is over: a known one that the peer
 * will not refuse. */
static keel_status link_check_type(uint16_t type) {
  if (!keel__frame_type_known(type) || keel__frame_is_handshake(type)) return KEEL_EINVAL;
  return KEEL_OK;
}

keel_status keel_link_send_begin(keel_link *link, const keel_frame *frame, const void *payload,
                                 size_t length) {
  if (link_check_type(frame->type) != KEEL_OK) {
    KEEL_LOG_E(LOG_MODULE, "refusing to send a frame of type %u", (unsigned)frame->type);
    return KEEL_EINVAL;
  }
  return link_send_start(link, frame, payload, length);
}

bool keel_link_send_busy(const keel_link *link) { return link->send_active; }

static void link_send_finish(keel_link *link) {
  link->send_active = false;
  link->send_payload = NULL;
  free(link->send_detached);
  link->send_detached = NULL;
}

keel_status keel_link_send_progress(keel_link *link) {
  if (link->broken != KEEL_OK) return link->broken;
  while (link->send_active) {
    struct iovec parts[2];
    int count = 0;
    if (link->send_header_sent < KEEL_FRAME_HEADER_BYTES) {
      parts[count].iov_base = link->send_header + link->send_header_sent;
      parts[count].iov_len = KEEL_FRAME_HEADER_BYTES - link->send_header_sent;
      count++;
    }
    if (link->send_sent < link->send_length) {
      parts[count].iov_base = (void *)(link->send_payload + link->send_sent);
      parts[count].iov_len = link->send_length - link->send_sent;
      count++;
    }
    if (count == 0) {
      link_send_finish(link);
      break;
    }
    struct msghdr message = {.msg_iov = parts, .msg_iovlen = (size_t)count};
    ssize_t written = sendmsg(link->fd, &message, MSG_NOSIGNAL);
    if (written < 0) {
      int error = errno;
      if (error == EINTR) continue;
      if (error == EAGAIN || error == EWOULDBLOCK) return KEEL_EAGAIN;
      return link_fail(link, keel_status_from_errno(error), "send: %s", strerror(error));
    }
    size_t done = (size_t)written;
    size_t header_left = KEEL_FRAME_HEADER_BYTES - link->send_header_sent;
    size_t header_part = done < header_left ? done : header_left;
    link->send_header_sent += header_part;
    link->send_sent += done - header_part;
  }
  return KEEL_OK;
}

keel_status keel_link_send_detach(keel_link *link) {
  if (!link->send_active || link->send_detached != NULL) return KEEL_OK;
  /* One contiguous copy of what is left, unsent header bytes first, so that the caller's
   * payload is free at once and the frame still goes out whole. */
  size_t header_left = KEEL_FRAME_HEADER_BYTES - link->send_header_sent;
  size_t payload_left = link->send_length - link->send_sent;
  size_t total = header_left + payload_left;
  uint8_t *copy = malloc(total > 0 ? total : 1);
  if (copy == NULL) {
    KEEL_LOG_E(LOG_MODULE, "no memory to detach %zu unsent bytes to %s", total, link->peer_address);
    return KEEL_ENOMEM;
  }
  memcpy(copy, link->send_header + link->send_header_sent, header_left);
  if (payload_left > 0)
    memcpy(copy + header_left, link->send_payload + link->send_sent, payload_left);
  link->send_detached = copy;
  link->send_header_sent = KEEL_FRAME_HEADER_BYTES;
  link->send_payload = copy;
  link->send_length = total;
  link->send_sent = 0;
  return KEEL_OK;
}

/* Drives the send in flight to its end or to the deadline. On a timeout the rest is
 * detached, so the caller's payload is free and the byte stream keeps frame order. */
static keel_status link_send_flush(keel_link *link, int64_t deadline_ns) {
  for (;;) {
    keel_status status = keel_link_send_progress(link);
    if (status != KEEL_EAGAIN) return status;
    status = link_wait(link, POLLOUT, deadline_ns);
    if (status == KEEL_ETIMEDOUT) {
      if (keel_link_send_detach(link) != KEEL_OK)
        return link_fail(link, KEEL_ENOMEM, "cannot keep the rest of a timed-out frame");
      return KEEL_ETIMEDOUT;
    }
    if (status != KEEL_OK) return status;
  }
}

keel_status keel__link_send_blocking(keel_link *link, const keel_frame *frame, const void *payload,
                                     size_t length, int64_t deadline_ns) {
  /* A frame left in flight by a non-blocking send (a detached one, typically) goes first. */
  keel_status status = link_send_flush(link, deadline_ns);
  if (status != KEEL_OK) return status;
  status = link_send_start(link, frame, payload, length);
  if (status != KEEL_OK) return status;
  return link_send_flush(link, deadline_ns);
}

keel_status keel_link_send(keel_link *link, const keel_frame *frame, const void *payload,
                           size_t length, int64_t deadline_ns) {
  if (link_check_type(frame->type) != KEEL_OK) {
    KEEL_LOG_E(LOG_MODULE, "refusing to send a frame of type %u", (unsigned)frame->type);
    return KEEL_EINVAL;
  }
  return keel__link_send_blocking(link, frame, payload, length, deadline_ns);
}

/* ---- receiving */

static void link_recv_reset(keel_link *link) {
  link->recv_in_payload = false;
  link->recv_destination = NULL;
  link->recv_destination_owned = false;
  link->recv_discarding = false;
}

/* Ends the frame in progress, if any, when the link broke under it: the caller learns
 * that the buffer destination_cb gave is no longer written. */
static void link_recv_fail_pending(keel_link *link, const keel_link_sink *sink) {
  if (!link->recv_in_payload) return;
  if (link->recv_destination_owned) free(link->recv_destination);
  keel_frame frame = link->recv_frame;
  link_recv_reset(link);
  if (sink != NULL && sink->complete_cb != NULL)
    sink->complete_cb(sink->context, link, &frame, NULL, link->broken);
}

void keel_link_recv_abandon(keel_link *link) {
  if (!link->recv_in_payload || link->recv_discarding) return;
  if (link->recv_destination_owned) free(link->recv_destination);
  link->recv_destination = NULL;
  link->recv_destination_owned = false;
  link->recv_discarding = true;
  link->recv_discard_status = KEEL_ECANCELED;
}

/* A payload buffer the link hands to the caller (who free()s it). Large ones are fresh
 * memory written once at socket speed, where faulting in 4 KiB pages costs more than the
 * copy itself: they are aligned for, and advised to use, transparent huge pages. */
static void *link_payload_alloc(uint64_t length) {
  if (length < HUGE_PAGE_BYTES) return malloc(length);
  size_t rounded = (size_t)((length + HUGE_PAGE_BYTES - 1) & ~(uint64_t)(HUGE_PAGE_BYTES - 1));
  void *buffer = aligned_alloc(HUGE_PAGE_BYTES, rounded);
  if (buffer != NULL) (void)madvise(buffer, rounded, MADV_HUGEPAGE);
  return buffer;
}

/* Checks the header at the front of the staging buffer and sets up its payload's
 * destination; nothing is allocated before the header passed every check. */
static keel_status link_recv_header(keel_link *link, const keel_link_sink *sink) {
  keel_frame frame;
  uint64_t bound = link->handshaking ? KEEL__HANDSHAKE_MAX_PAYLOAD : link->max_payload;
  /* Handshake frames of another job are read to the end: the handshake refuses them with a
   * proof that fails, which the other side can tell from a peer that died. */
  uint64_t job_id = link->handshaking ? 0 : link->job_id;
  keel_status status = keel_frame_decode(link->staging + link->staged_start,
                                         KEEL_FRAME_HEADER_BYTES, job_id, bound, &frame);
  if (status != KEEL_OK) return link_fail(link, status, "bad frame header");
  if (keel__frame_is_handshake(frame.type) != link->handshaking)
    return link_fail(link, KEEL_EPROTO, "unexpected frame type %u", (unsigned)frame.type);
  if (!link->handshaking && frame.source != link->peer_id)
    return link_fail(link, KEEL_EPROTO, "frame from uid %u", (unsigned)frame.source);
  link->staged_start += KEEL_FRAME_HEADER_BYTES;
  link->recv_frame = frame;
  link->recv_received = 0;
  link->recv_crc = 0;
  link->recv_in_payload = true;
  link->recv_discarding = false;
  void *destination = NULL;
  if (sink->destination_cb != NULL) destination = sink->destination_cb(sink->context, link, &frame);
  if (destination == NULL && frame.length > 0) {
    destination = link_payload_alloc(frame.length);
    if (destination == NULL) {
      /* The stream stays in step: the payload is read and dropped, and the frame
       * completes with KEEL_ENOMEM. */
      KEEL_LOG_E(LOG_MODULE, "no memory for a %llu-byte frame from %s",
                 (unsigned long long)frame.length, link->peer_address);
      link->recv_discarding = true;
      link->recv_discard_status = KEEL_ENOMEM;
    } else {
      link->recv_destination_owned = true;
    }
  }
  link->recv_destination = destination;
  return KEEL_OK;
}

/* Moves up to length payload bytes from source (staging) to the destination, or to the
 * bin, folding them into the running crc. */
static void link_recv_take(keel_link *link, const uint8_t *source, size_t length) {
  if (!link->recv_discarding) memcpy(link->recv_destination + link->recv_received, source, length);
  link->recv_crc = keel_crc32c(link->recv_crc, source, length);
  link->recv_received += length;
}

/* Ends the frame whose payload is all in: checks its crc and hands it to complete_cb. */
static keel_status link_recv_complete(keel_link *link, const keel_link_sink *sink) {
  keel_frame frame = link->recv_frame;
  bool intact = link->recv_crc == frame.payload_crc32c;
  void *payload = link->recv_discarding ? NULL : link->recv_destination;
  keel_status status = link->recv_discarding ? link->recv_discard_status : KEEL_OK;
  bool owned = link->recv_destination_owned;
  link_recv_reset(link);
  if (!intact) {
    link_fail(link, KEEL_ECORRUPT, "payload crc mismatch (%llu bytes, tag %llu)",
              (unsigned long long)frame.length, (unsigned long long)frame.tag);
    status = KEEL_ECORRUPT;
  }
  if (sink->complete_cb != NULL) {
    /* A buffer the link allocated passes to complete_cb here. */
    sink->complete_cb(sink->context, link, &frame, payload, status);
  } else if (owned) {
    free(payload);
  }
  return link->broken;
}

/* Before the caller polls a drained socket: inside a payload, wake it only once a good part
 * of the rest has come (SO_RCVLOWAT; a socket that refuses it keeps waking at every byte). */
static void link_low_mark_update(keel_link *link) {
  int wanted = 1;
  if (link->recv_in_payload && !link->recv_discarding) {
    uint64_t remaining = link->recv_frame.length - link->recv_received;
    wanted = remaining >= KEEL__RECEIVE_LOW_MARK_BYTES ? KEEL__RECEIVE_LOW_MARK_BYTES
             : remaining > 0                           ? (int)remaining
                                                       : 1;
  }
  int current = link->receive_low_mark > 0 ? link->receive_low_mark : 1;
  if (wanted == current) return;
  if (setsockopt(link->fd, SOL_SOCKET, SO_RCVLOWAT, &wanted, sizeof wanted) == 0)
    link->receive_low_mark = wanted;
}

/* Reads from the socket into the free end of the staging buffer, at most limit bytes, and,
 * when direct is not NULL, first up to direct_length bytes straight into direct. Returns
 * KEEL_OK with the counts, KEEL_EAGAIN, or the error that broke the link. */
static keel_status link_read(keel_link *link, uint8_t *direct, size_t direct_length, size_t limit,
                             size_t *direct_read_p) {
  if (link->staged_start == link->staged_end) {
    link->staged_start = 0;
    link->staged_end = 0;
  } else if (link->staged_start > 0) {
    size_t staged = link->staged_end - link->staged_start;
    memmove(link->staging, link->staging + link->staged_start, staged);
    link->staged_start = 0;
    link->staged_end = staged;
  }
  size_t room = KEEL__STAGING_BYTES - link->staged_end;
  if (limit < room) room = limit;
  struct iovec parts[2];
  int count = 0;
  if (direct != NULL && direct_length > 0) {
    parts[count].iov_base = direct;
    parts[count].iov_len = direct_length;
    count++;
  }
  if (room > 0) {
    parts[count].iov_base = link->staging + link->staged_end;
    parts[count].iov_len = room;
    count++;
  }
  ssize_t got;
  for (;;) {
    got = readv(link->fd, parts, count);
    if (got >= 0) break;
    int error = errno;
    if (error == EINTR) continue;
    if (error == EAGAIN || error == EWOULDBLOCK) {
      link_low_mark_update(link);
      return KEEL_EAGAIN;
    }
    return link_fail(link, keel_status_from_errno(error), "recv: %s", strerror(error));
  }
  if (got == 0) {
    bool at_boundary = !link->recv_in_payload && link->staged_end == link->staged_start;
    if (at_boundary) return link_fail(link, KEEL_ECLOSED, "peer closed the connection");
    return link_fail(link, KEEL_ECORRUPT, "peer closed the connection inside a frame");
  }
  size_t total = (size_t)got;
  size_t direct_read = direct != NULL ? (total < direct_length ? total : direct_length) : 0;
  link->staged_end += total - direct_read;
  *direct_read_p = direct_read;
  return KEEL_OK;
}

/* The receive state machine. Processes frames until the socket is drained (KEEL_EAGAIN),
 * the link breaks, or, with one_frame, one frame completes (KEEL_OK). In one_frame mode it
 * reads no byte past the current frame, so that whatever follows stays in the socket
 * where the caller's poll can see it. */
static keel_status link_recv_run(keel_link *link, const keel_link_sink *sink, bool one_frame) {
  if (link->broken != KEEL_OK) {
    link_recv_fail_pending(link, sink);
    return link->broken;
  }
  for (;;) {
    size_t staged = link->staged_end - link->staged_start;
    size_t direct_read = 0;
    keel_status status;
    if (!link->recv_in_payload) {
      if (staged >= KEEL_FRAME_HEADER_BYTES) {
        status = link_recv_header(link, sink);
        if (status != KEEL_OK) return status;
        continue;
      }
      size_t limit = one_frame ? KEEL_FRAME_HEADER_BYTES - staged : KEEL__STAGING_BYTES;
      status = link_read(link, NULL, 0, limit, &direct_read);
      if (status != KEEL_OK) return status;
      continue;
    }
    uint64_t remaining = link->recv_frame.length - link->recv_received;
    if (remaining == 0) {
      status = link_recv_complete(link, sink);
      if (status != KEEL_OK) return status;
      if (one_frame) return KEEL_OK;
      continue;
    }
    if (staged > 0) {
      size_t take = staged < remaining ? staged : (size_t)remaining;
      link_recv_take(link, link->staging + link->staged_start, take);
      link->staged_start += take;
      continue;
    }
    if (link->recv_discarding) {
      size_t limit =
          one_frame ? (size_t)(remaining < KEEL__STAGING_BYTES ? remaining : KEEL__STAGING_BYTES)
                    : KEEL__STAGING_BYTES;
      status = link_read(link, NULL, 0, limit, &direct_read);
    } else {
      /* The payload goes straight into its destination; read-ahead of what follows it
       * lands in the staging buffer in the same system call. */
      uint8_t *direct = link->recv_destination + link->recv_received;
      status = link_read(link, direct, (size_t)remaining, one_frame ? 0 : KEEL__STAGING_BYTES,
                         &direct_read);
      if (status == KEEL_OK && direct_read > 0) {
        link->recv_crc = keel_crc32c(link->recv_crc, direct, direct_read);
        link->recv_received += direct_read;
      }
    }
    if (status != KEEL_OK) {
      if (link->broken != KEEL_OK) link_recv_fail_pending(link, sink);
      return status;
    }
  }
}

keel_status keel_link_recv_progress(keel_link *link, const keel_link_sink *sink) {
  return link_recv_run(link, sink, false);
}

/* Receives frames until one completes with a status other than KEEL_ECANCELED (a frame
 * abandoned earlier may finish first) or the deadline passes. */
static keel_status link_recv_one(keel_link *link, const keel_link_sink *sink, const bool *done,
                                 int64_t deadline_ns) {
  for (;;) {
    keel_status status = link_recv_run(link, sink, true);
    if (*done) return KEEL_OK;
    if (status == KEEL_OK) continue;
    if (status != KEEL_EAGAIN) return status;
    status = link_wait(link, POLLIN, deadline_ns);
    if (status != KEEL_OK) return status;
  }
}

typedef struct link_capture {
  bool done;
  keel_status status;
  keel_frame frame;
  void *payload;
  void *buffer;
  size_t capacity;
} link_capture;

static void *capture_destination(void *context, keel_link *link, const keel_frame *frame) {
  link_capture *capture = context;
  return frame->length <= capture->capacity ? capture->buffer : NULL;
}

static void capture_complete(void *context, keel_link *link, const keel_frame *frame, void *payload,
                             keel_status status) {
  link_capture *capture = context;
  if (status == KEEL_ECANCELED) return;
  capture->done = true;
  capture->status = status;
  capture->frame = *frame;
  capture->payload = payload;
}

keel_status keel_link_recv(keel_link *link, keel_frame *frame_p, void **payload_p,
                           int64_t deadline_ns) {
  if (link->recv_in_payload && !link->recv_destination_owned && !link->recv_discarding) {
    /* Finishing it here would hand the caller's own buffer back as ours to free. */
    KEEL_LOG_E(LOG_MODULE,
               "keel_link_recv while keel_link_recv_progress has a frame in a "
               "caller's buffer; finish or abandon it first");
    return KEEL_EINVAL;
  }
  link_capture capture = {.status = KEEL_OK};
  keel_link_sink sink = {.complete_cb = capture_complete, .context = &capture};
  keel_status status = link_recv_one(link, &sink, &capture.done, deadline_ns);
  if (status != KEEL_OK) return status;
  if (capture.status != KEEL_OK) {
    free(capture.payload);
    return capture.status;
  }
  *frame_p = capture.frame;
  *payload_p = capture.payload;
  return KEEL_OK;
}

keel_status keel__link_recv_into(keel_link *link, uint16_t type, void *buffer, size_t capacity,
                                 size_t *length_p, int64_t deadline_ns) {
  link_capture capture = {.status = KEEL_OK, .buffer = buffer, .capacity = capacity};
  keel_link_sink sink = {
      .destination_cb = capture_destination, .complete_cb = capture_complete, .context = &capture};
  keel_status status = link_recv_one(link, &sink, &capture.done, deadline_ns);
  if (status != KEEL_OK) return status;
  if (capture.payload != NULL && capture.payload != buffer) free(capture.payload);
  if (capture.status != KEEL_OK) return capture.status;
  if (capture.frame.type != type || capture.payload != buffer)
    return link_fail(link, KEEL_EPROTO, "expected a frame of type %u, got %u", (unsigned)type,
                     (unsigned)capture.frame.type);
  *length_p = (size_t)capture.frame.length;
  return KEEL_OK;
}
