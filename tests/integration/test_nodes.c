/* Jobs of several nodes on this host (keel run --agents): an agent per node, each with its
 * workers in its process group. A whole node killed at once (keel inject kill-node) is
 * dropped by shrink or replaced by a spare node, bit for bit; a lone dead agent takes its
 * node with it; the flags and Slurm's environment that shape such a job are read right. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "keel/core.h"

#include "test_events.h"
#include "test_job.h"
#include "test_support.h"

#define MAX_EVENTS 20000
#define STEPS "300"
#define STEP_COUNT 300

static const char *const toy_args[] = {"--steps", STEPS, "--params", "100000", NULL};

/* An agent fences its node when the store has not confirmed its lease for 5/8 of the
 * heartbeat. Where a case is not about that timing, a long heartbeat keeps a store that a
 * loaded machine (or a sanitizer) stalls for a second from fencing a healthy node; the kills
 * of these cases reach the store through the supervisor, not through leases. */
static const char *heartbeat_lenient(void) {
  static char text[16];
  return keel_test_seconds_flag(6, text, sizeof text);
}

static void wait_node_last_event(const char *job_id, int node, char *event, size_t capacity);

/* The default heartbeat (2 s), stretched under sanitizers: the partition case's timing. */
static int heartbeat_default_ms(void) { return 2000 * keel_test_slowdown(); }

typedef struct progress_want {
  long long step;
} progress_want;

static bool progress_reached(const keel_test_events *log, void *context) {
  const progress_want *want = context;
  for (size_t i = 0; i < log->count; i++)
    if (keel_test_event_is(log->lines[i], "progress") &&
        keel_test_event_long(log->lines[i], "step") >= want->step)
      return true;
  return false;
}

/* Starts the job of toy_train with args and waits until it trains (step 20), then gives
 * its job id. */
static pid_t job_start_training_with(keel_test_job *job, const char *const *flags,
                                     const char *const *args, char *job_id, size_t capacity) {
  assert_true(keel_test_job_prepare(job, "keel-nodes"));
  pid_t launcher =
      keel_test_job_start(job, "120s", flags, keel_test_program("toy_train"), args, NULL);
  assert_true(launcher > 0);
  progress_want want = {20};
  if (!keel_test_events_wait(job->events, MAX_EVENTS, progress_reached, &want, 10,
                             30000 * keel_test_slowdown())) {
    keel_test_print_file("output", job->output);
    fail_msg("the job did not reach step 20");
  }
  keel_test_events log;
  keel_test_events_read(job->events, MAX_EVENTS, &log);
  assert_true(keel_test_events_job_id(&log, job_id, capacity));
  keel_test_events_free(&log);
  return launcher;
}

static pid_t job_start_training(keel_test_job *job, const char *const *flags, char *job_id,
                                size_t capacity) {
  return job_start_training_with(job, flags, toy_args, job_id, capacity);
}

