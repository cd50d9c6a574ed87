/* A tiny bounded reader and writer of one-line JSON objects, shared by the launcher (status
 * lines of workers) and `keel report` (events files): members are found with core's
 * keel_json_member; here are the readers of the tool's own needs (an array's first number,
 * decoded strings), the escaper, and the validator that refuses a line that is not one
 * whole object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"

/* Objects nest at most this deep; status and event lines are flat but for arrays. */
#define JSON_MAX_DEPTH 8

void keel__json_escape(const char *text, char *escaped, size_t capacity) {
  size_t used = 0;
  for (const unsigned char *at = (const unsigned char *)text; *at != '\0'; at++) {
    char piece[8];
    if (*at == '"' || *at == '\\')
      snprintf(piece, sizeof piece, "\\%c", *at);
    else if (*at < 0x20)
      snprintf(piece, sizeof piece, "\\u%04x", *at);
    else
      snprintf(piece, sizeof piece, "%c", *at);
    size_t length = strlen(piece);
    if (used + length + 1 > capacity) break;
    memcpy(escaped + used, piece, length);
    used += length;
  }
  if (capacity > 0) escaped[used] = '\0';
}

bool keel__json_int(const char *line, const char *key, int64_t *value_p) {
  const char *value = keel_json_member(line, key);
  if (value == NULL) return false;
  if (*value == '[') value++;
  char *end;
  long long number = strtoll(value, &end, 10);
  if (end == value) return false;
  *value_p = number;
  return true;
}

bool keel__json_string(const char *line, const char *key, char *text, size_t capacity) {
  const char *value = keel_json_member(line, key);
  if (value == NULL || *value != '"' || capacity == 0) return false;
  size_t used = 0;
  for (value++; *value != '"'; value++) {
    if (*value == '\\') value++;
    if (*value == '\0') return false;
    if (used + 1 < capacity) text[used++] = *value;
  }
  text[used] = '\0';
  return true;
}

size_t keel__json_int_array(const char *line, const char *key, int64_t *values, size_t capacity,
                            size_t *total_p) {
  const char *at = keel_json_member(line, key);
  size_t stored = 0, total = 0;
  if (at != NULL && *at == '[') {
    for (at++; *at != ']' && *at != '\0';) {
      char *end;
      long long number = strtoll(at, &end, 10);
      if (end == at) break;
      if (stored < capacity) values[stored++] = number;
      total++;
      at = end;
      while (*at == ' ' || *at == ',') at++;
    }
  }
  if (total_p != NULL) *total_p = total;
  return stored;
}

/* ---- the validator: a recursive descent bounded by JSON_MAX_DEPTH. Each function returns
 * the first character after what it read, or NULL where the text is not JSON. */
static const char *json_value(const char *at, int depth);

static const char *json_space(const char *at) {
  while (*at == ' ' || *at == '\t') at++;
  return at;
}

static const char *json_string_end(const char *at) {
  if (*at != '"') return NULL;
  for (at++; *at != '"'; at++) {
    if ((unsigned char)*at < 0x20) return NULL;
    if (*at == '\\' && *++at == '\0') return NULL;
  }
  return at + 1;
}

/* strtod also takes "nan" and "inf", which a worker's %g may print for a diverged loss:
 * such a line is still a whole line. */
static const char *json_number_end(const char *at) {
  if (*at != '-' && *at != 'n' && *at != 'i' && (*at < '0' || *at > '9')) return NULL;
  char *end;
  strtod(at, &end);
  return end == at ? NULL : end;
}

static const char *json_members(const char *at, char close, bool keyed, int depth) {
  at = json_space(at + 1);
  if (*at == close) return at + 1;
  for (;;) {
    if (keyed) {
      at = json_string_end(json_space(at));
      if (at == NULL || *(at = json_space(at)) != ':') return NULL;
      at++;
    }
    at = json_value(at, depth + 1);
    if (at == NULL) return NULL;
    at = json_space(at);
    if (*at == close) return at + 1;
    if (*at != ',') return NULL;
    at++;
  }
}

static const char *json_value(const char *at, int depth) {
  if (depth > JSON_MAX_DEPTH) return NULL;
  at = json_space(at);
  if (*at == '{') return json_members(at, '}', true, depth);
  if (*at == '[') return json_members(at, ']', false, depth);
  if (*at == '"') return json_string_end(at);
  if (strncmp(at, "true", 4) == 0) return at + 4;
  if (strncmp(at, "false", 5) == 0) return at + 5;
  if (strncmp(at, "null", 4) == 0) return at + 4;
  return json_number_end(at);
}

bool keel__json_object_valid(const char *text) {
  const char *at = json_space(text);
  if (*at != '{') return false;
  at = json_value(at, 0);
  return at != NULL && *json_space(at) == '\0';
}
