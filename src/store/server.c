/* The embedded store server: an accept thread that runs each handshake (so a slow
 * connector never delays requests), a thread per client link that decodes its requests
 * and applies them to the key-value state under one mutex, and a lease thread that
 * expires leases on time, wakes the waiters their keys concern, and ticks while leases
 * exist so that the state can tell when this process itself stalled. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store/store_internal.h"

/* A connector that has not finished its handshake by then is dropped. */
#define SERVER_HANDSHAKE_TIMEOUT_NS (2 * (int64_t)1000000000)
/* Longest a wait holds its thread before answering KEEL_ETIMEDOUT (the client asks again),
 * so that the thread of a client that vanished mid-wait is not held long. */
#define SERVER_MAX_WAIT_NS (10 * (int64_t)1000000000)
/* A client that does not read its answers within this is dropped. */
#define SERVER_SEND_TIMEOUT_NS (10 * (int64_t)1000000000)
/* The store serves tens of clients; this bounds the threads a flood of connections makes. */
#define SERVER_MAX_CLIENTS 1024
/* A response buffer grown past this by a big list is given back after its answer. */
#define SERVER_RESPONSE_KEEP_BYTES ((size_t)1 << 20)
#define SERVER_RESPONSE_INITIAL_BYTES 4096

typedef struct store_client {
  struct store_client *next;
  keel_store_server *server;
  keel_link *link; /* closed and cleared by its own thread, under server->lock */
  int fd;          /* the link's socket, for stop to shut down without using the link */
  pthread_t thread;
  bool finished; /* its thread has returned or is about to; under server->lock */
  uint32_t peer;
  keel_buffer response;
} store_client;

struct keel_store_server {
  keel_auth auth;
  keel_listener *listener;
  int wake_fd;                  /* eventfd: stop and finishing clients wake the accept thread */
  pthread_mutex_t lock;         /* guards everything below */
  pthread_cond_t changed;       /* broadcast on every revision: waiters re-check */
  pthread_cond_t lease_changed; /* a lease was granted or the server stops */
  keel__store_kv *kv;
  bool stopping;
  store_client *clients;
  size_t client_count;
  pthread_t accept_thread;
  pthread_t lease_thread;
};

static void wait_until(pthread_cond_t *cond, pthread_mutex_t *lock, int64_t deadline_ns) {
  if (deadline_ns == KEEL_NO_DEADLINE) {
    pthread_cond_wait(cond, lock);
    return;
  }
  struct timespec until = {.tv_sec = (time_t)(deadline_ns / 1000000000),
                           .tv_nsec = (long)(deadline_ns % 1000000000)};
  pthread_cond_timedwait(cond, lock, &until);
}

static void wake_acceptor(keel_store_server *server) {
  uint64_t one = 1;
  /* The counter only has to be non-zero; a full counter is already a wake-up. */
  ssize_t written = write(server->wake_fd, &one, sizeof one);
  (void)written;
}

static void *lease_thread_main(void *argument) {
  keel_store_server *server = argument;
  pthread_mutex_lock(&server->lock);
  while (!server->stopping) {
    int64_t now_ns = keel_now_ns();
    if (keel__store_kv_expire(server->kv, now_ns)) pthread_cond_broadcast(&server->changed);
    /* While leases exist, wake every tick even with no expiry near: the kv tells a stall
     * of this process from an idle store by the gaps between its services. */
    int64_t wake_ns = keel__store_kv_next_expiry(server->kv);
    if (wake_ns != KEEL_NO_DEADLINE && wake_ns - now_ns > KEEL__STORE_LEASE_TICK_NS)
      wake_ns = now_ns + KEEL__STORE_LEASE_TICK_NS;
    wait_until(&server->lease_changed, &server->lock, wake_ns);
  }
  pthread_mutex_unlock(&server->lock);
  return NULL;
}

/* Blocks under server->lock until the wait's prefix changed past its revision, its
 * timeout (clamped) passes, or the server stops; appends the answer. */
