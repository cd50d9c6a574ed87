/* Agents on hosts of their own (keel agent --node-rank I --rdzv-endpoint etcd://...), with no
 * supervisor: only the root agent can declare a lost node's processes dead. A node is
 * killed whole, and the root agent's node right after its decision: another agent becomes
 * root, finishes the recovery, and the job ends on the last node. A killed host whose agent
 * is started again comes back as a spare node and takes the next lost node's rank. Exits 77
 * (skipped, with the reason) without etcd. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_etcd.h"
#include "test_events.h"
#include "test_job.h"
#include "test_support.h"

#define NODES 3
#define MAX_EVENTS 20000
#define STEP_COUNT 600

static keel__etcd_cluster *cluster;

typedef struct node_run {
  char events[300];
  char output[300];
  pid_t agent;
} node_run;

/* Starts node rank's agent (its life-th life) with the job's own flags (NULL-ended). */
static void agent_start(node_run *node, int rank, int life, const char *folder,
                        const char *job_name, const char *const *job_flags, const char *steps) {
  char rank_text[12], timeout[16], heartbeat[16];
  snprintf(rank_text, sizeof rank_text, "%d", rank);
  /* Sanitizer builds run every process several times slower. The heartbeat (2 s, the
   * default) is the agents' lease: an etcd that a loaded machine stalls for more than 5/8 of
   * it fences healthy nodes, as it should. */
  keel_test_seconds_flag(180, timeout, sizeof timeout);
  keel_test_seconds_flag(2, heartbeat, sizeof heartbeat);
  snprintf(node->events, sizeof node->events, "%s/events-%d-%d.jsonl", folder, rank, life);
  snprintf(node->output, sizeof node->output, "%s/output-%d-%d.txt", folder, rank, life);
  const char *head[] = {keel_test_bin("keel"),
                        "agent",
                        "--node-rank",
                        rank_text,
                        "--nproc-per-node",
                        "1",
                        "--heartbeat",
                        heartbeat,
                        "--timeout",
                        timeout,
                        "--quiet",
                        "--rdzv-endpoint",
                        keel__etcd_cluster_endpoint(cluster),
                        "--rdzv-id",
                        job_name,
                        "--events",
                        node->events};
  const char *tail[] = {"--",
                        keel_test_program("toy_train"),
                        "--steps",
                        steps,
                        "--params",
                        "100000",
                        "--compute-ms",
                        "20",
                        NULL};
  const char *argv[64];
  size_t count = 0;
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) argv[count++] = head[i];
  for (size_t i = 0; job_flags[i] != NULL; i++) argv[count++] = job_flags[i];
  for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[count++] = tail[i];
  assert_true(count <= sizeof argv / sizeof argv[0]);
  node->agent = keel_test_spawn((char *const *)argv, NULL, node->output);
  assert_true(node->agent > 0);
}

typedef struct event_want {
  const char *name;
  long long step; /* progress: at least this step; else -1 */
  long long node; /* root_decision: about this node; else -1 */
} event_want;

static bool event_wanted(const keel_test_events *log, void *context) {
  const event_want *want = context;
  for (size_t i = 0; i < log->count; i++) {
    const char *line = log->lines[i];
    if (!keel_test_event_is(line, want->name)) continue;
    if (want->step >= 0 && keel_test_event_long(line, "step") < want->step) continue;
    if (want->node >= 0 && keel_test_event_long(line, "node") != want->node) continue;
    return true;
  }
  return false;
}

static bool event_await(const node_run *node, const char *name, long long step, long long about,
                        int timeout_ms) {
  event_want want = {name, step, about};
  return keel_test_events_wait(node->events, MAX_EVENTS, event_wanted, &want, 10,
                               timeout_ms * keel_test_slowdown());
}

/* Which node's agent is root now: the one whose events file says so last. */
static int root_node(const node_run *nodes) {
  for (int node = 0; node < NODES; node++) {
    keel_test_events log;
    keel_test_events_read(nodes[node].events, MAX_EVENTS, &log);
    bool root = keel_test_events_find(&log, "root", -1) != NULL;
    keel_test_events_free(&log);
    if (root) return node;
  }
  return -1;
}

