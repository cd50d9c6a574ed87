/* `keel report EVENTS_FILE`: tells what a job did from its --events file: start and end,
 * the faults injected, each failure, each in-process recovery with its time broken down and
 * the time from the failed process's death to the end of its recovery, and each restart of
 * the whole job (user-level JIT) as libkeel's model puts it together; `--svg FILE` also
 * draws it (report_svg.c). A line that is not one whole JSON object (garbage, a file cut
 * mid-line) is skipped and counted, never trusted. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/model.h"
#include "report_svg.h"
#include "tool.h"

/* Events lines are under 9 KiB (run_status.c); a longer line is garbage. */
#define LINE_MAX_BYTES (64 * 1024)
/* Each kind of record has a hard maximum; further ones are counted, not kept. */
#define MAX_RECORDS 1024
#define MAX_EXITS 4096
#define MAX_FAILED_UIDS 64
#define NS_PER_MS 1e6

typedef struct report_job {
  bool started, ended;
  char job_id[32];
  char program[256];
  char policy[16];
  int64_t world, spares, max_world;
  int64_t start_t_ns, start_wall_ns;
  int64_t code;
  double seconds;
} report_job;

/* An exit or fence of a process that was running (or holding) a rank. */
typedef struct report_failure {
  int64_t t_ns, uid, pid, rank;
  char role[16];
  char outcome[32]; /* "3", "SIGKILL"; empty for a fence whose exit is not in the file */
  char reason[200]; /* a fence's reason; empty otherwise */
} report_failure;

typedef struct report_exit {
  int64_t t_ns, uid;
} report_exit;

/* The breakdown of a recovery line, in the order RUNTIME.md lists it. */
static const char *const phase_keys[] = {"detect_ms",         "revoke_ms", "agree_ms", "rebuild_ms",
                                         "state_transfer_ms", "redo_ms",   "total_ms"};
static const char *const phase_names[] = {"detect",         "revoke", "agree", "rebuild",
                                          "state transfer", "redo",   "total"};
#define PHASE_COUNT (sizeof phase_keys / sizeof phase_keys[0])

typedef struct report_recovery {
  int64_t t_ns;
  int64_t old_epoch, new_epoch, old_world, new_world, replaced;
  char policy[16];
  int64_t failed[MAX_FAILED_UIDS];
  size_t failed_count;
  double phase_ms[PHASE_COUNT]; /* negative: missing from the line */
  int64_t redo_minibatches;     /* in-process JIT: 0 or 1; -1: missing from the line */
} report_recovery;

/* A restart's breakdown (keel_model_restart), in the order the report prints it. */
static const char *const restart_phase_keys[] = {
    "detect_ms", "save_ms", "restart_ms", "restore_ms", "start_restore_ms", "redo_ms", "total_ms"};
static const char *const restart_phase_names[] = {"detect",        "save", "restart", "restore",
                                                  "start+restore", "redo", "total"};
#define RESTART_PHASE_COUNT (sizeof restart_phase_keys / sizeof restart_phase_keys[0])

static void restart_phases(const keel_model_restart *restart, double ms[RESTART_PHASE_COUNT]) {
  const double phases[] = {restart->detect_ms,  restart->save_ms,          restart->restart_ms,
                           restart->restore_ms, restart->start_restore_ms, restart->redo_ms,
                           restart->total_ms};
  _Static_assert(sizeof phases / sizeof phases[0] == RESTART_PHASE_COUNT, "one value a phase");
  memcpy(ms, phases, sizeof phases);
}

/* rank 0's line once the first minibatch after a recovery has completed. */
typedef struct report_resumed {
  int64_t t_ns, epoch;
  bool in_process;
} report_resumed;

/* A phase missing from its line is negative, one the model could not measure NaN: either
 * is shown as unknown, never as a figure (nan would not be JSON in --json). */
static bool phase_known(double ms) { return isfinite(ms) && ms >= 0; }

typedef struct report_fault {
  int64_t t_ns, uid, step;
  char action[16], point[32];
} report_fault;

