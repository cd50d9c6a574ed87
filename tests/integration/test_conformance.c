/* Conformance of the public ULFM calls of include/keel/comm.h (keel_comm_revoke, _agree,
 * _shrink, _grow) under the real launcher: ulfm_check runs a scenario in every process of a
 * job while KEEL_FAULT kills members before the call, in the agreement before their vote and
 * right after it, over worlds of 1 to 4. The survivors must print identical results (the
 * same flags, failed set, epoch, size and members), the failed set must be the killed uids,
 * and the events file must show each kill where the case says it happened. Then the
 * agreement's deadline, without the launcher (which would fence a silent member): real
 * processes with a membership of the test's own, one of which never votes. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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
#define MAX_EVENTS 1024
#define MAX_LINES 16
#define MAX_VICTIMS 2
/* ulfm_check's deadline of every operation: a case that breaks fails in seconds. */
#define OPERATION_TIMEOUT_MS 5000

/* ---- the cases */
typedef struct victim {
  long uid;
  char point[32]; /* the KEEL_FAULT point it dies at */
} victim;

typedef struct ulfm_case {
  const char *name;
  const char *scenario;    /* ulfm_check --scenario */
  const char *world;       /* keel run -n */
  const char *launcher[4]; /* further launcher flags, NULL-terminated */
  const char *program[6];  /* further ulfm_check flags, NULL-terminated */
  const char *fault;       /* KEEL_FAULT (kill rules only); NULL: none */
  /* The only victim dies right after its vote while the others agree: they may decide
   * before they see it dead, and count its vote. */
  bool vote_may_count;
  /* The members the scenario ends with, in rank order. NULL: the initial world, less the
   * killed after a shrink (the old order kept); grow cases name their newcomers' places. */
  const char *members;
  /* Filled from the above when the case runs. */
  victim victims[MAX_VICTIMS];
  size_t victim_count;
  char expected[64];
} ulfm_case;

/* ---- a survivor's line: "ulfm key=value ..." */
typedef struct survivor {
  char text[2048];
  unsigned uid;
  int rank;
} survivor;

/* The value of key in line into value (capacity bytes); false when the line has none. */
static bool line_value(const char *line, const char *key, char *value, size_t capacity) {
  char pattern[48];
  snprintf(pattern, sizeof pattern, " %s=", key);
  const char *at = strstr(line, pattern);
  if (at == NULL) return false;
  at += strlen(pattern);
  size_t length = strcspn(at, " \n");
  if (length >= capacity) return false;
  memcpy(value, at, length);
  value[length] = '\0';
  return true;
}

/* The line without its uid=, rank= and setup= words (a newcomer has no setup of its own):
 * what every survivor must print alike. */
static void line_shared_part(const char *line, char *shared, size_t capacity) {
  size_t used = 0;
  for (const char *word = line; *word != '\0' && used + 1 < capacity;) {
    size_t length = strcspn(word, " ");
    bool own = strncmp(word, "uid=", 4) == 0 || strncmp(word, "rank=", 5) == 0 ||
               strncmp(word, "setup=", 6) == 0;
    if (!own && length < capacity - used - 1) {
      memcpy(shared + used, word, length);
      used += length;
      shared[used++] = ' ';
    }
    word += length + (word[length] == ' ');
  }
  shared[used < capacity ? used : capacity - 1] = '\0';
}

/* The "ulfm " lines of the job's output, in order; their number. */
static size_t survivors_read(const char *path, survivor *survivors, size_t capacity) {
  char *text = keel_test_read_file(path, NULL);
  assert_non_null(text);
  size_t count = 0;
  for (char *line = text; line != NULL && *line != '\0';) {
    char *end = strchr(line, '\n');
    if (end != NULL) *end = '\0';
    if (strncmp(line, "ulfm ", 5) == 0) {
      if (count == capacity) fail_msg("more than %zu ulfm lines in %s", capacity, path);
      survivor *found = &survivors[count++];
      snprintf(found->text, sizeof found->text, "%s", line);
      char value[32];
      if (!line_value(line, "uid", value, sizeof value)) fail_msg("no uid in: %s", line);
      found->uid = (unsigned)strtoul(value, NULL, 10);
      if (!line_value(line, "rank", value, sizeof value)) fail_msg("no rank in: %s", line);
      found->rank = atoi(value);
    }
    line = end != NULL ? end + 1 : NULL;
  }
  free(text);
  return count;
}

/* ---- lists of uids: "0,1,3"; "none" is empty */
typedef struct uid_list {
  unsigned uids[16];
  size_t count;
} uid_list;

static uid_list list_parse(const char *text) {
  uid_list list = {.count = 0};
  if (strcmp(text, "none") == 0) return list;
  for (const char *at = text; *at != '\0';) {
    char *end;
    unsigned long uid = strtoul(at, &end, 10);
    if (end == at || list.count == 16) fail_msg("bad list of uids: %s", text);
    list.uids[list.count++] = (unsigned)uid;
    at = *end == ',' ? end + 1 : end;
  }
  return list;
}

static bool list_has(const uid_list *list, unsigned uid) {
  for (size_t i = 0; i < list->count; i++) {
    if (list->uids[i] == uid) return true;
  }
  return false;
}

static uint64_t list_mask(const uid_list *list) {
  uint64_t mask = 0;
  for (size_t i = 0; i < list->count; i++) mask |= UINT64_C(1) << list->uids[i];
  return mask;
}

static bool is_victim(const ulfm_case *check, unsigned uid) {
  for (size_t i = 0; i < check->victim_count; i++) {
    if (check->victims[i].uid == (long)uid) return true;
  }
  return false;
}

