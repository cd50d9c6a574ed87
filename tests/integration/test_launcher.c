/* Integration tests of `keel run`, `keel inject`, `keel ps` and the usage errors of `keel
 * join` and `keel report` (their jobs are in test_elastic.c): the real launcher runs fake
 * workers (tests/programs/fake_worker.c) and each test checks its exit code, its events
 * file, that the processes it fenced or killed were the right ones, and that none is left
 * behind. Every run is bounded by a timeout of a few seconds. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
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

#define RUN_TIMEOUT_MS 8000
#define MAX_EVENTS 512

/* ---- a minimal JSON validator: each events line must be one whole JSON value */
static const char *json_value(const char *at);

static const char *json_space(const char *at) {
  while (*at == ' ' || *at == '\t') at++;
  return at;
}

static const char *json_string(const char *at) {
  if (*at != '"') return NULL;
  for (at++; *at != '"'; at++) {
    if ((unsigned char)*at < 0x20) return NULL;
    if (*at == '\\' && *++at == '\0') return NULL;
  }
  return at + 1;
}

static const char *json_number(const char *at) {
  char *end;
  strtod(at, &end);
  return end == at ? NULL : end;
}

static const char *json_members(const char *at, char close, bool keyed) {
  at = json_space(at + 1);
  if (*at == close) return at + 1;
  for (;;) {
    if (keyed) {
      at = json_string(json_space(at));
      if (at == NULL || *(at = json_space(at)) != ':') return NULL;
      at++;
    }
    at = json_value(at);
    if (at == NULL) return NULL;
    at = json_space(at);
    if (*at == close) return at + 1;
    if (*at != ',') return NULL;
    at++;
  }
}

static const char *json_value(const char *at) {
  at = json_space(at);
  if (*at == '{') return json_members(at, '}', true);
  if (*at == '[') return json_members(at, ']', false);
  if (*at == '"') return json_string(at);
  if (strncmp(at, "true", 4) == 0) return at + 4;
  if (strncmp(at, "false", 5) == 0) return at + 5;
  if (strncmp(at, "null", 4) == 0) return at + 4;
  return json_number(at);
}

static bool json_line_valid(const char *line) {
  if (*json_space(line) != '{') return false;
  const char *end = json_value(line);
  return end != NULL && *json_space(end) == '\0';
}

/* ---- the events file */
static bool field_is(const char *line, const char *key, const char *text) {
  if (line == NULL) return false;
  const char *at = keel_test_event_field(line, key);
  return at != NULL && *at == '"' && strncmp(at + 1, text, strlen(text)) == 0 &&
         at[1 + strlen(text)] == '"';
}

/* Reads the events file into log and asserts that every line is a valid event. */
static void events_read_valid(const char *path, keel_test_events *log) {
  keel_test_events_read(path, MAX_EVENTS, log);
  assert_true(log->count > 0);
  for (size_t i = 0; i < log->count; i++) {
    if (!json_line_valid(log->lines[i])) fail_msg("invalid events line: %s", log->lines[i]);
    assert_non_null(keel_test_event_field(log->lines[i], "t_ns"));
    assert_non_null(keel_test_event_field(log->lines[i], "wall_ns"));
  }
}

/* The check every test ends with: every process the launcher started is gone (reaped, not
 * a zombie). Frees log. */
static void events_finish(keel_test_events *log) {
  keel_test_events_assert_none_left(log);
  keel_test_events_free(log);
}

/* The last line of log, job_end when the launcher ended in order. */
static const char *last_line(const keel_test_events *log) { return log->lines[log->count - 1]; }

/* ---- running the launcher: keel run [--quiet --events E] FLAGS -- fake_worker ARGS */
static int launch_run(keel_test_job *run, const char *const *flags,
                      const char *const *worker_args) {
  assert_true(keel_test_job_prepare(run, "keel-launcher"));
  return keel_test_job_run(run, NULL, RUN_TIMEOUT_MS, flags, keel_test_program("fake_worker"),
                           worker_args, NULL);
}

/* Runs the launcher to its end, expects exit code `expected` (showing keel's output when
 * not), and reads its events file into log, every line valid. */
