/* A worker's client of the parameter servers: routes each row to the server that serves it
 * (its own, or the acting parity holder when its server is lost), learns of losses from the
 * calls that fail and from the directory, and in synchronous mode sends every server its push
 * of each step, the rows of lost servers in a second phase once the first is applied. */
#include <stdlib.h>
#include <string.h>

#include "ec/ec_internal.h"
#include "ec/service.h"

#define MODULE KEEL__EC_MODULE
/* A call refused because the caller's view of the lost servers was old is tried again after
 * reading it anew, this many times in all. */
#define ROUTE_ATTEMPTS 4

struct keel_ec_client {
  keel__ec_directory directory;
  keel_auth auth;
  int worker;
  int servers;
  keel__ec_config wire;
  keel__ec_limits limits;
  keel_ec_layout layout;
  keel_ec_code *code;
  keel_ec_decoder *decoder;
  keel_store *owned_store; /* keel_ec_client_open_env's; closed with the client */
  size_t block_bytes;
  keel__ec_peer *peers;
  uint64_t *standing; /* each server's, as last read (service.h) */
  bool *lost;         /* served through the parity at next_step */
  uint64_t next_step; /* the step of this worker's next push */
  /* One request to each server at once (call_each), per server: */
  keel__ec_request *requests;
  keel__ec_pending *pending;
  keel_status *statuses;
  bool *sending;
  size_t *offsets, *chosen; /* where each server's part lies in the caller's arrays */
  void **bodies;
  uint32_t *again_lost; /* r slots: the servers a step's phase 2 lost in its first round */
};

static int64_t call_deadline(void) { return keel_deadline_after_ns(KEEL__EC_CALL_TIMEOUT_NS); }

static void refresh_lost(keel_ec_client *client) {
  keel_status status =
      keel__ec_directory_standing(&client->directory, client->servers, client->standing);
  if (status != KEEL_OK)
    KEEL_LOG_W(MODULE, "worker %d: cannot read the lost servers: %s", client->worker,
               keel_strerror(status));
  keel__ec_lost_view(client->standing, client->servers, client->next_step, client->lost);
}

/* A server that could not be reached (at failed_address) is lost: declared so for everyone,
 * routed around here. Where a replacement has taken its place the declaration is dropped, and
 * this step still routes around it, as the directory says of a replacement not back yet. */
static keel_status note_unreachable(keel_ec_client *client, int server, keel_status status,
                                    const char *failed_address) {
  if (!keel__ec_unreachable(status)) return status;
  KEEL_LOG_W(MODULE, "worker %d: server %d is lost (%s)", client->worker, server,
             keel_strerror(status));
  keel__ec_directory_declare_lost(&client->directory, server, failed_address);
  client->standing[server] = KEEL__EC_LOST;
  client->lost[server] = true;
  return status;
}

static keel_status call(keel_ec_client *client, int server, const keel__ec_request *request,
                        void *body) {
  char failed_address[KEEL__EC_ADDRESS_BYTES];
  keel_status status =
      keel__ec_peer_call(&client->peers[server], &client->directory, &client->auth, request,
                         &client->limits, body, call_deadline(), failed_address);
  return note_unreachable(client, server, status, failed_address);
}

/* client->requests[s] to every server s with client->sending[s], all sent before any reply
 * is awaited: one round trip for all of them, not one each. Each status in
 * client->statuses[s]; replies with a body into bodies[s]. */
static void call_each(keel_ec_client *client, void *const *bodies) {
  keel__ec_peers_call_each(client->peers, client->servers, &client->directory, &client->auth,
                           &client->limits, client->sending, client->requests, bodies,
                           client->pending, client->statuses);
  for (int server = 0; server < client->servers; server++)
    if (client->sending[server])
      note_unreachable(client, server, client->statuses[server],
                       client->pending[server].failed_address);
}

/* Whether a failed attempt is worth another after reading the lost servers anew. */
static bool retry_after(keel_ec_client *client, keel_status status, int attempt) {
  if (status != KEEL_EAGAIN && status != KEEL_EPEERLOST && !keel__ec_unreachable(status))
    return false;
  if (attempt + 1 >= ROUTE_ATTEMPTS) return false;
  refresh_lost(client);
  return true;
}

/* ---- open */

/* Two configurations are the same when their encodings are: the struct has padding that
 * decoding leaves as it found it, so it is never compared whole (an -O1 build's stack made
 * every job refuse its own servers). */
static bool configs_equal(const keel__ec_config *a, const keel__ec_config *b) {
  uint8_t encoded_a[KEEL__EC_CONFIG_BYTES], encoded_b[KEEL__EC_CONFIG_BYTES];
  return keel__ec_config_encode(a, encoded_a) == KEEL_OK &&
         keel__ec_config_encode(b, encoded_b) == KEEL_OK &&
         memcmp(encoded_a, encoded_b, sizeof encoded_a) == 0;
}

static keel_status check_servers(keel_ec_client *client) {
  keel_status status = KEEL_EIO;
  bool have = false;
  for (int i = 0; i < client->servers; i++) {
    if (client->standing[i] != KEEL__EC_LIVE) continue;
    keel__ec_config config;
    status = keel__ec_peer_info(&client->peers[i], &client->directory, &client->auth, &config,
                                call_deadline());
    if (status != KEEL_OK) return status;
    if (have && !configs_equal(&config, &client->wire)) {
      KEEL_LOG_E(MODULE, "worker %d: server %d has another configuration than server 0",
                 client->worker, i);
      return KEEL_EPROTO;
    }
    client->wire = config;
    have = true;
  }
  return status;
}

