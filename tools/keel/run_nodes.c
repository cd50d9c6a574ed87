/* `keel run --agents` (and --netns): a job of several nodes on this host. This process, the
 * supervisor, serves the store and starts one agent per node (`keel agent --node-rank i`,
 * each in its own process group with its workers), then only watches them: it is the
 * subreaper of their orphans, and when a node is gone (kill-node, a fenced agent) and no
 * process of its group is left, it marks the node's processes dead in the store at once, as
 * a launcher does for a child it reaped. Everything else is the agents' (run_agent.c). */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"
#include "netns.h"

extern char **environ;

#define SECOND_NS INT64_C(1000000000)
/* How often a gone node's process group is looked at until it is empty. */
#define GROUP_POLL_NS (5 * INT64_C(1000000))

typedef struct node_agent {
  pid_t pid;
  int64_t node;
  bool alive;
  bool accounted; /* its group is empty and what it left in the store is marked dead */
  int wait_status;
  uint64_t exit_order;
} node_agent;

typedef struct nodes_supervisor {
  keel__launcher base; /* signals, store, events file, job file */
  node_agent *agents;  /* every agent started, respawned ones too */
  size_t agent_count, agent_capacity;
  keel__netns *net; /* --netns: each node's namespace; NULL: the nodes share this host's */
  uint64_t exits;
  bool stopping;
  /* --nnodes MIN:MAX with --join-delay: nodes MIN..MAX-1 come that much after the others. */
  bool late_pending;
  int64_t late_at_ns;
} nodes_supervisor;

/* ---- starting the agents */
typedef struct agent_environment {
  char **envp;
  /* KEEL_AGENT_OF, KEEL_STORE, KEEL_JOB_ID, KEEL_JOB_TOKEN, KEEL_HOST, KEEL_AGENT_REJOIN */
  char own[6][600];
} agent_environment;

static bool is_agent_variable(const char *entry) {
  static const char *const names[] = {
      "KEEL_AGENT_OF=",  "KEEL_STORE=", "KEEL_JOB_ID=",
      "KEEL_JOB_TOKEN=", "KEEL_HOST=",  KEEL__AGENT_REJOIN_VARIABLE "="};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strncmp(entry, names[i], strlen(names[i])) == 0) return true;
  return false;
}

/* Built before fork: the supervisor has threads (the store's), so the child may only make
 * async-signal-safe calls. rejoin_used >= 0: the agent starts as a spare node in a killed
 * node's place, that many of the node's own uids used. */
static keel_status agent_environment_build(const nodes_supervisor *supervisor, int64_t node,
                                           int64_t rejoin_used, agent_environment *environment) {
  const keel__launcher *base = &supervisor->base;
  size_t inherited = 0;
  while (environ[inherited] != NULL) inherited++;
  environment->envp = calloc(inherited + 7, sizeof *environment->envp);
  if (environment->envp == NULL) return KEEL_ENOMEM;
  size_t used = 0;
  for (size_t i = 0; i < inherited; i++)
    if (!is_agent_variable(environ[i])) environment->envp[used++] = environ[i];
  char token[2 * KEEL_TOKEN_BYTES + 1];
  keel_hex_encode(base->auth.token, KEEL_TOKEN_BYTES, token);
  snprintf(environment->own[0], sizeof environment->own[0], "KEEL_AGENT_OF=%ld", (long)getpid());
  snprintf(environment->own[1], sizeof environment->own[1], "KEEL_STORE=%s", base->endpoint);
  snprintf(environment->own[2], sizeof environment->own[2], "KEEL_JOB_ID=%llu",
           (unsigned long long)base->auth.job_id);
  snprintf(environment->own[3], sizeof environment->own[3], "KEEL_JOB_TOKEN=%s", token);
  size_t own = 4;
  /* In its namespace a node's processes listen on the node's address. */
  if (supervisor->net != NULL)
    snprintf(environment->own[own++], sizeof environment->own[0], "KEEL_HOST=%s",
             keel__netns_node_address(supervisor->net, (size_t)node));
  if (rejoin_used >= 0)
    snprintf(environment->own[own++], sizeof environment->own[0], "%s=%lld",
             KEEL__AGENT_REJOIN_VARIABLE, (long long)rejoin_used);
  for (size_t i = 0; i < own; i++) environment->envp[used++] = environment->own[i];
  return KEEL_OK;
}

/* keel agent --node-rank I <the flags of this command> -- PROG ARGS... */
static char **agent_argv_build(const keel__run_options *options, char *node_text) {
  char **argv = calloc((size_t)options->argc + 4, sizeof *argv);
  if (argv == NULL) return NULL;
  argv[0] = "keel";
  argv[1] = "agent";
  argv[2] = "--node-rank";
  argv[3] = node_text;
  for (int i = 1; i < options->argc; i++) argv[3 + i] = options->argv[i];
  return argv;
}

