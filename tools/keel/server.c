/* `keel server`: one parameter server (ECRec) as a process of its own, so that it can really
 * die. It serves its shard of the configuration its flags give until SIGTERM or SIGINT, with
 * the job's store (--store) as its directory and the job's token (KEEL_JOB_ID, KEEL_JOB_TOKEN)
 * for its links. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/ec.h"
#include "keel/runtime.h"
#include "tool.h"

#define STORE_CONNECT_TIMEOUT_NS (30 * INT64_C(1000000000))
/* How long a server started before the workers waits for their configuration. */
#define CONFIG_WAIT_NS (600 * INT64_C(1000000000))
#define CONFIG_WAIT_SLICE_NS (100 * INT64_C(1000000))

static const char server_usage_text[] =
    "usage: keel server --index I --store HOST:PORT [--listen HOST:PORT] [--replace]\n"
    "       [--servers S --data-blocks K --parity-blocks R --dim D --rows N [--dense N]\n"
    "        [--optimizer sgd|momentum|adagrad|adam] [--lr X] [--seed S] [--init-scale X]\n"
    "        [--workers W] [--replicate-dense] [--two-phase-commit]]\n"
    "Without --servers, the configuration is the one the job's first worker publishes.\n"
    "--replace: take lost server I's place, rebuilt from the others while training goes on\n"
    "  [--rebuild-chunk GROUPS (1024)] [--rebuild-pause-ms MS (0)]: groups rebuilt per round\n"
    "  and a pause after each round that leaves the other servers to training.";

static int server_usage(const char *message) {
  fprintf(stderr, "keel server: %s\n%s\n", message, server_usage_text);
  return KEEL__EXIT_USAGE;
}

typedef struct server_arguments {
  keel_ec_config config;
  int64_t index;
  const char *store, *listen;
  keel_ec_optimizer_kind optimizer;
  double learning_rate;
  bool from_store; /* no shape given: wait for the first worker's (keel_ec_config_publish) */
  bool replace;    /* take a lost server's place: rebuild, then come back */
} server_arguments;

static bool optimizer_named(const char *name, keel_ec_optimizer_kind *kind_p) {
  static const struct {
    const char *name;
    keel_ec_optimizer_kind kind;
  } names[] = {{"sgd", KEEL_EC_SGD},
               {"momentum", KEEL_EC_MOMENTUM},
               {"adagrad", KEEL_EC_ADAGRAD},
               {"adam", KEEL_EC_ADAM}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (strcmp(name, names[i].name) == 0) {
      *kind_p = names[i].kind;
      return true;
    }
  }
  return false;
}

/* One flag with a value; returns an error message or NULL. */
static const char *integer_flag(const char *flag, const char *value, server_arguments *arguments) {
  static const struct {
    const char *flag;
    int64_t minimum, maximum;
  } integers[] = {{"--index", 0, KEEL_MAX_UIDS - 1},   {"--servers", 1, KEEL_MAX_UIDS},
                  {"--data-blocks", 1, 254},           {"--parity-blocks", 1, 254},
                  {"--dim", 1, KEEL_EC_ROW_MAX_DIM},   {"--rows", 1, INT64_MAX},
                  {"--dense", 0, KEEL_EC_ROW_MAX_DIM}, {"--seed", 0, INT64_MAX},
                  {"--workers", 0, KEEL_MAX_WORLD},    {"--rebuild-chunk", 1, UINT32_MAX},
                  {"--rebuild-pause-ms", 0, 60000}};
  for (size_t i = 0; i < sizeof integers / sizeof integers[0]; i++) {
    if (strcmp(flag, integers[i].flag) != 0) continue;
    int64_t number = 0;
    if (keel_parse_int(value, integers[i].minimum, integers[i].maximum, &number) != KEEL_OK)
      return "a flag's number is malformed or out of range";
    keel_ec_config *config = &arguments->config;
    switch (i) {
      case 0:
        arguments->index = number;
        break;
      case 1:
        config->servers = (int)number;
        break;
      case 2:
        config->data_blocks = (int)number;
        break;
      case 3:
        config->parity_blocks = (int)number;
        break;
      case 4:
        config->dim = (int)number;
        break;
      case 5:
        config->total_rows = (uint64_t)number;
        break;
      case 6:
        config->dense_count = (uint64_t)number;
        break;
      case 7:
        config->seed = (uint64_t)number;
        break;
      case 8:
        config->workers = (int)number;
        break;
      case 9:
        config->rebuild_chunk_groups = (uint32_t)number;
        break;
      default:
        config->rebuild_pause_ms = (uint32_t)number;
        break;
    }
    return NULL;
  }
  return "unknown flag";
}

static const char *value_flag(const char *flag, const char *value, server_arguments *arguments) {
  if (strcmp(flag, "--store") == 0) {
    arguments->store = value;
  } else if (strcmp(flag, "--listen") == 0) {
    arguments->listen = value;
  } else if (strcmp(flag, "--optimizer") == 0) {
    if (!optimizer_named(value, &arguments->optimizer)) return "unknown --optimizer";
  } else if (strcmp(flag, "--lr") == 0 || strcmp(flag, "--init-scale") == 0) {
    char *end = NULL;
    double number = strtod(value, &end);
    if (end == value || *end != '\0' || !(number >= 0) || number > 1e6)
      return "--lr and --init-scale need a number from 0 to 1e6";
    if (flag[2] == 'l')
      arguments->learning_rate = number;
    else
      arguments->config.init_scale = (float)number;
  } else {
    return integer_flag(flag, value, arguments);
  }
  return NULL;
}

