/* In-memory checkpoints' steady-state cost (issue 11; Gemini's Figure 16): ZeRO-sharded
 * Fashion-MNIST on 4 nodes that are network namespaces with shaped links, a checkpoint of every
 * rank at every step with 2 replicas, against the same job without checkpoints, and the
 * ablation: blocking copies, copies sent at once, copies in the idle windows with 1 and with
 * several buffers. Configurations run interleaved, one trial each in turn. Needs root.
 * Usage: mem_overhead [--json] [--trials N] [--link-rate RATE] [--hidden LIST] [--steps S]
 *        [--global-batch B] [--warm-steps W] [--only NAME,...] [--keel PATH] [--example PATH]
 * [--keep] [--verbose] */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_jobs.h"
#include "bench_stats.h"
#include "keel/keel.h"

#define NODES 4
#define MAX_TRIALS 50
#define MAX_RANKS 64 /* above the ranks of these jobs */
/* The defaults. 784-1024-1024-10 with Adam is 5.6 MB of state per rank (parameters, two
 * moments, a quarter each); each step's allgather and reduce-scatter keep a 1 Gbit/s link
 * busy about 120 ms, and a copy to the peer needs about 45 ms more. With a global batch of
 * 2048 the compute between them is about 160 ms, so the copy fits in the link's idle time, as
 * in Gemini's setting; with 256 it is about 50 ms (training alone keeps the link 64% busy,
 * copy and training need 96% of the step), and no schedule can hide the copy. The workers'
 * compute is this 2-core machine's CPU, which the copies' own CPU (sending, receiving,
 * checking) takes from it. A run takes 50-60 s. */
#define DEFAULT_LINK_RATE "1gbit"
#define DEFAULT_HIDDEN "1024,1024"
#define DEFAULT_STEPS 150
#define DEFAULT_GLOBAL_BATCH "2048"
#define DEFAULT_WARM_STEPS 20
/* The goal and hard limit for the default configuration's overhead. */
#define GOAL_PERCENT 1.0
#define LIMIT_PERCENT 3.0
/* Every job: the launcher's own bound, and ours a little later should it not keep it. */
#define JOB_TIMEOUT "300s"
#define JOB_LIMIT_NS (320 * BENCH_SECOND_NS)

/* ======================================================================== configurations */

typedef struct configuration {
  const char *name; /* table row, file names, --only, JSON "impl" */
  const char *ckpt; /* the --ckpt value; NULL: no checkpoints (the peer) */
  const char *meaning;
} configuration;

enum {
  CONFIG_NONE,
  CONFIG_BLOCKING,
  CONFIG_AT_ONCE,
  CONFIG_WINDOWS_1,
  CONFIG_WINDOWS,
  CONFIG_COUNT
};

static const configuration configurations[CONFIG_COUNT] = {
    [CONFIG_NONE] = {"none", NULL, "no checkpoints: the peer of the others"},
    [CONFIG_BLOCKING] = {"blocking", "mem:blocking,profile=0",
                         "each commit waits until the peer holds the whole snapshot"},
    [CONFIG_AT_ONCE] = {"at-once", "mem:profile=0",
                        "no interleaving: each snapshot sent as soon as it is sealed"},
    [CONFIG_WINDOWS_1] = {"windows-1", "mem:buffers=1",
                          "idle windows (profile of 10 steps), one chunk in flight"},
    [CONFIG_WINDOWS] = {"windows-4", "mem", "idle windows, 4 chunks in flight (keel's default)"},
};

/* ======================================================================== options */

typedef struct options {
  bool json, keep, verbose;
  int64_t trials, steps, warm_steps;
  const char *link_rate, *hidden, *global_batch;
  bool wanted[CONFIG_COUNT];
  const char *keel_path, *example_path;
} options;

/* --only a,b: those configurations (none is always kept: it is the others' peer); false if
 * a name is unknown. */
