/* The endpoint: a process's place in the job's network. It listens, authenticates incoming
 * links on its own thread, keeps one link per peer (the lower uid connects), makes the
 * communicators of each epoch over those links, and at the end leaves in order: a goodbye
 * to every peer, then a lingering read until they said theirs. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "comm/comm_internal.h"

#define MODULE "comm"
#define DEFAULT_TIMEOUT_NS (30 * (int64_t)1000000000)
#define DEFAULT_SPARE_WAIT_NS (10 * (int64_t)1000000000)
/* One event (a frame in, a socket free) is usually followed by the next within tens of
 * microseconds in a collective, sooner than a blocking poll's wake-up (BENCHMARKS.md). */
#define DEFAULT_SPIN_US 50
/* A connector that has not finished its handshake by then is dropped. */
#define HANDSHAKE_TIMEOUT_NS (2 * (int64_t)1000000000)
/* How often a link setup looks again for an address not published yet. */
#define ADDRESS_RETRY_NS (20 * (int64_t)1000000)
/* How long a goodbye may take to leave: the peers read it in their progress loops. */
#define GOODBYE_FLUSH_NS (1000 * (int64_t)1000000)

size_t keel_dtype_size(keel_dtype dtype) {
  switch (dtype) {
    case KEEL_F32:
    case KEEL_I32:
      return 4;
    case KEEL_F64:
    case KEEL_I64:
      return 8;
    case KEEL_BF16:
      return 2;
  }
  return 0;
}

/* ---- peers */

keel__peer *keel__peer_find(const keel_endpoint *endpoint, uint32_t uid) {
  return uid < endpoint->peer_capacity ? endpoint->peers[uid] : NULL;
}

keel__peer *keel__peer_get(keel_endpoint *endpoint, uint32_t uid) {
  if (uid >= KEEL_MAX_UIDS) return NULL;
  if (uid >= endpoint->peer_capacity) {
    size_t grown = endpoint->peer_capacity ? endpoint->peer_capacity : 64;
    while (grown <= uid) grown *= 2;
    keel__peer **peers = realloc(endpoint->peers, grown * sizeof *peers);
    if (peers == NULL) return NULL;
    memset(peers + endpoint->peer_capacity, 0, (grown - endpoint->peer_capacity) * sizeof *peers);
    endpoint->peers = peers;
    endpoint->peer_capacity = grown;
  }
  if (endpoint->peers[uid] == NULL) {
    keel__peer *peer = calloc(1, sizeof *peer);
    if (peer == NULL) return NULL;
    peer->uid = uid;
    peer->linked_index = SIZE_MAX;
    endpoint->peers[uid] = peer;
  }
  return endpoint->peers[uid];
}

/* Gives a peer its link and puts it in the poll list. */
static void peer_attach(keel_endpoint *endpoint, keel__peer *peer, keel_link *link) {
  peer->link = link;
  peer->failed = false;
  peer->left = false;
  peer->told_goodbye = false;
  keel__peer_linked(endpoint, peer);
  /* A revocation goes out once, over the links there are. A member that links after this
   * process ended the epoch (it had gone on linking while this one found another member
   * dead) would wait for it until the deadline: it hears now. */
  keel_comm *current = endpoint->current;
  if (current != NULL && keel__comm_revoked(current) && keel_comm_rank_of(current, peer->uid) >= 0)
    keel__send_control(endpoint, peer->uid, KEEL_FRAME_REVOKE, current->epoch);
}

/* Closes a peer's link and drops what was queued for it; operations that still counted on
 * one of those frames fail (their peer is gone), they do not wait for it. */
static void peer_close(keel_endpoint *endpoint, keel__peer *peer) {
  while (peer->queue_head != NULL) {
    keel__send_item *item = peer->queue_head;
    peer->queue_head = item->next;
    if (item->op != NULL) {
      item->op->sends_pending--;
      item->op->send_error = KEEL_EPROCFAILED;
    }
    free(item->owned);
    free(item);
  }
  peer->queue_tail = NULL;
  peer->in_flight = false;
  peer->inbound_op = NULL;
  keel__peer_unlinked(endpoint, peer);
  keel_link_close(peer->link);
  peer->link = NULL;
}

