/* The training thread's watchdog. With KEEL_TIMEOUT=auto (`keel run --collective-timeout
 * auto`) it sets the collective deadline from the intervals between steps this process has
 * observed, so that a rank whose training thread stopped making progress is caught in
 * seconds rather than the default 30. Sections (keel_section_begin/end) tell the other ranks
 * that this one does legitimately long work, so that their collectives wait for it instead of
 * taking it for a hang. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/runtime_internal.h"

#define MODULE "watchdog"
#define SECOND_NS ((int64_t)1000000000)
/* Step intervals kept: a p99 over them sees a slow step that comes every hundred or two. */
#define SAMPLES 256
/* Before this many intervals the configured deadline (30 s unless KEEL_TIMEOUT says) holds. */
#define WARM_UP_STEPS 8
/* The deadline is this multiple of the intervals' p99, and at least FLOOR_NS: a step may be
 * that much slower than the slowest seen (a loaded machine) before it is taken for a hang. */
#define P99_MULTIPLE 10
#define FLOOR_NS SECOND_NS
/* The deadline changes (and an event says so) only when the new one differs by a quarter. */
#define CHANGE_NUMERATOR 5
#define CHANGE_DENOMINATOR 4

struct keel__watchdog {
  bool automatic;
  int64_t intervals[SAMPLES];
  size_t count; /* intervals kept, at most SAMPLES */
  size_t next;  /* where the next one goes */
  int64_t last_begin_ns;
  uint64_t recoveries_at_begin;
  bool section_since_begin; /* long work declared since the last step began: not a sample */
  int64_t applied_ns;       /* the deadline set last; 0: none yet */
  bool in_section;
  char section_name[KEEL__SECTION_NAME_MAX];
  int64_t section_started_ns;
};

keel_status keel__watchdog_create(const keel__config *config, keel__watchdog **watchdog_p) {
  keel__watchdog *watchdog = calloc(1, sizeof *watchdog);
  if (watchdog == NULL) return KEEL_ENOMEM;
  watchdog->automatic = config->timeout_auto;
  *watchdog_p = watchdog;
  return KEEL_OK;
}

void keel__watchdog_destroy(keel__watchdog *watchdog) { free(watchdog); }

static int compare_durations(const void *a, const void *b) {
  int64_t left = *(const int64_t *)a, right = *(const int64_t *)b;
  return (left > right) - (left < right);
}

static int64_t intervals_p99(const keel__watchdog *watchdog) {
  int64_t sorted[SAMPLES];
  memcpy(sorted, watchdog->intervals, watchdog->count * sizeof sorted[0]);
  qsort(sorted, watchdog->count, sizeof sorted[0], compare_durations);
  size_t index = (watchdog->count * 99 + 99) / 100; /* ceil(0.99 n), 1-based */
  return sorted[index - 1];
}

static bool differs_enough(int64_t proposed, int64_t applied) {
  if (applied == 0) return true;
  return proposed * CHANGE_DENOMINATOR > applied * CHANGE_NUMERATOR ||
         applied * CHANGE_DENOMINATOR > proposed * CHANGE_NUMERATOR;
}

/* Rank 0 writes the deadline it set, for the spares that take ranks later: they start from it
 * rather than from 30 s while they observe steps of their own. Best effort. */
#define DEADLINE_KEY "watchdog/timeout"

static void deadline_publish(keel_ctx *ctx, int64_t timeout_ns) {
  if (ctx->config.standalone || keel_comm_rank(keel_world(ctx)) != 0) return;
  char value[24];
  int length = snprintf(value, sizeof value, "%" PRId64, timeout_ns);
  keel_store_put(keel__session_store(ctx->session), DEADLINE_KEY, value, (size_t)length, 0, NULL);
}

void keel__watchdog_adopt(keel_ctx *ctx) {
  keel__watchdog *watchdog = ctx->watchdog;
  keel_comm *world = keel_world(ctx);
  if (!watchdog->automatic || ctx->config.standalone || world == NULL) return;
  keel_store_entry *entry = NULL;
  if (keel_store_get(keel__session_store(ctx->session), DEADLINE_KEY, &entry) != KEEL_OK) return;
  int64_t timeout = 0;
  if (keel_parse_int((const char *)entry->value, FLOOR_NS, INT64_MAX / 4, &timeout) == KEEL_OK) {
    keel_comm_set_timeout(world, timeout);
    watchdog->applied_ns = timeout;
  }
  keel_store_entry_free(entry);
}

static void deadline_update(keel_ctx *ctx) {
  keel__watchdog *watchdog = ctx->watchdog;
  if (watchdog->count < WARM_UP_STEPS) return;
  int64_t p99 = intervals_p99(watchdog);
  int64_t proposed = p99 > FLOOR_NS / P99_MULTIPLE ? p99 * P99_MULTIPLE : FLOOR_NS;
  if (!differs_enough(proposed, watchdog->applied_ns)) return;
  keel_comm *world = keel_world(ctx);
  if (world == NULL) return;
  keel_comm_set_timeout(world, proposed);
  watchdog->applied_ns = proposed;
  deadline_publish(ctx, proposed);
  char fields[128];
  snprintf(fields, sizeof fields, "\"timeout_ms\":%.3f,\"p99_ms\":%.3f,\"steps\":%zu",
           (double)proposed / 1e6, (double)p99 / 1e6, watchdog->count);
  keel__report_line(ctx, "collective_timeout", fields);
}

