/* A parameter server (ECRec): a thread per link serves requests on the server's shard; an
 * update applied to a row sends its change to the group's parity holders before the push is
 * answered; rows of lost servers are decoded from the survivors for the groups this server
 * acts for; synchronous mode applies a step once every worker's push of it is in. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ec/ec_internal.h"
#include "ec/server_internal.h"

#define MODULE KEEL__EC_MODULE
#define HANDSHAKE_TIMEOUT_NS ((int64_t)2000 * 1000 * 1000)
#define ACCEPT_POLL_MS 100

static void prepared_free(prepared_update *item) {
  free(item->refs);
  free(item->deltas);
  free(item);
}

static uint64_t update_stamp(const keel_ec_server *server, uint64_t id);

/* The one point a replacement fires rules at: its address published and itself marked
 * REBUILDING, its rebuild not started. The other points' rules name the index's first life,
 * as a spare that takes a rank has a uid of its own. */
#define REPLACEMENT_POINT "ec_rebuild_begin"

/* Fires the fault rules at point in the update's step (a kill between or inside the phases
 * of a commit, or between two answers), counter the point's own count (0: none). */
static void server_fault(keel_ec_server *server, const char *point, uint64_t update_id,
                         int64_t counter) {
  if (server->faults == NULL) return;
  if (server->replacement && strcmp(point, REPLACEMENT_POINT) != 0) return;
  pthread_mutex_lock(&server->fault_lock);
  uint64_t stamp = update_stamp(server, update_id);
  if (stamp > 0) keel_fault_plan_set_step(server->faults, stamp - 1);
  keel_fault_plan_fire(server->faults, point, counter);
  pthread_mutex_unlock(&server->fault_lock);
}

/* ---- the lost servers, as this server last read them */

void keel__ec_server_refresh(keel_ec_server *server) {
  uint64_t *fresh = calloc((size_t)server->servers, sizeof *fresh);
  if (fresh == NULL) return;
  keel_status status = keel__ec_directory_standing(&server->directory, server->servers, fresh);
  if (status == KEEL_OK) {
    pthread_mutex_lock(&server->lost_lock);
    memcpy(server->standing, fresh, sizeof *fresh * (size_t)server->servers);
    pthread_mutex_unlock(&server->lost_lock);
  } else {
    KEEL_LOG_W(MODULE, "server %d: cannot read the lost servers: %s", server->index,
               keel_strerror(status));
  }
  free(fresh);
}

/* What this server knows of the others for one step: which are served through the parity
 * (lost) and each one's standing (a holder gets changes unless it is LOST). */

keel_status keel__ec_view_make(keel_ec_server *server, keel__ec_view *view) {
  view->lost = calloc((size_t)server->servers, sizeof *view->lost);
  view->standing = calloc((size_t)server->servers, sizeof *view->standing);
  return view->lost != NULL && view->standing != NULL ? KEEL_OK : KEEL_ENOMEM;
}

void keel__ec_view_free(keel__ec_view *view) {
  free(view->lost);
  free(view->standing);
}

/* The view at step (a pull, which has none, passes either bound: see rows_have_role). */
void keel__ec_view_at(keel_ec_server *server, uint64_t step, keel__ec_view *view) {
  pthread_mutex_lock(&server->lost_lock);
  memcpy(view->standing, server->standing, sizeof *view->standing * (size_t)server->servers);
  pthread_mutex_unlock(&server->lost_lock);
  keel__ec_lost_view(view->standing, server->servers, step, view->lost);
}

static bool gets_changes(const keel__ec_view *view, int server) {
  return view->standing[server] != KEEL__EC_LOST;
}

static void declare_lost(keel_ec_server *server, int index, keel_status why,
                         const char *failed_address) {
  KEEL_LOG_W(MODULE, "server %d: server %d is lost (%s)", server->index, index, keel_strerror(why));
  keel__ec_directory_declare_lost(&server->directory, index, failed_address);
  /* What the directory now says (a replacement being rebuilt stays so). */
  keel__ec_server_refresh(server);
}

/* A call to another server; its loss is declared here, so every caller routes around it. */
keel_status keel__ec_server_call(keel_ec_server *server, int index, const keel__ec_request *request,
                                 void *body) {
  char failed_address[KEEL__EC_ADDRESS_BYTES];
  keel_status status = keel__ec_peer_call(
      &server->peers[index], &server->directory, &server->auth, request, &server->limits, body,
      keel_deadline_after_ns(KEEL__EC_CALL_TIMEOUT_NS), failed_address);
  if (keel__ec_unreachable(status)) declare_lost(server, index, status, failed_address);
  return status;
}

keel_status keel__ec_server_call_each(keel_ec_server *server, const bool *targets,
                                      const keel__ec_request *requests, void *const *bodies,
                                      keel_status *statuses) {
  keel__ec_pending *pending = calloc((size_t)server->servers, sizeof *pending);
  if (pending == NULL) return KEEL_ENOMEM;
  keel__ec_peers_call_each(server->peers, server->servers, &server->directory, &server->auth,
                           &server->limits, targets, requests, bodies, pending, statuses);
  for (int i = 0; i < server->servers; i++)
    if (targets[i] && keel__ec_unreachable(statuses[i]))
      declare_lost(server, i, statuses[i], pending[i].failed_address);
  free(pending);
  return KEEL_OK;
}

/* ---- decoding the blocks of groups with lost members */

/* Two-phase commit's side of decoding (below, with the parity holder's side). */
static keel_status resolve_lost_updates(keel_ec_server *server, const keel__ec_view *view);

/* What one group needs decoded: its blocks (k + r, block_bytes each) and which are present. */
typedef struct group_blocks {
  uint64_t group;
  uint8_t *blocks; /* (k + r) * block_bytes */
  bool present[KEEL_EC_MAX_BLOCKS];
} group_blocks;

/* The servers whose blocks may be read for a decode: every one complete, whatever step the
 * caller routes by. A replacement back from a later step, or rebuilt and not back yet, holds
 * its blocks whole and gets every change; only one lost or still rebuilding is no source.
 * Read from this server's standing as it is now, not from the caller's view: a view of a
 * step counts such a replacement as lost, and with two servers killed beside it a group was
 * found short ("data lost", RELIABILITY.md finding 47). passed: the servers this request
 * could not read. */
static void sources_find(keel_ec_server *server, const bool *passed, bool *readable) {
  pthread_mutex_lock(&server->lost_lock);
  for (int other = 0; other < server->servers; other++) {
    readable[other] = !passed[other] && keel__ec_complete(server->standing[other]);
  }
  pthread_mutex_unlock(&server->lost_lock);
  readable[server->index] = !passed[server->index] && !keel__ec_rebuild_running(server);
}

/* Chooses k readable members of each group and copies those held here. The others are left
 * to read_from: present[] marks every chosen one. KEEL_EDATALOST when a group has fewer than
 * k members readable. */
static keel_status choose_sources(keel_ec_server *server, group_blocks *groups, size_t count,
                                  const bool *readable) {
  keel__ec_shard *shard = &server->shard;
  int k = shard->layout.data_blocks, n = k + shard->layout.parity_blocks;
  for (size_t g = 0; g < count; g++) {
    int chosen = 0;
    memset(groups[g].present, 0, sizeof groups[g].present);
    for (int member = 0; member < n && chosen < k; member++) {
      keel_ec_location at;
      keel_ec_layout_locate(&shard->layout, groups[g].group, member, &at);
      if (!readable[at.server]) continue;
      if (at.server == server->index) {
        pthread_mutex_t *lock = keel__ec_shard_lock(shard, groups[g].group);
        pthread_mutex_lock(lock);
        memcpy(groups[g].blocks + (size_t)member * shard->block_bytes,
               keel__ec_shard_block(shard, groups[g].group, member), shard->block_bytes);
        pthread_mutex_unlock(lock);
      }
      groups[g].present[member] = true;
      chosen++;
    }
    if (chosen < k) {
      KEEL_LOG_W(MODULE, "server %d: group %llu has fewer than %d members to read", server->index,
                 (unsigned long long)groups[g].group, k);
      return KEEL_EDATALOST;
    }
  }
  return KEEL_OK;
}

/* Reads the chosen blocks that server `other` holds, in requests of at most
 * KEEL__EC_MAX_COUNT refs. */
static keel_status read_from(keel_ec_server *server, int other, group_blocks *groups,
                             size_t count) {
  keel__ec_shard *shard = &server->shard;
  int n = shard->layout.data_blocks + shard->layout.parity_blocks;
  size_t capacity = KEEL__EC_MAX_COUNT;
  keel__ec_ref *refs = malloc(sizeof *refs * capacity);
  uint8_t **targets = malloc(sizeof *targets * capacity);
  uint8_t *body = malloc(shard->block_bytes * capacity);
  keel_status status = refs && targets && body ? KEEL_OK : KEEL_ENOMEM;
  size_t g = 0;
  int member = 0;
  while (status == KEEL_OK && g < count) {
    size_t wanted = 0;
    for (; g < count && wanted < capacity; g++, member = 0) {
      for (; member < n && wanted < capacity; member++) {
        keel_ec_location at;
        keel_ec_layout_locate(&shard->layout, groups[g].group, member, &at);
        if (!groups[g].present[member] || at.server != other) continue;
        refs[wanted] = (keel__ec_ref){.group = groups[g].group, .member = (uint32_t)member};
        targets[wanted++] = groups[g].blocks + (size_t)member * shard->block_bytes;
      }
      if (member < n) break; /* the request is full mid-group: go on from here */
    }
    if (wanted == 0) break;
    keel__ec_request request = {
        .op = KEEL__EC_OP_READ_BLOCKS, .count = (uint32_t)wanted, .refs = refs};
    status = keel__ec_server_call(server, other, &request, body);
    for (size_t i = 0; status == KEEL_OK && i < wanted; i++)
      memcpy(targets[i], body + i * shard->block_bytes, shard->block_bytes);
  }
  free(body);
  free(targets);
  free(refs);
  return status;
}

/* Decides the lost servers' prepared updates, chooses k members of each group and reads
 * those held elsewhere. *passed_over: a source that could not be read (found lost, or it does
 * not serve blocks: a replacement not complete), -1 when none. */
static keel_status fetch_blocks(keel_ec_server *server, group_blocks *groups, size_t count,
                                const keel__ec_view *view, const bool *passed, bool *readable,
                                int *passed_over) {
  *passed_over = -1;
  keel_status status = resolve_lost_updates(server, view);
  sources_find(server, passed, readable);
  if (status == KEEL_OK) status = choose_sources(server, groups, count, readable);
  for (int other = 0; other < server->servers && status == KEEL_OK; other++) {
    if (other == server->index || !readable[other]) continue;
    status = read_from(server, other, groups, count);
    if (keel__ec_unreachable(status) || status == KEEL_EAGAIN) *passed_over = other;
  }
  return status;
}

/* Every member of each group, decoded where not read: the group's blocks as they are now. A
 * source that cannot be read is passed over and the blocks are fetched again without it: a
 * loss the parity covers never fails the request (with r = 2, two servers killed at once
 * failed the workers' reads, RELIABILITY.md finding 44). One lost while it was read is lost
 * in the view from then on (the caller routes its changes by it too); one that refused (a
 * replacement this server had not heard of yet, still rebuilt) only stops being a source, as
 * it gets every change. Each round passes over one more server, so the rounds end, at the
 * latest when a group has fewer than k members left (KEEL_EDATALOST); a group found short
 * before any was passed over is chosen once more from the standing read anew (what this
 * server knew may be older than the caller's loss). */
