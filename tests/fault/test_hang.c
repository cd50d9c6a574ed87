/* Hangs (issue 15, item 6): a process that lives, heartbeat and all, while its training thread
 * makes no progress. `--collective-timeout auto` sets the deadline from the steps observed, the
 * agreement suspects the silent rank and its launcher fences it, and a spare takes its place
 * with the state bit for bit; work declared with keel_section_begin/end is never taken for a
 * hang, while the same work undeclared is. Hangs come from KEEL_FAULT and `keel inject hang`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "keel/keel.h"
#include "test_events.h"
#include "test_job.h"
#include "test_support.h"

#define MAX_EVENTS 20000
#define JOB_TIMEOUT "120s"
#define JOB_TIMEOUT_MS 150000

static const char *const auto_replace[] = {
    "--nproc", "4", "--spares", "1", "--on-failure", "replace", "--collective-timeout",
    "auto",    NULL};

typedef struct job_result {
  keel_test_job job;
  int exit_code;
  unsigned crc;
  keel_test_events log;
} job_result;

static void job_finish(job_result *result, int world, unsigned long long steps) {
  if (result->exit_code != 0) keel_test_print_file("job output", result->job.output);
  assert_int_equal(result->exit_code, 0);
  result->crc = keel_test_toy_assert_consistent(result->job.output, world, steps);
  keel_test_events_read(result->job.events, MAX_EVENTS, &result->log);
  keel_test_events_assert_none_left(&result->log);
}

static void job_run(job_result *result, const char *const *flags, const char *const *toy_args,
                    const char *fault, int world, unsigned long long steps) {
  assert_true(keel_test_job_prepare(&result->job, "keel-hang"));
  result->exit_code = keel_test_job_run(&result->job, JOB_TIMEOUT, JOB_TIMEOUT_MS, flags,
                                        keel_test_program("toy_train"), toy_args, fault);
  job_finish(result, world, steps);
}

/* The line of event name about uid whose field key holds value (a quoted string), or NULL. */
static const char *event_with(const keel_test_events *log, const char *name, long uid,
                              const char *key, const char *value) {
  for (size_t i = 0; i < log->count; i++) {
    const char *line = log->lines[i];
    if (!keel_test_event_is(line, name)) continue;
    if (uid >= 0 && keel_test_event_long(line, "uid") != uid) continue;
    const char *field = keel_test_event_field(line, key);
    if (field != NULL && strncmp(field, value, strlen(value)) == 0) return line;
  }
  return NULL;
}

static long long t_ns(const char *line) { return keel_test_event_long(line, "t_ns"); }

/* The hung rank's process is fenced after the deadline the watchdog set (not the default 30 s),
 * and its replacement ends the job with the failure-free run's state. */
static void a_hung_training_thread_is_caught_and_replaced_exactly(void **state) {
  (void)state;
  static const char *const toy_args[] = {"--steps", "80", "--compute-ms", "10", NULL};
  job_result reference, hung;
  job_run(&reference, auto_replace, toy_args, NULL, 4, 80);
  job_run(&hung, auto_replace, toy_args, "hang@rank=2,step=30", 4, 80);
  assert_int_equal(hung.crc, reference.crc);

  const char *fault = event_with(&hung.log, "fault", 2, "action", "\"hang\"");
  const char *fence = keel_test_events_find(&hung.log, "fence", 2);
  const char *deadline = keel_test_events_find(&hung.log, "collective_timeout", 0);
  assert_non_null(fault);
  assert_non_null(fence);
  assert_non_null(deadline);
  assert_true(keel_test_event_long(deadline, "timeout_ms") >= 1000);
  /* Caught by the watchdog's deadline, not the default one (30 s, twice over with the
   * agreement's wait). */
  assert_true(t_ns(fence) > t_ns(fault));
  assert_true(t_ns(fence) - t_ns(fault) < 25 * 1000000000LL);
  const char *recovery = keel_test_events_find(&hung.log, "recovery", 0);
  assert_non_null(recovery);
  assert_non_null(strstr(recovery, "\"failed\":[2]"));
  assert_non_null(strstr(recovery, "\"policy\":\"replace\""));
  keel_test_events_free(&reference.log);
  keel_test_events_free(&hung.log);
}

/* uid 1 works 3 s (longer under the sanitizers) past its peers at step 40. */
static void long_work_run(job_result *result, bool declared) {
  char long_ms[24];
  snprintf(long_ms, sizeof long_ms, "%d", 3000 * keel_test_slowdown());
  const char *toy_args[] = {"--steps",   "80",          "--compute-ms",
                            "10",        "--long-step", "40",
                            "--long-ms", long_ms,       declared ? "--section" : NULL,
                            NULL};
  job_run(result, auto_replace, toy_args, NULL, 4, 80);
}