static bool configurations_choose(const char *list, bool *wanted) {
  char copy[256];
  snprintf(copy, sizeof copy, "%s", list);
  for (int i = 0; i < CONFIG_COUNT; i++) wanted[i] = i == CONFIG_NONE;
  char *save = NULL;
  for (char *name = strtok_r(copy, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
    bool known = false;
    for (int i = 0; i < CONFIG_COUNT; i++) {
      if (strcmp(name, configurations[i].name) == 0) wanted[i] = known = true;
    }
    if (!known) return false;
  }
  return true;
}

/* A text that goes on a command line as one argument of ours: short, no spaces. */
static bool plain_word(const char *text) {
  return text[0] != '\0' && strlen(text) < 64 && strpbrk(text, " \t\n") == NULL;
}

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.trials = 3,
                    .steps = DEFAULT_STEPS,
                    .warm_steps = DEFAULT_WARM_STEPS,
                    .link_rate = DEFAULT_LINK_RATE,
                    .hidden = DEFAULT_HIDDEN,
                    .global_batch = DEFAULT_GLOBAL_BATCH};
  for (int i = 0; i < CONFIG_COUNT; i++) opts->wanted[i] = true;
  static const struct option long_options[] = {{"json", no_argument, 0, 'j'},
                                               {"keep", no_argument, 0, 'k'},
                                               {"verbose", no_argument, 0, 'v'},
                                               {"trials", required_argument, 0, 't'},
                                               {"steps", required_argument, 0, 's'},
                                               {"warm-steps", required_argument, 0, 'w'},
                                               {"link-rate", required_argument, 0, 'r'},
                                               {"hidden", required_argument, 0, 'h'},
                                               {"global-batch", required_argument, 0, 'b'},
                                               {"only", required_argument, 0, 'o'},
                                               {"keel", required_argument, 0, 'K'},
                                               {"example", required_argument, 0, 'E'},
                                               {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    bool ok = option != '?';
    if (option == 'j') opts->json = true;
    if (option == 'k') opts->keep = true;
    if (option == 'v') opts->verbose = true;
    if (option == 'K') opts->keel_path = optarg;
    if (option == 'E') opts->example_path = optarg;
    if (option == 'r') ok = plain_word(opts->link_rate = optarg);
    if (option == 'h') ok = plain_word(opts->hidden = optarg);
    if (option == 'b') {
      int64_t batch; /* checked here: it goes into the JSON as a number */
      ok = keel_parse_int(optarg, 1, 65536, &batch) == KEEL_OK;
      opts->global_batch = optarg;
    }
    if (option == 'o') ok = configurations_choose(optarg, opts->wanted);
    if (option == 't') ok = keel_parse_int(optarg, 1, MAX_TRIALS, &opts->trials) == KEEL_OK;
    if (option == 's') ok = keel_parse_int(optarg, 2, 100000, &opts->steps) == KEEL_OK;
    if (option == 'w') ok = keel_parse_int(optarg, 0, 100000, &opts->warm_steps) == KEEL_OK;
    if (!ok) {
      fprintf(stderr, "mem_overhead: bad flag (see the file's header)\n");
      return -1;
    }
  }
  /* Two progress points past the warm steps at least, to time anything. */
  if (opts->warm_steps + 2 > opts->steps) {
    fprintf(stderr, "mem_overhead: --steps must exceed --warm-steps by 2 or more\n");
    return -1;
  }
  return 0;
}

/* ======================================================================== a job's events */

/* A rank's mem_save figures at one event: the means are over every save so far. */
typedef struct save_point {
  int64_t saves;
  double mean_wait_ms, mean_save_ms;
} save_point;

/* A rank's mem_profile event: the windows its agent schedules the copies into. */
typedef struct profile_seen {
  bool seen;
  int64_t steps, collectives;
  double first_window_ms, last_window_start_ms;
} profile_seen;

/* What a job's events file says. */
typedef struct job_events {
  const options *opts;
  /* rank 0's progress past the warm steps: the first and the last (step, t_ns) */
  int64_t first_step, first_ns, last_step, last_ns;
  bool timed;
  /* per rank: the first mem_save past the warm steps and the last one (every 50th save) */
  save_point save_first[MAX_RANKS], save_last[MAX_RANKS];
  bool save_seen[MAX_RANKS];
  int64_t state_bytes; /* per rank, the largest a mem_save said */
  profile_seen profiles[MAX_RANKS];
  int recoveries; /* failure or recovery events: this job should have none */
  double job_seconds;
} job_events;

