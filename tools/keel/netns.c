/* Simulated hosts out of network namespaces (netns.h): a bridge per job in the root
 * namespace, a namespace and a veth pair per node, tbf to shape each link and a tc filter to
 * cut a node off. Every ip and tc command goes through keel__netns_command_run. */
#include "netns.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define NETNS_FOLDER "/var/run/netns" /* where `ip netns add` binds each namespace */
#define LINK_FOLDER "/sys/class/net"
#define LOCK_PATH "/run/keel-netns.lock"
#define NAMESPACE_PREFIX "keel-"
#define BRIDGE_PREFIX "kb"
#define LINK_PREFIX "kv"
#define LINK_NODE_SEPARATOR "n"

#define COMMAND_TIMEOUT_NS (10LL * 1000 * 1000 * 1000)
#define LOCK_TIMEOUT_NS (30LL * 1000 * 1000 * 1000)
#define COMMAND_ARGUMENTS_MAX 32
/* `ip address show` of a host with thousands of interfaces still fits. */
#define COMMAND_OUTPUT_MAX (4u << 20)
#define ERROR_BYTES 512

/* 198.18.0.0/15 (RFC 2544, for benchmarks): 512 /24s, one per job. */
#define BENCH_NETWORK 0xC6120000u
#define SUBNET_COUNT 512u
#define SUBNET_SIZE 256u

#define RATE_MIN_BITS 1e6
#define RATE_MAX_BITS 1e12

typedef struct netns_node {
  char namespace_name[32];
  char link[IFNAMSIZ]; /* the bridge-side end of its veth pair */
  char address[INET_ADDRSTRLEN];
  int namespace_fd; /* opened at creation for keel__netns_enter; close-on-exec */
} netns_node;

struct keel__netns {
  pid_t owner;
  uint64_t rate_bits_per_second; /* 0: unshaped */
  uint32_t subnet;               /* 198.18.x.0 in host order */
  char bridge[IFNAMSIZ];
  char bridge_address[INET_ADDRSTRLEN];
  size_t node_count;
  netns_node nodes[];
};

/* Writes a message into text when the caller asked for one (text NULL: nothing). */
static void text_set(char *text, size_t capacity, const char *format, ...)
    __attribute__((format(printf, 3, 4)));

static void text_set(char *text, size_t capacity, const char *format, ...) {
  if (text == NULL || capacity == 0) return;
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(text, capacity, format, arguments);
  va_end(arguments);
}

/* ---- rates */

typedef struct rate_unit {
  const char *name;
  double bits; /* bits per second of one unit */
} rate_unit;

/* tc's table (tc_util.c, get_rate): "bps" is bytes per second there too. */
static const rate_unit rate_units[] = {
    {"bit", 1.0},
    {"kibit", 1024.0},
    {"kbit", 1e3},
    {"mibit", 1024.0 * 1024},
    {"mbit", 1e6},
    {"gibit", 1024.0 * 1024 * 1024},
    {"gbit", 1e9},
    {"tibit", 1024.0 * 1024 * 1024 * 1024},
    {"tbit", 1e12},
    {"bps", 8.0},
    {"kibps", 8.0 * 1024},
    {"kbps", 8e3},
    {"mibps", 8.0 * 1024 * 1024},
    {"mbps", 8e6},
    {"gibps", 8.0 * 1024 * 1024 * 1024},
    {"gbps", 8e9},
    {"tibps", 8.0 * 1024 * 1024 * 1024 * 1024},
    {"tbps", 8e12},
};

keel_status keel__netns_rate_parse(const char *text, uint64_t *bits_per_second_p) {
  /* Digits and one optional point only: strtod alone would also take signs, spaces,
   * exponents, hexadecimal and "inf". */
  if (text == NULL || !isdigit((unsigned char)text[0])) return KEEL_EINVAL;
  const char *cursor = text;
  bool seen_point = false;
  while (isdigit((unsigned char)*cursor) || (*cursor == '.' && !seen_point)) {
    seen_point |= *cursor == '.';
    cursor++;
  }
  double number = strtod(text, NULL);
  double scale = *cursor == '\0' ? 1.0 : 0.0;
  for (size_t i = 0; i < sizeof rate_units / sizeof rate_units[0] && scale == 0.0; i++) {
    if (strcasecmp(cursor, rate_units[i].name) == 0) scale = rate_units[i].bits;
  }
  double bits = number * scale;
  if (!(bits >= RATE_MIN_BITS && bits <= RATE_MAX_BITS)) return KEEL_EINVAL;
  *bits_per_second_p = (uint64_t)(bits + 0.5);
  return KEEL_OK;
}

/* ---- running ip and tc */

/* Whether folder (length bytes, not NUL-terminated) holds an executable name; its path
 * goes to path. */
static bool folder_has_program(const char *folder, size_t length, const char *name, char *path,
                               size_t capacity) {
  /* Relative PATH entries would make a root tool run whatever the current folder holds. */
  if (length == 0 || folder[0] != '/') return false;
  int written = snprintf(path, capacity, "%.*s/%s", (int)length, folder, name);
  return written > 0 && (size_t)written < capacity && access(path, X_OK) == 0;
}

