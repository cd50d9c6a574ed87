/* In-memory checkpoints every iteration (`keel run --ckpt mem`, Gemini): a rank whose shard
 * no survivor holds (toy_train --shards 4: every rank's state is its own) is restored from
 * its node's memory, from a peer node's copy after a whole node is killed, or, when the lost
 * rank died inside the step's allreduce (the survivors a step ahead), the whole job rolls
 * back one step from memory; a corrupted snapshot is refused and the one before it used.
 * Every case ends with the parameters of a run without failure, bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_events.h"
#include "test_job.h"
#include "test_support.h"

#define JOB_TIMEOUT "90s"
#define JOB_TIMEOUT_MS 100000
#define MAX_EVENTS 8192
#define LIST(...) ((const char *const[]){__VA_ARGS__, NULL})

static const char *const toy_args[] = {"--steps", "60", "--params", "40000", "--shards", "4", NULL};

/* The crc of a run of toy_train with no failure and no checkpoints. */
static unsigned clean_crc(void) {
  static unsigned crc;
  static bool known;
  if (known) return crc;
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-mem"));
  int code = keel_test_job_run(&job, JOB_TIMEOUT, JOB_TIMEOUT_MS, LIST("-n", "4"),
                               keel_test_program("toy_train"), toy_args, NULL);
  assert_int_equal(code, 0);
  crc = keel_test_toy_assert_consistent(job.output, 4, 60);
  known = true;
  return crc;
}

/* How many mem_restore events say their shard came from `from`. */
static size_t restores_from(const keel_test_events *log, const char *from) {
  size_t count = 0;
  for (size_t i = 0; i < log->count; i++) {
    if (!keel_test_event_is(log->lines[i], "mem_restore")) continue;
    const char *where = keel_test_event_field(log->lines[i], "from");
    if (where != NULL && strncmp(where + 1, from, strlen(from)) == 0) count++;
  }
  return count;
}

/* Checks that every mem_restore event of the job restored `step` (any when -1: a node's loss
 * may take two rounds, the first at the survivors' step, the second rolled back); returns how many
 * there were, and in *from_count_p (may be NULL) how many came from `from` ("local", "node-0"). */
static size_t restores_check(const keel_test_job *job, long long step, const char *from,
                             size_t *from_count_p) {
  keel_test_events log;
  keel_test_events_read(job->events, MAX_EVENTS, &log);
  size_t count = 0;
  for (size_t i = 0; i < log.count; i++) {
    if (!keel_test_event_is(log.lines[i], "mem_restore")) continue;
    count++;
    long long restored = keel_test_event_long(log.lines[i], "step");
    if (step >= 0 && restored != step)
      fail_msg("restored step %lld, not %lld: %s", restored, step, log.lines[i]);
  }
  keel_test_events_assert_none_left(&log);
  if (from_count_p != NULL) *from_count_p = restores_from(&log, from);
  keel_test_events_free(&log);
  return count;
}

static void one_node_run(keel_test_job *job, const char *fault) {
  assert_true(keel_test_job_prepare(job, "keel-mem"));
  int code = keel_test_job_run(job, JOB_TIMEOUT, JOB_TIMEOUT_MS,
                               LIST("-n", "4", "--spares", "1", "--ckpt", "mem"),
                               keel_test_program("toy_train"), toy_args, fault);
  if (code != 0) keel_test_print_file("job output", job->output);
  assert_int_equal(code, 0);
  assert_int_equal(keel_test_toy_assert_consistent(job->output, 4, 60), clean_crc());
}

/* Rank 2 dies before its step's allreduce: everyone is at step 30, and the spare takes rank 2's
 * snapshot of step 30 from the node's memory. */
static void test_worker_killed_restores_from_local_memory(void **state) {
  (void)state;
  keel_test_job job;
  one_node_run(&job, "kill@rank=2,step=30,point=forward");
  size_t local = 0;
  assert_int_equal(restores_check(&job, 30, "local", &local), 1);
  assert_int_equal(local, 1);
}

/* Rank 2 dies inside the allreduce after its data went out: the survivors commit step 30
 * (state of step 31), rank 2's last snapshot is of step 30. Nobody has shard 2 at 31, so every
 * rank goes back to 30 from memory. */