/* The number of servers comes with the configuration: asked first of one server, then every
 * server not lost must answer the same. */
static keel_status client_configure(keel_ec_client *client) {
  uint64_t *standing = calloc(KEEL_MAX_UIDS, sizeof *standing);
  if (standing == NULL) return KEEL_ENOMEM;
  keel_status status = keel__ec_directory_standing(&client->directory, KEEL_MAX_UIDS, standing);
  /* Server 0 may be lost: the first server that is live answers. */
  int index = 0;
  while (index < KEEL_MAX_UIDS - 1 && standing[index] != KEEL__EC_LIVE) index++;
  free(standing);
  keel__ec_peer first;
  keel__ec_peer_init(&first, index);
  if (status == KEEL_OK)
    status = keel__ec_peer_info(&first, &client->directory, &client->auth, &client->wire,
                                call_deadline());
  keel__ec_peer_destroy(&first);
  if (status != KEEL_OK) return status;
  client->servers = (int)client->wire.servers;
  client->peers = calloc((size_t)client->servers, sizeof *client->peers);
  client->lost = calloc((size_t)client->servers, sizeof *client->lost);
  client->standing = calloc((size_t)client->servers, sizeof *client->standing);
  client->requests = calloc((size_t)client->servers, sizeof *client->requests);
  client->pending = calloc((size_t)client->servers, sizeof *client->pending);
  client->statuses = calloc((size_t)client->servers, sizeof *client->statuses);
  client->sending = calloc((size_t)client->servers, sizeof *client->sending);
  client->offsets = calloc((size_t)client->servers, sizeof *client->offsets);
  client->chosen = calloc((size_t)client->servers, sizeof *client->chosen);
  client->bodies = calloc((size_t)client->servers, sizeof *client->bodies);
  client->again_lost = calloc(client->wire.parity_blocks, sizeof *client->again_lost);
  if (client->peers == NULL || client->lost == NULL || client->standing == NULL ||
      client->requests == NULL || client->pending == NULL || client->statuses == NULL ||
      client->sending == NULL || client->offsets == NULL || client->chosen == NULL ||
      client->bodies == NULL || client->again_lost == NULL)
    return KEEL_ENOMEM;
  for (int i = 0; i < client->servers; i++) keel__ec_peer_init(&client->peers[i], i);
  refresh_lost(client);
  status = check_servers(client);
  if (status == KEEL_OK)
    status = keel__ec_config_limits(&client->wire, KEEL__EC_MAX_COUNT, &client->limits);
  if (status == KEEL_OK)
    status = keel_ec_layout_init(client->servers, (int)client->wire.data_blocks,
                                 (int)client->wire.parity_blocks, &client->layout);
  if (status == KEEL_OK)
    status = keel_ec_code_create((int)client->wire.data_blocks, (int)client->wire.parity_blocks,
                                 KEEL_EC_AUTO, &client->code);
  if (status == KEEL_OK) status = keel_ec_decoder_create(client->code, 0, &client->decoder);
  client->block_bytes = client->limits.block_bytes;
  return status;
}

keel_status keel_ec_client_open(keel_store *directory, const keel_auth *auth, int worker,
                                keel_ec_config *config_p, keel_ec_client **client_p) {
  if (directory == NULL || auth == NULL || client_p == NULL || worker < 0)
    return keel__ec_invalid("keel_ec_client_open: NULL argument or negative worker");
  keel_ec_client *client = calloc(1, sizeof *client);
  if (client == NULL) return KEEL_ENOMEM;
  keel__ec_directory_init(&client->directory, directory);
  client->auth = *auth;
  client->worker = worker;
  keel_status status = client_configure(client);
  if (status == KEEL_OK && client->wire.workers > 0 && (uint32_t)worker >= client->wire.workers)
    status = keel__ec_invalid("keel_ec_client_open: worker index past the job's workers");
  if (status != KEEL_OK) {
    KEEL_LOG_E(MODULE, "worker %d cannot reach the parameter servers: %s", worker,
               keel_strerror(status));
    keel_ec_client_close(client);
    return status;
  }
  /* Said once a job, by its first worker: the job trains, but the guarantee is weaker. */
  if (worker == 0 && client->wire.parity_blocks >= 2 &&
      !(client->wire.options & KEEL__EC_OPTION_TWO_PHASE_COMMIT) &&
      !(client->wire.options & KEEL__EC_OPTION_NO_PARITY))
    KEEL_LOG_W(MODULE,
               "r = %u without two-phase commit: a server lost while it sends a change to its "
               "parity holders can leave them disagreeing, and a second loss then decodes "
               "wrong rows (docs/ECREC.md)",
               (unsigned)client->wire.parity_blocks);
  if (config_p != NULL) keel__ec_config_to_public(&client->wire, config_p);
  *client_p = client;
  return KEEL_OK;
}

void keel_ec_client_close(keel_ec_client *client) {
  if (client == NULL) return;
  if (client->peers != NULL)
    for (int i = 0; i < client->servers; i++) keel__ec_peer_destroy(&client->peers[i]);
  free(client->peers);
  free(client->lost);
  free(client->standing);
  free(client->requests);
  free(client->pending);
  free(client->statuses);
  free(client->sending);
  free(client->offsets);
  free(client->chosen);
  free(client->bodies);
  free(client->again_lost);
  keel_ec_decoder_destroy(client->decoder);
  keel_ec_code_destroy(client->code);
  keel__ec_directory_destroy(&client->directory);
  keel_store_close(client->owned_store);
  free(client);
}