static keel_status fetch_and_decode(keel_ec_server *server, group_blocks *groups, size_t count,
                                    keel__ec_view *view) {
  bool *passed = calloc((size_t)server->servers, sizeof *passed);
  bool *readable = calloc((size_t)server->servers, sizeof *readable);
  if (passed == NULL || readable == NULL) {
    free(passed), free(readable);
    return KEEL_ENOMEM;
  }
  int passed_over;
  keel_status status = fetch_blocks(server, groups, count, view, passed, readable, &passed_over);
  if (status == KEEL_EDATALOST) {
    keel__ec_server_refresh(server);
    status = fetch_blocks(server, groups, count, view, passed, readable, &passed_over);
  }
  while (passed_over >= 0) {
    KEEL_LOG_I(MODULE, "server %d: server %d could not be read (%s): reading again without it",
               server->index, passed_over, keel_strerror(status));
    passed[passed_over] = true;
    view->lost[passed_over] = true;
    if (status == KEEL_EAGAIN)
      keel__ec_server_refresh(server); /* what this server serves and acts for, anew */
    else
      view->standing[passed_over] = KEEL__EC_LOST;
    status = fetch_blocks(server, groups, count, view, passed, readable, &passed_over);
  }
  free(readable);
  free(passed);
  keel__ec_shard *shard = &server->shard;
  int n = shard->layout.data_blocks + shard->layout.parity_blocks;
  pthread_mutex_lock(&server->decode_lock);
  for (size_t g = 0; g < count && status == KEEL_OK; g++) {
    uint8_t *blocks[KEEL_EC_MAX_BLOCKS];
    for (int member = 0; member < n; member++)
      blocks[member] = groups[g].blocks + (size_t)member * shard->block_bytes;
    status = keel_ec_decode(server->decoder, shard->block_bytes, blocks, groups[g].present);
  }
  pthread_mutex_unlock(&server->decode_lock);
  return status;
}

/* The distinct groups of rows (strictly increasing), each with room for its blocks. */
static keel_status groups_of_rows(const keel__ec_shard *shard, const uint64_t *rows, size_t count,
                                  group_blocks **groups_p, size_t *group_count_p) {
  uint64_t k = (uint64_t)shard->layout.data_blocks;
  size_t n = (size_t)shard->layout.data_blocks + (size_t)shard->layout.parity_blocks;
  size_t distinct = 0;
  for (size_t i = 0; i < count; i++)
    if (i == 0 || rows[i] / k != rows[i - 1] / k) distinct++;
  group_blocks *groups = calloc(distinct > 0 ? distinct : 1, sizeof *groups);
  uint8_t *space = calloc(distinct > 0 ? distinct * n : 1, shard->block_bytes);
  if (groups == NULL || space == NULL) {
    free(groups), free(space);
    return KEEL_ENOMEM;
  }
  groups[0].blocks = space; /* groups_free finds the space there, even with no group */
  size_t at = 0;
  for (size_t i = 0; i < count; i++) {
    if (i > 0 && rows[i] / k == rows[i - 1] / k) continue;
    groups[at].group = rows[i] / k;
    groups[at].blocks = space + at * n * shard->block_bytes;
    at++;
  }
  *groups_p = groups;
  *group_count_p = distinct;
  return KEEL_OK;
}

static void groups_free(group_blocks *groups) {
  if (groups != NULL) free(groups[0].blocks);
  free(groups);
}

/* The decoded block of row within groups (the group of each row is there, in order). */
static uint8_t *decoded_block(const keel__ec_shard *shard, group_blocks *groups, size_t count,
                              size_t *cursor, uint64_t row) {
  uint64_t k = (uint64_t)shard->layout.data_blocks;
  while (*cursor < count && groups[*cursor].group != row / k) (*cursor)++;
  return groups[*cursor].blocks + (size_t)(row % k) * shard->block_bytes;
}

/* ---- which rows this server serves */

typedef enum row_role { ROW_OWN, ROW_ACTING, ROW_ELSEWHERE } row_role;

static row_role role_of(keel_ec_server *server, uint64_t row, const bool *lost) {
  keel_ec_location at;
  keel_ec_layout_locate_row(&server->shard.layout, row, &at);
  if (at.server == server->index) return ROW_OWN;
  return keel__ec_row_server(&server->shard.layout, row, lost) == server->index ? ROW_ACTING
                                                                                : ROW_ELSEWHERE;
}

static bool all_have_role(keel_ec_server *server, const uint64_t *rows, size_t count,
                          row_role wanted, const bool *lost) {
  size_t i = 0;
  while (i < count && role_of(server, rows[i], lost) == wanted) i++;
  return i == count;
}

/* Whether every row has the role wanted at step, into view; refreshes the standing once
 * when not, since the caller may have learnt of a change first. An asynchronous push
 * (any_step) is routed by no step: while a replacement comes back both it and the acting
 * holder serve its rows exactly, so either role is accepted. */
static bool rows_have_role(keel_ec_server *server, const uint64_t *rows, size_t count,
                           row_role wanted, uint64_t step, bool any_step, keel__ec_view *view) {
  for (int attempt = 0; attempt < 2; attempt++) {
    if (attempt == 1) keel__ec_server_refresh(server);
    if (any_step && wanted == ROW_ACTING) {
      /* Acting rows a lost own server; and since a replacement that comes back may be the
       * first parity holder of another lost server's groups from its step on, this server
       * acts for them if it does on either side of that step (any holder decodes exactly). */
      keel__ec_view_at(server, 0, view);
      if (all_have_role(server, rows, count, wanted, view->lost)) return true;
      keel__ec_view_at(server, UINT64_MAX - 3, view);
    } else if (any_step) {
      /* Own rows need this server complete. */
      keel__ec_view_at(server, UINT64_MAX - 3, view);
      if (view->lost[server->index]) continue;
    } else {
      keel__ec_view_at(server, step, view);
      /* Own rows need this server serving at the step. */
      if (wanted == ROW_OWN && view->lost[server->index]) continue;
    }
    if (all_have_role(server, rows, count, wanted, view->lost)) return true;
  }
  return false;
}

/* ---- reads */

static keel_status pull_rows(keel_ec_server *server, const keel__ec_request *request, bool acting,
                             float *values) {
  keel__ec_shard *shard = &server->shard;
  keel__ec_view view;
  keel_status status = keel__ec_view_make(server, &view);
  /* A replacement's own rows are the seed's until its rebuild is done. Its view said it was
   * live until the rebuild read the directory back, and a worker whose pull to the server it
   * replaces broke sends the pull again to its address: it read those rows (finding 54). */
  if (status == KEEL_OK && !acting && !atomic_load(&server->blocks_complete)) status = KEEL_EAGAIN;
  /* By the step the worker routed it by: the view at that step is the worker's own. Any step
   * would do for a holder that acts for the rows in some view, but a view of a step the job is
   * past counts servers back since then as lost, and decoding without them may find a group
   * short (a chaos run at r = 2 read "data lost" so, finding 44). */
  if (status == KEEL_OK &&
      !rows_have_role(server, request->rows, request->count, acting ? ROW_ACTING : ROW_OWN,
                      request->step, false, &view))
    status = KEEL_EAGAIN;
  group_blocks *groups = NULL;
  size_t group_count = 0, cursor = 0;
  if (status == KEEL_OK && acting) {
    status = groups_of_rows(shard, request->rows, request->count, &groups, &group_count);
    if (status == KEEL_OK) status = fetch_and_decode(server, groups, group_count, &view);
  }
  for (size_t i = 0; i < request->count && status == KEEL_OK; i++) {
    uint64_t row = request->rows[i], k = (uint64_t)shard->layout.data_blocks;
    float *out = values + i * (size_t)shard->dim;
    if (acting) {
      status = keel_ec_row_read(shard->dim, decoded_block(shard, groups, group_count, &cursor, row),
                                out);
      continue;
    }
    pthread_mutex_t *lock = keel__ec_shard_lock(shard, row / k);
    pthread_mutex_lock(lock);
    status =
        keel_ec_row_read(shard->dim, keel__ec_shard_block(shard, row / k, (int)(row % k)), out);
    pthread_mutex_unlock(lock);
  }
  groups_free(groups);
  keel__ec_view_free(&view);
  return status;
}

/* A block read to decode from (or to rebuild from) holds no update of a server that no
 * longer serves still prepared: the reader is not always a holder of that update, and its own
 * decision (fetch_blocks) reached only its own copy; a parity committed at one holder and
 * prepared at another decoded wrong rows (finding 50). The directory is read anew only when
 * something is prepared here. */
static keel_status resolve_before_read(keel_ec_server *server) {
  pthread_mutex_lock(&server->prepared_lock);
  bool any = server->prepared != NULL;
  pthread_mutex_unlock(&server->prepared_lock);
  if (!any || keel__ec_rebuild_running(server)) return KEEL_OK;
  keel__ec_server_refresh(server);
  keel__ec_view view;
  keel_status status = keel__ec_view_make(server, &view);
  if (status == KEEL_OK) {
    keel__ec_view_at(server, 0, &view);
    status = resolve_lost_updates(server, &view);
  }
  keel__ec_view_free(&view);
  return status;
}

/* A replacement's barrier (a versioned read of nothing): from the answer on, this server
 * knows the replacement is there (it sends it every change), and every update it began
 * before, which may not have, is done. */
static keel_status rebuild_barrier(keel_ec_server *server) {
  keel__ec_server_refresh(server);
  pthread_rwlock_wrlock(&server->updates_lock);
  pthread_rwlock_unlock(&server->updates_lock);
  return KEEL_OK;
}

/* Blocks as they are, each with its stamps when versioned (read with it, under its lock). */
static keel_status read_blocks(keel_ec_server *server, const keel__ec_request *request,
                               uint8_t *body) {
  keel__ec_shard *shard = &server->shard;
  bool versioned = (request->flags & KEEL__EC_FLAG_VERSIONED) != 0;
  if (versioned && request->count == 0) return rebuild_barrier(server);
  /* Before any block goes out: a server killed here fails another server's read mid-way, the
   * step being the last update's it handled. */
  if (!versioned) server_fault(server, "ec_read", 0, 0);
  keel_status status = resolve_before_read(server);
  if (status != KEEL_OK) return status;
  size_t stamps_bytes = versioned ? sizeof(uint64_t) * (size_t)shard->layout.data_blocks : 0;
  size_t each = shard->block_bytes + stamps_bytes;
  uint64_t stamps[KEEL_EC_MAX_BLOCKS];
  for (size_t i = 0; i < request->count; i++) {
    const keel__ec_ref *ref = &request->refs[i];
    uint8_t *block = keel__ec_shard_block(shard, ref->group, (int)ref->member);
    /* A replacement serves no block before it is complete. */
    if (block == NULL || keel__ec_rebuild_running(server)) return KEEL_EAGAIN;
    pthread_mutex_t *lock = keel__ec_shard_lock(shard, ref->group);
    pthread_mutex_lock(lock);
    memcpy(body + i * each, block, shard->block_bytes);
    if (versioned) keel__ec_shard_stamps(shard, ref->group, (int)ref->member, stamps);
    pthread_mutex_unlock(lock);
    if (versioned) memcpy(body + i * each + shard->block_bytes, stamps, stamps_bytes);
  }
  return KEEL_OK;
}

/* ---- updates: the change of each row goes to its group's parity holders */

/* The changes bound for one parity holder. */
typedef struct parity_batch {
  keel__ec_ref *refs;
  uint8_t *deltas;
  size_t count, capacity;
} parity_batch;

