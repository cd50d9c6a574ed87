/* What servers and clients share: one call to a server (a request and its reply over an
 * authenticated link), the directory of servers in the job's store, and routing around lost
 * servers. */
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ec/ec_internal.h"
#include "ec/service.h"

#define MODULE KEEL__EC_MODULE
#define DIRECTORY_POLL_NS ((int64_t)20 * 1000 * 1000)

void keel__ec_peer_init(keel__ec_peer *peer, int index) {
  memset(peer, 0, sizeof *peer);
  pthread_mutex_init(&peer->lock, NULL);
  peer->index = index;
  peer->next_tag = 1;
}

void keel__ec_peer_destroy(keel__ec_peer *peer) {
  keel_link_close(peer->link);
  peer->link = NULL;
  pthread_mutex_destroy(&peer->lock);
}

bool keel__ec_unreachable(keel_status status) {
  return status == KEEL_ECLOSED || status == KEEL_ECONNREFUSED || status == KEEL_ETIMEDOUT ||
         status == KEEL_EIO;
}

/* The directory's key of server index: ec/<kind>/<index>. */
static void server_key(char *key, size_t capacity, const char *kind, int index) {
  snprintf(key, capacity, "ec/%s/%d", kind, index);
}

/* A standing as the directory writes it. */
static uint64_t standing_parse(const char *text) {
  if (strcmp(text, "rebuilding") == 0) return KEEL__EC_REBUILDING;
  if (strcmp(text, "rebuilt") == 0) return KEEL__EC_REBUILT;
  unsigned long long step = 0;
  if (sscanf(text, "back %llu", &step) == 1 && step > 0 && step < KEEL__EC_REBUILT) return step;
  return KEEL__EC_LOST; /* "lost", or anything else: the safe reading */
}

/* Whether server index is declared lost in the directory (a replacement that marked
 * itself rebuilding, or one back, is not). */
static bool directory_says_lost(keel__ec_directory *directory, int index) {
  char key[64];
  server_key(key, sizeof key, "lost", index);
  keel_store_entry *entry = NULL;
  pthread_mutex_lock(&directory->lock);
  keel_status status = keel_store_get(directory->store, key, &entry);
  pthread_mutex_unlock(&directory->lock);
  bool lost = status == KEEL_OK && standing_parse((const char *)entry->value) == KEEL__EC_LOST;
  if (status == KEEL_OK) keel_store_entry_free(entry);
  return lost;
}

typedef struct connect_context {
  keel__ec_directory *directory;
  int index;
  const char *address; /* the one tried */
} connect_context;

/* Refusals are retried while the server is not declared lost and no replacement has
 * published another address: once another caller found it gone, or a replacement took its
 * place, nobody listens there again. With two servers killed at once, a replacement's rebuild
 * that read from the other one waited out the whole connect timeout (1 s) before, and still
 * did when that one's replacement marked itself rebuilding before anyone declared it lost. */
static bool connect_keep_trying(void *context) {
  const connect_context *target = context;
  if (directory_says_lost(target->directory, target->index)) return false;
  char address_now[KEEL__EC_ADDRESS_BYTES];
  return keel__ec_directory_lookup(target->directory, target->index, address_now,
                                   sizeof address_now, keel_now_ns()) != KEEL_OK ||
         strcmp(address_now, target->address) == 0;
}

/* Opens the link on first use: the address from the directory, each time, since a
 * replacement server may listen elsewhere. A server that cannot be reached at the address
 * read may have been replaced while it was tried: then the replacement's address is tried
 * too, so that the failure of the one it replaced is not taken for its own. */
