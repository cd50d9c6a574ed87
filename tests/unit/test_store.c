/* Tests of the store: the wire format and the key-value state machine on their own, then
 * the embedded server and client over loopback: operations, compare-and-swap races,
 * waits, leases, bounds, authentication, a misbehaving client and stopping the server. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "keel/store.h"
#include "store/store_internal.h"

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

  keel__store_request too_long = {.op = KEEL__STORE_OP_GET, .key = "k",
                                  .key_length = KEEL_STORE_MAX_KEY + 1};
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
  assert_int_equal(keel__store_kv_apply(fixture->kv, &request, now_ns, &fixture->response,
                                        &fixture->changed),
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

static void put_text(keel_store *store, const char *key, const char *value, uint64_t *revision_p) {
  assert_int_equal(keel_store_put(store, key, value, strlen(value), 0, revision_p), KEEL_OK);
}

static void test_put_get_delete_list(void **state) {
  server_fixture *fixture = *state;
  keel_store *store = fixture->store;
  uint64_t first;
  uint64_t second;
  put_text(store, "proc/2", "two", &first);
  put_text(store, "proc/10", "ten", &second);
  assert_int_equal(second, first + 1);
  put_text(store, "proc/1", "one", NULL);
  put_text(store, "dead/1", "", NULL);
  put_text(store, "proc/2", "TWO", NULL);

  keel_store_entry *entry = NULL;
  assert_int_equal(keel_store_get(store, "proc/2", &entry), KEEL_OK);
  assert_string_equal(entry->key, "proc/2");
  assert_string_equal((char *)entry->value, "TWO");
  assert_int_equal(entry->value_length, 3);
  assert_int_equal(entry->revision, second + 3);
  assert_int_equal(entry->lease, 0);
  keel_store_entry_free(entry);
  assert_int_equal(keel_store_get(store, "proc/3", &entry), KEEL_ENOTFOUND);

  keel_store_entry *entries;
  size_t count;
  uint64_t revision;
  assert_int_equal(keel_store_list(store, "proc/", &entries, &count, &revision), KEEL_OK);
  assert_int_equal(count, 3);
  assert_string_equal(entries[0].key, "proc/1");
  assert_string_equal(entries[1].key, "proc/10");
  assert_string_equal(entries[2].key, "proc/2");
  assert_string_equal((char *)entries[1].value, "ten");
  assert_int_equal(revision, second + 3);
  keel_store_entries_free(entries, count);
  assert_int_equal(keel_store_list(store, "", &entries, &count, NULL), KEEL_OK);
  assert_int_equal(count, 4);
  assert_string_equal(entries[0].key, "dead/1");
  assert_int_equal(entries[0].value_length, 0);
  keel_store_entries_free(entries, count);
  assert_int_equal(keel_store_list(store, "none/", &entries, &count, NULL), KEEL_OK);
  assert_int_equal(count, 0);
  keel_store_entries_free(entries, count);

  assert_int_equal(keel_store_delete(store, "proc/10"), KEEL_OK);
  assert_int_equal(keel_store_delete(store, "proc/10"), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_get(store, "proc/10", &entry), KEEL_ENOTFOUND);
  /* A binary value survives the trip whole. */
  uint8_t binary[256];
  for (int i = 0; i < 256; i++) binary[i] = (uint8_t)i;
  assert_int_equal(keel_store_put(store, "blob", binary, sizeof binary, 0, NULL), KEEL_OK);
  assert_int_equal(keel_store_get(store, "blob", &entry), KEEL_OK);
  assert_int_equal(entry->value_length, sizeof binary);
  assert_memory_equal(entry->value, binary, sizeof binary);
  keel_store_entry_free(entry);
}

static void test_cas(void **state) {
  server_fixture *fixture = *state;
  keel_store *store = fixture->store;
  uint64_t created;
  assert_int_equal(keel_store_cas(store, "decide/00000001", 0, "a", 1, 0, &created), KEEL_OK);
  assert_int_equal(keel_store_cas(store, "decide/00000001", 0, "b", 1, 0, NULL), KEEL_ECONFLICT);
  assert_int_equal(keel_store_cas(store, "decide/00000001", created + 5, "b", 1, 0, NULL),
                   KEEL_ECONFLICT);
  keel_store_entry *entry;
  assert_int_equal(keel_store_get(store, "decide/00000001", &entry), KEEL_OK);
  assert_string_equal((char *)entry->value, "a");
  assert_int_equal(entry->revision, created);
  keel_store_entry_free(entry);
  uint64_t replaced;
  assert_int_equal(keel_store_cas(store, "decide/00000001", created, "c", 1, 0, &replaced),
                   KEEL_OK);
  assert_true(replaced > created);
  assert_int_equal(keel_store_cas(store, "missing", 3, "x", 1, 0, NULL), KEEL_ECONFLICT);
  assert_int_equal(keel_store_get(store, "missing", &entry), KEEL_ENOTFOUND);
}