static keel_status batch_add(parity_batch *batch, size_t block_bytes, uint64_t group,
                             int data_member, int parity_member, const uint8_t *delta) {
  if (batch->count == batch->capacity) {
    size_t capacity = batch->capacity ? batch->capacity * 2 : 64;
    keel__ec_ref *refs = realloc(batch->refs, sizeof *refs * capacity);
    if (refs == NULL) return KEEL_ENOMEM;
    batch->refs = refs;
    uint8_t *deltas = realloc(batch->deltas, block_bytes * capacity);
    if (deltas == NULL) return KEEL_ENOMEM;
    batch->deltas = deltas;
    batch->capacity = capacity;
  }
  batch->refs[batch->count] = (keel__ec_ref){
      .group = group, .member = (uint32_t)data_member, .other = (uint32_t)parity_member};
  memcpy(batch->deltas + batch->count * block_bytes, delta, block_bytes);
  batch->count++;
  return KEEL_OK;
}

/* Update ids are unique in the job: the origin server in the top 16 bits; in synchronous
 * mode the rest is 1 + the step, then the phase (own rows or acting), so that a holder reads
 * the step it stamps its parity with from the id itself. */
#define UPDATE_ORIGIN_SHIFT 48
static uint64_t update_id_make(keel_ec_server *server, uint64_t step, bool acting,
                               bool synchronous) {
  uint64_t local = synchronous ? ((step + 1) << 1) | (acting ? 1u : 0u)
                               : atomic_fetch_add(&server->next_update, 1);
  return ((uint64_t)server->index << UPDATE_ORIGIN_SHIFT) |
         (local & (((uint64_t)1 << UPDATE_ORIGIN_SHIFT) - 1));
}

static int update_origin(uint64_t id) { return (int)(id >> UPDATE_ORIGIN_SHIFT); }

/* The parity stamp of an update: 1 + its step in synchronous mode, 0 (no stamp) otherwise. */
static uint64_t update_stamp(const keel_ec_server *server, uint64_t id) {
  if (server->wire.workers == 0) return 0;
  return (id & (((uint64_t)1 << UPDATE_ORIGIN_SHIFT) - 1)) >> 1;
}

static bool two_phase(const keel_ec_server *server) {
  return (server->wire.options & KEEL__EC_OPTION_TWO_PHASE_COMMIT) != 0;
}

/* Folds a batch of changes into parity blocks held here. */
static keel_status fold_here(keel_ec_server *server, const keel__ec_ref *refs,
                             const uint8_t *deltas, size_t count, uint64_t stamp) {
  keel__ec_shard *shard = &server->shard;
  for (size_t i = 0; i < count; i++) {
    pthread_mutex_t *lock = keel__ec_shard_lock(shard, refs[i].group);
    const uint8_t *delta = deltas + i * shard->block_bytes;
    pthread_mutex_lock(lock);
    keel_status status = KEEL_OK;
    if (!keel__ec_rebuild_running(server) || !keel__ec_rebuild_keep(server, &refs[i], delta, stamp))
      status = keel__ec_shard_fold(shard, refs[i].group, (int)refs[i].member, (int)refs[i].other,
                                   delta, stamp);
    pthread_mutex_unlock(lock);
    if (status != KEEL_OK) return status;
  }
  return KEEL_OK;
}

/* Sends one holder its changes, in requests of at most KEEL__EC_MAX_COUNT: folded at once
 * (APPLY_NOW) or prepared for a commit. A holder lost meanwhile is passed over (*delivered
 * false): its parity is rebuilt from the rows later, not updated. */
static keel_status send_batch(keel_ec_server *server, int holder, const parity_batch *batch,
                              uint64_t update_id, bool prepare_only, bool *delivered) {
  *delivered = false;
  for (size_t done = 0; done < batch->count;) {
    size_t piece = batch->count - done;
    if (piece > KEEL__EC_MAX_COUNT) piece = KEEL__EC_MAX_COUNT;
    keel__ec_request request = {.op = KEEL__EC_OP_PARITY_PREPARE,
                                .flags = prepare_only ? 0 : KEEL__EC_FLAG_APPLY_NOW,
                                .count = (uint32_t)piece,
                                .id = update_id,
                                .refs = batch->refs + done,
                                .blocks = batch->deltas + done * server->shard.block_bytes};
    keel_status status = keel__ec_server_call(server, holder, &request, NULL);
    if (keel__ec_unreachable(status)) return KEEL_OK;
    if (status != KEEL_OK) return status;
    done += piece;
  }
  *delivered = true;
  return KEEL_OK;
}

/* A holder's answer to a commit or an abort. A holder lost meanwhile is passed over, and so
 * is one that has nothing of the update (KEEL_ENOTFOUND): a replacement at its address, to
 * which the commit went again after the link to the one that prepared broke. Its rebuild
 * waits for this update and reads the change from the rows; the holders that decide a lost
 * server's update also answer so when another thread decided it first. */
static keel_status commit_answer(keel_status status) {
  return keel__ec_unreachable(status) || status == KEEL_ENOTFOUND ? KEEL_OK : status;
}

static keel_status send_commit(keel_ec_server *server, int holder, uint64_t update_id,
                               uint16_t flags) {
  keel__ec_request request = {.op = KEEL__EC_OP_PARITY_COMMIT, .flags = flags, .id = update_id};
  return commit_answer(keel__ec_server_call(server, holder, &request, NULL));
}

/* Room for one request to each server (keel__ec_server_call_each). */
typedef struct holder_calls {
  bool *targets;
  keel__ec_request *requests;
  keel_status *statuses;
} holder_calls;

static keel_status holder_calls_make(keel_ec_server *server, holder_calls *calls) {
  calls->targets = calloc((size_t)server->servers, sizeof *calls->targets);
  calls->requests = calloc((size_t)server->servers, sizeof *calls->requests);
  calls->statuses = calloc((size_t)server->servers, sizeof *calls->statuses);
  return calls->targets && calls->requests && calls->statuses ? KEEL_OK : KEEL_ENOMEM;
}

static void holder_calls_free(holder_calls *calls) {
  free(calls->targets);
  free(calls->requests);
  free(calls->statuses);
}

/* The sent requests' answers: a holder lost meanwhile is passed over (delivered false, its
 * parity is rebuilt from the rows later), any other failure is the update's. */
static keel_status holder_answers(keel_ec_server *server, const holder_calls *calls,
                                  bool *delivered) {
  keel_status status = KEEL_OK;
  for (int holder = 0; holder < server->servers; holder++) {
    if (!calls->targets[holder]) continue;
    keel_status answer = calls->statuses[holder];
    if (delivered != NULL) delivered[holder] = answer == KEEL_OK;
    if (answer != KEEL_OK && !keel__ec_unreachable(answer) && status == KEEL_OK) status = answer;
  }
  return status;
}

/* A mark: no change, folded at once. It tells a server that gets none of this step's changes
 * that this one has applied its own rows of the step (marked_steps). */
static keel__ec_request mark_request(uint64_t update_id) {
  return (keel__ec_request){
      .op = KEEL__EC_OP_PARITY_PREPARE, .flags = KEEL__EC_FLAG_APPLY_NOW, .id = update_id};
}

/* send_batches' second half: the parity held here is folded, then (with two-phase commit)
 * every holder that prepared is told to fold its part: the first alone (the fault point
 * ec_committing falls between it and the others), the others at once, with the marks. */
static keel_status commit_batches(keel_ec_server *server, const parity_batch *batches,
                                  uint64_t update_id, const bool *prepared, const bool *marks,
                                  holder_calls *calls) {
  bool prepare_first = two_phase(server);
  if (prepare_first) server_fault(server, "ec_prepared", update_id, 0);
  const parity_batch *local = &batches[server->index];
  keel_status status =
      fold_here(server, local->refs, local->deltas, local->count, update_stamp(server, update_id));
  if (!prepare_first || status != KEEL_OK) return status;
  int first = 0;
  while (first < server->servers && !prepared[first]) first++;
  if (first < server->servers) {
    status = send_commit(server, first, update_id, 0);
    server_fault(server, "ec_committing", update_id, 0);
    if (status != KEEL_OK) return status;
  }
  /* Marks go with the commits, not before: a mark says the step is in. */
  bool any = false;
  for (int holder = 0; holder < server->servers; holder++) {
    bool mark = marks != NULL && marks[holder];
    calls->targets[holder] = (holder > first && prepared[holder]) || mark;
    calls->requests[holder] =
        mark ? mark_request(update_id)
             : (keel__ec_request){.op = KEEL__EC_OP_PARITY_COMMIT, .flags = 0, .id = update_id};
    any |= calls->targets[holder];
  }
  if (!any) return KEEL_OK;
  status =
      keel__ec_server_call_each(server, calls->targets, calls->requests, NULL, calls->statuses);
  for (int holder = 0; holder < server->servers; holder++)
    if (calls->targets[holder] && calls->requests[holder].op == KEEL__EC_OP_PARITY_COMMIT)
      calls->statuses[holder] = commit_answer(calls->statuses[holder]);
  return status == KEEL_OK ? holder_answers(server, calls, NULL) : status;
}

/* The changes of one update to their parity holders, every holder's at once. Without
 * two-phase commit each holder folds its part at once. With it, every holder first prepares
 * its part (keeps it aside), and only then is each told to fold: a server lost in between
 * leaves prepared parts that the holders decide together (resolve_lost_updates), all in or
 * all out. The parity held here is folded with the commits. marks (NULL: none): the servers
 * that get a mark, with the changes folded at once or with the commits. */
static keel_status send_batches(keel_ec_server *server, parity_batch *batches, uint64_t update_id,
                                const bool *marks) {
  bool prepare_first = two_phase(server);
  /* Only the holders that prepared are told to commit: one found lost while preparing may
   * have a replacement at its address by the commit, which never saw the update (its rebuild
   * reads the change from the rows instead). */
  bool *prepared = calloc((size_t)server->servers, sizeof *prepared);
  holder_calls calls;
  keel_status status = holder_calls_make(server, &calls);
  if (status == KEEL_OK && prepared == NULL) status = KEEL_ENOMEM;
  for (int holder = 0; holder < server->servers && status == KEEL_OK; holder++) {
    const parity_batch *batch = &batches[holder];
    if (!prepare_first && marks != NULL && marks[holder]) {
      calls.targets[holder] = true;
      calls.requests[holder] = mark_request(update_id);
    }
    if (holder == server->index || batch->count == 0) continue;
    /* A batch over one request's count goes alone, in pieces. */
    if (batch->count > KEEL__EC_MAX_COUNT) {
      status = send_batch(server, holder, batch, update_id, prepare_first, &prepared[holder]);
      continue;
    }
    calls.targets[holder] = true;
    calls.requests[holder] =
        (keel__ec_request){.op = KEEL__EC_OP_PARITY_PREPARE,
                           .flags = prepare_first ? 0 : KEEL__EC_FLAG_APPLY_NOW,
                           .count = (uint32_t)batch->count,
                           .id = update_id,
                           .refs = batch->refs,
                           .blocks = batch->deltas};
  }
  if (status == KEEL_OK)
    status = keel__ec_server_call_each(server, calls.targets, calls.requests, NULL, calls.statuses);
  if (status == KEEL_OK) status = holder_answers(server, &calls, prepared);
  if (status == KEEL_OK)
    status = commit_batches(server, batches, update_id, prepared, marks, &calls);
  holder_calls_free(&calls);
  free(prepared);
  return status;
}

