/* Just-in-time checkpoint benchmark: runs the Fashion-MNIST example under `keel run -n 4`
 * and measures JIT's steady-state cost, the time from a killed worker to the first minibatch
 * done after recovery (broken down like the JIT paper's Table 7) for user-level JIT (save,
 * restart every process, restore) and in-process JIT (a spare takes the state), the work
 * each failure wastes, and that recovery is bit-exact (the final params-crc32c).
 * Usage: jit [--trials N] [--steps N] [--keel PATH] [--program PATH] [--json] [--keep] */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_jobs.h"
#include "bench_stats.h"

#define WORLD 4
#define MAX_TRIALS 100
/* Steady-state minibatch time is the slope of rank 0's progress times over steps, past the
 * first steps (process start, first touches of memory). */
#define WARM_STEPS 50
/* The worker of this rank is killed in its forward pass of the middle step. */
#define VICTIM_RANK 2
/* Every job: the launcher's own bound, and ours a little later in case it does not keep it. */
#define JOB_TIMEOUT "120s"
#define JOB_LIMIT_NS (130 * BENCH_SECOND_NS)
#define MODEL_LIMIT_NS (30 * BENCH_SECOND_NS)
#define HEARTBEAT "1s"
#define INPROCESS_TARGET_MS 1000.0

typedef struct options {
  int64_t trials, steps;
  const char *keel_path, *program_path;
  bool json, keep;
} options;

/* The four kinds of job: two without a failure (steady state), two with one. */
typedef enum mode { MODE_PLAIN, MODE_STEADY_JIT, MODE_USER, MODE_INPROCESS, MODE_COUNT } mode;

typedef struct mode_info {
  const char *name;  /* files and --json "impl" */
  const char *label; /* text output */
  bool jit, replace, fault;
} mode_info;

static const mode_info modes[MODE_COUNT] = {
    {"keel-plain", "no checkpoints", false, false, false},
    {"keel-jit-steady", "--ckpt jit", true, false, false},
    {"keel-jit-user", "user-level JIT", true, false, true},
    {"keel-jit-inprocess", "in-process JIT", true, true, true},
};

/* The recovery breakdowns: consecutive spans, so the parts add up to the total. */
#define MAX_PARTS 5
typedef struct part_info {
  const char *name, *meaning;
} part_info;

static const part_info user_parts[] = {
    {"detect", "fault -> first healthy rank's failed collective (jit_save t_failed_ns)"},
    {"save", "-> last jit_save written"},
    {"restart", "-> launcher's restart event (savers exit, teardown, respawn)"},
    {"restore", "-> last jit_restore (process start, data load, restore)"},
    {"redo", "-> resumed (the interrupted minibatch, redone)"},
};
static const part_info inprocess_parts[] = {
    {"detect", "fault -> failure detected (recovery line's t_detect_ns)"},
    {"agree", "revoke + agree + rebuild"},
    {"state", "state transfer to the spare"},
    {"redo", "redone allreduce (redo_ms) + optimizer step -> resumed"},
};

/* ======================================================================== one job */

/* What a job's events file says, gathered line by line. t_ns values; 0: not seen. */
typedef struct job_events {
  /* least squares of rank 0's progress t_ns over step, past WARM_STEPS */
  int64_t fit_origin_ns;
  double fit_count, fit_x, fit_y, fit_xx, fit_xy;
  int64_t fault_ns;
  int saves, failed_saves;
  int64_t first_failed_ns, last_save_ns, newest_save_step;
  int restarts;
  int64_t restart_ns;
  int restores, failed_restores;
  int64_t last_restore_ns, restored_step;
  int64_t resumed_ns;
  char resumed_kind[16];
  char recovery[4096]; /* the first in-process recovery line */
} job_events;

typedef struct job_result {
  bench_verdict verdict;
  char events_path[PATH_MAX];
  job_events events;
  bool crc_known;
  uint32_t crc; /* the final params-crc32c that rank 0 printed */
} job_result;

