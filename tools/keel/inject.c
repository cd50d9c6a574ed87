/* `keel inject`, `keel ps` and `keel status`: tools that join a running job's store (found
 * through its job file) to list its live processes, parameter servers and nodes or to make
 * a failure happen to one rank, server or node, the same failure a test or a user would
 * cause by hand. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "netns.h"
#include "tool.h"

typedef struct inject_action {
  const char *name;
  int signal_number;
  const char *done; /* the verb of the line printed on success */
} inject_action;

static const inject_action inject_actions[] = {
    {"kill", SIGKILL, "killed"},
    {"stop", SIGSTOP, "stopped"},
    {"cont", SIGCONT, "continued"},
    /* No signal: the process's own session passes these on (inject_request). */
    {"hang", 0, "hung"},
    {"bitflip", 0, "flipped a bit of"},
};

/* A process the launcher has reaped keeps its proc/ key until its lease ends; dead/<uid>
 * says it is gone already. */
static bool uid_is_dead(keel_store *store, uint32_t uid) {
  char key[32];
  snprintf(key, sizeof key, "dead/%u", (unsigned)uid);
  return keel__store_has(store, key);
}

/* The live holder of rank: among proc/ values with that rank, the highest epoch (a process
 * that held the rank in an older epoch may linger until its lease ends). */
static keel_status rank_holder_find(keel_store *store, int64_t rank, uint32_t *uid_p,
                                    keel__proc_value *value_p) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  keel_status status = keel_store_list(store, "proc/", &entries, &count, NULL);
  if (status != KEEL_OK) return status;
  status = KEEL_ENOTFOUND;
  for (size_t i = 0; i < count; i++) {
    uint32_t uid;
    keel__proc_value value;
    if (keel__uid_from_key(entries[i].key, "proc/", &uid) != KEEL_OK) continue;
    if (keel__proc_value_parse((const char *)entries[i].value, &value) != KEEL_OK) continue;
    if (value.rank != rank || uid_is_dead(store, uid)) continue;
    if (status == KEEL_OK && value.epoch <= value_p->epoch) continue;
    *uid_p = uid;
    *value_p = value;
    status = KEEL_OK;
  }
  keel_store_entries_free(entries, count);
  return status;
}

/* The process must be the job's: proc/ values are written by processes, and a signal to a
 * pid that was reused by something else would hit a bystander. A job's processes are the
 * launcher's children, or its agents' (keel run --agents). */
static bool pid_is_of_job(pid_t pid, pid_t launcher) {
  char state;
  pid_t parent, grandparent;
  if (keel_process_stat(pid, &state, &parent) != KEEL_OK) return false;
  if (parent == launcher) return true;
  return keel_process_stat(parent, &state, &grandparent) == KEEL_OK && grandparent == launcher;
}

static int inject_usage(const char *message) {
  fprintf(stderr,
          "keel inject: %s (usage: keel inject kill|stop|cont RANK|server:I | hang|bitflip RANK |"
          " kill-node|partition|heal NODE | delay NODE DURATION [--job JOB_ID])\n",
          message);
  return KEEL__EXIT_USAGE;
}

/* Sends the action's signal to pid, the process of uid that `what` names ("rank 1",
 * "server 2"), once it is known to be the job's. */
static int process_signal(const keel__job_info *job, const inject_action *action, pid_t pid,
                          uint32_t uid, const char *what) {
  if (!pid_is_of_job(pid, job->launcher_pid)) {
    fprintf(stderr, "keel inject: pid %ld of %s is not a process of job %llu\n", (long)pid, what,
            (unsigned long long)job->auth.job_id);
    return KEEL__EXIT_FAILURE;
  }
  if (kill(pid, action->signal_number) != 0) {
    fprintf(stderr, "keel inject: %s pid %ld: %s\n", action->name, (long)pid, strerror(errno));
    return KEEL__EXIT_FAILURE;
  }
  printf("%s %s (uid %u, pid %ld)\n", action->done, what, (unsigned)uid, (long)pid);
  return 0;
}