static void launch_expect(keel_test_job *run, const char *const *flags,
                          const char *const *worker_args, int expected, keel_test_events *log) {
  int code = launch_run(run, flags, worker_args);
  if (code != expected) keel_test_print_file("keel output", run->output);
  assert_int_equal(code, expected);
  events_read_valid(run->events, log);
}

/* Starts the launcher in the background; returns its pid. */
static pid_t launch_start(keel_test_job *run, const char *const *flags,
                          const char *const *worker_args) {
  assert_true(keel_test_job_prepare(run, "keel-launcher"));
  pid_t launcher =
      keel_test_job_start(run, NULL, flags, keel_test_program("fake_worker"), worker_args, NULL);
  assert_true(launcher > 0);
  return launcher;
}

/* Waits up to timeout_ms for a background launcher to exit with code `expected`. */
static void launch_wait(pid_t launcher, int timeout_ms, int expected) {
  int status;
  assert_true(keel_test_wait(launcher, timeout_ms, &status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), expected);
}

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- tests */
static void test_all_exit_zero(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  launch_expect(&run, LIST("-n", "3"), LIST("--only", "0", "--garbage", "--sleep", "100"), 0, &log);
  assert_true(keel_test_event_is(log.lines[0], "job_start"));
  assert_true(keel_test_event_is(last_line(&log), "job_end"));
  assert_int_equal(keel_test_events_count(&log, "job_start"), 1);
  assert_int_equal(keel_test_events_count(&log, "spawn"), 3);
  assert_int_equal(keel_test_events_count(&log, "exit"), 3);
  assert_int_equal(keel_test_events_count(&log, "job_end"), 1);
  assert_int_equal(keel_test_events_count(&log, "too_long"), 0);
  assert_int_equal(keel_test_events_count(&log, "broken"), 0);
  assert_true(keel_test_events_count(&log, "progress") >= 1);
  assert_int_equal(keel_test_event_long(last_line(&log), "code"), 0);
  for (long uid = 0; uid < 3; uid++)
    assert_true(field_is(keel_test_events_find(&log, "exit", uid), "status", "0"));
  events_finish(&log);
}

static void test_one_exits_three(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  launch_expect(&run, LIST("-n", "3"), LIST("--only", "1", "--exit", "3", "--sleep", "200"), 3,
                &log);
  assert_int_equal(keel_test_event_long(last_line(&log), "code"), 3);
  events_finish(&log);
}

static void test_spares_stopped_at_end(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  int64_t start = (int64_t)time(NULL);
  /* uid 2 ignores job/done (killed after the grace period); uid 3 leaves on its own. */
  launch_expect(
      &run, LIST("-n", "2", "--spares", "2"),
      LIST("--only", "2", "--sleep", "60000", "--only", "3", "--spare-wait", "--sleep", "100"), 0,
      &log);
  assert_true((int64_t)time(NULL) - start < 6);
  assert_int_equal(keel_test_events_count(&log, "spawn"), 4);
  assert_int_equal(keel_test_events_count(&log, "exit"), 4);
  assert_true(field_is(keel_test_events_find(&log, "spawn", 3), "role", "spare"));
  assert_true(field_is(keel_test_events_find(&log, "exit", 2), "status", "SIGKILL"));
  assert_true(field_is(keel_test_events_find(&log, "exit", 3), "status", "0"));
  events_finish(&log);
}

static void test_suspect_is_fenced(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  launch_expect(
      &run, LIST("-n", "3"),
      LIST("--only", "0", "--suspect", "2", "--only", "2", "--sleep", "60000", "--sleep", "500"), 0,
      &log);
  const char *fence = keel_test_events_find(&log, "fence", 2);
  assert_non_null(fence);
  assert_int_equal(keel_test_event_long(fence, "pid"),
                   keel_test_event_long(keel_test_events_find(&log, "spawn", 2), "pid"));
  assert_int_equal(keel_test_events_count(&log, "fence"), 1);
  assert_true(field_is(keel_test_events_find(&log, "exit", 2), "status", "SIGKILL"));
  events_finish(&log);
}

static void test_lapsed_lease_is_fenced(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  launch_expect(
      &run, LIST("-n", "2", "--heartbeat", "1s"),
      LIST("--only", "1", "--stop-keepalive", "--only", "1", "--sleep", "60000", "--sleep", "200"),
      0, &log);
  const char *fence = keel_test_events_find(&log, "fence", 1);
  assert_non_null(fence);
  assert_non_null(strstr(fence, "lease"));
  assert_null(keel_test_events_find(&log, "fence", 0));
  events_finish(&log);
}