static void fit_add(job_events *e, int64_t step, int64_t t_ns) {
  if (e->fit_count == 0) e->fit_origin_ns = t_ns;
  double x = (double)step, y = (double)(t_ns - e->fit_origin_ns);
  e->fit_count++;
  e->fit_x += x;
  e->fit_y += y;
  e->fit_xx += x * x;
  e->fit_xy += x * y;
}

static void events_progress(job_events *e, const json_t *event, int64_t t_ns) {
  int64_t rank, step;
  if (bench_json_int(event, "rank", &rank) && rank == 0 && bench_json_int(event, "step", &step) &&
      step > WARM_STEPS)
    fit_add(e, step, t_ns);
}

static void events_save(job_events *e, const json_t *event, int64_t t_ns) {
  int64_t failed_ns, step;
  e->saves++;
  if (!bench_json_string_is(event, "status", "ok")) e->failed_saves++;
  if (bench_json_int(event, "t_failed_ns", &failed_ns) &&
      (e->first_failed_ns == 0 || failed_ns < e->first_failed_ns))
    e->first_failed_ns = failed_ns;
  if (t_ns > e->last_save_ns) e->last_save_ns = t_ns;
  if (bench_json_int(event, "step", &step) && step > e->newest_save_step)
    e->newest_save_step = step;
}

static void events_restore(job_events *e, const json_t *event, int64_t t_ns) {
  int64_t step;
  e->restores++;
  if (!bench_json_string_is(event, "status", "ok")) e->failed_restores++;
  if (t_ns > e->last_restore_ns) e->last_restore_ns = t_ns;
  /* The oldest restored step, should the ranks differ: the job redoes from there. */
  if (bench_json_int(event, "step", &step) && (e->restores == 1 || step < e->restored_step))
    e->restored_step = step;
}

static void events_handle(job_events *e, const char *line, const json_t *event) {
  int64_t t_ns;
  if (!bench_json_int(event, "t_ns", &t_ns)) return;
  if (bench_json_string_is(event, "event", "progress")) events_progress(e, event, t_ns);
  if (bench_json_string_is(event, "event", "fault") && e->fault_ns == 0) e->fault_ns = t_ns;
  if (bench_json_string_is(event, "event", "jit_save")) events_save(e, event, t_ns);
  if (bench_json_string_is(event, "event", "restart")) {
    e->restarts++;
    e->restart_ns = t_ns;
  }
  if (bench_json_string_is(event, "event", "jit_restore")) events_restore(e, event, t_ns);
  if (bench_json_string_is(event, "event", "resumed") && e->resumed_ns == 0) {
    e->resumed_ns = t_ns;
    bool restart = bench_json_string_is(event, "kind", "restart");
    bool in_process = bench_json_string_is(event, "kind", "in-process");
    snprintf(e->resumed_kind, sizeof e->resumed_kind, "%s",
             restart      ? "restart"
             : in_process ? "in-process"
                          : "other");
  }
  if (bench_json_string_is(event, "event", "recovery") && e->recovery[0] == '\0') {
    int length = snprintf(e->recovery, sizeof e->recovery, "%s", line);
    if (length < 0 || (size_t)length >= sizeof e->recovery) e->recovery[0] = '\0'; /* not ours */
  }
}

static void events_line(const char *line, void *arg) {
  json_t *event = bench_json_parse(line);
  if (event != NULL) events_handle(arg, line, event);
  json_decref(event);
}

static void log_line(const char *line, void *arg) {
  job_result *result = arg;
  const char *at = strstr(line, "params-crc32c ");
  if (at == NULL) return;
  char *end;
  unsigned long crc = strtoul(at + strlen("params-crc32c "), &end, 16);
  if (end == at + strlen("params-crc32c ")) return;
  result->crc = (uint32_t)crc;
  result->crc_known = true;
}

typedef struct driver {
  const options *opts;
  char self[PATH_MAX], keel[PATH_MAX], program[PATH_MAX], directory[PATH_MAX];
  bool reference_known;
  uint32_t reference_crc;      /* the first clean run's */
  int failures;                /* jobs or checks that failed */
  char model_events[PATH_MAX]; /* events of the first good user-level trial */
} driver;

