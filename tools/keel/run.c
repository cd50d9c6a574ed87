/* `keel run`: the launcher. It starts the embedded store and the processes of a job, then
 * one poll loop (signalfd, status pipe, watcher reports, deadlines) owns the process table:
 * it reaps, fences hung or suspected processes, respawns spares, restarts the whole job
 * (--on-failure restart), starts joiners, and ends the job with the workers' verdict.
 * Nothing here kills by name: every signal goes to a pid it started. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"

#define SECOND_NS INT64_C(1000000000)
/* Spares and waiting joiners get this long after job/done, and children this long after
 * SIGTERM. */
#define GRACE_NS (2 * SECOND_NS)
#define CONNECT_DEADLINE_NS (5 * SECOND_NS)
/* How soon to ask the store again whether any process holds a rank, when it did not answer. */
#define END_RECHECK_NS (SECOND_NS / 10)

/* ---- program lookup, done before anything starts so that a typo is one clear message */
static bool program_resolve(const char *name, char *path, size_t capacity) {
  if (strchr(name, '/') != NULL) {
    snprintf(path, capacity, "%s", name);
    return access(path, X_OK) == 0;
  }
  const char *search = getenv("PATH");
  if (search == NULL || *search == '\0') search = "/usr/local/bin:/usr/bin:/bin";
  for (const char *folder = search; *folder != '\0';) {
    size_t length = strcspn(folder, ":");
    snprintf(path, capacity, "%.*s/%s", (int)length, length ? folder : ".", name);
    struct stat info;
    if (stat(path, &info) == 0 && S_ISREG(info.st_mode) && access(path, X_OK) == 0) return true;
    folder += length + (folder[length] == ':');
  }
  return false;
}

/* ---- the checkpoint folder (--ckpt-dir), made before anything starts */
/* Makes the folder and keeps its absolute path: workers may run in other directories. */
static bool ckpt_dir_make(keel__launcher *launcher) {
  const keel__run_options *options = &launcher->options;
  if (options->ckpt == KEEL__CKPT_NONE) return true;
  char path[PATH_MAX];
  if (options->ckpt_dir != NULL)
    snprintf(path, sizeof path, "%s", options->ckpt_dir);
  else
    snprintf(path, sizeof path, "/tmp/keel-%u/ckpt", (unsigned)getuid());
  /* Private: checkpoints hold the job's state. */
  keel_status status = keel_directory_make(path, 0700);
  if (status == KEEL_OK && realpath(path, launcher->ckpt_dir) == NULL)
    status = keel_status_from_errno(errno);
  struct stat info;
  if (status == KEEL_OK && (stat(launcher->ckpt_dir, &info) != 0 || !S_ISDIR(info.st_mode)))
    status = KEEL_EINVAL;
  if (status == KEEL_OK) return true;
  fprintf(stderr, "keel run: cannot make the checkpoint folder %s: %s\n", path,
          keel_strerror(status));
  launcher->ckpt_dir[0] = '\0';
  return false;
}

/* The folder of `--resume`: it must hold the old job's snapshots (the restore checks them);
 * workers get its absolute path. */
static bool resume_dir_check(keel__launcher *launcher) {
  const char *given = launcher->options.resume_dir;
  if (given == NULL) return true;
  struct stat info;
  if (realpath(given, launcher->resume_dir) != NULL && stat(launcher->resume_dir, &info) == 0 &&
      S_ISDIR(info.st_mode))
    return true;
  fprintf(stderr, "keel run: --resume %s: %s\n", given,
          errno != 0 ? strerror(errno) : "not a folder");
  launcher->resume_dir[0] = '\0';
  return false;
}

/* ---- phases */
static void launcher_put_done(keel__launcher *launcher) {
  char value[16];
  int length = snprintf(value, sizeof value, "%d", launcher->exit_code);
  keel_status status = keel_store_put(launcher->store, "job/done", value, (size_t)length, 0, NULL);
  if (status != KEEL_OK) KEEL_LOG_E("launcher", "cannot put job/done: %s", keel_strerror(status));
}

/* Kills every child: first_signal now, SIGKILL after the grace period unless it was
 * SIGKILL already. A second request while terminating goes straight to SIGKILL. */
void keel__launcher_terminate(keel__launcher *launcher, int exit_code, int first_signal) {
  if (launcher->phase == KEEL__PHASE_TERMINATING) {
    keel__children_signal(launcher, SIGKILL);
    keel__servers_signal(launcher, SIGKILL);
    launcher->phase_deadline_ns = KEEL_NO_DEADLINE;
    return;
  }
  launcher->phase = KEEL__PHASE_TERMINATING;
  launcher->exit_code = exit_code;
  /* An agent that terminates ends its node, not the job (a fenced one must not even try). */
  if (!launcher->agent.active) launcher_put_done(launcher);
  keel__children_signal(launcher, first_signal);
  launcher->phase_deadline_ns =
      first_signal == SIGKILL ? KEEL_NO_DEADLINE : keel_deadline_after_ns(GRACE_NS);
}

static int64_t stop_grace_ns(void) {
  int64_t grace = 30 * SECOND_NS;
  const char *text = getenv("KEEL_STOP_GRACE");
  if (text != NULL && (keel_parse_duration_ns(text, &grace) != KEEL_OK || grace < 0))
    grace = 30 * SECOND_NS;
  return grace;
}

void keel__launcher_begin_stopping(keel__launcher *launcher, int signal_number) {
  launcher->phase = KEEL__PHASE_STOPPING;
  launcher->stop_signal = signal_number;
  launcher->exit_code = 128 + signal_number;
  keel_status status = keel_store_put(launcher->store, "job/stop", "", 0, 0, NULL);
  if (status != KEEL_OK) {
    KEEL_LOG_E("launcher", "cannot put job/stop (%s): killing the job", keel_strerror(status));
    keel__launcher_terminate(launcher, 128 + signal_number, SIGKILL);
    return;
  }
  launcher->phase_deadline_ns = keel_deadline_after_ns(stop_grace_ns());
  keel__event_emit(launcher, "stop", "\"signal\":\"%s\"", strsignal(signal_number));
  keel__display_note(launcher, "stopping: the workers save and leave (again to kill at once)");
  KEEL_LOG_W("launcher", "%s: stopping the job in order (again to kill at once)",
             strsignal(signal_number));
}

