/* Just-in-time checkpoints (JIT paper §3): the policy that saves only when a collective
 * fails. Its failure hook writes this rank's registered state into the persistent tier with
 * no collective; in a restarted process it restores this rank's shard from any replica, at
 * the newest step of which every shard has a complete snapshot. Registry, format, tiers
 * and restore are the engine's. */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"

#define MODULE "jit"

struct keel_ckpt_jit {
  keel_ctx *ctx;
  bool enabled;
  keel_registry *registry; /* the runtime's: the one registry */
  keel_ckpt_jit_options options;
  uint32_t shard_index, shard_count, replica; /* from the runtime, at enable */
  char directory[PATH_MAX];
  bool restored;
  keel_ckpt_identity used;
};

/* ---- configuration */

/* KEEL_CKPT: a comma-separated list of policies; `jit` is this engine's, `mem` the in-memory
 * tier's (mem.c). */
static keel_status policy_parse(const char *text, bool *jit_p) {
  *jit_p = false;
  if (text == NULL || *text == '\0' || strcmp(text, "none") == 0) return KEEL_OK;
  char copy[256];
  if (strlen(text) >= sizeof copy) return KEEL_EINVAL;
  snprintf(copy, sizeof copy, "%s", text);
  char *cursor = copy, *policy;
  while ((policy = strsep(&cursor, ",")) != NULL) {
    if (strcmp(policy, "mem") == 0) continue;
    if (strcmp(policy, "jit") != 0) {
      KEEL_LOG_E(MODULE, "KEEL_CKPT=%s: unknown checkpoint policy '%s' (expected jit or mem)", text,
                 policy);
      return KEEL_EINVAL;
    }
    *jit_p = true;
  }
  return KEEL_OK;
}

/* The shard and replica come from the runtime (keel_state_shard): rank r holds shard
 * r % count in replica group r / count. */
static keel_status options_resolve(keel_ckpt_jit *jit, const keel_ckpt_jit_options *options) {
  if (options != NULL) jit->options = *options;
  keel_ckpt_jit_options *resolved = &jit->options;
  int rank = keel_comm_rank(keel_world(jit->ctx));
  uint32_t shards = keel_state_shards(jit->ctx);
  jit->shard_count = shards;
  jit->shard_index = rank < 0 ? 0 : (uint32_t)rank % shards;
  jit->replica = rank < 0 ? 0 : (uint32_t)rank / shards;
  const char *directory = resolved->directory ? resolved->directory : getenv("KEEL_CKPT_DIR");
  if (directory == NULL || *directory == '\0') {
    KEEL_LOG_E(MODULE, "just-in-time checkpoints need a directory (KEEL_CKPT_DIR)");
    return KEEL_EINVAL;
  }
  if (strlen(directory) >= sizeof jit->directory) return KEEL_EINVAL;
  snprintf(jit->directory, sizeof jit->directory, "%s", directory);
  resolved->directory = jit->directory;
  keel_status status = keel_directory_make(jit->directory, 0700);
  if (status != KEEL_OK)
    KEEL_LOG_E(MODULE, "cannot make the checkpoint directory %s: %s", jit->directory,
               keel_strerror(status));
  return status;
}

/* ---- the save, on failure */

/* The save's file operations are the POSIX ones, except that the "save" fault point fires
 * just before the manifest is renamed into place: a kill there leaves every buffer written
 * and no manifest, the half-done save the restore must pass over. */
static int fault_renameat(void *context, int directory, const char *from, const char *to) {
  if (strcmp(to, "manifest") == 0) keel_fault_point((keel_ctx *)context, "save");
  return keel__ckpt_posix_file_ops.renameat(context, directory, from, to);
}

/* KEEL_FAULT corrupt@...,point=saved: flips one byte in the middle of the first non-empty
 * buffer file of the snapshot just saved, leaving its manifest whole, so only the chunk's
 * checksum can tell. */
static void snapshot_corrupt(const keel_ckpt_jit *jit, const keel_ckpt_identity *identity) {
  for (size_t index = 0; index < keel_registry_count(jit->registry); index++) {
    char path[PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/%" PRIu64 "/step-%" PRIu64 "/rank-%" PRIu32 "/buffer-%zu",
             jit->directory, identity->job_id, identity->step, identity->rank, index);
    int file = open(path, O_RDWR | O_CLOEXEC);
    if (file < 0) continue;
    struct stat info;
    uint8_t byte = 0;
    off_t middle = fstat(file, &info) == 0 ? info.st_size / 2 : 0;
    bool done = info.st_size > 0 && pread(file, &byte, 1, middle) == 1;
    byte ^= 0x5a;
    done = done && pwrite(file, &byte, 1, middle) == 1;
    close(file);
    if (done) {
      KEEL_LOG_W(MODULE, "injected fault: corrupted %s", path);
      return;
    }
  }
}