keel_status keel_ec_config_from_env(keel_ec_config *config) {
  if (config == NULL) return keel__ec_invalid("keel_ec_config_from_env: NULL config");
  int64_t servers = 0, data_blocks = 0, parity_blocks = 0, workers = 0;
  if (getenv("KEEL_EC_SERVERS") == NULL) return KEEL_ENOTFOUND;
  keel_status status = keel_env_int("KEEL_EC_SERVERS", 1, KEEL_MAX_UIDS, &servers);
  if (status == KEEL_OK)
    status = keel_env_int("KEEL_EC_DATA_BLOCKS", 1, KEEL_EC_MAX_BLOCKS - 1, &data_blocks);
  if (status == KEEL_OK)
    status = keel_env_int("KEEL_EC_PARITY_BLOCKS", 1, KEEL_EC_MAX_BLOCKS - 1, &parity_blocks);
  if (status == KEEL_OK) status = keel_env_int("KEEL_EC_WORKERS", 0, KEEL_MAX_WORLD, &workers);
  if (status != KEEL_OK) return status;
  config->servers = (int)servers;
  config->data_blocks = (int)data_blocks;
  config->parity_blocks = (int)parity_blocks;
  config->workers = (int)workers;
  return KEEL_OK;
}

keel_status keel_ec_client_open_env(const keel_ec_config *tables, int worker,
                                    keel_ec_client **client_p) {
  if (tables == NULL || client_p == NULL)
    return keel__ec_invalid("keel_ec_client_open_env: NULL argument");
  keel_ec_config config = *tables;
  keel_status status = keel_ec_config_from_env(&config);
  keel_auth auth;
  if (status == KEEL_OK) status = keel_auth_from_env(&auth);
  const char *endpoint = getenv("KEEL_STORE");
  if (status == KEEL_OK && endpoint == NULL) status = KEEL_ENOTFOUND;
  keel_store *store = NULL;
  if (status == KEEL_OK) status = keel_store_connect(endpoint, &auth, call_deadline(), &store);
  if (status == KEEL_OK) status = keel_ec_config_publish(store, &config);
  keel_ec_client *client = NULL;
  if (status == KEEL_OK) status = keel_ec_client_open(store, &auth, worker, NULL, &client);
  if (status != KEEL_OK) {
    KEEL_LOG_E(MODULE, "worker %d cannot join the job's parameter servers: %s", worker,
               keel_strerror(status));
    keel_store_close(store);
    return status;
  }
  client->owned_store = store;
  *client_p = client;
  return KEEL_OK;
}

uint64_t keel_ec_client_lost(const keel_ec_client *client) {
  uint64_t bits = 0;
  for (int i = 0; i < client->servers && i < 64; i++)
    if (client->lost[i]) bits |= (uint64_t)1 << i;
  return bits;
}

/* ---- routing rows */

/* Whether row's own server is lost (its reads and updates go to an acting parity holder). */
static bool row_is_lost(const keel_ec_client *client, uint64_t row) {
  keel_ec_location at;
  keel_ec_layout_locate_row(&client->layout, row, &at);
  return client->lost[at.server];
}

/* The indexes (into rows) that server serves, own rows or acting ones. */
static size_t select_rows(const keel_ec_client *client, const uint64_t *rows, size_t count,
                          int server, bool acting, size_t *picked) {
  size_t chosen = 0;
  for (size_t i = 0; i < count; i++) {
    if (row_is_lost(client, rows[i]) != acting) continue;
    if (keel__ec_row_server(&client->layout, rows[i], client->lost) == server) picked[chosen++] = i;
  }
  return chosen;
}

static keel_status check_rows(const keel_ec_client *client, const uint64_t *rows, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (rows[i] >= client->wire.total_rows || (i > 0 && rows[i] <= rows[i - 1]))
      return keel__ec_invalid("ec client: rows must be strictly increasing and in the tables");
  }
  return KEEL_OK;
}

/* One server's part of a pull, in requests of at most KEEL__EC_MAX_COUNT rows. */
static keel_status pull_part(keel_ec_client *client, int server, bool acting, const uint64_t *rows,
                             const size_t *picked, size_t chosen, uint64_t *scratch_rows,
                             float *scratch_values, float *values) {
  int dim = (int)client->wire.dim;
  for (size_t done = 0; done < chosen;) {
    size_t piece = chosen - done > KEEL__EC_MAX_COUNT ? KEEL__EC_MAX_COUNT : chosen - done;
    for (size_t i = 0; i < piece; i++) scratch_rows[i] = rows[picked[done + i]];
    keel__ec_request request = {.op = KEEL__EC_OP_PULL_ROWS,
                                .flags = acting ? KEEL__EC_FLAG_ACTING : 0,
                                .count = (uint32_t)piece,
                                .step = client->next_step,
                                .rows = scratch_rows};
    keel_status status = call(client, server, &request, scratch_values);
    if (status != KEEL_OK) return status;
    for (size_t i = 0; i < piece; i++)
      memcpy(values + picked[done + i] * (size_t)dim, scratch_values + i * (size_t)dim,
             sizeof(float) * (size_t)dim);
    done += piece;
  }
  return KEEL_OK;
}

/* The parts of one phase (own rows, or acting ones) that fit one request, sent to their
 * servers at once; a larger part is pulled alone, piece by piece. picked, scratch_rows and
 * scratch_values have room for every row. */
