/* Job files and proc/ values. A running launcher leaves /tmp/keel-<unix uid>/<job>.job
 * so that `keel inject`, `ps` and `join` can join its store without flags; the folder is
 * private to the user because the file holds the job's secret token. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tool.h"

#define JOB_FILE_MAX_BYTES 1024
#define CONNECT_DEADLINE_NS (3 * INT64_C(1000000000))

static void job_directory(char *path, size_t capacity) {
  snprintf(path, capacity, "/tmp/keel-%u", (unsigned)getuid());
}

/* The directory must be ours and closed to others: the files in it hold tokens. */
static keel_status job_directory_check(const char *path) {
  struct stat info;
  if (lstat(path, &info) != 0) return keel_status_from_errno(errno);
  if (!S_ISDIR(info.st_mode) || info.st_uid != getuid() || (info.st_mode & 077) != 0) {
    KEEL_LOG_E("job", "%s is not a private directory of this user; refusing to use it", path);
    return KEEL_EAUTH;
  }
  return KEEL_OK;
}

static keel_status job_directory_make(char *path, size_t capacity) {
  job_directory(path, capacity);
  if (mkdir(path, 0700) != 0 && errno != EEXIST) {
    keel_status status = keel_status_from_errno(errno);
    KEEL_LOG_E("job", "cannot create %s: %s", path, strerror(errno));
    return status;
  }
  return job_directory_check(path);
}

/* Reads "name=value" lines; every field is required. */
static keel_status job_file_fields(char *text, keel__job_info *info_p) {
  keel__job_info info = {0};
  bool have_store = false, have_id = false, have_token = false, have_pid = false;
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line != NULL;
       line = strtok_r(NULL, "\n", &save)) {
    char *value = strchr(line, '=');
    if (value == NULL) continue;
    *value++ = '\0';
    int64_t number;
    if (strcmp(line, "store") == 0 && strlen(value) < sizeof info.store) {
      snprintf(info.store, sizeof info.store, "%s", value);
      have_store = true;
    } else if (strcmp(line, "job_id") == 0 && strspn(value, "0123456789") == strlen(value)) {
      info.auth.job_id = strtoull(value, NULL, 10);
      have_id = info.auth.job_id != 0;
    } else if (strcmp(line, "token") == 0) {
      have_token = keel_hex_decode(value, info.auth.token, KEEL_TOKEN_BYTES) == KEEL_OK;
    } else if (strcmp(line, "pid") == 0 &&
               keel_parse_int(value, 1, INT32_MAX, &number) == KEEL_OK) {
      info.launcher_pid = (pid_t)number;
      have_pid = true;
    }
  }
  if (!(have_store && have_id && have_token && have_pid)) return KEEL_ECORRUPT;
  *info_p = info;
  return KEEL_OK;
}

keel_status keel__job_file_parse(const char *text, size_t length, keel__job_info *info_p) {
  if (length > JOB_FILE_MAX_BYTES || memchr(text, '\0', length) != NULL) return KEEL_ECORRUPT;
  char copy[JOB_FILE_MAX_BYTES + 1];
  memcpy(copy, text, length);
  copy[length] = '\0';
  return job_file_fields(copy, info_p);
}

static keel_status job_file_read(const char *path, keel__job_info *info_p) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return keel_status_from_errno(errno);
  char text[JOB_FILE_MAX_BYTES + 1];
  ssize_t length = read(fd, text, JOB_FILE_MAX_BYTES);
  close(fd);
  if (length <= 0) return KEEL_ECORRUPT;
  return keel__job_file_parse(text, (size_t)length, info_p);
}

static bool launcher_alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

static bool is_job_file_name(const char *name) {
  size_t length = strlen(name);
  return length > 4 && strcmp(name + length - 4, ".job") == 0;
}

/* Removes the job files of launchers that are gone: one killed with SIGKILL cannot remove
 * its own. */
