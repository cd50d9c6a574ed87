/* A stand-in worker for the launcher's tests. It starts as a keel process does (KEEL_*
 * environment, store client, lease kept alive by a thread, proc/<uid>, status lines), then
 * runs its arguments in order, so a test can make each kind of end happen. Store only:
 *   --exit CODE       leave in order (revoke the lease) and exit with CODE
 *   --sleep MS        sleep (the lease stays alive)
 *   --suspect UID     put suspect/<UID>
 *   --stop-keepalive  stop refreshing the lease but stay alive (a hang, as the store sees it)
 *   --spare-wait      if this process is a spare: wait for job/done, then exit 0
 *   --publish R E     rewrite proc/<uid> as a worker holding rank R in epoch E (a spare
 *                     that took a rank, or a survivor after a recovery)
 *   --garbage         write malformed and over-long lines to the status pipe
 *   --restart-job R MS  the worker side of --on-failure restart: in the first incarnation
 *                     (KEEL_RESTART=0) world rank R SIGKILLs itself after MS ms, and the
 *                     others wait for its dead/ key, write KEEL_CKPT_DIR/saved-rank<rank>
 *                     and exit 75; in later ones it writes an "incarnation" status line
 *                     (its KEEL_RESTART, KEEL_FIRST_UID, KEEL_FIRST_EPOCH, KEEL_NODE...)
 *   --only UID        the next action applies only to the process whose uid is UID
 * With no action left it exits 0. Like a real worker, it leaves with KEEL_EXIT_STOPPED (77) as
 * soon as its keepalive thread sees job/stop. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "keel/runtime.h" /* KEEL_EXIT_RESTART */
#include "keel/store.h"

#define SECOND_NS INT64_C(1000000000)
#define MILLISECOND_NS INT64_C(1000000)
/* How long a healthy worker waits to see the failure before it saves anyway. */
#define FAILURE_WAIT_NS (10 * SECOND_NS)

typedef struct fake_worker {
  keel_auth auth;
  const char *store_address;
  int64_t uid;
  const char *role;
  int64_t world;
  int64_t node;
  int64_t restart;      /* KEEL_RESTART */
  int64_t first_uid;    /* KEEL_FIRST_UID */
  int64_t first_epoch;  /* KEEL_FIRST_EPOCH */
  int64_t rank;         /* a worker's world rank, uid - first_uid; -1 for the others */
  const char *ckpt;     /* KEEL_CKPT; NULL: unset */
  const char *ckpt_dir; /* KEEL_CKPT_DIR; NULL: unset */
  int64_t status_fd;    /* -1: no status pipe */
  int64_t heartbeat_ns;
  keel_store *store;
  keel_store *keepalive_store; /* its own link: a long wait on store must not delay it */
  int64_t lease;
  pthread_t keepalive_thread;
  bool keepalive_running;
  atomic_bool keepalive_stop;
  char address[80];
} fake_worker;

static void sleep_ns(int64_t duration_ns) {
  struct timespec pause = {(time_t)(duration_ns / SECOND_NS), (long)(duration_ns % SECOND_NS)};
  while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
  }
}

static void *keepalive_main(void *argument) {
  fake_worker *worker = argument;
  int64_t period = worker->heartbeat_ns / 3, slice = 10 * INT64_C(1000000);
  while (!atomic_load(&worker->keepalive_stop)) {
    for (int64_t slept = 0; slept < period && !atomic_load(&worker->keepalive_stop); slept += slice)
      sleep_ns(slice);
    if (atomic_load(&worker->keepalive_stop)) break;
    keel_status status = keel_store_lease_keepalive(worker->keepalive_store, worker->lease);
    if (status != KEEL_OK) KEEL_LOG_W("fake", "keepalive: %s", keel_strerror(status));
    /* The contract of an orderly stop (RUNTIME.md): on job/stop a process leaves with
     * KEEL_EXIT_STOPPED, whatever it was doing. */
    keel_store_entry *stop = NULL;
    if (keel_store_get(worker->keepalive_store, "job/stop", &stop) == KEEL_OK) {
      keel_store_entry_free(stop);
      _exit(KEEL_EXIT_STOPPED);
    }
  }
  return NULL;
}

static void keepalive_stop(fake_worker *worker) {
  if (!worker->keepalive_running) return;
  atomic_store(&worker->keepalive_stop, true);
  pthread_join(worker->keepalive_thread, NULL);
  worker->keepalive_running = false;
}