static void events_progress(job_events *e, const json_t *event, int64_t t_ns) {
  int64_t rank, step, epoch;
  if (!bench_json_int(event, "rank", &rank) || rank != 0 ||
      !bench_json_int(event, "epoch", &epoch) || epoch != 0 ||
      !bench_json_int(event, "step", &step) || step < e->opts->warm_steps)
    return;
  if (!e->timed) {
    e->first_step = step;
    e->first_ns = t_ns;
    e->timed = true;
  }
  e->last_step = step;
  e->last_ns = t_ns;
}

static void events_save(job_events *e, const json_t *event) {
  int64_t rank, step, bytes;
  save_point point;
  if (!bench_json_int(event, "rank", &rank) || rank < 0 || rank >= MAX_RANKS ||
      !bench_json_int(event, "step", &step) || !bench_json_int(event, "saves", &point.saves) ||
      !bench_json_double(event, "mean_wait_ms", &point.mean_wait_ms) ||
      !bench_json_double(event, "mean_save_ms", &point.mean_save_ms))
    return;
  if (bench_json_int(event, "bytes", &bytes) && bytes > e->state_bytes) e->state_bytes = bytes;
  if (step < e->opts->warm_steps) return;
  if (!e->save_seen[rank]) e->save_first[rank] = point;
  e->save_seen[rank] = true;
  e->save_last[rank] = point;
}

static void events_profile(job_events *e, const json_t *event) {
  int64_t rank;
  if (!bench_json_int(event, "rank", &rank) || rank < 0 || rank >= MAX_RANKS) return;
  profile_seen *p = &e->profiles[rank];
  p->seen = bench_json_int(event, "steps", &p->steps) &&
            bench_json_int(event, "collectives", &p->collectives) &&
            bench_json_double(event, "first_window_ms", &p->first_window_ms) &&
            bench_json_double(event, "last_window_start_ms", &p->last_window_start_ms);
}

static void events_handle(job_events *e, const json_t *event) {
  int64_t t_ns;
  if (!bench_json_int(event, "t_ns", &t_ns)) return;
  if (bench_json_string_is(event, "event", "progress")) events_progress(e, event, t_ns);
  if (bench_json_string_is(event, "event", "mem_save")) events_save(e, event);
  if (bench_json_string_is(event, "event", "mem_profile")) events_profile(e, event);
  if (bench_json_string_is(event, "event", "failure") ||
      bench_json_string_is(event, "event", "recovery"))
    e->recoveries++;
  if (bench_json_string_is(event, "event", "job_end"))
    bench_json_double(event, "seconds", &e->job_seconds);
}

static void events_line(const char *line, void *arg) {
  json_t *event = bench_json_parse(line);
  if (event != NULL) events_handle(arg, event);
  json_decref(event);
}

/* ======================================================================== a job's log */

/* The launcher's output: the example's result line and keel's own warnings and errors
 * ("[time identity warn module] ..."), which a steady run should not have. */
typedef struct job_log {
  bool crc_known;
  uint32_t crc; /* the final params-crc32c that rank 0 printed */
  int complaints;
  char first_complaint[200];
} job_log;

static bool log_complaint(const char *line) {
  const char *end = line[0] == '[' ? strchr(line, ']') : NULL;
  if (end == NULL) return false;
  int length = (int)(end - line);
  return memmem(line, (size_t)length, " warn ", 6) != NULL ||
         memmem(line, (size_t)length, " error ", 7) != NULL;
}

static void log_line(const char *line, void *arg) {
  job_log *log = arg;
  if (log_complaint(line)) {
    if (log->complaints++ == 0)
      snprintf(log->first_complaint, sizeof log->first_complaint, "%.*s",
               (int)sizeof log->first_complaint - 1, line); /* cut: a sample */
    return;
  }
  const char *at = strstr(line, "params-crc32c ");
  if (at == NULL) return;
  char *end;
  unsigned long crc = strtoul(at + strlen("params-crc32c "), &end, 16);
  if (end == at + strlen("params-crc32c ")) return;
  log->crc = (uint32_t)crc;
  log->crc_known = true;
}

/* ======================================================================== one trial */

