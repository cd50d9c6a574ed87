/* Recovery benchmark: starts `keel run -n 4` jobs of its own worker mode, SIGKILLs one
 * non-zero rank per job and measures kill -> first successful collective on the rebuilt
 * communicator (the job's "recovery" event), p50/p99 for the shrink and replace policies.
 * With --recoveries N it runs one replace job instead and kills N times in a row, each time
 * once the previous recovery is done: recovery time and the store's key count (the
 * launcher's `store` events) for the first and the last hundred show whether either grows
 * with the job's age.
 * Usage: recovery [--json] [--policy shrink|replace|both] [--trials N] [--keel PATH] [--keep]
 *        recovery [--json] --recoveries N [--keel PATH] [--keep]
 *        recovery --worker [--seconds S] [--stop-file PATH]   (what the jobs run) */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_jobs.h"
#include "bench_stats.h"
#include "keel/keel.h"

#define WORLD 4
#define MAX_TRIALS 1000
#define MAX_RECOVERIES 5000
/* The long job's window at each end, and the pause after a recovery before the next kill. */
#define LONG_WINDOW 100
#define LONG_SETTLE_NS (20 * 1000 * 1000)
#define SECOND_NS BENCH_SECOND_NS
/* Bounds of one trial: to start, to recover after the kill, to end after the recovery. */
#define START_LIMIT_NS (30 * SECOND_NS)
#define RECOVERY_LIMIT_NS (30 * SECOND_NS)
#define EXIT_LIMIT_NS (30 * SECOND_NS)
/* The kill waits until the job has done this many steps (all ranks, since every step is an
 * allreduce), then a random delay up to KILL_JITTER_NS so it lands anywhere in a step. */
#define WARM_STEPS 30
#define KILL_JITTER_NS (5 * 1000 * 1000)
/* Worker: elements of the allreduce (4 KiB of f32), pause per step, steps after recovery. */
#define WORKER_COUNT 1024
#define WORKER_PAUSE_NS (1000 * 1000)
#define WORKER_STEPS_AFTER_RECOVERY 20
#define WORKER_DEFAULT_SECONDS 60

/* ======================================================================== worker mode */

typedef struct worker {
  keel_ctx *ctx;
  const char *stop_file; /* the long job ends when the driver makes it; NULL: not that job */
  uint64_t step;
  float model[WORKER_COUNT]; /* registered state, so replace mode transfers something */
  float send[WORKER_COUNT], recv[WORKER_COUNT];
  uint64_t epoch_seen;
  int64_t steps_in_epoch;
  int64_t deadline_ns;
} worker;

/* Every rank must stop at the same step, so stopping is voted in element 0 of the
 * allreduce itself: one vote is enough, and everyone sees the same sum. */
static float worker_vote(const worker *w) {
  uint64_t epoch = keel_comm_epoch(keel_world(w->ctx));
  bool settled =
      epoch > 0 && epoch == w->epoch_seen && w->steps_in_epoch >= WORKER_STEPS_AFTER_RECOVERY;
  if (w->stop_file != NULL) settled = access(w->stop_file, F_OK) == 0;
  return settled || keel_now_ns() >= w->deadline_ns ? 1.0f : 0.0f;
}

static void worker_fill(worker *w) {
  w->send[0] = worker_vote(w);
  for (size_t i = 1; i < WORKER_COUNT; i++) w->send[i] = w->model[i] + (float)(w->step % 5);
}

static void worker_after_step(worker *w) {
  uint64_t epoch = keel_comm_epoch(keel_world(w->ctx));
  if (epoch != w->epoch_seen) {
    w->epoch_seen = epoch;
    w->steps_in_epoch = 0;
  }
  w->steps_in_epoch++;
  w->step++;
  keel_report(w->ctx, w->step, 0, 0);
}

/* The training loop; returns the process's exit code. */
static int worker_loop(worker *w) {
  struct timespec pause = {0, WORKER_PAUSE_NS};
  for (;;) {
    keel_status status = keel_step_begin(w->ctx, w->step);
    if (status == KEEL_OK) {
      nanosleep(&pause, NULL);
      worker_fill(w);
      status = keel_step_allreduce(w->ctx, w->send, w->recv, WORKER_COUNT, KEEL_F32, KEEL_SUM);
    }
    if (status == KEEL_EREDO) continue; /* state replaced: redo the step from it */
    if (status != KEEL_OK) {
      if (keel_exit_code(status) == 1)
        fprintf(stderr, "recovery --worker: allreduce failed: %s\n", keel_strerror(status));
      return keel_exit_code(status);
    }
    if (w->recv[0] > 0) return 0;
    worker_after_step(w);
    status = keel_step_commit(w->ctx);
    if (status != KEEL_OK) return keel_exit_code(status);
  }
}

