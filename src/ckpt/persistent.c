/* The persistent tier: one directory per rank and step, <root>/<job>/step-<s>/rank-<r>/,
 * with one file per registered buffer and the manifest written last (JIT §3.2), and the
 * listing of those directories that feeds the restore. The save goes through a table of
 * file operations so that a test can fail each of them in turn. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"

#define MANIFEST_NAME "manifest"
#define MANIFEST_TEMPORARY_NAME "manifest.new"
#define DIRECTORY_MODE 0750
#define FILE_MODE 0640
/* Candidates found in one job directory (ranks times steps kept): a bound, not a target. */
#define MAX_CANDIDATES (1u << 20)

/* ---- the libc operations (the default table). */

static int posix_mkdirat(void *context, int directory, const char *name, mode_t mode) {
  (void)context;
  return mkdirat(directory, name, mode);
}
static int posix_openat(void *context, int directory, const char *name, int flags, mode_t mode) {
  (void)context;
  return openat(directory, name, flags, mode);
}
static ssize_t posix_write(void *context, int file, const void *data, size_t length) {
  (void)context;
  return write(file, data, length);
}
static int posix_fsync(void *context, int file) {
  (void)context;
  return fsync(file);
}
static int posix_close(void *context, int file) {
  (void)context;
  return close(file);
}
static int posix_renameat(void *context, int directory, const char *from, const char *to) {
  (void)context;
  return renameat(directory, from, directory, to);
}
static int posix_unlinkat(void *context, int directory, const char *name, int flags) {
  (void)context;
  return unlinkat(directory, name, flags);
}

const keel__ckpt_file_ops keel__ckpt_posix_file_ops = {
    .mkdirat = posix_mkdirat,
    .openat = posix_openat,
    .write = posix_write,
    .fsync = posix_fsync,
    .close = posix_close,
    .renameat = posix_renameat,
    .unlinkat = posix_unlinkat,
};

/* ---- save */

typedef struct save_io {
  const keel__ckpt_file_ops *ops;
  void *context;
  const char *where; /* the rank directory's path, for messages */
  const char *label; /* "step-<s>/rank-<r>", for a reason */
  char *reason;      /* NULL: failures are logged */
} save_io;

/* What one failed operation says: short enough to go into a reason with the label. */
#define SAVE_WHAT_BYTES 160

/* Says why a save failed: in io->reason when the caller asked for it, else in the log. */
static void save_explain(const save_io *io, const char *what) {
  if (io->reason != NULL) {
    snprintf(io->reason, KEEL__CKPT_REASON_BYTES, "%s: %s", io->label, what);
    return;
  }
  KEEL_LOG_E(KEEL__CKPT_MODULE, "checkpoint save in %s: %s", io->where, what);
}

/* Explains the failure of one operation (the one place a save's error is decided) and
 * returns its status; errno is read here, right after the call that set it. */
static keel_status save_failed(const save_io *io, const char *operation, const char *name) {
  int error_number = errno;
  keel_status status = keel_status_from_errno(error_number);
  char what[SAVE_WHAT_BYTES];
  snprintf(what, sizeof what, "%s %s: %s", operation, name, strerror(error_number));
  save_explain(io, what);
  return status;
}

/* Opens directory `name` under parent, making it if needed. Its entry is made durable
 * (fsync of the parent) even when another rank made it, since that rank may crash before
 * its own fsync, and a snapshot must not outlive its directory's name. created_p may be
 * NULL. */