static keel_status serve_wait(keel_store_server *server, const keel__store_request *request,
                              keel_buffer *response) {
  int64_t timeout_ns =
      request->duration_ns < SERVER_MAX_WAIT_NS ? request->duration_ns : SERVER_MAX_WAIT_NS;
  int64_t deadline_ns = keel_deadline_after_ns(timeout_ns);
  keel_status result;
  for (;;) {
    /* Expiring here too keeps a wait's answer in step with the clock, as apply does. */
    if (keel__store_kv_expire(server->kv, keel_now_ns())) pthread_cond_broadcast(&server->changed);
    if (keel__store_kv_changed_since(server->kv, request->key, request->key_length,
                                     request->revision)) {
      result = KEEL_OK;
      break;
    }
    if (server->stopping) {
      result = KEEL_ECLOSED;
      break;
    }
    if (keel_now_ns() >= deadline_ns) {
      result = KEEL_ETIMEDOUT;
      break;
    }
    wait_until(&server->changed, &server->lock, deadline_ns);
  }
  return keel__store_response_begin(response, request->op, request->id, result,
                                    keel__store_kv_revision(server->kv), 0, 0);
}

/* Answers one frame. Any status but KEEL_OK ends the client's link: a malformed request
 * (the client is broken or hostile), a failed send, or the server stopping. */
static keel_status serve_frame(store_client *client, const keel_frame *frame,
                               const uint8_t *payload) {
  keel_store_server *server = client->server;
  if (frame->type == KEEL_FRAME_GOODBYE) return KEEL_ECLOSED;
  if (frame->type != KEEL_FRAME_STORE_REQUEST) {
    KEEL_LOG_W("store", "client %u sent a frame of type %u; closing its link", client->peer,
               frame->type);
    return KEEL_EPROTO;
  }
  keel__store_request request;
  keel_status status = keel__store_request_decode(payload, frame->length, &request);
  if (status != KEEL_OK) {
    KEEL_LOG_W("store", "client %u sent a malformed request (%s); closing its link", client->peer,
               keel_strerror(status));
    return status;
  }
  keel_buffer_reset(&client->response);
  pthread_mutex_lock(&server->lock);
  bool stopped = false;
  if (request.op == KEEL__STORE_OP_WAIT && request.duration_ns > 0) {
    status = serve_wait(server, &request, &client->response);
    stopped = server->stopping;
  } else {
    bool changed = false;
    status = keel__store_kv_apply(server->kv, &request, keel_now_ns(), &client->response, &changed);
    if (changed) pthread_cond_broadcast(&server->changed);
    if (request.op == KEEL__STORE_OP_LEASE_GRANT) pthread_cond_signal(&server->lease_changed);
  }
  if (status != KEEL_OK) {
    /* The answer could not be built (memory): say so rather than leave the client
     * waiting; the buffer keeps its initial room, so a bare header fits. */
    client->response.length = 0;
    status = keel__store_response_begin(&client->response, request.op, request.id, status,
                                        keel__store_kv_revision(server->kv), 0, 0);
  }
  pthread_mutex_unlock(&server->lock);
  if (status != KEEL_OK) return status;
  keel_frame answer = {.type = KEEL_FRAME_STORE_RESPONSE, .tag = request.id};
  status = keel_link_send(client->link, &answer, client->response.data, client->response.length,
                          keel_deadline_after_ns(SERVER_SEND_TIMEOUT_NS));
  if (status != KEEL_OK) {
    KEEL_LOG_D("store", "cannot answer client %u (%s); closing its link", client->peer,
               keel_strerror(status));
    return status;
  }
  if (client->response.capacity > SERVER_RESPONSE_KEEP_BYTES) {
    keel_buffer_free(&client->response);
    keel_buffer_init(&client->response, KEEL__STORE_RESPONSE_BUFFER_MAX);
    status = keel_buffer_reserve(&client->response, SERVER_RESPONSE_INITIAL_BYTES);
  }
  return stopped ? KEEL_ECLOSED : status;
}

