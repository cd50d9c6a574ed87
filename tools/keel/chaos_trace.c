/* keel chaos: where a run with failures parted from the failure-free run. A program that
 * prints `trace step S rank R WORD...` lines (tests/programs/ec_train --trace-every) gets, when
 * its final state differs, the first step and rank whose line differs and the first word
 * that does, so a rare wrong model seen once (in CI, say) already says where it began. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chaos.h"

typedef struct trace_line {
  uint64_t step;
  int64_t rank;
  size_t order; /* the line's place in its file: a step redone prints again, the last counts */
  char *words;  /* what follows "rank R " */
} trace_line;

typedef struct trace_lines {
  trace_line *lines;
  size_t count, capacity;
} trace_lines;

static void trace_lines_free(trace_lines *lines) {
  for (size_t i = 0; i < lines->count; i++) free(lines->lines[i].words);
  free(lines->lines);
  memset(lines, 0, sizeof *lines);
}

bool keel__chaos_is_trace_line(const char *text) {
  return strncmp(text, KEEL__CHAOS_TRACE_PREFIX, strlen(KEEL__CHAOS_TRACE_PREFIX)) == 0;
}

/* One line into lines when it is a trace line; false only when memory ran out. */
static bool trace_line_add(trace_lines *lines, const char *text) {
  if (!keel__chaos_is_trace_line(text)) return true;
  unsigned long long step;
  long long rank;
  int consumed = 0;
  if (sscanf(text, KEEL__CHAOS_TRACE_PREFIX "%llu rank %lld %n", &step, &rank, &consumed) != 2 ||
      consumed == 0)
    return true; /* a line that only looks like one */
  if (lines->count == lines->capacity) {
    size_t capacity = lines->capacity ? lines->capacity * 2 : 1024;
    trace_line *grown = realloc(lines->lines, capacity * sizeof *grown);
    if (grown == NULL) return false;
    lines->lines = grown;
    lines->capacity = capacity;
  }
  char *words = strdup(text + consumed);
  if (words == NULL) return false;
  words[strcspn(words, "\n")] = '\0';
  lines->lines[lines->count] =
      (trace_line){.step = step, .rank = rank, .order = lines->count, .words = words};
  lines->count++;
  return true;
}

/* By step, then rank: the order in which two runs' lines are compared. */
static int key_compare(const trace_line *x, const trace_line *y) {
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  return 0;
}

/* By key, then place in the file: the last line of each key ends its run of equals. */
static int trace_line_compare(const void *a, const void *b) {
  const trace_line *x = a, *y = b;
  int order = key_compare(x, y);
  if (order != 0) return order;
  return x->order < y->order ? -1 : (x->order > y->order ? 1 : 0);
}

/* The trace lines of path, sorted by step and rank, the last of each pair only. */
static bool trace_lines_read(const char *path, trace_lines *lines) {
  memset(lines, 0, sizeof *lines);
  FILE *file = fopen(path, "r");
  if (file == NULL) return false;
  char *text = NULL;
  size_t capacity = 0;
  bool read = true;
  while (read && getline(&text, &capacity, file) >= 0) read = trace_line_add(lines, text);
  read = read && !ferror(file);
  free(text);
  fclose(file);
  if (!read) {
    trace_lines_free(lines);
    return false;
  }
  if (lines->count == 0) return true;
  qsort(lines->lines, lines->count, sizeof *lines->lines, trace_line_compare);
  size_t kept = 0;
  for (size_t i = 0; i < lines->count; i++) {
    bool last = i + 1 == lines->count || key_compare(&lines->lines[i + 1], &lines->lines[i]) != 0;
    if (last)
      lines->lines[kept++] = lines->lines[i];
    else
      free(lines->lines[i].words);
  }
  lines->count = kept;
  return true;
}

static void word_copy(char *to, size_t capacity, const char *word, size_t length) {
  if (length == 0)
    snprintf(to, capacity, "(no more)"); /* the line ended */
  else
    snprintf(to, capacity, "%.*s", (int)length, word);
}

/* Whether a and b differ, the first word where they do into got and want. */
static bool word_parting(const char *a, const char *b, char *got, char *want, size_t capacity) {
  for (;;) {
    size_t a_length = strcspn(a, " "), b_length = strcspn(b, " ");
    if (a_length != b_length || strncmp(a, b, a_length) != 0) {
      word_copy(got, capacity, a, a_length);
      word_copy(want, capacity, b, b_length);
      return true;
    }
    if (a[a_length] == '\0' && b[b_length] == '\0') return false;
    a += a_length + (a[a_length] == ' ');
    b += b_length + (b[b_length] == ' ');
  }
}

bool keel__chaos_trace_parting(const char *reference_output, const char *run_output, char *where,
                               size_t capacity) {
  trace_lines reference, run;
  if (!trace_lines_read(reference_output, &reference)) return false;
  if (!trace_lines_read(run_output, &run)) {
    trace_lines_free(&reference);
    return false;
  }
  bool found = reference.count > 0 && run.count > 0;
  if (found) snprintf(where, capacity, "the traces agree at every step both printed");
  size_t i = 0, j = 0;
  while (found && i < reference.count && j < run.count) {
    int order = key_compare(&reference.lines[i], &run.lines[j]);
    if (order != 0) {
      order < 0 ? i++ : j++;
      continue;
    }
    char got[64], want[64];
    if (word_parting(run.lines[j].words, reference.lines[i].words, got, want, sizeof got)) {
      snprintf(where, capacity,
               "the traces part at step %" PRIu64 " rank %" PRId64 ": %s, failure-free %s",
               run.lines[j].step, run.lines[j].rank, got, want);
      break;
    }
    i++;
    j++;
  }
  trace_lines_free(&run);
  trace_lines_free(&reference);
  return found;
}
