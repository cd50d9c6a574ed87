/* Folders made the way `mkdir -p` makes them: every missing folder of a path in turn, so a
 * checkpoint or job folder can be named anywhere without the caller preparing its parents. */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>

#include "keel/core.h"

keel_status keel_directory_make(const char *path, unsigned mode) {
  char partial[PATH_MAX];
  size_t length = path ? strlen(path) : 0;
  if (length == 0 || length >= sizeof partial) return KEEL_EINVAL;
  memcpy(partial, path, length + 1);
  /* Each '/' after the first character ends a parent; the whole path comes last. */
  for (size_t i = 1; i <= length; i++) {
    if (partial[i] != '/' && partial[i] != '\0') continue;
    char kept = partial[i];
    partial[i] = '\0';
    bool made = mkdir(partial, (mode_t)mode) == 0 || errno == EEXIST;
    int error = errno;
    partial[i] = kept;
    if (!made) return keel_status_from_errno(error);
  }
  return KEEL_OK;
}
