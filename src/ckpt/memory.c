/* The in-memory tier: a snapshot in a region of memory the caller provides (the agent's
 * shared memory, a peer's copy), sealed like a seqlock: the seal word is odd while a save
 * writes and becomes even, with a release store, only once everything else is in place. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/mem_internal.h"

#define REGION_MAGIC 0x524b434bu /* "KCKR" in little-endian byte order */
#define REGION_VERSION 1
#define REGION_ALIGNMENT 64

typedef keel__ckpt_region_header region_header;
_Static_assert(sizeof(region_header) == REGION_ALIGNMENT, "the region header is 64 bytes");

static uint64_t round_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

/* The layout of a region holding a snapshot with this manifest size and this much data. */
static keel_status region_layout(size_t manifest_bytes, uint64_t data_bytes,
                                 uint64_t *data_offset_p, size_t *region_bytes_p) {
  uint64_t data_offset =
      round_up(sizeof(region_header) + (uint64_t)manifest_bytes, REGION_ALIGNMENT);
  if (data_bytes > SIZE_MAX - data_offset) return KEEL_ERANGE;
  *data_offset_p = data_offset;
  *region_bytes_p = (size_t)(data_offset + data_bytes);
  return KEEL_OK;
}

static bool region_valid(const keel_ckpt_region *region) {
  return region != NULL && region->base != NULL &&
         (uintptr_t)region->base % _Alignof(region_header) == 0 &&
         region->bytes >= sizeof(region_header);
}

keel_status keel_ckpt_memory_bytes(const keel_registry *registry, uint64_t chunk_bytes,
                                   size_t *bytes_p) {
  if (registry == NULL || bytes_p == NULL) return KEEL_EINVAL;
  size_t manifest_bytes = 0;
  keel_status status = keel__ckpt_manifest_bytes_for(registry, chunk_bytes, &manifest_bytes);
  if (status != KEEL_OK) return status;
  uint64_t data_offset = 0;
  return region_layout(manifest_bytes, keel_registry_bytes(registry), &data_offset, bytes_p);
}

keel_status keel_ckpt_memory_save(const keel_registry *registry, const keel_ckpt_identity *identity,
                                  uint64_t chunk_bytes, const keel_ckpt_region *region) {
  return keel__ckpt_memory_save_with(registry, identity, chunk_bytes, region, NULL, NULL);
}

/* ---- one pass over the state: keel_crc32c_copy checksums each piece as it streams it to
 * the region with non-temporal stores, so the state is read once from memory and the region
 * written once, never read (bench/mem_snapshot.c: two passes ran at about half of memcpy's
 * speed). */

/* Copies every buffer into the region from data_offset on, filling the manifest's crcs. */
static void state_copy(const keel_registry *registry, keel_ckpt_manifest *manifest, uint8_t *data,
                       void (*copied)(void *context, size_t buffer), void *context) {
  for (size_t b = 0; b < keel_registry_count(registry); b++) {
    const keel_state_buffer *slot = keel_registry_entry(registry, b);
    const keel_ckpt_entry *entry = &manifest->buffers[b];
    for (uint32_t c = 0; c < entry->chunk_count; c++) {
      uint64_t start = (uint64_t)c * manifest->chunk_bytes;
      uint64_t length =
          slot->bytes - start < manifest->chunk_bytes ? slot->bytes - start : manifest->chunk_bytes;
      manifest->chunk_crc32c[entry->first_chunk + c] =
          keel_crc32c_copy(0, data + start, (const uint8_t *)slot->data + start, length);
    }
    data += slot->bytes;
    if (copied != NULL) copied(context, b);
  }
}

