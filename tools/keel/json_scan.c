/* The JSON of the `keel` command's lines, shared by the launcher (status lines of workers)
 * and `keel report` (events files): each line is parsed with jansson, and read through the
 * small member readers below, which refuse a member of the wrong type; and the escaper of
 * the strings the tool writes into its own lines. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"

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

json_t *keel__json_object_parse(const char *line, size_t length) {
  /* No position or message is kept: callers drop and count the line, they do not explain
   * it. Allocation failures end here too, indistinguishable from garbage. */
  json_t *object = json_loadb(line, length, 0, NULL);
  if (json_is_object(object)) return object;
  json_decref(object);
  return NULL;
}

bool keel__json_int(const json_t *object, const char *key, int64_t *value_p) {
  const json_t *value = json_object_get(object, key);
  if (!json_is_integer(value)) return false;
  *value_p = json_integer_value(value);
  return true;
}

bool keel__json_double(const json_t *object, const char *key, double *value_p) {
  const json_t *value = json_object_get(object, key);
  if (!json_is_number(value) || !isfinite(json_number_value(value))) return false;
  *value_p = json_number_value(value);
  return true;
}

bool keel__json_string(const json_t *object, const char *key, char *text, size_t capacity) {
  const char *value = json_string_value(json_object_get(object, key));
  if (value == NULL || capacity == 0) return false;
  snprintf(text, capacity, "%s", value);
  return true;
}

size_t keel__json_int_array(const json_t *object, const char *key, int64_t *values,
                            size_t capacity) {
  const json_t *array = json_object_get(object, key);
  size_t stored = 0;
  for (size_t i = 0; i < json_array_size(array) && stored < capacity; i++) {
    const json_t *element = json_array_get(array, i);
    /* The integers before the first other element, as a list of uids is read. */
    if (!json_is_integer(element)) break;
    values[stored++] = json_integer_value(element);
  }
  return stored;
}

int64_t keel__json_int_or(const json_t *object, const char *key, int64_t fallback) {
  int64_t value;
  return keel__json_int(object, key, &value) ? value : fallback;
}
