/* The progress engine: one poll loop over every link of the endpoint. It writes queued
 * frames, reads frames into the receives that operations posted (or keeps them aside until
 * one is posted), spreads revocations, and turns a closed link into a failed peer at once.
 * Operations are independent: each has its own slots and sends, so a background transfer
 * moves while a collective waits, and abandoning one leaves the others whole. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_internal.h"

#define MODULE "progress"
void keel__peer_fail(keel_endpoint *endpoint, keel__peer *peer, const char *reason) {
  if (peer->failed) return;
  peer->failed = true;
  if (peer->left) return;
  KEEL_LOG_I(MODULE, "uid %u failed: %s", peer->uid, reason);
  /* The membership queues the news (the failure detector tells the job, which fences the
   * peer); nothing here waits on the store. */
  const keel_endpoint_config *config = &endpoint->config;
  if (config->membership != NULL && config->membership->suspect != NULL)
    config->membership->suspect(config->membership_context, peer->uid, reason);
}

/* ---- sending */

static void send_item_finish(keel__peer *peer) {
  keel__send_item *item = peer->queue_head;
  peer->queue_head = item->next;
  if (peer->queue_head == NULL) peer->queue_tail = NULL;
  peer->in_flight = false;
  if (item->op != NULL) item->op->sends_pending--;
  free(item->owned);
  free(item);
}

/* Every send of a failed peer's queue fails its operation. */
static void peer_fail_sends(keel__peer *peer) {
  for (keel__send_item *item = peer->queue_head; item != NULL; item = item->next) {
    if (item->op == NULL) continue;
    item->op->send_error = KEEL_EPROCFAILED;
  }
}

/* When the head of the peer's queue may be written: 0 for now, else the end of its delay
 * (keel_endpoint_delay_sends). */
static int64_t peer_held_until(const keel__peer *peer) {
  const keel__send_item *item = peer->queue_head;
  if (item == NULL || peer->in_flight || item->held_until_ns == 0) return 0;
  return keel_now_ns() < item->held_until_ns ? item->held_until_ns : 0;
}

/* Writes as much of the peer's queue as the socket takes. */
static void peer_push(keel_endpoint *endpoint, keel__peer *peer) {
  while (peer->queue_head != NULL && peer->link != NULL && !peer->failed) {
    keel__send_item *item = peer->queue_head;
    keel_status status;
    if (peer_held_until(peer) != 0) return;
    if (!peer->in_flight) {
      status = keel_link_send_begin(peer->link, &item->frame, item->payload, item->length);
      if (status != KEEL_OK) {
        keel__peer_fail(endpoint, peer, "send failed");
        break;
      }
      peer->in_flight = true;
    }
    status = keel_link_send_progress(peer->link);
    if (status == KEEL_EAGAIN) return;
    if (status != KEEL_OK) {
      keel__peer_fail(endpoint, peer, keel_strerror(status));
      break;
    }
    send_item_finish(peer);
  }
  if (peer->failed) peer_fail_sends(peer);
}

static keel_status enqueue(keel_endpoint *endpoint, uint32_t uid, keel__op *op, uint16_t type,
                           uint64_t epoch, uint64_t tag, const void *payload, size_t length) {
  keel__peer *peer = keel__peer_get(endpoint, uid);
  if (peer == NULL) return KEEL_ENOMEM;
  if (peer->failed || peer->link == NULL) return KEEL_EPROCFAILED;
  keel__send_item *item = calloc(1, sizeof *item);
  if (item == NULL) return KEEL_ENOMEM;
  item->frame.type = type;
  item->frame.epoch = epoch;
  item->frame.tag = tag;
  item->payload = payload;
  item->length = length;
  item->op = op;
  int64_t delay = atomic_load(&endpoint->send_delay_ns);
  if (delay > 0) item->held_until_ns = keel_now_ns() + delay;
  if (op != NULL) op->sends_pending++;
  if (peer->queue_tail)
    peer->queue_tail->next = item;
  else
    peer->queue_head = item;
  peer->queue_tail = item;
  peer_push(endpoint, peer);
  return peer->failed ? KEEL_EPROCFAILED : KEEL_OK;
}

keel_status keel__op_send(keel__op *op, uint32_t uid, uint16_t type, uint64_t epoch, uint64_t tag,
                          const void *payload, size_t length) {
  keel_status status = enqueue(op->endpoint, uid, op, type, epoch, tag, payload, length);
  if (status != KEEL_OK && op->send_error == KEEL_OK) op->send_error = status;
  return status;
}

