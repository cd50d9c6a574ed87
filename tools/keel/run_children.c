/* The launcher's children: spawning with the environment of docs/RUNTIME.md, reaping,
 * fencing by pid, and the verdict that becomes the exit code. A uid is the child's index in
 * the table, so uids are dense, never reused, and looked up without a search; an agent's
 * uids come from its node's ranges (run_agent.c). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"

extern char **environ;

/* The variables the launcher sets (RUNTIME.md); inherited values of these names are
 * dropped, those it leaves unset included. */
typedef enum own_variable {
  OWN_JOB_ID,
  OWN_JOB_TOKEN,
  OWN_STORE,
  OWN_UID,
  OWN_ROLE,
  OWN_WORLD,
  OWN_MAX_WORLD,
  OWN_NODE,
  OWN_ON_FAILURE,
  OWN_FAILURE_DOMAIN,
  OWN_STATUS_FD,
  OWN_TIMEOUT,
  OWN_VERIFY_EVERY,
  OWN_HEARTBEAT,
  OWN_CKPT,         /* unset without --ckpt */
  OWN_CKPT_DIR,     /* unset without --ckpt */
  OWN_CKPT_MEM,     /* unset without --ckpt mem */
  OWN_CKPT_MEM_DIR, /* unset without --ckpt mem */
  OWN_CKPT_PERSIST, /* unset without --ckpt-persist-every */
  OWN_RESTART,
  OWN_FIRST_UID,
  OWN_FIRST_EPOCH,
  OWN_LAUNCHER_PID,
  OWN_RESUME,           /* unset without --resume */
  OWN_EC_SERVERS,       /* unset without --servers */
  OWN_EC_DATA_BLOCKS,   /* unset without --servers */
  OWN_EC_PARITY_BLOCKS, /* unset without --servers */
  OWN_EC_WORKERS,       /* unset without --servers */
  OWN_VARIABLE_COUNT,
} own_variable;

static const char *const own_variable_names[OWN_VARIABLE_COUNT] = {
    [OWN_JOB_ID] = "KEEL_JOB_ID",
    [OWN_JOB_TOKEN] = "KEEL_JOB_TOKEN",
    [OWN_STORE] = "KEEL_STORE",
    [OWN_UID] = "KEEL_UID",
    [OWN_ROLE] = "KEEL_ROLE",
    [OWN_WORLD] = "KEEL_WORLD",
    [OWN_MAX_WORLD] = "KEEL_MAX_WORLD",
    [OWN_NODE] = "KEEL_NODE",
    [OWN_ON_FAILURE] = "KEEL_ON_FAILURE",
    [OWN_FAILURE_DOMAIN] = "KEEL_FAILURE_DOMAIN",
    [OWN_STATUS_FD] = "KEEL_STATUS_FD",
    [OWN_TIMEOUT] = "KEEL_TIMEOUT",
    [OWN_VERIFY_EVERY] = "KEEL_VERIFY_EVERY",
    [OWN_HEARTBEAT] = "KEEL_HEARTBEAT",
    [OWN_CKPT] = "KEEL_CKPT",
    [OWN_CKPT_DIR] = "KEEL_CKPT_DIR",
    [OWN_CKPT_MEM] = "KEEL_CKPT_MEM",
    [OWN_CKPT_MEM_DIR] = "KEEL_CKPT_MEM_DIR",
    [OWN_CKPT_PERSIST] = "KEEL_CKPT_PERSIST",
    [OWN_RESTART] = "KEEL_RESTART",
    [OWN_FIRST_UID] = "KEEL_FIRST_UID",
    [OWN_FIRST_EPOCH] = "KEEL_FIRST_EPOCH",
    [OWN_LAUNCHER_PID] = "KEEL_LAUNCHER_PID",
    [OWN_RESUME] = "KEEL_RESUME",
    [OWN_EC_SERVERS] = "KEEL_EC_SERVERS",
    [OWN_EC_DATA_BLOCKS] = "KEEL_EC_DATA_BLOCKS",
    [OWN_EC_PARITY_BLOCKS] = "KEEL_EC_PARITY_BLOCKS",
    [OWN_EC_WORKERS] = "KEEL_EC_WORKERS",
};
/* Room for the longest value, an absolute KEEL_CKPT_DIR. */
#define OWN_VARIABLE_BYTES (PATH_MAX + 32)

