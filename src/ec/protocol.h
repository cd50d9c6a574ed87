/* Private to src/ec: the payloads that parameter servers and their clients exchange in
 * KEEL_FRAME_EC_REQUEST / EC_REPLY frames (the reply's frame tag echoes the request's). A pure,
 * allocation-free encoder and a strict decoder: the decoder is the servers' security boundary. */
#ifndef KEEL_EC_PROTOCOL_H
#define KEEL_EC_PROTOCOL_H

#include "keel/ec.h"

/* ---- the format, version 1. Little-endian, f32 as IEEE binary32 bits; sizes in bytes.
 * Both sides know the limits (keel__ec_limits, from the server's configuration: INFO).
 *
 * Request: header  op u16 | flags u16 | count u32 | id u64,  then the body of the op:
 *   op                   id      flags        count      body
 *    1 INFO              0       -            0          -
 *    2 PULL_ROWS         0       ACTING       rows       step u64 | rows u64[count]
 *    3 PUSH_ROWS         update  ACTING|AGAIN rows       step u64 | worker u32 | workers u32 |
 *                                                        [ACTING: routed u64] |
 *                                                        [AGAIN: lost u32[r], 0 to 8-align] |
 *                                                        rows u64[count] | f32[count * dim]
 *    4 READ_BLOCKS       0       VERSIONED    refs       block refs[count]
 *    5 WRITE_BLOCKS      0       -            refs       block refs[count] |
 *                                                        count * block_bytes
 *    6 PARITY_PREPARE    update  APPLY_NOW    refs       delta refs[count] |
 *                                                        count * block_bytes of deltas
 *    7 PARITY_COMMIT     update  ABORT|QUERY  0          -
 *    8 PULL_DENSE        0       -            floats     offset u64
 *    9 PUSH_DENSE        update  -            dense      step u64 | worker u32 | workers u32 |
 *                                                        f32[count]
 *   10 INIT_DENSE        0       -            dense      f32[count]
 *   11 READ_DENSE_BLOCK  0       VERSIONED    0          -
 *   12 WRITE_DENSE_BLOCK 0       -            0          step u64 | dense_block_bytes
 * A block ref is  group u64 | member u32 | zero u32  (member < k + r, keel/ec.h's placement);
 * a delta ref  group u64 | data_member u32 | parity_member u32  (data_member < k <=
 * parity_member < k + r): the change of that data block, for that parity block; or
 * parity_member = data_member: for the data block itself (a rebuilding server's copy of a
 * lost row). WRITE_DENSE_BLOCK's block is the dense block as its other holder left it after
 * applying step's update (a rebuilding replica's copy), kept unless the one held is newer.
 * Flag bit 0
 * (ACTING, VERSIONED, APPLY_NOW, ABORT) and bit 1 (QUERY, AGAIN) are the only flags, only where
 * shown (AGAIN only with ACTING); AGAIN's lost servers are r slots (r = parity_blocks), each a
 * server index below 2^30 or KEEL__EC_NO_SERVER, the unused ones last; ACTING's routed is
 * keel__ec_routed_digest of the lost servers the push was routed around; an
 * update id is non-zero, every other id zero. Counts: "rows" and "refs" are at most max_count, any
 * from 0; "dense" is exactly dense_count; "floats" is what PULL_DENSE wants, offset + count <=
 * dense_count; dense ops are refused when dense_count is 0. Rows are < total_rows and strictly
 * increasing (one order, no duplicates); groups < groups; worker < workers. The payload is exactly
 * the header and the body: no trailing bytes. Every array starts 8-aligned given an 8-aligned
 * payload.
 *
 * Reply: header  op u16 (the request's) | flags u16 (0) | status i32 (keel_status) |
 * body_bytes u64,  then body_bytes bytes. A reply whose status is not KEEL_OK has no body; an
 * OK one has exactly keel__ec_reply_body_bytes of its request:
 *   INFO: the configuration (below); PULL_ROWS: f32[count * dim] in the request's row order;
 *   READ_BLOCKS: count * block_bytes in ref order; VERSIONED: each block followed by its k
 *   stamps, u64 each (keel__ec_shard's: 1 + the step of the last change from each data
 *   member; a data block's own at its member's place, 0 elsewhere); PULL_DENSE: f32[count];
 *   READ_DENSE_BLOCK: dense_block_bytes, VERSIONED: then its stamp u64 (1 + the step of the
 *   last update applied to it); the others: nothing.
 *
 * Configuration (INFO's reply body), KEEL__EC_CONFIG_BYTES:
 *    0 version u32 (1) | servers u32 | data_blocks u32 | parity_blocks u32 | dim u32 |
 *   20 optimizer_kind u32 | learning_rate, momentum, epsilon, initial_accumulator, beta1,
 *      beta2 f32 (those the kind does not use are 0) |
 *   48 total_rows u64 | dense_count u64 | seed u64 |
 *   72 workers u32 | options u32 | init_scale f32 | zero u32 */
