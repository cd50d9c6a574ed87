/* Flags of `keel run`: one table names them; each value is checked where it is read and a
 * bad one is a one-line message (the caller exits 2). Both "--flag value" and
 * "--flag=value" are accepted; the program starts after "--" or at the first non-flag. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/ec.h" /* KEEL_EC_MAX_BLOCKS */
#include "launcher.h"
#include "netns.h"

#define MAX_RESTARTS 10000
/* The library's limits (keel/limits.h): a world, the idle spares, and every process over
 * the job's life (each restart's workers, each respawned spare, each joiner takes a uid). */
#define MAX_WORLD KEEL_MAX_WORLD
#define MAX_PROCESSES_OVER_JOB KEEL_MAX_UIDS
#define DEFAULT_RESTARTS 3 /* with replace or restart; none with shrink */
#define SECOND_NS INT64_C(1000000000)
#define DEFAULT_RESTART_GRACE_NS (30 * SECOND_NS)
#define RESTART_GRACE_VARIABLE "KEEL_RESTART_GRACE"
/* Parameter servers are processes on the launcher's host: a few dozen is already many. */
#define MAX_SERVERS 256

static const char run_help_text[] =
    "usage: keel run [flags] -- PROG ARGS...\n"
    "\n"
    "Starts a fault-tolerant job: N workers (and S spares) of PROG, an embedded store,\n"
    "and watches them: a failed or hung process is fenced, and the job goes on.\n"
    "\n"
    "  -n N                      workers in all (default 1)\n"
    "  --nproc-per-node P        workers per node (failure domain)\n"
    "  --nnodes M                nodes; N = P * M\n"
    "  --nnodes MIN:MAX          elastic (with agents): the job starts with the first MIN\n"
    "                            nodes; nodes MIN..MAX-1 join at a step boundary when their\n"
    "                            agents come (with --agents: after --join-delay)\n"
    "  --spares S                idle processes that take a failed rank's place (default 0)\n"
    "  --on-failure POLICY       shrink (default), replace, or restart: every worker ends\n"
    "                            and the job starts anew from its checkpoints (needs --ckpt)\n"
    "  --ckpt jit                just-in-time checkpoints: on a failure the healthy workers\n"
    "                            save; means --on-failure restart unless replace is given\n"
    "  --ckpt mem[:SETTINGS]     in-memory checkpoints every iteration, each node's copied to\n"
    "                            peer nodes (Gemini); SETTINGS: replicas=K (default 2, at\n"
    "                            most the nodes), every=N steps, buffers=B chunks in flight,\n"
    "                            chunk=SIZE, blocking; means --on-failure replace\n"
    "  --ckpt-dir DIR            where they save (default /tmp/keel-<uid>/ckpt, made if missing)\n"
    "  --ckpt-persist-every T    with --ckpt mem: the agents also write the snapshots to\n"
    "                            --ckpt-dir every T (30m) or every N steps (500steps), in\n"
    "                            the background; the job falls back to them when no copy\n"
    "                            in memory is left\n"
    "  --resume DIR              start from the state a stopped or orphaned job saved in DIR\n"
    "                            (<ckpt-dir>/<job id>, as its workers said); means --ckpt jit\n"
    "  --failure-domain D        process (default) or node: a failure drops its whole node\n"
    "  --max-restarts R          fresh spares (replace) or restarts of the job (restart)\n"
    "                            after failures (default 3 with replace or restart)\n"
    "  --min-world A             stop the job when fewer than A ranks can remain (default 1)\n"
    "  --max-world B             largest world a grow may reach (default N); B > N starts\n"
    "                            B - N joiners that enter the job as they become ready\n"
    "  --join-delay DURATION     start those joiners DURATION after the workers (default 0);\n"
    "                            `keel join` asks a running job for more, up to B\n"
    "  --timeout DURATION        kill the job after DURATION and exit 124 (e.g. 90s, 10m)\n"
    "  --collective-timeout DURATION|auto  deadline of each collective (default 30s; auto:\n"
    "                            10 times the p99 of the observed step times, at least 1s)\n"
    "  --verify-replicas every=N compare a crc32c of every replica's state every N steps; on a\n"
    "                            mismatch (silent corruption) every rank goes back to the last\n"
    "                            verified step and redoes at most N steps\n"
    "  --heartbeat DURATION      lease time-to-live; a process silent this long is fenced\n"
    "                            (default 2s)\n"
    "  --events FILE             write every event, as JSON lines, to FILE\n"
    "  --rdzv-endpoint E         the job's store: etcd://host:port[,host:port...] (or\n"
    "                            https://... for TLS) instead of the embedded one\n"
    "  --rdzv-ca / --rdzv-cert / --rdzv-key FILE  TLS files for an https:// store\n"
    "  --rdzv-id NAME            the job's name in an outside store (several hosts)\n"
    "\n"
    "Several nodes (docs/NODES.md): each node has an agent that starts and watches its\n"
    "workers, keeps a lease in the store and fences its node when it loses it.\n"
    "  --node-rank I             run as the agent of node I (one `keel run` per host;\n"
    "                            needs --rdzv-endpoint and --rdzv-id); from SLURM_NODEID\n"
    "                            (and --nnodes from SLURM_NNODES) under srun\n"
    "  --agents                  on this host: one agent process per node\n"
    "  --netns                   on this host: each node a network namespace with its own\n"
    "                            address in 198.18.0.0/15 (needs root; implies --agents)\n"
    "  --link-rate RATE          shape each node's link with --netns (e.g. 10gbit, 1gbit)\n"
    "  --spare-nodes S           S more nodes whose agents start spares only (default 0)\n"
    "  --rejoin-wait DURATION    a fenced node's agent waits this long for its store to\n"
    "                            answer again (a healed partition), then rejoins the job\n"
    "                            as a spare node (default 0: it exits 78)\n"
    "  --metrics-port PORT       serve the job's figures in Prometheus' text format\n"
    "                            (the launcher, or the root agent of a job of nodes)\n"
    "\n"
    "Parameter servers (ECRec, erasure-coded; one host for now):\n"
    "  --servers S               start S `keel server` processes before the workers, which\n"
    "                            reach them with keel_ec_client_open_env (KEEL_EC_*)\n"
    "  --ec k=K,r=R              the code: K data and R parity blocks per group\n"
    "                            (K, R >= 1, K + R <= S); the job goes on through the loss\n"
    "                            of up to R servers and stops (exit 1) when more are lost\n"
    "  --ec-sync                 synchronous steps: every worker's push of a step applied\n"
    "                            together, the same bits on every run (default: each push\n"
    "                            applied as it comes)\n"
    "  --on-server-failure MODE  replace (default with --ec-sync): a dead server's place is\n"
    "                            taken by a replacement rebuilt while training goes on;\n"
    "                            degrade (default without): its rows stay served through\n"
    "                            the parity\n"
    "\n"
    "  --quiet                   no status line on the terminal\n"
    "  -h, --help                this text\n"
    "\n"
    "SIGINT or SIGTERM stops the job in order (the workers save, with --ckpt jit, and\n"
    "exit); a second one kills it at once.\n"
    "\n"
    "Exit code: the workers' verdict (0 when all that finished exited 0), 124 on timeout,\n"
    "130/143 on SIGINT/SIGTERM, 2 for a usage error.\n";

