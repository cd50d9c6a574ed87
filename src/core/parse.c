/* Parsing of human-typed values (durations, sizes, integers) from flags and KEEL_*
 * variables. Whole strings only: "5sx" is an error, never 5 seconds. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "keel/core.h"

typedef struct unit_scale {
  const char *suffix;
  double scale;
} unit_scale;

/* strtod and strtoll skip leading spaces and take signs, "inf" and hex ("0x10"), none of
 * which a person typing a flag means; only plain decimal text may reach them. */
static bool starts_plain_decimal(const char *text, bool sign_allowed) {
  if (sign_allowed && (*text == '-' || *text == '+')) text++;
  if (text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) return false;
  return (*text >= '0' && *text <= '9') || (*text == '.' && text[1] >= '0' && text[1] <= '9');
}

/* Splits text into a finite non-negative number and a suffix that must be in units. */
static keel_status parse_scaled(const char *text, const unit_scale *units, size_t unit_count,
                                double bare_scale, double *value_p) {
  if (text == NULL || !starts_plain_decimal(text, false)) return KEEL_EINVAL;
  errno = 0;
  char *end = NULL;
  double number = strtod(text, &end);
  if (end == text || errno != 0 || !isfinite(number) || number < 0) return KEEL_EINVAL;
  if (*end == '\0') {
    *value_p = number * bare_scale;
    return KEEL_OK;
  }
  for (size_t i = 0; i < unit_count; i++) {
    if (strcmp(end, units[i].suffix) == 0) {
      *value_p = number * units[i].scale;
      return KEEL_OK;
    }
  }
  return KEEL_EINVAL;
}

keel_status keel_parse_duration_ns(const char *text, int64_t *duration_ns_p) {
  static const unit_scale units[] = {{"ns", 1},     {"us", 1e3},  {"ms", 1e6}, {"s", 1e9},
                                     {"m", 60e9},   {"min", 60e9}, {"h", 3600e9}};
  double value;
  if (parse_scaled(text, units, sizeof units / sizeof units[0], 1e9, &value) != KEEL_OK)
    return KEEL_EINVAL;
  if (value >= 9.2e18) return KEEL_EINVAL;
  *duration_ns_p = (int64_t)llround(value);
  return KEEL_OK;
}

keel_status keel_parse_size(const char *text, uint64_t *size_p) {
  static const unit_scale units[] = {
      {"B", 1},         {"k", 1e3},        {"K", 1e3},         {"M", 1e6},
      {"G", 1e9},       {"KiB", 1024.0},   {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"KB", 1e3},      {"MB", 1e6},       {"GB", 1e9}};
  double value;
  if (parse_scaled(text, units, sizeof units / sizeof units[0], 1, &value) != KEEL_OK)
    return KEEL_EINVAL;
  if (value >= 1.8e19 || value != floor(value)) return KEEL_EINVAL;
  *size_p = (uint64_t)value;
  return KEEL_OK;
}

keel_status keel_parse_int(const char *text, int64_t minimum, int64_t maximum, int64_t *value_p) {
  if (text == NULL || !starts_plain_decimal(text, true)) return KEEL_EINVAL;
  errno = 0;
  char *end = NULL;
  long long number = strtoll(text, &end, 10);
  if (*end != '\0' || errno != 0 || number < minimum || number > maximum) return KEEL_EINVAL;
  *value_p = number;
  return KEEL_OK;
}

keel_status keel_env_duration_ns(const char *name, int64_t *duration_ns_p) {
  const char *text = getenv(name);
  if (text == NULL) return KEEL_OK;
  if (keel_parse_duration_ns(text, duration_ns_p) == KEEL_OK) return KEEL_OK;
  KEEL_LOG_E("config", "%s=%s is not a duration (examples: 250ms, 2s)", name, text);
  return KEEL_EINVAL;
}

keel_status keel_env_int(const char *name, int64_t minimum, int64_t maximum, int64_t *value_p) {
  const char *text = getenv(name);
  if (text == NULL) return KEEL_OK;
  if (keel_parse_int(text, minimum, maximum, value_p) == KEEL_OK) return KEEL_OK;
  KEEL_LOG_E("config", "%s=%s is not an integer in [%lld, %lld]", name, text,
             (long long)minimum, (long long)maximum);
  return KEEL_EINVAL;
}