static int job_finish(const keel_test_job *job, pid_t launcher) {
  int status = -1;
  if (!keel_test_wait(launcher, 90000 * keel_test_slowdown(), &status)) {
    keel_test_print_file("output", job->output);
    fail_msg("the job did not end");
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The job ended 0; its output is shown when it did not. */
static void job_finish_ok(const keel_test_job *job, pid_t launcher) {
  int code = job_finish(job, launcher);
  if (code != 0) keel_test_print_file("output", job->output);
  assert_int_equal(code, 0);
}

static void kill_node(const keel_test_job *job, const char *job_id, const char *node) {
  const char *args[] = {"inject", "kill-node", node, "--job", job_id, NULL};
  assert_int_equal(keel_test_keel(args, job->output, 10000), 0);
}

/* The node_lost event of node, which says how many of its processes the store still showed
 * (and were then marked dead). */
static long long node_lost_processes(const keel_test_events *log, long long node) {
  for (size_t i = 0; i < log->count; i++)
    if (keel_test_event_is(log->lines[i], "node_lost") &&
        keel_test_event_long(log->lines[i], "node") == node)
      return keel_test_event_long(log->lines[i], "processes");
  return -1;
}

/* A training job of flags whose node is killed once it trains: it must end with code, its
 * events then in log. */
static void job_through_a_killed_node(const char *const *flags, const char *node, int code,
                                      keel_test_job *job, keel_test_events *log) {
  char job_id[32];
  pid_t launcher = job_start_training(job, flags, job_id, sizeof job_id);
  kill_node(job, job_id, node);
  int ended = job_finish(job, launcher);
  if (ended != code) keel_test_print_file("output", job->output);
  assert_int_equal(ended, code);
  keel_test_events_read(job->events, MAX_EVENTS, log);
}

static void kill_node_shrinks_by_the_whole_node(void **state) {
  (void)state;
  const char *const flags[] = {"--agents",    "--nnodes",          "3", "--nproc-per-node", "2",
                               "--heartbeat", heartbeat_lenient(), NULL};
  keel_test_job job;
  keel_test_events log;
  job_through_a_killed_node(flags, "2", 0, &job, &log);
  keel_test_toy_assert_consistent(job.output, 4, STEP_COUNT);
  /* The killed node's two workers were still in the store: the supervisor marked them. */
  assert_int_equal(node_lost_processes(&log, 2), 2);
  const char *recovery = keel_test_events_find(&log, "recovery", 0);
  assert_non_null(recovery);
  assert_non_null(strstr(recovery, "\"failed\":[4,5]"));
  assert_int_equal(keel_test_events_count(&log, "agent_end"), 2);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* The only worker node killed: its ranks' state is nowhere else, so the spare node's spares
 * cannot take it, and the job fails with a ranks_lost event (it used to end 0 once no
 * process held a rank). Whether the killed node starts again as a spare node here is a race
 * with the job's end (no respawn once job/done is written): the replace case checks it. */
static void losing_every_holder_of_the_state_fails_the_job(void **state) {
  (void)state;
  const char *const flags[] = {
      "--agents",     "--nnodes", "1",           "--nproc-per-node",  "2", "--spare-nodes", "1",
      "--on-failure", "replace",  "--heartbeat", heartbeat_lenient(), NULL};
  keel_test_job job;
  keel_test_events log;
  job_through_a_killed_node(flags, "0", 1, &job, &log);
  assert_non_null(keel_test_events_find(&log, "ranks_lost", -1));
  assert_null(keel_test_events_find(&log, "finish", -1));
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* A port nobody listens on now (the kernel's pick for a socket closed at once). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in address = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t length = sizeof address;
  assert_int_equal(bind(fd, (struct sockaddr *)&address, sizeof address), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&address, &length), 0);
  close(fd);
  return ntohs(address.sin_port);
}

/* GET /metrics from 127.0.0.1:port into text; false when nobody answers. */
static bool metrics_scrape(int port, char *text, size_t capacity) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in address = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bool ok = connect(fd, (struct sockaddr *)&address, sizeof address) == 0;
  static const char request[] = "GET /metrics HTTP/1.0\r\n\r\n";
  ok = ok && send(fd, request, sizeof request - 1, 0) == (ssize_t)(sizeof request - 1);
  size_t used = 0;
  ssize_t got = 0;
  while (ok && used + 1 < capacity && (got = recv(fd, text + used, capacity - 1 - used, 0)) > 0)
    used += (size_t)got;
  text[used] = '\0';
  close(fd);
  return ok && used > 0;
}

/* Scrapes until the root (the new one, when the old died with its node) reports a lost node
 * and, once its own node's workers have reported a step of the new epoch, the world whole
 * again (a root on the spare node hears its first progress lines only after the recovery). */
static bool metrics_show_lost_node(int port, char *text, size_t capacity) {
  for (int attempt = 0; attempt < 200 * keel_test_slowdown(); attempt++) {
    if (metrics_scrape(port, text, capacity) && strstr(text, "\nkeel_nodes_lost_total 1\n") &&
        strstr(text, "\nkeel_world_size 4\n"))
      return true;
    usleep(50 * 1000);
  }
  return false;
}

static void kill_node_replaced_by_a_spare_node_is_exact(void **state) {
  (void)state;
  keel_test_job baseline;
  assert_true(keel_test_job_prepare(&baseline, "keel-nodes"));
  static const char *const plain[] = {"-n", "4", NULL};
  assert_int_equal(keel_test_job_run(&baseline, "60s", 90000, plain, keel_test_program("toy_train"),
                                     toy_args, NULL),
                   0);
  unsigned clean_crc = keel_test_toy_assert_consistent(baseline.output, 4, STEP_COUNT);

  char port[16];
  int port_number = free_port();
  snprintf(port, sizeof port, "%d", port_number);
  const char *const flags[] = {"--agents",
                               "--nnodes",
                               "2",
                               "--nproc-per-node",
                               "2",
                               "--spare-nodes",
                               "1",
                               "--on-failure",
                               "replace",
                               "--metrics-port",
                               port,
                               "--heartbeat",
                               heartbeat_lenient(),
                               NULL};
  keel_test_job job;
  char job_id[32];
  pid_t launcher = job_start_training(&job, flags, job_id, sizeof job_id);
  /* keel status shows the three nodes, the spare one, and exactly one root among them. */
  char status_path[300];
  snprintf(status_path, sizeof status_path, "%s/status.txt", job.folder);
  const char *status_args[] = {"status", "--job", job_id, NULL};
  assert_int_equal(keel_test_keel(status_args, status_path, 10000), 0);
  char *status = keel_test_read_file(status_path, NULL);
  assert_non_null(status);
  size_t roots = 0;
  for (const char *at = strstr(status, ",root"); at != NULL; at = strstr(at + 1, ",root")) roots++;
  assert_int_equal(roots, 1);
  assert_non_null(strstr(status, "spare"));
  assert_non_null(strstr(status, "\n2 "));
  /* Each node's lease: age since the last keepalive / ttl (lenient heartbeat: 6 s, slowed). */
  char ttl_text[24];
  snprintf(ttl_text, sizeof ttl_text, "/%d.0s ", 6 * keel_test_slowdown());
  size_t leases = 0;
  for (const char *at = strstr(status, ttl_text); at != NULL; at = strstr(at + 1, ttl_text))
    leases++;
  if (leases != 3)
    fail_msg("keel status shows %zu node leases of %s:\n%s", leases, ttl_text, status);
  free(status);
  char last_event[64];
  wait_node_last_event(job_id, 0, last_event, sizeof last_event);
  kill_node(&job, job_id, "1");
  /* The root serves Prometheus' text: the lost node, and the world whole again. */
  char metrics[16384];
  if (!metrics_show_lost_node(port_number, metrics, sizeof metrics)) print_message("%s\n", metrics);
  assert_non_null(strstr(metrics, "\nkeel_nodes_lost_total 1\n"));
  assert_non_null(strstr(metrics, "\nkeel_world_size 4\n"));
  assert_non_null(strstr(metrics, "keel_recovery_seconds_bucket{le=\"+Inf\"}"));
  assert_int_equal(job_finish(&job, launcher), 0);
  assert_int_equal(keel_test_toy_assert_consistent(job.output, 4, STEP_COUNT), clean_crc);
  keel_test_events log;
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  assert_int_equal(node_lost_processes(&log, 1), 2);
  const char *recovery = keel_test_events_find(&log, "recovery", 0);
  assert_non_null(recovery);
  assert_non_null(strstr(recovery, "\"replaced\":2"));
  /* The killed node came back as a spare node while the job trained (--spare-nodes). */
  const char *respawn = keel_test_events_find(&log, "node_respawn", -1);
  assert_non_null(respawn);
  assert_int_equal(keel_test_event_long(respawn, "node"), 1);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* Only the agent dies: its workers see their launcher gone and leave (exit 76), and the
 * node is dropped once its group is empty. */
static void a_lone_dead_agent_takes_its_node(void **state) {
  (void)state;
  const char *const flags[] = {"--agents",    "--nnodes",          "2", "--nproc-per-node", "2",
                               "--heartbeat", heartbeat_lenient(), NULL};
  keel_test_job job;
  char job_id[32];
  pid_t launcher = job_start_training(&job, flags, job_id, sizeof job_id);
  keel_test_events log;
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  pid_t agent = -1;
  for (size_t i = 0; i < log.count; i++)
    if (keel_test_event_is(log.lines[i], "agent_spawn") &&
        keel_test_event_long(log.lines[i], "node") == 1)
      agent = (pid_t)keel_test_event_long(log.lines[i], "pid");
  keel_test_events_free(&log);
  assert_true(agent > 1 && keel_test_pid_exists(agent));
  assert_int_equal(kill(agent, SIGKILL), 0);
  assert_int_equal(job_finish(&job, launcher), 0);
  keel_test_toy_assert_consistent(job.output, 2, STEP_COUNT);
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  assert_non_null(keel_test_events_find(&log, "node_lost", -1));
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* The first event name about node (its "node" field), or NULL. */
static const char *node_event(const keel_test_events *log, const char *name, long long node) {
  for (size_t i = 0; i < log->count; i++)
    if (keel_test_event_is(log->lines[i], name) &&
        keel_test_event_long(log->lines[i], "node") == node)
      return log->lines[i];
  return NULL;
}

/* The t_ns of the first event name about node, or -1. */
static long long node_event_time(const keel_test_events *log, const char *name, long long node) {
  const char *line = node_event(log, name, node);
  return line != NULL ? keel_test_event_long(line, "t_ns") : -1;
}

/* The namespace cases need root (ip netns); without it they say so and skip. */
static void skip_without_root(void) {
  if (geteuid() == 0) return;
  print_message("skipped: --netns needs root\n");
  skip();
}

/* Each node a network namespace: node 2 is cut off (silently, as a real partition). Its
 * agent stops hearing the store and fences it, killing its workers before the lease ends;
 * only then does the root decide the node is lost, and the rest shrinks and finishes. */
static void partitioned_node_fences_itself_before_it_is_replaced(void **state) {
  (void)state;
  skip_without_root();
  char heartbeat[16];
  snprintf(heartbeat, sizeof heartbeat, "%dms", heartbeat_default_ms());
  const char *const flags[] = {"--netns",          "--link-rate", "1gbit",       "--nnodes", "3",
                               "--nproc-per-node", "2",           "--heartbeat", heartbeat,  NULL};
  keel_test_job job;
  char job_id[32];
  pid_t launcher = job_start_training(&job, flags, job_id, sizeof job_id);
  const char *partition[] = {"inject", "partition", "2", "--job", job_id, NULL};
  assert_int_equal(keel_test_keel(partition, job.output, 10000), 0);
  job_finish_ok(&job, launcher);
  keel_test_toy_assert_consistent(job.output, 4, STEP_COUNT);
  keel_test_events log;
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  long long fenced_at = node_event_time(&log, "node_fence", 2);
  long long decided_at = node_event_time(&log, "root_decision", 2);
  assert_true(fenced_at > 0 && decided_at > fenced_at);
  /* The fence's event comes once its processes are dead: both workers of node 2 (uids 4
   * and 5) were killed by it, and were gone before the root declared them dead, so no
   * worker of the fenced node ran beside the rest's recovery. */
  const char *fence = keel_test_events_find(&log, "node_fence", -1);
  assert_int_equal(keel_test_event_long(fence, "killed"), 2);
  assert_int_equal(keel_test_event_long(fence, "dead"), 2);
  assert_true(keel_test_event_long(fence, "fenced_ms") < heartbeat_default_ms());
  for (long uid = 4; uid <= 5; uid++) {
    const char *exit = keel_test_events_find(&log, "exit", uid);
    assert_non_null(exit);
    assert_non_null(strstr(exit, "\"signal\":\"SIGKILL\""));
  }
  const char *recovery = keel_test_events_find(&log, "recovery", 0);
  assert_non_null(recovery);
  assert_non_null(strstr(recovery, "\"failed\":[4,5]"));
  /* Detected within the lease's time to live (2 s) of the fence, not at a collective's
   * 30 s deadline. */
  assert_true(keel_test_event_long(recovery, "t_ns") - fenced_at <
              (long long)heartbeat_default_ms() * 1000000LL);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

typedef struct delay_want {
  long long delay_ms;
  long long progress_after; /* with delay_ms set: and a progress line of step >= this */
} delay_want;

/* The send_delay line of node 1's worker (uid 1) that reports want->delay_ms. */
static const char *delay_line(const keel_test_events *log, long long delay_ms) {
  for (size_t i = 0; i < log->count; i++)
    if (keel_test_event_is(log->lines[i], "send_delay") &&
        keel_test_event_long(log->lines[i], "uid") == 1 &&
        keel_test_event_long(log->lines[i], "delay_ms") == delay_ms)
      return log->lines[i];
  return NULL;
}

static bool delay_applied(const keel_test_events *log, void *context) {
  const delay_want *want = context;
  if (delay_line(log, want->delay_ms) == NULL) return false;
  progress_want progress = {want->progress_after};
  return want->progress_after == 0 || progress_reached(log, &progress);
}

/* The progress lines of rank 0 between from_ns and to_ns: the mean time of a step between the
 * first and the last of them, in ms (-1 with fewer than two). */
static double step_ms_between(const keel_test_events *log, long long from_ns, long long to_ns) {
  long long first_t = -1, first_step = 0, last_t = -1, last_step = 0;
  for (size_t i = 0; i < log->count; i++) {
    const char *line = log->lines[i];
    if (!keel_test_event_is(line, "progress") || keel_test_event_long(line, "rank") != 0) continue;
    long long t = keel_test_event_long(line, "t_ns"), step = keel_test_event_long(line, "step");
    if (t <= from_ns || t >= to_ns) continue;
    if (first_t < 0) first_t = t, first_step = step;
    last_t = t, last_step = step;
  }
  if (first_t < 0 || last_step <= first_step) return -1;
  return (double)(last_t - first_t) / 1e6 / (double)(last_step - first_step);
}

/* `keel inject delay 1 40ms` holds every frame node 1's worker sends for 40 ms, so every
 * allreduce (which needs its contribution) takes at least that long; `delay 1 0` ends it. The
 * delay is keel's own (this kernel has no netem), on its tcp links. */
static void delayed_node_slows_every_step_until_it_ends(void **state) {
  (void)state;
  const char *const flags[] = {"--agents",    "--nnodes",          "2", "--nproc-per-node", "1",
                               "--heartbeat", heartbeat_lenient(), NULL};
  setenv("KEEL_TRANSPORT", "tcp", 1);
  keel_test_job job;
  char job_id[32];
  pid_t launcher = job_start_training(&job, flags, job_id, sizeof job_id);
  unsetenv("KEEL_TRANSPORT");
  const char *delay[] = {"inject", "delay", "1", "40ms", "--job", job_id, NULL};
  assert_int_equal(keel_test_keel(delay, job.output, 10000), 0);
  keel_test_events log;
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  long long step_now = 0;
  for (size_t i = 0; i < log.count; i++)
    if (keel_test_event_is(log.lines[i], "progress"))
      step_now = keel_test_event_long(log.lines[i], "step");
  keel_test_events_free(&log);
  /* Ten delayed steps take 400 ms at least: progress lines (every 100 ms) fall among them. */
  delay_want delayed = {40, step_now + 10};
  if (!keel_test_events_wait(job.events, MAX_EVENTS, delay_applied, &delayed, 10,
                             30000 * keel_test_slowdown()))
    fail_msg("node 1's worker did not apply the delay, or the job stopped making progress");
  const char *end_delay[] = {"inject", "delay", "1", "0", "--job", job_id, NULL};
  assert_int_equal(keel_test_keel(end_delay, job.output, 10000), 0);
  delay_want ended = {0, 0};
  if (!keel_test_events_wait(job.events, MAX_EVENTS, delay_applied, &ended, 10,
                             30000 * keel_test_slowdown()))
    fail_msg("node 1's worker did not end the delay");
  job_finish_ok(&job, launcher);
  keel_test_toy_assert_consistent(job.output, 2, STEP_COUNT);
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  long long delayed_at = keel_test_event_long(delay_line(&log, 40), "t_ns");
  long long ended_at = keel_test_event_long(delay_line(&log, 0), "t_ns");
  double step_ms = step_ms_between(&log, delayed_at, ended_at);
  print_message("steps under the 40 ms delay: %.1f ms each\n", step_ms);
  assert_true(step_ms >= 40.0);
  /* A delay is no failure: nobody was declared dead, nothing recovered. */
  assert_null(keel_test_events_find(&log, "recovery", -1));
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* The bits of a job depend only on its contributions, ranks and world size: the same job
 * over shared memory, over tcp on one host, and across nodes that are network namespaces
 * (tcp between hosts of their own) ends with the same parameters. */
static void same_bits_over_shm_tcp_and_namespaces(void **state) {
  (void)state;
  skip_without_root();
  static const char *const short_args[] = {"--steps", "60", "--params", "100000", NULL};
  static const char *const plain[] = {"-n", "4", NULL};
  const char *const nodes[] = {"--netns",     "--nnodes",          "2", "--nproc-per-node", "2",
                               "--heartbeat", heartbeat_lenient(), NULL};
  keel_test_job shm, tcp, netns;
  assert_true(keel_test_job_prepare(&shm, "keel-nodes"));
  assert_true(keel_test_job_prepare(&tcp, "keel-nodes"));
  assert_true(keel_test_job_prepare(&netns, "keel-nodes"));
  const char *program = keel_test_program("toy_train");
  assert_int_equal(keel_test_job_run(&shm, "60s", 90000, plain, program, short_args, NULL), 0);
  setenv("KEEL_TRANSPORT", "tcp", 1);
  int tcp_code = keel_test_job_run(&tcp, "60s", 90000, plain, program, short_args, NULL);
  unsetenv("KEEL_TRANSPORT");
  assert_int_equal(tcp_code, 0);
  assert_int_equal(keel_test_job_run(&netns, "60s", 90000, nodes, program, short_args, NULL), 0);
  unsigned shm_crc = keel_test_toy_assert_consistent(shm.output, 4, 60);
  assert_int_equal(keel_test_toy_assert_consistent(tcp.output, 4, 60), shm_crc);
  assert_int_equal(keel_test_toy_assert_consistent(netns.output, 4, 60), shm_crc);
}

/* Runs keel with args (NULL-terminated) and extra environment; returns its exit code, its
 * output in output (capacity bytes). */
static int keel_output(const char *const *args, char *const *env, char *output, size_t capacity) {
  const char *folder = keel_test_tempdir("keel-nodes-flags");
  assert_non_null(folder);
  char path[300];
  snprintf(path, sizeof path, "%s/output.txt", folder);
  char *argv[24] = {(char *)keel_test_bin("keel")};
  for (size_t i = 0; args[i] != NULL && i < 22; i++) argv[i + 1] = (char *)args[i];
  int code = keel_test_run(argv, env, path, 20000);
  char *text = keel_test_read_file(path, NULL);
  snprintf(output, capacity, "%s", text != NULL ? text : "");
  free(text);
  return code;
}

/* The LAST EVENT column (the 7th) of node's line in keel status's output into event, or
 * false when the line is not there. */
static bool status_node_event(const char *status, int node, char *event, size_t capacity) {
  char start[16], columns[7][64];
  snprintf(start, sizeof start, "\n%d ", node);
  const char *line = strstr(status, start);
  if (line == NULL) return false;
  if (sscanf(line + 1, "%63s %63s %63s %63s %63s %63s %63s", columns[0], columns[1], columns[2],
             columns[3], columns[4], columns[5], columns[6]) != 7)
    return false;
  snprintf(event, capacity, "%s", columns[6]);
  return true;
}

/* Polls keel status until node's line names a last event (its agent puts it after its next
 * keepalive); that event, or fails. */
static void wait_node_last_event(const char *job_id, int node, char *event, size_t capacity) {
  const char *const status_args[] = {"status", "--job", job_id, NULL};
  char status[4096] = "";
  int64_t deadline = keel_deadline_after_ns((int64_t)20000 * keel_test_slowdown() * 1000000);
  while (keel_now_ns() < deadline) {
    assert_int_equal(keel_output(status_args, NULL, status, sizeof status), 0);
    if (status_node_event(status, node, event, capacity) && strcmp(event, "-") != 0) return;
    usleep(100 * 1000);
  }
  fail_msg("keel status shows no last event of node %d:\n%s", node, status);
}

typedef struct event_want {
  const char *name;
  long long node; /* -1: any */
  size_t count;   /* at least this many */
} event_want;

static bool events_reached(const keel_test_events *log, void *context) {
  const event_want *want = context;
  size_t count = 0;
  for (size_t i = 0; i < log->count; i++)
    count += keel_test_event_is(log->lines[i], want->name) &&
             (want->node < 0 || keel_test_event_long(log->lines[i], "node") == want->node);
  return count >= want->count;
}

static void events_wait(const keel_test_job *job, event_want want) {
  if (!keel_test_events_wait(job->events, MAX_EVENTS, events_reached, &want, 10,
                             60000 * keel_test_slowdown())) {
    keel_test_print_file("output", job->output);
    fail_msg("no %zu %s event(s) of node %lld", want.count, want.name, want.node);
  }
}

/* With --rejoin-wait, a partitioned node fences itself as ever; after the heal its agent
 * starts again (same pid) as a spare node whose spares take the node's unused uids, and the
 * job, shrunk meanwhile, goes on with them in its pool. Its new life, partitioned in turn,
 * is lost by a decision of its own (the root used to keep the first one's mark forever and
 * wrote none). Stopped with SIGINT after that: the job is long, so that it is still training
 * when the node comes back. */
static void healed_node_rejoins_as_a_spare_node(void **state) {
  (void)state;
  skip_without_root();
  static const char *const long_args[] = {"--steps", "100000", "--params", "100000", NULL};
  char heartbeat[16];
  snprintf(heartbeat, sizeof heartbeat, "%dms", heartbeat_default_ms());
  const char *const flags[] = {"--netns", "--nnodes",    "3",       "--nproc-per-node",
                               "2",       "--heartbeat", heartbeat, "--rejoin-wait",
                               "60s",     NULL};
  keel_test_job job;
  char job_id[32];
  pid_t launcher = job_start_training_with(&job, flags, long_args, job_id, sizeof job_id);
  const char *partition[] = {"inject", "partition", "2", "--job", job_id, NULL};
  assert_int_equal(keel_test_keel(partition, job.output, 10000), 0);
  events_wait(&job, (event_want){"node_fence", 2, 1});
  /* Its two workers reaped, and their deaths not written: the store is out of reach. */
  events_wait(&job, (event_want){"exit", -1, 2});
  /* Its key gone with its lease: the root decided. */
  events_wait(&job, (event_want){"root_decision", 2, 1});
  const char *heal[] = {"inject", "heal", "2", "--job", job_id, NULL};
  assert_int_equal(keel_test_keel(heal, job.output, 10000), 0);
  events_wait(&job, (event_want){"agent_rejoin", 2, 1});
  /* Node 2's two spares (uids 10 and 11: max_world 6 + node 2 x stride 2) are ready. */
  events_wait(&job, (event_want){"ready", -1, 8});
  char status[2048];
  const char *const status_args[] = {"status", "--job", job_id, NULL};
  assert_int_equal(keel_output(status_args, NULL, status, sizeof status), 0);
  /* keel status: node 2 is back, a spare node holding its two spares. */
  const char *node_2 = strstr(status, "\n2 ");
  if (node_2 == NULL || strstr(node_2, "spare") == NULL || strstr(node_2, "10:-1 11:-1") == NULL)
    fail_msg("keel status does not show node 2 as a spare node:\n%s", status);
  /* Its last event is of the new life: the old one's key went with its lease, and the fence
   * (partitioned) could not be sent. */
  char last_event[64];
  wait_node_last_event(job_id, 2, last_event, sizeof last_event);
  assert_string_not_equal(last_event, "node_fence");
  assert_int_equal(keel_test_keel(partition, job.output, 10000), 0);
  events_wait(&job, (event_want){"root_decision", 2, 2});
  assert_int_equal(keel_test_keel(heal, job.output, 10000), 0);
  kill(launcher, SIGINT);
  int code = job_finish(&job, launcher);
  assert_int_equal(code, 128 + SIGINT);
  keel_test_events log;
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  const char *rejoin = keel_test_events_find(&log, "agent_rejoin", -1);
  assert_int_equal(keel_test_event_long(rejoin, "spares"), 2);
  /* The fence's two kills, which the cut-off agent could not write to the store, were
   * written once it answered again, before the new life: the survivors learn of them there
   * even when the root never saw the node's key gone (gone and back between two of its
   * listings), rather than at a collective's deadline. */
  const char *recorded = node_event(&log, "deaths_recorded", 2);
  assert_non_null(recorded);
  assert_int_equal(keel_test_event_long(recorded, "processes"), 2);
  assert_true(keel_test_event_long(recorded, "t_ns") < keel_test_event_long(rejoin, "t_ns"));
  for (long uid = 10; uid <= 11; uid++) {
    const char *ready = keel_test_events_find(&log, "ready", uid);
    assert_non_null(ready);
    assert_non_null(strstr(ready, "\"role\":\"spare\""));
  }
  /* The fenced life ended (78) before the new one began, in the same process. */
  long long fenced_end = -1, rejoined_at = keel_test_event_long(rejoin, "t_ns");
  for (size_t i = 0; i < log.count && fenced_end < 0; i++)
    if (keel_test_event_is(log.lines[i], "agent_end") &&
        keel_test_event_long(log.lines[i], "node") == 2 &&
        keel_test_event_long(log.lines[i], "code") == 78)
      fenced_end = keel_test_event_long(log.lines[i], "t_ns");
  assert_true(fenced_end > 0 && fenced_end < rejoined_at);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* Rank 1 (node 1's only worker) is killed and a spare takes it; that spare is killed in
 * turn and another takes the rank. A node whose holders were all killed then holds no rank
 * and none of its processes finished, but the job did: its agent ends 0, and so does the
 * job. Its verdict was the killed spare's 137, the job's exit code (the soak's finding 12,
 * seen again in a CI rehearsal of test_chaos). */
static void a_node_whose_holders_were_replaced_ends_with_the_job(void **state) {
  (void)state;
  const char *const flags[] = {
      "--agents",     "--nnodes", "2",           "--nproc-per-node",  "1", "--spare-nodes", "1",
      "--on-failure", "replace",  "--heartbeat", heartbeat_lenient(), NULL};
  keel_test_job job;
  char job_id[32];
  pid_t launcher = job_start_training(&job, flags, job_id, sizeof job_id);
  const char *kill_args[] = {"inject", "kill", "1", "--job", job_id, NULL};
  assert_int_equal(keel_test_keel(kill_args, job.output, 10000), 0);
  events_wait(&job, (event_want){"recovery", -1, 1});
  assert_int_equal(keel_test_keel(kill_args, job.output, 10000), 0);
  job_finish_ok(&job, launcher);
  keel_test_toy_assert_consistent(job.output, 2, STEP_COUNT);
  keel_test_events log;
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  /* Both holders of rank 1 were killed (which spare took it depends on timing), and every
   * node's agent ended 0: the nodes whose holders were replaced too. */
  size_t killed = 0, agents = 0;
  for (size_t i = 0; i < log.count; i++) {
    const char *line = log.lines[i];
    killed += keel_test_event_is(line, "exit") && keel_test_event_long(line, "rank") == 1 &&
              strstr(line, "\"signal\":\"SIGKILL\"") != NULL;
    if (!keel_test_event_is(line, "agent_end")) continue;
    agents++;
    assert_int_equal(keel_test_event_long(line, "code"), 0);
  }
  assert_int_equal(killed, 2);
  assert_int_equal(agents, 3);
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* Finding 37: the store out of every node's reach at once (here the embedded store, stopped
 * with the launcher that holds it) fences every node, and no process holds the job's state
 * any more. The agents come back as spare nodes once the store answers (--rejoin-wait); they
 * never saw a rank in their new lives, and waited for one that could not come. They must end
 * the job with an error instead. */
static void a_job_fenced_on_every_node_ends_with_an_error(void **state) {
  (void)state;
  static const char *const long_args[] = {"--steps", "100000", "--params", "100000", NULL};
  char heartbeat[16], rejoin_wait[16];
  keel_test_seconds_flag(1, heartbeat, sizeof heartbeat);
  keel_test_seconds_flag(60, rejoin_wait, sizeof rejoin_wait);
  const char *const flags[] = {"--agents",  "--nnodes",    "2",       "--nproc-per-node",
                               "1",         "--spares",    "1",       "--on-failure",
                               "replace",   "--heartbeat", heartbeat, "--rejoin-wait",
                               rejoin_wait, NULL};
  keel_test_job job;
  char job_id[32];
  pid_t launcher = job_start_training_with(&job, flags, long_args, job_id, sizeof job_id);
  assert_int_equal(kill(launcher, SIGSTOP), 0);
  events_wait(&job, (event_want){"node_fence", 0, 1});
  events_wait(&job, (event_want){"node_fence", 1, 1});
  assert_int_equal(kill(launcher, SIGCONT), 0);
  int code = job_finish(&job, launcher);
  if (code != 1) keel_test_print_file("output", job.output);
  assert_int_equal(code, 1);
  char *output = keel_test_read_file(job.output, NULL);
  assert_non_null(output);
  assert_non_null(strstr(output, "no process of the job holds a rank and none finished"));
  free(output);
  keel_test_events log;
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  assert_non_null(keel_test_events_find(&log, "agent_rejoin", -1));
  assert_non_null(keel_test_events_find(&log, "ranks_lost", -1));
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

static void node_flags_are_checked(void **state) {
  (void)state;
  char output[2048];
  static const char *const no_store[] = {"run", "--node-rank", "0",    "--nnodes",
                                         "2",   "--",          "true", NULL};
  assert_int_equal(keel_output(no_store, NULL, output, sizeof output), 2);
  assert_non_null(strstr(output, "--node-rank needs --rdzv-endpoint and --rdzv-id"));
  static const char *const rate[] = {"run", "--link-rate", "1gbit", "--", "true", NULL};
  assert_int_equal(keel_output(rate, NULL, output, sizeof output), 2);
  assert_non_null(strstr(output, "--link-rate needs --netns"));
  static const char *const agent[] = {"agent", "--nnodes", "2", "--", "true", NULL};
  assert_int_equal(keel_output(agent, NULL, output, sizeof output), 2);
  assert_non_null(strstr(output, "keel agent needs --node-rank"));
  static const char *const restart[] = {"run",          "--agents", "--nnodes", "2",
                                        "--on-failure", "restart",  "--ckpt",   "jit",
                                        "--",           "true",     NULL};
  assert_int_equal(keel_output(restart, NULL, output, sizeof output), 2);
  assert_non_null(strstr(output, "does not go with agents"));
  static const char *const inverted[] = {"run", "--agents", "--nnodes", "3:2", "--", "true", NULL};
  assert_int_equal(keel_output(inverted, NULL, output, sizeof output), 2);
  assert_non_null(strstr(output, "MIN is above MAX"));
  static const char *const one_host[] = {"run", "--nnodes", "2:3", "--", "true", NULL};
  assert_int_equal(keel_output(one_host, NULL, output, sizeof output), 2);
  assert_non_null(strstr(output, "--nnodes MIN:MAX needs --agents"));
  static const char *const fixed_world[] = {"run", "--agents", "-n",   "4", "--nnodes",
                                            "2:3", "--",       "true", NULL};
  assert_int_equal(keel_output(fixed_world, NULL, output, sizeof output), 2);
  assert_non_null(strstr(output, "-n does not go with --nnodes MIN:MAX"));
  /* A store on loopback is out of the namespaces' reach: refused before any process starts. */
  if (geteuid() != 0) return;
  static const char *const loopback_store[] = {
      "run", "--netns", "--nnodes", "2", "--rdzv-endpoint", "etcd://127.0.0.1:2379",
      "--",  "true",    NULL};
  assert_int_equal(keel_output(loopback_store, NULL, output, sizeof output), 1);
  assert_non_null(strstr(output, "127.0.0.1 is not one (the store member at 127.0.0.1:2379)"));
}

/* Every recovery of log is a grow after late_spawn, and together they take the world from
 * old_world to new_world. Rank 0 admits the joiners that wait at a step boundary, so two that
 * come up far apart (a loaded machine) are admitted in two grows, each a step boundary. */
static void assert_late_joiners_grew_the_world(const keel_test_events *log, long long late_spawn,
                                               long long old_world, long long new_world) {
  long long world = old_world, joined = 0;
  for (size_t i = 0; i < log->count; i++) {
    const char *line = log->lines[i];
    if (!keel_test_event_is(line, "recovery")) continue;
    assert_non_null(strstr(line, "\"policy\":\"grow\""));
    assert_int_equal(keel_test_event_long(line, "old_world"), world);
    assert_true(keel_test_event_long(line, "t_ns") > late_spawn);
    world = keel_test_event_long(line, "new_world");
    joined += keel_test_event_long(line, "joined");
  }
  assert_int_equal(world, new_world);
  assert_int_equal(joined, new_world - old_world);
}

/* --nnodes 2:3: the job starts with nodes 0 and 1 (world 4); node 2's agent comes a second
 * later, as a late host, and its two workers join at step boundaries (world 4 to 6). Every
 * step costs 10 ms at least, so the job is still training when the node comes. */
static void late_node_joins_at_a_step_boundary(void **state) {
  (void)state;
  static const char *const slow_args[] = {"--steps",      STEPS, "--params", "100000",
                                          "--compute-ms", "10",  NULL};
  const char *const flags[] = {
      "--agents",     "--nnodes", "2:3",         "--nproc-per-node",  "2",
      "--join-delay", "1s",       "--heartbeat", heartbeat_lenient(), NULL};
  keel_test_job job;
  assert_true(keel_test_job_prepare(&job, "keel-nodes"));
  int code = keel_test_job_run(&job, "90s", 120000 * keel_test_slowdown(), flags,
                               keel_test_program("toy_train"), slow_args, NULL);
  if (code != 0) keel_test_print_file("output", job.output);
  assert_int_equal(code, 0);
  keel_test_toy_assert_consistent(job.output, 6, STEP_COUNT);
  keel_test_events log;
  keel_test_events_read(job.events, MAX_EVENTS, &log);
  long long started = keel_test_event_long(keel_test_events_find(&log, "job_start", -1), "t_ns");
  long long late_spawn = node_event_time(&log, "agent_spawn", 2);
  assert_true(late_spawn - started >= 1000000000LL);
  assert_late_joiners_grew_the_world(&log, late_spawn, 4, 6);
  /* Node 2's agent brought joiners, not workers. */
  const char *late_agent = node_event(&log, "agent_start", 2);
  assert_non_null(late_agent);
  assert_non_null(strstr(late_agent, "\"role\":\"joiner\""));
  keel_test_events_assert_none_left(&log);
  keel_test_events_free(&log);
}

/* A later life of a node (KEEL_AGENT_REJOIN: a fenced node's agent started again) that
 * cannot reach the store leaves its node lost (exit 78, as the fence did), not the job failed:
 * the job's outcome is the other nodes'. Before, it ended with 1, and a job whose every rank
 * finished bit-identical exited 1 (test_chaos_netns_etcd under ASan, RELIABILITY.md). The
 * store here is an etcd endpoint nobody listens on. */
static void later_life_without_the_store_leaves_the_node_lost(void **state) {
  (void)state;
  char endpoint[32], output[4096];
  snprintf(endpoint, sizeof endpoint, "etcd://127.0.0.1:%d", free_port());
  char *env[] = {"KEEL_AGENT_REJOIN=0", NULL};
  const char *const args[] = {
      "run",    "--node-rank", "1",    "--nnodes", "2",    "--rdzv-endpoint",
      endpoint, "--rdzv-id",   "life", "--",       "true", NULL};
  int code = keel_output(args, env, output, sizeof output);
  if (code != 78) fail_msg("exit %d, not 78:\n%s", code, output);
  assert_non_null(strstr(output, "cannot connect to the store"));
}

/* Under srun, the node count, this node's rank, the store (etcd on the first node of the
 * step) and the job's name come from Slurm. The host does not exist here: the agent says it
 * cannot reach that store, which shows that it read them all. */
static void slurm_environment_shapes_the_job(void **state) {
  (void)state;
  char output[4096];
  char *env[] = {"SLURM_STEP_NODELIST=keel-test-node[7-8]", "SLURM_NNODES=2", "SLURM_NODEID=1",
                 "SLURM_JOB_ID=4242", NULL};
  static const char *const beyond[] = {
      "run", "--nproc-per-node", "1", "--node-rank", "2", "--", "true", NULL};
  assert_int_equal(keel_output(beyond, env, output, sizeof output), 2);
  assert_non_null(strstr(output, "--node-rank 2: the job has 2 nodes"));
  static const char *const plain[] = {"run", "--nproc-per-node", "1", "--", "true", NULL};
  int code = keel_output(plain, env, output, sizeof output);
  assert_int_not_equal(code, 0);
  assert_non_null(strstr(output, "etcd://keel-test-node7:2379"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(node_flags_are_checked),
      cmocka_unit_test(later_life_without_the_store_leaves_the_node_lost),
      cmocka_unit_test(slurm_environment_shapes_the_job),
      cmocka_unit_test(kill_node_shrinks_by_the_whole_node),
      cmocka_unit_test(kill_node_replaced_by_a_spare_node_is_exact),
      cmocka_unit_test(losing_every_holder_of_the_state_fails_the_job),
      cmocka_unit_test(a_lone_dead_agent_takes_its_node),
      cmocka_unit_test(partitioned_node_fences_itself_before_it_is_replaced),
      cmocka_unit_test(same_bits_over_shm_tcp_and_namespaces),
      cmocka_unit_test(delayed_node_slows_every_step_until_it_ends),
      cmocka_unit_test(late_node_joins_at_a_step_boundary),
      cmocka_unit_test(healed_node_rejoins_as_a_spare_node),
      cmocka_unit_test(a_job_fenced_on_every_node_ends_with_an_error),
      cmocka_unit_test(a_node_whose_holders_were_replaced_ends_with_the_job),
  };
  /* KEEL_TEST_FILTER=a_node_whose* runs only the cases it names. */
  if (getenv("KEEL_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("KEEL_TEST_FILTER"));
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  keel_test_kill_all();
  return keel_test_finish(failed);
}
