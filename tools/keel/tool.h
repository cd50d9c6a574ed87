/* Private interface between the files of the `keel` command: the subcommands, the job
 * files that let `inject`, `ps` and `join` find a running launcher, the parser of proc/
 * values (docs/RUNTIME.md) and the JSON line readers that several commands share. Nothing
 * here is part of libkeel. */
#ifndef KEEL_TOOL_H
#define KEEL_TOOL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
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
int keel__command_status(int argc, char **argv);
int keel__command_join(int argc, char **argv);
int keel__command_report(int argc, char **argv);
int keel__command_server(int argc, char **argv);
int keel__command_chaos(int argc, char **argv);

/* ---- job files: /tmp/keel-<unix uid>/<job id>.job (directory 0700, file 0600), one per
 * running launcher, holding what a tool needs to join the job's store. */
typedef struct keel__job_info {
  char store[512]; /* host:port, or etcd://... */
  keel_auth auth;  /* job id and token; local_id left 0 */
  pid_t launcher_pid;
} keel__job_info;

/* Writes the job file of info (creating the directory if needed) and its path into
 * path (capacity bytes). Refuses a directory that another user owns or others can read. */
keel_status keel__job_file_write(const keel__job_info *info, char *path, size_t capacity);
/* Reads the job file of job_id (decimal text), or with job_id NULL the newest one whose
 * launcher is still alive. KEEL_ENOTFOUND (with a message on stderr) when there is none. */
keel_status keel__job_file_find(const char *job_id, keel__job_info *info_p);
/* Parses a job file's text (length bytes; no NUL inside, at most 1 KiB): its store, job id,
 * token and launcher pid lines, each required. KEEL_ECORRUPT for anything else; *info_p is
 * written only on success. */
keel_status keel__job_file_parse(const char *text, size_t length, keel__job_info *info_p);
/* Reads the job file written by the launcher of pid launcher_pid (`keel chaos` knows the
 * launcher it started, not its job id). KEEL_ENOTFOUND, silently, while there is none. */
keel_status keel__job_file_of_launcher(pid_t launcher_pid, keel__job_info *info_p);
/* Finds the job (job_id NULL: the newest running one) and connects to its store as the
 * tool; says why on stderr when it cannot. The caller closes *store_p. */
keel_status keel__job_connect(const char *job_id, keel__job_info *job_p, keel_store **store_p);
/* Reads "--job ID" / "--job=ID" at argv[*index] (moving *index past a separate value);
 * true if it was that flag. *bad_p is set when the value is missing. */
bool keel__job_flag(int argc, char **argv, int *index, const char **job_p, bool *bad_p);

/* ---- requests to a running launcher (docs/RUNTIME.md): `keel join` puts
 * request/join/<id> = "count=K"; the launcher deletes it once the joiners are started, or
 * rewrites it to "refused=<why>" for the tool to read and delete. */
#define KEEL__JOIN_REQUEST_PREFIX "request/join/"
#define KEEL__JOIN_REFUSED "refused="

/* ---- server/<index> values, put by `keel run --servers` for each parameter server it
 * starts: "pid=<pid> uid=<uid> status=running", rewritten when it is reaped with its exit
 * code or signal name (as in dead/<uid>) in place of running. Not under proc/: a server is
 * no member of any communicator. */
#define KEEL__SERVER_PREFIX "server/"
#define KEEL__SERVER_RUNNING "running"

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
/* ---- node/<i> values, put by each node's agent under its lease:
 * "pid=<agent pid> pgid=<its group> role=worker|spare group=0|1 addr=<address>"; group=1 when
 * the node's processes are all in the agent's group (agents of one host). */
typedef struct keel__node_value {
  pid_t pid;
  pid_t pgid;
  bool own_group;
  char role[16];
  char addr[80];
} keel__node_value;

/* pid, pgid and group are required, unknown fields are ignored. */
keel_status keel__node_value_parse(const char *text, keel__node_value *value_p);
/* Calls visit for each proc/ entry of node (its value parsed) and counts those for which it
 * returns true; 0 when the store cannot be listed. */
size_t keel__node_processes_visit(keel_store *store, int64_t node,
                                  bool (*visit)(keel_store *store, const keel_store_entry *entry,
                                                const keel__proc_value *value, void *context),
                                  void *context);
/* Whether key is in the store now (false too when the store cannot say). */
bool keel__store_has(keel_store *store, const char *key);
/* The uid in key "<prefix><uid>" (decimal, nothing after it); KEEL_EINVAL otherwise. */
keel_status keel__uid_from_key(const char *key, const char *prefix, uint32_t *uid_p);

/* ---- one-line JSON objects (status lines, events files), parsed with jansson. json_t is
 * named by its struct tag so that only the files that read JSON include <jansson.h>, whose
 * json_* names would clash with the writers of model.c. */
struct json_t;
/* The object that line (length bytes, no NUL needed) holds, or NULL when it is not exactly
 * one JSON object with nothing before or after it. The caller json_decref()s it. */
struct json_t *keel__json_object_parse(const char *line, size_t length);
/* Members of object: true and *value_p set when key is there with the right type, false
 * and *value_p untouched otherwise. An integer must be written as one (12.0 is not); a
 * double is any finite number. */
bool keel__json_int(const struct json_t *object, const char *key, int64_t *value_p);
/* The integer member key of object, or fallback when it is missing or not an integer. */
int64_t keel__json_int_or(const struct json_t *object, const char *key, int64_t fallback);
bool keel__json_double(const struct json_t *object, const char *key, double *value_p);
/* A string member into text (capacity >= 1), truncated to fit. */
bool keel__json_string(const struct json_t *object, const char *key, char *text, size_t capacity);
/* The leading integers of an array member, at most capacity of them; how many it stored
 * (0 for a missing member or one that is no array). */
size_t keel__json_int_array(const struct json_t *object, const char *key, int64_t *values,
                            size_t capacity);
/* Writes text as the inside of a JSON string (quotes, backslashes and control characters
 * escaped), truncated to fit capacity. */
void keel__json_escape(const char *text, char *escaped, size_t capacity);

#endif