/* The kill rules of the case's KEEL_FAULT ("kill@uid=U,point=P;...") into its victims. */
static void victims_parse(ulfm_case *check) {
  check->victim_count = 0;
  if (check->fault == NULL) return;
  char text[256];
  snprintf(text, sizeof text, "%s", check->fault);
  for (char *cursor = text, *rule; (rule = strsep(&cursor, ";")) != NULL;) {
    if (check->victim_count == MAX_VICTIMS || strncmp(rule, "kill@", 5) != 0)
      fail_msg("%s: the cases take at most %d kill rules", check->fault, MAX_VICTIMS);
    victim *dead = &check->victims[check->victim_count++];
    *dead = (victim){.uid = -1};
    for (char *settings = rule + 5, *setting; (setting = strsep(&settings, ",")) != NULL;) {
      if (strncmp(setting, "uid=", 4) == 0) dead->uid = strtol(setting + 4, NULL, 10);
      if (strncmp(setting, "point=", 6) == 0)
        snprintf(dead->point, sizeof dead->point, "%s", setting + 6);
    }
    if (dead->uid < 0 || dead->point[0] == '\0')
      fail_msg("%s: each rule names a uid and a point", check->fault);
  }
}

/* What the scenario must end with: see ulfm_case.members. */
static void expected_members(ulfm_case *check) {
  if (check->members != NULL) {
    snprintf(check->expected, sizeof check->expected, "%s", check->members);
    return;
  }
  bool shrink = strcmp(check->scenario, "shrink") == 0;
  size_t used = 0;
  check->expected[0] = '\0';
  for (int uid = 0; uid < atoi(check->world); uid++) {
    if (shrink && is_victim(check, (unsigned)uid)) continue;
    used += (size_t)snprintf(check->expected + used, sizeof check->expected - used,
                             used ? ",%d" : "%d", uid);
  }
}

/* The value of key in the line, asserting it is there. */
static void value_of(const survivor *line, const char *key, char *value, size_t capacity) {
  if (!line_value(line->text, key, value, capacity)) fail_msg("no %s in: %s", key, line->text);
}

static void assert_value(const survivor *line, const char *key, const char *want) {
  char value[600];
  value_of(line, key, value, sizeof value);
  if (strcmp(value, want) != 0) fail_msg("%s=%s, want %s, in: %s", key, value, want, line->text);
}

/* ---- the events: each kill happened, where the case says, to a live process */

static void assert_kills(const ulfm_case *check, const keel_test_events *log) {
  size_t faults = keel_test_events_count(log, "fault");
  if (faults != check->victim_count)
    fail_msg("%zu fault events for the %zu kills of %s", faults, check->victim_count,
             check->fault ? check->fault : "(no fault)");
  for (size_t v = 0; v < check->victim_count; v++) {
    const victim *dead = &check->victims[v];
    /* The process itself said where it was when the rule fired: it was alive there. */
    const char *fault = keel_test_events_find(log, "fault", dead->uid);
    if (fault == NULL) fail_msg("uid %ld wrote no fault event", dead->uid);
    char point[64];
    snprintf(point, sizeof point, "\"point\":\"%s\"", dead->point);
    if (strstr(fault, point) == NULL || strstr(fault, "\"action\":\"kill\"") == NULL)
      fail_msg("uid %ld: want a kill at %s, got %s", dead->uid, dead->point, fault);
    /* ... and it died of a SIGKILL after that. (Lines of the file are not in causal order:
     * the launcher may reap before it reads the pipe; t_ns is one clock for all.) */
    const char *exit_line = keel_test_events_find(log, "exit", dead->uid);
    if (exit_line == NULL) fail_msg("uid %ld has no exit event", dead->uid);
    long long fault_ns = keel_test_event_long(fault, "t_ns");
    if (strstr(exit_line, "\"status\":\"SIGKILL\"") == NULL ||
        keel_test_event_long(exit_line, "t_ns") < fault_ns)
      fail_msg("uid %ld did not die of a SIGKILL after its fault: %s", dead->uid, exit_line);
    /* A survivor that sees the victim's links close may have it fenced before the launcher
     * reaps it: a SIGKILL to a process already dying of its own, never the cause. */
    const char *fence = keel_test_events_find(log, "fence", dead->uid);
    if (fence != NULL && keel_test_event_long(fence, "t_ns") < fault_ns)
      fail_msg("uid %ld was fenced before its fault fired: %s", dead->uid, fence);
  }
  /* Nobody else was taken for dead. */
  for (size_t i = 0; i < log->count; i++) {
    if (keel_test_event_is(log->lines[i], "fence") &&
        !is_victim(check, (unsigned)keel_test_event_long(log->lines[i], "uid")))
      fail_msg("a survivor was fenced: %s", log->lines[i]);
  }
}

/* ---- the scenarios' own checks, on the (identical) line of the first survivor */

/* flags against failed: the bits cleared in the flags are the members whose vote counted,
 * and the failed set is exactly the members whose vote did not. */
static void assert_flags_name_failed(const survivor *line, const char *flags_text,
                                     const char *failed_text, const uid_list *members) {
  uint32_t flags = (uint32_t)strtoul(flags_text, NULL, 16);
  uid_list failed = list_parse(failed_text);
  uint32_t member_bits = (uint32_t)list_mask(members);
  if ((flags | member_bits) != UINT32_MAX)
    fail_msg("flags %s clear a bit no member cleared (not an AND?): %s", flags_text, line->text);
  for (size_t i = 0; i < members->count; i++) {
    unsigned uid = members->uids[i];
    bool counted = (flags & (UINT32_C(1) << uid)) == 0;
    if (counted == list_has(&failed, uid))
      fail_msg("uid %u is %s and its vote %s: %s", uid, counted ? "not failed" : "failed",
               counted ? "counted" : "did not count", line->text);
  }
}

static void assert_failed_are_victims(const ulfm_case *check, const survivor *line,
                                      const char *failed_text, bool subset) {
  uid_list failed = list_parse(failed_text);
  for (size_t i = 0; i < failed.count; i++) {
    if (!is_victim(check, failed.uids[i]))
      fail_msg("uid %u reported failed but was not killed: %s", failed.uids[i], line->text);
  }
  for (size_t v = 0; v < check->victim_count && !subset; v++) {
    if (!list_has(&failed, (unsigned)check->victims[v].uid))
      fail_msg("killed uid %ld is not in the failed set: %s", check->victims[v].uid, line->text);
  }
}