/* Queues delta of (group, data member) for every parity holder not lost; skip_step_mark: the
 * holders whose stamp says the step is in already are not sent it again. */
static keel_status queue_delta(keel_ec_server *server, parity_batch *batches,
                               const keel__ec_view *view, uint64_t group, int data_member,
                               const uint8_t *delta) {
  keel__ec_shard *shard = &server->shard;
  if (server->wire.options & KEEL__EC_OPTION_NO_PARITY) return KEEL_OK;
  int k = shard->layout.data_blocks, n = k + shard->layout.parity_blocks;
  for (int member = k; member < n; member++) {
    keel_ec_location at;
    keel_ec_layout_locate(&shard->layout, group, member, &at);
    if (!gets_changes(view, at.server)) continue;
    keel_status status =
        batch_add(&batches[at.server], shard->block_bytes, group, data_member, member, delta);
    if (status != KEEL_OK) return status;
  }
  return KEEL_OK;
}

/* Applies one step of merged gradients to this server's own rows. */
static keel_status apply_own(keel_ec_server *server, const uint64_t *rows, size_t count,
                             const float *gradients, const keel__ec_view *view, uint64_t stamp,
                             parity_batch *batches, uint8_t *delta) {
  keel__ec_shard *shard = &server->shard;
  uint64_t k = (uint64_t)shard->layout.data_blocks;
  for (size_t i = 0; i < count; i++) {
    uint64_t group = rows[i] / k;
    int member = (int)(rows[i] % k);
    pthread_mutex_t *lock = keel__ec_shard_lock(shard, group);
    pthread_mutex_lock(lock);
    keel_status status = keel__ec_shard_apply(shard, keel__ec_shard_block(shard, group, member),
                                              gradients + i * (size_t)shard->dim, delta);
    /* Stamped before the change reaches the parity: a rebuild that reads the row and the
     * parity in between sees them disagree and reads again. */
    if (stamp != 0) *keel__ec_shard_data_step(shard, group, member) = stamp;
    pthread_mutex_unlock(lock);
    if (status == KEEL_OK) status = queue_delta(server, batches, view, group, member, delta);
    if (status != KEEL_OK) return status;
  }
  return KEEL_OK;
}

/* Applies one step to lost rows this server acts for: each decoded from the survivors, the
 * step applied, and its change folded into the parity. A row whose parity stamp says the step
 * is in already (its server applied it before it was lost) is left as it is. */
static keel_status apply_acting(keel_ec_server *server, const uint64_t *rows, size_t count,
                                const float *gradients, keel__ec_view *view, uint64_t step_mark,
                                parity_batch *batches, uint8_t *delta) {
  const bool *lost = view->lost;
  keel__ec_shard *shard = &server->shard;
  uint64_t k = (uint64_t)shard->layout.data_blocks;
  group_blocks *groups = NULL;
  size_t group_count = 0, cursor = 0;
  keel_status status = groups_of_rows(shard, rows, count, &groups, &group_count);
  if (status == KEEL_OK) status = fetch_and_decode(server, groups, group_count, view);
  for (size_t i = 0; i < count && status == KEEL_OK; i++) {
    uint64_t group = rows[i] / k;
    int member = (int)(rows[i] % k);
    uint8_t *block = decoded_block(shard, groups, group_count, &cursor, rows[i]);
    keel_ec_location holder;
    keel_ec_layout_locate(&shard->layout, group, (int)k, &holder);
    /* This server is the group's first parity holder not lost: its stamp is the one. */
    int acting_member = (int)k;
    while (lost[holder.server] || holder.server != server->index) {
      keel_ec_layout_locate(&shard->layout, group, ++acting_member, &holder);
    }
    uint64_t *stamp = keel__ec_shard_parity_step(shard, group, acting_member, member);
    if (step_mark != 0 && stamp != NULL && *stamp >= step_mark) continue;
    status = keel__ec_shard_apply(shard, block, gradients + i * (size_t)shard->dim, delta);
    if (status == KEEL_OK) status = queue_delta(server, batches, view, group, member, delta);
    /* A replacement being rebuilt keeps its copy of the row: it gets the change too. */
    keel_ec_location own;
    keel_ec_layout_locate(&shard->layout, group, member, &own);
    if (status == KEEL_OK && gets_changes(view, own.server))
      status = batch_add(&batches[own.server], shard->block_bytes, group, member, member, delta);
  }
  groups_free(groups);
  return status;
}

static void batches_free(parity_batch *batches, int servers) {
  for (int i = 0; i < servers; i++) {
    free(batches[i].refs);
    free(batches[i].deltas);
  }
  free(batches);
}

/* The servers a synchronous step's phase marks: every other one that gets changes but none
 * of this step's. A worker that lost this server in the step's first phase, even after it
 * answered another worker, learns from them that the step is in (step_join); one that lost it
 * in the second, that its second round is void (redo_void). */
static keel_status marks_make(keel_ec_server *server, const parity_batch *batches,
                              const keel__ec_view *view, bool **marks_p) {
  *marks_p = NULL;
  if (server->wire.options & KEEL__EC_OPTION_NO_PARITY) return KEEL_OK;
  bool *marks = calloc((size_t)server->servers, sizeof *marks);
  if (marks == NULL) return KEEL_ENOMEM;
  for (int i = 0; i < server->servers; i++)
    marks[i] = i != server->index && gets_changes(view, i) && batches[i].count == 0;
  *marks_p = marks;
  return KEEL_OK;
}

/* One step of merged row gradients: applied, its changes folded everywhere, then answered. */
static keel_status apply_rows(keel_ec_server *server, const uint64_t *rows, size_t count,
                              const float *gradients, bool acting, uint64_t step,
                              bool synchronous) {
  keel__ec_view view;
  parity_batch *batches = calloc((size_t)server->servers, sizeof *batches);
  uint8_t *delta = malloc(server->shard.block_bytes);
  keel_status status = keel__ec_view_make(server, &view);
  if (status == KEEL_OK && (batches == NULL || delta == NULL)) status = KEEL_ENOMEM;
  /* A replacement's rebuild waits for the updates begun before it asked (rebuild_barrier). */
  pthread_rwlock_rdlock(&server->updates_lock);
  if (status == KEEL_OK && !rows_have_role(server, rows, count, acting ? ROW_ACTING : ROW_OWN, step,
                                           !synchronous, &view))
    status = KEEL_EAGAIN;
  uint64_t update_id = update_id_make(server, step, acting, synchronous);
  uint64_t stamp = update_stamp(server, update_id);
  if (status == KEEL_OK && acting)
    status = apply_acting(server, rows, count, gradients, &view, stamp, batches, delta);
  else if (status == KEEL_OK)
    status = apply_own(server, rows, count, gradients, &view, stamp, batches, delta);
  bool *marks = NULL;
  if (status == KEEL_OK && synchronous) status = marks_make(server, batches, &view, &marks);
  if (status == KEEL_OK) status = send_batches(server, batches, update_id, marks);
  /* In, and marked at every other server, before any worker has its answer (finding 48). */
  if (status == KEEL_OK && synchronous && !acting) server_fault(server, "ec_applied", update_id, 0);
  pthread_rwlock_unlock(&server->updates_lock);
  free(marks);
  if (batches != NULL) batches_free(batches, server->servers);
  free(delta);
  keel__ec_view_free(&view);
  return status;
}

/* ---- the parity holder's side of two-phase commit */

/* An update of another server's rows of a synchronous step is in here (folded, or a mark):
 * that server has applied the step's first phase (its own rows) or its second (the rows it
 * acts for). Wakes the phase-2 pushes waiting on it. */
static void step_mark_note(keel_ec_server *server, uint64_t id) {
  uint64_t stamp = update_stamp(server, id);
  int origin = update_origin(id);
  if (stamp == 0 || origin < 0 || origin >= server->servers) return;
  uint64_t *marked = (id & 1u) != 0 ? server->marked_acting : server->marked_steps;
  pthread_mutex_lock(&server->step_lock);
  if (marked[origin] < stamp) {
    marked[origin] = stamp;
    pthread_cond_broadcast(&server->step_done);
  }
  pthread_mutex_unlock(&server->step_lock);
}

/* Refs must name parity blocks held here: anything else is refused before it is kept. */
static keel_status refs_held(keel_ec_server *server, const keel__ec_ref *refs, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (keel__ec_shard_block(&server->shard, refs[i].group, (int)refs[i].other) == NULL)
      return KEEL_EAGAIN;
  return KEEL_OK;
}

static keel_status parity_prepare(keel_ec_server *server, const keel__ec_request *request) {
  keel_status status = refs_held(server, request->refs, request->count);
  if (status != KEEL_OK) return status;
  if (request->flags & KEEL__EC_FLAG_APPLY_NOW) {
    status = fold_here(server, request->refs, request->blocks, request->count,
                       update_stamp(server, request->id));
    if (status == KEEL_OK) step_mark_note(server, request->id);
    return status;
  }
  size_t block_bytes = server->shard.block_bytes;
  prepared_update *kept = calloc(1, sizeof *kept);
  if (kept == NULL) return KEEL_ENOMEM;
  kept->refs = malloc(sizeof *kept->refs * (request->count > 0 ? request->count : 1));
  kept->deltas = malloc(block_bytes * (request->count > 0 ? request->count : 1));
  if (kept->refs == NULL || kept->deltas == NULL) {
    prepared_free(kept);
    return KEEL_ENOMEM;
  }
  kept->id = request->id;
  kept->count = request->count;
  memcpy(kept->refs, request->refs, sizeof *kept->refs * request->count);
  memcpy(kept->deltas, request->blocks, block_bytes * request->count);
  pthread_mutex_lock(&server->prepared_lock);
  /* One update may come in several requests: its parts are kept together. */
  kept->next = server->prepared;
  server->prepared = kept;
  pthread_mutex_unlock(&server->prepared_lock);
  return KEEL_OK;
}

/* Takes every prepared part of update id out of the list (NULL when none). */
static prepared_update *prepared_take(keel_ec_server *server, uint64_t id) {
  prepared_update *taken = NULL;
  for (prepared_update **at = &server->prepared; *at != NULL;) {
    prepared_update *item = *at;
    if (item->id == id) {
      *at = item->next;
      item->next = taken;
      taken = item;
    } else {
      at = &item->next;
    }
  }
  return taken;
}

static bool committed_recently(const keel_ec_server *server, uint64_t id) {
  for (size_t i = 0; i < COMMITTED_MEMORY; i++)
    if (server->committed[i] == id) return true;
  return false;
}

/* What this holder has of update id: KEEL_OK committed, KEEL_EAGAIN prepared, KEEL_ENOTFOUND
 * nothing. A decider asks (asking): the parts prepared here are then its to decide. Caller
 * holds prepared_lock. */
static keel_status update_state(keel_ec_server *server, uint64_t id, bool asking) {
  bool prepared = false;
  for (prepared_update *item = server->prepared; item != NULL; item = item->next) {
    if (item->id != id) continue;
    item->asked |= asking;
    prepared = true;
  }
  if (prepared) return KEEL_EAGAIN;
  return committed_recently(server, id) ? KEEL_OK : KEEL_ENOTFOUND;
}

/* Whether some part of update id prepared here was asked about by a decider. Caller holds
 * prepared_lock. */
static bool update_asked(const keel_ec_server *server, uint64_t id) {
  for (const prepared_update *item = server->prepared; item != NULL; item = item->next)
    if (item->id == id && item->asked) return true;
  return false;
}