static keel_status pull_phase(keel_ec_client *client, bool acting, const uint64_t *rows,
                              size_t count, float *values, size_t *picked, uint64_t *scratch_rows,
                              float *scratch_values) {
  int dim = (int)client->wire.dim;
  size_t *offsets = client->offsets, *chosen = client->chosen;
  void **bodies = client->bodies;
  size_t offset = 0;
  for (int server = 0; server < client->servers; server++) {
    client->sending[server] = false;
    if (client->lost[server]) continue;
    size_t part = select_rows(client, rows, count, server, acting, picked + offset);
    if (part == 0) continue;
    if (part > KEEL__EC_MAX_COUNT) {
      /* The room from offset on is free: the parts sent at once lie before it. */
      keel_status status =
          pull_part(client, server, acting, rows, picked + offset, part, scratch_rows + offset,
                    scratch_values + offset * (size_t)dim, values);
      if (status != KEEL_OK) return status;
      continue;
    }
    for (size_t i = 0; i < part; i++) scratch_rows[offset + i] = rows[picked[offset + i]];
    client->requests[server] = (keel__ec_request){.op = KEEL__EC_OP_PULL_ROWS,
                                                  .flags = acting ? KEEL__EC_FLAG_ACTING : 0,
                                                  .count = (uint32_t)part,
                                                  .step = client->next_step,
                                                  .rows = scratch_rows + offset};
    bodies[server] = scratch_values + offset * (size_t)dim;
    offsets[server] = offset;
    chosen[server] = part;
    client->sending[server] = true;
    offset += part;
  }
  call_each(client, bodies);
  keel_status status = KEEL_OK;
  for (int server = 0; server < client->servers; server++) {
    if (!client->sending[server]) continue;
    if (status == KEEL_OK) status = client->statuses[server];
    for (size_t i = 0; status == KEEL_OK && i < chosen[server]; i++)
      memcpy(values + picked[offsets[server] + i] * (size_t)dim,
             scratch_values + (offsets[server] + i) * (size_t)dim, sizeof(float) * (size_t)dim);
  }
  return status;
}

static keel_status pull_once(keel_ec_client *client, const uint64_t *rows, size_t count,
                             float *values, size_t *picked, uint64_t *scratch_rows,
                             float *scratch_values) {
  for (int acting = 0; acting < 2; acting++) {
    keel_status status =
        pull_phase(client, acting, rows, count, values, picked, scratch_rows, scratch_values);
    if (status != KEEL_OK) return status;
  }
  /* A row whose every holder is lost has no server: more than r lost. */
  for (size_t i = 0; i < count; i++)
    if (keel__ec_row_server(&client->layout, rows[i], client->lost) < 0) return KEEL_EDATALOST;
  return KEEL_OK;
}

keel_status keel_ec_client_pull_rows(keel_ec_client *client, const uint64_t *rows, size_t count,
                                     float *values) {
  if (client == NULL || (count > 0 && (rows == NULL || values == NULL)))
    return keel__ec_invalid("keel_ec_client_pull_rows: NULL argument");
  keel_status status = check_rows(client, rows, count);
  if (status != KEEL_OK || count == 0) return status;
  size_t *picked = malloc(sizeof *picked * count);
  uint64_t *scratch_rows = malloc(sizeof *scratch_rows * count);
  float *scratch_values = malloc(sizeof *scratch_values * count * client->wire.dim);
  status = picked && scratch_rows && scratch_values ? KEEL_OK : KEEL_ENOMEM;
  for (int attempt = 0; status == KEEL_OK; attempt++) {
    status = pull_once(client, rows, count, values, picked, scratch_rows, scratch_values);
    if (status == KEEL_OK) break;
    if (!retry_after(client, status, attempt)) {
      KEEL_LOG_W(MODULE, "worker %d: a pull of %zu rows failed: %s", client->worker, count,
                 keel_strerror(status));
      break;
    }
    status = KEEL_OK;
  }
  free(scratch_values);
  free(scratch_rows);
  free(picked);
  return status;
}

/* ---- pushes */

/* One server's push of a phase (flags: ACTING for phase 2, AGAIN too for its second round,
 * which names client->again_lost): its rows (maybe none) in one request, made ready in
 * client->requests[server]. Synchronous mode sends every server its push even when empty,
 * since each waits for every worker's. */
static keel_status push_part(keel_ec_client *client, int server, uint16_t flags, uint64_t step,
                             const uint64_t *rows, const float *gradients, const size_t *picked,
                             size_t chosen, uint64_t *part_rows, float *part_gradients) {
  int dim = (int)client->wire.dim;
  if (chosen > KEEL__EC_MAX_COUNT) return KEEL_ERANGE;
  for (size_t i = 0; i < chosen; i++) {
    part_rows[i] = rows[picked[i]];
    memcpy(part_gradients + i * (size_t)dim, gradients + picked[i] * (size_t)dim,
           sizeof(float) * (size_t)dim);
  }
  uint32_t workers = client->wire.workers > 0 ? client->wire.workers : 1;
  client->requests[server] =
      (keel__ec_request){.op = KEEL__EC_OP_PUSH_ROWS,
                         .flags = flags,
                         .count = (uint32_t)chosen,
                         .id = step + 1,
                         .step = step,
                         .worker = client->wire.workers > 0 ? (uint32_t)client->worker : 0,
                         .workers = workers,
                         .again_lost = client->again_lost,
                         /* the servers compare it across a round's workers (finding 53) */
                         .routed = keel__ec_routed_digest(client->lost, client->servers),
                         .rows = part_rows,
                         .values = part_gradients};
  client->sending[server] = true;
  client->bodies[server] = NULL;
  return KEEL_OK;
}

