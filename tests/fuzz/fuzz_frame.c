/* libFuzzer target over keel_frame_decode, the first code that touches bytes from the
 * network: any input must be refused (writing nothing) or decoded into a header that
 * re-encodes to the same bytes, under several job ids and payload bounds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "keel/net.h"

#define SEED_JOB_ID 0x1122334455667788ull

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity);

static void decode_all_ways(const uint8_t *data, size_t size) {
  static const uint64_t job_ids[] = {0, SEED_JOB_ID, 1};
  static const uint64_t bounds[] = {0, 128, KEEL_FRAME_DEFAULT_MAX_PAYLOAD, UINT64_MAX};
  for (size_t j = 0; j < sizeof job_ids / sizeof job_ids[0]; j++) {
    for (size_t b = 0; b < sizeof bounds / sizeof bounds[0]; b++) {
      keel_frame frame;
      memset(&frame, 0xa5, sizeof frame);
      keel_frame before = frame;
      keel_status status = keel_frame_decode(data, size, job_ids[j], bounds[b], &frame);
      if (status != KEEL_OK) {
        /* Nothing is written on refusal, and only the documented refusals occur. */
        if (memcmp(&before, &frame, sizeof frame) != 0) abort();
        if (status != KEEL_ECORRUPT && status != KEEL_EPROTO && status != KEEL_ERANGE) abort();
        continue;
      }
      if (size < KEEL_FRAME_HEADER_BYTES || frame.length > bounds[b]) abort();
      if (job_ids[j] != 0 && frame.job_id != job_ids[j]) abort();
      /* A header that decodes is exactly what encode makes of its fields (reserved
       * aside, which is not covered by the crc). */
      uint8_t again[KEEL_FRAME_HEADER_BYTES];
      keel_frame_encode(&frame, again);
      if (memcmp(again, data, 52) != 0) abort();
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  decode_all_ways(data, size);
  /* Mutated headers almost never keep a valid crc; a resealed copy lets the fuzzer reach
   * the checks behind it (version, type, job id, length bound). */
  if (size >= KEEL_FRAME_HEADER_BYTES) {
    uint8_t sealed[KEEL_FRAME_HEADER_BYTES];
    memcpy(sealed, data, sizeof sealed);
    uint32_t crc = keel_crc32c(0, sealed, 48);
    for (int i = 0; i < 4; i++) sealed[48 + i] = (uint8_t)(crc >> (8 * i));
    decode_all_ways(sealed, sizeof sealed);
  }
  return 0;
}

size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity) {
  static const keel_frame seeds[] = {
      {.type = KEEL_FRAME_HELLO, .job_id = SEED_JOB_ID, .length = 44, .source = 3},
      {.type = KEEL_FRAME_DATA, .job_id = SEED_JOB_ID, .epoch = 2, .tag = 77, .length = 4096,
       .source = 1, .payload_crc32c = 0xdeadbeef},
      {.type = KEEL_FRAME_REVOKE, .job_id = SEED_JOB_ID, .epoch = 5},
      {.type = KEEL_FRAME_MESSAGE, .job_id = 1, .length = (uint64_t)1 << 40, .source = 9},
      {.type = KEEL_FRAME_GOODBYE, .job_id = SEED_JOB_ID, .tag = UINT64_MAX, .length = 128},
  };
  if (index < 0 || (size_t)index >= sizeof seeds / sizeof seeds[0]) return 0;
  if (capacity < KEEL_FRAME_HEADER_BYTES) return 0;
  keel_frame_encode(&seeds[index], buffer);
  return KEEL_FRAME_HEADER_BYTES;
}
