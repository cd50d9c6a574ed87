/* Integration tests of `keel run`, `keel inject`, `keel ps` and the usage errors of `keel
 * join` and `keel report` (their jobs are in test_elastic.c): the real launcher runs fake
 * workers (tests/programs/fake_worker.c) and each test checks its exit code, its events
 * file, that the processes it fenced or killed were the right ones, and that none is left
 * behind. Every run is bounded by a timeout of a few seconds. */
#include <ctype.h>
#include <errno.h>
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
typedef struct event_log {
  char *text;
  char *lines[MAX_EVENTS];
  size_t count;
} event_log;

static void event_log_read(const char *path, event_log *log) {
  memset(log, 0, sizeof *log);
  log->text = keel_test_read_file(path, NULL);
  if (log->text == NULL) return;
  for (char *save = NULL, *line = strtok_r(log->text, "\n", &save);
       line != NULL && log->count < MAX_EVENTS; line = strtok_r(NULL, "\n", &save))
    log->lines[log->count++] = line;
}

static void event_log_free(event_log *log) { free(log->text); }

/* The text after "key": in line, or NULL. */
static const char *field(const char *line, const char *key) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char *at = strstr(line, pattern);
  return at ? at + strlen(pattern) : NULL;
}

static bool is_event(const char *line, const char *name) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "{\"event\":\"%s\"", name);
  return strncmp(line, pattern, strlen(pattern)) == 0;
}

static long field_long(const char *line, const char *key) {
  const char *at = field(line, key);
  if (at == NULL) return -1;
  if (*at == '"') at++;
  return strtol(at, NULL, 10);
}

static bool field_is(const char *line, const char *key, const char *text) {
  const char *at = field(line, key);
  return at != NULL && *at == '"' && strncmp(at + 1, text, strlen(text)) == 0 &&
         at[1 + strlen(text)] == '"';
}

static size_t count_events(const event_log *log, const char *name) {
  size_t count = 0;
  for (size_t i = 0; i < log->count; i++) count += is_event(log->lines[i], name);
  return count;
}

/* The line of event name about uid, or NULL. */
static const char *find_event(const event_log *log, const char *name, long uid) {
  for (size_t i = 0; i < log->count; i++) {
    if (is_event(log->lines[i], name) && field_long(log->lines[i], "uid") == uid)
      return log->lines[i];
  }
  return NULL;
}

static void assert_all_lines_valid(const event_log *log) {
  assert_true(log->count > 0);
  for (size_t i = 0; i < log->count; i++) {
    if (!json_line_valid(log->lines[i])) fail_msg("invalid events line: %s", log->lines[i]);
    assert_non_null(field(log->lines[i], "t_ns"));
    assert_non_null(field(log->lines[i], "wall_ns"));
  }
}

/* Every process the launcher started must be gone (reaped, not a zombie). */
static void assert_no_process_left(const event_log *log) {
  size_t spawned = 0;
  for (size_t i = 0; i < log->count; i++) {
    if (!is_event(log->lines[i], "spawn")) continue;
    pid_t pid = (pid_t)field_long(log->lines[i], "pid");
    assert_true(pid > 1);
    errno = 0;
    if (kill(pid, 0) == 0 || errno != ESRCH) fail_msg("pid %ld is still there", (long)pid);
    spawned++;
  }
  assert_true(spawned > 0);
}

/* ---- running the launcher */
typedef struct launch {
  char folder[256];
  char events[300];
  char output[300];
} launch;

static void launch_prepare(launch *run) {
  const char *folder = keel_test_tempdir("keel-launcher");
  assert_non_null(folder);
  snprintf(run->folder, sizeof run->folder, "%s", folder);
  snprintf(run->events, sizeof run->events, "%s/events.jsonl", run->folder);
  snprintf(run->output, sizeof run->output, "%s/output.txt", run->folder);
}

/* argv of "keel run --quiet --events E <flags...> -- fake_worker <worker args...>"; flags
 * and worker arguments are NULL-terminated lists. */
static void launch_argv(launch *run, char **argv, size_t capacity, const char *const *flags,
                        const char *const *worker_args) {
  static char keel_path[4096], worker_path[4096];
  snprintf(keel_path, sizeof keel_path, "%s", keel_test_bin("keel"));
  snprintf(worker_path, sizeof worker_path, "%s", keel_test_program("fake_worker"));
  size_t used = 0;
  const char *head[] = {keel_path, "run", "--quiet", "--events", run->events};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) argv[used++] = (char *)head[i];
  for (size_t i = 0; flags[i] != NULL && used < capacity - 4; i++) argv[used++] = (char *)flags[i];
  argv[used++] = "--";
  argv[used++] = worker_path;
  for (size_t i = 0; worker_args[i] != NULL && used < capacity - 1; i++)
    argv[used++] = (char *)worker_args[i];
  argv[used] = NULL;
}

