/* A replacement server's rebuild (ECRec §3.4), while training goes on. The replacement takes a
 * lost server's place marked REBUILDING: rows are still served through the parity, but every
 * change to its blocks is sent to it too. After a barrier at every other server (each then
 * sends it every change, and the updates each began before are done), it rebuilds its groups
 * chunk by chunk: k blocks of a group read with their stamps, the read repeated while the
 * stamps disagree (a change in flight), decoded, installed; changes that arrived for a group
 * not yet installed are kept and folded after it when newer than what was read; a replica
 * of the dense block is copied from the other holder (rebuild_dense). Then it is REBUILT, and the
 * first worker moves it back at a step boundary (client.c). Synchronous mode only: the stamps are
 * steps. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "ec/ec_internal.h"
#include "ec/server_internal.h"

#define MODULE KEEL__EC_MODULE
/* Groups read in one round, unless the configuration says otherwise. */
#define REBUILD_CHUNK_GROUPS 1024
/* Rounds a group may be found in flight before the rebuild gives up. */
#define REBUILD_ATTEMPTS 2000
#define REBUILD_RETRY_MS 2

/* A change kept for a group not installed yet. */
typedef struct kept_change {
  struct kept_change *next;
  keel__ec_ref ref;
  uint64_t stamp;
  uint8_t *delta;
} kept_change;

struct keel__ec_rebuild {
  pthread_t thread;
  bool started; /* the thread runs (keel__ec_rebuild_start) */
  atomic_bool stop, complete;
  uint8_t *ready;     /* per group; under the group's stripe lock */
  /* Per group, newest first, under the group's stripe lock. One list per group, not per
   * stripe: with training going on, a long rebuild keeps hundreds of thousands of changes (a
   * hot row's group thousands), and each install walks only its own group's. */
  kept_change **kept;
  keel_status status;
  uint64_t rounds; /* read rounds, first reads and rereads of groups found in flight alike */
};

bool keel__ec_rebuild_running(const keel_ec_server *server) {
  return server->rebuild != NULL && !atomic_load(&server->rebuild->complete);
}

bool keel__ec_rebuild_keep(keel_ec_server *server, const keel__ec_ref *ref, const uint8_t *delta,
                           uint64_t stamp) {
  keel__ec_rebuild *rebuild = server->rebuild;
  if (rebuild->ready[ref->group]) return false;
  kept_change *change = calloc(1, sizeof *change);
  uint8_t *copy = malloc(server->shard.block_bytes);
  if (change == NULL || copy == NULL) {
    /* Without room to keep it, the group must be read again later: mark it so. */
    free(change);
    free(copy);
    rebuild->status = KEEL_ENOMEM;
    return true;
  }
  memcpy(copy, delta, server->shard.block_bytes);
  *change = (kept_change){.ref = *ref, .stamp = stamp, .delta = copy};
  kept_change **list = &rebuild->kept[ref->group];
  change->next = *list;
  *list = change;
  return true;
}

/* ---- one group */

/* k blocks of a group with their stamps, as read from servers that are live. */
typedef struct group_read {
  uint64_t group;
  uint8_t *blocks;  /* (k + r) * block_bytes */
  uint64_t *stamps; /* (k + r) * k */
  bool present[KEEL_EC_MAX_BLOCKS];
  bool done;
} group_read;

/* The stamps agree: for every data member, its own block's stamp (if read) and every parity
 * block read say the same step. *agreed gets those k stamps. */
static bool stamps_agree(const keel__ec_shard *shard, const group_read *read, uint64_t *agreed) {
  int k = shard->layout.data_blocks, n = k + shard->layout.parity_blocks;
  for (int j = 0; j < k; j++) {
    bool known = false;
    for (int member = 0; member < n; member++) {
      if (!read->present[member] || (member < k && member != j)) continue;
      uint64_t stamp = read->stamps[(size_t)member * (size_t)k + (size_t)j];
      if (known && stamp != agreed[j]) return false;
      agreed[j] = stamp;
      known = true;
    }
    if (!known) agreed[j] = 0;
  }
  return true;
}

