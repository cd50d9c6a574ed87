/* Fault-tolerant agreement through the job's store, and the membership changes built on it.
 * Each survivor writes its vote under agree/<epoch>/<round>/<uid>; as soon as every member
 * has voted or is dead by the failure detector, the first live member in rank order (any
 * survivor, after a grace) computes the decision (decide.c) and writes it with a create-only
 * compare-and-swap under decide/<epoch>/<round>. Exactly one write wins and every survivor
 * adopts it, so all return the same flags and the same failed set even if members fail
 * meanwhile. A member that stays silent past the deadline is suspected (the job fences it),
 * and after one more deadline the agreement gives up with KEEL_ETIMEDOUT. The winner later
 * removes the keys of older epochs, so the store does not grow with the job's age. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"

#define MODULE "agree"
/* Between two looks at the votes the agreement sleeps at most this long (a store wait wakes
 * it sooner on any change). */
#define LOOK_INTERVAL_NS (20 * (int64_t)1000000)
/* Only the first live member in rank order settles a round at once; the others wait this
 * long for its decision before they settle it too (the cas keeps one winner either way).
 * Every member writing the decision at once only queues them all at the store. */
#define DECIDER_GRACE_NS (20 * (int64_t)1000000)
/* The most that store outages may lengthen one agreement (see deadline_after_store_call): a store
 * that still does not answer after it is as good as gone, and silence counts again. */
#define STORE_OUTAGE_ALLOWANCE_NS (10 * (int64_t)1000000000)

void keel__epoch_key(char *key, size_t capacity, const char *prefix, uint64_t epoch, uint32_t round,
                     const char *suffix) {
  snprintf(key, capacity, "%s/%08" PRIu64 "/%04" PRIu32 "%s", prefix, epoch, round,
           suffix ? suffix : "");
}

/* ---- votes and decisions as text: "key=value" words; lists comma-separated. */

/* A note travels inside a word: printable, no space, no '|' (the decision's separator). */
static bool note_valid(const char *note) {
  size_t length = strnlen(note, KEEL_NOTE_MAX);
  if (length == KEEL_NOTE_MAX) return false;
  for (size_t i = 0; i < length; i++) {
    if (note[i] <= ' ' || note[i] > '~' || note[i] == '|') return false;
  }
  return true;
}

/* The value of word `name=` in text (its first character), or NULL. */
static const char *find_word(const char *text, const char *name) {
  size_t length = strlen(name);
  for (const char *cursor = text; (cursor = strstr(cursor, name)) != NULL; cursor += length) {
    if ((cursor == text || cursor[-1] == ' ') && cursor[length] == '=') return cursor + length + 1;
  }
  return NULL;
}

static bool word_number(const char *text, const char *name, uint64_t maximum, uint64_t *value_p) {
  const char *value = find_word(text, name);
  if (value == NULL || *value < '0' || *value > '9') return false;
  char *end;
  unsigned long long number = strtoull(value, &end, 10);
  if ((*end != ' ' && *end != '\0') || number > maximum) return false;
  *value_p = number;
  return true;
}

/* Copies the word's value (up to the next space or separator) into text. */
static bool word_text(const char *value, char separator, char *text, size_t capacity,
                      const char **end_p) {
  size_t length = 0;
  while (value[length] != '\0' && value[length] != ' ' && value[length] != separator) length++;
  if (length >= capacity) return false;
  memcpy(text, value, length);
  text[length] = '\0';
  if (end_p) *end_p = value + length;
  return true;
}

keel_status keel__vote_format(const keel_rebuild_vote *vote, uint64_t epoch, int node, char *text,
                              size_t capacity) {
  if (!note_valid(vote->note)) return KEEL_EINVAL;
  int length = snprintf(text, capacity,
                        "epoch=%" PRIu64 " node=%d flags=%" PRIu32
                        " rebuild=%d shrink=%d spares=%d joiners=%d note=%s",
                        epoch, node < 0 ? -1 : node, vote->flags, vote->rebuild, vote->shrink_only,
                        vote->admit_spares, vote->admit_joiners, vote->note);
  return length > 0 && (size_t)length < capacity ? KEEL_OK : KEEL_ERANGE;
}

