/* Node-failure benchmark (issue 10): a whole node (its agent and its workers) lost at once ->
 * first collective done in the new epoch, p50/p95, against one process killed in the same kind
 * of job in the same run (ratio node / process). Jobs of 3 nodes x 2 workers of toy_train:
 * `keel run --agents` on its embedded store (shrink; replace by a spare node), agents started
 * by hand on a one-member etcd (the root's node killed: recovery and root failover; a node
 * stopped: a silent host, which only the root's lease path notices), and, as root, `keel run
 * --agents --netns` with a node partitioned. Scenarios run interleaved, one trial each in turn.
 * Usage: nodes [--json] [--trials N] [--partition-trials N] [--only NAME,...] [--keel PATH]
 *        [--toy PATH] [--etcd PATH] [--keep] [--verbose] */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_etcd.h"
#include "bench_jobs.h"
#include "bench_stats.h"
#include "keel/keel.h"

#define NODES 3
#define PER_NODE 2
#define SPARE_NODE NODES /* the replace jobs' fourth node, all spares */
#define VICTIM_RANK 5    /* the process fault's victim: uid 5, node 2, in epoch 0 */
#define VICTIM_NODE 2    /* the supervised node faults' victim (rank 0 lives on node 0) */
#define UID_LIMIT 64     /* above every uid of these jobs (agents' uid ranges included) */
#define MAX_TRIALS 200
#define WARM_STEP 10 /* the fault comes once some rank reports this step */
#define SECOND_NS BENCH_SECOND_NS
#define START_LIMIT_NS (40 * SECOND_NS)    /* start -> WARM_STEP */
#define RECOVERY_LIMIT_NS (30 * SECOND_NS) /* fault -> every figure of the trial */
#define END_LIMIT_NS (15 * SECOND_NS)      /* SIGTERM -> the job's processes gone */
#define INJECT_LIMIT_NS (10 * SECOND_NS)
#define ORPHAN_LIMIT_NS (2 * SECOND_NS)
/* The jobs end by SIGTERM once measured; these bound them should the bench fail. */
#define JOB_TIMEOUT "120s"
#define TOY_STEPS "100000"
/* An orderly stop waits this long for the workers to leave (the launcher's default: 30 s). */
#define STOP_GRACE_SETTING "KEEL_STOP_GRACE=5s"

/* ======================================================================== scenarios */

typedef enum launch {
  LAUNCH_SUPERVISED, /* keel run --agents: a supervisor that serves the store */
  LAUNCH_BY_HAND,    /* keel agent per node on etcd: no supervisor, the root's leases */
  LAUNCH_NETNS,      /* keel run --agents --netns: each node in a network namespace */
} launch;

typedef enum fault {
  FAULT_PROCESS,   /* SIGKILL of the worker of rank VICTIM_RANK (the peer) */
  FAULT_NODE,      /* keel inject kill-node VICTIM_NODE: its agent's process group */
  FAULT_ROOT_NODE, /* SIGKILL of the root agent and its workers, by pid */
  FAULT_STOP_NODE, /* SIGSTOP of a node that is not root's: silent, like a hung host */
  FAULT_PARTITION, /* keel inject partition of a node that is not root's */
} fault;

typedef struct scenario {
  const char *name; /* table row, file names, --only, JSON "impl" */
  launch how;
  fault what;
  bool replace;      /* --on-failure replace with a spare node (else shrink) */
  int peer;          /* the scenario whose p50 this one's is divided by; -1: none */
  int64_t new_world; /* the recovery's membership, checked */
  int64_t replaced;  /* ranks taken by spares, checked */
} scenario;

enum {
  SUP_SHRINK_PROCESS,
  SUP_SHRINK_NODE,
  SUP_REPLACE_PROCESS,
  SUP_REPLACE_NODE,
  ETCD_PROCESS,
  ETCD_ROOT_NODE,
  ETCD_STOPPED_NODE,
  NETNS_PROCESS,
  NETNS_PARTITION,
  SCENARIO_COUNT
};

static const scenario scenarios[SCENARIO_COUNT] = {
    [SUP_SHRINK_PROCESS] = {"agents-shrink-process", LAUNCH_SUPERVISED, FAULT_PROCESS, false, -1, 5,
                            0},
    [SUP_SHRINK_NODE] = {"agents-shrink-node", LAUNCH_SUPERVISED, FAULT_NODE, false,
                         SUP_SHRINK_PROCESS, 4, 0},
    [SUP_REPLACE_PROCESS] = {"agents-replace-process", LAUNCH_SUPERVISED, FAULT_PROCESS, true, -1,
                             6, 1},
    [SUP_REPLACE_NODE] = {"agents-replace-node", LAUNCH_SUPERVISED, FAULT_NODE, true,
                          SUP_REPLACE_PROCESS, 6, 2},
    [ETCD_PROCESS] = {"etcd-process", LAUNCH_BY_HAND, FAULT_PROCESS, false, -1, 5, 0},
    [ETCD_ROOT_NODE] = {"etcd-root-node", LAUNCH_BY_HAND, FAULT_ROOT_NODE, false, ETCD_PROCESS, 4,
                        0},
    [ETCD_STOPPED_NODE] = {"etcd-stopped-node", LAUNCH_BY_HAND, FAULT_STOP_NODE, false,
                           ETCD_PROCESS, 4, 0},
    [NETNS_PROCESS] = {"netns-process", LAUNCH_NETNS, FAULT_PROCESS, false, -1, 5, 0},
    [NETNS_PARTITION] = {"netns-partition", LAUNCH_NETNS, FAULT_PARTITION, false, NETNS_PROCESS, 4,
                         0},
};

