/* Unit tests of the parameter servers' wire format (src/ec/protocol.c): every op through the
 * codec and against an encoder written here from protocol.h's table; each decoder rule broken
 * alone, by a payload and by an encoder's caller; length arithmetic; replies; configuration. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ec/protocol.h"

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))
#define MAX_ITEMS 16
#define WIRE_MAX 4096

/* k = 3, r = 2 (groups of 5 members); 10 rows make 4 groups, the last one partial; rows of 3
 * floats in 16-byte blocks (SGD), 5 dense floats in a 24-byte block. */
static const keel__ec_limits limits = {
    .dim = 3,
    .block_bytes = 16,
    .total_rows = 10,
    .groups = 4,
    .data_blocks = 3,
    .parity_blocks = 2,
    .dense_count = 5,
    .dense_block_bytes = 24,
    .max_count = 8,
};

static keel__ec_limits without_dense(void) {
  keel__ec_limits other = limits;
  other.dense_count = 0;
  other.dense_block_bytes = 0;
  return other;
}

static const char *const op_names[] = {
    [KEEL__EC_OP_INFO] = "info",
    [KEEL__EC_OP_PULL_ROWS] = "pull rows",
    [KEEL__EC_OP_PUSH_ROWS] = "push rows",
    [KEEL__EC_OP_READ_BLOCKS] = "read blocks",
    [KEEL__EC_OP_WRITE_BLOCKS] = "write blocks",
    [KEEL__EC_OP_PARITY_PREPARE] = "parity prepare",
    [KEEL__EC_OP_PARITY_COMMIT] = "parity commit",
    [KEEL__EC_OP_PULL_DENSE] = "pull dense",
    [KEEL__EC_OP_PUSH_DENSE] = "push dense",
    [KEEL__EC_OP_INIT_DENSE] = "init dense",
    [KEEL__EC_OP_READ_DENSE_BLOCK] = "read dense block",
    [KEEL__EC_OP_WRITE_DENSE_BLOCK] = "write dense block",
};
#define FIRST_OP KEEL__EC_OP_INFO
#define LAST_OP KEEL__EC_OP_WRITE_DENSE_BLOCK

/* protocol.h's table, as this test reads it. */
static bool op_updates(uint16_t op) {
  return op == KEEL__EC_OP_PUSH_ROWS || op == KEEL__EC_OP_PARITY_PREPARE ||
         op == KEEL__EC_OP_PARITY_COMMIT || op == KEEL__EC_OP_PUSH_DENSE;
}
static bool op_has_flag(uint16_t op) {
  return op == KEEL__EC_OP_PULL_ROWS || op == KEEL__EC_OP_PUSH_ROWS ||
         op == KEEL__EC_OP_READ_BLOCKS || op == KEEL__EC_OP_PARITY_PREPARE ||
         op == KEEL__EC_OP_PARITY_COMMIT || op == KEEL__EC_OP_READ_DENSE_BLOCK;
}
static bool op_counts_items(uint16_t op) { return op >= 2 && op <= 6; }
static bool op_counts_nothing(uint16_t op) {
  return op == KEEL__EC_OP_INFO || op == KEEL__EC_OP_PARITY_COMMIT ||
         op == KEEL__EC_OP_READ_DENSE_BLOCK || op == KEEL__EC_OP_WRITE_DENSE_BLOCK;
}

/* ---- an encoder written from the table: field by field, without checks */

/* What a request's body holds: lead bytes (push: step, worker, workers, then with ACTING the
 * routed digest u64, then with AGAIN r lost servers u32 and zeros to 8 bytes; 8: offset, or
 * the step when step_alone), then rows, refs, f32 values and block bytes. */
typedef struct parts {
  size_t lead, rows, refs, floats, block_bytes, again_slots;
  bool step_alone, push, routed;
} parts;

static parts parts_of(const keel__ec_request *request, const keel__ec_limits *with) {
  size_t count = request->count;
  switch (request->op) {
    case KEEL__EC_OP_PULL_ROWS:
      return (parts){.lead = 8, .step_alone = true, .rows = count};
    case KEEL__EC_OP_PUSH_ROWS: {
      size_t slots = (request->flags & KEEL__EC_FLAG_AGAIN) ? with->parity_blocks : 0;
      bool routed = (request->flags & KEEL__EC_FLAG_ACTING) != 0;
      return (parts){.lead = 16 + (routed ? 8 : 0) + (slots * 4 + 7) / 8 * 8,
                     .push = true,
                     .routed = routed,
                     .again_slots = slots,
                     .rows = count,
                     .floats = count * with->dim};
    }
    case KEEL__EC_OP_READ_BLOCKS:
      return (parts){.refs = count};
    case KEEL__EC_OP_WRITE_BLOCKS:
    case KEEL__EC_OP_PARITY_PREPARE:
      return (parts){.refs = count, .block_bytes = count * with->block_bytes};
    case KEEL__EC_OP_PULL_DENSE:
      return (parts){.lead = 8};
    case KEEL__EC_OP_PUSH_DENSE:
      return (parts){.lead = 16, .push = true, .floats = count};
    case KEEL__EC_OP_INIT_DENSE:
      return (parts){.floats = count};
    case KEEL__EC_OP_WRITE_DENSE_BLOCK:
      return (parts){.lead = 8, .step_alone = true, .block_bytes = with->dense_block_bytes};
  }
  return (parts){0};
}

static size_t reference_bytes(const keel__ec_request *request, const keel__ec_limits *with) {
  parts p = parts_of(request, with);
  return 16 + p.lead + 8 * p.rows + 16 * p.refs + 4 * p.floats + p.block_bytes;
}

static size_t reference_encode(const keel__ec_request *request, const keel__ec_limits *with,
                               uint8_t *out) {
  parts p = parts_of(request, with);
  assert_true(reference_bytes(request, with) <= WIRE_MAX);
  keel_put_le16(out, request->op);
  keel_put_le16(out + 2, request->flags);
  keel_put_le32(out + 4, request->count);
  keel_put_le64(out + 8, request->id);
  size_t at = 16;
  if (p.push) {
    keel_put_le64(out + at, request->step);
    keel_put_le32(out + at + 8, request->worker);
    keel_put_le32(out + at + 12, request->workers);
    memset(out + at + 16, 0, p.lead - 16);
    size_t slots_at = at + 16;
    if (p.routed) {
      keel_put_le64(out + slots_at, request->routed);
      slots_at += 8;
    }
    for (size_t i = 0; i < p.again_slots; i++)
      keel_put_le32(out + slots_at + 4 * i, request->again_lost[i]);
  }
  if (p.lead == 8) keel_put_le64(out + at, p.step_alone ? request->step : request->offset);
  at += p.lead;
  for (size_t i = 0; i < p.rows; i++, at += 8) keel_put_le64(out + at, request->rows[i]);
  for (size_t i = 0; i < p.refs; i++, at += 16) {
    keel_put_le64(out + at, request->refs[i].group);
    keel_put_le32(out + at + 8, request->refs[i].member);
    keel_put_le32(out + at + 12, request->refs[i].other);
  }
  for (size_t i = 0; i < p.floats; i++, at += 4) {
    uint32_t bits;
    memcpy(&bits, &request->values[i], sizeof bits);
    keel_put_le32(out + at, bits);
  }
  if (p.block_bytes > 0) memcpy(out + at, request->blocks, p.block_bytes);
  return at + p.block_bytes;
}

/* ---- valid requests of every op, their arrays beside them */

typedef struct sample {
  keel__ec_request request;
  uint64_t rows[MAX_ITEMS];
  keel__ec_ref refs[MAX_ITEMS];
  float values[MAX_ITEMS * 3];
  uint8_t blocks[MAX_ITEMS * 24];
  uint32_t again_lost[4];
} sample;

/* A valid request of op with count items (rows, refs or PULL_DENSE's floats; other ops take
 * the count they must have), under the test's limits. */