static bool environment_read(fake_worker *worker) {
  worker->store_address = getenv("KEEL_STORE");
  worker->role = getenv("KEEL_ROLE");
  worker->status_fd = -1;
  worker->heartbeat_ns = SECOND_NS;
  if (worker->store_address == NULL || worker->role == NULL) {
    KEEL_LOG_E("fake", "KEEL_STORE and KEEL_ROLE must be set (run me with keel run)");
    return false;
  }
  worker->ckpt = getenv("KEEL_CKPT");
  worker->ckpt_dir = getenv("KEEL_CKPT_DIR");
  return keel_auth_from_env(&worker->auth) == KEEL_OK &&
         keel_env_int("KEEL_UID", 0, INT32_MAX, &worker->uid) == KEEL_OK &&
         keel_env_int("KEEL_WORLD", 1, INT32_MAX, &worker->world) == KEEL_OK &&
         keel_env_int("KEEL_NODE", 0, INT32_MAX, &worker->node) == KEEL_OK &&
         keel_env_int("KEEL_RESTART", 0, INT32_MAX, &worker->restart) == KEEL_OK &&
         keel_env_int("KEEL_FIRST_UID", 0, INT32_MAX, &worker->first_uid) == KEEL_OK &&
         keel_env_int("KEEL_FIRST_EPOCH", 0, INT32_MAX, &worker->first_epoch) == KEEL_OK &&
         keel_env_int("KEEL_STATUS_FD", 0, INT32_MAX, &worker->status_fd) == KEEL_OK &&
         keel_env_duration_ns("KEEL_HEARTBEAT", &worker->heartbeat_ns) == KEEL_OK;
}

static void status_write(const fake_worker *worker, const char *line) {
  if (worker->status_fd < 0) return;
  ssize_t ignored = write((int)worker->status_fd, line, strlen(line));
  (void)ignored;
}

static bool is_worker(const fake_worker *worker) { return strcmp(worker->role, "worker") == 0; }

static void progress_write(const fake_worker *worker) {
  for (int step = 1; step <= 2 && is_worker(worker); step++) {
    char line[256];
    snprintf(line, sizeof line,
             "{\"event\":\"progress\",\"uid\":%lld,\"rank\":%lld,\"epoch\":%lld,\"world\":%lld,"
             "\"step\":%d,\"loss\":%.3f,\"samples_per_s\":%.1f,\"t_ns\":%lld}\n",
             (long long)worker->uid, (long long)worker->rank, (long long)worker->first_epoch,
             (long long)worker->world, step, 1.0 / step, 100.0 * step, (long long)keel_now_ns());
    status_write(worker, line);
  }
}

static keel_status proc_publish(fake_worker *worker, int64_t rank, int64_t epoch) {
  char key[64], value[256];
  snprintf(key, sizeof key, "proc/%lld", (long long)worker->uid);
  int length = snprintf(
      value, sizeof value, "pid=%ld node=%lld role=%s rank=%lld epoch=%lld addr=%s", (long)getpid(),
      (long long)worker->node, worker->role, (long long)rank, (long long)epoch, worker->address);
  return keel_store_put(worker->store, key, value, (size_t)length, worker->lease, NULL);
}

static keel_status proc_register(fake_worker *worker) {
  keel_status status = proc_publish(worker, worker->rank, worker->first_epoch);
  if (status != KEEL_OK || is_worker(worker)) return status;
  char key[64];
  snprintf(key, sizeof key, "spare/%lld", (long long)worker->uid);
  return keel_store_put(worker->store, key, "", 0, worker->lease, NULL);
}

static bool worker_start(fake_worker *worker) {
  if (!environment_read(worker)) return false;
  worker->rank = is_worker(worker) ? worker->uid - worker->first_uid : -1;
  worker->auth.local_id = (uint32_t)worker->uid;
  snprintf(worker->address, sizeof worker->address, "127.0.0.1:%d", 40000 + (int)worker->uid);
  int64_t deadline = keel_deadline_after_ns(5 * SECOND_NS);
  keel_status status =
      keel_store_connect(worker->store_address, &worker->auth, deadline, &worker->store);
  if (status == KEEL_OK)
    status = keel_store_connect(worker->store_address, &worker->auth, deadline,
                                &worker->keepalive_store);
  if (status == KEEL_OK)
    status = keel_store_lease_grant(worker->store, worker->heartbeat_ns, &worker->lease);
  if (status == KEEL_OK) status = proc_register(worker);
  if (status != KEEL_OK) {
    KEEL_LOG_E("fake", "start: %s", keel_strerror(status));
    return false;
  }
  atomic_init(&worker->keepalive_stop, false);
  worker->keepalive_running =
      pthread_create(&worker->keepalive_thread, NULL, keepalive_main, worker) == 0;
  progress_write(worker);
  return worker->keepalive_running;
}