#define KEEL__EC_PROTOCOL_VERSION 1
#define KEEL__EC_REQUEST_HEADER_BYTES 16
#define KEEL__EC_REPLY_HEADER_BYTES 16
#define KEEL__EC_CONFIG_BYTES 88

/* The format's arrays are read in place (keel__ec_request points into the payload). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "the ec protocol reads little-endian arrays in place");
_Static_assert(sizeof(float) == 4, "the ec protocol sends f32 values as they are in memory");

typedef enum keel__ec_op {
  KEEL__EC_OP_INFO = 1,
  KEEL__EC_OP_PULL_ROWS = 2,
  KEEL__EC_OP_PUSH_ROWS = 3,
  KEEL__EC_OP_READ_BLOCKS = 4,
  KEEL__EC_OP_WRITE_BLOCKS = 5,
  KEEL__EC_OP_PARITY_PREPARE = 6,
  KEEL__EC_OP_PARITY_COMMIT = 7,
  KEEL__EC_OP_PULL_DENSE = 8,
  KEEL__EC_OP_PUSH_DENSE = 9,
  KEEL__EC_OP_INIT_DENSE = 10,
  KEEL__EC_OP_READ_DENSE_BLOCK = 11,
  KEEL__EC_OP_WRITE_DENSE_BLOCK = 12,
} keel__ec_op;

/* PULL_ROWS, PUSH_ROWS: rows of lost servers, which the server decodes as the groups' acting
 * parity holder, rather than its own rows. */
#define KEEL__EC_FLAG_ACTING 1u
/* READ_BLOCKS: each block with its stamps, read together under its lock (a rebuild checks
 * that the blocks it decodes from are of the same steps); READ_DENSE_BLOCK: the block with
 * its stamp. */
#define KEEL__EC_FLAG_VERSIONED 1u
/* PARITY_PREPARE: fold the deltas at once, no commit follows (two-phase commit off). */
#define KEEL__EC_FLAG_APPLY_NOW 1u
/* PARITY_COMMIT: drop the prepared deltas of the update instead of folding them. */
#define KEEL__EC_FLAG_ABORT 1u
/* PARITY_COMMIT: change nothing, answer in the status what the holder has of the update:
 * KEEL_OK committed, KEEL_EAGAIN prepared, KEEL_ENOTFOUND nothing (or aborted). What a
 * parity holder asks the others before it decides an update whose server was lost. */
#define KEEL__EC_FLAG_QUERY 2u
/* PARITY_COMMIT: a decider's verdict on an update whose server was lost, which a holder takes
 * even after it answered a QUERY; the origin's own commit (no VERDICT) it refuses then with
 * KEEL_ECANCELED, since a decider may have aborted the update meanwhile (finding 58). */
#define KEEL__EC_FLAG_VERDICT 4u
/* PUSH_ROWS with ACTING: a second round of a synchronous step's phase 2, which names the
 * servers whose loss in the round before sent it (again_lost): a holder answers it at once
 * when each of them had applied that round (RELIABILITY.md, findings 47 and 48). */
#define KEEL__EC_FLAG_AGAIN 2u
/* An unused slot of again_lost. */
#define KEEL__EC_NO_SERVER UINT32_MAX

/* keel__ec_config.options */
#define KEEL__EC_OPTION_TWO_PHASE_COMMIT 1u
#define KEEL__EC_OPTION_DENSE_REPLICATED 2u /* dense parameters on two servers */
#define KEEL__EC_OPTION_NO_PARITY 4u        /* no fault tolerance: the benchmarks' baseline */

/* What both sides know, derived from the configuration (keel__ec_config_limits). */
typedef struct keel__ec_limits {
  uint32_t dim;               /* floats per embedding row (1 .. KEEL_EC_ROW_MAX_DIM) */
  uint64_t block_bytes;       /* bytes of a row block (row + optimizer state) */
  uint64_t total_rows;        /* embedding rows of all tables, numbered from 0 */
  uint64_t groups;            /* ceil(total_rows / k) */
  uint32_t data_blocks;       /* k */
  uint32_t parity_blocks;     /* r */
  uint64_t dense_count;       /* dense parameters (floats), 0 when none */
  uint64_t dense_block_bytes; /* bytes of the dense block (parameters + state), 0 when none */
  uint32_t max_count;         /* most rows or refs one request may carry */
} keel__ec_limits;

