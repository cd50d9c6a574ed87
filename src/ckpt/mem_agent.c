/* In-memory checkpoints, the agent's side (Gemini §4-§6): the node's snapshot service. One
 * thread accepts connections (and moves the node's heartbeat), one thread per connection
 * serves a peer's copies (checked, then sealed: a copy counts only when complete) and
 * fetches, and one thread sends each new snapshot of the node's workers to the peers that
 * Algorithm 1 names, a few chunks in flight, then tells the worker its slot is free. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/mem_internal.h"
#include "keel/model.h"

#define MODULE "mem-agent"
#define SECOND_NS INT64_C(1000000000)
#define CALL_DEADLINE_NS (30 * SECOND_NS)
#define CONNECT_DEADLINE_NS (SECOND_NS)
#define POLL_MS 100
#define RESCAN_EVERY_NS (50 * 1000 * 1000)
#define PEERS_REFRESH_NS (SECOND_NS)
#define MAX_RANKS 1024
#define MAX_CONNECTIONS 64

/* A worker rank whose slots this node holds. */
typedef struct local_rank {
  uint32_t rank;
  keel__ckpt_slot slots[KEEL__CKPT_OWN_SLOTS];
  keel__ckpt_slot control;
  uint64_t pushed[KEEL__CKPT_OWN_SLOTS]; /* the seal of each slot last sent to every peer */
  /* A copy of a snapshot due for the persistent tier; staged (under the agent's persist
   * lock) until the persist thread has written it. */
  uint8_t *staging;
  size_t staging_bytes;
  bool staged;
} local_rank;

typedef struct peer {
  char address[128];
  keel_link *link;
  bool failing; /* the last send failed: said once, not at every snapshot */
} peer;

typedef struct connection {
  keel_ckpt_agent *agent;
  keel_link *link;
  pthread_t thread;
  bool used;
  _Atomic bool finished;
} connection;

struct keel_ckpt_agent {
  keel_auth auth;
  char store_endpoint[512];
  char directory[PATH_MAX];
  uint32_t node, nodes, ranks_per_node;
  /* The node whose place this one holds in the placement: itself, or, for a spare node whose
   * workers took a node's ranks, that node (UINT32_MAX: a spare node not yet in a place). */
  uint32_t acting_node;
  bool holder_published;
  keel_ckpt_mem_config config;
  keel_model_placement placement;
  keel_listener *listener;
  keel__ckpt_slot heartbeat;
  pthread_t accept_thread, replicate_thread;
  bool accept_started, replicate_started;
  _Atomic bool stopping;
  _Atomic uint64_t sent, received;
  pthread_mutex_t connections_lock;
  connection connections[MAX_CONNECTIONS];
  /* The replicate thread's own. */
  keel_store *store;
  local_rank *ranks;
  size_t rank_count;
  peer peers[KEEL_MODEL_PLACEMENT_MAX_REPLICAS];
  uint32_t peer_nodes[KEEL_MODEL_PLACEMENT_MAX_REPLICAS];
  uint32_t peer_count;
  int64_t peers_refreshed_ns, rescanned_ns;
  /* The persistent tier: the replicate thread stages a due snapshot (a copy of its slot) and
   * the persist thread checks and writes it. */
  char persist_directory[PATH_MAX];
  uint64_t persist_every_steps;
  int64_t persist_every_ns;
  uint64_t timed_first_step, timed_steps; /* timing the steps for the agreed count */
  int64_t timed_first_ns;
  pthread_t persist_thread;
  bool persist_started;
  pthread_mutex_t persist_lock;
  pthread_cond_t persist_wake;
  _Atomic uint64_t persisted, persisted_bytes;
  _Atomic int64_t persist_ns;
  keel__ckpt_write_health persist_health; /* written by the persist thread */
  /* KEEL_FAULT rules with node= this node (docs/RUNTIME.md): mem_send (after=K: the K-th
   * chunk this agent sent), mem_persist (after=K: its K-th persistent write, every file
   * written, before the manifest). Two
   * threads fire them: under the lock. */
  keel_fault_plan *faults;
  pthread_mutex_t fault_lock;
  int64_t chunks_sent, persist_writes;
  /* f(s) = alpha + s / beta of a send to a peer (Algorithm 2), learnt from whole copies. */
  double alpha_ns, bytes_per_ns;
  bool speed_known;
};

static bool stopping(keel_ckpt_agent *agent) {
  return atomic_load_explicit(&agent->stopping, memory_order_acquire);
}

static void fault_point(keel_ckpt_agent *agent, const char *point, int64_t counter) {
  pthread_mutex_lock(&agent->fault_lock);
  keel_fault_plan_fire(agent->faults, point, counter);
  pthread_mutex_unlock(&agent->fault_lock);
}

/* ---- serving one connection: copies from peers, fetches */

/* The peer-copy slots a connection has mapped, kept from one copy to the next: mapping and
 * pre-faulting the slot for every copy, then unmapping it, cost more CPU than receiving the
 * copy (and that CPU is the training's). */
#define MAPPED_SLOTS 8

typedef struct mapped_slot {
  uint32_t origin;
  int index;
  keel__ckpt_slot slot;
} mapped_slot;

typedef struct copy_target {
  mapped_slot mapped[MAPPED_SLOTS];
  uint32_t mapped_count, evict_next;
  keel__ckpt_slot *slot; /* the copy being received; NULL: none */
  uint64_t next_offset;
} copy_target;

/* The copy being received is over (sealed, refused or abandoned); its slot stays mapped. */
static void copy_target_end(copy_target *target) { target->slot = NULL; }

static void copy_target_release(copy_target *target) {
  copy_target_end(target);
  for (uint32_t i = 0; i < target->mapped_count; i++)
    keel__ckpt_slot_close(&target->mapped[i].slot);
  target->mapped_count = 0;
}

/* Slot `index` of origin's copies, bytes long, from the mapped ones or newly mapped (sized,
 * pre-faulted) in place of the one whose size is stale, or of the next one in turn. */
static keel_status copy_target_map(keel_ckpt_agent *agent, copy_target *target, uint32_t origin,
                                   int index, size_t bytes, keel__ckpt_slot **slot_p) {
  mapped_slot *entry = NULL;
  for (uint32_t i = 0; i < target->mapped_count && entry == NULL; i++) {
    if (target->mapped[i].origin == origin && target->mapped[i].index == index)
      entry = &target->mapped[i];
  }
  if (entry != NULL && entry->slot.region.bytes == bytes) {
    *slot_p = &entry->slot;
    return KEEL_OK;
  }
  if (entry != NULL) {
    keel__ckpt_slot_close(&entry->slot);
  } else if (target->mapped_count < MAPPED_SLOTS) {
    entry = &target->mapped[target->mapped_count++];
  } else {
    entry = &target->mapped[target->evict_next];
    target->evict_next = (target->evict_next + 1) % MAPPED_SLOTS;
    keel__ckpt_slot_close(&entry->slot);
  }
  char name[64];
  snprintf(name, sizeof name, "peer-%" PRIu32 ".slot-%d", origin, index);
  *entry = (mapped_slot){.origin = origin, .index = index, .slot = {.file = -1}};
  keel_status status = keel__ckpt_slot_open(agent->directory, name, bytes, &entry->slot);
  if (status != KEEL_OK) {
    /* Left in the table closed (and so never matched at this size). */
    entry->slot = (keel__ckpt_slot){.file = -1};
    return status;
  }
  *slot_p = &entry->slot;
  return KEEL_OK;
}

