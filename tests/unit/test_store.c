/* Tests of the store: the wire format and the key-value state machine on their own, then
 * the embedded server over loopback: the store suite every backend passes
 * (tests/support/test_store_suite.c), authentication, a misbehaving client, stopping the
 * server, and a server in a child process that is really stopped and resumed (reconnect,
 * lease grace). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "keel/store.h"
#include "store/store_internal.h"
#include "test_store_suite.h"
#include "test_support.h"

#define MS ((int64_t)1000000)

static void sleep_ns(int64_t duration_ns) {
  struct timespec delay = {.tv_sec = (time_t)(duration_ns / 1000000000),
                           .tv_nsec = (long)(duration_ns % 1000000000)};
  nanosleep(&delay, NULL);
}

/* ---- wire format */

static void test_request_round_trip(void **state) {
  keel__store_request request = {.op = KEEL__STORE_OP_CAS,
                                 .id = 77,
                                 .revision = 5,
                                 .lease = 3,
                                 .key = "decide/00000001",
                                 .key_length = 15,
                                 .value = (const uint8_t *)"abc",
                                 .value_length = 3};
  keel_buffer buffer;
  keel_buffer_init(&buffer, KEEL__STORE_REQUEST_BUFFER_MAX);
  assert_int_equal(keel__store_request_encode(&request, &buffer), KEEL_OK);
  assert_int_equal(buffer.length, KEEL__STORE_REQUEST_HEADER_BYTES + 18);
  keel__store_request decoded;
  assert_int_equal(keel__store_request_decode(buffer.data, buffer.length, &decoded), KEEL_OK);
  assert_int_equal(decoded.op, KEEL__STORE_OP_CAS);
  assert_int_equal(decoded.id, 77);
  assert_int_equal(decoded.revision, 5);
  assert_int_equal(decoded.lease, 3);
  assert_int_equal(decoded.key_length, 15);
  assert_memory_equal(decoded.key, "decide/00000001", 15);
  assert_int_equal(decoded.value_length, 3);
  assert_memory_equal(decoded.value, "abc", 3);

  /* Every truncation is refused. */
  for (size_t length = 0; length < buffer.length; length++)
    assert_int_not_equal(keel__store_request_decode(buffer.data, length, &decoded), KEEL_OK);
  keel_buffer_free(&buffer);
}

static void test_request_decode_refuses(void **state) {
  keel_buffer buffer;
  keel_buffer_init(&buffer, KEEL__STORE_REQUEST_BUFFER_MAX);
  keel__store_request get = {.op = KEEL__STORE_OP_GET, .id = 1, .key = "k", .key_length = 1};
  assert_int_equal(keel__store_request_encode(&get, &buffer), KEEL_OK);
  keel__store_request decoded;
  uint8_t wire[KEEL__STORE_REQUEST_HEADER_BYTES + 1];
  memcpy(wire, buffer.data, sizeof wire);

  wire[0] = 2; /* version */
  assert_int_equal(keel__store_request_decode(wire, sizeof wire, &decoded), KEEL_EPROTO);
  wire[0] = 1;
  wire[1] = 99; /* op */
  assert_int_equal(keel__store_request_decode(wire, sizeof wire, &decoded), KEEL_EPROTO);
  wire[1] = KEEL__STORE_OP_GET;
  wire[16] = 1; /* a revision on a get */
  assert_int_equal(keel__store_request_decode(wire, sizeof wire, &decoded), KEEL_ECORRUPT);
  wire[16] = 0;
  wire[KEEL__STORE_REQUEST_HEADER_BYTES] = '\0'; /* NUL in the key */
  assert_int_equal(keel__store_request_decode(wire, sizeof wire, &decoded), KEEL_ECORRUPT);
  wire[KEEL__STORE_REQUEST_HEADER_BYTES] = 'k';
  wire[2] = 0x01; /* key length 513 */
  wire[3] = 0x02;
  assert_int_equal(keel__store_request_decode(wire, sizeof wire, &decoded), KEEL_ERANGE);
  wire[2] = 1;
  wire[3] = 0;
  wire[7] = 0x10; /* value length way past the bound */
  assert_int_equal(keel__store_request_decode(wire, sizeof wire, &decoded), KEEL_ERANGE);
  wire[7] = 0;
  assert_int_equal(keel__store_request_decode(wire, sizeof wire, &decoded), KEEL_OK);

  keel__store_request too_long = {
      .op = KEEL__STORE_OP_GET, .key = "k", .key_length = KEEL_STORE_MAX_KEY + 1};
  assert_int_equal(keel__store_request_encode(&too_long, &buffer), KEEL_ERANGE);
  keel_buffer_free(&buffer);
}

/* ---- the state machine, driven directly */

typedef struct kv_fixture {
  keel__store_kv *kv;
  keel_buffer response;
  keel__store_response decoded;
  bool changed;
} kv_fixture;

static keel_status kv_do(kv_fixture *fixture, keel__store_request request, int64_t now_ns) {
  keel_buffer_reset(&fixture->response);
  assert_int_equal(
      keel__store_kv_apply(fixture->kv, &request, now_ns, &fixture->response, &fixture->changed),
      KEEL_OK);
  assert_int_equal(keel__store_response_decode(fixture->response.data, fixture->response.length,
                                               &fixture->decoded),
                   KEEL_OK);
  return fixture->decoded.status;
}