/* Whether a server that refused a push (KEEL_EAGAIN) is lost in the directory now: a
 * replacement still rebuilt, which took the push resent to its address after the link to the
 * server it replaces broke. In phase 1 its rows go with phase 2, as the other workers' do; in
 * phase 2 the phase goes again without it (a server killed and replaced between a step's
 * phases, finding 52's test). */
static bool lost_since(keel_ec_client *client, int server, keel_status status) {
  if (status != KEEL_EAGAIN) return false;
  /* Only this server's routing changes mid-step: the others' pushes are answered already. */
  if (keel__ec_directory_standing(&client->directory, client->servers, client->standing) != KEEL_OK)
    return false;
  client->lost[server] = keel__ec_lost_at(client->standing[server], client->next_step);
  if (client->lost[server])
    KEEL_LOG_W(MODULE,
               "worker %d: server %d is lost (a replacement not serving yet refused the "
               "push)",
               client->worker, server);
  return client->lost[server];
}

/* Whether a synchronous step's phase 2 goes again: a server was lost in it (with r > 1 a
 * second loss can come while the first one's rows are pushed), and the rows it was to act
 * for go to their next holder. A lost server that had applied the round answered some workers
 * (it marks the round at every other server first): only the others push it again, and the
 * holders answer theirs at once, knowing from its mark (the second round names the servers
 * lost in the first). One that had not answered none, and every worker pushes again to every
 * server not lost; the acting holders leave alone the rows whose parity stamp says the step
 * is in. Without synchronous mode a push is not guarded so, and the loss is the step's error,
 * as before. */
static bool phase_again(keel_ec_client *client, keel_status status, bool lost, int round) {
  if (client->wire.workers == 0 || round + 1 >= ROUTE_ATTEMPTS) return false;
  if (status != KEEL_EPEERLOST && !lost) return false;
  KEEL_LOG_W(MODULE, "worker %d: a server was lost in the second phase of step %llu: again",
             client->worker, (unsigned long long)client->next_step);
  return true;
}

/* The flags of a push: ACTING in phase 2, AGAIN too in its second round (RELIABILITY.md,
 * finding 48). A later round names nothing and is always joined. */
static uint16_t push_flags(bool acting, int round) {
  if (!acting) return 0;
  return round == 1 ? KEEL__EC_FLAG_ACTING | KEEL__EC_FLAG_AGAIN : KEEL__EC_FLAG_ACTING;
}

/* Notes in again_lost a server lost in the first round of phase 2 (unreachable, or replaced:
 * its replacement refused the push): KEEL_EIO when the round lost more than r (the data of
 * some group is gone). One that answered KEEL_EPEERLOST is not named: it did not apply the
 * round, so it joins the second, which every worker pushes it (its answer was the same to
 * all). */
static keel_status again_lost_note(keel_ec_client *client, int round, int server, bool lost,
                                   uint32_t *noted) {
  if (round != 0 || !lost) return KEEL_OK;
  if (*noted == client->wire.parity_blocks) return KEEL_EIO;
  client->again_lost[(*noted)++] = (uint32_t)server;
  return KEEL_OK;
}

/* Phase 1 pushes own rows to every server not lost; a server lost meanwhile has its rows moved
 * to phase 2, which pushes the rows of lost servers to their acting holders (every server not
 * lost gets one in synchronous mode: each waits for every worker's). */
static keel_status push_phases(keel_ec_client *client, uint64_t step, const uint64_t *rows,
                               size_t count, const float *gradients, size_t *picked,
                               uint64_t *part_rows, float *part_gradients) {
  bool synchronous = client->wire.workers > 0;
  for (int acting = 0, round = 0; acting < 2; acting++) {
    bool any_lost = false;
    for (int i = 0; i < client->servers; i++) any_lost |= client->lost[i];
    if (acting && !any_lost) break;
    /* Every server's part at once, each in its own stretch of the arrays. */
    size_t offset = 0;
    for (int server = 0; server < client->servers; server++) {
      client->sending[server] = false;
      if (client->lost[server]) continue;
      size_t chosen = select_rows(client, rows, count, server, acting, picked + offset);
      if (chosen == 0 && !synchronous) continue;
      keel_status status = push_part(client, server, push_flags(acting, round), step, rows,
                                     gradients, picked + offset, chosen, part_rows + offset,
                                     part_gradients + offset * client->wire.dim);
      if (status != KEEL_OK) return status;
      offset += chosen;
    }
    call_each(client, client->bodies);
    bool again = false;
    uint32_t noted = 0;
    for (int server = 0; server < client->servers; server++) {
      if (!client->sending[server]) continue;
      keel_status status = client->statuses[server];
      bool lost = keel__ec_unreachable(status) || lost_since(client, server, status);
      /* A server lost in phase 1: its rows go with phase 2, its stamp guards a redo. */
      if (!acting && lost) continue;
      if (acting && status != KEEL_OK && phase_again(client, status, lost, round)) {
        again = true;
        if (again_lost_note(client, round, server, lost, &noted) != KEEL_OK) {
          KEEL_LOG_W(MODULE, "worker %d: more than r servers lost in the second phase of step %llu",
                     client->worker, (unsigned long long)step);
          return KEEL_EIO;
        }
        continue;
      }
      if (status != KEEL_OK) {
        KEEL_LOG_W(MODULE, "worker %d: server %d refused the %s push of step %llu: %s",
                   client->worker, server, acting ? "second-phase" : "first-phase",
                   (unsigned long long)step, keel_strerror(status));
        return status;
      }
    }
    if (again) {
      for (uint32_t i = noted; round == 0 && i < client->wire.parity_blocks; i++)
        client->again_lost[i] = KEEL__EC_NO_SERVER;
      refresh_lost(client);
      round++;
      acting--;
    }
  }
  return KEEL_OK;
}

