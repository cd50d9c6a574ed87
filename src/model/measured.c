/* Reads the model's inputs from a keel events file (docs/RUNTIME.md): recovery lines give
 * the checkpoint (state transfer) and fixed recovery costs, progress lines the minibatch
 * time. A small bounded scanner reads only top-level members; it never builds a tree. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/model.h"

/* Status lines are under 4 KiB; launcher lines carry a program path. Longer is not ours. */
#define LINE_MAXIMUM (64 * 1024)
/* Progress is tracked per uid in a table indexed by uid; uids past it are not sampled. */
#define UID_MAXIMUM 4096
/* Distinct recoveries remembered for deduplication; later ones still count, undeduplicated. */
#define RECOVERY_MAXIMUM 4096

typedef struct progress_mark {
  bool seen;
  int64_t epoch;
  int64_t step;
  int64_t t_ns;
} progress_mark;

/* One recovery's split, in milliseconds, as the slowest rank reported it. */
typedef struct recovery_mark {
  int64_t new_epoch;
  double fixed_ms;    /* detect + revoke + agree + rebuild */
  double transfer_ms; /* state_transfer */
  double redo_ms;
} recovery_mark;

typedef struct measure_context {
  progress_mark *marks;      /* UID_MAXIMUM entries */
  recovery_mark *recoveries; /* RECOVERY_MAXIMUM entries */
  size_t recovery_count;     /* entries used */
  /* Recoveries no later line can merge with (an earlier job's, or past the table), summed. */
  size_t settled_count;
  double settled_fixed_ms, settled_transfer_ms, settled_redo_ms;
  size_t settled_transfers;
  double step_ns_sum;
  size_t step_count;
  keel_model_measured measured; /* counts; the means are computed at the end */
} measure_context;

/* ---- the scanner */

static const char *skip_space(const char *text) {
  while (*text == ' ' || *text == '\t' || *text == '\r' || *text == '\n') text++;
  return text;
}

/* The closing quote of the string whose first character is at text, or NULL when the line
 * ends first. Escapes are stepped over, not decoded: keys we look for have none. */
static const char *string_end(const char *text) {
  while (*text != '\0' && *text != '"') {
    if (*text == '\\') {
      text++;
      if (*text == '\0') return NULL;
    }
    text++;
  }
  return *text == '"' ? text : NULL;
}

/* Where the value of top-level member key starts, or NULL when the line is not an object,
 * the key is absent, or the line breaks off. A key only matches where a key can stand (after
 * '{' or ',' at depth 1), so a string value that happens to read "key": never does. */
static const char *member_value(const char *line, const char *key) {
  size_t key_length = strlen(key);
  const char *cursor = skip_space(line);
  if (*cursor != '{') return NULL;
  int depth = 0;
  bool at_key = false;
  for (; *cursor != '\0'; cursor++) {
    char c = *cursor;
    if (c == '"') {
      const char *end = string_end(cursor + 1);
      if (end == NULL) return NULL;
      if (depth == 1 && at_key) {
        const char *colon = skip_space(end + 1);
        if (*colon != ':') return NULL;
        if ((size_t)(end - cursor - 1) == key_length && memcmp(cursor + 1, key, key_length) == 0)
          return skip_space(colon + 1);
        end = colon;
        at_key = false;
      }
      cursor = end;
    } else if (c == '{' || c == '[') {
      depth++;
      at_key = (c == '{' && depth == 1);
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return NULL;
    } else if (c == ',') {
      at_key = (depth == 1);
    }
  }
  return NULL;
}

/* A JSON number must end where the member ends; strtod alone would take "12abc" or "nan". */
static bool number_ends(const char *end) {
  end = skip_space(end);
  return *end == ',' || *end == '}';
}

static bool number_starts(const char *value) {
  return value != NULL && (*value == '-' || (*value >= '0' && *value <= '9'));
}

static bool member_double(const char *line, const char *key, double *value_p) {
  const char *value = member_value(line, key);
  if (!number_starts(value)) return false;
  char *end = NULL;
  double number = strtod(value, &end);
  if (end == value || !number_ends(end) || !isfinite(number)) return false;
  *value_p = number;
  return true;
}

