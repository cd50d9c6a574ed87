/* The etcd backend of the store client: keel's store calls as requests to etcd's v3 JSON
 * gateway over libcurl, one member at a time, failing over to the next member when one
 * cannot be reached. A job's keys live under "keel/<job id>/" so jobs can share a cluster. */
#include <curl/curl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_internal.h"

#define MODULE "store"
#define MS ((int64_t)1000000)
/* The default request timeout, as the embedded backend's; keel_store_set_timeout changes it. */
#define ETCD_REQUEST_TIMEOUT_NS (10000 * MS)
/* How long one member may take to accept a connection before the next one is tried. */
#define ETCD_CONNECT_TIMEOUT_NS (500 * MS)
/* A wait's stream is reopened at least this often, so an unbounded wait stays bounded. */
#define ETCD_WAIT_SLICE_NS (60000 * MS)
/* Pause before a read tries the next member once every member failed in a row. */
#define ETCD_ROUND_PAUSE_NS (50 * MS)
/* The least time one member is given to answer a read before the next is asked. */
#define ETCD_MIN_ATTEMPT_NS (200 * MS)
/* How many times a wait reads the past before it leaves it to a watch's catch-up. */
#define ETCD_WAIT_READS 4
/* How long a watch that starts in the past stays open for its catch-up. */
#define ETCD_WATCH_CATCH_UP_NS (250 * MS)
#define ETCD_MAX_MEMBERS 16
/* A reply holds at most the whole store, base64 and JSON around it. */
#define ETCD_MAX_REPLY (2 * KEEL__STORE_MAX_RESPONSE)

typedef struct etcd_client {
  pthread_mutex_t lock; /* serialises requests on the one curl handle */
  CURL *curl;
  CURLM *multi; /* drives a watch, so it can end on keel's clock rather than curl's */
  /* A renewal asked of members side by side (hedged_run): one handle and reply per member,
   * made at its first use, driven by a multi of their own. */
  CURLM *hedge_multi;
  CURL *hedges[ETCD_MAX_MEMBERS];
  keel_buffer hedge_replies[ETCD_MAX_MEMBERS];
  bool tls;
  char *members[ETCD_MAX_MEMBERS]; /* "host:port" */
  size_t member_count;
  size_t current; /* the member requests go to, until it fails */
  char namespace[KEEL__ETCD_MAX_NAMESPACE + 1];
  size_t namespace_length;
  keel_buffer reply;
  bool failing; /* the last request could not reach any member: the next success reconnects */
  _Atomic int64_t timeout_ns;
  _Atomic uint64_t reconnects;
} etcd_client;

/* What a request may do when a member does not answer. A write whose fate is unknown is
 * never sent again (store.h: a failed request may or may not have been applied); it moves
 * on only when nothing reached the member. Reads are safe to repeat anywhere; a hedged read
 * also leaves a slow member asked while it asks the next (hedged_run). */
typedef enum request_kind { REQUEST_READ, REQUEST_WRITE, REQUEST_HEDGED_READ } request_kind;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_global_status = CURLE_FAILED_INIT;

static void curl_global_setup(void) { curl_global_status = curl_global_init(CURL_GLOBAL_DEFAULT); }

static keel_status curl_status(CURLcode code) {
  switch (code) {
    case CURLE_OK:
      return KEEL_OK;
    case CURLE_OPERATION_TIMEDOUT:
      return KEEL_ETIMEDOUT;
    case CURLE_OUT_OF_MEMORY:
      return KEEL_ENOMEM;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
      return KEEL_EAUTH;
    default:
      return KEEL_ECLOSED;
  }
}

/* Sleeps until the sooner of pause_ns from now and deadline_ns. */
static void pause_before(int64_t pause_ns, int64_t deadline_ns) {
  int64_t until = keel_now_ns() + pause_ns;
  poll(NULL, 0, keel_poll_timeout_ms(until < deadline_ns ? until : deadline_ns));
}

/* Nothing of the request reached the member: safe to send it to another. */
static bool never_sent(CURLcode code) {
  return code == CURLE_COULDNT_CONNECT || code == CURLE_COULDNT_RESOLVE_HOST;
}

/* The reply body, bounded: past the bound the transfer is cut and the reply refused. */
static size_t reply_collect(char *data, size_t size, size_t count, void *user) {
  keel_buffer *reply = user;
  return keel_buffer_append(reply, data, size * count) == KEEL_OK ? size * count : 0;
}

/* Options every transfer of this handle has; TLS material comes from the environment. A
 * client talks to one member at a time, so each of its two connection caches (the handle's,
 * and the multi's that drives watches) keeps one connection: a fail-over closes the one to
 * the member left behind instead of keeping it beside the new one, and a process's fds stay
 * flat over any number of fail-overs. */
static keel_status handle_configure(const etcd_client *client, CURL *curl) {
  bool ok =
      curl_easy_setopt(curl, CURLOPT_MAXCONNECTS, 1L) == CURLE_OK &&
      curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L) == CURLE_OK &&
      curl_easy_setopt(curl, CURLOPT_POST, 1L) == CURLE_OK &&
      curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L) == CURLE_OK &&
      curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, client->tls ? "https" : "http") == CURLE_OK;
  if (ok && client->tls) {
    const char *ca = getenv("KEEL_RDZV_CA"), *cert = getenv("KEEL_RDZV_CERT"),
               *key = getenv("KEEL_RDZV_KEY");
    if (ca != NULL && ca[0] != '\0') ok = curl_easy_setopt(curl, CURLOPT_CAINFO, ca) == CURLE_OK;
    if (ok && cert != NULL && cert[0] != '\0')
      ok = curl_easy_setopt(curl, CURLOPT_SSLCERT, cert) == CURLE_OK;
    if (ok && key != NULL && key[0] != '\0')
      ok = curl_easy_setopt(curl, CURLOPT_SSLKEY, key) == CURLE_OK;
  }
  return ok ? KEEL_OK : KEEL_ENOTSUP;
}