/* keel run -n 4 ... [--ckpt jit ...] -- fashion_mnist --steps N --quiet; ckpt: its --ckpt-dir. */
static keel_status job_start(const driver *d, mode which, bench_job *job, const char *ckpt) {
  const mode_info *info = &modes[which];
  char steps[32], fault[128];
  snprintf(steps, sizeof steps, "%lld", (long long)d->opts->steps);
  /* Every job gets KEEL_FAULT from us alone: a rule in the caller's environment is dropped. */
  snprintf(fault, sizeof fault, "KEEL_FAULT=kill@rank=%d,step=%lld,point=forward", VICTIM_RANK,
           (long long)d->opts->steps / 2);
  const char *argv[32];
  int argc = 0;
  const char *head[] = {d->keel,         "run",     "-n",        "4",         "--quiet",
                        "--heartbeat",   HEARTBEAT, "--timeout", JOB_TIMEOUT, "--events",
                        job->events_path};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) argv[argc++] = head[i];
  if (info->jit) {
    const char *jit[] = {"--ckpt", "jit", "--ckpt-dir", ckpt};
    for (size_t i = 0; i < 4; i++) argv[argc++] = jit[i];
  }
  if (info->replace) {
    const char *replace[] = {"--on-failure", "replace", "--spares", "1"};
    for (size_t i = 0; i < 4; i++) argv[argc++] = replace[i];
  }
  const char *tail[] = {"--", d->program, "--steps", steps, "--quiet", NULL};
  for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[argc++] = tail[i];
  return bench_job_spawn(job, argv, info->fault ? fault : "KEEL_FAULT");
}

/* Runs one job to its end (bounded) and reads its events and final crc into *result. */
static void job_run(driver *d, mode which, int index, job_result *result) {
  *result = (job_result){0};
  bench_job job = {0};
  char name[64], ckpt[PATH_MAX];
  snprintf(name, sizeof name, "%s-%02d", modes[which].name, index);
  if (!bench_job_paths(&job, d->directory, name) ||
      snprintf(ckpt, sizeof ckpt, "%s/%s.ckpt", d->directory, name) >= (int)sizeof ckpt) {
    bench_fail(&result->verdict, "path too long under %s", d->directory);
    return;
  }
  if (job_start(d, which, &job, ckpt) != KEEL_OK) {
    bench_fail(&result->verdict, "cannot start %s", d->keel);
    return;
  }
  bool ended = bench_job_wait(&job, JOB_LIMIT_NS);
  bench_job_kill(&job);
  bench_remove_tree(ckpt); /* the checkpoints are never looked at again */
  result->verdict.ok = true;
  if (!ended) bench_fail(&result->verdict, "job still running after 130 s (%s)", job.log_path);
  if (ended && bench_job_exit_code(&job) != 0)
    bench_fail(&result->verdict, "job exited %d (%s)", bench_job_exit_code(&job), job.log_path);
  memcpy(result->events_path, job.events_path, sizeof result->events_path);
  bench_lines_read_file(job.events_path, events_line, &result->events);
  bench_lines_read_file(job.log_path, log_line, result);
  if (result->verdict.ok && !result->crc_known)
    bench_fail(&result->verdict, "no params-crc32c line (%s)", job.log_path);
}

/* ======================================================================== figures */

typedef struct spread {
  int count;
  double median, min, max;
} spread;

/* Sorts values. */
static spread spread_of(double *values, int count) {
  if (count == 0) return (spread){0};
  qsort(values, (size_t)count, sizeof *values, bench_compare_doubles);
  return (spread){count, bench_median_sorted(values, count), values[0], values[count - 1]};
}

static double span_ms(int64_t from_ns, int64_t to_ns) { return (double)(to_ns - from_ns) / 1e6; }

/* Minibatch time in ms: the slope of the fit; false with fewer than 3 points. */
static bool minibatch_ms(const job_events *e, double *ms_p) {
  double n = e->fit_count, denominator = n * e->fit_xx - e->fit_x * e->fit_x;
  if (n < 3 || denominator <= 0) return false;
  *ms_p = (n * e->fit_xy - e->fit_x * e->fit_y) / denominator / 1e6;
  return true;
}

