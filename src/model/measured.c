/* Reads the model's inputs from a keel events file (docs/RUNTIME.md): recovery lines give
 * the checkpoint (state transfer) and fixed recovery costs, job restarts (restart.c puts them
 * together) the just-in-time save and restart costs, progress lines the minibatch time, the
 * in-memory tier's lines (docs/MEMORY.md) its snapshot size, interval, save and restore
 * times and the disk's speeds. Each line is parsed with jansson; a line that is not one JSON
 * object is skipped, never trusted. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

/* Status lines are under 4 KiB; launcher lines carry a program path. Longer is not ours. */
#define LINE_MAXIMUM (64 * 1024)
/* Progress is tracked per uid in a table indexed by uid; uids past it are not sampled. */
#define UID_MAXIMUM KEEL__MODEL_UID_MAXIMUM
/* Distinct recoveries remembered for deduplication; later ones still count, undeduplicated. */
#define RECOVERY_MAXIMUM 4096

typedef struct progress_mark {
  bool seen;
  int64_t epoch;
  int64_t step;
  int64_t t_ns;
} progress_mark;

/* A uid's last mem_save line: the next one tells how many steps its saves between took. */
typedef struct snapshot_mark {
  bool seen;
  int64_t step;
  int64_t saves;
} snapshot_mark;

/* What the reader remembers of each uid until the job ends. */
typedef struct uid_marks {
  progress_mark progress;
  snapshot_mark snapshot;
} uid_marks;

/* One recovery's split, in milliseconds, as the slowest rank reported it. */
typedef struct recovery_mark {
  int64_t new_epoch;
  double fixed_ms;    /* detect + revoke + agree + rebuild */
  double transfer_ms; /* state_transfer */
  double redo_ms;
  int64_t redo_minibatches; /* -1: not given */
} recovery_mark;

typedef struct measure_context {
  uid_marks *marks;          /* UID_MAXIMUM entries */
  recovery_mark *recoveries; /* RECOVERY_MAXIMUM entries */
  size_t recovery_count;     /* entries used */
  /* Recoveries no later line can merge with (an earlier job's, or past the table), summed. */
  size_t settled_count;
  double settled_fixed_ms, settled_transfer_ms, settled_redo_ms;
  size_t settled_transfers;
  double settled_redo_minibatches;
  keel__restart_log *restart_log; /* the current job's restarts */
  /* Restarts put together (at each job's end): the caller's array, and sums for the means. */
  keel_model_restart *restarts;
  size_t restart_capacity;
  double restart_save_ms, restart_cost_ms, restart_redo_minibatches;
  double step_ns_sum;
  size_t step_count;
  /* Sums of the in-memory tier's lines, for the means. */
  double save_ms_sum, wait_ms_sum;
  double memory_restore_ms_sum, memory_restore_bytes_sum;
  double disk_restore_ms_sum, disk_restore_bytes_sum;
  double persist_ms_sum;
  keel_model_measured measured; /* counts; the means are computed at the end */
} measure_context;

/* ---- members of an event: false, output untouched, when the member is absent or of
 * another type. Integers must be written as integers (12.0 is not a step); numbers are
 * finite (jansson refuses nan and inf, and a real that overflows). */

static bool member_int(const json_t *event, const char *key, int64_t *value_p) {
  const json_t *value = json_object_get(event, key);
  if (!json_is_integer(value)) return false;
  *value_p = json_integer_value(value);
  return true;
}

static bool member_double(const json_t *event, const char *key, double *value_p) {
  const json_t *value = json_object_get(event, key);
  if (!json_is_number(value) || !isfinite(json_number_value(value))) return false;
  *value_p = json_number_value(value);
  return true;
}

static bool member_string_is(const json_t *event, const char *key, const char *text) {
  const char *value = json_string_value(json_object_get(event, key));
  return value != NULL && strcmp(value, text) == 0;
}

/* ---- the events */

/* A time split in milliseconds: present, finite and not negative, or the line is refused. */
static bool member_milliseconds(const json_t *event, const char *key, double *value_p) {
  return member_double(event, key, value_p) && *value_p >= 0.0;
}