static void job_directory_prune(const char *directory) {
  DIR *folder = opendir(directory);
  if (folder == NULL) return;
  for (struct dirent *entry = readdir(folder); entry != NULL; entry = readdir(folder)) {
    if (!is_job_file_name(entry->d_name)) continue;
    char path[PATH_MAX];
    int length = snprintf(path, sizeof path, "%s/%s", directory, entry->d_name);
    if (length < 0 || (size_t)length >= sizeof path) continue;
    keel__job_info job;
    if (job_file_read(path, &job) == KEEL_OK && !launcher_alive(job.launcher_pid)) unlink(path);
  }
  closedir(folder);
}

keel_status keel__job_file_write(const keel__job_info *info, char *path, size_t capacity) {
  char directory[64];
  keel_status status = job_directory_make(directory, sizeof directory);
  if (status != KEEL_OK) return status;
  job_directory_prune(directory);
  char token[2 * KEEL_TOKEN_BYTES + 1];
  keel_hex_encode(info->auth.token, KEEL_TOKEN_BYTES, token);
  char text[JOB_FILE_MAX_BYTES];
  int length =
      snprintf(text, sizeof text, "store=%s\njob_id=%llu\ntoken=%s\npid=%ld\n", info->store,
               (unsigned long long)info->auth.job_id, token, (long)info->launcher_pid);
  char file_path[128];
  snprintf(file_path, sizeof file_path, "%s/%llu.job", directory,
           (unsigned long long)info->auth.job_id);
  int fd = open(file_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    KEEL_LOG_E("job", "cannot create %s: %s", file_path, strerror(errno));
    return keel_status_from_errno(errno);
  }
  ssize_t written = write(fd, text, (size_t)length);
  close(fd);
  if (written != length) {
    unlink(file_path);
    KEEL_LOG_E("job", "cannot write %s", file_path);
    return KEEL_EIO;
  }
  snprintf(path, capacity, "%s", file_path);
  return KEEL_OK;
}

/* The job file with the latest modification time whose launcher still runs (a launcher
 * killed with SIGKILL cannot remove its file). */
static keel_status job_file_newest(const char *directory, keel__job_info *info_p) {
  DIR *folder = opendir(directory);
  if (folder == NULL) return KEEL_ENOTFOUND;
  keel_status status = KEEL_ENOTFOUND;
  struct timespec newest = {0, 0};
  for (struct dirent *entry = readdir(folder); entry != NULL; entry = readdir(folder)) {
    if (!is_job_file_name(entry->d_name)) continue;
    char path[PATH_MAX];
    int length = snprintf(path, sizeof path, "%s/%s", directory, entry->d_name);
    if (length < 0 || (size_t)length >= sizeof path) continue;
    struct stat info;
    keel__job_info job;
    if (lstat(path, &info) != 0 || !S_ISREG(info.st_mode)) continue;
    if (job_file_read(path, &job) != KEEL_OK || !launcher_alive(job.launcher_pid)) continue;
    bool newer = info.st_mtim.tv_sec > newest.tv_sec ||
                 (info.st_mtim.tv_sec == newest.tv_sec && info.st_mtim.tv_nsec > newest.tv_nsec);
    if (status == KEEL_OK && !newer) continue;
    newest = info.st_mtim;
    *info_p = job;
    status = KEEL_OK;
  }
  closedir(folder);
  return status;
}

keel_status keel__job_file_of_launcher(pid_t launcher_pid, keel__job_info *info_p) {
  char directory[64];
  job_directory(directory, sizeof directory);
  if (job_directory_check(directory) != KEEL_OK) return KEEL_ENOTFOUND;
  DIR *folder = opendir(directory);
  if (folder == NULL) return KEEL_ENOTFOUND;
  keel_status status = KEEL_ENOTFOUND;
  for (struct dirent *entry = readdir(folder); entry != NULL; entry = readdir(folder)) {
    char path[PATH_MAX];
    int length = snprintf(path, sizeof path, "%s/%s", directory, entry->d_name);
    if (!is_job_file_name(entry->d_name) || length < 0 || (size_t)length >= sizeof path) continue;
    keel__job_info job;
    if (job_file_read(path, &job) != KEEL_OK || job.launcher_pid != launcher_pid) continue;
    *info_p = job;
    status = KEEL_OK;
    break;
  }
  closedir(folder);
  return status;
}

