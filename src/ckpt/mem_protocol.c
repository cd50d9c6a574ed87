/* The snapshot service's wire format (mem_internal.h): fixed-size requests and answers with
 * a strict decoder, the calls over one link, and a region sent in DATA frames with a window
 * of frames in flight. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/mem_internal.h"

void keel__ckpt_request_encode(const keel__ckpt_request *request,
                               uint8_t out[KEEL__CKPT_REQUEST_BYTES]) {
  memset(out, 0, KEEL__CKPT_REQUEST_BYTES);
  keel_put_le16(out, request->op);
  keel_put_le32(out + 4, request->origin_rank);
  keel_put_le32(out + 8, request->shard_index);
  keel_put_le32(out + 12, request->shard_count);
  keel_put_le64(out + 16, request->step);
  keel_put_le64(out + 24, request->region_bytes);
  if (request->op == KEEL__CKPT_OFFER) memcpy(out + 32, request->header, KEEL__CKPT_HEADER_BYTES);
}

static bool all_zero(const uint8_t *data, size_t length) {
  for (size_t i = 0; i < length; i++)
    if (data[i] != 0) return false;
  return true;
}

keel_status keel__ckpt_request_decode(const uint8_t *data, size_t length,
                                      keel__ckpt_request *request_p) {
  if (data == NULL || length != KEEL__CKPT_REQUEST_BYTES) return KEEL_EPROTO;
  keel__ckpt_request request = {
      .op = keel_get_le16(data),
      .origin_rank = keel_get_le32(data + 4),
      .shard_index = keel_get_le32(data + 8),
      .shard_count = keel_get_le32(data + 12),
      .step = keel_get_le64(data + 16),
      .region_bytes = keel_get_le64(data + 24),
  };
  if (keel_get_le16(data + 2) != 0) return KEEL_EPROTO;
  switch (request.op) {
    case KEEL__CKPT_OFFER:
      if (request.region_bytes <= KEEL__CKPT_HEADER_BYTES ||
          request.region_bytes > KEEL__CKPT_MAX_REGION_BYTES || request.shard_count == 0 ||
          request.shard_index >= request.shard_count)
        return KEEL_EPROTO;
      memcpy(request.header, data + 32, KEEL__CKPT_HEADER_BYTES);
      break;
    case KEEL__CKPT_COMMIT:
      if (!all_zero(data + 4, KEEL__CKPT_REQUEST_BYTES - 4)) return KEEL_EPROTO;
      break;
    case KEEL__CKPT_FETCH:
    case KEEL__CKPT_PROBE:
      if (request.shard_count == 0 || request.shard_index >= request.shard_count ||
          request.origin_rank != 0 || request.region_bytes != 0 ||
          !all_zero(data + 32, KEEL__CKPT_HEADER_BYTES))
        return KEEL_EPROTO;
      break;
    default:
      return KEEL_EPROTO;
  }
  *request_p = request;
  return KEEL_OK;
}

void keel__ckpt_reply_encode(const keel__ckpt_reply *reply, uint8_t out[KEEL__CKPT_REPLY_BYTES]) {
  memset(out, 0, KEEL__CKPT_REPLY_BYTES);
  keel_put_le16(out, reply->op);
  keel_put_le32(out + 4, (uint32_t)reply->status);
  keel_put_le64(out + 8, reply->value);
}

keel_status keel__ckpt_reply_decode(const uint8_t *data, size_t length, keel__ckpt_reply *reply_p) {
  if (data == NULL || length != KEEL__CKPT_REPLY_BYTES || keel_get_le16(data + 2) != 0)
    return KEEL_EPROTO;
  uint16_t op = keel_get_le16(data);
  if (op < KEEL__CKPT_OFFER || op > KEEL__CKPT_PROBE) return KEEL_EPROTO;
  int32_t status = (int32_t)keel_get_le32(data + 4);
  if (status > 0) return KEEL_EPROTO;
  *reply_p = (keel__ckpt_reply){.op = op, .status = status, .value = keel_get_le64(data + 8)};
  return KEEL_OK;
}

static bool never_retry(void *context) {
  (void)context;
  return false;
}

keel_status keel__ckpt_connect(const char *address, const keel_auth *auth, int64_t deadline_ns,
                               keel_link **link_p) {
  keel_status status = keel_link_connect_while(address, auth, deadline_ns, never_retry, NULL, link_p);
  if (status == KEEL_OK) keel_link_set_max_payload(*link_p, KEEL_CKPT_MAX_CHUNK_BYTES);
  return status;
}

keel_status keel__ckpt_send_request(keel_link *link, const keel__ckpt_request *request,
                                    int64_t deadline_ns) {
  uint8_t payload[KEEL__CKPT_REQUEST_BYTES];
  keel__ckpt_request_encode(request, payload);
  keel_frame frame = {.type = KEEL_FRAME_CKPT_REQUEST};
  return keel_link_send(link, &frame, payload, sizeof payload, deadline_ns);
}

keel_status keel__ckpt_send_reply(keel_link *link, uint16_t op, keel_status status,
                                  uint64_t value, int64_t deadline_ns) {
  uint8_t payload[KEEL__CKPT_REPLY_BYTES];
  keel__ckpt_reply reply = {.op = op, .status = status, .value = value};
  keel__ckpt_reply_encode(&reply, payload);
  keel_frame frame = {.type = KEEL_FRAME_CKPT_REPLY};
  return keel_link_send(link, &frame, payload, sizeof payload, deadline_ns);
}

keel_status keel__ckpt_await_reply(keel_link *link, uint16_t op, uint64_t *value_p,
                                   int64_t deadline_ns) {
  keel_frame frame;
  void *payload = NULL;
  keel_status status = keel_link_recv(link, &frame, &payload, deadline_ns);
  if (status != KEEL_OK) return status;
  keel__ckpt_reply reply;
  status = frame.type == KEEL_FRAME_CKPT_REPLY
               ? keel__ckpt_reply_decode(payload, (size_t)frame.length, &reply)
               : KEEL_EPROTO;
  free(payload);
  if (status != KEEL_OK) return status;
  if (reply.op != op) return KEEL_EPROTO;
  if (value_p != NULL) *value_p = reply.value;
  return reply.status;
}

void keel__ckpt_sender_init(keel__ckpt_sender *sender, keel_link *link,
                            const keel_ckpt_region *region, uint64_t first, uint32_t window) {
  *sender = (keel__ckpt_sender){.link = link, .base = region->base, .next = first,
                                .window = window < KEEL__CKPT_MAX_IN_FLIGHT
                                              ? window
                                              : KEEL__CKPT_MAX_IN_FLIGHT};
}

static keel_status sender_await_oldest(keel__ckpt_sender *sender, int64_t deadline_ns) {
  uint64_t offset = 0;
  keel_status status = keel__ckpt_await_reply(sender->link, KEEL__CKPT_ACK, &offset, deadline_ns);
  if (status != KEEL_OK) return status;
  if (offset != sender->pending[sender->oldest]) return KEEL_EPROTO; /* ACKs come in order */
  sender->oldest = (sender->oldest + 1) % KEEL__CKPT_MAX_IN_FLIGHT;
  sender->in_flight--;
  return KEEL_OK;
}

