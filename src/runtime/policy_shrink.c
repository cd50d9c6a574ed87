/* The shrink policy (ULFM elastic paper §3.2): the survivors go on alone, ranks in their old
 * order; a member that lagged behind receives the newest state from one that holds it. */
#include "runtime/runtime_internal.h"

static void shrink_vote(keel_rebuild_vote *vote) {
  *vote = (keel_rebuild_vote){.flags = 1, .rebuild = true, .shrink_only = true};
}

const keel__policy_ops keel__policy_shrink = {
    .name = "shrink",
    .in_process = true,
    .vote = shrink_vote,
};