static void sample_make(sample *s, uint16_t op, uint32_t count) {
  memset(s, 0, sizeof *s);
  bool deltas = op == KEEL__EC_OP_PARITY_PREPARE;
  for (uint32_t i = 0; i < MAX_ITEMS; i++) {
    s->rows[i] = i;
    s->refs[i] = (keel__ec_ref){
        .group = i % limits.groups,
        .member = deltas ? i % 3 : i % 5,
        .other = deltas ? 3 + i % 2 : 0,
    };
  }
  for (size_t i = 0; i < COUNT(s->values); i++) s->values[i] = (float)i * 0.75f - 4.0f;
  s->values[5] = NAN; /* the decoder passes values on bit for bit, whatever they are */
  s->values[6] = -0.0f;
  for (size_t i = 0; i < sizeof s->blocks; i++) s->blocks[i] = (uint8_t)(i * 37 + 11);
  if (op_counts_nothing(op)) count = 0;
  if (op == KEEL__EC_OP_PUSH_DENSE || op == KEEL__EC_OP_INIT_DENSE) count = limits.dense_count;
  s->request = (keel__ec_request){
      .op = op,
      .count = count,
      .id = op_updates(op) ? 0x1122334455667788u : 0,
      .rows = s->rows,
      .refs = s->refs,
      .values = s->values,
      .blocks = s->blocks,
  };
  s->again_lost[0] = 4;
  s->again_lost[1] = 1;
  s->again_lost[2] = s->again_lost[3] = KEEL__EC_NO_SERVER;
  if (op == KEEL__EC_OP_PUSH_ROWS) s->request.again_lost = s->again_lost;
  if (op == KEEL__EC_OP_PUSH_ROWS) s->request.routed = 0x8877665544332211u;
  if (op == KEEL__EC_OP_PUSH_ROWS || op == KEEL__EC_OP_PUSH_DENSE) {
    s->request.step = 1000;
    s->request.worker = 1;
    s->request.workers = 3;
  }
  if (op == KEEL__EC_OP_PULL_DENSE) s->request.offset = limits.dense_count - count;
  if (op == KEEL__EC_OP_WRITE_DENSE_BLOCK) s->request.step = 2000;
}

/* ---- checks */

static void fail_status(const char *what, keel_status status, keel_status expected) {
  fail_msg("%s: %s, expected %s", what, keel_status_name(status), keel_status_name(expected));
}

/* Decodes length bytes copied into a buffer of exactly that size, so that AddressSanitizer
 * sees any read past them; on refusal the output must be untouched. */
static void expect_decode(const char *what, const uint8_t *wire, size_t length,
                          const keel__ec_limits *with, keel_status expected) {
  uint8_t *payload = malloc(length + (length == 0));
  assert_non_null(payload);
  if (length > 0) memcpy(payload, wire, length);
  keel__ec_request request, before;
  memset(&request, 0xa5, sizeof request);
  memcpy(&before, &request, sizeof before);
  keel_status status = keel__ec_request_decode(payload, length, with, &request);
  free(payload);
  if (status != expected) fail_status(what, status, expected);
  if (status != KEEL_OK && memcmp(&request, &before, sizeof request) != 0)
    fail_msg("%s: refused but wrote the request", what);
}

/* The request breaks one rule: a server refuses its bytes and a client cannot make them, both
 * with the same status. */
static void expect_refused(const char *what, const keel__ec_request *request,
                           const keel__ec_limits *with, keel_status expected) {
  uint8_t wire[WIRE_MAX];
  size_t length = reference_encode(request, with, wire);
  expect_decode(what, wire, length, with, expected);
  uint8_t out[WIRE_MAX];
  keel_status status = keel__ec_request_encode(request, with, out, sizeof out);
  if (status != expected) fail_status(what, status, expected);
  if (keel__ec_request_bytes(request, with) != 0) fail_msg("%s: has a size", what);
}

/* The request is valid: both sides agree on its bytes. */
static void expect_accepted(const char *what, const keel__ec_request *request,
                            const keel__ec_limits *with) {
  uint8_t wire[WIRE_MAX], out[WIRE_MAX];
  size_t length = reference_encode(request, with, wire);
  expect_decode(what, wire, length, with, KEEL_OK);
  keel_status status = keel__ec_request_encode(request, with, out, sizeof out);
  if (status != KEEL_OK) fail_status(what, status, KEEL_OK);
  if (keel__ec_request_bytes(request, with) != length) fail_msg("%s: size differs", what);
  if (memcmp(out, wire, length) != 0) fail_msg("%s: bytes differ from the reference", what);
}

static void assert_decoded_equal(const keel__ec_request *decoded, const keel__ec_request *sent) {
  assert_int_equal(decoded->op, sent->op);
  assert_int_equal(decoded->flags, sent->flags);
  assert_int_equal(decoded->count, sent->count);
  assert_int_equal(decoded->id, sent->id);
  parts p = parts_of(sent, &limits);
  /* What the op does not carry comes back as zero and NULL. */
  assert_int_equal(decoded->step, p.push || p.step_alone ? sent->step : 0);
  assert_int_equal(decoded->worker, p.push ? sent->worker : 0);
  assert_int_equal(decoded->workers, p.push ? sent->workers : 0);
  assert_int_equal(decoded->routed, p.routed ? sent->routed : 0);
  assert_true((decoded->again_lost != NULL) == (p.again_slots > 0));
  if (p.again_slots > 0)
    assert_memory_equal(decoded->again_lost, sent->again_lost, 4 * p.again_slots);
  assert_int_equal(decoded->offset, p.lead == 8 && !p.step_alone ? sent->offset : 0);
  bool rows = sent->op == KEEL__EC_OP_PULL_ROWS || sent->op == KEEL__EC_OP_PUSH_ROWS;
  bool refs = sent->op >= KEEL__EC_OP_READ_BLOCKS && sent->op <= KEEL__EC_OP_PARITY_PREPARE;
  bool values = sent->op == KEEL__EC_OP_PUSH_ROWS || sent->op == KEEL__EC_OP_PUSH_DENSE ||
                sent->op == KEEL__EC_OP_INIT_DENSE;
  bool blocks = sent->op == KEEL__EC_OP_WRITE_BLOCKS || sent->op == KEEL__EC_OP_PARITY_PREPARE ||
                sent->op == KEEL__EC_OP_WRITE_DENSE_BLOCK;
  assert_true((decoded->rows != NULL) == rows);
  assert_true((decoded->refs != NULL) == refs);
  assert_true((decoded->values != NULL) == values);
  assert_true((decoded->blocks != NULL) == blocks);
  if (p.rows > 0) assert_memory_equal(decoded->rows, sent->rows, 8 * p.rows);
  if (p.refs > 0) assert_memory_equal(decoded->refs, sent->refs, 16 * p.refs);
  if (p.floats > 0) assert_memory_equal(decoded->values, sent->values, 4 * p.floats);
  if (p.block_bytes > 0) assert_memory_equal(decoded->blocks, sent->blocks, p.block_bytes);
}

/* Counts each op is tried with: none, one, the most, and between. */
static const uint32_t item_counts[] = {0, 1, 2, 8};

/* ---- requests */

static void round_trip(const keel__ec_request *request) {
  size_t bytes = keel__ec_request_bytes(request, &limits);
  assert_int_equal(bytes, reference_bytes(request, &limits));
  uint8_t *payload = malloc(bytes);
  assert_non_null(payload);
  assert_int_equal(keel__ec_request_encode(request, &limits, payload, bytes), KEEL_OK);
  uint8_t wire[WIRE_MAX];
  assert_int_equal(reference_encode(request, &limits, wire), bytes);
  assert_memory_equal(payload, wire, bytes);
  keel__ec_request decoded;
  assert_int_equal(keel__ec_request_decode(payload, bytes, &limits, &decoded), KEEL_OK);
  assert_decoded_equal(&decoded, request);
  /* One encoding per request: what decodes re-encodes to the same bytes. */
  assert_int_equal(keel__ec_request_encode(&decoded, &limits, wire, bytes), KEEL_OK);
  assert_memory_equal(wire, payload, bytes);
  free(payload);
}

static void test_round_trip_every_op(void **state) {
  (void)state;
  sample s;
  for (uint16_t op = FIRST_OP; op <= LAST_OP; op++) {
    for (size_t c = 0; c < COUNT(item_counts); c++) {
      if (op == KEEL__EC_OP_PULL_DENSE && item_counts[c] > limits.dense_count) continue;
      sample_make(&s, op, item_counts[c]);
      if (op_has_flag(op)) s.request.flags = (uint16_t)(c % 2);
      print_message("%s, count %u\n", op_names[op], s.request.count);
      round_trip(&s.request);
    }
  }
  /* Fields the op does not carry are ignored by the encoder. */
  sample_make(&s, KEEL__EC_OP_PULL_ROWS, 2);
  s.request.offset = 9;
  s.request.worker = 9;
  s.request.workers = 9;
  assert_int_equal(keel__ec_request_bytes(&s.request, &limits), 16 + 8 + 16);
  /* PULL_DENSE reaches every dense float, and wants none at the end. */
  sample_make(&s, KEEL__EC_OP_PULL_DENSE, 0);
  expect_accepted("pull no dense floats at the end", &s.request, &limits);
  s.request.count = (uint32_t)limits.dense_count;
  s.request.offset = 0;
  expect_accepted("pull every dense float", &s.request, &limits);
}