keel_status keel__send_control(keel_endpoint *endpoint, uint32_t uid, uint16_t type,
                               uint64_t epoch) {
  return enqueue(endpoint, uid, NULL, type, epoch, 0, NULL, 0);
}

/* ---- operations */

static void slots_release(keel__op *op);

void keel__op_begin(keel_endpoint *endpoint, keel__op *op) {
  op->endpoint = endpoint;
  slots_release(op);
  op->sends_pending = 0;
  op->send_error = KEEL_OK;
  op->active = true;
  op->previous = NULL;
  op->next = endpoint->operations;
  if (op->next != NULL) op->next->previous = op;
  endpoint->operations = op;
}

static void op_unlink(keel__op *op) {
  keel_endpoint *endpoint = op->endpoint;
  if (op->previous != NULL)
    op->previous->next = op->next;
  else
    endpoint->operations = op->next;
  if (op->next != NULL) op->next->previous = op->previous;
  op->next = op->previous = NULL;
  op->active = false;
}

void keel__op_free(keel__op *op) {
  slots_release(op);
  free(op->slots);
  op->slots = NULL;
  op->slot_capacity = op->slot_count = 0;
}

static bool slot_matches(const keel__recv_slot *slot, const keel_frame *frame) {
  return !slot->done && slot->type == frame->type && slot->source == frame->source &&
         slot->epoch == frame->epoch && slot->tag == frame->tag;
}

/* Completes slot with frame's payload; true when the slot adopted payload (a buffer of the
 * endpoint's, not the destination), which the caller must then not free. */
static bool slot_fill(keel__recv_slot *slot, const keel_frame *frame, void *payload) {
  bool adopted = false;
  slot->data = slot->destination;
  if (frame->length != slot->length) {
    slot->status = KEEL_EPROTO;
  } else {
    bool elsewhere = payload != slot->destination && slot->length > 0;
    adopted = elsewhere && slot->adopts;
    if (adopted)
      slot->data = slot->adopted = payload;
    else if (elsewhere)
      memcpy(slot->destination, payload, slot->length);
    slot->status = KEEL_OK;
  }
  slot->done = true;
  return adopted;
}

/* The buffers the op's slots adopted go with it. */
static void slots_release(keel__op *op) {
  for (size_t i = 0; i < op->slot_count; i++) {
    free(op->slots[i].adopted);
    op->slots[i].adopted = NULL;
  }
  op->slot_count = 0;
}

static keel_status post_recv(keel__op *op, uint16_t type, uint32_t source, uint64_t epoch,
                             uint64_t tag, void *destination, size_t length, bool adopts,
                             size_t *index_p) {
  if (op->slot_count == op->slot_capacity) {
    size_t grown = op->slot_capacity ? op->slot_capacity * 2 : 64;
    keel__recv_slot *slots = realloc(op->slots, grown * sizeof *slots);
    if (slots == NULL) return KEEL_ENOMEM;
    op->slots = slots;
    op->slot_capacity = grown;
  }
  size_t index = op->slot_count++;
  keel__recv_slot *slot = &op->slots[index];
  *slot = (keel__recv_slot){.type = type,
                            .source = source,
                            .epoch = epoch,
                            .tag = tag,
                            .destination = destination,
                            .length = length,
                            .adopts = adopts};
  /* It may have arrived already. */
  keel_endpoint *endpoint = op->endpoint;
  for (keel__unexpected **link = &endpoint->unexpected_head; *link != NULL; link = &(*link)->next) {
    keel__unexpected *waiting = *link;
    if (!slot_matches(slot, &waiting->frame)) continue;
    if (!slot_fill(slot, &waiting->frame, waiting->payload)) free(waiting->payload);
    *link = waiting->next;
    free(waiting);
    break;
  }
  if (index_p != NULL) *index_p = index;
  return KEEL_OK;
}

keel_status keel__op_post_recv(keel__op *op, uint16_t type, uint32_t source, uint64_t epoch,
                               uint64_t tag, void *destination, size_t length, size_t *index_p) {
  return post_recv(op, type, source, epoch, tag, destination, length, false, index_p);
}

