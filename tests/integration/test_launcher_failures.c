/* Integration tests of `keel run` as no single point of failure (issue items 11, 13, 14, 15):
 * the launcher stopped for 10 s while the job trains on, and while a worker dies; the
 * launcher killed with SIGKILL, after which every process saves, says where and leaves on
 * its own, and `keel run --resume` goes on; SIGINT and SIGTERM, once (an orderly stop) or
 * twice (at once). Real launcher, real toy_train processes over loopback. Each case checks
 * from outside: /proc, exit statuses (this process is a subreaper, so the exits of workers
 * whose launcher died reach it), the events file, the output and the checkpoint folder; a
 * job that goes on or is resumed must end bit-identical to a clean run. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "keel/core.h"

#include "test_events.h"
#include "test_job.h"
#include "test_support.h"

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* One toy_train run for every case: 3 workers, 600 steps of 1000 parameters. Cases choose
 * --compute-ms, a sleep per step that changes no arithmetic (toy_train.c), so one clean run
 * with --compute-ms 0 gives the crc every case must end with. */
#define WORLD 3
#define WORLD_TEXT "3"
#define TOY_STEPS "600"
#define TOY_STEP_COUNT 600
#define TOY_PARAMS "1000"
/* The launcher's own --timeout (stretched under sanitizers by test_job.c): a safety net. */
#define JOB_TIMEOUT "90s"
#define JOB_WAIT_MS 60000
#define MAX_EVENTS 20000
/* <absolute checkpoint folder>/<job id> */
#define STATE_DIR_BYTES (PATH_MAX + 64)
#define MS INT64_C(1000000)
/* Item 13: the launcher stopped for up to 10 s. */
#define LAUNCHER_STOP_MS 10000
#define STOP_COMPUTE_MS 20
/* Item 14: every process leaves within 2 s of the launcher's death. */
#define LEAVE_MS 2000
/* Item 15: a second signal kills at once; the launcher is gone within this. */
#define PROMPT_MS 2000
/* An idle spare's way out depends on a race (see the case): this many jobs look for it. */
#define SPARE_TRIALS 4

/* ---- every job a case starts, for the teardown to end whatever is left of it */
#define MAX_JOBS 8

typedef struct started_job {
  char events[300];
  pid_t launcher; /* 0 once reaped */
} started_job;

typedef struct fixture {
  started_job jobs[MAX_JOBS];
  size_t count;
} fixture;

static void note(const char *format, ...) __attribute__((format(printf, 1, 2)));

/* A measurement, for whoever reads the test's output. */
static void note(const char *format, ...) {
  va_list arguments;
  va_start(arguments, format);
  fprintf(stderr, "launcher_failures: ");
  vfprintf(stderr, format, arguments);
  fprintf(stderr, "\n");
  va_end(arguments);
}

static int64_t stretched_ms(int64_t ms) { return ms * keel_test_slowdown(); }

static int64_t elapsed_ms(int64_t since_ns) { return (keel_now_ns() - since_ns) / MS; }

static void pause_ms(int ms) {
  struct timespec interval = {ms / 1000, (long)(ms % 1000) * MS};
  nanosleep(&interval, NULL);
}

/* Sleeps until CLOCK_MONOTONIC (keel_now_ns) reads when_ns: how long a fault lasts. */
static void sleep_until(int64_t when_ns) {
  struct timespec at = {when_ns / 1000000000, when_ns % 1000000000};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR) {
  }
}

/* ---- processes, seen through /proc */

/* pid's state letter ('R', 'S', 'T', 'Z', ...), or 0 when there is no such process; its
 * parent in *parent_p (when not NULL). */
static char process_state(pid_t pid, pid_t *parent_p) {
  char state = 0;
  int parent = 0;
  if (keel_process_stat(pid, &state, &parent) != KEEL_OK) return 0;
  if (parent_p != NULL) *parent_p = parent;
  return state;
}

static bool state_live(char state) { return state == 'R' || state == 'S' || state == 'D'; }

/* A state letter for a message: '-' for a process that is no more. */
static char state_shown(char state) { return state != 0 ? state : '-'; }

/* Asserts that pid runs or sleeps (neither stopped nor dead) and that its parent is parent. */
static void assert_live_child(pid_t pid, pid_t parent, const char *what) {
  pid_t actual = 0;
  char state = process_state(pid, &actual);
  if (!state_live(state) || actual != parent)
    fail_msg("%s (pid %ld): state '%c', parent %ld; expected a live child of %ld", what, (long)pid,
             state_shown(state), (long)actual, (long)parent);
}

/* Polls /proc until pid's state is wanted, for at most timeout_ms (stretched). */
static bool state_wait(pid_t pid, char wanted, int timeout_ms) {
  int64_t deadline_ns = keel_now_ns() + stretched_ms(timeout_ms) * MS;
  for (;;) {
    if (process_state(pid, NULL) == wanted) return true;
    if (keel_now_ns() >= deadline_ns) return false;
    pause_ms(1);
  }
}

/* SIGSTOPs a live process and waits until /proc shows it stopped ('T'); returns when the
 * signal was sent. */
static int64_t process_stop(pid_t pid, const char *what) {
  char state = process_state(pid, NULL);
  if (!state_live(state))
    fail_msg("%s (pid %ld) is not running: '%c'", what, (long)pid, state_shown(state));
  int64_t sent_ns = keel_now_ns();
  assert_int_equal(kill(pid, SIGSTOP), 0);
  if (!state_wait(pid, 'T', 2000)) fail_msg("%s (pid %ld) did not stop", what, (long)pid);
  return sent_ns;
}

/* SIGCONTs a process that must still be stopped and waits until it runs again; returns
 * when the signal was sent. */