/* A kept change and its place in arrival order, for a stable sort by stamp. */
typedef struct kept_order {
  kept_change *change;
  size_t arrival;
} kept_order;

static int kept_order_compare(const void *a, const void *b) {
  const kept_order *x = a, *y = b;
  if (x->change->stamp != y->change->stamp) return x->change->stamp < y->change->stamp ? -1 : 1;
  return x->arrival < y->arrival ? -1 : x->arrival > y->arrival;
}

/* Folds the changes kept for group that are newer than what was installed, oldest stamp
 * first: a fold leaves out a change older than the block's stamp, so two steps' changes to
 * one row kept while a round was read must not go newest first. Caller holds the group's
 * lock. */
static void fold_kept(keel_ec_server *server, uint64_t group) {
  kept_change *list = server->rebuild->kept[group];
  server->rebuild->kept[group] = NULL;
  size_t count = 0;
  for (kept_change *change = list; change != NULL; change = change->next) count++;
  kept_order *order = malloc(sizeof *order * (count > 0 ? count : 1));
  if (order == NULL) {
    /* The group cannot be made whole here: the rebuild fails and its rows stay decoded. */
    server->rebuild->status = KEEL_ENOMEM;
    count = 0;
  }
  size_t arrival = count;
  for (kept_change *change = list; change != NULL && order != NULL; change = change->next) {
    arrival--; /* the list is newest first */
    order[arrival] = (kept_order){.change = change, .arrival = arrival};
  }
  qsort(order, count, sizeof *order, kept_order_compare);
  for (size_t i = 0; i < count; i++) {
    kept_change *change = order[i].change;
    keel__ec_shard_fold(&server->shard, group, (int)change->ref.member, (int)change->ref.other,
                        change->delta, change->stamp);
  }
  free(order);
  while (list != NULL) {
    kept_change *change = list;
    list = change->next;
    free(change->delta);
    free(change);
  }
}

/* Decodes a consistent read and installs this server's members with their stamps. */
static keel_status install(keel_ec_server *server, group_read *read, const uint64_t *agreed) {
  keel__ec_shard *shard = &server->shard;
  int k = shard->layout.data_blocks, n = k + shard->layout.parity_blocks;
  uint8_t *blocks[KEEL_EC_MAX_BLOCKS];
  for (int member = 0; member < n; member++)
    blocks[member] = read->blocks + (size_t)member * shard->block_bytes;
  pthread_mutex_lock(&server->decode_lock);
  keel_status status = keel_ec_decode(server->decoder, shard->block_bytes, blocks, read->present);
  pthread_mutex_unlock(&server->decode_lock);
  if (status != KEEL_OK) return status;
  pthread_mutex_t *lock = keel__ec_shard_lock(shard, read->group);
  pthread_mutex_lock(lock);
  for (int member = 0; member < n; member++) {
    uint8_t *mine = keel__ec_shard_block(shard, read->group, member);
    if (mine == NULL) continue;
    memcpy(mine, blocks[member], shard->block_bytes);
    if (member < k) {
      *keel__ec_shard_data_step(shard, read->group, member) = agreed[member];
    } else {
      for (int j = 0; j < k; j++)
        *keel__ec_shard_parity_step(shard, read->group, member, j) = agreed[j];
    }
  }
  fold_kept(server, read->group);
  server->rebuild->ready[read->group] = 1;
  pthread_mutex_unlock(lock);
  return KEEL_OK;
}

/* ---- a round over a chunk of groups */

