/* TCP set-up for links: "host:port" addresses, listeners, connecting with retries while
 * the peer is not listening yet, and accepting; each new socket is non-blocking,
 * close-on-exec and tuned for bulk transfers before its handshake runs. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net_internal.h"

#define LOG_MODULE "net"
/* Socket buffers large enough for a ring step's chunk in flight (best effort: the kernel
 * caps them at net.core.[rw]mem_max). */
#define SOCKET_BUFFER_BYTES (4 << 20)
/* A poll of keel_listener_accept (deadline 0) that finds a connection gives its handshake
 * this long: it needs a few round trips, and a silent client must not hold it forever. */
#define ACCEPT_POLL_HANDSHAKE_NS ((int64_t)2000000000)
#define CONNECT_BACKOFF_MIN_NS ((int64_t)1000000)
#define CONNECT_BACKOFF_MAX_NS ((int64_t)10000000)
/* A connection attempt that gets no answer (a partitioned host drops the SYN) asks its
 * caller this often whether the peer is still worth waiting for. */
#define CONNECT_LOOK_NS ((int64_t)100000000)
#define HOST_BYTES 256
#define PORT_BYTES 8

struct keel_listener {
  int fd;
  char address[KEEL__ADDRESS_BYTES];
};

/* Splits "host:port" ("[v6]:port" too) at its last colon. An empty host or "*" means
 * every local address (listeners only). */
static keel_status address_split(const char *address, char *host, char *port) {
  const char *colon = address == NULL ? NULL : strrchr(address, ':');
  if (colon == NULL) return KEEL_EINVAL;
  const char *host_start = address;
  size_t host_length = (size_t)(colon - address);
  if (host_length >= 2 && address[0] == '[' && colon[-1] == ']') {
    host_start++;
    host_length -= 2;
  }
  size_t port_length = strlen(colon + 1);
  if (host_length >= HOST_BYTES || port_length == 0 || port_length >= PORT_BYTES)
    return KEEL_EINVAL;
  for (size_t i = 0; i < port_length; i++)
    if (colon[1 + i] < '0' || colon[1 + i] > '9') return KEEL_EINVAL;
  memcpy(host, host_start, host_length);
  host[host_length] = '\0';
  memcpy(port, colon + 1, port_length + 1);
  if (strcmp(host, "*") == 0) host[0] = '\0';
  return KEEL_OK;
}

