/* Unit tests of the net layer over 127.0.0.1: frame encode/decode and each refusal, the
 * mutual handshake (right token, wrong token on either side, raw clients), blocking and
 * non-blocking transfers including full duplex with payloads larger than the socket
 * buffers, detach and abandon mid-frame, and links fed garbage by a peer. Helper threads
 * only record results; every assertion runs on the main thread. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
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
#include <sodium.h>

#include "keel/net.h"

#define MIB ((size_t)1 << 20)
#define SECONDS(n) ((int64_t)(n)*1000000000)

static keel_auth test_auth(uint32_t local_id) {
  keel_auth auth;
  assert_int_equal(keel_auth_generate(&auth), KEEL_OK);
  /* One fixed job for the whole file, so both sides of every pair agree. */
  static const uint8_t token[KEEL_TOKEN_BYTES] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                                  12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                                  23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
  auth.job_id = 0x0123456789abcdefull;
  memcpy(auth.token, token, sizeof token);
  auth.local_id = local_id;
  return auth;
}

static void fill_pattern(uint8_t *data, size_t length, uint64_t seed) {
  keel_random random;
  keel_random_seed(&random, seed);
  size_t i = 0;
  for (; i + 8 <= length; i += 8) {
    uint64_t word = keel_random_next(&random);
    memcpy(data + i, &word, 8);
  }
  for (; i < length; i++) data[i] = (uint8_t)keel_random_next(&random);
}

/* A malloc'ed buffer of length bytes of fill_pattern(seed). */
static uint8_t *pattern_new(size_t length, uint64_t seed) {
  uint8_t *data = malloc(length);
  assert_non_null(data);
  fill_pattern(data, length, seed);
  return data;
}

/* ---- a connector on a helper thread */

typedef struct connector {
  pthread_t thread;
  char address[64];
  keel_auth auth;
  int64_t deadline_ns;
  int64_t start_delay_ns;
  keel_status status;
  keel_link *link;
} connector;

static void *connector_main(void *argument) {
  connector *job = argument;
  if (job->start_delay_ns > 0) {
    struct timespec pause = {0, (long)job->start_delay_ns};
    nanosleep(&pause, NULL);
  }
  job->status = keel_link_connect(job->address, &job->auth, job->deadline_ns, &job->link);
  return NULL;
}

static void connector_start(connector *job, const char *address, keel_auth auth) {
  memset(job, 0, sizeof *job);
  snprintf(job->address, sizeof job->address, "%s", address);
  job->auth = auth;
  job->deadline_ns = keel_deadline_after_ns(SECONDS(10));
  job->link = NULL;
  assert_int_equal(pthread_create(&job->thread, NULL, connector_main, job), 0);
}

static void connector_join(connector *job) { pthread_join(job->thread, NULL); }

/* One handshake on listener: a helper thread connects with connector_auth while this one
 * accepts with acceptor_auth. Returns the acceptor's verdict; *job holds the connector's
 * (job->status, job->link) and *accepted_p the accepted link, NULL if none. */
static keel_status handshake(keel_listener *listener, keel_auth acceptor_auth,
                             keel_auth connector_auth, connector *job, keel_link **accepted_p) {
  connector_start(job, keel_listener_address(listener), connector_auth);
  *accepted_p = NULL;
  keel_status status = keel_listener_accept(listener, &acceptor_auth,
                                            keel_deadline_after_ns(SECONDS(10)), accepted_p);
  connector_join(job);
  return status;
}

/* A connected, authenticated pair of links. */
typedef struct link_pair {
  keel_link *connected; /* uid 1 */
  keel_link *accepted;  /* uid 2 */
} link_pair;

static link_pair pair_open(void) {
  keel_listener *listener = NULL;
  assert_int_equal(keel_listener_open("127.0.0.1:0", &listener), KEEL_OK);
  connector job;
  link_pair pair;
  keel_status status = handshake(listener, test_auth(2), test_auth(1), &job, &pair.accepted);
  keel_listener_close(listener);
  assert_int_equal(status, KEEL_OK);
  assert_int_equal(job.status, KEEL_OK);
  pair.connected = job.link;
  return pair;
}

static void pair_close(link_pair *pair) {
  keel_link_close(pair->connected);
  keel_link_close(pair->accepted);
}

/* cmocka fixture of the tests of one pair: *state is a fresh pair, closed after the test. */
static int pair_setup(void **state) {
  static link_pair pair;
  pair = pair_open();
  *state = &pair;
  return 0;
}

static int pair_teardown(void **state) {
  pair_close(*state);
  return 0;
}

/* ---- a blocking sender on a helper thread */

typedef struct sender {
  pthread_t thread;
  keel_link *link;
  keel_frame frame;
  const uint8_t *payload;
  size_t length;
  int64_t deadline_ns;
  keel_status status;
} sender;

static void *sender_main(void *argument) {
  sender *job = argument;
  job->status = keel_link_send(job->link, &job->frame, job->payload, job->length, job->deadline_ns);
  return NULL;
}

/* ---- a sink recording completed frames */

#define SINK_FRAMES 8
typedef struct recording_sink {
  uint8_t *destination; /* NULL: the link allocates */
  size_t capacity;
  int asked;
  int completed;
  keel_frame frames[SINK_FRAMES];
  void *payloads[SINK_FRAMES];
  keel_status statuses[SINK_FRAMES];
} recording_sink;

static void *recording_destination(void *context, keel_link *link, const keel_frame *frame) {
  recording_sink *sink = context;
  sink->asked++;
  return frame->length <= sink->capacity ? sink->destination : NULL;
}

static void recording_complete(void *context, keel_link *link, const keel_frame *frame,
                               void *payload, keel_status status) {
  recording_sink *sink = context;
  if (sink->completed < SINK_FRAMES) {
    sink->frames[sink->completed] = *frame;
    sink->payloads[sink->completed] = payload;
    sink->statuses[sink->completed] = status;
  } else if (payload != sink->destination) {
    free(payload);
  }
  sink->completed++;
}

static keel_link_sink sink_of(recording_sink *recording) {
  keel_link_sink sink = {recording_destination, recording_complete, recording};
  return sink;
}

static void recording_free(recording_sink *sink) {
  int kept = sink->completed < SINK_FRAMES ? sink->completed : SINK_FRAMES;
  for (int i = 0; i < kept; i++)
    if (sink->payloads[i] != sink->destination) free(sink->payloads[i]);
}

/* Drives receive progress on link until sink has count frames or the deadline passes;
 * returns the last status of keel_link_recv_progress. */
static keel_status pump_receive(keel_link *link, recording_sink *recording, int count,
                                int64_t timeout_ns) {
  keel_link_sink sink = sink_of(recording);
  int64_t deadline = keel_deadline_after_ns(timeout_ns);
  keel_status status = KEEL_EAGAIN;
  while (recording->completed < count && keel_now_ns() < deadline) {
    status = keel_link_recv_progress(link, &sink);
    if (status != KEEL_EAGAIN && status != KEEL_OK) return status;
    if (recording->completed >= count) break;
    struct pollfd entry = {.fd = keel_link_fd(link), .events = POLLIN};
    poll(&entry, 1, 100);
  }
  return status;
}

/* ---- frames */