/* ======================================================================== options */

typedef struct options {
  bool json, keep, verbose;
  int64_t trials, partition_trials;
  bool wanted[SCENARIO_COUNT];
  const char *keel_path, *toy_path, *etcd_path;
} options;

/* --only a,b: those scenarios; false if a name is unknown. */
static bool scenarios_choose(const char *list, bool *wanted) {
  char copy[512];
  snprintf(copy, sizeof copy, "%s", list);
  for (int i = 0; i < SCENARIO_COUNT; i++) wanted[i] = false;
  char *save = NULL;
  for (char *name = strtok_r(copy, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
    bool known = false;
    for (int i = 0; i < SCENARIO_COUNT; i++) {
      if (strcmp(name, scenarios[i].name) == 0) wanted[i] = known = true;
    }
    if (!known) return false;
  }
  return true;
}

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.trials = 20, .partition_trials = 5};
  for (int i = 0; i < SCENARIO_COUNT; i++) opts->wanted[i] = true;
  static const struct option long_options[] = {{"json", no_argument, 0, 'j'},
                                               {"keep", no_argument, 0, 'k'},
                                               {"verbose", no_argument, 0, 'v'},
                                               {"trials", required_argument, 0, 't'},
                                               {"partition-trials", required_argument, 0, 'p'},
                                               {"only", required_argument, 0, 'o'},
                                               {"keel", required_argument, 0, 'K'},
                                               {"toy", required_argument, 0, 'T'},
                                               {"etcd", required_argument, 0, 'E'},
                                               {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    bool ok = option != '?';
    if (option == 'j') opts->json = true;
    if (option == 'k') opts->keep = true;
    if (option == 'v') opts->verbose = true;
    if (option == 'K') opts->keel_path = optarg;
    if (option == 'T') opts->toy_path = optarg;
    if (option == 'E') opts->etcd_path = optarg;
    if (option == 'o') ok = scenarios_choose(optarg, opts->wanted);
    if (option == 't') ok = keel_parse_int(optarg, 1, MAX_TRIALS, &opts->trials) == KEEL_OK;
    if (option == 'p')
      ok = keel_parse_int(optarg, 0, MAX_TRIALS, &opts->partition_trials) == KEEL_OK;
    if (!ok) {
      fprintf(stderr, "nodes: bad flag (see the file's header)\n");
      return -1;
    }
  }
  return 0;
}

/* ======================================================================== a job's events */

/* What the job's events files said so far. t_ns values; 0: not seen. */
typedef struct job_view {
  char job_id[32];
  int64_t step; /* the highest progress step of epoch 0 */
  pid_t worker_pid[UID_LIMIT];
  int worker_node[UID_LIMIT];
  pid_t agent_pid[NODES + 1];
  int root_node;     /* of the latest root event before the fault; -1: none yet */
  int64_t root_ns;   /* its t_ns */
  int64_t fault_ns;  /* 0 until the fault; the events below count only after it */
  int64_t origin_ns; /* the fault's time, which the figures count from */
  int64_t new_root_ns, fence_ns, lost_ns;
  bool recovered;
  char recovery[4096]; /* the first recovery event after the fault */
} job_view;

static int64_t earliest(int64_t seen_ns, int64_t t_ns) {
  return seen_ns == 0 || t_ns < seen_ns ? t_ns : seen_ns;
}

static void view_processes(job_view *view, const json_t *event) {
  int64_t uid, pid, node;
  if (bench_json_string_is(event, "event", "spawn") && bench_json_int(event, "uid", &uid) &&
      bench_json_int(event, "pid", &pid) && bench_json_int(event, "node", &node) && uid >= 0 &&
      uid < UID_LIMIT) {
    view->worker_pid[uid] = (pid_t)pid;
    view->worker_node[uid] = (int)node;
  }
  if (bench_json_string_is(event, "event", "agent_start") && bench_json_int(event, "node", &node) &&
      bench_json_int(event, "pid", &pid) && node >= 0 && node <= NODES)
    view->agent_pid[node] = (pid_t)pid;
  const char *job_id = json_string_value(json_object_get(event, "job_id"));
  if (bench_json_string_is(event, "event", "job_start") && job_id != NULL)
    snprintf(view->job_id, sizeof view->job_id, "%s", job_id);
}