static void test_every_truncation_and_extension(void **state) {
  (void)state;
  sample s;
  for (uint16_t op = FIRST_OP; op <= LAST_OP; op++) {
    sample_make(&s, op, 3);
    uint8_t wire[WIRE_MAX + 1];
    size_t length = reference_encode(&s.request, &limits, wire);
    char what[80];
    for (size_t cut = 0; cut < length; cut++) {
      snprintf(what, sizeof what, "%s cut to %zu of %zu bytes", op_names[op], cut, length);
      expect_decode(what, wire, cut, &limits, KEEL_EPROTO);
    }
    expect_decode(op_names[op], wire, length, &limits, KEEL_OK);
    for (size_t extra = 1; extra <= 8; extra++) {
      memset(wire + length, 0, extra);
      snprintf(what, sizeof what, "%s with %zu more bytes", op_names[op], extra);
      expect_decode(what, wire, length + extra, &limits, KEEL_EPROTO);
    }
  }
}

static void test_op_flags_and_id(void **state) {
  (void)state;
  sample s;
  static const uint16_t unknown_ops[] = {0, LAST_OP + 1, 0x100, 0xffff};
  for (size_t i = 0; i < COUNT(unknown_ops); i++) {
    sample_make(&s, KEEL__EC_OP_INFO, 0);
    s.request.op = unknown_ops[i];
    expect_refused("unknown op", &s.request, &limits, KEEL_EPROTO);
  }
  char what[80];
  for (uint16_t op = FIRST_OP; op <= LAST_OP; op++) {
    int first_undefined = op == KEEL__EC_OP_PARITY_COMMIT ? 3 : op_has_flag(op) ? 1 : 0;
    for (int bit = first_undefined; bit < 16; bit++) {
      sample_make(&s, op, 2);
      s.request.flags = (uint16_t)(1u << bit);
      snprintf(what, sizeof what, "%s with flag bit %d", op_names[op], bit);
      expect_refused(what, &s.request, &limits, KEEL_EPROTO);
    }
    sample_make(&s, op, 2);
    s.request.id = op_updates(op) ? 0 : 1;
    snprintf(what, sizeof what, "%s with id %s", op_names[op], op_updates(op) ? "0" : "1");
    expect_refused(what, &s.request, &limits, KEEL_EPROTO);
    s.request.id = op_updates(op) ? UINT64_MAX : 0;
    snprintf(what, sizeof what, "%s with a good id", op_names[op]);
    expect_accepted(what, &s.request, &limits);
    if (op == KEEL__EC_OP_PARITY_COMMIT) {
      s.request.flags = KEEL__EC_FLAG_QUERY;
      expect_accepted("parity commit's query", &s.request, &limits);
      s.request.flags = KEEL__EC_FLAG_VERDICT | KEEL__EC_FLAG_ABORT;
      expect_accepted("parity commit's verdict", &s.request, &limits);
    }
  }
}

/* A phase-2 push says which lost servers it was routed around (finding 53): the digest of
 * one set is always the same, and the sets a job meets differ. */
static void test_routed_digest(void **state) {
  (void)state;
  bool sets[4][6] = {{0}, {[3] = true}, {[3] = true, [4] = true}, {[4] = true}};
  for (int a = 0; a < 4; a++) {
    assert_int_equal(keel__ec_routed_digest(sets[a], 6), keel__ec_routed_digest(sets[a], 6));
    for (int b = a + 1; b < 4; b++)
      assert_int_not_equal(keel__ec_routed_digest(sets[a], 6), keel__ec_routed_digest(sets[b], 6));
  }
  /* Servers past the set's count are not read. */
  assert_int_equal(keel__ec_routed_digest(sets[2], 4), keel__ec_routed_digest(sets[1], 4));
}

/* A second round of phase 2 (ACTING | AGAIN) names the servers its first round lost: r slots,
 * zeros after them to 8 bytes; the used slots first (maybe none), each a server index. */
static void test_again_lost(void **state) {
  (void)state;
  const uint16_t again = KEEL__EC_FLAG_ACTING | KEEL__EC_FLAG_AGAIN;
  keel__ec_limits odd = limits;
  odd.parity_blocks = 3; /* 12 bytes of slots, 4 of padding */
  const keel__ec_limits *withs[] = {&limits, &odd};
  sample s;
  for (size_t w = 0; w < COUNT(withs); w++) {
    const keel__ec_limits *with = withs[w];
    for (size_t c = 0; c < COUNT(item_counts); c++) {
      sample_make(&s, KEEL__EC_OP_PUSH_ROWS, item_counts[c]);
      s.request.flags = again;
      expect_accepted("a second round", &s.request, with);
    }
    sample_make(&s, KEEL__EC_OP_PUSH_ROWS, 2);
    s.request.flags = again;
    s.again_lost[1] = KEEL__EC_NO_SERVER;
    expect_accepted("a second round that lost one server", &s.request, with);
    s.again_lost[0] = KEEL__EC_NO_SERVER;
    expect_accepted("a second round that names none", &s.request, with);
    s.again_lost[0] = 2;
    s.again_lost[1] = KEEL__EC_NO_SERVER;
    s.again_lost[2] = 3;
    if (with->parity_blocks == 3)
      expect_refused("a used slot after an unused one", &s.request, with, KEEL_EPROTO);
    s.again_lost[1] = 1u << 30;
    s.again_lost[2] = KEEL__EC_NO_SERVER;
    expect_refused("a server past the limit", &s.request, with, KEEL_ERANGE);
    s.again_lost[1] = (1u << 30) - 1;
    expect_accepted("the last server the limit allows", &s.request, with);
    s.request.again_lost = NULL;
    uint8_t out[WIRE_MAX];
    assert_int_equal(keel__ec_request_encode(&s.request, with, out, sizeof out), KEEL_EINVAL);
  }
  /* Padding that is not zero: one encoding per request. */
  sample_make(&s, KEEL__EC_OP_PUSH_ROWS, 1);
  s.request.flags = again;
  uint8_t wire[WIRE_MAX];
  size_t length = reference_encode(&s.request, &odd, wire);
  expect_decode("zero padding", wire, length, &odd, KEEL_OK);
  wire[16 + 16 + 8 + 12] = 1; /* header, push fields, routed, 3 slots */
  expect_decode("padding not zero", wire, length, &odd, KEEL_EPROTO);
  /* AGAIN only in phase 2. */
  s.request.flags = KEEL__EC_FLAG_AGAIN;
  expect_refused("a second round of own rows", &s.request, &limits, KEEL_EPROTO);
}

static void test_counts(void **state) {
  (void)state;
  sample s;
  char what[80];
  for (uint16_t op = FIRST_OP; op <= LAST_OP; op++) {
    sample_make(&s, op, 2);
    if (op_counts_nothing(op)) {
      s.request.count = 1;
      snprintf(what, sizeof what, "%s with count 1", op_names[op]);
      expect_refused(what, &s.request, &limits, KEEL_EPROTO);
    }
    if (op_counts_items(op)) {
      s.request.count = limits.max_count;
      snprintf(what, sizeof what, "%s with max_count items", op_names[op]);
      expect_accepted(what, &s.request, &limits);
      s.request.count = limits.max_count + 1;
      snprintf(what, sizeof what, "%s with one item too many", op_names[op]);
      expect_refused(what, &s.request, &limits, KEEL_ERANGE);
    }
    if (op == KEEL__EC_OP_PUSH_DENSE || op == KEEL__EC_OP_INIT_DENSE) {
      for (int delta = -1; delta <= 1; delta += 2) {
        s.request.count = (uint32_t)((int)limits.dense_count + delta);
        snprintf(what, sizeof what, "%s with %u floats", op_names[op], s.request.count);
        expect_refused(what, &s.request, &limits, KEEL_ERANGE);
      }
    }
  }
  /* A limit of one item: two are too many, one is fine. */
  keel__ec_limits one = limits;
  one.max_count = 1;
  sample_make(&s, KEEL__EC_OP_PULL_ROWS, 1);
  expect_accepted("one row under max_count 1", &s.request, &one);
  s.request.count = 2;
  expect_refused("two rows over max_count 1", &s.request, &one, KEEL_ERANGE);
}

