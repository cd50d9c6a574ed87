/* The store's wire format: encoding and bounded decoding of requests and responses
 * (layout in store_internal.h). Decoders read only bytes they have checked are there and
 * allocate nothing, so the server can run them on anything a client sends. */
#include <stdlib.h>
#include <string.h>

#include "store/store_internal.h"

/* Which header fields an op uses; the others must be zero on the wire, so garbage that
 * happens to have a valid length is still refused. */
enum {
  FIELD_KEY = 1 << 0,
  FIELD_VALUE = 1 << 1,
  FIELD_REVISION = 1 << 2,
  FIELD_LEASE = 1 << 3,
  FIELD_DURATION = 1 << 4,
};

static const uint8_t op_fields[] = {
    [KEEL__STORE_OP_PUT] = FIELD_KEY | FIELD_VALUE | FIELD_LEASE,
    [KEEL__STORE_OP_GET] = FIELD_KEY,
    [KEEL__STORE_OP_CAS] = FIELD_KEY | FIELD_VALUE | FIELD_LEASE | FIELD_REVISION,
    [KEEL__STORE_OP_DELETE] = FIELD_KEY,
    [KEEL__STORE_OP_LIST] = FIELD_KEY,
    [KEEL__STORE_OP_WAIT] = FIELD_KEY | FIELD_REVISION | FIELD_DURATION,
    [KEEL__STORE_OP_LEASE_GRANT] = FIELD_DURATION,
    [KEEL__STORE_OP_LEASE_KEEPALIVE] = FIELD_LEASE,
    [KEEL__STORE_OP_LEASE_REVOKE] = FIELD_LEASE,
    [KEEL__STORE_OP_LIST_PREFIXES] = FIELD_VALUE,
    [KEEL__STORE_OP_LEASE_TTL] = FIELD_LEASE,
};

static bool op_known(uint8_t op) { return op < sizeof op_fields && op_fields[op] != 0; }

/* Two's complement both ways without relying on implementation-defined conversions. */
static int64_t to_signed(uint64_t value) {
  return value <= INT64_MAX ? (int64_t)value : -(int64_t)(~value) - 1;
}

static bool key_valid(const char *key, size_t length) { return memchr(key, '\0', length) == NULL; }

bool keel__store_prefixes_overlap(const char *a, const char *b) {
  size_t a_length = strlen(a), b_length = strlen(b);
  size_t shorter = a_length < b_length ? a_length : b_length;
  return memcmp(a, b, shorter) == 0;
}

bool keel__store_prefixes_parse(const uint8_t *value, size_t length,
                                const char *prefixes[KEEL_STORE_MAX_PREFIXES], size_t *count_p) {
  size_t count = 0, at = 0;
  while (at < length) {
    const uint8_t *end = memchr(value + at, '\0', length - at);
    size_t prefix_length = end == NULL ? 0 : (size_t)(end - (value + at));
    if (end == NULL || prefix_length == 0 || prefix_length > KEEL_STORE_MAX_KEY ||
        count == KEEL_STORE_MAX_PREFIXES)
      return false;
    const char *prefix = (const char *)value + at;
    for (size_t i = 0; i < count; i++) {
      if (keel__store_prefixes_overlap(prefixes[i], prefix)) return false;
    }
    prefixes[count++] = prefix;
    at += prefix_length + 1;
  }
  *count_p = count;
  return count > 0;
}

keel_status keel__store_request_encode(const keel__store_request *request, keel_buffer *buffer) {
  if (request->key_length > KEEL_STORE_MAX_KEY || request->value_length > KEEL_STORE_MAX_VALUE)
    return KEEL_ERANGE;
  uint8_t header[KEEL__STORE_REQUEST_HEADER_BYTES];
  header[0] = KEEL__STORE_WIRE_VERSION;
  header[1] = request->op;
  keel_put_le16(header + 2, (uint16_t)request->key_length);
  keel_put_le32(header + 4, (uint32_t)request->value_length);
  keel_put_le64(header + 8, request->id);
  keel_put_le64(header + 16, request->revision);
  keel_put_le64(header + 24, (uint64_t)request->lease);
  keel_put_le64(header + 32, (uint64_t)request->duration_ns);
  size_t total = sizeof header + request->key_length + request->value_length;
  /* Reserving the whole first leaves the buffer unchanged if it cannot hold it all. */
  keel_status status = keel_buffer_reserve(buffer, buffer->length + total + 1);
  if (status != KEEL_OK) return status;
  keel_buffer_append(buffer, header, sizeof header);
  keel_buffer_append(buffer, request->key, request->key_length);
  keel_buffer_append(buffer, request->value, request->value_length);
  return KEEL_OK;
}

