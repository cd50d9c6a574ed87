/* Logging to stderr, one write(2) per line so that lines of several processes sharing a
 * terminal or a file do not interleave. The level is read once from KEEL_LOG. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "keel/core.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_threshold = KEEL_LOG_WARN; /* -1: KEEL_LOG=off, nothing at all */
/* Process-wide by nature (stderr is); set once at start-up by keel_init or a tool. */
static char log_identity[48] = "keel";

static void log_read_level(void) {
  const char *text = getenv("KEEL_LOG");
  if (text == NULL) return;
  if (strcmp(text, "off") == 0) log_threshold = -1;
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int level = 0; level < 4; level++) {
    if (strcmp(text, names[level]) == 0) log_threshold = level;
  }
}

bool keel_log_enabled(keel_log_level level) {
  pthread_once(&log_once, log_read_level);
  return (int)level <= log_threshold;
}

void keel_log_set_identity(const char *identity) {
  snprintf(log_identity, sizeof log_identity, "%s", identity);
}

void keel_log(keel_log_level level, const char *module, const char *format, ...) {
  if (!keel_log_enabled(level)) return;
  static const char *const level_names[] = {"error", "warn", "info", "debug"};
  char line[1024];
  int64_t now_ms = keel_now_ns() / 1000000;
  int used = snprintf(line, sizeof line, "[%lld.%03lld %s %s %s] ", (long long)(now_ms / 1000),
                      (long long)(now_ms % 1000), log_identity, level_names[level], module);
  if (used < 0) return;
  if ((size_t)used < sizeof line) {
    va_list arguments;
    va_start(arguments, format);
    int more = vsnprintf(line + used, sizeof line - (size_t)used, format, arguments);
    va_end(arguments);
    if (more > 0) used += more;
  }
  if ((size_t)used >= sizeof line - 1) used = (int)sizeof line - 2;
  line[used++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, (size_t)used);
  (void)ignored;
}
