/* What `keel chaos` sees of a job from outside it: the lines of its events file as they are
 * written (spawns, exits, fences, recoveries, finishes), the live processes' fds, threads
 * and memory after each recovery from /proc, and what the job left behind once it ended. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "chaos.h"
#include "keel/core.h"
#include "netns.h"
#include "tool.h"

keel__chaos_process *keel__chaos_process_find(keel__chaos_run *run, uint32_t uid) {
  for (size_t i = run->process_count; i-- > 0;)
    if (run->processes[i].uid == uid && !run->processes[i].agent) return &run->processes[i];
  return NULL;
}

/* ---- /proc */

unsigned long long keel__chaos_start_ticks(pid_t pid) {
  char path[64], text[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  FILE *file = fopen(path, "r");
  if (file == NULL) return 0;
  size_t length = fread(text, 1, sizeof text - 1, file);
  fclose(file);
  text[length] = '\0';
  /* The name in parentheses may hold spaces: fields are counted after its last ')'. */
  char *field = strrchr(text, ')');
  if (field == NULL) return 0;
  unsigned long long ticks = 0;
  /* After ')': state (3), then fields 4..21, then starttime (22). */
  for (int index = 2; index < 22 && field != NULL; index++) field = strchr(field + 1, ' ');
  if (field == NULL || sscanf(field + 1, "%llu", &ticks) != 1) return 0;
  return ticks;
}

bool keel__chaos_process_alive(const keel__chaos_process *p) {
  if (p->start_ticks == 0) return false;
  char state = 0;
  int parent = 0;
  if (keel_process_stat(p->pid, &state, &parent) != KEEL_OK || state == 'Z') return false;
  return keel__chaos_start_ticks(p->pid) == p->start_ticks;
}

/* ---- a process's fds by what they are, to tell a leak from the slack (finding 45) */

/* Calls visit with what each of pid's fds is ("socket:[123]", "pipe:[4]", a path); false
 * when the process is gone. */
typedef void fd_visit(const char *target, void *context);
static bool fds_each(pid_t pid, fd_visit *visit, void *context) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/fd", (long)pid);
  DIR *folder = opendir(path);
  if (folder == NULL) return false;
  for (struct dirent *entry = readdir(folder); entry != NULL; entry = readdir(folder)) {
    if (entry->d_name[0] == '.') continue;
    char link[sizeof path + sizeof entry->d_name + 1], target[160];
    snprintf(link, sizeof link, "%s/%s", path, entry->d_name);
    ssize_t length = readlink(link, target, sizeof target - 1);
    if (length < 0) continue;
    target[length] = '\0';
    visit(target, context);
  }
  closedir(folder);
  return true;
}

/* One kind of fd and how many: "to 198.18.0.3:41000", "from 198.18.0.2", "listen", "pipe". */
typedef struct fd_kind {
  char name[48];
  int count;
} fd_kind;

#define FD_KINDS 48
#define TCP_LISTEN_STATE 0x0A

/* A TCP socket of the process, from its /proc/PID/net/tcp (its own network namespace). */
typedef struct tcp_socket {
  unsigned long inode;
  unsigned local_address, local_port, remote_port, remote_address, state;
} tcp_socket;

/* Room for a namespace's TCP table: the host's, on one host, holds every process's. */
#define MAX_TCP_TABLE 16384

static size_t tcp_sockets_read(pid_t pid, tcp_socket *sockets, size_t capacity) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%ld/net/tcp", (long)pid);
  FILE *file = fopen(path, "r");
  if (file == NULL) return 0;
  size_t count = 0;
  while (count < capacity && fgets(line, sizeof line, file) != NULL) {
    tcp_socket *socket = &sockets[count];
    /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
    if (sscanf(line, " %*u: %x:%x %x:%x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &socket->local_address,
               &socket->local_port, &socket->remote_address, &socket->remote_port, &socket->state,
               &socket->inode) == 6)
      count++;
  }
  fclose(file);
  return count;
}

static fd_kind *fd_kind_find(fd_kind *kinds, int used, const char *name) {
  for (int i = 0; i < used; i++)
    if (strcmp(kinds[i].name, name) == 0) return &kinds[i];
  return NULL;
}

/* Counts one fd of kind name; past the room for kinds (the last slot kept for it), under
 * "more kinds". */
static void fd_kind_add(fd_kind *kinds, int *used, const char *name) {
  fd_kind *kind = fd_kind_find(kinds, *used, name);
  if (kind == NULL && *used >= FD_KINDS - 1) {
    name = "more kinds";
    kind = fd_kind_find(kinds, *used, name);
  }
  if (kind == NULL) {
    kind = &kinds[(*used)++];
    snprintf(kind->name, sizeof kind->name, "%s", name);
    kind->count = 0;
  }
  kind->count++;
}

/* What a socket is: listening, accepted from an address (its local port one this process
 * listens on) or connected to an address and port (a peer's listener). */
