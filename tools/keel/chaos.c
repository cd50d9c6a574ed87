/* `keel chaos`: runs a job under `keel run` while failures drawn from a seed are injected
 * into it through `keel inject` (and by signal to the launcher), then checks from outside
 * the job -- its events file, /proc, /dev/shm, its job file -- that it survived them: the
 * same final state as a run without failures, no death that was not injected, nothing left
 * behind, nothing growing with the number of recoveries. docs/CHAOS.md says what it checks. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chaos.h"
#include "etcd_cluster.h"
#include "keel/core.h"
#include "keel/ec.h"
#include "launcher.h"
#include "netns.h"
#include "tool.h"

#define MS_NS INT64_C(1000000)
#define SECOND_NS INT64_C(1000000000)
#define DEFAULT_FAILURES 20
#define MAX_FAILURES 100000
#define INJECT_DEADLINE_NS (10 * SECOND_NS)
/* A rank between holders (its process dead, the spare not yet admitted) cannot be hit:
 * the failure is tried again this much later, at most this often. */
#define RETRY_NS (100 * MS_NS)
#define MAX_ATTEMPTS 50
#define TICK_NS (5 * MS_NS)
/* The most a call to the job's store may take: the launcher may be stopped. */
#define CENSUS_TIMEOUT_NS SECOND_NS
/* Without the job's own --timeout, the most one run may take. */
#define DEFAULT_RUN_DEADLINE_NS (60 * 60 * SECOND_NS)
#define LAUNCHER_STOP_MIN_NS (200 * MS_NS)
#define LAUNCHER_STOP_MAX_NS (2 * SECOND_NS)
/* A partition shorter than the heartbeat's time to live heals unseen; a longer one fences
 * the node: both happen at the default 2 s heartbeat. */
#define PARTITION_MIN_NS (500 * MS_NS)
#define PARTITION_MAX_NS (4 * SECOND_NS)
/* After a partition heals, its node may still fence within a heartbeat (a keepalive lost to
 * the cut is resent only after TCP's backoff, finding 28), and the recovery from that fence
 * takes a few seconds more: a victim's recovery after this long is not the partition's. */
#define PARTITION_AFTERMATH_NS (10 * SECOND_NS)
/* What each frame of a delayed node waits: slow, never past a step's deadline. */
#define DELAY_MIN_NS (2 * MS_NS)
/* etcd-kill: the member starts again 0.5-4 s later; etcd-stop: it resumes 0.2-2 s later,
 * and before half the heartbeat (the workers' lease time to live): etcd 3.4 revokes on
 * resuming, as its leader, the leases it did not see renewed while stopped (etcd #15247),
 * a store's fault that no client survives. */
#define ETCD_KILL_MIN_NS (500 * MS_NS)
#define ETCD_KILL_MAX_NS (4 * SECOND_NS)
#define ETCD_STOP_MIN_NS (200 * MS_NS)
#define ETCD_STOP_MAX_NS (2 * SECOND_NS)
#define ETCD_MIN_MEMBERS 3
#define ETCD_AGENTS_HEARTBEAT_MIN_NS (4 * SECOND_NS)
#define ETCD_START_MS 30000
#define ETCD_RESTART_MS 20000
/* After an etcd failure is undone, the members agree on a leader (within this) before the
 * next failure may come (finding 56). */
#define ETCD_LEADER_MS 20000
#define DELAY_MAX_NS (20 * MS_NS)
/* server-kill: the job's standing of its servers (ec/lost/<i>) is read this often while a
 * killed one is not back, and its configuration (ec/config) waited for this long. */
#define SERVER_LOOK_NS (20 * MS_NS)
#define SERVER_CONFIG_WAIT_NS (2 * SECOND_NS)
#define SERVER_BACK_WAIT_NS (15 * SECOND_NS)
/* The most servers one server-kill hits at once (and at most the parity r). */
#define MAX_SERVERS_HIT 8

static const char *const kind_names[KEEL__CHAOS_KIND_COUNT] = {
    "kill",      "stop",  "launcher-stop", "hang",      "bitflip",   "kill-node",
    "partition", "delay", "server-kill",   "etcd-kill", "etcd-stop",
};

const char *keel__chaos_kind_name(keel__chaos_kind kind) { return kind_names[kind]; }

typedef struct chaos_options {
  int64_t failures;    /* --failures; 0 with --duration */
  int64_t etcd_members; /* --etcd: the job's store is a cluster chaos starts; 0: none */
  int64_t duration_ns; /* --duration; 0: by count */
  int64_t weights[KEEL__CHAOS_KIND_COUNT];
  int64_t every_min_ns, every_max_ns;
  uint64_t seed;
  const char *json_path;
  const char *reference_dir; /* --reference-dir: failure-free runs kept and reused there */
  bool keep, no_reference;
  char **run_argv; /* "run" then RUN-FLAGS -- PROGRAM ARGS */
  int run_argc;
  keel__run_options run;
} chaos_options;

static int chaos_usage(const char *message) {
  fprintf(stderr,
          "keel chaos: %s (usage: keel chaos [--failures N | --duration D] [--mix KIND=W,...]"
          " [--every MIN..MAX] [--seed S] [--etcd N] [--json FILE] [--keep] [--no-reference] "
          "[--reference-dir DIR]"
          " -- RUN-FLAGS -- PROGRAM ARGS)\n",
          message);
  return KEEL__EXIT_USAGE;
}

/* ---- flags */

static bool kind_parse(const char *text, size_t length, keel__chaos_kind *kind_p) {
  for (int kind = 0; kind < KEEL__CHAOS_KIND_COUNT; kind++) {
    if (strlen(kind_names[kind]) != length || strncmp(text, kind_names[kind], length) != 0)
      continue;
    *kind_p = (keel__chaos_kind)kind;
    return true;
  }
  return false;
}

/* "kill=4,stop=2": every kind named once at most, weights 0..1000. */
static bool mix_parse(const char *text, int64_t *weights) {
  memset(weights, 0, sizeof(int64_t) * KEEL__CHAOS_KIND_COUNT);
  bool named[KEEL__CHAOS_KIND_COUNT] = {0};
  while (*text != '\0') {
    size_t length = strcspn(text, ",");
    const char *equals = memchr(text, '=', length);
    keel__chaos_kind kind;
    if (equals == NULL || !kind_parse(text, (size_t)(equals - text), &kind) || named[kind])
      return false;
    char number[24];
    size_t digits = length - (size_t)(equals + 1 - text);
    if (digits == 0 || digits >= sizeof number) return false;
    memcpy(number, equals + 1, digits);
    number[digits] = '\0';
    if (keel_parse_int(number, 0, 1000, &weights[kind]) != KEEL_OK) return false;
    named[kind] = true;
    text += length + (text[length] == ',');
  }
  int64_t total = 0;
  for (int kind = 0; kind < KEEL__CHAOS_KIND_COUNT; kind++) total += weights[kind];
  return total > 0;
}

/* "1s..6s", or one duration for a fixed gap. */
static bool every_parse(const char *text, chaos_options *options) {
  const char *dots = strstr(text, "..");
  char first[32];
  size_t length = dots ? (size_t)(dots - text) : strlen(text);
  if (length == 0 || length >= sizeof first) return false;
  memcpy(first, text, length);
  first[length] = '\0';
  if (keel_parse_duration_ns(first, &options->every_min_ns) != KEEL_OK) return false;
  options->every_max_ns = options->every_min_ns;
  if (dots != NULL && keel_parse_duration_ns(dots + 2, &options->every_max_ns) != KEEL_OK)
    return false;
  return options->every_min_ns >= 10 * MS_NS && options->every_max_ns >= options->every_min_ns;
}

/* The value of flag at argv[*index] ("--flag V" or "--flag=V"), or NULL when arg is not
 * that flag; *missing_p when it is, without a value. */
static const char *flag_value(int argc, char **argv, int *index, const char *flag,
                              bool *missing_p) {
  const char *arg = argv[*index];
  size_t length = strlen(flag);
  if (strncmp(arg, flag, length) != 0) return NULL;
  if (arg[length] == '=') return arg + length + 1;
  if (arg[length] != '\0') return NULL;
  if (*index + 1 >= argc) {
    *missing_p = true;
    return NULL;
  }
  return argv[++*index];
}

typedef enum flag_result { FLAG_NOT_MINE, FLAG_TAKEN, FLAG_BAD } flag_result;

static flag_result value_flag_parse(int argc, char **argv, int *index, chaos_options *options,
                                    const char **bad_p) {
  bool missing = false;
  const char *value;
  *bad_p = argv[*index];
  if ((value = flag_value(argc, argv, index, "--failures", &missing)) != NULL)
    return keel_parse_int(value, 1, MAX_FAILURES, &options->failures) == KEEL_OK ? FLAG_TAKEN
                                                                                 : FLAG_BAD;
  if ((value = flag_value(argc, argv, index, "--duration", &missing)) != NULL) {
    options->failures = 0;
    return keel_parse_duration_ns(value, &options->duration_ns) == KEEL_OK &&
                   options->duration_ns > 0
               ? FLAG_TAKEN
               : FLAG_BAD;
  }
  if ((value = flag_value(argc, argv, index, "--mix", &missing)) != NULL)
    return mix_parse(value, options->weights) ? FLAG_TAKEN : FLAG_BAD;
  if ((value = flag_value(argc, argv, index, "--every", &missing)) != NULL)
    return every_parse(value, options) ? FLAG_TAKEN : FLAG_BAD;
  if ((value = flag_value(argc, argv, index, "--seed", &missing)) != NULL) {
    int64_t seed;
    if (keel_parse_int(value, 0, INT64_MAX, &seed) != KEEL_OK) return FLAG_BAD;
    options->seed = (uint64_t)seed;
    return FLAG_TAKEN;
  }
  if ((value = flag_value(argc, argv, index, "--etcd", &missing)) != NULL)
    return keel_parse_int(value, 1, KEEL__ETCD_MAX_MEMBERS, &options->etcd_members) == KEEL_OK
               ? FLAG_TAKEN
               : FLAG_BAD;
  if ((value = flag_value(argc, argv, index, "--json", &missing)) != NULL) {
    options->json_path = value;
    return FLAG_TAKEN;
  }
  if ((value = flag_value(argc, argv, index, "--reference-dir", &missing)) != NULL) {
    options->reference_dir = value;
    return FLAG_TAKEN;
  }
  return missing ? FLAG_BAD : FLAG_NOT_MINE;
}

static int options_parse(int argc, char **argv, chaos_options *options, bool *mix_given_p) {
  *options = (chaos_options){.failures = DEFAULT_FAILURES,
                             .every_min_ns = SECOND_NS,
                             .every_max_ns = 6 * SECOND_NS,
                             .seed = 1};
  *mix_given_p = false;
  int index = 1;
  for (; index < argc && strcmp(argv[index], "--") != 0; index++) {
    const char *arg = argv[index];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return -1;
    if (strcmp(arg, "--keep") == 0) {
      options->keep = true;
      continue;
    }
    if (strcmp(arg, "--no-reference") == 0) {
      options->no_reference = true;
      continue;
    }
    const char *bad = NULL;
    flag_result result = value_flag_parse(argc, argv, &index, options, &bad);
    if (result == FLAG_BAD) {
      char message[160];
      snprintf(message, sizeof message, "bad value for %s", bad);
      return chaos_usage(message);
    }
    if (result == FLAG_NOT_MINE) {
      char message[160];
      snprintf(message, sizeof message, "unknown flag '%s'", arg);
      return chaos_usage(message);
    }
    if (strncmp(bad, "--mix", 5) == 0) *mix_given_p = true;
  }
  if (index >= argc) return chaos_usage("no '-- RUN-FLAGS -- PROGRAM' given");
  /* keel run's parser sees its own argv: "run" in place of the "--". */
  options->run_argv = argv + index;
  options->run_argc = argc - index;
  return 0;
}