keel_status keel__ckpt_memory_save_with(const keel_registry *registry,
                                        const keel_ckpt_identity *identity, uint64_t chunk_bytes,
                                        const keel_ckpt_region *region,
                                        void (*copied)(void *context, size_t buffer),
                                        void *context) {
  if (registry == NULL || !region_valid(region)) return KEEL_EINVAL;
  keel_ckpt_manifest manifest;
  keel_status status =
      keel__ckpt_manifest_layout(registry, identity, chunk_bytes, false, &manifest);
  if (status != KEEL_OK) return status;
  size_t manifest_bytes = keel_ckpt_manifest_encoded_bytes(&manifest);
  uint64_t data_offset = 0;
  size_t needed = 0;
  status = region_layout(manifest_bytes, manifest.total_bytes, &data_offset, &needed);
  if (status == KEEL_OK && needed > region->bytes) status = KEEL_ERANGE;
  if (status != KEEL_OK) {
    KEEL_LOG_E(KEEL__CKPT_MODULE,
               "in-memory save of step %" PRIu64 ": the region of %zu bytes cannot hold %zu",
               identity->step, region->bytes, needed);
    goto free_manifest;
  }

  region_header *header = region->base;
  uint8_t *base = region->base;
  /* Odd first: a reader that sees any byte of this save also sees that the region is
   * being rewritten (the release fence orders the seal before the writes that follow). */
  uint64_t seal = atomic_load_explicit(&header->seal, memory_order_relaxed);
  uint64_t writing = seal % 2 == 0 ? seal + 1 : seal + 2;
  atomic_store_explicit(&header->seal, writing, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);

  state_copy(registry, &manifest, base + data_offset, copied, context);
  header->magic = REGION_MAGIC;
  header->version = REGION_VERSION;
  header->header_bytes = sizeof(region_header);
  header->manifest_bytes = (uint32_t)manifest_bytes;
  header->reserved = 0;
  header->data_offset = data_offset;
  header->data_bytes = manifest.total_bytes;
  memset(header->padding, 0, sizeof header->padding);
  size_t encoded = 0;
  status =
      keel_ckpt_manifest_encode(&manifest, base + sizeof(region_header), manifest_bytes, &encoded);
  if (status != KEEL_OK) goto free_manifest; /* left unsealed: never read */
  /* The complete flag, last. */
  atomic_store_explicit(&header->seal, writing + 1, memory_order_release);
  KEEL_LOG_D(KEEL__CKPT_MODULE, "saved step %" PRIu64 " in memory: %" PRIu64 " bytes",
             identity->step, manifest.total_bytes);

free_manifest:
  keel_ckpt_manifest_free(&manifest);
  return status;
}

/* ---- restore */

/* Bounds were checked against the region when the candidate was listed. */
static const uint8_t *region_in_place(const keel__ckpt_candidate *candidate, uint32_t index) {
  uint64_t offset = candidate->data_offset;
  for (uint32_t b = 0; b < index; b++) offset += candidate->manifest.buffers[b].bytes;
  return (const uint8_t *)candidate->region->base + offset;
}

static keel_status region_read_buffer(const keel__ckpt_candidate *candidate, uint32_t index,
                                      uint8_t *destination, uint64_t bytes, char *reason) {
  (void)reason;
  if (bytes > 0) memcpy(destination, region_in_place(candidate, index), (size_t)bytes);
  return KEEL_OK;
}

static keel_status region_finish(const keel__ckpt_candidate *candidate, char *reason) {
  region_header *header = candidate->region->base;
  /* Pairs with the writer's release fence: if any byte read came from a later save, the
   * seal read after this fence shows it. */
  atomic_thread_fence(memory_order_acquire);
  uint64_t seal = atomic_load_explicit(&header->seal, memory_order_relaxed);
  if (seal != candidate->seal) {
    snprintf(reason, KEEL__CKPT_REASON_BYTES, "the region was rewritten while it was read");
    return KEEL_EAGAIN;
  }
  return KEEL_OK;
}

static const keel__ckpt_source_ops region_source_ops = {
    .read_buffer = region_read_buffer,
    .finish = region_finish,
};

static const keel__ckpt_source_ops region_in_place_ops = {
    .read_buffer = region_read_buffer,
    .finish = region_finish,
    .in_place = region_in_place,
};

/* Makes a candidate of region `index` when it is sealed: KEEL_ENOTFOUND when it holds no
 * complete snapshot, KEEL_ECORRUPT (logged) when it is malformed. */
