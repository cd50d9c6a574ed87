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

#include "test_support.h"

/* Every job is bounded twice: by the launcher's --timeout and, should the launcher itself
 * hang, by the test's kill. */
#define JOB_TIMEOUT "60s"
#define JOB_TIMEOUT_MS 70000
#define TOOL_TIMEOUT_MS 15000
#define MAX_FINALS 16
#define MAX_EVENTS 4096

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- one job: its folder, events file, output (launcher and workers) and the output of
 * the tools run against it */
typedef struct job {
  char folder[256];
  char events[300];
  char output[300];
  char tool_output[300];
} job;

static void job_prepare(job *run) {
  const char *folder = keel_test_tempdir("keel-elastic");
  assert_non_null(folder);
  snprintf(run->folder, sizeof run->folder, "%s", folder);
  snprintf(run->events, sizeof run->events, "%s/events.jsonl", run->folder);
  snprintf(run->output, sizeof run->output, "%s/output.txt", run->folder);
  snprintf(run->tool_output, sizeof run->tool_output, "%s/tool.txt", run->folder);
}

/* argv of "keel run --quiet --timeout T --events E FLAGS -- toy_train ARGS". */
static void job_argv(const job *run, const char *const *flags, const char *const *program_args,
                     char **argv, size_t capacity) {
  static char keel_path[4096], program_path[4096];
  snprintf(keel_path, sizeof keel_path, "%s", keel_test_bin("keel"));
  snprintf(program_path, sizeof program_path, "%s", keel_test_program("toy_train"));
  size_t used = 0;
  const char *head[] = {keel_path,   "run",      "--quiet",  "--timeout",
                        JOB_TIMEOUT, "--events", run->events};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) argv[used++] = (char *)head[i];
  for (size_t i = 0; flags[i] != NULL && used < capacity - 4; i++) argv[used++] = (char *)flags[i];
  argv[used++] = "--";
  argv[used++] = program_path;
  for (size_t i = 0; program_args[i] != NULL && used < capacity - 1; i++)
    argv[used++] = (char *)program_args[i];
  argv[used] = NULL;
}

static void print_file(const char *what, const char *path) {
  char *text = keel_test_read_file(path, NULL);
  if (text != NULL && *text != '\0') fprintf(stderr, "--- %s (%s):\n%s", what, path, text);
  free(text);
}

/* Runs the job to its end and returns keel's exit code (-1: the test had to kill it).
 * fault (may be NULL) becomes KEEL_FAULT in the launcher's environment. */
static int job_run(job *run, const char *const *flags, const char *const *program_args,
                   const char *fault) {
  char *argv[64], fault_entry[512], *env[2] = {NULL, NULL};
  job_prepare(run);
  job_argv(run, flags, program_args, argv, 64);
  if (fault != NULL) {
    snprintf(fault_entry, sizeof fault_entry, "KEEL_FAULT=%s", fault);
    env[0] = fault_entry;
  }
  int code = keel_test_run(argv, env, run->output, JOB_TIMEOUT_MS);
  if (code != 0) print_file("job output", run->output);
  return code;
}

/* Runs "keel ARGS..." (a tool, not a job) with its stdout and stderr in run->tool_output,
 * which it truncates first. */
static int tool_run(job *run, const char *const *args) {
  static char keel_path[4096];
  snprintf(keel_path, sizeof keel_path, "%s", keel_test_bin("keel"));
  char *argv[16] = {keel_path};
  size_t used = 1;
  for (size_t i = 0; args[i] != NULL && used < 15; i++) argv[used++] = (char *)args[i];
  argv[used] = NULL;
  FILE *truncate = fopen(run->tool_output, "w");
  assert_non_null(truncate);
  fclose(truncate);
  return keel_test_run(argv, NULL, run->tool_output, TOOL_TIMEOUT_MS);
}

/* ---- toy_train's "toy-final rank=R uid=U step=N world=W crc=X" lines */
typedef struct toy_final {
  int rank, world;
  unsigned uid, crc;
  unsigned long long step;
} toy_final;

/* Every finishing process ran all steps in a world of `world` ranks, the ranks are
 * 0..world-1 once each, and all hold the same parameters. */
static void toy_assert_consistent(const job *run, int world, unsigned long long steps) {
  toy_final finals[MAX_FINALS];
  size_t count = 0;
  char *text = keel_test_read_file(run->output, NULL);
  assert_non_null(text);
  for (char *line = strstr(text, "toy-final "); line != NULL && count < MAX_FINALS;
       line = strstr(line + 1, "toy-final ")) {
    toy_final *final = &finals[count];
    if (sscanf(line, "toy-final rank=%d uid=%u step=%llu world=%d crc=%x", &final->rank,
               &final->uid, &final->step, &final->world, &final->crc) == 5)
      count++;
  }
  free(text);
  if (count != (size_t)world) print_file("job output", run->output);
  assert_int_equal(count, world);
  bool seen[MAX_FINALS] = {false};
  for (size_t i = 0; i < count; i++) {
    const toy_final *final = &finals[i];
    if (final->crc != finals[0].crc || final->world != world || final->step != steps) {
      print_file("job output", run->output);
      fail_msg("rank %d (uid %u): step %llu world %d crc %08x; rank %d has crc %08x", final->rank,
               final->uid, final->step, final->world, final->crc, finals[0].rank, finals[0].crc);
    }
    assert_in_range(final->rank, 0, world - 1);
    assert_false(seen[final->rank]);
    seen[final->rank] = true;
  }
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

static long long field_long(const char *line, const char *key) {
  const char *at = field(line, key);
  if (at == NULL) return -1;
  if (*at == '"') at++;
  return strtoll(at, NULL, 10);
}

static bool is_event(const char *line, const char *name) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "{\"event\":\"%s\"", name);
  return strncmp(line, pattern, strlen(pattern)) == 0;
}