typedef struct report_data {
  report_job job;
  report_failure failures[MAX_RECORDS];
  report_recovery recoveries[MAX_RECORDS];
  report_fault faults[MAX_RECORDS];
  report_exit exits[MAX_EXITS];
  report_resumed resumed[MAX_RECORDS];
  keel_model_restart restarts[MAX_RECORDS];
  size_t failure_count, recovery_count, fault_count, exit_count, resumed_count;
  size_t restart_count; /* restarts in the file; those past MAX_RECORDS are not kept */
  size_t idle_stopped;  /* spares and joiners that ended badly without ever holding a rank */
  size_t spawned_workers, spawned_spares, spawned_joiners;
  size_t joins_accepted, joins_refused; /* join_request events (`keel join`) */
  size_t lines, skipped, not_kept;
  bool have_origin;
  int64_t origin_t_ns;      /* times are shown from here: job_start, else the first event */
  keel__timeline *timeline; /* --svg: every event goes to it too; NULL otherwise */
  char line[LINE_MAX_BYTES];
} report_data;

/* ---- reading events */

static void job_start_read(report_data *data, const json_t *event, int64_t t_ns) {
  report_job *job = &data->job;
  job->started = true;
  job->start_t_ns = t_ns;
  job->start_wall_ns = keel__json_int_or(event, "wall_ns", 0);
  keel__json_string(event, "job_id", job->job_id, sizeof job->job_id);
  keel__json_string(event, "program", job->program, sizeof job->program);
  keel__json_string(event, "on_failure", job->policy, sizeof job->policy);
  job->world = keel__json_int_or(event, "world", 0);
  job->spares = keel__json_int_or(event, "spares", 0);
  job->max_world = keel__json_int_or(event, "max_world", job->world);
  data->origin_t_ns = t_ns;
  data->have_origin = true;
}

static void job_end_read(report_data *data, const json_t *event) {
  data->job.ended = true;
  data->job.code = keel__json_int_or(event, "code", -1);
  keel__json_double(event, "seconds", &data->job.seconds);
}

static report_failure *failure_add(report_data *data, const json_t *event, int64_t t_ns) {
  if (data->failure_count == MAX_RECORDS) {
    data->not_kept++;
    return NULL;
  }
  report_failure *failure = &data->failures[data->failure_count++];
  *failure = (report_failure){.t_ns = t_ns, .rank = -1};
  failure->uid = keel__json_int_or(event, "uid", -1);
  failure->pid = keel__json_int_or(event, "pid", -1);
  keel__json_string(event, "role", failure->role, sizeof failure->role);
  return failure;
}

static void fence_read(report_data *data, const json_t *event, int64_t t_ns) {
  report_failure *failure = failure_add(data, event, t_ns);
  if (failure != NULL) keel__json_string(event, "reason", failure->reason, sizeof failure->reason);
}

/* A fenced process's exit completes its fence's record rather than making a second one. */
static report_failure *fence_of(report_data *data, int64_t uid) {
  for (size_t i = data->failure_count; i > 0; i--) {
    report_failure *failure = &data->failures[i - 1];
    if (failure->uid == uid && failure->reason[0] != '\0' && failure->outcome[0] == '\0')
      return failure;
  }
  return NULL;
}

static void exit_read(report_data *data, const json_t *event, int64_t t_ns) {
  int64_t uid = keel__json_int_or(event, "uid", -1), rank = keel__json_int_or(event, "rank", -1);
  if (data->exit_count < MAX_EXITS)
    data->exits[data->exit_count++] = (report_exit){.t_ns = t_ns, .uid = uid};
  else
    data->not_kept++;
  char outcome[32] = "";
  if (!keel__json_string(event, "signal", outcome, sizeof outcome))
    snprintf(outcome, sizeof outcome, "%lld", (long long)keel__json_int_or(event, "code", 0));
  bool fenced = json_is_true(json_object_get(event, "fenced"));
  if (strcmp(outcome, "0") == 0 && !fenced) return;
  /* A spare or joiner that never held a rank and ends badly was idle: most are the ones
   * the launcher stops at the end of the job. */
  if (rank < 0 && !fenced) {
    data->idle_stopped++;
    return;
  }
  report_failure *failure = fenced ? fence_of(data, uid) : NULL;
  if (failure == NULL) failure = failure_add(data, event, t_ns);
  if (failure == NULL) return;
  failure->rank = rank;
  if (failure->role[0] == '\0')
    keel__json_string(event, "role", failure->role, sizeof failure->role);
  snprintf(failure->outcome, sizeof failure->outcome, "%s", outcome);
}

