/* Simulated hosts of `keel run --netns` (tools/keel/netns.c): each node's address, shaped
 * links and their rate, TCP through a partition and a heal, no route beyond the job, two
 * jobs at once, the cleanup of what dead owners left, and nothing left after destroy or a
 * failed create. Past the unprivileged cases (rates, refusal, the runner's deadline) it
 * needs root and exits 77 without it; children enter the nodes by setns. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "netns.h"
#include "test_support.h"

#define RATE_100MBIT 100000000ull
#define RATE_10GBIT 10000000000ull
#define ECHO_PORT 7100
#define SINK_PORT 7101
#define LAUNCHER_PORT 7102
#define FLOOD_SECONDS 2
/* TEST-NET-1: never one of a job's addresses, and no node has a route to it. */
#define OUTSIDE_ADDRESS "192.0.2.1"
/* A port on the bridge of a network of no nodes (route_reaches_a_service_network). */
#define SERVICE_PORT 7103
#define CHANNELS_MAX 8
#define CHANNEL_BYTES 8192
#define CHILD_LIFETIME_S 60
#define COMMAND_TIMEOUT_NS (10LL * 1000 * 1000 * 1000)

/* A forked child and the pipes it talks through: commands in, one report per line out. */
typedef struct channel {
  pid_t pid;
  int to_child;
  int from_child;
  char seen[CHANNEL_BYTES]; /* reports so far; a matched line's first byte becomes '#' */
  size_t length;
} channel;

/* What a case made, undone by the teardown even when an assertion failed. */
typedef struct fixture {
  keel__netns *net;
  channel channels[CHANNELS_MAX];
  size_t channel_count;
  pid_t sleepers[4]; /* owners of planted names in the stale case */
  size_t sleeper_count;
  int listener; /* the test's own socket on the bridge address; -1: none */
} fixture;

typedef void (*child_body)(const keel__netns *net, size_t node, int commands, int reports,
                           const char *argument);

/* ---- helpers */

static void report(int fd, const char *format, ...) __attribute__((format(printf, 2, 3)));

static void report(int fd, const char *format, ...) {
  va_list arguments;
  va_start(arguments, format);
  vdprintf(fd, format, arguments);
  va_end(arguments);
}

static struct sockaddr_in socket_address(const char *address, int port) {
  struct sockaddr_in result = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, address, &result.sin_addr);
  return result;
}