/* ---- which kinds the job can survive, and how many of them */

/* Kinds that cost the job a rank's process. */
static bool kind_takes_rank(keel__chaos_kind kind) {
  return kind == KEEL__CHAOS_KILL || kind == KEEL__CHAOS_STOP || kind == KEEL__CHAOS_HANG;
}

/* Kinds that may cost the job a node's ranks at once (a partition: when it outlasts the
 * heartbeat's time to live). */
static bool kind_takes_node(keel__chaos_kind kind) {
  return kind == KEEL__CHAOS_KILL_NODE || kind == KEEL__CHAOS_PARTITION;
}

/* Kinds aimed at a member of the job's etcd cluster (--etcd). */
static bool kind_hits_etcd(keel__chaos_kind kind) {
  return kind == KEEL__CHAOS_ETCD_KILL || kind == KEEL__CHAOS_ETCD_STOP;
}

/* Kinds aimed at a node rather than a rank. */
static bool kind_hits_node(keel__chaos_kind kind) {
  return kind_takes_node(kind) || kind == KEEL__CHAOS_DELAY;
}

/* A hang is caught by the collective deadline and then the agreement's: past this, each one
 * would cost the job minutes. */
#define HANG_DEADLINE_MAX_NS (10 * SECOND_NS)

static bool hangs_caught_soon(const keel__run_options *run) {
  return run->collective_timeout_auto || run->collective_timeout_ns <= HANG_DEADLINE_MAX_NS;
}

/* Why the job as its flags start it cannot take kind at all; NULL when it can. */
static const char *kind_refusal(const chaos_options *options, keel__chaos_kind kind) {
  const keel__run_options *run = &options->run;
  if (run->servers > 0 && kind != KEEL__CHAOS_SERVER_KILL && kind != KEEL__CHAOS_LAUNCHER_STOP)
    return "a job on parameter servers takes server-kill and launcher-stop only: its workers "
           "join no communicator, so keel recovers no worker of it";
  switch (kind) {
    case KEEL__CHAOS_KILL:
    case KEEL__CHAOS_STOP:
    case KEEL__CHAOS_LAUNCHER_STOP:
      return NULL;
    case KEEL__CHAOS_HANG:
      if (!hangs_caught_soon(run))
        return "hang needs --collective-timeout auto (or a deadline of at most 10s): only the "
               "deadline catches a hung training thread, and at the default 30s each hang would "
               "cost the job a minute";
      return NULL;
    case KEEL__CHAOS_BITFLIP:
      if (run->verify_every == 0)
        return "bitflip needs --verify-replicas every=N: nothing else sees silent corruption, "
               "and the replicas would end different";
      return NULL;
    case KEEL__CHAOS_KILL_NODE:
    case KEEL__CHAOS_DELAY:
      if (!run->agents || run->nnodes < 2)
        return "kill-node and delay need several nodes with their agents on this host "
               "(--agents or --netns, --nnodes 2 or more)";
      return NULL;
    case KEEL__CHAOS_PARTITION:
      if (!run->netns || run->nnodes < 2)
        return "partition needs nodes in network namespaces (--netns, --nnodes 2 or more)";
      return NULL;
    case KEEL__CHAOS_SERVER_KILL:
      if (run->servers == 0) return "server-kill needs parameter servers (--servers)";
      if (!run->replace_servers)
        return "server-kill needs replacement servers (--ec-sync, whose default is "
               "--on-server-failure replace): without them each kill leaves a server down, and "
               "r + 1 of them lose rows of the model";
      return NULL;
    case KEEL__CHAOS_ETCD_KILL:
    case KEEL__CHAOS_ETCD_STOP:
      if (run->rdzv_endpoint != NULL)
        return "etcd-kill and etcd-stop fail members of the etcd cluster that keel chaos starts "
               "itself (--etcd 3 in place of --rdzv-endpoint): it cannot start a member of "
               "yours again";
      if (options->etcd_members == 0)
        return "etcd-kill and etcd-stop need an etcd store (--etcd 3: keel chaos starts a "
               "cluster of three members for the job); this job runs on the embedded store";
      if (options->etcd_members < ETCD_MIN_MEMBERS)
        return "etcd-kill and etcd-stop need --etcd 3 or more: a smaller cluster loses its "
               "quorum with one member down";
      if (run->agents && run->heartbeat_ns < ETCD_AGENTS_HEARTBEAT_MIN_NS)
        return "etcd-kill and etcd-stop on nodes with agents need --heartbeat 4s or more: an "
               "agent fences its node once the store has not confirmed its lease for 5/8 of the "
               "heartbeat, and after etcd's leader is killed or stopped no member confirms one "
               "until another is elected (0.5-1 s here, more under load): at 2s every node "
               "fenced itself at once";
      return NULL;
    default:
      return "this kind is not supported by keel chaos yet";
  }
}

/* Why count failures of what ("ranks", "nodes"), which cost ranks_lost ranks in all, would
 * shrink the world below its floor (shrink) or outnumber the restarts (restart); NULL when
 * the job survives them. */
static const char *shrink_restart_refusal(const keel__run_options *run, const char *what,
                                          int64_t count, int64_t ranks_lost, char *why,
                                          size_t capacity) {
  int64_t floor = run->min_world > 1 ? run->min_world : 1;
  if (run->on_failure == KEEL__ON_FAILURE_SHRINK && ranks_lost > run->world - floor) {
    snprintf(why, capacity,
             "%" PRId64 " failures of %s would shrink a world of %" PRId64 " below %" PRId64, count,
             what, run->world, floor);
    return why;
  }
  if (run->on_failure == KEEL__ON_FAILURE_RESTART && count > run->max_restarts) {
    snprintf(why, capacity, "%" PRId64 " failures of %s need --max-restarts %" PRId64, count, what,
             count);
    return why;
  }
  return NULL;
}

/* Why node_count failures of nodes would end the job: each costs a node's ranks, which a
 * spare node takes over (replace) or the rest goes on without (shrink). A killed node comes
 * back as a spare node (keel run does that with --spare-nodes), so one spare node serves
 * any number of failures. NULL when the job survives them all. */
static const char *node_count_refusal(const keel__run_options *run, int64_t node_count, char *why,
                                      size_t capacity) {
  if (node_count == 0) return NULL;
  if (run->on_failure == KEEL__ON_FAILURE_REPLACE && run->spare_nodes == 0) {
    snprintf(why, capacity,
             "%" PRId64
             " failures of nodes (kill-node, partition) need a spare node to take "
             "their ranks (--spare-nodes 1 or more)",
             node_count);
    return why;
  }
  /* With the in-memory tier, killed nodes do not come back (docs/NODES.md). */
  if (run->on_failure == KEEL__ON_FAILURE_REPLACE && run->ckpt == KEEL__CKPT_MEM &&
      node_count > run->spare_nodes) {
    snprintf(why, capacity,
             "%" PRId64
             " failures of nodes need as many spare nodes under --ckpt mem, but "
             "--spare-nodes is %" PRId64,
             node_count, run->spare_nodes);
    return why;
  }
  return shrink_restart_refusal(run, "nodes", node_count, node_count * run->nproc_per_node, why,
                                capacity);
}

/* Why count failures that take a rank would end the job or change what it computes; NULL
 * when it survives them all. */
static const char *count_refusal(const keel__run_options *run, int64_t rank_count, char *why,
                                 size_t capacity) {
  if (run->on_failure == KEEL__ON_FAILURE_REPLACE && rank_count > run->spares + run->max_restarts) {
    snprintf(why, capacity,
             "%" PRId64 " failures of ranks need as many spares, but --spares %" PRId64
             " and --max-restarts %" PRId64 " give %" PRId64 " (raise --max-restarts)",
             rank_count, run->spares, run->max_restarts, run->spares + run->max_restarts);
    return why;
  }
  return shrink_restart_refusal(run, "ranks", rank_count, rank_count, why, capacity);
}

static void default_mix(const chaos_options *options, int64_t *weights) {
  memset(weights, 0, sizeof(int64_t) * KEEL__CHAOS_KIND_COUNT);
  weights[KEEL__CHAOS_KILL] = 4;
  weights[KEEL__CHAOS_STOP] = 2;
  weights[KEEL__CHAOS_LAUNCHER_STOP] = 1;
  if (hangs_caught_soon(&options->run)) weights[KEEL__CHAOS_HANG] = 1;
  if (options->run.verify_every > 0) weights[KEEL__CHAOS_BITFLIP] = 1;
  if (options->etcd_members >= ETCD_MIN_MEMBERS) {
    weights[KEEL__CHAOS_ETCD_KILL] = 1;
    weights[KEEL__CHAOS_ETCD_STOP] = 1;
  }
}

/* ---- the schedule: failure i is a function of (seed, i) alone */

static int64_t uniform_ns(keel_random *random, int64_t low, int64_t high) {
  return low + (int64_t)keel_random_below(random, (uint64_t)(high - low) + 1);
}

static void failure_draw(const chaos_options *options, uint64_t index,
                         keel__chaos_failure *failure) {
  keel_random random;
  keel_random_seed(&random, keel_random_seed_for(options->seed, index, 0));
  int64_t total = 0;
  for (int kind = 0; kind < KEEL__CHAOS_KIND_COUNT; kind++) total += options->weights[kind];
  int64_t pick = (int64_t)keel_random_below(&random, (uint64_t)total);
  int kind = 0;
  while (pick >= options->weights[kind]) pick -= options->weights[kind++];
  *failure = (keel__chaos_failure){
      .kind = (keel__chaos_kind)kind, .detect_ns = -1, .recover_ns = -1, .leader_ns = -1};
  failure->gap_ns = uniform_ns(&random, options->every_min_ns, options->every_max_ns);
  failure->target = (int64_t)keel_random_below(&random, (uint64_t)options->run.world);
  failure->hold_ns = uniform_ns(&random, LAUNCHER_STOP_MIN_NS, LAUNCHER_STOP_MAX_NS);
  /* Drawn after the rest, so that a seed's schedule of the older kinds stays as it was. */
  failure->delay_ns = uniform_ns(&random, DELAY_MIN_NS, DELAY_MAX_NS);
  if (failure->kind == KEEL__CHAOS_PARTITION)
    failure->hold_ns = uniform_ns(&random, PARTITION_MIN_NS, PARTITION_MAX_NS);
  if (failure->kind == KEEL__CHAOS_ETCD_KILL)
    failure->hold_ns = uniform_ns(&random, ETCD_KILL_MIN_NS, ETCD_KILL_MAX_NS);
  if (failure->kind == KEEL__CHAOS_ETCD_STOP) {
    failure->hold_ns = uniform_ns(&random, ETCD_STOP_MIN_NS, ETCD_STOP_MAX_NS);
    if (failure->hold_ns > options->run.heartbeat_ns / 2)
      failure->hold_ns = options->run.heartbeat_ns / 2;
  }
  if (failure->kind == KEEL__CHAOS_SERVER_KILL && options->run.servers > 0) {
    /* Over the servers, not the workers' world. */
    failure->target = (int64_t)keel_random_below(&random, (uint64_t)options->run.servers);
    failure->spread = (int64_t)keel_random_below(&random, 1u << 20);
  }
  failure->node = -1;
}