typedef enum flag_id {
  FLAG_WORLD,
  FLAG_NPROC_PER_NODE,
  FLAG_NNODES,
  FLAG_SPARES,
  FLAG_ON_FAILURE,
  FLAG_CKPT,
  FLAG_CKPT_DIR,
  FLAG_CKPT_PERSIST_EVERY,
  FLAG_RESUME,
  FLAG_FAILURE_DOMAIN,
  FLAG_MAX_RESTARTS,
  FLAG_MIN_WORLD,
  FLAG_MAX_WORLD,
  FLAG_JOIN_DELAY,
  FLAG_TIMEOUT,
  FLAG_COLLECTIVE_TIMEOUT,
  FLAG_HEARTBEAT,
  FLAG_VERIFY_REPLICAS,
  FLAG_EVENTS,
  FLAG_RDZV_ENDPOINT,
  FLAG_RDZV_CA,
  FLAG_RDZV_CERT,
  FLAG_RDZV_KEY,
  FLAG_RDZV_ID,
  FLAG_NODE_RANK,
  FLAG_AGENTS,
  FLAG_NETNS,
  FLAG_LINK_RATE,
  FLAG_SPARE_NODES,
  FLAG_REJOIN_WAIT,
  FLAG_METRICS_PORT,
  FLAG_SERVERS,
  FLAG_EC,
  FLAG_EC_SYNC,
  FLAG_ON_SERVER_FAILURE,
  FLAG_QUIET,
  FLAG_HELP,
  FLAG_COUNT,
} flag_id;

typedef struct flag_spec {
  const char *name;
  flag_id id;
  bool takes_value;
} flag_spec;

