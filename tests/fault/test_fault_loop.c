/* The fault-injection loop: many short toy_train jobs of 4 workers, each hit by one failure
 * at a random moment -- a SIGKILL or SIGSTOP sent by this test to a worker's pid, or a
 * KEEL_FAULT rule at a random step and point -- under shrink or under replace with 1-2
 * spares. Every job must end by itself with exit 0, its finishers must agree (and match a
 * clean run when a spare took the failed rank), and no process may be left behind. Every
 * fault must be seen to land during training: a signal reaches a live worker, which is then
 * seen stopped (state T) or dead, and the events show the kill or the fence; a rule leaves
 * its `fault` event, at its point and step. A signal that comes too late (the job or the
 * victim's training already over) is a miss: the trial runs again with half the delay, and
 * fails when it never lands.
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

#include "keel/core.h"
#include "keel/keel.h"
#include "test_events.h"
#include "test_job.h"
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
#define MAX_SIGNAL_DELAY_MS 650
#define MAX_EVENTS 4096
/* Runs of one signal trial, the delay halved after each miss. */
#define MAX_ATTEMPTS 6
/* How long a signalled worker may take to show it (stopped: state T; killed: gone). */
#define SIGNAL_SEEN_MS 2000

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

/* ---- one job (keel_test_job: its folder, events file and output) */

/* Starts "keel run ... -- toy_train" for the trial (t NULL: a clean run without spares). */
static pid_t job_start(const keel_test_job *run, const trial *t) {
  static const char *const toy_args[] = {"--steps",      STEPS_TEXT, "--params", "100000",
                                         "--compute-ms", "2",        NULL};
  char spares[16];
  const char *flags[9] = {"-n", "4"};
  size_t used = 2;
  if (t != NULL && t->replace) {
    snprintf(spares, sizeof spares, "%d", t->spares);
    flags[used++] = "--spares";
    flags[used++] = spares;
    flags[used++] = "--on-failure";
    flags[used++] = "replace";
  }
  /* A stopped worker is found only when its lease lapses: keep that short. */
  if (t != NULL && t->kind == FAULT_STOP_PID) {
    flags[used++] = "--heartbeat";
    flags[used++] = "1s";
  }
  flags[used] = NULL;
  return keel_test_job_start(run, JOB_TIMEOUT, flags, keel_test_program("toy_train"), toy_args,
                             t != NULL && t->kind == FAULT_RULE ? t->rule : NULL);
}

/* ---- the events file */

/* The pid the launcher gave uid, or -1 if not spawned (yet). */
static pid_t spawned_pid(const keel_test_events *log, long uid) {
  const char *spawn = keel_test_events_find(log, "spawn", uid);
  return spawn != NULL ? (pid_t)keel_test_event_long(spawn, "pid") : -1;
}

/* ---- the signal a trial sends itself */

/* What became of a trial's fault: it landed, it missed (came too late: the trial may run
 * again sooner), or something is wrong with it (the test fails). */
typedef struct fault_landing {
  bool launcher_ended; /* reaped while the signal waited: launcher_status holds its status */
  int launcher_status;
  int64_t signal_ns; /* keel_now_ns() just before the signal was sent */
  char miss[128];
  bool after_training; /* the miss: the signal came after the job's last collective */
  char problem[160];
  char note[96]; /* how it landed, when worth a word */
} fault_landing;

typedef struct training_wait {
  pid_t launcher;
  bool ended;
  int status;
} training_wait;

static bool training_or_ended(const keel_test_events *log, void *context) {
  training_wait *wait = context;
  if (keel_test_events_count(log, "progress") > 0) return true;
  wait->ended = keel_test_wait(wait->launcher, 0, &wait->status); /* ended (and reaped) */
  return wait->ended;
}

/* Waits (up to 15 s, times the slowdown) for the job's first progress line (training has
 * begun) or its end; true if it is training. */
static bool wait_for_training(const keel_test_job *run, pid_t launcher, fault_landing *landing) {
  training_wait wait = {launcher, false, 0};
  bool seen = keel_test_events_wait(run->events, MAX_EVENTS, training_or_ended, &wait, 5,
                                    15000 * keel_test_slowdown());
  if (wait.ended) {
    landing->launcher_ended = true;
    landing->launcher_status = wait.status;
  }
  return seen && !wait.ended;
}

/* The state letter of pid if it is the launcher's child; '\0' when there is no such process
 * (or it belongs to someone else: the pid was reaped and reused). */
static char victim_state(pid_t pid, pid_t launcher) {
  char state = '\0';
  int parent = 0;
  if (keel_process_stat(pid, &state, &parent) != KEEL_OK || parent != launcher) return '\0';
  return state;
}

