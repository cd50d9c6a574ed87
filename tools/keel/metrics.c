/* `--metrics-port`: the job's figures in Prometheus' text format (version 0.0.4), served over
 * HTTP/1.0 by a thread of the launcher, or of the root agent in a job of nodes. The loop
 * thread records what it learns (progress and recovery lines, its store requests, the root's
 * decisions) under a mutex; the server thread renders a snapshot for each scrape and never
 * blocks the loop. */
#include "metrics.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "keel/core.h"

/* A scrape that does not send its request within this long is dropped: a slow client must
 * not hold the server (it serves one connection at a time). */
#define REQUEST_DEADLINE_MS 1000

static const double recovery_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
static const double store_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                      0.05,   0.1,   0.25,   0.5,   1};
#define BUCKETS (sizeof recovery_bounds / sizeof recovery_bounds[0])

typedef struct histogram {
  uint64_t counts[BUCKETS + 1]; /* the last: above every bound (+Inf holds the total) */
  uint64_t count;
  double sum;
} histogram;

struct keel__metrics {
  pthread_t thread;
  pthread_mutex_t lock;
  int listen_fd;
  int stop_fd;
  char address[80];
  /* Under lock. */
  int64_t step, world, epoch;
  double samples_per_s;
  uint64_t recoveries, nodes_lost;
  histogram recovery_seconds, store_seconds;
};

static void histogram_add(histogram *h, const double *bounds, double value) {
  size_t bucket = 0;
  while (bucket < BUCKETS && value > bounds[bucket]) bucket++;
  h->counts[bucket]++;
  h->count++;
  h->sum += value;
}

void keel__metrics_progress(keel__metrics *metrics, int64_t step, int64_t world, int64_t epoch,
                            double samples_per_s) {
  if (metrics == NULL) return;
  pthread_mutex_lock(&metrics->lock);
  metrics->step = step;
  metrics->world = world;
  metrics->epoch = epoch;
  metrics->samples_per_s = samples_per_s;
  pthread_mutex_unlock(&metrics->lock);
}

void keel__metrics_recovery(keel__metrics *metrics, double total_ms) {
  if (metrics == NULL) return;
  pthread_mutex_lock(&metrics->lock);
  metrics->recoveries++;
  histogram_add(&metrics->recovery_seconds, recovery_bounds, total_ms / 1e3);
  pthread_mutex_unlock(&metrics->lock);
}

void keel__metrics_store_request(keel__metrics *metrics, int64_t elapsed_ns) {
  if (metrics == NULL) return;
  pthread_mutex_lock(&metrics->lock);
  histogram_add(&metrics->store_seconds, store_bounds, (double)elapsed_ns / 1e9);
  pthread_mutex_unlock(&metrics->lock);
}

void keel__metrics_node_lost(keel__metrics *metrics) {
  if (metrics == NULL) return;
  pthread_mutex_lock(&metrics->lock);
  metrics->nodes_lost++;
  pthread_mutex_unlock(&metrics->lock);
}

/* ---- rendering */
static void histogram_render(keel_buffer *out, const char *name, const char *help,
                             const histogram *h, const double *bounds) {
  keel_buffer_appendf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < BUCKETS; i++) {
    cumulative += h->counts[i];
    keel_buffer_appendf(out, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i],
                        (unsigned long long)cumulative);
  }
  keel_buffer_appendf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
                      (unsigned long long)h->count, name, h->sum, name,
                      (unsigned long long)h->count);
}

static void gauge_render(keel_buffer *out, const char *name, const char *type, const char *help,
                         double value) {
  keel_buffer_appendf(out, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name,
                      value);
}

void keel__metrics_render(keel__metrics *metrics, keel_buffer *out) {
  pthread_mutex_lock(&metrics->lock);
  gauge_render(out, "keel_step", "gauge", "the last step a worker of this node reported",
               (double)metrics->step);
  gauge_render(out, "keel_samples_per_second", "gauge", "training throughput the job reports",
               metrics->samples_per_s);
  gauge_render(out, "keel_world_size", "gauge", "ranks in the current communicator",
               (double)metrics->world);
  gauge_render(out, "keel_epoch", "gauge", "the communicator's epoch (one more per recovery)",
               (double)metrics->epoch);
  gauge_render(out, "keel_recoveries_total", "counter", "recoveries reported by rank 0",
               (double)metrics->recoveries);
  gauge_render(out, "keel_nodes_lost_total", "counter", "nodes the root decided were lost",
               (double)metrics->nodes_lost);
  histogram_render(out, "keel_recovery_seconds", "failure to first collective of the new epoch",
                   &metrics->recovery_seconds, recovery_bounds);
  histogram_render(out, "keel_store_request_seconds", "this process's store requests",
                   &metrics->store_seconds, store_bounds);
  pthread_mutex_unlock(&metrics->lock);
}