/* Of the two slots of the origin's copies, the one that does not hold the newest complete
 * copy: that one stays until the new one is sealed. */
static int copy_slot_choose(keel_ckpt_agent *agent, uint32_t origin, size_t bytes) {
  uint64_t newest_step[KEEL__CKPT_PEER_SLOTS] = {0, 0};
  bool complete[KEEL__CKPT_PEER_SLOTS] = {false, false};
  for (int i = 0; i < KEEL__CKPT_PEER_SLOTS; i++) {
    char name[64];
    snprintf(name, sizeof name, "peer-%" PRIu32 ".slot-%d", origin, i);
    keel__ckpt_slot slot = {.file = -1};
    if (keel__ckpt_slot_open(agent->directory, name, 0, &slot) != KEEL_OK) continue;
    keel_ckpt_identity identity;
    uint64_t seal = 0;
    if (slot.region.bytes == bytes &&
        keel__ckpt_region_identity(&slot.region, &identity, &seal) == KEEL_OK) {
      complete[i] = true;
      newest_step[i] = identity.step;
    }
    keel__ckpt_slot_close(&slot);
  }
  if (!complete[0]) return 0;
  if (!complete[1]) return 1;
  return newest_step[0] <= newest_step[1] ? 0 : 1;
}

static keel_status serve_offer(keel_ckpt_agent *agent, const keel__ckpt_request *request,
                               copy_target *target) {
  copy_target_end(target);
  size_t bytes = (size_t)request->region_bytes;
  int index = copy_slot_choose(agent, request->origin_rank, bytes);
  keel__ckpt_slot *slot = NULL;
  keel_status status = copy_target_map(agent, target, request->origin_rank, index, bytes, &slot);
  if (status != KEEL_OK) {
    KEEL_LOG_W(MODULE, "cannot keep a copy of rank %" PRIu32 "'s snapshot: %s",
               request->origin_rank, keel_strerror(status));
    return status;
  }
  target->slot = slot;
  keel__ckpt_region_unseal(&slot->region);
  /* The header but its seal word (bytes 32..39), which stays odd until the copy is checked. */
  uint8_t *base = slot->region.base;
  memcpy(base, request->header, 32);
  memcpy(base + 40, request->header + 40, KEEL__CKPT_HEADER_BYTES - 40);
  target->next_offset = KEEL__CKPT_HEADER_BYTES;
  return KEEL_OK;
}

/* Where a DATA frame's payload goes: straight into the slot when it is the next piece of the
 * copy (NULL otherwise: the link allocates it, and serve_data refuses it). */
static uint8_t *copy_target_destination(const copy_target *target, const keel_frame *frame) {
  if (target->slot == NULL || frame->type != KEEL_FRAME_CKPT_DATA ||
      frame->tag != target->next_offset ||
      frame->length > target->slot->region.bytes - target->next_offset)
    return NULL;
  return (uint8_t *)target->slot->region.base + frame->tag;
}

static keel_status serve_data(keel_ckpt_agent *agent, keel_link *link, const keel_frame *frame,
                              const void *payload, copy_target *target, int64_t deadline) {
  uint8_t *destination = copy_target_destination(target, frame);
  if (destination == NULL) return KEEL_EPROTO;
  if (payload != destination) memcpy(destination, payload, (size_t)frame->length);
  target->next_offset += frame->length;
  if (agent->config.buffers == 0) return KEEL_OK;
  return keel__ckpt_send_reply(link, KEEL__CKPT_ACK, KEEL_OK, frame->tag, deadline);
}

static keel_status serve_commit(keel_ckpt_agent *agent, copy_target *target) {
  if (target->slot == NULL || target->next_offset != target->slot->region.bytes) return KEEL_EPROTO;
  keel__ckpt_region_seal_now(&target->slot->region);
  char reason[KEEL__CKPT_REASON_BYTES];
  keel_ckpt_identity identity;
  keel_status status = keel__ckpt_region_check(&target->slot->region, &identity, NULL, reason);
  if (status != KEEL_OK) {
    keel__ckpt_region_unseal(&target->slot->region);
    KEEL_LOG_W(MODULE, "refused a peer's copy: %s", reason);
    copy_target_end(target);
    return KEEL_ECORRUPT;
  }
  atomic_fetch_add(&agent->received, 1);
  KEEL_LOG_D(MODULE, "holds a copy of rank %" PRIu32 " at step %" PRIu64, identity.rank,
             identity.step);
  copy_target_end(target);
  return KEEL_OK;
}

/* The newest sealed snapshot here of the request's shard at or below its step: an index
 * into slots, or -1. */
static int fetch_choose(const keel__ckpt_request *request, keel__ckpt_slot *slots, size_t count,
                        uint64_t *seal_p, uint64_t *step_p) {
  int best = -1;
  uint64_t best_step = 0;
  for (size_t i = 0; i < count; i++) {
    keel_ckpt_identity identity;
    uint64_t seal = 0;
    if (keel__ckpt_region_identity(&slots[i].region, &identity, &seal) != KEEL_OK) continue;
    if (identity.shard_index != request->shard_index ||
        identity.shard_count != request->shard_count)
      continue;
    if (identity.step > request->step) continue;
    if (best >= 0 && identity.step <= best_step) continue;
    best = (int)i;
    best_step = identity.step;
    *seal_p = seal;
    *step_p = identity.step;
  }
  return best;
}

static keel_status serve_fetch(keel_ckpt_agent *agent, keel_link *link,
                               const keel__ckpt_request *request, int64_t deadline) {
  keel__ckpt_slot *slots = NULL;
  size_t count = 0;
  keel_status status = keel__ckpt_slots_list(agent->directory, "", &slots, &count);
  if (status != KEEL_OK) return keel__ckpt_send_reply(link, KEEL__CKPT_FETCH, status, 0, deadline);
  uint64_t seal = 0, step = 0;
  int chosen = fetch_choose(request, slots, count, &seal, &step);
  if (request->op == KEEL__CKPT_PROBE) {
    keel__ckpt_slots_close(slots, count);
    return keel__ckpt_send_reply(link, KEEL__CKPT_PROBE, chosen < 0 ? KEEL_ENOTFOUND : KEEL_OK,
                                 step, deadline);
  }
  if (chosen < 0 || step != request->step) {
    keel__ckpt_slots_close(slots, count);
    return keel__ckpt_send_reply(link, KEEL__CKPT_FETCH, KEEL_ENOTFOUND, 0, deadline);
  }
  const keel_ckpt_region *region = &slots[chosen].region;
  status = keel__ckpt_send_reply(link, KEEL__CKPT_FETCH, KEEL_OK, region->bytes, deadline);
  if (status == KEEL_OK)
    status = keel__ckpt_send_region(link, region, 0, agent->config.chunk_bytes, 0, deadline);
  if (status == KEEL_OK) {
    bool same = keel__ckpt_region_seal(region) == seal;
    status =
        keel__ckpt_send_reply(link, KEEL__CKPT_FETCH, same ? KEEL_OK : KEEL_EAGAIN, 0, deadline);
  }
  keel__ckpt_slots_close(slots, count);
  return status;
}

