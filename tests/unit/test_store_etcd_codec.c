/* Unit tests of the etcd gateway codec (src/store/etcd_codec.c): base64 as protobuf's JSON
 * writes bytes, the request bodies, and replies in the shapes etcd 3.4's gateway sends,
 * with the encoding's three traps: base64 keys, int64 fields as strings, defaults left out
 * (a failed txn has no "succeeded", an empty value no "value", a lapsed lease no "TTL"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "store/store_internal.h"

/* ---- base64 */

static void assert_base64(const char *plain, const char *encoded) {
  char text[64];
  keel__base64_encode((const uint8_t *)plain, strlen(plain), text);
  assert_string_equal(text, encoded);
  uint8_t *data = NULL;
  size_t length = 0;
  assert_int_equal(keel__base64_decode(encoded, strlen(encoded), &data, &length), KEEL_OK);
  assert_int_equal(length, strlen(plain));
  assert_memory_equal(data, plain, length);
  assert_int_equal(data[length], 0);
  free(data);
}

static void test_base64_vectors(void **unused) {
  (void)unused;
  /* RFC 4648, section 10. */
  assert_base64("", "");
  assert_base64("f", "Zg==");
  assert_base64("fo", "Zm8=");
  assert_base64("foo", "Zm9v");
  assert_base64("foob", "Zm9vYg==");
  assert_base64("fooba", "Zm9vYmE=");
  assert_base64("foobar", "Zm9vYmFy");
}

static void test_base64_every_byte_round_trips(void **unused) {
  (void)unused;
  uint8_t bytes[256];
  for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (uint8_t)(255 - i);
  for (size_t length = 0; length <= sizeof bytes; length += 1 + length / 8) {
    char text[400];
    keel__base64_encode(bytes, length, text);
    assert_int_equal(strlen(text), keel__base64_encoded_bytes(length));
    uint8_t *data = NULL;
    size_t decoded = 0;
    assert_int_equal(keel__base64_decode(text, strlen(text), &data, &decoded), KEEL_OK);
    assert_int_equal(decoded, length);
    if (length > 0) assert_memory_equal(data, bytes, length);
    free(data);
  }
}

static void test_base64_refuses_malformed(void **unused) {
  (void)unused;
  static const char *const bad[] = {
      "Zg=", "Zg", "Zh==", "Zm9=", "Z===", "====", "Zm9v!A==", "Zm 9", "Zg==Zg==", "=Zg="};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint8_t *data = (uint8_t *)"untouched";
    size_t length = 7;
    assert_int_equal(keel__base64_decode(bad[i], strlen(bad[i]), &data, &length), KEEL_ECORRUPT);
    assert_string_equal((const char *)data, "untouched");
    assert_int_equal(length, 7);
  }
}

/* ---- requests */

static json_t *body_parse(char *body) {
  assert_non_null(body);
  json_t *object = json_loads(body, 0, NULL);
  free(body);
  assert_non_null(object);
  return object;
}

static const char *member_text(const json_t *object, const char *name) {
  const json_t *field = json_object_get(object, name);
  return json_is_string(field) ? json_string_value(field) : NULL;
}

static void test_range_request_scopes_a_prefix(void **unused) {
  (void)unused;
  json_t *one = body_parse(keel__etcd_range_request("proc/3", false));
  assert_string_equal(member_text(one, "key"), "cHJvYy8z");
  assert_null(json_object_get(one, "range_end"));
  json_decref(one);
  /* "proc/" .. "proc0": '/' + 1 is '0'. */
  json_t *prefix = body_parse(keel__etcd_range_request("proc/", true));
  assert_string_equal(member_text(prefix, "key"), "cHJvYy8=");
  assert_string_equal(member_text(prefix, "range_end"), "cHJvYzA=");
  json_decref(prefix);
  /* Every key: from "\0" to the end. */
  json_t *all = body_parse(keel__etcd_range_request("", true));
  assert_string_equal(member_text(all, "key"), "AA==");
  assert_string_equal(member_text(all, "range_end"), "AA==");
  json_decref(all);
  /* A key must be named and fit. */
  assert_null(keel__etcd_range_request("", false));
  char long_key[KEEL__ETCD_MAX_KEY + 2];
  memset(long_key, 'k', sizeof long_key - 1);
  long_key[sizeof long_key - 1] = '\0';
  assert_null(keel__etcd_range_request(long_key, false));
}