void keel__launcher_begin_ending(keel__launcher *launcher, int exit_code) {
  launcher->exit_code = exit_code;
  launcher->phase = KEEL__PHASE_ENDING;
  launcher_put_done(launcher);
  launcher->phase_deadline_ns = keel_deadline_after_ns(GRACE_NS);
  keel__display_note(launcher, "job done, exit code %d", launcher->exit_code);
}

static void launcher_note_proc(keel__launcher *launcher, uint32_t uid, int64_t rank,
                               int64_t epoch) {
  if (rank >= 0) keel__agent_note_ranks(launcher);
  keel__child *child = keel__child_by_uid(launcher, uid);
  /* A process of an earlier incarnation (restart) is gone; its key may linger. */
  if (child == NULL || uid < launcher->incarnation.first_uid) return;
  if (!child->ready && child->alive) {
    child->ready = true;
    keel__event_emit(launcher, "ready", "\"uid\":%u,\"role\":\"%s\",\"rank\":%lld", (unsigned)uid,
                     keel__role_name(child->role), (long long)rank);
  }
  if (rank >= 0) {
    child->holds_rank = true;
    child->rank = rank;
  }
  if (epoch > child->epoch) child->epoch = epoch;
  if (epoch > launcher->max_epoch) launcher->max_epoch = epoch;
  child->lease_lost_ns = 0;
}

/* A spare may have taken a rank so recently that its proc/ change is still on its way from
 * the watcher; before declaring the job over, the loop reads proc/ itself. */
bool keel__launcher_refresh_ranks(keel__launcher *launcher) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(launcher->store, "proc/", &entries, &count, NULL) != KEEL_OK) {
    /* The rank holders may be out of date: the end is decided once the store answers. */
    launcher->end_recheck_ns = keel_deadline_after_ns(END_RECHECK_NS);
    return false;
  }
  for (size_t i = 0; i < count; i++) {
    uint32_t uid;
    keel__proc_value value;
    if (keel__uid_from_key(entries[i].key, "proc/", &uid) != KEEL_OK) continue;
    if (keel__proc_value_parse((const char *)entries[i].value, &value) != KEEL_OK) continue;
    launcher_note_proc(launcher, uid, value.rank, value.epoch);
  }
  keel_store_entries_free(entries, count);
  return true;
}

/* The job is over when no process that holds a rank is left: the spares and joiners still
 * alive are idle by then, and job/done tells them to go. */
void keel__launcher_check_end(keel__launcher *launcher) {
  if (launcher->agent.active) {
    keel__agent_check_end(launcher);
    return;
  }
  if (launcher->phase != KEEL__PHASE_RUNNING) return;
  if (keel__children_alive(launcher, true) > 0) return;
  if (!keel__launcher_refresh_ranks(launcher)) return;
  if (keel__children_alive(launcher, true) > 0) return;
  keel__launcher_begin_ending(launcher, keel__children_verdict(launcher, false));
}

static void launcher_respawn(keel__launcher *launcher, const keel__child *failed) {
  if (launcher->options.on_failure != KEEL__ON_FAILURE_REPLACE) return;
  if (launcher->restarts_used >= launcher->options.max_restarts) return;
  if (keel__child_spawn(launcher, KEEL__ROLE_SPARE) != KEEL_OK) return;
  launcher->restarts_used++;
  const keel__child *spare = &launcher->children[launcher->child_count - 1];
  keel__event_emit(launcher, "respawn",
                   "\"uid\":%u,\"pid\":%ld,\"after_uid\":%u,\"restart\":%lld,\"max_restarts\":%lld",
                   (unsigned)spare->uid, (long)spare->pid, (unsigned)failed->uid,
                   (long long)launcher->restarts_used, (long long)launcher->options.max_restarts);
  keel__display_note(launcher, "respawned spare uid %u for uid %u", (unsigned)spare->uid,
                     (unsigned)failed->uid);
}

/* The epoch of an agree/ or decide/ key ("agree/00000003/..."); -1 for other keys. */
static int64_t agreement_epoch(const char *key) {
  const char *slash = strchr(key, '/');
  bool agreement = strncmp(key, "agree/", 6) == 0 || strncmp(key, "decide/", 7) == 0;
  return agreement && slash != NULL ? strtoll(slash + 1, NULL, 10) : -1;
}

/* Whether key follows the live processes (proc/, spare/), the two newest agreements or the
 * nodes (node/<i>, event/node/<i>, decision/node/<i>, root): its count moves with the job's
 * size, not with its age. */
static bool key_is_live(const char *key, int64_t newest_epoch) {
  static const char *const sized[] = {"proc/",       "spare/",         "node/",
                                      "event/node/", "decision/node/", "uids/node/"};
  for (size_t i = 0; i < sizeof sized / sizeof sized[0]; i++)
    if (strncmp(key, sized[i], strlen(sized[i])) == 0) return true;
  if (strcmp(key, "root") == 0) return true;
  int64_t epoch = agreement_epoch(key);
  return epoch >= 0 && epoch + 1 >= newest_epoch;
}

void keel__launcher_store_census(keel__launcher *launcher, const char *when) {
  keel_store_entry *entries = NULL;
  size_t count = 0;
  if (keel_store_list(launcher->store, "", &entries, &count, NULL) != KEEL_OK) return;
  size_t bytes = 0, residue = 0;
  int64_t newest_epoch = -1;
  for (size_t i = 0; i < count; i++) {
    bytes += strlen(entries[i].key) + entries[i].value_length;
    int64_t epoch = agreement_epoch(entries[i].key);
    if (epoch > newest_epoch) newest_epoch = epoch;
  }
  for (size_t i = 0; i < count; i++) residue += !key_is_live(entries[i].key, newest_epoch);
  keel_store_entries_free(entries, count);
  keel__event_emit(launcher, "store", "\"when\":\"%s\",\"keys\":%zu,\"bytes\":%zu,\"residue\":%zu",
                   when, count, bytes, residue);
}