static int launch_run(launch *run, const char *const *flags, const char *const *worker_args) {
  char *argv[64];
  launch_prepare(run);
  launch_argv(run, argv, 64, flags, worker_args);
  return keel_test_run(argv, NULL, run->output, RUN_TIMEOUT_MS);
}

static void print_output(const launch *run) {
  char *text = keel_test_read_file(run->output, NULL);
  if (text != NULL && *text != '\0') fprintf(stderr, "--- keel output:\n%s", text);
  free(text);
}

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- tests */
static void test_all_exit_zero(void **state) {
  (void)state;
  launch run;
  int code = launch_run(&run, LIST("-n", "3"), LIST("--only", "0", "--garbage", "--sleep", "100"));
  if (code != 0) print_output(&run);
  assert_int_equal(code, 0);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  assert_true(is_event(log.lines[0], "job_start"));
  assert_true(is_event(log.lines[log.count - 1], "job_end"));
  assert_int_equal(count_events(&log, "job_start"), 1);
  assert_int_equal(count_events(&log, "spawn"), 3);
  assert_int_equal(count_events(&log, "exit"), 3);
  assert_int_equal(count_events(&log, "job_end"), 1);
  assert_int_equal(count_events(&log, "too_long"), 0);
  assert_true(count_events(&log, "progress") >= 1);
  assert_int_equal(field_long(log.lines[log.count - 1], "code"), 0);
  for (long uid = 0; uid < 3; uid++)
    assert_true(field_is(find_event(&log, "exit", uid), "status", "0"));
  assert_no_process_left(&log);
  event_log_free(&log);
}

static void test_one_exits_three(void **state) {
  (void)state;
  launch run;
  int code =
      launch_run(&run, LIST("-n", "3"), LIST("--only", "1", "--exit", "3", "--sleep", "200"));
  assert_int_equal(code, 3);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  assert_int_equal(field_long(log.lines[log.count - 1], "code"), 3);
  assert_no_process_left(&log);
  event_log_free(&log);
}

static void test_spares_stopped_at_end(void **state) {
  (void)state;
  launch run;
  int64_t start = (int64_t)time(NULL);
  /* uid 2 ignores job/done (killed after the grace period); uid 3 leaves on its own. */
  int code = launch_run(
      &run, LIST("-n", "2", "--spares", "2"),
      LIST("--only", "2", "--sleep", "60000", "--only", "3", "--spare-wait", "--sleep", "100"));
  assert_int_equal(code, 0);
  assert_true((int64_t)time(NULL) - start < 6);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  assert_int_equal(count_events(&log, "spawn"), 4);
  assert_int_equal(count_events(&log, "exit"), 4);
  assert_true(field_is(find_event(&log, "spawn", 3), "role", "spare"));
  assert_true(field_is(find_event(&log, "exit", 2), "status", "SIGKILL"));
  assert_true(field_is(find_event(&log, "exit", 3), "status", "0"));
  assert_no_process_left(&log);
  event_log_free(&log);
}

static void test_suspect_is_fenced(void **state) {
  (void)state;
  launch run;
  int code = launch_run(
      &run, LIST("-n", "3"),
      LIST("--only", "0", "--suspect", "2", "--only", "2", "--sleep", "60000", "--sleep", "500"));
  if (code != 0) print_output(&run);
  assert_int_equal(code, 0);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  const char *fence = find_event(&log, "fence", 2);
  assert_non_null(fence);
  assert_int_equal(field_long(fence, "pid"), field_long(find_event(&log, "spawn", 2), "pid"));
  assert_int_equal(count_events(&log, "fence"), 1);
  assert_true(field_is(find_event(&log, "exit", 2), "status", "SIGKILL"));
  assert_no_process_left(&log);
  event_log_free(&log);
}

static void test_lapsed_lease_is_fenced(void **state) {
  (void)state;
  launch run;
  int code = launch_run(
      &run, LIST("-n", "2", "--heartbeat", "300ms"),
      LIST("--only", "1", "--stop-keepalive", "--only", "1", "--sleep", "60000", "--sleep", "200"));
  assert_int_equal(code, 0);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  const char *fence = find_event(&log, "fence", 1);
  assert_non_null(fence);
  assert_non_null(strstr(fence, "lease"));
  assert_null(find_event(&log, "fence", 0));
  assert_no_process_left(&log);
  event_log_free(&log);
}

