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

/* What the store says of the job's processes: dead/ (the launcher's verdicts), suspect/
 * (the members' suspicions) and proc/ (the living, by lease; their values give nodes),
 * read in one request at one revision, so the three agree with each other. */
typedef struct store_view {
  uid_set dead, suspected, alive;
} store_view;

struct keel__detector {
  uint32_t self;
  /* The queue of observations: the progress loop adds, the session thread flushes. */
  pthread_mutex_t lock;
  notice queue[QUEUE_CAPACITY];
  int queued;
  /* The verdict's inputs at the last refresh (the training thread's alone). */
  bool refreshed;
  store_view view;
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

static void view_free(store_view *view) {
  free(view->dead.uids);
  free(view->suspected.uids);
  free(view->alive.uids);
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
  view_free(&detector->view);
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

const char *const keel__detector_prefixes[] = {"dead/", "suspect/", "proc/", NULL};

/* The view from entries (those under other prefixes are passed over) into view's sets,
 * emptied first, each sorted. */
static keel_status view_fill(keel__detector *detector, const keel_store_entry *entries,
                             size_t count, store_view *view) {
  view->dead.count = view->suspected.count = view->alive.count = 0;
  keel_status status = KEEL_OK;
  for (size_t i = 0; i < count && status == KEEL_OK; i++) {
    const char *key = entries[i].key;
    uid_set *set = NULL;
    if (strncmp(key, "dead/", 5) == 0) set = &view->dead;
    if (strncmp(key, "suspect/", 8) == 0) set = &view->suspected;
    if (strncmp(key, "proc/", 5) == 0) set = &view->alive;
    if (set == NULL) continue;
    char *end;
    unsigned long uid = strtoul(strchr(key, '/') + 1, &end, 10);
    if (*end != '\0' || uid >= KEEL_MAX_UIDS) continue;
    status = set_add(set, (uint32_t)uid);
    const char *node = set == &view->alive ? strstr((const char *)entries[i].value, "node=") : NULL;
    if (status == KEEL_OK && node != NULL)
      status = nodes_note(detector, (uint32_t)uid, atoi(node + 5));
  }
  set_sort(&view->dead);
  set_sort(&view->suspected);
  set_sort(&view->alive);
  return status;
}

/* Reads the view from the store into view. */
static keel_status view_read(keel__detector *detector, keel_store *store, store_view *view) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  keel_status status =
      keel_store_list_prefixes(store, keel__detector_prefixes, 3, &entries, &count, NULL);
  if (status == KEEL_OK) status = view_fill(detector, entries, count, view);
  keel_store_entries_free(entries, count);
  return status;
}

keel_status keel__detector_take(keel__detector *detector, const keel_store_entry *entries,
                                size_t count) {
  keel_status status = view_fill(detector, entries, count, &detector->view);
  /* A half-read view would declare the living dead: keep no verdict until a full one. */
  detector->refreshed = status == KEEL_OK;
  return status;
}

keel_status keel__detector_refresh(keel__detector *detector, keel_store *store) {
  keel__detector_flush(detector, store);
  keel_status status = view_read(detector, store, &detector->view);
  detector->refreshed = status == KEEL_OK;
  return status;
}

bool keel__detector_dead(keel__detector *detector, uint32_t uid) {
  if (!detector->refreshed || uid == detector->self) return false;
  const store_view *view = &detector->view;
  return set_has(&view->dead, uid) || set_has(&view->suspected, uid) || !set_has(&view->alive, uid);
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
  store_view view = {0};
  if (view_read(detector, store, &view) == KEEL_OK) {
    for (size_t i = 0; i < view.suspected.count; i++) {
      uint32_t uid = view.suspected.uids[i];
      if (uid_in(members, member_count, uid) || uid == detector->self) continue;
      if (!set_has(&view.dead, uid) && !set_has(&view.alive, uid))
        delete_key(store, "suspect", uid);
    }
    for (size_t i = 0; i < view.dead.count; i++) {
      uint32_t uid = view.dead.uids[i];
      if (uid_in(members, member_count, uid) || uid == detector->self) continue;
      if (set_has(&view.alive, uid)) continue; /* its lease has not lapsed yet: next time */
      delete_key(store, "suspect", uid);
      delete_key(store, "left", uid);
      delete_key(store, "dead", uid);
    }
  }
  view_free(&view);
}
