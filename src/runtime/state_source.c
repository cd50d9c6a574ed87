/* State sources: where a member that lacks the state gets it after a membership change.
 * Every member votes with a note of where it stands (what state it holds: version, shard;
 * which collective of its step failed). From the agreed decision every member computes the
 * same plan: the newest version, who lacks it, and for each such member a survivor that
 * holds its shard (the least loaded, so that several receivers spread over several senders),
 * or a checkpoint tier when no survivor holds it, or nothing to do (shrink of replicated
 * state). The plan also says whether the failed collective can simply be redone. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime_internal.h"

#define MODULE "state"
/* State travels in messages of at most this many bytes. */
#define STATE_MESSAGE_BYTES ((size_t)64 << 20)
/* Message tags of a state transfer: a marker, the buffer and the chunk. */
#define STATE_TAG(index, chunk) \
  ((UINT64_C(0x4b53) << 48) | ((uint64_t)(index) << 24) | (uint64_t)(chunk))
#define STATE_META_INDEX 0xffffu

struct keel__state_sources {
  const keel_state_source_ops *ops[KEEL_MAX_STATE_SOURCES];
  void *contexts[KEEL_MAX_STATE_SOURCES];
  int count;
};

keel_status keel__state_sources_create(keel__state_sources **sources_p) {
  keel__state_sources *sources = calloc(1, sizeof *sources);
  if (sources == NULL) return KEEL_ENOMEM;
  *sources_p = sources;
  return KEEL_OK;
}

void keel__state_sources_destroy(keel__state_sources *sources) { free(sources); }

keel_status keel__state_sources_add(keel__state_sources *sources, const keel_state_source_ops *ops,
                                    void *context) {
  if (ops == NULL || ops->restore == NULL) return KEEL_EINVAL;
  if (sources->count == KEEL_MAX_STATE_SOURCES) return KEEL_ERANGE;
  sources->ops[sources->count] = ops;
  sources->contexts[sources->count] = context;
  sources->count++;
  return KEEL_OK;
}

/* ---- notes: "h1:v17:s0/1:c0:rA:i1:t0:b0" (b: 1 + the fallback step, 0 for none) */

static const char redo_letters[] = {'0', 'S', 'A'};

void keel__position_note(const keel__position *position, char *note, size_t capacity) {
  snprintf(note, capacity,
           "h%d:v%" PRIu64 ":s%" PRIu32 "/%" PRIu32 ":c%" PRIu32 ":r%c:i%d:t%d:b%" PRIu64,
           position->has_state, position->version, position->shard, position->shards,
           position->collective, redo_letters[position->redo], position->in_step,
           position->tier_failed, position->has_fallback ? position->fallback + 1 : 0);
}

keel_status keel__position_parse(const char *note, keel__position *position) {
  memset(position, 0, sizeof *position);
  int has = 0, in_step = 0, tier_failed = 0, consumed = 0;
  unsigned long long version = 0, fallback = 0;
  unsigned shard = 0, shards = 0, collective = 0;
  char redo = '0';
  if (sscanf(note, "h%d:v%llu:s%u/%u:c%u:r%c:i%d:t%d%n", &has, &version, &shard, &shards,
             &collective, &redo, &in_step, &tier_failed, &consumed) != 8)
    return KEEL_ECORRUPT;
  /* The fallback field is optional: a note without it has none. */
  int tail = 0;
  if (note[consumed] == ':' && sscanf(note + consumed, ":b%llu%n", &fallback, &tail) == 1)
    consumed += tail;
  if (note[consumed] != '\0' || shards == 0 || shard >= shards || shards > KEEL_MAX_WORLD)
    return KEEL_ECORRUPT;
  const char *letter = memchr(redo_letters, redo, sizeof redo_letters);
  if (letter == NULL) return KEEL_ECORRUPT;
  position->has_state = has != 0;
  position->version = version;
  position->shard = shard;
  position->shards = shards;
  position->collective = collective;
  position->redo = (keel__redo_kind)(letter - redo_letters);
  position->in_step = in_step != 0;
  position->tier_failed = tier_failed != 0;
  position->has_fallback = fallback != 0;
  position->fallback = fallback != 0 ? (uint64_t)fallback - 1 : 0;
  return KEEL_OK;
}

/* ---- the plan */

/* What every member of the new epoch stands at, from the decision's notes. */
typedef struct member_view {
  keel__position position;
  bool voted;
  uint32_t need;   /* the shard its place in the new epoch needs */
  int sender;      /* member index it receives from; -1: none */
  bool from_tier;  /* receives from a checkpoint tier */
  int load;        /* receivers assigned to it */
} member_view;

typedef struct plan_work {
  const keel_decision *decision;
  member_view *members;
  uint32_t shards;
  uint64_t version;
  bool rolled_back;
} plan_work;