/* Returns -1 when the arguments are good, else the exit code. */
static int server_arguments_parse(int argc, char **argv, server_arguments *arguments) {
  *arguments = (server_arguments){.index = -1,
                                  .listen = "127.0.0.1:0",
                                  .optimizer = KEEL_EC_ADAGRAD,
                                  .learning_rate = 0.05,
                                  .config = {.init_scale = 0.1f}};
  for (int index = 1; index < argc; index++) {
    const char *flag = argv[index];
    if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
      printf("%s\n", server_usage_text);
      return 0;
    }
    if (strcmp(flag, "--replicate-dense") == 0) {
      arguments->config.replicate_dense = true;
      continue;
    }
    if (strcmp(flag, "--two-phase-commit") == 0) {
      arguments->config.two_phase_commit = true;
      continue;
    }
    if (strcmp(flag, "--replace") == 0) {
      arguments->replace = true;
      continue;
    }
    if (index + 1 >= argc) return server_usage("a flag needs a value");
    const char *problem = value_flag(flag, argv[++index], arguments);
    if (problem != NULL) return server_usage(problem);
  }
  if (arguments->index < 0 || arguments->store == NULL)
    return server_usage("--index and --store are needed");
  /* Without the tables' shape, the configuration comes from the job's store. */
  arguments->from_store = arguments->config.servers == 0;
  if (!arguments->from_store && (arguments->config.dim == 0 || arguments->config.total_rows == 0))
    return server_usage("--servers needs --dim and --rows too");
  if (keel_ec_optimizer_init(arguments->optimizer, (float)arguments->learning_rate,
                             &arguments->config.optimizer) != KEEL_OK)
    return server_usage("a bad optimizer or learning rate");
  return -1;
}

/* Waits for the first worker's configuration in slices, so that a SIGTERM or SIGINT (blocked,
 * so pending) ends the wait at once: the job may end before any worker got that far.
 * KEEL_ECANCELED when a signal came. */
static keel_status config_wait_unless_stopped(keel_store *store, const sigset_t *stop,
                                              keel_ec_config *config) {
  int64_t deadline = keel_deadline_after_ns(CONFIG_WAIT_NS);
  for (;;) {
    struct timespec no_wait = {0, 0};
    if (sigtimedwait(stop, NULL, &no_wait) > 0) return KEEL_ECANCELED;
    int64_t slice = keel_deadline_after_ns(CONFIG_WAIT_SLICE_NS);
    keel_status status = keel_ec_config_wait(store, slice < deadline ? slice : deadline, config);
    if (status != KEEL_ETIMEDOUT || keel_now_ns() >= deadline) return status;
  }
}

/* Waits for a signal of stop, and says every second whether some wait of the server's (its
 * calls to other servers, its waits for a step's pushes) ended past its deadline: `wait_late`
 * lines, which keel chaos counts against the job (deadlines-kept). */
static void waits_late_report_until(const sigset_t *stop) {
  keel_reporter *reporter = NULL;
  if (keel_reporter_open(&reporter) != KEEL_OK)
    fprintf(stderr, "keel server: KEEL_STATUS_FD or KEEL_UID is malformed: no event lines\n");
  const struct timespec second = {1, 0};
  while (sigtimedwait(stop, NULL, &second) < 0) keel_reporter_waits_late(reporter, -1);
  keel_reporter_close(reporter);
}

/* Serves until SIGTERM or SIGINT: this process is the tool's, so it may take the signals. */
static int serve_until_signalled(server_arguments *arguments, keel_store *store,
                                 const keel_auth *auth) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);
  keel_status status = KEEL_OK;
  if (arguments->from_store) {
    /* The rebuild's pace is this server's own, never in the published configuration. */
    keel_ec_config own = arguments->config;
    status = config_wait_unless_stopped(store, &stop, &arguments->config);
    if (status == KEEL_ECANCELED) return 0; /* stopped before the job needed this server */
    arguments->config.rebuild_chunk_groups = own.rebuild_chunk_groups;
    arguments->config.rebuild_pause_ms = own.rebuild_pause_ms;
  }
  if (status != KEEL_OK) {
    fprintf(stderr, "keel server: no configuration in the job's store: %s\n",
            keel_strerror(status));
    return 1;
  }
  keel_ec_server *server = NULL;
  status = (arguments->replace ? keel_ec_server_replace : keel_ec_server_start)(
      &arguments->config, (int)arguments->index, arguments->listen, store, auth, &server);
  if (status != KEEL_OK) {
    fprintf(stderr, "keel server: cannot start: %s\n", keel_strerror(status));
    return 1;
  }
  printf("keel server %d listening on %s\n", (int)arguments->index, keel_ec_server_address(server));
  fflush(stdout);
  waits_late_report_until(&stop);
  keel_ec_server_stop(server);
  return 0;
}

int keel__command_server(int argc, char **argv) {
  server_arguments arguments;
  int exit_code = server_arguments_parse(argc, argv, &arguments);
  if (exit_code >= 0) return exit_code;
  keel_auth auth;
  if (keel_auth_from_env(&auth) != KEEL_OK)
    return server_usage("KEEL_JOB_ID and KEEL_JOB_TOKEN must name the job");
  keel_store *store = NULL;
  keel_status status = keel_store_connect(arguments.store, &auth,
                                          keel_deadline_after_ns(STORE_CONNECT_TIMEOUT_NS), &store);
  if (status != KEEL_OK) {
    fprintf(stderr, "keel server: cannot reach the store at %s: %s\n", arguments.store,
            keel_strerror(status));
    return 1;
  }
  exit_code = serve_until_signalled(&arguments, store, &auth);
  keel_store_close(store);
  return exit_code;
}
