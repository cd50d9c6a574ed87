/* The fault-injection loop: many short toy_train jobs of 4 workers, each hit by one failure
 * at a random moment -- a SIGKILL or SIGSTOP sent by this test to a worker's pid, or a
 * KEEL_FAULT rule at a random step and point -- under shrink or under replace with 1-2
 * spares. Every job must end by itself with exit 0, its finishers must agree (and match a
 * clean run when a spare took the failed rank), and no process may be left behind.
 * Choices come from a fixed seed and are printed one line per trial; to replay trial T:
 *   KEEL_FAULT_LOOP_ONLY=T [KEEL_FAULT_LOOP_SEED=S] KEEL_BIN=<build>/bin test_fault_loop */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
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

#include "keel/comm.h"
#include "test_support.h"

#define DEFAULT_SEED 20240611
#define DEFAULT_TRIALS 50
#define WORKERS 4
#define STEPS 30
#define STEPS_TEXT "30"
/* The launcher's own bound on a job; the test kills it a little later if even that fails. */
#define JOB_TIMEOUT "30s"
#define JOB_TIMEOUT_MS 40000
/* How long after the first progress line a signal may land: about a whole run of STEPS
 * steps on two busy cores, so that some land late, near or after the end. */
#define MAX_SIGNAL_DELAY_MS 900
#define MAX_FINALS 16
#define MAX_EVENTS 4096

/* ---- a trial: what it does, drawn from the seed */
typedef enum fault_kind {
  FAULT_KILL_PID, /* this test sends SIGKILL to a worker */
  FAULT_STOP_PID, /* this test sends SIGSTOP: a hang, found by the lapsed lease */
  FAULT_RULE,     /* a KEEL_FAULT rule fires inside a worker */
  FAULT_KIND_COUNT,
} fault_kind;

static const char *const fault_kind_names[FAULT_KIND_COUNT] = {"kill-pid", "stop-pid", "rule"};

typedef struct trial {
  int index;
  bool replace;
  int spares;
  fault_kind kind;
  int victim;   /* uid of the worker hit */
  int delay_ms; /* after the first progress line (signals only) */
  char rule[160];
} trial;

static void trial_draw(uint64_t seed, int index, trial *t) {
  static const char *const points[] = {"forward", "allreduce", "optimizer", "step"};
  keel_random random;
  keel_random_seed(&random, keel_random_seed_for(seed, (uint64_t)index, 0));
  *t = (trial){.index = index};
  t->replace = keel_random_below(&random, 2) == 1;
  t->spares = t->replace ? 1 + (int)keel_random_below(&random, 2) : 0;
  t->kind = (fault_kind)keel_random_below(&random, FAULT_KIND_COUNT);
  t->victim = (int)keel_random_below(&random, WORKERS);
  t->delay_ms = (int)keel_random_below(&random, MAX_SIGNAL_DELAY_MS + 1);
  const char *point = points[keel_random_below(&random, 4)];
  int step = 1 + (int)keel_random_below(&random, STEPS - 2);
  int after = 1 + (int)keel_random_below(&random, 6);
  if (strcmp(point, "allreduce") == 0)
    snprintf(t->rule, sizeof t->rule, "kill@rank=%d,step=%d,point=allreduce,after=%d", t->victim,
             step, after);
  else
    snprintf(t->rule, sizeof t->rule, "kill@rank=%d,step=%d,point=%s", t->victim, step, point);
}

static void trial_describe(const trial *t, char *text, size_t capacity) {
  int used = snprintf(text, capacity, "trial %2d: %s spares=%d %s", t->index,
                      t->replace ? "replace" : "shrink ", t->spares, fault_kind_names[t->kind]);
  if (t->kind == FAULT_RULE)
    snprintf(text + used, capacity - (size_t)used, " '%s'", t->rule);
  else
    snprintf(text + used, capacity - (size_t)used, " uid=%d delay=%dms", t->victim, t->delay_ms);
}

/* ---- one job's files */
typedef struct job {
  char folder[256];
  char events[300];
  char output[300];
} job;

static bool job_prepare(job *run) {
  const char *folder = keel_test_tempdir("keel-fault-loop");
  if (folder == NULL) return false;
  snprintf(run->folder, sizeof run->folder, "%s", folder);
  snprintf(run->events, sizeof run->events, "%s/events.jsonl", run->folder);
  snprintf(run->output, sizeof run->output, "%s/output.txt", run->folder);
  return true;
}