/* hang: the training thread of the rank's process blocks for good at its next step while its
 * heartbeat runs on: only the job's collective deadline can catch it. bitflip: it flips one bit
 * of its registered state at its next step: silent corruption, which only --verify-replicas
 * catches. The process's session reads inject/<action>/<uid> within 100 ms, passes it to its
 * fault plan and deletes it. */
static int inject_request(keel_store *store, const keel__job_info *job, const inject_action *action,
                          pid_t pid, uint32_t uid, const char *what) {
  if (!pid_is_of_job(pid, job->launcher_pid)) {
    fprintf(stderr, "keel inject: pid %ld of %s is not a process of job %llu\n", (long)pid, what,
            (unsigned long long)job->auth.job_id);
    return KEEL__EXIT_FAILURE;
  }
  char key[48];
  snprintf(key, sizeof key, "inject/%s/%u", action->name, (unsigned)uid);
  keel_status status = keel_store_put(store, key, "1", 1, 0, NULL);
  if (status != KEEL_OK) {
    fprintf(stderr, "keel inject: cannot ask %s to %s: %s\n", what, action->name,
            keel_strerror(status));
    return KEEL__EXIT_FAILURE;
  }
  printf("%s %s (uid %u, pid %ld) at its next step\n", action->done, what, (unsigned)uid,
         (long)pid);
  return 0;
}

static int inject_signal(keel_store *store, const keel__job_info *job, const inject_action *action,
                         int64_t rank) {
  uint32_t uid = 0;
  keel__proc_value value;
  keel_status status = rank_holder_find(store, rank, &uid, &value);
  if (status != KEEL_OK) {
    fprintf(stderr, "keel inject: no live process holds rank %lld in job %llu\n", (long long)rank,
            (unsigned long long)job->auth.job_id);
    return KEEL__EXIT_FAILURE;
  }
  char what[48];
  snprintf(what, sizeof what, "rank %lld", (long long)rank);
  if (action->signal_number == 0) return inject_request(store, job, action, value.pid, uid, what);
  return process_signal(job, action, value.pid, uid, what);
}

/* ---- parameter servers (keel run --servers): server/<index> keys, put by the launcher */
typedef struct server_value {
  pid_t pid;
  uint32_t uid;
  char status[32]; /* KEEL__SERVER_RUNNING, or how it ended */
} server_value;

static keel_status server_value_parse(const char *text, server_value *value_p) {
  long pid;
  unsigned uid;
  char status[32];
  if (sscanf(text, "pid=%ld uid=%u status=%31s", &pid, &uid, status) != 3 || pid <= 1)
    return KEEL_EINVAL;
  *value_p = (server_value){.pid = (pid_t)pid, .uid = uid};
  snprintf(value_p->status, sizeof value_p->status, "%s", status);
  return KEEL_OK;
}

static bool server_is_running(const server_value *value) {
  return strcmp(value->status, KEEL__SERVER_RUNNING) == 0;
}

/* The address server index published (ec/server/<i>), or "-" while it has not. */
static void server_address(keel_store *store, int64_t index, char *address, size_t capacity) {
  char key[48];
  snprintf(key, sizeof key, "ec/server/%lld", (long long)index);
  keel_store_entry *entry = NULL;
  snprintf(address, capacity, "-");
  if (keel_store_get(store, key, &entry) != KEEL_OK) return;
  snprintf(address, capacity, "%s", (const char *)entry->value);
  keel_store_entry_free(entry);
}

typedef void server_visit_cb(keel_store *store, int64_t index, const server_value *value,
                             void *context);

/* Calls visit for each server the launcher started, in index order (the store lists keys
 * in text order, server/10 before server/2); how many it visited. */
