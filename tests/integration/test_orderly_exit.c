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

#include "test_job.h"
#include "test_support.h"

static void worker_running_on_after_finalize_is_not_fenced(void **state) {
  (void)state;
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-orderly"));
  char script[1024];
  /* 3 s after finalize: past the launcher's grace for a lapsed lease (2 x heartbeat). */
  snprintf(script, sizeof script, "%s --steps 10 --params 1000 && sleep 3",
           keel_test_program("toy_train"));
  static const char *const flags[] = {"-n", "2", "--heartbeat", "500ms", NULL};
  const char *const shell_args[] = {"-c", script, NULL};
  assert_int_equal(keel_test_job_run(&job, "60s", 90000, flags, "/bin/sh", shell_args, NULL), 0);
  char *text = keel_test_read_file(job.events, NULL);
  assert_non_null(text);
  assert_null(strstr(text, "\"event\":\"fence\""));
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(worker_running_on_after_finalize_is_not_fenced),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
