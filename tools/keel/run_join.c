/* Growing a job (ULFM elastic paper, scenario III): the launcher starts joiners, processes
 * with KEEL_ROLE=joiner that wait in join/<uid> until rank 0 admits them at a step
 * boundary. The first max_world - world start with the job or after --join-delay; `keel
 * join` writes a request/join/<id> key to start some at once (those still delayed first),
 * bounded so that the world stays within --max-world. */
#include <stdio.h>
#include <string.h>

#include "launcher.h"

#define REQUEST_COUNT_FIELD "count="
#define REFUSAL_MAX_BYTES 256

/* Starts up to count joiners; returns how many started (the first uid in *first_uid_p). */
static int64_t joiners_spawn(keel__launcher *launcher, int64_t count, uint32_t *first_uid_p) {
  *first_uid_p = (uint32_t)launcher->child_count;
  int64_t started = 0;
  for (; started < count && launcher->joiners_started < launcher->joiner_budget; started++) {
    if (keel__child_spawn(launcher, KEEL__ROLE_JOINER) != KEEL_OK) break;
    launcher->joiners_started++;
  }
  if (started < count)
    KEEL_LOG_E("launcher", "started %lld of %lld joiners", (long long)started, (long long)count);
  return started;
}

void keel__joiners_schedule(keel__launcher *launcher) {
  const keel__run_options *options = &launcher->options;
  if (launcher->phase != KEEL__PHASE_RUNNING || options->max_world <= options->world) return;
  launcher->joiners_delayed = options->max_world - options->world;
  launcher->join_at_ns = launcher->start_ns + options->join_delay_ns;
  keel__joiners_tick(launcher, keel_now_ns());
}

void keel__joiners_tick(keel__launcher *launcher, int64_t now_ns) {
  if (launcher->joiners_delayed == 0 || now_ns < launcher->join_at_ns) return;
  int64_t count = launcher->joiners_delayed;
  launcher->joiners_delayed = 0;
  launcher->join_at_ns = KEEL_NO_DEADLINE;
  /* A job that ended before its joiners were due has nothing left for them to join. */
  if (launcher->phase != KEEL__PHASE_RUNNING) return;
  uint32_t first_uid;
  int64_t started = joiners_spawn(launcher, count, &first_uid);
  if (started > 0)
    keel__display_note(launcher, "started %lld joiners (uids %u..%u)", (long long)started,
                       (unsigned)first_uid, (unsigned)(first_uid + started - 1));
}

int64_t keel__joiners_deadline(const keel__launcher *launcher) {
  return launcher->joiners_delayed > 0 ? launcher->join_at_ns : KEEL_NO_DEADLINE;
}

/* The world the job holds or is heading to now: live rank holders and joiners alive and not
 * yet admitted. Spares are not counted: they take failed ranks and never add one (and the
 * runtime admits joiners only up to KEEL_MAX_WORLD anyway). Joiners still delayed are not
 * counted either: a request takes their place (request_accept), so that the world ahead
 * plus those delayed stays within --max-world. */
static int64_t world_ahead(const keel__launcher *launcher) {
  int64_t count = 0;
  for (size_t i = 0; i < launcher->child_count; i++) {
    const keel__child *child = &launcher->children[i];
    if (!child->alive || child->fenced) continue;
    if (child->holds_rank || child->role == KEEL__ROLE_JOINER) count++;
  }
  return count;
}

/* Why a request for count joiners must be refused, or false when it may go ahead. */
static bool join_refusal(const keel__launcher *launcher, int64_t count, char *reason,
                         size_t capacity) {
  int64_t ahead = world_ahead(launcher), max_world = launcher->options.max_world;
  int64_t budget_left = launcher->joiner_budget - launcher->joiners_started;
  if (launcher->phase != KEEL__PHASE_RUNNING) {
    snprintf(reason, capacity, "the job is ending");
    return true;
  }
  if (ahead + count > max_world) {
    snprintf(reason, capacity,
             "%lld more would make a world of %lld, above --max-world %lld "
             "(%lld ranks held or waiting to join)",
             (long long)count, (long long)(ahead + count), (long long)max_world, (long long)ahead);
    return true;
  }
  if (count > budget_left) {
    snprintf(reason, capacity, "the job may start %lld more joiners (%lld in all), not %lld",
             (long long)budget_left, (long long)launcher->joiner_budget, (long long)count);
    return true;
  }
  return false;
}