static int worker_main(int64_t seconds, const char *stop_file) {
  static worker w; /* 12 KiB of buffers: not on the stack */
  w.stop_file = stop_file;
  if (keel_init(&w.ctx) != KEEL_OK) return 1;
  w.deadline_ns = keel_now_ns() + seconds * SECOND_NS;
  keel_state_register(w.ctx, "step", &w.step, sizeof w.step);
  keel_state_register(w.ctx, "model", w.model, sizeof w.model);
  keel_status status = keel_start(w.ctx);
  int code = status == KEEL_OK || status == KEEL_EJOBDONE ? 0 : 1;
  if (status == KEEL_OK) {
    w.epoch_seen = keel_comm_epoch(keel_world(w.ctx));
    code = worker_loop(&w);
  }
  keel_finalize(w.ctx);
  return code;
}

/* ======================================================================== the driver */

typedef enum policy { POLICY_SHRINK, POLICY_REPLACE, POLICY_COUNT } policy;
static const char *const policy_names[POLICY_COUNT] = {"shrink", "replace"};

typedef struct options {
  bool worker;
  int64_t worker_seconds;
  const char *stop_file;
  int64_t recoveries; /* 0: the trials mode */
  bool json, keep, verbose;
  bool policies[POLICY_COUNT];
  int64_t trials;
  int64_t seed; /* -1: from the clock */
  const char *keel_path;
} options;

/* The recovery event's breakdown, in the order of RUNTIME.md. */
#define PART_COUNT 6
static const char *const part_names[PART_COUNT] = {"detect_ms",  "revoke_ms",         "agree_ms",
                                                   "rebuild_ms", "state_transfer_ms", "redo_ms"};

typedef struct trial {
  bench_verdict verdict;
  double latency_ms;        /* kill -> recovery event's t_ns */
  double kill_to_detect_ms; /* kill -> t_detect_ns, when a survivor's collective failed */
  double parts[PART_COUNT];
} trial;

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){
      .worker_seconds = WORKER_DEFAULT_SECONDS, .trials = 20, .seed = -1, .policies = {true, true}};
  static const struct option long_options[] = {
      {"worker", no_argument, 0, 'w'},       {"seconds", required_argument, 0, 'S'},
      {"json", no_argument, 0, 'j'},         {"keep", no_argument, 0, 'k'},
      {"verbose", no_argument, 0, 'v'},      {"policy", required_argument, 0, 'p'},
      {"trials", required_argument, 0, 't'}, {"seed", required_argument, 0, 's'},
      {"keel", required_argument, 0, 'K'},   {"recoveries", required_argument, 0, 'R'},
      {"stop-file", required_argument, 0, 'F'}, {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    bool ok = option != '?';
    if (option == 'w') opts->worker = true;
    if (option == 'j') opts->json = true;
    if (option == 'k') opts->keep = true;
    if (option == 'v') opts->verbose = true;
    if (option == 'K') opts->keel_path = optarg;
    if (option == 'F') opts->stop_file = optarg;
    if (option == 'R') ok = keel_parse_int(optarg, 1, MAX_RECOVERIES, &opts->recoveries) == KEEL_OK;
    if (option == 'S') ok = keel_parse_int(optarg, 1, 3600, &opts->worker_seconds) == KEEL_OK;
    if (option == 't') ok = keel_parse_int(optarg, 1, MAX_TRIALS, &opts->trials) == KEEL_OK;
    if (option == 's') ok = keel_parse_int(optarg, 0, INT64_MAX, &opts->seed) == KEEL_OK;
    if (option == 'p') {
      bool both = strcmp(optarg, "both") == 0;
      opts->policies[POLICY_SHRINK] = both || strcmp(optarg, "shrink") == 0;
      opts->policies[POLICY_REPLACE] = both || strcmp(optarg, "replace") == 0;
      ok = opts->policies[POLICY_SHRINK] || opts->policies[POLICY_REPLACE];
    }
    if (!ok) {
      fprintf(stderr, "recovery: bad flag (see the file's header)\n");
      return -1;
    }
  }
  return 0;
}

/* ---- reading the job's events file as it grows */

