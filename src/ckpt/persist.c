/* The persistent tier on the runtime: a checkpoint policy that saves the registered state at
 * every N-th step commit, and the same tier as a state source, which gives a rank that lacks
 * its shard (no survivor holds it) the snapshot of exactly the step the job is at. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"

#define MODULE "persist"

struct keel_ckpt_persist {
  keel_ctx *ctx;
  char directory[PATH_MAX];
  uint64_t every_steps;
  uint64_t saves;
  keel__ckpt_write_health health;
};

keel_ckpt_identity keel__ckpt_identity_now(keel_ctx *ctx, uint64_t step) {
  keel_comm *world = keel_world(ctx);
  uint32_t shards = keel_state_shards(ctx);
  uint32_t rank = (uint32_t)keel_comm_rank(world);
  return (keel_ckpt_identity){.job_id = keel_job_id(ctx),
                              .rank = rank,
                              .shard_index = rank % shards,
                              .shard_count = shards,
                              .replica = rank / shards,
                              .step = step,
                              .sequence = keel_comm_epoch(world)};
}

keel_ckpt_selector keel__ckpt_selector_exact(uint64_t job_id, uint32_t index, uint32_t count,
                                             uint64_t step) {
  return (keel_ckpt_selector){.job_id = job_id, .shard_index = index, .shard_count = count,
                              .max_step = step, .min_step = step};
}

/* The commit of step s leaves the state at the start of step s + 1: that is what is saved,
 * under that step's name. A save that fails (a full or read-only disk) does not fail the
 * commit: training goes on, the snapshots saved before stay whole, and the event and the
 * log say why (once per run of failures). */
static keel_status persist_on_commit(void *arg, uint64_t step) {
  keel_ckpt_persist *persist = arg;
  if ((step + 1) % persist->every_steps != 0) return KEEL_OK;
  keel_ckpt_identity identity = keel__ckpt_identity_now(persist->ctx, step + 1);
  int64_t started = keel_now_ns();
  char reason[KEEL__CKPT_REASON_BYTES] = "";
  keel_status status =
      keel__ckpt_persistent_save_with(&keel__ckpt_posix_file_ops, NULL, keel_state(persist->ctx),
                                      persist->directory, &identity, 0, reason);
  if (status == KEEL_OK) {
    persist->saves++;
    keel__ckpt_write_succeeded(&persist->health, "persistent");
  } else {
    keel__ckpt_write_failed(&persist->health, "persistent", persist->directory, status, reason);
  }
  char fields[160];
  snprintf(fields, sizeof fields,
           "\"step\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"save_ms\":%.3f,\"status\":\"%s\"",
           identity.step, keel_registry_bytes(keel_state(persist->ctx)),
           (double)(keel_now_ns() - started) / 1e6,
           status == KEEL_OK ? "ok" : keel_status_name(status));
  keel_report_event(persist->ctx, "persist_save", fields);
  return KEEL_OK;
}

static keel_status persist_restore(void *context, keel_registry *registry, uint32_t index,
                                   uint32_t count, uint64_t step) {
  keel_ckpt_persist *persist = context;
  keel_ckpt_selector selector =
      keel__ckpt_selector_exact(keel_job_id(persist->ctx), index, count, step);
  return keel_ckpt_persistent_restore(registry, persist->directory, &selector, NULL);
}

static const keel_state_source_ops persist_source = {
    .name = "persistent",
    .restore = persist_restore,
};

keel_status keel_ckpt_persist_enable(keel_ctx *ctx, const char *directory, uint64_t every_steps,
                                     keel_ckpt_persist **persist_p) {
  if (ctx == NULL || directory == NULL || every_steps == 0 || persist_p == NULL ||
      strlen(directory) >= PATH_MAX)
    return KEEL_EINVAL;
  keel_ckpt_persist *persist = calloc(1, sizeof *persist);
  if (persist == NULL) return KEEL_ENOMEM;
  persist->ctx = ctx;
  persist->every_steps = every_steps;
  snprintf(persist->directory, sizeof persist->directory, "%s", directory);
  keel_status status = keel_directory_make(persist->directory, 0700);
  if (status == KEEL_OK) status = keel_on_commit(ctx, persist_on_commit, persist);
  if (status == KEEL_OK) status = keel_state_source_add(ctx, &persist_source, persist);
  if (status != KEEL_OK) {
    KEEL_LOG_E(MODULE, "cannot keep checkpoints in %s: %s", directory, keel_strerror(status));
    free(persist);
    return status;
  }
  *persist_p = persist;
  return KEEL_OK;
}

uint64_t keel_ckpt_persist_saves(const keel_ckpt_persist *persist) {
  return persist == NULL ? 0 : persist->saves;
}

void keel_ckpt_persist_destroy(keel_ckpt_persist *persist) { free(persist); }