static void test_node_failure_domain(void **state) {
  (void)state;
  launch run;
  int code =
      launch_run(&run, LIST("--nnodes", "2", "--nproc-per-node", "2", "--failure-domain", "node"),
                 LIST("--only", "0", "--suspect", "2", "--only", "2", "--sleep", "60000", "--only",
                      "3", "--sleep", "60000", "--sleep", "500"));
  assert_int_equal(code, 0);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  assert_non_null(find_event(&log, "fence", 2));
  const char *node_fence = find_event(&log, "fence", 3);
  assert_non_null(node_fence);
  assert_non_null(strstr(node_fence, "node 1"));
  assert_null(find_event(&log, "fence", 1));
  assert_no_process_left(&log);
  event_log_free(&log);
}

static void test_replace_respawns_a_spare(void **state) {
  (void)state;
  launch run;
  int code = launch_run(&run, LIST("-n", "2", "--on-failure", "replace", "--max-restarts", "1"),
                        LIST("--spare-wait", "--only", "1", "--exit", "3", "--sleep", "300"));
  assert_int_equal(code, 3);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  assert_int_equal(count_events(&log, "respawn"), 1);
  const char *respawn = find_event(&log, "respawn", 2);
  assert_non_null(respawn);
  assert_int_equal(field_long(respawn, "after_uid"), 1);
  assert_true(field_is(find_event(&log, "spawn", 2), "role", "spare"));
  assert_true(field_is(find_event(&log, "exit", 2), "status", "0"));
  assert_no_process_left(&log);
  event_log_free(&log);
}

/* A spare that takes a rank is a worker from then on: the job waits for it, and a worker
 * that failed in an older epoch (replaced) does not decide the exit code. */
static void test_rank_taken_by_spare(void **state) {
  (void)state;
  launch run;
  /* uid 1 fails; spare uid 2 takes rank 1 in epoch 1 and outlives uid 0 by more than the
   * grace a spare gets after job/done, so it exits 0 only if the job waits for it. */
  int code = launch_run(
      &run, LIST("-n", "2", "--spares", "1", "--on-failure", "replace"),
      LIST("--only", "1", "--exit", "3", "--only", "2", "--publish", "1", "1", "--only", "0",
           "--sleep", "200", "--only", "0", "--publish", "0", "1", "--sleep", "600", "--only",
           "2", "--sleep", "2500"));
  if (code != 0) print_output(&run);
  assert_int_equal(code, 0);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  const char *spare_exit = find_event(&log, "exit", 2);
  assert_non_null(spare_exit);
  assert_true(field_is(spare_exit, "status", "0"));
  assert_int_equal(field_long(spare_exit, "rank"), 1);
  assert_true(field_is(find_event(&log, "exit", 1), "status", "3"));
  assert_int_equal(count_events(&log, "respawn"), 1);
  assert_no_process_left(&log);
  event_log_free(&log);
}

/* --max-world above -n starts joiners after --join-delay; those still waiting when the
 * workers are done are told by job/done or, if they ignore it, killed like idle spares. */
static void test_joiners_stopped_at_end(void **state) {
  (void)state;
  launch run;
  int64_t start = (int64_t)time(NULL);
  int code = launch_run(&run, LIST("-n", "2", "--max-world", "4", "--join-delay", "100ms"),
                        LIST("--only", "2", "--sleep", "60000", "--only", "3", "--spare-wait",
                             "--sleep", "600"));
  if (code != 0) print_output(&run);
  assert_int_equal(code, 0);
  assert_true((int64_t)time(NULL) - start < 6);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  assert_int_equal(count_events(&log, "spawn"), 4);
  assert_true(field_is(find_event(&log, "spawn", 2), "role", "joiner"));
  assert_true(field_is(find_event(&log, "spawn", 3), "role", "joiner"));
  long started = field_long(log.lines[0], "t_ns");
  assert_true(field_long(find_event(&log, "spawn", 2), "t_ns") - started >= 90 * 1000 * 1000L);
  assert_true(field_is(find_event(&log, "exit", 2), "status", "SIGKILL"));
  assert_true(field_is(find_event(&log, "exit", 3), "status", "0"));
  assert_int_equal(field_long(log.lines[log.count - 1], "code"), 0);
  assert_no_process_left(&log);
  event_log_free(&log);
}

/* A joiner that takes a rank is a worker from then on: the job waits for it and its exit
 * code is the verdict. */