typedef struct job_view {
  bench_lines lines;
  int64_t kill_ns;          /* recovery events count only after it (0: not yet killed) */
  pid_t worker_pids[WORLD]; /* by uid, from "spawn" events; 0: not seen */
  int64_t epoch0_step;      /* highest step a progress line of epoch 0 showed */
  bool recovered;
  char recovery[4096]; /* the first recovery event after the kill */
} job_view;

static void view_event(job_view *view, const char *line, const json_t *event) {
  int64_t uid, pid, step, epoch, t_ns;
  if (bench_json_string_is(event, "event", "spawn") &&
      bench_json_string_is(event, "role", "worker") && bench_json_int(event, "uid", &uid) &&
      bench_json_int(event, "pid", &pid) && uid >= 0 && uid < WORLD)
    view->worker_pids[uid] = (pid_t)pid;
  if (bench_json_string_is(event, "event", "progress") && bench_json_int(event, "epoch", &epoch) &&
      epoch == 0 && bench_json_int(event, "step", &step) && step > view->epoch0_step)
    view->epoch0_step = step;
  if (bench_json_string_is(event, "event", "recovery") && !view->recovered && view->kill_ns > 0 &&
      bench_json_int(event, "t_ns", &t_ns) && t_ns > view->kill_ns) {
    int length = snprintf(view->recovery, sizeof view->recovery, "%s", line);
    view->recovered = length > 0 && (size_t)length < sizeof view->recovery;
  }
}

static void view_line(const char *line, void *arg) {
  json_t *event = bench_json_parse(line);
  if (event != NULL) view_event(arg, line, event);
  json_decref(event);
}

/* Reads what the launcher appended and handles each complete line. */
static void view_update(job_view *view, const char *path) {
  bench_lines_read(&view->lines, path, view_line, view);
}

/* ---- the job */

static keel_status job_start(bench_job *j, const char *keel, const char *self, policy which,
                             int64_t seconds) {
  char world[16], worker_seconds[16], limit[32];
  snprintf(world, sizeof world, "%d", WORLD);
  snprintf(worker_seconds, sizeof worker_seconds, "%lld", (long long)seconds);
  snprintf(limit, sizeof limit, "%llds", (long long)seconds * 2);
  /* keel run ... -- SELF --worker: the launcher's own --timeout is a last resort. */
  const char *argv[24];
  int argc = 0;
  const char *head[] = {keel,       "run",          "-n",        world, "--quiet",
                        "--events", j->events_path, "--timeout", limit};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) argv[argc++] = head[i];
  if (which == POLICY_REPLACE) {
    const char *replace[] = {"--spares", "1", "--on-failure", "replace"};
    for (size_t i = 0; i < 4; i++) argv[argc++] = replace[i];
  }
  const char *tail[] = {"--", self, "--worker", "--seconds", worker_seconds, NULL};
  for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[argc++] = tail[i];
  return bench_job_spawn(j, argv, NULL);
}

/* true if pid is alive and a child of the launcher: never SIGKILL a recycled pid. */
static bool is_launcher_child(pid_t pid, pid_t launcher) {
  char state;
  int parent;
  return keel_process_stat(pid, &state, &parent) == KEEL_OK && parent == (int)launcher;
}

/* ---- one trial */

typedef struct driver {
  const options *opts;
  char keel[PATH_MAX];
  char self[PATH_MAX];
  char directory[PATH_MAX];
  keel_random random;
} driver;

/* Phase 1: until every rank is in the loop; false if the job ended or took too long. */
static bool wait_until_running(bench_job *j, job_view *view, trial *t) {
  int64_t deadline = keel_now_ns() + START_LIMIT_NS;
  while (view->epoch0_step < WARM_STEPS) {
    view_update(view, j->events_path);
    if (bench_job_try_reap(j))
      return bench_fail(&t->verdict, "job ended before it was running (%s)", j->log_path);
    if (keel_now_ns() >= deadline)
      return bench_fail(&t->verdict, "job not running after 30 s (%s)", j->log_path);
    bench_sleep_ns(BENCH_POLL_INTERVAL_NS);
  }
  return true;
}