static int64_t process_continue(pid_t pid, const char *what) {
  char state = process_state(pid, NULL);
  if (state != 'T')
    fail_msg("%s (pid %ld) was no longer stopped: '%c'", what, (long)pid, state_shown(state));
  int64_t sent_ns = keel_now_ns();
  assert_int_equal(kill(pid, SIGCONT), 0);
  int64_t deadline_ns = sent_ns + stretched_ms(2000) * MS;
  while (process_state(pid, NULL) == 'T') {
    if (keel_now_ns() >= deadline_ns) fail_msg("%s (pid %ld) stays stopped", what, (long)pid);
    pause_ms(1);
  }
  return sent_ns;
}

/* ---- jobs: keel run -- toy_train */

static void job_prepare(keel_test_job *job) { assert_true(keel_test_job_prepare(job, "keel-lf")); }

/* What a failing case shows of a job: its output, and its events but the many progress
 * lines. */
static void job_show(const keel_test_job *job) {
  keel_test_print_file("job output", job->output);
  keel_test_events log;
  keel_test_events_read(job->events, MAX_EVENTS, &log);
  fprintf(stderr, "--- events but progress (%s):\n", job->events);
  for (size_t i = 0; i < log.count; i++) {
    if (!keel_test_event_is(log.lines[i], "progress")) fprintf(stderr, "%s\n", log.lines[i]);
  }
  keel_test_events_free(&log);
}

/* Starts `keel run --quiet --timeout JOB_TIMEOUT --events E FLAGS -- toy_train --steps
 * TOY_STEPS --params TOY_PARAMS --compute-ms COMPUTE_MS` in the prepared job's folder, with
 * fault as KEEL_FAULT and stop_grace as KEEL_STOP_GRACE (each when not NULL); the job is
 * remembered for the teardown. */
static started_job *job_launch(fixture *f, const keel_test_job *job, const char *const *flags,
                               const char *compute_ms, const char *fault, const char *stop_grace) {
  assert_true(f->count < MAX_JOBS);
  started_job *started = &f->jobs[f->count];
  snprintf(started->events, sizeof started->events, "%s", job->events);
  /* The launcher inherits this process's environment (keel_test_spawn). */
  if (stop_grace != NULL) setenv("KEEL_STOP_GRACE", stop_grace, 1);
  pid_t pid = keel_test_job_start(
      job, JOB_TIMEOUT, flags, keel_test_program("toy_train"),
      LIST("--steps", TOY_STEPS, "--params", TOY_PARAMS, "--compute-ms", compute_ms), fault);
  if (stop_grace != NULL) unsetenv("KEEL_STOP_GRACE");
  assert_true(pid > 0);
  started->launcher = pid;
  f->count++;
  return started;
}

/* Waits for the launcher to end (at most timeout_ms, stretched); returns its exit code, or
 * 128 + the signal that ended it. */
