/* The process's runtime: joining the job from the launcher's environment (docs/RUNTIME.md),
 * the lease that is its heartbeat, the thread that authenticates incoming links, the links
 * to the other members, and the start (spares wait here) and orderly end of a process. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "comm/comm_internal.h"

#define MODULE "comm"
/* How long a leaving process waits for its peers' goodbyes after its own: peers that finish
 * with it say it at once; a busier one has had this long to read what we sent. */
#define LINGER_NS ((int64_t)1000 * 1000 * 1000)

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

keel__peer *keel__peer_get(keel_ctx *ctx, uint32_t uid) {
  if (uid >= KEEL__MAX_UIDS) return NULL;
  if (ctx->peers[uid] == NULL) {
    keel__peer *peer = calloc(1, sizeof *peer);
    if (peer == NULL) return NULL;
    peer->uid = uid;
    ctx->peers[uid] = peer;
  }
  return ctx->peers[uid];
}

keel_status keel__scratch_reserve(keel_ctx *ctx, size_t bytes) {
  if (bytes <= ctx->scratch_bytes) return KEEL_OK;
  uint8_t *grown = realloc(ctx->scratch, bytes);
  if (grown == NULL) return KEEL_ENOMEM;
  ctx->scratch = grown;
  ctx->scratch_bytes = bytes;
  return KEEL_OK;
}

keel_comm *keel__comm_create(keel_ctx *ctx, uint64_t epoch, const uint32_t *uids, int count) {
  keel_comm *comm = calloc(1, sizeof *comm);
  if (comm == NULL) return NULL;
  comm->uids = malloc(sizeof(uint32_t) * (size_t)(count > 0 ? count : 1));
  if (comm->uids == NULL) {
    free(comm);
    return NULL;
  }
  memcpy(comm->uids, uids, sizeof(uint32_t) * (size_t)count);
  comm->ctx = ctx;
  comm->epoch = epoch;
  comm->size = count;
  comm->rank = -1;
  for (int rank = 0; rank < count; rank++) {
    if (uids[rank] == ctx->uid) comm->rank = rank;
  }
  comm->timeout_ns = ctx->timeout_ns;
  /* The old epoch's shared memory is of no more use: its counters are mid-operation. */
  if (ctx->world != NULL) keel__shm_release(ctx->world);
  /* The previous world stays reachable (and freed at finalize): handles the user holds
   * must stay valid and fail with KEEL_EREVOKED rather than dangle. */
  comm->older = ctx->world;
  ctx->world = comm;
  return comm;
}

int keel__comm_rank_of(const keel_comm *comm, uint32_t uid) {
  for (int rank = 0; rank < comm->size; rank++) {
    if (comm->uids[rank] == uid) return rank;
  }
  return -1;
}

/* ---- environment */

static keel_status read_role(keel_ctx *ctx) {
  const char *role = getenv("KEEL_ROLE");
  if (role == NULL || strcmp(role, "worker") == 0) ctx->role = KEEL__ROLE_WORKER;
  else if (strcmp(role, "spare") == 0) ctx->role = KEEL__ROLE_SPARE;
  else if (strcmp(role, "joiner") == 0) ctx->role = KEEL__ROLE_JOINER;
  else {
    KEEL_LOG_E(MODULE, "KEEL_ROLE=%s: expected worker, spare or joiner", role);
    return KEEL_EINVAL;
  }
  const char *policy = getenv("KEEL_ON_FAILURE");
  if (policy == NULL || strcmp(policy, "shrink") == 0) ctx->policy = KEEL__POLICY_SHRINK;
  else if (strcmp(policy, "replace") == 0) ctx->policy = KEEL__POLICY_REPLACE;
  else if (strcmp(policy, "restart") == 0) ctx->policy = KEEL__POLICY_RESTART;
  else {
    KEEL_LOG_E(MODULE, "KEEL_ON_FAILURE=%s: expected shrink, replace or restart", policy);
    return KEEL_EINVAL;
  }
  const char *domain = getenv("KEEL_FAILURE_DOMAIN");
  ctx->node_domain = domain != NULL && strcmp(domain, "node") == 0;
  return KEEL_OK;
}

