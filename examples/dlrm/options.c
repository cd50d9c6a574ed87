/* Flag parsing of the DLRM example (options.h), in fashion_mnist's manner: getopt_long,
 * keel's number parsers, a clear message and exit code 2 for anything wrong. */
#include "options.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BATCH (1 << 16)
#define MAX_EVAL_SAMPLES (1 << 26)

typedef struct optimizer_entry {
  const char *name;
  keel_ec_optimizer_kind kind;
  float default_rate;
} optimizer_entry;

/* Near the best of a sweep over factors of 2 on the default configuration, erring low
 * (docs/DLRM.md). */
static const optimizer_entry optimizers[] = {
    {"sgd", KEEL_EC_SGD, 1.0f},
    {"momentum", KEEL_EC_MOMENTUM, 0.1f},
    {"adagrad", KEEL_EC_ADAGRAD, 0.05f},
    {"adam", KEEL_EC_ADAM, 0.005f},
};
#define OPTIMIZER_COUNT (sizeof optimizers / sizeof optimizers[0])

static const dlrm_options default_options = {
    .table_count = 8,
    .dim = 16,
    .dense_features = 13,
    .hotness = 1,
    .top = {64, 1},
    .top_count = 2,
    .batch = 128,
    .steps = 1000,
    .optimizer = KEEL_EC_ADAGRAD,
    .learning_rate = 0.0f,
    .seed = 1,
    .data_seed = 1,
    .zipf_exponent = 1.05,
    .eval_samples = 16384,
    .eval_every = 0,
    .backend = "local",
    .two_phase_commit = true,
};
#define DEFAULT_ROWS 100000
#define DEFAULT_BOTTOM_HIDDEN 64

const char *dlrm_optimizer_name(keel_ec_optimizer_kind kind) {
  for (size_t i = 0; i < OPTIMIZER_COUNT; i++) {
    if (optimizers[i].kind == kind) return optimizers[i].name;
  }
  return "?";
}

static void print_usage(FILE *stream) {
  fprintf(stream,
          "usage: " DLRM_PROGRAM
          " [options]\n"
          "  --tables T --rows R   T tables of R rows each (default 8 of 100000; R up to 2^32)\n"
          "  --table-rows A,B,...  one size per table instead\n"
          "  --dim E               embedding width (default 16)\n"
          "  --dense-features D    dense features per sample (default 13)\n"
          "  --hotness H           ids per table per sample, summed in a bag (default 1)\n"
          "  --bottom LIST         bottom MLP widths, ending in E (default 64,E)\n"
          "  --top LIST            top MLP widths, ending in 1 (default 64,1)\n"
          "  --batch B             samples per worker per step (default 128)\n"
          "  --steps N             training steps (default 1000)\n"
          "  --optimizer NAME      sgd, momentum, adagrad (default) or adam, for rows and MLPs\n"
          "  --lr X                learning rate (default sgd 1, momentum 0.1, adagrad 0.05,\n"
          "                        adam 0.005)\n"
          "  --seed S              seed of the parameters (default 1)\n"
          "  --data-seed S         seed of the hidden model and the samples (default 1)\n"
          "  --zipf S              Zipf exponent of the ids, 0 for uniform (default 1.05)\n"
          "  --eval-samples N      held-out samples, 0 for none (default 16384)\n"
          "  --eval-every N        evaluate every N steps too (default 0: at the end only)\n"
          "  --sync                synchronous updates: the servers apply every worker's step\n"
          "                        in worker order (one local process is always so)\n"
          "  --backend NAME        where the parameters live: local (default), or servers\n"
          "                        (the parameter servers of keel run --servers S --ec k=K,r=R)\n"
          "  --fault-tolerance FT  with --backend servers: ecrec-2pc (default: parity kept by\n"
          "                        difference propagation, two-phase commit), ecrec (without\n"
          "                        two-phase commit) or none (no parity: a lost server's rows are\n"
          "                        gone; the baseline the overhead is measured against)\n"
          "  --check-gradients     compare the gradients of one batch with finite differences\n"
          "  --quiet               no progress lines\n"
          "  --help                this text\n");
}

static int bad_value(const char *flag, const char *value, const char *expected) {
  fprintf(stderr, DLRM_PROGRAM ": %s: '%s' is not %s\n", flag, value, expected);
  print_usage(stderr);
  return 2;
}