static void test_node_failure_domain(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  launch_expect(&run, LIST("--nnodes", "2", "--nproc-per-node", "2", "--failure-domain", "node"),
                LIST("--only", "0", "--suspect", "2", "--only", "2", "--sleep", "60000", "--only",
                     "3", "--sleep", "60000", "--sleep", "500"),
                0, &log);
  assert_non_null(keel_test_events_find(&log, "fence", 2));
  const char *node_fence = keel_test_events_find(&log, "fence", 3);
  assert_non_null(node_fence);
  assert_non_null(strstr(node_fence, "node 1"));
  assert_null(keel_test_events_find(&log, "fence", 1));
  events_finish(&log);
}

static void test_replace_respawns_a_spare(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  launch_expect(&run, LIST("-n", "2", "--on-failure", "replace", "--max-restarts", "1"),
                LIST("--spare-wait", "--only", "1", "--exit", "3", "--sleep", "300"), 3, &log);
  assert_int_equal(keel_test_events_count(&log, "respawn"), 1);
  const char *respawn = keel_test_events_find(&log, "respawn", 2);
  assert_non_null(respawn);
  assert_int_equal(keel_test_event_long(respawn, "after_uid"), 1);
  assert_true(field_is(keel_test_events_find(&log, "spawn", 2), "role", "spare"));
  assert_true(field_is(keel_test_events_find(&log, "exit", 2), "status", "0"));
  events_finish(&log);
}

/* A spare that takes a rank is a worker from then on: the job waits for it, and a worker
 * that failed in an older epoch (replaced) does not decide the exit code. */
static void test_rank_taken_by_spare(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  /* uid 1 fails; spare uid 2 takes rank 1 in epoch 1 and outlives uid 0 by more than the
   * grace a spare gets after job/done, so it exits 0 only if the job waits for it. */
  launch_expect(&run, LIST("-n", "2", "--spares", "1", "--on-failure", "replace"),
                LIST("--only", "1", "--exit", "3", "--only", "2", "--publish", "1", "1", "--only",
                     "0", "--sleep", "200", "--only", "0", "--publish", "0", "1", "--sleep", "600",
                     "--only", "2", "--sleep", "2500"),
                0, &log);
  const char *spare_exit = keel_test_events_find(&log, "exit", 2);
  assert_non_null(spare_exit);
  assert_true(field_is(spare_exit, "status", "0"));
  assert_int_equal(keel_test_event_long(spare_exit, "rank"), 1);
  assert_true(field_is(keel_test_events_find(&log, "exit", 1), "status", "3"));
  assert_int_equal(keel_test_events_count(&log, "respawn"), 1);
  events_finish(&log);
}

/* --max-world above -n starts joiners after --join-delay; those still waiting when the
 * workers are done are told by job/done or, if they ignore it, killed like idle spares. */
static void test_joiners_stopped_at_end(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  int64_t start = (int64_t)time(NULL);
  launch_expect(
      &run, LIST("-n", "2", "--max-world", "4", "--join-delay", "100ms"),
      LIST("--only", "2", "--sleep", "60000", "--only", "3", "--spare-wait", "--sleep", "600"), 0,
      &log);
  assert_true((int64_t)time(NULL) - start < 6);
  assert_int_equal(keel_test_events_count(&log, "spawn"), 4);
  assert_true(field_is(keel_test_events_find(&log, "spawn", 2), "role", "joiner"));
  assert_true(field_is(keel_test_events_find(&log, "spawn", 3), "role", "joiner"));
  long long started = keel_test_event_long(log.lines[0], "t_ns");
  assert_true(keel_test_event_long(keel_test_events_find(&log, "spawn", 2), "t_ns") - started >=
              90 * 1000 * 1000L);
  assert_true(field_is(keel_test_events_find(&log, "exit", 2), "status", "SIGKILL"));
  assert_true(field_is(keel_test_events_find(&log, "exit", 3), "status", "0"));
  assert_int_equal(keel_test_event_long(last_line(&log), "code"), 0);
  events_finish(&log);
}

/* A joiner that takes a rank is a worker from then on: the job waits for it and its exit
 * code is the verdict. */