/* Chooses k members on live servers other than this one for every group not done. */
static keel_status choose(keel_ec_server *server, group_read *reads, size_t count,
                          const keel__ec_view *view) {
  keel__ec_shard *shard = &server->shard;
  int k = shard->layout.data_blocks, n = k + shard->layout.parity_blocks;
  for (size_t g = 0; g < count; g++) {
    if (reads[g].done) continue;
    int chosen = 0;
    for (int member = 0; member < n; member++) {
      keel_ec_location at;
      keel_ec_layout_locate(&shard->layout, reads[g].group, member, &at);
      reads[g].present[member] =
          chosen < k && at.server != server->index && view->standing[at.server] == KEEL__EC_LIVE;
      chosen += reads[g].present[member];
    }
    if (chosen < k) return KEEL_EDATALOST; /* more than r of the group lost */
  }
  return KEEL_OK;
}

/* Whether a source's answer to a read passes it over for the round rather than failing the
 * rebuild: unreachable (the call declared it lost), or KEEL_EAGAIN from a replacement that
 * does not serve yet, which took the call at its address after the server it replaces was
 * lost (a chaos run at r = 2: a rebuild failed so, and its server stayed lost for good). */
static bool source_passed_over(keel_status status) {
  return keel__ec_unreachable(status) || status == KEEL_EAGAIN;
}

/* One versioned read of the chosen blocks from every server that holds some, all at once (one
 * round trip): refs, targets, stamp_targets and body have room for k blocks of every group,
 * and each server's part lies in its own stretch of them. *lost_one: a server could not be
 * reached (declared lost by the call). */
static keel_status read_round(keel_ec_server *server, group_read *reads, size_t count,
                              keel__ec_ref *refs, uint8_t **targets, uint64_t **stamp_targets,
                              uint8_t *body, bool *lost_one) {
  keel__ec_shard *shard = &server->shard;
  int k = shard->layout.data_blocks, n = k + shard->layout.parity_blocks;
  size_t each = shard->block_bytes + sizeof(uint64_t) * (size_t)k;
  int servers = server->servers;
  bool *sending = calloc((size_t)servers, sizeof *sending);
  keel__ec_request *requests = calloc((size_t)servers, sizeof *requests);
  void **bodies = calloc((size_t)servers, sizeof *bodies);
  keel_status *statuses = calloc((size_t)servers, sizeof *statuses);
  size_t *first = calloc((size_t)servers + 1, sizeof *first);
  keel_status status = sending && requests && bodies && statuses && first ? KEEL_OK : KEEL_ENOMEM;
  size_t wanted = 0;
  for (int other = 0; other < servers && status == KEEL_OK; other++) {
    first[other] = wanted;
    for (size_t g = 0; g < count; g++) {
      for (int member = 0; member < n && !reads[g].done; member++) {
        keel_ec_location at;
        keel_ec_layout_locate(&shard->layout, reads[g].group, member, &at);
        if (!reads[g].present[member] || at.server != other) continue;
        refs[wanted] = (keel__ec_ref){.group = reads[g].group, .member = (uint32_t)member};
        targets[wanted] = reads[g].blocks + (size_t)member * shard->block_bytes;
        stamp_targets[wanted++] = reads[g].stamps + (size_t)member * (size_t)k;
      }
    }
    size_t part = wanted - first[other];
    if (part == 0) continue;
    sending[other] = true;
    requests[other] = (keel__ec_request){.op = KEEL__EC_OP_READ_BLOCKS,
                                         .flags = KEEL__EC_FLAG_VERSIONED,
                                         .count = (uint32_t)part,
                                         .refs = refs + first[other]};
    bodies[other] = body + first[other] * each;
  }
  if (status == KEEL_OK)
    status = keel__ec_server_call_each(server, sending, requests, bodies, statuses);
  for (int other = 0; other < servers && status == KEEL_OK; other++) {
    if (!sending[other]) continue;
    if (statuses[other] == KEEL_EAGAIN)
      KEEL_LOG_I(MODULE,
                 "server %d: server %d does not serve its blocks yet (a replacement): "
                 "the round is read again without it",
                 server->index, other);
    if (source_passed_over(statuses[other])) *lost_one = true;
    if (statuses[other] != KEEL_OK) {
      if (!source_passed_over(statuses[other])) status = statuses[other];
      continue;
    }
    for (size_t i = first[other]; i < first[other] + requests[other].count; i++) {
      memcpy(targets[i], body + i * each, shard->block_bytes);
      memcpy(stamp_targets[i], body + i * each + shard->block_bytes, sizeof(uint64_t) * (size_t)k);
    }
  }
  free(first), free(statuses), free(bodies), free(requests), free(sending);
  return status;
}

