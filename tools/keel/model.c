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
    "       keel model placement --nodes N --replicas K --failed F (Gemini's placement odds)\n"
    "       keel model wasted --measured FILE (wasted time per failure, Gemini's Figure 10)\n"
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
    "                             file (keel run --events): o and r from its job restarts\n"
    "                             (user-level JIT) where it has some, else from its in-process\n"
    "                             recoveries; flags given override them\n"
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
    [INPUT_GPUS] = 1024,      [INPUT_FAILURES] = 2,  [INPUT_PER] = 1000,
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
    case VALUE_COUNT:
      return "a whole number of GPUs, 1 or more";
    case VALUE_RATE:
      return "a number above 0";
    case VALUE_DURATION:
      return "a duration such as 5s, 250ms or 1.5min";
    case VALUE_FRACTION:
      return "a fraction below 1, such as 0.0001 or 0.01%";
  }
  return "a value";
}

/* model_command.h has its contract: model_wasted.c reads its flags with it too. */
const char *keel__model_flag_value(int argc, char **argv, int *index, const char *name,
                                   bool *missing_p) {
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

int keel__model_usage_error_v(const char *command, const char *format, va_list arguments) {
  fprintf(stderr, "%s: ", command);
  vfprintf(stderr, format, arguments);
  fprintf(stderr, " (try %s --help)\n", command);
  return KEEL__EXIT_USAGE;
}

/* Says what is wrong on stderr, once, and returns the usage exit code. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *format, ...) {
  va_list arguments;
  va_start(arguments, format);
  int code = keel__model_usage_error_v("keel model", format, arguments);
  va_end(arguments);
  return code;
}

/* One of the table's numeric flags at argv[*index]: 1 when taken, 0 when argv[*index] is
 * none of them, or -KEEL__EXIT_USAGE (message printed) for a missing or bad value. */
static int parse_numeric_flag(int argc, char **argv, int *index, model_options *options) {
  for (size_t i = 0; i < sizeof flag_specs / sizeof flag_specs[0]; i++) {
    const flag_spec *spec = &flag_specs[i];
    bool missing = false;
    const char *text = keel__model_flag_value(argc, argv, index, spec->name, &missing);
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

/* Reads argv into options (defaults first). 0, or the exit code of a usage error. */
static int parse_options(int argc, char **argv, model_options *options) {
  memcpy(options->values, input_defaults, sizeof options->values);
  for (int index = 1; index < argc; index++) {
    const char *argument = argv[index];
    bool missing = false;
    const char *text;
    if (strcmp(argument, "-h") == 0 || strcmp(argument, "--help") == 0) {
      options->help = true;
    } else if (strcmp(argument, "--json") == 0) {
      options->json = true;
    } else if ((text = keel__model_flag_value(argc, argv, &index, "--sweep", &missing)) != NULL) {
      if (!parse_sweep(text, options))
        return usage_error(
            "--sweep: '%s' is not a list of GPU counts such as 4,1024,8192 (at most %d)", text,
            SWEEP_MAXIMUM);
    } else if (!missing && (text = keel__model_flag_value(argc, argv, &index, "--measured",
                                                          &missing)) != NULL) {
      options->measured_path = text;
    } else if (missing) {
      return usage_error("%s needs a value", argument);
    } else {
      int taken = parse_numeric_flag(argc, argv, &index, options);
      if (taken < 0) return -taken;
      if (taken == 0) return usage_error("unknown flag or argument '%s'", argument);
    }
  }
  return 0;
}

/* Measured values fill the inputs that no flag set, and only those the file has evidence
 * for, the first source listed winning: o needs a restart's save (user-level JIT's own o)
 * or else a recovery that moved state, r a restart or else a recovery, m progress over some
 * steps. */
static void measured_apply(model_options *options) {
  const keel_model_measured *measured = &options->measured;
  struct {
    model_input input;
    size_t evidence;
    double value;
  } fills[] = {
      {INPUT_CHECKPOINT, measured->saved_restarts, measured->jit_save_s},
      {INPUT_CHECKPOINT, measured->state_recoveries, measured->checkpoint_cost_s},
      {INPUT_RESTART, measured->costed_restarts, measured->jit_restart_cost_s},
      {INPUT_RESTART, measured->recoveries, measured->restart_cost_s},
      {INPUT_INPROCESS, measured->recoveries, measured->inprocess_recovery_s},
      {INPUT_MINIBATCH, measured->minibatch_samples, measured->minibatch_s},
  };
  for (size_t i = 0; i < sizeof fills / sizeof fills[0]; i++) {
    if (fills[i].evidence == 0 || options->sources[fills[i].input] != SOURCE_DEFAULT) continue;
    options->values[fills[i].input] = fills[i].value;
    options->sources[fills[i].input] = SOURCE_MEASURED;
  }
}

/* ---- the model */

static double failure_rate(const model_options *options) {
  return options->values[INPUT_FAILURES] / (options->values[INPUT_PER] * SECONDS_PER_DAY);
}

static keel_model_params params_for(const model_options *options, double gpus) {
  return (keel_model_params){.failure_rate = failure_rate(options),
                             .gpu_count = gpus,
                             .checkpoint_cost_s = options->values[INPUT_CHECKPOINT],
                             .restart_cost_s = options->values[INPUT_RESTART],
                             .minibatch_s = options->values[INPUT_MINIBATCH],
                             .jit_overhead = options->values[INPUT_JIT_OVERHEAD],
                             .inprocess_recovery_s = options->values[INPUT_INPROCESS]};
}

/* All policies for gpus GPUs. Flags were validated, so only o = 0 (no periodic optimum)
 * can make a policy fail; any other failure is returned. */
static keel_status evaluate(const model_options *options, double gpus,
                            model_evaluation *evaluation) {
  keel_model_params params = params_for(options, gpus);
  keel_status status = keel_model_params_check(&params);
  if (status != KEEL_OK) return status;
  *evaluation = (model_evaluation){.gpus = gpus};
  evaluation->periodic_status = keel_model_periodic_optimal(&params, &evaluation->optimal);
  evaluation->has_interval = options->values[INPUT_INTERVAL] > 0.0;
  if (evaluation->has_interval &&
      (status = keel_model_periodic_at(&params, options->values[INPUT_INTERVAL],
                                       &evaluation->at_interval)) != KEEL_OK)
    return status;
  if ((status = keel_model_jit_user(&params, &evaluation->user)) != KEEL_OK) return status;
  return keel_model_jit_inprocess(&params, &evaluation->inprocess);
}

/* ---- text */

static const char *source_name(input_source source) {
  switch (source) {
    case SOURCE_FLAG:
      return "flag";
    case SOURCE_MEASURED:
      return "measured";
    case SOURCE_DEFAULT:
      break;
  }
  return "default";
}

/* A human span: "never", "42.0 s", "10.8 min", "2.89 h", "3.5 days". */
static const char *span_text(double seconds, char *text, size_t capacity) {
  if (!isfinite(seconds))
    snprintf(text, capacity, "never");
  else if (seconds < 120.0)
    snprintf(text, capacity, "%.1f s", seconds);
  else if (seconds < 7200.0)
    snprintf(text, capacity, "%.1f min", seconds / 60.0);
  else if (seconds < 2.0 * SECONDS_PER_DAY)
    snprintf(text, capacity, "%.2f h", seconds / 3600.0);
  else
    snprintf(text, capacity, "%.1f days", seconds / SECONDS_PER_DAY);
  return text;
}

static void print_inputs(const model_options *options) {
  const double *v = options->values;
  const input_source *s = options->sources;
  printf("inputs:\n");
  printf("  f     = %.4g failures per GPU-second (%g a day among %g GPUs)\n", failure_rate(options),
         v[INPUT_FAILURES], v[INPUT_PER]);
  printf("  o     = %.4g s, checkpoint cost (%s)\n", v[INPUT_CHECKPOINT],
         source_name(s[INPUT_CHECKPOINT]));
  printf("  r     = %.4g s, restart cost (%s)\n", v[INPUT_RESTART], source_name(s[INPUT_RESTART]));
  printf("  m     = %.4g s, minibatch (%s)\n", v[INPUT_MINIBATCH], source_name(s[INPUT_MINIBATCH]));
  printf("  o_jit = %.4g, JIT steady-state overhead, a fraction of time (%s)\n",
         v[INPUT_JIT_OVERHEAD], source_name(s[INPUT_JIT_OVERHEAD]));
  printf("  in-process recovery = %.4g s (%s%s)\n", v[INPUT_INPROCESS],
         source_name(s[INPUT_INPROCESS]), v[INPUT_INPROCESS] == 0.0 ? ": eq. 8 as printed" : "");
}

static const char *recoveries_word(size_t count) { return count == 1 ? "recovery" : "recoveries"; }
static const char *restarts_word(size_t count) { return count == 1 ? "restart" : "restarts"; }

/* o: a restart's just-in-time save where the file has one, else a recovery's state transfer. */
static void print_measured_checkpoint(const keel_model_measured *m) {
  if (m->saved_restarts > 0)
    printf(
        "  o = %.4g s: mean just-in-time save (the slowest rank's, per failure) over %zu job\n"
        "      %s; the periodic rows use it too: a periodic checkpoint writes the same state\n",
        m->jit_save_s, m->saved_restarts, restarts_word(m->saved_restarts));
  else if (m->state_recoveries > 0)
    printf("  o = %.4g s: mean state transfer of the %zu %s that moved state\n",
           m->checkpoint_cost_s, m->state_recoveries, recoveries_word(m->state_recoveries));
  else
    printf("  o not derived: no restart saved and no recovery moved state (a shrink moves none)\n");
}

/* r: a job restart's cost where the file has one, else keel's in-process recovery's. */
static void print_measured_restart(const keel_model_measured *m) {
  if (m->costed_restarts > 0)
    printf(
        "  r = %.4g s: mean over %zu job %s of the failed process's death to the restored\n"
        "      state, less the save (detect, teardown, respawn, process start, restore)\n",
        m->jit_restart_cost_s, m->costed_restarts, restarts_word(m->costed_restarts));
  else if (m->recoveries > 0)
    printf(
        "  r = %.4g s: mean detect + revoke + agree + rebuild over %zu %s (keel's in-process\n"
        "      recovery; a user-level restart would add process start and data loading)\n",
        m->restart_cost_s, m->recoveries, recoveries_word(m->recoveries));
  else
    printf("  r not derived: no job restart restored its state and no recovery lines\n");
}

/* What each failure made the job do twice, against the model's m/2 (eqs. 7 and 8). */
static void print_measured_redo(const keel_model_measured *m) {
  if (m->redo_restarts > 0)
    printf(
        "  user-level JIT: redo_minibatches %.4g per failure, mean over %zu %s (%zu started\n"
        "      over at step 0); the model charges m/2\n",
        m->restart_redo_minibatches, m->redo_restarts, restarts_word(m->redo_restarts),
        m->started_over);
  if (m->redo_recoveries > 0)
    printf(
        "  in-process JIT: redo_minibatches %.4g per failure, mean over %zu %s; the model\n"
        "      charges m/2\n",
        m->recovery_redo_minibatches, m->redo_recoveries, recoveries_word(m->redo_recoveries));
}

static void print_measured(const model_options *options) {
  const keel_model_measured *m = &options->measured;
  printf("measured from %s: %zu lines read, %zu skipped as malformed, %zu job %s, %zu %s\n",
         options->measured_path, m->lines, m->skipped_lines, m->restarts,
         restarts_word(m->restarts), m->recoveries, recoveries_word(m->recoveries));
  print_measured_checkpoint(m);
  print_measured_restart(m);
  if (m->recoveries > 0) {
    printf(
        "  in-process recovery = %.4g s: detect..rebuild plus state transfer, mean over %zu %s\n",
        m->inprocess_recovery_s, m->recoveries, recoveries_word(m->recoveries));
    printf("  (mean redo %.4g s per recovery; the model charges m/2)\n", m->redo_s);
  }
  print_measured_redo(m);
  if (m->minibatch_samples > 0)
    printf("  m = %.4g s: progress lines over %zu steps\n", m->minibatch_s, m->minibatch_samples);
  else
    printf("  m not derived: no two progress lines of one process in one epoch\n");
  printf(
      "  failures seen: %zu fault lines, %zu failed exits; f is not taken from them (a run's\n"
      "      injected faults say nothing of a cluster's failure rate)\n",
      m->faults, m->failed_exits);
}

static void print_policy_row(const char *name, const keel_model_result *result) {
  char span[32];
  printf("%-32s %10.4g %12s %11.4f%% %11.4f%%\n", name, result->checkpoints_per_hour,
         span_text(result->interval_s, span, sizeof span), 100.0 * result->wasted_per_time,
         100.0 * result->wasted_fraction);
}

static void print_text_single(const model_options *options, const model_evaluation *e) {
  char name[64], span[32];
  printf("keel model: N = %.0f GPUs (JIT checkpointing paper, section 5)\n", e->gpus);
  print_inputs(options);
  if (options->measured_path != NULL) print_measured(options);
  printf("\n%-32s %10s %12s %12s %12s\n", "policy", "ckpt/hour", "interval", "w (eq. 5)",
         "w_f (eq. 6)");
  if (e->periodic_status == KEEL_OK)
    print_policy_row("periodic at c* (eqs. 3-6)", &e->optimal);
  else
    printf("%-32s not evaluated: a checkpoint cost o of 0 has no optimum\n",
           "periodic at c* (eqs. 3-6)");
  if (e->has_interval) {
    snprintf(name, sizeof name, "periodic every %s (eq. 1)",
             span_text(e->at_interval.interval_s, span, sizeof span));
    print_policy_row(name, &e->at_interval);
  }
  print_policy_row("user-level JIT (eq. 7)", &e->user);
  print_policy_row("in-process JIT (eq. 8)", &e->inprocess);
  printf("\n");
  if (e->periodic_status == KEEL_OK)
    printf(
        "c* = %.4g checkpoints per hour is the paper's c* (a frequency, eq. 3); the optimal\n"
        "interval is 1/c* = %.1f s (%s).\n",
        e->optimal.checkpoints_per_hour, e->optimal.interval_s,
        span_text(e->optimal.interval_s, span, sizeof span));
  printf(
      "w: GPU time wasted per GPU-second of useful work; w_f = w / (1 + w): the wasted share.\n"
      "JIT ckpt/hour: user-level JIT saves once per job failure (N f); in-process JIT writes "
      "none.\n");
}

static void print_text_sweep(const model_options *options, const model_evaluation *rows,
                             size_t count) {
  char span[32];
  printf("keel model: sweep over N (like the paper's Table 8; w_f in percent, eq. 6)\n");
  print_inputs(options);
  if (options->measured_path != NULL) print_measured(options);
  printf("\n%10s %10s %12s %13s", "N", "c* (/hour)", "1/c*", "periodic w_f");
  if (count > 0 && rows[0].has_interval) printf(" %15s", "at --interval");
  printf(" %13s %15s\n", "user JIT w_f", "in-proc JIT w_f");
  for (size_t i = 0; i < count; i++) {
    const model_evaluation *e = &rows[i];
    printf("%10.0f", e->gpus);
    if (e->periodic_status == KEEL_OK)
      printf(" %10.4g %12s %12.4f%%", e->optimal.checkpoints_per_hour,
             span_text(e->optimal.interval_s, span, sizeof span),
             100.0 * e->optimal.wasted_fraction);
    else
      printf(" %10s %12s %13s", "-", "-", "- (o = 0)");
    if (e->has_interval) printf(" %14.4f%%", 100.0 * e->at_interval.wasted_fraction);
    printf(" %12.4f%% %14.4f%%\n", 100.0 * e->user.wasted_fraction,
           100.0 * e->inprocess.wasted_fraction);
  }
  printf(
      "\nc* is a frequency (checkpoints per hour, as the paper prints it); 1/c* is the "
      "interval.\n");
}

/* ---- JSON: one object on one line; numbers with 10 significant digits; null where a
 * value does not exist (no optimum, no checkpoint ever) since JSON has no infinity. */

void keel__model_json_key(const char *key, bool *first) {
  printf("%s\"%s\":", *first ? "" : ",", key);
  *first = false;
}

void keel__model_json_number(const char *key, double value, bool *first) {
  keel__model_json_key(key, first);
  if (isfinite(value))
    printf("%.10g", value);
  else
    printf("null");
}

void keel__model_json_count(const char *key, size_t value, bool *first) {
  keel__model_json_key(key, first);
  printf("%zu", value);
}

/* A string value, escaped: a path may hold quotes, backslashes or control characters. */
void keel__model_json_string(const char *key, const char *text, bool *first) {
  keel__model_json_key(key, first);
  putchar('"');
  for (const unsigned char *c = (const unsigned char *)text; *c != '\0'; c++) {
    if (*c == '"' || *c == '\\')
      printf("\\%c", *c);
    else if (*c < 0x20)
      printf("\\u%04x", *c);
    else
      putchar(*c);
  }
  putchar('"');
}

/* One policy. optimal_interval_s is the periodic optimum 1/c* where the policy chooses an
 * interval, null for JIT (it checkpoints on failure, nothing to choose). */
static void json_policy(const char *key, const keel_model_result *result, double optimal_interval_s,
                        bool *first) {
  bool inner = true;
  keel__model_json_key(key, first);
  printf("{");
  keel__model_json_number("interval_s", result->interval_s, &inner);
  keel__model_json_number("optimal_interval_s", optimal_interval_s, &inner);
  keel__model_json_number("checkpoints_per_hour", result->checkpoints_per_hour, &inner);
  keel__model_json_number("wasted_per_time", result->wasted_per_time, &inner);
  keel__model_json_number("wasted_fraction", result->wasted_fraction, &inner);
  keel__model_json_number("wasted_percent", 100.0 * result->wasted_fraction, &inner);
  keel__model_json_key("terms", &inner);
  bool terms = true;
  printf("{");
  keel__model_json_number("checkpoint", result->checkpoint_term, &terms);
  keel__model_json_number("overhead", result->overhead_term, &terms);
  keel__model_json_number("restart", result->restart_term, &terms);
  keel__model_json_number("redo", result->redo_term, &terms);
  printf("}}");
}

static void json_policies(const model_evaluation *e, bool *first) {
  if (e->periodic_status == KEEL_OK) {
    json_policy("periodic_optimal", &e->optimal, e->optimal.interval_s, first);
  } else {
    keel__model_json_key("periodic_optimal", first);
    printf("null");
  }
  if (e->has_interval) {
    double optimum = e->periodic_status == KEEL_OK ? e->optimal.interval_s : INFINITY;
    json_policy("periodic_interval", &e->at_interval, optimum, first);
  }
  json_policy("jit_user", &e->user, INFINITY, first);
  json_policy("jit_inprocess", &e->inprocess, INFINITY, first);
}

static void json_inputs(const model_options *options, bool *first) {
  static const struct {
    const char *key;
    model_input input;
  } named[] = {
      {"checkpoint_cost_s", INPUT_CHECKPOINT},   {"restart_cost_s", INPUT_RESTART},
      {"minibatch_s", INPUT_MINIBATCH},          {"jit_overhead", INPUT_JIT_OVERHEAD},
      {"inprocess_recovery_s", INPUT_INPROCESS},
  };
  bool inner = true, sources = true;
  keel__model_json_key("inputs", first);
  printf("{");
  keel__model_json_number("failure_rate_per_gpu_s", failure_rate(options), &inner);
  keel__model_json_number("failures_per_day", options->values[INPUT_FAILURES], &inner);
  keel__model_json_number("per_gpus", options->values[INPUT_PER], &inner);
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
    keel__model_json_number(named[i].key, options->values[named[i].input], &inner);
  double interval = options->values[INPUT_INTERVAL];
  keel__model_json_number("interval_s", interval > 0.0 ? interval : INFINITY, &inner);
  keel__model_json_key("sources", &inner);
  printf("{");
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
    keel__model_json_string(named[i].key, source_name(options->sources[named[i].input]), &sources);
  printf("}}");
}

static void json_measured(const model_options *options, bool *first) {
  const keel_model_measured *m = &options->measured;
  bool inner = true;
  keel__model_json_key("measured", first);
  printf("{");
  keel__model_json_string("path", options->measured_path, &inner);
  keel__model_json_count("lines", m->lines, &inner);
  keel__model_json_count("skipped_lines", m->skipped_lines, &inner);
  keel__model_json_count("recoveries", m->recoveries, &inner);
  keel__model_json_count("state_recoveries", m->state_recoveries, &inner);
  keel__model_json_number("checkpoint_cost_s",
                          m->state_recoveries > 0 ? m->checkpoint_cost_s : INFINITY, &inner);
  keel__model_json_number("restart_cost_s", m->recoveries > 0 ? m->restart_cost_s : INFINITY,
                          &inner);
  keel__model_json_number("inprocess_recovery_s",
                          m->recoveries > 0 ? m->inprocess_recovery_s : INFINITY, &inner);
  keel__model_json_number("redo_s", m->recoveries > 0 ? m->redo_s : INFINITY, &inner);
  keel__model_json_count("minibatch_steps", m->minibatch_samples, &inner);
  keel__model_json_number("minibatch_s", m->minibatch_samples > 0 ? m->minibatch_s : INFINITY,
                          &inner);
  keel__model_json_count("faults", m->faults, &inner);
  keel__model_json_count("failed_exits", m->failed_exits, &inner);
  keel__model_json_count("redo_recoveries", m->redo_recoveries, &inner);
  keel__model_json_number("recovery_redo_minibatches",
                          m->redo_recoveries > 0 ? m->recovery_redo_minibatches : INFINITY, &inner);
  keel__model_json_count("restarts", m->restarts, &inner);
  keel__model_json_count("saved_restarts", m->saved_restarts, &inner);
  keel__model_json_number("jit_save_s", m->saved_restarts > 0 ? m->jit_save_s : INFINITY, &inner);
  keel__model_json_count("costed_restarts", m->costed_restarts, &inner);
  keel__model_json_number("jit_restart_cost_s",
                          m->costed_restarts > 0 ? m->jit_restart_cost_s : INFINITY, &inner);
  keel__model_json_count("redo_restarts", m->redo_restarts, &inner);
  keel__model_json_number("restart_redo_minibatches",
                          m->redo_restarts > 0 ? m->restart_redo_minibatches : INFINITY, &inner);
  keel__model_json_count("started_over", m->started_over, &inner);
  printf("}");
}

static void print_json(const model_options *options, const model_evaluation *rows, size_t count,
                       bool sweep) {
  bool first = true;
  printf("{");
  json_inputs(options, &first);
  if (options->measured_path != NULL) json_measured(options, &first);
  if (!sweep) {
    keel__model_json_number("gpus", rows[0].gpus, &first);
    json_policies(&rows[0], &first);
  } else {
    keel__model_json_key("rows", &first);
    printf("[");
    for (size_t i = 0; i < count; i++) {
      bool row = true;
      printf("%s{", i == 0 ? "" : ",");
      keel__model_json_number("gpus", rows[i].gpus, &row);
      json_policies(&rows[i], &row);
      printf("}");
    }
    printf("]");
  }
  printf("}\n");
}

/* ---- the command */

int keel__command_model(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "placement") == 0)
    return keel__command_model_placement(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "wasted") == 0)
    return keel__command_model_wasted(argc - 1, argv + 1);
  model_options options = {0};
  int code = parse_options(argc, argv, &options);
  if (code != 0) return code;
  if (options.help) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (options.measured_path != NULL) {
    keel_status status = keel_model_measure_file(options.measured_path, &options.measured);
    if (status != KEEL_OK) {
      fprintf(stderr, "keel model: cannot read %s: %s\n", options.measured_path,
              keel_strerror(status));
      return KEEL__EXIT_FAILURE;
    }
    measured_apply(&options);
  }
  bool sweep = options.sweep_count > 0;
  size_t count = sweep ? options.sweep_count : 1;
  model_evaluation rows[SWEEP_MAXIMUM];
  for (size_t i = 0; i < count; i++) {
    double gpus = sweep ? options.sweep[i] : options.values[INPUT_GPUS];
    keel_status status = evaluate(&options, gpus, &rows[i]);
    if (status != KEEL_OK) {
      fprintf(stderr, "keel model: the inputs are out of the model's range: %s\n",
              keel_strerror(status));
      return KEEL__EXIT_USAGE;
    }
  }
  if (options.json)
    print_json(&options, rows, count, sweep);
  else if (sweep)
    print_text_sweep(&options, rows, count);
  else
    print_text_single(&options, &rows[0]);
  return fflush(stdout) == 0 ? 0 : KEEL__EXIT_FAILURE;
}
