/* Fuzz target for the parameter servers' wire format (src/ec/protocol.c): whatever a client
 * sends must be refused or decoded into a request that lies inside the payload, keeps every
 * limit and re-encodes to the same bytes. The same bytes also go through the client's reply
 * and configuration decoders. */
#include <stdlib.h>
#include <string.h>

#include "ec/protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity);

/* Small, so that random counts and indexes often land near the edges: k = 3, r = 2, 20 rows
 * of 2 floats in 8-byte blocks (7 groups), 3 dense floats in a 16-byte block. */
static const keel__ec_limits with_dense = {
    .dim = 2,
    .block_bytes = 8,
    .total_rows = 20,
    .groups = 7,
    .data_blocks = 3,
    .parity_blocks = 2,
    .dense_count = 3,
    .dense_block_bytes = 16,
    .max_count = 6,
};

static const keel__ec_limits without_dense = {
    .dim = 2,
    .block_bytes = 8,
    .total_rows = 20,
    .groups = 7,
    .data_blocks = 3,
    .parity_blocks = 2,
    .max_count = 6,
};

static bool inside(const void *pointer, size_t bytes, const uint8_t *payload, size_t size) {
  const uint8_t *start = pointer;
  return start >= payload && bytes <= size && (size_t)(start - payload) <= size - bytes;
}

/* What decoding promised: the arrays in the payload, each rule kept, one encoding. */
static void check_request(const uint8_t *payload, size_t size, const keel__ec_limits *limits,
                          const keel__ec_request *request) {
  uint32_t count = request->count;
  if (request->rows != NULL) {
    if (!inside(request->rows, (size_t)count * 8, payload, size)) abort();
    for (uint32_t i = 0; i < count; i++) {
      if (request->rows[i] >= limits->total_rows) abort();
      if (i > 0 && request->rows[i] <= request->rows[i - 1]) abort();
    }
  }
  if (request->refs != NULL) {
    if (count > limits->max_count || !inside(request->refs, (size_t)count * 16, payload, size))
      abort();
    for (uint32_t i = 0; i < count; i++) {
      if (request->refs[i].group >= limits->groups) abort();
      if (request->refs[i].member >= limits->data_blocks + limits->parity_blocks) abort();
    }
  }
  if (request->op == KEEL__EC_OP_PULL_DENSE && request->offset + count > limits->dense_count)
    abort();
  if (request->workers != 0 && request->worker >= request->workers) abort();
  if (keel__ec_request_bytes(request, limits) != size) abort();
  uint8_t *again = malloc(size);
  if (again == NULL) abort();
  if (keel__ec_request_encode(request, limits, again, size) != KEEL_OK) abort();
  if (memcmp(again, payload, size) != 0) abort();
  free(again);
  if (keel__ec_reply_body_bytes(request, limits) == SIZE_MAX) abort();
}

static void decode_request(const uint8_t *payload, size_t size, const keel__ec_limits *limits) {
  keel__ec_request request;
  keel_status status = keel__ec_request_decode(payload, size, limits, &request);
  if (status == KEEL_OK) {
    check_request(payload, size, limits, &request);
    return;
  }
  if (status != KEEL_EPROTO && status != KEEL_ERANGE) abort();
}

/* A reply decodes only as what its own header says, and the header re-encodes the same. */
static void decode_reply(const uint8_t *payload, size_t size) {
  if (size < KEEL__EC_REPLY_HEADER_BYTES) return;
  uint16_t op = keel_get_le16(payload);
  keel__ec_reply reply;
  keel_status status =
      keel__ec_reply_decode(payload, size, op, size - KEEL__EC_REPLY_HEADER_BYTES, &reply);
  if (status != KEEL_OK) {
    if (status != KEEL_EPROTO) abort();
    return;
  }
  if (reply.body_bytes != size - KEEL__EC_REPLY_HEADER_BYTES) abort();
  if (reply.status != KEEL_OK && reply.body_bytes != 0) abort();
  uint8_t header[KEEL__EC_REPLY_HEADER_BYTES];
  if (keel__ec_reply_encode_header(reply.op, reply.status, reply.body_bytes, header) != KEEL_OK)
    abort();
  if (memcmp(header, payload, sizeof header) != 0) abort();
}

/* A configuration that decodes re-encodes the same and gives limits. */
static void decode_config(const uint8_t *payload, size_t size) {
  keel__ec_config config;
  if (keel__ec_config_decode(payload, size, &config) != KEEL_OK) return;
  uint8_t again[KEEL__EC_CONFIG_BYTES];
  if (keel__ec_config_encode(&config, again) != KEEL_OK) abort();
  if (memcmp(again, payload, sizeof again) != 0) abort();
  keel__ec_limits limits;
  if (keel__ec_config_limits(&config, 1, &limits) != KEEL_OK) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* malloc's alignment, as the servers' receive buffers have; exactly size bytes, so that
   * AddressSanitizer sees any read past them. */
  uint8_t *payload = calloc(size + (size == 0), 1);
  if (payload == NULL) abort();
  if (size > 0) memcpy(payload, data, size);
  decode_request(payload, size, &with_dense);
  decode_request(payload, size, &without_dense);
  decode_reply(payload, size);
  decode_config(payload, size);
  free(payload);
  return 0;
}

