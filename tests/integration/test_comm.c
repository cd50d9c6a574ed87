/* Integration tests of the communicator under the real launcher: every collective over 1-4
 * ranks (comm_check), recovery of a training loop (toy_train) from kills, hangs and failures
 * during recovery -- by replacement, bit-exact against a clean run, and by shrink, consistent
 * among survivors -- and a job's defence against a process that lacks its token. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "keel/keel.h"
#include "test_events.h"
#include "test_job.h"
#include "test_support.h"

/* Every job is bounded twice: by the launcher's --timeout and, should the launcher itself
 * hang, by the test's kill. */
#define JOB_TIMEOUT "60s"
#define JOB_TIMEOUT_MS 70000
/* 100000 parameters make each allreduce take the ring path, so that point=allreduce fires
 * between chunk sends rather than after the direct path's single send. */
#define TOY_PARAMS "100000"
#define TOY_STEPS "20"
#define TOY_STEP_COUNT 20
#define MAX_EVENTS 2048

#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- one job (keel_test_job: its folder, events file and output) */
/* Runs the job to its end and returns keel's exit code (-1: the test had to kill it). */
static int job_run(keel_test_job *run, const char *const *flags, const char *program,
                   const char *const *program_args, const char *fault) {
  assert_true(keel_test_job_prepare(run, "keel-comm"));
  int code = keel_test_job_run(run, JOB_TIMEOUT, JOB_TIMEOUT_MS, flags, keel_test_program(program),
                               program_args, fault);
  if (code != 0) keel_test_print_file("job output", run->output);
  return code;
}

/* Runs toy_train (TOY_STEPS steps, TOY_PARAMS parameters) under keel with flags and fault;
 * asserts exit 0 and consistency in a final world of `world`; returns the common crc. */
static unsigned toy_run(keel_test_job *run, const char *const *flags, const char *fault,
                        int world) {
  int code =
      job_run(run, flags, "toy_train",
              LIST("--steps", TOY_STEPS, "--params", TOY_PARAMS, "--compute-ms", "2"), fault);
  assert_int_equal(code, 0);
  return keel_test_toy_assert_consistent(run->output, world, TOY_STEP_COUNT);
}

/* The crc of a clean 4-worker run: what an exact recovery must reproduce. Run once. */
static unsigned baseline_crc(void) {
  static bool known;
  static unsigned crc;
  if (!known) {
    keel_test_job run;
    crc = toy_run(&run, LIST("-n", "4"), NULL, 4);
    known = true;
  }
  return crc;
}

/* ---- the events file */
/* The last line of event name about uid, or NULL: the outcome of the latest recovery. */
static const char *find_last_event(const keel_test_events *log, const char *name, long uid) {
  for (size_t i = log->count; i-- > 0;) {
    if (keel_test_event_is(log->lines[i], name) &&
        keel_test_event_long(log->lines[i], "uid") == uid)
      return log->lines[i];
  }
  return NULL;
}

/* Whether some recovery line (whichever survivor wrote it) has uid in its failed list. */
static bool recovery_of(const keel_test_events *log, long uid) {
  for (size_t i = 0; i < log->count; i++) {
    const char *failed = keel_test_event_is(log->lines[i], "recovery")
                             ? keel_test_event_field(log->lines[i], "failed")
                             : NULL;
    if (failed == NULL || *failed != '[') continue;
    for (char *at = (char *)failed + 1; *at != ']' && *at != '\0'; at += *at == ',') {
      char *end;
      long value = strtol(at, &end, 10);
      if (end == at) break;
      if (value == uid) return true;
      at = end;
    }
  }
  return false;
}

/* A recovery line carries the whole breakdown, so a regression in any phase shows. */
static void assert_recovery_breakdown(const char *recovery) {
  static const char *const phases[] = {"detect_ms", "revoke_ms",         "agree_ms", "rebuild_ms",
                                       "redo_ms",   "state_transfer_ms", "total_ms"};
  assert_non_null(recovery);
  for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
    const char *value = keel_test_event_field(recovery, phases[i]);
    if (value == NULL) fail_msg("recovery line without %s: %s", phases[i], recovery);
    assert_true(strtod(value, NULL) >= 0);
  }
}

