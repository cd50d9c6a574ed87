/* The one restore routine of every tier: among the snapshots a tier found, keep those of
 * the wanted shard that fit the registry, try them newest first (JIT §3.3: any data-parallel
 * replica, step i or i+1), and load the first whose every chunk passes its crc32c, through a
 * staging copy so that the registered buffers change only on success. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

/* true, with the reason written, when a snapshot's buffers differ from the registry's. */
static bool registry_mismatch(const keel_registry *registry, const keel_ckpt_manifest *manifest,
                              char *reason) {
  if (manifest->buffer_count != keel_registry_count(registry)) {
    snprintf(reason, KEEL__CKPT_REASON_BYTES, "it holds %" PRIu32 " buffers, the registry %zu",
             manifest->buffer_count, keel_registry_count(registry));
    return true;
  }
  for (uint32_t b = 0; b < manifest->buffer_count; b++) {
    const keel_ckpt_entry *entry = &manifest->buffers[b];
    const keel_state_buffer *slot = keel_registry_entry(registry, b);
    if (strcmp(entry->name, slot->name) != 0) {
      snprintf(reason, KEEL__CKPT_REASON_BYTES,
               "buffer %" PRIu32 " is '%s' in the snapshot, '%s' in the registry", b, entry->name,
               slot->name);
      return true;
    }
    if (entry->bytes != slot->bytes) {
      snprintf(reason, KEEL__CKPT_REASON_BYTES,
               "buffer '%s' is %" PRIu64 " bytes in the snapshot, %zu in the registry", entry->name,
               entry->bytes, slot->bytes);
      return true;
    }
  }
  return false;
}

/* Newest first: step, then sequence (a later incarnation), then the lowest replica and
 * rank so that every rank of a shard makes the same choice from the same files. */
static int candidate_compare(const void *left, const void *right) {
  const keel_ckpt_identity *a = &(*(keel__ckpt_candidate *const *)left)->manifest.identity;
  const keel_ckpt_identity *b = &(*(keel__ckpt_candidate *const *)right)->manifest.identity;
  if (a->step != b->step) return a->step > b->step ? -1 : 1;
  if (a->sequence != b->sequence) return a->sequence > b->sequence ? -1 : 1;
  if (a->replica != b->replica) return a->replica < b->replica ? -1 : 1;
  if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
  return 0;
}

keel_status keel__ckpt_buffer_check(const keel_ckpt_manifest *manifest, uint32_t index,
                                    const uint8_t *data, char *reason) {
  const keel_ckpt_entry *entry = &manifest->buffers[index];
  for (uint32_t c = 0; c < entry->chunk_count; c++) {
    uint64_t start = (uint64_t)c * manifest->chunk_bytes;
    uint64_t length =
        entry->bytes - start < manifest->chunk_bytes ? entry->bytes - start : manifest->chunk_bytes;
    uint32_t stored = manifest->chunk_crc32c[entry->first_chunk + c];
    uint32_t computed = keel_crc32c(0, data + start, length);
    if (stored != computed) {
      snprintf(reason, KEEL__CKPT_REASON_BYTES,
               "buffer '%s' chunk %" PRIu32 " (bytes %" PRIu64 "..%" PRIu64
               ") fails its crc32c (manifest %08" PRIx32 ", data %08" PRIx32 ")",
               entry->name, c, start, start + length, stored, computed);
      return KEEL_ECORRUPT;
    }
  }
  return KEEL_OK;
}