keel_status keel__op_post_recv_adopting(keel__op *op, uint16_t type, uint32_t source,
                                        uint64_t epoch, uint64_t tag, void *destination,
                                        size_t length, size_t *index_p) {
  return post_recv(op, type, source, epoch, tag, destination, length, true, index_p);
}

bool keel__op_complete(const keel__op *op) {
  if (op->sends_pending != 0) return false;
  for (size_t i = 0; i < op->slot_count; i++) {
    if (!op->slots[i].done) return false;
  }
  return true;
}

keel_status keel__op_slot_error(const keel__op *op) {
  for (size_t i = 0; i < op->slot_count; i++) {
    if (op->slots[i].done && op->slots[i].status != KEEL_OK) return op->slots[i].status;
  }
  return KEEL_OK;
}

void keel__op_end(keel__op *op) {
  if (!op->active) return;
  op_unlink(op);
  slots_release(op);
}

/* Lets go of the op's sends on one peer: a frame half written is finished from a copy (the
 * stream must stay in frame order, but the caller's buffer is about to be reused), queued
 * frames that are the op's alone are dropped. */
static void peer_abandon_sends(keel_endpoint *endpoint, keel__peer *peer, keel__op *op) {
  if (peer->in_flight && peer->queue_head->op == op && peer->link != NULL && !peer->failed) {
    if (keel_link_send_detach(peer->link) != KEEL_OK) keel__peer_fail(endpoint, peer, "detach");
  }
  keel__send_item **link = &peer->queue_head;
  keel__send_item *last = NULL;
  while (*link != NULL) {
    keel__send_item *item = *link;
    bool head_in_flight = item == peer->queue_head && peer->in_flight;
    if (item->op != op) {
      last = item;
      link = &item->next;
      continue;
    }
    item->op = NULL;
    if ((head_in_flight && !peer->failed) || item->owned != NULL || item->payload == NULL) {
      if (head_in_flight) item->payload = NULL; /* the link holds the detached copy */
      last = item;
      link = &item->next;
    } else {
      *link = item->next;
      free(item);
    }
  }
  peer->queue_tail = last;
  if (peer->inbound_op == op) {
    if (peer->link != NULL && !peer->failed) keel_link_recv_abandon(peer->link);
    peer->inbound_op = NULL;
  }
}

void keel__op_abandon(keel__op *op) {
  if (!op->active) return;
  keel_endpoint *endpoint = op->endpoint;
  /* Failed peers stay in the list until their link is closed, so this sees every queue. */
  for (size_t i = 0; i < endpoint->linked_count; i++)
    peer_abandon_sends(endpoint, endpoint->linked[i], op);
  op->sends_pending = 0;
  op_unlink(op);
  slots_release(op);
}

/* ---- receiving */

void keel__drop_stale_unexpected(keel_endpoint *endpoint, uint64_t below_epoch) {
  keel__unexpected **link = &endpoint->unexpected_head;
  while (*link != NULL) {
    keel__unexpected *waiting = *link;
    if (waiting->frame.epoch < below_epoch) {
      *link = waiting->next;
      free(waiting->payload);
      free(waiting);
    } else {
      link = &waiting->next;
    }
  }
}

void keel__note_revoke(keel_endpoint *endpoint, uint64_t epoch) {
  if (endpoint->any_revoked && epoch <= endpoint->revoked_epoch) return;
  endpoint->any_revoked = true;
  endpoint->revoked_epoch = epoch;
  KEEL_LOG_D(MODULE, "epoch %" PRIu64 " revoked", epoch);
  /* Reliable broadcast (as ULFM does it): whoever learns of a revocation first passes it on,
   * so it reaches every member even if the one who revoked dies halfway through. */
  keel_comm *comm = endpoint->current;
  if (comm == NULL || comm->epoch != epoch) return;
  for (int rank = 0; rank < comm->size; rank++) {
    if (rank == comm->rank) continue;
    keel__send_control(endpoint, comm->uids[rank], KEEL_FRAME_REVOKE, epoch);
  }
}

/* Finds the active operation's slot that frame goes to. */
static bool find_slot(keel_endpoint *endpoint, const keel_frame *frame, keel__op **op_p,
                      size_t *index_p) {
  for (keel__op *op = endpoint->operations; op != NULL; op = op->next) {
    for (size_t i = 0; i < op->slot_count; i++) {
      if (!slot_matches(&op->slots[i], frame)) continue;
      *op_p = op;
      *index_p = i;
      return true;
    }
  }
  return false;
}