keel_status keel__scratch_reserve(keel_endpoint *endpoint, size_t bytes) {
  if (bytes <= endpoint->scratch_bytes) return KEEL_OK;
  uint8_t *grown = realloc(endpoint->scratch, bytes);
  if (grown == NULL) return KEEL_ENOMEM;
  endpoint->scratch = grown;
  endpoint->scratch_bytes = bytes;
  return KEEL_OK;
}

bool keel__fault(keel_endpoint *endpoint, const char *point, int64_t counter) {
  return keel_fault_plan_fire(endpoint->config.faults, point, counter);
}

bool keel__fault_last(keel_endpoint *endpoint, const char *point, int64_t counter) {
  return keel_fault_plan_fire_last(endpoint->config.faults, point, counter);
}

/* ---- the acceptor thread */

static void *acceptor_main(void *argument) {
  keel_endpoint *endpoint = argument;
  while (!atomic_load(&endpoint->stopping)) {
    struct pollfd pollers[2] = {{.fd = keel_listener_fd(endpoint->listener), .events = POLLIN},
                                {.fd = endpoint->stop_fd, .events = POLLIN}};
    if (poll(pollers, 2, -1) <= 0 || pollers[0].revents == 0) continue;
    keel_link *link = NULL;
    keel_status status = keel_listener_accept(endpoint->listener, &endpoint->config.auth,
                                              keel_deadline_after_ns(HANDSHAKE_TIMEOUT_NS), &link);
    if (status != KEEL_OK) continue; /* a failed handshake was logged where it was decided */
    pthread_mutex_lock(&endpoint->accepted_mutex);
    int capacity = (int)(sizeof endpoint->accepted / sizeof endpoint->accepted[0]);
    bool full = endpoint->accepted_count == capacity;
    if (!full) endpoint->accepted[endpoint->accepted_count++] = link;
    pthread_mutex_unlock(&endpoint->accepted_mutex);
    if (full) {
      keel_link_close(link);
      continue;
    }
    keel_endpoint_wake(endpoint);
  }
  return NULL;
}

void keel_endpoint_wake(keel_endpoint *endpoint) {
  if (endpoint == NULL || endpoint->wake_fd < 0) return;
  uint64_t one = 1;
  ssize_t ignored = write(endpoint->wake_fd, &one, sizeof one);
  (void)ignored;
}

void keel_endpoint_declare_dead(keel_endpoint *endpoint, uint32_t uid) {
  if (endpoint == NULL) return;
  pthread_mutex_lock(&endpoint->accepted_mutex);
  int capacity = (int)(sizeof endpoint->declared_dead / sizeof endpoint->declared_dead[0]);
  /* A full queue drops the news: the watcher repeats it at its next look. */
  if (endpoint->declared_dead_count < capacity)
    endpoint->declared_dead[endpoint->declared_dead_count++] = uid;
  pthread_mutex_unlock(&endpoint->accepted_mutex);
  keel_endpoint_wake(endpoint);
}

void keel_endpoint_delay_sends(keel_endpoint *endpoint, int64_t delay_ns) {
  if (endpoint == NULL) return;
  atomic_store(&endpoint->send_delay_ns, delay_ns > 0 ? delay_ns : 0);
}

/* Called with accepted_mutex held. A uid is never reused, so the verdict is kept even for a
 * peer never linked yet: a later decision may still name it (a spare that died as it was
 * chosen), and linking to it must then fail at once, not retry until the deadline. */
static void fail_declared_dead(keel_endpoint *endpoint) {
  for (int i = 0; i < endpoint->declared_dead_count; i++) {
    uint32_t uid = endpoint->declared_dead[i];
    keel__peer *peer = uid != endpoint->config.uid ? keel__peer_get(endpoint, uid) : NULL;
    if (peer == NULL) continue;
    peer->declared_dead = true;
    if (peer->link == NULL)
      peer->failed = true; /* nothing of it to fail, and the job knows: no suspicion */
    else if (!peer->left)
      keel__peer_fail(endpoint, peer, "declared dead by the job");
  }
  endpoint->declared_dead_count = 0;
}

