/* The progress engine: one poll loop over every link of the process. It writes queued
 * frames, reads frames into the receives an operation posted (or keeps them aside until one
 * is posted), spreads revocations, and turns a closed link into a failed peer at once. */
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

#define MODULE "progress"

void keel__peer_fail(keel_ctx *ctx, keel__peer *peer, const char *reason) {
  if (peer->failed) return;
  peer->failed = true;
  if (peer->left) return;
  KEEL_LOG_I(MODULE, "uid %u failed: %s", peer->uid, reason);
  if (ctx->store == NULL) return;
  /* Tell the job: the launcher fences the peer, the agreement counts it as failed. */
  char key[64], value[96];
  snprintf(key, sizeof key, "suspect/%" PRIu32, peer->uid);
  int length = snprintf(value, sizeof value, "by=%" PRIu32 " reason=%s", ctx->uid, reason);
  keel_store_put(ctx->store, key, value, (size_t)length, 0, NULL);
}

/* ---- sending */

static void send_item_finish(keel__peer *peer) {
  keel__send_item *item = peer->queue_head;
  peer->queue_head = item->next;
  if (peer->queue_head == NULL) peer->queue_tail = NULL;
  peer->in_flight = false;
  if (item->pending) (*item->pending)--;
  free(item->owned);
  free(item);
}

/* Writes as much of the peer's queue as the socket takes. */
static void peer_push(keel_ctx *ctx, keel__peer *peer) {
  while (peer->queue_head != NULL && peer->link != NULL && !peer->failed) {
    keel__send_item *item = peer->queue_head;
    keel_status status;
    if (!peer->in_flight) {
      status = keel_link_send_begin(peer->link, &item->frame, item->payload, item->length);
      if (status != KEEL_OK) {
        keel__peer_fail(ctx, peer, "send failed");
        return;
      }
      peer->in_flight = true;
    }
    status = keel_link_send_progress(peer->link);
    if (status == KEEL_EAGAIN) return;
    if (status != KEEL_OK) {
      keel__peer_fail(ctx, peer, keel_strerror(status));
      return;
    }
    send_item_finish(peer);
  }
}

keel_status keel__send(keel_ctx *ctx, uint32_t uid, uint16_t type, uint64_t epoch, uint64_t tag,
                       const void *payload, size_t length, int *pending) {
  keel__peer *peer = keel__peer_get(ctx, uid);
  if (peer == NULL) return KEEL_ENOMEM;
  if (peer->failed || peer->link == NULL) return KEEL_EPROCFAILED;
  keel__send_item *item = calloc(1, sizeof *item);
  if (item == NULL) return KEEL_ENOMEM;
  item->frame.type = type;
  item->frame.epoch = epoch;
  item->frame.tag = tag;
  item->payload = payload;
  item->length = length;
  item->pending = pending;
  if (pending) (*pending)++;
  if (peer->queue_tail) peer->queue_tail->next = item;
  else peer->queue_head = item;
  peer->queue_tail = item;
  peer_push(ctx, peer);
  return peer->failed ? KEEL_EPROCFAILED : KEEL_OK;
}

/* ---- receiving */

void keel__slots_reset(keel_ctx *ctx) { ctx->slot_count = 0; }

static bool slot_matches(const keel__recv_slot *slot, const keel_frame *frame) {
  return slot->posted && !slot->done && slot->type == frame->type &&
         slot->source == frame->source && slot->epoch == frame->epoch && slot->tag == frame->tag;
}

static keel__recv_slot *find_slot(keel_ctx *ctx, const keel_frame *frame) {
  for (size_t i = 0; i < ctx->slot_count; i++) {
    if (slot_matches(&ctx->slots[i], frame)) return &ctx->slots[i];
  }
  return NULL;
}

static void slot_fill(keel__recv_slot *slot, const keel_frame *frame, const void *payload) {
  if (frame->length != slot->length) {
    slot->status = KEEL_EPROTO;
  } else {
    if (payload != slot->destination && slot->length > 0)
      memcpy(slot->destination, payload, slot->length);
    slot->status = KEEL_OK;
  }
  slot->done = true;
}