typedef struct trial {
  bench_verdict verdict;
  double step_ms; /* mean time per step past the warm steps (rank 0) */
  int64_t steps_timed;
  double wait_ms, save_ms; /* per commit, mean over ranks and saves past the warm
                            * steps; NAN without checkpoints */
  int64_t state_bytes;     /* per rank; 0 without checkpoints */
  int profiled;            /* ranks whose mem_profile came */
  profile_seen profile;    /* rank 0's */
  double job_seconds;
  double cpu_percent; /* the job's processes' CPU time over its wall time on every core */
  job_log log;
} trial;

typedef struct driver {
  const options *opts;
  char self[PATH_MAX], keel[PATH_MAX], example[PATH_MAX], directory[PATH_MAX];
} driver;

/* keel run --netns ... [--ckpt X] -- fashion_mnist --zero --hidden H --steps S --quiet */
static keel_status job_start(const driver *d, int which, bench_job *job) {
  char steps[32];
  snprintf(steps, sizeof steps, "%" PRId64, d->opts->steps);
  const char *argv[40];
  int argc = 0;
  const char *head[] = {
      d->keel,    "run",           "--netns",          "--nnodes", "4",         "--nproc-per-node",
      "1",        "--link-rate",   d->opts->link_rate, "--quiet",  "--timeout", JOB_TIMEOUT,
      "--events", job->events_path};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) argv[argc++] = head[i];
  if (configurations[which].ckpt != NULL) {
    argv[argc++] = "--ckpt";
    argv[argc++] = configurations[which].ckpt;
  }
  const char *tail[] = {"--",       d->example,       "--zero",
                        "--hidden", d->opts->hidden,  "--steps",
                        steps,      "--global-batch", d->opts->global_batch,
                        "--quiet"};
  for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[argc++] = tail[i];
  argv[argc] = NULL;
  return bench_job_spawn(job, argv, NULL);
}

/* The mean wait and save per commit over the saves between each rank's first and last
 * reported mem_save past the warm steps (their means are running means: undone here). */
static void trial_saves(trial *t, const job_events *e) {
  double wait_total = 0, save_total = 0;
  int64_t saves = 0;
  for (int rank = 0; rank < MAX_RANKS; rank++) {
    if (!e->save_seen[rank]) continue;
    const save_point *a = &e->save_first[rank], *b = &e->save_last[rank];
    if (b->saves <= a->saves) continue;
    wait_total += b->mean_wait_ms * (double)b->saves - a->mean_wait_ms * (double)a->saves;
    save_total += b->mean_save_ms * (double)b->saves - a->mean_save_ms * (double)a->saves;
    saves += b->saves - a->saves;
  }
  t->wait_ms = saves > 0 ? wait_total / (double)saves : NAN;
  t->save_ms = saves > 0 ? save_total / (double)saves : NAN;
}

static void trial_profiles(trial *t, const job_events *e) {
  for (int rank = 0; rank < MAX_RANKS; rank++) t->profiled += e->profiles[rank].seen;
  t->profile = e->profiles[0];
}

/* The trial's figures from its files; false (and why) when the job did not run clean. */
static bool trial_figures(const driver *d, int which, trial *t, const bench_job *job) {
  static job_events e;
  e = (job_events){.opts = d->opts};
  if (!bench_lines_read_file(job->events_path, events_line, &e))
    return bench_fail(&t->verdict, "no events file %s", job->events_path);
  bench_lines_read_file(job->log_path, log_line, &t->log);
  t->job_seconds = e.job_seconds;
  t->state_bytes = e.state_bytes;
  trial_saves(t, &e);
  trial_profiles(t, &e);
  if (bench_job_exit_code(job) != 0)
    return bench_fail(&t->verdict, "the job exited %d (%s)", bench_job_exit_code(job),
                      job->log_path);
  if (e.recoveries > 0) return bench_fail(&t->verdict, "the job recovered from a failure");
  if (!e.timed || e.last_step <= e.first_step)
    return bench_fail(&t->verdict, "too few progress events past step %" PRId64,
                      d->opts->warm_steps);
  if (configurations[which].ckpt != NULL && (e.state_bytes == 0 || isnan(t->wait_ms)))
    return bench_fail(&t->verdict, "too few mem_save events (--steps 100 or more)");
  t->steps_timed = e.last_step - e.first_step;
  t->step_ms = (double)(e.last_ns - e.first_ns) / 1e6 / (double)t->steps_timed;
  t->verdict.ok = true;
  return true;
}