/* root, node_fence, node_lost: the latest root before the fault, the first of each after. */
static void view_nodes(job_view *view, const json_t *event, int64_t t_ns) {
  int64_t node;
  bool after = view->fault_ns > 0 && t_ns > view->fault_ns;
  if (bench_json_string_is(event, "event", "root") && bench_json_int(event, "node", &node)) {
    if (after) view->new_root_ns = earliest(view->new_root_ns, t_ns);
    if (!after && t_ns > view->root_ns) {
      view->root_ns = t_ns;
      view->root_node = (int)node;
    }
  }
  if (after && bench_json_string_is(event, "event", "node_fence"))
    view->fence_ns = earliest(view->fence_ns, t_ns);
  if (after && bench_json_string_is(event, "event", "node_lost"))
    view->lost_ns = earliest(view->lost_ns, t_ns);
}

static void view_event(job_view *view, const char *line, const json_t *event) {
  int64_t t_ns = 0, step, epoch;
  bench_json_int(event, "t_ns", &t_ns);
  view_processes(view, event);
  view_nodes(view, event, t_ns);
  if (bench_json_string_is(event, "event", "progress") && bench_json_int(event, "epoch", &epoch) &&
      epoch == 0 && bench_json_int(event, "step", &step) && step > view->step)
    view->step = step;
  if (bench_json_string_is(event, "event", "recovery") && !view->recovered && view->fault_ns > 0 &&
      t_ns > view->fault_ns) {
    int length = snprintf(view->recovery, sizeof view->recovery, "%s", line);
    view->recovered = length > 0 && (size_t)length < sizeof view->recovery;
  }
}

static void view_line(const char *line, void *arg) {
  json_t *event = bench_json_parse(line);
  if (event != NULL) view_event(arg, line, event);
  json_decref(event);
}

/* ======================================================================== a running job */

/* The processes of one trial: a launcher (supervised, netns) or an agent per node (by hand,
 * each with its own events file). */
typedef struct job_run {
  const scenario *kind;
  bench_job launcher;
  bench_job agents[NODES];
  bench_lines lines[NODES];
  int files;
  job_view view;
  int victim_node; /* -1 for a process fault */
} job_run;

static bench_job *run_file_owner(job_run *run, int file) {
  return run->kind->how == LAUNCH_BY_HAND ? &run->agents[file] : &run->launcher;
}

static void run_update(job_run *run) {
  for (int file = 0; file < run->files; file++)
    bench_lines_read(&run->lines[file], run_file_owner(run, file)->events_path, view_line,
                     &run->view);
}

/* Whether a process of the job ended: a launcher, or any agent of a job started by hand. */
static bool run_someone_ended(job_run *run) {
  if (run->kind->how != LAUNCH_BY_HAND) return bench_job_try_reap(&run->launcher);
  bool ended = false;
  for (int node = 0; node < NODES; node++) ended |= bench_job_try_reap(&run->agents[node]);
  return ended;
}

typedef struct driver {
  const options *opts;
  char keel[PATH_MAX], toy[PATH_MAX], self[PATH_MAX];
  char directory[PATH_MAX];
  bench_etcd etcd;
  bool etcd_running;
  bool netns_possible;
} driver;

/* The program and its arguments, the same for every job. */
static int toy_argv(const driver *d, const char **argv) {
  const char *toy[] = {"--",       d->toy,   "--steps",      TOY_STEPS,
                       "--params", "100000", "--compute-ms", "5"};
  for (size_t i = 0; i < sizeof toy / sizeof toy[0]; i++) argv[i] = toy[i];
  return (int)(sizeof toy / sizeof toy[0]);
}

/* keel run --agents ...: the supervised and the netns jobs. */
static keel_status launcher_start(driver *d, job_run *run) {
  const char *argv[48];
  int argc = 0;
  const char *head[] = {
      d->keel, "run",     "--agents",  "--nnodes",  "3",        "--nproc-per-node",
      "2",     "--quiet", "--timeout", JOB_TIMEOUT, "--events", run->launcher.events_path};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) argv[argc++] = head[i];
  if (run->kind->replace) {
    const char *replace[] = {"--spare-nodes", "1", "--on-failure", "replace"};
    for (size_t i = 0; i < 4; i++) argv[argc++] = replace[i];
  }
  if (run->kind->how == LAUNCH_NETNS) {
    /* A partition is noticed through leases: the same 1 s as the etcd jobs'. */
    const char *netns[] = {"--netns", "--heartbeat", "1s"};
    for (size_t i = 0; i < 3; i++) argv[argc++] = netns[i];
  }
  argc += toy_argv(d, argv + argc);
  argv[argc] = NULL;
  return bench_job_spawn(&run->launcher, argv, STOP_GRACE_SETTING);
}

/* keel agent --node-rank I ... on etcd, one per node, as on hosts of their own. */
static keel_status agent_start(driver *d, job_run *run, int node, const char *job_name) {
  char node_text[8];
  snprintf(node_text, sizeof node_text, "%d", node);
  const char *argv[48];
  int argc = 0;
  const char *head[] = {d->keel,
                        "agent",
                        "--node-rank",
                        node_text,
                        "--nnodes",
                        "3",
                        "--nproc-per-node",
                        "2",
                        "--heartbeat",
                        "1s",
                        "--quiet",
                        "--timeout",
                        JOB_TIMEOUT,
                        "--rdzv-endpoint",
                        d->etcd.endpoint,
                        "--rdzv-id",
                        job_name,
                        "--events",
                        run->agents[node].events_path};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) argv[argc++] = head[i];
  argc += toy_argv(d, argv + argc);
  argv[argc] = NULL;
  return bench_job_spawn(&run->agents[node], argv, STOP_GRACE_SETTING);
}

