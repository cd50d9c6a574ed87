/* Private interface of `keel model` (tools/keel/model.c): the analytical model of wasted GPU
 * time of the JIT checkpointing paper, §5, as a subcommand. Kept apart from tool.h so the
 * command can be added to main.c's table with one include and one line. */
#ifndef KEEL_MODEL_COMMAND_H
#define KEEL_MODEL_COMMAND_H

/* `keel model [flags]`; argv[0] is "model". Prints the periodic optimum (c* per hour and as
 * an interval), w and w_f of each policy, a Table 8-like sweep of N with --sweep, one JSON
 * object with --json. Returns 0, 1 when --measured FILE cannot be read, 2 for bad flags. */
int keel__command_model(int argc, char **argv);

/* `keel model placement [flags]`; argv[0] is "placement". Gemini's placement groups and the
 * odds of recovering from memory (tools/keel/model_placement.c). 0, or 2 for bad flags. */
int keel__command_model_placement(int argc, char **argv);

#endif
