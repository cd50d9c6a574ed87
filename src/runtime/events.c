/* Status and event lines to the launcher: JSON objects, one per line (docs/RUNTIME.md),
 * each one record on the launcher's SOCK_SEQPACKET socket, so that lines of several workers
 * never interleave. Sending never blocks and never raises SIGPIPE (MSG_DONTWAIT,
 * MSG_NOSIGNAL): a launcher that is stopped or slow must never stall training, so a line
 * that does not fit is dropped and counted, and the next line that gets through carries the
 * count. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "runtime/runtime_internal.h"

#define MODULE KEEL__RUNTIME_MODULE
/* A status line is at most 4 KiB (the launcher's bound). */
#define LINE_MAX_BYTES 4000

struct keel__events {
  int fd;
  /* Lines come from the training thread and, rarely, the session thread. */
  atomic_uint_fast64_t dropped;
  atomic_bool warned;
};

keel_status keel__events_create(int fd, keel__events **events_p) {
  keel__events *events = calloc(1, sizeof *events);
  if (events == NULL) return KEEL_ENOMEM;
  events->fd = fd;
  atomic_init(&events->dropped, 0);
  atomic_init(&events->warned, false);
  *events_p = events;
  return KEEL_OK;
}

void keel__events_destroy(keel__events *events) { free(events); }

void keel__events_line(keel__events *events, uint32_t uid, int rank, uint64_t epoch,
                       const char *event, const char *fields) {
  if (events == NULL || events->fd < 0) return;
  char line[LINE_MAX_BYTES];
  uint64_t dropped = atomic_load(&events->dropped);
  char dropped_field[48] = "";
  if (dropped > 0) snprintf(dropped_field, sizeof dropped_field, ",\"dropped\":%" PRIu64, dropped);
  int length = snprintf(line, sizeof line,
                        "{\"event\":\"%s\",\"uid\":%" PRIu32 ",\"rank\":%d,\"epoch\":%" PRIu64
                        ",\"t_ns\":%" PRId64 "%s%s%s}\n",
                        event, uid, rank, epoch, keel_now_ns(), dropped_field,
                        fields && *fields ? "," : "", fields ? fields : "");
  if (length <= 0 || (size_t)length >= sizeof line) return;
  ssize_t sent;
  do {
    sent = send(events->fd, line, (size_t)length, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent == (ssize_t)length) {
    if (dropped > 0) atomic_fetch_sub(&events->dropped, dropped);
    return;
  }
  /* EAGAIN: the launcher is not reading; EPIPE / ECONNREFUSED: it is gone (the session
   * notices that on its own). */
  int error = sent < 0 ? errno : 0;
  atomic_fetch_add(&events->dropped, 1);
  if (error == ENOTSOCK && !atomic_exchange(&events->warned, true))
    KEEL_LOG_W(MODULE, "KEEL_STATUS_FD %d is not the launcher's socket: status lines are lost",
               events->fd);
}

static bool event_name_valid(const char *event) {
  size_t length = strlen(event);
  if (length == 0 || length > 31) return false;
  for (size_t i = 0; i < length; i++) {
    char c = event[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

bool keel__event_acceptable(const char *event, const char *json_fields) {
  if (event == NULL || !event_name_valid(event)) return false;
  return json_fields == NULL || strlen(json_fields) <= 3072;
}

bool keel__waits_late_fields(char *fields, size_t capacity) {
  keel_waits_late late;
  if (!keel_waits_late_take(&late)) return false;
  keel_waits_late_format(&late, fields, capacity);
  KEEL_LOG_W(MODULE, "waits ended past their deadline: %s", fields);
  return true;
}

/* ---- keel_reporter: the same lines from a process without a context */

struct keel_reporter {
  keel__events *events;
  uint32_t uid;
  int rank; /* the last one a line was sent with, for the close's wait_late line */
};

keel_status keel_reporter_open(keel_reporter **reporter_p) {
  if (reporter_p == NULL) return KEEL_EINVAL;
  int64_t fd = -1, uid = 0;
  if (keel_env_int("KEEL_STATUS_FD", 0, 1 << 20, &fd) != KEEL_OK ||
      keel_env_int("KEEL_UID", 0, UINT32_MAX, &uid) != KEEL_OK)
    return KEEL_EINVAL;
  keel_reporter *reporter = calloc(1, sizeof *reporter);
  if (reporter == NULL) return KEEL_ENOMEM;
  keel_status status = keel__events_create((int)fd, &reporter->events);
  if (status != KEEL_OK) {
    free(reporter);
    return status;
  }
  reporter->uid = (uint32_t)uid;
  reporter->rank = -1;
  *reporter_p = reporter;
  return KEEL_OK;
}

void keel_reporter_event(keel_reporter *reporter, int rank, const char *event,
                         const char *json_fields) {
  if (reporter == NULL || !keel__event_acceptable(event, json_fields)) return;
  reporter->rank = rank;
  keel__events_line(reporter->events, reporter->uid, rank, 0, event, json_fields);
}

void keel_reporter_waits_late(keel_reporter *reporter, int rank) {
  if (reporter == NULL) return;
  reporter->rank = rank;
  char fields[224];
  if (keel__waits_late_fields(fields, sizeof fields))
    keel__events_line(reporter->events, reporter->uid, rank, 0, "wait_late", fields);
}

void keel_reporter_close(keel_reporter *reporter) {
  if (reporter == NULL) return;
  keel_reporter_waits_late(reporter, reporter->rank);
  keel__events_destroy(reporter->events);
  free(reporter);
}