static keel_status directory_open(const save_io *io, int parent, const char *name, bool *created_p,
                                  int *directory_p) {
  bool created = true;
  if (io->ops->mkdirat(io->context, parent, name, DIRECTORY_MODE) != 0) {
    if (errno != EEXIST) return save_failed(io, "mkdir", name);
    created = false;
  }
  int directory = io->ops->openat(io->context, parent, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (directory < 0) return save_failed(io, "open", name);
  if (io->ops->fsync(io->context, parent) != 0) {
    keel_status status = save_failed(io, "fsync the parent of", name);
    io->ops->close(io->context, directory);
    return status;
  }
  if (created_p != NULL) *created_p = created;
  *directory_p = directory;
  return KEEL_OK;
}

/* Writes bytes into a new file `name` (replacing one of that name), one write per chunk, and
 * fsyncs it. */
static keel_status file_write(const save_io *io, int directory, const char *name,
                              const uint8_t *data, uint64_t bytes, uint64_t chunk_bytes) {
  int file = io->ops->openat(io->context, directory, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                             FILE_MODE);
  if (file < 0) return save_failed(io, "create", name);
  keel_status status = KEEL_OK;
  uint64_t offset = 0;
  while (offset < bytes) {
    uint64_t piece = bytes - offset < chunk_bytes ? bytes - offset : chunk_bytes;
    ssize_t written = io->ops->write(io->context, file, data + offset, (size_t)piece);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      /* A write of nothing on a regular file means the device took no more. */
      if (written == 0) errno = ENOSPC;
      status = save_failed(io, "write", name);
      goto close_file;
    }
    offset += (uint64_t)written;
  }
  if (io->ops->fsync(io->context, file) != 0) {
    status = save_failed(io, "fsync", name);
    goto close_file;
  }
close_file:
  /* close reports delayed write errors on some file systems: they count. */
  if (io->ops->close(io->context, file) != 0 && status == KEEL_OK) {
    status = save_failed(io, "close", name);
  }
  return status;
}

static void buffer_file_name(char *name, size_t capacity, size_t index, bool temporary) {
  snprintf(name, capacity, "buffer-%zu%s", index, temporary ? ".new" : "");
}

/* Writes every buffer and the manifest under temporary names in the rank directory, then
 * swaps them in: the old manifest (if any) goes first, the new one comes last. */
static keel_status snapshot_write(const save_io *io, int directory,
                                  const keel_registry *registry,
                                  const keel_ckpt_manifest *manifest, const uint8_t *encoded,
                                  size_t encoded_bytes) {
  char name[32];
  char temporary[32];
  keel_status status = KEEL_OK;
  size_t written = 0;
  for (; written < keel_registry_count(registry); written++) {
    const keel_state_buffer *slot = keel_registry_entry(registry, written);
    buffer_file_name(temporary, sizeof temporary, written, true);
    status = file_write(io, directory, temporary, slot->data, slot->bytes, manifest->chunk_bytes);
    if (status != KEEL_OK) goto remove_temporaries;
  }
  status = file_write(io, directory, MANIFEST_TEMPORARY_NAME, encoded, encoded_bytes,
                      encoded_bytes > 0 ? encoded_bytes : 1);
  if (status != KEEL_OK) goto remove_temporaries;

  /* Everything new is durable. An older snapshot of this step and rank stops counting
   * before its files are replaced, so no manifest ever names data it did not describe. */
  if (io->ops->unlinkat(io->context, directory, MANIFEST_NAME, 0) == 0) {
    if (io->ops->fsync(io->context, directory) != 0) {
      status = save_failed(io, "fsync after removing the old", MANIFEST_NAME);
      goto remove_temporaries;
    }
  } else if (errno != ENOENT) {
    status = save_failed(io, "remove the old", MANIFEST_NAME);
    goto remove_temporaries;
  }
  for (size_t b = 0; b < keel_registry_count(registry); b++) {
    buffer_file_name(temporary, sizeof temporary, b, true);
    buffer_file_name(name, sizeof name, b, false);
    if (io->ops->renameat(io->context, directory, temporary, name) != 0) {
      status = save_failed(io, "rename", temporary);
      goto remove_temporaries;
    }
  }
  /* The data files' names are durable before the manifest that names them appears. */
  if (io->ops->fsync(io->context, directory) != 0) {
    status = save_failed(io, "fsync the directory before", MANIFEST_NAME);
    goto remove_temporaries;
  }
  if (io->ops->renameat(io->context, directory, MANIFEST_TEMPORARY_NAME, MANIFEST_NAME) != 0) {
    status = save_failed(io, "rename", MANIFEST_TEMPORARY_NAME);
    goto remove_temporaries;
  }
  if (io->ops->fsync(io->context, directory) != 0) {
    status = save_failed(io, "fsync the directory after", MANIFEST_NAME);
    /* Whether the manifest survives a crash is unknown: take it back, so a save that
     * reported failure is never used. */
    io->ops->unlinkat(io->context, directory, MANIFEST_NAME, 0);
    goto remove_temporaries;
  }
  return KEEL_OK;

remove_temporaries:
  /* The one being written when the failure came is there too; names never made are
   * simply not found. */
  io->ops->unlinkat(io->context, directory, MANIFEST_TEMPORARY_NAME, 0);
  for (size_t b = 0; b < keel_registry_count(registry) && b <= written; b++) {
    buffer_file_name(temporary, sizeof temporary, b, true);
    io->ops->unlinkat(io->context, directory, temporary, 0);
  }
  return status;
}