static keel_status serve_frame(keel_ckpt_agent *agent, keel_link *link, const keel_frame *frame,
                               const void *payload, copy_target *target) {
  int64_t deadline = keel_deadline_after_ns(CALL_DEADLINE_NS);
  if (frame->type == KEEL_FRAME_CKPT_DATA)
    return serve_data(agent, link, frame, payload, target, deadline);
  keel__ckpt_request request;
  if (frame->type != KEEL_FRAME_CKPT_REQUEST ||
      keel__ckpt_request_decode(payload, (size_t)frame->length, &request) != KEEL_OK)
    return KEEL_EPROTO;
  keel_status status;
  switch (request.op) {
    case KEEL__CKPT_OFFER:
      status = serve_offer(agent, &request, target);
      return keel__ckpt_send_reply(link, KEEL__CKPT_OFFER, status, 0, deadline);
    case KEEL__CKPT_COMMIT:
      status = serve_commit(agent, target);
      if (status == KEEL_EPROTO) return status;
      return keel__ckpt_send_reply(link, KEEL__CKPT_COMMIT, status, 0, deadline);
    default:
      return serve_fetch(agent, link, &request, deadline);
  }
}

/* A connection's frames as the link completes them. DATA frames are served at once (their
 * payload lands in the slot itself); a request waits until the link has read what there is,
 * since serving it may receive on the link (a fetch's ACKs). A peer sends nothing after a
 * request until it has its answer, so one at a time. */
typedef struct connection_reader {
  keel_ckpt_agent *agent;
  keel_link *link;
  copy_target *target;
  keel_status status;
  bool request_pending;
  keel_frame request;
  void *request_payload;
} connection_reader;

static void *reader_destination(void *context, keel_link *link, const keel_frame *frame) {
  (void)link;
  connection_reader *reader = context;
  return copy_target_destination(reader->target, frame);
}

static void reader_complete(void *context, keel_link *link, const keel_frame *frame, void *payload,
                            keel_status status) {
  connection_reader *reader = context;
  bool ours = payload != NULL && payload == copy_target_destination(reader->target, frame);
  if (status == KEEL_ECANCELED) return;
  if (reader->status == KEEL_OK) reader->status = status;
  if (reader->status == KEEL_OK && frame->type == KEEL_FRAME_CKPT_DATA) {
    reader->status = serve_frame(reader->agent, link, frame, payload, reader->target);
  } else if (reader->status == KEEL_OK && !reader->request_pending) {
    reader->request_pending = true;
    reader->request = *frame;
    reader->request_payload = payload;
    return;
  } else if (reader->status == KEEL_OK) {
    reader->status = KEEL_EPROTO; /* a second request before the first's answer */
  }
  if (!ours) free(payload);
}

/* Reads what the link has, then serves the request it completed, if any. */
static keel_status connection_read(connection_reader *reader) {
  keel_link_sink sink = {
      .destination_cb = reader_destination, .complete_cb = reader_complete, .context = reader};
  keel_status status;
  do {
    status = keel_link_recv_progress(reader->link, &sink);
  } while (status == KEEL_OK && reader->status == KEEL_OK);
  if (reader->request_pending) {
    if (reader->status == KEEL_OK)
      reader->status = serve_frame(reader->agent, reader->link, &reader->request,
                                   reader->request_payload, reader->target);
    free(reader->request_payload);
    reader->request_pending = false;
    reader->request_payload = NULL;
  }
  if (reader->status != KEEL_OK) return reader->status;
  return status == KEEL_EAGAIN ? KEEL_OK : status;
}

static void *connection_main(void *arg) {
  connection *served = arg;
  keel_ckpt_agent *agent = served->agent;
  copy_target target = {.slot = NULL};
  connection_reader reader = {
      .agent = agent, .link = served->link, .target = &target, .status = KEEL_OK};
  while (!stopping(agent)) {
    struct pollfd ready = {.fd = keel_link_fd(served->link), .events = POLLIN};
    int polled = poll(&ready, 1, POLL_MS);
    if (polled < 0 && errno != EINTR) break;
    if (polled <= 0) continue;
    keel_status status = connection_read(&reader);
    if (status != KEEL_OK) {
      if (status != KEEL_ECLOSED)
        KEEL_LOG_W(MODULE, "closed a connection from uid %" PRIu32 ": %s",
                   keel_link_peer_id(served->link), keel_strerror(status));
      break;
    }
  }
  copy_target_release(&target);
  atomic_store_explicit(&served->finished, true, memory_order_release);
  return NULL;
}

/* ---- accepting, and the heartbeat */

static void connections_reap(keel_ckpt_agent *agent, bool all) {
  pthread_mutex_lock(&agent->connections_lock);
  for (int i = 0; i < MAX_CONNECTIONS; i++) {
    connection *served = &agent->connections[i];
    if (!served->used) continue;
    if (!all && !atomic_load_explicit(&served->finished, memory_order_acquire)) continue;
    pthread_join(served->thread, NULL);
    keel_link_close(served->link);
    served->used = false;
  }
  pthread_mutex_unlock(&agent->connections_lock);
}

static void connection_start(keel_ckpt_agent *agent, keel_link *link) {
  connections_reap(agent, false);
  pthread_mutex_lock(&agent->connections_lock);
  connection *free_one = NULL;
  for (int i = 0; i < MAX_CONNECTIONS && free_one == NULL; i++)
    if (!agent->connections[i].used) free_one = &agent->connections[i];
  if (free_one != NULL) {
    *free_one = (connection){.agent = agent, .link = link, .used = true};
    keel_link_set_max_payload(link, KEEL_CKPT_MAX_CHUNK_BYTES);
    if (pthread_create(&free_one->thread, NULL, connection_main, free_one) != 0) {
      free_one->used = false;
      free_one = NULL;
    }
  }
  pthread_mutex_unlock(&agent->connections_lock);
  if (free_one == NULL) {
    KEEL_LOG_W(MODULE, "too many connections: one refused");
    keel_link_close(link);
  }
}

static void heartbeat_move(keel_ckpt_agent *agent) {
  keel__ckpt_heartbeat *page = agent->heartbeat.region.base;
  atomic_store_explicit(&page->agent_ns, keel_now_ns(), memory_order_release);
}