static void test_kill_in_allreduce_rolls_every_rank_back(void **state) {
  (void)state;
  keel_test_job job;
  one_node_run(&job, "kill@rank=2,step=30,point=allreduce,after=1");
  /* The replacement restores rank 2's snapshot, and each survivor that had finished the
   * allreduce (and so committed step 31) rolls back: none, some or all of them, as the kill
   * fell in the ring (a CI run saw two of three). Step 30 in every case, from local memory,
   * and the run ends bit-identical, which one_node_run checked. */
  size_t local = 0, restores = restores_check(&job, 30, "local", &local);
  assert_true(restores >= 1 && restores <= 4);
  assert_int_equal(local, restores);
}

/* Rank 1's snapshot of step 21 is damaged in memory after it is sealed, and rank 1 dies at
 * step 21: the damaged snapshot is refused by its checksums and the job rolls back to 20. */
static void test_corrupted_snapshot_is_never_restored(void **state) {
  (void)state;
  keel_test_job job;
  one_node_run(&job, "corrupt@rank=1,step=20,point=mem_saved;kill@rank=1,step=21,point=forward");
  size_t local = 0;
  assert_int_equal(restores_check(&job, 20, "local", &local), 4);
  assert_int_equal(local, 4);
  char *output = keel_test_read_file(job.output, NULL);
  assert_non_null(output);
  assert_non_null(strstr(output, "fails its crc32c"));
  free(output);
}

/* Rank 2 dies in the middle of its snapshot copy of step 31 (its first buffer written, the
 * slot unsealed): that torn slot is never used; step 30, the other slot, is. */
static void test_kill_during_snapshot_copy_uses_the_step_before(void **state) {
  (void)state;
  keel_test_job job;
  one_node_run(&job, "kill@rank=2,step=30,point=mem_copy");
  size_t local = 0;
  size_t restores = restores_check(&job, 30, "local", &local);
  assert_true(restores == 1 || restores == 4);
  assert_int_equal(local, restores);
}

/* ---- a whole node killed */

static const char *const long_toy_args[] = {
    "--steps", "400", "--params", "40000", "--shards", "4", "--compute-ms", "5", NULL};

/* The crc of the long run with no failure (bits do not depend on the node layout). */
static unsigned long_clean_crc(void) {
  static unsigned crc;
  static bool known;
  if (known) return crc;
  keel_test_job clean;
  assert_true(keel_test_job_prepare(&clean, "keel-mem"));
  assert_int_equal(keel_test_job_run(&clean, JOB_TIMEOUT, JOB_TIMEOUT_MS, LIST("-n", "4"),
                                     keel_test_program("toy_train"), long_toy_args, NULL),
                   0);
  crc = keel_test_toy_assert_consistent(clean.output, 4, 400);
  known = true;
  return crc;
}

static bool saved_fifty(const keel_test_events *log, void *context) {
  (void)context;
  for (size_t i = 0; i < log->count; i++)
    if (keel_test_event_is(log->lines[i], "mem_save") &&
        keel_test_event_long(log->lines[i], "saves") >= 50)
      return true;
  return false;
}

/* Runs the long toy job (4 ranks) with flags; without a fault kills the nodes named (their
 * agents and workers) once 50 snapshots were taken, with one lets the fault do it; checks
 * that the job ends with the bits of a run without failure. */
/* The job's id, from its events (it has started). */
static void job_id_get(const keel_test_job *job, char *job_id, size_t capacity) {
  keel_test_events log;
  keel_test_events_read(job->events, MAX_EVENTS, &log);
  assert_true(keel_test_events_job_id(&log, job_id, capacity));
  keel_test_events_free(&log);
}

/* `keel inject kill-node` of each node named: its agent and workers, with SIGKILL. */
static void nodes_kill(const keel_test_job *job, const char *const *nodes) {
  char job_id[32];
  job_id_get(job, job_id, sizeof job_id);
  for (size_t i = 0; nodes[i] != NULL; i++)
    assert_int_equal(
        keel_test_keel(LIST("inject", "kill-node", nodes[i], "--job", job_id), job->output, 10000),
        0);
}