/* Phase 2: kills a random non-zero rank; *kill_ns_p is taken right before kill(). */
static bool kill_one(driver *d, bench_job *j, job_view *view, trial *t, int64_t *kill_ns_p) {
  bench_sleep_ns((int64_t)keel_random_below(&d->random, KILL_JITTER_NS));
  uint32_t victim = 1 + (uint32_t)keel_random_below(&d->random, WORLD - 1);
  pid_t pid = view->worker_pids[victim];
  if (pid <= 0 || !is_launcher_child(pid, j->launcher))
    return bench_fail(&t->verdict, "no live worker pid for the victim (%s)", j->events_path);
  *kill_ns_p = keel_now_ns();
  view->kill_ns = *kill_ns_p;
  if (kill(pid, SIGKILL) != 0) return bench_fail(&t->verdict, "kill: %s", strerror(errno));
  if (d->opts->verbose) fprintf(stderr, "recovery: killed uid %u (pid %ld)\n", victim, (long)pid);
  return true;
}

/* Phase 3: until the recovery event after the kill. */
static bool wait_for_recovery(bench_job *j, job_view *view, trial *t, int64_t kill_ns) {
  while (!view->recovered) {
    view_update(view, j->events_path);
    if (view->recovered) break;
    if (bench_job_try_reap(j))
      return bench_fail(&t->verdict, "job ended without a recovery event (%s)", j->events_path);
    if (keel_now_ns() - kill_ns >= RECOVERY_LIMIT_NS)
      return bench_fail(&t->verdict, "no recovery within 30 s of the kill (%s)", j->events_path);
    bench_sleep_ns(BENCH_POLL_INTERVAL_NS);
  }
  return true;
}

/* Reads the recovery event's figures and checks it is the membership the policy implies. */
static bool trial_figures(trial *t, const json_t *event, const char *line, policy which,
                          int64_t kill_ns) {
  int64_t t_ns, detect_ns, new_world, replaced;
  if (!bench_json_int(event, "t_ns", &t_ns) || !bench_json_int(event, "new_world", &new_world))
    return bench_fail(&t->verdict, "malformed recovery event: %.100s", line);
  int64_t expected_world = which == POLICY_SHRINK ? WORLD - 1 : WORLD;
  if (new_world != expected_world ||
      (which == POLICY_REPLACE && (!bench_json_int(event, "replaced", &replaced) || replaced != 1)))
    return bench_fail(&t->verdict, "unexpected membership after recovery: %.100s", line);
  t->latency_ms = (double)(t_ns - kill_ns) / 1e6;
  t->kill_to_detect_ms =
      bench_json_int(event, "t_detect_ns", &detect_ns) ? (double)(detect_ns - kill_ns) / 1e6 : NAN;
  for (int i = 0; i < PART_COUNT; i++) {
    if (!bench_json_double(event, part_names[i], &t->parts[i])) t->parts[i] = NAN;
  }
  t->verdict.ok = true;
  return true;
}

static bool trial_record(trial *t, const job_view *view, policy which, int64_t kill_ns) {
  json_t *event = bench_json_parse(view->recovery);
  if (event == NULL)
    return bench_fail(&t->verdict, "malformed recovery event: %.100s", view->recovery);
  bool recorded = trial_figures(t, event, view->recovery, which, kill_ns);
  json_decref(event);
  return recorded;
}

static void trial_run(driver *d, policy which, int index, trial *t) {
  bench_job j = {0};
  job_view view = {.lines.fd = -1};
  *t = (trial){0};
  char name[32];
  snprintf(name, sizeof name, "%s-%02d", policy_names[which], index);
  if (!bench_job_paths(&j, d->directory, name)) {
    bench_fail(&t->verdict, "path too long under %s", d->directory);
    return;
  }
  if (job_start(&j, d->keel, d->self, which, d->opts->worker_seconds) != KEEL_OK) {
    bench_fail(&t->verdict, "cannot start %s", d->keel);
    return;
  }
  int64_t kill_ns = 0;
  bool going = wait_until_running(&j, &view, t) && kill_one(d, &j, &view, t, &kill_ns) &&
               wait_for_recovery(&j, &view, t, kill_ns) && trial_record(t, &view, which, kill_ns);
  /* The job should end by itself some steps after the recovery, and end well. */
  if (going && !bench_job_wait(&j, EXIT_LIMIT_NS))
    bench_fail(&t->verdict, "job still running 30 s after recovery (%s)", j.log_path);
  bench_job_kill(&j);
  if (going && t->verdict.ok && bench_job_exit_code(&j) != 0) {
    bench_fail(&t->verdict, "job exited %d after recovering (%s)", bench_job_exit_code(&j),
               j.log_path);
  }
  if (view.lines.fd >= 0) close(view.lines.fd);
  if (!d->opts->keep && t->verdict.ok) {
    unlink(j.events_path);
    unlink(j.log_path);
  }
}

