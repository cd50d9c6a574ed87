/* The manifest: what a snapshot is (identity, buffer names and sizes, chunk size, every
 * chunk's crc32c) in a bounded, versioned little-endian encoding with its own crc32c. One
 * set of rules (manifest_check) serves build, encode and decode, so whatever decodes
 * re-encodes to the same bytes. */
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

/* The encoding, version 1:
 *   offset size
 *   0      4    magic "KCKM"
 *   4      2    version, 1
 *   6      2    header bytes, 72
 *   8      4    length of the whole manifest, trailer included
 *   12     4    buffer_count (<= KEEL_MAX_STATE_BUFFERS)
 *   16     8    job_id
 *   24     4    rank
 *   28     4    shard_index
 *   32     4    shard_count
 *   36     4    replica
 *   40     8    step
 *   48     8    sequence
 *   56     8    chunk_bytes
 *   64     4    chunk_count (<= KEEL_CKPT_MAX_CHUNKS)
 *   68     4    reserved, 0
 *   72          buffer_count times: name length u8 (1..63), name, bytes u64
 *               chunk_count times: crc32c u32
 *               crc32c u32 of every byte before it */
/* The checks every tier shares: what identity can be saved, and the chunk size. */
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

#define MANIFEST_MAGIC 0x4d4b434bu /* "KCKM" in little-endian byte order */
#define MANIFEST_VERSION 1
enum {
  OFFSET_MAGIC = 0,
  OFFSET_VERSION = 4,
  OFFSET_HEADER_BYTES = 6,
  OFFSET_LENGTH = 8,
  OFFSET_BUFFER_COUNT = 12,
  OFFSET_JOB_ID = 16,
  OFFSET_RANK = 24,
  OFFSET_SHARD_INDEX = 28,
  OFFSET_SHARD_COUNT = 32,
  OFFSET_REPLICA = 36,
  OFFSET_STEP = 40,
  OFFSET_SEQUENCE = 48,
  OFFSET_CHUNK_BYTES = 56,
  OFFSET_CHUNK_COUNT = 64,
  OFFSET_RESERVED = 68,
  HEADER_BYTES = 72,
  TRAILER_BYTES = 4,
  ENTRY_FIXED_BYTES = 1 + 8,
};

/* Chunks of a buffer of `bytes`, in 64 bits so that no count wraps before it is checked. */
static uint64_t chunks_of(uint64_t bytes, uint64_t chunk_bytes) {
  return bytes / chunk_bytes + (bytes % chunk_bytes != 0);
}

/* The rules a manifest obeys wherever it comes from; KEEL_EINVAL names no field, the
 * callers know whether the manifest was theirs (encode) or untrusted (decode). */
static keel_status manifest_check(const keel_ckpt_manifest *manifest) {
  if (keel__ckpt_identity_check(&manifest->identity) != KEEL_OK) return KEEL_EINVAL;
  if (manifest->chunk_bytes == 0 || manifest->chunk_bytes > KEEL_CKPT_MAX_CHUNK_BYTES)
    return KEEL_EINVAL;
  if (manifest->buffer_count > KEEL_MAX_STATE_BUFFERS) return KEEL_EINVAL;
  if (manifest->chunk_count > KEEL_CKPT_MAX_CHUNKS) return KEEL_EINVAL;
  if (manifest->buffer_count > 0 && manifest->buffers == NULL) return KEEL_EINVAL;
  if (manifest->chunk_count > 0 && manifest->chunk_crc32c == NULL) return KEEL_EINVAL;
  uint64_t next_chunk = 0;
  uint64_t total = 0;
  for (uint32_t b = 0; b < manifest->buffer_count; b++) {
    const keel_ckpt_entry *entry = &manifest->buffers[b];
    size_t length = strnlen(entry->name, sizeof entry->name);
    if (length == sizeof entry->name || !keel_state_name_valid(entry->name, length))
      return KEEL_EINVAL;
    for (uint32_t earlier = 0; earlier < b; earlier++) {
      if (strcmp(manifest->buffers[earlier].name, entry->name) == 0) return KEEL_EINVAL;
    }
    if (entry->first_chunk != next_chunk) return KEEL_EINVAL;
    if (entry->chunk_count != chunks_of(entry->bytes, manifest->chunk_bytes)) return KEEL_EINVAL;
    next_chunk += entry->chunk_count;
    if (next_chunk > manifest->chunk_count) return KEEL_EINVAL;
    /* bytes <= chunk_count * chunk_bytes <= 2^52 each, so the sum cannot wrap. */
    total += entry->bytes;
  }
  if (next_chunk != manifest->chunk_count || total != manifest->total_bytes) return KEEL_EINVAL;
  return KEEL_OK;
}