typedef struct child_environment {
  char **envp; /* inherited entries (borrowed from environ) followed by the set own[] */
  char own[OWN_VARIABLE_COUNT][OWN_VARIABLE_BYTES]; /* "": left unset */
} child_environment;

/* The KEEL_ROLE value of each role (RUNTIME.md). */
const char *keel__role_name(keel__role role) {
  static const char *const names[] = {"worker", "spare", "joiner", "server"};
  return (size_t)role < sizeof names / sizeof names[0] ? names[role] : "worker";
}

/* A worker's rank in its incarnation's first communicator. */
static int64_t worker_rank(const keel__launcher *launcher, uint32_t uid) {
  return (int64_t)uid - (int64_t)launcher->incarnation.first_uid;
}

/* Workers fill nodes in rank order; spares, respawns and joiners fill further nodes of the
 * same size after them, so a node's failure never takes the spares that are to replace it.
 * Servers run on the one host a job with servers has (run_options.c): node 0. */
static int64_t child_node(const keel__launcher *launcher, uint32_t uid, keel__role role) {
  const keel__run_options *options = &launcher->options;
  if (launcher->agent.active) return launcher->agent.node;
  if (role == KEEL__ROLE_SERVER) return 0;
  if (role == KEEL__ROLE_WORKER) return worker_rank(launcher, uid) / options->nproc_per_node;
  return options->nnodes + ((int64_t)uid - options->world) / options->nproc_per_node;
}

static bool is_own_variable(const char *entry) {
  const char *equals = strchr(entry, '=');
  size_t name_length = equals ? (size_t)(equals - entry) : strlen(entry);
  for (size_t i = 0; i < OWN_VARIABLE_COUNT; i++) {
    const char *name = own_variable_names[i];
    if (strlen(name) == name_length && strncmp(entry, name, name_length) == 0) return true;
  }
  return false;
}

/* Writes "NAME=value" into slot index of the child's own variables. */
static void own_variable_set(child_environment *environment, own_variable index, const char *format,
                             ...) __attribute__((format(printf, 3, 4)));

static void own_variable_set(child_environment *environment, own_variable index, const char *format,
                             ...) {
  char *slot = environment->own[index];
  int used = snprintf(slot, OWN_VARIABLE_BYTES, "%s=", own_variable_names[index]);
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(slot + used, OWN_VARIABLE_BYTES - (size_t)used, format, arguments);
  va_end(arguments);
}

/* The checkpoint variables, set only with --ckpt. */
static void own_ckpt_variables_fill(const keel__launcher *launcher,
                                    child_environment *environment) {
  if (launcher->options.ckpt == KEEL__CKPT_NONE) return;
  own_variable_set(environment, OWN_CKPT, "%s", keel__ckpt_name(launcher->options.ckpt));
  own_variable_set(environment, OWN_CKPT_DIR, "%s", launcher->ckpt_dir);
  if (launcher->options.ckpt != KEEL__CKPT_MEM) return;
  own_variable_set(environment, OWN_CKPT_MEM, "%s", launcher->options.ckpt_mem);
  own_variable_set(environment, OWN_CKPT_MEM_DIR, "%s", launcher->mem_dir);
  if (launcher->options.persist_every_steps > 0 || launcher->options.persist_every_ns > 0)
    own_variable_set(environment, OWN_CKPT_PERSIST, "1");
}