/* With --failure-domain node, a failed worker takes its node down with it. */
void keel__launcher_fence_node(keel__launcher *launcher, const keel__child *failed) {
  if (!launcher->options.node_failure_domain) return;
  char reason[96];
  snprintf(reason, sizeof reason, "node %lld failed (uid %u)", (long long)failed->node,
           (unsigned)failed->uid);
  for (size_t i = 0; i < launcher->child_count; i++) {
    keel__child *child = &launcher->children[i];
    if (child->node == failed->node && child->alive) keel__child_fence(launcher, child, reason);
  }
}

/* --min-world: ranks that can remain are the live rank holders, plus the live spares when
 * they are there to replace. Below the minimum the job cannot go on usefully. */
static void launcher_check_min_world(keel__launcher *launcher, const keel__child *failed) {
  /* An agent sees its own node only: the job's world is not its to judge. */
  if (launcher->agent.active) return;
  size_t remaining = keel__children_alive(launcher, true);
  if (launcher->options.on_failure == KEEL__ON_FAILURE_REPLACE)
    remaining = keel__children_alive(launcher, false);
  if (remaining == 0 || (int64_t)remaining >= launcher->options.min_world) return;
  KEEL_LOG_E("launcher",
             "%zu ranks can remain after uid %u failed, fewer than --min-world %lld;"
             " stopping the job",
             remaining, (unsigned)failed->uid, (long long)launcher->options.min_world);
  int code = keel__wait_status_code(failed->wait_status);
  keel__launcher_terminate(launcher, code == 0 ? KEEL__EXIT_FAILURE : code, SIGTERM);
}

void keel__launcher_child_exited(keel__launcher *launcher, keel__child *child) {
  bool failed =
      child->fenced || !WIFEXITED(child->wait_status) || WEXITSTATUS(child->wait_status) != 0;
  if (keel__child_left_for_restart(launcher, child)) {
    keel__display_note(launcher, "uid %u saved and left for the restart", (unsigned)child->uid);
  } else if (failed) {
    char outcome[32];
    keel__wait_status_text(child->wait_status, outcome, sizeof outcome);
    keel__display_note(launcher, "uid %u ended (%s)", (unsigned)child->uid, outcome);
  }
  if (launcher->phase != KEEL__PHASE_RUNNING) return;
  if (launcher->options.on_failure == KEEL__ON_FAILURE_RESTART) {
    keel__restart_child_exited(launcher, child, failed);
    return;
  }
  if (failed && child->holds_rank) {
    keel__launcher_fence_node(launcher, child);
    launcher_respawn(launcher, child);
    launcher_check_min_world(launcher, child);
  }
  keel__launcher_check_end(launcher);
}

/* ---- the loop's inputs */
/* A first SIGINT or SIGTERM stops the job in order; a second one (or one while the job is
 * already ending) kills it at once. */
static void launcher_handle_signals(keel__launcher *launcher) {
  struct signalfd_siginfo info;
  while (read(launcher->signal_fd, &info, sizeof info) == (ssize_t)sizeof info) {
    if (info.ssi_signo == SIGCHLD) continue;
    int signal_number = (int)info.ssi_signo;
    if (launcher->phase == KEEL__PHASE_RUNNING) {
      keel__launcher_begin_stopping(launcher, signal_number);
      continue;
    }
    KEEL_LOG_W("launcher", "%s: killing the job", strsignal(signal_number));
    int code = launcher->stop_signal ? launcher->exit_code : 128 + signal_number;
    keel__launcher_terminate(launcher, code, SIGKILL);
  }
  keel__children_reap(launcher);
}

static void launcher_handle_suspect(keel__launcher *launcher, const keel__report *report) {
  keel__child *child = keel__child_by_uid(launcher, report->uid);
  if (child == NULL || !child->alive || launcher->phase != KEEL__PHASE_RUNNING) return;
  char reason[200];
  snprintf(reason, sizeof reason, "suspected (%s)", report->text);
  keel__child_fence(launcher, child, reason);
}

static void launcher_handle_report(keel__launcher *launcher, const keel__report *report) {
  keel__root_note_report(launcher, report);
  bool about_process = report->kind != KEEL__REPORT_NODE && report->kind != KEEL__REPORT_NODE_GONE;
  keel__child *child = about_process ? keel__child_by_uid(launcher, report->uid) : NULL;
  switch ((keel__report_kind)report->kind) {
    case KEEL__REPORT_PROC:
      launcher_note_proc(launcher, report->uid, report->rank, report->epoch);
      break;
    case KEEL__REPORT_PROC_GONE:
      /* A process that leaves in order may delete its key just before it exits; the fence
       * waits a grace period for that exit to be reaped first. */
      if (child != NULL && child->alive && child->lease_lost_ns == 0)
        child->lease_lost_ns = keel_now_ns();
      /* The last rank holder of another node may just have left. */
      if (launcher->agent.active && child == NULL) keel__launcher_check_end(launcher);
      break;
    case KEEL__REPORT_SUSPECT:
      launcher_handle_suspect(launcher, report);
      break;
    case KEEL__REPORT_REQUEST:
      keel__join_requests_handle(launcher);
      break;
    case KEEL__REPORT_NODE:
    case KEEL__REPORT_NODE_GONE:
      break;
  }
}

static void launcher_handle_reports(keel__launcher *launcher) {
  /* Exits first: a report about a process that has just exited must not fence its pid. */
  keel__children_reap(launcher);
  keel__report report;
  while (read(launcher->report_read_fd, &report, sizeof report) == (ssize_t)sizeof report)
    launcher_handle_report(launcher, &report);
}