static keel_status views_read(plan_work *work) {
  const keel_decision *decision = work->decision;
  work->shards = 0;
  work->version = 0;
  bool any = false;
  for (int m = 0; m < decision->member_count; m++) {
    member_view *view = &work->members[m];
    *view = (member_view){.sender = -1};
    view->voted = decision->notes[m][0] != '\0';
    if (view->voted && keel__position_parse(decision->notes[m], &view->position) != KEEL_OK) {
      KEEL_LOG_E(MODULE, "uid %u voted with a malformed note '%s'", decision->members[m],
                 decision->notes[m]);
      return KEEL_EPROTO;
    }
    const keel__position *position = &view->position;
    if (!position->has_state) continue;
    if (work->shards != 0 && work->shards != position->shards) {
      KEEL_LOG_E(MODULE, "members hold state cut in %u and in %u shards (keel_state_shard "
                 "must be the same in every process)", work->shards, position->shards);
      return KEEL_EPROTO;
    }
    work->shards = position->shards;
    if (!any || position->version > work->version) work->version = position->version;
    any = true;
  }
  if (work->shards == 0) work->shards = 1;
  /* A lost shard no tier has at the newest step, but at an older one: everyone goes back. */
  for (int m = 0; m < decision->member_count; m++) {
    const keel__position *position = &work->members[m].position;
    if (!position->tier_failed || !position->has_fallback || position->fallback >= work->version)
      continue;
    work->version = position->fallback;
    work->rolled_back = true;
  }
  return KEEL_OK;
}

static bool holds(const plan_work *work, int m) {
  const keel__position *position = &work->members[m].position;
  return position->has_state && position->version == work->version &&
         position->shard == work->members[m].need;
}

/* A sender must keep its buffers whole while it sends: a member that itself needs another
 * shard than it holds is never one. */
static int sender_for(plan_work *work, uint32_t shard) {
  int best = -1;
  for (int m = 0; m < work->decision->member_count; m++) {
    const member_view *view = &work->members[m];
    if (!holds(work, m) || view->position.shard != shard) continue;
    if (best < 0 || view->load < work->members[best].load) best = m;
  }
  return best;
}

static bool forward_possible(const plan_work *work, int old_size) {
  const keel_decision *decision = work->decision;
  if (decision->joined_count > 0) return false;
  const keel__position *first = NULL;
  for (int m = 0; m < decision->member_count; m++) {
    const keel__position *position = &work->members[m].position;
    if (!work->members[m].voted || !position->in_step || position->redo == KEEL__REDO_NONE)
      return false;
    if (position->redo == KEEL__REDO_SAME_SIZE && decision->member_count != old_size) return false;
    if (first != NULL && (position->collective != first->collective ||
                          position->version != first->version))
      return false;
    first = position;
  }
  return true;
}

/* Fills the plan and, when views_p is not NULL, hands the member views to the caller. */
static keel_status plan_compute(const keel_decision *decision, int old_size,
                                keel__state_plan *plan, member_view **views_p) {
  memset(plan, 0, sizeof *plan);
  plan_work work = {.decision = decision};
  work.members = calloc((size_t)(decision->member_count > 0 ? decision->member_count : 1),
                        sizeof *work.members);
  if (work.members == NULL) return KEEL_ENOMEM;
  keel_status status = views_read(&work);
  for (int m = 0; status == KEEL_OK && m < decision->member_count; m++)
    work.members[m].need = (uint32_t)m % work.shards;
  for (int m = 0; status == KEEL_OK && m < decision->member_count; m++) {
    member_view *view = &work.members[m];
    if (holds(&work, m)) continue;
    plan->any_transfer = true;
    view->sender = sender_for(&work, view->need);
    if (view->sender >= 0) {
      work.members[view->sender].load++;
      continue;
    }
    view->from_tier = true;
    if (view->position.tier_failed && !view->position.has_fallback) {
      plan->unrecoverable = true;
      plan->lost_shard = view->need;
    }
  }
  plan->version = work.version;
  plan->shards = work.shards;
  plan->rolled_back = work.rolled_back;
  plan->forward = status == KEEL_OK && !plan->any_transfer && forward_possible(&work, old_size);
  if (status == KEEL_OK && views_p != NULL) {
    *views_p = work.members;
    return KEEL_OK;
  }
  free(work.members);
  return status;
}

keel_status keel__state_plan_make(const keel_decision *decision, int old_size,
                                  keel__state_plan *plan) {
  return plan_compute(decision, old_size, plan, NULL);
}