static keel_status address_resolve(const char *address, bool passive, struct addrinfo **list_p) {
  char host[HOST_BYTES];
  char port[PORT_BYTES];
  if (address_split(address, host, port) != KEEL_OK) {
    KEEL_LOG_E(LOG_MODULE, "'%s' is not an address of the form host:port", address);
    return KEEL_EINVAL;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
  int result = getaddrinfo(host[0] ? host : NULL, port, &hints, list_p);
  if (result != 0) {
    KEEL_LOG_E(LOG_MODULE, "cannot resolve '%s': %s", address, gai_strerror(result));
    return KEEL_ENOTFOUND;
  }
  return KEEL_OK;
}

/* "host:port" of a socket address, numeric. */
static void address_format(const struct sockaddr *socket_address, socklen_t length, char *text,
                           size_t capacity) {
  char host[INET6_ADDRSTRLEN];
  char port[PORT_BYTES];
  if (getnameinfo(socket_address, length, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    snprintf(text, capacity, "?");
    return;
  }
  if (socket_address->sa_family == AF_INET6)
    snprintf(text, capacity, "[%s]:%s", host, port);
  else
    snprintf(text, capacity, "%s:%s", host, port);
}

/* Options every link socket gets; all best effort, since a link works without them. */
static void socket_tune(int fd) {
  int one = 1;
  int bytes = SOCKET_BUFFER_BYTES;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

/* ---- listener */

keel_status keel_listener_open(const char *address, keel_listener **listener_p) {
  struct addrinfo *list = NULL;
  keel_status status = address_resolve(address, true, &list);
  if (status != KEEL_OK) return status;
  keel_listener *listener = calloc(1, sizeof *listener);
  if (listener == NULL) {
    KEEL_LOG_E(LOG_MODULE, "no memory for a listener");
    status = KEEL_ENOMEM;
    goto fail_free_addresses;
  }
  int fd = -1;
  int error = 0;
  for (struct addrinfo *entry = list; entry != NULL && fd < 0; entry = entry->ai_next) {
    fd = socket(entry->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = errno;
      continue;
    }
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* Set before listen so that accepted sockets inherit the buffers and the window scale
     * negotiated in their first packets reflects them. */
    socket_tune(fd);
    if (bind(fd, entry->ai_addr, entry->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      error = errno;
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    status = keel_status_from_errno(error);
    KEEL_LOG_E(LOG_MODULE, "cannot listen on %s: %s", address, strerror(error));
    goto fail_free_listener;
  }
  struct sockaddr_storage bound;
  socklen_t bound_length = sizeof bound;
  if (getsockname(fd, (struct sockaddr *)&bound, &bound_length) != 0) {
    error = errno;
    status = keel_status_from_errno(error);
    KEEL_LOG_E(LOG_MODULE, "getsockname on %s: %s", address, strerror(error));
    goto fail_close_socket;
  }
  listener->fd = fd;
  address_format((struct sockaddr *)&bound, bound_length, listener->address,
                 sizeof listener->address);
  freeaddrinfo(list);
  *listener_p = listener;
  return KEEL_OK;

fail_close_socket:
  close(fd);
fail_free_listener:
  free(listener);
fail_free_addresses:
  freeaddrinfo(list);
  return status;
}

const char *keel_listener_address(const keel_listener *listener) { return listener->address; }

int keel_listener_fd(const keel_listener *listener) { return listener->fd; }

void keel_listener_close(keel_listener *listener) {
  if (listener == NULL) return;
  close(listener->fd);
  free(listener);
}

/* Takes one pending connection; KEEL_EAGAIN when none is. */
static keel_status listener_take(keel_listener *listener, int *fd_p, char *peer, size_t capacity) {
  for (;;) {
    struct sockaddr_storage from;
    socklen_t from_length = sizeof from;
    int fd =
        accept4(listener->fd, (struct sockaddr *)&from, &from_length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      socket_tune(fd);
      address_format((struct sockaddr *)&from, from_length, peer, capacity);
      *fd_p = fd;
      return KEEL_OK;
    }
    int error = errno;
    /* A connection that was reset before we took it is not our failure. */
    if (error == EINTR || error == ECONNABORTED) continue;
    if (error == EAGAIN || error == EWOULDBLOCK) return KEEL_EAGAIN;
    KEEL_LOG_E(LOG_MODULE, "accept on %s: %s", listener->address, strerror(error));
    return keel_status_from_errno(error);
  }
}

keel_status keel_listener_accept(keel_listener *listener, const keel_auth *auth,
                                 int64_t handshake_deadline_ns, keel_link **link_p) {
  int fd = -1;
  char peer[KEEL__ADDRESS_BYTES];
  for (;;) {
    keel_status status = listener_take(listener, &fd, peer, sizeof peer);
    if (status == KEEL_OK) break;
    if (status != KEEL_EAGAIN) return status;
    if (handshake_deadline_ns == 0) return KEEL_EAGAIN;
    struct pollfd entry = {.fd = listener->fd, .events = POLLIN};
    int ready = poll(&entry, 1, keel_poll_timeout_ms(handshake_deadline_ns));
    if (ready < 0 && errno != EINTR) {
      int error = errno;
      KEEL_LOG_E(LOG_MODULE, "poll on %s: %s", listener->address, strerror(error));
      return keel_status_from_errno(error);
    }
    if (ready == 0 && keel_now_ns() >= handshake_deadline_ns) return KEEL_ETIMEDOUT;
  }
  int64_t deadline_ns = handshake_deadline_ns;
  if (deadline_ns == 0) deadline_ns = keel_deadline_after_ns(ACCEPT_POLL_HANDSHAKE_NS);
  keel_link *link = NULL;
  keel_status status = keel__link_create(fd, auth, peer, &link);
  if (status != KEEL_OK) return status;
  status = keel__handshake_accept(link, auth, deadline_ns);
  if (status != KEEL_OK) {
    keel_link_close(link);
    return status;
  }
  *link_p = link;
  return KEEL_OK;
}

/* ---- connecting */

/* One connection attempt to one address, bounded by the deadline; keep_trying (may be NULL)
 * false while no answer has come ends it as a refusal the caller will not retry. */
static keel_status connect_once(const struct addrinfo *entry, int64_t deadline_ns,
                                keel_link_retry_fn *keep_trying, void *context, int *fd_p) {
  int fd = socket(entry->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return keel_status_from_errno(errno);
  socket_tune(fd);
  keel_status status = KEEL_OK;
  if (connect(fd, entry->ai_addr, entry->ai_addrlen) != 0) {
    int error = errno;
    if (error != EINPROGRESS && error != EINTR) {
      status = keel_status_from_errno(error);
      goto fail_close_socket;
    }
    for (;;) {
      struct pollfd wait_entry = {.fd = fd, .events = POLLOUT};
      int64_t look_ns = keel_now_ns() + CONNECT_LOOK_NS;
      int ready =
          poll(&wait_entry, 1, keel_poll_timeout_ms(look_ns < deadline_ns ? look_ns : deadline_ns));
      if (ready > 0) break;
      if (ready < 0 && errno != EINTR) {
        status = keel_status_from_errno(errno);
        goto fail_close_socket;
      }
      if (ready == 0 && keel_now_ns() >= deadline_ns) {
        status = KEEL_ETIMEDOUT;
        goto fail_close_socket;
      }
      if (keep_trying != NULL && !keep_trying(context)) {
        status = KEEL_ECONNREFUSED;
        goto fail_close_socket;
      }
    }
    socklen_t length = sizeof error;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error != 0) {
      status = keel_status_from_errno(error);
      goto fail_close_socket;
    }
  }
  *fd_p = fd;
  return KEEL_OK;

fail_close_socket:
  close(fd);
  return status;
}

static void sleep_ns(int64_t duration_ns) {
  struct timespec pause = {.tv_sec = duration_ns / 1000000000, .tv_nsec = duration_ns % 1000000000};
  while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
  }
}

keel_status keel_link_connect(const char *address, const keel_auth *auth, int64_t deadline_ns,
                              keel_link **link_p) {
  return keel_link_connect_while(address, auth, deadline_ns, NULL, NULL, link_p);
}

keel_status keel_link_connect_while(const char *address, const keel_auth *auth, int64_t deadline_ns,
                                    keel_link_retry_fn *keep_trying, void *context,
                                    keel_link **link_p) {
  struct addrinfo *list = NULL;
  keel_status status = address_resolve(address, false, &list);
  if (status != KEEL_OK) return status;
  int fd = -1;
  int64_t backoff_ns = CONNECT_BACKOFF_MIN_NS;
  for (;;) {
    for (const struct addrinfo *entry = list; entry != NULL; entry = entry->ai_next) {
      status = connect_once(entry, deadline_ns, keep_trying, context, &fd);
      if (status != KEEL_ECONNREFUSED) break;
    }
    /* Refused: the peer may not be listening yet, so try again until the deadline. */
    if (status != KEEL_ECONNREFUSED) break;
    if (keep_trying != NULL && !keep_trying(context)) break;
    int64_t left_ns = deadline_ns - keel_now_ns();
    if (left_ns <= 0) {
      status = KEEL_ETIMEDOUT;
      break;
    }
    sleep_ns(backoff_ns < left_ns ? backoff_ns : left_ns);
    backoff_ns = backoff_ns * 2 > CONNECT_BACKOFF_MAX_NS ? CONNECT_BACKOFF_MAX_NS : backoff_ns * 2;
  }
  freeaddrinfo(list);
  if (status != KEEL_OK) {
    KEEL_LOG_W(LOG_MODULE, "cannot connect to %s: %s", address, keel_strerror(status));
    return status;
  }
  keel_link *link = NULL;
  status = keel__link_create(fd, auth, address, &link);
  if (status != KEEL_OK) return status;
  status = keel__handshake_connect(link, auth, deadline_ns);
  if (status != KEEL_OK) {
    keel_link_close(link);
    return status;
  }
  *link_p = link;
  return KEEL_OK;
}