/* A host dying: its agent and its worker, at once. */
static void node_kill(const node_run *node) {
  keel_test_events log;
  keel_test_events_read(node->events, MAX_EVENTS, &log);
  const char *spawn = keel_test_events_find(&log, "spawn", -1);
  assert_non_null(spawn);
  pid_t worker = (pid_t)keel_test_event_long(spawn, "pid");
  keel_test_events_free(&log);
  assert_true(worker > 1 && keel_test_pid_exists(worker));
  assert_int_equal(kill(node->agent, SIGKILL), 0);
  assert_int_equal(kill(worker, SIGKILL), 0);
}

static void show(const node_run *nodes, int count) {
  for (int node = 0; node < count; node++) {
    keel_test_print_file("output", nodes[node].output);
    keel_test_print_file("events", nodes[node].events);
  }
}

static void root_killed_after_its_decision_another_finishes(void **state) {
  (void)state;
  const char *folder = keel_test_tempdir("keel-etcd-nodes");
  assert_non_null(folder);
  char job_name[64];
  snprintf(job_name, sizeof job_name, "test-etcd-nodes-%ld", (long)getpid());
  static const char *const job_flags[] = {"--nnodes", "3", NULL};
  node_run nodes[NODES];
  for (int rank = 0; rank < NODES; rank++)
    agent_start(&nodes[rank], rank, 0, folder, job_name, job_flags, "600");
  if (!event_await(&nodes[0], "progress", 20, -1, 30000)) {
    show(nodes, NODES);
    fail_msg("the job did not reach step 20");
  }
  int root = root_node(nodes);
  assert_true(root >= 0);
  int victim = (root + 1) % NODES, survivor = (root + 2) % NODES;
  print_message("root is node %d; killing node %d, then the root\n", root, victim);
  node_kill(&nodes[victim]);
  /* The root decides once the victim's lease is gone, and writes it down first. */
  if (!event_await(&nodes[root], "root_decision", -1, victim, 15000)) {
    show(nodes, NODES);
    fail_msg("the root did not decide on node %d", victim);
  }
  node_kill(&nodes[root]);
  int status = -1;
  if (!keel_test_wait(nodes[survivor].agent, 90000 * keel_test_slowdown(), &status)) {
    show(nodes, NODES);
    fail_msg("the last node did not finish");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) show(nodes, NODES);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  keel_test_toy_assert_consistent(nodes[survivor].output, 1, STEP_COUNT);
  keel_test_events log;
  keel_test_events_read(nodes[survivor].events, MAX_EVENTS, &log);
  /* The survivor took over as root and decided on the old root's node itself. */
  assert_non_null(keel_test_events_find(&log, "root", -1));
  event_want decided = {"root_decision", -1, root};
  assert_true(event_wanted(&log, &decided));
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
  for (int node = 0; node < NODES; node++) keel_test_wait(nodes[node].agent, 5000, NULL);
}

/* A host that died and is started again (its scheduler runs the same command): its agent
 * finds the node's earlier life in the store, waits for it to be gone, and comes back as a
 * spare node, which the next lost node's rank goes to. Before, it started the node's worker
 * again under the dead one's uid, which the job had declared failed: it was never admitted,
 * and the second loss found no spare. */