/* The parameter servers' shape (keel_ec_config_from_env), set only with --servers; the
 * synchronous mode's workers are the world, 0 means asynchronous. */
static void own_ec_variables_fill(const keel__launcher *launcher, child_environment *environment) {
  const keel__run_options *options = &launcher->options;
  if (options->servers == 0) return;
  own_variable_set(environment, OWN_EC_SERVERS, "%lld", (long long)options->servers);
  own_variable_set(environment, OWN_EC_DATA_BLOCKS, "%lld", (long long)options->ec_data_blocks);
  own_variable_set(environment, OWN_EC_PARITY_BLOCKS, "%lld", (long long)options->ec_parity_blocks);
  own_variable_set(environment, OWN_EC_WORKERS, "%lld",
                   (long long)(options->ec_sync ? options->world : 0));
}

static void own_variables_fill(const keel__launcher *launcher, const keel__child *child,
                               child_environment *environment) {
  const keel__run_options *options = &launcher->options;
  const keel__incarnation *incarnation = &launcher->incarnation;
  char token[2 * KEEL_TOKEN_BYTES + 1], timeout[32], heartbeat[32];
  keel_hex_encode(launcher->auth.token, KEEL_TOKEN_BYTES, token);
  keel__duration_format(options->collective_timeout_ns, timeout, sizeof timeout);
  keel__duration_format(options->heartbeat_ns, heartbeat, sizeof heartbeat);
  for (size_t i = 0; i < OWN_VARIABLE_COUNT; i++) environment->own[i][0] = '\0';
  own_variable_set(environment, OWN_JOB_ID, "%llu", (unsigned long long)launcher->auth.job_id);
  own_variable_set(environment, OWN_JOB_TOKEN, "%s", token);
  own_variable_set(environment, OWN_STORE, "%s", launcher->endpoint);
  own_variable_set(environment, OWN_UID, "%u", (unsigned)child->uid);
  own_variable_set(environment, OWN_ROLE, "%s", keel__role_name(child->role));
  own_variable_set(environment, OWN_WORLD, "%lld", (long long)options->world);
  own_variable_set(environment, OWN_MAX_WORLD, "%lld", (long long)options->max_world);
  own_variable_set(environment, OWN_NODE, "%lld", (long long)child->node);
  own_variable_set(environment, OWN_ON_FAILURE, "%s", keel__policy_name(options->on_failure));
  own_variable_set(environment, OWN_FAILURE_DOMAIN, "%s",
                   options->node_failure_domain ? "node" : "process");
  own_variable_set(environment, OWN_STATUS_FD, "%d", launcher->status_write_fd);
  own_variable_set(environment, OWN_TIMEOUT, "%s",
                   options->collective_timeout_auto ? "auto" : timeout);
  own_variable_set(environment, OWN_HEARTBEAT, "%s", heartbeat);
  if (options->verify_every > 0)
    own_variable_set(environment, OWN_VERIFY_EVERY, "%lld", (long long)options->verify_every);
  own_ckpt_variables_fill(launcher, environment);
  own_variable_set(environment, OWN_RESTART, "%lld", (long long)incarnation->index);
  own_variable_set(environment, OWN_FIRST_UID, "%u", (unsigned)incarnation->first_uid);
  own_variable_set(environment, OWN_FIRST_EPOCH, "%lld", (long long)incarnation->first_epoch);
  own_variable_set(environment, OWN_LAUNCHER_PID, "%ld", (long)getpid());
  if (launcher->resume_dir[0] != '\0')
    own_variable_set(environment, OWN_RESUME, "%s", launcher->resume_dir);
  own_ec_variables_fill(launcher, environment);
}

/* Builds the whole environment before fork: the child may only call async-signal-safe
 * functions, since the launcher has threads. */