static const flag_spec flag_table[] = {
    {"-n", FLAG_WORLD, true},
    {"--nproc", FLAG_WORLD, true},
    {"--nproc-per-node", FLAG_NPROC_PER_NODE, true},
    {"--nnodes", FLAG_NNODES, true},
    {"--spares", FLAG_SPARES, true},
    {"--on-failure", FLAG_ON_FAILURE, true},
    {"--ckpt", FLAG_CKPT, true},
    {"--ckpt-dir", FLAG_CKPT_DIR, true},
    {"--ckpt-persist-every", FLAG_CKPT_PERSIST_EVERY, true},
    {"--resume", FLAG_RESUME, true},
    {"--failure-domain", FLAG_FAILURE_DOMAIN, true},
    {"--max-restarts", FLAG_MAX_RESTARTS, true},
    {"--min-world", FLAG_MIN_WORLD, true},
    {"--max-world", FLAG_MAX_WORLD, true},
    {"--join-delay", FLAG_JOIN_DELAY, true},
    {"--timeout", FLAG_TIMEOUT, true},
    {"--collective-timeout", FLAG_COLLECTIVE_TIMEOUT, true},
    {"--heartbeat", FLAG_HEARTBEAT, true},
    {"--verify-replicas", FLAG_VERIFY_REPLICAS, true},
    {"--events", FLAG_EVENTS, true},
    {"--rdzv-endpoint", FLAG_RDZV_ENDPOINT, true},
    {"--rdzv-ca", FLAG_RDZV_CA, true},
    {"--rdzv-cert", FLAG_RDZV_CERT, true},
    {"--rdzv-key", FLAG_RDZV_KEY, true},
    {"--rdzv-id", FLAG_RDZV_ID, true},
    {"--node-rank", FLAG_NODE_RANK, true},
    {"--agents", FLAG_AGENTS, false},
    {"--netns", FLAG_NETNS, false},
    {"--link-rate", FLAG_LINK_RATE, true},
    {"--spare-nodes", FLAG_SPARE_NODES, true},
    {"--rejoin-wait", FLAG_REJOIN_WAIT, true},
    {"--metrics-port", FLAG_METRICS_PORT, true},
    {"--servers", FLAG_SERVERS, true},
    {"--ec", FLAG_EC, true},
    {"--ec-sync", FLAG_EC_SYNC, false},
    {"--on-server-failure", FLAG_ON_SERVER_FAILURE, true},
    {"--quiet", FLAG_QUIET, false},
    {"-q", FLAG_QUIET, false},
    {"--help", FLAG_HELP, false},
    {"-h", FLAG_HELP, false},
};

/* Prints the one-line message of a usage error; returns false for the caller to pass on. */
static bool reject(const char *format, ...) __attribute__((format(printf, 1, 2)));

static bool reject(const char *format, ...) {
  char message[512];
  va_list arguments;
  va_start(arguments, format);
  vsnprintf(message, sizeof message, format, arguments);
  va_end(arguments);
  fprintf(stderr, "keel run: %s (see keel run --help)\n", message);
  return false;
}

/* Finds arg's flag; *inline_value_p gets the text after '=' of "--flag=value". */
static const flag_spec *flag_lookup(const char *arg, const char **inline_value_p) {
  const char *equals = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
  size_t name_length = equals ? (size_t)(equals - arg) : strlen(arg);
  for (size_t i = 0; i < sizeof flag_table / sizeof flag_table[0]; i++) {
    const char *name = flag_table[i].name;
    if (strlen(name) == name_length && strncmp(arg, name, name_length) == 0) {
      *inline_value_p = equals ? equals + 1 : NULL;
      return &flag_table[i];
    }
  }
  return NULL;
}

static bool parse_count(const char *flag, const char *text, int64_t minimum, int64_t maximum,
                        int64_t *value_p) {
  if (keel_parse_int(text, minimum, maximum, value_p) == KEEL_OK) return true;
  return reject("%s needs an integer in [%lld, %lld], not '%s'", flag, (long long)minimum,
                (long long)maximum, text);
}

static bool parse_positive_duration(const char *flag, const char *text, int64_t *value_p) {
  int64_t duration;
  if (keel_parse_duration_ns(text, &duration) == KEEL_OK && duration > 0) {
    *value_p = duration;
    return true;
  }
  return reject("%s needs a positive duration such as 500ms, 30s or 5m, not '%s'", flag, text);
}

static bool parse_duration(const char *flag, const char *text, int64_t *value_p) {
  int64_t duration;
  if (keel_parse_duration_ns(text, &duration) == KEEL_OK && duration >= 0) {
    *value_p = duration;
    return true;
  }
  return reject("%s needs a duration such as 0, 500ms or 30s, not '%s'", flag, text);
}

/* Indexed by keel__policy; NULL-terminated for parse_choice. */
static const char *const policy_names[] = {"shrink", "replace", "restart", NULL};
/* "mem" is parsed before these (it takes settings); listed for the message. */
static const char *const ckpt_choices[] = {"jit", "mem[:SETTINGS]", NULL};
static const char *const domain_choices[] = {"process", "node", NULL};

const char *keel__policy_name(keel__policy policy) {
  size_t count = sizeof policy_names / sizeof policy_names[0] - 1; /* the NULL is no name */
  return (size_t)policy < count ? policy_names[policy] : "shrink";
}

const char *keel__ckpt_name(keel__ckpt_policy ckpt) {
  if (ckpt == KEEL__CKPT_MEM) return "mem";
  return ckpt == KEEL__CKPT_JIT ? "jit" : "none";
}