static void socket_kind(const tcp_socket *sockets, size_t count, unsigned long inode, char *name,
                        size_t capacity) {
  snprintf(name, capacity, "socket");
  for (size_t i = 0; i < count; i++) {
    if (sockets[i].inode != inode) continue;
    unsigned a = sockets[i].remote_address; /* as the kernel prints it: little-endian */
    char address[24];
    snprintf(address, sizeof address, "%u.%u.%u.%u", a & 0xff, (a >> 8) & 0xff, (a >> 16) & 0xff,
             a >> 24);
    if (sockets[i].state == TCP_LISTEN_STATE) {
      snprintf(name, capacity, "listen");
      return;
    }
    bool accepted = false;
    for (size_t j = 0; j < count; j++)
      accepted |=
          sockets[j].state == TCP_LISTEN_STATE && sockets[j].local_port == sockets[i].local_port;
    if (accepted)
      snprintf(name, capacity, "from %s", address);
    else
      snprintf(name, capacity, "to %s:%u", address, sockets[i].remote_port);
    return;
  }
}

/* What keel__chaos_fd_kinds counts into. */
typedef struct fd_kinds_count {
  const tcp_socket *sockets;
  size_t socket_count;
  fd_kind *kinds;
  int used;
} fd_kinds_count;

static void fd_kind_count(const char *target, void *context) {
  fd_kinds_count *count = context;
  char name[48];
  unsigned long inode = 0;
  if (sscanf(target, "socket:[%lu]", &inode) == 1)
    socket_kind(count->sockets, count->socket_count, inode, name, sizeof name);
  else if (strncmp(target, "pipe:", 5) == 0)
    snprintf(name, sizeof name, "pipe");
  else if (strncmp(target, "anon_inode:", 11) == 0)
    snprintf(name, sizeof name, "%.40s", target + 11);
  else if (strncmp(target, "/dev/shm/", 9) == 0)
    snprintf(name, sizeof name, "shm");
  else
    snprintf(name, sizeof name, "file");
  fd_kind_add(count->kinds, &count->used, name);
}

void keel__chaos_fd_kinds(pid_t pid, char *text, size_t capacity) {
  text[0] = '\0';
  tcp_socket *sockets = malloc(sizeof *sockets * MAX_TCP_TABLE);
  fd_kind *kinds = malloc(sizeof *kinds * FD_KINDS);
  fd_kinds_count count = {.sockets = sockets, .kinds = kinds};
  if (sockets == NULL || kinds == NULL) goto free_buffers;
  count.socket_count = tcp_sockets_read(pid, sockets, MAX_TCP_TABLE);
  fds_each(pid, fd_kind_count, &count);
  int used = count.used;
  size_t at = 0;
  /* Most first: a selection, the list is short. */
  for (int done = 0; done < used && at < capacity; done++) {
    int best = done;
    for (int i = done + 1; i < used; i++)
      if (kinds[i].count > kinds[best].count) best = i;
    fd_kind swap = kinds[done];
    kinds[done] = kinds[best];
    kinds[best] = swap;
    int wrote = snprintf(text + at, capacity - at, "%s%s x%d", done ? ", " : "", kinds[done].name,
                         kinds[done].count);
    if (wrote < 0) break;
    at += (size_t)wrote;
  }
free_buffers:
  free(kinds);
  free(sockets);
}

/* Threads and VmRSS (KiB) from /proc/pid/status; false when the process is gone. */
static bool status_read(pid_t pid, long *threads_p, long *rss_kib_p) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
  FILE *file = fopen(path, "r");
  if (file == NULL) return false;
  *threads_p = *rss_kib_p = -1;
  while (fgets(line, sizeof line, file) != NULL) {
    sscanf(line, "Threads: %ld", threads_p);
    sscanf(line, "VmRSS: %ld", rss_kib_p);
  }
  fclose(file);
  return *threads_p >= 0 && *rss_kib_p >= 0;
}

/* ---- links to the job's live processes (finding 45) */

/* One end of a TCP connection, address and port as the kernel prints them. */
typedef struct link_end {
  unsigned address, port;
} link_end;

/* The local ends of the job's live processes' connections, read once per sample: where a
 * survivor's link to a live peer leads. */
struct keel__chaos_live_links {
  link_end *ends;
  size_t count, capacity;
};
typedef keel__chaos_live_links live_links;

#define MAX_PROCESS_SOCKETS 4096

/* A process's fds, counted, and the inodes of its sockets, at most capacity. */
typedef struct socket_inodes {
  unsigned long *inodes;
  size_t count, capacity;
  long fds;
} socket_inodes;

static void socket_inode_add(const char *target, void *context) {
  socket_inodes *sockets = context;
  sockets->fds++;
  if (sockets->count < sockets->capacity &&
      sscanf(target, "socket:[%lu]", &sockets->inodes[sockets->count]) == 1)
    sockets->count++;
}

/* pid's own connected TCP sockets: the entries of its network namespace's table whose inode
 * is one of its fds (the table lists every process's of the namespace). With fds_p, also how
 * many fds it has open, from the same walk (-1 when it is gone). */