/* ---- cases: the collectives */
typedef struct comm_check_case {
  const char *name;
  const char *ranks;
} comm_check_case;

static void test_comm_check(void **state) {
  const comm_check_case *check = *state;
  keel_test_job run;
  assert_int_equal(job_run(&run, LIST("-n", check->ranks), "comm_check", LIST(NULL), NULL), 0);
  char line[256], expected[64];
  assert_true(keel_test_last_line_with(run.output, "comm-check ok", line, sizeof line));
  snprintf(expected, sizeof expected, "comm-check ok ranks=%s ", check->ranks);
  assert_true(strncmp(line, expected, strlen(expected)) == 0);
}

/* ---- cases: replacement reproduces the clean run bit for bit */
typedef struct replace_case {
  const char *name;
  const char *fault;
  const char *spares;
  int64_t bound_ms; /* from the last fault to the recovery line; 0: no bound */
} replace_case;

/* Milliseconds from the last "fault" event to the last "recovery" event; -1 if either is
 * missing. Measured from the events, so slow start-up (sanitizers, a loaded machine) does
 * not count, only the recovery itself. */
static long long fault_to_recovery_ms(const keel_test_events *log) {
  long long fault = -1, recovery = -1;
  for (size_t i = 0; i < log->count; i++) {
    if (keel_test_event_is(log->lines[i], "fault")) fault = keel_test_event_long(log->lines[i], "t_ns");
    if (keel_test_event_is(log->lines[i], "recovery"))
      recovery = keel_test_event_long(log->lines[i], "t_ns");
  }
  return fault < 0 || recovery < fault ? -1 : (recovery - fault) / 1000000;
}

/* A short collective deadline (10 s) lets a bound below it tell a recovery that worked
 * from one that stalled until a member was declared silent. */