void keel__take_accepted_links(keel_endpoint *endpoint) {
  uint64_t count;
  if (endpoint->wake_fd >= 0) {
    ssize_t ignored = read(endpoint->wake_fd, &count, sizeof count);
    (void)ignored;
  }
  pthread_mutex_lock(&endpoint->accepted_mutex);
  fail_declared_dead(endpoint);
  for (int i = 0; i < endpoint->accepted_count; i++) {
    keel_link *link = endpoint->accepted[i];
    keel__peer *peer = keel__peer_get(endpoint, keel_link_peer_id(link));
    if (peer != NULL && peer->link != NULL && peer->failed) peer_close(endpoint, peer);
    if (peer == NULL || peer->link != NULL) {
      /* Two links to one peer would break frame order; keep the first. */
      KEEL_LOG_W(MODULE, "dropping a second link from uid %u", keel_link_peer_id(link));
      keel_link_close(link);
      continue;
    }
    peer_attach(endpoint, peer, link);
    KEEL_LOG_D(MODULE, "accepted link from uid %u", peer->uid);
  }
  endpoint->accepted_count = 0;
  pthread_mutex_unlock(&endpoint->accepted_mutex);
}

/* ---- links to members */

/* Whether a refused connection to peer is worth retrying: not once the job declared it dead
 * (its port will not open again) or the membership interrupts the wait. */
typedef struct link_attempt {
  keel_endpoint *endpoint;
  keel__peer *peer;
} link_attempt;

/* The job's verdict on the peer, taken already or still queued. */
static bool peer_declared_dead(keel_endpoint *endpoint, const keel__peer *peer) {
  if (peer->declared_dead) return true;
  pthread_mutex_lock(&endpoint->accepted_mutex);
  bool declared_dead = false;
  for (int i = 0; i < endpoint->declared_dead_count && !declared_dead; i++)
    declared_dead = endpoint->declared_dead[i] == peer->uid;
  pthread_mutex_unlock(&endpoint->accepted_mutex);
  return declared_dead;
}

static bool peer_may_listen(void *context) {
  const link_attempt *attempt = context;
  keel_endpoint *endpoint = attempt->endpoint;
  return !peer_declared_dead(endpoint, attempt->peer) && !attempt->peer->failed &&
         keel__interrupted(endpoint) == KEEL_OK;
}

/* Why linking to a peer that will never listen ends: this process's interruption, or else
 * the peer's death. */
static keel_status never_listens(keel_endpoint *endpoint) {
  keel_status status = keel__interrupted(endpoint);
  return status != KEEL_OK ? status : KEEL_EPROCFAILED;
}

static keel_status connect_to(keel_endpoint *endpoint, keel__peer *peer, int64_t deadline_ns) {
  const keel_endpoint_config *config = &endpoint->config;
  char address[128];
  keel_status status;
  link_attempt attempt = {endpoint, peer};
  if (peer_declared_dead(endpoint, peer)) return never_listens(endpoint);
  /* The peer may not have published its address yet; a dead one never will (its address
   * goes with it), so the job's verdict ends the wait. */
  while ((status = config->membership->address(config->membership_context, peer->uid, address,
                                               sizeof address)) == KEEL_ENOTFOUND) {
    if (keel_now_ns() >= deadline_ns) return KEEL_ETIMEDOUT;
    if (peer_declared_dead(endpoint, peer) || keel__interrupted(endpoint) != KEEL_OK)
      return never_listens(endpoint);
    int64_t wake = keel_now_ns() + ADDRESS_RETRY_NS;
    keel__progress(endpoint, wake < deadline_ns ? wake : deadline_ns);
  }
  if (status != KEEL_OK) return status;
  keel_link *link = NULL;
  status = keel_link_connect_while(address, &config->auth, deadline_ns, peer_may_listen, &attempt,
                                   &link);
  if (status == KEEL_ECONNREFUSED && !peer_may_listen(&attempt)) status = never_listens(endpoint);
  if (status != KEEL_OK) {
    KEEL_LOG_W(MODULE, "cannot link to uid %u at %s: %s", peer->uid, address,
               keel_strerror(status));
    return status;
  }
  if (keel_link_peer_id(link) != peer->uid) {
    KEEL_LOG_E(MODULE, "%s answered as uid %u, expected %u", address, keel_link_peer_id(link),
               peer->uid);
    keel_link_close(link);
    return KEEL_EAUTH;
  }
  peer_attach(endpoint, peer, link);
  return KEEL_OK;
}