static void recovery_settle(measure_context *context, const recovery_mark *mark) {
  context->settled_count++;
  context->settled_fixed_ms += mark->fixed_ms;
  context->settled_redo_ms += mark->redo_ms;
  /* A shrink moves no state: its zero says nothing about what a save costs. */
  if (mark->transfer_ms > 0.0) {
    context->settled_transfer_ms += mark->transfer_ms;
    context->settled_transfers++;
  }
  if (mark->redo_minibatches >= 0) {
    context->measured.redo_recoveries++;
    context->settled_redo_minibatches += (double)mark->redo_minibatches;
  }
}

/* Puts the job's restarts together, hands them to the caller's array while it has room and
 * adds them to the sums of the means. */
static void restarts_settle(measure_context *context) {
  keel__restart_log *log = context->restart_log;
  keel_model_measured *measured = &context->measured;
  for (size_t i = 0; i < log->restart_count; i++) {
    keel_model_restart restart;
    keel__restart_assemble(log, i, &restart);
    if (measured->restarts < context->restart_capacity)
      context->restarts[measured->restarts] = restart;
    measured->restarts++;
    if (!isnan(restart.slowest_save_ms)) {
      measured->saved_restarts++;
      context->restart_save_ms += restart.slowest_save_ms;
    }
    if (!isnan(restart.restart_cost_ms)) {
      measured->costed_restarts++;
      context->restart_cost_ms += restart.restart_cost_ms;
    }
    if (restart.redo_minibatches >= 0) {
      measured->redo_restarts++;
      context->restart_redo_minibatches += (double)restart.redo_minibatches;
    }
    if (restart.started_over) measured->started_over++;
  }
  keel__restart_log_clear(log);
}

/* A new job in the same file (runs appended to one events file) numbers its epochs, uids
 * and restarts afresh: what came before can no longer merge with what follows. */
static bool job_start(measure_context *context, const json_t *event) {
  for (size_t i = 0; i < context->recovery_count; i++)
    recovery_settle(context, &context->recoveries[i]);
  context->recovery_count = 0;
  memset(context->marks, 0, UID_MAXIMUM * sizeof *context->marks);
  restarts_settle(context);
  return true;
}

/* Several ranks may report one recovery: keep the slowest, since the job waits for it. */
static void recovery_keep(measure_context *context, const recovery_mark *mark) {
  for (size_t i = 0; i < context->recovery_count; i++) {
    recovery_mark *old = &context->recoveries[i];
    if (old->new_epoch != mark->new_epoch) continue;
    int64_t redo = old->redo_minibatches > mark->redo_minibatches ? old->redo_minibatches
                                                                  : mark->redo_minibatches;
    if (mark->fixed_ms + mark->transfer_ms > old->fixed_ms + old->transfer_ms) *old = *mark;
    old->redo_minibatches = redo;
    return;
  }
  if (context->recovery_count < RECOVERY_MAXIMUM)
    context->recoveries[context->recovery_count++] = *mark;
  else
    recovery_settle(context, mark);
}

static bool scan_recovery(measure_context *context, const json_t *event) {
  double detect, revoke, agree, rebuild, transfer, redo;
  recovery_mark mark;
  if (!member_milliseconds(event, "detect_ms", &detect) ||
      !member_milliseconds(event, "revoke_ms", &revoke) ||
      !member_milliseconds(event, "agree_ms", &agree) ||
      !member_milliseconds(event, "rebuild_ms", &rebuild) ||
      !member_milliseconds(event, "state_transfer_ms", &transfer) ||
      !member_milliseconds(event, "redo_ms", &redo))
    return false;
  /* Without an epoch the line is its own recovery: -1 - count never matches a real one. */
  if (!member_int(event, "new_epoch", &mark.new_epoch))
    mark.new_epoch = -1 - (int64_t)context->recovery_count;
  mark.fixed_ms = detect + revoke + agree + rebuild;
  mark.transfer_ms = transfer;
  mark.redo_ms = redo;
  /* In-process JIT says whether the minibatch was redone; older lines do not. */
  if (!member_int(event, "redo_minibatches", &mark.redo_minibatches) || mark.redo_minibatches < 0)
    mark.redo_minibatches = -1;
  recovery_keep(context, &mark);
  return true;
}