/* Commits (folds) or aborts (drops) the prepared parts of update id. An origin's own commit
 * (not a verdict) of an update that a decider already asked about is refused: the origin's
 * commit may reach this holder after the origin died, in its socket, while a decider that found
 * the update prepared everywhere aborts it (finding 58: the two holders' parities disagreed). */
static keel_status update_finish(keel_ec_server *server, uint64_t id, bool commit, bool verdict) {
  pthread_mutex_lock(&server->prepared_lock);
  if (!verdict && update_asked(server, id)) {
    pthread_mutex_unlock(&server->prepared_lock);
    KEEL_LOG_I(MODULE, "server %d: the commit of update %llx came after a decider asked: refused",
               server->index, (unsigned long long)id);
    return KEEL_ECANCELED;
  }
  prepared_update *taken = prepared_take(server, id);
  if (taken != NULL && commit) {
    server->committed[server->committed_next] = id;
    server->committed_next = (server->committed_next + 1) % COMMITTED_MEMORY;
  }
  pthread_mutex_unlock(&server->prepared_lock);
  keel_status status = taken != NULL ? KEEL_OK : KEEL_ENOTFOUND;
  while (taken != NULL) {
    prepared_update *item = taken;
    taken = item->next;
    if (commit && status == KEEL_OK)
      status = fold_here(server, item->refs, item->deltas, item->count, update_stamp(server, id));
    prepared_free(item);
  }
  if (commit && status == KEEL_OK) step_mark_note(server, id);
  return status;
}

static keel_status parity_commit(keel_ec_server *server, const keel__ec_request *request) {
  if (request->flags & KEEL__EC_FLAG_QUERY) {
    pthread_mutex_lock(&server->prepared_lock);
    keel_status state = update_state(server, request->id, true);
    pthread_mutex_unlock(&server->prepared_lock);
    return state;
  }
  return update_finish(server, request->id, (request->flags & KEEL__EC_FLAG_ABORT) == 0,
                       (request->flags & KEEL__EC_FLAG_VERDICT) != 0);
}

/* Decides one update whose origin no longer serves, the same way wherever it is decided:
 * commit when some server committed it (the origin had prepared everyone and begun its
 * commits, the first alone), abort otherwise; then tells those that have it prepared. Every
 * other server is asked, not only the holders of the groups in this one's part: a decider
 * knows only its own part, and a rule over the holders it knew ("every holder prepared it")
 * committed at some holders and aborted at others when the origin died amid its prepares,
 * or when a replacement that never saw the update answered for a holder (finding 52). An
 * update that is aborted was answered to no worker, which push its rows again in phase 2. */
static keel_status resolve_update(keel_ec_server *server, const prepared_update *item) {
  keel_status *states = calloc((size_t)server->servers, sizeof *states);
  if (states == NULL) return KEEL_ENOMEM;
  uint64_t id = item->id;
  bool any_committed = false;
  for (int other = 0; other < server->servers; other++) {
    states[other] = KEEL_ENOTFOUND;
    if (other == server->index || other == update_origin(id)) continue;
    keel__ec_request query = {
        .op = KEEL__EC_OP_PARITY_COMMIT, .flags = KEEL__EC_FLAG_QUERY, .id = id};
    states[other] = keel__ec_server_call(server, other, &query, NULL);
    any_committed |= states[other] == KEEL_OK;
  }
  KEEL_LOG_I(MODULE, "server %d: update %llx of lost server %d %s", server->index,
             (unsigned long long)id, update_origin(id), any_committed ? "committed" : "aborted");
  keel_status status = update_finish(server, id, any_committed, true);
  if (status == KEEL_ENOTFOUND) status = KEEL_OK; /* another thread decided it meanwhile */
  uint16_t verdict = KEEL__EC_FLAG_VERDICT | (any_committed ? 0 : KEEL__EC_FLAG_ABORT);
  for (int other = 0; other < server->servers && status == KEEL_OK; other++)
    if (states[other] == KEEL_EAGAIN) status = send_commit(server, other, id, verdict);
  free(states);
  return status;
}

/* Whether the server that began an update still serves in the update's step: live, or back
 * from that step or an earlier one. A replacement (rebuilding, rebuilt, back from a later
 * step) is another process: what its predecessor left prepared is decided as a lost
 * server's. A server replaced before anyone declared it lost was never lost in any view,
 * and its updates stayed prepared at some holders and committed at others for good: the
 * parities disagreed, and with r = 2 a decoding from both gave wrong rows (finding 50). */
static bool origin_serves(const keel_ec_server *server, const uint64_t *standings, uint64_t id) {
  uint64_t standing = standings[update_origin(id)];
  uint64_t stamp = update_stamp(server, id);
  if (stamp == 0) return standing == KEEL__EC_LIVE; /* asynchronous: no step to judge by */
  return !keel__ec_lost_at(standing, stamp - 1);
}

/* The first update prepared here whose origin does not serve by standings (NULL when none).
 * Caller holds prepared_lock. */
static prepared_update *update_of_lost_origin(keel_ec_server *server, const uint64_t *standings) {
  prepared_update *item = server->prepared;
  while (item != NULL && origin_serves(server, standings, item->id)) item = item->next;
  return item;
}

static bool any_update_of_lost_origin(keel_ec_server *server, const uint64_t *standings) {
  pthread_mutex_lock(&server->prepared_lock);
  bool any = update_of_lost_origin(server, standings) != NULL;
  pthread_mutex_unlock(&server->prepared_lock);
  return any;
}

/* Decides the first update prepared here whose origin does not serve by standings; *none_p
 * when there is none. */
static keel_status resolve_first_lost(keel_ec_server *server, const uint64_t *standings,
                                      bool *none_p) {
  pthread_mutex_lock(&server->prepared_lock);
  prepared_update *item = update_of_lost_origin(server, standings);
  *none_p = item == NULL;
  if (item == NULL) {
    pthread_mutex_unlock(&server->prepared_lock);
    return KEEL_OK;
  }
  /* Its own parts first: the origin's commit, late in this holder's socket, must not fold
   * them while the others are asked (update_finish). */
  (void)update_state(server, item->id, true);
  /* Borrow its refs: a copy, since the list may change while the others are asked. */
  prepared_update copy = *item;
  copy.refs = malloc(sizeof *copy.refs * (item->count > 0 ? item->count : 1));
  if (copy.refs != NULL) memcpy(copy.refs, item->refs, sizeof *copy.refs * item->count);
  pthread_mutex_unlock(&server->prepared_lock);
  if (copy.refs == NULL) return KEEL_ENOMEM;
  keel_status status = resolve_update(server, &copy);
  free(copy.refs);
  return status;
}

/* Decides every update prepared here whose origin no longer serves: before any decoding, so
 * that the parity read is all in or all out. The view may be older than the directory: one
 * made before a replacement came back (rebuilt, or back from a later step) takes it for lost
 * while it serves, and deciding the update it was committing made a holder refuse its commit
 * (finding 58's rule) and its step fail (the twelfth soak, finding 61). So an origin is
 * decided only when the directory, read anew, says it does not serve. */
static keel_status resolve_lost_updates(keel_ec_server *server, const keel__ec_view *view) {
  if (!any_update_of_lost_origin(server, view->standing)) return KEEL_OK;
  keel__ec_server_refresh(server);
  keel__ec_view fresh;
  keel_status status = keel__ec_view_make(server, &fresh);
  if (status == KEEL_OK) keel__ec_view_at(server, 0, &fresh);
  bool none = false;
  while (status == KEEL_OK && !none) status = resolve_first_lost(server, fresh.standing, &none);
  keel__ec_view_free(&fresh);
  return status;
}

/* ---- the dense block */

int keel__ec_dense_replica(const keel_ec_server *server) {
  bool replicated = (server->wire.options & KEEL__EC_OPTION_DENSE_REPLICATED) != 0;
  if (!replicated || server->servers < 2 || !server->shard.holds_dense) return -1;
  return server->index == 0 ? 1 : 0;
}

static uint64_t standing_of(keel_ec_server *server, int index) {
  pthread_mutex_lock(&server->lost_lock);
  uint64_t standing = server->standing[index];
  pthread_mutex_unlock(&server->lost_lock);
  return standing;
}

/* The other holder when it gets this server's dense block after step's update: a
 * replacement not yet serving at step (rebuilding, rebuilt, or back from a later step; the
 * workers send it their pushes themselves from then on). A standing on its way back is read
 * anew, so that the copies stop once it serves; -1 when none gets it. */
static int dense_replica_behind(keel_ec_server *server, uint64_t step) {
  int replica = keel__ec_dense_replica(server);
  if (replica < 0) return -1;
  uint64_t standing = standing_of(server, replica);
  if (standing != KEEL__EC_LIVE && keel__ec_complete(standing)) { /* on its way back */
    keel__ec_server_refresh(server);
    standing = standing_of(server, replica);
  }
  return standing != KEEL__EC_LOST && keel__ec_lost_at(standing, step) ? replica : -1;
}

/* One update of the dense block. In a synchronous job the block is stamped with the step,
 * a step whose copy came from the other holder first is in already, and a replacement of
 * the other holder gets the block as it is after the step (under the updates lock, as row
 * changes are: its rebuild's barrier waits for the updates begun before). */
static keel_status dense_update(keel_ec_server *server, const float *gradients, uint64_t step,
                                bool synchronous) {
  keel__ec_shard *shard = &server->shard;
  pthread_rwlock_rdlock(&server->updates_lock);
  int replica = synchronous ? dense_replica_behind(server, step) : -1;
  uint8_t *copy = replica >= 0 ? malloc(shard->dense_block_bytes) : NULL;
  keel_status status = replica >= 0 && copy == NULL ? KEEL_ENOMEM : KEEL_OK;
  pthread_mutex_lock(&shard->dense_lock);
  bool in_already = synchronous && shard->dense_stamp > step;
  if (status == KEEL_OK && !in_already)
    status = keel_ec_row_apply(&shard->optimizer, (int)shard->dense_count, shard->dense, gradients,
                               NULL);
  if (status == KEEL_OK && synchronous && !in_already) shard->dense_stamp = step + 1;
  if (copy != NULL) memcpy(copy, shard->dense, shard->dense_block_bytes);
  pthread_mutex_unlock(&shard->dense_lock);
  if (status == KEEL_OK && copy != NULL) {
    keel__ec_request request = {.op = KEEL__EC_OP_WRITE_DENSE_BLOCK, .step = step, .blocks = copy};
    status = keel__ec_server_call(server, replica, &request, NULL);
    if (keel__ec_unreachable(status)) status = KEEL_OK; /* declared lost: it needs no copy */
  }
  pthread_rwlock_unlock(&server->updates_lock);
  free(copy);
  return status;
}

static keel_status dense_serve(keel_ec_server *server, const keel__ec_request *request,
                               uint8_t *body) {
  keel__ec_shard *shard = &server->shard;
  if (!shard->holds_dense) return KEEL_EAGAIN;
  /* A replacement serves no block before it is complete. */
  bool read = request->op == KEEL__EC_OP_PULL_DENSE || request->op == KEEL__EC_OP_READ_DENSE_BLOCK;
  if (read && keel__ec_rebuild_running(server)) return KEEL_EAGAIN;
  keel_status status = KEEL_OK;
  pthread_mutex_lock(&shard->dense_lock);
  switch (request->op) {
    case KEEL__EC_OP_INIT_DENSE:
      if (!shard->dense_set)
        status = keel_ec_row_init(&shard->optimizer, (int)shard->dense_count, request->values,
                                  shard->dense);
      shard->dense_set = true;
      break;
    case KEEL__EC_OP_PULL_DENSE:
      memcpy(body, shard->dense + request->offset * sizeof(float),
             (size_t)request->count * sizeof(float));
      break;
    case KEEL__EC_OP_READ_DENSE_BLOCK:
      memcpy(body, shard->dense, shard->dense_block_bytes);
      if (request->flags & KEEL__EC_FLAG_VERSIONED)
        keel_put_le64(body + shard->dense_block_bytes, shard->dense_stamp);
      break;
    case KEEL__EC_OP_WRITE_DENSE_BLOCK:
      keel__ec_shard_dense_install(shard, request->blocks, request->step + 1);
      break;
    default:
      status = KEEL_EINVAL;
  }
  pthread_mutex_unlock(&shard->dense_lock);
  return status;
}

