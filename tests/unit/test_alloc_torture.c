/* Allocation-failure torture (curl's and SQLite's habit): each target operation runs once to
 * count its allocations N, then N times more with the n-th refused (test_alloc.h); every run
 * must end in the status its contract gives, hold no memory afterwards and not crash.
 * Targets, one table entry each: the store codec, frames received on a link, the manifest,
 * communicator creation and the runtime's context. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "keel/ckpt.h"
#include "keel/comm.h"
#include "keel/net.h"
#include "keel/store.h"
#include "net/net_internal.h"
#include "store/store_internal.h"
#include "test_alloc.h"

#define MIB ((size_t)1 << 20)
#define SECONDS(n) ((int64_t)1000000000 * (n))

/* ---- the harness */

/* One operation under torture. run does it once from scratch and frees all it made,
 * returning its status; it runs armed, so it must allocate only through the operation (its
 * inputs come from prepare, which runs unarmed, and are freed by release). An allocation
 * failure must show as KEEL_ENOMEM: where the operation's contract says it shows otherwise,
 * run checks that contract and turns it into KEEL_ENOMEM. */
typedef struct torture_target {
  const char *name;
  void *(*prepare)(void); /* NULL: run gets NULL */
  keel_status (*run)(void *input);
  void (*release)(void *input);
  bool allocates; /* false: the operation must allocate nothing at all */
} torture_target;

/* Runs the target armed, with the fail_at-th allocation refused (0: none). */
static keel_status torture_run_once(const torture_target *target, void *input, long fail_at) {
  keel_test_alloc_fail_at(fail_at);
  keel_test_alloc_arm();
  keel_status status = target->run(input);
  keel_test_alloc_disarm();
  return status;
}

/* The leak check: every block the run allocated is freed (fail_at 0: no failure). */
static void torture_check_live(const torture_target *target, long expected, long fail_at) {
  long left = keel_test_alloc_live() - expected;
  if (left != 0)
    fail_msg("%s with allocation %ld refused (0: none): %ld blocks left allocated", target->name,
             fail_at, left);
}

/* What one cmocka test of a target holds: the target and the inputs its prepare made. */
typedef struct torture_fixture {
  const torture_target *target;
  void *input;
} torture_fixture;

static int torture_setup(void **state) {
  torture_fixture *fixture = calloc(1, sizeof *fixture);
  assert_non_null(fixture);
  fixture->target = *state;
  fixture->input = fixture->target->prepare != NULL ? fixture->target->prepare() : NULL;
  *state = fixture;
  return 0;
}

/* Runs after a failed assertion too, so that LeakSanitizer reports only what keel leaked. */
static int torture_teardown(void **state) {
  torture_fixture *fixture = *state;
  keel_test_alloc_reset();
  if (fixture->target->release != NULL) fixture->target->release(fixture->input);
  free(fixture);
  return 0;
}

static void test_torture(void **state) {
  const torture_fixture *fixture = *state;
  const torture_target *target = fixture->target;
  void *input = fixture->input;
  long live_before = keel_test_alloc_live();

  keel_status status = torture_run_once(target, input, 0);
  long total = keel_test_alloc_count();
  if (status != KEEL_OK) fail_msg("%s: %s with no failure", target->name, keel_status_name(status));
  torture_check_live(target, live_before, 0);
  if (target->allocates && total == 0) fail_msg("%s: counted no allocation", target->name);
  if (!target->allocates && total != 0)
    fail_msg("%s: must allocate nothing, made %ld allocations", target->name, total);
  print_message("%s: %ld allocations\n", target->name, total);

  for (long n = 1; n <= total; n++) {
    status = torture_run_once(target, input, n);
    /* A run that never reached allocation n would prove nothing: the count must not vary. */
    if (!keel_test_alloc_failed())
      fail_msg("%s: allocation %ld of %ld was never made", target->name, n, total);
    if (status != KEEL_ENOMEM)
      fail_msg("%s with allocation %ld of %ld refused: %s, not KEEL_ENOMEM", target->name, n, total,
               keel_status_name(status));
    torture_check_live(target, live_before, n);
  }

  /* Every failure left the operation as usable as before. */
  status = torture_run_once(target, input, 0);
  assert_int_equal(status, KEEL_OK);
  assert_int_equal(keel_test_alloc_count(), total);
  torture_check_live(target, live_before, 0);
}

