/* Unit tests of what `keel chaos` concludes from a job's events file: which processes a node's
 * fence killed, which injected partition (if any) explains that fence, how long the job stood
 * still with no failure to explain it, and which steps it committed how often. The events are
 * written by the test, so each case pins down one timing that a soak met only by chance. */
#include <arpa/inet.h>
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "chaos.h"
#include "test_support.h"

#define MS 1000000LL

/* Node 2: an agent of an earlier life and a worker of it (uid 3, never an exit event: it
 * died with that agent), the current agent, two workers (uids 4, 5), one that exited
 * in an orderly way (uid 7); node 3: a worker (uid 6). */
static const char node_lives[] =
    "{\"event\":\"agent_spawn\",\"node\":2,\"pid\":0,\"t_ns\":10000000}\n"
    "{\"event\":\"spawn\",\"node\":2,\"uid\":3,\"pid\":0,\"role\":\"worker\",\"t_ns\":50000000}\n"
    "{\"event\":\"agent_spawn\",\"node\":2,\"pid\":0,\"t_ns\":100000000}\n"
    "{\"event\":\"spawn\",\"node\":2,\"uid\":4,\"pid\":0,\"role\":\"worker\",\"t_ns\":200000000}\n"
    "{\"event\":\"spawn\",\"node\":2,\"uid\":5,\"pid\":0,\"role\":\"worker\",\"t_ns\":200000000}\n"
    "{\"event\":\"spawn\",\"node\":2,\"uid\":7,\"pid\":0,\"role\":\"worker\",\"t_ns\":200000000}\n"
    "{\"event\":\"spawn\",\"node\":3,\"uid\":6,\"pid\":0,\"role\":\"worker\",\"t_ns\":200000000}\n"
    "{\"event\":\"exit\",\"uid\":7,\"code\":0,\"t_ns\":900000000}\n";

typedef struct observed {
  keel__chaos_run *run;
  keel__chaos_failure partition;
} observed;

/* A partition of node 2 injected at 1 s and healed at healed_ms (0: not healed). */
static void partition_set(keel__chaos_failure *partition, int64_t healed_ms) {
  *partition = (keel__chaos_failure){.kind = KEEL__CHAOS_PARTITION,
                                     .node = 2,
                                     .injected = true,
                                     .injected_ns = 1000 * MS,
                                     .healed_ns = healed_ms * MS,
                                     .detect_ns = -1,
                                     .recover_ns = -1};
}

/* Reads text as the events written since the last read, the way chaos does while a job runs. */
static void events_read(observed *o, const char *text) {
  o->run->events = fmemopen((void *)text, strlen(text), "r");
  assert_non_null(o->run->events);
  keel__chaos_events_read(o->run, &o->partition, 1);
  fclose(o->run->events);
  o->run->events = NULL;
}

static int setup(void **state) {
  observed *o = calloc(1, sizeof *o);
  if (o == NULL || (o->run = calloc(1, sizeof *o->run)) == NULL) return -1;
  *state = o;
  return 0;
}

static int teardown(void **state) {
  observed *o = *state;
  keel__chaos_run_clear(o->run);
  free(o->run);
  free(o);
  return 0;
}

static void assert_victims(const keel__chaos_failure *failure, const uint32_t *uids, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (!keel__chaos_failure_hit(failure, uids[i]))
      fail_msg("uid %u is not among the partition's victims", (unsigned)uids[i]);
  assert_int_equal(failure->victim_count, count);
}

/* The soak's finding 28: the link healed at 2.5 s, the agent started a process at 2.6 s, and
 * fenced at 2.7 s, its lease silent since 1.45 s (a keepalive lost to the cut): the fence and
 * every process it killed are the partition's, the one born after the heal included, and none
 * of an earlier life of the node, of another node, or that had exited. */
static void test_fence_just_after_heal_is_the_partitions(void **state) {
  observed *o = *state;
  partition_set(&o->partition, 2500);
  events_read(o, node_lives);
  events_read(o,
              "{\"event\":\"spawn\",\"node\":2,\"uid\":9,\"pid\":0,\"role\":\"spare\","
              "\"t_ns\":2600000000}\n"
              "{\"event\":\"node_fence\",\"node\":2,\"silent_ms\":1250.0,\"ttl_ms\":2000.0,"
              "\"killed\":3,\"dead\":3,\"fenced_ms\":1251.0,\"t_ns\":2700000000}\n"
              "{\"event\":\"exit\",\"uid\":9,\"signal\":\"SIGKILL\",\"t_ns\":2710000000}\n");
  const uint32_t victims[] = {4, 5, 9};
  assert_victims(&o->partition, victims, 3);
}