static size_t servers_visit(keel_store *store, server_visit_cb *visit, void *context) {
  keel_store_entry *entries = NULL;
  size_t count = 0, visited = 0;
  if (keel_store_list(store, KEEL__SERVER_PREFIX, &entries, &count, NULL) != KEEL_OK) return 0;
  const keel_store_entry **by_index = calloc(count ? count : 1, sizeof *by_index);
  for (size_t i = 0; by_index != NULL && i < count; i++) {
    uint32_t index;
    if (keel__uid_from_key(entries[i].key, KEEL__SERVER_PREFIX, &index) == KEEL_OK && index < count)
      by_index[index] = &entries[i];
  }
  for (size_t index = 0; by_index != NULL && index < count; index++) {
    server_value value;
    if (by_index[index] == NULL ||
        server_value_parse((const char *)by_index[index]->value, &value) != KEEL_OK)
      continue;
    visit(store, (int64_t)index, &value, context);
    visited++;
  }
  free(by_index);
  keel_store_entries_free(entries, count);
  return visited;
}

static int inject_server_signal(keel_store *store, const keel__job_info *job,
                                const inject_action *action, int64_t index) {
  char key[48];
  snprintf(key, sizeof key, KEEL__SERVER_PREFIX "%lld", (long long)index);
  keel_store_entry *entry = NULL;
  server_value value;
  keel_status status = keel_store_get(store, key, &entry);
  if (status == KEEL_OK) status = server_value_parse((const char *)entry->value, &value);
  keel_store_entry_free(entry);
  if (status == KEEL_ENOTFOUND) {
    fprintf(stderr, "keel inject: job %llu has no parameter server %lld (keel ps lists them)\n",
            (unsigned long long)job->auth.job_id, (long long)index);
    return KEEL__EXIT_USAGE;
  }
  if (status != KEEL_OK) {
    fprintf(stderr, "keel inject: cannot read %s of job %llu: %s\n", key,
            (unsigned long long)job->auth.job_id, keel_strerror(status));
    return KEEL__EXIT_FAILURE;
  }
  if (!server_is_running(&value)) {
    fprintf(stderr, "keel inject: server %lld of job %llu has ended already (%s)\n",
            (long long)index, (unsigned long long)job->auth.job_id, value.status);
    return KEEL__EXIT_FAILURE;
  }
  char what[48];
  snprintf(what, sizeof what, "server %lld", (long long)index);
  return process_signal(job, action, value.pid, value.uid, what);
}

/* For agents that do not keep their node's processes in their own group (one agent per
 * host), each process the store shows on the node is killed by pid. */
static bool process_kill(keel_store *store, const keel_store_entry *entry,
                         const keel__proc_value *value, void *context) {
  (void)store, (void)entry;
  const keel__job_info *job = context;
  return pid_is_of_job(value->pid, job->launcher_pid) && kill(value->pid, SIGKILL) == 0;
}

/* kill-node: the agent and every process of its node at once, as when a host dies. */
static int inject_kill_node(keel_store *store, const keel__job_info *job, int64_t node) {
  char key[32];
  snprintf(key, sizeof key, "node/%lld", (long long)node);
  keel_store_entry *entry = NULL;
  keel__node_value value;
  keel_status status = keel_store_get(store, key, &entry);
  if (status == KEEL_OK) status = keel__node_value_parse((const char *)entry->value, &value);
  keel_store_entry_free(entry);
  if (status != KEEL_OK) {
    fprintf(stderr, "keel inject: job %llu has no live node %lld (%s)\n",
            (unsigned long long)job->auth.job_id, (long long)node, keel_strerror(status));
    return KEEL__EXIT_FAILURE;
  }
  bool agent_is_job = value.pid == job->launcher_pid || pid_is_of_job(value.pid, job->launcher_pid);
  if (!agent_is_job) {
    fprintf(stderr, "keel inject: the agent of node %lld (pid %ld) is not a process of job %llu\n",
            (long long)node, (long)value.pid, (unsigned long long)job->auth.job_id);
    return KEEL__EXIT_FAILURE;
  }
  if (value.own_group) {
    if (kill(-value.pgid, SIGKILL) != 0) {
      fprintf(stderr, "keel inject: kill-node %lld: %s\n", (long long)node, strerror(errno));
      return KEEL__EXIT_FAILURE;
    }
    printf("killed node %lld (agent pid %ld and its process group)\n", (long long)node,
           (long)value.pid);
    return 0;
  }
  size_t killed = keel__node_processes_visit(store, node, process_kill, (void *)job);
  kill(value.pid, SIGKILL);
  printf("killed node %lld (agent pid %ld and %zu processes)\n", (long long)node, (long)value.pid,
         killed);
  return 0;
}

