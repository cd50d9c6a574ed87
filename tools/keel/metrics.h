/* `--metrics-port`: the job's figures in Prometheus' text format, served by the launcher or
 * by the root agent of a job of nodes (metrics.c). Every recording function takes NULL (no
 * server) and returns at once. */
#ifndef KEEL_METRICS_H
#define KEEL_METRICS_H

#include <stdint.h>

#include "keel/core.h"

typedef struct keel__metrics keel__metrics;

/* Listens on host:port (IPv4 text) and serves GET /metrics from a thread of its own. */
keel_status keel__metrics_start(const char *host, int port, keel__metrics **metrics_p);
/* "host:port" it listens on. */
const char *keel__metrics_address(const keel__metrics *metrics);
/* Stops the thread, closes the socket and frees. NULL allowed. */
void keel__metrics_stop(keel__metrics *metrics);

/* A progress line of a worker: the job's step, world, epoch and throughput. */
void keel__metrics_progress(keel__metrics *metrics, int64_t step, int64_t world, int64_t epoch,
                            double samples_per_s);
/* A recovery line (rank 0's): one more recovery, its total time into the histogram. */
void keel__metrics_recovery(keel__metrics *metrics, double total_ms);
/* One store request of this process and how long it took. */
void keel__metrics_store_request(keel__metrics *metrics, int64_t elapsed_ns);
/* The root decided a node was lost. */
void keel__metrics_node_lost(keel__metrics *metrics);
/* The text of a scrape, appended to out (for the server and the tests). */
void keel__metrics_render(keel__metrics *metrics, keel_buffer *out);

#endif