/* After the signal: waits (bounded) for pid to show it, state T after SIGSTOP, dead (a
 * zombie, or reaped) after SIGKILL. A process that dies without being seen stopped was
 * exiting already (its exit raced with the check before the signal): a miss. */
static void wait_signalled(const trial *t, pid_t pid, pid_t launcher, fault_landing *landing) {
  int64_t deadline = keel_now_ns() + (int64_t)SIGNAL_SEEN_MS * keel_test_slowdown() * 1000000;
  struct timespec pause = {0, 1000 * 1000};
  bool stop = t->kind == FAULT_STOP_PID;
  for (;;) {
    char state = victim_state(pid, launcher);
    bool dead = state == 'Z' || state == 'X' || state == '\0';
    if (stop ? state == 'T' || state == 't' : dead) return;
    if (stop && dead) {
      snprintf(landing->miss, sizeof landing->miss,
               "uid %d (pid %ld) exited, never seen stopped by SIGSTOP", t->victim, (long)pid);
      return;
    }
    if (keel_now_ns() >= deadline) {
      snprintf(landing->problem, sizeof landing->problem,
               "uid %d (pid %ld) still in state %c %d ms after %s", t->victim, (long)pid, state,
               SIGNAL_SEEN_MS * keel_test_slowdown(), stop ? "SIGSTOP" : "SIGKILL");
      return;
    }
    nanosleep(&pause, NULL);
  }
}

/* Sends the trial's signal to its victim, delay_ms after training began, and checks that it
 * reached a live process (for SIGSTOP: that the process stopped). The pid is the launcher's
 * child, checked with its parent, so it cannot be another process's. */
static void trial_signal(const keel_test_job *run, const trial *t, int delay_ms, pid_t launcher,
                         fault_landing *landing) {
  if (!wait_for_training(run, launcher, landing)) {
    snprintf(landing->problem, sizeof landing->problem, "the job %s before training began",
             landing->launcher_ended ? "ended" : "took too long");
    return;
  }
  /* The moment of the fault, drawn (stretched by the slowdown, as the whole run is); a job
   * that ends meanwhile ends the wait. */
  int status = 0;
  if (keel_test_wait(launcher, delay_ms, &status)) {
    landing->launcher_ended = true;
    landing->launcher_status = status;
    snprintf(landing->miss, sizeof landing->miss, "the job ended before the signal");
    return;
  }
  keel_test_events log;
  keel_test_events_read(run->events, MAX_EVENTS, &log);
  pid_t pid = spawned_pid(&log, t->victim);
  keel_test_events_free(&log);
  if (pid <= 1) {
    snprintf(landing->problem, sizeof landing->problem, "uid %d has no spawn event", t->victim);
    return;
  }
  char state = victim_state(pid, launcher);
  if (state == '\0' || state == 'Z' || state == 'X') {
    snprintf(landing->miss, sizeof landing->miss, "uid %d (pid %ld) had exited (%s)", t->victim,
             (long)pid, state == '\0' ? "reaped" : "zombie");
    return;
  }
  landing->signal_ns = keel_now_ns();
  if (kill(pid, t->kind == FAULT_STOP_PID ? SIGSTOP : SIGKILL) != 0) {
    snprintf(landing->miss, sizeof landing->miss, "kill(%ld): %s", (long)pid, strerror(errno));
    return;
  }
  wait_signalled(t, pid, launcher, landing);
}

/* Whether every worker but victim wrote its toy-final line at the last step in the full world
 * and nothing recovered: the victim had done its last collective when the signal came. */
static bool others_finished_whole(const keel_test_toy_final *finals, long kept, int victim,
                                  const keel_test_events *log) {
  if (kept != WORKERS - 1 || keel_test_events_find(log, "recovery", -1) != NULL) return false;
  for (long i = 0; i < kept; i++)
    if (finals[i].uid == (unsigned)victim || finals[i].world != WORKERS || finals[i].step != STEPS)
      return false;
  return true;
}

/* After the job: whether its events show the fault's consequence, from the victim's uid and
 * during its training. */