static keel_status peer_connect(keel__ec_peer *peer, keel__ec_directory *directory,
                                const keel_auth *auth, int64_t deadline_ns) {
  if (peer->link != NULL) return KEEL_OK;
  keel_status status = keel__ec_directory_lookup(directory, peer->index, peer->address,
                                                 sizeof peer->address, deadline_ns);
  if (status != KEEL_OK) return status;
  for (int attempt = 0;; attempt++) {
    /* The address was published by a server that listened there: a refused connection means
     * it is gone, not that it has yet to start, so refusals are retried only briefly. */
    int64_t connect_deadline = keel_deadline_after_ns(KEEL__EC_CONNECT_TIMEOUT_NS);
    if (connect_deadline > deadline_ns) connect_deadline = deadline_ns;
    connect_context target = {
        .directory = directory, .index = peer->index, .address = peer->address};
    status = keel_link_connect_while(peer->address, auth, connect_deadline, connect_keep_trying,
                                     &target, &peer->link);
    if (!keel__ec_unreachable(status) || attempt == 1) return status;
    char address_now[sizeof peer->address];
    if (keel__ec_directory_lookup(directory, peer->index, address_now, sizeof address_now,
                                  deadline_ns) != KEEL_OK ||
        strcmp(address_now, peer->address) == 0)
      return status;
    memcpy(peer->address, address_now, sizeof peer->address);
  }
}

static void peer_drop(keel__ec_peer *peer) {
  keel_link_close(peer->link);
  peer->link = NULL;
}

/* The request half of an exchange on a connected link: its frame out, *tag_p its tag. */
static keel_status peer_send(keel__ec_peer *peer, const uint8_t *payload, size_t length,
                             int64_t deadline_ns, uint64_t *tag_p) {
  *tag_p = peer->next_tag++;
  keel_frame frame = {.type = KEEL_FRAME_EC_REQUEST, .tag = *tag_p};
  return keel_link_send(peer->link, &frame, payload, length, deadline_ns);
}

/* A server's answer that it could not reach a server it called on while it served the
 * request: it has declared that one lost, and the caller asks again after reading the lost
 * servers anew. Read as it came, it would be taken for the answering server's own loss, and a
 * healthy server declared lost for everyone (RELIABILITY.md, finding 44). */
static keel_status reply_status(keel_status status) {
  return keel__ec_unreachable(status) ? KEEL_EPEERLOST : status;
}

/* The reply half: the reply to tag in, the server's status out, its body copied to body. */
static keel_status peer_receive(keel__ec_peer *peer, uint64_t tag, uint16_t op, size_t body_bytes,
                                void *body, int64_t deadline_ns) {
  keel_frame reply_frame;
  void *reply_payload = NULL;
  keel_status status = keel_link_recv(peer->link, &reply_frame, &reply_payload, deadline_ns);
  if (status != KEEL_OK) return status;
  keel__ec_reply reply;
  if (reply_frame.type != KEEL_FRAME_EC_REPLY || reply_frame.tag != tag) {
    status = KEEL_EPROTO;
  } else {
    status = keel__ec_reply_decode(reply_payload, reply_frame.length, op, body_bytes, &reply);
  }
  if (status == KEEL_OK) {
    status = reply_status(reply.status);
    if (status == KEEL_OK && body_bytes > 0) memcpy(body, reply.body, body_bytes);
  }
  free(reply_payload);
  return status;
}

/* A link that failed mid-exchange may hold half a reply: never reuse it. */
static void peer_drop_after(keel__ec_peer *peer, keel_status status) {
  if (status != KEEL_OK &&
      (keel__ec_unreachable(status) || status == KEEL_EPROTO || status == KEEL_ECORRUPT))
    peer_drop(peer);
}

/* Takes the peer's lock by deadline_ns. Another thread's call holds it for as long as its
 * own deadline allows, which can be later than this one's: a server's threads forward to the
 * same parity holder, and a call that took the lock unbounded ended as late as the other call
 * did (RELIABILITY.md, finding 57). */
static bool peer_lock(keel__ec_peer *peer, int64_t deadline_ns) {
  if (deadline_ns == KEEL_NO_DEADLINE) return pthread_mutex_lock(&peer->lock) == 0;
  struct timespec until = {.tv_sec = (time_t)(deadline_ns / 1000000000),
                           .tv_nsec = (long)(deadline_ns % 1000000000)};
  return pthread_mutex_clocklock(&peer->lock, CLOCK_MONOTONIC, &until) == 0;
}

/* Connects if need be and sends the request; the peer's lock, once taken, is held from here
 * to pending_end. */