typedef struct race_thread {
  server_fixture *fixture;
  int wins;
  int conflicts;
} race_thread;

/* No cmocka asserts off the main thread: they would jump across threads. */
static void *race_main(void *argument) {
  race_thread *race = argument;
  keel_store *store;
  if (keel_store_connect(keel_store_server_address(race->fixture->server), &race->fixture->auth,
                         keel_deadline_after_ns(5000 * MS), &store) != KEEL_OK)
    return NULL;
  for (int i = 0; i < 25; i++) {
    keel_status status = keel_store_cas(store, "decide/00000007", 0, "me", 2, 0, NULL);
    if (status == KEEL_OK) race->wins++;
    if (status == KEEL_ECONFLICT) race->conflicts++;
  }
  keel_store_close(store);
  return NULL;
}

static void test_cas_race_one_winner(void **state) {
  race_thread races[4];
  pthread_t threads[4];
  for (int i = 0; i < 4; i++) {
    races[i] = (race_thread){.fixture = *state};
    assert_int_equal(pthread_create(&threads[i], NULL, race_main, &races[i]), 0);
  }
  int wins = 0;
  int conflicts = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(threads[i], NULL);
    wins += races[i].wins;
    conflicts += races[i].conflicts;
  }
  assert_int_equal(wins, 1);
  assert_int_equal(conflicts, 99);
}

/* A wait on its own thread and handle, as store.h asks of long waits. */
typedef struct waiter {
  server_fixture *fixture;
  keel_store *store;
  const char *prefix;
  uint64_t after;
  int64_t deadline_ns;
  keel_status status;
  uint64_t revision;
  int64_t returned_ns;
  pthread_t thread;
} waiter;

static void *waiter_main(void *argument) {
  waiter *w = argument;
  w->status = keel_store_wait(w->store, w->prefix, w->after, w->deadline_ns, &w->revision);
  w->returned_ns = keel_now_ns();
  return NULL;
}

static void waiter_start(waiter *w, server_fixture *fixture, const char *prefix, uint64_t after,
                         int64_t timeout_ns) {
  *w = (waiter){.fixture = fixture, .prefix = prefix, .after = after};
  w->store = connect_store(fixture);
  w->deadline_ns = keel_deadline_after_ns(timeout_ns);
  assert_int_equal(pthread_create(&w->thread, NULL, waiter_main, w), 0);
}

static void waiter_finish(waiter *w) {
  pthread_join(w->thread, NULL);
  keel_store_close(w->store);
}

static uint64_t current_revision(keel_store *store) {
  keel_store_entry *entries;
  size_t count;
  uint64_t revision;
  assert_int_equal(keel_store_list(store, "-", &entries, &count, &revision), KEEL_OK);
  keel_store_entries_free(entries, count);
  return revision;
}

static void test_wait_woken_by_put_and_delete(void **state) {
  server_fixture *fixture = *state;
  put_text(fixture->store, "w/a", "1", NULL);
  put_text(fixture->store, "elsewhere", "1", NULL);
  uint64_t start = current_revision(fixture->store);

  waiter w;
  waiter_start(&w, fixture, "w/", start, 5000 * MS);
  sleep_ns(100 * MS);
  put_text(fixture->store, "elsewhere", "2", NULL); /* not under the prefix */
  sleep_ns(50 * MS);
  uint64_t revision;
  int64_t put_ns = keel_now_ns();
  put_text(fixture->store, "w/b", "1", &revision);
  waiter_finish(&w);
  assert_int_equal(w.status, KEEL_OK);
  assert_true(w.revision >= revision);
  assert_true(w.returned_ns - put_ns < 1000 * MS);

  waiter_start(&w, fixture, "w/", revision, 5000 * MS);
  sleep_ns(100 * MS);
  put_ns = keel_now_ns();
  assert_int_equal(keel_store_delete(fixture->store, "w/a"), KEEL_OK);
  waiter_finish(&w);
  assert_int_equal(w.status, KEEL_OK);
  assert_true(w.revision > revision);
  assert_true(w.returned_ns - put_ns < 1000 * MS);
}