static bool run_start(driver *d, job_run *run, const char *name, bench_verdict *verdict) {
  if (run->kind->how != LAUNCH_BY_HAND) {
    run->files = 1;
    if (!bench_job_paths(&run->launcher, d->directory, name))
      return bench_fail(verdict, "path too long under %s", d->directory);
    return launcher_start(d, run) == KEEL_OK || bench_fail(verdict, "cannot start %s", d->keel);
  }
  char job_name[96];
  snprintf(job_name, sizeof job_name, "bench-nodes-%ld-%s", (long)getpid(), name);
  for (int node = 0; node < NODES; node++) {
    char file_name[96];
    snprintf(file_name, sizeof file_name, "%s-node%d", name, node);
    if (!bench_job_paths(&run->agents[node], d->directory, file_name))
      return bench_fail(verdict, "path too long under %s", d->directory);
    if (agent_start(d, run, node, job_name) != KEEL_OK)
      return bench_fail(verdict, "cannot start the agent of node %d", node);
    run->files = node + 1;
  }
  return true;
}

/* Until some rank reports WARM_STEP (every rank is in the loop: each step is an allreduce). */
static bool run_wait_training(job_run *run, bench_verdict *verdict) {
  int64_t deadline = keel_now_ns() + START_LIMIT_NS;
  while (run->view.step < WARM_STEP || run->view.job_id[0] == '\0') {
    run_update(run);
    if (run_someone_ended(run)) return bench_fail(verdict, "the job ended before it trained");
    if (keel_now_ns() >= deadline) return bench_fail(verdict, "the job did not train in 40 s");
    bench_sleep_ns(BENCH_POLL_INTERVAL_NS);
  }
  return true;
}

/* ======================================================================== the fault */

/* Whether pid is alive and a child of parent: never signal a recycled pid. */
static bool is_child_of(pid_t pid, pid_t parent) {
  char state;
  int actual_parent;
  return pid > 0 && keel_process_stat(pid, &state, &actual_parent) == KEEL_OK &&
         actual_parent == (int)parent;
}

/* Waits for a short-lived child with a finer poll than bench_job_wait's: its exit is a time. */
static bool short_child_wait(bench_job *child, int64_t limit_ns) {
  int64_t deadline = keel_now_ns() + limit_ns;
  while (!bench_job_try_reap(child)) {
    if (keel_now_ns() >= deadline) return false;
    bench_sleep_ns(100 * 1000);
  }
  return true;
}

/* keel inject ACTION TARGET --job ID. Its last act is the fault (after it has started, read
 * the job file, connected to the store and read the node's key: tens of ms here), so the
 * figures count from its exit; *inject_ms is its whole run. Events count from its start. */
static bool inject_run(driver *d, job_run *run, const char *action, int target, double *inject_ms,
                       bench_verdict *verdict) {
  bench_job inject = {0};
  char target_text[16];
  snprintf(target_text, sizeof target_text, "%d", target);
  int length =
      snprintf(inject.log_path, sizeof inject.log_path, "%s.inject", run->launcher.log_path);
  if (length < 0 || (size_t)length >= sizeof inject.log_path)
    return bench_fail(verdict, "path too long: %s", run->launcher.log_path);
  const char *argv[] = {d->keel, "inject", action, target_text, "--job", run->view.job_id, NULL};
  run->view.fault_ns = keel_now_ns();
  if (bench_job_spawn(&inject, argv, NULL) != KEEL_OK)
    return bench_fail(verdict, "cannot start keel inject");
  bool ended = short_child_wait(&inject, INJECT_LIMIT_NS);
  run->view.origin_ns = keel_now_ns();
  *inject_ms = (double)(run->view.origin_ns - run->view.fault_ns) / 1e6;
  bench_job_kill(&inject);
  if (!ended || bench_job_exit_code(&inject) != 0)
    return bench_fail(verdict, "keel inject %s %d failed (%s)", action, target, inject.log_path);
  unlink(inject.log_path);
  return true;
}

/* A node that is not the root's, the highest (rank 0 lives on node 0). */
static int node_not_root(const job_view *view) {
  return view->root_node == NODES - 1 ? NODES - 2 : NODES - 1;
}

/* signal to the node's agent and to each of its workers, by pid (agents started by hand are
 * not in process groups of their own). */
static void node_signal(job_run *run, int node, int signal_number) {
  pid_t agent = run->agents[node].launcher;
  if (run->agents[node].reaped) return;
  kill(agent, signal_number);
  for (int uid = 0; uid < UID_LIMIT; uid++) {
    pid_t worker = run->view.worker_pid[uid];
    if (run->view.worker_node[uid] == node && is_child_of(worker, agent))
      kill(worker, signal_number);
  }
}

