/* The embedded backend of the store client: one authenticated link to the embedded
 * server, requests serialised by a mutex, each one bounded by a deadline so that a store
 * that stops answering turns into KEEL_ETIMEDOUT or KEEL_ECLOSED, never a hang. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_internal.h"

/* Generous: the server answers in microseconds unless the machine is badly overloaded. */
#define EMBEDDED_REQUEST_TIMEOUT_NS (10 * (int64_t)1000000000)
/* A wait is sent in slices of at most this; the server may answer sooner (it clamps). */
#define EMBEDDED_WAIT_SLICE_NS (60 * (int64_t)1000000000)

typedef struct embedded_client {
  pthread_mutex_t lock; /* serialises requests: one link, one request in flight */
  keel_link *link;
  keel_buffer request; /* reused for every encoded request */
  uint64_t next_id;
  bool broken; /* the link failed or fell out of step; every later call is KEEL_ECLOSED */
} embedded_client;

static keel_status embedded_connect(const char *address, const keel_auth *auth,
                                    int64_t deadline_ns, void **backend_p) {
  embedded_client *client = calloc(1, sizeof *client);
  if (client == NULL) return KEEL_ENOMEM;
  keel_status status = KEEL_ENOMEM;
  if (pthread_mutex_init(&client->lock, NULL) != 0) goto fail_free_client;
  keel_buffer_init(&client->request, KEEL__STORE_REQUEST_BUFFER_MAX);
  /* The net layer logs why a connection failed. */
  status = keel_link_connect(address, auth, deadline_ns, &client->link);
  if (status != KEEL_OK) goto fail_destroy_lock;
  keel_link_set_max_payload(client->link, KEEL__STORE_MAX_RESPONSE);
  *backend_p = client;
  return KEEL_OK;

fail_destroy_lock:
  pthread_mutex_destroy(&client->lock);
fail_free_client:
  free(client);
  return status;
}

static void embedded_close(void *backend) {
  embedded_client *client = backend;
  keel_link_close(client->link);
  keel_buffer_free(&client->request);
  pthread_mutex_destroy(&client->lock);
  free(client);
}

/* Sends request and receives its answer within timeout_ns. KEEL_OK means the server
 * answered: *response_p holds its status and points into *payload_p, which the caller
 * frees. Any other status is the link's, and the link is then given up: an answer that
 * arrives late would otherwise be taken for the next request's. */
static keel_status round_trip(embedded_client *client, keel__store_request *request,
                              int64_t timeout_ns, void **payload_p,
                              keel__store_response *response_p) {
  pthread_mutex_lock(&client->lock);
  keel_status status = KEEL_ECLOSED;
  void *payload = NULL;
  if (client->broken) goto unlock;
  request->id = ++client->next_id;
  keel_buffer_reset(&client->request);
  status = keel__store_request_encode(request, &client->request);
  if (status != KEEL_OK) goto unlock;
  int64_t deadline_ns = keel_deadline_after_ns(timeout_ns);
  keel_frame frame = {.type = KEEL_FRAME_STORE_REQUEST, .tag = request->id};
  status = keel_link_send(client->link, &frame, client->request.data, client->request.length,
                          deadline_ns);
  if (status == KEEL_OK) status = keel_link_recv(client->link, &frame, &payload, deadline_ns);
  if (status != KEEL_OK) {
    /* The net layer logs a broken link itself, but not the two verdicts that are ours. */
    if (status == KEEL_ETIMEDOUT)
      KEEL_LOG_W("store", "the store did not answer in time; giving up the link");
    else if (status == KEEL_ECLOSED)
      KEEL_LOG_W("store", "the store closed the link");
    client->broken = true;
    /* A link that breaks (reset, end of stream, bad frame) means the store is gone for
     * this handle; only a missed deadline keeps its own name. */
    if (status != KEEL_ETIMEDOUT && status != KEEL_ENOMEM) status = KEEL_ECLOSED;
    goto unlock;
  }
  keel__store_response response;
  status = frame.type == KEEL_FRAME_STORE_RESPONSE
               ? keel__store_response_decode(payload, frame.length, &response)
               : KEEL_EPROTO;
  if (status == KEEL_OK && (response.id != request->id || response.op != request->op))
    status = KEEL_EPROTO;
  if (status != KEEL_OK) {
    KEEL_LOG_E("store", "bad answer from the store (%s); giving up the link",
               keel_strerror(status));
    client->broken = true;
    free(payload);
    payload = NULL;
    goto unlock;
  }
  *payload_p = payload;
  *response_p = response;
unlock:
  pthread_mutex_unlock(&client->lock);
  return status;
}

/* A request whose answer carries no entries: the server's status, and its revision and
 * lease when it succeeded. */
static keel_status simple_request(embedded_client *client, keel__store_request *request,
                                  uint64_t *revision_p, int64_t *lease_p) {
  void *payload;
  keel__store_response response;
  keel_status status =
      round_trip(client, request, EMBEDDED_REQUEST_TIMEOUT_NS, &payload, &response);
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
  keel_status status =
      round_trip(client, request, EMBEDDED_REQUEST_TIMEOUT_NS, &payload, &response);
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
    keel_status status = round_trip(backend, &request, remaining_ns + EMBEDDED_REQUEST_TIMEOUT_NS,
                                    &payload, &response);
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

const keel__store_ops keel__store_embedded_ops = {
    .scheme = "embedded://",
    .connect = embedded_connect,
    .close = embedded_close,
    .put = embedded_put,
    .get = embedded_get,
    .remove = embedded_remove,
    .list = embedded_list,
    .wait = embedded_wait,
    .lease_grant = embedded_lease_grant,
    .lease_keepalive = embedded_lease_keepalive,
    .lease_revoke = embedded_lease_revoke,
};