keel_status keel__store_request_decode(const uint8_t *payload, size_t length,
                                       keel__store_request *request_p) {
  if (length < KEEL__STORE_REQUEST_HEADER_BYTES) return KEEL_ECORRUPT;
  if (payload[0] != KEEL__STORE_WIRE_VERSION || !op_known(payload[1])) return KEEL_EPROTO;
  keel__store_request request = {
      .op = payload[1],
      .key_length = keel_get_le16(payload + 2),
      .value_length = keel_get_le32(payload + 4),
      .id = keel_get_le64(payload + 8),
      .revision = keel_get_le64(payload + 16),
      .lease = to_signed(keel_get_le64(payload + 24)),
      .duration_ns = to_signed(keel_get_le64(payload + 32)),
  };
  if (request.key_length > KEEL_STORE_MAX_KEY || request.value_length > KEEL_STORE_MAX_VALUE)
    return KEEL_ERANGE;
  if (length - KEEL__STORE_REQUEST_HEADER_BYTES != request.key_length + request.value_length)
    return KEEL_ECORRUPT;
  uint8_t fields = op_fields[request.op];
  if ((!(fields & FIELD_KEY) && request.key_length != 0) ||
      (!(fields & FIELD_VALUE) && request.value_length != 0) ||
      (!(fields & FIELD_REVISION) && request.revision != 0) ||
      (!(fields & FIELD_LEASE) && request.lease != 0) ||
      (!(fields & FIELD_DURATION) && request.duration_ns != 0) || request.lease < 0 ||
      request.duration_ns < 0)
    return KEEL_ECORRUPT;
  request.key = (const char *)payload + KEEL__STORE_REQUEST_HEADER_BYTES;
  request.value = payload + KEEL__STORE_REQUEST_HEADER_BYTES + request.key_length;
  if (!key_valid(request.key, request.key_length)) return KEEL_ECORRUPT;
  const char *prefixes[KEEL_STORE_MAX_PREFIXES];
  size_t prefix_count;
  if (request.op == KEEL__STORE_OP_LIST_PREFIXES &&
      !keel__store_prefixes_parse(request.value, request.value_length, prefixes, &prefix_count))
    return KEEL_ECORRUPT;
  *request_p = request;
  return KEEL_OK;
}

keel_status keel__store_response_begin(keel_buffer *buffer, uint8_t op, uint64_t id,
                                       keel_status status, uint64_t revision, int64_t lease,
                                       uint32_t entry_count) {
  uint8_t header[KEEL__STORE_RESPONSE_HEADER_BYTES];
  header[0] = KEEL__STORE_WIRE_VERSION;
  header[1] = op;
  keel_put_le16(header + 2, 0);
  keel_put_le32(header + 4, (uint32_t)(int32_t)status);
  keel_put_le64(header + 8, id);
  keel_put_le64(header + 16, revision);
  keel_put_le64(header + 24, (uint64_t)lease);
  keel_put_le32(header + 32, entry_count);
  return keel_buffer_append(buffer, header, sizeof header);
}

keel_status keel__store_response_add_entry(keel_buffer *buffer, const char *key, size_t key_length,
                                           const void *value, size_t value_length,
                                           uint64_t revision, int64_t lease) {
  if (key_length > KEEL_STORE_MAX_KEY || value_length > KEEL_STORE_MAX_VALUE) return KEEL_ERANGE;
  uint8_t header[KEEL__STORE_ENTRY_HEADER_BYTES];
  keel_put_le16(header, (uint16_t)key_length);
  keel_put_le32(header + 2, (uint32_t)value_length);
  keel_put_le64(header + 6, revision);
  keel_put_le64(header + 14, (uint64_t)lease);
  keel_status status =
      keel_buffer_reserve(buffer, buffer->length + sizeof header + key_length + value_length + 1);
  if (status != KEEL_OK) return status;
  keel_buffer_append(buffer, header, sizeof header);
  keel_buffer_append(buffer, key, key_length);
  keel_buffer_append(buffer, value, value_length);
  return KEEL_OK;
}

/* Reads the entry at wire (available bytes left), checking it fits; *size_p gets its
 * whole encoded size. */