/* A run's own finding that the operation's output is wrong (not an allocation failure):
 * said once, with the status the harness then reports. */
static keel_status torture_wrong(const char *what, long index) {
  print_error("wrong result: %s (item %ld)\n", what, index);
  return KEEL_ECORRUPT;
}

/* Bytes that differ at every offset, so a shifted or mixed-up payload shows. */
static void pattern_fill(uint8_t *data, size_t length, uint64_t seed) {
  keel_random random;
  keel_random_seed(&random, seed);
  for (size_t i = 0; i < length; i++) data[i] = (uint8_t)keel_random_next(&random);
}

/* ---- the store's wire format */

#define STORE_VALUE_BYTES 70000
#define STORE_ENTRIES 5

typedef struct store_input {
  uint8_t value[STORE_VALUE_BYTES]; /* what the requests and entries carry, by prefix */
  keel_buffer encoded;              /* what the decoding targets read */
} store_input;

/* Requests of every shape, growing so that the buffer they share grows several times. */
static const keel__store_request store_requests[] = {
    {.op = KEEL__STORE_OP_GET, .id = 1, .key = "config/world", .key_length = 12},
    {.op = KEEL__STORE_OP_PUT,
     .id = 2,
     .key = "rank/00000003",
     .key_length = 13,
     .value_length = 200,
     .lease = 7},
    {.op = KEEL__STORE_OP_LIST, .id = 3, .key = "rank/", .key_length = 5},
    {.op = KEEL__STORE_OP_CAS,
     .id = 4,
     .key = "decide/00000001",
     .key_length = 15,
     .value_length = 3000,
     .revision = 5},
    {.op = KEEL__STORE_OP_LEASE_GRANT, .id = 5, .duration_ns = SECONDS(1)},
    {.op = KEEL__STORE_OP_PUT, .id = 6, .key = "state/big", .key_length = 9, .value_length = 40000},
};
#define STORE_REQUEST_COUNT (sizeof store_requests / sizeof store_requests[0])
#define STORE_DECODED_REQUEST 3 /* the cas: every field in use */

/* Entries of a list response: an empty value, then larger and larger ones. */
static const size_t store_entry_lengths[STORE_ENTRIES] = {0, 10, 300, 5000, STORE_VALUE_BYTES};

static void *store_prepare(void) {
  store_input *input = calloc(1, sizeof *input);
  assert_non_null(input);
  pattern_fill(input->value, sizeof input->value, 11);
  keel_buffer_init(&input->encoded, KEEL__STORE_RESPONSE_BUFFER_MAX);
  return input;
}

static void store_release(void *argument) {
  store_input *input = argument;
  keel_buffer_free(&input->encoded);
  free(input);
}

static keel__store_request store_request(const store_input *input, size_t index) {
  keel__store_request request = store_requests[index];
  if (request.value_length > 0) request.value = input->value;
  return request;
}

/* The requests encoded one after the other into one buffer, emptied between them the way a
 * client reuses its buffer. */
static keel_status store_encode_run(void *argument) {
  store_input *input = argument;
  keel_buffer buffer;
  keel_buffer_init(&buffer, KEEL__STORE_REQUEST_BUFFER_MAX);
  keel_status status = KEEL_OK;
  for (size_t i = 0; i < STORE_REQUEST_COUNT && status == KEEL_OK; i++) {
    keel_buffer_reset(&buffer);
    keel__store_request request = store_request(input, i);
    status = keel__store_request_encode(&request, &buffer);
    if (status == KEEL_OK && buffer.length != KEEL__STORE_REQUEST_HEADER_BYTES +
                                                  request.key_length + request.value_length)
      status = torture_wrong("encoded request length", (long)i);
  }
  keel_buffer_free(&buffer);
  return status;
}