static keel_status curl_configure(etcd_client *client) {
  if (curl_multi_setopt(client->multi, CURLMOPT_MAXCONNECTS, 1L) != CURLM_OK) return KEEL_ENOTSUP;
  return handle_configure(client, client->curl);
}

/* Sets up one POST of body to path on member through curl, to end by deadline_ns; the reply
 * goes to reply unless on_data takes it. */
static void transfer_prepare(const etcd_client *client, CURL *curl, keel_buffer *reply,
                             size_t member, const char *path, const char *body, int64_t deadline_ns,
                             curl_write_callback on_data, void *data_user) {
  char url[512];
  snprintf(url, sizeof url, "%s://%s%s", client->tls ? "https" : "http", client->members[member],
           path);
  int64_t remaining_ns = deadline_ns - keel_now_ns();
  if (remaining_ns < MS) remaining_ns = MS;
  int64_t connect_ns =
      remaining_ns < ETCD_CONNECT_TIMEOUT_NS ? remaining_ns : ETCD_CONNECT_TIMEOUT_NS;
  keel_buffer_reset(reply);
  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)(remaining_ns / MS));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)(connect_ns / MS));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data != NULL ? on_data : reply_collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, on_data != NULL ? data_user : (void *)reply);
}

/* transfer_prepare on the client's own handle and reply. */
static void member_prepare(etcd_client *client, size_t member, const char *path, const char *body,
                           int64_t deadline_ns, curl_write_callback on_data, void *data_user) {
  transfer_prepare(client, client->curl, &client->reply, member, path, body, deadline_ns, on_data,
                   data_user);
}

/* One POST of body (a GET when body is NULL), its reply in client->reply and its HTTP code
 * in *http_p. */
static CURLcode member_post(etcd_client *client, size_t member, const char *path, const char *body,
                            int64_t deadline_ns, long *http_p) {
  member_prepare(client, member, path, body, deadline_ns, NULL, NULL);
  /* The next member_prepare's body makes the handle POST again. */
  if (body == NULL) curl_easy_setopt(client->curl, CURLOPT_HTTPGET, 1L);
  CURLcode code = curl_easy_perform(client->curl);
  *http_p = 0;
  curl_easy_getinfo(client->curl, CURLINFO_RESPONSE_CODE, http_p);
  return code;
}

/* Counts the return to a working member after a failure, as the embedded backend counts a
 * re-established link. */
static void request_succeeded(etcd_client *client) {
  if (!client->failing) return;
  client->failing = false;
  uint64_t count = atomic_fetch_add(&client->reconnects, 1) + 1;
  KEEL_LOG_I(MODULE, "etcd: reached member %s again (reconnect %llu of this handle)",
             client->members[client->current], (unsigned long long)count);
}

static void member_failed(etcd_client *client, const char *why) {
  if (!client->failing)
    KEEL_LOG_W(MODULE, "etcd member %s: %s; trying the next member",
               client->members[client->current], why);
  client->failing = true;
  client->current = (client->current + 1) % client->member_count;
}

/* A read gives each member its share of the time to deadline_ns, so that a stopped member
 * (which still accepts connections: the kernel does) leaves time to ask the others. */
static int64_t member_share_ns(const etcd_client *client, int64_t deadline_ns) {
  int64_t share_ns = (deadline_ns - keel_now_ns()) / (int64_t)client->member_count;
  return share_ns < ETCD_MIN_ATTEMPT_NS ? ETCD_MIN_ATTEMPT_NS : share_ns;
}

/* Sends body to path and leaves a gateway reply (HTTP 200, or an error reply the codec
 * reads) in client->reply. Moves on to the next member when one cannot be reached (or,
 * for a read, does not answer in time or has no leader), until deadline_ns. */
static keel_status request_run(etcd_client *client, const char *path, const char *body,
                               request_kind kind, int64_t deadline_ns) {
  size_t failures_in_a_row = 0;
  int64_t share_ns = member_share_ns(client, deadline_ns);
  for (;;) {
    long http = 0;
    int64_t attempt_ns = deadline_ns;
    if (kind == REQUEST_READ && keel_now_ns() + share_ns < deadline_ns)
      attempt_ns = keel_now_ns() + share_ns;
    CURLcode code = member_post(client, client->current, path, body, attempt_ns, &http);
    bool expired = keel_now_ns() >= deadline_ns;
    if (code == CURLE_OK && http == 503 && kind == REQUEST_READ && !expired) {
      /* The member has no leader (an election, a partition): another may. */
      member_failed(client, "no leader (HTTP 503)");
    } else if (code == CURLE_OK) {
      request_succeeded(client);
      return KEEL_OK;
    } else {
      bool again = never_sent(code) || (kind == REQUEST_READ && code == CURLE_OPERATION_TIMEDOUT);
      member_failed(client, curl_easy_strerror(code));
      if (!again || expired) return curl_status(code);
    }
    /* Each member failed once: let an election or a restart progress before the next round. */
    if (++failures_in_a_row % client->member_count == 0)
      pause_before(ETCD_ROUND_PAUSE_NS, deadline_ns);
    if (keel_now_ns() >= deadline_ns) return KEEL_ETIMEDOUT;
  }
}

/* ---- a read asked of members side by side */

/* The member's hedge handle, made and configured at its first use; NULL without memory. */
static CURL *hedge_handle(etcd_client *client, size_t member) {
  if (client->hedge_multi == NULL) {
    client->hedge_multi = curl_multi_init();
    /* One idle connection kept, to the member that answered last, as the client's own
     * handle keeps one: a process's fds stay flat over any number of hedged reads. */
    if (client->hedge_multi == NULL ||
        curl_multi_setopt(client->hedge_multi, CURLMOPT_MAXCONNECTS, 1L) != CURLM_OK)
      return NULL;
  }
  if (client->hedges[member] != NULL) return client->hedges[member];
  CURL *curl = curl_easy_init();
  if (curl == NULL) return NULL;
  if (handle_configure(client, curl) != KEEL_OK) {
    curl_easy_cleanup(curl);
    return NULL;
  }
  keel_buffer_init(&client->hedge_replies[member], ETCD_MAX_REPLY);
  client->hedges[member] = curl;
  return curl;
}

