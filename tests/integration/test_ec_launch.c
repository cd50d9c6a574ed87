/* Integration tests of `keel run --servers S --ec k=K,r=R`: the real launcher starts `keel
 * server` processes and ec_train workers (tests/programs/ec_train.c). A synchronous job ends
 * with the same parameters' crc whether or not a server is killed on the way (keel inject
 * kill server:I), more lost servers than the parity covers stop the job with a clear
 * message, bad flags are usage errors, and no process is left behind after any job: not
 * after an interrupt, nor after the launcher itself is killed. */
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
#include <unistd.h>

#include <cmocka.h>

#include "test_events.h"
#include "test_job.h"
#include "test_support.h"

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})
#define MAX_EVENTS 2048
#define JOB_TIMEOUT "60s"
#define JOB_TIMEOUT_MS 70000
#define SERVERS 4
/* The synchronous job of every case: 4 servers, k = 3, r = 1, two workers; a dead server
 * is replaced (the default with --ec-sync) unless DEGRADE is added. */
#define SYNC_FLAGS "--servers", "4", "--ec", "k=3,r=1", "--ec-sync", "-n", "2"
#define DEGRADE "--on-server-failure", "degrade"
#define TRAIN_STEPS "40"
/* Slow enough steps that a test can act while the job runs. */
#define SLOW_TRAIN LIST("--steps", TRAIN_STEPS, "--step-ms", "60")

/* ---- the job's output and events */

/* Worker 0's last line: its crc and the servers its client saw lost. False if none. */
static bool final_read(const char *output, unsigned *crc_p, unsigned long long *lost_p) {
  char line[128];
  if (!keel_test_last_line_with(output, "params-crc32c ", line, sizeof line)) return false;
  return sscanf(line, "params-crc32c %x lost-servers %llx", crc_p, lost_p) == 2;
}

/* The highest step worker 0 has reported, -1 before the first. */
static long long progress_read(const char *output) {
  char line[128];
  long long step = -1, rank = -1;
  if (!keel_test_last_line_with(output, "progress step ", line, sizeof line)) return -1;
  if (sscanf(line, "progress step %lld rank %lld", &step, &rank) != 2) return -1;
  return step;
}

/* Waits (bounded) until the workers have done `step` steps. */
static void progress_wait(const keel_test_job *run, long long step) {
  for (int tries = 0; tries < 200 * keel_test_slowdown(); tries++) {
    if (progress_read(run->output) >= step) return;
    usleep(50000);
  }
  keel_test_print_file("job output", run->output);
  fail_msg("the job never reached step %lld", step);
}

static bool field_is(const char *line, const char *key, const char *text) {
  const char *at = line != NULL ? keel_test_event_field(line, key) : NULL;
  return at != NULL && *at == '"' && strncmp(at + 1, text, strlen(text)) == 0 &&
         at[1 + strlen(text)] == '"';
}

/* The `event` line about server index (role server), or NULL. */
static const char *server_event(const keel_test_events *log, const char *event, long index) {
  for (size_t i = 0; i < log->count; i++) {
    const char *line = log->lines[i];
    if (keel_test_event_is(line, event) && field_is(line, "role", "server") &&
        keel_test_event_long(line, "index") == index)
      return line;
  }
  return NULL;
}

/* The `event` line about the process pid, or NULL. */
static const char *process_event(const keel_test_events *log, const char *event, pid_t pid) {
  for (size_t i = 0; i < log->count; i++)
    if (keel_test_event_is(log->lines[i], event) &&
        keel_test_event_long(log->lines[i], "pid") == (long)pid)
      return log->lines[i];
  return NULL;
}

static size_t role_events(const keel_test_events *log, const char *event, const char *role) {
  size_t count = 0;
  for (size_t i = 0; i < log->count; i++)
    count += keel_test_event_is(log->lines[i], event) && field_is(log->lines[i], "role", role);
  return count;
}

static bool server_exit_seen(const keel_test_events *log, void *context) {
  return server_event(log, "exit", *(const long *)context) != NULL;
}

static void server_exit_wait(const keel_test_job *run, long index) {
  if (!keel_test_events_wait(run->events, MAX_EVENTS, server_exit_seen, &index, 20, 10000))
    fail_msg("no exit event of server %ld", index);
}

