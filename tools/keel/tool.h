/* Private interface between the files of the `keel` command: the subcommands, the job
 * files that let `inject` and `ps` find a running launcher, and the parser of proc/ values
 * (docs/RUNTIME.md) that the launcher and `inject` share. Nothing here is part of libkeel. */
#ifndef KEEL_TOOL_H
#define KEEL_TOOL_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "keel/store.h"

/* Exit codes of the command itself (the launcher otherwise exits with the workers'). */
#define KEEL__EXIT_FAILURE 1
#define KEEL__EXIT_USAGE 2
#define KEEL__EXIT_TIMEOUT 124
#define KEEL__EXIT_NOT_FOUND 127

/* The launcher's own uid in the store handshake: above every process uid. */
#define KEEL__LAUNCHER_ID UINT32_MAX
#define KEEL__TOOL_ID (UINT32_MAX - 1)

/* Subcommands; argv[0] is the subcommand's name. Each returns the process exit code. */
int keel__command_run(int argc, char **argv);
int keel__command_inject(int argc, char **argv);
int keel__command_ps(int argc, char **argv);

/* ---- job files: /tmp/keel-<unix uid>/<job id>.job (directory 0700, file 0600), one per
 * running launcher, holding what a tool needs to join the job's store. */
typedef struct keel__job_info {
  char store[128]; /* host:port */
  keel_auth auth;  /* job id and token; local_id left 0 */
  pid_t launcher_pid;
} keel__job_info;

/* Writes the job file of info (creating the directory if needed) and its path into
 * path (capacity bytes). Refuses a directory that another user owns or others can read. */
keel_status keel__job_file_write(const keel__job_info *info, char *path, size_t capacity);
/* Reads the job file of job_id (decimal text), or with job_id NULL the newest one whose
 * launcher is still alive. KEEL_ENOTFOUND (with a message on stderr) when there is none. */
keel_status keel__job_file_find(const char *job_id, keel__job_info *info_p);

/* ---- /proc/<pid>/stat: the process's state letter ('R', 'S', 'T' stopped, ...) and its
 * parent's pid. KEEL_ENOTFOUND when the process is gone. */
keel_status keel__process_stat(pid_t pid, char *state_p, pid_t *parent_p);

/* ---- proc/<uid> values: "pid=<pid> node=<n> role=<role> rank=<rank> epoch=<e> addr=<a>". */
typedef struct keel__proc_value {
  pid_t pid;
  int64_t node;
  char role[16];
  int64_t rank; /* -1: holds none */
  int64_t epoch;
  char addr[80];
} keel__proc_value;

/* Parses a value; pid, role, rank and epoch are required, unknown fields are ignored. */
keel_status keel__proc_value_parse(const char *text, keel__proc_value *value_p);
/* The uid in key "<prefix><uid>" (decimal, nothing after it); KEEL_EINVAL otherwise. */
keel_status keel__uid_from_key(const char *key, const char *prefix, uint32_t *uid_p);

#endif