static int listener_open(const char *address, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in local = socket_address(address, port);
  if (bind(fd, (struct sockaddr *)&local, sizeof local) != 0 || listen(fd, 8) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int connection_open(const char *address, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in remote = socket_address(address, port);
  if (connect(fd, (struct sockaddr *)&remote, sizeof remote) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int64_t now_ms(void) { return keel_now_ns() / 1000000; }

/* Runs ip or tc (NULL-terminated arguments) through the module's runner; its stdout goes to
 * text. False when it failed. */
static bool run_text(char *text, size_t capacity, ...) __attribute__((sentinel));

static bool run_text(char *text, size_t capacity, ...) {
  const char *argv[24];
  size_t count = 0;
  va_list arguments;
  va_start(arguments, capacity);
  for (const char *argument; (argument = va_arg(arguments, const char *)) != NULL && count < 23;)
    argv[count++] = argument;
  va_end(arguments);
  argv[count] = NULL;
  keel_buffer output;
  keel_buffer_init(&output, 1u << 20);
  char error[512] = "";
  keel_status status =
      keel__netns_command_run(argv, COMMAND_TIMEOUT_NS, &output, error, sizeof error);
  if (status != KEEL_OK) fprintf(stderr, "test_netns: %s\n", error);
  if (text != NULL)
    snprintf(text, capacity, "%s", output.data != NULL ? (const char *)output.data : "");
  keel_buffer_free(&output);
  return status == KEEL_OK;
}

/* How many namespaces, bridges and veths are named after pid. */
static size_t owned_count(pid_t pid) {
  char namespace_prefix[32], bridge[32], link_prefix[32];
  snprintf(namespace_prefix, sizeof namespace_prefix, "keel-%ld-", (long)pid);
  snprintf(bridge, sizeof bridge, "kb%ld", (long)pid);
  snprintf(link_prefix, sizeof link_prefix, "kv%ldn", (long)pid);
  size_t count = 0;
  DIR *folder = opendir("/var/run/netns");
  for (struct dirent *entry; folder != NULL && (entry = readdir(folder)) != NULL;)
    count += strncmp(entry->d_name, namespace_prefix, strlen(namespace_prefix)) == 0;
  if (folder != NULL) closedir(folder);
  folder = opendir("/sys/class/net");
  for (struct dirent *entry; folder != NULL && (entry = readdir(folder)) != NULL;) {
    count += strcmp(entry->d_name, bridge) == 0;
    count += strncmp(entry->d_name, link_prefix, strlen(link_prefix)) == 0;
  }
  if (folder != NULL) closedir(folder);
  return count;
}

/* Kills (by pid) and reaps a child; SIGKILL makes the wait short. */
static void child_end(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
}

/* ---- children: each enters its node (or stays in the root namespace), then runs a body */

#define ROOT_NAMESPACE SIZE_MAX

static channel *child_start(fixture *state, size_t node, child_body body, const char *argument) {
  assert_true(state->channel_count < CHANNELS_MAX);
  int commands[2], reports[2];
  assert_int_equal(pipe2(commands, O_CLOEXEC), 0);
  assert_int_equal(pipe2(reports, O_CLOEXEC), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* Bounded even if the test itself is killed or stuck. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(CHILD_LIFETIME_S);
    close(commands[1]);
    close(reports[0]);
    if (node != ROOT_NAMESPACE && keel__netns_enter(state->net, node) != KEEL_OK) {
      report(reports[1], "enter-failed %d\n", errno);
      _exit(1);
    }
    body(state->net, node, commands[0], reports[1], argument);
    _exit(0);
  }
  close(commands[0]);
  close(reports[1]);
  channel *started = &state->channels[state->channel_count++];
  started->pid = pid;
  started->to_child = commands[1];
  started->from_child = reports[0];
  started->length = 0;
  return started;
}

/* Finds an unmatched report line starting with prefix, marks it matched and copies it. */
static bool channel_match(channel *from, const char *prefix, char *line, size_t capacity) {
  for (size_t start = 0; start < from->length;) {
    char *text = from->seen + start;
    char *end = memchr(text, '\n', from->length - start);
    if (end == NULL) return false;
    if (strncmp(text, prefix, strlen(prefix)) == 0) {
      if (line != NULL) snprintf(line, capacity, "%.*s", (int)(end - text), text);
      text[0] = '#';
      return true;
    }
    start = (size_t)(end - from->seen) + 1;
  }
  return false;
}

/* Waits up to timeout_ms for a report line starting with prefix. */
static bool channel_wait(channel *from, const char *prefix, int timeout_ms, char *line,
                         size_t capacity) {
  int64_t deadline = now_ms() + timeout_ms;
  for (;;) {
    if (channel_match(from, prefix, line, capacity)) return true;
    int64_t left = deadline - now_ms();
    if (from->length == CHANNEL_BYTES) return false;
    /* With no time left, still one look at what the child has written by now. */
    struct pollfd readable = {.fd = from->from_child, .events = POLLIN};
    if (poll(&readable, 1, left > 0 ? (int)left : 0) <= 0) {
      if (left <= 0) return false;
      continue;
    }
    ssize_t got = read(from->from_child, from->seen + from->length, CHANNEL_BYTES - from->length);
    if (got <= 0) return channel_match(from, prefix, line, capacity);
    from->length += (size_t)got;
  }
}

/* The waits a healthy run needs, stretched for sanitizer builds. */
static int patient_ms(int timeout_ms) { return timeout_ms * keel_test_slowdown(); }

static void channel_send(channel *to, const char *command) {
  assert_int_equal(write(to->to_child, command, strlen(command)), (ssize_t)strlen(command));
}

/* The node's echo server: reports "listening", then "got <data>" for what it receives and
 * sends it back. */
static void echo_server(const keel__netns *net, size_t node, int commands, int reports,
                        const char *argument) {
  int listener = listener_open(keel__netns_node_address(net, node), ECHO_PORT);
  if (listener < 0) report(reports, "listen-failed %d\n", errno);
  if (listener >= 0) report(reports, "listening\n");
  int connection = accept(listener, NULL, NULL);
  for (;;) {
    char data[512];
    ssize_t got = recv(connection, data, sizeof data - 1, 0);
    if (got <= 0) {
      report(reports, "closed %d\n", got < 0 ? errno : 0);
      return;
    }
    data[got] = '\0';
    report(reports, "got %s\n", data);
    send(connection, data, (size_t)got, MSG_NOSIGNAL);
  }
}

/* A non-blocking connect given 500 ms: "dial connected", "dial pending" or "dial error N". */
static void client_dial(int reports, const char *address, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  struct sockaddr_in remote = socket_address(address, port);
  int error = connect(fd, (struct sockaddr *)&remote, sizeof remote) == 0 ? 0 : errno;
  if (error == EINPROGRESS) {
    struct pollfd writable = {.fd = fd, .events = POLLOUT};
    if (poll(&writable, 1, 500) == 0) {
      report(reports, "dial pending\n");
      close(fd);
      return;
    }
    socklen_t length = sizeof error;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
  }
  if (error == 0) report(reports, "dial connected\n");
  if (error != 0) report(reports, "dial error %d\n", error);
  close(fd);
}

/* One command line of the client: "send <text>", "check" or "dial <address> <port>". */
static void client_command(int connection, int reports, const char *command) {
  if (strncmp(command, "send ", 5) == 0) {
    ssize_t sent = send(connection, command + 5, strlen(command + 5), MSG_NOSIGNAL);
    report(reports, "sent %d\n", sent < 0 ? errno : 0);
  } else if (strcmp(command, "check") == 0) {
    /* A partition must look like silence: no error on the socket, no hang-up. */
    int error = 0;
    socklen_t length = sizeof error;
    getsockopt(connection, SOL_SOCKET, SO_ERROR, &error, &length);
    struct pollfd state = {.fd = connection, .events = POLLRDHUP};
    poll(&state, 1, 0);
    report(reports, "check %d %d\n", error, state.revents & (POLLERR | POLLHUP | POLLRDHUP));
  } else if (strncmp(command, "dial ", 5) == 0) {
    char address[INET_ADDRSTRLEN];
    int port = 0;
    if (sscanf(command + 5, "%15s %d", address, &port) == 2) client_dial(reports, address, port);
  }
}

/* Connects to node 0's echo server (argument: its address) and follows the test's
 * commands; what comes back is reported as "echo <data>". */
static void echo_client(const keel__netns *net, size_t node, int commands, int reports,
                        const char *argument) {
  int connection = connection_open(argument, ECHO_PORT);
  if (connection < 0) {
    report(reports, "connect-failed %d\n", errno);
    return;
  }
  report(reports, "connected\n");
  char pending[1024];
  size_t pending_length = 0;
  for (;;) {
    struct pollfd ready[2] = {{.fd = commands, .events = POLLIN},
                              {.fd = connection, .events = POLLIN}};
    if (poll(ready, 2, -1) < 0) continue;
    if (ready[1].revents != 0) {
      char data[512];
      ssize_t got = recv(connection, data, sizeof data - 1, 0);
      if (got <= 0) {
        report(reports, "closed %d\n", got < 0 ? errno : 0);
        return;
      }
      data[got] = '\0';
      report(reports, "echo %s\n", data);
    }
    if (ready[0].revents == 0) continue;
    ssize_t got = read(commands, pending + pending_length, sizeof pending - 1 - pending_length);
    if (got <= 0) return;
    pending_length += (size_t)got;
    pending[pending_length] = '\0';
    for (char *newline; (newline = strchr(pending, '\n')) != NULL;) {
      *newline = '\0';
      client_command(connection, reports, pending);
      pending_length -= (size_t)(newline + 1 - pending);
      memmove(pending, newline + 1, pending_length + 1);
    }
  }
}

/* Counts what one connection brings: "bytes <n> ns <first byte to end of file>". */
static void sink_server(const keel__netns *net, size_t node, int commands, int reports,
                        const char *argument) {
  int listener = listener_open(keel__netns_node_address(net, node), SINK_PORT);
  if (listener < 0) report(reports, "listen-failed %d\n", errno);
  if (listener >= 0) report(reports, "listening\n");
  int connection = accept(listener, NULL, NULL);
  static char data[1 << 16];
  unsigned long long bytes = 0;
  int64_t first_ns = 0;
  for (ssize_t got; (got = recv(connection, data, sizeof data, 0)) > 0;) {
    if (bytes == 0) first_ns = keel_now_ns();
    bytes += (unsigned long long)got;
  }
  report(reports, "bytes %llu ns %lld\n", bytes, (long long)(keel_now_ns() - first_ns));
}

/* Sends as fast as the link takes it for FLOOD_SECONDS, then closes. */
static void flood_client(const keel__netns *net, size_t node, int commands, int reports,
                         const char *argument) {
  int connection = connection_open(argument, SINK_PORT);
  static char data[1 << 16];
  unsigned long long bytes = 0;
  int64_t end_ns = keel_now_ns() + FLOOD_SECONDS * 1000000000LL;
  while (connection >= 0 && keel_now_ns() < end_ns) {
    ssize_t sent = send(connection, data, sizeof data, MSG_NOSIGNAL);
    if (sent <= 0) break;
    bytes += (unsigned long long)sent;
  }
  close(connection);
  report(reports, "flooded %llu\n", bytes);
}

/* Packets the node's interface has sent, from /proc/net/dev, which shows the namespace of
 * the reader (unlike /sys, mounted for the root namespace). */
static unsigned long long sent_packets(void) {
  FILE *file = fopen("/proc/net/dev", "re");
  char line[512];
  unsigned long long packets = 0;
  while (file != NULL && fgets(line, sizeof line, file) != NULL) {
    char *name = line + strspn(line, " ");
    if (strncmp(name, KEEL__NETNS_NODE_DEVICE ":", strlen(KEEL__NETNS_NODE_DEVICE) + 1) != 0)
      continue;
    sscanf(strchr(name, ':') + 1, "%*u %*u %*u %*u %*u %*u %*u %*u %*u %llu", &packets);
  }
  if (file != NULL) fclose(file);
  return packets;
}

/* Tries TCP and UDP to an address outside the job: "probe tcp=E udp=E sent=N ms=T". */
static void outside_probe(const keel__netns *net, size_t node, int commands, int reports,
                          const char *argument) {
  unsigned long long before = sent_packets();
  int64_t start = now_ms();
  int tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in outside = socket_address(OUTSIDE_ADDRESS, 9);
  int tcp_error = connect(tcp, (struct sockaddr *)&outside, sizeof outside) == 0 ? 0 : errno;
  int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int udp_error =
      sendto(udp, "x", 1, 0, (struct sockaddr *)&outside, sizeof outside) == 1 ? 0 : errno;
  int64_t elapsed = now_ms() - start;
  report(reports, "probe tcp=%d udp=%d sent=%llu ms=%lld\n", tcp_error, udp_error,
         sent_packets() - before, (long long)elapsed);
}

/* In the root namespace: makes a network of no nodes (a process has one network at a time,
 * so not the test's own), reports its bridge address, and holds it until the test closes the
 * command pipe or kills it (the fixture's clean-up of dead owners then removes it). */
static void service_network_hold(const keel__netns *net, size_t node, int commands, int reports,
                                 const char *argument) {
  (void)net, (void)node, (void)argument;
  keel__netns *service = NULL;
  char reason[KEEL__NETNS_REASON_BYTES] = "";
  if (keel__netns_create(0, 0, &service, reason, sizeof reason) != KEEL_OK) {
    report(reports, "service failed: %s\n", reason);
    return;
  }
  report(reports, "service %s\n", keel__netns_bridge_address(service));
  char byte;
  while (read(commands, &byte, 1) > 0) {
  }
  keel__netns_destroy(service);
}

/* Connects to argument (an address) at SERVICE_PORT and reports the errno, 0 on success. */
static void service_dial(const keel__netns *net, size_t node, int commands, int reports,
                         const char *argument) {
  (void)net, (void)node, (void)commands;
  int fd = connection_open(argument, SERVICE_PORT);
  report(reports, "dial %d\n", fd >= 0 ? 0 : errno);
}

/* ---- fixture */

static int fixture_setup(void **state) {
  fixture *made = calloc(1, sizeof *made);
  if (made == NULL) return -1;
  made->listener = -1;
  *state = made;
  return 0;
}

static int fixture_teardown(void **state) {
  fixture *made = *state;
  for (size_t i = 0; i < made->channel_count; i++) {
    child_end(made->channels[i].pid);
    close(made->channels[i].to_child);
    close(made->channels[i].from_child);
  }
  if (made->listener >= 0) close(made->listener);
  keel__netns_destroy(made->net);
  /* Planted names and another job's network: their owners are dead by now, and the
   * cleanup of dead owners takes what they left. */
  for (size_t i = 0; i < made->sleeper_count; i++) child_end(made->sleepers[i]);
  keel__netns_cleanup_stale(NULL);
  char own_namespace[64];
  snprintf(own_namespace, sizeof own_namespace, "keel-%ld-2", (long)getpid());
  if (owned_count(getpid()) > 0) run_text(NULL, 0, "ip", "netns", "delete", own_namespace, NULL);
  free(made);
  return 0;
}

static void network_create(fixture *state, size_t node_count, uint64_t rate) {
  char reason[KEEL__NETNS_REASON_BYTES] = "";
  keel_status status = keel__netns_create(node_count, rate, &state->net, reason, sizeof reason);
  if (status != KEEL_OK) fprintf(stderr, "test_netns: %s\n", reason);
  assert_int_equal(status, KEEL_OK);
  assert_int_equal(keel__netns_node_count(state->net), node_count);
}

/* Destroys the case's network and checks that none of it is left. */
static void network_destroy(fixture *state) {
  keel__netns_destroy(state->net);
  state->net = NULL;
  assert_int_equal(owned_count(getpid()), 0);
}

static bool in_bench_network(const char *address) {
  struct in_addr parsed;
  if (inet_pton(AF_INET, address, &parsed) != 1) return false;
  return (ntohl(parsed.s_addr) & 0xFFFE0000u) == 0xC6120000u;
}

/* ---- cases that run anywhere */

static void rate_parse_reads_tc_units(void **state) {
  static const struct {
    const char *text;
    uint64_t bits;
  } good[] = {
      {"10gbit", 10000000000ull}, {"1gbit", 1000000000ull},  {"500mbit", 500000000ull},
      {"1.5Gbit", 1500000000ull}, {"100Mbit", 100000000ull}, {"12mbps", 96000000ull},
      {"1gibit", 1073741824ull},  {"1000000", 1000000ull},   {"1tbit", 1000000000000ull},
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    uint64_t bits = 0;
    assert_int_equal(keel__netns_rate_parse(good[i].text, &bits), KEEL_OK);
    assert_true(bits == good[i].bits);
  }
  static const char *const bad[] = {"",        "fast",     "10 gbit", "-1mbit",   "0",
                                    "10gbitx", "inf",      "1e9bit",  "0x10mbit", "1kbit",
                                    "2tbit",   "1..5mbit", "mbit",    " 1gbit"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t bits = 7;
    assert_int_equal(keel__netns_rate_parse(bad[i], &bits), KEEL_EINVAL);
    assert_true(bits == 7);
  }
}

static void create_without_root_says_why(void **state) {
  if (geteuid() != 0) {
    keel__netns *net = NULL;
    char reason[KEEL__NETNS_REASON_BYTES] = "";
    assert_int_equal(keel__netns_create(2, 0, &net, reason, sizeof reason), KEEL_ENOTSUP);
    assert_null(net);
    assert_memory_equal(reason, "--netns needs root: ", 20);
    return;
  }
  /* As root: a child gives up root first. */
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(CHILD_LIFETIME_S);
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    keel__netns *net = NULL;
    char reason[KEEL__NETNS_REASON_BYTES] = "";
    keel_status status = keel__netns_create(2, 0, &net, reason, sizeof reason);
    fprintf(stderr, "test_netns: as uid 65534: %s\n", reason);
    _exit(status == KEEL_ENOTSUP && net == NULL && strncmp(reason, "--netns needs root: ", 20) == 0
              ? 0
              : 1);
  }
  int wait_status = 0;
  bool ended = keel_test_wait(pid, 10000, &wait_status);
  if (!ended) child_end(pid);
  assert_true(ended);
  assert_true(WIFEXITED(wait_status));
  assert_int_equal(WEXITSTATUS(wait_status), 0);
}

static void hung_command_is_killed(void **state) {
  /* `ip monitor` waits for netlink events until it is killed: a command that hangs. */
  static const char *const argv[] = {"ip", "monitor", NULL};
  char error[512] = "";
  int64_t start = now_ms();
  keel_status status = keel__netns_command_run(argv, 300 * 1000 * 1000, NULL, error, sizeof error);
  if (status == KEEL_ENOTFOUND) return; /* no iproute2 here: the skip message says so later */
  assert_int_equal(status, KEEL_ETIMEDOUT);
  assert_true(now_ms() - start < 5000);
  assert_non_null(strstr(error, "`ip monitor` did not finish"));
  /* Killed and reaped by pid: no child of this process is left, not even a zombie. */
  assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
  assert_int_equal(errno, ECHILD);

  static const char *const missing[] = {"keel-no-such-program", NULL};
  assert_int_equal(keel__netns_command_run(missing, COMMAND_TIMEOUT_NS, NULL, error, sizeof error),
                   KEEL_ENOTFOUND);
  assert_non_null(strstr(error, "keel-no-such-program is not in PATH"));
}

/* ---- cases that need root */

static void nodes_have_addresses_and_shaped_links(void **state) {
  fixture *made = *state;
  network_create(made, 3, RATE_10GBIT);
  char text[4096], expected[64];
  const char *bridge_address = keel__netns_bridge_address(made->net);
  assert_true(in_bench_network(bridge_address));
  for (size_t node = 0; node < 3; node++) {
    const char *inside = keel__netns_node_namespace(made->net, node);
    const char *address = keel__netns_node_address(made->net, node);
    const char *link = keel__netns_node_link(made->net, node);
    assert_true(in_bench_network(address));
    /* One /24 for the job. */
    assert_memory_equal(address, bridge_address, (size_t)(strrchr(address, '.') - address));
    for (size_t other = 0; other < node; other++)
      assert_string_not_equal(address, keel__netns_node_address(made->net, other));
    assert_true(run_text(text, sizeof text, "ip", "-n", inside, "-4", "-o", "address", "show",
                         "dev", KEEL__NETNS_NODE_DEVICE, NULL));
    snprintf(expected, sizeof expected, "inet %s/24", address);
    assert_non_null(strstr(text, expected));
    /* Its only route is the job's /24: no default route to anywhere else. */
    assert_true(run_text(text, sizeof text, "ip", "-n", inside, "-4", "route", "show", "table",
                         "all", NULL));
    assert_null(strstr(text, "default"));
    assert_true(run_text(text, sizeof text, "ip", "-n", inside, "-o", "link", "show", "lo", NULL));
    assert_non_null(strstr(text, "UP"));
    /* Both ends shaped: what the node is sent, and what it sends. */
    assert_true(run_text(text, sizeof text, "tc", "qdisc", "show", "dev", link, NULL));
    assert_non_null(strstr(text, "qdisc tbf"));
    assert_non_null(strstr(text, "rate 10Gbit"));
    assert_true(run_text(text, sizeof text, "tc", "-n", inside, "qdisc", "show", "dev",
                         KEEL__NETNS_NODE_DEVICE, NULL));
    assert_non_null(strstr(text, "qdisc tbf"));
    assert_non_null(strstr(text, "rate 10Gbit"));
  }
  char bridge[32];
  snprintf(bridge, sizeof bridge, "kb%ld", (long)getpid());
  assert_true(
      run_text(text, sizeof text, "ip", "-4", "-o", "address", "show", "dev", bridge, NULL));
  snprintf(expected, sizeof expected, "inet %s/24", bridge_address);
  assert_non_null(strstr(text, expected));
  network_destroy(made);
}

static void assert_partitioned(const keel__netns *net, size_t node, bool expected) {
  bool partitioned = !expected;
  assert_int_equal(keel__netns_partitioned(net, node, &partitioned), KEEL_OK);
  assert_int_equal(partitioned, expected);
}

static void tcp_survives_partition_and_heal(void **state) {
  fixture *made = *state;
  network_create(made, 3, RATE_100MBIT);
  char command[128];
  made->listener = listener_open(keel__netns_bridge_address(made->net), LAUNCHER_PORT);
  assert_true(made->listener >= 0);
  channel *server = child_start(made, 0, echo_server, NULL);
  assert_true(channel_wait(server, "listening", patient_ms(5000), NULL, 0));
  channel *client = child_start(made, 1, echo_client, keel__netns_node_address(made->net, 0));
  assert_true(channel_wait(client, "connected", patient_ms(5000), NULL, 0));

  channel_send(client, "send hello\n");
  assert_true(channel_wait(client, "sent 0", patient_ms(5000), NULL, 0));
  assert_true(channel_wait(server, "got hello", patient_ms(5000), NULL, 0));
  assert_true(channel_wait(client, "echo hello", patient_ms(5000), NULL, 0));
  /* The launcher's address is reachable from a node. */
  snprintf(command, sizeof command, "dial %s %d\n", keel__netns_bridge_address(made->net),
           LAUNCHER_PORT);
  channel_send(client, command);
  assert_true(channel_wait(client, "dial connected", patient_ms(5000), NULL, 0));

  assert_partitioned(made->net, 1, false);
  assert_int_equal(keel__netns_partition(made->net, 1), KEEL_OK);
  assert_int_equal(keel__netns_partition(made->net, 1), KEEL_OK); /* idempotent */
  assert_partitioned(made->net, 1, true);
  assert_partitioned(made->net, 0, false);
  channel_send(client, "send during\n");
  assert_true(channel_wait(client, "sent 0", patient_ms(5000), NULL, 0));
  /* Silence: nothing arrives, and the sender sees no error and no hang-up. */
  assert_false(channel_wait(server, "got during", 500, NULL, 0));
  char line[128];
  channel_send(client, "check\n");
  assert_true(channel_wait(client, "check", patient_ms(5000), line, sizeof line));
  assert_string_equal(line, "check 0 0");
  /* The launcher is cut off too, and a new connection neither completes nor fails. */
  channel_send(client, command);
  assert_true(channel_wait(client, "dial", patient_ms(5000), line, sizeof line));
  assert_string_equal(line, "dial pending");
  assert_false(channel_wait(server, "got during", 0, NULL, 0));

  assert_int_equal(keel__netns_heal(made->net, 1), KEEL_OK);
  assert_int_equal(keel__netns_heal(made->net, 1), KEEL_OK); /* idempotent */
  assert_partitioned(made->net, 1, false);
  /* The same connection carries on: TCP's next retransmission gets through. */
  assert_true(channel_wait(server, "got during", patient_ms(10000), NULL, 0));
  assert_true(channel_wait(client, "echo during", patient_ms(10000), NULL, 0));
  channel_send(client, "check\n");
  assert_true(channel_wait(client, "check", patient_ms(5000), line, sizeof line));
  assert_string_equal(line, "check 0 0");
  network_destroy(made);
}

static void no_route_beyond_the_job(void **state) {
  fixture *made = *state;
  network_create(made, 3, 0);
  channel *probe = child_start(made, 2, outside_probe, NULL);
  char line[128];
  assert_true(channel_wait(probe, "probe", patient_ms(5000), line, sizeof line));
  int tcp_error = -1, udp_error = -1;
  unsigned long long sent = 1;
  long long elapsed_ms = -1;
  assert_int_equal(sscanf(line, "probe tcp=%d udp=%d sent=%llu ms=%lld", &tcp_error, &udp_error,
                          &sent, &elapsed_ms),
                   4);
  /* Refused by the routing table: at once, and before any packet (ARP included) left. */
  assert_int_equal(tcp_error, ENETUNREACH);
  assert_int_equal(udp_error, ENETUNREACH);
  assert_true(sent == 0);
  assert_true(elapsed_ms < 1000);
  network_destroy(made);
}

/* A service on another network's bridge (etcd that keel chaos starts for a job on netns
 * nodes): unreachable from a node until keel__netns_route_add gives it a route, then
 * reachable; an address the nodes could never reach is refused with the reason. */
static void route_reaches_a_service_network(void **state) {
  fixture *made = *state;
  network_create(made, 1, 0);
  char line[128], service[INET_ADDRSTRLEN];
  channel *holder = child_start(made, ROOT_NAMESPACE, service_network_hold, NULL);
  assert_true(channel_wait(holder, "service", patient_ms(10000), line, sizeof line));
  snprintf(service, sizeof service, "%.15s", line + strlen("service "));
  if (!in_bench_network(service)) fprintf(stderr, "test_netns: %s\n", line);
  assert_true(in_bench_network(service));
  made->listener = listener_open(service, SERVICE_PORT);
  assert_true(made->listener >= 0);
  channel *before = child_start(made, 0, service_dial, service);
  assert_true(channel_wait(before, "dial", patient_ms(5000), line, sizeof line));
  int error = -1;
  assert_int_equal(sscanf(line, "dial %d", &error), 1);
  assert_int_equal(error, ENETUNREACH);
  char reason[KEEL__NETNS_REASON_BYTES] = "";
  assert_int_equal(keel__netns_route_add(made->net, "127.0.0.1", reason, sizeof reason),
                   KEEL_EINVAL);
  assert_non_null(strstr(reason, "127.0.0.1 is not one"));
  assert_int_equal(keel__netns_route_add(made->net, keel__netns_node_address(made->net, 0), reason,
                                         sizeof reason),
                   KEEL_EINVAL);
  assert_int_equal(keel__netns_route_add(made->net, "etcd-host", reason, sizeof reason),
                   KEEL_EINVAL);
  assert_int_equal(keel__netns_route_add(made->net, service, reason, sizeof reason), KEEL_OK);
  channel *after = child_start(made, 0, service_dial, service);
  assert_true(channel_wait(after, "dial", patient_ms(5000), line, sizeof line));
  assert_string_equal(line, "dial 0");
  network_destroy(made);
}

static void shaped_link_carries_its_rate(void **state) {
  fixture *made = *state;
  network_create(made, 2, RATE_100MBIT);
  channel *sink = child_start(made, 0, sink_server, NULL);
  assert_true(channel_wait(sink, "listening", patient_ms(5000), NULL, 0));
  child_start(made, 1, flood_client, keel__netns_node_address(made->net, 0));
  char line[128];
  assert_true(
      channel_wait(sink, "bytes", patient_ms(FLOOD_SECONDS * 1000 + 10000), line, sizeof line));
  unsigned long long bytes = 0;
  long long elapsed_ns = 0;
  assert_int_equal(sscanf(line, "bytes %llu ns %lld", &bytes, &elapsed_ns), 2);
  assert_true(bytes > 0 && elapsed_ns > 0);
  double megabits = (double)bytes * 8 / ((double)elapsed_ns / 1e9) / 1e6;
  printf("test_netns: a 100mbit link carried %.1f Mbit/s (%.1f MB in %.2f s)\n", megabits,
         (double)bytes / 1e6, (double)elapsed_ns / 1e9);
  /* A sanity bound only: timings on a shared machine are not the test's business. */
  assert_true(megabits < 2 * RATE_100MBIT / 1e6);
  network_destroy(made);
}

/* A pid no process has any more: a child that has exited and been reaped. */
static pid_t dead_pid(void) {
  for (;;) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(0);
    child_end(pid);
    if (kill(pid, 0) != 0 && errno == ESRCH) return pid;
  }
}

static pid_t sleeper_start(fixture *state) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(CHILD_LIFETIME_S);
    pause();
    _exit(0);
  }
  state->sleepers[state->sleeper_count++] = pid;
  return pid;
}

