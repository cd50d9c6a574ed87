/* The `keel` command: dispatches to its subcommands (run, inject, ps, join, report). Usage
 * errors are one line on stderr and exit code 2; `keel run` writes nothing but help to
 * stdout, which belongs to the programs the launcher starts. */
#include <stdio.h>
#include <string.h>

#include "model_command.h"
#include "tool.h"

static const char usage_text[] =
    "usage: keel <command> [flags]\n"
    "\n"
    "commands:\n"
    "  run     start a fault-tolerant job: keel run -n 4 -- ./train ARGS...\n"
    "  agent   one node's agent: keel agent --node-rank I [keel run's flags] -- PROG ...\n"
    "  inject  make a failure in a running job: keel inject kill|stop|cont RANK|server:I\n"
    "          [--job ID]\n"
    "  ps      list the live processes of a job: keel ps [--job ID]\n"
    "  status  a job's nodes (agent, role, decision, processes) and parameter servers\n"
    "  join    grow a running job by K processes: keel join [--job ID] [-n K]\n"
    "  report  summarise a job's events file: keel report [--json] [--svg F] EVENTS\n"
    "  model   checkpointing costs (JIT paper, section 5): keel model --gpus 1024 ...\n"
    "  server  one erasure-coded parameter server (ECRec): keel server --help\n"
    "  chaos   run a job through failures drawn from a seed and check it survived them:\n"
    "          keel chaos --failures 50 -- -n 4 --spares 2 -- ./train ARGS...\n"
    "\n"
    "keel run --help lists the launcher's flags.\n";

typedef struct command_entry {
  const char *name;
  int (*run)(int argc, char **argv);
} command_entry;

static const command_entry commands[] = {
    {"run", keel__command_run},       {"agent", keel__command_run},
    {"inject", keel__command_inject}, {"ps", keel__command_ps},
    {"status", keel__command_status}, {"join", keel__command_join},
    {"report", keel__command_report}, {"model", keel__command_model},
    {"server", keel__command_server}, {"chaos", keel__command_chaos},
};

int main(int argc, char **argv) {
  keel_log_set_identity("keel");
  if (argc < 2) {
    fprintf(stderr, "keel: no command given (try keel --help)\n");
    return KEEL__EXIT_USAGE;
  }
  const char *name = argv[1];
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
    fputs(usage_text, stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(name, commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
  }
  fprintf(stderr, "keel: unknown command '%s' (try keel --help)\n", name);
  return KEEL__EXIT_USAGE;
}