static void check_agree(const ulfm_case *check, const survivor *line) {
  uid_list members = list_parse(check->expected);
  char flags[32], failed[256], second[300];
  assert_value(line, "status", "KEEL_OK");
  value_of(line, "flags", flags, sizeof flags);
  value_of(line, "failed", failed, sizeof failed);
  assert_flags_name_failed(line, flags, failed, &members);
  /* A member that died before its vote can never count; one killed right after it may. */
  assert_failed_are_victims(check, line, failed, check->vote_may_count);
  /* The next agreement is one the victims cannot vote in: there every one is failed. */
  value_of(line, "second", second, sizeof second);
  char *colon = strchr(second, ':');
  if (colon == NULL) fail_msg("the second agreement failed: %s", line->text);
  *colon = '\0';
  assert_flags_name_failed(line, second, colon + 1, &members);
  assert_failed_are_victims(check, line, colon + 1, false);
  char epoch[8];
  value_of(line, "epoch", epoch, sizeof epoch);
  assert_string_equal(epoch, "0"); /* an agreement makes no new epoch */
}

/* The collective on the communicator the scenario ends with ran on every member, over the
 * transport this run asks for (KEEL_TRANSPORT=tcp: the run with shared memory off). */
static void assert_collective(const ulfm_case *check, const survivor *line) {
  uid_list members = list_parse(check->expected);
  char result[32], want[32];
  assert_value(line, "collective", "KEEL_OK");
  const char *transport = getenv("KEEL_TRANSPORT");
  if (members.count == 1)
    assert_value(line, "transport", "self");
  else if (transport != NULL && strcmp(transport, "tcp") == 0)
    assert_value(line, "transport", "tcp");
  value_of(line, "result", result, sizeof result);
  snprintf(want, sizeof want, "%" PRIu64, list_mask(&members));
  if (strcmp(result, want) != 0)
    fail_msg("the allreduce summed to %s, want %s (members %s): %s", result, want, check->expected,
             line->text);
}

static void check_shrink(const ulfm_case *check, const survivor *line) {
  assert_value(line, "status", "KEEL_OK");
  assert_collective(check, line);
  /* One shrink, unless a vote of the dead counted: then the collective on the first shrunk
   * communicator failed everywhere and a second shrink left the victim out. */
  char rounds[8], epoch[8];
  value_of(line, "rounds", rounds, sizeof rounds);
  value_of(line, "epoch", epoch, sizeof epoch);
  if (strcmp(rounds, "1") != 0 && !(check->vote_may_count && strcmp(rounds, "2") == 0))
    fail_msg("%s shrinks until a collective succeeded: %s", rounds, line->text);
  if (strcmp(epoch, rounds) != 0)
    fail_msg("epoch %s after %s shrinks: %s", epoch, rounds, line->text);
}

static void check_grow(const ulfm_case *check, const survivor *line) {
  assert_value(line, "status", "KEEL_OK");
  assert_value(line, "epoch", "1");
  assert_collective(check, line);
}

static void check_revoke(const ulfm_case *check, const survivor *line) {
  assert_value(line, "setup", "KEEL_OK");
  char revoked[600];
  value_of(line, "revoked", revoked, sizeof revoked);
  static const char *const operations[] = {"broadcast", "request",        "allreduce",
                                           "allgather", "reduce_scatter", "barrier",
                                           "send",      "irecv",          "health"};
  for (size_t i = 0; i < sizeof operations / sizeof operations[0]; i++) {
    char want[64];
    snprintf(want, sizeof want, "%s:KEEL_EREVOKED", operations[i]);
    if (strstr(revoked, want) == NULL)
      fail_msg("after the revoke, %s did not fail with KEEL_EREVOKED: %s", operations[i],
               line->text);
  }
  /* The agreement on the revoked communicator counted everyone. */
  uid_list members = list_parse(check->expected);
  char flags[32];
  snprintf(flags, sizeof flags, "0x%08" PRIx32, ~(uint32_t)list_mask(&members));
  assert_value(line, "flags", flags);
  assert_value(line, "failed", "none");
  assert_value(line, "status", "KEEL_OK");
  assert_value(line, "epoch", "1");
  assert_collective(check, line);
}