static void *accept_main(void *arg) {
  keel_ckpt_agent *agent = arg;
  while (!stopping(agent)) {
    heartbeat_move(agent);
    struct pollfd ready = {.fd = keel_listener_fd(agent->listener), .events = POLLIN};
    int polled = poll(&ready, 1, POLL_MS);
    if (polled <= 0) continue;
    keel_link *link = NULL;
    keel_status status = keel_listener_accept(agent->listener, &agent->auth,
                                              keel_deadline_after_ns(2 * SECOND_NS), &link);
    if (status == KEEL_OK) connection_start(agent, link);
  }
  return NULL;
}

/* ---- sending the node's snapshots to its peers */

static void peer_drop(peer *to) {
  keel_link_close(to->link);
  to->link = NULL;
}

/* The replicate thread's connection to the job's store, opened on first use. */
static bool store_ready(keel_ckpt_agent *agent) {
  return agent->store != NULL ||
         keel_store_connect(agent->store_endpoint, &agent->auth,
                            keel_deadline_after_ns(CONNECT_DEADLINE_NS), &agent->store) == KEEL_OK;
}

#define HOLDER_PREFIX "ckpt/holder/"

/* The service address in the store's prefix<node> (" ckpt=host:port" in its value). */
static bool peer_address_get(keel_ckpt_agent *agent, const char *prefix, uint32_t node,
                             char *address, size_t capacity) {
  char key[48];
  snprintf(key, sizeof key, "%s%" PRIu32, prefix, node);
  keel_store_entry *entry = NULL;
  if (keel_store_get(agent->store, key, &entry) != KEEL_OK) return false;
  bool found = keel__ckpt_agent_address_parse((const char *)entry->value, entry->value_length,
                                              address, capacity);
  keel_store_entry_free(entry);
  if (!found) address[0] = '\0';
  return found;
}

/* The peers of `node` in the placement: its holders but itself. */
static void peers_choose(keel_ckpt_agent *agent, uint32_t node) {
  uint32_t holders[KEEL_MODEL_PLACEMENT_MAX_REPLICAS];
  keel_model_placement_holders(&agent->placement, node, holders);
  for (uint32_t p = 0; p < agent->peer_count; p++) peer_drop(&agent->peers[p]);
  memset(agent->peers, 0, sizeof agent->peers);
  agent->peer_count = 0;
  for (uint32_t i = 0; i < agent->placement.replicas; i++)
    if (holders[i] != node) agent->peer_nodes[agent->peer_count++] = holders[i];
}

/* A spare node whose worker took rank r of node i = r / ranks_per_node takes node i's place:
 * its snapshots go where node i's went, and the nodes that sent copies to node i send them
 * here once they read ckpt/holder/<i> (within their next refresh). Else a node that replaced
 * a lost one would hold nobody's copies, and those nodes would keep one copy fewer. */
static void place_take(keel_ckpt_agent *agent, uint32_t rank) {
  if (agent->acting_node != UINT32_MAX || agent->ranks_per_node == 0) return;
  uint32_t node = rank / agent->ranks_per_node;
  if (node >= agent->nodes) return;
  agent->acting_node = node;
  peers_choose(agent, node);
  KEEL_LOG_I(MODULE, "node %" PRIu32 " takes node %" PRIu32 "'s place among the holders of copies",
             agent->node, node);
}

/* Says in the store that this node holds node acting_node's copies now (once). */
static void holder_publish(keel_ckpt_agent *agent) {
  if (agent->holder_published || agent->acting_node == UINT32_MAX ||
      agent->acting_node == agent->node || !store_ready(agent))
    return;
  char key[48], value[160];
  snprintf(key, sizeof key, HOLDER_PREFIX "%" PRIu32, agent->acting_node);
  snprintf(value, sizeof value, "node=%" PRIu32 " ckpt=%s", agent->node,
           keel_listener_address(agent->listener));
  keel_status status = keel_store_put(agent->store, key, value, strlen(value), 0, NULL);
  if (status == KEEL_OK)
    agent->holder_published = true;
  else
    KEEL_LOG_W(MODULE,
               "cannot say in the store that node %" PRIu32 " holds node %" PRIu32
               "'s copies: %s (tried again)",
               agent->node, agent->acting_node, keel_strerror(status));
}

/* The peers' addresses from their ckpt/holder/<i> or node/<i> keys; a peer whose address
 * changed (a node replaced) is reconnected. */
static void peers_refresh(keel_ckpt_agent *agent) {
  agent->peers_refreshed_ns = keel_now_ns();
  if (agent->peer_count == 0 || !store_ready(agent)) return;
  for (uint32_t i = 0; i < agent->peer_count; i++) {
    char address[128] = "";
    /* A spare node that took the peer's place first, else the peer's own service. */
    if (!peer_address_get(agent, HOLDER_PREFIX, agent->peer_nodes[i], address, sizeof address))
      peer_address_get(agent, "node/", agent->peer_nodes[i], address, sizeof address);
    if (strcmp(address, agent->peers[i].address) != 0) {
      peer_drop(&agent->peers[i]);
      snprintf(agent->peers[i].address, sizeof agent->peers[i].address, "%s", address);
    }
  }
}

/* --ckpt-persist-every DURATION: the agents must persist the same steps, or the fall back
 * finds no step of which every shard was written. So the duration becomes a step count once:
 * the first agent that has timed 20 of its workers' steps writes `ckpt/persist_every_steps`
 * (compare-and-swap on absent) and every agent then persists by that count. */
#define PERSIST_KEY "ckpt/persist_every_steps"
#define PERSIST_TIMED_STEPS 20
static void persist_interval_agree(keel_ckpt_agent *agent) {
  if (agent->persist_every_ns <= 0 || agent->persist_every_steps > 0 || !store_ready(agent)) return;
  keel_store_entry *entry = NULL;
  if (keel_store_get(agent->store, PERSIST_KEY, &entry) == KEEL_OK) {
    int64_t steps = 0;
    char text[32] = "";
    if (entry->value_length < sizeof text) memcpy(text, entry->value, entry->value_length);
    keel_store_entry_free(entry);
    if (keel_parse_int(text, 1, INT64_C(1) << 40, &steps) != KEEL_OK) return;
    agent->persist_every_steps = (uint64_t)steps;
    KEEL_LOG_I(MODULE, "persists every %" PRId64 " steps (about every %.0f s)", steps,
               (double)agent->persist_every_ns / 1e9);
    return;
  }
  if (agent->rank_count == 0) return;
  const keel__ckpt_control *control = agent->ranks[0].control.region.base;
  uint64_t step = atomic_load_explicit(&control->step, memory_order_acquire);
  int64_t begin = atomic_load_explicit(&control->step_begin_ns, memory_order_relaxed);
  if (agent->timed_steps == 0 || step < agent->timed_first_step) {
    agent->timed_first_step = step;
    agent->timed_first_ns = begin;
    agent->timed_steps = 1;
    return;
  }
  if (step - agent->timed_first_step < PERSIST_TIMED_STEPS || begin <= agent->timed_first_ns)
    return;
  double step_ns =
      (double)(begin - agent->timed_first_ns) / (double)(step - agent->timed_first_step);
  double steps = (double)agent->persist_every_ns / step_ns;
  char value[32];
  int length = snprintf(value, sizeof value, "%" PRIu64,
                        steps < 1.0 ? UINT64_C(1) : (uint64_t)(steps + 0.5));
  (void)keel_store_cas(agent->store, PERSIST_KEY, 0, value, (size_t)length, 0, NULL);
}

