/* A one-member etcd for the benchmarks that compare keel's etcd backend with the embedded
 * store (bench/nodes.c, bench/store_load.c): the tool's own clusters
 * (tools/keel/etcd_cluster.h: free ports of 127.0.0.1, the tests' fast raft settings,
 * --unsafe-no-fsync, ready once /health says so), with its data and log in a folder of the
 * caller's, killed by pid and removed at the end. Header-only, like bench_jobs.h. */
#ifndef KEEL_BENCH_ETCD_H
#define KEEL_BENCH_ETCD_H

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>

#include "etcd_cluster.h"

#define BENCH_ETCD_START_MS 20000

typedef struct bench_etcd {
  keel__etcd_cluster *cluster;
  char program[PATH_MAX];
  const char *endpoint; /* etcd://127.0.0.1:<client port>, the cluster's */
} bench_etcd;

/* given if not NULL (it becomes $KEEL_ETCD, which the cluster starts), else $KEEL_ETCD, on
 * PATH, or /usr/bin/etcd (Debian's etcd-server). */
static inline bool bench_etcd_find(const char *given, char *path, size_t capacity) {
  if (given != NULL) setenv("KEEL_ETCD", given, 1);
  return keel__etcd_program_find("etcd", "KEEL_ETCD", path, capacity);
}

/* Starts etcd with its data and log in a folder under directory; false, with why, if it
 * cannot. */
static inline bool bench_etcd_start(bench_etcd *etcd, const char *directory, char *why,
                                    size_t capacity) {
  etcd->cluster = keel__etcd_cluster_start(1, directory, 1, BENCH_ETCD_START_MS, why, capacity);
  etcd->endpoint = etcd->cluster != NULL ? keel__etcd_cluster_endpoint(etcd->cluster) : NULL;
  return etcd->cluster != NULL;
}

/* Kills etcd by its pid, reaps it and removes its data and log. */
static inline void bench_etcd_stop(bench_etcd *etcd) {
  keel__etcd_cluster_destroy(etcd->cluster);
  etcd->cluster = NULL;
  etcd->endpoint = NULL;
}

#endif