/* Leaves in order, as keel_finalize would: the lease goes first, then the process. */
static void worker_exit(fake_worker *worker, int code) {
  keepalive_stop(worker);
  if (worker->store != NULL && worker->lease != 0)
    keel_store_lease_revoke(worker->store, worker->lease);
  keel_store_close(worker->keepalive_store);
  keel_store_close(worker->store);
  exit(code);
}

/* Whether the keys listed under a prefix hold what a wait looks for. */
typedef bool entries_test(const fake_worker *worker, const keel_store_entry *entries, size_t count);

/* Waits until the keys under prefix pass test or the deadline passes; true if they did. */
static bool prefix_wait(fake_worker *worker, const char *prefix, entries_test *test,
                        int64_t deadline) {
  while (keel_now_ns() < deadline) {
    uint64_t revision = 0;
    keel_store_entry *entries = NULL;
    size_t count = 0;
    if (keel_store_list(worker->store, prefix, &entries, &count, &revision) != KEEL_OK) {
      sleep_ns(10 * MILLISECOND_NS);
      continue;
    }
    bool passed = test(worker, entries, count);
    keel_store_entries_free(entries, count);
    if (passed) return true;
    int64_t slice = keel_deadline_after_ns(SECOND_NS);
    keel_store_wait(worker->store, prefix, revision, slice < deadline ? slice : deadline, NULL);
  }
  return false;
}

static bool job_done_listed(const fake_worker *worker, const keel_store_entry *entries,
                            size_t count) {
  (void)worker;
  for (size_t i = 0; i < count; i++) {
    if (strcmp(entries[i].key, "job/done") == 0) return true;
  }
  return false;
}

static void spare_wait(fake_worker *worker) {
  prefix_wait(worker, "job/", job_done_listed, KEEL_NO_DEADLINE);
  worker_exit(worker, 0);
}

/* A dead/<uid> key of this incarnation: a failure the launcher has reaped. */
static bool failure_listed(const fake_worker *worker, const keel_store_entry *entries,
                           size_t count) {
  for (size_t i = 0; i < count; i++) {
    int64_t uid;
    const char *text = entries[i].key + strlen("dead/");
    if (keel_parse_int(text, 0, INT32_MAX, &uid) == KEEL_OK && uid >= worker->first_uid)
      return true;
  }
  return false;
}

static void ckpt_marker_path(const fake_worker *worker, char *path, size_t capacity) {
  snprintf(path, capacity, "%s/saved-rank%lld", worker->ckpt_dir ? worker->ckpt_dir : ".",
           (long long)worker->rank);
}

/* Stands in for a JIT save: a file named for the rank, in KEEL_CKPT_DIR. */
static void ckpt_marker_write(const fake_worker *worker) {
  char path[PATH_MAX + 32];
  ckpt_marker_path(worker, path, sizeof path);
  FILE *file = worker->ckpt_dir ? fopen(path, "w") : NULL;
  if (file == NULL) {
    KEEL_LOG_E("fake", "cannot write %s", path);
    return;
  }
  fprintf(file, "uid=%lld restart=%lld\n", (long long)worker->uid, (long long)worker->restart);
  fclose(file);
}

/* What a restarted worker was told, and whether its rank's save is there to restore. */
static void incarnation_report(const fake_worker *worker) {
  char path[PATH_MAX + 32], line[512];
  ckpt_marker_path(worker, path, sizeof path);
  snprintf(line, sizeof line,
           "{\"event\":\"incarnation\",\"uid\":%lld,\"rank\":%lld,\"restart\":%lld,"
           "\"first_uid\":%lld,\"first_epoch\":%lld,\"node\":%lld,\"ckpt\":\"%s\","
           "\"restored\":%s,\"t_ns\":%lld}\n",
           (long long)worker->uid, (long long)worker->rank, (long long)worker->restart,
           (long long)worker->first_uid, (long long)worker->first_epoch, (long long)worker->node,
           worker->ckpt ? worker->ckpt : "none", access(path, R_OK) == 0 ? "true" : "false",
           (long long)keel_now_ns());
  status_write(worker, line);
}

static void restart_job(fake_worker *worker, int64_t failing_rank, int64_t delay_ms) {
  if (worker->restart > 0) {
    incarnation_report(worker);
    return;
  }
  if (worker->rank == failing_rank) {
    sleep_ns(delay_ms * MILLISECOND_NS);
    kill(getpid(), SIGKILL);
  }
  prefix_wait(worker, "dead/", failure_listed, keel_deadline_after_ns(FAILURE_WAIT_NS));
  ckpt_marker_write(worker);
  worker_exit(worker, KEEL_EXIT_RESTART);
}

