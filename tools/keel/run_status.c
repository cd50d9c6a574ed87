/* What the launcher tells people: the events file (its own events and every status line of
 * the workers, as JSON lines with monotonic and wall time) and the one-line status on the
 * terminal. Status lines are parsed with jansson (json_scan.c): a line that is not one JSON
 * object with an event is dropped, never trusted nor copied. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "launcher.h"

#define DISPLAY_PERIOD_NS (100 * INT64_C(1000000))
#define EVENT_MAX_BYTES (2 * KEEL__STATUS_LINE_MAX)

static void events_write(keel__launcher *launcher, const keel_buffer *line) {
  if (launcher->events_fd < 0) return;
  /* One write per line with O_APPEND: a reader polling the file sees whole lines. */
  ssize_t written = write(launcher->events_fd, line->data, line->length);
  if (written != (ssize_t)line->length)
    KEEL_LOG_W("launcher", "events file: %s", written < 0 ? strerror(errno) : "short write");
}

void keel__event_emit(keel__launcher *launcher, const char *event, const char *fields_format, ...) {
  keel__agent_event_note(launcher, event);
  if (launcher->events_fd < 0) return;
  keel_buffer line;
  keel_buffer_init(&line, EVENT_MAX_BYTES);
  keel_status status =
      keel_buffer_appendf(&line, "{\"event\":\"%s\",\"t_ns\":%lld,\"wall_ns\":%lld", event,
                          (long long)keel_now_ns(), (long long)keel_wall_ns());
  if (status == KEEL_OK && fields_format != NULL) {
    char fields[EVENT_MAX_BYTES / 2];
    va_list arguments;
    va_start(arguments, fields_format);
    vsnprintf(fields, sizeof fields, fields_format, arguments);
    va_end(arguments);
    status = keel_buffer_appendf(&line, ",%s", fields);
  }
  if (status == KEEL_OK) status = keel_buffer_append(&line, "}\n", 2);
  if (status == KEEL_OK) events_write(launcher, &line);
  keel_buffer_free(&line);
}

/* ---- status lines */
/* The object of a worker's line, or NULL when the line is to be dropped: not one JSON
 * object, or no "event" name. It must end with its closing brace, since the copy adds its
 * members in front of it. The caller json_decref()s it. */
static json_t *status_line_parse(const char *line, size_t length) {
  if (length < 2 || line[length - 1] != '}') return NULL;
  json_t *object = keel__json_object_parse(line, length);
  const char *event = json_string_value(json_object_get(object, "event"));
  if (event != NULL && event[0] != '\0') return object;
  json_decref(object);
  return NULL;
}

/* Copies a worker's line with the wall time added (and the time of arrival as t_ns if the
 * worker gave none), so that every line of the events file can be placed in time. */
static void status_line_copy(keel__launcher *launcher, const char *line, size_t length,
                             const json_t *object) {
  keel_buffer copy;
  keel_buffer_init(&copy, EVENT_MAX_BYTES);
  keel_status status = keel_buffer_append(&copy, line, length - 1);
  if (status == KEEL_OK && json_object_get(object, "t_ns") == NULL)
    status = keel_buffer_appendf(&copy, ",\"t_ns\":%lld", (long long)keel_now_ns());
  if (status == KEEL_OK)
    status = keel_buffer_appendf(&copy, ",\"wall_ns\":%lld}\n", (long long)keel_wall_ns());
  if (status == KEEL_OK) events_write(launcher, &copy);
  keel_buffer_free(&copy);
}

static void status_progress(keel__launcher *launcher, const json_t *object) {
  int64_t rank;
  /* An agent hears its own node's ranks only: any of them says the job's step. */
  if (!keel__json_int(object, "rank", &rank) || (rank != 0 && !launcher->agent.active)) return;
  keel__display *display = &launcher->display;
  display->has_progress = true;
  keel__json_int(object, "step", &display->step);
  keel__json_int(object, "world", &display->world);
  keel__json_int(object, "epoch", &display->epoch);
  keel__json_double(object, "loss", &display->loss);
  keel__json_double(object, "samples_per_s", &display->samples_per_s);
  display->dirty = true;
  keel__metrics_progress(launcher->metrics, display->step, display->world, display->epoch,
                         display->samples_per_s);
}

/* Rank 0 writes the recovery line; "failed" lists uids, which the table maps to the rank
 * each held. An empty list is a grow: joiners were admitted and nothing failed. */
static void status_recovery(keel__launcher *launcher, const json_t *object) {
  int64_t failed = -1, new_world = 0;
  double total_ms = 0;
  char policy[16] = "";
  keel__json_int_array(object, "failed", &failed, 1);
  keel__json_int(object, "new_world", &new_world);
  keel__json_double(object, "total_ms", &total_ms);
  keel__json_string(object, "policy", policy, sizeof policy);
  keel__metrics_recovery(launcher->metrics, total_ms);
  if (failed < 0) {
    keel__display_note(launcher, "grew: world %lld in %.0f ms", (long long)new_world, total_ms);
    return;
  }
  const keel__child *child = failed >= 0 ? keel__child_by_uid(launcher, (uint32_t)failed) : NULL;
  int64_t rank = child != NULL && child->rank >= 0 ? child->rank : failed;
  if (strcmp(policy, "replace") == 0) {
    keel__display_note(launcher, "recovered: rank %lld replaced in %.0f ms", (long long)rank,
                       total_ms);
    return;
  }
  keel__display_note(launcher, "recovered: rank %lld dropped, world %lld, in %.0f ms",
                     (long long)rank, (long long)new_world, total_ms);
}