static keel_status environment_build(const keel__launcher *launcher, const keel__child *child,
                                     child_environment *environment) {
  size_t inherited = 0;
  while (environ[inherited] != NULL) inherited++;
  environment->envp = calloc(inherited + OWN_VARIABLE_COUNT + 1, sizeof *environment->envp);
  if (environment->envp == NULL) return KEEL_ENOMEM;
  own_variables_fill(launcher, child, environment);
  size_t used = 0;
  for (size_t i = 0; i < inherited; i++) {
    if (!is_own_variable(environ[i])) environment->envp[used++] = environ[i];
  }
  for (size_t i = 0; i < OWN_VARIABLE_COUNT; i++) {
    if (environment->own[i][0] != '\0') environment->envp[used++] = environment->own[i];
  }
  return KEEL_OK;
}

static void write_text(const char *text) {
  ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
  (void)ignored;
}

/* In the child between fork and exec: async-signal-safe calls only. */
static void child_exec(const keel__launcher *launcher, pid_t launcher_pid, keel__role role,
                       const char *path, char *const *argv, char **envp) {
  sigprocmask(SIG_SETMASK, &launcher->old_mask, NULL);
  /* The launcher ignores SIGPIPE for itself; an ignored disposition would survive exec. */
  struct sigaction default_action = {.sa_handler = SIG_DFL};
  sigaction(SIGPIPE, &default_action, NULL);
  /* A process group of its own: a terminal's Ctrl-C or Ctrl-Z reaches the launcher alone,
   * which stops the job in order. No parent-death signal: a launcher killed with SIGKILL
   * hangs up the status socket, and each process notices, saves and leaves on its own. */
  /* An agent on a host of several keeps its node's processes in its own group: killing the
   * group is killing the node (keel inject kill-node). */
  if (!launcher->agent.supervised) setpgid(0, 0);
  /* A server has no status socket to hear the launcher's death by, nor state to save: it
   * stops as at the end of the job. The check below closes the race with a launcher that
   * died before the request. */
  if (role == KEEL__ROLE_SERVER) prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != launcher_pid) _exit(KEEL__EXIT_FAILURE);
  /* The status pipe's write end stays close-on-exec in the launcher (so no other exec'd
   * program holds it) and is opened to this child alone, at the same number. */
  fcntl(launcher->status_write_fd, F_SETFD, 0);
  execve(path, argv, envp);
  write_text("keel: cannot execute ");
  write_text(path);
  write_text("\n");
  _exit(KEEL__EXIT_NOT_FOUND);
}

void keel__child_role_fields(const keel__child *child, char *text, size_t capacity) {
  int used = snprintf(text, capacity, "\"role\":\"%s\"", keel__role_name(child->role));
  if (child->role == KEEL__ROLE_SERVER && used >= 0 && (size_t)used < capacity)
    snprintf(text + used, capacity - (size_t)used, ",\"index\":%lld,\"replacement\":%s",
             (long long)child->server_index, child->replacement ? "true" : "false");
}

keel_status keel__child_start(keel__launcher *launcher, keel__child *child, const char *path,
                              char *const *argv) {
  child->node = child_node(launcher, child->uid, child->role);
  child_environment environment;
  keel_status status = environment_build(launcher, child, &environment);
  if (status != KEEL_OK) return status;
  pid_t launcher_pid = getpid();
  pid_t pid = fork();
  if (pid == 0) child_exec(launcher, launcher_pid, child->role, path, argv, environment.envp);
  free(environment.envp);
  if (pid < 0) {
    KEEL_LOG_E("launcher", "cannot start uid %u: %s", (unsigned)child->uid, strerror(errno));
    return keel_status_from_errno(errno);
  }
  child->pid = pid;
  child->alive = true;
  char role[64];
  keel__child_role_fields(child, role, sizeof role);
  keel__event_emit(launcher, "spawn", "\"uid\":%u,\"pid\":%ld,%s,\"node\":%lld",
                   (unsigned)child->uid, (long)pid, role, (long long)child->node);
  return KEEL_OK;
}