/* ---- summaries */

/* Nearest-rank percentile of sorted values (with 20 values, p99 is the largest). */
static double percentile(const double *sorted, int count, double p) {
  int rank = (int)ceil(p / 100.0 * count);
  return sorted[rank < 1 ? 0 : rank - 1];
}

typedef struct summary {
  int ok, failed;
  double p50, p99, min, max, kill_to_detect;
  double parts[PART_COUNT];
} summary;

static void summarize(const trial *trials, int count, summary *s) {
  double latencies[MAX_TRIALS];
  *s = (summary){0};
  for (int i = 0; i < count; i++) {
    if (!trials[i].verdict.ok) {
      s->failed++;
      continue;
    }
    latencies[s->ok++] = trials[i].latency_ms;
    s->kill_to_detect += trials[i].kill_to_detect_ms;
    for (int p = 0; p < PART_COUNT; p++) s->parts[p] += trials[i].parts[p];
  }
  if (s->ok == 0) return;
  qsort(latencies, (size_t)s->ok, sizeof latencies[0], bench_compare_doubles);
  s->p50 = percentile(latencies, s->ok, 50);
  s->p99 = percentile(latencies, s->ok, 99);
  s->min = latencies[0];
  s->max = latencies[s->ok - 1];
  s->kill_to_detect /= s->ok;
  for (int p = 0; p < PART_COUNT; p++) s->parts[p] /= s->ok;
}

/* JSON null / "-" stand for figures that no successful trial gave. */
static void figure_print(const options *opts, bool known, const char *name, double value) {
  if (opts->json && known) printf(",\"%s\":%.3f", name, value);
  if (opts->json && !known) printf(",\"%s\":null", name);
  if (!opts->json && known) printf(" %8.2f", value);
  if (!opts->json && !known) printf(" %8s", "-");
}

static void summary_print(const options *opts, policy which, const summary *s) {
  if (opts->json) {
    printf(
        "{\"bench\":\"recovery\",\"impl\":\"keel-%s\",\"ranks\":%d,\"trials\":%d,"
        "\"failed\":%d",
        policy_names[which], WORLD, s->ok + s->failed, s->failed);
  } else {
    printf("%-14s %5d %6d %6d", policy_names[which], WORLD, s->ok + s->failed, s->failed);
  }
  bool known = s->ok > 0;
  figure_print(opts, known, "p50_ms", s->p50);
  figure_print(opts, known, "p99_ms", s->p99);
  figure_print(opts, known, "min_ms", s->min);
  figure_print(opts, known, "max_ms", s->max);
  figure_print(opts, known, "kill_to_detect_ms", s->kill_to_detect);
  for (int p = 0; p < PART_COUNT; p++) figure_print(opts, known, part_names[p], s->parts[p]);
  printf(opts->json ? "}\n" : "\n");
  fflush(stdout);
}

static void header_print(const options *opts) {
  if (opts->json) return;
  printf(
      "recovery latency, kill -9 of one of %d workers -> first collective done on the new "
      "communicator (ms; breakdown: mean of keel's recovery event)\n",
      WORLD);
  printf("%-14s %5s %6s %6s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "policy", "ranks",
         "trials", "failed", "p50", "p99", "min", "max", "kill>det", "detect", "revoke", "agree",
         "rebuild", "state", "redo");
  fflush(stdout);
}

static int run_policy(driver *d, policy which) {
  static trial trials[MAX_TRIALS];
  for (int i = 0; i < d->opts->trials; i++) {
    trial_run(d, which, i, &trials[i]);
    if (!trials[i].verdict.ok)
      fprintf(stderr, "recovery: %s trial %d failed: %s\n", policy_names[which], i,
              trials[i].verdict.why);
    else if (d->opts->verbose)
      fprintf(stderr, "recovery: %s trial %d: %.2f ms\n", policy_names[which], i,
              trials[i].latency_ms);
  }
  summary s;
  summarize(trials, (int)d->opts->trials, &s);
  summary_print(d->opts, which, &s);
  return s.failed == 0 ? 0 : 1;
}

/* keel is found next to this program (<dir>/../bin/keel) unless --keel names it. */
static bool driver_paths(driver *d, const char *argv0) {
  return bench_self_path(argv0, d->self, sizeof d->self) &&
         bench_program_path(d->self, d->opts->keel_path, "bin/keel", d->keel, sizeof d->keel) &&
         bench_make_directory("recovery", d->directory, sizeof d->directory);
}