/* ---- synchronous steps: every worker's push, then one application in worker order */

/* The union of the workers' rows (each list strictly increasing), every row's gradient the
 * sum of the workers' in worker order. */
static keel_status merge_rows(const step_slot *slot, int workers, int dim, uint64_t **rows_p,
                              float **gradients_p, size_t *count_p) {
  size_t total = 0;
  for (int w = 0; w < workers; w++) total += slot->pushes[w].request.count;
  uint64_t *rows = malloc(sizeof *rows * (total > 0 ? total : 1));
  float *gradients = malloc(sizeof *gradients * (total > 0 ? total : 1) * (size_t)dim);
  size_t *cursor = calloc((size_t)workers, sizeof *cursor);
  if (rows == NULL || gradients == NULL || cursor == NULL) {
    free(rows), free(gradients), free(cursor);
    return KEEL_ENOMEM;
  }
  size_t count = 0;
  for (;;) {
    uint64_t next = UINT64_MAX;
    bool any = false;
    for (int w = 0; w < workers; w++) {
      const keel__ec_request *push = &slot->pushes[w].request;
      if (cursor[w] < push->count && (!any || push->rows[cursor[w]] < next))
        next = push->rows[cursor[w]], any = true;
    }
    if (!any) break;
    float *sum = gradients + count * (size_t)dim;
    bool first = true;
    for (int w = 0; w < workers; w++) {
      const keel__ec_request *push = &slot->pushes[w].request;
      if (cursor[w] >= push->count || push->rows[cursor[w]] != next) continue;
      const float *gradient = push->values + cursor[w] * (size_t)dim;
      for (int j = 0; j < dim; j++) sum[j] = first ? gradient[j] : sum[j] + gradient[j];
      first = false;
      cursor[w]++;
    }
    rows[count++] = next;
  }
  free(cursor);
  *rows_p = rows;
  *gradients_p = gradients;
  *count_p = count;
  return KEEL_OK;
}

static keel_status merge_dense(const step_slot *slot, int workers, size_t count,
                               float **gradients_p) {
  float *sum = malloc(sizeof *sum * (count > 0 ? count : 1));
  if (sum == NULL) return KEEL_ENOMEM;
  for (int w = 0; w < workers; w++) {
    const float *gradient = slot->pushes[w].request.values;
    for (size_t j = 0; j < count; j++) sum[j] = w == 0 ? gradient[j] : sum[j] + gradient[j];
  }
  *gradients_p = sum;
  return KEEL_OK;
}

static keel_status step_apply(keel_ec_server *server, const step_slot *slot) {
  int workers = (int)server->wire.workers;
  float *gradients = NULL;
  keel_status status;
  if (slot->op == KEEL__EC_OP_PUSH_DENSE) {
    status = merge_dense(slot, workers, server->shard.dense_count, &gradients);
    if (status == KEEL_OK) status = dense_update(server, gradients, slot->step, true);
  } else {
    uint64_t *rows = NULL;
    size_t count = 0;
    status = merge_rows(slot, workers, server->shard.dim, &rows, &gradients, &count);
    if (status == KEEL_OK)
      status = apply_rows(server, rows, count, gradients, slot->acting, slot->step, true);
    free(rows);
  }
  free(gradients);
  return status;
}

static step_slot *step_lookup(keel_ec_server *server, uint16_t op, bool acting, uint64_t step) {
  for (step_slot *slot = server->steps; slot != NULL; slot = slot->next)
    if (slot->op == op && slot->acting == acting && slot->step == step) return slot;
  return NULL;
}

static step_slot *step_find(keel_ec_server *server, uint16_t op, bool acting, uint64_t step) {
  step_slot *slot = step_lookup(server, op, acting, step);
  if (slot != NULL) return slot;
  slot = calloc(1, sizeof *slot);
  if (slot == NULL) return NULL;
  slot->pushes = calloc(server->wire.workers, sizeof *slot->pushes);
  if (slot->pushes == NULL) {
    free(slot);
    return NULL;
  }
  *slot = (step_slot){
      .next = server->steps, .op = op, .acting = acting, .step = step, .pushes = slot->pushes};
  server->steps = slot;
  return slot;
}

static void step_free(keel_ec_server *server, step_slot *slot) {
  for (step_slot **at = &server->steps; *at != NULL; at = &(*at)->next) {
    if (*at == slot) {
      *at = slot->next;
      break;
    }
  }
  for (uint32_t w = 0; w < server->wire.workers; w++) free(slot->pushes[w].payload);
  free(slot->pushes);
  free(slot);
  /* A second round of the step may wait for this one to end (round_wait). */
  pthread_cond_broadcast(&server->step_done);
}

/* Sleeps on step_done for at most 100 ms; the caller holds step_lock. */
static void step_wait(keel_ec_server *server) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_nsec += 100 * 1000 * 1000;
  if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
  pthread_cond_timedwait(&server->step_done, &server->step_lock, &until);
}

/* A worker's second round of a step's phase 2 (a server was lost in the first, see the
 * client's phase_again) can come before every worker has left the first round here: it waits
 * for that round to end, by deadline, rather than be refused as a push made twice. Caller holds
 * step_lock. */
static void round_wait(keel_ec_server *server, const keel__ec_request *request, bool acting,
                       int64_t deadline) {
  for (;;) {
    step_slot *slot = step_lookup(server, request->op, acting, request->step);
    if (slot == NULL || !slot->applied || slot->pushes[request->worker].payload == NULL ||
        atomic_load(&server->stopping) || keel_now_ns() >= deadline)
      return;
    step_wait(server);
  }
}

/* Whether every other server has applied its own rows of step (marked_steps): then a
 * phase-2 push of the step carries only rows that are in. A worker sends one when it lost a
 * server in the first phase, also when that server had applied the step and answered the
 * other workers, which then send none (finding 19). Caller holds step_lock. */
static bool step_marked_by_all(const keel_ec_server *server, uint64_t step) {
  for (int i = 0; i < server->servers; i++)
    if (i != server->index && server->marked_steps[i] <= step) return false;
  return true;
}

/* Whether a second round of a step's phase 2 is void: each server whose loss sent it (the
 * push names them) had applied the first round. A server lost in phase 2 may have applied it
 * and answered some workers before it died: those go on, and only the others push a second
 * round, which would wait here for the rest until the deadline (a chaos run at r = 2, finding
 * 47). Its mark came before any of its answers, so where it has come the rows it acted for
 * are in; where it has not, it answered nobody, and every worker pushes the round again.
 * Only the servers the round lost count: one lost in phase 1 after it marked its own rows
 * never had a second phase to mark, and counting it kept every round waiting (finding 48).
 * Caller holds step_lock. */
static bool redo_void(const keel_ec_server *server, const keel__ec_request *request) {
  if (!(request->flags & KEEL__EC_FLAG_AGAIN) ||
      server->acting_applied[request->worker] <= request->step)
    return false;
  for (uint32_t i = 0; i < server->limits.parity_blocks; i++) {
    uint32_t lost = request->again_lost[i];
    if (lost == KEEL__EC_NO_SERVER) break;
    if (lost == (uint32_t)server->index) continue; /* applied: acting_applied says so */
    if (lost >= (uint32_t)server->servers || server->marked_acting[lost] <= request->step)
      return false;
  }
  return true;
}

/* Whether a phase-2 push is void, and why (*round and *applied, for the log): every other
 * server marked its step, or it is a second round that the marks make void. Caller holds
 * step_lock. */
static bool push_void(const keel_ec_server *server, const keel__ec_request *request,
                      const char **round, const char **applied) {
  *round = "second phase", *applied = "the step";
  if (step_marked_by_all(server, request->step)) return true;
  *round = "second round", *applied = "its second phase";
  return redo_void(server, request);
}

/* Whether a phase-2 slot still waiting for pushes is void now: each push it holds is. A mark
 * can come after a push it makes void: a server that died while it marked the others left
 * its mark in flight, one worker's second round came before the mark and joined a slot, the
 * other's after and was answered at once, and the first waited for the second until the
 * deadline (a chaos run, RELIABILITY.md finding 59). Caller holds step_lock. */
static bool slot_void(const keel_ec_server *server, const step_slot *slot, const char **round,
                      const char **applied) {
  if (!slot->acting || slot->applying) return false;
  bool any = false;
  for (uint32_t worker = 0; worker < server->wire.workers; worker++) {
    const step_push *push = &slot->pushes[worker];
    if (push->payload == NULL) continue;
    if (!push_void(server, &push->request, round, applied)) return false;
    any = true;
  }
  return any;
}

/* The workers whose pushes an applied phase-2 slot held: a push of its step again from one of
 * them is a second round. Caller holds step_lock. */
static void acting_applied_note(keel_ec_server *server, const step_slot *slot) {
  if (!slot->acting) return;
  for (uint32_t worker = 0; worker < server->wire.workers; worker++)
    if (slot->pushes[worker].payload != NULL && server->acting_applied[worker] < slot->step + 1)
      server->acting_applied[worker] = slot->step + 1;
}

/* Whether the workers routed their pushes of a phase-2 slot around the same lost servers. A
 * worker that lost a server in phase 1 routes its phase 2 without it, and one that had the
 * server's answer before it died, with it: their gradients of the rows that server was to act
 * for would reach two holders, each in a round of its own, and the second round wait for a
 * worker that never sends it (the seventh soak, RELIABILITY.md finding 53). Such a round is
 * refused whole: every worker pushes it again, routed by the directory. Caller holds
 * step_lock. */
static bool routes_agree(const keel_ec_server *server, const step_slot *slot) {
  if (!slot->acting) return true;
  for (uint32_t worker = 1; worker < server->wire.workers; worker++)
    if (slot->pushes[worker].request.routed != slot->pushes[0].request.routed) return false;
  return true;
}

/* Joins this push to its step; the worker whose push completes the step applies it, the
 * others wait for that (bounded). A phase-2 push of a step that every other server marked
 * is answered at once, and so are those waiting for it. The slot takes the payload. */