/* User and system time of the reaped children and their reaped descendants (the launcher
 * reaps its agents, the agents their workers), in seconds. */
static double children_cpu_seconds(void) {
  struct rusage usage;
  if (getrusage(RUSAGE_CHILDREN, &usage) != 0) return NAN;
  return (double)usage.ru_utime.tv_sec + (double)usage.ru_utime.tv_usec / 1e6 +
         (double)usage.ru_stime.tv_sec + (double)usage.ru_stime.tv_usec / 1e6;
}

/* Whether the machine was saturated: 100% is every core busy for the whole job. */
static double cpu_percent(double cpu_before, int64_t started_ns) {
  double wall_s = (double)(keel_now_ns() - started_ns) / 1e9;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (wall_s <= 0 || cores <= 0) return NAN;
  return (children_cpu_seconds() - cpu_before) / (wall_s * (double)cores) * 100.0;
}

static void trial_run(const driver *d, int which, int index, trial *t) {
  *t = (trial){.wait_ms = NAN, .save_ms = NAN, .cpu_percent = NAN};
  bench_job job = {0};
  char name[64];
  snprintf(name, sizeof name, "%s-%02d", configurations[which].name, index);
  if (!bench_job_paths(&job, d->directory, name)) {
    bench_fail(&t->verdict, "path too long under %s", d->directory);
    return;
  }
  double cpu_before = children_cpu_seconds();
  int64_t started_ns = keel_now_ns();
  if (job_start(d, which, &job) != KEEL_OK) {
    bench_fail(&t->verdict, "cannot start %s", d->keel);
    return;
  }
  bool ended = bench_job_wait(&job, JOB_LIMIT_NS);
  bench_job_kill(&job); /* reaps it; ends it first should it have outlived its --timeout */
  t->cpu_percent = cpu_percent(cpu_before, started_ns);
  bool measured = ended ? trial_figures(d, which, t, &job)
                        : bench_fail(&t->verdict, "the job ran past %s", JOB_TIMEOUT);
  if (measured && !d->opts->keep) {
    unlink(job.events_path);
    unlink(job.log_path);
  }
}

/* ======================================================================== summaries */

typedef struct summary {
  int ok, failed;
  double step_ms, step_min_ms, step_max_ms;          /* median, min, max over the trials */
  double wait_ms, save_ms, job_seconds, cpu_percent; /* medians */
  int64_t state_bytes;
  int profiled;                                 /* ranks with a profile, all trials together */
  double first_window_ms, last_window_start_ms; /* medians of rank 0's */
  int64_t collectives;
  int complaints;
  char first_complaint[200];
  bool crc_known;
  uint32_t crc;
  bool crc_differs; /* between its trials */
} summary;

/* The median of the ok trials' values at offset that are numbers; NAN if none. */
static double median_of(const trial *trials, int count, size_t offset, double *min_p,
                        double *max_p) {
  double values[MAX_TRIALS];
  int n = 0;
  for (int i = 0; i < count; i++) {
    double value = *(const double *)((const char *)&trials[i] + offset);
    if (trials[i].verdict.ok && !isnan(value)) values[n++] = value;
  }
  if (n == 0) return NAN;
  qsort(values, (size_t)n, sizeof values[0], bench_compare_doubles);
  if (min_p) *min_p = values[0];
  if (max_p) *max_p = values[n - 1];
  return bench_median_sorted(values, n);
}

static void summary_log(summary *s, const trial *t) {
  if (t->log.complaints > 0 && s->complaints == 0)
    snprintf(s->first_complaint, sizeof s->first_complaint, "%s", t->log.first_complaint);
  s->complaints += t->log.complaints;
  if (!t->verdict.ok || !t->log.crc_known) return;
  if (s->crc_known && s->crc != t->log.crc) s->crc_differs = true;
  s->crc = t->log.crc;
  s->crc_known = true;
}