/* ======================================================================== the long job */

/* What the long job's events say: each uid's pid, who holds a rank, and for each kill the
 * recovery that followed it and the store's size right after. */
#define LONG_MAX_UIDS (MAX_RECOVERIES + 16)

typedef struct long_view {
  bench_lines lines;
  pid_t pids[LONG_MAX_UIDS];
  bool holds[LONG_MAX_UIDS]; /* holds a rank now */
  bool spare[LONG_MAX_UIDS]; /* started as a spare */
  bool ready[LONG_MAX_UIDS]; /* the launcher saw it join */
  int64_t kill_ns;           /* the recovery to wait for comes after this */
  bool recovered;
  double latency_ms;
  double parts[PART_COUNT];
  long store_keys; /* of the census after that recovery; -1: none yet */
} long_view;

/* Marks who left and who joined in a recovery: the uids of "failed" hold no rank any more,
 * the "to" of each of "transfers" (a spare taking a rank) holds one now. */
static void long_membership(long_view *view, const json_t *event) {
  const json_t *failed = json_object_get(event, "failed");
  const json_t *transfers = json_object_get(event, "transfers");
  const json_t *element;
  size_t index;
  json_array_foreach(failed, index, element) {
    json_int_t uid = json_integer_value(element);
    if (json_is_integer(element) && uid >= 0 && uid < LONG_MAX_UIDS) view->holds[uid] = false;
  }
  json_array_foreach(transfers, index, element) {
    int64_t uid;
    if (bench_json_int(element, "to", &uid) && uid >= 0 && uid < LONG_MAX_UIDS)
      view->holds[uid] = true;
  }
}

static void long_event(long_view *view, const json_t *event) {
  int64_t uid, pid, t_ns, keys;
  if (bench_json_string_is(event, "event", "spawn") && bench_json_int(event, "uid", &uid) &&
      bench_json_int(event, "pid", &pid) && uid >= 0 && uid < LONG_MAX_UIDS) {
    view->pids[uid] = (pid_t)pid;
    if (bench_json_string_is(event, "role", "worker")) view->holds[uid] = true;
    if (bench_json_string_is(event, "role", "spare")) view->spare[uid] = true;
  }
  if (bench_json_string_is(event, "event", "ready") && bench_json_int(event, "uid", &uid) &&
      uid >= 0 && uid < LONG_MAX_UIDS)
    view->ready[uid] = true;
  if (bench_json_string_is(event, "event", "recovery") && view->kill_ns > 0 && !view->recovered &&
      bench_json_int(event, "t_ns", &t_ns) && t_ns > view->kill_ns) {
    long_membership(view, event);
    view->latency_ms = (double)(t_ns - view->kill_ns) / 1e6;
    for (int i = 0; i < PART_COUNT; i++) {
      if (!bench_json_double(event, part_names[i], &view->parts[i])) view->parts[i] = NAN;
    }
    view->recovered = true;
  }
  if (bench_json_string_is(event, "event", "store") &&
      bench_json_string_is(event, "when", "recovery") && view->recovered && view->store_keys < 0 &&
      bench_json_int(event, "keys", &keys))
    view->store_keys = (long)keys;
}

static void long_line(const char *line, void *arg) {
  json_t *event = bench_json_parse(line);
  if (event != NULL) long_event(arg, event);
  json_decref(event);
}

/* A rank holder to kill: any but uid 0 (rank 0, which the job keeps), alive, the launcher's. */
static pid_t long_victim(driver *d, long_view *view, pid_t launcher, long *uid_p) {
  long candidates[LONG_MAX_UIDS];
  int count = 0;
  for (long uid = 1; uid < LONG_MAX_UIDS; uid++) {
    if (view->holds[uid] && view->pids[uid] > 0 && is_launcher_child(view->pids[uid], launcher))
      candidates[count++] = uid;
  }
  if (count == 0) return -1;
  *uid_p = candidates[keel_random_below(&d->random, (uint64_t)count)];
  return view->pids[*uid_p];
}

typedef struct long_result {
  int done;
  double latency_ms[MAX_RECOVERIES];
  double parts[MAX_RECOVERIES][PART_COUNT];
  long keys[MAX_RECOVERIES];
} long_result;