/* One failure trial's figures. */
typedef struct trial {
  bench_verdict verdict;
  double parts[MAX_PARTS];
  double total_ms;
  int64_t wasted; /* minibatches */
} trial;

static bool user_record(trial *t, const job_events *e) {
  bench_verdict *v = &t->verdict;
  if (e->fault_ns == 0) return bench_fail(v, "no fault event");
  if (e->saves == 0 || e->failed_saves > 0)
    return bench_fail(v, "%d jit_save events, %d failed", e->saves, e->failed_saves);
  if (e->restarts != 1) return bench_fail(v, "%d restarts, expected 1", e->restarts);
  if (e->restores != WORLD || e->failed_restores > 0)
    return bench_fail(v, "%d jit_restore events, %d failed", e->restores, e->failed_restores);
  if (e->resumed_ns == 0 || strcmp(e->resumed_kind, "restart") != 0)
    return bench_fail(v, "no resumed event of kind restart");
  int64_t marks[] = {e->fault_ns,   e->first_failed_ns, e->last_save_ns,
                     e->restart_ns, e->last_restore_ns, e->resumed_ns};
  for (int i = 0; i < MAX_PARTS; i++) t->parts[i] = span_ms(marks[i], marks[i + 1]);
  t->total_ms = span_ms(e->fault_ns, e->resumed_ns);
  t->wasted = e->newest_save_step - e->restored_step + 1;
  return true;
}

/* The figures of the in-process recovery's line, checked to be a replacement. */
static bool inprocess_figures(trial *t, const job_events *e, const json_t *event) {
  bench_verdict *v = &t->verdict;
  const char *line = e->recovery;
  int64_t t_ns, detect_ns, new_world, replaced;
  double revoke, agree, rebuild, state, redo;
  if (!bench_json_int(event, "t_ns", &t_ns) || !bench_json_int(event, "t_detect_ns", &detect_ns) ||
      !bench_json_double(event, "revoke_ms", &revoke) ||
      !bench_json_double(event, "agree_ms", &agree) ||
      !bench_json_double(event, "rebuild_ms", &rebuild) ||
      !bench_json_double(event, "state_transfer_ms", &state) ||
      !bench_json_double(event, "redo_ms", &redo) ||
      !bench_json_int(event, "redo_minibatches", &t->wasted))
    return bench_fail(v, "malformed recovery event: %.100s", line);
  if (!bench_json_int(event, "new_world", &new_world) || new_world != WORLD ||
      !bench_json_int(event, "replaced", &replaced) || replaced != 1)
    return bench_fail(v, "unexpected membership after recovery: %.100s", line);
  if (e->resumed_ns == 0 || strcmp(e->resumed_kind, "in-process") != 0)
    return bench_fail(v, "no resumed event of kind in-process");
  t->parts[0] = span_ms(e->fault_ns, detect_ns);
  t->parts[1] = revoke + agree + rebuild;
  t->parts[2] = state;
  t->parts[3] = redo + span_ms(t_ns, e->resumed_ns);
  t->total_ms = span_ms(e->fault_ns, e->resumed_ns);
  return true;
}

static bool inprocess_record(trial *t, const job_events *e) {
  bench_verdict *v = &t->verdict;
  if (e->fault_ns == 0) return bench_fail(v, "no fault event");
  if (e->recovery[0] == '\0') return bench_fail(v, "no recovery event");
  json_t *event = bench_json_parse(e->recovery);
  if (event == NULL) return bench_fail(v, "malformed recovery event: %.100s", e->recovery);
  bool recorded = inprocess_figures(t, e, event);
  json_decref(event);
  return recorded;
}

/* Holds every good job to the clean run's final parameters (the first good job's, since the
 * clean runs go first); false, with the verdict failed, on a mismatch. */
static bool crc_check(driver *d, job_result *result) {
  if (!result->verdict.ok) return false;
  if (!d->reference_known) {
    d->reference_known = true;
    d->reference_crc = result->crc;
  }
  if (result->crc == d->reference_crc) return true;
  return bench_fail(&result->verdict, "params-crc32c %08x differs from the clean run's %08x",
                    result->crc, d->reference_crc);
}