keel_status keel__vote_parse(const char *text, keel_rebuild_vote *vote, uint64_t *epoch_p,
                             int *node_p) {
  memset(vote, 0, sizeof *vote);
  uint64_t epoch, flags, rebuild, shrink, spares, joiners;
  if (!word_number(text, "epoch", UINT64_MAX, &epoch) ||
      !word_number(text, "flags", UINT32_MAX, &flags) ||
      !word_number(text, "rebuild", 1, &rebuild) || !word_number(text, "shrink", 1, &shrink) ||
      !word_number(text, "spares", 1, &spares) || !word_number(text, "joiners", 1, &joiners))
    return KEEL_ECORRUPT;
  const char *node = find_word(text, "node");
  const char *note = find_word(text, "note");
  if (node == NULL || note == NULL || !word_text(note, ' ', vote->note, sizeof vote->note, NULL) ||
      !note_valid(vote->note))
    return KEEL_ECORRUPT;
  vote->flags = (uint32_t)flags;
  vote->rebuild = rebuild;
  vote->shrink_only = shrink;
  vote->admit_spares = spares;
  vote->admit_joiners = joiners;
  *epoch_p = epoch;
  *node_p = atoi(node);
  return KEEL_OK;
}

static keel_status format_list(keel_buffer *text, const char *name, const uint32_t *uids,
                               int count) {
  keel_status status = keel_buffer_appendf(text, " %s=", name);
  for (int i = 0; i < count && status == KEEL_OK; i++)
    status = keel_buffer_appendf(text, i ? ",%" PRIu32 : "%" PRIu32, uids[i]);
  return status;
}

keel_status keel__decision_format(const keel_decision *decision, keel_buffer *text) {
  keel_status status = keel_buffer_appendf(
      text,
      "epoch=%" PRIu64 " round=%" PRIu32 " rebuild=%d flags=%" PRIu32 " replaced=%d joined=%d",
      decision->epoch, decision->round, decision->rebuild, decision->flags,
      decision->replaced_count, decision->joined_count);
  if (status == KEEL_OK)
    status = format_list(text, "members", decision->members, decision->member_count);
  if (status == KEEL_OK)
    status = format_list(text, "failed", decision->failed, decision->failed_count);
  if (status == KEEL_OK) status = keel_buffer_appendf(text, " notes=");
  for (int i = 0; i < decision->member_count && status == KEEL_OK; i++) {
    if (!note_valid(decision->notes[i])) return KEEL_EINVAL;
    status = keel_buffer_appendf(text, "%s%s", i ? "|" : "", decision->notes[i]);
  }
  return status;
}

static bool parse_list(const char *value, uint32_t *uids, int capacity, int *count_p) {
  int count = 0;
  while (*value != '\0' && *value != ' ') {
    char *end;
    if (*value < '0' || *value > '9') return false;
    unsigned long uid = strtoul(value, &end, 10);
    if (uid >= KEEL_MAX_UIDS || count == capacity) return false;
    uids[count++] = (uint32_t)uid;
    if (*end == ',')
      end++;
    else if (*end != ' ' && *end != '\0')
      return false;
    value = end;
  }
  *count_p = count;
  return true;
}

static bool parse_notes(const char *value, keel_decision *decision) {
  for (int i = 0; i < decision->member_count; i++) {
    const char *end;
    if (!word_text(value, '|', decision->notes[i], KEEL_NOTE_MAX, &end) ||
        !note_valid(decision->notes[i]))
      return false;
    if (i + 1 < decision->member_count && *end != '|') return false;
    value = *end == '|' ? end + 1 : end;
  }
  return *value == '\0' || *value == ' ';
}

keel_status keel__decision_parse(const char *text, keel_decision *decision) {
  memset(decision, 0, sizeof *decision);
  uint64_t epoch, round, rebuild, flags, replaced, joined;
  const char *members = find_word(text, "members");
  const char *failed = find_word(text, "failed");
  const char *notes = find_word(text, "notes");
  if (members == NULL || failed == NULL || notes == NULL ||
      !word_number(text, "epoch", UINT64_MAX, &epoch) ||
      !word_number(text, "round", UINT32_MAX, &round) ||
      !word_number(text, "rebuild", 1, &rebuild) ||
      !word_number(text, "flags", UINT32_MAX, &flags) ||
      !word_number(text, "replaced", KEEL_MAX_WORLD, &replaced) ||
      !word_number(text, "joined", KEEL_MAX_WORLD, &joined))
    return KEEL_ECORRUPT;
  if (!parse_list(members, decision->members, KEEL_MAX_WORLD, &decision->member_count) ||
      !parse_list(failed, decision->failed, KEEL_MAX_WORLD, &decision->failed_count) ||
      !parse_notes(notes, decision))
    return KEEL_ECORRUPT;
  decision->epoch = epoch;
  decision->round = (uint32_t)round;
  decision->rebuild = rebuild;
  decision->flags = (uint32_t)flags;
  decision->replaced_count = (int)replaced;
  decision->joined_count = (int)joined;
  return KEEL_OK;
}

/* ---- the table of votes, read from the store */

typedef struct agreement {
  keel_comm *comm;
  uint32_t round;
  keel__ballot *ballots;
  uint32_t *spares, *joiners;
  int spare_count, joiner_count;
  /* The store's revision when the votes were last read (0: not read): the wait for news
   * starts there, so that nothing written since that look goes unseen. */
  uint64_t revision;
  bool designated; /* at the last look, this member was the first live one in rank order */
  bool pools_read; /* the last look read spare/ and join/ too */
} agreement;