static void recovery_read(report_data *data, const json_t *event, int64_t t_ns) {
  if (data->recovery_count == MAX_RECORDS) {
    data->not_kept++;
    return;
  }
  report_recovery *recovery = &data->recoveries[data->recovery_count++];
  *recovery = (report_recovery){.t_ns = t_ns};
  recovery->old_epoch = keel__json_int_or(event, "old_epoch", -1);
  recovery->new_epoch = keel__json_int_or(event, "new_epoch", -1);
  recovery->old_world = keel__json_int_or(event, "old_world", -1);
  recovery->new_world = keel__json_int_or(event, "new_world", -1);
  recovery->replaced = keel__json_int_or(event, "replaced", 0);
  keel__json_string(event, "policy", recovery->policy, sizeof recovery->policy);
  recovery->failed_count = keel__json_int_array(event, "failed", recovery->failed, MAX_FAILED_UIDS);
  for (size_t i = 0; i < PHASE_COUNT; i++) {
    recovery->phase_ms[i] = -1;
    keel__json_double(event, phase_keys[i], &recovery->phase_ms[i]);
  }
  recovery->redo_minibatches = keel__json_int_or(event, "redo_minibatches", -1);
}

static void resumed_read(report_data *data, const json_t *event, int64_t t_ns) {
  if (data->resumed_count == MAX_RECORDS) {
    data->not_kept++;
    return;
  }
  char kind[16] = "";
  keel__json_string(event, "kind", kind, sizeof kind);
  data->resumed[data->resumed_count++] =
      (report_resumed){.t_ns = t_ns,
                       .epoch = keel__json_int_or(event, "epoch", -1),
                       .in_process = strcmp(kind, "in-process") == 0};
}

static void fault_read(report_data *data, const json_t *event, int64_t t_ns) {
  if (data->fault_count == MAX_RECORDS) {
    data->not_kept++;
    return;
  }
  report_fault *fault = &data->faults[data->fault_count++];
  *fault = (report_fault){.t_ns = t_ns};
  fault->uid = keel__json_int_or(event, "uid", -1);
  fault->step = keel__json_int_or(event, "step", -1);
  keel__json_string(event, "action", fault->action, sizeof fault->action);
  keel__json_string(event, "point", fault->point, sizeof fault->point);
}

static void spawn_read(report_data *data, const json_t *event) {
  char role[16] = "";
  keel__json_string(event, "role", role, sizeof role);
  if (strcmp(role, "worker") == 0) data->spawned_workers++;
  if (strcmp(role, "spare") == 0) data->spawned_spares++;
  if (strcmp(role, "joiner") == 0) data->spawned_joiners++;
}

static void join_request_read(report_data *data, const json_t *event) {
  if (json_is_true(json_object_get(event, "accepted")))
    data->joins_accepted++;
  else
    data->joins_refused++;
}

/* One event of the file; false when it lacks an "event" name or a "t_ns" time. A negative
 * t_ns is no monotonic time either: refused, which also keeps every difference of two
 * times within int64_t. */