static size_t process_connections(pid_t pid, tcp_socket *out, size_t capacity, long *fds_p) {
  unsigned long *inodes = malloc(sizeof *inodes * MAX_PROCESS_SOCKETS);
  tcp_socket *table = malloc(sizeof *table * MAX_TCP_TABLE);
  size_t count = 0;
  if (fds_p != NULL) *fds_p = -1;
  if (inodes == NULL || table == NULL) goto free_buffers;
  socket_inodes own = {.inodes = inodes, .capacity = MAX_PROCESS_SOCKETS};
  if (!fds_each(pid, socket_inode_add, &own)) goto free_buffers;
  if (fds_p != NULL) *fds_p = own.fds;
  size_t table_count = tcp_sockets_read(pid, table, MAX_TCP_TABLE);
  for (size_t i = 0; i < table_count && count < capacity; i++) {
    if (table[i].state == TCP_LISTEN_STATE) continue;
    for (size_t j = 0; j < own.count; j++)
      if (table[i].inode == own.inodes[j]) {
        out[count++] = table[i];
        break;
      }
  }
free_buffers:
  free(table);
  free(inodes);
  return count;
}

/* The connections of every live process of the job (agents too): their local ends are where
 * a survivor's link to a live peer leads. */
live_links *keel__chaos_live_links_read(const keel__chaos_run *run) {
  live_links *live = calloc(1, sizeof *live);
  if (live == NULL) return NULL;
  tcp_socket *sockets = malloc(sizeof *sockets * MAX_PROCESS_SOCKETS);
  if (sockets == NULL) return live;
  for (size_t i = 0; i < run->process_count; i++) {
    const keel__chaos_process *p = &run->processes[i];
    if (p->exited || !keel__chaos_process_alive(p)) continue;
    size_t count = process_connections(p->pid, sockets, MAX_PROCESS_SOCKETS, NULL);
    if (live->count + count > live->capacity) {
      size_t capacity = 2 * (live->count + count);
      link_end *more = realloc(live->ends, capacity * sizeof *more);
      if (more == NULL) break;
      live->ends = more;
      live->capacity = capacity;
    }
    for (size_t j = 0; j < count; j++)
      live->ends[live->count++] =
          (link_end){.address = sockets[j].local_address, .port = sockets[j].local_port};
  }
  free(sockets);
  return live;
}

void keel__chaos_live_links_free(live_links *live) {
  if (live == NULL) return;
  free(live->ends);
  free(live);
}

/* How many of a process's connections (own) lead to a live process of the job. */
static long links_to_live(const tcp_socket *own, size_t count, const live_links *live) {
  if (live == NULL) return 0;
  long linked = 0;
  for (size_t i = 0; i < count; i++) {
    for (size_t j = 0; j < live->count; j++) {
      if (live->ends[j].address == own[i].remote_address &&
          live->ends[j].port == own[i].remote_port) {
        linked++;
        break;
      }
    }
  }
  return linked;
}

/* Only rank holders and parameter servers are sampled: a spare that takes a rank opens its
 * links then, which is no leak. Its links to the job's live processes are not counted: how
 * many there are follows the membership (a node lost, a spare node or a rejoined one in its
 * place), which is no leak either, and a link that outlives its peer is still counted, so a
 * leaked link shows. (Counting one per live process instead, as until finding 45, read a
 * moment's lag of the links behind the membership as a rise.) */
void keel__chaos_process_sample(keel__chaos_process *p, const live_links *live) {
  if (p->exited || !(p->holds_rank || p->server) || !keel__chaos_process_alive(p)) return;
  char state = 0;
  int parent = 0;
  /* A stopped process (an injected stop) is about to be fenced: not a survivor. */
  if (keel_process_stat(p->pid, &state, &parent) != KEEL_OK || state == 'T' || state == 't') return;
  /* Its fds and its own links from one walk: a link that closed after `live` was read is
   * then neither counted nor taken off. (Counted from a walk of its own, a survivor whose
   * links to its peers closed meanwhile read up to a world's worth low: finding 55.) The
   * peers' ends in `live` are older, which at worst counts a link made since as not live. */
  tcp_socket *own = malloc(sizeof *own * MAX_PROCESS_SOCKETS);
  if (own == NULL) return;
  long fds = -1, threads, rss;
  size_t connections = process_connections(p->pid, own, MAX_PROCESS_SOCKETS, &fds);
  long linked = links_to_live(own, connections, live);
  free(own);
  if (fds < 0 || !status_read(p->pid, &threads, &rss)) return;
  /* Grown by doubling: a process lives through as many recoveries as the job has. */
  if ((p->samples & (p->samples - 1)) == 0) {
    size_t capacity = p->samples ? 2 * p->samples : 1;
    long *fds_more = realloc(p->fds, capacity * sizeof *fds_more);
    if (fds_more != NULL) p->fds = fds_more;
    long *threads_more = realloc(p->threads, capacity * sizeof *threads_more);
    if (threads_more != NULL) p->threads = threads_more;
    long *rss_more = realloc(p->rss_kib, capacity * sizeof *rss_more);
    if (rss_more != NULL) p->rss_kib = rss_more;
    if (fds_more == NULL || threads_more == NULL || rss_more == NULL) return;
  }
  p->fds[p->samples] = fds - linked;
  p->threads[p->samples] = threads;
  p->rss_kib[p->samples] = rss;
  /* Its fds by kind at its first sample and at its latest: what a rise is made of. */
  keel__chaos_fd_kinds(p->pid, p->samples == 0 ? p->fds_first : p->fds_last, sizeof p->fds_last);
  p->samples++;
}

