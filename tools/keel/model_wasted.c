/* `keel model wasted`: Gemini's Figure 10, wasted time per failure (lost work + retrieval)
 * of keel's in-memory snapshots against a periodic disk checkpoint, with the iteration
 * time, snapshot interval, state size, restore times and disk speed a run's events measured
 * (src/model/measured.c); flags give or override each. The arithmetic is src/model/wasted.c. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "keel/model.h"
#include "model_command.h"
#include "tool.h"

#define DEFAULT_DISK_INTERVAL_S 1800.0
#define EVERY_MAXIMUM 1000000000

static const char wasted_usage[] =
    "usage: keel model wasted --measured FILE [--disk-interval 30m] [--every N]\n"
    "                         [--disk-read-speed SIZE] [--iteration DURATION]\n"
    "                         [--state-bytes SIZE] [--memory-restore DURATION] [--json]\n"
    "\n"
    "Wasted time per failure = lost work + retrieval (Gemini, Figure 10), for in-memory\n"
    "snapshots every E iterations of m seconds against a disk checkpoint every T:\n"
    "  in memory: lost work E m / 2 on average (a failure falls uniformly between two\n"
    "             snapshots), 2 E m at worst (the job may go back one snapshot more when the\n"
    "             lost rank died inside a collective); retrieval: the restore from memory\n"
    "  disk:      lost work T / 2 on average, T at worst; retrieval: the state's bytes at\n"
    "             the disk's read speed\n"
    "and how many times more the disk wastes. The inputs come from the events file of a\n"
    "`keel run --ckpt mem --events FILE` (docs/MEMORY.md); a flag gives or overrides each:\n"
    "  --measured FILE            the events file (required)\n"
    "  --iteration DURATION       m (else its progress lines)\n"
    "  --every N                  E (else two mem_save lines of one process; else 1)\n"
    "  --state-bytes SIZE         one rank's state (else the largest mem_save bytes)\n"
    "  --memory-restore DURATION  the restore from memory (else the mean mem_restore from\n"
    "                             local or node-<i>; else the mean snapshot copy, save_ms)\n"
    "  --disk-interval DURATION   T (default 30m)\n"
    "  --disk-read-speed SIZE     per second, one rank's, e.g. 2GiB (else bytes over time of\n"
    "                             the restores from persistent; else the write speed of\n"
    "                             mem_service_end, persisted_bytes over persist_ms)\n"
    "  --json                     one JSON object instead of text\n"
    "  -h, --help                 this text\n"
    "Durations: 250ms, 5s, 30m, 1.5h; sizes: 4096, 64KiB, 2GiB.\n";

typedef enum wasted_input {
  INPUT_ITERATION,
  INPUT_EVERY,
  INPUT_STATE_BYTES,
  INPUT_MEMORY_RESTORE,
  INPUT_DISK_INTERVAL,
  INPUT_DISK_READ_SPEED,
  INPUT_COUNT
} wasted_input;

typedef enum value_kind { VALUE_DURATION, VALUE_STEPS, VALUE_SIZE, VALUE_SPEED } value_kind;

typedef struct input_spec {
  const char *flag;
  value_kind kind;
  bool may_be_zero; /* a restore may take no measurable time; an iteration may not */
  const char *json_key;
  const char *missing; /* what the file lacks when no source gave it */
} input_spec;

static const input_spec input_specs[INPUT_COUNT] = {
    [INPUT_ITERATION] = {"--iteration", VALUE_DURATION, false, "iteration_s",
                         "the iteration time: no two progress lines of one process in one "
                         "epoch"},
    [INPUT_EVERY] = {"--every", VALUE_STEPS, false, "every_steps", NULL},
    [INPUT_STATE_BYTES] = {"--state-bytes", VALUE_SIZE, false, "state_bytes",
                           "the state's size: no mem_save or mem_restore lines (was the run "
                           "--ckpt mem?)"},
    [INPUT_MEMORY_RESTORE] = {"--memory-restore", VALUE_DURATION, true, "memory_retrieval_s",
                              "the restore time from memory: no mem_save lines and no "
                              "mem_restore from memory (was the run --ckpt mem?)"},
    [INPUT_DISK_INTERVAL] = {"--disk-interval", VALUE_DURATION, false, "disk_interval_s", NULL},
    [INPUT_DISK_READ_SPEED] = {"--disk-read-speed", VALUE_SPEED, false, "disk_read_bytes_per_s",
                               "the disk's speed: no restore from persistent and no "
                               "mem_service_end that persisted bytes (--ckpt-persist-every)"},
};

