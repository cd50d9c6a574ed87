/* Process and file helpers for keel's tests (test_support.h). Every child runs in its own
 * process group so that a test can kill it and anything it started, by pid. */
#include "test_support.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAX_CHILDREN 256
static pid_t children[MAX_CHILDREN];
static int child_count;

const char *keel_test_bin(const char *name) {
  static __thread char path[PATH_MAX];
  const char *bin = getenv("KEEL_BIN");
  snprintf(path, sizeof path, "%s/%s", bin ? bin : "build/bin", name);
  return path;
}

const char *keel_test_program(const char *name) {
  static __thread char path[PATH_MAX];
  const char *bin = getenv("KEEL_BIN");
  snprintf(path, sizeof path, "%s/../tests/programs/%s", bin ? bin : "build/bin", name);
  return path;
}

static void forget_child(pid_t pid) {
  for (int i = 0; i < child_count; i++) {
    if (children[i] == pid) children[i] = 0;
  }
}

pid_t keel_test_spawn(char *const argv[], char *const extra_env[], const char *output_path) {
  static bool registered;
  if (!registered) {
    atexit(keel_test_kill_all);
    registered = true;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    setpgid(0, 0);
    for (size_t i = 0; extra_env && extra_env[i]; i++) putenv(extra_env[i]);
    if (output_path) {
      int fd = open(output_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
      }
    }
    execv(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  if (child_count < MAX_CHILDREN) children[child_count++] = pid;
  return pid;
}

int keel_test_slowdown(void) {
  const char *text = getenv("KEEL_TEST_SLOWDOWN");
  int factor = text ? atoi(text) : 1;
  return factor >= 1 && factor <= 100 ? factor : 1;
}

const char *keel_test_seconds_flag(int seconds, char *text, size_t capacity) {
  snprintf(text, capacity, "%ds", seconds * keel_test_slowdown());
  return text;
}

bool keel_test_wait(pid_t pid, int timeout_ms, int *status_p) {
  timeout_ms *= keel_test_slowdown();
  struct timespec pause = {0, 2 * 1000 * 1000};
  for (int waited = 0;; waited += 2) {
    int status;
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      forget_child(pid);
      if (status_p) *status_p = status;
      return true;
    }
    if (done < 0 && errno == ECHILD) {
      forget_child(pid);
      if (status_p) *status_p = 0;
      return true;
    }
    if (waited >= timeout_ms) return false;
    nanosleep(&pause, NULL);
  }
}

void keel_test_kill_all(void) {
  for (int i = 0; i < child_count; i++) {
    if (children[i] <= 0) continue;
    kill(-children[i], SIGKILL);
    kill(children[i], SIGKILL);
    waitpid(children[i], NULL, 0);
    children[i] = 0;
  }
}

int keel_test_run(char *const argv[], char *const extra_env[], const char *output_path,
                  int timeout_ms) {
  pid_t pid = keel_test_spawn(argv, extra_env, output_path);
  if (pid < 0) return -1;
  int status;
  if (!keel_test_wait(pid, timeout_ms, &status)) {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    forget_child(pid);
    return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

/* The folders keel_test_tempdir made, for keel_test_finish. */
#define MAX_TEMPDIRS 1024
static char *tempdirs[MAX_TEMPDIRS];
static size_t tempdir_count;

const char *keel_test_tempdir(const char *prefix) {
  static char path[PATH_MAX];
  const char *base = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/%s-XXXXXX", base ? base : "/tmp", prefix);
  if (mkdtemp(path) == NULL) return NULL;
  if (tempdir_count < MAX_TEMPDIRS) tempdirs[tempdir_count++] = strdup(path);
  return path;
}

static int remove_entry(const char *path, const struct stat *info, int type, struct FTW *walk) {
  (void)info, (void)type, (void)walk;
  remove(path); /* best effort: a mount point or a busy file stays */
  return 0;
}

int keel_test_finish(int failures) {
  keel_test_kill_all();
  bool keep = failures != 0 || getenv("KEEL_TEST_KEEP") != NULL;
  if (keep && tempdir_count > 0)
    fprintf(stderr, "kept %zu test folders (%s), the first %s\n", tempdir_count,
            failures != 0 ? "a test failed" : "KEEL_TEST_KEEP", tempdirs[0]);
  for (size_t i = 0; i < tempdir_count; i++) {
    if (!keep) nftw(tempdirs[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    free(tempdirs[i]);
  }
  tempdir_count = 0;
  return failures;
}

char *keel_test_read_file(const char *path, size_t *length_p) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) return NULL;
  size_t capacity = 4096, length = 0;
  char *text = malloc(capacity);
  for (;;) {
    if (text == NULL) break;
    size_t got = fread(text + length, 1, capacity - length - 1, file);
    length += got;
    if (got == 0) break;
    if (capacity - length <= 1) {
      char *grown = realloc(text, capacity * 2);
      if (grown == NULL) {
        free(text);
        text = NULL;
        break;
      }
      text = grown;
      capacity *= 2;
    }
  }
  fclose(file);
  if (text == NULL) return NULL;
  text[length] = '\0';
  if (length_p) *length_p = length;
  return text;
}

bool keel_test_last_line_with(const char *path, const char *prefix, char *line, size_t capacity) {
  char *text = keel_test_read_file(path, NULL);
  if (text == NULL) return false;
  bool found = false;
  size_t prefix_length = strlen(prefix);
  for (char *cursor = text; *cursor;) {
    char *end = strchr(cursor, '\n');
    size_t length = end ? (size_t)(end - cursor) : strlen(cursor);
    if (length >= prefix_length && strncmp(cursor, prefix, prefix_length) == 0) {
      size_t copy = length < capacity - 1 ? length : capacity - 1;
      memcpy(line, cursor, copy);
      line[copy] = '\0';
      found = true;
    }
    cursor += length + (end ? 1 : 0);
  }
  free(text);
  return found;
}

void keel_test_print_file(const char *what, const char *path) {
  char *text = keel_test_read_file(path, NULL);
  if (text != NULL && *text != '\0') fprintf(stderr, "--- %s (%s):\n%s", what, path, text);
  free(text);
}

bool keel_test_pid_exists(pid_t pid) {
  errno = 0;
  return kill(pid, 0) == 0 || errno != ESRCH;
}

/* ---- small disks */

#define TMPFS_MAX 8
static char tmpfs_paths[TMPFS_MAX][PATH_MAX];
static size_t tmpfs_count;

bool keel_test_tmpfs_mount(const char *test, const char *path, unsigned long flags,
                           const char *options) {
  if (tmpfs_count == TMPFS_MAX || strlen(path) >= PATH_MAX) return false;
  if (mkdir(path, 0700) != 0 && errno != EEXIST) {
    fprintf(stderr, "%s: cannot make %s: %s\n", test, path, strerror(errno));
    return false;
  }
  if (mount("tmpfs", path, "tmpfs", flags, options) != 0) {
    fprintf(stderr, "%s: skipped, cannot mount a tmpfs here (%s)\n", test, strerror(errno));
    return false;
  }
  snprintf(tmpfs_paths[tmpfs_count++], PATH_MAX, "%s", path);
  return true;
}

int keel_test_tmpfs_release(void **state) {
  (void)state;
  while (tmpfs_count > 0) umount2(tmpfs_paths[--tmpfs_count], MNT_DETACH);
  return 0;
}