static void test_frame_round_trip(void **state) {
  (void)state;
  keel_frame frames[] = {
      {.type = KEEL_FRAME_DATA,
       .job_id = 42,
       .epoch = 3,
       .tag = 99,
       .length = 4096,
       .source = 7,
       .payload_crc32c = 0x12345678},
      {.type = KEEL_FRAME_HELLO,
       .job_id = UINT64_MAX,
       .epoch = UINT64_MAX,
       .tag = UINT64_MAX,
       .length = 0,
       .source = UINT32_MAX,
       .payload_crc32c = UINT32_MAX},
      {.type = KEEL_FRAME_GOODBYE, .job_id = 1},
      {.type = KEEL_FRAME_STORE_RESPONSE, .job_id = 5, .length = KEEL_FRAME_DEFAULT_MAX_PAYLOAD},
  };
  for (size_t i = 0; i < sizeof frames / sizeof frames[0]; i++) {
    uint8_t wire[KEEL_FRAME_HEADER_BYTES];
    keel_frame_encode(&frames[i], wire);
    keel_frame decoded;
    assert_int_equal(keel_frame_decode(wire, sizeof wire, frames[i].job_id,
                                       KEEL_FRAME_DEFAULT_MAX_PAYLOAD, &decoded),
                     KEEL_OK);
    assert_int_equal(decoded.type, frames[i].type);
    assert_true(decoded.job_id == frames[i].job_id);
    assert_true(decoded.epoch == frames[i].epoch);
    assert_true(decoded.tag == frames[i].tag);
    assert_true(decoded.length == frames[i].length);
    assert_int_equal(decoded.source, frames[i].source);
    assert_int_equal(decoded.payload_crc32c, frames[i].payload_crc32c);
    /* Job id 0 accepts any job. */
    assert_int_equal(keel_frame_decode(wire, sizeof wire, 0, UINT64_MAX, &decoded), KEEL_OK);
  }
  /* The layout of net.h, byte for byte. */
  uint8_t wire[KEEL_FRAME_HEADER_BYTES];
  keel_frame_encode(&frames[0], wire);
  assert_memory_equal(wire, "KEEL", 4);
  assert_int_equal(wire[4], KEEL_FRAME_VERSION);
  assert_int_equal(wire[5], 0);
  assert_int_equal(wire[6], KEEL_FRAME_DATA);
  assert_int_equal(wire[8], 42);
  assert_int_equal(wire[16], 3);
  assert_int_equal(wire[24], 99);
  assert_int_equal(wire[32], 0x00);
  assert_int_equal(wire[33], 0x10);
  assert_int_equal(wire[40], 7);
  assert_int_equal(wire[44], 0x78);
  uint32_t header_crc = keel_crc32c(0, wire, 48);
  assert_int_equal(wire[48], header_crc & 0xff);
  assert_int_equal(wire[51], header_crc >> 24);
  assert_int_equal(wire[52] | wire[53] | wire[54] | wire[55], 0);
}

/* Rewrites the header crc after a deliberate change, so that the change itself is what
 * decode sees. */
static void reseal(uint8_t *wire) {
  uint32_t crc = keel_crc32c(0, wire, 48);
  for (int i = 0; i < 4; i++) wire[48 + i] = (uint8_t)(crc >> (8 * i));
}

static void test_frame_rejections(void **state) {
  (void)state;
  keel_frame frame = {.type = KEEL_FRAME_DATA, .job_id = 42, .length = 1000, .source = 1};
  uint8_t good[KEEL_FRAME_HEADER_BYTES];
  keel_frame_encode(&frame, good);
  uint8_t wire[KEEL_FRAME_HEADER_BYTES];
  keel_frame out;
  memset(&out, 0x5a, sizeof out);
  keel_frame untouched = out;

  assert_int_equal(keel_frame_decode(good, sizeof good - 1, 42, 1000, &out), KEEL_ECORRUPT);
  assert_int_equal(keel_frame_decode(good, 0, 42, 1000, &out), KEEL_ECORRUPT);
  memcpy(wire, good, sizeof wire);
  wire[0] ^= 1; /* magic */
  assert_int_equal(keel_frame_decode(wire, sizeof wire, 42, 1000, &out), KEEL_ECORRUPT);
  reseal(wire);
  assert_int_equal(keel_frame_decode(wire, sizeof wire, 42, 1000, &out), KEEL_ECORRUPT);
  memcpy(wire, good, sizeof wire);
  wire[4] = 2; /* version, crc fixed */
  reseal(wire);
  assert_int_equal(keel_frame_decode(wire, sizeof wire, 42, 1000, &out), KEEL_EPROTO);
  memcpy(wire, good, sizeof wire);
  wire[4] = 2; /* version, crc left stale: corruption */
  assert_int_equal(keel_frame_decode(wire, sizeof wire, 42, 1000, &out), KEEL_ECORRUPT);
  assert_int_equal(keel_frame_decode(good, sizeof good, 43, 1000, &out), KEEL_EPROTO);
  for (int byte = 0; byte < 48; byte++) {
    memcpy(wire, good, sizeof wire);
    wire[byte] ^= 0x10; /* any flipped bit the crc covers */
    assert_int_equal(keel_frame_decode(wire, sizeof wire, 0, UINT64_MAX, &out), KEEL_ECORRUPT);
  }
  memcpy(wire, good, sizeof wire);
  wire[49] ^= 1; /* the crc itself */
  assert_int_equal(keel_frame_decode(wire, sizeof wire, 42, 1000, &out), KEEL_ECORRUPT);
  assert_int_equal(keel_frame_decode(good, sizeof good, 42, 999, &out), KEEL_ERANGE);
  keel_frame huge = frame;
  huge.length = UINT64_MAX;
  keel_frame_encode(&huge, wire);
  assert_int_equal(keel_frame_decode(wire, sizeof wire, 42, KEEL_FRAME_DEFAULT_MAX_PAYLOAD, &out),
                   KEEL_ERANGE);
  static const uint16_t unknown_types[] = {0, 6, 15, 20, 31, 34, 47, 49, 0xffff};
  for (size_t i = 0; i < sizeof unknown_types / sizeof unknown_types[0]; i++) {
    memcpy(wire, good, sizeof wire);
    wire[6] = (uint8_t)unknown_types[i];
    wire[7] = (uint8_t)(unknown_types[i] >> 8);
    reseal(wire);
    assert_int_equal(keel_frame_decode(wire, sizeof wire, 42, 1000, &out), KEEL_ECORRUPT);
  }
  assert_memory_equal(&out, &untouched, sizeof out); /* outputs only on success */
  assert_int_equal(keel_frame_decode(good, sizeof good, 42, 1000, &out), KEEL_OK);
}

/* ---- authentication */

static void test_auth_generate_and_env(void **state) {
  (void)state;
  keel_auth first, second;
  assert_int_equal(keel_auth_generate(&first), KEEL_OK);
  assert_int_equal(keel_auth_generate(&second), KEEL_OK);
  assert_true(first.job_id != 0);
  assert_memory_not_equal(first.token, second.token, KEEL_TOKEN_BYTES);

  char token_text[2 * KEEL_TOKEN_BYTES + 1];
  keel_hex_encode(first.token, KEEL_TOKEN_BYTES, token_text);
  char job_text[32];
  snprintf(job_text, sizeof job_text, "%llu", (unsigned long long)first.job_id);
  setenv("KEEL_JOB_ID", job_text, 1);
  setenv("KEEL_JOB_TOKEN", token_text, 1);
  keel_auth loaded;
  memset(&loaded, 0x77, sizeof loaded);
  assert_int_equal(keel_auth_from_env(&loaded), KEEL_OK);
  assert_true(loaded.job_id == first.job_id);
  assert_memory_equal(loaded.token, first.token, KEEL_TOKEN_BYTES);
  assert_int_equal(loaded.local_id, 0);

  setenv("KEEL_JOB_ID", "18446744073709551615", 1);
  assert_int_equal(keel_auth_from_env(&loaded), KEEL_OK);
  assert_true(loaded.job_id == UINT64_MAX);
  static const char *const bad_ids[] = {"0", "", "x1", "18446744073709551616", "-1", " 5"};
  for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
    setenv("KEEL_JOB_ID", bad_ids[i], 1);
    assert_int_equal(keel_auth_from_env(&loaded), KEEL_EINVAL);
  }
  setenv("KEEL_JOB_ID", job_text, 1);
  setenv("KEEL_JOB_TOKEN", "abcd", 1);
  assert_int_equal(keel_auth_from_env(&loaded), KEEL_EINVAL);
  unsetenv("KEEL_JOB_TOKEN");
  assert_int_equal(keel_auth_from_env(&loaded), KEEL_EINVAL);
  unsetenv("KEEL_JOB_ID");
  assert_int_equal(keel_auth_from_env(&loaded), KEEL_EINVAL);
}