/* One input's value and where it came from. */
typedef struct input_value {
  bool known;
  double value;
  const char *source; /* JSON: "given", "measured", "save time", "write speed", "default" */
  char note[96];      /* text: "measured, 4 restores" */
} input_value;

typedef struct wasted_options {
  input_value inputs[INPUT_COUNT];
  const char *measured_path;
  keel_model_measured measured;
  bool json;
  bool help;
} wasted_options;

/* ---- flags */

/* "2GiB" or "2GiB/s": a size per second. */
static keel_status parse_speed(const char *text, uint64_t *size_p) {
  char copy[64];
  size_t length = strlen(text);
  if (length >= sizeof copy) return KEEL_EINVAL;
  memcpy(copy, text, length + 1);
  if (length > 2 && strcmp(copy + length - 2, "/s") == 0) copy[length - 2] = '\0';
  return keel_parse_size(copy, size_p);
}

static bool parse_value(const input_spec *spec, const char *text, double *value_p) {
  int64_t nanoseconds, steps;
  uint64_t size;
  double value = 0.0;
  switch (spec->kind) {
    case VALUE_DURATION:
      if (keel_parse_duration_ns(text, &nanoseconds) != KEEL_OK || nanoseconds < 0) return false;
      value = (double)nanoseconds / 1e9;
      break;
    case VALUE_STEPS:
      if (keel_parse_int(text, 1, EVERY_MAXIMUM, &steps) != KEEL_OK) return false;
      value = (double)steps;
      break;
    case VALUE_SIZE:
    case VALUE_SPEED:
      if ((spec->kind == VALUE_SIZE ? keel_parse_size(text, &size) : parse_speed(text, &size)) !=
          KEEL_OK)
        return false;
      value = (double)size;
      break;
  }
  if (!spec->may_be_zero && !(value > 0.0)) return false;
  *value_p = value;
  return true;
}

static const char *kind_expects(value_kind kind) {
  switch (kind) {
    case VALUE_DURATION:
      return "a duration such as 250ms, 5s or 30m";
    case VALUE_STEPS:
      return "a whole number of iterations, 1 or more";
    case VALUE_SIZE:
      return "a size such as 800000, 64KiB or 2GiB";
    case VALUE_SPEED:
      return "a size per second such as 500MiB or 2GiB";
  }
  return "a value";
}

/* Says what is wrong on stderr, once, and returns the usage exit code. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *format, ...) {
  va_list arguments;
  va_start(arguments, format);
  int code = keel__model_usage_error_v("keel model wasted", format, arguments);
  va_end(arguments);
  return code;
}

/* One of the inputs' flags at argv[*index]: 1 when taken, 0 when it is none of them, or
 * -KEEL__EXIT_USAGE (message printed) for a missing or bad value. */
static int parse_input_flag(int argc, char **argv, int *index, wasted_options *options) {
  for (int i = 0; i < INPUT_COUNT; i++) {
    const input_spec *spec = &input_specs[i];
    bool missing = false;
    const char *text = keel__model_flag_value(argc, argv, index, spec->flag, &missing);
    if (missing) return -usage_error("%s needs a value: %s", spec->flag, kind_expects(spec->kind));
    if (text == NULL) continue;
    input_value *input = &options->inputs[i];
    if (!parse_value(spec, text, &input->value))
      return -usage_error("%s: '%s' is not %s%s", spec->flag, text, kind_expects(spec->kind),
                          spec->may_be_zero || spec->kind == VALUE_STEPS ? "" : ", above 0");
    input->known = true;
    input->source = "given";
    snprintf(input->note, sizeof input->note, "given");
    return 1;
  }
  return 0;
}

/* Reads argv into options. 0, or the exit code of a usage error. */
static int parse_options(int argc, char **argv, wasted_options *options) {
  for (int index = 1; index < argc; index++) {
    const char *argument = argv[index];
    bool missing = false;
    const char *text;
    if (strcmp(argument, "-h") == 0 || strcmp(argument, "--help") == 0) {
      options->help = true;
    } else if (strcmp(argument, "--json") == 0) {
      options->json = true;
    } else if ((text = keel__model_flag_value(argc, argv, &index, "--measured", &missing)) !=
               NULL) {
      options->measured_path = text;
    } else if (missing) {
      return usage_error("--measured needs a value: an events file (keel run --events)");
    } else {
      int taken = parse_input_flag(argc, argv, &index, options);
      if (taken < 0) return -taken;
      if (taken == 0) return usage_error("unknown flag or argument '%s'", argument);
    }
  }
  if (!options->help && options->measured_path == NULL)
    return usage_error("--measured FILE is required: the events file of a keel run --ckpt mem");
  return 0;
}