keel_status keel__job_file_find(const char *job_id, keel__job_info *info_p) {
  char directory[64];
  job_directory(directory, sizeof directory);
  if (job_directory_check(directory) != KEEL_OK) {
    fprintf(stderr, "keel: no running job (no %s; start one with keel run)\n", directory);
    return KEEL_ENOTFOUND;
  }
  if (job_id == NULL) {
    if (job_file_newest(directory, info_p) == KEEL_OK) return KEEL_OK;
    fprintf(stderr, "keel: no running job in %s (start one with keel run)\n", directory);
    return KEEL_ENOTFOUND;
  }
  char path[PATH_MAX];
  int length = snprintf(path, sizeof path, "%s/%s.job", directory, job_id);
  bool plain_number = *job_id != '\0' && strspn(job_id, "0123456789") == strlen(job_id);
  bool fits = length > 0 && (size_t)length < sizeof path;
  if (!plain_number || !fits || job_file_read(path, info_p) != KEEL_OK) {
    fprintf(stderr, "keel: no job %s (no readable %s)\n", job_id, path);
    return KEEL_ENOTFOUND;
  }
  return KEEL_OK;
}

keel_status keel__job_connect(const char *job_id, keel__job_info *job_p, keel_store **store_p) {
  keel_status status = keel__job_file_find(job_id, job_p);
  if (status != KEEL_OK) return status;
  job_p->auth.local_id = KEEL__TOOL_ID;
  status = keel_store_connect(job_p->store, &job_p->auth,
                              keel_deadline_after_ns(CONNECT_DEADLINE_NS), store_p);
  if (status != KEEL_OK)
    fprintf(stderr, "keel: cannot reach the store of job %llu at %s: %s\n",
            (unsigned long long)job_p->auth.job_id, job_p->store, keel_strerror(status));
  return status;
}

bool keel__job_flag(int argc, char **argv, int *index, const char **job_p, bool *bad_p) {
  const char *arg = argv[*index];
  if (strncmp(arg, "--job=", 6) == 0) {
    *job_p = arg + 6;
    return true;
  }
  if (strcmp(arg, "--job") != 0) return false;
  if (*index + 1 >= argc) {
    *bad_p = true;
    return true;
  }
  *job_p = argv[++*index];
  return true;
}

keel_status keel__uid_from_key(const char *key, const char *prefix, uint32_t *uid_p) {
  size_t prefix_length = strlen(prefix);
  if (strncmp(key, prefix, prefix_length) != 0) return KEEL_EINVAL;
  int64_t uid;
  if (keel_parse_int(key + prefix_length, 0, INT32_MAX, &uid) != KEEL_OK) return KEEL_EINVAL;
  *uid_p = (uint32_t)uid;
  return KEEL_OK;
}

/* Stores one "name=value" field of a proc/ value; false for a malformed known field. */
static bool proc_field_set(keel__proc_value *value, const char *name, const char *text,
                           unsigned *seen) {
  int64_t number;
  if (strcmp(name, "pid") == 0) {
    if (keel_parse_int(text, 1, INT32_MAX, &number) != KEEL_OK) return false;
    value->pid = (pid_t)number;
    *seen |= 1;
  } else if (strcmp(name, "node") == 0) {
    if (keel_parse_int(text, 0, INT32_MAX, &value->node) != KEEL_OK) return false;
  } else if (strcmp(name, "role") == 0) {
    if (strlen(text) >= sizeof value->role) return false;
    snprintf(value->role, sizeof value->role, "%s", text);
    *seen |= 2;
  } else if (strcmp(name, "rank") == 0) {
    if (keel_parse_int(text, -1, INT32_MAX, &value->rank) != KEEL_OK) return false;
    *seen |= 4;
  } else if (strcmp(name, "epoch") == 0) {
    if (keel_parse_int(text, 0, INT64_MAX, &value->epoch) != KEEL_OK) return false;
    *seen |= 8;
  } else if (strcmp(name, "addr") == 0) {
    snprintf(value->addr, sizeof value->addr, "%s", text);
  }
  return true;
}

