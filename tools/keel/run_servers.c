/* The parameter servers of `keel run --servers S --ec k=K,r=R` (RUNTIME.md, "Parameter
 * servers"): S `keel server` processes started before the workers, whose deaths the job
 * survives through the parity (up to R at once), each dead one replaced (`keel server
 * --replace`) in a synchronous job, all stopped once every other process is gone. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel/ec.h"
#include "launcher.h"

/* How long the servers get between SIGTERM and SIGKILL at the end of the job. */
#define SERVER_STOP_GRACE_NS (5 * INT64_C(1000000000))

void keel__server_key_put(keel__launcher *launcher, const keel__child *server,
                          const char *status_text) {
  char key[64], value[96];
  snprintf(key, sizeof key, KEEL__SERVER_PREFIX "%lld", (long long)server->server_index);
  int length = snprintf(value, sizeof value, "pid=%ld uid=%u status=%s", (long)server->pid,
                        (unsigned)server->uid, status_text);
  keel_status status = keel_store_put(launcher->store, key, value, (size_t)length, 0, NULL);
  if (status != KEEL_OK)
    KEEL_LOG_E("launcher", "cannot put %s in the store: %s", key, keel_strerror(status));
}

/* Room for one more server process in the launcher's table (which may move). */
static keel_status servers_reserve(keel__launcher *launcher) {
  if (launcher->server_count < launcher->server_capacity) return KEEL_OK;
  size_t capacity = launcher->server_capacity > 0 ? launcher->server_capacity * 2 : 4;
  keel__child *servers = realloc(launcher->servers, capacity * sizeof *servers);
  if (servers == NULL) return KEEL_ENOMEM;
  launcher->servers = servers;
  launcher->server_capacity = capacity;
  return KEEL_OK;
}

/* Starts server index as `<this executable> server --index I --store <the job's store>`
 * (with --replace in a lost one's place): the servers take their configuration from the
 * store, where the first worker puts it. */
static keel_status server_spawn(keel__launcher *launcher, const char *keel_path, int64_t index,
                                bool replacement) {
  char index_text[24];
  snprintf(index_text, sizeof index_text, "%lld", (long long)index);
  char *argv[] = {"keel",
                  "server",
                  "--index",
                  index_text,
                  "--store",
                  launcher->endpoint,
                  replacement ? "--replace" : NULL,
                  NULL};
  /* After every uid the children's table can give (run.c's launcher_init), so that a
   * server's uid is never a worker's, a spare's or a joiner's; replacements after those, as
   * many as the uid space holds: a job of any length replaces its servers (finding 22). */
  if (launcher->child_capacity + launcher->server_count >= KEEL_MAX_UIDS) return KEEL_ERANGE;
  keel_status status = servers_reserve(launcher);
  if (status != KEEL_OK) return status;
  keel__child server = {
      .uid = (uint32_t)(launcher->child_capacity + launcher->server_count),
      .role = KEEL__ROLE_SERVER,
      .rank = -1,
      .server_index = index,
      .replacement = replacement,
  };
  status = keel__child_start(launcher, &server, keel_path, argv);
  if (status != KEEL_OK) return status;
  launcher->servers[launcher->server_count++] = server;
  keel__server_key_put(launcher, &server, KEEL__SERVER_RUNNING);
  return KEEL_OK;
}

/* This executable's path: the servers run the same keel as the launcher. */
static keel_status executable_path(char *path, size_t capacity) {
  ssize_t length = readlink("/proc/self/exe", path, capacity - 1);
  if (length <= 0) {
    KEEL_LOG_E("launcher", "cannot find this executable to run the servers: %s", strerror(errno));
    return KEEL_EIO;
  }
  path[length] = '\0';
  return KEEL_OK;
}

bool keel__servers_spawn(keel__launcher *launcher) {
  size_t count = (size_t)launcher->options.servers;
  if (count == 0) return true;
  char keel_path[PATH_MAX];
  keel_status status = executable_path(keel_path, sizeof keel_path);
  for (size_t index = 0; index < count && status == KEEL_OK; index++)
    status = server_spawn(launcher, keel_path, (int64_t)index, false);
  if (status == KEEL_OK) return true;
  KEEL_LOG_E("launcher", "cannot start the parameter servers: %s", keel_strerror(status));
  keel__launcher_terminate(launcher, KEEL__EXIT_FAILURE, SIGKILL);
  return false;
}

keel__child *keel__server_by_pid(keel__launcher *launcher, pid_t pid) {
  for (size_t i = 0; i < launcher->server_count; i++) {
    if (launcher->servers[i].pid == pid && launcher->servers[i].alive) return &launcher->servers[i];
  }
  return NULL;
}

/* More servers dead than the parity can stand in for: their rows are gone, and so is the
 * job's model. Said the same way whether the workers are still at it (the job is stopped) or
 * have just failed for it (they may be reaped first). */
static void servers_beyond_parity(keel__launcher *launcher) {
  int64_t parity = launcher->options.ec_parity_blocks;
  bool running = launcher->phase == KEEL__PHASE_RUNNING;
  keel__event_emit(launcher, "servers_lost", "\"lost\":%lld,\"parity_blocks\":%lld",
                   (long long)launcher->servers_lost, (long long)parity);
  KEEL_LOG_E("launcher",
             "%lld parameter servers are dead, more than the parity of --ec r=%lld can stand in "
             "for: rows of the model are lost%s",
             (long long)launcher->servers_lost, (long long)parity,
             running ? "; stopping the job" : "");
  if (running) keel__launcher_terminate(launcher, KEEL__EXIT_FAILURE, SIGTERM);
}