static void pending_begin(keel__ec_pending *pending, keel__ec_peer *peer,
                          keel__ec_directory *directory, const keel_auth *auth,
                          int64_t deadline_ns) {
  pending->peer = peer;
  pending->locked = peer_lock(peer, deadline_ns);
  if (!pending->locked) {
    pending->status = KEEL_ETIMEDOUT;
    return;
  }
  pending->reused = peer->link != NULL;
  memcpy(pending->address_before, peer->address, sizeof pending->address_before);
  pending->status = peer_connect(peer, directory, auth, deadline_ns);
  if (pending->status == KEEL_OK)
    pending->status =
        peer_send(peer, pending->payload, pending->length, deadline_ns, &pending->tag);
  peer_drop_after(peer, pending->status);
}

/* Whether a request that failed on a link opened earlier goes once more: only when a
 * replacement has taken the server's place at another address since. The one it replaced is
 * gone, and with it whatever it did of the request; to the same address it could be applied
 * twice. */
static bool pending_resend(const keel__ec_pending *pending, keel__ec_directory *directory,
                           keel_status status, int64_t deadline_ns) {
  if (status == KEEL_OK || !pending->reused || !keel__ec_unreachable(status)) return false;
  char address_now[sizeof pending->address_before];
  return keel__ec_directory_lookup(directory, pending->peer->index, address_now, sizeof address_now,
                                   deadline_ns) == KEEL_OK &&
         strcmp(address_now, pending->address_before) != 0;
}

/* Receives the reply (or sends the request once more, to a replacement, and receives that
 * reply); the caller holds the peer's lock. */
static keel_status pending_exchange_end(keel__ec_pending *pending, keel__ec_directory *directory,
                                        const keel_auth *auth, void *body, int64_t deadline_ns) {
  keel__ec_peer *peer = pending->peer;
  keel_status status = pending->status;
  if (status == KEEL_OK)
    status = peer_receive(peer, pending->tag, pending->op, pending->body_bytes, body, deadline_ns);
  peer_drop_after(peer, status);
  if (pending_resend(pending, directory, status, deadline_ns)) {
    status = peer_connect(peer, directory, auth, deadline_ns);
    if (status == KEEL_OK)
      status = peer_send(peer, pending->payload, pending->length, deadline_ns, &pending->tag);
    if (status == KEEL_OK)
      status =
          peer_receive(peer, pending->tag, pending->op, pending->body_bytes, body, deadline_ns);
    peer_drop_after(peer, status);
  }
  return status;
}

/* Ends the exchange if the lock was taken, releases the lock and frees what pending owns.
 * The call's wait counts against its deadline (keel_wait_ended). */
static keel_status pending_end(keel__ec_pending *pending, keel__ec_directory *directory,
                               const keel_auth *auth, void *body, int64_t deadline_ns) {
  keel_status status = pending->status;
  if (pending->locked) {
    status = pending_exchange_end(pending, directory, auth, body, deadline_ns);
    if (keel__ec_unreachable(status))
      memcpy(pending->failed_address, pending->peer->address, sizeof pending->failed_address);
    pthread_mutex_unlock(&pending->peer->lock);
  }
  free(pending->owned);
  pending->owned = NULL;
  keel_wait_ended(KEEL_WAIT_SERVER, deadline_ns);
  return status;
}

/* Gives the caller the address a call failed on (failed_address may be NULL). */
static void failed_address_give(const keel__ec_pending *pending, char *failed_address) {
  if (failed_address != NULL)
    memcpy(failed_address, pending->failed_address, sizeof pending->failed_address);
}

static keel_status peer_call_encoded(keel__ec_peer *peer, keel__ec_directory *directory,
                                     const keel_auth *auth, const uint8_t *payload, size_t length,
                                     uint16_t op, size_t body_bytes, void *body,
                                     int64_t deadline_ns, char *failed_address) {
  keel__ec_pending pending = {
      .payload = payload, .length = length, .op = op, .body_bytes = body_bytes};
  pending_begin(&pending, peer, directory, auth, deadline_ns);
  keel_status status = pending_end(&pending, directory, auth, body, deadline_ns);
  failed_address_give(&pending, failed_address);
  return status;
}