static void test_rank_taken_by_joiner(void **state) {
  (void)state;
  launch run;
  /* uid 1 (joiner) takes rank 1 in epoch 1 and outlives uid 0 by more than the grace a
   * waiting joiner gets after job/done, then exits 3. */
  int code = launch_run(&run, LIST("-n", "1", "--max-world", "2"),
                        LIST("--only", "1", "--publish", "1", "1", "--only", "0", "--sleep", "200",
                             "--only", "0", "--publish", "0", "1", "--only", "1", "--sleep",
                             "2500", "--only", "1", "--exit", "3"));
  assert_int_equal(code, 3);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  const char *joiner_exit = find_event(&log, "exit", 1);
  assert_non_null(joiner_exit);
  assert_true(field_is(joiner_exit, "role", "joiner"));
  assert_true(field_is(joiner_exit, "status", "3"));
  assert_int_equal(field_long(joiner_exit, "rank"), 1);
  assert_no_process_left(&log);
  event_log_free(&log);
}

static void test_timeout_kills_the_job(void **state) {
  (void)state;
  launch run;
  int64_t start = (int64_t)time(NULL);
  int code = launch_run(&run, LIST("-n", "2", "--timeout", "1s"), LIST("--sleep", "60000"));
  assert_int_equal(code, 124);
  assert_true((int64_t)time(NULL) - start < 5);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  assert_int_equal(field_long(log.lines[log.count - 1], "code"), 124);
  assert_no_process_left(&log);
  event_log_free(&log);
}

/* A usage error is one line on stderr and exit code 2, before anything starts. */
static void expect_usage_error(const char *const *args) {
  const char *folder = keel_test_tempdir("keel-launcher");
  assert_non_null(folder);
  char output[300], keel_path[4096];
  snprintf(output, sizeof output, "%s/output.txt", folder);
  snprintf(keel_path, sizeof keel_path, "%s", keel_test_bin("keel"));
  char *argv[16] = {keel_path};
  size_t used = 1;
  for (size_t i = 0; args[i] != NULL && used < 15; i++) argv[used++] = (char *)args[i];
  argv[used] = NULL;
  int code = keel_test_run(argv, NULL, output, 3000);
  char *text = keel_test_read_file(output, NULL);
  assert_non_null(text);
  if (code != 2) fail_msg("%s ... exited %d: %s", args[1] ? args[1] : args[0], code, text);
  size_t length = strlen(text);
  assert_true(length > 0);
  assert_non_null(strstr(text, "keel"));
  assert_ptr_equal(strchr(text, '\n'), text + length - 1);
  free(text);
}

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
  char keel_path[4096];
  snprintf(keel_path, sizeof keel_path, "%s", keel_test_bin("keel"));
  char *help[] = {keel_path, "run", "--help", NULL};
  assert_int_equal(keel_test_run(help, NULL, "/dev/null", 3000), 0);
  char *missing[] = {keel_path, "run", "--quiet", "--", "/nonexistent/keel-program", NULL};
  assert_int_equal(keel_test_run(missing, NULL, "/dev/null", 3000), 127);
}

/* Polls the events file until want(log) holds or timeout_ms passes. */
static bool wait_for_events(const char *path, bool (*want)(const event_log *), int timeout_ms) {
  struct timespec pause = {0, 20 * 1000 * 1000};
  for (int waited = 0; waited < timeout_ms; waited += 20) {
    event_log log;
    event_log_read(path, &log);
    bool done = want(&log);
    event_log_free(&log);
    if (done) return true;
    nanosleep(&pause, NULL);
  }
  return false;
}

static bool workers_reported(const event_log *log, long count) {
  long reported = 0;
  for (long uid = 0; uid < count; uid++) reported += find_event(log, "progress", uid) != NULL;
  return reported == count;
}

static bool two_workers_reported(const event_log *log) { return workers_reported(log, 2); }
static bool three_workers_reported(const event_log *log) { return workers_reported(log, 3); }

static bool uid_one_exited(const event_log *log) { return find_event(log, "exit", 1) != NULL; }

/* The job id of a running launcher, from the job_start line of its events file. */
static void job_id_read(const char *events, char *job_id, size_t capacity) {
  event_log log;
  event_log_read(events, &log);
  assert_true(log.count > 0);
  const char *id_text = field(log.lines[0], "job_id");
  assert_non_null(id_text);
  snprintf(job_id, capacity, "%.*s", (int)strspn(id_text + 1, "0123456789"), id_text + 1);
  event_log_free(&log);
}