static const keel_membership_ops *membership_of(const keel_endpoint *endpoint) {
  return endpoint->config.membership;
}

static bool member_dead(keel_endpoint *endpoint, uint32_t uid) {
  const keel_membership_ops *ops = membership_of(endpoint);
  return ops->dead != NULL && ops->dead(endpoint->config.membership_context, uid);
}

static int member_node(keel_endpoint *endpoint, uint32_t uid) {
  const keel_membership_ops *ops = membership_of(endpoint);
  return ops->node != NULL ? ops->node(endpoint->config.membership_context, uid) : -1;
}

/* The uid a key under prefix names ("agree/3/1/" + "7"); false for another key. */
static bool key_uid(const char *key, const char *prefix, size_t prefix_length, uint32_t *uid_p) {
  if (strncmp(key, prefix, prefix_length) != 0) return false;
  char *end;
  unsigned long uid = strtoul(key + prefix_length, &end, 10);
  if (*end != '\0' || uid >= KEEL_MAX_UIDS) return false;
  *uid_p = (uint32_t)uid;
  return true;
}

/* The ballots from the round's votes (entries under prefix) and the detector's view. */
static void ballots_fill(agreement *round, const keel_store_entry *entries, size_t count,
                         const char *prefix) {
  keel_comm *comm = round->comm;
  keel_endpoint *endpoint = comm->endpoint;
  for (int rank = 0; rank < comm->size; rank++) {
    keel__ballot *ballot = &round->ballots[rank];
    *ballot = (keel__ballot){.uid = comm->uids[rank], .state = KEEL__BALLOT_PENDING, .node = -1};
    ballot->node = member_node(endpoint, ballot->uid);
  }
  size_t prefix_length = strlen(prefix);
  for (size_t i = 0; i < count; i++) {
    uint32_t uid;
    int rank =
        key_uid(entries[i].key, prefix, prefix_length, &uid) ? keel_comm_rank_of(comm, uid) : -1;
    if (rank < 0) continue;
    keel__ballot *ballot = &round->ballots[rank];
    int node = -1;
    if (keel__vote_parse((const char *)entries[i].value, &ballot->vote, &ballot->vote_epoch,
                         &node) != KEEL_OK) {
      KEEL_LOG_W(MODULE, "ignoring a malformed vote %s", entries[i].key);
      continue;
    }
    ballot->state = KEEL__BALLOT_CAST;
    if (node >= 0) ballot->node = node;
  }
  for (int rank = 0; rank < comm->size; rank++) {
    if (member_dead(endpoint, comm->uids[rank])) round->ballots[rank].state = KEEL__BALLOT_DEAD;
  }
}

/* Spares or joiners under prefix among entries that are alive and not members already,
 * lowest uid first. */
static void candidates_fill(agreement *round, const keel_store_entry *entries, size_t count,
                            const char *prefix, uint32_t *out, int *count_p) {
  keel_endpoint *endpoint = round->comm->endpoint;
  int found = 0;
  size_t prefix_length = strlen(prefix);
  for (size_t i = 0; i < count && found < KEEL_MAX_SPARES; i++) {
    uint32_t uid;
    if (!key_uid(entries[i].key, prefix, prefix_length, &uid)) continue;
    if (member_dead(endpoint, uid) || keel_comm_rank_of(round->comm, uid) >= 0) continue;
    out[found++] = uid;
  }
  /* Keys sort as text ("spare/10" before "spare/9"); order by number. */
  for (int a = 1; a < found; a++) {
    for (int b = a; b > 0 && out[b] < out[b - 1]; b--) {
      uint32_t swap = out[b];
      out[b] = out[b - 1];
      out[b - 1] = swap;
    }
  }
  *count_p = found;
}

/* Both pools, spares and joiners, from entries. */
static void pools_fill(agreement *round, const keel_store_entry *entries, size_t count) {
  candidates_fill(round, entries, count, "spare/", round->spares, &round->spare_count);
  candidates_fill(round, entries, count, "join/", round->joiners, &round->joiner_count);
}

static bool any_vote_wants(const agreement *round, bool spares) {
  for (int rank = 0; rank < round->comm->size; rank++) {
    const keel__ballot *ballot = &round->ballots[rank];
    if (ballot->state != KEEL__BALLOT_CAST || !ballot->vote.rebuild) continue;
    if (spares ? ballot->vote.admit_spares : ballot->vote.admit_joiners) return true;
  }
  return false;
}

/* Every member alive has voted and some vote admits spares: the round waits for a
 * replacement to be ready (the decision holds off until one is, or the spare wait ends),
 * not for a silent member. */
