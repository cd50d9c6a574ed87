/* The monotonic clock and deadlines: every wait in keel is bounded by an absolute deadline
 * on CLOCK_MONOTONIC, which is shared by all processes of a host; and the count of waits
 * that ended past theirs, which should stay zero. */
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "keel/core.h"

int64_t keel_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

int64_t keel_wall_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

int64_t keel_deadline_after_ns(int64_t duration_ns) {
  if (duration_ns < 0) return KEEL_NO_DEADLINE;
  int64_t now = keel_now_ns();
  if (duration_ns > KEEL_NO_DEADLINE - now) return KEEL_NO_DEADLINE;
  return now + duration_ns;
}

int keel_poll_timeout_ms(int64_t deadline_ns) {
  if (deadline_ns == KEEL_NO_DEADLINE) return -1;
  int64_t left = deadline_ns - keel_now_ns();
  if (left <= 0) return 0;
  /* Round up so that a wait never ends just before its deadline and spins. */
  int64_t milliseconds = (left + 999999) / 1000000;
  return milliseconds > INT_MAX ? INT_MAX : (int)milliseconds;
}

/* ---- waits past their deadline: process-wide, since a wait of any thread or handle counts */
static _Atomic uint64_t late_count[KEEL_WAIT_KIND_COUNT];
static _Atomic int64_t late_worst_ns[KEEL_WAIT_KIND_COUNT];
static atomic_bool late_any;

const char *keel_wait_kind_name(keel_wait_kind kind) {
  static const char *const names[KEEL_WAIT_KIND_COUNT] = {"collective", "agreement", "store",
                                                          "server"};
  return kind >= 0 && kind < KEEL_WAIT_KIND_COUNT ? names[kind] : "unknown";
}

void keel_wait_ended(keel_wait_kind kind, int64_t deadline_ns) {
  if (kind < 0 || kind >= KEEL_WAIT_KIND_COUNT || deadline_ns == KEEL_NO_DEADLINE) return;
  int64_t past_ns = keel_now_ns() - deadline_ns;
  if (past_ns <= KEEL_WAIT_LATE_NS) return;
  atomic_fetch_add(&late_count[kind], 1);
  int64_t worst = atomic_load(&late_worst_ns[kind]);
  while (past_ns > worst && !atomic_compare_exchange_weak(&late_worst_ns[kind], &worst, past_ns)) {
  }
  atomic_store(&late_any, true);
}

bool keel_waits_late_take(keel_waits_late *late) {
  memset(late, 0, sizeof *late);
  if (!atomic_load(&late_any) || !atomic_exchange(&late_any, false)) return false;
  uint64_t total = 0;
  for (int kind = 0; kind < KEEL_WAIT_KIND_COUNT; kind++) {
    late->count[kind] = atomic_exchange(&late_count[kind], 0);
    late->worst_ns[kind] = atomic_exchange(&late_worst_ns[kind], 0);
    total += late->count[kind];
  }
  /* A wait counted between the two exchanges sets the flag again for the next take. */
  return total > 0;
}

void keel_waits_late_format(const keel_waits_late *late, char *text, size_t capacity) {
  int worst = 0;
  for (int kind = 1; kind < KEEL_WAIT_KIND_COUNT; kind++)
    if (late->worst_ns[kind] > late->worst_ns[worst]) worst = kind;
  snprintf(text, capacity,
           "\"collective\":%" PRIu64 ",\"agreement\":%" PRIu64 ",\"store\":%" PRIu64
           ",\"server\":%" PRIu64 ",\"worst_ms\":%.1f,\"worst_kind\":\"%s\"",
           late->count[KEEL_WAIT_COLLECTIVE], late->count[KEEL_WAIT_AGREEMENT],
           late->count[KEEL_WAIT_STORE], late->count[KEEL_WAIT_SERVER],
           (double)late->worst_ns[worst] / 1e6, keel_wait_kind_name((keel_wait_kind)worst));
}