/* partition and heal: the node's link to the job's bridge (keel run --netns) drops every
 * frame, silently, or lets them through again. */
static int inject_link(const keel__job_info *job, int64_t node, bool cut) {
  char link[32];
  if (!keel__netns_link_name(job->launcher_pid, (size_t)node, link, sizeof link))
    return KEEL__EXIT_FAILURE;
  keel_status status = cut ? keel__netns_link_partition(link) : keel__netns_link_heal(link);
  if (status != KEEL_OK) {
    fprintf(stderr, "keel inject: cannot %s node %lld of job %llu (is it a --netns job?): %s\n",
            cut ? "partition" : "heal", (long long)node, (unsigned long long)job->auth.job_id,
            keel_strerror(status));
    return KEEL__EXIT_FAILURE;
  }
  printf("%s node %lld\n", cut ? "partitioned" : "healed", (long long)node);
  return 0;
}

/* delay: every frame the node's processes send goes out that much later (0: no more delay).
 * The processes apply it at their next look at the store (every 100 ms at most) and each
 * says so in a send_delay event. */
static int inject_delay(keel_store *store, const keel__job_info *job, int64_t node,
                        int64_t delay_ns) {
  char key[48], value[32];
  snprintf(key, sizeof key, "inject/delay/%lld", (long long)node);
  snprintf(value, sizeof value, "%lld", (long long)delay_ns);
  keel_status status = delay_ns == 0 ? keel_store_delete(store, key)
                                     : keel_store_put(store, key, value, strlen(value), 0, NULL);
  if (status != KEEL_OK && !(delay_ns == 0 && status == KEEL_ENOTFOUND)) {
    fprintf(stderr, "keel inject: cannot set the delay of node %lld in job %llu: %s\n",
            (long long)node, (unsigned long long)job->auth.job_id, keel_strerror(status));
    return KEEL__EXIT_FAILURE;
  }
  printf("delayed node %lld by %.3f ms\n", (long long)node, (double)delay_ns / 1e6);
  return 0;
}

/* The target of an action: a rank or a node, or "server:I" for kill, stop and cont. NULL
 * when it is good (*server_p and *number_p set), else the usage message. */
static const char *target_parse(const char *text, bool node_action, bool *server_p,
                                int64_t *number_p) {
  static const char server_prefix[] = "server:";
  bool server = strncmp(text, server_prefix, strlen(server_prefix)) == 0;
  if (server && node_action) return "server:I goes with kill, stop or cont";
  const char *number = server ? text + strlen(server_prefix) : text;
  if (keel_parse_int(number, 0, INT32_MAX, number_p) != KEEL_OK)
    return server ? "server:I needs a server index, a non-negative integer"
                  : "RANK must be a non-negative integer";
  *server_p = server;
  return NULL;
}