/* A fence whose silence began after the link healed is no partition's: nothing explains the
 * deaths it caused, and the chaos verdict must see them as false. */
static void test_fence_after_a_healed_silence_is_unexplained(void **state) {
  observed *o = *state;
  partition_set(&o->partition, 2500);
  events_read(o, node_lives);
  events_read(o,
              "{\"event\":\"node_fence\",\"node\":2,\"silent_ms\":1250.0,\"t_ns\":5000000000}\n");
  assert_victims(&o->partition, NULL, 0);
}

/* A fence of another node than the partitioned one, and a fence before the partition began,
 * are not the partition's either. */
static void test_fence_of_another_node_or_before_is_unexplained(void **state) {
  observed *o = *state;
  partition_set(&o->partition, 0);
  events_read(o, node_lives);
  events_read(o,
              "{\"event\":\"node_fence\",\"node\":2,\"silent_ms\":1250.0,\"t_ns\":900000000}\n"
              "{\"event\":\"node_fence\",\"node\":3,\"silent_ms\":1250.0,\"t_ns\":2000000000}\n");
  assert_victims(&o->partition, NULL, 0);
}

/* A partition longer than the lease: the node fences while still cut off. */
static void test_fence_during_the_partition_is_its(void **state) {
  observed *o = *state;
  partition_set(&o->partition, 0);
  events_read(o, node_lives);
  events_read(o,
              "{\"event\":\"node_fence\",\"node\":2,\"silent_ms\":1250.0,\"t_ns\":2300000000}\n");
  const uint32_t victims[] = {4, 5};
  assert_victims(&o->partition, victims, 2);
}

/* A partition of node 2 from 1 s, healed at 2.5 s unseen (shorter than the lease): its
 * victims live on. A recovery at 40 s that lists uid 4 (killed then with its node by
 * something else) is past the partition's aftermath, and must not end it: the partition's
 * recovery time would read 39 s. One within the aftermath does. */
static void test_recovery_after_a_partitions_aftermath_is_not_its(void **state) {
  observed *o = *state;
  partition_set(&o->partition, 2500);
  o->partition.aftermath_end_ns = (2500 + 4000 + 10000) * MS;
  o->partition.victims[0] = 4;
  o->partition.victims[1] = 5;
  o->partition.victim_count = 2;
  events_read(o, node_lives);
  events_read(o,
              "{\"event\":\"recovery\",\"policy\":\"replace\",\"failed\":[4,5],"
              "\"t_detect_ns\":39900000000,\"t_ns\":40000000000}\n");
  assert_int_equal(o->partition.recover_ns, -1);
  events_read(o,
              "{\"event\":\"recovery\",\"policy\":\"replace\",\"failed\":[4],"
              "\"t_detect_ns\":5900000000,\"t_ns\":6000000000}\n");
  assert_int_equal(o->partition.recover_ns, 5000 * MS);
  assert_int_equal(o->partition.detect_ns, 4900 * MS);
}

/* Finding 42: a replace that found no spare ready shrank a job of three to one rank; chaos
 * counted the three it started with and stopped the one left. The world is the latest
 * recovery's until a grow takes it back, never more than the job started with. */
static void test_the_world_is_the_latest_recoveries(void **state) {
  observed *o = *state;
  assert_int_equal(keel__chaos_world_now(o->run, 3), 3);
  events_read(o,
              "{\"event\":\"recovery\",\"policy\":\"replace\",\"failed\":[1,2],"
              "\"old_world\":3,\"new_world\":1,\"t_ns\":6000000000}\n");
  assert_int_equal(keel__chaos_world_now(o->run, 3), 1);
  events_read(o,
              "{\"event\":\"recovery\",\"policy\":\"grow\",\"failed\":[],"
              "\"old_world\":1,\"new_world\":3,\"t_ns\":7000000000}\n");
  assert_int_equal(keel__chaos_world_now(o->run, 3), 3);
  events_read(o,
              "{\"event\":\"recovery\",\"policy\":\"grow\",\"failed\":[],"
              "\"old_world\":3,\"new_world\":4,\"t_ns\":8000000000}\n");
  assert_int_equal(keel__chaos_world_now(o->run, 3), 3);
}

/* A progress line of rank 0 at ms. */
static const char *progress_at(char *line, size_t size, int64_t ms) {
  snprintf(line, size, "{\"event\":\"progress\",\"uid\":0,\"rank\":0,\"step\":1,\"t_ns\":%lld}\n",
           (long long)(ms * MS));
  return line;
}

/* The job's stillness is counted from the later of the last progress and the last failure
 * (or its undo, for one that lasts) or declared section's end: a failure that stops the job
 * for a while is what chaos asked for; stillness with none explains it is a wait past a
 * deadline. */