static void *on_frame_header(void *context, keel_link *link, const keel_frame *frame) {
  keel_endpoint *endpoint = context;
  keel__peer *peer = keel__peer_find(endpoint, keel_link_peer_id(link));
  keel__op *op = NULL;
  size_t index = 0;
  bool found = find_slot(endpoint, frame, &op, &index);
  if (peer != NULL) {
    peer->inbound_op = found ? op : NULL;
    peer->inbound_index = index;
  }
  if (!found || op->slots[index].length != frame->length) return NULL;
  return op->slots[index].destination;
}

static void stash_unexpected(keel_endpoint *endpoint, const keel_frame *frame, void *payload) {
  keel_comm *comm = endpoint->current;
  if (comm != NULL && frame->epoch < comm->epoch) {
    free(payload); /* an abandoned epoch's data: nobody will ask for it */
    return;
  }
  keel__unexpected *waiting = malloc(sizeof *waiting);
  if (waiting == NULL) {
    free(payload);
    return;
  }
  waiting->frame = *frame;
  waiting->payload = payload;
  waiting->next = NULL;
  keel__unexpected **tail = &endpoint->unexpected_head;
  while (*tail != NULL) tail = &(*tail)->next;
  *tail = waiting;
}

static void on_frame_complete(void *context, keel_link *link, const keel_frame *frame,
                              void *payload, keel_status status) {
  keel_endpoint *endpoint = context;
  keel__peer *peer = keel__peer_find(endpoint, keel_link_peer_id(link));
  keel__op *inbound_op = peer ? peer->inbound_op : NULL;
  keel__recv_slot *inbound = inbound_op ? &inbound_op->slots[peer->inbound_index] : NULL;
  if (peer) peer->inbound_op = NULL;
  if (status != KEEL_OK) {
    if (inbound == NULL || payload != inbound->destination) free(payload);
    return;
  }
  switch (frame->type) {
    case KEEL_FRAME_REVOKE:
      free(payload);
      keel__note_revoke(endpoint, frame->epoch);
      return;
    case KEEL_FRAME_GOODBYE:
      free(payload);
      if (peer) peer->left = true;
      return;
    default:
      break;
  }
  if (inbound != NULL && payload == inbound->destination) {
    slot_fill(inbound, frame, payload);
    return;
  }
  keel__op *op = NULL;
  size_t index = 0;
  if (find_slot(endpoint, frame, &op, &index)) {
    if (!slot_fill(&op->slots[index], frame, payload)) free(payload);
    return;
  }
  stash_unexpected(endpoint, frame, payload);
}

static void peer_pull(keel_endpoint *endpoint, keel__peer *peer) {
  keel_link_sink sink = {on_frame_header, on_frame_complete, endpoint};
  keel_status status = keel_link_recv_progress(peer->link, &sink);
  if (status == KEEL_EAGAIN) return;
  keel__peer_fail(endpoint, peer, status == KEEL_ECLOSED ? "link closed" : keel_strerror(status));
  peer_fail_sends(peer);
}

/* ---- the poll list */

static keel_status poll_list_reserve(keel_endpoint *endpoint, size_t count) {
  if (count <= endpoint->poll_capacity) return KEEL_OK;
  size_t grown = endpoint->poll_capacity ? endpoint->poll_capacity * 2 : 16;
  while (grown < count) grown *= 2;
  struct pollfd *pollers = realloc(endpoint->pollers, grown * sizeof *pollers);
  if (pollers == NULL) return KEEL_ENOMEM;
  endpoint->pollers = pollers;
  keel__peer **owners = realloc(endpoint->poll_owners, grown * sizeof *owners);
  if (owners == NULL) return KEEL_ENOMEM;
  endpoint->poll_owners = owners;
  endpoint->poll_capacity = grown;
  return KEEL_OK;
}