void keel__watchdog_step_begin(keel_ctx *ctx) {
  keel__watchdog *watchdog = ctx->watchdog;
  if (!watchdog->automatic) return;
  int64_t now = keel_now_ns();
  keel_recovery last;
  uint64_t recoveries = keel_last_recovery(ctx, &last);
  /* An interval with a recovery or declared long work in it says nothing of a normal step. */
  bool sample = watchdog->last_begin_ns != 0 && recoveries == watchdog->recoveries_at_begin &&
                !watchdog->section_since_begin;
  if (sample) {
    watchdog->intervals[watchdog->next] = now - watchdog->last_begin_ns;
    watchdog->next = (watchdog->next + 1) % SAMPLES;
    if (watchdog->count < SAMPLES) watchdog->count++;
  }
  watchdog->last_begin_ns = now;
  watchdog->recoveries_at_begin = recoveries;
  watchdog->section_since_begin = watchdog->in_section;
  if (sample) deadline_update(ctx);
}

/* ---- sections */

static void section_key(const keel_ctx *ctx, char *key, size_t capacity) {
  snprintf(key, capacity, "section/%" PRIu32, ctx->config.uid);
}

static int64_t wall_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return (int64_t)now.tv_sec * SECOND_NS + now.tv_nsec;
}

keel_status keel_section_begin(keel_ctx *ctx, const char *name, int64_t deadline_ns) {
  if (ctx == NULL || name == NULL || *name == '\0' || strlen(name) >= KEEL__SECTION_NAME_MAX ||
      strpbrk(name, " \"\\") != NULL)
    return KEEL_EINVAL;
  keel__watchdog *watchdog = ctx->watchdog;
  int64_t now = keel_now_ns();
  if (watchdog->in_section) {
    KEEL_LOG_E(MODULE, "keel_section_begin(\"%s\") inside section \"%s\": end it first", name,
               watchdog->section_name);
    return KEEL_EINVAL;
  }
  if (deadline_ns <= now) return KEEL_EINVAL;
  if (!ctx->config.standalone) {
    /* Other processes read it against their own clocks: the end travels as wall time. */
    char key[48], value[128];
    section_key(ctx, key, sizeof key);
    int64_t until_wall = wall_now_ns() + (deadline_ns - now);
    int length =
        snprintf(value, sizeof value, "until_wall_ns=%" PRId64 " name=%s", until_wall, name);
    keel_status status = keel_store_put(keel__session_store(ctx->session), key, value,
                                        (size_t)length, keel__session_lease(ctx->session), NULL);
    if (status != KEEL_OK) return status;
  }
  watchdog->in_section = true;
  watchdog->section_since_begin = true;
  watchdog->section_started_ns = now;
  snprintf(watchdog->section_name, sizeof watchdog->section_name, "%s", name);
  char fields[160];
  snprintf(fields, sizeof fields, "\"name\":\"%s\",\"deadline_ms\":%.3f", name,
           (double)(deadline_ns - now) / 1e6);
  keel__report_line(ctx, "section_begin", fields);
  return KEEL_OK;
}

keel_status keel_section_end(keel_ctx *ctx) {
  if (ctx == NULL || !ctx->watchdog->in_section) return KEEL_EINVAL;
  keel__watchdog *watchdog = ctx->watchdog;
  keel_status status = KEEL_OK;
  if (!ctx->config.standalone) {
    char key[48];
    section_key(ctx, key, sizeof key);
    status = keel_store_delete(keel__session_store(ctx->session), key);
    if (status == KEEL_ENOTFOUND) status = KEEL_OK;
  }
  watchdog->in_section = false;
  char fields[160];
  snprintf(fields, sizeof fields, "\"name\":\"%s\",\"elapsed_ms\":%.3f", watchdog->section_name,
           (double)(keel_now_ns() - watchdog->section_started_ns) / 1e6);
  keel__report_line(ctx, "section_end", fields);
  return status;
}

/* The end of one section/ value on this process's clock; 0 if it cannot be read. */
static int64_t section_until(const char *value, int64_t now, int64_t wall_now) {
  const char *prefix = "until_wall_ns=";
  if (strncmp(value, prefix, strlen(prefix)) != 0) return 0;
  char number[24];
  size_t length = strcspn(value + strlen(prefix), " ");
  if (length == 0 || length >= sizeof number) return 0;
  memcpy(number, value + strlen(prefix), length);
  number[length] = '\0';
  int64_t until_wall = 0;
  if (keel_parse_int(number, 0, INT64_MAX / 2, &until_wall) != KEEL_OK) return 0;
  return now + (until_wall - wall_now);
}

int64_t keel__sections_until(const keel_store_entry *entries, size_t count, uint32_t own_uid) {
  char own[48];
  snprintf(own, sizeof own, "section/%" PRIu32, own_uid);
  int64_t now = keel_now_ns(), wall_now = wall_now_ns(), latest = 0;
  for (size_t i = 0; i < count; i++) {
    if (strcmp(entries[i].key, own) == 0) continue;
    int64_t until = section_until((const char *)entries[i].value, now, wall_now);
    if (until > latest) latest = until;
  }
  return latest;
}