/* Minibatch time from two progress lines of one uid: only within one epoch (a recovery
 * between them is not training) and only when the step moved forward (a redo repeats one). */
static bool scan_progress(measure_context *context, const json_t *event) {
  int64_t uid, epoch = 0, step, t_ns;
  if (!member_int(event, "uid", &uid) || !member_int(event, "step", &step) ||
      !member_int(event, "t_ns", &t_ns) || t_ns < 0 || step < 0)
    return false;
  (void)member_int(event, "epoch", &epoch);
  if (uid < 0 || uid >= UID_MAXIMUM) return true;
  progress_mark *mark = &context->marks[uid].progress;
  if (mark->seen && mark->epoch == epoch && step > mark->step && t_ns > mark->t_ns) {
    context->step_ns_sum += (double)(t_ns - mark->t_ns);
    context->step_count += (size_t)(step - mark->step);
  }
  *mark = (progress_mark){.seen = true, .epoch = epoch, .step = step, .t_ns = t_ns};
  return true;
}

/* ---- the in-memory tier (docs/MEMORY.md) */

/* A count or a size: an integer, not negative. */
static bool member_count(const json_t *event, const char *key, int64_t *value_p) {
  return member_int(event, key, value_p) && *value_p >= 0;
}

static void state_bytes_keep(measure_context *context, int64_t bytes) {
  if ((uint64_t)bytes > context->measured.mem_state_bytes)
    context->measured.mem_state_bytes = (uint64_t)bytes;
}

/* E from two saves of one process: the steps between them over the saves between them, when
 * they divide evenly (a rollback between them makes them not, and says nothing of E). */
static void snapshot_interval_learn(measure_context *context, const json_t *event, int64_t step,
                                    int64_t saves) {
  int64_t uid;
  if (!member_int(event, "uid", &uid) || uid < 0 || uid >= UID_MAXIMUM) return;
  snapshot_mark *mark = &context->marks[uid].snapshot;
  int64_t steps = step - mark->step, between = saves - mark->saves;
  if (mark->seen && context->measured.mem_every_steps == 0 && steps > 0 && between > 0 &&
      steps % between == 0)
    context->measured.mem_every_steps = steps / between;
  *mark = (snapshot_mark){.seen = true, .step = step, .saves = saves};
}

static bool scan_mem_save(measure_context *context, const json_t *event) {
  int64_t step, bytes, saves;
  double save_ms, wait_ms;
  if (!member_count(event, "step", &step) || !member_count(event, "bytes", &bytes) ||
      !member_int(event, "saves", &saves) || saves < 1 ||
      !member_milliseconds(event, "save_ms", &save_ms) ||
      !member_milliseconds(event, "wait_ms", &wait_ms))
    return false;
  context->measured.mem_saves++;
  context->save_ms_sum += save_ms;
  context->wait_ms_sum += wait_ms;
  state_bytes_keep(context, bytes);
  snapshot_interval_learn(context, event, step, saves);
  return true;
}

/* A restore from the node's memory or a peer's ("local", "node-<i>") or from disk
 * ("persistent"); a tier this reader does not know is a valid line it does not count. */
static bool scan_mem_restore(measure_context *context, const json_t *event) {
  int64_t step, bytes;
  double restore_ms;
  const char *from = json_string_value(json_object_get(event, "from"));
  if (from == NULL || !member_count(event, "step", &step) ||
      !member_count(event, "bytes", &bytes) ||
      !member_milliseconds(event, "restore_ms", &restore_ms))
    return false;
  keel_model_measured *measured = &context->measured;
  state_bytes_keep(context, bytes);
  if (strcmp(from, "persistent") == 0) {
    measured->disk_restores++;
    context->disk_restore_ms_sum += restore_ms;
    context->disk_restore_bytes_sum += (double)bytes;
  } else if (strcmp(from, "local") == 0 || strncmp(from, "node-", 5) == 0) {
    measured->memory_restores++;
    context->memory_restore_ms_sum += restore_ms;
    context->memory_restore_bytes_sum += (double)bytes;
  }
  return true;
}