/* Waits for the job's end: exit 0 and the bits of the long run without failure. */
static void long_job_end_check(keel_test_job *job, pid_t launcher) {
  int status = 0;
  assert_true(keel_test_wait(launcher, JOB_TIMEOUT_MS, &status));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    keel_test_print_file("job output", job->output);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_int_equal(keel_test_toy_assert_consistent(job->output, 4, 400), long_clean_crc());
}

static void nodes_killed_run(keel_test_job *job, const char *const *flags, const char *fault,
                             const char *const *nodes) {
  pid_t launcher = keel_test_job_start(job, JOB_TIMEOUT, flags, keel_test_program("toy_train"),
                                       long_toy_args, fault);
  assert_true(launcher > 0);
  if (fault == NULL) {
    assert_true(keel_test_events_wait(job->events, MAX_EVENTS, saved_fifty, NULL, 20, 60000));
    nodes_kill(job, nodes);
  }
  long_job_end_check(job, launcher);
}

/* 2 nodes of 2 ranks and a spare node; node 1 (ranks 2 and 3) is the one that dies. */
static void node_killed_run(keel_test_job *job, const char *mem, const char *const *more_flags,
                            const char *fault) {
  const char *flags[24] = {
      "--nnodes",         "2",    "--nproc-per-node", "2", "--agents", "--spare-nodes", "1",
      "--failure-domain", "node", "--ckpt",           mem};
  size_t count = 11;
  for (size_t i = 0; more_flags != NULL && more_flags[i] != NULL && count < 23; i++)
    flags[count++] = more_flags[i];
  flags[count] = NULL;
  nodes_killed_run(job, flags, fault, LIST("1"));
}

/* The spare node's workers take ranks 2 and 3 and fetch their shards from node 0, which holds
 * copies of them (the survivors, when they roll back, restore from their own node). */
static void test_node_killed_restores_from_peer_copies(void **state) {
  (void)state;
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-mem"));
  node_killed_run(&job, "mem", NULL, NULL);
  size_t from_peer = 0;
  restores_check(&job, -1, "node-0", &from_peer);
  assert_true(from_peer >= 2);
}

/* 4 nodes of one rank, copies in the groups {0, 1} and {2, 3} (Algorithm 1, k = 2): nodes 1
 * and 2, one of each group, die at once; ranks 1 and 2 come back from nodes 0 and 3. */
static void test_two_nodes_of_different_groups_killed(void **state) {
  (void)state;
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-mem"));
  nodes_killed_run(&job,
                   LIST("--nnodes", "4", "--nproc-per-node", "1", "--agents", "--spare-nodes", "2",
                        "--failure-domain", "node", "--ckpt", "mem"),
                   NULL, LIST("1", "2"));
  size_t from_node_0 = 0, from_node_3 = 0;
  restores_check(&job, -1, "node-0", &from_node_0);
  restores_check(&job, -1, "node-3", &from_node_3);
  assert_true(from_node_0 >= 1 && from_node_3 >= 1);
}

static bool node_1_ranks_fetched(const keel_test_events *log, void *context) {
  (void)context;
  return restores_from(log, "node-0") >= 2;
}

/* Whether a spare node (2 or 3) of the job whose folder is context holds a complete copy of
 * ranks 0 and 1: the second slot of a rank's copies is written only once the first holds a
 * complete, checked one. */
static bool spare_node_holds_node_0_copies(const keel_test_events *log, void *context) {
  (void)log;
  const char *folder = context;
  for (int node = 2; node <= 3; node++) {
    bool both = true;
    for (int rank = 0; rank <= 1 && both; rank++) {
      char path[512];
      snprintf(path, sizeof path, "%s/node-%d/peer-%d.slot-1", folder, node, rank);
      both = access(path, F_OK) == 0;
    }
    if (both) return true;
  }
  return false;
}

/* Node 1 dies and spare node 2 or 3 takes its ranks, and its place among the holders of
 * copies: node 0's snapshots now go to it. Then node 0 dies too: the other spare node's
 * workers fetch ranks 0 and 1 from the node that replaced node 1 (without that, no memory
 * would hold them). */