/* ---- one case */
static void test_ulfm(void **state) {
  ulfm_case *check = *state;
  victims_parse(check);
  expected_members(check);
  keel_test_job run;
  assert_true(keel_test_job_prepare(&run, "keel-ulfm"));
  const char *flags[8] = {"-n", check->world};
  size_t flag_count = 2;
  for (size_t i = 0; check->launcher[i] != NULL; i++) flags[flag_count++] = check->launcher[i];
  flags[flag_count] = NULL;
  char timeout[32];
  snprintf(timeout, sizeof timeout, "%d", OPERATION_TIMEOUT_MS * keel_test_slowdown());
  const char *args[12] = {"--scenario", check->scenario, "--timeout-ms", timeout};
  size_t arg_count = 4;
  for (size_t i = 0; check->program[i] != NULL; i++) args[arg_count++] = check->program[i];
  args[arg_count] = NULL;
  int code = keel_test_job_run(&run, JOB_TIMEOUT, JOB_TIMEOUT_MS, flags,
                               keel_test_program("ulfm_check"), args, check->fault);
  if (code != 0) {
    keel_test_print_file("job output", run.output);
    fail_msg("keel run exited %d", code);
  }
  keel_test_events log;
  keel_test_events_read(run.events, MAX_EVENTS, &log);
  assert_kills(check, &log);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);

  /* Exactly the members alive at the end print, each at its own rank (so once each). */
  survivor survivors[MAX_LINES];
  size_t count = survivors_read(run.output, survivors, MAX_LINES);
  uid_list members = list_parse(check->expected);
  /* An agreement leaves the dead in the communicator: they are members that print nothing. */
  size_t alive = 0;
  for (size_t i = 0; i < members.count; i++) alive += !is_victim(check, members.uids[i]);
  if (count != alive) {
    keel_test_print_file("job output", run.output);
    fail_msg("%zu survivors printed, want %zu (members %s)", count, alive, check->expected);
  }
  char first_shared[2048];
  line_shared_part(survivors[0].text, first_shared, sizeof first_shared);
  for (size_t i = 0; i < count; i++) {
    const survivor *line = &survivors[i];
    if (is_victim(check, line->uid)) fail_msg("killed uid %u printed: %s", line->uid, line->text);
    if (line->rank < 0 || (size_t)line->rank >= members.count ||
        members.uids[line->rank] != line->uid)
      fail_msg("uid %u has rank %d; the members in rank order are %s", line->uid, line->rank,
               check->expected);
    /* What the survivor did before the call (waiting for an offer, the revoke's own
     * messages) went right, where it did anything; a newcomer (a uid past the initial
     * world) did nothing before keel_start. */
    bool newcomer = line->uid >= (unsigned)atoi(check->world);
    bool has_setup = strcmp(check->scenario, "revoke") == 0 ||
                     (strcmp(check->scenario, "grow") == 0 && !newcomer);
    assert_value(line, "setup", has_setup ? "KEEL_OK" : "-");
    char shared[2048];
    line_shared_part(line->text, shared, sizeof shared);
    if (strcmp(shared, first_shared) != 0) {
      keel_test_print_file("job output", run.output);
      fail_msg("survivors disagree:\n  %s\n  %s", survivors[0].text, line->text);
    }
  }
  /* Members in the order the case gives: the old order, newcomers in their places. */
  assert_value(&survivors[0], "members", check->expected);
  char size[8];
  snprintf(size, sizeof size, "%zu", members.count);
  assert_value(&survivors[0], "size", size);
  /* --detect: the survivors saw the death through the barrier's failure before the call. */
  for (size_t i = 0; check->program[i] != NULL; i++) {
    if (strcmp(check->program[i], "--detect") == 0)
      assert_value(&survivors[0], "detected", "KEEL_EPROCFAILED");
  }
  if (strcmp(check->scenario, "agree") == 0) check_agree(check, &survivors[0]);
  if (strcmp(check->scenario, "shrink") == 0) check_shrink(check, &survivors[0]);
  if (strcmp(check->scenario, "grow") == 0) check_grow(check, &survivors[0]);
  if (strcmp(check->scenario, "revoke") == 0) check_revoke(check, &survivors[0]);
}

#define DETECT(uid) \
  { "--victim", uid, "--detect", NULL }

static ulfm_case ulfm_cases[] = {
    /* agree: the AND of every input, nobody failed */
    {.name = "agree_no_failure_2", .scenario = "agree", .world = "2"},
    {.name = "agree_no_failure_4", .scenario = "agree", .world = "4"},
    /* a member killed before the agreement, in it before its vote, and right after it */
    {.name = "agree_kill_before",
     .scenario = "agree",
     .world = "4",
     .fault = "kill@uid=2,point=before_ulfm"},
    {.name = "agree_kill_before_vote",
     .scenario = "agree",
     .world = "4",
     .fault = "kill@uid=1,point=agree"},
    {.name = "agree_kill_before_vote_2",
     .scenario = "agree",
     .world = "2",
     .fault = "kill@uid=0,point=agree"},
    {.name = "agree_kill_after_vote",
     .scenario = "agree",
     .world = "4",
     .fault = "kill@uid=3,point=voted",
     .vote_may_count = true},
    /* The survivors agree only once a barrier showed them the death: the vote the victim
     * left behind must not count. */
    {.name = "agree_kill_after_vote_seen",
     .scenario = "agree",
     .world = "4",
     .program = DETECT("3"),
     .fault = "kill@uid=3,point=voted"},
    {.name = "agree_two_kills",
     .scenario = "agree",
     .world = "4",
     .fault = "kill@uid=1,point=before_ulfm;kill@uid=2,point=agree"},
    /* shrink: the survivors in their old order, at the next epoch, and a collective works */
    {.name = "shrink_no_failure", .scenario = "shrink", .world = "3"},
    {.name = "shrink_kill_before",
     .scenario = "shrink",
     .world = "4",
     .fault = "kill@uid=2,point=before_ulfm"},
    {.name = "shrink_kill_before_vote",
     .scenario = "shrink",
     .world = "4",
     .fault = "kill@uid=0,point=agree"},
    {.name = "shrink_kill_before_vote_2",
     .scenario = "shrink",
     .world = "2",
     .fault = "kill@uid=1,point=agree"},
    {.name = "shrink_kill_after_vote",
     .scenario = "shrink",
     .world = "4",
     .fault = "kill@uid=1,point=voted",
     .vote_may_count = true},
    {.name = "shrink_kill_after_vote_seen",
     .scenario = "shrink",
     .world = "4",
     .program = DETECT("1"),
     .fault = "kill@uid=1,point=voted"},
    /* grow: a joiner at the end; a spare in the place of the member killed before */
    {.name = "grow_joiner",
     .scenario = "grow",
     .world = "3",
     .launcher = {"--max-world", "4", NULL},
     .program = {"--expect", "joiner", NULL},
     .members = "0,1,2,3"},
    {.name = "grow_joiner_from_1",
     .scenario = "grow",
     .world = "1",
     .launcher = {"--max-world", "2", NULL},
     .program = {"--expect", "joiner", NULL},
     .members = "0,1"},
    {.name = "grow_spare_replaces",
     .scenario = "grow",
     .world = "3",
     .launcher = {"--spares", "1", NULL},
     .program = {"--expect", "spare", NULL},
     .fault = "kill@uid=1,point=before_ulfm",
     .members = "0,3,2"},
    /* revoke: pending and later operations fail everywhere; agree and shrink still work */
    {.name = "revoke_4", .scenario = "revoke", .world = "4", .program = {"--root", "1", NULL}},
    {.name = "revoke_2", .scenario = "revoke", .world = "2", .program = {"--root", "0", NULL}},
};