/* ---- serving */
/* Reads the request head (up to its blank line) within the deadline; true for a GET. */
static bool request_read(int fd, char *request, size_t capacity, bool *metrics_path_p) {
  size_t used = 0;
  while (used + 1 < capacity) {
    struct pollfd poller = {.fd = fd, .events = POLLIN};
    if (poll(&poller, 1, REQUEST_DEADLINE_MS) <= 0) return false;
    ssize_t got = recv(fd, request + used, capacity - 1 - used, 0);
    if (got <= 0) return false;
    used += (size_t)got;
    request[used] = '\0';
    if (strstr(request, "\r\n\r\n") != NULL || strstr(request, "\n\n") != NULL) break;
  }
  *metrics_path_p =
      strncmp(request, "GET /metrics ", 13) == 0 || strncmp(request, "GET / ", 6) == 0;
  return strncmp(request, "GET ", 4) == 0;
}

static void send_all(int fd, const void *data, size_t length) {
  const char *at = data;
  while (length > 0) {
    ssize_t sent = send(fd, at, length, MSG_NOSIGNAL);
    if (sent <= 0) return;
    at += sent;
    length -= (size_t)sent;
  }
}

static void connection_serve(keel__metrics *metrics, int fd) {
  char request[2048];
  bool metrics_path = false;
  if (!request_read(fd, request, sizeof request, &metrics_path)) return;
  keel_buffer body;
  keel_buffer_init(&body, 1 << 20);
  if (metrics_path) keel__metrics_render(metrics, &body);
  char head[160];
  int length = snprintf(head, sizeof head,
                        metrics_path ? "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4"
                                       "\r\nContent-Length: %zu\r\n\r\n"
                                     : "HTTP/1.0 404 Not Found\r\nContent-Length: %zu\r\n\r\n",
                        body.length);
  send_all(fd, head, (size_t)length);
  if (body.length > 0) send_all(fd, body.data, body.length);
  keel_buffer_free(&body);
}

static void *metrics_main(void *argument) {
  keel__metrics *metrics = argument;
  for (;;) {
    struct pollfd pollers[2] = {{.fd = metrics->stop_fd, .events = POLLIN},
                                {.fd = metrics->listen_fd, .events = POLLIN}};
    if (poll(pollers, 2, -1) < 0 && errno != EINTR) break;
    if (pollers[0].revents != 0) break;
    if (pollers[1].revents == 0) continue;
    int fd = accept4(metrics->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) continue;
    connection_serve(metrics, fd);
    close(fd);
  }
  return NULL;
}

static keel_status listen_open(const char *host, int port, int *fd_p) {
  struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &address.sin_addr) != 1) return KEEL_EINVAL;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return keel_status_from_errno(errno);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&address, sizeof address) != 0 || listen(fd, 16) != 0) {
    keel_status status = keel_status_from_errno(errno);
    close(fd);
    return status;
  }
  *fd_p = fd;
  return KEEL_OK;
}

keel_status keel__metrics_start(const char *host, int port, keel__metrics **metrics_p) {
  keel__metrics *metrics = calloc(1, sizeof *metrics);
  if (metrics == NULL) return KEEL_ENOMEM;
  pthread_mutex_init(&metrics->lock, NULL);
  keel_status status = listen_open(host, port, &metrics->listen_fd);
  if (status != KEEL_OK) goto fail_free;
  metrics->stop_fd = eventfd(0, EFD_CLOEXEC);
  if (metrics->stop_fd < 0) {
    status = keel_status_from_errno(errno);
    goto fail_close_listen;
  }
  if (pthread_create(&metrics->thread, NULL, metrics_main, metrics) != 0) {
    status = KEEL_ENOMEM;
    goto fail_close_stop;
  }
  snprintf(metrics->address, sizeof metrics->address, "%s:%d", host, port);
  *metrics_p = metrics;
  return KEEL_OK;

fail_close_stop:
  close(metrics->stop_fd);
fail_close_listen:
  close(metrics->listen_fd);
fail_free:
  pthread_mutex_destroy(&metrics->lock);
  free(metrics);
  return status;
}

const char *keel__metrics_address(const keel__metrics *metrics) { return metrics->address; }

void keel__metrics_stop(keel__metrics *metrics) {
  if (metrics == NULL) return;
  uint64_t one = 1;
  ssize_t ignored = write(metrics->stop_fd, &one, sizeof one);
  (void)ignored;
  pthread_join(metrics->thread, NULL);
  close(metrics->stop_fd);
  close(metrics->listen_fd);
  pthread_mutex_destroy(&metrics->lock);
  free(metrics);
}