/* Rebuilds the groups of one chunk: rounds of reads until every group was read consistent. */
static keel_status rebuild_chunk(keel_ec_server *server, group_read *reads, size_t count,
                                 keel__ec_ref *refs, uint8_t **targets, uint64_t **stamp_targets,
                                 uint8_t *body) {
  keel__ec_view view;
  keel_status status = keel__ec_view_make(server, &view);
  uint64_t agreed[KEEL_EC_MAX_BLOCKS];
  for (int attempt = 0; status == KEEL_OK; attempt++) {
    if (atomic_load(&server->rebuild->stop)) status = KEEL_ECANCELED;
    if (status == KEEL_OK && attempt >= REBUILD_ATTEMPTS) status = KEEL_ETIMEDOUT;
    if (status != KEEL_OK) break;
    keel__ec_view_at(server, UINT64_MAX - 3, &view);
    status = choose(server, reads, count, &view);
    /* A server lost during the round is declared so by the call, and one replaced
     * meanwhile is found so in the directory: the round is read again from the others (up
     * to r may be lost). */
    bool lost_one = false;
    server->rebuild->rounds++;
    if (status == KEEL_OK)
      status = read_round(server, reads, count, refs, targets, stamp_targets, body, &lost_one);
    if (status == KEEL_OK && lost_one) {
      poll(NULL, 0, REBUILD_RETRY_MS);
      keel__ec_server_refresh(server);
      continue;
    }
    bool all_done = true;
    for (size_t g = 0; g < count && status == KEEL_OK; g++) {
      if (reads[g].done) continue;
      if (stamps_agree(&server->shard, &reads[g], agreed)) {
        status = install(server, &reads[g], agreed);
        reads[g].done = true;
      } else {
        all_done = false;
      }
    }
    if (status != KEEL_OK || all_done) break;
    poll(NULL, 0, REBUILD_RETRY_MS);
  }
  keel__ec_view_free(&view);
  return status;
}

/* ---- the whole rebuild */

/* The groups this server holds a member of, in order. */
static keel_status groups_held(keel__ec_shard *shard, uint64_t **groups_p, size_t *count_p) {
  uint8_t *held = calloc(shard->groups > 0 ? shard->groups : 1, 1);
  if (held == NULL) return KEEL_ENOMEM;
  for (int role = 0; role < 2; role++) {
    uint64_t slots = role == KEEL_EC_DATA ? shard->data_rows : shard->parity_rows;
    for (uint64_t slot = 0; slot < slots; slot++) {
      keel_ec_location at;
      if (keel_ec_layout_locate_slot(&shard->layout, shard->index, (keel_ec_role)role, slot, &at) ==
          KEEL_OK)
        held[at.group] = 1;
    }
  }
  size_t count = 0;
  for (uint64_t g = 0; g < shard->groups; g++) count += held[g];
  uint64_t *groups = malloc(sizeof *groups * (count > 0 ? count : 1));
  if (groups == NULL) {
    free(held);
    return KEEL_ENOMEM;
  }
  count = 0;
  for (uint64_t g = 0; g < shard->groups; g++)
    if (held[g]) groups[count++] = g;
  free(held);
  *groups_p = groups;
  *count_p = count;
  return KEEL_OK;
}