void keel__peer_linked(keel_endpoint *endpoint, keel__peer *peer) {
  if (endpoint->linked_count == endpoint->linked_capacity) {
    size_t grown = endpoint->linked_capacity ? endpoint->linked_capacity * 2 : 16;
    keel__peer **linked = realloc(endpoint->linked, grown * sizeof *linked);
    /* Without room in the list the peer is not polled: treat it as failed, never lose it. */
    if (linked == NULL || poll_list_reserve(endpoint, grown + 1) != KEEL_OK) {
      if (linked != NULL) endpoint->linked = linked;
      keel__peer_fail(endpoint, peer, "out of memory");
      return;
    }
    endpoint->linked = linked;
    endpoint->linked_capacity = grown;
  }
  peer->linked_index = endpoint->linked_count;
  endpoint->linked[endpoint->linked_count++] = peer;
}

void keel__peer_unlinked(keel_endpoint *endpoint, keel__peer *peer) {
  size_t index = peer->linked_index;
  if (index >= endpoint->linked_count || endpoint->linked[index] != peer) return;
  keel__peer *last = endpoint->linked[--endpoint->linked_count];
  endpoint->linked[index] = last;
  last->linked_index = index;
  peer->linked_index = SIZE_MAX;
}

/* ---- the loop */

/* Starts the frames whose delay ended: they asked for no POLLOUT while held. */
static void release_held_frames(keel_endpoint *endpoint) {
  for (size_t i = 0; i < endpoint->linked_count; i++) {
    keel__peer *peer = endpoint->linked[i];
    if (!peer->failed && peer->queue_head != NULL && !peer->in_flight) peer_push(endpoint, peer);
  }
}

keel_status keel__progress(keel_endpoint *endpoint, int64_t deadline_ns) {
  if (poll_list_reserve(endpoint, endpoint->linked_count + 1) != KEEL_OK) return KEEL_ENOMEM;
  struct pollfd *pollers = endpoint->pollers;
  keel__peer **owners = endpoint->poll_owners;
  nfds_t count = 0;
  if (endpoint->wake_fd >= 0) {
    pollers[count] = (struct pollfd){.fd = endpoint->wake_fd, .events = POLLIN};
    owners[count++] = NULL;
  }
  int64_t first_release = 0; /* the earliest end of a held frame's delay */
  for (size_t i = 0; i < endpoint->linked_count; i++) {
    keel__peer *peer = endpoint->linked[i];
    if (peer->failed) continue;
    short events = POLLIN;
    int64_t held_until = peer_held_until(peer);
    if (held_until != 0 && (first_release == 0 || held_until < first_release))
      first_release = held_until;
    else if (peer->queue_head != NULL && held_until == 0)
      events |= POLLOUT;
    pollers[count] = (struct pollfd){.fd = keel_link_fd(peer->link), .events = events};
    owners[count++] = peer;
  }
  int64_t wake = deadline_ns;
  if (first_release != 0 && deadline_ns != 0 && first_release < deadline_ns) wake = first_release;
  int ready = poll(pollers, count, wake == 0 ? 0 : keel_poll_timeout_ms(wake));
  if (first_release != 0) release_held_frames(endpoint);
  if (ready <= 0) return ready == 0 ? KEEL_EAGAIN : KEEL_OK;
  bool links_waiting = false;
  for (nfds_t i = 0; i < count; i++) {
    if (pollers[i].revents == 0) continue;
    keel__peer *peer = owners[i];
    if (peer == NULL) {
      links_waiting = true;
      continue;
    }
    if (pollers[i].revents & (POLLIN | POLLHUP | POLLERR)) peer_pull(endpoint, peer);
    if (!peer->failed && (pollers[i].revents & POLLOUT)) peer_push(endpoint, peer);
  }
  /* Last: taking links in may grow the poll list, which moves the arrays read above (a
   * job whose spares came back linked past the list's room and crashed here). */
  if (links_waiting) keel__take_accepted_links(endpoint);
  return KEEL_OK;
}

keel_status keel__interrupted(keel_endpoint *endpoint) {
  const keel_endpoint_config *config = &endpoint->config;
  if (config->membership == NULL || config->membership->interrupted == NULL) return KEEL_OK;
  return config->membership->interrupted(config->membership_context);
}

bool keel__deadline_passed(keel_comm *comm, int64_t *deadline_ns) {
  int64_t now = keel_now_ns();
  if (now < *deadline_ns) return false;
  const keel_endpoint_config *config = &comm->endpoint->config;
  if (config->membership == NULL || config->membership->sections_until == NULL) return true;
  int64_t until = config->membership->sections_until(config->membership_context);
  if (until <= 0) return true;
  int64_t extended = until + comm->timeout_ns;
  if (extended <= now || extended <= *deadline_ns) return true;
  KEEL_LOG_I(MODULE, "a member declared long work: operation %" PRIu64 " waits %.1f s more",
             comm->op_seq, (double)(extended - now) / 1e9);
  *deadline_ns = extended;
  return false;
}

