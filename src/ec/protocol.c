/* The parameter servers' wire format (layout in protocol.h): one table of what each op carries
 * drives the length arithmetic, the checks and both directions of the request codec, so that
 * the encoder refuses exactly what the decoder refuses. Nothing here allocates. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ec/ec_internal.h"
#include "ec/protocol.h"

#define ROW_BYTES 8
#define REF_BYTES 16
#define F32_BYTES 4
#define PUSH_FIELDS_BYTES 16 /* step u64 | worker u32 | workers u32 */
#define ROUTED_BYTES 8       /* routed u64 */
#define OFFSET_BYTES 8
#define STEP_BYTES 8
/* Keeps every block length an int, as keel_ec_row_block_bytes' blocks are. */
#define BLOCK_BYTES_LIMIT ((uint64_t)1 << 31)

/* What an op's count counts. */
enum {
  COUNT_NONE = 0, /* count is 0 */
  COUNT_ITEMS,    /* rows or refs, up to max_count */
  COUNT_DENSE,    /* every dense parameter: exactly dense_count */
  COUNT_FLOATS,   /* some dense parameters, from the request's offset */
};

/* The fields that lead an op's body. */
enum { LEAD_NONE = 0, LEAD_PUSH, LEAD_OFFSET, LEAD_STEP };

/* The arrays an op's body carries, always in this order after the leading fields. */
enum {
  ARRAY_ROWS = 1 << 0,
  ARRAY_REFS = 1 << 1,
  ARRAY_VALUES = 1 << 2,
  ARRAY_BLOCKS = 1 << 3,
};

static const struct op_rule {
  uint16_t flags; /* the flags the op defines */
  bool update;    /* id is an update id (non-zero); 0 otherwise */
  bool dense;     /* refused without dense parameters */
  uint8_t count;
  uint8_t lead;
  uint8_t arrays;
} op_rules[] = {
    [KEEL__EC_OP_INFO] = {0},
    [KEEL__EC_OP_PULL_ROWS] = {.flags = KEEL__EC_FLAG_ACTING,
                               .count = COUNT_ITEMS,
                               .lead = LEAD_STEP,
                               .arrays = ARRAY_ROWS},
    [KEEL__EC_OP_PUSH_ROWS] = {.flags = KEEL__EC_FLAG_ACTING | KEEL__EC_FLAG_AGAIN,
                               .update = true,
                               .count = COUNT_ITEMS,
                               .lead = LEAD_PUSH,
                               .arrays = ARRAY_ROWS | ARRAY_VALUES},
    [KEEL__EC_OP_READ_BLOCKS] = {.flags = KEEL__EC_FLAG_VERSIONED,
                                 .count = COUNT_ITEMS,
                                 .arrays = ARRAY_REFS},
    [KEEL__EC_OP_WRITE_BLOCKS] = {.count = COUNT_ITEMS, .arrays = ARRAY_REFS | ARRAY_BLOCKS},
    [KEEL__EC_OP_PARITY_PREPARE] = {.flags = KEEL__EC_FLAG_APPLY_NOW,
                                    .update = true,
                                    .count = COUNT_ITEMS,
                                    .arrays = ARRAY_REFS | ARRAY_BLOCKS},
    [KEEL__EC_OP_PARITY_COMMIT] = {.flags = KEEL__EC_FLAG_ABORT | KEEL__EC_FLAG_QUERY |
                                            KEEL__EC_FLAG_VERDICT,
                                   .update = true},
    [KEEL__EC_OP_PULL_DENSE] = {.dense = true, .count = COUNT_FLOATS, .lead = LEAD_OFFSET},
    [KEEL__EC_OP_PUSH_DENSE] = {.update = true,
                                .dense = true,
                                .count = COUNT_DENSE,
                                .lead = LEAD_PUSH,
                                .arrays = ARRAY_VALUES},
    [KEEL__EC_OP_INIT_DENSE] = {.dense = true, .count = COUNT_DENSE, .arrays = ARRAY_VALUES},
    [KEEL__EC_OP_READ_DENSE_BLOCK] = {.flags = KEEL__EC_FLAG_VERSIONED, .dense = true},
    [KEEL__EC_OP_WRITE_DENSE_BLOCK] = {.dense = true, .lead = LEAD_STEP, .arrays = ARRAY_BLOCKS},
};