/* The most failures the run may inject: --failures, or what --duration holds at the
 * shortest gap. */
static int64_t failure_capacity(const chaos_options *options) {
  if (options->failures > 0) return options->failures;
  int64_t most = options->duration_ns / options->every_min_ns + 1;
  return most < MAX_FAILURES ? most : MAX_FAILURES;
}

static int schedule_check(const chaos_options *options, const keel__chaos_failure *failures,
                          int64_t count) {
  int64_t rank_count = 0, node_count = 0;
  for (int64_t i = 0; i < count; i++) {
    rank_count += kind_takes_rank(failures[i].kind);
    node_count += kind_takes_node(failures[i].kind);
  }
  char why[256];
  if (count_refusal(&options->run, rank_count, why, sizeof why) == NULL &&
      node_count_refusal(&options->run, node_count, why, sizeof why) == NULL)
    return 0;
  fprintf(stderr, "keel chaos: refused before starting anything: %s\n", why);
  return KEEL__EXIT_USAGE;
}

/* ---- processes: keel run itself, and keel inject */

static void self_path(char *path, size_t capacity) {
  ssize_t length = readlink("/proc/self/exe", path, capacity - 1);
  path[length > 0 ? length : 0] = '\0';
}

/* Starts argv (argv[0] a path) in its own process group, stdout and stderr to output_path
 * (NULL: a pipe whose read end is *pipe_p). */
static pid_t start(char **argv, const char *output_path, int *pipe_p) {
  int fds[2] = {-1, -1};
  int output = -1;
  if (output_path != NULL)
    output = open(output_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  else if (pipe2(fds, O_CLOEXEC) == 0)
    output = fds[1];
  if (output < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(output, STDOUT_FILENO);
    dup2(output, STDERR_FILENO);
    execv(argv[0], argv);
    _exit(KEEL__EXIT_NOT_FOUND);
  }
  close(output);
  if (pipe_p != NULL) *pipe_p = fds[0];
  if (pid < 0 && fds[0] >= 0) close(fds[0]);
  return pid;
}

/* Waits up to deadline for pid; its exit code, 128+signal, or -1 (killed at the deadline). */
static int wait_until(pid_t pid, int64_t deadline) {
  int status;
  for (;;) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return keel__wait_status_code(status);
    if (done < 0) return -1;
    if (keel_now_ns() >= deadline) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    struct timespec pause = {0, TICK_NS};
    nanosleep(&pause, NULL);
  }
}

/* Runs `keel inject ARGS --job ID`; its exit code and first output line. */
static int inject_run(const char *self, const char *const *args, uint64_t job_id, char *output,
                      size_t capacity) {
  char job[24];
  snprintf(job, sizeof job, "%" PRIu64, job_id);
  char *argv[10] = {(char *)self, "inject"};
  size_t used = 2;
  for (size_t i = 0; args[i] != NULL && used < 7; i++) argv[used++] = (char *)args[i];
  argv[used++] = "--job";
  argv[used++] = job;
  argv[used] = NULL;
  int read_end = -1;
  pid_t pid = start(argv, NULL, &read_end);
  if (pid < 0) return -1;
  ssize_t length = read(read_end, output, capacity - 1);
  output[length > 0 ? length : 0] = '\0';
  output[strcspn(output, "\n")] = '\0';
  close(read_end);
  return wait_until(pid, keel_now_ns() + INJECT_DEADLINE_NS);
}

/* ---- one run of the job */

typedef struct chaos_job {
  const chaos_options *options;
  char self[PATH_MAX];
  char directory[64]; /* the run's working folder */
  keel__chaos_run *run;
  pid_t launcher;
  uint64_t job_id;
  int exit_code; /* -1: killed at the deadline */
  int64_t deadline;
  /* injection */
  keel__chaos_failure *failures;
  int64_t capacity, next, injected;
  int64_t due_ns; /* when failures[next] is due; 0 until training began */
  /* A failure that lasts (launcher-stop, partition, delay) is undone at undo_ns; none
   * other comes meanwhile. */
  keel__chaos_failure *undo;
  int64_t undo_ns;
  int64_t started_ns;
  /* split brain: the job's proc/ keys listed now and then, each rank's live holders */
  keel_store *store;
  int64_t next_census_ns;
  size_t censuses;
  char two_holders[256]; /* the first time two live processes held one rank in one epoch */
  /* --etcd: the job's store, and what became of its members' failures; with --netns, the
   * network its members listen on */
  keel__etcd_cluster *etcd;
  keel__netns *etcd_network;
  int64_t etcd_undone, etcd_undo_failed;
  /* server-kill: the failure whose servers' replacements are not all back yet (NULL: none),
   * the servers it hit with the revision of each one's standing when it was killed, and when
   * their standing is read next */
  keel__chaos_failure *server_down;
  int servers_hit[MAX_SERVERS_HIT];
  uint64_t servers_hit_mark[MAX_SERVERS_HIT];
  bool servers_hit_back[MAX_SERVERS_HIT];
  int servers_hit_count;
  int64_t next_server_look_ns;
  bool stopping; /* keel chaos got SIGINT or SIGTERM */
} chaos_job;

static int64_t run_deadline_ns(const chaos_options *options) {
  if (options->run.timeout_ns > 0) return options->run.timeout_ns + 60 * SECOND_NS;
  return DEFAULT_RUN_DEADLINE_NS;
}

static bool job_start(chaos_job *job, const char *name) {
  char events[PATH_MAX], output[PATH_MAX];
  snprintf(events, sizeof events, "%s/%s-events.jsonl", job->directory, name);
  snprintf(output, sizeof output, "%s/%s-output.txt", job->directory, name);
  const chaos_options *options = job->options;
  char **argv = calloc((size_t)options->run_argc + 6, sizeof *argv);
  if (argv == NULL) return false;
  int used = 0;
  argv[used++] = job->self;
  argv[used++] = "run";
  argv[used++] = "--events";
  argv[used++] = events;
  if (job->etcd != NULL) {
    argv[used++] = "--rdzv-endpoint";
    argv[used++] = (char *)keel__etcd_cluster_endpoint(job->etcd);
  }
  for (int i = 1; i < options->run_argc; i++) argv[used++] = options->run_argv[i];
  job->launcher = start(argv, output, NULL);
  free(argv);
  if (job->launcher < 0) return false;
  job->started_ns = keel_now_ns();
  job->deadline = job->started_ns + run_deadline_ns(options);
  int64_t wait_until_ns = job->started_ns + 5 * SECOND_NS;
  while ((job->run->events = fopen(events, "r")) == NULL && keel_now_ns() < wait_until_ns) {
    struct timespec pause = {0, TICK_NS};
    nanosleep(&pause, NULL);
  }
  return true;
}

/* The job id, from the job file of the launcher (written once its store runs). */
static void job_id_learn(chaos_job *job) {
  keel__job_info info;
  if (job->job_id == 0 && keel__job_file_of_launcher(job->launcher, &info) == KEEL_OK)
    job->job_id = info.auth.job_id;
}

/* The job's store, connected on first use (once the job id is known); NULL meanwhile. */
static keel_store *job_store(chaos_job *job) {
  if (job->store != NULL || job->job_id == 0) return job->store;
  char id[24];
  keel__job_info info;
  snprintf(id, sizeof id, "%" PRIu64, job->job_id);
  if (keel__job_connect(id, &info, &job->store) != KEEL_OK) return NULL;
  keel_store_set_timeout(job->store, CENSUS_TIMEOUT_NS);
  return job->store;
}

/* A killed member started again (healthy within ETCD_RESTART_MS), a stopped one resumed.
 * One that fails leaves the cluster a member short: counted, and the etcd check fails. */
static void etcd_failure_undo(chaos_job *job, keel__chaos_failure *failure) {
  int member = (int)failure->node;
  bool undone = failure->kind == KEEL__CHAOS_ETCD_KILL
                    ? keel__etcd_cluster_restart(job->etcd, member, ETCD_RESTART_MS)
                    : keel__etcd_cluster_resume(job->etcd, member);
  job->etcd_undone += undone;
  job->etcd_undo_failed += !undone;
  if (!undone)
    fprintf(stderr, "keel chaos: etcd member %d could not be %s\n", member,
            failure->kind == KEEL__CHAOS_ETCD_KILL ? "started again" : "resumed");
  /* A cluster whose leader is stopped or killed again before it has elected the next one
   * serves no write until it has: stops of members 0, 2 and 1 each a second after the last
   * left it without a leader for 2.5 s, and every node's agent fenced (its lease unconfirmed
   * for 5/8 of a 4 s heartbeat), which keel promises for a store that long gone (finding
   * 56). One member down at a time is what the job must survive; so each failure waits for
   * the members to agree on a leader again, as a restarted member waits to be healthy. */
  if (!undone) return;
  int64_t asked_ns = keel_now_ns();
  if (keel__etcd_cluster_leader(job->etcd, ETCD_LEADER_MS) < 0) {
    job->etcd_undo_failed++;
    fprintf(stderr, "keel chaos: the etcd members agreed on no leader within %d ms\n",
            ETCD_LEADER_MS);
    return;
  }
  failure->leader_ns = keel_now_ns() - asked_ns;
}

static void node_victims_note(chaos_job *job, keel__chaos_failure *failure, int64_t born_since_ns);

/* Undoes the failure that lasts, if any: the launcher continued, the node's delay ended,
 * its link healed. An undo that fails (the job ended meanwhile) is no error of the job's. */
static void failure_undo(chaos_job *job) {
  keel__chaos_failure *failure = job->undo;
  if (failure == NULL) return;
  job->undo = NULL;
  job->undo_ns = 0;
  if (failure->kind == KEEL__CHAOS_LAUNCHER_STOP) {
    kill(job->launcher, SIGCONT);
    return;
  }
  if (kind_hits_etcd(failure->kind)) {
    etcd_failure_undo(job, failure);
    /* The next failure comes its gap after the cluster has a leader again, not at once
     * when it was due already: a leader stopped right after its election leaves the nodes
     * no moment to renew their leases in (finding 56). */
    if (job->next < job->capacity) {
      int64_t after_leader_ns = keel_now_ns() + job->failures[job->next].gap_ns;
      if (job->due_ns < after_leader_ns) job->due_ns = after_leader_ns;
    }
    return;
  }
  char node[24], output[256];
  snprintf(node, sizeof node, "%" PRId64, failure->node);
  const char *delay_args[] = {"delay", node, "0", NULL};
  const char *heal_args[] = {"heal", node, NULL};
  const char *const *args = failure->kind == KEEL__CHAOS_DELAY ? delay_args : heal_args;
  if (inject_run(job->self, args, job->job_id, output, sizeof output) != 0)
    fprintf(stderr, "keel chaos: could not undo %s of node %" PRId64 ": %s\n",
            kind_names[failure->kind], failure->node, output);
  if (failure->kind != KEEL__CHAOS_PARTITION) return;
  failure->healed_ns = keel_now_ns();
  failure->aftermath_end_ns =
      failure->healed_ns + job->options->run.heartbeat_ns + PARTITION_AFTERMATH_NS;
  node_victims_note(job, failure, failure->injected_ns);
}

