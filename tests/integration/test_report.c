/* Tests of the tools that read an events file after the job: `keel report` on a job restart
 * (user-level JIT) and on an in-process recovery followed by its resumed line, text and
 * --json; `keel report --svg`, its drawing checked as XML, and its errors; `keel model
 * --measured` taking o and r from the restart; `keel model placement`; and `keel model
 * wasted` on a --ckpt mem run, and its refusals. The events files are written here from
 * docs/RUNTIME.md, so every figure is known to the nanosecond. */
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

/* Two nodes of agents with two workers each. uid 3 is fenced at 2.000 s and reaped at 2.001 s;
 * the survivors detected it at 2.003 s after 2 ms in the failed collective, took 3 + 1 + 4 ms
 * to agree, rebuild and move state, and redid the step until 2.020 s. The program's name
 * and the fence's reason hold XML's special characters. */
static const char nodes_events[] =
    "{\"event\":\"job_start\",\"t_ns\":1000000000,\"job_id\":\"79\",\"program\":"
    "\"/x/<train>&\\\"q\\\"\",\"on_failure\":\"shrink\",\"failure_domain\":\"node\","
    "\"world\":4,\"spares\":0}\n"
    "{\"event\":\"agent_spawn\",\"t_ns\":1001000000,\"node\":0,\"pid\":100}\n"
    "{\"event\":\"agent_spawn\",\"t_ns\":1001000000,\"node\":1,\"pid\":101}\n"
    "{\"event\":\"spawn\",\"t_ns\":1002000000,\"uid\":0,\"pid\":10,\"role\":\"worker\","
    "\"node\":0}\n"
    "{\"event\":\"spawn\",\"t_ns\":1002000000,\"uid\":1,\"pid\":11,\"role\":\"worker\","
    "\"node\":0}\n"
    "{\"event\":\"spawn\",\"t_ns\":1002000000,\"uid\":2,\"pid\":12,\"role\":\"worker\","
    "\"node\":1}\n"
    "{\"event\":\"spawn\",\"t_ns\":1002000000,\"uid\":3,\"pid\":13,\"role\":\"worker\","
    "\"node\":1}\n"
    "{\"event\":\"progress\",\"uid\":0,\"rank\":0,\"epoch\":0,\"step\":1,\"t_ns\":1500000000}\n"
    "{\"event\":\"progress\",\"uid\":1,\"rank\":1,\"epoch\":0,\"step\":1,\"t_ns\":1500000000}\n"
    "{\"event\":\"progress\",\"uid\":2,\"rank\":2,\"epoch\":0,\"step\":1,\"t_ns\":1500000000}\n"
    "{\"event\":\"progress\",\"uid\":3,\"rank\":3,\"epoch\":0,\"step\":1,\"t_ns\":1500000000}\n"
    "{\"event\":\"fence\",\"t_ns\":2000000000,\"uid\":3,\"pid\":13,\"reason\":"
    "\"suspected: <link> & more\"}\n"
    "{\"event\":\"exit\",\"t_ns\":2001000000,\"uid\":3,\"pid\":13,\"role\":\"worker\","
    "\"rank\":3,\"signal\":\"SIGKILL\",\"status\":\"SIGKILL\",\"fenced\":true}\n"
    "{\"event\":\"recovery\",\"uid\":0,\"rank\":0,\"epoch\":1,\"old_epoch\":0,\"new_epoch\":1,"
    "\"old_world\":4,\"new_world\":3,\"policy\":\"shrink\",\"failed\":[3],\"replaced\":0,"
    "\"detect_ms\":2,\"revoke_ms\":0,\"agree_ms\":3,\"rebuild_ms\":1,\"state_transfer_ms\":4,"
    "\"redo_ms\":0,\"total_ms\":8,\"t_detect_ns\":2003000000,\"t_ns\":2020000000}\n"
    "{\"event\":\"resumed\",\"uid\":0,\"rank\":0,\"epoch\":1,\"step\":2,\"kind\":"
    "\"in-process\",\"t_ns\":2030000000}\n"
    "{\"event\":\"progress\",\"uid\":0,\"rank\":0,\"epoch\":1,\"step\":2,\"t_ns\":2100000000}\n"
    "{\"event\":\"progress\",\"uid\":1,\"rank\":1,\"epoch\":1,\"step\":2,\"t_ns\":2100000000}\n"
    "{\"event\":\"progress\",\"uid\":2,\"rank\":2,\"epoch\":1,\"step\":2,\"t_ns\":2100000000}\n"
    "{\"event\":\"exit\",\"t_ns\":2900000000,\"uid\":0,\"pid\":10,\"role\":\"worker\","
    "\"rank\":0,\"code\":0}\n"
    "{\"event\":\"exit\",\"t_ns\":2900000000,\"uid\":1,\"pid\":11,\"role\":\"worker\","
    "\"rank\":1,\"code\":0}\n"
    "{\"event\":\"exit\",\"t_ns\":2900000000,\"uid\":2,\"pid\":12,\"role\":\"worker\","
    "\"rank\":2,\"code\":0}\n"
    "{\"event\":\"job_end\",\"t_ns\":3000000000,\"code\":0,\"seconds\":2.0}\n";