static int contradiction(const char *message) {
  fprintf(stderr, DLRM_PROGRAM ": %s\n", message);
  print_usage(stderr);
  return 2;
}

/* A count with keel_parse_size's suffixes (1M = 10^6, 1MiB = 2^20) in [minimum, maximum]. */
static bool parse_count(const char *text, uint64_t minimum, uint64_t maximum, uint64_t *value_p) {
  uint64_t value;
  if (keel_parse_size(text, &value) != KEEL_OK || value < minimum || value > maximum) return false;
  *value_p = value;
  return true;
}

/* "64,16": 1 .. capacity counts, each in [minimum, maximum]. */
static bool parse_list(const char *text, uint64_t minimum, uint64_t maximum, uint64_t *values,
                       size_t capacity, size_t *count_p) {
  size_t count = 0;
  const char *cursor = text;
  for (;;) {
    const char *comma = strchr(cursor, ',');
    size_t length = comma ? (size_t)(comma - cursor) : strlen(cursor);
    char piece[32];
    if (length == 0 || length >= sizeof piece || count == capacity) return false;
    memcpy(piece, cursor, length);
    piece[length] = '\0';
    if (!parse_count(piece, minimum, maximum, &values[count++])) return false;
    if (comma == NULL) break;
    cursor = comma + 1;
  }
  *count_p = count;
  return true;
}

static bool parse_widths(const char *text, size_t *widths, size_t *count_p) {
  uint64_t values[DLRM_MAX_LAYERS];
  size_t count;
  if (!parse_list(text, 1, DLRM_MAX_WIDTH, values, DLRM_MAX_LAYERS, &count)) return false;
  for (size_t i = 0; i < count; i++) widths[i] = (size_t)values[i];
  *count_p = count;
  return true;
}

static bool parse_real(const char *text, double minimum, double maximum, double *value_p) {
  char *end = NULL;
  double value = strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= minimum && value <= maximum)) return false;
  *value_p = value;
  return true;
}

static bool parse_optimizer(const char *text, keel_ec_optimizer_kind *kind_p) {
  for (size_t i = 0; i < OPTIMIZER_COUNT; i++) {
    if (strcmp(text, optimizers[i].name) == 0) {
      *kind_p = optimizers[i].kind;
      return true;
    }
  }
  return false;
}

enum {
  OPTION_TABLES = 256, /* above every character getopt_long could return */
  OPTION_ROWS,
  OPTION_TABLE_ROWS,
  OPTION_DIM,
  OPTION_DENSE_FEATURES,
  OPTION_HOTNESS,
  OPTION_BOTTOM,
  OPTION_TOP,
  OPTION_BATCH,
  OPTION_STEPS,
  OPTION_OPTIMIZER,
  OPTION_LEARNING_RATE,
  OPTION_SEED,
  OPTION_DATA_SEED,
  OPTION_ZIPF,
  OPTION_EVAL_SAMPLES,
  OPTION_EVAL_EVERY,
  OPTION_SYNC,
  OPTION_BACKEND,
  OPTION_FAULT_TOLERANCE,
  OPTION_CHECK_GRADIENTS,
  OPTION_QUIET,
  OPTION_HELP,
};

static const struct option long_options[] = {
    {"tables", required_argument, NULL, OPTION_TABLES},
    {"rows", required_argument, NULL, OPTION_ROWS},
    {"table-rows", required_argument, NULL, OPTION_TABLE_ROWS},
    {"dim", required_argument, NULL, OPTION_DIM},
    {"dense-features", required_argument, NULL, OPTION_DENSE_FEATURES},
    {"hotness", required_argument, NULL, OPTION_HOTNESS},
    {"bottom", required_argument, NULL, OPTION_BOTTOM},
    {"top", required_argument, NULL, OPTION_TOP},
    {"batch", required_argument, NULL, OPTION_BATCH},
    {"steps", required_argument, NULL, OPTION_STEPS},
    {"optimizer", required_argument, NULL, OPTION_OPTIMIZER},
    {"lr", required_argument, NULL, OPTION_LEARNING_RATE},
    {"seed", required_argument, NULL, OPTION_SEED},
    {"data-seed", required_argument, NULL, OPTION_DATA_SEED},
    {"zipf", required_argument, NULL, OPTION_ZIPF},
    {"eval-samples", required_argument, NULL, OPTION_EVAL_SAMPLES},
    {"eval-every", required_argument, NULL, OPTION_EVAL_EVERY},
    {"sync", no_argument, NULL, OPTION_SYNC},
    {"backend", required_argument, NULL, OPTION_BACKEND},
    {"fault-tolerance", required_argument, NULL, OPTION_FAULT_TOLERANCE},
    {"check-gradients", no_argument, NULL, OPTION_CHECK_GRADIENTS},
    {"quiet", no_argument, NULL, OPTION_QUIET},
    {"help", no_argument, NULL, OPTION_HELP},
    {NULL, 0, NULL, 0},
};

