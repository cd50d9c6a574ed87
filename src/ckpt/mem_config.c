/* The settings of in-memory checkpoints (`--ckpt mem:SETTINGS`, KEEL_CKPT_MEM), read the
 * same way by the launcher, its agents and the workers. Apart from mem.c so that the
 * launcher reads them without the worker's runtime. */
#include <stdio.h>
#include <string.h>

#include "ckpt/mem_internal.h"

static keel_status config_key(const char *key, const char *value, keel_ckpt_mem_config *config) {
  int64_t number = 0;
  if (strcmp(key, "replicas") == 0 && keel_parse_int(value, 1, 8, &number) == KEEL_OK) {
    config->replicas = (uint32_t)number;
  } else if (strcmp(key, "every") == 0 &&
             keel_parse_int(value, 1, INT64_C(1) << 40, &number) == KEEL_OK) {
    config->every_steps = (uint64_t)number;
  } else if (strcmp(key, "profile") == 0 && keel_parse_int(value, 0, 10000, &number) == KEEL_OK) {
    config->profile_steps = (uint32_t)number;
  } else if (strcmp(key, "buffers") == 0 && keel_parse_int(value, 0, 64, &number) == KEEL_OK) {
    config->buffers = (uint32_t)number;
  } else if (strcmp(key, "chunk") == 0 && keel_parse_size(value, &config->chunk_bytes) == KEEL_OK &&
             config->chunk_bytes >= 4096 && config->chunk_bytes <= KEEL_CKPT_MAX_CHUNK_BYTES) {
  } else {
    return KEEL_EINVAL;
  }
  return KEEL_OK;
}

keel_status keel_ckpt_mem_config_parse(const char *text, keel_ckpt_mem_config *config_p,
                                       char *error, size_t error_bytes) {
  keel_ckpt_mem_config config = {.replicas = 2, .every_steps = 1, .buffers = 4, .profile_steps = 10,
                                 .chunk_bytes = KEEL_CKPT_DEFAULT_CHUNK_BYTES};
  char copy[256];
  if (text == NULL || strlen(text) >= sizeof copy) {
    snprintf(error, error_bytes, "the in-memory checkpoint settings are missing or too long");
    return KEEL_EINVAL;
  }
  snprintf(copy, sizeof copy, "%s", text);
  char *cursor = copy, *item;
  while ((item = strsep(&cursor, ",")) != NULL) {
    if (*item == '\0') continue;
    if (strcmp(item, "blocking") == 0) {
      config.blocking = true;
      continue;
    }
    char *equals = strchr(item, '=');
    if (equals != NULL) *equals = '\0';
    if (equals == NULL || config_key(item, equals + 1, &config) != KEEL_OK) {
      snprintf(error, error_bytes,
               "'%s%s%s' is not one of replicas=1..8, every=N, buffers=0..64, "
               "chunk=SIZE (4KiB..1GiB), profile=0..10000 steps, blocking",
               item, equals ? "=" : "", equals ? equals + 1 : "");
      return KEEL_EINVAL;
    }
  }
  *config_p = config;
  return KEEL_OK;
}

