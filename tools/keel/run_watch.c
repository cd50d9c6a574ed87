/* Store watchers of the launcher: a thread per prefix (proc/, suspect/, request/, node/), each with
 * its own store client, that lists the prefix, reports what changed since its last listing
 * to the loop through a pipe, and blocks in keel_store_wait until the next change. The loop
 * stays the only owner of the process table; these threads own only their listing memory. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "launcher.h"

/* A wait is cut into slices so that a stop request is seen within one slice. */
#define WAIT_SLICE_NS (200 * INT64_C(1000000))
#define RETRY_PAUSE_NS (100 * INT64_C(1000000))

struct keel__watcher {
  pthread_t thread;
  keel_store *store;
  char prefix[16];
  /* proc/ reports changes and disappearances, suspect/ appearances and changes, both per
   * uid; request/ only that something new is there, which the loop reads itself. */
  keel__report_kind kind;
  uint32_t uid_limit;
  uint64_t listed_revision; /* request/: the store's revision at the last listing */
  int report_fd;
  atomic_bool stop;
  uint64_t *seen_revision; /* per uid: revision of its key at the last listing; 0: absent */
  uint64_t *now_revision;  /* scratch of the same size for the listing in progress */
};

static void report_send(keel__watcher *watcher, const keel__report *report) {
  /* A report is smaller than PIPE_BUF, so the write is whole; the loop drains the pipe. */
  ssize_t written;
  do {
    written = write(watcher->report_fd, report, sizeof *report);
  } while (written < 0 && errno == EINTR);
  if (written != (ssize_t)sizeof *report) KEEL_LOG_E("launcher", "lost a store report");
}

static void report_entry(keel__watcher *watcher, uint32_t uid, const keel_store_entry *entry) {
  keel__report report = {.uid = uid};
  if (watcher->kind == KEEL__REPORT_NODE) {
    report.kind = KEEL__REPORT_NODE;
    snprintf(report.text, sizeof report.text, "%s", (const char *)entry->value);
    report_send(watcher, &report);
    return;
  }
  if (watcher->kind == KEEL__REPORT_SUSPECT) {
    report.kind = KEEL__REPORT_SUSPECT;
    snprintf(report.text, sizeof report.text, "%s", (const char *)entry->value);
    report_send(watcher, &report);
    return;
  }
  keel__proc_value value;
  if (keel__proc_value_parse((const char *)entry->value, &value) != KEEL_OK) {
    KEEL_LOG_W("launcher", "ignoring malformed %s: '%s'", entry->key, (const char *)entry->value);
    return;
  }
  report.kind = KEEL__REPORT_PROC;
  report.rank = value.rank;
  report.epoch = value.epoch;
  report.node = value.node;
  snprintf(report.text, sizeof report.text, "%s", value.role);
  report_send(watcher, &report);
}

/* Requests are few and the loop deletes each it handles, so one report per listing that
 * holds a key written since the last listing is enough: the loop lists them all. */
static void watcher_compare_requests(keel__watcher *watcher, const keel_store_entry *entries,
                                     size_t count, uint64_t listing_revision) {
  bool fresh = false;
  for (size_t i = 0; i < count; i++) fresh |= entries[i].revision > watcher->listed_revision;
  watcher->listed_revision = listing_revision;
  if (!fresh) return;
  keel__report report = {.kind = KEEL__REPORT_REQUEST};
  report_send(watcher, &report);
}

/* Compares a listing with the previous one and reports the differences. */
static void watcher_compare(keel__watcher *watcher, const keel_store_entry *entries, size_t count) {
  memset(watcher->now_revision, 0, watcher->uid_limit * sizeof *watcher->now_revision);
  for (size_t i = 0; i < count; i++) {
    uint32_t uid;
    if (keel__uid_from_key(entries[i].key, watcher->prefix, &uid) != KEEL_OK) continue;
    if (uid >= watcher->uid_limit) continue;
    watcher->now_revision[uid] = entries[i].revision;
    if (entries[i].revision != watcher->seen_revision[uid]) report_entry(watcher, uid, &entries[i]);
  }
  bool reports_going = watcher->kind == KEEL__REPORT_PROC || watcher->kind == KEEL__REPORT_NODE;
  keel__report_kind gone =
      watcher->kind == KEEL__REPORT_PROC ? KEEL__REPORT_PROC_GONE : KEEL__REPORT_NODE_GONE;
  for (uint32_t uid = 0; reports_going && uid < watcher->uid_limit; uid++) {
    if (watcher->seen_revision[uid] == 0 || watcher->now_revision[uid] != 0) continue;
    keel__report report = {.kind = gone, .uid = uid};
    report_send(watcher, &report);
  }
  uint64_t *swap = watcher->seen_revision;
  watcher->seen_revision = watcher->now_revision;
  watcher->now_revision = swap;
}

