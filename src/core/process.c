/* What /proc says of a process: its state and its parent. The launcher uses it to tell a
 * stopped process from a running one and to check that a pid is still its own child before
 * it signals it (pids are recycled); the recovery benchmark does the same. */
#include <stdio.h>
#include <string.h>

#include "keel/core.h"

keel_status keel_process_stat(int pid, char *state_p, int *parent_p) {
  char path[64], text[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *file = fopen(path, "re");
  if (file == NULL) return KEEL_ENOTFOUND;
  size_t length = fread(text, 1, sizeof text - 1, file);
  fclose(file);
  text[length] = '\0';
  /* "pid (comm) state ppid ...": comm may hold spaces and parentheses; skip to the last ')'. */
  const char *close_paren = strrchr(text, ')');
  char state;
  int parent;
  if (close_paren == NULL || sscanf(close_paren + 1, " %c %d", &state, &parent) != 2)
    return KEEL_ECORRUPT;
  *state_p = state;
  *parent_p = parent;
  return KEEL_OK;
}