static void test_rows(void **state) {
  (void)state;
  static const uint16_t ops[] = {KEEL__EC_OP_PULL_ROWS, KEEL__EC_OP_PUSH_ROWS};
  sample s;
  for (size_t i = 0; i < COUNT(ops); i++) {
    sample_make(&s, ops[i], 3);
    s.rows[0] = 4;
    s.rows[1] = 5;
    s.rows[2] = limits.total_rows - 1;
    expect_accepted("the last row", &s.request, &limits);
    s.rows[2] = limits.total_rows;
    expect_refused("a row past the last", &s.request, &limits, KEEL_ERANGE);
    s.rows[2] = UINT64_MAX;
    expect_refused("row UINT64_MAX", &s.request, &limits, KEEL_ERANGE);
    s.rows[2] = 5;
    expect_refused("a row twice", &s.request, &limits, KEEL_EPROTO);
    s.rows[2] = 3;
    expect_refused("rows decreasing at the end", &s.request, &limits, KEEL_EPROTO);
    s.rows[0] = 6;
    s.rows[2] = 7;
    expect_refused("rows decreasing at the start", &s.request, &limits, KEEL_EPROTO);
    s.rows[0] = 0;
    s.rows[1] = 0;
    expect_refused("row 0 twice", &s.request, &limits, KEEL_EPROTO);
  }
}

static void test_refs(void **state) {
  (void)state;
  static const uint16_t block_ops[] = {KEEL__EC_OP_READ_BLOCKS, KEEL__EC_OP_WRITE_BLOCKS};
  sample s;
  for (size_t i = 0; i < COUNT(block_ops); i++) {
    sample_make(&s, block_ops[i], 3);
    s.refs[1] = (keel__ec_ref){.group = limits.groups - 1, .member = 4};
    expect_accepted("the last member of the last group", &s.request, &limits);
    s.refs[1].group = limits.groups;
    expect_refused("a group past the last", &s.request, &limits, KEEL_ERANGE);
    s.refs[1].group = UINT64_MAX;
    expect_refused("group UINT64_MAX", &s.request, &limits, KEEL_ERANGE);
    s.refs[1].group = 0;
    s.refs[1].member = 5;
    expect_refused("member k + r", &s.request, &limits, KEEL_ERANGE);
    s.refs[1].member = UINT32_MAX;
    expect_refused("member UINT32_MAX", &s.request, &limits, KEEL_ERANGE);
    s.refs[1].member = 0;
    s.refs[1].other = 1;
    expect_refused("a block ref's zero field", &s.request, &limits, KEEL_EPROTO);
    s.refs[1].other = 0x80000000u;
    expect_refused("a block ref's zero field, high bit", &s.request, &limits, KEEL_EPROTO);
  }
  sample_make(&s, KEEL__EC_OP_PARITY_PREPARE, 3);
  s.refs[2] = (keel__ec_ref){.group = limits.groups - 1, .member = 2, .other = 4};
  expect_accepted("delta of the last data member to the last parity", &s.request, &limits);
  s.refs[2] = (keel__ec_ref){.group = 1, .member = 0, .other = 3};
  expect_accepted("delta of the first data member to the first parity", &s.request, &limits);
  s.refs[2].member = 3;
  expect_refused("delta of a parity member", &s.request, &limits, KEEL_ERANGE);
  s.refs[2].member = 0;
  s.refs[2].other = 2;
  expect_refused("delta to another data member", &s.request, &limits, KEEL_ERANGE);
  s.refs[2].other = 0;
  expect_accepted("delta to the data member itself", &s.request, &limits);
  s.refs[2].other = 5;
  expect_refused("delta to member k + r", &s.request, &limits, KEEL_ERANGE);
  s.refs[2].other = UINT32_MAX;
  expect_refused("delta to member UINT32_MAX", &s.request, &limits, KEEL_ERANGE);
  s.refs[2].other = 3;
  s.refs[2].group = limits.groups;
  expect_refused("delta of a group past the last", &s.request, &limits, KEEL_ERANGE);
  /* A delta ref is not a block ref: parity member 3 in a block op's zero field is refused. */
  sample_make(&s, KEEL__EC_OP_WRITE_BLOCKS, 1);
  s.refs[0] = (keel__ec_ref){.group = 0, .member = 0, .other = 3};
  expect_refused("a delta ref in write blocks", &s.request, &limits, KEEL_EPROTO);
}

static void test_workers(void **state) {
  (void)state;
  static const uint16_t ops[] = {KEEL__EC_OP_PUSH_ROWS, KEEL__EC_OP_PUSH_DENSE};
  sample s;
  for (size_t i = 0; i < COUNT(ops); i++) {
    sample_make(&s, ops[i], 2);
    s.request.worker = 0;
    s.request.workers = 1;
    expect_accepted("the one worker", &s.request, &limits);
    s.request.worker = UINT32_MAX - 1;
    s.request.workers = UINT32_MAX;
    expect_accepted("the last of UINT32_MAX workers", &s.request, &limits);
    s.request.worker = UINT32_MAX;
    expect_refused("worker UINT32_MAX", &s.request, &limits, KEEL_ERANGE);
    s.request.worker = 3;
    s.request.workers = 3;
    expect_refused("worker == workers", &s.request, &limits, KEEL_ERANGE);
    s.request.worker = 0;
    s.request.workers = 0;
    expect_refused("no workers", &s.request, &limits, KEEL_ERANGE);
    s.request.workers = 2;
    s.request.step = UINT64_MAX;
    expect_accepted("any step", &s.request, &limits);
  }
}

static void test_dense_ranges(void **state) {
  (void)state;
  sample s;
  sample_make(&s, KEEL__EC_OP_PULL_DENSE, 2);
  s.request.offset = limits.dense_count - 1;
  expect_refused("pull one past the end", &s.request, &limits, KEEL_ERANGE);
  s.request.offset = UINT64_MAX - 1;
  expect_refused("offset UINT64_MAX - 1", &s.request, &limits, KEEL_ERANGE);
  s.request.offset = UINT64_MAX;
  expect_refused("offset UINT64_MAX", &s.request, &limits, KEEL_ERANGE);
  s.request.count = 0;
  s.request.offset = limits.dense_count + 1;
  expect_refused("nothing from past the end", &s.request, &limits, KEEL_ERANGE);
  s.request.count = (uint32_t)limits.dense_count + 1;
  s.request.offset = 0;
  expect_refused("more floats than there are", &s.request, &limits, KEEL_ERANGE);
  s.request.count = UINT32_MAX;
  expect_refused("UINT32_MAX floats", &s.request, &limits, KEEL_ERANGE);

  /* Without dense parameters every dense op is refused, even one that carries nothing. */
  keel__ec_limits none = without_dense();
  char what[80];
  for (uint16_t op = KEEL__EC_OP_PULL_DENSE; op <= LAST_OP; op++) {
    sample_make(&s, op, 0);
    s.request.count = 0;
    s.request.offset = 0;
    snprintf(what, sizeof what, "%s without dense parameters", op_names[op]);
    expect_refused(what, &s.request, &none, KEEL_ERANGE);
  }
  sample_make(&s, KEEL__EC_OP_PULL_ROWS, 2);
  expect_accepted("rows without dense parameters", &s.request, &none);
}

