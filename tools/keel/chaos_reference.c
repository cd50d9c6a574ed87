/* keel chaos --reference-dir: a failure-free run kept and reused. It is keyed by what decides
 * its result (the run's flags and the program's arguments, and the bytes of every file among
 * them, of the keel tool and of libkeel beside it), and only its `finish` lines are kept: the
 * final state of each rank, which is all the checks compare; beside them its output's trace
 * lines, which say where a run with another model parted from it (chaos_trace.c). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chaos.h"
#include "keel/core.h"

/* The crc32c of a regular file's bytes into *crc; false for anything else (a flag, a value). */
static bool file_crc(const char *path, uint32_t *crc) {
  struct stat info;
  if (stat(path, &info) != 0 || !S_ISREG(info.st_mode)) return false;
  FILE *file = fopen(path, "rb");
  if (file == NULL) return false;
  uint8_t buffer[1 << 16];
  size_t got;
  while ((got = fread(buffer, 1, sizeof buffer, file)) > 0) *crc = keel_crc32c(*crc, buffer, got);
  bool read_whole = !ferror(file);
  fclose(file);
  return read_whole;
}

/* Two crcs over the same text, each with its own seed, as 16 hex digits: a key that a change
 * of a flag or a rebuilt binary moves. */
typedef struct key_sums {
  uint32_t first, second;
} key_sums;

static void sums_add(key_sums *sums, const void *data, size_t length) {
  sums->first = keel_crc32c(sums->first, data, length);
  sums->second = keel_crc32c(sums->second ^ 0x9e3779b9u, data, length);
}

static void sums_add_file(key_sums *sums, const char *path) {
  uint32_t crc = 0;
  if (!file_crc(path, &crc)) return;
  sums_add(sums, path, strlen(path) + 1);
  sums_add(sums, &crc, sizeof crc);
}

void keel__chaos_reference_key(char *const *argv, int argc, const char *self, int64_t etcd_members,
                               char *key, size_t capacity) {
  key_sums sums = {0, 0};
  for (int i = 0; i < argc; i++) {
    sums_add(&sums, argv[i], strlen(argv[i]) + 1);
    sums_add_file(&sums, argv[i]);
  }
  sums_add(&sums, &etcd_members, sizeof etcd_members);
  sums_add_file(&sums, self);
  /* The tool is bin/keel; the library the programs load is lib/libkeel.so beside bin/. */
  char library[PATH_MAX];
  const char *slash = strrchr(self, '/');
  int folder = slash != NULL ? (int)(slash - self) : 0;
  snprintf(library, sizeof library, "%.*s/../lib/libkeel.so", folder, self);
  sums_add_file(&sums, library);
  snprintf(key, capacity, "%08" PRIx32 "%08" PRIx32, sums.first, sums.second);
}

bool keel__chaos_reference_load(const char *path, keel__chaos_run *reference) {
  reference->events = fopen(path, "r");
  if (reference->events == NULL) return false;
  keel__chaos_events_read(reference, NULL, 0);
  fclose(reference->events);
  reference->events = NULL;
  return reference->finish_count > 0;
}

/* The lines of source that wanted accepts into path, through a temporary file renamed over
 * it: a reader never sees half of one. False when it could not be written, or when there was
 * nothing to keep and empty is refused. */
static bool lines_keep(const char *source, const char *path, bool (*wanted)(const char *line),
                       bool empty_refused) {
  char temporary[PATH_MAX + 16];
  snprintf(temporary, sizeof temporary, "%s.%ld", path, (long)getpid());
  FILE *from = fopen(source, "r");
  if (from == NULL) return false;
  FILE *to = fopen(temporary, "w");
  if (to == NULL) {
    fclose(from);
    return false;
  }
  char *line = NULL;
  size_t capacity = 0;
  size_t kept = 0;
  while (getline(&line, &capacity, from) >= 0) {
    if (!wanted(line)) continue;
    fputs(line, to);
    kept++;
  }
  free(line);
  bool written = !ferror(from) && fflush(to) == 0 && !ferror(to);
  fclose(from);
  written = fclose(to) == 0 && written && (kept > 0 || !empty_refused);
  if (written && rename(temporary, path) == 0) return true;
  unlink(temporary);
  return false;
}

static bool finish_line(const char *line) { return strstr(line, "\"event\":\"finish\"") != NULL; }

bool keel__chaos_reference_save(const char *events_path, const char *path) {
  return lines_keep(events_path, path, finish_line, true);
}

bool keel__chaos_reference_save_trace(const char *output_path, const char *path) {
  return lines_keep(output_path, path, keel__chaos_is_trace_line, false);
}