/* Starts "keel run ... -- toy_train" for the trial (t NULL: a clean run without spares). */
static pid_t job_start(const job *run, const trial *t) {
  static char keel_path[4096], program_path[4096], spares[16], fault_entry[200];
  snprintf(keel_path, sizeof keel_path, "%s", keel_test_bin("keel"));
  snprintf(program_path, sizeof program_path, "%s", keel_test_program("toy_train"));
  char *argv[40];
  size_t used = 0;
  const char *head[] = {keel_path,  "run",       "--quiet", "--timeout", JOB_TIMEOUT,
                        "--events", run->events, "-n",      "4"};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) argv[used++] = (char *)head[i];
  if (t != NULL && t->replace) {
    snprintf(spares, sizeof spares, "%d", t->spares);
    argv[used++] = "--spares";
    argv[used++] = spares;
    argv[used++] = "--on-failure";
    argv[used++] = "replace";
  }
  /* A stopped worker is found only when its lease lapses: keep that short. */
  if (t != NULL && t->kind == FAULT_STOP_PID) {
    argv[used++] = "--heartbeat";
    argv[used++] = "300ms";
  }
  const char *tail[] = {"--",       program_path, "--steps",      STEPS_TEXT,
                        "--params", "100000",     "--compute-ms", "2"};
  for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[used++] = (char *)tail[i];
  argv[used] = NULL;
  char *env[2] = {NULL, NULL};
  if (t != NULL && t->kind == FAULT_RULE) {
    snprintf(fault_entry, sizeof fault_entry, "KEEL_FAULT=%s", t->rule);
    env[0] = fault_entry;
  }
  return keel_test_spawn(argv, env, run->output);
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

static long field_long(const char *line, const char *key) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char *at = strstr(line, pattern);
  if (at == NULL) return -1;
  at += strlen(pattern);
  if (*at == '"') at++;
  return strtol(at, NULL, 10);
}

static bool is_event(const char *line, const char *name) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "{\"event\":\"%s\"", name);
  return strncmp(line, pattern, strlen(pattern)) == 0;
}

static size_t count_events(const event_log *log, const char *name) {
  size_t count = 0;
  for (size_t i = 0; i < log->count; i++) count += is_event(log->lines[i], name);
  return count;
}

/* The pid the launcher gave uid, or -1 if not spawned (yet). */
static pid_t spawned_pid(const event_log *log, long uid) {
  for (size_t i = 0; i < log->count; i++) {
    if (is_event(log->lines[i], "spawn") && field_long(log->lines[i], "uid") == uid)
      return (pid_t)field_long(log->lines[i], "pid");
  }
  return -1;
}

/* ---- the signal a trial sends itself */

/* Waits for the job's first progress line (training has begun) or its end; true if it
 * is training. */
static bool wait_for_training(const job *run, pid_t launcher) {
  for (int tries = 0; tries < 3000; tries++) {
    event_log log;
    event_log_read(run->events, &log);
    bool training = count_events(&log, "progress") > 0;
    event_log_free(&log);
    if (training) return true;
    if (keel_test_wait(launcher, 0, NULL)) return false; /* ended (and reaped) already */
    usleep(5000);
  }
  return false;
}

/* Sends the trial's signal to its victim; true if the signal reached a live process. The
 * pid is the launcher's child, so it cannot have been reused while the launcher runs. */
static bool trial_signal(const job *run, const trial *t, pid_t launcher) {
  if (!wait_for_training(run, launcher)) return false;
  usleep((useconds_t)t->delay_ms * 1000);
  event_log log;
  event_log_read(run->events, &log);
  pid_t pid = spawned_pid(&log, t->victim);
  event_log_free(&log);
  if (pid <= 1) return false;
  return kill(pid, t->kind == FAULT_STOP_PID ? SIGSTOP : SIGKILL) == 0;
}

/* ---- the verdict */
typedef struct outcome {
  int exit_code; /* -1: the test had to kill the launcher */
  size_t finals;
  int world;
  unsigned crc;
  bool agree;  /* every finisher: same crc, same world == finals, all steps, distinct ranks */
  bool failed; /* a worker died or was fenced (from the events) */
  bool leftover;
  int64_t took_ms;
  char leftover_text[64];
} outcome;

static void outcome_read_finals(const job *run, outcome *result) {
  char *text = keel_test_read_file(run->output, NULL);
  bool ranks_seen[MAX_FINALS] = {false};
  result->agree = text != NULL;
  for (char *line = text ? strstr(text, "toy-final ") : NULL; line != NULL;
       line = strstr(line + 1, "toy-final ")) {
    int rank, world;
    unsigned uid, crc;
    unsigned long long step;
    if (sscanf(line, "toy-final rank=%d uid=%u step=%llu world=%d crc=%x", &rank, &uid, &step,
               &world, &crc) != 5)
      continue;
    if (result->finals == 0) {
      result->crc = crc;
      result->world = world;
    }
    bool rank_ok = rank >= 0 && rank < MAX_FINALS && !ranks_seen[rank];
    if (rank_ok) ranks_seen[rank] = true;
    if (!rank_ok || crc != result->crc || world != result->world || step != STEPS)
      result->agree = false;
    result->finals++;
  }
  if (result->finals == 0 || (int)result->finals != result->world) result->agree = false;
  free(text);
}

