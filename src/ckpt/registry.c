/* The state registry: named buffers of the caller's memory, in the order they were added,
 * and the checks every tier shares (names, identities, chunk sizes). */
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

bool keel__ckpt_name_valid(const char *name, size_t length) {
  if (length == 0 || length > KEEL_CKPT_NAME_MAX) return false;
  for (size_t i = 0; i < length; i++) {
    /* Names appear in log lines and error messages: no spaces, controls or NULs. */
    if (name[i] < 0x21 || name[i] > 0x7e) return false;
  }
  return true;
}

keel_status keel__ckpt_identity_check(const keel_ckpt_identity *identity) {
  if (identity == NULL || identity->job_id == 0) return KEEL_EINVAL;
  if (identity->shard_count == 0 || identity->shard_index >= identity->shard_count)
    return KEEL_EINVAL;
  return KEEL_OK;
}

keel_status keel__ckpt_chunk_bytes(uint64_t requested, uint64_t *chunk_bytes_p) {
  if (requested > KEEL_CKPT_MAX_CHUNK_BYTES) return KEEL_ERANGE;
  *chunk_bytes_p = requested == 0 ? KEEL_CKPT_DEFAULT_CHUNK_BYTES : requested;
  return KEEL_OK;
}

keel_status keel_ckpt_registry_create(keel_ckpt_registry **registry_p) {
  if (registry_p == NULL) return KEEL_EINVAL;
  keel_ckpt_registry *registry = calloc(1, sizeof *registry);
  if (registry == NULL) return KEEL_ENOMEM;
  *registry_p = registry;
  return KEEL_OK;
}

void keel_ckpt_registry_destroy(keel_ckpt_registry *registry) { free(registry); }

keel_status keel_ckpt_registry_add(keel_ckpt_registry *registry, const char *name, void *data,
                                   size_t bytes) {
  if (registry == NULL || name == NULL) return KEEL_EINVAL;
  size_t length = strnlen(name, KEEL_CKPT_NAME_MAX + 1);
  if (!keel__ckpt_name_valid(name, length)) return KEEL_EINVAL;
  if (data == NULL && bytes > 0) return KEEL_EINVAL;
  for (size_t i = 0; i < registry->count; i++) {
    if (strcmp(registry->slots[i].name, name) == 0) return KEEL_EEXIST;
  }
  if (registry->count == KEEL_CKPT_MAX_BUFFERS) return KEEL_ERANGE;
  /* A total that does not fit in 64 bits cannot be described by any manifest. */
  if ((uint64_t)bytes > UINT64_MAX - registry->total_bytes) return KEEL_ERANGE;
  keel__ckpt_slot *slot = &registry->slots[registry->count];
  memcpy(slot->name, name, length);
  slot->name[length] = '\0';
  slot->data = data;
  slot->bytes = bytes;
  registry->count++;
  registry->total_bytes += bytes;
  return KEEL_OK;
}

size_t keel_ckpt_registry_count(const keel_ckpt_registry *registry) {
  return registry == NULL ? 0 : registry->count;
}

uint64_t keel_ckpt_registry_bytes(const keel_ckpt_registry *registry) {
  return registry == NULL ? 0 : registry->total_bytes;
}
