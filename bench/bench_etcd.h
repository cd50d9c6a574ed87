/* A one-member etcd for the benchmarks that compare keel's etcd backend with the embedded
 * store (bench/nodes.c, bench/store_load.c): started on free ports of 127.0.0.1 with its data
 * in a folder of the caller's, with the tests' fast raft settings and --unsafe-no-fsync
 * (tests/support/test_etcd.c), ready once a put through keel's own client succeeds; killed
 * by pid and reaped. Header-only, like bench_jobs.h. */
#ifndef KEEL_BENCH_ETCD_H
#define KEEL_BENCH_ETCD_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "bench_jobs.h"
#include "keel/store.h"

/* Raft heartbeat and election timeout (ms): etcd's least lease TTL, 1.5 election
 * timeouts, stays under keel's 1 s heartbeat. */
#define BENCH_ETCD_HEARTBEAT_MS "50"
#define BENCH_ETCD_ELECTION_MS "500"
#define BENCH_ETCD_READY_LIMIT_NS (20 * BENCH_SECOND_NS)
#define BENCH_ETCD_ATTEMPTS 3

typedef struct bench_etcd {
  bench_job process; /* etcd itself; its output in process.log_path */
  char program[PATH_MAX];
  char data_dir[PATH_MAX];
  char endpoint[64]; /* etcd://127.0.0.1:<client port> */
} bench_etcd;

/* given if not NULL, else etcd on PATH, else /usr/bin/etcd (Debian's etcd-server). */
static inline bool bench_etcd_find(const char *given, char *path, size_t capacity) {
  if (given != NULL)
    return snprintf(path, capacity, "%s", given) < (int)capacity && access(path, X_OK) == 0;
  char folders[4096];
  const char *search = getenv("PATH");
  snprintf(folders, sizeof folders, "%s:/usr/bin", search ? search : "");
  char *save = NULL;
  for (char *folder = strtok_r(folders, ":", &save); folder; folder = strtok_r(NULL, ":", &save)) {
    if (snprintf(path, capacity, "%s/etcd", folder) < (int)capacity && access(path, X_OK) == 0)
      return true;
  }
  return false;
}

/* Two distinct free ports of 127.0.0.1, both held until both are known. Another process may
 * take one before etcd binds it: the start is then tried again. */
static inline bool bench_etcd_ports(int *client_port, int *peer_port) {
  int sockets[2] = {-1, -1}, ports[2] = {0, 0};
  bool picked = true;
  for (int i = 0; i < 2 && picked; i++) {
    sockets[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in address = {.sin_family = AF_INET};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    picked = sockets[i] >= 0 && bind(sockets[i], (struct sockaddr *)&address, length) == 0 &&
             getsockname(sockets[i], (struct sockaddr *)&address, &length) == 0;
    ports[i] = ntohs(address.sin_port);
  }
  for (int i = 0; i < 2; i++) {
    if (sockets[i] >= 0) close(sockets[i]);
  }
  *client_port = ports[0];
  *peer_port = ports[1];
  return picked;
}

static inline keel_status bench_etcd_spawn(bench_etcd *etcd, int client_port, int peer_port) {
  char client_url[48], peer_url[48], cluster[64], token[48];
  snprintf(client_url, sizeof client_url, "http://127.0.0.1:%d", client_port);
  snprintf(peer_url, sizeof peer_url, "http://127.0.0.1:%d", peer_port);
  snprintf(cluster, sizeof cluster, "b0=%s", peer_url);
  snprintf(token, sizeof token, "keel-bench-%ld-%d", (long)getpid(), client_port);
  snprintf(etcd->endpoint, sizeof etcd->endpoint, "etcd://127.0.0.1:%d", client_port);
  const char *argv[] = {etcd->program,
                        "--name",
                        "b0",
                        "--data-dir",
                        etcd->data_dir,
                        "--listen-client-urls",
                        client_url,
                        "--advertise-client-urls",
                        client_url,
                        "--listen-peer-urls",
                        peer_url,
                        "--initial-advertise-peer-urls",
                        peer_url,
                        "--initial-cluster",
                        cluster,
                        "--initial-cluster-state",
                        "new",
                        "--initial-cluster-token",
                        token,
                        "--unsafe-no-fsync",
                        "--heartbeat-interval",
                        BENCH_ETCD_HEARTBEAT_MS,
                        "--election-timeout",
                        BENCH_ETCD_ELECTION_MS,
                        NULL};
  return bench_job_spawn(&etcd->process, argv, NULL);
}

/* Whether something accepts connections on the port of 127.0.0.1 (asked before keel's client
 * is, which would log every refusal while etcd starts). */
static inline bool bench_etcd_listening(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool listening = fd >= 0 && connect(fd, (struct sockaddr *)&address, sizeof address) == 0;
  if (fd >= 0) close(fd);
  return listening;
}

/* Ready: it listens, and a put through keel's etcd backend succeeds (a leader is elected).
 * False if etcd exited (a port lost to another process) or did not get ready in time. */
static inline bool bench_etcd_ready(bench_etcd *etcd, int client_port) {
  int64_t deadline = keel_now_ns() + BENCH_ETCD_READY_LIMIT_NS;
  while (!bench_etcd_listening(client_port)) {
    if (bench_job_try_reap(&etcd->process) || keel_now_ns() >= deadline) return false;
    bench_sleep_ns(50 * 1000 * 1000);
  }
  keel_auth auth = {.job_id = 1};
  keel_store *store = NULL;
  bool ready = keel_store_connect(etcd->endpoint, &auth, deadline, &store) == KEEL_OK &&
               keel_store_put(store, "bench/ready", "1", 1, 0, NULL) == KEEL_OK;
  keel_store_close(store);
  return ready;
}

/* Starts etcd with its data and log under directory; false, with why, if it cannot. */
static inline bool bench_etcd_start(bench_etcd *etcd, const char *directory, char *why,
                                    size_t capacity) {
  bool paths = bench_job_paths(&etcd->process, directory, "etcd") &&
               snprintf(etcd->data_dir, sizeof etcd->data_dir, "%s/etcd-data", directory) <
                   (int)sizeof etcd->data_dir;
  if (!paths) {
    snprintf(why, capacity, "paths too long under %s", directory);
    return false;
  }
  for (int attempt = 0; attempt < BENCH_ETCD_ATTEMPTS; attempt++) {
    int client_port, peer_port;
    bench_remove_tree(etcd->data_dir);
    if (!bench_etcd_ports(&client_port, &peer_port) ||
        bench_etcd_spawn(etcd, client_port, peer_port) != KEEL_OK)
      break;
    if (bench_etcd_ready(etcd, client_port)) return true;
    bench_job_kill(&etcd->process);
  }
  snprintf(why, capacity, "etcd did not start (its log: %s)", etcd->process.log_path);
  return false;
}

/* Kills etcd by its pid, reaps it and removes its data. */
static inline void bench_etcd_stop(bench_etcd *etcd) {
  bench_job_kill(&etcd->process);
  bench_remove_tree(etcd->data_dir);
}

#endif