static void test_replace_is_exact(void **state) {
  const replace_case *replace = *state;
  unsigned clean = baseline_crc();
  keel_test_job run;
  unsigned crc = toy_run(&run,
                         LIST("-n", "4", "--spares", replace->spares, "--on-failure", "replace",
                              "--collective-timeout", "10s"),
                         replace->fault, 4);
  if (crc != clean)
    fail_msg("%s: crc %08x after replacement, %08x clean", replace->fault, crc, clean);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  long long took = fault_to_recovery_ms(&log);
  if (replace->bound_ms > 0 && (took < 0 || took > replace->bound_ms))
    fail_msg("%s: %lld ms from the fault to the recovery, more than %lld: see %s",
             replace->fault, took, (long long)replace->bound_ms, run.events);
  assert_non_null(keel_test_events_find(&log, "fault", 2));
  if (!recovery_of(&log, 2)) fail_msg("no recovery line names uid 2 failed: %s", run.events);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* ---- cases: shrink leaves consistent survivors */
typedef struct shrink_case {
  const char *name;
  const char *fault;
  const char *heartbeat; /* NULL: the default */
  int world;             /* survivors */
  int64_t bound_ms;      /* from the last fault to the recovery line; 0: no bound */
} shrink_case;

/* Each rule of a KEEL_FAULT text writes one "fault" event as it fires; a rule that never
 * fired (say, point=agree with no agreement) would make the case prove nothing. */
static void assert_every_rule_fired(const keel_test_events *log, const char *fault) {
  size_t rules = 1, fired = keel_test_events_count(log, "fault");
  for (const char *at = fault; *at; at++) rules += *at == ';';
  if (fired != rules) fail_msg("%zu of the %zu rules of %s fired", fired, rules, fault);
}

static void test_shrink_is_consistent(void **state) {
  const shrink_case *shrink = *state;
  keel_test_job run;
  /* The launcher sets KEEL_HEARTBEAT itself from --heartbeat (an inherited value of that
   * name is dropped), so a short lease is asked of it. */
  if (shrink->heartbeat != NULL)
    toy_run(&run, LIST("-n", "4", "--heartbeat", shrink->heartbeat), shrink->fault, shrink->world);
  else
    toy_run(&run, LIST("-n", "4"), shrink->fault, shrink->world);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  const char *recovery = find_last_event(&log, "recovery", 0);
  assert_recovery_breakdown(recovery);
  assert_int_equal(keel_test_event_long(recovery, "new_world"), shrink->world);
  assert_every_rule_fired(&log, shrink->fault);
  long long took = fault_to_recovery_ms(&log);
  if (shrink->bound_ms > 0 && (took < 0 || took > shrink->bound_ms))
    fail_msg("%s: %lld ms from the last fault to the recovery, more than %lld: see %s",
             shrink->fault, took, (long long)shrink->bound_ms, run.events);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* ---- the events of a recovery: a hung rank 2 is fenced and replaced */
static void test_events_of_recovery(void **state) {
  (void)state;
  unsigned clean = baseline_crc();
  keel_test_job run;
  unsigned crc = toy_run(
      &run, LIST("-n", "4", "--spares", "1", "--on-failure", "replace", "--heartbeat", "1s"),
      "stop@rank=2,step=6,point=forward", 4);
  assert_int_equal(crc, clean);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  const char *recovery = keel_test_events_find(&log, "recovery", 0);
  if (recovery == NULL) fail_msg("no recovery line in %s", run.events);
  assert_non_null(strstr(recovery, "\"failed\":[2]"));
  assert_non_null(strstr(recovery, "\"policy\":\"replace\""));
  assert_int_equal(keel_test_event_long(recovery, "old_world"), 4);
  assert_int_equal(keel_test_event_long(recovery, "new_world"), 4);
  assert_int_equal(keel_test_event_long(recovery, "replaced"), 1);
  assert_true(keel_test_event_long(recovery, "new_epoch") >
              keel_test_event_long(recovery, "old_epoch"));
  assert_recovery_breakdown(recovery);
  const char *fence = keel_test_events_find(&log, "fence", 2);
  if (fence == NULL) fail_msg("the stopped uid 2 was not fenced: %s", run.events);
  assert_int_equal(keel_test_event_long(fence, "pid"),
                   keel_test_event_long(keel_test_events_find(&log, "spawn", 2), "pid"));
  const char *exit_line = keel_test_events_find(&log, "exit", 2);
  assert_non_null(exit_line);
  assert_non_null(strstr(exit_line, "\"status\":\"SIGKILL\""));
  assert_non_null(strstr(exit_line, "\"fenced\":true"));
  for (long uid = 0; uid < 4; uid++) assert_non_null(keel_test_events_find(&log, "exit", uid));
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* ---- security: a process without the job's token cannot join or disturb it */

/* Connects a plain TCP socket to "host:port"; -1 if it cannot. */
static int tcp_connect(const char *address) {
  char host[64];
  const char *colon = strrchr(address, ':');
  if (colon == NULL || (size_t)(colon - address) >= sizeof host) return -1;
  memcpy(host, address, (size_t)(colon - address));
  host[colon - address] = '\0';
  struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  if (inet_pton(AF_INET, host, &peer.sin_addr) != 1) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct timeval patience = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
  if (connect(fd, (struct sockaddr *)&peer, sizeof peer) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Sends bytes, then expects the peer to drop the connection (EOF or reset) within the
 * socket's receive timeout rather than wait for more or answer. */
static void assert_dropped_after(const char *address, const void *bytes, size_t length,
                                 const char *what) {
  int fd = tcp_connect(address);
  if (fd < 0) fail_msg("cannot connect to %s to send %s", address, what);
  assert_int_equal(send(fd, bytes, length, MSG_NOSIGNAL), (ssize_t)length);
  uint8_t answer[256];
  ssize_t got;
  size_t answered = 0;
  while ((got = recv(fd, answer, sizeof answer, 0)) > 0) answered += (size_t)got;
  int error = errno;
  close(fd);
  if (got < 0 && (error == EAGAIN || error == EWOULDBLOCK))
    fail_msg("%s at %s: still connected after 5 s", what, address);
  if (answered > 0) fail_msg("%s at %s: answered with %zu bytes", what, address, answered);
}

/* The job id of the job_start line into *context, once there is one (0: not yet). */
static bool job_id_known(const keel_test_events *log, void *context) {
  uint64_t *job_id = context;
  char text[32];
  *job_id = keel_test_events_job_id(log, text, sizeof text) ? strtoull(text, NULL, 10) : 0;
  return *job_id != 0;
}

/* The job id from the events file's job_start line, waiting for it up to 10 s. */
static uint64_t wait_for_job_id(const keel_test_job *run) {
  uint64_t job_id = 0;
  if (!keel_test_events_wait(run->events, MAX_EVENTS, job_id_known, &job_id, 10, 10000))
    fail_msg("no job_start line in %s", run->events);
  return job_id;
}

/* The address of a live worker from `keel ps --job ID`, waiting up to 10 s for one. */
static void wait_for_worker_address(const keel_test_job *run, uint64_t job_id, char *address,
                                    size_t capacity) {
  char job_text[32], ps_path[400];
  snprintf(job_text, sizeof job_text, "%llu", (unsigned long long)job_id);
  snprintf(ps_path, sizeof ps_path, "%s/ps.txt", run->folder);
  for (int tries = 0; tries < 100; tries++) {
    unlink(ps_path);
    int code = keel_test_keel(LIST("ps", "--job", job_text), ps_path, 5000);
    char *text = keel_test_read_file(ps_path, NULL);
    for (char *line = text; code == 0 && line != NULL && *line != '\0';) {
      char role[16], addr[96];
      long long rank;
      if (sscanf(line, "%*u %*d %15s %lld %*d %*d %95s", role, &rank, addr) == 3 &&
          strcmp(role, "worker") == 0 && rank >= 0 && strchr(addr, ':') != NULL) {
        snprintf(address, capacity, "%s", addr);
        free(text);
        return;
      }
      line = strchr(line, '\n');
      if (line != NULL) line++;
    }
    free(text);
    usleep(100000);
  }
  fail_msg("keel ps never showed a worker's address");
}

/* The attacks on one endpoint: a handshake with the wrong token, garbage bytes, and a
 * header announcing 2^40 bytes, which must be refused before anything is allocated. */
static void attack_endpoint(const char *address, uint64_t job_id) {
  keel_auth impostor = {.job_id = job_id, .local_id = 1};
  memset(impostor.token, 0x5a, sizeof impostor.token);
  keel_link *link = NULL;
  keel_status status =
      keel_link_connect(address, &impostor, keel_deadline_after_ns(5000000000), &link);
  if (status != KEEL_EAUTH)
    fail_msg("wrong token at %s: %s, want KEEL_EAUTH", address, keel_status_name(status));
  assert_null(link);

  uint8_t garbage[200];
  keel_random random;
  keel_random_seed(&random, 42);
  for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (uint8_t)keel_random_next(&random);
  assert_dropped_after(address, garbage, sizeof garbage, "garbage");

  keel_frame huge = {
      .type = KEEL_FRAME_HELLO, .job_id = job_id, .length = (uint64_t)1 << 40, .source = 1};
  uint8_t header[KEEL_FRAME_HEADER_BYTES];
  keel_frame_encode(&huge, header);
  assert_dropped_after(address, header, sizeof header, "a 2^40-byte frame header");
}

static void test_impostor_cannot_join(void **state) {
  (void)state;
  unsigned clean = baseline_crc();
  keel_test_job run;
  assert_true(keel_test_job_prepare(&run, "keel-comm-impostor"));
  /* 250 ms of compute per step: the job lasts ~5 s, long enough for every attack. */
  pid_t launcher = keel_test_job_start(
      &run, JOB_TIMEOUT, LIST("-n", "4"), keel_test_program("toy_train"),
      LIST("--steps", TOY_STEPS, "--params", TOY_PARAMS, "--compute-ms", "250"), NULL);
  assert_true(launcher > 0);
  uint64_t job_id = wait_for_job_id(&run);
  char worker[96];
  wait_for_worker_address(&run, job_id, worker, sizeof worker);
  /* A connection that never says hello, opened first, holds the worker's acceptor for
   * its handshake deadline: the attacks queued behind it and the job must not stall. */
  int silent = tcp_connect(worker);
  assert_true(silent >= 0);
  attack_endpoint(worker, job_id);
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  char store[96];
  const char *store_field =
      keel_test_event_field(keel_test_events_find(&log, "job_start", -1), "store");
  assert_non_null(store_field);
  snprintf(store, sizeof store, "%.*s", (int)strcspn(store_field + 1, "\""), store_field + 1);
  keel_test_events_free(&log);
  attack_endpoint(store, job_id);
  int wait_status = 0;
  if (keel_test_wait(launcher, 0, &wait_status))
    fail_msg("the job ended before the attacks were over; give it more --compute-ms");
  if (!keel_test_wait(launcher, JOB_TIMEOUT_MS, &wait_status)) fail_msg("the job did not end");
  close(silent);
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0)
    keel_test_print_file("job output", run.output);
  assert_true(WIFEXITED(wait_status));
  assert_int_equal(WEXITSTATUS(wait_status), 0);
  assert_int_equal(keel_test_toy_assert_consistent(run.output, 4, TOY_STEP_COUNT), clean);
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  assert_null(keel_test_events_find(&log, "recovery", -1));
  assert_null(keel_test_events_find(&log, "fence", -1));
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* ---- the table of cases */
static comm_check_case comm_checks[] = {
    {"comm_check_1_rank", "1"},
    {"comm_check_2_ranks", "2"},
    {"comm_check_3_ranks", "3"},
    {"comm_check_4_ranks", "4"},
};

static replace_case replaces[] = {
    {"replace_kill_in_allreduce", "kill@rank=2,step=7,point=allreduce,after=2", "1", 0},
    {"replace_kill_at_forward", "kill@rank=2,step=7,point=forward", "1", 0},
    /* The killed rank may have finished the allreduce: survivors can differ in progress and
     * the newcomer must get the state of the most advanced replica. */
    {"replace_kill_at_optimizer", "kill@rank=2,step=7,point=optimizer", "1", 0},
    /* Rank 0 dies while it sends rank 2's replacement its state: the newcomer must be
     * picked again (or another spare), not left out of the next agreement until it is
     * suspected at the collective deadline and fenced. */
    {"replace_sender_dies_during_state_transfer",
     "kill@rank=2,step=7,point=forward;kill@rank=0,point=state", "2", 5000},
};

static shrink_case shrinks[] = {
    {"shrink_single_failure", "kill@rank=1,step=5,point=allreduce,after=2", NULL, 3, 0},
    {"shrink_double_failure",
     "kill@rank=1,step=5,point=allreduce,after=2;kill@rank=3,step=12,point=forward", NULL, 2, 0},
    /* SIGSTOP: only the lapsed lease shows it; the launcher fences it within ~0.5 s. */
    {"shrink_hang_is_fenced", "stop@rank=1,step=8", "1s", 3, 8000},
    /* Rank 2 dies inside the last step's allreduce after it sent what ranks 3 and 0 needed:
     * they have the last step's result, rank 1 does not. None may leave before rank 1 has
     * the same model (keel_finish): before it, rank 1 redid the step alone, in a world of 1,
     * and finished with another model. Over tcp (test_comm_tcp): over shared memory no rank
     * gets the result before all do. */
    {"shrink_kill_in_last_collective", "kill@rank=2,step=19,point=allreduce,after=3", NULL, 3, 0},
    /* Rank 2 dies while it takes part in the agreement that follows rank 1's death. */
    {"shrink_failure_during_recovery",
     "kill@rank=1,step=6,point=allreduce,after=2;kill@rank=2,point=agree", NULL, 2, 0},
};

#define CASE_COUNT(table) (sizeof table / sizeof table[0])

/* A test of function for one case of a table, named after the case. */
static struct CMUnitTest case_test(const char *name, CMUnitTestFunction function, void *state) {
  struct CMUnitTest test = {name, function, NULL, NULL, state};
  return test;
}

/* Appends to tests (count so far) a test of function for every case of table. */
#define ADD_CASES(tests, count, function, table) \
  for (size_t i = 0; i < CASE_COUNT(table); i++) \
  tests[count++] = case_test(table[i].name, function, &table[i])

int main(void) {
  struct CMUnitTest tests[CASE_COUNT(comm_checks) + CASE_COUNT(replaces) + CASE_COUNT(shrinks) + 2];
  size_t count = 0;
  /* KEEL_TEST_FILTER=shrink_* runs only the cases it names. */
  if (getenv("KEEL_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("KEEL_TEST_FILTER"));
  ADD_CASES(tests, count, test_comm_check, comm_checks);
  ADD_CASES(tests, count, test_replace_is_exact, replaces);
  ADD_CASES(tests, count, test_shrink_is_consistent, shrinks);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_events_of_recovery);
  tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_impostor_cannot_join);
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