void keel__chaos_run_clear(keel__chaos_run *run) {
  for (size_t i = 0; i < run->process_count; i++) {
    free(run->processes[i].fds);
    free(run->processes[i].threads);
    free(run->processes[i].rss_kib);
  }
  free(run->commits);
  run->commits = NULL;
  run->commit_count = run->commit_capacity = 0;
}

/* ---- events */

static void spawn_read(keel__chaos_run *run, json_t *event, bool agent) {
  if (run->process_count == KEEL__CHAOS_MAX_PROCESSES) return;
  keel__chaos_process *p = &run->processes[run->process_count++];
  *p = (keel__chaos_process){.uid = (uint32_t)keel__json_int_or(event, "uid", -1),
                             .pid = (pid_t)keel__json_int_or(event, "pid", 0),
                             .node = keel__json_int_or(event, "node", 0),
                             .spawn_ns = keel__json_int_or(event, "t_ns", 0),
                             .agent = agent};
  char role[16] = "";
  keel__json_string(event, "role", role, sizeof role);
  p->server = strcmp(role, "server") == 0;
  p->holds_rank = strcmp(role, "worker") == 0;
  if (p->pid > 0) p->start_ticks = keel__chaos_start_ticks(p->pid);
}

static void exit_read(keel__chaos_run *run, json_t *event) {
  keel__chaos_process *p =
      keel__chaos_process_find(run, (uint32_t)keel__json_int_or(event, "uid", -1));
  if (p == NULL) return;
  p->exited = true;
  char text[24] = "";
  int64_t code;
  if (keel__json_string(event, "signal", text, sizeof text))
    snprintf(p->ended, sizeof p->ended, "%s", text);
  else if (keel__json_int(event, "code", &code))
    snprintf(p->ended, sizeof p->ended, "code %" PRId64, code);
  /* A spare or joiner still waiting once ranks have finished is killed by its launcher after
   * a 2 s grace (docs/RUNTIME.md): the job's cleanup, not a death. Under sanitizers a spare
   * once took longer than that to read job/done, from an agent whose node held no rank and
   * so ended first (test_chaos_netns_etcd in a CI rehearsal). */
  bool idle = !p->server && keel__json_int_or(event, "rank", -1) < 0;
  bool cleaned_up = idle && run->finish_count > 0 && strcmp(p->ended, "SIGKILL") == 0;
  p->killed_at_end = run->ended || cleaned_up;
}

static void fence_read(keel__chaos_run *run, json_t *event) {
  keel__chaos_process *p =
      keel__chaos_process_find(run, (uint32_t)keel__json_int_or(event, "uid", -1));
  if (p != NULL) p->fenced = true;
}

bool keel__chaos_kind_lasts(keel__chaos_kind kind) {
  return kind == KEEL__CHAOS_LAUNCHER_STOP || kind == KEEL__CHAOS_PARTITION ||
         kind == KEEL__CHAOS_DELAY || kind == KEEL__CHAOS_ETCD_KILL ||
         kind == KEEL__CHAOS_ETCD_STOP;
}

int64_t keel__chaos_world_now(const keel__chaos_run *run, int64_t started_world) {
  return run->world > 0 && run->world < started_world ? run->world : started_world;
}

bool keel__chaos_failure_hit(const keel__chaos_failure *failure, uint32_t uid) {
  for (size_t i = 0; i < failure->victim_count; i++)
    if (failure->victims[i] == uid) return true;
  return false;
}

void keel__chaos_victim_add(keel__chaos_failure *failure, uint32_t uid) {
  if (keel__chaos_failure_hit(failure, uid)) return;
  if (failure->victim_count < KEEL__CHAOS_MAX_VICTIMS) {
    failure->victims[failure->victim_count++] = uid;
    return;
  }
  /* Left out, the process's death would read as one no failure explains: say why. */
  fprintf(stderr, "keel chaos: a failure hit more than %d processes; uid %u is not listed\n",
          KEEL__CHAOS_MAX_VICTIMS, (unsigned)uid);
}

/* The event's key, a duration in milliseconds, in nanoseconds within [0, a day]: the events
 * file is written by the job and may hold anything, and a double beyond int64's range has
 * no conversion. 0 for anything that is not a finite number. */
static int64_t json_ms_to_ns(const json_t *event, const char *key) {
  double ms = 0;
  if (!keel__json_double(event, key, &ms) || !(ms > 0)) return 0;
  return ms < 86400e3 ? (int64_t)(ms * 1e6) : (int64_t)86400e3 * 1000000;
}

/* The partition of node that explains a fence at t_ns after silent_ns without its lease: the
 * last one injected before the fence whose cut overlaps that silence. A lease request lost to
 * the cut is sent again by TCP only after its backoff, so a node may fence a little after its
 * link healed, which is the partition's doing. NULL when none: the fence is unexplained. */
static keel__chaos_failure *partition_of_fence(keel__chaos_failure *failures, size_t count,
                                               int64_t node, int64_t t_ns, int64_t silent_ns) {
  keel__chaos_failure *cause = NULL;
  for (size_t i = 0; i < count; i++) {
    keel__chaos_failure *f = &failures[i];
    if (!f->injected || f->kind != KEEL__CHAOS_PARTITION || f->node != node ||
        f->injected_ns > t_ns)
      continue;
    bool healed_before_silence = f->healed_ns > 0 && f->healed_ns + silent_ns < t_ns;
    if (!healed_before_silence) cause = f;
  }
  return cause;
}