/* ---- the agreement's deadline, without the launcher. Members are forked before the store
 * server starts its threads, and learn its address through a pipe; each reports one line
 * through another. */
#define DEADLINE_MEMBERS 3
#define DEADLINE_TIMEOUT_MS 1000
/* src/comm/agree.c's DECIDER_GRACE_NS: how long the others wait for the first member. */
#define DECIDER_GRACE_MS 20
#define SETUP_TIMEOUT_MS 20000
/* The late case's store outage: longer than the deadline, so that the members that voted
 * find it passed by wall time when the store answers again; the late member votes this long
 * after (time in which their first looks find its vote missing). */
#define STORE_OUTAGE_MS 1500
#define LATE_VOTE_MS 200

typedef struct deadline_case {
  const char *name;
  long silent;  /* the uid that never calls agree; -1: every member does */
  long stalled; /* the uid that stops (SIGSTOP) right after its vote is written; -1: none */
  /* The uid that calls agree only after the others voted and the store was stopped for
   * STORE_OUTAGE_MS; -1: none, and the store server runs in this process. */
  long late;
  /* What to clean up on every path (the teardown does it after a failed assertion). */
  pid_t pids[DEADLINE_MEMBERS];
  keel_store_server *server;
  pid_t store_pid;   /* the late case's store process */
  int store_hold_fd; /* its hold pipe's write end: closing it (or exiting) ends the process */
} deadline_case;

/* The membership a member gives its endpoint: addresses from the store, nobody ever dead,
 * nothing ever interrupts; suspicions are only written down. */
typedef struct member_context {
  keel_store *store;
  uint32_t suspected[DEADLINE_MEMBERS];
  int suspected_count;
} member_context;

static keel_status member_address(void *context, uint32_t uid, char *address, size_t capacity) {
  member_context *member = context;
  char key[32];
  snprintf(key, sizeof key, "addr/%" PRIu32, uid);
  keel_store_entry *entry = NULL;
  keel_status status = keel_store_get(member->store, key, &entry);
  if (status != KEEL_OK) return status;
  if (entry->value_length < capacity)
    memcpy(address, entry->value, entry->value_length + 1);
  else
    status = KEEL_ERANGE;
  keel_store_entry_free(entry);
  return status;
}

/* Called from the progress loop too: it must not block, so it only writes the uid down. */
static void member_suspect(void *context, uint32_t uid, const char *reason) {
  member_context *member = context;
  for (int i = 0; i < member->suspected_count; i++) {
    if (member->suspected[i] == uid) return;
  }
  if (member->suspected_count < DEADLINE_MEMBERS)
    member->suspected[member->suspected_count++] = uid;
}

static bool member_dead(void *context, uint32_t uid) { return false; }

static int member_node(void *context, uint32_t uid) { return -1; }

static keel_status member_interrupted(void *context) { return KEEL_OK; }

static const keel_membership_ops member_ops = {
    .address = member_address,
    .suspect = member_suspect,
    .dead = member_dead,
    .node = member_node,
    .interrupted = member_interrupted,
};

static int64_t setup_deadline(void) {
  return keel_deadline_after_ns((int64_t)SETUP_TIMEOUT_MS * keel_test_slowdown() * 1000000);
}

/* Reads one line (the store's address) from fd by deadline; false if none came. */
static bool pipe_read_line(int fd, char *line, size_t capacity, int64_t deadline_ns) {
  size_t used = 0;
  while (used + 1 < capacity) {
    struct pollfd poller = {.fd = fd, .events = POLLIN};
    int ready = poll(&poller, 1, keel_poll_timeout_ms(deadline_ns));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    ssize_t got = read(fd, line + used, 1);
    if (got <= 0) return false;
    if (line[used] == '\n') {
      line[used] = '\0';
      return true;
    }
    used++;
  }
  return false;
}

/* The members that come out of the agreement and report: all but the silent and the
 * stalled one. */
static size_t reporting_voters(const deadline_case *check) {
  return DEADLINE_MEMBERS - (check->silent >= 0) - (check->stalled >= 0);
}

/* Waits, bounded, until the store holds at least wanted keys under prefix. */
static keel_status wait_for_keys(keel_store *store, const char *prefix, size_t wanted,
                                 int64_t deadline_ns) {
  for (;;) {
    keel_store_entry *entries = NULL;
    size_t count = 0;
    uint64_t revision = 0;
    keel_status status = keel_store_list(store, prefix, &entries, &count, &revision);
    if (status != KEEL_OK) return status;
    keel_store_entries_free(entries, count);
    if (count >= wanted) return KEEL_OK;
    status = keel_store_wait(store, prefix, revision, deadline_ns, NULL);
    if (status != KEEL_OK) return status;
  }
}

/* Waits, bounded, until every reporting voter said it is done (a done/<uid> key each). */
static keel_status wait_for_voters(keel_store *store, const deadline_case *check,
                                   int64_t deadline_ns) {
  return wait_for_keys(store, "done/", reporting_voters(check), deadline_ns);
}

/* One member, in a forked child: joins the communicator of every member over the store whose
 * address comes through address_fd, then agrees (or, the silent one, waits for the others)
 * and writes "member uid=U status=NAME elapsed_ms=N suspected=LIST flags=0xX" to report_fd.
 * Never returns. */