/* Whether an idle spare has joined: a kill then measures the recovery, not a spare's start. */
static bool spare_ready(const long_view *view) {
  for (long uid = 0; uid < LONG_MAX_UIDS; uid++) {
    if (view->spare[uid] && view->ready[uid] && !view->holds[uid] && view->pids[uid] > 0) return true;
  }
  return false;
}

/* Kills one rank holder once a spare is ready and waits for the recovery that follows (and
 * its store census). */
static bool long_one(driver *d, bench_job *j, long_view *view, long_result *result,
                     bench_verdict *verdict) {
  int64_t waited_since = keel_now_ns();
  while (!spare_ready(view)) {
    bench_lines_read(&view->lines, j->events_path, long_line, view);
    if (bench_job_try_reap(j)) return bench_fail(verdict, "the job ended (%s)", j->log_path);
    if (keel_now_ns() - waited_since >= START_LIMIT_NS)
      return bench_fail(verdict, "no spare ready within 30 s (%s)", j->events_path);
    bench_sleep_ns(BENCH_POLL_INTERVAL_NS);
  }
  long uid = -1;
  pid_t pid = long_victim(d, view, j->launcher, &uid);
  if (pid <= 0) return bench_fail(verdict, "no rank holder left to kill (%s)", j->events_path);
  view->recovered = false;
  view->store_keys = -1;
  view->kill_ns = keel_now_ns();
  if (kill(pid, SIGKILL) != 0) return bench_fail(verdict, "kill: %s", strerror(errno));
  while (!view->recovered || view->store_keys < 0) {
    bench_lines_read(&view->lines, j->events_path, long_line, view);
    if (view->recovered && view->store_keys >= 0) break;
    if (bench_job_try_reap(j))
      return bench_fail(verdict, "the job ended after %d recoveries (%s)", result->done,
                        j->log_path);
    if (keel_now_ns() - view->kill_ns >= RECOVERY_LIMIT_NS)
      return bench_fail(verdict, "no recovery within 30 s of killing uid %ld (%s)", uid,
                        j->events_path);
    bench_sleep_ns(BENCH_POLL_INTERVAL_NS);
  }
  result->latency_ms[result->done] = view->latency_ms;
  memcpy(result->parts[result->done], view->parts, sizeof view->parts);
  result->keys[result->done] = view->store_keys;
  result->done++;
  return true;
}

static keel_status long_start(driver *d, bench_job *j, const char *stop_file, int64_t kills) {
  char world[16], restarts[24], seconds[24], limit[32];
  snprintf(world, sizeof world, "%d", WORLD);
  snprintf(restarts, sizeof restarts, "%lld", (long long)kills + 2);
  /* The workers end when the stop file appears; these bound the job should the driver fail. */
  snprintf(seconds, sizeof seconds, "%lld", (long long)(60 + kills));
  snprintf(limit, sizeof limit, "%llds", (long long)(90 + kills));
  const char *argv[] = {d->keel,  "run",         "-n",          world,     "--quiet",
                        "--events", j->events_path, "--timeout", limit,     "--spares",
                        "1",      "--on-failure", "replace",     "--max-restarts", restarts,
                        "--",     d->self,       "--worker",    "--seconds", seconds,
                        "--stop-file", stop_file, NULL};
  return bench_job_spawn(j, argv, NULL);
}

/* Median and maximum of values [first, first + count). */
static void window_figures(const double *values, int first, int count, double *median_p,
                           double *max_p) {
  double sorted[LONG_WINDOW];
  for (int i = 0; i < count; i++) sorted[i] = values[first + i];
  qsort(sorted, (size_t)count, sizeof sorted[0], bench_compare_doubles);
  *median_p = count > 0 ? percentile(sorted, count, 50) : NAN;
  *max_p = count > 0 ? sorted[count - 1] : NAN;
}