/* One node's snapshot service at the end: what it wrote to the persistent tier, how long. */
static bool scan_mem_service_end(measure_context *context, const json_t *event) {
  int64_t bytes;
  double persist_ms;
  if (!member_count(event, "persisted_bytes", &bytes) ||
      !member_milliseconds(event, "persist_ms", &persist_ms))
    return false;
  context->measured.mem_services++;
  context->measured.persisted_bytes += (uint64_t)bytes;
  context->persist_ms_sum += persist_ms;
  return true;
}

/* ---- the events of job restarts, kept in the restart log until the job ends */

static bool scan_time(const json_t *event, int64_t *t_ns_p) {
  return member_int(event, "t_ns", t_ns_p) && *t_ns_p >= 0;
}

/* The death record of the line's uid; NULL when it names none the table holds. */
static keel__death_mark *death_mark(measure_context *context, const json_t *event) {
  int64_t uid;
  if (!member_int(event, "uid", &uid) || uid < 0 || uid >= UID_MAXIMUM) return NULL;
  return &context->restart_log->deaths[uid];
}

static bool scan_exit(measure_context *context, const json_t *event) {
  int64_t code = 0, t_ns;
  bool signalled = json_object_get(event, "signal") != NULL;
  bool coded = member_int(event, "code", &code);
  if (signalled || (coded && code != 0)) context->measured.failed_exits++;
  keel__death_mark *death = death_mark(context, event);
  if (death == NULL || !scan_time(event, &t_ns)) return true;
  death->exit_t_ns = t_ns;
  death->exit_failed = signalled || (coded && code != 0 && code != KEEL__MODEL_EXIT_RESTART);
  return true;
}

/* A fault line is written just before the fault fires: the death when the fault ends the
 * process or hangs it (a delay or a corrupted snapshot does neither). */
static bool scan_fault(measure_context *context, const json_t *event) {
  int64_t t_ns;
  context->measured.faults++;
  bool fatal = member_string_is(event, "action", "kill") ||
               member_string_is(event, "action", "exit") ||
               member_string_is(event, "action", "stop");
  keel__death_mark *death = death_mark(context, event);
  if (fatal && death != NULL && death->fault_t_ns < 0 && scan_time(event, &t_ns))
    death->fault_t_ns = t_ns;
  return true;
}

/* restart_begin and restart lines of one restart number fill one record. */
static bool scan_restart(measure_context *context, const json_t *event) {
  int64_t number, t_ns;
  if (!member_int(event, "restart", &number) || !scan_time(event, &t_ns)) return false;
  keel__restart_mark *mark = keel__restart_log_mark(context->restart_log, number);
  if (mark == NULL) return true;
  if (member_string_is(event, "event", "restart_begin")) {
    mark->begin_t_ns = t_ns;
    (void)member_int(event, "failed_uid", &mark->failed_uid);
    const char *reason = json_string_value(json_object_get(event, "reason"));
    if (reason != NULL) snprintf(mark->reason, sizeof mark->reason, "%s", reason);
  } else {
    mark->spawn_t_ns = t_ns;
    (void)member_int(event, "first_uid", &mark->first_uid);
    (void)member_int(event, "world", &mark->world);
  }
  return true;
}

static bool scan_jit_save(measure_context *context, const json_t *event) {
  keel__save_mark save = {.t_failed_ns = -1};
  int64_t bytes = 0;
  if (!scan_time(event, &save.t_ns) || !member_int(event, "step", &save.step) || save.step < 0 ||
      !member_milliseconds(event, "save_ms", &save.save_ms))
    return false;
  (void)member_int(event, "t_failed_ns", &save.t_failed_ns);
  if (member_int(event, "bytes", &bytes) && bytes > 0) save.bytes = (uint64_t)bytes;
  save.ok = member_string_is(event, "status", "ok");
  keel__restart_log *log = context->restart_log;
  if (log->save_count < KEEL__MODEL_RANK_EVENT_MAXIMUM) log->saves[log->save_count++] = save;
  return true;
}