/* Calls set for each "name=value" field of text (space-separated); false when a field has
 * no '=' or set refuses it. */
static bool fields_parse(const char *text,
                         bool (*set)(void *, const char *, const char *, unsigned *), void *value,
                         unsigned *seen) {
  char copy[512];
  if (strlen(text) >= sizeof copy) return false;
  snprintf(copy, sizeof copy, "%s", text);
  for (char *save = NULL, *field = strtok_r(copy, " \t\n", &save); field != NULL;
       field = strtok_r(NULL, " \t\n", &save)) {
    char *equals = strchr(field, '=');
    if (equals == NULL) return false;
    *equals = '\0';
    if (!set(value, field, equals + 1, seen)) return false;
  }
  return true;
}

static bool proc_field_set_any(void *value, const char *name, const char *text, unsigned *seen) {
  return proc_field_set(value, name, text, seen);
}

keel_status keel__proc_value_parse(const char *text, keel__proc_value *value_p) {
  keel__proc_value value = {.node = -1, .rank = -1};
  unsigned seen = 0;
  if (!fields_parse(text, proc_field_set_any, &value, &seen) || seen != 15) return KEEL_EINVAL;
  *value_p = value;
  return KEEL_OK;
}

static bool node_field_set(void *target, const char *name, const char *text, unsigned *seen) {
  keel__node_value *value = target;
  int64_t number;
  if (strcmp(name, "pid") == 0 || strcmp(name, "pgid") == 0) {
    if (keel_parse_int(text, 1, INT32_MAX, &number) != KEEL_OK) return false;
    *(name[1] == 'i' ? &value->pid : &value->pgid) = (pid_t)number;
    *seen |= name[1] == 'i' ? 1 : 2;
  } else if (strcmp(name, "group") == 0) {
    if (keel_parse_int(text, 0, 1, &number) != KEEL_OK) return false;
    value->own_group = number == 1;
    *seen |= 4;
  } else if (strcmp(name, "role") == 0) {
    if (strlen(text) >= sizeof value->role) return false;
    snprintf(value->role, sizeof value->role, "%s", text);
  } else if (strcmp(name, "addr") == 0) {
    snprintf(value->addr, sizeof value->addr, "%s", text);
  }
  return true;
}

keel_status keel__node_value_parse(const char *text, keel__node_value *value_p) {
  keel__node_value value = {0};
  unsigned seen = 0;
  if (!fields_parse(text, node_field_set, &value, &seen) || seen != 7) return KEEL_EINVAL;
  *value_p = value;
  return KEEL_OK;
}

size_t keel__node_processes_visit(keel_store *store, int64_t node,
                                  bool (*visit)(keel_store *store, const keel_store_entry *entry,
                                                const keel__proc_value *value, void *context),
                                  void *context) {
  keel_store_entry *entries = NULL;
  size_t count = 0, counted = 0;
  if (keel_store_list(store, "proc/", &entries, &count, NULL) != KEEL_OK) return 0;
  for (size_t i = 0; i < count; i++) {
    keel__proc_value value;
    if (keel__proc_value_parse((const char *)entries[i].value, &value) != KEEL_OK) continue;
    if (value.node == node) counted += visit(store, &entries[i], &value, context);
  }
  keel_store_entries_free(entries, count);
  return counted;
}

bool keel__store_has(keel_store *store, const char *key) {
  keel_store_entry *entry = NULL;
  if (keel_store_get(store, key, &entry) != KEEL_OK) return false;
  keel_store_entry_free(entry);
  return true;
}