static void test_misaligned_and_bad_arguments(void **state) {
  (void)state;
  sample s;
  sample_make(&s, KEEL__EC_OP_PUSH_ROWS, 2);
  size_t length = keel__ec_request_bytes(&s.request, &limits);
  uint8_t *buffer = malloc(length + 8);
  assert_non_null(buffer);
  keel__ec_request decoded;
  for (size_t shift = 0; shift <= 8; shift++) {
    assert_int_equal(keel__ec_request_encode(&s.request, &limits, buffer + shift, length), KEEL_OK);
    keel_status expected = shift % 8 == 0 ? KEEL_OK : KEEL_EINVAL;
    assert_int_equal(keel__ec_request_decode(buffer + shift, length, &limits, &decoded), expected);
  }
  assert_int_equal(keel__ec_request_decode(NULL, length, &limits, &decoded), KEEL_EINVAL);
  assert_int_equal(keel__ec_request_decode(buffer, length, NULL, &decoded), KEEL_EINVAL);
  assert_int_equal(keel__ec_request_decode(buffer, length, &limits, NULL), KEEL_EINVAL);
  keel__ec_limits bad = limits;
  bad.groups = 5;
  assert_int_equal(keel__ec_request_decode(buffer, length, &bad, &decoded), KEEL_EINVAL);
  assert_int_equal(keel__ec_request_encode(&s.request, &bad, buffer, length), KEEL_EINVAL);
  assert_int_equal(keel__ec_request_bytes(&s.request, &bad), 0);

  /* The encoder: too small a buffer is refused before a byte is written. */
  memset(buffer, 0x77, length + 8);
  assert_int_equal(keel__ec_request_encode(&s.request, &limits, buffer, length - 1), KEEL_EINVAL);
  for (size_t i = 0; i < length + 8; i++) assert_int_equal(buffer[i], 0x77);
  assert_int_equal(keel__ec_request_encode(&s.request, &limits, NULL, length), KEEL_EINVAL);
  assert_int_equal(keel__ec_request_encode(NULL, &limits, buffer, length), KEEL_EINVAL);
  assert_int_equal(keel__ec_request_bytes(NULL, &limits), 0);
  /* An array the op needs cannot be NULL, unless it is empty. */
  s.request.values = NULL;
  assert_int_equal(keel__ec_request_encode(&s.request, &limits, buffer, length), KEEL_EINVAL);
  assert_int_equal(keel__ec_request_bytes(&s.request, &limits), 0);
  s.request = (keel__ec_request){.op = KEEL__EC_OP_PULL_ROWS};
  assert_int_equal(keel__ec_request_bytes(&s.request, &limits), 24); /* the header and a step */
  free(buffer);
}

/* Limits at their largest: no length may wrap, and a header announcing more than the payload
 * holds is refused by its length before anything past it is read. */
static void test_size_arithmetic(void **state) {
  (void)state;
  keel__ec_limits huge = {
      .dim = KEEL_EC_ROW_MAX_DIM,
      .block_bytes = (uint64_t)1 << 30,
      .total_rows = UINT64_MAX,
      .groups = UINT64_MAX,
      .data_blocks = 1,
      .parity_blocks = 1,
      .dense_count = KEEL_EC_ROW_MAX_DIM,
      .dense_block_bytes = (uint64_t)KEEL_EC_ROW_MAX_DIM * 4,
      .max_count = UINT32_MAX,
  };
  assert_int_equal(keel__ec_limits_check(&huge), KEEL_OK);
  uint8_t wire[1024] = {0};
  char what[80];
  for (uint16_t op = KEEL__EC_OP_PULL_ROWS; op <= KEEL__EC_OP_PARITY_PREPARE; op++) {
    keel__ec_request request = {.op = op, .count = UINT32_MAX, .id = op_updates(op) ? 1 : 0};
    reference_encode(&(keel__ec_request){.op = op}, &huge, wire);
    keel_put_le32(wire + 4, UINT32_MAX);
    keel_put_le64(wire + 8, request.id);
    for (size_t length = 16; length <= sizeof wire; length += 8) {
      snprintf(what, sizeof what, "%s of UINT32_MAX items in %zu bytes", op_names[op], length);
      expect_decode(what, wire, length, &huge, KEEL_EPROTO);
    }
  }
  /* Lengths that a 32-bit computation would wrap to exactly the bytes present: PUSH_ROWS of
   * 2^30 rows of 2^24 floats is 32 + 2^33 + 2^56 bytes, 32 mod 2^32; WRITE_BLOCKS of 16
   * blocks of 2^30 bytes is 16 + 256 + 2^34 bytes, 272 mod 2^32. */
  memset(wire, 0, sizeof wire);
  keel_put_le16(wire, KEEL__EC_OP_PUSH_ROWS);
  keel_put_le32(wire + 4, 1u << 30);
  keel_put_le64(wire + 8, 1);
  keel_put_le32(wire + 28, 1); /* workers */
  expect_decode("push rows wrapping to 32 bytes", wire, 32, &huge, KEEL_EPROTO);
  memset(wire, 0, sizeof wire);
  keel_put_le16(wire, KEEL__EC_OP_WRITE_BLOCKS);
  keel_put_le32(wire + 4, 16);
  expect_decode("write blocks wrapping to 272 bytes", wire, 272, &huge, KEEL_EPROTO);
  /* Valid headers and arrays whose values or blocks alone are 2^32 bytes, 0 in 32 bits:
   * 64 rows of 2^24 floats, 4 blocks of 2^30 bytes; the payload stops after the arrays. */
  memset(wire, 0, sizeof wire);
  keel_put_le16(wire, KEEL__EC_OP_PUSH_ROWS);
  keel_put_le32(wire + 4, 64);
  keel_put_le64(wire + 8, 1);
  keel_put_le32(wire + 28, 1);
  for (uint64_t i = 0; i < 64; i++) keel_put_le64(wire + 32 + 8 * i, i);
  expect_decode("push rows without their 2^32 bytes of values", wire, 32 + 8 * 64, &huge,
                KEEL_EPROTO);
  memset(wire, 0, sizeof wire);
  keel_put_le16(wire, KEEL__EC_OP_WRITE_BLOCKS);
  keel_put_le32(wire + 4, 4);
  for (uint64_t i = 0; i < 4; i++) keel_put_le64(wire + 16 + 16 * i, i);
  expect_decode("write blocks without their 2^32 bytes", wire, 16 + 16 * 4, &huge, KEEL_EPROTO);

  /* The reply sizes: exact when they fit, SIZE_MAX (which no reply matches) when not. */
  keel__ec_request pull = {.op = KEEL__EC_OP_PULL_ROWS, .count = UINT32_MAX};
  assert_int_equal(keel__ec_reply_body_bytes(&pull, &huge),
                   (uint64_t)UINT32_MAX * KEEL_EC_ROW_MAX_DIM * 4);
  keel__ec_request read = {.op = KEEL__EC_OP_READ_BLOCKS, .count = UINT32_MAX};
  assert_int_equal(keel__ec_reply_body_bytes(&read, &huge), (uint64_t)UINT32_MAX << 30);
  keel__ec_limits wrapping = huge;
  wrapping.dim = UINT32_MAX;
  wrapping.block_bytes = UINT64_MAX / 2;
  assert_int_equal(keel__ec_reply_body_bytes(&pull, &wrapping), SIZE_MAX);
  read.count = 3;
  assert_int_equal(keel__ec_reply_body_bytes(&read, &wrapping), SIZE_MAX);
  assert_int_equal(keel__ec_reply_body_bytes(NULL, &huge), SIZE_MAX);
}

static void test_limits_check(void **state) {
  (void)state;
  assert_int_equal(keel__ec_limits_check(&limits), KEEL_OK);
  keel__ec_limits none = without_dense();
  assert_int_equal(keel__ec_limits_check(&none), KEEL_OK);
  assert_int_equal(keel__ec_limits_check(NULL), KEEL_EINVAL);
  static const struct {
    const char *what;
    size_t field;
    uint64_t value;
    int width;
  } breaks[] = {
#define FIELD(name, value) \
  offsetof(keel__ec_limits, name), value, sizeof(((keel__ec_limits *)0)->name)
      {"dim 0", FIELD(dim, 0)},
      {"dim past the maximum", FIELD(dim, KEEL_EC_ROW_MAX_DIM + 1)},
      {"block bytes not a multiple of 8", FIELD(block_bytes, 20)},
      {"block bytes under the row", FIELD(block_bytes, 8)},
      {"block bytes 2^31", FIELD(block_bytes, (uint64_t)1 << 31)},
      {"no rows", FIELD(total_rows, 0)},
      {"groups too few", FIELD(groups, 3)},
      {"groups too many", FIELD(groups, 5)},
      {"k 0", FIELD(data_blocks, 0)},
      {"r 0", FIELD(parity_blocks, 0)},
      {"k + r past the maximum", FIELD(parity_blocks, KEEL_EC_MAX_BLOCKS - 2)},
      {"r huge", FIELD(parity_blocks, UINT32_MAX)},
      {"dense count past the maximum", FIELD(dense_count, KEEL_EC_ROW_MAX_DIM + 1)},
      {"dense block under the floats", FIELD(dense_block_bytes, 16)},
      {"dense block not a multiple of 8", FIELD(dense_block_bytes, 28)},
      {"no dense block", FIELD(dense_block_bytes, 0)},
      {"max count 0", FIELD(max_count, 0)},
#undef FIELD
  };
  for (size_t i = 0; i < COUNT(breaks); i++) {
    keel__ec_limits bad = limits;
    uint8_t *field = (uint8_t *)&bad + breaks[i].field;
    if (breaks[i].width == 4) {
      uint32_t value = (uint32_t)breaks[i].value;
      memcpy(field, &value, 4);
    } else {
      memcpy(field, &breaks[i].value, 8);
    }
    if (keel__ec_limits_check(&bad) != KEEL_EINVAL) fail_msg("%s: accepted", breaks[i].what);
  }
  /* A dense block without dense parameters. */
  none.dense_block_bytes = 8;
  assert_int_equal(keel__ec_limits_check(&none), KEEL_EINVAL);
  /* The largest code. */
  keel__ec_limits widest = limits;
  widest.data_blocks = KEEL_EC_MAX_BLOCKS - 1;
  widest.parity_blocks = 1;
  widest.groups = 1;
  assert_int_equal(keel__ec_limits_check(&widest), KEEL_OK);
}

