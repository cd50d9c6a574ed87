/* The store's public client API: checks arguments against the store's bounds once, for
 * every backend, then dispatches through the ops table of the backend the endpoint names
 * (the embedded server, or etcd's gateway over http or https). */
#include <stdlib.h>
#include <string.h>

#include "store/store_internal.h"

struct keel_store {
  const keel__store_ops *ops;
  void *backend;
};

static const keel__store_ops *const store_backends[] = {
    &keel__store_embedded_ops, &keel__store_etcd_ops, &keel__store_etcd_tls_ops};

/* A key must be a non-empty string of at most KEEL_STORE_MAX_KEY bytes; a prefix may be
 * empty. */
static keel_status check_key(const char *key, bool allow_empty) {
  if (key == NULL) return KEEL_EINVAL;
  size_t length = strnlen(key, KEEL_STORE_MAX_KEY + 1);
  if (length > KEEL_STORE_MAX_KEY) return KEEL_ERANGE;
  if (length == 0 && !allow_empty) return KEEL_EINVAL;
  return KEEL_OK;
}

static keel_status check_value(const void *value, size_t length, int64_t lease) {
  if (length > KEEL_STORE_MAX_VALUE) return KEEL_ERANGE;
  if ((value == NULL && length > 0) || lease < 0) return KEEL_EINVAL;
  return KEEL_OK;
}

keel_status keel_store_connect(const char *endpoint, const keel_auth *auth, int64_t deadline_ns,
                               keel_store **store_p) {
  if (endpoint == NULL || auth == NULL || store_p == NULL) return KEEL_EINVAL;
  const keel__store_ops *ops = NULL;
  const char *address = endpoint;
  for (size_t i = 0; i < sizeof store_backends / sizeof store_backends[0]; i++) {
    size_t scheme_length = strlen(store_backends[i]->scheme);
    if (strncmp(endpoint, store_backends[i]->scheme, scheme_length) == 0) {
      ops = store_backends[i];
      address += scheme_length;
    }
  }
  if (ops == NULL) {
    if (strstr(endpoint, "://") != NULL) {
      KEEL_LOG_E("store",
                 "endpoint %s: unsupported scheme (use host:port, embedded://, etcd:// or "
                 "https://)",
                 endpoint);
      return KEEL_ENOTSUP;
    }
    ops = &keel__store_embedded_ops;
  }
  keel_store *store = calloc(1, sizeof *store);
  if (store == NULL) return KEEL_ENOMEM;
  store->ops = ops;
  keel_status status = ops->connect(address, auth, deadline_ns, &store->backend);
  if (status != KEEL_OK) goto fail_free_store;
  *store_p = store;
  return KEEL_OK;

fail_free_store:
  free(store);
  return status;
}

keel_status keel_store_set_timeout(keel_store *store, int64_t timeout_ns) {
  if (store == NULL || timeout_ns <= 0) return KEEL_EINVAL;
  return store->ops->set_timeout(store->backend, timeout_ns);
}

uint64_t keel_store_reconnects(const keel_store *store) {
  return store == NULL ? 0 : store->ops->reconnects(store->backend);
}

void keel_store_close(keel_store *store) {
  if (store == NULL) return;
  store->ops->close(store->backend);
  free(store);
}

keel_status keel_store_put(keel_store *store, const char *key, const void *value, size_t length,
                           int64_t lease, uint64_t *revision_p) {
  keel_status status = check_key(key, false);
  if (status == KEEL_OK) status = check_value(value, length, lease);
  if (status != KEEL_OK) return status;
  return store->ops->put(store->backend, key, value, length, lease, false, 0, revision_p);
}

keel_status keel_store_cas(keel_store *store, const char *key, uint64_t expected_revision,
                           const void *value, size_t length, int64_t lease, uint64_t *revision_p) {
  keel_status status = check_key(key, false);
  if (status == KEEL_OK) status = check_value(value, length, lease);
  if (status != KEEL_OK) return status;
  return store->ops->put(store->backend, key, value, length, lease, true, expected_revision,
                         revision_p);
}

keel_status keel_store_get(keel_store *store, const char *key, keel_store_entry **entry_p) {
  keel_status status = check_key(key, false);
  if (status != KEEL_OK) return status;
  if (entry_p == NULL) return KEEL_EINVAL;
  return store->ops->get(store->backend, key, entry_p);
}

keel_status keel_store_delete(keel_store *store, const char *key) {
  keel_status status = check_key(key, false);
  if (status != KEEL_OK) return status;
  return store->ops->remove(store->backend, key);
}

