/* Puts one job restart (user-level JIT) together from the events measured.c kept: the failed
 * process's death, the healthy ranks' saves, the launcher's teardown and respawn, the new
 * workers' restores and the first minibatch they complete, split like the JIT paper's Table 7. */
#include <math.h>
#include <stdio.h>

#include "model/model_internal.h"

#define NS_PER_MS 1e6

void keel__restart_log_clear(keel__restart_log *log) {
  log->restart_count = log->save_count = log->restore_count = log->resumed_count = 0;
  for (size_t uid = 0; uid < KEEL__MODEL_UID_MAXIMUM; uid++)
    log->deaths[uid] = (keel__death_mark){.exit_t_ns = -1, .fault_t_ns = -1};
}

keel__restart_mark *keel__restart_log_mark(keel__restart_log *log, int64_t restart) {
  for (size_t i = 0; i < log->restart_count; i++)
    if (log->restarts[i].restart == restart) return &log->restarts[i];
  if (log->restart_count == KEEL__MODEL_RESTART_MAXIMUM) return NULL;
  keel__restart_mark *mark = &log->restarts[log->restart_count++];
  *mark = (keel__restart_mark){.restart = restart,
                               .failed_uid = -1,
                               .begin_t_ns = -1,
                               .spawn_t_ns = -1,
                               .first_uid = -1,
                               .world = -1};
  return mark;
}

/* ---- times, where -1 is unknown */

static int64_t earliest(int64_t a_t_ns, int64_t b_t_ns) {
  if (a_t_ns < 0) return b_t_ns;
  if (b_t_ns < 0) return a_t_ns;
  return a_t_ns < b_t_ns ? a_t_ns : b_t_ns;
}

static int64_t latest(int64_t a_t_ns, int64_t b_t_ns) { return a_t_ns > b_t_ns ? a_t_ns : b_t_ns; }

/* NAN when either end is unknown or the events disagree on their order. */
static double span_ms(int64_t from_t_ns, int64_t to_t_ns) {
  if (from_t_ns < 0 || to_t_ns < from_t_ns) return NAN;
  return (double)(to_t_ns - from_t_ns) / NS_PER_MS;
}

/* The fault line is written just before an injected fault fires; the launcher's exit line
 * comes when it reaps the process, later. The earlier of the two is the death. */
static int64_t death_t_ns(const keel__restart_log *log, int64_t uid) {
  if (uid < 0 || uid >= KEEL__MODEL_UID_MAXIMUM) return -1;
  return earliest(log->deaths[uid].exit_t_ns, log->deaths[uid].fault_t_ns);
}

/* The first failed exit or injected fault in (after, until], else failed_uid's death. */
static int64_t incarnation_death_t_ns(const keel__restart_log *log, int64_t failed_uid,
                                      int64_t after_t_ns, int64_t until_t_ns) {
  int64_t death = -1;
  for (size_t uid = 0; uid < KEEL__MODEL_UID_MAXIMUM; uid++) {
    const keel__death_mark *mark = &log->deaths[uid];
    int64_t t_ns = earliest(mark->exit_failed ? mark->exit_t_ns : -1, mark->fault_t_ns);
    if (t_ns >= 0 && t_ns > after_t_ns && t_ns <= until_t_ns) death = earliest(death, t_ns);
  }
  return death >= 0 ? death : death_t_ns(log, failed_uid);
}

/* Since when a restart's workers run: its spawn, else its beginning; -1 when neither. */
static int64_t restart_running_t_ns(const keel__restart_mark *mark) {
  return mark->spawn_t_ns >= 0 ? mark->spawn_t_ns : mark->begin_t_ns;
}

/* ---- the restart's parts */

/* The saves that ended in (after, until]: they fill restart's save figures, and the first
 * failed collective and the last save's end go to *first_failed_p and *last_saved_p. */
static void saves_add(const keel__restart_log *log, int64_t after_t_ns, int64_t until_t_ns,
                      keel_model_restart *restart, int64_t *first_failed_p, int64_t *last_saved_p) {
  for (size_t i = 0; i < log->save_count; i++) {
    const keel__save_mark *save = &log->saves[i];
    if (save->t_ns <= after_t_ns || save->t_ns > until_t_ns) continue;
    *first_failed_p = earliest(*first_failed_p, save->t_failed_ns);
    *last_saved_p = latest(*last_saved_p, save->t_ns);
    restart->slowest_save_ms = fmax(restart->slowest_save_ms, save->save_ms);
    /* A failed save still names the minibatch its rank was in: how far the job had got. */
    if (save->step > restart->newest_saved_step) restart->newest_saved_step = save->step;
    if (!save->ok) {
      restart->failed_saves++;
      continue;
    }
    restart->saved_ranks++;
    restart->save_bytes += save->bytes;
  }
}