/* KEEL_OK when the limits are consistent: 1 <= dim <= KEEL_EC_ROW_MAX_DIM; block_bytes a
 * multiple of 8, at least 4 * dim, under 2^31; total_rows >= 1 and groups = ceil(total_rows /
 * k); k, r >= 1 and k + r <= KEEL_EC_MAX_BLOCKS; dense_count <= KEEL_EC_ROW_MAX_DIM and
 * dense_block_bytes 0 with it or, like block_bytes, for dense_count floats; max_count >= 1.
 * KEEL_EINVAL, logged with the rule it breaks, otherwise. */
keel_status keel__ec_limits_check(const keel__ec_limits *limits);

/* A block ref (other = 0) or a delta ref (member = data member, other = parity member). */
typedef struct keel__ec_ref {
  uint64_t group;
  uint32_t member;
  uint32_t other;
} keel__ec_ref;
_Static_assert(sizeof(keel__ec_ref) == 16, "a ref is its 16 bytes on the wire");

/* A request. A decoded one points into the payload it came from (no copy): rows (PULL_ROWS,
 * PUSH_ROWS), refs (READ_BLOCKS, WRITE_BLOCKS, PARITY_PREPARE), values (the gradients of
 * PUSH_ROWS and PUSH_DENSE, INIT_DENSE's values) and blocks (WRITE_BLOCKS, PARITY_PREPARE,
 * WRITE_DENSE_BLOCK); fields and arrays the op does not have are 0 and NULL. To encode, fill
 * what the op has; the rest is ignored. */
typedef struct keel__ec_request {
  uint16_t op; /* keel__ec_op */
  uint16_t flags;
  uint32_t count;
  uint64_t id;
  uint64_t step;   /* PULL_ROWS (the step routed by), PUSH_ROWS, PUSH_DENSE, WRITE_DENSE_BLOCK */
  uint64_t offset; /* PULL_DENSE */
  uint32_t worker, workers;
  const uint32_t *again_lost; /* PUSH_ROWS with AGAIN: r slots (KEEL__EC_NO_SERVER unused) */
  uint64_t routed;            /* PUSH_ROWS with ACTING: keel__ec_routed_digest */
  const uint64_t *rows;
  const keel__ec_ref *refs;
  const float *values;
  const uint8_t *blocks;
} keel__ec_request;

/* A digest of a set of lost servers (lost[i] for i < servers): the servers compare the
 * workers' of one round of a step's phase 2 (RELIABILITY.md, finding 53). FNV-1a over the
 * indexes of the lost ones, so two different sets collide with odds of about 2^-64. */
uint64_t keel__ec_routed_digest(const bool *lost, int servers);

/* Decodes and checks one request payload against the limits, every rule of the format above,
 * reading nothing outside [payload, payload + length); writes *request_p only on success.
 * payload must be 8-aligned (malloc'd buffers are), so that its arrays are read in place.
 * Returns KEEL_EPROTO for a malformed payload (length, op, flags, id, zero fields, row
 * order), KEEL_ERANGE for a count, row, group, member, worker or offset out of the limits,
 * KEEL_EINVAL (not logged) for a NULL or misaligned payload, invalid limits or NULL output.
 * Pure and allocation-free, not logged: the caller decides what a refusal means. */
keel_status keel__ec_request_decode(const uint8_t *payload, size_t length,
                                    const keel__ec_limits *limits, keel__ec_request *request_p);
/* The encoded length of request, 0 when it breaks a rule of the format (what decode would
 * refuse) or an array it needs is NULL. */
size_t keel__ec_request_bytes(const keel__ec_request *request, const keel__ec_limits *limits);
/* Writes request into out (keel__ec_request_bytes of it; capacity at least that), after the
 * checks decode makes, so that nobody sends what a server refuses: KEEL_EPROTO or
 * KEEL_ERANGE as decode would answer; KEEL_EINVAL (not logged) for NULL arguments, a NULL
 * array the op needs, invalid limits or too small a capacity. out must not overlap the
 * request's arrays; any alignment. Allocates nothing. */
keel_status keel__ec_request_encode(const keel__ec_request *request, const keel__ec_limits *limits,
                                    uint8_t *out, size_t capacity);

