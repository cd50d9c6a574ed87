/* `keel join`: asks a running launcher to grow its job by K processes. The tool writes
 * request/join/<id> = "count=K" into the job's store and waits for the launcher's answer:
 * the key deleted (the joiners are starting) or rewritten as "refused=<why>" (the world
 * would pass --max-world), which the tool prints, deletes, and exits 2 for. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tool.h"

#define ANSWER_DEADLINE_NS (10 * INT64_C(1000000000))
#define MAX_JOIN_COUNT 4096

static const char join_usage_text[] = "usage: keel join [--job JOB_ID] [-n K]";

static int join_usage(const char *message) {
  fprintf(stderr, "keel join: %s (%s)\n", message, join_usage_text);
  return KEEL__EXIT_USAGE;
}

typedef struct join_arguments {
  const char *job_id; /* NULL: the newest running job */
  int64_t count;
} join_arguments;

/* Returns -1 when the arguments are good, else the exit code (help: 0, error: 2). */
static int join_arguments_parse(int argc, char **argv, join_arguments *arguments) {
  *arguments = (join_arguments){.count = 1};
  bool bad = false;
  for (int index = 1; index < argc; index++) {
    const char *arg = argv[index];
    if (keel__job_flag(argc, argv, &index, &arguments->job_id, &bad)) continue;
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      printf(
          "%s\n\nAsks the running job to start K more processes (default 1) that join its\n"
          "world at a step boundary; refused (exit 2) if the world would pass the job's\n"
          "--max-world.\n",
          join_usage_text);
      return 0;
    }
    if (strcmp(arg, "-n") != 0) return join_usage("unexpected argument");
    if (index + 1 >= argc) return join_usage("-n needs a count");
    if (keel_parse_int(argv[++index], 1, MAX_JOIN_COUNT, &arguments->count) != KEEL_OK)
      return join_usage("-n needs an integer from 1 to 4096");
  }
  if (bad) return join_usage("--job needs a job id");
  return -1;
}

/* Creates the request under a fresh key (create-only, so two tools never share one). */
static keel_status request_put(keel_store *store, int64_t count, char *key, size_t capacity,
                               uint64_t *revision_p) {
  char value[32];
  int length = snprintf(value, sizeof value, "count=%lld", (long long)count);
  keel_status status = KEEL_ECONFLICT;
  for (int attempt = 0; attempt < 8 && status == KEEL_ECONFLICT; attempt++) {
    snprintf(key, capacity, "%s%ld-%lld", KEEL__JOIN_REQUEST_PREFIX, (long)getpid(),
             (long long)keel_now_ns());
    status = keel_store_cas(store, key, 0, value, (size_t)length, 0, revision_p);
  }
  if (status != KEEL_OK)
    fprintf(stderr, "keel join: cannot write %s: %s\n", key, keel_strerror(status));
  return status;
}

typedef enum join_answer {
  JOIN_ACCEPTED,
  JOIN_REFUSED,
  JOIN_NO_ANSWER,
} join_answer;

/* Waits for the launcher to delete or rewrite the key; a refusal's text goes to reason. */
static join_answer answer_wait(keel_store *store, const char *key, uint64_t revision, char *reason,
                               size_t capacity) {
  int64_t deadline = keel_deadline_after_ns(ANSWER_DEADLINE_NS);
  for (;;) {
    keel_store_entry *entry = NULL;
    keel_status status = keel_store_get(store, key, &entry);
    if (status == KEEL_ENOTFOUND) return JOIN_ACCEPTED;
    if (status == KEEL_OK) {
      const char *value = (const char *)entry->value;
      bool refused = strncmp(value, KEEL__JOIN_REFUSED, strlen(KEEL__JOIN_REFUSED)) == 0;
      if (refused) snprintf(reason, capacity, "%s", value + strlen(KEEL__JOIN_REFUSED));
      revision = entry->revision;
      keel_store_entry_free(entry);
      if (refused) return JOIN_REFUSED;
    }
    if (status != KEEL_OK) {
      fprintf(stderr, "keel join: cannot read %s: %s\n", key, keel_strerror(status));
      return JOIN_NO_ANSWER;
    }
    if (keel_now_ns() >= deadline) return JOIN_NO_ANSWER;
    keel_store_wait(store, key, revision, deadline, NULL);
  }
}

int keel__command_join(int argc, char **argv) {
  join_arguments arguments;
  int exit_code = join_arguments_parse(argc, argv, &arguments);
  if (exit_code >= 0) return exit_code;
  keel__job_info job;
  keel_store *store = NULL;
  if (keel__job_connect(arguments.job_id, &job, &store) != KEEL_OK) return KEEL__EXIT_FAILURE;
  char key[128], reason[512];
  uint64_t revision = 0;
  exit_code = KEEL__EXIT_FAILURE;
  if (request_put(store, arguments.count, key, sizeof key, &revision) != KEEL_OK) goto close_store;
  switch (answer_wait(store, key, revision, reason, sizeof reason)) {
    case JOIN_ACCEPTED:
      printf("job %llu: starting %lld joiner%s; they enter the world at a step boundary\n",
             (unsigned long long)job.auth.job_id, (long long)arguments.count,
             arguments.count == 1 ? "" : "s");
      exit_code = 0;
      break;
    case JOIN_REFUSED:
      fprintf(stderr, "keel join: job %llu refused: %s\n", (unsigned long long)job.auth.job_id,
              reason);
      keel_store_delete(store, key);
      exit_code = KEEL__EXIT_USAGE;
      break;
    case JOIN_NO_ANSWER:
      /* Withdrawn, so that a launcher that wakes up later starts nothing unasked. */
      keel_store_delete(store, key);
      fprintf(stderr, "keel join: the launcher of job %llu did not answer within 10 s\n",
              (unsigned long long)job.auth.job_id);
      break;
  }
close_store:
  keel_store_close(store);
  return exit_code;
}
