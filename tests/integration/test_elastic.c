/* Integration tests of growing a job and of reading what it did: `keel run --max-world`
 * with joiners that start later (ULFM elastic paper, scenario III), `keel join` against a
 * running job (accepted, and refused past --max-world), and `keel report` on the events
 * file of a run with an injected kill, on garbage and on a missing file. Real launcher,
 * real toy_train processes over loopback; every job is bounded by a timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_events.h"
#include "test_job.h"
#include "test_support.h"

/* Every job is bounded twice: by the launcher's --timeout and, should the launcher itself
 * hang, by the test's kill. */
#define JOB_TIMEOUT "60s"
#define JOB_TIMEOUT_MS 70000
#define TOOL_TIMEOUT_MS 15000
#define MAX_EVENTS 4096

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- one job: its files (keel_test_job) and the output of the tools run against it */
typedef struct job {
  keel_test_job files;
  char tool_output[300];
} job;

static void job_prepare(job *run) {
  assert_true(keel_test_job_prepare(&run->files, "keel-elastic"));
  snprintf(run->tool_output, sizeof run->tool_output, "%s/tool.txt", run->files.folder);
}

/* Runs "keel run --quiet --timeout T --events E FLAGS -- toy_train ARGS" to its end and
 * returns keel's exit code (-1: the test had to kill it). fault (may be NULL) becomes
 * KEEL_FAULT in the launcher's environment. */
static int job_run(job *run, const char *const *flags, const char *const *program_args,
                   const char *fault) {
  job_prepare(run);
  int code = keel_test_job_run(&run->files, JOB_TIMEOUT, JOB_TIMEOUT_MS, flags,
                               keel_test_program("toy_train"), program_args, fault);
  if (code != 0) keel_test_print_file("job output", run->files.output);
  return code;
}

/* Runs "keel ARGS..." (a tool, not a job) with its stdout and stderr in run->tool_output,
 * which it truncates first. */
static int tool_run(job *run, const char *const *args) {
  FILE *truncate = fopen(run->tool_output, "w");
  assert_non_null(truncate);
  fclose(truncate);
  return keel_test_keel(args, run->tool_output, TOOL_TIMEOUT_MS);
}

/* ---- the events file */
/* The index-th line (from 0) of event name, or NULL. */
static const char *nth_event(const keel_test_events *log, const char *name, size_t index) {
  for (size_t i = 0; i < log->count; i++) {
    if (keel_test_event_is(log->lines[i], name) && index-- == 0) return log->lines[i];
  }
  return NULL;
}

static size_t count_spawned(const keel_test_events *log, const char *role) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"role\":\"%s\"", role);
  size_t count = 0;
  for (size_t i = 0; i < log->count; i++)
    count += keel_test_event_is(log->lines[i], "spawn") && strstr(log->lines[i], pattern) != NULL;
  return count;
}

/* Every recovery is a grow (nothing failed), the world only grows, and the last one
 * reaches `world`. */
static void assert_grew_to(const keel_test_events *log, long long world) {
  size_t recoveries = keel_test_events_count(log, "recovery");
  assert_true(recoveries >= 1);
  long long previous = 0;
  for (size_t i = 0; i < recoveries; i++) {
    const char *recovery = nth_event(log, "recovery", i);
    assert_non_null(strstr(recovery, "\"failed\":[]"));
    assert_true(keel_test_event_long(recovery, "new_world") >
                keel_test_event_long(recovery, "old_world"));
    assert_true(keel_test_event_long(recovery, "new_world") > previous);
    previous = keel_test_event_long(recovery, "new_world");
  }
  assert_int_equal(previous, world);
}

/* ---- a job running in the background, for `keel join` */
static bool has_progress(const keel_test_events *log, void *context) {
  return keel_test_events_find(log, "progress", -1) != NULL;
}

/* Starts the job, waits for its first progress line (the workers are training) and reads
 * its id: `keel join` must name it, since other jobs of this user may be running. */
static pid_t job_start_background(job *run, const char *const *flags,
                                  const char *const *program_args, char *job_id, size_t capacity) {
  job_prepare(run);
  pid_t pid = keel_test_job_start(&run->files, JOB_TIMEOUT, flags, keel_test_program("toy_train"),
                                  program_args, NULL);
  assert_true(pid > 0);
  if (!keel_test_events_wait(run->files.events, MAX_EVENTS, has_progress, NULL, 20, 20000)) {
    keel_test_print_file("job output", run->files.output);
    fail_msg("the job made no progress");
  }
  keel_test_events log;
  keel_test_events_read(run->files.events, MAX_EVENTS, &log);
  assert_true(keel_test_events_job_id(&log, job_id, capacity));
  keel_test_events_free(&log);
  return pid;
}

static int job_wait(const job *run, pid_t pid) {
  int status = 0;
  if (!keel_test_wait(pid, JOB_TIMEOUT_MS, &status)) {
    keel_test_print_file("job output", run->files.output);
    fail_msg("the job did not end");
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code != 0) keel_test_print_file("job output", run->files.output);
  return code;
}