size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity) {
  static const uint64_t rows[] = {0, 4, 19};
  static const keel__ec_ref blocks[] = {{0, 0, 0}, {6, 4, 0}, {3, 2, 0}};
  static const keel__ec_ref deltas[] = {{0, 0, 3}, {6, 2, 4}, {3, 1, 3}};
  static const float values[] = {1.5f, -2.0f, 0.25f, 0.0f, -0.0f, 3.0f};
  static const uint8_t bytes[24] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  static const uint32_t again_lost[] = {1, KEEL__EC_NO_SERVER, KEEL__EC_NO_SERVER};
  static const keel__ec_request seeds[] = {
      {.op = KEEL__EC_OP_INFO},
      {.op = KEEL__EC_OP_PULL_ROWS, .flags = KEEL__EC_FLAG_ACTING, .count = 3, .rows = rows},
      {.op = KEEL__EC_OP_PUSH_ROWS,
       .count = 3,
       .id = 9,
       .step = 12,
       .worker = 1,
       .workers = 2,
       .rows = rows,
       .values = values},
      {.op = KEEL__EC_OP_PUSH_ROWS,
       .flags = KEEL__EC_FLAG_ACTING,
       .count = 3,
       .id = 9,
       .step = 12,
       .worker = 1,
       .workers = 2,
       .routed = 0x0123456789abcdefu,
       .rows = rows,
       .values = values},
      {.op = KEEL__EC_OP_PUSH_ROWS,
       .flags = KEEL__EC_FLAG_ACTING | KEEL__EC_FLAG_AGAIN,
       .count = 3,
       .id = 9,
       .step = 12,
       .worker = 0,
       .workers = 2,
       .routed = 0xfedcba9876543210u,
       .again_lost = again_lost,
       .rows = rows,
       .values = values},
      {.op = KEEL__EC_OP_READ_BLOCKS, .count = 3, .refs = blocks},
      {.op = KEEL__EC_OP_WRITE_BLOCKS, .count = 3, .refs = blocks, .blocks = bytes},
      {.op = KEEL__EC_OP_PARITY_PREPARE,
       .flags = KEEL__EC_FLAG_APPLY_NOW,
       .count = 3,
       .id = 9,
       .refs = deltas,
       .blocks = bytes},
      {.op = KEEL__EC_OP_PARITY_COMMIT, .flags = KEEL__EC_FLAG_ABORT, .id = 9},
      {.op = KEEL__EC_OP_PULL_DENSE, .count = 2, .offset = 1},
      {.op = KEEL__EC_OP_PUSH_DENSE, .count = 3, .id = 4, .workers = 1, .values = values},
      {.op = KEEL__EC_OP_INIT_DENSE, .count = 3, .values = values},
      {.op = KEEL__EC_OP_READ_DENSE_BLOCK, .flags = KEEL__EC_FLAG_VERSIONED},
      {.op = KEEL__EC_OP_WRITE_DENSE_BLOCK, .step = 12, .blocks = bytes},
  };
  size_t request_seeds = sizeof seeds / sizeof seeds[0];
  if (index < 0) return 0;
  if ((size_t)index < request_seeds) {
    size_t length = keel__ec_request_bytes(&seeds[index], &with_dense);
    if (length == 0 || length > capacity) return 0;
    return keel__ec_request_encode(&seeds[index], &with_dense, buffer, capacity) == KEEL_OK ? length
                                                                                            : 0;
  }
  /* Then a configuration and an OK reply to a PULL_ROWS of one row. */
  if ((size_t)index == request_seeds && capacity >= KEEL__EC_CONFIG_BYTES) {
    keel__ec_config config = {
        .servers = 5,
        .data_blocks = 3,
        .parity_blocks = 2,
        .dim = 2,
        .optimizer_kind = KEEL_EC_ADAM,
        .learning_rate = 0.001f,
        .epsilon = 1e-8f,
        .beta1 = 0.9f,
        .beta2 = 0.999f,
        .total_rows = 20,
        .dense_count = 3,
        .seed = 7,
        .workers = 2,
        .options = KEEL__EC_OPTION_TWO_PHASE_COMMIT,
        .init_scale = 0.05f,
    };
    return keel__ec_config_encode(&config, buffer) == KEEL_OK ? KEEL__EC_CONFIG_BYTES : 0;
  }
  if ((size_t)index == request_seeds + 1 && capacity >= KEEL__EC_REPLY_HEADER_BYTES + 8) {
    if (keel__ec_reply_encode_header(KEEL__EC_OP_PULL_ROWS, KEEL_OK, 8, buffer) != KEEL_OK)
      return 0;
    memcpy(buffer + KEEL__EC_REPLY_HEADER_BYTES, values, 8);
    return KEEL__EC_REPLY_HEADER_BYTES + 8;
  }
  return 0;
}
