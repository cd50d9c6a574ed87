/* Fault-tolerant agreement through the job's store. Each survivor writes its contribution
 * under agree/<epoch>/<round>/<uid>; as soon as every member has either contributed or is
 * known failed (dead/, suspect/, or its proc/ lease gone), any survivor may compute the
 * decision and write it with a create-only compare-and-swap under decide/<epoch>/<round>.
 * Exactly one write wins and every survivor adopts it, so all return the same flags and the
 * same failed set even if members fail meanwhile. A member that neither contributes nor
 * fails before the deadline is suspected, which makes the launcher fence it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

#define MODULE "agree"

void keel__epoch_key(char *key, size_t capacity, const char *prefix, uint64_t epoch,
                     uint32_t round, const char *suffix) {
  snprintf(key, capacity, "%s/%08" PRIu64 "/%04" PRIu32 "%s", prefix, epoch, round,
           suffix ? suffix : "");
}

/* ---- the decision as text: "key=value" words, lists comma-separated. */

static keel_status format_list(keel_buffer *text, const char *name, const uint32_t *uids,
                               int count) {
  keel_status status = keel_buffer_appendf(text, " %s=", name);
  for (int i = 0; i < count && status == KEEL_OK; i++)
    status = keel_buffer_appendf(text, i ? ",%" PRIu32 : "%" PRIu32, uids[i]);
  return status;
}

keel_status keel__decision_format(const keel__decision *decision, keel_buffer *text) {
  keel_status status = keel_buffer_appendf(
      text, "epoch=%" PRIu64 " round=%" PRIu32 " rebuild=%d flags=%" PRIu32 " seq=%" PRIu64
            " sender=%" PRIu32 " grew=%d replaced=%d",
      decision->epoch, decision->round, decision->rebuild, decision->flags,
      decision->resilient_seq, decision->sender, decision->grew, decision->replaced_count);
  if (status == KEEL_OK) status = format_list(text, "members", decision->members, decision->member_count);
  if (status == KEEL_OK) status = format_list(text, "failed", decision->failed, decision->failed_count);
  if (status == KEEL_OK)
    status = format_list(text, "receivers", decision->receivers, decision->receiver_count);
  return status;
}

static bool parse_list(const char *value, uint32_t *uids, int capacity, int *count_p) {
  int count = 0;
  while (*value != '\0' && *value != ' ') {
    char *end;
    unsigned long uid = strtoul(value, &end, 10);
    if (end == value || uid >= KEEL__MAX_UIDS || count == capacity) return false;
    uids[count++] = (uint32_t)uid;
    value = *end == ',' ? end + 1 : end;
  }
  *count_p = count;
  return true;
}

/* The value of word `name=` in text, or NULL. */
static const char *find_word(const char *text, const char *name) {
  size_t length = strlen(name);
  for (const char *cursor = text; (cursor = strstr(cursor, name)) != NULL; cursor += length) {
    if ((cursor == text || cursor[-1] == ' ') && cursor[length] == '=') return cursor + length + 1;
  }
  return NULL;
}

static uint64_t word_number(const char *text, const char *name, uint64_t fallback) {
  const char *value = find_word(text, name);
  return value ? strtoull(value, NULL, 10) : fallback;
}

keel_status keel__decision_parse(const char *text, keel__decision *decision) {
  memset(decision, 0, sizeof *decision);
  const char *members = find_word(text, "members");
  const char *failed = find_word(text, "failed");
  const char *receivers = find_word(text, "receivers");
  if (members == NULL || failed == NULL || receivers == NULL) return KEEL_ECORRUPT;
  decision->epoch = word_number(text, "epoch", 0);
  decision->round = (uint32_t)word_number(text, "round", 0);
  decision->rebuild = word_number(text, "rebuild", 0) != 0;
  decision->flags = (uint32_t)word_number(text, "flags", 0);
  decision->resilient_seq = word_number(text, "seq", 0);
  decision->sender = (uint32_t)word_number(text, "sender", UINT32_MAX);
  decision->grew = word_number(text, "grew", 0) != 0;
  decision->replaced_count = (int)word_number(text, "replaced", 0);
  int capacity_members = (int)(sizeof decision->members / sizeof decision->members[0]);
  int capacity_failed = (int)(sizeof decision->failed / sizeof decision->failed[0]);
  int capacity_receivers = (int)(sizeof decision->receivers / sizeof decision->receivers[0]);
  if (!parse_list(members, decision->members, capacity_members, &decision->member_count) ||
      !parse_list(failed, decision->failed, capacity_failed, &decision->failed_count) ||
      !parse_list(receivers, decision->receivers, capacity_receivers, &decision->receiver_count))
    return KEEL_ECORRUPT;
  return KEEL_OK;
}