static void long_print(const options *opts, const long_result *result) {
  int window = result->done < LONG_WINDOW ? result->done : LONG_WINDOW;
  int last_first = result->done - window;
  double keys[MAX_RECOVERIES];
  for (int i = 0; i < result->done; i++) keys[i] = (double)result->keys[i];
  double first_p50, first_max, last_p50, last_max, first_keys, first_keys_max, last_keys,
      last_keys_max;
  window_figures(result->latency_ms, 0, window, &first_p50, &first_max);
  window_figures(result->latency_ms, last_first, window, &last_p50, &last_max);
  window_figures(keys, 0, window, &first_keys, &first_keys_max);
  window_figures(keys, last_first, window, &last_keys, &last_keys_max);
  if (opts->json) {
    printf("{\"bench\":\"recovery-long\",\"impl\":\"keel-replace\",\"ranks\":%d,"
           "\"recoveries\":%d,\"window\":%d,\"first_p50_ms\":%.3f,\"first_max_ms\":%.3f,"
           "\"last_p50_ms\":%.3f,\"last_max_ms\":%.3f,\"first_keys\":%.0f,"
           "\"first_keys_max\":%.0f,\"last_keys\":%.0f,\"last_keys_max\":%.0f}\n",
           WORLD, result->done, window, first_p50, first_max, last_p50, last_max, first_keys,
           first_keys_max, last_keys, last_keys_max);
    return;
  }
  printf("%d consecutive recoveries in one job (replace, %d ranks), the first and the last %d:\n",
         result->done, WORLD, window);
  printf("%-12s %14s %14s %12s %12s\n", "recoveries", "recovery p50", "recovery max",
         "store keys", "keys max");
  printf("%-12s %11.2f ms %11.2f ms %12.0f %12.0f\n", "first", first_p50, first_max, first_keys,
         first_keys_max);
  printf("%-12s %11.2f ms %11.2f ms %12.0f %12.0f\n", "last", last_p50, last_max, last_keys,
         last_keys_max);
  fflush(stdout);
}

static int long_main(driver *d) {
  static long_result result;
  static long_view view;
  bench_job j = {0};
  char stop_file[PATH_MAX + 16];
  view = (long_view){.lines.fd = -1, .store_keys = -1};
  snprintf(stop_file, sizeof stop_file, "%s/stop", d->directory);
  bench_verdict verdict = {.ok = true};
  if (!bench_job_paths(&j, d->directory, "long") ||
      long_start(d, &j, stop_file, d->opts->recoveries) != KEEL_OK) {
    fprintf(stderr, "recovery: cannot start the long job\n");
    return 1;
  }
  /* Running: every worker has reported progress once the first kill can find a holder. */
  bench_sleep_ns(2 * SECOND_NS);
  bench_lines_read(&view.lines, j.events_path, long_line, &view);
  for (int64_t k = 0; k < d->opts->recoveries && verdict.ok; k++) {
    if (!long_one(d, &j, &view, &result, &verdict)) break;
    if (d->opts->verbose)
      fprintf(stderr, "recovery: %d: %.2f ms, %ld keys\n", result.done,
              result.latency_ms[result.done - 1], result.keys[result.done - 1]);
    bench_sleep_ns(LONG_SETTLE_NS);
  }
  int fd = open(stop_file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
  if (!bench_job_wait(&j, EXIT_LIMIT_NS)) bench_fail(&verdict, "the long job did not end");
  bench_job_kill(&j);
  if (verdict.ok && bench_job_exit_code(&j) != 0)
    bench_fail(&verdict, "the long job exited %d (%s)", bench_job_exit_code(&j), j.log_path);
  if (view.lines.fd >= 0) close(view.lines.fd);
  if (result.done > 0) long_print(d->opts, &result);
  if (!verdict.ok) {
    fprintf(stderr, "recovery: %s\n", verdict.why);
    return 1;
  }
  unlink(stop_file);
  if (!d->opts->keep) {
    unlink(j.events_path);
    unlink(j.log_path);
  }
  return 0;
}

static int driver_main(const options *opts, const char *argv0) {
  driver d = {.opts = opts};
  if (!driver_paths(&d, argv0)) return 1;
  uint64_t seed =
      opts->seed >= 0 ? (uint64_t)opts->seed : (uint64_t)keel_now_ns() ^ ((uint64_t)getpid() << 32);
  keel_random_seed(&d.random, seed);
  if (opts->recoveries > 0) {
    int code = long_main(&d);
    if (rmdir(d.directory) != 0 && code != 0)
      fprintf(stderr, "recovery: the long job's events and log are in %s\n", d.directory);
    return code;
  }
  header_print(opts);
  int code = 0;
  for (int which = 0; which < POLICY_COUNT; which++) {
    if (opts->policies[which] && run_policy(&d, (policy)which) != 0) code = 1;
  }
  /* Files of failed trials stay for a look; the directory goes only if empty. */
  if (rmdir(d.directory) != 0 && code != 0)
    fprintf(stderr, "recovery: events and logs of failed trials are in %s\n", d.directory);
  return code;
}

int main(int argc, char **argv) {
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  if (opts.worker) return worker_main(opts.worker_seconds, opts.stop_file);
  return driver_main(&opts, argv[0]);
}