/* The index-th line (from 0) of event name, or NULL. */
static const char *nth_event(const event_log *log, const char *name, size_t index) {
  for (size_t i = 0; i < log->count; i++) {
    if (is_event(log->lines[i], name) && index-- == 0) return log->lines[i];
  }
  return NULL;
}

static size_t count_events(const event_log *log, const char *name) {
  size_t count = 0;
  for (size_t i = 0; i < log->count; i++) count += is_event(log->lines[i], name);
  return count;
}

static size_t count_spawned(const event_log *log, const char *role) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"role\":\"%s\"", role);
  size_t count = 0;
  for (size_t i = 0; i < log->count; i++)
    count += is_event(log->lines[i], "spawn") && strstr(log->lines[i], pattern) != NULL;
  return count;
}

/* Every recovery is a grow (nothing failed), the world only grows, and the last one
 * reaches `world`. */
static void assert_grew_to(const event_log *log, long long world) {
  size_t recoveries = count_events(log, "recovery");
  assert_true(recoveries >= 1);
  long long previous = 0;
  for (size_t i = 0; i < recoveries; i++) {
    const char *recovery = nth_event(log, "recovery", i);
    assert_non_null(strstr(recovery, "\"failed\":[]"));
    assert_true(field_long(recovery, "new_world") > field_long(recovery, "old_world"));
    assert_true(field_long(recovery, "new_world") > previous);
    previous = field_long(recovery, "new_world");
  }
  assert_int_equal(previous, world);
}

/* ---- a job running in the background, for `keel join` */
static bool events_have(const char *path, const char *name) {
  event_log log;
  event_log_read(path, &log);
  bool found = nth_event(&log, name, 0) != NULL;
  event_log_free(&log);
  return found;
}

static bool wait_for_event(const char *path, const char *name, int timeout_ms) {
  struct timespec pause = {0, 20 * 1000 * 1000};
  for (int waited = 0; waited < timeout_ms; waited += 20) {
    if (events_have(path, name)) return true;
    nanosleep(&pause, NULL);
  }
  return false;
}

/* Starts the job, waits for its first progress line (the workers are training) and reads
 * its id: `keel join` must name it, since other jobs of this user may be running. */
static pid_t job_start_background(job *run, const char *const *flags,
                                  const char *const *program_args, char *job_id, size_t capacity) {
  char *argv[64];
  job_prepare(run);
  job_argv(run, flags, program_args, argv, 64);
  pid_t pid = keel_test_spawn(argv, NULL, run->output);
  assert_true(pid > 0);
  if (!wait_for_event(run->events, "progress", 20000)) {
    print_file("job output", run->output);
    fail_msg("the job made no progress");
  }
  event_log log;
  event_log_read(run->events, &log);
  const char *id_text = field(nth_event(&log, "job_start", 0), "job_id");
  assert_non_null(id_text);
  snprintf(job_id, capacity, "%.*s", (int)strspn(id_text + 1, "0123456789"), id_text + 1);
  event_log_free(&log);
  return pid;
}

static int job_wait(const job *run, pid_t pid) {
  int status = 0;
  if (!keel_test_wait(pid, JOB_TIMEOUT_MS, &status)) {
    print_file("job output", run->output);
    fail_msg("the job did not end");
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code != 0) print_file("job output", run->output);
  return code;
}