/* ---- what the store says about the members */

typedef struct view {
  keel_store_entry *entries;
  size_t count;
  uint64_t revision;
} view;

static const keel_store_entry *view_find(const view *store_view, const char *key) {
  for (size_t i = 0; i < store_view->count; i++) {
    if (strcmp(store_view->entries[i].key, key) == 0) return &store_view->entries[i];
  }
  return NULL;
}

static bool view_has(const view *store_view, const char *prefix, uint32_t uid) {
  char key[64];
  snprintf(key, sizeof key, "%s/%" PRIu32, prefix, uid);
  return view_find(store_view, key) != NULL;
}

static bool view_failed(const view *store_view, uint32_t uid) {
  return view_has(store_view, "dead", uid) || view_has(store_view, "suspect", uid) ||
         !view_has(store_view, "proc", uid);
}

static int view_node(const view *store_view, uint32_t uid) {
  static const char *const prefixes[] = {"proc", "dead", "suspect"};
  for (size_t i = 0; i < 3; i++) {
    char key[64];
    snprintf(key, sizeof key, "%s/%" PRIu32, prefixes[i], uid);
    const keel_store_entry *entry = view_find(store_view, key);
    const char *node = entry ? find_word((const char *)entry->value, "node") : NULL;
    if (node != NULL) return atoi(node);
  }
  return -1;
}

static const keel_store_entry *contribution_of(const view *store_view, const keel_comm *comm,
                                               uint32_t round, uint32_t uid) {
  char key[96], suffix[32];
  snprintf(suffix, sizeof suffix, "/%" PRIu32, uid);
  keel__epoch_key(key, sizeof key, "agree", comm->epoch, round, suffix);
  return view_find(store_view, key);
}

/* Spares and joiners that are alive, idle and not members already, lowest uid first. */
static int candidates(const view *store_view, const char *prefix, const keel_comm *comm,
                      const uint32_t *taken, int taken_count, uint32_t *out, int capacity) {
  int count = 0;
  size_t prefix_length = strlen(prefix);
  for (size_t i = 0; i < store_view->count && count < capacity; i++) {
    const char *key = store_view->entries[i].key;
    if (strncmp(key, prefix, prefix_length) != 0 || key[prefix_length] != '/') continue;
    uint32_t uid = (uint32_t)strtoul(key + prefix_length + 1, NULL, 10);
    bool unusable = view_failed(store_view, uid) || keel__comm_rank_of(comm, uid) >= 0;
    for (int t = 0; t < taken_count && !unusable; t++) unusable = taken[t] == uid;
    if (!unusable) out[count++] = uid;
  }
  /* Keys sort as text ("spare/10" before "spare/9"); order by number. */
  for (int a = 1; a < count; a++) {
    for (int b = a; b > 0 && out[b] < out[b - 1]; b--) {
      uint32_t swap = out[b];
      out[b] = out[b - 1];
      out[b - 1] = swap;
    }
  }
  return count;
}

typedef struct decide_input {
  keel_comm *comm;
  uint32_t round;
  bool waited_enough_for_spares;
} decide_input;