/* Every other live server learns of this replacement and finishes what it began without it. */
static keel_status barrier(keel_ec_server *server) {
  keel__ec_server_refresh(server);
  keel__ec_view view;
  keel_status status = keel__ec_view_make(server, &view);
  if (status == KEEL_OK) keel__ec_view_at(server, 0, &view);
  for (int other = 0; other < server->servers && status == KEEL_OK; other++) {
    if (other == server->index || view.standing[other] == KEEL__EC_LOST) continue;
    keel__ec_request request = {.op = KEEL__EC_OP_READ_BLOCKS, .flags = KEEL__EC_FLAG_VERSIONED};
    status = keel__ec_server_call(server, other, &request, NULL);
    if (keel__ec_unreachable(status)) status = KEEL_OK;
  }
  keel__ec_view_free(&view);
  return status;
}

/* The dense block, when this server holds a replica of it: read from the other holder with
 * its stamp. Since the barrier that holder sends every later step's block here too
 * (WRITE_DENSE_BLOCK), and the newer one is kept, whichever comes first. */
static keel_status rebuild_dense(keel_ec_server *server) {
  keel__ec_shard *shard = &server->shard;
  if (!shard->holds_dense) return KEEL_OK;
  int other = keel__ec_dense_replica(server);
  if (other < 0) return KEEL_EDATALOST; /* the only copy was here */
  uint8_t *body = malloc(shard->dense_block_bytes + sizeof(uint64_t));
  if (body == NULL) return KEEL_ENOMEM;
  keel__ec_request request = {.op = KEEL__EC_OP_READ_DENSE_BLOCK, .flags = KEEL__EC_FLAG_VERSIONED};
  keel_status status = keel__ec_server_call(server, other, &request, body);
  /* The other copy is gone too (unreachable, or a replacement itself): the block is lost. */
  if (keel__ec_unreachable(status) || status == KEEL_EAGAIN) status = KEEL_EDATALOST;
  if (status == KEEL_OK) {
    pthread_mutex_lock(&shard->dense_lock);
    keel__ec_shard_dense_install(shard, body, keel_get_le64(body + shard->dense_block_bytes));
    pthread_mutex_unlock(&shard->dense_lock);
  }
  free(body);
  return status;
}

/* Sleeps ms, in slices, so that a server stopped meanwhile is not held up. */
static void pause_unless_stopped(keel_ec_server *server, uint32_t ms) {
  int64_t deadline = keel_deadline_after_ns((int64_t)ms * 1000000);
  while (!atomic_load(&server->rebuild->stop) && keel_now_ns() < deadline)
    poll(NULL, 0, REBUILD_RETRY_MS);
}

static keel_status rebuild_all(keel_ec_server *server) {
  keel__ec_shard *shard = &server->shard;
  int k = shard->layout.data_blocks, n = k + shard->layout.parity_blocks;
  size_t chunk =
      server->rebuild_chunk_groups > 0 ? server->rebuild_chunk_groups : REBUILD_CHUNK_GROUPS;
  uint64_t *groups = NULL;
  size_t group_count = 0;
  keel_status status = groups_held(shard, &groups, &group_count);
  if (status == KEEL_OK) status = barrier(server);
  group_read *reads = calloc(chunk, sizeof *reads);
  uint8_t *space = calloc(chunk * (size_t)n, shard->block_bytes);
  uint64_t *stamps = calloc(chunk * (size_t)n * (size_t)k, sizeof *stamps);
  size_t most = chunk * (size_t)k;
  keel__ec_ref *refs = malloc(sizeof *refs * most);
  uint8_t **targets = malloc(sizeof *targets * most);
  uint64_t **stamp_targets = malloc(sizeof *stamp_targets * most);
  uint8_t *body = malloc((shard->block_bytes + sizeof(uint64_t) * (size_t)k) * most);
  if (status == KEEL_OK && !(reads && space && stamps && refs && targets && stamp_targets && body))
    status = KEEL_ENOMEM;
  for (size_t first = 0; status == KEEL_OK && first < group_count; first += chunk) {
    size_t count = group_count - first < chunk ? group_count - first : chunk;
    for (size_t g = 0; g < count; g++)
      reads[g] = (group_read){.group = groups[first + g],
                              .blocks = space + g * (size_t)n * shard->block_bytes,
                              .stamps = stamps + g * (size_t)n * (size_t)k};
    status = rebuild_chunk(server, reads, count, refs, targets, stamp_targets, body);
    if (status == KEEL_OK && server->rebuild_pause_ms > 0 && first + count < group_count)
      pause_unless_stopped(server, server->rebuild_pause_ms);
  }
  free(body), free(stamp_targets), free(targets), free(refs);
  free(stamps), free(space), free(reads), free(groups);
  if (status == KEEL_OK) status = rebuild_dense(server);
  if (status == KEEL_OK) status = server->rebuild->status; /* a change it could not keep */
  return status;
}