/* The agent whose life on node spans t_ns: the last one spawned there before it. */
static const keel__chaos_process *agent_at(const keel__chaos_run *run, int64_t node, int64_t t_ns) {
  const keel__chaos_process *agent = NULL;
  for (size_t i = 0; i < run->process_count; i++) {
    const keel__chaos_process *p = &run->processes[i];
    if (p->agent && p->node == node && p->spawn_ns <= t_ns) agent = p;
  }
  return agent;
}

/* A node fenced itself (its agent killed its processes): those of the agent's life that had not
 * exited are victims of the partition that caused it, including one born after the heal. */
static void node_fence_read(keel__chaos_run *run, json_t *event, keel__chaos_failure *failures,
                            size_t count) {
  int64_t node = keel__json_int_or(event, "node", -1);
  int64_t t_ns = keel__json_int_or(event, "t_ns", 0);
  int64_t silent_ns = json_ms_to_ns(event, "silent_ms");
  keel__chaos_failure *cause = partition_of_fence(failures, count, node, t_ns, silent_ns);
  const keel__chaos_process *agent = agent_at(run, node, t_ns);
  if (cause == NULL || agent == NULL) return;
  for (size_t i = 0; i < run->process_count; i++) {
    const keel__chaos_process *p = &run->processes[i];
    if (!p->agent && !p->exited && p->node == node && p->spawn_ns >= agent->spawn_ns &&
        p->spawn_ns <= t_ns)
      keel__chaos_victim_add(cause, p->uid);
  }
}

/* The injected failure whose victim is uid and that no recovery has yet been matched to. */
static keel__chaos_failure *failure_of_victim(keel__chaos_failure *failures, size_t count,
                                              uint32_t uid, int64_t t_ns) {
  for (size_t i = 0; i < count; i++) {
    keel__chaos_failure *f = &failures[i];
    if (f->injected && keel__chaos_failure_hit(f, uid) && f->recover_ns < 0 &&
        f->injected_ns <= t_ns && (f->aftermath_end_ns == 0 || t_ns <= f->aftermath_end_ns))
      return f;
  }
  return NULL;
}

static void recovery_read(keel__chaos_run *run, json_t *event, keel__chaos_failure *failures,
                          size_t count) {
  static const char *const policies[] = {"shrink", "replace", "grow"};
  char policy[16] = "";
  keel__json_string(event, "policy", policy, sizeof policy);
  size_t which = 3;
  for (size_t i = 0; i < 3; i++)
    if (strcmp(policy, policies[i]) == 0) which = i;
  run->recoveries_by_policy[which]++;
  run->recovery_count++;
  int64_t world = keel__json_int_or(event, "new_world", 0);
  if (world > 0) run->world = world;
  run->redone_minibatches += keel__json_int_or(event, "redo_minibatches", 0);
  int64_t t_ns = keel__json_int_or(event, "t_ns", 0);
  int64_t detected = keel__json_int_or(event, "t_detect_ns", t_ns);
  int64_t failed[64];
  size_t failed_count = keel__json_int_array(event, "failed", failed, 64);
  /* A process may be hit twice (stopped, then killed while its recovery runs): the one
   * recovery ends both. */
  for (size_t i = 0; i < failed_count; i++) {
    keel__chaos_failure *f;
    while ((f = failure_of_victim(failures, count, (uint32_t)failed[i], t_ns)) != NULL) {
      f->detect_ns = detected > f->injected_ns ? detected - f->injected_ns : 0;
      f->recover_ns = t_ns - f->injected_ns;
    }
  }
  json_t *transfers = json_object_get(event, "transfers");
  for (size_t i = 0; json_is_array(transfers) && i < json_array_size(transfers); i++) {
    keel__chaos_process *p = keel__chaos_process_find(
        run, (uint32_t)keel__json_int_or(json_array_get(transfers, i), "to", -1));
    if (p != NULL) p->holds_rank = true;
  }
  keel__chaos_survivors_sample(run);
}

void keel__chaos_survivors_sample(keel__chaos_run *run) {
  live_links *live = keel__chaos_live_links_read(run);
  for (size_t i = 0; i < run->process_count; i++)
    keel__chaos_process_sample(&run->processes[i], live);
  keel__chaos_live_links_free(live);
  run->sampled_recoveries++;
}

/* --verify-replicas found replicas that differ (a bitflip): the failure that hit each is
 * detected and recovered from at once, and the job redoes up to every=N steps. */
static void mismatch_read(keel__chaos_run *run, json_t *event, keel__chaos_failure *failures,
                          size_t count) {
  int64_t t_ns = keel__json_int_or(event, "t_ns", 0);
  int64_t uids[64];
  size_t uid_count = keel__json_int_array(event, "uids", uids, 64);
  run->verified_redo_steps += keel__json_int_or(event, "redo_steps", 0);
  run->mismatches++;
  for (size_t i = 0; i < uid_count; i++) {
    keel__chaos_failure *f;
    while ((f = failure_of_victim(failures, count, (uint32_t)uids[i], t_ns)) != NULL)
      f->detect_ns = f->recover_ns = t_ns - f->injected_ns;
  }
}