/* Every pid the launcher spawned is gone; the first that is not is named. */
static void outcome_read_events(const job *run, outcome *result) {
  event_log log;
  event_log_read(run->events, &log);
  for (size_t i = 0; i < log.count; i++) {
    const char *line = log.lines[i];
    if (is_event(line, "fence")) result->failed = true;
    if (is_event(line, "exit") && strstr(line, "\"status\":\"0\"") == NULL &&
        strstr(line, "\"role\":\"worker\"") != NULL)
      result->failed = true;
    if (!is_event(line, "spawn")) continue;
    pid_t pid = (pid_t)field_long(line, "pid");
    errno = 0;
    if (pid > 1 && (kill(pid, 0) == 0 || errno != ESRCH) && !result->leftover) {
      result->leftover = true;
      snprintf(result->leftover_text, sizeof result->leftover_text, "uid %ld pid %ld",
               field_long(line, "uid"), (long)pid);
    }
  }
  event_log_free(&log);
}

static int64_t now_ms(void) { return keel_now_ns() / 1000000; }

/* Runs one job (t NULL: clean) to its end, the trial's signal included; fills *result. */
static bool job_play(const trial *t, job *run, outcome *result) {
  memset(result, 0, sizeof *result);
  if (!job_prepare(run)) return false;
  int64_t start = now_ms();
  pid_t launcher = job_start(run, t);
  if (launcher <= 0) return false;
  if (t != NULL && t->kind != FAULT_RULE) trial_signal(run, t, launcher);
  int status = 0;
  result->exit_code = -1;
  if (keel_test_wait(launcher, JOB_TIMEOUT_MS - (int)(now_ms() - start), &status)) {
    if (WIFEXITED(status)) result->exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) result->exit_code = 128 + WTERMSIG(status);
  } else {
    kill(-launcher, SIGKILL);
    kill(launcher, SIGKILL);
    keel_test_wait(launcher, 5000, NULL);
  }
  result->took_ms = now_ms() - start;
  outcome_read_finals(run, result);
  outcome_read_events(run, result);
  return true;
}

/* Replacement must be exact whatever detected the one failure (a kill seen at once, a
 * hang fenced after its lease): the newcomer resumes from a survivor's state. */
static bool trial_expects_baseline(const trial *t, const outcome *result) {
  return t->replace || !result->failed;
}

/* Checks the outcome; writes why it is wrong into reason (empty when it is right). */
static void trial_judge(const trial *t, const outcome *result, unsigned baseline, char *reason,
                        size_t capacity) {
  reason[0] = '\0';
  if (result->exit_code != 0)
    snprintf(reason, capacity, "exit code %d", result->exit_code);
  else if (!result->agree)
    snprintf(reason, capacity, "finishers disagree or are missing");
  else if (t->replace && result->world != WORKERS)
    snprintf(reason, capacity, "world %d after replacement", result->world);
  else if (trial_expects_baseline(t, result) && result->crc != baseline)
    snprintf(reason, capacity, "crc %08x, clean run %08x", result->crc, baseline);
  else if (result->leftover)
    snprintf(reason, capacity, "left behind: %s", result->leftover_text);
}

static uint64_t env_number(const char *name, uint64_t fallback) {
  const char *text = getenv(name);
  return text != NULL && *text != '\0' ? strtoull(text, NULL, 10) : fallback;
}

static void test_fault_loop(void **state) {
  (void)state;
  uint64_t seed = env_number("KEEL_FAULT_LOOP_SEED", DEFAULT_SEED);
  int trials = (int)env_number("KEEL_FAULT_LOOP_TRIALS", DEFAULT_TRIALS);
  int only = (int)env_number("KEEL_FAULT_LOOP_ONLY", (uint64_t)-1);
  job run;
  outcome clean;
  assert_true(job_play(NULL, &run, &clean));
  if (clean.exit_code != 0 || !clean.agree || clean.world != WORKERS)
    fail_msg("the clean run failed: exit %d, see %s", clean.exit_code, run.output);
  printf("fault loop: seed=%llu trials=%d clean crc=%08x (%lld ms)\n", (unsigned long long)seed,
         trials, clean.crc, (long long)clean.took_ms);
  int failures = 0, first_failure = -1;
  for (int index = 0; index < trials; index++) {
    if (only >= 0 && index != only) continue;
    trial t;
    char description[256], reason[160];
    trial_draw(seed, index, &t);
    trial_describe(&t, description, sizeof description);
    outcome result;
    assert_true(job_play(&t, &run, &result));
    trial_judge(&t, &result, clean.crc, reason, sizeof reason);
    printf("%s | exit=%d finals=%zu world=%d crc=%08x failed=%s %lldms %s%s%s\n", description,
           result.exit_code, result.finals, result.world, result.crc, result.failed ? "yes" : "no",
           (long long)result.took_ms, reason[0] ? "FAIL: " : "ok", reason,
           reason[0] ? " (files in " : "");
    if (reason[0]) printf("    %s)\n", run.folder);
    fflush(stdout);
    if (reason[0] && failures++ == 0) first_failure = index;
  }
  if (failures > 0)
    fail_msg(
        "%d trial(s) failed; replay the first with KEEL_FAULT_LOOP_ONLY=%d "
        "KEEL_FAULT_LOOP_SEED=%llu",
        failures, first_failure, (unsigned long long)seed);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fault_loop),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