/* The fault on a node started by hand: its time is taken just before the first signal. */
static bool node_fault(job_run *run, int node, int signal_number, bench_verdict *verdict) {
  run->victim_node = node;
  if (run->agents[node].reaped) return bench_fail(verdict, "the agent of node %d ended", node);
  run->view.fault_ns = run->view.origin_ns = keel_now_ns();
  node_signal(run, node, signal_number);
  return true;
}

/* The worker of rank VICTIM_RANK, by pid: its agent reaps it and says so in the store. */
static bool process_kill_by_pid(job_run *run, bench_verdict *verdict) {
  pid_t worker = run->view.worker_pid[VICTIM_RANK];
  int node = run->view.worker_node[VICTIM_RANK];
  if (node < 0 || node >= NODES || !is_child_of(worker, run->agents[node].launcher))
    return bench_fail(verdict, "no live worker of rank %d", VICTIM_RANK);
  run->view.fault_ns = run->view.origin_ns = keel_now_ns();
  return kill(worker, SIGKILL) == 0 || bench_fail(verdict, "kill: %s", strerror(errno));
}

static bool fault_make(driver *d, job_run *run, double *inject_ms, bench_verdict *verdict) {
  run->victim_node = -1;
  switch (run->kind->what) {
    case FAULT_PROCESS:
      if (run->kind->how == LAUNCH_BY_HAND) return process_kill_by_pid(run, verdict);
      return inject_run(d, run, "kill", VICTIM_RANK, inject_ms, verdict);
    case FAULT_NODE:
      run->victim_node = VICTIM_NODE;
      return inject_run(d, run, "kill-node", VICTIM_NODE, inject_ms, verdict);
    case FAULT_PARTITION:
      run->victim_node = node_not_root(&run->view);
      return inject_run(d, run, "partition", run->victim_node, inject_ms, verdict);
    case FAULT_ROOT_NODE:
      if (run->view.root_node < 0) return bench_fail(verdict, "no root agent yet");
      return node_fault(run, run->view.root_node, SIGKILL, verdict);
    case FAULT_STOP_NODE:
      return node_fault(run, node_not_root(&run->view), SIGSTOP, verdict);
  }
  return bench_fail(verdict, "unknown fault");
}

/* Every figure the scenario measures has its event. */
static bool run_measured(const job_run *run) {
  const job_view *view = &run->view;
  if (!view->recovered) return false;
  if (run->kind->what == FAULT_ROOT_NODE && view->new_root_ns == 0) return false;
  if (run->kind->what == FAULT_PARTITION && view->fence_ns == 0) return false;
  return true;
}

static bool run_wait_recovery(job_run *run, bench_verdict *verdict) {
  while (!run_measured(run)) {
    run_update(run);
    if (run_measured(run)) break;
    if (run->kind->how != LAUNCH_BY_HAND && bench_job_try_reap(&run->launcher))
      return bench_fail(verdict, "the job ended without recovering");
    if (keel_now_ns() - run->view.fault_ns >= RECOVERY_LIMIT_NS)
      return bench_fail(verdict, "no recovery (or root, or fence) within 30 s of the fault");
    bench_sleep_ns(BENCH_POLL_INTERVAL_NS);
  }
  return true;
}

/* ======================================================================== ending a job */

/* pid, if it is this process's child now (a subreaper gets the orphans of dead agents), is
 * killed if still alive and reaped. */
static void orphan_reap(pid_t pid) {
  if (pid <= 0) return;
  int64_t deadline = keel_now_ns() + ORPHAN_LIMIT_NS;
  for (;;) {
    pid_t reaped = waitpid(pid, NULL, WNOHANG);
    if (reaped != 0) return; /* reaped, or not this process's child */
    if (keel_now_ns() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      return;
    }
    bench_sleep_ns(BENCH_POLL_INTERVAL_NS);
  }
}

static void orphans_reap(const job_view *view) {
  for (int uid = 0; uid < UID_LIMIT; uid++) orphan_reap(view->worker_pid[uid]);
  for (int node = 0; node <= NODES; node++) orphan_reap(view->agent_pid[node]);
}

/* SIGTERM: the launcher stops every node in order. If it does not end in time, every node's
 * process group (an agent leads its own) and the launcher are killed. */
static void launcher_end(job_run *run) {
  if (run->launcher.reaped) return;
  kill(run->launcher.launcher, SIGTERM);
  if (bench_job_wait(&run->launcher, END_LIMIT_NS)) return;
  for (int node = 0; node <= NODES; node++) {
    if (is_child_of(run->view.agent_pid[node], run->launcher.launcher))
      kill(-run->view.agent_pid[node], SIGKILL);
  }
  bench_job_kill(&run->launcher);
}