/* The last moment before t_ns when a failure came or was undone (0: none). */
static int64_t failure_last_moment(const keel__chaos_failure *failures, size_t count,
                                   int64_t t_ns) {
  int64_t last = 0;
  for (size_t i = 0; i < count; i++) {
    const keel__chaos_failure *f = &failures[i];
    if (!f->injected || f->injected_ns > t_ns) continue;
    int64_t undone_ns = keel__chaos_kind_lasts(f->kind) ? f->injected_ns + f->hold_ns : 0;
    int64_t moment = undone_ns > f->injected_ns && undone_ns <= t_ns ? undone_ns : f->injected_ns;
    if (moment > last) last = moment;
  }
  return last;
}

/* Each rank reports progress every 100 ms or so while it trains: the stillness before this
 * line, counted from the previous line, the failure that came since, or the end of a declared
 * long section (keel_section_begin: the others wait past their deadline by design),
 * whichever is latest. */
static void progress_read(keel__chaos_run *run, json_t *event, const keel__chaos_failure *failures,
                          size_t count) {
  int64_t t_ns = keel__json_int_or(event, "t_ns", 0);
  if (!run->training) {
    run->training = true;
    run->training_ns = t_ns > 0 ? t_ns : keel_now_ns();
  } else if (t_ns > run->progress_last_ns) {
    int64_t since = run->progress_last_ns;
    int64_t failure = failure_last_moment(failures, count, t_ns);
    if (failure > since) since = failure;
    if (run->section_end_ns > since) since = run->section_end_ns;
    if (t_ns - since > run->still_longest_ns) {
      run->still_longest_ns = t_ns - since;
      run->still_end_ns = t_ns;
    }
  }
  if (t_ns > run->progress_last_ns) run->progress_last_ns = t_ns;
}

/* A `commits` line repeats its run from the first step: it replaces the run's last line. */
static void commits_append(keel__chaos_run *run, const keel__chaos_commits *line) {
  if (run->commit_count == run->commit_capacity) {
    size_t capacity = run->commit_capacity ? run->commit_capacity * 2 : 256;
    keel__chaos_commits *grown = realloc(run->commits, capacity * sizeof *grown);
    if (grown == NULL) return;
    run->commits = grown;
    run->commit_capacity = capacity;
  }
  run->commits[run->commit_count++] = *line;
}

static void commits_read(keel__chaos_run *run, json_t *event) {
  keel__chaos_commits line = {.uid = (uint32_t)keel__json_int_or(event, "uid", -1),
                              .number = (uint32_t)keel__json_int_or(event, "run", -1),
                              .epoch = keel__json_int_or(event, "run_epoch", -1),
                              .from = keel__json_int_or(event, "from", -1),
                              .to = keel__json_int_or(event, "to", -1)};
  if (line.epoch < 0 || line.from < 0 || line.to < line.from) return;
  /* The run's earlier line is among the last few: one per rank and second. */
  for (size_t i = run->commit_count; i-- > 0;) {
    keel__chaos_commits *known = &run->commits[i];
    if (known->held || known->uid != line.uid || known->number != line.number) continue;
    if (line.to > known->to) known->to = line.to;
    return;
  }
  commits_append(run, &line);
}

static void received_commit_read(keel__chaos_run *run, json_t *event) {
  int64_t step = keel__json_int_or(event, "step", -1);
  if (step < 0) return;
  keel__chaos_commits line = {.uid = (uint32_t)keel__json_int_or(event, "uid", -1),
                              .epoch = keel__json_int_or(event, "epoch", 0),
                              .from = step,
                              .to = step,
                              .held = true};
  commits_append(run, &line);
}

static void collective_timeout_read(keel__chaos_run *run, json_t *event) {
  int64_t ns = json_ms_to_ns(event, "timeout_ms");
  if (ns > run->collective_deadline_ns) run->collective_deadline_ns = ns;
}

static void wait_late_read(keel__chaos_run *run, json_t *event) {
  for (int kind = 0; kind < KEEL_WAIT_KIND_COUNT; kind++)
    run->waits_late[kind] += keel__json_int_or(event, keel_wait_kind_name((keel_wait_kind)kind), 0);
  int64_t worst_ns = json_ms_to_ns(event, "worst_ms");
  if (worst_ns <= run->wait_late_worst_ns) return;
  run->wait_late_worst_ns = worst_ns;
  if (!keel__json_string(event, "worst_kind", run->wait_late_worst_kind,
                         sizeof run->wait_late_worst_kind))
    run->wait_late_worst_kind[0] = '\0';
}

static void finish_read(keel__chaos_run *run, json_t *event) {
  if (run->finish_count == KEEL__CHAOS_MAX_FINISHES) return;
  keel__chaos_finish *f = &run->finishes[run->finish_count++];
  *f = (keel__chaos_finish){.uid = (uint32_t)keel__json_int_or(event, "uid", -1),
                            .rank = keel__json_int_or(event, "rank", -1),
                            .step = keel__json_int_or(event, "step", -1),
                            .world = keel__json_int_or(event, "world", -1),
                            .shard = keel__json_int_or(event, "shard", 0)};
  keel__json_string(event, "state_crc32c", f->crc, sizeof f->crc);
}

