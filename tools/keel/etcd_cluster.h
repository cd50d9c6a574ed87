/* etcd clusters that keel starts itself: members as processes on 127.0.0.1 (or an address of
 * this host that network namespaces reach) with free ports and their data in a folder of the
 * caller's, killed, frozen, resumed and restarted by pid.
 * `keel chaos --etcd N` fails the members of its job's store with it, and keel's tests use
 * it (tests/support/test_etcd.h) so that the etcd backend meets real leader changes and real
 * dead members. A cluster is used from one thread; several clusters may run at once. */
#ifndef KEEL_TOOL_ETCD_CLUSTER_H
#define KEEL_TOOL_ETCD_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The most members one cluster may have. */
#define KEEL__ETCD_MAX_MEMBERS 7

typedef struct keel__etcd_cluster keel__etcd_cluster;

/* Starts `members` etcd processes (1..KEEL__ETCD_MAX_MEMBERS) on 127.0.0.1, each with a free
 * client and peer port, its data dir and log file in a fresh folder made under parent,
 * --unsafe-no-fsync, heartbeat 50 ms and election timeout 500 ms (a killed leader is
 * replaced within about a second; etcd's minimum lease TTL, 1.5 election timeouts rounded
 * up, is 1 s) and a unique cluster token. Each member is SIGKILLed if the thread that
 * started it ends (PR_SET_PDEATHSIG): a caller that dies leaves no etcd behind. Blocks until
 * every member answers /health with "true" and they agree on a leader, within timeout_ms; a
 * start that lost a port to another process is retried. Every wait of the cluster (this
 * one, and those inside the calls below) is stretched time_scale times (sanitizer builds).
 * Returns the cluster (the caller destroys it), or NULL with a one-line reason in reason
 * (capacity bytes): etcd is not installed ("not installed" in the reason), or it did not
 * come up, in which case the members' logs are copied to stderr and everything started is
 * killed and removed. The program is $KEEL_ETCD (or the older $KEEL_TEST_ETCD) when set,
 * else found on PATH or in /usr/bin. */
keel__etcd_cluster *keel__etcd_cluster_start(int members, const char *parent, int time_scale,
                                             int timeout_ms, char *reason, size_t capacity);
/* The same with the members' client address client_host (IPv4 text; NULL: 127.0.0.1), an
 * address of this host where clients in other network namespaces reach them (the bridge of
 * a network of no nodes, netns.h): they listen there and on 127.0.0.1, advertise it, and
 * the endpoint names it. Their peer traffic stays on 127.0.0.1. */
keel__etcd_cluster *keel__etcd_cluster_start_at(int members, const char *client_host,
                                                const char *parent, int time_scale, int timeout_ms,
                                                char *reason, size_t capacity);

int keel__etcd_cluster_members(const keel__etcd_cluster *cluster);
/* "etcd://127.0.0.1:A,127.0.0.1:B,...": every member's client address, killed ones
 * included (a client must cope with them). Owned by the cluster. */
const char *keel__etcd_cluster_endpoint(const keel__etcd_cluster *cluster);
/* "127.0.0.1:A": member's client address (NULL for an index out of range). */
const char *keel__etcd_cluster_member_address(const keel__etcd_cluster *cluster, int member);
/* The member's pid, 0 while it is killed (or for an index out of range). */
pid_t keel__etcd_cluster_pid(const keel__etcd_cluster *cluster, int member);
/* The member's state letter from /proc/<pid>/stat ('R', 'S', 'T' when stopped, ...), or 0
 * when it is not running. */
char keel__etcd_cluster_state(const keel__etcd_cluster *cluster, int member);
/* "a,b": the client addresses of the members that run and are not stopped ("" if none). */
void keel__etcd_cluster_live_endpoints(const keel__etcd_cluster *cluster, char *list,
                                       size_t capacity);
/* The cluster's folder (data dirs and logs). Owned by the cluster. */
const char *keel__etcd_cluster_folder(const keel__etcd_cluster *cluster);

/* Index of the leader that the running, unstopped members report, polling until they all
 * answer alike and the leader is one of them that answered, or -1 after timeout_ms. Blocks;
 * talks HTTP to each member's client port. */
int keel__etcd_cluster_leader(keel__etcd_cluster *cluster, int timeout_ms);

/* SIGKILLs the member (its process group) and reaps it; false if it was not running. */
bool keel__etcd_cluster_kill(keel__etcd_cluster *cluster, int member);
/* SIGSTOP: true once /proc says the member is stopped ('T'), within a second. */
bool keel__etcd_cluster_stop(keel__etcd_cluster *cluster, int member);
/* SIGCONT: true once /proc says the member runs again, within a second. */
bool keel__etcd_cluster_resume(keel__etcd_cluster *cluster, int member);
/* Starts a killed member again on its ports and data dir (--initial-cluster-state
 * existing) and waits until it answers /health with "true", within timeout_ms; false if it
 * was running, could not start or stayed unhealthy (its log is copied to stderr then; one
 * still running is ended by destroy). */
bool keel__etcd_cluster_restart(keel__etcd_cluster *cluster, int member, int timeout_ms);

/* Finds a program: the path in the environment variable override when it is set (another
 * etcd build, or a missing one to see the tests skip), else on PATH, then in /usr/bin where
 * Debian's etcd-server and etcd-client put it. Writes it into path (capacity bytes); false
 * when there is none. */
bool keel__etcd_program_find(const char *name, const char *override, char *path, size_t capacity);

/* Copies every member's log to stderr (for a failure's diagnosis). */
void keel__etcd_cluster_print_logs(const keel__etcd_cluster *cluster);
/* Kills every member by pid (SIGCONT first if stopped), reaps them, removes the cluster's
 * folder (not parent) and frees the cluster. NULL is fine. */
void keel__etcd_cluster_destroy(keel__etcd_cluster *cluster);

#endif