keel_status keel_endpoint_link(keel_endpoint *endpoint, uint32_t uid, int64_t deadline_ns) {
  if (endpoint == NULL || endpoint->standalone) return KEEL_EINVAL;
  if (uid >= endpoint->config.uid) return KEEL_OK; /* higher uids connect to us */
  keel__peer *peer = keel__peer_get(endpoint, uid);
  if (peer == NULL) return KEEL_ENOMEM;
  if (peer->link != NULL && !peer->failed) return KEEL_OK;
  if (peer->link != NULL) peer_close(endpoint, peer);
  return connect_to(endpoint, peer, deadline_ns);
}

/* Connects to the members of lower uid. One found dead does not stop the others being linked:
 * this process is about to revoke the epoch, and a revocation travels over links only. A
 * member left unlinked would wait for this process's link until the deadline, and hold the
 * next agreement up as long (a joiner named with a dead spare waited 30 s). */
static keel_status link_lower_members(keel_endpoint *endpoint, const keel_comm *comm,
                                      int64_t deadline_ns) {
  keel_status first_death = KEEL_OK;
  for (int i = 0; i < comm->size; i++) {
    if (comm->uids[i] >= endpoint->config.uid) continue;
    keel__peer *peer = keel__peer_get(endpoint, comm->uids[i]);
    if (peer == NULL) return KEEL_ENOMEM;
    if (peer->link != NULL) continue;
    keel_status status = connect_to(endpoint, peer, deadline_ns);
    if (status == KEEL_EPROCFAILED) {
      first_death = status;
      continue;
    }
    if (status != KEEL_OK) return status;
  }
  return first_death;
}

/* Makes sure every member other than this process has a live link: connects to lower uids,
 * waits for higher ones to connect. A member whose link broke is not waited for: the new
 * communicator's first operation will report it. */
static keel_status ensure_links(keel_endpoint *endpoint, keel_comm *comm, int64_t deadline_ns) {
  keel_status status = link_lower_members(endpoint, comm, deadline_ns);
  if (status != KEEL_OK) return status;
  for (;;) {
    keel__take_accepted_links(endpoint);
    /* A member found another dead and ended the epoch: no link still missing will come. */
    if (keel__comm_revoked(comm)) return KEEL_EREVOKED;
    bool missing = false;
    for (int i = 0; i < comm->size && !missing; i++) {
      if (comm->uids[i] <= endpoint->config.uid) continue;
      keel__peer *peer = keel__peer_get(endpoint, comm->uids[i]);
      if (peer == NULL) return KEEL_ENOMEM;
      missing = peer->link == NULL;
      /* A member that will never link: the job declared it dead while the decision that
       * named it was made (a spare on a node cut off). Waiting out the deadline would hold
       * every member's next agreement up for it. */
      if (missing && peer->failed) return KEEL_EPROCFAILED;
    }
    if (!missing) return KEEL_OK;
    if (keel_now_ns() >= deadline_ns) return KEEL_ETIMEDOUT;
    status = keel__interrupted(endpoint);
    if (status != KEEL_OK) return status;
    /* Keeps links moving while waiting (a goodbye or a revoke may arrive). */
    int64_t wake = keel_now_ns() + 50 * (int64_t)1000000;
    keel__progress(endpoint, wake < deadline_ns ? wake : deadline_ns);
  }
}