static void test_connect_accept(void **state) {
  link_pair *pair = *state;
  keel_link *connected = pair->connected, *accepted = pair->accepted;
  assert_int_equal(keel_link_peer_id(connected), 2);
  assert_int_equal(keel_link_peer_id(accepted), 1);
  assert_true(keel_link_fd(connected) >= 0);
  assert_false(keel_link_send_busy(connected));
  keel_link_close(NULL);
}

static void test_listener_basics(void **state) {
  (void)state;
  keel_listener *listener = NULL;
  assert_int_equal(keel_listener_open("127.0.0.1:0", &listener), KEEL_OK);
  const char *address = keel_listener_address(listener);
  assert_non_null(strstr(address, "127.0.0.1:"));
  assert_true(atoi(strrchr(address, ':') + 1) > 0);
  assert_true(keel_listener_fd(listener) >= 0);
  keel_auth auth = test_auth(2);
  keel_link *link = NULL;
  /* A poll finds nothing; a short deadline passes. */
  assert_int_equal(keel_listener_accept(listener, &auth, 0, &link), KEEL_EAGAIN);
  assert_int_equal(
      keel_listener_accept(listener, &auth, keel_deadline_after_ns(SECONDS(1) / 20), &link),
      KEEL_ETIMEDOUT);
  assert_null(link);
  keel_listener_close(listener);
  keel_listener_close(NULL);

  static const char *const bad[] = {"127.0.0.1", "127.0.0.1:", "127.0.0.1:http", "no-colon",
                                    "127.0.0.1:123456789"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_not_equal(keel_listener_open(bad[i], &listener), KEEL_OK);
  assert_int_equal(keel_link_connect("bad", &auth, keel_deadline_after_ns(SECONDS(1)), &link),
                   KEEL_EINVAL);
}

/* IPv6 where the host has it: "[::1]:port" both ways. */
static void test_ipv6_loopback(void **state) {
  (void)state;
  keel_listener *listener = NULL;
  if (keel_listener_open("[::1]:0", &listener) != KEEL_OK) {
    skip(); /* no IPv6 on this host */
    return;
  }
  const char *address = keel_listener_address(listener);
  assert_int_equal(strncmp(address, "[::1]:", 6), 0);
  connector job;
  keel_link *accepted = NULL;
  assert_int_equal(handshake(listener, test_auth(2), test_auth(1), &job, &accepted), KEEL_OK);
  assert_int_equal(job.status, KEEL_OK);
  keel_frame frame = {.type = KEEL_FRAME_DATA, .tag = 6};
  assert_int_equal(keel_link_send(job.link, &frame, "six", 3, keel_deadline_after_ns(SECONDS(5))),
                   KEEL_OK);
  void *payload = NULL;
  assert_int_equal(keel_link_recv(accepted, &frame, &payload, keel_deadline_after_ns(SECONDS(5))),
                   KEEL_OK);
  assert_memory_equal(payload, "six", 3);
  free(payload);
  keel_link_close(accepted);
  keel_link_close(job.link);
  keel_listener_close(listener);
}

/* An address on loopback where nobody listens: a listener's, closed at once. */
static void closed_port_address(char *address, size_t capacity) {
  keel_listener *listener = NULL;
  assert_int_equal(keel_listener_open("127.0.0.1:0", &listener), KEEL_OK);
  snprintf(address, capacity, "%s", keel_listener_address(listener));
  keel_listener_close(listener);
}

typedef struct retry_count {
  int asked;
  int allowed; /* retries keep_trying allows before it says no */
} retry_count;

static bool keep_trying_a_while(void *context) {
  retry_count *count = context;
  return ++count->asked <= count->allowed;
}

/* A caller that learns the peer will not listen again (keep_trying says no) stops retrying
 * a refused connection at once, long before its deadline. */
static void test_connect_while_stops_when_told(void **state) {
  (void)state;
  char address[64];
  closed_port_address(address, sizeof address);
  keel_auth auth = test_auth(1);
  keel_link *link = NULL;
  retry_count count = {.asked = 0, .allowed = 3};
  int64_t start = keel_now_ns();
  assert_int_equal(keel_link_connect_while(address, &auth, keel_deadline_after_ns(SECONDS(10)),
                                           keep_trying_a_while, &count, &link),
                   KEEL_ECONNREFUSED);
  assert_true(keel_now_ns() - start < SECONDS(2));
  assert_int_equal(count.asked, 4);
  assert_null(link);
}

/* A loopback address that answers no connection attempt at all, as a partitioned host: a
 * listener (never accepting) whose accept queue is full, so that the kernel drops further
 * SYNs. fds[0] is the listener, the others the connections that fill it. Returns how many
 * fds to close. */
#define SILENT_FILLERS 8
static int silent_address(char *address, size_t capacity, int *fds) {
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(listener >= 0);
  struct sockaddr_in bound = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(listener, (struct sockaddr *)&bound, sizeof bound), 0);
  assert_int_equal(listen(listener, 0), 0);
  socklen_t length = sizeof bound;
  assert_int_equal(getsockname(listener, (struct sockaddr *)&bound, &length), 0);
  snprintf(address, capacity, "127.0.0.1:%u", (unsigned)ntohs(bound.sin_port));
  fds[0] = listener;
  int used = 1;
  /* Connect until one gets no answer within 200 ms: the queue is full from then on. */
  for (; used <= SILENT_FILLERS; used++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    fds[used] = fd;
    if (connect(fd, (struct sockaddr *)&bound, sizeof bound) == 0) continue;
    assert_int_equal(errno, EINPROGRESS);
    struct pollfd entry = {.fd = fd, .events = POLLOUT};
    if (poll(&entry, 1, 200) == 0) return used + 1;
  }
  fail_msg("%d connections to a listener with a backlog of 0 were all answered", SILENT_FILLERS);
  return used;
}

static bool keep_trying_never(void *context) {
  int *asked = context;
  ++*asked;
  return false;
}

/* A connection attempt nobody answers (a partitioned peer drops the SYN) ends as soon as
 * the caller learns the peer is dead, not at the deadline: before, a member that linked to a
 * peer on a partitioned node waited out the collective deadline (30 s) in a recovery. */
static void test_connect_while_stops_on_silence(void **state) {
  (void)state;
  char address[64];
  int fds[SILENT_FILLERS + 2];
  int count = silent_address(address, sizeof address, fds);
  keel_auth auth = test_auth(1);
  keel_link *link = NULL;
  /* The address is silent: a plain connect waits out its deadline. */
  assert_int_equal(keel_link_connect(address, &auth, keel_deadline_after_ns(SECONDS(1) / 2), &link),
                   KEEL_ETIMEDOUT);
  int asked = 0;
  int64_t start = keel_now_ns();
  assert_int_equal(keel_link_connect_while(address, &auth, keel_deadline_after_ns(SECONDS(10)),
                                           keep_trying_never, &asked, &link),
                   KEEL_ECONNREFUSED);
  assert_true(keel_now_ns() - start < SECONDS(2));
  assert_true(asked >= 1);
  assert_null(link);
  for (int i = 0; i < count; i++) close(fds[i]);
}