int keel__command_inject(int argc, char **argv) {
  const char *job_id = NULL, *action_name = NULL, *rank_text = NULL, *duration_text = NULL;
  bool bad = false;
  for (int index = 1; index < argc; index++) {
    if (keel__job_flag(argc, argv, &index, &job_id, &bad)) continue;
    if (argv[index][0] == '-' && argv[index][1] != '\0') return inject_usage("unknown flag");
    if (action_name == NULL)
      action_name = argv[index];
    else if (rank_text == NULL)
      rank_text = argv[index];
    else if (duration_text == NULL)
      duration_text = argv[index];
    else
      return inject_usage("too many arguments");
  }
  if (bad) return inject_usage("--job needs a job id");
  if (action_name == NULL || rank_text == NULL)
    return inject_usage("an action and a rank are needed");
  bool delay = strcmp(action_name, "delay") == 0;
  if (delay != (duration_text != NULL))
    return inject_usage(delay ? "delay needs a DURATION (20ms; 0 ends the delay)"
                              : "too many arguments");
  int64_t delay_ns = 0;
  if (delay && keel_parse_duration_ns(duration_text, &delay_ns) != KEEL_OK)
    return inject_usage("DURATION must be a duration such as 20ms or 0");
  bool kill_node = strcmp(action_name, "kill-node") == 0;
  bool partition = strcmp(action_name, "partition") == 0, heal = strcmp(action_name, "heal") == 0;
  bool node_action = kill_node || partition || heal || delay;
  const inject_action *action = NULL;
  for (size_t i = 0; i < sizeof inject_actions / sizeof inject_actions[0]; i++) {
    if (strcmp(action_name, inject_actions[i].name) == 0) action = &inject_actions[i];
  }
  if (action == NULL && !node_action)
    return inject_usage(
        "the action must be kill, stop, cont, hang, bitflip, kill-node, partition, heal or delay");
  int64_t rank;
  bool server = false;
  const char *problem = target_parse(rank_text, node_action, &server, &rank);
  if (problem != NULL) return inject_usage(problem);
  if (server && action->signal_number == 0) return inject_usage("hang and bitflip go with a RANK");
  keel__job_info job;
  keel_store *store = NULL;
  if (keel__job_connect(job_id, &job, &store) != KEEL_OK) return KEEL__EXIT_FAILURE;
  int exit_code = kill_node     ? inject_kill_node(store, &job, rank)
                  : delay       ? inject_delay(store, &job, rank, delay_ns)
                  : node_action ? inject_link(&job, rank, partition)
                  : server      ? inject_server_signal(store, &job, action, rank)
                                : inject_signal(store, &job, action, rank);
  keel_store_close(store);
  return exit_code;
}

/* A command whose only flag is --job (ps, status): finds the job and connects to its store;
 * 0, or the exit code of a usage error or a job that cannot be reached. */
static int job_command_connect(const char *name, int argc, char **argv, keel__job_info *job,
                               keel_store **store_p) {
  const char *job_id = NULL;
  bool bad = false;
  for (int index = 1; index < argc; index++) {
    if (keel__job_flag(argc, argv, &index, &job_id, &bad)) continue;
    fprintf(stderr, "keel %s: unexpected '%s' (usage: keel %s [--job JOB_ID])\n", name, argv[index],
            name);
    return KEEL__EXIT_USAGE;
  }
  if (bad) {
    fprintf(stderr, "keel %s: --job needs a job id\n", name);
    return KEEL__EXIT_USAGE;
  }
  return keel__job_connect(job_id, job, store_p) == KEEL_OK ? 0 : KEEL__EXIT_FAILURE;
}

/* One row of keel ps (the header too); the role column fits "server:255". */
static void ps_row_print(const char *uid, const char *pid, const char *role, const char *rank,
                         const char *epoch, const char *node, const char *addr) {
  printf("%-6s %-8s %-10s %-5s %-6s %-5s %s\n", uid, pid, role, rank, epoch, node, addr);
}

/* A live server as a row of keel ps: role server:I (what keel inject takes), no rank. */
static void ps_server_print(keel_store *store, int64_t index, const server_value *value,
                            void *context) {
  (void)context;
  if (!server_is_running(value)) return;
  char uid[16], pid[16], role[32], addr[80];
  snprintf(uid, sizeof uid, "%u", (unsigned)value->uid);
  snprintf(pid, sizeof pid, "%ld", (long)value->pid);
  snprintf(role, sizeof role, "server:%lld", (long long)index);
  server_address(store, index, addr, sizeof addr);
  ps_row_print(uid, pid, role, "-1", "-", "0", addr);
}

