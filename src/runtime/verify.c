/* Replica verification (--verify-replicas every=N): data-parallel replicas hold bit-identical
 * state by design, so silent corruption (a flipped bit in memory, a faulty core) shows as a
 * replica whose crc32c differs. Every N steps the ranks compare crcs (one allgather of 16
 * bytes each); all equal, the state is kept as the last verified one. On a mismatch the
 * corrupted rank's gradients have already reached every replica's update, so every rank goes
 * back to the last verified state (its own copy, or a healthy replica's) and the job redoes at
 * most N steps. Also the `bitflip` fault that makes such corruption on purpose. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_internal.h"

#define MODULE "verify"
#define NO_SNAPSHOT UINT64_MAX

struct keel__verify {
  uint64_t every;
  bool disabled;     /* sharded state: replicas are not the whole world */
  uint8_t *snapshot; /* the registered state at the last verified version */
  size_t bytes;
  uint64_t version; /* NO_SNAPSHOT until the first verification */
};

/* What each rank says at a verification. */
typedef struct verify_ballot {
  uint32_t crc;
  uint32_t reserved;
  uint64_t snapshot_version; /* NO_SNAPSHOT: none */
} verify_ballot;

keel_status keel__verify_create(const keel__config *config, keel__verify **verify_p) {
  keel__verify *verify = calloc(1, sizeof *verify);
  if (verify == NULL) return KEEL_ENOMEM;
  verify->every = config->verify_every;
  verify->version = NO_SNAPSHOT;
  *verify_p = verify;
  return KEEL_OK;
}

void keel__verify_destroy(keel__verify *verify) {
  if (verify == NULL) return;
  free(verify->snapshot);
  free(verify);
}

/* The registered state as the snapshot of version; false when it cannot be kept. */
static bool snapshot_take(keel__verify *verify, const keel_registry *registry, uint64_t version) {
  if (keel__registry_copy_fit(registry, &verify->snapshot, &verify->bytes) != KEEL_OK) return false;
  keel__registry_copy(registry, verify->snapshot, verify->bytes, false);
  verify->version = version;
  return true;
}

/* The crc most ranks hold (ties: the lowest rank's), and the ranks that differ from it. */
static uint32_t majority_crc(const verify_ballot *ballots, int size) {
  uint32_t best = ballots[0].crc;
  int best_votes = 0;
  for (int i = 0; i < size; i++) {
    int votes = 0;
    for (int j = 0; j < size; j++) votes += ballots[j].crc == ballots[i].crc;
    if (votes > best_votes) {
      best = ballots[i].crc;
      best_votes = votes;
    }
  }
  return best;
}

static void mismatch_report(keel_ctx *ctx, const verify_ballot *ballots, int size, uint32_t crc,
                            uint64_t version, uint64_t back_to) {
  char ranks[256] = "", uids[256] = "";
  size_t used = 0, uids_used = 0;
  keel_comm *world = keel_world(ctx);
  for (int rank = 0; rank < size && used + 12 < sizeof ranks; rank++) {
    if (ballots[rank].crc == crc) continue;
    used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", used ? "," : "", rank);
    uids_used += (size_t)snprintf(uids + uids_used, sizeof uids - uids_used, "%s%" PRIu32,
                                  uids_used ? "," : "", keel_comm_uid(world, rank));
  }
  KEEL_LOG_W(MODULE, "replicas differ at step %" PRIu64 " (ranks %s): back to step %" PRIu64,
             version, ranks, back_to);
  if (keel_comm_rank(world) != 0) return; /* one event for the job */
  char fields[640];
  snprintf(fields, sizeof fields,
           "\"step\":%" PRIu64 ",\"ranks\":[%s],\"uids\":[%s],\"back_to\":%" PRIu64
           ",\"redo_steps\":%" PRIu64,
           version, ranks, uids, back_to, version - back_to);
  keel__report_line(ctx, "replica_mismatch", fields);
}

/* Every rank to the verified version back_to: those that kept it restore their copy, then the
 * lowest of them sends every buffer to all (a replica whose copy was lost or damaged gets a
 * healthy one; the others receive what they hold). */