static void test_stillness_is_counted_from_the_last_failure(void **state) {
  observed *o = *state;
  char line[160];
  /* A kill at 1.15 s between progress at 1.1 s and at 3 s: still for 1.85 s. */
  o->partition = (keel__chaos_failure){.kind = KEEL__CHAOS_KILL,
                                       .injected = true,
                                       .injected_ns = 1150 * MS,
                                       .hold_ns = 700 * MS, /* drawn for every kind: not used */
                                       .detect_ns = -1,
                                       .recover_ns = -1};
  events_read(o, progress_at(line, sizeof line, 1000));
  events_read(o, progress_at(line, sizeof line, 1100));
  events_read(o, progress_at(line, sizeof line, 3000));
  assert_int_equal(o->run->still_longest_ns, 1850 * MS);
  assert_int_equal(o->run->still_end_ns, 3000 * MS);
  /* A partition from 4 s, healed 2 s later: from progress at 3.1 s to 6.5 s, still since the
   * heal, 0.5 s, which is less. */
  partition_set(&o->partition, 0);
  o->partition.injected_ns = 4000 * MS;
  o->partition.hold_ns = 2000 * MS;
  events_read(o, progress_at(line, sizeof line, 3100));
  events_read(o, progress_at(line, sizeof line, 6500));
  assert_int_equal(o->run->still_longest_ns, 1850 * MS);
  /* A section that ended at 8 s, progress at 7 s and 8.3 s: still 0.3 s after it. */
  events_read(o, progress_at(line, sizeof line, 7000));
  events_read(o, "{\"event\":\"section_end\",\"uid\":1,\"t_ns\":8000000000}\n");
  events_read(o, progress_at(line, sizeof line, 8300));
  assert_int_equal(o->run->still_longest_ns, 1850 * MS);
  /* Nothing between 9 s and 14 s: 5 s still, the longest. */
  events_read(o, progress_at(line, sizeof line, 9000));
  events_read(o, progress_at(line, sizeof line, 14000));
  assert_int_equal(o->run->still_longest_ns, 5000 * MS);
  assert_int_equal(o->run->still_end_ns, 14000 * MS);
}

/* `wait_late` lines as a worker and the launcher write them (keel_waits_late_format): the
 * counts add up by kind, and the worst of all is kept with its kind. */
static void test_late_waits_add_up(void **state) {
  observed *o = *state;
  keel_waits_late late = {.count = {[KEEL_WAIT_COLLECTIVE] = 2},
                          .worst_ns = {[KEEL_WAIT_COLLECTIVE] = 2000 * MS}};
  char fields[224], line[320];
  keel_waits_late_format(&late, fields, sizeof fields);
  snprintf(line, sizeof line, "{\"event\":\"wait_late\",\"uid\":1,\"t_ns\":1,%s}\n", fields);
  events_read(o, line);
  late = (keel_waits_late){
      .count = {[KEEL_WAIT_STORE] = 1, [KEEL_WAIT_AGREEMENT] = 3, [KEEL_WAIT_SERVER] = 4},
      .worst_ns = {[KEEL_WAIT_STORE] = 9000 * MS, [KEEL_WAIT_AGREEMENT] = 700 * MS}};
  keel_waits_late_format(&late, fields, sizeof fields);
  snprintf(line, sizeof line, "{\"event\":\"wait_late\",\"t_ns\":2,%s}\n", fields);
  events_read(o, line);
  assert_int_equal(o->run->waits_late[KEEL_WAIT_COLLECTIVE], 2);
  assert_int_equal(o->run->waits_late[KEEL_WAIT_AGREEMENT], 3);
  assert_int_equal(o->run->waits_late[KEEL_WAIT_STORE], 1);
  assert_int_equal(o->run->waits_late[KEEL_WAIT_SERVER], 4);
  assert_int_equal(o->run->wait_late_worst_ns, 9000 * MS);
  assert_string_equal(o->run->wait_late_worst_kind, "store");
}

/* Reads one `commits` line: uid's run number `run`, steps from..to committed in epoch. */
static void commits_line(observed *o, unsigned uid, unsigned run, int epoch, int from, int to) {
  char line[256];
  snprintf(line, sizeof line,
           "{\"event\":\"commits\",\"uid\":%u,\"rank\":0,\"epoch\":%d,\"t_ns\":1,"
           "\"run\":%u,\"run_epoch\":%d,\"from\":%d,\"to\":%d}\n",
           uid, epoch, run, epoch, from, to);
  events_read(o, line);
}