static void test_put_request_sends_lease_as_string(void **unused) {
  (void)unused;
  json_t *put = body_parse(keel__etcd_put_request("a", "bar", 3, 7587862072907474694LL));
  assert_string_equal(member_text(put, "key"), "YQ==");
  assert_string_equal(member_text(put, "value"), "YmFy");
  assert_string_equal(member_text(put, "lease"), "7587862072907474694");
  json_decref(put);
  json_t *plain = body_parse(keel__etcd_put_request("a", "", 0, 0));
  assert_string_equal(member_text(plain, "value"), "");
  assert_null(json_object_get(plain, "lease"));
  json_decref(plain);
}

static void assert_compare(const json_t *txn, const char *target, const char *field,
                           const char *revision) {
  const json_t *compare = json_array_get(json_object_get(txn, "compare"), 0);
  assert_non_null(compare);
  assert_string_equal(member_text(compare, "key"), "ZGVjaWRlLzM=");
  assert_string_equal(member_text(compare, "target"), target);
  assert_string_equal(member_text(compare, "result"), "EQUAL");
  assert_string_equal(member_text(compare, field), revision);
  const json_t *success = json_array_get(json_object_get(txn, "success"), 0);
  const json_t *put = json_object_get(success, "request_put");
  assert_string_equal(member_text(put, "value"), "djE=");
  const json_t *failure = json_array_get(json_object_get(txn, "failure"), 0);
  assert_string_equal(member_text(json_object_get(failure, "request_range"), "key"),
                      "ZGVjaWRlLzM=");
}

static void test_cas_request_compares_the_right_revision(void **unused) {
  (void)unused;
  /* Absent: no create revision. */
  json_t *absent = body_parse(keel__etcd_cas_request("decide/3", 0, "v1", 2, 0));
  assert_compare(absent, "CREATE", "create_revision", "0");
  json_decref(absent);
  json_t *present = body_parse(keel__etcd_cas_request("decide/3", 42, "v1", 2, 0));
  assert_compare(present, "MOD", "mod_revision", "42");
  json_decref(present);
  assert_null(keel__etcd_cas_request("decide/3", (uint64_t)INT64_MAX + 1, "v1", 2, 0));
}

static void test_lease_requests(void **unused) {
  (void)unused;
  json_t *grant = body_parse(keel__etcd_lease_grant_request(5));
  assert_string_equal(member_text(grant, "TTL"), "5");
  json_decref(grant);
  json_t *id = body_parse(keel__etcd_lease_id_request(7587862072907474694LL));
  assert_string_equal(member_text(id, "ID"), "7587862072907474694");
  json_decref(id);
  assert_null(keel__etcd_lease_grant_request(0));
  assert_null(keel__etcd_lease_id_request(0));
}

/* ---- replies, as etcd 3.4's gateway writes them */

#define HEADER(revision)                                                                        \
  "\"header\":{\"cluster_id\":\"14841639068965178418\",\"member_id\":\"10276657743932975437\"," \
  "\"revision\":\"" revision "\",\"raft_term\":\"2\"}"

static keel_status range_reply(const char *body, keel_store_entry **entries, size_t *count,
                               uint64_t *revision) {
  char message[128];
  return keel__etcd_range_reply(body, strlen(body), entries, count, revision, message,
                                sizeof message);
}

static void test_range_reply_reads_defaults(void **unused) {
  (void)unused;
  const char *body =
      "{" HEADER("7") ",\"kvs\":[{\"key\":\"Zm9v\",\"create_revision\":\"5\","
      "\"mod_revision\":\"7\",\"version\":\"2\",\"value\":\"YmFy\"},"
      "{\"key\":\"Zm9vMg==\",\"create_revision\":\"6\",\"mod_revision\":\"6\",\"version\":\"1\","
      "\"lease\":\"7587862072907474694\"}],\"count\":\"2\"}";
  keel_store_entry *entries = NULL;
  size_t count = 0;
  uint64_t revision = 0;
  assert_int_equal(range_reply(body, &entries, &count, &revision), KEEL_OK);
  assert_int_equal(revision, 7);
  assert_int_equal(count, 2);
  assert_string_equal(entries[0].key, "foo");
  assert_string_equal((const char *)entries[0].value, "bar");
  assert_int_equal(entries[0].value_length, 3);
  assert_int_equal(entries[0].revision, 7);
  assert_int_equal(entries[0].lease, 0);
  /* The empty value was left out; the lease came as a string. */
  assert_string_equal(entries[1].key, "foo2");
  assert_int_equal(entries[1].value_length, 0);
  assert_string_equal((const char *)entries[1].value, "");
  assert_int_equal(entries[1].lease, 7587862072907474694LL);
  keel_store_entries_free(entries, count);
  /* No key at all: neither "kvs" nor "count". */
  assert_int_equal(range_reply("{" HEADER("9") "}", &entries, &count, &revision), KEEL_OK);
  assert_int_equal(count, 0);
  assert_int_equal(revision, 9);
  keel_store_entries_free(entries, count);
}