/* A connector that starts before the listener exists retries until it is there; one whose
 * peer never listens gives up at its deadline. */
static void test_connect_retries_until_deadline(void **state) {
  (void)state;
  char address[64];
  closed_port_address(address, sizeof address);

  keel_auth auth = test_auth(1);
  keel_link *link = NULL;
  int64_t start = keel_now_ns();
  assert_int_equal(keel_link_connect(address, &auth, keel_deadline_after_ns(SECONDS(1) / 5), &link),
                   KEEL_ETIMEDOUT);
  int64_t waited = keel_now_ns() - start;
  assert_true(waited >= SECONDS(1) / 5 && waited < SECONDS(2));
  assert_null(link);

  connector job;
  connector_start(&job, address, test_auth(1));
  struct timespec pause = {0, 100 * 1000 * 1000};
  nanosleep(&pause, NULL);
  keel_listener *listener = NULL;
  assert_int_equal(keel_listener_open(address, &listener), KEEL_OK);
  keel_auth acceptor_auth = test_auth(2);
  assert_int_equal(
      keel_listener_accept(listener, &acceptor_auth, keel_deadline_after_ns(SECONDS(10)), &link),
      KEEL_OK);
  connector_join(&job);
  assert_int_equal(job.status, KEEL_OK);
  keel_link_close(job.link);
  keel_link_close(link);
  keel_listener_close(listener);
}

/* Accepts on listener with auth and connects with connector_auth; returns both verdicts. */
static void handshake_attempt(keel_listener *listener, keel_auth acceptor_auth,
                              keel_auth connector_auth, keel_status *acceptor_p,
                              keel_status *connector_p) {
  connector job;
  keel_link *accepted = NULL;
  *acceptor_p = handshake(listener, acceptor_auth, connector_auth, &job, &accepted);
  *connector_p = job.status;
  keel_link_close(accepted);
  keel_link_close(job.link);
}

static void test_wrong_token(void **state) {
  (void)state;
  keel_listener *listener = NULL;
  assert_int_equal(keel_listener_open("127.0.0.1:0", &listener), KEEL_OK);
  keel_auth right = test_auth(2);
  keel_auth wrong = test_auth(1);
  wrong.token[5] ^= 0x40;
  keel_status acceptor, connector_status;

  /* A connector with the wrong token. */
  handshake_attempt(listener, right, wrong, &acceptor, &connector_status);
  assert_int_equal(acceptor, KEEL_EAUTH);
  assert_int_equal(connector_status, KEEL_EAUTH);
  /* A connector of another job with the same token. */
  keel_auth other_job = test_auth(1);
  other_job.job_id ^= 1;
  handshake_attempt(listener, right, other_job, &acceptor, &connector_status);
  assert_int_equal(acceptor, KEEL_EAUTH);
  assert_int_equal(connector_status, KEEL_EAUTH);
  /* The listener still accepts the real member afterwards. */
  handshake_attempt(listener, right, test_auth(1), &acceptor, &connector_status);
  assert_int_equal(acceptor, KEEL_OK);
  assert_int_equal(connector_status, KEEL_OK);
  keel_listener_close(listener);
}

static void test_impostor_acceptor(void **state) {
  (void)state;
  keel_listener *real = NULL, *impostor = NULL;
  assert_int_equal(keel_listener_open("127.0.0.1:0", &real), KEEL_OK);
  assert_int_equal(keel_listener_open("127.0.0.1:0", &impostor), KEEL_OK);
  keel_auth impostor_auth = test_auth(2);
  impostor_auth.token[31] ^= 1;
  keel_status acceptor, connector_status;
  handshake_attempt(impostor, impostor_auth, test_auth(1), &acceptor, &connector_status);
  assert_int_equal(connector_status, KEEL_EAUTH);
  assert_int_equal(acceptor, KEEL_EAUTH);
  handshake_attempt(real, test_auth(2), test_auth(1), &acceptor, &connector_status);
  assert_int_equal(acceptor, KEEL_OK);
  assert_int_equal(connector_status, KEEL_OK);
  keel_listener_close(impostor);
  keel_listener_close(real);
}

/* An acceptor that dies during the handshake (here: a plain socket that reads the HELLO and
 * closes) is a lost peer to the connector, KEEL_ECLOSED, not a refusal: callers route around
 * a lost peer but give up on a wrong token. */
static void test_acceptor_goes_away(void **state) {
  (void)state;
  int listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(listen_fd >= 0);
  struct sockaddr_in here = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &here.sin_addr);
  socklen_t length = sizeof here;
  assert_int_equal(bind(listen_fd, (struct sockaddr *)&here, sizeof here), 0);
  assert_int_equal(listen(listen_fd, 1), 0);
  assert_int_equal(getsockname(listen_fd, (struct sockaddr *)&here, &length), 0);
  char address[64];
  snprintf(address, sizeof address, "127.0.0.1:%u", (unsigned)ntohs(here.sin_port));
  connector job;
  connector_start(&job, address, test_auth(1));
  int fd = accept(listen_fd, NULL, NULL);
  assert_true(fd >= 0);
  uint8_t hello[KEEL_FRAME_HEADER_BYTES];
  size_t got = 0;
  while (got < sizeof hello) {
    ssize_t n = recv(fd, hello + got, sizeof hello - got, 0);
    assert_true(n > 0);
    got += (size_t)n;
  }
  close(fd);
  connector_join(&job);
  assert_int_equal(job.status, KEEL_ECLOSED);
  assert_null(job.link);
  close(listen_fd);
}

/* A plain TCP client of the listener at address. */
static int raw_connect(const char *address) {
  const char *colon = strrchr(address, ':');
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&to, sizeof to), 0);
  return fd;
}

static void write_all(int fd, const void *data, size_t length) {
  const uint8_t *bytes = data;
  while (length > 0) {
    ssize_t written = send(fd, bytes, length, MSG_NOSIGNAL);
    if (written < 0 && errno == EINTR) continue;
    assert_true(written > 0);
    bytes += written;
    length -= (size_t)written;
  }
}

/* A raw client of listener sends bytes instead of a handshake: refused (KEEL_EAUTH). */
static void expect_refused(keel_listener *listener, keel_auth *auth, const void *bytes,
                           size_t length) {
  int fd = raw_connect(keel_listener_address(listener));
  write_all(fd, bytes, length);
  keel_link *link = NULL;
  assert_int_equal(keel_listener_accept(listener, auth, keel_deadline_after_ns(SECONDS(5)), &link),
                   KEEL_EAUTH);
  close(fd);
}

