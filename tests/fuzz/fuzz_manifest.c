/* libFuzzer target over keel_ckpt_manifest_decode, which reads manifests from files and
 * memory regions that a crash, a disk or another job may have left: any input must be
 * refused (writing nothing) or decoded into a manifest that re-encodes to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "keel/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity);

static void decode_once(const uint8_t *data, size_t size) {
  keel_ckpt_manifest manifest;
  memset(&manifest, 0xa5, sizeof manifest);
  keel_ckpt_manifest before = manifest;
  keel_status status = keel_ckpt_manifest_decode(data, size, &manifest);
  if (status != KEEL_OK) {
    /* Nothing is written on refusal, and only the documented refusals occur. */
    if (memcmp(&before, &manifest, sizeof manifest) != 0) abort();
    if (status != KEEL_ECORRUPT && status != KEEL_ERANGE && status != KEEL_ENOMEM) abort();
    return;
  }
  if (manifest.buffer_count > KEEL_MAX_STATE_BUFFERS) abort();
  if (manifest.chunk_count > KEEL_CKPT_MAX_CHUNKS) abort();
  if (manifest.identity.shard_index >= manifest.identity.shard_count) abort();
  /* The encoding has no slack: what decodes is exactly what encode makes of it. */
  if (keel_ckpt_manifest_encoded_bytes(&manifest) != size) abort();
  uint8_t *again = malloc(size);
  if (again == NULL) abort();
  size_t length = 0;
  if (keel_ckpt_manifest_encode(&manifest, again, size, &length) != KEEL_OK) abort();
  if (length != size || memcmp(again, data, size) != 0) abort();
  free(again);
  keel_ckpt_manifest_free(&manifest);
}

/* Rewrites the length field and the trailing crc so that mutated bytes reach the checks
 * behind them (counts, names, chunk arithmetic). */
static void reseal(uint8_t *data, size_t size) {
  for (int i = 0; i < 4; i++) data[8 + i] = (uint8_t)(size >> (8 * i));
  uint32_t crc = keel_crc32c(0, data, size - 4);
  for (int i = 0; i < 4; i++) data[size - 4 + i] = (uint8_t)(crc >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  decode_once(data, size);
  if (size >= 76 && size <= KEEL_CKPT_MANIFEST_MAX_BYTES) {
    uint8_t *sealed = malloc(size);
    if (sealed == NULL) abort();
    memcpy(sealed, data, size);
    reseal(sealed, size);
    decode_once(sealed, size);
    free(sealed);
  }
  return 0;
}

size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity) {
  static keel_ckpt_entry one_buffer[] = {
      {.name = "weights", .bytes = 10, .first_chunk = 0, .chunk_count = 3}};
  static uint32_t one_buffer_crcs[] = {0x12345678u, 0x9abcdef0u, 0};
  static keel_ckpt_entry three_buffers[] = {
      {.name = "w", .bytes = 4096, .first_chunk = 0, .chunk_count = 1},
      {.name = "adam.m", .bytes = 0, .first_chunk = 1, .chunk_count = 0},
      {.name = "step", .bytes = 8, .first_chunk = 1, .chunk_count = 1}};
  static uint32_t three_buffers_crcs[] = {1, 2};
  static const keel_ckpt_manifest seeds[] = {
      {.identity = {.job_id = 7, .shard_count = 1},
       .chunk_bytes = 4,
       .total_bytes = 10,
       .buffer_count = 1,
       .chunk_count = 3,
       .buffers = one_buffer,
       .chunk_crc32c = one_buffer_crcs},
      {.identity = {.job_id = UINT64_MAX,
                    .rank = 5,
                    .shard_index = 1,
                    .shard_count = 2,
                    .replica = 2,
                    .step = 1000,
                    .sequence = 3},
       .chunk_bytes = 4096,
       .total_bytes = 4104,
       .buffer_count = 3,
       .chunk_count = 2,
       .buffers = three_buffers,
       .chunk_crc32c = three_buffers_crcs},
      {.identity = {.job_id = 1, .shard_count = 1}, .chunk_bytes = KEEL_CKPT_MAX_CHUNK_BYTES},
  };
  if (index < 0 || (size_t)index >= sizeof seeds / sizeof seeds[0]) return 0;
  size_t length = 0;
  if (keel_ckpt_manifest_encode(&seeds[index], buffer, capacity, &length) != KEEL_OK) return 0;
  return length;
}