keel_status keel__ec_peer_start(keel__ec_peer *peer, keel__ec_directory *directory,
                                const keel_auth *auth, const keel__ec_request *request,
                                const keel__ec_limits *limits, int64_t deadline_ns,
                                keel__ec_pending *pending) {
  size_t length = keel__ec_request_bytes(request, limits);
  size_t body_bytes = keel__ec_reply_body_bytes(request, limits);
  if (length == 0 || body_bytes == SIZE_MAX) return KEEL_EINVAL;
  uint8_t *payload = malloc(length);
  if (payload == NULL) return KEEL_ENOMEM;
  keel_status status = keel__ec_request_encode(request, limits, payload, length);
  if (status != KEEL_OK) {
    free(payload);
    return status;
  }
  *pending = (keel__ec_pending){.payload = payload,
                                .owned = payload,
                                .length = length,
                                .op = request->op,
                                .body_bytes = body_bytes};
  pending_begin(pending, peer, directory, auth, deadline_ns);
  return KEEL_OK;
}

keel_status keel__ec_peer_finish(keel__ec_pending *pending, keel__ec_directory *directory,
                                 const keel_auth *auth, void *body, int64_t deadline_ns) {
  return pending_end(pending, directory, auth, body, deadline_ns);
}

void keel__ec_peers_call_each(keel__ec_peer *peers, int count, keel__ec_directory *directory,
                              const keel_auth *auth, const keel__ec_limits *limits,
                              const bool *targets, const keel__ec_request *requests,
                              void *const *bodies, keel__ec_pending *pending,
                              keel_status *statuses) {
  int64_t deadline = keel_deadline_after_ns(KEEL__EC_CALL_TIMEOUT_NS);
  for (int i = 0; i < count; i++) {
    if (targets[i])
      statuses[i] = keel__ec_peer_start(&peers[i], directory, auth, &requests[i], limits, deadline,
                                        &pending[i]);
  }
  /* A start that failed sent nothing and needs no finish. */
  for (int i = 0; i < count; i++) {
    if (targets[i] && statuses[i] == KEEL_OK)
      statuses[i] = keel__ec_peer_finish(&pending[i], directory, auth,
                                         bodies != NULL ? bodies[i] : NULL, deadline);
  }
}

keel_status keel__ec_peer_call(keel__ec_peer *peer, keel__ec_directory *directory,
                               const keel_auth *auth, const keel__ec_request *request,
                               const keel__ec_limits *limits, void *body, int64_t deadline_ns,
                               char *failed_address) {
  keel__ec_pending pending = {0}; /* no address failed when the start sends nothing */
  keel_status status =
      keel__ec_peer_start(peer, directory, auth, request, limits, deadline_ns, &pending);
  if (status == KEEL_OK)
    status = keel__ec_peer_finish(&pending, directory, auth, body, deadline_ns);
  failed_address_give(&pending, failed_address);
  return status;
}

keel_status keel__ec_peer_info(keel__ec_peer *peer, keel__ec_directory *directory,
                               const keel_auth *auth, keel__ec_config *config_p,
                               int64_t deadline_ns) {
  /* INFO is the header alone: no limits are known yet. */
  uint8_t payload[KEEL__EC_REQUEST_HEADER_BYTES] = {KEEL__EC_OP_INFO};
  uint8_t body[KEEL__EC_CONFIG_BYTES];
  keel_status status = peer_call_encoded(peer, directory, auth, payload, sizeof payload,
                                         KEEL__EC_OP_INFO, sizeof body, body, deadline_ns, NULL);
  if (status != KEEL_OK) return status;
  return keel__ec_config_decode(body, sizeof body, config_p);
}

/* ---- the directory */

void keel__ec_directory_init(keel__ec_directory *directory, keel_store *store) {
  directory->store = store;
  pthread_mutex_init(&directory->lock, NULL);
}

void keel__ec_directory_destroy(keel__ec_directory *directory) {
  pthread_mutex_destroy(&directory->lock);
}