static bool op_known(uint16_t op) {
  return op >= KEEL__EC_OP_INFO && op <= KEEL__EC_OP_WRITE_DENSE_BLOCK;
}

/* ---- arithmetic that says when it overflows, for lengths built from a peer's counts */

static bool product(uint64_t a, uint64_t b, uint64_t *result_p) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *result_p = a * b;
  return true;
}

static bool sum(uint64_t a, uint64_t b, uint64_t *result_p) {
  if (b > UINT64_MAX - a) return false;
  *result_p = a + b;
  return true;
}

/* ---- limits */

static bool block_bytes_valid(uint64_t bytes, uint64_t dim) {
  return bytes % 8 == 0 && bytes >= dim * F32_BYTES && bytes < BLOCK_BYTES_LIMIT;
}

static uint64_t groups_of(uint64_t total_rows, uint32_t data_blocks) {
  return total_rows / data_blocks + (total_rows % data_blocks != 0);
}

static bool code_valid(uint32_t data_blocks, uint32_t parity_blocks) {
  return data_blocks >= 1 && parity_blocks >= 1 && data_blocks <= KEEL_EC_MAX_BLOCKS &&
         parity_blocks <= KEEL_EC_MAX_BLOCKS - data_blocks;
}

/* The rule the limits break, NULL when they are consistent. */
static const char *limits_problem(const keel__ec_limits *limits) {
  if (limits == NULL) return "no limits";
  if (limits->dim < 1 || limits->dim > KEEL_EC_ROW_MAX_DIM) return "dim out of range";
  if (!block_bytes_valid(limits->block_bytes, limits->dim))
    return "block_bytes not a multiple of 8 of at least 4 * dim and under 2^31";
  if (!code_valid(limits->data_blocks, limits->parity_blocks))
    return "data and parity blocks: need k >= 1, r >= 1, k + r <= KEEL_EC_MAX_BLOCKS";
  if (limits->total_rows < 1) return "no rows";
  if (limits->groups != groups_of(limits->total_rows, limits->data_blocks))
    return "groups is not ceil(total_rows / k)";
  if (limits->dense_count > KEEL_EC_ROW_MAX_DIM) return "dense_count out of range";
  if (limits->dense_count == 0 ? limits->dense_block_bytes != 0
                               : !block_bytes_valid(limits->dense_block_bytes, limits->dense_count))
    return "dense_block_bytes does not fit dense_count";
  if (limits->max_count < 1) return "max_count is 0";
  return NULL;
}

keel_status keel__ec_limits_check(const keel__ec_limits *limits) {
  const char *problem = limits_problem(limits);
  if (problem == NULL) return KEEL_OK;
  KEEL_LOG_E(KEEL__EC_MODULE, "ec protocol limits: %s", problem);
  return KEEL_EINVAL;
}

/* ---- requests */

/* Where the parts of a request's body lie: bytes of each, in body order after the header. */
typedef struct body_layout {
  uint64_t lead, rows, refs, values, blocks;
  uint64_t total; /* the whole payload, header included */
} body_layout;

/* Whether the request names the servers lost in its round before (PUSH_ROWS with AGAIN). */
static bool has_again_lost(const keel__ec_request *request) {
  return request->op == KEEL__EC_OP_PUSH_ROWS && (request->flags & KEEL__EC_FLAG_AGAIN) != 0;
}

/* Whether the request says which lost servers its rows were routed around (PUSH_ROWS with
 * ACTING: the servers compare the workers' of one round, RELIABILITY.md finding 53). */
static bool has_routed(const keel__ec_request *request) {
  return request->op == KEEL__EC_OP_PUSH_ROWS && (request->flags & KEEL__EC_FLAG_ACTING) != 0;
}

/* Where again_lost starts in a push's lead: after its fields and routed. */
static uint64_t again_lost_offset(const keel__ec_request *request) {
  return PUSH_FIELDS_BYTES + (has_routed(request) ? ROUTED_BYTES : 0);
}