static int launcher_wait(started_job *started, int timeout_ms) {
  int status = 0;
  if (!keel_test_wait(started->launcher, timeout_ms, &status))
    fail_msg("keel run (pid %ld) still runs after %d ms", (long)started->launcher, timeout_ms);
  started->launcher = 0;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

/* Ends what is left of a job: its launcher (continued if stopped, then killed: it is this
 * process's child until reaped, so its pid is its own) and every process it spawned that is
 * now this process's child (orphans come to the subreaper). A pid that is not ours is never
 * signalled: it may have been recycled. */
static void started_job_end(started_job *started) {
  if (started->launcher > 0) {
    kill(started->launcher, SIGKILL);
    kill(started->launcher, SIGCONT);
    keel_test_wait(started->launcher, 5000, NULL);
    started->launcher = 0;
  }
  keel_test_events log;
  keel_test_events_read(started->events, MAX_EVENTS, &log);
  for (size_t i = 0; i < log.count; i++) {
    if (!keel_test_event_is(log.lines[i], "spawn")) continue;
    pid_t pid = (pid_t)keel_test_event_long(log.lines[i], "pid"), parent = 0;
    char state = pid > 1 ? process_state(pid, &parent) : 0;
    if (state == 0 || parent != getpid()) continue;
    if (state != 'Z') kill(pid, SIGKILL);
    keel_test_wait(pid, 5000, NULL);
  }
  keel_test_events_free(&log);
}

static int fixture_setup(void **state) {
  *state = calloc(1, sizeof(fixture));
  return *state != NULL ? 0 : -1;
}

static int fixture_teardown(void **state) {
  fixture *f = *state;
  for (size_t i = 0; i < f->count; i++) started_job_end(&f->jobs[i]);
  free(f);
  return 0;
}

/* ---- the events file */

static bool field_is(const char *line, const char *key, const char *text) {
  const char *at = line != NULL ? keel_test_event_field(line, key) : NULL;
  size_t length = strlen(text);
  return at != NULL && at[0] == '"' && strncmp(at + 1, text, length) == 0 && at[1 + length] == '"';
}

static double field_double(const char *line, const char *key) {
  const char *at = keel_test_event_field(line, key);
  return at != NULL ? strtod(at, NULL) : -1;
}

/* Events named name about uid (< 0: any) whose "step" is at least min_step (< 0: any). */
typedef struct event_want {
  const char *name;
  long uid;
  long long min_step;
  size_t count;
} event_want;

static size_t events_matching(const keel_test_events *log, const event_want *want) {
  size_t matched = 0;
  for (size_t i = 0; i < log->count; i++) {
    const char *line = log->lines[i];
    if (!keel_test_event_is(line, want->name)) continue;
    if (want->uid >= 0 && keel_test_event_long(line, "uid") != want->uid) continue;
    if (want->min_step >= 0 && keel_test_event_long(line, "step") < want->min_step) continue;
    matched++;
  }
  return matched;
}

static bool events_wanted(const keel_test_events *log, void *context) {
  const event_want *want = context;
  return events_matching(log, want) >= want->count;
}

/* Waits (at most timeout_ms, stretched) until job's events file has count events named name
 * about uid with step >= min_step (uid, min_step < 0: any). */
static void events_await(const keel_test_job *job, const char *name, long uid, long long min_step,
                         size_t count, int timeout_ms) {
  event_want want = {name, uid, min_step, count};
  if (keel_test_events_wait(job->events, MAX_EVENTS, events_wanted, &want, 10,
                            (int)stretched_ms(timeout_ms)))
    return;
  job_show(job);
  fail_msg("no %zu '%s' events (uid %ld, step >= %lld) within %d ms", count, name, uid, min_step,
           timeout_ms);
}

static void events_read(const keel_test_job *job, keel_test_events *log) {
  keel_test_events_read(job->events, MAX_EVENTS, log);
  assert_true(log->count > 0);
}

/* Of a job that has started: checks that its job_start names the launcher this test started
 * (keel run is exec'd directly) and reads the pid of uids 0..count-1 from its spawn events,
 * and the job id. */
static void job_pids(const keel_test_job *job, const started_job *started, pid_t *pids,
                     size_t count, char *job_id, size_t capacity) {
  keel_test_events log;
  events_read(job, &log);
  const char *start = keel_test_events_find(&log, "job_start", -1);
  assert_non_null(start);
  assert_int_equal(keel_test_event_long(start, "launcher_pid"), started->launcher);
  assert_true(keel_test_events_job_id(&log, job_id, capacity));
  for (size_t uid = 0; uid < count; uid++) {
    const char *spawn = keel_test_events_find(&log, "spawn", (long)uid);
    if (spawn == NULL) fail_msg("uid %zu was not spawned", uid);
    pids[uid] = (pid_t)keel_test_event_long(spawn, "pid");
    assert_true(pids[uid] > 1);
  }
  keel_test_events_free(&log);
}

/* Asserts that uids 0..count-1 of job (pids) all run, children of its launcher; a failure
 * shows the job (an exit event says how one that is gone ended). */
static void assert_job_alive(const keel_test_job *job, const pid_t *pids, size_t count,
                             pid_t launcher) {
  for (size_t uid = 0; uid < count; uid++) {
    pid_t parent = 0;
    char state = process_state(pids[uid], &parent);
    if (state_live(state) && parent == launcher) continue;
    job_show(job);
    fail_msg("uid %zu (pid %ld) is not a live child of keel run (pid %ld): state '%c', parent %ld",
             uid, (long)pids[uid], (long)launcher, state_shown(state), (long)parent);
  }
}

/* Asserts that every exit event of uids first..last has this exit code, unfenced. */
static void assert_exit_codes(const keel_test_events *log, long first, long last, long long code) {
  for (long uid = first; uid <= last; uid++) {
    const char *exit_line = keel_test_events_find(log, "exit", uid);
    if (exit_line == NULL) fail_msg("no exit event of uid %ld", uid);
    /* A process ended by a signal has "signal" instead of "code". */
    if (keel_test_event_field(exit_line, "code") == NULL ||
        keel_test_event_long(exit_line, "code") != code ||
        strstr(exit_line, "\"fenced\":false") == NULL)
      fail_msg("uid %ld: expected exit code %lld, unfenced: %s", uid, code, exit_line);
  }
}

/* ---- the output file and the checkpoint folder */

/* How many lines of the file at path contain needle; the last of them into line. */
static size_t output_lines_with(const char *path, const char *needle, char *line, size_t capacity) {
  char *text = keel_test_read_file(path, NULL);
  assert_non_null(text);
  size_t found = 0;
  for (char *cursor = text; *cursor != '\0';) {
    char *end = strchr(cursor, '\n');
    size_t length = end ? (size_t)(end - cursor) : strlen(cursor);
    char saved = cursor[length];
    cursor[length] = '\0';
    if (strstr(cursor, needle) != NULL) {
      found++;
      if (line != NULL) snprintf(line, capacity, "%s", cursor);
    }
    cursor[length] = saved;
    cursor += length + (end ? 1 : 0);
  }
  free(text);
  return found;
}

/* Asserts that exactly one line of job's output contains needle. */
static void assert_one_line_with(const keel_test_job *job, const char *needle) {
  size_t found = output_lines_with(job->output, needle, NULL, 0);
  if (found == 1) return;
  keel_test_print_file("job output", job->output);
  fail_msg("%zu lines (expected 1) with: %s", found, needle);
}

/* The last non-empty line of the file at path. */
static void output_last_line(const char *path, char *line, size_t capacity) {
  char *text = keel_test_read_file(path, NULL);
  assert_non_null(text);
  size_t length = strlen(text);
  while (length > 0 && text[length - 1] == '\n') text[--length] = '\0';
  char *last = strrchr(text, '\n');
  snprintf(line, capacity, "%s", last != NULL ? last + 1 : text);
  free(text);
}

/* Where the workers of job job_id save: <absolute ckpt dir>/<job id>. */
static void state_dir_of(const char *ckpt_dir, const char *job_id, char *dir, size_t capacity) {
  char real[PATH_MAX];
  if (realpath(ckpt_dir, real) == NULL) fail_msg("%s: %s", ckpt_dir, strerror(errno));
  snprintf(dir, capacity, "%s/%s", real, job_id);
}

static bool manifest_exists(const char *dir, long long step, long rank) {
  char path[STATE_DIR_BYTES + 96];
  snprintf(path, sizeof path, "%s/step-%lld/rank-%ld/manifest", dir, step, rank);
  return access(path, F_OK) == 0;
}

/* Asserts that dir holds a complete snapshot (step-S/rank-R/manifest, written last) of
 * every rank < WORLD, of some step; returns the newest step of any. */
static long long snapshots_newest(const char *dir) {
  DIR *folder = opendir(dir);
  if (folder == NULL) fail_msg("no checkpoint folder %s: %s", dir, strerror(errno));
  bool complete[WORLD] = {false};
  long long newest = -1;
  for (struct dirent *entry = readdir(folder); entry != NULL; entry = readdir(folder)) {
    long long step;
    char tail;
    if (sscanf(entry->d_name, "step-%lld%c", &step, &tail) != 1) continue;
    for (long rank = 0; rank < WORLD; rank++) {
      if (!manifest_exists(dir, step, rank)) continue;
      complete[rank] = true;
      if (step > newest) newest = step;
    }
  }
  closedir(folder);
  for (long rank = 0; rank < WORLD; rank++)
    if (!complete[rank]) fail_msg("%s has no complete snapshot of rank %ld", dir, rank);
  return newest;
}

/* ---- the clean run, and resuming */

/* Waits for the launcher, which must end 0, and returns the crc every rank agrees on. */
static unsigned job_end_clean(keel_test_job *job, started_job *started) {
  int code = launcher_wait(started, JOB_WAIT_MS);
  if (code != 0) job_show(job);
  assert_int_equal(code, 0);
  return keel_test_toy_assert_consistent(job->output, WORLD, TOY_STEP_COUNT);
}

/* The crc of a clean run (no fault, --compute-ms 0): what every case must end with. */
static unsigned clean_crc(fixture *f) {
  static bool known;
  static unsigned crc;
  if (known) return crc;
  keel_test_job job;
  job_prepare(&job);
  started_job *started = job_launch(f, &job, LIST("-n", WORLD_TEXT), "0", NULL, NULL);
  crc = job_end_clean(&job, started);
  known = true;
  return crc;
}

/* `keel run FLAGS --resume DIR` with the program flags of the job that saved into dir: every
 * rank restores the newest snapshot (saved_step), rank 0 says it resumed there, no rank
 * reports a step at or before it (none started over), and the job ends 0 with the clean
 * crc. */
static void resume_check(fixture *f, const char *const *flags, const char *compute_ms,
                         const char *dir, long long saved_step) {
  unsigned clean = clean_crc(f);
  const char *list[32];
  size_t used = 0;
  for (; flags[used] != NULL && used < 28; used++) list[used] = flags[used];
  list[used++] = "--resume";
  list[used++] = dir;
  list[used] = NULL;
  keel_test_job job;
  job_prepare(&job);
  started_job *started = job_launch(f, &job, list, compute_ms, NULL, NULL);
  int64_t start_ns = keel_now_ns();
  unsigned crc = job_end_clean(&job, started);
  if (crc != clean) fail_msg("resumed from %s: crc %08x, clean run %08x", dir, crc, clean);
  keel_test_events log;
  events_read(&job, &log);
  size_t restored = 0;
  for (size_t i = 0; i < log.count; i++) {
    const char *line = log.lines[i];
    if (keel_test_event_is(line, "jit_restore")) {
      if (!field_is(line, "status", "ok") || keel_test_event_long(line, "step") != saved_step)
        fail_msg("expected a restore of step %lld: %s", saved_step, line);
      restored++;
    }
    if (keel_test_event_is(line, "progress") && keel_test_event_long(line, "step") <= saved_step)
      fail_msg("a rank reports a step not past the restored step %lld (it started over?): %s",
               saved_step, line);
  }
  assert_int_equal(restored, WORLD);
  const char *resumed = keel_test_events_find(&log, "resumed", 0);
  assert_non_null(resumed);
  assert_true(field_is(resumed, "kind", "resume"));
  assert_int_equal(keel_test_event_long(resumed, "step"), saved_step);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
  note("resumed from step %lld in %lld ms, crc %08x as the clean run", saved_step,
       (long long)elapsed_ms(start_ns), crc);
}

/* ---- item 13: the launcher stopped (Ctrl-Z) */

/* SIGSTOP for 10 s, then SIGCONT: nothing is fenced or killed, every worker finishes with the
 * clean crc, and the workers trained on while the launcher (and the store inside it) was
 * stopped. That last is shown two ways: rank 0's first progress line written after SIGCONT
 * (its own t_ns) is far past its last one before SIGSTOP, and each worker's store_reachable
 * event gives an outage close to the stop. */
static void test_launcher_stopped_job_goes_on(void **state) {
  fixture *f = *state;
  unsigned clean = clean_crc(f);
  keel_test_job job;
  job_prepare(&job);
  char compute_ms[16];
  snprintf(compute_ms, sizeof compute_ms, "%d", STOP_COMPUTE_MS);
  started_job *started = job_launch(f, &job, LIST("-n", WORLD_TEXT), compute_ms, NULL, NULL);
  pid_t launcher = started->launcher;
  events_await(&job, "progress", 0, 20, 1, 10000);
  pid_t pids[WORLD];
  char job_id[32];
  job_pids(&job, started, pids, WORLD, job_id, sizeof job_id);
  /* A terminal's Ctrl-Z reaches the launcher's process group only: each worker has its own. */
  assert_job_alive(&job, pids, WORLD, launcher);
  for (size_t uid = 0; uid < WORLD; uid++) assert_true(getpgid(pids[uid]) != getpgid(launcher));

  int64_t stop_ns = process_stop(launcher, "keel run");
  sleep_until(stop_ns + LAUNCHER_STOP_MS * MS);
  int64_t continue_ns = process_continue(launcher, "keel run");
  unsigned crc = job_end_clean(&job, started);
  int64_t stopped_ms = (continue_ns - stop_ns) / MS;
  if (crc != clean) fail_msg("crc %08x after the stop, %08x clean", crc, clean);

  keel_test_events log;
  events_read(&job, &log);
  static const char *const never[] = {"fence", "recovery", "respawn", "restart_begin", "timeout"};
  for (size_t i = 0; i < sizeof never / sizeof never[0]; i++) {
    if (keel_test_events_count(&log, never[i]) != 0)
      fail_msg("a '%s' event after a stop of the launcher: %s", never[i],
               keel_test_events_find(&log, never[i], -1));
  }
  assert_int_equal(keel_test_events_count(&log, "exit"), WORLD);
  assert_exit_codes(&log, 0, WORLD - 1, 0);

  long long step_before = -1, step_after = -1;
  for (size_t i = 0; i < log.count; i++) {
    const char *line = log.lines[i];
    if (!keel_test_event_is(line, "progress") || keel_test_event_long(line, "uid") != 0) continue;
    long long t_ns = keel_test_event_long(line, "t_ns");
    if (t_ns < stop_ns) step_before = keel_test_event_long(line, "step");
    if (t_ns >= continue_ns && step_after < 0) step_after = keel_test_event_long(line, "step");
  }
  /* A stop of 10 s is 500 steps of 20 ms; a quarter of them is slack for a loaded machine. */
  long long expected = LAUNCHER_STOP_MS / STOP_COMPUTE_MS / 4;
  if (step_before < 0 || step_after < 0 || step_after - step_before < expected) {
    job_show(&job);
    fail_msg(
        "rank 0 reported step %lld before the stop and step %lld after it: fewer than %lld "
        "steps while the launcher was stopped",
        step_before, step_after, expected);
  }
  size_t reachable = 0;
  for (size_t i = 0; i < log.count; i++) {
    const char *line = log.lines[i];
    if (!keel_test_event_is(line, "store_reachable")) continue;
    double outage_ms = field_double(line, "outage_ms");
    /* The outage begins at the first keepalive that fails (up to two keepalive periods and a
     * reconnect into the stop) and ends at the first that succeeds after it. */
    if (outage_ms < (double)(stopped_ms - 2500) ||
        outage_ms > (double)(stopped_ms + stretched_ms(1500)))
      fail_msg("a store outage of %.0f ms for a stop of %lld ms: %s", outage_ms,
               (long long)stopped_ms, line);
    reachable++;
  }
  assert_true(reachable >= 1);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
  note(
      "launcher stopped %lld ms; rank 0 went from step %lld to %lld meanwhile; %zu workers "
      "saw the store come back; the job ended %lld ms after SIGCONT",
      (long long)stopped_ms, step_before, step_after, reachable,
      (long long)elapsed_ms(continue_ns));
}

/* Item 11 with 13: a worker killed with SIGKILL while the launcher (and its store) is
 * stopped, so it dies unreaped (a zombie); after SIGCONT the job recovers from that death
 * alone (--on-failure replace, a spare takes the rank): a recovery names it, no other
 * process is fenced, and the job ends 0 with the clean crc. */
static void test_worker_killed_while_launcher_stopped(void **state) {
  fixture *f = *state;
  unsigned clean = clean_crc(f);
  keel_test_job job;
  job_prepare(&job);
  started_job *started = job_launch(
      f, &job, LIST("-n", WORLD_TEXT, "--spares", "1", "--on-failure", "replace"), "5", NULL, NULL);
  pid_t launcher = started->launcher;
  events_await(&job, "progress", 0, 50, 1, 10000);
  pid_t pids[WORLD + 1];
  char job_id[32];
  job_pids(&job, started, pids, WORLD + 1, job_id, sizeof job_id);
  assert_job_alive(&job, pids, WORLD + 1, launcher);

  int64_t stop_ns = process_stop(launcher, "keel run");
  sleep_until(stop_ns + 1000 * MS);
  pid_t victim = pids[1];
  assert_live_child(victim, launcher, "uid 1");
  assert_int_equal(kill(victim, SIGKILL), 0);
  if (!state_wait(victim, 'Z', 2000)) fail_msg("uid 1 (pid %ld) did not die", (long)victim);
  /* Dead while the launcher could not reap it. */
  assert_int_equal(process_state(launcher, NULL), 'T');
  sleep_until(stop_ns + LAUNCHER_STOP_MS * MS);
  int64_t continue_ns = process_continue(launcher, "keel run");
  unsigned crc = job_end_clean(&job, started);
  if (crc != clean) fail_msg("crc %08x after the recovery, %08x clean", crc, clean);

  keel_test_events log;
  events_read(&job, &log);
  if (keel_test_events_count(&log, "fence") != 0)
    fail_msg("a process was fenced: %s", keel_test_events_find(&log, "fence", -1));
  const char *death = keel_test_events_find(&log, "exit", 1);
  assert_non_null(death);
  if (!field_is(death, "signal", "SIGKILL") || strstr(death, "\"fenced\":false") == NULL ||
      keel_test_event_long(death, "t_ns") < continue_ns)
    fail_msg("uid 1 should be reaped after SIGCONT, killed by SIGKILL: %s", death);
  assert_int_equal(keel_test_events_count(&log, "recovery"), 1);
  const char *recovery = keel_test_events_find(&log, "recovery", -1);
  if (strstr(recovery, "\"failed\":[1]") == NULL || !field_is(recovery, "policy", "replace") ||
      keel_test_event_long(recovery, "new_world") != WORLD)
    fail_msg("expected uid 1 replaced: %s", recovery);
  /* The survivors, the spare that took rank 1, and the spare respawned for it. */
  assert_exit_codes(&log, 0, 0, 0);
  assert_exit_codes(&log, 2, WORLD, 0);
  const char *respawn = keel_test_events_find(&log, "respawn", -1);
  assert_non_null(respawn);
  assert_int_equal(keel_test_event_long(respawn, "after_uid"), 1);
  assert_exit_codes(&log, keel_test_event_long(respawn, "uid"),
                    keel_test_event_long(respawn, "uid"), 0);
  keel_test_events_assert_none_left(&log);
  note(
      "uid 1 killed 1 s into a stop of %lld ms; rank 0's recovery line came %lld ms after "
      "SIGCONT (total_ms %.1f)",
      (long long)((continue_ns - stop_ns) / MS),
      (keel_test_event_long(recovery, "t_ns") - continue_ns) / MS,
      field_double(recovery, "total_ms"));
  keel_test_events_free(&log);
}

/* ---- item 14: the launcher killed */

/* A process of a job whose launcher was killed: when it was gone, and how. */
typedef struct departure {
  pid_t pid;
  bool gone;
  bool reaped; /* by this process (the subreaper): status is its wait status */
  int status;
  int64_t gone_ns;
} departure;

/* Waits until each process is gone, for at most timeout_ms (stretched): reaps those that are
 * this process's children now, for their exit status; a zombie that is someone else's, or a
 * pid no more, counts as gone without one. */
static void departures_wait(departure *departures, size_t count, int timeout_ms) {
  int64_t deadline_ns = keel_now_ns() + stretched_ms(timeout_ms) * MS;
  for (;;) {
    size_t left = 0;
    for (size_t i = 0; i < count; i++) {
      departure *d = &departures[i];
      if (d->gone) continue;
      int status = 0;
      pid_t done = waitpid(d->pid, &status, WNOHANG);
      if (done == d->pid) {
        *d = (departure){.pid = d->pid,
                         .gone = true,
                         .reaped = true,
                         .status = status,
                         .gone_ns = keel_now_ns()};
        continue;
      }
      char state = done < 0 ? process_state(d->pid, NULL) : 'R';
      if (state == 0 || state == 'Z') {
        d->gone = true;
        d->gone_ns = keel_now_ns();
        continue;
      }
      left++;
    }
    if (left == 0 || keel_now_ns() >= deadline_ns) return;
    pause_ms(1);
  }
}

/* Kills the launcher of a job whose processes are uids 0..count-1 (pids) with SIGKILL, checks
 * that it died of it, and waits for them to leave; returns when it was killed. */
static int64_t launcher_kill(const keel_test_job *job, started_job *started, const pid_t *pids,
                             departure *departures, size_t count) {
  assert_job_alive(job, pids, count, started->launcher);
  for (size_t uid = 0; uid < count; uid++) departures[uid] = (departure){.pid = pids[uid]};
  assert_true(state_live(process_state(started->launcher, NULL)));
  int64_t kill_ns = keel_now_ns();
  assert_int_equal(kill(started->launcher, SIGKILL), 0);
  int status = 0;
  assert_true(keel_test_wait(started->launcher, 2000, &status));
  started->launcher = 0;
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  departures_wait(departures, count, 3 * LEAVE_MS);
  return kill_ns;
}

/* Asserts that uid's process was gone within LEAVE_MS (stretched) of the kill; returns when,
 * in ms. */
static int64_t assert_left_in_time(const departure *d, long uid, int64_t kill_ns) {
  if (!d->gone)
    fail_msg("uid %ld (pid %ld) is still there %lld ms after the launcher was killed", uid,
             (long)d->pid, (long long)elapsed_ms(kill_ns));
  int64_t after_ms = (d->gone_ns - kill_ns) / MS;
  if (after_ms > stretched_ms(LEAVE_MS))
    fail_msg("uid %ld left %lld ms after the launcher was killed (at most %d)", uid,
             (long long)after_ms, LEAVE_MS);
  return after_ms;
}

/* Asserts that uid's process exited on its own (no parent-death signal) with
 * KEEL_EXIT_ORPHANED (76). */
static void assert_orphan_exit(const departure *d, long uid) {
  if (!d->reaped) fail_msg("uid %ld's exit status did not reach the subreaper", uid);
  if (!WIFEXITED(d->status) || WEXITSTATUS(d->status) != 76)
    fail_msg("uid %ld %s %d after the launcher was killed (expected exit 76)", uid,
             WIFEXITED(d->status) ? "exited" : "was killed by signal",
             WIFEXITED(d->status) ? WEXITSTATUS(d->status) : WTERMSIG(d->status));
}

/* SIGKILL of the launcher of a --ckpt jit job (replace, with a spare): every process is gone
 * within 2 s; each worker exited 76 by itself after it saved its state (the folder did not
 * exist before the kill and has a complete snapshot of every rank after it) and said so in
 * one line that names the launcher and the folder; the spare is gone too; `keel run --resume
 * FOLDER` with the same flags ends with the clean crc. */
static void test_launcher_killed_workers_save_and_leave(void **state) {
  fixture *f = *state;
  clean_crc(f);
  keel_test_job job;
  job_prepare(&job);
  char ckpt_dir[320];
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", job.folder);
  const char *const *flags = LIST("-n", WORLD_TEXT, "--spares", "1", "--on-failure", "replace",
                                  "--ckpt", "jit", "--ckpt-dir", ckpt_dir);
  started_job *started = job_launch(f, &job, flags, "5", NULL, NULL);
  pid_t launcher = started->launcher;
  events_await(&job, "progress", 0, 100, 1, 10000);
  pid_t pids[WORLD + 1];
  char job_id[32], dir[STATE_DIR_BYTES];
  job_pids(&job, started, pids, WORLD + 1, job_id, sizeof job_id);
  state_dir_of(ckpt_dir, job_id, dir, sizeof dir);
  if (access(dir, F_OK) == 0) fail_msg("%s exists before anything failed", dir);

  departure departures[WORLD + 1];
  int64_t kill_ns = launcher_kill(&job, started, pids, departures, WORLD + 1);
  int64_t slowest_ms = 0;
  for (long uid = 0; uid <= WORLD; uid++) {
    int64_t after_ms = assert_left_in_time(&departures[uid], uid, kill_ns);
    if (after_ms > slowest_ms) slowest_ms = after_ms;
  }
  for (long uid = 0; uid < WORLD; uid++) {
    assert_orphan_exit(&departures[uid], uid);
    char message[2 * STATE_DIR_BYTES + 256];
    snprintf(message, sizeof message,
             "uid %ld error runtime] the launcher (pid %ld) is gone; state saved in %s (go on "
             "with: keel run --resume %s ...); exiting with 76",
             uid, (long)launcher, dir, dir);
    assert_one_line_with(&job, message);
  }
  long long newest = snapshots_newest(dir);
  note(
      "launcher killed: all %d processes gone within %lld ms (workers: %lld, %lld, %lld ms; "
      "spare %lld ms); newest snapshot step %lld",
      WORLD + 1, (long long)slowest_ms, (long long)((departures[0].gone_ns - kill_ns) / MS),
      (long long)((departures[1].gone_ns - kill_ns) / MS),
      (long long)((departures[2].gone_ns - kill_ns) / MS),
      (long long)((departures[3].gone_ns - kill_ns) / MS), newest);
  resume_check(f, flags, "5", dir, newest);
}

/* SIGKILL of the launcher while spares are idle: each spare leaves like a worker, exit 76
 * and the one line saying the launcher is gone. An idle spare waits in the store, whose
 * server died with the launcher, so how it leaves depends on which it sees first: the
 * status socket's hang-up or its store link's end. Several jobs give both a chance. */
static void test_launcher_killed_idle_spares_leave(void **state) {
  fixture *f = *state;
  for (int trial = 1; trial <= SPARE_TRIALS; trial++) {
    keel_test_job job;
    job_prepare(&job);
    char ckpt_dir[320];
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", job.folder);
    started_job *started = job_launch(f, &job,
                                      LIST("-n", WORLD_TEXT, "--spares", "2", "--on-failure",
                                           "replace", "--ckpt", "jit", "--ckpt-dir", ckpt_dir),
                                      "5", NULL, NULL);
    pid_t launcher = started->launcher;
    /* By step 100 (half a second) the spares have long been waiting in the store. */
    events_await(&job, "progress", 0, 100, 1, 10000);
    pid_t pids[WORLD + 2];
    char job_id[32];
    job_pids(&job, started, pids, WORLD + 2, job_id, sizeof job_id);
    departure departures[WORLD + 2];
    int64_t kill_ns = launcher_kill(&job, started, pids, departures, WORLD + 2);
    for (long uid = 0; uid < WORLD + 2; uid++) assert_left_in_time(&departures[uid], uid, kill_ns);
    for (long uid = 0; uid < WORLD; uid++) assert_orphan_exit(&departures[uid], uid);
    for (long uid = WORLD; uid < WORLD + 2; uid++) {
      const departure *d = &departures[uid];
      char needle[128], line[1024] = "";
      snprintf(needle, sizeof needle, "uid %ld error runtime] the launcher (pid %ld) is gone; ",
               uid, (long)launcher);
      size_t said = output_lines_with(job.output, needle, line, sizeof line);
      bool exited_76 = d->reaped && WIFEXITED(d->status) && WEXITSTATUS(d->status) == 76;
      /* With --ckpt jit on, a spare that held nothing says so, not "no checkpoint policy". */
      bool held_nothing = strstr(line, "nothing to save (this process held no state yet)") != NULL;
      if (!exited_76 || said != 1 || strstr(line, "exiting with 76") == NULL || !held_nothing) {
        keel_test_print_file("job output", job.output);
        fail_msg(
            "trial %d: idle spare uid %ld %s %d, and wrote %zu lines saying the launcher "
            "is gone (expected exit 76 and one line saying it held nothing to save)",
            trial, uid, d->reaped && WIFEXITED(d->status) ? "exited" : "ended with wait status",
            d->reaped && WIFEXITED(d->status) ? WEXITSTATUS(d->status) : d->status, said);
      }
    }
  }
}

/* ---- item 15: SIGINT and SIGTERM */

/* The first signal stops the job in order: exit 128+signal, a stop event, every worker saves
 * (jit_save caused by KEEL_ESTOPPED, each with its manifest in the folder), says so and
 * exits 77, the launcher's last line names the folder; the resumed job ends with the clean
 * crc. */
static void orderly_stop_check(void **state, int signal_number) {
  fixture *f = *state;
  clean_crc(f);
  keel_test_job job;
  job_prepare(&job);
  char ckpt_dir[320];
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", job.folder);
  const char *const *flags = LIST("-n", WORLD_TEXT, "--ckpt", "jit", "--ckpt-dir", ckpt_dir);
  started_job *started = job_launch(f, &job, flags, "5", NULL, NULL);
  pid_t launcher = started->launcher;
  events_await(&job, "progress", 0, 100, 1, 10000);
  pid_t pids[WORLD];
  char job_id[32], dir[STATE_DIR_BYTES];
  job_pids(&job, started, pids, WORLD, job_id, sizeof job_id);
  assert_job_alive(&job, pids, WORLD, launcher);
  state_dir_of(ckpt_dir, job_id, dir, sizeof dir);
  if (access(dir, F_OK) == 0) fail_msg("%s exists before anything failed", dir);

  assert_true(state_live(process_state(launcher, NULL)));
  int64_t signal_ns = keel_now_ns();
  assert_int_equal(kill(launcher, signal_number), 0);
  int code = launcher_wait(started, 20000);
  int64_t stop_ms = elapsed_ms(signal_ns);
  if (code != 128 + signal_number) job_show(&job);
  assert_int_equal(code, 128 + signal_number);

  keel_test_events log;
  events_read(&job, &log);
  assert_int_equal(keel_test_events_count(&log, "stop"), 1);
  assert_true(
      field_is(keel_test_events_find(&log, "stop", -1), "signal", strsignal(signal_number)));
  assert_int_equal(keel_test_events_count(&log, "fence"), 0);
  assert_int_equal(keel_test_events_count(&log, "exit"), WORLD);
  assert_exit_codes(&log, 0, WORLD - 1, 77);
  assert_int_equal(keel_test_events_count(&log, "jit_save"), WORLD);
  for (size_t i = 0; i < log.count; i++) {
    const char *line = log.lines[i];
    if (!keel_test_event_is(line, "jit_save")) continue;
    if (!field_is(line, "cause", "KEEL_ESTOPPED") || !field_is(line, "status", "ok") ||
        !manifest_exists(dir, keel_test_event_long(line, "step"),
                         keel_test_event_long(line, "rank")))
      fail_msg("expected a save for the stop, its manifest in %s: %s", dir, line);
  }
  const char *end = keel_test_events_find(&log, "job_end", -1);
  assert_non_null(end);
  assert_int_equal(keel_test_event_long(end, "code"), 128 + signal_number);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);

  char expected[2 * STATE_DIR_BYTES + 160], last[2 * STATE_DIR_BYTES + 160];
  for (long uid = 0; uid < WORLD; uid++) {
    snprintf(expected, sizeof expected,
             "uid %ld error runtime] the job is stopping; state saved in %s (go on with: keel "
             "run --resume %s ...); exiting with 77",
             uid, dir, dir);
    assert_one_line_with(&job, expected);
  }
  snprintf(expected, sizeof expected,
           "keel run: stopped; the state is in %s (go on with: keel run --resume %s ...)", dir,
           dir);
  output_last_line(job.output, last, sizeof last);
  if (strcmp(last, expected) != 0) fail_msg("last line: '%s'\nexpected: '%s'", last, expected);
  long long newest = snapshots_newest(dir);
  note("%s: the job stopped in order in %lld ms (newest snapshot step %lld)",
       sigabbrev_np(signal_number), (long long)stop_ms, newest);
  resume_check(f, flags, "5", dir, newest);
}

