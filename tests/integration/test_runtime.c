/* Integration tests of the runtime under the real launcher: step transactions with several
 * collectives, state sources (a replacement takes its shard from a survivor that holds it,
 * from a checkpoint tier when none does, or the job stops clearly when neither can), the
 * undo copy of a step that changes state between collectives, forward recovery, growth at a
 * step boundary without any failure machinery, and a store that does not grow with the
 * number of recoveries. Every bit-exact case is checked against a clean run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>

#include <cmocka.h>

#include "test_events.h"
#include "test_job.h"
#include "test_support.h"

#define JOB_TIMEOUT "60s"
#define JOB_TIMEOUT_MS 70000
#define TOY_STEPS "20"
#define TOY_STEP_COUNT 20
#define TOY_PARAMS "40000"
#define MAX_EVENTS 4096

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- jobs */

/* toy_train's arguments: the common ones, then up to 8 more (NULL-terminated). */
static void toy_arguments(const char *arguments[16], const char *const *extra) {
  static const char *const common[] = {"--steps", TOY_STEPS, "--params", TOY_PARAMS,
                                       "--compute-ms", "1"};
  size_t used = 0;
  for (size_t i = 0; i < sizeof common / sizeof common[0]; i++) arguments[used++] = common[i];
  for (size_t i = 0; extra != NULL && extra[i] != NULL && used < 15; i++) arguments[used++] = extra[i];
  arguments[used] = NULL;
}

/* Runs toy_train with flags, extra program arguments and a fault; returns keel's exit code. */
static int toy_job(keel_test_job *run, const char *const *flags, const char *const *extra,
                   const char *fault) {
  assert_true(keel_test_job_prepare(run, "keel-runtime"));
  const char *arguments[16];
  toy_arguments(arguments, extra);
  int code = keel_test_job_run(run, JOB_TIMEOUT, JOB_TIMEOUT_MS, flags,
                               keel_test_program("toy_train"), arguments, fault);
  if (code != 0) keel_test_print_file("job output", run->output);
  return code;
}

/* The crc of a clean 4-worker run, sharded or not (the arithmetic is the same): what every
 * exact recovery must reproduce. */
static unsigned clean_crc(void) {
  static bool known;
  static unsigned crc;
  if (!known) {
    keel_test_job run;
    assert_int_equal(toy_job(&run, LIST("-n", "4"), NULL, NULL), 0);
    crc = keel_test_toy_assert_consistent(run.output, 4, TOY_STEP_COUNT);
    known = true;
  }
  return crc;
}

/* The events of a finished job; the caller frees them. */
static keel_test_events job_events(const keel_test_job *run) {
  keel_test_events log;
  keel_test_events_read(run->events, MAX_EVENTS, &log);
  return log;
}

/* Every rule of a KEEL_FAULT text wrote its "fault" event: a rule that never fired would make
 * the case prove nothing. */
static void assert_rules_fired(const keel_test_events *log, const char *fault) {
  size_t rules = 1;
  for (const char *at = fault; *at; at++) rules += *at == ';';
  size_t fired = keel_test_events_count(log, "fault");
  if (fired != rules) fail_msg("%zu of the %zu rules of %s fired", fired, rules, fault);
}

/* The transfers of the last recovery line, as written ("[...]"), into text. */
static void last_transfers(const keel_test_events *log, char *text, size_t capacity) {
  text[0] = '\0';
  for (size_t i = log->count; i-- > 0;) {
    if (!keel_test_event_is(log->lines[i], "recovery")) continue;
    const char *transfers = keel_test_event_field(log->lines[i], "transfers");
    if (transfers == NULL) continue;
    const char *end = strchr(transfers, ']');
    size_t length = end ? (size_t)(end - transfers + 1) : strlen(transfers);
    snprintf(text, capacity, "%.*s", (int)(length < capacity ? length : capacity - 1), transfers);
    return;
  }
}

/* ---- state sources */