/* The op, flags, id and count rules: what the header alone decides. */
static keel_status check_header(const keel__ec_request *request, const keel__ec_limits *limits) {
  if (!op_known(request->op)) return KEEL_EPROTO;
  const struct op_rule *rule = &op_rules[request->op];
  if ((request->flags & ~rule->flags) != 0) return KEEL_EPROTO;
  if (has_again_lost(request) && !(request->flags & KEEL__EC_FLAG_ACTING)) return KEEL_EPROTO;
  if ((request->id != 0) != rule->update) return KEEL_EPROTO;
  if (rule->dense && limits->dense_count == 0) return KEEL_ERANGE;
  switch (rule->count) {
    case COUNT_NONE:
      return request->count == 0 ? KEEL_OK : KEEL_EPROTO;
    case COUNT_ITEMS:
      return request->count <= limits->max_count ? KEEL_OK : KEEL_ERANGE;
    case COUNT_DENSE:
      return request->count == limits->dense_count ? KEEL_OK : KEEL_ERANGE;
    default: /* COUNT_FLOATS */
      return request->count <= limits->dense_count ? KEEL_OK : KEEL_ERANGE;
  }
}

/* again_lost's bytes: r u32 slots, then zeros to the next multiple of 8. */
static uint64_t again_lost_bytes(const keel__ec_limits *limits) {
  return ((uint64_t)limits->parity_blocks * 4 + 7) / 8 * 8;
}

/* The layout of a request whose header passed check_header; false when its length does not
 * fit in 64 bits (no payload can have it). */
static bool layout_of(const keel__ec_request *request, const keel__ec_limits *limits,
                      body_layout *layout_p) {
  const struct op_rule *rule = &op_rules[request->op];
  uint64_t count = request->count;
  body_layout layout = {0};
  if (rule->lead == LEAD_PUSH) layout.lead = PUSH_FIELDS_BYTES;
  if (has_routed(request)) layout.lead += ROUTED_BYTES;
  if (has_again_lost(request)) layout.lead += again_lost_bytes(limits);
  if (rule->lead == LEAD_OFFSET) layout.lead = OFFSET_BYTES;
  if (rule->lead == LEAD_STEP) layout.lead = STEP_BYTES;
  if (rule->arrays & ARRAY_ROWS) layout.rows = count * ROW_BYTES;
  if (rule->arrays & ARRAY_REFS) layout.refs = count * REF_BYTES;
  /* Values are a row's dim floats per row, or one float per dense parameter. */
  uint64_t floats = count;
  if ((rule->arrays & ARRAY_VALUES) &&
      !(product(count, rule->count == COUNT_ITEMS ? limits->dim : 1, &floats) &&
        product(floats, F32_BYTES, &layout.values)))
    return false;
  /* Blocks are one per ref, or the one dense block. */
  if (rule->arrays & ARRAY_BLOCKS) {
    layout.blocks = limits->dense_block_bytes;
    if (rule->count == COUNT_ITEMS && !product(count, limits->block_bytes, &layout.blocks))
      return false;
  }
  /* rows and refs are at most 2^32 * 16 bytes: only values and blocks can overflow. */
  uint64_t total = KEEL__EC_REQUEST_HEADER_BYTES + layout.lead + layout.rows + layout.refs;
  if (!sum(total, layout.values, &total) || !sum(total, layout.blocks, &total)) return false;
  layout.total = total;
  *layout_p = layout;
  return true;
}

/* Strictly increasing rows below total_rows: one order, no row twice. */
static keel_status check_rows(const uint64_t *rows, uint32_t count, uint64_t total_rows) {
  for (uint32_t i = 0; i < count; i++) {
    if (rows[i] >= total_rows) return KEEL_ERANGE;
    if (i > 0 && rows[i] <= rows[i - 1]) return KEEL_EPROTO;
  }
  return KEEL_OK;
}

static keel_status check_refs(const keel__ec_ref *refs, uint32_t count, bool deltas,
                              const keel__ec_limits *limits) {
  uint32_t data_blocks = limits->data_blocks;
  uint32_t members = data_blocks + limits->parity_blocks;
  for (uint32_t i = 0; i < count; i++) {
    const keel__ec_ref *ref = &refs[i];
    if (ref->group >= limits->groups) return KEEL_ERANGE;
    if (deltas) {
      /* To a parity block, or to the data block itself (a rebuilding server's copy). */
      bool to_parity = ref->other >= data_blocks && ref->other < members;
      if (ref->member >= data_blocks || (!to_parity && ref->other != ref->member))
        return KEEL_ERANGE;
      continue;
    }
    if (ref->member >= members) return KEEL_ERANGE;
    if (ref->other != 0) return KEEL_EPROTO;
  }
  return KEEL_OK;
}