static keel_status kv_put(kv_fixture *fixture, const char *key, const char *value, int64_t lease,
                          int64_t now_ns) {
  keel__store_request request = {.op = KEEL__STORE_OP_PUT,
                                 .key = key,
                                 .key_length = strlen(key),
                                 .value = (const uint8_t *)value,
                                 .value_length = strlen(value),
                                 .lease = lease};
  return kv_do(fixture, request, now_ns);
}

static keel_status kv_delete(kv_fixture *fixture, const char *key) {
  keel__store_request request = {
      .op = KEEL__STORE_OP_DELETE, .key = key, .key_length = strlen(key)};
  return kv_do(fixture, request, 0);
}

static int kv_setup(void **state) {
  kv_fixture *fixture = calloc(1, sizeof *fixture);
  assert_non_null(fixture);
  assert_int_equal(keel__store_kv_create(&fixture->kv), KEEL_OK);
  keel_buffer_init(&fixture->response, KEEL__STORE_RESPONSE_BUFFER_MAX);
  *state = fixture;
  return 0;
}

static int kv_teardown(void **state) {
  kv_fixture *fixture = *state;
  keel_buffer_free(&fixture->response);
  keel__store_kv_destroy(fixture->kv);
  free(fixture);
  return 0;
}

static void test_kv_list_sorted(void **state) {
  kv_fixture *fixture = *state;
  const char *keys[] = {"b/2", "a", "b/10", "b/1", "c", "b/"};
  for (int i = 0; i < 6; i++) assert_int_equal(kv_put(fixture, keys[i], keys[i], 0, 0), KEEL_OK);
  assert_int_equal(keel__store_kv_revision(fixture->kv), 6);
  keel__store_request list = {.op = KEEL__STORE_OP_LIST, .key = "b/", .key_length = 2};
  assert_int_equal(kv_do(fixture, list, 0), KEEL_OK);
  keel_store_entry *entries;
  assert_int_equal(keel__store_response_entries(&fixture->decoded, &entries), KEEL_OK);
  assert_int_equal(fixture->decoded.entry_count, 4);
  const char *expected[] = {"b/", "b/1", "b/10", "b/2"};
  for (int i = 0; i < 4; i++) assert_string_equal(entries[i].key, expected[i]);
  keel_store_entries_free(entries, fixture->decoded.entry_count);
}

static void test_kv_changed_since_deletions(void **state) {
  kv_fixture *fixture = *state;
  assert_int_equal(kv_put(fixture, "p/a", "1", 0, 0), KEEL_OK);
  assert_int_equal(kv_put(fixture, "q/a", "1", 0, 0), KEEL_OK);
  uint64_t revision = keel__store_kv_revision(fixture->kv);
  assert_false(keel__store_kv_changed_since(fixture->kv, "p/", 2, revision));
  assert_true(keel__store_kv_changed_since(fixture->kv, "p/", 2, revision - 2));
  assert_int_equal(kv_delete(fixture, "p/a"), KEEL_OK);
  assert_true(fixture->changed);
  assert_true(keel__store_kv_changed_since(fixture->kv, "p/", 2, revision));
  assert_false(keel__store_kv_changed_since(fixture->kv, "q/", 2, revision));
  assert_int_equal(kv_delete(fixture, "p/a"), KEEL_ENOTFOUND);
  assert_false(fixture->changed);

  /* Past the remembered deletions a waiter is woken (conservatively), never missed. */
  uint64_t old = keel__store_kv_revision(fixture->kv);
  char key[32];
  for (int i = 0; i < 3000; i++) {
    snprintf(key, sizeof key, "r/%d", i);
    assert_int_equal(kv_put(fixture, key, "x", 0, 0), KEEL_OK);
    assert_int_equal(kv_delete(fixture, key), KEEL_OK);
  }
  assert_true(keel__store_kv_changed_since(fixture->kv, "q/", 2, old));
  uint64_t recent = keel__store_kv_revision(fixture->kv);
  assert_int_equal(kv_delete(fixture, "q/a"), KEEL_OK);
  assert_true(keel__store_kv_changed_since(fixture->kv, "q/", 2, recent));
  assert_false(keel__store_kv_changed_since(fixture->kv, "r/", 2, recent));
}

static void test_kv_leases_on_a_driven_clock(void **state) {
  kv_fixture *fixture = *state;
  keel__store_request grant = {.op = KEEL__STORE_OP_LEASE_GRANT, .duration_ns = 100};
  assert_int_equal(kv_do(fixture, grant, 1000), KEEL_OK);
  int64_t lease = fixture->decoded.lease;
  assert_true(lease > 0);
  assert_int_equal(keel__store_kv_next_expiry(fixture->kv), 1100);
  assert_int_equal(kv_put(fixture, "proc/1", "a", lease, 1010), KEEL_OK);
  assert_int_equal(kv_put(fixture, "proc/2", "b", lease, 1020), KEEL_OK);
  assert_int_equal(kv_put(fixture, "other", "c", 0, 1030), KEEL_OK);
  assert_int_equal(kv_put(fixture, "x", "d", lease + 1, 1030), KEEL_ENOTFOUND);
  keel__store_request keepalive = {.op = KEEL__STORE_OP_LEASE_KEEPALIVE, .lease = lease};
  assert_int_equal(kv_do(fixture, keepalive, 1090), KEEL_OK);
  assert_false(keel__store_kv_expire(fixture->kv, 1150));
  uint64_t before = keel__store_kv_revision(fixture->kv);
  assert_true(keel__store_kv_expire(fixture->kv, 1190));
  /* Both keys go with one revision. */
  assert_int_equal(keel__store_kv_revision(fixture->kv), before + 1);
  keel__store_request list = {.op = KEEL__STORE_OP_LIST};
  assert_int_equal(kv_do(fixture, list, 1200), KEEL_OK);
  assert_int_equal(fixture->decoded.entry_count, 1);
  assert_int_equal(kv_do(fixture, keepalive, 1200), KEEL_ENOTFOUND);
  assert_int_equal(keel__store_kv_next_expiry(fixture->kv), KEEL_NO_DEADLINE);
}

