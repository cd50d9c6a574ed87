/* The tests' side of etcd clusters (test_etcd.h): where a test's cluster lives, how long it
 * may take, and etcdctl for the harness's own checks. */
#include "test_etcd.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_support.h"

#define CTL_MAX_ARGS 48
#define ENDPOINTS_MAX (KEEL__ETCD_MAX_MEMBERS * 32)

keel__etcd_cluster *keel_test_etcd_start(int members, int timeout_ms, char *reason,
                                         size_t capacity) {
  const char *folder = keel_test_tempdir("keel-etcd");
  if (folder == NULL) {
    snprintf(reason, capacity, "cannot make a temp folder for etcd: %s", strerror(errno));
    return NULL;
  }
  return keel__etcd_cluster_start(members, folder, keel_test_slowdown(), timeout_ms, reason,
                                  capacity);
}

static void output_set(char *output, size_t capacity, const char *text) {
  if (output != NULL && capacity > 0) snprintf(output, capacity, "%s", text);
}

int keel_test_etcd_ctl(keel__etcd_cluster *cluster, const char *endpoints, const char *const args[],
                       int timeout_ms, char *output, size_t capacity) {
  output_set(output, capacity, "");
  char etcdctl[PATH_MAX];
  if (!keel__etcd_program_find("etcdctl", "KEEL_TEST_ETCDCTL", etcdctl, sizeof etcdctl)) {
    output_set(output, capacity, "etcdctl is not installed (etcd-client; scripts/deps.sh)");
    return -1;
  }
  char live[ENDPOINTS_MAX];
  if (endpoints == NULL) {
    keel__etcd_cluster_live_endpoints(cluster, live, sizeof live);
    endpoints = live;
  }
  /* An empty list would make etcdctl try its default, 127.0.0.1:2379: some other etcd. */
  if (*endpoints == '\0') {
    output_set(output, capacity, "no etcd member is running and unstopped");
    return -1;
  }
  char endpoints_flag[ENDPOINTS_MAX + 16];
  snprintf(endpoints_flag, sizeof endpoints_flag, "--endpoints=%s", endpoints);
  char *argv[CTL_MAX_ARGS + 3] = {etcdctl, endpoints_flag};
  for (int i = 0; i < CTL_MAX_ARGS && args[i] != NULL; i++) argv[2 + i] = (char *)args[i];
  /* An ETCDCTL_API=2 in the caller's environment would turn etcdctl 3.4 into the v2 tool. */
  char *const environment[] = {"ETCDCTL_API=3", NULL};
  char output_path[PATH_MAX];
  snprintf(output_path, sizeof output_path, "%s/etcdctl.out", keel__etcd_cluster_folder(cluster));
  unlink(output_path);
  int code = keel_test_run(argv, environment, output_path, timeout_ms);
  char *text = keel_test_read_file(output_path, NULL);
  if (text != NULL) output_set(output, capacity, text);
  free(text);
  return code;
}