/* The bytes after again_lost's slots up to the 8-alignment are zero (one encoding only). */
static bool again_padding_zero(const keel__ec_request *request, const keel__ec_limits *limits) {
  const uint8_t *padding = (const uint8_t *)(request->again_lost + limits->parity_blocks);
  uint64_t bytes = again_lost_bytes(limits) - (uint64_t)limits->parity_blocks * 4;
  for (uint64_t i = 0; i < bytes; i++)
    if (padding[i] != 0) return false;
  return true;
}

/* Servers below the limit, the unused slots last (none used: the round before lost no
 * server, a server it called on was lost). */
static keel_status check_again_lost(const uint32_t *lost, uint32_t slots) {
  for (uint32_t i = 0; i < slots; i++) {
    if (lost[i] == KEEL__EC_NO_SERVER) {
      if (i + 1 < slots && lost[i + 1] != KEEL__EC_NO_SERVER) return KEEL_EPROTO;
      continue;
    }
    if (lost[i] >= KEEL__EC_SERVERS_LIMIT) return KEEL_ERANGE;
  }
  return KEEL_OK;
}

/* The rules on the body's fields and arrays, which must be there (decoded or checked
 * present). */
static keel_status check_body(const keel__ec_request *request, const keel__ec_limits *limits) {
  const struct op_rule *rule = &op_rules[request->op];
  if (rule->lead == LEAD_PUSH && request->worker >= request->workers) return KEEL_ERANGE;
  if (has_again_lost(request)) {
    keel_status status = check_again_lost(request->again_lost, limits->parity_blocks);
    if (status != KEEL_OK) return status;
  }
  /* check_header saw count <= dense_count, so the difference cannot wrap. */
  if (rule->lead == LEAD_OFFSET && request->offset > limits->dense_count - request->count)
    return KEEL_ERANGE;
  if (rule->arrays & ARRAY_ROWS) {
    keel_status status = check_rows(request->rows, request->count, limits->total_rows);
    if (status != KEEL_OK) return status;
  }
  if (rule->arrays & ARRAY_REFS)
    return check_refs(request->refs, request->count, request->op == KEEL__EC_OP_PARITY_PREPARE,
                      limits);
  return KEEL_OK;
}

/* Whether each array the layout has bytes for has a pointer: what an encoder's caller owes. */
static bool arrays_present(const keel__ec_request *request, const body_layout *layout) {
  return (!has_again_lost(request) || request->again_lost != NULL) &&
         (layout->rows == 0 || request->rows != NULL) &&
         (layout->refs == 0 || request->refs != NULL) &&
         (layout->values == 0 || request->values != NULL) &&
         (layout->blocks == 0 || request->blocks != NULL);
}

/* Every rule of the format on a request to send, and its layout. */
static keel_status request_check(const keel__ec_request *request, const keel__ec_limits *limits,
                                 body_layout *layout_p) {
  if (request == NULL || limits_problem(limits) != NULL) return KEEL_EINVAL;
  keel_status status = check_header(request, limits);
  if (status != KEEL_OK) return status;
  if (!layout_of(request, limits, layout_p) || layout_p->total > SIZE_MAX) return KEEL_ERANGE;
  if (!arrays_present(request, layout_p)) return KEEL_EINVAL;
  return check_body(request, limits);
}