/* Lease grace after a stall of the server, on a driven clock. One lease of ttl_ns is
 * granted at 0 (with a key) and never kept alive; the kv is serviced every lease tick
 * except between gap_from_ns and gap_from_ns + gap_ns. The key must still be there at
 * alive_at_ns and gone by gone_by_ns. */
typedef struct stall_case {
  const char *name;
  int64_t ttl_ns;
  int64_t gap_from_ns;
  int64_t gap_ns; /* 0: serviced every tick throughout */
  uint64_t stalls;
  int64_t alive_at_ns;
  int64_t gone_by_ns;
} stall_case;

static const stall_case stall_cases[] = {
    /* The server did not run for 10 s: the lease lives one ttl past the resume. */
    {"a 10 s stall right after the grant", 1000 * MS, 0, 10000 * MS, 1, 10900 * MS, 11000 * MS},
    /* The holder stopped, not the server: no grace, the ttl is kept to the tick. */
    {"serviced every tick", 1000 * MS, 0, 0, 0, 900 * MS, 1000 * MS},
    /* A gap of exactly the threshold is a slow tick, not a stall. */
    {"a gap of the threshold", 1000 * MS, 300 * MS, KEEL__STORE_STALL_NS, 0, 900 * MS, 1000 * MS},
    /* A stall shorter than the ttl still gives a whole ttl from the resume. */
    {"a 600 ms stall", 1000 * MS, 200 * MS, 600 * MS, 1, 1700 * MS, 1800 * MS},
    /* A stall after the lease went finds nothing to extend and counts nothing. */
    {"a stall after the expiry", 1000 * MS, 1500 * MS, 5000 * MS, 0, 900 * MS, 1000 * MS},
};

static void test_kv_stall_grace(void **state) {
  /* Monotonic times are far from 0 on a real machine; so are these. */
  const int64_t base_ns = 1000000 * MS;
  for (size_t c = 0; c < sizeof stall_cases / sizeof stall_cases[0]; c++) {
    const stall_case *test = &stall_cases[c];
    kv_fixture *fixture = NULL;
    assert_int_equal(kv_setup((void **)&fixture), 0);
    keel__store_request grant = {.op = KEEL__STORE_OP_LEASE_GRANT, .duration_ns = test->ttl_ns};
    assert_int_equal(kv_do(fixture, grant, base_ns), KEEL_OK);
    int64_t lease = fixture->decoded.lease;
    assert_int_equal(kv_put(fixture, "proc/1", "a", lease, base_ns), KEEL_OK);
    keel__store_request get = {.op = KEEL__STORE_OP_GET, .key = "proc/1", .key_length = 6};
    int64_t gone_ns = -1;
    int64_t end_ns = test->gap_from_ns + test->gap_ns;
    if (end_ns < test->gone_by_ns) end_ns = test->gone_by_ns;
    for (int64_t t = 0; t <= end_ns + 1000 * MS; t += KEEL__STORE_LEASE_TICK_NS) {
      if (t > test->gap_from_ns && t < test->gap_from_ns + test->gap_ns) continue;
      /* The lease thread's service, then a client's request at the same time. */
      keel__store_kv_expire(fixture->kv, base_ns + t);
      if (kv_do(fixture, get, base_ns + t) == KEEL_ENOTFOUND && gone_ns < 0) gone_ns = t;
    }
    uint64_t stalls = keel__store_kv_stalls(fixture->kv);
    kv_teardown((void **)&fixture);
    if (gone_ns <= test->alive_at_ns || gone_ns > test->gone_by_ns)
      fail_msg("%s: the lease went at %lld ms, expected after %lld ms and by %lld ms", test->name,
               (long long)(gone_ns / MS), (long long)(test->alive_at_ns / MS),
               (long long)(test->gone_by_ns / MS));
    if (stalls != test->stalls)
      fail_msg("%s: %llu stalls counted, expected %llu", test->name, (unsigned long long)stalls,
               (unsigned long long)test->stalls);
  }
}

/* An idle store without leases is not serviced for long; that is no stall, and a lease
 * granted afterwards keeps its ttl exactly. */