static bool hedge_start(etcd_client *client, size_t member, const char *path, const char *body,
                        int64_t deadline_ns) {
  CURL *curl = hedge_handle(client, member);
  if (curl == NULL) return false;
  transfer_prepare(client, curl, &client->hedge_replies[member], member, path, body, deadline_ns,
                   NULL, NULL);
  return curl_multi_add_handle(client->hedge_multi, curl) == CURLM_OK;
}

static size_t hedge_member(const etcd_client *client, const CURL *curl) {
  for (size_t member = 0; member < client->member_count; member++)
    if (client->hedges[member] == curl) return member;
  return client->member_count;
}

/* A hedged read in flight: which members are asked, and how it has gone. */
typedef struct hedge_round {
  bool asked[ETCD_MAX_MEMBERS];
  size_t in_flight;
  size_t asked_count; /* members asked since the round began */
  size_t winner;      /* the member that answered; member_count until one has */
  CURLcode last_failure;
} hedge_round;

/* Takes the transfers that ended: the first answer wins; a member that failed (no
 * connection, no leader) counts as failed at once, so the next one is asked without
 * waiting out its share. Returns whether one did fail. */
static bool hedge_collect(etcd_client *client, hedge_round *round) {
  bool failed = false;
  int left = 0;
  CURLMsg *message;
  while (round->winner == client->member_count &&
         (message = curl_multi_info_read(client->hedge_multi, &left)) != NULL) {
    if (message->msg != CURLMSG_DONE) continue;
    CURL *curl = message->easy_handle;
    CURLcode code = message->data.result;
    size_t member = hedge_member(client, curl);
    long http = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
    curl_multi_remove_handle(client->hedge_multi, curl);
    if (member == client->member_count) continue;
    round->asked[member] = false;
    round->in_flight--;
    if (code == CURLE_OK && http != 503) {
      round->winner = member;
      break;
    }
    if (code != CURLE_OK) round->last_failure = code;
    if (!client->failing)
      KEEL_LOG_W(MODULE, "etcd member %s: %s; asking the next member as well",
                 client->members[member],
                 code == CURLE_OK ? "no leader (HTTP 503)" : curl_easy_strerror(code));
    client->failing = true;
    failed = true;
  }
  return failed;
}

/* Finding 65: a keepalive gave each member a third of its 500 ms in turn and dropped one
 * that had not answered by then; members that forward renewals to a busy leader may all
 * answer later than that, and a node then failed to renew a lease that every member would
 * have renewed, and fenced itself. Here the member the client uses is asked first; one that
 * has not answered within its share stays asked while the next is asked too, and the first
 * answer wins. A stopped member still costs only its share. */
static keel_status hedged_run(etcd_client *client, const char *path, const char *body,
                              int64_t deadline_ns) {
  size_t count = client->member_count;
  int64_t share_ns = member_share_ns(client, deadline_ns);
  hedge_round round = {.winner = count, .last_failure = CURLE_OPERATION_TIMEDOUT};
  int64_t next_ask_ns = keel_now_ns();
  while (round.winner == count && keel_now_ns() < deadline_ns) {
    if (round.asked_count == count && round.in_flight == 0) {
      /* Each member failed once: let an election or a restart progress first. */
      pause_before(ETCD_ROUND_PAUSE_NS, deadline_ns);
      round.asked_count = 0;
      next_ask_ns = keel_now_ns();
      continue;
    }
    if (round.asked_count < count && keel_now_ns() >= next_ask_ns) {
      size_t member = (client->current + round.asked_count++) % count;
      next_ask_ns = keel_now_ns() + share_ns;
      if (hedge_start(client, member, path, body, deadline_ns)) {
        round.asked[member] = true;
        round.in_flight++;
      }
      continue;
    }
    int running = 0;
    curl_multi_perform(client->hedge_multi, &running);
    if (hedge_collect(client, &round)) next_ask_ns = keel_now_ns();
    if (round.winner != count) break;
    int64_t wake =
        round.asked_count < count && next_ask_ns < deadline_ns ? next_ask_ns : deadline_ns;
    curl_multi_poll(client->hedge_multi, NULL, 0, keel_poll_timeout_ms(wake), NULL);
  }
  /* The members still asked are left: their transfers end, their connections close. */
  for (size_t member = 0; member < count; member++)
    if (round.asked[member]) curl_multi_remove_handle(client->hedge_multi, client->hedges[member]);
  if (round.winner == count) {
    client->failing = true;
    client->current = (client->current + 1) % count;
    return curl_status(round.last_failure);
  }
  /* The answer becomes the client's reply, where the codec reads it. */
  keel_buffer answer = client->hedge_replies[round.winner];
  client->hedge_replies[round.winner] = client->reply;
  client->reply = answer;
  client->current = round.winner;
  request_succeeded(client);
  return KEEL_OK;
}

static keel_status etcd_request(etcd_client *client, const char *path, const char *body,
                                request_kind kind, int64_t deadline_ns) {
  keel_status status = kind == REQUEST_HEDGED_READ
                           ? hedged_run(client, path, body, deadline_ns)
                           : request_run(client, path, body, kind, deadline_ns);
  keel_wait_ended(KEEL_WAIT_STORE, deadline_ns);
  return status;
}

static int64_t request_deadline(etcd_client *client) {
  return keel_deadline_after_ns(atomic_load(&client->timeout_ns));
}

/* Reads the reply with reader-specific code; logs refusals that are not answers of the
 * store's contract, with what the member said. */
static keel_status reply_logged(etcd_client *client, keel_status status, const char *message,
                                const char *what) {
  if (status == KEEL_ECORRUPT)
    KEEL_LOG_E(MODULE, "etcd member %s: the reply to %s is not etcd's v3 gateway JSON",
               client->members[client->current], what);
  else if (status == KEEL_EIO || status == KEEL_EAUTH || status == KEEL_EINVAL)
    KEEL_LOG_E(MODULE, "etcd member %s refused %s: %s (%s)", client->members[client->current], what,
               message[0] != '\0' ? message : "no message", keel_strerror(status));
  return status;
}