static void member_main(uint32_t uid, const deadline_case *check, const keel_auth *job_auth,
                        int address_fd, int report_fd) {
  long silent = check->silent;
  member_context member = {.store = NULL};
  keel_fault_plan *faults = NULL;
  keel_endpoint *endpoint = NULL;
  keel_comm *comm = NULL;
  char address[128] = "", text[64];
  const char *stage = "address";
  keel_status status = pipe_read_line(address_fd, address, sizeof address, setup_deadline())
                           ? KEEL_OK
                           : KEEL_ETIMEDOUT;
  keel_auth auth = *job_auth;
  auth.local_id = uid;
  if (status == KEEL_OK) {
    stage = "store";
    status = keel_store_connect(address, &auth, setup_deadline(), &member.store);
  }
  if (status == KEEL_OK && (long)uid == check->stalled) {
    stage = "faults";
    char rule[64];
    snprintf(rule, sizeof rule, "stop@uid=%" PRIu32 ",point=voted", uid);
    status = keel_fault_plan_create(rule, uid, &faults);
  }
  if (status == KEEL_OK) {
    stage = "endpoint";
    keel_endpoint_config config = {.uid = uid,
                                   .auth = auth,
                                   .store = member.store,
                                   .failure_detection = true,
                                   .faults = faults,
                                   .membership = &member_ops,
                                   .membership_context = &member};
    status = keel_endpoint_create(&config, &endpoint);
  }
  if (status == KEEL_OK) {
    snprintf(text, sizeof text, "addr/%" PRIu32, uid);
    const char *mine = keel_endpoint_address(endpoint);
    status = keel_store_put(member.store, text, mine, strlen(mine), 0, NULL);
  }
  uint32_t uids[DEADLINE_MEMBERS];
  for (uint32_t i = 0; i < DEADLINE_MEMBERS; i++) uids[i] = i;
  if (status == KEEL_OK) {
    stage = "comm";
    status = keel_comm_create(endpoint, 0, uids, DEADLINE_MEMBERS, setup_deadline(), &comm);
  }
  char line[256];
  if (status != KEEL_OK) {
    snprintf(line, sizeof line, "member uid=%" PRIu32 " setup=%s:%s\n", uid, stage,
             keel_status_name(status));
  } else if ((long)uid == silent) {
    /* Never touching the agreement, alive all through it. */
    status = wait_for_voters(member.store, check, setup_deadline());
    snprintf(line, sizeof line, "member uid=%" PRIu32 " silent=%s\n", uid,
             keel_status_name(status));
  } else {
    /* The late member votes after the store's outage, when the others' looks have found
     * its vote missing past their deadline by wall time. */
    if ((long)uid == check->late &&
        wait_for_keys(member.store, "resumed", 1, setup_deadline()) == KEEL_OK)
      usleep(LATE_VOTE_MS * 1000);
    keel_comm_set_timeout(comm, (int64_t)DEADLINE_TIMEOUT_MS * 1000000);
    uint32_t flags = ~(UINT32_C(1) << uid), failed[DEADLINE_MEMBERS];
    size_t failed_count = 0;
    int64_t started = keel_now_ns();
    status = keel_comm_agree(comm, &flags, failed, DEADLINE_MEMBERS, &failed_count);
    int64_t elapsed_ms = (keel_now_ns() - started) / 1000000;
    snprintf(text, sizeof text, "done/%" PRIu32, uid);
    keel_store_put(member.store, text, "", 0, 0, NULL);
    char suspected[64] = "none";
    for (int i = 0, used = 0; i < member.suspected_count; i++)
      used += snprintf(suspected + used, sizeof suspected - (size_t)used,
                       i ? ",%" PRIu32 : "%" PRIu32, member.suspected[i]);
    snprintf(line, sizeof line,
             "member uid=%" PRIu32 " status=%s elapsed_ms=%" PRId64
             " suspected=%s flags=0x%08" PRIx32 "\n",
             uid, keel_status_name(status), elapsed_ms, suspected, flags);
  }
  ssize_t ignored = write(report_fd, line, strlen(line));
  (void)ignored;
  /* A link that closes while another member still agrees would be suspected there: nobody
   * leaves before every voter is done. */
  if (member.store != NULL && (long)uid != silent)
    wait_for_voters(member.store, check, setup_deadline());
  keel_endpoint_close(endpoint, 0);
  keel_store_close(member.store);
  keel_fault_plan_destroy(faults);
  _exit(0);
}

/* Kills (by pid) and reaps every member still there, and stops the server: every path. */
static void deadline_cleanup(deadline_case *check) {
  for (int i = 0; i < DEADLINE_MEMBERS; i++) {
    if (check->pids[i] <= 0) continue;
    kill(check->pids[i], SIGKILL);
    waitpid(check->pids[i], NULL, 0);
    check->pids[i] = 0;
  }
  keel_store_server_stop(check->server);
  check->server = NULL;
  if (check->store_pid > 0) {
    kill(check->store_pid, SIGKILL);
    waitpid(check->store_pid, NULL, 0);
    check->store_pid = 0;
  }
  if (check->store_hold_fd > 0) close(check->store_hold_fd);
  check->store_hold_fd = 0;
}

static int deadline_teardown(void **state) {
  deadline_cleanup(*state);
  return 0;
}

/* Reads up to expected report lines of the members by deadline into reports. */
static int reports_read(int fd, char reports[][256], int expected, int64_t deadline_ns) {
  int count = 0;
  char buffer[1024];
  size_t used = 0;
  while (count < expected) {
    struct pollfd poller = {.fd = fd, .events = POLLIN};
    int ready = poll(&poller, 1, keel_poll_timeout_ms(deadline_ns));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    ssize_t got = read(fd, buffer + used, sizeof buffer - used - 1);
    if (got <= 0) break; /* every member closed its end */
    used += (size_t)got;
    char *newline;
    while (count < expected && (newline = memchr(buffer, '\n', used)) != NULL) {
      size_t length = (size_t)(newline - buffer);
      snprintf(reports[count++], 256, "%.*s", (int)length, buffer);
      memmove(buffer, newline + 1, used - length - 1);
      used -= length + 1;
    }
  }
  return count;
}

/* pid's state letter from /proc ('T': stopped); 0 when it is no more. */
static char process_state_of(pid_t pid) {
  char state = 0;
  int parent = 0;
  return keel_process_stat(pid, &state, &parent) == KEEL_OK ? state : 0;
}

static const char *report_of(char reports[][256], int count, uint32_t uid) {
  char prefix[32];
  snprintf(prefix, sizeof prefix, "member uid=%" PRIu32 " ", uid);
  for (int i = 0; i < count; i++) {
    if (strncmp(reports[i], prefix, strlen(prefix)) == 0) return reports[i];
  }
  return NULL;
}