static void failure_event_read(keel__chaos_run *run, json_t *event) {
  char cause[32] = "";
  keel__json_string(event, "cause", cause, sizeof cause);
  if (strcmp(cause, "KEEL_ETIMEDOUT") == 0) run->timeouts++;
}

static void store_read(keel__chaos_run *run, json_t *event) {
  char when[16] = "";
  keel__json_string(event, "when", when, sizeof when);
  if (strcmp(when, "recovery") != 0 || run->store_key_count == KEEL__CHAOS_MAX_SAMPLES) return;
  /* The keys that do not follow the live processes (a replenished spare pool is bigger);
   * all keys from a launcher that does not say. */
  int64_t keys = keel__json_int_or(event, "keys", 0);
  run->store_keys[run->store_key_count++] = (long)keel__json_int_or(event, "residue", keys);
}

static void event_read(keel__chaos_run *run, json_t *event, keel__chaos_failure *failures,
                       size_t count) {
  char name[32] = "";
  if (!keel__json_string(event, "event", name, sizeof name)) return;
  if (strcmp(name, "progress") == 0) {
    progress_read(run, event, failures, count);
  } else if (strcmp(name, "commits") == 0) {
    commits_read(run, event);
  } else if (strcmp(name, "received_commit") == 0) {
    received_commit_read(run, event);
  } else if (strcmp(name, "collective_timeout") == 0) {
    collective_timeout_read(run, event);
  } else if (strcmp(name, "wait_late") == 0) {
    wait_late_read(run, event);
  } else if (strcmp(name, "section_end") == 0) {
    run->section_end_ns = keel__json_int_or(event, "t_ns", 0);
  } else if (strcmp(name, "spawn") == 0) {
    spawn_read(run, event, false);
  } else if (strcmp(name, "agent_spawn") == 0) {
    spawn_read(run, event, true);
  } else if (strcmp(name, "exit") == 0) {
    exit_read(run, event);
  } else if (strcmp(name, "fence") == 0) {
    fence_read(run, event);
  } else if (strcmp(name, "node_fence") == 0) {
    node_fence_read(run, event, failures, count);
  } else if (strcmp(name, "recovery") == 0) {
    recovery_read(run, event, failures, count);
  } else if (strcmp(name, "replica_mismatch") == 0) {
    mismatch_read(run, event, failures, count);
  } else if (strcmp(name, "finish") == 0) {
    finish_read(run, event);
  } else if (strcmp(name, "failure") == 0) {
    failure_event_read(run, event);
  } else if (strcmp(name, "store") == 0) {
    store_read(run, event);
  } else if (strcmp(name, "job_end") == 0) {
    run->ended = true;
    run->job_end_code = keel__json_int_or(event, "code", -1);
  }
}

void keel__chaos_events_read(keel__chaos_run *run, keel__chaos_failure *failures, size_t count) {
  if (run->events == NULL) return;
  int c;
  clearerr(run->events);
  while ((c = getc(run->events)) != EOF) {
    if (c != '\n') {
      /* A line longer than the buffer is no event of interest: its tail is dropped. */
      if (run->line_length + 1 < sizeof run->line) run->line[run->line_length++] = (char)c;
      continue;
    }
    json_t *event = keel__json_object_parse(run->line, run->line_length);
    run->line_length = 0;
    if (event == NULL) continue;
    event_read(run, event, failures, count);
    json_decref(event);
  }
}

/* ---- the steps committed */

/* Beyond this many steps between the first and the last, the count is not made (4 bytes a
 * step and two more). */
#define STEPS_COUNTED_MAX ((int64_t)1 << 24)

static int commits_order(const void *a, const void *b) {
  const keel__chaos_commits *left = a, *right = b;
  if (left->epoch != right->epoch) return left->epoch < right->epoch ? -1 : 1;
  if (left->uid != right->uid) return left->uid < right->uid ? -1 : 1;
  return 0;
}

/* One process's commits of each step in one epoch: more than one is a roll-back (a replica
 * verification) that redid those steps. The epoch's count of a step is its most by any one
 * rank, since every rank commits every step once. */
static void process_counted(const keel__chaos_commits *runs, size_t count, int64_t first,
                            uint16_t *process, uint16_t *epoch) {
  for (size_t i = 0; i < count; i++)
    for (int64_t s = runs[i].from; s <= runs[i].to; s++) process[s - first]++;
  for (size_t i = 0; i < count; i++)
    for (int64_t s = runs[i].from; s <= runs[i].to; s++) {
      if (process[s - first] > epoch[s - first]) epoch[s - first] = process[s - first];
      process[s - first] = 0;
    }
}

static void times_counted(keel__chaos_commits *runs, size_t count, int64_t first, int32_t *times,
                          uint16_t *process, uint16_t *epoch) {
  qsort(runs, count, sizeof *runs, commits_order);
  for (size_t start = 0; start < count;) {
    size_t end = start;
    int64_t low = runs[start].from, high = runs[start].to;
    while (end < count && runs[end].epoch == runs[start].epoch) {
      size_t uid_end = end;
      while (uid_end < count && runs[uid_end].epoch == runs[end].epoch &&
             runs[uid_end].uid == runs[end].uid) {
        if (runs[uid_end].from < low) low = runs[uid_end].from;
        if (runs[uid_end].to > high) high = runs[uid_end].to;
        uid_end++;
      }
      process_counted(&runs[end], uid_end - end, first, process, epoch);
      end = uid_end;
    }
    for (int64_t s = low; s <= high; s++) {
      times[s - first] += epoch[s - first];
      epoch[s - first] = 0;
    }
    start = end;
  }
}