/* A lapsed lease (RUNTIME.md: the process is hung) is fenced once the process has had time
 * to be reaped: a process that leaves in order revokes its lease before it exits, and may
 * take a while to exit (keel_finalize revokes, then the program tears down). A stopped
 * process cannot be leaving, so it is fenced soon; one that still runs gets longer. */
static int64_t lapse_fence_after(const keel__launcher *launcher, const keel__child *child,
                                 int64_t now_ns) {
  int64_t elapsed = now_ns - child->lease_lost_ns;
  if (elapsed < launcher->stopped_grace_ns) return launcher->stopped_grace_ns;
  return keel__child_stopped(child) ? launcher->stopped_grace_ns : launcher->running_grace_ns;
}

/* RUNTIME.md: keel_finalize writes left/<uid> before it drops its lease; such a process is
 * finishing in order (it may run on for a while after finalize), not hung. */
static bool child_left_in_order(keel__launcher *launcher, const keel__child *child) {
  char key[64];
  snprintf(key, sizeof key, "left/%u", (unsigned)child->uid);
  return keel__store_has(launcher->store, key);
}

/* A child its parent saw stop, and that is still stopped a stopped grace later, is hung:
 * a process stopped as a whole renews no lease and answers no peer. */
static void launcher_fence_stopped(keel__launcher *launcher, int64_t now_ns) {
  if (launcher->phase != KEEL__PHASE_RUNNING) return;
  for (size_t i = 0; i < launcher->child_count; i++) {
    keel__child *child = &launcher->children[i];
    if (!child->alive || child->stopped_ns == 0) continue;
    if (now_ns - child->stopped_ns < launcher->stopped_grace_ns) continue;
    int64_t stopped_ms = (now_ns - child->stopped_ns) / 1000000;
    child->stopped_ns = 0;
    if (!keel__child_stopped(child)) continue; /* continued, its SIGCHLD not read yet */
    char reason[64];
    snprintf(reason, sizeof reason, "stopped for %lld ms", (long long)stopped_ms);
    keel__child_fence(launcher, child, reason);
  }
}

static void launcher_fence_lapsed(keel__launcher *launcher, int64_t now_ns) {
  if (launcher->phase != KEEL__PHASE_RUNNING) return;
  bool reaped = false;
  for (size_t i = 0; i < launcher->child_count; i++) {
    keel__child *child = &launcher->children[i];
    if (!child->alive || child->lease_lost_ns == 0) continue;
    if (now_ns - child->lease_lost_ns < lapse_fence_after(launcher, child, now_ns)) continue;
    if (!reaped) keel__children_reap(launcher);
    reaped = true;
    if (!child->alive) continue;
    if (!keel__child_stopped(child) && child_left_in_order(launcher, child)) {
      child->lease_lost_ns = 0; /* it left; its exit will be reaped whenever it comes */
      continue;
    }
    keel__child_fence(launcher, child,
                      keel__child_stopped(child) ? "lease expired: the process is stopped"
                                                 : "lease expired: the process is hung");
  }
}

/* When the loop must next look at a lapsed child: at the end of its grace, and meanwhile
 * every stopped-grace period, in case it is stopped since. */
static int64_t lapse_next_check(const keel__launcher *launcher, const keel__child *child,
                                int64_t now_ns) {
  int64_t soon = child->lease_lost_ns + launcher->stopped_grace_ns;
  if (now_ns < soon) return soon;
  int64_t last = child->lease_lost_ns + launcher->running_grace_ns;
  int64_t recheck = now_ns + launcher->stopped_grace_ns;
  return recheck < last ? recheck : last;
}

static void launcher_handle_deadlines(keel__launcher *launcher, int64_t now_ns) {
  if (launcher->phase == KEEL__PHASE_RUNNING && now_ns >= launcher->timeout_deadline_ns) {
    KEEL_LOG_E("launcher", "--timeout passed: killing the job");
    keel__event_emit(launcher, "timeout", NULL);
    keel__launcher_terminate(launcher, KEEL__EXIT_TIMEOUT, SIGKILL);
  }
  launcher_fence_stopped(launcher, now_ns);
  launcher_fence_lapsed(launcher, now_ns);
  keel__agent_tick(launcher, now_ns);
  keel__restart_round_tick(launcher, now_ns);
  keel__joiners_tick(launcher, now_ns);
  keel__servers_tick(launcher, now_ns);
  if (now_ns >= launcher->end_recheck_ns) {
    launcher->end_recheck_ns = KEEL_NO_DEADLINE;
    keel__launcher_check_end(launcher);
  }
  if (launcher->phase != KEEL__PHASE_RUNNING && now_ns >= launcher->phase_deadline_ns) {
    if (launcher->phase == KEEL__PHASE_ENDING && keel__children_alive(launcher, false) > 0)
      KEEL_LOG_I("launcher", "stopping the spares and joiners left after job/done");
    if (launcher->phase == KEEL__PHASE_STOPPING && keel__children_alive(launcher, false) > 0)
      KEEL_LOG_W("launcher", "processes still there %.0f s after the stop: killing them",
                 (double)stop_grace_ns() / 1e9);
    keel__children_signal(launcher, SIGKILL);
    launcher->phase_deadline_ns = KEEL_NO_DEADLINE;
  }
  keel__display_tick(launcher, now_ns);
}