static void test_rank_taken_by_joiner(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  /* uid 1 (joiner) takes rank 1 in epoch 1 and outlives uid 0 by more than the grace a
   * waiting joiner gets after job/done, then exits 3. */
  launch_expect(
      &run, LIST("-n", "1", "--max-world", "2"),
      LIST("--only", "1", "--publish", "1", "1", "--only", "0", "--sleep", "200", "--only", "0",
           "--publish", "0", "1", "--only", "1", "--sleep", "2500", "--only", "1", "--exit", "3"),
      3, &log);
  const char *joiner_exit = keel_test_events_find(&log, "exit", 1);
  assert_non_null(joiner_exit);
  assert_true(field_is(joiner_exit, "role", "joiner"));
  assert_true(field_is(joiner_exit, "status", "3"));
  assert_int_equal(keel_test_event_long(joiner_exit, "rank"), 1);
  events_finish(&log);
}

static void test_timeout_kills_the_job(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  int64_t start = (int64_t)time(NULL);
  launch_expect(&run, LIST("-n", "2", "--timeout", "1s"), LIST("--sleep", "60000"), 124, &log);
  assert_true((int64_t)time(NULL) - start < 5);
  assert_int_equal(keel_test_event_long(last_line(&log), "code"), 124);
  events_finish(&log);
}

/* A usage error is one line on stderr and exit code 2, before anything starts; the line
 * holds words when they are not NULL. */
static void expect_usage_message(const char *const *args, const char *words) {
  keel_test_job files;
  assert_true(keel_test_job_prepare(&files, "keel-launcher"));
  int code = keel_test_keel(args, files.output, 3000);
  char *text = keel_test_read_file(files.output, NULL);
  assert_non_null(text);
  if (code != 2) fail_msg("%s ... exited %d: %s", args[1] ? args[1] : args[0], code, text);
  size_t length = strlen(text);
  assert_true(length > 0);
  assert_non_null(strstr(text, "keel"));
  assert_ptr_equal(strchr(text, '\n'), text + length - 1);
  if (words != NULL && strstr(text, words) == NULL) fail_msg("'%s' lacks '%s'", text, words);
  free(text);
}

static void expect_usage_error(const char *const *args) { expect_usage_message(args, NULL); }

static void test_bad_flags(void **state) {
  (void)state;
  expect_usage_error(LIST("run", "-n", "0", "--", "true"));
  expect_usage_error(LIST("run", "-n", "x", "--", "true"));
  expect_usage_error(LIST("run", "--on-failure", "foo", "--", "true"));
  expect_usage_error(LIST("run", "--failure-domain", "rack", "--", "true"));
  expect_usage_error(LIST("run", "--timeout", "5x", "--", "true"));
  expect_usage_error(LIST("run", "--heartbeat", "0", "--", "true"));
  expect_usage_error(LIST("run", "--bogus", "--", "true"));
  expect_usage_error(LIST("run", "-n", "4", "--nnodes", "3", "--", "true"));
  expect_usage_error(LIST("run", "-n", "2", "--min-world", "3", "--", "true"));
  expect_usage_error(LIST("run", "-n", "2"));
  expect_usage_error(LIST("run", "--timeout"));
  expect_usage_error(LIST("frobnicate"));
  expect_usage_error(LIST("inject", "explode", "1"));
  expect_usage_error(LIST("inject", "kill", "-3"));
  expect_usage_error(LIST("run", "--join-delay", "-1s", "--", "true"));
  expect_usage_error(LIST("run", "--join-delay", "soon", "--", "true"));
  expect_usage_error(LIST("join", "-n", "x"));
  expect_usage_error(LIST("join", "extra"));
  expect_usage_error(LIST("report"));
  expect_usage_error(LIST("report", "--json", "/nonexistent/keel-events.jsonl"));
}

static void test_help_and_missing_program(void **state) {
  (void)state;
  assert_int_equal(keel_test_keel(LIST("run", "--help"), "/dev/null", 3000), 0);
  assert_int_equal(
      keel_test_keel(LIST("run", "--quiet", "--", "/nonexistent/keel-program"), "/dev/null", 3000),
      127);
}