/* Names as a run of owner would have left them: namespaces, a veth pair, a bridge. */
static void names_plant(pid_t owner, size_t namespaces, bool with_veth, const char *stamp) {
  char name[64], link[32], bridge[32];
  for (size_t i = 0; i < namespaces; i++) {
    snprintf(name, sizeof name, "keel-%ld-%zu", (long)owner, i);
    assert_true(run_text(NULL, 0, "ip", "netns", "add", name, NULL));
  }
  snprintf(bridge, sizeof bridge, "kb%ld", (long)owner);
  assert_true(run_text(NULL, 0, "ip", "link", "add", "name", bridge, "type", "bridge", NULL));
  if (stamp != NULL)
    assert_true(run_text(NULL, 0, "ip", "link", "set", "dev", bridge, "alias", stamp, NULL));
  if (!with_veth) return;
  snprintf(name, sizeof name, "keel-%ld-0", (long)owner);
  snprintf(link, sizeof link, "kv%ldn0", (long)owner);
  assert_true(run_text(NULL, 0, "ip", "link", "add", link, "type", "veth", "peer", "name",
                       KEEL__NETNS_NODE_DEVICE, "netns", name, NULL));
  assert_true(run_text(NULL, 0, "ip", "link", "set", "dev", link, "master", bridge, NULL));
}