static void test_raw_clients(void **state) {
  (void)state;
  keel_listener *listener = NULL;
  assert_int_equal(keel_listener_open("127.0.0.1:0", &listener), KEEL_OK);
  keel_auth auth = test_auth(2);
  keel_link *link = NULL;

  /* Garbage instead of a HELLO. */
  uint8_t garbage[300];
  fill_pattern(garbage, sizeof garbage, 5);
  expect_refused(listener, &auth, garbage, sizeof garbage);

  /* Nothing at all: the handshake's deadline passes. */
  int fd = raw_connect(keel_listener_address(listener));
  int64_t start = keel_now_ns();
  assert_int_equal(
      keel_listener_accept(listener, &auth, keel_deadline_after_ns(SECONDS(1) / 5), &link),
      KEEL_ETIMEDOUT);
  assert_true(keel_now_ns() - start < SECONDS(2));
  close(fd);

  /* A well-formed HELLO header that announces a payload far past the handshake's bound:
   * refused from the header alone. */
  keel_frame hello = {.type = KEEL_FRAME_HELLO, .job_id = auth.job_id, .length = (uint64_t)1 << 40};
  uint8_t wire[KEEL_FRAME_HEADER_BYTES];
  keel_frame_encode(&hello, wire);
  expect_refused(listener, &auth, wire, sizeof wire);

  /* A data frame before the handshake. */
  keel_frame data = {.type = KEEL_FRAME_DATA, .job_id = auth.job_id};
  keel_frame_encode(&data, wire);
  expect_refused(listener, &auth, wire, sizeof wire);

  /* A client that connects and leaves at once. */
  fd = raw_connect(keel_listener_address(listener));
  close(fd);
  assert_int_equal(keel_listener_accept(listener, &auth, keel_deadline_after_ns(SECONDS(5)), &link),
                   KEEL_EAUTH);
  assert_null(link);

  /* The listener survives all of them. */
  keel_status acceptor, connector_status;
  handshake_attempt(listener, auth, test_auth(1), &acceptor, &connector_status);
  assert_int_equal(acceptor, KEEL_OK);
  assert_int_equal(connector_status, KEEL_OK);
  keel_listener_close(listener);
}

/* ---- a connector that gives up after the acceptor's welcome */

/* One frame of type and payload to fd, as a link writes it. */
static void raw_frame_send(int fd, uint16_t type, uint64_t job_id, const void *payload,
                           size_t length) {
  keel_frame frame = {.type = type, .job_id = job_id, .length = length};
  frame.payload_crc32c = keel_crc32c(0, payload, length);
  uint8_t wire[KEEL_FRAME_HEADER_BYTES];
  keel_frame_encode(&frame, wire);
  write_all(fd, wire, sizeof wire);
  write_all(fd, payload, length);
}

/* Reads one frame of the expected type into payload (exactly length bytes); false if the
 * peer sent something else or closed. */
static bool raw_frame_recv(int fd, uint16_t type, uint8_t *payload, size_t length) {
  uint8_t wire[KEEL_FRAME_HEADER_BYTES + 128];
  size_t want = KEEL_FRAME_HEADER_BYTES + length, got = 0;
  while (got < want) {
    ssize_t n = recv(fd, wire + got, want - got, 0);
    if (n <= 0) return false;
    got += (size_t)n;
  }
  keel_frame frame;
  if (keel_frame_decode(wire, KEEL_FRAME_HEADER_BYTES, 0, 128, &frame) != KEEL_OK) return false;
  if (frame.type != type || frame.length != length) return false;
  memcpy(payload, wire + KEEL_FRAME_HEADER_BYTES, length);
  return true;
}

typedef struct quitter {
  const char *address;
  keel_auth auth;
  bool welcomed; /* the acceptor sent its welcome before the quitter left */
  pthread_t thread;
} quitter;

/* A connector that proves the token, reads the welcome and closes instead of confirming:
 * what a connector whose deadline passed while it waited for the welcome does. */
static void *quitter_main(void *argument) {
  quitter *q = argument;
  int fd = raw_connect(q->address);
  uint8_t hello[8 + 4 + 32], challenge[64], response[32], welcome[4];
  keel_put_le64(hello, q->auth.job_id);
  keel_put_le32(hello + 8, q->auth.local_id);
  randombytes_buf(hello + 12, 32);
  raw_frame_send(fd, KEEL_FRAME_HELLO, q->auth.job_id, hello, sizeof hello);
  if (raw_frame_recv(fd, KEEL_FRAME_CHALLENGE, challenge, sizeof challenge)) {
    /* The connector's proof: HMAC(token; label, job id, acceptor's nonce, its own). */
    uint8_t job_wire[8];
    keel_put_le64(job_wire, q->auth.job_id);
    crypto_auth_hmacsha256_state hmac;
    crypto_auth_hmacsha256_init(&hmac, q->auth.token, sizeof q->auth.token);
    crypto_auth_hmacsha256_update(&hmac, (const uint8_t *)"keel-connector", 14);
    crypto_auth_hmacsha256_update(&hmac, job_wire, sizeof job_wire);
    crypto_auth_hmacsha256_update(&hmac, challenge, 32);
    crypto_auth_hmacsha256_update(&hmac, hello + 12, 32);
    crypto_auth_hmacsha256_final(&hmac, response);
    raw_frame_send(fd, KEEL_FRAME_RESPONSE, q->auth.job_id, response, sizeof response);
    q->welcomed = raw_frame_recv(fd, KEEL_FRAME_WELCOME, welcome, sizeof welcome);
  }
  close(fd);
  return NULL;
}

/* The acceptor had sent its welcome, and the connector left: no link. Before the LINKED
 * frame, the acceptor counted such a link as made, saw it close at once, and the comm
 * layer took a live connector for dead (RELIABILITY.md, finding 9). */
static void test_connector_quits_after_welcome(void **state) {
  (void)state;
  keel_listener *listener = NULL;
  assert_int_equal(keel_listener_open("127.0.0.1:0", &listener), KEEL_OK);
  quitter q = {.address = keel_listener_address(listener), .auth = test_auth(1)};
  assert_int_equal(pthread_create(&q.thread, NULL, quitter_main, &q), 0);
  keel_link *link = NULL;
  keel_status status =
      keel_listener_accept(listener, &q.auth, keel_deadline_after_ns(SECONDS(5)), &link);
  pthread_join(q.thread, NULL);
  assert_true(q.welcomed); /* the handshake really got that far */
  assert_int_not_equal(status, KEEL_OK);
  assert_null(link);
  /* A whole handshake still makes a link. */
  keel_status acceptor, connector_status;
  handshake_attempt(listener, test_auth(2), test_auth(1), &acceptor, &connector_status);
  assert_int_equal(acceptor, KEEL_OK);
  assert_int_equal(connector_status, KEEL_OK);
  keel_listener_close(listener);
}

/* ---- blocking transfers */

static void test_blocking_send_recv(void **state) {
  link_pair *pair = *state;
  keel_link *connected = pair->connected, *accepted = pair->accepted;
  static const size_t sizes[] = {0, 1, 4097, 8 * MIB};
  uint8_t *data = malloc(8 * MIB);
  assert_non_null(data);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    fill_pattern(data, sizes[i], 100 + i);
    sender job = {.link = connected,
                  .frame = {.type = KEEL_FRAME_DATA, .epoch = 4, .tag = 1000 + i},
                  .payload = data,
                  .length = sizes[i],
                  .deadline_ns = keel_deadline_after_ns(SECONDS(20))};
    assert_int_equal(pthread_create(&job.thread, NULL, sender_main, &job), 0);
    keel_frame frame;
    void *payload = NULL;
    keel_status status =
        keel_link_recv(accepted, &frame, &payload, keel_deadline_after_ns(SECONDS(20)));
    pthread_join(job.thread, NULL);
    assert_int_equal(job.status, KEEL_OK);
    assert_int_equal(status, KEEL_OK);
    assert_int_equal(frame.type, KEEL_FRAME_DATA);
    assert_true(frame.epoch == 4);
    assert_true(frame.tag == 1000 + i);
    assert_true(frame.length == sizes[i]);
    assert_int_equal(frame.source, 1);
    assert_true(frame.job_id == test_auth(0).job_id);
    if (sizes[i] > 0) assert_memory_equal(payload, data, sizes[i]);
    free(payload);
  }
  /* The other direction, and a receive that times out without harm. */
  keel_frame frame = {.type = KEEL_FRAME_CONTROL, .tag = 5};
  assert_int_equal(keel_link_send(accepted, &frame, "hello", 5, keel_deadline_after_ns(SECONDS(5))),
                   KEEL_OK);
  void *payload = NULL;
  assert_int_equal(keel_link_recv(connected, &frame, &payload, keel_deadline_after_ns(SECONDS(5))),
                   KEEL_OK);
  assert_memory_equal(payload, "hello", 5);
  assert_int_equal(frame.source, 2);
  free(payload);
  assert_int_equal(keel_link_recv(connected, &frame, &payload, keel_now_ns() + SECONDS(1) / 20),
                   KEEL_ETIMEDOUT);
  assert_int_equal(keel_link_recv(connected, &frame, &payload, 0), KEEL_ETIMEDOUT);
  /* Handshake frames and unknown types are not the caller's to send. */
  frame.type = KEEL_FRAME_HELLO;
  assert_int_equal(keel_link_send(connected, &frame, NULL, 0, 0), KEEL_EINVAL);
  frame.type = 99;
  assert_int_equal(keel_link_send_begin(connected, &frame, NULL, 0), KEEL_EINVAL);
  frame.type = KEEL_FRAME_DATA;
  assert_int_equal(keel_link_send(connected, &frame, "x", 1, keel_deadline_after_ns(SECONDS(5))),
                   KEEL_OK);
  assert_int_equal(keel_link_recv(accepted, &frame, &payload, keel_deadline_after_ns(SECONDS(5))),
                   KEEL_OK);
  free(payload);
  free(data);
}