/* A replacement that finished its rebuild serves its rows from two steps after the first
 * worker sees it: every worker reads the standing at the start of each step while some server
 * is not live, and none can start that step before the first worker has ended the one
 * between, so all route that step alike. Two steps later the mark goes. */
static void standing_advance(keel_ec_client *client, uint64_t step) {
  for (int i = 0; i < client->servers; i++) {
    uint64_t standing = client->standing[i];
    uint64_t next = standing;
    if (standing == KEEL__EC_REBUILT) next = step + 2;
    if (standing < KEEL__EC_REBUILT && standing != KEEL__EC_LIVE && step >= standing + 2)
      next = KEEL__EC_LIVE;
    if (next == standing) continue;
    if (keel__ec_directory_set_standing(&client->directory, i, next) == KEEL_OK)
      client->standing[i] = next;
  }
}

/* Reads the servers' standing for `step` when some server is not live (the first worker
 * moves replacements back, see above), then routes by it. */
static void step_begin(keel_ec_client *client, uint64_t step) {
  client->next_step = step;
  bool settled = true;
  for (int i = 0; i < client->servers; i++) settled &= client->standing[i] == KEEL__EC_LIVE;
  if (!settled) {
    refresh_lost(client);
    if (client->worker == 0 && client->wire.workers > 0) standing_advance(client, step);
  }
  keel__ec_lost_view(client->standing, client->servers, step, client->lost);
}

keel_status keel_ec_client_push_rows(keel_ec_client *client, uint64_t step, const uint64_t *rows,
                                     size_t count, const float *gradients) {
  if (client == NULL || (count > 0 && (rows == NULL || gradients == NULL)))
    return keel__ec_invalid("keel_ec_client_push_rows: NULL argument");
  keel_status status = check_rows(client, rows, count);
  if (status != KEEL_OK) return status;
  step_begin(client, step);
  size_t room = count > 0 ? count : 1;
  size_t *picked = malloc(sizeof *picked * room);
  uint64_t *part_rows = malloc(sizeof *part_rows * room);
  float *part_gradients = malloc(sizeof *part_gradients * room * client->wire.dim);
  status = picked && part_rows && part_gradients ? KEEL_OK : KEEL_ENOMEM;
  if (status == KEEL_OK)
    status = push_phases(client, step, rows, count, gradients, picked, part_rows, part_gradients);
  /* Pulls until the next push belong to the next step. */
  client->next_step = step + 1;
  keel__ec_lost_view(client->standing, client->servers, client->next_step, client->lost);
  free(part_gradients);
  free(part_rows);
  free(picked);
  return status;
}

/* ---- dense parameters */

/* A dense request, routed by the standing at step: a push by its own step (after the step's
 * rows, client->lost is the next step's already), a pull by the next push's. */
static keel_status dense_call(keel_ec_client *client, keel__ec_request *request, void *body,
                              bool every_replica, uint64_t step) {
  bool replicated = (client->wire.options & KEEL__EC_OPTION_DENSE_REPLICATED) != 0;
  for (int attempt = 0;; attempt++) {
    bool lost[2] = {keel__ec_lost_at(client->standing[0], step),
                    client->servers > 1 && keel__ec_lost_at(client->standing[1], step)};
    keel_status status = KEEL_EIO;
    int first = keel__ec_dense_server(client->servers, replicated, lost);
    if (first >= 0) status = call(client, first, request, body);
    /* Updates go to both replicas, in the same order from every worker. Once the first has
     * it, the request is never sent again, whatever the second answers: a second replica
     * lost (unreachable), or replaced by one not serving yet (KEEL_EAGAIN; it gets the block
     * from the first after each step), is left out, as every worker leaves it out. Sent again
     * to the first, a synchronous push was a new push of its step there: applied twice, or
     * waiting for the workers that went on (finding 62). */
    if (status == KEEL_OK && every_replica && replicated && first == 0 && !lost[1]) {
      status = call(client, 1, request, NULL);
      if (keel__ec_unreachable(status) || status == KEEL_EAGAIN) status = KEEL_OK;
      if (status != KEEL_OK)
        KEEL_LOG_W(MODULE, "worker %d: dense op %u of step %llu failed at server 1: %s",
                   client->worker, (unsigned)request->op, (unsigned long long)step,
                   keel_strerror(status));
      return status;
    }
    if (status == KEEL_OK) return status;
    if (!retry_after(client, status, attempt)) {
      KEEL_LOG_W(MODULE, "worker %d: dense op %u of step %llu failed (server %d first): %s",
                 client->worker, (unsigned)request->op, (unsigned long long)step, first,
                 keel_strerror(status));
      return status;
    }
  }
}

keel_status keel_ec_client_pull_dense(keel_ec_client *client, float *values) {
  if (client == NULL || values == NULL) return keel__ec_invalid("ec client: NULL argument");
  keel__ec_request request = {.op = KEEL__EC_OP_PULL_DENSE,
                              .count = (uint32_t)client->wire.dense_count};
  return dense_call(client, &request, values, false, client->next_step);
}