static int64_t launcher_next_deadline(const keel__launcher *launcher) {
  int64_t next = keel__display_deadline(launcher);
  if (launcher->phase == KEEL__PHASE_RUNNING && launcher->timeout_deadline_ns < next)
    next = launcher->timeout_deadline_ns;
  if (keel__joiners_deadline(launcher) < next) next = keel__joiners_deadline(launcher);
  if (keel__restart_round_deadline(launcher) < next) next = keel__restart_round_deadline(launcher);
  if (keel__agent_deadline(launcher) < next) next = keel__agent_deadline(launcher);
  if (keel__servers_deadline(launcher) < next) next = keel__servers_deadline(launcher);
  if (launcher->end_recheck_ns < next) next = launcher->end_recheck_ns;
  if (launcher->phase != KEEL__PHASE_RUNNING && launcher->phase_deadline_ns < next)
    next = launcher->phase_deadline_ns;
  int64_t now_ns = keel_now_ns();
  for (size_t i = 0; launcher->phase == KEEL__PHASE_RUNNING && i < launcher->child_count; i++) {
    const keel__child *child = &launcher->children[i];
    if (child->alive && child->stopped_ns != 0 &&
        child->stopped_ns + launcher->stopped_grace_ns < next)
      next = child->stopped_ns + launcher->stopped_grace_ns;
    if (!child->alive || child->lease_lost_ns == 0) continue;
    int64_t check_at = lapse_next_check(launcher, child, now_ns);
    if (check_at < next) next = check_at;
  }
  return next;
}

/* Done once the job is over and every child, fenced ones and servers included, has been
 * reaped. */
static bool launcher_finished(const keel__launcher *launcher) {
  return launcher->phase != KEEL__PHASE_RUNNING && keel__children_unreaped(launcher, 0) == 0 &&
         keel__servers_unreaped(launcher) == 0;
}

/* Waits of the launcher's own (its store requests, the agent's keepalives) that ended past
 * their deadline: a `wait_late` event, as a worker's (keel__waits_late_report). */
static void launcher_waits_late_note(keel__launcher *launcher) {
  keel_waits_late late;
  if (!keel_waits_late_take(&late)) return;
  char fields[224];
  keel_waits_late_format(&late, fields, sizeof fields);
  KEEL_LOG_W("launcher", "waits ended past their deadline: %s", fields);
  keel__event_emit(launcher, "wait_late", "%s", fields);
}

static void launcher_loop(keel__launcher *launcher) {
  while (!launcher_finished(launcher)) {
    struct pollfd fds[3] = {
        {.fd = launcher->signal_fd, .events = POLLIN},
        {.fd = launcher->status_read_fd, .events = POLLIN},
        {.fd = launcher->report_read_fd, .events = POLLIN},
    };
    int ready = poll(fds, 3, keel_poll_timeout_ms(launcher_next_deadline(launcher)));
    if (ready < 0 && errno != EINTR) {
      KEEL_LOG_E("launcher", "poll: %s", strerror(errno));
      keel__launcher_terminate(launcher, KEEL__EXIT_FAILURE, SIGKILL);
    }
    if (ready > 0 && fds[0].revents != 0) launcher_handle_signals(launcher);
    if (ready > 0 && fds[1].revents != 0) keel__status_drain(launcher);
    if (ready > 0 && fds[2].revents != 0) launcher_handle_reports(launcher);
    launcher_handle_deadlines(launcher, keel_now_ns());
    launcher_waits_late_note(launcher);
  }
}

/* ---- setup and teardown, each step undone in reverse by launcher_close */
static keel_status signals_open(keel__launcher *launcher) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  /* Blocked before any thread starts (the store's included), so that every thread inherits
   * the mask and these signals reach only the signalfd. */
  sigprocmask(SIG_BLOCK, &set, &launcher->old_mask);
  launcher->signal_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (launcher->signal_fd < 0) {
    keel_status status = keel_status_from_errno(errno);
    KEEL_LOG_E("launcher", "signalfd: %s", strerror(errno));
    sigprocmask(SIG_SETMASK, &launcher->old_mask, NULL);
    return status;
  }
  /* A reader of our stderr that goes away must not kill the launcher mid-job. */
  struct sigaction ignore = {.sa_handler = SIG_IGN};
  sigaction(SIGPIPE, &ignore, NULL);
  return KEEL_OK;
}

static keel_status store_open(keel__launcher *launcher) {
  keel_status status = keel_auth_generate(&launcher->auth);
  if (status != KEEL_OK) {
    KEEL_LOG_E("launcher", "cannot make the job's token: %s", keel_strerror(status));
    return status;
  }
  launcher->auth.local_id = KEEL__LAUNCHER_ID;
  const keel__run_options *options = &launcher->options;
  if (launcher->agent.active) return keel__agent_store_open(launcher);
  if (options->rdzv_endpoint != NULL) {
    /* An outside store (etcd): the workers inherit its address and TLS files. */
    static const char *const tls_names[] = {"KEEL_RDZV_CA", "KEEL_RDZV_CERT", "KEEL_RDZV_KEY"};
    for (int i = 0; i < 3; i++)
      if (options->rdzv_tls[i] != NULL) setenv(tls_names[i], options->rdzv_tls[i], 1);
    snprintf(launcher->endpoint, sizeof launcher->endpoint, "%s", options->rdzv_endpoint);
  } else {
    status = keel_store_server_start(launcher->store_listen, &launcher->auth, &launcher->server);
    if (status != KEEL_OK) {
      KEEL_LOG_E("launcher", "cannot start the store: %s", keel_strerror(status));
      return status;
    }
    snprintf(launcher->endpoint, sizeof launcher->endpoint, "%s",
             keel_store_server_address(launcher->server));
  }
  status = keel_store_connect(launcher->endpoint, &launcher->auth,
                              keel_deadline_after_ns(CONNECT_DEADLINE_NS), &launcher->store);
  if (status != KEEL_OK) {
    KEEL_LOG_E("launcher", "cannot connect to the store: %s", keel_strerror(status));
    keel_store_server_stop(launcher->server);
    launcher->server = NULL;
  }
  return status;
}

/* The workers' status lines come over a SOCK_SEQPACKET pair: each line is one record (lines
 * of several workers never mix), a worker sends without blocking or SIGPIPE, and when the
 * launcher dies its end hangs up, which is how a worker notices (docs/RUNTIME.md). Both ends
 * are close-on-exec; the loop's is non-blocking. */