/* A blocking send whose deadline passes mid-frame keeps the rest of the frame, so the
 * caller's buffer is free and the peer still gets the frame whole, then the next one. */
static void test_blocking_send_timeout_keeps_frame(void **state) {
  link_pair *pair = *state;
  keel_link *connected = pair->connected, *accepted = pair->accepted;
  size_t length = 48 * MIB;
  uint8_t *data = pattern_new(length, 9);
  uint8_t *expected = pattern_new(length, 9);
  keel_frame frame = {.type = KEEL_FRAME_MESSAGE, .tag = 1};
  assert_int_equal(keel_link_send(connected, &frame, data, length, keel_now_ns() + SECONDS(1) / 10),
                   KEEL_ETIMEDOUT);
  assert_true(keel_link_send_busy(connected));
  memset(data, 0xee, length); /* the caller's buffer is its own again */
  frame.tag = 2;
  sender job = {.link = connected,
                .frame = frame,
                .payload = (const uint8_t *)"next",
                .length = 4,
                .deadline_ns = keel_deadline_after_ns(SECONDS(20))};
  assert_int_equal(pthread_create(&job.thread, NULL, sender_main, &job), 0);
  void *payload = NULL;
  keel_status first =
      keel_link_recv(accepted, &frame, &payload, keel_deadline_after_ns(SECONDS(20)));
  assert_int_equal(first, KEEL_OK);
  assert_true(frame.tag == 1 && frame.length == length);
  assert_memory_equal(payload, expected, length);
  free(payload);
  assert_int_equal(keel_link_recv(accepted, &frame, &payload, keel_deadline_after_ns(SECONDS(20))),
                   KEEL_OK);
  pthread_join(job.thread, NULL);
  assert_int_equal(job.status, KEEL_OK);
  assert_true(frame.tag == 2 && frame.length == 4);
  assert_memory_equal(payload, "next", 4);
  free(payload);
  free(data);
  free(expected);
}

/* ---- non-blocking transfers */

/* One thread, one poll loop, both links sending and receiving at once. */
static void test_full_duplex_progress(void **state) {
  link_pair *pair = *state;
  keel_link *links[2] = {pair->connected, pair->accepted};
  size_t length = 16 * MIB;
  uint8_t *outgoing[2], *incoming[2];
  recording_sink sinks[2];
  memset(sinks, 0, sizeof sinks);
  for (int side = 0; side < 2; side++) {
    outgoing[side] = malloc(length);
    incoming[side] = malloc(length);
    assert_non_null(outgoing[side]);
    assert_non_null(incoming[side]);
    fill_pattern(outgoing[side], length, 300 + (uint64_t)side);
    sinks[side].destination = incoming[side];
    sinks[side].capacity = length;
    keel_frame frame = {.type = KEEL_FRAME_DATA, .tag = 10 + (uint64_t)side, .epoch = 1};
    assert_int_equal(keel_link_send_begin(links[side], &frame, outgoing[side], length), KEEL_OK);
    assert_int_equal(keel_link_send_begin(links[side], &frame, outgoing[side], length),
                     KEEL_EAGAIN); /* one frame in flight */
  }
  int64_t deadline = keel_deadline_after_ns(SECONDS(60));
  int rounds = 0;
  while (keel_now_ns() < deadline) {
    bool finished = true;
    struct pollfd entries[2];
    for (int side = 0; side < 2; side++) {
      keel_status status = keel_link_send_progress(links[side]);
      assert_true(status == KEEL_OK || status == KEEL_EAGAIN);
      keel_link_sink sink = sink_of(&sinks[side]);
      status = keel_link_recv_progress(links[side], &sink);
      assert_int_equal(status, KEEL_EAGAIN);
      finished = finished && sinks[side].completed == 1 && !keel_link_send_busy(links[side]);
      entries[side].fd = keel_link_fd(links[side]);
      entries[side].events = (short)(POLLIN | (keel_link_send_busy(links[side]) ? POLLOUT : 0));
    }
    if (finished) break;
    poll(entries, 2, 1000);
    rounds++;
  }
  for (int side = 0; side < 2; side++) {
    int other = 1 - side;
    assert_int_equal(sinks[side].completed, 1);
    assert_int_equal(sinks[side].statuses[0], KEEL_OK);
    assert_ptr_equal(sinks[side].payloads[0], incoming[side]);
    assert_true(sinks[side].frames[0].tag == 10 + (uint64_t)other);
    assert_memory_equal(incoming[side], outgoing[other], length);
    assert_false(keel_link_send_busy(links[side]));
  }
  assert_true(rounds > 1); /* it really had to interleave */
  for (int side = 0; side < 2; side++) {
    free(outgoing[side]);
    free(incoming[side]);
  }
}

/* Many small frames, whole or split across reads, delivered in order into link-owned
 * buffers. */
typedef struct order_check {
  uint64_t next_tag;
  bool ok;
} order_check;

static void order_complete(void *context, keel_link *link, const keel_frame *frame, void *payload,
                           keel_status status) {
  order_check *check = context;
  const uint8_t *bytes = payload;
  check->ok = check->ok && status == KEEL_OK && frame->tag == check->next_tag &&
              frame->length == frame->tag % 301;
  for (uint64_t b = 0; b < frame->length && check->ok; b++)
    check->ok = bytes[b] == (uint8_t)(frame->tag & 0xff);
  check->next_tag++;
  free(payload);
}

static void test_many_small_frames(void **state) {
  link_pair *pair = *state;
  keel_link *connected = pair->connected, *accepted = pair->accepted;
  enum { COUNT = 3000 };
  uint8_t payload[300];
  int64_t deadline = keel_deadline_after_ns(SECONDS(20));
  order_check check = {0, true};
  keel_link_sink sink = {NULL, order_complete, &check};
  int sent = 0;
  while (check.next_tag < COUNT && keel_now_ns() < deadline) {
    /* Bursts, so that several frames wait in the socket together. */
    for (int burst = 0; burst < 7 && sent < COUNT; burst++) {
      keel_status status = keel_link_send_progress(connected);
      assert_true(status == KEEL_OK || status == KEEL_EAGAIN);
      if (keel_link_send_busy(connected)) break;
      size_t length = (size_t)(sent % 301);
      memset(payload, sent & 0xff, sizeof payload);
      keel_frame frame = {.type = KEEL_FRAME_CONTROL, .tag = (uint64_t)sent};
      assert_int_equal(keel_link_send_begin(connected, &frame, payload, length), KEEL_OK);
      status = keel_link_send_progress(connected);
      assert_true(status == KEEL_OK || status == KEEL_EAGAIN);
      if (status == KEEL_EAGAIN) assert_int_equal(keel_link_send_detach(connected), KEEL_OK);
      sent++;
    }
    assert_int_equal(keel_link_recv_progress(accepted, &sink), KEEL_EAGAIN);
  }
  assert_true(check.ok);
  assert_int_equal(check.next_tag, COUNT);
}

