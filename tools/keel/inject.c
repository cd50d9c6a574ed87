/* `keel inject`, `keel ps` and `keel status`: tools that join a running job's store (found
 * through its job file) to list its live processes and nodes or to make a failure happen to
 * one rank or node, the same failure a test or a user would cause by hand. */
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
          "keel inject: %s (usage: keel inject kill|stop|cont RANK |"
          " kill-node|partition|heal NODE | delay NODE DURATION [--job JOB_ID])\n",
          message);
  return KEEL__EXIT_USAGE;
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
  if (!pid_is_of_job(value.pid, job->launcher_pid)) {
    fprintf(stderr, "keel inject: pid %ld of rank %lld is not a process of job %llu\n",
            (long)value.pid, (long long)rank, (unsigned long long)job->auth.job_id);
    return KEEL__EXIT_FAILURE;
  }
  if (kill(value.pid, action->signal_number) != 0) {
    fprintf(stderr, "keel inject: %s pid %ld: %s\n", action->name, (long)value.pid,
            strerror(errno));
    return KEEL__EXIT_FAILURE;
  }
  printf("%s rank %lld (uid %u, pid %ld)\n", action->done, (long long)rank, (unsigned)uid,
         (long)value.pid);
  return 0;
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
    return inject_usage("the action must be kill, stop, cont, kill-node, partition, heal or delay");
  int64_t rank;
  if (keel_parse_int(rank_text, 0, INT32_MAX, &rank) != KEEL_OK)
    return inject_usage("RANK must be a non-negative integer");
  keel__job_info job;
  keel_store *store = NULL;
  if (keel__job_connect(job_id, &job, &store) != KEEL_OK) return KEEL__EXIT_FAILURE;
  int exit_code = kill_node     ? inject_kill_node(store, &job, rank)
                  : delay       ? inject_delay(store, &job, rank, delay_ns)
                  : node_action ? inject_link(&job, rank, partition)
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

static void ps_print(keel_store *store, const keel_store_entry *entries, size_t count) {
  printf("%-6s %-8s %-7s %-5s %-6s %-5s %s\n", "UID", "PID", "ROLE", "RANK", "EPOCH", "NODE",
         "ADDR");
  for (size_t i = 0; i < count; i++) {
    uint32_t uid;
    keel__proc_value value;
    if (keel__uid_from_key(entries[i].key, "proc/", &uid) != KEEL_OK) continue;
    if (keel__proc_value_parse((const char *)entries[i].value, &value) != KEEL_OK) continue;
    if (uid_is_dead(store, uid)) continue;
    printf("%-6u %-8ld %-7s %-5lld %-6lld %-5lld %s\n", (unsigned)uid, (long)value.pid, value.role,
           (long long)value.rank, (long long)value.epoch, (long long)value.node,
           value.addr[0] ? value.addr : "-");
  }
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
  keel_store_entries_free(entries, count);
  keel_store_close(store);
  return status == KEEL_OK ? 0 : KEEL__EXIT_FAILURE;
}