/* Room for one more agent in the table (a respawned node's agent is a new entry). */
static keel_status agents_grow(nodes_supervisor *supervisor) {
  if (supervisor->agent_count < supervisor->agent_capacity) return KEEL_OK;
  size_t capacity = supervisor->agent_capacity ? 2 * supervisor->agent_capacity : 4;
  node_agent *more = realloc(supervisor->agents, capacity * sizeof *more);
  if (more == NULL) return KEEL_ENOMEM;
  supervisor->agents = more;
  supervisor->agent_capacity = capacity;
  return KEEL_OK;
}

static keel_status agent_spawn(nodes_supervisor *supervisor, int64_t node, int64_t rejoin_used) {
  keel__launcher *base = &supervisor->base;
  char node_text[24];
  snprintf(node_text, sizeof node_text, "%lld", (long long)node);
  keel_status status = agents_grow(supervisor);
  if (status != KEEL_OK) return status;
  agent_environment environment;
  status = agent_environment_build(supervisor, node, rejoin_used, &environment);
  if (status != KEEL_OK) return status;
  char **argv = agent_argv_build(&base->options, node_text);
  if (argv == NULL) {
    free(environment.envp);
    return KEEL_ENOMEM;
  }
  pid_t pid = fork();
  if (pid == 0) {
    sigprocmask(SIG_SETMASK, &base->old_mask, NULL);
    struct sigaction default_action = {.sa_handler = SIG_DFL};
    sigaction(SIGPIPE, &default_action, NULL);
    /* The node's group: the agent and, after it, every process it starts. */
    setpgid(0, 0);
    if (supervisor->net != NULL && keel__netns_enter(supervisor->net, (size_t)node) != KEEL_OK)
      _exit(KEEL__EXIT_FAILURE);
    execve(base->program_path, argv, environment.envp);
    _exit(KEEL__EXIT_NOT_FOUND);
  }
  free(argv);
  free(environment.envp);
  if (pid < 0) {
    KEEL_LOG_E("keel run", "cannot start the agent of node %lld: %s", (long long)node,
               strerror(errno));
    return keel_status_from_errno(errno);
  }
  setpgid(pid, pid); /* also here, so that no signal to the group can come before it exists */
  supervisor->agents[supervisor->agent_count++] =
      (node_agent){.pid = pid, .node = node, .alive = true};
  keel__event_emit(base, "agent_spawn", "\"node\":%lld,\"pid\":%ld,\"respawn\":%s", (long long)node,
                   (long)pid, rejoin_used >= 0 ? "true" : "false");
  return KEEL_OK;
}

/* ---- a node that is gone */
/* Every process the store still shows on a gone node is dead now, as the launcher writes
 * dead/<uid> for a child it reaped, and its lease is revoked so that nobody waits for it to
 * lapse. */
static bool process_mark_dead(keel_store *store, const keel_store_entry *entry,
                              const keel__proc_value *value, void *context) {
  (void)value, (void)context;
  char key[64];
  snprintf(key, sizeof key, "dead/%s", entry->key + strlen("proc/"));
  static const char text[] = "status=node-lost";
  if (keel_store_put(store, key, text, sizeof text - 1, 0, NULL) != KEEL_OK) return false;
  if (entry->lease != 0) keel_store_lease_revoke(store, entry->lease);
  return true;
}

/* The node's lease ends now rather than a TTL later, so that the root decides at once. */
static void node_lease_end(keel_store *store, int64_t node) {
  char key[32];
  snprintf(key, sizeof key, "node/%lld", (long long)node);
  keel_store_entry *entry = NULL;
  if (keel_store_get(store, key, &entry) != KEEL_OK) return;
  if (entry->lease != 0) keel_store_lease_revoke(store, entry->lease);
  keel_store_entry_free(entry);
}

/* Once the group of a node whose agent ended is empty (kill-node killed all of it; orphans
 * of a lone dead agent saved and left, reaped here as their subreaper), what the store
 * still shows of the node is dead. */