static void declared_long_work_is_not_taken_for_a_hang(void **state) {
  (void)state;
  job_result result;
  long_work_run(&result, true);
  assert_non_null(keel_test_events_find(&result.log, "section_begin", 1));
  const char *end = keel_test_events_find(&result.log, "section_end", 1);
  assert_non_null(end);
  assert_true(keel_test_event_long(end, "elapsed_ms") >= 3000);
  /* The others' deadline passed while they waited, and they waited on. */
  assert_int_equal(keel_test_events_count(&result.log, "failure"), 0);
  assert_int_equal(keel_test_events_count(&result.log, "fence"), 0);
  keel_test_events_free(&result.log);
}

/* The control of the case above: the same work undeclared is a hang, so that case can fail. */
static void undeclared_long_work_is_taken_for_a_hang(void **state) {
  (void)state;
  job_result result;
  long_work_run(&result, false);
  assert_null(keel_test_events_find(&result.log, "section_begin", -1));
  assert_non_null(keel_test_events_find(&result.log, "fence", 1));
  keel_test_events_free(&result.log);
}

/* `keel inject hang RANK`, from outside the job: the process's own session passes it to the
 * training thread, which stops at its next step while the heartbeat goes on. */
static void keel_inject_hang_hangs_a_running_rank(void **state) {
  (void)state;
  static const char *const toy_args[] = {"--steps", "400", "--compute-ms", "10", NULL};
  job_result result;
  assert_true(keel_test_job_prepare(&result.job, "keel-hang"));
  pid_t launcher = keel_test_job_start(&result.job, JOB_TIMEOUT, auto_replace,
                                       keel_test_program("toy_train"), toy_args, NULL);
  assert_true(launcher > 0);
  keel_test_inject_when_training(&result.job, "hang", "1");
  int status = 0;
  assert_true(keel_test_wait(launcher, JOB_TIMEOUT_MS, &status));
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  job_finish(&result, 4, 400);
  const char *fault = event_with(&result.log, "fault", -1, "action", "\"hang\"");
  assert_non_null(fault);
  long long uid = keel_test_event_long(fault, "uid");
  assert_int_equal(keel_test_event_long(fault, "rank"), 1);
  assert_non_null(keel_test_events_find(&result.log, "fence", (long)uid));
  keel_test_events_free(&result.log);
}

/* The public API's refusals, in a process of its own (a world of one). */
static void sections_refuse_what_they_cannot_keep(void **state) {
  (void)state;
  keel_ctx *ctx = NULL;
  assert_int_equal(keel_init(&ctx), KEEL_OK);
  int64_t later = keel_deadline_after_ns(60 * 1000000000LL);
  assert_int_equal(keel_section_end(ctx), KEEL_EINVAL);
  assert_int_equal(keel_section_begin(ctx, NULL, later), KEEL_EINVAL);
  assert_int_equal(keel_section_begin(ctx, "", later), KEEL_EINVAL);
  assert_int_equal(keel_section_begin(ctx, "two words", later), KEEL_EINVAL);
  assert_int_equal(keel_section_begin(ctx, "eval", keel_now_ns() - 1), KEEL_EINVAL);
  assert_int_equal(keel_section_begin(NULL, "eval", later), KEEL_EINVAL);
  assert_int_equal(keel_section_begin(ctx, "eval", later), KEEL_OK);
  assert_int_equal(keel_section_begin(ctx, "nested", later), KEEL_EINVAL);
  assert_int_equal(keel_section_end(ctx), KEEL_OK);
  assert_int_equal(keel_section_end(ctx), KEEL_EINVAL);
  keel_finalize(ctx);

  keel_fault_plan *plan = NULL;
  assert_int_equal(keel_fault_plan_create("hang@rank=1,step=3", 1, &plan), KEEL_OK);
  keel_fault_plan_destroy(plan);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sections_refuse_what_they_cannot_keep),
      cmocka_unit_test(a_hung_training_thread_is_caught_and_replaced_exactly),
      cmocka_unit_test(declared_long_work_is_not_taken_for_a_hang),
      cmocka_unit_test(undeclared_long_work_is_taken_for_a_hang),
      cmocka_unit_test(keel_inject_hang_hangs_a_running_rank),
  };
  int failures = cmocka_run_group_tests(tests, NULL, NULL);
  keel_test_kill_all();
  return keel_test_finish(failures);
}