/* A reply: its op (the request's), the server's answer, and body_bytes of body (in the
 * payload it was decoded from; any alignment, so read it with memcpy). */
typedef struct keel__ec_reply {
  uint16_t op;
  keel_status status;
  uint64_t body_bytes;
  const uint8_t *body;
} keel__ec_reply;

/* The body an OK reply to request carries (the table above). request must be valid (as
 * decode leaves it or encode accepts it); SIZE_MAX, which no reply matches, for one whose
 * size would overflow. */
size_t keel__ec_reply_body_bytes(const keel__ec_request *request, const keel__ec_limits *limits);
/* Writes the reply header of op (echoed as it came, even one unknown), status and the
 * body_bytes that will follow. KEEL_EINVAL (not logged) for a status that is not a
 * keel_status, a non-OK status with a body, or NULL header. */
keel_status keel__ec_reply_encode_header(uint16_t op, keel_status status, uint64_t body_bytes,
                                         uint8_t header[KEEL__EC_REPLY_HEADER_BYTES]);
/* Decodes a reply payload to a request of expected_op whose OK reply has expected_body_bytes
 * (keel__ec_reply_body_bytes): checks the op echo, zero flags, a known status, a length of
 * exactly the header and its body_bytes, an empty body with a non-OK status and
 * expected_body_bytes with KEEL_OK. Returns KEEL_OK with the server's answer in
 * reply_p->status, KEEL_EPROTO for a malformed reply, KEEL_EINVAL for NULL arguments; writes
 * *reply_p only on success. Any alignment; pure, allocation-free, not logged. */
keel_status keel__ec_reply_decode(const uint8_t *payload, size_t length, uint16_t expected_op,
                                  size_t expected_body_bytes, keel__ec_reply *reply_p);

/* The server's configuration: what INFO answers, from which both sides derive the limits. */
typedef struct keel__ec_config {
  uint32_t servers, data_blocks, parity_blocks, dim;
  uint32_t optimizer_kind; /* keel_ec_optimizer_kind */
  float learning_rate, momentum, epsilon, initial_accumulator, beta1, beta2;
  uint64_t total_rows, dense_count, seed;
  uint32_t workers; /* workers of a synchronous job (0: asynchronous) */
  uint32_t options; /* KEEL__EC_OPTION_* */
  float init_scale; /* rows start as keel_ec_row_initial(seed, row, dim, init_scale) */
} keel__ec_config;

/* A configuration is valid when: 1 <= k, 1 <= r, k + r <= min(servers, KEEL_EC_MAX_BLOCKS),
 * servers <= KEEL_MAX_UIDS; 1 <= dim <= KEEL_EC_ROW_MAX_DIM; its optimizer is valid
 * (keel_ec_optimizer_check); 1 <= total_rows; dense_count <= KEEL_EC_ROW_MAX_DIM (the dense
 * block is a row block of dense_count values); workers <= KEEL_MAX_WORLD; no unknown option
 * bit; init_scale finite and >= 0. */

/* Writes config's KEEL__EC_CONFIG_BYTES into out (fields the optimizer kind does not use as
 * 0). KEEL_EPROTO or KEEL_ERANGE for an invalid config, as decode would answer; KEEL_EINVAL
 * for NULL arguments. */
keel_status keel__ec_config_encode(const keel__ec_config *config,
                                   uint8_t out[KEEL__EC_CONFIG_BYTES]);
/* Decodes INFO's reply body (any alignment). KEEL_EPROTO for a wrong length or version, a
 * non-zero zero field or unused optimizer field, an unknown optimizer kind or option bit;
 * KEEL_ERANGE for a number out of range (an invalid optimizer is also logged by
 * keel_ec_optimizer_check); KEEL_EINVAL for NULL arguments. *config_p written only on
 * success. */
keel_status keel__ec_config_decode(const uint8_t *body, size_t length, keel__ec_config *config_p);
/* The optimizer the configuration names. */
keel_ec_optimizer keel__ec_config_optimizer(const keel__ec_config *config);
/* Derives the limits of a valid configuration and max_count (>= 1): block sizes from
 * keel_ec_row_block_bytes, the dense block as a row block of dense_count values. KEEL_EINVAL
 * (logged) for an invalid config or max_count 0; *limits_p written only on success. */
keel_status keel__ec_config_limits(const keel__ec_config *config, uint32_t max_count,
                                   keel__ec_limits *limits_p);

#endif