keel_status keel__state_plan_describe(const keel_decision *decision, char *text, size_t capacity) {
  member_view *views = NULL;
  keel__state_plan plan;
  keel_status status = plan_compute(decision, 0, &plan, &views);
  if (status != KEEL_OK) return status;
  size_t used = 0;
  int written = snprintf(text, capacity, "[");
  used = written > 0 ? (size_t)written : 0;
  bool first = true;
  for (int m = 0; m < decision->member_count && used < capacity; m++) {
    const member_view *view = &views[m];
    if (view->sender < 0 && !view->from_tier) continue;
    if (view->sender >= 0)
      written = snprintf(text + used, capacity - used,
                         "%s{\"to\":%" PRIu32 ",\"from\":%" PRIu32 ",\"shard\":%" PRIu32 "}",
                         first ? "" : ",", decision->members[m], decision->members[view->sender],
                         view->need);
    else
      written = snprintf(text + used, capacity - used,
                         "%s{\"to\":%" PRIu32 ",\"from\":\"tier\",\"shard\":%" PRIu32 "}",
                         first ? "" : ",", decision->members[m], view->need);
    first = false;
    used += written > 0 ? (size_t)written : 0;
  }
  if (used < capacity) snprintf(text + used, capacity - used, "]");
  free(views);
  return used + 2 <= capacity ? KEEL_OK : KEEL_ERANGE;
}

/* ---- moving the state */

typedef struct state_meta {
  uint64_t version;
  uint64_t count;
  uint64_t sizes[KEEL_MAX_STATE_BUFFERS];
} state_meta;

static size_t chunks_of(size_t bytes) {
  return bytes == 0 ? 1 : (bytes + STATE_MESSAGE_BYTES - 1) / STATE_MESSAGE_BYTES;
}

static size_t chunk_length(size_t bytes, size_t chunk) {
  size_t first = chunk * STATE_MESSAGE_BYTES;
  return bytes - first < STATE_MESSAGE_BYTES ? bytes - first : STATE_MESSAGE_BYTES;
}

/* The requests of one transfer, all waited for together (so several move at once). */
typedef struct request_set {
  keel_request **requests;
  size_t count, capacity;
} request_set;

static keel_status request_set_add(request_set *set, keel_request *request) {
  if (set->count == set->capacity) {
    size_t grown = set->capacity ? set->capacity * 2 : 16;
    keel_request **requests = realloc(set->requests, grown * sizeof *requests);
    if (requests == NULL) {
      keel_request_free(request);
      return KEEL_ENOMEM;
    }
    set->requests = requests;
    set->capacity = grown;
  }
  set->requests[set->count++] = request;
  return KEEL_OK;
}

static keel_status request_set_wait(request_set *set, int64_t deadline_ns) {
  keel_status status = KEEL_OK;
  for (size_t i = 0; i < set->count && status == KEEL_OK; i++)
    status = keel_request_wait(set->requests[i], deadline_ns);
  for (size_t i = 0; i < set->count; i++) keel_request_free(set->requests[i]);
  free(set->requests);
  *set = (request_set){0};
  return status;
}

static void meta_fill(const keel_registry *registry, uint64_t version, state_meta *meta) {
  memset(meta, 0, sizeof *meta);
  meta->version = version;
  meta->count = keel_registry_count(registry);
  for (size_t i = 0; i < meta->count; i++) meta->sizes[i] = keel_registry_entry(registry, i)->bytes;
}

/* Queues the meta and every chunk of the registered state to rank. */
static keel_status send_to(keel_ctx *ctx, keel_comm *comm, int rank, const state_meta *meta,
                           request_set *set, int64_t *sent_p) {
  keel_request *request = NULL;
  keel_status status = keel_comm_isend(comm, rank, STATE_TAG(STATE_META_INDEX, 0), meta,
                                       sizeof *meta, &request);
  if (status == KEEL_OK) status = request_set_add(set, request);
  for (size_t i = 0; status == KEEL_OK && i < keel_registry_count(ctx->registry); i++) {
    const keel_state_buffer *buffer = keel_registry_entry(ctx->registry, i);
    for (size_t chunk = 0; status == KEEL_OK && chunk < chunks_of(buffer->bytes); chunk++) {
      status = keel_comm_isend(comm, rank, STATE_TAG(i, chunk),
                               (const uint8_t *)buffer->data + chunk * STATE_MESSAGE_BYTES,
                               chunk_length(buffer->bytes, chunk), &request);
      if (status == KEEL_OK) status = request_set_add(set, request);
      keel_fault_plan_fire(ctx->faults, "state", ++*sent_p);
    }
  }
  return status;
}