/* Reads every buffer of the candidate into staging and checks every chunk. */
static keel_status candidate_stage(const keel__ckpt_candidate *candidate, uint8_t *staging,
                                   char *reason) {
  const keel_ckpt_manifest *manifest = &candidate->manifest;
  uint64_t offset = 0;
  for (uint32_t b = 0; b < manifest->buffer_count; b++) {
    const keel_ckpt_entry *entry = &manifest->buffers[b];
    keel_status status =
        candidate->ops->read_buffer(candidate, b, staging + offset, entry->bytes, reason);
    if (status != KEEL_OK) return status;
    if (keel__ckpt_buffer_check(manifest, b, staging + offset, reason) != KEEL_OK) {
      /* A source rewritten while it was read explains the mismatch better than damage. */
      char rewritten[KEEL__CKPT_REASON_BYTES];
      if (candidate->ops->finish(candidate, rewritten) != KEEL_OK) {
        memcpy(reason, rewritten, KEEL__CKPT_REASON_BYTES);
        return KEEL_EAGAIN;
      }
      return KEEL_ECORRUPT;
    }
    offset += entry->bytes;
  }
  return candidate->ops->finish(candidate, reason);
}

/* Keeps in order[] the candidates of the selector's shard that fit the registry; logs and
 * counts in *refused_p those that cannot be used. Returns how many were kept. */
static size_t candidates_select(const keel_registry *registry, const keel_ckpt_selector *selector,
                                keel__ckpt_candidate *candidates, size_t count, const char *where,
                                keel__ckpt_candidate **order, size_t *refused_p) {
  char reason[KEEL__CKPT_REASON_BYTES];
  size_t usable = 0;
  for (size_t i = 0; i < count; i++) {
    keel__ckpt_candidate *candidate = &candidates[i];
    const keel_ckpt_identity *identity = &candidate->manifest.identity;
    reason[0] = '\0';
    if (identity->job_id != selector->job_id) {
      snprintf(reason, sizeof reason, "its manifest belongs to job %" PRIu64, identity->job_id);
    } else if (identity->shard_index != selector->shard_index ||
               identity->step > selector->max_step || identity->step < selector->min_step) {
      /* Another shard's snapshot, or one of a step not asked for: not ours to use, not bad. */
      KEEL_LOG_D(KEEL__CKPT_MODULE,
                 "%s/%s holds shard %" PRIu32 " of step %" PRIu64 ": not asked for", where,
                 candidate->label, identity->shard_index, identity->step);
      continue;
    } else if (selector->shard_count != 0 && identity->shard_count != selector->shard_count) {
      snprintf(reason, sizeof reason, "it is shard %" PRIu32 " of %" PRIu32 ", not of %" PRIu32,
               identity->shard_index, identity->shard_count, selector->shard_count);
    } else {
      registry_mismatch(registry, &candidate->manifest, reason);
    }
    if (reason[0] != '\0') {
      KEEL_LOG_W(KEEL__CKPT_MODULE, "skipped the snapshot in %s/%s (step %" PRIu64 "): %s", where,
                 candidate->label, identity->step, reason);
      (*refused_p)++;
      continue;
    }
    order[usable++] = candidate;
  }
  return usable;
}

/* A candidate in memory: copied straight into the registered buffers, each chunk's crc32c
 * taken on the way (one pass over the snapshot) and compared at the chunk's end; then the
 * source asked whether it changed meanwhile. A failure leaves the buffers torn, which the
 * next candidate or the caller's failure replaces (keel__ckpt_memory_restore_in_place). */
static keel_status candidate_load_in_place(keel_registry *registry,
                                           const keel__ckpt_candidate *candidate, char *reason) {
  const keel_ckpt_manifest *manifest = &candidate->manifest;
  for (uint32_t b = 0; b < manifest->buffer_count; b++) {
    const keel_ckpt_entry *entry = &manifest->buffers[b];
    const uint8_t *source = candidate->ops->in_place(candidate, b);
    uint8_t *destination = keel_registry_entry(registry, b)->data;
    for (uint32_t c = 0; c < entry->chunk_count; c++) {
      uint64_t start = (uint64_t)c * manifest->chunk_bytes;
      uint64_t length = entry->bytes - start < manifest->chunk_bytes ? entry->bytes - start
                                                                     : manifest->chunk_bytes;
      uint32_t computed = keel_crc32c_copy(0, destination + start, source + start, length);
      uint32_t stored = manifest->chunk_crc32c[entry->first_chunk + c];
      if (computed == stored) continue;
      char rewritten[KEEL__CKPT_REASON_BYTES];
      if (candidate->ops->finish(candidate, rewritten) != KEEL_OK) {
        memcpy(reason, rewritten, KEEL__CKPT_REASON_BYTES);
        return KEEL_EAGAIN;
      }
      snprintf(reason, KEEL__CKPT_REASON_BYTES,
               "buffer '%s' chunk %" PRIu32 " (bytes %" PRIu64 "..%" PRIu64
               ") fails its crc32c (manifest %08" PRIx32 ", data %08" PRIx32 ")",
               entry->name, c, start, start + length, stored, computed);
      return KEEL_ECORRUPT;
    }
  }
  return candidate->ops->finish(candidate, reason);
}