static keel_status count_reply(const char *body, int64_t *keys, size_t *listed,
                               uint64_t *revision) {
  return keel__etcd_range_count_reply(body, strlen(body), keys, listed, revision, NULL, 0);
}

/* A wait's checks: the keys changed after a revision (min_mod_revision is the next one), and
 * a count at a past revision; the reply's count and how many keys it listed. */
static void test_wait_check_requests_and_count_reply(void **unused) {
  (void)unused;
  json_t *changed = body_parse(keel__etcd_changed_since_request("decide/", 41));
  assert_string_equal(member_text(changed, "range_end"), "ZGVjaWRlMA==");
  assert_true(json_is_true(json_object_get(changed, "keys_only")));
  assert_string_equal(member_text(changed, "min_mod_revision"), "42");
  json_decref(changed);
  json_t *count = body_parse(keel__etcd_count_at_request("decide/", 41));
  assert_true(json_is_true(json_object_get(count, "count_only")));
  assert_string_equal(member_text(count, "revision"), "41");
  json_decref(count);
  assert_null(keel__etcd_count_at_request("decide/", 0));
  assert_null(keel__etcd_changed_since_request("decide/", (uint64_t)INT64_MAX));

  /* The reply: its count, how many keys it listed (none: no "kvs"), its revision. */
  int64_t keys = -1;
  size_t listed = 99;
  uint64_t revision = 0;
  assert_int_equal(count_reply("{" HEADER("44") ",\"kvs\":[{\"key\":\"Zm9v\",\"mod_revision\":"
                                                "\"43\"}],\"count\":\"3\"}",
                               &keys, &listed, &revision),
                   KEEL_OK);
  assert_true(keys == 3 && listed == 1 && revision == 44);
  assert_int_equal(count_reply("{" HEADER("45") "}", &keys, &listed, &revision), KEEL_OK);
  assert_true(keys == 0 && listed == 0 && revision == 45);
  assert_int_equal(count_reply("{" HEADER("46") ",\"count\":\"-1\"}", &keys, &listed, &revision),
                   KEEL_ECORRUPT);
  assert_int_equal(revision, 45);
}

static void test_txn_reply_without_succeeded_failed(void **unused) {
  (void)unused;
  const char *failed = "{" HEADER("9") ",\"responses\":[{\"response_range\":{" HEADER("9") "}}]}";
  const char *won =
      "{" HEADER("10") ",\"succeeded\":true,\"responses\":[{\"response_put\":{" HEADER("10") "}}]}";
  bool succeeded = true;
  uint64_t revision = 0;
  assert_int_equal(keel__etcd_txn_reply(failed, strlen(failed), &succeeded, &revision, NULL, 0),
                   KEEL_OK);
  assert_false(succeeded);
  assert_int_equal(revision, 9);
  assert_int_equal(keel__etcd_txn_reply(won, strlen(won), &succeeded, &revision, NULL, 0), KEEL_OK);
  assert_true(succeeded);
  assert_int_equal(revision, 10);
}

static void test_write_reply(void **unused) {
  (void)unused;
  const char *put = "{" HEADER("11") "}";
  const char *deleted = "{" HEADER("12") ",\"deleted\":\"3\"}";
  int64_t count = -1;
  uint64_t revision = 0;
  assert_int_equal(keel__etcd_write_reply(put, strlen(put), &count, &revision, NULL, 0), KEEL_OK);
  assert_int_equal(count, 0);
  assert_int_equal(revision, 11);
  assert_int_equal(keel__etcd_write_reply(deleted, strlen(deleted), &count, &revision, NULL, 0),
                   KEEL_OK);
  assert_int_equal(count, 3);
  assert_int_equal(revision, 12);
}