static keel_status receive_from(keel_ctx *ctx, keel_comm *comm, int rank, state_meta *meta,
                                int64_t deadline_ns) {
  request_set set = {0};
  keel_request *request = NULL;
  keel_status status = keel_comm_irecv(comm, rank, STATE_TAG(STATE_META_INDEX, 0), meta,
                                       sizeof *meta, &request);
  if (status == KEEL_OK) status = request_set_add(&set, request);
  for (size_t i = 0; status == KEEL_OK && i < keel_registry_count(ctx->registry); i++) {
    const keel_state_buffer *buffer = keel_registry_entry(ctx->registry, i);
    for (size_t chunk = 0; status == KEEL_OK && chunk < chunks_of(buffer->bytes); chunk++) {
      status = keel_comm_irecv(comm, rank, STATE_TAG(i, chunk),
                               (uint8_t *)buffer->data + chunk * STATE_MESSAGE_BYTES,
                               chunk_length(buffer->bytes, chunk), &request);
      if (status == KEEL_OK) status = request_set_add(&set, request);
    }
  }
  keel_status waited = request_set_wait(&set, deadline_ns);
  if (status == KEEL_OK) status = waited;
  if (status == KEEL_EPROTO || (status == KEEL_OK && meta->count != keel_registry_count(ctx->registry))) {
    KEEL_LOG_E(MODULE, "the state sent by uid %u does not match the buffers registered here "
               "(register the same buffers, in the same order, in every process)",
               keel_comm_uid(comm, rank));
    return KEEL_EPROTO;
  }
  return status;
}

/* The newest step below version that some tier has of the shard. */
static bool tier_fallback(keel_ctx *ctx, uint32_t shard, uint32_t shards, uint64_t version,
                          uint64_t *fallback_p) {
  keel__state_sources *sources = ctx->sources;
  bool found = false;
  for (int i = 0; version > 0 && i < sources->count; i++) {
    uint64_t step = 0;
    if (sources->ops[i]->newest == NULL ||
        sources->ops[i]->newest(sources->contexts[i], shard, shards, version - 1, &step) != KEEL_OK)
      continue;
    if (!found || step > *fallback_p) *fallback_p = step;
    found = true;
  }
  return found;
}

static keel_status restore_from_tier(keel_ctx *ctx, uint32_t shard, uint32_t shards,
                                     uint64_t version) {
  keel__state_sources *sources = ctx->sources;
  for (int i = 0; i < sources->count; i++) {
    keel_status status =
        sources->ops[i]->restore(sources->contexts[i], ctx->registry, shard, shards, version);
    if (status == KEEL_OK) {
      KEEL_LOG_I(MODULE, "shard %u of step %" PRIu64 " restored from the %s tier", shard, version,
                 sources->ops[i]->name);
      return KEEL_OK;
    }
  }
  KEEL_LOG_W(MODULE, "no survivor holds shard %u of step %" PRIu64 " and no tier has it", shard,
             version);
  return KEEL_ENOTFOUND;
}

keel_status keel__state_transfer(keel_ctx *ctx, keel_comm *comm, const keel_decision *decision,
                                 const keel__state_plan *plan, keel__transfer_result *result) {
  *result = (keel__transfer_result){0};
  if (!plan->any_transfer) return KEEL_OK;
  member_view *views = NULL;
  keel__state_plan again;
  keel_status status = plan_compute(decision, 0, &again, &views);
  if (status != KEEL_OK) return status;
  int me = keel_comm_rank(comm);
  /* A bulk transfer is no step: under --collective-timeout auto it keeps the configured
   * deadline (30 s unless set), not one fitted to the steps. */
  int64_t timeout = ctx->config.timeout_auto ? ctx->config.timeout_ns : keel_comm_timeout(comm);
  int64_t deadline = keel_deadline_after_ns(timeout);
  state_meta *meta = malloc(sizeof *meta);
  if (meta == NULL) {
    free(views);
    return KEEL_ENOMEM;
  }
  member_view *mine = &views[me];
  result->receiver = mine->sender >= 0 || mine->from_tier;
  if (mine->sender >= 0) {
    status = receive_from(ctx, comm, mine->sender, meta, deadline);
    result->received = status == KEEL_OK;
  } else if (mine->from_tier) {
    status = restore_from_tier(ctx, mine->need, again.shards, again.version);
    result->received = status == KEEL_OK;
    result->tier_failed = status == KEEL_ENOTFOUND;
    if (result->tier_failed)
      result->has_fallback =
          tier_fallback(ctx, mine->need, again.shards, again.version, &result->fallback);
  } else {
    request_set set = {0};
    int64_t sent = 0;
    meta_fill(ctx->registry, plan->version, meta);
    for (int m = 0; status == KEEL_OK && m < decision->member_count; m++) {
      if (views[m].sender == me) status = send_to(ctx, comm, m, meta, &set, &sent);
    }
    keel_status waited = request_set_wait(&set, deadline);
    if (status == KEEL_OK) status = waited;
  }
  free(meta);
  free(views);
  return status;
}