/* ---- the persistent tier, written from memory in the background */

/* By steps only (a duration becomes a count every agent agrees on), so that every shard is
 * written at the same steps. */
static bool persist_due(const keel_ckpt_agent *agent, uint64_t step) {
  return agent->persist_directory[0] != '\0' && agent->persist_every_steps > 0 &&
         step % agent->persist_every_steps == 0;
}

/* Copies the slot into the rank's staging buffer when the persist thread is done with the
 * last one (else this step is left out: training never waits for the disk). The copy is
 * checked in the persist thread. */
static void persist_stage(keel_ckpt_agent *agent, local_rank *local, int i, uint64_t step) {
  if (!persist_due(agent, step)) return;
  pthread_mutex_lock(&agent->persist_lock);
  bool busy = local->staged;
  pthread_mutex_unlock(&agent->persist_lock);
  if (busy) {
    KEEL_LOG_I(MODULE,
               "rank %" PRIu32 "'s step %" PRIu64 " not persisted: the last write is still going",
               local->rank, step);
    return;
  }
  const keel_ckpt_region *region = &local->slots[i].region;
  if (local->staging_bytes != region->bytes) {
    free(local->staging);
    local->staging = aligned_alloc(64, (region->bytes + 63) / 64 * 64);
    local->staging_bytes = local->staging != NULL ? region->bytes : 0;
    if (local->staging == NULL) return;
  }
  memcpy(local->staging, region->base, region->bytes);
  pthread_mutex_lock(&agent->persist_lock);
  local->staged = true;
  pthread_cond_signal(&agent->persist_wake);
  pthread_mutex_unlock(&agent->persist_lock);
}

/* The persistent save's file operations, with the mem_persist point just before the
 * manifest is renamed into place: every buffer file written, no manifest yet. */
static int persist_renameat(void *context, int directory, const char *from, const char *to) {
  keel_ckpt_agent *agent = context;
  if (strcmp(to, "manifest") == 0) fault_point(agent, "mem_persist", ++agent->persist_writes);
  return keel__ckpt_posix_file_ops.renameat(context, directory, from, to);
}

/* Writes a staged snapshot through the persistent tier's own save (files, manifest last,
 * atomic renames): a registry whose buffers point into the staged copy. A copy torn by a
 * rewrite of the slot fails its checksums here and is not written. */
static void persist_write(keel_ckpt_agent *agent, const local_rank *local) {
  keel_ckpt_region staged = {.base = local->staging, .bytes = local->staging_bytes};
  char reason[KEEL__CKPT_REASON_BYTES];
  keel_ckpt_identity identity;
  if (keel__ckpt_region_check(&staged, &identity, NULL, reason) != KEEL_OK) {
    KEEL_LOG_I(MODULE, "rank %" PRIu32 "'s staged snapshot not persisted: %s", local->rank, reason);
    return;
  }
  keel_ckpt_manifest manifest;
  const keel__ckpt_region_header *header = staged.base;
  if (keel_ckpt_manifest_decode((const uint8_t *)staged.base + KEEL__CKPT_HEADER_BYTES,
                                header->manifest_bytes, &manifest) != KEEL_OK)
    return;
  keel_registry *view = NULL;
  keel_status status = keel_registry_create(&view);
  uint8_t *data = (uint8_t *)staged.base + header->data_offset;
  for (uint32_t b = 0; status == KEEL_OK && b < manifest.buffer_count; b++) {
    status = keel_registry_add(view, manifest.buffers[b].name, data, manifest.buffers[b].bytes);
    data += manifest.buffers[b].bytes;
  }
  int64_t started = keel_now_ns();
  keel__ckpt_file_ops operations = keel__ckpt_posix_file_ops;
  operations.renameat = persist_renameat;
  reason[0] = '\0';
  if (status == KEEL_OK)
    status = keel__ckpt_persistent_save_with(&operations, agent, view, agent->persist_directory,
                                             &identity, manifest.chunk_bytes, reason);
  if (status != KEEL_OK)
    keel__ckpt_write_failed(&agent->persist_health, "persistent", agent->persist_directory, status,
                            reason);
  if (status == KEEL_OK) {
    keel__ckpt_write_succeeded(&agent->persist_health, "persistent");
    atomic_fetch_add(&agent->persisted, 1);
    atomic_fetch_add(&agent->persisted_bytes, manifest.total_bytes);
    atomic_fetch_add(&agent->persist_ns, keel_now_ns() - started);
    KEEL_LOG_I(MODULE, "persisted rank %" PRIu32 "'s step %" PRIu64 " (%" PRIu64 " bytes, %.1f ms)",
               identity.rank, identity.step, manifest.total_bytes,
               (double)(keel_now_ns() - started) / 1e6);
  }
  keel_registry_destroy(view);
  keel_ckpt_manifest_free(&manifest);
}

/* A staged rank, or NULL; called with the persist lock held. */
static local_rank *persist_next(keel_ckpt_agent *agent) {
  for (size_t r = 0; r < agent->rank_count; r++)
    if (agent->ranks[r].staged) return &agent->ranks[r];
  return NULL;
}

static void *persist_main(void *arg) {
  keel_ckpt_agent *agent = arg;
  pthread_mutex_lock(&agent->persist_lock);
  while (!stopping(agent)) {
    local_rank *local = persist_next(agent);
    if (local == NULL) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += 100 * 1000 * 1000;
      if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&agent->persist_wake, &agent->persist_lock, &until);
      continue;
    }
    pthread_mutex_unlock(&agent->persist_lock);
    persist_write(agent, local);
    pthread_mutex_lock(&agent->persist_lock);
    local->staged = false;
  }
  pthread_mutex_unlock(&agent->persist_lock);
  return NULL;
}

/* ---- one snapshot to its peers: offer, data in chunks scheduled into the worker's idle
 * windows (Gemini §5.3, Algorithm 2), commit */

/* Opens the link if need be and offers the snapshot: the peer answers once it has a slot. */
static keel_status push_offer(keel_ckpt_agent *agent, peer *to, uint32_t rank,
                              const keel_ckpt_region *region, const keel_ckpt_identity *identity,
                              int64_t deadline) {
  if (to->address[0] == '\0') return KEEL_ENOTFOUND;
  keel_status status = KEEL_OK;
  if (to->link == NULL) {
    status = keel__ckpt_connect(to->address, &agent->auth,
                                keel_deadline_after_ns(CONNECT_DEADLINE_NS), &to->link);
    if (status != KEEL_OK) return status;
  }
  keel__ckpt_request offer = {.op = KEEL__CKPT_OFFER,
                              .origin_rank = rank,
                              .shard_index = identity->shard_index,
                              .shard_count = identity->shard_count,
                              .step = identity->step,
                              .region_bytes = region->bytes};
  memcpy(offer.header, region->base, KEEL__CKPT_HEADER_BYTES);
  status = keel__ckpt_send_request(to->link, &offer, deadline);
  if (status == KEEL_OK)
    status = keel__ckpt_await_reply(to->link, KEEL__CKPT_OFFER, NULL, deadline);
  return status;
}

