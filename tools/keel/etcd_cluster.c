/* etcd clusters that keel starts itself (etcd_cluster.h), for `keel chaos --etcd` and the
 * tests. Members run in process groups of their own, die with the thread that started them,
 * and are watched over plain HTTP on their client ports: polling starts no processes and
 * needs no library above keel_core. */
#include "etcd_cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Short raft timings: a killed leader is replaced in about a second (an election timeout
 * plus a round), and etcd's minimum lease TTL, 1.5 election timeouts, stays at 1 s. */
#define HEARTBEAT_MS "50"
#define ELECTION_MS "500"
/* A start that lost a port to another process between our probe and etcd's bind. */
#define START_ATTEMPTS 3
#define POLL_MS 20
/* One HTTP request to a member: a stopped member accepts the connection, never replies. */
#define REQUEST_MS 300
#define SIGNAL_WAIT_MS 1000
#define REAP_MS 5000
/* The fds a member's child closes before exec (the caller's, above stderr). */
#define CHILD_MAX_FD 4096
#define CTL_MAX_ARGS 48
/* Short enough that every path under it fits the fixed buffers. */
#define FOLDER_MAX 256

typedef struct etcd_member {
  pid_t pid;      /* 0 while killed */
  int time_scale; /* the cluster's */
  bool stopped;
  uint64_t id; /* raft member id, learned from the member's own status */
  int client_port;
  int peer_port;
  char name[16];
  char address[32]; /* client_host:client_port */
  char data_dir[FOLDER_MAX + 32];
  char log_path[FOLDER_MAX + 32];
} etcd_member;

struct keel__etcd_cluster {
  int members;
  int time_scale;      /* every wait stretches this many times */
  char etcd[PATH_MAX]; /* the etcd program */
  char parent[FOLDER_MAX];
  char client_host[INET_ADDRSTRLEN]; /* where clients reach it (it listens on 127.0.0.1 too) */
  char folder[FOLDER_MAX];
  char token[80];
  char initial_cluster[KEEL__ETCD_MAX_MEMBERS * 48];
  char endpoint[16 + KEEL__ETCD_MAX_MEMBERS * 32];
  etcd_member member[KEEL__ETCD_MAX_MEMBERS];
};

static int64_t now_ms(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* Every wait stretches with the caller's time scale (a sanitizer build's slowdown). */
static int64_t deadline_after(int time_scale, int timeout_ms) {
  return now_ms() + (int64_t)timeout_ms * time_scale;
}

static void pause_ms(int milliseconds) {
  struct timespec pause = {milliseconds / 1000, (long)(milliseconds % 1000) * 1000000};
  nanosleep(&pause, NULL);
}

/* A reason or an output for the caller: nothing when it passed no buffer. */
static void format_into(char *buffer, size_t capacity, const char *format, ...) {
  if (buffer == NULL || capacity == 0) return;
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(buffer, capacity, format, arguments);
  va_end(arguments);
}

/* Appends to a NUL-terminated string; false when it did not fit. */
static bool append(char *buffer, size_t capacity, const char *format, ...) {
  size_t length = strlen(buffer);
  va_list arguments;
  va_start(arguments, format);
  int added = vsnprintf(buffer + length, capacity - length, format, arguments);
  va_end(arguments);
  return added >= 0 && (size_t)added < capacity - length;
}

/* The first capacity-1 bytes of a small file (a /proc entry), NUL-terminated. */
static bool read_start(const char *path, char *text, size_t capacity) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t got = read(fd, text, capacity - 1);
  close(fd);
  if (got <= 0) return false;
  text[got] = '\0';
  return true;
}

/* A whole file (a member's log) in a malloc'ed NUL-terminated string; NULL if unreadable. */
static char *read_all(const char *path) {
  FILE *file = fopen(path, "re");
  if (file == NULL) return NULL;
  size_t length = 0, capacity = 4096;
  char *text = malloc(capacity);
  size_t got;
  while (text != NULL && (got = fread(text + length, 1, capacity - 1 - length, file)) > 0) {
    length += got;
    if (length + 1 < capacity) continue;
    char *grown = realloc(text, capacity * 2);
    if (grown == NULL) free(text);
    text = grown;
    capacity *= 2;
  }
  fclose(file);
  if (text != NULL) text[length] = '\0';
  return text;
}

