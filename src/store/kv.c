/* The embedded store's state: keys sorted in one array (binary search, prefix ranges in
 * order for list), leases sorted by id (with grace after a stall of the server), a global
 * revision and a bounded ring of recent deletions so that a wait also sees keys that are
 * gone. Single-threaded by contract: the server holds its mutex around every call. */
#include <stdlib.h>
#include <string.h>

#include "store/store_internal.h"

/* Deletions remembered for waits; a waiter further behind than this is woken at once. */
#define KV_DELETIONS 1024

typedef struct kv_record {
  uint64_t revision;
  int64_t lease;
  size_t key_length;
  size_t value_length;
  char data[]; /* key then value, one allocation per key */
} kv_record;

typedef struct kv_lease {
  int64_t id;
  int64_t ttl_ns;
  int64_t expiry_ns;
  bool doomed; /* expired or revoked; its keys go in the next sweep */
} kv_lease;

typedef struct kv_deletion {
  uint64_t revision;
  size_t key_length;
  char key[KEEL_STORE_MAX_KEY];
} kv_deletion;

struct keel__store_kv {
  kv_record **records; /* sorted by key */
  size_t count;
  size_t capacity;
  size_t bytes;     /* keys and values held, against KEEL__STORE_MAX_BYTES */
  kv_lease *leases; /* sorted by id: ids only grow, so appending keeps the order */
  size_t lease_count;
  size_t lease_capacity;
  int64_t next_lease_id;
  uint64_t revision;
  kv_deletion *deletions; /* ring, oldest overwritten first */
  size_t deletion_next;
  size_t deletion_count;
  uint64_t forgotten_revision; /* newest revision of a deletion the ring dropped */
  int64_t serviced_ns;         /* latest time keel__store_kv_expire ran, once serviced */
  bool serviced;
  uint64_t stalls; /* gaps that earned the leases grace */
};

keel_status keel__store_kv_create(keel__store_kv **kv_p) {
  keel__store_kv *kv = calloc(1, sizeof *kv);
  if (kv == NULL) return KEEL_ENOMEM;
  kv->deletions = calloc(KV_DELETIONS, sizeof *kv->deletions);
  if (kv->deletions == NULL) goto fail_free_kv;
  kv->next_lease_id = 1;
  *kv_p = kv;
  return KEEL_OK;

fail_free_kv:
  free(kv);
  return KEEL_ENOMEM;
}

void keel__store_kv_destroy(keel__store_kv *kv) {
  if (kv == NULL) return;
  for (size_t i = 0; i < kv->count; i++) free(kv->records[i]);
  free(kv->records);
  free(kv->leases);
  free(kv->deletions);
  free(kv);
}

uint64_t keel__store_kv_revision(const keel__store_kv *kv) { return kv->revision; }

/* Byte order, shorter first on a tie: the order strcmp gives keys without NULs. */
static int key_compare(const char *a, size_t a_length, const char *b, size_t b_length) {
  size_t common = a_length < b_length ? a_length : b_length;
  /* An empty prefix may come without a pointer; memcmp must not see it. */
  int order = common > 0 ? memcmp(a, b, common) : 0;
  if (order != 0) return order;
  return (a_length > b_length) - (a_length < b_length);
}

static bool has_prefix(const char *key, size_t key_length, const char *prefix,
                       size_t prefix_length) {
  return key_length >= prefix_length &&
         (prefix_length == 0 || memcmp(key, prefix, prefix_length) == 0);
}

/* Index of the first record whose key is not below key. */
static size_t lower_bound(const keel__store_kv *kv, const char *key, size_t key_length) {
  size_t low = 0;
  size_t high = kv->count;
  while (low < high) {
    size_t middle = low + (high - low) / 2;
    const kv_record *record = kv->records[middle];
    if (key_compare(record->data, record->key_length, key, key_length) < 0)
      low = middle + 1;
    else
      high = middle;
  }
  return low;
}

static bool find(const keel__store_kv *kv, const char *key, size_t key_length, size_t *index_p) {
  size_t index = lower_bound(kv, key, key_length);
  *index_p = index;
  return index < kv->count && key_compare(kv->records[index]->data, kv->records[index]->key_length,
                                          key, key_length) == 0;
}

static kv_lease *lease_find(const keel__store_kv *kv, int64_t id) {
  size_t low = 0;
  size_t high = kv->lease_count;
  while (low < high) {
    size_t middle = low + (high - low) / 2;
    if (kv->leases[middle].id < id)
      low = middle + 1;
    else
      high = middle;
  }
  return low < kv->lease_count && kv->leases[low].id == id ? &kv->leases[low] : NULL;
}