static void *client_thread_main(void *argument) {
  store_client *client = argument;
  keel_store_server *server = client->server;
  for (;;) {
    keel_frame frame;
    void *payload = NULL;
    keel_status status = keel_link_recv(client->link, &frame, &payload, KEEL_NO_DEADLINE);
    if (status != KEEL_OK) {
      KEEL_LOG_D("store", "client %u left (%s)", client->peer, keel_strerror(status));
      break;
    }
    status = serve_frame(client, &frame, payload);
    free(payload);
    if (status != KEEL_OK) break;
  }
  pthread_mutex_lock(&server->lock);
  keel_link_close(client->link);
  client->link = NULL;
  client->finished = true;
  pthread_mutex_unlock(&server->lock);
  wake_acceptor(server);
  return NULL;
}

static void client_free(store_client *client) {
  keel_buffer_free(&client->response);
  free(client);
}

/* Joins and frees the clients whose threads have finished (all of them when stopping). */
static void reap_clients(keel_store_server *server, bool all) {
  store_client *done = NULL;
  pthread_mutex_lock(&server->lock);
  for (store_client **at = &server->clients; *at != NULL;) {
    store_client *client = *at;
    if (client->finished || all) {
      *at = client->next;
      client->next = done;
      done = client;
      server->client_count--;
    } else {
      at = &client->next;
    }
  }
  pthread_mutex_unlock(&server->lock);
  while (done != NULL) {
    store_client *client = done;
    done = client->next;
    pthread_join(client->thread, NULL);
    client_free(client);
  }
}

static void accept_one(keel_store_server *server) {
  keel_link *link;
  keel_status status = keel_listener_accept(
      server->listener, &server->auth, keel_deadline_after_ns(SERVER_HANDSHAKE_TIMEOUT_NS), &link);
  if (status != KEEL_OK) {
    /* The net layer decided and logged why; the listener stays usable. */
    KEEL_LOG_D("store", "a connection was not accepted: %s", keel_strerror(status));
    return;
  }
  keel_link_set_max_payload(link, KEEL__STORE_MAX_REQUEST);
  store_client *client = calloc(1, sizeof *client);
  if (client == NULL) goto fail_close_link;
  client->server = server;
  client->link = link;
  client->peer = keel_link_peer_id(link);
  client->fd = keel_link_fd(link);
  keel_buffer_init(&client->response, KEEL__STORE_RESPONSE_BUFFER_MAX);
  if (keel_buffer_reserve(&client->response, SERVER_RESPONSE_INITIAL_BYTES) != KEEL_OK)
    goto fail_free_client;
  pthread_mutex_lock(&server->lock);
  bool full = server->client_count >= SERVER_MAX_CLIENTS;
  pthread_mutex_unlock(&server->lock);
  if (full) {
    KEEL_LOG_W("store", "%d clients already; refusing client %u", SERVER_MAX_CLIENTS, client->peer);
    goto fail_free_client;
  }
  if (pthread_create(&client->thread, NULL, client_thread_main, client) != 0) {
    KEEL_LOG_E("store", "cannot start a thread for client %u", client->peer);
    goto fail_free_client;
  }
  pthread_mutex_lock(&server->lock);
  client->next = server->clients;
  server->clients = client;
  server->client_count++;
  pthread_mutex_unlock(&server->lock);
  return;

fail_free_client:
  client_free(client);
fail_close_link:
  keel_link_close(link);
}

static void *accept_thread_main(void *argument) {
  keel_store_server *server = argument;
  for (;;) {
    struct pollfd watched[2] = {
        {.fd = keel_listener_fd(server->listener), .events = POLLIN},
        {.fd = server->wake_fd, .events = POLLIN},
    };
    if (poll(watched, 2, -1) < 0) {
      if (errno == EINTR) continue;
      KEEL_LOG_E("store", "poll failed: %s; no more clients will be accepted",
                 keel_strerror(keel_status_from_errno(errno)));
      break;
    }
    if (watched[1].revents != 0) {
      uint64_t count;
      ssize_t got = read(server->wake_fd, &count, sizeof count);
      (void)got;
    }
    reap_clients(server, false);
    pthread_mutex_lock(&server->lock);
    bool stopping = server->stopping;
    pthread_mutex_unlock(&server->lock);
    if (stopping) break;
    if (watched[0].revents != 0) accept_one(server);
  }
  return NULL;
}

