/* The store's contract as one suite of tests that every backend runs (the embedded server,
 * a real etcd cluster), and the helpers those tests share with each backend's own tests. */
#ifndef KEEL_TEST_STORE_SUITE_H
#define KEEL_TEST_STORE_SUITE_H

#include <pthread.h>

#include "keel/store.h"

/* A backend under test. open makes a fresh, empty namespace for one test (the embedded
 * backend: a new server; etcd: auth's new job id on a shared cluster) and writes the
 * endpoint to connect to; close undoes it. Leases are tested at lease_ttl_ns, the shortest
 * ttl the backend keeps to closely; one may go up to expiry_slack_ns after its ttl. */
typedef struct keel_test_store_backend {
  void (*open)(struct keel_test_store_backend *backend, const keel_auth *auth, char *endpoint,
               size_t capacity, void **context_p);
  void (*close)(struct keel_test_store_backend *backend, void *context);
  int64_t lease_ttl_ns;
  int64_t expiry_slack_ns;
  void *user;
} keel_test_store_backend;

/* Runs the suite as one cmocka group against backend; returns the number of failures. */
int keel_test_store_suite_run(const char *group_name, keel_test_store_backend *backend);

void keel_test_store_put_text(keel_store *store, const char *key, const char *value,
                              uint64_t *revision_p);
/* The store's current revision (a list of an empty prefix). */
uint64_t keel_test_store_revision(keel_store *store);

/* A wait on its own thread and handle, as store.h asks of long waits. */
typedef struct keel_test_waiter {
  keel_store *store;
  const char *prefix;
  uint64_t after;
  int64_t deadline_ns;
  keel_status status;
  uint64_t revision;
  int64_t returned_ns;
  pthread_t thread;
} keel_test_waiter;

void keel_test_waiter_start(keel_test_waiter *w, const char *endpoint, const keel_auth *auth,
                            const char *prefix, uint64_t after, int64_t timeout_ns);
void keel_test_waiter_finish(keel_test_waiter *w);

#endif