static bool event_read(report_data *data, const json_t *event) {
  char name[32];
  int64_t t_ns;
  if (!keel__json_string(event, "event", name, sizeof name) ||
      !keel__json_int(event, "t_ns", &t_ns) || t_ns < 0)
    return false;
  if (!data->have_origin) {
    data->origin_t_ns = t_ns;
    data->have_origin = true;
  }
  if (strcmp(name, "job_start") == 0) job_start_read(data, event, t_ns);
  if (strcmp(name, "job_end") == 0) job_end_read(data, event);
  if (strcmp(name, "fence") == 0) fence_read(data, event, t_ns);
  if (strcmp(name, "exit") == 0) exit_read(data, event, t_ns);
  if (strcmp(name, "recovery") == 0) recovery_read(data, event, t_ns);
  if (strcmp(name, "fault") == 0) fault_read(data, event, t_ns);
  if (strcmp(name, "spawn") == 0) spawn_read(data, event);
  if (strcmp(name, "join_request") == 0) join_request_read(data, event);
  if (strcmp(name, "resumed") == 0) resumed_read(data, event, t_ns);
  if (data->timeline != NULL) keel__timeline_event(data->timeline, name, event, t_ns);
  return true;
}

/* One events line (length bytes, newline removed): skipped unless it is one whole JSON
 * object with an event name and a time. */
static void line_read(report_data *data, const char *line, size_t length) {
  json_t *event = keel__json_object_parse(line, length);
  if (event == NULL || !event_read(data, event)) data->skipped++;
  json_decref(event);
}

/* Reads the next line into line (NUL-terminated, newline removed). *bad_p: it was too
 * long or held a NUL byte (its rest is consumed). Returns false at the end of the file. */
static bool line_next(FILE *file, char *line, size_t capacity, bool *bad_p) {
  size_t length = 0;
  int c;
  *bad_p = false;
  while ((c = getc(file)) != EOF && c != '\n') {
    if (c == '\0' || length + 1 >= capacity) {
      *bad_p = true;
      continue;
    }
    line[length++] = (char)c;
  }
  line[length] = '\0';
  return c != EOF || length > 0 || *bad_p;
}

/* Reads every line; false on a read error. */
static bool events_read(FILE *file, report_data *data) {
  bool bad;
  while (line_next(file, data->line, sizeof data->line, &bad)) {
    data->lines++;
    size_t length = strlen(data->line);
    if (length > 0 && data->line[length - 1] == '\r') data->line[--length] = '\0';
    if (bad)
      data->skipped++;
    else if (length > 0)
      line_read(data, data->line, length);
  }
  return !ferror(file);
}

/* ---- an in-process recovery's figures from death: its death is the first exit among its
 * failed uids at or before the recovery line. false when none of them exited. */
static bool recovery_death_t_ns(const report_data *data, const report_recovery *recovery,
                                int64_t *death_p) {
  bool found = false;
  int64_t death = 0;
  for (size_t e = 0; e < data->exit_count; e++) {
    const report_exit *exit_record = &data->exits[e];
    if (exit_record->t_ns > recovery->t_ns || (found && exit_record->t_ns >= death)) continue;
    for (size_t f = 0; f < recovery->failed_count; f++) {
      if (recovery->failed[f] != exit_record->uid) continue;
      death = exit_record->t_ns;
      found = true;
    }
  }
  if (found) *death_p = death;
  return found;
}

/* From the recovery's death to the recovery line. */
static bool death_to_recovered_ms(const report_data *data, const report_recovery *recovery,
                                  double *ms_p) {
  int64_t death;
  if (!recovery_death_t_ns(data, recovery, &death)) return false;
  *ms_p = (double)(recovery->t_ns - death) / NS_PER_MS;
  return true;
}

/* The resumed line of an in-process recovery: rank 0 writes it in the recovery's new epoch. */
static const report_resumed *recovery_resumed(const report_data *data,
                                              const report_recovery *recovery) {
  for (size_t i = 0; i < data->resumed_count; i++) {
    const report_resumed *resumed = &data->resumed[i];
    if (resumed->in_process && resumed->epoch == recovery->new_epoch &&
        resumed->t_ns >= recovery->t_ns)
      return resumed;
  }
  return NULL;
}

/* From the recovery's death to its resumed line; false when either is missing. */
static bool death_to_resumed_ms(const report_data *data, const report_recovery *recovery,
                                double *ms_p) {
  const report_resumed *resumed = recovery_resumed(data, recovery);
  int64_t death;
  if (resumed == NULL || !recovery_death_t_ns(data, recovery, &death)) return false;
  *ms_p = (double)(resumed->t_ns - death) / NS_PER_MS;
  return true;
}