static keel_status region_candidate(const keel_ckpt_region *region, size_t index,
                                    keel__ckpt_candidate *candidate) {
  char label[64];
  snprintf(label, sizeof label, "region-%zu", index);
  if (!region_valid(region)) {
    KEEL_LOG_W(KEEL__CKPT_MODULE, "skipped memory/%s: not a usable region", label);
    return KEEL_ECORRUPT;
  }
  region_header *header = region->base;
  uint64_t seal = atomic_load_explicit(&header->seal, memory_order_acquire);
  if (seal == 0 || seal % 2 != 0) {
    KEEL_LOG_I(KEEL__CKPT_MODULE, "memory/%s holds no complete snapshot: skipped", label);
    return KEEL_ENOTFOUND;
  }
  const char *problem = NULL;
  uint64_t data_offset = 0;
  size_t region_bytes = 0;
  uint32_t manifest_bytes = header->manifest_bytes;
  if (header->magic != REGION_MAGIC || header->version != REGION_VERSION ||
      header->header_bytes != sizeof(region_header)) {
    problem = "its header is not a keel snapshot's";
  } else if (manifest_bytes > KEEL_CKPT_MANIFEST_MAX_BYTES ||
             region_layout(manifest_bytes, header->data_bytes, &data_offset, &region_bytes) !=
                 KEEL_OK ||
             data_offset != header->data_offset || region_bytes > region->bytes) {
    problem = "its header describes more than the region holds";
  }
  uint8_t *encoded = NULL;
  uint64_t data_bytes = header->data_bytes;
  if (problem == NULL) {
    /* Decoded from a private copy: a concurrent save cannot change it under the decoder. */
    encoded = malloc(manifest_bytes > 0 ? manifest_bytes : 1);
    if (encoded == NULL) {
      problem = "no memory for its manifest";
    } else {
      memcpy(encoded, (uint8_t *)region->base + sizeof(region_header), manifest_bytes);
    }
  }
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&header->seal, memory_order_relaxed) != seal) {
    free(encoded);
    KEEL_LOG_I(KEEL__CKPT_MODULE, "memory/%s was rewritten while it was read: skipped", label);
    return KEEL_ENOTFOUND;
  }
  keel_status status = KEEL_ECORRUPT;
  if (problem == NULL) {
    status = keel_ckpt_manifest_decode(encoded, manifest_bytes, &candidate->manifest);
    if (status != KEEL_OK) {
      problem = "its manifest is malformed";
    } else if (candidate->manifest.total_bytes != data_bytes) {
      problem = "its manifest and its header disagree on the size";
      keel_ckpt_manifest_free(&candidate->manifest);
      status = KEEL_ECORRUPT;
    }
  }
  free(encoded);
  if (problem != NULL) {
    KEEL_LOG_W(KEEL__CKPT_MODULE, "skipped memory/%s: %s", label, problem);
    return status == KEEL_OK ? KEEL_ECORRUPT : status;
  }
  memcpy(candidate->label, label, sizeof candidate->label);
  candidate->ops = &region_source_ops;
  candidate->region = region;
  candidate->seal = seal;
  candidate->data_offset = data_offset;
  return KEEL_OK;
}

static keel_status memory_restore(keel_registry *registry, const keel_ckpt_region *regions,
                                  size_t region_count, const keel_ckpt_selector *selector,
                                  const keel__ckpt_source_ops *ops, keel_ckpt_identity *used_p) {
  if (registry == NULL || selector == NULL || selector->job_id == 0) return KEEL_EINVAL;
  if (region_count > 0 && regions == NULL) return KEEL_EINVAL;
  keel__ckpt_candidate *candidates =
      calloc(region_count > 0 ? region_count : 1, sizeof *candidates);
  if (candidates == NULL) {
    KEEL_LOG_E(KEEL__CKPT_MODULE, "restore from memory: out of memory");
    return KEEL_ENOMEM;
  }
  size_t count = 0;
  size_t refused = 0;
  for (size_t i = 0; i < region_count; i++) {
    keel_status status = region_candidate(&regions[i], i, &candidates[count]);
    if (status == KEEL_OK) {
      candidates[count++].ops = ops;
    } else if (status != KEEL_ENOTFOUND) {
      refused++;
    }
  }
  keel_status status =
      keel__ckpt_restore_best(registry, selector, candidates, count, refused, "memory", used_p);
  for (size_t i = 0; i < count; i++) keel_ckpt_manifest_free(&candidates[i].manifest);
  free(candidates);
  return status;
}