/* Rank 1 dies at the start of step 7: with two shards (ranks 0 and 2 hold shard 0, 1 and 3
 * shard 1) the spare (uid 4) must take shard 1, and only uid 3 holds it. With
 * KEEL_FINISH_CRC the spare says which committed step it received (step 6, the last before
 * the kill), and it alone: the survivors kept their own state. */
static void test_sharded_replace_from_the_holder(void **state) {
  (void)state;
  unsigned clean = clean_crc();
  keel_test_job run;
  const char *fault = "kill@rank=1,step=7,point=step";
  setenv("KEEL_FINISH_CRC", "1", 1);
  int code = toy_job(&run, LIST("-n", "4", "--spares", "1", "--on-failure", "replace"),
                     LIST("--shards", "2"), fault);
  unsetenv("KEEL_FINISH_CRC");
  assert_int_equal(code, 0);
  assert_int_equal(keel_test_toy_assert_consistent(run.output, 4, TOY_STEP_COUNT), clean);
  keel_test_events log = job_events(&run);
  assert_rules_fired(&log, fault);
  char transfers[512];
  last_transfers(&log, transfers, sizeof transfers);
  if (strcmp(transfers, "[{\"to\":4,\"from\":3,\"shard\":1}]") != 0)
    fail_msg("the replacement's shard came from the wrong place: %s (%s)", transfers, run.events);
  const char *received = keel_test_events_find(&log, "received_commit", 4);
  if (received == NULL || keel_test_events_count(&log, "received_commit") != 1 ||
      strstr(received, "\"step\":6") == NULL)
    fail_msg("the replacement should say once that it received step 6: %s (%s)",
             received ? received : "no received_commit event", run.events);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* The same, killed between the step's two collectives (after the allgather, before the
 * allreduce): the survivors are in the step's second collective; the step is redone. */
static void test_sharded_replace_between_collectives(void **state) {
  (void)state;
  unsigned clean = clean_crc();
  keel_test_job run;
  const char *fault = "kill@rank=1,step=7,point=forward";
  assert_int_equal(toy_job(&run, LIST("-n", "4", "--spares", "1", "--on-failure", "replace"),
                           LIST("--shards", "2"), fault),
                   0);
  assert_int_equal(keel_test_toy_assert_consistent(run.output, 4, TOY_STEP_COUNT), clean);
  keel_test_events log = job_events(&run);
  assert_rules_fired(&log, fault);
  const char *recovery = keel_test_events_find(&log, "recovery", -1);
  assert_non_null(recovery);
  assert_non_null(strstr(recovery, "\"restart_step\":true"));
  keel_test_events_free(&log);
}

/* Both holders of shard 1 die at once: no survivor has it, the persistent tier (a snapshot
 * at every commit) gives both replacements the exact step. */