/* Returns true and fills decision when the view settles the round. */
static bool try_decide(const decide_input *input, const view *store_view,
                       keel__decision *decision) {
  keel_comm *comm = input->comm;
  keel_ctx *ctx = comm->ctx;
  bool failed[1024] = {false};
  int failed_nodes[256], failed_node_count = 0;
  for (int rank = 0; rank < comm->size; rank++) {
    uint32_t uid = comm->uids[rank];
    failed[rank] = view_failed(store_view, uid);
    if (!failed[rank] && contribution_of(store_view, comm, input->round, uid) == NULL)
      return false; /* alive and not heard from yet */
    if (failed[rank] && failed_node_count < 256) failed_nodes[failed_node_count++] = view_node(store_view, uid);
  }
  memset(decision, 0, sizeof *decision);
  decision->epoch = comm->epoch;
  decision->round = input->round;
  decision->flags = UINT32_MAX;
  decision->sender = UINT32_MAX;
  bool rebuild = false, force_shrink = false, grow = false, transfer = false;
  uint64_t best_seq = 0;
  for (int rank = 0; rank < comm->size; rank++) {
    uint32_t uid = comm->uids[rank];
    if (!failed[rank] && ctx->node_domain) {
      int node = view_node(store_view, uid);
      for (int f = 0; f < failed_node_count && node >= 0; f++) failed[rank] |= failed_nodes[f] == node;
    }
    if (failed[rank]) {
      if (decision->failed_count < 256) decision->failed[decision->failed_count++] = uid;
      continue;
    }
    const char *text = (const char *)contribution_of(store_view, comm, input->round, uid)->value;
    decision->flags &= (uint32_t)word_number(text, "flags", 0);
    rebuild |= word_number(text, "rebuild", 0) != 0;
    force_shrink |= word_number(text, "shrink", 0) != 0;
    grow |= word_number(text, "grow", 0) != 0;
    bool has_state = word_number(text, "state", 0) != 0;
    transfer |= has_state;
    uint64_t seq = word_number(text, "seq", 0);
    if (has_state && (decision->sender == UINT32_MAX || seq > best_seq)) {
      decision->sender = uid;
      best_seq = seq;
    }
  }
  decision->rebuild = rebuild;
  decision->resilient_seq = best_seq;
  if (!rebuild) {
    decision->sender = UINT32_MAX;
    for (int rank = 0; rank < comm->size; rank++)
      if (!failed[rank]) decision->members[decision->member_count++] = comm->uids[rank];
    return true;
  }

  uint32_t spares[64];
  bool replace = ctx->policy == KEEL__POLICY_REPLACE && !force_shrink;
  int spare_count = replace ? candidates(store_view, "spare", comm, NULL, 0, spares, 64) : 0;
  if (replace && spare_count < decision->failed_count && !input->waited_enough_for_spares)
    return false; /* the launcher is starting a replacement; give it time */
  int used = 0;
  for (int rank = 0; rank < comm->size; rank++) {
    if (!failed[rank]) decision->members[decision->member_count++] = comm->uids[rank];
    else if (used < spare_count) decision->members[decision->member_count++] = spares[used++];
  }
  decision->replaced_count = used;
  if (grow) {
    uint32_t joiners[64];
    int joiner_count = candidates(store_view, "join", comm, spares, used, joiners, 64);
    for (int j = 0; j < joiner_count && decision->member_count < ctx->max_world; j++) {
      decision->members[decision->member_count++] = joiners[j];
      decision->grew = true;
    }
  }
  if (!transfer) decision->sender = UINT32_MAX;
  /* Everyone in the new epoch who does not hold the newest state receives it. */
  for (int m = 0; m < decision->member_count && decision->sender != UINT32_MAX; m++) {
    uint32_t uid = decision->members[m];
    int old_rank = keel__comm_rank_of(comm, uid);
    bool current = false;
    if (old_rank >= 0) {
      const char *text = (const char *)contribution_of(store_view, comm, input->round, uid)->value;
      current = word_number(text, "state", 0) != 0 && word_number(text, "seq", 0) == best_seq;
    }
    if (!current && decision->receiver_count < 256) decision->receivers[decision->receiver_count++] = uid;
  }
  if (decision->receiver_count == 0) decision->sender = UINT32_MAX;
  return true;
}

static keel_status read_view(keel_ctx *ctx, view *store_view) {
  return keel_store_list(ctx->store, "", &store_view->entries, &store_view->count,
                         &store_view->revision);
}

static void view_free(view *store_view) {
  keel_store_entries_free(store_view->entries, store_view->count);
  store_view->entries = NULL;
  store_view->count = 0;
}

/* Members that are alive but silent past the deadline are suspected: the launcher then
 * fences them, which settles the round. */
static void suspect_silent(keel_comm *comm, const view *store_view, uint32_t round) {
  for (int rank = 0; rank < comm->size; rank++) {
    uint32_t uid = comm->uids[rank];
    if (view_failed(store_view, uid) || contribution_of(store_view, comm, round, uid) != NULL)
      continue;
    char key[64], value[64];
    snprintf(key, sizeof key, "suspect/%" PRIu32, uid);
    int length = snprintf(value, sizeof value, "by=%" PRIu32 " reason=agree-timeout", comm->ctx->uid);
    KEEL_LOG_W(MODULE, "uid %u did not join the agreement in time: suspecting it", uid);
    keel_store_put(comm->ctx->store, key, value, (size_t)length, 0, NULL);
  }
}

