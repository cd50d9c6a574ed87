/* The monotonic clock and deadlines: every wait in keel is bounded by an absolute deadline
 * on CLOCK_MONOTONIC, which is shared by all processes of a host. */
#include <limits.h>
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