static bool round_waits_for_spares(const agreement *round) {
  for (int rank = 0; rank < round->comm->size; rank++)
    if (round->ballots[rank].state == KEEL__BALLOT_PENDING) return false;
  return any_vote_wants(round, true);
}

/* Members alive but silent past the deadline are suspected: the job fences them, which
 * settles the round. */
static void suspect_silent(const agreement *round) {
  keel_endpoint *endpoint = round->comm->endpoint;
  const keel_membership_ops *ops = membership_of(endpoint);
  for (int rank = 0; rank < round->comm->size; rank++) {
    const keel__ballot *ballot = &round->ballots[rank];
    if (ballot->state != KEEL__BALLOT_PENDING) continue;
    KEEL_LOG_W(MODULE, "uid %u did not join the agreement in time: suspecting it", ballot->uid);
    if (ops->suspect != NULL)
      ops->suspect(endpoint->config.membership_context, ballot->uid, "agree-timeout");
  }
}

/* Keys of epochs before the decided one are finished: nobody reads them again (every member
 * of the next epoch, admitted spares included, has read the decision it joined by). */
void keel_endpoint_collect(keel_endpoint *endpoint) {
  if (endpoint == NULL || endpoint->standalone || endpoint->collect_before == 0) return;
  uint64_t epoch = endpoint->collect_before;
  endpoint->collect_before = 0;
  static const char *const prefixes[] = {"agree/", "decide/"};
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list_prefixes(endpoint->config.store, prefixes, 2, &entries, &count, NULL) !=
      KEEL_OK)
    return;
  for (size_t i = 0; i < count; i++) {
    /* "agree/<epoch>/..." or "decide/<epoch>/...". */
    uint64_t key_epoch = strtoull(strchr(entries[i].key, '/') + 1, NULL, 10);
    if (key_epoch < epoch) keel_store_delete(endpoint->config.store, entries[i].key);
  }
  keel_store_entries_free(entries, count);
}

/* The prefixes one look reads: the round's decision, its votes, the spare and joiner pools
 * when this member's vote admits newcomers, and the failure detector's view. */
static size_t look_prefixes(agreement *round, const keel_rebuild_vote *vote, const char *decide_key,
                            const char *votes, const char *prefixes[KEEL_STORE_MAX_PREFIXES]) {
  const keel_membership_ops *ops = membership_of(round->comm->endpoint);
  size_t count = 0;
  prefixes[count++] = decide_key;
  prefixes[count++] = votes;
  round->pools_read = vote->rebuild && (vote->admit_spares || vote->admit_joiners);
  if (round->pools_read) {
    prefixes[count++] = "spare/";
    prefixes[count++] = "join/";
  }
  for (size_t i = 0;
       ops->view_prefixes != NULL && ops->view_prefixes[i] != NULL && i < KEEL_VIEW_PREFIXES_MAX;
       i++)
    prefixes[count++] = ops->view_prefixes[i];
  return count;
}

/* One read of the round, one request: its decision if there is one (*found_p, into
 * decision), else its votes into the ballots (and the pools into the candidates), with the
 * detector's view taken from the same entries. round->revision, where the wait for news
 * starts, covers all that was read. */
static keel_status round_read(agreement *round, const keel_rebuild_vote *vote,
                              keel_decision *decision, bool *found_p) {
  keel_comm *comm = round->comm;
  keel_endpoint *endpoint = comm->endpoint;
  const keel_membership_ops *ops = membership_of(endpoint);
  char decide_key[96], votes[96];
  keel__epoch_key(decide_key, sizeof decide_key, "decide", comm->epoch, round->round, NULL);
  keel__epoch_key(votes, sizeof votes, "agree", comm->epoch, round->round, "/");
  const char *prefixes[KEEL_STORE_MAX_PREFIXES];
  size_t prefix_count = look_prefixes(round, vote, decide_key, votes, prefixes);
  *found_p = false;
  keel_status status =
      ops->publish != NULL ? ops->publish(endpoint->config.membership_context) : KEEL_OK;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (status == KEEL_OK)
    status = keel_store_list_prefixes(endpoint->config.store, prefixes, prefix_count, &entries,
                                      &count, &round->revision);
  if (status != KEEL_OK) {
    round->revision = 0;
    return status;
  }
  for (size_t i = 0; i < count && !*found_p; i++) {
    if (strcmp(entries[i].key, decide_key) != 0) continue;
    status = keel__decision_parse((const char *)entries[i].value, decision);
    if (status != KEEL_OK) KEEL_LOG_E(MODULE, "the decision under %s is malformed", decide_key);
    *found_p = status == KEEL_OK;
  }
  if (status == KEEL_OK && !*found_p && ops->take_view != NULL)
    status = ops->take_view(endpoint->config.membership_context, entries, count);
  if (status == KEEL_OK && !*found_p) {
    ballots_fill(round, entries, count, votes);
    pools_fill(round, entries, count);
  }
  keel_store_entries_free(entries, count);
  return status;
}