/* Starts a large non-blocking send and writes until the socket is full. */
static void start_big_send(keel_link *link, const uint8_t *data, size_t length, uint64_t tag) {
  keel_frame frame = {.type = KEEL_FRAME_DATA, .tag = tag};
  assert_int_equal(keel_link_send_begin(link, &frame, data, length), KEEL_OK);
  assert_int_equal(keel_link_send_progress(link), KEEL_EAGAIN);
  assert_true(keel_link_send_busy(link));
}

/* Drives sends on from and receives on to until sink has count frames. */
static void pump_both(keel_link *from, keel_link *to, recording_sink *recording, int count) {
  keel_link_sink sink = sink_of(recording);
  int64_t deadline = keel_deadline_after_ns(SECONDS(30));
  while (recording->completed < count && keel_now_ns() < deadline) {
    keel_status status = keel_link_send_progress(from);
    assert_true(status == KEEL_OK || status == KEEL_EAGAIN);
    status = keel_link_recv_progress(to, &sink);
    assert_int_equal(status, KEEL_EAGAIN);
    struct pollfd entries[2] = {
        {.fd = keel_link_fd(from), .events = keel_link_send_busy(from) ? POLLOUT : 0},
        {.fd = keel_link_fd(to), .events = POLLIN}};
    if (recording->completed < count) poll(entries, 2, 100);
  }
}

static void test_detach_mid_frame(void **state) {
  link_pair *pair = *state;
  keel_link *connected = pair->connected, *accepted = pair->accepted;
  size_t length = 40 * MIB;
  uint8_t *data = pattern_new(length, 77);
  uint8_t *expected = pattern_new(length, 77);
  start_big_send(connected, data, length, 1);
  assert_int_equal(keel_link_send_detach(connected), KEEL_OK);
  assert_int_equal(keel_link_send_detach(connected), KEEL_OK); /* twice is harmless */
  memset(data, 0, length);                                     /* reused at once by its owner */
  recording_sink recording;
  memset(&recording, 0, sizeof recording); /* the link allocates */
  pump_both(connected, accepted, &recording, 1);
  assert_int_equal(recording.completed, 1);
  assert_int_equal(recording.statuses[0], KEEL_OK);
  assert_true(recording.frames[0].length == length);
  assert_memory_equal(recording.payloads[0], expected, length);
  /* The next frame arrives intact. */
  keel_frame frame = {.type = KEEL_FRAME_DATA, .tag = 2};
  assert_int_equal(keel_link_send_begin(connected, &frame, "after", 5), KEEL_OK);
  pump_both(connected, accepted, &recording, 2);
  assert_int_equal(recording.completed, 2);
  assert_true(recording.frames[1].tag == 2);
  assert_memory_equal(recording.payloads[1], "after", 5);
  recording_free(&recording);
  /* Detaching when nothing is in flight does nothing. */
  assert_int_equal(keel_link_send_detach(connected), KEEL_OK);
  free(data);
  free(expected);
}

/* Receives on link until its frame in progress has some payload bytes in. */
static void receive_part_of_frame(keel_link *sender_link, keel_link *link,
                                  recording_sink *recording) {
  keel_link_sink sink = sink_of(recording);
  int64_t deadline = keel_deadline_after_ns(SECONDS(10));
  while (recording->asked == 0 && keel_now_ns() < deadline) {
    assert_int_equal(keel_link_recv_progress(link, &sink), KEEL_EAGAIN);
    keel_link_send_progress(sender_link);
    struct pollfd entry = {.fd = keel_link_fd(link), .events = POLLIN};
    poll(&entry, 1, 100);
  }
  assert_int_equal(recording->asked, 1);
  assert_int_equal(recording->completed, 0);
}

static void test_abandon_mid_frame(void **state) {
  link_pair *pair = *state;
  keel_link *connected = pair->connected, *accepted = pair->accepted;
  size_t length = 40 * MIB;
  uint8_t *data = pattern_new(length, 88);
  uint8_t *destination = malloc(length);
  assert_non_null(destination);
  for (int round = 0; round < 2; round++) {
    /* Round 0: into the caller's buffer; round 1: into a buffer the link allocated. */
    recording_sink recording;
    memset(&recording, 0, sizeof recording);
    if (round == 0) {
      recording.destination = destination;
      recording.capacity = length;
    }
    start_big_send(connected, data, length, 1);
    receive_part_of_frame(connected, accepted, &recording);
    keel_link_recv_abandon(accepted);
    keel_link_recv_abandon(accepted); /* twice is harmless */
    memset(destination, 0x3c, length);
    pump_both(connected, accepted, &recording, 1);
    assert_int_equal(recording.completed, 1);
    assert_null(recording.payloads[0]);
    assert_int_equal(recording.statuses[0], KEEL_ECANCELED);
    assert_true(recording.frames[0].tag == 1);
    /* Nothing more was written into the abandoned buffer. */
    for (size_t i = 0; i < length; i += 4093) assert_int_equal(destination[i], 0x3c);
    assert_int_equal(destination[length - 1], 0x3c);
    /* The next frame arrives intact. */
    keel_frame frame = {.type = KEEL_FRAME_DATA, .tag = 2};
    assert_int_equal(keel_link_send_begin(connected, &frame, data, 4097), KEEL_OK);
    recording.destination = destination;
    recording.capacity = length;
    pump_both(connected, accepted, &recording, 2);
    assert_int_equal(recording.completed, 2);
    assert_int_equal(recording.statuses[1], KEEL_OK);
    assert_true(recording.frames[1].tag == 2);
    assert_memory_equal(destination, data, 4097);
  }
  /* Abandon with no frame in progress does nothing. */
  keel_link_recv_abandon(accepted);
  free(data);
  free(destination);
}

/* ---- ends and failures */

static void test_peer_closes(void **state) {
  (void)state;
  link_pair pair = pair_open();
  keel_link *connected = pair.connected, *accepted = pair.accepted;
  keel_frame frame = {.type = KEEL_FRAME_DATA, .tag = 1};
  assert_int_equal(keel_link_send(connected, &frame, "one", 3, keel_deadline_after_ns(SECONDS(5))),
                   KEEL_OK);
  frame.type = KEEL_FRAME_GOODBYE;
  frame.tag = 2;
  assert_int_equal(keel_link_send(connected, &frame, NULL, 0, keel_deadline_after_ns(SECONDS(5))),
                   KEEL_OK);
  keel_link_close(connected);
  /* The whole frames before the close still arrive, then KEEL_ECLOSED, for good. */
  recording_sink recording;
  memset(&recording, 0, sizeof recording);
  assert_int_equal(pump_receive(accepted, &recording, 3, SECONDS(5)), KEEL_ECLOSED);
  assert_int_equal(recording.completed, 2);
  assert_int_equal(recording.frames[1].type, KEEL_FRAME_GOODBYE);
  assert_memory_equal(recording.payloads[0], "one", 3);
  recording_free(&recording);
  keel_link_sink sink = sink_of(&recording);
  assert_int_equal(keel_link_recv_progress(accepted, &sink), KEEL_ECLOSED);
  void *payload = NULL;
  assert_int_equal(keel_link_recv(accepted, &frame, &payload, 0), KEEL_ECLOSED);
  frame.type = KEEL_FRAME_DATA;
  assert_int_equal(keel_link_send(accepted, &frame, "x", 1, keel_deadline_after_ns(SECONDS(1))),
                   KEEL_ECLOSED);
  assert_int_equal(keel_link_send_begin(accepted, &frame, "x", 1), KEEL_ECLOSED);
  keel_link_close(accepted);

  /* A peer that goes away while we send: an error, never SIGPIPE. */
  pair = pair_open();
  connected = pair.connected;
  accepted = pair.accepted;
  keel_link_close(accepted);
  uint8_t *data = calloc(1, 16 * MIB);
  assert_non_null(data);
  keel_status status = KEEL_OK;
  for (int i = 0; i < 4 && status == KEEL_OK; i++)
    status = keel_link_send(connected, &frame, data, 16 * MIB, keel_deadline_after_ns(SECONDS(5)));
  assert_int_equal(status, KEEL_ECLOSED);
  free(data);
  keel_link_close(connected);
}