/* A stopped node is killed (its processes would never end); the others stop in order. */
static void agents_end(job_run *run) {
  if (run->kind->what == FAULT_STOP_NODE && run->victim_node >= 0)
    node_signal(run, run->victim_node, SIGKILL);
  for (int node = 0; node < run->files; node++) {
    if (!run->agents[node].reaped) kill(run->agents[node].launcher, SIGTERM);
  }
  for (int node = 0; node < run->files; node++) {
    bench_job *agent = &run->agents[node];
    if (bench_job_wait(agent, END_LIMIT_NS)) continue;
    for (int uid = 0; uid < UID_LIMIT; uid++) {
      if (is_child_of(run->view.worker_pid[uid], agent->launcher))
        kill(run->view.worker_pid[uid], SIGKILL);
    }
    bench_job_kill(agent);
  }
}

static void run_end(job_run *run) {
  if (run->kind->how == LAUNCH_BY_HAND)
    agents_end(run);
  else
    launcher_end(run);
  orphans_reap(&run->view);
  for (int file = 0; file < run->files; file++) {
    if (run->lines[file].fd >= 0) close(run->lines[file].fd);
  }
}

static void run_remove_files(job_run *run) {
  for (int file = 0; file < run->files; file++) {
    unlink(run_file_owner(run, file)->events_path);
    unlink(run_file_owner(run, file)->log_path);
  }
}

/* ======================================================================== one trial */

typedef struct trial {
  bench_verdict verdict;
  double recovery_ms;        /* fault (origin_ns) -> the recovery event's t_ns */
  double fault_to_detect_ms; /* fault -> its t_detect_ns (a survivor's collective failed) */
  double detect_ms, agree_ms, total_ms; /* the recovery event's own breakdown */
  double root_ms;                       /* fault -> the new root's root event (FAULT_ROOT_NODE) */
  double fence_ms;                      /* fault -> node_fence (FAULT_PARTITION) */
  double lost_ms;                       /* fault -> the first node_lost (supervisor or root) */
  double inject_ms; /* keel inject's run, start to exit (the fault is its last act) */
} trial;

static double since_fault_ms(const job_view *view, int64_t t_ns) {
  return t_ns > 0 ? (double)(t_ns - view->origin_ns) / 1e6 : NAN;
}

static double member_ms(const json_t *event, const char *key) {
  double value;
  return bench_json_double(event, key, &value) ? value : NAN;
}

/* The recovery event's figures, and whether it is the membership the scenario implies. */
static bool trial_figures(trial *t, const job_run *run) {
  const job_view *view = &run->view;
  json_t *event = bench_json_parse(view->recovery);
  int64_t t_ns = 0, detect_ns = 0, new_world = -1, replaced = 0;
  bool read = event != NULL && bench_json_int(event, "t_ns", &t_ns) &&
              bench_json_int(event, "new_world", &new_world);
  bench_json_int(event, "replaced", &replaced);
  bench_json_int(event, "t_detect_ns", &detect_ns);
  t->recovery_ms = since_fault_ms(view, t_ns);
  t->fault_to_detect_ms = since_fault_ms(view, detect_ns);
  t->detect_ms = member_ms(event, "detect_ms");
  t->agree_ms = member_ms(event, "agree_ms");
  t->total_ms = member_ms(event, "total_ms");
  json_decref(event);
  t->root_ms = since_fault_ms(view, view->new_root_ns);
  t->fence_ms = since_fault_ms(view, view->fence_ns);
  t->lost_ms = since_fault_ms(view, view->lost_ns);
  if (!read) return bench_fail(&t->verdict, "malformed recovery event: %.100s", view->recovery);
  if (new_world != run->kind->new_world || replaced != run->kind->replaced)
    return bench_fail(&t->verdict, "unexpected membership: %.160s", view->recovery);
  t->verdict.ok = true;
  return true;
}

static void trial_run(driver *d, int which, int index, trial *t) {
  static job_run run;
  run = (job_run){.kind = &scenarios[which], .view.root_node = -1};
  for (int file = 0; file < NODES; file++) run.lines[file].fd = -1;
  *t = (trial){.inject_ms = NAN};
  char name[64];
  snprintf(name, sizeof name, "%s-%02d", scenarios[which].name, index);
  bool measured = run_start(d, &run, name, &t->verdict) && run_wait_training(&run, &t->verdict) &&
                  fault_make(d, &run, &t->inject_ms, &t->verdict) &&
                  run_wait_recovery(&run, &t->verdict) && trial_figures(t, &run);
  run_end(&run);
  if (measured && !d->opts->keep) run_remove_files(&run);
}

/* ======================================================================== summaries */

/* Nearest-rank percentile of sorted values (as bench/recovery.c: of 20, p95 is the 19th). */
static double percentile(const double *sorted, int count, double p) {
  int rank = (int)ceil(p / 100.0 * count);
  return sorted[rank < 1 ? 0 : rank - 1];
}

typedef struct spread {
  int count;
  double p50, p95, min, max;
} spread;