static keel_status store_response_build(const store_input *input, keel_buffer *buffer) {
  keel_status status =
      keel__store_response_begin(buffer, KEEL__STORE_OP_LIST, 9, KEEL_OK, 12, 0, STORE_ENTRIES);
  for (size_t i = 0; i < STORE_ENTRIES && status == KEEL_OK; i++) {
    char key[16];
    int key_length = snprintf(key, sizeof key, "rank/%zu", i);
    status = keel__store_response_add_entry(buffer, key, (size_t)key_length, input->value,
                                            store_entry_lengths[i], 100 + i, (int64_t)i);
  }
  return status;
}

static keel_status store_response_build_run(void *argument) {
  store_input *input = argument;
  keel_buffer buffer;
  keel_buffer_init(&buffer, KEEL__STORE_RESPONSE_BUFFER_MAX);
  keel_status status = store_response_build(input, &buffer);
  keel__store_response response;
  if (status == KEEL_OK &&
      (keel__store_response_decode(buffer.data, buffer.length, &response) != KEEL_OK ||
       response.entry_count != STORE_ENTRIES))
    status = torture_wrong("built response does not decode", 0);
  keel_buffer_free(&buffer);
  return status;
}

static void *store_response_prepare(void) {
  store_input *input = store_prepare();
  assert_int_equal(store_response_build(input, &input->encoded), KEEL_OK);
  return input;
}

static keel_status store_entries_check(const store_input *input, const keel_store_entry *entries) {
  for (size_t i = 0; i < STORE_ENTRIES; i++) {
    char key[16];
    snprintf(key, sizeof key, "rank/%zu", i);
    const keel_store_entry *entry = &entries[i];
    if (strcmp(entry->key, key) != 0 || entry->value_length != store_entry_lengths[i] ||
        memcmp(entry->value, input->value, entry->value_length) != 0 ||
        entry->value[entry->value_length] != '\0' || entry->revision != 100 + i ||
        entry->lease != (int64_t)i)
      return torture_wrong("decoded entry", (long)i);
  }
  return KEEL_OK;
}

/* What a client does with a list response: check it, then copy its entries out. */
static keel_status store_response_decode_run(void *argument) {
  store_input *input = argument;
  keel__store_response response;
  keel_status status =
      keel__store_response_decode(input->encoded.data, input->encoded.length, &response);
  if (status != KEEL_OK) return status;
  if (response.entry_count != STORE_ENTRIES) return torture_wrong("entry count", 0);
  keel_store_entry *entries = NULL;
  status = keel__store_response_entries(&response, &entries);
  if (status != KEEL_OK) return status;
  status = store_entries_check(input, entries);
  keel_store_entries_free(entries, response.entry_count);
  return status;
}

static void *store_request_prepare(void) {
  store_input *input = store_prepare();
  keel__store_request request = store_request(input, STORE_DECODED_REQUEST);
  assert_int_equal(keel__store_request_encode(&request, &input->encoded), KEEL_OK);
  return input;
}

/* The server's decode of what a client sent: allocation-free by contract. */
static keel_status store_request_decode_run(void *argument) {
  store_input *input = argument;
  keel__store_request decoded;
  keel_status status =
      keel__store_request_decode(input->encoded.data, input->encoded.length, &decoded);
  if (status != KEEL_OK) return status;
  keel__store_request sent = store_request(input, STORE_DECODED_REQUEST);
  if (decoded.op != sent.op || decoded.id != sent.id || decoded.revision != sent.revision ||
      decoded.key_length != sent.key_length ||
      memcmp(decoded.key, sent.key, sent.key_length) != 0 ||
      decoded.value_length != sent.value_length ||
      memcmp(decoded.value, sent.value, sent.value_length) != 0)
    return torture_wrong("decoded request", 0);
  return KEEL_OK;
}

/* ---- frames received on a link */

#define FRAME_JOB 0x0123456789abcdefull