/* "killed rank 1 (uid 5, pid 1234)": the victim's uid. */
static void victim_parse(const char *output, keel__chaos_failure *failure) {
  const char *open = strstr(output, "(uid ");
  unsigned uid;
  long pid;
  if (open != NULL && sscanf(open, "(uid %u, pid %ld)", &uid, &pid) == 2)
    keel__chaos_victim_add(failure, uid);
}

/* The processes of the node a kill-node or a partition hits, as the events say (read up to
 * now: a spare its agent started a moment ago counts). Just before the injection
 * (born_since_ns 0): those that live, by /proc, since the processes of a node killed before
 * never had an exit event. Just after it, and at a partition's heal: those born on the node
 * since, live or already fenced with it. */
static void node_victims_note(chaos_job *job, keel__chaos_failure *failure, int64_t born_since_ns) {
  keel__chaos_events_read(job->run, job->failures, (size_t)job->capacity);
  const keel__chaos_run *run = job->run;
  for (size_t i = 0; i < run->process_count; i++) {
    const keel__chaos_process *p = &run->processes[i];
    if (p->agent || p->node != failure->node) continue;
    bool hit = born_since_ns == 0 ? !p->exited && keel__chaos_process_alive(p)
                                  : p->spawn_ns >= born_since_ns;
    if (hit) keel__chaos_victim_add(failure, p->uid);
  }
}

static bool holds_rank(keel_store *store, const keel_store_entry *entry,
                       const keel__proc_value *value, void *context) {
  (void)store, (void)entry, (void)context;
  return value->rank >= 0;
}

/* The node a node kind hits: among the live nodes whose processes hold ranks, the
 * target-th (modulo their count), never the launcher's own (it holds the job's store: a
 * kill or partition of it is no failure the job is meant to survive). -1 when none. */
static int64_t node_pick(chaos_job *job, const keel__chaos_failure *failure) {
  keel_store *store = job_store(job);
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (store == NULL || keel_store_list(store, "node/", &entries, &count, NULL) != KEEL_OK)
    return -1;
  int64_t candidates[256];
  size_t found = 0;
  for (size_t i = 0; i < count && found < 256; i++) {
    uint32_t node;
    keel__node_value value;
    if (keel__uid_from_key(entries[i].key, "node/", &node) != KEEL_OK ||
        keel__node_value_parse((const char *)entries[i].value, &value) != KEEL_OK)
      continue;
    bool launchers = value.pid == job->launcher;
    if (launchers && failure->kind != KEEL__CHAOS_DELAY) continue;
    if (keel__node_processes_visit(store, node, holds_rank, NULL) > 0) candidates[found++] = node;
  }
  keel_store_entries_free(entries, count);
  return found == 0 ? -1 : candidates[failure->target % (int64_t)found];
}

/* kill-node, partition and delay through keel inject; the last two are undone later. */
static bool node_failure_try(chaos_job *job, keel__chaos_failure *failure) {
  failure->node = node_pick(job, failure);
  if (failure->node < 0) return false;
  char node[24], delay[32], output[256];
  snprintf(node, sizeof node, "%" PRId64, failure->node);
  snprintf(delay, sizeof delay, "%" PRId64 "us", failure->delay_ns / 1000);
  const char *args[5] = {kind_names[failure->kind], node, NULL};
  if (failure->kind == KEEL__CHAOS_DELAY) args[2] = delay;
  bool victims = failure->kind != KEEL__CHAOS_DELAY;
  int64_t before_ns = keel_now_ns();
  failure->victim_count = 0;
  if (victims) node_victims_note(job, failure, 0); /* a killed process is no longer alive after */
  if (inject_run(job->self, args, job->job_id, output, sizeof output) != 0) {
    failure->victim_count = 0;
    return false;
  }
  if (victims) node_victims_note(job, failure, before_ns);
  if (failure->kind != KEEL__CHAOS_KILL_NODE) {
    job->undo = failure;
    job->undo_ns = keel_now_ns() + failure->hold_ns;
  }
  return true;
}

/* kill, stop, hang and bitflip of a rank through keel inject. */
static bool rank_failure_try(chaos_job *job, keel__chaos_failure *failure) {
  char target[32], output[256];
  const char *args[4] = {kind_names[failure->kind], target, NULL};
  snprintf(target, sizeof target, "%" PRId64, failure->target);
  if (inject_run(job->self, args, job->job_id, output, sizeof output) != 0) return false;
  victim_parse(output, failure);
  return true;
}

/* etcd-kill and etcd-stop: the target-th member (modulo their count) killed or stopped, to
 * be started again or resumed later; one member at most is down at a time, since no other
 * failure comes before the undo. */
static bool etcd_failure_try(chaos_job *job, keel__chaos_failure *failure) {
  int member = (int)(failure->target % keel__etcd_cluster_members(job->etcd));
  bool done = failure->kind == KEEL__CHAOS_ETCD_KILL ? keel__etcd_cluster_kill(job->etcd, member)
                                                     : keel__etcd_cluster_stop(job->etcd, member);
  if (!done) return false;
  failure->node = member;
  job->undo = failure;
  job->undo_ns = keel_now_ns() + failure->hold_ns;
  return true;
}

/* While the launcher is stopped its store answers nothing: chaos does not ask it. */
static bool launcher_stopped(const chaos_job *job) {
  return job->undo != NULL && job->undo->kind == KEEL__CHAOS_LAUNCHER_STOP;
}

/* The standing of server index in the job's directory (ec/lost/<i>: "lost", "rebuilding",
 * "rebuilt", "back N"; absent while it serves), and that key's revision; false when the store
 * cannot be read. */
static bool server_standing(chaos_job *job, int64_t index, char *standing, size_t capacity,
                            uint64_t *revision_p) {
  keel_store *store = job_store(job);
  if (store == NULL) return false;
  char key[48];
  snprintf(key, sizeof key, "ec/lost/%" PRId64, index);
  keel_store_entry *entry = NULL;
  keel_status status = keel_store_get(store, key, &entry);
  if (status == KEEL_ENOTFOUND) {
    snprintf(standing, capacity, "serving");
    *revision_p = 0;
    return true;
  }
  if (status != KEEL_OK) return false;
  snprintf(standing, capacity, "%s", (const char *)entry->value);
  *revision_p = entry->revision;
  keel_store_entry_free(entry);
  return true;
}

/* After a server's replacement is back (no recovery event says so): the survivors' fds,
 * threads and memory, and the store's keys, which the launcher counts only at recoveries of
 * ranks. A job on servers keeps a bounded set of keys (a standing and an address per
 * server, the job's own): all are counted. */
static void recovery_sample(chaos_job *job) {
  keel__chaos_events_read(job->run, job->failures, (size_t)job->capacity);
  keel__chaos_survivors_sample(job->run);
  keel_store *store = job_store(job);
  keel_store_entry *entries = NULL;
  size_t count = 0;
  keel__chaos_run *run = job->run;
  if (store == NULL || keel_store_list(store, "", &entries, &count, NULL) != KEEL_OK) return;
  keel_store_entries_free(entries, count);
  if (run->store_key_count < KEEL__CHAOS_MAX_SAMPLES)
    run->store_keys[run->store_key_count++] = (long)count;
}

/* Whether every server serves its rows, as the directory says (keel_ec_servers_down: none
 * lost, rebuilding, rebuilt or back so recently that its mark is still there). */
static bool servers_all_serving(chaos_job *job) {
  keel_store *store = job_store(job);
  int servers = (int)job->options->run.servers;
  bool *down = calloc((size_t)servers, sizeof *down);
  bool serving =
      store != NULL && down != NULL && keel_ec_servers_down(store, servers, down) == KEEL_OK;
  for (int i = 0; serving && i < servers; i++) serving = !down[i];
  free(down);
  return serving;
}

/* What a server-kill may hit, from the job's ec/config (false while it has published none):
 * r servers at once at most (the parity), never server 0 when it holds the only copy of the
 * dense block (the program did not replicate it), and never both holders of a replicated one
 * at once: no replacement could rebuild those. */
typedef struct server_kill_bounds {
  int servers, parity;
  bool spare_server_0, dense_pair; /* dense_pair: servers 0 and 1 hold the block */
} server_kill_bounds;

static bool server_kill_bounds_read(chaos_job *job, server_kill_bounds *bounds) {
  keel_store *store = job_store(job);
  keel_ec_config config;
  if (store == NULL ||
      keel_ec_config_wait(store, keel_deadline_after_ns(SERVER_CONFIG_WAIT_NS), &config) != KEEL_OK)
    return false;
  *bounds =
      (server_kill_bounds){.servers = config.servers,
                           .parity = config.without_parity ? 0 : config.parity_blocks,
                           .spare_server_0 = config.dense_count > 0 && !config.replicate_dense,
                           .dense_pair = config.dense_count > 0 && config.replicate_dense};
  if (bounds->parity > MAX_SERVERS_HIT) bounds->parity = MAX_SERVERS_HIT;
  return bounds->parity > 0;
}

static bool server_may_join(const chaos_job *job, const server_kill_bounds *bounds, int server) {
  if (server == 0 && bounds->spare_server_0) return false;
  for (int i = 0; i < job->servers_hit_count; i++) {
    if (job->servers_hit[i] == server) return false;
    if (bounds->dense_pair && server + job->servers_hit[i] == 1) return false; /* 0 and 1 */
  }
  return true;
}

/* The servers one kill hits: 1 + spread % r of them, from the drawn target on. */
static void servers_pick(chaos_job *job, const keel__chaos_failure *failure,
                         const server_kill_bounds *bounds) {
  int wanted = 1 + (int)(failure->spread % bounds->parity);
  job->servers_hit_count = 0;
  for (int step = 0; step < bounds->servers && job->servers_hit_count < wanted; step++) {
    int server = (int)((failure->target + step) % bounds->servers);
    if (server_may_join(job, bounds, server)) job->servers_hit[job->servers_hit_count++] = server;
  }
}

/* server-kill: SIGKILL to 1 to r servers (one `keel inject kill` each, one right after the
 * other), once every server serves again: more lost while others are rebuilt could be more
 * than the parity covers, which no job survives. The kill's detection and recovery are read
 * from the directory (servers_tick). */
static bool server_failure_try(chaos_job *job, keel__chaos_failure *failure) {
  server_kill_bounds bounds;
  if (job->server_down != NULL || !servers_all_serving(job) ||
      !server_kill_bounds_read(job, &bounds))
    return false;
  servers_pick(job, failure, &bounds);
  if (job->servers_hit_count == 0) return false;
  char standing[32];
  for (int i = 0; i < job->servers_hit_count; i++) {
    job->servers_hit_back[i] = false;
    if (!server_standing(job, job->servers_hit[i], standing, sizeof standing,
                         &job->servers_hit_mark[i]))
      return false;
  }
  failure->node = job->servers_hit[0];
  int killed = 0;
  for (int i = 0; i < job->servers_hit_count; i++) {
    char target[32], output[256];
    snprintf(target, sizeof target, "server:%d", job->servers_hit[i]);
    const char *args[3] = {"kill", target, NULL};
    if (inject_run(job->self, args, job->job_id, output, sizeof output) != 0) break;
    victim_parse(output, failure);
    killed++;
  }
  /* Those not killed (the inject failed) are not waited for. */
  job->servers_hit_count = killed;
  if (killed == 0) return false;
  job->server_down = failure;
  return true;
}

/* While a killed server's replacement is not back: detected once the job marked one of the
 * servers hit lost (or a replacement marked itself rebuilding), recovered once every
 * replacement is back ("back N", a change after the kill). Replacements not all back within
 * SERVER_BACK_WAIT_NS are left unrecovered, and the next server-kill may come. */
