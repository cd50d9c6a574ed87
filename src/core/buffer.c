/* Growable byte buffers with a hard maximum, so that no peer can make keel allocate
 * without bound, and the hex helpers used for job tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/core.h"

void keel_buffer_init(keel_buffer *buffer, size_t maximum) {
  buffer->data = NULL;
  buffer->length = 0;
  buffer->capacity = 0;
  buffer->maximum = maximum;
}

/* Grows the allocation to at least capacity bytes, never past limit. */
static keel_status buffer_grow(keel_buffer *buffer, size_t capacity, size_t limit) {
  if (capacity <= buffer->capacity) return KEEL_OK;
  if (capacity > limit) return KEEL_ERANGE;
  size_t grown = buffer->capacity < 64 ? 64 : buffer->capacity;
  while (grown < capacity) grown = grown > limit / 2 ? limit : grown * 2;
  if (grown > limit) grown = limit;
  uint8_t *data = realloc(buffer->data, grown);
  if (data == NULL) return KEEL_ENOMEM;
  buffer->data = data;
  buffer->capacity = grown;
  return KEEL_OK;
}

keel_status keel_buffer_reserve(keel_buffer *buffer, size_t capacity) {
  return buffer_grow(buffer, capacity, buffer->maximum);
}

keel_status keel_buffer_append(keel_buffer *buffer, const void *data, size_t length) {
  if (length > buffer->maximum - buffer->length) return KEEL_ERANGE;
  /* One spare byte keeps text NUL-terminated without counting it in the length; it lies
   * beyond the maximum so that a buffer can hold exactly maximum bytes. */
  size_t limit = buffer->maximum == SIZE_MAX ? SIZE_MAX : buffer->maximum + 1;
  if (buffer->length + length == SIZE_MAX) return KEEL_ERANGE;
  keel_status status = buffer_grow(buffer, buffer->length + length + 1, limit);
  if (status != KEEL_OK) return status;
  if (length > 0) memcpy(buffer->data + buffer->length, data, length);
  buffer->length += length;
  buffer->data[buffer->length] = '\0';
  return KEEL_OK;
}

keel_status keel_buffer_appendf(keel_buffer *buffer, const char *format, ...) {
  va_list arguments;
  va_start(arguments, format);
  char small[256];
  int needed = vsnprintf(small, sizeof small, format, arguments);
  va_end(arguments);
  if (needed < 0) return KEEL_EINVAL;
  if ((size_t)needed < sizeof small) return keel_buffer_append(buffer, small, (size_t)needed);
  char *large = malloc((size_t)needed + 1);
  if (large == NULL) return KEEL_ENOMEM;
  va_start(arguments, format);
  vsnprintf(large, (size_t)needed + 1, format, arguments);
  va_end(arguments);
  keel_status status = keel_buffer_append(buffer, large, (size_t)needed);
  free(large);
  return status;
}

void keel_buffer_reset(keel_buffer *buffer) { buffer->length = 0; }

void keel_buffer_free(keel_buffer *buffer) {
  free(buffer->data);
  keel_buffer_init(buffer, buffer->maximum);
}

void keel_hex_encode(const uint8_t *bytes, size_t length, char *text) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < length; i++) {
    text[2 * i] = digits[bytes[i] >> 4];
    text[2 * i + 1] = digits[bytes[i] & 15];
  }
  text[2 * length] = '\0';
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

keel_status keel_hex_decode(const char *text, uint8_t *bytes, size_t length) {
  if (text == NULL || strlen(text) != 2 * length) return KEEL_EINVAL;
  for (size_t i = 0; i < length; i++) {
    int high = hex_value(text[2 * i]);
    int low = hex_value(text[2 * i + 1]);
    if (high < 0 || low < 0) return KEEL_EINVAL;
    bytes[i] = (uint8_t)(high << 4 | low);
  }
  return KEEL_OK;
}