/* Of the successful trials' values that are numbers (a figure a scenario lacks is NAN). */
static spread spread_of(const trial *trials, int count, size_t offset) {
  double values[MAX_TRIALS];
  spread s = {0, NAN, NAN, NAN, NAN};
  for (int i = 0; i < count; i++) {
    double value = *(const double *)((const char *)&trials[i] + offset);
    if (trials[i].verdict.ok && !isnan(value)) values[s.count++] = value;
  }
  if (s.count == 0) return s;
  qsort(values, (size_t)s.count, sizeof values[0], bench_compare_doubles);
  s.p50 = bench_median_sorted(values, s.count);
  s.p95 = percentile(values, s.count, 95);
  s.min = values[0];
  s.max = values[s.count - 1];
  return s;
}

typedef struct summary {
  int ok, failed;
  spread recovery, fault_to_detect, detect, agree, total, root, fence, lost, inject;
} summary;

static void summarize(const trial *trials, int count, summary *s) {
  *s = (summary){0};
  for (int i = 0; i < count; i++) {
    if (trials[i].verdict.ok)
      s->ok++;
    else
      s->failed++;
  }
  s->recovery = spread_of(trials, count, offsetof(trial, recovery_ms));
  s->fault_to_detect = spread_of(trials, count, offsetof(trial, fault_to_detect_ms));
  s->detect = spread_of(trials, count, offsetof(trial, detect_ms));
  s->agree = spread_of(trials, count, offsetof(trial, agree_ms));
  s->total = spread_of(trials, count, offsetof(trial, total_ms));
  s->root = spread_of(trials, count, offsetof(trial, root_ms));
  s->fence = spread_of(trials, count, offsetof(trial, fence_ms));
  s->lost = spread_of(trials, count, offsetof(trial, lost_ms));
  s->inject = spread_of(trials, count, offsetof(trial, inject_ms));
}

static void cell_print(double value) {
  if (isnan(value))
    printf(" %8s", "-");
  else
    printf(" %8.1f", value);
}

static void json_figure(const char *name, double value) {
  if (isnan(value))
    printf(",\"%s\":null", name);
  else
    printf(",\"%s\":%.3f", name, value);
}

static double ratio_to_peer(const summary *summaries, int which) {
  int peer = scenarios[which].peer;
  if (peer < 0 || summaries[peer].recovery.count == 0) return NAN;
  return summaries[which].recovery.p50 / summaries[peer].recovery.p50;
}

static void header_print(void) {
  printf(
      "node failures, 3 nodes x 2 workers (toy_train): fault -> first collective done in the "
      "new epoch (ms; from the kill, or from the exit of keel inject, whose last act it is); "
      "breakdown: medians of the recovery event's own figures; / peer: p50 "
      "over the p50 of the same job with one process killed\n");
  printf("%-24s %6s %6s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "scenario", "trials", "failed",
         "p50", "p95", "min", "max", "flt>det", "detect", "agree", "total", "/ peer");
}

static void row_print(const summary *summaries, int which) {
  const summary *s = &summaries[which];
  printf("%-24s %6d %6d", scenarios[which].name, s->ok + s->failed, s->failed);
  double cells[] = {s->recovery.p50, s->recovery.p95,        s->recovery.min,
                    s->recovery.max, s->fault_to_detect.p50, s->detect.p50,
                    s->agree.p50,    s->total.p50,           ratio_to_peer(summaries, which)};
  for (size_t i = 0; i < sizeof cells / sizeof cells[0]; i++) cell_print(cells[i]);
  printf("\n");
}

static void others_header_print(void) {
  printf(
      "\nother times after the fault (ms): node_lost (the supervisor's or the root's), the new "
      "root's root event, node_fence; inj: keel inject's run, start to exit (its last act is the "
      "fault; figures count from its exit)\n");
  printf("%-24s %8s %8s %8s %8s %8s %8s %8s\n", "scenario", "lost p50", "root p50", "root p95",
         "root max", "fnc p50", "fnc p95", "inj p50");
}

static void others_print(const summary *summaries, int which) {
  const summary *s = &summaries[which];
  printf("%-24s", scenarios[which].name);
  double cells[] = {s->lost.p50,  s->root.p50,  s->root.p95,  s->root.max,
                    s->fence.p50, s->fence.p95, s->inject.p50};
  for (size_t i = 0; i < sizeof cells / sizeof cells[0]; i++) cell_print(cells[i]);
  printf("\n");
}

static void json_print(const summary *summaries, int which) {
  const summary *s = &summaries[which];
  printf(
      "{\"bench\":\"nodes\",\"impl\":\"%s\",\"nodes\":%d,\"per_node\":%d,\"trials\":%d,"
      "\"failed\":%d",
      scenarios[which].name, NODES, PER_NODE, s->ok + s->failed, s->failed);
  json_figure("p50_ms", s->recovery.p50);
  json_figure("p95_ms", s->recovery.p95);
  json_figure("min_ms", s->recovery.min);
  json_figure("max_ms", s->recovery.max);
  json_figure("fault_to_detect_ms", s->fault_to_detect.p50);
  json_figure("detect_ms", s->detect.p50);
  json_figure("agree_ms", s->agree.p50);
  json_figure("total_ms", s->total.p50);
  json_figure("lost_ms", s->lost.p50);
  json_figure("root_p50_ms", s->root.p50);
  json_figure("root_p95_ms", s->root.p95);
  json_figure("fence_p50_ms", s->fence.p50);
  json_figure("fence_p95_ms", s->fence.p95);
  json_figure("inject_ms", s->inject.p50);
  json_figure("ratio_to_peer", ratio_to_peer(summaries, which));
  printf("}\n");
}