static void stale_names_of_gone_owners_are_removed(void **state) {
  fixture *made = *state;
  pid_t dead = dead_pid();
  pid_t live = sleeper_start(made);
  pid_t reused = sleeper_start(made);
  names_plant(dead, 2, true, NULL);
  /* Alive, with no stamp to compare: nothing tells it is stale, so it stays. */
  names_plant(live, 1, false, NULL);
  /* Alive, but not the process that stamped the bridge: the pid was reused. */
  names_plant(reused, 1, false, KEEL__NETNS_OWNER_STAMP "1");
  assert_int_equal(owned_count(dead), 4);
  assert_int_equal(owned_count(reused), 2);

  /* The next run cleans up as it creates its own. */
  network_create(made, 1, 0);
  assert_int_equal(owned_count(dead), 0);
  assert_int_equal(owned_count(reused), 0);
  assert_int_equal(owned_count(live), 2);
  network_destroy(made);

  child_end(live);
  size_t removed = 0;
  assert_int_equal(keel__netns_cleanup_stale(&removed), KEEL_OK);
  assert_true(removed >= 2);
  assert_int_equal(owned_count(live), 0);
}

static void failed_create_leaves_nothing(void **state) {
  fixture *made = *state;
  /* A namespace in the way of node 2: the bridge and nodes 0 and 1 are made, then undone. */
  char blocker[64];
  snprintf(blocker, sizeof blocker, "keel-%ld-2", (long)getpid());
  assert_true(run_text(NULL, 0, "ip", "netns", "add", blocker, NULL));
  keel__netns *net = NULL;
  char reason[KEEL__NETNS_REASON_BYTES] = "";
  assert_int_equal(keel__netns_create(3, RATE_100MBIT, &net, reason, sizeof reason), KEEL_EIO);
  assert_null(net);
  assert_non_null(strstr(reason, blocker));
  assert_null(strchr(reason, '\n'));
  assert_int_equal(owned_count(getpid()), 1);
  assert_true(run_text(NULL, 0, "ip", "netns", "delete", blocker, NULL));
  assert_int_equal(owned_count(getpid()), 0);

  /* One network per process at a time: the names carry the pid. */
  network_create(made, 1, 0);
  assert_int_equal(keel__netns_create(1, 0, &net, reason, sizeof reason), KEEL_EEXIST);
  assert_null(net);
  network_destroy(made);
}