/* --ckpt-persist-every: "500steps" or a duration ("30m"). */
static bool persist_every_parse(const char *value, keel__run_options *options) {
  size_t length = strlen(value);
  if (length > 5 && strcmp(value + length - 5, "steps") == 0) {
    char count[32];
    if (length - 5 >= sizeof count) return reject("--ckpt-persist-every: '%s' is too long", value);
    memcpy(count, value, length - 5);
    count[length - 5] = '\0';
    return parse_count("--ckpt-persist-every", count, 1, INT64_C(1) << 40,
                       &options->persist_every_steps);
  }
  if (!parse_duration("--ckpt-persist-every", value, &options->persist_every_ns)) return false;
  if (options->persist_every_ns <= 0)
    return reject("--ckpt-persist-every needs a positive duration or N steps, not '%s'", value);
  return true;
}

/* --ckpt mem or mem:SETTINGS (keel_ckpt_mem_config_parse). */
static bool ckpt_mem_parse(const char *value, keel__run_options *options) {
  const char *settings = value[3] == ':' ? value + 4 : "";
  char error[256];
  if (keel_ckpt_mem_config_parse(settings, &options->mem_config, error, sizeof error) != KEEL_OK)
    return reject("--ckpt %s: %s", value, error);
  options->ckpt = KEEL__CKPT_MEM;
  options->ckpt_mem = settings;
  return true;
}

/* Finds text among choices (NULL-terminated): *index_p gets its position. */
static bool parse_choice(const char *flag, const char *text, const char *const *choices,
                         int *index_p) {
  char list[128] = "";
  size_t used = 0;
  for (int i = 0; choices[i] != NULL; i++) {
    if (strcmp(text, choices[i]) == 0) {
      *index_p = i;
      return true;
    }
    const char *separator = i == 0 ? "" : choices[i + 1] == NULL ? " or " : ", ";
    if (used < sizeof list)
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", separator, choices[i]);
  }
  return reject("%s must be %s, not '%s'", flag, list, text);
}

/* --nnodes M, or MIN:MAX for a job whose nodes may come late. */
static bool nnodes_parse(const char *value, keel__run_options *options) {
  const char *colon = strchr(value, ':');
  if (colon == NULL) {
    options->elastic_nodes = false;
    return parse_count("--nnodes", value, 1, MAX_WORLD, &options->nnodes);
  }
  char minimum[32];
  if ((size_t)(colon - value) >= sizeof minimum) return reject("--nnodes %s: MIN:MAX", value);
  snprintf(minimum, sizeof minimum, "%.*s", (int)(colon - value), value);
  if (!parse_count("--nnodes", minimum, 1, MAX_WORLD, &options->nnodes_min) ||
      !parse_count("--nnodes", colon + 1, 1, MAX_WORLD, &options->nnodes))
    return false;
  if (options->nnodes_min > options->nnodes) return reject("--nnodes %s: MIN is above MAX", value);
  options->elastic_nodes = options->nnodes_min < options->nnodes;
  return true;
}

/* --ec k=K,r=R: exactly that spelling, K and R positive. */
static bool ec_code_parse(const char *value, keel__run_options *options) {
  char data_text[16], parity_text[16], rest;
  int matched = sscanf(value, "k=%15[0-9],r=%15[0-9]%c", data_text, parity_text, &rest);
  if (matched == 2 &&
      keel_parse_int(data_text, 1, KEEL_EC_MAX_BLOCKS - 1, &options->ec_data_blocks) == KEEL_OK &&
      keel_parse_int(parity_text, 1, KEEL_EC_MAX_BLOCKS - 1, &options->ec_parity_blocks) == KEEL_OK)
    return true;
  return reject("--ec wants k=K,r=R with K and R from 1 to %d (k=3,r=1), not '%s'",
                KEEL_EC_MAX_BLOCKS - 1, value);
}

