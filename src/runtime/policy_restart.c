/* The restart policy (user-level JIT checkpoints, JIT paper §3): no recovery in the process.
 * The failure hooks save the state (src/ckpt/jit.c), the step returns KEEL_ERESTART, the
 * process exits with KEEL_EXIT_RESTART and the launcher starts the job again. */
#include "runtime/runtime_internal.h"

static void restart_vote(keel_rebuild_vote *vote) {
  *vote = (keel_rebuild_vote){.flags = 1, .rebuild = true, .shrink_only = true};
}

const keel__policy_ops keel__policy_restart = {
    .name = "restart",
    .in_process = false,
    .vote = restart_vote,
};