static void test_a_replacement_node_holds_the_copies_of_the_node_it_replaced(void **state) {
  (void)state;
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-mem"));
  pid_t launcher =
      keel_test_job_start(&job, JOB_TIMEOUT,
                          LIST("--nnodes", "2", "--nproc-per-node", "2", "--agents",
                               "--spare-nodes", "2", "--failure-domain", "node", "--ckpt", "mem"),
                          keel_test_program("toy_train"), long_toy_args, NULL);
  assert_true(launcher > 0);
  assert_true(keel_test_events_wait(job.events, MAX_EVENTS, saved_fifty, NULL, 20, 60000));
  nodes_kill(&job, LIST("1"));
  assert_true(keel_test_events_wait(job.events, MAX_EVENTS, node_1_ranks_fetched, NULL, 20, 60000));
  char job_id[32], folder[128];
  job_id_get(&job, job_id, sizeof job_id);
  snprintf(folder, sizeof folder, "/dev/shm/keel-%s", job_id);
  assert_true(keel_test_events_wait(job.events, MAX_EVENTS, spare_node_holds_node_0_copies, folder,
                                    20, 30000));
  nodes_kill(&job, LIST("0"));
  long_job_end_check(&job, launcher);
  keel_test_events log;
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  size_t from_spares = restores_from(&log, "node-2") + restores_from(&log, "node-3");
  keel_test_events_free(&log);
  assert_true(from_spares >= 2);
}

/* One copy per snapshot (replicas=1): nothing in memory has shards 2 and 3 once node 1 is
 * gone, so the job goes back to the newest step the agents wrote to the persistent tier
 * (--ckpt-persist-every 10steps), every rank restoring it from there, and says so. */
static void test_every_copy_lost_falls_back_to_the_persistent_tier(void **state) {
  (void)state;
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-mem"));
  char persist_dir[320];
  snprintf(persist_dir, sizeof persist_dir, "%s/persist", job.folder);
  node_killed_run(&job, "mem:replicas=1",
                  LIST("--ckpt-dir", persist_dir, "--ckpt-persist-every", "10steps"), NULL);
  size_t from_disk = 0;
  restores_check(&job, -1, "persistent", &from_disk);
  /* Ranks 2 and 3 at least; every rank when the job had gone past the last persisted step. */
  assert_true(from_disk >= 2);
  char *output = keel_test_read_file(job.output, NULL);
  assert_non_null(output);
  assert_non_null(strstr(output, "of the persistent tier"));
  free(output);
}

/* Node 1's agent dies while it sends a copy (64 KiB chunks: its 203rd chunk is inside a copy):
 * node 0 keeps the copy before, complete, and the job goes back to it if need be. */
static void test_agent_killed_during_a_transfer_keeps_the_copy_before(void **state) {
  (void)state;
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-mem"));
  node_killed_run(&job, "mem:chunk=64KiB", NULL, "kill@node=1,point=mem_send,after=203");
  size_t from_peer = 0;
  restores_check(&job, -1, "node-0", &from_peer);
  assert_true(from_peer >= 2);
}

/* Node 1's agent dies in its 5th persistent write (step 30 of one of its ranks: files written,
 * no manifest) and with it every copy of its shards: the job goes back to step 20, the newest
 * step of which every shard was written whole. */
static void test_agent_killed_during_a_persistent_write_uses_the_one_before(void **state) {
  (void)state;
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-mem"));
  char persist_dir[320];
  snprintf(persist_dir, sizeof persist_dir, "%s/persist", job.folder);
  node_killed_run(&job, "mem:replicas=1",
                  LIST("--ckpt-dir", persist_dir, "--ckpt-persist-every", "10steps"),
                  "kill@node=1,point=mem_persist,after=5");
  size_t from_disk = 0;
  assert_int_equal(restores_check(&job, 20, "persistent", &from_disk), 4);
  assert_int_equal(from_disk, 4);
}

/* ---- a persistent tier that cannot write */

/* The persistent tier on a disk that fills up (a 400 KiB tmpfs: step 10 of the 4 ranks, 352
 * KiB, fits; no later step does): training goes on from memory, node 1's loss is recovered
 * from the peer copies, the job ends with the bits of a run without failure, each agent says
 * once why it cannot write, the agents count the failures, and step 10 stays whole. */