/* ---- --on-failure restart (RUNTIME.md, "Restarting the job"); fake_worker's --restart-job
 * plays the workers' side: world rank R SIGKILLs itself in incarnation 0, the others save a
 * marker into KEEL_CKPT_DIR and exit 75, and restarted ones report what they were told in
 * an "incarnation" status line. */
#define RESTART_FLAGS "--ckpt", "jit", "--heartbeat", "1s", "--collective-timeout", "1s"
#define CKPT_DIR_BYTES 300

/* Runs a restart job to its end like launch_expect, with flags, RESTART_FLAGS and a
 * --ckpt-dir that does not exist yet (the launcher makes it), whose path goes to ckpt_dir
 * (CKPT_DIR_BYTES). */
static void launch_restart(keel_test_job *run, const char *const *flags,
                           const char *const *worker_args, int expected, keel_test_events *log,
                           char *ckpt_dir) {
  const char *folder = keel_test_tempdir("keel-ckpt");
  assert_non_null(folder);
  snprintf(ckpt_dir, CKPT_DIR_BYTES, "%s/ckpt", folder);
  const char *const restart_flags[] = {RESTART_FLAGS, "--ckpt-dir", ckpt_dir, NULL};
  const char *all[32];
  size_t used = 0;
  for (size_t i = 0; flags[i] != NULL && used < 20; i++) all[used++] = flags[i];
  for (size_t i = 0; restart_flags[i] != NULL; i++) all[used++] = restart_flags[i];
  all[used] = NULL;
  launch_expect(run, all, worker_args, expected, log);
}

static bool ckpt_marker_exists(const char *ckpt_dir, long rank) {
  char path[CKPT_DIR_BYTES + 32];
  snprintf(path, sizeof path, "%s/saved-rank%ld", ckpt_dir, rank);
  return access(path, F_OK) == 0;
}

/* Every worker of the incarnation that starts at first_uid reported the environment of
 * restart `restart` (world rank, node, first uid and epoch, KEEL_CKPT) and exited 0. */
static void expect_incarnation(const keel_test_events *log, long restart, long first_uid,
                               long first_epoch, long world, long per_node) {
  for (long uid = first_uid; uid < first_uid + world; uid++) {
    const char *line = keel_test_events_find(log, "incarnation", uid);
    if (line == NULL) fail_msg("no incarnation line of uid %ld", uid);
    assert_int_equal(keel_test_event_long(line, "restart"), restart);
    assert_int_equal(keel_test_event_long(line, "first_uid"), first_uid);
    assert_int_equal(keel_test_event_long(line, "first_epoch"), first_epoch);
    assert_int_equal(keel_test_event_long(line, "rank"), uid - first_uid);
    assert_int_equal(keel_test_event_long(line, "node"), (uid - first_uid) / per_node);
    assert_true(field_is(line, "ckpt", "jit"));
    assert_true(field_is(keel_test_events_find(log, "exit", uid), "status", "0"));
  }
}

/* The one restart_begin and the restart event that followed it (NULL: none). */
static const char *expect_one_round(const keel_test_events *log, long failed_uid,
                                    const char **restart_p) {
  assert_int_equal(keel_test_events_count(log, "restart_begin"), 1);
  const char *begin = keel_test_events_find(log, "restart_begin", -1);
  assert_int_equal(keel_test_event_long(begin, "restart"), 1);
  assert_int_equal(keel_test_event_long(begin, "failed_uid"), failed_uid);
  *restart_p = keel_test_events_find(log, "restart", -1);
  assert_true(keel_test_events_count(log, "restart") <= 1);
  return begin;
}

/* Rank 1 of 4 (2 nodes of 2) is killed; ranks 0, 2 and 3 save and exit 75; the launcher
 * starts uids 4..7 as restart 1 in epoch 1, and their exits are the verdict. */