static keel__chaos_steps steps_counted(observed *o) {
  keel__chaos_steps steps;
  keel__chaos_steps_count(o->run, &steps);
  assert_true(steps.known);
  return steps;
}

/* A replace: uid 2 died after step 9 having said up to 7 (its tail is lost with it), uid 1
 * said 0..5 then 0..9 (a later line repeats the run), and in epoch 2 uid 1 and the
 * replacement (uid 3) committed 10..19: each step once. */
static void test_steps_of_a_replace_are_committed_once(void **state) {
  observed *o = *state;
  commits_line(o, 1, 0, 1, 0, 5);
  commits_line(o, 2, 0, 1, 0, 7);
  commits_line(o, 1, 0, 1, 0, 9);
  commits_line(o, 1, 1, 2, 10, 19);
  commits_line(o, 3, 0, 2, 10, 19);
  keel__chaos_steps steps = steps_counted(o);
  assert_int_equal(steps.first, 0);
  assert_int_equal(steps.last, 19);
  assert_int_equal(steps.skipped, 0);
  assert_int_equal(steps.redone, 0);
  assert_int_equal(o->run->commit_count, 4);
}

/* Epoch 2 resumed at step 11: step 10 was committed by no process. */
static void test_a_step_no_process_committed_is_found(void **state) {
  observed *o = *state;
  commits_line(o, 1, 0, 1, 0, 9);
  commits_line(o, 2, 0, 1, 0, 9);
  commits_line(o, 1, 1, 2, 11, 19);
  keel__chaos_steps steps = steps_counted(o);
  assert_int_equal(steps.skipped, 1);
  assert_int_equal(steps.first_skipped, 10);
  assert_int_equal(steps.redone, 0);
}

static void received_commit_line(observed *o, unsigned uid, int epoch, int step) {
  char line[256];
  snprintf(line, sizeof line,
           "{\"event\":\"received_commit\",\"uid\":%u,\"rank\":2,\"epoch\":%d,\"t_ns\":1,"
           "\"step\":%d}\n",
           uid, epoch, step);
  events_read(o, line);
}

/* Finding 43: uids 1 and 2 alone committed step 10 in epoch 1 and died before saying so;
 * uid 3 received that state in the recovery to epoch 2 and went on from 11. The step is
 * counted once, as said only by a receiver; a receiver's line for a step its committers did
 * say changes nothing, and one outside the committed steps is ignored. */
static void test_a_step_said_by_its_receiver_is_committed(void **state) {
  observed *o = *state;
  commits_line(o, 1, 0, 1, 0, 9);
  commits_line(o, 2, 0, 1, 0, 9);
  commits_line(o, 3, 0, 1, 0, 9);
  received_commit_line(o, 3, 2, 10);
  received_commit_line(o, 4, 2, 9);
  received_commit_line(o, 4, 3, 40);
  commits_line(o, 3, 1, 2, 11, 19);
  commits_line(o, 4, 0, 2, 11, 19);
  keel__chaos_steps steps = steps_counted(o);
  assert_int_equal(steps.first, 0);
  assert_int_equal(steps.last, 19);
  assert_int_equal(steps.skipped, 0);
  assert_int_equal(steps.held_only, 1);
  assert_int_equal(steps.redone, 0);
  /* Without the receiver's line, the same history has a skip. */
  keel__chaos_run_clear(o->run);
  commits_line(o, 1, 0, 1, 0, 9);
  commits_line(o, 3, 1, 2, 11, 19);
  steps = steps_counted(o);
  assert_int_equal(steps.skipped, 1);
  assert_int_equal(steps.first_skipped, 10);
  assert_int_equal(steps.held_only, 0);
}

/* Step 10 committed in epoch 1 by uid 1 (uid 2 died in it) and again in epoch 2: redone once.
 * A roll-back within epoch 2 (a second run of each process from step 15) redoes 15..19 once
 * more, counted once for the epoch however many ranks redid them. */
static void test_steps_committed_again_are_redone(void **state) {
  observed *o = *state;
  commits_line(o, 1, 0, 1, 0, 10);
  commits_line(o, 2, 0, 1, 0, 9);
  commits_line(o, 1, 1, 2, 10, 19);
  commits_line(o, 3, 0, 2, 10, 19);
  commits_line(o, 1, 2, 2, 15, 25);
  commits_line(o, 3, 1, 2, 15, 25);
  keel__chaos_steps steps = steps_counted(o);
  assert_int_equal(steps.first, 0);
  assert_int_equal(steps.last, 25);
  assert_int_equal(steps.skipped, 0);
  assert_int_equal(steps.redone, 1 + 5);
  assert_int_equal(steps.most_redone, 10); /* the first of the steps committed twice */
  assert_int_equal(steps.most_redone_times, 2);
  /* Nothing reported: nothing known. */
  keel__chaos_run_clear(o->run);
  keel__chaos_steps none;
  keel__chaos_steps_count(o->run, &none);
  assert_false(none.known);
}