static void remember_deletion(keel__store_kv *kv, const kv_record *record, uint64_t revision) {
  kv_deletion *slot = &kv->deletions[kv->deletion_next];
  if (kv->deletion_count == KV_DELETIONS) {
    if (slot->revision > kv->forgotten_revision) kv->forgotten_revision = slot->revision;
  } else {
    kv->deletion_count++;
  }
  slot->revision = revision;
  slot->key_length = record->key_length;
  memcpy(slot->key, record->data, record->key_length);
  kv->deletion_next = (kv->deletion_next + 1) % KV_DELETIONS;
}

static void record_remove(keel__store_kv *kv, size_t index, uint64_t revision) {
  kv_record *record = kv->records[index];
  remember_deletion(kv, record, revision);
  kv->bytes -= record->key_length + record->value_length;
  free(record);
  memmove(&kv->records[index], &kv->records[index + 1],
          (kv->count - index - 1) * sizeof *kv->records);
  kv->count--;
}

/* Deletes the keys of every doomed lease with one revision, then the leases. */
static bool sweep_doomed_leases(keel__store_kv *kv) {
  uint64_t revision = kv->revision + 1;
  size_t kept = 0;
  bool removed = false;
  for (size_t i = 0; i < kv->count; i++) {
    kv_record *record = kv->records[i];
    const kv_lease *lease = record->lease != 0 ? lease_find(kv, record->lease) : NULL;
    if (lease != NULL && lease->doomed) {
      remember_deletion(kv, record, revision);
      kv->bytes -= record->key_length + record->value_length;
      free(record);
      removed = true;
    } else {
      kv->records[kept++] = record;
    }
  }
  kv->count = kept;
  if (removed) kv->revision = revision;
  size_t kept_leases = 0;
  for (size_t i = 0; i < kv->lease_count; i++)
    if (!kv->leases[i].doomed) kv->leases[kept_leases++] = kv->leases[i];
  kv->lease_count = kept_leases;
  return removed;
}

static int64_t saturating_add(int64_t now_ns, int64_t duration_ns) {
  return duration_ns > KEEL_NO_DEADLINE - now_ns ? KEEL_NO_DEADLINE : now_ns + duration_ns;
}

/* The grace of keel__store_kv_expire. Only the kv's own gap counts, never a lease's
 * silence: the lease thread services the kv every tick while leases exist, so a holder
 * that stopped cannot open a gap here. An idle store without leases may go unserviced for
 * long; with nothing to extend, that is no stall. */
static void grant_stall_grace(keel__store_kv *kv, int64_t now_ns) {
  if (kv->serviced && now_ns - kv->serviced_ns > KEEL__STORE_STALL_NS) {
    size_t extended = 0;
    for (size_t i = 0; i < kv->lease_count; i++) {
      int64_t floor_ns = saturating_add(now_ns, kv->leases[i].ttl_ns);
      if (kv->leases[i].expiry_ns < floor_ns) {
        kv->leases[i].expiry_ns = floor_ns;
        extended++;
      }
    }
    if (extended > 0) {
      kv->stalls++;
      KEEL_LOG_W("store",
                 "the store did not run for %lld ms; %zu leases get their ttl from "
                 "now instead of expiring at once",
                 (long long)((now_ns - kv->serviced_ns) / 1000000), extended);
    }
  }
  /* A caller may pass a time older than the previous call's (the tests do); gaps are
   * measured from the latest. */
  if (!kv->serviced || now_ns > kv->serviced_ns) kv->serviced_ns = now_ns;
  kv->serviced = true;
}

bool keel__store_kv_expire(keel__store_kv *kv, int64_t now_ns) {
  grant_stall_grace(kv, now_ns);
  bool any = false;
  for (size_t i = 0; i < kv->lease_count; i++) {
    if (kv->leases[i].expiry_ns <= now_ns) {
      kv->leases[i].doomed = true;
      any = true;
    }
  }
  return any && sweep_doomed_leases(kv);
}

int64_t keel__store_kv_next_expiry(const keel__store_kv *kv) {
  int64_t next = KEEL_NO_DEADLINE;
  for (size_t i = 0; i < kv->lease_count; i++)
    if (kv->leases[i].expiry_ns < next) next = kv->leases[i].expiry_ns;
  return next;
}

bool keel__store_kv_changed_since(const keel__store_kv *kv, const char *prefix,
                                  size_t prefix_length, uint64_t after_revision) {
  if (after_revision >= kv->revision) return false;
  if (after_revision < kv->forgotten_revision) return true;
  for (size_t i = lower_bound(kv, prefix, prefix_length); i < kv->count; i++) {
    const kv_record *record = kv->records[i];
    if (!has_prefix(record->data, record->key_length, prefix, prefix_length)) break;
    if (record->revision > after_revision) return true;
  }
  for (size_t i = 0; i < kv->deletion_count; i++) {
    const kv_deletion *deletion = &kv->deletions[i];
    if (deletion->revision > after_revision &&
        has_prefix(deletion->key, deletion->key_length, prefix, prefix_length))
      return true;
  }
  return false;
}