keel_status keel__agree(keel_comm *comm, const keel__contribution *mine, keel__decision *decision) {
  keel_ctx *ctx = comm->ctx;
  if (ctx->standalone) {
    memset(decision, 0, sizeof *decision);
    decision->epoch = comm->epoch;
    decision->flags = mine->flags;
    decision->rebuild = mine->rebuild;
    decision->members[0] = ctx->uid;
    decision->member_count = 1;
    decision->sender = UINT32_MAX;
    return KEEL_OK;
  }
  uint32_t round = comm->agree_round++;
  keel__fault_check(ctx, "agree", 0);
  char key[96], decide_key[96], suffix[32], value[160];
  snprintf(suffix, sizeof suffix, "/%" PRIu32, ctx->uid);
  keel__epoch_key(key, sizeof key, "agree", comm->epoch, round, suffix);
  keel__epoch_key(decide_key, sizeof decide_key, "decide", comm->epoch, round, NULL);
  int length = snprintf(value, sizeof value,
                        "flags=%" PRIu32 " state=%d seq=%" PRIu64 " grow=%d rebuild=%d shrink=%d node=%d",
                        mine->flags, mine->has_state, mine->resilient_seq, mine->grow,
                        mine->rebuild, mine->force_shrink, ctx->node);
  keel_status status = keel_store_put(ctx->store, key, value, (size_t)length, 0, NULL);
  if (status != KEEL_OK) return status;

  int64_t started = keel_now_ns();
  int64_t deadline = started + comm->timeout_ns;
  decide_input input = {.comm = comm, .round = round};
  for (;;) {
    keel_store_entry *entry = NULL;
    status = keel_store_get(ctx->store, decide_key, &entry);
    if (status == KEEL_OK) {
      status = keel__decision_parse((const char *)entry->value, decision);
      keel_store_entry_free(entry);
      return status;
    }
    if (status != KEEL_ENOTFOUND) return status;
    view store_view = {0};
    if ((status = read_view(ctx, &store_view)) != KEEL_OK) return status;
    input.waited_enough_for_spares = keel_now_ns() - started >= ctx->replace_wait_ns;
    if (try_decide(&input, &store_view, decision)) {
      keel_buffer text;
      keel_buffer_init(&text, KEEL_STORE_MAX_VALUE);
      status = keel__decision_format(decision, &text);
      if (status == KEEL_OK)
        status = keel_store_cas(ctx->store, decide_key, 0, text.data, text.length, 0, NULL);
      keel_buffer_free(&text);
      view_free(&store_view);
      if (status != KEEL_OK && status != KEEL_ECONFLICT) return status;
      continue; /* read back whichever decision won */
    }
    if (keel_now_ns() >= deadline) {
      suspect_silent(comm, &store_view, round);
      deadline = keel_now_ns() + comm->timeout_ns;
    }
    uint64_t revision = store_view.revision;
    view_free(&store_view);
    /* Keep links moving (revocations out, closed links noticed) while waiting. */
    keel__progress(ctx, 0);
    int64_t wake = keel_now_ns() + 20 * 1000000;
    keel_store_wait(ctx->store, "", revision, wake < deadline ? wake : deadline, NULL);
  }
}

/* A spare or joiner is admitted by the newest rebuild decision if that decision names it
 * and is newer than the world it has; an older decision that named it was overtaken by a
 * later failure and no longer counts. */
keel_status keel__wait_for_admission(keel_ctx *ctx, keel__decision *decision) {
  for (;;) {
    view store_view = {0};
    keel_status status = read_view(ctx, &store_view);
    if (status != KEEL_OK) return status;
    if (view_find(&store_view, "job/done") != NULL) {
      view_free(&store_view);
      return KEEL_EJOBDONE;
    }
    bool found = false;
    keel__decision newest = {0};
    for (size_t i = 0; i < store_view.count; i++) {
      if (strncmp(store_view.entries[i].key, "decide/", 7) != 0) continue;
      keel__decision candidate;
      if (keel__decision_parse((const char *)store_view.entries[i].value, &candidate) != KEEL_OK ||
          !candidate.rebuild)
        continue;
      if (!found || candidate.epoch > newest.epoch) newest = candidate;
      found = true;
    }
    uint64_t revision = store_view.revision;
    view_free(&store_view);
    bool newer = found && (ctx->world == NULL || newest.epoch + 1 > ctx->world->epoch);
    for (int m = 0; newer && m < newest.member_count; m++) {
      if (newest.members[m] != ctx->uid) continue;
      *decision = newest;
      return KEEL_OK;
    }
    keel_store_wait(ctx->store, "", revision, keel_deadline_after_ns(1000000000), NULL);
  }
}