/* ---- the human summary */
static double seconds_since_origin(const report_data *data, int64_t t_ns) {
  return (double)(t_ns - data->origin_t_ns) / 1e9;
}

static void uid_list_print(FILE *out, const int64_t *uids, size_t count) {
  fputc('[', out);
  for (size_t i = 0; i < count; i++) fprintf(out, i ? ",%lld" : "%lld", (long long)uids[i]);
  fputc(']', out);
}

static void job_print(FILE *out, const report_job *job) {
  if (!job->started) {
    fprintf(out, "job: no job_start event (the file is cut, or not from keel run --events)\n");
  } else {
    const char *name = strrchr(job->program, '/');
    fprintf(out, "job %s: %s, %lld workers, %lld spares, max world %lld, on failure %s\n",
            job->job_id[0] ? job->job_id : "?", name ? name + 1 : job->program,
            (long long)job->world, (long long)job->spares, (long long)job->max_world,
            job->policy[0] ? job->policy : "?");
    time_t wall = (time_t)(job->start_wall_ns / 1000000000);
    struct tm local;
    char when[64] = "?";
    if (job->start_wall_ns > 0 && localtime_r(&wall, &local) != NULL)
      strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &local);
    fprintf(out, "  started  %s\n", when);
  }
  if (job->ended)
    fprintf(out, "  ended    after %.3f s, exit code %lld\n", job->seconds, (long long)job->code);
  else
    fprintf(out, "  ended    no job_end event (still running, or the launcher was killed)\n");
}

static void processes_print(FILE *out, const report_data *data) {
  fprintf(out, "processes started: %zu workers, %zu spares, %zu joiners", data->spawned_workers,
          data->spawned_spares, data->spawned_joiners);
  if (data->joins_accepted + data->joins_refused > 0)
    fprintf(out, "; keel join requests: %zu accepted, %zu refused", data->joins_accepted,
            data->joins_refused);
  fputc('\n', out);
}

static void faults_print(FILE *out, const report_data *data) {
  fprintf(out, "faults injected: %zu\n", data->fault_count);
  for (size_t i = 0; i < data->fault_count; i++) {
    const report_fault *fault = &data->faults[i];
    fprintf(out, "  %+8.3f s  uid %lld: %s at %s, step %lld\n",
            seconds_since_origin(data, fault->t_ns), (long long)fault->uid,
            fault->action[0] ? fault->action : "?", fault->point[0] ? fault->point : "?",
            (long long)fault->step);
  }
}

static void failures_print(FILE *out, const report_data *data) {
  fprintf(out, "failures: %zu\n", data->failure_count);
  for (size_t i = 0; i < data->failure_count; i++) {
    const report_failure *failure = &data->failures[i];
    fprintf(out, "  %+8.3f s  uid %lld (pid %lld, %s, rank %lld): %s%s%s\n",
            seconds_since_origin(data, failure->t_ns), (long long)failure->uid,
            (long long)failure->pid, failure->role[0] ? failure->role : "?",
            (long long)failure->rank, failure->outcome[0] ? failure->outcome : "killed",
            failure->reason[0] ? ", fenced: " : "", failure->reason);
  }
}

/* One line of figures, "detect 1.0 ms, revoke ?, ...": "?" where a phase is unknown. */
static void phases_print(FILE *out, const char *const *names, const double *ms, size_t count) {
  fprintf(out, "%14s", "");
  for (size_t i = 0; i < count; i++) {
    fprintf(out, "%s%s ", i ? ", " : "", names[i]);
    if (!phase_known(ms[i]))
      fprintf(out, "?");
    else
      fprintf(out, "%.1f ms", ms[i]);
  }
  fputc('\n', out);
}