/* Writes text to folder/name; returns the path (static storage, one at a time). */
static const char *file_write(const char *folder, const char *name, const char *text) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", folder, name);
  FILE *file = fopen(path, "w");
  assert_non_null(file);
  fputs(text, file);
  assert_int_equal(fclose(file), 0);
  return path;
}

/* --reference-dir: a failure-free run's finish lines kept (the rest of its events left
 * out), read back as its finishes; and a key that a changed flag, or changed bytes of a
 * file the arguments name, moves. */
static void test_a_kept_reference_is_its_finishes(void **state) {
  observed *o = *state;
  const char *folder = keel_test_tempdir("keel-chaos-reference");
  char events[512], kept[512];
  snprintf(events, sizeof events, "%s",
           file_write(folder, "events.jsonl",
                      "{\"event\":\"progress\",\"uid\":0,\"rank\":0,\"step\":1,\"t_ns\":1}\n"
                      "{\"event\":\"finish\",\"uid\":0,\"rank\":0,\"epoch\":0,\"t_ns\":2,"
                      "\"world\":2,\"step\":99,\"shard\":0,\"state_bytes\":8,"
                      "\"state_crc32c\":\"0badcafe\"}\n"
                      "{\"event\":\"finish\",\"uid\":1,\"rank\":1,\"epoch\":0,\"t_ns\":2,"
                      "\"world\":2,\"step\":99,\"shard\":0,\"state_bytes\":8,"
                      "\"state_crc32c\":\"0badcafe\"}\n"));
  snprintf(kept, sizeof kept, "%s/kept.jsonl", folder);
  assert_false(keel__chaos_reference_load(kept, o->run)); /* none kept yet */
  assert_true(keel__chaos_reference_save(events, kept));
  char *text = keel_test_read_file(kept, NULL);
  assert_non_null(text);
  assert_null(strstr(text, "progress"));
  free(text);
  assert_true(keel__chaos_reference_load(kept, o->run));
  assert_int_equal(o->run->finish_count, 2);
  assert_int_equal(o->run->finishes[1].rank, 1);
  assert_int_equal(o->run->finishes[1].step, 99);
  assert_string_equal(o->run->finishes[1].crc, "0badcafe");
  /* A run without a finish is not kept. */
  const char *empty = file_write(folder, "empty.jsonl", "{\"event\":\"progress\",\"t_ns\":1}\n");
  char none[512];
  snprintf(none, sizeof none, "%s/none.jsonl", folder);
  assert_false(keel__chaos_reference_save(empty, none));
  /* The key. */
  char program[512];
  snprintf(program, sizeof program, "%s", file_write(folder, "program", "one"));
  char *argv[] = {"run", "-n", "2", "--", program, "--steps", "9"};
  char key[32], same[32], other[32];
  keel__chaos_reference_key(argv, 7, program, 0, key, sizeof key);
  keel__chaos_reference_key(argv, 7, program, 0, same, sizeof same);
  assert_string_equal(key, same);
  assert_int_equal(strlen(key), 16);
  argv[6] = "10";
  keel__chaos_reference_key(argv, 7, program, 0, other, sizeof other);
  assert_string_not_equal(key, other);
  argv[6] = "9";
  file_write(folder, "program", "two");
  keel__chaos_reference_key(argv, 7, program, 0, other, sizeof other);
  assert_string_not_equal(key, other);
  file_write(folder, "program", "one");
  keel__chaos_reference_key(argv, 7, program, 3, other, sizeof other);
  assert_string_not_equal(key, other);
}

/* An idle spare killed once a rank has finished is the launcher's cleanup after job/done;
 * the same kill before any rank finished, or of a spare that held a rank, is a death. */
