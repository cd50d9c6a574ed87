/* The embedded backend of the store client: one authenticated link to the embedded
 * server, requests serialised by a mutex, each one bounded by a deadline so that a store
 * that stops answering turns into KEEL_ETIMEDOUT or KEEL_ECLOSED, never a hang. A failed
 * link is dropped and the next request opens a new one, so a handle outlives a stall. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_internal.h"

/* The default request timeout (keel_store_set_timeout changes it). Generous: the server
 * answers in microseconds unless the machine is badly overloaded. */
#define EMBEDDED_REQUEST_TIMEOUT_NS (10 * (int64_t)1000000000)
/* How long a reconnect tries (a refused connection is retried until then). */
#define RECONNECT_TIMEOUT_NS (250 * (int64_t)1000000)
/* A wait is sent in slices of at most this; the server may answer sooner (it clamps). */
#define EMBEDDED_WAIT_SLICE_NS (60 * (int64_t)1000000000)

typedef struct embedded_client {
  pthread_mutex_t lock; /* serialises requests: one link, one request in flight */
  keel_link *link;      /* NULL once dropped after a failure; the next request reconnects */
  char *address;        /* with auth, what a reconnect needs */
  keel_auth auth;
  keel_buffer request; /* reused for every encoded request */
  uint64_t next_id;
  bool reconnect_failing; /* a failed reconnect was logged; quiet until one succeeds */
  /* Atomic, not under lock: set and read by other threads while a request is in flight. */
  _Atomic int64_t timeout_ns;
  _Atomic uint64_t reconnects;
} embedded_client;

/* Opens the client's link, bounded by deadline_ns; the net layer logs why it could not. */
static keel_status link_open(embedded_client *client, int64_t deadline_ns) {
  keel_link *link;
  keel_status status = keel_link_connect(client->address, &client->auth, deadline_ns, &link);
  if (status != KEEL_OK) return status;
  keel_link_set_max_payload(link, KEEL__STORE_MAX_RESPONSE);
  client->link = link;
  return KEEL_OK;
}

/* Replaces a dropped link for the request about to be sent. A connect that fails for any
 * reason but a missed deadline or memory means the store cannot be reached: KEEL_ECLOSED,
 * as for a broken link. That includes a refused handshake: this handle's token was proven
 * by its first connect, so a refusal now is a server going away (it closes mid-handshake)
 * or another process on its port, not a wrong token. */
static keel_status link_reopen(embedded_client *client, int64_t deadline_ns) {
  keel_status status = link_open(client, deadline_ns);
  if (status == KEEL_OK) {
    uint64_t count = atomic_fetch_add(&client->reconnects, 1) + 1;
    KEEL_LOG_I("store", "reconnected to the store at %s (reconnect %llu of this handle)",
               client->address, (unsigned long long)count);
    client->reconnect_failing = false;
    return KEEL_OK;
  }
  if (!client->reconnect_failing) {
    KEEL_LOG_W("store", "cannot reconnect to the store at %s (%s); each request tries again",
               client->address, keel_strerror(status));
    client->reconnect_failing = true;
  }
  if (status != KEEL_ETIMEDOUT && status != KEEL_ENOMEM) status = KEEL_ECLOSED;
  return status;
}

/* Drops the link after a failure. A late answer to the abandoned request could otherwise
 * be taken for the next request's; a new link never carries it. */
static void link_drop(embedded_client *client) {
  keel_link_close(client->link);
  client->link = NULL;
}

static keel_status embedded_connect(const char *address, const keel_auth *auth, int64_t deadline_ns,
                                    void **backend_p) {
  embedded_client *client = calloc(1, sizeof *client);
  if (client == NULL) return KEEL_ENOMEM;
  keel_status status = KEEL_ENOMEM;
  client->address = strdup(address);
  if (client->address == NULL) goto fail_free_client;
  client->auth = *auth;
  atomic_init(&client->timeout_ns, EMBEDDED_REQUEST_TIMEOUT_NS);
  atomic_init(&client->reconnects, 0);
  if (pthread_mutex_init(&client->lock, NULL) != 0) goto fail_free_address;
  keel_buffer_init(&client->request, KEEL__STORE_REQUEST_BUFFER_MAX);
  status = link_open(client, deadline_ns);
  if (status != KEEL_OK) goto fail_destroy_lock;
  *backend_p = client;
  return KEEL_OK;

fail_destroy_lock:
  pthread_mutex_destroy(&client->lock);
fail_free_address:
  free(client->address);
fail_free_client:
  free(client);
  return status;
}

