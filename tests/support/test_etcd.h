/* A real etcd cluster for keel's tests: members started as processes on 127.0.0.1 with
 * free ports and data in a fresh temp folder, then killed, frozen, resumed and restarted
 * by pid, so the store's etcd backend meets real leader changes and real dead members.
 * A cluster is used from one thread; several clusters may run at once. */
#ifndef KEEL_TEST_ETCD_H
#define KEEL_TEST_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The most members one cluster may have. */
#define KEEL_TEST_ETCD_MAX_MEMBERS 7

typedef struct keel_test_etcd keel_test_etcd;

/* Starts `members` etcd processes (1..KEEL_TEST_ETCD_MAX_MEMBERS) on 127.0.0.1, each with a
 * free client and peer port, its data dir and log file in a fresh keel_test_tempdir,
 * --unsafe-no-fsync, heartbeat 50 ms and election timeout 500 ms (a killed leader is
 * replaced within about a second; etcd's minimum lease TTL, 1.5 election timeouts rounded
 * up, is 1 s) and a unique cluster token. Blocks until every member
 * answers /health with "true" and they agree on a leader, within timeout_ms (times
 * keel_test_slowdown()); a start that lost a port to another process is retried. Returns
 * the cluster (the caller destroys it), or NULL with a one-line reason in reason
 * (capacity bytes): etcd is not installed, or it did not come up, in which case the
 * members' logs are printed to stderr and everything started is killed and removed.
 * The programs are $KEEL_TEST_ETCD and $KEEL_TEST_ETCDCTL when set, else found on PATH or
 * in /usr/bin. */
keel_test_etcd *keel_test_etcd_start(int members, int timeout_ms, char *reason, size_t capacity);

int keel_test_etcd_members(const keel_test_etcd *cluster);
/* "etcd://127.0.0.1:A,127.0.0.1:B,...": every member's client address, killed ones
 * included (a client must cope with them). Owned by the cluster. */
const char *keel_test_etcd_endpoint(const keel_test_etcd *cluster);
/* "127.0.0.1:A": member's client address (NULL for an index out of range). */
const char *keel_test_etcd_member_address(const keel_test_etcd *cluster, int member);
/* The member's pid, 0 while it is killed (or for an index out of range). */
pid_t keel_test_etcd_pid(const keel_test_etcd *cluster, int member);
/* The member's state letter from /proc/<pid>/stat ('R', 'S', 'T' when stopped, ...), or 0
 * when it is not running. */
char keel_test_etcd_state(const keel_test_etcd *cluster, int member);

/* Index of the leader that the running, unstopped members report, polling until they all
 * answer alike and the leader is one of them that answered, or -1 after timeout_ms (times
 * keel_test_slowdown()). Blocks; talks HTTP to each member's client port. */
int keel_test_etcd_leader(keel_test_etcd *cluster, int timeout_ms);

/* SIGKILLs the member (its process group) and reaps it; false if it was not running. */
bool keel_test_etcd_kill(keel_test_etcd *cluster, int member);
/* SIGSTOP: true once /proc says the member is stopped ('T'), within a second. */
bool keel_test_etcd_stop(keel_test_etcd *cluster, int member);
/* SIGCONT: true once /proc says the member runs again, within a second. */
bool keel_test_etcd_resume(keel_test_etcd *cluster, int member);
/* Starts a killed member again on its ports and data dir (--initial-cluster-state
 * existing) and waits until it answers /health with "true", within timeout_ms (times
 * keel_test_slowdown()); false if it was running, could not start or stayed unhealthy
 * (its log is printed then; one still running is ended by destroy). */
bool keel_test_etcd_restart(keel_test_etcd *cluster, int member, int timeout_ms);

/* Runs `etcdctl --endpoints=ENDPOINTS ARGS...` (args NULL-terminated) to completion within
 * timeout_ms (times keel_test_slowdown()), ENDPOINTS being every running, unstopped member
 * when endpoints is NULL. Copies its stdout and stderr into output (capacity bytes; may be
 * NULL). Returns etcdctl's exit code, or -1 on timeout, when no member is running or when
 * etcdctl is not installed (then output says "not installed"). Blocks. */
int keel_test_etcd_ctl(keel_test_etcd *cluster, const char *endpoints, const char *const args[],
                       int timeout_ms, char *output, size_t capacity);

/* Prints every member's log to stderr (for failing tests). */
void keel_test_etcd_print_logs(const keel_test_etcd *cluster);
/* The cluster's temp folder (data dirs and logs). Owned by the cluster. */
const char *keel_test_etcd_folder(const keel_test_etcd *cluster);
/* Kills every member by pid (SIGCONT first if stopped), reaps them, removes the temp
 * folder and frees the cluster. NULL is fine. */
void keel_test_etcd_destroy(keel_test_etcd *cluster);

#endif
