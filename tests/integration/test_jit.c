/* Integration tests of just-in-time checkpoints under the real launcher (toy_train): with
 * `--ckpt jit` the healthy ranks save when a collective fails, every process restarts and
 * resumes from the newest complete snapshot, for a failure at each phase of a minibatch,
 * during the save itself, twice in a row, with a corrupted snapshot, with a hang, with a
 * full disk, and with hybrid sharding, and the Fashion-MNIST example on real data; with
 * `--on-failure replace` (in-process JIT) nothing is saved. Every case ends bit-identical to a run without failure and redoes at most the
 * minibatch in which the failure happened, as the events file shows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_events.h"
#include "test_job.h"
#include "test_support.h"

#define JOB_TIMEOUT "90s"
#define JOB_TIMEOUT_MS 100000
/* The ring path (as in test_comm), so point=allreduce fires between chunk sends. */
#define TOY_PARAMS "100000"
#define TOY_STEPS "20"
#define TOY_STEP_COUNT 20
#define MAX_EVENTS 4096

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- running toy_train */

/* Runs toy_train with shards (NULL: unsharded) under `keel run FLAGS` in the prepared job
 * run; asserts exit 0 and a consistent final world of 4; returns the common crc. */
static unsigned toy_run(keel_test_job *run, const char *const *flags, const char *shards,
                        const char *fault) {
  const char *const *toy_args =
      shards ? LIST("--steps", TOY_STEPS, "--params", TOY_PARAMS, "--shards", shards)
             : LIST("--steps", TOY_STEPS, "--params", TOY_PARAMS);
  int code = keel_test_job_run(run, JOB_TIMEOUT, JOB_TIMEOUT_MS, flags,
                               keel_test_program("toy_train"), toy_args, fault);
  if (code != 0) {
    keel_test_print_file("job output", run->output);
    keel_test_print_file("events", run->events);
  }
  assert_int_equal(code, 0);
  return keel_test_toy_assert_consistent(run->output, 4, TOY_STEP_COUNT);
}

/* The crc of a clean, unsharded 4-worker run: what every case must reproduce. */
static unsigned baseline_crc(void) {
  static bool known;
  static unsigned crc;
  if (!known) {
    keel_test_job run;
    assert_true(keel_test_job_prepare(&run, "keel-jit"));
    crc = toy_run(&run, LIST("-n", "4"), NULL, NULL);
    known = true;
  }
  return crc;
}

/* `keel run` flags of a user-level JIT job whose checkpoints go to <job folder>/ckpt. */
typedef struct jit_flags {
  char directory[320];
  const char *list[16];
} jit_flags;

static const char *const *jit_flags_make(jit_flags *flags, const keel_test_job *run,
                                         const char *directory) {
  if (directory != NULL) snprintf(flags->directory, sizeof flags->directory, "%s", directory);
  else snprintf(flags->directory, sizeof flags->directory, "%s/ckpt", run->folder);
  const char *list[] = {"-n", "4", "--ckpt", "jit", "--ckpt-dir", flags->directory,
                        "--max-restarts", "3", "--heartbeat", "1s", "--collective-timeout",
                        "10s", NULL};
  memcpy(flags->list, list, sizeof list);
  return flags->list;
}

/* ---- what the events file must show */

/* Over the job's restarts: every restarted rank restored, and restored the newest step any
 * healthy rank saved in that round (so at most the minibatch in progress is redone); each
 * restart resumed, and completed that minibatch. Returns how many restarts there were. */