/* Every server was started, with its index, before the first worker. */
static void servers_started_first(const keel_test_events *log) {
  assert_int_equal(role_events(log, "spawn", "server"), SERVERS);
  for (long index = 0; index < SERVERS; index++) {
    const char *spawn = server_event(log, "spawn", index);
    assert_non_null(spawn);
    assert_true(spawn < keel_test_events_find(log, "spawn", 0));
  }
}

/* The end of every job: the launcher's last line, and no process it started still there. */
static void job_finish(keel_test_events *log, int code) {
  assert_true(keel_test_event_is(log->lines[log->count - 1], "job_end"));
  assert_int_equal(keel_test_event_long(log->lines[log->count - 1], "code"), code);
  keel_test_events_assert_none_left(log);
  keel_test_events_free(log);
}

/* ---- the running job, as keel ps and keel inject see it */

static void job_id_read(const keel_test_job *run, char *job_id, size_t capacity) {
  keel_test_events log;
  keel_test_events_read(run->events, MAX_EVENTS, &log);
  assert_true(keel_test_events_job_id(&log, job_id, capacity));
  keel_test_events_free(&log);
}

/* The pids `keel ps` shows for the servers (rows "UID PID server:I ..."), by index; how
 * many rows it showed. */
static int ps_server_pids(const keel_test_job *run, const char *job_id, pid_t *pids) {
  char path[400];
  snprintf(path, sizeof path, "%s/ps.txt", run->folder);
  unlink(path);
  assert_int_equal(keel_test_keel(LIST("ps", "--job", job_id), path, 5000), 0);
  char *text = keel_test_read_file(path, NULL);
  assert_non_null(text);
  int rows = 0;
  for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
    unsigned uid;
    long pid;
    int index;
    if (sscanf(line, "%u %ld server:%d", &uid, &pid, &index) != 3) continue;
    assert_in_range(index, 0, SERVERS - 1);
    pids[index] = (pid_t)pid;
    rows++;
  }
  free(text);
  return rows;
}

/* keel inject ARGS --job JOB: its exit code; its output appended to the job's folder. */
static int inject(const keel_test_job *run, const char *action, const char *target,
                  const char *job_id) {
  char path[400];
  snprintf(path, sizeof path, "%s/inject.txt", run->folder);
  return keel_test_keel(LIST("inject", action, target, "--job", job_id), path, 5000);
}

/* Starts a slow synchronous job and waits until it is under way; the servers' pids from
 * keel ps, each a live process. */
static pid_t job_start_with(keel_test_job *run, const char *timeout, const char *const *flags,
                            const char *const *train_args, char *job_id, size_t capacity,
                            pid_t *pids) {
  assert_true(keel_test_job_prepare(run, "keel-ec-launch"));
  pid_t launcher =
      keel_test_job_start(run, timeout, flags, keel_test_program("ec_train"), train_args, NULL);
  assert_true(launcher > 0);
  progress_wait(run, 4);
  job_id_read(run, job_id, capacity);
  assert_int_equal(ps_server_pids(run, job_id, pids), SERVERS);
  for (int index = 0; index < SERVERS; index++) assert_true(keel_test_pid_exists(pids[index]));
  return launcher;
}

static pid_t slow_job_start(keel_test_job *run, const char *const *flags, char *job_id,
                            size_t capacity, pid_t *pids) {
  return job_start_with(run, JOB_TIMEOUT, flags, SLOW_TRAIN, job_id, capacity, pids);
}

/* The launcher's exit code (128 + the signal that ended it); the job's output is printed when
 * it is not the one expected. */
static int launcher_wait(const keel_test_job *run, pid_t launcher, int expected) {
  int status = 0;
  if (!keel_test_wait(launcher, JOB_TIMEOUT_MS, &status)) {
    keel_test_print_file("job output", run->output);
    fail_msg("the launcher did not end");
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code != expected) keel_test_print_file("job output", run->output);
  return code;
}

static void pids_gone(const pid_t *pids, int count) {
  for (int i = 0; i < count; i++)
    if (keel_test_pid_exists(pids[i])) fail_msg("server pid %ld is still there", (long)pids[i]);
}

/* ---- the synchronous job without failures: its crc is what every other run must match */

