/* One-line JSON objects (status and event lines): a top-level member looked up by name, its
 * number or string read in place, with no tree built and every read bounded by the line.
 * The model's events reader, `keel report`, the launcher and the benchmarks share it. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "keel/core.h"

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
const char *keel_json_member(const char *line, const char *key) {
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

bool keel_json_double(const char *line, const char *key, double *value_p) {
  const char *value = keel_json_member(line, key);
  if (!number_starts(value)) return false;
  char *end = NULL;
  double number = strtod(value, &end);
  if (end == value || !number_ends(end) || !isfinite(number)) return false;
  *value_p = number;
  return true;
}

bool keel_json_int(const char *line, const char *key, int64_t *value_p) {
  const char *value = keel_json_member(line, key);
  if (!number_starts(value)) return false;
  char *end = NULL;
  errno = 0;
  long long number = strtoll(value, &end, 10);
  if (end == value || errno != 0 || !number_ends(end)) return false;
  *value_p = number;
  return true;
}

/* True when member key is the string text exactly. */
bool keel_json_string_is(const char *line, const char *key, const char *text) {
  const char *value = keel_json_member(line, key);
  if (value == NULL || *value != '"') return false;
  size_t length = strlen(text);
  return strncmp(value + 1, text, length) == 0 && value[1 + length] == '"';
}

/* String member key into text, truncated to fit; escapes are copied, not decoded (the
 * values read here, signal and status names, have none). false when it is not a string. */
bool keel_json_string(const char *line, const char *key, char *text, size_t capacity) {
  const char *value = keel_json_member(line, key);
  if (value == NULL || *value != '"' || capacity == 0) return false;
  const char *end = string_end(value + 1);
  if (end == NULL) return false;
  size_t length = (size_t)(end - value - 1);
  if (length >= capacity) length = capacity - 1;
  memcpy(text, value + 1, length);
  text[length] = '\0';
  return true;
}