/* Every one of texts (a NULL-terminated list) is in the output of the last tool run. */
static void assert_tool_said(const job *run, const char *const *texts) {
  char *output = keel_test_read_file(run->tool_output, NULL);
  assert_non_null(output);
  for (size_t i = 0; texts[i] != NULL; i++)
    if (strstr(output, texts[i]) == NULL) fail_msg("expected '%s' in: %s", texts[i], output);
  free(output);
}

/* ---- tests */

/* (a) Two workers start; two joiners become ready a second later and join: the step in
 * progress is redone in the larger world, and all four end with the same parameters. */
static void test_joiners_start_later(void **state) {
  (void)state;
  job run;
  int code = job_run(&run, LIST("-n", "2", "--max-world", "4", "--join-delay", "1s"),
                     LIST("--steps", "200", "--compute-ms", "5", "--params", "100000"), NULL);
  assert_int_equal(code, 0);
  keel_test_toy_assert_consistent(run.files.output, 4, 200);
  keel_test_events log;
  keel_test_events_read(run.files.events, MAX_EVENTS, &log);
  assert_int_equal(count_spawned(&log, "worker"), 2);
  assert_int_equal(count_spawned(&log, "joiner"), 2);
  /* The joiners start after --join-delay, not with the workers. */
  long long started = keel_test_event_long(nth_event(&log, "job_start", 0), "t_ns");
  long long joined = keel_test_event_long(nth_event(&log, "spawn", 2), "t_ns");
  assert_true(joined - started >= 900 * 1000 * 1000LL);
  assert_grew_to(&log, 4);
  keel_test_events_free(&log);
  /* The report shows the grow. */
  assert_int_equal(tool_run(&run, LIST("report", run.files.events)), 0);
  assert_tool_said(&run, LIST("(a grow)", "2 workers, 0 spares, 2 joiners"));
}

/* (b) A job that may grow to 3 but holds its joiner back; `keel join` starts it at once, a
 * second one finds the world full, and the job ends with three consistent ranks. */
static void test_join_adds_a_worker(void **state) {
  (void)state;
  job run;
  char job_id[32];
  pid_t pid = job_start_background(&run, LIST("-n", "2", "--max-world", "3", "--join-delay", "50s"),
                                   LIST("--steps", "300", "--compute-ms", "5", "--params", "10000"),
                                   job_id, sizeof job_id);
  int code = tool_run(&run, LIST("join", "--job", job_id));
  if (code != 0) keel_test_print_file("keel join", run.tool_output);
  assert_int_equal(code, 0);
  assert_tool_said(&run, LIST("starting 1 joiner"));
  assert_int_equal(tool_run(&run, LIST("join", "--job", job_id)), 2);
  assert_tool_said(&run, LIST("--max-world 3"));
  assert_int_equal(job_wait(&run, pid), 0);
  keel_test_toy_assert_consistent(run.files.output, 3, 300);
  keel_test_events log;
  keel_test_events_read(run.files.events, MAX_EVENTS, &log);
  assert_int_equal(count_spawned(&log, "joiner"), 1);
  assert_int_equal(keel_test_events_count(&log, "join_request"), 2);
  assert_non_null(strstr(nth_event(&log, "join_request", 0), "\"accepted\":true"));
  assert_non_null(strstr(nth_event(&log, "join_request", 1), "\"accepted\":false"));
  /* The held-back joiner was the one started: the job did not wait for --join-delay. */
  assert_true(keel_test_event_long(nth_event(&log, "job_end", 0), "seconds") < 45);
  assert_grew_to(&log, 3);
  keel_test_events_free(&log);
}

/* (c) No room: a job at its --max-world refuses `keel join` (exit 2, one clear line) and
 * goes on unchanged; usage errors exit 2 too, and an unknown job 1. */
static void test_join_beyond_max_world(void **state) {
  (void)state;
  job run;
  char job_id[32];
  pid_t pid = job_start_background(&run, LIST("-n", "2", "--max-world", "3"),
                                   LIST("--steps", "200", "--compute-ms", "5", "--params", "10000"),
                                   job_id, sizeof job_id);
  assert_int_equal(tool_run(&run, LIST("join", "--job", job_id, "-n", "2")), 2);
  assert_tool_said(&run, LIST("refused", "above --max-world 3"));
  assert_int_equal(tool_run(&run, LIST("join", "--job", job_id, "-n", "0")), 2);
  assert_int_equal(tool_run(&run, LIST("join", "--job", job_id, "--bogus")), 2);
  assert_int_equal(tool_run(&run, LIST("join", "--job", "1")), 1);
  assert_int_equal(job_wait(&run, pid), 0);
  keel_test_toy_assert_consistent(run.files.output, 3, 200);
  keel_test_events log;
  keel_test_events_read(run.files.events, MAX_EVENTS, &log);
  assert_int_equal(count_spawned(&log, "joiner"), 1);
  assert_non_null(strstr(nth_event(&log, "join_request", 0), "\"accepted\":false"));
  keel_test_events_free(&log);
}