/* Starts a store server on loopback and writes its address into address ("" if none). */
static keel_status store_serve(const keel_auth *auth, keel_store_server **server_p, char *address,
                               size_t capacity) {
  address[0] = '\0';
  keel_status status = keel_store_server_start("127.0.0.1:0", auth, server_p);
  if (status == KEEL_OK) snprintf(address, capacity, "%s", keel_store_server_address(*server_p));
  return status;
}

/* The late case's store, in a process of its own so that the test can stop it: writes its
 * address (or an empty line) to address_fd, then serves until hold_fd reads end of file.
 * Never returns. */
static void store_main(const keel_auth *auth, int address_fd, int hold_fd) {
  keel_store_server *server = NULL;
  char address[160];
  store_serve(auth, &server, address, sizeof address - 1);
  strcat(address, "\n");
  ssize_t ignored = write(address_fd, address, strlen(address));
  (void)ignored;
  char byte;
  while (server != NULL && read(hold_fd, &byte, 1) < 0 && errno == EINTR) continue;
  keel_store_server_stop(server);
  _exit(0);
}

/* Starts the job's store, in this process or (the late case) in a forked one, and writes its
 * address into address ("" when it did not start). */
static keel_status deadline_store_start(deadline_case *check, const keel_auth *auth, char *address,
                                        size_t capacity) {
  address[0] = '\0';
  if (check->late < 0) return store_serve(auth, &check->server, address, capacity);
  int address_pipe[2], hold_pipe[2];
  if (pipe(address_pipe) != 0) return KEEL_EIO;
  if (pipe(hold_pipe) != 0) goto fail_close_address_pipe;
  fflush(NULL);
  check->store_pid = fork();
  if (check->store_pid == 0) {
    close(address_pipe[0]);
    close(hold_pipe[1]);
    store_main(auth, address_pipe[1], hold_pipe[0]);
  }
  /* The hold pipe's write end stays open here until the cleanup: should this process die
   * before it, the store's process reads end of file and ends too. */
  close(hold_pipe[0]);
  check->store_hold_fd = hold_pipe[1];
  bool got = check->store_pid > 0 &&
             pipe_read_line(address_pipe[0], address, capacity, setup_deadline()) &&
             address[0] != '\0';
  close(address_pipe[0]);
  close(address_pipe[1]);
  return got ? KEEL_OK : KEEL_EIO;

fail_close_address_pipe:
  close(address_pipe[0]);
  close(address_pipe[1]);
  return KEEL_EIO;
}

/* The late case's outage: once every member but the late one has voted, stops the store's
 * process for STORE_OUTAGE_MS, continues it and writes "resumed" (the late member's cue).
 * The process's state seen while it was stopped goes to *state_p ('T': the stop hit). */
static keel_status store_outage(const deadline_case *check, const keel_auth *job_auth,
                                const char *address, char *state_p) {
  keel_auth auth = *job_auth;
  auth.local_id = DEADLINE_MEMBERS;
  keel_store *store = NULL;
  keel_status status = keel_store_connect(address, &auth, setup_deadline(), &store);
  if (status == KEEL_OK)
    status = wait_for_keys(store, "agree/", DEADLINE_MEMBERS - 1, setup_deadline());
  if (status == KEEL_OK && kill(check->store_pid, SIGSTOP) != 0) status = KEEL_EIO;
  if (status == KEEL_OK) {
    int64_t stopped_by = keel_deadline_after_ns(1000000000);
    while ((*state_p = process_state_of(check->store_pid)) != 'T' && keel_now_ns() < stopped_by)
      usleep(1000);
    usleep(STORE_OUTAGE_MS * 1000);
    kill(check->store_pid, SIGCONT);
    status = keel_store_put(store, "resumed", "", 0, 0, NULL);
  }
  keel_store_close(store);
  return status;
}