/* How a frame is received: keel_link_recv; keel_link_recv_progress into a buffer the link
 * allocates; keel_link_recv_progress into the caller's buffer (allocates nothing). */
typedef enum frame_way { FRAME_RECV, FRAME_PROGRESS, FRAME_INTO_CALLER } frame_way;

typedef struct frame_case {
  size_t length;
  frame_way way;
} frame_case;

/* FRAME_RECV frames are small enough to sit whole in the socket's buffer, so the blocking
 * receive needs no sender running beside it; the last frame follows the largest, so a
 * dropped payload anywhere is followed by a frame that must arrive intact. */
static const frame_case frame_cases[] = {
    {0, FRAME_RECV},
    {1, FRAME_RECV},
    {1000, FRAME_RECV},
    {20000, FRAME_RECV}, /* past the staging buffer */
    {0, FRAME_PROGRESS},
    {100000, FRAME_PROGRESS},
    {100000, FRAME_INTO_CALLER},
    {2 * MIB, FRAME_PROGRESS}, /* the huge-page aligned_alloc path */
    {3 * MIB + 5, FRAME_PROGRESS},
    {64, FRAME_RECV},
};
#define FRAME_COUNT (sizeof frame_cases / sizeof frame_cases[0])
#define FRAME_PATTERN_BYTES (3 * MIB + 5 + FRAME_COUNT)
#define FRAME_CALLER_BYTES 100000

typedef struct frame_input {
  uint8_t *pattern;     /* frame i carries pattern + i */
  uint8_t *destination; /* the caller's buffer of FRAME_INTO_CALLER frames */
} frame_input;

static void *frame_prepare(void) {
  frame_input *input = calloc(1, sizeof *input);
  assert_non_null(input);
  input->pattern = malloc(FRAME_PATTERN_BYTES);
  input->destination = malloc(FRAME_CALLER_BYTES);
  assert_non_null(input->pattern);
  assert_non_null(input->destination);
  pattern_fill(input->pattern, FRAME_PATTERN_BYTES, 12);
  return input;
}

static void frame_release(void *argument) {
  frame_input *input = argument;
  free(input->pattern);
  free(input->destination);
  free(input);
}

/* A link over fd in the state the handshake leaves it in (auth.c, handshake_done): data
 * frames from peer_id, up to the default bound. Takes over fd, as keel__link_create does. */
static keel_status frame_link_open(int fd, uint32_t local_id, uint32_t peer_id,
                                   keel_link **link_p) {
  keel_auth auth = {.job_id = FRAME_JOB, .local_id = local_id};
  keel_link *link = NULL;
  keel_status status = keel__link_create(fd, &auth, "socketpair", &link);
  if (status != KEEL_OK) return status;
  link->peer_id = peer_id;
  link->handshaking = false;
  link->max_payload = KEEL_FRAME_DEFAULT_MAX_PAYLOAD;
  *link_p = link;
  return KEEL_OK;
}

/* The one frame a recv_progress sink is waiting for. */
typedef struct frame_catch {
  void *destination; /* NULL: the link allocates */
  bool done;
  keel_status status;
  keel_frame frame;
  void *payload;
} frame_catch;

static void *frame_catch_destination(void *context, keel_link *link, const keel_frame *frame) {
  frame_catch *catch = context;
  return catch->destination;
}

static void frame_catch_complete(void *context, keel_link *link, const keel_frame *frame,
                                 void *payload, keel_status status) {
  frame_catch *catch = context;
  catch->done = true;
  catch->status = status;
  catch->frame = *frame;
  catch->payload = payload;
}

static keel_status frame_check(const frame_input *input, size_t index, const keel_frame *frame,
                               const void *payload) {
  size_t length = frame_cases[index].length;
  if (frame->type != KEEL_FRAME_DATA || frame->tag != index || frame->length != length ||
      (length > 0 && memcmp(payload, input->pattern + index, length) != 0))
    return torture_wrong("received frame", (long)index);
  return KEEL_OK;
}