/* Points the request's fields and arrays at a body of the layout (no copy). */
static void read_body(const uint8_t *at, const body_layout *layout, keel__ec_request *request) {
  const struct op_rule *rule = &op_rules[request->op];
  if (rule->lead == LEAD_PUSH) {
    request->step = keel_get_le64(at);
    request->worker = keel_get_le32(at + 8);
    request->workers = keel_get_le32(at + 12);
  }
  if (has_routed(request)) request->routed = keel_get_le64(at + PUSH_FIELDS_BYTES);
  if (has_again_lost(request))
    request->again_lost = (const uint32_t *)(const void *)(at + again_lost_offset(request));
  if (rule->lead == LEAD_OFFSET) request->offset = keel_get_le64(at);
  if (rule->lead == LEAD_STEP) request->step = keel_get_le64(at);
  at += layout->lead;
  if (rule->arrays & ARRAY_ROWS) request->rows = (const uint64_t *)(const void *)at;
  at += layout->rows;
  if (rule->arrays & ARRAY_REFS) request->refs = (const keel__ec_ref *)(const void *)at;
  at += layout->refs;
  if (rule->arrays & ARRAY_VALUES) request->values = (const float *)(const void *)at;
  at += layout->values;
  if (rule->arrays & ARRAY_BLOCKS) request->blocks = at;
}

uint64_t keel__ec_routed_digest(const bool *lost, int servers) {
  uint64_t hash = 14695981039346656037ull;
  for (int i = 0; i < servers; i++) {
    if (!lost[i]) continue;
    for (int byte = 0; byte < 4; byte++) {
      hash ^= ((uint32_t)i >> (8 * byte)) & 0xffu;
      hash *= 1099511628211ull;
    }
  }
  return hash;
}

keel_status keel__ec_request_decode(const uint8_t *payload, size_t length,
                                    const keel__ec_limits *limits, keel__ec_request *request_p) {
  if (payload == NULL || request_p == NULL || limits_problem(limits) != NULL) return KEEL_EINVAL;
  /* The arrays are read in place, and unaligned loads are undefined in C. */
  if ((uintptr_t)payload % 8 != 0) return KEEL_EINVAL;
  if (length < KEEL__EC_REQUEST_HEADER_BYTES) return KEEL_EPROTO;
  keel__ec_request request = {
      .op = keel_get_le16(payload),
      .flags = keel_get_le16(payload + 2),
      .count = keel_get_le32(payload + 4),
      .id = keel_get_le64(payload + 8),
  };
  keel_status status = check_header(&request, limits);
  if (status != KEEL_OK) return status;
  body_layout layout;
  if (!layout_of(&request, limits, &layout) || layout.total != length) return KEEL_EPROTO;
  read_body(payload + KEEL__EC_REQUEST_HEADER_BYTES, &layout, &request);
  if (has_again_lost(&request) && !again_padding_zero(&request, limits)) return KEEL_EPROTO;
  status = check_body(&request, limits);
  if (status != KEEL_OK) return status;
  *request_p = request;
  return KEEL_OK;
}

size_t keel__ec_request_bytes(const keel__ec_request *request, const keel__ec_limits *limits) {
  body_layout layout;
  if (request_check(request, limits, &layout) != KEEL_OK) return 0;
  return (size_t)layout.total;
}

/* Appends bytes at *at (memcpy must not see NULL, even for nothing). */
static void put_array(uint8_t **at, const void *array, uint64_t bytes) {
  if (bytes == 0) return;
  memcpy(*at, array, (size_t)bytes);
  *at += bytes;
}

/* read_body's inverse: the request's fields and arrays into a body of the layout. */
static void write_body(const keel__ec_request *request, const keel__ec_limits *limits,
                       const body_layout *layout, uint8_t *at) {
  const struct op_rule *rule = &op_rules[request->op];
  if (rule->lead == LEAD_PUSH) {
    keel_put_le64(at, request->step);
    keel_put_le32(at + 8, request->worker);
    keel_put_le32(at + 12, request->workers);
  }
  if (has_routed(request)) keel_put_le64(at + PUSH_FIELDS_BYTES, request->routed);
  if (has_again_lost(request)) {
    uint64_t again_at = again_lost_offset(request);
    uint64_t slots_bytes = (uint64_t)limits->parity_blocks * 4;
    memcpy(at + again_at, request->again_lost, (size_t)slots_bytes);
    memset(at + again_at + slots_bytes, 0, (size_t)(again_lost_bytes(limits) - slots_bytes));
  }
  if (rule->lead == LEAD_OFFSET) keel_put_le64(at, request->offset);
  if (rule->lead == LEAD_STEP) keel_put_le64(at, request->step);
  at += layout->lead;
  put_array(&at, request->rows, layout->rows);
  put_array(&at, request->refs, layout->refs);
  put_array(&at, request->values, layout->values);
  put_array(&at, request->blocks, layout->blocks);
}

