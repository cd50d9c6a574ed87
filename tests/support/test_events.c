/* The events file of `keel run`, read back by the tests (test_events.h). Lines are matched
 * as text, the way the launcher writes them: "{\"event\":\"NAME\",..." with flat members. */
#include "test_events.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include <cmocka.h>

#include "test_support.h"

void keel_test_events_read(const char *path, size_t max_lines, keel_test_events *log) {
  memset(log, 0, sizeof *log);
  log->text = keel_test_read_file(path, NULL);
  if (log->text == NULL) return;
  log->lines = malloc((max_lines > 0 ? max_lines : 1) * sizeof *log->lines);
  if (log->lines == NULL) return;
  for (char *save = NULL, *line = strtok_r(log->text, "\n", &save);
       line != NULL && log->count < max_lines; line = strtok_r(NULL, "\n", &save))
    log->lines[log->count++] = line;
}

void keel_test_events_free(keel_test_events *log) {
  free(log->lines);
  free(log->text);
  memset(log, 0, sizeof *log);
}

const char *keel_test_event_field(const char *line, const char *key) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char *at = strstr(line, pattern);
  return at ? at + strlen(pattern) : NULL;
}

long long keel_test_event_long(const char *line, const char *key) {
  const char *at = keel_test_event_field(line, key);
  if (at == NULL) return -1;
  if (*at == '"') at++;
  return strtoll(at, NULL, 10);
}

bool keel_test_event_is(const char *line, const char *name) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "{\"event\":\"%s\"", name);
  return strncmp(line, pattern, strlen(pattern)) == 0;
}

size_t keel_test_events_count(const keel_test_events *log, const char *name) {
  size_t count = 0;
  for (size_t i = 0; i < log->count; i++) count += keel_test_event_is(log->lines[i], name);
  return count;
}

const char *keel_test_events_find(const keel_test_events *log, const char *name, long uid) {
  for (size_t i = 0; i < log->count; i++) {
    if (keel_test_event_is(log->lines[i], name) &&
        (uid < 0 || keel_test_event_long(log->lines[i], "uid") == uid))
      return log->lines[i];
  }
  return NULL;
}

bool keel_test_events_job_id(const keel_test_events *log, char *job_id, size_t capacity) {
  const char *start = keel_test_events_find(log, "job_start", -1);
  const char *value = start ? keel_test_event_field(start, "job_id") : NULL;
  if (value == NULL) return false;
  value += *value == '"';
  snprintf(job_id, capacity, "%.*s", (int)strspn(value, "0123456789"), value);
  return true;
}

bool keel_test_events_wait(const char *path, size_t max_lines, keel_test_events_want *want,
                           void *context, int pause_ms, int timeout_ms) {
  struct timespec pause = {pause_ms / 1000, (long)(pause_ms % 1000) * 1000 * 1000};
  for (int waited = 0; waited < timeout_ms; waited += pause_ms) {
    keel_test_events log;
    keel_test_events_read(path, max_lines, &log);
    bool done = want(&log, context);
    keel_test_events_free(&log);
    if (done) return true;
    nanosleep(&pause, NULL);
  }
  return false;
}

void keel_test_events_assert_none_left(const keel_test_events *log) {
  size_t spawned = 0;
  for (size_t i = 0; i < log->count; i++) {
    if (!keel_test_event_is(log->lines[i], "spawn")) continue;
    pid_t pid = (pid_t)keel_test_event_long(log->lines[i], "pid");
    assert_true(pid > 1);
    if (keel_test_pid_exists(pid)) fail_msg("pid %ld is still there", (long)pid);
    spawned++;
  }
  assert_true(spawned > 0);
}
