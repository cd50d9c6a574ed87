/* The frame header on the wire: fixed little-endian layout, checked field by field before
 * any of its numbers is trusted (the fuzz target's entry point is keel_frame_decode). */
#include "net_internal.h"

/* Byte offsets of the fields (net.h gives the order). */
enum {
  OFFSET_MAGIC = 0,
  OFFSET_VERSION = 4,
  OFFSET_TYPE = 6,
  OFFSET_JOB_ID = 8,
  OFFSET_EPOCH = 16,
  OFFSET_TAG = 24,
  OFFSET_LENGTH = 32,
  OFFSET_SOURCE = 40,
  OFFSET_PAYLOAD_CRC = 44,
  OFFSET_HEADER_CRC = 48,
  OFFSET_RESERVED = 52,
};

bool keel__frame_is_handshake(uint16_t type) {
  return type >= KEEL_FRAME_HELLO && type <= KEEL_FRAME_LINKED;
}

bool keel__frame_type_known(uint16_t type) {
  switch (type) {
    case KEEL_FRAME_HELLO:
    case KEEL_FRAME_CHALLENGE:
    case KEEL_FRAME_RESPONSE:
    case KEEL_FRAME_WELCOME:
    case KEEL_FRAME_LINKED:
    case KEEL_FRAME_DATA:
    case KEEL_FRAME_REVOKE:
    case KEEL_FRAME_MESSAGE:
    case KEEL_FRAME_CONTROL:
    case KEEL_FRAME_STORE_REQUEST:
    case KEEL_FRAME_STORE_RESPONSE:
    case KEEL_FRAME_EC_REQUEST:
    case KEEL_FRAME_EC_REPLY:
    case KEEL_FRAME_CKPT_REQUEST:
    case KEEL_FRAME_CKPT_DATA:
    case KEEL_FRAME_CKPT_REPLY:
    case KEEL_FRAME_GOODBYE:
      return true;
    default:
      return false;
  }
}

void keel_frame_encode(const keel_frame *frame, uint8_t *wire) {
  keel_put_le32(wire + OFFSET_MAGIC, KEEL_FRAME_MAGIC);
  keel_put_le16(wire + OFFSET_VERSION, KEEL_FRAME_VERSION);
  keel_put_le16(wire + OFFSET_TYPE, frame->type);
  keel_put_le64(wire + OFFSET_JOB_ID, frame->job_id);
  keel_put_le64(wire + OFFSET_EPOCH, frame->epoch);
  keel_put_le64(wire + OFFSET_TAG, frame->tag);
  keel_put_le64(wire + OFFSET_LENGTH, frame->length);
  keel_put_le32(wire + OFFSET_SOURCE, frame->source);
  keel_put_le32(wire + OFFSET_PAYLOAD_CRC, frame->payload_crc32c);
  keel_put_le32(wire + OFFSET_HEADER_CRC, keel_crc32c(0, wire, OFFSET_HEADER_CRC));
  keel_put_le32(wire + OFFSET_RESERVED, 0);
}

keel_status keel_frame_decode(const uint8_t *wire, size_t wire_length, uint64_t expected_job_id,
                              uint64_t max_payload, keel_frame *frame_p) {
  if (wire == NULL || wire_length < KEEL_FRAME_HEADER_BYTES) return KEEL_ECORRUPT;
  if (keel_get_le32(wire + OFFSET_MAGIC) != KEEL_FRAME_MAGIC) return KEEL_ECORRUPT;
  /* The crc comes before the fields it covers: a flipped bit anywhere is corruption, and
   * only an intact header can speak of a version or job mismatch. */
  if (keel_get_le32(wire + OFFSET_HEADER_CRC) != keel_crc32c(0, wire, OFFSET_HEADER_CRC))
    return KEEL_ECORRUPT;
  if (keel_get_le16(wire + OFFSET_VERSION) != KEEL_FRAME_VERSION) return KEEL_EPROTO;
  uint16_t type = keel_get_le16(wire + OFFSET_TYPE);
  if (!keel__frame_type_known(type)) return KEEL_ECORRUPT;
  uint64_t job_id = keel_get_le64(wire + OFFSET_JOB_ID);
  if (expected_job_id != 0 && job_id != expected_job_id) return KEEL_EPROTO;
  uint64_t length = keel_get_le64(wire + OFFSET_LENGTH);
  if (length > max_payload) return KEEL_ERANGE;
  frame_p->type = type;
  frame_p->job_id = job_id;
  frame_p->epoch = keel_get_le64(wire + OFFSET_EPOCH);
  frame_p->tag = keel_get_le64(wire + OFFSET_TAG);
  frame_p->length = length;
  frame_p->source = keel_get_le32(wire + OFFSET_SOURCE);
  frame_p->payload_crc32c = keel_get_le32(wire + OFFSET_PAYLOAD_CRC);
  return KEEL_OK;
}
