/* Running keel and its jobs from the tests, and toy_train's final lines (test_job.h). Every
 * process starts through keel_test_spawn, so the test can kill it by pid. */
#include "test_job.h"

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keel/core.h"

#include "test_events.h"
#include "test_support.h"

#define MAX_ARGS 64

bool keel_test_job_prepare(keel_test_job *job, const char *prefix) {
  const char *folder = keel_test_tempdir(prefix);
  if (folder == NULL) return false;
  snprintf(job->folder, sizeof job->folder, "%s", folder);
  snprintf(job->events, sizeof job->events, "%s/events.jsonl", job->folder);
  snprintf(job->output, sizeof job->output, "%s/output.txt", job->folder);
  return true;
}

/* The command line and environment of a job, in storage that lives as long as it does. */
typedef struct job_command {
  char keel_path[PATH_MAX], program_path[PATH_MAX], fault_entry[512], timeout_text[32];
  char *argv[MAX_ARGS];
  char *env[2];
} job_command;

static void job_command_make(job_command *command, const keel_test_job *job, const char *timeout,
                             const char *const *flags, const char *program,
                             const char *const *program_args, const char *fault) {
  snprintf(command->keel_path, sizeof command->keel_path, "%s", keel_test_bin("keel"));
  snprintf(command->program_path, sizeof command->program_path, "%s", program);
  char **argv = command->argv;
  size_t used = 0;
  argv[used++] = command->keel_path;
  argv[used++] = "run";
  argv[used++] = "--quiet";
  if (timeout != NULL) {
    /* Sanitizer builds run every process several times slower: the job's own deadline
     * stretches with the tests' (keel_test_slowdown). */
    int64_t timeout_ns = 0;
    if (keel_parse_duration_ns(timeout, &timeout_ns) == KEEL_OK)
      snprintf(command->timeout_text, sizeof command->timeout_text, "%lldms",
               (long long)(timeout_ns / 1000000 * keel_test_slowdown()));
    else
      snprintf(command->timeout_text, sizeof command->timeout_text, "%s", timeout);
    argv[used++] = "--timeout";
    argv[used++] = command->timeout_text;
  }
  argv[used++] = "--events";
  argv[used++] = (char *)job->events;
  for (size_t i = 0; flags[i] != NULL && used < MAX_ARGS - 4; i++) argv[used++] = (char *)flags[i];
  argv[used++] = "--";
  argv[used++] = command->program_path;
  for (size_t i = 0; program_args[i] != NULL && used < MAX_ARGS - 1; i++)
    argv[used++] = (char *)program_args[i];
  argv[used] = NULL;
  command->env[0] = command->env[1] = NULL;
  if (fault != NULL) {
    snprintf(command->fault_entry, sizeof command->fault_entry, "KEEL_FAULT=%s", fault);
    command->env[0] = command->fault_entry;
  }
}

pid_t keel_test_job_start(const keel_test_job *job, const char *timeout, const char *const *flags,
                          const char *program, const char *const *program_args, const char *fault) {
  job_command command;
  job_command_make(&command, job, timeout, flags, program, program_args, fault);
  return keel_test_spawn(command.argv, command.env, job->output);
}

int keel_test_job_run(const keel_test_job *job, const char *timeout, int timeout_ms,
                      const char *const *flags, const char *program,
                      const char *const *program_args, const char *fault) {
  job_command command;
  job_command_make(&command, job, timeout, flags, program, program_args, fault);
  return keel_test_run(command.argv, command.env, job->output, timeout_ms);
}

int keel_test_keel(const char *const *args, const char *output_path, int timeout_ms) {
  char keel_path[PATH_MAX];
  snprintf(keel_path, sizeof keel_path, "%s", keel_test_bin("keel"));
  char *argv[16] = {keel_path};
  size_t used = 1;
  for (size_t i = 0; args[i] != NULL && used < 15; i++) argv[used++] = (char *)args[i];
  argv[used] = NULL;
  return keel_test_run(argv, NULL, output_path, timeout_ms);
}

long keel_test_toy_finals_read(const char *path, keel_test_toy_final *finals, size_t capacity,
                               size_t *total_p) {
  char *text = keel_test_read_file(path, NULL);
  if (total_p) *total_p = 0;
  if (text == NULL) return -1;
  size_t stored = 0, total = 0;
  for (char *line = strstr(text, "toy-final "); line != NULL;
       line = strstr(line + 1, "toy-final ")) {
    keel_test_toy_final final;
    if (sscanf(line, "toy-final rank=%d uid=%u step=%llu world=%d crc=%x", &final.rank, &final.uid,
               &final.step, &final.world, &final.crc) != 5)
      continue;
    if (stored < capacity) finals[stored++] = final;
    total++;
  }
  free(text);
  if (total_p) *total_p = total;
  return (long)stored;
}

unsigned keel_test_toy_assert_consistent(const char *output_path, int world,
                                         unsigned long long steps) {
  keel_test_toy_final finals[KEEL_TEST_MAX_FINALS] = {{0}};
  long count = keel_test_toy_finals_read(output_path, finals, KEEL_TEST_MAX_FINALS, NULL);
  assert_true(count >= 0);
  if (count != world) keel_test_print_file("job output", output_path);
  assert_int_equal(count, world);
  bool seen[KEEL_TEST_MAX_FINALS] = {false};
  for (long i = 0; i < count; i++) {
    const keel_test_toy_final *final = &finals[i];
    if (final->crc != finals[0].crc || final->world != world || final->step != steps) {
      keel_test_print_file("job output", output_path);
      fail_msg("rank %d (uid %u): step %llu world %d crc %08x; rank %d has crc %08x", final->rank,
               final->uid, final->step, final->world, final->crc, finals[0].rank, finals[0].crc);
    }
    assert_in_range(final->rank, 0, world - 1);
    assert_false(seen[final->rank]);
    seen[final->rank] = true;
  }
  return finals[0].crc;
}

#define INJECT_MAX_EVENTS 20000

static bool progress_seen(const keel_test_events *log, void *context) {
  (void)context;
  return keel_test_events_count(log, "progress") >= 2;
}

void keel_test_inject_when_training(const keel_test_job *job, const char *action,
                                    const char *target) {
  assert_true(keel_test_events_wait(job->events, INJECT_MAX_EVENTS, progress_seen, NULL, 20,
                                    60000 * keel_test_slowdown()));
  keel_test_events log;
  keel_test_events_read(job->events, INJECT_MAX_EVENTS, &log);
  char job_id[32];
  bool known = keel_test_events_job_id(&log, job_id, sizeof job_id);
  keel_test_events_free(&log);
  assert_true(known);
  char output[400];
  snprintf(output, sizeof output, "%s/inject.txt", job->folder);
  int code = keel_test_keel((const char *const[]){"inject", action, target, "--job", job_id, NULL},
                            output, 10000);
  if (code != 0) keel_test_print_file("keel inject", output);
  assert_int_equal(code, 0);
}