static void report_save(const keel_ckpt_jit *jit, const keel_failure *failure, keel_status status,
                        int64_t save_ns) {
  char fields[320];
  snprintf(fields, sizeof fields,
           "\"step\":%" PRIu64 ",\"bytes\":%" PRIu64
           ",\"save_ms\":%.3f,\"status\":\"%s\","
           "\"cause\":\"%s\",\"t_failed_ns\":%" PRId64,
           failure->step, keel_registry_bytes(jit->registry), (double)save_ns / 1e6,
           status == KEEL_OK ? "ok" : keel_status_name(status), keel_status_name(failure->cause),
           failure->failed_ns);
  keel_report_event(jit->ctx, "jit_save", fields);
}

static void jit_on_failure(void *arg, const keel_failure *failure) {
  keel_ckpt_jit *jit = arg;
  /* In-process recovery hands the state over from a healthy replica's memory; before the
   * first step there is nothing worth saving. A stop or a lost launcher saves as a restart
   * does: the process is about to exit. */
  if (!jit->enabled || failure->in_process || !failure->step_known) return;
  keel_comm *world = keel_world(jit->ctx);
  keel_ckpt_identity identity = {
      .job_id = keel_job_id(jit->ctx),
      .rank = (uint32_t)keel_comm_rank(world),
      .shard_index = jit->shard_index,
      .shard_count = jit->shard_count,
      .replica = jit->replica,
      .step = failure->step,
      .sequence = ((uint64_t)keel_restart_count(jit->ctx) << 32) | (failure->epoch & 0xffffffffu),
  };
  int64_t started = keel_now_ns();
  keel__ckpt_file_ops operations = keel__ckpt_posix_file_ops;
  operations.renameat = fault_renameat;
  keel_status status =
      keel__ckpt_persistent_save_with(&operations, jit->ctx, jit->registry, jit->directory,
                                      &identity, jit->options.chunk_bytes, NULL);
  int64_t save_ns = keel_now_ns() - started;
  if (status == KEEL_OK && keel_fault_point(jit->ctx, "saved")) snapshot_corrupt(jit, &identity);
  report_save(jit, failure, status, save_ns);
  if (status == KEEL_OK) {
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s/%" PRIu64, jit->directory, identity.job_id);
    keel_note_saved(jit->ctx, where);
    KEEL_LOG_I(MODULE, "saved step %" PRIu64 " in %.1f ms after %s", failure->step,
               (double)save_ns / 1e6, keel_strerror(failure->cause));
  } else {
    KEEL_LOG_E(MODULE,
               "just-in-time save of step %" PRIu64
               " failed: %s (another replica's "
               "snapshot will be used)",
               failure->step, keel_strerror(status));
  }
}

/* ---- the restore, in a restarted process */

static void report_restore(const keel_ckpt_jit *jit, keel_status status, int64_t restore_ns) {
  char fields[400];
  const keel_ckpt_identity *used = &jit->used;
  const char *outcome = status == KEEL_OK          ? "ok"
                        : status == KEEL_ENOTFOUND ? "none"
                                                   : keel_status_name(status);
  int length = snprintf(fields, sizeof fields,
                        "\"restart\":%" PRIu32 ",\"status\":\"%s\",\"restore_ms\":%.3f",
                        keel_restart_count(jit->ctx), outcome, (double)restore_ns / 1e6);
  if (status == KEEL_OK) {
    snprintf(fields + length, sizeof fields - (size_t)length,
             ",\"step\":%" PRIu64 ",\"from_rank\":%" PRIu32 ",\"replica\":%" PRIu32
             ",\"sequence\":%" PRIu64,
             used->step, used->rank, used->replica, used->sequence);
  }
  keel_report_event(jit->ctx, "jit_restore", fields);
}