static void embedded_close(void *backend) {
  embedded_client *client = backend;
  keel_link_close(client->link);
  keel_buffer_free(&client->request);
  pthread_mutex_destroy(&client->lock);
  free(client->address);
  /* The job's token stays in memory no longer than the handle that needed it. */
  explicit_bzero(&client->auth, sizeof client->auth);
  free(client);
}

static keel_status embedded_set_timeout(void *backend, int64_t timeout_ns) {
  embedded_client *client = backend;
  atomic_store(&client->timeout_ns, timeout_ns);
  return KEEL_OK;
}

static uint64_t embedded_reconnects(const void *backend) {
  const embedded_client *client = backend;
  return atomic_load(&client->reconnects);
}

/* Sends request and receives its answer within wait_ns plus the handle's timeout,
 * reconnecting first (within the timeout) if an earlier failure dropped the link. KEEL_OK
 * means the server answered: *response_p holds its status and points into *payload_p,
 * which the caller frees. Any other status is the link's, and the link is then dropped.
 * A request is never sent twice: one that failed may or may not have been applied, and
 * only the caller knows whether it is safe to repeat. */
static keel_status round_trip(embedded_client *client, keel__store_request *request,
                              int64_t wait_ns, void **payload_p, keel__store_response *response_p) {
  pthread_mutex_lock(&client->lock);
  int64_t timeout_ns = atomic_load(&client->timeout_ns);
  /* A server that answered before and now refuses is gone, or restarting: a reconnect tries
   * briefly, so that a caller of a dead store learns it in a fraction of a second. */
  int64_t connect_ns = timeout_ns < RECONNECT_TIMEOUT_NS ? timeout_ns : RECONNECT_TIMEOUT_NS;
  int64_t connect_deadline_ns = keel_deadline_after_ns(connect_ns);
  int64_t deadline_ns = timeout_ns > KEEL_NO_DEADLINE - wait_ns
                            ? KEEL_NO_DEADLINE
                            : keel_deadline_after_ns(wait_ns + timeout_ns);
  void *payload = NULL;
  keel_status status = KEEL_OK;
  if (client->link == NULL) status = link_reopen(client, connect_deadline_ns);
  if (status != KEEL_OK) goto unlock;
  request->id = ++client->next_id;
  keel_buffer_reset(&client->request);
  status = keel__store_request_encode(request, &client->request);
  if (status != KEEL_OK) goto unlock;
  keel_frame frame = {.type = KEEL_FRAME_STORE_REQUEST, .tag = request->id};
  status = keel_link_send(client->link, &frame, client->request.data, client->request.length,
                          deadline_ns);
  if (status == KEEL_OK) status = keel_link_recv(client->link, &frame, &payload, deadline_ns);
  if (status != KEEL_OK) {
    /* The net layer logs a broken link itself, but not the two verdicts that are ours. */
    if (status == KEEL_ETIMEDOUT)
      KEEL_LOG_W("store",
                 "the store did not answer in time; dropping the link (the next "
                 "request reconnects)");
    else if (status == KEEL_ECLOSED)
      KEEL_LOG_W("store", "the store closed the link (the next request reconnects)");
    link_drop(client);
    /* A link that breaks (reset, end of stream, bad frame) is KEEL_ECLOSED to the caller;
     * only a missed deadline keeps its own name. */
    if (status != KEEL_ETIMEDOUT && status != KEEL_ENOMEM) status = KEEL_ECLOSED;
    goto unlock;
  }
  keel__store_response response;
  status = frame.type == KEEL_FRAME_STORE_RESPONSE
               ? keel__store_response_decode(payload, frame.length, &response)
               : KEEL_EPROTO;
  /* A new link per failure already keeps stale answers out; the id check stays as the
   * proof that this answer is this request's. */
  if (status == KEEL_OK && (response.id != request->id || response.op != request->op))
    status = KEEL_EPROTO;
  if (status != KEEL_OK) {
    KEEL_LOG_E("store", "bad answer from the store (%s); dropping the link", keel_strerror(status));
    link_drop(client);
    free(payload);
    payload = NULL;
    goto unlock;
  }
  *payload_p = payload;
  *response_p = response;
unlock:
  pthread_mutex_unlock(&client->lock);
  keel_wait_ended(KEEL_WAIT_STORE, deadline_ns);
  return status;
}