static keel_status entry_decode(const uint8_t *wire, size_t available, keel_store_entry *entry,
                                size_t *size_p) {
  if (available < KEEL__STORE_ENTRY_HEADER_BYTES) return KEEL_ECORRUPT;
  size_t key_length = keel_get_le16(wire);
  size_t value_length = keel_get_le32(wire + 2);
  if (key_length == 0) return KEEL_ECORRUPT;
  if (key_length > KEEL_STORE_MAX_KEY || value_length > KEEL_STORE_MAX_VALUE) return KEEL_ERANGE;
  if (available - KEEL__STORE_ENTRY_HEADER_BYTES < key_length + value_length) return KEEL_ECORRUPT;
  entry->revision = keel_get_le64(wire + 6);
  entry->lease = to_signed(keel_get_le64(wire + 14));
  if (entry->lease < 0) return KEEL_ECORRUPT;
  if (!key_valid((const char *)wire + KEEL__STORE_ENTRY_HEADER_BYTES, key_length))
    return KEEL_ECORRUPT;
  entry->value_length = value_length;
  *size_p = KEEL__STORE_ENTRY_HEADER_BYTES + key_length + value_length;
  return KEEL_OK;
}

keel_status keel__store_response_decode(const uint8_t *payload, size_t length,
                                        keel__store_response *response_p) {
  if (length < KEEL__STORE_RESPONSE_HEADER_BYTES) return KEEL_ECORRUPT;
  if (payload[0] != KEEL__STORE_WIRE_VERSION || !op_known(payload[1])) return KEEL_EPROTO;
  int64_t status = (int32_t)keel_get_le32(payload + 4);
  if (keel_get_le16(payload + 2) != 0 || !keel_status_known(status)) return KEEL_ECORRUPT;
  keel__store_response response = {
      .op = payload[1],
      .status = (keel_status)status,
      .id = keel_get_le64(payload + 8),
      .revision = keel_get_le64(payload + 16),
      .lease = to_signed(keel_get_le64(payload + 24)),
      .entry_count = keel_get_le32(payload + 32),
      .entries = payload + KEEL__STORE_RESPONSE_HEADER_BYTES,
      .entries_length = length - KEEL__STORE_RESPONSE_HEADER_BYTES,
  };
  if (response.entry_count > KEEL_STORE_MAX_KEYS) return KEEL_ERANGE;
  size_t offset = 0;
  for (uint32_t i = 0; i < response.entry_count; i++) {
    keel_store_entry entry;
    size_t size;
    keel_status entry_status =
        entry_decode(response.entries + offset, response.entries_length - offset, &entry, &size);
    if (entry_status != KEEL_OK) return entry_status;
    offset += size;
  }
  if (offset != response.entries_length) return KEEL_ECORRUPT;
  *response_p = response;
  return KEEL_OK;
}

keel_status keel__store_response_entries(const keel__store_response *response,
                                         keel_store_entry **entries_p) {
  if (response->entry_count == 0) {
    *entries_p = NULL;
    return KEEL_OK;
  }
  keel_store_entry *entries = calloc(response->entry_count, sizeof *entries);
  if (entries == NULL) return KEEL_ENOMEM;
  size_t offset = 0;
  uint32_t filled = 0;
  keel_status status = KEEL_OK;
  for (; filled < response->entry_count; filled++) {
    const uint8_t *wire = response->entries + offset;
    keel_store_entry *entry = &entries[filled];
    size_t size;
    /* Already checked by keel__store_response_decode; repeated to learn the sizes. */
    status = entry_decode(wire, response->entries_length - offset, entry, &size);
    if (status != KEEL_OK) break;
    size_t key_length = keel_get_le16(wire);
    entry->key = malloc(key_length + 1);
    entry->value = malloc(entry->value_length + 1);
    if (entry->key == NULL || entry->value == NULL) {
      status = KEEL_ENOMEM;
      filled++; /* so this half-made entry is freed too */
      break;
    }
    memcpy(entry->key, wire + KEEL__STORE_ENTRY_HEADER_BYTES, key_length);
    entry->key[key_length] = '\0';
    memcpy(entry->value, wire + KEEL__STORE_ENTRY_HEADER_BYTES + key_length, entry->value_length);
    entry->value[entry->value_length] = '\0';
    offset += size;
  }
  if (status != KEEL_OK) goto fail_free_entries;
  *entries_p = entries;
  return KEEL_OK;

fail_free_entries:
  keel_store_entries_free(entries, filled);
  return status;
}
