/* A worker that calls keel_finalize and then keeps running (a wrapper shell, a profiler, a
 * long teardown) has left the job in order: the launcher must not take its vanished lease
 * for a hang and kill it, and the job's verdict is its exit code. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_support.h"

static void worker_running_on_after_finalize_is_not_fenced(void **state) {
  (void)state;
  const char *dir = keel_test_tempdir("keel-orderly");
  assert_non_null(dir);
  char events[512], output[512], script[1024];
  snprintf(events, sizeof events, "%s/events.jsonl", dir);
  snprintf(output, sizeof output, "%s/out.txt", dir);
  /* 3 s after finalize: past the launcher's grace for a lapsed lease (2 x heartbeat). */
  snprintf(script, sizeof script, "%s --steps 10 --params 1000 && sleep 3",
           keel_test_program("toy_train"));
  char *argv[] = {(char *)keel_test_bin("keel"), "run", "-n", "2", "--heartbeat", "500ms",
                  "--quiet", "--events", events, "--timeout", "60s", "--", "/bin/sh", "-c",
                  script, NULL};
  assert_int_equal(keel_test_run(argv, NULL, output, 90000), 0);
  char *text = keel_test_read_file(events, NULL);
  assert_non_null(text);
  assert_null(strstr(text, "\"event\":\"fence\""));
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(worker_running_on_after_finalize_is_not_fenced),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