/* A job that restarts its processes (KEEL_ON_FAILURE=restart) gives every incarnation
 * fresh uids and epochs, so that nothing in the store of an earlier one is mistaken for
 * this one's: ranks are uid - KEEL_FIRST_UID, the first epoch is KEEL_FIRST_EPOCH. */
static keel_status read_incarnation(keel_ctx *ctx) {
  int64_t restart = 0, first_uid = 0, first_epoch = 0;
  if (keel_env_int("KEEL_RESTART", 0, UINT32_MAX, &restart) != KEEL_OK ||
      keel_env_int("KEEL_FIRST_UID", 0, KEEL__MAX_UIDS - 1, &first_uid) != KEEL_OK ||
      keel_env_int("KEEL_FIRST_EPOCH", 0, INT64_MAX / 2, &first_epoch) != KEEL_OK) {
    KEEL_LOG_E(MODULE, "KEEL_RESTART, KEEL_FIRST_UID or KEEL_FIRST_EPOCH is out of range");
    return KEEL_EINVAL;
  }
  ctx->restart_count = (uint32_t)restart;
  ctx->first_uid = (uint32_t)first_uid;
  ctx->first_epoch = (uint64_t)first_epoch;
  return KEEL_OK;
}

static keel_status read_environment(keel_ctx *ctx) {
  int64_t value = 0;
  keel_status status = keel_auth_from_env(&ctx->auth);
  if (status != KEEL_OK) return status;
  snprintf(ctx->store_endpoint, sizeof ctx->store_endpoint, "%s", getenv("KEEL_STORE"));
  value = -1;
  if (keel_env_int("KEEL_UID", 0, KEEL__MAX_UIDS - 1, &value) != KEEL_OK || value < 0) {
    KEEL_LOG_E(MODULE, "KEEL_UID is missing or out of range");
    return KEEL_EINVAL;
  }
  ctx->uid = (uint32_t)value;
  ctx->auth.local_id = ctx->uid;
  value = 0;
  if (keel_env_int("KEEL_WORLD", 1, 1024, &value) != KEEL_OK || value < 1) {
    KEEL_LOG_E(MODULE, "KEEL_WORLD is missing or out of range");
    return KEEL_EINVAL;
  }
  ctx->initial_world = (int)value;
  value = ctx->initial_world;
  if (keel_env_int("KEEL_MAX_WORLD", 1, 1024, &value) != KEEL_OK) return KEEL_EINVAL;
  ctx->max_world = (int)value;
  value = 0;
  if (keel_env_int("KEEL_NODE", 0, 1 << 20, &value) != KEEL_OK) return KEEL_EINVAL;
  ctx->node = (int)value;
  value = -1;
  if (keel_env_int("KEEL_STATUS_FD", 0, 1 << 20, &value) != KEEL_OK) return KEEL_EINVAL;
  ctx->status_fd = (int)value;
  if (keel_env_duration_ns("KEEL_TIMEOUT", &ctx->timeout_ns) != KEEL_OK) return KEEL_EINVAL;
  if (keel_env_duration_ns("KEEL_HEARTBEAT", &ctx->heartbeat_ns) != KEEL_OK) return KEEL_EINVAL;
  if (keel_env_duration_ns("KEEL_REPLACE_WAIT", &ctx->replace_wait_ns) != KEEL_OK)
    return KEEL_EINVAL;
  return read_incarnation(ctx) == KEEL_OK ? read_role(ctx) : KEEL_EINVAL;
}

/* ---- background threads */

static void *keepalive_main(void *argument) {
  keel_ctx *ctx = argument;
  int period_ms = (int)(ctx->heartbeat_ns / 3 / 1000000);
  while (!atomic_load(&ctx->stopping)) {
    /* Sleeps on the stop descriptor, so that keel_finalize (a worker leaving for a restart
     * among them) does not wait out a keepalive period. */
    struct pollfd stop = {.fd = ctx->stop_fd, .events = POLLIN};
    poll(&stop, 1, period_ms > 0 ? period_ms : 1);
    if (atomic_load(&ctx->stopping)) break;
    keel_status status = keel_store_lease_keepalive(ctx->keepalive_store, ctx->lease);
    if (status == KEEL_ENOTFOUND) {
      /* Our lease lapsed (we were stopped or starved): the job has declared us failed and
       * will fence us; carrying on would split the job's view of its members. */
      KEEL_LOG_E(MODULE, "lease expired: this process was declared failed; exiting");
      _exit(70);
    }
  }
  return NULL;
}