static void summarize(const trial *trials, int count, summary *s) {
  *s = (summary){.step_min_ms = NAN, .step_max_ms = NAN};
  double first_windows[MAX_TRIALS], last_starts[MAX_TRIALS];
  int windows = 0;
  for (int i = 0; i < count; i++) {
    const trial *t = &trials[i];
    summary_log(s, t);
    if (!t->verdict.ok) {
      s->failed++;
      continue;
    }
    s->ok++;
    if (t->state_bytes > s->state_bytes) s->state_bytes = t->state_bytes;
    s->profiled += t->profiled;
    if (!t->profile.seen) continue;
    s->collectives = t->profile.collectives;
    first_windows[windows] = t->profile.first_window_ms;
    last_starts[windows++] = t->profile.last_window_start_ms;
  }
  s->step_ms = median_of(trials, count, offsetof(trial, step_ms), &s->step_min_ms, &s->step_max_ms);
  s->wait_ms = median_of(trials, count, offsetof(trial, wait_ms), NULL, NULL);
  s->save_ms = median_of(trials, count, offsetof(trial, save_ms), NULL, NULL);
  s->job_seconds = median_of(trials, count, offsetof(trial, job_seconds), NULL, NULL);
  s->cpu_percent = median_of(trials, count, offsetof(trial, cpu_percent), NULL, NULL);
  s->first_window_ms = s->last_window_start_ms = NAN;
  if (windows == 0) return;
  qsort(first_windows, (size_t)windows, sizeof first_windows[0], bench_compare_doubles);
  qsort(last_starts, (size_t)windows, sizeof last_starts[0], bench_compare_doubles);
  s->first_window_ms = bench_median_sorted(first_windows, windows);
  s->last_window_start_ms = bench_median_sorted(last_starts, windows);
}

static double overhead_percent(const summary *summaries, int which) {
  double peer = summaries[CONFIG_NONE].step_ms;
  if (which == CONFIG_NONE || isnan(peer) || peer <= 0) return NAN;
  return (summaries[which].step_ms / peer - 1.0) * 100.0;
}

/* ======================================================================== output */

static void cell_print(double value, int width, int decimals) {
  if (isnan(value))
    printf(" %*s", width, "-");
  else
    printf(" %*.*f", width, decimals, value);
}

static int64_t state_bytes_of(const summary *summaries, const bool *ran) {
  int64_t bytes = 0;
  for (int i = 0; i < CONFIG_COUNT; i++) {
    if (ran[i] && summaries[i].state_bytes > bytes) bytes = summaries[i].state_bytes;
  }
  return bytes;
}

static void header_print(const options *opts, const summary *summaries, const bool *ran) {
  printf(
      "in-memory checkpoint every step, replicas=2: keel run --netns --nnodes %d "
      "--nproc-per-node 1 --link-rate %s -- fashion_mnist --zero --hidden %s --global-batch %s "
      "--steps %" PRId64 "; state per rank %" PRId64
      " bytes (mem_save); steady state: rank 0's progress from "
      "step %" PRId64 " on; medians over %" PRId64 " interleaved trials\n",
      NODES, opts->link_rate, opts->hidden, opts->global_batch, opts->steps,
      state_bytes_of(summaries, ran), opts->warm_steps, opts->trials);
  printf("%-10s %6s %6s %8s %8s %8s %9s %8s %8s %7s %5s  %s\n", "config", "trials", "failed",
         "step_ms", "min", "max", "overhead", "wait_ms", "save_ms", "job_s", "cpu%", "--ckpt");
}

static void row_print(const summary *summaries, int which) {
  const summary *s = &summaries[which];
  printf("%-10s %6d %6d", configurations[which].name, s->ok + s->failed, s->failed);
  cell_print(s->step_ms, 8, 1);
  cell_print(s->step_min_ms, 8, 1);
  cell_print(s->step_max_ms, 8, 1);
  double overhead = overhead_percent(summaries, which);
  if (isnan(overhead))
    printf(" %9s", "-");
  else
    printf(" %+8.1f%%", overhead);
  cell_print(s->wait_ms, 8, 2);
  cell_print(s->save_ms, 8, 2);
  cell_print(s->job_seconds, 7, 1);
  cell_print(s->cpu_percent, 5, 0);
  printf("  %s\n", configurations[which].ckpt ? configurations[which].ckpt : "(none)");
}