/* The namespaced key (namespace + key) into full; KEEL_ERANGE when it does not fit. */
static keel_status full_key(const etcd_client *client, const char *key, char *full) {
  size_t length = strlen(key);
  if (length > KEEL_STORE_MAX_KEY) return KEEL_ERANGE;
  memcpy(full, client->namespace, client->namespace_length);
  memcpy(full + client->namespace_length, key, length + 1);
  return KEEL_OK;
}

/* Strips the namespace from the keys of entries read back; a key outside it is not ours. */
static keel_status entries_unscope(const etcd_client *client, keel_store_entry *entries,
                                   size_t count) {
  for (size_t i = 0; i < count; i++) {
    char *key = entries[i].key;
    size_t length = strlen(key);
    if (length <= client->namespace_length ||
        memcmp(key, client->namespace, client->namespace_length) != 0)
      return KEEL_ECORRUPT;
    memmove(key, key + client->namespace_length, length - client->namespace_length + 1);
  }
  return KEEL_OK;
}

/* ---- operations: each takes the lock, builds a body, sends it, reads the reply. */

typedef keel_status (*reply_reader)(etcd_client *client, void *out, char *message, size_t capacity);

static keel_status etcd_call(etcd_client *client, const char *path, char *body, request_kind kind,
                             reply_reader read, void *out, const char *what) {
  if (body == NULL) return KEEL_ENOMEM;
  pthread_mutex_lock(&client->lock);
  keel_status status = etcd_request(client, path, body, kind, request_deadline(client));
  char message[256] = "";
  if (status == KEEL_OK) status = read(client, out, message, sizeof message);
  if (status != KEEL_OK) reply_logged(client, status, message, what);
  pthread_mutex_unlock(&client->lock);
  free(body);
  return status;
}

typedef struct entries_out {
  size_t range_count; /* 0: one range */
  keel_store_entry *entries;
  size_t count;
  uint64_t revision;
} entries_out;

static keel_status read_entries(etcd_client *client, void *out, char *message, size_t capacity) {
  entries_out *result = out;
  const char *body = (const char *)client->reply.data;
  size_t length = client->reply.length;
  keel_status status =
      result->range_count == 0
          ? keel__etcd_range_reply(body, length, &result->entries, &result->count,
                                   &result->revision, message, capacity)
          : keel__etcd_ranges_reply(body, length, result->range_count, &result->entries,
                                    &result->count, &result->revision, message, capacity);
  if (status != KEEL_OK) return status;
  status = entries_unscope(client, result->entries, result->count);
  if (status != KEEL_OK) keel_store_entries_free(result->entries, result->count);
  return status;
}

typedef struct write_out {
  bool conditional;
  int64_t deleted;
  uint64_t revision;
} write_out;

static keel_status read_write(etcd_client *client, void *out, char *message, size_t capacity) {
  write_out *result = out;
  const char *body = (const char *)client->reply.data;
  size_t length = client->reply.length;
  if (!result->conditional)
    return keel__etcd_write_reply(body, length, &result->deleted, &result->revision, message,
                                  capacity);
  bool succeeded = false;
  keel_status status =
      keel__etcd_txn_reply(body, length, &succeeded, &result->revision, message, capacity);
  if (status == KEEL_OK && !succeeded) status = KEEL_ECONFLICT;
  return status;
}

static keel_status etcd_put(void *backend, const char *key, const void *value, size_t length,
                            int64_t lease, bool conditional, uint64_t expected_revision,
                            uint64_t *revision_p) {
  etcd_client *client = backend;
  char full[KEEL__ETCD_MAX_KEY + 1];
  keel_status status = full_key(client, key, full);
  if (status != KEEL_OK) return status;
  char *body = conditional ? keel__etcd_cas_request(full, expected_revision, value, length, lease)
                           : keel__etcd_put_request(full, value, length, lease);
  write_out result = {.conditional = conditional};
  status = etcd_call(client, conditional ? "/v3/kv/txn" : "/v3/kv/put", body, REQUEST_WRITE,
                     read_write, &result, conditional ? "a compare-and-swap" : "a put");
  if (status == KEEL_OK && revision_p != NULL) *revision_p = result.revision;
  return status;
}

static keel_status etcd_remove(void *backend, const char *key) {
  etcd_client *client = backend;
  char full[KEEL__ETCD_MAX_KEY + 1];
  keel_status status = full_key(client, key, full);
  if (status != KEEL_OK) return status;
  write_out result = {0};
  status = etcd_call(client, "/v3/kv/deleterange", keel__etcd_delete_request(full, false),
                     REQUEST_WRITE, read_write, &result, "a delete");
  if (status == KEEL_OK && result.deleted == 0) status = KEEL_ENOTFOUND;
  return status;
}

static keel_status etcd_range(etcd_client *client, const char *key, bool prefix,
                              entries_out *result) {
  char full[KEEL__ETCD_MAX_KEY + 1];
  keel_status status = full_key(client, key, full);
  if (status != KEEL_OK) return status;
  return etcd_call(client, "/v3/kv/range", keel__etcd_range_request(full, prefix), REQUEST_READ,
                   read_entries, result, prefix ? "a list" : "a get");
}

static keel_status etcd_get(void *backend, const char *key, keel_store_entry **entry_p) {
  entries_out result = {0};
  keel_status status = etcd_range(backend, key, false, &result);
  if (status != KEEL_OK) return status;
  if (result.count != 1) {
    keel_store_entries_free(result.entries, result.count);
    return result.count == 0 ? KEEL_ENOTFOUND : KEEL_ECORRUPT;
  }
  /* The array's one element becomes the entry the caller frees alone. */
  *entry_p = result.entries;
  return KEEL_OK;
}

/* A list's result to the caller, on success. */
static keel_status entries_hand_out(keel_status status, const entries_out *result,
                                    keel_store_entry **entries_p, size_t *count_p,
                                    uint64_t *revision_p) {
  if (status != KEEL_OK) return status;
  *entries_p = result->entries;
  *count_p = result->count;
  if (revision_p != NULL) *revision_p = result->revision;
  return KEEL_OK;
}