/* Drives both ends on this thread until the receiver's sink has the frame. */
static keel_status frame_pump(keel_link *sender, keel_link *receiver, frame_catch *catch) {
  keel_link_sink sink = {frame_catch_destination, frame_catch_complete, catch};
  int64_t deadline_ns = keel_deadline_after_ns(SECONDS(10));
  while (!catch->done) {
    keel_status status = keel_link_send_progress(sender);
    if (status != KEEL_OK && status != KEEL_EAGAIN) return status;
    status = keel_link_recv_progress(receiver, &sink);
    if (status != KEEL_OK && status != KEEL_EAGAIN) return status;
    if (keel_now_ns() > deadline_ns) return KEEL_ETIMEDOUT;
  }
  return keel_link_send_busy(sender) ? torture_wrong("send still busy", (long)catch->frame.tag)
                                     : KEEL_OK;
}

/* Sends frame index and receives it its way. A payload the link could not allocate is the
 * contract's KEEL_ENOMEM of that frame alone (counted in *dropped_p): the stream stays in
 * step. */
static keel_status frame_transfer(const frame_input *input, keel_link *sender, keel_link *receiver,
                                  size_t index, size_t *dropped_p) {
  const frame_case *which = &frame_cases[index];
  keel_frame frame = {.type = KEEL_FRAME_DATA, .epoch = 1, .tag = index};
  keel_status status = keel_link_send_begin(sender, &frame, input->pattern + index, which->length);
  if (status != KEEL_OK) return status;
  keel_frame got = {0};
  void *payload = NULL;
  if (which->way == FRAME_RECV) {
    if (keel_link_send_progress(sender) != KEEL_OK)
      return torture_wrong("send not done", (long)index);
    status = keel_link_recv(receiver, &got, &payload, keel_deadline_after_ns(SECONDS(10)));
  } else {
    frame_catch catch = {.destination =
                             which->way == FRAME_INTO_CALLER ? input->destination : NULL};
    status = frame_pump(sender, receiver, &catch);
    if (status == KEEL_OK) status = catch.status;
    got = catch.frame;
    payload = catch.payload;
  }
  /* Only a payload the link allocates can be dropped, and then nothing is handed over. */
  bool droppable = which->length > 0 && which->way != FRAME_INTO_CALLER;
  if (status == KEEL_ENOMEM && droppable && payload == NULL) {
    (*dropped_p)++;
    return KEEL_OK;
  }
  if (status == KEEL_ENOMEM) status = torture_wrong("KEEL_ENOMEM not from a payload", (long)index);
  if (status == KEEL_OK) status = frame_check(input, index, &got, payload);
  if (payload != input->destination) free(payload);
  return status;
}

/* A fresh pair of links, every frame of frame_cases through it, then both closed. */
static keel_status frame_run(void *argument) {
  const frame_input *input = argument;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0)
    return keel_status_from_errno(errno);
  keel_link *sender = NULL;
  keel_link *receiver = NULL;
  keel_status status = frame_link_open(fds[0], 1, 2, &sender);
  if (status != KEEL_OK) goto fail_close_fd;
  /* fds[1] passes to the receiver here, closed by it even when it cannot be made. */
  status = frame_link_open(fds[1], 2, 1, &receiver);
  if (status != KEEL_OK) goto fail_close_sender;
  size_t dropped = 0;
  for (size_t i = 0; i < FRAME_COUNT && status == KEEL_OK; i++)
    status = frame_transfer(input, sender, receiver, i, &dropped);
  keel_link_close(receiver);
  keel_link_close(sender);
  /* One refused allocation drops one payload; a link that stayed broken would drop more. */
  if (status == KEEL_OK && dropped > 1) status = torture_wrong("payloads dropped", (long)dropped);
  if (status == KEEL_OK && dropped == 1) status = KEEL_ENOMEM;
  return status;

fail_close_sender:
  keel_link_close(sender);
  return status;

fail_close_fd:
  close(fds[1]);
  return status;
}

/* ---- the checkpoint manifest */

#define MANIFEST_CHUNK_BYTES 256