/* ---- the inputs the file gives */

/* A source of an input, the first of an input's with evidence winning. noun NULL: the note
 * counts nothing. */
typedef struct input_source {
  wasted_input input;
  size_t evidence;
  double value;
  const char *source;
  const char *label;
  const char *noun, *nouns;
} input_source;

static void input_take(input_value *input, const input_source *source) {
  input->known = true;
  input->value = source->value;
  input->source = source->source;
  if (source->noun == NULL)
    snprintf(input->note, sizeof input->note, "%s", source->label);
  else
    snprintf(input->note, sizeof input->note, "%s, %zu %s", source->label, source->evidence,
             source->evidence == 1 ? source->noun : source->nouns);
}

/* Fills the inputs no flag gave from what the file measured, where it has evidence. */
static void measured_apply(wasted_options *options) {
  const keel_model_measured *m = &options->measured;
  bool every_seen = m->mem_every_steps > 0, speed_seen = m->disk_read_bytes_per_s > 0.0;
  bool written = m->persist_s > 0.0 && m->persisted_bytes > 0;
  const input_source sources[] = {
      {INPUT_ITERATION, m->minibatch_samples, m->minibatch_s, "measured", "measured", "step",
       "steps"},
      {INPUT_EVERY, every_seen ? m->mem_saves : 0, (double)m->mem_every_steps, "measured",
       "measured", "mem_save line", "mem_save lines"},
      {INPUT_EVERY, 1, 1.0, "default", "keel's default", NULL, NULL},
      {INPUT_STATE_BYTES, m->mem_state_bytes > 0 ? m->mem_saves : 0, (double)m->mem_state_bytes,
       "measured", "measured", "mem_save line", "mem_save lines"},
      {INPUT_STATE_BYTES, m->mem_state_bytes > 0 ? m->memory_restores + m->disk_restores : 0,
       (double)m->mem_state_bytes, "measured", "measured", "mem_restore line", "mem_restore lines"},
      {INPUT_MEMORY_RESTORE, m->memory_restores, m->memory_restore_s, "measured", "measured",
       "restore", "restores"},
      {INPUT_MEMORY_RESTORE, m->mem_saves, m->mem_save_s, "save time", "from the save time", "save",
       "saves"},
      {INPUT_DISK_INTERVAL, 1, DEFAULT_DISK_INTERVAL_S, "default", "default", NULL, NULL},
      {INPUT_DISK_READ_SPEED, speed_seen ? m->disk_restores : 0, m->disk_read_bytes_per_s,
       "measured", "measured", "restore", "restores"},
      {INPUT_DISK_READ_SPEED, written ? m->mem_services : 0,
       (double)m->persisted_bytes / (written ? m->persist_s : 1.0), "write speed",
       "from the write speed", "node", "nodes"},
  };
  for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
    input_value *input = &options->inputs[sources[i].input];
    if (!input->known && sources[i].evidence > 0) input_take(input, &sources[i]);
  }
}

/* Says on stderr what each input that is still unknown lacks and which flag gives it;
 * false when one is. */
static bool inputs_complete(const wasted_options *options) {
  bool complete = true;
  for (int i = 0; i < INPUT_COUNT; i++) {
    if (options->inputs[i].known) continue;
    const input_spec *spec = &input_specs[i];
    fprintf(stderr, "keel model wasted: %s lacks %s; %s gives it (%s)\n", options->measured_path,
            spec->missing, spec->flag, kind_expects(spec->kind));
    complete = false;
  }
  return complete;
}

/* ---- text */

/* "0.192 ms", "45.1 ms", "2.5 s", "15.0 min", "2.50 h", "3.1 days". */
static const char *duration_text(double seconds, char *text, size_t capacity) {
  if (seconds < 1.0)
    snprintf(text, capacity, "%.3g ms", seconds * 1e3);
  else if (seconds < 120.0)
    snprintf(text, capacity, "%.3g s", seconds);
  else if (seconds < 7200.0)
    snprintf(text, capacity, "%.1f min", seconds / 60.0);
  else if (seconds < 2.0 * 86400.0)
    snprintf(text, capacity, "%.2f h", seconds / 3600.0);
  else
    snprintf(text, capacity, "%.1f days", seconds / 86400.0);
  return text;
}

/* "800008 B", "781.3 KiB", "61.5 MiB". */
static const char *size_text(double bytes, char *text, size_t capacity) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024.0) {
    snprintf(text, capacity, "%.0f B", bytes);
    return text;
  }
  size_t unit = 0;
  for (bytes /= 1024.0; bytes >= 1024.0 && unit + 1 < sizeof units / sizeof units[0]; unit++)
    bytes /= 1024.0;
  snprintf(text, capacity, "%.1f %s", bytes, units[unit]);
  return text;
}