static keel_status etcd_list(void *backend, const char *prefix, keel_store_entry **entries_p,
                             size_t *count_p, uint64_t *revision_p) {
  entries_out result = {0};
  keel_status status = etcd_range(backend, prefix, true, &result);
  return entries_hand_out(status, &result, entries_p, count_p, revision_p);
}

static keel_status etcd_list_prefixes(void *backend, const char *const *prefixes,
                                      size_t prefix_count, keel_store_entry **entries_p,
                                      size_t *count_p, uint64_t *revision_p) {
  etcd_client *client = backend;
  char full[KEEL_STORE_MAX_PREFIXES][KEEL__ETCD_MAX_KEY + 1];
  const char *scoped[KEEL_STORE_MAX_PREFIXES];
  for (size_t i = 0; i < prefix_count; i++) {
    keel_status status = full_key(client, prefixes[i], full[i]);
    if (status != KEEL_OK) return status;
    scoped[i] = full[i];
  }
  entries_out result = {.range_count = prefix_count};
  keel_status status =
      etcd_call(client, "/v3/kv/txn", keel__etcd_ranges_request(scoped, prefix_count), REQUEST_READ,
                read_entries, &result, "a list of prefixes");
  return entries_hand_out(status, &result, entries_p, count_p, revision_p);
}

/* ---- wait: a watch stream from after_revision + 1, cut at its first event. */

typedef struct watch_state {
  keel_buffer pending; /* bytes of a message not yet ended by its newline */
  keel_status status;  /* KEEL_OK once an event (or a compaction) answered the wait */
  bool answered;
  bool created;     /* the member confirmed the watch */
  bool catching_up; /* it started in the past: changes already made may still come */
  bool recheck;     /* a caught-up read can answer for the past: end a watch that is behind */
  uint64_t start_revision;
  uint64_t revision;
  char message[256];
} watch_state;

/* Reads the complete messages in pending; true once the wait is answered or refused. */
static bool watch_messages(watch_state *watch) {
  for (;;) {
    uint8_t *end = memchr(watch->pending.data, '\n', watch->pending.length);
    if (end == NULL) return false;
    size_t length = (size_t)(end - watch->pending.data);
    keel__etcd_watch_message message;
    keel_status status = keel__etcd_watch_reply((const char *)watch->pending.data, length, &message,
                                                watch->message, sizeof watch->message);
    size_t rest = watch->pending.length - length - 1;
    memmove(watch->pending.data, end + 1, rest);
    watch->pending.length = rest;
    watch->revision = status == KEEL_OK ? message.revision : watch->revision;
    if (status == KEEL_OK && message.created) {
      watch->created = true;
      watch->catching_up = message.revision >= watch->start_revision;
    }
    /* A compacted start may have missed a change: a wake the caller confirms. */
    if (status != KEEL_OK || message.events > 0 || message.canceled) {
      watch->status = status;
      watch->answered = true;
      return true;
    }
  }
}

static size_t watch_collect(char *data, size_t size, size_t count, void *user) {
  watch_state *watch = user;
  if (keel_buffer_append(&watch->pending, data, size * count) != KEEL_OK) {
    watch->status = KEEL_ERANGE;
    watch->answered = true;
    return 0;
  }
  /* Returning short ends the transfer: the stream has said what the wait needed. */
  return watch_messages(watch) ? 0 : size * count;
}

/* Runs the watch transfer until it answers, or the slice ends with the watch confirmed (and
 * caught up), or the member fails to confirm it within the request timeout. Returns the
 * transfer's code: CURLE_OK also when it was cut on purpose. */
static CURLcode watch_run(etcd_client *client, watch_state *watch, int64_t slice_deadline_ns,
                          int64_t hard_deadline_ns) {
  CURLM *multi = client->multi;
  if (curl_multi_add_handle(multi, client->curl) != CURLM_OK) return CURLE_OUT_OF_MEMORY;
  CURLcode code = CURLE_OK;
  int64_t created_ns = 0;
  for (;;) {
    int running = 0;
    if (curl_multi_perform(multi, &running) != CURLM_OK) {
      code = CURLE_RECV_ERROR;
      break;
    }
    if (watch->answered) break;
    if (running == 0) {
      int left = 0;
      CURLMsg *message = curl_multi_info_read(multi, &left);
      code = message != NULL && message->msg == CURLMSG_DONE ? message->data.result : CURLE_OK;
      break;
    }
    int64_t now = keel_now_ns();
    if (watch->created && created_ns == 0) created_ns = now;
    /* A watch that starts in the past gets its earlier changes from the member's catch-up
     * pass (etcd runs one every 100 ms), even when the caller's deadline has gone. */
    int64_t quiet_until = slice_deadline_ns;
    if (watch->catching_up && created_ns + ETCD_WATCH_CATCH_UP_NS > quiet_until)
      quiet_until = created_ns + ETCD_WATCH_CATCH_UP_NS;
    if (watch->created && (now >= quiet_until || (watch->catching_up && watch->recheck))) break;
    if (now >= hard_deadline_ns) {
      code = CURLE_OPERATION_TIMEDOUT;
      break;
    }
    int64_t wake = watch->created ? quiet_until : hard_deadline_ns;
    curl_multi_poll(multi, NULL, 0, keel_poll_timeout_ms(wake), NULL);
  }
  curl_multi_remove_handle(multi, client->curl);
  return code;
}

/* One watch stream on the current member until slice_deadline_ns. With recheck, a watch
 * that turns out to start in the past ends at once with *behind_p (KEEL_EAGAIN). */