keel_status keel__ckpt_persistent_save_with(const keel__ckpt_file_ops *ops, void *context,
                                            const keel_registry *registry, const char *root,
                                            const keel_ckpt_identity *identity,
                                            uint64_t chunk_bytes, char *reason) {
  if (ops == NULL || registry == NULL || root == NULL) return KEEL_EINVAL;
  keel_status status = keel__ckpt_identity_check(identity);
  if (status != KEEL_OK) return status;
  char job_name[32], step_name[32], rank_name[32];
  snprintf(job_name, sizeof job_name, "%" PRIu64, identity->job_id);
  snprintf(step_name, sizeof step_name, "step-%" PRIu64, identity->step);
  snprintf(rank_name, sizeof rank_name, "rank-%" PRIu32, identity->rank);
  char where[PATH_MAX];
  snprintf(where, sizeof where, "%s/%s/%s/%s", root, job_name, step_name, rank_name);
  char label[64];
  snprintf(label, sizeof label, "%s/%s", step_name, rank_name);
  save_io io = {.ops = ops, .context = context, .where = where, .label = label, .reason = reason};

  /* Only the rank directory is this save's alone: the job and step directories are shared
   * with the other ranks saving at the same time, and are never taken back. */
  bool rank_created = false;
  int root_directory = -1, job_directory = -1, step_directory = -1, rank_directory = -1;
  uint8_t *encoded = NULL;
  keel_ckpt_manifest manifest;
  status = keel_ckpt_manifest_build(registry, identity, chunk_bytes, &manifest);
  if (status != KEEL_OK) {
    char what[SAVE_WHAT_BYTES];
    snprintf(what, sizeof what, "cannot describe the state: %s", keel_strerror(status));
    save_explain(&io, what);
    return status;
  }
  size_t encoded_bytes = keel_ckpt_manifest_encoded_bytes(&manifest);
  encoded = malloc(encoded_bytes);
  if (encoded == NULL) {
    save_explain(&io, "out of memory");
    status = KEEL_ENOMEM;
    goto free_manifest;
  }
  status = keel_ckpt_manifest_encode(&manifest, encoded, encoded_bytes, &encoded_bytes);
  if (status != KEEL_OK) goto free_encoded;

  root_directory = ops->openat(context, AT_FDCWD, root, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (root_directory < 0) {
    status = save_failed(&io, "open the checkpoint root", root);
    goto free_encoded;
  }
  status = directory_open(&io, root_directory, job_name, NULL, &job_directory);
  if (status != KEEL_OK) goto close_root;
  status = directory_open(&io, job_directory, step_name, NULL, &step_directory);
  if (status != KEEL_OK) goto close_job_directory;
  status = directory_open(&io, step_directory, rank_name, &rank_created, &rank_directory);
  if (status != KEEL_OK) goto close_step_directory;

  status = snapshot_write(&io, rank_directory, registry, &manifest, encoded, encoded_bytes);
  if (status == KEEL_OK) {
    KEEL_LOG_I(KEEL__CKPT_MODULE,
               "saved %s: %" PRIu64 " bytes in %" PRIu32 " buffers, %" PRIu32 " chunks", where,
               manifest.total_bytes, manifest.buffer_count, manifest.chunk_count);
  }

  /* A failed save takes back the rank directory it made, if it is empty (best effort: an
   * empty directory is never a snapshot anyway). */
  ops->close(context, rank_directory);
  if (status != KEEL_OK && rank_created) {
    ops->unlinkat(context, step_directory, rank_name, AT_REMOVEDIR);
  }
close_step_directory:
  ops->close(context, step_directory);
close_job_directory:
  ops->close(context, job_directory);
close_root:
  ops->close(context, root_directory);
free_encoded:
  free(encoded);
free_manifest:
  keel_ckpt_manifest_free(&manifest);
  return status;
}

keel_status keel_ckpt_persistent_save(const keel_registry *registry, const char *root,
                                      const keel_ckpt_identity *identity, uint64_t chunk_bytes) {
  return keel__ckpt_persistent_save_with(&keel__ckpt_posix_file_ops, NULL, registry, root, identity,
                                         chunk_bytes, NULL);
}

void keel__ckpt_write_failed(keel__ckpt_write_health *health, const char *tier,
                             const char *directory, keel_status status, const char *reason) {
  atomic_fetch_add(&health->failed, 1);
  atomic_store(&health->last_status, (int)status);
  if (health->in_a_row++ > 0) return;
  KEEL_LOG_E(KEEL__CKPT_MODULE,
             "the %s tier cannot write to %s: %s (%s); training goes on, the complete "
             "snapshots written before stay usable, and every later save is tried (failures "
             "are counted, and logged again once one succeeds)",
             tier, directory, reason != NULL && reason[0] != '\0' ? reason : keel_strerror(status),
             keel_status_name(status));
}

void keel__ckpt_write_succeeded(keel__ckpt_write_health *health, const char *tier) {
  if (health->in_a_row == 0) return;
  KEEL_LOG_W(KEEL__CKPT_MODULE, "the %s tier writes again, after %" PRIu64 " failed saves", tier,
             health->in_a_row);
  health->in_a_row = 0;
}

/* ---- restore: listing */

/* "<prefix><decimal>" with no sign, no leading zero and no overflow; anything else (a
 * temporary, a stray file) is not a snapshot directory. */
static bool name_number(const char *name, const char *prefix, uint64_t maximum, uint64_t *value_p) {
  size_t prefix_length = strlen(prefix);
  if (strncmp(name, prefix, prefix_length) != 0) return false;
  const char *digits = name + prefix_length;
  if (digits[0] == '\0' || (digits[0] == '0' && digits[1] != '\0')) return false;
  uint64_t value = 0;
  for (const char *c = digits; *c != '\0'; c++) {
    if (*c < '0' || *c > '9') return false;
    uint64_t digit = (uint64_t)(*c - '0');
    if (value > (maximum - digit) / 10) return false;
    value = value * 10 + digit;
  }
  *value_p = value;
  return true;
}

/* Reads the whole of an open regular file, which must be exactly `bytes` long, into
 * destination. Reasons name the file by path. */
static keel_status descriptor_read_exact(int file, const char *path, uint8_t *destination,
                                         uint64_t bytes, char *reason) {
  struct stat info;
  if (fstat(file, &info) != 0) {
    int error_number = errno;
    snprintf(reason, KEEL__CKPT_REASON_BYTES, "cannot stat %s: %s", path, strerror(error_number));
    return keel_status_from_errno(error_number);
  }
  if (!S_ISREG(info.st_mode) || (uint64_t)info.st_size != bytes) {
    snprintf(reason, KEEL__CKPT_REASON_BYTES, "%s is %lld bytes, its manifest says %" PRIu64 "%s",
             path, (long long)info.st_size, bytes,
             (uint64_t)info.st_size < bytes ? " (truncated)" : "");
    return KEEL_ECORRUPT;
  }
  uint64_t offset = 0;
  while (offset < bytes) {
    uint64_t piece = bytes - offset < ((uint64_t)1 << 30) ? bytes - offset : ((uint64_t)1 << 30);
    ssize_t got = pread(file, destination + offset, (size_t)piece, (off_t)offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int error_number = errno;
      snprintf(reason, KEEL__CKPT_REASON_BYTES, "cannot read %s: %s", path, strerror(error_number));
      return keel_status_from_errno(error_number);
    }
    if (got == 0) {
      snprintf(reason, KEEL__CKPT_REASON_BYTES, "%s ended at byte %" PRIu64 " of %" PRIu64, path,
               offset, bytes);
      return KEEL_ECORRUPT;
    }
    offset += (uint64_t)got;
  }
  return KEEL_OK;
}

static keel_status file_read_buffer(const keel__ckpt_candidate *candidate, uint32_t index,
                                    uint8_t *destination, uint64_t bytes, char *reason) {
  char path[96];
  snprintf(path, sizeof path, "%s/buffer-%" PRIu32, candidate->label, index);
  int file = openat(candidate->directory, path, O_RDONLY | O_CLOEXEC);
  if (file < 0) {
    int error_number = errno;
    snprintf(reason, KEEL__CKPT_REASON_BYTES, "cannot open %s: %s", path, strerror(error_number));
    return keel_status_from_errno(error_number);
  }
  keel_status status = descriptor_read_exact(file, path, destination, bytes, reason);
  close(file);
  return status;
}

static keel_status file_finish(const keel__ckpt_candidate *candidate, char *reason) {
  (void)candidate;
  (void)reason;
  return KEEL_OK;
}

static const keel__ckpt_source_ops file_source_ops = {
    .read_buffer = file_read_buffer,
    .finish = file_finish,
};

typedef struct candidate_list {
  keel__ckpt_candidate *items;
  size_t count;
  size_t capacity;
  size_t refused;
} candidate_list;

static void candidate_list_free(candidate_list *list) {
  for (size_t i = 0; i < list->count; i++) keel_ckpt_manifest_free(&list->items[i].manifest);
  free(list->items);
}

/* Reads and decodes step-<step>/rank-<rank>/manifest. KEEL_ENOTFOUND when there is none (a
 * save that did not finish); other refusals are logged here, once. */
static keel_status manifest_load(int job_directory, const char *where, const char *label,
                                 uint64_t step, uint64_t rank, keel_ckpt_manifest *manifest_p) {
  char path[96];
  snprintf(path, sizeof path, "%s/" MANIFEST_NAME, label);
  int file = openat(job_directory, path, O_RDONLY | O_CLOEXEC);
  if (file < 0) {
    int error_number = errno;
    if (error_number == ENOENT) {
      KEEL_LOG_I(KEEL__CKPT_MODULE, "%s/%s has no manifest (a save that did not finish): skipped",
                 where, label);
      return KEEL_ENOTFOUND;
    }
    KEEL_LOG_W(KEEL__CKPT_MODULE, "skipped %s/%s: cannot open its manifest: %s", where, label,
               strerror(error_number));
    return keel_status_from_errno(error_number);
  }
  char reason[KEEL__CKPT_REASON_BYTES] = "";
  uint8_t *encoded = NULL;
  keel_status status = KEEL_OK;
  struct stat info;
  if (fstat(file, &info) != 0) {
    int error_number = errno;
    snprintf(reason, sizeof reason, "cannot stat its manifest: %s", strerror(error_number));
    status = keel_status_from_errno(error_number);
    goto close_file;
  }
  if (info.st_size < 0 || (uint64_t)info.st_size > KEEL_CKPT_MANIFEST_MAX_BYTES) {
    snprintf(reason, sizeof reason, "its manifest is %lld bytes, more than any manifest",
             (long long)info.st_size);
    status = KEEL_ECORRUPT;
    goto close_file;
  }
  size_t length = (size_t)info.st_size;
  encoded = malloc(length > 0 ? length : 1);
  if (encoded == NULL) {
    snprintf(reason, sizeof reason, "no memory for its manifest of %zu bytes", length);
    status = KEEL_ENOMEM;
    goto close_file;
  }
  status = descriptor_read_exact(file, path, encoded, length, reason);
  if (status != KEEL_OK) goto free_encoded;
  keel_ckpt_manifest manifest;
  status = keel_ckpt_manifest_decode(encoded, length, &manifest);
  if (status != KEEL_OK) {
    snprintf(reason, sizeof reason, "its manifest is malformed (%s)", keel_strerror(status));
    goto free_encoded;
  }
  if (manifest.identity.step != step || manifest.identity.rank != rank) {
    snprintf(reason, sizeof reason,
             "its manifest describes step %" PRIu64 " of rank %" PRIu32 ", not this directory's",
             manifest.identity.step, manifest.identity.rank);
    keel_ckpt_manifest_free(&manifest);
    status = KEEL_ECORRUPT;
    goto free_encoded;
  }
  *manifest_p = manifest;
free_encoded:
  free(encoded);
close_file:
  close(file);
  if (status != KEEL_OK) {
    KEEL_LOG_W(KEEL__CKPT_MODULE, "skipped %s/%s: %s", where, label, reason);
  }
  return status;
}

/* Adds the snapshots of every rank directory of one step directory. */
static keel_status step_list(int job_directory, const char *where, const char *step_name,
                             uint64_t step, candidate_list *list) {
  int step_directory = openat(job_directory, step_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (step_directory < 0) {
    /* A step directory that vanished or is not one holds no snapshot. */
    KEEL_LOG_I(KEEL__CKPT_MODULE, "%s/%s cannot be listed: %s", where, step_name, strerror(errno));
    return KEEL_OK;
  }
  DIR *ranks = fdopendir(step_directory);
  if (ranks == NULL) {
    keel_status status = keel_status_from_errno(errno);
    close(step_directory);
    return status;
  }
  keel_status status = KEEL_OK;
  struct dirent *entry;
  /* readdir tells an error from the end only through errno. */
  for (errno = 0; (entry = readdir(ranks)) != NULL; errno = 0) {
    uint64_t rank;
    if (!name_number(entry->d_name, "rank-", UINT32_MAX, &rank)) continue;
    if (list->count == list->capacity) {
      if (list->capacity == MAX_CANDIDATES) {
        KEEL_LOG_E(KEEL__CKPT_MODULE, "restore from %s: more than %u snapshots", where,
                   MAX_CANDIDATES);
        status = KEEL_ERANGE;
        break;
      }
      size_t capacity = list->capacity == 0 ? 16 : list->capacity * 2;
      keel__ckpt_candidate *items = realloc(list->items, capacity * sizeof *items);
      if (items == NULL) {
        status = KEEL_ENOMEM;
        break;
      }
      list->items = items;
      list->capacity = capacity;
    }
    keel__ckpt_candidate *candidate = &list->items[list->count];
    memset(candidate, 0, sizeof *candidate);
    /* Names with leading zeros were refused, so this is the directory's own path. */
    snprintf(candidate->label, sizeof candidate->label, "step-%" PRIu64 "/rank-%" PRIu64, step,
             rank);
    keel_status loaded =
        manifest_load(job_directory, where, candidate->label, step, rank, &candidate->manifest);
    if (loaded == KEEL_ENOTFOUND) continue;
    if (loaded != KEEL_OK) {
      list->refused++;
      continue;
    }
    candidate->ops = &file_source_ops;
    candidate->directory = job_directory;
    list->count++;
  }
  if (entry == NULL && errno != 0 && status == KEEL_OK) {
    int error_number = errno;
    KEEL_LOG_E(KEEL__CKPT_MODULE, "restore: cannot list %s/%s: %s", where, step_name,
               strerror(error_number));
    status = keel_status_from_errno(error_number);
  }
  closedir(ranks);
  return status;
}

/* Lists every complete snapshot of the selector's steps under <root>/<job_id> into list;
 * *job_directory_p is left open (candidates read through it) for the caller to close. */
static keel_status candidates_collect(const char *root, const keel_ckpt_selector *selector,
                                      char *where, size_t where_bytes, int *job_directory_p,
                                      candidate_list *list) {
  snprintf(where, where_bytes, "%s/%" PRIu64, root, selector->job_id);
  int job_directory = open(where, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (job_directory < 0) {
    int error_number = errno;
    keel_status status = keel_status_from_errno(error_number);
    if (status == KEEL_ENOTFOUND) {
      KEEL_LOG_I(KEEL__CKPT_MODULE, "no checkpoint of job %" PRIu64 " under %s", selector->job_id,
                 root);
    } else {
      KEEL_LOG_E(KEEL__CKPT_MODULE, "restore: cannot open %s: %s", where, strerror(error_number));
    }
    return status;
  }
  /* The listing reads through its own descriptor; candidates read files relative to
   * job_directory. */
  int listing_directory = dup(job_directory);
  DIR *steps = listing_directory < 0 ? NULL : fdopendir(listing_directory);
  if (steps == NULL) {
    int error_number = errno;
    KEEL_LOG_E(KEEL__CKPT_MODULE, "restore: cannot list %s: %s", where, strerror(error_number));
    if (listing_directory >= 0) close(listing_directory);
    close(job_directory);
    return keel_status_from_errno(error_number);
  }
  keel_status status = KEEL_OK;
  struct dirent *entry;
  for (errno = 0; status == KEEL_OK && (entry = readdir(steps)) != NULL; errno = 0) {
    uint64_t step;
    if (!name_number(entry->d_name, "step-", UINT64_MAX, &step)) continue;
    if (step > selector->max_step || step < selector->min_step) continue;
    status = step_list(job_directory, where, entry->d_name, step, list);
  }
  if (status == KEEL_OK && errno != 0) {
    int error_number = errno;
    KEEL_LOG_E(KEEL__CKPT_MODULE, "restore: cannot list %s: %s", where, strerror(error_number));
    status = keel_status_from_errno(error_number);
  }
  if (status == KEEL_ENOMEM)
    KEEL_LOG_E(KEEL__CKPT_MODULE, "restore from %s: out of memory while listing", where);
  closedir(steps);
  if (status != KEEL_OK) {
    candidate_list_free(list);
    *list = (candidate_list){0};
    close(job_directory);
    return status;
  }
  *job_directory_p = job_directory;
  return KEEL_OK;
}

keel_status keel_ckpt_persistent_restore(keel_registry *registry, const char *root,
                                         const keel_ckpt_selector *selector,
                                         keel_ckpt_identity *used_p) {
  if (registry == NULL || root == NULL || selector == NULL || selector->job_id == 0)
    return KEEL_EINVAL;
  char where[PATH_MAX];
  candidate_list list = {0};
  int job_directory = -1;
  keel_status status = candidates_collect(root, selector, where, sizeof where, &job_directory, &list);
  if (status != KEEL_OK) return status;
  status = keel__ckpt_restore_best(registry, selector, list.items, list.count, list.refused, where,
                                   used_p);
  candidate_list_free(&list);
  close(job_directory);
  return status;
}

keel_status keel_ckpt_persistent_newest(const char *root, const keel_ckpt_selector *selector,
                                        uint64_t *step_p) {
  if (root == NULL || selector == NULL || selector->job_id == 0 || step_p == NULL)
    return KEEL_EINVAL;
  char where[PATH_MAX];
  candidate_list list = {0};
  int job_directory = -1;
  keel_status status = candidates_collect(root, selector, where, sizeof where, &job_directory, &list);
  if (status != KEEL_OK) return status;
  bool found = false;
  for (size_t i = 0; i < list.count; i++) {
    const keel_ckpt_identity *identity = &list.items[i].manifest.identity;
    if (identity->job_id != selector->job_id || identity->shard_index != selector->shard_index ||
        (selector->shard_count != 0 && identity->shard_count != selector->shard_count))
      continue;
    if (!found || identity->step > *step_p) *step_p = identity->step;
    found = true;
  }
  candidate_list_free(&list);
  close(job_directory);
  return found ? KEEL_OK : KEEL_ENOTFOUND;
}
