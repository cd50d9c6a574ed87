/* The store's contract (include/keel/store.h) as tests that any backend must pass: the
 * embedded server (tests/unit/test_store.c) and a real etcd cluster
 * (tests/integration/test_store_etcd.c) run the same functions. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "test_store_suite.h"

#define MS ((int64_t)1000000)

static void sleep_ns(int64_t duration_ns) {
  struct timespec delay = {.tv_sec = (time_t)(duration_ns / 1000000000),
                           .tv_nsec = (long)(duration_ns % 1000000000)};
  nanosleep(&delay, NULL);
}

void keel_test_store_put_text(keel_store *store, const char *key, const char *value,
                              uint64_t *revision_p) {
  assert_int_equal(keel_store_put(store, key, value, strlen(value), 0, revision_p), KEEL_OK);
}

uint64_t keel_test_store_revision(keel_store *store) {
  keel_store_entry *entries;
  size_t count;
  uint64_t revision;
  assert_int_equal(keel_store_list(store, "-", &entries, &count, &revision), KEEL_OK);
  keel_store_entries_free(entries, count);
  return revision;
}

static void *waiter_main(void *argument) {
  keel_test_waiter *w = argument;
  w->status = keel_store_wait(w->store, w->prefix, w->after, w->deadline_ns, &w->revision);
  w->returned_ns = keel_now_ns();
  return NULL;
}

void keel_test_waiter_start(keel_test_waiter *w, const char *endpoint, const keel_auth *auth,
                            const char *prefix, uint64_t after, int64_t timeout_ns) {
  *w = (keel_test_waiter){.prefix = prefix, .after = after};
  assert_int_equal(keel_store_connect(endpoint, auth, keel_deadline_after_ns(5000 * MS), &w->store),
                   KEEL_OK);
  w->deadline_ns = keel_deadline_after_ns(timeout_ns);
  assert_int_equal(pthread_create(&w->thread, NULL, waiter_main, w), 0);
}

void keel_test_waiter_finish(keel_test_waiter *w) {
  pthread_join(w->thread, NULL);
  keel_store_close(w->store);
}

/* ---- one test's namespace on the backend under test */

typedef struct suite_fixture {
  keel_test_store_backend *backend;
  void *context;
  char endpoint[512];
  keel_auth auth;
  keel_store *store;
} suite_fixture;

/* The backend the running group tests (cmocka passes no argument to a group). */
static keel_test_store_backend *suite_backend;

static keel_store *suite_connect(suite_fixture *fixture) {
  keel_store *store = NULL;
  assert_int_equal(keel_store_connect(fixture->endpoint, &fixture->auth,
                                      keel_deadline_after_ns(5000 * MS), &store),
                   KEEL_OK);
  return store;
}

static int suite_setup(void **state) {
  suite_fixture *fixture = calloc(1, sizeof *fixture);
  assert_non_null(fixture);
  fixture->backend = suite_backend;
  assert_int_equal(keel_auth_generate(&fixture->auth), KEEL_OK);
  suite_backend->open(suite_backend, &fixture->auth, fixture->endpoint, sizeof fixture->endpoint,
                      &fixture->context);
  fixture->store = suite_connect(fixture);
  *state = fixture;
  return 0;
}

static int suite_teardown(void **state) {
  suite_fixture *fixture = *state;
  keel_store_close(fixture->store);
  suite_backend->close(suite_backend, fixture->context);
  free(fixture);
  return 0;
}

/* ---- the contract */