/* The pools when some vote admits newcomers but this look did not read them (this member's
 * own vote admits none). */
static keel_status pools_read(agreement *round) {
  static const char *const pools[] = {"spare/", "join/"};
  keel_store_entry *entries = NULL;
  size_t count = 0;
  keel_status status = keel_store_list_prefixes(round->comm->endpoint->config.store, pools, 2,
                                                &entries, &count, NULL);
  if (status != KEEL_OK) return status;
  pools_fill(round, entries, count);
  keel_store_entries_free(entries, count);
  return KEEL_OK;
}

/* The first member in rank order not dead in the ballots: the one that settles the round. */
static bool designated_decider(const agreement *round) {
  for (int rank = 0; rank < round->comm->size; rank++) {
    if (round->ballots[rank].state != KEEL__BALLOT_DEAD) return rank == round->comm->rank;
  }
  return false;
}

/* Tries to settle the round from what the store says (the designated decider, or anyone
 * when eager). *settled_p when this process's decision won the cas: it is in decision. */
static keel_status try_decide(agreement *round, bool waited_enough_for_spares, bool eager,
                              keel_decision *decision, bool *settled_p) {
  keel_comm *comm = round->comm;
  keel_endpoint *endpoint = comm->endpoint;
  *settled_p = false;
  round->designated = designated_decider(round);
  if (!round->designated && !eager) return KEEL_OK;
  keel_status status = KEEL_OK;
  if (!round->pools_read && (any_vote_wants(round, true) || any_vote_wants(round, false)))
    status = pools_read(round);
  if (status != KEEL_OK) return status;
  keel__decide_input input = {.epoch = comm->epoch,
                              .round = round->round,
                              .ballots = round->ballots,
                              .count = comm->size,
                              .spares = round->spares,
                              .spare_count = round->spare_count,
                              .joiners = round->joiners,
                              .joiner_count = round->joiner_count,
                              .node_domain = endpoint->config.node_domain,
                              .waited_enough_for_spares = waited_enough_for_spares,
                              .max_world = endpoint->config.max_world,
                              .refill_world = endpoint->config.refill_world};
  if (!keel__decide(&input, decision)) return KEEL_OK;
  char key[96];
  keel__epoch_key(key, sizeof key, "decide", comm->epoch, round->round, NULL);
  keel_buffer text;
  keel_buffer_init(&text, KEEL_STORE_MAX_VALUE);
  status = keel__decision_format(decision, &text);
  if (status == KEEL_OK)
    status = keel_store_cas(endpoint->config.store, key, 0, text.data, text.length, 0, NULL);
  keel_buffer_free(&text);
  *settled_p = status == KEEL_OK;
  if (*settled_p) endpoint->collect_before = comm->epoch;
  /* Another member's decision won: the next look reads it. */
  return status == KEEL_ECONFLICT ? KEEL_OK : status;
}

static keel_status agreement_alloc(agreement *round, keel_comm *comm) {
  *round = (agreement){.comm = comm, .round = comm->agree_round++};
  round->ballots = calloc((size_t)comm->size, sizeof *round->ballots);
  round->spares = calloc(KEEL_MAX_SPARES, sizeof *round->spares);
  round->joiners = calloc(KEEL_MAX_SPARES, sizeof *round->joiners);
  return round->ballots && round->spares && round->joiners ? KEEL_OK : KEEL_ENOMEM;
}

static void agreement_free(agreement *round) {
  free(round->ballots);
  free(round->spares);
  free(round->joiners);
}

static keel_status agreement_vote(agreement *round, const keel_rebuild_vote *vote) {
  keel_comm *comm = round->comm;
  keel_endpoint *endpoint = comm->endpoint;
  keel__fault(endpoint, "agree", 0);
  char key[96], suffix[32], value[256];
  snprintf(suffix, sizeof suffix, "/%" PRIu32, endpoint->config.uid);
  keel__epoch_key(key, sizeof key, "agree", comm->epoch, round->round, suffix);
  keel_status status =
      keel__vote_format(vote, comm->epoch, endpoint->config.node, value, sizeof value);
  if (status != KEEL_OK) return status;
  status = keel_store_put(endpoint->config.store, key, value, strlen(value), 0, NULL);
  /* A member that dies here has voted: the others must still settle without it. */
  if (status == KEEL_OK) keel__fault(endpoint, "voted", 0);
  return status;
}

/* A store that did not answer in time, or whose link broke, may answer the next request
 * (the client reconnects): the agreement keeps trying until its own deadline. */