static void test_lease_replies(void **unused) {
  (void)unused;
  const char *grant = "{" HEADER("3") ",\"ID\":\"7587862072907474694\",\"TTL\":\"5\"}";
  int64_t lease = 0, ttl = 0;
  assert_int_equal(keel__etcd_lease_grant_reply(grant, strlen(grant), &lease, &ttl, NULL, 0),
                   KEEL_OK);
  assert_int_equal(lease, 7587862072907474694LL);
  assert_int_equal(ttl, 5);
  const char *alive = "{\"result\":{" HEADER("3") ",\"ID\":\"7587862072907474694\",\"TTL\":\"5\"}}";
  assert_int_equal(keel__etcd_keepalive_reply(alive, strlen(alive), &ttl, NULL, 0), KEEL_OK);
  assert_int_equal(ttl, 5);
  /* A lapsed lease: the TTL (0) is left out. */
  ttl = 99;
  const char *gone = "{\"result\":{" HEADER("4") ",\"ID\":\"7587862072907474694\"}}";
  assert_int_equal(keel__etcd_keepalive_reply(gone, strlen(gone), &ttl, NULL, 0), KEEL_ENOTFOUND);
  assert_int_equal(ttl, 99);
  /* timetolive: left and granted; -1 left is a lease that is gone; 0 left is left out. */
  int64_t left = 0, granted = 0;
  const char *live = "{" HEADER("5") ",\"ID\":\"75\",\"TTL\":\"1\",\"grantedTTL\":\"2\"}";
  assert_int_equal(keel__etcd_lease_ttl_reply(live, strlen(live), &left, &granted, NULL, 0),
                   KEEL_OK);
  assert_int_equal(left, 1);
  assert_int_equal(granted, 2);
  const char *ending = "{" HEADER("5") ",\"ID\":\"75\",\"grantedTTL\":\"2\"}";
  assert_int_equal(keel__etcd_lease_ttl_reply(ending, strlen(ending), &left, &granted, NULL, 0),
                   KEEL_OK);
  assert_int_equal(left, 0);
  const char *expired = "{" HEADER("6") ",\"ID\":\"75\",\"TTL\":\"-1\"}";
  assert_int_equal(keel__etcd_lease_ttl_reply(expired, strlen(expired), &left, &granted, NULL, 0),
                   KEEL_ENOTFOUND);
  const char *inverted = "{" HEADER("6") ",\"ID\":\"75\",\"TTL\":\"9\",\"grantedTTL\":\"2\"}";
  assert_int_equal(keel__etcd_lease_ttl_reply(inverted, strlen(inverted), &left, &granted, NULL, 0),
                   KEEL_ECORRUPT);
}

static void test_error_replies_map_to_statuses(void **unused) {
  (void)unused;
  char message[128];
  const char *lease =
      "{\"error\":\"etcdserver: requested lease not found\",\"code\":5,"
      "\"message\":\"etcdserver: requested lease not found\"}";
  bool succeeded;
  assert_int_equal(
      keel__etcd_txn_reply(lease, strlen(lease), &succeeded, NULL, message, sizeof message),
      KEEL_ENOTFOUND);
  assert_string_equal(message, "etcdserver: requested lease not found");
  /* A stream's error (the keepalive and watch streams). */
  const char *stream =
      "{\"error\":{\"grpc_code\":14,\"http_code\":503,\"message\":\"etcdserver: "
      "no leader\",\"http_status\":\"Service Unavailable\"}}";
  int64_t ttl;
  assert_int_equal(
      keel__etcd_keepalive_reply(stream, strlen(stream), &ttl, message, sizeof message),
      KEEL_EAGAIN);
  assert_string_equal(message, "etcdserver: no leader");
}