static keel_status watch_slice(etcd_client *client, const char *body, uint64_t start_revision,
                               int64_t slice_deadline_ns, bool recheck, uint64_t *revision_p,
                               bool *behind_p) {
  watch_state watch = {
      .status = KEEL_ETIMEDOUT, .start_revision = start_revision, .recheck = recheck};
  keel_buffer_init(&watch.pending, ETCD_MAX_REPLY);
  /* The member must confirm the watch within the request timeout, past the slice if need be. */
  int64_t hard_deadline_ns = keel_deadline_after_ns(atomic_load(&client->timeout_ns));
  if (hard_deadline_ns < slice_deadline_ns) hard_deadline_ns = slice_deadline_ns;
  member_prepare(client, client->current, "/v3/watch", body, hard_deadline_ns, watch_collect,
                 &watch);
  CURLcode code = watch_run(client, &watch, slice_deadline_ns, hard_deadline_ns);
  keel_wait_ended(KEEL_WAIT_STORE, hard_deadline_ns);
  keel_status status;
  if (watch.answered) {
    status = watch.status;
    if (status != KEEL_OK) reply_logged(client, status, watch.message, "a watch");
  } else if (code == CURLE_OK && watch.created && watch.catching_up && recheck) {
    *behind_p = true;
    status = KEEL_EAGAIN;
  } else if (code == CURLE_OK && watch.created) {
    /* Confirmed, and quiet until the slice ended (or the member ended the stream early). */
    status = keel_now_ns() < slice_deadline_ns ? KEEL_EAGAIN : KEEL_ETIMEDOUT;
  } else if (code == CURLE_OK) {
    status = reply_logged(client, KEEL_ECORRUPT, "", "a watch");
  } else {
    member_failed(client, curl_easy_strerror(code));
    status = curl_status(code);
  }
  if (status == KEEL_OK) {
    request_succeeded(client);
    *revision_p = watch.revision;
  }
  keel_buffer_free(&watch.pending);
  return status;
}

typedef struct count_out {
  int64_t count;
  size_t listed;
  uint64_t revision;
} count_out;

static keel_status read_count(etcd_client *client, void *out, char *message, size_t capacity) {
  count_out *result = out;
  return keel__etcd_range_count_reply((const char *)client->reply.data, client->reply.length,
                                      &result->count, &result->listed, &result->revision, message,
                                      capacity);
}

/* Whether a key under full (a scoped prefix) changed after after_revision, read without a
 * watch: etcd serves a watch that starts in the past from its catch-up pass, which runs
 * every 100 ms (3.4's syncWatchersLoop), but one that starts after its current revision at
 * once. Keys changed since show as listed; a deletion since, as fewer keys now than then
 * (every key now is unchanged, so it was there then). *now_p: the revision read. Any
 * failure (a compacted past revision among them) leaves the wait to the watch alone. */
static keel_status changed_since(etcd_client *client, const char *full, uint64_t after_revision,
                                 bool *changed_p, uint64_t *now_p) {
  count_out now = {0};
  keel_status status =
      etcd_call(client, "/v3/kv/range", keel__etcd_changed_since_request(full, after_revision),
                REQUEST_READ, read_count, &now, "a wait's check");
  if (status != KEEL_OK) return status;
  *now_p = now.revision;
  *changed_p = now.listed > 0;
  if (*changed_p || after_revision == 0 || now.revision <= after_revision) return KEEL_OK;
  count_out then = {0};
  status = etcd_call(client, "/v3/kv/range", keel__etcd_count_at_request(full, after_revision),
                     REQUEST_READ, read_count, &then, "a wait's check");
  if (status != KEEL_OK) return status;
  *changed_p = then.count != now.count;
  return KEEL_OK;
}

/* Watches from start_revision until a change, the deadline, or (with recheck) the finding
 * that the watch starts in the past (*behind_p); moves to another member when one fails. */
static keel_status watch_until(etcd_client *client, const char *full, uint64_t start_revision,
                               int64_t deadline_ns, bool recheck, uint64_t *revision_p,
                               bool *behind_p) {
  char *body = keel__etcd_watch_request(full, start_revision);
  if (body == NULL) return KEEL_ENOMEM;
  pthread_mutex_lock(&client->lock);
  keel_status status;
  do {
    int64_t slice_ns = keel_now_ns() + ETCD_WAIT_SLICE_NS;
    status =
        watch_slice(client, body, start_revision, slice_ns < deadline_ns ? slice_ns : deadline_ns,
                    recheck, revision_p, behind_p);
    if (*behind_p) break;
    /* A member that cannot be reached or ended the stream early: another one, in time. */
    if (status == KEEL_ECLOSED || status == KEEL_EAGAIN)
      pause_before(ETCD_ROUND_PAUSE_NS, deadline_ns);
  } while ((status == KEEL_ETIMEDOUT || status == KEEL_ECLOSED || status == KEEL_EAGAIN) &&
           keel_now_ns() < deadline_ns);
  pthread_mutex_unlock(&client->lock);
  free(body);
  return status;
}

/* Reads whether the prefix changed after after_revision; if not, watches from the revision
 * read on. A change elsewhere between that read and the watch's start puts the watch in
 * the past, where etcd would answer from its catch-up pass; then the read is done again
 * (a few of them, then the catch-up it is). */
static keel_status etcd_wait(void *backend, const char *prefix, uint64_t after_revision,
                             int64_t deadline_ns, uint64_t *revision_p) {
  etcd_client *client = backend;
  char full[KEEL__ETCD_MAX_KEY + 1];
  keel_status status = full_key(client, prefix, full);
  if (status != KEEL_OK) return status;
  if (after_revision >= INT64_MAX) return KEEL_EINVAL;
  uint64_t checked = after_revision, revision = 0;
  for (int reads = 0;; reads++) {
    bool changed = false, behind = false;
    uint64_t now_revision = 0;
    bool read = changed_since(client, full, checked, &changed, &now_revision) == KEEL_OK;
    if (read && changed) {
      revision = now_revision;
      status = KEEL_OK;
      break;
    }
    if (read && now_revision > checked) checked = now_revision;
    status = watch_until(client, full, checked + 1, deadline_ns,
                         read && reads + 1 < ETCD_WAIT_READS, &revision, &behind);
    if (!behind) break;
  }
  if (status == KEEL_EAGAIN || status == KEEL_ECLOSED) status = KEEL_ETIMEDOUT;
  if (status == KEEL_OK && revision_p != NULL) *revision_p = revision;
  return status;
}

