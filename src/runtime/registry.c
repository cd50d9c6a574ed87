/* The state registry: named buffers of the caller's memory, in the order they were added.
 * One registry serves every mechanism: the state a newcomer receives, the snapshots of the
 * checkpoint engine, the bindings. Its room is allocated at creation, so that nothing is
 * allocated for it after a failure. */
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_internal.h"

struct keel_registry {
  size_t count;
  uint64_t total_bytes;
  keel_state_buffer buffers[KEEL_MAX_STATE_BUFFERS];
  bool per_process[KEEL_MAX_STATE_BUFFERS];
};

bool keel_state_name_valid(const char *name, size_t length) {
  if (name == NULL || length == 0 || length > KEEL_STATE_NAME_MAX) return false;
  for (size_t i = 0; i < length; i++) {
    /* Names appear in log lines, notes and manifests: no spaces, controls or NULs. */
    if (name[i] < 0x21 || name[i] > 0x7e) return false;
  }
  return true;
}

keel_status keel_registry_create(keel_registry **registry_p) {
  if (registry_p == NULL) return KEEL_EINVAL;
  keel_registry *registry = calloc(1, sizeof *registry);
  if (registry == NULL) return KEEL_ENOMEM;
  *registry_p = registry;
  return KEEL_OK;
}

void keel_registry_destroy(keel_registry *registry) { free(registry); }

keel_status keel_registry_add(keel_registry *registry, const char *name, void *data,
                              size_t bytes) {
  if (registry == NULL || name == NULL) return KEEL_EINVAL;
  size_t length = strnlen(name, KEEL_STATE_NAME_MAX + 1);
  if (!keel_state_name_valid(name, length)) return KEEL_EINVAL;
  if (data == NULL && bytes > 0) return KEEL_EINVAL;
  for (size_t i = 0; i < registry->count; i++) {
    if (strcmp(registry->buffers[i].name, name) == 0) return KEEL_EEXIST;
  }
  if (registry->count == KEEL_MAX_STATE_BUFFERS) return KEEL_ERANGE;
  /* A total that does not fit in 64 bits cannot be described by any manifest. */
  if ((uint64_t)bytes > UINT64_MAX - registry->total_bytes) return KEEL_ERANGE;
  keel_state_buffer *buffer = &registry->buffers[registry->count];
  memcpy(buffer->name, name, length);
  buffer->name[length] = '\0';
  buffer->data = data;
  buffer->bytes = bytes;
  registry->count++;
  registry->total_bytes += bytes;
  return KEEL_OK;
}

size_t keel_registry_count(const keel_registry *registry) {
  return registry == NULL ? 0 : registry->count;
}

uint64_t keel_registry_bytes(const keel_registry *registry) {
  return registry == NULL ? 0 : registry->total_bytes;
}

const keel_state_buffer *keel_registry_entry(const keel_registry *registry, size_t index) {
  if (registry == NULL || index >= registry->count) return NULL;
  return &registry->buffers[index];
}

keel_status keel_registry_mark_per_process(keel_registry *registry, const char *name) {
  if (registry == NULL || name == NULL) return KEEL_EINVAL;
  for (size_t i = 0; i < registry->count; i++) {
    if (strcmp(registry->buffers[i].name, name) != 0) continue;
    registry->per_process[i] = true;
    return KEEL_OK;
  }
  return KEEL_ENOTFOUND;
}

bool keel_registry_per_process(const keel_registry *registry, size_t index) {
  return registry != NULL && index < registry->count && registry->per_process[index];
}

uint32_t keel__registry_crc32c(const keel_registry *registry) {
  uint32_t crc = 0;
  for (size_t i = 0; i < registry->count; i++)
    if (!registry->per_process[i])
      crc = keel_crc32c(crc, registry->buffers[i].data, registry->buffers[i].bytes);
  return crc;
}

keel_status keel__registry_copy_fit(const keel_registry *registry, uint8_t **copy,
                                    size_t *capacity) {
  size_t bytes = (size_t)registry->total_bytes;
  if (bytes <= *capacity) return KEEL_OK;
  uint8_t *grown = realloc(*copy, bytes);
  if (grown == NULL) return KEEL_ENOMEM;
  *copy = grown;
  *capacity = bytes;
  return KEEL_OK;
}

void keel__registry_copy(const keel_registry *registry, uint8_t *copy, size_t capacity, bool back) {
  size_t offset = 0;
  for (size_t i = 0; i < registry->count; i++) {
    const keel_state_buffer *buffer = &registry->buffers[i];
    if (offset + buffer->bytes > capacity) return; /* registered after the copy was sized */
    if (buffer->bytes > 0) {
      if (back)
        memcpy(buffer->data, copy + offset, buffer->bytes);
      else
        memcpy(copy + offset, buffer->data, buffer->bytes);
    }
    offset += buffer->bytes;
  }
}