/* A candidate read through its tier: staged whole and checked before any registered byte
 * changes. The staging copy (as large as the registered state) is made at the first such
 * candidate and reused. */
static keel_status candidate_load_staged(keel_registry *registry,
                                         const keel__ckpt_candidate *candidate, uint8_t **staging_p,
                                         const char *where, char *reason) {
  uint64_t total = keel_registry_bytes(registry);
  if (*staging_p == NULL) {
    *staging_p = total <= SIZE_MAX ? malloc(total > 0 ? (size_t)total : 1) : NULL;
    if (*staging_p == NULL) {
      KEEL_LOG_E(KEEL__CKPT_MODULE, "restore from %s: no memory to stage %" PRIu64 " bytes", where,
                 total);
      return KEEL_ENOMEM;
    }
  }
  keel_status staged = candidate_stage(candidate, *staging_p, reason);
  if (staged != KEEL_OK) return staged;
  /* Every chunk passed: only now is the caller's state overwritten. */
  uint64_t offset = 0;
  for (size_t b = 0; b < keel_registry_count(registry); b++) {
    const keel_state_buffer *slot = keel_registry_entry(registry, b);
    if (slot->bytes > 0) memcpy(slot->data, *staging_p + offset, slot->bytes);
    offset += slot->bytes;
  }
  return KEEL_OK;
}

/* Tries the candidates in order; loads the first that checks cleanly. KEEL_ECORRUPT when
 * none did (each logged and counted in *refused_p, except those rewritten while read),
 * KEEL_ENOMEM without a staging copy. */
static keel_status candidates_load(keel_registry *registry, keel__ckpt_candidate *const *order,
                                   size_t usable, const char *where, size_t *refused_p,
                                   keel_ckpt_identity *used_p) {
  uint8_t *staging = NULL;
  char reason[KEEL__CKPT_REASON_BYTES];
  keel_status status = KEEL_ECORRUPT;
  for (size_t i = 0; i < usable && status != KEEL_OK; i++) {
    const keel__ckpt_candidate *candidate = order[i];
    const keel_ckpt_identity *identity = &candidate->manifest.identity;
    reason[0] = '\0';
    keel_status loaded = candidate->ops->in_place != NULL
                             ? candidate_load_in_place(registry, candidate, reason)
                             : candidate_load_staged(registry, candidate, &staging, where, reason);
    if (loaded == KEEL_ENOMEM) {
      status = KEEL_ENOMEM;
      break;
    }
    if (loaded == KEEL_EAGAIN) {
      /* Rewritten under us (the memory tier's writer was saving): like a save in progress,
       * not a bad snapshot. */
      KEEL_LOG_I(KEEL__CKPT_MODULE, "passed over %s/%s: %s", where, candidate->label, reason);
      continue;
    }
    if (loaded != KEEL_OK) {
      KEEL_LOG_W(KEEL__CKPT_MODULE,
                 "skipped the snapshot in %s/%s (step %" PRIu64 ", replica %" PRIu32 "): %s", where,
                 candidate->label, identity->step, identity->replica, reason);
      (*refused_p)++;
      continue;
    }
    KEEL_LOG_I(KEEL__CKPT_MODULE,
               "restored shard %" PRIu32 " from %s/%s: step %" PRIu64 ", replica %" PRIu32
               ", rank %" PRIu32 ", sequence %" PRIu64,
               identity->shard_index, where, candidate->label, identity->step, identity->replica,
               identity->rank, identity->sequence);
    if (used_p != NULL) *used_p = *identity;
    status = KEEL_OK;
  }
  free(staging);
  return status;
}