/* Finds name in PATH, then in the sbin folders that a root PATH may lack (sudo, cron). */
static bool program_find(const char *name, char *path, size_t capacity) {
  const char *search = getenv("PATH");
  for (const char *folder = search; folder != NULL && *folder != '\0';) {
    const char *colon = strchr(folder, ':');
    size_t length = colon ? (size_t)(colon - folder) : strlen(folder);
    if (folder_has_program(folder, length, name, path, capacity)) return true;
    folder = colon ? colon + 1 : NULL;
  }
  static const char *const fallbacks[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
  for (size_t i = 0; i < sizeof fallbacks / sizeof fallbacks[0]; i++) {
    if (folder_has_program(fallbacks[i], strlen(fallbacks[i]), name, path, capacity)) return true;
  }
  return false;
}

/* "ip link add kb12 type bridge": the command as a user would type it, for messages. */
static void command_describe(const char *const argv[], char *text, size_t capacity) {
  size_t used = 0;
  text[0] = '\0';
  for (size_t i = 0; argv[i] != NULL && used + 1 < capacity; i++) {
    int written = snprintf(text + used, capacity - used, "%s%s", i ? " " : "", argv[i]);
    if (written < 0) break;
    used += (size_t)written;
  }
}

/* Starts path with stdin from /dev/null and stdout, stderr into the pipes. The signal mask
 * is emptied and the signals a launcher handles or ignores are reset: both would otherwise
 * survive exec. */
static keel_status command_spawn(const char *path, const char *const argv[], int output_fd,
                                 int error_fd, pid_t *pid_p) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  int error = posix_spawn_file_actions_init(&actions);
  if (error != 0) return keel_status_from_errno(error);
  error = posix_spawnattr_init(&attributes);
  if (error != 0) goto fail_destroy_actions;
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  static const int reset_signals[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD};
  for (size_t i = 0; i < sizeof reset_signals / sizeof reset_signals[0]; i++)
    sigaddset(&defaults, reset_signals[i]);
  error = posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (error == 0) error = posix_spawn_file_actions_adddup2(&actions, output_fd, STDOUT_FILENO);
  if (error == 0) error = posix_spawn_file_actions_adddup2(&actions, error_fd, STDERR_FILENO);
  if (error == 0) error = posix_spawnattr_setsigmask(&attributes, &empty);
  if (error == 0) error = posix_spawnattr_setsigdefault(&attributes, &defaults);
  if (error == 0)
    error = posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  /* posix_spawn takes char *const[] for historical reasons; it does not write to argv. */
  if (error == 0)
    error = posix_spawn(pid_p, path, &actions, &attributes, (char *const *)argv, environ);
  posix_spawnattr_destroy(&attributes);
fail_destroy_actions:
  posix_spawn_file_actions_destroy(&actions);
  return keel_status_from_errno(error);
}

/* Appends what stderr gave (the first ERROR_BYTES - 1 bytes; the rest is drained). */
static void error_text_append(char *text, const char *chunk, size_t length) {
  size_t used = strlen(text);
  size_t room = ERROR_BYTES - 1 - used;
  if (length > room) length = room;
  memcpy(text + used, chunk, length);
  text[used + length] = '\0';
}

/* Reads both pipes until the child closes them or the deadline passes. Output past the
 * buffer's maximum is drained and makes the result KEEL_ERANGE. */
static keel_status command_collect(int output_fd, int error_fd, int64_t deadline_ns,
                                   keel_buffer *output, char *error_text) {
  struct pollfd pipes[2] = {{.fd = output_fd, .events = POLLIN},
                            {.fd = error_fd, .events = POLLIN}};
  keel_status status = KEEL_OK;
  while ((pipes[0].fd >= 0 || pipes[1].fd >= 0) && keel_now_ns() < deadline_ns) {
    int ready = poll(pipes, 2, keel_poll_timeout_ms(deadline_ns));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return keel_status_from_errno(errno);
    for (size_t i = 0; i < 2; i++) {
      if (pipes[i].fd < 0 || pipes[i].revents == 0) continue;
      char chunk[4096];
      ssize_t got = read(pipes[i].fd, chunk, sizeof chunk);
      if (got < 0 && errno == EINTR) continue;
      /* poll skips a negative descriptor; the caller still closes the real one. */
      if (got <= 0) {
        pipes[i].fd = -1;
        continue;
      }
      if (i == 1) error_text_append(error_text, chunk, (size_t)got);
      if (i == 0 && output != NULL && status == KEEL_OK)
        status = keel_buffer_append(output, chunk, (size_t)got);
    }
  }
  return status;
}