static void test_spares_killed_after_the_finish_are_cleanup(void **state) {
  observed *o = *state;
  events_read(
      o,
      "{\"event\":\"spawn\",\"node\":3,\"uid\":8,\"pid\":0,\"role\":\"spare\",\"t_ns\":1}\n"
      "{\"event\":\"spawn\",\"node\":3,\"uid\":9,\"pid\":0,\"role\":\"spare\",\"t_ns\":1}\n"
      "{\"event\":\"spawn\",\"node\":3,\"uid\":10,\"pid\":0,\"role\":\"spare\",\"t_ns\":1}\n"
      "{\"event\":\"exit\",\"uid\":8,\"rank\":-1,\"signal\":\"SIGKILL\",\"t_ns\":2}\n"
      "{\"event\":\"finish\",\"uid\":0,\"rank\":0,\"step\":5,\"world\":1,\"t_ns\":3}\n"
      "{\"event\":\"exit\",\"uid\":9,\"rank\":-1,\"signal\":\"SIGKILL\",\"t_ns\":4}\n"
      "{\"event\":\"exit\",\"uid\":10,\"rank\":2,\"signal\":\"SIGKILL\",\"t_ns\":4}\n");
  assert_false(keel__chaos_process_find(o->run, 8)->killed_at_end);
  assert_true(keel__chaos_process_find(o->run, 9)->killed_at_end);
  assert_false(keel__chaos_process_find(o->run, 10)->killed_at_end);
}

/* How many fds of a kind a description counts ("pipe x3" in it: 3), 0 when none. */
static int kind_count(const char *text, const char *kind) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "%s x", kind);
  const char *at = strstr(text, pattern);
  return at == NULL ? 0 : atoi(at + strlen(pattern));
}

/* A listener on a free port of the loopback address, whose address goes to address. */
static int loopback_listener(struct sockaddr_in *address) {
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(listener >= 0);
  *address = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t length = sizeof *address;
  assert_int_equal(bind(listener, (struct sockaddr *)address, sizeof *address), 0);
  assert_int_equal(listen(listener, 4), 0);
  assert_int_equal(getsockname(listener, (struct sockaddr *)address, &length), 0);
  return listener;
}

/* A process's fds by kind (finding 45: what a survivor's rise is made of): in this process, a
 * listener, a link to it and the link accepted, and a pipe. */
static void test_fds_by_kind(void **state) {
  (void)state;
  char before[512];
  keel__chaos_fd_kinds(getpid(), before, sizeof before);
  struct sockaddr_in address;
  int listener = loopback_listener(&address);
  int out = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_int_equal(connect(out, (struct sockaddr *)&address, sizeof address), 0);
  int in = accept(listener, NULL, NULL);
  assert_true(in >= 0);
  int pipes[2];
  assert_int_equal(pipe(pipes), 0);
  char text[512], expected[64];
  keel__chaos_fd_kinds(getpid(), text, sizeof text);
  snprintf(expected, sizeof expected, "to 127.0.0.1:%u x1", (unsigned)ntohs(address.sin_port));
  if (strstr(text, expected) == NULL || strstr(text, "from 127.0.0.1 x1") == NULL ||
      kind_count(text, "listen") != kind_count(before, "listen") + 1 ||
      kind_count(text, "pipe") != kind_count(before, "pipe") + 2)
    fail_msg("fds by kind: %s", text);
  close(pipes[0]);
  close(pipes[1]);
  close(in);
  close(out);
  close(listener);
  /* A process that is gone has none. */
  keel__chaos_fd_kinds(0, text, sizeof text);
  assert_string_equal(text, "");
}

/* A job of two for the link tests: this process (uid 0, a rank holder) and a child (uid 1,
 * holding a rank when child_holds_rank) linked to it; its end of the link into *in. */
typedef struct linked_pair {
  keel__chaos_run *run;
  pid_t child;
  int listener, in;
} linked_pair;

static linked_pair linked_pair_make(bool child_holds_rank) {
  static keel__chaos_run run; /* large: not on the stack */
  linked_pair pair = {.run = &run};
  struct sockaddr_in address;
  pair.listener = loopback_listener(&address);
  pair.child = fork();
  assert_true(pair.child >= 0);
  if (pair.child == 0) {
    int out = socket(AF_INET, SOCK_STREAM, 0);
    if (out < 0 || connect(out, (struct sockaddr *)&address, sizeof address) != 0) _exit(1);
    for (;;) pause(); /* until killed */
  }
  pair.in = accept(pair.listener, NULL, NULL);
  memset(&run, 0, sizeof run);
  run.process_count = 2;
  run.processes[0] = (keel__chaos_process){.uid = 0,
                                           .pid = getpid(),
                                           .holds_rank = true,
                                           .start_ticks = keel__chaos_start_ticks(getpid())};
  run.processes[1] = (keel__chaos_process){.uid = 1,
                                           .pid = pair.child,
                                           .holds_rank = child_holds_rank,
                                           .start_ticks = keel__chaos_start_ticks(pair.child)};
  if (pair.in < 0) { /* no child left behind */
    kill(pair.child, SIGKILL);
    waitpid(pair.child, NULL, 0);
  }
  assert_true(pair.in >= 0);
  return pair;
}