/* What the table flags said, resolved once every flag is read. */
typedef struct table_flags {
  uint64_t tables, rows;
  bool tables_given, rows_given, list_given, bottom_given;
} table_flags;

/* The flags whose value is a count: where it goes and its bounds. */
static int apply_count(int option, const char *text, dlrm_options *parsed, table_flags *tables) {
  uint64_t value = 0;
  switch (option) {
    case OPTION_TABLES:
      tables->tables_given = true;
      if (!parse_count(text, 1, DLRM_MAX_TABLES, &tables->tables))
        return bad_value("--tables", text, "a number of tables in 1 .. 1024");
      return -1;
    case OPTION_ROWS:
      tables->rows_given = true;
      if (!parse_count(text, 1, DLRM_MAX_TABLE_ROWS, &tables->rows))
        return bad_value("--rows", text, "a number of rows in 1 .. 2^32");
      return -1;
    case OPTION_DIM:
      if (!parse_count(text, 1, DLRM_MAX_WIDTH, &value))
        return bad_value("--dim", text, "a width in 1 .. 4096");
      parsed->dim = (size_t)value;
      return -1;
    case OPTION_DENSE_FEATURES:
      if (!parse_count(text, 1, DLRM_MAX_DENSE_FEATURES, &value))
        return bad_value("--dense-features", text, "a count in 1 .. 4096");
      parsed->dense_features = (size_t)value;
      return -1;
    case OPTION_HOTNESS:
      if (!parse_count(text, 1, DLRM_MAX_HOTNESS, &value))
        return bad_value("--hotness", text, "a count in 1 .. 1024");
      parsed->hotness = (size_t)value;
      return -1;
    case OPTION_BATCH:
      if (!parse_count(text, 1, MAX_BATCH, &value))
        return bad_value("--batch", text, "a batch size in 1 .. 65536");
      parsed->batch = (size_t)value;
      return -1;
    case OPTION_STEPS:
      if (!parse_count(text, 0, UINT64_C(1) << 40, &parsed->steps))
        return bad_value("--steps", text, "a number of steps");
      return -1;
    case OPTION_EVAL_SAMPLES:
      if (!parse_count(text, 0, MAX_EVAL_SAMPLES, &parsed->eval_samples))
        return bad_value("--eval-samples", text, "a count in 0 .. 2^26");
      return -1;
    case OPTION_EVAL_EVERY:
      if (!parse_count(text, 0, UINT64_C(1) << 40, &parsed->eval_every))
        return bad_value("--eval-every", text, "a number of steps");
      return -1;
    case OPTION_SEED:
    case OPTION_DATA_SEED: {
      int64_t seed;
      if (keel_parse_int(text, 0, INT64_MAX, &seed) != KEEL_OK)
        return bad_value(option == OPTION_SEED ? "--seed" : "--data-seed", text,
                         "a non-negative integer");
      *(option == OPTION_SEED ? &parsed->seed : &parsed->data_seed) = (uint64_t)seed;
      return -1;
    }
    default:
      return 2;
  }
}