keel_status keel__ec_request_encode(const keel__ec_request *request, const keel__ec_limits *limits,
                                    uint8_t *out, size_t capacity) {
  body_layout layout;
  keel_status status = request_check(request, limits, &layout);
  if (status != KEEL_OK) return status;
  if (out == NULL || capacity < layout.total) return KEEL_EINVAL;
  keel_put_le16(out, request->op);
  keel_put_le16(out + 2, request->flags);
  keel_put_le32(out + 4, request->count);
  keel_put_le64(out + 8, request->id);
  write_body(request, limits, &layout, out + KEEL__EC_REQUEST_HEADER_BYTES);
  return KEEL_OK;
}

/* ---- replies */

size_t keel__ec_reply_body_bytes(const keel__ec_request *request, const keel__ec_limits *limits) {
  if (request == NULL || limits == NULL) return SIZE_MAX;
  uint64_t bytes = 0;
  bool fits = true;
  switch (request->op) {
    case KEEL__EC_OP_INFO:
      bytes = KEEL__EC_CONFIG_BYTES;
      break;
    case KEEL__EC_OP_PULL_ROWS:
      fits = product(request->count, limits->dim, &bytes) && product(bytes, F32_BYTES, &bytes);
      break;
    case KEEL__EC_OP_READ_BLOCKS: {
      /* Versioned: each block followed by its k stamps. */
      uint64_t each = limits->block_bytes;
      if (request->flags & KEEL__EC_FLAG_VERSIONED)
        fits = sum(each, (uint64_t)limits->data_blocks * 8, &each);
      fits = fits && product(request->count, each, &bytes);
      break;
    }
    case KEEL__EC_OP_PULL_DENSE:
      bytes = (uint64_t)request->count * F32_BYTES;
      break;
    case KEEL__EC_OP_READ_DENSE_BLOCK:
      /* Versioned: the block followed by its stamp. */
      bytes = limits->dense_block_bytes + (request->flags & KEEL__EC_FLAG_VERSIONED ? 8u : 0u);
      break;
  }
  return fits && bytes < SIZE_MAX ? (size_t)bytes : SIZE_MAX;
}

keel_status keel__ec_reply_encode_header(uint16_t op, keel_status status, uint64_t body_bytes,
                                         uint8_t header[KEEL__EC_REPLY_HEADER_BYTES]) {
  if (header == NULL || !keel_status_known(status) || (status != KEEL_OK && body_bytes != 0))
    return KEEL_EINVAL;
  keel_put_le16(header, op);
  keel_put_le16(header + 2, 0);
  keel_put_le32(header + 4, (uint32_t)(int32_t)status);
  keel_put_le64(header + 8, body_bytes);
  return KEEL_OK;
}

keel_status keel__ec_reply_decode(const uint8_t *payload, size_t length, uint16_t expected_op,
                                  size_t expected_body_bytes, keel__ec_reply *reply_p) {
  if (payload == NULL || reply_p == NULL) return KEEL_EINVAL;
  if (length < KEEL__EC_REPLY_HEADER_BYTES) return KEEL_EPROTO;
  int64_t status = (int32_t)keel_get_le32(payload + 4);
  keel__ec_reply reply = {
      .op = keel_get_le16(payload),
      .body_bytes = keel_get_le64(payload + 8),
      .body = payload + KEEL__EC_REPLY_HEADER_BYTES,
  };
  if (reply.op != expected_op || keel_get_le16(payload + 2) != 0 || !keel_status_known(status))
    return KEEL_EPROTO;
  reply.status = (keel_status)status;
  if (reply.body_bytes != length - KEEL__EC_REPLY_HEADER_BYTES) return KEEL_EPROTO;
  if (reply.body_bytes != (reply.status == KEEL_OK ? expected_body_bytes : 0)) return KEEL_EPROTO;
  *reply_p = reply;
  return KEEL_OK;
}

/* ---- the configuration */