/* A survivor's fds are counted less its links to the job's live processes (finding 45: how
 * many peers it links to follows the membership), and a link left to a process that died
 * counts: this process (a rank holder) accepts a link from a child (a peer of the job), is
 * sampled, keeps the link past the child's death (a leak) and is sampled again, then closes
 * it. */
static void test_links_to_live_processes_are_not_counted(void **state) {
  (void)state;
  linked_pair pair = linked_pair_make(true);
  keel__chaos_survivors_sample(pair.run);
  assert_int_equal(kill(pair.child, SIGKILL), 0);
  assert_int_equal(waitpid(pair.child, NULL, 0), pair.child);
  keel__chaos_survivors_sample(pair.run);
  close(pair.in);
  keel__chaos_survivors_sample(pair.run);
  close(pair.listener);
  const keel__chaos_process *survivor = &pair.run->processes[0];
  assert_int_equal(survivor->samples, 3);
  assert_int_equal(pair.run->processes[1].samples, 1);
  /* The link to the dead child counts; closed, the count is back where the link to the live
   * child left it: that link was not counted. */
  assert_int_equal(survivor->fds[1], survivor->fds[0] + 1);
  assert_int_equal(survivor->fds[2], survivor->fds[0]);
  keel__chaos_run_clear(pair.run);
}

/* A link that closes between the read of the live processes' connections and a survivor's
 * own sample is neither counted nor taken off (finding 55: the survivor's links were taken
 * from the earlier read and its fds from the later, so links closed meanwhile, a world's
 * worth in a recovery, read as a dip of its count, and the floor after it as a rise). */
static void test_a_link_closed_during_the_sample_is_not_taken_off(void **state) {
  (void)state;
  linked_pair pair = linked_pair_make(false);
  keel__chaos_survivors_sample(pair.run);
  keel__chaos_live_links *live = keel__chaos_live_links_read(pair.run);
  bool read = live != NULL;
  close(pair.in); /* after the live processes' connections were read, before this one's sample */
  keel__chaos_process_sample(&pair.run->processes[0], live);
  keel__chaos_live_links_free(live);
  /* The child goes first, so that a failed check leaves no process behind. */
  int killed = kill(pair.child, SIGKILL);
  pid_t reaped = waitpid(pair.child, NULL, 0);
  close(pair.listener);
  const keel__chaos_process *survivor = &pair.run->processes[0];
  assert_int_equal(killed, 0);
  assert_int_equal(reaped, pair.child);
  assert_true(read);
  assert_int_equal(survivor->samples, 2);
  assert_int_equal(survivor->fds[1], survivor->fds[0]);
  keel__chaos_run_clear(pair.run);
}

/* A series' floor is the median of a quarter, so one low sample is not a floor (a server's
 * links to two servers killed at once, closed before their replacements' are made), while a
 * count that grows with the recoveries still rises. */
static void test_a_floor_is_not_one_low_sample(void **state) {
  (void)state;
  const long dip[] = {10, 8, 8, 6, 8, 8, 8, 8, 8, 8, 8, 8, 8};
  assert_int_equal(keel__chaos_floor_rise(dip, sizeof dip / sizeof dip[0]), 0);
  long leak[16], spikes[100];
  for (size_t i = 0; i < 16; i++) leak[i] = 20 + (long)i;
  assert_true(keel__chaos_floor_rise(leak, 16) >= 8);
  /* Counts that move with each recovery and come back: flat, however long. */
  for (size_t i = 0; i < 100; i++) spikes[i] = 8 + (i % 3 == 0 ? 2 : 0) - (i % 7 == 0 ? 2 : 0);
  assert_int_equal(keel__chaos_floor_rise(spikes, 100), 0);
  for (size_t i = 0; i < 100; i++) spikes[i] += (long)i / 10; /* a leak under the noise */
  assert_true(keel__chaos_floor_rise(spikes, 100) >= 4);
  assert_int_equal(keel__chaos_floor_rise(NULL, 0), 0);
}

/* Where two runs' traces part: the first step, then rank, whose last line differs (a step
 * printed twice, redone, counts by its last line; a step one run did not print is passed
 * over), and the first word that differs. Lines that only look like trace lines are not
 * read; kept under --reference-dir, only the trace lines of an output remain. */