static void test_restart_once(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  char ckpt_dir[CKPT_DIR_BYTES], absolute[PATH_MAX];
  launch_restart(&run, LIST("-n", "4", "--nproc-per-node", "2"), LIST("--restart-job", "1", "300"),
                 0, &log, ckpt_dir);
  const char *start = log.lines[0];
  assert_true(field_is(start, "on_failure", "restart"));
  assert_true(field_is(start, "ckpt", "jit"));
  assert_non_null(realpath(ckpt_dir, absolute));
  assert_true(field_is(start, "ckpt_dir", absolute));
  const char *restart = NULL, *begin = expect_one_round(&log, 1, &restart);
  assert_true(field_is(begin, "reason", "SIGKILL"));
  assert_non_null(restart);
  assert_int_equal(keel_test_event_long(restart, "restart"), 1);
  assert_int_equal(keel_test_event_long(restart, "first_uid"), 4);
  assert_int_equal(keel_test_event_long(restart, "first_epoch"), 1);
  assert_int_equal(keel_test_event_long(restart, "world"), 4);
  assert_true(keel_test_event_long(restart, "down_ms") >= 0);
  assert_true(keel_test_event_long(restart, "t_ns") >= keel_test_event_long(begin, "t_ns"));
  assert_int_equal(keel_test_events_count(&log, "spawn"), 8);
  assert_int_equal(keel_test_events_count(&log, "fence"), 0);
  for (long uid = 0; uid < 4; uid++) {
    assert_true(
        field_is(keel_test_events_find(&log, "exit", uid), "status", uid == 1 ? "SIGKILL" : "75"));
    assert_true(ckpt_marker_exists(ckpt_dir, uid) == (uid != 1));
    /* The restarted worker of the same rank finds that save in the same folder. */
    const char *line = keel_test_events_find(&log, "incarnation", uid + 4);
    if (line == NULL) fail_msg("no incarnation line of uid %ld in %s", uid + 4, run.events);
    const char *restored = keel_test_event_field(line, "restored");
    assert_non_null(restored);
    assert_int_equal(strncmp(restored, "true", 4) == 0, uid != 1);
  }
  expect_incarnation(&log, 1, 4, 1, 4, 2);
  assert_int_equal(keel_test_event_long(last_line(&log), "code"), 0);
  events_finish(&log);
}

/* With no restart left, the round ends the job with the failed worker's code. */
static void test_restart_limit_reached(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  char ckpt_dir[CKPT_DIR_BYTES];
  launch_restart(&run, LIST("-n", "3", "--max-restarts", "0"), LIST("--restart-job", "2", "200"),
                 128 + SIGKILL, &log, ckpt_dir);
  const char *restart = NULL;
  expect_one_round(&log, 2, &restart);
  assert_null(restart);
  assert_int_equal(keel_test_events_count(&log, "spawn"), 3);
  assert_true(field_is(keel_test_events_find(&log, "exit", 0), "status", "75"));
  assert_int_equal(keel_test_event_long(last_line(&log), "code"), 128 + SIGKILL);
  char *output = keel_test_read_file(run.output, NULL);
  assert_non_null(output);
  assert_non_null(strstr(output, "--max-restarts 0 reached"));
  free(output);
  events_finish(&log);
}

/* A worker that neither saves nor leaves is fenced at the round's deadline: the collective
 * timeout (1 s) plus KEEL_RESTART_GRACE (shortened to 1 s), and the job restarts. */
static void test_restart_deadline_fences(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  char ckpt_dir[CKPT_DIR_BYTES];
  setenv("KEEL_RESTART_GRACE", "1s", 1);
  launch_restart(&run, LIST("-n", "2", "--max-restarts", "1"),
                 LIST("--only", "1", "--sleep", "60000", "--restart-job", "0", "300"), 0, &log,
                 ckpt_dir);
  unsetenv("KEEL_RESTART_GRACE");
  const char *restart = NULL, *begin = expect_one_round(&log, 0, &restart);
  const char *fence = keel_test_events_find(&log, "fence", 1);
  assert_non_null(fence);
  assert_non_null(strstr(fence, "restart: did not exit in time"));
  long long waited_ms =
      (keel_test_event_long(fence, "t_ns") - keel_test_event_long(begin, "t_ns")) / 1000000;
  assert_in_range(waited_ms, 1900, 4000);
  assert_true(field_is(keel_test_events_find(&log, "exit", 1), "status", "SIGKILL"));
  assert_non_null(restart);
  assert_int_equal(keel_test_event_long(restart, "first_uid"), 2);
  expect_incarnation(&log, 1, 2, 1, 2, 2);
  events_finish(&log);
}

/* With --failure-domain node, the failed worker's node is fenced and one round restarts.
 * Its node-mate (uid 0) sleeps through the failure: left to itself it would see the dead/ key
 * and leave for the restart, under load before the launcher got to fence it (a CI rehearsal
 * saw it gone 3.5 ms after the kill, and no fence). */