keel__recv_slot *keel__post_recv(keel_ctx *ctx, uint16_t type, uint32_t source, uint64_t epoch,
                                 uint64_t tag, void *destination, size_t length) {
  if (ctx->slot_count == ctx->slot_capacity) {
    size_t grown = ctx->slot_capacity ? ctx->slot_capacity * 2 : 256;
    keel__recv_slot *slots = realloc(ctx->slots, grown * sizeof *slots);
    if (slots == NULL) return NULL;
    /* Slots moved: links that point at one as their inbound destination must follow. */
    for (uint32_t uid = 0; uid < KEEL__MAX_UIDS; uid++) {
      keel__peer *peer = ctx->peers[uid];
      if (peer != NULL && peer->inbound_slot != NULL)
        peer->inbound_slot = slots + (peer->inbound_slot - ctx->slots);
    }
    ctx->slots = slots;
    ctx->slot_capacity = grown;
  }
  keel__recv_slot *slot = &ctx->slots[ctx->slot_count++];
  *slot = (keel__recv_slot){.type = type, .source = source, .epoch = epoch, .tag = tag,
                            .destination = destination, .length = length, .posted = true};
  /* It may have arrived already. */
  keel__unexpected **link = &ctx->unexpected_head;
  while (*link != NULL) {
    keel__unexpected *waiting = *link;
    if (slot_matches(slot, &waiting->frame)) {
      slot_fill(slot, &waiting->frame, waiting->payload);
      *link = waiting->next;
      free(waiting->payload);
      free(waiting);
      break;
    }
    link = &waiting->next;
  }
  return slot;
}

