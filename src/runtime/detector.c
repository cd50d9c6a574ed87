/* The failure detector: the one place in the library that decides a process is dead. Its
 * verdict reads the store (docs/RUNTIME.md, "Keys"): dead/<uid> (the launcher reaped it),
 * suspect/<uid> (someone saw it fail; the launcher fences it), or no proc/<uid> (its lease
 * lapsed: hung, or it left). Whatever the endpoint sees (a link that broke) is only an
 * observation: it is queued from the progress loop without waiting and written as
 * suspect/<uid> by the session's thread, or by the next refresh, which then counts it. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_internal.h"

#define MODULE "detector"
#define QUEUE_CAPACITY 64

typedef struct notice {
  uint32_t uid;
  char reason[48];
} notice;

typedef struct uid_node {
  uint32_t uid;
  int node;
} uid_node;

/* A sorted, growable set of uids. */
typedef struct uid_set {
  uint32_t *uids;
  size_t count, capacity;
} uid_set;

struct keel__detector {
  uint32_t self;
  /* The queue of observations: the progress loop adds, the session thread flushes. */
  pthread_mutex_t lock;
  notice queue[QUEUE_CAPACITY];
  int queued;
  /* The verdict's inputs at the last refresh (the training thread's alone). */
  bool refreshed;
  uid_set failed;  /* dead/ or suspect/ */
  uid_set alive;   /* proc/ */
  uid_node *nodes; /* every uid ever seen in proc/, sorted by uid */
  size_t node_count, node_capacity;
};

static int compare_uids(const void *a, const void *b) {
  uint32_t left = *(const uint32_t *)a, right = *(const uint32_t *)b;
  return (left > right) - (left < right);
}

static keel_status set_add(uid_set *set, uint32_t uid) {
  if (set->count == set->capacity) {
    size_t grown = set->capacity ? set->capacity * 2 : 64;
    uint32_t *uids = realloc(set->uids, grown * sizeof *uids);
    if (uids == NULL) return KEEL_ENOMEM;
    set->uids = uids;
    set->capacity = grown;
  }
  set->uids[set->count++] = uid;
  return KEEL_OK;
}

/* The C library wants real arrays even for zero elements, and an empty set has none. */
static void set_sort(uid_set *set) {
  if (set->count > 0) qsort(set->uids, set->count, sizeof(uint32_t), compare_uids);
}

static bool set_has(const uid_set *set, uint32_t uid) {
  if (set->count == 0) return false;
  return bsearch(&uid, set->uids, set->count, sizeof uid, compare_uids) != NULL;
}

keel_status keel__detector_create(uint32_t self_uid, keel__detector **detector_p) {
  keel__detector *detector = calloc(1, sizeof *detector);
  if (detector == NULL) return KEEL_ENOMEM;
  detector->self = self_uid;
  pthread_mutex_init(&detector->lock, NULL);
  *detector_p = detector;
  return KEEL_OK;
}

void keel__detector_destroy(keel__detector *detector) {
  if (detector == NULL) return;
  pthread_mutex_destroy(&detector->lock);
  free(detector->failed.uids);
  free(detector->alive.uids);
  free(detector->nodes);
  free(detector);
}

void keel__detector_observe(keel__detector *detector, uint32_t uid, const char *reason) {
  pthread_mutex_lock(&detector->lock);
  bool known = false;
  for (int i = 0; i < detector->queued && !known; i++) known = detector->queue[i].uid == uid;
  if (!known && detector->queued < QUEUE_CAPACITY) {
    notice *entry = &detector->queue[detector->queued++];
    entry->uid = uid;
    snprintf(entry->reason, sizeof entry->reason, "%s", reason);
  }
  pthread_mutex_unlock(&detector->lock);
}

void keel__detector_flush(keel__detector *detector, keel_store *store) {
  notice pending[QUEUE_CAPACITY];
  pthread_mutex_lock(&detector->lock);
  int count = detector->queued;
  memcpy(pending, detector->queue, (size_t)count * sizeof *pending);
  detector->queued = 0;
  pthread_mutex_unlock(&detector->lock);
  for (int i = 0; i < count; i++) {
    char key[64], value[96];
    snprintf(key, sizeof key, "suspect/%" PRIu32, pending[i].uid);
    int length = snprintf(value, sizeof value, "by=%" PRIu32 " reason=%s", detector->self,
                          pending[i].reason);
    keel_status status = keel_store_put(store, key, value, (size_t)length, 0, NULL);
    /* Not lost: the next flush tries again. */
    if (status != KEEL_OK) keel__detector_observe(detector, pending[i].uid, pending[i].reason);
  }
}