static bool agent_account(nodes_supervisor *supervisor, node_agent *agent) {
  if (kill(-agent->pid, 0) == 0 || errno != ESRCH) return false;
  char outcome[32];
  keel__wait_status_text(agent->wait_status, outcome, sizeof outcome);
  size_t marked =
      keel__node_processes_visit(supervisor->base.store, agent->node, process_mark_dead, NULL);
  node_lease_end(supervisor->base.store, agent->node);
  agent->accounted = true;
  bool clean = WIFEXITED(agent->wait_status) && WEXITSTATUS(agent->wait_status) == 0;
  if (clean && marked == 0) return true;
  keel__event_emit(&supervisor->base, "node_lost",
                   "\"node\":%lld,\"agent_pid\":%ld,\"agent_status\":\"%s\",\"processes\":%zu",
                   (long long)agent->node, (long)agent->pid, outcome, marked);
  KEEL_LOG_W("keel run", "node %lld is gone (agent %s): %zu of its processes marked dead",
             (long long)agent->node, outcome, marked);
  return true;
}

/* With --spare-nodes, a node that was killed (its agent ended by a signal: the host died)
 * comes back as a spare node, as a replaced host does: the job keeps its spare nodes over
 * any number of node failures, while the node has uids left (--max-restarts sizes them). A
 * node that ended any other way (fenced, finished, stopped) is not started again, nor one
 * of a job with --ckpt mem. */
static void node_respawn(nodes_supervisor *supervisor, int64_t node, int wait_status) {
  keel__launcher *base = &supervisor->base;
  const keel__run_options *options = &base->options;
  if (options->spare_nodes == 0 || supervisor->stopping || !WIFSIGNALED(wait_status)) return;
  /* The in-memory tier keys its copies by node: a new life under the old index, holding
   * none, would be asked for its predecessor's, and restores would fall back to the
   * persistent tier (test_memory). Such a job keeps the spare nodes it started with. */
  if (options->ckpt == KEEL__CKPT_MEM) return;
  if (keel__store_has(base->store, "job/done")) return;
  /* Its lives' agents recorded how many of its own uids they gave (uids/node/<i>). */
  int64_t used = keel__agent_uids_used(base->store, node);
  int64_t room = (int64_t)keel__agent_uid_stride(options) - used;
  if (room <= 0) {
    KEEL_LOG_W("keel run", "node %lld is not started again: no uid of it is left", (long long)node);
    return;
  }
  if (agent_spawn(supervisor, node, used) != KEEL_OK) return;
  keel__event_emit(base, "node_respawn", "\"node\":%lld,\"uids_used\":%lld,\"uids_left\":%lld",
                   (long long)node, (long long)used, (long long)room);
  keel__display_note(base, "node %lld starts again as a spare node", (long long)node);
}

static node_agent *agent_by_pid(nodes_supervisor *supervisor, pid_t pid) {
  for (size_t i = 0; i < supervisor->agent_count; i++)
    if (supervisor->agents[i].pid == pid && supervisor->agents[i].alive)
      return &supervisor->agents[i];
  return NULL;
}

/* Reaps agents and, as the subreaper, the orphans of dead agents. */
static void supervisor_reap(nodes_supervisor *supervisor) {
  for (;;) {
    int wait_status;
    pid_t pid = waitpid(-1, &wait_status, WNOHANG);
    if (pid <= 0) return;
    node_agent *agent = agent_by_pid(supervisor, pid);
    if (agent == NULL) continue;
    agent->alive = false;
    agent->wait_status = wait_status;
    agent->exit_order = ++supervisor->exits;
  }
}

/* ---- the loop */
static void agents_signal(nodes_supervisor *supervisor, int signal_number, bool whole_group) {
  for (size_t i = 0; i < supervisor->agent_count; i++) {
    const node_agent *agent = &supervisor->agents[i];
    if (agent->alive) kill(whole_group ? -agent->pid : agent->pid, signal_number);
  }
}

/* The first SIGINT/SIGTERM goes to every agent, which stops its node in order; a second one
 * kills every node. */
static void supervisor_handle_signals(nodes_supervisor *supervisor) {
  struct signalfd_siginfo info;
  while (read(supervisor->base.signal_fd, &info, sizeof info) == (ssize_t)sizeof info) {
    if (info.ssi_signo == SIGCHLD) continue;
    int signal_number = (int)info.ssi_signo;
    if (!supervisor->stopping) {
      supervisor->stopping = true;
      supervisor->base.stop_signal = signal_number;
      KEEL_LOG_W("keel run", "%s: stopping every node in order (again to kill at once)",
                 strsignal(signal_number));
      agents_signal(supervisor, signal_number, false);
      continue;
    }
    agents_signal(supervisor, SIGKILL, true);
  }
}

static bool node_comes_late(const keel__run_options *options, int64_t node) {
  return options->join_delay_ns > 0 && node >= options->nnodes_min && node < options->nnodes;
}

/* The late nodes' agents start, as hosts arriving while the job trains; not once every node
 * has ended or the job is done, since there is nothing left to join. */