/* ---- replies */

static void test_reply_round_trip(void **state) {
  (void)state;
  uint8_t payload[16 + 12];
  for (size_t i = 16; i < sizeof payload; i++) payload[i] = (uint8_t)i;
  assert_int_equal(keel__ec_reply_encode_header(KEEL__EC_OP_PULL_ROWS, KEEL_OK, 12, payload),
                   KEEL_OK);
  keel__ec_reply reply;
  assert_int_equal(
      keel__ec_reply_decode(payload, sizeof payload, KEEL__EC_OP_PULL_ROWS, 12, &reply), KEEL_OK);
  assert_int_equal(reply.op, KEEL__EC_OP_PULL_ROWS);
  assert_int_equal(reply.status, KEEL_OK);
  assert_int_equal(reply.body_bytes, 12);
  assert_ptr_equal(reply.body, payload + 16);
  /* The bytes, as protocol.h lays them out. */
  static const uint8_t header[16] = {2, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0};
  assert_memory_equal(payload, header, 16);

  /* An error has no body, whatever the request expected; any alignment is fine. */
  uint8_t *odd = malloc(17);
  assert_non_null(odd);
  assert_int_equal(keel__ec_reply_encode_header(7, KEEL_ENOTFOUND, 0, odd + 1), KEEL_OK);
  assert_int_equal(keel_get_le32(odd + 5), (uint32_t)-11);
  assert_int_equal(keel__ec_reply_decode(odd + 1, 16, 7, 4096, &reply), KEEL_OK);
  assert_int_equal(reply.status, KEEL_ENOTFOUND);
  assert_int_equal(reply.body_bytes, 0);
  /* An op the server did not know is echoed as it came. */
  assert_int_equal(keel__ec_reply_encode_header(0xbeef, KEEL_EPROTO, 0, odd + 1), KEEL_OK);
  assert_int_equal(keel__ec_reply_decode(odd + 1, 16, 0xbeef, 0, &reply), KEEL_OK);
  assert_int_equal(reply.status, KEEL_EPROTO);
  free(odd);

  /* Every status of the table travels. */
  uint8_t bare[16];
  for (int status = 0; status >= KEEL_EPEERLOST; status--) {
    assert_int_equal(keel__ec_reply_encode_header(3, (keel_status)status, 0, bare), KEEL_OK);
    assert_int_equal(keel__ec_reply_decode(bare, 16, 3, 0, &reply), KEEL_OK);
    assert_int_equal(reply.status, status);
  }
}

static void expect_reply_refused(const char *what, const uint8_t *wire, size_t length,
                                 uint16_t expected_op, size_t expected_body_bytes) {
  uint8_t *payload = malloc(length + (length == 0));
  assert_non_null(payload);
  if (length > 0) memcpy(payload, wire, length);
  keel__ec_reply reply, before;
  memset(&reply, 0xa5, sizeof reply);
  memcpy(&before, &reply, sizeof before);
  keel_status status =
      keel__ec_reply_decode(payload, length, expected_op, expected_body_bytes, &reply);
  free(payload);
  if (status != KEEL_EPROTO) fail_status(what, status, KEEL_EPROTO);
  if (memcmp(&reply, &before, sizeof reply) != 0) fail_msg("%s: refused but wrote", what);
}

static void test_reply_refusals(void **state) {
  (void)state;
  uint8_t wire[16 + 8] = {0};
  assert_int_equal(keel__ec_reply_encode_header(KEEL__EC_OP_PULL_DENSE, KEEL_OK, 8, wire), KEEL_OK);
  for (size_t cut = 0; cut < 16; cut++) expect_reply_refused("short header", wire, cut, 8, 8);
  expect_reply_refused("body cut short", wire, 23, 8, 8);
  expect_reply_refused("another op", wire, sizeof wire, 9, 8);
  expect_reply_refused("body not what the request implies", wire, sizeof wire, 8, 4);
  expect_reply_refused("body not what the request implies", wire, sizeof wire, 8, 12);
  uint8_t longer[16 + 9] = {0};
  memcpy(longer, wire, sizeof wire);
  expect_reply_refused("a byte past the body", longer, sizeof longer, 8, 8);
  keel_put_le64(longer + 8, 9);
  expect_reply_refused("body longer than the request implies", longer, sizeof longer, 8, 8);
  uint8_t bad[16 + 8];
  memcpy(bad, wire, sizeof wire);
  keel_put_le16(bad + 2, 1);
  expect_reply_refused("flags", bad, sizeof bad, 8, 8);
  memcpy(bad, wire, sizeof wire);
  keel_put_le64(bad + 8, UINT64_MAX);
  expect_reply_refused("body bytes UINT64_MAX", bad, sizeof bad, 8, SIZE_MAX);
  keel_put_le64(bad + 8, UINT64_MAX - 15);
  expect_reply_refused("body bytes wrapping with the header", bad, sizeof bad, 8, SIZE_MAX);
  static const int32_t unknown[] = {1, KEEL_EPEERLOST - 1, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < COUNT(unknown); i++) {
    memcpy(bad, wire, sizeof wire);
    keel_put_le32(bad + 4, (uint32_t)unknown[i]);
    keel_put_le64(bad + 8, 0);
    expect_reply_refused("unknown status", bad, 16, 8, 0);
  }
  /* An error with a body. */
  memcpy(bad, wire, sizeof wire);
  keel_put_le32(bad + 4, (uint32_t)KEEL_EIO);
  expect_reply_refused("an error with a body", bad, sizeof bad, 8, 8);

  keel__ec_reply reply;
  assert_int_equal(keel__ec_reply_decode(NULL, 16, 8, 0, &reply), KEEL_EINVAL);
  assert_int_equal(keel__ec_reply_decode(wire, sizeof wire, 8, 8, NULL), KEEL_EINVAL);
  assert_int_equal(keel__ec_reply_encode_header(1, KEEL_EIO, 1, wire), KEEL_EINVAL);
  assert_int_equal(keel__ec_reply_encode_header(1, (keel_status)1, 0, wire), KEEL_EINVAL);
  assert_int_equal(keel__ec_reply_encode_header(1, (keel_status)-100, 0, wire), KEEL_EINVAL);
  assert_int_equal(keel__ec_reply_encode_header(1, KEEL_OK, 0, NULL), KEEL_EINVAL);
}

static void test_reply_body_bytes(void **state) {
  (void)state;
  static const struct {
    uint32_t op;
    uint32_t count;
    size_t bytes;
  } cases[] = {
      {KEEL__EC_OP_INFO, 0, KEEL__EC_CONFIG_BYTES},
      {KEEL__EC_OP_PULL_ROWS, 5, 5 * 3 * 4},
      {KEEL__EC_OP_PULL_ROWS, 0, 0},
      {KEEL__EC_OP_PUSH_ROWS, 5, 0},
      {KEEL__EC_OP_READ_BLOCKS, 5, 5 * 16},
      {KEEL__EC_OP_READ_BLOCKS | 0x10000, 5, 5 * (16 + 3 * 8)},
      {KEEL__EC_OP_WRITE_BLOCKS, 5, 0},
      {KEEL__EC_OP_PARITY_PREPARE, 5, 0},
      {KEEL__EC_OP_PARITY_COMMIT, 0, 0},
      {KEEL__EC_OP_PULL_DENSE, 3, 12},
      {KEEL__EC_OP_PUSH_DENSE, 5, 0},
      {KEEL__EC_OP_INIT_DENSE, 5, 0},
      {KEEL__EC_OP_READ_DENSE_BLOCK, 0, 24},
      {KEEL__EC_OP_READ_DENSE_BLOCK | 0x10000, 0, 24 + 8},
      {KEEL__EC_OP_WRITE_DENSE_BLOCK, 0, 0},
  };
  for (size_t i = 0; i < COUNT(cases); i++) {
    /* An op above 0xffff in the table stands for the op with flag bit 0. */
    keel__ec_request request = {.op = (uint16_t)cases[i].op,
                                .flags = cases[i].op > 0xffff ? 1 : 0,
                                .count = cases[i].count};
    if (keel__ec_reply_body_bytes(&request, &limits) != cases[i].bytes)
      fail_msg("%s count %u: %zu bytes, expected %zu", op_names[request.op], cases[i].count,
               keel__ec_reply_body_bytes(&request, &limits), cases[i].bytes);
  }
}

