/* What the benchmarks that start whole `keel run` jobs share (bench/recovery.c, bench/jit.c):
 * finding the programs, starting a launcher with its output in a log, bounding and reaping
 * it, reading its events file line by line and each line's members (parsed with jansson).
 * Header-only, like bench_stats.h; single-threaded callers. */
#ifndef KEEL_BENCH_JOBS_H
#define KEEL_BENCH_JOBS_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "keel/core.h"

#define BENCH_SECOND_NS ((int64_t)1000 * 1000 * 1000)
#define BENCH_POLL_INTERVAL_NS (2 * 1000 * 1000)

static inline void bench_sleep_ns(int64_t duration_ns) {
  struct timespec pause = {duration_ns / BENCH_SECOND_NS, duration_ns % BENCH_SECOND_NS};
  nanosleep(&pause, NULL);
}

/* ---- why a trial failed */

typedef struct bench_verdict {
  bool ok;
  char why[200]; /* when not ok */
} bench_verdict;

static inline bool bench_fail(bench_verdict *verdict, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

/* Records why the trial failed (truncated to fit); returns false for the caller to pass on. */
static inline bool bench_fail(bench_verdict *verdict, const char *format, ...) {
  verdict->ok = false;
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(verdict->why, sizeof verdict->why, format, arguments);
  va_end(arguments);
  return false;
}

/* ---- members of the one-line JSON objects of RUNTIME.md */

/* The object that line holds, or NULL when it is not one JSON object (a line that is not
 * the launcher's, or one cut short). The caller json_decref()s it. */
static inline json_t *bench_json_parse(const char *line) {
  json_t *object = json_loads(line, 0, NULL);
  if (json_is_object(object)) return object;
  json_decref(object);
  return NULL;
}

/* Members of object: true and *value_p set when key is there with the right type, false
 * and *value_p untouched otherwise. An integer must be written as one (12.0 is not); a
 * double is any finite number. */
static inline bool bench_json_int(const json_t *object, const char *key, int64_t *value_p) {
  const json_t *value = json_object_get(object, key);
  if (!json_is_integer(value)) return false;
  *value_p = json_integer_value(value);
  return true;
}

static inline bool bench_json_double(const json_t *object, const char *key, double *value_p) {
  const json_t *value = json_object_get(object, key);
  if (!json_is_number(value) || !isfinite(json_number_value(value))) return false;
  *value_p = json_number_value(value);
  return true;
}

/* Whether member key is the string text exactly. */
static inline bool bench_json_string_is(const json_t *object, const char *key, const char *text) {
  const char *value = json_string_value(json_object_get(object, key));
  return value != NULL && strcmp(value, text) == 0;
}

/* ---- reading a file that a launcher appends to, one complete line at a time */

typedef struct bench_lines {
  char line[8192]; /* the incomplete tail of what was read */
  size_t length;
  int fd; /* -1 before the first read: set it so */
} bench_lines;

typedef void bench_line_cb(const char *line, void *arg);

/* Reads what was appended since the last call and calls line_cb on each complete line; a
 * file not there yet reads as empty. Close reader->fd when done (if >= 0). */
static inline void bench_lines_read(bench_lines *reader, const char *path, bench_line_cb *line_cb,
                                    void *arg) {
  if (reader->fd < 0) reader->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (reader->fd < 0) return;
  for (;;) {
    ssize_t got =
        read(reader->fd, reader->line + reader->length, sizeof reader->line - 1 - reader->length);
    if (got <= 0) return;
    reader->length += (size_t)got;
    reader->line[reader->length] = '\0';
    char *start = reader->line, *newline;
    while ((newline = strchr(start, '\n')) != NULL) {
      *newline = '\0';
      line_cb(start, arg);
      start = newline + 1;
    }
    reader->length -= (size_t)(start - reader->line);
    memmove(reader->line, start, reader->length);
    /* A line longer than the buffer is no line of RUNTIME.md's: drop it. */
    if (reader->length == sizeof reader->line - 1) reader->length = 0;
  }
}

/* Reads a whole file that no one writes any more; false if it cannot be opened. */
static inline bool bench_lines_read_file(const char *path, bench_line_cb *line_cb, void *arg) {
  bench_lines *reader = malloc(sizeof *reader); /* 8 KiB: not on the stack */
  if (reader == NULL) return false;
  reader->length = 0;
  reader->fd = -1;
  bench_lines_read(reader, path, line_cb, arg);
  bool opened = reader->fd >= 0;
  if (opened) close(reader->fd);
  free(reader);
  return opened;
}

/* ---- a launcher (or any keel command) run as a child, its stdout and stderr in a log */

typedef struct bench_job {
  pid_t launcher;
  bool reaped;
  int wait_status;
  char events_path[PATH_MAX];
  char log_path[PATH_MAX];
} bench_job;

/* Names the job's files <directory>/<name>.events and .log; false if a path is too long. */
static inline bool bench_job_paths(bench_job *job, const char *directory, const char *name) {
  int events = snprintf(job->events_path, sizeof job->events_path, "%s/%s.events", directory, name);
  int log = snprintf(job->log_path, sizeof job->log_path, "%s/%s.log", directory, name);
  return events < (int)sizeof job->events_path && log < (int)sizeof job->log_path;
}

/* environ with the variable named by setting ("NAME" or "NAME=VALUE") taken out, then
 * setting added if it has a value. The caller frees the array (not the strings). */
static inline char **bench_environment(const char *setting) {
  extern char **environ;
  size_t name_length = strcspn(setting, "=");
  size_t count = 0;
  while (environ[count] != NULL) count++;
  char **environment = calloc(count + 2, sizeof *environment);
  if (environment == NULL) return NULL;
  size_t kept = 0;
  for (size_t i = 0; i < count; i++) {
    bool same = strncmp(environ[i], setting, name_length) == 0 && environ[i][name_length] == '=';
    if (!same) environment[kept++] = environ[i];
  }
  if (setting[name_length] == '=') environment[kept++] = (char *)setting;
  return environment;
}

/* Starts argv[0] (a path) with argv, stdout and stderr to job->log_path, and the
 * environment changed by setting (see bench_environment; NULL: unchanged). */
static inline keel_status bench_job_spawn(bench_job *job, const char *const *argv,
                                          const char *setting) {
  extern char **environ;
  char **environment = setting ? bench_environment(setting) : environ;
  if (environment == NULL) return KEEL_ENOMEM;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, job->log_path,
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  int error =
      posix_spawn(&job->launcher, argv[0], &actions, NULL, (char *const *)argv, environment);
  posix_spawn_file_actions_destroy(&actions);
  if (environment != environ) free(environment);
  if (error != 0) {
    fprintf(stderr, "bench: cannot start %s: %s\n", argv[0], strerror(error));
    return keel_status_from_errno(error);
  }
  job->reaped = false;
  return KEEL_OK;
}

static inline bool bench_job_try_reap(bench_job *job) {
  if (job->reaped) return true;
  if (waitpid(job->launcher, &job->wait_status, WNOHANG) == job->launcher) job->reaped = true;
  return job->reaped;
}

/* Waits up to limit_ns for the launcher to exit; false if it is still running. */
static inline bool bench_job_wait(bench_job *job, int64_t limit_ns) {
  int64_t deadline = keel_now_ns() + limit_ns;
  while (!bench_job_try_reap(job)) {
    if (keel_now_ns() >= deadline) return false;
    bench_sleep_ns(BENCH_POLL_INTERVAL_NS);
  }
  return true;
}

/* Ends the job by the launcher's pid: SIGTERM lets it kill and reap its children; SIGKILL
 * if it does not (its children then die of PR_SET_PDEATHSIG). Always reaps the launcher. */
static inline void bench_job_kill(bench_job *job) {
  if (job->reaped) return;
  kill(job->launcher, SIGTERM);
  if (bench_job_wait(job, 3 * BENCH_SECOND_NS)) return;
  kill(job->launcher, SIGKILL);
  waitpid(job->launcher, &job->wait_status, 0);
  job->reaped = true;
}

/* The exit code, 128+signal for a signal. */
static inline int bench_job_exit_code(const bench_job *job) {
  if (WIFEXITED(job->wait_status)) return WEXITSTATUS(job->wait_status);
  return WIFSIGNALED(job->wait_status) ? 128 + WTERMSIG(job->wait_status) : -1;
}

/* ---- where things are */

/* This program's own path; false if neither /proc nor argv0 tells. */
static inline bool bench_self_path(const char *argv0, char *self, size_t capacity) {
  ssize_t length = readlink("/proc/self/exe", self, capacity - 1);
  if (length > 0) {
    self[length] = '\0';
    return true;
  }
  char resolved[PATH_MAX];
  if (realpath(argv0, resolved) == NULL) return false;
  return snprintf(self, capacity, "%s", resolved) < (int)capacity;
}

/* given if not NULL, else <this program's folder>/../<relative> (build/bench/x finds
 * build/bin/keel); false, with a message, if that is no executable. */
static inline bool bench_program_path(const char *self, const char *given, const char *relative,
                                      char *path, size_t capacity) {
  int used;
  if (given) {
    used = snprintf(path, capacity, "%s", given);
  } else {
    const char *slash = strrchr(self, '/');
    int folder_length = slash ? (int)(slash - self) : 1;
    used = snprintf(path, capacity, "%.*s/../%s", folder_length, slash ? self : ".", relative);
  }
  if (used >= (int)capacity || access(path, X_OK) != 0) {
    fprintf(stderr, "bench: no program at %s (build it, or pass its path)\n", path);
    return false;
  }
  return true;
}

/* Makes a fresh directory /tmp/keel-bench-<name>-XXXXXX into directory. */
static inline bool bench_make_directory(const char *name, char *directory, size_t capacity) {
  if (snprintf(directory, capacity, "/tmp/keel-bench-%s-XXXXXX", name) >= (int)capacity)
    return false;
  if (mkdtemp(directory) != NULL) return true;
  fprintf(stderr, "bench: cannot make a directory in /tmp: %s\n", strerror(errno));
  return false;
}

static inline int bench_remove_entry(const char *path, const struct stat *info, int type,
                                     struct FTW *where) {
  (void)info, (void)type, (void)where;
  remove(path);
  return 0; /* go on: remove what can be removed */
}

/* Removes path and everything under it, not following links; a missing path is fine. */
static inline void bench_remove_tree(const char *path) {
  nftw(path, bench_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