static void servers_tick(chaos_job *job, int64_t now) {
  keel__chaos_failure *failure = job->server_down;
  if (failure == NULL || launcher_stopped(job) || now < job->next_server_look_ns) return;
  job->next_server_look_ns = now + SERVER_LOOK_NS;
  bool all_back = true;
  for (int i = 0; i < job->servers_hit_count; i++) {
    if (job->servers_hit_back[i]) continue;
    char standing[32];
    uint64_t revision = 0;
    if (!server_standing(job, job->servers_hit[i], standing, sizeof standing, &revision)) {
      all_back = false;
      continue;
    }
    bool changed = revision > job->servers_hit_mark[i];
    if (changed && failure->detect_ns < 0) failure->detect_ns = now - failure->injected_ns;
    job->servers_hit_back[i] = changed && strncmp(standing, "back", 4) == 0;
    all_back = all_back && job->servers_hit_back[i];
  }
  if (all_back) {
    failure->recover_ns = now - failure->injected_ns;
    recovery_sample(job);
  }
  if (all_back || now - failure->injected_ns > SERVER_BACK_WAIT_NS) job->server_down = NULL;
}

/* One try at the failure; true once it is done (injected, or given up). */
static bool failure_try(chaos_job *job, keel__chaos_failure *failure) {
  failure->attempts++;
  bool done;
  if (failure->kind == KEEL__CHAOS_LAUNCHER_STOP) {
    done = kill(job->launcher, SIGSTOP) == 0;
    if (done) {
      job->undo = failure;
      job->undo_ns = keel_now_ns() + failure->hold_ns;
    }
  } else if (kind_hits_etcd(failure->kind)) {
    done = etcd_failure_try(job, failure);
  } else if (failure->kind == KEEL__CHAOS_SERVER_KILL) {
    done = job->job_id != 0 && server_failure_try(job, failure);
  } else {
    done = job->job_id != 0 && (kind_hits_node(failure->kind) ? node_failure_try(job, failure)
                                                              : rank_failure_try(job, failure));
  }
  if (!done) return failure->attempts >= MAX_ATTEMPTS;
  failure->injected = true;
  /* keel inject acts just before it prints and exits; its start (store connection and
   * lookup, tens of ms) would count as detection. */
  failure->injected_ns = keel_now_ns();
  return true;
}

/* ---- split brain, checked: two live processes must never hold one rank in one epoch */

#define CENSUS_INTERVAL_NS (250 * MS_NS)
#define MAX_HOLDERS 1024

typedef struct rank_holder {
  int64_t rank, epoch;
  pid_t pid;
} rank_holder;

/* A process that holds what its proc/ value says only while it lives: a dead one's key
 * lingers until its lease ends. */
static bool pid_lives(pid_t pid) {
  char state = 0;
  int parent = 0;
  return keel_process_stat(pid, &state, &parent) == KEEL_OK && state != 'Z' && state != 'X';
}

static void holders_check(chaos_job *job, const keel_store_entry *entries, size_t count) {
  static rank_holder holders[MAX_HOLDERS];
  size_t held = 0;
  for (size_t i = 0; i < count && held < MAX_HOLDERS; i++) {
    keel__proc_value value;
    if (keel__proc_value_parse((const char *)entries[i].value, &value) != KEEL_OK) continue;
    if (value.rank < 0 || !pid_lives(value.pid)) continue;
    for (size_t j = 0; j < held && job->two_holders[0] == '\0'; j++) {
      if (holders[j].rank != value.rank || holders[j].epoch != value.epoch) continue;
      snprintf(job->two_holders, sizeof job->two_holders,
               "pids %ld and %ld both held rank %" PRId64 " in epoch %" PRId64,
               (long)holders[j].pid, (long)value.pid, value.rank, value.epoch);
    }
    holders[held++] = (rank_holder){value.rank, value.epoch, value.pid};
  }
}

/* Lists proc/ every CENSUS_INTERVAL_NS while the launcher (and its store) runs. */
static void census_tick(chaos_job *job, int64_t now) {
  if (job->job_id == 0 || launcher_stopped(job) || now < job->next_census_ns) return;
  job->next_census_ns = now + CENSUS_INTERVAL_NS;
  keel_store *store = job_store(job);
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (store == NULL || keel_store_list(store, "proc/", &entries, &count, NULL) != KEEL_OK) return;
  holders_check(job, entries, count);
  keel_store_entries_free(entries, count);
  job->censuses++;
}

/* How many earlier failures that cost ranks may still be recovered from: injected less
 * than RECOVERY_WAIT_NS ago (a partition healed in time is never recovered from), and no
 * recovery seen for them yet. */
#define RECOVERY_WAIT_NS (15 * SECOND_NS)
static int64_t recoveries_pending(const chaos_job *job, int64_t now) {
  int64_t pending = 0;
  for (int64_t i = 0; i < job->next; i++) {
    const keel__chaos_failure *f = &job->failures[i];
    bool costly = kind_takes_rank(f->kind) || kind_takes_node(f->kind);
    pending +=
        f->injected && costly && f->recover_ns < 0 && now - f->injected_ns < RECOVERY_WAIT_NS;
  }
  return pending;
}

/* Whether the failure must wait for earlier ones to be recovered from. A node's failure
 * during an earlier one's recovery may take every holder of the state at once (two nodes'
 * ranks, all replicas), which no in-memory recovery survives. A rank's may too, once
 * world - 1 failures are still being recovered from: a PyTorch job of three ranks had one
 * hung, one stopped and the third stopped within 4 s, and no holder of the state was left.
 * The world is the one the job has now: a replace that found no spare ready (spares that
 * were still starting on a loaded machine) shrank a PyTorch job of three to one rank, and
 * the next stop took that one (finding 42). Otherwise single ranks fail during recoveries. */
static bool failure_must_wait(const chaos_job *job, const keel__chaos_failure *failure,
                              int64_t now) {
  if (kind_takes_node(failure->kind)) return recoveries_pending(job, now) > 0;
  if (kind_takes_rank(failure->kind))
    return recoveries_pending(job, now) >=
           keel__chaos_world_now(job->run, job->options->run.world) - 1;
  return false;
}

/* Injects what is due; the next failure is due its gap after this one was done. */
static void failures_tick(chaos_job *job, int64_t now) {
  if (job->undo != NULL && now >= job->undo_ns) failure_undo(job);
  if (!job->run->training || job->undo != NULL || job->next >= job->capacity) return;
  const chaos_options *options = job->options;
  if (options->duration_ns > 0 && now - job->run->training_ns >= options->duration_ns) return;
  keel__chaos_failure *failure = &job->failures[job->next];
  if (job->due_ns == 0) job->due_ns = job->run->training_ns + failure->gap_ns;
  if (now < job->due_ns) return;
  if (failure_must_wait(job, failure, now)) return;
  if (!failure_try(job, failure)) {
    job->due_ns = now + RETRY_NS;
    return;
  }
  job->injected += failure->injected;
  job->next++;
  if (job->next < job->capacity) job->due_ns = keel_now_ns() + job->failures[job->next].gap_ns;
}

/* SIGINT or SIGTERM to keel chaos: the job is stopped in order (what lasts undone, then
 * SIGTERM to keel run, which stops every node), killed if it is not gone STOP_GRACE_NS
 * later, and no report is made. */
#define STOP_GRACE_NS (15 * SECOND_NS)
static volatile sig_atomic_t stop_signal;

static void stop_signal_note(int signal_number) { stop_signal = signal_number; }

static void stop_job_once(chaos_job *job, int64_t now) {
  if (stop_signal == 0 || job->stopping) return;
  job->stopping = true;
  fprintf(stderr, "keel chaos: %s: stopping the job\n", strsignal(stop_signal));
  failure_undo(job);
  kill(job->launcher, SIGTERM);
  if (job->deadline > now + STOP_GRACE_NS) job->deadline = now + STOP_GRACE_NS;
}

/* Runs the job to its end (or the deadline), injecting when failures is not NULL. */
static void job_run(chaos_job *job) {
  for (;;) {
    int64_t now = keel_now_ns();
    stop_job_once(job, now);
    job_id_learn(job);
    keel__chaos_events_read(job->run, job->failures, (size_t)job->capacity);
    if (job->failures != NULL && !job->stopping) failures_tick(job, now);
    if (job->failures != NULL) census_tick(job, now);
    if (job->failures != NULL) servers_tick(job, now);
    int status;
    pid_t done = waitpid(job->launcher, &status, WNOHANG);
    if (done == job->launcher) {
      job->exit_code = keel__wait_status_code(status);
      break;
    }
    if (now >= job->deadline) {
      failure_undo(job);
      kill(-job->launcher, SIGKILL);
      kill(job->launcher, SIGKILL);
      waitpid(job->launcher, &status, 0);
      job->exit_code = -1;
      break;
    }
    struct timespec pause = {0, TICK_NS};
    nanosleep(&pause, NULL);
  }
  keel__chaos_events_read(job->run, job->failures, (size_t)job->capacity);
  keel_store_close(job->store);
  job->store = NULL;
}

/* ---- checks and the report */

typedef struct chaos_verdict {
  int failed; /* invariants that did not hold */
  FILE *json;
  bool json_first;
} chaos_verdict;

/* One invariant: printed as a line, and into the JSON's "checks". */
static void check(chaos_verdict *verdict, bool held, const char *name, const char *format, ...)
    __attribute__((format(printf, 4, 5)));
static void check(chaos_verdict *verdict, bool held, const char *name, const char *format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof text, format, args);
  va_end(args);
  printf("  %-5s %-18s %s\n", held ? "ok" : "FAIL", name, text);
  verdict->failed += !held;
  if (verdict->json == NULL) return;
  char escaped[1024];
  keel__json_escape(text, escaped, sizeof escaped);
  fprintf(verdict->json, "%s{\"name\":\"%s\",\"held\":%s,\"detail\":\"%s\"}",
          verdict->json_first ? "" : ",", name, held ? "true" : "false", escaped);
  verdict->json_first = false;
}

static int compare_int64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* p50, p99 and max of values (sorted in place), in ms; false when there are none. */
static bool percentiles(int64_t *values, size_t count, double *out) {
  if (count == 0) return false;
  qsort(values, count, sizeof *values, compare_int64);
  out[0] = (double)values[(count - 1) / 2] / 1e6;
  out[1] = (double)values[(count * 99 + 99) / 100 - 1] / 1e6;
  out[2] = (double)values[count - 1] / 1e6;
  return true;
}

