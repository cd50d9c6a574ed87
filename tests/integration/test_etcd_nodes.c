/* Agents on hosts of their own (keel agent --node-rank I --rdzv-endpoint etcd://...), with no
 * supervisor: only the root agent can declare a lost node's processes dead. A node is
 * killed whole, and the root agent's node right after its decision: another agent becomes
 * root, finishes the recovery, and the job ends on the last node. Exits 77 (skipped, with
 * the reason) without etcd. */
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

static void agent_start(node_run *node, int rank, const char *folder, const char *job_name) {
  char rank_text[12], timeout[16], heartbeat[16];
  snprintf(rank_text, sizeof rank_text, "%d", rank);
  /* Sanitizer builds run every process several times slower. The heartbeat (2 s, the
   * default) is the agents' lease: an etcd that a loaded machine stalls for more than 5/8 of
   * it fences healthy nodes, as it should. */
  keel_test_seconds_flag(180, timeout, sizeof timeout);
  keel_test_seconds_flag(2, heartbeat, sizeof heartbeat);
  snprintf(node->events, sizeof node->events, "%s/events-%d.jsonl", folder, rank);
  snprintf(node->output, sizeof node->output, "%s/output-%d.txt", folder, rank);
  char *argv[] = {(char *)keel_test_bin("keel"),
                  "agent",
                  "--node-rank",
                  rank_text,
                  "--nnodes",
                  "3",
                  "--nproc-per-node",
                  "1",
                  "--heartbeat",
                  heartbeat,
                  "--timeout",
                  timeout,
                  "--quiet",
                  "--rdzv-endpoint",
                  (char *)keel__etcd_cluster_endpoint(cluster),
                  "--rdzv-id",
                  (char *)job_name,
                  "--events",
                  node->events,
                  "--",
                  (char *)keel_test_program("toy_train"),
                  "--steps",
                  "600",
                  "--params",
                  "100000",
                  "--compute-ms",
                  "20",
                  NULL};
  node->agent = keel_test_spawn(argv, NULL, node->output);
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

static void show(const node_run *nodes) {
  for (int node = 0; node < NODES; node++) {
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
  node_run nodes[NODES];
  for (int rank = 0; rank < NODES; rank++) agent_start(&nodes[rank], rank, folder, job_name);
  if (!event_await(&nodes[0], "progress", 20, -1, 30000)) {
    show(nodes);
    fail_msg("the job did not reach step 20");
  }
  int root = root_node(nodes);
  assert_true(root >= 0);
  int victim = (root + 1) % NODES, survivor = (root + 2) % NODES;
  print_message("root is node %d; killing node %d, then the root\n", root, victim);
  node_kill(&nodes[victim]);
  /* The root decides once the victim's lease is gone, and writes it down first. */
  if (!event_await(&nodes[root], "root_decision", -1, victim, 15000)) {
    show(nodes);
    fail_msg("the root did not decide on node %d", victim);
  }
  node_kill(&nodes[root]);
  int status = -1;
  if (!keel_test_wait(nodes[survivor].agent, 90000 * keel_test_slowdown(), &status)) {
    show(nodes);
    fail_msg("the last node did not finish");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) show(nodes);
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
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  keel_test_kill_all();
  keel__etcd_cluster_destroy(cluster);
  return keel_test_finish(failed);
}