static keel_status step_join(keel_ec_server *server, const keel__ec_request *request, void *payload,
                             bool acting) {
  if (request->workers != server->wire.workers) {
    free(payload);
    return KEEL_EINVAL;
  }
  pthread_mutex_lock(&server->step_lock);
  const char *round = NULL, *applied = NULL; /* when the push is void */
  if (acting && push_void(server, request, &round, &applied)) {
    pthread_mutex_unlock(&server->step_lock);
    KEEL_LOG_I(MODULE, "server %d: worker %u's %s of step %llu is void: every server applied %s",
               server->index, request->worker, round, (unsigned long long)request->step, applied);
    free(payload);
    return KEEL_OK;
  }
  int64_t deadline = keel_deadline_after_ns(2 * KEEL__EC_CALL_TIMEOUT_NS);
  if (acting) round_wait(server, request, acting, deadline);
  step_slot *slot = step_find(server, request->op, acting, request->step);
  if (slot == NULL || slot->pushes[request->worker].payload != NULL || slot->applied) {
    pthread_mutex_unlock(&server->step_lock);
    free(payload);
    return slot == NULL ? KEEL_ENOMEM : KEEL_EEXIST;
  }
  slot->pushes[request->worker] = (step_push){.request = *request, .payload = payload};
  slot->arrived++;
  if (slot->arrived == (int)server->wire.workers) {
    slot->applying = true;
    bool agree = routes_agree(server, slot);
    pthread_mutex_unlock(&server->step_lock);
    if (!agree)
      KEEL_LOG_I(MODULE,
                 "server %d: the workers routed step %llu's second phase around different lost "
                 "servers: every one pushes it again",
                 server->index, (unsigned long long)slot->step);
    keel_status result = agree ? step_apply(server, slot) : KEEL_EPEERLOST;
    pthread_mutex_lock(&server->step_lock);
    slot->result = result;
    slot->applied = true;
    if (result == KEEL_OK) acting_applied_note(server, slot);
    pthread_cond_broadcast(&server->step_done);
  }
  while (!slot->applied && !atomic_load(&server->stopping) && keel_now_ns() < deadline) {
    if (slot_void(server, slot, &round, &applied)) {
      KEEL_LOG_I(MODULE, "server %d: the %s of step %llu is void: every server applied %s",
                 server->index, round, (unsigned long long)slot->step, applied);
      slot->result = KEEL_OK;
      slot->applied = true;
      pthread_cond_broadcast(&server->step_done);
      break;
    }
    step_wait(server);
  }
  keel_wait_ended(KEEL_WAIT_SERVER, deadline);
  keel_status result = slot->applied ? slot->result : KEEL_ETIMEDOUT;
  slot->left++;
  if (slot->applied && slot->left == slot->arrived) step_free(server, slot);
  pthread_mutex_unlock(&server->step_lock);
  return result;
}

/* ---- requests */

/* Whether this server is lost at step in its own view (read anew once when it is): a
 * replacement still rebuilt. It gets no push then, since the workers route around it, but a
 * worker whose link to the server it replaces broke mid-push sends it the push again. */
static bool lost_at(keel_ec_server *server, uint64_t step) {
  bool lost = true;
  for (int attempt = 0; attempt < 2 && lost; attempt++) {
    if (attempt == 1) keel__ec_server_refresh(server);
    pthread_mutex_lock(&server->lost_lock);
    lost = keel__ec_lost_at(server->standing[server->index], step);
    pthread_mutex_unlock(&server->lost_lock);
  }
  return lost;
}

static keel_status push(keel_ec_server *server, const keel__ec_request *request, void **payload) {
  bool acting = (request->flags & KEEL__EC_FLAG_ACTING) != 0;
  if (request->op == KEEL__EC_OP_PUSH_DENSE && !server->shard.holds_dense) return KEEL_EAGAIN;
  if (server->wire.workers > 0) {
    /* Refused at once, never kept: the step's other pushes go to the acting holders (the
     * other dense holder), and a push kept here would wait for them until the deadline (as a
     * chaos run found). */
    if (!atomic_load(&server->blocks_complete) || lost_at(server, request->step))
      return KEEL_EAGAIN;
    void *kept = *payload;
    *payload = NULL;
    return step_join(server, request, kept, acting);
  }
  if (request->op == KEEL__EC_OP_PUSH_DENSE)
    return dense_update(server, request->values, request->step, false);
  return apply_rows(server, request->rows, request->count, request->values, acting, request->step,
                    false);
}

static keel_status serve(keel_ec_server *server, const keel__ec_request *request, void **payload,
                         uint8_t *body) {
  switch (request->op) {
    case KEEL__EC_OP_INFO:
      return keel__ec_config_encode(&server->wire, body);
    case KEEL__EC_OP_PULL_ROWS:
      return pull_rows(server, request, (request->flags & KEEL__EC_FLAG_ACTING) != 0,
                       (float *)(void *)body);
    case KEEL__EC_OP_PUSH_ROWS:
    case KEEL__EC_OP_PUSH_DENSE:
      return push(server, request, payload);
    case KEEL__EC_OP_READ_BLOCKS:
      return read_blocks(server, request, body);
    case KEEL__EC_OP_PARITY_PREPARE:
      return parity_prepare(server, request);
    case KEEL__EC_OP_PARITY_COMMIT:
      return parity_commit(server, request);
    case KEEL__EC_OP_WRITE_BLOCKS:
      return KEEL_ENOTSUP; /* rebuilds: not yet */
    default:
      return dense_serve(server, request, body);
  }
}

/* With fault rules, the answers to a synchronous step's pushes go out one at a time, and a
 * point fires after each with its count in the step's phase: a rule with after=1 kills the
 * server once one worker has its answer and before the next one has (RELIABILITY.md,
 * findings 19 and 47). Without rules they go out as they come. */
static bool answer_counted(const keel_ec_server *server, const keel__ec_request *request,
                           keel_status status) {
  return server->faults != NULL && !server->replacement && server->wire.workers > 0 &&
         status == KEEL_OK && request->op == KEEL__EC_OP_PUSH_ROWS;
}

/* After one counted answer went out, its count in the step's phase: ec_answered for the
 * pushes of own rows, ec_answered_acting for the second phase's. The caller holds
 * answer_lock. */
static void answer_fault(keel_ec_server *server, const keel__ec_request *request) {
  bool acting = (request->flags & KEEL__EC_FLAG_ACTING) != 0;
  uint64_t update = update_id_make(server, request->step, acting, true);
  if (server->answered_update != update) {
    server->answered_update = update;
    server->answered_count = 0;
  }
  server->answered_count++;
  server_fault(server, acting ? "ec_answered_acting" : "ec_answered", update,
               server->answered_count);
}

/* Answers one request frame: decoded (a malformed one is refused with its status), served,
 * the reply sent. Only a link failure ends the connection. */
static keel_status answer(keel_ec_server *server, keel_link *link, const keel_frame *frame,
                          void **payload) {
  keel__ec_request request = {0};
  keel_status status =
      frame->type == KEEL_FRAME_EC_REQUEST
          ? keel__ec_request_decode(*payload, frame->length, &server->limits, &request)
          : KEEL_EPROTO;
  size_t body_bytes = status == KEEL_OK ? keel__ec_reply_body_bytes(&request, &server->limits) : 0;
  uint8_t *reply = malloc(KEEL__EC_REPLY_HEADER_BYTES + body_bytes);
  if (reply == NULL) return KEEL_ENOMEM;
  uint16_t op = status == KEEL_OK ? request.op : 0;
  if (status == KEEL_OK)
    status = serve(server, &request, payload, reply + KEEL__EC_REPLY_HEADER_BYTES);
  if (status != KEEL_OK) {
    if (op != 0 || frame->type == KEEL_FRAME_EC_REQUEST)
      KEEL_LOG_D(MODULE, "server %d: request of op %u refused: %s", server->index, op,
                 keel_strerror(status));
    body_bytes = 0;
  }
  keel__ec_reply_encode_header(op, status, body_bytes, reply);
  keel_frame out = {.type = KEEL_FRAME_EC_REPLY, .tag = frame->tag};
  bool counted = answer_counted(server, &request, status);
  if (counted) pthread_mutex_lock(&server->answer_lock);
  keel_status sent = keel_link_send(link, &out, reply, KEEL__EC_REPLY_HEADER_BYTES + body_bytes,
                                    keel_deadline_after_ns(KEEL__EC_CALL_TIMEOUT_NS));
  if (counted) {
    if (sent == KEEL_OK) answer_fault(server, &request);
    pthread_mutex_unlock(&server->answer_lock);
  }
  free(reply);
  return sent;
}

static void *connection_main(void *argument) {
  connection *self = argument;
  keel_ec_server *server = self->server;
  while (!atomic_load(&server->stopping)) {
    keel_frame frame;
    void *payload = NULL;
    keel_status status = keel_link_recv(self->link, &frame, &payload, KEEL_NO_DEADLINE);
    if (status != KEEL_OK) break;
    status = answer(server, self->link, &frame, &payload);
    free(payload);
    if (status != KEEL_OK) break;
  }
  pthread_mutex_lock(&server->connections_lock);
  self->finished = true;
  pthread_mutex_unlock(&server->connections_lock);
  return NULL;
}

/* Joins and frees finished connections (every one when all is set, after waking them). */
static void reap(keel_ec_server *server, bool all) {
  connection *done = NULL;
  pthread_mutex_lock(&server->connections_lock);
  for (connection **at = &server->connections; *at != NULL;) {
    connection *item = *at;
    if (all && !item->finished) shutdown(keel_link_fd(item->link), SHUT_RDWR);
    if (item->finished || all) {
      *at = item->next;
      item->next = done;
      done = item;
    } else {
      at = &item->next;
    }
  }
  pthread_mutex_unlock(&server->connections_lock);
  while (done != NULL) {
    connection *item = done;
    done = item->next;
    pthread_join(item->thread, NULL);
    keel_link_close(item->link);
    free(item);
  }
}

static void accept_one(keel_ec_server *server) {
  keel_link *link = NULL;
  keel_status status = keel_listener_accept(server->listener, &server->auth,
                                            keel_deadline_after_ns(HANDSHAKE_TIMEOUT_NS), &link);
  if (status != KEEL_OK) {
    KEEL_LOG_D(MODULE, "server %d: a connection was not accepted: %s", server->index,
               keel_strerror(status));
    return;
  }
  connection *item = calloc(1, sizeof *item);
  if (item == NULL) goto fail_close_link;
  item->server = server;
  item->link = link;
  if (pthread_create(&item->thread, NULL, connection_main, item) != 0) goto fail_free_item;
  pthread_mutex_lock(&server->connections_lock);
  item->next = server->connections;
  server->connections = item;
  pthread_mutex_unlock(&server->connections_lock);
  return;

fail_free_item:
  free(item);
fail_close_link:
  keel_link_close(link);
}

static void *acceptor_main(void *argument) {
  keel_ec_server *server = argument;
  while (!atomic_load(&server->stopping)) {
    struct pollfd watched = {.fd = keel_listener_fd(server->listener), .events = POLLIN};
    int ready = poll(&watched, 1, ACCEPT_POLL_MS);
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0) accept_one(server);
    reap(server, false);
  }
  return NULL;
}

/* ---- life */

static keel_status server_prepare(keel_ec_server *server, const keel_ec_config *config, int index) {
  keel_status status = keel__ec_config_from_public(config, &server->wire);
  if (status == KEEL_OK && (index < 0 || index >= config->servers))
    status = keel__ec_invalid("keel_ec_server_start: a server index out of range");
  if (status == KEEL_OK)
    status = keel__ec_config_limits(&server->wire, KEEL__EC_MAX_COUNT, &server->limits);
  if (status == KEEL_OK) status = keel__ec_shard_create(&server->wire, index, &server->shard);
  if (status != KEEL_OK) return status;
  status = keel_ec_decoder_create(server->shard.code, 0, &server->decoder);
  server->peers = calloc((size_t)config->servers, sizeof *server->peers);
  server->standing = calloc((size_t)config->servers, sizeof *server->standing);
  server->marked_steps = calloc((size_t)config->servers, sizeof *server->marked_steps);
  server->marked_acting = calloc((size_t)config->servers, sizeof *server->marked_acting);
  size_t workers = server->wire.workers > 0 ? server->wire.workers : 1;
  server->acting_applied = calloc(workers, sizeof *server->acting_applied);
  if (status == KEEL_OK &&
      (server->peers == NULL || server->standing == NULL || server->marked_steps == NULL ||
       server->marked_acting == NULL || server->acting_applied == NULL))
    status = KEEL_ENOMEM;
  for (int i = 0; status == KEEL_OK && i < config->servers; i++)
    keel__ec_peer_init(&server->peers[i], i);
  return status;
}