static bool flag_apply(keel__run_options *options, const flag_spec *flag, const char *value) {
  int choice = 0;
  uint64_t rate = 0;
  switch (flag->id) {
    case FLAG_WORLD:
      return parse_count(flag->name, value, 1, MAX_WORLD, &options->world);
    case FLAG_NPROC_PER_NODE:
      return parse_count(flag->name, value, 1, MAX_WORLD, &options->nproc_per_node);
    case FLAG_NNODES:
      return nnodes_parse(value, options);
    case FLAG_SPARES:
      return parse_count(flag->name, value, 0, KEEL_MAX_SPARES, &options->spares);
    case FLAG_ON_FAILURE:
      if (!parse_choice(flag->name, value, policy_names, &choice)) return false;
      options->on_failure = (keel__policy)choice;
      return true;
    case FLAG_CKPT:
      if (strncmp(value, "mem", 3) == 0 && (value[3] == '\0' || value[3] == ':'))
        return ckpt_mem_parse(value, options);
      if (!parse_choice(flag->name, value, ckpt_choices, &choice)) return false;
      if (choice != 0) return reject("--ckpt mem[:SETTINGS] takes settings such as mem:replicas=2");
      options->ckpt = KEEL__CKPT_JIT;
      return true;
    case FLAG_CKPT_PERSIST_EVERY:
      return persist_every_parse(value, options);
    case FLAG_CKPT_DIR:
      if (*value == '\0') return reject("--ckpt-dir needs a directory name");
      options->ckpt_dir = value;
      return true;
    case FLAG_RESUME:
      if (*value == '\0') return reject("--resume needs the folder a stopped job saved in");
      options->resume_dir = value;
      return true;
    case FLAG_FAILURE_DOMAIN:
      if (!parse_choice(flag->name, value, domain_choices, &choice)) return false;
      options->node_failure_domain = choice == 1;
      return true;
    case FLAG_MAX_RESTARTS:
      return parse_count(flag->name, value, 0, MAX_RESTARTS, &options->max_restarts);
    case FLAG_MIN_WORLD:
      return parse_count(flag->name, value, 1, MAX_WORLD, &options->min_world);
    case FLAG_MAX_WORLD:
      return parse_count(flag->name, value, 1, MAX_WORLD, &options->max_world);
    case FLAG_JOIN_DELAY:
      return parse_duration(flag->name, value, &options->join_delay_ns);
    case FLAG_TIMEOUT:
      return parse_positive_duration(flag->name, value, &options->timeout_ns);
    case FLAG_COLLECTIVE_TIMEOUT:
      options->collective_timeout_auto = strcmp(value, "auto") == 0;
      if (options->collective_timeout_auto) return true;
      return parse_positive_duration(flag->name, value, &options->collective_timeout_ns);
    case FLAG_VERIFY_REPLICAS:
      if (strncmp(value, "every=", 6) != 0)
        return reject("--verify-replicas takes every=N (compare the replicas every N steps)");
      return parse_count("--verify-replicas every", value + 6, 1, 1000000000,
                         &options->verify_every);
    case FLAG_HEARTBEAT:
      return parse_positive_duration(flag->name, value, &options->heartbeat_ns);
    case FLAG_EVENTS:
      if (*value == '\0') return reject("--events needs a file name");
      options->events_path = value;
      return true;
    case FLAG_RDZV_ENDPOINT:
      if (strncmp(value, "etcd://", 7) != 0 && strncmp(value, "https://", 8) != 0)
        return reject("--rdzv-endpoint wants etcd://host:port[,host:port...] or https://...");
      if (strlen(value) >= 500) return reject("--rdzv-endpoint is longer than 500 characters");
      options->rdzv_endpoint = value;
      return true;
    case FLAG_RDZV_CA:
    case FLAG_RDZV_CERT:
    case FLAG_RDZV_KEY:
      if (*value == '\0') return reject("%s needs a file name", flag->name);
      options->rdzv_tls[flag->id - FLAG_RDZV_CA] = value;
      return true;
    case FLAG_RDZV_ID:
      if (*value == '\0' || strlen(value) > 64)
        return reject("--rdzv-id needs a name of 1 to 64 characters");
      options->rdzv_id = value;
      return true;
    case FLAG_NODE_RANK:
      return parse_count(flag->name, value, 0, MAX_WORLD, &options->node_rank);
    case FLAG_AGENTS:
      options->agents = true;
      return true;
    case FLAG_NETNS:
      options->netns = options->agents = true;
      return true;
    case FLAG_LINK_RATE:
      if (keel__netns_rate_parse(value, &rate) != KEEL_OK)
        return reject("--link-rate needs a rate from 1mbit to 1tbit such as 10gbit, not '%s'",
                      value);
      options->link_rate = value;
      return true;
    case FLAG_REJOIN_WAIT:
      return parse_duration(flag->name, value, &options->rejoin_wait_ns);
    case FLAG_SPARE_NODES:
      return parse_count(flag->name, value, 0, MAX_WORLD, &options->spare_nodes);
    case FLAG_METRICS_PORT:
      return parse_count(flag->name, value, 1, 65535, &options->metrics_port);
    case FLAG_SERVERS:
      return parse_count(flag->name, value, 1, MAX_SERVERS, &options->servers);
    case FLAG_EC:
      return ec_code_parse(value, options);
    case FLAG_EC_SYNC:
      options->ec_sync = true;
      return true;
    case FLAG_ON_SERVER_FAILURE:
      if (strcmp(value, "replace") != 0 && strcmp(value, "degrade") != 0)
        return reject("--on-server-failure takes replace or degrade, not '%s'", value);
      options->replace_servers = value[0] == 'r';
      return true;
    case FLAG_QUIET:
      options->quiet = true;
      return true;
    case FLAG_HELP:
    case FLAG_COUNT:
      break;
  }
  return true;
}