keel_status keel__ec_directory_publish(keel__ec_directory *directory, int index,
                                       const char *address) {
  char key[64];
  server_key(key, sizeof key, "server", index);
  pthread_mutex_lock(&directory->lock);
  keel_status status = keel_store_put(directory->store, key, address, strlen(address), 0, NULL);
  pthread_mutex_unlock(&directory->lock);
  return status;
}

keel_status keel__ec_directory_lookup(keel__ec_directory *directory, int index, char *address,
                                      size_t capacity, int64_t deadline_ns) {
  char key[64];
  server_key(key, sizeof key, "server", index);
  for (;;) {
    keel_store_entry *entry = NULL;
    pthread_mutex_lock(&directory->lock);
    keel_status status = keel_store_get(directory->store, key, &entry);
    pthread_mutex_unlock(&directory->lock);
    if (status == KEEL_OK) {
      bool fits = entry->value_length < capacity;
      if (fits) snprintf(address, capacity, "%s", (const char *)entry->value);
      keel_store_entry_free(entry);
      return fits ? KEEL_OK : KEEL_ERANGE;
    }
    if (status != KEEL_ENOTFOUND) return status;
    if (keel_now_ns() >= deadline_ns) return KEEL_ETIMEDOUT;
    poll(NULL, 0, (int)(DIRECTORY_POLL_NS / 1000000));
  }
}

static void standing_text(uint64_t standing, char *text, size_t capacity) {
  if (standing == KEEL__EC_LOST)
    snprintf(text, capacity, "lost");
  else if (standing == KEEL__EC_REBUILDING)
    snprintf(text, capacity, "rebuilding");
  else if (standing == KEEL__EC_REBUILT)
    snprintf(text, capacity, "rebuilt");
  else
    snprintf(text, capacity, "back %llu", (unsigned long long)standing);
}

keel_status keel__ec_directory_set_standing(keel__ec_directory *directory, int index,
                                            uint64_t standing) {
  char key[64], text[64];
  server_key(key, sizeof key, "lost", index);
  standing_text(standing, text, sizeof text);
  pthread_mutex_lock(&directory->lock);
  keel_status status = standing == KEEL__EC_LIVE
                           ? keel_store_delete(directory->store, key)
                           : keel_store_put(directory->store, key, text, strlen(text), 0, NULL);
  pthread_mutex_unlock(&directory->lock);
  return status == KEEL_ENOTFOUND ? KEEL_OK : status;
}

/* Whether the directory says server index listens somewhere else than at address: a
 * replacement has published its own. Unknown ("" or nothing readable) is not elsewhere. The
 * caller holds the directory's lock. */
static bool listens_elsewhere(keel__ec_directory *directory, int index, const char *address) {
  if (address[0] == '\0') return false;
  char key[64];
  server_key(key, sizeof key, "server", index);
  keel_store_entry *entry = NULL;
  if (keel_store_get(directory->store, key, &entry) != KEEL_OK) return false;
  bool elsewhere = strcmp((const char *)entry->value, address) != 0;
  keel_store_entry_free(entry);
  return elsewhere;
}

keel_status keel__ec_directory_declare_lost(keel__ec_directory *directory, int index,
                                            const char *failed_address) {
  char key[64];
  server_key(key, sizeof key, "lost", index);
  /* A replacement being rebuilt is left as it is: a caller that failed on the server it
   * replaces must not undo it, and while it is rebuilt nobody reads from it. One that is back
   * (or coming back) serves rows, so its failure counts, unless the link that failed was to
   * the server it replaced: that one's failure can be seen late, after the replacement is
   * back or live (finding 60).
   * The write compares on what was read, since a replacement may mark itself in between
   * (from another process); on a conflict the standing is read again. The standing is read
   * before the address: a replacement publishes its address between marking itself lost and
   * rebuilding, so an address read as the failed one means the write's comparison fails if
   * the replacement marked itself since. */
  pthread_mutex_lock(&directory->lock);
  keel_status status = KEEL_ECONFLICT;
  for (int attempt = 0; attempt < 8 && status == KEEL_ECONFLICT; attempt++) {
    keel_store_entry *entry = NULL;
    status = keel_store_get(directory->store, key, &entry);
    bool replaceable = status == KEEL_ENOTFOUND ||
                       (status == KEEL_OK && strncmp((char *)entry->value, "back", 4) == 0);
    uint64_t revision = status == KEEL_OK ? entry->revision : 0;
    if (status == KEEL_OK) keel_store_entry_free(entry);
    if (replaceable && listens_elsewhere(directory, index, failed_address)) {
      KEEL_LOG_W(MODULE, "server %d at %s was replaced already: its replacement is not lost", index,
                 failed_address);
      replaceable = false;
      status = KEEL_OK;
    }
    if (replaceable) status = keel_store_cas(directory->store, key, revision, "lost", 4, 0, NULL);
  }
  pthread_mutex_unlock(&directory->lock);
  return status == KEEL_ENOTFOUND ? KEEL_OK : status;
}