keel_status keel_ec_client_push_dense(keel_ec_client *client, uint64_t step,
                                      const float *gradients) {
  if (client == NULL || gradients == NULL) return keel__ec_invalid("ec client: NULL argument");
  keel__ec_request request = {.op = KEEL__EC_OP_PUSH_DENSE,
                              .count = (uint32_t)client->wire.dense_count,
                              .id = step + 1,
                              .step = step,
                              .worker = client->wire.workers > 0 ? (uint32_t)client->worker : 0,
                              .workers = client->wire.workers > 0 ? client->wire.workers : 1,
                              .values = gradients};
  return dense_call(client, &request, NULL, true, step);
}

keel_status keel_ec_client_init_dense(keel_ec_client *client, const float *values) {
  if (client == NULL || values == NULL) return keel__ec_invalid("ec client: NULL argument");
  keel__ec_request request = {
      .op = KEEL__EC_OP_INIT_DENSE, .count = (uint32_t)client->wire.dense_count, .values = values};
  return dense_call(client, &request, NULL, true, client->next_step);
}

/* ---- checksum: every block read from the servers, lost ones decoded here */

/* Groups read in one round: every server's part of them in one request, all sent at once. */
#define SWEEP_BYTES ((size_t)8 << 20)

/* A round over consecutive groups: for each, `wanted` blocks (data first) from servers not
 * lost, the others to be decoded. */
typedef struct sweep {
  uint64_t first, count, capacity; /* groups */
  int wanted;
  uint8_t *space;     /* capacity * (k + r) blocks, group after group */
  bool *present;      /* capacity * (k + r) */
  keel__ec_ref *refs; /* capacity * (k + r), each server's stretch apart */
  uint8_t **targets;  /* where each ref's block goes */
  uint8_t *body;      /* the replies, in the refs' order */
} sweep;

static keel_status sweep_make(keel_ec_client *client, int wanted, sweep *round) {
  size_t n = (size_t)client->layout.data_blocks + (size_t)client->layout.parity_blocks;
  uint64_t capacity = SWEEP_BYTES / (n * client->block_bytes);
  if (capacity > KEEL__EC_MAX_COUNT / n) capacity = KEEL__EC_MAX_COUNT / n;
  if (capacity == 0) capacity = 1;
  *round = (sweep){.capacity = capacity, .wanted = wanted};
  size_t blocks = (size_t)capacity * n;
  round->space = malloc(blocks * client->block_bytes);
  round->body = malloc(blocks * client->block_bytes);
  round->present = malloc(blocks * sizeof *round->present);
  round->refs = malloc(blocks * sizeof *round->refs);
  round->targets = malloc(blocks * sizeof *round->targets);
  return round->space && round->body && round->present && round->refs && round->targets
             ? KEEL_OK
             : KEEL_ENOMEM;
}

static void sweep_free(sweep *round) {
  free(round->space), free(round->body), free(round->present);
  free(round->refs), free(round->targets);
}

static uint8_t *sweep_block(const keel_ec_client *client, const sweep *round, uint64_t g,
                            int member) {
  size_t n = (size_t)client->layout.data_blocks + (size_t)client->layout.parity_blocks;
  return round->space + ((size_t)g * n + (size_t)member) * client->block_bytes;
}

/* Chooses the blocks of the round's groups to read: of each, the first `wanted` members on
 * servers not lost. KEEL_EDATALOST when a group has fewer than k (more than r lost). */
static keel_status sweep_choose(keel_ec_client *client, sweep *round) {
  int n = client->layout.data_blocks + client->layout.parity_blocks;
  for (uint64_t g = 0; g < round->count; g++) {
    int chosen = 0;
    for (int member = 0; member < n; member++) {
      keel_ec_location at;
      keel_ec_layout_locate(&client->layout, round->first + g, member, &at);
      bool take = chosen < round->wanted && !client->lost[at.server];
      chosen += take;
      round->present[(size_t)g * (size_t)n + (size_t)member] = take;
    }
    if (chosen < client->layout.data_blocks) return KEEL_EDATALOST;
  }
  return KEEL_OK;
}

/* Reads the round's groups from `first` on: the chosen blocks of every group, one request to
 * each server holding some, all at once. */
static keel_status sweep_read(keel_ec_client *client, sweep *round, uint64_t first) {
  int n = client->layout.data_blocks + client->layout.parity_blocks;
  round->first = first;
  round->count = client->limits.groups - first;
  if (round->count > round->capacity) round->count = round->capacity;
  keel_status status = sweep_choose(client, round);
  if (status != KEEL_OK) return status;
  size_t wanted = 0;
  for (int server = 0; server < client->servers; server++) {
    size_t begin = wanted;
    client->sending[server] = false;
    for (uint64_t g = 0; g < round->count; g++) {
      for (int member = 0; member < n; member++) {
        keel_ec_location at;
        keel_ec_layout_locate(&client->layout, first + g, member, &at);
        if (!round->present[(size_t)g * (size_t)n + (size_t)member] || at.server != server)
          continue;
        round->refs[wanted] = (keel__ec_ref){.group = first + g, .member = (uint32_t)member};
        round->targets[wanted++] = sweep_block(client, round, g, member);
      }
    }
    if (wanted == begin) continue;
    client->requests[server] = (keel__ec_request){.op = KEEL__EC_OP_READ_BLOCKS,
                                                  .count = (uint32_t)(wanted - begin),
                                                  .refs = round->refs + begin};
    client->bodies[server] = round->body + begin * client->block_bytes;
    client->offsets[server] = begin;
    client->sending[server] = true;
  }
  call_each(client, client->bodies);
  for (int server = 0; server < client->servers; server++) {
    if (!client->sending[server]) continue;
    if (client->statuses[server] != KEEL_OK) return client->statuses[server];
    size_t end = client->offsets[server] + client->requests[server].count;
    for (size_t i = client->offsets[server]; i < end; i++)
      memcpy(round->targets[i], round->body + i * client->block_bytes, client->block_bytes);
  }
  return KEEL_OK;
}