/* ---- the configuration */

static keel__ec_config config_of(keel_ec_optimizer_kind kind) {
  keel_ec_optimizer optimizer;
  assert_int_equal(keel_ec_optimizer_init(kind, 0.05f, &optimizer), KEEL_OK);
  return (keel__ec_config){
      .servers = 6,
      .data_blocks = 3,
      .parity_blocks = 2,
      .dim = 3,
      .optimizer_kind = kind,
      .learning_rate = optimizer.learning_rate,
      .momentum = optimizer.momentum,
      .epsilon = optimizer.epsilon,
      .initial_accumulator = kind == KEEL_EC_ADAGRAD ? 0.1f : 0.0f,
      .beta1 = optimizer.beta1,
      .beta2 = optimizer.beta2,
      .total_rows = 10,
      .dense_count = 5,
      .seed = 0xfeedfacecafebeefu,
      .workers = 4,
      .options = KEEL__EC_OPTION_TWO_PHASE_COMMIT | KEEL__EC_OPTION_DENSE_REPLICATED,
      .init_scale = 0.01f,
  };
}

static void put_f32(uint8_t *out, float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  keel_put_le32(out, bits);
}

/* The configuration's bytes as protocol.h lays them out, every field as given. */
static void reference_config_encode(const keel__ec_config *config, uint8_t out[88]) {
  keel_put_le32(out, 1);
  keel_put_le32(out + 4, config->servers);
  keel_put_le32(out + 8, config->data_blocks);
  keel_put_le32(out + 12, config->parity_blocks);
  keel_put_le32(out + 16, config->dim);
  keel_put_le32(out + 20, config->optimizer_kind);
  put_f32(out + 24, config->learning_rate);
  put_f32(out + 28, config->momentum);
  put_f32(out + 32, config->epsilon);
  put_f32(out + 36, config->initial_accumulator);
  put_f32(out + 40, config->beta1);
  put_f32(out + 44, config->beta2);
  keel_put_le64(out + 48, config->total_rows);
  keel_put_le64(out + 56, config->dense_count);
  keel_put_le64(out + 64, config->seed);
  keel_put_le32(out + 72, config->workers);
  keel_put_le32(out + 76, config->options);
  put_f32(out + 80, config->init_scale);
  keel_put_le32(out + 84, 0);
}

static void expect_config_decode(const char *what, const uint8_t *wire, size_t length,
                                 keel_status expected) {
  uint8_t *body = malloc(length + (length == 0));
  assert_non_null(body);
  if (length > 0) memcpy(body, wire, length);
  keel__ec_config config, before;
  memset(&config, 0xa5, sizeof config);
  memcpy(&before, &config, sizeof before);
  keel_status status = keel__ec_config_decode(body, length, &config);
  free(body);
  if (status != expected) fail_status(what, status, expected);
  if (status != KEEL_OK && memcmp(&config, &before, sizeof config) != 0)
    fail_msg("%s: refused but wrote", what);
}

/* Field by field: the struct has padding. */
static void assert_config_equal(const keel__ec_config *a, const keel__ec_config *b) {
  assert_int_equal(a->servers, b->servers);
  assert_int_equal(a->data_blocks, b->data_blocks);
  assert_int_equal(a->parity_blocks, b->parity_blocks);
  assert_int_equal(a->dim, b->dim);
  assert_int_equal(a->optimizer_kind, b->optimizer_kind);
  const float a_floats[] = {a->learning_rate, a->momentum, a->epsilon,   a->initial_accumulator,
                            a->beta1,         a->beta2,    a->init_scale};
  const float b_floats[] = {b->learning_rate, b->momentum, b->epsilon,   b->initial_accumulator,
                            b->beta1,         b->beta2,    b->init_scale};
  assert_memory_equal(a_floats, b_floats, sizeof a_floats);
  assert_int_equal(a->total_rows, b->total_rows);
  assert_int_equal(a->dense_count, b->dense_count);
  assert_int_equal(a->seed, b->seed);
  assert_int_equal(a->workers, b->workers);
  assert_int_equal(a->options, b->options);
}

static void assert_limits_equal(const keel__ec_limits *a, const keel__ec_limits *b) {
  assert_int_equal(a->dim, b->dim);
  assert_int_equal(a->block_bytes, b->block_bytes);
  assert_int_equal(a->total_rows, b->total_rows);
  assert_int_equal(a->groups, b->groups);
  assert_int_equal(a->data_blocks, b->data_blocks);
  assert_int_equal(a->parity_blocks, b->parity_blocks);
  assert_int_equal(a->dense_count, b->dense_count);
  assert_int_equal(a->dense_block_bytes, b->dense_block_bytes);
  assert_int_equal(a->max_count, b->max_count);
}

static void test_config_round_trip(void **state) {
  (void)state;
  for (int kind = KEEL_EC_SGD; kind <= KEEL_EC_ADAM; kind++) {
    keel__ec_config config = config_of((keel_ec_optimizer_kind)kind);
    uint8_t wire[KEEL__EC_CONFIG_BYTES], reference[KEEL__EC_CONFIG_BYTES];
    assert_int_equal(keel__ec_config_encode(&config, wire), KEEL_OK);
    reference_config_encode(&config, reference);
    assert_memory_equal(wire, reference, sizeof wire);
    keel__ec_config decoded;
    assert_int_equal(keel__ec_config_decode(wire, sizeof wire, &decoded), KEEL_OK);
    assert_config_equal(&decoded, &config);
  }
  /* The smallest: k = r = 1 on two servers, one row, no dense parameters, asynchronous. */
  keel__ec_config small = config_of(KEEL_EC_SGD);
  small.servers = 2;
  small.data_blocks = 1;
  small.parity_blocks = 1;
  small.dense_count = 0;
  small.workers = 0;
  small.options = 0;
  small.init_scale = 0.0f;
  small.total_rows = 1;
  uint8_t wire[KEEL__EC_CONFIG_BYTES];
  assert_int_equal(keel__ec_config_encode(&small, wire), KEEL_OK);
  keel__ec_config decoded;
  assert_int_equal(keel__ec_config_decode(wire, sizeof wire, &decoded), KEEL_OK);
  assert_config_equal(&decoded, &small);
  /* Fields the kind does not use travel as 0, so one configuration has one encoding. */
  keel__ec_config sgd = config_of(KEEL_EC_SGD);
  sgd.momentum = 0.9f;
  sgd.beta2 = NAN;
  assert_int_equal(keel__ec_config_encode(&sgd, wire), KEEL_OK);
  assert_int_equal(keel_get_le32(wire + 28), 0);
  assert_int_equal(keel_get_le32(wire + 44), 0);
  assert_int_equal(keel__ec_config_decode(wire, sizeof wire, &decoded), KEEL_OK);
  assert_true(decoded.momentum == 0.0f && decoded.beta2 == 0.0f);
  keel_ec_optimizer optimizer = keel__ec_config_optimizer(&decoded);
  assert_int_equal(optimizer.kind, KEEL_EC_SGD);
  assert_true(optimizer.learning_rate == 0.05f);
}