static void *acceptor_main(void *argument) {
  keel_ctx *ctx = argument;
  while (!atomic_load(&ctx->stopping)) {
    struct pollfd pollers[2] = {{.fd = keel_listener_fd(ctx->listener), .events = POLLIN},
                                {.fd = ctx->stop_fd, .events = POLLIN}};
    if (poll(pollers, 2, 100) <= 0 || pollers[0].revents == 0) continue;
    keel_link *link = NULL;
    keel_status status =
        keel_listener_accept(ctx->listener, &ctx->auth, keel_deadline_after_ns(2000000000), &link);
    if (status != KEEL_OK) continue; /* a failed handshake was logged where it was decided */
    pthread_mutex_lock(&ctx->accepted_mutex);
    bool full = ctx->accepted_count == (int)(sizeof ctx->accepted / sizeof ctx->accepted[0]);
    if (!full) ctx->accepted[ctx->accepted_count++] = link;
    pthread_mutex_unlock(&ctx->accepted_mutex);
    if (full) {
      keel_link_close(link);
      continue;
    }
    uint64_t one = 1;
    ssize_t ignored = write(ctx->wake_fd, &one, sizeof one);
    (void)ignored;
  }
  return NULL;
}

void keel__take_accepted_links(keel_ctx *ctx) {
  uint64_t count;
  ssize_t ignored = read(ctx->wake_fd, &count, sizeof count);
  (void)ignored;
  pthread_mutex_lock(&ctx->accepted_mutex);
  for (int i = 0; i < ctx->accepted_count; i++) {
    keel_link *link = ctx->accepted[i];
    keel__peer *peer = keel__peer_get(ctx, keel_link_peer_id(link));
    if (peer == NULL || peer->link != NULL) {
      /* Two links to one peer would break frame order; keep the first. */
      KEEL_LOG_W(MODULE, "dropping a second link from uid %u", keel_link_peer_id(link));
      keel_link_close(link);
      continue;
    }
    peer->link = link;
    peer->failed = false;
    KEEL_LOG_D(MODULE, "accepted link from uid %u", peer->uid);
  }
  ctx->accepted_count = 0;
  pthread_mutex_unlock(&ctx->accepted_mutex);
}

/* ---- links to members */

static keel_status lookup_address(keel_ctx *ctx, uint32_t uid, char *address, size_t capacity) {
  char key[64];
  snprintf(key, sizeof key, "proc/%" PRIu32, uid);
  keel_store_entry *entry = NULL;
  keel_status status = keel_store_get(ctx->store, key, &entry);
  if (status != KEEL_OK) return status;
  const char *found = strstr((const char *)entry->value, "addr=");
  status = KEEL_ECORRUPT;
  if (found != NULL) {
    size_t length = strcspn(found + 5, " ");
    if (length < capacity) {
      memcpy(address, found + 5, length);
      address[length] = '\0';
      status = KEEL_OK;
    }
  }
  keel_store_entry_free(entry);
  return status;
}

static keel_status connect_to(keel_ctx *ctx, keel__peer *peer, int64_t deadline_ns) {
  char address[128];
  keel_status status;
  /* The peer may not have published its address yet: wait for proc/<uid>. */
  while ((status = lookup_address(ctx, peer->uid, address, sizeof address)) == KEEL_ENOTFOUND) {
    char key[64];
    snprintf(key, sizeof key, "proc/%" PRIu32, peer->uid);
    uint64_t revision = 0;
    keel_store_wait(ctx->store, key, 0, keel_now_ns() + 50000000 < deadline_ns
                                            ? keel_now_ns() + 50000000
                                            : deadline_ns,
                    &revision);
    if (keel_now_ns() >= deadline_ns) return KEEL_ETIMEDOUT;
  }
  if (status != KEEL_OK) return status;
  keel_link *link = NULL;
  status = keel_link_connect(address, &ctx->auth, deadline_ns, &link);
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
  peer->link = link;
  peer->failed = false;
  return KEEL_OK;
}