static void kind_row(const chaos_job *job, keel__chaos_kind kind, FILE *json, bool *first) {
  size_t drawn = 0, injected = 0, detected = 0, recovered = 0;
  int64_t *detect = calloc((size_t)job->capacity + 1, sizeof *detect);
  int64_t *recover = calloc((size_t)job->capacity + 1, sizeof *recover);
  for (int64_t i = 0; i < job->next && detect && recover; i++) {
    const keel__chaos_failure *f = &job->failures[i];
    if (f->kind != kind) continue;
    drawn++;
    injected += f->injected;
    if (f->detect_ns >= 0) detect[detected++] = f->detect_ns;
    if (f->recover_ns >= 0) recover[recovered++] = f->recover_ns;
  }
  if (drawn > 0) {
    double d[3] = {0}, r[3] = {0};
    bool have_d = percentiles(detect, detected, d), have_r = percentiles(recover, recovered, r);
    char detect_text[48] = "-", recover_text[48] = "-";
    if (have_d) snprintf(detect_text, sizeof detect_text, "%.0f/%.0f/%.0f", d[0], d[1], d[2]);
    if (have_r) snprintf(recover_text, sizeof recover_text, "%.0f/%.0f/%.0f", r[0], r[1], r[2]);
    printf("  %-14s %8zu %8zu %9zu  %-22s %s\n", kind_names[kind], injected, drawn - injected,
           recovered, detect_text, recover_text);
    if (json != NULL) {
      fprintf(json,
              "%s\"%s\":{\"injected\":%zu,\"missed\":%zu,\"recovered\":%zu,"
              "\"detect_ms\":[%.3f,%.3f,%.3f],\"recover_ms\":[%.3f,%.3f,%.3f]}",
              *first ? "" : ",", kind_names[kind], injected, drawn - injected, recovered, d[0],
              d[1], d[2], r[0], r[1], r[2]);
      *first = false;
    }
  }
  free(detect);
  free(recover);
}

/* Whether uid was hit by an injected failure (its death explained). */
static bool uid_was_hit(const chaos_job *job, uint32_t uid) {
  for (int64_t i = 0; i < job->next; i++)
    if (job->failures[i].injected && keel__chaos_failure_hit(&job->failures[i], uid)) return true;
  return false;
}

/* A death no failure explains: a process ended by a signal or a failing code, or fenced,
 * while the job ran, that no injection hit. 75-77 are the launcher's orderly codes. */
static const keel__chaos_process *false_death(const chaos_job *job) {
  const keel__chaos_run *run = job->run;
  for (size_t i = 0; i < run->process_count; i++) {
    const keel__chaos_process *p = &run->processes[i];
    if (!p->exited || p->agent || p->killed_at_end || uid_was_hit(job, p->uid)) continue;
    bool orderly = strcmp(p->ended, "code 0") == 0 || strcmp(p->ended, "code 75") == 0 ||
                   strcmp(p->ended, "code 76") == 0 || strcmp(p->ended, "code 77") == 0;
    if (!orderly || p->fenced) return p;
  }
  return NULL;
}

/* Where the failure-free run of this job is kept under --reference-dir (its finish lines in
 * .jsonl, its trace lines in .trace: suffix); false without it. */
static bool reference_kept_path(const chaos_job *job, const char *suffix, char *path,
                                size_t capacity) {
  const chaos_options *options = job->options;
  if (options->reference_dir == NULL) return false;
  char key[32];
  keel__chaos_reference_key(options->run_argv, options->run_argc, job->self, options->etcd_members,
                            key, sizeof key);
  snprintf(path, capacity, "%s/reference-%s%s", options->reference_dir, key, suffix);
  return true;
}

/* Appends to message where the traces of the two runs part, when the program printed some
 * (chaos_trace.c): the failure-free run's output in this run's folder, or its trace lines
 * kept under --reference-dir. */
static void trace_parting_add(const chaos_job *job, char *message, size_t capacity) {
  char reference[PATH_MAX], run[PATH_MAX], where[256];
  snprintf(reference, sizeof reference, "%s/reference-output.txt", job->directory);
  snprintf(run, sizeof run, "%s/chaos-output.txt", job->directory);
  if (access(reference, R_OK) != 0 &&
      !reference_kept_path(job, ".trace", reference, sizeof reference))
    return;
  if (!keel__chaos_trace_parting(reference, run, where, sizeof where)) return;
  size_t length = strlen(message);
  snprintf(message + length, capacity - length, "; %s", where);
}

/* The finish of rank in run, or NULL. */
static const keel__chaos_finish *finish_of_rank(const keel__chaos_run *run, int64_t rank) {
  for (size_t i = 0; i < run->finish_count; i++)
    if (run->finishes[i].rank == rank) return &run->finishes[i];
  return NULL;
}

static void final_state_check(const chaos_job *job, const keel__chaos_run *reference,
                              chaos_verdict *verdict) {
  const keel__chaos_run *run = job->run;
  if (run->finish_count == 0) {
    check(verdict, false, "final-state", "no rank finished");
    return;
  }
  /* A job on parameter servers has no world to shrink: its model is the servers'. */
  bool shrinks =
      job->options->run.on_failure == KEEL__ON_FAILURE_SHRINK && job->options->run.servers == 0;
  if (shrinks || reference == NULL) {
    /* Shrink changes the math: the survivors must still agree with each other. */
    const keel__chaos_finish *first = &run->finishes[0];
    for (size_t i = 1; i < run->finish_count; i++) {
      const keel__chaos_finish *f = &run->finishes[i];
      if (f->shard == first->shard && strcmp(f->crc, first->crc) != 0) {
        check(verdict, false, "final-state",
              "rank %" PRId64 " ends with %s, rank %" PRId64 " with %s", first->rank, first->crc,
              f->rank, f->crc);
        return;
      }
    }
    check(verdict, true, "final-state", "%zu survivors agree at step %" PRId64 " (crc32c %s)%s",
          run->finish_count, first->step, first->crc,
          reference == NULL ? "; no failure-free run to compare with" : "");
    return;
  }
  if (run->finish_count != reference->finish_count) {
    check(verdict, false, "final-state", "%zu ranks finished, %zu in the failure-free run",
          run->finish_count, reference->finish_count);
    return;
  }
  for (size_t i = 0; i < reference->finish_count; i++) {
    const keel__chaos_finish *want = &reference->finishes[i];
    const keel__chaos_finish *got = finish_of_rank(run, want->rank);
    if (got == NULL || got->step != want->step || strcmp(got->crc, want->crc) != 0) {
      char message[512];
      snprintf(message, sizeof message,
               "rank %" PRId64 " ends at step %" PRId64
               " with crc32c %s; failure-free: step %" PRId64 " with %s",
               want->rank, got ? got->step : -1, got ? got->crc : "none", want->step, want->crc);
      trace_parting_add(job, message, sizeof message);
      check(verdict, false, "final-state", "%s", message);
      return;
    }
  }
  check(verdict, true, "final-state",
        "%zu ranks at step %" PRId64 " bit-identical to the failure-free run (crc32c %s)",
        reference->finish_count, reference->finishes[0].step, reference->finishes[0].crc);
}

/* The median of length (at least 1) values, the lower one of an even count. */
static long window_median(const long *values, size_t length) {
  long sorted[64];
  /* A longer window is sampled evenly: a floor needs no more. */
  size_t taken = length < 64 ? length : 64;
  for (size_t i = 0; i < taken; i++) {
    long value = values[i * length / taken];
    size_t at = i;
    for (; at > 0 && sorted[at - 1] > value; at--) sorted[at] = sorted[at - 1];
    sorted[at] = value;
  }
  return sorted[(taken - 1) / 2];
}

long keel__chaos_floor_rise(const long *values, size_t count) {
  if (count == 0) return 0;
  size_t quarter = count / 4 ? count / 4 : 1;
  size_t early_start = count >= 4 ? quarter : 0;
  return window_median(values + count - quarter, quarter) -
         window_median(values + early_start, quarter);
}

/* A series of count samples leaks when its floor rose by more than one per 8 samples;
 * a shorter one than minimum is not judged. A survivor is sampled from when it holds a rank,
 * with its links made; the store's count needs its warm-up quarter to be past the plateau. */
#define MIN_PROCESS_SERIES 8
#define MIN_STORE_SERIES 16
/* The store's count is taken as a recovery ends, racing the clean-up of that recovery's own
 * keys (dead/, the older agreement), so a single sample sits a few keys off the floor either
 * way (a netns run of 16 recoveries: 2, 9, 12, 18, 11, 3, 0, 7, 2, 3, 3, 7, 5, 3, 7, 5).
 * A leak of a key every recovery or two still rises past this within 16 samples. */
#define STORE_SLACK_KEYS 4
static bool series_flat(long rise, size_t count, size_t minimum, long slack) {
  long allowed = (long)(count / 8) > slack ? (long)(count / 8) : slack;
  return count < minimum || rise <= allowed;
}

/* A survivor's links to the job's live processes are not counted (chaos_observe.c), but its
 * links to a dead node's processes close a moment after /proc counts them gone: a sample taken
 * meanwhile reads up to a node's worth (its workers and spares) more, or one on one host, where
 * spares come one at a time. A high sample late in a short series reads as a rise of the
 * floor. (Until finding 45 the links were counted against one per live process, and the
 * links to a node coming back, made a moment after it, read low too: 4, then 8, 5, 6, 5, 5
 * after kills of nodes in a netns job with nodes of 3 processes.) On etcd, a process's
 * connections to the members also move with each fail-over (each of its store clients keeps
 * one per connection cache, and one more while a request is in flight): sampled every 1.5 s
 * through a run of etcd kills and stops, a worker held 1 to 3 (up to 8 before the caches were
 * held to one connection), so one more per member may come and go. */
static long fds_slack(const chaos_job *job) {
  const keel__run_options *run = &job->options->run;
  bool nodes = run->agents || run->netns;
  long slack = nodes ? (long)(run->nproc_per_node + run->spares) : 1;
  return job->etcd != NULL ? slack + keel__etcd_cluster_members(job->etcd) : slack;
}

/* values as "13 12 8 ...", the first ones that fit, then how many more. */
static void series_format(const long *values, size_t count, char *text, size_t capacity) {
  size_t at = 0;
  text[0] = '\0';
  for (size_t i = 0; i < count; i++) {
    int wrote = snprintf(text + at, capacity - at, "%s%ld", i ? " " : "", values[i]);
    if (wrote < 0 || (size_t)wrote >= capacity - at - 16) {
      snprintf(text + at, capacity - at, " and %zu more", count - i);
      return;
    }
    at += (size_t)wrote;
  }
}

/* The survivors' fds, threads and memory, and the store's keys, after each recovery: what
 * grows with the number of recoveries is a leak. Memory is reported, not judged: the
 * allocator keeps what it was given. */
static void flat_check(const chaos_job *job, chaos_verdict *verdict) {
  const keel__chaos_run *run = job->run;
  const keel__chaos_process *longest = NULL, *rising = NULL;
  for (size_t i = 0; i < run->process_count; i++) {
    const keel__chaos_process *p = &run->processes[i];
    if (p->samples == 0) continue;
    if (longest == NULL || p->samples > longest->samples) longest = p;
    bool flat = series_flat(keel__chaos_floor_rise(p->fds, p->samples), p->samples,
                            MIN_PROCESS_SERIES, fds_slack(job)) &&
                series_flat(keel__chaos_floor_rise(p->threads, p->samples), p->samples,
                            MIN_PROCESS_SERIES, 0);
    if (!flat && rising == NULL) rising = p;
  }
  /* The one that rose is shown, else the one sampled longest. */
  bool flat = rising == NULL;
  if (rising != NULL) longest = rising;
  if (longest == NULL) {
    check(verdict, true, "survivors-flat", "no survivor was sampled (no recovery)");
  } else {
    size_t n = longest->samples;
    check(verdict, flat, "survivors-flat",
          "uid %u, sampled after %zu recoveries: fds beyond links to live processes %ld -> %ld, "
          "threads %ld -> %ld, rss %.1f ->"
          " %.1f MiB (floors: fds %+ld, threads %+ld)%s",
          (unsigned)longest->uid, n, longest->fds[0], longest->fds[n - 1], longest->threads[0],
          longest->threads[n - 1], (double)longest->rss_kib[0] / 1024,
          (double)longest->rss_kib[n - 1] / 1024, keel__chaos_floor_rise(longest->fds, n),
          keel__chaos_floor_rise(longest->threads, n),
          n < MIN_PROCESS_SERIES ? " (too few to judge)" : "");
    /* What the rise is made of: the series, and which peers its links lead to, first and
     * last. */
    if (!flat) {
      char series[512];
      series_format(longest->fds, n, series, sizeof series);
      printf(
          "        uid %u's fds beyond links to live processes, sample by sample: %s\n"
          "        its fds by kind at its first sample: %s\n"
          "        and at its last: %s\n",
          (unsigned)longest->uid, series, longest->fds_first, longest->fds_last);
    }
  }
  size_t n = run->store_key_count;
  long rise = keel__chaos_floor_rise(run->store_keys, n);
  bool on_servers = job->options->run.servers > 0;
  check(
      verdict, series_flat(rise, n, MIN_STORE_SERIES, STORE_SLACK_KEYS), "store-flat",
      "keys (%s) after %zu recoveries: %ld first, %ld last, floor %+ld%s",
      on_servers ? "all of them" : "less those of live processes, nodes and the newest agreements",
      n, n ? run->store_keys[0] : 0, n ? run->store_keys[n - 1] : 0, rise,
      n < MIN_STORE_SERIES ? " (too few recoveries to judge)" : "");
}