/* In-process JIT's line: whether the minibatch was redone, and death to its completion. */
static void recovery_resume_print(FILE *out, const report_data *data,
                                  const report_recovery *recovery) {
  bool resumed = recovery_resumed(data, recovery) != NULL;
  if (recovery->redo_minibatches < 0 && !resumed) return;
  fprintf(out, "%14sredo_minibatches ", "");
  if (recovery->redo_minibatches >= 0)
    fprintf(out, "%lld", (long long)recovery->redo_minibatches);
  else
    fprintf(out, "?");
  double ms;
  if (death_to_resumed_ms(data, recovery, &ms))
    fprintf(out, ", death to resumed: %.1f ms", ms);
  else if (resumed && recovery->failed_count > 0)
    fprintf(out, ", death to resumed: n/a (no exit of a failed uid before it)");
  fputc('\n', out);
}

static void recovery_print(FILE *out, const report_data *data, const report_recovery *recovery) {
  fprintf(out, "  %+8.3f s  epoch %lld -> %lld, world %lld -> %lld, policy %s, failed uids ",
          seconds_since_origin(data, recovery->t_ns), (long long)recovery->old_epoch,
          (long long)recovery->new_epoch, (long long)recovery->old_world,
          (long long)recovery->new_world, recovery->policy[0] ? recovery->policy : "?");
  uid_list_print(out, recovery->failed, recovery->failed_count);
  fprintf(out, "%s, replaced %lld\n", recovery->failed_count == 0 ? " (a grow)" : "",
          (long long)recovery->replaced);
  phases_print(out, phase_names, recovery->phase_ms, PHASE_COUNT);
  double ms;
  if (death_to_recovered_ms(data, recovery, &ms))
    fprintf(out, "%14sdeath to recovered: %.1f ms\n", "", ms);
  else if (recovery->failed_count > 0)
    fprintf(out, "%14sdeath to recovered: n/a (no exit of a failed uid before it)\n", "");
  recovery_resume_print(out, data, recovery);
}

static const char *ranks_word(size_t count) { return count == 1 ? "rank" : "ranks"; }

/* "saves: 3 ranks, 1311000 bytes, newest step 151, 1 failed" */
static void restart_saves_print(FILE *out, const keel_model_restart *restart) {
  if (restart->saved_ranks + restart->failed_saves == 0)
    fprintf(out, "saves: none (no jit_save)");
  else if (restart->saved_ranks == 0)
    fprintf(out, "saves: all %zu failed (step %lld)", restart->failed_saves,
            (long long)restart->newest_saved_step);
  else
    fprintf(out, "saves: %zu %s, %llu bytes, newest step %lld", restart->saved_ranks,
            ranks_word(restart->saved_ranks), (unsigned long long)restart->save_bytes,
            (long long)restart->newest_saved_step);
  if (restart->saved_ranks > 0 && restart->failed_saves > 0)
    fprintf(out, ", %zu failed", restart->failed_saves);
}

/* "restored step 150 on 4 ranks, redo_minibatches 2" */
static void restart_restores_print(FILE *out, const keel_model_restart *restart) {
  if (restart->started_over)
    fprintf(out, "no snapshot restored: the job started over at step 0");
  else if (restart->restored_ranks > 0)
    fprintf(out, "restored step %lld on %zu %s", (long long)restart->restored_step,
            restart->restored_ranks, ranks_word(restart->restored_ranks));
  else
    fprintf(out, "no jit_restore");
  if (restart->redo_minibatches >= 0)
    fprintf(out, ", redo_minibatches %lld\n", (long long)restart->redo_minibatches);
  else
    fprintf(out, ", redo_minibatches ?\n");
}

static void restart_print(FILE *out, const report_data *data, const keel_model_restart *restart) {
  if (restart->begin_t_ns >= 0)
    fprintf(out, "  %+8.3f s  ", seconds_since_origin(data, restart->begin_t_ns));
  else
    fprintf(out, "  %10s  ", "?");
  fprintf(out, "restart %lld: uid %lld failed (%s), ", (long long)restart->restart,
          (long long)restart->failed_uid, restart->reason[0] ? restart->reason : "?");
  if (restart->world >= 0)
    fprintf(out, "%lld workers started again as uids %lld-%lld\n", (long long)restart->world,
            (long long)restart->first_uid, (long long)(restart->first_uid + restart->world - 1));
  else
    fprintf(out, "no restart event (its workers were not started again)\n");
  double ms[RESTART_PHASE_COUNT];
  restart_phases(restart, ms);
  phases_print(out, restart_phase_names, ms, RESTART_PHASE_COUNT);
  fprintf(out, "%14s", "");
  restart_saves_print(out, restart);
  fprintf(out, "; ");
  restart_restores_print(out, restart);
}