keel_status keel__ensure_links(keel_ctx *ctx, const uint32_t *uids, int count, int64_t deadline_ns) {
  for (int i = 0; i < count; i++) {
    if (uids[i] == ctx->uid || uids[i] > ctx->uid) continue;
    keel__peer *peer = keel__peer_get(ctx, uids[i]);
    if (peer == NULL) return KEEL_ENOMEM;
    if (peer->link != NULL || peer->failed) continue;
    keel_status status = connect_to(ctx, peer, deadline_ns);
    if (status != KEEL_OK) return status;
  }
  /* Higher uids connect to us; wait for each to arrive through the acceptor. */
  for (;;) {
    keel__take_accepted_links(ctx);
    bool missing = false;
    for (int i = 0; i < count && !missing; i++) {
      if (uids[i] <= ctx->uid) continue;
      keel__peer *peer = keel__peer_get(ctx, uids[i]);
      if (peer == NULL) return KEEL_ENOMEM;
      missing = peer->link == NULL && !peer->failed;
    }
    if (!missing) return KEEL_OK;
    if (keel_now_ns() >= deadline_ns) return KEEL_ETIMEDOUT;
    struct pollfd poller = {.fd = ctx->wake_fd, .events = POLLIN};
    poll(&poller, 1, keel_poll_timeout_ms(deadline_ns) < 50 ? keel_poll_timeout_ms(deadline_ns)
                                                            : 50);
  }
}

keel_status keel__publish_proc(keel_ctx *ctx, int rank, uint64_t epoch) {
  static const char *const role_names[] = {"worker", "spare", "joiner"};
  char key[64], value[256];
  snprintf(key, sizeof key, "proc/%" PRIu32, ctx->uid);
  int length = snprintf(value, sizeof value,
                        "pid=%d node=%d role=%s rank=%d epoch=%" PRIu64 " addr=%s", (int)getpid(),
                        ctx->node, role_names[ctx->role], rank, epoch, ctx->address);
  return keel_store_put(ctx->store, key, value, (size_t)length, ctx->lease, NULL);
}

/* ---- init and start */

static void ctx_defaults(keel_ctx *ctx) {
  ctx->status_fd = -1;
  ctx->wake_fd = -1;
  ctx->stop_fd = -1;
  ctx->timeout_ns = 30 * (int64_t)1000000000;
  /* Two seconds: a lease must survive a process not being scheduled for a while on a
   * loaded machine, or a slow process is taken for a hung one. */
  ctx->heartbeat_ns = 2000000000;
  ctx->replace_wait_ns = 10 * (int64_t)1000000000;
  ctx->initial_world = 1;
  ctx->max_world = 1;
  const char *detection = getenv("KEEL_FAILURE_DETECTION");
  ctx->failure_detection = detection == NULL || strcmp(detection, "off") != 0;
  atomic_init(&ctx->stopping, false);
  pthread_mutex_init(&ctx->accepted_mutex, NULL);
}

static keel_status init_standalone(keel_ctx *ctx) {
  ctx->standalone = true;
  uint32_t only = 0;
  const char *fault = getenv("KEEL_FAULT");
  if (fault != NULL && keel__faults_parse(ctx, fault) != KEEL_OK) return KEEL_EINVAL;
  return keel__comm_create(ctx, 0, &only, 1) == NULL ? KEEL_ENOMEM : KEEL_OK;
}

static keel_status start_threads(keel_ctx *ctx) {
  if (pthread_create(&ctx->acceptor_thread, NULL, acceptor_main, ctx) != 0) return KEEL_ENOMEM;
  ctx->acceptor_started = true;
  if (pthread_create(&ctx->keepalive_thread, NULL, keepalive_main, ctx) != 0) return KEEL_ENOMEM;
  ctx->keepalive_started = true;
  return KEEL_OK;
}