/* (d) A kill injected in the middle of an allreduce at rank 1; a spare takes its place.
 * The report names the failure and the recovery, with its death-to-recovered time. */
static void test_report_of_a_kill(void **state) {
  (void)state;
  job run;
  int code = job_run(&run, LIST("-n", "3", "--spares", "1", "--on-failure", "replace"),
                     LIST("--steps", "40", "--compute-ms", "5", "--params", "100000"),
                     "kill@rank=1,step=10,point=allreduce");
  assert_int_equal(code, 0);
  keel_test_toy_assert_consistent(run.files.output, 3, 40);
  code = tool_run(&run, LIST("report", run.files.events));
  if (code != 0) keel_test_print_file("keel report", run.tool_output);
  assert_int_equal(code, 0);
  assert_tool_said(&run,
                   LIST("exit code 0", "faults injected: 1", "uid 1: kill at allreduce, step 10",
                        "uid 1 (pid ", "SIGKILL", "failed uids [1], replaced 1",
                        "death to recovered: ", "skipped lines (not a whole JSON event): 0"));
  char *text = keel_test_read_file(run.tool_output, NULL);
  double death_ms = -1;
  sscanf(strstr(text, "death to recovered: ") + strlen("death to recovered: "), "%lf", &death_ms);
  free(text);
  assert_true(death_ms >= 0 && death_ms < 30000);
  /* --json: one object per recovery, with the same figure. */
  assert_int_equal(tool_run(&run, LIST("report", "--json", run.files.events)), 0);
  assert_tool_said(&run, LIST("\"failed\":[1]", "\"total_ms\":", "\"death_to_recovered_ms\":"));
  text = keel_test_read_file(run.tool_output, NULL);
  assert_null(strstr(text, "\"death_to_recovered_ms\":null"));
  assert_int_equal(text[0], '{');
  free(text);
}

static void file_write(const char *path, const char *text, size_t length) {
  FILE *file = fopen(path, "wb");
  assert_non_null(file);
  assert_int_equal(fwrite(text, 1, length, file), length);
  fclose(file);
}

/* (e) Garbage, a cut last line, a NUL byte and an over-long line are skipped and counted;
 * the whole events among them still count. A missing file is exit 2 with a message. */
static void test_report_of_garbage(void **state) {
  (void)state;
  job run;
  job_prepare(&run);
  static const char lines[] =
      "not json at all\n"
      "{\"event\":\"recovery\",\"t_ns\":5,\"failed\":[1,\n"
      "{\"event\":\"exit\",\"t_ns\":1000000,\"uid\":2,\"pid\":77,\"rank\":2,\"signal\":"
      "\"SIGKILL\",\"status\":\"SIGKILL\",\"fenced\":false}\n"
      "\x01\x02\xff\xfe\n"
      "{\"no_event\":1}\n"
      "{\"event\":\"recovery\",\"t_ns\":41000000,\"old_epoch\":0,\"new_epoch\":1,"
      "\"old_world\":3,\"new_world\":2,\"policy\":\"shrink\",\"failed\":[2],\"replaced\":0,"
      "\"detect_ms\":1,\"revoke_ms\":1,\"agree_ms\":1,\"rebuild_ms\":1,"
      "\"state_transfer_ms\":0,\"redo_ms\":1,\"total_ms\":5}\n"
      "{\"event\":\"x\",\"t_ns\":3}}\n"
      "{\"event\":\"nul\0\"}\n"
      "{\"event\":\"job_end\",\"t_ns\":9";
  char path[400];
  snprintf(path, sizeof path, "%s/garbage.jsonl", run.files.folder);
  size_t long_length = 200 * 1024;
  char *text = malloc(sizeof lines + long_length + 1);
  assert_non_null(text);
  memset(text, '{', long_length);
  text[long_length - 1] = '\n';
  memcpy(text + long_length, lines, sizeof lines - 1);
  file_write(path, text, long_length + sizeof lines - 1);
  free(text);
  assert_int_equal(tool_run(&run, LIST("report", path)), 0);
  assert_tool_said(
      &run, LIST("skipped lines (not a whole JSON event): 8", "recoveries: 1", "failed uids [2]",
                 "death to recovered: 40.0 ms", "uid 2 (pid 77", "no job_start event"));
  assert_int_equal(tool_run(&run, LIST("report", "--json", path)), 0);
  assert_tool_said(&run, LIST("\"death_to_recovered_ms\":40.000}", "skipped 8 lines"));
  snprintf(path, sizeof path, "%s/missing.jsonl", run.files.folder);
  assert_int_equal(tool_run(&run, LIST("report", path)), 2);
  assert_tool_said(&run, LIST("cannot read"));
  assert_int_equal(tool_run(&run, LIST("report", run.files.folder)), 2);
  assert_int_equal(tool_run(&run, LIST("report")), 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_report_of_garbage),  cmocka_unit_test(test_joiners_start_later),
      cmocka_unit_test(test_join_adds_a_worker), cmocka_unit_test(test_join_beyond_max_world),
      cmocka_unit_test(test_report_of_a_kill),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