static void test_malformed_replies_are_refused(void **unused) {
  (void)unused;
  static const char *const bad[] = {
      "",
      "not json",
      "[]",
      "{}", /* no header */
      "{\"header\":{\"revision\":\"abc\"}}",
      "{\"header\":{\"revision\":\"-1\"}}",
      "{\"header\":{\"revision\":\"9223372036854775808\"}}",
      "{\"header\":{\"revision\":\"\"}}",
      "{\"header\":{\"revision\":\"7\"},\"kvs\":{}}",
      "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"Zm9v!\",\"mod_revision\":\"7\"}]}",
      "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"mod_revision\":\"7\"}]}", /* no key */
      "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"Zm8AbQ==\"}]}",   /* NUL in key */
      "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"Zm9v\",\"lease\":true}]}",
      "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"Zm9v\"},7]}",
      "{\"header\":{\"revision\":\"7\"},\"header\":{\"revision\":\"8\"}}", /* duplicate */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    keel_store_entry *entries = (keel_store_entry *)0x1;
    size_t count = 77;
    uint64_t revision = 77;
    keel_status status = range_reply(bad[i], &entries, &count, &revision);
    if (status != KEEL_ECORRUPT) fail_msg("case %zu (%s): %s", i, bad[i], keel_status_name(status));
    assert_ptr_equal(entries, (keel_store_entry *)0x1);
    assert_int_equal(count, 77);
    assert_int_equal(revision, 77);
  }
  const char *yes = "{\"header\":{\"revision\":\"7\"},\"succeeded\":\"yes\"}";
  bool succeeded;
  assert_int_equal(keel__etcd_txn_reply(yes, strlen(yes), &succeeded, NULL, NULL, 0),
                   KEEL_ECORRUPT);
}

/* ---- the members' election state (fencing, finding 37) */

static void test_status_and_member_list_replies(void **unused) {
  (void)unused;
  /* /debug/vars as etcd 3.4 writes it (cut short): ids in hex, some past INT64_MAX. */
  static const char vars[] =
      "{\"cmdline\":[\"etcd\"],\"raft.status\":{\"id\":\"94da3f1e5a2c7b15\",\"term\":31,"
      "\"vote\":\"0\",\"commit\":5073,\"lead\":\"2e1259d415f2a040\",\"raftState\":"
      "\"StateFollower\",\"applied\":5073,\"progress\":{},\"leadtransferee\":\"0\"}}";
  keel_store_member_state state;
  assert_int_equal(keel__etcd_raft_status_reply(vars, strlen(vars), &state), KEEL_OK);
  assert_true(state.id == UINT64_C(0x94da3f1e5a2c7b15));
  assert_true(state.term == 31);
  assert_true(state.has_leader);
  static const char candidate[] =
      "{\"raft.status\":{\"id\":\"7\",\"term\":32,\"lead\":\"0\",\"raftState\":"
      "\"StateCandidate\"}}";
  assert_int_equal(keel__etcd_raft_status_reply(candidate, strlen(candidate), &state), KEEL_OK);
  assert_false(state.has_leader);
  assert_true(state.id == 7 && state.term == 32);
  static const char *const bad_status[] = {
      "{}",                                                                         /* no raft */
      "{\"raft.status\":{\"id\":\"0\",\"term\":1,\"lead\":\"0\"}}",                 /* no id */
      "{\"raft.status\":{\"id\":\"10000000000000000\",\"term\":1,\"lead\":\"0\"}}", /* 65 bits */
      "{\"raft.status\":{\"id\":\"5\",\"term\":\"1\",\"lead\":\"0\"}}",             /* a string */
      "{\"raft.status\":{\"id\":\"5\",\"term\":-1,\"lead\":\"0\"}}",                /* negative */
      "{\"raft.status\":{\"id\":\"5X\",\"term\":1,\"lead\":\"0\"}}",                /* not hex */
      "{\"raft.status\":{\"id\":\"5\",\"term\":1}}",                                /* no lead */
      "not json",
  };
  for (size_t i = 0; i < sizeof bad_status / sizeof bad_status[0]; i++)
    assert_int_equal(keel__etcd_raft_status_reply(bad_status[i], strlen(bad_status[i]), &state),
                     KEEL_ECORRUPT);
  static const char list[] =
      "{\"header\":{\"member_id\":\"1\"},\"members\":[{\"ID\":\"1\",\"name\":\"a\"},"
      "{\"ID\":\"18446744073709551615\",\"name\":\"b\"},{\"ID\":\"3\",\"isLearner\":true}]}";
  uint64_t voters[4];
  size_t count = 0;
  assert_int_equal(keel__etcd_member_list_reply(list, strlen(list), voters, 4, &count, NULL, 0),
                   KEEL_OK);
  assert_int_equal(count, 2);
  assert_true(voters[0] == 1 && voters[1] == UINT64_MAX);
  assert_int_equal(keel__etcd_member_list_reply(list, strlen(list), voters, 1, &count, NULL, 0),
                   KEEL_ERANGE);
  static const char empty[] = "{\"header\":{}}";
  assert_int_equal(keel__etcd_member_list_reply(empty, strlen(empty), voters, 4, &count, NULL, 0),
                   KEEL_ECORRUPT);
}