static void test_wait_timeout_and_past_change(void **state) {
  server_fixture *fixture = *state;
  uint64_t revision;
  put_text(fixture->store, "t/a", "1", &revision);
  /* A change already past returns at once, even with a deadline already gone. */
  uint64_t seen = 0;
  assert_int_equal(keel_store_wait(fixture->store, "t/", revision - 1, keel_now_ns(), &seen),
                   KEEL_OK);
  assert_int_equal(seen, revision);
  assert_int_equal(keel_store_wait(fixture->store, "t/", revision, 0, &seen), KEEL_ETIMEDOUT);

  int64_t start = keel_now_ns();
  assert_int_equal(keel_store_wait(fixture->store, "t/", revision, keel_deadline_after_ns(200 * MS),
                                   NULL),
                   KEEL_ETIMEDOUT);
  int64_t elapsed = keel_now_ns() - start;
  assert_true(elapsed >= 195 * MS);
  assert_true(elapsed < 1000 * MS);
  /* The handle is still usable after a timed-out wait. */
  put_text(fixture->store, "t/b", "1", NULL);
}

static void test_lease_expiry_and_keepalive(void **state) {
  server_fixture *fixture = *state;
  keel_store *store = fixture->store;
  int64_t kept;
  int64_t dropped;
  assert_int_equal(keel_store_lease_grant(store, 200 * MS, &kept), KEEL_OK);
  assert_int_equal(keel_store_lease_grant(store, 200 * MS, &dropped), KEEL_OK);
  assert_int_not_equal(kept, dropped);
  assert_int_equal(keel_store_put(store, "proc/0", "a", 1, kept, NULL), KEEL_OK);
  assert_int_equal(keel_store_put(store, "proc/1", "b", 1, dropped, NULL), KEEL_OK);
  assert_int_equal(keel_store_put(store, "spare/1", "", 0, dropped, NULL), KEEL_OK);
  assert_int_equal(keel_store_put(store, "x", "c", 1, dropped + 100, NULL), KEEL_ENOTFOUND);
  uint64_t start = current_revision(store);

  waiter w;
  waiter_start(&w, fixture, "spare/", start, 5000 * MS);
  for (int i = 0; i < 8; i++) {
    sleep_ns(50 * MS);
    assert_int_equal(keel_store_lease_keepalive(store, kept), KEEL_OK);
  }
  waiter_finish(&w);
  assert_int_equal(w.status, KEEL_OK);
  assert_int_equal(w.revision, start + 1); /* both keys of the lease, one revision */

  keel_store_entry *entry;
  assert_int_equal(keel_store_get(store, "proc/0", &entry), KEEL_OK);
  assert_int_equal(entry->lease, kept);
  keel_store_entry_free(entry);
  assert_int_equal(keel_store_get(store, "proc/1", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_get(store, "spare/1", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_lease_keepalive(store, dropped), KEEL_ENOTFOUND);

  sleep_ns(300 * MS);
  assert_int_equal(keel_store_get(store, "proc/0", &entry), KEEL_ENOTFOUND);
}

static void test_lease_revoke(void **state) {
  server_fixture *fixture = *state;
  keel_store *store = fixture->store;
  int64_t lease;
  assert_int_equal(keel_store_lease_grant(store, 60000 * MS, &lease), KEEL_OK);
  assert_int_equal(keel_store_put(store, "join/5", "", 0, lease, NULL), KEEL_OK);
  put_text(store, "join/6", "", NULL);
  uint64_t before = current_revision(store);
  assert_int_equal(keel_store_lease_revoke(store, lease), KEEL_OK);
  assert_int_equal(current_revision(store), before + 1);
  keel_store_entry *entry;
  assert_int_equal(keel_store_get(store, "join/5", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_get(store, "join/6", &entry), KEEL_OK);
  keel_store_entry_free(entry);
  assert_int_equal(keel_store_lease_revoke(store, lease), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_lease_grant(store, 0, &lease), KEEL_EINVAL);
}

static void test_bounds(void **state) {
  server_fixture *fixture = *state;
  keel_store *store = fixture->store;
  char key[KEEL_STORE_MAX_KEY + 2];
  memset(key, 'k', sizeof key - 1);
  key[sizeof key - 1] = '\0';
  assert_int_equal(keel_store_put(store, key, "v", 1, 0, NULL), KEEL_ERANGE);
  keel_store_entry *entry;
  assert_int_equal(keel_store_get(store, key, &entry), KEEL_ERANGE);
  key[KEEL_STORE_MAX_KEY] = '\0';
  uint8_t *value = calloc(KEEL_STORE_MAX_VALUE + 1, 1);
  assert_non_null(value);
  assert_int_equal(keel_store_put(store, key, value, KEEL_STORE_MAX_VALUE + 1, 0, NULL),
                   KEEL_ERANGE);
  assert_int_equal(keel_store_cas(store, key, 0, value, KEEL_STORE_MAX_VALUE + 1, 0, NULL),
                   KEEL_ERANGE);
  value[KEEL_STORE_MAX_VALUE - 1] = 7;
  assert_int_equal(keel_store_put(store, key, value, KEEL_STORE_MAX_VALUE, 0, NULL), KEEL_OK);
  assert_int_equal(keel_store_get(store, key, &entry), KEEL_OK);
  assert_int_equal(entry->value_length, KEEL_STORE_MAX_VALUE);
  assert_int_equal(entry->value[KEEL_STORE_MAX_VALUE - 1], 7);
  keel_store_entry_free(entry);
  free(value);
  assert_int_equal(keel_store_put(store, "", "v", 1, 0, NULL), KEEL_EINVAL);
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
  put_text(fixture->store, "after/impostor", "1", NULL);
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
  assert_int_equal(keel_link_send(link, &frame, garbage, sizeof garbage,
                                  keel_deadline_after_ns(2000 * MS)),
                   KEEL_OK);
  void *payload = NULL;
  keel_status status = keel_link_recv(link, &frame, &payload, keel_deadline_after_ns(2000 * MS));
  assert_int_not_equal(status, KEEL_OK);
  assert_int_not_equal(status, KEEL_ETIMEDOUT); /* closed, not merely silent */
  keel_link_close(link);

  put_text(fixture->store, "still/working", "1", NULL);
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
  for (int i = 0; i < 10; i++) put_text(fixture->store, "busy/key", "1", NULL);
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
  put_text(first->store, "only/first", "1", NULL);
  put_text(other, "only/second", "2", NULL);
  keel_store_entry *entry;
  assert_int_equal(keel_store_get(other, "only/first", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_get(first->store, "only/second", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_get(other, "only/second", &entry), KEEL_OK);
  keel_store_entry_free(entry);
  keel_store_close(other);
  keel_store_server_stop(second.server);
}

static void test_stop_while_waiting(void **state) {
  server_fixture *fixture = *state;
  uint64_t revision = current_revision(fixture->store);
  waiter w;
  waiter_start(&w, fixture, "never/", revision, 20000 * MS);
  sleep_ns(100 * MS);
  int64_t stop_ns = keel_now_ns();
  keel_store_server_stop(fixture->server);
  fixture->server = NULL;
  waiter_finish(&w);
  assert_int_equal(w.status, KEEL_ECLOSED);
  assert_true(w.returned_ns - stop_ns < 2000 * MS);
  /* Other handles learn it on their next call. */
  keel_store_entry *entry;
  assert_int_equal(keel_store_get(fixture->store, "any", &entry), KEEL_ECLOSED);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_request_round_trip),
      cmocka_unit_test(test_request_decode_refuses),
      cmocka_unit_test_setup_teardown(test_kv_list_sorted, kv_setup, kv_teardown),
      cmocka_unit_test_setup_teardown(test_kv_changed_since_deletions, kv_setup, kv_teardown),
      cmocka_unit_test_setup_teardown(test_kv_leases_on_a_driven_clock, kv_setup, kv_teardown),
      cmocka_unit_test_setup_teardown(test_put_get_delete_list, server_setup, server_teardown),
      cmocka_unit_test_setup_teardown(test_cas, server_setup, server_teardown),
      cmocka_unit_test_setup_teardown(test_cas_race_one_winner, server_setup, server_teardown),
      cmocka_unit_test_setup_teardown(test_wait_woken_by_put_and_delete, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_wait_timeout_and_past_change, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_lease_expiry_and_keepalive, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_lease_revoke, server_setup, server_teardown),
      cmocka_unit_test_setup_teardown(test_bounds, server_setup, server_teardown),
      cmocka_unit_test_setup_teardown(test_wrong_token_cannot_connect, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_garbage_frame_drops_only_that_client, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_silent_connector_does_not_stall_clients, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_two_servers_in_one_process, server_setup,
                                      server_teardown),
      cmocka_unit_test_setup_teardown(test_stop_while_waiting, server_setup, server_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