static void test_inject_kill(void **state) {
  (void)state;
  launch run;
  char *argv[64];
  launch_prepare(&run);
  launch_argv(&run, argv, 64, LIST("-n", "3", "--timeout", "20s"), LIST("--sleep", "60000"));
  pid_t launcher = keel_test_spawn(argv, NULL, run.output);
  assert_true(launcher > 0);
  assert_true(wait_for_events(run.events, three_workers_reported, 5000));
  char job_id[32];
  job_id_read(run.events, job_id, sizeof job_id);
  event_log log;
  event_log_read(run.events, &log);
  long victim = field_long(find_event(&log, "spawn", 1), "pid");
  event_log_free(&log);

  char keel_path[4096], output[300], expected[128];
  snprintf(keel_path, sizeof keel_path, "%s", keel_test_bin("keel"));
  snprintf(output, sizeof output, "%s/inject.txt", run.folder);
  char *ps[] = {keel_path, "ps", "--job", job_id, NULL};
  assert_int_equal(keel_test_run(ps, NULL, output, 3000), 0);
  char *inject[] = {keel_path, "inject", "kill", "1", "--job", job_id, NULL};
  assert_int_equal(keel_test_run(inject, NULL, output, 3000), 0);
  snprintf(expected, sizeof expected, "killed rank 1 (uid 1, pid %ld)\n", victim);
  char *text = keel_test_read_file(output, NULL);
  assert_non_null(text);
  assert_non_null(strstr(text, "UID"));
  assert_non_null(strstr(text, expected));
  free(text);
  char *no_rank[] = {keel_path, "inject", "kill", "9", "--job", job_id, NULL};
  assert_int_equal(keel_test_run(no_rank, NULL, "/dev/null", 3000), 1);

  assert_true(wait_for_events(run.events, uid_one_exited, 5000));
  kill(launcher, SIGTERM);
  int status;
  assert_true(keel_test_wait(launcher, 5000, &status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 143);
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  assert_true(field_is(find_event(&log, "exit", 1), "status", "SIGKILL"));
  assert_int_equal(field_long(log.lines[log.count - 1], "code"), 143);
  assert_no_process_left(&log);
  event_log_free(&log);
}

static bool uid_one_fenced(const event_log *log) { return find_event(log, "fence", 1) != NULL; }

/* SIGSTOP is the hang a lease catches: the stopped process is fenced within about a lease
 * lifetime and a keepalive period, and the job finishes with the verdict of the others. */
static void test_stopped_process_is_fenced(void **state) {
  (void)state;
  launch run;
  char *argv[64];
  launch_prepare(&run);
  launch_argv(&run, argv, 64, LIST("-n", "2", "--heartbeat", "300ms", "--timeout", "20s"),
              LIST("--only", "1", "--sleep", "60000", "--sleep", "2000"));
  pid_t launcher = keel_test_spawn(argv, NULL, run.output);
  assert_true(launcher > 0);
  assert_true(wait_for_events(run.events, two_workers_reported, 5000));
  char job_id[32], keel_path[4096];
  job_id_read(run.events, job_id, sizeof job_id);
  snprintf(keel_path, sizeof keel_path, "%s", keel_test_bin("keel"));
  char *inject[] = {keel_path, "inject", "stop", "1", "--job", job_id, NULL};
  assert_int_equal(keel_test_run(inject, NULL, "/dev/null", 3000), 0);
  int64_t stopped_at = (int64_t)time(NULL);
  assert_true(wait_for_events(run.events, uid_one_fenced, 3000));
  assert_true((int64_t)time(NULL) - stopped_at <= 2);
  int status;
  assert_true(keel_test_wait(launcher, 8000, &status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  assert_non_null(strstr(find_event(&log, "fence", 1), "stopped"));
  assert_true(field_is(find_event(&log, "exit", 1), "status", "SIGKILL"));
  assert_no_process_left(&log);
  event_log_free(&log);
}

static void test_sigint_stops_the_job(void **state) {
  (void)state;
  launch run;
  char *argv[64];
  launch_prepare(&run);
  launch_argv(&run, argv, 64, LIST("-n", "2", "--spares", "1", "--timeout", "20s"),
              LIST("--sleep", "60000"));
  pid_t launcher = keel_test_spawn(argv, NULL, run.output);
  assert_true(launcher > 0);
  assert_true(wait_for_events(run.events, two_workers_reported, 5000));
  kill(launcher, SIGINT);
  int status;
  assert_true(keel_test_wait(launcher, 5000, &status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 130);
  event_log log;
  event_log_read(run.events, &log);
  assert_all_lines_valid(&log);
  assert_int_equal(count_events(&log, "exit"), 3);
  assert_no_process_left(&log);
  event_log_free(&log);
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
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
