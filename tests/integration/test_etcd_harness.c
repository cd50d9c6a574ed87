/* The etcd test harness (tests/support/test_etcd.c) against real etcd members: start a
 * cluster, find its leader, put and get, kill the leader and see another elected, restart
 * it, stop and resume a follower, then check that no process and no folder is left. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_etcd.h"
#include "test_support.h"

#define START_MS 20000
/* An election timeout is 500 ms: a new leader is due within about a second. */
#define LEADER_MS 5000
#define CTL_MS 10000
#define MAX_PIDS 16

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Every pid a cluster has had, to check after destroy that none survives. */
typedef struct seen_pids {
  pid_t pid[MAX_PIDS];
  int count;
} seen_pids;

static void remember(seen_pids *seen, pid_t pid) {
  if (pid > 0 && seen->count < MAX_PIDS) seen->pid[seen->count++] = pid;
}

static int64_t now_ms(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* Starts a cluster into *state (the teardown destroys it if a check fails); skips the test,
 * saying why, when etcd is not installed. */
static keel__etcd_cluster *start_or_skip(void **state, int members, seen_pids *seen) {
  char reason[256];
  keel__etcd_cluster *cluster = keel_test_etcd_start(members, START_MS, reason, sizeof reason);
  if (cluster == NULL && strstr(reason, "not installed") != NULL) {
    fprintf(stderr, "skipped: %s\n", reason);
    skip();
  }
  if (cluster == NULL) fail_msg("%s", reason);
  *state = cluster;
  for (int i = 0; i < members; i++) remember(seen, keel__etcd_cluster_pid(cluster, i));
  return cluster;
}

/* Fails the test with the members' logs when a step did not go as expected. */
static void expect(const keel__etcd_cluster *cluster, bool ok, const char *what) {
  if (ok) return;
  keel__etcd_cluster_print_logs(cluster);
  fail_msg("%s", what);
}

/* Runs etcdctl (every live member when endpoints is NULL) and checks that it succeeds and
 * prints wanted; skips the test, saying why, when etcdctl is not installed. */
static void ctl_expect(keel__etcd_cluster *cluster, const char *endpoints, const char *const args[],
                       const char *wanted) {
  char output[1024];
  int code = keel_test_etcd_ctl(cluster, endpoints, args, CTL_MS, output, sizeof output);
  if (code == 0 && strstr(output, wanted) != NULL) return;
  if (code == -1 && strstr(output, "not installed") != NULL) {
    fprintf(stderr, "skipped: %s\n", output);
    skip();
  }
  fprintf(stderr, "etcdctl %s: exit %d, output:\n%s\n", args[0], code, output);
  expect(cluster, false, "etcdctl did not do what was asked");
}

/* Destroys the cluster and checks that every pid it had is gone and its folder removed. */
static void destroy_and_check(void **state, const seen_pids *seen) {
  keel__etcd_cluster *cluster = *state;
  char folder[512];
  snprintf(folder, sizeof folder, "%s", keel__etcd_cluster_folder(cluster));
  keel__etcd_cluster_destroy(cluster);
  *state = NULL;
  for (int i = 0; i < seen->count; i++) assert_false(keel_test_pid_exists(seen->pid[i]));
  assert_int_not_equal(access(folder, F_OK), 0);
}

static int destroy_cluster(void **state) {
  keel__etcd_cluster_destroy(*state);
  *state = NULL;
  return 0;
}

/* The endpoint lists every member's client address, and a leader is found. */
static int check_layout(keel__etcd_cluster *cluster, int members) {
  const char *endpoint = keel__etcd_cluster_endpoint(cluster);
  assert_int_equal(keel__etcd_cluster_members(cluster), members);
  assert_int_equal(strncmp(endpoint, "etcd://", 7), 0);
  for (int i = 0; i < members; i++) {
    assert_non_null(strstr(endpoint, keel__etcd_cluster_member_address(cluster, i)));
  }
  assert_null(keel__etcd_cluster_member_address(cluster, members));
  int leader = keel__etcd_cluster_leader(cluster, LEADER_MS);
  expect(cluster, leader >= 0, "no leader in a fresh cluster");
  return leader;
}

/* A world of one: it leads itself and serves puts alone. */
static void test_single_member(void **state) {
  seen_pids seen = {0};
  int64_t began = now_ms();
  keel__etcd_cluster *cluster = start_or_skip(state, 1, &seen);
  print_message("1 member up in %lld ms\n", (long long)(now_ms() - began));
  assert_int_equal(check_layout(cluster, 1), 0);
  ctl_expect(cluster, NULL, ARGS("put", "/keel/one", "1"), "OK");
  ctl_expect(cluster, NULL, ARGS("get", "--print-value-only", "/keel/one"), "1");
  destroy_and_check(state, &seen);
}

/* Kills the leader: another member leads within a couple of election timeouts and a put
 * through the survivors succeeds. Returns the new leader. */
static int kill_leader(keel__etcd_cluster *cluster, int leader) {
  pid_t old_pid = keel__etcd_cluster_pid(cluster, leader);
  assert_true(keel__etcd_cluster_kill(cluster, leader));
  assert_false(keel_test_pid_exists(old_pid));
  assert_int_equal(keel__etcd_cluster_pid(cluster, leader), 0);
  assert_false(keel__etcd_cluster_kill(cluster, leader));
  assert_false(keel__etcd_cluster_stop(cluster, leader));
  int64_t killed = now_ms();
  int next = keel__etcd_cluster_leader(cluster, LEADER_MS);
  print_message("new leader %d after %lld ms\n", next, (long long)(now_ms() - killed));
  expect(cluster, next >= 0 && next != leader, "no new leader after the leader was killed");
  ctl_expect(cluster, NULL, ARGS("put", "/keel/after", "kill"), "OK");
  return next;
}

/* Restarts a killed member on its data: it is healthy, has caught up, and all agree. */
static void restart_member(keel__etcd_cluster *cluster, int member, seen_pids *seen) {
  int64_t began = now_ms();
  expect(cluster, keel__etcd_cluster_restart(cluster, member, START_MS), "restart failed");
  print_message("member %d healthy again after %lld ms\n", member, (long long)(now_ms() - began));
  remember(seen, keel__etcd_cluster_pid(cluster, member));
  assert_false(keel__etcd_cluster_restart(cluster, member, START_MS));
  ctl_expect(cluster, keel__etcd_cluster_member_address(cluster, member),
             ARGS("get", "--print-value-only", "/keel/after"), "kill");
  expect(cluster, keel__etcd_cluster_leader(cluster, LEADER_MS) >= 0, "no agreed leader");
}

/* Stops a follower: /proc shows it stopped, the others still agree on a leader and take
 * puts; resumed, it runs and agrees again. */
static void stop_follower(keel__etcd_cluster *cluster) {
  int leader = keel__etcd_cluster_leader(cluster, LEADER_MS);
  expect(cluster, leader >= 0, "no leader before stopping a follower");
  int follower = (leader + 1) % keel__etcd_cluster_members(cluster);
  assert_true(keel__etcd_cluster_stop(cluster, follower));
  assert_int_equal(keel__etcd_cluster_state(cluster, follower), 'T');
  int during = keel__etcd_cluster_leader(cluster, LEADER_MS);
  expect(cluster, during >= 0 && during != follower, "no leader while a follower is stopped");
  ctl_expect(cluster, NULL, ARGS("put", "/keel/while", "stopped"), "OK");
  assert_true(keel__etcd_cluster_resume(cluster, follower));
  assert_int_not_equal(keel__etcd_cluster_state(cluster, follower), 'T');
  expect(cluster, keel__etcd_cluster_leader(cluster, LEADER_MS) >= 0, "no leader after resume");
}

static void test_three_members_with_faults(void **state) {
  seen_pids seen = {0};
  int64_t began = now_ms();
  keel__etcd_cluster *cluster = start_or_skip(state, 3, &seen);
  print_message("3 members up in %lld ms\n", (long long)(now_ms() - began));
  int leader = check_layout(cluster, 3);
  int follower = (leader + 1) % 3;
  ctl_expect(cluster, NULL, ARGS("put", "/keel/harness", "hello"), "OK");
  ctl_expect(cluster, keel__etcd_cluster_member_address(cluster, follower),
             ARGS("get", "--print-value-only", "/keel/harness"), "hello");
  /* etcd raises a lease's TTL to its minimum, 1.5 election timeouts rounded up: 1 s here. */
  ctl_expect(cluster, NULL, ARGS("lease", "grant", "1"), "TTL(1s)");
  int next = kill_leader(cluster, leader);
  restart_member(cluster, leader, &seen);
  assert_int_not_equal(keel__etcd_cluster_state(cluster, next), 0);
  stop_follower(cluster);
  destroy_and_check(state, &seen);
  print_message("whole run %lld ms\n", (long long)(now_ms() - began));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_single_member, destroy_cluster),
      cmocka_unit_test_teardown(test_three_members_with_faults, destroy_cluster),
  };
  return keel_test_finish(cmocka_run_group_tests(tests, NULL, NULL));
}