/* The count of a "count=K" value; false when it is anything else. */
static bool request_count_parse(const char *value, int64_t *count_p) {
  size_t field_length = strlen(REQUEST_COUNT_FIELD);
  if (strncmp(value, REQUEST_COUNT_FIELD, field_length) != 0) return false;
  return keel_parse_int(value + field_length, 1, INT32_MAX, count_p) == KEEL_OK;
}

/* A refusal stays in the key for the tool to read (the tool deletes it). */
static void request_refuse(keel__launcher *launcher, const keel_store_entry *entry, const char *id,
                           const char *reason) {
  char value[REFUSAL_MAX_BYTES + sizeof KEEL__JOIN_REFUSED];
  int length = snprintf(value, sizeof value, "%s%s", KEEL__JOIN_REFUSED, reason);
  keel_status status =
      keel_store_cas(launcher->store, entry->key, entry->revision, value, (size_t)length, 0, NULL);
  if (status != KEEL_OK && status != KEEL_ECONFLICT && status != KEEL_ENOTFOUND)
    KEEL_LOG_E("launcher", "cannot answer %s: %s", entry->key, keel_strerror(status));
  char escaped[2 * REFUSAL_MAX_BYTES];
  keel__json_escape(reason, escaped, sizeof escaped);
  keel__event_emit(launcher, "join_request", "\"id\":\"%s\",\"accepted\":false,\"reason\":\"%s\"",
                   id, escaped);
  KEEL_LOG_W("launcher", "refused a request to join: %s", reason);
}

/* Starts count joiners now; as many delayed ones are no longer to start later. */
static void request_accept(keel__launcher *launcher, const keel_store_entry *entry, const char *id,
                           int64_t count) {
  /* Deleted first: should the tool give up and delete it meanwhile, nothing starts. */
  keel_status status = keel_store_delete(launcher->store, entry->key);
  if (status != KEEL_OK) {
    if (status != KEEL_ENOTFOUND)
      KEEL_LOG_E("launcher", "cannot delete %s: %s", entry->key, keel_strerror(status));
    return;
  }
  int64_t taken = count < launcher->joiners_delayed ? count : launcher->joiners_delayed;
  launcher->joiners_delayed -= taken;
  uint32_t first_uid;
  int64_t started = joiners_spawn(launcher, count, &first_uid);
  keel__event_emit(launcher, "join_request",
                   "\"id\":\"%s\",\"accepted\":true,\"count\":%lld,\"started\":%lld,"
                   "\"first_uid\":%u,\"from_delayed\":%lld,\"max_world\":%lld",
                   id, (long long)count, (long long)started, (unsigned)first_uid, (long long)taken,
                   (long long)launcher->options.max_world);
  keel__display_note(launcher, "keel join: started %lld joiners", (long long)started);
}

static void request_handle(keel__launcher *launcher, const keel_store_entry *entry) {
  const char *value = (const char *)entry->value;
  if (strncmp(value, KEEL__JOIN_REFUSED, strlen(KEEL__JOIN_REFUSED)) == 0) return;
  char id[128];
  keel__json_escape(entry->key + strlen(KEEL__JOIN_REQUEST_PREFIX), id, sizeof id);
  int64_t count = 0;
  char reason[REFUSAL_MAX_BYTES];
  if (!request_count_parse(value, &count)) {
    request_refuse(launcher, entry, id, "the request is not count=K with K >= 1");
    return;
  }
  if (join_refusal(launcher, count, reason, sizeof reason)) {
    request_refuse(launcher, entry, id, reason);
    return;
  }
  request_accept(launcher, entry, id, count);
}

void keel__join_requests_handle(keel__launcher *launcher) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  keel_status status =
      keel_store_list(launcher->store, KEEL__JOIN_REQUEST_PREFIX, &entries, &count, NULL);
  if (status != KEEL_OK) {
    KEEL_LOG_E("launcher", "cannot list join requests: %s", keel_strerror(status));
    return;
  }
  for (size_t i = 0; i < count; i++) request_handle(launcher, &entries[i]);
  keel_store_entries_free(entries, count);
}