static keel_status status_socket_open(int *read_fd_p, int *write_fd_p) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    KEEL_LOG_E("launcher", "socketpair: %s", strerror(errno));
    return keel_status_from_errno(errno);
  }
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  shutdown(fds[0], SHUT_WR);
  shutdown(fds[1], SHUT_RD);
  *read_fd_p = fds[0];
  *write_fd_p = fds[1];
  return KEEL_OK;
}

/* The watchers' report pipe is close-on-exec; only the loop's read end is non-blocking. */
static keel_status pipe_open(int *read_fd_p, int *write_fd_p) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    KEEL_LOG_E("launcher", "pipe: %s", strerror(errno));
    return keel_status_from_errno(errno);
  }
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  *read_fd_p = fds[0];
  *write_fd_p = fds[1];
  return KEEL_OK;
}

static void pipe_close(int *read_fd, int *write_fd) {
  if (*read_fd >= 0) close(*read_fd);
  if (*write_fd >= 0) close(*write_fd);
  *read_fd = *write_fd = -1;
}

static keel_status events_open(keel__launcher *launcher) {
  if (launcher->options.events_path == NULL) return KEEL_OK;
  /* The agents of a host append to the file their supervisor began. */
  int truncate = launcher->agent.supervised ? 0 : O_TRUNC;
  launcher->events_fd = open(launcher->options.events_path,
                             O_WRONLY | O_CREAT | truncate | O_APPEND | O_CLOEXEC, 0644);
  if (launcher->events_fd >= 0) return KEEL_OK;
  fprintf(stderr, "keel run: cannot open --events %s: %s\n", launcher->options.events_path,
          strerror(errno));
  return keel_status_from_errno(errno);
}

static keel_status job_file_open(keel__launcher *launcher) {
  /* The supervisor of a host's agents writes the one job file. */
  if (launcher->agent.supervised) return KEEL_OK;
  keel__job_info info = {.launcher_pid = getpid(), .auth = launcher->auth};
  snprintf(info.store, sizeof info.store, "%s", launcher->endpoint);
  keel_status status =
      keel__job_file_write(&info, launcher->job_file_path, sizeof launcher->job_file_path);
  if (status == KEEL_OK || !launcher->agent.active) return status;
  /* Agents of one job started by hand on one host: the first one's file serves the tools. */
  launcher->job_file_path[0] = '\0';
  return KEEL_OK;
}

static keel_status watchers_open(keel__launcher *launcher) {
  uint32_t limit =
      launcher->agent.active ? keel__agent_uid_limit(launcher) : (uint32_t)launcher->child_capacity;
  keel_status status = keel__watcher_start(launcher->endpoint, &launcher->auth, "proc/", limit,
                                           launcher->report_write_fd, &launcher->proc_watcher);
  if (status != KEEL_OK) return status;
  status = keel__watcher_start(launcher->endpoint, &launcher->auth, "suspect/", limit,
                               launcher->report_write_fd, &launcher->suspect_watcher);
  if (status != KEEL_OK) goto fail_stop_proc_watcher;
  /* A job of agents does not grow (run_options.c): nobody to hear `keel join`; its agents
   * watch each other's node/ keys instead. */
  if (launcher->agent.active) {
    status = keel__watcher_start(launcher->endpoint, &launcher->auth, "node/",
                                 (uint32_t)launcher->agent.node_count, launcher->report_write_fd,
                                 &launcher->node_watcher);
    if (status != KEEL_OK) goto fail_stop_suspect_watcher;
    return KEEL_OK;
  }
  status = keel__watcher_start(launcher->endpoint, &launcher->auth, "request/", 0,
                               launcher->report_write_fd, &launcher->request_watcher);
  if (status != KEEL_OK) goto fail_stop_suspect_watcher;
  return KEEL_OK;

fail_stop_suspect_watcher:
  keel__watcher_stop(launcher->suspect_watcher);
  launcher->suspect_watcher = NULL;
fail_stop_proc_watcher:
  keel__watcher_stop(launcher->proc_watcher);
  launcher->proc_watcher = NULL;
  return status;
}

keel_status keel__launcher_open_base(keel__launcher *launcher) {
  keel_status status = signals_open(launcher);
  if (status != KEEL_OK) return status;
  status = store_open(launcher);
  if (status != KEEL_OK) goto fail_close_signals;
  status = events_open(launcher);
  if (status != KEEL_OK) goto fail_close_store;
  status = job_file_open(launcher);
  if (status != KEEL_OK) goto fail_close_events;
  return KEEL_OK;

fail_close_events:
  if (launcher->events_fd >= 0) close(launcher->events_fd);
fail_close_store:
  keel_store_close(launcher->store);
  keel_store_server_stop(launcher->server);
fail_close_signals:
  close(launcher->signal_fd);
  sigprocmask(SIG_SETMASK, &launcher->old_mask, NULL);
  return status;
}

/* The signal mask stays as it is: the process is about to exit, and a pending SIGTERM
 * unblocked now would end it by signal instead of with the verdict. */
void keel__launcher_close_base(keel__launcher *launcher) {
  unlink(launcher->job_file_path);
  if (launcher->events_fd >= 0) close(launcher->events_fd);
  keel_store_close(launcher->store);
  keel_store_server_stop(launcher->server);
  close(launcher->signal_fd);
}