static void test_agree_deadline(void **state) {
  deadline_case *check = *state;
  keel_auth auth;
  assert_int_equal(keel_auth_generate(&auth), KEEL_OK);
  int address_pipes[DEADLINE_MEMBERS][2], report_pipe[2];
  assert_int_equal(pipe(report_pipe), 0);
  for (int i = 0; i < DEADLINE_MEMBERS; i++) assert_int_equal(pipe(address_pipes[i]), 0);
  fflush(NULL);
  for (int i = 0; i < DEADLINE_MEMBERS; i++) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      /* Only its own address pipe's read end and the report pipe's write end. */
      for (int j = 0; j < DEADLINE_MEMBERS; j++) {
        close(address_pipes[j][1]);
        if (j != i) close(address_pipes[j][0]);
      }
      close(report_pipe[0]);
      member_main((uint32_t)i, check, &auth, address_pipes[i][0], report_pipe[1]);
    }
    check->pids[i] = pid;
  }
  close(report_pipe[1]);
  for (int i = 0; i < DEADLINE_MEMBERS; i++) close(address_pipes[i][0]);
  char address[160];
  keel_status started = deadline_store_start(check, &auth, address, sizeof address);
  for (int i = 0; i < DEADLINE_MEMBERS; i++) {
    /* No line (no server) leaves the members without an address: they report it. */
    if (started == KEEL_OK) {
      ssize_t ignored = write(address_pipes[i][1], address, strlen(address));
      ignored = write(address_pipes[i][1], "\n", 1);
      (void)ignored;
    }
    close(address_pipes[i][1]);
  }
  char store_state = 0;
  keel_status outage = check->late >= 0 && started == KEEL_OK
                           ? store_outage(check, &auth, address, &store_state)
                           : KEEL_OK;
  /* The members must all be done within: the setup, two deadlines and a wide margin. */
  int64_t deadline = keel_deadline_after_ns(
      ((int64_t)SETUP_TIMEOUT_MS * keel_test_slowdown() + 4 * DEADLINE_TIMEOUT_MS) * 1000000);
  char reports[DEADLINE_MEMBERS][256];
  int expected = check->silent >= 0 ? DEADLINE_MEMBERS : (int)reporting_voters(check);
  int count = reports_read(report_pipe[0], reports, expected, deadline);
  close(report_pipe[0]);
  /* The fault hit: the stalled member is stopped, not gone, while the others reported. */
  char stalled_state = check->stalled >= 0 ? process_state_of(check->pids[check->stalled]) : 0;
  deadline_cleanup(check);
  assert_int_equal(started, KEEL_OK);
  for (int i = 0; i < count; i++) fprintf(stderr, "  %s\n", reports[i]);
  if (count != expected) fail_msg("%d of %d members reported", count, expected);
  assert_int_equal(outage, KEEL_OK);
  if (check->late >= 0 && store_state != 'T')
    fail_msg("the store's process was in state '%c', not stopped", store_state);
  if (check->stalled >= 0 && stalled_state != 'T')
    fail_msg("uid %ld is in state '%c', not stopped after its vote", check->stalled, stalled_state);

  int slack_ms = 1000 * keel_test_slowdown();
  long long slowest_ms = -1;
  for (uint32_t uid = 0; uid < DEADLINE_MEMBERS; uid++) {
    const char *report = report_of(reports, count, uid);
    if ((long)uid == check->stalled) {
      if (report != NULL) fail_msg("the stalled member reported: %s", report);
      continue;
    }
    if (report == NULL) fail_msg("no report from uid %" PRIu32, uid);
    if ((long)uid == check->silent) {
      /* Alive and silent through the whole agreement, then done in order. */
      if (strstr(report, "silent=KEEL_OK") == NULL) fail_msg("the silent member: %s", report);
      continue;
    }
    char status[32], suspected[64];
    long long elapsed_ms = -1;
    if (sscanf(report, "member uid=%*u status=%31s elapsed_ms=%lld suspected=%63s", status,
               &elapsed_ms, suspected) != 3)
      fail_msg("uid %" PRIu32 ": %s", uid, report);
    if (check->stalled >= 0) {
      /* uid 0, first in rank order, settles rounds; it stopped right after its vote. The
       * others wait out the decider's grace (20 ms), then settle it themselves, its vote
       * counted (it is alive): well before the deadline, and with nobody suspected. */
      assert_string_equal(status, "KEEL_OK");
      assert_string_equal(suspected, "none");
      assert_non_null(strstr(report, "flags=0xfffffff8"));
      if (elapsed_ms >= DEADLINE_TIMEOUT_MS)
        fail_msg("agreed in %lld ms, want under %d: %s", elapsed_ms, DEADLINE_TIMEOUT_MS, report);
      /* Only the member that settled waited a whole grace by its own clock: one that began
       * later may adopt that decision sooner by its own. */
      if (elapsed_ms > slowest_ms) slowest_ms = elapsed_ms;
      continue;
    }
    if (check->late >= 0) {
      /* Nobody could vote while the store was stopped: silence counts only over the time it
       * answered, so the late member is suspected by nobody. Those that voted before the
       * outage waited through it, past their deadline by wall time. */
      assert_string_equal(status, "KEEL_OK");
      assert_string_equal(suspected, "none");
      assert_non_null(strstr(report, "flags=0xfffffff8"));
      if ((long)uid != check->late && elapsed_ms < STORE_OUTAGE_MS)
        fail_msg("agreed in %lld ms, within the store's outage of %d ms: %s", elapsed_ms,
                 STORE_OUTAGE_MS, report);
      continue;
    }
    if (check->silent < 0) {
      /* The control: the same setup agrees at once when nobody is silent. */
      assert_string_equal(status, "KEEL_OK");
      assert_string_equal(suspected, "none");
      assert_non_null(strstr(report, "flags=0xfffffff8"));
      if (elapsed_ms >= DEADLINE_TIMEOUT_MS) fail_msg("took a deadline to agree: %s", report);
      continue;
    }
    /* The first deadline suspects the silent member, the second gives up: no earlier than
     * two deadlines, and not much later. */
    if (strcmp(status, "KEEL_ETIMEDOUT") != 0) fail_msg("want KEEL_ETIMEDOUT: %s", report);
    if (elapsed_ms < 2 * DEADLINE_TIMEOUT_MS || elapsed_ms > 2 * DEADLINE_TIMEOUT_MS + slack_ms)
      fail_msg("gave up after %lld ms, want %d..%d: %s", elapsed_ms, 2 * DEADLINE_TIMEOUT_MS,
               2 * DEADLINE_TIMEOUT_MS + slack_ms, report);
    char want[16];
    snprintf(want, sizeof want, "%ld", check->silent);
    if (strcmp(suspected, want) != 0)
      fail_msg("suspected %s, want exactly the silent uid %s: %s", suspected, want, report);
  }
  if (check->stalled >= 0 && slowest_ms < DECIDER_GRACE_MS)
    fail_msg("settled in %lld ms, before the decider's grace of %d ms ended", slowest_ms,
             DECIDER_GRACE_MS);
}

static deadline_case deadline_cases[] = {
    {"agree_deadline_silent_member", 2, -1, -1, {0}, NULL, 0, 0},
    {"agree_deadline_control", -1, -1, -1, {0}, NULL, 0, 0},
    {"agree_decider_stalls_after_its_vote", -1, 0, -1, {0}, NULL, 0, 0},
    {"agree_store_stopped_before_a_vote", -1, -1, 1, {0}, NULL, 0, 0},
};

#define CASE_COUNT(table) (sizeof table / sizeof table[0])

int main(void) {
  struct CMUnitTest tests[CASE_COUNT(ulfm_cases) + CASE_COUNT(deadline_cases)];
  size_t count = 0;
  for (size_t i = 0; i < CASE_COUNT(ulfm_cases); i++)
    tests[count++] = (struct CMUnitTest){ulfm_cases[i].name, test_ulfm, NULL, NULL, &ulfm_cases[i]};
  for (size_t i = 0; i < CASE_COUNT(deadline_cases); i++)
    tests[count++] = (struct CMUnitTest){deadline_cases[i].name, test_agree_deadline, NULL,
                                         deadline_teardown, &deadline_cases[i]};
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