static keel_status push_commit(keel__ckpt_sender *sender, int64_t deadline) {
  keel_status status = keel__ckpt_sender_drain(sender, deadline);
  keel__ckpt_request commit = {.op = KEEL__CKPT_COMMIT};
  if (status == KEEL_OK) status = keel__ckpt_send_request(sender->link, &commit, deadline);
  if (status == KEEL_OK)
    status = keel__ckpt_await_reply(sender->link, KEEL__CKPT_COMMIT, NULL, deadline);
  return status;
}

/* The windows of the step in which a snapshot travels: the worker's profile, each shortened
 * by gamma for the spread between steps, the last unbounded. 0 without a profile. */
#define WINDOW_GAMMA 0.9
#define WINDOW_SLICE_NS (5 * 1000 * 1000)
static uint32_t windows_read(const keel__ckpt_control *control, int64_t *start, int64_t *span) {
  uint32_t count = atomic_load_explicit(&control->window_count, memory_order_acquire);
  if (count > KEEL__CKPT_MAX_WINDOWS) return 0;
  for (uint32_t w = 0; w < count; w++) {
    start[w] = control->window_start_ns[w];
    span[w] =
        w + 1 == count ? INT64_MAX : (int64_t)(WINDOW_GAMMA * (double)control->window_length_ns[w]);
  }
  return count;
}

/* Algorithm 2: how many bytes go in each window. A chunk of the largest size goes where its
 * time f(s) = alpha + s / beta fits what is left of the window; else one of the size that
 * fits; a window with no room for alpha takes nothing; the last takes the rest. */
static void schedule_make(const keel_ckpt_agent *agent, uint64_t total, uint32_t count,
                          const int64_t *span, uint64_t *bytes) {
  uint64_t remaining = total, largest = agent->config.chunk_bytes;
  for (uint32_t w = 0; w < count; w++) {
    bytes[w] = 0;
    if (w + 1 == count) {
      bytes[w] = remaining;
      break;
    }
    double left = (double)span[w];
    while (remaining > 0) {
      double room = (left - agent->alpha_ns) * agent->bytes_per_ns;
      if (room < 4096.0) break;
      uint64_t size = room >= (double)largest ? largest : (uint64_t)room;
      if (size > remaining) size = remaining;
      bytes[w] += size;
      remaining -= size;
      left -= agent->alpha_ns + (double)size / agent->bytes_per_ns;
    }
  }
}

/* Waits (briefly sleeping) until the worker's clock reaches the window in the step the
 * snapshot travels in (the one it is the start of: it may not have begun yet, the commit
 * still running), or that step has ended (then every window of it is past: the snapshot
 * goes now, the iteration's end being the last window). */
static void window_wait(keel_ckpt_agent *agent, const keel__ckpt_control *control, uint64_t step,
                        int64_t start_ns) {
  int64_t give_up = keel_deadline_after_ns(SECOND_NS);
  while (!stopping(agent) && keel_now_ns() < give_up) {
    uint64_t now_step = atomic_load_explicit(&control->step, memory_order_acquire);
    if (now_step > step) return;
    if (now_step < step) {
      struct timespec pause = {.tv_nsec = 100 * 1000};
      nanosleep(&pause, NULL);
      continue;
    }
    int64_t begin = atomic_load_explicit(&control->step_begin_ns, memory_order_relaxed);
    int64_t wait = begin + start_ns - keel_now_ns();
    if (wait <= 0) return;
    /* In slices, to see a step that ends early. */
    struct timespec pause = {.tv_nsec = wait < WINDOW_SLICE_NS ? wait : WINDOW_SLICE_NS};
    nanosleep(&pause, NULL);
  }
}

/* A snapshot's copies to `count` peers as one stream of (copies x data) bytes, cut into the
 * schedule's windows; copy c is peer c's. */
typedef struct transfer {
  keel_ckpt_agent *agent;
  peer **peers;
  keel_status *statuses;
  keel__ckpt_sender *senders;
  uint32_t count, copy;
  uint64_t data_bytes, copy_left;
  int64_t deadline;
  int64_t sending_ns; /* time spent sending, window waits left out */
} transfer;

static void transfer_send(transfer *move, uint64_t bytes) {
  keel_ckpt_agent *agent = move->agent;
  int64_t started = keel_now_ns();
  while (bytes > 0 && move->copy < move->count) {
    uint32_t c = move->copy;
    uint64_t piece = bytes < move->copy_left ? bytes : move->copy_left;
    if (piece > agent->config.chunk_bytes) piece = agent->config.chunk_bytes;
    if (move->statuses[c] == KEEL_OK) {
      move->statuses[c] = keel__ckpt_sender_send(&move->senders[c], piece, move->deadline);
      fault_point(agent, "mem_send", ++agent->chunks_sent);
    }
    bytes -= piece;
    move->copy_left -= piece;
    if (move->copy_left > 0) continue;
    if (move->statuses[c] == KEEL_OK)
      move->statuses[c] = push_commit(&move->senders[c], move->deadline);
    move->copy++;
    move->copy_left = move->data_bytes;
  }
  move->sending_ns += keel_now_ns() - started;
}

/* Learns f(s) = alpha + s / beta from a copy that went out whole: beta from its bytes and
 * time (a running mean), alpha stays at its floor. */
static void speed_learn(keel_ckpt_agent *agent, uint64_t bytes, int64_t elapsed_ns) {
  if (elapsed_ns <= 0 || bytes < agent->config.chunk_bytes) return;
  double measured = (double)bytes / (double)elapsed_ns;
  agent->bytes_per_ns = agent->speed_known ? 0.5 * agent->bytes_per_ns + 0.5 * measured : measured;
  agent->speed_known = true;
}