/* A fresh folder with an events file, the file the tools' output goes to and where --svg
 * draws. */
typedef struct report_files {
  char folder[300];
  char events[400];
  char output[400];
  char svg[400];
} report_files;

static void files_make(report_files *files, const char *events_text) {
  const char *folder = keel_test_tempdir("keel-report");
  assert_non_null(folder);
  snprintf(files->folder, sizeof files->folder, "%s", folder);
  snprintf(files->events, sizeof files->events, "%s/events.jsonl", folder);
  snprintf(files->output, sizeof files->output, "%s/output.txt", folder);
  snprintf(files->svg, sizeof files->svg, "%s/timeline.svg", folder);
  FILE *file = fopen(files->events, "w");
  assert_non_null(file);
  assert_true(fputs(events_text, file) >= 0);
  assert_int_equal(fclose(file), 0);
}

static void files_remove(const report_files *files) {
  unlink(files->events);
  unlink(files->output);
  unlink(files->svg);
  assert_int_equal(rmdir(files->folder), 0);
}

/* Runs "keel ARGS..." and returns what it printed (malloc'ed) and its exit code. */
static char *keel_run(const report_files *files, const char *const *args, int *code_p) {
  unlink(files->output);
  *code_p = keel_test_keel(args, files->output, TOOL_TIMEOUT_MS);
  char *output = keel_test_read_file(files->output, NULL);
  assert_non_null(output);
  return output;
}