static bool store_transient(keel_status status) {
  return status == KEEL_ETIMEDOUT || status == KEEL_ECLOSED || status == KEEL_EAGAIN;
}

/* One look at the round: vote if not done yet, read the decision, else try to settle it.
 * *done_p when a decision is in hand. */
static keel_status agreement_look(agreement *round, const keel_rebuild_vote *vote, bool *voted_p,
                                  bool waited, bool eager, keel_decision *decision, bool *done_p) {
  keel_comm *comm = round->comm;
  keel_status status = KEEL_OK;
  if (!*voted_p) {
    status = agreement_vote(round, vote);
    *voted_p = status == KEEL_OK;
    /* Finished epochs' keys go now, while the others' votes come in. */
    if (*voted_p) keel_endpoint_collect(comm->endpoint);
  }
  if (status == KEEL_OK) status = round_read(round, vote, decision, done_p);
  if (status != KEEL_OK || *done_p) return status;
  return try_decide(round, waited, eager, decision, done_p);
}

/* Silence counts only over time in which the store could take votes: nobody votes through a
 * store that does not answer (a stopped launcher, an etcd election), and a member's client may
 * have to reconnect after it. So after a store call that failed, or that returned a quarter of
 * the deadline later than due_ns (the store answers in well under a millisecond), every member
 * has a whole deadline again from now, never past limit_ns. The deadline, moved or not. */
static int64_t deadline_after_store_call(const keel_comm *comm, int64_t deadline, int64_t due_ns,
                                         bool answered, int64_t limit_ns) {
  int64_t now = keel_now_ns();
  if (answered && now - due_ns < comm->timeout_ns / 4) return deadline;
  int64_t renewed = now + comm->timeout_ns;
  if (renewed > limit_ns) renewed = limit_ns;
  if (renewed <= deadline) return deadline;
  KEEL_LOG_I(MODULE,
             "the store %s (%" PRId64 " ms late) in the agreement of epoch %" PRIu64
             ": every member has a whole deadline again",
             answered ? "answered late" : "did not answer", (now - due_ns) / 1000000, comm->epoch);
  return renewed;
}

/* One round of agreement on comm's epoch: vote, then settle or adopt the decision. */
static keel_status agree_round(keel_comm *comm, const keel_rebuild_vote *vote,
                               keel_decision *decision) {
  keel_endpoint *endpoint = comm->endpoint;
  agreement round;
  keel_status status = agreement_alloc(&round, comm);
  int64_t started = keel_now_ns();
  int64_t deadline = started + comm->timeout_ns;
  int64_t outage_limit = deadline + STORE_OUTAGE_ALLOWANCE_NS;
  bool suspected = false, voted = false, done = false, store_warned = false;
  while (status == KEEL_OK) {
    int64_t look_began = keel_now_ns();
    bool waited = look_began - started >= endpoint->config.spare_wait_ns;
    bool eager = look_began - started >= DECIDER_GRACE_NS;
    keel_status look = agreement_look(&round, vote, &voted, waited, eager, decision, &done);
    if (look == KEEL_OK && done) break;
    if (look != KEEL_OK && !store_transient(look)) {
      status = look;
      break;
    }
    deadline = deadline_after_store_call(comm, deadline, look_began, look == KEEL_OK, outage_limit);
    if (look != KEEL_OK && !store_warned) {
      KEEL_LOG_W(MODULE, "the store does not answer (%s): the agreement keeps trying",
                 keel_strerror(look));
      store_warned = true;
    }
    if ((status = keel__interrupted(endpoint)) != KEEL_OK) break;
    /* A spare that is still starting (a Python one imports torch for seconds) is no reason to
     * give up the round: its members' deadlines differ (`auto` sets each from its own steps),
     * so one that gave up would start the next round and suspect a member still waiting,
     * in time, in this one. The round waits as long as the decision does, then a deadline. */
    if (!waited && round_waits_for_spares(&round)) {
      int64_t spare_deadline = started + endpoint->config.spare_wait_ns + comm->timeout_ns;
      if (deadline < spare_deadline) deadline = spare_deadline;
    }
    if (keel_now_ns() >= deadline) {
      if (suspected) {
        KEEL_LOG_E(MODULE, "the agreement of epoch %" PRIu64 " did not settle in two deadlines",
                   comm->epoch);
        status = KEEL_ETIMEDOUT;
        break;
      }
      suspect_silent(&round);
      suspected = true;
      deadline = keel_now_ns() + comm->timeout_ns;
    }
    /* Keep links moving (revocations out, closed links noticed) while waiting. */
    keel__progress(endpoint, 0);
    int64_t wake = keel_now_ns() + LOOK_INTERVAL_NS;
    /* Waiting on the designated decider: only its decision is news, until the grace ends. */
    bool patient = !round.designated && !eager;
    if (patient && wake > started + DECIDER_GRACE_NS) wake = started + DECIDER_GRACE_NS;
    if (wake > deadline) wake = deadline;
    keel_status news = round.revision == 0
                           ? KEEL_ECLOSED
                           : keel_store_wait(endpoint->config.store, patient ? "decide/" : "",
                                             round.revision, wake, NULL);
    /* No look this time, or the store did not answer: pace the loop on the links instead. */
    bool answered = news == KEEL_OK || news == KEEL_ETIMEDOUT;
    if (!answered) keel__progress(endpoint, wake);
    /* A wait that the store held past its wake (the embedded client's request runs on until
     * the store answers or its own timeout) spans an outage too. */
    if (round.revision != 0)
      deadline = deadline_after_store_call(comm, deadline, wake, answered, outage_limit);
  }
  keel_wait_ended(KEEL_WAIT_AGREEMENT, deadline);
  agreement_free(&round);
  return status;
}