/* Every etcd member failed was started again or resumed: the job ran on a whole cluster
 * between its store's failures. */
static void etcd_check(const chaos_job *job, chaos_verdict *verdict) {
  int64_t killed = 0, stopped = 0;
  for (int64_t i = 0; i < job->next; i++) {
    killed += job->failures[i].injected && job->failures[i].kind == KEEL__CHAOS_ETCD_KILL;
    stopped += job->failures[i].injected && job->failures[i].kind == KEEL__CHAOS_ETCD_STOP;
  }
  check(verdict, job->etcd_undo_failed == 0, "etcd-members",
        "%d members: %" PRId64 " killed and %" PRId64 " stopped; %" PRId64
        " started again or resumed, %" PRId64 " not",
        keel__etcd_cluster_members(job->etcd), killed, stopped, job->etcd_undone,
        job->etcd_undo_failed);
}

/* What a recovery may add, after a failure's detection, before the job moves again: the
 * agreement's rounds, a spare's admission and the state it receives, a new spare process
 * started when the pool ran dry (a Python one imports torch for seconds on 2 busy cores). */
#define RECOVERY_SLACK_NS (10 * SECOND_NS)

/* No wait past its deadline. Seen from outside: every wait that can stop a job has one (the
 * collective's, the lease's time to live), so the job never stands still for longer than the
 * longest of them and a recovery after the last failure or its undo; one that does has waited
 * past a deadline somewhere (or waited without one). And one process's late wait that the job
 * did not stand still for: each process counts its own waits that ended past their deadline
 * and says so in `wait_late` lines. */
static void deadline_check(const chaos_job *job, chaos_verdict *verdict) {
  const keel__chaos_run *run = job->run;
  const keel__run_options *options = &job->options->run;
  int64_t collective_ns = options->collective_timeout_ns;
  if (options->collective_timeout_auto && run->collective_deadline_ns > collective_ns)
    collective_ns = run->collective_deadline_ns;
  int64_t allowed_ns = collective_ns + options->heartbeat_ns + RECOVERY_SLACK_NS;
  bool within = run->still_longest_ns <= allowed_ns;
  int64_t late = 0;
  for (int kind = 0; kind < KEEL_WAIT_KIND_COUNT; kind++) late += run->waits_late[kind];
  char worst[96] = "";
  if (late > 0)
    snprintf(worst, sizeof worst, "; the worst, a %s wait, %.0f ms past", run->wait_late_worst_kind,
             (double)run->wait_late_worst_ns / 1e6);
  check(verdict, within && late == 0, "deadlines-kept",
        "the job stood still %.0f ms at most after its last failure (ending %.1f s into the "
        "run), %s %.0f ms: collective deadline %.0f ms + heartbeat %.0f ms + %.0f ms of "
        "recovery; %" PRId64
        " waits of its processes ended over %.0f ms past their deadline "
        "(collectives %" PRId64 ", agreements %" PRId64 ", store requests %" PRId64
        ", parameter-server calls %" PRId64 ")%s",
        (double)run->still_longest_ns / 1e6, (double)(run->still_end_ns - job->started_ns) / 1e9,
        within ? "within" : "past", (double)allowed_ns / 1e6, (double)collective_ns / 1e6,
        (double)options->heartbeat_ns / 1e6, (double)RECOVERY_SLACK_NS / 1e6, late,
        (double)KEEL_WAIT_LATE_NS / 1e6, run->waits_late[KEEL_WAIT_COLLECTIVE],
        run->waits_late[KEEL_WAIT_AGREEMENT], run->waits_late[KEEL_WAIT_STORE],
        run->waits_late[KEEL_WAIT_SERVER], worst);
}

/* Every step from the first to the last committed by the job, in the history its processes
 * reported (`commits` lines: the runs of steps each committed in each epoch), each once but
 * for a redo that a failure or a verification's roll-back explains. Seen from outside no
 * single process: a step counts as committed once per epoch whose ranks committed it. */
static bool steps_check(const chaos_job *job, chaos_verdict *verdict) {
  const keel__chaos_run *run = job->run;
  keel__chaos_steps steps;
  keel__chaos_steps_count(run, &steps);
  if (!steps.known) return false;
  int64_t allowed = job->injected + run->verified_redo_steps;
  char skipped[64] = "", redone[96] = "";
  if (steps.skipped > 0)
    snprintf(skipped, sizeof skipped, " (the first: %" PRId64 ")", steps.first_skipped);
  if (steps.redone > 0)
    snprintf(redone, sizeof redone, " (step %" PRId64 " %" PRId64 " times)", steps.most_redone,
             steps.most_redone_times);
  check(verdict, steps.skipped == 0 && steps.redone <= allowed, "steps-once",
        "steps %" PRId64 " to %" PRId64 ", %zu lines of commits: %" PRId64
        " committed by no process%s, %" PRId64
        " said only by a process that received their state; %" PRId64
        " commits redone%s, at most %" PRId64
        " (one per failure, and the steps a verification sent the job back)",
        steps.first, steps.last, run->commit_count, steps.skipped, skipped, steps.held_only,
        steps.redone, redone, allowed);
  return true;
}

static void checks_run(const chaos_job *job, const keel__chaos_run *reference, int reference_code,
                       chaos_verdict *verdict) {
  const chaos_options *options = job->options;
  const keel__chaos_run *run = job->run;
  check(verdict, job->exit_code == 0, "job-exit", "keel run exited %d%s", job->exit_code,
        job->exit_code == -1 ? " (killed at chaos's deadline)" : "");
  if (reference != NULL)
    check(verdict, reference_code == 0, "reference-exit", "the failure-free run exited %d",
          reference_code);
  bool all = options->failures == 0 || job->injected == options->failures;
  /* Every failure came due, some found no target (a rank with no live holder for 5 s), or
   * the job ended before the rest came due. */
  bool all_due = job->next >= job->capacity;
  check(verdict, all && job->injected > 0, "failures", "%" PRId64 " injected of %" PRId64 "%s",
        job->injected, options->failures > 0 ? options->failures : job->next,
        all       ? ""
        : all_due ? " (the rest found no target: no live holder of the rank within 5 s)"
                  : " (the job ended first: give it more steps)");
  final_state_check(job, reference, verdict);
  int64_t rank_failures = 0;
  for (int64_t i = 0; i < job->next; i++) {
    keel__chaos_kind kind = job->failures[i].kind;
    rank_failures += job->failures[i].injected && (kind_takes_rank(kind) || kind_takes_node(kind));
  }
  check(verdict, run->redone_minibatches <= rank_failures, "redo",
        "%" PRId64 " minibatches redone for %" PRId64
        " failures of ranks and nodes (at most one each)",
        run->redone_minibatches, rank_failures);
  int64_t bitflips = 0;
  for (int64_t i = 0; i < job->next; i++)
    bitflips += job->failures[i].injected && job->failures[i].kind == KEEL__CHAOS_BITFLIP;
  if (bitflips > 0 || run->mismatches > 0)
    check(verdict, run->verified_redo_steps <= bitflips * options->run.verify_every,
          "verified-redo",
          "%zu replica mismatches sent the job back %" PRId64 " steps for %" PRId64
          " bit flips (at most %" PRId64 " each)",
          run->mismatches, run->verified_redo_steps, bitflips, options->run.verify_every);
  const keel__chaos_process *dead = false_death(job);
  if (dead != NULL)
    check(verdict, false, "no-false-death", "uid %u (pid %ld) ended %s%s, and no failure hit it",
          (unsigned)dead->uid, (long)dead->pid, dead->ended, dead->fenced ? ", fenced" : "");
  else
    check(verdict, true, "no-false-death", "every process that died was hit by a failure");
  check(verdict, job->two_holders[0] == '\0' && job->censuses > 0, "one-holder",
        "%zu listings of proc/ (every %d ms): %s", job->censuses, (int)(CENSUS_INTERVAL_NS / MS_NS),
        job->two_holders[0] ? job->two_holders
                            : "never two live processes with one rank in one epoch");
  keel__chaos_leaks leaks;
  keel__chaos_leaks_count(run, job->job_id, job->launcher, &leaks);
  bool clean = leaks.processes + leaks.shm + leaks.job_files + leaks.networks == 0;
  check(verdict, clean, "nothing-left",
        "%zu processes, %zu shared-memory segments, %zu job files, %zu namespaces and links "
        "left%s%s",
        leaks.processes, leaks.shm, leaks.job_files, leaks.networks, clean ? "" : ": ",
        leaks.first);
  deadline_check(job, verdict);
  if (!steps_check(job, verdict))
    printf(
        "  not checked: each step committed once (no process committed a step: a job on\n"
        "    parameter servers, or one that did not train)\n");
  flat_check(job, verdict);
  if (job->etcd != NULL) etcd_check(job, verdict);
}

static void report_head(const chaos_job *job, FILE *json) {
  const keel__chaos_run *run = job->run;
  double seconds = (double)(keel_now_ns() - job->started_ns) / 1e9;
  printf("keel chaos: seed %" PRIu64 ", %" PRId64
         " failures injected in %.1f s; %zu recoveries"
         " (replace %zu, shrink %zu, grow %zu); %" PRId64 " collective deadlines hit\n",
         job->options->seed, job->injected, seconds, run->recovery_count,
         run->recoveries_by_policy[1], run->recoveries_by_policy[0], run->recoveries_by_policy[2],
         run->timeouts);
  printf("  %-14s %8s %8s %9s  %-22s %s\n", "kind", "injected", "missed", "recovered",
         "detect ms p50/p99/max", "recover ms p50/p99/max");
  if (json != NULL)
    fprintf(json,
            "{\"seed\":%" PRIu64 ",\"injected\":%" PRId64
            ",\"seconds\":%.3f,\"recoveries\":{"
            "\"replace\":%zu,\"shrink\":%zu,\"grow\":%zu},\"deadlines_hit\":%" PRId64
            ",\"kinds\":{",
            job->options->seed, job->injected, seconds, run->recoveries_by_policy[1],
            run->recoveries_by_policy[0], run->recoveries_by_policy[2], run->timeouts);
  bool first = true;
  for (int kind = 0; kind < KEEL__CHAOS_KIND_COUNT; kind++)
    kind_row(job, (keel__chaos_kind)kind, json, &first);
  if (json != NULL) fprintf(json, "},\"checks\":[");
}