bool keel__comm_revoked(const keel_comm *comm) {
  const keel_endpoint *endpoint = comm->endpoint;
  return comm->revoked_locally || (endpoint->any_revoked && comm->epoch <= endpoint->revoked_epoch);
}

keel_status keel__comm_health(keel_comm *comm) {
  keel_endpoint *endpoint = comm->endpoint;
  if (keel__comm_revoked(comm) || comm != endpoint->current) return KEEL_EREVOKED;
  if (!endpoint->config.failure_detection) return KEEL_OK;
  for (int rank = 0; rank < comm->size; rank++) {
    if (rank == comm->rank) continue;
    const keel__peer *peer = keel__peer_find(endpoint, comm->uids[rank]);
    if (peer == NULL || peer->link == NULL || peer->failed) return KEEL_EPROCFAILED;
  }
  return KEEL_OK;
}

/* Waits by polling without sleeping for endpoint->spin_ns after each event, then by a
 * blocking poll: a blocking poll costs a wake-up (tens of microseconds) on every message, which
 * at 4 KiB-1 MiB is most of an operation's time. Only while the ranks on this machine have a
 * core each: with more ranks than cores, spinning (even yielding between polls) halved the
 * 4 KiB time of 4 ranks on 2 cores but starved everything else on the machine (BENCHMARKS.md,
 * issue 10). */
static keel_status drive_until(keel_comm *comm, keel__op *op, int64_t *deadline_p,
                               keel__ready_fn ready, void *state) {
  keel_endpoint *endpoint = comm->endpoint;
  int64_t deadline_ns = *deadline_p;
  int64_t spin_ns = endpoint->cores >= comm->ranks_on_this_machine ? endpoint->spin_ns : 0;
  int64_t spin_until = spin_ns > 0 ? keel_now_ns() + spin_ns : 0;
  for (;;) {
    /* Done counts before health: a peer may finish this operation, leave and close its
     * link, and that is no failure of an operation that got everything it needed. */
    bool is_ready = ready == NULL || ready(state);
    keel_status status = keel__op_slot_error(op);
    if (status == KEEL_OK && is_ready && keel__op_complete(op)) return KEEL_OK;
    if (status == KEEL_OK) status = keel__comm_health(comm);
    if (status == KEEL_OK) status = keel__interrupted(endpoint);
    if (status == KEEL_OK && op->send_error != KEEL_OK && endpoint->config.failure_detection)
      status = op->send_error;
    if (status == KEEL_OK && keel__deadline_passed(comm, &deadline_ns)) {
      KEEL_LOG_W(MODULE, "operation %" PRIu64 " of epoch %" PRIu64 " passed its deadline",
                 comm->op_seq, comm->epoch);
      status = KEEL_ETIMEDOUT;
    }
    *deadline_p = deadline_ns; /* a member's declared section may have moved it */
    if (status != KEEL_OK) {
      keel__op_abandon(op);
      return status;
    }
    bool spinning = spin_until != 0 && keel_now_ns() < spin_until;
    keel_status progressed = keel__progress(endpoint, spinning ? 0 : deadline_ns);
    if (progressed == KEEL_OK && spin_ns > 0) spin_until = keel_now_ns() + spin_ns;
  }
}

keel_status keel__drive(keel_comm *comm, keel__op *op, int64_t deadline_ns, keel__ready_fn ready,
                        void *state) {
  keel_status status = drive_until(comm, op, &deadline_ns, ready, state);
  keel_wait_ended(KEEL_WAIT_COLLECTIVE, deadline_ns);
  return status;
}

keel_status keel__flush(keel_endpoint *endpoint, int64_t deadline_ns) {
  for (;;) {
    bool pending = false;
    for (size_t i = 0; i < endpoint->linked_count && !pending; i++) {
      const keel__peer *peer = endpoint->linked[i];
      pending = !peer->failed && peer->queue_head != NULL;
    }
    if (!pending) return KEEL_OK;
    if (keel_now_ns() >= deadline_ns) return KEEL_ETIMEDOUT;
    keel__progress(endpoint, deadline_ns);
  }
}
