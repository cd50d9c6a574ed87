/* Running keel from the integration and fault tests: a job's folder and files, `keel run`
 * of a program with launcher flags and an injected fault, other keel commands, and the
 * "toy-final" lines that toy_train's finishing processes print. */
#ifndef KEEL_TEST_JOB_H
#define KEEL_TEST_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The files of one job: a fresh folder, its events file and the output (stdout and stderr
 * of the launcher and every worker). */
typedef struct keel_test_job {
  char folder[256];
  char events[300]; /* folder/events.jsonl */
  char output[300]; /* folder/output.txt */
} keel_test_job;

/* Makes a fresh folder named prefix-XXXXXX (keel_test_tempdir) and fills in job's paths;
 * false if the folder cannot be made. */
bool keel_test_job_prepare(keel_test_job *job, const char *prefix);

/* Starts "keel run --quiet [--timeout TIMEOUT] --events job->events FLAGS -- PROGRAM ARGS"
 * in the background, its output appended to job->output. flags and program_args are
 * NULL-terminated lists; timeout NULL leaves --timeout out; program is a path
 * (keel_test_program); fault, when not NULL, becomes KEEL_FAULT in the launcher's
 * environment, which reaches every worker. Returns the launcher's pid (-1 if it cannot). */
pid_t keel_test_job_start(const keel_test_job *job, const char *timeout, const char *const *flags,
                          const char *program, const char *const *program_args, const char *fault);
/* The same job run to its end, killed after timeout_ms: returns what keel_test_run does
 * (the exit code, 128+signal, or -1 when the test had to kill it). */
int keel_test_job_run(const keel_test_job *job, const char *timeout, int timeout_ms,
                      const char *const *flags, const char *program,
                      const char *const *program_args, const char *fault);

/* Runs "keel ARGS..." (args NULL-terminated, at most 14 are passed) to completion like
 * keel_test_run, its output appended to output_path. */
int keel_test_keel(const char *const *args, const char *output_path, int timeout_ms);

/* Once the job whose events file is job->events has reported progress twice (60 s at most,
 * stretched under the sanitizers), runs "keel inject ACTION TARGET --job ID" with the job id of
 * its job_start event, its output in job->folder/inject.txt; cmocka assertions. */
void keel_test_inject_when_training(const keel_test_job *job, const char *action,
                                    const char *target);

/* ---- toy_train's "toy-final rank=R uid=U step=N world=W crc=X" lines */
#define KEEL_TEST_MAX_FINALS 16

typedef struct keel_test_toy_final {
  int rank, world;
  unsigned uid, crc;
  unsigned long long step;
} keel_test_toy_final;

/* Parses the toy-final lines of the output file at path, in order, into finals: the first
 * capacity of them. Returns how many it stored, or -1 if the file cannot be read; *total_p
 * (when not NULL) gets how many the file has in all. */
long keel_test_toy_finals_read(const char *path, keel_test_toy_final *finals, size_t capacity,
                               size_t *total_p);

/* cmocka assertion on the job whose output is at output_path (printed when it fails): it has
 * exactly `world` toy-final lines (of the first KEEL_TEST_MAX_FINALS), every one after
 * `steps` steps in a world of `world` with the same crc, and their ranks are 0..world-1 once
 * each. Returns the common crc. */
unsigned keel_test_toy_assert_consistent(const char *output_path, int world,
                                         unsigned long long steps);

#endif
