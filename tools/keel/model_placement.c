/* `keel model placement`: Gemini's checkpoint placement for N nodes and k replicas
 * (Algorithm 1), and the odds of recovering from CPU memory when f nodes fail at once:
 * exact, Corollary 1 where it applies, and a Monte Carlo estimate beside them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/model.h"
#include "model_command.h"
#include "tool.h"

#define GROUPS_LISTED 16
#define DEFAULT_TRIALS 100000
#define MAXIMUM_TRIALS 100000000

static const char placement_usage[] =
    "usage: keel model placement --nodes N --replicas K --failed F [--trials T] [--json]\n"
    "\n"
    "Gemini's checkpoint placement (Algorithm 1): with K dividing N, groups of K nodes that\n"
    "each hold every snapshot of the group; otherwise such groups and a ring of the last\n"
    "K + N mod K nodes, each node's snapshot also on the K-1 nodes before it. Prints the\n"
    "groups and the probability that F nodes failing at once leave every snapshot in some\n"
    "node's memory: exact (counted), Corollary 1's formula where the paper states it\n"
    "(groups, F < 2K), and a Monte Carlo estimate of T draws (default 100000; 0: none).\n";

typedef struct placement_options {
  int64_t nodes, replicas, failed, trials;
  bool json;
} placement_options;

static int usage_error(const char *flag, const char *text, const char *expects) {
  if (text == NULL) text = "(missing)";
  fprintf(stderr, "keel model placement: %s%s%s: expected %s\n", flag, text[0] ? " " : "",
          text, expects);
  return KEEL__EXIT_USAGE;
}

static int parse_placement(int argc, char **argv, placement_options *options) {
  *options = (placement_options){.nodes = -1, .replicas = -1, .failed = -1,
                                 .trials = DEFAULT_TRIALS};
  for (int i = 1; i < argc; i++) {
    const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t *target = NULL, maximum = KEEL_MODEL_PLACEMENT_MAX_NODES;
    if (strcmp(flag, "--json") == 0) {
      options->json = true;
      continue;
    }
    if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) {
      fputs(placement_usage, stdout);
      return -1;
    }
    if (strcmp(flag, "--nodes") == 0) target = &options->nodes;
    if (strcmp(flag, "--replicas") == 0) target = &options->replicas;
    if (strcmp(flag, "--failed") == 0) target = &options->failed;
    if (strcmp(flag, "--trials") == 0) {
      target = &options->trials;
      maximum = MAXIMUM_TRIALS;
    }
    if (target == NULL) return usage_error("unknown flag", flag, "a flag of --help");
    if (value == NULL || keel_parse_int(value, 0, maximum, target) != KEEL_OK)
      return usage_error(flag, value, "a whole number in range");
    i++;
  }
  if (options->nodes < 0 || options->replicas < 0 || options->failed < 0)
    return usage_error("--nodes, --replicas and --failed", "", "all three");
  if (options->failed > options->nodes)
    return usage_error("--failed", "", "at most --nodes");
  return 0;
}

static void print_groups(const keel_model_placement *placement) {
  printf("placement: %u nodes, %u replicas: %s\n", placement->nodes, placement->replicas,
         placement->strategy == KEEL_PLACEMENT_GROUP ? "group" : "mixed (groups and a ring)");
  for (uint32_t g = 0; g < placement->groups; g++) {
    bool last = g + 1 == placement->groups;
    if (g == GROUPS_LISTED && !last) {
      printf("  ... (%u more groups of %u)\n", placement->groups - 1 - g, placement->replicas);
      g = placement->groups - 2;
      continue;
    }
    uint32_t first, count;
    keel_model_placement_group(placement, g, &first, &count);
    bool ring = last && placement->strategy == KEEL_PLACEMENT_MIXED;
    printf("  %s %u: nodes %u-%u%s\n", ring ? "ring " : "group", g, first, first + count - 1,
           ring ? " (each snapshot also on the nodes before it)" : "");
  }
}

int keel__command_model_placement(int argc, char **argv) {
  placement_options options;
  int code = parse_placement(argc, argv, &options);
  if (code != 0) return code < 0 ? 0 : code;
  keel_model_placement placement;
  if (keel_model_placement_make((uint32_t)options.nodes, (uint32_t)options.replicas,
                                &placement) != KEEL_OK)
    return usage_error("--replicas", "", "1..8 and at most --nodes");
  uint32_t failed = (uint32_t)options.failed;
  double exact = 0.0, corollary = NAN, sampled = NAN;
  keel_status status = keel_model_placement_odds(&placement, failed, &exact);
  if (status == KEEL_OK && options.trials > 0)
    status = keel_model_placement_simulate(&placement, failed, (uint64_t)options.trials, 1,
                                           &sampled);
  if (status != KEEL_OK) {
    fprintf(stderr, "keel model placement: %s\n", keel_strerror(status));
    return KEEL__EXIT_FAILURE;
  }
  bool stated = keel_model_placement_corollary1(&placement, failed, &corollary) == KEEL_OK;
  double error = options.trials > 0 ? sqrt(sampled * (1.0 - sampled) / (double)options.trials)
                                    : NAN;
  if (options.json) {
    printf("{\"nodes\":%u,\"replicas\":%u,\"strategy\":\"%s\",\"groups\":%u,\"failed\":%u,"
           "\"recover_exact\":%.12g",
           placement.nodes, placement.replicas,
           placement.strategy == KEEL_PLACEMENT_GROUP ? "group" : "mixed", placement.groups,
           failed, exact);
    if (stated) printf(",\"recover_corollary1\":%.12g", corollary);
    if (options.trials > 0)
      printf(",\"recover_monte_carlo\":%.12g,\"monte_carlo_trials\":%lld,"
             "\"monte_carlo_standard_error\":%.3g",
             sampled, (long long)options.trials, error);
    printf("}\n");
  } else {
    print_groups(&placement);
    printf("%u nodes failing at once: every snapshot still in memory with probability\n",
           failed);
    printf("  exact         %.4f%%\n", 100.0 * exact);
    if (stated) printf("  Corollary 1   %.4f%%\n", 100.0 * corollary);
    if (options.trials > 0)
      printf("  Monte Carlo   %.4f%% +- %.4f%% (%lld draws, one standard error)\n",
             100.0 * sampled, 100.0 * error, (long long)options.trials);
  }
  return fflush(stdout) == 0 ? 0 : KEEL__EXIT_FAILURE;
}