/* Every failure of the schedule that came due, for a run's post-mortem: its kind, what it
 * aimed at, when it landed (the events file's clock) and whom it hit. */
static void failures_json(const chaos_job *job, FILE *json) {
  for (int64_t i = 0; i < job->next; i++) {
    const keel__chaos_failure *f = &job->failures[i];
    fprintf(json,
            "%s{\"kind\":\"%s\",\"target\":%" PRId64 ",\"node\":%" PRId64
            ",\"injected\":%s,\"t_ns\":%" PRId64
            ",\"hold_ms\":%.1f,\"detect_ms\":%.3f,"
            "\"recover_ms\":%.3f,\"leader_ms\":%.3f,\"victims\":[",
            i > 0 ? "," : "", kind_names[f->kind], f->target, f->node,
            f->injected ? "true" : "false", f->injected_ns, (double)f->hold_ns / 1e6,
            (double)f->detect_ns / 1e6, (double)f->recover_ns / 1e6,
            /* -1 as -1, not as -0.000: a script tells "not waited" by its sign */
            f->leader_ns < 0 ? -1.0 : (double)f->leader_ns / 1e6);
    for (size_t v = 0; v < f->victim_count; v++)
      fprintf(json, "%s%u", v > 0 ? "," : "", (unsigned)f->victims[v]);
    fprintf(json, "]}");
  }
}

static int report(const chaos_job *job, const keel__chaos_run *reference, int reference_code) {
  FILE *json = NULL;
  if (job->options->json_path != NULL && (json = fopen(job->options->json_path, "w")) == NULL)
    fprintf(stderr, "keel chaos: cannot write %s: %s\n", job->options->json_path, strerror(errno));
  report_head(job, json);
  chaos_verdict verdict = {.json = json, .json_first = true};
  checks_run(job, reference, reference_code, &verdict);
  printf("verdict: %s (%d of the invariants failed)\n", verdict.failed ? "FAIL" : "PASS",
         verdict.failed);
  if (json != NULL) {
    fprintf(json, "],\"failures\":[");
    failures_json(job, json);
    fprintf(json, "],\"verdict\":\"%s\"}\n", verdict.failed ? "fail" : "pass");
    fclose(json);
  }
  return verdict.failed ? KEEL__EXIT_FAILURE : 0;
}

/* ---- the command */

static int reference_started(chaos_job *job, keel__chaos_run *reference) {
  chaos_job plain = *job;
  plain.run = reference;
  plain.failures = NULL;
  plain.capacity = 0;
  if (!job_start(&plain, "reference")) return -1;
  fprintf(stderr, "keel chaos: the failure-free run (pid %ld)\n", (long)plain.launcher);
  job_run(&plain);
  if (reference->events != NULL) fclose(reference->events);
  reference->events = NULL;
  return plain.exit_code;
}

/* The failure-free run: one kept under --reference-dir for the same job when there is one
 * (then its exit code was 0), else run now (and kept when it exits 0). */
static int reference_run(chaos_job *job, keel__chaos_run *reference) {
  char kept[PATH_MAX], kept_trace[PATH_MAX];
  bool keeps = reference_kept_path(job, ".jsonl", kept, sizeof kept) &&
               reference_kept_path(job, ".trace", kept_trace, sizeof kept_trace);
  if (keeps && keel__chaos_reference_load(kept, reference)) {
    fprintf(stderr, "keel chaos: the failure-free run is the one kept in %s\n", kept);
    return 0;
  }
  keel__chaos_run_clear(reference); /* a kept file without a finish: run it anew */
  memset(reference, 0, sizeof *reference);
  int code = reference_started(job, reference);
  char events[PATH_MAX];
  snprintf(events, sizeof events, "%s/reference-events.jsonl", job->directory);
  char output[PATH_MAX];
  snprintf(output, sizeof output, "%s/reference-output.txt", job->directory);
  /* The trace first: a reader takes the run as kept once its finish lines are. */
  if (keeps && code == 0 &&
      !(keel__chaos_reference_save_trace(output, kept_trace) &&
        keel__chaos_reference_save(events, kept)))
    fprintf(stderr, "keel chaos: cannot keep the failure-free run in %s: %s\n", kept,
            strerror(errno));
  return code;
}

/* The working folder of a run that passed: its events and outputs, then itself. */
static void folder_remove(const char *directory) {
  static const char *const names[] = {"chaos-events.jsonl", "chaos-output.txt",
                                      "reference-events.jsonl", "reference-output.txt"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%.64s/%s", directory, names[i]);
    unlink(path);
  }
  rmdir(directory);
}

/* --etcd with --netns: the nodes reach only their /24 and, through routes keel run gives
 * them, addresses of 198.18.0.0/15 on this host. The cluster gets one of its own: a network
 * of no nodes, whose bridge address its members listen on (docs/CHAOS.md). NULL (the
 * members on 127.0.0.1) without --netns, and where keel run will fall back to one host's
 * network too (not root). */
static bool etcd_network_make(chaos_job *job, const char **client_host) {
  *client_host = NULL;
  if (!job->options->run.netns) return true;
  char reason[KEEL__NETNS_REASON_BYTES];
  keel_status status = keel__netns_create(0, 0, &job->etcd_network, reason, sizeof reason);
  if (status == KEEL_ENOTSUP) return true;
  if (status != KEEL_OK) {
    fprintf(stderr, "keel chaos: cannot make the etcd cluster's network: %s\n", reason);
    return false;
  }
  *client_host = keel__netns_bridge_address(job->etcd_network);
  return true;
}

/* --etcd: the job's store, a cluster of its own in the run's folder, serving both runs. */
static bool etcd_start(chaos_job *job) {
  char reason[256];
  const char *client_host;
  if (!etcd_network_make(job, &client_host)) return false;
  job->etcd = keel__etcd_cluster_start_at((int)job->options->etcd_members, client_host,
                                          job->directory, 1, ETCD_START_MS, reason, sizeof reason);
  if (job->etcd == NULL) {
    keel__netns_destroy(job->etcd_network);
    job->etcd_network = NULL;
    fprintf(stderr, "keel chaos: cannot start an etcd cluster of %" PRId64 ": %s\n",
            job->options->etcd_members, reason);
    return false;
  }
  fprintf(stderr, "keel chaos: the job's store is an etcd cluster of %" PRId64 " (%s)\n",
          job->options->etcd_members, keel__etcd_cluster_endpoint(job->etcd));
  return true;
}

static int chaos_main(chaos_options *options, keel__chaos_failure *failures) {
  chaos_job job = {.options = options, .failures = failures, .capacity = failure_capacity(options)};
  self_path(job.self, sizeof job.self);
  snprintf(job.directory, sizeof job.directory, "/tmp/keel-chaos-XXXXXX");
  keel__chaos_run *reference = calloc(1, sizeof *reference);
  job.run = calloc(1, sizeof *job.run);
  if (reference == NULL || job.run == NULL || mkdtemp(job.directory) == NULL) {
    fprintf(stderr, "keel chaos: cannot make its working folder: %s\n", strerror(errno));
    free(reference);
    free(job.run);
    return KEEL__EXIT_FAILURE;
  }
  if (options->etcd_members > 0 && !etcd_start(&job)) {
    folder_remove(job.directory);
    free(reference);
    free(job.run);
    return KEEL__EXIT_FAILURE;
  }
  int reference_code = options->no_reference ? 0 : reference_run(&job, reference);
  int code = KEEL__EXIT_FAILURE;
  if (stop_signal == 0 && job_start(&job, "chaos")) {
    fprintf(stderr, "keel chaos: the run with failures; its events and output are in %s\n",
            job.directory);
    job_run(&job);
    /* Processes the job lost track of must not outlive the check that counts them. */
    if (stop_signal == 0)
      code = report(&job, options->no_reference ? NULL : reference, reference_code);
    keel__chaos_processes_kill(job.run);
  }
  if (stop_signal != 0) {
    code = 128 + stop_signal;
    keel__chaos_processes_kill(reference);
    fprintf(stderr, "keel chaos: stopped; the runs' events and output are in %s\n", job.directory);
  }
  if (job.run->events != NULL) fclose(job.run->events);
  /* The cluster goes with its data and logs: it holds nothing of the job's results. */
  keel__etcd_cluster_destroy(job.etcd);
  keel__netns_destroy(job.etcd_network);
  if (code == 0 && !options->keep) folder_remove(job.directory);
  keel__chaos_run_clear(reference);
  keel__chaos_run_clear(job.run);
  free(reference);
  free(job.run);
  return code;
}

int keel__command_chaos(int argc, char **argv) {
  chaos_options options;
  bool mix_given;
  int code = options_parse(argc, argv, &options, &mix_given);
  if (code == -1) {
    printf(
        "usage: keel chaos [--failures N | --duration D] [--mix KIND=W,...] [--every MIN..MAX]\n"
        "                  [--seed S] [--etcd N] [--json FILE] [--keep] [--no-reference] "
        "[--reference-dir DIR]\n"
        "                  -- RUN-FLAGS -- PROGRAM ARGS\n"
        "kinds: kill stop hang bitflip launcher-stop kill-node partition delay etcd-kill"
        " etcd-stop (docs/CHAOS.md)\n");
    return 0;
  }
  if (code != 0) return code;
  options.run_argv[0] = "run";
  keel__parse_result parsed =
      keel__run_options_parse(options.run_argc, options.run_argv, &options.run);
  if (parsed != KEEL__PARSE_OK) return parsed == KEEL__PARSE_HELP ? 0 : KEEL__EXIT_USAGE;
  if (options.run.events_path != NULL)
    return chaos_usage("--events is keel chaos's own (--keep keeps its events files)");
  if (options.etcd_members > 0 && options.run.rdzv_endpoint != NULL)
    return chaos_usage("--etcd starts the job's store: leave --rdzv-endpoint out");
  if (!mix_given) default_mix(&options, options.weights);
  for (int kind = 0; kind < KEEL__CHAOS_KIND_COUNT; kind++) {
    const char *why =
        options.weights[kind] > 0 ? kind_refusal(&options, (keel__chaos_kind)kind) : NULL;
    if (why == NULL) continue;
    fprintf(stderr, "keel chaos: refused before starting anything: %s\n", why);
    return KEEL__EXIT_USAGE;
  }
  /* keel chaos is a command, not a guest in someone's process: it may catch these to stop
   * its job in order instead of leaving it to run on. */
  struct sigaction stop_action = {.sa_handler = stop_signal_note};
  sigemptyset(&stop_action.sa_mask);
  sigaction(SIGINT, &stop_action, NULL);
  sigaction(SIGTERM, &stop_action, NULL);
  /* Both runs' ranks report the crc32c of their state at their last commit (`finish`). */
  setenv("KEEL_FINISH_CRC", "1", 1);
  int64_t capacity = failure_capacity(&options);
  keel__chaos_failure *failures = calloc((size_t)capacity, sizeof *failures);
  if (failures == NULL) return KEEL__EXIT_FAILURE;
  for (int64_t i = 0; i < capacity; i++) failure_draw(&options, (uint64_t)i, &failures[i]);
  code = schedule_check(&options, failures, capacity);
  if (code == 0) code = chaos_main(&options, failures);
  free(failures);
  return code;
}