keel_status keel__ec_directory_standing(keel__ec_directory *directory, int servers,
                                        uint64_t *standing) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  pthread_mutex_lock(&directory->lock);
  keel_status status = keel_store_list(directory->store, "ec/lost/", &entries, &count, NULL);
  pthread_mutex_unlock(&directory->lock);
  if (status != KEEL_OK) return status;
  for (int i = 0; i < servers; i++) standing[i] = KEEL__EC_LIVE;
  for (size_t i = 0; i < count; i++) {
    long index = strtol(entries[i].key + strlen("ec/lost/"), NULL, 10);
    if (index >= 0 && index < servers) standing[index] = standing_parse((char *)entries[i].value);
  }
  keel_store_entries_free(entries, count);
  return KEEL_OK;
}

keel_status keel_ec_servers_down(keel_store *directory, int servers, bool *down) {
  if (directory == NULL || down == NULL || servers < 1)
    return keel__ec_invalid("keel_ec_servers_down: NULL argument or no servers");
  uint64_t *standing = calloc((size_t)servers, sizeof *standing);
  if (standing == NULL) return KEEL_ENOMEM;
  keel__ec_directory view;
  keel__ec_directory_init(&view, directory);
  keel_status status = keel__ec_directory_standing(&view, servers, standing);
  keel__ec_directory_destroy(&view);
  /* A replacement back from step N is still routed around before N, and no rebuild reads
   * from it until its mark goes (two steps after N): counted up, a kill of r more servers in
   * that window took the job past its parity (finding 44). */
  for (int i = 0; i < servers && status == KEEL_OK; i++) down[i] = standing[i] != KEEL__EC_LIVE;
  free(standing);
  return status;
}

void keel__ec_lost_view(const uint64_t *standing, int servers, uint64_t step, bool *lost) {
  for (int i = 0; i < servers; i++) lost[i] = keel__ec_lost_at(standing[i], step);
}

/* ---- routing */

int keel__ec_row_server(const keel_ec_layout *layout, uint64_t row, const bool *lost) {
  keel_ec_location location;
  if (keel_ec_layout_locate_row(layout, row, &location) != KEEL_OK) return -1;
  if (!lost[location.server]) return location.server;
  int members = layout->data_blocks + layout->parity_blocks;
  for (int member = layout->data_blocks; member < members; member++) {
    keel_ec_location parity;
    keel_ec_layout_locate(layout, location.group, member, &parity);
    if (!lost[parity.server]) return parity.server;
  }
  return -1;
}

int keel__ec_dense_server(int servers, bool replicated, const bool *lost) {
  if (!lost[0]) return 0;
  if (replicated && servers > 1 && !lost[1]) return 1;
  return -1;
}