#define CONFIG_OPTIMIZER_AT 20
#define CONFIG_HYPERPARAMETERS 6 /* learning_rate .. beta2, in wire order */
#define KNOWN_OPTIONS \
  (KEEL__EC_OPTION_TWO_PHASE_COMMIT | KEEL__EC_OPTION_DENSE_REPLICATED | KEEL__EC_OPTION_NO_PARITY)

/* Which of the hyper-parameters (bit i: the i-th in wire order) each optimizer kind uses. */
static const uint8_t hyperparameters_used[] = {
    [KEEL_EC_SGD] = 1 << 0,
    [KEEL_EC_MOMENTUM] = 1 << 0 | 1 << 1,
    [KEEL_EC_ADAGRAD] = 1 << 0 | 1 << 2 | 1 << 3,
    [KEEL_EC_ADAM] = 1 << 0 | 1 << 2 | 1 << 4 | 1 << 5,
};

static bool optimizer_kind_known(uint32_t kind) {
  return kind >= KEEL_EC_SGD && kind <= KEEL_EC_ADAM;
}

static void put_f32(uint8_t *out, float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  keel_put_le32(out, bits);
}

static float get_f32(const uint8_t *in) {
  uint32_t bits = keel_get_le32(in);
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

keel_ec_optimizer keel__ec_config_optimizer(const keel__ec_config *config) {
  return (keel_ec_optimizer){
      .kind = (keel_ec_optimizer_kind)config->optimizer_kind,
      .learning_rate = config->learning_rate,
      .momentum = config->momentum,
      .epsilon = config->epsilon,
      .initial_accumulator = config->initial_accumulator,
      .beta1 = config->beta1,
      .beta2 = config->beta2,
  };
}

/* The rule the configuration breaks (and the status a decoder answers for it), NULL when it
 * is valid (protocol.h). */
static const char *config_problem(const keel__ec_config *config, keel_status *status_p) {
  *status_p = KEEL_EPROTO;
  if (!optimizer_kind_known(config->optimizer_kind)) return "unknown optimizer kind";
  if ((config->options & ~KNOWN_OPTIONS) != 0) return "unknown option bits";
  *status_p = KEEL_ERANGE;
  if (!code_valid(config->data_blocks, config->parity_blocks))
    return "data and parity blocks: need k >= 1, r >= 1, k + r <= KEEL_EC_MAX_BLOCKS";
  if (config->servers < config->data_blocks + config->parity_blocks ||
      config->servers > KEEL_MAX_UIDS)
    return "servers: need k + r <= servers <= KEEL_MAX_UIDS";
  if (config->dim < 1 || config->dim > KEEL_EC_ROW_MAX_DIM) return "dim out of range";
  if (config->total_rows < 1) return "no rows";
  if (config->dense_count > KEEL_EC_ROW_MAX_DIM) return "dense_count out of range";
  if (config->workers > KEEL_MAX_WORLD) return "workers over KEEL_MAX_WORLD";
  if (!(config->init_scale >= 0.0f) || isinf(config->init_scale))
    return "init_scale not finite and >= 0";
  keel_ec_optimizer optimizer = keel__ec_config_optimizer(config);
  if (keel_ec_optimizer_check(&optimizer) != KEEL_OK) return "invalid optimizer";
  *status_p = KEEL_OK;
  return NULL;
}

keel_status keel__ec_config_encode(const keel__ec_config *config,
                                   uint8_t out[KEEL__EC_CONFIG_BYTES]) {
  if (config == NULL || out == NULL) return KEEL_EINVAL;
  keel_status status;
  if (config_problem(config, &status) != NULL) return status;
  const float hyperparameters[CONFIG_HYPERPARAMETERS] = {
      config->learning_rate,       config->momentum, config->epsilon,
      config->initial_accumulator, config->beta1,    config->beta2,
  };
  uint8_t used = hyperparameters_used[config->optimizer_kind];
  keel_put_le32(out, KEEL__EC_PROTOCOL_VERSION);
  keel_put_le32(out + 4, config->servers);
  keel_put_le32(out + 8, config->data_blocks);
  keel_put_le32(out + 12, config->parity_blocks);
  keel_put_le32(out + 16, config->dim);
  keel_put_le32(out + CONFIG_OPTIMIZER_AT, config->optimizer_kind);
  for (int i = 0; i < CONFIG_HYPERPARAMETERS; i++)
    put_f32(out + CONFIG_OPTIMIZER_AT + 4 + 4 * i, ((used >> i) & 1) ? hyperparameters[i] : 0.0f);
  keel_put_le64(out + 48, config->total_rows);
  keel_put_le64(out + 56, config->dense_count);
  keel_put_le64(out + 64, config->seed);
  keel_put_le32(out + 72, config->workers);
  keel_put_le32(out + 76, config->options);
  put_f32(out + 80, config->init_scale);
  keel_put_le32(out + 84, 0);
  return KEEL_OK;
}

keel_status keel__ec_config_decode(const uint8_t *body, size_t length, keel__ec_config *config_p) {
  if (body == NULL || config_p == NULL) return KEEL_EINVAL;
  if (length != KEEL__EC_CONFIG_BYTES || keel_get_le32(body) != KEEL__EC_PROTOCOL_VERSION ||
      keel_get_le32(body + 84) != 0)
    return KEEL_EPROTO;
  uint32_t kind = keel_get_le32(body + CONFIG_OPTIMIZER_AT);
  if (!optimizer_kind_known(kind)) return KEEL_EPROTO;
  float hyperparameters[CONFIG_HYPERPARAMETERS];
  for (int i = 0; i < CONFIG_HYPERPARAMETERS; i++) {
    const uint8_t *field = body + CONFIG_OPTIMIZER_AT + 4 + 4 * i;
    /* One encoding per configuration: a field the kind ignores is +0, bit for bit. */
    if (!((hyperparameters_used[kind] >> i) & 1) && keel_get_le32(field) != 0) return KEEL_EPROTO;
    hyperparameters[i] = get_f32(field);
  }
  keel__ec_config config = {
      .servers = keel_get_le32(body + 4),
      .data_blocks = keel_get_le32(body + 8),
      .parity_blocks = keel_get_le32(body + 12),
      .dim = keel_get_le32(body + 16),
      .optimizer_kind = kind,
      .learning_rate = hyperparameters[0],
      .momentum = hyperparameters[1],
      .epsilon = hyperparameters[2],
      .initial_accumulator = hyperparameters[3],
      .beta1 = hyperparameters[4],
      .beta2 = hyperparameters[5],
      .total_rows = keel_get_le64(body + 48),
      .dense_count = keel_get_le64(body + 56),
      .seed = keel_get_le64(body + 64),
      .workers = keel_get_le32(body + 72),
      .options = keel_get_le32(body + 76),
      .init_scale = get_f32(body + 80),
  };
  keel_status status;
  if (config_problem(&config, &status) != NULL) return status;
  *config_p = config;
  return KEEL_OK;
}

keel_status keel__ec_config_limits(const keel__ec_config *config, uint32_t max_count,
                                   keel__ec_limits *limits_p) {
  if (config == NULL || limits_p == NULL) return keel__ec_invalid("ec config limits: NULL");
  if (max_count < 1) return keel__ec_invalid("ec config limits: max_count is 0");
  keel_status status;
  const char *problem = config_problem(config, &status);
  if (problem != NULL) {
    KEEL_LOG_E(KEEL__EC_MODULE, "ec config: %s", problem);
    return KEEL_EINVAL;
  }
  keel_ec_optimizer optimizer = keel__ec_config_optimizer(config);
  size_t block_bytes = 0, dense_block_bytes = 0;
  status = keel_ec_row_block_bytes(&optimizer, (int)config->dim, &block_bytes);
  if (status == KEEL_OK && config->dense_count > 0)
    status = keel_ec_row_block_bytes(&optimizer, (int)config->dense_count, &dense_block_bytes);
  if (status != KEEL_OK) return status;
  keel__ec_limits limits = {
      .dim = config->dim,
      .block_bytes = block_bytes,
      .total_rows = config->total_rows,
      .groups = groups_of(config->total_rows, config->data_blocks),
      .data_blocks = config->data_blocks,
      .parity_blocks = config->parity_blocks,
      .dense_count = config->dense_count,
      .dense_block_bytes = dense_block_bytes,
      .max_count = max_count,
  };
  status = keel__ec_limits_check(&limits);
  if (status != KEEL_OK) return status;
  *limits_p = limits;
  return KEEL_OK;
}