static void test_full_persistent_disk_keeps_training_from_memory(void **state) {
  (void)state;
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-mem"));
  char mounted[320];
  snprintf(mounted, sizeof mounted, "%s/persist", job.folder);
  if (!keel_test_tmpfs_mount(__func__, mounted, 0, "size=400k")) skip();
  node_killed_run(&job, "mem", LIST("--ckpt-dir", mounted, "--ckpt-persist-every", "10steps"),
                  NULL);
  size_t from_peer = 0;
  restores_check(&job, -1, "node-0", &from_peer);
  assert_true(from_peer >= 2);

  keel_test_events log;
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  long long failed = 0;
  for (size_t i = 0; i < log.count; i++) {
    if (!keel_test_event_is(log.lines[i], "mem_service_end")) continue;
    long long count = keel_test_event_long(log.lines[i], "persist_failed");
    if (count > 0 && strstr(log.lines[i], "\"persist_last_failure\":\"KEEL_ENOSPC\"") == NULL)
      fail_msg("a failure that is not a full disk: %s", log.lines[i]);
    failed += count;
  }
  keel_test_events_free(&log);
  if (failed < 4) fail_msg("%lld failed persistent writes counted (%s)", failed, job.events);

  char *output = keel_test_read_file(job.output, NULL);
  assert_non_null(output);
  size_t said = 0;
  for (const char *at = output; (at = strstr(at, "the persistent tier cannot write to")) != NULL;
       at++)
    said++;
  free(output);
  /* Once per agent that failed (2 nodes and the spare node), not once per failure. */
  if (said < 1 || said > 3) fail_msg("the full disk was told %zu times (%s)", said, job.output);

  char job_id[32], manifest[512];
  job_id_get(&job, job_id, sizeof job_id);
  for (int rank = 0; rank < 4; rank++) {
    snprintf(manifest, sizeof manifest, "%s/%s/step-10/rank-%d/manifest", mounted, job_id, rank);
    if (access(manifest, F_OK) != 0) fail_msg("step 10 of rank %d is gone: %s", rank, manifest);
  }
}

/* ---- the launcher's refusals */
static void test_bad_settings_are_refused(void **state) {
  (void)state;
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-mem"));
  assert_int_equal(keel_test_keel(LIST("run", "-n", "2", "--ckpt", "mem:replicas=9", "--", "true"),
                                  job.output, 10000),
                   2);
  assert_int_equal(keel_test_keel(LIST("run", "-n", "2", "--ckpt", "mem:replicas=2", "--", "true"),
                                  job.output, 10000),
                   2);
  assert_int_equal(keel_test_keel(LIST("run", "-n", "2", "--ckpt", "mem:every=0", "--", "true"),
                                  job.output, 10000),
                   2);
  assert_int_equal(keel_test_keel(LIST("run", "--nnodes", "2", "--nproc-per-node", "1", "--ckpt",
                                       "mem", "--", "true"),
                                  job.output, 10000),
                   2);
  char *output = keel_test_read_file(job.output, NULL);
  assert_non_null(output);
  assert_non_null(strstr(output, "needs at least that many nodes"));
  assert_non_null(strstr(output, "needs their agents"));
  free(output);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_settings_are_refused),
      cmocka_unit_test(test_worker_killed_restores_from_local_memory),
      cmocka_unit_test(test_kill_in_allreduce_rolls_every_rank_back),
      cmocka_unit_test(test_corrupted_snapshot_is_never_restored),
      cmocka_unit_test(test_kill_during_snapshot_copy_uses_the_step_before),
      cmocka_unit_test(test_node_killed_restores_from_peer_copies),
      cmocka_unit_test(test_two_nodes_of_different_groups_killed),
      cmocka_unit_test(test_a_replacement_node_holds_the_copies_of_the_node_it_replaced),
      cmocka_unit_test(test_agent_killed_during_a_transfer_keeps_the_copy_before),
      cmocka_unit_test(test_agent_killed_during_a_persistent_write_uses_the_one_before),
      cmocka_unit_test(test_every_copy_lost_falls_back_to_the_persistent_tier),
      cmocka_unit_test_teardown(test_full_persistent_disk_keeps_training_from_memory,
                                keel_test_tmpfs_release),
  };
  /* KEEL_TEST_FILTER=test_full_* runs only the cases it names. */
  if (getenv("KEEL_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("KEEL_TEST_FILTER"));
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  keel_test_kill_all();
  return keel_test_finish(failed);
}
