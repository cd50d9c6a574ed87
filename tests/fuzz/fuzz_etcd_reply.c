/* libFuzzer target over the etcd gateway's reply readers (src/store/etcd_codec.c), which
 * read whatever an etcd member, a proxy or a stranger on the port sends: any input is
 * refused with a documented status and nothing written, or read into entries that keel's
 * store contract allows (named keys without NUL, values within bounds, NUL-terminated). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_seed.h"
#include "store/store_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity);

static bool refusal_known(keel_status status) {
  return status == KEEL_ECORRUPT || status == KEEL_ERANGE || status == KEEL_ENOMEM ||
         status == KEEL_EINVAL || status == KEEL_ETIMEDOUT || status == KEEL_ENOTFOUND ||
         status == KEEL_ENOSPC || status == KEEL_ECONFLICT || status == KEEL_EAGAIN ||
         status == KEEL_EAUTH || status == KEEL_EIO;
}

/* ranges: 0 reads the reply as one range's, 1 or more as a txn of that many ranges. */
static void range_once(const char *body, size_t size, size_t ranges) {
  keel_store_entry *entries = (keel_store_entry *)&entries;
  size_t count = 12345;
  uint64_t revision = 12345;
  char message[64];
  keel_status status = ranges == 0 ? keel__etcd_range_reply(body, size, &entries, &count, &revision,
                                                            message, sizeof message)
                                   : keel__etcd_ranges_reply(body, size, ranges, &entries, &count,
                                                             &revision, message, sizeof message);
  if (status != KEEL_OK) {
    if (!refusal_known(status)) abort();
    if (entries != (keel_store_entry *)&entries || count != 12345 || revision != 12345) abort();
    if (memchr(message, 0, sizeof message) == NULL) abort();
    return;
  }
  if (count > KEEL_STORE_MAX_KEYS) abort();
  for (size_t i = 0; i < count; i++) {
    size_t key_length = strlen(entries[i].key);
    if (key_length == 0 || key_length > KEEL__ETCD_MAX_KEY) abort();
    if (entries[i].value_length > KEEL_STORE_MAX_VALUE) abort();
    if (entries[i].value[entries[i].value_length] != 0) abort();
  }
  keel_store_entries_free(entries, count);
}

static void others_once(const char *body, size_t size) {
  bool succeeded = false;
  uint64_t revision = 0;
  int64_t number = 0, ttl = 0;
  size_t listed = 0;
  keel__etcd_watch_message watch;
  keel_store_member_state member;
  uint64_t voters[4];
  keel_status statuses[] = {
      keel__etcd_raft_status_reply(body, size, &member),
      keel__etcd_member_list_reply(body, size, voters, 4, &listed, NULL, 0),
      keel__etcd_txn_reply(body, size, &succeeded, &revision, NULL, 0),
      keel__etcd_write_reply(body, size, &number, &revision, NULL, 0),
      keel__etcd_lease_grant_reply(body, size, &number, &ttl, NULL, 0),
      keel__etcd_keepalive_reply(body, size, &ttl, NULL, 0),
      keel__etcd_lease_ttl_reply(body, size, &number, &ttl, NULL, 0),
      keel__etcd_watch_reply(body, size, &watch, NULL, 0),
      keel__etcd_range_count_reply(body, size, &number, &listed, &revision, NULL, 0),
  };
  for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
    if (statuses[i] != KEEL_OK && !refusal_known(statuses[i])) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  range_once((const char *)data, size, 0);
  range_once((const char *)data, size, 2);
  others_once((const char *)data, size);
  return 0;
}

size_t keel_fuzz_seed(int index, uint8_t *buffer, size_t capacity) {
  static const char *const seeds[] = {
      "{\"header\":{\"revision\":\"7\"},\"kvs\":[{\"key\":\"Zm9v\",\"mod_revision\":\"7\","
      "\"value\":\"YmFy\"},{\"key\":\"Zm9vMg==\",\"mod_revision\":\"6\",\"lease\":\"75\"}],"
      "\"count\":\"2\"}",
      "{\"header\":{\"revision\":\"10\"},\"succeeded\":true}",
      "{\"header\":{\"revision\":\"12\"},\"deleted\":\"3\"}",
      "{\"header\":{\"revision\":\"3\"},\"ID\":\"7587862072907474694\",\"TTL\":\"5\"}",
      "{\"result\":{\"header\":{\"revision\":\"3\"},\"ID\":\"75\",\"TTL\":\"5\"}}",
      "{\"error\":\"etcdserver: requested lease not found\",\"code\":5,\"message\":\"x\"}",
      "{\"error\":{\"grpc_code\":14,\"http_code\":503,\"message\":\"no leader\"}}",
      "{\"header\":{\"revision\":\"9\"},\"succeeded\":true,\"responses\":[{\"response_range\":"
      "{\"header\":{\"revision\":\"9\"},\"kvs\":[{\"key\":\"YS8x\",\"mod_revision\":\"4\"}]}},"
      "{\"response_range\":{\"header\":{\"revision\":\"9\"}}}]}",
      "{\"result\":{\"header\":{\"revision\":\"9\"},\"created\":true}}",
      "{\"result\":{\"header\":{\"revision\":\"11\"},\"events\":[{\"type\":\"DELETE\","
      "\"kv\":{\"key\":\"YS8x\",\"mod_revision\":\"11\"}}]}}",
      "{\"result\":{\"header\":{\"revision\":\"11\"},\"canceled\":true,"
      "\"compact_revision\":\"5\"}}",
  };
  return keel_fuzz_text_seed(seeds, sizeof seeds / sizeof seeds[0], index, buffer, capacity);
}
