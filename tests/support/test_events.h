/* Reading back the events file of `keel run` (one JSON object a line, the event's name
 * first) for the integration and fault tests: fields, events by name and uid, polling until
 * something happened, the job id, and the check that no spawned process is left behind. */
#ifndef KEEL_TEST_EVENTS_H
#define KEEL_TEST_EVENTS_H

#include <stdbool.h>
#include <stddef.h>

/* An events file cut into lines in place. */
typedef struct keel_test_events {
  char *text;   /* the whole file, NULL if it could not be read */
  char **lines; /* count lines, in file order */
  size_t count;
} keel_test_events;

/* Reads the events file at path, keeping its first max_lines (non-empty) lines. A file that
 * is missing (not written yet) gives an empty log. Free with keel_test_events_free. */
void keel_test_events_read(const char *path, size_t max_lines, keel_test_events *log);
void keel_test_events_free(keel_test_events *log);

/* The text right after "key": in line (a string value starts with its quote), or NULL. */
const char *keel_test_event_field(const char *line, const char *key);
/* The number at "key": in line, a quoted one included; -1 if line has no such key. */
long long keel_test_event_long(const char *line, const char *key);
/* Whether line is an event named name (its first member is "event":"name"). */
bool keel_test_event_is(const char *line, const char *name);

/* How many lines of log are events named name. */
size_t keel_test_events_count(const keel_test_events *log, const char *name);
/* The first line of event name about uid (uid < 0: about any), or NULL. */
const char *keel_test_events_find(const keel_test_events *log, const char *name, long uid);

/* The job id of the job_start event, as its decimal digits, into job_id (capacity bytes);
 * false (job_id untouched) when log has no job_start with a job_id yet. */
bool keel_test_events_job_id(const keel_test_events *log, char *job_id, size_t capacity);

/* Polls the events file at path (up to max_lines lines) every pause_ms until want(log,
 * context) holds, for at most timeout_ms; true if it held. */
typedef bool keel_test_events_want(const keel_test_events *log, void *context);
bool keel_test_events_wait(const char *path, size_t max_lines, keel_test_events_want *want,
                           void *context, int pause_ms, int timeout_ms);

/* cmocka assertion: log has at least one spawn event, every one with a pid above 1, and
 * every such process is gone (reaped by the launcher, not a zombie). */
void keel_test_events_assert_none_left(const keel_test_events *log);

#endif