/* n, nproc-per-node and nnodes: any one or two of them fix the rest; all three must agree. */
static bool options_resolve_shape(keel__run_options *options, const bool *given) {
  bool have_world = given[FLAG_WORLD], have_per_node = given[FLAG_NPROC_PER_NODE];
  bool have_nodes = given[FLAG_NNODES];
  if (options->elastic_nodes) {
    /* The world starts with the first MIN nodes and grows by a node's workers. */
    if (have_world) return reject("-n does not go with --nnodes MIN:MAX: give --nproc-per-node");
    if (given[FLAG_MAX_WORLD]) return reject("--nnodes MIN:MAX sets the largest world itself");
    options->world = options->nproc_per_node * options->nnodes_min;
    return true;
  }
  if (!have_world) {
    options->world = options->nproc_per_node * options->nnodes;
    if (options->world > MAX_WORLD)
      return reject("%lld workers are more than %d", (long long)options->world, MAX_WORLD);
    return true;
  }
  if (!have_per_node && !have_nodes) options->nproc_per_node = options->world;
  if (!have_per_node && have_nodes) options->nproc_per_node = options->world / options->nnodes;
  if (have_per_node && !have_nodes) options->nnodes = options->world / options->nproc_per_node;
  if (options->nproc_per_node * options->nnodes != options->world)
    return reject("-n %lld is not --nproc-per-node times --nnodes", (long long)options->world);
  return true;
}

/* The grace of a restart round comes from the environment, so that tests can shorten it. */
static bool restart_grace_read(keel__run_options *options) {
  const char *text = getenv(RESTART_GRACE_VARIABLE);
  return text == NULL || parse_duration(RESTART_GRACE_VARIABLE, text, &options->restart_grace_ns);
}

/* --on-failure and --ckpt: restart means every worker ends and starts anew from the JIT
 * checkpoints, so it needs them, and it has no use for spares or joiners (each restart
 * starts the whole world). JIT checkpoints also serve replace (in-process recovery), but
 * shrink changes the world and has nothing to restore. */
static bool options_resolve_recovery(keel__run_options *options, const bool *given) {
  /* A resumed job restores just-in-time checkpoints: it needs the engine that reads them. */
  if (options->resume_dir != NULL) options->ckpt = KEEL__CKPT_JIT;
  if (options->ckpt == KEEL__CKPT_JIT && !given[FLAG_ON_FAILURE])
    options->on_failure = KEEL__ON_FAILURE_RESTART;
  if (options->ckpt == KEEL__CKPT_MEM && !given[FLAG_ON_FAILURE])
    options->on_failure = KEEL__ON_FAILURE_REPLACE;
  if (options->ckpt == KEEL__CKPT_MEM && options->on_failure == KEEL__ON_FAILURE_RESTART)
    return reject("--ckpt mem recovers in process: --on-failure replace or shrink");
  if (given[FLAG_CKPT_PERSIST_EVERY] && options->ckpt != KEEL__CKPT_MEM)
    return reject("--ckpt-persist-every goes with --ckpt mem");
  if (options->ckpt == KEEL__CKPT_MEM && options->nnodes > 1 && !options->agents &&
      options->node_rank < 0)
    return reject("--ckpt mem on several nodes needs their agents: add --agents or --netns");
  /* The default of 2 copies shrinks to what one node can hold; an explicit count cannot. */
  if (options->ckpt == KEEL__CKPT_MEM && strstr(options->ckpt_mem, "replicas=") != NULL &&
      options->mem_config.replicas > options->nnodes)
    return reject("--ckpt mem: replicas=%u needs at least that many nodes (--nnodes)",
                  options->mem_config.replicas);
  if (given[FLAG_CKPT_DIR] && options->ckpt == KEEL__CKPT_NONE)
    return reject("--ckpt-dir needs --ckpt jit");
  if (options->ckpt == KEEL__CKPT_JIT && options->on_failure == KEEL__ON_FAILURE_SHRINK)
    return reject("--ckpt jit goes with --on-failure restart or replace, not shrink");
  if (options->on_failure != KEEL__ON_FAILURE_RESTART) return true;
  if (options->ckpt != KEEL__CKPT_JIT)
    return reject("--on-failure restart needs checkpoints: add --ckpt jit");
  if (options->spares > 0)
    return reject("--spares does not go with --on-failure restart: a restart starts every worker");
  if (given[FLAG_MAX_WORLD] && options->max_world > options->world)
    return reject("--max-world does not go with --on-failure restart: a restarted job cannot grow");
  return restart_grace_read(options);
}

/* The first host of a Slurm node list ("n1,n2" or "n[3-6,9]" gives n1 or n3), where an
 * srun'd job finds its store by default. */
static void slurm_first_host(const char *list, char *host, size_t capacity) {
  size_t length = strcspn(list, ",[");
  if (list[length] != '[') {
    snprintf(host, capacity, "%.*s", (int)length, list);
    return;
  }
  const char *range = list + length + 1;
  snprintf(host, capacity, "%.*s%.*s", (int)length, list, (int)strspn(range, "0123456789"), range);
}

/* Under srun (SLURM_STEP_NODELIST is set), the node count and this node's rank come from
 * Slurm where the flags do not give them, and the store is etcd on the first node. */