static void summary_print(FILE *out, const char *path, const report_data *data) {
  fprintf(out, "keel report: %s (%zu lines)\n", path, data->lines);
  job_print(out, &data->job);
  processes_print(out, data);
  faults_print(out, data);
  failures_print(out, data);
  fprintf(out, "recoveries: %zu\n", data->recovery_count);
  for (size_t i = 0; i < data->recovery_count; i++) recovery_print(out, data, &data->recoveries[i]);
  fprintf(out, "restarts: %zu\n", data->restart_count);
  for (size_t i = 0; i < data->restart_count && i < MAX_RECORDS; i++)
    restart_print(out, data, &data->restarts[i]);
  if (data->idle_stopped > 0)
    fprintf(out, "idle spares or joiners ended without a rank: %zu (stopped at the end)\n",
            data->idle_stopped);
  if (data->not_kept > 0) fprintf(out, "events beyond the report's limits: %zu\n", data->not_kept);
  fprintf(out, "skipped lines (not a whole JSON event): %zu\n", data->skipped);
}

/* ---- --json: one object per recovery, then one per restart */
static void json_ms_print(FILE *out, const char *key, double ms) {
  if (!phase_known(ms))
    fprintf(out, ",\"%s\":null", key);
  else
    fprintf(out, ",\"%s\":%.3f", key, ms);
}

static void phases_json_print(FILE *out, const char *const *keys, const double *ms, size_t count) {
  for (size_t i = 0; i < count; i++) json_ms_print(out, keys[i], ms[i]);
}

/* A step or count that -1 marks unknown. */
static void json_count_print(FILE *out, const char *key, int64_t value) {
  if (value < 0)
    fprintf(out, ",\"%s\":null", key);
  else
    fprintf(out, ",\"%s\":%lld", key, (long long)value);
}

static void recovery_json_print(FILE *out, const report_data *data,
                                const report_recovery *recovery) {
  char policy[64];
  keel__json_escape(recovery->policy, policy, sizeof policy);
  fprintf(out,
          "{\"t_ns\":%lld,\"old_epoch\":%lld,\"new_epoch\":%lld,\"old_world\":%lld,"
          "\"new_world\":%lld,\"policy\":\"%s\",\"failed\":",
          (long long)recovery->t_ns, (long long)recovery->old_epoch, (long long)recovery->new_epoch,
          (long long)recovery->old_world, (long long)recovery->new_world, policy);
  uid_list_print(out, recovery->failed, recovery->failed_count);
  fprintf(out, ",\"replaced\":%lld", (long long)recovery->replaced);
  phases_json_print(out, phase_keys, recovery->phase_ms, PHASE_COUNT);
  json_count_print(out, "redo_minibatches", recovery->redo_minibatches);
  double ms;
  json_ms_print(out, "death_to_resumed_ms", death_to_resumed_ms(data, recovery, &ms) ? ms : NAN);
  if (death_to_recovered_ms(data, recovery, &ms))
    fprintf(out, ",\"death_to_recovered_ms\":%.3f}\n", ms);
  else
    fprintf(out, ",\"death_to_recovered_ms\":null}\n");
}