static keel_status launcher_open(keel__launcher *launcher) {
  keel_status status = keel__launcher_open_base(launcher);
  if (status != KEEL_OK) return status;
  status = status_socket_open(&launcher->status_read_fd, &launcher->status_write_fd);
  if (status != KEEL_OK) goto fail_close_base;
  status = pipe_open(&launcher->report_read_fd, &launcher->report_write_fd);
  if (status != KEEL_OK) goto fail_close_status_pipe;
  launcher->children = calloc(launcher->child_capacity, sizeof *launcher->children);
  status = launcher->children ? KEEL_OK : KEEL_ENOMEM;
  if (status != KEEL_OK) {
    KEEL_LOG_E("launcher", "no memory for %zu processes", launcher->child_capacity);
    goto fail_close_report_pipe;
  }
  status = keel__mem_service_start(launcher);
  if (status != KEEL_OK) goto fail_free_children;
  if (launcher->agent.active) status = keel__root_init(launcher);
  if (status != KEEL_OK) goto fail_stop_memory;
  status = watchers_open(launcher);
  if (status != KEEL_OK) goto fail_free_root;
  if (launcher->agent.active) status = keel__agent_register(launcher);
  if (status != KEEL_OK) goto fail_stop_watchers;
  keel__root_try(launcher);
  return KEEL_OK;

fail_stop_watchers:
  keel__watcher_stop(launcher->node_watcher);
  keel__watcher_stop(launcher->request_watcher);
  keel__watcher_stop(launcher->suspect_watcher);
  keel__watcher_stop(launcher->proc_watcher);
fail_free_root:
  keel__root_free(launcher);
fail_stop_memory:
  keel__mem_service_stop(launcher);
fail_free_children:
  free(launcher->children);
fail_close_report_pipe:
  pipe_close(&launcher->report_read_fd, &launcher->report_write_fd);
fail_close_status_pipe:
  pipe_close(&launcher->status_read_fd, &launcher->status_write_fd);
fail_close_base:
  keel__launcher_close_base(launcher);
  sigprocmask(SIG_SETMASK, &launcher->old_mask, NULL);
  return status;
}

void keel__launcher_metrics_start(keel__launcher *launcher) {
  if (launcher->options.metrics_port == 0 || launcher->metrics != NULL) return;
  const char *host = getenv("KEEL_HOST");
  if (host == NULL) host = "127.0.0.1";
  keel_status status =
      keel__metrics_start(host, (int)launcher->options.metrics_port, &launcher->metrics);
  if (status == KEEL_OK) {
    keel__event_emit(launcher, "metrics", "\"address\":\"%s\"",
                     keel__metrics_address(launcher->metrics));
    return;
  }
  KEEL_LOG_E("launcher", "cannot serve metrics on %s:%lld: %s (the job goes on without)", host,
             (long long)launcher->options.metrics_port, keel_strerror(status));
}

/* Undoes launcher_open once every child is reaped. */
static void launcher_close(keel__launcher *launcher) {
  keel__metrics_stop(launcher->metrics);
  keel__mem_service_stop(launcher);
  keel__agent_close(launcher);
  keel__watcher_stop(launcher->node_watcher);
  keel__watcher_stop(launcher->request_watcher);
  keel__watcher_stop(launcher->suspect_watcher);
  keel__watcher_stop(launcher->proc_watcher);
  keel__root_free(launcher);
  free(launcher->servers);
  free(launcher->children);
  pipe_close(&launcher->report_read_fd, &launcher->report_write_fd);
  pipe_close(&launcher->status_read_fd, &launcher->status_write_fd);
  keel__launcher_close_base(launcher);
}

void keel__launcher_init(keel__launcher *launcher, const keel__run_options *options) {
  launcher->options = *options;
  snprintf(launcher->store_listen, sizeof launcher->store_listen, "127.0.0.1:0");
  launcher->signal_fd = launcher->events_fd = -1;
  launcher->status_read_fd = launcher->status_write_fd = -1;
  launcher->report_read_fd = launcher->report_write_fd = -1;
  /* Joiners have a table budget of their own, so that `keel join` never takes the room of
   * a respawn: enough to grow to --max-world, or to refill it after every rank shrank away.
   * A job that restarts does not grow (`keel join` is refused), and each of its restarts
   * starts the whole world anew. */
  bool restarts = options->on_failure == KEEL__ON_FAILURE_RESTART;
  launcher->joiner_budget = restarts ? 0 : options->max_world;
  int64_t restarted = restarts ? options->world * options->max_restarts : options->max_restarts;
  launcher->child_capacity =
      (size_t)(options->world + options->spares + restarted + launcher->joiner_budget);
  launcher->join_at_ns = KEEL_NO_DEADLINE;
  launcher->phase = KEEL__PHASE_RUNNING;
  launcher->timeout_deadline_ns = KEEL_NO_DEADLINE;
  launcher->phase_deadline_ns = KEEL_NO_DEADLINE;
  launcher->end_recheck_ns = KEEL_NO_DEADLINE;
  launcher->servers_kill_ns = KEEL_NO_DEADLINE;
  /* Graces of a lapsed lease (lapse_fence_after): one keepalive period, bounded to
   * [100 ms, 1 s], for a stopped process; two lease lifetimes, 2 s at least, for one that
   * runs. */
  int64_t grace = options->heartbeat_ns / 3, minimum = SECOND_NS / 10;
  launcher->stopped_grace_ns = grace < minimum ? minimum : grace > SECOND_NS ? SECOND_NS : grace;
  grace = 2 * options->heartbeat_ns;
  launcher->running_grace_ns = grace < 2 * SECOND_NS ? 2 * SECOND_NS : grace;
  keel__agent_init(launcher);
  launcher->display.enabled = !launcher->options.quiet && isatty(STDERR_FILENO);
}

/* After an orderly stop, one line on where the state went and how to go on. */
static void launcher_say_where_state_is(const keel__launcher *launcher) {
  if (launcher->stop_signal == 0) return;
  const keel__run_options *options = &launcher->options;
  bool persisted = options->persist_every_steps > 0 || options->persist_every_ns > 0;
  if (options->ckpt == KEEL__CKPT_MEM && !persisted) {
    fprintf(stderr, "keel run: stopped (in-memory checkpoints end with the job: nothing was "
                    "kept; --ckpt-persist-every keeps some on disk)\n");
    return;
  }
  if (launcher->ckpt_dir[0] == '\0') {
    fprintf(stderr, "keel run: stopped (no checkpoint policy: nothing was saved)\n");
    return;
  }
  fprintf(stderr,
          "keel run: stopped; the state is in %s/%llu (go on with: keel run --resume %s/%llu "
          "...)\n",
          launcher->ckpt_dir, (unsigned long long)launcher->auth.job_id, launcher->ckpt_dir,
          (unsigned long long)launcher->auth.job_id);
}

