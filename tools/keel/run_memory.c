/* `keel run --ckpt mem`: the node's snapshot service (src/ckpt/mem_agent.c) runs inside the
 * node's agent, or inside the launcher of a one-node job; its folder in /dev/shm holds the
 * node's snapshots and the copies of its peers', and goes when the job ends. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launcher.h"

#define MEMORY_ROOT "/dev/shm"

static void job_folder(uint64_t job_id, char *path, size_t capacity) {
  snprintf(path, capacity, MEMORY_ROOT "/keel-%llu", (unsigned long long)job_id);
}

keel_status keel__mem_service_start(keel__launcher *launcher) {
  const keel__run_options *options = &launcher->options;
  if (options->ckpt != KEEL__CKPT_MEM) return KEEL_OK;
  char job[64];
  job_folder(launcher->auth.job_id, job, sizeof job);
  int64_t node = launcher->agent.active ? launcher->agent.node : 0;
  snprintf(launcher->mem_dir, sizeof launcher->mem_dir, "%s/node-%lld", job, (long long)node);
  const char *host = getenv("KEEL_HOST");
  keel_ckpt_agent_options service = {
      .auth = launcher->auth,
      .store = launcher->endpoint,
      .host = host != NULL ? host : "127.0.0.1",
      .directory = launcher->mem_dir,
      .node = (uint32_t)node,
      .nodes = (uint32_t)options->nnodes,
      .ranks_per_node = (uint32_t)options->nproc_per_node,
      .config = options->mem_config,
  };
  if (options->persist_every_steps > 0 || options->persist_every_ns > 0) {
    service.persist_directory = launcher->ckpt_dir;
    service.persist_every_steps = (uint64_t)options->persist_every_steps;
    service.persist_every_ns = options->persist_every_ns;
  }
  keel_status status = keel_ckpt_agent_start(&service, &launcher->mem_agent);
  if (status != KEEL_OK) {
    fprintf(stderr, "keel run: cannot start the snapshot service of node %lld: %s\n",
            (long long)node, keel_strerror(status));
    return status;
  }
  keel__event_emit(launcher, "mem_service", "\"node\":%lld,\"address\":\"%s\"", (long long)node,
                   keel_ckpt_agent_address(launcher->mem_agent));
  return KEEL_OK;
}

static int remove_entry(const char *path, const struct stat *info, int type, struct FTW *walk) {
  (void)info;
  (void)type;
  (void)walk;
  remove(path);
  return 0;
}

void keel__mem_folder_remove(const keel__launcher *launcher) {
  if (launcher->options.ckpt != KEEL__CKPT_MEM) return;
  char job[64];
  job_folder(launcher->auth.job_id, job, sizeof job);
  nftw(job, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void keel__mem_service_stop(keel__launcher *launcher) {
  if (launcher->mem_agent == NULL) return;
  keel_ckpt_agent_stats stats;
  keel_ckpt_agent_stats_get(launcher->mem_agent, &stats);
  keel__event_emit(launcher, "mem_service_end",
                   "\"sent\":%llu,\"received\":%llu,\"persisted\":%llu,"
                   "\"persisted_bytes\":%llu,\"persist_ms\":%.3f,\"persist_failed\":%llu,"
                   "\"persist_last_failure\":\"%s\"",
                   (unsigned long long)stats.sent, (unsigned long long)stats.received,
                   (unsigned long long)stats.persisted, (unsigned long long)stats.persisted_bytes,
                   (double)stats.persist_ns / 1e6, (unsigned long long)stats.persist_failed,
                   stats.persist_failed > 0 ? keel_status_name(stats.persist_last_status) : "none");
  keel_ckpt_agent_stop(launcher->mem_agent);
  launcher->mem_agent = NULL;
  /* On one host the supervisor removes every node's folder at the end; an agent of a host of
   * its own (or a one-node launcher) removes what it kept. */
  if (!launcher->agent.supervised) keel__mem_folder_remove(launcher);
}