typedef struct manifest_input {
  uint8_t weights[1000];
  uint8_t empty[1]; /* registered with 0 bytes */
  uint64_t step;
  uint8_t odd[37];
  uint8_t big[5000];
  keel_ckpt_identity identity;
  keel_ckpt_manifest expected; /* built unarmed */
  uint8_t *encoded;
  size_t encoded_length;
} manifest_input;

/* The manifest of input's state, through a registry made for it and destroyed after. The
 * only code here that names the registry, so that a change to its type is one place. */
static keel_status manifest_of_state(const manifest_input *input, keel_ckpt_manifest *manifest_p) {
  keel_registry *registry = NULL;
  keel_status status = keel_registry_create(&registry);
  if (status != KEEL_OK) return status;
  /* The registry writes no registered byte: the casts only meet its signature. */
  struct {
    const char *name;
    const void *data;
    size_t bytes;
  } const buffers[] = {{"weights", input->weights, sizeof input->weights},
                       {"adam.m", input->empty, 0},
                       {"step", &input->step, sizeof input->step},
                       {"odd", input->odd, sizeof input->odd},
                       {"big", input->big, sizeof input->big}};
  for (size_t i = 0; i < sizeof buffers / sizeof buffers[0] && status == KEEL_OK; i++)
    status =
        keel_registry_add(registry, buffers[i].name, (void *)buffers[i].data, buffers[i].bytes);
  if (status == KEEL_OK)
    status = keel_ckpt_manifest_build(registry, &input->identity, MANIFEST_CHUNK_BYTES, manifest_p);
  keel_registry_destroy(registry);
  return status;
}

static void *manifest_prepare(void) {
  manifest_input *input = calloc(1, sizeof *input);
  assert_non_null(input);
  pattern_fill(input->weights, sizeof input->weights, 13);
  pattern_fill(input->odd, sizeof input->odd, 14);
  pattern_fill(input->big, sizeof input->big, 15);
  input->step = 1234;
  input->identity = (keel_ckpt_identity){.job_id = 41,
                                         .rank = 3,
                                         .shard_index = 1,
                                         .shard_count = 2,
                                         .replica = 1,
                                         .step = 1234,
                                         .sequence = 2};
  assert_int_equal(manifest_of_state(input, &input->expected), KEEL_OK);
  assert_true(input->expected.buffer_count == 5 && input->expected.chunk_count > 5);
  size_t capacity = keel_ckpt_manifest_encoded_bytes(&input->expected);
  input->encoded = malloc(capacity);
  assert_non_null(input->encoded);
  assert_int_equal(
      keel_ckpt_manifest_encode(&input->expected, input->encoded, capacity, &input->encoded_length),
      KEEL_OK);
  return input;
}

static void manifest_release(void *argument) {
  manifest_input *input = argument;
  keel_ckpt_manifest_free(&input->expected);
  free(input->encoded);
  free(input);
}

static keel_status manifest_check_same(const keel_ckpt_manifest *got,
                                       const keel_ckpt_manifest *expected) {
  const keel_ckpt_identity *a = &got->identity;
  const keel_ckpt_identity *b = &expected->identity;
  if (a->job_id != b->job_id || a->rank != b->rank || a->shard_index != b->shard_index ||
      a->shard_count != b->shard_count || a->replica != b->replica || a->step != b->step ||
      a->sequence != b->sequence || got->chunk_bytes != expected->chunk_bytes ||
      got->total_bytes != expected->total_bytes || got->buffer_count != expected->buffer_count ||
      got->chunk_count != expected->chunk_count ||
      memcmp(got->buffers, expected->buffers, got->buffer_count * sizeof *got->buffers) != 0 ||
      memcmp(got->chunk_crc32c, expected->chunk_crc32c,
             got->chunk_count * sizeof *got->chunk_crc32c) != 0)
    return torture_wrong("manifest", 0);
  return KEEL_OK;
}