static void test_sigint_stops_in_order(void **state) { orderly_stop_check(state, SIGINT); }

static void test_sigterm_stops_in_order(void **state) { orderly_stop_check(state, SIGTERM); }

/* A second SIGINT during the orderly stop kills at once: uid 1 is made slow to leave (a
 * 60 s delay in its save) and the stop's grace is long (60 s); the others have left with 77;
 * the second SIGINT ends uid 1 with SIGKILL and the launcher exits 130 within 2 s. */
static void test_second_sigint_kills_at_once(void **state) {
  fixture *f = *state;
  keel_test_job job;
  job_prepare(&job);
  char ckpt_dir[320];
  snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", job.folder);
  started_job *started =
      job_launch(f, &job, LIST("-n", WORLD_TEXT, "--ckpt", "jit", "--ckpt-dir", ckpt_dir), "5",
                 "delay@uid=1,point=save,ms=60000", "60s");
  pid_t launcher = started->launcher;
  events_await(&job, "progress", 0, 50, 1, 10000);
  pid_t pids[WORLD];
  char job_id[32];
  job_pids(&job, started, pids, WORLD, job_id, sizeof job_id);

  assert_true(state_live(process_state(launcher, NULL)));
  assert_int_equal(kill(launcher, SIGINT), 0);
  events_await(&job, "stop", -1, -1, 1, 5000);
  events_await(&job, "fault", 1, -1, 1, 5000);
  events_await(&job, "exit", 0, -1, 1, 10000);
  events_await(&job, "exit", 2, -1, 1, 10000);
  /* The stop is under way: uid 1 is still in its save, the launcher waits for it. */
  assert_live_child(pids[1], launcher, "uid 1, slow to leave");
  assert_true(state_live(process_state(launcher, NULL)));
  int64_t second_ns = keel_now_ns();
  assert_int_equal(kill(launcher, SIGINT), 0);
  int code = launcher_wait(started, 10000);
  int64_t took_ms = elapsed_ms(second_ns);
  if (code != 130) job_show(&job);
  assert_int_equal(code, 130);
  if (took_ms > stretched_ms(PROMPT_MS))
    fail_msg("keel run took %lld ms to exit after the second SIGINT", (long long)took_ms);

  keel_test_events log;
  events_read(&job, &log);
  assert_int_equal(keel_test_events_count(&log, "stop"), 1);
  assert_exit_codes(&log, 0, 0, 77);
  assert_exit_codes(&log, 2, 2, 77);
  const char *slow = keel_test_events_find(&log, "exit", 1);
  assert_non_null(slow);
  if (!field_is(slow, "signal", "SIGKILL")) fail_msg("uid 1 should be killed: %s", slow);
  assert_int_equal(keel_test_event_long(keel_test_events_find(&log, "job_end", -1), "code"), 130);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
  note("second SIGINT: keel run exited 130 in %lld ms", (long long)took_ms);
}