static int late_agents_spawn(nodes_supervisor *supervisor) {
  supervisor->late_pending = false;
  bool any_alive = false;
  for (size_t i = 0; i < supervisor->agent_count; i++) any_alive |= supervisor->agents[i].alive;
  if (!any_alive || supervisor->stopping || keel__store_has(supervisor->base.store, "job/done"))
    return -1;
  const keel__run_options *options = &supervisor->base.options;
  for (int64_t node = options->nnodes_min; node < options->nnodes; node++) {
    if (agent_spawn(supervisor, node, -1) == KEEL_OK) continue;
    agents_signal(supervisor, SIGKILL, true);
    return KEEL__EXIT_FAILURE;
  }
  return -1;
}

static bool supervisor_finished(const nodes_supervisor *supervisor) {
  for (size_t i = 0; i < supervisor->agent_count; i++)
    if (supervisor->agents[i].alive || !supervisor->agents[i].accounted) return false;
  return true;
}

/* The job's code: the first agent that ended on its own with a non-zero code; else 0 when
 * any node finished; else the first agent's end (every node was lost). */
static int supervisor_verdict(const nodes_supervisor *supervisor) {
  const node_agent *first_nonzero = NULL, *first_lost = NULL;
  bool any_finished = false;
  for (size_t i = 0; i < supervisor->agent_count; i++) {
    const node_agent *agent = &supervisor->agents[i];
    int code = keel__wait_status_code(agent->wait_status);
    bool lost = !WIFEXITED(agent->wait_status) || code == KEEL__EXIT_FENCED;
    if (lost) {
      if (first_lost == NULL || agent->exit_order < first_lost->exit_order) first_lost = agent;
      continue;
    }
    any_finished = true;
    if (code != 0 && (first_nonzero == NULL || agent->exit_order < first_nonzero->exit_order))
      first_nonzero = agent;
  }
  if (first_nonzero != NULL) return keel__wait_status_code(first_nonzero->wait_status);
  if (any_finished || first_lost == NULL) return 0;
  return keel__wait_status_code(first_lost->wait_status);
}

static void supervisor_loop(nodes_supervisor *supervisor, int64_t timeout_deadline_ns,
                            int exit_override) {
  while (!supervisor_finished(supervisor)) {
    bool pending = false;
    for (size_t i = 0; i < supervisor->agent_count; i++) {
      node_agent *agent = &supervisor->agents[i];
      if (agent->alive || agent->accounted) continue;
      if (!agent_account(supervisor, agent)) {
        pending = true;
        continue;
      }
      /* Copied out: a respawn may move the table. */
      node_agent ended = *agent;
      node_respawn(supervisor, ended.node, ended.wait_status);
    }
    if (supervisor_finished(supervisor)) break;
    int64_t next = pending ? keel_deadline_after_ns(GROUP_POLL_NS) : timeout_deadline_ns;
    if (timeout_deadline_ns < next) next = timeout_deadline_ns;
    if (supervisor->late_pending && supervisor->late_at_ns < next) next = supervisor->late_at_ns;
    struct pollfd fd = {.fd = supervisor->base.signal_fd, .events = POLLIN};
    int ready = poll(&fd, 1, keel_poll_timeout_ms(next));
    if (ready > 0) supervisor_handle_signals(supervisor);
    supervisor_reap(supervisor);
    if (supervisor->late_pending && exit_override < 0 && keel_now_ns() >= supervisor->late_at_ns)
      exit_override = late_agents_spawn(supervisor);
    if (exit_override < 0 && keel_now_ns() >= timeout_deadline_ns) {
      KEEL_LOG_E("keel run", "--timeout passed: killing every node");
      keel__event_emit(&supervisor->base, "timeout", NULL);
      agents_signal(supervisor, SIGKILL, true);
      exit_override = KEEL__EXIT_TIMEOUT;
      timeout_deadline_ns = KEEL_NO_DEADLINE;
    }
  }
  supervisor->base.exit_code = exit_override >= 0 ? exit_override : supervisor_verdict(supervisor);
  if (exit_override < 0 && supervisor->stopping)
    supervisor->base.exit_code = 128 + supervisor->base.stop_signal;
}

/* An outside store (--rdzv-endpoint): the nodes reach nothing beyond their /24, so each
 * gets a route to each of its members, which must be addresses of this host in
 * 198.18.0.0/15 (keel chaos --etcd serves its cluster on a network of its own there). One on
 * 127.0.0.1 or elsewhere is refused before anything starts: the nodes could not reach it. */