static void status_line_handle(keel__launcher *launcher, char *line, size_t length) {
  if (length > 0 && line[length - 1] == '\r') line[--length] = '\0';
  json_t *object = status_line_parse(line, length);
  if (object == NULL) {
    KEEL_LOG_D("launcher", "ignoring a malformed status line (%zu bytes)", length);
    return;
  }
  status_line_copy(launcher, line, length, object);
  const char *event = json_string_value(json_object_get(object, "event"));
  keel__agent_event_note(launcher, event);
  if (strcmp(event, "progress") == 0) status_progress(launcher, object);
  if (strcmp(event, "recovery") == 0) {
    status_recovery(launcher, object);
    keel__launcher_store_census(launcher, "recovery");
  }
  json_decref(object);
}

/* Handles the complete lines at the front of the buffer and keeps the partial rest. */
static void status_lines_consume(keel__launcher *launcher) {
  char *buffer = launcher->status_buffer;
  size_t start = 0;
  for (char *newline = memchr(buffer, '\n', launcher->status_length); newline != NULL;
       newline = memchr(buffer + start, '\n', launcher->status_length - start)) {
    *newline = '\0';
    size_t end = (size_t)(newline - buffer);
    bool too_long = end - start > KEEL__STATUS_LINE_MAX;
    if (!launcher->status_discarding && !too_long)
      status_line_handle(launcher, buffer + start, end - start);
    launcher->status_discarding = false;
    start = end + 1;
  }
  size_t rest = launcher->status_length - start;
  if (rest > KEEL__STATUS_LINE_MAX) {
    launcher->status_discarding = true;
    rest = 0;
  }
  memmove(buffer, buffer + start, rest);
  launcher->status_length = rest;
}

/* Each read takes one record, a whole line; the buffer always has room for the longest
 * one, so that none is cut. */
void keel__status_drain(keel__launcher *launcher) {
  for (;;) {
    size_t space = sizeof launcher->status_buffer - launcher->status_length - 1;
    if (space <= KEEL__STATUS_LINE_MAX) {
      launcher->status_length = 0; /* only a partial line without end can be there */
      space = sizeof launcher->status_buffer - 1;
    }
    ssize_t got =
        read(launcher->status_read_fd, launcher->status_buffer + launcher->status_length, space);
    if (got <= 0) return;
    launcher->status_length += (size_t)got;
    status_lines_consume(launcher);
  }
}

/* ---- the terminal's status line */
void keel__display_note(keel__launcher *launcher, const char *format, ...) {
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(launcher->display.last_event, sizeof launcher->display.last_event, format, arguments);
  va_end(arguments);
  launcher->display.dirty = true;
}

static size_t terminal_columns(void) {
  struct winsize size;
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) != 0 || size.ws_col < 20) return 80;
  return size.ws_col;
}

static void display_draw(keel__launcher *launcher) {
  const keel__display *display = &launcher->display;
  char text[512];
  int used;
  if (display->has_progress)
    used = snprintf(text, sizeof text,
                    "keel: step %lld  loss %.4g  %.1f samples/s  world %lld  epoch %lld",
                    (long long)display->step, display->loss, display->samples_per_s,
                    (long long)display->world, (long long)display->epoch);
  else
    used = snprintf(text, sizeof text, "keel: %zu processes running",
                    keel__children_alive(launcher, false));
  if (display->last_event[0] != '\0' && used > 0 && (size_t)used < sizeof text)
    snprintf(text + used, sizeof text - (size_t)used, "  | %s", display->last_event);
  /* A line wider than the terminal wraps, and \r would then redraw only its tail. */
  size_t length = strlen(text), columns = terminal_columns() - 1;
  if (length > columns) length = columns;
  char line[600];
  int total = snprintf(line, sizeof line, "\r\033[K%.*s", (int)length, text);
  ssize_t ignored = write(STDERR_FILENO, line, (size_t)total);
  (void)ignored;
}

void keel__display_tick(keel__launcher *launcher, int64_t now_ns) {
  keel__display *display = &launcher->display;
  if (!display->enabled || !display->dirty) return;
  if (now_ns - display->last_draw_ns < DISPLAY_PERIOD_NS) return;
  display_draw(launcher);
  display->dirty = false;
  display->last_draw_ns = now_ns;
}

int64_t keel__display_deadline(const keel__launcher *launcher) {
  const keel__display *display = &launcher->display;
  if (!display->enabled || !display->dirty) return KEEL_NO_DEADLINE;
  return display->last_draw_ns + DISPLAY_PERIOD_NS;
}

void keel__display_finish(keel__launcher *launcher) {
  if (!launcher->display.enabled) return;
  display_draw(launcher);
  ssize_t ignored = write(STDERR_FILENO, "\n", 1);
  (void)ignored;
}