static size_t assert_restarts_redo_one(const keel_test_events *log) {
  long long newest_saved = -1, restarts = 0, restored = 0;
  for (size_t i = 0; i < log->count; i++) {
    const char *line = log->lines[i];
    if (keel_test_event_is(line, "jit_save")) {
      const char *status = keel_test_event_field(line, "status");
      long long step = keel_test_event_long(line, "step");
      if (status != NULL && strncmp(status, "\"ok\"", 4) == 0 && step > newest_saved)
        newest_saved = step;
    } else if (keel_test_event_is(line, "restart")) {
      restarts++;
    } else if (keel_test_event_is(line, "jit_restore")) {
      const char *status = keel_test_event_field(line, "status");
      if (status == NULL || strncmp(status, "\"ok\"", 4) != 0)
        fail_msg("a rank did not restore: %s", line);
      if (keel_test_event_long(line, "step") != newest_saved)
        fail_msg("restored step %lld, but step %lld was saved: %s",
                 keel_test_event_long(line, "step"), newest_saved, line);
      restored++;
    } else if (keel_test_event_is(line, "resumed")) {
      assert_int_equal(keel_test_event_long(line, "step"), newest_saved);
      newest_saved = -1; /* the next round's saves are its own */
    }
  }
  assert_int_equal(restored, 4 * restarts);
  assert_int_equal(keel_test_events_count(log, "resumed"), restarts);
  return (size_t)restarts;
}

/* Each rule of a KEEL_FAULT text writes one "fault" event as it fires. */
static void assert_every_rule_fired(const keel_test_events *log, const char *fault) {
  size_t rules = 1, fired = keel_test_events_count(log, "fault");
  for (const char *at = fault; *at; at++) rules += *at == ';';
  if (fired != rules) fail_msg("%zu of the %zu rules of %s fired", fired, rules, fault);
}

/* ---- cases: user-level JIT, a restart per failure */
typedef struct restart_case {
  const char *name;
  const char *fault;
  size_t restarts;
  const char *shards; /* NULL: unsharded */
  long refused_rank;  /* a rank whose snapshot must never be restored from; -1: none */
} restart_case;