static const char *ratio_text(double ratio, char *text, size_t capacity) {
  snprintf(text, capacity, ratio >= 10.0 ? "%.0fx" : "%.2fx", ratio);
  return text;
}

/* "lost work 45.1 ms mean, 180 ms worst; retrieval 2.52 ms (...); total ..." */
static void print_policy(const char *name, const keel_model_wasted_policy *policy,
                         const char *retrieval_note) {
  char mean[32], worst[32], retrieval[32], total_mean[32], total_worst[32];
  printf("%s: lost work %s mean, %s worst; retrieval %s (%s); total %s mean, %s worst\n", name,
         duration_text(policy->lost_mean_s, mean, sizeof mean),
         duration_text(policy->lost_worst_s, worst, sizeof worst),
         duration_text(policy->retrieval_s, retrieval, sizeof retrieval), retrieval_note,
         duration_text(policy->total_mean_s, total_mean, sizeof total_mean),
         duration_text(policy->total_worst_s, total_worst, sizeof total_worst));
}

static void print_text(const wasted_options *options, const keel_model_wasted *wasted) {
  const input_value *in = options->inputs;
  const keel_model_measured *m = &options->measured;
  char span[32], name[64], note[320], bytes[32], speed[32], mean[32], worst[32];
  double every = in[INPUT_EVERY].value;
  printf("keel model wasted: wasted time per failure = lost work + retrieval (Gemini, Fig. 10)\n");
  printf("measured from %s: %zu lines read, %zu skipped as malformed\n", options->measured_path,
         m->lines, m->skipped_lines);
  printf("  iteration m = %s (%s)\n", duration_text(in[INPUT_ITERATION].value, span, sizeof span),
         in[INPUT_ITERATION].note);
  printf("  in-memory snapshot every E = %.0f %s (%s)\n", every,
         every == 1.0 ? "iteration" : "iterations", in[INPUT_EVERY].note);
  printf("  disk checkpoint every T = %s (%s)\n",
         duration_text(in[INPUT_DISK_INTERVAL].value, span, sizeof span),
         in[INPUT_DISK_INTERVAL].note);
  snprintf(name, sizeof name, "in memory (every %s)",
           duration_text(wasted->memory.interval_s, span, sizeof span));
  print_policy(name, &wasted->memory, in[INPUT_MEMORY_RESTORE].note);
  snprintf(note, sizeof note, "%s at %s/s; size %s; speed %s",
           size_text(in[INPUT_STATE_BYTES].value, bytes, sizeof bytes),
           size_text(in[INPUT_DISK_READ_SPEED].value, speed, sizeof speed),
           in[INPUT_STATE_BYTES].note, in[INPUT_DISK_READ_SPEED].note);
  snprintf(name, sizeof name, "disk (every %s)",
           duration_text(wasted->disk.interval_s, span, sizeof span));
  print_policy(name, &wasted->disk, note);
  printf("disk / memory: %s the wasted time per failure on average, %s at worst\n",
         ratio_text(wasted->ratio_mean, mean, sizeof mean),
         ratio_text(wasted->ratio_worst, worst, sizeof worst));
}

/* ---- JSON: one object on one line; null for a mean of nothing */

static double known_if(size_t count, double value) { return count > 0 ? value : INFINITY; }

static void json_measured(const wasted_options *options, bool *first) {
  const keel_model_measured *m = &options->measured;
  bool inner = true;
  keel__model_json_key("measured", first);
  printf("{");
  keel__model_json_string("path", options->measured_path, &inner);
  keel__model_json_count("lines", m->lines, &inner);
  keel__model_json_count("skipped_lines", m->skipped_lines, &inner);
  keel__model_json_count("minibatch_steps", m->minibatch_samples, &inner);
  keel__model_json_number("minibatch_s", known_if(m->minibatch_samples, m->minibatch_s), &inner);
  keel__model_json_count("mem_saves", m->mem_saves, &inner);
  keel__model_json_count("mem_state_bytes", (size_t)m->mem_state_bytes, &inner);
  keel__model_json_number("mem_save_s", known_if(m->mem_saves, m->mem_save_s), &inner);
  keel__model_json_number("mem_wait_s", known_if(m->mem_saves, m->mem_wait_s), &inner);
  keel__model_json_count("mem_every_steps", (size_t)m->mem_every_steps, &inner);
  keel__model_json_count("memory_restores", m->memory_restores, &inner);
  keel__model_json_number("memory_restore_s", known_if(m->memory_restores, m->memory_restore_s),
                          &inner);
  keel__model_json_number("memory_restore_bytes",
                          known_if(m->memory_restores, m->memory_restore_bytes), &inner);
  keel__model_json_count("disk_restores", m->disk_restores, &inner);
  keel__model_json_number("disk_restore_s", known_if(m->disk_restores, m->disk_restore_s), &inner);
  keel__model_json_number("disk_read_bytes_per_s",
                          m->disk_read_bytes_per_s > 0.0 ? m->disk_read_bytes_per_s : INFINITY,
                          &inner);
  keel__model_json_count("mem_services", m->mem_services, &inner);
  keel__model_json_count("persisted_bytes", (size_t)m->persisted_bytes, &inner);
  keel__model_json_number("persist_s", known_if(m->mem_services, m->persist_s), &inner);
  printf("}");
}