/* Copies a log to stderr under a "--- what (path):" line, when it has any text. */
static void print_log(const char *what, const char *path) {
  char *text = read_all(path);
  if (text != NULL && text[0] != '\0') fprintf(stderr, "--- %s (%s):\n%s\n", what, path, text);
  free(text);
}

/* Starts argv[0] (a path) in a process group of its own, its output appended to log_path
 * and its stdin /dev/null, SIGKILLed if the calling thread ends first. Returns its pid, or
 * -1 with errno. */
static pid_t spawn_logged(char *const argv[], const char *log_path) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  /* The child: only async-signal-safe calls until exec. */
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  int input = open("/dev/null", O_RDONLY);
  int output = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (input < 0 || output < 0) _exit(127);
  dup2(input, STDIN_FILENO);
  dup2(output, STDOUT_FILENO);
  dup2(output, STDERR_FILENO);
  /* Nothing of the caller's (a job's sockets, its events file) lives on in the member. */
  for (int fd = STDERR_FILENO + 1; fd < CHILD_MAX_FD; fd++) close(fd);
  execv(argv[0], argv);
  _exit(127);
}

/* Reaps pid, polling until the deadline (ms on now_ms's clock); false if it is still there. */
static bool reap_within(pid_t pid, int64_t deadline) {
  for (;;) {
    pid_t reaped = waitpid(pid, NULL, WNOHANG);
    if (reaped == pid || (reaped < 0 && errno != EINTR)) return true;
    if (now_ms() >= deadline) return false;
    pause_ms(2);
  }
}

/* spawn_logged execs a path, not a name: hence the search. */
bool keel__etcd_program_find(const char *name, const char *override, char *path, size_t capacity) {
  const char *chosen = getenv(override);
  if (chosen != NULL && *chosen != '\0') {
    int length = snprintf(path, capacity, "%s", chosen);
    return length > 0 && (size_t)length < capacity && access(path, X_OK) == 0;
  }
  const char *search = getenv("PATH");
  char folders[4096];
  snprintf(folders, sizeof folders, "%s:/usr/bin", search ? search : "");
  char *save = NULL;
  for (char *folder = strtok_r(folders, ":", &save); folder; folder = strtok_r(NULL, ":", &save)) {
    int length = snprintf(path, capacity, "%s/%s", folder, name);
    if (length > 0 && (size_t)length < capacity && access(path, X_OK) == 0) return true;
  }
  return false;
}

static bool valid_member(const keel__etcd_cluster *cluster, int member) {
  return cluster != NULL && member >= 0 && member < cluster->members;
}

/* ---- ports and layout ---- */

/* Picks count distinct free ports on 127.0.0.1: each is bound to port 0 and read back, all
 * held until the last is chosen so that none repeats, then closed. Another process may
 * still take one before etcd binds it; the start is retried for that. */
static bool pick_ports(int *ports, int count) {
  int sockets[2 * KEEL__ETCD_MAX_MEMBERS];
  int opened = 0;
  bool picked = true;
  while (picked && opened < count) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockets[opened++] = fd;
    struct sockaddr_in address = {.sin_family = AF_INET};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    picked = bind(fd, (struct sockaddr *)&address, sizeof address) == 0 &&
             getsockname(fd, (struct sockaddr *)&address, &length) == 0;
    ports[opened - 1] = ntohs(address.sin_port);
  }
  for (int i = 0; i < opened; i++) close(sockets[i]);
  return picked && opened == count;
}