static void test_traces_part_at_the_first_differing_step(void **state) {
  (void)state;
  const char *folder = keel_test_tempdir("keel-chaos-trace");
  char reference[512], run[512], same[512], kept[512], where[256];
  snprintf(reference, sizeof reference, "%s",
           file_write(folder, "reference.txt",
                      "keel server 0 listening on 127.0.0.1:1\n"
                      "trace step 1 rank 0 dense 00000001 rows 4:aaaaaaaa\n"
                      "trace step 1 rank 1 dense 00000001 rows 5:bbbbbbbb\n"
                      "progress step 1 rank 0\n"
                      "trace step 2 rank 0 dense 00000002 rows 4:cccccccc\n"
                      "trace step 2 rank 1 dense 00000002 rows 6:dddddddd 7:eeeeeeee\n"
                      "trace step 3 rank 0 dense 00000003 rows 8:ffffffff\n"
                      "trace step 3 rank 1 dense 00000003 rows 9:99999999\n"));
  /* Step 1 rank 1 redone: its first line differs, its last does not. Step 2 rank 0 missing.
   * Step 2 rank 1 parts at its second row; step 3 rank 0 (later) at its dense block. */
  snprintf(run, sizeof run, "%s",
           file_write(folder, "run.txt",
                      "trace step 1 rank 1 dense 0000dead rows 5:bbbbbbbb\n"
                      "trace step 1 rank 0 dense 00000001 rows 4:aaaaaaaa\n"
                      "trace step 1 rank 1 dense 00000001 rows 5:bbbbbbbb\n"
                      "trace step x rank 1 dense 00000002\n"
                      "trace step 3 rank 0 dense 0000beef rows 8:ffffffff\n"
                      "trace step 2 rank 1 dense 00000002 rows 6:dddddddd 7:12345678\n"));
  assert_true(keel__chaos_trace_parting(reference, run, where, sizeof where));
  assert_string_equal(where,
                      "the traces part at step 2 rank 1: 7:12345678, failure-free 7:eeeeeeee");
  snprintf(same, sizeof same, "%s",
           file_write(folder, "same.txt",
                      "trace step 2 rank 1 dense 00000002 rows 6:dddddddd 7:eeeeeeee\n"
                      "trace step 3 rank 1 dense 00000003 rows 9:99999999 10:00000000\n"));
  assert_true(keel__chaos_trace_parting(reference, same, where, sizeof where));
  assert_string_equal(where,
                      "the traces part at step 3 rank 1: 10:00000000, failure-free (no more)");
  /* Kept under --reference-dir: the trace lines alone, and they part where the output did. */
  snprintf(kept, sizeof kept, "%s/kept.trace", folder);
  assert_true(keel__chaos_reference_save_trace(reference, kept));
  char *text = keel_test_read_file(kept, NULL);
  assert_non_null(text);
  assert_null(strstr(text, "progress"));
  assert_null(strstr(text, "listening"));
  free(text);
  assert_true(keel__chaos_trace_parting(kept, run, where, sizeof where));
  assert_string_equal(where,
                      "the traces part at step 2 rank 1: 7:12345678, failure-free 7:eeeeeeee");
  assert_true(keel__chaos_trace_parting(kept, kept, where, sizeof where));
  assert_string_equal(where, "the traces agree at every step both printed");
  /* No trace lines, or no file: nothing to say. */
  const char *none = file_write(folder, "none.txt", "progress step 1 rank 0\n");
  assert_false(keel__chaos_trace_parting(reference, none, where, sizeof where));
  char missing[512];
  snprintf(missing, sizeof missing, "%s/missing.txt", folder);
  assert_false(keel__chaos_trace_parting(missing, run, where, sizeof where));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fds_by_kind),
      cmocka_unit_test(test_links_to_live_processes_are_not_counted),
      cmocka_unit_test(test_a_link_closed_during_the_sample_is_not_taken_off),
      cmocka_unit_test(test_a_floor_is_not_one_low_sample),
      cmocka_unit_test_setup_teardown(test_fence_just_after_heal_is_the_partitions, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_fence_after_a_healed_silence_is_unexplained, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_fence_of_another_node_or_before_is_unexplained, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_fence_during_the_partition_is_its, setup, teardown),
      cmocka_unit_test_setup_teardown(test_the_world_is_the_latest_recoveries, setup, teardown),
      cmocka_unit_test_setup_teardown(test_recovery_after_a_partitions_aftermath_is_not_its, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_stillness_is_counted_from_the_last_failure, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_late_waits_add_up, setup, teardown),
      cmocka_unit_test_setup_teardown(test_steps_of_a_replace_are_committed_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_step_no_process_committed_is_found, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_step_said_by_its_receiver_is_committed, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_a_kept_reference_is_its_finishes, setup, teardown),
      cmocka_unit_test(test_traces_part_at_the_first_differing_step),
      cmocka_unit_test_setup_teardown(test_steps_committed_again_are_redone, setup, teardown),
      cmocka_unit_test_setup_teardown(test_spares_killed_after_the_finish_are_cleanup, setup,
                                      teardown),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