static keel_status nodes_note(keel__detector *detector, uint32_t uid, int node) {
  size_t low = 0, high = detector->node_count;
  while (low < high) {
    size_t middle = low + (high - low) / 2;
    if (detector->nodes[middle].uid < uid)
      low = middle + 1;
    else
      high = middle;
  }
  if (low < detector->node_count && detector->nodes[low].uid == uid) {
    detector->nodes[low].node = node;
    return KEEL_OK;
  }
  if (detector->node_count == detector->node_capacity) {
    size_t grown = detector->node_capacity ? detector->node_capacity * 2 : 64;
    uid_node *nodes = realloc(detector->nodes, grown * sizeof *nodes);
    if (nodes == NULL) return KEEL_ENOMEM;
    detector->nodes = nodes;
    detector->node_capacity = grown;
  }
  memmove(&detector->nodes[low + 1], &detector->nodes[low],
          (detector->node_count - low) * sizeof *detector->nodes);
  detector->nodes[low] = (uid_node){.uid = uid, .node = node};
  detector->node_count++;
  return KEEL_OK;
}

/* The uids under prefix ("dead/") into set, sorted; proc/ values also give nodes. */
static keel_status read_prefix(keel__detector *detector, keel_store *store, const char *prefix,
                               uid_set *set) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  keel_status status = keel_store_list(store, prefix, &entries, &count, NULL);
  if (status != KEEL_OK) return status;
  size_t prefix_length = strlen(prefix);
  bool proc = strcmp(prefix, "proc/") == 0;
  for (size_t i = 0; i < count && status == KEEL_OK; i++) {
    char *end;
    unsigned long uid = strtoul(entries[i].key + prefix_length, &end, 10);
    if (*end != '\0' || uid >= KEEL_MAX_UIDS) continue;
    status = set_add(set, (uint32_t)uid);
    const char *node = proc ? strstr((const char *)entries[i].value, "node=") : NULL;
    if (status == KEEL_OK && node != NULL)
      status = nodes_note(detector, (uint32_t)uid, atoi(node + 5));
  }
  keel_store_entries_free(entries, count);
  return status;
}

keel_status keel__detector_refresh(keel__detector *detector, keel_store *store) {
  keel__detector_flush(detector, store);
  detector->failed.count = 0;
  detector->alive.count = 0;
  keel_status status = read_prefix(detector, store, "dead/", &detector->failed);
  if (status == KEEL_OK) status = read_prefix(detector, store, "suspect/", &detector->failed);
  if (status == KEEL_OK) status = read_prefix(detector, store, "proc/", &detector->alive);
  if (status != KEEL_OK) {
    /* A half-read view would declare the living dead: keep no verdict until a full one. */
    detector->refreshed = false;
    return status;
  }
  set_sort(&detector->failed);
  set_sort(&detector->alive);
  detector->refreshed = true;
  return KEEL_OK;
}

bool keel__detector_dead(keel__detector *detector, uint32_t uid) {
  if (!detector->refreshed || uid == detector->self) return false;
  return set_has(&detector->failed, uid) || !set_has(&detector->alive, uid);
}

int keel__detector_node(keel__detector *detector, uint32_t uid) {
  for (size_t low = 0, high = detector->node_count; low < high;) {
    size_t middle = low + (high - low) / 2;
    if (detector->nodes[middle].uid == uid) return detector->nodes[middle].node;
    if (detector->nodes[middle].uid < uid)
      low = middle + 1;
    else
      high = middle;
  }
  return -1;
}

static bool uid_in(const uint32_t *uids, int count, uint32_t uid) {
  for (int i = 0; i < count; i++) {
    if (uids[i] == uid) return true;
  }
  return false;
}

static void delete_key(keel_store *store, const char *prefix, uint32_t uid) {
  char key[64];
  snprintf(key, sizeof key, "%s/%" PRIu32, prefix, uid);
  keel_store_delete(store, key);
}

/* A reaped process (dead/) in no communicator whose lease is gone too: its three keys go,
 * dead/ last (while it is there the others still say dead; while its proc/ key lingers, the
 * dead/ key is what keeps anyone from taking it for alive). A suspicion of a process in no
 * communicator whose lease is gone (a survivor's suspicion that came after the collection)
 * goes too: nobody asks about it again. left/ stays until the process is reaped: the launcher
 * reads it to tell a process finishing in order from a hung one. */
void keel__detector_forget(keel__detector *detector, keel_store *store, const uint32_t *members,
                           int member_count) {
  uid_set dead = {0}, suspected = {0}, alive = {0};
  if (read_prefix(detector, store, "dead/", &dead) == KEEL_OK &&
      read_prefix(detector, store, "suspect/", &suspected) == KEEL_OK &&
      read_prefix(detector, store, "proc/", &alive) == KEEL_OK) {
    set_sort(&dead);
    set_sort(&alive);
    for (size_t i = 0; i < suspected.count; i++) {
      uint32_t uid = suspected.uids[i];
      if (uid_in(members, member_count, uid) || uid == detector->self) continue;
      if (!set_has(&dead, uid) && !set_has(&alive, uid)) delete_key(store, "suspect", uid);
    }
    for (size_t i = 0; i < dead.count; i++) {
      uint32_t uid = dead.uids[i];
      if (uid_in(members, member_count, uid) || uid == detector->self) continue;
      if (set_has(&alive, uid)) continue; /* its lease has not lapsed yet: next time */
      delete_key(store, "suspect", uid);
      delete_key(store, "left", uid);
      delete_key(store, "dead", uid);
    }
  }
  free(dead.uids);
  free(suspected.uids);
  free(alive.uids);
}