/* Another job, in a process of its own: reports "bridge <address>", then destroys its
 * network when the test writes a line, and reports "destroyed". */
static void other_job(int commands, int reports) {
  keel__netns *net = NULL;
  char reason[KEEL__NETNS_REASON_BYTES] = "";
  if (keel__netns_create(2, RATE_100MBIT, &net, reason, sizeof reason) != KEEL_OK) {
    report(reports, "failed %s\n", reason);
    return;
  }
  report(reports, "bridge %s\n", keel__netns_bridge_address(net));
  char line[8];
  ssize_t ignored = read(commands, line, sizeof line);
  (void)ignored;
  keel__netns_destroy(net);
  report(reports, "destroyed\n");
}

static void two_jobs_at_once_get_their_own_subnets(void **state) {
  fixture *made = *state;
  assert_true(made->channel_count < CHANNELS_MAX);
  int commands[2], reports[2];
  assert_int_equal(pipe2(commands, O_CLOEXEC), 0);
  assert_int_equal(pipe2(reports, O_CLOEXEC), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(CHILD_LIFETIME_S);
    other_job(commands[0], reports[1]);
    _exit(0);
  }
  close(commands[0]);
  close(reports[1]);
  channel *other = &made->channels[made->channel_count++];
  *other = (channel){.pid = pid, .to_child = commands[1], .from_child = reports[0]};
  /* Both create at the same time: the host lock makes one see the other's /24. */
  network_create(made, 2, RATE_100MBIT);
  char line[128];
  assert_true(channel_wait(other, "bridge", patient_ms(20000), line, sizeof line));
  const char *other_bridge = line + strlen("bridge ");
  const char *own_bridge = keel__netns_bridge_address(made->net);
  assert_true(in_bench_network(other_bridge));
  size_t prefix = (size_t)(strrchr(own_bridge, '.') - own_bridge);
  assert_false(strncmp(other_bridge, own_bridge, prefix + 1) == 0);
  assert_int_equal(owned_count(pid), 5);
  channel_send(other, "destroy\n");
  assert_true(channel_wait(other, "destroyed", patient_ms(20000), NULL, 0));
  assert_int_equal(owned_count(pid), 0);
  network_destroy(made);
}