static unsigned sync_job_run(void) {
  keel_test_job run;
  assert_true(keel_test_job_prepare(&run, "keel-ec-launch"));
  int code = keel_test_job_run(&run, JOB_TIMEOUT, JOB_TIMEOUT_MS, LIST(SYNC_FLAGS),
                               keel_test_program("ec_train"), LIST("--steps", TRAIN_STEPS), NULL);
  if (code != 0) keel_test_print_file("job output", run.output);
  assert_int_equal(code, 0);
  unsigned crc = 0;
  unsigned long long lost = 1;
  assert_true(final_read(run.output, &crc, &lost));
  assert_int_equal(lost, 0);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  servers_started_first(&log);
  /* Stopped by the launcher once the workers were done: SIGTERM, and they left with 0. */
  assert_int_equal(role_events(&log, "exit", "server"), SERVERS);
  for (long index = 0; index < SERVERS; index++)
    assert_true(field_is(server_event(&log, "exit", index), "status", "0"));
  assert_null(keel_test_events_find(&log, "servers_lost", -1));
  job_finish(&log, 0);
  return crc;
}

static unsigned reference_crc(void) {
  static bool known;
  static unsigned crc;
  if (!known) crc = sync_job_run();
  known = true;
  return crc;
}

/* (a) The plain job ends 0, prints a crc, and does so every time. */
static void test_sync_job(void **state) {
  (void)state;
  unsigned first = reference_crc();
  assert_int_equal(sync_job_run(), first);
}

/* (b) A server killed mid-run is no worker failure: the job goes on through the parity and
 * ends 0 with the same crc, its client having seen server 1 lost. */
static void test_server_killed(void **state) {
  (void)state;
  unsigned expected = reference_crc();
  keel_test_job run;
  char job_id[32];
  pid_t pids[SERVERS];
  pid_t launcher = slow_job_start(&run, LIST(SYNC_FLAGS, DEGRADE), job_id, sizeof job_id, pids);
  /* Targets that name no server of the job are usage errors. */
  assert_int_equal(inject(&run, "kill", "server:99", job_id), 2);
  assert_int_equal(inject(&run, "kill", "server:1", job_id), 0);
  server_exit_wait(&run, 1);
  /* Killing it twice is a failure of its own: it has ended. */
  assert_int_equal(inject(&run, "kill", "server:1", job_id), 1);
  pid_t alive[SERVERS];
  assert_int_equal(ps_server_pids(&run, job_id, alive), SERVERS - 1);
  assert_int_equal(launcher_wait(&run, launcher, 0), 0);
  unsigned crc = 0;
  unsigned long long lost = 0;
  assert_true(final_read(run.output, &crc, &lost));
  assert_int_equal(lost, 1u << 1);
  assert_int_equal(crc, expected);

  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  const char *killed = server_event(&log, "exit", 1);
  assert_true(field_is(killed, "signal", "SIGKILL"));
  assert_int_equal(keel_test_event_long(killed, "pid"), pids[1]);
  assert_null(keel_test_events_find(&log, "servers_lost", -1));
  assert_null(keel_test_events_find(&log, "fence", -1));
  for (long uid = 0; uid < 2; uid++)
    assert_true(field_is(keel_test_events_find(&log, "exit", uid), "status", "0"));
  char *text = keel_test_read_file(run.output, NULL);
  assert_non_null(strstr(text, "the job goes on through the parity"));
  free(text);
  job_finish(&log, 0);
  pids_gone(pids, SERVERS);
}

/* (c) With r = 1, a second lost server is data lost: the launcher stops the job, exit 1,
 * and says why. */
static void test_two_servers_killed(void **state) {
  (void)state;
  keel_test_job run;
  char job_id[32];
  pid_t pids[SERVERS];
  pid_t launcher = slow_job_start(&run, LIST(SYNC_FLAGS, DEGRADE), job_id, sizeof job_id, pids);
  assert_int_equal(inject(&run, "kill", "server:1", job_id), 0);
  server_exit_wait(&run, 1);
  assert_int_equal(inject(&run, "kill", "server:2", job_id), 0);
  assert_int_equal(launcher_wait(&run, launcher, 1), 1);
  char *text = keel_test_read_file(run.output, NULL);
  assert_non_null(text);
  if (strstr(text, "2 parameter servers are dead, more than the parity of --ec r=1") == NULL) {
    keel_test_print_file("job output", run.output);
    fail_msg("no message on the lost servers");
  }
  free(text);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  const char *lost = keel_test_events_find(&log, "servers_lost", -1);
  assert_non_null(lost);
  assert_int_equal(keel_test_event_long(lost, "lost"), 2);
  assert_int_equal(keel_test_event_long(lost, "parity_blocks"), 1);
  job_finish(&log, 1);
  pids_gone(pids, SERVERS);
}