static keel_status join_job(keel_ctx *ctx) {
  keel_status status = read_environment(ctx);
  if (status != KEEL_OK) return status;
  char identity[32];
  snprintf(identity, sizeof identity, "uid %" PRIu32, ctx->uid);
  keel_log_set_identity(identity);
  const char *fault = getenv("KEEL_FAULT");
  if (fault != NULL && (status = keel__faults_parse(ctx, fault)) != KEEL_OK) return status;

  int64_t deadline = keel_deadline_after_ns(60 * (int64_t)1000000000);
  if ((status = keel_store_connect(ctx->store_endpoint, &ctx->auth, deadline, &ctx->store)))
    return status;
  if ((status = keel_store_connect(ctx->store_endpoint, &ctx->auth, deadline,
                                   &ctx->keepalive_store)))
    return status;
  if ((status = keel_store_lease_grant(ctx->store, ctx->heartbeat_ns, &ctx->lease))) return status;
  const char *host = getenv("KEEL_HOST");
  char listen_address[96];
  snprintf(listen_address, sizeof listen_address, "%s:0", host ? host : "127.0.0.1");
  if ((status = keel_listener_open(listen_address, &ctx->listener))) return status;
  snprintf(ctx->address, sizeof ctx->address, "%s", keel_listener_address(ctx->listener));
  ctx->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ctx->wake_fd < 0) return keel_status_from_errno(errno);
  ctx->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ctx->stop_fd < 0) return keel_status_from_errno(errno);
  if ((status = start_threads(ctx))) return status;

  bool worker = ctx->role == KEEL__ROLE_WORKER;
  if (worker && (ctx->uid < ctx->first_uid || ctx->uid - ctx->first_uid >= (uint32_t)ctx->initial_world)) {
    KEEL_LOG_E(MODULE, "uid %" PRIu32 " is not a worker of the world KEEL_FIRST_UID=%" PRIu32
               " KEEL_WORLD=%d", ctx->uid, ctx->first_uid, ctx->initial_world);
    return KEEL_EINVAL;
  }
  int rank = worker ? (int)(ctx->uid - ctx->first_uid) : -1;
  if ((status = keel__publish_proc(ctx, rank, ctx->first_epoch))) return status;
  if (!worker) return KEEL_OK;
  uint32_t uids[1024];
  for (int member = 0; member < ctx->initial_world; member++)
    uids[member] = ctx->first_uid + (uint32_t)member;
  if (keel__comm_create(ctx, ctx->first_epoch, uids, ctx->initial_world) == NULL)
    return KEEL_ENOMEM;
  return keel__ensure_links(ctx, uids, ctx->initial_world, deadline);
}

keel_status keel_init(keel_ctx **ctx_p) {
  keel_ctx *ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) return KEEL_ENOMEM;
  ctx_defaults(ctx);
  /* A peer that vanishes mid-write must give an error, not a signal that kills us. */
  signal(SIGPIPE, SIG_IGN);
  keel_status status = getenv("KEEL_STORE") == NULL ? init_standalone(ctx) : join_job(ctx);
  if (status != KEEL_OK) {
    KEEL_LOG_E(MODULE, "cannot join the job: %s", keel_strerror(status));
    keel_finalize(ctx);
    return status;
  }
  *ctx_p = ctx;
  return KEEL_OK;
}

keel_status keel_state_register(keel_ctx *ctx, const char *name, void *data, size_t bytes) {
  if (ctx->state_count == KEEL__MAX_STATE_BUFFERS || name == NULL) return KEEL_EINVAL;
  if (data == NULL && bytes > 0) return KEEL_EINVAL;
  keel__state_buffer *buffer = &ctx->state[ctx->state_count++];
  snprintf(buffer->name, sizeof buffer->name, "%s", name);
  buffer->data = data;
  buffer->bytes = bytes;
  return KEEL_OK;
}

/* A spare connects ahead of time to the live members below its uid, so that taking a rank
 * costs no handshake. Best effort and brief: a peer that is gone is skipped, and anything
 * missed is linked when a decision admits us. */
static bool marked_failed(const keel_store_entry *entries, size_t count, uint32_t uid) {
  char dead[32], suspect[32];
  snprintf(dead, sizeof dead, "dead/%" PRIu32, uid);
  snprintf(suspect, sizeof suspect, "suspect/%" PRIu32, uid);
  for (size_t i = 0; i < count; i++) {
    if (strcmp(entries[i].key, dead) == 0 || strcmp(entries[i].key, suspect) == 0) return true;
  }
  return false;
}