static bool member_integer(const char *line, const char *key, int64_t *value_p) {
  const char *value = member_value(line, key);
  if (!number_starts(value)) return false;
  char *end = NULL;
  errno = 0;
  long long number = strtoll(value, &end, 10);
  if (end == value || errno != 0 || !number_ends(end)) return false;
  *value_p = number;
  return true;
}

/* True when member key is the string text exactly. */
static bool member_is(const char *line, const char *key, const char *text) {
  const char *value = member_value(line, key);
  if (value == NULL || *value != '"') return false;
  size_t length = strlen(text);
  return strncmp(value + 1, text, length) == 0 && value[1 + length] == '"';
}

/* ---- the events */

/* A time split in milliseconds: present, finite and not negative, or the line is refused. */
static bool member_milliseconds(const char *line, const char *key, double *value_p) {
  return member_double(line, key, value_p) && *value_p >= 0.0;
}

static void recovery_settle(measure_context *context, const recovery_mark *mark) {
  context->settled_count++;
  context->settled_fixed_ms += mark->fixed_ms;
  context->settled_redo_ms += mark->redo_ms;
  /* A shrink moves no state: its zero says nothing about what a save costs. */
  if (mark->transfer_ms > 0.0) {
    context->settled_transfer_ms += mark->transfer_ms;
    context->settled_transfers++;
  }
}

/* A new job in the same file (runs appended to one events file) numbers its epochs and
 * uids afresh: what came before can no longer merge with what follows. */
static void job_start(measure_context *context) {
  for (size_t i = 0; i < context->recovery_count; i++)
    recovery_settle(context, &context->recoveries[i]);
  context->recovery_count = 0;
  memset(context->marks, 0, UID_MAXIMUM * sizeof *context->marks);
}

/* Several ranks may report one recovery: keep the slowest, since the job waits for it. */
static void recovery_keep(measure_context *context, const recovery_mark *mark) {
  for (size_t i = 0; i < context->recovery_count; i++) {
    recovery_mark *old = &context->recoveries[i];
    if (old->new_epoch != mark->new_epoch) continue;
    if (mark->fixed_ms + mark->transfer_ms > old->fixed_ms + old->transfer_ms) *old = *mark;
    return;
  }
  if (context->recovery_count < RECOVERY_MAXIMUM)
    context->recoveries[context->recovery_count++] = *mark;
  else
    recovery_settle(context, mark);
}

static bool scan_recovery(measure_context *context, const char *line) {
  double detect, revoke, agree, rebuild, transfer, redo;
  recovery_mark mark;
  if (!member_milliseconds(line, "detect_ms", &detect) ||
      !member_milliseconds(line, "revoke_ms", &revoke) ||
      !member_milliseconds(line, "agree_ms", &agree) ||
      !member_milliseconds(line, "rebuild_ms", &rebuild) ||
      !member_milliseconds(line, "state_transfer_ms", &transfer) ||
      !member_milliseconds(line, "redo_ms", &redo))
    return false;
  /* Without an epoch the line is its own recovery: -1 - count never matches a real one. */
  if (!member_integer(line, "new_epoch", &mark.new_epoch))
    mark.new_epoch = -1 - (int64_t)context->recovery_count;
  mark.fixed_ms = detect + revoke + agree + rebuild;
  mark.transfer_ms = transfer;
  mark.redo_ms = redo;
  recovery_keep(context, &mark);
  return true;
}

/* Minibatch time from two progress lines of one uid: only within one epoch (a recovery
 * between them is not training) and only when the step moved forward (a redo repeats one). */
static bool scan_progress(measure_context *context, const char *line) {
  int64_t uid, epoch = 0, step, t_ns;
  if (!member_integer(line, "uid", &uid) || !member_integer(line, "step", &step) ||
      !member_integer(line, "t_ns", &t_ns) || t_ns < 0 || step < 0)
    return false;
  (void)member_integer(line, "epoch", &epoch);
  if (uid < 0 || uid >= UID_MAXIMUM) return true;
  progress_mark *mark = &context->marks[uid];
  if (mark->seen && mark->epoch == epoch && step > mark->step && t_ns > mark->t_ns) {
    context->step_ns_sum += (double)(t_ns - mark->t_ns);
    context->step_count += (size_t)(step - mark->step);
  }
  *mark = (progress_mark){.seen = true, .epoch = epoch, .step = step, .t_ns = t_ns};
  return true;
}