/* A request whose answer carries no entries: the server's status, and its revision and
 * lease when it succeeded. */
static keel_status simple_request(embedded_client *client, keel__store_request *request,
                                  uint64_t *revision_p, int64_t *lease_p) {
  void *payload;
  keel__store_response response;
  keel_status status = round_trip(client, request, 0, &payload, &response);
  if (status != KEEL_OK) return status;
  status = response.status;
  free(payload);
  if (status != KEEL_OK) return status;
  if (revision_p != NULL) *revision_p = response.revision;
  if (lease_p != NULL) *lease_p = response.lease;
  return KEEL_OK;
}

static keel_status embedded_put(void *backend, const char *key, const void *value, size_t length,
                                int64_t lease, bool conditional, uint64_t expected_revision,
                                uint64_t *revision_p) {
  keel__store_request request = {
      .op = conditional ? KEEL__STORE_OP_CAS : KEEL__STORE_OP_PUT,
      .revision = conditional ? expected_revision : 0,
      .lease = lease,
      .key = key,
      .key_length = strlen(key),
      .value = value,
      .value_length = length,
  };
  return simple_request(backend, &request, revision_p, NULL);
}

static keel_status embedded_remove(void *backend, const char *key) {
  keel__store_request request = {
      .op = KEEL__STORE_OP_DELETE, .key = key, .key_length = strlen(key)};
  return simple_request(backend, &request, NULL, NULL);
}

/* Get and list: the answer's entries, copied out. */
static keel_status entries_request(embedded_client *client, keel__store_request *request,
                                   keel_store_entry **entries_p, size_t *count_p,
                                   uint64_t *revision_p) {
  void *payload;
  keel__store_response response;
  keel_status status = round_trip(client, request, 0, &payload, &response);
  if (status != KEEL_OK) return status;
  status = response.status;
  if (status == KEEL_OK && request->op == KEEL__STORE_OP_GET && response.entry_count != 1) {
    KEEL_LOG_E("store", "the store answered a get with %u entries", response.entry_count);
    status = KEEL_EPROTO;
  }
  keel_store_entry *entries = NULL;
  if (status == KEEL_OK) status = keel__store_response_entries(&response, &entries);
  free(payload);
  if (status != KEEL_OK) return status;
  *entries_p = entries;
  *count_p = response.entry_count;
  if (revision_p != NULL) *revision_p = response.revision;
  return KEEL_OK;
}

static keel_status embedded_get(void *backend, const char *key, keel_store_entry **entry_p) {
  keel__store_request request = {.op = KEEL__STORE_OP_GET, .key = key, .key_length = strlen(key)};
  size_t count;
  return entries_request(backend, &request, entry_p, &count, NULL);
}

static keel_status embedded_list(void *backend, const char *prefix, keel_store_entry **entries_p,
                                 size_t *count_p, uint64_t *revision_p) {
  keel__store_request request = {
      .op = KEEL__STORE_OP_LIST, .key = prefix, .key_length = strlen(prefix)};
  return entries_request(backend, &request, entries_p, count_p, revision_p);
}