static void test_kv_idle_store_is_no_stall(void **state) {
  kv_fixture *fixture = *state;
  const int64_t base_ns = 1000000 * MS;
  assert_int_equal(kv_put(fixture, "other", "x", 0, base_ns), KEEL_OK);
  keel__store_request grant = {.op = KEEL__STORE_OP_LEASE_GRANT, .duration_ns = 1000 * MS};
  assert_int_equal(kv_do(fixture, grant, base_ns + 60000 * MS), KEEL_OK);
  assert_int_equal(keel__store_kv_next_expiry(fixture->kv), base_ns + 61000 * MS);
  assert_int_equal(keel__store_kv_stalls(fixture->kv), 0);
  /* A stall with the lease in place moves its expiry to a ttl past the resume. */
  assert_false(keel__store_kv_expire(fixture->kv, base_ns + 64000 * MS));
  assert_int_equal(keel__store_kv_next_expiry(fixture->kv), base_ns + 65000 * MS);
  assert_int_equal(keel__store_kv_stalls(fixture->kv), 1);
}

/* ---- the embedded server over loopback */

typedef struct server_fixture {
  keel_auth auth;
  keel_store_server *server;
  keel_store *store;
} server_fixture;

static keel_store *connect_store(server_fixture *fixture) {
  keel_store *store = NULL;
  assert_int_equal(keel_store_connect(keel_store_server_address(fixture->server), &fixture->auth,
                                      keel_deadline_after_ns(5000 * MS), &store),
                   KEEL_OK);
  return store;
}

static int server_setup(void **state) {
  server_fixture *fixture = calloc(1, sizeof *fixture);
  assert_non_null(fixture);
  assert_int_equal(keel_auth_generate(&fixture->auth), KEEL_OK);
  assert_int_equal(keel_store_server_start("127.0.0.1:0", &fixture->auth, &fixture->server),
                   KEEL_OK);
  fixture->store = connect_store(fixture);
  *state = fixture;
  return 0;
}

static int server_teardown(void **state) {
  server_fixture *fixture = *state;
  keel_store_close(fixture->store);
  keel_store_server_stop(fixture->server);
  free(fixture);
  return 0;
}

/* A malformed prefix list on the wire is refused by the decoder: one that does not end in
 * NUL, an empty prefix, overlapping prefixes, none at all. */
static void test_list_prefixes_malformed_on_the_wire(void **unused) {
  (void)unused;
  static const struct {
    const char *value;
    size_t length;
  } malformed[] = {{"proc/", 5}, {"proc/\0\0", 7}, {"proc/\0proc/1\0", 14}, {"", 0}};
  for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
    keel__store_request request = {.op = KEEL__STORE_OP_LIST_PREFIXES,
                                   .value = (const uint8_t *)malformed[i].value,
                                   .value_length = malformed[i].length};
    keel_buffer buffer;
    keel_buffer_init(&buffer, KEEL__STORE_REQUEST_BUFFER_MAX);
    assert_int_equal(keel__store_request_encode(&request, &buffer), KEEL_OK);
    keel__store_request decoded;
    assert_int_equal(keel__store_request_decode(buffer.data, buffer.length, &decoded),
                     KEEL_ECORRUPT);
    keel_buffer_free(&buffer);
  }
}

/* ---- the store suite (tests/support/test_store_suite.c) against embedded servers */

static void embedded_open(keel_test_store_backend *backend, const keel_auth *auth, char *endpoint,
                          size_t capacity, void **context_p) {
  keel_store_server *server = NULL;
  assert_int_equal(keel_store_server_start("127.0.0.1:0", auth, &server), KEEL_OK);
  snprintf(endpoint, capacity, "%s", keel_store_server_address(server));
  *context_p = server;
}

static void embedded_close(keel_test_store_backend *backend, void *context) {
  keel_store_server_stop(context);
}

static void test_wrong_token_cannot_connect(void **state) {
  server_fixture *fixture = *state;
  keel_auth impostor = fixture->auth;
  impostor.token[0] ^= 1;
  keel_store *store = NULL;
  assert_int_equal(keel_store_connect(keel_store_server_address(fixture->server), &impostor,
                                      keel_deadline_after_ns(3000 * MS), &store),
                   KEEL_EAUTH);
  assert_null(store);
  /* The server still serves the rightful clients. */
  keel_test_store_put_text(fixture->store, "after/impostor", "1", NULL);
}

static void test_garbage_frame_drops_only_that_client(void **state) {
  server_fixture *fixture = *state;
  keel_link *link;
  assert_int_equal(keel_link_connect(keel_store_server_address(fixture->server), &fixture->auth,
                                     keel_deadline_after_ns(5000 * MS), &link),
                   KEEL_OK);
  uint8_t garbage[64];
  for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (uint8_t)(i * 37 + 11);
  keel_frame frame = {.type = KEEL_FRAME_STORE_REQUEST, .tag = 1};
  assert_int_equal(
      keel_link_send(link, &frame, garbage, sizeof garbage, keel_deadline_after_ns(2000 * MS)),
      KEEL_OK);
  void *payload = NULL;
  keel_status status = keel_link_recv(link, &frame, &payload, keel_deadline_after_ns(2000 * MS));
  assert_int_not_equal(status, KEEL_OK);
  assert_int_not_equal(status, KEEL_ETIMEDOUT); /* closed, not merely silent */
  keel_link_close(link);

  keel_test_store_put_text(fixture->store, "still/working", "1", NULL);
  keel_store_entry *entry;
  assert_int_equal(keel_store_get(fixture->store, "still/working", &entry), KEEL_OK);
  keel_store_entry_free(entry);
}