uint64_t keel__store_kv_stalls(const keel__store_kv *kv) { return kv->stalls; }

/* Put and cas: every check before the first change, so a refusal changes nothing. */
static keel_status apply_put(keel__store_kv *kv, const keel__store_request *request,
                             bool *changed_p) {
  if (request->key_length == 0) return KEEL_EINVAL;
  if (request->lease != 0 && lease_find(kv, request->lease) == NULL) return KEEL_ENOTFOUND;
  size_t index;
  bool exists = find(kv, request->key, request->key_length, &index);
  if (request->op == KEEL__STORE_OP_CAS) {
    uint64_t current = exists ? kv->records[index]->revision : 0;
    if (current != request->revision) return KEEL_ECONFLICT;
  }
  size_t old_bytes = exists ? kv->records[index]->key_length + kv->records[index]->value_length : 0;
  size_t new_bytes = request->key_length + request->value_length;
  if (!exists && kv->count >= KEEL_STORE_MAX_KEYS) return KEEL_ENOSPC;
  if (kv->bytes - old_bytes + new_bytes > KEEL__STORE_MAX_BYTES) return KEEL_ENOSPC;
  if (!exists && kv->count == kv->capacity) {
    size_t capacity = kv->capacity == 0 ? 64 : kv->capacity * 2;
    if (capacity > KEEL_STORE_MAX_KEYS) capacity = KEEL_STORE_MAX_KEYS;
    kv_record **records = realloc(kv->records, capacity * sizeof *records);
    if (records == NULL) return KEEL_ENOMEM;
    kv->records = records;
    kv->capacity = capacity;
  }
  kv_record *record = malloc(sizeof *record + new_bytes);
  if (record == NULL) return KEEL_ENOMEM;
  record->revision = ++kv->revision;
  record->lease = request->lease;
  record->key_length = request->key_length;
  record->value_length = request->value_length;
  memcpy(record->data, request->key, request->key_length);
  if (request->value_length > 0)
    memcpy(record->data + request->key_length, request->value, request->value_length);
  if (exists) {
    free(kv->records[index]);
  } else {
    memmove(&kv->records[index + 1], &kv->records[index],
            (kv->count - index) * sizeof *kv->records);
    kv->count++;
  }
  kv->records[index] = record;
  kv->bytes = kv->bytes - old_bytes + new_bytes;
  *changed_p = true;
  return KEEL_OK;
}

static keel_status apply_lease(keel__store_kv *kv, const keel__store_request *request,
                               int64_t now_ns, int64_t *lease_p, uint64_t *revision_p,
                               bool *changed_p) {
  if (request->op == KEEL__STORE_OP_LEASE_GRANT) {
    if (request->duration_ns <= 0) return KEEL_EINVAL;
    if (kv->lease_count >= KEEL_STORE_MAX_KEYS) return KEEL_ENOSPC;
    if (kv->lease_count == kv->lease_capacity) {
      size_t capacity = kv->lease_capacity == 0 ? 16 : kv->lease_capacity * 2;
      kv_lease *leases = realloc(kv->leases, capacity * sizeof *leases);
      if (leases == NULL) return KEEL_ENOMEM;
      kv->leases = leases;
      kv->lease_capacity = capacity;
    }
    kv_lease *lease = &kv->leases[kv->lease_count++];
    *lease = (kv_lease){.id = kv->next_lease_id++,
                        .ttl_ns = request->duration_ns,
                        .expiry_ns = saturating_add(now_ns, request->duration_ns)};
    *lease_p = lease->id;
    return KEEL_OK;
  }
  kv_lease *lease = lease_find(kv, request->lease);
  if (lease == NULL) return KEEL_ENOTFOUND;
  if (request->op == KEEL__STORE_OP_LEASE_KEEPALIVE) {
    lease->expiry_ns = saturating_add(now_ns, lease->ttl_ns);
    return KEEL_OK;
  }
  if (request->op == KEEL__STORE_OP_LEASE_TTL) {
    /* Expired but not swept yet is gone all the same. */
    if (lease->doomed || lease->expiry_ns <= now_ns) return KEEL_ENOTFOUND;
    *lease_p = lease->expiry_ns - now_ns;
    *revision_p = (uint64_t)lease->ttl_ns;
    return KEEL_OK;
  }
  lease->doomed = true;
  if (sweep_doomed_leases(kv)) *changed_p = true;
  return KEEL_OK;
}