static void test_lost_shard_comes_from_the_tier(void **state) {
  (void)state;
  unsigned clean = clean_crc();
  keel_test_job run;
  assert_true(keel_test_job_prepare(&run, "keel-runtime"));
  char persist[400];
  snprintf(persist, sizeof persist, "%s/persist", run.folder);
  const char *fault = "kill@rank=1,step=10,point=step;kill@rank=3,step=10,point=step";
  const char *arguments[16];
  toy_arguments(arguments, LIST("--shards", "2", "--persist-every", "1", "--persist-dir", persist));
  int code = keel_test_job_run(&run, JOB_TIMEOUT, JOB_TIMEOUT_MS,
                               LIST("-n", "4", "--spares", "2", "--on-failure", "replace"),
                               keel_test_program("toy_train"), arguments, fault);
  if (code != 0) keel_test_print_file("job output", run.output);
  assert_int_equal(code, 0);
  assert_int_equal(keel_test_toy_assert_consistent(run.output, 4, TOY_STEP_COUNT), clean);
  keel_test_events log = job_events(&run);
  assert_rules_fired(&log, fault);
  char transfers[512];
  last_transfers(&log, transfers, sizeof transfers);
  if (strstr(transfers, "{\"to\":4,\"from\":\"tier\",\"shard\":1}") == NULL ||
      strstr(transfers, "{\"to\":5,\"from\":\"tier\",\"shard\":1}") == NULL)
    fail_msg("both replacements should restore shard 1 from the tier: %s (%s)", transfers,
             run.events);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* The tier's directory is on a read-only file system: every save fails, and none fails a
 * step. The job ends with the bits of a clean run, every save's event names KEEL_EACCES,
 * and each process says once, not at every save, why it cannot write. */
static void test_read_only_tier_never_stops_training(void **state) {
  (void)state;
  unsigned clean = clean_crc();
  keel_test_job run;
  assert_true(keel_test_job_prepare(&run, "keel-runtime"));
  char mounted[420];
  snprintf(mounted, sizeof mounted, "%s/persist", run.folder);
  if (!keel_test_tmpfs_mount(__func__, mounted, MS_RDONLY, "size=64k")) skip();
  const char *arguments[16];
  toy_arguments(arguments, LIST("--persist-every", "2", "--persist-dir", mounted));
  int code = keel_test_job_run(&run, JOB_TIMEOUT, JOB_TIMEOUT_MS, LIST("-n", "4"),
                               keel_test_program("toy_train"), arguments, NULL);
  if (code != 0) keel_test_print_file("job output", run.output);
  assert_int_equal(code, 0);
  assert_int_equal(keel_test_toy_assert_consistent(run.output, 4, TOY_STEP_COUNT), clean);
  keel_test_events log = job_events(&run);
  size_t saves = 0;
  for (size_t i = 0; i < log.count; i++) {
    if (!keel_test_event_is(log.lines[i], "persist_save")) continue;
    saves++;
    if (strstr(log.lines[i], "\"status\":\"KEEL_EACCES\"") == NULL)
      fail_msg("a save on a read-only disk: %s", log.lines[i]);
  }
  keel_test_events_free(&log);
  /* Steps 2, 4, ..., 20 of each of the 4 ranks. */
  assert_int_equal(saves, 4 * TOY_STEP_COUNT / 2);
  char *output = keel_test_read_file(run.output, NULL);
  assert_non_null(output);
  size_t said = 0;
  for (const char *at = output; (at = strstr(at, "the persistent tier cannot write to")) != NULL;
       at++) {
    said++;
    if (strstr(at, "Read-only file system") == NULL) fail_msg("no reason given: %s", at);
  }
  free(output);
  assert_int_equal(said, 4);
}

/* The same loss without a tier: every process concludes that the job cannot go on (the same
 * verdict from the same decision), says why, and leaves; nothing hangs. */
static void test_lost_shard_without_a_tier_stops_clearly(void **state) {
  (void)state;
  keel_test_job run;
  const char *fault = "kill@rank=1,step=10,point=step;kill@rank=3,step=10,point=step";
  int code = toy_job(&run, LIST("-n", "4", "--spares", "2", "--on-failure", "replace"),
                     LIST("--shards", "2"), fault);
  assert_int_not_equal(code, 0);
  assert_int_not_equal(code, -1); /* it ended by itself */
  char *output = keel_test_read_file(run.output, NULL);
  assert_non_null(output);
  if (strstr(output, "no survivor holds shard 1") == NULL)
    fail_msg("no clear message about the lost shard in %s", run.output);
  free(output);
  keel_test_events log = job_events(&run);
  for (long uid = 0; uid < 6; uid++) {
    const char *exit_line = keel_test_events_find(&log, "exit", uid);
    if (exit_line == NULL) fail_msg("uid %ld has no exit event (%s)", uid, run.events);
    if (uid == 1 || uid == 3) continue;
    if (strstr(exit_line, "\"code\":1") == NULL)
      fail_msg("uid %ld should leave with 1: %s", uid, exit_line);
  }
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* ---- step transactions */

/* The registered state changes between the step's two collectives; rank 2 dies right after
 * its update. With the undo copy the redone step is exact; without it the update is applied
 * twice and the run differs (the negative control: the check can tell). */
typedef struct undo_case {
  const char *name;
  bool undo;
} undo_case;

static void test_undo_copy(void **state) {
  const undo_case *undo = *state;
  unsigned clean = clean_crc();
  keel_test_job run;
  const char *fault = "kill@rank=2,step=7,point=updated";
  int code = toy_job(&run, LIST("-n", "4", "--spares", "1", "--on-failure", "replace"),
                     undo->undo ? LIST("--second-allreduce", "--undo") : LIST("--second-allreduce"),
                     fault);
  assert_int_equal(code, 0);
  unsigned crc = keel_test_toy_assert_consistent(run.output, 4, TOY_STEP_COUNT);
  if (undo->undo && crc != clean) fail_msg("crc %08x with the undo copy, %08x clean", crc, clean);
  if (!undo->undo && crc == clean)
    fail_msg("without the undo copy the redone step should differ, yet crc %08x is clean", crc);
  keel_test_events log = job_events(&run);
  assert_rules_fired(&log, fault);
  keel_test_events_free(&log);
}

/* Shrink: every survivor is in the step's second collective with the same state, so only that
 * collective is redone in the new world (forward recovery), no step. */
static void test_forward_recovery_redoes_one_collective(void **state) {
  (void)state;
  keel_test_job run;
  const char *fault = "kill@rank=2,step=7,point=updated";
  assert_int_equal(toy_job(&run, LIST("-n", "4"), LIST("--second-allreduce"), fault), 0);
  keel_test_toy_assert_consistent(run.output, 3, TOY_STEP_COUNT);
  keel_test_events log = job_events(&run);
  assert_rules_fired(&log, fault);
  const char *recovery = keel_test_events_find(&log, "recovery", -1);
  if (recovery == NULL) fail_msg("no recovery line in %s", run.events);
  if (strstr(recovery, "\"restart_step\":false") == NULL)
    fail_msg("the survivors should have redone only the collective: %s", recovery);
  if (strtod(keel_test_event_field(recovery, "redo_ms"), NULL) <= 0)
    fail_msg("no redo time in %s", recovery);
  keel_test_events_free(&log);
}

/* Growth at a step boundary: a joiner enters; nothing failed, so no failure hooks run
 * (no `failure` event), nothing is fenced, and the growth is one recovery line of policy
 * grow with no one failed. */
/* The uids that the job's recovery lines name as failed, any line (at most capacity). */
static size_t recovered_uids(const keel_test_events *log, long *uids, size_t capacity) {
  size_t count = 0;
  for (size_t i = 0; i < log->count; i++) {
    if (!keel_test_event_is(log->lines[i], "recovery")) continue;
    const char *at = keel_test_event_field(log->lines[i], "failed");
    if (at == NULL || *at != '[') continue;
    for (at++; *at != ']' && *at != '\0' && count < capacity;) {
      char *end;
      long uid = strtol(at, &end, 10);
      if (end == at) break;
      uids[count++] = uid;
      at = *end == ',' ? end + 1 : end;
    }
  }
  return count;
}

static bool uid_listed(const long *uids, size_t count, long uid) {
  for (size_t i = 0; i < count; i++)
    if (uids[i] == uid) return true;
  return false;
}

/* Runs a 4-rank job with 2 spares under fault, in which first dies and then second, before
 * the new epoch's first collective: the recovery lines together must name both (a soak's
 * chaos counted kills with no recovery when they did not). */
static void recovery_lines_name_both(const char *fault, long first, long second) {
  unsigned clean = clean_crc();
  keel_test_job run;
  assert_int_equal(
      toy_job(&run, LIST("-n", "4", "--spares", "2", "--on-failure", "replace"), NULL, fault), 0);
  assert_int_equal(keel_test_toy_assert_consistent(run.output, 4, TOY_STEP_COUNT), clean);
  keel_test_events log = job_events(&run);
  assert_rules_fired(&log, fault);
  long uids[16];
  size_t count = recovered_uids(&log, uids, 16);
  if (!uid_listed(uids, count, first) || !uid_listed(uids, count, second))
    fail_msg("the recovery lines name %zu failed uids, not both %ld and %ld (%s)", count, first,
             second, run.events);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* uid 1 dies at step 5; uid 0, which writes the recovery's line (the first member that held
 * state), dies as its recovery settles: that line never comes. The next one is written by
 * the spare that took rank 1, which did not write the first. */
static void test_recovery_line_survives_its_writer(void **state) {
  (void)state;
  recovery_lines_name_both("kill@uid=1,step=5,point=step;kill@uid=0,point=recovered", 1, 0);
}

/* uid 0 dies at step 5 (a spare takes rank 0; uid 1 is to write the line); uid 2 dies as its
 * recovery settles, before any collective of the new epoch: no line comes, and the writer of
 * the next recovery is the spare that took rank 0, now the first member with state. */
static void test_recovery_line_survives_an_epoch_without_collective(void **state) {
  (void)state;
  recovery_lines_name_both("kill@uid=0,step=5,point=step;kill@uid=2,point=recovered", 0, 2);
}

static void test_growth_fires_no_failure_machinery(void **state) {
  (void)state;
  keel_test_job run;
  assert_int_equal(toy_job(&run, LIST("-n", "2", "--max-world", "3"),
                           LIST("--steps", "60", "--compute-ms", "3"), NULL),
                   0);
  keel_test_toy_assert_consistent(run.output, 3, 60);
  keel_test_events log = job_events(&run);
  const char *grew = keel_test_events_find(&log, "recovery", -1);
  if (grew == NULL || strstr(grew, "\"policy\":\"grow\"") == NULL ||
      strstr(grew, "\"failed\":[]") == NULL)
    fail_msg("no grow line: %s", run.events);
  if (keel_test_events_count(&log, "failure") != 0 || keel_test_events_count(&log, "fence") != 0)
    fail_msg("a growth ran failure hooks or fenced: %s", run.events);
  keel_test_events_free(&log);
}

/* A replace that finds no spare ready (none at the start, a 1 ms wait) shrinks the world to
 * 3; the spare the launcher starts for the dead rank then takes the world back to 4 at a step
 * boundary, and the job ends with 4 ranks that agree. */
static void test_replace_world_grows_back_with_a_late_spare(void **state) {
  (void)state;
  keel_test_job run;
  /* The spare (uid 4) is held a second before it says it is ready, so however slowly the
   * survivors see the loss (ASan), none is there when they decide. */
  const char *fault = "kill@rank=1,step=7,point=step;delay@uid=4,point=publish,ms=1000";
  setenv("KEEL_REPLACE_WAIT", "1ms", 1);
  int code = toy_job(
      &run, LIST("-n", "4", "--spares", "0", "--on-failure", "replace", "--max-restarts", "1"),
      LIST("--steps", "400", "--compute-ms", "5"), fault);
  unsetenv("KEEL_REPLACE_WAIT");
  assert_int_equal(code, 0);
  keel_test_toy_assert_consistent(run.output, 4, 400);
  keel_test_events log = job_events(&run);
  assert_rules_fired(&log, fault);
  const char *shrank = NULL, *grew = NULL;
  for (size_t i = 0; i < log.count; i++) {
    const char *line = log.lines[i];
    if (!keel_test_event_is(line, "recovery")) continue;
    if (shrank == NULL && strstr(line, "\"policy\":\"replace\"") != NULL &&
        keel_test_event_long(line, "new_world") == 3)
      shrank = line;
    if (shrank != NULL && strstr(line, "\"policy\":\"grow\"") != NULL &&
        keel_test_event_long(line, "new_world") == 4 && keel_test_event_long(line, "replaced") == 1)
      grew = line;
  }
  if (shrank == NULL || grew == NULL)
    fail_msg("no shrink to 3 then growth back to 4 with the spare: %s", run.events);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* ---- the store does not grow with the job's age */

/* Eight recoveries in one job: rank 2 dies, then each spare that takes its place dies a few
 * steps later. The store's key count after each recovery (the launcher's `store` events)
 * stays flat: finished epochs' agreement keys and dead processes' keys are collected. */
static void test_store_stays_flat_over_recoveries(void **state) {
  (void)state;
  keel_test_job run;
  const char *fault = "kill@uid=2,step=3;kill@uid=4,step=6;kill@uid=5,step=9;kill@uid=6,step=12;"
                      "kill@uid=7,step=15;kill@uid=8,step=18;kill@uid=9,step=21;"
                      "kill@uid=10,step=24";
  assert_int_equal(toy_job(&run,
                           LIST("-n", "4", "--spares", "1", "--on-failure", "replace",
                                "--max-restarts", "10"),
                           LIST("--steps", "30"), fault),
                   0);
  keel_test_toy_assert_consistent(run.output, 4, 30);
  keel_test_events log = job_events(&run);
  assert_rules_fired(&log, fault);
  long first = -1, last = -1, most = 0, censuses = 0;
  for (size_t i = 0; i < log.count; i++) {
    if (!keel_test_event_is(log.lines[i], "store")) continue;
    long keys = (long)keel_test_event_long(log.lines[i], "keys");
    if (first < 0) first = keys;
    last = keys;
    if (keys > most) most = keys;
    censuses++;
  }
  printf("store keys over %ld censuses: first %ld, last %ld, most %ld\n", censuses, first, last,
         most);
  if (censuses < 8) fail_msg("only %ld store censuses in %s", censuses, run.events);
  /* A recovery leaves the last epoch's votes and a few dead processes' keys until the next
   * one collects them: a handful, never one more per recovery. */
  if (most > first + 12) fail_msg("the store grew from %ld to %ld keys", first, most);
  keel_test_events_free(&log);
}

static undo_case undo_cases[] = {
    {"undo_copy_makes_a_mid_step_update_exact", true},
    {"without_the_undo_copy_the_redo_differs", false},
};

#define UNDO_CASES (sizeof undo_cases / sizeof undo_cases[0])

int main(void) {
  /* cmocka runs every element of the array it is given: it holds exactly the tests. */
  struct CMUnitTest tests[11 + UNDO_CASES];
  size_t count = 0;
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_sharded_replace_from_the_holder);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_sharded_replace_between_collectives);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_lost_shard_comes_from_the_tier);
  tests[count++] =
      (struct CMUnitTest)cmocka_unit_test(test_lost_shard_without_a_tier_stops_clearly);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test_teardown(
      test_read_only_tier_never_stops_training, keel_test_tmpfs_release);
  for (size_t i = 0; i < UNDO_CASES; i++)
    tests[count++] = (struct CMUnitTest){undo_cases[i].name, test_undo_copy, NULL, NULL,
                                         &undo_cases[i]};
  tests[count++] =
      (struct CMUnitTest)cmocka_unit_test(test_forward_recovery_redoes_one_collective);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_recovery_line_survives_its_writer);
  tests[count++] =
      (struct CMUnitTest)cmocka_unit_test(test_recovery_line_survives_an_epoch_without_collective);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_growth_fires_no_failure_machinery);
  tests[count++] =
      (struct CMUnitTest)cmocka_unit_test(test_replace_world_grows_back_with_a_late_spare);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_store_stays_flat_over_recoveries);
  /* KEEL_TEST_FILTER=test_recovery_* runs only the cases it names. */
  if (getenv("KEEL_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("KEEL_TEST_FILTER"));
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