/* Peers that failed and are in no communicator from now on: their links are closed, so
 * descriptors do not pile up over a long job's recoveries. */
static void close_failed_peers(keel_endpoint *endpoint, const uint32_t *uids, int count) {
  for (size_t i = 0; i < endpoint->linked_count;) {
    keel__peer *peer = endpoint->linked[i];
    bool member = false;
    for (int m = 0; m < count && !member; m++) member = uids[m] == peer->uid;
    if ((peer->failed || peer->left) && !member) {
      peer_close(endpoint, peer); /* moves the last peer into slot i */
      continue;
    }
    i++;
  }
}

static keel_comm *comm_alloc(keel_endpoint *endpoint, uint64_t epoch, const uint32_t *uids,
                             int count) {
  keel_comm *comm = calloc(1, sizeof *comm);
  if (comm == NULL) return NULL;
  comm->uids = malloc(sizeof(uint32_t) * (size_t)(count > 0 ? count : 1));
  if (comm->uids == NULL) {
    free(comm);
    return NULL;
  }
  memcpy(comm->uids, uids, sizeof(uint32_t) * (size_t)count);
  comm->endpoint = endpoint;
  comm->epoch = epoch;
  comm->size = count;
  comm->ranks_on_this_machine = count;
  comm->rank = -1;
  for (int rank = 0; rank < count; rank++) {
    if (uids[rank] == endpoint->config.uid) comm->rank = rank;
  }
  /* A deadline set on the world (a watchdog's) holds across recoveries. */
  comm->timeout_ns =
      endpoint->current ? endpoint->current->timeout_ns : endpoint->config.timeout_ns;
  return comm;
}

keel_status keel_comm_create(keel_endpoint *endpoint, uint64_t epoch, const uint32_t *uids,
                             int count, int64_t deadline_ns, keel_comm **comm_p) {
  if (endpoint == NULL || uids == NULL || count < 1 || count > KEEL_MAX_WORLD || comm_p == NULL)
    return KEEL_EINVAL;
  keel_comm *comm = comm_alloc(endpoint, epoch, uids, count);
  if (comm == NULL) return KEEL_ENOMEM;
  if (comm->rank < 0) {
    free(comm->uids);
    free(comm);
    return KEEL_EEXCLUDED;
  }
  /* The old epoch's transport is of no more use (its counters are mid-operation), and
   * frames of older epochs will never be asked for. */
  if (endpoint->current != NULL) keel__transport_release(endpoint->current);
  comm->older = endpoint->current;
  endpoint->current = comm;
  keel__drop_stale_unexpected(endpoint, epoch);
  *comm_p = comm;
  if (endpoint->standalone) return KEEL_OK;
  close_failed_peers(endpoint, uids, count);
  return ensure_links(endpoint, comm, deadline_ns);
}

keel_status keel__comm_from_decision(keel_endpoint *endpoint, const keel_decision *decision,
                                     keel_comm **comm_p) {
  int64_t timeout = endpoint->current ? endpoint->current->timeout_ns : endpoint->config.timeout_ns;
  return keel_comm_create(endpoint, decision->epoch + 1, decision->members, decision->member_count,
                          keel_deadline_after_ns(timeout), comm_p);
}

/* ---- creation and the end */

static keel_status endpoint_listen(keel_endpoint *endpoint) {
  char listen_address[96];
  snprintf(listen_address, sizeof listen_address, "%s:0",
           endpoint->config.host ? endpoint->config.host : "127.0.0.1");
  keel_status status = keel_listener_open(listen_address, &endpoint->listener);
  if (status != KEEL_OK) return status;
  snprintf(endpoint->address, sizeof endpoint->address, "%s",
           keel_listener_address(endpoint->listener));
  endpoint->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (endpoint->wake_fd < 0) return keel_status_from_errno(errno);
  endpoint->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (endpoint->stop_fd < 0) return keel_status_from_errno(errno);
  if (pthread_create(&endpoint->acceptor_thread, NULL, acceptor_main, endpoint) != 0)
    return KEEL_ENOMEM;
  endpoint->acceptor_started = true;
  return KEEL_OK;
}