static void suspect_put(fake_worker *worker, int64_t uid) {
  char key[64], value[128];
  snprintf(key, sizeof key, "suspect/%lld", (long long)uid);
  int length = snprintf(value, sizeof value, "by=%lld reason=fake_worker", (long long)worker->uid);
  keel_status status = keel_store_put(worker->store, key, value, (size_t)length, 0, NULL);
  if (status != KEEL_OK) KEEL_LOG_E("fake", "put %s: %s", key, keel_strerror(status));
}

static void garbage_write(const fake_worker *worker) {
  status_write(worker, "this is not json\n");
  status_write(worker, "{\"event\":\"broken\"\n");
  status_write(worker, "{\"no_event\":1}\n");
  char long_piece[3000];
  memset(long_piece, 'x', sizeof long_piece - 1);
  long_piece[sizeof long_piece - 1] = '\0';
  status_write(worker, "{\"event\":\"too_long\",\"pad\":\"");
  status_write(worker, long_piece);
  status_write(worker, long_piece);
  status_write(worker, "\"}\n");
}

static bool argument_value(int argc, char **argv, int index, int64_t *value_p) {
  if (index + 1 < argc && keel_parse_int(argv[index + 1], -1, INT32_MAX, value_p) == KEEL_OK)
    return true;
  KEEL_LOG_E("fake", "%s needs an integer", argv[index]);
  return false;
}

/* How many values follow the action's name; -1 for an unknown action. */
static int action_value_count(const char *name) {
  static const struct {
    const char *name;
    int values;
  } actions[] = {{"--exit", 1},    {"--sleep", 1},       {"--suspect", 1},
                 {"--publish", 2}, {"--restart-job", 2}, {"--stop-keepalive", 0},
                 {"--garbage", 0}, {"--spare-wait", 0}};
  for (size_t i = 0; i < sizeof actions / sizeof actions[0]; i++) {
    if (strcmp(name, actions[i].name) == 0) return actions[i].values;
  }
  return -1;
}

static void action_do(fake_worker *worker, const char *name, const int64_t *values) {
  if (strcmp(name, "--exit") == 0) worker_exit(worker, (int)values[0]);
  if (strcmp(name, "--sleep") == 0) sleep_ns(values[0] * INT64_C(1000000));
  if (strcmp(name, "--stop-keepalive") == 0) keepalive_stop(worker);
  if (strcmp(name, "--garbage") == 0) garbage_write(worker);
  if (strcmp(name, "--spare-wait") == 0 && !is_worker(worker)) spare_wait(worker);
  if (strcmp(name, "--suspect") == 0) suspect_put(worker, values[0]);
  if (strcmp(name, "--restart-job") == 0) restart_job(worker, values[0], values[1]);
  if (strcmp(name, "--publish") == 0) {
    worker->role = "worker";
    keel_status status = proc_publish(worker, values[0], values[1]);
    if (status != KEEL_OK) KEEL_LOG_E("fake", "publish: %s", keel_strerror(status));
  }
}

/* Runs the action at argv[index] if it applies to this process; returns how many arguments
 * it takes (its name and values), or -1 for a bad one. */
static int action_run(fake_worker *worker, int argc, char **argv, int index, bool applies) {
  int count = action_value_count(argv[index]);
  if (count < 0) {
    KEEL_LOG_E("fake", "unknown action %s", argv[index]);
    return -1;
  }
  int64_t values[2] = {0, 0};
  for (int i = 0; i < count; i++) {
    if (!argument_value(argc, argv, index + i, &values[i])) return -1;
  }
  if (applies) action_do(worker, argv[index], values);
  return 1 + count;
}

int main(int argc, char **argv) {
  fake_worker worker = {0};
  if (!worker_start(&worker)) return 1;
  char identity[32];
  snprintf(identity, sizeof identity, "fake uid %lld", (long long)worker.uid);
  keel_log_set_identity(identity);
  for (int index = 1; index < argc;) {
    bool applies = true;
    if (strcmp(argv[index], "--only") == 0) {
      int64_t only;
      if (!argument_value(argc, argv, index, &only)) return 2;
      applies = only == worker.uid;
      index += 2;
      if (index >= argc) break;
    }
    int used = action_run(&worker, argc, argv, index, applies);
    if (used < 0) return 2;
    index += used;
  }
  worker_exit(&worker, 0);
  return 0;
}