static void spare_preconnect(keel_ctx *ctx) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(ctx->store, "", &entries, &count, NULL) != KEEL_OK) return;
  for (size_t i = 0; i < count; i++) {
    if (strncmp(entries[i].key, "proc/", 5) != 0) continue;
    uint32_t uid = (uint32_t)strtoul(entries[i].key + 5, NULL, 10);
    keel__peer *peer = uid < ctx->uid ? keel__peer_get(ctx, uid) : NULL;
    if (peer == NULL || peer->link != NULL || marked_failed(entries, count, uid)) continue;
    connect_to(ctx, peer, keel_deadline_after_ns(300 * 1000000));
  }
  keel_store_entries_free(entries, count);
}

keel_status keel_start(keel_ctx *ctx) {
  if (ctx->standalone || ctx->role == KEEL__ROLE_WORKER) return KEEL_OK;
  char key[64];
  snprintf(key, sizeof key, "%s/%" PRIu32, ctx->role == KEEL__ROLE_SPARE ? "spare" : "join",
           ctx->uid);
  keel_status status = keel_store_put(ctx->store, key, "", 0, ctx->lease, NULL);
  if (status != KEEL_OK) return status;
  spare_preconnect(ctx);
  keel__decision decision;
  status = keel__wait_for_admission(ctx, &decision);
  for (;;) {
    if (status != KEEL_OK) return status;
    keel_store_delete(ctx->store, key);
    bool received = false;
    status = keel__apply_decision(ctx, &decision, &received, NULL);
    if (status == KEEL_OK) {
      ctx->role = KEEL__ROLE_WORKER;
      ctx->newcomer = true;
      keel__publish_proc(ctx, ctx->world->rank, ctx->world->epoch);
      return KEEL_OK;
    }
    if (status == KEEL_EEXCLUDED) {
      /* A later decision went on without us: wait to be admitted again. */
      status = keel__wait_for_admission(ctx, &decision);
      continue;
    }
    /* We are a member of the new epoch, but the state did not arrive (its sender failed,
     * say): take part in that epoch's recovery like any member, as one that holds no state,
     * so the next decision names another sender for us. */
    KEEL_LOG_W(MODULE, "state transfer failed (%s); recovering the new epoch",
               keel_strerror(status));
    keel_comm_revoke(ctx->world);
    keel__contribution mine = {.flags = 1, .rebuild = true, .has_state = false};
    status = keel__agree(ctx->world, &mine, &decision);
  }
}

size_t keel_state_count(const keel_ctx *ctx) { return (size_t)ctx->state_count; }

keel_status keel_state_get(const keel_ctx *ctx, size_t index, const char **name_p, void **data_p,
                           size_t *bytes_p) {
  if (index >= (size_t)ctx->state_count) return KEEL_ERANGE;
  const keel__state_buffer *buffer = &ctx->state[index];
  if (name_p) *name_p = buffer->name;
  if (data_p) *data_p = buffer->data;
  if (bytes_p) *bytes_p = buffer->bytes;
  return KEEL_OK;
}

uint64_t keel_job_id(const keel_ctx *ctx) { return ctx->standalone ? 1 : ctx->auth.job_id; }
uint32_t keel_restart_count(const keel_ctx *ctx) { return ctx->restart_count; }

bool keel_current_step(const keel_ctx *ctx, uint64_t *step_p) {
  if (ctx->step_known && step_p) *step_p = ctx->current_step;
  return ctx->step_known;
}

keel_status keel_on_failure(keel_ctx *ctx, keel_failure_hook hook, void *arg) {
  if (hook == NULL) return KEEL_EINVAL;
  if (ctx->failure_hook_count == KEEL__MAX_FAILURE_HOOKS) return KEEL_ERANGE;
  ctx->failure_hooks[ctx->failure_hook_count] = hook;
  ctx->failure_hook_args[ctx->failure_hook_count] = arg;
  ctx->failure_hook_count++;
  return KEEL_OK;
}

keel_comm *keel_world(keel_ctx *ctx) { return ctx->world; }
bool keel_is_newcomer(const keel_ctx *ctx) { return ctx->newcomer; }
int keel_comm_rank(const keel_comm *comm) { return comm->rank; }
int keel_comm_size(const keel_comm *comm) { return comm->size; }
uint64_t keel_comm_epoch(const keel_comm *comm) { return comm->epoch; }
uint32_t keel_comm_uid(const keel_comm *comm, int rank) {
  return rank >= 0 && rank < comm->size ? comm->uids[rank] : UINT32_MAX;
}
void keel_comm_set_timeout(keel_comm *comm, int64_t timeout_ns) { comm->timeout_ns = timeout_ns; }
const char *keel_comm_transport(const keel_comm *comm) {
  if (comm->size == 1) return "self";
  return comm->shm != NULL ? "shm" : "tcp";
}