static void ps_print(keel_store *store, const keel_store_entry *entries, size_t count) {
  ps_row_print("UID", "PID", "ROLE", "RANK", "EPOCH", "NODE", "ADDR");
  for (size_t i = 0; i < count; i++) {
    uint32_t uid;
    keel__proc_value value;
    if (keel__uid_from_key(entries[i].key, "proc/", &uid) != KEEL_OK) continue;
    if (keel__proc_value_parse((const char *)entries[i].value, &value) != KEEL_OK) continue;
    if (uid_is_dead(store, uid)) continue;
    char uid_text[16], pid[16], rank[24], epoch[24], node[24];
    snprintf(uid_text, sizeof uid_text, "%u", (unsigned)uid);
    snprintf(pid, sizeof pid, "%ld", (long)value.pid);
    snprintf(rank, sizeof rank, "%lld", (long long)value.rank);
    snprintf(epoch, sizeof epoch, "%lld", (long long)value.epoch);
    snprintf(node, sizeof node, "%lld", (long long)value.node);
    ps_row_print(uid_text, pid, value.role, rank, epoch, node, value.addr[0] ? value.addr : "-");
  }
  servers_visit(store, ps_server_print, NULL);
}

int keel__command_ps(int argc, char **argv) {
  keel__job_info job;
  keel_store *store = NULL;
  int exit_code = job_command_connect("ps", argc, argv, &job, &store);
  if (exit_code != 0) return exit_code;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  keel_status status = keel_store_list(store, "proc/", &entries, &count, NULL);
  if (status == KEEL_OK) ps_print(store, entries, count);
  if (status != KEEL_OK) fprintf(stderr, "keel ps: cannot list proc/: %s\n", keel_strerror(status));
  keel_store_entries_free(entries, count);
  keel_store_close(store);
  return status == KEEL_OK ? 0 : KEEL__EXIT_FAILURE;
}

/* The processes of one node, "uid:rank" each (rank -1: a spare), for keel status. */
typedef struct node_processes {
  char text[256];
  size_t used;
} node_processes;

static bool process_describe(keel_store *store, const keel_store_entry *entry,
                             const keel__proc_value *value, void *context) {
  node_processes *list = context;
  uint32_t uid;
  if (keel__uid_from_key(entry->key, "proc/", &uid) != KEEL_OK || uid_is_dead(store, uid))
    return false;
  if (list->used < sizeof list->text)
    list->used +=
        (size_t)snprintf(list->text + list->used, sizeof list->text - list->used, "%s%u:%lld",
                         list->used ? " " : "", (unsigned)uid, (long long)value->rank);
  return true;
}

/* What the root decided about node (decision/node/<i>), "-" when nothing. */
static void node_decision(keel_store *store, long long node, char *text, size_t capacity) {
  char key[48];
  snprintf(key, sizeof key, "decision/node/%lld", node);
  keel_store_entry *entry = NULL;
  snprintf(text, capacity, "-");
  if (keel_store_get(store, key, &entry) != KEEL_OK) return;
  snprintf(text, capacity, "%s", (const char *)entry->value);
  keel_store_entry_free(entry);
}

/* The node's lease as "AGE/TTL": how long since the agent's last keepalive the store
 * counted, of the time to live (a node whose age nears its ttl is about to be declared
 * lost); "-" when the store cannot say. */
static void lease_describe(keel_store *store, int64_t lease, char *text, size_t capacity) {
  int64_t left = 0, ttl = 0;
  snprintf(text, capacity, "-");
  if (lease <= 0 || keel_store_lease_ttl(store, lease, &left, &ttl) != KEEL_OK) return;
  snprintf(text, capacity, "%.1f/%.1fs", (double)(ttl - left) / 1e9, (double)ttl / 1e9);
}

/* The node's last event but progress (event/node/<i>, put by its agent) as "NAME AGEs",
 * the age by this host's clock against the agent's; "-" when there is none. */