/* Fills in a fresh folder, ports, names and the shared flags for one start attempt. */
static bool lay_out(keel__etcd_cluster *cluster, int attempt, char *reason, size_t capacity) {
  char folder[sizeof cluster->folder];
  int length = snprintf(folder, sizeof folder, "%s/etcd-XXXXXX", cluster->parent);
  if (length < 0 || (size_t)length >= sizeof folder) {
    format_into(reason, capacity, "the folder's path is too long: %s", cluster->parent);
    return false;
  }
  if (mkdtemp(folder) == NULL) {
    format_into(reason, capacity, "cannot make a folder for etcd in %s: %s", cluster->parent,
                strerror(errno));
    return false;
  }
  snprintf(cluster->folder, sizeof cluster->folder, "%s", folder);
  int ports[2 * KEEL__ETCD_MAX_MEMBERS];
  if (!pick_ports(ports, 2 * cluster->members)) {
    format_into(reason, capacity, "cannot find free ports on 127.0.0.1: %s", strerror(errno));
    return false;
  }
  /* A token of its own keeps members of another test's cluster from ever joining this one. */
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  snprintf(cluster->token, sizeof cluster->token, "keel-test-%ld-%lld%09ld-%d", (long)getpid(),
           (long long)now.tv_sec, now.tv_nsec, attempt);
  cluster->initial_cluster[0] = '\0';
  snprintf(cluster->endpoint, sizeof cluster->endpoint, "etcd://");
  for (int i = 0; i < cluster->members; i++) {
    etcd_member *member = &cluster->member[i];
    *member = (etcd_member){.time_scale = cluster->time_scale,
                            .client_port = ports[2 * i],
                            .peer_port = ports[2 * i + 1]};
    /* From locals, not from the cluster's own fields: gcc's -Wrestrict (without -O) takes
     * two fields of one struct for an overlap. */
    char name[16];
    snprintf(name, sizeof name, "m%d", i);
    snprintf(member->name, sizeof member->name, "%s", name);
    snprintf(member->address, sizeof member->address, "%s:%d", cluster->client_host,
             member->client_port);
    snprintf(member->data_dir, sizeof member->data_dir, "%s/%s", folder, name);
    snprintf(member->log_path, sizeof member->log_path, "%s/%s.log", folder, name);
    const char *comma = i > 0 ? "," : "";
    append(cluster->initial_cluster, sizeof cluster->initial_cluster, "%s%s=http://127.0.0.1:%d",
           comma, name, member->peer_port);
    append(cluster->endpoint, sizeof cluster->endpoint, "%s%s", comma, member->address);
  }
  return true;
}

/* Starts one member; state is "new" for the first start, "existing" for a restart on the
 * data dir it already has. Its output is appended to its log, across restarts. */
static bool spawn_member(keel__etcd_cluster *cluster, int index, const char *state) {
  etcd_member *member = &cluster->member[index];
  char client_url[48], listen_urls[96], peer_url[48];
  snprintf(client_url, sizeof client_url, "http://%s", member->address);
  /* Its own checks (health, leader) go to 127.0.0.1; clients to the address it advertises. */
  if (strcmp(cluster->client_host, "127.0.0.1") == 0)
    snprintf(listen_urls, sizeof listen_urls, "%s", client_url);
  else
    snprintf(listen_urls, sizeof listen_urls, "http://127.0.0.1:%d,%s", member->client_port,
             client_url);
  snprintf(peer_url, sizeof peer_url, "http://127.0.0.1:%d", member->peer_port);
  char *const argv[] = {cluster->etcd,
                        "--name",
                        member->name,
                        "--data-dir",
                        member->data_dir,
                        "--listen-client-urls",
                        listen_urls,
                        "--advertise-client-urls",
                        client_url,
                        "--listen-peer-urls",
                        peer_url,
                        "--initial-advertise-peer-urls",
                        peer_url,
                        "--initial-cluster",
                        cluster->initial_cluster,
                        "--initial-cluster-state",
                        (char *)state,
                        "--initial-cluster-token",
                        cluster->token,
                        "--unsafe-no-fsync",
                        "--heartbeat-interval",
                        HEARTBEAT_MS,
                        "--election-timeout",
                        ELECTION_MS,
                        NULL};
  pid_t pid = spawn_logged(argv, member->log_path);
  if (pid <= 0) return false;
  member->pid = pid;
  member->stopped = false;
  return true;
}

/* ---- HTTP on a member's client port ---- */