static void test_restart_node_domain(void **state) {
  (void)state;
  keel_test_job run;
  keel_test_events log;
  char ckpt_dir[CKPT_DIR_BYTES];
  launch_restart(&run, LIST("--nnodes", "2", "--nproc-per-node", "2", "--failure-domain", "node"),
                 LIST("--only", "0", "--sleep", "20000", "--restart-job", "1", "300"), 0, &log,
                 ckpt_dir);
  const char *node_fence = keel_test_events_find(&log, "fence", 0);
  assert_non_null(node_fence);
  assert_non_null(strstr(node_fence, "node 0"));
  const char *restart = NULL;
  expect_one_round(&log, 1, &restart);
  assert_non_null(restart);
  expect_incarnation(&log, 1, 4, 1, 4, 2);
  events_finish(&log);
}

static void test_restart_flag_errors(void **state) {
  (void)state;
  expect_usage_message(LIST("run", "--on-failure", "restart", "--", "true"),
                       "--on-failure restart needs checkpoints: add --ckpt jit");
  expect_usage_message(LIST("run", "--ckpt", "jit", "--on-failure", "shrink", "--", "true"),
                       "shrink");
  expect_usage_message(LIST("run", "--ckpt", "disk", "--", "true"), "--ckpt must be jit or mem");
  expect_usage_message(LIST("run", "--ckpt", "mem:replicas=two", "--", "true"), "replicas=1..8");
  expect_usage_message(LIST("run", "--ckpt", "mem", "--on-failure", "restart", "--", "true"),
                       "--ckpt mem recovers in process");
  expect_usage_message(LIST("run", "--ckpt", "jit", "--spares", "1", "--", "true"), "--spares");
  expect_usage_message(LIST("run", "-n", "2", "--ckpt", "jit", "--max-world", "3", "--", "true"),
                       "--max-world");
  expect_usage_message(LIST("run", "--ckpt-dir", "/tmp", "--", "true"), "--ckpt-dir");
  expect_usage_error(LIST("run", "--ckpt", "--", "true"));
  expect_usage_error(LIST("run", "--ckpt", "jit", "--ckpt-dir", "", "--", "true"));
}

/* What a test waits for: event `name` about each uid from first to last. */
typedef struct wanted_events {
  const char *name;
  long first, last;
} wanted_events;

static bool events_about(const keel_test_events *log, void *context) {
  const wanted_events *wanted = context;
  for (long uid = wanted->first; uid <= wanted->last; uid++)
    if (keel_test_events_find(log, wanted->name, uid) == NULL) return false;
  return true;
}

/* Polls the events file until it has event name about every uid from first to last, or
 * timeout_ms passes. */
static bool wait_for_events(const char *path, const char *name, long first, long last,
                            int timeout_ms) {
  wanted_events wanted = {name, first, last};
  return keel_test_events_wait(path, MAX_EVENTS, events_about, &wanted, 20, timeout_ms);
}

/* The job id of a running launcher, from the job_start line of its events file. */
static void job_id_read(const char *events, char *job_id, size_t capacity) {
  keel_test_events log;
  keel_test_events_read(events, MAX_EVENTS, &log);
  assert_true(log.count > 0);
  assert_true(keel_test_events_job_id(&log, job_id, capacity));
  keel_test_events_free(&log);
}

static void test_inject_kill(void **state) {
  (void)state;
  keel_test_job run;
  pid_t launcher =
      launch_start(&run, LIST("-n", "3", "--timeout", "20s"), LIST("--sleep", "60000"));
  assert_true(wait_for_events(run.events, "progress", 0, 2, 5000));
  char job_id[32];
  job_id_read(run.events, job_id, sizeof job_id);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  long long victim = keel_test_event_long(keel_test_events_find(&log, "spawn", 1), "pid");
  keel_test_events_free(&log);

  char output[300], expected[128];
  snprintf(output, sizeof output, "%s/inject.txt", run.folder);
  assert_int_equal(keel_test_keel(LIST("ps", "--job", job_id), output, 3000), 0);
  assert_int_equal(keel_test_keel(LIST("inject", "kill", "1", "--job", job_id), output, 3000), 0);
  snprintf(expected, sizeof expected, "killed rank 1 (uid 1, pid %lld)\n", victim);
  char *text = keel_test_read_file(output, NULL);
  assert_non_null(text);
  assert_non_null(strstr(text, "UID"));
  assert_non_null(strstr(text, expected));
  free(text);
  assert_int_equal(keel_test_keel(LIST("inject", "kill", "9", "--job", job_id), "/dev/null", 3000),
                   1);

  assert_true(wait_for_events(run.events, "exit", 1, 1, 5000));
  kill(launcher, SIGTERM);
  launch_wait(launcher, 5000, 143);
  events_read_valid(run.events, &log);
  assert_true(field_is(keel_test_events_find(&log, "exit", 1), "status", "SIGKILL"));
  assert_int_equal(keel_test_event_long(last_line(&log), "code"), 143);
  events_finish(&log);
}