static void profiles_print(const summary *summaries, const bool *ran) {
  printf(
      "\nidle windows profiled (mem_profile): ranks that published one over all trials, "
      "the step's collectives, rank 0's first window (step begin -> first collective) and "
      "the start of its last (after the last collective, until the step ends), medians\n");
  printf("%-10s %8s %11s %15s %19s\n", "config", "profiled", "collectives", "first_window_ms",
         "last_window_start_ms");
  for (int i = 0; i < CONFIG_COUNT; i++) {
    if (!ran[i] || configurations[i].ckpt == NULL) continue;
    const summary *s = &summaries[i];
    printf("%-10s %4d/%-3" PRId64 " %11" PRId64, configurations[i].name, s->profiled,
           (int64_t)s->ok * NODES, s->collectives);
    cell_print(s->first_window_ms, 15, 2);
    cell_print(s->last_window_start_ms, 20, 1);
    printf("\n");
  }
}

static void notes_print(const summary *summaries, const bool *ran) {
  bool first = true;
  for (int i = 0; i < CONFIG_COUNT; i++) {
    if (!ran[i]) continue;
    const summary *s = &summaries[i];
    if (s->complaints > 0) {
      printf("%s%s: %d warning or error lines in the logs, the first: %s\n", first ? "\n" : "",
             configurations[i].name, s->complaints, s->first_complaint);
      first = false;
    }
    if (s->crc_differs || (s->crc_known && summaries[CONFIG_NONE].crc_known &&
                           s->crc != summaries[CONFIG_NONE].crc)) {
      printf("%s%s: the final params-crc32c differs between trials or from none's\n",
             first ? "\n" : "", configurations[i].name);
      first = false;
    }
  }
  if (!ran[CONFIG_WINDOWS]) return;
  double overhead = overhead_percent(summaries, CONFIG_WINDOWS);
  printf("\n%s: overhead %+.1f%% against the goal of %.0f%% (hard limit %.0f%%): %s\n",
         configurations[CONFIG_WINDOWS].name, overhead, GOAL_PERCENT, LIMIT_PERCENT,
         isnan(overhead)             ? "not measured"
         : overhead <= GOAL_PERCENT  ? "met"
         : overhead <= LIMIT_PERCENT ? "within the limit"
                                     : "OVER the limit");
}

static void json_number(const char *name, double value, int decimals) {
  if (isnan(value))
    printf(",\"%s\":null", name);
  else
    printf(",\"%s\":%.*f", name, decimals, value);
}

static void json_row(const summary *summaries, int which, bool first) {
  const summary *s = &summaries[which];
  printf("%s{\"impl\":\"%s\",\"ckpt\":", first ? "" : ",", configurations[which].name);
  if (configurations[which].ckpt)
    printf("\"%s\"", configurations[which].ckpt);
  else
    printf("null");
  printf(",\"trials\":%d,\"failed\":%d", s->ok + s->failed, s->failed);
  json_number("step_ms", s->step_ms, 3);
  json_number("step_min_ms", s->step_min_ms, 3);
  json_number("step_max_ms", s->step_max_ms, 3);
  json_number("overhead_percent", overhead_percent(summaries, which), 2);
  json_number("wait_ms", s->wait_ms, 3);
  json_number("save_ms", s->save_ms, 3);
  json_number("job_s", s->job_seconds, 3);
  json_number("cpu_percent", s->cpu_percent, 1);
  printf(",\"profiled_ranks\":%d,\"collectives\":%" PRId64, s->profiled, s->collectives);
  json_number("first_window_ms", s->first_window_ms, 3);
  json_number("last_window_start_ms", s->last_window_start_ms, 3);
  printf(",\"log_complaints\":%d,\"crc_differs\":%s}", s->complaints,
         s->crc_differs ? "true" : "false");
}

static void json_print(const options *opts, const summary *summaries, const bool *ran) {
  printf(
      "{\"bench\":\"mem_overhead\",\"nodes\":%d,\"per_node\":1,\"link_rate\":\"%s\","
      "\"hidden\":\"%s\",\"global_batch\":%s,\"steps\":%" PRId64 ",\"warm_steps\":%" PRId64
      ",\"trials\":%" PRId64 ",\"state_bytes\":%" PRId64
      ",\"goal_percent\":%.1f,\"limit_percent\":%.1f,"
      "\"configs\":[",
      NODES, opts->link_rate, opts->hidden, opts->global_batch, opts->steps, opts->warm_steps,
      opts->trials, state_bytes_of(summaries, ran), GOAL_PERCENT, LIMIT_PERCENT);
  bool first = true;
  for (int i = 0; i < CONFIG_COUNT; i++) {
    if (!ran[i]) continue;
    json_row(summaries, i, first);
    first = false;
  }
  printf("]}\n");
}