/* Waits until fd is ready for events or the deadline passes. */
static bool wait_socket(int fd, short events, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return false;
    struct pollfd entry = {.fd = fd, .events = events};
    int ready = poll(&entry, 1, (int)left);
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
  }
}

static bool connect_by(int fd, int port, int64_t deadline) {
  struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&address, sizeof address) == 0) return true;
  if (errno != EINPROGRESS || !wait_socket(fd, POLLOUT, deadline)) return false;
  int error = 0;
  socklen_t length = sizeof error;
  return getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
}

static bool send_all(int fd, const char *text, int64_t deadline) {
  size_t left = strlen(text);
  while (left > 0) {
    ssize_t sent = send(fd, text, left, MSG_NOSIGNAL);
    if (sent > 0) {
      text += sent;
      left -= (size_t)sent;
    } else if (sent < 0 && errno != EAGAIN && errno != EINTR) {
      return false;
    } else if (!wait_socket(fd, POLLOUT, deadline)) {
      return false;
    }
  }
  return true;
}

/* Reads until the member closes the connection (HTTP/1.0), keeping what fits. */
static bool receive_all(int fd, int64_t deadline, char *response, size_t capacity) {
  size_t length = 0;
  char chunk[1024];
  for (;;) {
    ssize_t got = recv(fd, chunk, sizeof chunk, 0);
    if (got == 0) break;
    if (got > 0) {
      size_t keep = (size_t)got < capacity - 1 - length ? (size_t)got : capacity - 1 - length;
      memcpy(response + length, chunk, keep);
      length += keep;
    } else if (errno != EAGAIN && errno != EINTR) {
      return false;
    } else if (!wait_socket(fd, POLLIN, deadline)) {
      return false;
    }
  }
  response[length] = '\0';
  return true;
}

/* Sends one request and returns the body of a 200 response in body; false when the member
 * refuses, errs or does not answer within REQUEST_MS. */
static bool http_request(const etcd_member *member, const char *request, char *body,
                         size_t capacity) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int64_t deadline = deadline_after(member->time_scale, REQUEST_MS);
  char response[4096];
  bool answered = connect_by(fd, member->client_port, deadline) &&
                  send_all(fd, request, deadline) &&
                  receive_all(fd, deadline, response, sizeof response);
  close(fd);
  if (!answered) return false;
  const char *status = strchr(response, ' ');
  if (strncmp(response, "HTTP/1.", 7) != 0 || status == NULL || strncmp(status, " 200 ", 5) != 0) {
    return false;
  }
  const char *start = strstr(response, "\r\n\r\n");
  if (start == NULL) return false;
  snprintf(body, capacity, "%s", start + 4);
  return true;
}

/* /health says "true" only when the member has a leader and a quorum read succeeds. */
static bool member_healthy(const etcd_member *member) {
  char body[256];
  return http_request(member, "GET /health HTTP/1.0\r\n\r\n", body, sizeof body) &&
         strstr(body, "\"health\":\"true\"") != NULL;
}

/* The unsigned number after "name": in JSON text, quoted or not (etcd's gateway writes
 * 64-bit integers as strings); 0 when absent. The replies are etcd's, of a known shape,
 * and the harness links no JSON library: tests of keel_core link only keel_core. */
static uint64_t json_number(const char *text, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "\"%s\":", name);
  const char *at = strstr(text, key);
  if (at == NULL) return 0;
  at += strlen(key);
  while (*at == ' ' || *at == '"') at++;
  return strtoull(at, NULL, 10);
}

/* Asks a member for its status (the gateway of Maintenance.Status): records its raft id and
 * returns the leader it knows (0: none) in *leader_p; false if it did not answer. */
static bool member_status(etcd_member *member, uint64_t *leader_p) {
  static const char request[] =
      "POST /v3/maintenance/status HTTP/1.0\r\n"
      "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
  char body[1024];
  if (!http_request(member, request, body, sizeof body)) return false;
  uint64_t id = json_number(body, "member_id");
  if (id == 0) return false;
  member->id = id;
  *leader_p = json_number(body, "leader");
  return true;
}

/* ---- processes ---- */