keel_status keel_ckpt_memory_restore(keel_registry *registry, const keel_ckpt_region *regions,
                                     size_t region_count, const keel_ckpt_selector *selector,
                                     keel_ckpt_identity *used_p) {
  return memory_restore(registry, regions, region_count, selector, &region_source_ops, used_p);
}

keel_status keel__ckpt_memory_restore_in_place(keel_registry *registry,
                                               const keel_ckpt_region *regions, size_t region_count,
                                               const keel_ckpt_selector *selector,
                                               keel_ckpt_identity *used_p) {
  return memory_restore(registry, regions, region_count, selector, &region_in_place_ops, used_p);
}

/* ---- a region as a whole: what a peer checks before it counts a copy */

keel_status keel__ckpt_region_check(const keel_ckpt_region *region, keel_ckpt_identity *identity_p,
                                    uint64_t *seal_p, char *reason) {
  keel__ckpt_candidate candidate;
  memset(&candidate, 0, sizeof candidate);
  keel_status status = region_candidate(region, 0, &candidate);
  if (status != KEEL_OK) {
    snprintf(reason, KEEL__CKPT_REASON_BYTES, "%s",
             status == KEEL_ENOTFOUND ? "it holds no complete snapshot" : "it is malformed");
    return status;
  }
  const uint8_t *data = (const uint8_t *)region->base + candidate.data_offset;
  const keel_ckpt_manifest *manifest = &candidate.manifest;
  for (uint32_t b = 0; status == KEEL_OK && b < manifest->buffer_count; b++) {
    status = keel__ckpt_buffer_check(manifest, b, data, reason);
    data += manifest->buffers[b].bytes;
  }
  if (status == KEEL_OK && region_finish(&candidate, reason) != KEEL_OK) status = KEEL_ENOTFOUND;
  if (status == KEEL_OK && identity_p != NULL) *identity_p = manifest->identity;
  if (status == KEEL_OK && seal_p != NULL) *seal_p = candidate.seal;
  keel_ckpt_manifest_free(&candidate.manifest);
  return status;
}

uint64_t keel__ckpt_region_seal(const keel_ckpt_region *region) {
  const region_header *header = region->base;
  return atomic_load_explicit(&header->seal, memory_order_acquire);
}

void keel__ckpt_region_unseal(const keel_ckpt_region *region) {
  region_header *header = region->base;
  uint64_t seal = atomic_load_explicit(&header->seal, memory_order_relaxed);
  atomic_store_explicit(&header->seal, seal % 2 == 0 ? seal + 1 : seal + 2, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
}

void keel__ckpt_region_seal_now(const keel_ckpt_region *region) {
  region_header *header = region->base;
  uint64_t seal = atomic_load_explicit(&header->seal, memory_order_relaxed);
  atomic_store_explicit(&header->seal, seal % 2 == 0 ? seal + 2 : seal + 1, memory_order_release);
}

keel_status keel__ckpt_region_identity(const keel_ckpt_region *region,
                                       keel_ckpt_identity *identity_p, uint64_t *seal_p) {
  keel__ckpt_candidate candidate;
  memset(&candidate, 0, sizeof candidate);
  keel_status status = region_candidate(region, 0, &candidate);
  if (status != KEEL_OK) return status;
  *identity_p = candidate.manifest.identity;
  *seal_p = candidate.seal;
  keel_ckpt_manifest_free(&candidate.manifest);
  return KEEL_OK;
}