/* The spawn events of server index's replacements (started with --replace), in order: how
 * many, and the pid of the last one in *pid_p (optional). */
static int replacement_spawns(const keel_test_events *log, long index, pid_t *pid_p) {
  int count = 0;
  for (size_t i = 0; i < log->count; i++) {
    const char *line = log->lines[i];
    const char *replacement = keel_test_event_field(line, "replacement");
    if (keel_test_event_is(line, "spawn") && field_is(line, "role", "server") &&
        keel_test_event_long(line, "index") == index && replacement != NULL &&
        strncmp(replacement, "true", 4) == 0) {
      count++;
      if (pid_p != NULL) *pid_p = (pid_t)keel_test_event_long(line, "pid");
    }
  }
  return count;
}

typedef struct replacements_wanted {
  long index;
  int count;
} replacements_wanted;

static bool replacements_seen(const keel_test_events *log, void *context) {
  const replacements_wanted *wanted = context;
  return replacement_spawns(log, wanted->index, NULL) >= wanted->count;
}

static void replacements_wait(const keel_test_job *run, long index, int count) {
  replacements_wanted wanted = {.index = index, .count = count};
  if (!keel_test_events_wait(run->events, MAX_EVENTS, replacements_seen, &wanted, 20, 10000))
    fail_msg("no replacement %d of server %ld was started", count, index);
}

/* With --ec-sync a killed server is replaced: the replacement is rebuilt while the job goes
 * on and comes back; killed in turn, it is replaced too. The job ends with the failure-free
 * crc and, at the end, no server lost (every one back). */
static void test_server_replaced(void **state) {
  (void)state;
  unsigned expected = reference_crc();
  keel_test_job run;
  char job_id[32];
  pid_t pids[SERVERS], now[SERVERS];
  pid_t launcher = slow_job_start(&run, LIST(SYNC_FLAGS), job_id, sizeof job_id, pids);
  assert_int_equal(inject(&run, "kill", "server:2", job_id), 0);
  replacements_wait(&run, 2, 1);
  /* keel ps shows the replacement as server 2: a live process, not the killed one. */
  assert_int_equal(ps_server_pids(&run, job_id, now), SERVERS);
  assert_true(now[2] != pids[2] && keel_test_pid_exists(now[2]));
  assert_int_equal(inject(&run, "kill", "server:2", job_id), 0);
  replacements_wait(&run, 2, 2);
  assert_int_equal(launcher_wait(&run, launcher, 0), 0);
  unsigned crc = 0;
  unsigned long long lost = 1;
  assert_true(final_read(run.output, &crc, &lost));
  if (crc != expected || lost != 0) keel_test_print_file("job output", run.output);
  assert_int_equal(crc, expected);
  assert_int_equal(lost, 0);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  pid_t last = 0;
  assert_int_equal(replacement_spawns(&log, 2, &last), 2);
  assert_null(keel_test_events_find(&log, "servers_lost", -1));
  job_finish(&log, 0);
  now[2] = last;
  pids_gone(now, SERVERS);
}

/* The pid `keel status` shows for server index once it serves ("running", not lost) with a
 * pid other than old; 0 if that does not come within timeout_ms. */
static pid_t serving_wait(const keel_test_job *run, const char *job_id, int index, pid_t old,
                          int timeout_ms) {
  char path[400];
  snprintf(path, sizeof path, "%s/status.txt", run->folder);
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    unlink(path);
    if (keel_test_keel(LIST("status", "--job", job_id), path, 5000) != 0) return 0;
    char *text = keel_test_read_file(path, NULL);
    pid_t found = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line != NULL; line = strtok(NULL, "\n")) {
      int at;
      unsigned uid;
      long pid;
      char standing[32];
      if (sscanf(line, "server:%d %u %ld %31s", &at, &uid, &pid, standing) == 4 && at == index &&
          pid != old && strcmp(standing, "running") == 0)
        found = (pid_t)pid;
    }
    free(text);
    if (found > 0) return found;
    usleep(10000);
  }
  return 0;
}