static void *rebuild_main(void *argument) {
  keel_ec_server *server = argument;
  int64_t started = keel_now_ns();
  keel_status status = rebuild_all(server);
  server->rebuild->status = status;
  if (status == KEEL_OK) {
    atomic_store(&server->rebuild->complete, true);
    atomic_store(&server->blocks_complete, true);
    status = keel__ec_directory_set_standing(&server->directory, server->index, KEEL__EC_REBUILT);
    KEEL_LOG_I(MODULE, "server %d rebuilt in %.1f ms: %llu rows, %llu parity blocks, %llu rounds",
               server->index, (double)(keel_now_ns() - started) / 1e6,
               (unsigned long long)server->shard.data_rows,
               (unsigned long long)server->shard.parity_rows,
               (unsigned long long)server->rebuild->rounds);
  }
  if (status != KEEL_OK)
    KEEL_LOG_E(MODULE, "server %d: the rebuild failed: %s; its rows stay served through the parity",
               server->index, keel_strerror(status));
  return NULL;
}

keel_status keel__ec_rebuild_prepare(keel_ec_server *server) {
  keel__ec_rebuild *rebuild = calloc(1, sizeof *rebuild);
  if (rebuild == NULL) return KEEL_ENOMEM;
  atomic_init(&rebuild->stop, false);
  atomic_init(&rebuild->complete, false);
  rebuild->ready = calloc(server->shard.groups > 0 ? server->shard.groups : 1, 1);
  rebuild->kept =
      calloc(server->shard.groups > 0 ? server->shard.groups : 1, sizeof *rebuild->kept);
  if (rebuild->ready == NULL || rebuild->kept == NULL) {
    free(rebuild->ready);
    free(rebuild->kept);
    free(rebuild);
    return KEEL_ENOMEM;
  }
  server->rebuild = rebuild;
  return KEEL_OK;
}

keel_status keel__ec_rebuild_start(keel_ec_server *server) {
  keel__ec_rebuild *rebuild = server->rebuild;
  if (pthread_create(&rebuild->thread, NULL, rebuild_main, server) != 0) return KEEL_ENOMEM;
  rebuild->started = true;
  return KEEL_OK;
}

void keel__ec_rebuild_stop(keel_ec_server *server) {
  keel__ec_rebuild *rebuild = server->rebuild;
  if (rebuild == NULL) return;
  atomic_store(&rebuild->stop, true);
  if (rebuild->started) pthread_join(rebuild->thread, NULL);
  for (uint64_t group = 0; group < server->shard.groups; group++) {
    while (rebuild->kept[group] != NULL) {
      kept_change *change = rebuild->kept[group];
      rebuild->kept[group] = change->next;
      free(change->delta);
      free(change);
    }
  }
  free(rebuild->kept);
  free(rebuild->ready);
  free(rebuild);
  server->rebuild = NULL;
}
