/* The seeds of a fuzz target whose inputs are text: copies seed index of the count given
 * into buffer; its length, or 0 past the last one (or when it does not fit). */
#ifndef KEEL_FUZZ_SEED_H
#define KEEL_FUZZ_SEED_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline size_t keel_fuzz_text_seed(const char *const *seeds, size_t count, int index,
                                         uint8_t *buffer, size_t capacity) {
  if (index < 0 || (size_t)index >= count) return 0;
  size_t length = strlen(seeds[index]);
  if (length > capacity) return 0;
  memcpy(buffer, seeds[index], length);
  return length;
}

#endif