keel_status keel__child_spawn(keel__launcher *launcher, keel__role role) {
  if (launcher->child_count >= launcher->child_capacity) return KEEL_ERANGE;
  uint32_t uid = launcher->agent.active ? keel__agent_next_uid(launcher, role)
                                        : (uint32_t)launcher->child_count;
  keel__child child = {
      .uid = uid,
      .role = role,
      .holds_rank = role == KEEL__ROLE_WORKER,
      .rank = role == KEEL__ROLE_WORKER ? worker_rank(launcher, uid) : -1,
      .epoch = launcher->incarnation.first_epoch,
  };
  keel_status status =
      keel__child_start(launcher, &child, launcher->program_path, launcher->options.program_argv);
  if (status == KEEL_OK) launcher->children[launcher->child_count++] = child;
  return status;
}

keel__child *keel__child_by_uid(keel__launcher *launcher, uint32_t uid) {
  if (!launcher->agent.active) return uid < launcher->child_count ? &launcher->children[uid] : NULL;
  /* An agent's uids are its node's ranges of the job's: its table is small, a search is. */
  for (size_t i = 0; i < launcher->child_count; i++)
    if (launcher->children[i].uid == uid) return &launcher->children[i];
  return NULL;
}

static keel__child *child_by_pid(keel__launcher *launcher, pid_t pid) {
  for (size_t i = 0; i < launcher->child_count; i++) {
    if (launcher->children[i].pid == pid && launcher->children[i].alive)
      return &launcher->children[i];
  }
  return keel__server_by_pid(launcher, pid);
}

void keel__wait_status_text(int wait_status, char *text, size_t capacity) {
  if (WIFEXITED(wait_status)) {
    snprintf(text, capacity, "%d", WEXITSTATUS(wait_status));
    return;
  }
  int signal_number = WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : 0;
  const char *name = sigabbrev_np(signal_number);
  if (name != NULL) {
    snprintf(text, capacity, "SIG%s", name);
    return;
  }
  snprintf(text, capacity, "SIG%d", signal_number);
}

/* A reaped process's lease ends now rather than a heartbeat later: its proc/ and spare/
 * keys go at once (nobody takes it for alive, and the store does not hold a dead process's
 * keys for a lease's life). */
static void lease_end(keel__launcher *launcher, uint32_t uid) {
  char key[64];
  snprintf(key, sizeof key, "proc/%u", (unsigned)uid);
  keel_store_entry *entry = NULL;
  if (keel_store_get(launcher->store, key, &entry) != KEEL_OK) return;
  int64_t lease = entry->lease;
  keel_store_entry_free(entry);
  if (lease != 0) keel_store_lease_revoke(launcher->store, lease);
}

/* dead/<uid>, for the runtime: the process is gone. */
static keel_status dead_key_put(keel__launcher *launcher, keel__child *child, const char *outcome) {
  char key[64], value[64];
  snprintf(key, sizeof key, "dead/%u", (unsigned)child->uid);
  int length = snprintf(value, sizeof value, "status=%s", outcome);
  keel_status status = keel_store_put(launcher->store, key, value, (size_t)length, 0, NULL);
  if (status != KEEL_OK)
    KEEL_LOG_E("launcher", "cannot record %s in the store: %s", key, keel_strerror(status));
  child->death_unrecorded = status != KEEL_OK;
  lease_end(launcher, child->uid);
  return status;
}

size_t keel__children_deaths_record(keel__launcher *launcher) {
  size_t written = 0;
  for (size_t i = 0; i < launcher->child_count; i++) {
    keel__child *child = &launcher->children[i];
    if (child->alive || !child->death_unrecorded) continue;
    char outcome[32];
    keel__wait_status_text(child->wait_status, outcome, sizeof outcome);
    written += dead_key_put(launcher, child, outcome) == KEEL_OK;
  }
  return written;
}