/* The same, failing unless it exits 0. */
static char *keel_output(const report_files *files, const char *const *args) {
  int code;
  char *output = keel_run(files, args, &code);
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

/* A time that is no monotonic time (negative, down to INT64_MIN) is a bad line: skipped and
 * counted, never subtracted from the job's start (an overflow under UBSan). */
static void test_report_skips_negative_times(void **state) {
  (void)state;
  report_files files;
  files_make(&files,
             "{\"event\":\"job_start\",\"t_ns\":1000000000,\"job_id\":\"77\"}\n"
             "{\"event\":\"fence\",\"uid\":1,\"t_ns\":-9223372036854775808}\n"
             "{\"event\":\"exit\",\"uid\":1,\"t_ns\":-1}\n"
             "{\"event\":\"job_end\",\"code\":0,\"t_ns\":3000000000}\n");
  char *output = keel_output(&files, LIST("report", files.events));
  assert_has(output, LIST("skipped lines (not a whole JSON event): 2"));
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

/* keel model placement: the groups, the exact odds beside Corollary 1 and Monte Carlo, JSON,
 * and refused flags (src/model/placement.c has the model's own tests). */
static void test_model_placement_command(void **state) {
  (void)state;
  report_files files;
  files_make(&files, restart_events);
  char *output = keel_output(
      &files, LIST("model", "placement", "--nodes", "16", "--replicas", "2", "--failed", "2",
                   "--trials", "2000"));
  assert_has(output, LIST("placement: 16 nodes, 2 replicas: group\n", "  group 7: nodes 14-15\n",
                          "  exact         93.3333%\n", "  Corollary 1   93.3333%\n",
                          "(2000 draws, one standard error)"));
  free(output);
  output = keel_output(&files, LIST("model", "placement", "--nodes", "5", "--replicas", "2",
                                    "--failed", "2", "--trials", "0", "--json"));
  assert_has(output, LIST("{\"nodes\":5,\"replicas\":2,\"strategy\":\"mixed\",\"groups\":2,"
                          "\"failed\":2,\"recover_exact\":0.6}\n"));
  free(output);
  const char *const *refused[] = {
      LIST("model", "placement", "--nodes", "3", "--replicas", "4", "--failed", "1"),
      LIST("model", "placement", "--nodes", "8", "--replicas", "2", "--failed", "9"),
      LIST("model", "placement", "--nodes", "8", "--replicas", "2"),
      LIST("model", "placement", "--nodes", "eight", "--replicas", "2", "--failed", "1")};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    int code = 0;
    output = keel_run(&files, refused[i], &code);
    assert_int_equal(code, 2);
    assert_has(output, LIST("keel model placement: "));
    free(output);
  }
  files_remove(&files);
}

/* keel model wasted on a --ckpt mem run: m = 0.25 s (uid 0, steps 1 -> 3 in 0.5 s), a
 * snapshot every step (49 steps over 49 saves), 1 MiB of state, restored from memory in
 * 4 ms; the service wrote 100 MiB in 1 s. Memory: lost 125 ms mean, 500 ms worst, totals
 * 129 and 504 ms. Disk every 30 min: retrieval 1 MiB at 100 MiB/s = 10 ms, totals 900.01 s
 * and 1800.01 s: 6977x and 3571x. */
static const char memory_events[] =
    "{\"event\":\"job_start\",\"t_ns\":1000000000,\"job_id\":\"80\",\"ckpt\":\"mem\","
    "\"world\":2,\"spares\":1}\n"
    "{\"event\":\"progress\",\"uid\":0,\"rank\":0,\"epoch\":0,\"step\":1,\"t_ns\":1000000000}\n"
    "{\"event\":\"mem_save\",\"uid\":0,\"rank\":0,\"epoch\":0,\"step\":1,\"bytes\":1048576,"
    "\"save_ms\":2.0,\"wait_ms\":0.0,\"saves\":1,\"mean_save_ms\":2.0,\"mean_wait_ms\":0.0,"
    "\"t_ns\":1001000000}\n"
    "{\"event\":\"progress\",\"uid\":0,\"rank\":0,\"epoch\":0,\"step\":3,\"t_ns\":1500000000}\n"
    "{\"event\":\"mem_save\",\"uid\":0,\"rank\":0,\"epoch\":0,\"step\":50,\"bytes\":1048576,"
    "\"save_ms\":2.0,\"wait_ms\":0.0,\"saves\":50,\"mean_save_ms\":2.0,\"mean_wait_ms\":0.0,"
    "\"t_ns\":2001000000}\n"
    "{\"event\":\"mem_restore\",\"uid\":2,\"rank\":1,\"epoch\":1,\"step\":50,\"shard\":1,"
    "\"from\":\"local\",\"bytes\":1048576,\"restore_ms\":4.000,\"t_ns\":2100000000}\n"
    "{\"event\":\"job_end\",\"t_ns\":3000000000,\"code\":0,\"seconds\":2.0}\n"
    "{\"event\":\"mem_service_end\",\"t_ns\":3000000001,\"sent\":0,\"received\":0,"
    "\"persisted\":100,\"persisted_bytes\":104857600,\"persist_ms\":1000.000}\n";

static void test_model_wasted_command(void **state) {
  (void)state;
  report_files files;
  files_make(&files, memory_events);
  char *output = keel_output(&files, LIST("model", "wasted", "--measured", files.events));
  assert_has(output,
             LIST("  iteration m = 250 ms (measured, 2 steps)\n",
                  "  in-memory snapshot every E = 1 iteration (measured, 2 mem_save lines)\n",
                  "  disk checkpoint every T = 30.0 min (default)\n",
                  "in memory (every 250 ms): lost work 125 ms mean, 500 ms worst; retrieval 4 ms "
                  "(measured, 1 restore); total 129 ms mean, 504 ms worst\n",
                  "disk (every 30.0 min): lost work 15.0 min mean, 30.0 min worst; retrieval 10 ms "
                  "(1.0 MiB at 100.0 MiB/s; size measured, 2 mem_save lines; speed from the write "
                  "speed, 1 node); total 15.0 min mean, 30.0 min worst\n",
                  "disk / memory: 6977x the wasted time per failure on average, 3571x at worst\n"));
  free(output);
  output = keel_output(&files, LIST("model", "wasted", "--measured", files.events, "--json"));
  assert_has(output,
             LIST("\"mem_saves\":2,\"mem_state_bytes\":1048576,\"mem_save_s\":0.002,"
                  "\"mem_wait_s\":0,\"mem_every_steps\":1,\"memory_restores\":1,"
                  "\"memory_restore_s\":0.004,\"memory_restore_bytes\":1048576,\"disk_restores\":0,"
                  "\"disk_restore_s\":null,"
                  "\"disk_read_bytes_per_s\":null,\"mem_services\":1,"
                  "\"persisted_bytes\":104857600,\"persist_s\":1}",
                  "\"sources\":{\"iteration_s\":\"measured\",\"every_steps\":\"measured\","
                  "\"state_bytes\":\"measured\",\"memory_retrieval_s\":\"measured\","
                  "\"disk_interval_s\":\"default\",\"disk_read_bytes_per_s\":\"write speed\"}",
                  "\"memory\":{\"interval_s\":0.25,\"lost_mean_s\":0.125,\"lost_worst_s\":0.5,"
                  "\"retrieval_s\":0.004,\"total_mean_s\":0.129,\"total_worst_s\":0.504}",
                  "\"disk\":{\"interval_s\":1800,\"lost_mean_s\":900,\"lost_worst_s\":1800,"
                  "\"retrieval_s\":0.01,\"total_mean_s\":900.01,\"total_worst_s\":1800.01}"));
  free(output);
  /* Flags override what the file measured. */
  output = keel_output(&files, LIST("model", "wasted", "--measured", files.events, "--every", "4",
                                    "--disk-interval", "1h", "--disk-read-speed", "1GiB/s"));
  assert_has(output,
             LIST("every E = 4 iterations (given)\n", "every T = 60.0 min (given)\n",
                  "in memory (every 1 s): lost work 500 ms mean, 2 s worst;",
                  "retrieval 0.977 ms (1.0 MiB at 1.0 GiB/s; size measured, 2 mem_save lines; "
                  "speed given)"));
  free(output);
  files_remove(&files);
}

/* Refused: bad flags exit 2; a file that cannot be read, or lacks an input no flag gave,
 * exits 1 saying what is missing and which flag gives it. */
static void test_model_wasted_refusals(void **state) {
  (void)state;
  report_files files;
  files_make(&files, restart_events);
  const char *const *refused[] = {
      LIST("model", "wasted"),
      LIST("model", "wasted", "--measured", files.events, "--every", "0"),
      LIST("model", "wasted", "--measured", files.events, "--disk-interval", "0s"),
      LIST("model", "wasted", "--measured", files.events, "--disk-read-speed", "fast"),
      LIST("model", "wasted", "--measured", files.events, "--iteration"),
      LIST("model", "wasted", "--measured", files.events, "--sweep", "4")};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    int code = 0;
    char *output = keel_run(&files, refused[i], &code);
    assert_int_equal(code, 2);
    assert_has(output, LIST("keel model wasted: ", "(try keel model wasted --help)"));
    free(output);
  }
  char missing_file[450];
  snprintf(missing_file, sizeof missing_file, "%s/no-such-events.jsonl", files.folder);
  int code = 0;
  char *output = keel_run(&files, LIST("model", "wasted", "--measured", missing_file), &code);
  assert_int_equal(code, 1);
  assert_has(output, LIST("keel model wasted: cannot read"));
  free(output);
  /* A run without --ckpt mem (and here without progress lines): every input is missing. */
  output = keel_run(&files, LIST("model", "wasted", "--measured", files.events), &code);
  assert_int_equal(code, 1);
  assert_has(output, LIST("lacks the iteration time", "--iteration gives it",
                          "lacks the state's size", "--state-bytes gives it",
                          "--memory-restore gives it", "--disk-read-speed gives it"));
  free(output);
  /* Given by flags, the same file models. */
  output = keel_output(&files, LIST("model", "wasted", "--measured", files.events, "--iteration",
                                    "100ms", "--state-bytes", "1MiB", "--memory-restore", "1ms",
                                    "--disk-read-speed", "1MiB"));
  assert_has(output, LIST("retrieval 1 ms (given)",
                          "retrieval 1 s (1.0 MiB at 1.0 MiB/s; size "
                          "given; speed given)"));
  free(output);
  files_remove(&files);
}