static bool options_read_slurm(keel__run_options *options, bool *given) {
  static char endpoint[300];
  const char *nodes = getenv("SLURM_NNODES"), *node_id = getenv("SLURM_NODEID");
  const char *list = getenv("SLURM_STEP_NODELIST");
  if (list == NULL || getenv("KEEL_AGENT_OF") != NULL) return true;
  if (!given[FLAG_NNODES] && nodes != NULL) {
    if (!parse_count("SLURM_NNODES", nodes, 1, MAX_WORLD, &options->nnodes)) return false;
    given[FLAG_NNODES] = true;
  }
  if (!given[FLAG_NODE_RANK] && node_id != NULL) {
    if (!parse_count("SLURM_NODEID", node_id, 0, MAX_WORLD, &options->node_rank)) return false;
    given[FLAG_NODE_RANK] = true;
  }
  if (options->rdzv_endpoint == NULL && *list != '\0') {
    char host[256];
    slurm_first_host(list, host, sizeof host);
    snprintf(endpoint, sizeof endpoint, "etcd://%s:2379", host);
    options->rdzv_endpoint = endpoint;
  }
  const char *job = getenv("SLURM_JOB_ID");
  if (options->rdzv_id == NULL && job != NULL && *job != '\0') options->rdzv_id = job;
  return true;
}

/* Several nodes: agents on this host (--agents, --netns) or one agent per host
 * (--node-rank). What a job of agents cannot do yet is refused here, in words. */
static bool options_resolve_nodes(keel__run_options *options, const bool *given) {
  bool agent = options->node_rank >= 0;
  bool supervised = getenv("KEEL_AGENT_OF") != NULL;
  if (given[FLAG_LINK_RATE] && !options->netns) return reject("--link-rate needs --netns");
  bool elastic = options->elastic_nodes;
  if (!agent && !options->agents) {
    if (options->spare_nodes > 0)
      return reject("--spare-nodes needs --agents, --netns or --node-rank");
    if (elastic) return reject("--nnodes MIN:MAX needs --agents, --netns or --node-rank");
    if (options->rejoin_wait_ns > 0)
      return reject("--rejoin-wait needs --agents, --netns or --node-rank");
    return true;
  }
  if (agent && !supervised) {
    if (options->agents) return reject("--node-rank runs one node's agent: no --agents or --netns");
    if (options->rdzv_endpoint == NULL || options->rdzv_id == NULL)
      return reject("--node-rank needs --rdzv-endpoint and --rdzv-id (the same on every node)");
  }
  if (agent && options->node_rank >= options->nnodes + options->spare_nodes)
    return reject("--node-rank %lld: the job has %lld nodes and %lld spare nodes",
                  (long long)options->node_rank, (long long)options->nnodes,
                  (long long)options->spare_nodes);
  if (options->on_failure == KEEL__ON_FAILURE_RESTART)
    return reject("--on-failure restart does not go with agents yet: use shrink or replace");
  if (!elastic && options->max_world > options->world)
    return reject("--max-world does not go with agents: a job of nodes grows by --nnodes MIN:MAX");
  return true;
}

/* --servers, --ec and --ec-sync go together, on one host, with a code the servers can hold.
 * What the servers cannot do yet is refused here, in words. */
static bool options_resolve_servers(keel__run_options *options, const bool *given) {
  if (!given[FLAG_SERVERS] && !given[FLAG_EC]) {
    if (given[FLAG_EC_SYNC]) return reject("--ec-sync needs --servers S and --ec k=K,r=R");
    if (given[FLAG_ON_SERVER_FAILURE])
      return reject("--on-server-failure needs --servers S and --ec k=K,r=R");
    return true;
  }
  if (!given[FLAG_SERVERS]) return reject("--ec needs --servers S: the servers that hold the code");
  if (!given[FLAG_EC]) return reject("--servers needs --ec k=K,r=R: how the servers code the rows");
  int64_t blocks = options->ec_data_blocks + options->ec_parity_blocks;
  if (blocks > options->servers)
    return reject("--ec k=%lld,r=%lld needs k + r = %lld servers at least, not --servers %lld",
                  (long long)options->ec_data_blocks, (long long)options->ec_parity_blocks,
                  (long long)blocks, (long long)options->servers);
  if (blocks > KEEL_EC_MAX_BLOCKS) return reject("--ec k + r is at most %d", KEEL_EC_MAX_BLOCKS);
  bool several_nodes =
      options->agents || options->node_rank >= 0 || options->elastic_nodes || options->nnodes > 1;
  if (several_nodes)
    return reject(
        "--servers runs on one host for now: no --nnodes, --agents, --netns or "
        "--node-rank");
  if (options->ec_sync && options->max_world > options->world)
    return reject(
        "--ec-sync does not go with --max-world above -n: a synchronous step waits "
        "for the -n workers' pushes");
  if (options->on_failure == KEEL__ON_FAILURE_RESTART)
    return reject(
        "--servers does not go with --on-failure restart (or --ckpt jit, --resume) "
        "yet: the servers' state is in no checkpoint");
  /* A replacement is rebuilt against steps (its stamps): synchronous jobs only. */
  if (given[FLAG_ON_SERVER_FAILURE] && options->replace_servers && !options->ec_sync)
    return reject(
        "--on-server-failure replace needs --ec-sync: a replacement is rebuilt step by step");
  if (!given[FLAG_ON_SERVER_FAILURE]) options->replace_servers = options->ec_sync;
  return true;
}