/* SIGSTOP is the hang a lease catches: the stopped process is fenced within about a lease
 * lifetime and a keepalive period, and the job finishes with the verdict of the others. */
static void test_stopped_process_is_fenced(void **state) {
  (void)state;
  keel_test_job run;
  pid_t launcher = launch_start(&run, LIST("-n", "2", "--heartbeat", "1s", "--timeout", "20s"),
                                LIST("--only", "1", "--sleep", "60000", "--sleep", "2000"));
  assert_true(wait_for_events(run.events, "progress", 0, 1, 5000));
  char job_id[32];
  job_id_read(run.events, job_id, sizeof job_id);
  assert_int_equal(keel_test_keel(LIST("inject", "stop", "1", "--job", job_id), "/dev/null", 3000),
                   0);
  int64_t stopped_at = (int64_t)time(NULL);
  assert_true(wait_for_events(run.events, "fence", 1, 1, 3000));
  assert_true((int64_t)time(NULL) - stopped_at <= 2);
  launch_wait(launcher, 8000, 0);
  keel_test_events log;
  events_read_valid(run.events, &log);
  assert_non_null(strstr(keel_test_events_find(&log, "fence", 1), "stopped"));
  assert_true(field_is(keel_test_events_find(&log, "exit", 1), "status", "SIGKILL"));
  events_finish(&log);
}

/* SIGINT is an orderly stop: job/stop, every process leaves with 77 on its own (none is
 * killed), the launcher exits 130. */
static void test_sigint_stops_the_job(void **state) {
  (void)state;
  keel_test_job run;
  pid_t launcher = launch_start(&run, LIST("-n", "2", "--spares", "1", "--timeout", "20s"),
                                LIST("--sleep", "60000"));
  assert_true(wait_for_events(run.events, "progress", 0, 1, 5000));
  kill(launcher, SIGINT);
  launch_wait(launcher, 5000, 130);
  keel_test_events log;
  events_read_valid(run.events, &log);
  assert_int_equal(keel_test_events_count(&log, "stop"), 1);
  assert_int_equal(keel_test_events_count(&log, "exit"), 3);
  for (long uid = 0; uid < 3; uid++)
    assert_true(field_is(keel_test_events_find(&log, "exit", uid), "status", "77"));
  events_finish(&log);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_exit_zero),
      cmocka_unit_test(test_one_exits_three),
      cmocka_unit_test(test_spares_stopped_at_end),
      cmocka_unit_test(test_suspect_is_fenced),
      cmocka_unit_test(test_lapsed_lease_is_fenced),
      cmocka_unit_test(test_node_failure_domain),
      cmocka_unit_test(test_replace_respawns_a_spare),
      cmocka_unit_test(test_rank_taken_by_spare),
      cmocka_unit_test(test_joiners_stopped_at_end),
      cmocka_unit_test(test_rank_taken_by_joiner),
      cmocka_unit_test(test_timeout_kills_the_job),
      cmocka_unit_test(test_bad_flags),
      cmocka_unit_test(test_help_and_missing_program),
      cmocka_unit_test(test_inject_kill),
      cmocka_unit_test(test_stopped_process_is_fenced),
      cmocka_unit_test(test_sigint_stops_the_job),
      cmocka_unit_test(test_restart_once),
      cmocka_unit_test(test_restart_limit_reached),
      cmocka_unit_test(test_restart_deadline_fences),
      cmocka_unit_test(test_restart_node_domain),
      cmocka_unit_test(test_restart_flag_errors),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