/* ---- keel report --svg */

/* A small XML well-formedness check, since no XML library is a build dependency (xmllint
 * checks the file again where it is installed): one root element, tags that close in the
 * order they opened, quoted attribute values, and '&' only as one of the five entities or a
 * character reference. */
static const char *xml_reference_end(const char *at) {
  static const char *const entities[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
  for (size_t i = 0; i < sizeof entities / sizeof entities[0]; i++)
    if (strncmp(at, entities[i], strlen(entities[i])) == 0) return at + strlen(entities[i]);
  if (at[1] != '#') return NULL;
  const char *digits = at + 2 + (at[2] == 'x');
  size_t count = strspn(digits, "0123456789abcdefABCDEF");
  return count > 0 && digits[count] == ';' ? digits + count + 1 : NULL;
}

static size_t xml_name_length(const char *at) {
  return strspn(at, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:-.");
}

/* Character data up to stop or the next '<'; NULL at an '&' that starts no reference. */
static const char *xml_text_end(const char *at, char stop) {
  while (*at != '\0' && *at != stop && *at != '<') {
    at = *at == '&' ? xml_reference_end(at) : at + 1;
    if (at == NULL) return NULL;
  }
  return at;
}

/* The start tag at at ('<'); returns past it, or NULL when it is malformed. */
static const char *xml_start_tag(const char *at, size_t *name_length_p, bool *empty_p) {
  *name_length_p = xml_name_length(at + 1);
  if (*name_length_p == 0) return NULL;
  at += 1 + *name_length_p;
  for (;;) {
    size_t space = strspn(at, " \t\r\n");
    at += space;
    *empty_p = at[0] == '/' && at[1] == '>';
    if (*at == '>' || *empty_p) return at + 1 + *empty_p;
    size_t name = xml_name_length(at);
    char quote = at[name + 1];
    if (space == 0 || name == 0 || at[name] != '=' || (quote != '"' && quote != '\'')) return NULL;
    at = xml_text_end(at + name + 2, quote);
    if (at == NULL || *at != quote) return NULL;
    at++;
  }
}

static void assert_xml_well_formed(const char *text) {
  const char *open[64];
  size_t open_lengths[64], depth = 0, roots = 0;
  const char *at = text;
  if (strncmp(at, "<?xml", 5) == 0) at = strstr(at, "?>") + 2;
  while (*at != '\0') {
    const char *from = at;
    if (*at != '<') {
      at = xml_text_end(at, '\0');
      if (at == NULL) fail_msg("an '&' that is no reference after offset %td", from - text);
      if (depth == 0 && strspn(from, " \t\r\n") < (size_t)(at - from))
        fail_msg("text outside the root element at offset %td", from - text);
    } else if (strncmp(at, "<!--", 4) == 0) {
      at = strstr(at, "-->");
      if (at == NULL) fail_msg("a comment that does not end");
      at += 3;
    } else if (at[1] == '/') {
      size_t length = xml_name_length(at + 2);
      if (depth == 0 || length != open_lengths[depth - 1] ||
          memcmp(at + 2, open[depth - 1], length) != 0 || at[2 + length] != '>')
        fail_msg("a closing tag that closes no open element at offset %td", at - text);
      at += 3 + length;
      depth--;
    } else {
      size_t length;
      bool empty;
      at = xml_start_tag(at, &length, &empty);
      if (at == NULL) fail_msg("a malformed start tag at offset %td", from - text);
      roots += depth == 0;
      if (!empty) {
        assert_true(depth < 64);
        open[depth] = from + 1;
        open_lengths[depth++] = length;
      }
    }
  }
  assert_int_equal(depth, 0);
  assert_int_equal(roots, 1);
}

static size_t count_of(const char *text, const char *needle) {
  size_t count = 0;
  for (const char *at = strstr(text, needle); at != NULL; at = strstr(at + 1, needle)) count++;
  return count;
}

/* The ticks of the lanes: a move in the path of each "ticks" path but the legend's. */
static size_t ticks_count(const char *svg) {
  size_t count = 0;
  for (const char *at = strstr(svg, "<path class=\"ticks\" d=\""); at != NULL;
       at = strstr(at + 1, "<path class=\"ticks\" d=\"")) {
    const char *path = at + strlen("<path class=\"ticks\" d=\"");
    for (const char *end = strchr(path, '"'); path < end; path++) count += *path == 'M';
  }
  return count - 1;
}

/* The drawing at path, checked as XML (and by xmllint where installed); malloc'ed, its
 * length in *length_p when not NULL. */
static char *svg_read_checked(const char *path, size_t *length_p) {
  char *svg = keel_test_read_file(path, length_p);
  assert_non_null(svg);
  assert_xml_well_formed(svg);
  if (access("/usr/bin/xmllint", X_OK) == 0) {
    char *argv[] = {"/usr/bin/xmllint", "--noout", (char *)path, NULL};
    assert_int_equal(keel_test_run(argv, NULL, NULL, TOOL_TIMEOUT_MS), 0);
  }
  return svg;
}

/* The text between the first from and the to after it (malloc'ed); fails if either is missing. */
static char *svg_part(const char *svg, const char *from, const char *to) {
  const char *begin = strstr(svg, from);
  if (begin == NULL) fail_msg("no '%s' in the drawing", from);
  const char *end = strstr(begin, to);
  if (end == NULL) fail_msg("no '%s' after '%s' in the drawing", to, from);
  char *part = strndup(begin, (size_t)(end - begin));
  assert_non_null(part);
  return part;
}

static void test_report_svg_of_two_nodes(void **state) {
  (void)state;
  report_files files;
  files_make(&files, nodes_events);
  free(keel_output(&files, LIST("report", "--svg", files.svg, files.events)));
  char *svg = svg_read_checked(files.svg, NULL);
  assert_has(svg, LIST("<svg xmlns=\"http://www.w3.org/2000/svg\"",
                       "keel job 79: world 4, on failure shrink", ">node 0<", ">node 1<",
                       "&lt;train&gt;&amp;&quot;q&quot;", "suspected: &lt;link&gt; &amp; more",
                       "class=\"death\"", "class=\"fence\"", "class=\"resumed\""));
  assert_null(strstr(svg, "<train>"));
  assert_null(strstr(svg, "<script"));
  /* One label a process on the timeline, whatever the zoomed panels repeat. */
  assert_int_equal(count_of(svg, "class=\"lane-label\""), 4);
  for (int uid = 0; uid < 4; uid++) {
    char label[64];
    snprintf(label, sizeof label, "class=\"lane-label\">uid %d ", uid);
    assert_int_equal(count_of(svg, label), 1);
  }
  /* The recovery's bar: a span for each phase that took time, none for revoke and redo. */
  char *bar = svg_part(svg, "<g class=\"breakdown\" id=\"recovery-1\">", "</g>");
  assert_int_equal(count_of(bar, "class=\"phase-bar\""), 4);
  assert_has(
      bar, LIST("<title>R1 detect: 2.00 ms</title>", "<title>R1 agree: 3.00 ms</title>",
                "<title>R1 rebuild: 1.00 ms</title>", "<title>R1 state transfer: 4.00 ms</title>"));
  assert_null(strstr(bar, "R1 revoke"));
  assert_null(strstr(bar, "R1 redo"));
  free(bar);
  /* Three processes took part: each has the phases on its lane. */
  assert_int_equal(count_of(svg, "<title>R1 agree: 3.00 ms</title>"), 1 + 3 + 3);
  char *legend = svg_part(svg, "<g class=\"legend\">", "</svg>");
  assert_has(legend,
             LIST(">detect<", ">revoke<", ">agree<", ">rebuild<", ">state transfer<", ">redo<",
                  ">JIT save<", ">node lost<", "death: a signal or an exit code"));
  free(legend);
  free(svg);
  files_remove(&files);
}

/* 64 processes on 8 nodes, 1500 steps each (96000 progress lines): every lane is drawn, its
 * ticks thinned to the pixels there are, and the file stays small. */
static void test_report_svg_of_many_lanes(void **state) {
  (void)state;
  report_files files;
  files_make(&files,
             "{\"event\":\"job_start\",\"t_ns\":1000,\"job_id\":\"80\",\"on_failure\":\"shrink\","
             "\"world\":64}\n");
  FILE *events = fopen(files.events, "a");
  assert_non_null(events);
  for (int uid = 0; uid < 64; uid++)
    fprintf(events,
            "{\"event\":\"spawn\",\"t_ns\":2000,\"uid\":%d,\"role\":\"worker\",\"node\":%d}\n", uid,
            uid / 8);
  for (long long step = 1; step <= 1500; step++)
    for (int uid = 0; uid < 64; uid++)
      fprintf(events,
              "{\"event\":\"progress\",\"uid\":%d,\"rank\":%d,\"epoch\":0,\"step\":%lld,"
              "\"t_ns\":%lld}\n",
              uid, uid, step, 1000 + step * 4000000LL);
  fprintf(events, "{\"event\":\"job_end\",\"t_ns\":6100000000,\"code\":0,\"seconds\":6.1}\n");
  assert_int_equal(fclose(events), 0);
  free(keel_output(&files, LIST("report", "--svg", files.svg, files.events)));
  size_t size = 0;
  char *svg = svg_read_checked(files.svg, &size);
  assert_int_equal(count_of(svg, "class=\"lane-label\""), 64);
  assert_int_equal(count_of(svg, "<path class=\"ticks\""), 64 + 1 /* the legend's */);
  size_t ticks = ticks_count(svg);
  /* 1500 steps on under 1000 px, ticks at least 2 px apart */
  assert_true(ticks > 64 * 300);
  assert_true(ticks < 64 * 480);
  assert_true(size < 2 * 1024 * 1024);
  free(svg);
  files_remove(&files);
}

/* Runs "keel report ARGS" expecting exit code and text in what it printed. */
static void assert_report_fails(const report_files *files, const char *const *args, int code,
                                const char *text) {
  int exit_code;
  char *output = keel_run(files, args, &exit_code);
  if (exit_code != code || strstr(output, text) == NULL)
    fail_msg("keel report exited %d (expected %d) with: %s", exit_code, code, output);
  free(output);
}

static void test_report_svg_bad_input(void **state) {
  (void)state;
  report_files files;
  files_make(&files, "{\"event\":\"spawn\",\"t_ns\":5,\"uid\":0}\n");
  char missing[500];
  snprintf(missing, sizeof missing, "%s/missing.jsonl", files.folder);
  assert_report_fails(&files, LIST("report", "--svg", files.svg, missing), 2,
                      "keel report: cannot read");
  assert_report_fails(&files, LIST("report", "--svg", files.svg, files.events), 2,
                      "no job_start event in the events file");
  assert_int_equal(access(files.svg, F_OK), -1);
  assert_report_fails(&files, LIST("report", files.events, "--svg"), 2,
                      "--svg needs the file to draw into");
  assert_report_fails(&files, LIST("report", "--svg", files.events, files.events), 2,
                      "--svg would draw over the events file");
  files_remove(&files);
  /* Garbage alone is no job; a malformed line in a job is skipped and said, as the report
   * does, and the rest is drawn. */
  files_make(&files, "not json\n{\"event\":\n");
  assert_report_fails(&files, LIST("report", "--svg", files.svg, files.events), 2,
                      "no job_start event in the events file");
  files_remove(&files);
  char events[sizeof nodes_events + 64];
  int first_line = (int)(strchr(nodes_events, '\n') + 1 - nodes_events);
  snprintf(events, sizeof events, "%.*s{\"event\":\"progress\",\"uid\":\n%s", first_line,
           nodes_events, nodes_events + first_line);
  files_make(&files, events);
  assert_report_fails(&files, LIST("report", "--svg", files.svg, files.events), 0,
                      "keel report: skipped 1 lines that are not a whole JSON event");
  char *svg = svg_read_checked(files.svg, NULL);
  assert_has(svg, LIST("lines skipped (not a whole JSON event): 1"));
  assert_int_equal(count_of(svg, "class=\"lane-label\""), 4);
  free(svg);
  files_remove(&files);
}

static void test_report_svg_unwritable(void **state) {
  (void)state;
  report_files files;
  files_make(&files, nodes_events);
  char path[500];
  snprintf(path, sizeof path, "%s/no-such-folder/timeline.svg", files.folder);
  assert_report_fails(&files, LIST("report", "--svg", path, files.events), 1,
                      "cannot write the timeline to");
  assert_report_fails(&files, LIST("report", "--svg", files.folder, files.events), 1,
                      "cannot write the timeline to");
  files_remove(&files);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_report_of_a_restart),
      cmocka_unit_test(test_report_skips_negative_times),
      cmocka_unit_test(test_report_of_inprocess_redo),
      cmocka_unit_test(test_model_measured_restart),
      cmocka_unit_test(test_model_placement_command),
      cmocka_unit_test(test_model_wasted_command),
      cmocka_unit_test(test_model_wasted_refusals),
      cmocka_unit_test(test_report_svg_of_two_nodes),
      cmocka_unit_test(test_report_svg_of_many_lanes),
      cmocka_unit_test(test_report_svg_bad_input),
      cmocka_unit_test(test_report_svg_unwritable),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