/* The blocks of group g of the round, with the lost data blocks decoded. */
static keel_status sweep_decode(keel_ec_client *client, sweep *round, uint64_t g, uint8_t **blocks,
                                bool *present) {
  int n = client->layout.data_blocks + client->layout.parity_blocks;
  for (int member = 0; member < n; member++) {
    blocks[member] = sweep_block(client, round, g, member);
    present[member] = round->present[(size_t)g * (size_t)n + (size_t)member];
  }
  return keel_ec_decode(client->decoder, client->block_bytes, blocks, present);
}

/* Whether every parity block of group g held by a server not lost is the code of its rows
 * (the round read every member it could). */
static keel_status group_verify(keel_ec_client *client, sweep *round, uint64_t g, uint8_t *fresh,
                                bool *consistent_p) {
  int k = client->layout.data_blocks, r = client->layout.parity_blocks;
  uint8_t *blocks[KEEL_EC_MAX_BLOCKS], *work[KEEL_EC_MAX_BLOCKS];
  bool present[KEEL_EC_MAX_BLOCKS], some[KEEL_EC_MAX_BLOCKS];
  /* The rows: the data held, the lost ones decoded from the first parity blocks held. */
  int sources = 0;
  for (int member = 0; member < k + r; member++) {
    blocks[member] = sweep_block(client, round, g, member);
    present[member] = round->present[(size_t)g * (size_t)(k + r) + (size_t)member];
    work[member] = fresh + (size_t)member * client->block_bytes;
    memcpy(work[member], blocks[member], client->block_bytes);
    some[member] = present[member] && sources < k;
    sources += some[member];
  }
  keel_status status = keel_ec_decode(client->decoder, client->block_bytes, work, some);
  /* Now the code of those rows, against every parity block held. */
  if (status == KEEL_OK)
    status =
        keel_ec_encode(client->code, client->block_bytes, (const uint8_t *const *)work, work + k);
  *consistent_p = true;
  for (int p = k; status == KEEL_OK && p < k + r; p++)
    if (present[p] && memcmp(work[p], blocks[p], client->block_bytes) != 0) *consistent_p = false;
  return status;
}

keel_status keel_ec_client_verify(keel_ec_client *client, uint64_t *inconsistent_p) {
  if (client == NULL || inconsistent_p == NULL)
    return keel__ec_invalid("keel_ec_client_verify: NULL argument");
  size_t n = (size_t)client->layout.data_blocks + (size_t)client->layout.parity_blocks;
  uint8_t *fresh = malloc(client->block_bytes * n);
  sweep round;
  keel_status status = sweep_make(client, (int)n, &round);
  if (status == KEEL_OK && fresh == NULL) status = KEEL_ENOMEM;
  uint64_t inconsistent = 0;
  for (uint64_t first = 0; first < client->limits.groups && status == KEEL_OK;
       first += round.count) {
    status = sweep_read(client, &round, first);
    for (uint64_t g = 0; g < round.count && status == KEEL_OK; g++) {
      bool consistent = true;
      status = group_verify(client, &round, g, fresh, &consistent);
      inconsistent += !consistent;
    }
  }
  sweep_free(&round);
  free(fresh);
  if (status == KEEL_OK) *inconsistent_p = inconsistent;
  return status;
}

static keel_status checksum_rows(keel_ec_client *client, uint32_t *crc) {
  int k = client->layout.data_blocks;
  sweep round;
  keel_status status = sweep_make(client, k, &round);
  uint8_t *blocks[KEEL_EC_MAX_BLOCKS];
  bool present[KEEL_EC_MAX_BLOCKS];
  for (uint64_t first = 0; first < client->limits.groups && status == KEEL_OK;
       first += round.count) {
    status = sweep_read(client, &round, first);
    for (uint64_t g = 0; g < round.count && status == KEEL_OK; g++) {
      status = sweep_decode(client, &round, g, blocks, present);
      uint64_t group = first + g;
      for (int member = 0; member < k && status == KEEL_OK; member++)
        if (group * (uint64_t)k + (uint64_t)member < client->wire.total_rows)
          *crc = keel_crc32c(*crc, blocks[member], client->block_bytes);
    }
  }
  sweep_free(&round);
  return status;
}

keel_status keel_ec_client_checksum(keel_ec_client *client, uint32_t *crc32c_p) {
  if (client == NULL || crc32c_p == NULL) return keel__ec_invalid("ec client: NULL argument");
  uint32_t crc = 0;
  keel_status status = KEEL_OK;
  for (int attempt = 0;; attempt++) {
    crc = 0;
    status = checksum_rows(client, &crc);
    if (status == KEEL_OK || !retry_after(client, status, attempt)) break;
  }
  if (status == KEEL_OK && client->wire.dense_count > 0) {
    uint8_t *dense = malloc(client->limits.dense_block_bytes);
    if (dense == NULL) return KEEL_ENOMEM;
    keel__ec_request request = {.op = KEEL__EC_OP_READ_DENSE_BLOCK};
    status = dense_call(client, &request, dense, false, client->next_step);
    if (status == KEEL_OK) crc = keel_crc32c(crc, dense, client->limits.dense_block_bytes);
    free(dense);
  }
  if (status == KEEL_OK) *crc32c_p = crc;
  return status;
}