static void push_scheduled(keel_ckpt_agent *agent, local_rank *local, int i,
                           const keel_ckpt_identity *identity, keel_status *statuses) {
  const keel_ckpt_region *region = &local->slots[i].region;
  const keel__ckpt_control *control = local->control.region.base;
  int64_t deadline = keel_deadline_after_ns(CALL_DEADLINE_NS);
  peer *peers[KEEL_MODEL_PLACEMENT_MAX_REPLICAS];
  keel_status *status_of[KEEL_MODEL_PLACEMENT_MAX_REPLICAS];
  keel__ckpt_sender senders[KEEL_MODEL_PLACEMENT_MAX_REPLICAS];
  keel_status active_status[KEEL_MODEL_PLACEMENT_MAX_REPLICAS];
  uint32_t active = 0;
  for (uint32_t p = 0; p < agent->peer_count && !stopping(agent); p++) {
    statuses[p] = push_offer(agent, &agent->peers[p], local->rank, region, identity, deadline);
    if (statuses[p] != KEEL_OK) continue;
    peers[active] = &agent->peers[p];
    status_of[active] = &statuses[p];
    active_status[active] = KEEL_OK;
    keel__ckpt_sender_init(&senders[active], agent->peers[p].link, region, KEEL__CKPT_HEADER_BYTES,
                           agent->config.buffers);
    active++;
  }
  if (active == 0) return;
  transfer move = {.agent = agent,
                   .peers = peers,
                   .statuses = active_status,
                   .senders = senders,
                   .count = active,
                   .data_bytes = region->bytes - KEEL__CKPT_HEADER_BYTES,
                   .deadline = deadline};
  move.copy_left = move.data_bytes;
  int64_t start[KEEL__CKPT_MAX_WINDOWS], span[KEEL__CKPT_MAX_WINDOWS];
  uint64_t bytes[KEEL__CKPT_MAX_WINDOWS];
  uint32_t count = windows_read(control, start, span);
  uint64_t total = move.data_bytes * active;
  if (count == 0) {
    transfer_send(&move, total);
  } else {
    schedule_make(agent, total, count, span, bytes);
    for (uint32_t w = 0; w < count && !stopping(agent); w++) {
      if (bytes[w] == 0) continue;
      window_wait(agent, control, identity->step, start[w]);
      transfer_send(&move, bytes[w]);
    }
  }
  speed_learn(agent, total, move.sending_ns);
  for (uint32_t a = 0; a < active; a++) {
    *status_of[a] = active_status[a];
    if (active_status[a] != KEEL_OK && active_status[a] != KEEL_ECORRUPT) peer_drop(peers[a]);
  }
}

static void push_slot(keel_ckpt_agent *agent, local_rank *local, int i, uint64_t seal) {
  keel__ckpt_control *control = local->control.region.base;
  keel_ckpt_identity identity;
  uint64_t seen = 0;
  if (keel__ckpt_region_identity(&local->slots[i].region, &identity, &seen) != KEEL_OK ||
      seen != seal)
    return; /* being rewritten: the next look sends the new one */
  keel_status statuses[KEEL_MODEL_PLACEMENT_MAX_REPLICAS];
  push_scheduled(agent, local, i, &identity, statuses);
  persist_stage(agent, local, i, identity.step);
  bool all = true;
  for (uint32_t p = 0; p < agent->peer_count && !stopping(agent); p++) {
    keel_status status = statuses[p];
    if (status == KEEL_OK) {
      atomic_fetch_add(&agent->sent, 1);
      agent->peers[p].failing = false;
      continue;
    }
    all = false;
    /* A peer not registered yet (the job's first steps) is no news; one that fails is. */
    if (!agent->peers[p].failing && status == KEEL_ENOTFOUND)
      KEEL_LOG_I(MODULE,
                 "node %" PRIu32 " has no snapshot service yet: rank %" PRIu32
                 "'s copy of step %" PRIu64 " waits for the next",
                 agent->peer_nodes[p], local->rank, identity.step);
    else if (!agent->peers[p].failing)
      KEEL_LOG_W(MODULE,
                 "rank %" PRIu32 "'s snapshot of step %" PRIu64 " did not reach node %" PRIu32
                 ": %s (said once until a copy reaches it again)",
                 local->rank, identity.step, agent->peer_nodes[p], keel_strerror(status));
    agent->peers[p].failing = true;
  }
  if (!all) peers_refresh(agent);
  /* A peer that is down does not hold training back: the slot is free either way, and the
   * copies that did land count. */
  if (keel__ckpt_region_seal(&local->slots[i].region) != seal) return;
  local->pushed[i] = seal;
  atomic_store_explicit(&control->replicated[i], seal, memory_order_release);
  keel__ckpt_futex_ring(&control->replicated_sequence);
}

static void local_rank_close(local_rank *local) {
  for (int i = 0; i < KEEL__CKPT_OWN_SLOTS; i++) keel__ckpt_slot_close(&local->slots[i]);
  keel__ckpt_slot_close(&local->control);
  free(local->staging);
}

/* Finds the ranks whose control page is in the folder and maps their slots. */
static void ranks_rescan(keel_ckpt_agent *agent) {
  agent->rescanned_ns = keel_now_ns();
  DIR *folder = opendir(agent->directory);
  if (folder == NULL) return;
  struct dirent *entry;
  while ((entry = readdir(folder)) != NULL && agent->rank_count < MAX_RANKS) {
    unsigned rank = 0;
    char tail[16];
    if (sscanf(entry->d_name, "rank-%u.%15s", &rank, tail) != 2 || strcmp(tail, "control") != 0)
      continue;
    bool known = false;
    for (size_t i = 0; i < agent->rank_count && !known; i++) known = agent->ranks[i].rank == rank;
    if (known) continue;
    local_rank local = {.rank = rank};
    char name[64];
    bool opened =
        keel__ckpt_slot_open(agent->directory, entry->d_name, 0, &local.control) == KEEL_OK;
    for (int i = 0; opened && i < KEEL__CKPT_OWN_SLOTS; i++) {
      snprintf(name, sizeof name, "rank-%u.slot-%d", rank, i);
      opened = keel__ckpt_slot_open(agent->directory, name, 0, &local.slots[i]) == KEEL_OK;
      if (!opened) {
        for (int j = 0; j < i; j++) keel__ckpt_slot_close(&local.slots[j]);
        keel__ckpt_slot_close(&local.control);
      }
    }
    if (opened && local.control.region.bytes >= sizeof(keel__ckpt_control)) {
      pthread_mutex_lock(&agent->persist_lock);
      agent->ranks[agent->rank_count++] = local;
      pthread_mutex_unlock(&agent->persist_lock);
      place_take(agent, rank);
    }
  }
  closedir(folder);
}

static bool replicate_once(keel_ckpt_agent *agent) {
  bool worked = false;
  for (size_t r = 0; r < agent->rank_count && !stopping(agent); r++) {
    local_rank *local = &agent->ranks[r];
    for (int i = 0; i < KEEL__CKPT_OWN_SLOTS; i++) {
      uint64_t seal = keel__ckpt_region_seal(&local->slots[i].region);
      if (seal == 0 || seal % 2 != 0 || seal == local->pushed[i]) continue;
      push_slot(agent, local, i, seal);
      worked = true;
    }
  }
  return worked;
}

static void *replicate_main(void *arg) {
  keel_ckpt_agent *agent = arg;
  keel__ckpt_heartbeat *page = agent->heartbeat.region.base;
  while (!stopping(agent)) {
    uint32_t rung = atomic_load_explicit(&page->doorbell, memory_order_acquire);
    int64_t now = keel_now_ns();
    if (now - agent->rescanned_ns >= RESCAN_EVERY_NS) ranks_rescan(agent);
    if (now - agent->peers_refreshed_ns >= PEERS_REFRESH_NS) {
      holder_publish(agent);
      peers_refresh(agent);
      persist_interval_agree(agent);
    }
    /* Asleep until a worker seals a snapshot (the doorbell), or the next rescan. */
    if (replicate_once(agent)) continue;
    if (atomic_load_explicit(&page->doorbell, memory_order_acquire) != rung) {
      agent->rescanned_ns = 0; /* rung, yet nothing known to send: a new rank's slots */
      continue;
    }
    keel__ckpt_futex_wait(&page->doorbell, rung, RESCAN_EVERY_NS);
  }
  return NULL;
}