/* Every other flag with a value. */
static int apply_text(int option, const char *text, dlrm_options *parsed, table_flags *tables) {
  double real;
  switch (option) {
    case OPTION_TABLE_ROWS:
      tables->list_given = true;
      if (!parse_list(text, 1, DLRM_MAX_TABLE_ROWS, parsed->table_rows, DLRM_MAX_TABLES,
                      &parsed->table_count))
        return bad_value("--table-rows", text, "a list of table sizes, each in 1 .. 2^32");
      return -1;
    case OPTION_BOTTOM:
      tables->bottom_given = true;
      if (!parse_widths(text, parsed->bottom, &parsed->bottom_count))
        return bad_value("--bottom", text, "a list of widths in 1 .. 4096 (at most 8)");
      return -1;
    case OPTION_TOP:
      if (!parse_widths(text, parsed->top, &parsed->top_count))
        return bad_value("--top", text, "a list of widths in 1 .. 4096 (at most 8)");
      return -1;
    case OPTION_OPTIMIZER:
      if (!parse_optimizer(text, &parsed->optimizer))
        return bad_value("--optimizer", text, "sgd, momentum, adagrad or adam");
      return -1;
    case OPTION_LEARNING_RATE:
      if (!parse_real(text, 1e-12, 1e6, &real))
        return bad_value("--lr", text, "a positive learning rate");
      parsed->learning_rate = (float)real;
      return -1;
    case OPTION_ZIPF:
      if (!parse_real(text, 0.0, 10.0, &parsed->zipf_exponent))
        return bad_value("--zipf", text, "an exponent in [0, 10]");
      return -1;
    case OPTION_BACKEND: /* the trainer knows the backends and refuses an unknown one */
      parsed->backend = text;
      return -1;
    case OPTION_FAULT_TOLERANCE:
      if (strcmp(text, "ecrec-2pc") != 0 && strcmp(text, "ecrec") != 0 && strcmp(text, "none") != 0)
        return bad_value("--fault-tolerance", text, "ecrec-2pc, ecrec or none");
      parsed->without_parity = strcmp(text, "none") == 0;
      parsed->two_phase_commit = strcmp(text, "ecrec-2pc") == 0;
      return -1;
    default:
      return apply_count(option, text, parsed, tables);
  }
}

/* Fills the defaults that depend on other flags, and refuses combinations. */
static int resolve(dlrm_options *parsed, const table_flags *tables) {
  if (tables->list_given && (tables->tables_given || tables->rows_given))
    return contradiction("give --tables and --rows, or --table-rows, not both");
  if (!tables->list_given) {
    parsed->table_count =
        tables->tables_given ? (size_t)tables->tables : default_options.table_count;
    uint64_t rows = tables->rows_given ? tables->rows : DEFAULT_ROWS;
    for (size_t t = 0; t < parsed->table_count; t++) parsed->table_rows[t] = rows;
  }
  if (!tables->bottom_given) {
    parsed->bottom[0] = DEFAULT_BOTTOM_HIDDEN;
    parsed->bottom[1] = parsed->dim;
    parsed->bottom_count = 2;
  }
  if (parsed->bottom[parsed->bottom_count - 1] != parsed->dim)
    return contradiction("the bottom MLP's last width must be --dim");
  if (parsed->top[parsed->top_count - 1] != 1)
    return contradiction("the top MLP's last width must be 1 (the click logit)");
  if (parsed->learning_rate == 0.0f) {
    for (size_t i = 0; i < OPTIMIZER_COUNT; i++) {
      if (optimizers[i].kind == parsed->optimizer)
        parsed->learning_rate = optimizers[i].default_rate;
    }
  }
  return -1;
}

int dlrm_options_parse(int argc, char **argv, dlrm_options *parsed) {
  *parsed = default_options;
  table_flags tables = {0};
  int option;
  while ((option = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
    int code = -1;
    switch (option) {
      case OPTION_SYNC:
        parsed->sync = true;
        break;
      case OPTION_CHECK_GRADIENTS:
        parsed->check_gradients = true;
        break;
      case OPTION_QUIET:
        parsed->quiet = true;
        break;
      case OPTION_HELP:
        print_usage(stdout);
        return 0;
      case '?': /* getopt_long has already named the bad flag */
        print_usage(stderr);
        return 2;
      default:
        code = apply_text(option, optarg, parsed, &tables);
    }
    if (code >= 0) return code;
  }
  if (optind < argc) {
    fprintf(stderr, DLRM_PROGRAM ": unexpected argument '%s'\n", argv[optind]);
    print_usage(stderr);
    return 2;
  }
  return resolve(parsed, &tables);
}