/* Whether index has a live process (the one started last for it). */
static bool index_alive(const keel__launcher *launcher, int64_t index) {
  for (size_t i = 0; i < launcher->server_count; i++)
    if (launcher->servers[i].server_index == index && launcher->servers[i].alive) return true;
  return false;
}

/* How many indexes serve none of their rows now: no live process, or (as the directory
 * says) lost or a replacement not yet back. Without the directory, the dead ones alone. */
static int64_t servers_down(keel__launcher *launcher) {
  int servers = (int)launcher->options.servers;
  bool *down = calloc((size_t)servers, sizeof *down);
  if (down == NULL) return 0;
  keel_status status = keel_ec_servers_down(launcher->store, servers, down);
  if (status != KEEL_OK)
    KEEL_LOG_W("launcher", "cannot read the servers' standing: %s", keel_strerror(status));
  int64_t count = 0;
  for (int i = 0; i < servers; i++)
    count += !index_alive(launcher, i) || (status == KEEL_OK && down[i]);
  free(down);
  return count;
}

/* A replacement in the dead one's place, unless replacing is off, or this index cannot be
 * replaced (its last replacement exited by itself: `keel server --replace` refused, as for a
 * server that holds the dense block). */
static void server_replace(keel__launcher *launcher, int64_t index, bool failed_replacement) {
  if (!launcher->options.replace_servers) return;
  if (failed_replacement) {
    KEEL_LOG_W("launcher",
               "server %lld cannot be replaced (its replacement exited); its rows "
               "stay served through the parity",
               (long long)index);
    return;
  }
  char keel_path[PATH_MAX];
  keel_status status = executable_path(keel_path, sizeof keel_path);
  if (status == KEEL_OK) status = server_spawn(launcher, keel_path, index, true);
  if (status == KEEL_OK) {
    keel__display_note(launcher, "server %lld: a replacement is rebuilt", (long long)index);
    return;
  }
  KEEL_LOG_W("launcher",
             "cannot start a replacement of server %lld (%s); its rows stay "
             "served through the parity",
             (long long)index, keel_strerror(status));
}

void keel__server_exited(keel__launcher *launcher, keel__child *server) {
  char outcome[32];
  keel__wait_status_text(server->wait_status, outcome, sizeof outcome);
  /* Stopped by the launcher at the end: no loss. */
  if (launcher->servers_stopping) return;
  /* Copied out: a replacement's start may move the table server points into. */
  int64_t index = server->server_index;
  uint32_t uid = server->uid;
  bool failed_replacement = server->replacement && WIFEXITED(server->wait_status);
  launcher->servers_lost = servers_down(launcher);
  keel__display_note(launcher, "server %lld ended (%s): %lld down, the parity covers %lld",
                     (long long)index, outcome, (long long)launcher->servers_lost,
                     (long long)launcher->options.ec_parity_blocks);
  if (launcher->servers_lost > launcher->options.ec_parity_blocks) {
    servers_beyond_parity(launcher);
    return;
  }
  /* The clients route around it through the parity on their own: no recovery here. */
  KEEL_LOG_W("launcher",
             "parameter server %lld (uid %u) ended (%s); the job goes on through the "
             "parity (%lld of %lld down)",
             (long long)index, (unsigned)uid, outcome, (long long)launcher->servers_lost,
             (long long)launcher->options.ec_parity_blocks);
  server_replace(launcher, index, failed_replacement);
}

void keel__servers_signal(keel__launcher *launcher, int signal_number) {
  for (size_t i = 0; i < launcher->server_count; i++) {
    if (launcher->servers[i].alive) kill(launcher->servers[i].pid, signal_number);
  }
}

size_t keel__servers_unreaped(const keel__launcher *launcher) {
  size_t count = 0;
  for (size_t i = 0; i < launcher->server_count; i++) count += launcher->servers[i].alive;
  return count;
}

/* The workers may use the servers until they are gone, whatever ended the job. */
static bool servers_stop_due(const keel__launcher *launcher) {
  return !launcher->servers_stopping && launcher->phase != KEEL__PHASE_RUNNING &&
         keel__servers_unreaped(launcher) > 0 && keel__children_unreaped(launcher, 0) == 0;
}

void keel__servers_tick(keel__launcher *launcher, int64_t now_ns) {
  if (servers_stop_due(launcher)) {
    launcher->servers_stopping = true;
    launcher->servers_kill_ns = now_ns + SERVER_STOP_GRACE_NS;
    keel__servers_signal(launcher, SIGTERM);
    return;
  }
  if (!launcher->servers_stopping || now_ns < launcher->servers_kill_ns) return;
  launcher->servers_kill_ns = KEEL_NO_DEADLINE;
  if (keel__servers_unreaped(launcher) == 0) return;
  KEEL_LOG_W("launcher", "parameter servers still there %.0f s after SIGTERM: killing them",
             (double)SERVER_STOP_GRACE_NS / 1e9);
  keel__servers_signal(launcher, SIGKILL);
}

int64_t keel__servers_deadline(const keel__launcher *launcher) {
  if (servers_stop_due(launcher)) return keel_now_ns();
  return launcher->servers_stopping ? launcher->servers_kill_ns : KEEL_NO_DEADLINE;
}
