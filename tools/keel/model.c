/* `keel model`: the JIT checkpointing paper's analytical model (§5) from human-typed inputs,
 * or from what a keel run measured (--measured events.jsonl). Prints each policy's waste, a
 * Table 8-like sweep over N, or one JSON object; the arithmetic is libkeel's src/model. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/model.h"
#include "model_command.h"
#include "tool.h"

#define SECONDS_PER_DAY 86400.0
#define SWEEP_MAXIMUM 64
#define GPU_MAXIMUM 1000000000

static const char usage_text[] =
    "usage: keel model [flags]\n"
    "\n"
    "The wasted-GPU-time model of the JIT checkpointing paper (section 5): periodic\n"
    "checkpoints at the optimal frequency c* = sqrt(N f / 2o) (eq. 3) or at --interval\n"
    "(eq. 1), user-level JIT (eq. 7) and in-process JIT (eq. 8). For each it prints\n"
    "w, wasted GPU time per GPU-second of useful work (eq. 5), and w_f = w / (1 + w), the\n"
    "wasted share of all GPU time (eq. 6). c* is a frequency (checkpoints per hour, as the\n"
    "paper prints it); the interval between checkpoints is 1/c*. Both are printed.\n"
    "\n"
    "inputs (defaults: the paper's BERT-L-PT example, section 6.5):\n"
    "  --gpus N                   GPUs in the job (default 1024)\n"
    "  --failures-per-day X       failures a day ... (default 2)\n"
    "  --per G                    ... among G GPUs; f = X / (G * 86400 s) (default 1000)\n"
    "  --ckpt-cost DURATION       o, one checkpoint's stall (default 5s; also --checkpoint-cost)\n"
    "  --restart-cost DURATION    r, fixed cost of a recovery: restore, init (default 9.9s)\n"
    "  --minibatch DURATION       m, one minibatch (default 0.418s)\n"
    "  --jit-overhead FRACTION    o_jit, JIT's steady-state cost: 0.0001 or 0.01% (default 0)\n"
    "  --inprocess-recovery DURATION\n"
    "                             fixed cost of an in-process recovery, charged N f per\n"
    "                             second in eq. 8 (default 0: eq. 8 as printed)\n"
    "  --interval DURATION        also evaluate periodic checkpoints every DURATION (eq. 1)\n"
    "  --measured FILE            take o, r, m and the in-process cost from a keel events\n"
    "                             file (keel run --events); flags given override them\n"
    "output:\n"
    "  --sweep N,N,...            one row per GPU count, like the paper's Table 8\n"
    "  --json                     one JSON object instead of text\n"
    "  -h, --help                 this text\n"
    "Durations: 5s, 250ms, 1.5min, 2h; bare numbers are seconds.\n";

/* The numeric inputs, indexed so that flags, defaults and sources share one table. */
typedef enum model_input {
  INPUT_GPUS,
  INPUT_FAILURES,
  INPUT_PER,
  INPUT_CHECKPOINT,
  INPUT_RESTART,
  INPUT_MINIBATCH,
  INPUT_JIT_OVERHEAD,
  INPUT_INPROCESS,
  INPUT_INTERVAL,
  INPUT_COUNT
} model_input;

typedef enum value_kind { VALUE_COUNT, VALUE_RATE, VALUE_DURATION, VALUE_FRACTION } value_kind;

typedef enum input_source { SOURCE_DEFAULT, SOURCE_FLAG, SOURCE_MEASURED } input_source;

typedef struct flag_spec {
  const char *name;
  value_kind kind;
  model_input input;
} flag_spec;

static const flag_spec flag_specs[] = {
    {"--gpus", VALUE_COUNT, INPUT_GPUS},
    {"--failures-per-day", VALUE_RATE, INPUT_FAILURES},
    {"--per", VALUE_RATE, INPUT_PER},
    {"--ckpt-cost", VALUE_DURATION, INPUT_CHECKPOINT},
    {"--checkpoint-cost", VALUE_DURATION, INPUT_CHECKPOINT},
    {"--restart-cost", VALUE_DURATION, INPUT_RESTART},
    {"--minibatch", VALUE_DURATION, INPUT_MINIBATCH},
    {"--jit-overhead", VALUE_FRACTION, INPUT_JIT_OVERHEAD},
    {"--inprocess-recovery", VALUE_DURATION, INPUT_INPROCESS},
    {"--interval", VALUE_DURATION, INPUT_INTERVAL},
};

/* Table 4 of the paper for BERT-L-PT, and §6.5's 2 failures a day on ~1000 GPUs. The
 * interval 0 means "not asked for". */
static const double input_defaults[INPUT_COUNT] = {
    [INPUT_GPUS] = 1024, [INPUT_FAILURES] = 2,     [INPUT_PER] = 1000,
    [INPUT_CHECKPOINT] = 5.0, [INPUT_RESTART] = 9.9, [INPUT_MINIBATCH] = 0.418,
};

typedef struct model_options {
  double values[INPUT_COUNT];
  input_source sources[INPUT_COUNT];
  double sweep[SWEEP_MAXIMUM];
  size_t sweep_count;
  const char *measured_path;
  keel_model_measured measured;
  bool json;
  bool help;
} model_options;