/* ---- the public face */

static keel_status agent_configure(keel_ckpt_agent *agent, const keel_ckpt_agent_options *options) {
  agent->auth = options->auth;
  agent->node = options->node;
  agent->nodes = options->nodes;
  agent->config = options->config;
  agent->alpha_ns = 50e3;    /* a frame's round trip on a loaded host, about */
  agent->bytes_per_ns = 1.0; /* 1 GB/s until a copy has been timed */
  if (options->directory == NULL || strlen(options->directory) >= sizeof agent->directory ||
      options->store == NULL || strlen(options->store) >= sizeof agent->store_endpoint ||
      options->host == NULL || options->nodes == 0)
    return KEEL_EINVAL;
  snprintf(agent->directory, sizeof agent->directory, "%s", options->directory);
  snprintf(agent->store_endpoint, sizeof agent->store_endpoint, "%s", options->store);
  if (options->persist_directory != NULL) {
    if (strlen(options->persist_directory) >= sizeof agent->persist_directory) return KEEL_EINVAL;
    snprintf(agent->persist_directory, sizeof agent->persist_directory, "%s",
             options->persist_directory);
    agent->persist_every_steps = options->persist_every_steps;
    agent->persist_every_ns = options->persist_every_ns;
  }
  uint32_t replicas =
      options->config.replicas < options->nodes ? options->config.replicas : options->nodes;
  keel_status status = keel_model_placement_make(options->nodes, replicas, &agent->placement);
  if (status != KEEL_OK) return status;
  agent->ranks_per_node = options->ranks_per_node;
  /* A node past the job's nodes (a spare node, a late one) sends where the node of its index
   * modulo the nodes sends, until a spare node takes a lost node's place. */
  agent->acting_node = options->node < options->nodes ? options->node : UINT32_MAX;
  peers_choose(agent, options->node % options->nodes);
  return KEEL_OK;
}

keel_status keel_ckpt_agent_start(const keel_ckpt_agent_options *options,
                                  keel_ckpt_agent **agent_p) {
  if (options == NULL || agent_p == NULL) return KEEL_EINVAL;
  keel_ckpt_agent *agent = calloc(1, sizeof *agent);
  if (agent == NULL) return KEEL_ENOMEM;
  agent->ranks = calloc(MAX_RANKS, sizeof *agent->ranks);
  keel_status status = agent->ranks == NULL ? KEEL_ENOMEM : agent_configure(agent, options);
  if (status != KEEL_OK) goto fail_free;
  pthread_mutex_init(&agent->connections_lock, NULL);
  pthread_mutex_init(&agent->persist_lock, NULL);
  pthread_mutex_init(&agent->fault_lock, NULL);
  /* Rules for workers (rank=, uid=) never match the agent's uid. */
  if ((status = keel_fault_plan_create(getenv("KEEL_FAULT"), UINT32_MAX, &agent->faults)) !=
      KEEL_OK)
    goto fail_free;
  keel_fault_plan_set_node(agent->faults, options->node);
  pthread_cond_init(&agent->persist_wake, NULL);
  if ((status = keel_directory_make(agent->directory, 0700)) != KEEL_OK) goto fail_free;
  agent->heartbeat.file = -1;
  status = keel__ckpt_slot_open(agent->directory, KEEL__CKPT_HEARTBEAT_NAME,
                                sizeof(keel__ckpt_heartbeat), &agent->heartbeat);
  if (status != KEEL_OK) goto fail_free;
  heartbeat_move(agent);
  char address[160];
  snprintf(address, sizeof address, "%s:0", options->host);
  if ((status = keel_listener_open(address, &agent->listener)) != KEEL_OK)
    goto fail_close_heartbeat;
  if (pthread_create(&agent->accept_thread, NULL, accept_main, agent) != 0) {
    status = KEEL_ENOMEM;
    goto fail_close_listener;
  }
  agent->accept_started = true;
  if (pthread_create(&agent->replicate_thread, NULL, replicate_main, agent) != 0) {
    status = KEEL_ENOMEM;
    keel_ckpt_agent_stop(agent);
    return status;
  }
  agent->replicate_started = true;
  if (agent->persist_directory[0] != '\0') {
    if (pthread_create(&agent->persist_thread, NULL, persist_main, agent) != 0) {
      keel_ckpt_agent_stop(agent);
      return KEEL_ENOMEM;
    }
    agent->persist_started = true;
  }
  *agent_p = agent;
  return KEEL_OK;

fail_close_listener:
  keel_listener_close(agent->listener);
fail_close_heartbeat:
  keel__ckpt_slot_close(&agent->heartbeat);
fail_free:
  KEEL_LOG_E(MODULE, "cannot start the snapshot service of node %" PRIu32 ": %s", options->node,
             keel_strerror(status));
  keel_fault_plan_destroy(agent->faults);
  free(agent->ranks);
  free(agent);
  return status;
}

const char *keel_ckpt_agent_address(const keel_ckpt_agent *agent) {
  return keel_listener_address(agent->listener);
}

void keel_ckpt_agent_stats_get(const keel_ckpt_agent *agent, keel_ckpt_agent_stats *stats_p) {
  *stats_p = (keel_ckpt_agent_stats){.sent = agent->sent,
                                     .received = agent->received,
                                     .persisted = agent->persisted,
                                     .persisted_bytes = agent->persisted_bytes,
                                     .persist_ns = agent->persist_ns,
                                     .persist_failed = agent->persist_health.failed,
                                     .persist_last_status = agent->persist_health.last_status};
}

void keel_ckpt_agent_stop(keel_ckpt_agent *agent) {
  if (agent == NULL) return;
  atomic_store_explicit(&agent->stopping, true, memory_order_release);
  if (agent->accept_started) pthread_join(agent->accept_thread, NULL);
  if (agent->replicate_started) pthread_join(agent->replicate_thread, NULL);
  if (agent->persist_started) pthread_join(agent->persist_thread, NULL);
  connections_reap(agent, true);
  for (uint32_t i = 0; i < agent->peer_count; i++) peer_drop(&agent->peers[i]);
  for (size_t r = 0; r < agent->rank_count; r++) local_rank_close(&agent->ranks[r]);
  keel_store_close(agent->store);
  keel_listener_close(agent->listener);
  keel__ckpt_slot_close(&agent->heartbeat);
  pthread_mutex_destroy(&agent->connections_lock);
  pthread_mutex_destroy(&agent->persist_lock);
  pthread_mutex_destroy(&agent->fault_lock);
  keel_fault_plan_destroy(agent->faults);
  pthread_cond_destroy(&agent->persist_wake);
  free(agent->ranks);
  free(agent);
}