/* Records [first[r], end[r]) of each range r, in range order. */
typedef struct record_ranges {
  size_t first[KEEL_STORE_MAX_PREFIXES], end[KEEL_STORE_MAX_PREFIXES];
  size_t count;
} record_ranges;

/* Answers with the records of ranges as entries: a list (one range per prefix), or a get
 * when the one range is one record. */
static keel_status respond_records(const keel__store_kv *kv, const keel__store_request *request,
                                   const record_ranges *ranges, keel_buffer *response) {
  size_t mark = response->length, total = 0;
  for (size_t r = 0; r < ranges->count; r++) total += ranges->end[r] - ranges->first[r];
  keel_status status = keel__store_response_begin(response, request->op, request->id, KEEL_OK,
                                                  kv->revision, 0, (uint32_t)total);
  for (size_t r = 0; r < ranges->count; r++) {
    for (size_t i = ranges->first[r]; i < ranges->end[r] && status == KEEL_OK; i++) {
      const kv_record *record = kv->records[i];
      status = keel__store_response_add_entry(
          response, record->data, record->key_length, record->data + record->key_length,
          record->value_length, record->revision, record->lease);
    }
  }
  /* A half-written answer must not reach the wire: the caller answers with the error. */
  if (status != KEEL_OK) response->length = mark;
  return status;
}

static size_t prefix_end(const keel__store_kv *kv, size_t first, const char *prefix,
                         size_t prefix_length) {
  size_t end = first;
  while (end < kv->count &&
         has_prefix(kv->records[end]->data, kv->records[end]->key_length, prefix, prefix_length))
    end++;
  return end;
}

/* The range of records under prefix, appended to ranges. */
static void ranges_add_prefix(const keel__store_kv *kv, const char *prefix, size_t prefix_length,
                              record_ranges *ranges) {
  size_t first = lower_bound(kv, prefix, prefix_length);
  ranges->first[ranges->count] = first;
  ranges->end[ranges->count] = prefix_end(kv, first, prefix, prefix_length);
  ranges->count++;
}

keel_status keel__store_kv_apply(keel__store_kv *kv, const keel__store_request *request,
                                 int64_t now_ns, keel_buffer *response, bool *changed_p) {
  /* Leases are time-based: expiring first makes every answer agree with the clock, even
   * when the server's lease thread has not run yet. */
  bool changed = keel__store_kv_expire(kv, now_ns);
  keel_status result = KEEL_OK;
  int64_t lease = 0;
  uint64_t lease_ttl = 0;
  size_t first = 0;
  record_ranges ranges = {.count = 0};
  bool with_records = false;
  switch (request->op) {
    case KEEL__STORE_OP_PUT:
    case KEEL__STORE_OP_CAS:
      result = apply_put(kv, request, &changed);
      break;
    case KEEL__STORE_OP_GET:
      with_records = find(kv, request->key, request->key_length, &first);
      ranges = (record_ranges){.first = {first}, .end = {first + 1}, .count = 1};
      if (!with_records) result = KEEL_ENOTFOUND;
      break;
    case KEEL__STORE_OP_DELETE:
      if (!find(kv, request->key, request->key_length, &first)) {
        result = KEEL_ENOTFOUND;
        break;
      }
      record_remove(kv, first, ++kv->revision);
      changed = true;
      break;
    case KEEL__STORE_OP_LIST:
      ranges_add_prefix(kv, request->key, request->key_length, &ranges);
      with_records = true;
      break;
    case KEEL__STORE_OP_LIST_PREFIXES: {
      const char *prefixes[KEEL_STORE_MAX_PREFIXES];
      size_t count = 0;
      /* The decoder checked the value; a request built in process is checked here. */
      with_records =
          keel__store_prefixes_parse(request->value, request->value_length, prefixes, &count);
      for (size_t i = 0; i < count; i++)
        ranges_add_prefix(kv, prefixes[i], strlen(prefixes[i]), &ranges);
      if (!with_records) result = KEEL_EINVAL;
      break;
    }
    case KEEL__STORE_OP_WAIT:
      /* A poll: blocking is the server's business, outside the state machine. */
      if (!keel__store_kv_changed_since(kv, request->key, request->key_length, request->revision))
        result = KEEL_ETIMEDOUT;
      break;
    default:
      result = apply_lease(kv, request, now_ns, &lease, &lease_ttl, &changed);
      break;
  }
  *changed_p = changed;
  if (with_records) return respond_records(kv, request, &ranges, response);
  uint64_t revision = request->op == KEEL__STORE_OP_LEASE_TTL ? lease_ttl : kv->revision;
  return keel__store_response_begin(response, request->op, request->id, result, revision, lease, 0);
}