static keel_status store_routes_add(nodes_supervisor *supervisor) {
  const char *hosts = supervisor->base.options.rdzv_endpoint;
  if (hosts == NULL) return KEEL_OK;
  const char *scheme_end = strstr(hosts, "://");
  if (scheme_end != NULL) hosts = scheme_end + 3;
  while (*hosts != '\0') {
    size_t length = strcspn(hosts, ",");
    char host[64], reason[KEEL__NETNS_REASON_BYTES];
    snprintf(host, sizeof host, "%.*s", (int)length, hosts);
    char *port = strrchr(host, ':');
    if (port != NULL) *port = '\0';
    keel_status status = keel__netns_route_add(supervisor->net, host, reason, sizeof reason);
    if (status != KEEL_OK) {
      fprintf(stderr, "keel run: %s (the store member at %.*s)\n", reason, (int)length, hosts);
      return status;
    }
    hosts += length;
    if (*hosts == ',') hosts++;
  }
  return KEEL_OK;
}

/* --netns: the nodes' namespaces, made before the store so that it listens on the bridge.
 * Without root the job still runs, its nodes sharing this host's network, and says why. */
static keel_status network_make(nodes_supervisor *supervisor) {
  const keel__run_options *options = &supervisor->base.options;
  if (!options->netns) return KEEL_OK;
  uint64_t rate = 0;
  if (options->link_rate != NULL && keel__netns_rate_parse(options->link_rate, &rate) != KEEL_OK)
    return KEEL_EINVAL; /* run_options.c checked it already */
  char reason[KEEL__NETNS_REASON_BYTES];
  size_t nodes = (size_t)(options->nnodes + options->spare_nodes);
  keel_status status = keel__netns_create(nodes, rate, &supervisor->net, reason, sizeof reason);
  if (status == KEEL_ENOTSUP) {
    fprintf(stderr, "keel run: %s; the nodes share this host's network instead\n", reason);
    return KEEL_OK;
  }
  if (status != KEEL_OK) {
    fprintf(stderr, "keel run: %s\n", reason);
    return status;
  }
  snprintf(supervisor->base.store_listen, sizeof supervisor->base.store_listen, "%s:0",
           keel__netns_bridge_address(supervisor->net));
  status = store_routes_add(supervisor);
  if (status != KEEL_OK) goto fail_destroy_network;
  return KEEL_OK;
fail_destroy_network:
  keel__netns_destroy(supervisor->net);
  supervisor->net = NULL;
  return status;
}

int keel__nodes_run(const keel__run_options *options) {
  nodes_supervisor *supervisor = calloc(1, sizeof *supervisor);
  if (supervisor == NULL) return KEEL__EXIT_FAILURE;
  keel__launcher *base = &supervisor->base;
  keel__launcher_init(base, options);
  int exit_code = KEEL__EXIT_FAILURE;
  ssize_t length = readlink("/proc/self/exe", base->program_path, sizeof base->program_path - 1);
  size_t nodes = (size_t)(options->nnodes + options->spare_nodes);
  if (length <= 0) goto free_supervisor;
  base->program_path[length] = '\0';
  /* Orphans of a dead agent come to this process, which tells when a node is empty. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  if (network_make(supervisor) != KEEL_OK) goto free_supervisor;
  if (keel__launcher_open_base(base) != KEEL_OK) goto destroy_network;
  keel__launcher_emit_start(base);
  base->start_ns = keel_now_ns();
  int64_t timeout_deadline_ns =
      options->timeout_ns > 0 ? keel_deadline_after_ns(options->timeout_ns) : KEEL_NO_DEADLINE;
  int exit_override = -1;
  supervisor->late_at_ns = base->start_ns + options->join_delay_ns;
  for (size_t node = 0; node < nodes && exit_override < 0; node++) {
    supervisor->late_pending |= node_comes_late(options, (int64_t)node);
    if (node_comes_late(options, (int64_t)node)) continue;
    if (agent_spawn(supervisor, (int64_t)node, -1) == KEEL_OK) continue;
    agents_signal(supervisor, SIGKILL, true);
    exit_override = KEEL__EXIT_FAILURE;
  }
  supervisor_loop(supervisor, timeout_deadline_ns, exit_override);
  exit_code = base->exit_code;
  keel__event_emit(base, "job_end", "\"code\":%d,\"seconds\":%.3f", exit_code,
                   (double)(keel_now_ns() - base->start_ns) / 1e9);
  keel__mem_folder_remove(base);
  keel__launcher_close_base(base);
destroy_network:
  keel__netns_destroy(supervisor->net);
free_supervisor:
  free(supervisor->agents);
  free(supervisor);
  return exit_code;
}