static void restart_json_print(FILE *out, const keel_model_restart *restart) {
  char reason[80];
  keel__json_escape(restart->reason, reason, sizeof reason);
  fprintf(out, "{\"restart\":%lld", (long long)restart->restart);
  json_count_print(out, "t_ns", restart->begin_t_ns);
  json_count_print(out, "failed_uid", restart->failed_uid);
  fprintf(out, ",\"reason\":\"%s\"", reason);
  double ms[RESTART_PHASE_COUNT];
  restart_phases(restart, ms);
  phases_json_print(out, restart_phase_keys, ms, RESTART_PHASE_COUNT);
  json_count_print(out, "restored_step", restart->restored_step);
  json_count_print(out, "newest_saved_step", restart->newest_saved_step);
  json_count_print(out, "redo_minibatches", restart->redo_minibatches);
  fprintf(out,
          ",\"started_over\":%s,\"saved_ranks\":%zu,\"failed_saves\":%zu,"
          "\"restored_ranks\":%zu,\"save_bytes\":%llu}\n",
          restart->started_over ? "true" : "false", restart->saved_ranks, restart->failed_saves,
          restart->restored_ranks, (unsigned long long)restart->save_bytes);
}

static int report_usage(const char *message) {
  fprintf(stderr, "keel report: %s (usage: keel report [--json] [--svg FILE] EVENTS_FILE)\n",
          message);
  return KEEL__EXIT_USAGE;
}

int keel__command_report(int argc, char **argv) {
  const char *path = NULL, *svg_path = NULL;
  bool json = false;
  for (int index = 1; index < argc; index++) {
    if (strcmp(argv[index], "--json") == 0)
      json = true;
    else if (strcmp(argv[index], "--svg") == 0 && index + 1 < argc)
      svg_path = argv[++index];
    else if (strncmp(argv[index], "--svg=", 6) == 0 && argv[index][6] != '\0')
      svg_path = argv[index] + 6;
    else if (strcmp(argv[index], "--svg") == 0 || strcmp(argv[index], "--svg=") == 0)
      return report_usage("--svg needs the file to draw into");
    else if (argv[index][0] == '-' && argv[index][1] != '\0')
      return report_usage("unknown flag");
    else if (path == NULL)
      path = argv[index];
    else
      return report_usage("one events file only");
  }
  if (path == NULL) return report_usage("no events file given");
  if (svg_path != NULL && strcmp(svg_path, path) == 0)
    return report_usage("--svg would draw over the events file");
  report_data *data = calloc(1, sizeof *data);
  if (data != NULL && svg_path != NULL) data->timeline = keel__timeline_create();
  if (data == NULL || (svg_path != NULL && data->timeline == NULL)) {
    free(data);
    return KEEL__EXIT_FAILURE;
  }
  int exit_code = KEEL__EXIT_USAGE;
  FILE *file = fopen(path, "re");
  if (file == NULL) {
    fprintf(stderr, "keel report: cannot read %s: %s\n", path, strerror(errno));
    goto free_data;
  }
  if (!events_read(file, data)) {
    fprintf(stderr, "keel report: cannot read %s: %s\n", path, strerror(errno));
    goto close_file;
  }
  /* The model's reader puts the restarts together, the same way `keel model --measured`
   * takes its inputs from them. */
  keel_status status =
      keel_model_measure_restarts(path, NULL, data->restarts, MAX_RECORDS, &data->restart_count);
  if (status != KEEL_OK) {
    fprintf(stderr, "keel report: cannot read %s: %s\n", path, keel_strerror(status));
    goto close_file;
  }
  if (data->restart_count > MAX_RECORDS) data->not_kept += data->restart_count - MAX_RECORDS;
  exit_code =
      svg_path != NULL ? keel__timeline_svg_write(data->timeline, svg_path, data->skipped) : 0;
  if (exit_code != 0) goto close_file;
  if (!json) summary_print(stdout, path, data);
  for (size_t i = 0; json && i < data->recovery_count; i++)
    recovery_json_print(stdout, data, &data->recoveries[i]);
  for (size_t i = 0; json && i < data->restart_count && i < MAX_RECORDS; i++)
    restart_json_print(stdout, &data->restarts[i]);
  if ((json || svg_path != NULL) && data->skipped > 0)
    fprintf(stderr, "keel report: skipped %zu lines that are not a whole JSON event\n",
            data->skipped);
close_file:
  fclose(file);
free_data:
  keel__timeline_free(data->timeline);
  free(data);
  return exit_code;
}