static void a_host_started_again_comes_back_as_a_spare_node(void **state) {
  (void)state;
  const char *folder = keel_test_tempdir("keel-etcd-nodes-again");
  assert_non_null(folder);
  char job_name[64];
  snprintf(job_name, sizeof job_name, "test-etcd-nodes-again-%ld", (long)getpid());
  /* Nodes 0 and 1 hold the ranks; node 2 is a spare node; node 0's second life is [3]. */
  static const char *const job_flags[] = {
      "--nnodes", "2", "--spare-nodes", "1", "--on-failure", "replace", "--max-restarts",
      "2",        NULL};
  const char *steps = "1500";
  node_run nodes[NODES + 1];
  for (int rank = 0; rank < NODES; rank++)
    agent_start(&nodes[rank], rank, 0, folder, job_name, job_flags, steps);
  if (!event_await(&nodes[0], "progress", 20, -1, 30000)) {
    show(nodes, NODES);
    fail_msg("the job did not reach step 20");
  }
  /* A second agent for node 1, which is alive, is refused once the earlier life's key has
   * outlived its lease's time. */
  node_run duplicate;
  agent_start(&duplicate, 1, 1, folder, job_name, job_flags, steps);
  int status_duplicate = -1;
  assert_true(keel_test_wait(duplicate.agent, 30000 * keel_test_slowdown(), &status_duplicate));
  char *said = keel_test_read_file(duplicate.output, NULL);
  bool refused = WIFEXITED(status_duplicate) && WEXITSTATUS(status_duplicate) != 0 &&
                 said != NULL && strstr(said, "start no second one") != NULL;
  free(said);
  if (!refused) {
    show(&duplicate, 1);
    fail_msg("a second agent for a live node was not refused");
  }
  node_kill(&nodes[0]);
  agent_start(&nodes[NODES], 0, 1, folder, job_name, job_flags, steps);
  /* It registers once node 0's lease has ended, as a spare node with a spare of its own. */
  if (!event_await(&nodes[NODES], "agent_rejoin", -1, 0, 30000) ||
      !event_await(&nodes[NODES], "ready", -1, -1, 30000)) {
    show(nodes, NODES + 1);
    fail_msg("node 0 started again did not come back as a spare node");
  }
  keel_test_events log;
  keel_test_events_read(nodes[NODES].events, MAX_EVENTS, &log);
  const char *rejoin = keel_test_events_find(&log, "agent_rejoin", -1);
  assert_non_null(strstr(rejoin, "\"by\":\"store\""));
  assert_non_null(strstr(keel_test_events_find(&log, "agent_start", -1), "\"role\":\"spare\""));
  keel_test_events_free(&log);
  /* Node 2's spare took rank 0; the next loss is node 1's, and only node 0's spare is left. */
  node_kill(&nodes[1]);
  int status_spare_node = -1, status_again = -1;
  bool ended = keel_test_wait(nodes[2].agent, 120000 * keel_test_slowdown(), &status_spare_node) &&
               keel_test_wait(nodes[NODES].agent, 30000 * keel_test_slowdown(), &status_again);
  if (!ended || !WIFEXITED(status_spare_node) || WEXITSTATUS(status_spare_node) != 0 ||
      !WIFEXITED(status_again) || WEXITSTATUS(status_again) != 0) {
    show(nodes, NODES + 1);
    fail_msg("the job did not end well on node 2 and node 0's second life");
  }
  /* The two ranks finished on node 2 and on node 0's second life, with one model. */
  keel_test_toy_final finals[2][KEEL_TEST_MAX_FINALS];
  assert_int_equal(
      keel_test_toy_finals_read(nodes[2].output, finals[0], KEEL_TEST_MAX_FINALS, NULL), 1);
  assert_int_equal(
      keel_test_toy_finals_read(nodes[NODES].output, finals[1], KEEL_TEST_MAX_FINALS, NULL), 1);
  assert_int_equal(finals[0][0].crc, finals[1][0].crc);
  assert_int_equal(finals[0][0].world, 2);
  assert_int_equal(finals[1][0].world, 2);
  assert_int_equal(finals[0][0].step, 1500);
  assert_int_equal(finals[1][0].step, 1500);
  assert_int_not_equal(finals[0][0].rank, finals[1][0].rank);
  for (int node = 0; node <= NODES; node++) keel_test_wait(nodes[node].agent, 5000, NULL);
}

int main(void) {
  char reason[256];
  cluster = keel_test_etcd_start(1, 30000, reason, sizeof reason);
  if (cluster == NULL) {
    fprintf(stderr, "test_etcd_nodes: %s\n", reason);
    /* Not installed: skipped (ctest's SKIP_RETURN_CODE); installed but broken: failed. */
    return strstr(reason, "not installed") != NULL ? 77 : 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(root_killed_after_its_decision_another_finishes),
      cmocka_unit_test(a_host_started_again_comes_back_as_a_spare_node),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  keel_test_kill_all();
  keel__etcd_cluster_destroy(cluster);
  return keel_test_finish(failed);
}