keel_status keel_store_server_start(const char *listen_address, const keel_auth *auth,
                                    keel_store_server **server_p) {
  if (listen_address == NULL || auth == NULL || server_p == NULL) return KEEL_EINVAL;
  keel_store_server *server = calloc(1, sizeof *server);
  if (server == NULL) return KEEL_ENOMEM;
  server->auth = *auth;
  keel_status status = keel__store_kv_create(&server->kv);
  if (status != KEEL_OK) goto fail_free_server;
  status = KEEL_ENOMEM;
  if (pthread_mutex_init(&server->lock, NULL) != 0) goto fail_destroy_kv;
  pthread_condattr_t attributes;
  if (pthread_condattr_init(&attributes) != 0) goto fail_destroy_lock;
  /* Deadlines are on CLOCK_MONOTONIC (keel_now_ns); the default clock would be wall time. */
  pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
  int failed = pthread_cond_init(&server->changed, &attributes);
  pthread_condattr_destroy(&attributes);
  if (failed != 0) goto fail_destroy_lock;
  if (pthread_condattr_init(&attributes) != 0) goto fail_destroy_changed;
  pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
  failed = pthread_cond_init(&server->lease_changed, &attributes);
  pthread_condattr_destroy(&attributes);
  if (failed != 0) goto fail_destroy_changed;
  server->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (server->wake_fd < 0) {
    status = keel_status_from_errno(errno);
    KEEL_LOG_E("store", "eventfd: %s", keel_strerror(status));
    goto fail_destroy_lease_changed;
  }
  status = keel_listener_open(listen_address, &server->listener);
  if (status != KEEL_OK) {
    KEEL_LOG_E("store", "cannot listen on %s: %s", listen_address, keel_strerror(status));
    goto fail_close_wake;
  }
  status = KEEL_ENOMEM;
  if (pthread_create(&server->lease_thread, NULL, lease_thread_main, server) != 0) {
    KEEL_LOG_E("store", "cannot start the lease thread");
    goto fail_close_listener;
  }
  if (pthread_create(&server->accept_thread, NULL, accept_thread_main, server) != 0) {
    KEEL_LOG_E("store", "cannot start the accept thread");
    goto fail_stop_lease_thread;
  }
  KEEL_LOG_I("store", "embedded store listening on %s", keel_listener_address(server->listener));
  *server_p = server;
  return KEEL_OK;

fail_stop_lease_thread:
  pthread_mutex_lock(&server->lock);
  server->stopping = true;
  pthread_cond_signal(&server->lease_changed);
  pthread_mutex_unlock(&server->lock);
  pthread_join(server->lease_thread, NULL);
fail_close_listener:
  keel_listener_close(server->listener);
fail_close_wake:
  close(server->wake_fd);
fail_destroy_lease_changed:
  pthread_cond_destroy(&server->lease_changed);
fail_destroy_changed:
  pthread_cond_destroy(&server->changed);
fail_destroy_lock:
  pthread_mutex_destroy(&server->lock);
fail_destroy_kv:
  keel__store_kv_destroy(server->kv);
fail_free_server:
  free(server);
  return status;
}

const char *keel_store_server_address(const keel_store_server *server) {
  return keel_listener_address(server->listener);
}

void keel_store_server_stop(keel_store_server *server) {
  if (server == NULL) return;
  pthread_mutex_lock(&server->lock);
  server->stopping = true;
  pthread_cond_broadcast(&server->changed);
  pthread_cond_signal(&server->lease_changed);
  pthread_mutex_unlock(&server->lock);
  wake_acceptor(server);
  pthread_join(server->accept_thread, NULL);
  pthread_join(server->lease_thread, NULL);
  /* Client threads block in a receive with no deadline: shutting their sockets down ends
   * it (the link itself stays owned, and is closed, by its thread). */
  pthread_mutex_lock(&server->lock);
  for (store_client *client = server->clients; client != NULL; client = client->next)
    if (client->link != NULL) shutdown(client->fd, SHUT_RDWR);
  pthread_mutex_unlock(&server->lock);
  reap_clients(server, true);
  keel_listener_close(server->listener);
  close(server->wake_fd);
  pthread_cond_destroy(&server->lease_changed);
  pthread_cond_destroy(&server->changed);
  pthread_mutex_destroy(&server->lock);
  keel__store_kv_destroy(server->kv);
  free(server);
}