/* KEEL_SPIN_US: how long a waiting collective polls without sleeping after each event. */
static int64_t spin_ns_from_environment(void) {
  int64_t microseconds = DEFAULT_SPIN_US;
  if (keel_env_int("KEEL_SPIN_US", 0, 100 * 1000, &microseconds) != KEEL_OK)
    microseconds = DEFAULT_SPIN_US;
  return microseconds * 1000;
}

keel_status keel_endpoint_create(const keel_endpoint_config *config, keel_endpoint **endpoint_p) {
  if (config == NULL || endpoint_p == NULL || config->uid >= KEEL_MAX_UIDS) return KEEL_EINVAL;
  if (config->store != NULL && (config->membership == NULL || config->membership->address == NULL))
    return KEEL_EINVAL;
  keel_endpoint *endpoint = calloc(1, sizeof *endpoint);
  if (endpoint == NULL) return KEEL_ENOMEM;
  endpoint->config = *config;
  endpoint->config.auth.local_id = config->uid;
  if (endpoint->config.timeout_ns <= 0) endpoint->config.timeout_ns = DEFAULT_TIMEOUT_NS;
  if (endpoint->config.spare_wait_ns <= 0) endpoint->config.spare_wait_ns = DEFAULT_SPARE_WAIT_NS;
  if (endpoint->config.max_world <= 0) endpoint->config.max_world = KEEL_MAX_WORLD;
  endpoint->config.host = NULL; /* the caller's string is not kept */
  endpoint->standalone = config->store == NULL;
  endpoint->wake_fd = endpoint->stop_fd = -1;
  endpoint->spin_ns = spin_ns_from_environment();
  endpoint->cores = sysconf(_SC_NPROCESSORS_ONLN);
  atomic_init(&endpoint->stopping, false);
  atomic_init(&endpoint->send_delay_ns, 0);
  pthread_mutex_init(&endpoint->accepted_mutex, NULL);
  if (!endpoint->standalone) {
    endpoint->config.host = config->host; /* read once, by endpoint_listen */
    keel_status status = endpoint_listen(endpoint);
    endpoint->config.host = NULL;
    if (status != KEEL_OK) {
      KEEL_LOG_E(MODULE, "cannot listen: %s", keel_strerror(status));
      keel_endpoint_close(endpoint, 0);
      return status;
    }
  }
  *endpoint_p = endpoint;
  return KEEL_OK;
}

const char *keel_endpoint_address(const keel_endpoint *endpoint) { return endpoint->address; }
keel_comm *keel_endpoint_current(keel_endpoint *endpoint) { return endpoint->current; }

/* Says goodbye to every linked peer not told yet. A peer may link to us while we linger (a
 * new spare connects to everyone); without a goodbye it would take our close for a failure
 * and have us fenced while we finish in order. */
static void say_goodbye(keel_endpoint *endpoint, int64_t deadline_ns) {
  uint64_t epoch = endpoint->current ? endpoint->current->epoch : 0;
  bool said = false;
  for (size_t i = 0; i < endpoint->linked_count; i++) {
    keel__peer *peer = endpoint->linked[i];
    if (peer->failed || peer->told_goodbye) continue;
    keel__send_control(endpoint, peer->uid, KEEL_FRAME_GOODBYE, epoch);
    peer->told_goodbye = true;
    said = true;
  }
  if (said) keel__flush(endpoint, deadline_ns);
}

/* Whether every linked peer has said goodbye (a goodbye is a peer's last frame) or is gone. */
static bool peers_all_done(const keel_endpoint *endpoint) {
  for (size_t i = 0; i < endpoint->linked_count; i++) {
    const keel__peer *peer = endpoint->linked[i];
    if (!peer->failed && !peer->left) return false;
  }
  return true;
}