keel_status keel__ckpt_sender_send(keel__ckpt_sender *sender, uint64_t length,
                                   int64_t deadline_ns) {
  if (sender->window > 0 && sender->in_flight == sender->window) {
    keel_status status = sender_await_oldest(sender, deadline_ns);
    if (status != KEEL_OK) return status;
  }
  keel_frame frame = {.type = KEEL_FRAME_CKPT_DATA, .tag = sender->next};
  keel_status status =
      keel_link_send(sender->link, &frame, sender->base + sender->next, (size_t)length, deadline_ns);
  if (status != KEEL_OK) return status;
  if (sender->window > 0) {
    sender->pending[(sender->oldest + sender->in_flight) % KEEL__CKPT_MAX_IN_FLIGHT] = sender->next;
    sender->in_flight++;
  }
  sender->next += length;
  return KEEL_OK;
}

keel_status keel__ckpt_sender_drain(keel__ckpt_sender *sender, int64_t deadline_ns) {
  while (sender->in_flight > 0) {
    keel_status status = sender_await_oldest(sender, deadline_ns);
    if (status != KEEL_OK) return status;
  }
  return KEEL_OK;
}

keel_status keel__ckpt_send_region(keel_link *link, const keel_ckpt_region *region,
                                   uint64_t first, uint64_t chunk_bytes, uint32_t window,
                                   int64_t deadline_ns) {
  keel__ckpt_sender sender;
  keel__ckpt_sender_init(&sender, link, region, first, window);
  keel_status status = KEEL_OK;
  while (status == KEEL_OK && sender.next < region->bytes) {
    uint64_t left = region->bytes - sender.next;
    status = keel__ckpt_sender_send(&sender, left < chunk_bytes ? left : chunk_bytes, deadline_ns);
  }
  if (status == KEEL_OK) status = keel__ckpt_sender_drain(&sender, deadline_ns);
  return status;
}

bool keel__ckpt_agent_address_parse(const char *value, size_t length, char *address,
                                    size_t capacity) {
  static const char key[] = " ckpt=";
  const char *end = value + length;
  for (const char *at = value; at + sizeof key - 1 <= end; at++) {
    if (memcmp(at, key, sizeof key - 1) != 0) continue;
    const char *start = at + sizeof key - 1, *stop = start;
    while (stop < end && *stop != ' ' && *stop != '\0') stop++;
    size_t size = (size_t)(stop - start);
    if (size == 0 || size >= capacity) return false;
    memcpy(address, start, size);
    address[size] = '\0';
    return true;
  }
  return false;
}