static keel_status embedded_list_prefixes(void *backend, const char *const *prefixes,
                                          size_t prefix_count, keel_store_entry **entries_p,
                                          size_t *count_p, uint64_t *revision_p) {
  /* Each prefix with its NUL: at most KEEL_STORE_MAX_PREFIXES * (KEEL_STORE_MAX_KEY + 1). */
  char value[KEEL_STORE_MAX_PREFIXES * (KEEL_STORE_MAX_KEY + 1)];
  size_t length = 0;
  for (size_t i = 0; i < prefix_count; i++) {
    size_t prefix_length = strlen(prefixes[i]) + 1;
    memcpy(value + length, prefixes[i], prefix_length);
    length += prefix_length;
  }
  keel__store_request request = {
      .op = KEEL__STORE_OP_LIST_PREFIXES, .value = (const uint8_t *)value, .value_length = length};
  return entries_request(backend, &request, entries_p, count_p, revision_p);
}

static keel_status embedded_wait(void *backend, const char *prefix, uint64_t after_revision,
                                 int64_t deadline_ns, uint64_t *revision_p) {
  keel__store_request request = {
      .op = KEEL__STORE_OP_WAIT,
      .key = prefix,
      .key_length = strlen(prefix),
      .revision = after_revision,
  };
  for (;;) {
    int64_t now_ns = keel_now_ns();
    int64_t remaining_ns = deadline_ns > now_ns ? deadline_ns - now_ns : 0;
    if (remaining_ns > EMBEDDED_WAIT_SLICE_NS) remaining_ns = EMBEDDED_WAIT_SLICE_NS;
    request.duration_ns = remaining_ns;
    void *payload;
    keel__store_response response;
    keel_status status = round_trip(backend, &request, remaining_ns, &payload, &response);
    if (status != KEEL_OK) return status;
    free(payload);
    /* The server clamps long waits: its timeout before ours means ask again. */
    if (response.status == KEEL_ETIMEDOUT && keel_now_ns() < deadline_ns) continue;
    if (response.status == KEEL_OK && revision_p != NULL) *revision_p = response.revision;
    return response.status;
  }
}

static keel_status embedded_lease_grant(void *backend, int64_t ttl_ns, int64_t *lease_p) {
  keel__store_request request = {.op = KEEL__STORE_OP_LEASE_GRANT, .duration_ns = ttl_ns};
  return simple_request(backend, &request, NULL, lease_p);
}

static keel_status embedded_lease_keepalive(void *backend, int64_t lease) {
  keel__store_request request = {.op = KEEL__STORE_OP_LEASE_KEEPALIVE, .lease = lease};
  return simple_request(backend, &request, NULL, NULL);
}

static keel_status embedded_lease_revoke(void *backend, int64_t lease) {
  keel__store_request request = {.op = KEEL__STORE_OP_LEASE_REVOKE, .lease = lease};
  return simple_request(backend, &request, NULL, NULL);
}

static keel_status embedded_lease_ttl(void *backend, int64_t lease, int64_t *left_ns_p,
                                      int64_t *ttl_ns_p) {
  keel__store_request request = {.op = KEEL__STORE_OP_LEASE_TTL, .lease = lease};
  uint64_t ttl_ns = 0;
  keel_status status = simple_request(backend, &request, &ttl_ns, left_ns_p);
  if (status == KEEL_OK) *ttl_ns_p = ttl_ns > INT64_MAX ? INT64_MAX : (int64_t)ttl_ns;
  return status;
}

const keel__store_ops keel__store_embedded_ops = {
    .scheme = "embedded://",
    .connect = embedded_connect,
    .close = embedded_close,
    .put = embedded_put,
    .get = embedded_get,
    .remove = embedded_remove,
    .list = embedded_list,
    .list_prefixes = embedded_list_prefixes,
    .wait = embedded_wait,
    .lease_grant = embedded_lease_grant,
    .lease_keepalive = embedded_lease_keepalive,
    .lease_ttl = embedded_lease_ttl,
    .lease_revoke = embedded_lease_revoke,
    .set_timeout = embedded_set_timeout,
    .reconnects = embedded_reconnects,
};