/* Without --ckpt, SIGINT still stops the job in order (every worker exits 77 and says that
 * nothing was saved); the launcher says so too. */
static void test_sigint_without_checkpoints(void **state) {
  fixture *f = *state;
  keel_test_job job;
  job_prepare(&job);
  started_job *started = job_launch(f, &job, LIST("-n", WORLD_TEXT), "5", NULL, NULL);
  pid_t launcher = started->launcher;
  events_await(&job, "progress", 0, 50, 1, 10000);
  assert_true(state_live(process_state(launcher, NULL)));
  assert_int_equal(kill(launcher, SIGINT), 0);
  int code = launcher_wait(started, 20000);
  if (code != 130) job_show(&job);
  assert_int_equal(code, 130);

  keel_test_events log;
  events_read(&job, &log);
  assert_int_equal(keel_test_events_count(&log, "stop"), 1);
  assert_int_equal(keel_test_events_count(&log, "jit_save"), 0);
  assert_int_equal(keel_test_events_count(&log, "fence"), 0);
  assert_int_equal(keel_test_events_count(&log, "exit"), WORLD);
  assert_exit_codes(&log, 0, WORLD - 1, 77);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
  char expected[256], last[512];
  for (long uid = 0; uid < WORLD; uid++) {
    snprintf(expected, sizeof expected,
             "uid %ld error runtime] the job is stopping; no state was saved (no checkpoint "
             "policy: keel run --ckpt jit); exiting with 77",
             uid);
    assert_one_line_with(&job, expected);
  }
  output_last_line(job.output, last, sizeof last);
  assert_string_equal(last, "keel run: stopped (no checkpoint policy: nothing was saved)");
}

int main(void) {
  /* Processes whose launcher is killed become this process's children (not init's): their
   * exit statuses can be read, and none lingers as a zombie that another process reaps late. */
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    perror("prctl(PR_SET_CHILD_SUBREAPER)");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_launcher_stopped_job_goes_on, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_worker_killed_while_launcher_stopped, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_launcher_killed_workers_save_and_leave, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_launcher_killed_idle_spares_leave, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_sigint_stops_in_order, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_second_sigint_kills_at_once, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_stops_in_order, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_sigint_without_checkpoints, fixture_setup,
                                      fixture_teardown),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