keel_status keel__ec_config_from_public(const keel_ec_config *config, keel__ec_config *wire_p) {
  if (config == NULL || config->servers < 1 || config->data_blocks < 1 ||
      config->parity_blocks < 1 || config->dim < 1 || config->workers < 0)
    return keel__ec_invalid("ec: a configuration with a count below 1");
  keel__ec_config wire = {
      .servers = (uint32_t)config->servers,
      .data_blocks = (uint32_t)config->data_blocks,
      .parity_blocks = (uint32_t)config->parity_blocks,
      .dim = (uint32_t)config->dim,
      .optimizer_kind = (uint32_t)config->optimizer.kind,
      .learning_rate = config->optimizer.learning_rate,
      .momentum = config->optimizer.momentum,
      .epsilon = config->optimizer.epsilon,
      .initial_accumulator = config->optimizer.initial_accumulator,
      .beta1 = config->optimizer.beta1,
      .beta2 = config->optimizer.beta2,
      .total_rows = config->total_rows,
      .dense_count = config->dense_count,
      .seed = config->seed,
      .workers = (uint32_t)config->workers,
      .options = (config->two_phase_commit ? KEEL__EC_OPTION_TWO_PHASE_COMMIT : 0u) |
                 (config->replicate_dense ? KEEL__EC_OPTION_DENSE_REPLICATED : 0u) |
                 (config->without_parity ? KEEL__EC_OPTION_NO_PARITY : 0u),
      .init_scale = config->init_scale,
  };
  /* The encoder checks every rule a server would. */
  uint8_t scratch[KEEL__EC_CONFIG_BYTES];
  keel_status status = keel__ec_config_encode(&wire, scratch);
  if (status != KEEL_OK) return keel__ec_invalid("ec: an invalid configuration");
  *wire_p = wire;
  return KEEL_OK;
}

void keel__ec_config_to_public(const keel__ec_config *wire, keel_ec_config *config) {
  *config = (keel_ec_config){
      .servers = (int)wire->servers,
      .data_blocks = (int)wire->data_blocks,
      .parity_blocks = (int)wire->parity_blocks,
      .dim = (int)wire->dim,
      .optimizer = keel__ec_config_optimizer(wire),
      .total_rows = wire->total_rows,
      .dense_count = wire->dense_count,
      .seed = wire->seed,
      .init_scale = wire->init_scale,
      .workers = (int)wire->workers,
      .two_phase_commit = (wire->options & KEEL__EC_OPTION_TWO_PHASE_COMMIT) != 0,
      .replicate_dense = (wire->options & KEEL__EC_OPTION_DENSE_REPLICATED) != 0,
      .without_parity = (wire->options & KEEL__EC_OPTION_NO_PARITY) != 0,
  };
}

keel_status keel_ec_config_publish(keel_store *directory, const keel_ec_config *config) {
  keel__ec_config wire;
  uint8_t bytes[KEEL__EC_CONFIG_BYTES];
  if (directory == NULL) return keel__ec_invalid("keel_ec_config_publish: NULL store");
  keel_status status = keel__ec_config_from_public(config, &wire);
  if (status == KEEL_OK) status = keel__ec_config_encode(&wire, bytes);
  if (status != KEEL_OK) return status;
  status = keel_store_cas(directory, KEEL__EC_CONFIG_KEY, 0, bytes, sizeof bytes, 0, NULL);
  if (status != KEEL_ECONFLICT) return status;
  keel_store_entry *entry = NULL;
  status = keel_store_get(directory, KEEL__EC_CONFIG_KEY, &entry);
  if (status != KEEL_OK) return status;
  bool same = entry->value_length == sizeof bytes && memcmp(entry->value, bytes, sizeof bytes) == 0;
  keel_store_entry_free(entry);
  return same ? KEEL_OK : KEEL_ECONFLICT;
}

keel_status keel_ec_config_wait(keel_store *directory, int64_t deadline_ns,
                                keel_ec_config *config_p) {
  if (directory == NULL || config_p == NULL)
    return keel__ec_invalid("keel_ec_config_wait: NULL argument");
  for (;;) {
    keel_store_entry *entry = NULL;
    keel_status status = keel_store_get(directory, KEEL__EC_CONFIG_KEY, &entry);
    if (status == KEEL_OK) {
      keel__ec_config wire;
      status = keel__ec_config_decode(entry->value, entry->value_length, &wire);
      keel_store_entry_free(entry);
      if (status == KEEL_OK) keel__ec_config_to_public(&wire, config_p);
      return status;
    }
    if (status != KEEL_ENOTFOUND) return status;
    if (keel_now_ns() >= deadline_ns) return KEEL_ETIMEDOUT;
    poll(NULL, 0, (int)(DIRECTORY_POLL_NS / 1000000));
  }
}