static void last_event_describe(keel_store *store, long long node, char *text, size_t capacity) {
  char key[48], name[40];
  snprintf(key, sizeof key, "event/node/%lld", node);
  snprintf(text, capacity, "-");
  keel_store_entry *entry = NULL;
  if (keel_store_get(store, key, &entry) != KEEL_OK) return;
  long long wall_ns = 0;
  if (sscanf((const char *)entry->value, "%39s %lld", name, &wall_ns) == 2)
    snprintf(text, capacity, "%s %.1fs", name, (double)(keel_wall_ns() - wall_ns) / 1e9);
  keel_store_entry_free(entry);
}

static void status_print(keel_store *store, const keel_store_entry *nodes, size_t count) {
  long long root = -1;
  keel_store_entry *entry = NULL;
  if (keel_store_get(store, "root", &entry) == KEEL_OK) {
    const char *at = strstr((const char *)entry->value, "node=");
    if (at != NULL) root = strtoll(at + 5, NULL, 10);
    keel_store_entry_free(entry);
  }
  printf("%-5s %-8s %-12s %-22s %-11s %-9s %-24s %s\n", "NODE", "AGENT", "ROLE", "ADDR", "LEASE",
         "DECISION", "LAST EVENT", "PROCESSES (uid:rank)");
  for (size_t i = 0; i < count; i++) {
    uint32_t node;
    keel__node_value value;
    if (keel__uid_from_key(nodes[i].key, "node/", &node) != KEEL_OK) continue;
    if (keel__node_value_parse((const char *)nodes[i].value, &value) != KEEL_OK) continue;
    node_processes list = {.used = 0};
    keel__node_processes_visit(store, node, process_describe, &list);
    char role[24], decision[16], lease[24], last_event[64];
    snprintf(role, sizeof role, "%s%s", value.role, (long long)node == root ? ",root" : "");
    node_decision(store, node, decision, sizeof decision);
    lease_describe(store, nodes[i].lease, lease, sizeof lease);
    last_event_describe(store, node, last_event, sizeof last_event);
    printf("%-5u %-8ld %-12s %-22s %-11s %-9s %-24s %s\n", (unsigned)node, (long)value.pid, role,
           value.addr, lease, decision, last_event, list.used ? list.text : "-");
  }
}

/* A server as a row of keel status, ended ones too: how it ended, and whether the clients
 * declared it lost (ec/lost/<i>: they route around it through the parity). */
static void status_server_print(keel_store *store, int64_t index, const server_value *value,
                                void *context) {
  bool *header_printed = context;
  if (!*header_printed) printf("%-10s %-6s %-8s %-16s %s\n", "ROLE", "UID", "PID", "STATE", "ADDR");
  *header_printed = true;
  char role[32], lost_key[48], state[48], addr[80];
  snprintf(role, sizeof role, "server:%lld", (long long)index);
  snprintf(lost_key, sizeof lost_key, "ec/lost/%lld", (long long)index);
  snprintf(state, sizeof state, "%s%s", value->status,
           keel__store_has(store, lost_key) ? ",lost" : "");
  server_address(store, index, addr, sizeof addr);
  printf("%-10s %-6u %-8ld %-16s %s\n", role, (unsigned)value->uid, (long)value->pid, state, addr);
}

int keel__command_status(int argc, char **argv) {
  keel__job_info job;
  keel_store *store = NULL;
  int exit_code = job_command_connect("status", argc, argv, &job, &store);
  if (exit_code != 0) return exit_code;
  keel_store_entry *entries = NULL;
  size_t count = 0;
  keel_status status = keel_store_list(store, "node/", &entries, &count, NULL);
  if (status == KEEL_OK && count == 0)
    printf("job %llu has no node agents (keel ps lists its processes)\n",
           (unsigned long long)job.auth.job_id);
  else if (status == KEEL_OK)
    status_print(store, entries, count);
  if (status != KEEL_OK)
    fprintf(stderr, "keel status: cannot list node/: %s\n", keel_strerror(status));
  bool header_printed = false;
  if (status == KEEL_OK) servers_visit(store, status_server_print, &header_printed);
  keel_store_entries_free(entries, count);
  keel_store_close(store);
  return status == KEEL_OK ? 0 : KEEL__EXIT_FAILURE;
}