static bool scan_jit_restore(measure_context *context, const json_t *event) {
  keel__restore_mark restore = {.step = -1, .restore_ms = NAN};
  if (!scan_time(event, &restore.t_ns) || !member_int(event, "restart", &restore.restart))
    return false;
  restore.ok = member_string_is(event, "status", "ok");
  if (restore.ok && (!member_int(event, "step", &restore.step) || restore.step < 0)) return false;
  double restore_ms;
  if (member_milliseconds(event, "restore_ms", &restore_ms)) restore.restore_ms = restore_ms;
  keel__restart_log *log = context->restart_log;
  if (log->restore_count < KEEL__MODEL_RANK_EVENT_MAXIMUM)
    log->restores[log->restore_count++] = restore;
  return true;
}

static bool scan_resumed(measure_context *context, const json_t *event) {
  keel__resumed_mark resumed = {.in_process = member_string_is(event, "kind", "in-process")};
  if (!scan_time(event, &resumed.t_ns)) return false;
  keel__restart_log *log = context->restart_log;
  if (log->resumed_count < KEEL__MODEL_RESTART_MAXIMUM)
    log->resumed[log->resumed_count++] = resumed;
  return true;
}

/* ---- lines */

static const struct {
  const char *event;
  bool (*scan)(measure_context *context, const json_t *event);
} scanners[] = {
    {"recovery", scan_recovery},
    {"progress", scan_progress},
    {"exit", scan_exit},
    {"fault", scan_fault},
    {"job_start", job_start},
    {"restart_begin", scan_restart},
    {"restart", scan_restart},
    {"jit_save", scan_jit_save},
    {"jit_restore", scan_jit_restore},
    {"resumed", scan_resumed},
    {"mem_save", scan_mem_save},
    {"mem_restore", scan_mem_restore},
    {"mem_service_end", scan_mem_service_end},
};

/* One event; false when it has no "event" string or a scanner refuses it. Unknown events
 * are fine. */
static bool scan_event(measure_context *context, const json_t *event) {
  const char *name = json_string_value(json_object_get(event, "event"));
  if (name == NULL) return false;
  for (size_t i = 0; i < sizeof scanners / sizeof scanners[0]; i++)
    if (strcmp(name, scanners[i].event) == 0) return scanners[i].scan(context, event);
  return true;
}

/* One line; false when it is malformed (counted as skipped): not one JSON object, or an
 * event refused. A line jansson cannot parse for want of memory is skipped the same way. */
static bool scan_line(measure_context *context, const char *line) {
  json_t *event = json_loads(line, 0, NULL);
  if (event == NULL) return false;
  bool scanned = json_is_object(event) && scan_event(context, event);
  json_decref(event);
  return scanned;
}

static double mean(double sum, size_t count) { return count > 0 ? sum / (double)count : 0.0; }

/* The in-memory tier's means; the disk's read speed is bytes over time, not a mean of
 * speeds, so that a short restore does not weigh as much as a long one. */
static void memory_tier_finish(measure_context *context) {
  keel_model_measured *measured = &context->measured;
  measured->mem_save_s = mean(context->save_ms_sum / 1e3, measured->mem_saves);
  measured->mem_wait_s = mean(context->wait_ms_sum / 1e3, measured->mem_saves);
  measured->memory_restore_s =
      mean(context->memory_restore_ms_sum / 1e3, measured->memory_restores);
  measured->memory_restore_bytes =
      mean(context->memory_restore_bytes_sum, measured->memory_restores);
  measured->disk_restore_s = mean(context->disk_restore_ms_sum / 1e3, measured->disk_restores);
  if (context->disk_restore_ms_sum > 0.0)
    measured->disk_read_bytes_per_s =
        context->disk_restore_bytes_sum / (context->disk_restore_ms_sum / 1e3);
  measured->persist_s = context->persist_ms_sum / 1e3;
}

