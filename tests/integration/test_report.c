/* Tests of the tools that read an events file after the job: `keel report` on a job restart
 * (user-level JIT) and on an in-process recovery followed by its resumed line, text and
 * --json, and `keel model --measured` taking o and r from the restart. The events files are
 * written here from docs/RUNTIME.md, so every figure is known to the nanosecond. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_job.h"
#include "test_support.h"

#define TOOL_TIMEOUT_MS 15000

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Two workers; uid 1 is killed at 2.000 s (its fault line; the launcher reaps it 1 ms
 * later). uid 0's collective fails at 2.002 s and its save of step 20 ends at 2.003 s; the
 * launcher restarts the job from 2.001 s and has both workers running again at 2.051 s; they
 * have restored step 20 by 2.091 s (the slower in 0.5 ms) and finish it at 2.101 s. */
static const char restart_events[] =
    "{\"event\":\"job_start\",\"t_ns\":1000000000,\"job_id\":\"77\",\"program\":\"/x/train\","
    "\"on_failure\":\"restart\",\"world\":2,\"spares\":0}\n"
    "{\"event\":\"fault\",\"uid\":1,\"rank\":1,\"epoch\":0,\"action\":\"kill\",\"point\":"
    "\"allreduce\",\"step\":20,\"t_ns\":2000000000}\n"
    "{\"event\":\"exit\",\"uid\":1,\"pid\":11,\"role\":\"worker\",\"rank\":1,\"signal\":"
    "\"SIGKILL\",\"status\":\"SIGKILL\",\"t_ns\":2001000000}\n"
    "{\"event\":\"restart_begin\",\"restart\":1,\"failed_uid\":1,\"reason\":\"SIGKILL\","
    "\"t_ns\":2001000000}\n"
    "{\"event\":\"jit_save\",\"uid\":0,\"rank\":0,\"epoch\":0,\"step\":20,\"bytes\":4096,"
    "\"save_ms\":0.75,\"status\":\"ok\",\"cause\":\"KEEL_EPROCFAILED\",\"t_failed_ns\":2002000000,"
    "\"t_ns\":2003000000}\n"
    "{\"event\":\"restart\",\"restart\":1,\"first_uid\":2,\"first_epoch\":1,\"world\":2,"
    "\"down_ms\":50.0,\"t_ns\":2051000000}\n"
    "{\"event\":\"jit_restore\",\"uid\":2,\"rank\":0,\"epoch\":1,\"restart\":1,\"status\":\"ok\","
    "\"step\":20,\"from_rank\":0,\"replica\":0,\"restore_ms\":0.5,\"t_ns\":2090000000}\n"
    "{\"event\":\"jit_restore\",\"uid\":3,\"rank\":1,\"epoch\":1,\"restart\":1,\"status\":\"ok\","
    "\"step\":20,\"from_rank\":0,\"replica\":0,\"restore_ms\":0.25,\"t_ns\":2091000000}\n"
    "{\"event\":\"resumed\",\"uid\":2,\"rank\":0,\"epoch\":1,\"step\":20,\"kind\":\"restart\","
    "\"t_ns\":2101000000}\n"
    "{\"event\":\"job_end\",\"t_ns\":3000000000,\"code\":0,\"seconds\":2.0}\n";

/* uid 1 exits at 2.000 s; a spare takes its rank by 2.010 s and the redone minibatch ends
 * at 2.030 s. Then a grow, which redoes nothing and has no resumed line. */
static const char inprocess_events[] =
    "{\"event\":\"job_start\",\"t_ns\":1000000000,\"job_id\":\"78\",\"program\":\"/x/train\","
    "\"on_failure\":\"replace\",\"world\":2,\"spares\":1}\n"
    "{\"event\":\"exit\",\"uid\":1,\"pid\":11,\"role\":\"worker\",\"rank\":1,\"signal\":"
    "\"SIGKILL\",\"status\":\"SIGKILL\",\"t_ns\":2000000000}\n"
    "{\"event\":\"recovery\",\"uid\":0,\"rank\":0,\"old_epoch\":0,\"new_epoch\":1,\"old_world\":2,"
    "\"new_world\":2,\"policy\":\"replace\",\"failed\":[1],\"replaced\":1,\"detect_ms\":1,"
    "\"revoke_ms\":1,\"agree_ms\":1,\"rebuild_ms\":1,\"state_transfer_ms\":2,\"redo_ms\":3,"
    "\"total_ms\":9,\"redo_minibatches\":1,\"t_ns\":2010000000}\n"
    "{\"event\":\"resumed\",\"uid\":0,\"rank\":0,\"epoch\":1,\"step\":20,\"kind\":\"in-process\","
    "\"t_ns\":2030000000}\n"
    "{\"event\":\"recovery\",\"uid\":0,\"rank\":0,\"old_epoch\":1,\"new_epoch\":2,\"old_world\":2,"
    "\"new_world\":3,\"policy\":\"replace\",\"failed\":[],\"replaced\":0,\"detect_ms\":0,"
    "\"revoke_ms\":0,\"agree_ms\":1,\"rebuild_ms\":1,\"state_transfer_ms\":2,\"redo_ms\":0,"
    "\"total_ms\":4,\"t_ns\":2500000000}\n";

/* A fresh folder with an events file, and the file the tools' output goes to. */
typedef struct report_files {
  char folder[300];
  char events[400];
  char output[400];
} report_files;