static bool options_resolve(keel__run_options *options, bool *given) {
  if (!options_read_slurm(options, given)) return false;
  if (!options_resolve_shape(options, given)) return false;
  if (!options_resolve_recovery(options, given)) return false;
  if (!given[FLAG_MAX_RESTARTS])
    options->max_restarts = options->on_failure == KEEL__ON_FAILURE_SHRINK ? 0 : DEFAULT_RESTARTS;
  if (!given[FLAG_MAX_WORLD]) options->max_world = options->world;
  if (options->elastic_nodes)
    options->max_world = options->nproc_per_node * options->nnodes;
  else
    options->nnodes_min = options->nnodes; /* every node starts with the job */
  int64_t restarted = options->on_failure == KEEL__ON_FAILURE_RESTART
                          ? options->world * options->max_restarts
                          : options->max_restarts;
  /* The servers' uids follow the rest (run_servers.c); their replacements take what is left. */
  int64_t processes =
      options->world + options->spares + restarted + options->max_world + options->servers;
  if (processes > MAX_PROCESSES_OVER_JOB)
    return reject(
        "-n %lld, --spares %lld, --max-restarts %lld, --max-world %lld and --servers %lld "
        "would start more than %d processes over the job",
        (long long)options->world, (long long)options->spares, (long long)options->max_restarts,
        (long long)options->max_world, (long long)options->servers, MAX_PROCESSES_OVER_JOB);
  if (options->min_world > options->world)
    return reject("--min-world %lld is above the %lld workers", (long long)options->min_world,
                  (long long)options->world);
  if (options->max_world < options->world)
    return reject("--max-world %lld is below the %lld workers", (long long)options->max_world,
                  (long long)options->world);
  if (options->program_argv == NULL || options->program_argv[0] == NULL)
    return reject("no program given: keel run [flags] -- PROG ARGS...");
  return options_resolve_nodes(options, given) && options_resolve_servers(options, given);
}

static void options_default(keel__run_options *options) {
  *options = (keel__run_options){
      .world = 1,
      .nproc_per_node = 1,
      .nnodes = 1,
      .nnodes_min = 1,
      .on_failure = KEEL__ON_FAILURE_SHRINK,
      .min_world = 1,
      .timeout_ns = -1,
      .collective_timeout_ns = 30 * SECOND_NS,
      .heartbeat_ns = 2 * SECOND_NS,
      .restart_grace_ns = DEFAULT_RESTART_GRACE_NS,
      .node_rank = -1,
  };
}

keel__parse_result keel__run_options_parse(int argc, char **argv, keel__run_options *options_p) {
  keel__run_options options;
  options_default(&options);
  bool given[FLAG_COUNT] = {false};
  int index = 1;
  for (; index < argc; index++) {
    const char *arg = argv[index];
    if (strcmp(arg, "--") == 0) {
      index++;
      break;
    }
    if (arg[0] != '-' || arg[1] == '\0') break;
    const char *value = NULL;
    const flag_spec *flag = flag_lookup(arg, &value);
    if (flag == NULL) {
      reject("unknown flag '%s'", arg);
      return KEEL__PARSE_ERROR;
    }
    if (flag->id == FLAG_HELP) {
      fputs(run_help_text, stdout);
      return KEEL__PARSE_HELP;
    }
    if (!flag->takes_value && value != NULL) {
      reject("%s takes no value", flag->name);
      return KEEL__PARSE_ERROR;
    }
    if (flag->takes_value && value == NULL) {
      if (index + 1 >= argc) {
        reject("%s needs a value", flag->name);
        return KEEL__PARSE_ERROR;
      }
      value = argv[++index];
    }
    if (!flag_apply(&options, flag, value)) return KEEL__PARSE_ERROR;
    given[flag->id] = true;
  }
  options.program_argv = index < argc ? argv + index : NULL;
  options.argc = argc;
  options.argv = argv;
  if (!options_resolve(&options, given)) return KEEL__PARSE_ERROR;
  if (strcmp(argv[0], "agent") == 0 && options.node_rank < 0) {
    reject("keel agent needs --node-rank");
    return KEEL__PARSE_ERROR;
  }
  *options_p = options;
  return KEEL__PARSE_OK;
}

void keel__duration_format(int64_t duration_ns, char *text, size_t capacity) {
  static const struct {
    int64_t scale;
    const char *suffix;
  } units[] = {{1000000000, "s"}, {1000000, "ms"}, {1000, "us"}, {1, "ns"}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (duration_ns % units[i].scale != 0) continue;
    snprintf(text, capacity, "%lld%s", (long long)(duration_ns / units[i].scale), units[i].suffix);
    return;
  }
}