/* Waits for pid until the deadline, then kills it by pid. KEEL_ETIMEDOUT when killed. */
static keel_status command_wait(pid_t pid, int64_t deadline_ns, int *wait_status_p) {
  for (;;) {
    pid_t reaped = waitpid(pid, wait_status_p, WNOHANG);
    if (reaped == pid) return KEEL_OK;
    if (reaped < 0 && errno != EINTR) return keel_status_from_errno(errno);
    if (keel_now_ns() >= deadline_ns) break;
    struct timespec pause = {0, 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  kill(pid, SIGKILL);
  while (waitpid(pid, wait_status_p, 0) < 0 && errno == EINTR) {
  }
  return KEEL_ETIMEDOUT;
}

/* The first non-empty line of stderr, without its newline. */
static void first_line(char *text) {
  char *start = text;
  while (*start == '\n' || *start == ' ') start++;
  size_t length = strcspn(start, "\n");
  memmove(text, start, length);
  text[length] = '\0';
}

/* What went wrong, for the caller's error text. */
static keel_status command_verdict(keel_status status, int wait_status, int64_t timeout_ns,
                                   const char *description, char *error_text, char *error,
                                   size_t error_capacity) {
  first_line(error_text);
  if (status == KEEL_ETIMEDOUT) {
    text_set(error, error_capacity, "`%s` did not finish within %.1f s (killed)", description,
             (double)timeout_ns / 1e9);
    return status;
  }
  if (status != KEEL_OK) {
    text_set(error, error_capacity, "`%s`: %s", description, keel_strerror(status));
    return status;
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) return KEEL_OK;
  if (error_text[0] != '\0')
    text_set(error, error_capacity, "`%s`: %s", description, error_text);
  else if (WIFEXITED(wait_status))
    text_set(error, error_capacity, "`%s` exited with code %d", description,
             WEXITSTATUS(wait_status));
  else
    text_set(error, error_capacity, "`%s` was killed by signal %d", description,
             WTERMSIG(wait_status));
  return KEEL_EIO;
}

/* Reads what the started child writes, waits for it (killing it at the deadline) and says
 * how it went. */
static keel_status command_finish(pid_t pid, int output_fd, int error_fd, int64_t timeout_ns,
                                  keel_buffer *output, const char *description, char *error,
                                  size_t error_capacity) {
  int64_t deadline_ns = keel_deadline_after_ns(timeout_ns);
  char error_text[ERROR_BYTES] = "";
  keel_status collected = command_collect(output_fd, error_fd, deadline_ns, output, error_text);
  int wait_status = 0;
  keel_status status = command_wait(pid, deadline_ns, &wait_status);
  if (status == KEEL_OK) status = collected;
  return command_verdict(status, wait_status, timeout_ns, description, error_text, error,
                         error_capacity);
}

keel_status keel__netns_command_run(const char *const argv[], int64_t timeout_ns,
                                    keel_buffer *output, char *error, size_t error_capacity) {
  char description[256], path[PATH_MAX];
  command_describe(argv, description, sizeof description);
  if (timeout_ns <= 0) {
    text_set(error, error_capacity, "`%s`: no time to run it in", description);
    return KEEL_EINVAL;
  }
  if (!program_find(argv[0], path, sizeof path)) {
    text_set(error, error_capacity, "`%s`: %s is not in PATH, /usr/sbin or /sbin", description,
             argv[0]);
    return KEEL_ENOTFOUND;
  }
  if (output != NULL) keel_buffer_reset(output);
  /* Close-on-exec: a child another thread starts meanwhile must not hold a write end, or
   * the end of file would never come. */
  int output_pipe[2], error_pipe[2];
  if (pipe2(output_pipe, O_CLOEXEC) != 0) {
    text_set(error, error_capacity, "`%s`: pipe: %s", description, strerror(errno));
    return keel_status_from_errno(errno);
  }
  if (pipe2(error_pipe, O_CLOEXEC) != 0) {
    int error_number = errno;
    text_set(error, error_capacity, "`%s`: pipe: %s", description, strerror(error_number));
    close(output_pipe[0]);
    close(output_pipe[1]);
    return keel_status_from_errno(error_number);
  }
  pid_t pid;
  keel_status status = command_spawn(path, argv, output_pipe[1], error_pipe[1], &pid);
  /* The write ends are the child's now: with ours closed, its exit is the end of file. */
  close(output_pipe[1]);
  close(error_pipe[1]);
  if (status == KEEL_OK)
    status = command_finish(pid, output_pipe[0], error_pipe[0], timeout_ns, output, description,
                            error, error_capacity);
  else
    text_set(error, error_capacity, "`%s`: cannot start %s: %s", description, path,
             keel_strerror(status));
  close(output_pipe[0]);
  close(error_pipe[0]);
  return status;
}

/* Runs the NULL-terminated arguments after error_capacity, dropping stdout. */
static keel_status run_command(char *error, size_t error_capacity, ...) __attribute__((sentinel));

static keel_status run_command(char *error, size_t error_capacity, ...) {
  const char *argv[COMMAND_ARGUMENTS_MAX + 1];
  size_t count = 0;
  va_list arguments;
  va_start(arguments, error_capacity);
  for (const char *argument; (argument = va_arg(arguments, const char *)) != NULL;) {
    if (count < COMMAND_ARGUMENTS_MAX) argv[count] = argument;
    count++;
  }
  va_end(arguments);
  if (count > COMMAND_ARGUMENTS_MAX) return KEEL_EINVAL;
  argv[count] = NULL;
  return keel__netns_command_run(argv, COMMAND_TIMEOUT_NS, NULL, error, error_capacity);
}

/* Removal on the way out, where a failure changes nothing for the caller but is worth a
 * line: something may be left behind. */
static void run_removal(const char *what, const char *object, const char *name) {
  char error[ERROR_BYTES];
  if (run_command(error, sizeof error, "ip", object, "delete", name, NULL) != KEEL_OK)
    KEEL_LOG_W("netns", "cannot remove %s %s: %s", what, name, error);
}

/* ---- owners: names carry the owner's pid, the bridge's alias its start time */

/* Parses "<prefix><pid>", followed by "<separator><digits>" when separator is not NULL, and
 * nothing else. */
static bool owned_name_parse(const char *name, const char *prefix, const char *separator,
                             pid_t *owner_p) {
  size_t prefix_length = strlen(prefix);
  if (strncmp(name, prefix, prefix_length) != 0) return false;
  const char *cursor = name + prefix_length;
  long long pid = 0;
  size_t digits = 0;
  for (; isdigit((unsigned char)*cursor) && digits < 10; cursor++, digits++)
    pid = pid * 10 + (*cursor - '0');
  if (digits == 0 || pid <= 0 || pid > INT_MAX) return false;
  if (separator != NULL) {
    size_t separator_length = strlen(separator);
    if (strncmp(cursor, separator, separator_length) != 0) return false;
    cursor += separator_length;
    if (!isdigit((unsigned char)*cursor)) return false;
    while (isdigit((unsigned char)*cursor)) cursor++;
  }
  if (*cursor != '\0') return false;
  *owner_p = (pid_t)pid;
  return true;
}

static bool namespace_owner(const char *name, pid_t *owner_p) {
  return owned_name_parse(name, NAMESPACE_PREFIX, "-", owner_p);
}

static bool link_owner(const char *name, pid_t *owner_p) {
  return owned_name_parse(name, LINK_PREFIX, LINK_NODE_SEPARATOR, owner_p);
}

static bool bridge_owner(const char *name, pid_t *owner_p) {
  return owned_name_parse(name, BRIDGE_PREFIX, NULL, owner_p);
}

/* The start time of pid in ticks since boot (field 22 of /proc/<pid>/stat): unlike the pid
 * it is never the same for two processes. False when pid is gone. */
static bool process_start_time(pid_t pid, unsigned long long *start_p) {
  char path[64], text[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t length = read(fd, text, sizeof text - 1);
  close(fd);
  if (length <= 0) return false;
  text[length] = '\0';
  /* The command name (field 2) may hold spaces and parentheses: fields resume after the
   * last ')'. */
  const char *after_name = strrchr(text, ')');
  if (after_name == NULL) return false;
  return sscanf(after_name + 1,
                " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                start_p) == 1;
}

static bool owner_stamp_format(pid_t pid, char *stamp, size_t capacity) {
  unsigned long long start;
  if (!process_start_time(pid, &start)) return false;
  snprintf(stamp, capacity, KEEL__NETNS_OWNER_STAMP "%llu", start);
  return true;
}

/* The stamp on bridge kb<pid>; false when there is no bridge or it has no stamp (a crash
 * between making it and stamping it). */
static bool bridge_stamp_read(pid_t pid, char *stamp, size_t capacity) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, LINK_FOLDER "/" BRIDGE_PREFIX "%ld/ifalias", (long)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t length = read(fd, stamp, capacity - 1);
  close(fd);
  if (length <= 0) return false;
  stamp[length] = '\0';
  stamp[strcspn(stamp, "\n")] = '\0';
  return strncmp(stamp, KEEL__NETNS_OWNER_STAMP, strlen(KEEL__NETNS_OWNER_STAMP)) == 0;
}

/* Whether what is named after pid belongs to nobody any more: pid is dead, or the live
 * process with that pid is not the one that stamped the bridge (the pid was reused). With
 * a live pid and no stamp to compare, nothing can be told, and nothing is removed. */
static bool owner_gone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char found[96], expected[96];
  if (!bridge_stamp_read(pid, found, sizeof found)) return false;
  if (!owner_stamp_format(pid, expected, sizeof expected)) return true;
  return strcmp(found, expected) != 0;
}

/* ---- stale cleanup */

typedef struct stale_pass {
  const char *folder;
  bool (*owner)(const char *name, pid_t *owner_p);
  const char *object; /* `ip <object> delete <name>` */
  const char *what;   /* for messages */
} stale_pass;

/* Veths first (each takes its inside end along), then namespaces, then bridges: the
 * bridge's stamp decides about the others, so it is read before it goes. */
static const stale_pass owned_passes[] = {
    {LINK_FOLDER, link_owner, "link", "veth"},
    {NETNS_FOLDER, namespace_owner, "netns", "namespace"},
    {LINK_FOLDER, bridge_owner, "link", "bridge"},
};

typedef bool owner_wanted_fn(pid_t owner, const void *context);

static bool owner_is_gone(pid_t owner, const void *context) {
  (void)context;
  return owner_gone(owner);
}

static bool owner_is(pid_t owner, const void *context) { return owner == *(const pid_t *)context; }

/* Names in folder that owner() accepts and whose owner is wanted, NUL-separated into names:
 * listed before anything is removed, since removing entries while reading the folder may
 * skip some. */
static void owned_names_list(const stale_pass *pass, owner_wanted_fn *wanted, const void *context,
                             keel_buffer *names) {
  keel_buffer_reset(names);
  DIR *folder = opendir(pass->folder);
  if (folder == NULL) return; /* no namespace was ever made: nothing there */
  for (struct dirent *entry; (entry = readdir(folder)) != NULL;) {
    pid_t owner;
    if (!pass->owner(entry->d_name, &owner) || !wanted(owner, context)) continue;
    if (keel_buffer_append(names, entry->d_name, strlen(entry->d_name) + 1) != KEEL_OK) break;
  }
  closedir(folder);
}

/* Removes what dead owners left; the caller holds the host lock. */
static keel_status stale_remove(size_t *removed_p) {
  const stale_pass *passes = owned_passes;
  size_t pass_count = sizeof owned_passes / sizeof owned_passes[0];
  keel_status first_failure = KEEL_OK;
  size_t removed = 0;
  keel_buffer names;
  keel_buffer_init(&names, 1u << 20);
  for (size_t i = 0; i < pass_count; i++) {
    owned_names_list(&passes[i], owner_is_gone, NULL, &names);
    for (size_t at = 0; at < names.length; at += strlen((char *)names.data + at) + 1) {
      const char *name = (const char *)names.data + at;
      char error[ERROR_BYTES];
      keel_status status =
          run_command(error, sizeof error, "ip", passes[i].object, "delete", name, NULL);
      if (status == KEEL_OK) {
        removed++;
        KEEL_LOG_I("netns", "removed stale %s %s: its owner is gone", passes[i].what, name);
      } else {
        KEEL_LOG_W("netns", "cannot remove stale %s %s: %s", passes[i].what, name, error);
        if (first_failure == KEEL_OK) first_failure = status;
      }
    }
  }
  keel_buffer_free(&names);
  if (removed_p != NULL) *removed_p = removed;
  return first_failure;
}

size_t keel__netns_owned_count(pid_t owner, char *first, size_t capacity) {
  size_t count = 0;
  keel_buffer names;
  keel_buffer_init(&names, 1u << 20);
  for (size_t i = 0; i < sizeof owned_passes / sizeof owned_passes[0]; i++) {
    owned_names_list(&owned_passes[i], owner_is, &owner, &names);
    for (size_t at = 0; at < names.length; at += strlen((char *)names.data + at) + 1) {
      if (count++ == 0 && capacity > 0)
        snprintf(first, capacity, "%s %s", owned_passes[i].what, (char *)names.data + at);
    }
  }
  keel_buffer_free(&names);
  return count;
}

/* Serialises the choice of a /24 and the stale cleanup among the keel processes of the
 * host. An flock goes away with its holder, so a killed launcher blocks nobody. Returns the
 * locked descriptor, or -1 with error set. */
static int host_lock_take(char *error, size_t error_capacity) {
  int fd = open(LOCK_PATH, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    text_set(error, error_capacity, "cannot open %s: %s", LOCK_PATH, strerror(errno));
    return -1;
  }
  /* Polled rather than blocking: a stopped holder must not hang this process for good. */
  int64_t deadline_ns = keel_now_ns() + LOCK_TIMEOUT_NS;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    bool busy = errno == EWOULDBLOCK || errno == EINTR;
    if (!busy || keel_now_ns() >= deadline_ns) {
      text_set(error, error_capacity, "cannot lock %s: %s", LOCK_PATH,
               busy ? "another keel holds it" : strerror(errno));
      close(fd);
      return -1;
    }
    struct timespec pause = {0, 10 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  return fd;
}

keel_status keel__netns_cleanup_stale(size_t *removed_p) {
  char error[ERROR_BYTES];
  int lock_fd = host_lock_take(error, sizeof error);
  if (lock_fd < 0) {
    KEEL_LOG_E("netns", "cannot clean up stale namespaces: %s", error);
    return KEEL_EIO;
  }
  keel_status status = stale_remove(removed_p);
  close(lock_fd);
  return status;
}

/* ---- the job's /24 */

/* Marks the /24s of 198.18.0.0/15 that prefix address/length overlaps. */
static void subnets_mark(uint32_t address, unsigned length, bool used[SUBNET_COUNT]) {
  uint64_t size = (uint64_t)1 << (32 - length);
  uint64_t first = address & ~(size - 1), last = first + size - 1;
  uint64_t bench_last = (uint64_t)BENCH_NETWORK + SUBNET_COUNT * SUBNET_SIZE - 1;
  if (last < BENCH_NETWORK || first > bench_last) return;
  if (first < BENCH_NETWORK) first = BENCH_NETWORK;
  if (last > bench_last) last = bench_last;
  for (uint64_t index = (first - BENCH_NETWORK) / SUBNET_SIZE;
       index <= (last - BENCH_NETWORK) / SUBNET_SIZE; index++)
    used[index] = true;
}

/* Marks every "a.b.c.d" or "a.b.c.d/len" word of text: addresses, prefixes, gateways and
 * sources alike, erring on the side of a /24 left alone. */
static void subnets_mark_text(const char *text, bool used[SUBNET_COUNT]) {
  for (const char *cursor = text; *cursor != '\0';) {
    cursor += strspn(cursor, " \t\n\\");
    size_t length = strcspn(cursor, " \t\n\\");
    char word[32];
    if (length > 0 && length < sizeof word) {
      memcpy(word, cursor, length);
      word[length] = '\0';
      char *slash = strchr(word, '/');
      unsigned prefix_length = 32;
      if (slash != NULL) {
        *slash = '\0';
        char *end;
        unsigned long parsed = strtoul(slash + 1, &end, 10);
        prefix_length = *end == '\0' && slash[1] != '\0' && parsed <= 32 ? (unsigned)parsed : 33;
      }
      struct in_addr address;
      if (prefix_length <= 32 && inet_pton(AF_INET, word, &address) == 1)
        subnets_mark(ntohl(address.s_addr), prefix_length, used);
    }
    cursor += length;
  }
}

/* A /24 of 198.18.0.0/15 that no address or route of the host touches, looked for from a
 * place that depends on the pid so that jobs rarely try the same one first. */
static keel_status subnet_choose(pid_t owner, uint32_t *subnet_p, char *error,
                                 size_t error_capacity) {
  static const char *const listings[][7] = {
      {"ip", "-4", "-o", "address", "show", NULL},
      {"ip", "-4", "route", "show", "table", "all", NULL},
  };
  bool used[SUBNET_COUNT] = {false};
  keel_buffer output;
  keel_buffer_init(&output, COMMAND_OUTPUT_MAX);
  keel_status status = KEEL_OK;
  for (size_t i = 0; i < sizeof listings / sizeof listings[0] && status == KEEL_OK; i++) {
    status =
        keel__netns_command_run(listings[i], COMMAND_TIMEOUT_NS, &output, error, error_capacity);
    if (status == KEEL_OK && output.data != NULL) subnets_mark_text((char *)output.data, used);
  }
  keel_buffer_free(&output);
  if (status != KEEL_OK) return status;
  for (uint32_t tried = 0; tried < SUBNET_COUNT; tried++) {
    uint32_t index = ((uint32_t)owner + tried) % SUBNET_COUNT;
    if (used[index]) continue;
    *subnet_p = BENCH_NETWORK + index * SUBNET_SIZE;
    return KEEL_OK;
  }
  text_set(error, error_capacity, "every /24 of 198.18.0.0/15 is in use on this host");
  return KEEL_ENOSPC;
}

static void address_format(uint32_t address, char text[INET_ADDRSTRLEN]) {
  snprintf(text, INET_ADDRSTRLEN, "%u.%u.%u.%u", address >> 24, (address >> 16) & 255,
           (address >> 8) & 255, address & 255);
}

/* ---- the bridge */

/* Without IPv6 in the kernel there are no link-local addresses to turn off. */
static bool ipv6_present(void) { return access("/proc/sys/net/ipv6", F_OK) == 0; }

/* A root sysctl of the bridge: written directly, the launcher is in the root namespace. */
static keel_status bridge_sysctl_write(const keel__netns *net, const char *family, const char *name,
                                       const char *value, char *error, size_t error_capacity) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "/proc/sys/net/%s/conf/%s/%s", family, net->bridge, name);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  bool written = fd >= 0 && write(fd, value, strlen(value)) == (ssize_t)strlen(value);
  int error_number = errno;
  if (fd >= 0) close(fd);
  if (written) return KEEL_OK;
  text_set(error, error_capacity, "cannot write %s: %s", path, strerror(error_number));
  return keel_status_from_errno(error_number);
}

/* The bridge: stamped with the owner's start time, holding the job's first address. The
 * host's bridge netfilter hooks are off for it: with br_netfilter loaded, frames between
 * nodes would cross the host's iptables FORWARD chain, which Docker sets to DROP. IPv4
 * forwarding is off on it: nothing the nodes send is routed beyond the job's /24. */
static keel_status bridge_create(keel__netns *net, char *error, size_t error_capacity) {
  char stamp[96], cidr[INET_ADDRSTRLEN + 3];
  if (!owner_stamp_format(net->owner, stamp, sizeof stamp)) {
    text_set(error, error_capacity, "cannot read /proc/%ld/stat", (long)net->owner);
    return KEEL_EIO;
  }
  snprintf(cidr, sizeof cidr, "%s/24", net->bridge_address);
  keel_status status = run_command(error, error_capacity, "ip", "link", "add", "name", net->bridge,
                                   "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables",
                                   "0", "nf_call_arptables", "0", NULL);
  if (status != KEEL_OK) return status;
  status = run_command(error, error_capacity, "ip", "link", "set", "dev", net->bridge, "alias",
                       stamp, NULL);
  if (status == KEEL_OK && ipv6_present())
    status = run_command(error, error_capacity, "ip", "link", "set", "dev", net->bridge,
                         "addrgenmode", "none", NULL);
  if (status == KEEL_OK)
    status = bridge_sysctl_write(net, "ipv4", "forwarding", "0", error, error_capacity);
  if (status == KEEL_OK)
    status =
        run_command(error, error_capacity, "ip", "address", "add", cidr, "dev", net->bridge, NULL);
  if (status == KEEL_OK)
    status =
        run_command(error, error_capacity, "ip", "link", "set", "dev", net->bridge, "up", NULL);
  if (status != KEEL_OK) goto fail_delete_bridge;
  return KEEL_OK;
fail_delete_bridge:
  run_removal("bridge", "link", net->bridge);
  return status;
}

/* ---- nodes */

/* tbf at the root of device (in namespace_name, or the root namespace for NULL).
 * tbf rather than htb: one rate per link needs no class tree, only a bucket and a queue.
 * Bucket (burst): at least what the rate sends in 1 ms. tbf sleeps on a timer when the
 * bucket runs dry, and on a busy host the timer fires up to about a millisecond late; a
 * bucket smaller than that overflows meanwhile and the link runs below its rate (at
 * 10 Gbit/s 1 ms is 1.25 MB; tc's old rule of thumb, rate/HZ, is of the same order). On a
 * 2-core VM a 1 Gbit/s link carried 0.85 Gbit/s with a 64 KiB bucket and 0.96 with 1 ms;
 * a 10 Gbit/s one 1.9 and 6.9 (its veths reached 12 unshaped). And at least 64 KiB, the
 * largest GSO packet a veth hands over, which tbf would otherwise cut into segments to fit.
 * Queue (latency 10 ms): about a switch port's buffer at line rate, enough for TCP to keep
 * the link busy without a standing queue that would stretch timeouts. */
static keel_status link_shape(const keel__netns *net, const char *namespace_name,
                              const char *device, char *error, size_t error_capacity) {
  uint64_t burst = net->rate_bits_per_second / 8 / 1000;
  if (burst < 64 * 1024) burst = 64 * 1024;
  char rate[32], burst_text[32];
  snprintf(rate, sizeof rate, "%llubit", (unsigned long long)net->rate_bits_per_second);
  snprintf(burst_text, sizeof burst_text, "%llu", (unsigned long long)burst);
  if (namespace_name == NULL)
    return run_command(error, error_capacity, "tc", "qdisc", "add", "dev", device, "root", "tbf",
                       "rate", rate, "burst", burst_text, "latency", "10ms", NULL);
  return run_command(error, error_capacity, "tc", "-n", namespace_name, "qdisc", "add", "dev",
                     device, "root", "tbf", "rate", rate, "burst", burst_text, "latency", "10ms",
                     NULL);
}

/* Both ends of a fresh veth pair: on the bridge and inside, addressed, shaped, and ready
 * for partition filters. */
static keel_status node_configure(const keel__netns *net, const netns_node *node, char *error,
                                  size_t error_capacity) {
  const char *inside = node->namespace_name;
  char cidr[INET_ADDRSTRLEN + 3];
  snprintf(cidr, sizeof cidr, "%s/24", node->address);
  keel_status status = KEEL_OK;
  /* No IPv6 link-local addresses: the only traffic on the bridge is the job's IPv4. */
  if (ipv6_present()) {
    status = run_command(error, error_capacity, "ip", "link", "set", "dev", node->link,
                         "addrgenmode", "none", NULL);
    if (status == KEEL_OK)
      status = run_command(error, error_capacity, "ip", "-n", inside, "link", "set", "dev",
                           KEEL__NETNS_NODE_DEVICE, "addrgenmode", "none", NULL);
  }
  if (status == KEEL_OK)
    status = run_command(error, error_capacity, "ip", "link", "set", "dev", node->link, "master",
                         net->bridge, "up", NULL);
  /* The /24's connected route is the node's only route: nothing beyond the job is reachable
   * (a connect elsewhere fails at once with ENETUNREACH, before any packet leaves). */
  if (status == KEEL_OK)
    status = run_command(error, error_capacity, "ip", "-n", inside, "address", "add", cidr, "dev",
                         KEEL__NETNS_NODE_DEVICE, NULL);
  if (status == KEEL_OK)
    status = run_command(error, error_capacity, "ip", "-n", inside, "link", "set", "dev",
                         KEEL__NETNS_NODE_DEVICE, "up", NULL);
  if (status == KEEL_OK)
    status = run_command(error, error_capacity, "ip", "-n", inside, "link", "set", "dev", "lo",
                         "up", NULL);
  /* Each end shapes what leaves through it: inside, what the node sends; on the bridge
   * side, what it is sent. */
  if (status == KEEL_OK && net->rate_bits_per_second > 0)
    status = link_shape(net, NULL, node->link, error, error_capacity);
  if (status == KEEL_OK && net->rate_bits_per_second > 0)
    status = link_shape(net, inside, KEEL__NETNS_NODE_DEVICE, error, error_capacity);
  if (status == KEEL_OK)
    status =
        run_command(error, error_capacity, "tc", "qdisc", "add", "dev", node->link, "clsact", NULL);
  return status;
}

static keel_status node_create(keel__netns *net, size_t index, char *error, size_t error_capacity) {
  netns_node *node = &net->nodes[index];
  keel_status status =
      run_command(error, error_capacity, "ip", "netns", "add", node->namespace_name, NULL);
  if (status != KEEL_OK) return status;
  char path[PATH_MAX];
  snprintf(path, sizeof path, NETNS_FOLDER "/%s", node->namespace_name);
  node->namespace_fd = open(path, O_RDONLY | O_CLOEXEC);
  if (node->namespace_fd < 0) {
    status = keel_status_from_errno(errno);
    text_set(error, error_capacity, "cannot open %s: %s", path, strerror(errno));
    goto fail_delete_namespace;
  }
  /* The inside end is born in the namespace under its final name, so it never sits in the
   * root namespace, where the host's own eth0 would clash with it. */
  status =
      run_command(error, error_capacity, "ip", "link", "add", node->link, "type", "veth", "peer",
                  "name", KEEL__NETNS_NODE_DEVICE, "netns", node->namespace_name, NULL);
  if (status != KEEL_OK) goto fail_close_namespace;
  status = node_configure(net, node, error, error_capacity);
  if (status != KEEL_OK) goto fail_delete_link;
  return KEEL_OK;
fail_delete_link:
  run_removal("veth", "link", node->link);
fail_close_namespace:
  close(node->namespace_fd);
  node->namespace_fd = -1;
fail_delete_namespace:
  run_removal("namespace", "netns", node->namespace_name);
  return status;
}

static void node_remove(keel__netns *net, size_t index) {
  netns_node *node = &net->nodes[index];
  /* The veth first: deleting its bridge-side end takes the pair at once, whereas a pair
   * left to the namespace's teardown lingers until the kernel's deferred cleanup runs. */
  run_removal("veth", "link", node->link);
  close(node->namespace_fd);
  node->namespace_fd = -1;
  run_removal("namespace", "netns", node->namespace_name);
}

/* ---- create and destroy */

/* Root, iproute2 and a sane node count: the reasons a user can act on, said up front. */
static keel_status preconditions_check(size_t node_count, char *reason, size_t reason_capacity) {
  if (node_count > KEEL__NETNS_MAX_NODES) {
    text_set(reason, reason_capacity, "--netns takes 1 to %d nodes (one /24 per job), not %zu",
             KEEL__NETNS_MAX_NODES, node_count);
    return KEEL_EINVAL;
  }
  if (geteuid() != 0) {
    text_set(reason, reason_capacity,
             "--netns needs root: keel runs as uid %u, and making namespaces, veths and a "
             "bridge takes CAP_SYS_ADMIN and CAP_NET_ADMIN",
             (unsigned)geteuid());
    return KEEL_ENOTSUP;
  }
  static const char *const programs[] = {"ip", "tc"};
  for (size_t i = 0; i < sizeof programs / sizeof programs[0]; i++) {
    char path[PATH_MAX];
    if (program_find(programs[i], path, sizeof path)) continue;
    text_set(reason, reason_capacity,
             "--netns needs iproute2: no `%s` in PATH, /usr/sbin or /sbin (apt-get install "
             "iproute2)",
             programs[i]);
    return KEEL_ENOTSUP;
  }
  return KEEL_OK;
}

/* Fills the names and addresses of every node (the subnet is chosen already). */
static keel_status net_names_fill(keel__netns *net, char *error, size_t error_capacity) {
  long owner = (long)net->owner;
  address_format(net->subnet + 1, net->bridge_address);
  int length = snprintf(net->bridge, sizeof net->bridge, BRIDGE_PREFIX "%ld", owner);
  bool fits = length > 0 && (size_t)length < sizeof net->bridge;
  for (size_t i = 0; i < net->node_count && fits; i++) {
    netns_node *node = &net->nodes[i];
    node->namespace_fd = -1;
    address_format(net->subnet + 2 + (uint32_t)i, node->address);
    fits = keel__netns_link_name((pid_t)owner, i, node->link, sizeof node->link);
    length = snprintf(node->namespace_name, sizeof node->namespace_name, NAMESPACE_PREFIX "%ld-%zu",
                      owner, i);
    fits &= length > 0 && (size_t)length < sizeof node->namespace_name;
  }
  if (fits) return KEEL_OK;
  text_set(error, error_capacity, "pid %ld is too long for an interface name", owner);
  return KEEL_ERANGE;
}

/* Under the host lock: what dead owners left goes, a free /24 is chosen and the bridge takes
 * its first address, which is what the next job's choice sees. */
static keel_status net_claim_subnet(keel__netns *net, char *error, size_t error_capacity) {
  int lock_fd = host_lock_take(error, error_capacity);
  if (lock_fd < 0) return KEEL_EIO;
  stale_remove(NULL);
  keel_status status = KEEL_OK;
  char own_bridge[PATH_MAX];
  snprintf(own_bridge, sizeof own_bridge, LINK_FOLDER "/" BRIDGE_PREFIX "%ld", (long)net->owner);
  if (access(own_bridge, F_OK) == 0) {
    text_set(error, error_capacity,
             "this process has a network already (bridge " BRIDGE_PREFIX "%ld): one at a time",
             (long)net->owner);
    status = KEEL_EEXIST;
  }
  if (status == KEEL_OK) status = subnet_choose(net->owner, &net->subnet, error, error_capacity);
  if (status == KEEL_OK) status = net_names_fill(net, error, error_capacity);
  if (status == KEEL_OK) status = bridge_create(net, error, error_capacity);
  close(lock_fd);
  return status;
}

keel_status keel__netns_create(size_t node_count, uint64_t rate_bits_per_second,
                               keel__netns **net_p, char *reason, size_t reason_capacity) {
  keel_status status = preconditions_check(node_count, reason, reason_capacity);
  if (status != KEEL_OK) return status;
  char error[ERROR_BYTES] = "";
  keel__netns *net = calloc(1, sizeof *net + node_count * sizeof net->nodes[0]);
  if (net == NULL) {
    text_set(reason, reason_capacity, "--netns: out of memory");
    return KEEL_ENOMEM;
  }
  net->owner = getpid();
  net->rate_bits_per_second = rate_bits_per_second;
  net->node_count = node_count;
  status = net_claim_subnet(net, error, sizeof error);
  if (status != KEEL_OK) goto fail_free;
  size_t made = 0;
  for (; made < node_count; made++) {
    status = node_create(net, made, error, sizeof error);
    if (status != KEEL_OK) goto fail_remove_nodes;
  }
  *net_p = net;
  return KEEL_OK;
fail_remove_nodes:
  while (made > 0) node_remove(net, --made);
  run_removal("bridge", "link", net->bridge);
fail_free:
  free(net);
  text_set(reason, reason_capacity, "--netns: %s", error);
  return status;
}

void keel__netns_destroy(keel__netns *net) {
  if (net == NULL) return;
  for (size_t i = net->node_count; i > 0; i--) node_remove(net, i - 1);
  run_removal("bridge", "link", net->bridge);
  free(net);
}

size_t keel__netns_node_count(const keel__netns *net) { return net->node_count; }

const char *keel__netns_bridge_address(const keel__netns *net) { return net->bridge_address; }

const char *keel__netns_node_address(const keel__netns *net, size_t node) {
  return node < net->node_count ? net->nodes[node].address : NULL;
}

const char *keel__netns_node_namespace(const keel__netns *net, size_t node) {
  return node < net->node_count ? net->nodes[node].namespace_name : NULL;
}

const char *keel__netns_node_link(const keel__netns *net, size_t node) {
  return node < net->node_count ? net->nodes[node].link : NULL;
}

keel_status keel__netns_enter(const keel__netns *net, size_t node) {
  if (node >= net->node_count) return KEEL_EINVAL;
  if (setns(net->nodes[node].namespace_fd, CLONE_NEWNET) != 0) return keel_status_from_errno(errno);
  return KEEL_OK;
}

/* ---- partitions
 * A partitioned host goes quiet: its peers, the launcher included, see neither a reset nor
 * an ICMP error, only silence, and the host itself sees nothing wrong with its link. So the
 * frames are dropped "in the network": by a tc filter on both hooks of the clsact qdisc of
 * the node's bridge-side veth (ingress holds all the node sends, egress all it is sent).
 * TCP retransmits with backoff, and once healed its next retransmission gets through on the
 * same connection. ARP passes the filter: a neighbour entry that fails to resolve makes the
 * kernel report EHOSTUNREACH to local sockets (a connect fails after about 1.5 s, SO_ERROR
 * of a live connection shows it), an immediate failure a real partition would not give.
 * Turned down: `ip link set <veth> down` takes the carrier from the inside end
 * (NO-CARRIER): the node's kernel flushes its neighbours at once and its sockets get
 * EHOSTUNREACH, so the node learns it is cut off. Disabling the bridge port drops ARP too,
 * with the same EHOSTUNREACH on both sides once the neighbour entries expire.
 * The filter is classic BPF in direct-action mode: cls_bpf is there in kernels built
 * without matchall, gact (u32's drop action) or netem, like the one this was written on. */

#define PARTITION_PREFERENCE "1"

/* tc's bytecode text: the frame's protocol (an ancillary load), then ARP passes and
 * everything else is dropped. */
static void partition_program_format(char *text, size_t capacity) {
  snprintf(text, capacity, "4,%u 0 0 %u,%u 0 1 %u,%u 0 0 %u,%u 0 0 %u",
           (unsigned)(BPF_LD | BPF_H | BPF_ABS), (unsigned)(SKF_AD_OFF + SKF_AD_PROTOCOL),
           (unsigned)(BPF_JMP | BPF_JEQ | BPF_K), (unsigned)ETH_P_ARP, (unsigned)(BPF_RET | BPF_K),
           (unsigned)TC_ACT_OK, (unsigned)(BPF_RET | BPF_K), (unsigned)TC_ACT_SHOT);
}

static const char *const partition_hooks[] = {"ingress", "egress"};

/* Removes the filters of both hooks; the clsact qdisc holds nothing else. */
static keel_status partition_filters_remove(const char *link, char *error, size_t error_capacity) {
  keel_status first_failure = KEEL_OK;
  for (size_t i = 0; i < 2; i++) {
    keel_status status = run_command(error, error_capacity, "tc", "filter", "delete", "dev", link,
                                     partition_hooks[i], NULL);
    if (first_failure == KEEL_OK) first_failure = status;
  }
  return first_failure;
}

bool keel__netns_link_name(pid_t owner, size_t node, char *name, size_t capacity) {
  int length =
      snprintf(name, capacity, LINK_PREFIX "%ld" LINK_NODE_SEPARATOR "%zu", (long)owner, node);
  return length > 0 && (size_t)length < capacity;
}

keel_status keel__netns_route_add(keel__netns *net, const char *address, char *reason,
                                  size_t reason_capacity) {
  struct in_addr parsed;
  if (inet_pton(AF_INET, address, &parsed) != 1) {
    text_set(reason, reason_capacity, "--netns: %s is no IPv4 address", address);
    return KEEL_EINVAL;
  }
  uint32_t host = ntohl(parsed.s_addr);
  bool benchmark_range = host - BENCH_NETWORK < SUBNET_COUNT * SUBNET_SIZE;
  if (!benchmark_range || host - net->subnet < SUBNET_SIZE) {
    text_set(reason, reason_capacity,
             "--netns: the nodes reach nothing beyond their /24 but addresses of "
             "198.18.0.0/15 on this host, and %s is not one",
             address);
    return KEEL_EINVAL;
  }
  char route[INET_ADDRSTRLEN + 3], error[ERROR_BYTES];
  snprintf(route, sizeof route, "%s/32", address);
  for (size_t i = 0; i < net->node_count; i++) {
    keel_status status = run_command(error, sizeof error, "ip", "-n", net->nodes[i].namespace_name,
                                     "route", "replace", route, "via", net->bridge_address, NULL);
    if (status != KEEL_OK) {
      text_set(reason, reason_capacity, "--netns: %s", error);
      return status;
    }
  }
  return KEEL_OK;
}

keel_status keel__netns_partition(keel__netns *net, size_t node) {
  if (node >= net->node_count) return KEEL_EINVAL;
  return keel__netns_link_partition(net->nodes[node].link);
}

keel_status keel__netns_link_partition(const char *link) {
  char program[128], error[ERROR_BYTES];
  partition_program_format(program, sizeof program);
  keel_status status = KEEL_OK;
  for (size_t i = 0; i < 2 && status == KEEL_OK; i++) {
    /* replace, with a fixed preference and handle: partitioning twice changes nothing. */
    status = run_command(error, sizeof error, "tc", "filter", "replace", "dev", link,
                         partition_hooks[i], "pref", PARTITION_PREFERENCE, "handle", "1",
                         "protocol", "all", "bpf", "bytecode", program, "direct-action", NULL);
  }
  if (status != KEEL_OK) goto fail_remove_filters;
  return KEEL_OK;
fail_remove_filters:
  KEEL_LOG_E("netns", "cannot partition %s: %s", link, error);
  /* Half a partition (one direction cut) is no state anyone asked for. */
  partition_filters_remove(link, NULL, 0);
  return status;
}

keel_status keel__netns_heal(keel__netns *net, size_t node) {
  if (node >= net->node_count) return KEEL_EINVAL;
  return keel__netns_link_heal(net->nodes[node].link);
}

keel_status keel__netns_link_heal(const char *link) {
  char error[ERROR_BYTES];
  keel_status status = partition_filters_remove(link, error, sizeof error);
  if (status != KEEL_OK) KEEL_LOG_E("netns", "cannot heal %s: %s", link, error);
  return status;
}

keel_status keel__netns_partitioned(const keel__netns *net, size_t node, bool *partitioned_p) {
  if (node >= net->node_count) return KEEL_EINVAL;
  keel_buffer output;
  keel_buffer_init(&output, COMMAND_OUTPUT_MAX);
  char error[ERROR_BYTES];
  bool partitioned = false;
  keel_status status = KEEL_OK;
  for (size_t i = 0; i < 2 && status == KEEL_OK; i++) {
    const char *argv[] = {"tc", "filter", "show", "dev", net->nodes[node].link, partition_hooks[i],
                          NULL};
    status = keel__netns_command_run(argv, COMMAND_TIMEOUT_NS, &output, error, sizeof error);
    /* Either direction cut is a partition: traffic is being dropped. */
    if (status == KEEL_OK && output.data != NULL)
      partitioned |= strstr((char *)output.data, " bpf ") != NULL;
  }
  keel_buffer_free(&output);
  if (status != KEEL_OK) {
    KEEL_LOG_E("netns", "cannot read the filters of node %zu: %s", node, error);
    return status;
  }
  *partitioned_p = partitioned;
  return KEEL_OK;
}