void keel__launcher_emit_start(keel__launcher *launcher) {
  const keel__run_options *options = &launcher->options;
  char program[PATH_MAX * 2], ckpt_dir[PATH_MAX * 2 + 2] = "null";
  keel__json_escape(launcher->program_path, program, sizeof program);
  if (launcher->ckpt_dir[0] != '\0') {
    char escaped[PATH_MAX * 2];
    keel__json_escape(launcher->ckpt_dir, escaped, sizeof escaped);
    snprintf(ckpt_dir, sizeof ckpt_dir, "\"%s\"", escaped);
  }
  keel__event_emit(
      launcher, "job_start",
      "\"job_id\":\"%llu\",\"store\":\"%s\",\"launcher_pid\":%ld,\"world\":%lld,\"spares\":%lld,"
      "\"nnodes\":%lld,\"nproc_per_node\":%lld,\"on_failure\":\"%s\",\"failure_domain\":\"%s\","
      "\"ckpt\":\"%s\",\"ckpt_dir\":%s,\"max_restarts\":%lld,\"max_world\":%lld,"
      "\"join_delay_ns\":%lld,\"heartbeat_ns\":%lld,\"servers\":%lld,\"ec_data_blocks\":%lld,"
      "\"ec_parity_blocks\":%lld,\"ec_sync\":%s,\"program\":\"%s\"",
      (unsigned long long)launcher->auth.job_id, launcher->endpoint, (long)getpid(),
      (long long)options->world, (long long)options->spares, (long long)options->nnodes,
      (long long)options->nproc_per_node, keel__policy_name(options->on_failure),
      options->node_failure_domain ? "node" : "process", keel__ckpt_name(options->ckpt), ckpt_dir,
      (long long)options->max_restarts, (long long)options->max_world,
      (long long)options->join_delay_ns, (long long)options->heartbeat_ns,
      (long long)options->servers, (long long)options->ec_data_blocks,
      (long long)options->ec_parity_blocks, options->ec_sync ? "true" : "false", program);
}

static void launcher_spawn_all(keel__launcher *launcher) {
  launcher->start_ns = keel_now_ns();
  if (launcher->options.timeout_ns > 0)
    launcher->timeout_deadline_ns = keel_deadline_after_ns(launcher->options.timeout_ns);
  const keel__agent_state *agent = &launcher->agent;
  if (agent->active) {
    if (!keel__children_spawn(launcher, KEEL__ROLE_WORKER, agent->workers)) return;
    if (!keel__children_spawn(launcher, KEEL__ROLE_JOINER, agent->joiners)) return;
    if (!keel__children_spawn(launcher, KEEL__ROLE_SPARE, agent->spares)) return;
    keel__launcher_check_end(launcher); /* a spare node holds no rank: it may wait */
    return;
  }
  /* The servers first: the workers' clients find them through the store as they come. */
  if (!keel__servers_spawn(launcher)) return;
  if (!keel__children_spawn(launcher, KEEL__ROLE_WORKER, launcher->options.world)) return;
  if (!keel__children_spawn(launcher, KEEL__ROLE_SPARE, launcher->options.spares)) return;
  keel__joiners_schedule(launcher);
}

int keel__command_run(int argc, char **argv) {
  keel__run_options options;
  keel__parse_result parsed = keel__run_options_parse(argc, argv, &options);
  if (parsed != KEEL__PARSE_OK) return parsed == KEEL__PARSE_HELP ? 0 : KEEL__EXIT_USAGE;
  keel_log_set_identity(options.node_rank >= 0 ? "keel agent" : "keel run");
  if (options.agents && options.node_rank < 0) return keel__nodes_run(&options);
  keel__launcher *launcher = calloc(1, sizeof *launcher);
  if (launcher == NULL) return KEEL__EXIT_FAILURE;
  keel__launcher_init(launcher, &options);
  int exit_code = KEEL__EXIT_NOT_FOUND;
  if (!program_resolve(options.program_argv[0], launcher->program_path,
                       sizeof launcher->program_path)) {
    fprintf(stderr, "keel run: %s: program not found or not executable\n", options.program_argv[0]);
    goto free_launcher;
  }
  exit_code = KEEL__EXIT_FAILURE;
  if (!ckpt_dir_make(launcher) || !resume_dir_check(launcher)) goto free_launcher;
  if (launcher_open(launcher) != KEEL_OK) {
    /* A later life of a node that cannot start leaves the node lost, as its fence did; the
     * job's outcome is the other nodes'. */
    if (launcher->agent.rejoined) exit_code = KEEL__EXIT_FENCED;
    goto free_launcher;
  }
  if (!launcher->agent.active) keel__launcher_metrics_start(launcher);
  if (!launcher->agent.supervised) keel__launcher_emit_start(launcher);
  launcher_spawn_all(launcher);
  launcher_loop(launcher);
  /* Lines the last processes wrote just before they exited may still be in the pipe. */
  keel__status_drain(launcher);
  exit_code = launcher->exit_code;
  bool rejoin = keel__agent_rejoin_wait(launcher);
  int64_t extras_started = launcher->agent.extras_started;
  keel__launcher_store_census(launcher, "end");
  keel__display_finish(launcher);
  launcher_say_where_state_is(launcher);
  double seconds = (double)(keel_now_ns() - launcher->start_ns) / 1e9;
  if (launcher->agent.supervised)
    keel__event_emit(launcher, "agent_end", "\"node\":%lld,\"code\":%d,\"seconds\":%.3f",
                     (long long)launcher->agent.node, exit_code, seconds);
  else
    keel__event_emit(launcher, "job_end", "\"code\":%d,\"seconds\":%.3f", exit_code, seconds);
  launcher_close(launcher);
  if (rejoin) keel__agent_rejoin_exec(&options, extras_started);
free_launcher:
  free(launcher);
  return exit_code;
}