/* ---- leases: etcd counts their time in whole seconds (and may raise a short one to its
 * minimum, about three election timeouts). */

typedef struct lease_out {
  int64_t lease;
  int64_t ttl_seconds;
  int64_t left_seconds; /* timetolive */
  bool keepalive;
  bool time_to_live;
} lease_out;

static keel_status read_lease(etcd_client *client, void *out, char *message, size_t capacity) {
  lease_out *result = out;
  const char *body = (const char *)client->reply.data;
  size_t length = client->reply.length;
  if (result->time_to_live)
    return keel__etcd_lease_ttl_reply(body, length, &result->left_seconds, &result->ttl_seconds,
                                      message, capacity);
  if (result->keepalive) {
    /* A stream of one message: the first line. */
    const char *end = memchr(body, '\n', length);
    if (end != NULL) length = (size_t)(end - body);
    return keel__etcd_keepalive_reply(body, length, &result->ttl_seconds, message, capacity);
  }
  return keel__etcd_lease_grant_reply(body, length, &result->lease, &result->ttl_seconds, message,
                                      capacity);
}

static keel_status etcd_lease_grant(void *backend, int64_t ttl_ns, int64_t *lease_p) {
  int64_t seconds = (ttl_ns + 999999999) / 1000000000;
  lease_out result = {0};
  keel_status status =
      etcd_call(backend, "/v3/lease/grant", keel__etcd_lease_grant_request(seconds), REQUEST_WRITE,
                read_lease, &result, "a lease grant");
  if (status == KEEL_OK) *lease_p = result.lease;
  return status;
}

static keel_status etcd_lease_keepalive(void *backend, int64_t lease) {
  lease_out result = {.keepalive = true};
  /* A keepalive only extends a lease: sending it twice, even to two members at once, is
   * harmless, so it is a hedged read here. */
  return etcd_call(backend, "/v3/lease/keepalive", keel__etcd_lease_id_request(lease),
                   REQUEST_HEDGED_READ, read_lease, &result, "a lease keepalive");
}

static keel_status etcd_lease_ttl(void *backend, int64_t lease, int64_t *left_ns_p,
                                  int64_t *ttl_ns_p) {
  lease_out result = {.time_to_live = true};
  keel_status status =
      etcd_call(backend, "/v3/lease/timetolive", keel__etcd_lease_id_request(lease), REQUEST_READ,
                read_lease, &result, "a lease time-to-live");
  if (status != KEEL_OK) return status;
  *left_ns_p = result.left_seconds * 1000000000;
  *ttl_ns_p = result.ttl_seconds * 1000000000;
  return KEEL_OK;
}

static keel_status read_revoke(etcd_client *client, void *out, char *message, size_t capacity) {
  return keel__etcd_write_reply((const char *)client->reply.data, client->reply.length, NULL, NULL,
                                message, capacity);
}

static keel_status etcd_lease_revoke(void *backend, int64_t lease) {
  return etcd_call(backend, "/v3/lease/revoke", keel__etcd_lease_id_request(lease), REQUEST_WRITE,
                   read_revoke, NULL, "a lease revoke");
}

/* ---- the members' election state, asked of each member in turn (etcd_quorum_read) */

/* One request to member (a POST of "{}", or a GET) in its share of what is left before
 * deadline_ns (of members_left); the reply in client->reply. */
static bool member_answered(etcd_client *client, size_t member, const char *path, bool get,
                            size_t members_left, int64_t deadline_ns) {
  int64_t share_ns = (deadline_ns - keel_now_ns()) / (int64_t)members_left;
  if (share_ns < MS) return false;
  long http = 0;
  CURLcode code =
      member_post(client, member, path, get ? NULL : "{}", keel_now_ns() + share_ns, &http);
  return code == CURLE_OK && http == 200;
}

/* A member's answer, once per member id, among the voters only. */
static void quorum_note(keel_store_quorum *quorum, const keel_store_member_state *state,
                        const uint64_t *voters, size_t voter_count) {
  bool voter = false;
  for (size_t i = 0; i < voter_count; i++) voter = voter || voters[i] == state->id;
  for (size_t i = 0; i < quorum->answered; i++)
    if (quorum->members[i].id == state->id) return;
  if (voter && quorum->answered < KEEL_STORE_MAX_MEMBERS)
    quorum->members[quorum->answered++] = *state;
}

static keel_status etcd_quorum_read(void *backend, int64_t deadline_ns, keel_store_quorum *quorum) {
  etcd_client *client = backend;
  memset(quorum, 0, sizeof *quorum);
  uint64_t voters[KEEL_STORE_MAX_MEMBERS];
  size_t voter_count = 0;
  pthread_mutex_lock(&client->lock);
  quorum->asked_ns = keel_now_ns();
  for (size_t i = 0; i < client->member_count; i++) {
    size_t left = client->member_count - i;
    /* The cluster's voters, from the first member that lists them. */
    if (voter_count == 0 &&
        member_answered(client, i, "/v3/cluster/member/list", false, left, deadline_ns))
      keel__etcd_member_list_reply((const char *)client->reply.data, client->reply.length, voters,
                                   KEEL_STORE_MAX_MEMBERS, &voter_count, NULL, 0);
    keel_store_member_state state;
    if (voter_count > 0 && member_answered(client, i, "/debug/vars", true, left, deadline_ns) &&
        keel__etcd_raft_status_reply((const char *)client->reply.data, client->reply.length,
                                     &state) == KEEL_OK)
      quorum_note(quorum, &state, voters, voter_count);
  }
  pthread_mutex_unlock(&client->lock);
  quorum->voters = voter_count;
  return voter_count > 0 ? KEEL_OK : KEEL_ETIMEDOUT;
}

/* ---- the handle */

static keel_status etcd_set_timeout(void *backend, int64_t timeout_ns) {
  etcd_client *client = backend;
  atomic_store(&client->timeout_ns, timeout_ns);
  return KEEL_OK;
}

static uint64_t etcd_reconnects(const void *backend) {
  const etcd_client *client = backend;
  return atomic_load(&client->reconnects);
}