/* The tables, then their rows as JSON lines (--json: those alone). */
static void results_print(const options *opts, const bool *ran, const summary *summaries) {
  if (!opts->json) {
    header_print();
    for (int i = 0; i < SCENARIO_COUNT; i++) {
      if (ran[i]) row_print(summaries, i);
    }
    others_header_print();
    for (int i = 0; i < SCENARIO_COUNT; i++) {
      if (ran[i]) others_print(summaries, i);
    }
    printf("\n");
  }
  for (int i = 0; i < SCENARIO_COUNT; i++) {
    if (ran[i]) json_print(summaries, i);
  }
}

/* ======================================================================== the driver */

static bool driver_paths(driver *d, const char *argv0) {
  return bench_self_path(argv0, d->self, sizeof d->self) &&
         bench_program_path(d->self, d->opts->keel_path, "bin/keel", d->keel, sizeof d->keel) &&
         bench_program_path(d->self, d->opts->toy_path, "tests/programs/toy_train", d->toy,
                            sizeof d->toy) &&
         bench_make_directory("nodes", d->directory, sizeof d->directory);
}

/* Drops the scenarios this machine cannot run, saying why: etcd's without etcd, the
 * partition's without root (keel run --netns needs it to make namespaces). */
static void scenarios_available(driver *d, bool *ran) {
  bool by_hand = false;
  for (int i = 0; i < SCENARIO_COUNT; i++) {
    ran[i] = d->opts->wanted[i];
    by_hand |= ran[i] && scenarios[i].how == LAUNCH_BY_HAND;
  }
  char why[PATH_MAX + 64] = "";
  if (by_hand && !bench_etcd_find(d->opts->etcd_path, d->etcd.program, sizeof d->etcd.program))
    snprintf(why, sizeof why, "no etcd program (install etcd-server, or pass --etcd)");
  if (by_hand && why[0] == '\0')
    d->etcd_running = bench_etcd_start(&d->etcd, d->directory, why, sizeof why);
  d->netns_possible = geteuid() == 0 && d->opts->partition_trials > 0;
  for (int i = 0; i < SCENARIO_COUNT; i++) {
    if (scenarios[i].how == LAUNCH_BY_HAND && ran[i] && !d->etcd_running) {
      fprintf(stderr, "nodes: skipping %s: %s\n", scenarios[i].name, why);
      ran[i] = false;
    }
    if (scenarios[i].how == LAUNCH_NETNS && ran[i] && !d->netns_possible) {
      fprintf(stderr, "nodes: skipping %s: keel run --netns needs root\n", scenarios[i].name);
      ran[i] = false;
    }
  }
}

static int64_t trials_of(const options *opts, int which) {
  return scenarios[which].how == LAUNCH_NETNS ? opts->partition_trials : opts->trials;
}

/* One trial of each scenario in turn, so that the machine's drift touches all alike. */
static void trials_run(driver *d, const bool *ran, trial (*trials)[MAX_TRIALS]) {
  for (int index = 0; index < d->opts->trials || index < d->opts->partition_trials; index++) {
    for (int which = 0; which < SCENARIO_COUNT; which++) {
      if (!ran[which] || index >= trials_of(d->opts, which)) continue;
      trial *t = &trials[which][index];
      trial_run(d, which, index, t);
      if (!t->verdict.ok)
        fprintf(stderr, "nodes: %s trial %d failed: %s\n", scenarios[which].name, index,
                t->verdict.why);
      else if (d->opts->verbose)
        fprintf(stderr, "nodes: %s trial %d: %.1f ms\n", scenarios[which].name, index,
                t->recovery_ms);
    }
  }
}

static int driver_main(const options *opts, const char *argv0) {
  static driver d;
  static trial trials[SCENARIO_COUNT][MAX_TRIALS];
  d.opts = opts;
  if (!driver_paths(&d, argv0)) return 1;
  /* Workers of a killed agent (started by hand) come here, to be reaped by pid. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  bool ran[SCENARIO_COUNT];
  scenarios_available(&d, ran);
  trials_run(&d, ran, trials);
  if (d.etcd_running) bench_etcd_stop(&d.etcd);
  summary summaries[SCENARIO_COUNT];
  int failed = 0;
  for (int i = 0; i < SCENARIO_COUNT; i++) {
    if (!ran[i]) continue;
    summarize(trials[i], (int)trials_of(opts, i), &summaries[i]);
    failed += summaries[i].failed;
  }
  results_print(opts, ran, summaries);
  /* Files of failed trials stay for a look; the directory goes only if empty. */
  if (rmdir(d.directory) != 0 && (failed > 0 || opts->keep))
    fprintf(stderr, "nodes: events and logs are in %s\n", d.directory);
  return failed == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  return driver_main(&opts, argv[0]);
}