/* Why the root cases cannot run here; NULL when they can. */
static const char *root_cases_blocked(char *why, size_t capacity) {
  if (geteuid() != 0) {
    snprintf(why, capacity, "needs root (runs as uid %u)", (unsigned)geteuid());
    return why;
  }
  if (!run_text(NULL, 0, "ip", "-V", NULL) || !run_text(NULL, 0, "tc", "-V", NULL)) {
    snprintf(why, capacity, "needs ip and tc of iproute2");
    return why;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) _exit(unshare(CLONE_NEWNET) == 0 ? 0 : errno);
  int wait_status = 0;
  if (pid < 0 || !keel_test_wait(pid, 10000, &wait_status) || !WIFEXITED(wait_status) ||
      WEXITSTATUS(wait_status) != 0) {
    if (pid > 0) child_end(pid);
    snprintf(why, capacity, "cannot make a network namespace here (%s)",
             strerror(WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : EPERM));
    return why;
  }
  return NULL;
}

int main(void) {
  /* A child that died must not take the test with it through a write to its pipe. */
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest anywhere[] = {
      cmocka_unit_test(rate_parse_reads_tc_units),
      cmocka_unit_test(create_without_root_says_why),
      cmocka_unit_test(hung_command_is_killed),
  };
  int failures = cmocka_run_group_tests_name("netns anywhere", anywhere, NULL, NULL);
  char why[256];
  if (root_cases_blocked(why, sizeof why) != NULL) {
    printf("test_netns: skipped: %s\n", why);
    return failures != 0 ? failures : 77;
  }
  const struct CMUnitTest as_root[] = {
      cmocka_unit_test_setup_teardown(nodes_have_addresses_and_shaped_links, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(tcp_survives_partition_and_heal, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(no_route_beyond_the_job, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(route_reaches_a_service_network, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(shaped_link_carries_its_rate, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(stale_names_of_gone_owners_are_removed, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(failed_create_leaves_nothing, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(two_jobs_at_once_get_their_own_subnets, fixture_setup,
                                      fixture_teardown),
  };
  return failures + cmocka_run_group_tests_name("netns as root", as_root, NULL, NULL);
}