static keel_status manifest_build_run(void *argument) {
  const manifest_input *input = argument;
  keel_ckpt_manifest manifest = {0};
  keel_status status = manifest_of_state(input, &manifest);
  if (status == KEEL_OK) status = manifest_check_same(&manifest, &input->expected);
  keel_ckpt_manifest_free(&manifest);
  return status;
}

static keel_status manifest_decode_run(void *argument) {
  const manifest_input *input = argument;
  keel_ckpt_manifest manifest = {0};
  keel_status status = keel_ckpt_manifest_decode(input->encoded, input->encoded_length, &manifest);
  if (status == KEEL_OK) status = manifest_check_same(&manifest, &input->expected);
  keel_ckpt_manifest_free(&manifest);
  return status;
}

/* ---- communicator creation: an endpoint of a world of one, its first communicator, a
 * shrink (the agreement's decision and the next epoch's communicator) and an allreduce on
 * it; and the runtime's whole context (keel_init without a launcher: registry, steps,
 * recovery, state sources, fault plan, endpoint, world). An endpoint linked with others
 * starts threads (acceptor, store server) whose allocations would race the count: the
 * world of one walks the same creation code without them. */
static keel_status comm_create_run(void *argument) {
  (void)argument;
  keel_endpoint_config config = {.uid = 0, .failure_detection = true};
  keel_endpoint *endpoint = NULL;
  keel_status status = keel_endpoint_create(&config, &endpoint);
  if (status != KEEL_OK) return status;
  uint32_t only = 0;
  keel_comm *comm = NULL, *shrunk = NULL;
  status = keel_comm_create(endpoint, 0, &only, 1, KEEL_NO_DEADLINE, &comm);
  if (status == KEEL_OK) status = keel_comm_shrink(comm, &shrunk);
  float in[4] = {1, 2, 3, 4}, out[4] = {0};
  if (status == KEEL_OK) status = keel_comm_allreduce(shrunk, in, out, 4, KEEL_F32, KEEL_SUM);
  if (status == KEEL_OK && (keel_comm_epoch(shrunk) != 1 || out[3] != 4.0f))
    status = torture_wrong("shrunk communicator", 0);
  keel_endpoint_close(endpoint, 0);
  return status;
}

static void *runtime_prepare(void) {
  unsetenv("KEEL_STORE");
  unsetenv("KEEL_FAULT");
  return NULL;
}

static keel_status runtime_init_run(void *argument) {
  (void)argument;
  keel_ctx *ctx = NULL;
  keel_status status = keel_init(&ctx);
  if (status != KEEL_OK) return status;
  uint64_t step = 0;
  status = keel_state_register(ctx, "step", &step, sizeof step);
  if (status == KEEL_OK && keel_comm_size(keel_world(ctx)) != 1)
    status = torture_wrong("world of one", 0);
  keel_finalize(ctx);
  return status;
}

/* ---- the targets: one entry each, one cmocka test each. */
static const torture_target targets[] = {
    {"store_request_encode", store_prepare, store_encode_run, store_release, true},
    {"store_response_build", store_prepare, store_response_build_run, store_release, true},
    {"store_response_decode_entries", store_response_prepare, store_response_decode_run,
     store_release, true},
    {"store_request_decode", store_request_prepare, store_request_decode_run, store_release, false},
    {"link_recv_frames", frame_prepare, frame_run, frame_release, true},
    {"ckpt_manifest_build", manifest_prepare, manifest_build_run, manifest_release, true},
    {"ckpt_manifest_decode", manifest_prepare, manifest_decode_run, manifest_release, true},
    {"comm_create", NULL, comm_create_run, NULL, true},
    {"runtime_init", runtime_prepare, runtime_init_run, NULL, true},
};
#define TARGET_COUNT (sizeof targets / sizeof targets[0])

int main(void) {
  struct CMUnitTest tests[TARGET_COUNT];
  for (size_t i = 0; i < TARGET_COUNT; i++)
    tests[i] = (struct CMUnitTest){.name = targets[i].name,
                                   .test_func = test_torture,
                                   .setup_func = torture_setup,
                                   .teardown_func = torture_teardown,
                                   .initial_state = (void *)&targets[i]};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