/* ---- the public operations */

keel_status keel_comm_revoke(keel_comm *comm) {
  if (comm == NULL) return KEEL_EINVAL;
  comm->revoked_locally = true;
  keel__note_revoke(comm->endpoint, comm->epoch);
  return KEEL_OK;
}

static keel_status agreement_run(keel_comm *comm, const keel_rebuild_vote *vote,
                                 keel_decision *decision) {
  keel_endpoint *endpoint = comm->endpoint;
  if (!endpoint->standalone) return agree_round(comm, vote, decision);
  memset(decision, 0, sizeof *decision);
  decision->epoch = comm->epoch;
  decision->flags = vote->flags;
  decision->rebuild = vote->rebuild;
  decision->member_count = 1;
  decision->members[0] = endpoint->config.uid;
  snprintf(decision->notes[0], KEEL_NOTE_MAX, "%s", vote->note);
  return KEEL_OK;
}

keel_status keel_comm_agree(keel_comm *comm, uint32_t *flags, uint32_t *failed_uids,
                            size_t capacity, size_t *failed_count_p) {
  if (comm == NULL || flags == NULL || comm->rank < 0) return KEEL_EINVAL;
  keel_rebuild_vote vote = {.flags = *flags};
  keel_decision *decision = malloc(sizeof *decision);
  if (decision == NULL) return KEEL_ENOMEM;
  keel_status status = agreement_run(comm, &vote, decision);
  if (status == KEEL_OK) {
    *flags = decision->flags;
    for (int i = 0; i < decision->failed_count && failed_uids != NULL && (size_t)i < capacity; i++)
      failed_uids[i] = decision->failed[i];
    if (failed_count_p) *failed_count_p = (size_t)decision->failed_count;
  }
  free(decision);
  return status;
}

keel_status keel_comm_decide(keel_comm *comm, const keel_rebuild_vote *vote,
                             keel_decision *decision) {
  if (comm == NULL || vote == NULL || decision == NULL || comm->rank < 0) return KEEL_EINVAL;
  keel_rebuild_vote mine = *vote;
  mine.rebuild = true;
  return agreement_run(comm, &mine, decision);
}

keel_status keel_endpoint_adopt(keel_endpoint *endpoint, const keel_decision *decision,
                                keel_comm **comm_p) {
  if (endpoint == NULL || decision == NULL || comm_p == NULL) return KEEL_EINVAL;
  return keel__comm_from_decision(endpoint, decision, comm_p);
}

keel_status keel_comm_rebuild(keel_comm *comm, const keel_rebuild_vote *vote,
                              keel_decision *decision, keel_comm **new_p) {
  keel_status status = keel_comm_decide(comm, vote, decision);
  if (status != KEEL_OK) return status;
  keel_comm *created = NULL;
  status = keel_endpoint_adopt(comm->endpoint, decision, &created);
  if (status == KEEL_OK && new_p != NULL) *new_p = created;
  return status;
}

static keel_status rebuild_simply(keel_comm *comm, const keel_rebuild_vote *vote,
                                  keel_comm **new_p) {
  keel_decision *decision = malloc(sizeof *decision);
  if (decision == NULL) return KEEL_ENOMEM;
  keel_status status = keel_comm_rebuild(comm, vote, decision, new_p);
  free(decision);
  return status;
}

keel_status keel_comm_shrink(keel_comm *comm, keel_comm **new_p) {
  keel_rebuild_vote vote = {.flags = 1, .rebuild = true, .shrink_only = true};
  return rebuild_simply(comm, &vote, new_p);
}

keel_status keel_comm_grow(keel_comm *comm, keel_comm **new_p) {
  keel_rebuild_vote vote = {
      .flags = 1, .rebuild = true, .admit_spares = true, .admit_joiners = true};
  return rebuild_simply(comm, &vote, new_p);
}