static keel_status roll_back(keel_ctx *ctx, keel_comm *world, const verify_ballot *ballots,
                             uint64_t back_to) {
  keel__verify *verify = ctx->verify;
  int size = keel_comm_size(world), root = -1;
  for (int rank = 0; rank < size && root < 0; rank++)
    if (ballots[rank].snapshot_version == back_to) root = rank;
  if (verify->version == back_to)
    keel__registry_copy(ctx->registry, verify->snapshot, verify->bytes, true);
  for (size_t i = 0; i < keel_registry_count(ctx->registry); i++) {
    const keel_state_buffer *buffer = keel_registry_entry(ctx->registry, i);
    keel_status status = keel_comm_broadcast(world, buffer->data, buffer->bytes, root);
    if (status != KEEL_OK) return status;
  }
  if (verify->version != back_to && !snapshot_take(verify, ctx->registry, back_to))
    verify->version = NO_SNAPSHOT;
  return KEEL_OK;
}

keel_status keel__verify_commit(keel_ctx *ctx, uint64_t version, bool *rolled_back_p) {
  keel__verify *verify = ctx->verify;
  *rolled_back_p = false;
  if (verify->every == 0 || verify->disabled || version % verify->every != 0) return KEEL_OK;
  if (ctx->shard_count > 1) {
    KEEL_LOG_W(MODULE,
               "--verify-replicas needs every rank to hold the whole state; the state "
               "is sharded: not verified");
    verify->disabled = true;
    return KEEL_OK;
  }
  keel_comm *world = keel_world(ctx);
  int size = keel_comm_size(world);
  verify_ballot mine = {.crc = keel__registry_crc32c(ctx->registry),
                        .snapshot_version = verify->version};
  verify_ballot *ballots = calloc((size_t)size, sizeof *ballots);
  if (ballots == NULL) return KEEL_ENOMEM;
  /* A failed collective leaves the check to the next time; the step's next collective fails
   * too and the recovery engine takes over. Its status is not the commit's: returned, it
   * ended the job (the soak: a rank fenced during the check of step 164950). */
  keel_fault_plan_fire(ctx->faults, "verify", 0);
  keel_status status = keel_comm_allgather(world, &mine, ballots, sizeof mine);
  if (status != KEEL_OK) {
    KEEL_LOG_I(MODULE, "the check of step %" PRIu64 " failed (%s): left to the next one", version,
               keel_strerror(status));
    status = KEEL_OK;
    goto done;
  }
  uint32_t crc = majority_crc(ballots, size);
  bool agree = true;
  uint64_t back_to = NO_SNAPSHOT;
  for (int rank = 0; rank < size; rank++) {
    agree = agree && ballots[rank].crc == crc;
    uint64_t kept = ballots[rank].snapshot_version;
    if (kept != NO_SNAPSHOT && (back_to == NO_SNAPSHOT || kept > back_to)) back_to = kept;
  }
  if (agree) {
    if (!snapshot_take(verify, ctx->registry, version)) status = KEEL_ENOMEM;
    goto done;
  }
  if (back_to == NO_SNAPSHOT) {
    /* The first verification: nothing verified to go back to. The replicas that differ
     * take the majority's state; what the corruption did to every update stays. */
    KEEL_LOG_W(MODULE, "replicas differ at the first verification: no verified step to go back to");
    back_to = version;
    for (int rank = 0; rank < size; rank++) {
      ballots[rank].snapshot_version = ballots[rank].crc == crc ? version : NO_SNAPSHOT;
    }
    if (mine.crc == crc && !snapshot_take(verify, ctx->registry, version)) {
      status = KEEL_ENOMEM;
      goto done;
    }
  }
  mismatch_report(ctx, ballots, size, crc, version, back_to);
  status = roll_back(ctx, world, ballots, back_to);
  if (status == KEEL_OK) {
    keel__step_state_set(ctx->step, back_to, true);
    *rolled_back_p = true;
  }
done:
  free(ballots);
  return status;
}

void keel__verify_bitflip(keel_ctx *ctx, uint64_t step) {
  const keel_state_buffer *largest = NULL;
  for (size_t i = 0; i < keel_registry_count(ctx->registry); i++) {
    const keel_state_buffer *buffer = keel_registry_entry(ctx->registry, i);
    if (largest == NULL || buffer->bytes > largest->bytes) largest = buffer;
  }
  if (largest == NULL || largest->bytes == 0) return;
  /* The largest buffer (the parameters, as a rule): a flip in a step counter would end the
   * run before any check could see it. */
  uint64_t mixed =
      (step + 1) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)ctx->config.uid * 0xbf58476d1ce4e5b9ULL;
  size_t byte = (size_t)(mixed % largest->bytes);
  int bit = (int)(mixed >> 59) & 7;
  ((uint8_t *)largest->data)[byte] ^= (uint8_t)(1u << bit);
  KEEL_LOG_W(MODULE, "flipped bit %d of byte %zu of '%s' at step %" PRIu64, bit, byte,
             largest->name, step);
}