/* A lingering close: after its goodbye a process reads what its peers still send until
 * each has said goodbye too or is gone, or the deadline, so that no unread byte makes
 * close() reset a connection whose last data a slower peer has not read yet. */
static void linger_until_peers_done(keel_endpoint *endpoint, int64_t deadline_ns) {
  while (!peers_all_done(endpoint) && keel_now_ns() < deadline_ns) {
    keel__progress(endpoint, keel_deadline_after_ns(50 * 1000000));
    say_goodbye(endpoint, keel_deadline_after_ns(GOODBYE_FLUSH_NS));
  }
  keel__progress(endpoint, 0);
}

static void free_comms(keel_endpoint *endpoint) {
  while (endpoint->current != NULL) {
    keel_comm *comm = endpoint->current;
    endpoint->current = comm->older;
    keel__transport_release(comm);
    keel__op_free(&comm->collective);
    free(comm->uids);
    free(comm);
  }
}

void keel_endpoint_close(keel_endpoint *endpoint, int64_t linger_ns) {
  if (endpoint == NULL) return;
  if (endpoint->listener != NULL && linger_ns > 0) {
    say_goodbye(endpoint, keel_deadline_after_ns(GOODBYE_FLUSH_NS));
    linger_until_peers_done(endpoint, keel_deadline_after_ns(linger_ns));
  }
  atomic_store(&endpoint->stopping, true);
  if (endpoint->stop_fd >= 0) {
    uint64_t one = 1;
    ssize_t ignored = write(endpoint->stop_fd, &one, sizeof one);
    (void)ignored;
  }
  if (endpoint->acceptor_started) pthread_join(endpoint->acceptor_thread, NULL);
  keel__take_accepted_links(endpoint);
  /* Links that came in after the lingering read are told too. */
  if (endpoint->listener != NULL && linger_ns > 0)
    say_goodbye(endpoint, keel_deadline_after_ns(GOODBYE_FLUSH_NS / 10));
  /* Operations still registered (requests the caller did not free) lose their links now. */
  while (endpoint->operations != NULL) keel__op_abandon(endpoint->operations);
  for (size_t uid = 0; uid < endpoint->peer_capacity; uid++) {
    keel__peer *peer = endpoint->peers[uid];
    if (peer == NULL) continue;
    peer_close(endpoint, peer);
    free(peer);
  }
  free(endpoint->peers);
  free(endpoint->linked);
  free(endpoint->pollers);
  free(endpoint->poll_owners);
  keel__drop_stale_unexpected(endpoint, UINT64_MAX);
  free_comms(endpoint);
  keel_listener_close(endpoint->listener);
  if (endpoint->wake_fd >= 0) close(endpoint->wake_fd);
  if (endpoint->stop_fd >= 0) close(endpoint->stop_fd);
  pthread_mutex_destroy(&endpoint->accepted_mutex);
  free(endpoint->scratch);
  free(endpoint);
}

/* ---- the communicator's accessors */

int keel_comm_rank(const keel_comm *comm) { return comm->rank; }
int keel_comm_size(const keel_comm *comm) { return comm->size; }
uint64_t keel_comm_epoch(const keel_comm *comm) { return comm->epoch; }
uint32_t keel_comm_uid(const keel_comm *comm, int rank) {
  return rank >= 0 && rank < comm->size ? comm->uids[rank] : UINT32_MAX;
}
int keel_comm_rank_of(const keel_comm *comm, uint32_t uid) {
  for (int rank = 0; rank < comm->size; rank++) {
    if (comm->uids[rank] == uid) return rank;
  }
  return -1;
}
void keel_comm_set_timeout(keel_comm *comm, int64_t timeout_ns) { comm->timeout_ns = timeout_ns; }
int64_t keel_comm_timeout(const keel_comm *comm) { return comm->timeout_ns; }
keel_status keel_comm_health(keel_comm *comm) {
  if (comm == NULL) return KEEL_EINVAL;
  if (!comm->endpoint->standalone) keel__progress(comm->endpoint, 0);
  return keel__comm_health(comm);
}