/* An exit is written where others can see it, the store first: dead/<uid> for the runtime
 * (a server, which no communicator knows, has its server/<i> key instead), then an event
 * for the user. */
static void child_record_exit(keel__launcher *launcher, keel__child *child) {
  char outcome[32];
  keel__wait_status_text(child->wait_status, outcome, sizeof outcome);
  if (child->role == KEEL__ROLE_SERVER)
    keel__server_key_put(launcher, child, outcome);
  else
    dead_key_put(launcher, child, outcome);
  /* "code" for an exit, "signal" for a kill (RUNTIME.md); "status" as in dead/<uid>. */
  char how[48], role[64];
  if (WIFEXITED(child->wait_status))
    snprintf(how, sizeof how, "\"code\":%d", WEXITSTATUS(child->wait_status));
  else
    snprintf(how, sizeof how, "\"signal\":\"%s\"", outcome);
  keel__child_role_fields(child, role, sizeof role);
  keel__event_emit(launcher, "exit",
                   "\"uid\":%u,\"pid\":%ld,%s,\"rank\":%lld,%s,\"status\":\"%s\",\"fenced\":%s",
                   (unsigned)child->uid, (long)child->pid, role, (long long)child->rank, how,
                   outcome, child->fenced ? "true" : "false");
}

/* The parent learns of a child's stop at once (WUNTRACED): a stopped process is fenced
 * after the stopped grace (run.c), long before its lease could lapse. */
void keel__children_reap(keel__launcher *launcher) {
  for (;;) {
    int wait_status;
    pid_t pid = waitpid(-1, &wait_status, WNOHANG | WUNTRACED | WCONTINUED);
    if (pid <= 0) return;
    keel__child *child = child_by_pid(launcher, pid);
    if (child == NULL) continue;
    if (WIFSTOPPED(wait_status) || WIFCONTINUED(wait_status)) {
      child->stopped_ns = WIFSTOPPED(wait_status) ? keel_now_ns() : 0;
      continue;
    }
    child->alive = false;
    child->wait_status = wait_status;
    child->exit_order = ++launcher->exits_seen;
    child_record_exit(launcher, child);
    if (child->role == KEEL__ROLE_SERVER)
      keel__server_exited(launcher, child);
    else
      keel__launcher_child_exited(launcher, child);
  }
}

void keel__child_fence(keel__launcher *launcher, keel__child *child, const char *reason) {
  if (!child->alive || child->fenced) return;
  /* A process that died already (a zombie not reaped yet) is no one to fence: its exit, not
   * a fence, is what happened to it. */
  char state = 0;
  int parent = 0;
  if (keel_process_stat(child->pid, &state, &parent) == KEEL_OK && (state == 'Z' || state == 'X'))
    return;
  /* SIGKILL also ends a stopped process, and nothing can catch it: a fence is final. */
  if (kill(child->pid, SIGKILL) != 0) {
    KEEL_LOG_E("launcher", "cannot fence uid %u (pid %ld): %s", (unsigned)child->uid,
               (long)child->pid, strerror(errno));
    return;
  }
  child->fenced = true;
  snprintf(child->fence_reason, sizeof child->fence_reason, "%s", reason);
  char escaped[256];
  keel__json_escape(reason, escaped, sizeof escaped);
  keel__event_emit(launcher, "fence", "\"uid\":%u,\"pid\":%ld,\"reason\":\"%s\"",
                   (unsigned)child->uid, (long)child->pid, escaped);
  keel__display_note(launcher, "fenced uid %u: %s", (unsigned)child->uid, reason);
  KEEL_LOG_W("launcher", "fencing uid %u (pid %ld): %s", (unsigned)child->uid, (long)child->pid,
             reason);
}

void keel__children_signal(keel__launcher *launcher, int signal_number) {
  for (size_t i = 0; i < launcher->child_count; i++) {
    if (launcher->children[i].alive) kill(launcher->children[i].pid, signal_number);
  }
}