static void report_failure(driver *d, mode which, int index, const bench_verdict *verdict) {
  d->failures++;
  fprintf(stderr, "jit: %s trial %d failed: %s\n", modes[which].name, index, verdict->why);
}

/* The final crcs of a mode's jobs, in trial order. */
typedef struct crc_list {
  int count;
  bool known[MAX_TRIALS];
  uint32_t crc[MAX_TRIALS];
} crc_list;

static void crc_list_add(crc_list *list, const job_result *result) {
  list->known[list->count] = result->crc_known;
  list->crc[list->count++] = result->crc;
}

/* ======================================================================== output */

static void json_spread(const char *name, spread s) {
  if (s.count == 0) {
    printf(",\"%s\":null,\"%s_min\":null,\"%s_max\":null", name, name, name);
    return;
  }
  printf(",\"%s\":%.4f,\"%s_min\":%.4f,\"%s_max\":%.4f", name, s.median, name, s.min, name, s.max);
}

static void text_spread(const char *label, spread s, const char *unit, const char *meaning) {
  if (s.count == 0) {
    printf("  %-16s %10s\n", label, "-");
    return;
  }
  printf("  %-16s %10.3f %10.3f %10.3f %s%s%s\n", label, s.median, s.min, s.max, unit,
         meaning[0] ? "  " : "", meaning);
}

/* The crcs of a mode's jobs, next to the clean run's. */
static void crc_print(const driver *d, mode which, const crc_list *list) {
  int mismatches = 0, missing = 0;
  for (int i = 0; i < list->count; i++) {
    if (!list->known[i]) missing++;
    if (list->known[i] && list->crc[i] != d->reference_crc) mismatches++;
  }
  if (d->opts->json) {
    printf("{\"bench\":\"jit\",\"measure\":\"bit_exact\",\"impl\":\"%s\",", modes[which].name);
    if (d->reference_known) printf("\"reference_crc32c\":\"%08x\",\"crc32c\":[", d->reference_crc);
    if (!d->reference_known) printf("\"reference_crc32c\":null,\"crc32c\":[");
    for (int i = 0; i < list->count; i++) {
      if (list->known[i]) printf(i ? ",\"%08x\"" : "\"%08x\"", list->crc[i]);
      if (!list->known[i]) printf(i ? ",null" : "null");
    }
    printf("],\"mismatches\":%d,\"missing\":%d}\n", mismatches, missing);
    return;
  }
  printf("  params-crc32c %-16s", modes[which].label);
  for (int i = 0; i < list->count; i++) {
    if (list->known[i]) printf(" %08x", list->crc[i]);
    if (!list->known[i]) printf(" %8s", "-");
  }
  if (!d->reference_known) {
    printf("  (no clean run finished: nothing to compare)\n");
    return;
  }
  printf("  clean run's %08x: %s%s\n", d->reference_crc, mismatches ? "MISMATCH" : "equal",
         missing ? " (- : job failed)" : "");
}

/* ======================================================================== 1. steady state */

/* What the overhead is, read against the trials' spread. */
static const char *overhead_verdict(spread plain, spread jit, bool *within_noise_p) {
  double difference = jit.median - plain.median;
  double noise = fmax(plain.max - plain.min, jit.max - jit.min);
  *within_noise_p = fabs(difference) <= noise;
  if (plain.count < 2 || jit.count < 2) return "one trial each: no spread to judge it against";
  if (*within_noise_p)
    return "within the trial-to-trial spread: noise (with no failure JIT does nothing per step)";
  if (difference < 0)
    return "negative, beyond the spread: the machine's noise, since JIT adds no work per step";
  return "beyond the trial-to-trial spread";
}