static void files_make(report_files *files, const char *events_text) {
  const char *folder = keel_test_tempdir("keel-report");
  assert_non_null(folder);
  snprintf(files->folder, sizeof files->folder, "%s", folder);
  snprintf(files->events, sizeof files->events, "%s/events.jsonl", folder);
  snprintf(files->output, sizeof files->output, "%s/output.txt", folder);
  FILE *file = fopen(files->events, "w");
  assert_non_null(file);
  assert_true(fputs(events_text, file) >= 0);
  assert_int_equal(fclose(file), 0);
}

static void files_remove(const report_files *files) {
  unlink(files->events);
  unlink(files->output);
  assert_int_equal(rmdir(files->folder), 0);
}

/* Runs "keel ARGS..." and returns what it printed (malloc'ed); fails unless it exits 0. */
static char *keel_output(const report_files *files, const char *const *args) {
  unlink(files->output);
  int code = keel_test_keel(args, files->output, TOOL_TIMEOUT_MS);
  char *output = keel_test_read_file(files->output, NULL);
  assert_non_null(output);
  if (code != 0) fail_msg("keel %s exited %d: %s", args[0], code, output);
  return output;
}

static void assert_has(const char *output, const char *const *texts) {
  for (size_t i = 0; texts[i] != NULL; i++)
    if (strstr(output, texts[i]) == NULL) fail_msg("expected '%s' in:\n%s", texts[i], output);
}

static void test_report_of_a_restart(void **state) {
  (void)state;
  report_files files;
  files_make(&files, restart_events);
  char *output = keel_output(&files, LIST("report", files.events));
  assert_has(output,
             LIST("recoveries: 0\nrestarts: 1\n",
                  "  +1.001 s  restart 1: uid 1 failed (SIGKILL), 2 workers started again as "
                  "uids 2-3\n",
                  "detect 2.0 ms, save 1.0 ms, restart 50.0 ms, restore 0.5 ms, start+restore "
                  "40.0 ms, redo 10.0 ms, total 101.0 ms\n",
                  "saves: 1 rank, 4096 bytes, newest step 20; restored step 20 on 2 ranks, "
                  "redo_minibatches 1\n",
                  "skipped lines (not a whole JSON event): 0"));
  free(output);
  output = keel_output(&files, LIST("report", "--json", files.events));
  assert_string_equal(
      output,
      "{\"restart\":1,\"t_ns\":2001000000,\"failed_uid\":1,\"reason\":\"SIGKILL\","
      "\"detect_ms\":2.000,\"save_ms\":1.000,\"restart_ms\":50.000,\"restore_ms\":0.500,"
      "\"start_restore_ms\":40.000,\"redo_ms\":10.000,\"total_ms\":101.000,"
      "\"restored_step\":20,\"newest_saved_step\":20,\"redo_minibatches\":1,"
      "\"started_over\":false,\"saved_ranks\":1,\"failed_saves\":0,\"restored_ranks\":2,"
      "\"save_bytes\":4096}\n");
  free(output);
  files_remove(&files);
}

static void test_report_of_inprocess_redo(void **state) {
  (void)state;
  report_files files;
  files_make(&files, inprocess_events);
  char *output = keel_output(&files, LIST("report", files.events));
  assert_has(output, LIST("failed uids [1], replaced 1\n",
                          "death to recovered: 10.0 ms\n"
                          "              redo_minibatches 1, death to resumed: 30.0 ms\n",
                          "(a grow), replaced 0\n", "redo 0.0 ms, total 4.0 ms\nrestarts: 0\n"));
  free(output);
  output = keel_output(&files, LIST("report", "--json", files.events));
  assert_has(output, LIST("\"redo_minibatches\":1,\"death_to_resumed_ms\":30.000,"
                          "\"death_to_recovered_ms\":10.000}\n",
                          "\"redo_minibatches\":null,\"death_to_resumed_ms\":null,"
                          "\"death_to_recovered_ms\":null}\n"));
  free(output);
  files_remove(&files);
}

/* o is the slowest save, 0.75 ms; r the death (2.000 s) to the last restore (2.091 s) less
 * it: 90.25 ms. */
static void test_model_measured_restart(void **state) {
  (void)state;
  report_files files;
  files_make(&files, restart_events);
  char *output = keel_output(&files, LIST("model", "--measured", files.events));
  assert_has(
      output,
      LIST("o     = 0.00075 s, checkpoint cost (measured)",
           "r     = 0.09025 s, restart cost (measured)", "o = 0.00075 s: mean just-in-time save",
           "a periodic checkpoint writes the same state", "r = 0.09025 s: mean over 1 job restart",
           "user-level JIT: redo_minibatches 1 per failure, mean over 1 restart",
           "periodic at c* (eqs. 3-6)", "user-level JIT (eq. 7)", "in-process JIT (eq. 8)"));
  free(output);
  output = keel_output(&files, LIST("model", "--measured", files.events, "--json"));
  assert_has(output, LIST("\"checkpoint_cost_s\":0.00075,\"restart_cost_s\":0.09025,",
                          "\"restarts\":1,\"saved_restarts\":1,\"jit_save_s\":0.00075,"
                          "\"costed_restarts\":1,\"jit_restart_cost_s\":0.09025,"
                          "\"redo_restarts\":1,\"restart_redo_minibatches\":1,"
                          "\"started_over\":0}"));
  free(output);
  files_remove(&files);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_report_of_a_restart),
      cmocka_unit_test(test_report_of_inprocess_redo),
      cmocka_unit_test(test_model_measured_restart),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