/* A header exactly as a member would send it, with fields changed by the caller. */
static void member_header(keel_frame frame, uint8_t *wire) {
  frame.job_id = test_auth(0).job_id;
  frame.source = 1;
  keel_frame_encode(&frame, wire);
}

/* Expects the link under test to break with expected and stay broken. */
static void expect_broken(link_pair *peer, keel_status expected) {
  recording_sink recording;
  memset(&recording, 0, sizeof recording);
  assert_int_equal(pump_receive(peer->accepted, &recording, 1, SECONDS(5)), expected);
  keel_link_sink sink = sink_of(&recording);
  assert_int_equal(keel_link_recv_progress(peer->accepted, &sink), expected);
  keel_frame frame = {.type = KEEL_FRAME_DATA};
  assert_int_equal(
      keel_link_send(peer->accepted, &frame, "x", 1, keel_deadline_after_ns(SECONDS(1))), expected);
  void *payload = NULL;
  assert_int_equal(keel_link_recv(peer->accepted, &frame, &payload, 0), expected);
  recording_free(&recording);
}

static void test_garbage_from_peer(void **state) {
  (void)state;
  uint8_t wire[KEEL_FRAME_HEADER_BYTES + 64];

  /* The peer's connected link is written raw; its accepted link is the one under test. */
  link_pair peer = pair_open();
  fill_pattern(wire, sizeof wire, 1234);
  write_all(keel_link_fd(peer.connected), wire, sizeof wire);
  expect_broken(&peer, KEEL_ECORRUPT);
  pair_close(&peer);

  /* Bad headers, each refused from the header alone. */
  const struct {
    keel_frame frame;
    bool member;          /* sent as member_header does; false: encoded as it is */
    uint64_t max_payload; /* the link's bound, 0: the default */
    keel_status expected;
  } headers[] = {
      /* An oversized length is refused before any allocation: 1 TiB would fail (or trip
       * the sanitizer) if it were tried. */
      {{.type = KEEL_FRAME_DATA, .length = (uint64_t)1 << 40}, true, 0, KEEL_ERANGE},
      /* The bound is the link's own. */
      {{.type = KEEL_FRAME_DATA, .length = 1025}, true, 1024, KEEL_ERANGE},
      /* Another job's frame, a handshake frame after the handshake, a forged source. */
      {{.type = KEEL_FRAME_DATA, .job_id = 5, .source = 1}, false, 0, KEEL_EPROTO},
      {{.type = KEEL_FRAME_HELLO}, true, 0, KEEL_EPROTO},
      {{.type = KEEL_FRAME_DATA, .job_id = test_auth(0).job_id, .source = 9},
       false,
       0,
       KEEL_EPROTO},
  };
  for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++) {
    peer = pair_open();
    if (headers[i].max_payload > 0)
      keel_link_set_max_payload(peer.accepted, headers[i].max_payload);
    if (headers[i].member)
      member_header(headers[i].frame, wire);
    else
      keel_frame_encode(&headers[i].frame, wire);
    write_all(keel_link_fd(peer.connected), wire, KEEL_FRAME_HEADER_BYTES);
    expect_broken(&peer, headers[i].expected);
    pair_close(&peer);
  }

  /* A payload that fails its crc: complete_cb gets ECORRUPT, the link breaks. */
  peer = pair_open();
  member_header((keel_frame){.type = KEEL_FRAME_DATA, .length = 64, .payload_crc32c = 1}, wire);
  memset(wire + KEEL_FRAME_HEADER_BYTES, 7, 64);
  write_all(keel_link_fd(peer.connected), wire, sizeof wire);
  recording_sink recording;
  memset(&recording, 0, sizeof recording);
  assert_int_equal(pump_receive(peer.accepted, &recording, 2, SECONDS(5)), KEEL_ECORRUPT);
  assert_int_equal(recording.completed, 1);
  assert_int_equal(recording.statuses[0], KEEL_ECORRUPT);
  recording_free(&recording);
  expect_broken(&peer, KEEL_ECORRUPT);
  pair_close(&peer);

  /* The peer stops inside a frame: an error, not a clean close. */
  peer = pair_open();
  member_header((keel_frame){.type = KEEL_FRAME_DATA, .length = 1000}, wire);
  write_all(keel_link_fd(peer.connected), wire, sizeof wire);
  shutdown(keel_link_fd(peer.connected), SHUT_WR);
  memset(&recording, 0, sizeof recording);
  assert_int_equal(pump_receive(peer.accepted, &recording, 1, SECONDS(5)), KEEL_ECORRUPT);
  assert_int_equal(recording.completed, 1); /* the frame in progress is ended */
  assert_null(recording.payloads[0]);
  assert_int_equal(recording.statuses[0], KEEL_ECORRUPT);
  expect_broken(&peer, KEEL_ECORRUPT);
  pair_close(&peer);

  /* And inside a header. */
  peer = pair_open();
  write_all(keel_link_fd(peer.connected), wire, 20);
  shutdown(keel_link_fd(peer.connected), SHUT_WR);
  expect_broken(&peer, KEEL_ECORRUPT);
  pair_close(&peer);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_frame_round_trip),
      cmocka_unit_test(test_frame_rejections),
      cmocka_unit_test(test_auth_generate_and_env),
      cmocka_unit_test_setup_teardown(test_connect_accept, pair_setup, pair_teardown),
      cmocka_unit_test(test_listener_basics),
      cmocka_unit_test(test_ipv6_loopback),
      cmocka_unit_test(test_connect_retries_until_deadline),
      cmocka_unit_test(test_connect_while_stops_when_told),
      cmocka_unit_test(test_connect_while_stops_on_silence),
      cmocka_unit_test(test_wrong_token),
      cmocka_unit_test(test_impostor_acceptor),
      cmocka_unit_test(test_raw_clients),
      cmocka_unit_test(test_acceptor_goes_away),
      cmocka_unit_test(test_connector_quits_after_welcome),
      cmocka_unit_test_setup_teardown(test_blocking_send_recv, pair_setup, pair_teardown),
      cmocka_unit_test_setup_teardown(test_blocking_send_timeout_keeps_frame, pair_setup,
                                      pair_teardown),
      cmocka_unit_test_setup_teardown(test_full_duplex_progress, pair_setup, pair_teardown),
      cmocka_unit_test_setup_teardown(test_many_small_frames, pair_setup, pair_teardown),
      cmocka_unit_test_setup_teardown(test_detach_mid_frame, pair_setup, pair_teardown),
      cmocka_unit_test_setup_teardown(test_abandon_mid_frame, pair_setup, pair_teardown),
      cmocka_unit_test(test_peer_closes),
      cmocka_unit_test(test_garbage_from_peer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