/* The restores of restart number `number`: they fill restart's restore figures, and the
 * last one's end goes to *last_restored_p. */
static void restores_add(const keel__restart_log *log, int64_t number, keel_model_restart *restart,
                         int64_t *last_restored_p) {
  size_t lines = 0;
  for (size_t i = 0; i < log->restore_count; i++) {
    const keel__restore_mark *restore = &log->restores[i];
    if (restore->restart != number) continue;
    lines++;
    *last_restored_p = latest(*last_restored_p, restore->t_ns);
    restart->restore_ms = fmax(restart->restore_ms, restore->restore_ms);
    if (!restore->ok) continue;
    restart->restored_ranks++;
    /* Ranks should agree; if not, the oldest step is what the job as a whole redoes from. */
    if (restart->restored_step < 0 || restore->step < restart->restored_step)
      restart->restored_step = restore->step;
  }
  restart->started_over = lines > 0 && restart->restored_ranks == 0;
}

/* The first resumed line of a restart (not of an in-process recovery) in (after, until). */
static int64_t resumed_t_ns(const keel__restart_log *log, int64_t after_t_ns, int64_t until_t_ns) {
  for (size_t i = 0; i < log->resumed_count; i++) {
    const keel__resumed_mark *resumed = &log->resumed[i];
    if (!resumed->in_process && resumed->t_ns > after_t_ns && resumed->t_ns < until_t_ns)
      return resumed->t_ns;
  }
  return -1;
}

/* Minibatches the job does twice: from the restored step to the newest one a rank had
 * reached, both included; from step 0 when the job started over. -1 when unknown. */
static int64_t redo_minibatches(const keel_model_restart *restart) {
  if (restart->newest_saved_step < 0) return -1;
  if (restart->started_over) return restart->newest_saved_step + 1;
  if (restart->restored_step < 0 || restart->restored_step > restart->newest_saved_step + 1)
    return -1;
  return restart->newest_saved_step - restart->restored_step + 1;
}

void keel__restart_assemble(const keel__restart_log *log, size_t index,
                            keel_model_restart *restart_p) {
  const keel__restart_mark *mark = &log->restarts[index];
  keel_model_restart restart = {.restart = mark->restart,
                                .failed_uid = mark->failed_uid,
                                .begin_t_ns = mark->begin_t_ns,
                                .first_uid = mark->first_uid,
                                .world = mark->world,
                                .restore_ms = NAN,
                                .slowest_save_ms = NAN,
                                .newest_saved_step = -1,
                                .restored_step = -1};
  snprintf(restart.reason, sizeof restart.reason, "%s", mark->reason);
  int64_t after_previous = index == 0 ? -1 : restart_running_t_ns(&log->restarts[index - 1]);
  if (after_previous < 0) after_previous = INT64_MIN;
  int64_t next_begin = INT64_MAX;
  if (index + 1 < log->restart_count && log->restarts[index + 1].begin_t_ns >= 0)
    next_begin = log->restarts[index + 1].begin_t_ns;
  int64_t until = mark->spawn_t_ns >= 0 ? mark->spawn_t_ns : next_begin;
  int64_t first_failed = -1, last_saved = -1, last_restored = -1;
  saves_add(log, after_previous, until, &restart, &first_failed, &last_saved);
  restores_add(log, mark->restart, &restart, &last_restored);
  int64_t death = incarnation_death_t_ns(log, mark->failed_uid, after_previous, until);
  int64_t running = restart_running_t_ns(mark);
  int64_t resumed = resumed_t_ns(log, running < 0 ? INT64_MIN : running, next_begin);
  restart.detect_ms = span_ms(death, first_failed);
  restart.save_ms = span_ms(first_failed, last_saved);
  restart.restart_ms = span_ms(mark->begin_t_ns, mark->spawn_t_ns);
  restart.start_restore_ms = span_ms(mark->spawn_t_ns, last_restored);
  restart.redo_ms = span_ms(last_restored, resumed);
  restart.total_ms = span_ms(death, resumed);
  /* A restart that saved nothing still cost its restart. */
  double save = isnan(restart.slowest_save_ms) ? 0.0 : restart.slowest_save_ms;
  restart.restart_cost_ms = span_ms(death, last_restored) - save;
  if (!(restart.restart_cost_ms >= 0.0)) restart.restart_cost_ms = NAN;
  restart.redo_minibatches = redo_minibatches(&restart);
  *restart_p = restart;
}
