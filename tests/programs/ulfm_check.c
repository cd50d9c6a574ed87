/* Conformance of the comm layer's ULFM calls under `keel run`: every process joins with
 * keel_init and makes the calls on keel_world(ctx) itself (not through the runtime's steps),
 * while KEEL_FAULT kills members just before the call (the user point "before_ulfm"), in the
 * agreement before their vote ("agree") or right after it ("voted"). --scenario picks:
 *   agree   two keel_comm_agree in a row (in the second, nobody killed in the first votes);
 *   shrink  keel_comm_shrink and an allreduce on the result, shrinking again (ULFM's loop)
 *           while that fails with KEEL_EPROCFAILED;
 *   grow    the members wait for a spare's or joiner's offer in the store and call
 *           keel_comm_grow; the newcomer comes in through keel_start; all then allreduce;
 *   revoke  rank --root revokes while the others block in a broadcast from it and in a
 *           receive; every later operation must fail as well; then agree and shrink.
 * Each process that comes through prints one line, which the test compares across the
 * survivors:
 *   ulfm scenario=S uid=U rank=R status=NAME flags=0xXXXXXXXX failed=LIST size=N epoch=E
 *        members=LIST collective=NAME transport=NAME result=N detected=NAME setup=NAME
 *        revoked=LIST second=0xXXXXXXXX:LIST rounds=N
 * ("-" where a field does not apply; rank, size, epoch and members describe the communicator
 * the scenario ends on; second is the second agreement, rounds the shrinks it took). Every
 * uid agrees with input ~(1 << uid), so the bits cleared in the flags name exactly the
 * members whose vote counted; the allreduce sums 1 << uid, so its result names the members
 * that took part.
 *
 * Flags: --scenario NAME  --timeout-ms N (every operation's deadline, default 5000)
 *        --victim U --detect (the members other than U first run a barrier, which fails once
 *        U is dead, and only then make the call: they know of the failure as an application
 *        does)  --expect spare|joiner (grow)  --root R (revoke).
 * Exit: 0 once the line is printed (the test judges it), 1 if it could not be, 2 for a bad
 * flag or a failed keel_init. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "keel/keel.h"

#define FAULT_POINT "before_ulfm"
/* Tags of the revoke scenario's point-to-point messages. */
#define TAG_READY 0x7265616479u
#define TAG_NEVER 0x6e65766572u
#define MAX_SHRINKS 3

typedef struct options {
  const char *scenario;
  int64_t timeout_ns;
  int64_t victim; /* -1: none */
  bool detect;
  const char *expect; /* grow: "spare" or "joiner" */
  int64_t root;
} options;

/* What a scenario ends with: the fields of the line. */
typedef struct outcome {
  keel_status status;
  bool has_flags;
  uint32_t flags;
  bool has_failed;
  uint32_t failed[KEEL_MAX_WORLD];
  size_t failed_count;
  keel_comm *comm; /* the communicator the scenario ends on */
  bool has_collective;
  keel_status collective;
  int64_t result;
  bool has_detected;
  keel_status detected;
  bool has_setup;
  keel_status setup;
  char revoked[512];
  /* agree: a second agreement on the same communicator, after the first. */
  bool has_second;
  keel_status second_status;
  uint32_t second_flags;
  uint32_t second_failed[KEEL_MAX_WORLD];
  size_t second_failed_count;
  int rounds; /* shrink: the shrinks it took until a collective succeeded (0: not counted) */
} outcome;