keel_status keel_ckpt_manifest_build(const keel_registry *registry,
                                     const keel_ckpt_identity *identity, uint64_t chunk_bytes,
                                     keel_ckpt_manifest *manifest_p) {
  return keel__ckpt_manifest_layout(registry, identity, chunk_bytes, true, manifest_p);
}

keel_status keel__ckpt_manifest_layout(const keel_registry *registry,
                                       const keel_ckpt_identity *identity, uint64_t chunk_bytes,
                                       bool checksums, keel_ckpt_manifest *manifest_p) {
  if (registry == NULL || manifest_p == NULL) return KEEL_EINVAL;
  keel_status status = keel__ckpt_identity_check(identity);
  if (status != KEEL_OK) return status;
  uint64_t chunk = 0;
  status = keel__ckpt_chunk_bytes(chunk_bytes, &chunk);
  if (status != KEEL_OK) return status;
  uint64_t chunk_total = 0;
  for (size_t b = 0; b < keel_registry_count(registry); b++) {
    chunk_total += chunks_of(keel_registry_entry(registry, b)->bytes, chunk);
    if (chunk_total > KEEL_CKPT_MAX_CHUNKS) return KEEL_ERANGE;
  }
  keel_ckpt_manifest manifest = {.identity = *identity,
                                 .chunk_bytes = chunk,
                                 .total_bytes = keel_registry_bytes(registry),
                                 .buffer_count = (uint32_t)keel_registry_count(registry),
                                 .chunk_count = (uint32_t)chunk_total};
  if (keel_registry_count(registry) > 0) {
    manifest.buffers = calloc(keel_registry_count(registry), sizeof *manifest.buffers);
    if (manifest.buffers == NULL) return KEEL_ENOMEM;
  }
  if (chunk_total > 0) {
    manifest.chunk_crc32c = calloc(chunk_total, sizeof *manifest.chunk_crc32c);
    if (manifest.chunk_crc32c == NULL) {
      free(manifest.buffers);
      return KEEL_ENOMEM;
    }
  }
  uint32_t next_chunk = 0;
  for (size_t b = 0; b < keel_registry_count(registry); b++) {
    const keel_state_buffer *slot = keel_registry_entry(registry, b);
    keel_ckpt_entry *entry = &manifest.buffers[b];
    memcpy(entry->name, slot->name, sizeof entry->name);
    entry->bytes = slot->bytes;
    entry->first_chunk = next_chunk;
    entry->chunk_count = (uint32_t)chunks_of(slot->bytes, chunk);
    const uint8_t *bytes = slot->data;
    for (uint32_t c = 0; checksums && c < entry->chunk_count; c++) {
      uint64_t offset = (uint64_t)c * chunk;
      uint64_t length = slot->bytes - offset < chunk ? slot->bytes - offset : chunk;
      manifest.chunk_crc32c[next_chunk + c] = keel_crc32c(0, bytes + offset, length);
    }
    next_chunk += entry->chunk_count;
  }
  *manifest_p = manifest;
  return KEEL_OK;
}

size_t keel_ckpt_manifest_encoded_bytes(const keel_ckpt_manifest *manifest) {
  size_t bytes = HEADER_BYTES + TRAILER_BYTES + 4 * (size_t)manifest->chunk_count;
  for (uint32_t b = 0; b < manifest->buffer_count; b++) {
    bytes += ENTRY_FIXED_BYTES + strnlen(manifest->buffers[b].name, KEEL_STATE_NAME_MAX + 1);
  }
  return bytes;
}