void keel__drop_stale_unexpected(keel_ctx *ctx, uint64_t below_epoch) {
  keel__unexpected **link = &ctx->unexpected_head;
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

void keel__note_revoke(keel_ctx *ctx, uint64_t epoch) {
  if (ctx->any_revoked && epoch <= ctx->revoked_epoch) return;
  ctx->any_revoked = true;
  ctx->revoked_epoch = epoch;
  KEEL_LOG_D(MODULE, "epoch %" PRIu64 " revoked", epoch);
  /* Reliable broadcast (as ULFM does it): whoever learns of a revocation first passes it on,
   * so it reaches every member even if the one who revoked dies halfway through. */
  keel_comm *comm = ctx->world;
  if (comm == NULL || comm->epoch != epoch) return;
  for (int rank = 0; rank < comm->size; rank++) {
    if (comm->uids[rank] == ctx->uid) continue;
    keel__send(ctx, comm->uids[rank], KEEL_FRAME_REVOKE, epoch, 0, NULL, 0, NULL);
  }
}

static void *on_frame_header(void *context, keel_link *link, const keel_frame *frame) {
  keel_ctx *ctx = context;
  keel__peer *peer = keel__peer_get(ctx, keel_link_peer_id(link));
  keel__recv_slot *slot = find_slot(ctx, frame);
  if (peer != NULL) peer->inbound_slot = slot;
  if (slot == NULL || slot->length != frame->length) return NULL;
  return slot->destination;
}

static void stash_unexpected(keel_ctx *ctx, const keel_frame *frame, void *payload) {
  keel_comm *comm = ctx->world;
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
  keel__unexpected **tail = &ctx->unexpected_head;
  while (*tail != NULL) tail = &(*tail)->next;
  *tail = waiting;
}

static void on_frame_complete(void *context, keel_link *link, const keel_frame *frame,
                              void *payload, keel_status status) {
  keel_ctx *ctx = context;
  keel__peer *peer = keel__peer_get(ctx, keel_link_peer_id(link));
  keel__recv_slot *inbound = peer ? peer->inbound_slot : NULL;
  if (peer) peer->inbound_slot = NULL;
  if (status != KEEL_OK) {
    if (inbound == NULL || payload != inbound->destination) free(payload);
    return;
  }
  switch (frame->type) {
    case KEEL_FRAME_REVOKE:
      free(payload);
      keel__note_revoke(ctx, frame->epoch);
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
  keel__recv_slot *slot = find_slot(ctx, frame);
  if (slot != NULL) {
    slot_fill(slot, frame, payload);
    free(payload);
    return;
  }
  stash_unexpected(ctx, frame, payload);
}

static void peer_pull(keel_ctx *ctx, keel__peer *peer) {
  keel_link_sink sink = {on_frame_header, on_frame_complete, ctx};
  keel_status status = keel_link_recv_progress(peer->link, &sink);
  if (status == KEEL_EAGAIN) return;
  keel__peer_fail(ctx, peer, status == KEEL_ECLOSED ? "link closed" : keel_strerror(status));
}

/* ---- the loop */

keel_status keel__progress(keel_ctx *ctx, int64_t deadline_ns) {
  struct pollfd pollers[KEEL__MAX_UIDS + 1];
  keel__peer *owners[KEEL__MAX_UIDS + 1];
  nfds_t count = 0;
  if (ctx->wake_fd >= 0) {
    pollers[count] = (struct pollfd){.fd = ctx->wake_fd, .events = POLLIN};
    owners[count++] = NULL;
  }
  for (uint32_t uid = 0; uid < KEEL__MAX_UIDS; uid++) {
    keel__peer *peer = ctx->peers[uid];
    if (peer == NULL || peer->link == NULL || peer->failed) continue;
    short events = POLLIN;
    if (peer->queue_head != NULL) events |= POLLOUT;
    pollers[count] = (struct pollfd){.fd = keel_link_fd(peer->link), .events = events};
    owners[count++] = peer;
  }
  int ready = poll(pollers, count, deadline_ns == 0 ? 0 : keel_poll_timeout_ms(deadline_ns));
  if (ready <= 0) return ready == 0 ? KEEL_EAGAIN : KEEL_OK;
  for (nfds_t i = 0; i < count; i++) {
    if (pollers[i].revents == 0) continue;
    keel__peer *peer = owners[i];
    if (peer == NULL) {
      keel__take_accepted_links(ctx);
      continue;
    }
    if (pollers[i].revents & (POLLIN | POLLHUP | POLLERR)) peer_pull(ctx, peer);
    if (!peer->failed && (pollers[i].revents & POLLOUT)) peer_push(ctx, peer);
  }
  return KEEL_OK;
}

keel_status keel__comm_health(keel_comm *comm) {
  keel_ctx *ctx = comm->ctx;
  if (comm->revoked_locally || (ctx->any_revoked && comm->epoch <= ctx->revoked_epoch) ||
      comm != ctx->world)
    return KEEL_EREVOKED;
  if (!ctx->failure_detection) return KEEL_OK;
  for (int rank = 0; rank < comm->size; rank++) {
    if (comm->uids[rank] == ctx->uid) continue;
    keel__peer *peer = ctx->peers[comm->uids[rank]];
    if (peer == NULL || peer->link == NULL || peer->failed) return KEEL_EPROCFAILED;
  }
  return KEEL_OK;
}

keel_status keel__flush(keel_ctx *ctx, int64_t deadline_ns) {
  for (;;) {
    bool pending = false;
    for (uint32_t uid = 0; uid < KEEL__MAX_UIDS && !pending; uid++) {
      keel__peer *peer = ctx->peers[uid];
      pending = peer != NULL && peer->link != NULL && !peer->failed && peer->queue_head != NULL;
    }
    if (!pending) return KEEL_OK;
    if (keel_now_ns() >= deadline_ns) return KEEL_ETIMEDOUT;
    keel__progress(ctx, deadline_ns);
  }
}

void keel__abandon_operation(keel_ctx *ctx) {
  for (uint32_t uid = 0; uid < KEEL__MAX_UIDS; uid++) {
    keel__peer *peer = ctx->peers[uid];
    if (peer == NULL) continue;
    /* A frame half written must be finished (the stream must stay in frame order), but
     * not from the caller's buffer, which is about to be reused. */
    if (peer->in_flight && peer->link != NULL && !peer->failed) {
      if (keel_link_send_detach(peer->link) != KEEL_OK) keel__peer_fail(ctx, peer, "detach");
    }
    keel__send_item **link = &peer->queue_head;
    keel__send_item *last = NULL;
    while (*link != NULL) {
      keel__send_item *item = *link;
      bool keep = (item == peer->queue_head && peer->in_flight && !peer->failed) ||
                  item->owned != NULL || item->payload == NULL;
      if (keep) {
        item->pending = NULL;
        if (item == peer->queue_head && peer->in_flight) item->payload = NULL;
        last = item;
        link = &item->next;
      } else {
        *link = item->next;
        free(item);
      }
    }
    peer->queue_tail = last;
    if (peer->inbound_slot != NULL && peer->link != NULL && !peer->failed) {
      keel_link_recv_abandon(peer->link);
    }
    peer->inbound_slot = NULL;
  }
  keel__slots_reset(ctx);
}