/* Whether a member runs; one that exited by itself (a bad flag, a port taken) is reaped
 * here and marked as killed. */
static bool member_alive(etcd_member *member) {
  if (member->pid <= 0) return false;
  if (waitpid(member->pid, NULL, WNOHANG) == 0) return true;
  member->pid = 0;
  member->stopped = false;
  return false;
}

/* SIGKILLs the member's process group and reaps it. SIGKILL ends a stopped process too; the
 * SIGCONT before it only makes sure that nothing is left frozen if the kill went astray. */
static void end_member(etcd_member *member) {
  if (member->pid <= 0) return;
  if (member->stopped) kill(member->pid, SIGCONT);
  kill(-member->pid, SIGKILL);
  kill(member->pid, SIGKILL);
  reap_within(member->pid, deadline_after(member->time_scale, REAP_MS));
  member->pid = 0;
  member->stopped = false;
}

static char process_state(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  char text[1024];
  if (!read_start(path, text, sizeof text)) return 0;
  /* "pid (comm) S ...": comm may hold spaces and parentheses, the last ')' ends it. */
  const char *end = strrchr(text, ')');
  return end != NULL && end[1] == ' ' ? end[2] : 0;
}

/* Polls /proc until the process is stopped ('T') or not, as wanted, for a bounded time. */
static bool wait_stopped(const etcd_member *member, bool stopped) {
  pid_t pid = member->pid;
  int64_t deadline = deadline_after(member->time_scale, SIGNAL_WAIT_MS);
  while ((process_state(pid) == 'T') != stopped) {
    if (now_ms() >= deadline) return false;
    pause_ms(2);
  }
  return true;
}

static int remove_entry(const char *path, const struct stat *info, int type, struct FTW *walk) {
  /* Keep walking past what cannot be removed: the rest still goes. */
  remove(path);
  return 0;
}

