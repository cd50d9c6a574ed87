/* Private interface of `keel model` (tools/keel/model.c): the analytical model of wasted GPU
 * time of the JIT checkpointing paper, §5, as a subcommand. Kept apart from tool.h so the
 * command can be added to main.c's table with one include and one line. */
#ifndef KEEL_MODEL_COMMAND_H
#define KEEL_MODEL_COMMAND_H

#include <stdarg.h>

#include <stdbool.h>
#include <stddef.h>

/* `keel model [flags]`; argv[0] is "model". Prints the periodic optimum (c* per hour and as
 * an interval), w and w_f of each policy, a Table 8-like sweep of N with --sweep, one JSON
 * object with --json. Returns 0, 1 when --measured FILE cannot be read, 2 for bad flags. */
int keel__command_model(int argc, char **argv);

/* `keel model placement [flags]`; argv[0] is "placement". Gemini's placement groups and the
 * odds of recovering from memory (tools/keel/model_placement.c). 0, or 2 for bad flags. */
int keel__command_model_placement(int argc, char **argv);

/* `keel model wasted --measured FILE [flags]`; argv[0] is "wasted". Wasted time per failure
 * (lost work + retrieval) of in-memory snapshots against a periodic disk checkpoint, from a
 * run's events (tools/keel/model_wasted.c). 0; 1 when FILE cannot be read or lacks an input
 * that no flag gave; 2 for bad flags. */
int keel__command_model_wasted(int argc, char **argv);

/* ---- shared by the model commands (defined in model.c) */

/* "--name value" or "--name=value" at argv[*index]; moves *index past a separate value.
 * Returns the value, NULL when argv[*index] is another flag; *missing_p when it is this
 * flag without a value. */
const char *keel__model_flag_value(int argc, char **argv, int *index, const char *name,
                                   bool *missing_p);

/* JSON on stdout, one member at a time: `"key":` after a comma unless *first (then
 * cleared). Numbers with 10 significant digits, null when not finite (JSON has no infinity);
 * strings escaped. */
void keel__model_json_key(const char *key, bool *first);
void keel__model_json_number(const char *key, double value, bool *first);
void keel__model_json_count(const char *key, size_t value, bool *first);
void keel__model_json_string(const char *key, const char *text, bool *first);

/* Prints "COMMAND: <message> (try COMMAND --help)" on stderr; returns the usage exit code. */
int keel__model_usage_error_v(const char *command, const char *format, va_list arguments);

#endif