/* A reading of voters members: each entry {term, has_leader}; answered as many as given. */
static keel_store_quorum quorum_of(size_t voters, size_t answered, const uint64_t *terms,
                                   const bool *leaders) {
  keel_store_quorum quorum = {.voters = voters, .answered = answered};
  for (size_t i = 0; i < answered; i++)
    quorum.members[i] = (keel_store_member_state){i + 1, terms[i], leaders[i]};
  return quorum;
}

static void test_quorum_moved_on(void **unused) {
  (void)unused;
  const bool led[] = {true, true, true}, none[] = {false, false, false},
             mixed[] = {false, true, true};
  /* Finding 37: a leader at term 30 (stalled), the other two campaigning at 31 and 32. */
  keel_store_quorum before = quorum_of(3, 3, (const uint64_t[]){30, 30, 30}, led);
  keel_store_quorum after = quorum_of(3, 2, (const uint64_t[]){31, 32}, none);
  assert_true(keel_store_quorum_moved_on(&before, &after));
  /* The same terms without a leader: a vote cast for a leader not heard of yet, or a
   * pre-vote, may still follow that term's leader. */
  keel_store_quorum same = quorum_of(3, 2, (const uint64_t[]){30, 30}, none);
  assert_false(keel_store_quorum_moved_on(&before, &same));
  /* One member above the earlier terms is no majority of three. */
  keel_store_quorum one = quorum_of(3, 2, (const uint64_t[]){31, 30}, none);
  assert_false(keel_store_quorum_moved_on(&before, &one));
  /* Later terms, but two of the three follow a leader: no majority without one. */
  keel_store_quorum led_later = quorum_of(3, 3, (const uint64_t[]){31, 31, 31}, mixed);
  assert_false(keel_store_quorum_moved_on(&before, &led_later));
  /* A minority answered (a partition's side, or members stopped): never. */
  keel_store_quorum alone = quorum_of(3, 1, (const uint64_t[]){40}, none);
  assert_false(keel_store_quorum_moved_on(&before, &alone));
  /* The earlier reading must have heard a majority: a term it did not see could be anywhere. */
  keel_store_quorum earlier_minority = quorum_of(3, 1, (const uint64_t[]){30}, led);
  assert_false(keel_store_quorum_moved_on(&earlier_minority, &after));
  /* Any earlier term counts, a leaderless one too. */
  keel_store_quorum earlier_mixed = quorum_of(3, 2, (const uint64_t[]){33, 30}, none);
  assert_false(keel_store_quorum_moved_on(&earlier_mixed, &after));
  /* Readings of clusters of different sizes are not compared; five members need three. */
  keel_store_quorum five = quorum_of(5, 3, (const uint64_t[]){31, 31, 32}, none);
  assert_false(keel_store_quorum_moved_on(&before, &five));
  keel_store_quorum five_before = quorum_of(5, 3, (const uint64_t[]){30, 30, 30}, led);
  assert_true(keel_store_quorum_moved_on(&five_before, &five));
  keel_store_quorum five_two = quorum_of(5, 2, (const uint64_t[]){31, 31}, none);
  assert_false(keel_store_quorum_moved_on(&five_before, &five_two));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_base64_vectors),
      cmocka_unit_test(test_base64_every_byte_round_trips),
      cmocka_unit_test(test_base64_refuses_malformed),
      cmocka_unit_test(test_range_request_scopes_a_prefix),
      cmocka_unit_test(test_put_request_sends_lease_as_string),
      cmocka_unit_test(test_cas_request_compares_the_right_revision),
      cmocka_unit_test(test_lease_requests),
      cmocka_unit_test(test_range_reply_reads_defaults),
      cmocka_unit_test(test_wait_check_requests_and_count_reply),
      cmocka_unit_test(test_txn_reply_without_succeeded_failed),
      cmocka_unit_test(test_write_reply),
      cmocka_unit_test(test_lease_replies),
      cmocka_unit_test(test_error_replies_map_to_statuses),
      cmocka_unit_test(test_malformed_replies_are_refused),
      cmocka_unit_test(test_status_and_member_list_replies),
      cmocka_unit_test(test_quorum_moved_on),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
