/* Fuzz target for the store server's request decoder: whatever a client sends must be
 * refused or decoded into a request that re-encodes to the same bytes and that the
 * key-value state machine answers with a well-formed response. The same bytes also go
 * through the client's response decoder. */
#include <stdlib.h>
#include <string.h>

#include "store/store_internal.h"

/* A small store for each input, so that gets, cas and lease operations meet real keys. */
static keel__store_kv *make_store(void) {
  keel__store_kv *kv;
  if (keel__store_kv_create(&kv) != KEEL_OK) abort();
  keel_buffer scratch;
  keel_buffer_init(&scratch, KEEL__STORE_RESPONSE_BUFFER_MAX);
  bool changed;
  keel__store_request grant = {.op = KEEL__STORE_OP_LEASE_GRANT, .duration_ns = 1000};
  keel__store_kv_apply(kv, &grant, 0, &scratch, &changed);
  static const char *const keys[] = {"proc/0", "proc/1", "decide/00000001", "agree/00000001/0"};
  for (int i = 0; i < 4; i++) {
    keel__store_request put = {.op = KEEL__STORE_OP_PUT,
                               .key = keys[i],
                               .key_length = strlen(keys[i]),
                               .value = (const uint8_t *)"v",
                               .value_length = 1,
                               .lease = i % 2};
    keel__store_kv_apply(kv, &put, 0, &scratch, &changed);
  }
  keel__store_request remove = {.op = KEEL__STORE_OP_DELETE, .key = "proc/0", .key_length = 6};
  keel__store_kv_apply(kv, &remove, 0, &scratch, &changed);
  keel_buffer_free(&scratch);
  return kv;
}

static void check_request(const uint8_t *data, size_t size, const keel__store_request *request) {
  keel_buffer buffer;
  keel_buffer_init(&buffer, KEEL__STORE_REQUEST_BUFFER_MAX);
  if (keel__store_request_encode(request, &buffer) != KEEL_OK) abort();
  if (buffer.length != size || memcmp(buffer.data, data, size) != 0) abort();
  keel_buffer_free(&buffer);

  keel__store_kv *kv = make_store();
  keel_buffer response;
  keel_buffer_init(&response, KEEL__STORE_RESPONSE_BUFFER_MAX);
  bool changed;
  if (keel__store_kv_apply(kv, request, 500, &response, &changed) != KEEL_OK) abort();
  keel__store_response decoded;
  if (keel__store_response_decode(response.data, response.length, &decoded) != KEEL_OK) abort();
  if (decoded.id != request->id || decoded.op != request->op) abort();
  keel_store_entry *entries;
  if (keel__store_response_entries(&decoded, &entries) != KEEL_OK) abort();
  keel_store_entries_free(entries, decoded.entry_count);
  keel_buffer_free(&response);
  keel__store_kv_destroy(kv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  keel__store_request request;
  if (keel__store_request_decode(data, size, &request) == KEEL_OK)
    check_request(data, size, &request);
  keel__store_response response;
  if (keel__store_response_decode(data, size, &response) == KEEL_OK) {
    keel_store_entry *entries;
    if (keel__store_response_entries(&response, &entries) == KEEL_OK)
      keel_store_entries_free(entries, response.entry_count);
  }
  return 0;
}

size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity) {
  static const keel__store_request seeds[] = {
      {.op = KEEL__STORE_OP_PUT,
       .id = 1,
       .key = "proc/3",
       .key_length = 6,
       .value = (const uint8_t *)"pid=12 node=0",
       .value_length = 13,
       .lease = 1},
      {.op = KEEL__STORE_OP_CAS,
       .id = 2,
       .key = "decide/00000001",
       .key_length = 15,
       .value = (const uint8_t *)"0,1,3",
       .value_length = 5},
      {.op = KEEL__STORE_OP_GET, .id = 3, .key = "proc/1", .key_length = 6},
      {.op = KEEL__STORE_OP_LIST, .id = 4, .key = "agree/", .key_length = 6},
      {.op = KEEL__STORE_OP_WAIT,
       .id = 5,
       .key = "proc/",
       .key_length = 5,
       .revision = 2,
       .duration_ns = 1000000},
      {.op = KEEL__STORE_OP_DELETE, .id = 6, .key = "proc/1", .key_length = 6},
      {.op = KEEL__STORE_OP_LEASE_GRANT, .id = 7, .duration_ns = 1000000000},
      {.op = KEEL__STORE_OP_LEASE_KEEPALIVE, .id = 8, .lease = 1},
      {.op = KEEL__STORE_OP_LEASE_REVOKE, .id = 9, .lease = 1},
      {.op = KEEL__STORE_OP_LIST_PREFIXES,
       .id = 10,
       .value = (const uint8_t *)"dead/\0suspect/\0proc/\0",
       .value_length = 20},
  };
  if (index < 0 || (size_t)index >= sizeof seeds / sizeof seeds[0]) return 0;
  keel_buffer encoded;
  keel_buffer_init(&encoded, capacity);
  size_t length = 0;
  if (keel__store_request_encode(&seeds[index], &encoded) == KEEL_OK) {
    memcpy(buffer, encoded.data, encoded.length);
    length = encoded.length;
  }
  keel_buffer_free(&encoded);
  return length;
}