keel_status keel__ckpt_manifest_bytes_for(const keel_registry *registry, uint64_t chunk_bytes,
                                          size_t *bytes_p) {
  uint64_t chunk = 0;
  keel_status status = keel__ckpt_chunk_bytes(chunk_bytes, &chunk);
  if (status != KEEL_OK) return status;
  uint64_t chunk_total = 0;
  size_t bytes = HEADER_BYTES + TRAILER_BYTES;
  for (size_t b = 0; b < keel_registry_count(registry); b++) {
    chunk_total += chunks_of(keel_registry_entry(registry, b)->bytes, chunk);
    if (chunk_total > KEEL_CKPT_MAX_CHUNKS) return KEEL_ERANGE;
    bytes += ENTRY_FIXED_BYTES + strlen(keel_registry_entry(registry, b)->name);
  }
  *bytes_p = bytes + 4 * (size_t)chunk_total;
  return KEEL_OK;
}

keel_status keel_ckpt_manifest_encode(const keel_ckpt_manifest *manifest, uint8_t *out,
                                      size_t capacity, size_t *length_p) {
  if (manifest == NULL || out == NULL || length_p == NULL) return KEEL_EINVAL;
  keel_status status = manifest_check(manifest);
  if (status != KEEL_OK) return status;
  size_t length = keel_ckpt_manifest_encoded_bytes(manifest);
  if (length > capacity) return KEEL_ERANGE;
  const keel_ckpt_identity *identity = &manifest->identity;
  keel_put_le32(out + OFFSET_MAGIC, MANIFEST_MAGIC);
  keel_put_le16(out + OFFSET_VERSION, MANIFEST_VERSION);
  keel_put_le16(out + OFFSET_HEADER_BYTES, HEADER_BYTES);
  keel_put_le32(out + OFFSET_LENGTH, (uint32_t)length);
  keel_put_le32(out + OFFSET_BUFFER_COUNT, manifest->buffer_count);
  keel_put_le64(out + OFFSET_JOB_ID, identity->job_id);
  keel_put_le32(out + OFFSET_RANK, identity->rank);
  keel_put_le32(out + OFFSET_SHARD_INDEX, identity->shard_index);
  keel_put_le32(out + OFFSET_SHARD_COUNT, identity->shard_count);
  keel_put_le32(out + OFFSET_REPLICA, identity->replica);
  keel_put_le64(out + OFFSET_STEP, identity->step);
  keel_put_le64(out + OFFSET_SEQUENCE, identity->sequence);
  keel_put_le64(out + OFFSET_CHUNK_BYTES, manifest->chunk_bytes);
  keel_put_le32(out + OFFSET_CHUNK_COUNT, manifest->chunk_count);
  keel_put_le32(out + OFFSET_RESERVED, 0);
  size_t cursor = HEADER_BYTES;
  for (uint32_t b = 0; b < manifest->buffer_count; b++) {
    const keel_ckpt_entry *entry = &manifest->buffers[b];
    size_t name_length = strlen(entry->name);
    out[cursor++] = (uint8_t)name_length;
    memcpy(out + cursor, entry->name, name_length);
    cursor += name_length;
    keel_put_le64(out + cursor, entry->bytes);
    cursor += 8;
  }
  for (uint32_t c = 0; c < manifest->chunk_count; c++, cursor += 4) {
    keel_put_le32(out + cursor, manifest->chunk_crc32c[c]);
  }
  keel_put_le32(out + cursor, keel_crc32c(0, out, cursor));
  *length_p = length;
  return KEEL_OK;
}