static void steady_print(const driver *d, spread plain, spread jit, int failed) {
  bool known = plain.count > 0 && jit.count > 0, within_noise = false;
  double overhead = known ? (jit.median / plain.median - 1) * 100 : NAN;
  const char *verdict = known ? overhead_verdict(plain, jit, &within_noise) : "";
  if (d->opts->json) {
    printf(
        "{\"bench\":\"jit\",\"measure\":\"steady_state\",\"ranks\":%d,\"steps\":%lld,"
        "\"trials\":%lld,\"failed\":%d",
        WORLD, (long long)d->opts->steps, (long long)d->opts->trials, failed);
    json_spread("minibatch_ms", plain);
    json_spread("jit_minibatch_ms", jit);
    if (known)
      printf(",\"overhead_pct\":%.3f,\"within_noise\":%s}\n", overhead,
             within_noise ? "true" : "false");
    if (!known) printf(",\"overhead_pct\":null,\"within_noise\":null}\n");
    return;
  }
  printf(
      "1. steady state: minibatch time, slope of rank 0's progress t_ns over steps %d..%lld;"
      " %lld trials each, alternating, %d failed\n",
      WARM_STEPS, (long long)d->opts->steps, (long long)d->opts->trials, failed);
  printf("  %-16s %10s %10s %10s\n", "", "median", "min", "max");
  text_spread(modes[MODE_PLAIN].label, plain, "ms", "");
  text_spread(modes[MODE_STEADY_JIT].label, jit, "ms", "");
  if (known) printf("  overhead %+.2f%% (target < 1%%): %s\n", overhead, verdict);
}

static int steady_state(driver *d) {
  int trials = (int)d->opts->trials;
  crc_list crcs[2] = {{0}, {0}};
  double times[2][MAX_TRIALS];
  int counts[2] = {0, 0};
  for (int i = 0; i < trials; i++) {
    /* Alternate which goes first, so that a drift of the machine's load hits both alike. */
    for (int k = 0; k < 2; k++) {
      int side = (i + k) % 2;
      mode which = side == 0 ? MODE_PLAIN : MODE_STEADY_JIT;
      job_result result;
      job_run(d, which, i, &result);
      double ms = 0;
      if (result.verdict.ok && !minibatch_ms(&result.events, &ms))
        bench_fail(&result.verdict, "too few progress events of rank 0");
      if (crc_check(d, &result)) times[side][counts[side]++] = ms;
      if (!result.verdict.ok) report_failure(d, which, i, &result.verdict);
      crc_list_add(&crcs[side], &result);
    }
  }
  spread plain = spread_of(times[0], counts[0]), jit = spread_of(times[1], counts[1]);
  steady_print(d, plain, jit, 2 * trials - counts[0] - counts[1]);
  for (int side = 0; side < 2; side++)
    crc_print(d, side == 0 ? MODE_PLAIN : MODE_STEADY_JIT, &crcs[side]);
  fflush(stdout);
  return plain.count > 0 && jit.count > 0 ? 0 : 1;
}

/* ======================================================================== 2, 3. failures */

/* The figures of a mode's good trials. */
typedef struct recovery_summary {
  int good, failed, part_count;
  const part_info *parts;
  spread part_spreads[MAX_PARTS], total;
  double wasted_mean;
  int64_t wasted_max;
} recovery_summary;

static void recovery_summarize(mode which, const trial *trials, int count, recovery_summary *r) {
  bool user = which == MODE_USER;
  *r = (recovery_summary){.parts = user ? user_parts : inprocess_parts, .part_count = user ? 5 : 4};
  double values[MAX_TRIALS], wasted_sum = 0;
  for (int p = 0; p < r->part_count; p++) {
    int n = 0;
    for (int i = 0; i < count; i++)
      if (trials[i].verdict.ok) values[n++] = trials[i].parts[p];
    r->part_spreads[p] = spread_of(values, n);
  }
  for (int i = 0; i < count; i++) {
    if (!trials[i].verdict.ok) continue;
    values[r->good++] = trials[i].total_ms;
    wasted_sum += (double)trials[i].wasted;
    if (trials[i].wasted > r->wasted_max) r->wasted_max = trials[i].wasted;
  }
  r->failed = count - r->good;
  r->total = spread_of(values, r->good);
  r->wasted_mean = r->good ? wasted_sum / r->good : NAN;
}