/* Whether a complete snapshot of shard `shard` at `step` is among the candidates. */
static bool shard_has_step(const keel_ckpt_selector *selector,
                           const keel__ckpt_candidate *candidates, size_t count, uint32_t shard,
                           uint64_t step) {
  for (size_t i = 0; i < count; i++) {
    const keel_ckpt_identity *identity = &candidates[i].manifest.identity;
    if (identity->job_id == selector->job_id && identity->shard_count == selector->shard_count &&
        identity->shard_index == shard && identity->step == step)
      return true;
  }
  return false;
}

/* The newest step in the selector's range of which every shard has a complete snapshot;
 * false when there is none. */
static bool common_step_find(const keel_ckpt_selector *selector,
                             const keel__ckpt_candidate *candidates, size_t count,
                             uint64_t *step_p) {
  bool found = false;
  for (size_t i = 0; i < count; i++) {
    uint64_t step = candidates[i].manifest.identity.step;
    if (step > selector->max_step || step < selector->min_step || (found && step <= *step_p))
      continue;
    bool every = true;
    for (uint32_t shard = 0; shard < selector->shard_count && every; shard++)
      every = shard_has_step(selector, candidates, count, shard, step);
    if (every) {
      *step_p = step;
      found = true;
    }
  }
  return found;
}

keel_status keel__ckpt_restore_best(keel_registry *registry, const keel_ckpt_selector *selector,
                                    keel__ckpt_candidate *candidates, size_t count, size_t refused,
                                    const char *where, keel_ckpt_identity *used_p) {
  keel_ckpt_selector narrowed = *selector;
  if (selector->common_step && selector->shard_count > 1) {
    uint64_t step = 0;
    if (!common_step_find(selector, candidates, count, &step)) {
      KEEL_LOG_W(KEEL__CKPT_MODULE,
                 "no step in %s has a complete snapshot of every one of the %" PRIu32 " shards",
                 where, selector->shard_count);
      return KEEL_ENOTFOUND;
    }
    narrowed.min_step = narrowed.max_step = step;
  }
  keel__ckpt_candidate **order = malloc((count > 0 ? count : 1) * sizeof *order);
  if (order == NULL) {
    KEEL_LOG_E(KEEL__CKPT_MODULE, "restore from %s: out of memory", where);
    return KEEL_ENOMEM;
  }
  size_t usable = candidates_select(registry, &narrowed, candidates, count, where, order, &refused);
  qsort(order, usable, sizeof *order, candidate_compare);
  keel_status status = KEEL_ENOTFOUND;
  if (usable > 0) status = candidates_load(registry, order, usable, where, &refused, used_p);
  if (status == KEEL_ENOTFOUND || status == KEEL_ECORRUPT) {
    if (refused == 0) {
      KEEL_LOG_I(KEEL__CKPT_MODULE,
                 "no complete snapshot of shard %" PRIu32 " of job %" PRIu64 " in %s",
                 selector->shard_index, selector->job_id, where);
      status = KEEL_ENOTFOUND;
    } else {
      KEEL_LOG_E(KEEL__CKPT_MODULE,
                 "no usable snapshot of shard %" PRIu32 " of job %" PRIu64
                 " in %s: %zu refused (reasons above); the registered state is unchanged",
                 selector->shard_index, selector->job_id, where, refused);
      status = KEEL_ECORRUPT;
    }
  }
  free(order);
  return status;
}