static void test_restart_is_exact(void **state) {
  const restart_case *restart = *state;
  unsigned clean = baseline_crc();
  keel_test_job run;
  jit_flags flags;
  assert_true(keel_test_job_prepare(&run, "keel-jit"));
  const char *const *list = jit_flags_make(&flags, &run, NULL);
  unsigned crc = toy_run(&run, list, restart->shards, restart->fault);
  if (crc != clean) fail_msg("%s: crc %08x after restart, %08x clean", restart->fault, crc, clean);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  assert_every_rule_fired(&log, restart->fault);
  assert_int_equal(assert_restarts_redo_one(&log), restart->restarts);
  for (size_t i = 0; i < log.count; i++) {
    const char *line = log.lines[i];
    if (!keel_test_event_is(line, "jit_restore")) continue;
    long long from = keel_test_event_long(line, "from_rank");
    if (from == restart->refused_rank) fail_msg("restored from a refused snapshot: %s", line);
    /* Hybrid sharding: each shard comes from a replica of that shard. */
    long long shards = restart->shards ? atoll(restart->shards) : 1;
    if (from % shards != keel_test_event_long(line, "rank") % shards)
      fail_msg("a rank restored another shard: %s", line);
  }
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* A rank killed between writing its buffers and its manifest leaves a snapshot without a
 * manifest; the restore passes over it (test_restart_is_exact checks the outcome, this
 * checks the half-done snapshot really was there). */
static void test_half_saved_snapshot_is_there(void **state) {
  (void)state;
  keel_test_job run;
  jit_flags flags;
  assert_true(keel_test_job_prepare(&run, "keel-jit"));
  const char *const *list = jit_flags_make(&flags, &run, NULL);
  toy_run(&run, list, NULL, "kill@rank=2,step=7,point=forward;kill@rank=1,point=save");
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  char job_id[32];
  assert_true(keel_test_events_job_id(&log, job_id, sizeof job_id));
  /* Rank 1 saves the step it is in: 7, or 6 when rank 2 died after finishing step 6's
   * allreduce but before rank 1 did (step i or i+1, JIT §3.3). */
  const char *fault = keel_test_events_find(&log, "fault", 1);
  assert_non_null(fault);
  long long step = keel_test_event_long(fault, "step");
  assert_true(step == 6 || step == 7);
  char path[600];
  snprintf(path, sizeof path, "%s/%s/step-%lld/rank-1/buffer-0", flags.directory, job_id, step);
  if (access(path, F_OK) != 0) fail_msg("rank 1's data is not at %s", path);
  snprintf(path, sizeof path, "%s/%s/step-%lld/rank-1/manifest", flags.directory, job_id, step);
  if (access(path, F_OK) == 0) fail_msg("rank 1 was killed before its manifest, yet %s exists", path);
  keel_test_events_free(&log);
}

/* A full disk: every save fails with ENOSPC; the restarted job finds no snapshot, starts
 * over from the initial state (a warning, status "none") and still ends exact. Needs a
 * tmpfs mount (root); skipped with a message otherwise. */
static void test_full_disk_starts_over(void **state) {
  (void)state;
  keel_test_job run;
  jit_flags flags;
  assert_true(keel_test_job_prepare(&run, "keel-jit"));
  char directory[320];
  snprintf(directory, sizeof directory, "%s/small", run.folder);
  assert_int_equal(mkdir(directory, 0755), 0);
  if (mount("tmpfs", directory, "tmpfs", 0, "size=64k") != 0) {
    fprintf(stderr, "test_full_disk_starts_over: skipped, cannot mount a tmpfs here\n");
    skip();
  }
  const char *const *list = jit_flags_make(&flags, &run, directory);
  unsigned crc = toy_run(&run, list, NULL, "kill@rank=2,step=7,point=forward");
  umount2(directory, MNT_DETACH);
  assert_int_equal(crc, baseline_crc());
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  const char *save = keel_test_events_find(&log, "jit_save", -1);
  assert_non_null(save);
  assert_non_null(strstr(save, "\"status\":\"KEEL_ENOSPC\""));
  const char *restore = keel_test_events_find(&log, "jit_restore", -1);
  assert_non_null(restore);
  assert_non_null(strstr(restore, "\"status\":\"none\""));
  keel_test_events_free(&log);
}

/* ---- in-process JIT: healthy workers stay, spares take the failed ranks' places */
static void test_in_process_two_failures(void **state) {
  (void)state;
  unsigned clean = baseline_crc();
  keel_test_job run;
  jit_flags flags;
  assert_true(keel_test_job_prepare(&run, "keel-jit"));
  jit_flags_make(&flags, &run, NULL);
  const char *fault = "kill@rank=2,step=5,point=forward;kill@rank=1,step=12,point=optimizer";
  unsigned crc = toy_run(&run,
                         LIST("-n", "4", "--spares", "2", "--ckpt", "jit", "--ckpt-dir",
                              flags.directory, "--on-failure", "replace", "--heartbeat", "1s",
                              "--collective-timeout", "10s"),
                         NULL, fault);
  assert_int_equal(crc, clean);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  assert_every_rule_fired(&log, fault);
  assert_int_equal(keel_test_events_count(&log, "jit_save"), 0);
  assert_int_equal(keel_test_events_count(&log, "restart"), 0);
  size_t recoveries = 0;
  for (size_t i = 0; i < log.count; i++) {
    if (!keel_test_event_is(log.lines[i], "recovery")) continue;
    recoveries++;
    long long redo = keel_test_event_long(log.lines[i], "redo_minibatches");
    if (redo < 0 || redo > 1) fail_msg("more than one minibatch redone: %s", log.lines[i]);
  }
  assert_int_equal(recoveries, 2);
  assert_int_equal(keel_test_events_count(&log, "resumed"), 2);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* ---- the real example: Fashion-MNIST, a restart at the optimizer step */

/* Runs fashion_mnist (200 steps) under `keel run FLAGS` with fault; returns its result line
 * ("test-accuracy A params-crc32c C") in line. */
static void fashion_run(keel_test_job *run, const char *const *flags, const char *fault,
                        char *line, size_t capacity) {
  char program[512]; /* keel_test_bin's storage is reused when the job finds keel */
  snprintf(program, sizeof program, "%s", keel_test_bin("fashion_mnist"));
  int code = keel_test_job_run(run, JOB_TIMEOUT, JOB_TIMEOUT_MS, flags, program,
                               LIST("--steps", "200", "--quiet"), fault);
  if (code != 0) keel_test_print_file("job output", run->output);
  assert_int_equal(code, 0);
  if (!keel_test_last_line_with(run->output, "test-accuracy", line, capacity))
    fail_msg("no result line in %s", run->output);
}

static void test_fashion_mnist_restart_is_exact(void **state) {
  (void)state;
  keel_test_job clean_run, failed_run;
  char clean[128], failed[128];
  assert_true(keel_test_job_prepare(&clean_run, "keel-jit"));
  fashion_run(&clean_run, LIST("-n", "4"), NULL, clean, sizeof clean);
  assert_true(keel_test_job_prepare(&failed_run, "keel-jit"));
  jit_flags flags;
  fashion_run(&failed_run, jit_flags_make(&flags, &failed_run, NULL),
              "kill@rank=1,step=120,point=optimizer", failed, sizeof failed);
  if (strcmp(clean, failed) != 0) fail_msg("clean run: %s\nafter a restart: %s", clean, failed);
  keel_test_events log;
  keel_test_events_read(failed_run.events, MAX_EVENTS, &log);
  assert_int_equal(assert_restarts_redo_one(&log), 1);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* ---- the table of cases */
static restart_case restarts[] = {
    {"jit_kill_at_forward", "kill@rank=2,step=7,point=forward", 1, NULL, -1},
    {"jit_kill_in_allreduce", "kill@rank=2,step=7,point=allreduce,after=2", 1, NULL, -1},
    /* Survivors may be a step apart: the newest snapshot (step i+1) is the one to take. */
    {"jit_kill_at_optimizer", "kill@rank=2,step=7,point=optimizer", 1, NULL, -1},
    /* Rank 1 dies in its own save, after its buffers and before its manifest. */
    {"jit_kill_during_save", "kill@rank=2,step=7,point=forward;kill@rank=1,point=save", 1, NULL,
     1},
    /* Rank 0's snapshot is damaged after it is saved: its checksum refuses it. */
    {"jit_corrupt_snapshot_refused", "kill@rank=2,step=7,point=forward;corrupt@rank=0,point=saved",
     1, NULL, 0},
    /* uid 5 is rank 1 of the first restart (uids 4-7). */
    {"jit_two_failures_in_a_row",
     "kill@rank=2,step=5,point=forward;kill@rank=5,step=12,point=allreduce,after=2", 2, NULL, -1},
    /* A stopped rank: its lease lapses, the launcher fences it, the others time out or see
     * it die. */
    {"jit_hang_is_fenced", "stop@rank=2,step=7,point=forward", 1, NULL, -1},
    /* Hybrid sharding, 2 shards x 2 replica groups: one rank, then a whole group. */
    {"jit_sharded_kill", "kill@rank=3,step=7,point=forward", 1, "2", -1},
    /* Killed at the step's start: the others fail inside the step's allgather of shards
     * (over shared memory when on one host). */
    {"jit_sharded_kill_in_allgather", "kill@rank=3,step=7,point=step", 1, "2", -1},
    /* The whole replica group {2, 3}: rank 3 dies in its own save, so neither leaves a
     * snapshot (two kills at one point race: over TCP rank 3 may fail in the step's
     * allgather first and never reach the point). */
    {"jit_sharded_group_lost", "kill@rank=2,step=7,point=forward;kill@rank=3,point=save", 1, "2",
     3},
};

#define CASE_COUNT(table) (sizeof table / sizeof table[0])

static struct CMUnitTest case_test(const char *name, CMUnitTestFunction function, void *state) {
  struct CMUnitTest test = {name, function, NULL, NULL, state};
  return test;
}

int main(void) {
  struct CMUnitTest tests[CASE_COUNT(restarts) + 4];
  size_t count = 0;
  for (size_t i = 0; i < CASE_COUNT(restarts); i++)
    tests[count++] = case_test(restarts[i].name, test_restart_is_exact, &restarts[i]);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_half_saved_snapshot_is_there);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_full_disk_starts_over);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_in_process_two_failures);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_fashion_mnist_restart_is_exact);
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