static void test_put_get_delete_list(void **state) {
  suite_fixture *fixture = *state;
  keel_store *store = fixture->store;
  uint64_t first;
  uint64_t second;
  keel_test_store_put_text(store, "proc/2", "two", &first);
  keel_test_store_put_text(store, "proc/10", "ten", &second);
  assert_int_equal(second, first + 1);
  keel_test_store_put_text(store, "proc/1", "one", NULL);
  keel_test_store_put_text(store, "dead/1", "", NULL);
  keel_test_store_put_text(store, "proc/2", "TWO", NULL);

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

/* Several prefixes in one request: each prefix's keys in order, prefix after prefix, at one
 * revision; empty, overlapping or too many prefixes are refused by the client, and a
 * malformed prefix list on the wire by the decoder. */
static void test_list_prefixes(void **state) {
  suite_fixture *fixture = *state;
  keel_store *store = fixture->store;
  keel_test_store_put_text(store, "proc/2", "two", NULL);
  keel_test_store_put_text(store, "proc/1", "one", NULL);
  keel_test_store_put_text(store, "dead/7", "", NULL);
  keel_test_store_put_text(store, "agree/1/0", "vote", NULL);
  uint64_t last;
  keel_test_store_put_text(store, "suspect/3", "by=1", &last);

  const char *const prefixes[] = {"suspect/", "proc/", "dead/", "none/"};
  keel_store_entry *entries;
  size_t count;
  uint64_t revision;
  assert_int_equal(keel_store_list_prefixes(store, prefixes, 4, &entries, &count, &revision),
                   KEEL_OK);
  assert_int_equal(count, 4);
  assert_string_equal(entries[0].key, "suspect/3");
  assert_string_equal((char *)entries[0].value, "by=1");
  assert_string_equal(entries[1].key, "proc/1");
  assert_string_equal(entries[2].key, "proc/2");
  assert_string_equal(entries[3].key, "dead/7");
  assert_int_equal(revision, last);
  keel_store_entries_free(entries, count);

  const char *const overlapping[] = {"proc/", "proc/1"};
  const char *const empty[] = {"proc/", ""};
  const char *const many[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
  assert_int_equal(keel_store_list_prefixes(store, overlapping, 2, &entries, &count, NULL),
                   KEEL_EINVAL);
  assert_int_equal(keel_store_list_prefixes(store, empty, 2, &entries, &count, NULL), KEEL_EINVAL);
  assert_int_equal(
      keel_store_list_prefixes(store, many, KEEL_STORE_MAX_PREFIXES + 1, &entries, &count, NULL),
      KEEL_EINVAL);
  assert_int_equal(keel_store_list_prefixes(store, prefixes, 0, &entries, &count, NULL),
                   KEEL_EINVAL);
}

static void test_cas(void **state) {
  suite_fixture *fixture = *state;
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
  suite_fixture *fixture;
  int wins;
  int conflicts;
} race_thread;

/* No cmocka asserts off the main thread: they would jump across threads. */
static void *race_main(void *argument) {
  race_thread *race = argument;
  keel_store *store;
  if (keel_store_connect(race->fixture->endpoint, &race->fixture->auth,
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

static void test_wait_woken_by_put_and_delete(void **state) {
  suite_fixture *fixture = *state;
  keel_test_store_put_text(fixture->store, "w/a", "1", NULL);
  keel_test_store_put_text(fixture->store, "elsewhere", "1", NULL);
  uint64_t start = keel_test_store_revision(fixture->store);

  keel_test_waiter w;
  keel_test_waiter_start(&w, fixture->endpoint, &fixture->auth, "w/", start, 5000 * MS);
  sleep_ns(100 * MS);
  keel_test_store_put_text(fixture->store, "elsewhere", "2", NULL); /* not under the prefix */
  sleep_ns(50 * MS);
  uint64_t revision;
  int64_t put_ns = keel_now_ns();
  keel_test_store_put_text(fixture->store, "w/b", "1", &revision);
  keel_test_waiter_finish(&w);
  assert_int_equal(w.status, KEEL_OK);
  assert_true(w.revision >= revision);
  assert_true(w.returned_ns - put_ns < 1000 * MS);

  keel_test_waiter_start(&w, fixture->endpoint, &fixture->auth, "w/", revision, 5000 * MS);
  sleep_ns(100 * MS);
  put_ns = keel_now_ns();
  assert_int_equal(keel_store_delete(fixture->store, "w/a"), KEEL_OK);
  keel_test_waiter_finish(&w);
  assert_int_equal(w.status, KEEL_OK);
  assert_true(w.revision > revision);
  assert_true(w.returned_ns - put_ns < 1000 * MS);
}

static void test_wait_timeout_and_past_change(void **state) {
  suite_fixture *fixture = *state;
  uint64_t revision;
  keel_test_store_put_text(fixture->store, "t/a", "1", &revision);
  /* A change already past returns at once, even with a deadline already gone. */
  uint64_t seen = 0;
  assert_int_equal(keel_store_wait(fixture->store, "t/", revision - 1, keel_now_ns(), &seen),
                   KEEL_OK);
  assert_int_equal(seen, revision);
  assert_int_equal(keel_store_wait(fixture->store, "t/", revision, 0, &seen), KEEL_ETIMEDOUT);

  int64_t start = keel_now_ns();
  assert_int_equal(
      keel_store_wait(fixture->store, "t/", revision, keel_deadline_after_ns(200 * MS), NULL),
      KEEL_ETIMEDOUT);
  int64_t elapsed = keel_now_ns() - start;
  assert_true(elapsed >= 195 * MS);
  assert_true(elapsed < 1000 * MS);
  /* The handle is still usable after a timed-out wait. */
  keel_test_store_put_text(fixture->store, "t/b", "1", NULL);
}

/* Changes before the wait began, seen at once: a key deleted under the prefix (the etcd
 * backend checks the past by reading, and a deletion leaves no key to read); changes only
 * outside it are no change, and a wait from that older revision still wakes on the next
 * change under the prefix. */
static void test_wait_past_deletion_and_changes_elsewhere(void **state) {
  suite_fixture *fixture = *state;
  keel_store *store = fixture->store;
  uint64_t created, elsewhere;
  keel_test_store_put_text(store, "d/a", "1", &created);
  keel_test_store_put_text(store, "d/b", "1", NULL);
  keel_test_store_put_text(store, "e/x", "1", &elsewhere);
  assert_int_equal(keel_store_wait(store, "d/", elsewhere - 1, 0, NULL), KEEL_ETIMEDOUT);
  assert_int_equal(keel_store_delete(store, "d/a"), KEEL_OK);
  keel_test_store_put_text(store, "e/y", "1", NULL);
  uint64_t seen = 0;
  assert_int_equal(keel_store_wait(store, "d/", elsewhere, keel_now_ns(), &seen), KEEL_OK);
  assert_true(seen > elsewhere);
  uint64_t now = keel_test_store_revision(store);

  keel_test_store_put_text(store, "e/z", "1", NULL);
  keel_test_waiter w;
  keel_test_waiter_start(&w, fixture->endpoint, &fixture->auth, "d/", now, 5000 * MS);
  sleep_ns(100 * MS);
  keel_test_store_put_text(store, "e/z", "2", NULL);
  uint64_t revision;
  keel_test_store_put_text(store, "d/c", "1", &revision);
  keel_test_waiter_finish(&w);
  assert_int_equal(w.status, KEEL_OK);
  assert_true(w.revision >= revision);
}

/* Two leases of the backend's shortest ttl: one kept alive, one left to expire with both
 * its keys at one revision; then the kept one expires too once the keepalives stop. */
static void test_lease_expiry_and_keepalive(void **state) {
  suite_fixture *fixture = *state;
  keel_store *store = fixture->store;
  int64_t ttl_ns = fixture->backend->lease_ttl_ns, slack_ns = fixture->backend->expiry_slack_ns;
  int64_t kept;
  int64_t dropped;
  assert_int_equal(keel_store_lease_grant(store, ttl_ns, &kept), KEEL_OK);
  assert_int_equal(keel_store_lease_grant(store, ttl_ns, &dropped), KEEL_OK);
  assert_int_not_equal(kept, dropped);
  assert_int_equal(keel_store_put(store, "proc/0", "a", 1, kept, NULL), KEEL_OK);
  assert_int_equal(keel_store_put(store, "proc/1", "b", 1, dropped, NULL), KEEL_OK);
  assert_int_equal(keel_store_put(store, "spare/1", "", 0, dropped, NULL), KEEL_OK);
  assert_int_equal(keel_store_put(store, "x", "c", 1, dropped + 100, NULL), KEEL_ENOTFOUND);
  uint64_t start = keel_test_store_revision(store);

  keel_test_waiter w;
  keel_test_waiter_start(&w, fixture->endpoint, &fixture->auth, "spare/", start,
                         ttl_ns + 4 * slack_ns);
  /* Keepalives every quarter ttl, until the other lease is surely gone. */
  int64_t until = keel_now_ns() + ttl_ns + slack_ns;
  while (keel_now_ns() < until) {
    sleep_ns(ttl_ns / 4);
    assert_int_equal(keel_store_lease_keepalive(store, kept), KEEL_OK);
  }
  keel_test_waiter_finish(&w);
  assert_int_equal(w.status, KEEL_OK);
  assert_int_equal(w.revision, start + 1); /* both keys of the lease, one revision */

  keel_store_entry *entry;
  assert_int_equal(keel_store_get(store, "proc/0", &entry), KEEL_OK);
  assert_int_equal(entry->lease, kept);
  keel_store_entry_free(entry);
  assert_int_equal(keel_store_get(store, "proc/1", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_get(store, "spare/1", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_lease_keepalive(store, dropped), KEEL_ENOTFOUND);

  sleep_ns(ttl_ns + slack_ns);
  assert_int_equal(keel_store_get(store, "proc/0", &entry), KEEL_ENOTFOUND);
}

/* A lease's time to live: what it was granted with (etcd: whole seconds, rounded up) and
 * what is left, never more; a keepalive gives it all back; a revoked or unknown lease has
 * none. */
static void test_lease_ttl(void **state) {
  suite_fixture *fixture = *state;
  keel_store *store = fixture->store;
  int64_t ttl_ns = fixture->backend->lease_ttl_ns, lease, left = -1, granted = -1;
  assert_int_equal(keel_store_lease_grant(store, ttl_ns, &lease), KEEL_OK);
  assert_int_equal(keel_store_lease_ttl(store, lease, &left, &granted), KEEL_OK);
  assert_true(granted >= ttl_ns);
  assert_true(left >= 0 && left <= granted);
  sleep_ns(ttl_ns / 4);
  assert_int_equal(keel_store_lease_keepalive(store, lease), KEEL_OK);
  int64_t refreshed = -1;
  assert_int_equal(keel_store_lease_ttl(store, lease, &refreshed, NULL), KEEL_OK);
  assert_true(refreshed >= 0 && refreshed <= granted);
  assert_int_equal(keel_store_lease_revoke(store, lease), KEEL_OK);
  assert_int_equal(keel_store_lease_ttl(store, lease, &left, NULL), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_lease_ttl(store, lease + 1000000, &left, NULL), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_lease_ttl(store, 0, &left, NULL), KEEL_EINVAL);
}

static void test_lease_revoke(void **state) {
  suite_fixture *fixture = *state;
  keel_store *store = fixture->store;
  int64_t lease;
  assert_int_equal(keel_store_lease_grant(store, 60000 * MS, &lease), KEEL_OK);
  assert_int_equal(keel_store_put(store, "join/5", "", 0, lease, NULL), KEEL_OK);
  keel_test_store_put_text(store, "join/6", "", NULL);
  uint64_t before = keel_test_store_revision(store);
  assert_int_equal(keel_store_lease_revoke(store, lease), KEEL_OK);
  assert_int_equal(keel_test_store_revision(store), before + 1);
  keel_store_entry *entry;
  assert_int_equal(keel_store_get(store, "join/5", &entry), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_get(store, "join/6", &entry), KEEL_OK);
  keel_store_entry_free(entry);
  assert_int_equal(keel_store_lease_revoke(store, lease), KEEL_ENOTFOUND);
  assert_int_equal(keel_store_lease_grant(store, 0, &lease), KEEL_EINVAL);
}

static void test_bounds(void **state) {
  suite_fixture *fixture = *state;
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

#define SUITE_TEST(function) cmocka_unit_test_setup_teardown(function, suite_setup, suite_teardown)

int keel_test_store_suite_run(const char *group_name, keel_test_store_backend *backend) {
  const struct CMUnitTest tests[] = {
      SUITE_TEST(test_put_get_delete_list),
      SUITE_TEST(test_list_prefixes),
      SUITE_TEST(test_cas),
      SUITE_TEST(test_cas_race_one_winner),
      SUITE_TEST(test_wait_woken_by_put_and_delete),
      SUITE_TEST(test_wait_timeout_and_past_change),
      SUITE_TEST(test_wait_past_deletion_and_changes_elsewhere),
      SUITE_TEST(test_lease_expiry_and_keepalive),
      SUITE_TEST(test_lease_ttl),
      SUITE_TEST(test_lease_revoke),
      SUITE_TEST(test_bounds),
  };
  suite_backend = backend;
  return _cmocka_run_group_tests(group_name, tests, sizeof tests / sizeof tests[0], NULL, NULL);
}