static int parse_options(int argc, char **argv, options *opts) {
  *opts = (options){.timeout_ns = 5 * (int64_t)1000000000, .victim = -1};
  static const struct option long_options[] = {{"scenario", required_argument, 0, 's'},
                                               {"timeout-ms", required_argument, 0, 't'},
                                               {"victim", required_argument, 0, 'v'},
                                               {"detect", no_argument, 0, 'd'},
                                               {"expect", required_argument, 0, 'e'},
                                               {"root", required_argument, 0, 'r'},
                                               {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    int64_t value = 0;
    if (option == 's' || option == 'e' || option == 'd') {
      if (option == 's') opts->scenario = optarg;
      if (option == 'e') opts->expect = optarg;
      if (option == 'd') opts->detect = true;
      continue;
    }
    if (option == '?' || keel_parse_int(optarg, 0, 1 << 30, &value) != KEEL_OK) {
      fprintf(stderr, "ulfm_check: bad flag (see the file's header)\n");
      return -1;
    }
    if (option == 't') opts->timeout_ns = value * 1000000;
    if (option == 'v') opts->victim = value;
    if (option == 'r') opts->root = value;
  }
  if (opts->scenario == NULL) {
    fprintf(stderr, "ulfm_check: --scenario is required\n");
    return -1;
  }
  if (strcmp(opts->scenario, "grow") == 0 &&
      (opts->expect == NULL ||
       (strcmp(opts->expect, "spare") != 0 && strcmp(opts->expect, "joiner") != 0))) {
    fprintf(stderr, "ulfm_check: grow needs --expect spare or --expect joiner\n");
    return -1;
  }
  return 0;
}

/* The input of uid to every agreement: all bits but its own. */
static uint32_t input_flags(uint32_t uid) { return ~(UINT32_C(1) << (uid % 32)); }

static uint32_t own_uid(void) {
  int64_t uid = 0;
  keel_env_int("KEEL_UID", 0, KEEL_MAX_UIDS - 1, &uid);
  return (uint32_t)uid;
}

/* ---- pieces the scenarios share */

/* An allreduce of 1 << uid on comm: its sum names the members that took part. */
static void collective_on(keel_comm *comm, uint32_t uid, outcome *out) {
  int64_t mine = (int64_t)1 << (uid % 62), sum = 0;
  out->has_collective = true;
  out->collective = keel_comm_allreduce(comm, &mine, &sum, 1, KEEL_I64, KEEL_SUM);
  out->result = out->collective == KEEL_OK ? sum : -1;
}

/* --detect: a barrier that the victim never joins. It must fail, with KEEL_EPROCFAILED, once
 * the victim's link breaks: the caller then knows of the failure before its ULFM call. */
static void detect_failure(keel_comm *comm, const options *opts, uint32_t uid, outcome *out) {
  if (!opts->detect || opts->victim < 0 || uid == (uint32_t)opts->victim) return;
  out->has_detected = true;
  out->detected = keel_comm_barrier(comm);
}

/* Appends "what:STATUS" to the revoke scenario's list. */
static void revoked_add(outcome *out, const char *what, keel_status status) {
  size_t used = strlen(out->revoked);
  snprintf(out->revoked + used, sizeof out->revoked - used, "%s%s:%s", used ? "," : "", what,
           keel_status_name(status));
}

static keel_status first_failure(keel_status current, keel_status next) {
  return current != KEEL_OK ? current : next;
}

/* ---- the scenarios */

/* Two agreements in a row. A member killed right after its vote of the first may have been
 * counted by it (its death was not seen yet when the others decided); the second is where
 * it cannot vote, so every survivor must report it there. */
static void run_agree(keel_ctx *ctx, const options *opts, uint32_t uid, outcome *out) {
  keel_comm *comm = keel_world(ctx);
  keel_fault_point(ctx, FAULT_POINT);
  detect_failure(comm, opts, uid, out);
  out->flags = input_flags(uid);
  out->status = keel_comm_agree(comm, &out->flags, out->failed, KEEL_MAX_WORLD, &out->failed_count);
  out->has_flags = out->has_failed = out->status == KEEL_OK;
  out->comm = comm;
  if (out->status != KEEL_OK) return;
  out->has_second = true;
  out->second_flags = input_flags(uid);
  out->second_status = keel_comm_agree(comm, &out->second_flags, out->second_failed, KEEL_MAX_WORLD,
                                       &out->second_failed_count);
}

/* Shrinks until a collective on the result succeeds (ULFM's loop, MAX_SHRINKS at most): a
 * member that died after its vote may be in the first shrunk communicator, whose collective
 * then fails at every survivor, and the next shrink leaves it out. */
static void run_shrink(keel_ctx *ctx, const options *opts, uint32_t uid, outcome *out) {
  keel_comm *comm = keel_world(ctx);
  keel_fault_point(ctx, FAULT_POINT);
  detect_failure(comm, opts, uid, out);
  for (int round = 1; round <= MAX_SHRINKS; round++) {
    keel_comm *shrunk = NULL;
    out->rounds = round;
    out->status = keel_comm_shrink(comm, &shrunk);
    if (out->status != KEEL_OK) return;
    keel_comm_set_timeout(shrunk, opts->timeout_ns);
    out->comm = comm = shrunk;
    collective_on(shrunk, uid, out);
    if (out->collective != KEEL_EPROCFAILED) return;
  }
}

/* The state a newcomer "receives": none is registered, so a tier that restores nothing is a
 * complete restore. Without it keel_start would find no source for the (empty) state. */
static keel_status restore_nothing(void *context, keel_registry *registry, uint32_t index,
                                   uint32_t count, uint64_t step) {
  return keel_registry_count(registry) == 0 ? KEEL_OK : KEEL_ENOTFOUND;
}

static const keel_state_source_ops empty_source = {.name = "empty", .restore = restore_nothing};

/* Waits until a key under prefix ("spare/", "join/") is in the job's store, through a store
 * handle of this process's own, by deadline. A grow decided before the offer is there
 * would not admit it. */
static keel_status wait_for_offer(uint32_t uid, const char *prefix, int64_t deadline_ns) {
  keel_auth auth;
  keel_status status = keel_auth_from_env(&auth);
  if (status != KEEL_OK) return status;
  auth.local_id = uid;
  const char *address = getenv("KEEL_STORE");
  if (address == NULL) return KEEL_EINVAL;
  keel_store *store = NULL;
  status = keel_store_connect(address, &auth, deadline_ns, &store);
  if (status != KEEL_OK) return status;
  for (;;) {
    keel_store_entry *entries = NULL;
    size_t count = 0;
    uint64_t revision = 0;
    status = keel_store_list(store, prefix, &entries, &count, &revision);
    if (status != KEEL_OK) break;
    keel_store_entries_free(entries, count);
    if (count > 0) break;
    status = keel_store_wait(store, prefix, revision, deadline_ns, NULL);
    if (status != KEEL_OK) break;
  }
  keel_store_close(store);
  return status;
}

static void run_grow(keel_ctx *ctx, const options *opts, uint32_t uid, outcome *out) {
  keel_comm *comm = keel_world(ctx);
  if (comm == NULL) {
    /* A spare or a joiner: keel_start waits until a rebuild admits it. */
    out->status = keel_state_source_add(ctx, &empty_source, NULL);
    if (out->status == KEEL_OK) out->status = keel_start(ctx);
    comm = keel_world(ctx);
    if (out->status != KEEL_OK || comm == NULL) return;
  } else {
    keel_fault_point(ctx, FAULT_POINT);
    bool spare = strcmp(opts->expect, "spare") == 0;
    out->has_setup = true;
    out->setup = wait_for_offer(uid, spare ? "spare/" : "join/",
                                keel_deadline_after_ns(2 * opts->timeout_ns));
    keel_comm *grown = NULL;
    out->status = keel_comm_grow(comm, &grown);
    if (out->status != KEEL_OK) return;
    comm = grown;
  }
  keel_comm_set_timeout(comm, opts->timeout_ns);
  out->comm = comm;
  collective_on(comm, uid, out);
}

/* Rank root revokes while every other rank is blocked: in a broadcast from root (which never
 * comes) and in a receive posted before it told root it was ready. */
static void run_revoke(keel_ctx *ctx, const options *opts, uint32_t uid, outcome *out) {
  keel_comm *comm = keel_world(ctx);
  int rank = keel_comm_rank(comm), size = keel_comm_size(comm);
  int root = (int)(opts->root % size);
  int64_t deadline = keel_deadline_after_ns(opts->timeout_ns);
  out->has_setup = true;
  /* The epoch's transport is chosen by its first collective: settled now, the broadcast
   * below blocks inside the transport itself. */
  int64_t zero = 0, sum = 0;
  out->setup = keel_comm_allreduce(comm, &zero, &sum, 1, KEEL_I64, KEEL_SUM);
  uint8_t never[8], ready = 1, payload[64] = {0};
  keel_request *pending = NULL;
  keel_status posted = keel_comm_irecv(comm, rank == root ? (root + 1) % size : root, TAG_NEVER,
                                       never, sizeof never, &pending);
  out->setup = first_failure(out->setup, posted);
  keel_status broadcast = KEEL_OK;
  if (rank == root) {
    for (int other = 0; other < size; other++) {
      if (other != root)
        out->setup = first_failure(out->setup, keel_comm_recv(comm, other, TAG_READY, &ready, 1));
    }
    out->setup = first_failure(out->setup, keel_comm_revoke(comm));
    broadcast = keel_comm_broadcast(comm, payload, sizeof payload, root);
  } else {
    out->setup = first_failure(out->setup, keel_comm_send(comm, root, TAG_READY, &ready, 1));
    broadcast = keel_comm_broadcast(comm, payload, sizeof payload, root);
  }
  revoked_add(out, "broadcast", broadcast);
  revoked_add(out, "request", posted == KEEL_OK ? keel_request_wait(pending, deadline) : posted);
  keel_request_free(pending);
  /* Every later operation on the revoked epoch. */
  int64_t buffer[KEEL_MAX_WORLD] = {0};
  revoked_add(out, "allreduce", keel_comm_allreduce(comm, &zero, &sum, 1, KEEL_I64, KEEL_SUM));
  revoked_add(out, "allgather", keel_comm_allgather(comm, &zero, buffer, sizeof zero));
  revoked_add(out, "reduce_scatter",
              keel_comm_reduce_scatter(comm, buffer, &sum, 1, KEEL_I64, KEEL_SUM));
  revoked_add(out, "barrier", keel_comm_barrier(comm));
  revoked_add(out, "send", keel_comm_send(comm, (rank + 1) % size, TAG_READY, &ready, 1));
  keel_request *late = NULL;
  keel_status late_status =
      keel_comm_irecv(comm, (rank + 1) % size, TAG_NEVER, never, sizeof never, &late);
  keel_request_free(late);
  revoked_add(out, "irecv", late_status);
  revoked_add(out, "health", keel_comm_health(comm));
  /* Revoking again is allowed (idempotent) and changes nothing. */
  out->setup = first_failure(out->setup, keel_comm_revoke(comm));
  /* Agreement and shrink work on a revoked communicator. */
  out->flags = input_flags(uid);
  keel_status agreed =
      keel_comm_agree(comm, &out->flags, out->failed, KEEL_MAX_WORLD, &out->failed_count);
  out->has_flags = out->has_failed = agreed == KEEL_OK;
  out->setup = first_failure(out->setup, agreed);
  keel_comm *shrunk = NULL;
  out->status = keel_comm_shrink(comm, &shrunk);
  if (out->status != KEEL_OK) return;
  keel_comm_set_timeout(shrunk, opts->timeout_ns);
  out->comm = shrunk;
  collective_on(shrunk, uid, out);
}

/* ---- the line */

static void uid_list(char *text, size_t capacity, const uint32_t *uids, size_t count) {
  size_t used = 0;
  text[0] = '\0';
  for (size_t i = 0; i < count && used < capacity; i++) {
    int written = snprintf(text + used, capacity - used, i ? ",%" PRIu32 : "%" PRIu32, uids[i]);
    used += written > 0 ? (size_t)written : 0;
  }
  if (count == 0) snprintf(text, capacity, "none");
}

/* One write of the whole line: every process appends to the same output file. */
static bool print_line(const options *opts, uint32_t uid, const outcome *out) {
  char flags[16] = "-", failed[256] = "-", members[256] = "-", result[32] = "-";
  int rank = -1, size = -1;
  char epoch[32] = "-";
  if (out->has_flags) snprintf(flags, sizeof flags, "0x%08" PRIx32, out->flags);
  if (out->has_failed) uid_list(failed, sizeof failed, out->failed, out->failed_count);
  if (out->comm != NULL) {
    rank = keel_comm_rank(out->comm);
    size = keel_comm_size(out->comm);
    snprintf(epoch, sizeof epoch, "%" PRIu64, keel_comm_epoch(out->comm));
    uint32_t uids[KEEL_MAX_WORLD];
    for (int r = 0; r < size && r < KEEL_MAX_WORLD; r++) uids[r] = keel_comm_uid(out->comm, r);
    uid_list(members, sizeof members, uids,
             (size_t)(size < KEEL_MAX_WORLD ? size : KEEL_MAX_WORLD));
  }
  if (out->has_collective && out->collective == KEEL_OK)
    snprintf(result, sizeof result, "%" PRId64, out->result);
  char second[300] = "-", rounds[16] = "-";
  if (out->has_second && out->second_status == KEEL_OK) {
    int written = snprintf(second, sizeof second, "0x%08" PRIx32 ":", out->second_flags);
    if (written > 0 && (size_t)written < sizeof second)
      uid_list(second + written, sizeof second - (size_t)written, out->second_failed,
               out->second_failed_count);
  } else if (out->has_second) {
    snprintf(second, sizeof second, "%s", keel_status_name(out->second_status));
  }
  if (out->rounds > 0) snprintf(rounds, sizeof rounds, "%d", out->rounds);
  char line[2048];
  int length =
      snprintf(line, sizeof line,
               "ulfm scenario=%s uid=%" PRIu32
               " rank=%d status=%s flags=%s failed=%s size=%d epoch=%s "
               "members=%s collective=%s transport=%s result=%s detected=%s setup=%s revoked=%s "
               "second=%s rounds=%s\n",
               opts->scenario, uid, rank, keel_status_name(out->status), flags, failed, size, epoch,
               members, out->has_collective ? keel_status_name(out->collective) : "-",
               out->has_collective ? keel_comm_transport(out->comm) : "-", result,
               out->has_detected ? keel_status_name(out->detected) : "-",
               out->has_setup ? keel_status_name(out->setup) : "-",
               out->revoked[0] ? out->revoked : "-", second, rounds);
  if (length <= 0 || (size_t)length >= sizeof line) return false;
  return write(STDOUT_FILENO, line, (size_t)length) == (ssize_t)length;
}

int main(int argc, char **argv) {
  options opts;
  if (parse_options(argc, argv, &opts) != 0) return 2;
  keel_ctx *ctx = NULL;
  keel_status status = keel_init(&ctx);
  if (status != KEEL_OK) {
    fprintf(stderr, "ulfm_check: keel_init: %s\n", keel_strerror(status));
    return 2;
  }
  uint32_t uid = own_uid();
  /* Short deadlines: a case that breaks fails in seconds rather than hanging. */
  if (keel_world(ctx) != NULL) keel_comm_set_timeout(keel_world(ctx), opts.timeout_ns);
  outcome out = {.status = KEEL_EINVAL};
  if (strcmp(opts.scenario, "agree") == 0) {
    run_agree(ctx, &opts, uid, &out);
  } else if (strcmp(opts.scenario, "shrink") == 0) {
    run_shrink(ctx, &opts, uid, &out);
  } else if (strcmp(opts.scenario, "grow") == 0) {
    run_grow(ctx, &opts, uid, &out);
  } else if (strcmp(opts.scenario, "revoke") == 0) {
    run_revoke(ctx, &opts, uid, &out);
  } else {
    fprintf(stderr, "ulfm_check: unknown scenario %s\n", opts.scenario);
    keel_finalize(ctx);
    return 2;
  }
  /* A spare or joiner that the job finished without admitting has nothing to say. */
  bool printed = out.status == KEEL_EJOBDONE || print_line(&opts, uid, &out);
  keel_finalize(ctx);
  return printed ? 0 : 1;
}
