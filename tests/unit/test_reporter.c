/* Unit tests of keel_reporter (include/keel/runtime.h), the event lines of a process without
 * a context (a parameter server, a worker of parameter servers): lines reach the launcher's
 * socket with the process's uid, and waits that ended past their deadline are said in
 * `wait_late` lines, when asked and at close, once each. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "keel/runtime.h"
#include "test_events.h"

typedef struct launcher_socket {
  int ends[2]; /* [0] the launcher's, [1] the process's (KEEL_STATUS_FD) */
  char line[4096];
} launcher_socket;

static int launcher_socket_setup(void **state) {
  launcher_socket *socket_pair = calloc(1, sizeof *socket_pair);
  assert_non_null(socket_pair);
  assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, socket_pair->ends), 0);
  char text[16];
  snprintf(text, sizeof text, "%d", socket_pair->ends[1]);
  setenv("KEEL_STATUS_FD", text, 1);
  setenv("KEEL_UID", "7", 1);
  keel_waits_late late;
  keel_waits_late_take(&late); /* whatever came before */
  *state = socket_pair;
  return 0;
}

static int launcher_socket_teardown(void **state) {
  launcher_socket *socket_pair = *state;
  close(socket_pair->ends[0]);
  close(socket_pair->ends[1]);
  unsetenv("KEEL_STATUS_FD");
  unsetenv("KEEL_UID");
  free(socket_pair);
  return 0;
}

/* The next line the launcher would read, or NULL when none was sent. */
static const char *line_next(launcher_socket *socket_pair) {
  ssize_t got =
      recv(socket_pair->ends[0], socket_pair->line, sizeof socket_pair->line - 1, MSG_DONTWAIT);
  if (got <= 0) return NULL;
  socket_pair->line[got] = '\0';
  return socket_pair->line;
}

/* The next line, which must be event name from uid 7 with rank. */
static const char *line_expect(launcher_socket *socket_pair, const char *name, int rank) {
  const char *line = line_next(socket_pair);
  assert_non_null(line);
  assert_true(keel_test_event_is(line, name));
  assert_int_equal(keel_test_event_long(line, "uid"), 7);
  assert_int_equal(keel_test_event_long(line, "rank"), rank);
  return line;
}

static void test_lines_carry_the_uid_and_rank(void **state) {
  launcher_socket *socket_pair = *state;
  keel_reporter *reporter = NULL;
  assert_int_equal(keel_reporter_open(&reporter), KEEL_OK);
  keel_reporter_event(reporter, 2, "progress", "\"step\":5");
  const char *line = line_expect(socket_pair, "progress", 2);
  assert_int_equal(keel_test_event_long(line, "step"), 5);
  keel_reporter_event(reporter, 2, "Bad Name", "\"step\":5"); /* refused, not sent */
  assert_null(line_next(socket_pair));
  keel_reporter_close(reporter);
  assert_null(line_next(socket_pair)); /* nothing was late */
}

static void test_late_waits_said_once(void **state) {
  launcher_socket *socket_pair = *state;
  keel_reporter *reporter = NULL;
  assert_int_equal(keel_reporter_open(&reporter), KEEL_OK);
  keel_reporter_waits_late(reporter, 3);
  assert_null(line_next(socket_pair));

  keel_wait_ended(KEEL_WAIT_SERVER, keel_now_ns() - 2 * KEEL_WAIT_LATE_NS);
  keel_reporter_waits_late(reporter, 3);
  const char *line = line_expect(socket_pair, "wait_late", 3);
  assert_int_equal(keel_test_event_long(line, "server"), 1);
  assert_int_equal(keel_test_event_long(line, "store"), 0);
  assert_non_null(strstr(line, "\"worst_kind\":\"server\""));
  keel_reporter_waits_late(reporter, 3);
  assert_null(line_next(socket_pair)); /* said once */

  /* One that ended since is said at close, with the last rank given. */
  keel_wait_ended(KEEL_WAIT_STORE, keel_now_ns() - 3 * KEEL_WAIT_LATE_NS);
  keel_reporter_close(reporter);
  line = line_expect(socket_pair, "wait_late", 3);
  assert_int_equal(keel_test_event_long(line, "store"), 1);
  assert_int_equal(keel_test_event_long(line, "server"), 0);
}

/* Outside keel run every line goes nowhere; a malformed variable is refused. */
static void test_outside_a_job_and_malformed(void **state) {
  launcher_socket *socket_pair = *state;
  unsetenv("KEEL_STATUS_FD");
  keel_reporter *reporter = NULL;
  assert_int_equal(keel_reporter_open(&reporter), KEEL_OK);
  keel_wait_ended(KEEL_WAIT_SERVER, keel_now_ns() - 2 * KEEL_WAIT_LATE_NS);
  keel_reporter_event(reporter, 0, "progress", "\"step\":1");
  keel_reporter_waits_late(reporter, 0);
  keel_reporter_close(reporter);
  assert_null(line_next(socket_pair));
  keel_reporter_waits_late(NULL, 0);
  keel_reporter_close(NULL);

  setenv("KEEL_UID", "seven", 1);
  reporter = NULL;
  assert_int_equal(keel_reporter_open(&reporter), KEEL_EINVAL);
  assert_null(reporter);
  assert_int_equal(keel_reporter_open(NULL), KEEL_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_lines_carry_the_uid_and_rank, launcher_socket_setup,
                                      launcher_socket_teardown),
      cmocka_unit_test_setup_teardown(test_late_waits_said_once, launcher_socket_setup,
                                      launcher_socket_teardown),
      cmocka_unit_test_setup_teardown(test_outside_a_job_and_malformed, launcher_socket_setup,
                                      launcher_socket_teardown),
  };
  return cmocka_run_group_tests_name("test_reporter", tests, NULL, NULL);
}