static void results_print(const options *opts, const bool *ran, const summary *summaries) {
  if (opts->json) {
    json_print(opts, summaries, ran);
    return;
  }
  header_print(opts, summaries, ran);
  for (int i = 0; i < CONFIG_COUNT; i++) {
    if (ran[i]) row_print(summaries, i);
  }
  printf(
      "step_ms: mean time per step in steady state (median over trials; min, max of the "
      "trials); overhead: against none's; wait_ms: how long a commit waited for a slot still "
      "being replicated (blocking: for the copy), save_ms: the snapshot's copy into /dev/shm "
      "in the commit (both per commit, mean over ranks, from the 50th save on); job_s: the "
      "launcher's run; cpu%%: the job's CPU time over its wall time on all %ld cores\n",
      sysconf(_SC_NPROCESSORS_ONLN));
  profiles_print(summaries, ran);
  notes_print(summaries, ran);
}

/* ======================================================================== the driver */

/* Whether this process may make network namespaces: root, and a kernel that lets it (a
 * container may not). Tried in a child, which exits at once. */
static bool namespaces_possible(void) {
  if (geteuid() != 0) return false;
  pid_t child = fork();
  if (child < 0) return false;
  if (child == 0) _exit(unshare(CLONE_NEWNET) == 0 ? 0 : 1);
  int status;
  if (waitpid(child, &status, 0) != child) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static bool driver_paths(driver *d, const char *argv0) {
  return bench_self_path(argv0, d->self, sizeof d->self) &&
         bench_program_path(d->self, d->opts->keel_path, "bin/keel", d->keel, sizeof d->keel) &&
         bench_program_path(d->self, d->opts->example_path, "bin/fashion_mnist", d->example,
                            sizeof d->example) &&
         bench_make_directory("mem-overhead", d->directory, sizeof d->directory);
}

/* One trial of each configuration in turn, so that the machine's drift touches all alike. */
static void trials_run(const driver *d, trial (*trials)[MAX_TRIALS]) {
  for (int index = 0; index < d->opts->trials; index++) {
    for (int which = 0; which < CONFIG_COUNT; which++) {
      if (!d->opts->wanted[which]) continue;
      trial *t = &trials[which][index];
      if (d->opts->verbose)
        fprintf(stderr, "mem_overhead: %s trial %d...\n", configurations[which].name, index);
      trial_run(d, which, index, t);
      if (!t->verdict.ok)
        fprintf(stderr, "mem_overhead: %s trial %d failed: %s\n", configurations[which].name, index,
                t->verdict.why);
      else if (d->opts->verbose)
        fprintf(stderr,
                "mem_overhead: %s trial %d: %.1f ms/step over %" PRId64
                " steps, wait %.2f ms, %d ranks profiled, job %.1f s, cpu %.0f%%\n",
                configurations[which].name, index, t->step_ms, t->steps_timed, t->wait_ms,
                t->profiled, t->job_seconds, t->cpu_percent);
    }
  }
}

static int driver_main(const options *opts, const char *argv0) {
  static driver d;
  static trial trials[CONFIG_COUNT][MAX_TRIALS];
  d.opts = opts;
  if (!namespaces_possible()) {
    printf("mem_overhead: skipped: keel run --netns needs root and network namespaces\n");
    return 0;
  }
  if (!driver_paths(&d, argv0)) return 1;
  trials_run(&d, trials);
  summary summaries[CONFIG_COUNT];
  int failed = 0;
  for (int i = 0; i < CONFIG_COUNT; i++) {
    if (!opts->wanted[i]) continue;
    summarize(trials[i], (int)opts->trials, &summaries[i]);
    failed += summaries[i].failed;
  }
  results_print(opts, opts->wanted, summaries);
  /* Files of failed trials stay for a look; the directory goes only if empty. */
  if (rmdir(d.directory) != 0 && (failed > 0 || opts->keep))
    fprintf(stderr, "mem_overhead: events and logs are in %s\n", d.directory);
  return failed == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  return driver_main(&opts, argv[0]);
}