/* Finding 22: keel run budgeted 64 processes per server index, 256 for these 4 servers, so
 * the 253rd replacement was never started. Server 2 is killed more often than that, each
 * time once its replacement serves, and is replaced every time while the job trains on. */
#define KILLS_PAST_THE_OLD_CAP 260
static void test_server_replaced_any_number_of_times(void **state) {
  (void)state;
  keel_test_job run;
  char job_id[32];
  pid_t pids[SERVERS];
  /* Steps enough to outlast the kills; the job is interrupted once they are done. */
  pid_t launcher =
      job_start_with(&run, "600s", LIST(SYNC_FLAGS), LIST("--steps", "100000000", "--step-ms", "5"),
                     job_id, sizeof job_id, pids);
  long first_step = progress_read(run.output);
  pid_t serving = pids[2];
  for (int kill_count = 1; kill_count <= KILLS_PAST_THE_OLD_CAP; kill_count++) {
    assert_int_equal(inject(&run, "kill", "server:2", job_id), 0);
    pid_t replacement = serving_wait(&run, job_id, 2, serving, 20000 * keel_test_slowdown());
    if (replacement == 0) {
      keel_test_print_file("job output", run.output);
      fail_msg("server 2 did not serve again after kill %d", kill_count);
    }
    assert_true(keel_test_pid_exists(replacement));
    serving = replacement;
  }
  /* The workers trained on through the kills. */
  progress_wait(&run, first_step + 100);
  kill(launcher, SIGINT);
  assert_int_equal(launcher_wait(&run, launcher, 130), 130);
  keel_test_events log;
  keel_test_events_read(run.events, 1 << 20, &log);
  pid_t last = 0;
  assert_int_equal(replacement_spawns(&log, 2, &last), KILLS_PAST_THE_OLD_CAP);
  assert_int_equal(last, serving);
  assert_null(keel_test_events_find(&log, "servers_lost", -1));
  pids[2] = serving;
  for (long index = 0; index < SERVERS; index++)
    assert_true(field_is(process_event(&log, "exit", pids[index]), "status", "0"));
  job_finish(&log, 130);
  pids_gone(pids, SERVERS);
}

/* examples/dlrm on the job's servers: a short synchronous run; its final line's crc (every
 * row, dense parameter and optimizer state), the same at both workers; the job's events into
 * *log when it is not NULL. */
static unsigned dlrm_job_crc(const char *fault, keel_test_events *log) {
  keel_test_job run;
  assert_true(keel_test_job_prepare(&run, "keel-ec-launch"));
  char dlrm[512]; /* keel_test_bin's buffer is reused by the next call */
  snprintf(dlrm, sizeof dlrm, "%s", keel_test_bin("dlrm"));
  int code =
      keel_test_job_run(&run, JOB_TIMEOUT, JOB_TIMEOUT_MS, LIST(SYNC_FLAGS), dlrm,
                        LIST("--backend", "servers", "--sync", "--steps", "60", "--tables", "3",
                             "--rows", "2000", "--batch", "64", "--eval-samples", "512", "--quiet"),
                        fault);
  if (code != 0) keel_test_print_file("job output", run.output);
  assert_int_equal(code, 0);
  char *text = keel_test_read_file(run.output, NULL);
  assert_non_null(text);
  unsigned crcs[2] = {0, 0};
  int seen = 0;
  for (const char *at = strstr(text, "params-crc32c "); at != NULL && seen < 2;
       at = strstr(at + 1, "params-crc32c "))
    seen += sscanf(at, "params-crc32c %x", &crcs[seen]) == 1;
  free(text);
  if (seen != 2) keel_test_print_file("job output", run.output);
  assert_int_equal(seen, 2);
  assert_int_equal(crcs[0], crcs[1]);
  if (log != NULL) keel_test_events_read(run.events, MAX_EVENTS, log);
  return crcs[0];
}

/* The DLRM example trains on the servers; a server that dies between the phases of a
 * two-phase commit (KEEL_FAULT in the servers' environment) is replaced, and the model ends
 * bit for bit the failure-free run's. */