static void test_silent_connector_does_not_stall_clients(void **state) {
  server_fixture *fixture = *state;
  const char *address = keel_store_server_address(fixture->server);
  struct sockaddr_in peer = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)atoi(strrchr(address, ':') + 1))};
  inet_pton(AF_INET, "127.0.0.1", &peer.sin_addr);
  int silent = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(silent >= 0);
  assert_int_equal(connect(silent, (struct sockaddr *)&peer, sizeof peer), 0);
  sleep_ns(50 * MS); /* the accept thread now waits on its handshake */
  int64_t start = keel_now_ns();
  for (int i = 0; i < 10; i++) keel_test_store_put_text(fixture->store, "busy/key", "1", NULL);
  assert_true(keel_now_ns() - start < 500 * MS);
  close(silent);
}

static void test_two_servers_in_one_process(void **state) {
  server_fixture *first = *state;
  server_fixture second = {.auth = first->auth};
  assert_int_equal(keel_store_server_start("127.0.0.1:0", &second.auth, &second.server), KEEL_OK);
  assert_string_not_equal(keel_store_server_address(first->server),
                          keel_store_server_address(second.server));
  keel_store *other = connect_store(&second);
  keel_test_store_put_text(first->store, "only/first", "1", NULL);
  keel_test_store_put_text(other, "only/second", "2", NULL);
  keel_store_entry *entry;
  assert_int_equal(keel_store_get(other, "only/first", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_get(first->store, "only/second", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_get(other, "only/second", &entry), KEEL_OK);
  keel_store_entry_free(entry);
  keel_store_close(other);
  keel_store_server_stop(second.server);
}

/* The embedded store is one process: no members to ask about an election (an agent then
 * fences as the heartbeat says, finding 37). */
static void test_quorum_read_needs_members(void **state) {
  server_fixture *fixture = *state;
  keel_store_quorum quorum;
  assert_int_equal(
      keel_store_quorum_read(fixture->store, keel_deadline_after_ns(1000 * MS), &quorum),
      KEEL_ENOTSUP);
  assert_int_equal(keel_store_quorum_read(fixture->store, keel_deadline_after_ns(1000 * MS), NULL),
                   KEEL_EINVAL);
}

static void test_stop_while_waiting(void **state) {
  server_fixture *fixture = *state;
  uint64_t revision = keel_test_store_revision(fixture->store);
  keel_test_waiter w;
  keel_test_waiter_start(&w, keel_store_server_address(fixture->server), &fixture->auth, "never/",
                         revision, 20000 * MS);
  sleep_ns(100 * MS);
  int64_t stop_ns = keel_now_ns();
  keel_store_server_stop(fixture->server);
  fixture->server = NULL;
  keel_test_waiter_finish(&w);
  assert_int_equal(w.status, KEEL_ECLOSED);
  assert_true(w.returned_ns - stop_ns < 2000 * MS);
  /* Other handles learn it on their next call. */
  keel_store_entry *entry;
  assert_int_equal(keel_store_get(fixture->store, "any", &entry), KEEL_ECLOSED);
}

/* A server that stops and comes back on the same address: the request on the broken link
 * says so, the next one reconnects. */
static void test_reconnect_after_server_restart(void **state) {
  server_fixture *fixture = *state;
  char address[64];
  snprintf(address, sizeof address, "%s", keel_store_server_address(fixture->server));
  keel_test_store_put_text(fixture->store, "before", "1", NULL);
  assert_int_equal(keel_store_reconnects(fixture->store), 0);
  keel_store_server_stop(fixture->server);
  fixture->server = NULL;
  assert_int_equal(keel_store_server_start(address, &fixture->auth, &fixture->server), KEEL_OK);
  keel_store_entry *entry = NULL;
  assert_int_equal(keel_store_get(fixture->store, "before", &entry), KEEL_ECLOSED);
  assert_int_equal(keel_store_reconnects(fixture->store), 0);
  keel_test_store_put_text(fixture->store, "after", "2", NULL);
  assert_int_equal(keel_store_reconnects(fixture->store), 1);
  /* A new server starts empty: this is its answer, not the old one's. */
  assert_int_equal(keel_store_get(fixture->store, "before", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_get(fixture->store, "after", &entry), KEEL_OK);
  keel_store_entry_free(entry);
  assert_int_equal(keel_store_reconnects(fixture->store), 1);
  assert_int_equal(keel_store_set_timeout(fixture->store, 0), KEEL_EINVAL);
  assert_int_equal(keel_store_set_timeout(fixture->store, -5), KEEL_EINVAL);
}

/* ---- a store server in a child process, really stopped (SIGSTOP) and resumed */

#define STALL_TTL_NS (1000 * MS)

static void cond_init_monotonic(pthread_cond_t *cond) {
  pthread_condattr_t attributes;
  pthread_condattr_init(&attributes);
  pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
  pthread_cond_init(cond, &attributes);
  pthread_condattr_destroy(&attributes);
}

static void cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *lock, int64_t deadline_ns) {
  struct timespec until = {.tv_sec = (time_t)(deadline_ns / 1000000000),
                           .tv_nsec = (long)(deadline_ns % 1000000000)};
  pthread_cond_timedwait(cond, lock, &until);
}

/* A lease holder as the runtime's keepalive thread is: its own handle with a short
 * timeout, a keepalive every period whatever the last one returned. It counts what it
 * got; no cmocka asserts off the main thread. */
typedef struct keeper {
  keel_store *store;
  int64_t lease;
  int64_t period_ns;
  pthread_mutex_t lock;      /* guards everything below */
  pthread_cond_t progressed; /* a keepalive returned, or stop was asked */
  bool stop;
  int ok;
  int timed_out;
  int not_found;
  int other;
  int64_t last_ok_sent_ns; /* when the latest keepalive that succeeded was sent */
  pthread_t thread;
  bool started;
} keeper;

static void *keeper_main(void *argument) {
  keeper *k = argument;
  pthread_mutex_lock(&k->lock);
  while (!k->stop) {
    pthread_mutex_unlock(&k->lock);
    int64_t sent_ns = keel_now_ns();
    keel_status status = keel_store_lease_keepalive(k->store, k->lease);
    pthread_mutex_lock(&k->lock);
    if (status == KEEL_OK) {
      k->ok++;
      k->last_ok_sent_ns = sent_ns;
    } else if (status == KEEL_ETIMEDOUT) {
      k->timed_out++;
    } else if (status == KEEL_ENOTFOUND) {
      k->not_found++;
    } else {
      k->other++;
    }
    pthread_cond_broadcast(&k->progressed);
    int64_t next_ns = sent_ns + k->period_ns;
    while (!k->stop && keel_now_ns() < next_ns) cond_wait_until(&k->progressed, &k->lock, next_ns);
  }
  pthread_mutex_unlock(&k->lock);
  return NULL;
}

/* Connects the keeper's handle and starts its thread; false (with nothing left running)
 * when it cannot. */
static bool keeper_start(keeper *k, const char *address, const keel_auth *auth, int64_t lease) {
  *k = (keeper){.lease = lease, .period_ns = 300 * MS};
  if (keel_store_connect(address, auth, keel_deadline_after_ns(5000 * MS), &k->store) != KEEL_OK)
    return false;
  keel_store_set_timeout(k->store, 300 * MS);
  pthread_mutex_init(&k->lock, NULL);
  cond_init_monotonic(&k->progressed);
  k->started = pthread_create(&k->thread, NULL, keeper_main, k) == 0;
  return k->started;
}

/* True once a keepalive sent at or after since_ns succeeded; false at deadline_ns. */
static bool keeper_await_ok(keeper *k, int64_t since_ns, int64_t deadline_ns) {
  pthread_mutex_lock(&k->lock);
  while (!(k->ok > 0 && k->last_ok_sent_ns >= since_ns) && keel_now_ns() < deadline_ns)
    cond_wait_until(&k->progressed, &k->lock, deadline_ns);
  bool done = k->ok > 0 && k->last_ok_sent_ns >= since_ns;
  pthread_mutex_unlock(&k->lock);
  return done;
}

/* Stops and joins the thread (within a period and a request timeout); idempotent. The
 * handle stays open for its counters until keeper_release. */
static void keeper_stop(keeper *k) {
  if (!k->started) return;
  pthread_mutex_lock(&k->lock);
  k->stop = true;
  pthread_cond_broadcast(&k->progressed);
  pthread_mutex_unlock(&k->lock);
  pthread_join(k->thread, NULL);
  k->started = false;
}

static void keeper_release(keeper *k) {
  keeper_stop(k);
  if (k->store == NULL) return;
  keel_store_close(k->store);
  k->store = NULL;
  pthread_cond_destroy(&k->progressed);
  pthread_mutex_destroy(&k->lock);
}

typedef struct child_fixture {
  keel_auth auth;
  pid_t pid;      /* the server's process; 0 once reaped */
  int control_fd; /* the child serves until this closes; -1 once closed */
  char address[64];
  keel_store *store;
  keeper keeper;
} child_fixture;

/* The child: serves the store until the parent closes the control pipe (or it is killed,
 * as it normally is). Uses no cmocka: its failures are exit codes the parent never needs,
 * since the parent then gets no address. */
static _Noreturn void child_serve(const keel_auth *auth, pid_t parent, int address_fd,
                                  int control_fd) {
  /* A child that outlived its test would keep a port, or stay stopped, forever. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(2);
  keel_store_server *server;
  if (keel_store_server_start("127.0.0.1:0", auth, &server) != KEEL_OK) _exit(1);
  const char *address = keel_store_server_address(server);
  size_t length = strlen(address);
  if (write(address_fd, address, length) != (ssize_t)length) _exit(1);
  close(address_fd);
  char byte;
  while (read(control_fd, &byte, 1) < 0 && errno == EINTR) {
  }
  keel_store_server_stop(server);
  _exit(0);
}

/* What the child writes before it closes its end of the pipe, within timeout_ns. */
static bool read_address(int fd, char *address, size_t capacity, int64_t timeout_ns) {
  int64_t deadline_ns = keel_deadline_after_ns(timeout_ns);
  size_t length = 0;
  for (;;) {
    struct pollfd readable = {.fd = fd, .events = POLLIN};
    int ready = poll(&readable, 1, keel_poll_timeout_ms(deadline_ns));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    ssize_t got = read(fd, address + length, capacity - 1 - length);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return false;
    if (got == 0) break;
    length += (size_t)got;
    if (length == capacity - 1) return false;
  }
  address[length] = '\0';
  return length > 0;
}

/* Kills and reaps the child first (a keeper blocked on a stopped server then fails at
 * once), then the keeper and the handles. Serves a failed setup and every teardown, so
 * it copes with whatever was made. */
static void child_fixture_release(child_fixture *fixture) {
  if (fixture->pid > 0) {
    kill(fixture->pid, SIGKILL); /* SIGKILL ends a stopped process too */
    if (!keel_test_wait(fixture->pid, 10000, NULL))
      fprintf(stderr, "store server child %d not reaped after SIGKILL\n", (int)fixture->pid);
    fixture->pid = 0;
  }
  keeper_release(&fixture->keeper);
  keel_store_close(fixture->store);
  if (fixture->control_fd >= 0) close(fixture->control_fd);
  free(fixture);
}

static int child_setup(void **state) {
  child_fixture *fixture = calloc(1, sizeof *fixture);
  if (fixture == NULL) return -1;
  fixture->control_fd = -1;
  int address_pipe[2];
  int control_pipe[2];
  if (keel_auth_generate(&fixture->auth) != KEEL_OK) goto fail_release_fixture;
  if (pipe2(address_pipe, O_CLOEXEC) != 0) goto fail_release_fixture;
  if (pipe2(control_pipe, O_CLOEXEC) != 0) goto fail_close_address_pipe;
  /* No other thread runs in this process now, so the child may start threads of its own. */
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    close(address_pipe[0]);
    close(control_pipe[1]);
    child_serve(&fixture->auth, parent, address_pipe[1], control_pipe[0]);
  }
  close(control_pipe[0]);
  fixture->control_fd = control_pipe[1];
  close(address_pipe[1]);
  bool ready = false;
  if (pid > 0) {
    fixture->pid = pid;
    ready = read_address(address_pipe[0], fixture->address, sizeof fixture->address,
                         10000 * MS * keel_test_slowdown());
  }
  close(address_pipe[0]);
  if (!ready) goto fail_release_fixture;
  if (keel_store_connect(fixture->address, &fixture->auth, keel_deadline_after_ns(5000 * MS),
                         &fixture->store) != KEEL_OK)
    goto fail_release_fixture;
  *state = fixture;
  return 0;

fail_close_address_pipe:
  close(address_pipe[0]);
  close(address_pipe[1]);
fail_release_fixture:
  child_fixture_release(fixture);
  return -1;
}

static int child_teardown(void **state) {
  child_fixture_release(*state);
  return 0;
}

/* Waits until pid is stopped (state T in /proc) or, with stopped false, no longer so. */
static bool wait_stopped(pid_t pid, bool stopped, int64_t timeout_ns) {
  int64_t deadline_ns = keel_deadline_after_ns(timeout_ns);
  for (;;) {
    char process_state;
    int parent;
    if (keel_process_stat(pid, &process_state, &parent) == KEEL_OK &&
        (process_state == 'T') == stopped)
      return true;
    if (keel_now_ns() >= deadline_ns) return false;
    sleep_ns(1 * MS);
  }
}

static void test_client_reconnects_after_server_stall(void **state) {
  child_fixture *fixture = *state;
  keel_store *store = fixture->store;
  keel_test_store_put_text(store, "stale", "old", NULL);
  keel_test_store_put_text(store, "fresh", "new", NULL);
  assert_int_equal(keel_store_set_timeout(store, 300 * MS), KEEL_OK);
  assert_int_equal(keel_store_reconnects(store), 0);

  assert_int_equal(kill(fixture->pid, SIGSTOP), 0);
  assert_true(wait_stopped(fixture->pid, true, 2000 * MS));
  keel_store_entry *entry = NULL;
  int64_t start_ns = keel_now_ns();
  assert_int_equal(keel_store_get(store, "stale", &entry), KEEL_ETIMEDOUT);
  int64_t elapsed_ns = keel_now_ns() - start_ns;
  assert_true(elapsed_ns >= 250 * MS);
  assert_true(elapsed_ns < 2000 * MS);
  /* Still stopped: the reconnect this request makes first fails within the same bound. */
  start_ns = keel_now_ns();
  assert_int_equal(keel_store_get(store, "fresh", &entry), KEEL_ETIMEDOUT);
  assert_true(keel_now_ns() - start_ns < 2000 * MS);
  assert_int_equal(keel_store_reconnects(store), 0);

  assert_int_equal(kill(fixture->pid, SIGCONT), 0);
  assert_true(wait_stopped(fixture->pid, false, 2000 * MS));
  /* The server now answers the abandoned get of "stale" on the dropped link; the next
   * request gets its own answer. A generous timeout: a loaded machine must not fail it. */
  assert_int_equal(keel_store_set_timeout(store, 5000 * MS), KEEL_OK);
  assert_int_equal(keel_store_get(store, "fresh", &entry), KEEL_OK);
  assert_string_equal((char *)entry->value, "new");
  keel_store_entry_free(entry);
  assert_int_equal(keel_store_reconnects(store), 1);
  keel_test_store_put_text(store, "after", "1", NULL);
  assert_int_equal(keel_store_reconnects(store), 1);
}

/* Leases A and B (ttl 1 s) across a 5 s stop of the server: A's holder keeps sending
 * keepalives (timeouts during the stall, a reconnect after it) and keeps A; B had its
 * last keepalive just before the stall and goes about one ttl after the resume, not at
 * once. */
static void test_leases_across_a_server_stall(void **state) {
  child_fixture *fixture = *state;
  keel_store *store = fixture->store;
  int64_t slack_ns = 700 * MS * keel_test_slowdown();
  int64_t kept;
  int64_t dropped;
  assert_int_equal(keel_store_lease_grant(store, STALL_TTL_NS, &kept), KEEL_OK);
  assert_int_equal(keel_store_lease_grant(store, STALL_TTL_NS, &dropped), KEEL_OK);
  assert_int_equal(keel_store_put(store, "held/a", "a", 1, kept, NULL), KEEL_OK);
  assert_int_equal(keel_store_put(store, "held/b", "b", 1, dropped, NULL), KEEL_OK);
  uint64_t before = keel_test_store_revision(store);
  assert_true(keeper_start(&fixture->keeper, fixture->address, &fixture->auth, kept));
  assert_true(keeper_await_ok(&fixture->keeper, 0, keel_deadline_after_ns(5000 * MS)));

  assert_int_equal(keel_store_lease_keepalive(store, dropped), KEEL_OK); /* B's last */
  assert_int_equal(kill(fixture->pid, SIGSTOP), 0);
  assert_true(wait_stopped(fixture->pid, true, 2000 * MS));
  sleep_ns(5000 * MS); /* the stall itself: a span of time, nothing to await */
  int64_t resume_ns = keel_now_ns();
  assert_int_equal(kill(fixture->pid, SIGCONT), 0);
  assert_true(wait_stopped(fixture->pid, false, 2000 * MS));

  /* B's ttl passed long ago, but the server grants a ttl from its resume. */
  assert_int_equal(
      keel_store_wait(store, "held/b", before, resume_ns + STALL_TTL_NS + 3 * slack_ns, NULL),
      KEEL_OK);
  int64_t gone_ns = keel_now_ns() - resume_ns;
  print_message("lease B went %lld ms after the resume\n", (long long)(gone_ns / MS));
  assert_true(gone_ns >= STALL_TTL_NS);
  assert_true(gone_ns < STALL_TTL_NS + slack_ns);
  keel_store_entry *entry = NULL;
  assert_int_equal(keel_store_get(store, "held/b", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_lease_keepalive(store, dropped), KEEL_ENOTFOUND);

  /* A's holder reconnected and kept it: no change under held/a for 2 s past the resume. */
  assert_true(keeper_await_ok(&fixture->keeper, resume_ns, resume_ns + 3 * slack_ns));
  assert_int_equal(keel_store_wait(store, "held/a", before, resume_ns + 2000 * MS, NULL),
                   KEEL_ETIMEDOUT);
  assert_int_equal(keel_store_get(store, "held/a", &entry), KEEL_OK);
  assert_int_equal(entry->lease, kept);
  keel_store_entry_free(entry);

  keeper_stop(&fixture->keeper);
  print_message("keeper: %d ok, %d timed out, %d not found, %d other, %llu reconnects\n",
                fixture->keeper.ok, fixture->keeper.timed_out, fixture->keeper.not_found,
                fixture->keeper.other,
                (unsigned long long)keel_store_reconnects(fixture->keeper.store));
  assert_true(fixture->keeper.timed_out >= 1);
  assert_int_equal(fixture->keeper.not_found, 0);
  assert_true(keel_store_reconnects(fixture->keeper.store) >= 1);
  assert_int_equal(keel_store_reconnects(store), 0); /* idle through the stall: never dropped */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_request_round_trip),
      cmocka_unit_test(test_request_decode_refuses),
      cmocka_unit_test_setup_teardown(test_kv_list_sorted, kv_setup, kv_teardown),
      cmocka_unit_test_setup_teardown(test_kv_changed_since_deletions, kv_setup, kv_teardown),
      cmocka_unit_test_setup_teardown(test_kv_leases_on_a_driven_clock, kv_setup, kv_teardown),
      cmocka_unit_test(test_kv_stall_grace),
      cmocka_unit_test_setup_teardown(test_kv_idle_store_is_no_stall, kv_setup, kv_teardown),
      cmocka_unit_test(test_list_prefixes_malformed_on_the_wire),
      cmocka_unit_test_setup_teardown(test_wrong_token_cannot_connect, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_garbage_frame_drops_only_that_client, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_silent_connector_does_not_stall_clients, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_two_servers_in_one_process, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_stop_while_waiting, server_setup, server_teardown),
      cmocka_unit_test_setup_teardown(test_quorum_read_needs_members, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_reconnect_after_server_restart, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_client_reconnects_after_server_stall, child_setup,
                                      child_teardown),
      cmocka_unit_test_setup_teardown(test_leases_across_a_server_stall, child_setup,
                                      child_teardown),
  };
  int failures = cmocka_run_group_tests_name("embedded server", tests, NULL, NULL);
  /* The embedded server keeps a lease to within its 100 ms tick. */
  keel_test_store_backend embedded = {.open = embedded_open,
                                      .close = embedded_close,
                                      .lease_ttl_ns = 200 * MS,
                                      .expiry_slack_ns = 100 * MS};
  return keel_test_finish(failures + keel_test_store_suite_run("store suite: embedded", &embedded));
}