static bool scan_exit(measure_context *context, const char *line) {
  int64_t code = 0;
  bool signalled = member_value(line, "signal") != NULL;
  if (signalled || (member_integer(line, "code", &code) && code != 0))
    context->measured.failed_exits++;
  return true;
}

/* One line; false when it is malformed (counted as skipped). Unknown events are fine. */
static bool scan_line(measure_context *context, const char *line) {
  const char *event = member_value(line, "event");
  if (event == NULL || *event != '"') return false;
  if (member_is(line, "event", "recovery")) return scan_recovery(context, line);
  if (member_is(line, "event", "progress")) return scan_progress(context, line);
  if (member_is(line, "event", "exit")) return scan_exit(context, line);
  if (member_is(line, "event", "fault")) context->measured.faults++;
  if (member_is(line, "event", "job_start")) job_start(context);
  return true;
}

/* Turns the sums into the means of keel_model_measured. */
static void measure_finish(measure_context *context) {
  keel_model_measured *measured = &context->measured;
  job_start(context); /* settles the last job's recoveries */
  size_t count = context->settled_count, transfers = context->settled_transfers;
  measured->recoveries = count;
  measured->state_recoveries = transfers;
  if (count > 0) {
    measured->restart_cost_s = context->settled_fixed_ms / 1e3 / (double)count;
    measured->redo_s = context->settled_redo_ms / 1e3 / (double)count;
    /* keel's own recovery is in-process: all of it but the redo is its fixed cost. */
    measured->inprocess_recovery_s =
        (context->settled_fixed_ms + context->settled_transfer_ms) / 1e3 / (double)count;
  }
  if (transfers > 0)
    measured->checkpoint_cost_s = context->settled_transfer_ms / 1e3 / (double)transfers;
  measured->minibatch_samples = context->step_count;
  if (context->step_count > 0)
    measured->minibatch_s = context->step_ns_sum / 1e9 / (double)context->step_count;
}

/* Reads the rest of an overlong line so the next read starts at the next line. */
static void discard_rest_of_line(FILE *file) {
  int c;
  while ((c = fgetc(file)) != EOF && c != '\n') {
  }
}

static bool line_is_blank(const char *line) { return *skip_space(line) == '\0'; }

static keel_status measure_stream(measure_context *context, FILE *file, char *line) {
  while (fgets(line, LINE_MAXIMUM + 2, file) != NULL) {
    size_t length = strlen(line);
    bool whole = length > 0 && line[length - 1] == '\n';
    if (!whole && length > LINE_MAXIMUM) {
      discard_rest_of_line(file);
      context->measured.lines++;
      context->measured.skipped_lines++;
      continue;
    }
    if (line_is_blank(line)) continue;
    context->measured.lines++;
    if (!scan_line(context, line)) context->measured.skipped_lines++;
  }
  return ferror(file) ? KEEL_EIO : KEEL_OK;
}

keel_status keel_model_measure_file(const char *path, keel_model_measured *measured_p) {
  if (path == NULL || measured_p == NULL) return KEEL_EINVAL;
  keel_status status = KEEL_ENOMEM;
  measure_context context = {0};
  FILE *file = NULL;
  char *line = malloc(LINE_MAXIMUM + 2);
  if (line == NULL) goto fail;
  context.marks = calloc(UID_MAXIMUM, sizeof *context.marks);
  if (context.marks == NULL) goto fail_free_line;
  context.recoveries = calloc(RECOVERY_MAXIMUM, sizeof *context.recoveries);
  if (context.recoveries == NULL) goto fail_free_marks;
  file = fopen(path, "r");
  /* Not logged here: the status says what went wrong and the caller, who knows why it
   * read the file, reports it once. */
  if (file == NULL) {
    status = keel_status_from_errno(errno);
    goto fail_free_recoveries;
  }
  status = measure_stream(&context, file, line);
  fclose(file);
  if (status == KEEL_OK) {
    measure_finish(&context);
    *measured_p = context.measured;
  }
fail_free_recoveries:
  free(context.recoveries);
fail_free_marks:
  free(context.marks);
fail_free_line:
  free(line);
fail:
  return status;
}