static void test_dlrm_on_servers(void **state) {
  (void)state;
  unsigned expected = dlrm_job_crc(NULL, NULL);
  keel_test_events log;
  assert_int_equal(dlrm_job_crc("kill@uid=1,point=ec_committing,step=30", &log), expected);
  /* The fault hit: server 1 was killed, and a replacement took its place. */
  const char *killed = server_event(&log, "exit", 1);
  assert_non_null(killed);
  assert_true(field_is(killed, "signal", "SIGKILL"));
  assert_int_equal(replacement_spawns(&log, 1, NULL), 1);
  job_finish(&log, 0);
}

/* SIGINT to the launcher: the workers leave (77) and then the servers are stopped. */
static void test_interrupt_stops_servers(void **state) {
  (void)state;
  keel_test_job run;
  char job_id[32];
  pid_t pids[SERVERS];
  pid_t launcher = slow_job_start(&run, LIST(SYNC_FLAGS), job_id, sizeof job_id, pids);
  kill(launcher, SIGINT);
  assert_int_equal(launcher_wait(&run, launcher, 130), 130);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  for (long uid = 0; uid < 2; uid++)
    assert_true(field_is(keel_test_events_find(&log, "exit", uid), "status", "77"));
  for (long index = 0; index < SERVERS; index++)
    assert_true(field_is(server_event(&log, "exit", index), "status", "0"));
  job_finish(&log, 130);
  pids_gone(pids, SERVERS);
}

/* The state letter of pid in /proc/<pid>/stat and its name into name (capacity bytes);
 * 0 when there is no such process. */