/* The committed runs (not the held steps) copied into runs; their count. */
static size_t committed_copy(const keel__chaos_run *run, keel__chaos_commits *runs) {
  size_t count = 0;
  for (size_t i = 0; i < run->commit_count; i++)
    if (!run->commits[i].held) runs[count++] = run->commits[i];
  return count;
}

/* Steps no committer said but a receiver of their state did: committed, their record lost
 * with every process that committed them (finding 43). They count once, as a step. */
static void held_mark(const keel__chaos_run *run, int64_t first, int64_t last, int32_t *times,
                      keel__chaos_steps *steps) {
  for (size_t i = 0; i < run->commit_count; i++) {
    const keel__chaos_commits *held = &run->commits[i];
    if (!held->held || held->from < first || held->from > last) continue;
    if (times[held->from - first] != 0) continue;
    times[held->from - first] = 1;
    steps->held_only++;
  }
}

void keel__chaos_steps_count(const keel__chaos_run *run, keel__chaos_steps *steps) {
  *steps = (keel__chaos_steps){.first_skipped = -1, .most_redone = -1};
  keel__chaos_commits *runs = malloc((run->commit_count ? run->commit_count : 1) * sizeof *runs);
  if (runs == NULL) return;
  size_t count = committed_copy(run, runs);
  if (count == 0) {
    free(runs);
    return;
  }
  int64_t first = runs[0].from, last = runs[0].to;
  for (size_t i = 1; i < count; i++) {
    if (runs[i].from < first) first = runs[i].from;
    if (runs[i].to > last) last = runs[i].to;
  }
  size_t span = (size_t)(last - first + 1);
  int32_t *times = NULL;
  uint16_t *process = NULL, *epoch = NULL;
  if (last - first + 1 <= STEPS_COUNTED_MAX) {
    times = calloc(span, sizeof *times);
    process = calloc(span, sizeof *process);
    epoch = calloc(span, sizeof *epoch);
  }
  if (times != NULL && process != NULL && epoch != NULL) {
    times_counted(runs, count, first, times, process, epoch);
    held_mark(run, first, last, times, steps);
    steps->known = true;
    steps->first = first;
    steps->last = last;
    for (size_t i = 0; i < span; i++) {
      if (times[i] == 0 && steps->skipped++ == 0) steps->first_skipped = first + (int64_t)i;
      if (times[i] > 1) steps->redone += times[i] - 1;
      if (times[i] > 1 && times[i] > steps->most_redone_times) {
        steps->most_redone = first + (int64_t)i;
        steps->most_redone_times = times[i];
      }
    }
  }
  free(epoch);
  free(process);
  free(times);
  free(runs);
}

/* ---- after the job */

static bool name_is_of_job(const char *name, uint64_t job_id) {
  char hex[40], decimal[40];
  snprintf(hex, sizeof hex, "keel-%" PRIx64 "-", job_id);
  snprintf(decimal, sizeof decimal, "keel-%" PRIu64, job_id);
  return strncmp(name, hex, strlen(hex)) == 0 || strcmp(name, decimal) == 0;
}

static void leak_note(keel__chaos_leaks *leaks, const char *what) {
  if (leaks->first[0] == '\0') snprintf(leaks->first, sizeof leaks->first, "%s", what);
}

void keel__chaos_leaks_count(const keel__chaos_run *run, uint64_t job_id, pid_t launcher,
                             keel__chaos_leaks *leaks) {
  *leaks = (keel__chaos_leaks){0};
  char what[320];
  for (size_t i = 0; i < run->process_count; i++) {
    const keel__chaos_process *p = &run->processes[i];
    if (!keel__chaos_process_alive(p)) continue;
    leaks->processes++;
    snprintf(what, sizeof what, "%s uid %u (pid %ld)", p->agent ? "agent" : "process",
             (unsigned)p->uid, (long)p->pid);
    leak_note(leaks, what);
  }
  DIR *folder = opendir("/dev/shm");
  for (struct dirent *entry = folder ? readdir(folder) : NULL; entry != NULL;
       entry = readdir(folder)) {
    if (!name_is_of_job(entry->d_name, job_id)) continue;
    leaks->shm++;
    snprintf(what, sizeof what, "/dev/shm/%s", entry->d_name);
    leak_note(leaks, what);
  }
  if (folder != NULL) closedir(folder);
  snprintf(what, sizeof what, "/tmp/keel-%u/%" PRIu64 ".job", (unsigned)getuid(), job_id);
  if (access(what, F_OK) == 0) {
    leaks->job_files++;
    leak_note(leaks, what);
  }
  leaks->networks = keel__netns_owned_count(launcher, what, sizeof what);
  if (leaks->networks > 0) leak_note(leaks, what);
}

void keel__chaos_processes_kill(const keel__chaos_run *run) {
  for (size_t i = 0; i < run->process_count; i++)
    if (keel__chaos_process_alive(&run->processes[i])) kill(run->processes[i].pid, SIGKILL);
}
