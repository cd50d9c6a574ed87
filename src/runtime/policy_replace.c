/* The replace policy (ULFM elastic paper §3.3, "same"): an idle spare takes each failed
 * member's rank and receives its shard's state from a survivor that holds it, so the world
 * keeps its size and the run its bits. The agreement waits a while (KEEL_REPLACE_WAIT) for
 * spares the launcher is still starting, then shrinks instead. */
#include "runtime/runtime_internal.h"

static void replace_vote(keel_rebuild_vote *vote) {
  *vote = (keel_rebuild_vote){.flags = 1, .rebuild = true, .admit_spares = true};
}

const keel__policy_ops keel__policy_replace = {
    .name = "replace",
    .in_process = true,
    .vote = replace_vote,
};