/* ---- processes that are not members yet */

static void offer_key(const keel_endpoint *endpoint, keel_offer offer, char *key, size_t capacity) {
  snprintf(key, capacity, "%s/%" PRIu32, offer == KEEL_OFFER_SPARE ? "spare" : "join",
           endpoint->config.uid);
}

/* How long a spare or joiner pauses before it sends an offer the store did not take again. */
#define OFFER_RETRY_PAUSE_NS (100 * 1000000L)

keel_status keel_endpoint_offer(keel_endpoint *endpoint, keel_offer offer) {
  if (endpoint == NULL || endpoint->standalone) return KEEL_EINVAL;
  char key[64];
  offer_key(endpoint, offer, key, sizeof key);
  /* The put is the same every time: one whose fate a store fail-over left unknown is simply
   * sent again, within the operations' deadline. The soak's etcd part saw a spare that
   * started during an etcd election leave with its offer's first failure (finding 38). */
  int64_t deadline = keel_deadline_after_ns(endpoint->config.timeout_ns);
  for (bool warned = false;; warned = true) {
    keel_status status =
        keel_store_put(endpoint->config.store, key, "", 0, endpoint->config.lease, NULL);
    if (!store_transient(status) || keel_now_ns() >= deadline ||
        keel__interrupted(endpoint) != KEEL_OK)
      return status;
    if (!warned)
      KEEL_LOG_W(MODULE, "the store does not take the offer (%s): trying again",
                 keel_strerror(status));
    struct timespec pause = {0, OFFER_RETRY_PAUSE_NS};
    nanosleep(&pause, NULL);
  }
}

/* The newest rebuild decision that names this process and is newer than the epoch it has,
 * if any. An older decision that named it was overtaken by a later failure. */
static keel_status newest_admission(keel_endpoint *endpoint, keel_decision *decision, bool *found_p,
                                    uint64_t *revision_p) {
  *found_p = false;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  keel_status status =
      keel_store_list(endpoint->config.store, "decide/", &entries, &count, revision_p);
  if (status != KEEL_OK) return status;
  keel_decision *candidate = malloc(sizeof *candidate);
  if (candidate == NULL) {
    keel_store_entries_free(entries, count);
    return KEEL_ENOMEM;
  }
  uint64_t have = endpoint->current ? endpoint->current->epoch + 1 : 0;
  for (size_t i = 0; i < count; i++) {
    if (keel__decision_parse((const char *)entries[i].value, candidate) != KEEL_OK ||
        !candidate->rebuild || candidate->epoch + 1 <= have)
      continue;
    if (*found_p && candidate->epoch <= decision->epoch) continue;
    for (int m = 0; m < candidate->member_count; m++) {
      if (candidate->members[m] != endpoint->config.uid) continue;
      memcpy(decision, candidate, sizeof *decision);
      *found_p = true;
    }
  }
  free(candidate);
  keel_store_entries_free(entries, count);
  return KEEL_OK;
}

static void withdraw_offers(keel_endpoint *endpoint) {
  for (int offer = KEEL_OFFER_SPARE; offer <= KEEL_OFFER_JOINER; offer++) {
    char key[64];
    offer_key(endpoint, (keel_offer)offer, key, sizeof key);
    keel_store_delete(endpoint->config.store, key);
  }
}

keel_status keel_endpoint_await_admission(keel_endpoint *endpoint, int64_t deadline_ns,
                                          keel_decision *decision, keel_comm **comm_p) {
  if (endpoint == NULL || decision == NULL || comm_p == NULL || endpoint->standalone)
    return KEEL_EINVAL;
  *comm_p = NULL;
  keel_status status;
  for (;;) {
    bool found = false;
    uint64_t revision = 0;
    status = newest_admission(endpoint, decision, &found, &revision);
    if (status != KEEL_OK && !store_transient(status)) break;
    if (status == KEEL_OK && found) {
      status = keel__comm_from_decision(endpoint, decision, comm_p);
      break;
    }
    if ((status = keel__interrupted(endpoint)) != KEEL_OK) break;
    if (keel_now_ns() >= deadline_ns) {
      status = KEEL_ETIMEDOUT;
      break;
    }
    keel__progress(endpoint, 0);
    int64_t wake = keel_now_ns() + 200 * (int64_t)1000000;
    keel_store_wait(endpoint->config.store, "decide/", revision,
                    wake < deadline_ns ? wake : deadline_ns, NULL);
  }
  /* Admitted (*comm_p: named in a decision, even if linking its members failed), the offer
   * is taken. Otherwise the process is leaving (its lease takes the key with it) or the
   * store is gone: nothing to say. */
  if (*comm_p != NULL) withdraw_offers(endpoint);
  return status;
}