static void etcd_close(void *backend) {
  etcd_client *client = backend;
  if (client == NULL) return;
  for (size_t i = 0; i < client->member_count; i++) free(client->members[i]);
  if (client->curl != NULL) curl_easy_cleanup(client->curl);
  if (client->multi != NULL) curl_multi_cleanup(client->multi);
  for (size_t i = 0; i < client->member_count; i++) {
    if (client->hedges[i] == NULL) continue;
    curl_easy_cleanup(client->hedges[i]);
    keel_buffer_free(&client->hedge_replies[i]);
  }
  if (client->hedge_multi != NULL) curl_multi_cleanup(client->hedge_multi);
  keel_buffer_free(&client->reply);
  pthread_mutex_destroy(&client->lock);
  free(client);
}

/* "h1:2379,h2:2379": each member a non-empty host:port. */
static keel_status members_parse(etcd_client *client, const char *address) {
  const char *cursor = address;
  while (*cursor != '\0' || client->member_count == 0) {
    size_t length = strcspn(cursor, ",");
    if (length == 0 || length > 255 || memchr(cursor, ':', length) == NULL ||
        client->member_count == ETCD_MAX_MEMBERS) {
      KEEL_LOG_E(MODULE, "etcd endpoint '%s': want host:port[,host:port...] (at most %d members)",
                 address, ETCD_MAX_MEMBERS);
      return KEEL_EINVAL;
    }
    client->members[client->member_count] = strndup(cursor, length);
    if (client->members[client->member_count] == NULL) return KEEL_ENOMEM;
    client->member_count++;
    cursor += length;
    if (*cursor == ',') cursor++;
  }
  return KEEL_OK;
}

/* The first request: a read of the namespace until a member answers like etcd or the
 * deadline passes, so that a wrong or silent endpoint is an error at connect. */
static keel_status first_contact(etcd_client *client, const char *address, int64_t deadline_ns) {
  char *body = keel__etcd_range_request(client->namespace, false);
  if (body == NULL) return KEEL_ENOMEM;
  keel_status status;
  char message[256] = "";
  do {
    status = etcd_request(client, "/v3/kv/range", body, REQUEST_READ, deadline_ns);
    if (status == KEEL_OK) {
      keel_store_entry *entries = NULL;
      size_t count = 0;
      status = keel__etcd_range_reply((const char *)client->reply.data, client->reply.length,
                                      &entries, &count, NULL, message, sizeof message);
      keel_store_entries_free(entries, count);
    }
    /* Refused or not yet listening: members may still be starting. */
  } while ((status == KEEL_ECLOSED || status == KEEL_EAGAIN) && keel_now_ns() < deadline_ns);
  free(body);
  if (status == KEEL_OK) return KEEL_OK;
  if (status == KEEL_ECORRUPT)
    KEEL_LOG_E(MODULE, "etcd endpoint %s does not answer like etcd's v3 JSON gateway", address);
  else
    KEEL_LOG_E(MODULE, "etcd endpoint %s: no member answered (%s%s%s)", address,
               keel_strerror(status), message[0] != '\0' ? ": " : "", message);
  return status == KEEL_ECLOSED || status == KEEL_EAGAIN ? KEEL_ETIMEDOUT : status;
}

static keel_status etcd_open(const char *address, const keel_auth *auth, bool tls,
                             int64_t deadline_ns, void **backend_p) {
  pthread_once(&curl_once, curl_global_setup);
  if (curl_global_status != CURLE_OK) return KEEL_ENOTSUP;
  etcd_client *client = calloc(1, sizeof *client);
  if (client == NULL) return KEEL_ENOMEM;
  pthread_mutex_init(&client->lock, NULL);
  keel_buffer_init(&client->reply, ETCD_MAX_REPLY);
  atomic_init(&client->timeout_ns, ETCD_REQUEST_TIMEOUT_NS);
  atomic_init(&client->reconnects, 0);
  client->tls = tls;
  client->namespace_length = (size_t)snprintf(client->namespace, sizeof client->namespace,
                                              "keel/%llu/", (unsigned long long)auth->job_id);
  keel_status status = members_parse(client, address);
  if (status != KEEL_OK) goto fail_close;
  status = KEEL_ENOMEM;
  if ((client->curl = curl_easy_init()) == NULL || (client->multi = curl_multi_init()) == NULL)
    goto fail_close;
  if ((status = curl_configure(client)) != KEEL_OK) goto fail_close;
  if ((status = first_contact(client, address, deadline_ns)) != KEEL_OK) goto fail_close;
  client->failing = false;
  *backend_p = client;
  return KEEL_OK;

fail_close:
  etcd_close(client);
  return status;
}

static keel_status etcd_connect(const char *address, const keel_auth *auth, int64_t deadline_ns,
                                void **backend_p) {
  return etcd_open(address, auth, false, deadline_ns, backend_p);
}

static keel_status etcd_connect_tls(const char *address, const keel_auth *auth, int64_t deadline_ns,
                                    void **backend_p) {
  return etcd_open(address, auth, true, deadline_ns, backend_p);
}

#define ETCD_OPS(scheme_text, connect_function)                                                    \
  {                                                                                                \
    .scheme = scheme_text, .connect = connect_function, .close = etcd_close, .put = etcd_put,      \
    .get = etcd_get, .remove = etcd_remove, .list = etcd_list,                                     \
    .list_prefixes = etcd_list_prefixes, .wait = etcd_wait, .lease_grant = etcd_lease_grant,       \
    .lease_keepalive = etcd_lease_keepalive, .lease_revoke = etcd_lease_revoke,                    \
    .lease_ttl = etcd_lease_ttl, .quorum_read = etcd_quorum_read, .set_timeout = etcd_set_timeout, \
    .reconnects = etcd_reconnects,                                                                 \
  }

/* etcd:// speaks plain HTTP to the members; https:// TLS, with KEEL_RDZV_CA/CERT/KEY. */
const keel__store_ops keel__store_etcd_ops = ETCD_OPS("etcd://", etcd_connect);
const keel__store_ops keel__store_etcd_tls_ops = ETCD_OPS("https://", etcd_connect_tls);