static char process_state(pid_t pid, char *name, size_t capacity) {
  char path[64], stat[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  FILE *file = fopen(path, "r");
  if (file == NULL) return 0;
  size_t length = fread(stat, 1, sizeof stat - 1, file);
  fclose(file);
  stat[length] = '\0';
  const char *open = strchr(stat, '('), *close = strrchr(stat, ')');
  if (open == NULL || close == NULL || close[1] != ' ') return 0;
  snprintf(name, capacity, "%.*s", (int)(close - open - 1), open + 1);
  return close[2];
}

/* Whether a process of the job runs still: the keel server or ec_train of that pid, not
 * another program that took the pid since. Orphans come to this process (a subreaper), which
 * reaps the ones that have ended. */
static bool job_process_runs(pid_t pid) {
  waitpid(pid, NULL, WNOHANG);
  char name[64] = "";
  char state = process_state(pid, name, sizeof name);
  bool ours = strcmp(name, "keel") == 0 || strcmp(name, "ec_train") == 0;
  return ours && state != 0 && state != 'Z' && state != 'X';
}

/* The pids of the job's spawn events, at most capacity; how many. */
static size_t spawned_pids(const keel_test_job *run, pid_t *pids, size_t capacity) {
  keel_test_events log;
  keel_test_events_read(run->events, MAX_EVENTS, &log);
  size_t count = 0;
  for (size_t i = 0; i < log.count && count < capacity; i++)
    if (keel_test_event_is(log.lines[i], "spawn"))
      pids[count++] = (pid_t)keel_test_event_long(log.lines[i], "pid");
  keel_test_events_free(&log);
  return count;
}

/* A launcher killed with SIGKILL cannot stop its servers: they stop on their own (the
 * parent-death signal), and the workers leave once their servers are gone. No process of
 * the job outlives it for long. */
static void test_launcher_killed(void **state) {
  (void)state;
  keel_test_job run;
  char job_id[32];
  pid_t servers[SERVERS], pids[16];
  /* The launcher's orphans are this process's to reap, not left as zombies to the host. */
  assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  pid_t launcher = slow_job_start(&run, LIST(SYNC_FLAGS), job_id, sizeof job_id, servers);
  size_t count = spawned_pids(&run, pids, 16);
  assert_int_equal(count, SERVERS + 2);
  kill(launcher, SIGKILL);
  assert_int_equal(launcher_wait(&run, launcher, 128 + SIGKILL), 128 + SIGKILL);
  bool running = true;
  for (int tries = 0; running && tries < 200 * keel_test_slowdown(); tries++) {
    running = false;
    for (size_t i = 0; i < count; i++) running |= job_process_runs(pids[i]);
    if (running) usleep(50000);
  }
  /* Whatever is left must not outlive the test. */
  for (size_t i = 0; running && i < count; i++) {
    if (!job_process_runs(pids[i])) continue;
    kill(pids[i], SIGKILL);
    waitpid(pids[i], NULL, 0);
  }
  if (running) fail_msg("a process of the job outlived its launcher");
  for (size_t i = 0; i < count; i++) assert_false(keel_test_pid_exists(pids[i]));
}

/* ---- (d) usage errors: one line, exit 2, before anything starts */

static void expect_usage(const char *const *args, const char *words) {
  keel_test_job files;
  assert_true(keel_test_job_prepare(&files, "keel-ec-launch"));
  int code = keel_test_keel(args, files.output, 5000);
  char *text = keel_test_read_file(files.output, NULL);
  assert_non_null(text);
  if (code != 2 || strstr(text, words) == NULL || strchr(text, '\n') != text + strlen(text) - 1)
    fail_msg("keel %s %s ...: exit %d, '%s' (wanted 2 and one line with '%s')", args[0], args[1],
             code, text, words);
  free(text);
}

static void test_bad_flags(void **state) {
  (void)state;
  const char *true_path = "/bin/true";
  expect_usage(LIST("run", "--servers", "4", "--", true_path), "--servers needs --ec");
  expect_usage(LIST("run", "--ec", "k=3,r=1", "--", true_path), "--ec needs --servers");
  expect_usage(LIST("run", "--ec-sync", "--", true_path), "--ec-sync needs --servers");
  expect_usage(LIST("run", "--servers", "4", "--ec", "k=0,r=1", "--", true_path), "k=K,r=R");
  expect_usage(LIST("run", "--servers", "4", "--ec", "k=3,r=0", "--", true_path), "k=K,r=R");
  expect_usage(LIST("run", "--servers", "4", "--ec", "3,1", "--", true_path), "k=K,r=R");
  expect_usage(LIST("run", "--servers", "4", "--ec", "k=3,r=1x", "--", true_path), "k=K,r=R");
  expect_usage(LIST("run", "--servers", "4", "--ec", "k=3,r=2", "--", true_path),
               "needs k + r = 5 servers");
  expect_usage(LIST("run", "--servers", "0", "--ec", "k=1,r=1", "--", true_path), "--servers");
  expect_usage(LIST("run", "--servers", "100000", "--ec", "k=1,r=1", "--", true_path), "--servers");
  expect_usage(
      LIST("run", "--servers", "4", "--ec", "k=3,r=1", "-n", "2", "--nnodes", "2", "--", true_path),
      "one host");
  expect_usage(LIST("run", "--servers", "4", "--ec", "k=3,r=1", "--agents", "--", true_path),
               "one host");
  expect_usage(LIST("run", "--servers", "4", "--ec", "k=3,r=1", "--ckpt", "jit", "--", true_path),
               "--on-failure restart");
  expect_usage(LIST("run", "--servers", "4", "--ec", "k=3,r=1", "--ec-sync", "-n", "2",
                    "--max-world", "3", "--", true_path),
               "--max-world");
  expect_usage(LIST("run", "--servers", "4", "--ec", "k=3,r=1", "--on-server-failure", "replace",
                    "--", true_path),
               "needs --ec-sync");
  expect_usage(LIST("run", "--servers", "4", "--ec", "k=3,r=1", "--ec-sync", "--on-server-failure",
                    "spare", "--", true_path),
               "replace or degrade");
  expect_usage(LIST("inject", "kill", "server:x"), "server:I");
  expect_usage(LIST("inject", "kill-node", "server:1"), "server:I");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_flags),
      cmocka_unit_test(test_sync_job),
      cmocka_unit_test(test_server_killed),
      cmocka_unit_test(test_server_replaced),
      cmocka_unit_test(test_server_replaced_any_number_of_times),
      cmocka_unit_test(test_dlrm_on_servers),
      cmocka_unit_test(test_two_servers_killed),
      cmocka_unit_test(test_interrupt_stops_servers),
      cmocka_unit_test(test_launcher_killed),
  };
  /* KEEL_TEST_FILTER=test_server_* runs only the cases it names. */
  if (getenv("KEEL_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("KEEL_TEST_FILTER"));
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