/* What the four policies give for one N. A periodic status other than KEEL_OK means o = 0. */
typedef struct model_evaluation {
  double gpus;
  keel_status periodic_status;
  keel_model_result optimal;
  bool has_interval;
  keel_model_result at_interval;
  keel_model_result user;
  keel_model_result inprocess;
} model_evaluation;

/* ---- flags */

static bool text_is_decimal(const char *text) {
  return (*text >= '0' && *text <= '9') || (*text == '.' && text[1] >= '0' && text[1] <= '9');
}

/* A plain non-negative decimal, the whole text; strtod alone would take "inf" and "0x1p3". */
static bool parse_number(const char *text, double *value_p) {
  if (!text_is_decimal(text)) return false;
  char *end = NULL;
  double value = strtod(text, &end);
  if (*end != '\0' || !isfinite(value)) return false;
  *value_p = value;
  return true;
}

/* A fraction of time, "0.0076" or "0.76%", in [0, 1). */
static bool parse_fraction(const char *text, double *value_p) {
  char copy[64];
  size_t length = strlen(text);
  if (length == 0 || length >= sizeof copy) return false;
  memcpy(copy, text, length + 1);
  double scale = 1.0;
  if (copy[length - 1] == '%') {
    copy[length - 1] = '\0';
    scale = 0.01;
  }
  double value;
  if (!parse_number(copy, &value) || !(value * scale < 1.0)) return false;
  *value_p = value * scale;
  return true;
}

static bool parse_value(value_kind kind, const char *text, double *value_p) {
  int64_t count, nanoseconds;
  double value;
  switch (kind) {
    case VALUE_COUNT:
      if (keel_parse_int(text, 1, GPU_MAXIMUM, &count) != KEEL_OK) return false;
      *value_p = (double)count;
      return true;
    case VALUE_RATE:
      if (!parse_number(text, &value) || !(value > 0.0)) return false;
      *value_p = value;
      return true;
    case VALUE_DURATION:
      if (keel_parse_duration_ns(text, &nanoseconds) != KEEL_OK || nanoseconds < 0) return false;
      *value_p = (double)nanoseconds / 1e9;
      return true;
    case VALUE_FRACTION:
      return parse_fraction(text, value_p);
  }
  return false;
}

static const char *kind_expects(value_kind kind) {
  switch (kind) {
    case VALUE_COUNT: return "a whole number of GPUs, 1 or more";
    case VALUE_RATE: return "a number above 0";
    case VALUE_DURATION: return "a duration such as 5s, 250ms or 1.5min";
    case VALUE_FRACTION: return "a fraction below 1, such as 0.0001 or 0.01%";
  }
  return "a value";
}

/* "--name value" or "--name=value" at argv[*index]; moves *index past a separate value.
 * Returns the value, NULL when argv[*index] is another flag; *missing_p when it is this
 * flag without a value. */
static const char *flag_value(int argc, char **argv, int *index, const char *name, bool *missing_p) {
  const char *argument = argv[*index];
  size_t length = strlen(name);
  if (strncmp(argument, name, length) != 0) return NULL;
  if (argument[length] == '=') return argument + length + 1;
  if (argument[length] != '\0') return NULL;
  if (*index + 1 >= argc) {
    *missing_p = true;
    return NULL;
  }
  *index += 1;
  return argv[*index];
}

/* "4,64,1024": GPU counts, at most SWEEP_MAXIMUM of them. */
static bool parse_sweep(const char *text, model_options *options) {
  char item[32];
  options->sweep_count = 0;
  while (*text != '\0') {
    size_t length = strcspn(text, ",");
    if (length == 0 || length >= sizeof item || options->sweep_count == SWEEP_MAXIMUM) return false;
    memcpy(item, text, length);
    item[length] = '\0';
    if (!parse_value(VALUE_COUNT, item, &options->sweep[options->sweep_count])) return false;
    options->sweep_count++;
    text += length;
    if (*text == ',' && *++text == '\0') return false;
  }
  return options->sweep_count > 0;
}

/* Says what is wrong on stderr, once, and returns the usage exit code. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *format, ...) {
  va_list arguments;
  va_start(arguments, format);
  fputs("keel model: ", stderr);
  vfprintf(stderr, format, arguments);
  fputs(" (try keel model --help)\n", stderr);
  va_end(arguments);
  return KEEL__EXIT_USAGE;
}

/* One of the table's numeric flags at argv[*index]: 1 when taken, 0 when argv[*index] is
 * none of them, or -KEEL__EXIT_USAGE (message printed) for a missing or bad value. */
static int parse_numeric_flag(int argc, char **argv, int *index, model_options *options) {
  for (size_t i = 0; i < sizeof flag_specs / sizeof flag_specs[0]; i++) {
    const flag_spec *spec = &flag_specs[i];
    bool missing = false;
    const char *text = flag_value(argc, argv, index, spec->name, &missing);
    if (missing) return -usage_error("%s needs a value: %s", spec->name, kind_expects(spec->kind));
    if (text == NULL) continue;
    double value;
    /* An interval of 0 would mean infinitely many checkpoints. */
    if (!parse_value(spec->kind, text, &value) || (spec->input == INPUT_INTERVAL && !(value > 0.0)))
      return -usage_error("%s: '%s' is not %s%s", spec->name, text, kind_expects(spec->kind),
                          spec->input == INPUT_INTERVAL ? " above 0" : "");
    options->values[spec->input] = value;
    options->sources[spec->input] = SOURCE_FLAG;
    return 1;
  }
  return 0;
}