static void test_config_refusals(void **state) {
  (void)state;
  /* Rules of the bytes alone. */
  keel__ec_config good = config_of(KEEL_EC_ADAM);
  uint8_t wire[KEEL__EC_CONFIG_BYTES + 1] = {0};
  reference_config_encode(&good, wire);
  expect_config_decode("the reference", wire, KEEL__EC_CONFIG_BYTES, KEEL_OK);
  for (size_t cut = 0; cut < KEEL__EC_CONFIG_BYTES; cut++)
    expect_config_decode("short", wire, cut, KEEL_EPROTO);
  expect_config_decode("a byte too many", wire, sizeof wire, KEEL_EPROTO);
  static const struct {
    const char *what;
    size_t at;
    uint32_t value;
  } words[] = {
      {"version 0", 0, 0},
      {"version 2", 0, 2},
      {"zero field", 84, 1},
      {"unused initial accumulator", 36, 0x3f800000u},
      {"unused momentum -0", 28, 0x80000000u},
      {"optimizer kind 0", 20, 0},
      {"optimizer kind 5", 20, 5},
      {"unknown option", 76, 8},
      {"unknown option, high bit", 76, 0x80000000u},
  };
  for (size_t i = 0; i < COUNT(words); i++) {
    uint8_t bad[KEEL__EC_CONFIG_BYTES];
    memcpy(bad, wire, sizeof bad);
    keel_put_le32(bad + words[i].at, words[i].value);
    expect_config_decode(words[i].what, bad, sizeof bad, KEEL_EPROTO);
  }

  /* Rules of the values: refused by decode and encode alike. */
  typedef struct value_break {
    const char *what;
    keel__ec_config config;
    keel_status status;
  } value_break;
  value_break breaks[32];
  size_t count = 0;
#define ADD(text, kind, field, value, expected)                     \
  do {                                                              \
    breaks[count] = (value_break){text, config_of(kind), expected}; \
    breaks[count].config.field = value;                             \
    count++;                                                        \
  } while (0)
  ADD("k 0", KEEL_EC_SGD, data_blocks, 0, KEEL_ERANGE);
  ADD("r 0", KEEL_EC_SGD, parity_blocks, 0, KEEL_ERANGE);
  ADD("k + r past the servers", KEEL_EC_SGD, servers, 4, KEEL_ERANGE);
  ADD("k huge", KEEL_EC_SGD, data_blocks, UINT32_MAX, KEEL_ERANGE);
  ADD("servers past KEEL_MAX_UIDS", KEEL_EC_SGD, servers, KEEL_MAX_UIDS + 1, KEEL_ERANGE);
  ADD("dim 0", KEEL_EC_SGD, dim, 0, KEEL_ERANGE);
  ADD("dim past the maximum", KEEL_EC_SGD, dim, KEEL_EC_ROW_MAX_DIM + 1, KEEL_ERANGE);
  ADD("no rows", KEEL_EC_SGD, total_rows, 0, KEEL_ERANGE);
  ADD("dense past the maximum", KEEL_EC_SGD, dense_count, KEEL_EC_ROW_MAX_DIM + 1, KEEL_ERANGE);
  ADD("workers past KEEL_MAX_WORLD", KEEL_EC_SGD, workers, KEEL_MAX_WORLD + 1, KEEL_ERANGE);
  ADD("init scale NaN", KEEL_EC_SGD, init_scale, NAN, KEEL_ERANGE);
  ADD("init scale infinite", KEEL_EC_SGD, init_scale, INFINITY, KEEL_ERANGE);
  ADD("init scale negative", KEEL_EC_SGD, init_scale, -1.0f, KEEL_ERANGE);
  ADD("learning rate NaN", KEEL_EC_SGD, learning_rate, NAN, KEEL_ERANGE);
  ADD("learning rate negative", KEEL_EC_MOMENTUM, learning_rate, -0.5f, KEEL_ERANGE);
  ADD("momentum negative", KEEL_EC_MOMENTUM, momentum, -0.1f, KEEL_ERANGE);
  ADD("epsilon 0", KEEL_EC_ADAGRAD, epsilon, 0.0f, KEEL_ERANGE);
  ADD("accumulator negative", KEEL_EC_ADAGRAD, initial_accumulator, -1.0f, KEEL_ERANGE);
  ADD("beta1 1", KEEL_EC_ADAM, beta1, 1.0f, KEEL_ERANGE);
  ADD("beta2 infinite", KEEL_EC_ADAM, beta2, INFINITY, KEEL_ERANGE);
  ADD("unknown kind", KEEL_EC_ADAM, optimizer_kind, 7, KEEL_EPROTO);
  ADD("unknown option", KEEL_EC_ADAM, options, 16, KEEL_EPROTO);
#undef ADD
  for (size_t i = 0; i < count; i++) {
    uint8_t bad[KEEL__EC_CONFIG_BYTES];
    reference_config_encode(&breaks[i].config, bad);
    expect_config_decode(breaks[i].what, bad, sizeof bad, breaks[i].status);
    keel_status status = keel__ec_config_encode(&breaks[i].config, bad);
    if (status != breaks[i].status) fail_status(breaks[i].what, status, breaks[i].status);
  }
  keel__ec_config config;
  assert_int_equal(keel__ec_config_decode(NULL, KEEL__EC_CONFIG_BYTES, &config), KEEL_EINVAL);
  assert_int_equal(keel__ec_config_decode(wire, KEEL__EC_CONFIG_BYTES, NULL), KEEL_EINVAL);
  assert_int_equal(keel__ec_config_encode(NULL, wire), KEEL_EINVAL);
  assert_int_equal(keel__ec_config_encode(&good, NULL), KEEL_EINVAL);
}

static void test_config_limits(void **state) {
  (void)state;
  keel__ec_config config = config_of(KEEL_EC_SGD);
  keel__ec_limits derived;
  assert_int_equal(keel__ec_config_limits(&config, 8, &derived), KEEL_OK);
  assert_limits_equal(&derived, &limits);
  /* Adam over 3 floats: 36 bytes of vectors, padded to 40, and the step: 48; its dense block
   * over 5 floats: 60, padded to 64, and the step: 72. */
  config = config_of(KEEL_EC_ADAM);
  config.total_rows = 9;
  config.dense_count = 0;
  assert_int_equal(keel__ec_config_limits(&config, 100, &derived), KEEL_OK);
  assert_int_equal(derived.block_bytes, 48);
  assert_int_equal(derived.groups, 3);
  assert_int_equal(derived.dense_block_bytes, 0);
  assert_int_equal(derived.max_count, 100);
  config.dense_count = 5;
  assert_int_equal(keel__ec_config_limits(&config, 100, &derived), KEEL_OK);
  assert_int_equal(derived.dense_block_bytes, 72);
  /* ceil(total_rows / k) without overflow: 2^64 - 1 is a multiple of 3, 2^64 - 2 is not. */
  config.total_rows = UINT64_MAX;
  assert_int_equal(keel__ec_config_limits(&config, 1, &derived), KEEL_OK);
  assert_int_equal(derived.groups, UINT64_MAX / 3);
  config.total_rows = UINT64_MAX - 1;
  assert_int_equal(keel__ec_config_limits(&config, 1, &derived), KEEL_OK);
  assert_int_equal(derived.groups, UINT64_MAX / 3);

  keel__ec_limits before;
  memset(&derived, 0x5a, sizeof derived);
  memcpy(&before, &derived, sizeof before);
  assert_int_equal(keel__ec_config_limits(&config, 0, &derived), KEEL_EINVAL);
  config.servers = 4;
  assert_int_equal(keel__ec_config_limits(&config, 8, &derived), KEEL_EINVAL);
  assert_memory_equal(&derived, &before, sizeof derived);
  assert_int_equal(keel__ec_config_limits(NULL, 8, &derived), KEEL_EINVAL);
  assert_int_equal(keel__ec_config_limits(&config, 8, NULL), KEEL_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_every_op),
      cmocka_unit_test(test_every_truncation_and_extension),
      cmocka_unit_test(test_op_flags_and_id),
      cmocka_unit_test(test_again_lost),
      cmocka_unit_test(test_routed_digest),
      cmocka_unit_test(test_counts),
      cmocka_unit_test(test_rows),
      cmocka_unit_test(test_refs),
      cmocka_unit_test(test_workers),
      cmocka_unit_test(test_dense_ranges),
      cmocka_unit_test(test_misaligned_and_bad_arguments),
      cmocka_unit_test(test_size_arithmetic),
      cmocka_unit_test(test_limits_check),
      cmocka_unit_test(test_reply_round_trip),
      cmocka_unit_test(test_reply_refusals),
      cmocka_unit_test(test_reply_body_bytes),
      cmocka_unit_test(test_config_round_trip),
      cmocka_unit_test(test_config_refusals),
      cmocka_unit_test(test_config_limits),
  };
  return cmocka_run_group_tests_name("test_ec_protocol", tests, NULL, NULL);
}