/* What a replacement cannot rebuild: an asynchronous job (no steps to stamp with) and the
 * only copy of the dense block. */
static keel_status replacement_check(const keel_ec_config *config, int index) {
  if (config->workers == 0)
    return keel__ec_invalid(
        "a replacement server needs a synchronous job (its rebuild "
        "orders changes by step)");
  if (config->dense_count > 0 && index == 0 && !config->replicate_dense) {
    KEEL_LOG_E(MODULE,
               "server 0 held the only copy of the dense block: no replacement can rebuild it "
               "(replicate it to make server 0 replaceable)");
    return KEEL_ENOTSUP;
  }
  return KEEL_OK;
}

/* A replacement takes the lost server's place: lost (if nobody said so yet) while its
 * address changes, then REBUILDING, which makes every server send it every change. */
static keel_status replacement_begin(keel_ec_server *server) {
  keel_status status =
      keel__ec_directory_set_standing(&server->directory, server->index, KEEL__EC_LOST);
  /* Its view from then on says so too, before anyone can find its address. */
  if (status == KEEL_OK) keel__ec_server_refresh(server);
  if (status == KEEL_OK)
    status = keel__ec_directory_publish(&server->directory, server->index,
                                        keel_listener_address(server->listener));
  if (status == KEEL_OK)
    status =
        keel__ec_directory_set_standing(&server->directory, server->index, KEEL__EC_REBUILDING);
  if (status == KEEL_OK) server_fault(server, REPLACEMENT_POINT, 0, 0);
  if (status == KEEL_OK) status = keel__ec_rebuild_start(server);
  return status;
}

static keel_status server_launch(const keel_ec_config *config, int index,
                                 const char *listen_address, keel_store *directory,
                                 const keel_auth *auth, bool replacement,
                                 keel_ec_server **server_p);

keel_status keel_ec_server_start(const keel_ec_config *config, int index,
                                 const char *listen_address, keel_store *directory,
                                 const keel_auth *auth, keel_ec_server **server_p) {
  return server_launch(config, index, listen_address, directory, auth, false, server_p);
}

keel_status keel_ec_server_replace(const keel_ec_config *config, int index,
                                   const char *listen_address, keel_store *directory,
                                   const keel_auth *auth, keel_ec_server **server_p) {
  if (config == NULL) return keel__ec_invalid("keel_ec_server_replace: NULL config");
  keel_status status = replacement_check(config, index);
  if (status != KEEL_OK) return status;
  return server_launch(config, index, listen_address, directory, auth, true, server_p);
}

static keel_status server_launch(const keel_ec_config *config, int index,
                                 const char *listen_address, keel_store *directory,
                                 const keel_auth *auth, bool replacement,
                                 keel_ec_server **server_p) {
  if (config == NULL || listen_address == NULL || directory == NULL || auth == NULL ||
      server_p == NULL)
    return keel__ec_invalid("keel_ec_server_start: NULL argument");
  keel_ec_server *server = calloc(1, sizeof *server);
  if (server == NULL) return KEEL_ENOMEM;
  server->index = index;
  server->servers = config->servers;
  server->rebuild_chunk_groups = config->rebuild_chunk_groups;
  server->rebuild_pause_ms = config->rebuild_pause_ms;
  server->auth = *auth;
  atomic_init(&server->stopping, false);
  atomic_init(&server->next_update, 1);
  atomic_init(&server->blocks_complete, !replacement);
  pthread_mutex_init(&server->decode_lock, NULL);
  pthread_mutex_init(&server->connections_lock, NULL);
  pthread_mutex_init(&server->lost_lock, NULL);
  pthread_mutex_init(&server->step_lock, NULL);
  pthread_mutex_init(&server->prepared_lock, NULL);
  pthread_rwlockattr_t writer_first;
  pthread_rwlockattr_init(&writer_first);
  /* A barrier must not wait behind a stream of updates. */
  pthread_rwlockattr_setkind_np(&writer_first, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&server->updates_lock, &writer_first);
  pthread_rwlockattr_destroy(&writer_first);
  pthread_mutex_init(&server->fault_lock, NULL);
  pthread_mutex_init(&server->answer_lock, NULL);
  pthread_condattr_t attributes;
  pthread_condattr_init(&attributes);
  pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
  pthread_cond_init(&server->step_done, &attributes);
  pthread_condattr_destroy(&attributes);
  keel__ec_directory_init(&server->directory, directory);
  server->replacement = replacement;
  keel_status status = server_prepare(server, config, index);
  /* Before it can take any request: a replacement serves no block and keeps every change
   * until its rebuild is complete. Made only when the rebuild started, a read that reached it
   * as soon as its address was out (sent again after the link to the server it replaces broke)
   * was served the blocks as the seed made them, and the holder decoded wrong rows from them
   * for a worker's pull (RELIABILITY.md, finding 63). */
  if (status == KEEL_OK && replacement) status = keel__ec_rebuild_prepare(server);
  const char *faults = getenv("KEEL_FAULT");
  if (status == KEEL_OK && faults != NULL && faults[0] != '\0')
    status = keel_fault_plan_create(faults, (uint32_t)index, &server->faults);
  if (status == KEEL_OK) status = keel_listener_open(listen_address, &server->listener);
  if (status == KEEL_OK) keel__ec_server_refresh(server);
  if (status == KEEL_OK && !replacement)
    status = keel__ec_directory_publish(&server->directory, index,
                                        keel_listener_address(server->listener));
  if (status == KEEL_OK && pthread_create(&server->acceptor, NULL, acceptor_main, server) != 0)
    status = KEEL_ENOMEM;
  /* Listening first: the others send it changes as soon as it is REBUILDING. */
  if (status == KEEL_OK && replacement) status = replacement_begin(server);
  if (status != KEEL_OK) {
    KEEL_LOG_E(MODULE, "server %d cannot start: %s", index, keel_strerror(status));
    keel_listener_close(server->listener);
    server->listener = NULL;
    keel_ec_server_stop(server);
    return status;
  }
  KEEL_LOG_I(MODULE, "server %d of %d listens on %s: %llu rows, %llu parity blocks", index,
             config->servers, keel_listener_address(server->listener),
             (unsigned long long)server->shard.data_rows,
             (unsigned long long)server->shard.parity_rows);
  *server_p = server;
  return KEEL_OK;
}

const char *keel_ec_server_address(const keel_ec_server *server) {
  return keel_listener_address(server->listener);
}

static keel_status write_all(int fd, const uint8_t *bytes, size_t length) {
  while (length > 0) {
    ssize_t written = write(fd, bytes, length);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return keel_status_from_errno(written < 0 ? errno : EIO);
    bytes += written;
    length -= (size_t)written;
  }
  return KEEL_OK;
}

/* The data rows, a group's worth of stripes at a time under their locks, then the dense
 * block. */
static keel_status checkpoint_write(keel_ec_server *server, int fd, uint64_t *bytes_p) {
  keel__ec_shard *shard = &server->shard;
  size_t piece = 4096;
  uint8_t *copy = malloc(piece * shard->block_bytes);
  if (copy == NULL) return KEEL_ENOMEM;
  keel_status status = KEEL_OK;
  for (uint64_t slot = 0; slot < shard->data_rows && status == KEEL_OK; slot += piece) {
    size_t count = shard->data_rows - slot < piece ? (size_t)(shard->data_rows - slot) : piece;
    for (size_t i = 0; i < count; i++) {
      keel_ec_location at;
      keel_ec_layout_locate_slot(&shard->layout, shard->index, KEEL_EC_DATA, slot + i, &at);
      pthread_mutex_t *lock = keel__ec_shard_lock(shard, at.group);
      pthread_mutex_lock(lock);
      memcpy(copy + i * shard->block_bytes, shard->data + (slot + i) * shard->block_bytes,
             shard->block_bytes);
      pthread_mutex_unlock(lock);
    }
    status = write_all(fd, copy, count * shard->block_bytes);
    *bytes_p += count * shard->block_bytes;
  }
  free(copy);
  if (status != KEEL_OK || !shard->holds_dense) return status;
  pthread_mutex_lock(&shard->dense_lock);
  status = write_all(fd, shard->dense, shard->dense_block_bytes);
  pthread_mutex_unlock(&shard->dense_lock);
  *bytes_p += shard->dense_block_bytes;
  return status;
}

keel_status keel_ec_server_checkpoint(keel_ec_server *server, const char *path, uint64_t *bytes_p) {
  if (server == NULL || path == NULL)
    return keel__ec_invalid("keel_ec_server_checkpoint: NULL argument");
  char temporary[PATH_MAX];
  if (snprintf(temporary, sizeof temporary, "%s.partial", path) >= (int)sizeof temporary)
    return keel__ec_invalid("keel_ec_server_checkpoint: path too long");
  int fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return keel_status_from_errno(errno);
  uint64_t bytes = 0;
  keel_status status = checkpoint_write(server, fd, &bytes);
  if (status == KEEL_OK && fsync(fd) != 0) status = keel_status_from_errno(errno);
  if (close(fd) != 0 && status == KEEL_OK) status = keel_status_from_errno(errno);
  if (status == KEEL_OK && rename(temporary, path) != 0) status = keel_status_from_errno(errno);
  if (status != KEEL_OK) {
    unlink(temporary);
    KEEL_LOG_E(MODULE, "server %d: checkpoint to %s failed: %s", server->index, path,
               keel_strerror(status));
    return status;
  }
  if (bytes_p != NULL) *bytes_p = bytes;
  return KEEL_OK;
}

void keel_ec_server_stop(keel_ec_server *server) {
  if (server == NULL) return;
  atomic_store(&server->stopping, true);
  keel__ec_rebuild_stop(server);
  if (server->listener != NULL) pthread_join(server->acceptor, NULL);
  reap(server, true);
  keel_listener_close(server->listener);
  while (server->steps != NULL) step_free(server, server->steps);
  while (server->prepared != NULL) {
    prepared_update *item = server->prepared;
    server->prepared = item->next;
    prepared_free(item);
  }
  keel_fault_plan_destroy(server->faults);
  pthread_mutex_destroy(&server->answer_lock);
  pthread_mutex_destroy(&server->fault_lock);
  pthread_mutex_destroy(&server->prepared_lock);
  pthread_rwlock_destroy(&server->updates_lock);
  if (server->peers != NULL)
    for (int i = 0; i < server->servers; i++) keel__ec_peer_destroy(&server->peers[i]);
  free(server->peers);
  free(server->standing);
  free(server->marked_steps);
  free(server->marked_acting);
  free(server->acting_applied);
  keel_ec_decoder_destroy(server->decoder);
  if (server->shard.code != NULL) keel__ec_shard_destroy(&server->shard);
  keel__ec_directory_destroy(&server->directory);
  pthread_cond_destroy(&server->step_done);
  pthread_mutex_destroy(&server->step_lock);
  pthread_mutex_destroy(&server->lost_lock);
  pthread_mutex_destroy(&server->connections_lock);
  pthread_mutex_destroy(&server->decode_lock);
  free(server);
}