/* The old job's folder `keel run --resume DIR` names: DIR is <root>/<job id>. */
static keel_status resume_source(const char *resume, char *root, size_t capacity,
                                 uint64_t *job_id_p) {
  const char *slash = strrchr(resume, '/');
  const char *name = slash ? slash + 1 : resume;
  /* Job ids are 64-bit and unsigned: past INT64_MAX too. */
  char *end = NULL;
  unsigned long long job_id = *name >= '1' && *name <= '9' ? strtoull(name, &end, 10) : 0;
  if (job_id == 0 || end == NULL || *end != '\0' || strlen(name) > 20) {
    KEEL_LOG_E(MODULE, "--resume %s: expected a job's checkpoint folder, <ckpt-dir>/<job id>",
               resume);
    return KEEL_EINVAL;
  }
  size_t root_length = slash ? (size_t)(slash - resume) : 1;
  if (root_length >= capacity) return KEEL_EINVAL;
  snprintf(root, capacity, "%.*s", (int)root_length, slash ? resume : ".");
  *job_id_p = (uint64_t)job_id;
  return KEEL_OK;
}

/* Restores this shard under root/<job_id> at the newest step every shard has. */
static keel_status restore_from(keel_ckpt_jit *jit, const char *root, uint64_t job_id) {
  keel_ckpt_selector selector = {.job_id = job_id,
                                 .shard_index = jit->shard_index,
                                 .shard_count = jit->shard_count,
                                 .max_step = UINT64_MAX,
                                 .common_step = true};
  int64_t started = keel_now_ns();
  keel_status status = keel_ckpt_persistent_restore(jit->registry, root, &selector, &jit->used);
  report_restore(jit, status, keel_now_ns() - started);
  return status;
}

/* Where the snapshots are: this job's own after a restart; failing those, the old job's of
 * `--resume` (a resumed job may fail before it saved anything of its own). */
static keel_status jit_restore(keel_ckpt_jit *jit) {
  char root[PATH_MAX];
  const char *resume = keel_resume_directory(jit->ctx);
  keel_status status = KEEL_ENOTFOUND;
  snprintf(root, sizeof root, "%s", jit->directory);
  if (keel_restart_count(jit->ctx) > 0) status = restore_from(jit, root, keel_job_id(jit->ctx));
  if (status == KEEL_ENOTFOUND && resume != NULL) {
    uint64_t job_id = 0;
    status = resume_source(resume, root, sizeof root, &job_id);
    if (status == KEEL_OK) status = restore_from(jit, root, job_id);
  }
  if (status == KEEL_ENOTFOUND) {
    KEEL_LOG_W(MODULE,
               "restart %" PRIu32 ": no complete checkpoint of shard %" PRIu32
               " in %s; starting from the initial state",
               keel_restart_count(jit->ctx), jit->shard_index, root);
    return KEEL_OK;
  }
  if (status != KEEL_OK) {
    KEEL_LOG_E(MODULE, "restart %" PRIu32 ": cannot restore from %s: %s",
               keel_restart_count(jit->ctx), root, keel_strerror(status));
    return status;
  }
  jit->restored = true;
  keel_mark_resume(jit->ctx, jit->used.step,
                   resume != NULL && keel_restart_count(jit->ctx) == 0 ? "resume" : "restart");
  KEEL_LOG_I(MODULE, "restored step %" PRIu64 " from rank %" PRIu32 " (replica %" PRIu32 ")",
             jit->used.step, jit->used.rank, jit->used.replica);
  return KEEL_OK;
}

/* ---- the public face */

keel_status keel_ckpt_jit_enable(keel_ctx *ctx, const keel_ckpt_jit_options *options,
                                 keel_ckpt_jit **jit_p) {
  if (ctx == NULL || jit_p == NULL) return KEEL_EINVAL;
  bool wanted = false;
  keel_status status = policy_parse(getenv("KEEL_CKPT"), &wanted);
  if (status != KEEL_OK) return status;
  keel_ckpt_jit *jit = calloc(1, sizeof *jit);
  if (jit == NULL) return KEEL_ENOMEM;
  jit->ctx = ctx;
  if (!wanted) {
    *jit_p = jit;
    return KEEL_OK;
  }
  jit->enabled = true;
  jit->registry = keel_state(ctx);
  if ((status = options_resolve(jit, options)) != KEEL_OK) goto fail_free;
  bool restarted = keel_restart_count(ctx) > 0 || keel_resume_directory(ctx) != NULL;
  if (restarted && (status = jit_restore(jit)) != KEEL_OK) goto fail_free;
  if ((status = keel_on_failure(ctx, jit_on_failure, jit)) != KEEL_OK) goto fail_free;
  *jit_p = jit;
  return KEEL_OK;

fail_free:
  free(jit);
  return status;
}

bool keel_ckpt_jit_restored(const keel_ckpt_jit *jit, keel_ckpt_identity *used_p) {
  if (jit == NULL || !jit->restored) return false;
  if (used_p) *used_p = jit->used;
  return true;
}

void keel_ckpt_jit_destroy(keel_ckpt_jit *jit) { free(jit); }