static void recovery_json(const driver *d, mode which, const recovery_summary *r) {
  printf(
      "{\"bench\":\"jit\",\"measure\":\"recovery\",\"impl\":\"%s\",\"ranks\":%d,"
      "\"kill_step\":%lld,\"trials\":%d,\"failed\":%d",
      modes[which].name, WORLD, (long long)d->opts->steps / 2, r->good + r->failed, r->failed);
  json_spread("total_ms", r->total);
  for (int p = 0; p < r->part_count; p++) {
    char name[32];
    snprintf(name, sizeof name, "%s_ms", r->parts[p].name);
    json_spread(name, r->part_spreads[p]);
  }
  printf("}\n{\"bench\":\"jit\",\"measure\":\"wasted_work\",\"impl\":\"%s\",\"trials\":%d",
         modes[which].name, r->good);
  if (r->good)
    printf(",\"mean_minibatches\":%.3f,\"max_minibatches\":%lld}\n", r->wasted_mean,
           (long long)r->wasted_max);
  if (!r->good) printf(",\"mean_minibatches\":null,\"max_minibatches\":null}\n");
}

static void recovery_text(mode which, const recovery_summary *r) {
  bool user = which == MODE_USER;
  printf("%s (%s), %d trials, %d failed\n", modes[which].label,
         user ? "--ckpt jit: save, restart all, restore, redo"
              : "--ckpt jit --on-failure replace --spares 1",
         r->good + r->failed, r->failed);
  printf("  %-16s %10s %10s %10s\n", "", "median", "min", "max");
  for (int p = 0; p < r->part_count; p++)
    text_spread(r->parts[p].name, r->part_spreads[p], "ms", r->parts[p].meaning);
  text_spread("total", r->total, "ms", "fault -> resumed (first minibatch done after recovery)");
  if (r->good == 0) return;
  if (!user)
    printf("  in-process total < %.0f ms: %s\n", INPROCESS_TARGET_MS,
           r->total.max < INPROCESS_TARGET_MS ? "met in every trial" : "NOT met in every trial");
  printf("  wasted work per failure: mean %.2f, max %lld minibatches (target <= 1: %s)\n",
         r->wasted_mean, (long long)r->wasted_max, r->wasted_max <= 1 ? "met" : "NOT met");
}

static int failures(driver *d, mode which) {
  int count = (int)d->opts->trials;
  trial trials[MAX_TRIALS];
  crc_list crcs = {0};
  int failed = 0;
  for (int i = 0; i < count; i++) {
    trial *t = &trials[i];
    job_result result;
    job_run(d, which, i, &result);
    *t = (trial){.verdict = result.verdict};
    if (t->verdict.ok) (which == MODE_USER ? user_record : inprocess_record)(t, &result.events);
    /* The crc is checked even when the events fall short: it is a verdict of its own. */
    if (!crc_check(d, &result) && t->verdict.ok) t->verdict = result.verdict;
    if (!t->verdict.ok) {
      report_failure(d, which, i, &t->verdict);
      failed++;
    } else if (which == MODE_USER && d->model_events[0] == '\0') {
      memcpy(d->model_events, result.events_path, sizeof d->model_events);
    }
    crc_list_add(&crcs, &result);
  }
  recovery_summary summary;
  recovery_summarize(which, trials, count, &summary);
  if (d->opts->json) recovery_json(d, which, &summary);
  if (!d->opts->json) recovery_text(which, &summary);
  crc_print(d, which, &crcs);
  fflush(stdout);
  return failed ? 1 : 0;
}

/* ======================================================================== 4. the model */

typedef struct model_output {
  const driver *d;
  bool underived; /* some input was not taken from the events */
} model_output;

static void model_line(const char *line, void *arg) {
  model_output *output = arg;
  if (strstr(line, "not derived")) output->underived = true;
  if (output->d->opts->json && line[0] == '{')
    printf("{\"bench\":\"jit\",\"measure\":\"model\",\"model\":%s}\n", line);
  if (!output->d->opts->json) printf("  | %s\n", line);
}