static void pause_briefly(void) {
  struct timespec pause = {0, RETRY_PAUSE_NS};
  nanosleep(&pause, NULL);
}

static void *watcher_main(void *argument) {
  keel__watcher *watcher = argument;
  uint64_t revision = 0;
  bool must_list = true;
  while (!atomic_load(&watcher->stop)) {
    if (must_list) {
      keel_store_entry *entries = NULL;
      size_t count = 0;
      keel_status status =
          keel_store_list(watcher->store, watcher->prefix, &entries, &count, &revision);
      if (status != KEEL_OK) {
        KEEL_LOG_D("launcher", "listing %s: %s", watcher->prefix, keel_strerror(status));
        pause_briefly();
        continue;
      }
      if (watcher->kind == KEEL__REPORT_REQUEST)
        watcher_compare_requests(watcher, entries, count, revision);
      else
        watcher_compare(watcher, entries, count);
      keel_store_entries_free(entries, count);
    }
    uint64_t changed_at = 0;
    keel_status status = keel_store_wait(watcher->store, watcher->prefix, revision,
                                         keel_deadline_after_ns(WAIT_SLICE_NS), &changed_at);
    must_list = status == KEEL_OK;
    if (status != KEEL_OK && status != KEEL_ETIMEDOUT) {
      KEEL_LOG_D("launcher", "waiting on %s: %s", watcher->prefix, keel_strerror(status));
      pause_briefly();
      must_list = true;
    }
  }
  return NULL;
}

static void watcher_free(keel__watcher *watcher) {
  free(watcher->seen_revision);
  free(watcher->now_revision);
  free(watcher);
}

keel_status keel__watcher_start(const char *endpoint, const keel_auth *auth, const char *prefix,
                                uint32_t uid_limit, int report_fd, keel__watcher **watcher_p) {
  keel__watcher *watcher = calloc(1, sizeof *watcher);
  if (watcher == NULL) return KEEL_ENOMEM;
  snprintf(watcher->prefix, sizeof watcher->prefix, "%s", prefix);
  watcher->kind = strcmp(prefix, "proc/") == 0      ? KEEL__REPORT_PROC
                  : strcmp(prefix, "request/") == 0 ? KEEL__REPORT_REQUEST
                  : strcmp(prefix, "node/") == 0    ? KEEL__REPORT_NODE
                                                    : KEEL__REPORT_SUSPECT;
  /* Request keys are not per uid: no revision table. */
  watcher->uid_limit = watcher->kind == KEEL__REPORT_REQUEST ? 0 : uid_limit;
  watcher->report_fd = report_fd;
  atomic_init(&watcher->stop, false);
  keel_status status = KEEL_ENOMEM;
  if (watcher->uid_limit > 0) {
    watcher->seen_revision = calloc(watcher->uid_limit, sizeof *watcher->seen_revision);
    watcher->now_revision = calloc(watcher->uid_limit, sizeof *watcher->now_revision);
    if (watcher->seen_revision == NULL || watcher->now_revision == NULL) goto fail_free_watcher;
  }
  status = keel_store_connect(endpoint, auth, keel_deadline_after_ns(5 * INT64_C(1000000000)),
                              &watcher->store);
  if (status != KEEL_OK) goto fail_free_watcher;
  int error = pthread_create(&watcher->thread, NULL, watcher_main, watcher);
  if (error != 0) {
    status = keel_status_from_errno(error);
    goto fail_close_store;
  }
  *watcher_p = watcher;
  return KEEL_OK;

fail_close_store:
  keel_store_close(watcher->store);
fail_free_watcher:
  KEEL_LOG_E("launcher", "cannot watch %s in the store: %s", prefix, keel_strerror(status));
  watcher_free(watcher);
  return status;
}

void keel__watcher_stop(keel__watcher *watcher) {
  if (watcher == NULL) return;
  atomic_store(&watcher->stop, true);
  pthread_join(watcher->thread, NULL);
  keel_store_close(watcher->store);
  watcher_free(watcher);
}