keel_status keel_store_list(keel_store *store, const char *prefix, keel_store_entry **entries_p,
                            size_t *count_p, uint64_t *revision_p) {
  keel_status status = check_key(prefix, true);
  if (status != KEEL_OK) return status;
  if (entries_p == NULL || count_p == NULL) return KEEL_EINVAL;
  return store->ops->list(store->backend, prefix, entries_p, count_p, revision_p);
}

keel_status keel_store_list_prefixes(keel_store *store, const char *const *prefixes,
                                     size_t prefix_count, keel_store_entry **entries_p,
                                     size_t *count_p, uint64_t *revision_p) {
  if (prefixes == NULL || prefix_count == 0 || prefix_count > KEEL_STORE_MAX_PREFIXES ||
      entries_p == NULL || count_p == NULL)
    return KEEL_EINVAL;
  for (size_t i = 0; i < prefix_count; i++) {
    keel_status status = check_key(prefixes[i], false);
    if (status != KEEL_OK) return status;
    for (size_t j = 0; j < i; j++) {
      if (keel__store_prefixes_overlap(prefixes[i], prefixes[j])) return KEEL_EINVAL;
    }
  }
  return store->ops->list_prefixes(store->backend, prefixes, prefix_count, entries_p, count_p,
                                   revision_p);
}

keel_status keel_store_wait(keel_store *store, const char *prefix, uint64_t after_revision,
                            int64_t deadline_ns, uint64_t *revision_p) {
  keel_status status = check_key(prefix, true);
  if (status != KEEL_OK) return status;
  return store->ops->wait(store->backend, prefix, after_revision, deadline_ns, revision_p);
}

keel_status keel_store_lease_grant(keel_store *store, int64_t ttl_ns, int64_t *lease_p) {
  if (ttl_ns <= 0 || lease_p == NULL) return KEEL_EINVAL;
  return store->ops->lease_grant(store->backend, ttl_ns, lease_p);
}

keel_status keel_store_lease_keepalive(keel_store *store, int64_t lease) {
  if (lease <= 0) return KEEL_EINVAL;
  return store->ops->lease_keepalive(store->backend, lease);
}

keel_status keel_store_lease_ttl(keel_store *store, int64_t lease, int64_t *left_ns_p,
                                 int64_t *ttl_ns_p) {
  if (lease <= 0 || left_ns_p == NULL) return KEEL_EINVAL;
  int64_t ttl_ns = 0;
  keel_status status = store->ops->lease_ttl(store->backend, lease, left_ns_p, &ttl_ns);
  if (status == KEEL_OK && ttl_ns_p != NULL) *ttl_ns_p = ttl_ns;
  return status;
}

keel_status keel_store_lease_revoke(keel_store *store, int64_t lease) {
  if (lease <= 0) return KEEL_EINVAL;
  return store->ops->lease_revoke(store->backend, lease);
}

keel_status keel_store_quorum_read(keel_store *store, int64_t deadline_ns,
                                   keel_store_quorum *quorum) {
  if (quorum == NULL) return KEEL_EINVAL;
  if (store->ops->quorum_read == NULL) return KEEL_ENOTSUP;
  return store->ops->quorum_read(store->backend, deadline_ns, quorum);
}

uint64_t keel_store_quorum_term(const keel_store_quorum *quorum) {
  uint64_t term = 0;
  for (size_t i = 0; i < quorum->answered; i++)
    if (quorum->members[i].term > term) term = quorum->members[i].term;
  return term;
}

static bool is_majority(size_t count, size_t voters) { return voters > 0 && count > voters / 2; }

bool keel_store_quorum_moved_on(const keel_store_quorum *earlier, const keel_store_quorum *later) {
  if (earlier->voters != later->voters || !is_majority(earlier->answered, earlier->voters))
    return false;
  uint64_t earlier_term = keel_store_quorum_term(earlier);
  size_t moved = 0;
  for (size_t i = 0; i < later->answered; i++)
    moved += !later->members[i].has_leader && later->members[i].term > earlier_term;
  return is_majority(moved, later->voters);
}

void keel_store_entry_free(keel_store_entry *entry) {
  if (entry == NULL) return;
  free(entry->key);
  free(entry->value);
  free(entry);
}

void keel_store_entries_free(keel_store_entry *entries, size_t count) {
  if (entries == NULL) return;
  for (size_t i = 0; i < count; i++) {
    free(entries[i].key);
    free(entries[i].value);
  }
  free(entries);
}