keel_status keel_ckpt_manifest_decode(const uint8_t *data, size_t length,
                                      keel_ckpt_manifest *manifest_p) {
  if (manifest_p == NULL) return KEEL_EINVAL;
  if (data == NULL || length < HEADER_BYTES + TRAILER_BYTES) return KEEL_ECORRUPT;
  if (keel_get_le32(data + OFFSET_MAGIC) != MANIFEST_MAGIC) return KEEL_ECORRUPT;
  if (keel_get_le16(data + OFFSET_VERSION) != MANIFEST_VERSION) return KEEL_ECORRUPT;
  if (keel_get_le16(data + OFFSET_HEADER_BYTES) != HEADER_BYTES) return KEEL_ECORRUPT;
  if (keel_get_le32(data + OFFSET_LENGTH) != length) return KEEL_ECORRUPT;
  size_t body = length - TRAILER_BYTES;
  if (keel_crc32c(0, data, body) != keel_get_le32(data + body)) return KEEL_ECORRUPT;
  if (keel_get_le32(data + OFFSET_RESERVED) != 0) return KEEL_ECORRUPT;
  uint32_t buffer_count = keel_get_le32(data + OFFSET_BUFFER_COUNT);
  uint32_t chunk_count = keel_get_le32(data + OFFSET_CHUNK_COUNT);
  if (buffer_count > KEEL_MAX_STATE_BUFFERS || chunk_count > KEEL_CKPT_MAX_CHUNKS)
    return KEEL_ERANGE;

  /* Walk the entries once to bound everything by the bytes actually present before any
   * allocation, then again to copy them. */
  size_t cursor = HEADER_BYTES;
  for (uint32_t b = 0; b < buffer_count; b++) {
    if (body - cursor < ENTRY_FIXED_BYTES) return KEEL_ECORRUPT;
    size_t name_length = data[cursor];
    if (body - cursor < ENTRY_FIXED_BYTES + name_length) return KEEL_ECORRUPT;
    /* Checked on the bytes themselves: a NUL inside would pass a check of the C string. */
    if (!keel_state_name_valid((const char *)data + cursor + 1, name_length)) return KEEL_ECORRUPT;
    cursor += ENTRY_FIXED_BYTES + name_length;
  }
  if (body - cursor != 4 * (size_t)chunk_count) return KEEL_ECORRUPT;

  keel_ckpt_manifest manifest = {
      .identity = {.job_id = keel_get_le64(data + OFFSET_JOB_ID),
                   .rank = keel_get_le32(data + OFFSET_RANK),
                   .shard_index = keel_get_le32(data + OFFSET_SHARD_INDEX),
                   .shard_count = keel_get_le32(data + OFFSET_SHARD_COUNT),
                   .replica = keel_get_le32(data + OFFSET_REPLICA),
                   .step = keel_get_le64(data + OFFSET_STEP),
                   .sequence = keel_get_le64(data + OFFSET_SEQUENCE)},
      .chunk_bytes = keel_get_le64(data + OFFSET_CHUNK_BYTES),
      .buffer_count = buffer_count,
      .chunk_count = chunk_count};
  if (buffer_count > 0) {
    manifest.buffers = calloc(buffer_count, sizeof *manifest.buffers);
    if (manifest.buffers == NULL) return KEEL_ENOMEM;
  }
  if (chunk_count > 0) {
    manifest.chunk_crc32c = malloc((size_t)chunk_count * sizeof *manifest.chunk_crc32c);
    if (manifest.chunk_crc32c == NULL) {
      free(manifest.buffers);
      return KEEL_ENOMEM;
    }
  }
  cursor = HEADER_BYTES;
  /* first_chunk and chunk_count are not on the wire: derived here, and a size that does not
   * fit a u32 count is left to manifest_check to refuse. */
  uint64_t next_chunk = 0;
  for (uint32_t b = 0; b < buffer_count; b++) {
    keel_ckpt_entry *entry = &manifest.buffers[b];
    size_t name_length = data[cursor++];
    memcpy(entry->name, data + cursor, name_length);
    entry->name[name_length] = '\0';
    cursor += name_length;
    entry->bytes = keel_get_le64(data + cursor);
    cursor += 8;
    uint64_t chunks = manifest.chunk_bytes == 0 ? 0 : chunks_of(entry->bytes, manifest.chunk_bytes);
    entry->first_chunk = (uint32_t)(next_chunk > UINT32_MAX ? UINT32_MAX : next_chunk);
    entry->chunk_count = (uint32_t)(chunks > UINT32_MAX ? UINT32_MAX : chunks);
    next_chunk += chunks > UINT32_MAX ? UINT32_MAX : chunks;
    manifest.total_bytes += entry->bytes;
  }
  for (uint32_t c = 0; c < chunk_count; c++, cursor += 4) {
    manifest.chunk_crc32c[c] = keel_get_le32(data + cursor);
  }
  if (manifest_check(&manifest) != KEEL_OK) {
    keel_ckpt_manifest_free(&manifest);
    return KEEL_ECORRUPT;
  }
  *manifest_p = manifest;
  return KEEL_OK;
}

void keel_ckpt_manifest_free(keel_ckpt_manifest *manifest) {
  if (manifest == NULL) return;
  free(manifest->buffers);
  free(manifest->chunk_crc32c);
  memset(manifest, 0, sizeof *manifest);
}