static void remove_folder(keel__etcd_cluster *cluster) {
  if (cluster->folder[0] == '\0') return;
  nftw(cluster->folder, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  cluster->folder[0] = '\0';
}

/* Ends every member and removes the folder: what a failed attempt leaves and destroy does. */
static void tear_down(keel__etcd_cluster *cluster) {
  for (int i = 0; i < cluster->members; i++) end_member(&cluster->member[i]);
  remove_folder(cluster);
}

/* ---- start ---- */

static bool logs_mention(const keel__etcd_cluster *cluster, const char *needle) {
  bool found = false;
  for (int i = 0; i < cluster->members && !found; i++) {
    char *text = read_all(cluster->member[i].log_path);
    found = text != NULL && strstr(text, needle) != NULL;
    free(text);
  }
  return found;
}

static int exited_member(keel__etcd_cluster *cluster) {
  for (int i = 0; i < cluster->members; i++) {
    if (!member_alive(&cluster->member[i])) return i;
  }
  return -1;
}

static bool all_healthy(const keel__etcd_cluster *cluster) {
  for (int i = 0; i < cluster->members; i++) {
    if (!member_healthy(&cluster->member[i])) return false;
  }
  return true;
}

/* One round of keel__etcd_cluster_leader: the member every answering member names, when it
 * answered itself; -1 otherwise. A follower names a killed leader until its election
 * timeout, which the leader's own silence rules out. */
static int leader_once(keel__etcd_cluster *cluster) {
  uint64_t agreed = 0;
  bool answered[KEEL__ETCD_MAX_MEMBERS] = {false};
  for (int i = 0; i < cluster->members; i++) {
    etcd_member *member = &cluster->member[i];
    uint64_t leader = 0;
    if (member->pid <= 0 || member->stopped || !member_status(member, &leader)) continue;
    if (leader == 0 || (agreed != 0 && leader != agreed)) return -1;
    agreed = leader;
    answered[i] = true;
  }
  for (int i = 0; i < cluster->members; i++) {
    if (answered[i] && cluster->member[i].id == agreed) return i;
  }
  return -1;
}

/* Polls until every member is healthy and they agree on a leader; false at the deadline or
 * as soon as a member has exited, with why in reason. */
static bool wait_cluster_ready(keel__etcd_cluster *cluster, int64_t deadline, int timeout_ms,
                               char *reason, size_t capacity) {
  for (;;) {
    int exited = exited_member(cluster);
    if (exited >= 0) {
      format_into(reason, capacity, "etcd member %d exited while starting (%s)", exited,
                  cluster->member[exited].log_path);
      return false;
    }
    if (all_healthy(cluster) && leader_once(cluster) >= 0) return true;
    if (now_ms() >= deadline) {
      format_into(reason, capacity, "etcd cluster of %d not healthy with a leader within %d ms",
                  cluster->members, timeout_ms * cluster->time_scale);
      return false;
    }
    pause_ms(POLL_MS);
  }
}

static bool start_attempt(keel__etcd_cluster *cluster, int attempt, int64_t deadline,
                          int timeout_ms, char *reason, size_t capacity) {
  if (!lay_out(cluster, attempt, reason, capacity)) return false;
  for (int i = 0; i < cluster->members; i++) {
    if (!spawn_member(cluster, i, "new")) {
      format_into(reason, capacity, "cannot start etcd member %d: %s", i, strerror(errno));
      return false;
    }
  }
  return wait_cluster_ready(cluster, deadline, timeout_ms, reason, capacity);
}

keel__etcd_cluster *keel__etcd_cluster_start(int members, const char *parent, int time_scale,
                                             int timeout_ms, char *reason, size_t capacity) {
  return keel__etcd_cluster_start_at(members, NULL, parent, time_scale, timeout_ms, reason,
                                     capacity);
}

keel__etcd_cluster *keel__etcd_cluster_start_at(int members, const char *client_host,
                                                const char *parent, int time_scale, int timeout_ms,
                                                char *reason, size_t capacity) {
  struct in_addr parsed;
  if (client_host != NULL && inet_pton(AF_INET, client_host, &parsed) != 1) {
    format_into(reason, capacity, "etcd's client address %s is no IPv4 address", client_host);
    return NULL;
  }
  if (members < 1 || members > KEEL__ETCD_MAX_MEMBERS) {
    format_into(reason, capacity, "an etcd cluster has 1 to %d members, not %d",
                KEEL__ETCD_MAX_MEMBERS, members);
    return NULL;
  }
  keel__etcd_cluster *cluster = calloc(1, sizeof *cluster);
  if (cluster == NULL) {
    format_into(reason, capacity, "out of memory for an etcd cluster");
    return NULL;
  }
  const char *override = getenv("KEEL_ETCD") != NULL ? "KEEL_ETCD" : "KEEL_TEST_ETCD";
  if (!keel__etcd_program_find("etcd", override, cluster->etcd, sizeof cluster->etcd)) {
    format_into(reason, capacity, "etcd-server is not installed (scripts/deps.sh installs it)");
    free(cluster);
    return NULL;
  }
  if (strlen(parent) + sizeof "/etcd-XXXXXX" > sizeof cluster->folder) {
    format_into(reason, capacity, "the folder's path is too long for etcd: %s", parent);
    free(cluster);
    return NULL;
  }
  snprintf(cluster->parent, sizeof cluster->parent, "%s", parent);
  snprintf(cluster->client_host, sizeof cluster->client_host, "%s",
           client_host != NULL ? client_host : "127.0.0.1");
  cluster->members = members;
  cluster->time_scale = time_scale > 1 ? time_scale : 1;
  int64_t deadline = deadline_after(cluster->time_scale, timeout_ms);
  for (int attempt = 1; attempt <= START_ATTEMPTS; attempt++) {
    if (start_attempt(cluster, attempt, deadline, timeout_ms, reason, capacity)) {
      format_into(reason, capacity, "%s", "");
      return cluster;
    }
    if (attempt == START_ATTEMPTS || !logs_mention(cluster, "address already in use")) break;
    fprintf(stderr, "etcd: a port was taken before a member bound it (%s); starting again\n",
            reason);
    tear_down(cluster);
  }
  keel__etcd_cluster_print_logs(cluster);
  keel__etcd_cluster_destroy(cluster);
  return NULL;
}

/* ---- accessors ---- */

int keel__etcd_cluster_members(const keel__etcd_cluster *cluster) { return cluster->members; }

const char *keel__etcd_cluster_endpoint(const keel__etcd_cluster *cluster) {
  return cluster->endpoint;
}

const char *keel__etcd_cluster_member_address(const keel__etcd_cluster *cluster, int member) {
  return valid_member(cluster, member) ? cluster->member[member].address : NULL;
}

pid_t keel__etcd_cluster_pid(const keel__etcd_cluster *cluster, int member) {
  return valid_member(cluster, member) ? cluster->member[member].pid : 0;
}

char keel__etcd_cluster_state(const keel__etcd_cluster *cluster, int member) {
  pid_t pid = keel__etcd_cluster_pid(cluster, member);
  return pid > 0 ? process_state(pid) : 0;
}

const char *keel__etcd_cluster_folder(const keel__etcd_cluster *cluster) { return cluster->folder; }

/* ---- faults ---- */

int keel__etcd_cluster_leader(keel__etcd_cluster *cluster, int timeout_ms) {
  int64_t deadline = deadline_after(cluster->time_scale, timeout_ms);
  for (;;) {
    int leader = leader_once(cluster);
    if (leader >= 0 || now_ms() >= deadline) return leader;
    pause_ms(POLL_MS);
  }
}

bool keel__etcd_cluster_kill(keel__etcd_cluster *cluster, int member) {
  if (!valid_member(cluster, member) || !member_alive(&cluster->member[member])) return false;
  end_member(&cluster->member[member]);
  return true;
}

/* SIGSTOP (stop) or SIGCONT, then the wait until /proc agrees. The mark comes before the
 * wait: whatever /proc says, destroy must SIGCONT a member sent SIGSTOP. */
static bool member_freeze(keel__etcd_cluster *cluster, int member, bool stop) {
  if (!valid_member(cluster, member) || !member_alive(&cluster->member[member])) return false;
  etcd_member *target = &cluster->member[member];
  if (kill(target->pid, stop ? SIGSTOP : SIGCONT) != 0) return false;
  target->stopped = stop;
  return wait_stopped(target, stop);
}

bool keel__etcd_cluster_stop(keel__etcd_cluster *cluster, int member) {
  return member_freeze(cluster, member, true);
}

bool keel__etcd_cluster_resume(keel__etcd_cluster *cluster, int member) {
  return member_freeze(cluster, member, false);
}

bool keel__etcd_cluster_restart(keel__etcd_cluster *cluster, int member, int timeout_ms) {
  if (!valid_member(cluster, member) || member_alive(&cluster->member[member])) return false;
  etcd_member *target = &cluster->member[member];
  int64_t deadline = deadline_after(cluster->time_scale, timeout_ms);
  if (!spawn_member(cluster, member, "existing")) return false;
  while (!member_healthy(target)) {
    if (!member_alive(target) || now_ms() >= deadline) {
      fprintf(stderr, "etcd member %d not healthy after a restart\n", member);
      print_log("etcd member log", target->log_path);
      return false;
    }
    pause_ms(POLL_MS);
  }
  return true;
}

/* ---- logs ---- */

void keel__etcd_cluster_live_endpoints(const keel__etcd_cluster *cluster, char *list,
                                       size_t capacity) {
  list[0] = '\0';
  for (int i = 0; i < cluster->members; i++) {
    const etcd_member *member = &cluster->member[i];
    if (member->pid <= 0 || member->stopped) continue;
    append(list, capacity, "%s%s", list[0] ? "," : "", member->address);
  }
}

void keel__etcd_cluster_print_logs(const keel__etcd_cluster *cluster) {
  for (int i = 0; cluster != NULL && i < cluster->members; i++) {
    char what[64];
    snprintf(what, sizeof what, "etcd member %d (%s)", i, cluster->member[i].address);
    print_log(what, cluster->member[i].log_path);
  }
}

void keel__etcd_cluster_destroy(keel__etcd_cluster *cluster) {
  if (cluster == NULL) return;
  tear_down(cluster);
  free(cluster);
}