static void trial_check_landing(const keel_test_job *run, const trial *t, fault_landing *landing) {
  if (landing->miss[0] != '\0' || landing->problem[0] != '\0') return;
  keel_test_toy_final finals[KEEL_TEST_MAX_FINALS];
  long kept = keel_test_toy_finals_read(run->output, finals, KEEL_TEST_MAX_FINALS, NULL);
  bool victim_finished = false;
  for (long i = 0; i < kept; i++) victim_finished |= finals[i].uid == (unsigned)t->victim;
  keel_test_events log;
  keel_test_events_read(run->events, MAX_EVENTS, &log);
  const char *exit_event = keel_test_events_find(&log, "exit", t->victim);
  const char *fence = keel_test_events_find(&log, "fence", t->victim);
  if (t->kind == FAULT_RULE) {
    const char *fault = keel_test_events_find(&log, "fault", t->victim);
    const char *point = strstr(t->rule, "point=") + strlen("point=");
    long long step = atoll(strstr(t->rule, "step=") + strlen("step="));
    char expected[48];
    snprintf(expected, sizeof expected, "\"point\":\"%.*s\"", (int)strcspn(point, ","), point);
    if (fault == NULL)
      snprintf(landing->problem, sizeof landing->problem,
               "the rule never fired: no fault event from uid %d", t->victim);
    else if (strstr(fault, expected) == NULL || strstr(fault, "\"action\":\"kill\"") == NULL ||
             keel_test_event_long(fault, "step") < step)
      snprintf(landing->problem, sizeof landing->problem, "another fault fired: %.100s", fault);
    else if (exit_event == NULL || strstr(exit_event, "\"signal\":\"SIGKILL\"") == NULL)
      snprintf(landing->problem, sizeof landing->problem,
               "the rule fired, but uid %d did not die of SIGKILL", t->victim);
  } else if (victim_finished) {
    snprintf(landing->miss, sizeof landing->miss,
             "uid %d had finished training (its toy-final line is out)", t->victim);
  } else if (others_finished_whole(finals, kept, t->victim, &log)) {
    /* Its last collective was done, its toy-final line not yet written: the job owes it
     * nothing more, and its missing line is the signal's doing, not a recovery's. */
    landing->after_training = true;
    snprintf(landing->miss, sizeof landing->miss,
             "uid %d was signalled after the last collective (the rest finished whole)", t->victim);
  } else if (t->kind == FAULT_KILL_PID) {
    if (exit_event == NULL)
      snprintf(landing->problem, sizeof landing->problem, "no exit event for uid %d", t->victim);
    else if (strstr(exit_event, "\"signal\":\"SIGKILL\"") == NULL)
      snprintf(landing->miss, sizeof landing->miss, "uid %d exited before SIGKILL landed",
               t->victim);
    /* A peer may see the link close and have the launcher fence the dying process before
     * it is reaped: that fence must come after the test's SIGKILL. */
    else if (fence != NULL && keel_test_event_long(fence, "t_ns") < landing->signal_ns)
      snprintf(landing->problem, sizeof landing->problem,
               "uid %d was fenced by the launcher before the test's SIGKILL", t->victim);
    else if (fence != NULL)
      snprintf(landing->note, sizeof landing->note, " (fenced after the SIGKILL, before reaped)");
  } else if (fence == NULL) {
    snprintf(landing->problem, sizeof landing->problem, "stopped uid %d was never fenced",
             t->victim);
  }
  keel_test_events_free(&log);
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

static void outcome_read_finals(const keel_test_job *run, outcome *result) {
  keel_test_toy_final finals[KEEL_TEST_MAX_FINALS];
  size_t total = 0;
  long kept = keel_test_toy_finals_read(run->output, finals, KEEL_TEST_MAX_FINALS, &total);
  bool ranks_seen[KEEL_TEST_MAX_FINALS] = {false};
  result->agree = kept >= 0;
  result->finals = total;
  if (kept > 0) {
    result->crc = finals[0].crc;
    result->world = finals[0].world;
  }
  int ranks = 0;
  for (long i = 0; i < kept; i++) {
    const keel_test_toy_final *final = &finals[i];
    bool rank_ok = final->rank >= 0 && final->rank < KEEL_TEST_MAX_FINALS;
    if (rank_ok && !ranks_seen[final->rank]) {
      ranks_seen[final->rank] = true;
      ranks++;
    }
    if (!rank_ok || final->crc != result->crc || final->world != result->world ||
        final->step != STEPS)
      result->agree = false;
  }
  if (kept >= 0 && (size_t)kept < total) result->agree = false;
  /* Every rank of the final world finished, and one may have finished twice with the same
   * model: a member that passed keel_finish's barrier and left is gone for the others that
   * failed the barrier, and under replace a spare takes its rank (docs/RUNTIME.md, "The end
   * of training"). */
  if (ranks == 0 || ranks != result->world) result->agree = false;
}

/* Every pid the launcher spawned is gone; the first that is not is named. */
static void outcome_read_events(const keel_test_job *run, outcome *result) {
  keel_test_events log;
  keel_test_events_read(run->events, MAX_EVENTS, &log);
  for (size_t i = 0; i < log.count; i++) {
    const char *line = log.lines[i];
    if (keel_test_event_is(line, "fence")) result->failed = true;
    if (keel_test_event_is(line, "exit") && strstr(line, "\"status\":\"0\"") == NULL &&
        strstr(line, "\"role\":\"worker\"") != NULL)
      result->failed = true;
    if (!keel_test_event_is(line, "spawn")) continue;
    pid_t pid = (pid_t)keel_test_event_long(line, "pid");
    if (pid > 1 && keel_test_pid_exists(pid) && !result->leftover) {
      result->leftover = true;
      snprintf(result->leftover_text, sizeof result->leftover_text, "uid %lld pid %ld",
               keel_test_event_long(line, "uid"), (long)pid);
    }
  }
  keel_test_events_free(&log);
}

static int64_t now_ms(void) { return keel_now_ns() / 1000000; }

/* Runs one job (t NULL: clean) to its end, the trial's signal (delay_ms after training
 * began) included; fills *result and, for a trial, *landing. */
static bool job_play(const trial *t, int delay_ms, keel_test_job *run, outcome *result,
                     fault_landing *landing) {
  memset(result, 0, sizeof *result);
  memset(landing, 0, sizeof *landing);
  if (!keel_test_job_prepare(run, "keel-fault-loop")) return false;
  int64_t start = now_ms();
  pid_t launcher = job_start(run, t);
  if (launcher <= 0) return false;
  if (t != NULL && t->kind != FAULT_RULE) trial_signal(run, t, delay_ms, launcher, landing);
  int status = landing->launcher_status;
  result->exit_code = -1;
  if (landing->launcher_ended ||
      keel_test_wait(launcher, JOB_TIMEOUT_MS - (int)(now_ms() - start), &status)) {
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
  if (t != NULL) trial_check_landing(run, t, landing);
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
  keel_test_job run;
  outcome clean;
  fault_landing landing;
  assert_true(job_play(NULL, 0, &run, &clean, &landing));
  if (clean.exit_code != 0 || !clean.agree || clean.world != WORKERS)
    fail_msg("the clean run failed: exit %d, see %s", clean.exit_code, run.output);
  printf("fault loop: seed=%llu trials=%d clean crc=%08x (%lld ms)\n", (unsigned long long)seed,
         trials, clean.crc, (long long)clean.took_ms);
  int failures = 0, first_failure = -1, misses = 0;
  for (int index = 0; index < trials; index++) {
    if (only >= 0 && index != only) continue;
    trial t;
    char description[256], reason[200];
    trial_draw(seed, index, &t);
    bool failed = false;
    for (int attempt = 1;; attempt++) {
      trial_describe(&t, description, sizeof description);
      outcome result;
      assert_true(job_play(&t, t.delay_ms, &run, &result, &landing));
      trial_judge(&t, &result, clean.crc, reason, sizeof reason);
      /* The victim's missing toy-final line is then the late signal's doing. */
      if (landing.after_training) reason[0] = '\0';
      /* A fault that never landed proves nothing: run the trial again, sooner. */
      bool again = reason[0] == '\0' && landing.miss[0] != '\0' && attempt < MAX_ATTEMPTS;
      if (reason[0] == '\0' && landing.problem[0] != '\0')
        snprintf(reason, sizeof reason, "%s", landing.problem);
      else if (reason[0] == '\0' && landing.miss[0] != '\0' && !again)
        snprintf(reason, sizeof reason, "the signal never landed in %d runs (last: %s)",
                 MAX_ATTEMPTS, landing.miss);
      const char *verdict = "ok";
      if (reason[0]) verdict = "FAIL: ";
      if (again) verdict = "MISS: ";
      printf("%s | exit=%d finals=%zu world=%d crc=%08x failed=%s %lldms %s%s%s%s%s\n", description,
             result.exit_code, result.finals, result.world, result.crc,
             result.failed ? "yes" : "no", (long long)result.took_ms, verdict, reason,
             again ? landing.miss : "", landing.note, reason[0] ? " (files in " : "");
      if (reason[0]) printf("    %s)\n", run.folder);
      fflush(stdout);
      failed |= reason[0] != '\0';
      if (!again) break;
      misses++;
      t.delay_ms /= 2;
    }
    if (failed && failures++ == 0) first_failure = index;
  }
  printf("fault loop: %d trial(s) failed, %d signal(s) missed and were sent again sooner\n",
         failures, misses);
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
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
