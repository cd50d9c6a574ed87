/* The text of etcd's v3 JSON gateway (grpc-gateway over etcdserverpb): the request bodies
 * keel sends and the replies it reads, with jansson. Three rules of that encoding shape
 * every reader here: keys and values are base64, int64 fields arrive as strings, and a
 * field at its default value (0, false, empty) is left out, so absence means the default. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_internal.h"

/* ---- base64 (RFC 4648, standard alphabet, padded), as protobuf's JSON mapping writes bytes */

static const char BASE64_ALPHABET[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t keel__base64_encoded_bytes(size_t length) { return (length + 2) / 3 * 4; }

void keel__base64_encode(const uint8_t *data, size_t length, char *text) {
  size_t out = 0;
  for (size_t i = 0; i < length; i += 3) {
    uint32_t group = (uint32_t)data[i] << 16;
    if (i + 1 < length) group |= (uint32_t)data[i + 1] << 8;
    if (i + 2 < length) group |= data[i + 2];
    text[out++] = BASE64_ALPHABET[(group >> 18) & 63];
    text[out++] = BASE64_ALPHABET[(group >> 12) & 63];
    text[out++] = i + 1 < length ? BASE64_ALPHABET[(group >> 6) & 63] : '=';
    text[out++] = i + 2 < length ? BASE64_ALPHABET[group & 63] : '=';
  }
  text[out] = '\0';
}

static int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

keel_status keel__base64_decode(const char *text, size_t text_length, uint8_t **data_p,
                                size_t *length_p) {
  if (text_length % 4 != 0) return KEEL_ECORRUPT;
  size_t padding = 0;
  if (text_length > 0 && text[text_length - 1] == '=') padding++;
  if (text_length > 1 && text[text_length - 2] == '=') padding++;
  size_t length = text_length / 4 * 3 - padding;
  /* One byte more for a NUL, as keel_store_entry promises its values. */
  uint8_t *data = malloc(length + 1);
  if (data == NULL) return KEEL_ENOMEM;
  size_t out = 0;
  for (size_t i = 0; i < text_length; i += 4) {
    uint32_t group = 0;
    for (size_t k = 0; k < 4; k++) {
      bool pad = i + k >= text_length - padding;
      int value = pad ? 0 : base64_value(text[i + k]);
      if (value < 0 || (pad && text[i + k] != '=')) goto fail_free;
      group = group << 6 | (uint32_t)value;
    }
    uint8_t bytes[3] = {(uint8_t)(group >> 16), (uint8_t)(group >> 8), (uint8_t)group};
    for (size_t k = 0; k < 3 && out < length; k++) data[out++] = bytes[k];
    /* Bits under the padding must be zero: one text per byte string. */
    if (i + 4 == text_length &&
        ((padding == 1 && bytes[2] != 0) || (padding == 2 && bytes[1] != 0)))
      goto fail_free;
  }
  data[length] = '\0';
  *data_p = data;
  *length_p = length;
  return KEEL_OK;

fail_free:
  free(data);
  return KEEL_ECORRUPT;
}

/* ---- requests */

static json_t *base64_string(const void *data, size_t length) {
  char *text = malloc(keel__base64_encoded_bytes(length) + 1);
  if (text == NULL) return NULL;
  keel__base64_encode(data, length, text);
  json_t *string = json_string(text);
  free(text);
  return string;
}

/* int64 fields go out as decimal strings, the way the gateway writes them. */
static json_t *int64_string(int64_t value) {
  char text[24];
  snprintf(text, sizeof text, "%lld", (long long)value);
  return json_string(text);
}

/* Sets member name of object to value (which it takes); false when value is NULL or the set
 * failed, so that callers can chain and check once. */
static bool member_set(json_t *object, const char *name, json_t *value) {
  return value != NULL && json_object_set_new(object, name, value) == 0;
}

/* The end of the range of every key that starts with prefix: prefix with its last byte
 * that is not 0xff incremented and the rest cut; "\0" (every key) when there is none. */
static size_t prefix_end(const char *prefix, uint8_t *end) {
  size_t length = strlen(prefix);
  memcpy(end, prefix, length);
  while (length > 0) {
    if (end[length - 1] != 0xff) {
      end[length - 1]++;
      return length;
    }
    length--;
  }
  end[0] = 0;
  return 1;
}

/* {"key": k} or, for a prefix, {"key": p, "range_end": end(p)}; the empty prefix is every
 * key ({"key": "\0", "range_end": "\0"}). */
static json_t *range_object(const char *key, bool prefix) {
  json_t *object = json_object();
  if (object == NULL) return NULL;
  bool ok;
  if (prefix && key[0] == '\0') {
    static const uint8_t zero = 0;
    ok = member_set(object, "key", base64_string(&zero, 1)) &&
         member_set(object, "range_end", base64_string(&zero, 1));
  } else {
    ok = member_set(object, "key", base64_string(key, strlen(key)));
    if (ok && prefix) {
      uint8_t end[KEEL__ETCD_MAX_KEY + 1];
      size_t end_length = prefix_end(key, end);
      ok = member_set(object, "range_end", base64_string(end, end_length));
    }
  }
  if (ok) return object;
  json_decref(object);
  return NULL;
}

static json_t *put_object(const char *key, const void *value, size_t length, int64_t lease) {
  json_t *object = json_object();
  if (object == NULL) return NULL;
  bool ok = member_set(object, "key", base64_string(key, strlen(key))) &&
            member_set(object, "value", base64_string(value, length));
  if (ok && lease != 0) ok = member_set(object, "lease", int64_string(lease));
  if (ok) return object;
  json_decref(object);
  return NULL;
}

/* The body's text (the caller frees it), or NULL when out of memory; takes object. */
static char *body_of(json_t *object) {
  if (object == NULL) return NULL;
  char *text = json_dumps(object, JSON_COMPACT);
  json_decref(object);
  return text;
}

static bool key_valid(const char *key, bool prefix) {
  if (key == NULL) return false;
  size_t length = strlen(key);
  return length <= KEEL__ETCD_MAX_KEY && (length > 0 || prefix);
}

char *keel__etcd_range_request(const char *key, bool prefix) {
  return key_valid(key, prefix) ? body_of(range_object(key, prefix)) : NULL;
}

char *keel__etcd_put_request(const char *key, const void *value, size_t length, int64_t lease) {
  if (!key_valid(key, false) || length > KEEL_STORE_MAX_VALUE) return NULL;
  return body_of(put_object(key, value, length, lease));
}

char *keel__etcd_delete_request(const char *key, bool prefix) {
  return key_valid(key, prefix) ? body_of(range_object(key, prefix)) : NULL;
}

/* A put if the key's mod_revision is expected (0: if the key has no create_revision, that
 * is, is absent); a range of the key otherwise, so that the reply says what is there. */
char *keel__etcd_cas_request(const char *key, uint64_t expected_revision, const void *value,
                             size_t length, int64_t lease) {
  if (!key_valid(key, false) || length > KEEL_STORE_MAX_VALUE || expected_revision > INT64_MAX)
    return NULL;
  json_t *body = json_object(), *compare = json_object(), *put = json_object(),
         *range = json_object();
  bool absent = expected_revision == 0;
  bool ok = body && compare && put && range &&
            member_set(compare, "key", base64_string(key, strlen(key))) &&
            member_set(compare, "target", json_string(absent ? "CREATE" : "MOD")) &&
            member_set(compare, "result", json_string("EQUAL")) &&
            member_set(compare, absent ? "create_revision" : "mod_revision",
                       int64_string((int64_t)expected_revision)) &&
            member_set(put, "request_put", put_object(key, value, length, lease)) &&
            member_set(range, "request_range", range_object(key, false)) &&
            member_set(body, "compare", json_pack("[O]", compare)) &&
            member_set(body, "success", json_pack("[O]", put)) &&
            member_set(body, "failure", json_pack("[O]", range));
  json_decref(compare);
  json_decref(put);
  json_decref(range);
  if (ok) return body_of(body);
  json_decref(body);
  return NULL;
}

/* The gateway's lease requests: {"TTL": s} to grant (the server picks the ID), {"ID": id}
 * to keep alive or revoke. */
char *keel__etcd_lease_grant_request(int64_t ttl_seconds) {
  if (ttl_seconds <= 0) return NULL;
  json_t *body = json_object();
  if (body == NULL || !member_set(body, "TTL", int64_string(ttl_seconds))) {
    json_decref(body);
    return NULL;
  }
  return body_of(body);
}

char *keel__etcd_lease_id_request(int64_t lease) {
  if (lease <= 0) return NULL;
  json_t *body = json_object();
  if (body == NULL || !member_set(body, "ID", int64_string(lease))) {
    json_decref(body);
    return NULL;
  }
  return body_of(body);
}

/* A txn with no compare (so it succeeds) of one prefix range per prefix: several prefixes
 * read at one revision in one request. */
char *keel__etcd_ranges_request(const char *const *prefixes, size_t count) {
  if (count == 0 || count > KEEL_STORE_MAX_PREFIXES) return NULL;
  json_t *body = json_object(), *success = json_array();
  bool ok = body != NULL && success != NULL;
  for (size_t i = 0; ok && i < count; i++) {
    json_t *operation = json_object();
    ok = operation != NULL && key_valid(prefixes[i], true) &&
         member_set(operation, "request_range", range_object(prefixes[i], true)) &&
         json_array_append(success, operation) == 0;
    json_decref(operation);
  }
  ok = ok && member_set(body, "success", json_incref(success));
  json_decref(success);
  if (ok) return body_of(body);
  json_decref(body);
  return NULL;
}

/* A prefix range with option (true) and a revision field set: what a wait reads. */
static char *range_check_request(const char *prefix, const char *option, const char *field,
                                 uint64_t revision) {
  if (!key_valid(prefix, true) || revision == 0 || revision > INT64_MAX) return NULL;
  json_t *body = range_object(prefix, true);
  bool ok = body != NULL && member_set(body, option, json_true()) &&
            member_set(body, field, int64_string((int64_t)revision));
  if (ok) return body_of(body);
  json_decref(body);
  return NULL;
}

/* Keys only, those changed after after_revision; its "count" is still every key under the
 * prefix (etcd counts before it filters). */
char *keel__etcd_changed_since_request(const char *prefix, uint64_t after_revision) {
  return range_check_request(prefix, "keys_only", "min_mod_revision", after_revision + 1);
}

/* Only how many keys the prefix held at revision (>= 1). */
char *keel__etcd_count_at_request(const char *prefix, uint64_t revision) {
  return range_check_request(prefix, "count_only", "revision", revision);
}

/* {"create_request": {"key", "range_end", "start_revision"}}: every change under prefix
 * from start_revision on, the ones already made included. */
char *keel__etcd_watch_request(const char *prefix, uint64_t start_revision) {
  if (!key_valid(prefix, true) || start_revision == 0 || start_revision > INT64_MAX) return NULL;
  json_t *body = json_object(), *create = range_object(prefix, true);
  bool ok = body != NULL && create != NULL &&
            member_set(create, "start_revision", int64_string((int64_t)start_revision)) &&
            member_set(body, "create_request", json_incref(create));
  json_decref(create);
  if (ok) return body_of(body);
  json_decref(body);
  return NULL;
}

/* ---- replies */

/* An int64 field: a decimal string (how the gateway writes int64), a JSON integer (how a
 * proxy might), or absent (its default, 0). Anything else is malformed. */
static bool int64_field(const json_t *object, const char *name, int64_t *value_p) {
  const json_t *field = json_object_get(object, name);
  if (field == NULL) {
    *value_p = 0;
    return true;
  }
  if (json_is_integer(field)) {
    *value_p = (int64_t)json_integer_value(field);
    return true;
  }
  /* A NUL inside the string would end the parser's text early. */
  if (!json_is_string(field) || strlen(json_string_value(field)) != json_string_length(field))
    return false;
  return keel_parse_int(json_string_value(field), INT64_MIN, INT64_MAX, value_p) == KEEL_OK;
}

static bool revision_field(const json_t *object, const char *name, uint64_t *revision_p) {
  int64_t value;
  if (!int64_field(object, name, &value) || value < 0) return false;
  *revision_p = (uint64_t)value;
  return true;
}

/* A bool field: absent is false (a failed txn carries no "succeeded"). */
static bool bool_field(const json_t *object, const char *name, bool *value_p) {
  const json_t *field = json_object_get(object, name);
  if (field != NULL && !json_is_boolean(field)) return false;
  *value_p = field != NULL && json_is_true(field);
  return true;
}

/* A bytes field: absent is empty (an empty value is left out). */
static keel_status bytes_field(const json_t *object, const char *name, uint8_t **data_p,
                               size_t *length_p) {
  const json_t *field = json_object_get(object, name);
  if (field == NULL) return keel__base64_decode("", 0, data_p, length_p);
  if (!json_is_string(field)) return KEEL_ECORRUPT;
  return keel__base64_decode(json_string_value(field), json_string_length(field), data_p, length_p);
}

/* The gateway's error reply: {"error": text, "code": grpc code, "message": text}. */
static keel_status grpc_status(int64_t code) {
  switch (code) {
    case 3:
      return KEEL_EINVAL; /* INVALID_ARGUMENT */
    case 4:
      return KEEL_ETIMEDOUT; /* DEADLINE_EXCEEDED */
    case 5:
      return KEEL_ENOTFOUND; /* NOT_FOUND: a lease that does not exist */
    case 8:
      return KEEL_ENOSPC; /* RESOURCE_EXHAUSTED: the database quota */
    case 9:
      return KEEL_ECONFLICT; /* FAILED_PRECONDITION */
    case 11:
      return KEEL_ERANGE; /* OUT_OF_RANGE: a compacted revision */
    case 14:
      return KEEL_EAGAIN; /* UNAVAILABLE: no leader, try another member */
    case 16:
      return KEEL_EAUTH; /* UNAUTHENTICATED */
    default:
      return KEEL_EIO;
  }
}

/* Parses body as a JSON object; an error reply becomes its status (message copied). */
static keel_status reply_open(const char *body, size_t length, json_t **object_p, char *message,
                              size_t capacity) {
  if (message != NULL && capacity > 0) message[0] = '\0';
  json_t *object = json_loadb(body, length, JSON_REJECT_DUPLICATES, NULL);
  if (object == NULL || !json_is_object(object)) {
    json_decref(object);
    return KEEL_ECORRUPT;
  }
  /* A unary call's error is flat ({"error": text, "code", "message"}); a stream's comes as
   * one message {"error": {"grpc_code", "http_code", "message", "http_status"}}. */
  const json_t *error = json_object_get(object, "error");
  if (error != NULL || json_object_get(object, "code") != NULL) {
    const json_t *holder = json_is_object(error) ? error : object;
    const char *code_name = json_object_get(holder, "grpc_code") != NULL ? "grpc_code" : "code";
    int64_t value = 0;
    if (!int64_field(holder, code_name, &value)) value = -1;
    const json_t *text = json_is_string(error) ? error : json_object_get(holder, "message");
    if (message != NULL && capacity > 0 && json_is_string(text))
      snprintf(message, capacity, "%s", json_string_value(text));
    json_decref(object);
    return grpc_status(value);
  }
  *object_p = object;
  return KEEL_OK;
}

/* reply_open for the replies that carry the store's revision in their header. */
static keel_status reply_open_at_revision(const char *body, size_t length, json_t **object_p,
                                          uint64_t *revision_p, char *message, size_t capacity) {
  json_t *reply = NULL;
  keel_status status = reply_open(body, length, &reply, message, capacity);
  if (status != KEEL_OK) return status;
  const json_t *header = json_object_get(reply, "header");
  if (!json_is_object(header) || !revision_field(header, "revision", revision_p)) {
    json_decref(reply);
    return KEEL_ECORRUPT;
  }
  *object_p = reply;
  return KEEL_OK;
}

/* One element of "kvs" into entry. */
static keel_status entry_read(const json_t *kv, keel_store_entry *entry) {
  if (!json_is_object(kv)) return KEEL_ECORRUPT;
  int64_t lease;
  if (!revision_field(kv, "mod_revision", &entry->revision) || !int64_field(kv, "lease", &lease))
    return KEEL_ECORRUPT;
  entry->lease = lease;
  uint8_t *key = NULL;
  size_t key_length = 0;
  keel_status status = bytes_field(kv, "key", &key, &key_length);
  if (status != KEEL_OK) return status;
  /* keel's keys are text: a NUL inside one, or none at all, is not a keel key. */
  if (key_length == 0 || key_length > KEEL__ETCD_MAX_KEY || memchr(key, 0, key_length) != NULL) {
    free(key);
    return KEEL_ECORRUPT;
  }
  entry->key = (char *)key;
  status = bytes_field(kv, "value", &entry->value, &entry->value_length);
  if (status == KEEL_OK && entry->value_length > KEEL_STORE_MAX_VALUE) {
    free(entry->value);
    status = KEEL_ERANGE;
  }
  if (status != KEEL_OK) {
    free(entry->key);
    entry->key = NULL;
  }
  return status;
}

/* Appends the "kvs" of holder (absent: none) to *entries (of *count, grown as needed). */
static keel_status kvs_append(const json_t *holder, keel_store_entry **entries, size_t *count) {
  if (!json_is_object(holder)) return KEEL_ECORRUPT;
  const json_t *kvs = json_object_get(holder, "kvs");
  if (kvs == NULL) return KEEL_OK;
  if (!json_is_array(kvs)) return KEEL_ECORRUPT;
  size_t more = json_array_size(kvs);
  if (more > KEEL_STORE_MAX_KEYS - *count) return KEEL_ERANGE;
  if (more == 0) return KEEL_OK;
  keel_store_entry *grown = realloc(*entries, (*count + more) * sizeof *grown);
  if (grown == NULL) return KEEL_ENOMEM;
  *entries = grown;
  for (size_t i = 0; i < more; i++) {
    memset(&grown[*count], 0, sizeof grown[*count]);
    keel_status status = entry_read(json_array_get(kvs, i), &grown[*count]);
    if (status != KEEL_OK) return status;
    (*count)++;
  }
  return KEEL_OK;
}

/* Hands the entries read from a reply to the caller, or frees them on failure; an empty
 * result is a one-entry allocation, never NULL, so that success always owns an array. */
static keel_status entries_finish(keel_status status, keel_store_entry *entries, size_t count,
                                  uint64_t revision, keel_store_entry **entries_p, size_t *count_p,
                                  uint64_t *revision_p) {
  if (status == KEEL_OK && entries == NULL && (entries = calloc(1, sizeof *entries)) == NULL)
    status = KEEL_ENOMEM;
  if (status != KEEL_OK) {
    keel_store_entries_free(entries, count);
    return status;
  }
  *entries_p = entries;
  *count_p = count;
  if (revision_p != NULL) *revision_p = revision;
  return KEEL_OK;
}

keel_status keel__etcd_range_reply(const char *body, size_t length, keel_store_entry **entries_p,
                                   size_t *count_p, uint64_t *revision_p, char *message,
                                   size_t capacity) {
  json_t *reply = NULL;
  uint64_t revision = 0;
  keel_status status = reply_open_at_revision(body, length, &reply, &revision, message, capacity);
  if (status != KEEL_OK) return status;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  status = kvs_append(reply, &entries, &count);
  json_decref(reply);
  return entries_finish(status, entries, count, revision, entries_p, count_p, revision_p);
}

keel_status keel__etcd_range_count_reply(const char *body, size_t length, int64_t *count_p,
                                         size_t *listed_p, uint64_t *revision_p, char *message,
                                         size_t capacity) {
  json_t *reply = NULL;
  uint64_t revision = 0;
  keel_status status = reply_open_at_revision(body, length, &reply, &revision, message, capacity);
  if (status != KEEL_OK) return status;
  int64_t count = 0;
  const json_t *kvs = json_object_get(reply, "kvs");
  if (!int64_field(reply, "count", &count) || count < 0 || (kvs != NULL && !json_is_array(kvs)))
    status = KEEL_ECORRUPT;
  if (status == KEEL_OK) {
    *count_p = count;
    *listed_p = kvs != NULL ? json_array_size(kvs) : 0;
    *revision_p = revision;
  }
  json_decref(reply);
  return status;
}

keel_status keel__etcd_ranges_reply(const char *body, size_t length, size_t range_count,
                                    keel_store_entry **entries_p, size_t *count_p,
                                    uint64_t *revision_p, char *message, size_t capacity) {
  json_t *reply = NULL;
  uint64_t revision = 0;
  keel_status status = reply_open_at_revision(body, length, &reply, &revision, message, capacity);
  if (status != KEEL_OK) return status;
  const json_t *responses = json_object_get(reply, "responses");
  bool succeeded = false;
  if (!bool_field(reply, "succeeded", &succeeded) || !succeeded || !json_is_array(responses) ||
      json_array_size(responses) != range_count)
    status = KEEL_ECORRUPT;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  for (size_t i = 0; status == KEEL_OK && i < range_count; i++) {
    const json_t *response = json_array_get(responses, i);
    status = json_is_object(response)
                 ? kvs_append(json_object_get(response, "response_range"), &entries, &count)
                 : KEEL_ECORRUPT;
  }
  json_decref(reply);
  return entries_finish(status, entries, count, revision, entries_p, count_p, revision_p);
}

keel_status keel__etcd_txn_reply(const char *body, size_t length, bool *succeeded_p,
                                 uint64_t *revision_p, char *message, size_t capacity) {
  json_t *reply = NULL;
  uint64_t revision = 0;
  keel_status status = reply_open_at_revision(body, length, &reply, &revision, message, capacity);
  if (status != KEEL_OK) return status;
  bool succeeded = false;
  if (!bool_field(reply, "succeeded", &succeeded)) status = KEEL_ECORRUPT;
  json_decref(reply);
  if (status != KEEL_OK) return status;
  *succeeded_p = succeeded;
  if (revision_p != NULL) *revision_p = revision;
  return KEEL_OK;
}

keel_status keel__etcd_write_reply(const char *body, size_t length, int64_t *deleted_p,
                                   uint64_t *revision_p, char *message, size_t capacity) {
  json_t *reply = NULL;
  uint64_t revision = 0;
  keel_status status = reply_open_at_revision(body, length, &reply, &revision, message, capacity);
  if (status != KEEL_OK) return status;
  int64_t deleted = 0;
  if (!int64_field(reply, "deleted", &deleted) || deleted < 0) status = KEEL_ECORRUPT;
  json_decref(reply);
  if (status != KEEL_OK) return status;
  if (deleted_p != NULL) *deleted_p = deleted;
  if (revision_p != NULL) *revision_p = revision;
  return KEEL_OK;
}

/* A lease reply's ID and TTL; the grant's own failure comes as "error" beside them. */
static keel_status lease_fields(const json_t *object, int64_t *lease_p, int64_t *ttl_p) {
  if (!json_is_object(object) || !int64_field(object, "ID", lease_p) ||
      !int64_field(object, "TTL", ttl_p))
    return KEEL_ECORRUPT;
  return KEEL_OK;
}

keel_status keel__etcd_lease_grant_reply(const char *body, size_t length, int64_t *lease_p,
                                         int64_t *ttl_seconds_p, char *message, size_t capacity) {
  json_t *reply = NULL;
  keel_status status = reply_open(body, length, &reply, message, capacity);
  if (status != KEEL_OK) return status;
  int64_t lease = 0, ttl = 0;
  status = lease_fields(reply, &lease, &ttl);
  if (status == KEEL_OK && (lease <= 0 || ttl <= 0)) status = KEEL_ECORRUPT;
  json_decref(reply);
  if (status != KEEL_OK) return status;
  *lease_p = lease;
  *ttl_seconds_p = ttl;
  return KEEL_OK;
}

/* A keepalive reply is one message of a stream: {"result": {"header", "ID", "TTL"}}. A
 * TTL left out (0) means the lease is gone: KEEL_ENOTFOUND. */
keel_status keel__etcd_keepalive_reply(const char *body, size_t length, int64_t *ttl_seconds_p,
                                       char *message, size_t capacity) {
  json_t *reply = NULL;
  keel_status status = reply_open(body, length, &reply, message, capacity);
  if (status != KEEL_OK) return status;
  int64_t lease = 0, ttl = 0;
  status = lease_fields(json_object_get(reply, "result"), &lease, &ttl);
  if (status == KEEL_OK && ttl < 0) status = KEEL_ECORRUPT;
  if (status == KEEL_OK && ttl == 0) status = KEEL_ENOTFOUND;
  json_decref(reply);
  if (status != KEEL_OK) return status;
  *ttl_seconds_p = ttl;
  return KEEL_OK;
}

keel_status keel__etcd_lease_ttl_reply(const char *body, size_t length, int64_t *left_seconds_p,
                                       int64_t *granted_seconds_p, char *message, size_t capacity) {
  json_t *reply = NULL;
  keel_status status = reply_open(body, length, &reply, message, capacity);
  if (status != KEEL_OK) return status;
  int64_t lease = 0, left = 0, granted = 0;
  status = lease_fields(reply, &lease, &left);
  if (status == KEEL_OK && !int64_field(reply, "grantedTTL", &granted)) status = KEEL_ECORRUPT;
  if (status == KEEL_OK && left == -1) status = KEEL_ENOTFOUND;
  if (status == KEEL_OK && (left < 0 || granted < 0 || left > granted)) status = KEEL_ECORRUPT;
  json_decref(reply);
  if (status != KEEL_OK) return status;
  *left_seconds_p = left;
  *granted_seconds_p = granted;
  return KEEL_OK;
}

/* A uint64 field (member ids use all 64 bits): a decimal string; absent is 0. */
static bool uint64_field(const json_t *object, const char *name, uint64_t *value_p) {
  const json_t *field = json_object_get(object, name);
  if (field == NULL) {
    *value_p = 0;
    return true;
  }
  if (!json_is_string(field)) return false;
  const char *text = json_string_value(field);
  size_t length = json_string_length(field);
  if (length == 0 || length > 20 || strspn(text, "0123456789") != length) return false;
  uint64_t value = 0;
  for (size_t i = 0; i < length; i++) {
    uint64_t digit = (uint64_t)(text[i] - '0');
    if (value > (UINT64_MAX - digit) / 10) return false;
    value = value * 10 + digit;
  }
  *value_p = value;
  return true;
}

/* A raft id as /debug/vars writes it: lowercase hex, at most 16 digits. */
static bool hex_id(const json_t *field, uint64_t *value_p) {
  if (!json_is_string(field)) return false;
  const char *text = json_string_value(field);
  size_t length = json_string_length(field);
  if (length == 0 || length > 16 || strspn(text, "0123456789abcdef") != length) return false;
  uint64_t value = 0;
  for (size_t i = 0; i < length; i++)
    value = value << 4 | (uint64_t)(text[i] <= '9' ? text[i] - '0' : text[i] - 'a' + 10);
  *value_p = value;
  return true;
}

keel_status keel__etcd_raft_status_reply(const char *body, size_t length,
                                         keel_store_member_state *state) {
  json_t *reply = json_loadb(body, length, JSON_REJECT_DUPLICATES, NULL);
  const json_t *raft = json_object_get(reply, "raft.status");
  const json_t *term = json_object_get(raft, "term");
  keel_store_member_state read = {0};
  uint64_t leader = 0;
  keel_status status = KEEL_OK;
  if (!json_is_object(raft) || !hex_id(json_object_get(raft, "id"), &read.id) || read.id == 0 ||
      !json_is_integer(term) || json_integer_value(term) < 0 ||
      !hex_id(json_object_get(raft, "lead"), &leader))
    status = KEEL_ECORRUPT;
  if (status == KEEL_OK) read.term = (uint64_t)json_integer_value(term);
  json_decref(reply);
  if (status != KEEL_OK) return status;
  read.has_leader = leader != 0;
  *state = read;
  return KEEL_OK;
}

keel_status keel__etcd_member_list_reply(const char *body, size_t length, uint64_t *voters,
                                         size_t capacity, size_t *count_p, char *message,
                                         size_t message_capacity) {
  json_t *reply = NULL;
  keel_status status = reply_open(body, length, &reply, message, message_capacity);
  if (status != KEEL_OK) return status;
  const json_t *members = json_object_get(reply, "members");
  size_t count = 0;
  if (!json_is_array(members)) status = KEEL_ECORRUPT;
  for (size_t i = 0; status == KEEL_OK && i < json_array_size(members); i++) {
    const json_t *member = json_array_get(members, i);
    uint64_t id = 0;
    bool learner = false;
    if (!json_is_object(member) || !uint64_field(member, "ID", &id) || id == 0 ||
        !bool_field(member, "isLearner", &learner))
      status = KEEL_ECORRUPT;
    else if (!learner && count == capacity)
      status = KEEL_ERANGE;
    else if (!learner)
      voters[count++] = id;
  }
  json_decref(reply);
  if (status == KEEL_OK && count == 0) status = KEEL_ECORRUPT;
  if (status == KEEL_OK) *count_p = count;
  return status;
}

/* One message of a watch stream: {"result": {"header", "created", "events", "canceled",
 * "compact_revision"}}. A compacted start is a cancel with compact_revision set. */
keel_status keel__etcd_watch_reply(const char *body, size_t length,
                                   keel__etcd_watch_message *message_p, char *message,
                                   size_t capacity) {
  json_t *reply = NULL;
  keel_status status = reply_open(body, length, &reply, message, capacity);
  if (status != KEEL_OK) return status;
  const json_t *result = json_object_get(reply, "result");
  const json_t *header = json_object_get(result, "header");
  const json_t *events = json_object_get(result, "events");
  keel__etcd_watch_message read = {0};
  if (!json_is_object(result) || !json_is_object(header) ||
      !revision_field(header, "revision", &read.revision) ||
      !bool_field(result, "created", &read.created) ||
      !bool_field(result, "canceled", &read.canceled) ||
      !int64_field(result, "compact_revision", &read.compact_revision) ||
      read.compact_revision < 0 || (events != NULL && !json_is_array(events)))
    status = KEEL_ECORRUPT;
  read.events = events == NULL ? 0 : json_array_size(events);
  json_decref(reply);
  if (status == KEEL_OK) *message_p = read;
  return status;
}