size_t keel__children_alive(const keel__launcher *launcher, bool rank_holders_only) {
  size_t count = 0;
  for (size_t i = 0; i < launcher->child_count; i++) {
    const keel__child *child = &launcher->children[i];
    if (child->alive && !child->fenced && (child->holds_rank || !rank_holders_only)) count++;
  }
  return count;
}

/* Stopped by a signal ('T'), not in a tracing stop ('t'): a tracer holds that one, such as
 * LeakSanitizer's check of a sanitized process that is leaving in order, or a debugger. A
 * traced process is judged as a running one (its lease, then the longer grace). */
bool keel__child_stopped(const keel__child *child) {
  char state;
  pid_t parent;
  if (keel_process_stat(child->pid, &state, &parent) != KEEL_OK) return false;
  return state == 'T';
}

int keel__wait_status_code(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  return WIFSIGNALED(wait_status) ? 128 + WTERMSIG(wait_status) : KEEL__EXIT_FAILURE;
}

static bool finished_in_last_epoch(const keel__launcher *launcher, const keel__child *child) {
  return child->holds_rank && !child->alive && !child->fenced && WIFEXITED(child->wait_status) &&
         child->epoch == launcher->max_epoch;
}

/* The verdict (RUNTIME.md, "Exit codes"). Roles change at run time (a spare takes a rank),
 * so the rule reads what the store showed rather than the role a process started with:
 * a process "held a rank at the end" when it ever held a rank (started as a worker, or its
 * proc/ value showed one) and the last epoch its proc/ value showed is the newest epoch any
 * process showed. Among those that exited on their own, the first non-zero code by exit
 * order wins, else 0. A process killed, fenced or left in an older epoch was declared
 * failed and is no verdict, unless no rank holder finished in the last epoch at all: then
 * the first rank holder that ended badly gives the code (128+signal for a signal). An agent
 * is one node of the job: when ranks finished on other nodes (others_finished), its own
 * holders that all failed were replaced there, and no verdict either. */
int keel__children_verdict(const keel__launcher *launcher, bool others_finished) {
  const keel__child *first_nonzero = NULL, *first_bad = NULL;
  bool any_finished = false;
  /* Earlier incarnations (--on-failure restart) failed and were restarted: no verdict. */
  for (size_t i = launcher->incarnation.first_uid; i < launcher->child_count; i++) {
    const keel__child *child = &launcher->children[i];
    if (!child->holds_rank || child->alive) continue;
    int code = keel__wait_status_code(child->wait_status);
    bool earlier_bad = first_bad == NULL || child->exit_order < first_bad->exit_order;
    if ((code != 0 || child->fenced) && earlier_bad) first_bad = child;
    if (!finished_in_last_epoch(launcher, child)) continue;
    any_finished = true;
    bool earlier = first_nonzero == NULL || child->exit_order < first_nonzero->exit_order;
    if (code != 0 && earlier) first_nonzero = child;
  }
  if (first_nonzero != NULL) return keel__wait_status_code(first_nonzero->wait_status);
  if (any_finished || first_bad == NULL || others_finished) return 0;
  return keel__wait_status_code(first_bad->wait_status);
}

/* Children from first_uid on that are not reaped yet, fenced ones included. */
size_t keel__children_unreaped(const keel__launcher *launcher, size_t first_uid) {
  size_t count = 0;
  for (size_t i = first_uid; i < launcher->child_count; i++) count += launcher->children[i].alive;
  return count;
}

/* Starts count children in role; on a failure the job is killed and it returns false. */
bool keel__children_spawn(keel__launcher *launcher, keel__role role, int64_t count) {
  for (int64_t i = 0; i < count; i++) {
    if (keel__child_spawn(launcher, role) != KEEL_OK) {
      keel__launcher_terminate(launcher, KEEL__EXIT_FAILURE, SIGKILL);
      return false;
    }
  }
  return true;
}