/* Turns the sums into the means of keel_model_measured. */
static void measure_finish(measure_context *context) {
  keel_model_measured *measured = &context->measured;
  job_start(context, NULL); /* settles the last job's recoveries and restarts */
  size_t count = context->settled_count, transfers = context->settled_transfers;
  measured->recoveries = count;
  measured->state_recoveries = transfers;
  if (count > 0) {
    measured->restart_cost_s = context->settled_fixed_ms / 1e3 / (double)count;
    measured->redo_s = context->settled_redo_ms / 1e3 / (double)count;
    /* keel's own recovery is in-process: all of it but the redo is its fixed cost. */
    measured->inprocess_recovery_s =
        (context->settled_fixed_ms + context->settled_transfer_ms) / 1e3 / (double)count;
  }
  if (transfers > 0)
    measured->checkpoint_cost_s = context->settled_transfer_ms / 1e3 / (double)transfers;
  measured->minibatch_samples = context->step_count;
  if (context->step_count > 0)
    measured->minibatch_s = context->step_ns_sum / 1e9 / (double)context->step_count;
  measured->recovery_redo_minibatches =
      mean(context->settled_redo_minibatches, measured->redo_recoveries);
  measured->jit_save_s = mean(context->restart_save_ms / 1e3, measured->saved_restarts);
  measured->jit_restart_cost_s = mean(context->restart_cost_ms / 1e3, measured->costed_restarts);
  measured->restart_redo_minibatches =
      mean(context->restart_redo_minibatches, measured->redo_restarts);
  memory_tier_finish(context);
}

/* Reads the rest of an overlong line so the next read starts at the next line. */
static void discard_rest_of_line(FILE *file) {
  int c;
  while ((c = fgetc(file)) != EOF && c != '\n') {
  }
}

static bool line_is_blank(const char *line) { return line[strspn(line, " \t\r\n")] == '\0'; }

static keel_status measure_stream(measure_context *context, FILE *file, char *line) {
  while (fgets(line, LINE_MAXIMUM + 2, file) != NULL) {
    size_t length = strlen(line);
    bool whole = length > 0 && line[length - 1] == '\n';
    if (!whole && length > LINE_MAXIMUM) {
      discard_rest_of_line(file);
      context->measured.lines++;
      context->measured.skipped_lines++;
      continue;
    }
    if (line_is_blank(line)) continue;
    context->measured.lines++;
    if (!scan_line(context, line)) context->measured.skipped_lines++;
  }
  return ferror(file) ? KEEL_EIO : KEEL_OK;
}

keel_status keel_model_measure_file(const char *path, keel_model_measured *measured_p) {
  if (measured_p == NULL) return KEEL_EINVAL;
  return keel_model_measure_restarts(path, measured_p, NULL, 0, NULL);
}

keel_status keel_model_measure_restarts(const char *path, keel_model_measured *measured_p,
                                        keel_model_restart *restarts, size_t capacity,
                                        size_t *restart_count_p) {
  if (path == NULL || (restarts == NULL && capacity > 0)) return KEEL_EINVAL;
  keel_status status = KEEL_ENOMEM;
  measure_context context = {.restarts = restarts, .restart_capacity = capacity};
  FILE *file = NULL;
  char *line = malloc(LINE_MAXIMUM + 2);
  if (line == NULL) goto fail;
  context.marks = calloc(UID_MAXIMUM, sizeof *context.marks);
  if (context.marks == NULL) goto fail_free_line;
  context.recoveries = calloc(RECOVERY_MAXIMUM, sizeof *context.recoveries);
  if (context.recoveries == NULL) goto fail_free_marks;
  context.restart_log = malloc(sizeof *context.restart_log);
  if (context.restart_log == NULL) goto fail_free_recoveries;
  keel__restart_log_clear(context.restart_log);
  file = fopen(path, "r");
  /* Not logged here: the status says what went wrong and the caller, who knows why it
   * read the file, reports it once. */
  if (file == NULL) {
    status = keel_status_from_errno(errno);
    goto fail_free_restart_log;
  }
  status = measure_stream(&context, file, line);
  fclose(file);
  if (status == KEEL_OK) {
    measure_finish(&context);
    if (measured_p != NULL) *measured_p = context.measured;
    if (restart_count_p != NULL) *restart_count_p = context.measured.restarts;
  }
fail_free_restart_log:
  free(context.restart_log);
fail_free_recoveries:
  free(context.recoveries);
fail_free_marks:
  free(context.marks);
fail_free_line:
  free(line);
fail:
  return status;
}