/* ---- the end */

static void say_goodbye(keel_ctx *ctx) {
  for (uint32_t uid = 0; uid < KEEL__MAX_UIDS; uid++) {
    keel__peer *peer = ctx->peers[uid];
    if (peer == NULL || peer->link == NULL || peer->failed) continue;
    keel__send(ctx, uid, KEEL_FRAME_GOODBYE, ctx->world ? ctx->world->epoch : 0, 0, NULL, 0, NULL);
  }
  keel__flush(ctx, keel_deadline_after_ns(1000000000));
}

/* Whether every linked peer has said goodbye (a goodbye is a peer's last frame) or is gone. */
static bool peers_all_done(const keel_ctx *ctx) {
  for (uint32_t uid = 0; uid < KEEL__MAX_UIDS; uid++) {
    const keel__peer *peer = ctx->peers[uid];
    if (peer != NULL && peer->link != NULL && !peer->failed && !peer->left) return false;
  }
  return true;
}

/* A lingering close: after its goodbye a process reads what its peers still send until
 * each has said goodbye too or is gone, or the deadline, so that no unread byte makes
 * close() reset a connection whose last data a slower peer has not read yet. */
static void linger_until_peers_done(keel_ctx *ctx, int64_t deadline_ns) {
  while (!peers_all_done(ctx) && keel_now_ns() < deadline_ns)
    keel__progress(ctx, keel_deadline_after_ns(50 * 1000000));
  keel__progress(ctx, 0);
}

static void free_peers(keel_ctx *ctx) {
  for (uint32_t uid = 0; uid < KEEL__MAX_UIDS; uid++) {
    keel__peer *peer = ctx->peers[uid];
    if (peer == NULL) continue;
    while (peer->queue_head != NULL) {
      keel__send_item *item = peer->queue_head;
      peer->queue_head = item->next;
      free(item->owned);
      free(item);
    }
    keel_link_close(peer->link);
    free(peer);
  }
}

void keel_finalize(keel_ctx *ctx) {
  if (ctx == NULL) return;
  if (!ctx->standalone && ctx->store != NULL) {
    say_goodbye(ctx);
    linger_until_peers_done(ctx, keel_deadline_after_ns(LINGER_NS));
  }
  atomic_store(&ctx->stopping, true);
  if (ctx->stop_fd >= 0) {
    uint64_t one = 1;
    ssize_t ignored = write(ctx->stop_fd, &one, sizeof one);
    (void)ignored;
  }
  if (ctx->acceptor_started) pthread_join(ctx->acceptor_thread, NULL);
  if (ctx->keepalive_started) pthread_join(ctx->keepalive_thread, NULL);
  if (ctx->lease != 0 && ctx->store != NULL) {
    /* Say we left before the lease goes, so that the launcher does not take the vanished
     * proc/ key of a process that is still finishing for a hung one. */
    char key[64], value[32];
    snprintf(key, sizeof key, "left/%" PRIu32, ctx->uid);
    int length = snprintf(value, sizeof value, "pid=%d", (int)getpid());
    keel_store_put(ctx->store, key, value, (size_t)length, 0, NULL);
    keel_store_lease_revoke(ctx->store, ctx->lease);
  }
  keel__take_accepted_links(ctx);
  free_peers(ctx);
  keel__slots_reset(ctx);
  free(ctx->slots);
  keel__drop_stale_unexpected(ctx, UINT64_MAX);
  while (ctx->world != NULL) {
    keel_comm *older = ctx->world->older;
    keel__shm_release(ctx->world);
    free(ctx->world->uids);
    free(ctx->world);
    ctx->world = older;
  }
  keel_listener_close(ctx->listener);
  keel_store_close(ctx->keepalive_store);
  keel_store_close(ctx->store);
  if (ctx->wake_fd >= 0) close(ctx->wake_fd);
  if (ctx->stop_fd >= 0) close(ctx->stop_fd);
  pthread_mutex_destroy(&ctx->accepted_mutex);
  free(ctx->scratch);
  free(ctx);
}
