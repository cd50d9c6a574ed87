/* A real etcd cluster for keel's tests: the tool's own clusters (tools/keel/etcd_cluster.h,
 * also behind `keel chaos --etcd`), started in a test folder with every wait stretched by
 * the build's slowdown, and etcdctl run against them. */
#ifndef KEEL_TEST_ETCD_H
#define KEEL_TEST_ETCD_H

#include <stddef.h>

#include "etcd_cluster.h"

/* keel__etcd_cluster_start with the cluster's folder in a fresh keel_test_tempdir (kept when
 * a test fails) and its waits stretched by keel_test_slowdown(). The program is
 * $KEEL_TEST_ETCD when set. */
keel__etcd_cluster *keel_test_etcd_start(int members, int timeout_ms, char *reason,
                                         size_t capacity);

/* Runs `etcdctl --endpoints=ENDPOINTS ARGS...` (args NULL-terminated) to completion within
 * timeout_ms (times keel_test_slowdown()), ENDPOINTS being every running, unstopped member
 * when endpoints is NULL. Copies its stdout and stderr into output (capacity bytes; may be
 * NULL). Returns etcdctl's exit code, or -1 on timeout, when no member is running or when
 * etcdctl ($KEEL_TEST_ETCDCTL, else on PATH) is not installed (then output says "not
 * installed"). Blocks. */
int keel_test_etcd_ctl(keel__etcd_cluster *cluster, const char *endpoints, const char *const args[],
                       int timeout_ms, char *output, size_t capacity);

#endif