static void assert_tool_said(const job *run, const char *text) {
  char *output = keel_test_read_file(run->tool_output, NULL);
  assert_non_null(output);
  if (strstr(output, text) == NULL) fail_msg("expected '%s' in: %s", text, output);
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
  toy_assert_consistent(&run, 4, 200);
  event_log log;
  event_log_read(run.events, &log);
  assert_int_equal(count_spawned(&log, "worker"), 2);
  assert_int_equal(count_spawned(&log, "joiner"), 2);
  /* The joiners start after --join-delay, not with the workers. */
  long long started = field_long(nth_event(&log, "job_start", 0), "t_ns");
  long long joined = field_long(nth_event(&log, "spawn", 2), "t_ns");
  assert_true(joined - started >= 900 * 1000 * 1000LL);
  assert_grew_to(&log, 4);
  event_log_free(&log);
  /* The report shows the grow. */
  assert_int_equal(tool_run(&run, LIST("report", run.events)), 0);
  assert_tool_said(&run, "(a grow)");
  assert_tool_said(&run, "2 workers, 0 spares, 2 joiners");
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
  if (code != 0) print_file("keel join", run.tool_output);
  assert_int_equal(code, 0);
  assert_tool_said(&run, "starting 1 joiner");
  assert_int_equal(tool_run(&run, LIST("join", "--job", job_id)), 2);
  assert_tool_said(&run, "--max-world 3");
  assert_int_equal(job_wait(&run, pid), 0);
  toy_assert_consistent(&run, 3, 300);
  event_log log;
  event_log_read(run.events, &log);
  assert_int_equal(count_spawned(&log, "joiner"), 1);
  assert_int_equal(count_events(&log, "join_request"), 2);
  assert_non_null(strstr(nth_event(&log, "join_request", 0), "\"accepted\":true"));
  assert_non_null(strstr(nth_event(&log, "join_request", 1), "\"accepted\":false"));
  /* The held-back joiner was the one started: the job did not wait for --join-delay. */
  assert_true(field_long(nth_event(&log, "job_end", 0), "seconds") < 45);
  assert_grew_to(&log, 3);
  event_log_free(&log);
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
  assert_tool_said(&run, "refused");
  assert_tool_said(&run, "above --max-world 3");
  assert_int_equal(tool_run(&run, LIST("join", "--job", job_id, "-n", "0")), 2);
  assert_int_equal(tool_run(&run, LIST("join", "--job", job_id, "--bogus")), 2);
  assert_int_equal(tool_run(&run, LIST("join", "--job", "1")), 1);
  assert_int_equal(job_wait(&run, pid), 0);
  toy_assert_consistent(&run, 3, 200);
  event_log log;
  event_log_read(run.events, &log);
  assert_int_equal(count_spawned(&log, "joiner"), 1);
  assert_non_null(strstr(nth_event(&log, "join_request", 0), "\"accepted\":false"));
  event_log_free(&log);
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
  toy_assert_consistent(&run, 3, 40);
  code = tool_run(&run, LIST("report", run.events));
  if (code != 0) print_file("keel report", run.tool_output);
  assert_int_equal(code, 0);
  assert_tool_said(&run, "exit code 0");
  assert_tool_said(&run, "faults injected: 1");
  assert_tool_said(&run, "uid 1: kill at allreduce, step 10");
  assert_tool_said(&run, "uid 1 (pid ");
  assert_tool_said(&run, "SIGKILL");
  assert_tool_said(&run, "failed uids [1], replaced 1");
  assert_tool_said(&run, "death to recovered: ");
  assert_tool_said(&run, "skipped lines (not a whole JSON event): 0");
  char *text = keel_test_read_file(run.tool_output, NULL);
  double death_ms = -1;
  sscanf(strstr(text, "death to recovered: ") + strlen("death to recovered: "), "%lf", &death_ms);
  free(text);
  assert_true(death_ms >= 0 && death_ms < 30000);
  /* --json: one object per recovery, with the same figure. */
  assert_int_equal(tool_run(&run, LIST("report", "--json", run.events)), 0);
  assert_tool_said(&run, "\"failed\":[1]");
  assert_tool_said(&run, "\"total_ms\":");
  assert_tool_said(&run, "\"death_to_recovered_ms\":");
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
  snprintf(path, sizeof path, "%s/garbage.jsonl", run.folder);
  size_t long_length = 200 * 1024;
  char *text = malloc(sizeof lines + long_length + 1);
  assert_non_null(text);
  memset(text, '{', long_length);
  text[long_length - 1] = '\n';
  memcpy(text + long_length, lines, sizeof lines - 1);
  file_write(path, text, long_length + sizeof lines - 1);
  free(text);
  assert_int_equal(tool_run(&run, LIST("report", path)), 0);
  assert_tool_said(&run, "skipped lines (not a whole JSON event): 8");
  assert_tool_said(&run, "recoveries: 1");
  assert_tool_said(&run, "failed uids [2]");
  assert_tool_said(&run, "death to recovered: 40.0 ms");
  assert_tool_said(&run, "uid 2 (pid 77");
  assert_tool_said(&run, "no job_start event");
  assert_int_equal(tool_run(&run, LIST("report", "--json", path)), 0);
  assert_tool_said(&run, "\"death_to_recovered_ms\":40.000}");
  assert_tool_said(&run, "skipped 8 lines");
  snprintf(path, sizeof path, "%s/missing.jsonl", run.folder);
  assert_int_equal(tool_run(&run, LIST("report", path)), 2);
  assert_tool_said(&run, "cannot read");
  assert_int_equal(tool_run(&run, LIST("report", run.folder)), 2);
  assert_int_equal(tool_run(&run, LIST("report")), 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_report_of_garbage),  cmocka_unit_test(test_joiners_start_later),
      cmocka_unit_test(test_join_adds_a_worker), cmocka_unit_test(test_join_beyond_max_world),
      cmocka_unit_test(test_report_of_a_kill),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