/* Runs `keel model --measured` on a user-level trial's events and prints what it says. */
static int model(driver *d) {
  if (!d->opts->json)
    printf("4. keel model --measured <events of the first good user-level trial>:\n");
  if (d->model_events[0] == '\0') {
    if (!d->opts->json) printf("  no user-level trial succeeded\n");
    return 1;
  }
  bench_job job = {0};
  if (!bench_job_paths(&job, d->directory, "model")) return 1;
  const char *argv[] = {
      d->keel, "model", "--measured", d->model_events, d->opts->json ? "--json" : NULL, NULL};
  if (bench_job_spawn(&job, argv, NULL) != KEEL_OK) return 1;
  bool ended = bench_job_wait(&job, MODEL_LIMIT_NS);
  bench_job_kill(&job);
  model_output output = {.d = d};
  bench_lines_read_file(job.log_path, model_line, &output);
  if (!ended || bench_job_exit_code(&job) != 0) {
    fprintf(stderr, "jit: keel model failed (%s)\n", job.log_path);
    return 1;
  }
  if (output.underived)
    printf(
        "  note: keel model --measured did not derive every input from this events file: "
        "the defaults stand in for those\n");
  return 0;
}

/* ======================================================================== the driver */

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.trials = 5, .steps = 600};
  static const struct option long_options[] = {{"trials", required_argument, 0, 't'},
                                               {"steps", required_argument, 0, 's'},
                                               {"keel", required_argument, 0, 'K'},
                                               {"program", required_argument, 0, 'P'},
                                               {"json", no_argument, 0, 'j'},
                                               {"keep", no_argument, 0, 'k'},
                                               {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    bool ok = option != '?';
    if (option == 't') ok = keel_parse_int(optarg, 1, MAX_TRIALS, &opts->trials) == KEEL_OK;
    /* The kill lands at steps/2, after the warm-up. */
    if (option == 's')
      ok = keel_parse_int(optarg, 4 * WARM_STEPS, 1000000, &opts->steps) == KEEL_OK;
    if (option == 'K') opts->keel_path = optarg;
    if (option == 'P') opts->program_path = optarg;
    if (option == 'j') opts->json = true;
    if (option == 'k') opts->keep = true;
    if (!ok) break;
  }
  if (option != -1 || optind < argc) {
    fprintf(stderr, "jit: bad flag (see the file's header; --steps >= %d)\n", 4 * WARM_STEPS);
    return -1;
  }
  return 0;
}

static bool driver_paths(driver *d, const char *argv0) {
  return bench_self_path(argv0, d->self, sizeof d->self) &&
         bench_program_path(d->self, d->opts->keel_path, "bin/keel", d->keel, sizeof d->keel) &&
         bench_program_path(d->self, d->opts->program_path, "bin/fashion_mnist", d->program,
                            sizeof d->program) &&
         bench_make_directory("jit", d->directory, sizeof d->directory);
}

/* The first three fields of /proc/loadavg: this machine is shared, and the figures say so. */
static void load_print(void) {
  char load[64] = "?";
  FILE *file = fopen("/proc/loadavg", "r");
  if (file && fgets(load, sizeof load, file)) load[strcspn(load, "\n")] = '\0';
  if (file) fclose(file);
  printf("%ld cores, load at the start %.14s\n\n", sysconf(_SC_NPROCESSORS_ONLN), load);
}

static int driver_main(const options *opts, const char *argv0) {
  driver d = {.opts = opts};
  if (!driver_paths(&d, argv0)) return 1;
  if (!opts->json) {
    printf(
        "just-in-time checkpoints: keel run -n %d --heartbeat %s -- fashion_mnist --steps %lld;"
        " failures: KEEL_FAULT=kill@rank=%d,step=%lld,point=forward\n",
        WORLD, HEARTBEAT, (long long)opts->steps, VICTIM_RANK, (long long)opts->steps / 2);
    load_print();
  }
  int code = steady_state(&d);
  if (!opts->json) printf("\n2, 3. recovery (ms) and wasted work\n");
  code |= failures(&d, MODE_USER);
  code |= failures(&d, MODE_INPROCESS);
  if (!opts->json) printf("\n");
  code |= model(&d);
  code |= d.failures > 0;
  /* Checkpoints went with their jobs; events and logs stay for a look after a failure. */
  if (opts->keep || code != 0) {
    fprintf(stderr, "jit: events and logs are in %s\n", d.directory);
  } else {
    bench_remove_tree(d.directory);
  }
  return code;
}

int main(int argc, char **argv) {
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  return driver_main(&opts, argv[0]);
}