static void json_inputs(const wasted_options *options, bool *first) {
  bool inner = true, sources = true;
  keel__model_json_key("inputs", first);
  printf("{");
  for (int i = 0; i < INPUT_COUNT; i++)
    keel__model_json_number(input_specs[i].json_key, options->inputs[i].value, &inner);
  keel__model_json_key("sources", &inner);
  printf("{");
  for (int i = 0; i < INPUT_COUNT; i++)
    keel__model_json_string(input_specs[i].json_key, options->inputs[i].source, &sources);
  printf("}}");
}

static void json_policy(const char *key, const keel_model_wasted_policy *policy, bool *first) {
  bool inner = true;
  keel__model_json_key(key, first);
  printf("{");
  keel__model_json_number("interval_s", policy->interval_s, &inner);
  keel__model_json_number("lost_mean_s", policy->lost_mean_s, &inner);
  keel__model_json_number("lost_worst_s", policy->lost_worst_s, &inner);
  keel__model_json_number("retrieval_s", policy->retrieval_s, &inner);
  keel__model_json_number("total_mean_s", policy->total_mean_s, &inner);
  keel__model_json_number("total_worst_s", policy->total_worst_s, &inner);
  printf("}");
}

static void print_json(const wasted_options *options, const keel_model_wasted *wasted) {
  bool first = true;
  printf("{");
  json_measured(options, &first);
  json_inputs(options, &first);
  json_policy("memory", &wasted->memory, &first);
  json_policy("disk", &wasted->disk, &first);
  keel__model_json_number("ratio_mean", wasted->ratio_mean, &first);
  keel__model_json_number("ratio_worst", wasted->ratio_worst, &first);
  printf("}\n");
}

/* ---- the command */

static keel_model_wasted_params params_from(const wasted_options *options) {
  const input_value *in = options->inputs;
  return (keel_model_wasted_params){.iteration_s = in[INPUT_ITERATION].value,
                                    .every_steps = in[INPUT_EVERY].value,
                                    .memory_retrieval_s = in[INPUT_MEMORY_RESTORE].value,
                                    .disk_interval_s = in[INPUT_DISK_INTERVAL].value,
                                    .state_bytes = in[INPUT_STATE_BYTES].value,
                                    .disk_read_bytes_per_s = in[INPUT_DISK_READ_SPEED].value};
}

int keel__command_model_wasted(int argc, char **argv) {
  wasted_options options = {0};
  int code = parse_options(argc, argv, &options);
  if (code != 0) return code;
  if (options.help) {
    fputs(wasted_usage, stdout);
    return 0;
  }
  keel_status status = keel_model_measure_file(options.measured_path, &options.measured);
  if (status != KEEL_OK) {
    fprintf(stderr, "keel model wasted: cannot read %s: %s\n", options.measured_path,
            keel_strerror(status));
    return KEEL__EXIT_FAILURE;
  }
  measured_apply(&options);
  if (!inputs_complete(&options)) return KEEL__EXIT_FAILURE;
  keel_model_wasted wasted;
  /* Flags were checked, and a measured value needs evidence that makes it finite and in
   * range (the reader refuses negative times; an iteration sample has t_ns moving forward):
   * a refusal here is a bug, reported rather than printed as a figure. */
  keel_model_wasted_params params = params_from(&options);
  if (keel_model_wasted_per_failure(&params, &wasted) != KEEL_OK) {
    fprintf(stderr, "keel model wasted: the inputs are out of the model's range\n");
    return KEEL__EXIT_FAILURE;
  }
  if (options.json)
    print_json(&options, &wasted);
  else
    print_text(&options, &wasted);
  return fflush(stdout) == 0 ? 0 : KEEL__EXIT_FAILURE;
}
